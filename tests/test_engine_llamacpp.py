"""llama.cpp's allocation rules (`--engine llama.cpp`), each against numbers worked by hand from llama.cpp's source
(0c1e57098b, as vendored in llama-cpp-python 0.3.36; the file each rule comes from is named in its test) or logged
by llama.cpp itself (benchmarks/llamacpp_oracle.py, docs/accuracy.md). Expected numbers never come from kvplan."""

import json

import pytest
from conftest import GiB, MiB, assert_one_line_error, run_main

from kvplan import engines
from kvplan.capacity import Hardware, Parallelism, Workload, capacity
from kvplan.engines import EngineOptions
from kvplan.errors import KvplanError
from kvplan.sources import load_model

BUDGET = 500 * GiB


def plan(model, ctx: int, users: int = 1, **options):
    spec = model if not isinstance(model, str) else load_model(model)
    return capacity(spec, Workload(ctx=ctx, users=users), engine_name="llama.cpp", kv_budget=BUDGET,
                    options=EngineOptions(**options))


def kv_bytes(model, ctx: int, users: int = 1, **options) -> int:
    """What llama.cpp allocates for -c users x ctx -np users: KV cache and recurrent state."""
    return plan(model, ctx, users, **options).engine_kv_bytes_for_users


# Gemma-3-27B: 52 sliding layers (W = 1024) and 10 full ones, 16 KV heads x 128; f16 K and V rows:
# 2 x 16 x 128 x 2 = 8,192 B per cell per layer.
GEMMA3 = "google/gemma-3-27b-it"
CELL = 8192


@pytest.mark.parametrize(("options", "swa_cells"), [
    ({"ubatch_size": 256}, 1280),  # PAD(min(8192, 1024 + 256), 256)
    ({"ubatch_size": 1024}, 2048),  # PAD(min(8192, 1024 + 1024), 256)
    ({"batch_size": 256}, 1280),  # n_ubatch = min(n_batch 256, n_ubatch 512) = 256
    ({}, 1536),  # the default -ub 512
])
def test_micro_batch_sizes_the_sliding_window_cache(options, swa_cells):
    """src/llama-kv-cache-iswa.cpp: SWA cells = GGML_PAD(min(n_ctx_seq, n_swa x (unified ? n_seq_max : 1) +
    n_ubatch), 256); src/llama-context.cpp: n_batch = min(n_ctx, n_batch), n_ubatch = min(n_batch, n_ubatch).
    One sequence of 8,192: 10 x 8,192 cells + 52 x swa_cells, 8,192 B each."""
    assert kv_bytes(GEMMA3, 8192, **options) == (10 * 8192 + 52 * swa_cells) * CELL


def test_short_context_caps_the_batch_and_the_window():
    """-c 300: n_ctx = GGML_PAD(300, 256) = 512; n_batch = min(300, 2048) = 300, n_ubatch = min(300, 512) = 300;
    SWA cells PAD(min(512, 1024 + 300), 256) = 512: every layer 512 cells, 62 x 512 x 8,192 B."""
    assert kv_bytes(GEMMA3, 300) == 62 * 512 * CELL


def test_unified_and_per_slot_windows_with_a_micro_batch():
    """Four slots of 4,096, -ub 256. Unified: one stream of n_ctx = 16,384 cells, SWA PAD(min(16,384, 1,024 x 4 +
    256), 256) = 4,352. Per slot: n_ctx_seq = PAD(16,384 / 4, 256) = 4,096 cells in each of 4 streams, SWA
    PAD(min(4,096, 1,024 + 256), 256) = 1,280 (src/llama-context.cpp, src/llama-kv-cache-iswa.cpp)."""
    assert kv_bytes(GEMMA3, 4096, 4, ubatch_size=256) == (10 * 16384 + 52 * 4352) * CELL
    assert kv_bytes(GEMMA3, 4096, 4, ubatch_size=256, kv_unified=False) == 4 * (10 * 4096 + 52 * 1280) * CELL


# Llama-3-8B: 32 layers, 8 KV heads x 128 = 1,024 elements in each K and each V row.
LLAMA = "meta-llama/Llama-3-8B"


@pytest.mark.parametrize(("options", "row_k", "row_v"), [
    ({"cache_type_k": "q8_0"}, 32 * 34, 2048),  # q8_0: 32 blocks of 34 B (ggml-common.h); V stays f16
    ({"cache_type_v": "q4_0"}, 2048, 32 * 18),  # q4_0: 32 blocks of 18 B
    ({"cache_type_k": "q4_1", "cache_type_v": "iq4_nl"}, 32 * 20, 32 * 18),
    ({"cache_type_k": "bf16", "cache_type_v": "q5_1"}, 2048, 32 * 24),
])
def test_separate_k_and_v_cache_types(options, row_k, row_v):
    """src/llama-kv-cache.cpp: K [n_embd_k_gqa, kv_size] in type_k, V [n_embd_v_gqa, kv_size] in type_v, each row
    ggml_row_size(type, 1,024) bytes. n_ctx 8,192: 32 x 8,192 x (row_k + row_v)."""
    assert kv_bytes(LLAMA, 8192, **options) == 32 * 8192 * (row_k + row_v)


