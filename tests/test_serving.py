"""Real deployments: vLLM's reservation for multimodal inputs, its CPU offloading of weights and KV, its ROCm
defaults, and llama.cpp as the engine on Apple silicon. Every expected number is worked by hand from vLLM 0.33.0's
source (the file named in each test) and the model's config; none comes from kvplan."""

import json

import pytest
from conftest import GiB, MiB, run_main

from kvplan.capacity import Hardware, Parallelism, Workload, capacity, plan
from kvplan.engines import EngineOptions
from kvplan.errors import KvplanError
from kvplan.sources import load_model

H100 = Hardware(name="NVIDIA H100 SXM", memory_bytes=81_559 * MiB)
H200 = Hardware(name="NVIDIA H200", memory_bytes=143_771 * MiB)
B200 = Hardware(name="NVIDIA B200", memory_bytes=183_359 * MiB)
A100 = Hardware(name="NVIDIA A100 80GB SXM", memory_bytes=81_920 * MiB)
MI300X = Hardware(name="AMD Instinct MI300X", memory_bytes=192 * GiB)
GEMMA3 = "google/gemma-3-27b-it"
SCOUT = "meta-llama/Llama-4-Scout-17B-16E-Instruct"
LLAMA3 = "meta-llama/Llama-3-8B"
# Vision towers and projectors (docs/formulas.md 6.7a, checked against transformers' classes in test_profile.py), bf16
GEMMA3_TOWER = 423_060_336 * 2
SCOUT_TOWER = 871_932_416 * 2
QWEN35_TOWER = 460_730_096 * 2
LLAMA3_WEIGHTS = 8_030_261_248 * 2


def cap(model, hardware=H100, ctx=8192, **options):
    return capacity(load_model(model), Workload(ctx=ctx), hardware=hardware, options=EngineOptions(**options))


# ------------------------------------------------------------------------------------------- multimodal inputs


def test_gemma3_27b_encoder_cache_on_an_h100():
    """Gemma 3 (vLLM models/gemma3_mm.py): an image is mm_tokens_per_image = 256 embedding rows (pan-and-scan off).
    On an H100 max_num_batched_tokens M = 8,192, so the encoder budget is max(8,192, 256) = 8,192
    (`compute_mm_encoder_budget`) and the profile batch 8,192 // 256 = 32 images (max_num_seqs 1,024 x
    min(999, 8,192 // 256) allows more): 32 x 256 rows x 5,376 (text hidden) x 2 B = 88,080,384 B held through the
    decoder's profile."""
    result = cap(GEMMA3)
    assert result.overhead["mm_encoder_cache"] == 32 * 256 * 5376 * 2 == 88_080_384
    plain = cap(GEMMA3, language_model_only=True)
    assert "mm_encoder_cache" not in plain.overhead
    # text-only also leaves the tower out: it is weights, split over TP x PP
    assert result.weights_bytes_per_gpu - plain.weights_bytes_per_gpu == GEMMA3_TOWER
    assert plain.weights_not_loaded_bytes == GEMMA3_TOWER
    assert plain.kv_budget_bytes - result.kv_budget_bytes == GEMMA3_TOWER + 88_080_384


def test_gemma3_encoder_cache_follows_max_num_batched_tokens():
    """A100 (not in the >= 70 GiB tier): M = 2,048 -> 8 images, 8 x 256 x 5,376 x 2 = 22,020,096 B; M = 16,384 given:
    64 images, 176,160,768 B."""
    assert cap(GEMMA3, hardware=A100).overhead["mm_encoder_cache"] == 8 * 256 * 5376 * 2 == 22_020_096
    assert cap(GEMMA3, max_num_batched_tokens=16_384).overhead["mm_encoder_cache"] == 176_160_768


def test_gemma3_image_must_fit_in_one_batch():
    """Gemma 3 attends bidirectionally within an image, so vLLM forces disable_chunked_mm_input
    (platforms/cuda.py) and `compute_mm_encoder_budget` raises when 256 > max_num_batched_tokens."""
    with pytest.raises(KvplanError, match=r"max_tokens_per_mm_item \(256\) is larger than max_num_batched_tokens "
                                          r"\(128\)"):
        cap(GEMMA3, max_num_batched_tokens=128)
    cap(GEMMA3, max_num_batched_tokens=128, language_model_only=True)  # text-only: no encoder budget at all


