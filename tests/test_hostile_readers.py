"""Hostile input to the readers, second pass: config values out of range, counts that size per-layer lists, paths
the system cannot look up, YAML aliases, safetensors headers that do not match their data, and the Hub's
environment and servers. Each ends in sensible output or one `kvplan: error:` line with exit 2: no bug (exit 70),
no hang, no silently wrong number, no credential printed. Inputs are made here: configs edited from the genuine
ones in model_specs/, YAML and safetensors files written by the tests, a fake Hub on 127.0.0.1 (tests/hubkit.py),
environment variables on a subprocess."""

import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, SPECS, assert_one_line_error, load, run_main
from hubkit import GOOD_TOKEN, TINY_CONFIG, FakeHub, hub_environment, safetensors_file, tiny_tensors

CONFIG = json.dumps(TINY_CONFIG).encode()


DROP = object()  # a field to leave out


def edited(tmp_path, filename: str, *edits: tuple[tuple, object]) -> str:
    """A genuine config with fields set or dropped (a key path and its value, or DROP), as tmp_path/config.json."""
    data = json.loads((SPECS / filename).read_text(encoding="utf-8"))
    for path, value in edits:
        parent = data
        for key in path[:-1]:
            parent = parent[key]
        if value is DROP:
            parent.pop(path[-1])
        else:
            parent[path[-1]] = value
    out = tmp_path / "config.json"
    out.write_text(json.dumps(data), encoding="utf-8")
    return str(out)


def estimate(monkeypatch, capsys, model: str, *args: str) -> tuple[int, str, str]:
    return run_main(monkeypatch, capsys, "estimate", "--model", model, "--ctx", "8k", *args)


# ---------------------------------------------------------------------------------------------- config values


SCOUT = "meta-llama__Llama-4-Scout-17B-16E-Instruct.json"


@pytest.mark.parametrize("ratio", [1.5, 2, 100, 1e-300, 0.04])
def test_a_pixel_shuffle_ratio_that_leaves_no_row_is_one_line(monkeypatch, capsys, tmp_path, ratio):
    """Llama 4's image rows per tile are patches // round(1 / ratio^2) (vLLM mllama4.py): above ~1.41 the divisor
    rounds to 0 (a ZeroDivisionError), below 1 / sqrt(576 patches) no row is left."""
    config = edited(tmp_path, SCOUT, (("vision_config", "pixel_shuffle_ratio"), ratio))
    code, _, err = estimate(monkeypatch, capsys, config)
    assert_one_line_error(code, err, "pixel_shuffle_ratio", "between 0.0417")


@pytest.mark.parametrize(("ratio", "rows"), [(0.5, 144), (1.0, 576), (0.9, 576), (1 / 24, 1)])
def test_pixel_shuffle_ratios_in_range_count_as_vllm_counts(tmp_path, ratio, rows):
    """Scout's 336-pixel tiles of 14-pixel patches: 24 x 24 = 576 patches, round(1 / ratio^2) of them a row
    (0.5: 4, Scout's own; 1: none merged; 0.9: round(1.23) = 1; 1/24: all 576 in one); 16 tiles and a global one."""
    from kvplan.sources.hf_config import read_config_file

    spec = read_config_file(Path(edited(tmp_path, SCOUT, (("vision_config", "pixel_shuffle_ratio"), ratio))))
    assert spec.multimodal.tokens_per_item == 17 * rows


@pytest.mark.parametrize("layer", [["Mamba2"], {"name": "Mamba2"}, 2])
def test_a_mamba_ssm_layer_that_is_not_a_name_is_one_line(monkeypatch, capsys, tmp_path, layer):
    config = edited(tmp_path, "state-spaces__mamba2-2.7b.json", (("ssm_cfg", "layer"), layer))
    code, _, err = estimate(monkeypatch, capsys, config)
    assert_one_line_error(code, err, "ssm_cfg layer", "Mamba1, Mamba2")


