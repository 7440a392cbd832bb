"""Families whose layers keep a recurrent state no shared rule reads, or run their stacks in cycles: what each layer
caches and how many parameters it has, registered in `layout.FAMILY_LAYOUTS` and `params.FAMILY_PARAMS`.

    short convolutions    LFM2, LFM2-MoE, LFM3 (`conv` layers); Inkling and Inkling 2 (four beside each attention)
    lightning attention   MiniMax-Text-01, MiniMax-M1 (`linear_attention` layers)
    Kimi Delta Attention  Ling 3 (`bailing_hybrid`), beside multi-head latent attention
    RWKV-4, xLSTM         a recurrent state on every layer
    HRM                   two attention stacks run in cycles, each run with its own KV cache

Every rule follows the family's transformers modeling file (`models/<family>/modeling_<family>.py`); where vLLM runs
the family, the state is the one its `MambaStateShapeCalculator` (`model_executor/layers/mamba/mamba_utils.py`)
sizes: conv states of kernel - 1 inputs. How transformers stores a state differently is `engines.transformers_state`.
"""

from __future__ import annotations

from functools import partial

from kvplan.errors import KvplanError
from kvplan.model import FullAttention, MLALatent, ParamCounts, RecurrentState, SlidingWindow
from kvplan.sources.hf_config.fields import Fields
from kvplan.sources.hf_config.layout import FAMILY_LAYOUTS, LAYER_CUTS, Layout, read_head_dim, read_kv_heads
from kvplan.sources.hf_config.params import FAMILY_PARAMS, intermediate_size, lfm2_intermediate, round_up


def _check_types(cfg: Fields, types: list[str], allowed: tuple[str, ...], field: str = "layer_types") -> list[str]:
    unknown = sorted(set(types) - set(allowed))
    if unknown:
        raise KvplanError(f"{cfg.where}: field {field} holds {', '.join(map(repr, unknown))}; this family's layers "
                          f"are {', '.join(allowed)}")
    return types


def _tied(cfg: Fields) -> bool:
    """LFM2-style configs may say `tie_embedding` (Lfm2Config reads it over tie_word_embeddings); default tied."""
    if cfg.data.get("tie_embedding") is not None:
        return cfg.flag("tie_embedding")
    return cfg.flag("tie_word_embeddings", default=True)


def _attention(hidden: int, heads: int, kv_heads: int, head_dim: int, bias: bool = False) -> int:
    """q, k, v, o projections (with biases when `bias`)."""
    q, kv = heads * head_dim, kv_heads * head_dim
    return hidden * (q + 2 * kv) + q * hidden + ((q + 2 * kv + hidden) if bias else 0)


def _counts(embedding: int, lm_head: int, **groups: int) -> ParamCounts:
    totals = {"attention": 0, "mlp": 0, "experts": 0, "active_experts": 0, "other": 0, "other_replicated": 0} | groups
    return ParamCounts(embedding=embedding, lm_head=lm_head, **totals)


# ------------------------------------------------------------------------------------------- LFM2, LFM2-MoE, LFM3


def short_conv_state(cfg: Fields, layer: int, hidden: int) -> RecurrentState:
    """An LFM short-convolution layer (`Lfm2ShortConv`): a depthwise convolution of width conv_L_cache over the
    hidden size, so its state is hidden x (conv_L_cache - 1) inputs (vLLM `short_conv_state_shape`)."""
    kernel = cfg.int("conv_L_cache", minimum=2)
    return RecurrentState(layer=layer, mixer="short_conv", conv_elements=hidden * (kernel - 1), ssm_elements=0,
                          conv_kernel=kernel)


