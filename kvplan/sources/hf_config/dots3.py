"""dots3 (`dots3_note_text`, the decoder of `dots3_note`): multi-head latent attention on every layer, with a
DeepSeek Sparse Attention indexer on its "indexed_attention" layers and a sliding window on its
"sliding_attention" layers, whose attention has a shape of its own (`per_layer_config`). Registered in
`FAMILY_LAYOUTS` and `FAMILY_PARAMS`; every rule follows transformers 5.23's
`models/dots3_note/configuration_dots3_note.py` and `modeling_dots3_note.py`.

What a sequence keeps, layer by layer (`DynamicCache`; `Dots3NoteTextAttention` caches k_pass and k_rot):
    indexed_attention  the latent (kv_lora_rank) and the rotary key (qk_rope_head_dim), one head, for every token,
                       and the indexer's key (index_head_dim) for every token (`DynamicIndexedLayer`)
    full_attention     the latent and rotary key for every token (configs with use_dsa false)
    sliding_attention  the latent and rotary key of its own shape for the last sliding_window tokens
                       (`DynamicSlidingWindowLayer`)

A layer's attention shape is the global config's fields overridden by its `per_layer_config` entry (transformers
`HeterogeneousConfigMixin`: {layer index: {field: value}}, the layers that differ). Configs in the released
checkpoint's format have no per_layer_config: the config class builds it from the swa_* fields for every sliding
layer, and names the DSA layers "full_attention" (use_dsa, default true, renames them).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.errors import KvplanError
from kvplan.model import IndexerKeys, LayerCache, MLALatent, ParamCounts, Widths
from kvplan.sources.hf_config.fields import Fields
from kvplan.sources.hf_config.layout import FAMILY_LAYOUTS, Layout
from kvplan.sources.hf_config.params import FAMILY_PARAMS, FAMILY_WIDTHS, stated_dense_layers

DOTS3 = "dots3_note_text"
DOTS3_LAYER_TYPES = ("indexed_attention", "full_attention", "sliding_attention")
# The fields a per_layer_config entry may override: the attention's shape and window, its indexer's, and two that
# change neither cache nor weights (head_dim sizes RoPE only, index_topk how many tokens the indexer picks).
DOTS3_PER_LAYER_FIELDS = ("num_attention_heads", "num_key_value_heads", "q_lora_rank", "kv_lora_rank",
                          "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "head_dim", "sliding_window",
                          "attention_bias", "index_n_heads", "index_head_dim", "index_topk")
# The released checkpoint's sliding-layer fields and the config class's defaults for them (swa_qk_rope_head_dim
# defaults to swa_head_dim - swa_qk_nope_head_dim).
SWA_DEFAULTS = {"num_attention_heads": 64, "num_key_value_heads": 64, "q_lora_rank": 1024, "kv_lora_rank": 1024,
                "head_dim": 256, "qk_nope_head_dim": 192, "v_head_dim": 128}


@dataclass(frozen=True)
class Dots3Layer:
    """One decoder layer's attention: its type and the fields of its config (global, with its overrides)."""

    type: str
    fields: Fields

    def int(self, name: str) -> int:
        return self.fields.int(name)


def dots3_layer_types(cfg: Fields, n: int) -> list[str]:
    """`layer_types`, else the config class's default: layers 0, 1 and i % 4 == 1 DSA, the others sliding (all
    DSA with use_sliding_window false). use_dsa, when given or when the config has no per_layer_config (the
    released format), turns full_attention layers into indexed_attention ones (false: the reverse)."""
    use_dsa = cfg.data.get("use_dsa", None if "per_layer_config" in cfg.data else True)
    if use_dsa is not None and not isinstance(use_dsa, bool):
        raise KvplanError(f"{cfg.where}: field use_dsa must be true or false, got {use_dsa!r}")
    if cfg.has("layer_types"):
        types = list(cfg.list("layer_types", str, length=n))
    else:
        full = "full_attention" if use_dsa is False else "indexed_attention"
        sliding = cfg.flag("use_sliding_window", default=True)
        types = [full if not sliding or i < 2 or i % 4 == 1 else "sliding_attention" for i in range(n)]
    unknown = sorted(set(types) - set(DOTS3_LAYER_TYPES))
    if unknown:
        raise KvplanError(f"{cfg.where}: field layer_types holds {', '.join(map(repr, unknown))}; dots3 layers are "
                          f"{', '.join(DOTS3_LAYER_TYPES)}")
    if use_dsa is not None:
        old, new = ("full_attention", "indexed_attention") if use_dsa else ("indexed_attention", "full_attention")
        types = [new if t == old else t for t in types]
    return types