def test_kv_dtype_sets_both_and_a_cache_type_overrides_one():
    """--kv-dtype q8_0 --cache-type-v f16: K q8_0 (1,088 B a row), V f16 (2,048 B): 32 x 8,192 x 3,136 B = 784 MiB,
    where q8_0 for both is 544 MiB (engines.md 7.1)."""
    mixed = capacity(load_model(LLAMA), Workload(ctx=8192), engine_name="llama.cpp", kv_budget=BUDGET,
                     kv_dtype_name="q8_0", options=EngineOptions(cache_type_v="f16"))
    assert mixed.engine_kv_bytes_per_sequence == 784 * MiB
    assert (mixed.kv_dtype, mixed.v_dtype) == ("q8_0", "fp16")
    assert kv_bytes(LLAMA, 8192, cache_type_k="q8_0", cache_type_v="q8_0") == 544 * MiB


def test_estimate_json_names_both_cache_types(monkeypatch, capsys):
    code, out, _ = run_main(monkeypatch, capsys, "estimate", "-m", LLAMA, "--ctx", "8k", "--engine", "llama.cpp",
                            "--kv-budget", "60GiB", "--cache-type-k", "q8_0", "--json")
    data = json.loads(out)
    assert code == 0
    assert (data["kv_dtype"], data["v_dtype"]) == ("q8_0", "fp16")
    assert data["kv_bytes_per_sequence"] == data["engine_kv_bytes_per_sequence"] == 784 * MiB
    assert data["sequence_limit"] == 256
    code, out, _ = run_main(monkeypatch, capsys, "estimate", "-m", LLAMA, "--ctx", "8k", "--json")
    assert "v_dtype" not in json.loads(out) and "sequence_limit" not in json.loads(out)


def test_mla_refuses_different_k_and_v_types():
    """src/llama-context.cpp (llama_init_from_model): MLA caches K only, so "model does not support different K
    (%s) and V (%s) cache types"."""
    with pytest.raises(KvplanError, match=r"does not support different K \(q8_0\) and V \(f16\) cache types"):
        plan("deepseek-ai/DeepSeek-V2-Lite", 8192, cache_type_k="q8_0")
    # the same type for both: one K row of 512 + 64 = 576 elements, 18 blocks of 34 B, on each of 27 layers
    assert kv_bytes("deepseek-ai/DeepSeek-V2-Lite", 8192, cache_type_k="q8_0", cache_type_v="q8_0") == \
        27 * 8192 * 18 * 34


def test_quantised_v_needs_flash_attention():
    """src/llama-context.cpp: with -fa off "quantized V cache requires flash_attn to be enabled"; -fa auto turns it
    on for a quantised V cache. A quantised K alone is accepted without it."""
    with pytest.raises(KvplanError, match="quantized V cache requires flash_attn to be enabled"):
        plan(LLAMA, 8192, cache_type_v="q8_0", flash_attn="off")
    assert kv_bytes(LLAMA, 8192, cache_type_v="q8_0", flash_attn="auto") == 32 * 8192 * (2048 + 1088)
    assert kv_bytes(LLAMA, 8192, cache_type_k="q8_0", flash_attn="off") == 32 * 8192 * (1088 + 2048)


def test_block_must_divide_the_head_size():
    """src/llama-context.cpp: with flash attention on or auto, "K cache type %s with block size %u does not divide
    n_embd_head_k=%u". Phi-2's heads are 2,560 / 32 = 80 wide, and q8_0's block is 32. With -fa off llama.cpp does
    not check it (docs/accuracy.md: a context with K q8_0 is made)."""
    with pytest.raises(KvplanError, match="K cache type q8_0 with block size 32 does not divide n_embd_head_k=80"):
        plan("microsoft/phi-2", 4096, cache_type_k="q8_0")
    with pytest.raises(KvplanError, match="V cache type q4_0 with block size 32 does not divide n_embd_head_v=80"):
        plan("microsoft/phi-2", 4096, cache_type_v="q4_0", flash_attn="on")
    # -fa off: K q8_0 rows of 32 x 80 = 2,560 elements (80 blocks of 34 B) beside f16 V rows (5,120 B), 32 layers
    assert kv_bytes("microsoft/phi-2", 4096, cache_type_k="q8_0", flash_attn="off") == 32 * 4096 * (80 * 34 + 5120)


def test_k_rows_of_partial_blocks_are_refused_without_flash_attention(tmp_path):
    """-fa off checks no head size, but llama_kv_cache makes each layer's K tensor [KV heads x head size, cells]
    and a view of it per stream; a row that is not whole blocks of the K type gets a stride of whole blocks, the
    view overruns the tensor and ggml aborts (GGML_ASSERT in ggml_new_tensor_impl, ggml/src/ggml.c). One KV head
    of 80 with q8_0 (32 a block): refused. Eight KV heads of 80 (640, 20 blocks) are made, as with Phi-2 above
    (llama.cpp made that context: docs/accuracy.md), 20 x 34 B of K a layer and token."""
    from ggufkit import Q, write_gguf

    meta = {".block_count": 2, ".context_length": 4096, ".embedding_length": 640, ".attention.head_count": 8,
            ".feed_forward_length": 1024}
    embd = [("token_embd.weight", [640, 512], Q.Q8_0)]
    mqa = load_model(str(write_gguf(tmp_path / "mqa.gguf", "llama", {**meta, ".attention.head_count_kv": 1}, embd)))
    with pytest.raises(KvplanError, match=r"K cache type q8_0 with block size 32 does not divide the K row of "
                                          r"layer 0 \(1 KV heads x 80 = 80\)"):
        plan(mqa, 4096, cache_type_k="q8_0", flash_attn="off")
    gqa = load_model(str(write_gguf(tmp_path / "gqa.gguf", "llama", {**meta, ".attention.head_count_kv": 8}, embd)))
    assert kv_bytes(gqa, 4096, cache_type_k="q8_0", flash_attn="off") == 2 * 4096 * (20 * 34 + 640 * 2)