def lfm_types(cfg: Fields, model_type: str, n: int) -> list[str]:
    """`layer_types`; else LFM2's `full_attn_idxs` (attention on those layers, short convolutions elsewhere; every
    layer attention when absent, as Lfm2Config has it), or LFM3's default of attention on layers i % 4 == 2,
    sliding attention on i % 4 == 0 past the first, short convolutions elsewhere (Lfm3Config)."""
    allowed = ("conv", "full_attention", "sliding_attention") if model_type == "lfm3" else ("conv", "full_attention")
    if cfg.has("layer_types"):
        return _check_types(cfg, cfg.list("layer_types", str, length=n), allowed)
    if model_type == "lfm3":
        return ["full_attention" if i % 4 == 2 else "sliding_attention" if i % 4 == 0 and i else "conv"
                for i in range(n)]
    if model_type == "lfm2_moe":  # Lfm2MoeConfig has no default layout: its model needs layer_types
        raise KvplanError(f"{cfg.where}: missing field layer_types (lfm2_moe states each layer's type)")
    attention = set(cfg.list("full_attn_idxs", int) if cfg.has("full_attn_idxs") else range(n))
    if any(not 0 <= i < n for i in attention):
        raise KvplanError(f"{cfg.where}: field full_attn_idxs names layers outside the {n} layers")
    return ["full_attention" if i in attention else "conv" for i in range(n)]


def lfm_layout(cfg: Fields, n: int, hidden: int, heads: int, notes: list[str], model_type: str) -> Layout:
    types = lfm_types(cfg, model_type, n)
    head_dim = read_head_dim(cfg, hidden, heads)
    attention = {"kv_heads": read_kv_heads(cfg, model_type, heads), "head_dim": head_dim, "head_dim_v": head_dim}
    caches = []
    for i, layer_type in enumerate(types):
        if layer_type == "conv":
            caches.append(short_conv_state(cfg, i, hidden))
        elif layer_type == "sliding_attention":
            caches.append(SlidingWindow(layer=i, window=cfg.int("sliding_window"), **attention))
        else:
            caches.append(FullAttention(layer=i, **attention))
    return Layout(types=types, caches=caches, head_dim=head_dim)


def lfm_params(cfg: Fields, layout: Layout, hidden: int, heads: int, model_type: str) -> ParamCounts:
    """LFM2 (`modeling_lfm2.py`), LFM2-MoE, LFM3. Per layer: operator_norm and ffn_norm (LFM3 with
    use_sandwich_norm: two more); a short convolution (in_proj h -> 3h, depthwise conv h x conv_L_cache, out_proj;
    biases with conv_bias) or attention (q, k, v, out_proj; per-head q and k norms; LFM3: biases with
    attention_bias and a per-head output gate g_proj with use_attention_gate); then a SwiGLU MLP (LFM2: the width
    block_auto_adjust_ff_dim makes of block_ff_dim, `lfm2_intermediate`) or, in LFM2-MoE past num_dense_layers,
    routed experts with a sigmoid router and its expert_bias. One final norm (embedding_norm). Norms and the
    router are whole on every TP rank (`other_replicated`)."""
    vocab, kernel = cfg.int("vocab_size"), cfg.int("conv_L_cache", minimum=2)
    lfm3 = model_type == "lfm3"
    norms = 4 if lfm3 and cfg.flag("use_sandwich_norm", default=True) else 2
    totals = {"attention": 0, "mlp": 0, "experts": 0, "active_experts": 0, "other": 0, "other_replicated": hidden}
    conv_bias = cfg.flag("conv_bias")
    if model_type == "lfm2_moe":
        experts, top_k = cfg.int("num_experts"), cfg.int("num_experts_per_tok")
        expert = 3 * hidden * cfg.int("moe_intermediate_size")
        dense_layers = cfg.int("num_dense_layers", minimum=0)
    for i, cache in enumerate(layout.caches):
        totals["other_replicated"] += norms * hidden
        if cache.kind == "recurrent":
            totals["attention"] += 3 * hidden * hidden + hidden * hidden
            totals["other"] += hidden * kernel + (5 * hidden if conv_bias else 0)  # conv; in_proj, conv, out biases
        else:
            bias = lfm3 and cfg.flag("attention_bias")
            totals["attention"] += _attention(hidden, heads, cache.kv_heads, cache.head_dim, bias)
            totals["other_replicated"] += 2 * cache.head_dim
            if lfm3 and cfg.flag("use_attention_gate", default=True):
                totals["attention"] += hidden * heads
        if model_type == "lfm2_moe" and i >= dense_layers:
            totals["experts"] += experts * expert
            totals["active_experts"] += top_k * expert
            totals["other_replicated"] += experts * hidden + (experts if cfg.flag("use_expert_bias", default=True)
                                                              else 0)
        else:
            width = lfm2_intermediate(cfg) if model_type == "lfm2" else cfg.int("intermediate_size")
            totals["mlp"] += 3 * hidden * width
    return _counts(vocab * hidden, 0 if _tied(cfg) else vocab * hidden, **totals)


