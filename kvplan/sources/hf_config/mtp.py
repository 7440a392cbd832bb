"""Multi-token-prediction (MTP) layers: the draft layers a checkpoint ships beside its decoder, which vLLM and SGLang
run for speculative decoding (`kvplan.model.MtpLayers`).

Each MTP layer is one more decoder layer, built as the model's layer at index num_hidden_layers + k would be
(vLLM builds `mtp_block` from the model's own decoder-layer class at that index), plus the fusion that feeds it the
previous hidden state and the next token's embedding. So its cache and weights are read by the model's own rules
for a config one layer longer, and the difference is the MTP layer; the fusion is added by family, from the vLLM
0.33.0 model files:
    deepseek_mtp.py (DeepSeek-V3, and DeepSeek-V3.2 and GLM-5 through deepseek_v32/*/mtp.py), glm4_moe_mtp.py
        per layer: eh_proj (2h -> h, an nn.Linear in the model dtype), enorm, hnorm and shared_head.norm (h each)
    qwen3_next_mtp.py, qwen3_5_mtp.py
        once: fc (2h -> h, quantised with the model), norm, pre_fc_norm_hidden, pre_fc_norm_embedding (h each);
        the layers are full-attention layers whatever the model's layer_types say
The embeddings and the output head (shared_head.head) are the model's: vLLM shares them with the draft
(`SpecDecodeBaseProposer._maybe_share_embeddings` and `_maybe_share_lm_head`, "Detected MTP model"), so they are
not counted again.
"""

from __future__ import annotations

from typing import NamedTuple

from kvplan.errors import KvplanError
from kvplan.model import MtpLayers, ParamCounts
from kvplan.sources.hf_config.families import DSA_MODEL_TYPES, Family
from kvplan.sources.hf_config.fields import MAX_LAYERS, Fields
from kvplan.sources.hf_config.layout import Layout, indexer_layers, read_layout
from kvplan.sources.hf_config.params import decoder_params


class MtpRule(NamedTuple):
    """Where a family states its MTP layer count (and the count vLLM assumes when the config does not), and
    whether its fusion is per layer (DeepSeek's eh_proj) or once for all of them (Qwen's fc)."""

    field: str
    default: int
    fusion_per_layer: bool


DEEPSEEK_MTP = MtpRule("num_nextn_predict_layers", 0, fusion_per_layer=True)
QWEN_MTP = MtpRule("mtp_num_hidden_layers", 0, fusion_per_layer=False)
MTP_RULES = {
    "deepseek_v3": DEEPSEEK_MTP, "deepseek_v32": DEEPSEEK_MTP, "glm_moe_dsa": DEEPSEEK_MTP, "glm4_moe": DEEPSEEK_MTP,
    # Qwen3-Next's configs state no count; vLLM's Qwen3NextMultiTokenPredictor takes num_nextn_predict_layers, 1 if
    # absent (its checkpoints ship one MTP layer)
    "qwen3_next": MtpRule("num_nextn_predict_layers", 1, fusion_per_layer=False),
    "qwen3_5_text": QWEN_MTP, "qwen3_5_moe_text": QWEN_MTP,
}
MTP_FAMILIES = "DeepSeek-V3, DeepSeek-V3.2, GLM-4.5, GLM-5, Qwen3-Next and Qwen3.5"


def read_mtp(cfg: Fields, model_type: str, family: Family, layout: Layout, params: ParamCounts, hidden: int,
             heads: int) -> MtpLayers | None:
    """The MTP layers of a family MTP_RULES knows, or None (no such layers, or a family whose MTP layers kvplan
    does not model: a speculative decoder asked to run them is refused)."""
    rule = MTP_RULES.get(model_type)
    if rule is None:
        return None
    count = cfg.int(rule.field, default=rule.default, minimum=0)
    n = len(layout.types)
    if n + count > MAX_LAYERS:  # checked before the layers are built, one by one
        raise KvplanError(f"{cfg.where}: field {rule.field} is {count:,}: with the {n:,} decoder layers, more layers "
                          f"than any real model (at most {MAX_LAYERS:,} are read)")
    if not count or (model_type in DSA_MODEL_TYPES and len(indexer_layers(cfg, model_type, n)) < n):
        return None  # GLM-5.2 shares indexers between layers; which its MTP layer runs is not stated
    longer = dict(cfg.data, num_hidden_layers=n + count, layer_types=[*layout.types, *["full_attention"] * count])
    if isinstance(cfg.data.get("mlp_layer_types"), list) and cfg.data["mlp_layer_types"]:
        longer["mlp_layer_types"] = [*cfg.data["mlp_layer_types"], *cfg.data["mlp_layer_types"][-1:] * count]
    wider = Fields(longer, cfg.where)
    with_mtp = read_layout(wider, model_type, n + count, hidden, heads, [])
    total = decoder_params(wider, model_type, family, with_mtp, hidden, heads)
    delta = {group: getattr(total, group) - getattr(params, group) for group in ParamCounts.model_fields}
    fusions = count if rule.fusion_per_layer else 1
    if rule.fusion_per_layer:  # eh_proj in the model dtype (an nn.Linear vLLM does not quantise or split), 3 norms
        delta["other_replicated"] += fusions * (2 * hidden * hidden + 3 * hidden)
    else:  # fc, quantised with the decoder's linear layers (a ColumnParallelLinear), and three norms
        delta["mlp"] += 2 * hidden * hidden
        delta["other_replicated"] += 3 * hidden
    delta.update(embedding=0, lm_head=0, vision=0)  # the model's own (a vision tower is not in decoder_params)
    # Its parts are validated already (the count, the layout's caches, ParamCounts): validating them again would
    # build MtpLayers' own schema, the whole LayerCache union a second time beside ModelSpec's.
    return MtpLayers.model_construct(layers=count, caches=tuple(c for c in with_mtp.caches if c.layer >= n),
                                     params=ParamCounts(**delta))
