"""GPT-2-era decoders whose cache is not plain keys and values, read by rules of their own (registered in
`layout.FAMILY_LAYOUTS`, `params.FAMILY_PARAMS` and `params.FAMILY_WIDTHS`), each following its transformers 5.23
modeling file:

    XLNet     Transformer-XL memories: each layer's input hidden states (`XLNetModel.cache_mem`)
    Reformer  each layer's normed input hidden states, and on LSH layers their hash buckets (`ReformerDynamicCache`)
    CPM-Ant   keys and values of the prompt_length prompt tokens it puts before every sequence (`CpmAntModel`)

No serving engine runs them (`engines.Engine.check_caches`). Their forward widths are not given: their prefill
works in tensors (relative positions, two-stream attention, LSH sorting) the activation model does not size.
"""

from __future__ import annotations

import math

from kvplan.errors import KvplanError
from kvplan.model import FullAttention, LayerCache, NoCache, ParamCounts, PrefixedAttention, TokenStates
from kvplan.sources.hf_config.fields import Fields
from kvplan.sources.hf_config.layout import FAMILY_LAYOUTS, Layout
from kvplan.sources.hf_config.params import FAMILY_PARAMS, FAMILY_WIDTHS

INT64_BYTES = 8


# ---------------------------------------------------------------------------------------------------- XLNet


