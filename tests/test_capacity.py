"""Capacity math: budgets, users, context, parallelism and the workload, against hand arithmetic and published
GPU sizes; properties with hypothesis."""

import pytest
from conftest import GB, GiB, MiB
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kvplan import engines
from kvplan.capacity import (
    Hardware,
    Parallelism,
    Workload,
    capacity,
    check_parallel,
    max_users,
    parallelism,
    plan,
)
from kvplan.capacity.layout import gpu_layers, stage_bounds
from kvplan.engines import EngineOptions, KVPool
from kvplan.errors import KvplanError
from kvplan.model import FullAttention, ModelSpec, ParamCounts, SlidingWindow
from kvplan.sources import load_model

H100 = Hardware(name="NVIDIA H100 SXM", memory_bytes=81_559 * MiB)  # nvidia-smi: 81,559 MiB
LLAMA8B = "meta-llama/Llama-3-8B"
LLAMA70B = "meta-llama/Llama-3-70B"


def synthetic(
    layers: int,
    kv_heads: int,
    head_dim: int,
    weights_bytes: int,
    window: int | None = None,
    name: str = "synthetic",
) -> ModelSpec:
    """A model with exactly `weights_bytes` of bf16 weights and plain attention layers."""
    kind = (
        (
            lambda i: SlidingWindow(
                layer=i, kv_heads=kv_heads, head_dim=head_dim, head_dim_v=head_dim, window=window
            )
        )
        if window
        else (lambda i: FullAttention(layer=i, kv_heads=kv_heads, head_dim=head_dim, head_dim_v=head_dim))
    )
    return ModelSpec(
        name=name,
        architecture="synthetic",
        num_layers=layers,
        num_attention_heads=4 * kv_heads,
        caches=tuple(kind(i) for i in range(layers)),
        dtype="bf16",
        params=ParamCounts(
            embedding=0, lm_head=0, attention=0, mlp=weights_bytes // 2, experts=0, active_experts=0, other=0
        ),
    )


# ------------------------------------------------------------------------------------------ worked examples


def test_seed_rtx_4090_example():
    # The seeds' example: a 24 GB card, a 27B model at 4-bit ~= 16 GB of weights, ~1 GB overhead -> ~7 GB for
    # KV; ~1.2 GB per user at 8K gives 5 users, at 32K 1 user. 36 layers x 8 KV heads x 128 in bf16 cost
    # 36 x 2 x 8 x 128 x 2 = 147,456 B/token: 1,207,959,552 B (~1.2 GB) at 8K, 4.83 GB at 32K.
    model = synthetic(36, 8, 128, weights_bytes=16 * GB)
    card = Hardware(memory_bytes=24 * GB)
    at_8k = capacity(model, Workload(ctx=8192), engine_name="ideal", hardware=card, overhead=1 * GB)
    assert at_8k.kv_budget_bytes == 7 * GB
    assert at_8k.engine_kv_bytes_per_sequence == 147_456 * 8192 == 1_207_959_552
    assert at_8k.max_concurrent_users == 5  # 7e9 / 1.208e9 = 5.8
    at_32k = capacity(model, Workload(ctx=32_768), engine_name="ideal", hardware=card, overhead=1 * GB)
    assert at_32k.max_concurrent_users == 1  # 7e9 / 4.83e9 = 1.4


def test_llama3_70b_bf16_needs_two_h100s():
    # 70.6B parameters x 2 B = 141 GB of weights: more than one 80 GB GPU; TP=2 puts 70.6 GB on each
    model = load_model(LLAMA70B)
    one = capacity(model, Workload(ctx=8192), hardware=H100)
    assert not one.fits and one.max_concurrent_users == 0
    assert "weights" in one.reasons[0]
    assert any(s.startswith("needs TP >= 2") for s in one.suggestions)
    two = capacity(model, Workload(ctx=8192), hardware=H100, parallel=Parallelism(tp=2))
    assert two.fits and two.max_concurrent_users >= 1
    assert two.weights_bytes_per_gpu == pytest.approx(70.55e9, rel=0.01)


