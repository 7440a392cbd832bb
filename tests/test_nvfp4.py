"""NVFP4 weights (`--weights-dtype nvfp4`) and TensorRT Model Optimizer (ModelOpt) checkpoints' quantisation
configs, against a published checkpoint size and a genuine hf_quant_config.json (tests/data/README.md)."""

import json
import shutil

import pytest
from conftest import DATA, raw, run_main

from kvplan.dtypes import weight_dtype
from kvplan.memory import estimate, weights_bytes
from kvplan.sources import load_model
from kvplan.sources.hf_config import model_from_config, read_config_file


def test_nvfp4_is_16_e2m1_values_and_an_fp8_scale():
    # NVFP4 (NVIDIA, TensorRT Model Optimizer): a block of 16 4-bit E2M1 values, 8 bytes, and one FP8 E4M3 scale
    nvfp4 = weight_dtype("nvfp4")
    assert (nvfp4.block_elements, nvfp4.block_bytes, nvfp4.bits) == (16, 9, 4.5)
    assert nvfp4.bytes_for(18_432) == 18_432 // 2 + 18_432 // 16  # a DeepSeek-R1 down_proj row: U8 + F8_E4M3


def test_llama_70b_in_nvfp4_is_the_published_checkpoint_to_the_scales():
    """nvidia/Llama-3.3-70B-Instruct-NVFP4 @ ec8feebb: model.safetensors.index.json total_size 42,709,045,632
    bytes (Llama 3.3 70B has Llama 3.1 70B's shapes). Its linear layers are NVFP4, lm_head and embeddings bf16
    (hf_quant_config.json exclude_modules lm_head); beside them each of the 80 x 7 linears keeps two fp32
    scalars (weight_scale_2, input_scale), 8 bytes, which kvplan's per-block figure leaves out."""
    model = load_model("meta-llama/Llama-3.1-70B")
    nvfp4, label = weights_bytes(model, "nvfp4")
    assert label == "nvfp4"
    assert nvfp4 + 80 * 7 * 8 == 42_709_045_632
    assert weights_bytes(model, "fp8")[0] > nvfp4 > weights_bytes(model, "mxfp4")[0]


@pytest.fixture
def r1_fp4(tmp_path):
    """A ModelOpt NVFP4 DeepSeek-R1 checkpoint directory: DeepSeek-R1's config.json (which states no
    quantization_config of its own there) and the genuine hf_quant_config.json of NVIDIA's FP4 R1 beside it."""
    config = raw("deepseek-ai__DeepSeek-R1.json")
    config.pop("quantization_config")
    (tmp_path / "config.json").write_text(json.dumps(config))
    shutil.copy(DATA / "modelopt" / "DeepSeek-R1-FP4.hf_quant_config.json", tmp_path / "hf_quant_config.json")
    return tmp_path


def test_hf_quant_config_beside_config_json_is_read(r1_fp4):
    """quant_algo NVFP4 on the MLP and experts; the MLA projections are among exclude_modules, so the attention
    groups stay in bf16 (kvplan counts attention by group: o_proj, which ModelOpt did quantise, in bf16 too);
    kv_cache_quant_algo null: the KV cache in the model dtype."""
    model = read_config_file(r1_fp4)
    assert (model.quantization.method, model.quantization.weights_dtype) == ("modelopt", "nvfp4")
    assert model.quantization.groups == ("mlp", "experts")
    assert model.kv_dtype is None
    params = model.params
    experts_and_mlp = weight_dtype("nvfp4").bytes_for(params.experts) + weight_dtype("nvfp4").bytes_for(params.mlp)
    assert estimate(model, ctx=1).weights_bytes == experts_and_mlp + 2 * (
        params.total - params.experts - params.mlp)


def test_a_config_json_quantization_config_wins_over_the_sidecar(r1_fp4):
    config = json.loads((r1_fp4 / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    (r1_fp4 / "config.json").write_text(json.dumps(config))
    assert read_config_file(r1_fp4).quantization.weights_dtype == "fp8"


def test_modelopt_in_config_json_flat_form():
    """The config.json form ModelOpt writes now (quant_method modelopt, quant_algo, ignore, kv_cache_scheme), as
    vLLM's `ModelOptQuantConfigBase.from_config` reads it."""
    config = raw("meta-llama__Llama-3.1-70B.json") | {"quantization_config": {
        "quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "ignore": ["lm_head"],
        "kv_cache_scheme": {"dynamic": False, "num_bits": 8, "type": "float"}}}
    model = model_from_config(config, "nvfp4-llama", "inline")
    assert (model.quantization.weights_dtype, model.kv_dtype) == ("nvfp4", "fp8")
    assert estimate(model, ctx=1).weights_bytes == weights_bytes(load_model("meta-llama/Llama-3.1-70B"), "nvfp4")[0]
    fp8 = config | {"quantization_config": {"quant_method": "modelopt", "quant_algo": "FP8",
                                            "kv_cache_quant_algo": "FP8"}}
    assert (model_from_config(fp8, "fp8-llama", "inline").quantization.weights_dtype,
            model_from_config(fp8, "fp8-llama", "inline").kv_dtype) == ("fp8", "fp8")


def test_an_unknown_modelopt_algorithm_is_a_note(monkeypatch, capsys):
    config = raw("meta-llama__Llama-3.1-70B.json") | {"quantization_config": {
        "quant_method": "modelopt", "quant_algo": "W4A8_AWQ"}}
    model = model_from_config(config, "w4a8", "inline")
    assert model.quantization is None
    assert any("modelopt not understood" in note for note in model.notes)


def test_a_malformed_sidecar_is_one_line(r1_fp4, monkeypatch, capsys):
    (r1_fp4 / "hf_quant_config.json").write_text('{"quantization": [1, 2]}')
    code, _, err = run_main(monkeypatch, capsys, "estimate", "-m", str(r1_fp4), "--ctx", "1k")
    assert code == 2 and err.count("\n") == 1 and "quantization must be an object" in err


def test_weights_dtype_nvfp4_on_the_command_line(monkeypatch, capsys):
    code, out, err = run_main(monkeypatch, capsys, "estimate", "-m", "meta-llama/Llama-3.1-70B", "--ctx", "1k",
                              "--weights-dtype", "nvfp4", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert (data["weights_dtype"], data["weights_bytes"]) == ("nvfp4", 42_709_045_632 - 80 * 7 * 8)