# ----------------------------------------------------------------------------------------------------- MiniMax


def minimax_types(cfg: Fields, n: int) -> list[str]:
    """`layer_types` (MiniMax-Text-01-hf); else the remote-code checkpoints' `attn_type_list`, 0 lightning and 1
    softmax attention (MiniMax-M1: a softmax layer after every seven); else MiniMaxConfig's default, softmax
    attention on even layers."""
    if cfg.has("layer_types"):
        return _check_types(cfg, cfg.list("layer_types", str, length=n), ("full_attention", "linear_attention"))
    if cfg.has("attn_type_list"):
        kinds = cfg.list("attn_type_list", int, length=n)
        if set(kinds) - {0, 1}:
            raise KvplanError(f"{cfg.where}: field attn_type_list must hold 0 (lightning) or 1 (softmax attention)")
        return ["full_attention" if kind else "linear_attention" for kind in kinds]
    return ["full_attention" if i % 2 == 0 else "linear_attention" for i in range(n)]


def minimax_layout(cfg: Fields, n: int, hidden: int, heads: int, notes: list[str]) -> Layout:
    """Lightning attention keeps, per head, the running sum of k^T v: heads x head_dim x head_dim elements, in the
    model dtype (transformers `MiniMaxLightningAttention`; vLLM `linear_attention_state_shape`)."""
    shared = cfg.int("shared_intermediate_size", default=0, minimum=0)
    if shared:
        raise KvplanError(f"{cfg.where}: field shared_intermediate_size is {shared}: a shared expert that "
                          "transformers' MiniMax does not build, which kvplan does not count")
    types = minimax_types(cfg, n)
    head_dim = read_head_dim(cfg, hidden, heads)
    kv_heads = read_kv_heads(cfg, "minimax", heads)
    caches = [FullAttention(layer=i, kv_heads=kv_heads, head_dim=head_dim, head_dim_v=head_dim)
              if layer_type == "full_attention" else
              RecurrentState(layer=i, mixer="lightning", conv_elements=0, ssm_elements=heads * head_dim * head_dim)
              for i, layer_type in enumerate(types)]
    return Layout(types=types, caches=caches, head_dim=head_dim)


def minimax_params(cfg: Fields, layout: Layout, hidden: int, heads: int) -> ParamCounts:
    """MiniMax (`modeling_minimax.py`, Mixtral-style): every layer routes to num_local_experts SwiGLU experts of
    intermediate_size (router h x E). Softmax layers: q, k, v, o. Lightning layers: qkv_proj h -> 3 H d,
    output_gate h -> H d, out_proj, and a norm over H d (split by head). Two norms per layer and a final one,
    and the routers, are whole on every TP rank."""
    vocab, width = cfg.int("vocab_size"), cfg.int("intermediate_size")
    experts, top_k = cfg.int("num_local_experts"), cfg.int("num_experts_per_tok")
    inner = heads * layout.head_dim
    attention = other = 0
    for cache in layout.caches:
        if cache.kind == "recurrent":
            attention += 3 * hidden * inner + hidden * inner + inner * hidden
            other += inner
        else:
            attention += _attention(hidden, heads, cache.kv_heads, cache.head_dim)
    n = len(layout.caches)
    return _counts(vocab * hidden, 0 if cfg.flag("tie_word_embeddings") else vocab * hidden, attention=attention,
                   experts=n * experts * 3 * hidden * width, active_experts=n * top_k * 3 * hidden * width,
                   other=other, other_replicated=n * (2 * hidden + experts * hidden) + hidden)


# ----------------------------------------------------------------------------------------- Ling 3 (bailing_hybrid)


def kda_dims(cfg: Fields, heads: int) -> tuple[int, int, int]:
    """(heads, head dim, conv kernel) of a Ling 3 KDA layer."""
    return (cfg.int("linear_num_heads", default=heads), cfg.int("linear_head_dim", "head_dim"),
            cfg.int("linear_conv_kernel_dim", "short_conv_kernel_size", minimum=2))


