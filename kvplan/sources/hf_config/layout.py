"""The layer layout: what each decoder layer caches, from the fields each family states it with (transformers'
configuration classes; vLLM's config readers for the states)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

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
    DSA_FIELDS,
    DSA_MODEL_TYPES,
    HEAD_DIM_ROUNDED_DOWN,
    INDEXED_MODEL_TYPES,
    RECURRENT_FIELDS,
    UNMODELLED_CACHE_FIELDS,
)
from kvplan.sources.hf_config.fields import Fields
from kvplan.sources.hf_config.quantization import optional_dtype


@dataclass(frozen=True)
class Layout:
    """A decoder's layers as the reader lays them out. `types` names each layer as transformers' `layer_types`
    do (full_attention, sliding_attention, mamba2, ...; parameter counts follow them); `caches` holds what each
    layer caches, one or two entries per layer (MLA beside its indexer keys, attention beside a Mamba mixer);
    `head_dim` is the query head size; `blocks` are Nemotron NAS block configs, when the config gives them."""

    types: list[str]
    caches: list[LayerCache]
    head_dim: int
    blocks: list[Fields] = field(default_factory=list)

    def layer(self, index: int) -> list[LayerCache]:
        return [c for c in self.caches if c.layer == index]


# Families whose layout no shared rule states: model_type -> reader(cfg, num_layers, hidden, heads, notes).
FAMILY_LAYOUTS: dict[str, Callable[..., Layout]] = {}


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
        caches = layer_caches(cfg, types, kv_heads, head_dim)
        if model_type == "mimo_v2_flash":  # its modeling code gives sliding layers twice the KV heads (and sinks)
            caches = [c.model_copy(update={"kv_heads": 2 * kv_heads}) if isinstance(c, SlidingWindow) else c
                      for c in caches]
        layout = Layout(types=types, caches=caches, head_dim=head_dim)
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
    field = next((f for f in UNMODELLED_CACHE_FIELDS if cfg.data.get(f) not in (None, 0, [], {})), None)
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
    if model_type in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "dots1"):  # slide from max_window_layers up
        first = cfg.int("max_window_layers", default=0, minimum=0)
        return ["sliding_attention" if i >= first else "full_attention" for i in range(n)]
    return ["sliding_attention"] * n  # Mistral v0.1, Phi-3: one window on every layer



def layer_caches(cfg: Fields, types: list[str], kv_heads: int, head_dim: int) -> list:
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
            caches.append(mamba_state(cfg, i, layer_type))
        elif layer_type == "linear_attention":
            caches.append(gated_deltanet_state(cfg, i))
        elif layer_type == "minimax_m3_sparse":  # attention and a block-sparse indexer's keys (MiniMax-M3)
            caches += [FullAttention(layer=i, **attention), IndexerKeys(layer=i, head_dim=cfg.int("index_head_dim"))]
        elif layer_type in ("mlp", "moe"):
            caches.append(NoCache(layer=i, reason=f"{layer_type}-only block"))
        else:
            raise KvplanError(f"{cfg.where}: layer {i} has layer type {layer_type!r}, which kvplan does not know")
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



def mamba_state(cfg: Fields, layer: int, mixer: str) -> RecurrentState:
    """Mamba state per sequence: conv (channels x (kernel - 1)) + SSM, as vLLM's MambaSpec sizes it.
    Mamba1 (Jamba): channels = d_inner, ssm = d_inner x d_state.
    Mamba2 (Nemotron-H): channels = d_inner + 2 x n_groups x d_state, ssm = heads x head_dim x d_state."""
    d_inner, d_state, d_conv = mamba_dims(cfg)
    if mixer == "mamba":
        conv_channels, ssm = d_inner, d_inner * d_state
    else:
        groups = cfg.int("mamba_n_groups", "n_groups")
        conv_channels = d_inner + 2 * groups * d_state
        ssm = cfg.int("mamba_num_heads") * cfg.int("mamba_head_dim") * d_state
    return RecurrentState(layer=layer, mixer=mixer, conv_elements=conv_channels * (d_conv - 1), ssm_elements=ssm,
                          ssm_dtype=optional_dtype(cfg, "mamba_ssm_cache_dtype", "mamba_ssm_dtype"),
                          conv_kernel=d_conv if d_conv > 1 else None)



def mamba_dims(cfg: Fields) -> tuple[int, int, int]:
    d_state = cfg.int("mamba_d_state", "ssm_state_size", "state_size")
    d_conv = cfg.int("mamba_d_conv", "conv_kernel", "mamba_conv_kernel")
    if cfg.has("mamba_num_heads") and cfg.has("mamba_head_dim"):
        d_inner = cfg.int("mamba_num_heads") * cfg.int("mamba_head_dim")
    else:
        d_inner = cfg.int("mamba_expand", "expand") * cfg.int("hidden_size")
    return d_inner, d_state, d_conv



def gated_deltanet_state(cfg: Fields, layer: int) -> RecurrentState:
    """Gated DeltaNet (Qwen3-Next): conv over q, k, v channels (2 x Hk x Dk + Hv x Dv) x (kernel - 1);
    recurrent state Hv x Dv x Dk (vLLM's GDN MambaSpec)."""
    key_heads, value_heads = cfg.int("linear_num_key_heads"), cfg.int("linear_num_value_heads")
    key_dim, value_dim = cfg.int("linear_key_head_dim"), cfg.int("linear_value_head_dim")
    kernel = cfg.int("linear_conv_kernel_dim")
    conv_channels = 2 * key_heads * key_dim + value_heads * value_dim
    return RecurrentState(layer=layer, mixer="gated_deltanet", conv_elements=conv_channels * (kernel - 1),
                          ssm_elements=value_heads * value_dim * key_dim,
                          ssm_dtype=optional_dtype(cfg, "mamba_ssm_dtype"),
                          conv_kernel=kernel if kernel > 1 else None)



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
        types = ["full_attention" if i + 1 in full else "linear_attention" for i in range(num_layers)]
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

