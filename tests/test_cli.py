"""The command line: `python -m kvplan` in a fresh interpreter for the real thing, and `kvplan.cli.main`
in-process
(same code path: argv in, exit status and streams out) for the many error cases, to keep the suite fast."""

import json
import time

import pytest
from conftest import SPECS, assert_one_line_error, raw, run_cli, run_main

LLAMA8B = str(SPECS / "meta-llama__Llama-3.1-8B.json")
JSON_KEYS = {
    "kv_bytes_per_token",
    "kv_bytes_per_sequence",
    "kv_bytes_total",
    "state_bytes_per_sequence",
    "weights_bytes",
    "model",
    "ctx",
    "batch",
    "kv_dtype",
    "weights_dtype",
}


# ---------------------------------------------------------------------------------------------- the real CLI


def test_estimate_json_subprocess():
    result = run_cli("estimate", "--model", LLAMA8B, "--ctx", "8k", "--batch", "4", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert JSON_KEYS <= set(data)
    # Llama 3.1 8B: 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes = 131,072 per token
    assert data["kv_bytes_per_token"] == 131_072
    assert data["kv_bytes_per_sequence"] == 131_072 * 8192
    assert data["kv_bytes_total"] == 131_072 * 8192 * 4
    assert data["state_bytes_per_sequence"] == 0
    assert data["weights_bytes"] == 8_030_261_248 * 2
    assert (data["ctx"], data["batch"], data["kv_dtype"], data["weights_dtype"]) == (8192, 4, "bf16", "bf16")
    assert isinstance(data["model"], str) and data["model"]


def test_error_subprocess_is_one_line_exit_2():
    result = run_cli("estimate", "--model", LLAMA8B, "--ctx", "8kb")
    assert_one_line_error(result.returncode, result.stderr, "8kb")
    assert result.stdout == ""


def test_absurd_ctx_answers_quickly_subprocess():
    start = time.perf_counter()
    result = run_cli("estimate", "--model", LLAMA8B, "--ctx", str(10**13), "--json", timeout=30)
    assert time.perf_counter() - start < 15
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["ctx"] == 10**13
    assert data["kv_bytes_per_sequence"] == 131_072 * 10**13
    assert "warning" in result.stderr.lower()


# ---------------------------------------------------------------------------------------------- estimate


@pytest.mark.parametrize(
    "text, tokens",
    [
        ("8192", 8192),
        ("8k", 8192),
        ("8K", 8192),
        ("128K", 131072),
        ("128k", 131072),
        ("1M", 1048576),
        ("1m", 1048576),
        ("1", 1),
    ],
)
def test_ctx_parsing(monkeypatch, capsys, text, tokens):
    code, out, err = run_main(monkeypatch, capsys, "estimate", "-m", LLAMA8B, "--ctx", text, "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["ctx"] == tokens
    assert data["kv_bytes_per_sequence"] == 131_072 * tokens


def test_json_with_kv_and_weights_dtypes(monkeypatch, capsys):
    code, out, err = run_main(
        monkeypatch,
        capsys,
        "estimate",
        "-m",
        LLAMA8B,
        "--ctx",
        "8192",
        "--kv-dtype",
        "q8_0",
        "--weights-dtype",
        "fp8",
        "--json",
    )
    assert code == 0, err
    data = json.loads(out)
    assert data["kv_dtype"] == "q8_0" and data["weights_dtype"] == "fp8"
    assert data["kv_bytes_per_sequence"] == 544 * 2**20  # llama.cpp q8_0 at n_ctx 8192 (engines.md 7.1)


def test_human_output(monkeypatch, capsys):
    code, out, err = run_main(monkeypatch, capsys, "estimate", "-m", LLAMA8B, "--ctx", "8k")
    assert code == 0, err
    assert "131,072" in out  # bytes per token
    assert "1.00 GiB" in out  # 131,072 x 8,192 = 2**30 bytes per sequence


def test_beyond_max_context_is_a_warning(monkeypatch, capsys):
    # Llama 3.1: 131,072-token context
    code, out, err = run_main(monkeypatch, capsys, "estimate", "-m", LLAMA8B, "--ctx", "256k", "--json")
    assert code == 0
    assert json.loads(out)["ctx"] == 262144
    assert "warning" in err.lower() and "131,072" in err


def test_show(monkeypatch, capsys):
    code, out, err = run_main(monkeypatch, capsys, "show", "-m", str(SPECS / "google__gemma-3-1b-it.json"))
    assert code == 0, err
    assert "sliding" in out and "full" in out
    assert "999,885,952" in out  # gemma-3-1b parameters
    # its published config: hidden_size 1,152, intermediate_size 6,912, GeGLU (gelu_pytorch_tanh)
    assert "hidden 1,152, MLP 6,912 (gated, gelu_pytorch_tanh)" in " ".join(out.split())


# ---------------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("ctx", ["0", "-5", "8kb", "abc", "1.5", "", "8 k b"])
def test_bad_ctx(monkeypatch, capsys, ctx):
    code, out, err = run_main(monkeypatch, capsys, "estimate", "-m", LLAMA8B, f"--ctx={ctx}")
    assert_one_line_error(code, err, "--ctx")
    assert out == ""


def test_batch_zero(monkeypatch, capsys):
    code, _, err = run_main(monkeypatch, capsys, "estimate", "-m", LLAMA8B, "--ctx", "8k", "--batch", "0")
    assert_one_line_error(code, err, "batch")


def test_batch_not_a_number(monkeypatch, capsys):
    code, _, err = run_main(monkeypatch, capsys, "estimate", "-m", LLAMA8B, "--ctx", "8k", "--batch", "many")
    assert_one_line_error(code, err, "batch")


def test_unknown_kv_dtype_lists_valid_ones(monkeypatch, capsys):
    code, _, err = run_main(
        monkeypatch, capsys, "estimate", "-m", LLAMA8B, "--ctx", "8k", "--kv-dtype", "fp9"
    )
    assert_one_line_error(code, err, "fp9", "bf16", "fp8", "q8_0")


def test_unknown_weights_dtype(monkeypatch, capsys):
    code, _, err = run_main(
        monkeypatch, capsys, "estimate", "-m", LLAMA8B, "--ctx", "8k", "--weights-dtype", "int3"
    )
    assert_one_line_error(code, err, "int3", "int4")


def test_missing_model_option(monkeypatch, capsys):
    code, _, err = run_main(monkeypatch, capsys, "estimate", "--ctx", "8k")
    assert_one_line_error(code, err, "--model")


def test_malformed_json_says_line_and_column(monkeypatch, capsys, write_json):
    path = write_json('{\n  "num_hidden_layers": 32,\n  "hidden_size": ,\n}')
    code, _, err = run_main(monkeypatch, capsys, "estimate", "-m", str(path), "--ctx", "8k")
    assert_one_line_error(code, err, "line 3", "column")


def test_empty_file(monkeypatch, capsys, write_json):
    path = write_json("   \n")
    code, _, err = run_main(monkeypatch, capsys, "estimate", "-m", str(path), "--ctx", "8k")
    assert_one_line_error(code, err, "empty")


def test_binary_garbage(monkeypatch, capsys, tmp_path):
    path = tmp_path / "config.json"
    path.write_bytes(bytes(range(256)) * 4)
    code, _, err = run_main(monkeypatch, capsys, "estimate", "-m", str(path), "--ctx", "8k")
    assert_one_line_error(code, err, str(path))


def test_json_that_is_not_an_object(monkeypatch, capsys, write_json):
    path = write_json("[1, 2, 3]")
    code, _, err = run_main(monkeypatch, capsys, "estimate", "-m", str(path), "--ctx", "8k")
    assert_one_line_error(code, err)


def test_config_missing_a_field_names_it(monkeypatch, capsys, write_json):
    path = write_json(
        {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "vocab_size": 10}
    )
    code, _, err = run_main(monkeypatch, capsys, "estimate", "-m", str(path), "--ctx", "8k")
    assert_one_line_error(code, err, "num_hidden_layers")


def test_json_carries_how_the_model_was_read(monkeypatch, capsys, write_json):
    """A script reading --json sees the notes the table prints: here, a model_type kvplan has no rule for."""
    data = raw("meta-llama__Meta-Llama-3-8B.json") | {"model_type": "my_new_arch"}
    code, out, err = run_main(monkeypatch, capsys, "estimate", "-m", str(write_json(data)), "--ctx", "8k", "--json")
    assert code == 0, err
    notes = json.loads(out)["notes"]
    assert any("'my_new_arch' is not one kvplan knows" in note for note in notes), notes


def test_recurrent_fields_in_an_attention_layout_are_refused(monkeypatch, capsys, write_json):
    """Falcon-H1-like: Mamba fields on a model_type kvplan reads as attention would lose the Mamba state."""
    data = raw("meta-llama__Meta-Llama-3-8B.json") | {"model_type": "my_hybrid", "mamba_d_state": 256}
    code, _, err = run_main(monkeypatch, capsys, "estimate", "-m", str(write_json(data)), "--ctx", "8k")
    assert_one_line_error(code, err, "cannot lay out my_hybrid's cache", "mamba_d_state")


def test_directory_without_config_json(monkeypatch, capsys, tmp_path):
    code, _, err = run_main(monkeypatch, capsys, "estimate", "-m", str(tmp_path), "--ctx", "8k")
    assert_one_line_error(code, err, "config.json")


def test_directory_with_config_json(monkeypatch, capsys, tmp_path):
    (tmp_path / "config.json").write_text((SPECS / "mistralai__Mistral-7B-v0.1.json").read_text())
    code, out, err = run_main(monkeypatch, capsys, "estimate", "-m", str(tmp_path), "--ctx", "32k", "--json")
    assert code == 0, err
    # Mistral 7B v0.1: 32 layers x 4,096-token window x (2 x 8 x 128 x 2 bytes)
    assert json.loads(out)["kv_bytes_per_sequence"] == 32 * 4096 * 4096


# ---------------------------------------------------------------------------------------------- the library


def test_unknown_model_suggests_close_names(monkeypatch, capsys):
    code, _, err = run_main(monkeypatch, capsys, "estimate", "-m", "llama-3-8bb", "--ctx", "8k")
    assert_one_line_error(code, err, "llama-3-8bb", "meta-llama/Meta-Llama-3-8B")


def test_unknown_model_with_nothing_close(monkeypatch, capsys):
    # not Hub-shaped (no org/): answered from the library alone, no network (Hub ids: test_hub_server.py)
    code, _, err = run_main(monkeypatch, capsys, "estimate", "-m", "zzzz-qqqq-xxxx", "--ctx", "8k")
    assert_one_line_error(code, err, "zzzz-qqqq-xxxx")


@pytest.mark.parametrize(
    "name",
    [
        "meta-llama/Llama-3-8B",
        "META-LLAMA/llama-3-8b",
        "meta-llama/Meta-Llama-3-8B",
        "llama-3-8b",
        " meta-llama/Llama-3-8B ",
    ],
)
def test_library_name_resolves(monkeypatch, capsys, name):
    code, out, err = run_main(
        monkeypatch,
        capsys,
        "estimate",
        "-m",
        name,
        "--ctx",
        "8000",
        "--batch",
        "16",
        "--kv-dtype",
        "fp16",
        "--json",
    )
    assert code == 0, err
    data = json.loads(out)
    assert data["model"] == "meta-llama/Meta-Llama-3-8B"
    # Llama 3 8B: 32 layers x 8 KV heads x 128 x 2 x 2 = 131,072 B/token; 8000 tokens x 16 = 16.78 GB
    assert data["kv_bytes_per_token"] == 131_072
    assert data["kv_bytes_total"] == 131_072 * 8000 * 16


def test_library_llama3_70b(monkeypatch, capsys):
    code, out, err = run_main(
        monkeypatch,
        capsys,
        "estimate",
        "-m",
        "meta-llama/Llama-3-70B",
        "--ctx",
        "1",
        "--kv-dtype",
        "fp16",
        "--json",
    )
    assert code == 0, err
    assert json.loads(out)["kv_bytes_per_token"] == 327_680  # 80 x 8 x 128 x 2 x 2


def test_models_json_lists_the_library(monkeypatch, capsys):
    code, out, err = run_main(monkeypatch, capsys, "models", "--json")
    assert code == 0, err
    entries = json.loads(out)
    ids = {e["id"] for e in entries}
    assert {"meta-llama/Meta-Llama-3-8B", "meta-llama/Llama-3.1-8B", "deepseek-ai/DeepSeek-V3"} <= ids
    for entry in entries:
        assert (SPECS / entry["file"]).is_file(), entry["file"]


def test_models_filter(monkeypatch, capsys):
    code, out, _ = run_main(monkeypatch, capsys, "models", "qwen3", "--json")
    assert code == 0
    entries = json.loads(out)
    assert entries and all("qwen3" in " ".join([e["id"], *e["aliases"]]).lower() for e in entries)


def test_every_library_entry_loads_and_names_are_unambiguous():
    from kvplan.sources import library, load_model

    seen: dict[str, str] = {}
    for entry in library.entries():
        for name in (entry.id, *entry.aliases):
            assert seen.setdefault(name.lower(), entry.id) == entry.id, f"{name} names two models"
        spec = load_model(entry.id)
        assert spec.name == entry.id
        assert spec.num_layers >= 1


# Library models added after the first table, with their KV bytes per token at bf16 worked by hand from each
# config (attention layers only; recurrent state is per sequence) and the GPU one of them fits on, or does not.
ENGINE_RUNS = {
    # 10 full-attention layers of 40 (full_attention_interval 4) x 2 (K, V) x 2 KV heads x head_dim 256 x 2 bytes
    "Qwen/Qwen3.6-35B-A3B": (2 * 10 * 2 * 256 * 2, "h100"),
    # 16 full-attention layers of 64 x 2 x 4 KV heads x head_dim 256 x 2 bytes
    "Qwen/Qwen3.6-27B": (2 * 16 * 4 * 256 * 2, "h100"),
    # 7 MLA layers (full_attn_layers) x one latent row of kv_lora_rank 512 + qk_rope_head_dim 64 x 2 bytes
    # (98 GB of bf16 weights: an H200, not an H100)
    "moonshotai/Kimi-Linear-48B-A3B-Instruct": (7 * (512 + 64) * 2, "h200"),
    # 6 attention layers (full_attn_idxs) x 2 x 8 KV heads x (2048 / 32 = 64) x 2 bytes
    "LiquidAI/LFM2-1.2B": (2 * 6 * 8 * 64 * 2, "h100"),
    # 62 layers x 2 x 8 KV heads x head_dim 128 x 2 bytes; 229 GB of fp8 weights exceed one H200 (exit 1)
    "MiniMaxAI/MiniMax-M2.7": (2 * 62 * 8 * 128 * 2, "h200"),
}


@pytest.mark.parametrize("engine", ["vllm", "transformers"])
@pytest.mark.parametrize("model_id", sorted(ENGINE_RUNS))
def test_new_library_models_plan_under_both_engines(monkeypatch, capsys, model_id, engine):
    per_token, gpu = ENGINE_RUNS[model_id]
    code, out, err = run_main(monkeypatch, capsys, "estimate", "--model", model_id, "--ctx", "32k", "--gpu", gpu,
                              "--engine", engine, "--json")
    data = json.loads(out)
    assert code == (0 if data["fits"] else 1), err
    assert (data["model"], data["engine"], data["ctx"]) == (model_id, engine, 32768)
    assert data["kv_bytes_per_token"] == per_token
    # the analytic sequence: every attention token plus the recurrent state, which the engine's figure holds too
    assert data["kv_bytes_per_sequence"] == per_token * 32768 + data["state_bytes_per_sequence"]
    assert data["engine_kv_bytes_per_sequence"] >= data["kv_bytes_per_sequence"]
    assert data["weights_bytes_per_gpu"] >= data["params_total"]  # bf16 or fp8: at least a byte a parameter
    assert data["fits"] == (model_id != "MiniMaxAI/MiniMax-M2.7")