def bailing_layout(cfg: Fields, n: int, hidden: int, heads: int, notes: list[str]) -> Layout:
    """Ling 3 (transformers `BailingHybrid`, vLLM `BailingMoeV3`): multi-head latent attention on the last layer of
    every layer_group_size, Kimi Delta Attention elsewhere. A KDA layer's state (vLLM `kda_state_shape`): a conv
    over q, k and v, 3 x H x d channels of short_conv_kernel_size - 1 inputs, and H x d x d recurrent elements
    kept in fp32 (vLLM `kda_state_dtype`; transformers casts it to float32). H, d and the kernel are
    num_attention_heads, head_dim and short_conv_kernel_size, as BailingHybridConfig copies them into
    linear_num_heads, linear_head_dim and linear_conv_kernel_dim (which win when a saved config carries them:
    it then sets head_dim to qk_rope_head_dim)."""
    if "BailingMoeV2_5ForCausalLM" in cfg.list("architectures"):
        raise KvplanError(f"{cfg.where}: BailingMoeV2_5ForCausalLM (Ling 2.5) mixes lightning attention into "
                          "bailing_hybrid, not the Kimi Delta Attention transformers builds; kvplan reads Ling 3 only")
    if cfg.has("layer_types"):
        types = _check_types(cfg, cfg.list("layer_types", str, length=n), ("full_attention", "linear_attention"))
    else:
        group = cfg.int("layer_group_size")
        if n % group:  # vLLM makes the layers past the last whole group MLA, transformers KDA
            raise KvplanError(f"{cfg.where}: field layer_group_size {group} does not divide the {n} layers and no "
                              "layer_types says which of the last ones are attention")
        types = ["full_attention" if (i + 1) % group == 0 else "linear_attention" for i in range(n)]
    kda_heads, d, kernel = kda_dims(cfg, heads)
    latent, rope = cfg.int("kv_lora_rank"), cfg.int("qk_rope_head_dim", minimum=0)
    caches = [MLALatent(layer=i, latent_dim=latent, rope_dim=rope) if layer_type == "full_attention" else
              RecurrentState(layer=i, mixer="kda", conv_elements=3 * kda_heads * d * (kernel - 1),
                             ssm_elements=kda_heads * d * d, ssm_dtype="fp32", conv_kernel=kernel)
              for i, layer_type in enumerate(types)]
    return Layout(types=types, caches=caches, head_dim=cfg.int("qk_nope_head_dim") + rope)


