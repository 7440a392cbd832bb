"""The checkpoint's dtypes and limits: its float dtype, weight quantisation (and the KV dtype a quantisation
config asks for), and its maximum context."""

from __future__ import annotations

import math
from typing import Any

from kvplan.errors import KvplanError
from kvplan.model import LINEAR_GROUPS, Quantization
from kvplan.sources.hf_config.fields import Fields


def common(cfg: Fields, notes: list[str]) -> dict:
    """dtype, quantisation, limits, and the notes gathered while reading them (so call it last)."""
    quantization, kv_dtype = _quantization(cfg, notes)
    dtype = _float_dtype(cfg, notes, quantized=quantization is not None)
    max_context = _max_context(cfg, notes)
    return {"dtype": dtype, "quantization": quantization, "kv_dtype": kv_dtype, "max_context": max_context,
            "notes": tuple(notes)}


FLOAT_NAMES = {"float32": "fp32", "float": "fp32", "fp32": "fp32", "bfloat16": "bf16", "bf16": "bf16",
                "float16": "fp16", "fp16": "fp16", "half": "fp16"}


def dtype_name(cfg: Fields, value: Any, field: str) -> str:
    name = FLOAT_NAMES.get(str(value).removeprefix("torch.").lower())
    if name is None:
        raise KvplanError(f"{cfg.where}: field {field} is {value!r}, not a float dtype (float32, bfloat16, float16)")
    return name


def optional_dtype(cfg: Fields, *names: str) -> str | None:
    value = cfg.get(*names, default=None)
    return dtype_name(cfg, value, names[0]) if value is not None else None


def _float_dtype(cfg: Fields, notes: list[str], quantized: bool) -> str:
    """The checkpoint's float dtype. Without torch_dtype, vLLM and transformers' legacy loading take float32;
    quantised checkpoints (gpt-oss) keep their unquantised tensors in bf16, so those are read as bf16."""
    value = cfg.get("torch_dtype", "dtype", default=None)
    if value is not None:
        return dtype_name(cfg, value, "torch_dtype")
    if quantized:
        notes.append("config names no torch_dtype: the unquantised tensors of this quantised checkpoint taken as bf16")
        return "bf16"
    notes.append("config names no torch_dtype: weights and KV taken as float32 (use --kv-dtype to serve in bf16)")
    return "fp32"


# The context limit: max_seq_len is MPT's and DBRX's name for it.
CONTEXT_FIELDS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx", "max_seq_len")


def _max_context(cfg: Fields, notes: list[str]) -> int | None:
    value = cfg.get(*CONTEXT_FIELDS, default=None)
    if value is None:
        return None
    if isinstance(value, float) and not math.isfinite(value):
        notes.append("max_position_embeddings is not finite: no context limit")
        return None
    return cfg.int(*CONTEXT_FIELDS)


def _quantization(cfg: Fields, notes: list[str]) -> tuple[Quantization | None, str | None]:
    """Weight dtype from quantization_config (fp8, mxfp4, AWQ/GPTQ, bitsandbytes, compressed-tensors, ModelOpt)."""
    if not cfg.has("quantization_config"):
        return None, None
    qc = cfg.mapping("quantization_config")
    method = str(qc.get("quant_method", default="")).lower()
    bits = qc.int("bits", default=None)
    kv_dtype = None
    unquantized = qc.list("modules_to_not_convert", str)
    if method == "modelopt":
        qc = qc.mapping("quantization") if qc.has("quantization") else qc  # hf_quant_config.json's form, nested
        dtype, kv_dtype = _modelopt(qc)
        unquantized = qc.list("exclude_modules" if qc.has("exclude_modules") else "ignore", str)
    elif method == "fp8":
        dtype = "fp8"
    elif method == "mxfp4":
        dtype = "mxfp4"
    elif method in ("awq", "gptq", "autoround", "auto-round") and bits in (4, 8):
        dtype = "int4" if bits == 4 else "int8"
    elif method == "bitsandbytes":
        dtype = "nf4" if qc.flag("load_in_4bit") else "int8"
    elif method == "compressed-tensors":
        dtype, kv_dtype = _compressed_tensors(qc)
    else:
        dtype = None
    groups = LINEAR_GROUPS
    if any("attn" in module for module in unquantized):
        groups = tuple(g for g in groups if not g.startswith("attention"))
    if dtype is None:
        notes.append(f"quantization_config {method or '?'} not understood: weights counted in the float dtype")
        return None, None
    return Quantization(method=method, weights_dtype=dtype, groups=groups), kv_dtype


def _compressed_tensors(qc: Fields) -> tuple[str | None, str | None]:
    """compressed-tensors: weights from config_groups.*.weights (num_bits, type); KV from kv_cache_scheme."""
    weights = None
    groups = qc.mapping("config_groups")
    for name in groups.data:
        spec = groups.mapping(name).mapping("weights")
        bits = spec.int("num_bits", default=None)
        weights = {4: "int4", 8: "fp8" if spec.get("type", default="") == "float" else "int8"}.get(bits, weights)
    kv = qc.mapping("kv_cache_scheme")
    is_fp8 = kv.int("num_bits", default=None) == 8 and kv.get("type", default="") == "float"
    return weights, ("fp8" if is_fp8 else None)


# ModelOpt's quant_algo names (TensorRT Model Optimizer's unified checkpoint export; vLLM's QUANT_ALGOS in
# model_executor/layers/quantization/modelopt.py) by the weights dtype each stores.
MODELOPT_WEIGHTS = {"FP8": "fp8", "FP8_PER_CHANNEL_PER_TOKEN": "fp8", "FP8_PB_WO": "fp8", "NVFP4": "nvfp4",
                    "W4A16_NVFP4": "nvfp4", "NVFP4_AWQ": "nvfp4"}


def _modelopt(qc: Fields) -> tuple[str | None, str | None]:
    """A ModelOpt checkpoint (quant_method modelopt): weights from quant_algo; an FP8 KV cache from
    kv_cache_quant_algo (hf_quant_config.json's form) or kv_cache_scheme (config.json's: FP8, or 8-bit float),
    as vLLM reads both forms (`ModelOptQuantConfigBase.from_config`, modelopt.py, vLLM 0.19)."""
    weights = MODELOPT_WEIGHTS.get(str(qc.get("quant_algo", default="")).upper())
    scheme = qc.get("kv_cache_scheme", "kv_cache_quant_algo", default="")
    if isinstance(scheme, dict):
        fp8 = scheme.get("num_bits") == 8 and scheme.get("type") == "float"
    else:
        fp8 = str(scheme).upper() == "FP8"
    return weights, "fp8" if fp8 else None
