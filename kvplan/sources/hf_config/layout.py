"""The layer layout: what each decoder layer caches, from the fields each family states it with (transformers'
configuration classes; vLLM's config readers for the states)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from kvplan.errors import KvplanError
from kvplan.model import (
    ChunkedAttention,
    FullAttention,
    IndexerKeys,
    LayerCache,
    MLALatent,
    NoCache,
    RecurrentState,
    SlidingWindow,
)
from kvplan.sources.hf_config.families import (
    ATTENTION_FREE,
    DSA_FIELDS,
    DSA_MODEL_TYPES,
    HEAD_DIM_ROUNDED_DOWN,
    INDEXED_MODEL_TYPES,
    MAMBA_MIXERS,
    MODELLED_BY_FAMILY,
    RECURRENT_FIELDS,
    UNMODELLED_CACHE_FIELDS,
)
from kvplan.sources.hf_config.fields import MAX_LAYERS, Fields
from kvplan.sources.hf_config.mamba import mamba_state
from kvplan.sources.hf_config.quantization import optional_dtype


class Layout:
    """A decoder's layers as the reader lays them out. `types` names each layer as transformers' `layer_types`
    do (full_attention, sliding_attention, mamba2, ...; parameter counts follow them); `caches` holds what each
    layer caches, one or two entries per layer (MLA beside its indexer keys, attention beside a Mamba mixer);
    `head_dim` is the query head size; `blocks` are Nemotron NAS block configs, when the config gives them. A plain
    class: defining a frozen dataclass cost every run about half a millisecond."""

    __slots__ = ("types", "caches", "head_dim", "blocks", "by_layer")

    def __init__(self, types: list[str], caches: list[LayerCache], head_dim: int, blocks: list[Fields] | None = None):
        self.types, self.caches, self.head_dim, self.blocks = types, caches, head_dim, blocks or []
        self.by_layer: dict[int, list[LayerCache]] = {}  # the caches of each layer, found once, not once a layer
        for cache in caches:
            self.by_layer.setdefault(cache.layer, []).append(cache)

    def layer(self, index: int) -> list[LayerCache]:
        return self.by_layer.get(index, [])

    def with_caches(self, caches: list[LayerCache]) -> Layout:
        """The same layers holding other caches (parameters counted as if they were these)."""
        return Layout(self.types, caches, self.head_dim, self.blocks)


# Families whose layout no shared rule states: model_type -> reader(cfg, num_layers, hidden, heads, notes). Each
# reads its own fields, so the refusals of fields the shared rules do not model do not apply to it.
FAMILY_LAYOUTS: dict[str, Callable[..., Layout]] = {}
# Families whose layer count lives in more than one field: model_type -> cut(decoder fields, layers), which
# `kvplan profile --layers` applies instead of setting num_hidden_layers.
LAYER_CUTS: dict[str, Callable[[dict, int], None]] = {}


def read_layer_count(cfg: Fields, model_type: str) -> int:
    """Decoder layers: num_hidden_layers or its aliases (xLSTM's configs may say num_blocks). Nemotron-H's current
    configs may state them only as layers_block_type, one entry per layer (transformers derives num_hidden_layers
    from it). HRM's are the blocks of one of its two stacks (num_layers_per_stack; its num_hidden_layers counts the
    runs of those blocks, and old configs give the blocks there). Reformer's are its attn_layers, one kind each
    (ReformerConfig sets num_hidden_layers to their count)."""
    if model_type == "reformer":
        kinds = cfg.data.get("attn_layers")
        if not isinstance(kinds, list) or not 1 <= len(kinds) <= MAX_LAYERS:
            raise KvplanError(f"{cfg.where}: field attn_layers must list each layer's attention, local or lsh")
        return len(kinds)
    block_types = cfg.data.get("layers_block_type")
    if model_type == "nemotron_h" and isinstance(block_types, list) and not cfg.has("num_hidden_layers"):
        if not 1 <= len(block_types) <= MAX_LAYERS:
            raise KvplanError(f"{cfg.where}: field layers_block_type must list between 1 and {MAX_LAYERS:,} layers")
        return len(block_types)
    if model_type == "hrm_text" and cfg.has("num_layers_per_stack"):
        return cfg.layers("num_layers_per_stack")
    return cfg.layers("num_hidden_layers", "n_layer", "num_layers", "n_layers", "num_blocks")


def read_heads(cfg: Fields, model_type: str) -> int:
    """Query heads: none in the attention-free families (Mamba, Mamba-2). RWKV-4 has none either, but its time
    mixing decays each of its attention_hidden_size channels on its own (`modeling_rwkv.py`), so it counts as that
    many heads of one channel."""
    if model_type in ATTENTION_FREE:
        return 0
    if model_type == "rwkv":
        return cfg.int("attention_hidden_size", "hidden_size")
    return cfg.int("num_attention_heads", "n_head", "num_heads", "n_heads", "attention_heads")


def read_layout(cfg: Fields, model_type: str, num_layers: int, hidden: int, heads: int, notes: list[str]) -> Layout:
    """What each layer caches: the family's own rule if it has one, else MLA on every layer (kv_lora_rank), NAS
    blocks (block_configs), or a layer type per layer (`layer_types`)."""
    if model_type in FAMILY_LAYOUTS:
        layout = FAMILY_LAYOUTS[model_type](cfg, num_layers, hidden, heads, notes)
    elif cfg.has("kv_lora_rank"):  # DeepSeek V2/V3, Kimi K2: multi-head latent attention on every layer
        # MLA's query heads are qk_nope + qk_rope wide, whatever hidden / heads is (GLM-4.7-Flash: 2,048 / 20)
        latent, rope = cfg.int("kv_lora_rank"), cfg.int("qk_rope_head_dim", minimum=0)
        indexed = indexer_layers(cfg, model_type, num_layers)
        caches: list[LayerCache] = []
        for i in range(num_layers):
            caches.append(MLALatent(layer=i, latent_dim=latent, rope_dim=rope))
            if i in indexed:
                caches.append(IndexerKeys(layer=i, head_dim=cfg.int("index_head_dim")))
        layout = Layout(types=["full_attention"] * num_layers, caches=caches,
                        head_dim=cfg.int("qk_nope_head_dim") + rope)
    elif cfg.has("block_configs"):  # Nemotron NAS (DeciLM): each block says its own attention and FFN
        head_dim = read_head_dim(cfg, hidden, heads)
        blocks = nas_blocks(cfg, num_layers)
        layout = Layout(types=["full_attention"] * num_layers, caches=nas_caches(blocks, head_dim, heads),
                        head_dim=head_dim, blocks=blocks)
    else:
        head_dim = read_head_dim(cfg, hidden, heads, model_type)
        types = layer_types(cfg, model_type, num_layers, notes)
        kv_heads = read_kv_heads(cfg, model_type, heads)
        caches = layer_caches(cfg, model_type, types, kv_heads, head_dim)
        if model_type == "mimo_v2_flash":  # its modeling code gives sliding layers twice the KV heads (and sinks)
            caches = [c.model_copy(update={"kv_heads": 2 * kv_heads}) if isinstance(c, SlidingWindow) else c
                      for c in caches]
        layout = Layout(types=types, caches=caches, head_dim=head_dim)
    if model_type not in FAMILY_LAYOUTS:
        refuse_unmodelled_caches(cfg, model_type, layout.caches)
    return layout


def indexer_layers(cfg: Fields, model_type: str, n: int) -> set[int]:
    """The layers that run a DeepSeek Sparse Attention indexer, and so cache its keys. DeepSeek-V3.2 runs one on
    every layer; GLM-5.2 runs it on some and lets the others reuse the last indexer's choice ("shared"), stated by
    `indexer_types` (transformers' `GlmMoeDsaConfig`), else by `index_topk_pattern` (F / S per layer), else by
    `index_topk_freq` and `index_skip_topk_offset`: layer i runs its own when max(i - offset + 1, 0) % freq == 0
    (defaults 1 and 2: every layer; vLLM `DeepseekV32Attention` reads the same fields)."""
    if model_type not in DSA_MODEL_TYPES and not any(cfg.has(f) for f in DSA_FIELDS):
        return set()
    for name in ("index_head_dim", "index_n_heads", "q_lora_rank"):  # the indexer's shapes, for cache and weights
        if not cfg.has(name):
            raise KvplanError(f"{cfg.where}: missing field {name}: a DeepSeek Sparse Attention model needs it to "
                              "size its indexer")
    cfg.list("layer_types", str, length=n)
    if cfg.has("indexer_types"):
        kinds = cfg.list("indexer_types", str, length=n)
    elif cfg.has("index_topk_pattern"):
        pattern = cfg.get("index_topk_pattern")
        if not isinstance(pattern, str) or len(pattern) != n or set(pattern) - {"F", "S"}:
            raise KvplanError(f"{cfg.where}: field index_topk_pattern must hold F or S for each of the {n} layers")
        kinds = ["full" if c == "F" else "shared" for c in pattern]
    else:
        freq = cfg.int("index_topk_freq", default=1)
        offset = cfg.int("index_skip_topk_offset", default=2, minimum=0)
        kinds = ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(n)]
    if set(kinds) - {"full", "shared"}:
        raise KvplanError(f"{cfg.where}: field indexer_types must hold \"full\" or \"shared\" for each layer, got "
                          f"{sorted(set(kinds) - {'full', 'shared'})}")
    return {i for i, kind in enumerate(kinds) if kind == "full"}


def refuse_unmodelled_caches(cfg: Fields, model_type: str, caches: list) -> None:
    """A one-line refusal for a model whose config says its layers keep more than kvplan's layout of it holds."""
    modelled = MODELLED_BY_FAMILY.get(model_type, ())
    field = next((f for f in UNMODELLED_CACHE_FIELDS
                  if f not in modelled and cfg.data.get(f) not in (None, 0, [], {})), None)
    if field is None and model_type not in INDEXED_MODEL_TYPES and not any(isinstance(c, IndexerKeys) for c in caches):
        field = next((f for f in DSA_FIELDS if cfg.data.get(f) not in (None, 0)), None)
    if field is None and not any(isinstance(c, RecurrentState) for c in caches):
        field = next((f for f in RECURRENT_FIELDS if cfg.data.get(f) not in (None, 0, [], {})), None)
    if field is not None:
        what = UNMODELLED_CACHE_FIELDS.get(field) or ("a sparse-attention indexer's key cache" if field in DSA_FIELDS
                                                       else "recurrent or convolution state in layers kvplan reads "
                                                            "as attention")
        raise KvplanError(f"{cfg.where}: kvplan cannot lay out {model_type or 'this model'}'s cache: its config has "
                          f"{field} ({what}), which kvplan does not model, so its KV figures would be wrong")



def read_kv_heads(cfg: Fields, model_type: str, heads: int) -> int:
    """KV heads: the aliases vLLM reads, then Falcon / GPT-BigCode multi_query (1 head), else MHA.
    Falcon: num_kv_heads counts only with new_decoder_architecture; otherwise multi_query gives 1 and its absence
    every head, whatever num_kv_heads says (FalconAttention; vLLM's falcon.py alike)."""
    if model_type == "falcon":
        if cfg.flag("new_decoder_architecture"):
            return cfg.int("num_kv_heads", "n_head_kv", default=heads)
        return 1 if cfg.flag("multi_query") else heads
    found = cfg.int("num_key_value_heads", "n_head_kv", "num_kv_heads", "multi_query_group_num",
                    "num_attention_groups", default=None)
    if found is not None:
        return found
    if cfg.flag("multi_query"):
        return 1
    return heads



def read_head_dim(cfg: Fields, hidden: int, heads: int, model_type: str = "") -> int:
    """The config's head size, else hidden / heads; families whose modeling rounds that down
    (HEAD_DIM_ROUNDED_DOWN) take hidden // heads whatever the remainder."""
    explicit = cfg.int("head_dim", "attention_head_dim", "d_kv", "kv_channels", default=None)
    if explicit is not None:
        return explicit
    if hidden % heads and model_type not in HEAD_DIM_ROUNDED_DOWN:
        raise KvplanError(f"{cfg.where}: no head_dim is given and hidden size {hidden} is not a multiple of "
                          f"{heads} heads")
    return hidden // heads



def layer_types(cfg: Fields, model_type: str, n: int, notes: list[str]) -> list[str]:
    """The type of each layer, from the field that family uses to say it (transformers' config classes). A Mamba
    family's recurrent layers are named after its mixer (mamba, mamba2): transformers 5 calls them all
    "linear_attention", older configs "mamba", and "attention" means full attention."""
    if model_type == "nemotron_h":
        return nemotron_h_types(cfg, n)
    if model_type == "bamba":  # attention on the layers attn_layer_indices lists, Mamba-2 elsewhere
        indices = set(cfg.list("attn_layer_indices", int))
        if any(i < 0 or i >= n for i in indices):
            raise KvplanError(f"{cfg.where}: field attn_layer_indices lists layers outside the {n} layers")
        return ["full_attention" if i in indices else "mamba2" for i in range(n)]
    if model_type == "granitemoehybrid" and not cfg.has("layer_types"):  # transformers' default: all Mamba-2
        return ["mamba2"] * n
    if cfg.has("layer_types"):
        types = cfg.list("layer_types", str, length=n)
        if model_type not in MAMBA_MIXERS:
            return types
        legacy = {"attention": "full_attention", "mamba": MAMBA_MIXERS[model_type],
                  "linear_attention": MAMBA_MIXERS[model_type]}
        return [legacy.get(t, t) for t in types]
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
    if model_type in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "dots1"):  # slide from max_window_layers up
        first = cfg.int("max_window_layers", default=0, minimum=0)
        return ["sliding_attention" if i >= first else "full_attention" for i in range(n)]
    return ["sliding_attention"] * n  # Mistral v0.1, Phi-3: one window on every layer



