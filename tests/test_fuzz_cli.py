"""Fuzzing the command line as a user or an attacker would: flag values, config.json and GGUF mutations (field
values and types, tensors, the parts of split files), each run through `kvplan.cli.main` in this process, as --json
or as the text report. Every run ends in exit 0 (or 1: does not fit)
with sane numbers, or exit 2 with one line; a bug raises (KVPLAN_DEBUG is set for the tests) and a hang trips an
alarm.

CI runs a few dozen examples per test; the full run (docs/cli.md) sets KVPLAN_FUZZ_EXAMPLES:

    KVPLAN_FUZZ_EXAMPLES=3400 python -m pytest tests/test_fuzz_cli.py -p no:randomly
"""

import json
import os
import signal
from contextlib import contextmanager

import ggufkit
from conftest import SPECS, run_main
from hypothesis import HealthCheck, event, given, settings
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
                  "--gpu-memory-utilization": NUMBERS, "--avg-ctx": NUMBERS, "--shared-prefix": NUMBERS,
                  "--isl": NUMBERS, "--osl": NUMBERS, "--max-tpot": NUMBERS, "--max-ttft": NUMBERS,
                  "--min-tps": NUMBERS}
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
    event(f"exit {code}")  # --hypothesis-show-statistics: how many runs got past the checks
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


# Deployment flags: layouts, engines and their own flags, dtypes, drafts, LoRA and offloading, each with values that
# are right for some model and engine, wrong for others, or past their limits. A run draws an engine, then flags
# mostly from those every engine takes and its own (a flag another engine takes is refused at once).
COUNTS = ["1", "2", "3", "4", "8", "16", "64", "0", "-1", "1000"]
VALUES = {
    "--gpu": ["h100", "8xh100", "4xa100-80gb", "rtx-4090", "2xl40s", "b200", "64xh100", "mi300x", "m4-max"],
    "--vram": ["24GiB", "80GB", "1GiB", "2TiB"], "--gpus": COUNTS, "--tp": COUNTS, "--pp": COUNTS,
    "--dp": COUNTS, "--ep": COUNTS, "--users": ["1", "8", "64", "4096", "0"], "--batch": ["1", "4", "0"],
    "--kv-dtype": ["fp8", "bf16", "fp16", "fp32", "fp8_e5m2", "q8_0", "q4_0", "int4", "nf4"],
    "--weights-dtype": ["fp8", "int4", "bf16", "fp32", "q4_k_m", "int8", "mxfp4"],
    "--gpu-memory-utilization": ["0.5", "0.92", "1", "0.01", "1.5"], "--kv-budget": ["20GiB", "1MiB", "0"],
    "--overhead": ["0", "2GiB", "100GiB"], "--avg-ctx": ["1k", "100k"], "--shared-prefix": ["512", "1M"],
    "--draft-model": ["llama-3.2-1b-instruct", "qwen3-0.6b", "gemma-3-1b-it"],
    "--speculative-method": ["draft_model", "eagle", "eagle3", "mtp", "ngram"],
    "--speculative-tokens": ["0", "1", "4", "64"],
    "--engine-version": ["0.33.0", "0.21.0", "0.10.1", "5.23.0", "4.57.0", "99.0", "1"],
    "--block-size": ["1", "16", "32", "256", "100"], "--max-num-batched-tokens": ["1", "8192", "1000000"],
    "--max-num-seqs": ["1", "48", "1024", "100000"], "--max-loras": ["1", "4", "0"],
    "--max-lora-rank": ["8", "16", "512"], "--max-cpu-loras": ["1", "8"],
    "--limit-mm-per-prompt": ["image=0", "image=0,video=0", '{"image": 2}', "audio=1"],
    "--kv-offloading-size": ["64", "0", "1TiB"], "--kv-offloading-backend": ["native", "lmcache"],
    "--cpu-offload-gb": ["1", "10", "1000", "1e6", "0"], "--gdn-prefill-backend": ["flashinfer", "triton"],
    "--mamba-ssm-cache-dtype": ["auto", "float32", "bfloat16"], "--max-mamba-cache-size": ["1", "48", "100000"],
    "--mamba-full-memory-ratio": ["0.9", "1e6", "1e-9", "3"], "--cache-implementation": ["dynamic", "static"],
    "--ubatch-size": ["1", "512", "4096"], "--batch-size": ["1", "2048"],
    "--cache-type-k": ["f16", "q8_0", "q4_0", "bf16"], "--cache-type-v": ["f16", "q8_0", "q4_0"],
    "--flash-attn": ["on", "off", "auto"], "--frontend": ["server", "python"],
    "--isl": ["128", "1k", "4k"], "--osl": ["2", "128", "1k"], "--max-tpot": ["5", "20", "1000"],
    "--max-ttft": ["200", "5000"], "--min-tps": ["10", "100"],
}
EVERY_ENGINE = ["--gpu", "--vram", "--gpus", "--tp", "--pp", "--users", "--batch", "--kv-dtype", "--weights-dtype",
                "--gpu-memory-utilization", "--kv-budget", "--overhead", "--avg-ctx", "--shared-prefix", "--isl",
                "--osl", "--max-tpot", "--max-ttft", "--min-tps"]
