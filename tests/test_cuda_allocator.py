"""torch's CUDA caching allocator as kvplan simulates it (kvplan/engines/cuda_allocator.py), rule by rule on hand-made
sequences, then with the allocations kvplan generates for a transformers run (transformers_allocations.py) against
every figure of the H100 record (tests/gpu_record: allocated, max allocated and reserved after each phase, NVML's
process memory, the largest batch that ran)."""

import json
import re

import pytest
from conftest import ROOT, MiB, run_main

from kvplan.engines import cuda_allocator as ca
from kvplan.engines import transformers_allocations as ta
from kvplan.memory import weights_bytes
from kvplan.sources import load_model

RECORD = ROOT / "tests" / "gpu_record"
H100 = 85_520_809_984  # NVML's total
NON_TORCH = 721_420_288  # the record: NVML process memory less torch's reserved, after decode
DRIVER = 1_055_719_424 - 543_162_368  # the record, at start: device used less this process's
HOPPER_WORKSPACE = 32 * MiB  # torch's parseChosenWorkspaceSize on compute capability 9.0


def record(name: str) -> dict:
    return json.loads((RECORD / name).read_text(encoding="utf-8"))


def phases(data: dict) -> list[tuple[int, int, int]]:
    """(allocated, max allocated, reserved) after build, after prefill, after decode."""
    return [(m["allocated"], m["max_allocated"], m["reserved"]) for m in data["memory"][1:]]


def replay(events: list[int], **kw) -> ca.CachingAllocator:
    allocator = ca.CachingAllocator(**kw)
    blocks = []
    for event in events:
        if event >= 0:
            blocks.append(allocator.malloc(event))
        else:
            allocator.free(blocks[~event])
    return allocator


# ---------------------------------------------------------------------------------------------- the rules


def test_small_requests_round_to_512_bytes_in_2_mib_segments():
    allocator = replay([1, 1000, 600_000])
    assert allocator.allocated == 512 + 1024 + 600_064  # each rounded up to a multiple of 512 B
    assert allocator.reserved == 2 * MiB  # one small segment holds them all
    allocator = replay([MiB, MiB])  # 1 MiB is still small: two fill a 2 MiB segment
    assert allocator.reserved == 2 * MiB


def test_requests_under_10_mib_share_20_mib_segments():
    # 8 MiB: a 20 MiB segment, split; a second 8 MiB takes the 12 MiB left, split again; 4 MiB is left, too
    # little for a third, which opens a new segment
    allocator = replay([8 * MiB, 8 * MiB, 8 * MiB])
    assert allocator.reserved == 40 * MiB
    assert allocator.allocated == 24 * MiB


def test_large_requests_get_their_own_segment_rounded_to_2_mib():
    allocator = replay([33_000_000, 10 * MiB])
    assert allocator.reserved == 32 * MiB + 10 * MiB  # 33,000,000 B -> 31.47 MiB -> 32 MiB; 10 MiB exactly
    # the 553,984 B left of the 32 MiB segment is not more than 1 MiB: the request holds the whole block
    assert allocator.allocated == 32 * MiB + 10 * MiB


def test_a_large_block_splits_only_when_more_than_1_mib_is_left():
    # free a 32 MiB block, ask for 31 MiB: 1 MiB left is not more than 1 MiB, so the whole block is taken
    allocator = replay([32 * MiB, ~0, 31 * MiB])
    assert (allocator.reserved, allocator.allocated) == (32 * MiB, 32 * MiB)
    # ask for 30 MiB instead: 2 MiB is left, split off and cached
    allocator = replay([32 * MiB, ~0, 30 * MiB])
    assert (allocator.reserved, allocator.allocated) == (32 * MiB, 30 * MiB)


def test_best_fit_and_merging_with_free_neighbours():
    # two segments, 40 and 30 MiB, freed; a 25 MiB request takes the smaller one (best fit), not a new segment
    allocator = replay([40 * MiB, 30 * MiB, ~0, ~1, 25 * MiB])
    assert allocator.reserved == 70 * MiB
    assert sorted(size for size, _ in (divmod(key, ca.KEY) for key in allocator.pools[False].keys)) == \
        [5 * MiB, 40 * MiB]
    # a 20 MiB segment split in 4 + 4 + 12: freeing the two 4 MiB blocks merges them back with the 12 MiB rest
    allocator = replay([4 * MiB, 4 * MiB, ~0, ~1])
    assert [divmod(key, ca.KEY)[0] for key in allocator.pools[False].keys] == [20 * MiB]