NEMOTRON_H_TYPES = {"M": "mamba2", "*": "full_attention", "-": "mlp", "E": "moe"}
NEMOTRON_H_NAMES = {"mamba": "mamba2", "linear_attention": "mamba2", "attention": "full_attention",
                    "full_attention": "full_attention", "mlp": "mlp", "moe": "moe"}


def nemotron_h_types(cfg: Fields, n: int) -> list[str]:
    """Nemotron-H states its layout only per layer: layers_block_type (transformers 5; mamba / attention / mlp /
    moe) or, in older configs, hybrid_override_pattern (M Mamba-2, * attention, - MLP, E MoE)."""
    field = next((f for f in ("layers_block_type", "layer_types") if cfg.has(f)), None)
    if field is not None:
        names = cfg.list(field, str, length=n)
        unknown = sorted(set(names) - set(NEMOTRON_H_NAMES))
        if unknown:
            raise KvplanError(f"{cfg.where}: field {field} has layer type {unknown[0]!r}: Nemotron-H layers are "
                              "mamba, attention, mlp or moe")
        return [NEMOTRON_H_NAMES[name] for name in names]
    pattern = cfg.get("hybrid_override_pattern", default=None)
    if not isinstance(pattern, str) or len(pattern) != n or set(pattern) - set(NEMOTRON_H_TYPES):
        raise KvplanError(f"{cfg.where}: Nemotron-H needs layers_block_type, or hybrid_override_pattern with one of "
                          f"M * - E for each of the {n} layers")
    return [NEMOTRON_H_TYPES[c] for c in pattern]


