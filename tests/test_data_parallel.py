"""Data-parallel attention and expert parallelism (vLLM --data-parallel-size / --enable-expert-parallel, SGLang
--enable-dp-attention --dp / --ep-size): weights per GPU, KV per DP rank, users, layouts and their one-line errors,
worked by hand from the engines' source rules (docs/engines.md, "Parallelism")."""

import json

import pytest
from conftest import GiB, assert_one_line_error, run_main

from kvplan.capacity import Hardware, Parallelism, Workload, capacity, parallelism, plan
from kvplan.errors import KvplanError
from kvplan.model import FullAttention, ModelSpec, ParamCounts
from kvplan.sources import load_model

DSV3 = "deepseek-ai/DeepSeek-V3"
H200_BYTES = 150_754_820_096  # nvidia-smi: 143,771 MiB
H200 = Hardware(name="NVIDIA H200", memory_bytes=H200_BYTES)
CTX = 32_768
LATENT_PER_TOKEN = (512 + 64) * 2 * 61  # kv_lora_rank + qk_rope_head_dim, bf16, 61 layers = 70,272 B

# DeepSeek-V3's parameter groups (its config.json, counted as `kvplan show` lists them) and their bytes: the fp8
# checkpoint quantises the linear layers (attention, dense MLP and shared experts, routed experts); embeddings,
# lm_head, norms and routers stay bf16. Every TP rank holds MLA's down-projections, its norms and the routers whole
# (vLLM 0.33.0 `models/deepseek_v2.py`: fused_qkv_a_proj with disable_tp, RMSNorm, GateLinear).
EMBEDDING = LM_HEAD = 926_679_040 * 2
ATTENTION = 10_489_954_304  # q_b, kv_b and o: 61 x (1,536 x 128 x 192 + 512 x 128 x 256 + 128 x 128 x 7,168)
ATTENTION_REPLICATED = 61 * 7_168 * (1_536 + 512 + 64)  # q_a and kv_a_proj_with_mqa: 923,467,776
MLP = 3_743_416_320  # 3 dense layers' MLPs and 58 layers' shared experts
EXPERTS = 653_908_770_816  # 58 layers x 256 routed experts
# 58 routers of 256 x 7,168 and 256 correction biases; 61 x (2 x 7,168 + 1,536 + 512) norms and the final 7,168
OTHER_REPLICATED = (58 * (256 * 7_168 + 256) + 61 * (2 * 7_168 + 1_536 + 512) + 7_168) * 2  # 214,903,808
WEIGHTS = EMBEDDING + LM_HEAD + ATTENTION + ATTENTION_REPLICATED + MLP + EXPERTS + OTHER_REPLICATED
WHOLE = ATTENTION_REPLICATED + OTHER_REPLICATED  # 1,138,371,584 B on every GPU


def dsv3(engine: str, layout: Parallelism, ctx: int = CTX, **kwargs):
    return capacity(load_model(DSV3), Workload(ctx=ctx), engine_name=engine, hardware=H200, parallel=layout,
                    **kwargs)


