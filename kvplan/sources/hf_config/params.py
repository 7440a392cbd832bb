"""Parameter counts, block by block, following each family's modeling file in transformers."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import NamedTuple

from kvplan.errors import KvplanError
from kvplan.model import (
    FullAttention,
    IndexerKeys,
    MLALatent,
    NoCache,
    ParamCounts,
    RecurrentState,
    SlidingWindow,
    Widths,
)
from kvplan.sources.hf_config.families import (
    ATTENTION_FREE,
    CORRECTION_BIAS_ROUTERS,
    FAMILIES,
    FOUR_X_MLP_FIELD,
    MAMBA_MIXERS,
    SHARED_EXPERT_GATES,
    Family,
)
from kvplan.sources.hf_config.fields import Fields
from kvplan.sources.hf_config.layout import Layout, kda_dims, read_kv_heads
from kvplan.sources.hf_config.mamba import mamba_params
from kvplan.sources.hf_config.vision import git_vision, phi4_multimodal_encoders


def _modernbert_decoder_params(cfg: Fields, layout: Layout, hidden: int, heads: int) -> ParamCounts:
    """ModernBERT decoder (`modeling_modernbert_decoder.py`): LayerNorms with a bias only if norm_bias, after the
    embeddings, before attention (not on layer 0) and the MLP, and after the last layer; q, k, v, Wo (biases if
    attention_bias); a gated Wi of 2 x intermediate and Wo (biases if mlp_bias); an LM head of a dense (bias if
    classifier_bias) and a norm before the projection tied to the embeddings, with a bias if decoder_bias."""
    vocab, intermediate, layers = cfg.int("vocab_size"), cfg.int("intermediate_size"), len(layout.types)
    norm = hidden * (2 if cfg.flag("norm_bias") else 1)
    attention_bias = 4 * hidden if cfg.flag("attention_bias") else 0
    mlp_bias = 2 * intermediate + hidden if cfg.flag("mlp_bias") else 0
    norms = layers * 2 * norm - norm + 3 * norm  # embedding, final and head norms
    other = layers * (attention_bias + mlp_bias) + hidden * hidden + (hidden if cfg.flag("classifier_bias") else 0) \
        + (vocab if cfg.flag("decoder_bias", default=True) else 0)
    tied = cfg.flag("tie_word_embeddings", default=True)
    return ParamCounts(embedding=vocab * hidden, lm_head=0 if tied else vocab * hidden,
                       attention=layers * 4 * hidden * hidden, mlp=layers * 3 * hidden * intermediate, experts=0,
                       active_experts=0, other=other, other_replicated=norms)


# Families whose parameters no shared rule counts: model_type -> counter(cfg, layout, hidden, heads). Registered at
# the end of this module; most count the shared blocks (`block_params`) and add what their modeling file adds.
FAMILY_PARAMS: dict[str, Callable[..., ParamCounts]] = {}
# Families whose forward widths no shared rule reads: model_type -> reader(cfg, hidden, layout).
FAMILY_WIDTHS: dict[str, Callable[..., Widths | None]] = {}


def decoder_params(cfg: Fields, model_type: str, family: Family, layout: Layout, hidden: int,
                   heads: int) -> ParamCounts:
    """Parameters block by block, following each family's modeling file. Multi-token-prediction heads
    (DeepSeek num_nextn_predict_layers) are not part of the served model and are not counted."""
    if model_type in FAMILY_PARAMS:
        return FAMILY_PARAMS[model_type](cfg, layout, hidden, heads)
    return block_params(cfg, model_type, family, layout, hidden, heads)


def block_params(cfg: Fields, model_type: str, family: Family, layout: Layout, hidden: int,
                 heads: int) -> ParamCounts:
    """The shared rule: embeddings, each layer's mixer, MLP or experts and norms as `family` describes them,
    the final norm and the output projection. Norms, routers and hyper-connections, which act on the hidden
    state's full width, are `other_replicated`: every tensor-parallel rank holds them whole (vLLM's `RMSNorm` and
    `ReplicatedLinear` routers)."""
    vocab = cfg.int("vocab_size", "n_vocab", "padded_vocab_size")
    norm = hidden * (2 if family.layer_norm else 1) * family.norm_weights
    embedding = vocab * hidden
    if family.learned_positions:
        embedding += (cfg.int("n_positions", "max_position_embeddings") + family.position_offset) * hidden
    tied = cfg.flag("tie_word_embeddings", default=True)
    lm_head = 0 if tied else vocab * hidden
    lm_head_bias = family.lm_head_bias or cfg.flag(family.lm_head_bias_field)
    totals = {"attention": 0, "attention_replicated": 0, "mlp": 0, "experts": 0, "active_experts": 0,
              "other": vocab if lm_head_bias else 0,
              "other_replicated": norm * (int(family.final_norm) + int(family.embedding_norm))}
    if family.bias_flag and cfg.flag(family.bias_flag):
        family = family._replace(qkv_bias=True, o_bias=True, mlp_bias=True)
    moe = None if model_type == "nemotron_h" else MoE.read(cfg, model_type)  # Nemotron-H: `_nemotron_h_moe`
    mlp_bias = family.mlp_bias or cfg.flag(family.mlp_bias_field)
    # Laguna's layers have query heads of their own (transformers 5's num_attention_heads_per_layer)
    layer_heads = cfg.list("num_attention_heads_per_layer", int, length=len(layout.types)) or [heads] * len(
        layout.types)
    norms_per_layer = _norms_per_layer(cfg, model_type, family)
    # Alike layers are counted, then their parameters added once, times the count: each distinct mixer (its query
    # heads and cache), and the MoE and dense MLP layers.
    mixers: dict[tuple, list] = {}  # a distinct mixer: [its first cache, its layers]
    moe_layers = dense_layers = 0
    for i, layer_type in enumerate(layout.types):
        layer_norms = norms_per_layer
        for cache in layout.layer(i):
            key = (layer_heads[i], *cache.alike_key())
            if key in mixers:
                mixers[key][1] += 1
            else:
                mixers[key] = [cache, 1]
        if layout.blocks:
            ffn, layer_norms = _nas_block_params(layout.blocks[i], hidden)
            totals["mlp"] += ffn
        elif model_type == "nemotron_h":  # each block is a single mixer, MLP or MoE
            if layer_type == "mlp":
                intermediate = cfg.int("intermediate_size")
                totals["mlp"] += 2 * hidden * intermediate
                totals["other"] += intermediate + hidden if cfg.flag("mlp_bias") else 0
            elif layer_type == "moe":
                _nemotron_h_moe(cfg, hidden, totals)
        elif moe and moe.on_layer(i):
            moe_layers += 1
        else:
            dense_layers += 1
        totals["other_replicated"] += layer_norms * norm
    for (query_heads, *_), (cache, count) in mixers.items():
        for group, params in _mixer_params(cfg, model_type, family, cache, hidden, query_heads,
                                           layout.head_dim).items():
            totals[group] += count * params
    if moe_layers:
        moe.add(totals, moe_layers)
        if mlp_bias and moe.shared_intermediate:  # the shared experts are the family's MLP, biases included
            totals["other"] += moe_layers * (2 * moe.shared_intermediate + hidden)
        if family.moe_output_norm:
            totals["other_replicated"] += moe_layers * hidden
        if family.gated_norms:  # post_attention_layernorm is gated on MoE layers
            totals["other_replicated"] += moe_layers * 2 * hidden * cfg.int("gated_norm_rank")
    if dense_layers:  # a dense layer's MLP matrices and other parameters, alike on every one
        totals["mlp"] += dense_layers * _dense_mlp(cfg, model_type, family, hidden)
        totals["other"] += dense_layers * (_activation_params(cfg)
                                           + (_mlp_bias(cfg, model_type, family, hidden) if mlp_bias else 0))
    layers = len(layout.types)
    if family.gated_norms:  # input_layernorm's gate on every layer: fc1 hidden -> rank, fc2 rank -> hidden
        totals["other_replicated"] += layers * 2 * hidden * cfg.int("gated_norm_rank")
    if family.hyper_connections:
        streams = cfg.int("hc_mult")
        # every layer's attention and MLP: fn (2 n x n h), base (2 n), scale (2); the head's: hc_fn (n x n h),
        # hc_base (n), hc_scale (1)
        totals["other_replicated"] += (layers * 2 * (2 * streams * streams * hidden + 2 * streams + 2)
                                       + streams * streams * hidden + streams + 1)
    return ParamCounts(embedding=embedding, lm_head=lm_head, **totals)


# DeepSeek's routers that pick a token's experts from its best n_group groups (`DeepseekV2TopkRouter`,
# `DeepseekV3TopkRouter` in transformers).
GROUPED_TOP_K = ("group_limited_greedy", "noaux_tc")


def read_widths(cfg: Fields, model_type: str, family: Family, hidden: int, layout: Layout) -> Widths | None:
    """The forward widths, and the small operations beside the GEMMs a layer runs (q/k norms, gates), which a
    serving engine launches as kernels of their own."""
    widths = _forward_widths(cfg, model_type, family, hidden, layout)
    if widths is None:
        return None
    return widths.model_copy(update={
        "query_key_norm": _has_qk_norm(cfg, family),
        "attention_gate": family.attention_gate is not None or family.output_gate,
        "shared_expert_gate": model_type in SHARED_EXPERT_GATES and widths.shared_expert_intermediate > 0})


def _has_qk_norm(cfg: Fields, family: Family) -> bool:
    """Whether the family's attention normalises q and k: always, or where the config flag it reads is set."""
    return family.qk_norm is not None and (family.qk_norm_field is None or cfg.flag(family.qk_norm_field))