ENGINE_FLAGS = {  # (flags with a value, switches) each engine reads besides EVERY_ENGINE's
    "vllm": (["--dp", "--ep", "--draft-model", "--speculative-method", "--speculative-tokens", "--engine-version",
              "--block-size", "--max-num-batched-tokens", "--max-num-seqs", "--max-loras", "--max-lora-rank",
              "--max-cpu-loras", "--limit-mm-per-prompt", "--kv-offloading-size", "--kv-offloading-backend",
              "--cpu-offload-gb", "--gdn-prefill-backend", "--mamba-ssm-cache-dtype"],
             ["--enable-expert-parallel", "--enable-lora", "--language-model-only", "--no-async-scheduling"]),
    "sglang": (["--dp", "--ep", "--draft-model", "--speculative-method", "--speculative-tokens", "--max-num-seqs",
                "--mamba-ssm-cache-dtype", "--max-mamba-cache-size", "--mamba-full-memory-ratio"],
               ["--enable-expert-parallel", "--disable-radix-cache"]),
    "llama.cpp": (["--draft-model", "--speculative-tokens", "--ubatch-size", "--batch-size", "--cache-type-k",
                   "--cache-type-v", "--flash-attn", "--frontend"], ["--kv-unified", "--no-kv-unified", "--swa-full"]),
    "transformers": (["--engine-version", "--cache-implementation"], []),
    "tensorrt-llm": (["--block-size"], []),
    "ideal": ([], []),
}
DEPLOYED_MODELS = ["llama-3-8b", "llama-3.1-70b", "deepseek-v2-lite", "deepseek-v3", "mixtral-8x7b", "qwen3-30b-a3b",
                   "gpt-oss-20b", "gemma-3-27b-it", "gemma-4-e2b-it", "gemma-3n-e2b", "nemotron-super-49b",
                   "qwen3-next-80b-a3b-thinking", "qwen3.5-27b", "nemotron-3-nano-30b-a3b", "jamba-v0.1",
                   "falcon-h1-0.5b", "llama-4-scout", "t5-base", "mamba2-2.7b", "deepseek-v4-flash", "glm-5"]


@FUZZ
@given(st.sampled_from(DEPLOYED_MODELS), st.sampled_from(sorted(ENGINE_FLAGS)),
       st.sampled_from(["8k", "128k", "1M", "300"]), st.sampled_from([["--json"], []]), st.data())
def test_deployment_flags(monkeypatch, capsys, model, engine, ctx, output, data):
    """Layouts (--gpus, --tp, --pp, --dp, --ep), engines and their flags, dtypes, drafts, LoRA and offloading, in
    any combination: a flag's value mostly one some model and engine take, now and then a hostile one; now and
    then a flag or a switch of another engine."""
    own, switches = ENGINE_FLAGS[engine]
    every_flag, every_switch = sorted(VALUES), sorted({s for _, engine_switches in ENGINE_FLAGS.values()
                                                       for s in engine_switches})
    names = data.draw(st.lists(st.sampled_from(EVERY_ENGINE + own), max_size=4, unique=True))
    if not {"--gpu", "--vram", "--kv-budget"} & set(names) and data.draw(st.integers(0, 9)):
        names.append("--gpu")  # capacity needs a GPU
    if data.draw(st.integers(0, 9)) == 0:
        names.append(data.draw(st.sampled_from(every_flag)))
    args = ["estimate", "--model", model, "--ctx", ctx, "--engine", engine, *output]
    args += data.draw(st.lists(st.sampled_from(switches if switches and data.draw(st.integers(0, 9)) else
                                               every_switch), max_size=2, unique=True))
    for flag in dict.fromkeys(names):
        value = data.draw(st.sampled_from(VALUES[flag]) if data.draw(st.integers(0, 9)) else hostile)
        args += [flag, value]
    run(monkeypatch, capsys, *args)


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


