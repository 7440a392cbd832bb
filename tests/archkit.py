"""Checking kvplan against transformers' own architectures: each decoder family built from its own config class,
its cache measured by `kvplan profile` and its parameters counted on the meta device.

transformers' config defaults are the published checkpoints' shapes. A model is built with vocabulary, MLP and
expert widths shrunk and windows of 16 tokens, so that ctx 40 crosses them; the cache does not depend on the
shrunk widths. It is cut to the fewest first layers that hold every kind of layer it has (`--layers`, which also
exercises the cut of per-layer fields).
"""

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvplan.profiler import config as profile_config
from kvplan.sources.hf_config import model_from_config

SHRUNK_WIDTHS = {"intermediate_size": 64, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32,
                 "vocab_size": 512, "vocab_size_per_layer_input": 512}
WINDOW_FIELDS = ("sliding_window", "attention_chunk_size")
WINDOW = 16
CTX, BATCH, DECODE_STEPS = 40, 2, 2
MIN_LAYERS = 4  # DeepSeek's first dense layers, then an MoE one
# Tensors a checkpoint stores and transformers registers as buffers, not parameters: DeepSeek-V3's router keeps its
# load-balancing bias (`mlp.gate.e_score_correction_bias`, one per routed expert) as a buffer, LFM2-MoE its
# `feed_forward.expert_bias` (vLLM loads it as the router's e_score_correction_bias), DeepSeek V4's hash router its
# token-to-expert table (`mlp.gate.tid2eid`, vocab x top-k ids; the checkpoint's `ffn.gate.tid2eid`).
CHECKPOINT_BUFFERS = ("e_score_correction_bias", "expert_bias", "tid2eid")


def default_config(model_type: str, **edits) -> dict:
    """transformers' default config of model_type; one its own validation refuses is built with the decoder
    `edits` (Gemma 4 assistants need hidden_size_per_layer_input 0)."""
    from transformers import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        pytest.skip(f"this transformers has no {model_type}")
    config_class = CONFIG_MAPPING[model_type]
    try:
        return config_class().to_dict()
    except Exception:
        if not edits:
            raise
    nested = "text_config" in config_class.sub_configs_defaults
    return (config_class(text_config=edits) if nested else config_class(**edits)).to_dict()


def decoder_of(data: dict) -> dict:
    return data["text_config"] if isinstance(data.get("text_config"), dict) else data


def shrunk(model_type: str, **edits) -> dict:
    """transformers' default config of model_type, widths shrunk and windows cut; `edits` set decoder fields."""
    data = default_config(model_type, **edits)
    decoder = decoder_of(data)
    for field, width in SHRUNK_WIDTHS.items():
        if isinstance(decoder.get(field), int) and decoder[field] > width:
            decoder[field] = width
        elif isinstance(decoder.get(field), list):  # one width per layer (Gemma 3n's intermediate_size)
            decoder[field] = [min(value, width) for value in decoder[field]]
    groups = next((decoder[f] for f in ("n_group", "num_expert_group") if isinstance(decoder.get(f), int)), 1)
    for field in ("num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts"):
        experts = max(4, 2 * groups)  # group-limited routing takes the top 2 experts of each group
        if isinstance(decoder.get(field), int) and decoder[field] > experts:
            decoder[field] = experts
            for top_k in ("num_experts_per_tok", "moe_k", "num_experts_per_token"):
                if isinstance(decoder.get(top_k), int):
                    decoder[top_k] = min(decoder[top_k], 2)
    for field in WINDOW_FIELDS:
        if isinstance(decoder.get(field), int) and decoder[field] > WINDOW:
            decoder[field] = WINDOW
    for field in ("pad_token_id", "bos_token_id", "eos_token_id"):
        if isinstance(decoder.get(field), int) and decoder[field] >= SHRUNK_WIDTHS["vocab_size"]:
            decoder[field] = 0
    decoder.update(edits)
    return data


@dataclass
class Check:
    """kvplan's prediction beside transformers' figures, for one shrunk model."""

    model_type: str
    layers: int
    predicted_kv: int
    measured_kv: int
    predicted_kv_after_prefill: int
    measured_kv_after_prefill: int
    predicted_params: int
    measured_params: int

    @property
    def exact(self) -> bool:
        return (self.predicted_kv == self.measured_kv and self.predicted_params == self.measured_params
                and self.predicted_kv_after_prefill == self.measured_kv_after_prefill)


def meta_build(model_type: str, fields: dict):
    """transformers' causal-LM class for these fields, built on the meta device (shapes only)."""
    import torch
    import transformers
    from transformers import CONFIG_MAPPING

    from kvplan.profiler.runtime import causal_lm_class

    config = CONFIG_MAPPING[model_type](**fields)
    with torch.device("meta"):
        return causal_lm_class(transformers, config)._from_config(config)


def phantom_parameters(model) -> int:
    """Parameter elements transformers allocates that no checkpoint holds, read from the built model's own
    tensors. LongCat-Flash: `LongcatFlashExperts` gives its fused gate_up_proj a row block for every expert the
    router scores, n_routed_experts + zero_expert_num, but the zero-compute experts are identities that never read
    theirs, and checkpoints hold weights for the n_routed_experts alone (vLLM's `longcat_flash.py` loads that many;
    the model card's 560B total counts no more, tests/test_family_mla_dsa.py), as kvplan counts them."""
    return sum(module.gate_up_proj[module.num_routed_experts:].numel() for module in model.modules()
               if type(module).__name__ == "LongcatFlashExperts" and module.gate_up_proj is not None)


def meta_parameters(model_type: str, fields: dict) -> int:
    """Parameters of transformers' causal-LM class for these fields, built on the meta device, tied ones once,
    plus the buffers checkpoints store as weights, less the rows no checkpoint holds (`phantom_parameters`)."""
    model = meta_build(model_type, fields)
    buffers = sum(b.numel() for name, b in model.named_buffers() if name.endswith(CHECKPOINT_BUFFERS))
    return sum(p.numel() for p in model.parameters()) + buffers - phantom_parameters(model)


def check(tmp_path: Path, model_type: str, data: dict | None = None, layers: int | None = 0,
          ctx: int = CTX) -> Check:
    """Profile the shrunk model (or `data`) on the CPU, in fp32, at ctx tokens, and count its parameters on the
    meta device. layers=0: the representative cut; None: every layer."""
    from kvplan.profiler import run as profile_run

    data = data if data is not None else shrunk(model_type)
    path = tmp_path / f"{model_type}.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    spec = model_from_config(json.loads(path.read_text(encoding="utf-8")), model_type, "test")  # as profiled
    if layers == 0:
        layers = profile_config.representative_layers(spec, MIN_LAYERS)
    result = profile_run.run_profile(str(path), ctx, BATCH, device="cpu", dtype="fp32", layers=layers,
                                     decode_steps=DECODE_STEPS)
    source = profile_config.resolve(str(path))
    cut, cut_spec = profile_config.first_layers(source, layers)
    cut_type, fields, _ = profile_config.transformers_fields(cut)
    return Check(model_type=model_type, layers=result.layers, predicted_kv=result.predicted_kv_bytes,
                 measured_kv=result.measured_kv_bytes,
                 predicted_kv_after_prefill=result.predicted_kv_after_prefill_bytes,
                 measured_kv_after_prefill=result.measured_kv_after_prefill_bytes,
                 predicted_params=cut_spec.params.total, measured_params=meta_parameters(cut_type, fields))