def test_apple_gpus_are_planned_as_metal_runs_llama_cpp(monkeypatch, capsys):
    """On Apple silicon llama.cpp runs on Metal: no CUDA context in the overhead (the Metal backend keeps nothing
    beside its buffers), and --flash-attn auto resolved by Metal's kernels (ggml-metal-device.m, supports_op for
    FLASH_ATTN_EXT): K and V of one cache type, so K q8_0 with V f16 turns it off there, where CUDA's kernels keep
    it on (the head size, 128, is all they check); the assumptions say which backend resolved it."""
    args = ["estimate", "-m", "meta-llama/Llama-3-8B", "--ctx", "8k", "--engine", "llama.cpp", "--json",
            "--cache-type-k", "q8_0", "--cache-type-v", "f16"]
    code, out, err = run_main(monkeypatch, capsys, *args, "--gpu", "m4-max-64gb")
    metal = json.loads(out)
    assert code == 0, err
    assert not any(metal["overhead"].values())
    assert any("resolved as Metal does" in line for line in metal["engine_assumptions"])
    assert any("flash attention off (auto)" in note for note in metal["notes"])
    code, out, err = run_main(monkeypatch, capsys, *args, "--gpu", "h100")
    cuda = json.loads(out)
    assert cuda["overhead"]["cuda_context"] == 2**29
    assert any("resolved as CUDA does" in line for line in cuda["engine_assumptions"])
    assert any("flash attention on (auto)" in note for note in cuda["notes"])


def test_at_most_256_sequences_per_server():
    """src/llama-cparams.h: LLAMA_MAX_SEQ 256; llama_context: "n_seq_max must be <= 256". A 1B model with 500 GiB
    for its cache could hold thousands of 1k-token sequences: one server holds 256, two replicas 512."""
    small = plan("google/gemma-3-1b-it", 1024)
    assert small.max_concurrent_users == small.max_users_at_startup == 256
    asked = plan("google/gemma-3-1b-it", 1024, users=300)
    assert not asked.fits and "n_seq_max must be <= 256" in asked.reasons[0]
    two = capacity(load_model("google/gemma-3-1b-it"), Workload(ctx=1024, users=300), engine_name="llama.cpp",
                   kv_budget=BUDGET, parallel=Parallelism(replicas=2))
    assert two.fits and two.max_concurrent_users == 512


def test_more_users_than_a_server_holds_exits_one(monkeypatch, capsys):
    code, out, _ = run_main(monkeypatch, capsys, "estimate", "-m", "google/gemma-3-1b-it", "--ctx", "1k",
                            "--engine", "llama.cpp", "--gpu", "h100", "--batch", "300")
    assert code == 1
    assert "at most 256" in out and "needs 2 GPUs" in out


def test_speculative_tokens_keep_rollback_states():
    """src/llama-memory-recurrent.cpp: max(1, n_seq_max) x (1 + n_rs_seq) rows of R and S per recurrent layer, f32;
    llama-server sets n_rs_seq to the draft's n_max for llm_arch_supports_rs_rollback architectures (QWEN35 among
    them) and llama_context clamps it to 0 for the others (Jamba).
    Qwen3.5-27B: 48 Gated DeltaNet layers; conv 3 x (2 x 16 x 128 + 48 x 128) = 30,720, SSM 128 x 48 x 128 =
    786,432 elements: 3,268,608 B a row. 4 users, 3 draft tokens: 16 rows instead of 4."""
    qwen = "Qwen/Qwen3.5-27B"
    extra = kv_bytes(qwen, 4096, 4, speculative_tokens=3) - kv_bytes(qwen, 4096, 4)
    assert extra == 48 * (16 - 4) * 3_268_608
    assert kv_bytes("ai21labs/Jamba-v0.1", 4096, 4, speculative_tokens=3) == kv_bytes("ai21labs/Jamba-v0.1", 4096, 4)


def test_recurrent_state_is_f32_rows_per_sequence():
    """Jamba-v0.1: 28 Mamba layers, d_inner 8,192, d_conv 4, d_state 16: R (4 - 1) x 8,192 and S 16 x 8,192 f32
    elements, one row per sequence (max(1, n_seq_max)); 4 attention layers of 8 KV heads x 128, f16, over one
    unified stream of 4 x 4,096 cells."""
    state = 28 * 4 * (3 * 8192 + 16 * 8192)
    assert kv_bytes("ai21labs/Jamba-v0.1", 4096, 4) == 4 * state + 4 * 16384 * 2 * 8 * 128 * 2