def _per_layer_overrides(cfg: Fields, types: list[str]) -> dict[int, dict]:
    """{layer: {field: value}} from per_layer_config (keys are layer indices, "05" or 5), or, for a config in the
    released format, the swa_* fields on every sliding layer."""
    n = len(types)
    if "per_layer_config" not in cfg.data:
        swa = {name: cfg.int(f"swa_{name}", default=default) for name, default in SWA_DEFAULTS.items()}
        swa["qk_rope_head_dim"] = cfg.int("swa_qk_rope_head_dim", default=swa["head_dim"] - swa["qk_nope_head_dim"],
                                          minimum=0)
        return {i: swa for i, t in enumerate(types) if t == "sliding_attention"}
    return cfg.per_layer("per_layer_config", n, DOTS3_PER_LAYER_FIELDS)


def dots3_layers(cfg: Fields, n: int) -> list[Dots3Layer]:
    """Each layer's attention config. The global sliding window is sliding_window, else the released format's
    sliding_window_size, else 512 (`Dots3NoteTextConfig.__post_init__`)."""
    types = dots3_layer_types(cfg, n)
    overrides = _per_layer_overrides(cfg, types)
    base = {**cfg.data, "sliding_window": cfg.int("sliding_window", "sliding_window_size", default=512)}
    layers = []
    for i, layer_type in enumerate(types):
        fields = Fields({**base, **overrides.get(i, {})}, f"{cfg.where} (layer {i})")
        if fields.data.get("q_lora_rank") is None:
            raise KvplanError(f"{fields.where}: missing field q_lora_rank: dots3's attention projects its queries "
                              "through a latent")
        layers.append(Dots3Layer(layer_type, fields))
    first_of_type: dict[str, int] = {}
    for i, layer in enumerate(layers):  # transformers reads one config per type (rotary tables, validation)
        first = first_of_type.setdefault(layer.type, i)
        if _shape(layer) != _shape(layers[first]):
            raise KvplanError(f"{cfg.where}: field per_layer_config gives layer {i} another attention shape than "
                              f"layer {first}, though both are {layer.type}: dots3 layers of one type share one")
    return layers


def _shape(layer: Dots3Layer) -> tuple:
    return tuple(layer.fields.data.get(name) for name in DOTS3_PER_LAYER_FIELDS)


def dots3_layout(cfg: Fields, n: int, hidden: int, heads: int, notes: list[str]) -> Layout:
    layers = dots3_layers(cfg, n)
    caches: list[LayerCache] = []
    for i, layer in enumerate(layers):
        latent = {"latent_dim": layer.int("kv_lora_rank"), "rope_dim": layer.fields.int("qk_rope_head_dim", minimum=0)}
        if layer.type == "sliding_attention":
            caches.append(MLALatent(layer=i, window=layer.int("sliding_window"), **latent))
        else:
            caches.append(MLALatent(layer=i, **latent))
        if layer.type == "indexed_attention":
            caches.append(IndexerKeys(layer=i, head_dim=layer.int("index_head_dim")))
    return Layout(types=[layer.type for layer in layers], caches=caches,
                  head_dim=cfg.int("qk_nope_head_dim") + cfg.int("qk_rope_head_dim", minimum=0))


def dots3_dense_layers(cfg: Fields, n: int) -> set[int]:
    """Layers with a dense MLP: `mlp_layer_types`, else the config class's rule: the first first_k_dense_replace
    (default 1), and those moe_layer_freq leaves out (an interval, default 1, or a 0/1 flag per layer)."""
    stated = stated_dense_layers(cfg, n)
    if stated is not None:
        return stated
    first = cfg.int("first_k_dense_replace", default=1, minimum=0)
    if isinstance(cfg.data.get("moe_layer_freq"), list):
        sparse = [bool(flag) for flag in cfg.list("moe_layer_freq", int, length=n)]
    else:
        freq = cfg.int("moe_layer_freq", default=1)
        sparse = [i % freq == 0 for i in range(n)]
    return {i for i in range(n) if i < first or not sparse[i]}