def xlnet_head_dim(cfg: Fields, hidden: int, heads: int) -> int:
    """d_head, which XLNetConfig requires to be d_model / n_head (its validate_architecture)."""
    if hidden % heads or cfg.int("d_head", default=hidden // heads) != hidden // heads:
        raise KvplanError(f"{cfg.where}: XLNet's d_head must be d_model / n_head ({hidden} / {heads}), as "
                          "transformers' XLNetConfig requires")
    return hidden // heads


def xlnet_layout(cfg: Fields, n: int, hidden: int, heads: int, notes: list[str]) -> Layout:
    """XLNet (`XLNetModel`): with use_mems_eval (its default) each layer keeps its input hidden states, d_model
    values per token in the model dtype, for the last mem_len tokens, or for every token when mem_len is null or 0
    (the published checkpoints': `cache_mem` then keeps all of them). reuse_len, a pretraining setting, keeps only
    the first reuse_len tokens of each forward pass, so what is held would depend on how the prompt is fed: refused.
    Without use_mems_eval nothing is kept: each step runs the whole sequence again."""
    head_dim = xlnet_head_dim(cfg, hidden, heads)
    types = ["full_attention"] * n
    if cfg.int("reuse_len", default=0, minimum=0):
        raise KvplanError(f"{cfg.where}: field reuse_len makes XLNet cache only the first reuse_len tokens of each "
                          "forward pass (a pretraining setting), so what it holds depends on how the prompt is fed; "
                          "kvplan sizes reuse_len null")
    if not cfg.flag("use_mems_eval", default=True):
        notes.append("use_mems_eval is false: XLNet keeps no memories, so each token runs the whole sequence again")
        caches: list[LayerCache] = [NoCache(layer=i, reason="use_mems_eval false: no memories kept")
                                    for i in range(n)]
        return Layout(types=types, caches=caches, head_dim=head_dim)
    memory = cfg.int("mem_len", default=None, minimum=0) or None
    caches = [TokenStates(layer=i, holds="hidden states", width=hidden, memory=memory) for i in range(n)]
    return Layout(types=types, caches=caches, head_dim=head_dim)


def xlnet_params(cfg: Fields, layout: Layout, hidden: int, heads: int) -> ParamCounts:
    """XLNet (`XLNetLMHeadModel`): word embeddings and a d_model mask embedding; per layer the q, k, v, o and
    relative-position r projections (d_model x n_head x d_head each), three per-head biases (r_w, r_r, r_s) and a
    segment embedding (2 x n_head x d_head), two LayerNorms and an MLP of d_inner with biases; the output
    projection, tied to the embeddings unless tie_word_embeddings is false, with a vocab-sized bias; no final
    norm."""
    vocab, inner, layers = cfg.int("vocab_size"), cfg.int("d_inner"), len(layout.types)
    width = heads * layout.head_dim
    per_layer_other = 5 * width + 2 * 2 * hidden + inner + hidden
    return ParamCounts(embedding=vocab * hidden, lm_head=0 if cfg.flag("tie_word_embeddings") else vocab * hidden,
                       attention=layers * 5 * hidden * width, mlp=layers * 2 * hidden * inner, experts=0,
                       active_experts=0, other=layers * per_layer_other + hidden + vocab)


# -------------------------------------------------------------------------------------------------- Reformer


def reformer_kinds(cfg: Fields, n: int) -> list[str]:
    kinds = cfg.list("attn_layers", str, length=n)
    if not kinds or set(kinds) - {"local", "lsh"}:
        raise KvplanError(f"{cfg.where}: field attn_layers must name each of the {n} layers \"local\" or \"lsh\"")
    return kinds


def reformer_chunks(cfg: Fields, kinds: list[str]) -> list[int]:
    """The chunk lengths of the attention kinds the model has: a prompt longer than the shortest is padded to a
    multiple of their least common multiple (`ReformerModel.forward`: `_get_min_chunk_len`,
    `_get_least_common_mult_chunk_len`)."""
    fields = {"local": "local_attn_chunk_length", "lsh": "lsh_attn_chunk_length"}
    return [cfg.int(fields[kind]) for kind in sorted(set(kinds))]


def reformer_hashed_after(cfg: Fields, kinds: list[str]) -> int:
    """The longest prompt whose prefill does not hash: LSH layers run LSH attention (and so hash) on more than
    lsh_attn_chunk_length tokens as padded (`reformer_chunks`). Where the local chunk does not divide the LSH chunk,
    that pads any prompt past the shorter chunk beyond the LSH chunk."""
    lsh = cfg.int("lsh_attn_chunk_length")
    chunks = reformer_chunks(cfg, kinds)
    return lsh if math.lcm(*chunks) == lsh else min(chunks)


def reformer_layout(cfg: Fields, n: int, hidden: int, heads: int, notes: list[str]) -> Layout:
    """Reformer as a decoder (`ReformerModelWithLMHead`, is_decoder): every layer caches its normed input hidden
    states, hidden_size values per token in the model dtype, for every token (`ReformerDynamicCache.states_cache`);
    an LSH layer also caches each token's hash bucket for each of its heads and num_hashes rounds, int64
    (`buckets_cache`), once the prompt was hashed (`reformer_hashed_after`). Both are computed for the prompt as
    padded (`reformer_chunks`), and right after prefill transformers holds them so (the cut to the prompt is a view).
    A prompt too short to be hashed gets its buckets when decoding reaches lsh_attn_chunk_length tokens, appended
    to an empty float placeholder and so stored as float32 (4 bytes, not 8): kvplan sizes the int64 case, the
    larger. A Reformer that is not a decoder is a masked LM attending both ways: nothing is kept between tokens."""
    kinds = reformer_kinds(cfg, n)
    head_dim = cfg.int("attention_head_size")
    types = [f"{kind}_attention" for kind in kinds]
    if not cfg.flag("is_decoder"):
        notes.append("is_decoder is false: a masked-LM Reformer attends both ways, so no layer can cache")
        return Layout(types=types, head_dim=head_dim, caches=[
            NoCache(layer=i, reason="bidirectional attention (is_decoder false)") for i in range(n)])
    chunks = reformer_chunks(cfg, kinds)
    padding = {"pad_multiple": math.lcm(*chunks), "pad_above": min(chunks)}
    after = reformer_hashed_after(cfg, kinds)
    buckets = heads * cfg.int("num_hashes")
    caches: list[LayerCache] = []
    for i, kind in enumerate(kinds):
        caches.append(TokenStates(layer=i, holds="hidden states", width=hidden, **padding))
        if kind == "lsh":
            caches.append(TokenStates(layer=i, holds="hash buckets", width=buckets, after=after,
                                      element_bytes=INT64_BYTES, **padding))
    return Layout(types=types, caches=caches, head_dim=head_dim)


def reformer_positions(cfg: Fields, hidden: int) -> int:
    """Axial position embeddings, one table of axial_pos_shape[i] x axial_pos_embds_dim[i] per axis
    (`AxialPositionEmbeddings`), or one of max_position_embeddings x hidden_size (`PositionEmbeddings`)."""
    if not cfg.flag("axial_pos_embds"):
        return cfg.int("max_position_embeddings") * hidden
    shape, dims = cfg.list("axial_pos_shape", int), cfg.list("axial_pos_embds_dim", int)
    if not shape or len(shape) != len(dims) or min(shape + dims) < 1:
        raise KvplanError(f"{cfg.where}: fields axial_pos_shape and axial_pos_embds_dim must give a positive size "
                          "and width for each axis")
    return sum(size * width for size, width in zip(shape, dims, strict=True))


def reformer_params(cfg: Fields, layout: Layout, hidden: int, heads: int) -> ParamCounts:
    """Reformer (`ReformerModelWithLMHead`): word and position embeddings (`reformer_positions`); per layer a
    LayerNorm, the attention of num_attention_heads x attention_head_size (an LSH layer shares one query_key
    projection, a local layer has query and key; then value and the output dense, no biases), a LayerNorm and an
    MLP of feed_forward_size with biases; a LayerNorm over the two reversible streams (2 x hidden_size) and the
    output projection from both, with a bias, never tied (it is twice as wide as the embeddings)."""
    vocab, ff, layers = cfg.int("vocab_size"), cfg.int("feed_forward_size"), len(layout.types)
    width = heads * layout.head_dim
    projections = sum(2 if kind == "lsh_attention" else 3 for kind in layout.types)
    per_layer_other = 2 * 2 * hidden + ff + hidden
    return ParamCounts(embedding=vocab * hidden + reformer_positions(cfg, hidden), lm_head=vocab * 2 * hidden,
                       attention=(projections + layers) * hidden * width, mlp=layers * 2 * hidden * ff, experts=0,
                       active_experts=0, other=layers * per_layer_other + 2 * 2 * hidden + vocab)


# --------------------------------------------------------------------------------------------------- CPM-Ant


def cpmant_layout(cfg: Fields, n: int, hidden: int, heads: int, notes: list[str]) -> Layout:
    """CPM-Ant (`CpmAntModel`): multi-head attention with heads of dim_head on every layer, whose DynamicCache holds
    the prompt_length prompt tokens the model puts before every sequence and the sequence itself."""
    head_dim = cfg.int("dim_head")
    prefix = cfg.int("prompt_length", minimum=0)
    attention = {"kv_heads": heads, "head_dim": head_dim, "head_dim_v": head_dim}
    caches: list[LayerCache] = [PrefixedAttention(layer=i, prefix=prefix, **attention) if prefix
                                else FullAttention(layer=i, **attention) for i in range(n)]
    return Layout(types=["full_attention"] * n, caches=caches, head_dim=head_dim)


def cpmant_params(cfg: Fields, layout: Layout, hidden: int, heads: int) -> ParamCounts:
    """CPM-Ant (`CpmAntForCausalLM`): input embeddings of the vocabulary and prompt_types x prompt_length prompt
    tokens, segment embeddings (segment_types); per layer an RMS LayerNorm (weight only), q, k, v and output
    projections of num_attention_heads x dim_head, a LayerNorm and a gated MLP of dim_ff (w_0, w_1, w_out), no
    biases; a final LayerNorm; relative position biases per head for segment_types^2 segment pairs and
    position_bias_num_buckets distances; the output projection over the vocabulary, never tied (the checkpoint
    holds lm_head.weight)."""
    vocab, layers, segments = cfg.int("vocab_size"), len(layout.types), cfg.int("segment_types")
    prompts = cfg.int("prompt_types", minimum=0) * cfg.int("prompt_length", minimum=0)
    width = heads * layout.head_dim
    buckets = segments * segments + cfg.int("position_bias_num_buckets")
    return ParamCounts(embedding=(vocab + prompts) * hidden + segments * hidden, lm_head=vocab * hidden,
                       attention=layers * 4 * hidden * width, mlp=layers * 3 * hidden * cfg.int("dim_ff"),
                       experts=0, active_experts=0, other=layers * 2 * hidden + hidden + buckets * heads)


FAMILY_LAYOUTS.update(xlnet=xlnet_layout, reformer=reformer_layout, cpmant=cpmant_layout)
FAMILY_PARAMS.update(xlnet=xlnet_params, reformer=reformer_params, cpmant=cpmant_params)
FAMILY_WIDTHS.update(dict.fromkeys(("xlnet", "reformer", "cpmant"), lambda cfg, hidden, layout: None))