def test_phi3_window_is_switched_off():
    """src/models/phi3.cpp: "Phi SWA is currently disabled": a full cache on all 32 layers, 32 KV heads x 96.
    At 4,096: 32 x 4,096 x 2 x 32 x 96 x 2 B = 1.5 GiB."""
    assert kv_bytes("microsoft/Phi-3-mini-4k-instruct", 4096) == 3 * GiB // 2


def test_v_rows_padded_to_the_widest_without_flash_attention():
    """src/llama-kv-cache.cpp [TAG_V_CACHE_VARIABLE]: with -fa off V is stored transposed, every layer's row
    n_embd_v_gqa_max wide. Gemma-4-31B: sliding layers 16 KV heads x 256 = 4,096, full layers 4 x 512 = 2,048:
    each of the 10 full layers' V rows grows by 2,048 f16 elements on 8,192 cells."""
    model = "google/gemma-4-31B-it"
    extra = kv_bytes(model, 8192, flash_attn="off") - kv_bytes(model, 8192, flash_attn="on")
    assert extra == 10 * 8192 * 2048 * 2


def test_flash_attn_auto_resolves_as_cuda_does(tmp_path):
    """--flash-attn auto: on where CUDA's kernels take the head size (ggml/src/ggml-cuda/fattn.cu:
    40, 64, 72, 80, 96, 112, 128, 256 with K = V; 512 and MLA's 576/512 with 2 or more query heads per KV head);
    a Llama with 160-wide heads falls back to attention without it: its compute buffer holds the scores."""
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2560,
              "num_hidden_layers": 2, "num_attention_heads": 16, "num_key_value_heads": 4, "intermediate_size": 6912,
              "vocab_size": 32000, "max_position_embeddings": 32768, "torch_dtype": "bfloat16"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    auto = plan(load_model(str(path)), 8192)
    assert any("flash attention off (auto)" in note for note in auto.notes)
    assert any("flash attention on (auto)" in note for note in plan(LLAMA, 8192).notes)
    assert any("flash attention on (auto)" in note for note in plan("google/gemma-4-31B-it", 8192).notes)
    assert any("flash attention on (auto)" in note for note in plan("deepseek-ai/DeepSeek-V3", 8192).notes)


# The "dense GQA" model of benchmarks/llamacpp_oracle.py: 2 layers, hidden 2,048, 16 heads of 128, 4 KV heads,
# MLP 5,632, vocabulary 32,000. llama.cpp's CPU backend logged these compute buffers (MiB, two decimals), the
# flash-attention ones for a context whose every token is an output (n_outputs_max left at n_batch, as
# llama-cpp-python's Llama() leaves it): kvplan's python front end with llama-server's other settings.
ALL_OUTPUTS = {"frontend": "python", "kv_unified": True, "swa_full": False, "batch_size": 2048}
DENSE = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 2,
         "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 5632,
         "vocab_size": 32000, "max_position_embeddings": 131072, "tie_word_embeddings": False,
         "torch_dtype": "bfloat16", "rms_norm_eps": 1e-6}