def bailing_params(cfg: Fields, layout: Layout, hidden: int, heads: int) -> ParamCounts:
    """Ling 3 (`modeling_bailing_hybrid.py`). MLA layers: q_proj h -> H (nope + rope) (no q LoRA),
    kv_a_proj_with_mqa h -> r + rope, kv_a_layernorm, kv_b_proj r -> H (nope + v), o_proj, head gate g_proj h -> H.
    KDA layers (Hd = H x d): q, k, v, g_proj and f_proj h -> Hd, b_proj h -> H, o_proj, conv 3 Hd x kernel,
    A_log H, dt_bias Hd, gated norm d. MLP: SwiGLU of intermediate_size on the dense layers (mlp_layer_types, else
    the first first_k_dense_replace), else routed experts of moe_intermediate_size (router with its correction
    bias) and n_shared_experts experts' worth of shared SwiGLU. vLLM (`bailing_moe_v3.py`) holds kv_a_proj_with_mqa
    whole on every TP rank like DeepSeek's MLA (`attention_replicated`), and the norms and routers
    (`other_replicated`)."""
    shared_width = cfg.int("moe_shared_expert_intermediate_size", default=None)
    expert_width = cfg.int("moe_intermediate_size")
    if shared_width is not None and shared_width != expert_width:
        raise KvplanError(f"{cfg.where}: field moe_shared_expert_intermediate_size {shared_width} differs from "
                          f"moe_intermediate_size {expert_width}, which transformers' bailing_hybrid sizes it by")
    vocab, n = cfg.int("vocab_size"), len(layout.caches)
    kda_heads, d, kernel = kda_dims(cfg, heads)
    nope, rope, v = cfg.int("qk_nope_head_dim"), cfg.int("qk_rope_head_dim", minimum=0), cfg.int("v_head_dim")
    latent, bias = cfg.int("kv_lora_rank"), cfg.flag("attention_bias")
    experts = cfg.int("num_experts", "num_local_experts", "n_routed_experts")
    top_k = cfg.int("num_experts_per_tok", "num_experts_per_token")
    shared = cfg.int("n_shared_experts", "num_shared_experts", minimum=0) * expert_width
    if cfg.has("mlp_layer_types"):
        dense = [kind == "dense" for kind in _check_types(cfg, cfg.list("mlp_layer_types", str, length=n),
                                                          ("dense", "sparse"), "mlp_layer_types")]
    else:
        dense = [i < cfg.int("first_k_dense_replace", default=0, minimum=0) for i in range(n)]
    inner = kda_heads * d
    totals = {"attention": 0, "attention_replicated": 0, "mlp": 0, "experts": 0, "active_experts": 0, "other": 0,
              "other_replicated": hidden}
    for i, cache in enumerate(layout.caches):
        totals["other_replicated"] += 2 * hidden
        if cache.kind == "mla":
            totals["attention"] += (hidden * heads * (nope + rope) + latent * heads * (nope + v) + heads * v * hidden
                                    + hidden * heads)
            totals["attention_replicated"] += hidden * (latent + rope)
            totals["other_replicated"] += latent + ((latent + rope) if bias else 0)  # kv_a_layernorm, kv_a's bias
            totals["other"] += hidden if bias else 0
        else:
            totals["attention"] += 5 * hidden * inner + hidden * kda_heads + inner * hidden
            totals["other"] += 3 * inner * kernel + kda_heads + inner
            totals["other_replicated"] += d
        if dense[i]:
            totals["mlp"] += 3 * hidden * cfg.int("intermediate_size")
        else:
            totals["experts"] += experts * 3 * hidden * expert_width
            totals["active_experts"] += top_k * 3 * hidden * expert_width
            totals["mlp"] += 3 * hidden * shared
            totals["other_replicated"] += experts * hidden + experts
    return _counts(vocab * hidden, 0 if cfg.flag("tie_word_embeddings") else vocab * hidden, **totals)


# --------------------------------------------------------------------------------------------------------- RWKV


def rwkv_layout(cfg: Fields, n: int, hidden: int, heads: int, notes: list[str]) -> Layout:
    """RWKV-4 (`modeling_rwkv.py`): each layer keeps the last input of its two token shifts (time and channel
    mixing), 2 x hidden in the model dtype, and the WKV numerator, denominator and running maximum, 3 x hidden in
    fp32 (RwkvModel's five state tensors of batch x hidden x layers)."""
    caches = [RecurrentState(layer=i, mixer="rwkv", conv_elements=2 * hidden, ssm_elements=3 * hidden,
                             ssm_dtype="fp32") for i in range(n)]
    return Layout(types=["rwkv"] * n, caches=caches, head_dim=1)


def rwkv_params(cfg: Fields, layout: Layout, hidden: int, heads: int) -> ParamCounts:
    """RWKV-4: time mixing (key, value, receptance h -> A, output A -> h; time_decay, time_first A; three mix
    vectors h), channel mixing (key h -> I, value I -> h, receptance h x h; two mix vectors h), LayerNorms ln1, ln2
    (and pre_ln on the first layer) and ln_out, weight and bias each. A = attention_hidden_size, I =
    intermediate_size (defaults hidden and 4 x hidden)."""
    vocab, n = cfg.int("vocab_size"), len(layout.caches)
    inner = cfg.int("attention_hidden_size", default=hidden)
    width = cfg.int("intermediate_size", default=4 * hidden)
    attention = n * (4 * hidden * inner)
    mlp = n * (2 * hidden * width + hidden * hidden)
    norms = n * 2 * 2 * hidden + 2 * hidden + 2 * hidden  # ln1, ln2; pre_ln, ln_out
    return _counts(vocab * hidden, 0 if cfg.flag("tie_word_embeddings") else vocab * hidden, attention=attention,
                   mlp=mlp, other=n * (2 * inner + 5 * hidden), other_replicated=norms)


# -------------------------------------------------------------------------------------------------------- xLSTM