def test_deepseek_v3_on_8_h200_tp8_vs_dp8_ep8_vllm():
    """vLLM 0.33.0 defaults, DeepSeek-V3 (fp8 weights, bf16 latent), 32,768 tokens a user, 8 x H200.

    Both layouts: memory x 0.92, ceil = ceil(150,754,820,096 x 0.92) = 138,694,434,489 B; overhead = activations
    8,192 x 160 KiB 1,342,177,280 + non-torch 1.5 GiB (NCCL, TP or DP > 1) 1,610,612,736 + CUDA graphs 0.5 GiB
    536,870,912 = 3,489,660,928 B. MLA block: 64 tokens x 70,272 B = 4,497,408 B; a user 32,768 / 64 = 512 blocks.

    TP 8: weights per GPU = MLA's down-projections (fp8) and the norms and routers (bf16) whole,
      923,467,776 + 214,903,808 = 1,138,371,584, and the rest over 8, (672,987,229,184 - 1,138,371,584) / 8
      = 83,981,107,200: 85,119,478,784 B (79.27 GiB; an even split, 672,987,229,184 / 8 = 84,123,403,648, would be
      0.93 GiB short);
      budget = 138,694,434,489 - 85,119,478,784 - 3,489,660,928 = 50,085,294,777 B;
      blocks = 50,085,294,777 // 4,497,408 = 11,136; users = (11,136 - 1 null block) // 512 = 21.
      Every GPU holds all 21 users' latents: TP cannot split the one-row latent.
    DP 8 x TP 1, EP 8: weights per GPU = everything but the routed experts whole (a copy on every DP rank)
      672,987,229,184 - 653,908,770,816 = 19,078,458,368 + routed experts / 8 = 81,738,596,352
      = 100,817,054,720 B (93.89 GiB);
      budget = 138,694,434,489 - 100,817,054,720 - 3,489,660,928 = 34,387,718,841 B;
      blocks = 34,387,718,841 // 4,497,408 = 7,646; users per DP rank = 7,645 // 512 = 14; x 8 ranks = 112.
    """
    tp8 = dsv3("vllm", parallelism("vllm", 8, None, None))
    dp8 = dsv3("vllm", parallelism("vllm", 8, None, None, dp=8, ep=8))
    assert WEIGHTS == 672_987_229_184 and WHOLE == 1_138_371_584
    assert (tp8.tensor_parallel_size, tp8.data_parallel_size, tp8.expert_parallel_size) == (8, 1, 1)
    assert (dp8.tensor_parallel_size, dp8.data_parallel_size, dp8.expert_parallel_size) == (1, 8, 8)
    assert tp8.weights_bytes_per_gpu == WHOLE + (WEIGHTS - WHOLE) // 8 == 85_119_478_784
    assert dp8.weights_bytes_per_gpu == 100_817_054_720
    assert dp8.weights_bytes_per_gpu_experts == 81_738_596_352
    assert dp8.weights_bytes_per_gpu - dp8.weights_bytes_per_gpu_experts == WEIGHTS - EXPERTS == 19_078_458_368
    assert tp8.overhead_bytes == dp8.overhead_bytes == 3_489_660_928
    assert tp8.kv_budget_bytes == 50_085_294_777
    assert dp8.kv_budget_bytes == 34_387_718_841
    assert tp8.vllm_block_bytes == dp8.vllm_block_bytes == 64 * LATENT_PER_TOKEN == 4_497_408
    assert (tp8.vllm_num_blocks, dp8.vllm_num_blocks) == (11_136, 7_646)
    assert tp8.engine_kv_bytes_per_sequence == dp8.engine_kv_bytes_per_sequence == 512 * 4_497_408
    assert (tp8.max_concurrent_users, tp8.max_users_per_rank) == (21, 21)
    assert (dp8.max_concurrent_users, dp8.max_users_per_rank) == (112, 14)
    assert dp8.vllm_max_concurrency == pytest.approx(7_646 / 512)  # what each DP rank logs


def test_deepseek_v3_tp8_with_expert_parallelism_holds_what_tp8_holds():
    """TP 8 with --enable-expert-parallel: EP = DP x TP = 8; 32 whole experts a GPU instead of every expert's
    eighth, the same bytes, and no DP rank to replicate attention on."""
    plain = dsv3("vllm", parallelism("vllm", None, 8, None))
    ep = dsv3("vllm", parallelism("vllm", None, 8, None, expert_parallel=True))
    assert ep.expert_parallel_size == 8 and ep.data_parallel_size == 1
    assert ep.weights_bytes_per_gpu == plain.weights_bytes_per_gpu == 85_119_478_784
    assert ep.max_concurrent_users == plain.max_concurrent_users == 21


