"""DeepSeek V4 (transformers 5.23 `configuration_deepseek_v4.py` and `modeling_deepseek_v4.py`; DeepSeek-V4 paper §2).

Every layer is shared-KV multi-query attention: one head_dim-wide row per token serves as key and value for all
query heads (num_key_value_heads is not read: the model always has one), kept for the last sliding_window tokens.
Its `layer_types` add a compressor: "compressed_sparse_attention" (CSA) folds every m tokens into one entry whose
windows overlap, and runs a lightning indexer with its own compressed keys (index_head_dim); "heavily_compressed_
attention" (HCA) folds every m' tokens, without overlap or indexer; "sliding_attention" has no compressor.
m and m' are `compress_rates` (4 and 128 by default). Every layer routes to experts: the first `mlp_layer_types`
"hash_moe" layers pick them from a token-id table (`tid2eid`), the rest by top-k.

The config's backward-compatible forms are folded in as `DeepseekV4Config.__post_init__` does: per-layer
`compress_ratios` (0, 4, 128) for layer_types, `compress_rate_csa` / `compress_rate_hca` over compress_rates, and
`num_hash_layers` (3 by default) for mlp_layer_types. Lists longer than the model (a checkpoint's compress_ratios
also lists its multi-token-prediction layer) are cut to num_hidden_layers, as there.
"""

from __future__ import annotations

from kvplan.errors import KvplanError
from kvplan.model import CompressedKV, LayerCache, ParamCounts, SlidingKV, Widths
from kvplan.sources.hf_config.families import MODEL_TYPE_DEFAULTS
from kvplan.sources.hf_config.fields import Fields
from kvplan.sources.hf_config.layout import FAMILY_LAYOUTS, Layout
from kvplan.sources.hf_config.params import FAMILY_PARAMS, FAMILY_WIDTHS

MODEL_TYPE = "deepseek_v4"
SLIDING, CSA, HCA = "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"
# DeepseekV4Config's defaults (DeepSeek-V4-Flash's shape) for the fields this reader uses.
DEFAULTS = {
    "vocab_size": 129_280, "hidden_size": 4096, "moe_intermediate_size": 2048, "num_hidden_layers": 43,
    "num_attention_heads": 64, "head_dim": 512, "q_lora_rank": 1024, "num_experts_per_tok": 6,
    "n_routed_experts": 256, "max_position_embeddings": 1_048_576, "hc_mult": 4, "sliding_window": 128,
    "o_groups": 8, "o_lora_rank": 1024, "index_n_heads": 64, "index_head_dim": 128, "tie_word_embeddings": False,
}
DEFAULT_COMPRESS_RATES = {CSA: 4, HCA: 128}
LEGACY_RATE_FIELDS = {CSA: "compress_rate_csa", HCA: "compress_rate_hca"}
COMPRESS_RATIO_TYPES = {0: SLIDING, 4: CSA, 128: HCA}  # the legacy per-layer compress_ratios
DEFAULT_HASH_LAYERS = 3


def per_layer(cfg: Fields, name: str, item: type, n: int) -> list:
    """A per-layer list cut to the model's n layers; fewer than n entries is an error (transformers cuts longer
    lists and refuses shorter ones)."""
    values = cfg.list(name, item)
    if len(values) < n:
        raise KvplanError(f"{cfg.where}: field {name} has {len(values)} entries for the {n} layers: it needs one "
                          "for each layer")
    return values[:n]


def layer_types(cfg: Fields, n: int) -> list[str]:
    """layer_types, else compress_ratios (0 sliding, 4 CSA, 128 HCA), else transformers' default: two HCA layers,
    then HCA and CSA in turn."""
    if cfg.has("layer_types"):
        types = per_layer(cfg, "layer_types", str, n)
        unknown = sorted(set(types) - {SLIDING, CSA, HCA})
        if unknown:
            raise KvplanError(f"{cfg.where}: field layer_types has layer type {unknown[0]!r}: DeepSeek V4 layers are "
                              f"{SLIDING}, {CSA} or {HCA}")
        return types
    if cfg.has("compress_ratios"):
        ratios = per_layer(cfg, "compress_ratios", int, n)
        unknown = sorted(set(ratios) - COMPRESS_RATIO_TYPES.keys())
        if unknown:
            raise KvplanError(f"{cfg.where}: field compress_ratios has {unknown[0]}: DeepSeek V4's per-layer ratios "
                              "are 0 (sliding window only), 4 (CSA) or 128 (HCA)")
        return [COMPRESS_RATIO_TYPES[r] for r in ratios]
    return [HCA] * min(n, 2) + [CSA if i % 2 else HCA for i in range(max(n - 2, 0))]


