"""Architectures kvplan has no family rule for, taken from transformers' own config classes (their defaults are the
published checkpoints' shapes): kvplan's prediction must equal the cache transformers really builds, or kvplan
must refuse the model in one line. What it must never do is read such a model as plain attention and print a
KV figure that is wrong with no sign of it.

Each model is built with its first layers only (`--layers`, which also exercises the cut of per-layer fields
such as `mlp_layer_types`), vocabulary, MLP and expert widths shrunk and windows of 16 tokens, so that ctx 40
crosses them; the cache does not depend on the shrunk widths.
"""

import json

import pytest
from conftest import assert_one_line_error, run_main

from kvplan.errors import KvplanError
from kvplan.sources.hf_config import model_from_config

pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers import CONFIG_MAPPING  # noqa: E402

from kvplan.profiler import run as profile_run  # noqa: E402

SHRUNK_WIDTHS = {"intermediate_size": 64, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32,
                 "vocab_size": 512}
WINDOW_FIELDS = ("sliding_window", "attention_chunk_size")
WINDOW = 16

# Read through rules kvplan has for other families (Llama-style attention, layer_types, MLA, Gated DeltaNet).
EXACT = ["apertus", "exaone4", "exaone_moe", "glm4", "glm4_moe_lite", "jetmoe", "mimo_v2_flash", "minicpm3", "olmo3",
         "olmo_hybrid", "qwen3_5", "seed_oss", "smollm3", "starcoder2", "vaultgemma"]
# Their layers keep what kvplan's layer kinds do not hold: DSA indexer keys, KV shared across layers, per-layer
# head sizes, Mamba or RG-LRU state beside attention, short-convolution state.
REFUSED = {"deepseek_v32": "index_head_dim", "glm_moe_dsa": "index_head_dim", "gemma3n_text": "num_kv_shared_layers",
           "gemma4_text": "per_layer_config", "falcon_h1": "mamba_d_state", "bamba": "mamba_d_state",
           "zamba2": "mamba_d_state", "recurrent_gemma": "lru_width", "mamba2": "state_size", "lfm2": "conv_L_cache",
           "kimi_linear": "linear_num_heads"}


def default_config(model_type: str) -> dict:
    if model_type not in CONFIG_MAPPING:
        pytest.skip(f"this transformers has no {model_type}")
    return CONFIG_MAPPING[model_type]().to_dict()


def shrunk_copy(tmp_path, model_type: str) -> str:
    data = default_config(model_type)
    decoder = data["text_config"] if isinstance(data.get("text_config"), dict) else data
    for field, width in SHRUNK_WIDTHS.items():
        if isinstance(decoder.get(field), int):
            decoder[field] = width
    for field in ("num_experts", "n_routed_experts", "num_local_experts"):
        if isinstance(decoder.get(field), int) and decoder[field] > 4:
            decoder[field] = 4
            decoder["num_experts_per_tok"] = min(decoder.get("num_experts_per_tok") or 2, 2)
    for field in WINDOW_FIELDS:
        if isinstance(decoder.get(field), int) and decoder[field] > WINDOW:
            decoder[field] = WINDOW
    for field in ("pad_token_id", "bos_token_id", "eos_token_id"):
        if isinstance(decoder.get(field), int) and decoder[field] >= SHRUNK_WIDTHS["vocab_size"]:
            decoder[field] = 0
    path = tmp_path / f"{model_type}.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("model_type", EXACT)
def test_cache_of_an_unruled_architecture_equals_the_prediction(tmp_path, model_type):
    result = profile_run.run_profile(shrunk_copy(tmp_path, model_type), 40, 1, device="cpu", dtype="fp32",
                                     layers=4, decode_steps=2)
    assert result.layers == 4 < result.total_layers
    assert result.measured_kv_bytes == result.predicted_kv_bytes > 0
    assert result.measured_kv_after_prefill_bytes == result.predicted_kv_after_prefill_bytes
    assert all(row.measured == row.predicted for row in result.by_kind)


@pytest.mark.parametrize("model_type", list(REFUSED))
def test_unmodelled_caches_are_refused_naming_the_field(model_type):
    with pytest.raises(KvplanError, match=f"cannot lay out .*{REFUSED[model_type]}"):
        model_from_config(default_config(model_type), model_type, "test")


def edited_copy(tmp_path, model_type: str, **fields) -> str:
    path = tmp_path / f"{model_type}.json"
    data = json.loads(open(shrunk_copy(tmp_path, model_type), encoding="utf-8").read()) | fields
    path.write_text(json.dumps(data), encoding="utf-8")
    return str(path)


def test_a_config_transformers_rejects_is_one_line(tmp_path, monkeypatch, capsys):
    """transformers validates fields kvplan does not read: YaRN rope scaling needs its factor."""
    path = edited_copy(tmp_path, "glm4", rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0})
    code, _, err = run_main(monkeypatch, capsys, "profile", "--model", path, "--ctx", "40", "--device", "cpu",
                            "--layers", "1", "--decode-steps", "2")
    assert_one_line_error(code, err, "rejects this glm4 config", "factor")


def test_a_model_transformers_cannot_build_is_one_line(tmp_path, monkeypatch, capsys):
    path = edited_copy(tmp_path, "glm4", hidden_act="no_such_activation")
    code, _, err = run_main(monkeypatch, capsys, "profile", "--model", path, "--ctx", "40", "--device", "cpu",
                            "--layers", "1", "--decode-steps", "2")
    assert_one_line_error(code, err, "failed building its glm4 model", "no_such_activation")


def test_model_code_failing_is_one_line(tmp_path, monkeypatch, capsys):
    """X-MOD's forward raises until a language is set: transformers' code failing on a config it accepted."""
    code, _, err = run_main(monkeypatch, capsys, "profile", "--model", shrunk_copy(tmp_path, "xmod"), "--ctx", "40",
                            "--device", "cpu", "--layers", "1", "--decode-steps", "2")
    assert_one_line_error(code, err, "failed running xmod on 1 x 38 tokens", "ValueError")
