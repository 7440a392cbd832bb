"""Parameter counts, block by block, following each family's modeling file in transformers."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from kvplan.errors import KvplanError
from kvplan.model import IndexerKeys, MLALatent, NoCache, ParamCounts, RecurrentState, SlidingWindow, Widths
from kvplan.sources.hf_config.families import CORRECTION_BIAS_ROUTERS, Family
from kvplan.sources.hf_config.fields import Fields
from kvplan.sources.hf_config.layout import Layout, kda_dims, mamba_dims

# Families whose parameters no shared rule counts: model_type -> counter(cfg, layout, hidden, heads).
FAMILY_PARAMS: dict[str, Callable[..., ParamCounts]] = {}


def decoder_params(cfg: Fields, model_type: str, family: Family, layout: Layout, hidden: int,
                   heads: int) -> ParamCounts:
    """Parameters block by block, following each family's modeling file. Multi-token-prediction heads
    (DeepSeek num_nextn_predict_layers) are not part of the served model and are not counted."""
    if model_type in FAMILY_PARAMS:
        return FAMILY_PARAMS[model_type](cfg, layout, hidden, heads)
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
    moe = MoE.read(cfg, model_type)
    for i, layer_type in enumerate(layout.types):
        layer_norms = _norms_per_layer(cfg, model_type, family)
        for cache in layout.layer(i):
            mixer, mixer_other = _mixer_params(cfg, model_type, family, cache, hidden, heads, layout.head_dim)
            totals["attention"] += mixer
            totals["other"] += mixer_other
        if layout.blocks:
            ffn, layer_norms = _nas_block_params(layout.blocks[i], hidden)
            totals["mlp"] += ffn
        elif model_type == "nemotron_h":  # each block is a single mixer, MLP or MoE
            if layer_type == "mlp":
                totals["mlp"] += 2 * hidden * cfg.int("intermediate_size")
            elif layer_type == "moe":
                if moe is None:
                    raise KvplanError(f"{cfg.where}: MoE layers (E) but no n_routed_experts")
                moe.add(totals, hidden)
        elif moe and moe.on_layer(i):
            moe.add(totals, hidden)
            if family.moe_output_norm:
                totals["other"] += hidden
            if family.gated_norms:  # post_attention_layernorm is gated on MoE layers
                totals["other"] += 2 * hidden * cfg.int("gated_norm_rank")
        else:
            totals["mlp"] += _dense_mlp(cfg, model_type, family, hidden)
            if family.mlp_bias:
                totals["other"] += _mlp_bias(cfg, model_type, family, hidden)
        totals["other"] += layer_norms * norm
        if family.gated_norms:  # input_layernorm's gate: fc1 hidden -> rank, fc2 rank -> hidden
            totals["other"] += 2 * hidden * cfg.int("gated_norm_rank")
        if family.hyper_connections:  # attention's and MLP's: fn (2 n x n h), base (2 n), scale (2)
            streams = cfg.int("hc_mult")
            totals["other"] += 2 * (2 * streams * streams * hidden + 2 * streams + 2)
    if family.hyper_connections:  # the head's: hc_fn (n x n h), hc_base (n), hc_scale (1)
        streams = cfg.int("hc_mult")
        totals["other"] += streams * streams * hidden + streams + 1
    return ParamCounts(embedding=embedding, lm_head=lm_head, **totals)


def read_widths(cfg: Fields, model_type: str, family: Family, hidden: int, layout: Layout) -> Widths | None:
    """The forward widths: dense MLP (or shared expert) and routed expert intermediates, widest over layers.
    Nemotron-H and NAS blocks mix per-block FFN shapes that kvplan does not carry: no widths for them."""
    if layout.blocks or model_type == "nemotron_h":
        return None
    moe = MoE.read(cfg, model_type)
    dense = moe is None or model_type == "longcat_flash" or any(not moe.on_layer(i) for i in range(len(layout.types)))
    intermediate = intermediate_size(cfg, model_type, hidden) if dense else 0
    if moe is not None:
        intermediate = max(intermediate, moe.shared_intermediate)
    activation = cfg.get("hidden_act", "hidden_activation", "activation_function", "activation",
                         default="silu" if family.gated_mlp else "gelu")
    return Widths(hidden=hidden, mlp_intermediate=intermediate, gated_mlp=family.gated_mlp,
                  mlp_activation=str(activation), experts_per_token=moe.top_k if moe else 0,
                  expert_intermediate=moe.intermediate if moe else 0)


def _norms_per_layer(cfg: Fields, model_type: str, family: Family) -> int:
    """Falcon: the 7B-style parallel block shares one input LayerNorm; new_decoder_architecture has
    ln_attn and ln_mlp (or one, with num_ln_in_parallel_attn = 1)."""
    if model_type == "falcon":
        if cfg.flag("new_decoder_architecture"):
            return cfg.int("num_ln_in_parallel_attn", default=2)
        return 1 if cfg.flag("parallel_attn", default=True) else 2
    return family.norms_per_layer



def intermediate_size(cfg: Fields, model_type: str, hidden: int) -> int:
    if model_type in ("gpt2", "gpt_bigcode") or (model_type == "falcon" and not cfg.has("ffn_hidden_size")):
        return cfg.int("n_inner", "ffn_hidden_size", default=4 * hidden)
    if model_type == "llama4_text":
        return cfg.int("intermediate_size_mlp", "intermediate_size")
    if model_type == "minimax_m3_vl_text":  # its experts are intermediate_size wide, its dense MLPs this
        return cfg.int("dense_intermediate_size")
    return cfg.int("intermediate_size", "n_inner", "ffn_hidden_size", "ffn_dim")



def _dense_mlp(cfg: Fields, model_type: str, family: Family, hidden: int) -> int:
    intermediate = intermediate_size(cfg, model_type, hidden)
    return (3 if family.gated_mlp else 2) * hidden * intermediate



def _mlp_bias(cfg: Fields, model_type: str, family: Family, hidden: int) -> int:
    return intermediate_size(cfg, model_type, hidden) * (2 if family.gated_mlp else 1) + hidden



def _mixer_params(cfg: Fields, model_type: str, family: Family, cache, hidden: int, heads: int,
                  head_dim: int) -> tuple[int, int]:
    """(matrix params, other params) of a layer's attention or recurrent mixer."""
    if isinstance(cache, MLALatent):
        matrices, other = _mla_params(cfg, hidden, heads, family.gated_query)
        if family.output_gate:  # Hy V4: gate_proj to one v_head_dim gate per head, and a sink logit per head
            matrices, other = matrices + hidden * heads * cfg.int("v_head_dim"), other + heads
        return matrices, other
    if isinstance(cache, IndexerKeys):
        return _indexer_params(cfg, model_type, hidden, cache.head_dim)
    if isinstance(cache, RecurrentState):
        if cache.mixer == "gated_deltanet":
            return _gated_deltanet_params(cfg, hidden)
        if cache.mixer == "kda":
            return _kda_params(cfg, hidden)
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
    if family.o_bias or (cfg.flag("attention_bias") and model_type not in ("qwen2", "qwen2_moe", "glm4_moe")):
        other += hidden
    qk_norm = family.qk_norm if not family.qk_norm_flag or cfg.flag(family.qk_norm_flag) else None
    if qk_norm == "head":
        other += 2 * head_dim
    elif qk_norm == "full":
        other += heads * head_dim + k
    if model_type == "gpt_oss" or (model_type == "mimo_v2_flash" and isinstance(cache, SlidingWindow)):
        other += heads  # attention sinks: one learned logit per head
    if family.output_gate:  # Beam: gate_proj (hidden -> heads x head_dim) and gate_bias
        matrices += hidden * heads * head_dim
        other += heads
    return matrices, other



