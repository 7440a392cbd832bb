"""config.json -> ModelSpec: the reader that takes a config apart (multimodal nesting, old model types, defaults)
and hands it to the decoder rules, or to the encoder and encoder-decoder rules of `encoders.py`."""

from __future__ import annotations

from pathlib import Path

from kvplan.errors import KvplanError
from kvplan.model import ModelSpec
from kvplan.sources.hf_config.eagle import read_eagle_head
from kvplan.sources.hf_config.encoders import (
    BERT_FAMILIES,
    ENCODER_DECODERS,
    bert_family,
    encoder_decoder,
    encoder_only,
)
from kvplan.sources.hf_config.families import (
    ASSISTANT_FIELDS,
    ASSISTANT_TYPES,
    ENCODER_ONLY,
    FAMILIES,
    LLAMA_LIKE,
    MODEL_TYPE_ALIASES,
    MODEL_TYPE_DEFAULTS,
    NESTED_FIELDS,
    OMITTED_PER_LAYER_FIELDS,
    REFUSED_FAMILIES,
    load_rules,
)
from kvplan.sources.hf_config.fields import Fields, parse_json, read_text
from kvplan.sources.hf_config.layout import (
    FAMILY_LAYOUTS,
    read_heads,
    read_kv_heads,
    read_layer_count,
    read_layout,
)
from kvplan.sources.hf_config.mamba import is_mamba_ssm_config, mamba_ssm_fields
from kvplan.sources.hf_config.mtp import read_mtp
from kvplan.sources.hf_config.params import decoder_params, read_widths
from kvplan.sources.hf_config.quantization import common
from kvplan.sources.hf_config.vision import flat_encoders_note, multimodal_input, vision_params


def read_config_file(path: Path, name: str | None = None, source: str | None = None) -> ModelSpec:
    """Read a config.json file, or a directory holding one. Its name: the config's `_name_or_path`, else the
    file's own name, or its directory's when the file is a plain config.json (`models/qwen3-8b/config.json`
    is qwen3-8b), so that several local models can be told apart."""
    if path.is_dir():
        if not (path / "config.json").exists():
            raise KvplanError(f"{path}: directory has no config.json")
        path = path / "config.json"
    config = with_quant_sidecar(parse_json(read_text(path), str(path)), path.parent / MODELOPT_SIDECAR)
    plain_name = path.stem.lower() == "config" and path.resolve().parent.name
    name = name or str(config.get("_name_or_path") or plain_name or path.stem)
    return model_from_config(config, name, source or f"file {path}", where=str(path))


# TensorRT Model Optimizer's checkpoints state their quantisation beside config.json, in this file, when config.json
# has no quantization_config (older exports); vLLM and TensorRT-LLM read it from there (vLLM's ModelOptFp8Config
# `get_config_filenames`).
MODELOPT_SIDECAR = "hf_quant_config.json"


def with_quant_sidecar(config: dict, sidecar: Path | None) -> dict:
    """The config with a ModelOpt hf_quant_config.json beside it (`sidecar`, where it exists) as its
    quantization_config, as quant_method modelopt, where the config has none of its own."""
    if sidecar is None or not sidecar.is_file() or not isinstance(config, dict) or config.get("quantization_config"):
        return config
    return config | {"quantization_config": {"quant_method": "modelopt", **parse_json(read_text(sidecar),
                                                                                         str(sidecar))}}


