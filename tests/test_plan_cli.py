"""The capacity command line: `estimate` with capacity flags, `plan`, `gpus`, and its one-line errors."""

import json

import pytest
from conftest import run_cli, run_main, run_python

LLAMA8B = "meta-llama/Llama-3-8B"
LLAMA70B = "meta-llama/Llama-3-70B"
CAPACITY_KEYS = {"engine", "fits", "kv_budget_bytes", "engine_kv_bytes_per_sequence", "max_concurrent_users",
                 "max_ctx_for_users"}
VLLM_KEYS = {"vllm_num_blocks", "vllm_kv_cache_tokens", "vllm_max_concurrency"}


def run_json(monkeypatch, capsys, *args: str) -> dict:
    code, out, err = run_main(monkeypatch, capsys, *args, "--json")
    assert code == 0, err
    return json.loads(out)


def test_vllm_worked_example_json(monkeypatch, capsys):
    data = run_json(monkeypatch, capsys, "estimate", "-m", LLAMA8B, "--ctx", "8192", "--kv-budget", "60GiB",
                    "--users", "8")
    assert CAPACITY_KEYS | VLLM_KEYS <= set(data)
    assert data["engine"] == "vllm" and data["fits"] is True
    assert data["kv_budget_bytes"] == 60 * 2**30
    assert (data["vllm_num_blocks"], data["vllm_kv_cache_tokens"]) == (30_720, 491_520)
    assert round(data["vllm_max_concurrency"], 2) == 60.00
    assert data["kv_bytes_per_token"] == 131_072  # the estimate's own keys are still there


def test_other_engines_have_no_vllm_keys(monkeypatch, capsys):
    data = run_json(monkeypatch, capsys, "estimate", "-m", LLAMA8B, "--ctx", "8k", "--vram", "24GiB",
                    "--engine", "llama.cpp")
    assert CAPACITY_KEYS <= set(data) and not VLLM_KEYS & set(data)
    assert data["kv_dtype"] == "fp16"  # llama.cpp's default cache type, reflected in the estimate too


def test_plain_estimate_is_unchanged(monkeypatch, capsys):
    data = run_json(monkeypatch, capsys, "estimate", "-m", LLAMA8B, "--ctx", "8k")
    assert not CAPACITY_KEYS & set(data)


def test_70b_does_not_fit_one_h100_and_says_why(monkeypatch, capsys):
    code, out, err = run_main(monkeypatch, capsys, "estimate", "-m", LLAMA70B, "--ctx", "8k", "--gpu", "h100")
    assert code == 1, err  # does not fit: the plan is printed, and scripts can branch on the status
    assert "does not fit" in out and "needs TP >= 2" in out
    code, out, err = run_main(monkeypatch, capsys, "estimate", "-m", LLAMA70B, "--ctx", "8k", "--gpu", "h100",
                              "--tensor-parallel-size", "2")
    assert code == 0, err
    assert "fits" in out and "does not fit" not in out
    assert "GPU KV cache size:" in out and "Maximum concurrency for 8,192 tokens per request:" in out


def test_fp8_suggestion(monkeypatch, capsys):
    code, out, err = run_main(monkeypatch, capsys, "estimate", "-m", LLAMA8B, "--ctx", "8192", "--kv-budget",
                              "60GiB", "--users", "100")
    assert "does not fit" in out and "fp8 KV fits 119 users" in out


def test_plan_command(monkeypatch, capsys):
    data = run_json(monkeypatch, capsys, "plan", "-m", LLAMA70B, "--ctx", "8k", "--users", "16",
                    "--gpu", "h100")
    assert data["rows"] and [r["gpus"] for r in data["rows"]] == sorted(r["gpus"] for r in data["rows"])
    assert all(r["max_concurrent_users"] >= 16 for r in data["rows"])
    code, out, err = run_main(monkeypatch, capsys, "plan", "-m", LLAMA70B, "--ctx", "8k", "--users", "16",
                              "--gpu", "h100")
    assert code == 0 and "fewest GPUs first" in out


def test_gpus_command(monkeypatch, capsys):
    data = run_json(monkeypatch, capsys, "gpus")
    h100 = next(g for g in data if g["name"] == "NVIDIA H100 SXM")
    assert h100["memory_bytes"] == 81_559 * 2**20
    code, out, err = run_main(monkeypatch, capsys, "gpus")
    assert code == 0 and "H200" in out


@pytest.mark.parametrize(("args", "fragments"), [
    (["--gpu", "h1000"], ["unknown GPU", "closest", "H100"]),
    (["--gpu", "h100", "--tp", "3"], ["--tp 3", "32 attention heads"]),
    (["--gpu", "h100", "--gpu-memory-utilization", "0"], ["(0, 1]"]),
    (["--gpu", "h100", "--gpu-memory-utilization", "1.5"], ["(0, 1]"]),
    (["--kv-budget", "-5GiB"], ["--kv-budget"]),
    (["--kv-budget", "lots"], ["--kv-budget", "not a size"]),
    (["--kv-budget", "60GiB", "--gpu-memory-utilization", "0.9"],
     ["--kv-budget", "--gpu-memory-utilization"]),
    (["--gpu", "h100", "--vram", "24GiB"], ["--vram"]),
    (["--engine", "tgi", "--gpu", "h100"], ["unknown engine"]),
    (["--engine", "llama.cpp", "--gpu", "h100", "--block-size", "32"], ["--block-size", "llama.cpp"]),
    (["--engine", "llama.cpp", "--gpu", "h100", "--avg-ctx", "1k"], ["paged engine"]),
    (["--engine"], ["--engine"]),
    (["--users", "0", "--gpu", "h100"], ["--users"]),
])
def test_bad_input_is_one_line_exit_2(monkeypatch, capsys, args, fragments):
    code, out, err = run_main(monkeypatch, capsys, "estimate", "-m", LLAMA8B, "--ctx", "8k", *args)
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvplan: error:") and "Traceback" not in err
    for fragment in fragments:
        assert fragment.lower() in lines[0].lower(), (fragment, lines[0])


def test_real_command_line():
    result = run_cli("estimate", "-m", LLAMA70B, "--ctx", "8k", "--gpu", "H100 80GB", "--tp", "2", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["fits"] and data["tensor_parallel_size"] == 2


def test_plain_estimate_imports_no_capacity_modules():
    code = (
        "import sys\n"
        "from kvplan import cli\n"
        f"sys.argv = ['kvplan', 'estimate', '-m', '{LLAMA8B}', '--ctx', '8k', '--json']\n"
        "cli.main()\n"
        "loaded = [m for m in ('kvplan.capacity', 'kvplan.engines', 'kvplan.gpus', 'torch', 'transformers',\n"
        "                      'huggingface_hub') if m in sys.modules]\n"
        "print('LOADED', loaded, file=sys.stderr)\n"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert "LOADED []" in result.stderr
