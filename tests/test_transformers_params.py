"""Every bundled model's parameter count against transformers' own model classes.

kvplan counts parameters from the config by its own rules (`kvplan.sources.hf_config`, docs/formulas.md section 6).
Here transformers builds each library model from the same config fields the profiler uses
(`kvplan.profiler.config.transformers_fields`), whole, on the meta device (shapes only: no memory, no weights), and
its parameters are counted. The two must agree to the parameter. Multimodal models are compared on their text
decoder; their vision towers are checked against transformers in test_profile.py.
"""

from functools import cache

import pytest
from archkit import CHECKPOINT_BUFFERS

from kvplan.profiler import config as profile_config
from kvplan.sources import library
from kvplan.sources.hf_config import ENCODER_ONLY

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

def transformers_model(model_type: str, fields: dict, spec=None):
    """The model class the spec describes, on the meta device: an encoder's base model, an encoder-decoder's
    seq2seq class (the speech one for Whisper), else the causal LM."""
    from transformers import (
        CONFIG_MAPPING,
        AutoModel,
        AutoModelForCausalLM,
        AutoModelForSeq2SeqLM,
        AutoModelForSpeechSeq2Seq,
    )

    if model_type not in CONFIG_MAPPING:
        pytest.skip(f"transformers {transformers.__version__} has no {model_type} (remote code only)")
    kinds = {c.kind for c in spec.caches} if spec is not None else set()
    if "cross" in kinds:
        auto = AutoModelForSpeechSeq2Seq if model_type == "whisper" else AutoModelForSeq2SeqLM
    elif model_type in ENCODER_ONLY or kinds == {"none"}:
        auto = AutoModel
    else:
        auto = AutoModelForCausalLM
    with torch.device("meta"):
        return auto.from_config(CONFIG_MAPPING[model_type](**fields))


def transformers_count(model) -> int:
    buffers = sum(b.numel() for name, b in model.named_buffers() if name.endswith(CHECKPOINT_BUFFERS))
    return sum(p.numel() for p in model.parameters()) + buffers  # parameters(): tied ones once


@cache
def library_model(model_id: str):
    """(kvplan's spec, transformers' model) of a library model, built once for the tests below."""
    source = profile_config.resolve(model_id)
    data, spec = profile_config.first_layers(source, None)
    model_type, fields, _ = profile_config.transformers_fields(data)
    return spec, transformers_model(model_type, fields, spec)


@pytest.mark.parametrize("model_id", [e.id for e in library.entries()])
def test_parameters_equal_transformers_modules(model_id):
    spec, model = library_model(model_id)
    assert spec.params.total == transformers_count(model)


@pytest.mark.parametrize("model_id", [e.id for e in library.entries()])
def test_block_operations_match_transformers_modules(model_id):
    """The small operations beside a layer's GEMMs that kvplan reads from the config (the kernels a decode step
    launches, `kvplan.speed.work`) are those transformers' modules hold: q and k norms in the attention, its output
    gate (a gate projection, or Qwen3-Next's q_proj twice the output's width), a shared expert's gate."""
    spec, model = library_model(model_id)
    if spec.widths is None:
        pytest.skip("no forward widths")
    attention = next((m for m in model.modules() if getattr(m, "q_proj", None) is not None
                      and (getattr(m, "o_proj", None) or getattr(m, "out_proj", None)) is not None), None)
    if attention is None:
        pytest.skip("no attention module with q_proj")
    out = attention.o_proj if getattr(attention, "o_proj", None) is not None else attention.out_proj
    qk_norm = any(getattr(attention, name, None) is not None for name in ("q_norm", "q_layernorm"))
    gated = any(hasattr(attention, name) for name in ("gate_proj", "g_proj")) \
        or attention.q_proj.out_features == 2 * out.in_features
    shared_gate = any(name.endswith("shared_expert_gate") for name, _ in model.named_modules())
    widths = spec.widths
    assert (widths.query_key_norm, widths.attention_gate, widths.shared_expert_gate) == (qk_norm, gated, shared_gate)


# Architectures with no bundled model whose counts follow kvplan's rules to the parameter: MLA with no head_dim
# (GLM-4.7-Flash), dense layers named by mlp_layer_types and routers with a correction bias (MiMo-V2-Flash), V heads
# narrower than K heads with sinks on sliding layers (MiMo-V2-Flash), q/k norms over all heads (MiniMax-M2).
# transformers' config defaults are the published shapes.
@pytest.mark.parametrize("model_type", ["glm4_moe_lite", "mimo_v2_flash", "minimax_m2", "solar_open", "minicpm3"])
def test_transformers_default_configs_count_exactly(model_type):
    from transformers import CONFIG_MAPPING

    from kvplan.sources.hf_config import model_from_config

    if model_type not in CONFIG_MAPPING:
        pytest.skip(f"transformers {transformers.__version__} has no {model_type}")
    data = CONFIG_MAPPING[model_type]().to_dict()
    spec = model_from_config(data, model_type, "transformers defaults")
    _, fields, _ = profile_config.transformers_fields(data)
    assert spec.params.total == transformers_count(transformers_model(model_type, fields))