def test_deepseek_v3_sglang_dp_attention_split():
    """SGLang --tp 8 --dp 8 --enable-dp-attention --ep-size 8: attention TP 8 / 8 = 1 (`dp_attention.py`).
    Weights per GPU (`models/deepseek_v2.py`): attention whole (attention TP 1; MLA's down-projections, norms and
    routers whole at any TP), the embedding whole (`VocabParallelEmbedding(enable_tp=not
    is_dp_attention_enabled())`), lm_head, dense MLP and shared experts and routed experts over all 8:
        10,489,954,304 + 923,467,776 + 214,903,808 + 1,853,358,080
        + (1,853,358,080 + 3,743,416,320 + 653,908,770,816) / 8 = 95,919,877,120 B.
    mem_fraction_static (H200, 143,771 MiB; chunked_prefill_size 8,192 and cuda_graph_max_bs 512 at tp 8):
        reserved = 512 + 1.5 x 8,192 + 2 x 512 + 8 / 8 x 1,024 + 512 x 8 x 3 + 512 x 8 x 1.5 (DP attention,
        cuda_graph_max_bs > 300) = 33,280 MiB; round((143,771 - 33,280) / 143,771, 3) = 0.769.
    budget = floor(150,754,820,096 x 0.769) - 95,919,877,120 - 0.5 GiB = 19,473,708,621 B;
    a user 32,768 x 70,272 = 2,302,672,896 B; 8 a DP rank, 64 in all."""
    layout = parallelism("sglang", None, 8, None, dp=8, ep=8)
    assert layout == Parallelism(tp=1, dp=8, ep=8)
    cap = dsv3("sglang", layout)
    assert cap.weights_bytes_per_gpu == ATTENTION + WHOLE + EMBEDDING + (LM_HEAD + MLP + EXPERTS) // 8
    assert cap.weights_bytes_per_gpu == 95_919_877_120
    assert cap.memory_fraction == 0.769
    assert cap.kv_budget_bytes == H200_BYTES * 769 // 1000 - 95_919_877_120 - GiB // 2 == 19_473_708_621
    assert cap.engine_kv_bytes_per_sequence == CTX * LATENT_PER_TOKEN == 2_302_672_896
    assert (cap.max_users_per_rank, cap.max_concurrent_users) == (8, 64)


def test_sglang_dp_rank_pool_holds_the_whole_latent_as_sglang_logs():
    """Each DP-attention rank of SGLang serving DeepSeek-V3 logs "KV Cache is allocated. #tokens: 161488, KV size:
    10.57 GB" (sgl-project/sglang issue #6017, DP0..DP7 TP0..TP7, bf16 cache; its GB are GiB): 161,488 tokens x
    70,272 B of latent = 11,348,084,736 B = 10.57 GiB, on one rank of attention TP 1."""
    cap = dsv3("sglang", parallelism("sglang", None, 8, None, dp=8, ep=8), ctx=161_488, kv_budget=11 * GiB)
    assert cap.engine_kv_bytes_per_sequence == 161_488 * LATENT_PER_TOKEN == 11_348_084_736
    assert round(cap.engine_kv_bytes_per_sequence / GiB, 2) == 10.57


def test_vllm_uneven_expert_parallelism_puts_the_extra_experts_on_the_first_ranks():
    """Qwen3-30B-A3B (bf16, 128 routed experts, no shared experts) on 3 GPUs, vLLM --data-parallel-size 3: without
    expert parallelism each expert is sliced 3 ways, experts / 3 a GPU; with it the first 128 % 3 = 2 ranks hold
    128 // 3 + 1 = 43 whole experts (`determine_expert_map`): 43 / 128 of the experts' 57,982,058,496 B
    = 19,478,347,776 B. Everything else (embedding, lm_head, attention, norms and routers) is whole on each rank:
    (311,164,928 x 2 + 905,969,664 + 12,793,856) x 2 = 3,082,186,752 B."""
    model = load_model("Qwen/Qwen3-30B-A3B")
    experts = model.params.experts * 2
    assert experts == 57_982_058_496 and model.widths.experts == 128 and model.params.mlp == 0
    sliced = capacity(model, Workload(ctx=8192), hardware=H200, parallel=parallelism("vllm", None, None, None, dp=3))
    whole = capacity(model, Workload(ctx=8192), hardware=H200,
                     parallel=parallelism("vllm", None, None, None, dp=3, expert_parallel=True))
    assert sliced.expert_parallel_size == 1 and whole.expert_parallel_size == 3
    assert sliced.weights_bytes_per_gpu_experts == experts // 3 == 19_327_352_832
    assert whole.weights_bytes_per_gpu_experts == experts // 128 * 43 == 19_478_347_776
    assert whole.weights_bytes_per_gpu == 19_478_347_776 + 3_082_186_752


def test_a_model_with_no_shared_experts_may_mix_tp_dp_and_ep_under_vllm():
    """vLLM's sequence-parallel MoE (EP with TP > 1 and DP > 1) keeps shared experts whole on every GPU; Qwen3-30B-A3B
    has none (and no dense MLP), so every group splits as usual: experts over DP 2 x TP 2 = 4."""
    model = load_model("Qwen/Qwen3-30B-A3B")
    cap = capacity(model, Workload(ctx=8192), hardware=H200,
                   parallel=parallelism("vllm", 4, 2, None, dp=2, expert_parallel=True))
    assert (cap.tensor_parallel_size, cap.data_parallel_size, cap.expert_parallel_size) == (2, 2, 4)
    assert cap.weights_bytes_per_gpu_experts == model.params.experts * 2 // 4