def _mla_params(cfg: Fields, hidden: int, heads: int, gated_query: bool = False) -> tuple[int, int]:
    """DeepSeek MLA: q via q_lora_rank (or direct), kv_a (latent + rope), kv_b (latent -> heads), o.
    A gated query (A.X-K2 q_gate_proj) maps the query latent, normed and raw side by side (2 x q_lora_rank), to
    each head's query and a v_head_dim output gate."""
    nope, rope, v = cfg.int("qk_nope_head_dim"), cfg.int("qk_rope_head_dim", minimum=0), cfg.int("v_head_dim")
    latent = cfg.int("kv_lora_rank")
    q_rank = cfg.int("q_lora_rank", default=None)
    q_head = heads * (nope + rope)
    q = hidden * q_rank + q_rank * q_head if q_rank else hidden * q_head
    if gated_query:
        q = hidden * cfg.int("q_lora_rank") + 2 * cfg.int("q_lora_rank") * heads * (nope + rope + v)
    matrices = q + hidden * (latent + rope) + latent * heads * (nope + v) + heads * v * hidden
    return matrices, latent + (q_rank or 0)  # kv_a_layernorm, q_a_layernorm



def _indexer_params(cfg: Fields, model_type: str, hidden: int, head_dim: int) -> tuple[int, int]:
    """A DSA indexer (transformers `DeepseekV32Indexer`): wq_b from the query latent to index_n_heads x head_dim,
    wk to one head_dim key, weights_proj to one weight per head; k_norm is a LayerNorm (weight and bias).
    MiniMax-M3's (`MiniMaxM3VLIndexer`): q_proj and k_proj from the hidden state, RMSNorms on q and k."""
    index_heads = cfg.int("index_n_heads")
    if model_type == "minimax_m3_vl_text":
        return hidden * (index_heads + 1) * head_dim, 2 * head_dim
    matrices = cfg.int("q_lora_rank") * index_heads * head_dim + hidden * head_dim + hidden * index_heads
    return matrices, 2 * head_dim



