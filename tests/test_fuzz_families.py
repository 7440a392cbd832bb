"""Fuzzing the config readers of the families kvplan reads by rules of their own (Gemma 3n and 4, Qwen3.5 and
Qwen3-Next, DeepSeek V3.2 and V4, Kimi Linear, MiniMax, GLM-5, Nemotron-H, LFM2, Falcon-H1, Llama 4 and its vision
tower, Mamba, Granite 4.0-H): any field of a genuine config, nested objects and list entries too, set to a value
near its own (zero, negated, scaled, repeated, emptied) or far from it, run as tests/test_fuzz_cli.py runs the
command line (exit 0 or 1 with sane numbers, or exit 2 with one line; never a bug or a hang).

CI runs a few dozen examples; the full run (docs/cli.md) sets KVPLAN_FUZZ_EXAMPLES:

    KVPLAN_FUZZ_EXAMPLES=10000 python -m pytest tests/test_fuzz_families.py -p no:randomly
"""

import json

from conftest import SPECS
from hypothesis import given
from hypothesis import strategies as st
from test_fuzz_cli import FIELD_VALUES, FUZZ, run

# A genuine config of each family (model_specs/), and layer-type names the families use, for string fields
FAMILY_CONFIGS = ["google__gemma-3n-E2B.json", "google__gemma-4-E2B-it.json", "google__gemma-4-31B-it.json",
                  "Qwen__Qwen3.5-35B-A3B.json", "Qwen__Qwen3-Next-80B-A3B-Thinking.json",
                  "deepseek-ai__DeepSeek-V3.2.json", "deepseek-ai__DeepSeek-V4-Flash.json",
                  "moonshotai__Kimi-Linear-48B-A3B-Instruct.json", "MiniMaxAI__MiniMax-M2.7.json",
                  "MiniMaxAI__MiniMax-M1-80k.json", "zai-org__GLM-5.json",
                  "nvidia__NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.json",
                  "LiquidAI__LFM2-1.2B.json", "tiiuae__Falcon-H1-0.5B-Instruct.json",
                  "meta-llama__Llama-4-Scout-17B-16E-Instruct.json", "state-spaces__mamba2-2.7b.json",
                  "ibm-granite__granite-4.0-h-small.json"]
LAYER_KINDS = ["full_attention", "sliding_attention", "linear_attention", "chunked_attention", "attention", "mamba",
               "mamba2", "conv", "hybrid", "dense", "sparse", "moe", "Mamba1", "Mamba2", "M", "*", "-", ""]


def fields(value, prefix: tuple = ()):
    """The key path of every field of a config: nested objects' fields and list entries too."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        yield (*prefix, key)
        yield from fields(item, (*prefix, key))


def variants(value) -> st.SearchStrategy:
    """Values near `value` (its type, at and past its limits: zero, negated, scaled, repeated, emptied) and far
    from it (FIELD_VALUES). Counts are scaled up to 64 times: a layer count 1,024 times a model's, near the reader's
    100,000-layer limit, is read in seconds, but the capacity search then plans each of a few hundred layouts layer
    by layer (tens of seconds of CPU at 100,000 layers), past the runner's alarm on a busy machine."""
    if isinstance(value, bool):
        near = [not value, 0, 1]
    elif isinstance(value, int):
        near = [0, 1, -value, value - 1, value + 1, 2 * value, 64 * value, 10**7, 2**53, 2**53 + 1, 2**64]
    elif isinstance(value, float):
        near = [0.0, -value, 2 * value, value / 1024, 1.5, 1e308, 5e-324, float("nan"), float("inf")]
    elif isinstance(value, str):
        near = [*LAYER_KINDS, value.upper(), value * 2]
    elif isinstance(value, list):
        near = [[], value[:1], value * 2, value * 1000, value[::-1], [None] * len(value), [value],
                [str(v) for v in value]]
    elif isinstance(value, dict):
        near = [{}, {key: None for key in value}, [value]]
    else:  # null
        near = [0, "", [], {}]
    return st.one_of(st.sampled_from(near), FIELD_VALUES)


@FUZZ
@given(st.sampled_from(FAMILY_CONFIGS), st.data(),
       st.sampled_from([["--ctx", "8k"], ["--ctx", "32k", "--gpu", "h100"], ["--ctx", "4k", "--engine", "llama.cpp",
                                                                            "--vram", "24GiB"]]),
       st.sampled_from([["--json"], []]))
def test_family_config_mutations(monkeypatch, capsys, tmp_path_factory, name, data, flags, output):
    config = json.loads((SPECS / name).read_text(encoding="utf-8"))
    for _ in range(data.draw(st.integers(1, 4), label="edits")):
        path = data.draw(st.sampled_from(list(fields(config))), label="field")
        parent = config
        for key in path[:-1]:
            parent = parent[key]
        if data.draw(st.booleans(), label="drop"):
            parent.pop(path[-1])
        else:
            parent[path[-1]] = data.draw(variants(parent[path[-1]]), label="value")
    path = tmp_path_factory.mktemp("fuzz") / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    run(monkeypatch, capsys, "estimate", "--model", str(path), *flags, *output)
