"""Every bundled model's parameter count against transformers' own model classes.

kvplan counts parameters from the config by its own rules (`kvplan.sources.hf_config`, docs/formulas.md section 6).
Here transformers builds each library model from the same config fields the profiler uses
(`kvplan.profiler.config.transformers_fields`), whole, on the meta device (shapes only: no memory, no weights), and
its parameters are counted. The two must agree to the parameter. Multimodal models are compared on their text
decoder; their vision towers are checked against transformers in test_profile.py.
"""

import pytest
from archkit import CHECKPOINT_BUFFERS

from kvplan.profiler import config as profile_config
from kvplan.sources import library
from kvplan.sources.hf_config import ENCODER_ONLY

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

def transformers_count(model_type: str, fields: dict, spec=None) -> int:
    """The model class the spec describes: an encoder's base model, an encoder-decoder's seq2seq class (the
    speech one for Whisper), else the causal LM."""
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
        model = auto.from_config(CONFIG_MAPPING[model_type](**fields))
    buffers = sum(b.numel() for name, b in model.named_buffers() if name.endswith(CHECKPOINT_BUFFERS))
    return sum(p.numel() for p in model.parameters()) + buffers  # parameters(): tied ones once


@pytest.mark.parametrize("model_id", [e.id for e in library.entries()])
def test_parameters_equal_transformers_modules(model_id):
    source = profile_config.resolve(model_id)
    data, spec = profile_config.first_layers(source, None)
    model_type, fields, _ = profile_config.transformers_fields(data)
    assert spec.params.total == transformers_count(model_type, fields, spec)


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
    assert spec.params.total == transformers_count(model_type, fields)