def test_kv_budget_plans_exactly_that_much():
    cap = capacity(load_model(LLAMA8B), Workload(ctx=8192, users=10), kv_budget=60 * GiB)
    assert cap.kv_budget_bytes == 60 * GiB and cap.kv_budget_given
    assert cap.memory_fraction is None and cap.overhead is None
    # 10 users need 10 x 512 + 1 null block; the longest ctx: (30,720 - 1) // 10 = 3,071 blocks of 16 ->
    # 49,136 tokens, capped by Llama-3-8B's 8,192-token context
    assert cap.max_ctx_for_users == 8192


def test_vllm_budget_arithmetic_on_h100():
    # ceil(81,559 MiB x 0.92) - weights - (activations 8192 x 160 KiB + non-torch 0.5 + CUDA graphs 0.5 GiB)
    model = load_model(LLAMA8B)
    cap = capacity(model, Workload(ctx=8192), hardware=H100)
    weights = 2 * model.params.total
    overhead = 8192 * 160 * 1024 + GiB // 2 + GiB // 2
    assert cap.kv_budget_bytes == -(-81_559 * MiB * 92 // 100) - weights - overhead
    assert cap.vllm_num_blocks == cap.kv_budget_bytes // 2_097_152


def test_max_ctx_for_users():
    # ideal engine, 1 GiB budget, 131,072 B/token: 8,192 tokens for 1 user, 4,096 each for 2
    model = synthetic(32, 8, 128, weights_bytes=0)
    assert (
        capacity(model, Workload(ctx=1, users=1), engine_name="ideal", kv_budget=GiB).max_ctx_for_users
        == 8192
    )
    assert (
        capacity(model, Workload(ctx=1, users=2), engine_name="ideal", kv_budget=GiB).max_ctx_for_users
        == 4096
    )


def test_fp8_suggestion_when_users_do_not_fit():
    cap = capacity(load_model(LLAMA8B), Workload(ctx=8192, users=100), kv_budget=60 * GiB)
    assert not cap.fits
    # fp8 halves the blocks: 8,192 / 16 blocks of 1 MiB; (61,440 - 1) // 512 = 119 users
    assert "fp8 KV fits 119 users" in cap.suggestions


# ---------------------------------------------------------------------------------------------- parallelism


def test_tp_splits_kv_heads_and_replicates_past_them():
    model = load_model(LLAMA8B)  # 32 heads, 8 KV heads, 131,072 B/token
    per_token = {
        tp: capacity(
            model, Workload(ctx=1), engine_name="ideal", kv_budget=GiB, parallel=Parallelism(tp=tp)
        ).engine_kv_bytes_per_sequence
        for tp in (1, 2, 8, 16)
    }
    assert per_token == {1: 131_072, 2: 65_536, 8: 16_384, 16: 16_384}  # max(1, 8 // 16) = 1 head at TP 16


def test_tp_must_divide_heads():
    with pytest.raises(KvplanError, match="does not divide .* 32 attention heads"):
        check_parallel(load_model(LLAMA8B), 3, 1)
    with pytest.raises(KvplanError, match="valid TP: 1, 2, 4, 8, 16, 32"):
        check_parallel(load_model(LLAMA8B), 6, 1)


def test_pipeline_stages_follow_each_engine():
    # vLLM get_pp_indices: the remainder to the stages before the last, from the second-to-last backwards
    vllm = engines.engine("vllm", EngineOptions(), tp=1, pp=4)
    assert vllm.stage_sizes(61) == [15, 15, 16, 15] and vllm.stage_sizes(10) == [2, 3, 3, 2]
    # SGLang get_pp_indices (srt/distributed/utils.py): "the last N partitions will have one extra layer"
    sglang = engines.engine("sglang", EngineOptions(), tp=1, pp=4)
    assert sglang.stage_sizes(61) == [15, 15, 15, 16] and sglang.stage_sizes(10) == [2, 2, 3, 3]
    assert [b - a for a, b in stage_bounds([2, 2, 3, 3])] == [2, 2, 3, 3]


def test_pipeline_parallel_splits_layers_and_weights():
    model = load_model(LLAMA8B)
    cap = capacity(model, Workload(ctx=1), engine_name="ideal", kv_budget=GiB, parallel=Parallelism(pp=2))
    assert cap.engine_kv_bytes_per_sequence == 131_072 // 2
    assert cap.weights_bytes_per_gpu == -(-2 * model.params.total // 2)


def test_stage_layers_of_a_copy_with_other_caches():
    """Llama-3-8B (32 layers of 8 KV heads) in two stages of 16 layers, then a copy whose last 12 layers have 4 KV
    heads: the second stage holds 4 layers of 8 heads and 12 of 4. Layers are grouped once per caches tuple
    (`layer_groups`), so the copy, which a cache kept on the ModelSpec would follow, is grouped as its own."""
    model = load_model(LLAMA8B)
    caches = model.caches
    copy = model.model_copy(update={"caches": tuple(
        c.model_copy(update={"kv_heads": 4}) if c.layer >= 20 else c for c in caches)})
    heads = [[(cache.kv_heads, count) for cache, count in stage] for stage in gpu_layers(caches, [16, 16], 1)]
    assert heads == [[(8, 16)], [(8, 16)]]
    heads = [[(cache.kv_heads, count) for cache, count in stage] for stage in gpu_layers(copy.caches, [16, 16], 1)]
    assert heads == [[(8, 16)], [(8, 4), (4, 12)]]
    assert [count for _, count in gpu_layers(caches, [20, 12], 1)[1]] == [12]


def test_replicas_multiply_users():
    model = load_model(LLAMA8B)
    one = capacity(model, Workload(ctx=8192), kv_budget=60 * GiB)
    four = capacity(model, Workload(ctx=8192), kv_budget=60 * GiB, parallel=Parallelism(replicas=4))
    assert four.max_concurrent_users == 4 * one.max_concurrent_users


def test_gpus_tp_pp_resolution():
    assert parallelism("vllm", 8, None, None) == Parallelism(tp=8, from_gpus=True)
    assert parallelism("vllm", 8, 2, None) == Parallelism(tp=2, replicas=4)
    assert parallelism("llama.cpp", 2, None, None) == Parallelism(pp=2, from_gpus=True)
    with pytest.raises(KvplanError, match="multiple of TP x PP"):
        parallelism("vllm", 6, 4, None)


def test_an_error_about_tp_taken_from_gpus_names_gpus():
    """--gpus 3 alone means TP 3, which no 32-head model allows: the error names the flag that was given."""
    with pytest.raises(KvplanError, match=r"--gpus 3 as TP 3 does not divide .*give --tp with --gpus"):
        check_parallel(load_model(LLAMA8B), 3, 1, from_gpus=True)


# ------------------------------------------------------------------------------------------------- workload


def test_average_context_and_shared_prefix():
    model = load_model(LLAMA8B)
    cap = capacity(model, Workload(ctx=8192, avg_ctx=2048), kv_budget=60 * GiB)
    # 2,048 tokens = 128 blocks: (30,720 - 1) // 128 = 239 users at the mean
    assert cap.max_users_at_avg_ctx == 239
    # a 4,096-token system prompt: 256 shared blocks; N users need N x 256 + 256 + 1 blocks -> 118
    shared = capacity(model, Workload(ctx=8192, shared_prefix=4096), kv_budget=60 * GiB)
    assert shared.max_concurrent_users == (30_720 - 1 - 256) // 256 == 118


def test_shared_prefix_as_long_as_the_context_is_refused_not_searched_forever():
    # users sharing all their tokens would cost nothing each: an unbounded search, so it is bad input
    with pytest.raises(KvplanError, match="shorter than the context"):
        capacity(load_model(LLAMA8B), Workload(ctx=4096, shared_prefix=4096), kv_budget=60 * GiB)


def test_workload_needs_a_paged_engine():
    with pytest.raises(KvplanError, match="paged engine"):
        capacity(
            load_model(LLAMA8B), Workload(ctx=8192, avg_ctx=1024), engine_name="llama.cpp", kv_budget=60 * GiB
        )
    with pytest.raises(KvplanError, match="exceeds --ctx"):
        capacity(load_model(LLAMA8B), Workload(ctx=1024, avg_ctx=2048), kv_budget=60 * GiB)


def test_contradictory_and_missing_budget():
    model = load_model(LLAMA8B)
    with pytest.raises(KvplanError, match="--kv-budget"):
        capacity(model, Workload(ctx=8192), kv_budget=GiB, overhead=GiB)
    with pytest.raises(KvplanError, match="--gpu, --vram or --kv-budget"):
        capacity(model, Workload(ctx=8192))


def test_no_cache_model_is_refused():
    with pytest.raises(KvplanError, match="no per-sequence cache"):
        capacity(load_model("google-bert/bert-base-uncased"), Workload(ctx=512), kv_budget=GiB)


# ----------------------------------------------------------------------------------------------------- plan


def test_plan_ranks_by_gpus():
    result = plan(load_model(LLAMA70B), Workload(ctx=8192, users=4), H100)
    gpus = [row.gpus for row in result.rows]
    assert gpus == sorted(gpus) and gpus[0] == 1  # int4 weights (35 GiB) fit one H100
    assert all(row.max_concurrent_users >= 4 and row.headroom_bytes >= 0 for row in result.rows)
    bf16 = [row for row in result.rows if row.weights_dtype == "bf16"]
    assert bf16 and min(row.gpus for row in bf16) == 2


# ----------------------------------------------------------------------------------------------- properties

ENGINES = ["vllm", "sglang", "llama.cpp", "transformers", "tensorrt-llm", "ideal"]
PAGED = ["vllm", "sglang", "tensorrt-llm", "ideal"]
models = st.builds(
    synthetic,
    layers=st.integers(1, 48),
    kv_heads=st.sampled_from([1, 2, 4, 8]),
    head_dim=st.sampled_from([64, 128, 256]),
    weights_bytes=st.just(0),
    window=st.one_of(st.none(), st.integers(16, 8192)),
)


@settings(max_examples=60, deadline=None)
@given(
    model=models,
    engine=st.sampled_from(ENGINES),
    ctx=st.integers(1, 65_536),
    budget=st.integers(1, 64 * GiB),
    more=st.integers(0, 16 * GiB),
)
def test_more_memory_never_fewer_users(model, engine, ctx, budget, more):
    users = capacity(model, Workload(ctx=ctx), engine_name=engine, kv_budget=budget).max_concurrent_users
    assert (
        capacity(model, Workload(ctx=ctx), engine_name=engine, kv_budget=budget + more).max_concurrent_users
        >= users
    )


@settings(max_examples=60, deadline=None)
@given(
    model=models,
    engine=st.sampled_from(["vllm", "sglang", "tensorrt-llm", "ideal"]),
    ctx=st.integers(1, 65_536),
    budget=st.integers(1, 64 * GiB),
)
def test_fp8_never_fewer_users_than_bf16(model, engine, ctx, budget):
    def users(dtype):
        return capacity(
            model, Workload(ctx=ctx), engine_name=engine, kv_budget=budget, kv_dtype_name=dtype
        ).max_concurrent_users

    assert users("fp8") >= users("bf16")


@settings(max_examples=60, deadline=None)
@given(
    model=models, engine=st.sampled_from(ENGINES), ctx=st.integers(1, 65_536), budget=st.integers(1, 64 * GiB)
)
# Contexts within a window and a batch, where a request's window and its in-flight tokens are the same blocks.
@example(model=synthetic(1, 1, 64, 0, window=17), engine="vllm", ctx=33, budget=20_480)
@example(model=synthetic(1, 1, 64, 0, window=16), engine="vllm", ctx=17, budget=16_384)
def test_users_fit_the_budget(model, engine, ctx, budget):
    cap = capacity(model, Workload(ctx=ctx), engine_name=engine, kv_budget=budget)
    if engine in PAGED:
        assert cap.max_users_at_startup * cap.engine_kv_bytes_per_sequence <= budget
        users = cap.max_concurrent_users
        # a request never holds more in steady decode than its start-up reservation (vLLM max_memory_usage_bytes)
        assert cap.engine_kv_bytes_per_sequence_decode <= cap.engine_kv_bytes_per_sequence
        assert users * cap.engine_kv_bytes_per_sequence_decode + cap.engine_kv_bytes_fixed <= budget or users == 0
    assert cap.max_concurrent_users >= cap.max_users_at_startup
    assert (cap.max_users_at_startup == 0) == (cap.max_concurrent_users == 0)
    workload = Workload(ctx=ctx, users=max(cap.max_concurrent_users, 1))
    served = capacity(model, workload, engine_name=engine, kv_budget=budget)
    assert served.fits == (cap.max_concurrent_users >= 1)
    if served.fits:
        assert served.engine_kv_bytes_for_users <= budget


def test_vllm_counts_users_as_the_search_finds_them():
    """vLLM's pool counts the users that fit in closed form (its blocks are linear in users); the search, which
    assumes nothing of the pool but that its peak grows, must find the same number for every model kind, context,
    shared prefix and budget tried, both as reserved and in steady decode."""
    import random

    from kvplan.capacity import Hardware, Parallelism, deploy, search_users
    from kvplan.engines import EngineOptions
    from kvplan.sources import load_model

    draw = random.Random(0)
    names = ["meta-llama/Llama-3.1-8B", "google/gemma-3-27b-it", "openai/gpt-oss-20b", "deepseek-ai/DeepSeek-V3",
             "Qwen/Qwen3-Next-80B-A3B-Thinking", "ai21labs/Jamba-v0.1", "openai/whisper-large-v3",
             "mistralai/Mistral-7B-v0.1", "meta-llama/Llama-4-Scout-17B-16E-Instruct"]
    checked = 0
    for name in names:
        model = load_model(name)
        for options in (EngineOptions(), EngineOptions(async_scheduling=False, block_size=32)):
            deployment = deploy(model, [Workload(ctx=1024)], "vllm", options,
                                 Hardware(name="NVIDIA H100 SXM", memory_bytes=80 * GiB), Parallelism(), None, None,
                                 kv_budget=None, overhead=None)
            pool = deployment.pools[0]
            for ctx in (1, 17, 1000, 4096, 32768, 131072, draw.randint(1, 200_000)):
                for prefix in (0, 0, ctx // 2):
                    for budget in (-GiB, 0, pool.block_bytes, deployment.budget, *(draw.randint(0, 200 * GiB)
                                                                                   for _ in range(4))):
                        for steady in (False, True):
                            exact = pool.users_within(budget, ctx, prefix, steady)
                            assert exact == search_users(pool, budget, ctx, prefix, steady), (name, ctx, budget)
                            checked += 1
    assert checked > 1000


@pytest.mark.parametrize("engine", ["vllm", "sglang", "llama.cpp", "transformers", "tensorrt-llm"])
def test_pools_that_free_nothing_in_decode_hold_their_reservation(engine):
    """`_users_at` counts steady-decode users only for pools that say they free blocks in decode
    (`KVPool.frees_in_decode`); for the others the steady count must be the start-up one. The search, which reads
    only the pool's bytes, checks that for every model kind and budget tried; and the vLLM pools that do free
    blocks (sliding, chunked, cross-attention) must somewhere hold more users in steady decode, or the flag says
    nothing."""
    from kvplan.capacity import Hardware, Parallelism, deploy, engine_dtypes, search_users

    names = ["meta-llama/Llama-3.1-8B", "google/gemma-3-27b-it", "openai/gpt-oss-20b", "deepseek-ai/DeepSeek-V3",
             "Qwen/Qwen3-Next-80B-A3B-Thinking", "openai/whisper-large-v3",
             "meta-llama/Llama-4-Scout-17B-16E-Instruct"]
    freeing = []
    for name in names:
        model = load_model(name)
        kv, weights = engine_dtypes(model, engine)
        try:
            deployment = deploy(model, [Workload(ctx=1024)], engine, EngineOptions(),
                                 Hardware(name="NVIDIA H100 SXM", memory_bytes=80 * GiB), Parallelism(), kv,
                                 weights, kv_budget=None, overhead=None)
        except KvplanError:  # an engine that does not run this model
            continue
        pool = deployment.pools[0]
        gained = False
        for ctx in (1, 1000, 4096, 32768, 131072):
            for budget in (pool.bytes_for(1, ctx), deployment.budget, 200 * GiB):
                startup, steady = (search_users(pool, budget, ctx, steady=s) for s in (False, True))
                if not pool.frees_in_decode:
                    assert steady == startup, (name, ctx, budget)
                gained = gained or steady > startup
        if pool.frees_in_decode:
            freeing.append(name)
            assert gained, name
    # Qwen3-Next: on an H100 vLLM 0.33 runs its Gated DeltaNet prefill on FlashInfer, whose checkpoint page each
    # state frees in decode
    assert set(freeing) == ({"google/gemma-3-27b-it", "openai/gpt-oss-20b", "openai/whisper-large-v3",
                             "meta-llama/Llama-4-Scout-17B-16E-Instruct", "Qwen/Qwen3-Next-80B-A3B-Thinking"}
                            if engine == "vllm" else set())


@pytest.mark.parametrize("engine", ["vllm", "sglang", "llama.cpp", "transformers", "tensorrt-llm", "ideal"])
@pytest.mark.parametrize("name", ["meta-llama/Llama-3-70B", "meta-llama/Llama-4-Scout-17B-16E-Instruct",
                                  "Qwen/Qwen3-Next-80B-A3B-Thinking"])
def test_weights_beyond_the_gpu_leave_no_users(engine, name):
    """Weights larger than the GPU leave a KV budget below zero: no user fits, and no engine's count may go below
    zero with it (SGLang's token pools once divided the negative budget: -182,843 users of Llama-3-70B on an
    RTX 4090)."""
    from kvplan.capacity import Hardware, engine_dtypes
    from kvplan.tables import build, parse_gpus

    model = load_model(name)
    kv, weights = engine_dtypes(model, engine)
    cap = capacity(model, Workload(ctx=8192, users=1), engine_name=engine, kv_dtype_name=kv, weights_dtype_name=weights,
                   hardware=Hardware(name="NVIDIA GeForce RTX 4090", memory_bytes=24 * GiB), suggest=False)
    assert cap.kv_budget_bytes < 0 and not cap.fits
    assert (cap.max_concurrent_users, cap.max_users_at_startup, cap.max_ctx_for_users) == (0, 0, 0)
    assert cap.sequence_limit is None or cap.sequence_limit >= 0
    table = build([name], [1024, 8192], gpus=parse_gpus("rtx-4090", None), engine_name=engine)
    assert [cell.max_users for row in table.rows for cell in row.users] == [0, 0]


def test_max_users_is_the_largest_that_fits():
    class Linear(KVPool):  # 3 bytes per user-token, 10 bytes fixed
        notes: list[str] = []

        def bytes_for(self, users, ctx, shared_prefix=0):
            return 10 + 3 * users * ctx

    assert max_users(Linear(), budget=10 + 3 * 7 * 5, ctx=5) == 7
    assert max_users(Linear(), budget=10 + 3 * 5 - 1, ctx=5) == 0