def _forward_widths(cfg: Fields, model_type: str, family: Family, hidden: int, layout: Layout) -> Widths | None:
    """The forward widths: dense MLP (or shared expert) and routed expert intermediates, widest over layers.
    NAS blocks mix per-block FFN shapes that kvplan does not carry: no widths for them. Mamba and Mamba-2 have no
    MLP."""
    if model_type in FAMILY_WIDTHS:
        return FAMILY_WIDTHS[model_type](cfg, hidden, layout)
    if model_type == "nemotron_h":
        return _nemotron_h_widths(cfg, hidden, layout)
    if layout.blocks:
        return None
    if model_type in ATTENTION_FREE:
        return Widths(hidden=hidden, mlp_intermediate=0, mlp_activation=str(cfg.get("hidden_act", default="silu")))
    moe = MoE.read(cfg, model_type)
    dense = moe is None or model_type == "longcat_flash" or any(not moe.on_layer(i) for i in range(len(layout.types)))
    intermediate = intermediate_size(cfg, model_type, hidden) if dense else 0
    if moe is not None:
        intermediate = max(intermediate, moe.shared_intermediate)
    activation = cfg.get("hidden_act", "hidden_activation", "activation_function", "activation",
                         default="silu" if family.gated_mlp else "gelu")
    mla = cfg.has("kv_lora_rank")  # attention runs on decompressed heads: qk_nope + qk_rope and v_head_dim wide
    grouped = cfg.get("topk_method", default="greedy") in GROUPED_TOP_K
    return Widths(hidden=hidden, mlp_intermediate=intermediate, gated_mlp=family.gated_mlp,
                  mlp_activation=str(activation), experts_per_token=moe.top_k if moe else 0,
                  experts=moe.experts if moe else 0, expert_intermediate=moe.intermediate if moe else 0,
                  query_head_dim=layout.head_dim if mla else 0, value_head_dim=cfg.int("v_head_dim") if mla else 0,
                  shared_expert_intermediate=moe.shared_intermediate if moe else 0,
                  dense_layers=tuple(sorted(moe.dense_layers)) if moe else (),
                  query_rank=cfg.int("q_lora_rank", default=0, minimum=0) if mla else 0,
                  expert_groups=cfg.int("n_group", default=1) if moe and grouped else 1)


def _nemotron_h_widths(cfg: Fields, hidden: int, layout: Layout) -> Widths:
    """Nemotron-H: each block a single mixer, MLP or MoE (`NemotronHBlock`): the MLP blocks' intermediate_size and
    the MoE blocks' shared expert, up and down projections under ReLU squared (not gated), and their routed
    experts."""
    dense = cfg.int("intermediate_size") if "mlp" in layout.types else 0
    if "moe" not in layout.types:
        return Widths(hidden=hidden, mlp_intermediate=dense, gated_mlp=False, mlp_activation="relu2")
    experts = cfg.int("n_routed_experts")
    return Widths(hidden=hidden, mlp_intermediate=max(dense, cfg.int("moe_shared_expert_intermediate_size")),
                  gated_mlp=False, mlp_activation="relu2", experts=experts,
                  experts_per_token=experts_per_token(cfg, experts, "num_experts_per_tok"),
                  expert_intermediate=cfg.int("moe_intermediate_size"))