def xlstm_layout(cfg: Fields, n: int, hidden: int, heads: int, notes: list[str]) -> Layout:
    """xLSTM (mLSTM blocks): per head the matrix memory C (qk_head_dim x v_head_dim), normaliser n (qk_head_dim)
    and stabiliser m (1), in the model dtype (transformers `xLSTMCache`); qk and v dims are hidden x qk_dim_factor
    and hidden x v_dim_factor rounded up to 64."""
    qk = round_up(hidden * cfg.number("qk_dim_factor"), 64) // heads
    v = round_up(hidden * cfg.number("v_dim_factor"), 64) // heads
    caches = [RecurrentState(layer=i, mixer="mlstm", conv_elements=0, ssm_elements=heads * (qk * v + qk + 1))
              for i in range(n)]
    return Layout(types=["mlstm"] * n, caches=caches, head_dim=v)


def xlstm_params(cfg: Fields, layout: Layout, hidden: int, heads: int) -> ParamCounts:
    """xLSTM (`modeling_xlstm.py`, weight_mode single or fused alike): q, k (h -> qk), v and output gate (h -> v),
    input and forget gates (h -> heads, with biases), a multi-head norm over v, out_proj v -> h; a SwiGLU FFN of
    hidden x ffn_proj_factor rounded up to ffn_round_up_to_multiple_of; two RMSNorms per block and a final one;
    biases on every projection and norm with use_bias."""
    vocab, n, bias = cfg.int("vocab_size"), len(layout.caches), cfg.flag("use_bias")
    qk, v = int(hidden * cfg.number("qk_dim_factor")), int(hidden * cfg.number("v_dim_factor"))
    width = intermediate_size(cfg, "xlstm", hidden)
    attention = n * (hidden * (2 * qk + 2 * v) + 2 * hidden * heads + v * hidden)
    mlp = n * 3 * hidden * width
    per_block = 2 * heads + v  # gate biases, the multi-head norm
    norms = 2 * hidden * (2 if bias else 1)  # two RMSNorms a block
    if bias:
        per_block += (2 * qk + 2 * v) + v + hidden + 2 * width + hidden
    return _counts(vocab * hidden, 0 if cfg.flag("tie_word_embeddings") else vocab * hidden, attention=attention,
                   mlp=mlp, other=n * per_block, other_replicated=n * norms + hidden * (2 if bias else 1))


# ---------------------------------------------------------------------------------------------------------- HRM


def hrm_runs(cfg: Fields) -> int:
    """How many times each block runs per token: H_cycles x (L_cycles low-level runs + one high-level run)."""
    return cfg.int("H_cycles") * (cfg.int("L_cycles") + 1)


def hrm_layout(cfg: Fields, n: int, hidden: int, heads: int, notes: list[str]) -> Layout:
    """HRM (`modeling_hrm_text.py`): an L stack and an H stack of num_layers_per_stack blocks each; the L stack runs
    L_cycles times and the H stack once in each of H_cycles, every run of a block caching its own keys and values
    (transformers gives each run a cache slot: num_hidden_layers is num_layers_per_stack x H_cycles x
    (L_cycles + 1)). kvplan's layer j is block j of both stacks, with H_cycles x (L_cycles + 1) full-attention
    caches of num_attention_heads heads (multi-head attention)."""
    slots = cfg.int("num_hidden_layers")
    if cfg.has("num_layers_per_stack") and slots != n * hrm_runs(cfg):
        raise KvplanError(f"{cfg.where}: field num_hidden_layers is {slots}, not num_layers_per_stack {n} x "
                          f"H_cycles x (L_cycles + 1) = {n * hrm_runs(cfg)} cache slots")
    head_dim = read_head_dim(cfg, hidden, heads)
    caches = [FullAttention(layer=i, kv_heads=heads, head_dim=head_dim, head_dim_v=head_dim)
              for i in range(n) for _ in range(hrm_runs(cfg))]
    return Layout(types=["full_attention"] * n, caches=caches, head_dim=head_dim)


def hrm_cut(decoder: dict, layers: int) -> None:
    """--layers for HRM keeps the first `layers` blocks of each stack, with all their cache slots."""
    fields = Fields(decoder, "config.json")
    decoder["num_layers_per_stack"] = layers
    decoder["num_hidden_layers"] = layers * hrm_runs(fields)


