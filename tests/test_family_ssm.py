"""Mamba, Mamba-2 and their hybrids (Nemotron-H, Granite 4.0-H, Bamba, Falcon-H1, Zamba, Zamba2), ZAYA and the
Gated DeltaNet hybrids (Qwen3.5, OLMo Hybrid): layouts, vLLM's state pages under its own formulas, tensor
parallelism, the library's genuine configs, and the one-line refusals of inconsistent fields. Every expected
number is hand arithmetic from the config and vLLM's source (`mamba_utils.py`, `platforms/interface.py`
`_align_hybrid_block_size`, `kv_cache_interface.py` MambaSpec), a published figure, or a transformers build."""

import json

import pytest
from conftest import GiB, MiB, assert_one_line_error, run_main

from kvplan import engines
from kvplan.capacity import Hardware, Parallelism, Workload, capacity, check_parallel, gpu_layers, valid_tp
from kvplan.dtypes import kv_dtype
from kvplan.engines import EngineOptions
from kvplan.errors import KvplanError
from kvplan.memory import estimate
from kvplan.sources import load_model
from kvplan.sources.hf_config import model_from_config

H100 = Hardware(name="NVIDIA H100 SXM", memory_bytes=81_559 * MiB)
NANO = "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"
BF16, FP32 = 2, 4