def _mamba_params(cfg: Fields, hidden: int, mixer: str) -> tuple[int, int]:
    """Mamba1 (Jamba: in_proj, conv1d, x_proj, dt_proj, A, D, out_proj, dt/B/C norms) or
    Mamba2 (in_proj to z, x, B, C, dt; conv1d; dt_bias, A, D; gated norm; out_proj)."""
    d_inner, d_state, d_conv = mamba_dims(cfg)
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



def _kda_params(cfg: Fields, hidden: int) -> tuple[int, int]:
    """Kimi Delta Attention (transformers `KimiLinearDeltaAttention`): q, k, v projections to H x D each, their
    depthwise conv1d (no bias), the forget gate's low-rank f_a / f_b with dt_bias (H x D) and A_log (H), b_proj to
    one beta per head, the output gate's low-rank g_a / g_b, a gated RMSNorm over D and o_proj."""
    kda_heads, head_dim, kernel = kda_dims(cfg)
    width = kda_heads * head_dim
    matrices = 4 * hidden * width + 2 * (hidden * head_dim + head_dim * width) + hidden * kda_heads
    other = 3 * width * kernel + width + kda_heads + head_dim
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
class MoE:
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
    def read(cls, cfg: Fields, model_type: str) -> MoE | None:
        n = cfg.int("num_local_experts", "n_routed_experts", "num_experts", default=0, minimum=0)
        if not n:
            return None
        hidden, layers = cfg.int("hidden_size"), cfg.layers("num_hidden_layers", "num_layers")
        top_k = cfg.int("num_experts_per_tok", "experts_per_token", "num_experts_per_token", "moe_topk")
        size = cfg.int("moe_intermediate_size", "expert_ffn_hidden_size", "intermediate_size")
        if model_type == "hunyuan_v1_moe":  # experts and the one shared MLP are intermediate_size wide
            size = cfg.int("intermediate_size")
        expert, bias, router = 3 * hidden * size, 0, hidden * n
        if model_type == "gpt_oss":  # gate_up_proj + down_proj with biases; router with bias
            bias, router = 2 * size + hidden, hidden * n + n
        shared_size = 0
        if cfg.has("n_shared_experts") or cfg.has("num_shared_experts"):
            shared_size = cfg.int("n_shared_experts", "num_shared_experts", minimum=0) * size
        elif cfg.has("shared_expert_intermediate_size"):
            shared_size = cfg.int("shared_expert_intermediate_size", minimum=0)
            router += hidden if shared_size else 0  # shared_expert_gate
        elif model_type in ("llama4_text", "hunyuan_v1_moe"):
            shared_size = size
        elif model_type == "minimax_m3_vl_text":
            shared_size = cfg.int("shared_intermediate_size", minimum=0)
        if model_type in CORRECTION_BIAS_ROUTERS:
            router += n  # e_score_correction_bias
        dense = _dense_layers(cfg, model_type, layers)
        return cls(n, top_k, size, shared_size, expert, bias, 3 * hidden * shared_size, router,
                   frozenset(dense))

    def on_layer(self, i: int) -> bool:
        return i not in self.dense_layers

    def add(self, totals: dict, hidden: int) -> None:
        totals["experts"] += self.experts * self.expert_size
        totals["active_experts"] += self.top_k * self.expert_size
        totals["mlp"] += self.shared
        totals["other"] += self.router + self.experts * self.expert_bias