def layer_caches(cfg: Fields, model_type: str, types: list[str], kv_heads: int, head_dim: int) -> list:
    """One cache entry per layer, from its layer type."""
    attention = {"kv_heads": kv_heads, "head_dim": head_dim, "head_dim_v": cfg.int("v_head_dim", default=head_dim)}
    states: dict[str, RecurrentState] = {}  # a recurrent layer type's state, read from the config once
    caches = []
    for i, layer_type in enumerate(types):
        if layer_type in ("full_attention", "attention"):
            caches.append(FullAttention(layer=i, **attention))
        elif layer_type == "sliding_attention":
            caches.append(SlidingWindow(layer=i, window=cfg.int("sliding_window"), **attention))
        elif layer_type == "chunked_attention":
            caches.append(ChunkedAttention(layer=i, chunk=cfg.int("attention_chunk_size"), **attention))
        elif layer_type in ("mamba", "mamba2", "linear_attention"):
            if layer_type not in states:
                states[layer_type] = (gated_deltanet_state(cfg, i) if layer_type == "linear_attention"
                                      else mamba_state(cfg, model_type, i, layer_type))
            caches.append(states[layer_type].model_copy(update={"layer": i}))
        elif layer_type == "minimax_m3_sparse":  # attention and a block-sparse indexer's keys (MiniMax-M3)
            caches += [FullAttention(layer=i, **attention), IndexerKeys(layer=i, head_dim=cfg.int("index_head_dim"))]
        elif layer_type in ("mlp", "moe"):
            caches.append(NoCache(layer=i, reason=f"{layer_type}-only block"))
        else:
            raise KvplanError(f"{cfg.where}: field layer_types gives layer {i} the type {layer_type!r}, which kvplan "
                              "does not know")
    return caches



