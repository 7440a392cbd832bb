"""Hub ids read from a pre-populated Hugging Face cache in its real layout (models--org--name/blobs, refs,
snapshots/<commit>/config.json as relative symlinks), with HF_HUB_OFFLINE=1: through huggingface_hub's own
hf_hub_download, in a subprocess (the real CLI, environment variables only) and in-process. Nothing here can
reach a network: the endpoint is a local server that records any request, and offline mode must send none."""

import json
import subprocess
import sys

import pytest
from conftest import ROOT, run_main
from hubkit import (
    TINY_CONFIG,
    FakeHub,
    commit_of,
    hub_environment,
    put_in_cache,
    safetensors_file,
    sharded,
    tiny_tensors,
)
from test_cli import assert_one_line_error

REPO = "kvplan-test/tiny-llama"
COMMIT = commit_of("tiny main")
# The made-up Llama (hubkit.TINY_CONFIG) by hand: embedding 256 x 64 = 16,384, untied lm_head 16,384;
# per layer q 64x64 + k 32x64 + v 32x64 + o 64x64 = 12,288, MLP 3 x 64 x 128 = 24,576, 2 norms of 64;
# 2 layers and a final norm: 2 x 16,384 + 2 x (12,288 + 24,576 + 128) + 64 = 106,816 parameters.
TINY_PARAMS = 106_816
# KV per token: 2 layers x 2 KV heads x 16 x (K + V) x 2 bytes (bf16) = 256
TINY_KV_PER_TOKEN = 256


@pytest.fixture
def hub(monkeypatch):
    """A local endpoint that answers nothing useful and logs every request, so a test can assert none came."""
    server = FakeHub()
    yield server
    server.close()


@pytest.fixture
def offline(monkeypatch, tmp_path, hub):
    """HF_HOME in tmp, HF_HUB_OFFLINE=1, HF_ENDPOINT at the recording server; the cache holds REPO at main."""
    env = hub_environment(monkeypatch, tmp_path / "hf", endpoint=hub.url, offline=True)
    config = json.dumps(TINY_CONFIG).encode()
    put_in_cache(tmp_path / "hf" / "hub", REPO, COMMIT, {"config.json": config})
    return env


def cli(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kvplan", *args], capture_output=True, text=True, timeout=60, cwd=ROOT, env=env
    )


