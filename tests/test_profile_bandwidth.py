"""`kvplan profile` on a GPU: the bandwidth its decode steps reached, beside the speed model's bound. Computed here on
the CPU from recorded GPU profiles, against hand arithmetic: tests/gpu_record/, unchanged copies of `python -m kvplan
profile --device cuda --json` runs of Meta-Llama-3-8B (random bf16 weights, DynamicCache, SDPA) at 8,192 tokens, 8,160
prefilled and 32 decoded, batch 16 and batch 1 (with --find-max-batch), made at kvplan commit 6019e62 on one NVIDIA
H100 80GB HBM3, driver 580.159.04, CUDA 13.0, torch 2.11.0+cu130, transformers 5.23.0, 2026-11-27."""

import io
import json

import pytest
from conftest import ROOT
from rich.console import Console

from kvplan.profiler.bandwidth import decode_bandwidth
from kvplan.profiler.results import Profile
from kvplan.report import print_profile
from kvplan.sources import load_model

RECORDS = ROOT / "tests" / "gpu_record"
# Llama-3-8B (config.json): 8,030,261,248 params, 525,336,576 of them the token embedding (128,256 x 4,096), which a
# decode step looks up rather than reads whole; 32 layers x 8 KV heads x 128 x (K, V) x 2 B = 131,072 B a token.
WEIGHTS_READ = (8_030_261_248 - 128_256 * 4_096) * 2
KV_PER_TOKEN = 32 * 8 * 128 * 2 * 2
H100_GBS = 3_350  # NVIDIA's H100 SXM datasheet


def recorded(name: str) -> dict:
    return json.loads((RECORDS / name).read_text(encoding="utf-8"))


@pytest.mark.parametrize("name, batch", [("llama3-8b-b16-h100.json", 16), ("llama3-8b-max-batch-h100.json", 1)])
def test_bandwidth_of_recorded_decode_steps(name, batch):
    """32 steps after an 8,160-token prompt attend 8,161 to 8,192 tokens, 8,176 at their middle; a step of the batch
    takes batch / (decode tokens/s) seconds."""
    run = recorded(name)
    assert (run["batch"], run["prompt_tokens"], run["decode_steps"], run["dtype"]) == (batch, 8160, 32, "bf16")
    found = decode_bandwidth(load_model("meta-llama/Llama-3-8B"), run["device_name"], run["dtype"], run["batch"],
                             run["prompt_tokens"], run["decode_steps"], run["decode_tokens_per_s"])
    read = WEIGHTS_READ + batch * KV_PER_TOKEN * 8_176
    step_s = batch / run["decode_tokens_per_s"]
    assert found.gpu == "NVIDIA H100 SXM" and found.bytes_per_step == read
    assert found.step_ms == pytest.approx(step_s * 1000)
    assert found.bandwidth_gbs == pytest.approx(read / step_s / 1e9)
    assert found.utilisation == pytest.approx(read / step_s / 1e9 / H100_GBS)
    assert found.step_ms_bound == pytest.approx(read / (H100_GBS * 1e9) * 1000) and found.bound_by == "memory bandwidth"
    assert found.utilisation < 0.12  # batch 16: 362 GB/s, 10.8%; batch 1: 181 GB/s, 5.4%: eager decode, far from vLLM


def test_no_bandwidth_for_a_device_the_catalogue_lacks():
    model = load_model("meta-llama/Llama-3-8B")
    assert decode_bandwidth(model, "AMD EPYC 7B13", "bf16", 1, 8160, 32, 11.3) is None
    assert decode_bandwidth(model, "NVIDIA H100 80GB HBM3", "bf16", 1, 8160, 32, 11.3) is not None


def test_the_profile_prints_the_bandwidth_beside_the_bound():
    run = recorded("llama3-8b-b16-h100.json")
    found = decode_bandwidth(load_model("meta-llama/Llama-3-8B"), run["device_name"], run["dtype"], run["batch"],
                             run["prompt_tokens"], run["decode_steps"], run["decode_tokens_per_s"])
    profile = Profile(**run | {"decode_bandwidth": found.model_dump()})
    assert json.loads(profile.model_dump_json())["decode_bandwidth"]["utilisation"] == found.utilisation
    screen = io.StringIO()
    print_profile(Console(file=screen, width=80, markup=False, emoji=False), profile)
    text = " ".join(screen.getvalue().split())
    assert ("decode step 88.8 ms, 9.60 ms at peak (memory bandwidth binds): 32.16 GB read a step, 362 GB/s: 10.8% of "
            "NVIDIA H100 SXM's 3,350 GB/s") in text
    assert "eager decode" in text and "far from" in text