def compress_rates(cfg: Fields, types: list[str]) -> dict[str, int]:
    """The compression rate of each compressed layer type: compress_rates (a dict by layer type; the defaults, 4 and
    128, only when it is absent), overridden by compress_rate_csa / compress_rate_hca."""
    rates = cfg.mapping("compress_rates")
    out = {}
    for layer_type in (CSA, HCA):
        legacy = LEGACY_RATE_FIELDS[layer_type]
        if cfg.has(legacy):
            out[layer_type] = cfg.int(legacy)
        elif rates.has(layer_type):
            out[layer_type] = rates.int(layer_type)
        elif cfg.has("compress_rates"):  # stated: no defaults fill it in
            if layer_type in types:
                raise KvplanError(f"{rates.where}: no rate for {layer_type}, which layer {types.index(layer_type)} "
                                  "is")
        else:
            out[layer_type] = DEFAULT_COMPRESS_RATES[layer_type]
    return out


def hash_layers(cfg: Fields, n: int) -> list[bool]:
    """Which layers route by the token-id table: mlp_layer_types' "hash_moe" entries, else the first
    num_hash_layers (3 by default)."""
    if cfg.has("mlp_layer_types"):
        kinds = per_layer(cfg, "mlp_layer_types", str, n)
        unknown = sorted(set(kinds) - {"hash_moe", "moe"})
        if unknown:
            raise KvplanError(f"{cfg.where}: field mlp_layer_types has {unknown[0]!r}: DeepSeek V4 layers are "
                              "hash_moe or moe")
        return [kind == "hash_moe" for kind in kinds]
    first = cfg.int("num_hash_layers", default=DEFAULT_HASH_LAYERS, minimum=0)
    return [i < first for i in range(n)]


def deepseek_v4_layout(cfg: Fields, n: int, hidden: int, heads: int, notes: list[str]) -> Layout:
    """Each layer's sliding K=V window; CSA and HCA layers add their compressed entries (and CSA its indexer's
    compressed keys), with the compressor state their `CompressedKV` describes."""
    types = layer_types(cfg, n)
    rates = compress_rates(cfg, types)
    head_dim, window = cfg.int("head_dim"), cfg.int("sliding_window")
    caches: list[LayerCache] = []
    for i, layer_type in enumerate(types):
        caches.append(SlidingKV(layer=i, head_dim=head_dim, window=window))
        if layer_type == CSA:
            caches += [CompressedKV(layer=i, head_dim=head_dim, ratio=rates[CSA], overlap=True),
                       CompressedKV(layer=i, head_dim=cfg.int("index_head_dim"), ratio=rates[CSA], overlap=True,
                                    indexer=True)]
        elif layer_type == HCA:
            caches.append(CompressedKV(layer=i, head_dim=head_dim, ratio=rates[HCA], overlap=False))
    return Layout(types=types, caches=caches, head_dim=head_dim)


def hyper_connection(streams: int, hidden: int) -> int:
    """One `DeepseekV4HyperConnection`: fn maps the hc_mult flattened streams to (2 + n) x n weights (pre, post
    and the n x n comb), base (2 + n) x n, scale 3."""
    weights = (2 + streams) * streams
    return weights * streams * hidden + weights + 3