def nas_blocks(cfg: Fields, n: int) -> list[Fields]:
    blocks = cfg.data["block_configs"]
    if not isinstance(blocks, list) or len(blocks) != n or not all(isinstance(b, dict) for b in blocks):
        raise KvplanError(f"{cfg.where}: block_configs must have one object for each of the {n} layers")
    return [Fields(block, f"{cfg.where} block_configs[{i}]") for i, block in enumerate(blocks)]



def nas_caches(blocks: list[Fields], head_dim: int, heads: int) -> list:
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



def gated_deltanet_state(cfg: Fields, layer: int) -> RecurrentState:
    """Gated DeltaNet (Qwen3-Next): conv over q, k, v channels (2 x Hk x Dk + Hv x Dv) x (kernel - 1);
    recurrent state Hv x Dv x Dk (vLLM's GDN MambaSpec), Dk its state_size."""
    key_heads, value_heads = cfg.int("linear_num_key_heads"), cfg.int("linear_num_value_heads")
    key_dim, value_dim = cfg.int("linear_key_head_dim"), cfg.int("linear_value_head_dim")
    kernel = cfg.int("linear_conv_kernel_dim")
    conv_channels = 2 * key_heads * key_dim + value_heads * value_dim
    return RecurrentState(layer=layer, mixer="gated_deltanet", conv_elements=conv_channels * (kernel - 1),
                          ssm_elements=value_heads * value_dim * key_dim,
                          ssm_dtype=optional_dtype(cfg, "mamba_ssm_dtype"),
                          conv_kernel=kernel if kernel > 1 else None, heads=value_heads, state_size=key_dim)