def _norms_per_layer(cfg: Fields, model_type: str, family: Family) -> int:
    """Falcon: the 7B-style parallel block shares one input LayerNorm; new_decoder_architecture has
    ln_attn and ln_mlp (or one, with num_ln_in_parallel_attn = 1)."""
    if model_type == "falcon":
        if cfg.flag("new_decoder_architecture"):
            return cfg.int("num_ln_in_parallel_attn", default=2)
        return 1 if cfg.flag("parallel_attn", default=True) else 2
    return family.norms_per_layer



def intermediate_size(cfg: Fields, model_type: str, hidden: int) -> int:
    if model_type == "lfm2":
        return lfm2_intermediate(cfg)
    if model_type == "xlstm":
        return round_up(hidden * cfg.number("ffn_proj_factor"), cfg.int("ffn_round_up_to_multiple_of"))
    if model_type in FOUR_X_MLP_FIELD:
        field = FOUR_X_MLP_FIELD[model_type]
        return cfg.int(field, default=4 * hidden) if field else 4 * hidden
    if model_type == "mpt":  # MPT states the MLP width as a multiple of d_model
        return cfg.int("expansion_ratio") * hidden
    if model_type == "gpt_neox_japanese":  # int(hidden x intermediate_multiple_size), as its MLP builds it
        return int(hidden * cfg.number("intermediate_multiple_size"))
    if model_type == "llama4_text":
        return cfg.int("intermediate_size_mlp", "intermediate_size")
    if model_type == "granitemoehybrid":  # its dense MLP is the shared one (`GraniteMoeHybridMLP`)
        return cfg.int("shared_intermediate_size")
    if model_type == "moshi":  # fc1 makes the gate and up halves together, ffn_dim wide (MoshiGatingMLP)
        return cfg.int("ffn_dim") // 2
    if model_type == "minimax_m3_vl_text":  # its experts are intermediate_size wide, its dense MLPs this
        return cfg.int("dense_intermediate_size")
    # Cohere2-MoE's dense prefix layers are prefix_dense_intermediate_size wide; its intermediate_size is the experts'
    return cfg.int("prefix_dense_intermediate_size", "intermediate_size", "n_inner", "ffn_hidden_size", "ffn_dim",
                   "dff", "dim_ff")



def lfm2_intermediate(cfg: Fields) -> int:
    """LFM2's MLP width (`Lfm2MLP`): block_ff_dim (Lfm2Config reads it over intermediate_size); with
    block_auto_adjust_ff_dim (default true) int(2 x width / 3), then, unless block_ffn_dim_multiplier is null
    (default 1.0), int(multiplier x width) rounded up to block_multiple_of (default 256)."""
    width = cfg.int("block_ff_dim", "intermediate_size")
    if not cfg.flag("block_auto_adjust_ff_dim", default=True):
        return width
    width = int(2 * width / 3)
    if "block_ffn_dim_multiplier" in cfg.data and not cfg.has("block_ffn_dim_multiplier"):  # null: no rounding
        return width
    multiplier = cfg.number("block_ffn_dim_multiplier") if cfg.has("block_ffn_dim_multiplier") else 1.0
    return round_up(int(multiplier * width), cfg.int("block_multiple_of", default=256))