def model_from_config(config: dict, name: str, source: str, where: str = "config.json") -> ModelSpec:
    """Turn a config.json dict into a ModelSpec, or raise KvplanError naming the field that is missing or wrong."""
    if not isinstance(config, dict):
        raise KvplanError(f"{where}: expected a JSON object with the model's fields")
    top = Fields(config, where)
    text = config.get("text_config")
    notes: list[str] = []
    vision = 0
    multimodal = None
    if isinstance(text, dict):
        data = dict(text)
        for key in ("torch_dtype", "dtype", "quantization_config", "tie_word_embeddings"):
            if key not in data and key in config:
                data[key] = config[key]
        if config.get("model_type") in ASSISTANT_TYPES:  # a drafter: its decoder with its own projections
            data.update({key: config[key] for key in ASSISTANT_FIELDS if key in config},
                        model_type=config["model_type"])
        else:
            vision = vision_params(top, Fields(data, f"{where} (text_config)"), notes)
            multimodal = multimodal_input(top, Fields(data, f"{where} (text_config)"))
        where = f"{where} (text_config)"
    elif is_mamba_ssm_config(config):  # state-spaces/mamba*: mamba_ssm's own format, read as transformers'
        data = mamba_ssm_fields(config, where)
        notes.append(f"mamba_ssm checkpoint: vLLM and transformers serve it converted to their {data['model_type']} "
                     "(transformers' convert_mamba*_ssm_checkpoint_to_pytorch.py); these figures are that model's")
    else:
        data = dict(config)
        flat_encoders_note(top, notes)
    model_type = str(data.get("model_type") or config.get("model_type") or "")
    if model_type == "RefinedWeb":  # Falcon-40B's original format: the new decoder architecture
        data.setdefault("new_decoder_architecture", True)
        model_type = "falcon"
    model_type = MODEL_TYPE_ALIASES.get(model_type, model_type)
    load_rules(model_type)
    if model_type in REFUSED_FAMILIES:
        raise KvplanError(f"{where}: {REFUSED_FAMILIES[model_type]}")
    eagle = read_eagle_head(top, Fields(data, where), model_type)  # another family's head is refused here
    for key, value in MODEL_TYPE_DEFAULTS.get(model_type, {}).items():
        data.setdefault(key, value)
    lift_nested_fields(data, model_type, where)
    cfg = Fields(data, where)
    if model_type in OMITTED_PER_LAYER_FIELDS:
        layers = cfg.layers("num_hidden_layers", "n_layer", "num_layers", "n_layers")
        for key, value in OMITTED_PER_LAYER_FIELDS[model_type](cfg, layers).items():
            if data.get(key) is None:
                data[key] = value

    if model_type in BERT_FAMILIES:
        return bert_family(cfg, top, model_type, name, source, notes)
    if model_type in ENCODER_ONLY or (
        not model_type and any(a.endswith("ForMaskedLM") for a in top.list("architectures"))
    ):
        return encoder_only(cfg, model_type or "encoder", name, source, notes)
    if model_type in ENCODER_DECODERS or top.flag("is_encoder_decoder"):
        return encoder_decoder(cfg, top, model_type, name, source, notes)
    spec = decoder(cfg, model_type, name, source, notes, vision)
    return spec.model_copy(update={"multimodal": multimodal, "eagle": eagle}) if multimodal or eagle else spec



def lift_nested_fields(data: dict, model_type: str, where: str) -> None:
    """Copy the fields a family nests in sub-objects (DBRX's attn_config and ffn_config) to the names the shared
    rules read, in place; the nested value wins, as in the family's modeling file."""
    for field, (parent, name) in NESTED_FIELDS.get(model_type, {}).items():
        data[field] = Fields(data, where).mapping(parent).int(name)


def decoder(cfg: Fields, model_type: str, name: str, source: str, notes: list[str], vision: int = 0) -> ModelSpec:
    family = FAMILIES.get(model_type, LLAMA_LIKE)
    if model_type and model_type not in MODEL_TYPE_DEFAULTS and model_type not in FAMILIES | FAMILY_LAYOUTS.keys():
        notes.append(f"model_type {model_type!r} is not one kvplan knows: read as a Llama-style decoder")
    num_layers = read_layer_count(cfg, model_type)
    hidden = cfg.int("hidden_size", "n_embd", "d_model", "dim", "embedding_dim", "emb_dim")
    heads = read_heads(cfg, model_type)
    kv_heads = read_kv_heads(cfg, model_type, heads) if heads else 0
    if heads and heads % kv_heads:
        raise KvplanError(f"{cfg.where}: {heads} attention heads cannot be grouped over {kv_heads} KV heads")
    layout = read_layout(cfg, model_type, num_layers, hidden, heads, notes)
    params = decoder_params(cfg, model_type, family, layout, hidden, heads)
    params = params.model_copy(update={"vision": params.vision + vision})  # GIT's tower is in its decoder config
    widths = read_widths(cfg, model_type, family, hidden, layout)
    mtp = read_mtp(cfg, model_type, family, layout, params, hidden, heads)
    return ModelSpec(name=name, architecture=model_type or "unknown", num_layers=num_layers,
                     num_attention_heads=heads, caches=tuple(layout.caches), params=params, widths=widths,
                     source=source, vocab_size=cfg.int("vocab_size", "n_vocab", "padded_vocab_size", default=None),
                     mtp=mtp, **common(cfg, notes))