@pytest.mark.parametrize(("ctx", "users", "options", "logged_mib"), [
    (4096, 1, {"flash_attn": "on", **ALL_OUTPUTS}, 70.50),
    (16384, 1, {"flash_attn": "off"}, 566.01),
    (4096, 4, {"flash_attn": "off"}, 566.01),  # unified: the scores span all 16,384 cells
    (4096, 4, {"flash_attn": "off", "kv_unified": False}, 158.01),  # per slot: 4,096 cells a stream
    (8192, 1, {"flash_attn": "on", "ubatch_size": 1024, **ALL_OUTPUTS}, 141.00),
    (8192, 1, {"flash_attn": "off", "ubatch_size": 256}, 147.00),
])
def test_compute_buffer_against_llama_cpp(tmp_path, ctx, users, options, logged_mib):
    """The "compute buffer size" llama.cpp logged for these contexts (docs/accuracy.md, "llama.cpp's own
    buffers"): kvplan's figure rounds to the same two decimals."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(DENSE))
    figure = plan(load_model(str(path)), ctx, users, **options).engine_activation_bytes_for_users
    assert f"{figure / MiB:.2f}" == f"{logged_mib:.2f}"


def test_compute_buffer_of_llama_3_8b():
    """Worked from `LlamaCppGraph` for Llama-3-8B at n_ctx 8,192, one sequence, T = 512 tokens:
    flash attention under llama-server, which reserves one row of logits for its one slot: the MLP's moment,
    (3 x 14,336 + 3 x 4,096) x 512 x 4 B, plus the inputs: an f16 mask of 8,192 x 512, token ids, positions and
    output ids (3 x 512 x 4 B), K and V indices (2 x 512 x 8 B);
    where every token is an output (Llama()), the logits dominate, (128,256 + 2 x 4,096) x 512 x 4 B = 266.5 MiB;
    without flash attention: the scores, 32 heads x 8,192 cells, beside 4 E + 32 x 128, = 282,624 x 512 x 4 B, plus
    the inputs: an f32 mask, the ids, K indices (512 x 8 B) and V indices for every element of a transposed V row
    (512 x 1,024 x 8 B)."""
    server = plan(LLAMA, 8192).engine_activation_bytes_for_users
    assert server == 55_296 * 512 * 4 + 8192 * 512 * 2 + 3 * 512 * 4 + 2 * 512 * 8
    every_token = plan(LLAMA, 8192, flash_attn="on", **ALL_OUTPUTS).engine_activation_bytes_for_users
    assert every_token == (128256 + 2 * 4096) * 512 * 4
    inputs = 8192 * 512 * 4 + 3 * 512 * 4 + 512 * 8 * (1 + 1024)
    assert plan(LLAMA, 8192, flash_attn="off").engine_activation_bytes_for_users == 282_624 * 512 * 4 + inputs


def test_compute_buffer_of_deepseek_v3():
    """MLA with flash attention (`LlamaCppGraph.mla_query_width`): DeepSeek-V3's peak is the moment a layer after a
    dense one absorbs its queries into the latent, 128 heads: q (192), q_nope_absorbed (512) and Qcur (576)
    stacked above the residual stream, which lies above the previous layer's attention output (128), beside 4 E
    (7,168): (4 x 7,168 + 128 x (128 + 192 + 512 + 576)) x 512 x 4 B, plus the inputs (an f16 mask of 8,192 x 512,
    the ids and positions, cell indices). llama.cpp logged 416.01 MiB for a context of 8,192 at DeepSeek-V3's
    widths on two layers (a dense one, then 256 experts; docs/accuracy.md): one layer's moment, whatever the
    layer count, and one row of logits."""
    figure = plan("deepseek-ai/DeepSeek-V3", 8192, flash_attn="on").engine_activation_bytes_for_users
    assert figure == (4 * 7168 + 128 * (128 + 192 + 512 + 576)) * 512 * 4 + 8192 * 512 * 2 + 3 * 512 * 4 + 2 * 512 * 8
    assert f"{figure / MiB:.2f}" == "416.01"


@pytest.mark.parametrize(("users", "drafts", "rows"), [(1, 0, 1), (4, 0, 4), (4, 3, 16), (256, 7, 512)])
def test_llama_server_reserves_logits_for_its_output_limit(tmp_path, users, drafts, rows):
    """llama-server sets n_outputs_max = min(-b, -np x (1 + draft tokens)) (`server_output_limits`,
    tools/server/server-context.cpp) and llama.cpp reserves that many rows of logits, at most the micro-batch's T.
    With a vocabulary of 262,144 and a small hidden size the logits are the graph's largest moment: 4 B x rows x
    (V + 2 E) with flash attention. The dense model at 4,096 tokens: llama.cpp logged 53.01 MiB with the server's
    limits, 70.50 MiB without (docs/accuracy.md); kvplan's 49.01 MiB misses one hidden-sized f32 row a token."""
    wide = dict(DENSE, hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2,
                head_dim=64, vocab_size=262_144)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(wide))
    spec = load_model(str(path))
    figure = plan(spec, 64, users, flash_attn="on", speculative_tokens=drafts or None).engine_activation_bytes_for_users
    assert figure == 4 * rows * (262_144 + 2 * 256)
    dense = tmp_path / "dense"
    dense.mkdir()
    (dense / "config.json").write_text(json.dumps(DENSE))
    server = plan(load_model(str(dense)), 4096, flash_attn="on").engine_activation_bytes_for_users
    assert f"{server / MiB:.2f}" == "49.01" and round(53.01 - server / MiB, 2) == 4.00


def test_python_front_end_defaults():
    """llama-cpp-python's Llama() (llama_cpp/llama.py): flash_attn=False, n_batch 512; the C API's
    llama_context_default_params: swa_full true, kv_unified false, n_seq_max 1. Gemma-3-27B at 8,192: every
    layer full, 62 x 8,192 x 8,192 B = 3,968 MiB; one sequence per Llama(); a quantised V cache refused."""
    python = plan(GEMMA3, 8192, frontend="python")
    assert python.engine_kv_bytes_per_sequence == 3968 * MiB
    assert python.sequence_limit == 1 and python.max_concurrent_users == 1
    assert not plan(GEMMA3, 8192, users=2, frontend="python").fits
    with pytest.raises(KvplanError, match="quantized V cache requires flash_attn"):
        plan(GEMMA3, 8192, frontend="python", cache_type_v="q8_0")
    assert plan(GEMMA3, 8192, frontend="python", swa_full=False).engine_kv_bytes_per_sequence == 1264 * MiB


@pytest.mark.parametrize(("engine", "options", "flag"), [
    ("vllm", EngineOptions(ubatch_size=256), "--ubatch-size"),
    ("sglang", EngineOptions(frontend="python"), "--frontend"),
    ("transformers", EngineOptions(cache_type_k="q8_0"), "--cache-type-k"),
    ("tensorrt-llm", EngineOptions(flash_attn="on"), "--flash-attn"),
    ("ideal", EngineOptions(speculative_tokens=3), "--speculative-tokens"),
])
def test_other_engines_refuse_llama_cpp_flags(engine, options, flag):
    with pytest.raises(KvplanError, match=flag):
        engines.engine(engine, options)


