"""Qwen4-Exp (`qwen4_exp_text`, the decoder of `qwen4_exp`): Gated DeltaNet layers and attention layers with a
QSA token indexer, four residual streams mixed by hyper-connections, and per-layer n-gram embeddings (PLE) on some
linear layers. Registered in `FAMILY_LAYOUTS` and `FAMILY_PARAMS`; every rule follows transformers 5.23's
`models/qwen4_exp/configuration_qwen4_exp.py` and `modeling_qwen4_exp.py`.

What a sequence keeps, layer by layer (`DynamicCache`):
    linear_attention   the Gated DeltaNet state (`gated_deltanet_state`); on a PLE layer also the PLE's dilated
                       convolution input, hc_count x hidden channels x (ple_conv_kernel_size - 1) x ngram_size
                       inputs in the model dtype (conv state 1), and the last ngram_size - 1 token ids as int64
                       (conv state 2, `Qwen4ExpTextNGramEmbedding`)
    indexed_attention  keys and values for every token, and the QSA indexer's raw key (indexer_head_dim, one
                       head, model dtype) for every token (`DynamicIndexedLayer.update_indexer`): the indexer
                       pools them into blocks of indexer_compress_ratio keys at every step, it stores no pooled key
                       (vLLM stores them otherwise: `kvplan.engines.vllm.families.qwen4_exp_specs`)
"""

from __future__ import annotations

from kvplan.errors import KvplanError
from kvplan.model import FullAttention, IndexerKeys, LayerCache, ParamCounts, RecurrentState
from kvplan.sources.hf_config.fields import Fields
from kvplan.sources.hf_config.layout import FAMILY_LAYOUTS, Layout, gated_deltanet_state, read_kv_heads
from kvplan.sources.hf_config.params import FAMILY_PARAMS, MoE

QWEN4_EXP = "qwen4_exp_text"
QWEN4_LAYER_TYPES = ("linear_attention", "indexed_attention")
# The QSA indexer's fields: `Qwen4ExpTextConfig.validate_architecture` asks for all or none, and every attention
# layer builds an indexer (`Qwen4ExpTextAttention`), so a model with attention layers needs all of them.
QSA_FIELDS = ("indexer_n_heads", "indexer_kv_heads", "indexer_head_dim", "indexer_budget", "indexer_compress_ratio")


def qwen4_layer_types(cfg: Fields, n: int) -> list[str]:
    """`layer_types`, where "full_attention" names an indexed layer (the released checkpoint's name, which the
    config class renames); without it every full_attention_interval-th layer (default 4) is indexed."""
    if not cfg.has("layer_types"):
        interval = cfg.int("full_attention_interval", default=4)
        return ["linear_attention" if (i + 1) % interval else "indexed_attention" for i in range(n)]
    types = ["indexed_attention" if t == "full_attention" else t for t in cfg.list("layer_types", str, length=n)]
    unknown = sorted(set(types) - set(QWEN4_LAYER_TYPES))
    if unknown:
        raise KvplanError(f"{cfg.where}: field layer_types holds {', '.join(map(repr, unknown))}; Qwen4-Exp layers are "
                          "linear_attention or indexed_attention (full_attention)")
    return types


def qsa_indexer(cfg: Fields) -> tuple[int, int]:
    """(query heads, head size) of the QSA indexer, after the config class's checks: every field set, one key
    head."""
    for name in QSA_FIELDS:
        if not cfg.has(name):
            raise KvplanError(f"{cfg.where}: missing field {name}: Qwen4-Exp's attention layers run a QSA indexer, "
                              f"which needs {', '.join(QSA_FIELDS)}")
    if cfg.int("indexer_kv_heads") != 1:
        raise KvplanError(f"{cfg.where}: field indexer_kv_heads is {cfg.int('indexer_kv_heads')}: Qwen4-Exp's QSA "
                          "indexer has one key head")
    return cfg.int("indexer_n_heads"), cfg.int("indexer_head_dim")


def ple_layers(cfg: Fields, types: list[str]) -> list[int]:
    """The 0-based layers with a per-layer n-gram embedding: `ple_layer_ids` counts from 1 and names linear
    layers only (`Qwen4ExpTextConfig.validate_architecture`)."""
    ids = sorted(set(cfg.list("ple_layer_ids", int)))
    for layer_id in ids:
        if not 1 <= layer_id <= len(types):
            raise KvplanError(f"{cfg.where}: field ple_layer_ids names layer {layer_id}; they count from 1 to "
                              f"{len(types)}")
        if types[layer_id - 1] != "linear_attention":
            raise KvplanError(f"{cfg.where}: field ple_layer_ids names layer {layer_id}, an attention layer; "
                              "Qwen4-Exp puts PLE on linear_attention layers only")
    if ids and cfg.int("number_of_conv_states", default=3) < 3:
        raise KvplanError(f"{cfg.where}: field number_of_conv_states is {cfg.int('number_of_conv_states')}, but its "
                          "PLE layers keep three states (Gated DeltaNet, PLE convolution, n-gram context)")
    if ids:
        heads = ngram_heads(cfg)
        if cfg.int("ple_embed_dim", "hidden_size") % heads:
            raise KvplanError(f"{cfg.where}: field ple_embed_dim must be a multiple of the {heads} n-gram heads "
                              "((ngram_size - 1) x heads_per_ngram)")
    return [layer_id - 1 for layer_id in ids]