# ------------------------------------------------------------------------------------------------- GGUF files

U32, I32, F32, BOOL, STR, ARR = 4, 5, 6, 7, 8, 9
# A small model of each llama.cpp architecture family kvplan maps, as its converter types the keys.
GGUF_BASE = {".block_count": (U32, 4), ".context_length": (U32, 4096), ".embedding_length": (U32, 256),
             ".feed_forward_length": (U32, 512), ".attention.head_count": (U32, 4),
             ".attention.head_count_kv": (U32, 2)}
GGUF_MODELS = {
    "llama": {},
    "gemma3": {".attention.sliding_window": (U32, 512)},
    "gemma3n": {".attention.sliding_window": (U32, 512), ".attention.shared_kv_layers": (U32, 2)},
    "gemma4": {".attention.sliding_window": (U32, 512), ".attention.sliding_window_pattern": (ARR, [1, 1, 0, 1], BOOL),
               ".attention.key_length_swa": (U32, 64), ".attention.value_length_swa": (U32, 64),
               ".attention.shared_kv_layers": (U32, 1)},
    "mamba2": {".attention.head_count": (U32, 0), ".ssm.conv_kernel": (U32, 4), ".ssm.inner_size": (U32, 512),
               ".ssm.state_size": (U32, 16), ".ssm.time_step_rank": (U32, 8), ".ssm.group_count": (U32, 1)},
    "jamba": {".attention.head_count_kv": (ARR, [0, 2, 0, 0], I32), ".ssm.conv_kernel": (U32, 4),
              ".ssm.inner_size": (U32, 512), ".ssm.state_size": (U32, 16), ".ssm.time_step_rank": (U32, 16)},
    "lfm2": {".attention.head_count_kv": (ARR, [0, 2, 0, 2], I32), ".shortconv.l_cache": (U32, 3)},
    "qwen35": {".ssm.conv_kernel": (U32, 4), ".ssm.inner_size": (U32, 256), ".ssm.state_size": (U32, 64),
               ".ssm.time_step_rank": (U32, 4), ".ssm.group_count": (U32, 2), ".full_attention_interval": (U32, 4)},
    "kimi-linear": {".attention.head_count_kv": (ARR, [0, 0, 0, 1], I32), ".attention.kv_lora_rank": (U32, 64),
                    ".attention.key_length": (U32, 96), ".attention.key_length_mla": (U32, 96),
                    ".attention.value_length_mla": (U32, 64), ".ssm.conv_kernel": (U32, 4),
                    ".kda.head_dim": (U32, 64)},
    "minimax-01": {".attention.key_length": (U32, 64)},
    "deepseek2": {".attention.head_count_kv": (U32, 1), ".attention.kv_lora_rank": (U32, 64),
                  ".attention.key_length": (U32, 96), ".attention.value_length": (U32, 64),
                  ".attention.key_length_mla": (U32, 96), ".attention.value_length_mla": (U32, 64),
                  ".nextn_predict_layers": (U32, 1)},
}
GGUF_KEYS = sorted({key for keys in GGUF_MODELS.values() for key in keys} | set(GGUF_BASE) | {
    ".expert_count", ".expert_used_count", ".attention.key_length", ".attention.value_length",
    ".attention.sliding_window_pattern", ".attention.recurrent_layers", "general.architecture", "general.alignment",
    "general.file_type", "split.count", "split.no", "split.tensors.count"})
BOUNDS = [0, 1, 2, 3, 4, 31, 32, 64, 255, 2**15, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**53 + 1, 2**63 - 1, 2**64 - 1,
          -1, -(2**31)]