def test_llama4_scout_encoder_cache():
    """Llama 4 (vLLM models/mllama4.py): the dummy image is max_patches = 16 tiles tall, so 16 tiles and a global one,
    each (336 / 14)^2 // round(1 / 0.5^2) = 576 // 4 = 144 rows: 2,448 rows an image. H200: M = 8,192, budget 8,192,
    8,192 // 2,448 = 3 images, 3 x 2,448 x 5,120 x 2 = 75,202,560 B. B200: M = 16,384, 6 images, 150,405,120 B.
    M = 2,048 < 2,448: budget max(2,048, 2,448) = 2,448, one image, 25,067,520 B (Llama 4 chunks images)."""
    assert load_model(SCOUT).multimodal.tokens_per_item == 17 * 144 == 2448
    assert cap(SCOUT, hardware=H200).overhead["mm_encoder_cache"] == 3 * 2448 * 5120 * 2 == 75_202_560
    assert cap(SCOUT, hardware=B200).overhead["mm_encoder_cache"] == 6 * 2448 * 5120 * 2 == 150_405_120
    assert cap(SCOUT, hardware=H200, max_num_batched_tokens=2048).overhead["mm_encoder_cache"] == 25_067_520


def test_llama4_scout_text_only_by_limit():
    """--limit-mm-per-prompt image=0 (every modality the tower encodes at 0) is vLLM's text-only mode
    (`_mark_tower_model`): the tower's 871,932,416 parameters are not loaded, shared over TP 4."""
    with_images = capacity(load_model(SCOUT), Workload(ctx=8192), hardware=H200, parallel=Parallelism(tp=4))
    text_only = capacity(load_model(SCOUT), Workload(ctx=8192), hardware=H200, parallel=Parallelism(tp=4),
                         options=EngineOptions(limit_mm_per_prompt=(("image", 0),)))
    assert text_only.weights_not_loaded_bytes == SCOUT_TOWER
    assert with_images.weights_bytes_per_gpu - text_only.weights_bytes_per_gpu == SCOUT_TOWER // 4
    assert "mm_encoder_cache" not in text_only.overhead


def test_qwen35_tower_needs_image_and_video_off():
    """Qwen3.5's tower encodes images and video (vLLM models/qwen3_5.py `_mark_tower_model(..., {"image", "video"})`):
    image=0 alone keeps it; image=0,video=0 or --language-model-only drops its 460,730,096 parameters. kvplan does not
    know Qwen3.5's tokens per item (they come from the processor's pixel limits), so the encoder cache is a note."""
    keep = cap("Qwen/Qwen3.5-27B", limit_mm_per_prompt=(("image", 0),))
    both = cap("Qwen/Qwen3.5-27B", limit_mm_per_prompt=(("image", 0), ("video", 0)))
    flag = cap("Qwen/Qwen3.5-27B", language_model_only=True)
    assert keep.weights_not_loaded_bytes == 0
    assert both.weights_not_loaded_bytes == flag.weights_not_loaded_bytes == QWEN35_TOWER
    assert any("encoder cache and multimodal profile run for qwen3_5_text are not counted" in n for n in keep.notes)


def test_multimodal_flags_are_refused_where_they_mean_nothing(monkeypatch, capsys):
    with pytest.raises(KvplanError, match="takes text only"):
        cap(LLAMA3, language_model_only=True)
    with pytest.raises(KvplanError, match="takes no audio"):
        cap(GEMMA3, limit_mm_per_prompt=(("audio", 0),))
    for flags, wanted in ((["--limit-mm-per-prompt", "image=x"], "must be a whole number"),
                          (["--limit-mm-per-prompt", "{image: 0}"], "not a JSON object"),
                          (["--language-model-only", "--engine", "sglang"], "not a SGLang setting")):
        code, out, err = run_main(monkeypatch, capsys, "estimate", "-m", GEMMA3, "--ctx", "8k", "--gpu", "h100",
                                  *flags)
        assert code == 2 and wanted in err and len(err.strip().splitlines()) == 1


def test_limit_mm_per_prompt_reads_vllm_json_and_pairs(monkeypatch, capsys):
    for form in ('{"image": 0}', "image=0"):
        code, out, _ = run_main(monkeypatch, capsys, "estimate", "-m", GEMMA3, "--ctx", "8k", "--gpu", "h100",
                                "--limit-mm-per-prompt", form, "--json")
        data = json.loads(out)
        assert data["weights_not_loaded_bytes"] == GEMMA3_TOWER and "mm_encoder_cache" not in data["overhead"]


# -------------------------------------------------------------------------------------------------- offloading


