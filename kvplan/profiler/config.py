"""Where a profiled model's config.json comes from, how `--layers` cuts a model, and the fields of the
transformers config built from it. Pure Python: nothing here imports torch or transformers.

The profiler builds the model from the very config.json data kvplan reads, so the prediction and the measured
model cannot describe two different architectures. `first_layers` is the one place a model is cut to its first L
layers: it cuts the config data, reads the ModelSpec back from the cut data, and checks that the result is the
full model's spec with the later layers dropped.
"""

import copy
from dataclasses import dataclass
from pathlib import Path

from kvplan.errors import KvplanError
from kvplan.memory import kind_label
from kvplan.model import ModelSpec
from kvplan.sources import library, load_model
from kvplan.sources.hf_config import model_from_config, parse_json, read_text
from kvplan.sources.hf_config.layout import LAYER_CUTS
from kvplan.sources.hf_config.mamba import is_mamba_ssm_config, mamba_ssm_fields

LAYER_COUNT_FIELDS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "num_blocks",
                      "decoder_layers", "num_decoder_layers")  # an encoder-decoder's decoder (BART, ProphetNet)
# Fields with one entry per layer (lists) or one character per layer (strings), cut with the layers. Besides
# these, any list as long as the model is deep whose name says "layer" or "types" (mlp_layer_types, indexer_types,
# num_attention_heads_per_layer: transformers' config classes check their length against num_hidden_layers).
PER_LAYER_FIELDS = ("layer_types", "no_rope_layers", "block_configs", "hybrid_override_pattern",
                    "kv_sharing_modes", "swa_layers", "intermediate_size", "activation_sparsity_pattern")
# Fields listing layer indices: indices past the cut are dropped.
LAYER_INDEX_FIELDS = ("mlp_only_layers", "attn_layer_indices", "hybrid_layer_ids", "full_attn_idxs",
                      "cross_attention_layers")
# Fields listing layers counted from 1 (Qwen4-Exp's ple_layer_ids): ids past the cut are dropped.
LAYER_ID_FIELDS = ("ple_layer_ids",)
# Counts of leading layers, which cannot exceed the layers kept (DeepSeek's dense layers before the MoE ones).
LAYER_COUNT_BOUNDS = ("first_k_dense_replace",)
# Counts of trailing layers (Gemma 3n and Gemma 4's KV-shared layers): a cut keeps those among the layers kept.
LAYER_TAIL_COUNTS = ("num_kv_shared_layers",)
# Not architecture: loading, provenance, remote code. quantization_config is dropped with a note.
DROPPED_FIELDS = ("quantization_config", "auto_map", "_name_or_path", "transformers_version", "torch_dtype",
                  "dtype", "architectures")
LEGACY_FALCON = {"RefinedWeb": True, "RefinedWebModel": False}  # model_type -> new_decoder_architecture


@dataclass(frozen=True)
class Source:
    """A model to profile: its config.json data as read, and the ModelSpec kvplan reads from it."""

    name: str
    config: dict
    spec: ModelSpec
    file: Path


def resolve(name: str, revision: str | None = None, token: str | None = None) -> Source:
    """`--model` as every kvplan command takes it (`load_model`), plus the config.json file it came from: the
    local file, the bundled library's copy, or the Hub's, from the cache `load_model` filled."""
    path = Path(name).expanduser()
    if path.exists() and path.suffix.lower() in (".yaml", ".yml"):
        raise KvplanError(f"{path}: a YAML spec describes caches, not a transformers architecture, so there "
                          "is no model class to build: profile a config.json, a directory holding one, or a "
                          "bundled model")
    if path.exists() and path.suffix.lower() == ".gguf":
        raise KvplanError(f"{path}: profile builds the model with transformers from its config.json, not from a "
                          "GGUF file: profile the original model's config.json")
    spec = load_model(name, revision, token) if revision or token else load_model(name)
    entry = library.find(name)
    if path.exists():
        file = path / "config.json" if path.is_dir() else path
    elif entry is not None and not revision:
        file = library.config_path(entry)
    else:
        file = _hub_config(entry.id if entry is not None else name.strip(), revision, name)
    return Source(name=spec.name, config=parse_json(read_text(file), str(file)), spec=spec, file=file)