def test_out_of_memory_releases_cached_segments_first():
    # a cached 40 MiB segment is released (release_cached_blocks) to make room for a 50 MiB one
    allocator = replay([40 * MiB, ~0, 50 * MiB], limit=60 * MiB)
    assert allocator.reserved == 50 * MiB
    # a segment still split by an allocated block is not released
    with pytest.raises(ca.OutOfMemory):
        replay([40 * MiB, ~0, 4 * MiB, 50 * MiB], limit=60 * MiB)


def test_expandable_segments_map_20_mib_pages():
    # one segment per pool grows by pages: 3 x 8 MiB take 24 MiB, mapped as two 20 MiB pages, not three segments
    allocator = replay([8 * MiB, 8 * MiB, 8 * MiB], expandable=True)
    assert (allocator.reserved, allocator.allocated) == (40 * MiB, 24 * MiB)
    # out of memory, the free pages are unmapped and the request placed again
    allocator = replay([30 * MiB, 30 * MiB, ~0, 50 * MiB], expandable=True, limit=100 * MiB)
    assert allocator.reserved == 100 * MiB and allocator.allocated == 80 * MiB


# ---------------------------------------------------------------------------------------------- the H100 record


def llama(batch: int, prompt: int = 8160, steps: int = 32) -> ta.Run:
    spec = load_model("meta-llama/Llama-3-8B")
    shape = ta.shape_of(spec, 2, weights_bytes(spec, "bf16")[0])
    return ta.run(shape, batch, prompt, steps, HOPPER_WORKSPACE)


@pytest.mark.parametrize("name, batch, expandable", [
    ("llama3-8b-b16-h100.json", 16, False),
    ("llama3-8b-b16-h100-expandable-segments.json", 16, True),
    ("llama3-8b-max-batch-h100.json", 1, False),
    ("llama3-8b-recompute-h100.json", 1, False),
])
def test_every_allocator_figure_of_the_record(name, batch, expandable):
    """torch's allocated, peak allocated and reserved after the build, the prefill and the decode, to the byte, and
    NVML's process memory as the reserve and the measured memory outside torch's allocator."""
    data = record(name)
    run = llama(batch)
    predicted = ca.replay(run.events, run.ends, expandable=expandable)
    assert [(p.allocated, p.peak_allocated, p.reserved) for p in predicted] == phases(data)
    assert predicted[-1].reserved + NON_TORCH == data["memory"][-1]["process_used"] == data["measured_total_bytes"]


@pytest.mark.parametrize("name, expandable", [
    ("llama3-8b-b16-h100.json", False),
    ("llama3-8b-b16-h100-expandable-segments.json", True),
    ("llama3-8b-max-batch-h100.json", False),
])
def test_profile_predicts_the_total_nvml_counted(name, expandable):
    """`kvplan profile`'s predicted total for the record's runs: what it predicts the allocator reserves and the
    CUDA context, NVML's process memory to the byte (the profile's own prediction, torch not needed)."""
    from kvplan.profiler import prediction

    data = record(name)
    engine = prediction.transformers_engine(data["transformers_version"], "dynamic", data["device_name"], expandable)
    predicted = prediction.predict(load_model("meta-llama/Llama-3-8B"), data["ctx"], data["batch"],
                                   data["prompt_tokens"], "bf16", engine, "cuda", data["cuda_version"])
    assert predicted.total == data["measured_total_bytes"]
    assert predicted.cuda_context == data["measured_non_torch_bytes"]


def test_qwen3_8b_record():
    """Qwen3-8B, batch 1, 4,064 + 32 tokens (the table output of its record): reserved after the build and the
    prefill as the table rounds them, and NVML's process memory to the byte."""
    text = (RECORD / "qwen3-8b-recompute-h100.txt").read_text(encoding="utf-8")
    total = int(re.search(r"│ total\s+│\s+[\d,]+ │\s+([\d,]+) │", text).group(1).replace(",", ""))
    spec = load_model("Qwen/Qwen3-8B")
    shape = ta.shape_of(spec, 2, weights_bytes(spec, "bf16")[0])
    run = ta.run(shape, 1, 4064, 32, HOPPER_WORKSPACE)
    build, prefill, decode = ca.replay(run.events, run.ends)
    assert f"{build.reserved / 2**30:.2f} GiB" == "15.40 GiB"
    assert f"{prefill.reserved / 2**30:.2f} GiB" == "16.62 GiB"
    assert f"{prefill.peak_allocated / 2**30:.2f} GiB" == "16.26 GiB"
    assert decode.reserved + NON_TORCH == total == 18_570_280_960