GGUF_VALUES = st.one_of(
    st.tuples(st.sampled_from([0, 1, 2, 3, 4, 5, 7, 10, 11]), st.sampled_from(BOUNDS)),
    st.tuples(st.sampled_from([6, 12]), st.sampled_from([0.0, -1.5, 1e39, float("nan"), float("inf")])),
    st.tuples(st.just(STR), st.sampled_from(TEXT)),
    st.tuples(st.just(ARR), st.lists(st.sampled_from(BOUNDS[:12]), max_size=9), st.sampled_from([0, 4, 5, 7, 10])),
    st.tuples(st.just(ARR), st.lists(st.sampled_from(TEXT[:6]), max_size=5), st.just(STR)),
    st.none())  # the key dropped
DIMS = st.sampled_from([0, 1, 32, 64, 256, 512, 4096, 2**20, 2**32 - 1])
GGUF_TENSOR = st.tuples(st.sampled_from(["token_embd.weight", "output.weight", "blk.0.ffn_down.weight",
                                         "blk.1.ffn_down_exps.weight", "blk.0.ffn_gate.weight",
                                         "blk.0.ffn_down_shexp.weight", "blk.0.attn_q.weight"]),
                        st.lists(DIMS, min_size=0, max_size=4), st.sampled_from([0, 1, 8, 12, 30]))


def write_parts(directory, metadata: dict, tensors: list, parts: int, damage: int) -> list:
    """The model as `parts` files named as llama.cpp splits them (<name>-0000i-of-0000N.gguf), each with its
    split.no and split.count; `damage` names one thing to break: 1 a part's split.no, 2 a missing part, 3 the
    tensor count the first part gives. Tensor data up to 1 GiB a file is a hole; past that the file is short."""
    paths = []
    for no in range(parts):
        meta = dict(metadata) if no == 0 else {"general.architecture": metadata.get("general.architecture",
                                                                                     (STR, "llama"))}
        if parts > 1:
            meta |= {"split.no": (2, no + (damage == 1 and no == 1)), "split.count": (2, parts),
                     "split.tensors.count": (I32, len(tensors) + (damage == 3))}
        head, data = ggufkit.raw_gguf(meta, tensors[no::parts])
        name = f"model-{no + 1:05d}-of-{parts:05d}.gguf" if parts > 1 else "model.gguf"
        if damage == 2 and no == parts - 1 and parts > 1:
            break
        path = directory / name
        path.write_bytes(head)
        if data <= 2**30:
            os.truncate(path, len(head) + data)
        paths.append(path)
    return paths


@FUZZ
@given(st.sampled_from(sorted(GGUF_MODELS)), st.dictionaries(st.sampled_from(GGUF_KEYS), GGUF_VALUES, max_size=4),
       st.lists(GGUF_TENSOR, max_size=4), st.sampled_from([1, 1, 2, 3]), st.sampled_from([0, 0, 1, 2, 3]),
       st.sampled_from([["--engine", "llama.cpp", "--kv-budget", "64GiB"], ["--gpu", "rtx-4090"],
                        ["--engine", "llama.cpp", "--gpu", "h100", "--flash-attn", "off", "--cache-type-k", "q8_0"],
                        ["--engine", "vllm", "--gpu", "h100"]]))
def test_gguf_mutations(monkeypatch, capsys, tmp_path_factory, arch, edits, extra, parts, damage, flags):
    """A GGUF of each mapped architecture with its keys set to other values and types (integers at every width's
    limits, floats, strings, arrays of each element type, keys dropped), its tensors given other shapes and
    types, and split in parts, some damaged: each run plans or ends in one line."""
    metadata = {"general.architecture": (STR, arch)}
    metadata |= {arch + key: value for key, value in {**GGUF_BASE, **GGUF_MODELS[arch]}.items()}
    for key, value in edits.items():
        full = key if key.startswith(("general.", "split.")) else arch + key
        if value is None:
            metadata.pop(full, None)
        else:
            metadata[full] = value
    tensors = [("token_embd.weight", [256, 1024], 8), ("blk.0.ffn_down.weight", [512, 256], 8)]
    for name, dims, ggml_type in extra:
        tensors = [t for t in tensors if t[0] != name] + [(name, dims, ggml_type)]
    paths = write_parts(tmp_path_factory.mktemp("gguf"), metadata, tensors, parts, damage)
    run(monkeypatch, capsys, "estimate", "--model", str(paths[0]), "--ctx", "8k", *flags, "--json")