# An MoE model with its expert count zeroed, and the top-k field it still states (the model's experts would go
# uncounted: Mixtral read as 7.24B params instead of 46.70B).
ZEROED_EXPERTS = [("mistralai__Mixtral-8x7B-v0.1.json", ("num_local_experts",), "num_experts_per_tok"),
                  ("deepseek-ai__DeepSeek-V3.json", ("n_routed_experts",), "num_experts_per_tok"),
                  ("deepseek-ai__DeepSeek-V3.2.json", ("n_routed_experts",), "num_experts_per_tok"),
                  ("Qwen__Qwen3-30B-A3B.json", ("num_experts",), "num_experts_per_tok"),
                  ("MiniMaxAI__MiniMax-M2.7.json", ("num_local_experts",), "num_experts_per_tok"),
                  ("ibm-granite__granite-4.0-h-small.json", ("num_local_experts",), "num_experts_per_tok"),
                  (SCOUT, ("text_config", "num_local_experts"), "num_experts_per_tok"),
                  ("moonshotai__Kimi-Linear-48B-A3B-Instruct.json", ("num_experts",), "num_experts_per_token"),
                  ("openai__gpt-oss-20b.json", ("num_local_experts",), "num_experts_per_tok")]


@pytest.mark.parametrize(("filename", "field", "top_k"), ZEROED_EXPERTS)
def test_zero_experts_with_experts_per_token_is_refused(monkeypatch, capsys, tmp_path, filename, field, top_k):
    code, _, err = estimate(monkeypatch, capsys, edited(tmp_path, filename, (field, 0)))
    assert_one_line_error(code, err, top_k, "has 0 experts", "cannot exceed the expert count")


def test_zero_experts_and_none_per_token_is_a_dense_model():
    """Granite 4.0-H-1B states num_local_experts 0 and num_experts_per_tok 0: its MLPs are dense (transformers
    GraniteMoeHybrid builds no MoE block for 0 experts)."""
    spec = load("ibm-granite__granite-4.0-h-1b.json")
    assert spec.params.experts == 0 and spec.params.mlp > 0


MTP_COUNTS = [("deepseek-ai__DeepSeek-V3.json", ("num_nextn_predict_layers",)),
              ("zai-org__GLM-5.json", ("num_nextn_predict_layers",)),
              ("Qwen__Qwen3.5-27B.json", ("text_config", "mtp_num_hidden_layers"))]


@pytest.mark.parametrize("count", [10**7, 2**53])
@pytest.mark.parametrize(("filename", "field"), MTP_COUNTS)
def test_an_mtp_layer_count_past_the_limit_is_refused_before_building(monkeypatch, capsys, tmp_path, filename,
                                                                      field, count):
    """10^7 MTP layers took 33 s and 7.5 GB before the refusal; 2^53 ran out of memory (exit 70)."""
    start = time.monotonic()
    code, _, err = estimate(monkeypatch, capsys, edited(tmp_path, filename, (field, count)))
    assert time.monotonic() - start < 10
    assert_one_line_error(code, err, field[-1], "more layers than any real model", "100,000")


@pytest.mark.parametrize(("filename", "edits"), [
    ("LiquidAI__LFM2-1.2B.json", [(("num_hidden_layers",), 99_999), (("full_attn_idxs",), list(range(99_999)))]),
    ("moonshotai__Kimi-Linear-48B-A3B-Instruct.json", [
        (("num_hidden_layers",), 99_999), (("linear_attn_config", "full_attn_layers"), list(range(1, 99_999))),
        (("linear_attn_config", "kda_layers"), [99_999])]),
    ("google__gemma-3n-E2B.json", [
        (("text_config", "num_hidden_layers"), 99_995), (("text_config", "num_kv_shared_layers"), 49_995),
        (("text_config", "layer_types"), DROP), (("text_config", "activation_sparsity_pattern"), DROP),
        (("text_config", "intermediate_size"), 8192)]),
], ids=["lfm2-attention-indices", "kimi-full-attention-layers", "gemma3n-shared-layers"])
def test_long_per_layer_lists_are_read_in_linear_time(tmp_path, filename, edits):
    """Near MAX_LAYERS: a membership test in a list (LFM2's full_attn_idxs, Kimi Linear's full_attn_layers) or a
    scan of the earlier layers for each shared one (Gemma 3n's num_kv_shared_layers) made these configs take one
    to several minutes; they take seconds."""
    from conftest import run_cli

    result = run_cli("estimate", "--model", edited(tmp_path, filename, *edits), "--ctx", "8k", "--json", timeout=60)
    assert result.returncode == 0, result.stderr
    assert sum(row["layers"] for row in json.loads(result.stdout)["breakdown"]) > 49_000


# ---------------------------------------------------------------------------------------------- paths