def falcon_h1_layout(cfg: Fields, n: int, hidden: int, heads: int, notes: list[str]) -> Layout:
    """Falcon-H1: every layer runs attention and a Mamba-2 mixer side by side (`FalconH1DecoderLayer`), so each
    layer caches both: K and V, and the Mamba-2 state."""
    head_dim = read_head_dim(cfg, hidden, heads)
    kv_heads = read_kv_heads(cfg, "falcon_h1", heads)
    state = mamba_state(cfg, "falcon_h1", 0, "mamba2")  # read from the config once, copied to each layer
    caches: list[LayerCache] = []
    for i in range(n):
        caches += [FullAttention(layer=i, kv_heads=kv_heads, head_dim=head_dim, head_dim_v=head_dim),
                   state.model_copy(update={"layer": i})]
    return Layout(types=["hybrid"] * n, caches=caches, head_dim=head_dim)


def zamba_types(cfg: Fields, model_type: str, n: int) -> list[str]:
    """Zamba's and Zamba2's layers_block_type: "mamba" (or "linear_attention") layers, and "hybrid" layers that
    apply a shared transformer block before their Mamba mixer. Without the list, Zamba places hybrid layers as
    transformers' ZambaConfig does (layer 2, then i + 3 for i % attn_layer_period == attn_layer_offset)."""
    if cfg.has("layers_block_type"):
        names = cfg.list("layers_block_type", str, length=n)
        unknown = sorted(set(names) - {"mamba", "linear_attention", "hybrid"})
        if unknown:
            raise KvplanError(f"{cfg.where}: field layers_block_type has layer type {unknown[0]!r}: {model_type} "
                              "layers are mamba or hybrid")
        return ["hybrid" if name == "hybrid" else "mamba" for name in names]
    if model_type == "zamba2":
        raise KvplanError(f"{cfg.where}: missing field layers_block_type (which Zamba2 layers apply the shared "
                          "transformer block)")
    period, offset = cfg.int("attn_layer_period"), cfg.int("attn_layer_offset", minimum=0)
    return (["mamba", "mamba", "hybrid"] + ["hybrid" if i % period == offset else "mamba" for i in range(n - 3)])[:n]


def zamba_layout(cfg: Fields, n: int, hidden: int, heads: int, notes: list[str], model_type: str) -> Layout:
    """Zamba (Mamba) and Zamba2 (Mamba-2): a Mamba mixer in every layer; a hybrid layer first applies the shared
    transformer block, whose attention over the concatenated [hidden, embedding] input (2 x hidden_size wide)
    keeps its own K and V in each layer that applies it. Heads of attention_head_dim, 2 x hidden_size / heads
    unless Zamba's config sets it (Zamba2's config class always derives it)."""
    types = zamba_types(cfg, model_type, n)
    head_dim = 2 * hidden // heads
    if model_type == "zamba":
        head_dim = cfg.int("attention_head_dim", "head_dim", default=head_dim)
    kv_heads = read_kv_heads(cfg, model_type, heads)
    state = mamba_state(cfg, model_type, 0, MAMBA_MIXERS[model_type])  # read from the config once
    caches: list[LayerCache] = []
    for i, layer_type in enumerate(types):
        if layer_type == "hybrid":
            caches.append(FullAttention(layer=i, kv_heads=kv_heads, head_dim=head_dim, head_dim_v=head_dim))
        caches.append(state.model_copy(update={"layer": i}))
    return Layout(types=types, caches=caches, head_dim=head_dim)


