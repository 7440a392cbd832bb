"""Advice and verdicts that agree with the tool itself: what `estimate` suggests where the target does not fit is
what `plan` finds and what `estimate` gives for the layout suggested; every suggestion makes the target fit; the
verdict names the limit that binds; the longest context for N users says where the model's own limit stops it."""

import json
import re

from conftest import run_main

DEEPSEEK = ["--model", "deepseek-v3", "--ctx", "32k"]


def estimate(monkeypatch, capsys, *args: str) -> tuple[int, str, dict]:
    """`kvplan estimate ARGS` as text and as --json: (exit status, the text, the JSON object)."""
    code, text, _ = run_main(monkeypatch, capsys, "estimate", *args)
    json_code, out, _ = run_main(monkeypatch, capsys, "estimate", *args, "--json")
    assert json_code == code
    return code, text, json.loads(out)


def test_a_layout_of_the_gpus_named_comes_before_more_gpus(monkeypatch, capsys):
    """DeepSeek-V3 at 32k on 8 H200s as TP 8 holds 21 users: every GPU stores every user's MLA latent. The same 8
    GPUs as 8 DP ranks of TP 1, the experts placed whole (EP 8), hold 112, so 64 need no more GPUs: the
    suggestion says so, in text and JSON, and agrees with `estimate` for that layout and with `plan`."""
    code, text, data = estimate(monkeypatch, capsys, *DEEPSEEK, "--gpu", "8xh200", "--users", "64")
    assert code == 1 and not data["fits"] and data["max_concurrent_users"] < 64
    same = [s for s in data["suggestions"] if "on the same 8 GPUs" in s]
    assert same == ["DP 8 x TP 1, EP 8 on the same 8 GPUs fits 112 users"], data["suggestions"]
    assert f"  - {same[0]}" in text
    assert not any(s.startswith("needs") for s in data["suggestions"])  # no more GPUs asked for
    _, _, dp = estimate(monkeypatch, capsys, *DEEPSEEK, "--gpu", "8xh200", "--dp", "8", "--enable-expert-parallel",
                        "--users", "64")
    assert dp["fits"] and dp["max_concurrent_users"] == 112
    code, out, _ = run_main(monkeypatch, capsys, "plan", *DEEPSEEK, "--users", "64", "--gpu", "h200", "--json")
    rows = [row for row in json.loads(out)["rows"] if (row["kv_dtype"], row["weights_dtype"]) == ("bf16", "fp8")]
    assert [(r["gpus"], r["data_parallel_size"], r["expert_parallel_size"], r["tensor_parallel_size"],
             r["max_concurrent_users"]) for r in rows] == [(8, 8, 8, 1, 112)]


def test_more_gpus_only_where_no_layout_of_these_fits(monkeypatch, capsys):
    """Llama-3-70B's 141 GB of bf16 weights fit no layout of one H100: two are asked for, as plan finds them."""
    _, _, data = estimate(monkeypatch, capsys, "--model", "llama-3-70b", "--ctx", "8k", "--gpu", "h100")
    assert any(s.startswith("needs TP >= 2: 2 x NVIDIA H100 SXM fit") for s in data["suggestions"])
    assert not any("on the same" in s for s in data["suggestions"])


def test_every_suggestion_makes_the_target_fit(monkeypatch, capsys):
    """A suggestion is what would make it fit: each that names a user count names at least the users asked for
    (an fp8 cache that holds 3 users is no fix for 16)."""
    cases = [
        ["--model", "granite-4.0-h-small", "--ctx", "128k", "--gpu", "h100", "--engine", "sglang", "--users", "16"],
        [*DEEPSEEK, "--gpu", "8xh200", "--users", "64"],
        ["--model", "llama-3-8b", "--ctx", "8k", "--gpu", "h100", "--users", "64"],
        ["--model", "gemma-3-27b-it", "--ctx", "32k", "--gpu", "h100", "--users", "40"],
    ]
    for args in cases:
        asked = int(args[-1])
        _, _, data = estimate(monkeypatch, capsys, *args)
        assert not data["fits"] and data["suggestions"], args
        for suggestion in data["suggestions"]:
            named = re.search(r"fits? ([\d,]+) users?$", suggestion)
            assert named is None or int(named.group(1).replace(",", "")) >= asked, (args, suggestion)


