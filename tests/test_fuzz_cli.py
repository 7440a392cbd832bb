"""Fuzzing the command line as a user or an attacker would: flag values and config.json mutations, each run through
`kvplan.cli.main` in this process, as --json or as the text report. Every run ends in exit 0 (or 1: does not fit)
with sane numbers, or exit 2 with one line; a bug raises (KVPLAN_DEBUG is set for the tests) and a hang trips an
alarm.

CI runs a few dozen examples per test; the full run (docs/cli.md) sets KVPLAN_FUZZ_EXAMPLES:

    KVPLAN_FUZZ_EXAMPLES=3400 python -m pytest tests/test_fuzz_cli.py -p no:randomly
"""

import json
import os
import signal
from contextlib import contextmanager

from conftest import SPECS, run_main
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

EXAMPLES = int(os.environ.get("KVPLAN_FUZZ_EXAMPLES", "40"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))
SECONDS = 30  # one run, at most

# Values that are fine, nearly fine, or hostile: numbers at and past their limits, other scripts' digits, control
# characters, markup, huge strings.
NUMBERS = ["1", "0", "-1", "8192", "8k", "1.5k", "128K", "1M", "0.5", "1e3", "9007199254740993", "9" * 40, "٣٢",
           "nan", "inf", "", " ", "2**10", "0x10", "1_000"]
SIZES = ["24GiB", "80GB", "0", "0GiB", "0.5B", "1073741824", "10EiB", "-1GiB", "1.0000000001GiB", "GiB", "9" * 40]
TEXT = ["h100", "a100-80gb", "rtx-4090", "vllm", "sglang", "llama.cpp", "transformers", "ideal", "fp8", "bf16",
        "q8_0", "[bold]x", "[/dim]", "\x1b[2J", "a\rb", "\u202e", "x" * 5000, "../../etc/passwd", "/dev/zero", ""]
hostile = st.one_of(st.sampled_from(NUMBERS + SIZES + TEXT), st.text(max_size=30))

ESTIMATE_FLAGS = {"--ctx": NUMBERS, "--batch": NUMBERS, "--users": NUMBERS, "--gpus": NUMBERS, "--tp": NUMBERS,
                  "--pp": NUMBERS, "--block-size": NUMBERS, "--max-num-batched-tokens": NUMBERS,
                  "--kv-budget": SIZES, "--overhead": SIZES, "--vram": SIZES, "--gpu": TEXT, "--engine": TEXT,
                  "--kv-dtype": TEXT, "--weights-dtype": TEXT, "--engine-version": NUMBERS + TEXT,
                  "--gpu-memory-utilization": NUMBERS, "--avg-ctx": NUMBERS, "--shared-prefix": NUMBERS}
MODELS = ["llama-3-8b", "google/gemma-3-27b-it", "deepseek-ai/DeepSeek-V3", "openai/gpt-oss-20b",
          "ai21labs/Jamba-v0.1", "Qwen/Qwen3-Next-80B-A3B-Thinking", "google-t5/t5-base"]


@contextmanager
def alarm(seconds: int):
    def hung(*_):
        raise TimeoutError(f"a kvplan run took more than {seconds} s")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


SIGNED = ("kv_budget_bytes", "headroom_bytes")  # a deficit: the weights alone overfill the GPU


def sane(value, key: str = "") -> bool:
    """Every number in a JSON answer is finite, and none is negative but a budget or a headroom."""
    if isinstance(value, dict):
        return all(sane(v, k) for k, v in value.items())
    if isinstance(value, list):
        return all(sane(v, key) for v in value)
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return True
    return value == value and abs(value) != float("inf") and (value >= 0 or key in SIGNED)


def run(monkeypatch, capsys, *args: str) -> None:
    with alarm(SECONDS):
        code, out, err = run_main(monkeypatch, capsys, *args)
    if code in (0, 1):  # 1: the plan is printed and does not fit
        assert sane(json.loads(out)) if "--json" in args else out and "\x1b" not in out, out
    else:
        assert code == 2, (args, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("kvplan: error:"), (args, err)
        assert "\x1b" not in err and len(err) < 2000, (args, err)


@FUZZ
@given(st.sampled_from(MODELS), st.dictionaries(st.sampled_from(sorted(ESTIMATE_FLAGS)), hostile, max_size=5),
       st.sampled_from(NUMBERS[:8]), st.sampled_from([["--json"], []]))
def test_estimate_flags(monkeypatch, capsys, model, flags, ctx, output):
    args = ["estimate", "--model", model, "--ctx", flags.pop("--ctx", ctx), *output]
    for flag, value in flags.items():
        args += [flag, value]
    run(monkeypatch, capsys, *args)


@FUZZ
@given(st.sampled_from(MODELS), hostile, hostile, st.sampled_from(["h100", "l40s", "rtx-4090", "b200"]))
def test_plan_flags(monkeypatch, capsys, model, users, ctx, gpu):
    run(monkeypatch, capsys, "plan", "--model", model, "--users", users, "--ctx", ctx, "--gpu", gpu, "--json")


CONFIGS = ["meta-llama__Meta-Llama-3-8B.json", "google__gemma-3-27b-it.json", "deepseek-ai__DeepSeek-V3.json",
           "mistralai__Mixtral-8x7B-v0.1.json", "ai21labs__Jamba-v0.1.json", "nvidia__Nemotron-H-56B-Base-8K.json",
           "openai__gpt-oss-20b.json", "Qwen__Qwen3-Next-80B-A3B-Thinking.json"]
FIELD_VALUES = st.one_of(st.integers(min_value=-2, max_value=2**70), st.floats(allow_nan=True), st.booleans(),
                         st.none(), st.sampled_from(TEXT), st.lists(st.integers(-1, 10**6), max_size=4),
                         st.dictionaries(st.text(max_size=5), st.integers(), max_size=2))


def mutate(config: dict, edits: list) -> dict:
    """Set, drop or replace fields of the decoder config (its text_config when it has one)."""
    out = json.loads(json.dumps(config))
    decoder = out["text_config"] if isinstance(out.get("text_config"), dict) else out
    keys = sorted(decoder)
    for index, value, drop in edits:
        key = keys[index % len(keys)]
        if drop:
            decoder.pop(key, None)
        else:
            decoder[key] = value
    return out


@FUZZ
@given(st.sampled_from(CONFIGS), st.lists(st.tuples(st.integers(0, 500), FIELD_VALUES, st.booleans()), min_size=1,
                                          max_size=4),
       st.sampled_from([["--ctx", "8k"], ["--ctx", "32k", "--gpu", "h100"], ["--ctx", "4k", "--engine", "llama.cpp",
                                                                            "--vram", "24GiB"]]),
       st.sampled_from([["--json"], []]))
def test_config_mutations(monkeypatch, capsys, tmp_path_factory, name, edits, flags, output):
    config = json.loads((SPECS / name).read_text(encoding="utf-8"))
    path = tmp_path_factory.mktemp("fuzz") / "config.json"
    path.write_text(json.dumps(mutate(config, edits)), encoding="utf-8")
    run(monkeypatch, capsys, "estimate", "--model", str(path), *flags, *output)