def zaya_layout(cfg: Fields, n: int, hidden: int, heads: int, notes: list[str]) -> Layout:
    """ZAYA: every layer is attention with Compressed Convolutional Attention projections (`ZayaCCAProjection`):
    besides K and V (full, or windowed on "hybrid_sliding" layers) it keeps the last (cca_time0 - 1) +
    (cca_time1 - 1) inputs of the two stacked convolutions over q and k ((heads + kv_heads) x head_dim channels)
    and the previous token's delayed value half (kv_heads x head_dim / 2), all in the model dtype: a one-token
    shift is a convolution state too, so both count as conv elements."""
    types = cfg.list("layer_types", str, length=n) or ["hybrid"] * n
    unknown = sorted(set(types) - {"hybrid", "hybrid_sliding"})
    if unknown:
        raise KvplanError(f"{cfg.where}: field layer_types has layer type {unknown[0]!r}: ZAYA layers are hybrid "
                          "or hybrid_sliding")
    head_dim = cfg.int("head_dim")
    kv_heads = read_kv_heads(cfg, "zaya", heads)
    attention = {"kv_heads": kv_heads, "head_dim": head_dim, "head_dim_v": head_dim}
    kernel_inputs = cfg.int("cca_time0") - 1 + cfg.int("cca_time1") - 1
    conv = (heads + kv_heads) * head_dim * kernel_inputs + kv_heads * head_dim // 2
    caches: list[LayerCache] = []
    for i, layer_type in enumerate(types):
        caches.append(SlidingWindow(layer=i, window=cfg.int("sliding_window"), **attention)
                      if layer_type == "hybrid_sliding" else FullAttention(layer=i, **attention))
        caches.append(RecurrentState(layer=i, mixer="cca", conv_elements=conv, ssm_elements=0))
    return Layout(types=types, caches=caches, head_dim=head_dim)


def mamba_layout(cfg: Fields, n: int, hidden: int, heads: int, notes: list[str], model_type: str) -> Layout:
    """Mamba, Falcon-Mamba, Mamba-2: a Mamba mixer in every layer and no attention (query head size 0)."""
    mixer = MAMBA_MIXERS[model_type]
    state = mamba_state(cfg, model_type, 0, mixer)  # read from the config once, copied to each layer
    return Layout(types=[mixer] * n, caches=[state.model_copy(update={"layer": i}) for i in range(n)], head_dim=0)


FAMILY_LAYOUTS.update({
    **{t: partial(mamba_layout, model_type=t) for t in ("mamba", "falcon_mamba", "mamba2")},
    "falcon_h1": falcon_h1_layout,
    "zamba": partial(zamba_layout, model_type="zamba"),
    "zamba2": partial(zamba_layout, model_type="zamba2"),
    "zaya": zaya_layout,
})


def _mllama_text_layout(cfg: Fields, num_layers: int, hidden: int, heads: int, notes: list[str]) -> Layout:
    """Llama 3.2 Vision's text decoder (MllamaTextModel): self-attention layers, and at cross_attention_layers layers
    that attend to the image features instead. A text request skips those layers and they cache nothing; with an
    image they hold its keys and values, which kvplan does not count (its figures are for text requests)."""
    cross = set(cfg.list("cross_attention_layers", int))  # a set: membership tested once per layer
    if any(not 0 <= i < num_layers for i in cross):
        raise KvplanError(f"{cfg.where}: field cross_attention_layers names layers outside the {num_layers} layers")
    head_dim = read_head_dim(cfg, hidden, heads)
    attention = {"kv_heads": read_kv_heads(cfg, "mllama_text_model", heads), "head_dim": head_dim,
                 "head_dim_v": head_dim}
    caches = [NoCache(layer=i, reason="cross-attention to the image: nothing cached for a text request") if i in cross
              else FullAttention(layer=i, **attention) for i in range(num_layers)]
    if cross:
        notes.append(f"layers {', '.join(map(str, sorted(cross)))} cross-attend to the image and cache nothing for "
                     "text requests; an image's keys and values there are not counted")
    return Layout(types=["cross_attention" if i in cross else "full_attention" for i in range(num_layers)],
                  caches=caches, head_dim=head_dim)