# Mamba-Codestral-7B's shape (Mamba2ForCausalLM): 64 layers, 128 heads of 64, d_state 128, 8 groups, kernel 4.
MAMBA2 = {"model_type": "mamba2", "num_hidden_layers": 64, "hidden_size": 4096, "num_heads": 128, "head_dim": 64,
          "state_size": 128, "n_groups": 8, "conv_kernel": 4, "expand": 2, "vocab_size": 32768,
          "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
# A Granite 4.0-H-like hybrid: Mamba-2 with a single B/C group, attention on every fourth layer.
GRANITE = {"model_type": "granitemoehybrid", "num_hidden_layers": 8, "hidden_size": 1536, "num_attention_heads": 12,
           "num_key_value_heads": 4, "layer_types": ["mamba", "mamba", "mamba", "attention"] * 2,
           "mamba_n_heads": 48, "mamba_d_head": 64, "mamba_d_state": 128, "mamba_n_groups": 1, "mamba_d_conv": 4,
           "mamba_expand": 2, "num_local_experts": 0, "num_experts_per_tok": 0, "intermediate_size": 4096,
           "shared_intermediate_size": 4096, "vocab_size": 100352, "torch_dtype": "bfloat16"}


def read(config: dict):
    return model_from_config(config, "test/model", "test")


def vllm_pool(model, tp: int = 1, kv: str = "bf16", version: str | None = None):
    engine = engines.engine("vllm", EngineOptions(version=version), tp=tp)
    (layers,) = gpu_layers(engine.cached_layers(model), [model.num_layers], tp)
    return engine.pool(layers, model, kv_dtype(kv))


# ------------------------------------------------------------------------------------------ layouts and heads


def test_attention_free_models_have_no_attention_heads():
    # Mamba-2's num_heads are its 128 SSM heads, not attention heads: the model has none.
    model = read(MAMBA2)
    assert model.num_attention_heads == 0
    assert {c.kind for c in model.caches} == {"recurrent"}
    assert model.caches[0].heads == 128 and model.caches[0].groups == 8


def test_falcon_h1_layers_hold_attention_and_mamba2():
    config = {"model_type": "falcon_h1", "num_hidden_layers": 2, "hidden_size": 1024, "num_attention_heads": 8,
              "num_key_value_heads": 2, "head_dim": 64, "mamba_d_ssm": 1536, "mamba_n_heads": 24,
              "mamba_d_head": 64, "mamba_d_state": 256, "mamba_n_groups": 1, "mamba_d_conv": 4,
              "intermediate_size": 2048, "vocab_size": 1000, "torch_dtype": "bfloat16"}
    model = read(config)
    assert [(c.layer, c.kind) for c in model.caches] == [(0, "full"), (0, "recurrent"), (1, "full"), (1, "recurrent")]
    # d_inner from mamba_d_ssm (1,536, not expand x hidden 2,048): conv (1536 + 2 x 256) x 3, ssm 24 x 64 x 256
    assert model.caches[1].conv_elements == (1536 + 2 * 256) * 3
    assert model.caches[1].ssm_elements == 24 * 64 * 256


def test_nemotron_h_current_form_equals_the_pattern_form():
    # transformers 5 writes layers_block_type and drops num_hidden_layers; older configs give the pattern
    nano = json.loads(_library_text("nvidia__NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.json"))
    names = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
    current = {k: v for k, v in nano.items() if k not in ("hybrid_override_pattern", "num_hidden_layers")}
    current["layers_block_type"] = [names[c] for c in nano["hybrid_override_pattern"]]
    old, new = read(nano), read(current)
    assert new.num_layers == old.num_layers == 52
    assert new.caches == old.caches and new.params == old.params


def _library_text(name: str) -> str:
    from kvplan.sources.library import library_dir

    return (library_dir() / name).read_text(encoding="utf-8")


# ------------------------------------------------------------------------------------------ vLLM


def test_vllm_nemotron_3_nano_at_8k_on_an_h100():
    # 23 Mamba-2 layers (64 heads x 64 = d_inner 4,096, 8 groups, d_state 128, kernel 4), 6 attention layers
    # (2 KV heads x 128), 23 MoE layers. vLLM mamba2_state_shape: conv (3, 4,096 + 2 x 8 x 128) bf16 = 36,864 B,
    # ssm (64, 64, 128) in fp32 (the config's mamba_ssm_cache_dtype, which NemotronHForCausalLMConfig adopts)
    # = 2,097,152 B: page 2,134,016 B. Attention 2 x 2 x 128 x 2 = 1,024 B per token:
    # block = 16 x cdiv(2,134,016, 16 x 1,024) = 2,096 tokens, page 2,146,304 B (the Mamba page padded to it).
    # Groups of 6 layers: 1 attention group, cdiv(23, 6) = 4 Mamba groups (1 padding layer); block = 6 pages.
    # At L = 8,192 under 0.33.0: attention cdiv(8,192, 2,096) = 4 blocks; each Mamba group 3 pages in align mode
    # (MambaSpec.max_memory_usage_bytes: 2 + num_prefill_checkpoint_blocks, 1 for MambaMixer2 from 0.32.0):
    # 4 + 4 x 3 = 16 blocks per request.
    model = load_model(NANO)
    state = model.caches[0]
    assert state.state_bytes(kv_dtype("bf16")) == (4096 + 2 * 8 * 128) * 3 * BF16 + 64 * 64 * 128 * FP32
    pool = vllm_pool(model)
    assert {g.kind: g.block_size for g in pool.groups}["full"] == 2096
    assert pool.block_bytes == 6 * 2096 * 1024 == 12_877_824
    assert pool.blocks_per_request(8192) == 4 + 4 * 3
    cap = capacity(model, Workload(ctx=8192), hardware=H100)
    assert cap.vllm_block_bytes == 12_877_824
    assert cap.vllm_blocks_per_sequence == 16
    assert cap.engine_kv_bytes_per_sequence == 16 * 12_877_824
    assert any("1 padding layers" in note for note in cap.notes)
    # A 10 GiB budget: 10,737,418,240 // 12,877,824 = 833 blocks, one the null block: (833 - 1) // 16 = 52 users at
    # start-up; in steady decode each Mamba group holds 2 pages, its prefill checkpoint freed: (833 - 1) // 12 = 69
    budget = capacity(model, Workload(ctx=8192), kv_budget=10 * GiB)
    assert budget.vllm_num_blocks == 833 and budget.max_users_at_startup == 52
    assert budget.vllm_kv_bytes_per_sequence_decode == 12 * 12_877_824 and budget.max_concurrent_users == 69


@pytest.mark.parametrize(("version", "pages"), [("0.33.0", 3), ("0.32.0", 3), ("0.31.0", 2), ("0.28.0", 2),
                                                ("0.27.1", 1), ("0.19.0", 1)])
def test_vllm_mamba2_state_pages_per_request_by_release(version, pages):
    """Pages a Mamba-2 layer group reserves per request, Nemotron 3 Nano at 8k (4 attention blocks + 4 Mamba
    groups): before 0.28.0 hybrids run without prefix caching (`_set_default_chunked_prefill_and_prefix_caching_args`
    keeps it opt-in for them: 0.26-0.27; `is_prefix_caching_supported` is False for hybrids before 0.26), so
    mamba_cache_mode is "none" and a state takes 1 page; from 0.28.0 prefix caching is on and "align" mode holds 2
    (the running state and the last block-aligned one); from 0.32.0 MambaMixer2 adds a prefill checkpoint page."""
    pool = vllm_pool(load_model(NANO), version=version)
    assert pool.blocks_per_request(8192) == 4 + 4 * pages


# Gated DeltaNet on FlashInfer's prefill kernel (vLLM 0.33.0, model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py):
# `_resolve_gdn_prefill_backend` picks FlashInfer on compute capability 9.0, and on 10.x and 12.x with
# linear_key_head_dim 128 (CUDA 13 builds); `QwenGatedDeltaNetAttention` then declares a prefill checkpoint alignment
# of 64 (`FLASHINFER_GDN_CHECKPOINT_ALIGNMENT`) and, in align mode, num_prefill_checkpoint_blocks = 1, so
# `MambaSpec.max_memory_usage_bytes` is 3 pages and `_align_hybrid_block_size` aligns the attention block to
# lcm(16, 64) = 64 tokens. Elsewhere (A100, L40S, ROCm, --gdn-prefill-backend triton, vLLM 0.32.0): 2 pages,
# align 16.


def gdn_capacity(name: str, gpu: str, ctx: int = 32_768, tp: int = 1, budget: int = 20 * GiB, **options):
    return capacity(load_model(name), Workload(ctx=ctx), hardware=Hardware(name=gpu, memory_bytes=81_559 * MiB),
                    parallel=Parallelism(tp=tp), kv_budget=budget, options=EngineOptions(**options))


def test_vllm_qwen3_5_27b_on_an_h100_at_32k_with_flashinfer_checkpoints():
    """Qwen3.5-27B: 16 attention layers (4 KV heads x 256, bf16: 4 x 256 x 2 x 2 = 4,096 B a token) and 48 Gated
    DeltaNet layers: conv (2 x 16 x 128 + 48 x 128) x 3 x 2 B = 61,440 B, SSM 48 x 128 x 128 x 4 B (mamba_ssm_dtype
    float32) = 3,145,728 B: state 3,207,168 B.
    H100 (FlashInfer): block = 64 x cdiv(3,207,168, 64 x 4,096) = 64 x 13 = 832 tokens, page 832 x 4,096 =
    3,407,872 B; groups of 16 layers (1 attention, 3 Gated DeltaNet), a block 16 pages = 54,525,952 B; a request at
    32k: cdiv(32,768, 832) = 40 + 3 groups x 3 pages = 49 blocks. 20 GiB: 21,474,836,480 // 54,525,952 = 393 blocks,
    concurrency 393 / 49 = 8.02x, logged tokens int(8.0204 x 32,768) = 262,812.
    Triton (--gdn-prefill-backend triton): block 16 x cdiv(3,207,168, 16 x 4,096) = 784, a block 16 x 784 x 4,096 =
    51,380,224 B, 42 + 3 x 2 = 48 blocks a request, 417 blocks, 8.69x, int(8.6875 x 32,768) = 284,672 tokens."""
    flash = gdn_capacity("Qwen/Qwen3.5-27B", "NVIDIA H100 SXM")
    assert (flash.vllm_block_bytes, flash.vllm_blocks_per_sequence) == (54_525_952, 49)
    assert (flash.vllm_num_blocks, flash.vllm_kv_cache_tokens) == (393, 262_812)
    assert flash.vllm_max_concurrency == 393 / 49
    assert "attention block size raised to 832 tokens so a page holds a recurrent state" in flash.notes
    assert any("prefill checkpoint page per state" in note and "9.0" in note for note in flash.notes)
    triton = gdn_capacity("Qwen/Qwen3.5-27B", "NVIDIA H100 SXM", gdn_prefill_backend="triton")
    assert (triton.vllm_block_bytes, triton.vllm_blocks_per_sequence) == (51_380_224, 48)
    assert (triton.vllm_num_blocks, triton.vllm_kv_cache_tokens, triton.vllm_max_concurrency) == (417, 284_672, 8.6875)


def test_vllm_qwen3_next_80b_on_four_h100s_at_32k_with_flashinfer_checkpoints():
    """Qwen3-Next-80B-A3B at TP 4 (48 layers, every 4th attention: 12 attention, 36 Gated DeltaNet). Per GPU:
    attention 2 KV heads replicated to 1 (1 x 256 x 2 x 2 = 1,024 B a token); Gated DeltaNet 16 / 4 = 4 key heads and
    32 / 4 = 8 value heads of 128: conv (2 x 4 x 128 + 8 x 128) x 3 x 2 B = 12,288 B, SSM 8 x 128 x 128 x 2 B (bf16)
    = 262,144 B: state 274,432 B.
    H100 (FlashInfer): block 64 x cdiv(274,432, 64 x 1,024) = 320 tokens, groups of 12 layers (1 attention, 3 Gated
    DeltaNet), a block 12 x 320 x 1,024 = 3,932,160 B; at 32k cdiv(32,768, 320) = 103 + 3 x 3 = 112 blocks a
    request. 40 GiB: 42,949,672,960 // 3,932,160 = 10,922 blocks, 10,922 / 112 = 97.52x, int(97.518 x 32,768) =
    3,195,465 tokens.
    Triton: block 16 x cdiv(274,432, 16 x 1,024) = 272, 12 x 272 x 1,024 = 3,342,336 B, 121 + 3 x 2 = 127 blocks,
    12,850 blocks, 101.18x, 3,315,502 tokens."""
    flash = gdn_capacity("Qwen/Qwen3-Next-80B-A3B-Thinking", "NVIDIA H100 SXM", tp=4, budget=40 * GiB)
    assert (flash.vllm_block_bytes, flash.vllm_blocks_per_sequence) == (3_932_160, 112)
    assert (flash.vllm_num_blocks, flash.vllm_kv_cache_tokens) == (10_922, 3_195_465)
    assert flash.vllm_max_concurrency == 10_922 / 112
    triton = gdn_capacity("Qwen/Qwen3-Next-80B-A3B-Thinking", "NVIDIA H100 SXM", tp=4, budget=40 * GiB,
                          gdn_prefill_backend="triton")
    assert (triton.vllm_block_bytes, triton.vllm_blocks_per_sequence) == (3_342_336, 127)
    assert (triton.vllm_num_blocks, triton.vllm_kv_cache_tokens) == (12_850, 3_315_502)


@pytest.mark.parametrize(("gpu", "pages"), [
    ("NVIDIA H100 SXM", 3), ("NVIDIA H200", 3), ("NVIDIA H20", 3),  # compute capability 9.0
    ("NVIDIA B200", 3), ("NVIDIA GeForce RTX 5090", 3),  # 10.0 and 12.0, key head size 128
    ("NVIDIA A100 80GB SXM", 2), ("NVIDIA L40S", 2), ("NVIDIA GeForce RTX 4090", 2),  # 8.0, 8.9: Triton
    ("AMD Instinct MI300X", 2),  # ROCm: Triton or AITER FlyDSL, no checkpoints
])
def test_vllm_gated_deltanet_state_pages_by_gpu(gpu, pages):
    """Qwen3.5-27B's and Qwen3.6-35B-A3B's Gated DeltaNet state pages per request by GPU, vLLM 0.33.0."""
    for name in ("Qwen/Qwen3.5-27B", "Qwen/Qwen3.6-35B-A3B"):
        engine = engines.engine("vllm", EngineOptions(), gpu, 81_559 * MiB)
        model = load_model(name)
        (layers,) = gpu_layers(engine.cached_layers(model), [model.num_layers], 1)
        assert engine.pool(layers, model, kv_dtype("bf16")).state_pages == pages


@pytest.mark.parametrize("options", [{"gdn_prefill_backend": "triton"}, {"gdn_prefill_backend": "cutedsl"},
                                     {"version": "0.32.0"}])
def test_vllm_gated_deltanet_without_flashinfer_keeps_two_pages(options):
    """`--gdn-prefill-backend triton` (or cutedsl, vLLM's own CuTe kernel) keeps FlashInfer off; vLLM 0.32.0's Gated
    DeltaNet exported no prefill checkpoints on any GPU (its `QwenGatedDeltaNetAttention` declares none)."""
    cap = gdn_capacity("Qwen/Qwen3.5-27B", "NVIDIA H100 SXM", **options)
    assert cap.vllm_blocks_per_sequence == 48


def test_vllm_blackwell_flashinfer_takes_key_heads_of_128_only():
    """On 10.x and 12.x FlashInfer's Gated DeltaNet kernel takes linear_key_head_dim 128 only; 9.0 any. Qwen3.5-27B
    with key heads of 64: conv (2 x 16 x 64 + 48 x 128) x 3 x 2 = 49,152 B, SSM 48 x 128 x 64 x 4 = 1,572,864 B."""
    config = json.loads(_library_text("Qwen__Qwen3.5-27B.json"))
    config["text_config"]["linear_key_head_dim"] = 64
    model = model_from_config(config, "test/narrow-keys", "test")
    assert model.caches[0].state_size == 64
    for gpu, pages in (("NVIDIA B200", 2), ("NVIDIA GeForce RTX 5090", 2), ("NVIDIA H100 SXM", 3)):
        engine = engines.engine("vllm", EngineOptions(), gpu, 81_559 * MiB)
        (layers,) = gpu_layers(engine.cached_layers(model), [model.num_layers], 1)
        assert engine.pool(layers, model, kv_dtype("bf16")).state_pages == pages


def test_vllm_with_no_gpu_named_assumes_flashinfer_and_says_so():
    """--kv-budget alone: the Hopper/Blackwell variant (3 pages, 64-token alignment), and a note naming it."""
    cap = capacity(load_model("Qwen/Qwen3.5-27B"), Workload(ctx=32_768), kv_budget=20 * GiB)
    assert cap.vllm_blocks_per_sequence == 49
    assert any(note.startswith("no GPU named: assumed") and "--gdn-prefill-backend triton" in note
               for note in cap.notes)


def test_vllm_other_recurrent_layers_take_no_gdn_checkpoint():
    """Kimi Linear's KDA (`KimiGatedDeltaNetAttention`, models/kimi_k3) declares no prefill checkpoint on an H100:
    its 2 pages stay; Nemotron 3 Nano's Mamba-2 keeps its own 3 (test above) whatever the GPU's GDN kernel."""
    model = load_model("moonshotai/Kimi-Linear-48B-A3B-Instruct")
    engine = engines.engine("vllm", EngineOptions(), "NVIDIA H100 SXM", 81_559 * MiB)
    (layers,) = gpu_layers(engine.cached_layers(model), [model.num_layers], 1)
    assert engine.pool(layers, model, kv_dtype("bf16")).state_pages == 2
    assert vllm_pool(load_model(NANO), kv="bf16").state_pages == 3


def test_gdn_prefill_backend_flag(monkeypatch, capsys):
    """vLLM's choices on CUDA; another value, or the flag under another engine, is one line and exit 2."""
    code, out, _ = run_main(monkeypatch, capsys, "estimate", "-m", "Qwen/Qwen3.5-27B", "--ctx", "32k", "--gpu",
                            "h100", "--gdn-prefill-backend", "triton", "--json")
    assert code == 0 and json.loads(out)["vllm_blocks_per_sequence"] == 48
    code, _, err = run_main(monkeypatch, capsys, "estimate", "-m", "Qwen/Qwen3.5-27B", "--ctx", "32k", "--gpu",
                            "h100", "--gdn-prefill-backend", "fla")
    assert_one_line_error(code, err, "--gdn-prefill-backend", "fla")
    code, _, err = run_main(monkeypatch, capsys, "estimate", "-m", "Qwen/Qwen3.5-27B", "--ctx", "32k", "--gpu",
                            "h100", "--engine", "sglang", "--gdn-prefill-backend", "triton")
    assert_one_line_error(code, err, "--gdn-prefill-backend", "sglang")


def test_vllm_nemotron_3_nano_tp2_splits_heads_and_groups():
    # TP 2: 8 groups split evenly (no extra group), 32 SSM heads per GPU; attention 1 KV head (512 B per token).
    # conv (4,096 + 2,048) / 2 x 3 bf16 = 18,432 B; ssm 32 x 64 x 128 fp32 = 1,048,576 B; page 1,067,008 B;
    # block = 16 x cdiv(1,067,008, 16 x 512) = 2,096 tokens, page 2,096 x 512 = 1,073,152 B, 6 pages a block.
    pool = vllm_pool(load_model(NANO), tp=2)
    assert {g.kind: g.block_size for g in pool.groups}["full"] == 2096
    assert pool.block_bytes == 6 * 2096 * 512


def test_vllm_user_block_size_sets_the_hybrid_alignment():
    # --block-size 32: vLLM aligns in multiples of max(16, 32) = 32: 32 x cdiv(2,134,016, 32 x 1,024) = 2,112
    model = load_model(NANO)
    engine = engines.engine("vllm", EngineOptions(block_size=32))
    (layers,) = gpu_layers(engine.cached_layers(model), [model.num_layers], 1)
    pool = engine.pool(layers, model, kv_dtype("bf16"))
    assert {g.kind: g.block_size for g in pool.groups}["full"] == 2112


def test_vllm_attention_free_model_holds_one_state_page_per_request():
    # Mamba-2 (Mamba-Codestral-7B's shape), bf16: conv (8,192 + 2 x 8 x 128) x 3 = 30,720 elements = 61,440 B,
    # ssm 128 x 64 x 128 = 1,048,576 elements = 2,097,152 B: page 2,158,592 B. All 64 layers one group, a block is
    # a page of each: 138,149,888 B. No attention, so no prefix caching (is_prefix_caching_supported) and
    # mamba_cache_mode "none": one page per request, whatever the context.
    model = read(MAMBA2)
    pool = vllm_pool(model)
    assert pool.block_bytes == 64 * (30_720 * BF16 + 1_048_576 * BF16) == 138_149_888
    assert pool.blocks_per_request(8192) == pool.blocks_per_request(1_000_000) == 1
    cap = capacity(model, Workload(ctx=8192), kv_budget=10 * GiB)
    # 10 GiB // 138,149,888 = 77 blocks; one is the null block: 76 users
    assert cap.vllm_num_blocks == 77 and cap.max_concurrent_users == 76


def test_vllm_replicates_a_single_bc_group_under_tp():
    # Granite-like Mamba-2, n_groups 1, TP 2: vLLM extends to tp = 2 groups (extra_groups_for_head_shards), so each
    # GPU's conv holds (3,072 + 2 x 2 x 128) / 2 = 1,792 channels x 3, not (3,072 + 2 x 128) / 2 = 1,664.
    # ssm: 48 / 2 heads x 64 x 128 = 196,608. Attention: 4 / 2 KV heads x 128 x 2 x 2 B = 1,024 B per token.
    model = read(GRANITE)
    (layers,) = gpu_layers(model.caches, [model.num_layers], 2)
    state = next(c for c, _ in layers if c.kind == "recurrent")
    assert state.conv_elements == 1792 * 3 and state.ssm_elements == 24 * 64 * 128
    page = 1792 * 3 * BF16 + 24 * 64 * 128 * BF16  # 403,968 B
    pool = vllm_pool(model, tp=2)
    assert {g.kind: g.block_size for g in pool.groups}["full"] == 16 * -(-page // (16 * 1024)) == 400


def test_vllm_ssm_dtype_only_where_vllm_reads_it_from_the_config():
    # vLLM adopts a config's SSM dtype for Nemotron-H and Qwen3.5 only; for Granite it keeps "auto", the model
    # dtype. transformers keeps every SSM state in fp32 (its scans return fp32).
    model = read(dict(GRANITE, mamba_ssm_cache_dtype="float32"))
    state = model.caches[0]
    assert state.ssm_dtype == "fp32"
    vllm_state = engines.engine("vllm", EngineOptions()).cached_layers(model)[0]
    assert vllm_state.state_bytes(kv_dtype("bf16")) == (3072 + 2 * 128) * 3 * BF16 + 48 * 64 * 128 * BF16
    nano = load_model(NANO)
    assert engines.engine("vllm", EngineOptions()).cached_layers(nano)[0].ssm_dtype == "fp32"
    qwen = load_model("Qwen/Qwen3.5-27B")  # mamba_ssm_dtype float32
    gdn = next(c for c in engines.engine("vllm", EngineOptions()).cached_layers(qwen) if c.kind == "recurrent")
    # Gated DeltaNet: conv (2 x 16 x 128 + 48 x 128) x 3 bf16, state 48 x 128 x 128 fp32
    assert gdn.state_bytes(kv_dtype("bf16")) == (2 * 16 * 128 + 48 * 128) * 3 * BF16 + 48 * 128 * 128 * FP32


@pytest.mark.parametrize(("version", "ssm_bytes"), [("0.19.1", 2), ("0.20.0", 4), (None, 4)])
def test_vllm_nemotron_h_ssm_dtype_without_the_field_by_release(version, ssm_bytes):
    # Nemotron-H-56B's config names no mamba_ssm_cache_dtype: vLLM's NemotronHForCausalLMConfig took float16 for it
    # through 0.19.1 and float32 from 0.20.0 (models/config.py of both wheels). Nemotron 3 Nano names float32.
    def state(model):
        layers = engines.engine("vllm", EngineOptions(version=version)).cached_layers(model)
        return next(c for c in layers if c.kind == "recurrent").state_bytes(kv_dtype("bf16"))

    h56 = load_model("nvidia/Nemotron-H-56B-Base-8K")  # 256 heads of 64, d_state 256, 8 groups, kernel 4
    assert state(h56) == (16384 + 2 * 8 * 256) * 3 * BF16 + 256 * 64 * 256 * ssm_bytes
    assert state(load_model(NANO)) == 6144 * 3 * BF16 + 64 * 64 * 128 * FP32


def test_vllm_mamba_ssm_cache_dtype_sets_every_ssm_state():
    # --mamba-ssm-cache-dtype (CacheConfig.mamba_ssm_cache_dtype) sets the temporal state of Mamba-2 and Gated
    # DeltaNet whatever the family; the conv state stays in the model dtype (`mamba_utils.py` _mamba_state_dtype).
    # Nemotron-H's and Qwen3.5's configs fill it only while it is "auto", so the flag wins there too.
    def states(model, dtype):
        layers = engines.engine("vllm", EngineOptions(mamba_ssm_cache_dtype=dtype)).cached_layers(model)
        return [c.state_bytes(kv_dtype("bf16")) for c in layers if c.kind == "recurrent"]

    granite = read(GRANITE)
    assert set(states(granite, "float32")) == {(3072 + 2 * 128) * 3 * BF16 + 48 * 64 * 128 * FP32}
    assert states(granite, "auto") == states(granite, None) == states(granite, "bfloat16")
    assert set(states(load_model(NANO), "bfloat16")) == {(4096 + 2 * 8 * 128) * 3 * BF16 + 64 * 64 * 128 * BF16}
    qwen = load_model("Qwen/Qwen3.5-27B")  # mamba_ssm_dtype float32 in its config
    assert set(states(qwen, "float16")) == {(2 * 16 * 128 + 48 * 128) * 3 * BF16 + 48 * 128 * 128 * 2}


def test_vllm_mamba_ssm_cache_dtype_flag(monkeypatch, capsys, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(GRANITE), encoding="utf-8")
    code, out, _ = run_main(monkeypatch, capsys, "estimate", "--model", str(path), "--ctx", "8k", "--gpu", "h100",
                            "--engine", "vllm", "--mamba-ssm-cache-dtype", "float32", "--json")
    assert code == 0
    # an fp32 state page, (3,072 + 2 x 128) x 3 x 2 + 48 x 64 x 128 x 4 = 1,592,832 B, raises the attention block
    # (2 x 4 KV heads x 128 x 2 = 2,048 B a token) to 16 x cdiv(1,592,832, 16 x 2,048) = 784 tokens, not 400
    state = (3072 + 2 * 128) * 3 * BF16 + 48 * 64 * 128 * FP32
    block = 16 * -(-state // (16 * 2048))
    assert block == 784
    assert json.loads(out)["vllm_block_bytes"] == 2 * block * 2048  # groups of 2 layers: 2 pages a block
    code, _, err = run_main(monkeypatch, capsys, "estimate", "--model", str(path), "--ctx", "8k", "--gpu", "h100",
                            "--mamba-ssm-cache-dtype", "fp32")
    assert_one_line_error(code, err, "--mamba-ssm-cache-dtype", "float32")
    code, _, err = run_main(monkeypatch, capsys, "estimate", "--model", str(path), "--ctx", "8k", "--gpu", "h100",
                            "--engine", "transformers", "--mamba-ssm-cache-dtype", "float32")
    assert_one_line_error(code, err, "--mamba-ssm-cache-dtype")


def test_transformers_keeps_kernel_inputs_and_fp32_ssm_for_nemotron():
    # transformers' LinearAttentionLayer: conv_kernel (4) inputs of 6,144 channels in bf16, SSM fp32
    model = load_model(NANO)
    state = engines.engine("transformers", EngineOptions()).cached_layers(model)[0]
    assert state.state_bytes(kv_dtype("bf16")) == 6144 * 4 * BF16 + 64 * 64 * 128 * FP32


# ------------------------------------------------------------------------------------------ tensor parallelism


def test_tp_must_divide_ssm_heads_and_groups():
    # Mamba-2: 128 heads, 8 groups: TP 1, 2, 4, 8 (16 would not divide the groups, and vLLM replicates one only)
    model = read(MAMBA2)
    assert valid_tp(model) == [1, 2, 4, 8]
    with pytest.raises(KvplanError, match="SSM heads"):
        check_parallel(model, 3, 1)
    with pytest.raises(KvplanError, match="B/C groups"):
        check_parallel(model, 16, 1)


def test_tp_of_mamba1_divides_its_channels():
    # Mamba (state-spaces/mamba-2.8b-hf's shape): d_inner 5,120 channels, split evenly (vLLM divide())
    config = {"model_type": "mamba", "num_hidden_layers": 64, "hidden_size": 2560, "intermediate_size": 5120,
              "state_size": 16, "conv_kernel": 4, "expand": 2, "vocab_size": 50280, "torch_dtype": "bfloat16"}
    model = read(config)
    assert model.num_attention_heads == 0
    assert 8 in valid_tp(model) and 3 not in valid_tp(model)
    (layers,) = gpu_layers(model.caches, [model.num_layers], 4)
    assert layers[0][0].conv_elements == 5120 // 4 * 3 and layers[0][0].ssm_elements == 5120 // 4 * 16


# ------------------------------------------------------------------------------------------ parameters


def test_nemotron_3_nano_parameters_match_the_model_card():
    # NVIDIA's model card: 31.6B total parameters, 3.6B active including embeddings
    params = load_model(NANO).params
    assert round(params.total / 1e9, 1) == 31.6
    assert round(params.active / 1e9, 1) == 3.6


def test_zamba2_shared_blocks_counted_once_and_adapters_per_application(tmp_path):
    pytest.importorskip("torch")
    import archkit

    # two shared blocks taken in turn by three hybrid layers, attention adapters on: transformers' own count
    fields = {"num_hidden_layers": 5, "layers_block_type": ["mamba", "hybrid", "mamba", "hybrid", "hybrid"],
              "hidden_size": 256, "num_attention_heads": 8, "n_mamba_heads": 4, "intermediate_size": 64,
              "vocab_size": 512, "num_mem_blocks": 2, "use_shared_attention_adapter": True, "adapter_rank": 16,
              "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2, "mamba_ngroups": 1}
    model = read({"model_type": "zamba2", **fields})
    assert model.params.total == archkit.meta_parameters("zamba2", fields)
    assert [c.layer for c in model.caches if c.kind == "full"] == [1, 3, 4]


# ------------------------------------------------------------------------------------------ mamba_ssm's own format

# state-spaces/mamba-130m's config.json shape: mamba_ssm's MambaConfig, a Mamba (1) mixer with its defaults
MAMBA_SSM_V1 = {"d_model": 768, "n_layer": 24, "vocab_size": 50277, "ssm_cfg": {}, "rms_norm": True,
                "residual_in_fp32": True, "fused_add_norm": True, "pad_vocab_size_multiple": 8}


def test_mamba_ssm_mamba2_reads_as_transformers_converter_maps_it():
    # convert_mamba2_ssm_checkpoint_to_pytorch.py: hidden_size d_model, num_heads d_model x expand 2 / head_dim 64,
    # num_hidden_layers n_layer, n_groups 1, tie_embeddings, the vocabulary padded to pad_vocab_size_multiple 16
    converted = {"model_type": "mamba2", "hidden_size": 2560, "num_heads": 2560 * 2 // 64, "head_dim": 64,
                 "num_hidden_layers": 64, "n_groups": 1, "state_size": 128, "conv_kernel": 4, "expand": 2,
                 "vocab_size": 50288, "tie_word_embeddings": True}
    genuine = load_model("state-spaces/mamba2-2.7b")
    expected = read(converted)
    assert genuine.caches == expected.caches and genuine.params == expected.params
    # 64 layers x (conv (5120 + 2 x 128) x (4 - 1) + ssm 80 x 64 x 128) elements, float32 (no dtype named)
    state = estimate(genuine, ctx=8192).state_bytes_per_sequence
    assert state == 64 * ((5120 + 2 * 128) * 3 + 80 * 64 * 128) * FP32  # 171,900,928
    assert round(genuine.params.total / 1e9, 1) == 2.7  # the model's name
    assert any("converted to their mamba2" in note for note in genuine.notes)  # no engine serves mamba_ssm's files


@pytest.mark.torch
def test_mamba_ssm_mamba1_counts_as_transformers_builds_it():
    pytest.importorskip("torch")
    import archkit

    # convert_mamba_ssm_checkpoint_to_pytorch.py: intermediate_size 2 x d_model, time_step_rank ceil(d_model / 16),
    # the vocabulary padded to pad_vocab_size_multiple 8; MambaConfig's defaults otherwise (state 16, kernel 4)
    fields = {"hidden_size": 768, "intermediate_size": 1536, "time_step_rank": 48, "num_hidden_layers": 24,
              "vocab_size": 50280}
    model = read(MAMBA_SSM_V1)
    assert model.params.total == archkit.meta_parameters("mamba", fields)
    assert model.caches[0].ssm_elements == 1536 * 16 and model.caches[0].conv_elements == 1536 * 3


@pytest.mark.parametrize(("change", "fragment"), [
    ({"attn_layer_idx": [9, 18]}, "attn_layer_idx"),  # state-spaces/mamba2attn-2.7b's attention blocks
    ({"d_intermediate": 4096}, "d_intermediate"),
    ({"rms_norm": False}, "rms_norm"),
    ({"ssm_cfg": {"layer": "Mamba3"}}, "Mamba3"),
    ({"ssm_cfg": {"layer": "Mamba2", "d_ssm": 1024}}, "d_ssm"),
    ({"ssm_cfg": {"layer": "Mamba2", "headdim": 100}}, "headdim"),
    ({"ssm_cfg": "Mamba2"}, "ssm_cfg"),
], ids=["attention", "mlp", "layernorm", "layer", "d_ssm", "headdim", "not-an-object"])
def test_mamba_ssm_layouts_transformers_cannot_hold_are_refused(monkeypatch, capsys, tmp_path, change, fragment):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(MAMBA_SSM_V1 | change), encoding="utf-8")
    code, _, err = run_main(monkeypatch, capsys, "estimate", "--model", str(path), "--ctx", "8k")
    assert_one_line_error(code, err, fragment)


# ------------------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize(("config", "field"), [
    (dict(GRANITE, layer_types=["mamba"] * 7), "layer_types"),
    (dict(GRANITE, layer_types=["mamba"] * 7 + ["conv"]), "layer_types"),
    ({"model_type": "bamba", **{k: v for k, v in GRANITE.items() if k != "model_type"}, "attn_layer_indices": [8]},
     "attn_layer_indices"),
    (dict(MAMBA2, head_dim=48), "head_dim"),
    (dict(MAMBA2, n_groups=3), "n_groups"),
    ({"model_type": "nemotron_h", "num_hidden_layers": 3, "hybrid_override_pattern": "M*", "hidden_size": 256,
      "num_attention_heads": 4, "mamba_num_heads": 4, "mamba_head_dim": 32, "ssm_state_size": 16, "n_groups": 2,
      "conv_kernel": 4, "intermediate_size": 512, "vocab_size": 100}, "hybrid_override_pattern"),
    ({"model_type": "nemotron_h", "num_hidden_layers": 3, "layers_block_type": ["mamba", "attention"],
      "hidden_size": 256, "num_attention_heads": 4, "vocab_size": 100}, "layers_block_type"),
    ({"model_type": "nemotron_h", "layers_block_type": ["mamba", "transformer"], "hidden_size": 256,
      "num_attention_heads": 4, "vocab_size": 100}, "layers_block_type"),
    ({"model_type": "zamba2", "num_hidden_layers": 2, "layers_block_type": ["mamba", "shared"], "hidden_size": 256,
      "num_attention_heads": 8, "n_mamba_heads": 4, "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2,
      "mamba_ngroups": 1, "vocab_size": 100}, "layers_block_type"),
    ({"model_type": "zamba2", "num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 8,
      "n_mamba_heads": 4, "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2, "vocab_size": 100},
     "layers_block_type"),
], ids=["layer_types-length", "layer_types-unknown", "attn_layer_indices-range", "mamba2-head_dim",
        "mamba2-n_groups", "nemotron-pattern-length", "nemotron-block-types-length", "nemotron-block-type-unknown",
        "zamba2-block-type-unknown", "zamba2-no-block-types"])
def test_inconsistent_fields_are_refused_in_one_line_naming_the_field(config, field):
    with pytest.raises(KvplanError, match=field) as err:
        read(config)
    assert "\n" not in str(err.value)


def test_tp_on_the_command_line_is_refused_for_ssm_heads(monkeypatch, capsys, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(MAMBA2), encoding="utf-8")
    code, _, err = run_main(monkeypatch, capsys, "estimate", "--model", str(path), "--ctx", "8k", "--gpu", "h100",
                            "--tp", "3")
    assert_one_line_error(code, err, "--tp 3", "128 SSM heads")


def test_pure_mamba_capacity_under_tp():
    cap = capacity(read(MAMBA2), Workload(ctx=8192), hardware=H100, parallel=Parallelism(tp=2))
    assert cap.tensor_parallel_size == 2 and cap.max_concurrent_users > 0