def hrm_params(cfg: Fields, layout: Layout, hidden: int, heads: int) -> ParamCounts:
    """HRM: two stacks of blocks with q, k, v and a sigmoid output gate (h -> H d, biases with attention_bias), o,
    and a SwiGLU MLP (biases with mlp_bias); its RMSNorms have no weight; z_L_init (h), the low-level stack's
    initial state, is a parameter."""
    vocab, blocks = cfg.int("vocab_size"), 2 * len(layout.types)
    inner, width = heads * layout.head_dim, cfg.int("intermediate_size")
    attention = blocks * (4 * hidden * inner + inner * hidden)
    other = hidden + blocks * ((4 * inner + hidden if cfg.flag("attention_bias") else 0)
                               + (2 * width + hidden if cfg.flag("mlp_bias") else 0))
    return _counts(vocab * hidden, 0 if cfg.flag("tie_word_embeddings") else vocab * hidden, attention=attention,
                   mlp=blocks * 3 * hidden * width, other=other)


# ------------------------------------------------------------------------------------------ Inkling, Inkling 2


def inkling_types(cfg: Fields, model_type: str, n: int) -> list[str]:
    """`layer_types`, hybrid (global attention) or hybrid_sliding; else Inkling's local_layer_ids (sliding), or the
    default: full attention on every sixth layer (i + 1) % 6 == 0, sliding elsewhere (both config classes)."""
    if cfg.has("layer_types"):
        return _check_types(cfg, cfg.list("layer_types", str, length=n), ("hybrid", "hybrid_sliding"))
    if model_type == "inkling_text" and cfg.has("local_layer_ids"):
        local = set(cfg.list("local_layer_ids", int))  # a set: membership tested once per layer
        if any(not 0 <= i < n for i in local):
            raise KvplanError(f"{cfg.where}: field local_layer_ids names layers outside the {n} layers")
        return ["hybrid_sliding" if i in local else "hybrid" for i in range(n)]
    return ["hybrid" if (i + 1) % 6 == 0 else "hybrid_sliding" for i in range(n)]


def _inkling_heads(cfg: Fields, sliding: bool) -> tuple[int, int, int]:
    """(query heads, KV heads, head dim) of a layer: the swa_* fields on sliding layers."""
    if sliding:
        return cfg.int("swa_num_attention_heads"), cfg.int("swa_num_key_value_heads"), cfg.int("swa_head_dim")
    return cfg.int("num_attention_heads"), cfg.int("num_key_value_heads"), cfg.int("head_dim")


def inkling_layout(cfg: Fields, n: int, hidden: int, heads: int, notes: list[str], model_type: str) -> Layout:
    """Inkling and Inkling 2: every layer has attention, global or over the last sliding_window_size tokens with
    its own heads (swa_*), and four short convolutions of conv_kernel_size (sconv_kernel_size): on keys and values
    (KV heads x head_dim channels each) and after attention and the MLP (hidden each)."""
    types = inkling_types(cfg, model_type, n)
    kernel = cfg.int("conv_kernel_size", "sconv_kernel_size", minimum=2)
    caches: list = []
    for i, layer_type in enumerate(types):
        sliding = layer_type == "hybrid_sliding"
        _, kv_heads, head_dim = _inkling_heads(cfg, sliding)
        attention = {"layer": i, "kv_heads": kv_heads, "head_dim": head_dim, "head_dim_v": head_dim}
        caches.append(SlidingWindow(window=cfg.int("sliding_window_size", "sliding_window"), **attention)
                      if sliding else FullAttention(**attention))
        caches.append(RecurrentState(layer=i, mixer="inkling_conv", ssm_elements=0, conv_kernel=kernel,
                                     conv_elements=(2 * kv_heads * head_dim + 2 * hidden) * (kernel - 1)))
    return Layout(types=types, caches=caches, head_dim=cfg.int("head_dim"))