FAMILY_LAYOUTS["mllama_text_model"] = _mllama_text_layout


def gpt_neo_layout(cfg: Fields, num_layers: int, hidden: int, heads: int, notes: list[str]) -> Layout:
    """GPT-Neo: each layer is "global" or "local"; a local layer attends to the last window_size tokens (its mask
    keeps i - j < window_size). The list is attention_layers, which a saved config carries and which overrides
    its run-length form attention_types, [[["global", "local"], 12]] (GPTNeoConfig)."""
    kinds = cfg.list("attention_layers", str, length=num_layers)
    if not kinds:
        runs = cfg.get("attention_types")
        if not isinstance(runs, list) or not all(
                isinstance(run, list) and len(run) == 2 and isinstance(run[0], list)
                and all(isinstance(kind, str) for kind in run[0])
                and isinstance(run[1], int) and not isinstance(run[1], bool) for run in runs):
            raise KvplanError(f"{cfg.where}: field attention_types must be a list of [[layer kinds], repeats]")
        kinds = [kind for pattern, repeats in runs for _ in range(repeats) for kind in pattern]
        if len(kinds) != num_layers:
            raise KvplanError(f"{cfg.where}: field attention_types must give one kind for each of the "
                              f"{num_layers} layers, got {len(kinds)}")
    if set(kinds) - {"global", "local"}:
        raise KvplanError(f"{cfg.where}: GPT-Neo layers are \"global\" or \"local\", got "
                          f"{sorted(set(kinds) - {'global', 'local'})}")
    head_dim = read_head_dim(cfg, hidden, heads)
    window = cfg.int("window_size")
    attention = {"kv_heads": heads, "head_dim": head_dim, "head_dim_v": head_dim}
    caches = [SlidingWindow(layer=i, window=window, **attention) if kind == "local"
              else FullAttention(layer=i, **attention) for i, kind in enumerate(kinds)]
    types = ["sliding_attention" if kind == "local" else "full_attention" for kind in kinds]
    return Layout(types=types, caches=caches, head_dim=head_dim)


def mpt_layout(cfg: Fields, num_layers: int, hidden: int, heads: int, notes: list[str]) -> Layout:
    """MPT as transformers' MptForCausalLM builds it: multi-head attention with ALiBi (no position table) and no
    biases. MosaicML's own code has variants it does not build (grouped or multi-query attention, learned
    positions, biases); kvplan refuses them, naming the field."""
    attn = cfg.mapping("attn_config")
    kind = attn.get("attn_type", default="multihead_attention")
    if kind != "multihead_attention":
        raise KvplanError(f"{attn.where}: field attn_type {kind!r} is not MPT's multi-head attention, the only one "
                          "transformers builds and kvplan reads")
    for refused, name, what in ((not attn.flag("alibi", default=True), f"{attn.where}: field alibi",
                                 "learned positions"),
                                (not cfg.flag("no_bias", default=True), f"{cfg.where}: field no_bias", "biases")):
        if refused:
            raise KvplanError(f"{name} false asks for {what}, which transformers' MPT does not build and kvplan "
                              "does not count")
    head_dim = read_head_dim(cfg, hidden, heads)
    return Layout(types=["full_attention"] * num_layers, head_dim=head_dim, caches=[
        FullAttention(layer=i, kv_heads=heads, head_dim=head_dim, head_dim_v=head_dim) for i in range(num_layers)])


def xlm_layout(cfg: Fields, num_layers: int, hidden: int, heads: int, notes: list[str]) -> Layout:
    """XLM: causal language models (causal true) attend to earlier tokens only and can cache keys and values;
    the masked-LM checkpoints (causal false, transformers' default) attend both ways, so every new token changes
    every earlier position's keys and nothing can be kept between tokens."""
    head_dim = read_head_dim(cfg, hidden, heads)
    types = ["full_attention"] * num_layers
    if cfg.flag("causal"):
        return Layout(types=types, head_dim=head_dim, caches=[
            FullAttention(layer=i, kv_heads=heads, head_dim=head_dim, head_dim_v=head_dim) for i in range(num_layers)])
    notes.append("causal is false: XLM attends both ways, so no layer can cache keys and values")
    return Layout(types=types, head_dim=head_dim, caches=[
        NoCache(layer=i, reason="bidirectional attention (causal false)") for i in range(num_layers)])


