"""Hugging Face `config.json` -> ModelSpec.

All per-architecture knowledge lives here: which field names a family uses, which layers slide or chunk, what a
layer's recurrent state holds, how many parameters each block has. Rules follow transformers' configuration and
modeling files and vLLM's config readers (facts collected in docs/formulas.md and shared/reference/engines.md).
The config is data: nothing it names (`auto_map`, remote code) is imported or run.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvplan.errors import KvplanError
from kvplan.model import (
    LINEAR_GROUPS,
    ChunkedAttention,
    CrossAttention,
    FullAttention,
    MLALatent,
    ModelSpec,
    NoCache,
    ParamCounts,
    Quantization,
    RecurrentState,
    SlidingWindow,
    Widths,
)

MAX_LAYERS = 100_000  # far above any real model; refuses absurd configs before building per-layer lists
MAX_FIELD = 2**53  # no real size field comes near; above it float arithmetic would be inexact or overflow
_MISSING = object()

# Field defaults of transformers' config classes for fields that real config.json files often omit.
MODEL_TYPE_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {"tie_word_embeddings": False, "vocab_size": 32000},
    "mistral": {"tie_word_embeddings": False, "sliding_window": 4096},
    "mixtral": {"tie_word_embeddings": False, "sliding_window": None},
    "qwen2": {"tie_word_embeddings": False, "use_sliding_window": False},
    "qwen2_moe": {"tie_word_embeddings": False, "use_sliding_window": False},
    "qwen3": {"tie_word_embeddings": False, "use_sliding_window": False},
    "qwen3_moe": {"tie_word_embeddings": False, "use_sliding_window": False},
    "qwen3_next": {"tie_word_embeddings": False, "full_attention_interval": 4},
    "gemma": {"tie_word_embeddings": True},
    "gemma2": {"tie_word_embeddings": True, "sliding_window": 4096, "hidden_activation": "gelu_pytorch_tanh"},
    "gemma3_text": {
        "tie_word_embeddings": True, "vocab_size": 262_208, "sliding_window": 4096, "sliding_window_pattern": 6,
        "head_dim": 256, "max_position_embeddings": 131_072, "num_attention_heads": 8, "num_key_value_heads": 4,
        "hidden_activation": "gelu_pytorch_tanh",
    },
    "llama4_text": {"tie_word_embeddings": False, "no_rope_layer_interval": 4, "interleave_moe_layer_step": 1},
    "phi3": {"tie_word_embeddings": False},
    "phi": {"tie_word_embeddings": False},
    "gpt2": {"tie_word_embeddings": True, "n_inner": None},
    "falcon": {"tie_word_embeddings": True},
    "gpt_neox": {"tie_word_embeddings": False},
    "cohere": {"tie_word_embeddings": True},
    "cohere2": {"tie_word_embeddings": True, "sliding_window_pattern": 4},
    "olmo2": {"tie_word_embeddings": False},
    "granite": {"tie_word_embeddings": True},
    "deepseek_v2": {"tie_word_embeddings": False},
    "deepseek_v3": {"tie_word_embeddings": False},
    "gpt_oss": {"tie_word_embeddings": False},
    "jamba": {"tie_word_embeddings": False, "attn_layer_period": 8, "attn_layer_offset": 4},
    "nemotron_h": {"tie_word_embeddings": False},
    "nemotron-nas": {"tie_word_embeddings": False},
    "t5": {"tie_word_embeddings": True},
}
MODEL_TYPE_ALIASES = {"RefinedWebModel": "falcon", "gemma3": "gemma3_text",
                      "llama4": "llama4_text", "deci": "nemotron-nas", "mt5": "t5"}
# Config fields saying that layers keep something none of kvplan's layer kinds holds (transformers' config classes
# of DeepSeek-V3.2, GLM-5, Gemma 3n and Gemma 4, among others). Reading such a model as plain attention would give a KV
# figure that is wrong with no sign of it, so it is refused, naming the field.
UNMODELLED_CACHE_FIELDS = {
    "index_head_dim": "a sparse-attention indexer's key cache",
    "indexer_compress_ratio": "a compressed indexer cache",
    "compress_rates": "compressed attention caches",
    "num_kv_shared_layers": "layers that reuse an earlier layer's KV cache",
    "swa_num_key_value_heads": "sliding-window layers with their own KV heads",
    "swa_head_dim": "sliding-window layers with their own head size",
    "per_layer_config": "per-layer overrides of the attention shape",
    "attention_k_eq_v": "keys that double as values",
}
# Fields of recurrent mixers (Mamba, RG-LRU, short convolutions, linear attention): refused when the layout kvplan
# reads from the config has no recurrent layer, since that state would be missing from the figures.
RECURRENT_FIELDS = ("mamba_d_state", "mamba_n_heads", "n_mamba_heads", "state_size", "ssm_state_size", "lru_width",
                    "conv_L_cache", "short_conv_kernel_size", "number_of_conv_states", "linear_num_heads",
                    "linear_num_key_heads", "layers_block_type", "block_types")
# MoE routers that keep a load-balancing bias per routed expert (`e_score_correction_bias`, which checkpoints store
# and transformers registers as a buffer): the families whose modeling files define it, as of transformers 5.23.
CORRECTION_BIAS_ROUTERS = {"deepseek_v3", "dots1", "ernie4_5_moe", "exaone_moe", "glm4_moe", "glm4_moe_lite", "hy_v3",
                           "laguna", "longcat_flash", "mimo_v2_flash", "minimax_m2", "solar_open"}
ENCODER_ONLY = {"bert", "roberta", "xlm-roberta", "distilbert", "deberta", "deberta-v2", "electra", "albert",
                "modernbert", "camembert", "mpnet", "nomic_bert", "xlm-roberta-xl"}


@dataclass(frozen=True)
class Family:
    """How a decoder family builds its blocks, for parameter counting (from each family's modeling file)."""

    gated_mlp: bool = True          # gate/up/down (SwiGLU, GeGLU) vs up/down
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    norms_per_layer: int = 2        # hidden-sized norm vectors per layer
    layer_norm: bool = False        # LayerNorm (weight + bias) rather than RMSNorm (weight)
    qk_norm: str | None = None      # "head": one head_dim vector each for q and k; "full": over all heads
    learned_positions: bool = False  # GPT-2 style position embedding table


FAMILIES: dict[str, Family] = {
    "qwen2": Family(qkv_bias=True),
    "qwen2_moe": Family(qkv_bias=True),
    "qwen3": Family(qk_norm="head"),
    "qwen3_moe": Family(qk_norm="head"),
    "qwen3_next": Family(qk_norm="head"),
    "gemma2": Family(norms_per_layer=4),
    "gemma3_text": Family(norms_per_layer=4, qk_norm="head"),
    "phi": Family(gated_mlp=False, qkv_bias=True, o_bias=True, mlp_bias=True, norms_per_layer=1, layer_norm=True),
    "gpt2": Family(gated_mlp=False, qkv_bias=True, o_bias=True, mlp_bias=True, layer_norm=True,
                   learned_positions=True),
    "gpt_bigcode": Family(gated_mlp=False, qkv_bias=True, o_bias=True, mlp_bias=True, layer_norm=True,
                          learned_positions=True),
    "gpt_neox": Family(gated_mlp=False, qkv_bias=True, o_bias=True, mlp_bias=True, layer_norm=True),
    "falcon": Family(gated_mlp=False, layer_norm=True),
    "cohere": Family(norms_per_layer=1),
    "cohere2": Family(norms_per_layer=1),
    "olmo2": Family(qk_norm="full"),
    "gpt_oss": Family(qkv_bias=True, o_bias=True),
    "nemotron_h": Family(gated_mlp=False, norms_per_layer=1),
    # Checked against transformers' classes only (tests/test_transformers_params.py): no bundled model.
    "glm4_moe_lite": Family(),
    "mimo_v2_flash": Family(),
    "minicpm3": Family(),
    "minimax_m2": Family(qk_norm="full"),
    "solar_open": Family(),
}
LLAMA_LIKE = Family()


class Fields:
    """Typed access to a config dict; every error names the file and the field."""

    def __init__(self, data: dict, where: str):
        self.data = data
        self.where = where

    def has(self, name: str) -> bool:
        return self.data.get(name) is not None

    def get(self, *names: str, default: Any = _MISSING) -> Any:
        for name in names:
            if self.data.get(name) is not None:
                return self.data[name]
        if default is _MISSING:
            also = f" (also looked for {', '.join(names[1:])})" if len(names) > 1 else ""
            raise KvplanError(f"{self.where}: missing field {names[0]}{also}")
        return default

    def int(self, *names: str, default: Any = _MISSING, minimum: int = 1) -> Any:
        value = self.get(*names, default=default)
        if value is default and default is not _MISSING:
            return value
        name = next((n for n in names if self.data.get(n) is not None), names[0])
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise KvplanError(f"{self.where}: field {name} must be a whole number, got {value!r}")
        if value < minimum:
            raise KvplanError(f"{self.where}: field {name} must be at least {minimum}, got {value}")
        if value > MAX_FIELD:
            raise KvplanError(f"{self.where}: field {name} has {len(str(value))} digits, too large for a real model")
        return value

    def flag(self, name: str, default: bool = False) -> bool:
        value = self.data.get(name, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise KvplanError(f"{self.where}: field {name} must be true or false, got {value!r}")
        return value

    def layers(self, *names: str, default: Any = _MISSING) -> int:
        """A layer count, refused past MAX_LAYERS before anything is built per layer."""
        count = self.int(*names, default=default)
        if count > MAX_LAYERS:
            raise KvplanError(f"{self.where}: {count:,} layers is not a real model (at most {MAX_LAYERS:,} are read)")
        return count

    def number(self, name: str) -> float:
        value = self.get(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise KvplanError(f"{self.where}: field {name} must be a positive number, got {value!r}")
        return value

    def list(self, name: str, item: type = str, length: int | None = None) -> list:
        """A list field (empty if absent); `item` checks each entry, `length` the count (one per layer)."""
        value = self.data.get(name)
        if value is None:
            return []
        def fits(entry: Any) -> bool:  # bool is an int subclass: only a bool list takes bools
            return isinstance(entry, item) and (item is bool or not isinstance(entry, bool))

        if not isinstance(value, list) or not all(fits(v) for v in value):
            raise KvplanError(f"{self.where}: field {name} must be a list of {item.__name__} values")
        if length is not None and len(value) != length:
            raise KvplanError(f"{self.where}: field {name} must have one entry for each of the {length} layers")
        return value

    def mapping(self, name: str) -> Fields:
        """A nested object field as Fields (empty if absent), so errors name the path to it."""
        value = self.data.get(name)
        if value is not None and not isinstance(value, dict):
            raise KvplanError(f"{self.where}: field {name} must be an object, got {type(value).__name__}")
        return Fields(value or {}, f"{self.where} {name}")


# ---------------------------------------------------------------------------------------------- reading files


def read_config_file(path: Path, name: str | None = None, source: str | None = None) -> ModelSpec:
    """Read a config.json file, or a directory holding one."""
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise KvplanError(f"{path}: directory has no config.json")
        path = path / "config.json"
    config = parse_json(read_text(path), str(path))
    name = name or str(config.get("_name_or_path") or path.stem)
    return model_from_config(config, name, source or f"file {path}", where=str(path))


def read_text(path: Path) -> str:
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise KvplanError(f"{path}: cannot read ({err.strerror or err})") from None
    if not raw.strip():
        raise KvplanError(f"{path}: file is empty")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise KvplanError(f"{path}: not a text file (it holds binary data, not UTF-8 JSON or YAML)") from None


def parse_json(text: str, where: str) -> dict:
    """JSON as Python reads it, which accepts the bare `Infinity` / `NaN` some configs carry."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise KvplanError(f"{where}: malformed JSON at line {err.lineno}, column {err.colno}: {err.msg}") from None
    if not isinstance(data, dict):
        raise KvplanError(f"{where}: expected a JSON object with the model's fields, got {type(data).__name__}")
    return data


# ---------------------------------------------------------------------------------------------- the reader


def model_from_config(config: dict, name: str, source: str, where: str = "config.json") -> ModelSpec:
    """Turn a config.json dict into a ModelSpec, or raise KvplanError naming the field that is missing or wrong."""
    if not isinstance(config, dict):
        raise KvplanError(f"{where}: expected a JSON object with the model's fields")
    top = Fields(config, where)
    text = config.get("text_config")
    notes: list[str] = []
    vision = 0
    if isinstance(text, dict):
        data = dict(text)
        for key in ("torch_dtype", "dtype", "quantization_config", "tie_word_embeddings"):
            if key not in data and key in config:
                data[key] = config[key]
        vision = _vision_params(top, Fields(data, f"{where} (text_config)"), notes)
        where = f"{where} (text_config)"
    else:
        data = dict(config)
    model_type = str(data.get("model_type") or config.get("model_type") or "")
    if model_type == "RefinedWeb":  # Falcon-40B's original format: the new decoder architecture
        data.setdefault("new_decoder_architecture", True)
        model_type = "falcon"
    model_type = MODEL_TYPE_ALIASES.get(model_type, model_type)
    for key, value in MODEL_TYPE_DEFAULTS.get(model_type, {}).items():
        data.setdefault(key, value)
    cfg = Fields(data, where)

    if model_type in ENCODER_ONLY or (
        not model_type and any(a.endswith("ForMaskedLM") for a in top.list("architectures"))
    ):
        return _encoder_only(cfg, model_type or "encoder", name, source, notes)
    if model_type == "t5" or top.flag("is_encoder_decoder"):
        return _encoder_decoder(cfg, model_type, name, source, notes)
    return _decoder(cfg, model_type, name, source, notes, vision)


def _common(cfg: Fields, notes: list[str]) -> dict:
    """dtype, quantisation, limits, and the notes gathered while reading them (so call it last)."""
    quantization, kv_dtype = _quantization(cfg, notes)
    dtype = _float_dtype(cfg, notes, quantized=quantization is not None)
    max_context = _max_context(cfg, notes)
    return {"dtype": dtype, "quantization": quantization, "kv_dtype": kv_dtype, "max_context": max_context,
            "notes": tuple(notes)}


def _decoder(cfg: Fields, model_type: str, name: str, source: str, notes: list[str], vision: int = 0) -> ModelSpec:
    family = FAMILIES.get(model_type, LLAMA_LIKE)
    if model_type and model_type not in MODEL_TYPE_DEFAULTS and model_type not in FAMILIES:
        notes.append(f"model_type {model_type!r} is not one kvplan knows: read as a Llama-style decoder")
    num_layers = cfg.layers("num_hidden_layers", "n_layer", "num_layers", "n_layers")
    hidden = cfg.int("hidden_size", "n_embd", "d_model", "dim")
    heads = cfg.int("num_attention_heads", "n_head", "num_heads", "n_heads")
    kv_heads = _kv_heads(cfg, model_type, heads)
    if heads % kv_heads:
        raise KvplanError(f"{cfg.where}: {heads} attention heads cannot be grouped over {kv_heads} KV heads")
    # MLA's query heads are qk_nope + qk_rope wide, whatever hidden / heads is (GLM-4.7-Flash: 2,048 / 20)
    mla = cfg.has("kv_lora_rank")
    head_dim = cfg.int("qk_nope_head_dim") + cfg.int("qk_rope_head_dim", minimum=0) if mla else \
        _head_dim(cfg, hidden, heads)
    types: list[str] = []
    blocks: list[Fields] = []
    if mla:  # DeepSeek V2/V3, Kimi K2: multi-head latent attention on every layer
        latent, rope = cfg.int("kv_lora_rank"), cfg.int("qk_rope_head_dim", minimum=0)
        caches = [MLALatent(layer=i, latent_dim=latent, rope_dim=rope) for i in range(num_layers)]
    elif cfg.has("block_configs"):  # Nemotron NAS (DeciLM): each block says its own attention and FFN
        blocks = _nas_blocks(cfg, num_layers)
        caches = _nas_caches(blocks, head_dim, heads)
    else:
        types = _layer_types(cfg, model_type, num_layers, notes)
        caches = _layer_caches(cfg, types, kv_heads, head_dim)
        if model_type == "mimo_v2_flash":  # its modeling code gives sliding layers twice the KV heads (and sinks)
            caches = [c.model_copy(update={"kv_heads": 2 * kv_heads}) if isinstance(c, SlidingWindow) else c
                      for c in caches]
    _refuse_unmodelled_caches(cfg, model_type, caches)
    params = _decoder_params(cfg, model_type, family, caches, types, blocks, hidden, heads, head_dim)
    params = params.model_copy(update={"vision": vision})
    widths = None if blocks or model_type == "nemotron_h" else _widths(cfg, model_type, family, hidden, num_layers)
    return ModelSpec(name=name, architecture=model_type or "unknown", num_layers=num_layers,
                     num_attention_heads=heads, caches=tuple(caches), params=params, widths=widths, source=source,
                     **_common(cfg, notes))


def _refuse_unmodelled_caches(cfg: Fields, model_type: str, caches: list) -> None:
    """A one-line refusal for a model whose config says its layers keep more than kvplan's layout of it holds."""
    field = next((f for f in UNMODELLED_CACHE_FIELDS if cfg.data.get(f) not in (None, 0, [], {})), None)
    if field is None and not any(isinstance(c, RecurrentState) for c in caches):
        field = next((f for f in RECURRENT_FIELDS if cfg.data.get(f) not in (None, 0, [], {})), None)
    if field is not None:
        what = UNMODELLED_CACHE_FIELDS.get(field, "recurrent or convolution state in layers kvplan reads as attention")
        raise KvplanError(f"{cfg.where}: kvplan cannot lay out {model_type or 'this model'}'s cache: its config has "
                          f"{field} ({what}), which kvplan does not model, so its KV figures would be wrong")


def _widths(cfg: Fields, model_type: str, family: Family, hidden: int, num_layers: int) -> Widths:
    """The forward widths: dense MLP (or shared expert) and routed expert intermediates, widest over layers.
    Nemotron-H and NAS blocks mix per-block FFN shapes that kvplan does not carry: no widths for them."""
    moe = _MoE.read(cfg, model_type)
    dense = moe is None or any(not moe.on_layer(i) for i in range(num_layers))
    intermediate = _intermediate(cfg, model_type, hidden) if dense else 0
    if moe is not None:
        intermediate = max(intermediate, moe.shared_intermediate)
    activation = cfg.get("hidden_act", "hidden_activation", "activation_function", "activation",
                         default="silu" if family.gated_mlp else "gelu")
    return Widths(hidden=hidden, mlp_intermediate=intermediate, gated_mlp=family.gated_mlp,
                  mlp_activation=str(activation), experts_per_token=moe.top_k if moe else 0,
                  expert_intermediate=moe.intermediate if moe else 0)


def _kv_heads(cfg: Fields, model_type: str, heads: int) -> int:
    """KV heads: the aliases vLLM reads, then Falcon / GPT-BigCode multi_query (1 head), else MHA."""
    if model_type == "falcon" and cfg.flag("new_decoder_architecture"):
        return cfg.int("num_kv_heads", "n_head_kv", default=heads)
    found = cfg.int("num_key_value_heads", "n_head_kv", "num_kv_heads", "multi_query_group_num",
                    "num_attention_groups", default=None)
    if found is not None:
        return found
    if cfg.flag("multi_query"):
        return 1
    return heads


def _head_dim(cfg: Fields, hidden: int, heads: int) -> int:
    explicit = cfg.int("head_dim", "attention_head_dim", "d_kv", "kv_channels", default=None)
    if explicit is not None:
        return explicit
    if hidden % heads:
        raise KvplanError(f"{cfg.where}: no head_dim is given and hidden size {hidden} is not a multiple of "
                          f"{heads} heads")
    return hidden // heads


def _layer_caches(cfg: Fields, types: list[str], kv_heads: int, head_dim: int) -> list:
    """One cache entry per layer, from its layer type."""
    attention = {"kv_heads": kv_heads, "head_dim": head_dim, "head_dim_v": cfg.int("v_head_dim", default=head_dim)}
    caches = []
    for i, layer_type in enumerate(types):
        if layer_type in ("full_attention", "attention"):
            caches.append(FullAttention(layer=i, **attention))
        elif layer_type == "sliding_attention":
            caches.append(SlidingWindow(layer=i, window=cfg.int("sliding_window"), **attention))
        elif layer_type == "chunked_attention":
            caches.append(ChunkedAttention(layer=i, chunk=cfg.int("attention_chunk_size"), **attention))
        elif layer_type in ("mamba", "mamba2"):
            caches.append(_mamba_state(cfg, i, layer_type))
        elif layer_type == "linear_attention":
            caches.append(_gated_deltanet_state(cfg, i))
        elif layer_type in ("mlp", "moe"):
            caches.append(NoCache(layer=i, reason=f"{layer_type}-only block"))
        else:
            raise KvplanError(f"{cfg.where}: layer {i} has layer type {layer_type!r}, which kvplan does not know")
    return caches


def _layer_types(cfg: Fields, model_type: str, n: int, notes: list[str]) -> list[str]:
    """The type of each layer, from the field that family uses to say it (transformers' config classes)."""
    if cfg.has("layer_types"):
        return cfg.list("layer_types", str, length=n)
    if model_type == "nemotron_h":  # the pattern is the layout's only statement: M mamba2, * attention, - mlp, E moe
        pattern = cfg.get("hybrid_override_pattern")
        symbols = {"M": "mamba2", "*": "full_attention", "-": "mlp", "E": "moe"}
        if not isinstance(pattern, str) or len(pattern) != n or set(pattern) - set(symbols):
            raise KvplanError(f"{cfg.where}: hybrid_override_pattern needs one of M * - E for each of the {n} layers")
        return [symbols[c] for c in pattern]
    if model_type == "jamba":  # attention on layers i % period == offset, Mamba elsewhere
        period, offset = cfg.int("attn_layer_period"), cfg.int("attn_layer_offset", minimum=0)
        return ["full_attention" if i % period == offset else "mamba" for i in range(n)]
    if model_type == "qwen3_next":  # every full_attention_interval-th layer is full attention, the rest Gated DeltaNet
        interval = cfg.int("full_attention_interval")
        return ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)]
    if model_type == "llama4_text" and cfg.has("attention_chunk_size"):
        # NoPE layers (no_rope_layers[i] == 0) attend globally, the rest in chunks; empty list: every 4th is NoPE
        rope = cfg.list("no_rope_layers", int) or [
            int((i + 1) % cfg.int("no_rope_layer_interval") != 0) for i in range(n)
        ]
        if len(rope) != n:
            raise KvplanError(f"{cfg.where}: no_rope_layers must have one entry for each of the {n} layers")
        return ["chunked_attention" if rope[i] else "full_attention" for i in range(n)]
    window = cfg.int("sliding_window", default=None)
    if window and model_type in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe") and not cfg.flag("use_sliding_window"):
        notes.append(f"sliding_window {window} ignored: use_sliding_window is false")
        window = None
    if not window:
        return ["full_attention"] * n
    if model_type == "gemma2":  # even layers slide, odd layers are global
        return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]
    if model_type in ("gemma3_text", "cohere2"):  # every pattern-th layer global, the others slide
        pattern = cfg.int("sliding_window_pattern")
        return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]
    if model_type in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe"):  # slide from max_window_layers up
        first = cfg.int("max_window_layers", default=0, minimum=0)
        return ["sliding_attention" if i >= first else "full_attention" for i in range(n)]
    return ["sliding_attention"] * n  # Mistral v0.1, Phi-3: one window on every layer