def ngram_heads(cfg: Fields) -> int:
    return (cfg.int("ngram_size", minimum=2) - 1) * cfg.int("heads_per_ngram")


def ple_state(cfg: Fields, layer: int, hidden: int) -> RecurrentState:
    """A PLE layer's state: its dilated convolution (dilation ngram_size) keeps (kernel - 1) x ngram_size inputs
    of hc_count x hidden channels, exactly that many (`Qwen4ExpTextPLELayer.short_conv_state_len`), and its n-gram
    hash the last ngram_size - 1 token ids. Its projections are not split by tensor parallelism, so every GPU
    holds the whole state (vLLM `Qwen4ExpPLELayer`: disable_tp, `is_kv_cache_tp_replicated`)."""
    ngram = cfg.int("ngram_size", minimum=2)
    inputs = (cfg.int("ple_conv_kernel_size") - 1) * ngram
    return RecurrentState(layer=layer, mixer="ple", conv_elements=cfg.int("hc_count") * hidden * inputs,
                          ssm_elements=0, token_ids=ngram - 1, split_by_tensor_parallel=False)


def uses_mrope(cfg: Fields) -> bool:
    """Whether the rotary positions have three axes: an mrope_section in rope_parameters (or the older
    rope_scaling), as vLLM reads it (`uses_mrope`, transformers_utils/config.py)."""
    for name in ("rope_parameters", "rope_scaling"):
        rope = cfg.get(name, default=None)
        if isinstance(rope, dict) and isinstance(rope.get("mrope_section"), list):
            return True
    return False


def qwen4_layout(cfg: Fields, n: int, hidden: int, heads: int, notes: list[str]) -> Layout:
    types = qwen4_layer_types(cfg, n)
    head_dim = cfg.int("head_dim")
    attention = {"kv_heads": read_kv_heads(cfg, QWEN4_EXP, heads), "head_dim": head_dim, "head_dim_v": head_dim}
    index_head_dim = qsa_indexer(cfg)[1] if "indexed_attention" in types else 0
    indexer = {"head_dim": index_head_dim, "mrope": uses_mrope(cfg),
               "compress_ratio": cfg.int("indexer_compress_ratio") if index_head_dim else None}
    ple = set(ple_layers(cfg, types))
    caches: list[LayerCache] = []
    for i, layer_type in enumerate(types):
        if layer_type == "linear_attention":
            caches.append(gated_deltanet_state(cfg, i))
            if i in ple:
                caches.append(ple_state(cfg, i, hidden))
        else:
            caches += [FullAttention(layer=i, **attention), IndexerKeys(layer=i, **indexer)]
    return Layout(types=types, caches=caches, head_dim=head_dim)


MAX_NGRAM_HEADS = 100_000  # n-gram heads over all PLE layers: the released checkpoint has 16