def test_an_sglang_hybrid_verdict_names_the_limit_that_binds(monkeypatch, capsys):
    """Granite-4.0-H-Small at 128k on one H100 under SGLang: its split of the budget leaves 207,637 KV tokens
    and 19 Mamba slots, max_running_requests 19 // 5 = 3; 207,637 // 131,072 = 1 user, so the KV tokens bind,
    not the 3 running requests. With fp8 KV (415,275 tokens, 3 users) the users reach the request limit, which is
    then named."""
    args = ["--model", "granite-4.0-h-small", "--ctx", "128k", "--gpu", "h100", "--engine", "sglang", "--users", "16"]
    _, text, data = estimate(monkeypatch, capsys, *args)
    assert data["max_concurrent_users"] == 1 and data["sequence_limit"] == 3
    assert data["max_concurrent_users_bound"] == "memory"
    assert data["reasons"][0].startswith("1 user fits at 131,072 tokens")
    assert "max_running_requests" not in data["reasons"][0]
    assert "does not fit: 1 user fits at 131,072 tokens" in text
    _, _, fp8 = estimate(monkeypatch, capsys, *args, "--kv-dtype", "fp8")
    assert fp8["max_concurrent_users"] == 3 and fp8["max_concurrent_users_bound"] == "sequence_limit"
    assert "max_running_requests 3" in fp8["reasons"][0]


def test_the_longest_context_says_where_the_model_stops_it(monkeypatch, capsys):
    """Llama-3-8B states 8,192 tokens: 4 users of 32k fit an H100's 56 GiB of KV, so the longest context for 4
    is the model's own limit, labelled so, and the JSON says which limit binds. 64 users at 8k do not fit (56
    do): 64 x 7,168 tokens of 128 KiB = 56 GiB, so memory binds there."""
    code, text, data = estimate(monkeypatch, capsys, "--model", "llama-3-8b", "--ctx", "32k", "--users", "4",
                                "--gpu", "h100")
    assert code == 0 and data["fits"]
    assert (data["max_ctx_for_users"], data["max_ctx_for_users_bound"]) == (8192, "max_context")
    assert re.search(r"longest context for 4 users \(model's max\) +8,192 tokens", text)
    _, text, data = estimate(monkeypatch, capsys, "--model", "llama-3-8b", "--ctx", "8k", "--users", "64", "--gpu",
                             "h100")
    assert (data["max_ctx_for_users"], data["max_ctx_for_users_bound"]) == (7168, "memory")
    assert re.search(r"longest context for 64 users +7,168 tokens", text)


def test_the_longest_context_without_users_is_for_the_batch(monkeypatch, capsys):
    """`--users` defaults to `--batch`: the key is the longest context for that many (docs/cli.md says so)."""
    _, _, data = estimate(monkeypatch, capsys, "--model", "llama-3-8b", "--ctx", "8k", "--batch", "64", "--gpu",
                          "h100")
    assert (data["users"], data["max_ctx_for_users"]) == (64, 7168)
    from conftest import ROOT

    cli = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert "| `max_ctx_for_users` | the longest context at which `users` fit (`--users`, default `--batch`)" in cli


def test_more_users_than_the_engine_runs_at_once_have_no_longest_context(monkeypatch, capsys):
    """llama-cpp-python's Llama() runs one sequence: 2 users fit at no context, and the JSON says why."""
    _, _, data = estimate(monkeypatch, capsys, "--model", "llama-3-8b", "--ctx", "8k", "--gpu", "h100", "--engine",
                          "llama.cpp", "--frontend", "python", "--users", "2")
    assert (data["max_ctx_for_users"], data["max_ctx_for_users_bound"]) == (0, "sequence_limit")