def inkling_params(cfg: Fields, layout: Layout, hidden: int, heads: int, model_type: str) -> ParamCounts:
    """Inkling (`modeling_inkling.py`) and Inkling 2 (`modeling_inkling2.py`). Attention: q, o (H d), k, v
    (KV d), r_proj h -> H x d_rel, a relative-position table d_rel x extent (the window on sliding layers, else
    rel_extent), two depthwise convs on k and v. Inkling: q and k norms (d each); a dense SwiGLU MLP with a global
    scale on mlp_layer_types "dense" layers, else routed experts, n_shared_experts shared experts and a router
    over both (with a global scale and the routed experts' correction bias). Inkling 2: an output gate (h -> H d),
    a sink logit per head, learned q and relative-state scales (H d, H d_rel), inputs mixed from earlier blocks
    (one h query, three on full layers, none on layer 0) and its MLP's (one h), separate k and v input norms on
    full layers, whose k and v convs add per-token taps (static K x KV d, weight_proj h -> KV x K); routed
    experts only. Both: two RMSNorms per layer, convs after attention and after the MLP, a normed embedding
    (embed_norm), a final norm; lm_head is never tied. Norms and the router are whole on every TP rank
    (`other_replicated`)."""
    v2 = model_type == "inkling2_text"
    vocab, kernel = cfg.int("vocab_size"), cfg.int("conv_kernel_size", "sconv_kernel_size", minimum=2)
    d_rel = cfg.int("d_rel")
    experts, top_k = cfg.int("n_routed_experts", "num_local_experts"), cfg.int("num_experts_per_tok")
    expert = 3 * hidden * cfg.int("moe_intermediate_size")
    shared = 0 if v2 else cfg.int("n_shared_experts", minimum=0)
    n = len(layout.types)
    if v2:
        dense = [False] * n
    else:
        kinds = cfg.list("mlp_layer_types", str, length=n) or ["sparse"] * n
        dense = [kind == "dense" for kind in _check_types(cfg, kinds, ("dense", "sparse"), "mlp_layer_types")]
    totals = {"attention": 0, "mlp": 0, "experts": 0, "active_experts": 0, "other": 0,
              "other_replicated": 2 * hidden + (hidden if v2 else 0)}  # embed_norm, final norm; Inkling 2's final_input
    for i, layer_type in enumerate(layout.types):
        sliding = layer_type == "hybrid_sliding"
        q_heads, kv_heads, head_dim = _inkling_heads(cfg, sliding)
        q, kv = q_heads * head_dim, kv_heads * head_dim
        extent = cfg.int("sliding_window_size", "sliding_window") if sliding else cfg.int("rel_extent")
        totals["attention"] += hidden * (q + 2 * kv) + q * hidden + hidden * q_heads * d_rel
        other, whole = d_rel * extent + 2 * kv * kernel + 2 * hidden * kernel, 2 * hidden
        if v2:
            totals["attention"] += hidden * q + hidden * q_heads
            other += q + q_heads * d_rel + hidden * (1 + (0 if i == 0 else 1 if sliding else 3))
            if not sliding:
                totals["attention"] += 2 * hidden * kv_heads * kernel
                whole += 2 * hidden  # q, k, v input norms instead of input_layernorm
        else:
            whole += 2 * head_dim
        if dense[i]:
            totals["mlp"] += 3 * hidden * cfg.int("intermediate_size")
            other += 1  # global_scale
        else:
            totals["experts"] += experts * expert
            totals["active_experts"] += top_k * expert
            totals["mlp"] += shared * expert
            whole += (experts + shared) * hidden + experts + (0 if v2 else 1)  # router, correction bias, scale
        totals["other"] += other
        totals["other_replicated"] += whole
    return _counts(vocab * hidden, vocab * hidden, **totals)


for _model_type in ("lfm2", "lfm2_moe", "lfm3"):
    FAMILY_LAYOUTS[_model_type] = partial(lfm_layout, model_type=_model_type)
    FAMILY_PARAMS[_model_type] = partial(lfm_params, model_type=_model_type)
for _model_type in ("inkling_text", "inkling2_text"):
    FAMILY_LAYOUTS[_model_type] = partial(inkling_layout, model_type=_model_type)
    FAMILY_PARAMS[_model_type] = partial(inkling_params, model_type=_model_type)
FAMILY_LAYOUTS.update(minimax=minimax_layout, bailing_hybrid=bailing_layout, rwkv=rwkv_layout, xlstm=xlstm_layout,
                      hrm_text=hrm_layout)
FAMILY_PARAMS.update(minimax=minimax_params, bailing_hybrid=bailing_params, rwkv=rwkv_params, xlstm=xlstm_params,
                     hrm_text=hrm_params)
LAYER_CUTS["hrm_text"] = hrm_cut