def _hub_config(repo_id: str, revision: str | None, name: str) -> Path:
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(repo_id, "config.json", revision=revision)
    except Exception:  # an id huggingface_hub refuses, a cache it cannot read
        cached = None
    if not isinstance(cached, str):
        raise KvplanError(f"profile needs {name}'s config.json: give a path to it, a directory holding it, "
                          "or a bundled model name")
    return Path(cached)


def decoder_fields(data: dict) -> dict:
    """The dict that describes the decoder: text_config when the config nests one (Gemma 3, Llama 4), the
    decoder's own config when an encoder-decoder nests its stacks (T5Gemma, MusicGen)."""
    nested = data.get("text_config", data.get("decoder"))
    return nested if isinstance(nested, dict) else data


def first_layers(source: Source, layers: int | None) -> tuple[dict, ModelSpec]:
    """The config data and ModelSpec of the model's first `layers` layers (all of them for None), as built
    (`as_built`).

    Embeddings, final norm and lm_head stay whole; per-layer fields are cut; layouts stated by rule (Gemma's
    sliding_window_pattern, Jamba's attn_layer_period, DeepSeek's first_k_dense_replace) keep their meaning,
    since a layer's type depends on its index only. The cut spec is read back from the cut data, so weights
    are predicted for exactly the layers built, and it must equal the full spec's first layers."""
    data = copy.deepcopy(source.config)
    total = source.spec.num_layers
    if layers is None or layers == total:
        return data, as_built(source.spec, data)
    if not 1 <= layers <= total:
        raise KvplanError(f"--layers must be between 1 and {source.name}'s {total} layers, got {layers}")
    decoder = decoder_fields(data)
    model_type = str(decoder.get("model_type") or data.get("model_type") or "")
    if model_type in LAYER_CUTS:  # a layer count stated in more than one field (HRM)
        LAYER_CUTS[model_type](decoder, layers)
    else:
        counted = [field for field in LAYER_COUNT_FIELDS if field in decoder]
        for field in counted or ["num_hidden_layers"]:
            decoder[field] = layers
    _cut_per_layer_fields(decoder, total, layers)
    spec = model_from_config(data, source.spec.name, source.spec.source, where=str(source.file))
    if spec.caches != tuple(c for c in source.spec.caches if c.layer < layers):
        raise KvplanError(f"cutting {source.name} to {layers} layers changed the layout of the layers kept: "
                          "profile it whole (no --layers)")
    return data, as_built(spec, data)


def _cut_per_layer_fields(decoder: dict, total: int, layers: int) -> None:
    """Cut every per-layer field of the decoder config to its first `layers` layers (in place)."""
    for field, value in decoder.items():
        if field in LAYER_COUNT_BOUNDS and isinstance(value, int) and not isinstance(value, bool):
            decoder[field] = min(value, layers)
        elif field in LAYER_TAIL_COUNTS and isinstance(value, int) and not isinstance(value, bool):
            decoder[field] = max(0, value - (total - layers))
        elif field in LAYER_INDEX_FIELDS and isinstance(value, list):
            decoder[field] = [i for i in value if isinstance(i, int) and i < layers]
        elif field in LAYER_ID_FIELDS and isinstance(value, list):
            decoder[field] = [i for i in value if isinstance(i, int) and i <= layers]
        elif field in PER_LAYER_FIELDS and isinstance(value, (list, str)) or (
                isinstance(value, list) and len(value) == total and ("layer" in field or field.endswith("types"))):
            decoder[field] = value[:layers]
        elif field.startswith("per_layer") and isinstance(value, dict):  # {"11": {...}}: overrides by layer index
            decoder[field] = {k: v for k, v in value.items() if not str(k).isdigit() or int(k) < layers}