FAMILY_LAYOUTS.update({"gpt_neo": gpt_neo_layout, "mpt": mpt_layout, "xlm": xlm_layout})



def longcat_flash_layout(cfg: Fields, num_layers: int, hidden: int, heads: int, notes: list[str]) -> Layout:
    """LongCat-Flash: `num_layers` blocks of two MLA sublayers each (transformers `LongcatFlashDecoderLayer`, whose
    cache layers are 2i and 2i + 1; vLLM likewise), so each block caches two latents."""
    latent, rope = cfg.int("kv_lora_rank"), cfg.int("qk_rope_head_dim", minimum=0)
    caches = [MLALatent(layer=i, latent_dim=latent, rope_dim=rope) for i in range(num_layers) for _ in range(2)]
    return Layout(types=["full_attention"] * num_layers, caches=caches, head_dim=cfg.int("qk_nope_head_dim") + rope)


def kimi_linear_layout(cfg: Fields, num_layers: int, hidden: int, heads: int, notes: list[str]) -> Layout:
    """Kimi Linear: MLA on its full-attention layers, Kimi Delta Attention (a recurrent state) on the others.
    Which is which: `layer_types` (transformers' `KimiLinearConfig`), else linear_attn_config's full_attn_layers
    and kda_layers (1-based, as the checkpoint states them and vLLM reads them)."""
    if cfg.has("layer_types"):
        types = cfg.list("layer_types", str, length=num_layers)
    else:
        linear = cfg.mapping("linear_attn_config")
        full, kda = linear.list("full_attn_layers", int), linear.list("kda_layers", int)
        if sorted(full + kda) != list(range(1, num_layers + 1)):
            raise KvplanError(f"{linear.where}: full_attn_layers and kda_layers must number each of the "
                              f"{num_layers} layers once, from 1")
        full_layers = set(full)  # a set: a list's membership test made 100,000 layers quadratic
        types = ["full_attention" if i + 1 in full_layers else "linear_attention" for i in range(num_layers)]
    if set(types) - {"full_attention", "linear_attention"}:
        raise KvplanError(f"{cfg.where}: field layer_types must hold full_attention or linear_attention, got "
                          f"{sorted(set(types) - {'full_attention', 'linear_attention'})}")
    latent, rope = cfg.int("kv_lora_rank"), cfg.int("qk_rope_head_dim", minimum=0)
    caches = [MLALatent(layer=i, latent_dim=latent, rope_dim=rope) if kind == "full_attention" else kda_state(cfg, i)
              for i, kind in enumerate(types)]
    return Layout(types=types, caches=caches, head_dim=cfg.int("qk_nope_head_dim") + rope)


def kda_dims(cfg: Fields) -> tuple[int, int, int]:
    """(heads, head_dim, conv kernel) of Kimi Delta Attention: linear_attn_config's num_heads, head_dim and
    short_conv_kernel_size (the checkpoint's, which vLLM reads), else transformers' flat linear_* fields."""
    linear = cfg.mapping("linear_attn_config")
    if linear.has("num_heads"):
        return linear.int("num_heads"), linear.int("head_dim"), linear.int("short_conv_kernel_size")
    return cfg.int("linear_num_heads"), cfg.int("linear_head_dim"), cfg.int("linear_conv_kernel_dim")


def kda_state(cfg: Fields, layer: int) -> RecurrentState:
    """Kimi Delta Attention state, as vLLM's `kda_state_shape` / `kda_state_dtype` size it: a short convolution
    over q, k and v, 3 x H x D channels x (kernel - 1) inputs in the model dtype, and an H x D x D recurrent state
    in fp32 (mamba_ssm_cache_dtype "auto")."""
    kda_heads, head_dim, kernel = kda_dims(cfg)
    return RecurrentState(layer=layer, mixer="kda", conv_elements=3 * kda_heads * head_dim * (kernel - 1),
                          ssm_elements=kda_heads * head_dim * head_dim, ssm_dtype="fp32",
                          conv_kernel=kernel if kernel > 1 else None)


FAMILY_LAYOUTS["longcat_flash"] = longcat_flash_layout
FAMILY_LAYOUTS["kimi_linear"] = kimi_linear_layout