def deepseek_v4_params(cfg: Fields, layout: Layout, hidden: int, heads: int) -> ParamCounts:
    """Parameters as `DeepseekV4ForCausalLM` builds them, per layer:
        attention  q_a (hidden -> q_lora_rank), q_b (-> heads x head_dim), kv_proj (hidden -> head_dim), the grouped
                   output projection o_a (o_groups blocks of heads x head_dim / o_groups -> o_lora_rank, so
                   heads x head_dim x o_lora_rank) and o_b (o_groups x o_lora_rank -> hidden); q_a_norm, kv_norm
                   and a sink logit per head in `other`
        compressor HCA: kv_proj and gate_proj (hidden -> head_dim), position_bias (m x head_dim), kv_norm; CSA: the
                   same twice as wide (2 x head_dim, overlapping windows), and its indexer: kv_proj and gate_proj
                   (hidden -> 2 x index_head_dim), position_bias (m x 2 x index_head_dim), kv_norm, q_b_proj
                   (q_lora_rank -> index_n_heads x index_head_dim), weights_proj (hidden -> index_n_heads)
        MoE        routed experts (3 x hidden x moe_intermediate_size each), one shared expert of the same width
                   (n_shared_experts is not read; biases with mlp_bias), a router of one row per expert with an
                   e_score_correction_bias, or on hash layers the token-id table tid2eid (vocab x top-k ids, which
                   the checkpoint stores)
        streams    two hyper-connections (`hyper_connection`), two RMSNorms
    and for the model the embedding, the head's hyper-connection (hc_fn n x n hidden, hc_base n, hc_scale 1), the
    final norm and lm_head. Multi-token-prediction layers are not built (num_nextn_predict_layers).
    vLLM 0.33.0 (`vllm/models/deepseek_v4`) holds whole on every TP rank q_a and kv_proj (fused_wqa_wkv, disable_tp),
    the compressors and the indexer (`attention_replicated`; its weights_proj unquantised, `other_replicated`), and
    the norms, routers, position biases and hyper-connections (`other_replicated`); q_b, o_a, o_b and the sinks
    split by head."""
    vocab = cfg.int("vocab_size")
    head_dim, q_rank = cfg.int("head_dim"), cfg.int("q_lora_rank")
    o_rank, o_groups = cfg.int("o_lora_rank"), cfg.int("o_groups")
    if heads * head_dim % o_groups:
        raise KvplanError(f"{cfg.where}: field o_groups ({o_groups}) must divide the {heads} heads x {head_dim} "
                          "attention output into equal groups")
    experts, top_k, width = cfg.int("n_routed_experts"), cfg.int("num_experts_per_tok"), cfg.int(
        "moe_intermediate_size")
    if top_k > experts:
        raise KvplanError(f"{cfg.where}: {top_k} experts per token but only {experts} experts: num_experts_per_tok "
                          "cannot exceed n_routed_experts")
    streams = cfg.int("hc_mult")
    expert = 3 * hidden * width
    # per layer: the heads' projections; q_a and kv_proj; sinks and the MLP's biases; q_a_norm, kv_norm, the
    # hyper-connections and the two norms
    split = {"attention": q_rank * heads * head_dim + heads * head_dim * o_rank + o_groups * o_rank * hidden,
             "attention_replicated": hidden * q_rank + hidden * head_dim,
             "other": heads + (2 * width + hidden if cfg.flag("mlp_bias") else 0),
             "other_replicated": q_rank + head_dim + 2 * hyper_connection(streams, hidden) + 2 * hidden}
    totals = dict.fromkeys(split, 0)
    for i, hashed in enumerate(hash_layers(cfg, len(layout.types))):
        for group, count in split.items():
            totals[group] += count
        totals["other_replicated"] += experts * hidden + (vocab * top_k if hashed else experts)  # the router
        for cache in layout.layer(i):
            if isinstance(cache, CompressedKV):
                for group, count in compressor_params(cfg, cache, hidden, q_rank).items():
                    totals[group] += count
    layers = len(layout.types)
    tied = cfg.flag("tie_word_embeddings")
    totals["other_replicated"] += streams * streams * hidden + streams + 1 + hidden
    return ParamCounts(embedding=vocab * hidden, lm_head=0 if tied else vocab * hidden, mlp=layers * expert,
                       experts=layers * experts * expert, active_experts=layers * top_k * expert, **totals)


def compressor_params(cfg: Fields, cache: CompressedKV, hidden: int, q_rank: int) -> dict[str, int]:
    """A compressor (`DeepseekV4HCACompressor`, `DeepseekV4CSACompressor`) or the CSA indexer (`DeepseekV4Indexer`),
    which also projects its queries and per-head weights, by parameter group: every TP rank holds all of it."""
    width = cache.projection_width
    groups = {"attention_replicated": 2 * hidden * width, "other_replicated": cache.ratio * width + cache.head_dim}
    if cache.indexer:
        index_heads = cfg.int("index_n_heads")
        groups["attention_replicated"] += q_rank * index_heads * cache.head_dim
        groups["other_replicated"] += hidden * index_heads  # weights_proj, unquantised (quant_config=None)
    return groups


def deepseek_v4_widths(cfg: Fields, hidden: int, layout: Layout) -> Widths:
    """Every layer runs top-k routed experts beside one shared expert, all moe_intermediate_size wide."""
    width = cfg.int("moe_intermediate_size")
    return Widths(hidden=hidden, mlp_intermediate=width, mlp_activation=str(cfg.get("hidden_act", default="silu")),
                  experts_per_token=cfg.int("num_experts_per_tok"), expert_intermediate=width)


MODEL_TYPE_DEFAULTS[MODEL_TYPE] = DEFAULTS
FAMILY_LAYOUTS[MODEL_TYPE] = deepseek_v4_layout
FAMILY_PARAMS[MODEL_TYPE] = deepseek_v4_params
FAMILY_WIDTHS[MODEL_TYPE] = deepseek_v4_widths
