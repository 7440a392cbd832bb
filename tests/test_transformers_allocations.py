"""The allocations kvplan generates for a transformers run, from the ModelSpec alone
(kvplan/engines/transformers_allocations.py), against those of the real model: each family's published config
built with transformers' own classes on the meta device, its build, prefill and cached decode recorded storage by
storage, with SDPA as torch runs it on CUDA (tests/allockit.py). The two sequences must be equal, event for event,
and so must every figure of the allocator replaying them."""

import json

import pytest
from conftest import SPECS

pytest.importorskip("torch")
pytest.importorskip("transformers")

from allockit import record_run  # noqa: E402

from kvplan.engines import cuda_allocator as ca  # noqa: E402
from kvplan.engines import transformers_allocations as ta  # noqa: E402
from kvplan.memory import weights_bytes  # noqa: E402
from kvplan.profiler import config as profile_config  # noqa: E402


def generated(model: str, batch: int, prompt: int, steps: int, layers: int | None) -> ta.Run:
    _, spec = profile_config.first_layers(profile_config.resolve(model), layers)
    shape = ta.shape_of(spec, 2, weights_bytes(spec, "bf16")[0])
    assert shape is not None, spec.architecture
    return ta.run(shape, batch, prompt, steps, 0)  # the recording has no cuBLAS workspace: it is not a tensor


def windowed(tmp_path, window: int) -> str:
    """Mistral-7B-v0.1's config with a short sliding window, so that a short prompt reaches it."""
    data = json.loads((SPECS / "mistralai__Mistral-7B-v0.1.json").read_text(encoding="utf-8"))
    data["sliding_window"] = window
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return str(path)


# (model, batch, prompt, decode steps, layers kept)
CASES = {
    "llama-3 (GQA), all 32 layers": ("meta-llama/Llama-3-8B", 2, 64, 2, None),
    "qwen3 (q and k normed per head)": ("Qwen/Qwen3-8B", 2, 64, 2, 2),
    "qwen2.5 (q, k and v biases)": ("Qwen/Qwen2.5-7B", 3, 40, 2, 2),
    "qwen3-moe (grouped_mm experts)": ("Qwen/Qwen3-30B-A3B", 2, 64, 2, 2),
    "mixtral (fp32 router)": ("mistralai/Mixtral-8x7B-v0.1", 2, 64, 2, 2),
    "qwen3-0.6b (tied embeddings)": ("Qwen/Qwen3-0.6B", 1, 48, 2, 2),
    "gpt-oss (eager attention with sinks, biased experts, yarn)": ("openai/gpt-oss-20b", 2, 64, 2, 2),
    "gpt-oss, prompt past its 128-token window": ("openai/gpt-oss-20b", 1, 150, 2, 2),
    "gpt-oss, decode reaching its window": ("openai/gpt-oss-20b", 2, 120, 10, 2),
    "gemma-3 (scaled embeddings, four norms, q and k normed)": ("google/gemma-3-12b-it", 2, 64, 2, 2),
    "gemma-3, prompt past its 1,024-token window": ("google/gemma-3-12b-it", 1, 1030, 2, 2),
    "gemma-3-1b (sliding and full layers, one KV head), prompt past its window": ("google/gemma-3-1b-it", 1, 520, 2, 6),
    "gemma-3-1b, decode reaching its window": ("google/gemma-3-1b-it", 2, 500, 20, 6),
    "deepseek-v2-lite (MLA, a dense first layer, shared experts)": ("deepseek-ai/DeepSeek-V2-Lite", 2, 40, 3, 3),
}


@pytest.mark.parametrize("name", list(CASES))
def test_the_generated_run_is_the_recorded_one(name):
    model, batch, prompt, steps, layers = CASES[name]
    events, ends = record_run(model, batch, prompt, steps, layers=layers)
    run = generated(model, batch, prompt, steps, layers)
    assert run.ends == ends
    assert run.events == events


@pytest.mark.parametrize("model, layers", [("meta-llama/Llama-3.2-1B-Instruct", 2), ("meta-llama/Llama-3.1-8B", 2),
                                           ("google/gemma-3-12b-it", 6)])
def test_rope_scaling_changes_only_small_temporaries(model, layers):
    """Llama 3.1's rope scaling (`_compute_llama3_parameters`) makes inv_freq through some forty tensors of a few
    hundred bytes, Gemma 3's linear scaling of its full layers' (`_compute_linear_scaling_rope_parameters`) through an
    int64 arange and its cast; kvplan does not generate them: they come and go in the small pool's first segment, so
    every figure of the allocator is the same."""
    events, ends = record_run(model, 2, 1024, 2, layers=layers)
    run = generated(model, 2, 1024, 2, layers)
    assert run.events != events
    assert ca.replay(run.events, run.ends) == ca.replay(events, ends)


@pytest.mark.parametrize("window, prompt, steps", [
    (16, 64, 20),  # prefill past the window (a mask, the memory-efficient kernel, k and v repeated), decode past it
    (20, 30, 4),   # a mask 30 and then 20 keys wide: padded to a multiple of 8 columns
    (20, 12, 12),  # prefill within the window (flash), decode reaching it
])
def test_sliding_windows_take_the_masked_path_as_recorded(tmp_path, window, prompt, steps):
    config = windowed(tmp_path, window)
    events, ends = record_run(config, 2, prompt, steps, layers=2)
    run = generated(config, 2, prompt, steps, 2)
    assert (run.events, run.ends) == (events, ends)
    # and so the allocator's figures after each phase, for the default allocator and with expandable segments
    for expandable in (False, True):
        assert ca.replay(run.events, run.ends, expandable=expandable) == ca.replay(events, ends,
                                                                                   expandable=expandable)


def test_deepseek_v2s_low_rank_query_as_recorded(tmp_path):
    """DeepSeek-V2's q through q_lora_rank and its norm (`DeepseekV2Attention`), with the greedy router kvplan
    generates (the published config's group-limited one it does not: it falls back)."""
    data = json.loads((SPECS / "deepseek-ai__DeepSeek-V2.json").read_text(encoding="utf-8"))
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**data, "topk_method": "greedy", "n_group": 1, "topk_group": 1}), encoding="utf-8")
    events, ends = record_run(str(path), 2, 24, 2, layers=2)
    assert (generated(str(path), 2, 24, 2, 2).events, ends) == (events, ends)


def test_the_recorded_and_generated_runs_reserve_alike_at_full_size():
    """Llama-3-8B's first 4 layers at a batch of 8 prompts of 4,096 tokens, recorded on the meta device (no memory,
    no arithmetic): the same events, so the same reserve, as large tensors put the allocator's large pool to work."""
    events, ends = record_run("meta-llama/Llama-3-8B", 8, 4096, 1, layers=4)
    run = generated("meta-llama/Llama-3-8B", 8, 4096, 1, 4)
    assert run.events == events
    figures = ca.replay(events, ends)
    assert figures[1].reserved > figures[1].peak_allocated + 2**30  # a GiB of cached splits beyond the peak