@pytest.mark.parametrize(("args", "fragments"), [
    (["--ubatch-size", "0"], ["--ubatch-size"]),
    (["--batch-size", "-1"], ["--batch-size"]),
    (["--flash-attn", "maybe"], ["--flash-attn", "on or off or auto"]),
    (["--frontend", "java"], ["--frontend"]),
    (["--speculative-tokens", "-1"], ["--speculative-tokens"]),
    (["--cache-type-k", "q3"], ["--cache-type-k", "q3"]),
    (["--cache-type-v", "fp8"], ["--cache-type-v", "fp8"]),
    (["--cache-type-k", "q8_0", "--cache-type-v", "q8_0", "-m", "microsoft/phi-2"], ["n_embd_head_k=80"]),
])
def test_bad_llama_cpp_flags_are_one_line(monkeypatch, capsys, args, fragments):
    code, _, err = run_main(monkeypatch, capsys, "estimate", "-m", LLAMA, "--ctx", "4k", "--engine", "llama.cpp",
                            "--kv-budget", "60GiB", *args)
    assert_one_line_error(code, err, *fragments)


# ------------------------------------------------------------------------------- a draft model (-md) and --lora

DRAFT = "meta-llama/Llama-3.2-1B-Instruct"  # 16 layers, 8 KV heads of 64, vocabulary 128,256 as Llama 3.1's
LLAMA31_8B = "meta-llama/Llama-3.1-8B-Instruct"  # 32 layers, 8 KV heads of 128
H100 = Hardware(name="NVIDIA H100 SXM", memory_bytes=81_559 * MiB)


def refused(monkeypatch, capsys, args: list[str], fragments: list[str]) -> None:
    code, _, err = run_main(monkeypatch, capsys, *args)
    assert_one_line_error(code, err, *fragments)


def drafted(model, ctx: int, users: int = 1, draft: str = DRAFT, **options):
    spec = model if not isinstance(model, str) else load_model(model)
    return capacity(spec, Workload(ctx=ctx, users=users), engine_name="llama.cpp", kv_budget=BUDGET,
                    options=EngineOptions(**options), draft=load_model(draft))


@pytest.mark.parametrize(("ctx", "users", "options", "cells"), [
    (8192, 4, {}, 32768),  # unified: one stream of n_ctx = 4 x 8,192 cells, in both contexts
    (1000, 3, {"kv_unified": False}, 3 * 1024),  # per slot: n_ctx = PAD(3,000) = 3,072, 3 streams of 1,024
])
def test_the_draft_context_has_the_models_cells(ctx, users, options, cells):
    """llama-server -md (common/speculative.cpp `common_speculative_init_result`): the draft's context takes
    n_ctx = llama_n_ctx(model's context) and the server's slots, unified cache and batch sizes
    (`common_base_params_to_speculative`), so it holds as many cells as the model's. f16 K and V rows: the model
    32 x 2 x 8 x 128 x 2 = 131,072 B a cell, the draft 16 x 2 x 8 x 64 x 2 = 32,768."""
    cap = drafted(LLAMA31_8B, ctx, users, **options)
    assert cap.engine_kv_bytes_for_users == cells * (131_072 + 32_768)
    assert (cap.speculative_method, cap.speculative_tokens, cap.draft_model) == ("draft_model", 3, DRAFT)


def test_the_draft_cache_is_f16_whatever_the_models():
    """-ctkd/-ctvd default to f16 (common_params_speculative_draft); the model's q8_0 rows are 32 blocks of 34 B
    for 1,024 elements: 32 x 2 x 1,088 = 69,632 B a cell, beside the draft's f16 32,768."""
    cap = drafted(LLAMA31_8B, 8192, cache_type_k="q8_0", cache_type_v="q8_0")
    assert cap.engine_kv_bytes_for_users == 8192 * (69_632 + 32_768)


def test_the_draft_weights_and_its_compute_buffer():
    """The draft's weights as its file stores them (this config: bf16, 1,235,814,400 parameters) take the KV
    budget's place; its context reserves a compute buffer of its own, with one output per slot (n_outputs_max =
    -np 1): T = 512 tokens, E 2,048, F 8,192, 32 heads of 64, n_kv 8,192 cells, flash attention on:
        inputs 3 x 4 T + 8,192 x T x 2 (f16 mask) + T x 8 x 2 (cell indices) = 8,402,944
        layer  4 T x max(MLP 3 F + 3 E = 30,720, attention 4 E + 32 x 64 = 10,240) = 62,914,560
        output 4 x min(T, 1) x (128,256 + 2 E) = 529,408 (every token an output would be 271,056,896)
    max(8,402,944 + 62,914,560, 529,408) = 71,317,504 B."""
    model, workload = load_model(LLAMA31_8B), Workload(ctx=8192)
    cap = capacity(model, workload, engine_name="llama.cpp", hardware=H100, draft=load_model(DRAFT))
    alone = capacity(model, workload, engine_name="llama.cpp", hardware=H100)
    assert cap.draft_weights_bytes_per_gpu == 2 * 1_235_814_400
    assert alone.kv_budget_bytes - cap.kv_budget_bytes == 2 * 1_235_814_400
    assert cap.engine_activation_bytes_for_users - alone.engine_activation_bytes_for_users == 71_317_504