def test_cpu_offload_moves_weights_to_host_memory():
    """--cpu-offload-gb 10 (model_executor/offloader/uva.py): 10 GiB of each GPU's weights live in pinned host memory,
    so the GPU's share and its KV budget move by exactly 10 GiB; two replicas pin 20 GiB."""
    base = cap(LLAMA3)
    off = capacity(load_model(LLAMA3), Workload(ctx=8192), hardware=H100, parallel=Parallelism(replicas=2),
                   options=EngineOptions(cpu_offload_bytes=10 * GiB))
    assert base.weights_bytes_per_gpu == LLAMA3_WEIGHTS
    assert off.weights_bytes_per_gpu == LLAMA3_WEIGHTS - 10 * GiB == 5_323_104_256
    assert off.weights_offloaded_bytes_per_gpu == 10 * GiB
    assert off.kv_budget_bytes - base.kv_budget_bytes == 10 * GiB
    assert off.host_memory_bytes == 2 * 10 * GiB
    # more than the weights offloads all but the embeddings, lm_head and final norm (tests/test_hostile_deployments.py)
    assert cap(LLAMA3, cpu_offload_bytes=100 * GiB).weights_bytes_per_gpu == 2_101_354_496


def test_kv_offload_adds_host_memory_and_prefix_blocks_not_users():
    """--kv-offloading-size 64 (config/vllm.py: the native OffloadingConnector, cpu_bytes_to_use = 64 x 2^30, summed
    over the TP ranks; v1/kv_offload/cpu/spec.py). Llama-3-8B at TP 2: a GPU block is 16 tokens x 2 x 4 KV heads x
    128 x 2 B x 32 layers = 1,048,576 B, a chunk one block of each rank, 2 MiB (a multiple of the 4 KiB page):
    64 GiB // 2 MiB = 32,768 blocks of 16 tokens, 524,288 prefix tokens. Offloaded blocks serve prefix-cache hits
    (they are loaded into GPU blocks, `OffloadingConnectorScheduler.get_num_new_matched_tokens`): users unchanged."""
    def at(**options):
        return capacity(load_model(LLAMA3), Workload(ctx=8192), hardware=H100, parallel=Parallelism(tp=2),
                        options=EngineOptions(**options))

    base, off = at(), at(kv_offloading_size=64 * GiB)
    assert off.vllm_block_bytes == 1_048_576
    assert off.vllm_kv_offload_blocks == 32_768 and off.vllm_kv_offload_tokens == 524_288
    assert off.kv_offload_bytes == off.host_memory_bytes == 64 * GiB
    assert (off.max_concurrent_users, off.kv_budget_bytes) == (base.max_concurrent_users, base.kv_budget_bytes)
    lmcache = at(kv_offloading_size=64 * GiB, kv_offloading_backend="lmcache")
    assert lmcache.vllm_kv_offload_blocks is None and lmcache.host_memory_bytes == 64 * GiB


def test_kv_offload_of_a_hybrid_counts_blocks_only():
    """Gemma-3-27B (7 KV-cache groups, 1,310,720 B blocks): 64 GiB // 1,310,720 = 52,428 blocks; the tokens they hold
    depend on which groups a prefix stores (sliding groups keep their window only), so none are given."""
    off = cap(GEMMA3, kv_offloading_size=64 * GiB)
    assert off.vllm_kv_offload_blocks == 68_719_476_736 // 1_310_720 == 52_428
    assert off.vllm_kv_offload_tokens is None


def test_offload_flags_on_the_command_line(monkeypatch, capsys):
    code, out, _ = run_main(monkeypatch, capsys, "estimate", "-m", LLAMA3, "--ctx", "8k", "--gpu", "h100",
                            "--cpu-offload-gb", "2.5", "--kv-offloading-size", "16GiB", "--json")
    data = json.loads(out)
    assert data["weights_offloaded_bytes_per_gpu"] == int(2.5 * GiB)
    assert data["host_memory_bytes"] == int(2.5 * GiB) + 16 * GiB
    assert data["vllm_kv_offload_blocks"] == 16 * GiB // (2 * MiB)
    for flags, wanted in ((["--kv-offloading-size", "0"], "must be more than 0"),
                          (["--kv-offloading-backend", "lmcache"], "must be more than 0"),
                          (["--kv-offloading-backend", "disk", "--kv-offloading-size", "1"], "native or lmcache"),
                          (["--cpu-offload-gb", "4", "--engine", "llama.cpp"], "not a llama.cpp setting")):
        code, _, err = run_main(monkeypatch, capsys, "estimate", "-m", LLAMA3, "--ctx", "8k", "--gpu", "h100",
                                *flags)
        assert code == 2 and wanted in err, err


# ------------------------------------------------------------------------------------------------------ ROCm


