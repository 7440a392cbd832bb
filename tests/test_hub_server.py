"""Hub ids through huggingface_hub itself, against a real HTTP server on 127.0.0.1 that answers the Hub's
endpoints as huggingface.co does (tests/hubkit.py): model info, config.json download into the real cache, and
safetensors headers by range requests; the Hub's error answers (401, 403, 404 with their X-Error-Code headers)
and a slow answer, so each failure kvplan explains is the one huggingface_hub raises. No internet needed."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, run_main
from hubkit import (
    GOOD_TOKEN,
    GPTQ_CONFIG,
    NO_ACCESS_TOKEN,
    TINY_CONFIG,
    FakeHub,
    commit_of,
    gptq_tensors,
    hub_environment,
    put_in_cache,
    safetensors_file,
    sharded,
    tensor_bytes,
    tiny_tensors,
)
from test_cli import assert_one_line_error
from test_hub_cache import TINY_KV_PER_TOKEN, TINY_PARAMS

CONFIG = json.dumps(TINY_CONFIG).encode()


@pytest.fixture
def hub():
    server = FakeHub()
    yield server
    server.close()


@pytest.fixture
def home(tmp_path):
    return tmp_path / "hf"


@pytest.fixture
def env(monkeypatch, home, hub):
    return hub_environment(monkeypatch, home, endpoint=hub.url)


def estimate_json(monkeypatch, capsys, *args: str) -> dict:
    code, out, err = run_main(monkeypatch, capsys, "estimate", "--ctx", "1k", "--json", *args)
    assert code == 0, err
    return json.loads(out)


def range_gets(hub: FakeHub) -> int:
    return sum(1 for method, _, wanted, _ in hub.requests if method == "GET" and wanted)


# ---------------------------------------------------------------------------------------------- reading


def test_single_safetensors_exact_weights_and_source(env, hub, home, monkeypatch, capsys):
    repo = hub.add(
        "org/tiny",
        {
            "config.json": CONFIG,
            "model.safetensors": safetensors_file(tiny_tensors()),
            "modeling_evil.py": b"raise SystemExit('remote code ran')\n",
        },
    )
    data = estimate_json(monkeypatch, capsys, "-m", "org/tiny")
    assert data["model"] == "org/tiny"
    assert data["kv_bytes_per_token"] == TINY_KV_PER_TOKEN
    assert data["params_total"] == TINY_PARAMS
    assert data["weights_source"] == "checkpoint"
    assert data["weights_bytes"] == TINY_PARAMS * 2  # 106,816 BF16 elements in the header x 2 bytes
    # the header was read by a range request (through the LFS redirect to the CDN), not downloaded
    assert (
        "GET",
        "/org/tiny/resolve/" + repo.commit + "/model.safetensors",
        "bytes=0-100000",
        False,
    ) in hub.requests
    assert not any(path.endswith(".py") for _, path, _, _ in hub.requests)  # remote code is never fetched
    snapshot = home / "hub" / "models--org--tiny" / "snapshots" / repo.commit
    assert (snapshot / "config.json").is_file() and not (snapshot / "model.safetensors").exists()
    assert (home / "hub" / "models--org--tiny" / "refs" / "main").read_text() == repo.commit
    code, out, err = run_main(monkeypatch, capsys, "show", "-m", "org/tiny")
    assert code == 0, err
    text = " ".join(out.split())
    assert f"source: Hub: org/tiny @ {repo.commit}" in text
    assert "params (safetensors: 0.1M BF16)" in text and "checkpoint tensors" in text and "21 tensors" in text


def test_sharded_checkpoint_by_dtype(env, hub, monkeypatch, capsys):
    def norms_f32(tensors):
        return {k: ("F32" if "norm" in k else "BF16", s) for k, (_, s) in tensors.items()}

    files = sharded(
        {
            "model-00001-of-00002.safetensors": norms_f32(tiny_tensors(range(1), head=False)),
            "model-00002-of-00002.safetensors": norms_f32(tiny_tensors(range(1, 2), embed=False)),
        }
    )
    hub.add("org/sharded", {"config.json": CONFIG, **files})
    from kvplan.sources import load_model

    spec = load_model("org/sharded")
    # by hand: 5 norms of 64 in F32 (2 per layer, 2 layers, the final one) = 320; the other 106,496 in BF16
    assert spec.checkpoint.elements == {"BF16": 106_496, "F32": 320}
    assert spec.checkpoint.files == 2 and spec.checkpoint.tensors == 21
    assert range_gets(hub) == 4  # each shard: the Hub's 302, then the CDN's 206
    data = estimate_json(monkeypatch, capsys, "-m", "org/sharded")
    assert data["weights_bytes"] == 106_496 * 2 + 320 * 4
    assert range_gets(hub) == 4  # the second run reads the inventory kept for this commit: no range request


def test_gptq_checkpoint_weights_are_the_real_tensor_bytes(env, hub, monkeypatch, capsys):
    data = safetensors_file(gptq_tensors())
    hub.add("org/tiny-gptq", {"config.json": json.dumps(GPTQ_CONFIG).encode(), "model.safetensors": data})
    from kvplan.sources import load_model

    spec = load_model("org/tiny-gptq")
    # by hand, per layer, linears (out, in): q (64, 64), k (32, 64), v (32, 64), o (64, 64), gate and up
    # (128, 64), down (64, 128); group 32:
    #   qweight I32 in/8 x out: 512 + 256 + 256 + 512 + 1024 + 1024 + 1024 = 4,608
    #   qzeros  I32 in/32 x out/8: 16 + 8 + 8 + 16 + 32 + 32 + 32 = 144
    #   g_idx   I32 in: 6 x 64 + 128 = 512                    -> I32 5,264 per layer, 10,528 for 2
    #   scales  F16 in/32 x out: 128 + 64 + 64 + 128 + 256 + 256 + 256 = 1,152 per layer, 2,304 for 2
    # F16 besides: embedding and lm_head 2 x 16,384, norms 4 x 64 + 64 = 320 -> F16 2,304 + 33,088 = 35,392
    assert spec.checkpoint.elements == {"F16": 35_392, "I32": 10_528}
    expected = 10_528 * 4 + 35_392 * 2
    assert expected == tensor_bytes(data) == 112_896
    out = estimate_json(monkeypatch, capsys, "-m", "org/tiny-gptq")
    assert (out["weights_bytes"], out["weights_dtype"], out["weights_source"]) == (
        expected,
        "int4",
        "checkpoint",
    )
    # an explicit dtype is a what-if on the config's parameter counts
    out = estimate_json(monkeypatch, capsys, "-m", "org/tiny-gptq", "--weights-dtype", "bf16")
    assert (out["weights_bytes"], out["weights_source"]) == (TINY_PARAMS * 2, "config")


def test_repo_without_safetensors_falls_back_with_a_note(env, hub, monkeypatch, capsys):
    hub.add("org/bin-only", {"config.json": CONFIG, "pytorch_model.bin": b"\0" * 64})
    data = estimate_json(monkeypatch, capsys, "-m", "org/bin-only")
    assert (data["weights_bytes"], data["weights_source"]) == (TINY_PARAMS * 2, "config")
    assert range_gets(hub) == 0
    code, out, err = run_main(monkeypatch, capsys, "estimate", "-m", "org/bin-only", "--ctx", "1k")
    assert code == 0, err
    assert (
        "note: the repo has no model.safetensors or model.safetensors.index.json: weights derived from the "
        "config" in " ".join(out.split())
    )


def test_modelopt_hf_quant_config_is_fetched_beside_config_json(env, hub, monkeypatch, capsys):
    """A TensorRT Model Optimizer checkpoint states its quantisation in hf_quant_config.json (the genuine one of
    NVIDIA's FP4 DeepSeek-R1 is in tests/data/modelopt): kvplan fetches it with config.json, so the weights (no
    safetensors here) are counted in NVFP4, and an FP8 KV cache is the default; offline, from the cache."""
    sidecar = {"producer": {"name": "modelopt", "version": "0.23.0"},
               "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": "FP8", "group_size": 16,
                                "exclude_modules": ["lm_head"]}}
    hub.add("org/tiny-nvfp4", {"config.json": CONFIG, "hf_quant_config.json": json.dumps(sidecar).encode()})
    data = estimate_json(monkeypatch, capsys, "-m", "org/tiny-nvfp4")
    # linear layers: 2 x (q 64x64 + k 32x64 + v 32x64 + o 64x64 + 3 x 128x64) = 73,728 in NVFP4, 9 bytes per 16;
    # embedding and lm_head 2 x 16,384, norms 5 x 64 in bf16
    assert (data["weights_dtype"], data["kv_dtype"]) == ("nvfp4", "fp8")
    assert data["weights_bytes"] == 73_728 // 16 * 9 + (2 * 16_384 + 5 * 64) * 2
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert estimate_json(monkeypatch, capsys, "-m", "org/tiny-nvfp4")["weights_dtype"] == "nvfp4"


def test_revision_branch_and_commit(env, hub, monkeypatch, capsys):
    main = hub.add("org/tiny", {"config.json": CONFIG})
    v2 = commit_of("v2")
    main.branches = {"main": main.commit, "v2": v2}
    data = estimate_json(monkeypatch, capsys, "-m", "org/tiny", "--revision", "v2")
    assert data["kv_bytes_per_token"] == TINY_KV_PER_TOKEN
    code, out, _ = run_main(monkeypatch, capsys, "show", "-m", "org/tiny", "--revision", "v2")
    assert code == 0
    assert f"Hub: org/tiny @ {v2} (revision v2)" in " ".join(out.split())
    assert any(path == "/api/models/org/tiny/revision/v2" for _, path, _, _ in hub.requests)


def test_library_name_with_revision_goes_to_the_hub(env, hub, monkeypatch, capsys):
    hub.add("meta-llama/Llama-3.1-8B", {"config.json": CONFIG})
    data = estimate_json(monkeypatch, capsys, "-m", "llama-3.1-8b", "--revision", "main")
    assert data["kv_bytes_per_token"] == TINY_KV_PER_TOKEN  # the Hub's (made-up) config, not the library's
    data = estimate_json(monkeypatch, capsys, "-m", "llama-3.1-8b")
    assert data["kv_bytes_per_token"] == 131_072  # without --revision: the bundled copy
    assert len(hub.requests) == 3  # model info, HEAD and GET config.json, all for the --revision run


def test_online_then_offline_reads_the_cache(env, hub, monkeypatch, capsys):
    hub.add("org/tiny", {"config.json": CONFIG, "model.safetensors": safetensors_file(tiny_tensors())})
    online = estimate_json(monkeypatch, capsys, "-m", "org/tiny")
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    asked = len(hub.requests)
    offline = estimate_json(monkeypatch, capsys, "-m", "org/tiny")
    assert offline == online and offline["weights_source"] == "checkpoint"
    assert len(hub.requests) == asked


def test_a_cached_commit_needs_no_request(env, hub, monkeypatch, capsys):
    repo = hub.add("org/tiny", {"config.json": CONFIG, "model.safetensors": safetensors_file(tiny_tensors())})
    first = estimate_json(monkeypatch, capsys, "-m", "org/tiny", "--revision", repo.commit)
    asked = len(hub.requests)
    again = estimate_json(monkeypatch, capsys, "-m", "org/tiny", "--revision", repo.commit)
    assert again == first and again["weights_source"] == "checkpoint"
    assert (
        len(hub.requests) == asked
    )  # config in the cache, inventory in the assets cache: the Hub is not asked


def test_gated_repo_with_a_granted_token(env, hub, monkeypatch, capsys):
    hub.add(
        "org/gated",
        {"config.json": CONFIG, "model.safetensors": safetensors_file(tiny_tensors())},
        gated=True,
    )
    data = estimate_json(monkeypatch, capsys, "-m", "org/gated", "--token", GOOD_TOKEN)
    assert data["weights_source"] == "checkpoint"
    assert all(auth for _, path, _, auth in hub.requests if not path.startswith("/cdn/"))
    monkeypatch.setenv("HF_TOKEN", GOOD_TOKEN)  # huggingface_hub's own token lookup
    assert estimate_json(monkeypatch, capsys, "-m", "org/gated")["weights_source"] == "checkpoint"


def test_private_repo_needs_a_token(env, hub, monkeypatch, capsys):
    hub.add("org/private", {"config.json": CONFIG}, private=True)
    assert (
        estimate_json(monkeypatch, capsys, "-m", "org/private", "--token", GOOD_TOKEN)["model"]
        == "org/private"
    )
    code, _, err = run_main(monkeypatch, capsys, "estimate", "-m", "org/private", "--ctx", "1k")
    assert_one_line_error(code, err, "org/private", "no such model repo on the Hub", "if it is private")


def test_real_cli_subprocess_with_hf_endpoint(env, hub):
    hub.add("org/tiny", {"config.json": CONFIG, "model.safetensors": safetensors_file(tiny_tensors())})
    result = subprocess.run(
        [sys.executable, "-m", "kvplan", "estimate", "-m", "org/tiny", "--ctx", "1k", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert (data["weights_bytes"], data["weights_source"]) == (TINY_PARAMS * 2, "checkpoint")
    assert result.stderr == ""  # no progress bars or warnings from huggingface_hub


def test_plan_takes_hub_ids(env, hub, monkeypatch, capsys):
    hub.add("org/tiny", {"config.json": CONFIG})
    code, out, err = run_main(
        monkeypatch,
        capsys,
        "plan",
        "-m",
        "org/tiny",
        "--ctx",
        "1k",
        "--users",
        "4",
        "--gpu",
        "h100",
        "--json",
    )
    assert code == 0, err
    assert json.loads(out)["model"] == "org/tiny"


def test_table_takes_revision_and_token(env, hub, monkeypatch, capsys):
    repo = hub.add("org/private", {"config.json": CONFIG}, private=True)
    repo.branches = {"main": repo.commit, "v2": commit_of("v2")}
    code, out, err = run_main(monkeypatch, capsys, "table", "-m", "org/private", "--ctx", "1k,4k", "-f", "json",
                              "--revision", "v2", "--token", GOOD_TOKEN)
    assert code == 0, err
    records = json.loads(out)["rows"]
    assert [(r["model"], r["ctx"]) for r in records] == [("org/private", 1024), ("org/private", 4096)]
    assert [r["kv_bytes_per_sequence"] for r in records] == [TINY_KV_PER_TOKEN * 1024, TINY_KV_PER_TOKEN * 4096]
    assert ("GET", "/api/models/org/private/revision/v2", None, True) in hub.requests
    assert all(auth for _, _, _, auth in hub.requests)
    code, out, err = run_main(monkeypatch, capsys, "table", "-m", "org/private", "--ctx", "1k", "--revision", "v2")
    assert_one_line_error(code, err, "org/private", "no such model repo on the Hub", "if it is private")
    assert out == ""
    code, _, err = run_main(monkeypatch, capsys, "table", "-m", "org/private", "--ctx", "1k", "--revision", "v9",
                            "--token", GOOD_TOKEN)
    assert_one_line_error(code, err, "org/private has no revision 'v9'", "leave --revision out")


def test_plot_takes_revision_and_token(env, hub, monkeypatch, capsys, tmp_path):
    pytest.importorskip("matplotlib")
    from kvplan.plot import svg_data

    repo = hub.add(
        "org/gated",
        {"config.json": CONFIG, "model.safetensors": safetensors_file(tiny_tensors())},
        gated=True,
    )
    repo.branches = {"main": repo.commit, "v2": commit_of("v2")}
    chart = tmp_path / "kv.svg"
    code, _, err = run_main(monkeypatch, capsys, "plot", "-m", "org/gated", "--revision", "v2", "--out",
                            str(chart))
    assert_one_line_error(code, err, "org/gated is gated", "--token", "HF_TOKEN")
    assert not chart.exists()
    hub.requests.clear()
    code, out, err = run_main(monkeypatch, capsys, "plot", "-m", "org/gated", "--ctx", "1k,4k", "--with-weights",
                              "--revision", "v2", "--token", GOOD_TOKEN, "--out", str(chart))
    assert code == 0, err
    (line,) = svg_data(chart.read_text())["lines"]
    # weights from the safetensors header (106,816 BF16 elements x 2 bytes), plus the KV cache
    assert line["values"] == [TINY_PARAMS * 2 + TINY_KV_PER_TOKEN * n for n in (1024, 4096)]
    assert ("GET", "/api/models/org/gated/revision/v2", None, True) in hub.requests
    assert all(auth for _, path, _, auth in hub.requests if not path.startswith("/cdn/"))


# ---------------------------------------------------------------------------------------------- errors


def test_repo_not_found_mentions_the_closest_library_names(env, hub, monkeypatch, capsys):
    code, _, err = run_main(
        monkeypatch, capsys, "estimate", "-m", "meta-llama/Llama-3.1-8B-Nope", "--ctx", "1k"
    )
    assert_one_line_error(
        code,
        err,
        "meta-llama/Llama-3.1-8B-Nope",
        "no such model repo on the Hub",
        "closest in the bundled library: meta-llama/Llama-3.1-8B",
    )
    assert hub.requests[0][:2] == ("GET", "/api/models/meta-llama/Llama-3.1-8B-Nope")


def test_repo_not_found_with_a_token(env, hub, monkeypatch, capsys):
    code, _, err = run_main(monkeypatch, capsys, "show", "-m", "org/missing", "--token", NO_ACCESS_TOKEN)
    assert_one_line_error(code, err, "org/missing", "no such model repo", "your token cannot see it")


def test_gated_without_token(env, hub, monkeypatch, capsys):
    hub.add("org/gated", {"config.json": CONFIG}, gated=True)
    code, _, err = run_main(monkeypatch, capsys, "estimate", "-m", "org/gated", "--ctx", "1k")
    assert_one_line_error(
        code, err, "org/gated is gated", f"accept its licence at {hub.url}/org/gated", "--token", "HF_TOKEN"
    )


def test_gated_with_a_token_not_granted(env, hub, monkeypatch, capsys):
    hub.add("org/gated", {"config.json": CONFIG}, gated=True)
    code, _, err = run_main(
        monkeypatch, capsys, "estimate", "-m", "org/gated", "--ctx", "1k", "--token", NO_ACCESS_TOKEN
    )
    assert_one_line_error(code, err, "org/gated is gated", "no access yet", "accept its licence")


def test_bad_token(env, hub, monkeypatch, capsys):
    hub.add("org/tiny", {"config.json": CONFIG})
    code, _, err = run_main(
        monkeypatch, capsys, "estimate", "-m", "org/tiny", "--ctx", "1k", "--token", "hf_not_a_real_token"
    )
    assert_one_line_error(code, err, "refused the token", "invalid credentials", "HF_TOKEN")
    assert "hf_not_a_real_token" not in err


def test_revision_not_found(env, hub, monkeypatch, capsys):
    hub.add("org/tiny", {"config.json": CONFIG})
    code, _, err = run_main(
        monkeypatch, capsys, "estimate", "-m", "org/tiny", "--ctx", "1k", "--revision", "v9"
    )
    assert_one_line_error(code, err, "org/tiny has no revision 'v9'", "leave --revision out")


def test_repo_without_config_json(env, hub, monkeypatch, capsys):
    hub.add("org/diffusers", {"model_index.json": b"{}", "README.md": b"# not a transformers model"})
    code, _, err = run_main(monkeypatch, capsys, "estimate", "-m", "org/diffusers", "--ctx", "1k")
    assert_one_line_error(code, err, "org/diffusers has no config.json", "YAML spec")
    hub.add("org/gguf-only", {"model-Q4_K_M.gguf": b"GGUF", "README.md": b"# gguf"})
    code, _, err = run_main(monkeypatch, capsys, "estimate", "-m", "org/gguf-only", "--ctx", "1k")
    assert_one_line_error(code, err, "org/gguf-only has no config.json but GGUF files (model-Q4_K_M.gguf)",
                          "org/gguf-only:TAG", "--gguf-file")


def test_entry_not_found_from_the_download_itself(env, hub, monkeypatch, capsys):
    """model info lists config.json, but the file is gone by the time it is fetched (404 EntryNotFound)."""
    repo = hub.add("org/racy", {"config.json": CONFIG})
    original = hub.model_info

    def listing_then_gone(req, head, repo_id, repo_, commit):
        original(req, head, repo_id, repo_, commit)
        repo.files.pop("config.json", None)

    monkeypatch.setattr(hub, "model_info", listing_then_gone)
    code, _, err = run_main(monkeypatch, capsys, "estimate", "-m", "org/racy", "--ctx", "1k")
    assert_one_line_error(code, err, "org/racy has no config.json")


def test_slow_hub_times_out_quickly(monkeypatch, home, hub, capsys):
    hub_environment(monkeypatch, home, endpoint=hub.url, etag_timeout=1)
    hub.add("org/slow", {"config.json": CONFIG}, slow=6)
    start = time.perf_counter()
    code, _, err = run_main(monkeypatch, capsys, "estimate", "-m", "org/slow", "--ctx", "1k")
    assert time.perf_counter() - start < 4  # the 1 s timeout, not the 6 s answer
    assert_one_line_error(code, err, "did not answer in time", "HF_HUB_ETAG_TIMEOUT=1s", "HF_HUB_OFFLINE=1")


def test_slow_hub_subprocess_honours_hf_hub_etag_timeout(monkeypatch, home, hub):
    env = hub_environment(monkeypatch, home, endpoint=hub.url, etag_timeout=1)
    hub.add("org/slow", {"config.json": CONFIG}, slow=8)
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "kvplan", "show", "-m", "org/slow"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env=env,
    )
    assert time.perf_counter() - start < 6  # start-up and the 1 s timeout, not the 8 s answer
    assert_one_line_error(result.returncode, result.stderr, "did not answer in time")


def test_slow_hub_falls_back_to_the_cache(monkeypatch, home, hub, capsys):
    hub_environment(monkeypatch, home, endpoint=hub.url, etag_timeout=1)
    repo = hub.add("org/slow", {"config.json": CONFIG}, slow=6)
    put_in_cache(home / "hub", "org/slow", repo.commit, {"config.json": CONFIG})
    code, out, err = run_main(monkeypatch, capsys, "estimate", "-m", "org/slow", "--ctx", "1k")
    assert code == 0, err
    text = " ".join(out.split())
    assert "the Hub did not answer (timed out): read the cached config.json" in text
    assert f"Hub: org/slow @ {repo.commit}" in text


def test_hub_down_uses_the_cache_or_says_so(env, hub, home, monkeypatch, capsys):
    repo = hub.add("org/down", {"config.json": CONFIG}, status=503)
    code, _, err = run_main(monkeypatch, capsys, "estimate", "-m", "org/down", "--ctx", "1k")
    assert_one_line_error(code, err, "the Hub answered 503 for org/down", "try again later")
    put_in_cache(home / "hub", "org/down", repo.commit, {"config.json": CONFIG})
    code, out, err = run_main(monkeypatch, capsys, "estimate", "-m", "org/down", "--ctx", "1k")
    assert code == 0, err
    assert "the Hub did not answer (answered 503): read the cached config.json" in " ".join(out.split())


@pytest.mark.parametrize(
    "status, fragments",
    [(403, ["the token may not read org/odd", "403 forbidden"]), (429, ["rate-limiting", "wait a minute"])],
)
def test_other_refusals(env, hub, monkeypatch, capsys, status, fragments):
    hub.add("org/odd", {"config.json": CONFIG}, status=status)
    code, _, err = run_main(monkeypatch, capsys, "show", "-m", "org/odd")
    assert_one_line_error(code, err, *fragments)


def test_unreadable_safetensors_header_falls_back_with_a_note(env, hub, monkeypatch, capsys):
    hub.add("org/broken", {"config.json": CONFIG, "model.safetensors": b"\xff" * 16})
    code, out, err = run_main(monkeypatch, capsys, "estimate", "-m", "org/broken", "--ctx", "1k")
    assert code == 0, err
    text = " ".join(out.split())
    assert "could not read the safetensors headers (SafetensorsParsingError" in text
    assert "weights (bf16) " in text


def test_hub_unreachable(monkeypatch, home, capsys):
    server = FakeHub()
    url = server.url
    server.close()  # nothing listens there any more: connection refused
    hub_environment(monkeypatch, home, endpoint=url)
    code, _, err = run_main(monkeypatch, capsys, "estimate", "-m", "org/tiny", "--ctx", "1k")
    assert_one_line_error(code, err, "cannot reach the Hub", url, "HF_ENDPOINT")


def test_revision_with_a_local_path_or_a_non_hub_name(env, hub, monkeypatch, capsys):
    local = str(Path(ROOT / "model_specs" / "Qwen__Qwen3-8B.json"))
    code, _, err = run_main(monkeypatch, capsys, "show", "-m", local, "--revision", "main")
    assert_one_line_error(code, err, "--revision is for Hub repos")
    code, _, err = run_main(monkeypatch, capsys, "show", "-m", "no-such-model", "--revision", "main")
    assert_one_line_error(code, err, "--revision is for Hub repos", "not a Hub id")
    assert hub.requests == []
