"""config.json -> ModelSpec: the reader that takes a config apart (multimodal nesting, old model types, defaults)
and hands it to the decoder, encoder-only or encoder-decoder rules."""

from __future__ import annotations

from pathlib import Path

from kvplan.errors import KvplanError
from kvplan.model import CrossAttention, FullAttention, ModelSpec, NoCache, ParamCounts
from kvplan.sources.hf_config.families import (
    ENCODER_ONLY,
    FAMILIES,
    LLAMA_LIKE,
    MODEL_TYPE_ALIASES,
    MODEL_TYPE_DEFAULTS,
    NESTED_FIELDS,
)
from kvplan.sources.hf_config.fields import Fields, parse_json, read_text
from kvplan.sources.hf_config.layout import read_kv_heads, read_layout
from kvplan.sources.hf_config.params import decoder_params, read_widths
from kvplan.sources.hf_config.quantization import common
from kvplan.sources.hf_config.vision import vision_params


def read_config_file(path: Path, name: str | None = None, source: str | None = None) -> ModelSpec:
    """Read a config.json file, or a directory holding one."""
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise KvplanError(f"{path}: directory has no config.json")
        path = path / "config.json"
    config = parse_json(read_text(path), str(path))
    name = name or str(config.get("_name_or_path") or path.stem)
    return model_from_config(config, name, source or f"file {path}", where=str(path))



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
        vision = vision_params(top, Fields(data, f"{where} (text_config)"), notes)
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
    lift_nested_fields(data, model_type, where)
    cfg = Fields(data, where)

    if model_type in ENCODER_ONLY or (
        not model_type and any(a.endswith("ForMaskedLM") for a in top.list("architectures"))
    ):
        return encoder_only(cfg, model_type or "encoder", name, source, notes)
    if model_type == "t5" or top.flag("is_encoder_decoder"):
        return encoder_decoder(cfg, model_type, name, source, notes)
    return decoder(cfg, model_type, name, source, notes, vision)



def lift_nested_fields(data: dict, model_type: str, where: str) -> None:
    """Copy the fields a family nests in sub-objects (DBRX's attn_config and ffn_config) to the names the shared
    rules read, in place; the nested value wins, as in the family's modeling file."""
    for field, (parent, name) in NESTED_FIELDS.get(model_type, {}).items():
        data[field] = Fields(data, where).mapping(parent).int(name)


def decoder(cfg: Fields, model_type: str, name: str, source: str, notes: list[str], vision: int = 0) -> ModelSpec:
    family = FAMILIES.get(model_type, LLAMA_LIKE)
    if model_type and model_type not in MODEL_TYPE_DEFAULTS and model_type not in FAMILIES:
        notes.append(f"model_type {model_type!r} is not one kvplan knows: read as a Llama-style decoder")
    num_layers = cfg.layers("num_hidden_layers", "n_layer", "num_layers", "n_layers")
    hidden = cfg.int("hidden_size", "n_embd", "d_model", "dim", "emb_dim")
    heads = cfg.int("num_attention_heads", "n_head", "num_heads", "n_heads", "attention_heads")
    kv_heads = read_kv_heads(cfg, model_type, heads)
    if heads % kv_heads:
        raise KvplanError(f"{cfg.where}: {heads} attention heads cannot be grouped over {kv_heads} KV heads")
    layout = read_layout(cfg, model_type, num_layers, hidden, heads, notes)
    params = decoder_params(cfg, model_type, family, layout, hidden, heads)
    params = params.model_copy(update={"vision": vision})
    widths = read_widths(cfg, model_type, family, hidden, layout)
    return ModelSpec(name=name, architecture=model_type or "unknown", num_layers=num_layers,
                     num_attention_heads=heads, caches=tuple(layout.caches), params=params, widths=widths,
                     source=source, **common(cfg, notes))


def encoder_only(cfg: Fields, model_type: str, name: str, source: str, notes: list[str]) -> ModelSpec:
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
                     source=source, **common(cfg, notes))



def encoder_decoder(cfg: Fields, model_type: str, name: str, source: str, notes: list[str]) -> ModelSpec:
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
                     caches=tuple(caches), params=params, source=source, **common(cfg, notes))