def _layer_signatures(spec: ModelSpec) -> list[str]:
    """What each layer caches, as a comparable value (its index left out)."""
    by_layer: dict[int, list] = {}
    for cache in spec.caches:
        by_layer.setdefault(cache.layer, []).append(repr(sorted(cache.model_dump(exclude={"layer"}).items())))
    return [repr(sorted(by_layer.get(i, []))) for i in range(spec.num_layers)]


def representative_layers(spec: ModelSpec, minimum: int = 1) -> int | None:
    """The fewest first layers, at least `minimum`, that hold every kind of layer the model has (None: all)."""
    signatures = _layer_signatures(spec)
    kinds, seen = set(signatures), set()
    for index, signature in enumerate(signatures):
        seen.add(signature)
        if seen >= kinds and index + 1 >= minimum:
            return index + 1 if index + 1 < spec.num_layers else None
    return None


def kinds_left_out(spec: ModelSpec, layers: int) -> list[str]:
    """The layer kinds (kvplan's labels) of the whole model that its first `layers` layers do not have."""
    kept = {kind_label(c) for c in spec.caches if c.layer < layers}
    return list(dict.fromkeys(kind_label(c) for c in spec.caches if kind_label(c) not in kept))


def as_built(spec: ModelSpec, data: dict) -> ModelSpec:
    """The spec of what the profiler builds: for a config that nests a text_config, the text decoder alone
    (`transformers_fields`), so the vision tower leaves the predicted weights too; a causal-LM class that builds its
    own towers (GIT, Phi-4-multimodal) keeps them."""
    if not isinstance(data.get("text_config"), dict):
        return spec
    return spec.model_copy(update={"params": spec.params.model_copy(update={"vision": 0})})


def transformers_fields(data: dict) -> tuple[str, dict, list[str]]:
    """(model_type, config fields, notes) for transformers' own config class of this model's decoder.

    Multimodal configs give their text decoder (the tower is not built); weight quantisation is dropped (random
    weights are made in the profile dtype); legacy Falcon configs (RefinedWeb*) are renamed to FalconConfig's
    fields; mamba_ssm's own configs (state-spaces/mamba*) become transformers' Mamba or Mamba-2 fields. Nothing here
    enables remote code: auto_map is dropped and only transformers' own classes are used."""
    data = copy.deepcopy(data)
    notes = []
    quant = data.get("quantization_config")
    text = data.get("text_config")
    if isinstance(text, dict):
        text = dict(text)
        for key in ("tie_word_embeddings", "quantization_config"):
            if key not in text and key in data:
                text[key] = data[key]
        text.setdefault("model_type", f"{data.get('model_type', '')}_text")
        notes.append("text decoder only (text_config): the vision/audio tower is not built")
        data, quant = text, text.get("quantization_config", quant)
    if isinstance(quant, dict):
        method = quant.get("quant_method") or quant.get("method") or "quantised"
        notes.append(f"{method} weight quantisation dropped: random weights are made in the profile dtype")
    if is_mamba_ssm_config(data):
        data = mamba_ssm_fields(data, "config.json")
        notes.append(f"mamba_ssm config read as transformers' {data['model_type']}, as its converter maps it")
    model_type = str(data.pop("model_type", "") or "")
    if model_type in LEGACY_FALCON:
        data.setdefault("new_decoder_architecture", LEGACY_FALCON[model_type])
        for old, new in (("n_layer", "num_hidden_layers"), ("n_head", "num_attention_heads"),
                         ("n_head_kv", "num_kv_heads")):
            if old in data:
                data.setdefault(new, data.pop(old))
        notes.append(f"legacy Falcon config ({model_type}) read as transformers' falcon")
        model_type = "falcon"
    for key in DROPPED_FIELDS:
        data.pop(key, None)
    if not model_type:
        raise KvplanError("the config has no model_type: transformers cannot tell which model class to build")
    return model_type, data, notes