def _dense_layers(cfg: Fields, model_type: str, layers: int) -> set[int]:
    """The layers of an MoE model that keep a dense MLP. transformers 5 states them per layer (`mlp_layer_types`,
    "dense" or "sparse"), derived from the older fields when a config lacks it, so it alone counts when present."""
    if cfg.has("mlp_layer_types"):
        kinds = cfg.list("mlp_layer_types", str, length=layers)
        if set(kinds) - {"dense", "sparse"}:
            raise KvplanError(f"{cfg.where}: field mlp_layer_types must hold \"dense\" or \"sparse\" for each "
                              f"layer, got {sorted(set(kinds) - {'dense', 'sparse'})}")
        return {i for i, kind in enumerate(kinds) if kind == "dense"}
    first_dense = cfg.int("first_k_dense_replace", default=0, minimum=0)
    if first_dense > layers:
        raise KvplanError(f"{cfg.where}: first_k_dense_replace {first_dense:,} exceeds the {layers} layers")
    dense = set(range(first_dense))
    dense |= set(cfg.list("mlp_only_layers", int))
    if model_type == "jamba":  # experts on layers i % period == offset
        period, offset = cfg.int("expert_layer_period"), cfg.int("expert_layer_offset", minimum=0)
        dense |= {i for i in range(layers) if i % period != offset}
    elif cfg.has("moe_layer_freq"):  # DeepSeek: experts on layers i % freq == 0 (past first_k_dense_replace)
        dense |= {i for i in range(layers) if i % cfg.int("moe_layer_freq")}
    else:  # Qwen MoE decoder_sparse_step, Llama 4 interleave_moe_layer_step: every step-th layer
        step = cfg.int("decoder_sparse_step", "interleave_moe_layer_step", default=1)
        dense |= {i for i in range(layers) if (i + 1) % step}
    return dense


def longcat_flash_params(cfg: Fields, layout: Layout, hidden: int, heads: int) -> ParamCounts:
    """LongCat-Flash blocks (transformers `LongcatFlashDecoderLayer`, vLLM `longcat_flash.py`): two MLA sublayers,
    two dense MLPs (ffn_hidden_size) and their four norms, and one MoE of n_routed_experts experts
    (expert_ffn_hidden_size) whose router also scores zero_expert_num zero-compute (identity) experts: a
    classifier and a correction bias over n + zero columns, no weights for the zero ones. transformers allocates
    gate_up_proj rows for the zero experts too (`LongcatFlashExperts`), which checkpoints do not hold."""
    vocab, blocks = cfg.int("vocab_size"), len(layout.types)
    moe = MoE.read(cfg, "longcat_flash")
    scored = moe.experts + cfg.int("zero_expert_num", default=0, minimum=0)
    attention, mla_other = (2 * blocks * part for part in _mla_params(cfg, hidden, heads))
    router = hidden * scored + scored + (scored if cfg.flag("router_bias") else 0)
    return ParamCounts(
        embedding=vocab * hidden, lm_head=0 if cfg.flag("tie_word_embeddings") else vocab * hidden,
        attention=attention, mlp=blocks * 2 * 3 * hidden * cfg.int("ffn_hidden_size", "intermediate_size"),
        experts=blocks * moe.experts * moe.expert_size, active_experts=blocks * moe.top_k * moe.expert_size,
        other=mla_other + blocks * (router + 4 * hidden) + hidden)


FAMILY_PARAMS["longcat_flash"] = longcat_flash_params