def test_vllm_shared_experts_under_sequence_parallel_moe_are_refused():
    with pytest.raises(KvplanError, match="shared experts whole on every GPU"):
        dsv3("vllm", parallelism("vllm", 8, 2, None, dp=4, expert_parallel=True))


def test_a_dense_model_under_dp_keeps_its_weights_per_rank():
    """Llama-3-8B has no experts: DP ranks of TP 1 each hold all its weights, and users add up like replicas."""
    model = load_model("meta-llama/Llama-3-8B")
    cap = capacity(model, Workload(ctx=8192), hardware=H200, parallel=parallelism("vllm", None, None, None, dp=4))
    assert cap.weights_bytes_per_gpu == 8_030_261_248 * 2 and cap.weights_bytes_per_gpu_experts == 0
    assert cap.max_concurrent_users == 4 * cap.max_users_per_rank


def test_unknown_expert_count_refuses_expert_parallelism():
    spec = ModelSpec(name="moe-spec", architecture="spec", num_layers=2, num_attention_heads=8,
                     caches=tuple(FullAttention(layer=i, kv_heads=8, head_dim=64, head_dim_v=64) for i in range(2)),
                     dtype="bf16", params=ParamCounts(embedding=0, lm_head=0, attention=10**6, mlp=0, experts=10**8,
                                                      active_experts=10**7, other=0))
    with pytest.raises(KvplanError, match="how many routed experts"):
        capacity(spec, Workload(ctx=1024), kv_budget=GiB, parallel=Parallelism(dp=2, ep=2))


def test_vllm_tp_is_one_dp_ranks():
    """vLLM: --tp is one DP rank's TP, the GPUs DP x TP x PP; --enable-expert-parallel means EP = DP x TP."""
    assert parallelism("vllm", None, None, None, dp=8, expert_parallel=True) == Parallelism(tp=1, dp=8, ep=8)
    assert parallelism("vllm", None, 2, None, dp=4) == Parallelism(tp=2, dp=4)
    assert parallelism("vllm", 16, None, None, dp=8) == Parallelism(tp=2, dp=8)
    assert parallelism("vllm", 16, None, 2, dp=4, ep=8) == Parallelism(tp=2, pp=2, dp=4, ep=8)


def test_sglang_tp_counts_the_dp_ranks():
    assert parallelism("sglang", 8, None, None, dp=8) == Parallelism(tp=1, dp=8)
    assert parallelism("sglang", None, 8, None, dp=2, expert_parallel=True) == Parallelism(tp=4, dp=2, ep=8)
    assert parallelism("sglang", None, 8, None, ep=4) == Parallelism(tp=8, ep=4)  # EP 4, MoE TP 2
    assert parallelism("vllm", None, None, None, dp=8).gpus == parallelism("sglang", None, 8, None, dp=8).gpus == 8


# ------------------------------------------------------------------------------------------------------ the CLI


def test_cli_dp8_ep8_json_and_text(monkeypatch, capsys):
    args = ("estimate", "--model", DSV3, "--ctx", "32k", "--gpu", "8xh200", "--dp", "8", "--ep", "8")
    code, out, err = run_main(monkeypatch, capsys, *args, "--json")
    assert code == 0, err
    data = json.loads(out)
    assert (data["gpus"], data["tensor_parallel_size"], data["data_parallel_size"], data["expert_parallel_size"],
            data["data_parallel_replicas"]) == (8, 1, 8, 8, 1)
    assert (data["weights_bytes_per_gpu"], data["weights_bytes_per_gpu_experts"]) == (100_817_054_720,
                                                                                     81_738_596_352)
    assert (data["max_concurrent_users"], data["max_users_per_rank"], data["vllm_num_blocks"]) == (112, 14, 7_646)
    code, text, err = run_main(monkeypatch, capsys, *args)
    assert code == 0, err
    flat = " ".join(text.split())
    for fragment in ("DP 8 x TP 1, PP 1, EP 8", "routed experts (over 8 GPUs, EP 8) 76.12 GiB",
                     "attention, dense, embeddings 17.77 GiB", "max users of one DP rank (x 8) 14",
                     "max users at 32,768 tokens 112", "Each of the 8 DP ranks would log"):
        assert fragment in flat, fragment
    code, out, err = run_main(monkeypatch, capsys, *args[:-4], "--dp", "8", "--enable-expert-parallel", "--json")
    assert code == 0 and json.loads(out)["max_concurrent_users"] == 112