def _attention_params(layer: Dots3Layer, hidden: int) -> dict[str, int]:
    """One layer's attention (`Dots3NoteTextAttention`) by parameter group: q_a_proj to q_lora_rank, its norm,
    q_b_proj to heads x (nope + rope); kv_a_proj_with_mqa to the latent and the rotary key, the latent's norm,
    kv_b_proj to heads x (nope + v); o_proj; the rotary key's own norm (k_rope_only_layernorm); g_proj, one output
    gate per head; biases on q_a, kv_a and o with attention_bias. An indexed layer adds its indexer
    (`Dots3NoteTextIndexer`): wq_b from the query latent to index_n_heads x index_head_dim, wk to one key,
    weights_proj to one weight per head, and k_norm, a LayerNorm.
    vLLM (`models/dots3_note`) builds it on DeepSeek-V3.2's MLA and indexer: q_a and kv_a (fused_qkv_a_proj), the
    norms, the indexer and the biases of q_a and kv_a are whole on every TP rank; q_b, kv_b, o and g_proj split by
    head."""
    heads, q_rank, latent = layer.int("num_attention_heads"), layer.int("q_lora_rank"), layer.int("kv_lora_rank")
    nope, v = layer.int("qk_nope_head_dim"), layer.int("v_head_dim")
    rope = layer.fields.int("qk_rope_head_dim", minimum=0)
    groups = {"attention": q_rank * heads * (nope + rope) + latent * heads * (nope + v) + heads * v * hidden
              + hidden * heads, "attention_replicated": hidden * q_rank + hidden * (latent + rope),
              "other_replicated": q_rank + latent + rope, "other": 0}
    if layer.fields.flag("attention_bias"):
        groups["other_replicated"] += q_rank + latent + rope
        groups["other"] += hidden
    if layer.type == "indexed_attention":
        index_heads, index_dim = layer.int("index_n_heads"), layer.int("index_head_dim")
        groups["attention_replicated"] += q_rank * index_heads * index_dim + hidden * index_dim
        groups["other_replicated"] += hidden * index_heads + 2 * index_dim
    return groups


def dots3_params(cfg: Fields, layout: Layout, hidden: int, heads: int) -> ParamCounts:
    """`Dots3NoteForCausalLM`: embeddings and the output projection (untied by default), a final norm, and per
    layer two norms, its attention (`_attention_params`) and a dense gated MLP of intermediate_size or an MoE
    block: n_routed_experts gated experts of moe_intermediate_size, a router with one weight row and one
    correction bias per expert (`e_score_correction_bias`, which checkpoints store), and n_shared_experts shared
    experts as one gated MLP of n_shared_experts x shared_experts_intermediate_size (the released format says
    moe_shared_expert_intermediate_size). Every MLP reads the global config."""
    layers = dots3_layers(cfg, len(layout.types))
    vocab = cfg.int("vocab_size")
    dense = dots3_dense_layers(cfg, len(layers))
    experts, top_k = cfg.int("n_routed_experts", "num_local_experts"), cfg.int("num_experts_per_tok")
    expert = 3 * hidden * cfg.int("moe_intermediate_size")
    shared = cfg.int("n_shared_experts") * cfg.int("moe_shared_expert_intermediate_size",
                                                   "shared_experts_intermediate_size")
    totals = {"attention": 0, "attention_replicated": 0, "mlp": 0, "experts": 0, "active_experts": 0, "other": 0,
              "other_replicated": hidden}  # final norm
    for i, layer in enumerate(layers):
        for group, count in _attention_params(layer, hidden).items():
            totals[group] += count
        totals["other_replicated"] += 2 * hidden
        if i in dense:
            totals["mlp"] += 3 * hidden * cfg.int("intermediate_size")
        else:
            totals["experts"] += experts * expert
            totals["active_experts"] += top_k * expert
            totals["mlp"] += 3 * hidden * shared
            totals["other_replicated"] += experts * hidden + experts  # the router
    tied = cfg.flag("tie_word_embeddings")
    return ParamCounts(embedding=vocab * hidden, lm_head=0 if tied else vocab * hidden, **totals)


def dots3_widths(cfg: Fields, hidden: int, layout: Layout) -> Widths:
    """The dense MLP's width where a layer has one, else the shared experts'; the routed experts'."""
    dense = dots3_dense_layers(cfg, len(layout.types))
    shared = cfg.int("n_shared_experts") * cfg.int("moe_shared_expert_intermediate_size",
                                                   "shared_experts_intermediate_size")
    sparse = len(dense) < len(layout.types)
    return Widths(hidden=hidden, mlp_intermediate=max(cfg.int("intermediate_size") if dense else 0,
                                                      shared if sparse else 0),
                  mlp_activation=str(cfg.get("hidden_act", default="silu")),
                  experts_per_token=cfg.int("num_experts_per_tok") if sparse else 0,
                  experts=cfg.int("n_routed_experts", "num_local_experts") if sparse else 0,
                  expert_intermediate=cfg.int("moe_intermediate_size") if sparse else 0)


FAMILY_LAYOUTS[DOTS3] = dots3_layout
FAMILY_PARAMS[DOTS3] = dots3_params
FAMILY_WIDTHS[DOTS3] = dots3_widths