def test_a_drafted_model_keeps_no_rollback_rows(tmp_path):
    """need_n_rs_seq (common/common.h): the draft-simple speculator of -md asks the model's context for no rollback
    rows (MTP, EAGLE3 and DFlash drafts do), so Qwen3.5-27B keeps 1 row a sequence with a draft whatever
    --speculative-tokens (its n_max) says; the draft here: a 2-layer Llama of Qwen3.5's vocabulary."""
    path = tmp_path / "draft.json"
    path.write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 1024,
                                "intermediate_size": 2048, "num_attention_heads": 8, "num_key_value_heads": 2,
                                "head_dim": 128, "num_hidden_layers": 2, "vocab_size": 248_320,
                                "torch_dtype": "bfloat16"}), encoding="utf-8")
    qwen = "Qwen/Qwen3.5-27B"
    with_draft = drafted(qwen, 4096, 4, draft=str(path), speculative_tokens=3).engine_kv_bytes_for_users
    assert with_draft == kv_bytes(qwen, 4096, 4) + 4 * 4096 * 2 * 2 * 2 * 128 * 2


@pytest.mark.parametrize(("args", "fragments"), [
    (["--draft-model", "Qwen/Qwen3-0.6B"], ["not compatible (128,256 and 151,936 tokens"]),
    (["--draft-model", DRAFT, "--frontend", "python"], ["llama-cpp-python's Llama() makes no draft context"]),
    (["--draft-model", DRAFT, "--gpus", "2"], ["draft context on one GPU"]),
    (["--draft-model", DRAFT, "--speculative-method", "eagle3"], ["--speculative-method is not a llama.cpp setting"]),
])
def test_draft_refusals_are_one_line(monkeypatch, capsys, args, fragments):
    refused(monkeypatch, capsys, ["estimate", "-m", LLAMA31_8B, "--ctx", "8k", "--gpu", "h100",
                                                "--engine", "llama.cpp", *args], fragments)


def lora_tensors(layers: int, hidden: int, kv: int, rank: int, vocab: int):
    """A LoRA adapter on attn_q and attn_v of every layer and on token_embd, f16, as convert_lora_to_gguf writes
    it (ggml order: A [input, rank], B [rank, output]; token_embd's A [rank, vocab], B [rank, hidden]), and a norm
    llama.cpp skips."""
    from ggufkit import Q

    out = [("token_embd.weight.lora_a", [rank, vocab], Q.F16), ("token_embd.weight.lora_b", [rank, hidden], Q.F16),
           ("blk.0.attn_norm.weight", [hidden], Q.F32)]
    for i in range(layers):
        out += [(f"blk.{i}.attn_q.weight.lora_a", [hidden, rank], Q.F16),
                (f"blk.{i}.attn_q.weight.lora_b", [rank, hidden], Q.F16),
                (f"blk.{i}.attn_v.weight.lora_a", [hidden, rank], Q.F16),
                (f"blk.{i}.attn_v.weight.lora_b", [rank, kv], Q.F16)]
    return out


LORA_META = {"general.type": "adapter", "adapter.type": "lora", "adapter.lora.alpha": 16.0}


def test_lora_adapters_are_loaded_whole(tmp_path, monkeypatch, capsys):
    """--lora (src/llama-adapter.cpp): every pair of the file in the buffer of the tensor it changes, nothing
    preallocated. Llama-3.1-8B, rank 8 on q (4,096 -> 4,096) and v (4,096 -> 1,024), f16: 32 x (4,096 x 8 + 8 x
    4,096 + 4,096 x 8 + 8 x 1,024) x 2 = 6,815,744 B on the GPU; token_embd's pair, (8 x 128,256 + 8 x 4,096) x 2
    = 2,117,632 B, stays in host memory with the embeddings (the input layer is on the CPU). Two such adapters,
    twice that. llama.cpp itself logged "CPU_Mapped LoRA buffer size = 1.20 MiB" for a rank-16 adapter kvplan
    reads as 1,261,568 B (docs/accuracy.md)."""
    from ggufkit import write_gguf

    path = write_gguf(tmp_path / "lora.gguf", "llama", LORA_META, lora_tensors(32, 4096, 1024, 8, 128_256),
                      sparse=True)
    code, out, _ = run_main(monkeypatch, capsys, "estimate", "-m", LLAMA31_8B, "--ctx", "8k", "--gpu", "h100",
                            "--engine", "llama.cpp", "--lora", str(path), "--lora", str(path), "--json")
    data = json.loads(out)
    assert code == 0 and (data["lora_slots"], data["lora_rank"]) == (2, 8)
    assert data["lora_bytes_per_gpu"] == 2 * 6_815_744 and data["lora_host_bytes_per_gpu"] == 2 * 2_117_632
    code, out, _ = run_main(monkeypatch, capsys, "estimate", "-m", LLAMA31_8B, "--ctx", "8k", "--gpu", "h100",
                            "--engine", "llama.cpp", "--json")
    assert json.loads(out)["kv_budget_bytes"] - data["kv_budget_bytes"] == 2 * 6_815_744