LONG = "a" * 300  # past the 255 bytes a file name may have (ENAMETOOLONG)


@pytest.mark.parametrize("name", [f"{LONG}.json", f"{LONG}.yaml", LONG, f"{LONG}/config.json", f"{LONG}.gguf"])
def test_a_path_the_system_cannot_look_up_is_one_line(monkeypatch, capsys, tmp_path, name):
    monkeypatch.chdir(tmp_path)
    code, _, err = estimate(monkeypatch, capsys, name)
    assert_one_line_error(code, err, "cannot look it up", "file name too long")


# ---------------------------------------------------------------------------------------------- YAML


def alias_bomb(levels: int = 10) -> str:
    """A spec whose field holds ten levels of ten aliases to the level below: 10^10 values in about 430 bytes."""
    lines = ["a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\nname: x\n"


@pytest.mark.parametrize(("text", "fragment"), [
    (alias_bomb(), "more than 1,000,000 values"),
    ("name: &x [*x]\n", "anchor used inside itself"),
    ("name: x\nparams: &p\n  total: 1\n  nested: *p\n", "anchor used inside itself"),
], ids=["ten-levels", "list-in-itself", "mapping-in-itself"])
def test_yaml_aliases_that_explode_or_loop_are_one_line(monkeypatch, capsys, tmp_path, text, fragment):
    """The number check walked the expanded objects: the bomb ran for hours, a loop exited 70 (RecursionError)."""
    path = tmp_path / "spec.yaml"
    path.write_text(text, encoding="utf-8")
    start = time.monotonic()
    code, _, err = estimate(monkeypatch, capsys, str(path))
    assert time.monotonic() - start < 10
    assert_one_line_error(code, err, "spec.yaml", fragment)


def test_yaml_aliases_within_reason_are_read(monkeypatch, capsys, tmp_path):
    """An anchored layer group used again: 2 x 16 layers of 8 KV heads of 128, bf16: 32 x 2 x 8 x 128 x 2 bytes."""
    path = tmp_path / "spec.yaml"
    path.write_text("name: x\nnum_attention_heads: 32\nparams: {total: 8000000000}\nlayers:\n"
                    "  - &g {kind: full, count: 16, kv_heads: 8, head_dim: 128}\n  - *g\n", encoding="utf-8")
    code, out, err = estimate(monkeypatch, capsys, str(path), "--json")
    assert code == 0, err
    assert json.loads(out)["kv_bytes_per_token"] == 32 * 2 * 8 * 128 * 2


# ---------------------------------------------------------------------------------------------- safetensors


def safetensors_bytes(header: dict, data: int) -> bytes:
    """A safetensors file as written byte by byte: the header as given (its data_offsets true or not), padded to 8
    bytes, then `data` zero bytes."""
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + bytes(data)


def bf16(shape: list[int], begin: int, end: int) -> dict:
    return {"dtype": "BF16", "shape": shape, "data_offsets": [begin, end]}


# name: (header, bytes of data after it, why kvplan does not count it); the safetensors library refuses each file
# but the first
SAFETENSORS = {
    "metadata only": ({"__metadata__": {"format": "pt"}}, 0, "hold no tensors"),
    "2^62 rows over no data": ({"w": bf16([2**62, 4], 0, 0)}, 0, "data_offsets [0, 0] of tensor 'w'"),
    "no data_offsets": ({"w": {"dtype": "BF16", "shape": [4, 4]}}, 32, "has data_offsets None"),
    "a gap": ({"a": bf16([2], 0, 4), "b": bf16([2], 8, 12)}, 12, "data_offsets [8, 12] of tensor 'b'"),
    "an overlap": ({"a": bf16([2], 0, 4), "b": bf16([2], 2, 6)}, 6, "data_offsets [2, 6] of tensor 'b'"),
    "a span too short": ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, 4, "2 F32 elements"),
    "half a byte": ({"a": {"dtype": "F4", "shape": [3], "data_offsets": [0, 2]}}, 2, "3 F4 elements"),
    "data past the tensors": ({"a": bf16([2], 0, 4)}, 5, "end at byte 4 of the data, but the file holds 5"),
    "data cut short": ({"a": bf16([2], 0, 4)}, 3, "end at byte 4 of the data, but the file holds 3"),
}