def test_cli_sglang_names_its_attention_tp(monkeypatch, capsys):
    code, out, err = run_main(monkeypatch, capsys, "estimate", "--model", DSV3, "--ctx", "32k", "--gpu", "h200",
                              "--engine", "sglang", "--tp", "8", "--dp", "8", "--ep-size", "8")
    assert code == 0, err
    assert "--tp 8 --dp 8 --enable-dp-attention: attention TP 8 / 8 = 1" in " ".join(out.split())


@pytest.mark.parametrize(("args", "fragments"), [
    (("--model", "meta-llama/Llama-3-8B", "--gpu", "h100", "--ep", "8"), ("--ep 8", "no routed experts")),
    (("--model", "meta-llama/Llama-3-8B", "--gpu", "h100", "--tp", "2", "--enable-expert-parallel"),
     ("no routed experts",)),
    (("--model", DSV3, "--gpu", "8xh200", "--dp", "8", "--ep", "4"), ("--ep 4", "DP x TP = 8")),
    (("--model", DSV3, "--gpu", "h200", "--gpus", "16", "--dp", "8", "--tp", "1"), ("--gpus 16", "= 8")),
    (("--model", DSV3, "--gpu", "h200", "--engine", "sglang", "--tp", "8", "--dp", "3"), ("--dp 3", "--tp 8")),
    (("--model", DSV3, "--gpu", "h200", "--engine", "sglang", "--tp", "8", "--ep", "3"), ("--ep 3", "--tp 8")),
    (("--model", "mistralai/Mixtral-8x7B-v0.1", "--gpu", "h200", "--engine", "sglang", "--tp", "16", "--ep", "16"),
     ("--ep 16", "8 routed experts")),
    (("--model", DSV3, "--gpu", "h200", "--dp", "2", "--ep", "4", "--enable-expert-parallel"), ("--ep", "4")),
    (("--model", DSV3, "--gpu", "h200", "--dp", "0"), ("--dp",)),
    (("--model", DSV3, "--gpu", "h200", "--dp", "8", "--engine", "llama.cpp"), ("--dp", "llama.cpp")),
    (("--model", DSV3, "--gpu", "h200", "--ep", "8", "--engine", "transformers"), ("--ep", "transformers")),
    (("--model", DSV3, "--gpu", "h200", "--enable-expert-parallel", "--engine", "tensorrt-llm"),
     ("--enable-expert-parallel", "TensorRT-LLM")),
])
def test_cli_refuses_bad_layouts_in_one_line(monkeypatch, capsys, args, fragments):
    code, _, err = run_main(monkeypatch, capsys, "estimate", "--ctx", "8k", *args)
    assert_one_line_error(code, err, *fragments)


# ---------------------------------------------------------------------------------------------------------- plan


def test_plan_finds_dp_attention_for_an_mla_moe_model_and_says_why(monkeypatch, capsys):
    """64 users of DeepSeek-V3 at 32K on H200s: TP 8 holds 21 (above), so 8 GPUs as TP 8 cannot, while DP 8 x EP 8
    holds 112: the plan's 8-GPU fp8-weights, bf16-KV row is that layout, and the plan says why DP wins."""
    result = plan(load_model(DSV3), Workload(ctx=CTX, users=64), H200)
    row = next(r for r in result.rows if r.gpus == 8 and (r.weights_dtype, r.kv_dtype) == ("fp8", "bf16"))
    assert (row.tensor_parallel_size, row.data_parallel_size, row.expert_parallel_size) == (1, 8, 8)
    assert row.max_concurrent_users == 112 and row.weights_bytes_per_gpu == 100_817_054_720
    assert len(result.notes) == 1 and "TP cannot split its latent" in result.notes[0]
    code, out, err = run_main(monkeypatch, capsys, "plan", "--model", DSV3, "--ctx", "32k", "--users", "64",
                              "--gpu", "h200")
    assert code == 0, err
    assert "DP 8 x TP 1, EP 8" in out and "note: DP attention holds more users of an MLA model" in out


def test_plan_of_a_dense_model_has_no_dp_layouts():
    result = plan(load_model("meta-llama/Llama-3-70B"), Workload(ctx=8192, users=16), H200)
    assert result.rows and all(r.data_parallel_size == 1 and r.expert_parallel_size == 1 for r in result.rows)
    assert result.notes == []