def _is_prime(n: int) -> bool:
    """Miller-Rabin with the first twelve primes as witnesses: exact for every n below 3.3 x 10^24."""
    witnesses = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)
    if n < 2:
        return False
    if n in witnesses:
        return True
    if any(n % p == 0 for p in witnesses):
        return False
    odd, twos = n - 1, 0
    while odd % 2 == 0:
        odd, twos = odd // 2, twos + 1
    for witness in witnesses:
        x = pow(witness, odd, n)
        if x in (1, n - 1):
            continue
        for _ in range(twos - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def ngram_table_rows(cfg: Fields, ple_index: int) -> int:
    """Rows of the ple_index-th PLE layer's n-gram table (`Qwen4ExpTextNGramEmbedding`): each of its n-gram heads
    hashes into its own prime-sized vocabulary, the (g + 1)-th prime from ngram_vocab_size_base on for global head
    g = ple_index x heads + h (`_find_nth_prime_after`); their sum, padded to a multiple of
    make_ngram_vocab_size_divisible_by."""
    heads, prime = ngram_heads(cfg), cfg.int("ngram_vocab_size_base") - 1
    if (ple_index + 1) * heads > MAX_NGRAM_HEADS:
        raise KvplanError(f"{cfg.where}: field heads_per_ngram gives {(ple_index + 1) * heads:,} n-gram heads, not a "
                          f"real model (at most {MAX_NGRAM_HEADS:,} are read)")
    sizes = []
    for _ in range((ple_index + 1) * heads):
        prime += 1
        while not _is_prime(prime):
            prime += 1
        sizes.append(prime)
    divisor = cfg.int("make_ngram_vocab_size_divisible_by")
    return -(-sum(sizes[ple_index * heads:]) // divisor) * divisor


def _hyper_connection(cfg: Fields, hidden: int, combine: bool) -> int:
    """A gated residual (`Qwen4ExpTextGatedResidual`): a norm over the hc_count streams, a low-rank input mixer
    (hc x hidden -> hc_lowrank -> hc x hidden) and, in the layers, an injection weight per stream."""
    streams, rank = cfg.int("hc_count", minimum=2), cfg.int("hc_lowrank")
    width = streams * hidden
    return width + 2 * width * rank + (width * streams if combine else 0)


def qwen4_params(cfg: Fields, layout: Layout, hidden: int, heads: int) -> ParamCounts:
    """`Qwen4ExpForCausalLM`, block by block (no final norm: the streams' mixer ends the model):
        embeddings   vocab x hidden, and the output projection unless tied
        linear       Gated DeltaNet: in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, out_proj, the depthwise conv1d
                     (no bias), dt_bias and A_log per value head, a gated norm over the value head size
        attention    q_proj to heads x head_dim x 2 (query and output gate), k_proj, v_proj, o_proj (biases with
                     attention_bias), per-head q and k norms; the QSA indexer's index_qk_proj to
                     (indexer_n_heads + 1) x indexer_head_dim and its q and k norms
        MoE          every layer: num_experts gated experts, a router, a shared expert and its one-logit gate
        residuals    two gated residuals per layer and the model's final mixer (`_hyper_connection`)
        PLE          per PLE layer: the n-gram table (`ngram_table_rows` x ple_embed_dim / n-gram heads), key and
                     value projections from ple_embed_dim (to hc x hidden and hidden), three norms over hc x hidden,
                     and the depthwise conv1d (hc x hidden x ple_conv_kernel_size)
    Norms, routers and the gated residuals are whole on every TP rank (vLLM `models/qwen4_exp`: ReplicatedLinear
    mixers, `other_replicated`)."""
    vocab = cfg.int("vocab_size")
    tied = cfg.flag("tie_word_embeddings")
    embedding = vocab * hidden
    totals = {"attention": 0, "mlp": 0, "experts": 0, "active_experts": 0, "other": 0,
              "other_replicated": _hyper_connection(cfg, hidden, combine=False)}
    moe = MoE.read(cfg, QWEN4_EXP)
    key_heads, value_heads = cfg.int("linear_num_key_heads"), cfg.int("linear_num_value_heads")
    key_dim = key_heads * cfg.int("linear_key_head_dim")
    value_dim = value_heads * cfg.int("linear_value_head_dim")
    conv_dim = 2 * key_dim + value_dim
    head_dim, kv_heads = layout.head_dim, read_kv_heads(cfg, QWEN4_EXP, heads)
    q, kv = heads * head_dim, kv_heads * head_dim
    for layer_type in layout.types:
        if layer_type == "linear_attention":
            totals["attention"] += hidden * (conv_dim + value_dim + 2 * value_heads) + value_dim * hidden
            totals["other"] += conv_dim * cfg.int("linear_conv_kernel_dim") + 2 * value_heads
            totals["other_replicated"] += cfg.int("linear_value_head_dim")  # the gated norm
        else:
            index_heads, index_dim = qsa_indexer(cfg)
            totals["attention"] += hidden * (2 * q + 2 * kv) + q * hidden + hidden * (index_heads + 1) * index_dim
            totals["other_replicated"] += 2 * head_dim + 2 * index_dim
            totals["other"] += (2 * q + 2 * kv + hidden) if cfg.flag("attention_bias") else 0
        moe.add(totals)
        totals["other_replicated"] += 2 * _hyper_connection(cfg, hidden, combine=True)
    width, embed_dim = cfg.int("hc_count") * hidden, cfg.int("ple_embed_dim", "hidden_size")
    for ple_index in range(len(ple_layers(cfg, layout.types))):
        embedding += ngram_table_rows(cfg, ple_index) * (embed_dim // ngram_heads(cfg))
        totals["mlp"] += embed_dim * width + embed_dim * hidden
        totals["other_replicated"] += 3 * width
        totals["other"] += width * cfg.int("ple_conv_kernel_size")
    return ParamCounts(embedding=embedding, lm_head=0 if tied else vocab * hidden, **totals)


FAMILY_LAYOUTS[QWEN4_EXP] = qwen4_layout
FAMILY_PARAMS[QWEN4_EXP] = qwen4_params