def round_up(value: float, multiple: int) -> int:
    """value rounded up to a multiple, in the float arithmetic xLSTM's round_up_to_next_multiple_of uses."""
    return int(((value + multiple - 1) // multiple) * multiple)


def _dense_mlp(cfg: Fields, model_type: str, family: Family, hidden: int) -> int:
    intermediate = intermediate_size(cfg, model_type, hidden)
    return (3 if family.gated_mlp else 2) * hidden * intermediate



def _mlp_bias(cfg: Fields, model_type: str, family: Family, hidden: int) -> int:
    return intermediate_size(cfg, model_type, hidden) * (2 if family.gated_mlp else 1) + hidden



def _activation_params(cfg: Fields) -> int:
    """Learned parameters of the MLP's activation: xIELU (Apertus) learns alpha_p and alpha_n (transformers
    activations.py `XIELUActivation`)."""
    return 2 if cfg.get("hidden_act", default=None) == "xielu" else 0



def _mixer_params(cfg: Fields, model_type: str, family: Family, cache, hidden: int, heads: int,
                  head_dim: int) -> dict[str, int]:
    """A layer's attention or recurrent mixer, by parameter group: its matrices (`attention`), the biases, sinks
    and convolutions TP splits with the heads (`other`), and what every TP rank holds whole (MLA's down-projections,
    a DSA indexer's projections, norms: the `_replicated` groups)."""
    if isinstance(cache, MLALatent):
        groups = _mla_params(cfg, hidden, heads, family.gated_query)
        if family.output_gate:  # Hy V4: gate_proj to one v_head_dim gate per head, and a sink logit per head
            groups["attention"] += hidden * heads * cfg.int("v_head_dim")
            groups["other"] = heads
        return groups
    if isinstance(cache, IndexerKeys):
        return _indexer_params(cfg, model_type, hidden, cache.head_dim)
    if isinstance(cache, RecurrentState):
        if cache.mixer == "gated_deltanet":
            return _gated_deltanet_params(cfg, hidden)
        if cache.mixer == "kda":
            return _kda_params(cfg, hidden)
        matrices, other = mamba_params(cfg, model_type, cache.mixer)
        return {"attention": matrices, "other": other}
    if isinstance(cache, NoCache):
        replaced = "replaced by a linear" in cache.reason
        return {"attention": hidden * hidden if replaced else 0}
    q, k, v = heads * head_dim, cache.kv_heads * cache.head_dim, cache.kv_heads * cache.head_dim_v
    matrices = hidden * (q + k + v) + heads * cache.head_dim_v * hidden
    if family.attention_gate == "full":  # a gate per output element (Qwen3-Next's doubled q_proj, AFMoE's gate_proj)
        matrices += hidden * q
    elif family.attention_gate == "head":  # a gate per head (Laguna's g_proj)
        matrices += hidden * heads
    other = norms = 0
    if family.qkv_bias or cfg.flag(family.qkv_bias_field):
        other += q + k + v
    if family.o_bias or (family.o_bias_field and cfg.flag(family.o_bias_field)):
        other += hidden
    if _has_qk_norm(cfg, family):
        # whole on every rank: per head, and over all heads too where vLLM gathers q and k first (`olmoe.py`);
        # MiniMax-M2's all-head norms are split (`MiniMaxText01RMSNormTP`), less than 1 MB held whole here
        norm_width = 2 * head_dim if family.qk_norm == "head" else q + k
        norms += norm_width * (2 if family.qk_norm_bias else 1)
    if family.attention_sinks or (model_type == "mimo_v2_flash" and isinstance(cache, SlidingWindow)):
        other += heads  # attention sinks: one learned logit per head
    if family.output_gate:  # Beam: gate_proj (hidden -> heads x head_dim) and gate_bias
        matrices += hidden * heads * head_dim
        other += heads
    return {"attention": matrices, "other": other, "other_replicated": norms}



def _mla_params(cfg: Fields, hidden: int, heads: int, gated_query: bool = False) -> dict[str, int]:
    """DeepSeek MLA: q via q_lora_rank (or direct), kv_a (latent + rope), kv_b (latent -> heads), o.
    A gated query (A.X-K2 q_gate_proj) maps the query latent, normed and raw side by side (2 x q_lora_rank), to
    each head's query and a v_head_dim output gate.
    The down-projections q_a (hidden -> q_lora_rank) and kv_a (hidden -> kv_lora_rank + qk_rope_head_dim) make the
    latents every head reads: vLLM and SGLang hold them, and q_a_layernorm and kv_a_layernorm, whole on every TP
    rank (vLLM 0.33.0 `models/deepseek_v2.py` fused_qkv_a_proj, a MergedColumnParallelLinear with disable_tp;
    SGLang 0.5.23 fused_qkv_a_proj_with_mqa, a ReplicatedLinear), quantised with the other linear layers; q_b
    (or a direct q_proj), kv_b and o split by head."""
    nope, rope, v = cfg.int("qk_nope_head_dim"), cfg.int("qk_rope_head_dim", minimum=0), cfg.int("v_head_dim")
    latent = cfg.int("kv_lora_rank")
    q_rank = cfg.int("q_lora_rank", default=None)
    q_head = heads * (nope + rope)
    q_down, q_up = (hidden * q_rank, q_rank * q_head) if q_rank else (0, hidden * q_head)
    if gated_query:
        q_down, q_up = hidden * cfg.int("q_lora_rank"), 2 * cfg.int("q_lora_rank") * heads * (nope + rope + v)
    return {"attention": q_up + latent * heads * (nope + v) + heads * v * hidden,
            "attention_replicated": q_down + hidden * (latent + rope),
            "other_replicated": latent + (q_rank or 0)}  # kv_a_layernorm, q_a_layernorm



def _indexer_params(cfg: Fields, model_type: str, hidden: int, head_dim: int) -> dict[str, int]:
    """A DSA indexer (transformers `DeepseekV32Indexer`): wq_b from the query latent to index_n_heads x head_dim,
    wk to one head_dim key, weights_proj to one weight per head; k_norm is a LayerNorm (weight and bias). vLLM and
    SGLang hold all of it whole on every TP rank ("no tensor parallel, just replicated": vLLM 0.33.0
    `models/deepseek_v2.py` Indexer, SGLang 0.5.23 `layers/attention/dsa/dsa_indexer.py`), wq_b and wk quantised
    with the linear layers, weights_proj unquantised (quant_config=None; the checkpoint stores it in bf16).
    MiniMax-M3's (`MiniMaxM3VLIndexer`): q_proj and k_proj from the hidden state, which vLLM folds into the
    attention's qkv_proj and splits with it, RMSNorms on q and k."""
    index_heads = cfg.int("index_n_heads")
    if model_type == "minimax_m3_vl_text":
        return {"attention": hidden * (index_heads + 1) * head_dim, "other_replicated": 2 * head_dim}
    return {"attention_replicated": cfg.int("q_lora_rank") * index_heads * head_dim + hidden * head_dim,
            "other_replicated": hidden * index_heads + 2 * head_dim}


def _gated_deltanet_params(cfg: Fields, hidden: int) -> dict[str, int]:
    """Qwen3-Next Gated DeltaNet: in_proj_qkvz, in_proj_ba, conv1d (no bias), dt_bias, A_log, gated norm, out_proj.
    TP splits all but the gated norm, one value head wide (`RMSNormGated(head_v_dim)`, vLLM `qwen3_next.py`)."""
    hk, hv = cfg.int("linear_num_key_heads"), cfg.int("linear_num_value_heads")
    dk, dv, kernel = cfg.int("linear_key_head_dim"), cfg.int("linear_value_head_dim"), cfg.int("linear_conv_kernel_dim")
    key_dim, value_dim = hk * dk, hv * dv
    matrices = hidden * (2 * key_dim + 2 * value_dim) + hidden * 2 * hv + value_dim * hidden
    return {"attention": matrices, "other": (2 * key_dim + value_dim) * kernel + 2 * hv, "other_replicated": dv}



def _kda_params(cfg: Fields, hidden: int) -> dict[str, int]:
    """Kimi Delta Attention (transformers `KimiLinearDeltaAttention`): q, k, v projections to H x D each, their
    depthwise conv1d (no bias), the forget gate's low-rank f_a / f_b with dt_bias (H x D) and A_log (H), b_proj to
    one beta per head, the output gate's low-rank g_a / g_b, a gated RMSNorm over D and o_proj."""
    kda_heads, head_dim, kernel = kda_dims(cfg)
    width = kda_heads * head_dim
    matrices = 4 * hidden * width + 2 * (hidden * head_dim + head_dim * width) + hidden * kda_heads
    return {"attention": matrices, "other": 3 * width * kernel + width + kda_heads, "other_replicated": head_dim}



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



def experts_per_token(cfg: Fields, experts: int, *names: str) -> int:
    """The routed experts each token goes through (top-k), refused above the expert count: it would count more
    active parameters than the model has. With no experts (a dense model: Granite 4.0-H-1B states 0 experts, 0 per
    token) top-k may be absent or 0; a top-k above 0 is refused, as an MoE config with its expert count zeroed
    would otherwise be read as a dense model, its experts uncounted."""
    top_k = cfg.int(*names) if experts else cfg.int(*names, default=0, minimum=0)
    if top_k > experts:
        name = next((n for n in names if cfg.has(n)), names[0])
        raise KvplanError(f"{cfg.where}: {name} is {top_k} but the model has {experts} experts: experts per token "
                          "cannot exceed the expert count")
    return top_k


class MoE(NamedTuple):
    """Mixture-of-experts layout: routed experts (counted as `experts`), shared experts (`mlp`), router
    (`other_replicated`: a ReplicatedLinear in vLLM's MoE models, `GateLinear` in `models/deepseek_v2.py`; SGLang's
    `MoEGate`), routed experts' biases (`other`, split with the experts)."""

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
        n = cfg.int("num_local_experts", "n_routed_experts", "num_experts", "moe_num_experts", default=0, minimum=0)
        if not cfg.flag("is_moe", default=True):  # Doge states num_experts with is_moe false
            return None
        top_k = experts_per_token(cfg, n, "num_experts_per_tok", "experts_per_token", "num_experts_per_token",
                                  "moe_k", "moe_topk")
        if not n:  # a dense model (Granite 4.0-H-1B states 0 experts and 0 per token)
            return None
        hidden = cfg.int("hidden_size", "n_embd", "d_model", "dim")
        layers = cfg.layers("num_hidden_layers", "n_layer", "num_layers", "n_layers")
        size = cfg.int("moe_intermediate_size", "expert_ffn_hidden_size", "intermediate_size")
        if model_type == "hunyuan_v1_moe":  # experts and the one shared MLP are intermediate_size wide
            size = cfg.int("intermediate_size")
        expert, bias, router = 3 * hidden * size, 0, hidden * n
        if model_type == "gpt_oss":  # gate_up_proj + down_proj with biases; router with bias
            bias, router = 2 * size + hidden, hidden * n + n
        shared_size = 0
        shared_experts = cfg.int("n_shared_experts", "num_shared_experts", "moe_num_shared_experts", default=None,
                                 minimum=0)
        if shared_experts is not None:  # shared experts as wide as the routed ones
            shared_size = shared_experts * size
        elif cfg.has("shared_expert_intermediate_size"):
            shared_size = cfg.int("shared_expert_intermediate_size", minimum=0)
            if model_type in SHARED_EXPERT_GATES and shared_size:
                router += hidden  # shared_expert_gate
        elif cfg.has("shared_intermediate_size"):  # Granite MoE's shared_mlp
            shared_size = cfg.int("shared_intermediate_size", minimum=0)
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

    def add(self, totals: dict, layers: int = 1) -> None:
        """What `layers` MoE layers hold."""
        totals["experts"] += layers * self.experts * self.expert_size
        totals["active_experts"] += layers * self.top_k * self.expert_size
        totals["mlp"] += layers * self.shared
        totals["other_replicated"] += layers * self.router
        totals["other"] += layers * self.experts * self.expert_bias


def stated_dense_layers(cfg: Fields, layers: int) -> set[int] | None:
    """The layers with a dense MLP where the config states them per layer (transformers 5 `mlp_layer_types`,
    "dense" or "sparse", derived from the older fields when a config lacks it, so it alone counts when present);
    None where it does not."""
    if not cfg.has("mlp_layer_types"):
        return None
    kinds = cfg.list("mlp_layer_types", str, length=layers)
    if set(kinds) - {"dense", "sparse"}:
        raise KvplanError(f"{cfg.where}: field mlp_layer_types must hold \"dense\" or \"sparse\" for each "
                          f"layer, got {sorted(set(kinds) - {'dense', 'sparse'})}")
    return {i for i, kind in enumerate(kinds) if kind == "dense"}


def _dense_layers(cfg: Fields, model_type: str, layers: int) -> set[int]:
    """The layers of an MoE model that keep a dense MLP: as stated per layer, else from the older fields."""
    stated = stated_dense_layers(cfg, layers)
    if stated is not None:
        return stated
    first_dense = cfg.int("first_k_dense_replace", "num_dense_layers", default=0, minimum=0)  # AFMoE: the latter
    if first_dense > layers:
        raise KvplanError(f"{cfg.where}: first_k_dense_replace {first_dense:,} exceeds the {layers} layers")
    dense = set(range(first_dense))
    dense |= set(cfg.list("mlp_only_layers", int))
    if model_type == "jamba":  # experts on layers i % period == offset
        period, offset = cfg.int("expert_layer_period"), cfg.int("expert_layer_offset", minimum=0)
        dense |= {i for i in range(layers) if i % period != offset}
    elif cfg.has("moe_layer_freq"):  # DeepSeek: experts on layers i % freq == 0 (past first_k_dense_replace)
        dense |= {i for i in range(layers) if i % cfg.int("moe_layer_freq")}
    elif cfg.has("moe_layer_start_index"):  # ERNIE 4.5: from start to end (-1: the last layer), every interval-th
        start, end = cfg.int("moe_layer_start_index", minimum=0), cfg.get("moe_layer_end_index", default=-1)
        end = layers - 1 if end == -1 else cfg.int("moe_layer_end_index", minimum=0)
        interval = cfg.int("moe_layer_interval", default=1)
        dense |= {i for i in range(layers) if not (start <= i <= end and (i + 1) % interval == 0)}
    else:  # Qwen MoE decoder_sparse_step, Llama 4 interleave_moe_layer_step: every step-th layer
        step = cfg.int("decoder_sparse_step", "interleave_moe_layer_step", default=1)
        dense |= {i for i in range(layers) if (i + 1) % step}
    return dense


# ------------------------------------------------------------------------------------ families with rules of their own


def _with(counts: ParamCounts, **extra: int) -> ParamCounts:
    """`counts` with `extra` parameters added to the named groups."""
    return counts.model_copy(update={group: getattr(counts, group) + n for group, n in extra.items()})


def _bitnet_params(cfg: Fields, layout: Layout, hidden: int, heads: int) -> ParamCounts:
    """BitNet b1.58: Llama blocks with two sub-norms per layer, an RMSNorm over the attention output before o_proj
    (hidden_size wide) and one over the MLP intermediate before down_proj (modeling_bitnet.py attn_sub_norm,
    ffn_sub_norm)."""
    counts = block_params(cfg, "bitnet", FAMILIES["bitnet"], layout, hidden, heads)
    return _with(counts, other_replicated=len(layout.types) * (hidden + intermediate_size(cfg, "bitnet", hidden)))


def _diffllama_params(cfg: Fields, layout: Layout, hidden: int, heads: int) -> ParamCounts:
    """DiffLlama: Llama blocks whose differential attention learns lambda_q1, lambda_k1, lambda_q2 and lambda_k2,
    one head_dim vector each per layer; its group norm has no weights (modeling_diffllama.py)."""
    counts = block_params(cfg, "diffllama", FAMILIES["diffllama"], layout, hidden, heads)
    return _with(counts, other=len(layout.types) * 4 * layout.head_dim)


def _doge_params(cfg: Fields, layout: Layout, hidden: int, heads: int) -> ParamCounts:
    """Doge (modeling_doge.py): Llama-style blocks with per-head q/k norms and two learned residual scales per layer
    (input_residual, post_attention_residual: counted as two more hidden-sized norms). Its dynamic-mask attention
    adds dt_proj (the values, num_key_value_heads x head_dim -> one logit per KV head, biased with attention_bias)
    and A (one per KV head).
    With is_moe the MLP is a CDMoE: the dense MLP kept as a shared expert, a router of 2 x floor(sqrt(num_experts))
    keys, and two embedding tables of num_experts hidden-sized rows (down_embed, up_embed) of which each token
    reads num_experts_per_tok."""
    counts = block_params(Fields({**cfg.data, "is_moe": False}, cfg.where), "doge", FAMILIES["doge"], layout, hidden,
                          heads)
    attention = other = experts = active = 0
    for cache in layout.caches:
        attention += cache.kv_heads * cache.head_dim_v * cache.kv_heads
        other += cache.kv_heads * (2 if cfg.flag("attention_bias") else 1)
    router = 0
    if cfg.flag("is_moe"):
        layers, routed = len(layout.types), cfg.int("num_experts")
        router = layers * hidden * 2 * math.isqrt(routed)
        experts = layers * routed * 2 * hidden
        active = layers * cfg.int("num_experts_per_tok") * 2 * hidden
    return _with(counts, attention=attention, other=other, other_replicated=router, experts=experts,
                 active_experts=active)


def _git_params(cfg: Fields, layout: Layout, hidden: int, heads: int) -> ParamCounts:
    """GIT (GitForCausalLM): a BERT-style post-norm decoder (biased q, k, v, o and MLP; two LayerNorms per layer;
    learned positions and an embedding LayerNorm, counted as the final norm) with a biased output layer, and the
    CLIP vision tower and projector the causal-LM class always builds."""
    counts = block_params(cfg, "git", FAMILIES["git"], layout, hidden, heads)
    return _with(counts, vision=git_vision(cfg, hidden))


def _hyperclovax_params(cfg: Fields, layout: Layout, hidden: int, heads: int) -> ParamCounts:
    """HyperCLOVA X: Llama blocks, and with use_post_norm an RMSNorm after attention and one after the MLP
    (modeling_hyperclovax.py post_norm1, post_norm2)."""
    counts = block_params(cfg, "hyperclovax", FAMILIES["hyperclovax"], layout, hidden, heads)
    return _with(counts, other_replicated=len(layout.types) * 2 * hidden if cfg.flag("use_post_norm") else 0)


def _jetmoe_params(cfg: Fields, layout: Layout, hidden: int, heads: int) -> ParamCounts:
    """JetMoE (modeling_jetmoe.py): num_local_experts attention experts and as many MLP experts per layer, top_k of
    each per token. An attention expert (MoA) is a query projection hidden -> num_key_value_heads x kv_channels and an
    output projection back; keys and values come from one shared kv_proj. An MLP expert is gated: input_linear
    hidden -> 2 x intermediate_size and output_linear back. Each of the two has a router and an output bias; two
    RMSNorms per layer and a final one."""
    layers, vocab = len(layout.types), cfg.int("vocab_size")
    routed, top_k = cfg.int("num_local_experts"), cfg.int("num_experts_per_tok")
    width = cfg.int("num_key_value_heads") * cfg.int("kv_channels")
    expert = 2 * hidden * width + 3 * hidden * cfg.int("intermediate_size")  # one attention and one MLP expert
    tied = cfg.flag("tie_word_embeddings", default=True)
    return ParamCounts(embedding=vocab * hidden, lm_head=0 if tied else vocab * hidden,
                       attention=layers * hidden * 2 * width, mlp=0, experts=layers * routed * expert,
                       active_experts=layers * top_k * expert, other=layers * 2 * hidden,
                       other_replicated=layers * (2 * hidden * routed + 2 * hidden) + hidden)


def _laguna_params(cfg: Fields, layout: Layout, hidden: int, heads: int) -> ParamCounts:
    """Laguna: its attention output gate is one per head when gating is true or "per-head", one per head_dim
    element otherwise (modeling_laguna.py g_proj); layers may have query heads of their own."""
    gate = "head" if cfg.get("gating", default=True) in (True, "per-head") else "full"
    family = FAMILIES["laguna"]._replace(attention_gate=gate)
    return block_params(cfg, "laguna", family, layout, hidden, heads)


def _mllama_text_params(cfg: Fields, layout: Layout, hidden: int, heads: int) -> ParamCounts:
    """Llama 3.2 Vision's text decoder (MllamaForCausalLM): Llama blocks; a cross-attention layer has the same q, k,
    v and o (keys and values projected from the image features), per-head q and k norms and two tanh gates
    (cross_attn_attn_gate, cross_attn_mlp_gate); the embedding has vocab_size + 8 rows (modeling_mllama.py)."""
    kv_heads, cross = cfg.int("num_key_value_heads", default=heads), 0
    self_attention = []
    for cache in layout.caches:
        cross += isinstance(cache, NoCache)
        self_attention.append(FullAttention(layer=cache.layer, kv_heads=kv_heads, head_dim=layout.head_dim,
                                            head_dim_v=layout.head_dim))
    counts = block_params(cfg, "mllama_text_model", FAMILIES["mllama_text_model"],
                          layout.with_caches(self_attention), hidden, heads)
    return _with(counts, embedding=8 * hidden, other=cross * 2, other_replicated=cross * 2 * layout.head_dim)


def _moshi_params(cfg: Fields, layout: Layout, hidden: int, heads: int) -> ParamCounts:
    """Moshi's text transformer (MoshiForCausalLM): Llama blocks with a gated MLP of ffn_dim / 2 (intermediate_size)
    and an embedding of vocab_size + 1 rows (the extra one for padding)."""
    counts = block_params(cfg, "moshi", FAMILIES["moshi"], layout, hidden, heads)
    return _with(counts, embedding=hidden)


def _phi4_multimodal_params(cfg: Fields, layout: Layout, hidden: int, heads: int) -> ParamCounts:
    """Phi-4-multimodal (Phi4MultimodalForCausalLM): a Phi-3 decoder (fused qkv and gate_up projections, counted
    as Llama's) and the image and audio encoders the causal-LM class always builds."""
    counts = block_params(cfg, "phi4_multimodal", FAMILIES["phi4_multimodal"], layout, hidden, heads)
    return _with(counts, vision=phi4_multimodal_encoders(cfg, hidden))


def _stablelm_params(cfg: Fields, layout: Layout, hidden: int, heads: int) -> ParamCounts:
    """StableLM: with use_parallel_residual attention and MLP share the input LayerNorm, so there is no
    post_attention_layernorm (modeling_stablelm.py)."""
    counts = block_params(cfg, "stablelm", FAMILIES["stablelm"], layout, hidden, heads)
    return _with(counts, other_replicated=-len(layout.types) * 2 * hidden if cfg.flag("use_parallel_residual") else 0)


def _nemotron_h_moe(cfg: Fields, hidden: int, totals: dict) -> None:
    """A Nemotron-H MoE block (`NemotronHMoE`): routed experts of up and down projections (relu2, not gated),
    working in moe_latent_size when set, with the two latent projections around them; a shared expert of
    moe_shared_expert_intermediate_size; a router with one weight row and one correction bias per expert."""
    experts = cfg.int("n_routed_experts")
    top_k = experts_per_token(cfg, experts, "num_experts_per_tok")
    size, latent = cfg.int("moe_intermediate_size"), cfg.int("moe_latent_size", default=None)
    shared = cfg.int("moe_shared_expert_intermediate_size")
    expert = 2 * (latent or hidden) * size
    totals["experts"] += experts * expert
    totals["active_experts"] += top_k * expert
    totals["mlp"] += 2 * hidden * shared + (2 * hidden * latent if latent else 0)
    totals["other_replicated"] += experts * hidden + experts
    if cfg.flag("mlp_bias"):
        totals["other"] += shared + hidden + (latent + hidden if latent else 0)


def _embeddings(cfg: Fields, hidden: int) -> tuple[int, int]:
    """(embedding, lm_head): vocab x hidden each, lm_head 0 when tied."""
    vocab = cfg.int("vocab_size")
    return vocab * hidden, 0 if cfg.flag("tie_word_embeddings", default=True) else vocab * hidden


def mamba_lm_params(cfg: Fields, layout: Layout, hidden: int, heads: int, model_type: str) -> ParamCounts:
    """Mamba, Falcon-Mamba, Mamba-2 (`MambaBlock`, `Mamba2Block`): per layer one RMSNorm and the mixer, then
    norm_f; no attention, no MLP."""
    embedding, lm_head = _embeddings(cfg, hidden)
    mixer, other = mamba_params(cfg, model_type, MAMBA_MIXERS[model_type])
    layers = len(layout.types)
    return ParamCounts(embedding=embedding, lm_head=lm_head, attention=layers * mixer, mlp=0, experts=0,
                       active_experts=0, other=layers * other, other_replicated=layers * hidden + hidden)


def zamba_params(cfg: Fields, layout: Layout, hidden: int, heads: int, model_type: str) -> ParamCounts:
    """Zamba and Zamba2: every layer a Mamba mixer with its RMSNorm; each hybrid layer adds its own hidden x hidden
    `linear` and applies a shared transformer block, whose weights are counted once per block in use
    (`num_mem_blocks` of them in Zamba2, one in Zamba, taken in turn by the hybrid layers): attention from the
    2 x hidden concatenated input (q, k, v to heads of head_dim, o back to hidden), a gated MLP, two RMSNorms
    (2 x hidden and hidden). Zamba2 adds per hybrid layer LoRA adapters of adapter_rank on the MLP's gate_up_proj
    (hidden -> rank -> 2 x intermediate) and, with use_shared_attention_adapter, on q, k and v (2 x hidden -> rank ->
    2 x hidden each) (`Zamba2MLP`, `Zamba2Attention`)."""
    embedding, lm_head = _embeddings(cfg, hidden)
    mixer, mixer_other = mamba_params(cfg, model_type, MAMBA_MIXERS[model_type])
    hybrids = layout.types.count("hybrid")
    wide = 2 * hidden  # attention_hidden_size: the Mamba output beside the embedding output
    if model_type == "zamba":
        wide = cfg.int("attention_hidden_size", default=wide)
    intermediate = cfg.int("intermediate_size", default=4 * hidden)
    kv_heads, head_dim = read_kv_heads(cfg, model_type, heads), layout.head_dim
    blocks = min(hybrids, cfg.int("num_mem_blocks", default=1) if model_type == "zamba2" else 1)
    block_attention = wide * (heads + 2 * kv_heads) * head_dim + heads * head_dim * hidden
    block_bias = 2 * intermediate + hidden if cfg.flag("add_bias_linear") else 0
    attention = len(layout.types) * mixer + hybrids * hidden * hidden + blocks * block_attention
    mlp = blocks * 3 * hidden * intermediate
    if model_type == "zamba2":
        rank = cfg.int("adapter_rank")
        mlp += hybrids * (hidden * rank + rank * 2 * intermediate)
        if cfg.flag("use_shared_attention_adapter"):
            attention += hybrids * 3 * 2 * wide * rank
    norms = len(layout.types) * hidden + blocks * (wide + hidden) + hidden
    return ParamCounts(embedding=embedding, lm_head=lm_head, attention=attention, mlp=mlp, experts=0,
                       active_experts=0, other=len(layout.types) * mixer_other + blocks * block_bias,
                       other_replicated=norms)


def zaya_params(cfg: Fields, layout: Layout, hidden: int, heads: int) -> ParamCounts:
    """ZAYA (`modeling_zaya.py`), per layer: CCA attention (q to heads x head_dim, k to kv_heads x head_dim, the
    current and the delayed value halves, o), its depthwise (cca_time0) and grouped (cca_time1, one group per q and
    k head) convolutions over the q and k channels with biases, a key temperature per KV head; a router (down to
    router_hidden_size with bias, a scale on the previous layer's router state from layer 1 on, an MLP of norm,
    two biased square layers and an output over num_experts + 1 classes, the last a skip expert); routed gated
    experts; two RMSNorms and two residual scalings of four hidden-sized vectors. The model adds an input scale and
    bias and the final norm."""
    embedding, lm_head = _embeddings(cfg, hidden)
    kv_heads, head_dim = read_kv_heads(cfg, "zaya", heads), layout.head_dim
    q, kv = heads * head_dim, kv_heads * head_dim
    channels = q + kv
    bias = cfg.flag("attention_bias")
    attention = hidden * (q + 2 * kv) + q * hidden
    conv = channels * cfg.int("cca_time0") + channels + channels * head_dim * cfg.int("cca_time1") + channels
    attention_other = conv + kv_heads + ((q + 2 * kv + hidden) if bias else 0)
    experts, top_k = cfg.int("num_experts"), cfg.int("num_experts_per_tok")
    expert = 3 * hidden * cfg.int("moe_intermediate_size")
    router_width = cfg.int("router_hidden_size")
    router = hidden * router_width + router_width + router_width + 2 * (router_width**2 + router_width) \
        + router_width * (experts + 1)
    layers = len(layout.types)
    whole = layers * (router + 2 * hidden + 8 * hidden) + (layers - 1) * router_width + 2 * hidden + hidden
    other = layers * attention_other + (cfg.int("vocab_size") if cfg.flag("lm_head_bias") else 0)
    return ParamCounts(embedding=embedding, lm_head=lm_head, attention=layers * attention, mlp=0,
                       experts=layers * experts * expert, active_experts=layers * top_k * expert, other=other,
                       other_replicated=whole)


FAMILY_PARAMS.update({
    "modernbert-decoder": _modernbert_decoder_params,
    "bitnet": _bitnet_params, "diffllama": _diffllama_params, "doge": _doge_params, "git": _git_params,
    "hyperclovax": _hyperclovax_params, "jetmoe": _jetmoe_params, "laguna": _laguna_params,
    "mllama_text_model": _mllama_text_params, "moshi": _moshi_params, "phi4_multimodal": _phi4_multimodal_params,
    "stablelm": _stablelm_params,
    **{t: partial(mamba_lm_params, model_type=t) for t in ATTENTION_FREE},
    "zamba": partial(zamba_params, model_type="zamba"),
    "zamba2": partial(zamba_params, model_type="zamba2"),
    "zaya": zaya_params,
})


def gpt_neox_japanese_params(cfg: Fields, layout: Layout, hidden: int, heads: int) -> ParamCounts:
    """GPT-NeoX-Japanese: GPT-2-style blocks with no linear biases (FAMILIES), except the attention output bias
    that only the last layer has (`dense_bias`: use_bias = layer_number == num_hidden_layers - 1)."""
    family = FAMILIES["gpt_neox_japanese"]
    counts = block_params(cfg, "gpt_neox_japanese", family, layout, hidden, heads)
    return counts.model_copy(update={"other": counts.other + hidden})


def opt_params(cfg: Fields, layout: Layout, hidden: int, heads: int) -> ParamCounts:
    """OPT (modeling_opt.py): token embeddings word_embed_proj_dim wide, projected in and out of hidden_size when
    the two differ (no bias); positions max_position_embeddings + 2 rows (the padding offset); biases on every
    linear when enable_bias; LayerNorms (weight and bias) unless layer_norm_elementwise_affine is false; a
    final LayerNorm only with do_layer_norm_before and not _remove_final_layer_norm; lm_head from
    word_embed_proj_dim, tied to the embeddings unless tie_word_embeddings is false."""
    vocab, ffn, layers = cfg.int("vocab_size"), cfg.int("ffn_dim"), len(layout.types)
    width = cfg.int("word_embed_proj_dim", default=hidden)
    norm = 2 * hidden if cfg.flag("layer_norm_elementwise_affine", default=True) else 0
    biases = (4 * hidden + ffn + hidden) if cfg.flag("enable_bias", default=True) else 0
    final_norm = cfg.flag("do_layer_norm_before", default=True) and not cfg.flag("_remove_final_layer_norm")
    projections = 2 * hidden * width if width != hidden else 0
    return ParamCounts(
        embedding=vocab * width + (cfg.int("max_position_embeddings") + 2) * hidden,
        lm_head=0 if cfg.flag("tie_word_embeddings", default=True) else vocab * width,
        attention=layers * 4 * hidden * hidden, mlp=layers * 2 * hidden * ffn, experts=0, active_experts=0,
        other=layers * biases + projections, other_replicated=layers * 2 * norm + (norm if final_norm else 0))


def xlm_params(cfg: Fields, layout: Layout, hidden: int, heads: int) -> ParamCounts:
    """XLM (modeling_xlm.py): post-norm blocks with a LayerNorm on the embeddings and none at the end (FAMILIES),
    an MLP of 4 x emb_dim, the output projection tied with a bias, and a language embedding when n_langs > 1 and
    use_lang_emb. Every layer has its attention, cached or not (a bidirectional XLM caches nothing). An adaptive
    softmax (asm) is refused: its clusters are not counted."""
    if cfg.flag("asm"):
        raise KvplanError(f"{cfg.where}: field asm (adaptive softmax output) is not counted by kvplan")
    attention = [FullAttention(layer=i, kv_heads=heads, head_dim=layout.head_dim, head_dim_v=layout.head_dim)
                 for i in range(len(layout.types))]
    counts = block_params(cfg, "xlm", FAMILIES["xlm"], layout.with_caches(attention), hidden, heads)
    languages = cfg.int("n_langs", default=1)
    if languages > 1 and cfg.flag("use_lang_emb", default=True):
        counts = counts.model_copy(update={"embedding": counts.embedding + languages * hidden})
    return counts


FAMILY_PARAMS.update({"gpt_neox_japanese": gpt_neox_japanese_params, "opt": opt_params, "xlm": xlm_params})


def longcat_flash_params(cfg: Fields, layout: Layout, hidden: int, heads: int) -> ParamCounts:
    """LongCat-Flash blocks (transformers `LongcatFlashDecoderLayer`, vLLM `longcat_flash.py`): two MLA sublayers,
    two dense MLPs (ffn_hidden_size) and their four norms, and one MoE of n_routed_experts experts
    (expert_ffn_hidden_size) whose router also scores zero_expert_num zero-compute (identity) experts: a
    classifier and a correction bias over n + zero columns, no weights for the zero ones. transformers allocates
    gate_up_proj rows for the zero experts too (`LongcatFlashExperts`), which checkpoints do not hold."""
    vocab, blocks = cfg.int("vocab_size"), len(layout.types)
    moe = MoE.read(cfg, "longcat_flash")
    scored = moe.experts + cfg.int("zero_expert_num", default=0, minimum=0)
    mla = {group: 2 * blocks * count for group, count in _mla_params(cfg, hidden, heads).items()}
    router = hidden * scored + scored + (scored if cfg.flag("router_bias") else 0)
    return ParamCounts(
        embedding=vocab * hidden, lm_head=0 if cfg.flag("tie_word_embeddings") else vocab * hidden,
        attention=mla["attention"], attention_replicated=mla["attention_replicated"],
        mlp=blocks * 2 * 3 * hidden * cfg.int("ffn_hidden_size", "intermediate_size"),
        experts=blocks * moe.experts * moe.expert_size, active_experts=blocks * moe.top_k * moe.expert_size,
        other=0, other_replicated=mla["other_replicated"] + blocks * (router + 4 * hidden) + hidden)


FAMILY_PARAMS["longcat_flash"] = longcat_flash_params