@pytest.mark.parametrize(("meta", "tensors", "fragments"), [
    ({**LORA_META, "general.type": "model"}, None, ["expect general.type to be 'adapter', but got: model"]),
    (LORA_META, [("blk.0.attn_q.weight.lora_a", [64, 8])], ["LoRA tensor pair for 'blk.0.attn_q.weight' is missing"]),
    (LORA_META, [("blk.0.attn_q.weight", [64, 64])], ["LoRA tensor 'blk.0.attn_q.weight' has unexpected suffix"]),
])
def test_lora_files_llama_cpp_refuses(tmp_path, monkeypatch, capsys, meta, tensors, fragments):
    from ggufkit import Q, write_gguf

    listed = lora_tensors(1, 64, 64, 8, 256) if tensors is None else [(n, s, Q.F16) for n, s in tensors]
    path = write_gguf(tmp_path / "bad.gguf", "llama", meta, listed)
    refused(monkeypatch, capsys, ["estimate", "-m", LLAMA31_8B, "--ctx", "8k", "--gpu", "h100",
                                                "--engine", "llama.cpp", "--lora", str(path)], fragments)


@pytest.mark.parametrize(("a_dims", "b_dims", "fragments"), [
    ([64, 8], [], ["lora_a tensor is not transposed", "B []"]),  # B of no dimensions: ggml's ne [1, 1, 1, 1]
    ([64, 8], [4, 64], ["lora_a tensor is not transposed", "A is [64, 8], B [4, 64]"]),
    ([64, 0], [0, 64], ["has rank 0"]),
])
def test_lora_pairs_of_no_rank_are_one_line(tmp_path, monkeypatch, capsys, a_dims, b_dims, fragments):
    """A pair whose A and B do not meet (llama.cpp: A's ne[1] must be B's ne[0], a dimension left out being 1),
    or meet at rank 0, in a file written byte by byte (gguf-py writes no tensor of no dimensions)."""
    from ggufkit import raw_header, raw_kv, raw_string, raw_tensor

    meta = [raw_kv(key, 8, raw_string(value)) for key, value in (("general.architecture", "llama"),
                                                                 ("general.type", "adapter"), ("adapter.type", "lora"))]
    a_bytes = 2 * a_dims[0] * a_dims[1]
    head = raw_header(2, len(meta)) + b"".join(meta) + raw_tensor("blk.0.attn_q.weight.lora_a", a_dims, 1) \
        + raw_tensor("blk.0.attn_q.weight.lora_b", b_dims, 1, -(-a_bytes // 32) * 32)
    b_bytes = 2 * (b_dims[0] * b_dims[1] if b_dims else 1)
    path = tmp_path / "lora.gguf"
    path.write_bytes(head + bytes(-len(head) % 32) + bytes(-(-a_bytes // 32) * 32 + b_bytes))
    refused(monkeypatch, capsys, ["estimate", "-m", LLAMA31_8B, "--ctx", "8k", "--gpu", "h100",
                                  "--engine", "llama.cpp", "--lora", str(path)], fragments)


def test_lora_of_another_architecture_is_refused_for_a_gguf_model(tmp_path, monkeypatch, capsys):
    """llama.cpp: "model arch and LoRA arch mismatch", checked against a GGUF model's general.architecture."""
    from ggufkit import LLAMA3_8B, llama3_8b_q4_k_m, write_gguf

    model = write_gguf(tmp_path / "llama3.gguf", "llama", LLAMA3_8B, llama3_8b_q4_k_m(), sparse=True)
    lora = write_gguf(tmp_path / "qwen-lora.gguf", "qwen2", LORA_META, lora_tensors(1, 64, 64, 8, 256))
    refused(monkeypatch, capsys, ["estimate", "-m", str(model), "--ctx", "8k", "--gpu", "h100",
                                                "--engine", "llama.cpp", "--lora", str(lora)],
                          ["model arch and LoRA arch mismatch: qwen-lora.gguf is for qwen2"])
    refused(monkeypatch, capsys, ["estimate", "-m", LLAMA31_8B, "--ctx", "8k", "--gpu", "h100",
                                                "--lora", str(lora)], ["--lora is not a vLLM setting"])


def test_token_embeddings_stay_in_host_memory():
    """src/llama-model.cpp, `load_tensors`: the input layer (token_embd) is kept on the CPU whatever -ngl says;
    a tied model's output layer is a copy of it on the GPU. Llama-3-8B (untied), bf16: 8,030,261,248 x 2 B of
    weights less its 128,256 x 4,096 x 2 B of embeddings = 15,009,849,344 B on the GPU; Gemma-3-1B (tied) keeps
    all of its weights there."""
    cap = capacity(load_model(LLAMA), Workload(ctx=8192), engine_name="llama.cpp", hardware=H100)
    assert cap.weights_bytes_per_gpu == 8_030_261_248 * 2 - 128_256 * 4_096 * 2
    assert any("host memory" in note for note in cap.notes)
    tied = load_model("google/gemma-3-1b-it")
    cap = capacity(tied, Workload(ctx=8192), engine_name="llama.cpp", hardware=H100)
    assert cap.weights_bytes_per_gpu == 2 * tied.params.total