def test_the_largest_batch_of_the_record():
    """--find-max-batch: batches 1 to 27 ran at 8,192 tokens, 28 and 32 ran out of memory, each on the H100 with the
    driver's and the process's own memory beside torch's; the peak each trial allocated."""
    trials = record("llama3-8b-max-batch-h100.json")["max_batch"]["trials"]
    limit = H100 - DRIVER - NON_TORCH
    for trial in trials:
        run = llama(trial["batch"], steps=1)
        if not trial["fits"]:
            with pytest.raises(ca.OutOfMemory):
                ca.replay(run.events, run.ends, limit)
            continue
        prefill = ca.replay(run.events, run.ends, limit)[1]
        # each trial ran after the one before had left the allocator its token ids: within 0.01%
        assert prefill.peak_allocated == pytest.approx(trial["peak_allocated"], rel=1e-4)


# ---------------------------------------------------------------------------------------------- capacity


def estimate(monkeypatch, capsys, *args: str) -> dict:
    code, out, err = run_main(monkeypatch, capsys, "estimate", "--model", "meta-llama/Llama-3-8B", "--ctx", "8192",
                              "--engine", "transformers", "--gpu", "h100", "--json", *args)
    assert code == 0, err
    return json.loads(out)


def test_estimate_users_are_the_largest_batch_that_ran(monkeypatch, capsys):
    assert estimate(monkeypatch, capsys)["max_concurrent_users"] == 27  # the record's --find-max-batch


@pytest.mark.parametrize("args, name", [
    (("--users", "16"), "llama3-8b-b16-h100.json"),
    (("--users", "1"), "llama3-8b-max-batch-h100.json"),
    (("--users", "16", "--expandable-segments"), "llama3-8b-b16-h100-expandable-segments.json"),
])
def test_estimate_gpu_bytes_are_what_nvml_counted(monkeypatch, capsys, args, name):
    """engine_gpu_bytes_for_users, for a prompt of 8,191 tokens and a step, within 3% of NVML's process memory for
    the record's 8,160 + 32."""
    measured = record(name)["measured_total_bytes"]
    assert estimate(monkeypatch, capsys, *args)["engine_gpu_bytes_for_users"] == pytest.approx(measured, rel=0.03)


def test_estimate_suggests_expandable_segments_where_they_add_users(monkeypatch, capsys):
    data = estimate(monkeypatch, capsys)
    assert any("expandable_segments:True" in note and "not 27" in note for note in data["notes"]), data["notes"]
    data = estimate(monkeypatch, capsys, "--expandable-segments")
    assert data["max_concurrent_users"] > 27
    assert not any("--expandable-segments plans" in note for note in data["notes"])


@pytest.mark.parametrize("model, why", [("deepseek-ai/DeepSeek-V3", "deepseek_v3 models"),
                                        ("deepseek-ai/DeepSeek-V2", "deepseek_v2 models with a group-limited router")])
def test_families_whose_run_is_not_generated_count_live_tensors(model, why):
    """DeepSeek-V3, and DeepSeek-V2's router that picks experts from groups (`group_limited_greedy`): kvplan does
    not generate their runs, so capacity counts the cache and the prefill activations alone, and says why."""
    from kvplan.capacity import Hardware, Workload, capacity

    cap = capacity(load_model(model), Workload(ctx=8192), engine_name="transformers",
                   hardware=Hardware(name="H100", memory_bytes=H100))
    assert cap.engine_gpu_bytes_for_users is None
    assert any(f"caching allocator is not modelled for {why}" in note for note in cap.notes), cap.notes


def test_models_deeper_than_any_published_count_live_tensors(tmp_path):
    """A config of more layers than MAX_LAYERS: the run's events grow with them (a 100,000-layer Gemma 3 took minutes
    to replay), so capacity counts the live tensors, and says why."""
    from kvplan.capacity import Hardware, Workload, capacity

    data = json.loads((ROOT / "model_specs" / "meta-llama__Meta-Llama-3-8B.json").read_text(encoding="utf-8"))
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**data, "num_hidden_layers": ta.MAX_LAYERS + 1}), encoding="utf-8")
    cap = capacity(load_model(str(path)), Workload(ctx=8192), engine_name="transformers",
                   hardware=Hardware(name="H100", memory_bytes=H100))
    assert cap.engine_gpu_bytes_for_users is None
    assert any("not modelled for models of over 1,024 layers" in note for note in cap.notes), cap.notes