def _nas_blocks(cfg: Fields, n: int) -> list[Fields]:
    blocks = cfg.data["block_configs"]
    if not isinstance(blocks, list) or len(blocks) != n or not all(isinstance(b, dict) for b in blocks):
        raise KvplanError(f"{cfg.where}: block_configs must have one object for each of the {n} layers")
    return [Fields(block, f"{cfg.where} block_configs[{i}]") for i, block in enumerate(blocks)]


def _nas_caches(blocks: list[Fields], head_dim: int, heads: int) -> list:
    caches = []
    for i, block in enumerate(blocks):
        attn = block.mapping("attention")
        if attn.flag("no_op") or attn.flag("replace_with_linear"):
            reason = "attention removed (no_op)" if attn.flag("no_op") else "attention replaced by a linear layer"
            caches.append(NoCache(layer=i, reason=reason))
            continue
        group = attn.int("n_heads_in_group")
        if heads % group:
            raise KvplanError(f"{attn.where}: n_heads_in_group {group} does not divide {heads} heads")
        caches.append(FullAttention(layer=i, kv_heads=heads // group, head_dim=head_dim, head_dim_v=head_dim))
    return caches


def _mamba_state(cfg: Fields, layer: int, mixer: str) -> RecurrentState:
    """Mamba state per sequence: conv (channels x (kernel - 1)) + SSM, as vLLM's MambaSpec sizes it.
    Mamba1 (Jamba): channels = d_inner, ssm = d_inner x d_state.
    Mamba2 (Nemotron-H): channels = d_inner + 2 x n_groups x d_state, ssm = heads x head_dim x d_state."""
    d_inner, d_state, d_conv = _mamba_dims(cfg)
    if mixer == "mamba":
        conv_channels, ssm = d_inner, d_inner * d_state
    else:
        groups = cfg.int("mamba_n_groups", "n_groups")
        conv_channels = d_inner + 2 * groups * d_state
        ssm = cfg.int("mamba_num_heads") * cfg.int("mamba_head_dim") * d_state
    return RecurrentState(layer=layer, mixer=mixer, conv_elements=conv_channels * (d_conv - 1), ssm_elements=ssm,
                          ssm_dtype=_optional_dtype(cfg, "mamba_ssm_cache_dtype", "mamba_ssm_dtype"),
                          conv_kernel=d_conv if d_conv > 1 else None)


def _mamba_dims(cfg: Fields) -> tuple[int, int, int]:
    d_state = cfg.int("mamba_d_state", "ssm_state_size", "state_size")
    d_conv = cfg.int("mamba_d_conv", "conv_kernel", "mamba_conv_kernel")
    if cfg.has("mamba_num_heads") and cfg.has("mamba_head_dim"):
        d_inner = cfg.int("mamba_num_heads") * cfg.int("mamba_head_dim")
    else:
        d_inner = cfg.int("mamba_expand", "expand") * cfg.int("hidden_size")
    return d_inner, d_state, d_conv


def _gated_deltanet_state(cfg: Fields, layer: int) -> RecurrentState:
    """Gated DeltaNet (Qwen3-Next): conv over q, k, v channels (2 x Hk x Dk + Hv x Dv) x (kernel - 1);
    recurrent state Hv x Dv x Dk (vLLM's GDN MambaSpec)."""
    key_heads, value_heads = cfg.int("linear_num_key_heads"), cfg.int("linear_num_value_heads")
    key_dim, value_dim = cfg.int("linear_key_head_dim"), cfg.int("linear_value_head_dim")
    kernel = cfg.int("linear_conv_kernel_dim")
    conv_channels = 2 * key_heads * key_dim + value_heads * value_dim
    return RecurrentState(layer=layer, mixer="gated_deltanet", conv_elements=conv_channels * (kernel - 1),
                          ssm_elements=value_heads * value_dim * key_dim,
                          ssm_dtype=_optional_dtype(cfg, "mamba_ssm_dtype"),
                          conv_kernel=kernel if kernel > 1 else None)


def _optional_dtype(cfg: Fields, *names: str) -> str | None:
    value = cfg.get(*names, default=None)
    return _dtype_name(cfg, value, names[0]) if value is not None else None


# ---------------------------------------------------------------------------------------------- dtypes, limits

_FLOAT_NAMES = {"float32": "fp32", "float": "fp32", "fp32": "fp32", "bfloat16": "bf16", "bf16": "bf16",
                "float16": "fp16", "fp16": "fp16", "half": "fp16"}


def _dtype_name(cfg: Fields, value: Any, field: str) -> str:
    name = _FLOAT_NAMES.get(str(value).removeprefix("torch.").lower())
    if name is None:
        raise KvplanError(f"{cfg.where}: field {field} is {value!r}, not a float dtype (float32, bfloat16, float16)")
    return name


def _float_dtype(cfg: Fields, notes: list[str], quantized: bool) -> str:
    """The checkpoint's float dtype. Without torch_dtype, vLLM and transformers' legacy loading take float32;
    quantised checkpoints (gpt-oss) keep their unquantised tensors in bf16, so those are read as bf16."""
    value = cfg.get("torch_dtype", "dtype", default=None)
    if value is not None:
        return _dtype_name(cfg, value, "torch_dtype")
    if quantized:
        notes.append("config names no torch_dtype: the unquantised tensors of this quantised checkpoint taken as bf16")
        return "bf16"
    notes.append("config names no torch_dtype: weights and KV taken as float32 (use --kv-dtype to serve in bf16)")
    return "fp32"


def _max_context(cfg: Fields, notes: list[str]) -> int | None:
    value = cfg.get("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx",
                    default=None)
    if value is None:
        return None
    if isinstance(value, float) and not math.isfinite(value):
        notes.append("max_position_embeddings is not finite: no context limit")
        return None
    return cfg.int("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")


def _quantization(cfg: Fields, notes: list[str]) -> tuple[Quantization | None, str | None]:
    """Weight dtype from quantization_config (fp8, mxfp4, AWQ/GPTQ, bitsandbytes, compressed-tensors)."""
    if not cfg.has("quantization_config"):
        return None, None
    qc = cfg.mapping("quantization_config")
    method = str(qc.get("quant_method", default="")).lower()
    bits = qc.int("bits", default=None)
    groups = LINEAR_GROUPS
    if any("attn" in module for module in qc.list("modules_to_not_convert", str)):
        groups = tuple(g for g in groups if g != "attention")
    kv_dtype = None
    if method == "fp8":
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


# ---------------------------------------------------------------------------------------------- parameters


def _decoder_params(cfg: Fields, model_type: str, family: Family, caches: list, types: list[str],
                    blocks: list[Fields], hidden: int, heads: int, head_dim: int) -> ParamCounts:
    """Parameters block by block, following each family's modeling file. Multi-token-prediction heads
    (DeepSeek num_nextn_predict_layers) are not part of the served model and are not counted."""
    vocab = cfg.int("vocab_size", "n_vocab", "padded_vocab_size")
    norm = hidden * (2 if family.layer_norm else 1)
    embedding = vocab * hidden
    if family.learned_positions:
        embedding += cfg.int("n_positions", "max_position_embeddings") * hidden
    tied = cfg.flag("tie_word_embeddings", default=True)
    lm_head = 0 if tied else vocab * hidden
    totals = {"attention": 0, "mlp": 0, "experts": 0, "active_experts": 0, "other": norm}  # final norm
    if model_type == "phi":
        totals["other"] += vocab  # lm_head bias
    moe = _MoE.read(cfg, model_type)
    for cache in caches:
        i = cache.layer
        layer_norms = _norms_per_layer(cfg, model_type, family)
        mixer, mixer_other = _mixer_params(cfg, model_type, family, cache, hidden, heads, head_dim)
        totals["attention"] += mixer
        totals["other"] += mixer_other
        if blocks:
            ffn, layer_norms = _nas_block_params(blocks[i], hidden)
            totals["mlp"] += ffn
        elif model_type == "nemotron_h":  # each block is a single mixer, MLP or MoE
            if types[i] == "mlp":
                totals["mlp"] += 2 * hidden * cfg.int("intermediate_size")
            elif types[i] == "moe":
                if moe is None:
                    raise KvplanError(f"{cfg.where}: MoE layers (E) but no n_routed_experts")
                moe.add(totals, hidden)
        elif moe and moe.on_layer(i):
            moe.add(totals, hidden)
        else:
            totals["mlp"] += _dense_mlp(cfg, model_type, family, hidden)
            if family.mlp_bias:
                totals["other"] += _mlp_bias(cfg, model_type, family, hidden)
        totals["other"] += layer_norms * norm
    return ParamCounts(embedding=embedding, lm_head=lm_head, **totals)


def _norms_per_layer(cfg: Fields, model_type: str, family: Family) -> int:
    """Falcon: the 7B-style parallel block shares one input LayerNorm; new_decoder_architecture has
    ln_attn and ln_mlp (or one, with num_ln_in_parallel_attn = 1)."""
    if model_type == "falcon":
        if cfg.flag("new_decoder_architecture"):
            return cfg.int("num_ln_in_parallel_attn", default=2)
        return 1 if cfg.flag("parallel_attn", default=True) else 2
    return family.norms_per_layer


def _intermediate(cfg: Fields, model_type: str, hidden: int) -> int:
    if model_type in ("gpt2", "gpt_bigcode") or (model_type == "falcon" and not cfg.has("ffn_hidden_size")):
        return cfg.int("n_inner", "ffn_hidden_size", default=4 * hidden)
    if model_type == "llama4_text":
        return cfg.int("intermediate_size_mlp", "intermediate_size")
    return cfg.int("intermediate_size", "n_inner", "ffn_hidden_size", "ffn_dim")


def _dense_mlp(cfg: Fields, model_type: str, family: Family, hidden: int) -> int:
    intermediate = _intermediate(cfg, model_type, hidden)
    return (3 if family.gated_mlp else 2) * hidden * intermediate


def _mlp_bias(cfg: Fields, model_type: str, family: Family, hidden: int) -> int:
    return _intermediate(cfg, model_type, hidden) * (2 if family.gated_mlp else 1) + hidden


def _mixer_params(cfg: Fields, model_type: str, family: Family, cache, hidden: int, heads: int,
                  head_dim: int) -> tuple[int, int]:
    """(matrix params, other params) of a layer's attention or recurrent mixer."""
    if isinstance(cache, MLALatent):
        return _mla_params(cfg, hidden, heads)
    if isinstance(cache, RecurrentState):
        if cache.mixer == "gated_deltanet":
            return _gated_deltanet_params(cfg, hidden)
        return _mamba_params(cfg, hidden, cache.mixer)
    if isinstance(cache, NoCache):
        replaced = "replaced by a linear" in cache.reason
        return (hidden * hidden if replaced else 0), 0
    k, v = cache.kv_heads * cache.head_dim, cache.kv_heads * cache.head_dim_v
    q = heads * head_dim * (2 if model_type == "qwen3_next" else 1)  # Qwen3-Next gates its attention output
    matrices = hidden * (q + k + v) + heads * cache.head_dim_v * hidden
    other = 0
    if family.qkv_bias or cfg.flag("attention_bias"):
        other += heads * head_dim + k + v
    if family.o_bias or (cfg.flag("attention_bias") and model_type not in ("qwen2", "qwen2_moe")):
        other += hidden
    if family.qk_norm == "head":
        other += 2 * head_dim
    elif family.qk_norm == "full":
        other += heads * head_dim + k
    if model_type == "gpt_oss" or (model_type == "mimo_v2_flash" and isinstance(cache, SlidingWindow)):
        other += heads  # attention sinks: one learned logit per head
    return matrices, other


def _mla_params(cfg: Fields, hidden: int, heads: int) -> tuple[int, int]:
    """DeepSeek MLA: q via q_lora_rank (or direct), kv_a (latent + rope), kv_b (latent -> heads), o."""
    nope, rope, v = cfg.int("qk_nope_head_dim"), cfg.int("qk_rope_head_dim", minimum=0), cfg.int("v_head_dim")
    latent = cfg.int("kv_lora_rank")
    q_rank = cfg.int("q_lora_rank", default=None)
    q_head = heads * (nope + rope)
    q = hidden * q_rank + q_rank * q_head if q_rank else hidden * q_head
    matrices = q + hidden * (latent + rope) + latent * heads * (nope + v) + heads * v * hidden
    return matrices, latent + (q_rank or 0)  # kv_a_layernorm, q_a_layernorm


def _mamba_params(cfg: Fields, hidden: int, mixer: str) -> tuple[int, int]:
    """Mamba1 (Jamba: in_proj, conv1d, x_proj, dt_proj, A, D, out_proj, dt/B/C norms) or
    Mamba2 (in_proj to z, x, B, C, dt; conv1d; dt_bias, A, D; gated norm; out_proj)."""
    d_inner, d_state, d_conv = _mamba_dims(cfg)
    conv_bias = cfg.flag("mamba_conv_bias", default=True) and cfg.flag("use_conv_bias", default=True)
    if mixer == "mamba":
        dt_rank = cfg.int("mamba_dt_rank", "time_step_rank", default=math.ceil(hidden / 16))
        matrices = hidden * 2 * d_inner + d_inner * (dt_rank + 2 * d_state) + dt_rank * d_inner + d_inner * hidden
        other = d_inner * d_conv + (d_inner if conv_bias else 0) + d_inner + d_inner * d_state + d_inner
        if cfg.flag("mamba_proj_bias"):
            other += 2 * d_inner + hidden
        if cfg.data.get("model_type") == "jamba":
            other += dt_rank + 2 * d_state  # dt_layernorm, b_layernorm, c_layernorm
        return matrices, other
    groups, mamba_heads = cfg.int("mamba_n_groups", "n_groups"), cfg.int("mamba_num_heads")
    conv_channels = d_inner + 2 * groups * d_state
    matrices = hidden * (2 * d_inner + 2 * groups * d_state + mamba_heads) + d_inner * hidden
    other = conv_channels * d_conv + (conv_channels if conv_bias else 0) + 3 * mamba_heads + d_inner
    return matrices, other


def _gated_deltanet_params(cfg: Fields, hidden: int) -> tuple[int, int]:
    """Qwen3-Next Gated DeltaNet: in_proj_qkvz, in_proj_ba, conv1d (no bias), dt_bias, A_log, gated norm, out_proj."""
    hk, hv = cfg.int("linear_num_key_heads"), cfg.int("linear_num_value_heads")
    dk, dv, kernel = cfg.int("linear_key_head_dim"), cfg.int("linear_value_head_dim"), cfg.int("linear_conv_kernel_dim")
    key_dim, value_dim = hk * dk, hv * dv
    matrices = hidden * (2 * key_dim + 2 * value_dim) + hidden * 2 * hv + value_dim * hidden
    other = (2 * key_dim + value_dim) * kernel + 2 * hv + dv
    return matrices, other


def _nas_block_params(block: Fields, hidden: int) -> tuple[int, int]:
    """(FFN matrix params, norms) of a Nemotron NAS block. FFN width from ffn_mult:
    intermediate = round_up(int(2 x mult x hidden / 3), 256) (DeciLM `_ffn_mult_to_intermediate_size`)."""
    ffn = block.mapping("ffn")
    attention_norm = 0 if block.mapping("attention").flag("no_op") else 1
    if ffn.flag("no_op"):
        return 0, attention_norm
    if ffn.flag("replace_with_linear"):
        return hidden * hidden, attention_norm + 1
    intermediate = int(2 * ffn.number("ffn_mult") * hidden / 3)
    intermediate = -(-intermediate // 256) * 256
    return 3 * hidden * intermediate, attention_norm + 1


@dataclass(frozen=True)
class _MoE:
    """Mixture-of-experts layout: routed experts (counted as `experts`), shared experts (`mlp`), router (`other`)."""

    experts: int
    top_k: int
    intermediate: int  # one expert's intermediate size
    shared_intermediate: int  # the shared experts' intermediate, all of them together
    expert_size: int  # matrix params of one expert
    expert_bias: int
    shared: int
    router: int
    dense_layers: frozenset[int]

    @classmethod
    def read(cls, cfg: Fields, model_type: str) -> _MoE | None:
        n = cfg.int("num_local_experts", "n_routed_experts", "num_experts", default=0, minimum=0)
        if not n:
            return None
        hidden, layers = cfg.int("hidden_size"), cfg.layers("num_hidden_layers")
        top_k = cfg.int("num_experts_per_tok", "experts_per_token", "num_experts_per_token")
        size = cfg.int("moe_intermediate_size", "intermediate_size")
        expert, bias, router = 3 * hidden * size, 0, hidden * n
        if model_type == "gpt_oss":  # gate_up_proj + down_proj with biases; router with bias
            bias, router = 2 * size + hidden, hidden * n + n
        shared_size = 0
        if cfg.has("n_shared_experts"):
            shared_size = cfg.int("n_shared_experts", minimum=0) * size
        elif cfg.has("shared_expert_intermediate_size"):
            shared_size = cfg.int("shared_expert_intermediate_size", minimum=0)
            router += hidden if shared_size else 0  # shared_expert_gate
        elif model_type == "llama4_text":
            shared_size = size
        if model_type in CORRECTION_BIAS_ROUTERS:
            router += n  # e_score_correction_bias
        first_dense = cfg.int("first_k_dense_replace", default=0, minimum=0)
        if first_dense > layers:
            raise KvplanError(f"{cfg.where}: first_k_dense_replace {first_dense:,} exceeds the {layers} layers")
        dense = set(range(first_dense))
        dense |= set(cfg.list("mlp_only_layers", int))
        if cfg.has("mlp_layer_types"):  # transformers 5's per-layer statement: "dense" or "sparse"
            kinds = cfg.list("mlp_layer_types", str, length=layers)
            if set(kinds) - {"dense", "sparse"}:
                raise KvplanError(f"{cfg.where}: field mlp_layer_types must hold \"dense\" or \"sparse\" for each "
                                  f"layer, got {sorted(set(kinds) - {'dense', 'sparse'})}")
            dense |= {i for i, kind in enumerate(kinds) if kind == "dense"}
        if model_type == "jamba":  # experts on layers i % period == offset
            period, offset = cfg.int("expert_layer_period"), cfg.int("expert_layer_offset", minimum=0)
            dense |= {i for i in range(layers) if i % period != offset}
        elif cfg.has("moe_layer_freq"):  # DeepSeek: experts on layers i % freq == 0 (past first_k_dense_replace)
            dense |= {i for i in range(layers) if i % cfg.int("moe_layer_freq")}
        else:  # Qwen MoE decoder_sparse_step, Llama 4 interleave_moe_layer_step: every step-th layer
            step = cfg.int("decoder_sparse_step", "interleave_moe_layer_step", default=1)
            dense |= {i for i in range(layers) if (i + 1) % step}
        return cls(n, top_k, size, shared_size, expert, bias, 3 * hidden * shared_size, router,
                   frozenset(dense))

    def on_layer(self, i: int) -> bool:
        return i not in self.dense_layers

    def add(self, totals: dict, hidden: int) -> None:
        totals["experts"] += self.experts * self.expert_size
        totals["active_experts"] += self.top_k * self.expert_size
        totals["mlp"] += self.shared
        totals["other"] += self.router + self.experts * self.expert_bias


# ----------------------------------------------------------------------------- vision towers of multimodal models


def _vit_attention_and_mlp(hidden: int, intermediate: int) -> int:
    """A ViT block's attention and MLP (SigLIP, Llama 4 vision): q, k, v, o with biases; fc1, fc2 with biases."""
    return 4 * (hidden * hidden + hidden) + 2 * hidden * intermediate + intermediate + hidden


def _vit_layer(hidden: int, intermediate: int) -> int:
    """One pre-norm ViT encoder layer: attention and MLP, and two LayerNorms (weight and bias)."""
    return _vit_attention_and_mlp(hidden, intermediate) + 2 * 2 * hidden


def _gemma3_vision(vision: Fields, text_hidden: int) -> int:
    """Gemma 3: a SigLIP vision transformer (transformers `SiglipVisionModel`) and `Gemma3MultiModalProjector`.
    SigLIP: a patch Conv2d with bias, one learned position per patch, the layers, a post LayerNorm, and the
    attention-pooling head only if vision_use_head (Gemma 3 sets it false). Projector: a vision x text matrix
    and an RMSNorm over the vision width."""
    hidden, intermediate = vision.int("hidden_size"), vision.int("intermediate_size")
    patch = vision.int("patch_size")
    patches = (vision.int("image_size") // patch) ** 2
    tower = (vision.int("num_channels", default=3) * patch * patch * hidden + hidden + patches * hidden
             + vision.layers("num_hidden_layers") * _vit_layer(hidden, intermediate) + 2 * hidden)
    if vision.flag("vision_use_head", default=True):  # probe, nn.MultiheadAttention and MLP, LayerNorm
        tower += hidden + _vit_attention_and_mlp(hidden, intermediate) + 2 * hidden
    return tower + hidden * text_hidden + hidden


def _llama4_vision(vision: Fields, text_hidden: int) -> int:
    """Llama 4: `Llama4VisionModel` and `Llama4MultiModalProjector`. The tower: an unfolded patch projection
    (no bias), a class embedding, one learned position per patch plus the class token, pre and post LayerNorms,
    the layers, and the pixel-shuffle adapter's two bias-free matrices (intermediate x projector_input_dim,
    projector_output_dim squared). Projector: vision_output_dim x text hidden, no bias."""
    hidden, intermediate = vision.int("hidden_size"), vision.int("intermediate_size")
    patch = vision.int("patch_size")
    positions = (vision.int("image_size") // patch) ** 2 + 1
    adapter = intermediate * vision.int("projector_input_dim") + vision.int("projector_output_dim") ** 2
    tower = (vision.int("num_channels", default=3) * patch * patch * hidden + hidden + positions * hidden
             + 2 * 2 * hidden + vision.layers("num_hidden_layers") * _vit_layer(hidden, intermediate) + adapter)
    return tower + vision.int("vision_output_dim") * text_hidden


VISION_TOWERS = {"gemma3": _gemma3_vision, "llama4": _llama4_vision}  # the multimodal config's model_type


def _vision_params(top: Fields, text: Fields, notes: list[str]) -> int:
    """Parameters of a multimodal checkpoint's vision tower and projector, from its vision_config. They are
    loaded with the decoder (vLLM loads them unless images are turned off) but no text token touches them,
    so they count in the weights and not in the active parameters. Unknown towers are left out, with a note."""
    model_type = str(top.get("model_type", default=""))
    counter = VISION_TOWERS.get(model_type)
    others = [name for name in ("vision_config", "audio_config") if top.has(name)]
    if counter is None or not top.has("vision_config"):
        encoders = " and ".join(name.removesuffix("_config") for name in others) or "non-text"
        notes.append(f"text decoder read from text_config; the {encoders} encoder of {model_type or 'this model'} "
                     "is not counted (kvplan counts Gemma 3 and Llama 4 vision towers)")
        return 0
    count = counter(top.mapping("vision_config"), text.int("hidden_size", "n_embd", "d_model", "dim"))
    notes.append(f"text decoder read from text_config; weights include the vision tower and projector "
                 f"({count / 1e9:.2f}B params, not active for text)")
    return count


def _encoder_only(cfg: Fields, model_type: str, name: str, source: str, notes: list[str]) -> ModelSpec:
    """BERT-style encoders encode the whole input in one pass and never decode: no KV cache."""
    layers = cfg.layers("num_hidden_layers", "n_layers", "num_layers")
    hidden, heads = cfg.int("hidden_size", "dim"), cfg.int("num_attention_heads", "n_heads")
    intermediate, vocab = cfg.int("intermediate_size", "hidden_dim"), cfg.int("vocab_size")
    positions = cfg.int("max_position_embeddings", default=512)
    types = cfg.int("type_vocab_size", default=0, minimum=0)
    reason = f"{model_type} is encoder-only: it encodes its input in one pass, never decodes, and keeps no KV cache"
    notes.append(reason)
    per_layer_other = 4 * hidden + intermediate + hidden + 2 * 2 * hidden  # q,k,v,o and MLP biases; 2 LayerNorms
    params = ParamCounts(
        embedding=(vocab + positions + types) * hidden, lm_head=0,
        attention=layers * 4 * hidden * hidden, mlp=layers * 2 * hidden * intermediate, experts=0, active_experts=0,
        other=layers * per_layer_other + 2 * hidden + (hidden * hidden + hidden if model_type == "bert" else 0),
    )
    return ModelSpec(name=name, architecture=model_type, num_layers=layers, num_attention_heads=heads,
                     caches=tuple(NoCache(layer=i, reason="encoder-only") for i in range(layers)), params=params,
                     source=source, **_common(cfg, notes))


def _encoder_decoder(cfg: Fields, model_type: str, name: str, source: str, notes: list[str]) -> ModelSpec:
    """T5-style: each decoder layer caches its self-attention (grows with output) and cross-attention
    (the encoder's keys and values; T5 has no fixed encoder length, so it is taken as long as the context)."""
    if model_type != "t5":
        raise KvplanError(f"{cfg.where}: encoder-decoder model_type {model_type!r} is not supported yet (T5 is)")
    hidden, heads, d_kv = cfg.int("d_model"), cfg.int("num_heads"), cfg.int("d_kv")
    enc_layers = cfg.layers("num_layers")
    dec_layers = cfg.layers("num_decoder_layers", default=enc_layers)
    d_ff, vocab = cfg.int("d_ff"), cfg.int("vocab_size")
    gated = str(cfg.get("feed_forward_proj", default="relu")).startswith("gated")
    notes.append("cross-attention holds as many encoder tokens as the context (T5 has no fixed input length)")
    attention = {"kv_heads": heads, "head_dim": d_kv, "head_dim_v": d_kv}
    caches = []
    for i in range(dec_layers):
        caches += [FullAttention(layer=i, **attention), CrossAttention(layer=i, **attention)]
    inner = heads * d_kv
    attn = 4 * hidden * inner
    ff = (3 if gated else 2) * hidden * d_ff
    buckets = cfg.int("relative_attention_num_buckets", default=32)
    params = ParamCounts(
        embedding=vocab * hidden, lm_head=0 if cfg.flag("tie_word_embeddings", True) else vocab * hidden,
        attention=enc_layers * attn + dec_layers * 2 * attn, mlp=(enc_layers + dec_layers) * ff,
        experts=0, active_experts=0,
        other=2 * buckets * heads + (2 * enc_layers + 3 * dec_layers + 2) * hidden,
    )
    return ModelSpec(name=name, architecture=model_type, num_layers=dec_layers, num_attention_heads=heads,
                     caches=tuple(caches), params=params, source=source, **_common(cfg, notes))
