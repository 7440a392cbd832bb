"""EAGLE draft heads: a config.json that describes the draft of EAGLE or EAGLE-3 speculative decoding
(`kvplan.model.EagleHead`), not a model to serve.

Such a config reads as a Llama decoder of num_hidden_layers layers (usually 1), with the fields vLLM 0.33.0 and
SGLang 0.5.23 read to build the head around those layers (vLLM model_executor/models/llama_eagle.py and
llama_eagle3.py, `LlamaModel.__init__`; SGLang srt/models/llama_eagle.py and llama_eagle3.py):
    draft_vocab_size                  rows of an EAGLE-3 head's own lm_head (default vocab_size)
    target_hidden_size                width of the model's hidden states the head fuses (default hidden_size)
    num_aux_hidden_states             how many of them fc fuses, else the length of
                                      eagle_config.eagle_aux_hidden_state_layer_ids, else 3
    eagle_config.use_aux_hidden_state False: no fc (vLLM)
    norm_before_fc                    (also in eagle_config) an RMSNorm over fc's whole input
    fc_norm (SGLang also use_aux_norm)  an RMSNorm over each fused hidden state
    bias                              EAGLE's own field; vLLM's Llama layers read it as attention bias
A config is an EAGLE head when its architectures name an EAGLE class (vLLM's registry.py and SGLang's EntryClass
names) or, for model_type llama, when it states one of the fields above, which no Llama model's config has (EAGLE-1
configs name plain LlamaForCausalLM and state `bias`). kvplan sizes the Llama heads only (`LLAMA_EAGLE_CLASSES`).
"""

from __future__ import annotations

from kvplan.errors import KvplanError
from kvplan.model import EagleHead
from kvplan.sources.hf_config.fields import Fields

# The Llama EAGLE classes of vLLM 0.33.0 (registry.py: EagleLlamaForCausalLM in llama_eagle.py, Eagle3LlamaForCausalLM
# and LlamaForCausalLMEagle3 in llama_eagle3.py) and SGLang 0.5.23 (LlamaForCausalLMEagle, LlamaForCausalLMEagle3).
LLAMA_EAGLE_CLASSES = ("EagleLlamaForCausalLM", "Eagle3LlamaForCausalLM", "LlamaForCausalLMEagle",
                       "LlamaForCausalLMEagle3")
EAGLE_FIELDS = ("draft_vocab_size", "target_hidden_size", "num_aux_hidden_states", "eagle_config", "norm_before_fc",
                "fc_norm", "use_aux_norm", "bias")


def eagle_architecture(top: Fields) -> str | None:
    """The EAGLE class a config's architectures name, if any (vLLM's speculator classes carry "Eagle" in their
    names; Eagle2.5-VL, whose name ends ForConditionalGeneration, is a model)."""
    return next((str(a) for a in top.list("architectures")
                 if "eagle" in str(a).lower() and not str(a).endswith("ForConditionalGeneration")), None)


def read_eagle_head(top: Fields, cfg: Fields, model_type: str) -> EagleHead | None:
    """The head's fields, or None for a config that is no EAGLE head. `top` is the config as given, `cfg` its
    decoder fields. An EAGLE head of another family is refused, naming it."""
    named = eagle_architecture(top)
    stated = model_type == "llama" and any(cfg.data.get(field) is not None for field in EAGLE_FIELDS)
    if named is None and not stated:
        return None
    if model_type != "llama" or (named is not None and named not in LLAMA_EAGLE_CLASSES):
        raise KvplanError(f"{top.where}: field architectures names {named or model_type}, an EAGLE draft head kvplan "
                          f"does not size: it sizes Llama EAGLE heads ({', '.join(LLAMA_EAGLE_CLASSES)}, or "
                          "LlamaForCausalLM with model_type llama)")
    eagle_config = cfg.mapping("eagle_config")
    layer_ids = eagle_config.list("eagle_aux_hidden_state_layer_ids", int)
    use_aux = eagle_config.flag("use_aux_hidden_state", default=True)
    norm_before_fc = eagle_config.flag("norm_before_fc", default=cfg.flag("norm_before_fc"))
    return EagleHead(
        architecture=named or next(iter(top.list("architectures")), "LlamaForCausalLM"),
        draft_vocab_size=cfg.int("draft_vocab_size", default=None),
        target_hidden_size=cfg.int("target_hidden_size", default=None),
        aux_hidden_states=cfg.int("num_aux_hidden_states", default=None) or len(layer_ids) or None,
        use_aux_hidden_state=use_aux, norm_before_fc=norm_before_fc, fc_norm=cfg.flag("fc_norm"),
        use_aux_norm=cfg.flag("use_aux_norm"), bias=cfg.flag("bias"))
