"""Gemma 3n, Gemma 4 and RecurrentGemma: decoders whose layers no shared rule lays out or counts, registered in
`FAMILY_LAYOUTS`, `FAMILY_PARAMS` and `FAMILY_WIDTHS`. Everything here follows transformers 5.23's configuration and
modeling files of these families (models/gemma3n, gemma4, gemma4_unified, gemma4_assistant,
gemma4_unified_assistant, recurrent_gemma).

Gemma 3n and Gemma 4 (`num_kv_shared_layers`): the last N layers compute no keys or values; each reads those of
the last unshared layer of its own type (sliding or full) and caches nothing (transformers `kv_sharing_modes`
"reuse", a `DummyLayer` in the cache; vLLM `kv_sharing_target_layer_name`). Gemma 4 gives its full-attention
layers their own head size and KV heads (`global_head_dim`, `num_global_key_value_heads`, or `per_layer_config`),
and with `attention_k_eq_v` they have no v_proj: the value is the key projection before k_norm and RoPE, so keys
and values are both cached. A Gemma 4 assistant (drafter) runs every layer on its target model's cache.

RecurrentGemma (Griffin): `block_types` repeats over the layers; "recurrent" blocks are RG-LRU mixers (a
short convolution and a diagonal linear recurrence), "attention" blocks local attention over
`attention_window_size` tokens.
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

from kvplan.errors import KvplanError
from kvplan.model import FullAttention, NoCache, ParamCounts, RecurrentState, SharedKV, SlidingWindow, Widths
from kvplan.sources.hf_config.fields import Fields
from kvplan.sources.hf_config.layout import FAMILY_LAYOUTS, Layout, read_kv_heads
from kvplan.sources.hf_config.params import FAMILY_PARAMS, FAMILY_WIDTHS, experts_per_token

GEMMA_3N = "gemma3n_text"
GEMMA_4 = ("gemma4_text", "gemma4_unified_text")
ASSISTANTS = ("gemma4_assistant", "gemma4_unified_assistant")
ATTENTION_TYPES = ("sliding_attention", "full_attention")
PER_LAYER_OVERRIDES = ("head_dim", "num_key_value_heads")  # the per_layer_config fields kvplan reads


# ------------------------------------------------------------------------------------ Gemma 3n and Gemma 4


class GemmaLayer(NamedTuple):
    """One decoder layer: its attention type, KV heads and head size (queries use the same head size), whether
    it reads keys and values computed elsewhere, and the layer of this model it reads them from (None for an
    assistant, which reads its target model's)."""

    type: str
    kv_heads: int
    head_dim: int
    shared: bool = False
    source: int | None = None

    @property
    def sliding(self) -> bool:
        return self.type == "sliding_attention"


def gemma_layers(cfg: Fields, model_type: str, n: int, notes: list[str]) -> list[GemmaLayer]:
    types = _layer_types(cfg, model_type, n, notes)
    shapes = _attention_shapes(cfg, model_type, types)
    sources = _shared_sources(cfg, model_type, types)
    assistant = model_type in ASSISTANTS
    return [GemmaLayer(t, kv, hd, shared=assistant or src is not None, source=src)
            for t, (kv, hd), src in zip(types, shapes, sources, strict=True)]


def _layer_types(cfg: Fields, model_type: str, n: int, notes: list[str]) -> list[str]:
    """`layer_types`, or transformers' default: Gemma 3n every 5th layer full, Gemma 4 every 6th. Gemma 4 forces
    its last layer to full attention (`Gemma4TextConfig.__post_init__`)."""
    if cfg.has("layer_types"):
        types = list(cfg.list("layer_types", str, length=n))
    else:
        period = 5 if model_type == GEMMA_3N else 6
        types = ["full_attention" if (i + 1) % period == 0 else "sliding_attention" for i in range(n)]
    unknown = sorted(set(types) - set(ATTENTION_TYPES))
    if unknown:
        raise KvplanError(f"{cfg.where}: field layer_types holds {unknown}; {model_type} layers are "
                          "sliding_attention or full_attention")
    if model_type != GEMMA_3N and types[-1] != "full_attention":
        notes.append("the last layer is full attention whatever layer_types says (transformers forces it)")
        types[-1] = "full_attention"
    return types


def _attention_shapes(cfg: Fields, model_type: str, types: list[str]) -> list[tuple[int, int]]:
    """(KV heads, head size) of each layer. Gemma 3n: one shape. Gemma 4: `per_layer_config` overrides by layer
    index when the config has it; otherwise full layers take global_head_dim (512 by default) and, with
    attention_k_eq_v, num_global_key_value_heads (`Gemma4TextConfig.__post_init__`)."""
    n = len(types)
    if model_type == GEMMA_3N:
        return [(cfg.int("num_key_value_heads"), cfg.int("head_dim"))] * n
    overrides = cfg.per_layer("per_layer_config", n, PER_LAYER_OVERRIDES) if cfg.has("per_layer_config") else {
        i: _global_overrides(cfg) for i, t in enumerate(types) if t == "full_attention"}
    shapes = []
    for i in range(n):
        values = []
        for field in ("num_key_value_heads", "head_dim"):
            value = overrides.get(i, {}).get(field, cfg.data.get(field))
            if value is None:
                raise KvplanError(f"{cfg.where}: field {field} is missing for layer {i}: per_layer_config does "
                                  "not give it and the config sets no global value")
            values.append(Fields({field: value}, f"{cfg.where} layer {i}").int(field))
        shapes.append((values[0], values[1]))
    return shapes


def _global_overrides(cfg: Fields) -> dict:
    override = {"head_dim": cfg.int("global_head_dim")}
    if cfg.flag("attention_k_eq_v") and cfg.has("num_global_key_value_heads"):
        override["num_key_value_heads"] = cfg.int("num_global_key_value_heads")
    return override


def _shared_sources(cfg: Fields, model_type: str, types: list[str]) -> list[int | None]:
    """For each layer, the layer whose keys and values it reads (None: it computes its own): the last
    num_kv_shared_layers layers each read the last unshared layer of their type (`kv_sharing_modes`)."""
    n = len(types)
    shared = cfg.int("num_kv_shared_layers", default=0, minimum=0)
    if model_type in ASSISTANTS:
        if shared not in (0, n):  # Gemma4AssistantConfig sets 0 to n and validates that every layer is shared
            raise KvplanError(f"{cfg.where}: field num_kv_shared_layers is {shared}: a Gemma 4 assistant reads "
                              f"its target model's cache on all of its {n} layers")
        return [None] * n
    if shared > n:
        raise KvplanError(f"{cfg.where}: field num_kv_shared_layers is {shared:,}, more than the {n} layers")
    first = n - shared
    last_unshared = {kind: j for j, kind in enumerate(types[:first])}  # by type, the last one before `first`
    sources: list[int | None] = [None] * first
    for i in range(first, n):
        if types[i] not in last_unshared:
            raise KvplanError(f"{cfg.where}: field num_kv_shared_layers is {shared}: layer {i} ({types[i]}) has no "
                              f"unshared layer of its type before layer {first} to read")
        sources.append(last_unshared[types[i]])
    return sources


def _window(cfg: Fields) -> int:
    """The sliding window; Gemma 4 with use_bidirectional_attention "all" halves it plus one (its exclusive
    bound, `Gemma4TextConfig.__post_init__`)."""
    window = cfg.int("sliding_window")
    return window // 2 + 1 if cfg.get("use_bidirectional_attention", default=None) == "all" else window


def gemma_layout(cfg: Fields, n: int, hidden: int, heads: int, notes: list[str], model_type: str) -> Layout:
    layers = gemma_layers(cfg, model_type, n, notes)
    caches = []
    for i, layer in enumerate(layers):
        shape = {"kv_heads": layer.kv_heads, "head_dim": layer.head_dim, "head_dim_v": layer.head_dim}
        if model_type in ASSISTANTS:
            caches.append(NoCache(layer=i, reason="reads its target model's K,V (a drafter's layers cache nothing)"))
        elif layer.shared:
            caches.append(SharedKV(layer=i, source=layer.source))
        elif layer.sliding:
            caches.append(SlidingWindow(layer=i, window=_window(cfg), **shape))
        else:
            caches.append(FullAttention(layer=i, **shape))
    return Layout(types=[layer.type for layer in layers], caches=caches, head_dim=cfg.int("head_dim"))


def _attention_params(cfg: Fields, layer: GemmaLayer, hidden: int, heads: int, k_eq_v: bool) -> dict[str, int]:
    """A Gemma 3n / Gemma 4 attention by parameter group: q_proj, o_proj and a per-head q_norm; a layer that
    computes its own keys adds k_proj, k_norm and v_proj (none on attention_k_eq_v full layers); v_norm has no
    weight. Biases with attention_bias."""
    q = heads * layer.head_dim
    kv = 0 if layer.shared else layer.kv_heads * layer.head_dim
    v = 0 if k_eq_v and not layer.sliding else kv
    return {"attention": hidden * (q + kv + v) + q * hidden,
            "other": q + kv + v + hidden if cfg.flag("attention_bias") else 0,
            "other_replicated": layer.head_dim + (layer.head_dim if kv else 0)}


def gemma_params(cfg: Fields, layout: Layout, hidden: int, heads: int, model_type: str) -> ParamCounts:
    """Gemma 3n (`Gemma3nForCausalLM`) and Gemma 4 (`Gemma4ForCausalLM`, `Gemma4UnifiedForCausalLM`, the
    assistants' `Gemma4AssistantForCausalLM`), block by block:
        embeddings   vocab x hidden, and the per-layer embeddings (PLE) vocab_size_per_layer_input x
                     (layers x hidden_size_per_layer_input) with their projection hidden x (layers x PLE width)
                     and its norm
        per layer    attention (`_attention_params`); a gated MLP of intermediate_size (a list on Gemma 3n; twice
                     as wide on Gemma 4's KV-shared layers with use_double_wide_mlp); four norms; with PLE an
                     input gate hidden x PLE width, a projection back and a norm
        Gemma 3n     AltUp per layer (a hidden-sized output scale, A x A correction and A x A^2 prediction
                     coefficients, a hidden x A router and its norm, A = altup_num_inputs) and 2 x (A - 1)
                     hidden x hidden projections in and out of the A streams; LAuReL per layer (hidden x rank,
                     rank x hidden, a norm)
        Gemma 4 MoE  (enable_moe_block) beside the MLP: experts (gate_up, down: 3 x hidden x
                     moe_intermediate_size each), a router (hidden x experts, a hidden scale, a scale per expert)
                     and three more norms
        assistants   pre_projection 2 x backbone_hidden_size x hidden, post_projection hidden x backbone, and
                     the centroids hidden x num_centroids with use_ordered_embeddings
    The per-layer `layer_scalar` and the assistants' token ordering are buffers, not parameters. Norms, AltUp's
    coefficients and router, and the MoE router act on the whole hidden state: every TP rank holds them
    (`other_replicated`)."""
    layers = gemma_layers(cfg, model_type, len(layout.types), [])
    n = len(layers)
    vocab = cfg.int("vocab_size")
    ple = cfg.int("hidden_size_per_layer_input", default=0, minimum=0)
    embedding = vocab * hidden
    totals = {"attention": 0, "mlp": 0, "experts": 0, "active_experts": 0, "other": 0,
              "other_replicated": hidden}  # final norm
    if ple:
        embedding += cfg.int("vocab_size_per_layer_input") * n * ple
        totals["mlp"] += hidden * n * ple
        totals["other_replicated"] += ple
    k_eq_v = cfg.flag("attention_k_eq_v")
    moe = cfg.flag("enable_moe_block")
    for layer, width in zip(layers, mlp_widths(cfg, model_type, layers), strict=True):
        for group, count in _attention_params(cfg, layer, hidden, heads, k_eq_v).items():
            totals[group] += count
        totals["other_replicated"] += 4 * hidden
        totals["mlp"] += 3 * hidden * width
        if ple:
            totals["mlp"] += 2 * hidden * ple
            totals["other_replicated"] += hidden
        if model_type == GEMMA_3N:
            streams, rank = cfg.int("altup_num_inputs"), cfg.int("laurel_rank")
            totals["other_replicated"] += hidden + streams**2 + streams**3 + hidden * streams + hidden
            totals["mlp"] += 2 * hidden * rank
            totals["other_replicated"] += hidden
        if moe:
            experts = cfg.int("num_experts")
            top_k = experts_per_token(cfg, experts, "top_k_experts")
            expert = 3 * hidden * cfg.int("moe_intermediate_size", "expert_intermediate_size")
            totals["experts"] += experts * expert
            totals["active_experts"] += top_k * expert
            totals["other_replicated"] += hidden * experts + hidden + experts + 3 * hidden
    if model_type == GEMMA_3N:
        totals["mlp"] += 2 * (cfg.int("altup_num_inputs") - 1) * hidden * hidden
    if model_type in ASSISTANTS:
        backbone = cfg.int("backbone_hidden_size")
        totals["mlp"] += 3 * backbone * hidden
        if cfg.flag("use_ordered_embeddings"):
            totals["mlp"] += hidden * cfg.int("num_centroids")
    tied = cfg.flag("tie_word_embeddings", default=True)
    return ParamCounts(embedding=embedding, lm_head=0 if tied else vocab * hidden, **totals)


def mlp_widths(cfg: Fields, model_type: str, layers: list[GemmaLayer]) -> list[int]:
    """Each layer's MLP width: Gemma 3n's intermediate_size may list one per layer; Gemma 4 doubles it on
    KV-shared layers with use_double_wide_mlp (`Gemma4TextMLP`)."""
    if model_type == GEMMA_3N and isinstance(cfg.data.get("intermediate_size"), list):
        return [Fields({"intermediate_size": width}, cfg.where).int("intermediate_size")
                for width in cfg.list("intermediate_size", int, length=len(layers))]
    width = cfg.int("intermediate_size")
    double = model_type != GEMMA_3N and cfg.flag("use_double_wide_mlp")
    return [2 * width if double and layer.shared else width for layer in layers]


def gemma_widths(cfg: Fields, hidden: int, layout: Layout, model_type: str) -> Widths:
    layers = gemma_layers(cfg, model_type, len(layout.types), [])
    moe = cfg.flag("enable_moe_block")
    return Widths(hidden=hidden, mlp_intermediate=max(mlp_widths(cfg, model_type, layers)),
                  mlp_activation=str(cfg.get("hidden_activation", default="gelu_pytorch_tanh")),
                  experts_per_token=cfg.int("top_k_experts") if moe else 0,
                  experts=cfg.int("num_experts") if moe else 0,
                  expert_intermediate=cfg.int("moe_intermediate_size", "expert_intermediate_size") if moe else 0)


# ------------------------------------------------------------------------------------------ RecurrentGemma


def _blocks(cfg: Fields, n: int) -> list[str]:
    """`block_types` repeated over the layers (`RecurrentGemmaConfig.layers_block_type`)."""
    pattern = cfg.list("block_types", str)
    if not pattern or set(pattern) - {"recurrent", "attention"}:
        raise KvplanError(f"{cfg.where}: field block_types must list \"recurrent\" and \"attention\" blocks")
    return [pattern[i % len(pattern)] for i in range(n)]


def rg_lru_state(cfg: Fields, layer: int, hidden: int) -> RecurrentState:
    """An RG-LRU block's state per sequence (`RecurrentGemmaRecurrentBlock`): the convolution's last
    conv1d_width - 1 inputs of lru_width channels, in the model dtype, and the recurrence's lru_width-wide
    state, kept in fp32 ("always computed in full precision")."""
    width, kernel = cfg.int("lru_width", default=hidden), cfg.int("conv1d_width")
    return RecurrentState(layer=layer, mixer="rg_lru", conv_elements=width * (kernel - 1), ssm_elements=width,
                          ssm_dtype="fp32", conv_kernel=kernel if kernel > 1 else None)


def recurrent_gemma_layout(cfg: Fields, n: int, hidden: int, heads: int, notes: list[str]) -> Layout:
    """RG-LRU blocks and local attention over attention_window_size tokens; the head size is always
    hidden / heads (`RecurrentGemmaConfig.__post_init__`)."""
    head_dim = hidden // heads
    attention = {"kv_heads": read_kv_heads(cfg, "recurrent_gemma", heads), "head_dim": head_dim,
                 "head_dim_v": head_dim, "window": cfg.int("attention_window_size", "sliding_window")}
    caches = [rg_lru_state(cfg, i, hidden) if block == "recurrent" else SlidingWindow(layer=i, **attention)
              for i, block in enumerate(_blocks(cfg, n))]
    types = ["linear_attention" if c.kind == "recurrent" else "sliding_attention" for c in caches]
    return Layout(types=types, caches=caches, head_dim=head_dim)


def recurrent_gemma_params(cfg: Fields, layout: Layout, hidden: int, heads: int) -> ParamCounts:
    """`RecurrentGemmaForCausalLM`: embeddings (tied), a final norm, and per layer two norms, a gated MLP of
    intermediate_size / 2 with biases, and its temporal block:
        attention  q, k, v (biases with attention_bias), o with a bias
        RG-LRU     linear_x, linear_y (hidden x lru_width) and linear_out (lru_width x hidden), with biases; a
                   depthwise conv1d (lru_width x conv1d_width, bias); the recurrence's per-channel parameter and
                   its input and recurrence gates: block-diagonal, heads blocks of (lru_width / heads)^2, with
                   biases"""
    vocab = cfg.int("vocab_size")
    mlp_width = cfg.int("intermediate_size") // 2
    width, kernel = cfg.int("lru_width", default=hidden), cfg.int("conv1d_width")
    totals = {"attention": 0, "mlp": 0, "experts": 0, "active_experts": 0, "other": 0, "other_replicated": hidden}
    for cache in layout.caches:
        totals["mlp"] += 3 * hidden * mlp_width
        totals["other"] += 2 * mlp_width + hidden
        totals["other_replicated"] += 2 * hidden  # two norms
        if cache.kind == "recurrent":
            totals["attention"] += 3 * hidden * width + 2 * width * width // heads
            totals["other"] += 2 * width + hidden + width * kernel + width + width + 2 * width
        else:
            q, kv = heads * cache.head_dim, cache.kv_heads * cache.head_dim
            totals["attention"] += hidden * (q + 2 * kv) + q * hidden
            totals["other"] += hidden + (q + 2 * kv if cfg.flag("attention_bias") else 0)
    tied = cfg.flag("tie_word_embeddings", default=True)
    return ParamCounts(embedding=vocab * hidden, lm_head=0 if tied else vocab * hidden, **totals)


def recurrent_gemma_widths(cfg: Fields, hidden: int, layout: Layout) -> Widths:
    return Widths(hidden=hidden, mlp_intermediate=cfg.int("intermediate_size") // 2,
                  mlp_activation=str(cfg.get("hidden_activation", default="gelu_pytorch_tanh")))


for _type in (GEMMA_3N, *GEMMA_4, *ASSISTANTS):
    FAMILY_LAYOUTS[_type] = partial(gemma_layout, model_type=_type)
    FAMILY_PARAMS[_type] = partial(gemma_params, model_type=_type)
    FAMILY_WIDTHS[_type] = partial(gemma_widths, model_type=_type)
FAMILY_LAYOUTS["recurrent_gemma"] = recurrent_gemma_layout
FAMILY_PARAMS["recurrent_gemma"] = recurrent_gemma_params
FAMILY_WIDTHS["recurrent_gemma"] = recurrent_gemma_widths