def checkpoint(tmp_path, data: bytes) -> str:
    directory = tmp_path / "model"
    directory.mkdir()
    (directory / "config.json").write_bytes(CONFIG)
    (directory / "model.safetensors").write_bytes(data)
    return str(directory)


@pytest.mark.parametrize("case", list(SAFETENSORS))
def test_tensors_their_data_offsets_do_not_hold_are_not_the_weights(monkeypatch, capsys, tmp_path, case):
    """A header's shapes counted over its own data_offsets: a metadata-only file gave "0 B, exact" weights and a
    [2^62, 4] tensor with empty offsets 32 EiB. Now the weights come from the config, with a note saying why."""
    header, data, reason = SAFETENSORS[case]
    code, out, err = estimate(monkeypatch, capsys, checkpoint(tmp_path, safetensors_bytes(header, data)), "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["weights_source"] == "config"
    assert result["weights_bytes"] == 2 * (2 * 256 * 64 + 2 * (2 * 64 * 64 + 2 * 32 * 64 + 3 * 64 * 128 + 2 * 64) + 64)
    assert any("safetensors header unreadable" in note and reason in note for note in result["notes"]), result["notes"]


@pytest.mark.parametrize("case", list(SAFETENSORS))
def test_the_safetensors_library_refuses_the_same_files(tmp_path, case):
    """The outside check: safetensors' own reader (safe_open, `Metadata::validate`) refuses each file kvplan does
    not count, but the one with no tensors, which it opens and finds empty."""
    safetensors = pytest.importorskip("safetensors")
    header, data, _ = SAFETENSORS[case]
    path = tmp_path / "model.safetensors"
    path.write_bytes(safetensors_bytes(header, data))
    if case == "metadata only":
        with safetensors.safe_open(path, "numpy") as handle:
            assert list(handle.keys()) == []
    else:
        with pytest.raises(safetensors.SafetensorError):
            safetensors.safe_open(path, "numpy")


def test_tensors_listed_out_of_offset_order_are_read(monkeypatch, capsys, tmp_path):
    """The tensors tile the data in the order of their offsets, not of the header (safetensors sorts them)."""
    header = {"b": bf16([2], 4, 8), "a": bf16([2], 0, 4), "c": {"dtype": "F32", "shape": [], "data_offsets": [8, 12]}}
    code, out, err = estimate(monkeypatch, capsys, checkpoint(tmp_path, safetensors_bytes(header, 12)), "--json")
    assert code == 0, err
    assert json.loads(out)["weights_source"] == "checkpoint" and json.loads(out)["weights_bytes"] == 12


def test_a_hub_header_its_data_offsets_do_not_hold_is_a_note(monkeypatch, capsys, tmp_path):
    """The same check on headers read from the Hub by range requests (huggingface_hub's parse keeps the offsets)."""
    hub = FakeHub()
    bad = safetensors_bytes({"w": bf16([2**62, 4], 0, 0)}, 0)
    hub.add("org/claims", {"config.json": CONFIG, "model.safetensors": bad})
    hub_environment(monkeypatch, tmp_path / "hf", endpoint=hub.url)
    try:
        code, out, err = estimate(monkeypatch, capsys, "org/claims", "--json")
    finally:
        hub.close()
    assert code == 0, err
    result = json.loads(out)
    assert result["weights_source"] == "config"
    assert any("could not read the safetensors headers" in note and "data_offsets [0, 0]" in note
               for note in result["notes"]), result["notes"]


# ---------------------------------------------------------------------------------------------- the Hub


def run_kvplan(env: dict, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """The command line in a fresh interpreter with `env` (huggingface_hub reads its variables on import)."""
    env = {key: value for key, value in env.items() if key != "KVPLAN_DEBUG"}  # a bug is exit 70, not a traceback
    return subprocess.run([sys.executable, "-m", "kvplan", *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, env=env)


@pytest.mark.parametrize(("name", "value"), [("HF_HUB_ETAG_TIMEOUT", "9999999999"),
                                             ("HF_HUB_DOWNLOAD_TIMEOUT", "9999999999"),
                                             ("HF_HUB_ETAG_TIMEOUT", "0")])
def test_hub_timeouts_are_bounded_when_read(monkeypatch, tmp_path, name, value):
    """A timeout past threading.TIMEOUT_MAX made the deadline thread raise OverflowError (exit 70); 0 gave up at
    once."""
    hub = FakeHub()
    hub.add("org/tiny", {"config.json": CONFIG})
    try:
        env = hub_environment(monkeypatch, tmp_path / "hf", endpoint=hub.url) | {name: value}
        result = run_kvplan(env, "estimate", "--model", "org/tiny", "--ctx", "1k")
    finally:
        hub.close()
    assert_one_line_error(result.returncode, result.stderr, f"{name}={value}", "from 1 to 3,600")


class MisbehavingGgufHub(FakeHub):
    """The fake Hub, with its GGUF file served wrongly in one way (`mode`): a CDN redirect to itself or to a
    file:// URL, a range answered with 7 bytes or with other bytes than asked, model info without its commit or with
    a file name that is a list."""

    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode

    def cdn(self, req, head: bool, sha256: str) -> None:
        if self.mode == "redirect-loop":
            return self.send(req, head, 302, b"", {"Location": req.path})
        if self.mode == "redirect-file":
            return self.send(req, head, 302, b"", {"Location": "file:///etc/passwd"})
        wanted = (req.headers.get("range") or "").removeprefix("bytes=").partition("-")[0]
        if self.mode in ("seven-bytes", "other-range") and wanted and not head:
            start = int(wanted) + (4096 if self.mode == "other-range" else 0)
            data = self.cdn_files[sha256]
            chunk = data[start:start + 7]
            return self.send(req, head, 206, chunk, {"Content-Range": f"bytes {start}-{start + len(chunk) - 1}/"
                                                                      f"{len(data)}"})
        return super().cdn(req, head, sha256)

    def model_info(self, req, head: bool, repo_id: str, repo, commit: str) -> None:
        if self.mode not in ("no-sha", "name-list"):
            return super().model_info(req, head, repo_id, repo, commit)
        info = {"id": repo_id, "siblings": [{"rfilename": name} for name in sorted(repo.files)]}
        if self.mode == "name-list":
            info |= {"sha": commit, "siblings": [*info["siblings"], {"rfilename": ["x"]}]}
        return self.send(req, head, 200, json.dumps(info).encode(), {"Content-Type": "application/json"})


def tiny_gguf(tmp_path, extra: list = ()) -> bytes:
    """A real GGUF (gguf-py's writer) of a 2-layer Llama, about 1 MB: its header is read by range requests; `extra`
    tensors beside its own."""
    from ggufkit import Q, write_gguf

    meta = {".block_count": 2, ".context_length": 4096, ".embedding_length": 256, ".feed_forward_length": 512,
            ".attention.head_count": 4, ".attention.head_count_kv": 2, "general.file_type": 15}
    tensors = [("token_embd.weight", [256, 1024], Q.Q4_K), ("output.weight", [256, 1024], Q.Q6_K)]
    for i in range(2):
        tensors += [(f"blk.{i}.{name}.weight", shape, Q.Q4_K) for name, shape in
                    [("attn_q", [256, 256]), ("attn_k", [256, 128]), ("attn_v", [256, 128]),
                     ("attn_output", [256, 256]), ("ffn_gate", [256, 512]), ("ffn_up", [256, 512]),
                     ("ffn_down", [512, 256])]]
        tensors += [(f"blk.{i}.attn_norm.weight", [256], Q.F32), (f"blk.{i}.ffn_norm.weight", [256], Q.F32)]
    return write_gguf(tmp_path / "tiny.gguf", "llama", meta,
                      [*tensors, ("output_norm.weight", [256], Q.F32), *extra]).read_bytes()


@pytest.mark.parametrize(("mode", "fragment"), [
    ("redirect-loop", "HF_ENDPOINT"), ("redirect-file", "HF_ENDPOINT"), ("no-sha", "without the commit"),
    ("name-list", "file listing of the wrong shape"), ("seven-bytes", "sent 7 of the"),
    ("other-range", "with other bytes"),
])
def test_a_gguf_server_that_misbehaves_is_one_line(monkeypatch, capsys, tmp_path, mode, fragment):
    """Each exited 70 (the error check looked for httpx frames, but huggingface_hub 2 runs on httpx2 and the range
    requests call its session directly), or, for 7 bytes a range, took 72 s and 1,500 requests to fail."""
    hub = MisbehavingGgufHub(mode)
    hub.add("org/tiny-GGUF", {"tiny-Q4_K_M.gguf": tiny_gguf(tmp_path)})
    hub_environment(monkeypatch, tmp_path / "hf", endpoint=hub.url)
    start = time.monotonic()
    try:
        code, _, err = estimate(monkeypatch, capsys, "org/tiny-GGUF:Q4_K_M")
    finally:
        hub.close()
    assert time.monotonic() - start < 30 and len(hub.requests) < 40  # no waiting on a timeout, no 1,500 requests
    assert_one_line_error(code, err, fragment)


def test_a_served_gguf_is_still_read(monkeypatch, capsys, tmp_path):
    hub = MisbehavingGgufHub("none")
    hub.add("org/tiny-GGUF", {"tiny-Q4_K_M.gguf": tiny_gguf(tmp_path)})
    hub_environment(monkeypatch, tmp_path / "hf", endpoint=hub.url)
    try:
        code, out, err = estimate(monkeypatch, capsys, "org/tiny-GGUF:Q4_K_M", "--json")
    finally:
        hub.close()
    assert code == 0 and json.loads(out)["weights_source"] == "checkpoint", err


@pytest.fixture
def tiny_hub(monkeypatch, tmp_path):
    """A fake Hub holding a public org/tiny and a gated org/gated, and the environment pointing at it."""
    hub = FakeHub()
    hub.add("org/tiny", {"config.json": CONFIG})
    hub.add("org/gated", {"config.json": CONFIG}, gated=True)
    home = tmp_path / "hf"
    home.mkdir()
    env = hub_environment(monkeypatch, home, endpoint=hub.url)
    yield hub, home, env
    hub.close()


def test_a_token_file_that_is_a_device_is_refused_naming_it(tiny_hub):
    """HF_TOKEN_PATH=/dev/zero: the abandoned worker thread kept reading (9.2 GB), and the message blamed the Hub."""
    _, _, env = tiny_hub
    start = time.monotonic()
    result = run_kvplan(env | {"HF_TOKEN_PATH": "/dev/zero"}, "estimate", "--model", "org/tiny", "--ctx", "1k")
    assert time.monotonic() - start < 30
    assert_one_line_error(result.returncode, result.stderr, "token file /dev/zero", "not a regular file")


@pytest.mark.parametrize(("kind", "fragment"), [("fifo", "not a regular file"), ("directory", "not a regular file"),
                                                ("huge", "larger than 64 KiB"), ("non-ascii", "non-ASCII")])
def test_a_token_file_that_holds_no_token_is_refused_naming_it(monkeypatch, capsys, tiny_hub, kind, fragment):
    hub, home, _ = tiny_hub
    token = home / "token"
    if kind == "fifo":
        os.mkfifo(token)
    elif kind == "directory":
        token.mkdir()
    else:
        token.write_bytes(b"hf_" + b"x" * 2**17 if kind == "huge" else "hf_Sécret\n".encode())
    code, out, err = estimate(monkeypatch, capsys, "org/tiny")
    assert_one_line_error(code, err, f"token file {token}", fragment)
    assert "cret" not in out + err and not hub.requests


def test_a_token_file_is_read_as_huggingface_hub_reads_it(monkeypatch, capsys, tiny_hub):
    """Its line ending stripped; HF_TOKEN, when set, is read instead and the file is not checked."""
    _, home, _ = tiny_hub
    (home / "token").write_text(GOOD_TOKEN + "\r\n", encoding="utf-8")
    code, out, err = estimate(monkeypatch, capsys, "org/gated", "--json")
    assert code == 0 and GOOD_TOKEN not in out + err, err
    (home / "token").unlink()
    (home / "token").mkdir()
    monkeypatch.setenv("HF_TOKEN", GOOD_TOKEN)
    code, out, err = estimate(monkeypatch, capsys, "org/gated", "--json")
    assert code == 0, err


class BasicAuthHub(FakeHub):
    """The fake Hub behind a mirror that takes the user and password of HF_ENDPOINT (HTTP Basic), and whose files
    named *.safetensors fail with 500."""

    def handle(self, req, head: bool) -> None:
        if (req.headers.get("authorization") or "").startswith("Basic "):
            del req.headers["authorization"]
        if "/resolve/" in req.path and req.path.endswith(".safetensors"):
            return self.error(req, head, 500, None, "Internal Server Error")
        return super().handle(req, head)


def test_credentials_in_hf_endpoint_are_never_printed(monkeypatch, tmp_path):
    """Every Hub error and note quoted HF_ENDPOINT, or a URL under it, with its user:password."""
    hub = BasicAuthHub()
    hub.add("org/tiny", {"config.json": CONFIG, "model.safetensors": safetensors_file(tiny_tensors())})
    hub.add("org/gated", {"config.json": CONFIG}, gated=True)
    hub.add("org/slow", {"config.json": CONFIG}, slow=3)
    closed = FakeHub()
    closed.close()  # nothing listens there: connection refused
    try:
        outputs = []
        for url, model in [(hub.url, "org/tiny"), (hub.url, "org/gated"), (hub.url, "org/slow"),
                           (closed.url, "org/other"), ("user:s3cretpw@127.0.0.1", "org/tiny")]:
            endpoint = url.replace("://", "://kvuser:s3cretpw@")
            env = hub_environment(monkeypatch, tmp_path / "hf", endpoint=hub.url,
                                  etag_timeout=1 if model == "org/slow" else None) | {"HF_ENDPOINT": endpoint}
            result = run_kvplan(env, "estimate", "--model", model, "--ctx", "1k")
            outputs.append(result.stdout + result.stderr)
            assert result.returncode in (0, 2), result.stderr
    finally:
        hub.close()
    assert "could not read the safetensors headers (HfHubHTTPError" in " ".join(outputs[0].split())
    assert ["s3cret" in output for output in outputs] == [False] * 5, outputs
    assert "accept its licence at http://127.0.0.1:" in outputs[1] and "did not answer in time" in outputs[2]
    assert "cannot reach the Hub at http://127.0.0.1:" in outputs[3] and "HF_ENDPOINT=...@127.0.0.1" in outputs[4]


@pytest.mark.parametrize("name", ["../../etc/passwd", "/etc/passwd", "sub/../../x.gguf"])
@pytest.mark.parametrize("offline", [False, True])
def test_a_gguf_file_outside_the_repo_is_named(monkeypatch, capsys, tmp_path, tiny_hub, name, offline):
    """huggingface_hub refuses such a name in a ValueError, which read as the endpoint's fault."""
    hub, home, _ = tiny_hub
    hub_environment(monkeypatch, home, endpoint=hub.url, offline=offline)
    code, _, err = run_main(monkeypatch, capsys, "show", "--model", "org/tiny", "--gguf-file", name)
    assert_one_line_error(code, err, "--gguf-file", "not a path inside the repo", "--model path/to/model.gguf")
    assert "HF_ENDPOINT" not in err and not hub.requests


@pytest.mark.parametrize("model", ["org/tiny", "meta-llama/Llama-3-8B"])
def test_a_refused_token_says_so_without_suggesting_models(monkeypatch, capsys, tiny_hub, model):
    """A repo that answered (here 401 for the token) exists: library names that look alike are no help."""
    code, _, err = run_main(monkeypatch, capsys, "show", "--model", model, "--revision", "main", "--token",
                            "hf_NotATokenTheHubKnows")
    assert_one_line_error(code, err, "the Hub refused the token")
    assert "did you mean" not in err and "bundled library" not in err



def test_a_gguf_tensor_named_outside_any_layer_is_an_estimate(monkeypatch, capsys, tmp_path):
    """A 3-D `blk.x.ffn_down_exps.bias` (no layer number; llama.cpp's loader never asks for it) is counted among the
    parameters as any other tensor: an estimate with the plain file's KV cache, not a crash."""
    from ggufkit import Q

    plain, odd = tmp_path / "plain", tmp_path / "odd"
    plain.mkdir(), odd.mkdir()
    (plain / "tiny.gguf").write_bytes(tiny_gguf(plain))
    (odd / "tiny.gguf").write_bytes(tiny_gguf(odd, [("blk.x.ffn_down_exps.bias", [4, 4, 4], Q.F32)]))
    outputs = []
    for folder in (plain, odd):
        code, out, err = run_main(monkeypatch, capsys, "estimate", "-m", str(folder / "tiny.gguf"), "--ctx", "4k",
                                  "--json")
        assert code == 0, err
        outputs.append(json.loads(out))
    assert outputs[1]["kv_bytes_per_sequence"] == outputs[0]["kv_bytes_per_sequence"]
    assert outputs[1]["params_total"] == outputs[0]["params_total"] + 64