def test_rocm_mla_block_size_is_16():
    """ROCm's MLA backends (platforms/rocm.py: ROCM_AITER_MLA, MultipleOf(1); TRITON_MLA, MultipleOf(16)) take vLLM's
    default block size 16 where CUDA's FlashMLA takes 64. DeepSeek-V2-Lite (27 MLA layers, 512 + 64 latent, bf16):
    a block is 16 x 576 x 2 x 27 = 497,664 B on an MI300X, 64 x 576 x 2 x 27 = 1,990,656 B on an H100."""
    model = load_model("deepseek-ai/DeepSeek-V2-Lite")
    rocm = capacity(model, Workload(ctx=8192), hardware=MI300X)
    cuda = capacity(model, Workload(ctx=8192), hardware=H100)
    assert rocm.vllm_block_bytes == 16 * 576 * 2 * 27 == 497_664
    assert cuda.vllm_block_bytes == 64 * 576 * 2 * 27
    assert any("ROCm's MLA backends use 16" in n for n in rocm.notes)
    # plain attention: ROCM_ATTN takes MultipleOf(16), the same 16 as CUDA
    assert cap(LLAMA3, hardware=MI300X).vllm_block_bytes == cap(LLAMA3).vllm_block_bytes == 2 * MiB


def test_mi355x_defaults():
    """MI355X, 288 GiB: >= 160 GiB, so max_num_batched_tokens 16,384 (`get_batch_defaults`); utilization 0.92 as on
    CUDA (`CacheConfig`)."""
    mi355x = Hardware(name="AMD Instinct MI355X", memory_bytes=288 * GiB)
    result = capacity(load_model(LLAMA3), Workload(ctx=8192), hardware=mi355x)
    assert result.memory_fraction == 0.92
    assert result.overhead["activations"] == 16_384 * 160 * 1024


# ------------------------------------------------------------------------------------------ Apple silicon


def test_llama_cpp_is_the_default_engine_on_apple_silicon(monkeypatch, capsys):
    code, out, _ = run_main(monkeypatch, capsys, "estimate", "-m", LLAMA3, "--ctx", "8k", "--gpu", "m2-ultra")
    text = " ".join(out.split())
    assert "with llama.cpp" in text and "llama.cpp, the default on Apple M2 Ultra 192GB" in text
    code, out, _ = run_main(monkeypatch, capsys, "estimate", "-m", LLAMA3, "--ctx", "8k", "--gpu", "m2-ultra",
                            "--json")
    data = json.loads(out)
    assert data["engine"] == "llama.cpp" and data["gpu_memory_bytes"] == 144 * GiB
    code, out, _ = run_main(monkeypatch, capsys, "estimate", "-m", LLAMA3, "--ctx", "8k", "--gpu", "m2-ultra",
                            "--engine", "vllm", "--json")
    assert json.loads(out)["engine"] == "vllm"
    code, out, _ = run_main(monkeypatch, capsys, "plan", "-m", LLAMA3, "--ctx", "8k", "--users", "4", "--gpu",
                            "m4-max", "--json")
    data = json.loads(out)
    assert data["engine"] == "llama.cpp" and "default on Apple M4 Max 128GB" in data["notes"][0]
    code, out, _ = run_main(monkeypatch, capsys, "estimate", "-m", LLAMA3, "--ctx", "8k", "--gpu", "h100", "--json")
    assert json.loads(out)["engine"] == "vllm"


def test_plan_carries_the_multimodal_reservation():
    """plan runs the same deployments: text-only Gemma 3 needs no more GPUs than with images."""
    model = load_model(GEMMA3)
    with_images = plan(model, Workload(ctx=32_768, users=16), H100)
    text_only = plan(model, Workload(ctx=32_768, users=16), H100, options=EngineOptions(language_model_only=True))
    assert text_only.rows[0].gpus <= with_images.rows[0].gpus
    assert text_only.rows[0].weights_bytes_per_gpu < with_images.rows[0].weights_bytes_per_gpu


def test_table_plans_llama_cpp_on_apple_silicon(monkeypatch, capsys):
    code, out, _ = run_main(monkeypatch, capsys, "table", "-m", LLAMA3, "--ctx", "8k", "--gpu", "m2-ultra",
                            "--format", "json")
    assert code == 0 and json.loads(out)["rows"][0]["engine"] == "llama.cpp"
    code, _, err = run_main(monkeypatch, capsys, "table", "-m", LLAMA3, "--ctx", "8k", "--gpu", "m2-ultra,h100")
    assert code == 2 and "give --engine" in err