def test_offline_cache_real_cli_subprocess(offline, hub):
    result = cli(offline, "estimate", "-m", REPO, "--ctx", "1k", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["model"] == REPO
    assert data["kv_bytes_per_token"] == TINY_KV_PER_TOKEN
    assert data["kv_bytes_per_sequence"] == TINY_KV_PER_TOKEN * 1024
    assert data["params_total"] == TINY_PARAMS
    assert data["weights_bytes"] == TINY_PARAMS * 2 and data["weights_source"] == "config"
    result = cli(offline, "show", "-m", REPO)
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert f"Hub: {REPO} @ {COMMIT}" in text
    assert "offline" in text and "derived from the config" in text
    assert hub.requests == []  # HF_HUB_OFFLINE: not one request


def test_offline_cache_in_process(offline, hub, monkeypatch, capsys):
    code, out, err = run_main(monkeypatch, capsys, "estimate", "-m", REPO, "--ctx", "8k", "--batch", "2")
    assert code == 0, err
    text = " ".join(out.split())
    assert f"source: Hub: {REPO} @ {COMMIT}" in text
    assert "weights (bf16)" in text
    assert hub.requests == []


def test_offline_exact_weights_from_safetensors_in_the_snapshot(offline, tmp_path, monkeypatch, capsys):
    put_in_cache(
        tmp_path / "hf" / "hub", REPO, COMMIT, {"model.safetensors": safetensors_file(tiny_tensors())}
    )
    code, out, err = run_main(monkeypatch, capsys, "estimate", "-m", REPO, "--ctx", "1k", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["weights_source"] == "checkpoint"
    assert data["weights_bytes"] == TINY_PARAMS * 2  # 106,816 BF16 elements x 2 bytes, read from the header


def test_offline_sharded_snapshot_and_a_partial_download(offline, tmp_path, monkeypatch, capsys):
    # norms in F32 in the second shard: BF16 = 106,816 - 5 norms x 64 = 106,496 elements, F32 = 320
    first = tiny_tensors(range(1), head=False)
    second = {
        k: ("F32" if "norm" in k else "BF16", s)
        for k, (_, s) in tiny_tensors(range(1, 2), embed=False).items()
    }
    first = {k: ("F32" if "norm" in k else "BF16", s) for k, (_, s) in first.items()}
    files = sharded({"model-00001-of-00002.safetensors": first, "model-00002-of-00002.safetensors": second})
    partial = {k: v for k, v in files.items() if k != "model-00002-of-00002.safetensors"}
    put_in_cache(tmp_path / "hf" / "hub", REPO, COMMIT, partial)
    code, out, err = run_main(monkeypatch, capsys, "estimate", "-m", REPO, "--ctx", "1k", "--json")
    assert code == 0, err
    assert json.loads(out)["weights_source"] == "config"  # one shard missing: not the whole checkpoint
    put_in_cache(tmp_path / "hf" / "hub", REPO, COMMIT, files)
    code, out, err = run_main(monkeypatch, capsys, "estimate", "-m", REPO, "--ctx", "1k", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["weights_source"] == "checkpoint"
    assert data["weights_bytes"] == 106_496 * 2 + 320 * 4


def test_offline_revision_from_refs_and_by_commit(offline, tmp_path, monkeypatch, capsys):
    other = commit_of("tiny v2")
    put_in_cache(
        tmp_path / "hf" / "hub",
        REPO,
        other,
        {"config.json": json.dumps(TINY_CONFIG | {"num_hidden_layers": 4}).encode()},
        refs=("v2",),
    )
    for revision in ("v2", other):
        code, out, err = run_main(
            monkeypatch, capsys, "estimate", "-m", REPO, "--revision", revision, "--ctx", "1k", "--json"
        )
        assert code == 0, err
        assert json.loads(out)["kv_bytes_per_token"] == 2 * TINY_KV_PER_TOKEN  # 4 layers, not 2
    code, out, err = run_main(monkeypatch, capsys, "show", "-m", REPO, "--revision", "v2")
    assert code == 0, err
    assert f"@ {other} (revision v2)" in " ".join(out.split())


def test_offline_table_and_plot_read_a_cached_revision(offline, hub, tmp_path, monkeypatch, capsys):
    other = commit_of("tiny v2")
    put_in_cache(
        tmp_path / "hf" / "hub",
        REPO,
        other,
        {"config.json": json.dumps(TINY_CONFIG | {"num_hidden_layers": 4}).encode()},
        refs=("v2",),
    )
    code, out, err = run_main(monkeypatch, capsys, "table", "-m", REPO, "--ctx", "1k", "-f", "json")
    assert code == 0, err
    assert json.loads(out)["rows"][0]["kv_bytes_per_token"] == TINY_KV_PER_TOKEN  # main: 2 layers
    code, out, err = run_main(monkeypatch, capsys, "table", "-m", REPO, "--ctx", "1k", "-f", "json",
                              "--revision", "v2", "--token", "hf_unused_offline")
    assert code == 0, err
    assert json.loads(out)["rows"][0]["kv_bytes_per_token"] == 2 * TINY_KV_PER_TOKEN  # v2: 4 layers
    code, _, err = run_main(monkeypatch, capsys, "table", "-m", REPO, "--ctx", "1k", "--revision", "v9")
    assert_one_line_error(code, err, "HF_HUB_OFFLINE", "revision v9")
    pytest.importorskip("matplotlib")
    from kvplan.plot import svg_data

    chart = tmp_path / "kv.svg"
    code, _, err = run_main(monkeypatch, capsys, "plot", "-m", REPO, "--ctx", "1k,4k", "--revision", other,
                            "--out", str(chart))
    assert code == 0, err
    (line,) = svg_data(chart.read_text())["lines"]
    assert line["values"] == [2 * TINY_KV_PER_TOKEN * n for n in (1024, 4096)]
    assert hub.requests == []


def test_offline_and_not_cached_is_one_line(offline, hub, monkeypatch, capsys):
    code, _, err = run_main(monkeypatch, capsys, "estimate", "-m", "kvplan-test/not-cached", "--ctx", "1k")
    assert_one_line_error(
        code, err, "HF_HUB_OFFLINE", "kvplan-test/not-cached", "not in the Hugging Face cache"
    )
    code, _, err = run_main(monkeypatch, capsys, "show", "-m", REPO, "--revision", "v9")
    assert_one_line_error(code, err, "HF_HUB_OFFLINE", "revision v9")
    assert hub.requests == []


def test_offline_not_cached_subprocess(offline):
    result = cli(offline, "estimate", "-m", "kvplan-test/not-cached", "--ctx", "1k")
    assert_one_line_error(result.returncode, result.stderr, "HF_HUB_OFFLINE", "run once online")


def test_config_is_data_auto_map_never_imported(offline, tmp_path, monkeypatch, capsys):
    """The config names remote code (auto_map); the snapshot even holds it. It is never imported or run."""
    marker = tmp_path / "ran"
    evil = f"open({str(marker)!r}, 'w').write('remote code ran')\n".encode()
    put_in_cache(tmp_path / "hf" / "hub", REPO, COMMIT, {"modeling_evil.py": evil})
    code, _, err = run_main(monkeypatch, capsys, "show", "-m", REPO)
    assert code == 0, err
    assert not marker.exists()
    assert "modeling_evil" not in sys.modules


def test_bundled_library_and_local_names_never_import_huggingface_hub():
    """The library path must not get slower: huggingface_hub (and kvplan's Hub module) stay unimported for a
    bundled model, a local config, and an unknown name that is not Hub-shaped."""
    code = f"""
import sys
sys.argv = ["kvplan", "estimate", "-m", "meta-llama/Llama-3.1-8B", "--ctx", "8k", "--json"]
from kvplan import cli
try:
    cli.main()
except SystemExit as e:
    assert not e.code, e.code
sys.argv = ["kvplan", "show", "-m", {str(ROOT / "model_specs" / "Qwen__Qwen3-8B.json")!r}]
cli.main()
sys.argv = ["kvplan", "estimate", "-m", "llama-3-8bb", "--ctx", "8k"]
try:
    cli.main()
except SystemExit as e:
    assert e.code == 2
hub = ("huggingface_hub", "httpx", "requests", "kvplan.sources.hub")
bad = sorted(m for m in sys.modules if m.startswith(hub))
print("IMPORTED", bad, file=sys.stderr)
assert not bad
"""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    assert "IMPORTED []" in result.stderr


def test_local_checkpoint_directory_gets_exact_weights(tmp_path, monkeypatch, capsys):
    """Not the Hub at all: a local directory with config.json and model.safetensors (as `hf download` leaves
    it) is read the same way, without importing huggingface_hub."""
    (tmp_path / "config.json").write_text(json.dumps(TINY_CONFIG))
    (tmp_path / "model.safetensors").write_bytes(safetensors_file(tiny_tensors(dtype="F32")))
    code, out, err = run_main(monkeypatch, capsys, "estimate", "-m", str(tmp_path), "--ctx", "1k", "--json")
    assert code == 0, err
    data = json.loads(out)
    # the config says bf16, but these tensors are F32: 106,816 x 4 bytes
    assert (data["weights_bytes"], data["weights_source"]) == (TINY_PARAMS * 4, "checkpoint")
    (tmp_path / "model.safetensors").write_bytes(b"\xff" * 16)  # a header length past the format's limit
    code, out, err = run_main(monkeypatch, capsys, "show", "-m", str(tmp_path))
    assert code == 0, err
    assert "safetensors header unreadable" in " ".join(out.split())
