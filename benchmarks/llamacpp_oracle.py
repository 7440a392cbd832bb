"""llama.cpp's own KV cache, recurrent state and compute buffer beside kvplan's, for the same model and settings.

For each model family the script writes a tiny GGUF with random weights and the config.json kvplan reads, both
from the same hyperparameters (the KV layout of the family: heads, KV heads, head sizes, windows and their layer
pattern, MLA and recurrent-state widths; few layers, small widths). The tensor list each architecture needs comes
from llama.cpp itself: `llama_model_init_from_user` on a metadata-only GGUF creates every tensor its loader wants,
`llama_model_save_to_file` writes them, and `gguf.GGUFReader` reads their names and shapes back. Each llama.cpp
context then runs in a process of its own, every context parameter set through the C API (n_ctx, n_seq_max,
kv_unified, swa_full, flash_attn_type, type_k, type_v, n_ubatch, n_batch, n_rs_seq, and for llama-server's cases
its output limits, n_outputs_max and n_outputs_max_per_seq), and its log is parsed: the
`llama_kv_cache: size = ... (N cells, L layers, S/T seqs), K (type): ..., V (type): ...` lines, the iSWA cell
lines, `llama_memory_recurrent: size = ...` and the CPU "compute buffer size". The MiB there have two decimals, so
llama.cpp's bytes are rebuilt from the cell, layer and stream counts it logs (and checked to round to the MiB it
logs) and set beside kvplan's `--engine llama.cpp` figures for the same settings; a context llama.cpp refuses is
set beside kvplan's refusal. A case with a `draft` also makes the context llama-server makes for a draft model
(-md, `common_speculative_init_result` in common/speculative.cpp): the draft's model, n_ctx = llama_n_ctx of the
model's context, the same slots, unified cache, --swa-full, batch sizes and flash attention, f16 K and V, n_rs_seq 0
and one output per slot (n_outputs_max = n_seq_max, `common_base_params_to_speculative`); both contexts' bytes
and compute buffers are summed beside kvplan's plan with the draft.

This script installs nothing. Build llama-cpp-python (which vendors llama.cpp) with `gguf` and numpy in a virtual
environment of its own, then run the script with the project's interpreter:

    python3 -m venv /tmp/llamacpp-venv
    CMAKE_BUILD_PARALLEL_LEVEL=2 /tmp/llamacpp-venv/bin/pip install llama-cpp-python==0.3.36 gguf numpy
    python benchmarks/llamacpp_oracle.py --llama-python /tmp/llamacpp-venv/bin/python          # every case
    python benchmarks/llamacpp_oracle.py --llama-python /tmp/llamacpp-venv/bin/python --cases gemma2,jamba
"""

import argparse
import json
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kvplan.capacity import Workload, capacity
from kvplan.dtypes import kv_dtype
from kvplan.engines import EngineOptions
from kvplan.errors import KvplanError
from kvplan.sources import load_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from host import cpu_flags  # noqa: E402

MiB = 1 << 20
LLAMA_CPP_PYTHON = "0.3.36"
VOCAB = 512  # a SentencePiece-style vocabulary: 3 control tokens, 256 byte tokens, the rest plain
GGML_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "iq4_nl": 20, "bf16": 30}
FLASH_ATTN = {"auto": -1, "off": 0, "on": 1}  # llama_flash_attn_type


# ----------------------------------------------------------------------------------------------- families


@dataclass
class Family:
    """One model: the config.json kvplan reads, the GGUF metadata llama.cpp reads, and the row widths (elements)
    llama.cpp gives each cache, to rebuild its bytes from the cells it logs: K and V per attention layer of the
    full and the sliding-window cache, R and S per recurrent layer."""

    name: str
    config: dict
    arch: str
    metadata: dict
    full: tuple[int, int] = (0, 0)
    swa: tuple[int, int] = (0, 0)
    recurrent: tuple[int, int] = (0, 0)
    recurrent_layers: int = 0  # llama.cpp's recurrent log line counts every layer, not the recurrent ones
    tensors: list | None = None  # (name, shape) of each tensor, where llama.cpp cannot save the architecture
    sparse: bool = False  # zero weights left a hole in the file: a model at a real checkpoint's widths (many GB)
    probe_experts: int = 0  # list the tensors for this many experts (the real count's would not fit in memory)


def gguf_keys(arch: str, **keys) -> dict:
    """`{arch}.key` for each key (dots written as __), beside the tokenizer."""
    out = {f"{arch}.{key.replace('__', '.')}": value for key, value in keys.items()}
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    tokens += [f"t{i}" for i in range(VOCAB - len(tokens))]
    return out | {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
                  "tokenizer.ggml.scores": [0.0] * VOCAB,
                  "tokenizer.ggml.token_type": [2, 3, 3] + [6] * 256 + [1] * (VOCAB - 259),
                  "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
                  "tokenizer.ggml.unknown_token_id": 0}


def attention_keys(hidden: int, layers: int, heads: int, kv_heads, head_dim: int, ff, ctx: int = 131072) -> dict:
    return dict(context_length=ctx, embedding_length=hidden, block_count=layers, feed_forward_length=ff,
                attention__head_count=heads, attention__head_count_kv=kv_heads, attention__key_length=head_dim,
                attention__value_length=head_dim, attention__layer_norm_rms_epsilon=1e-6, rope__freq_base=10000.0)


def hf(architecture: str, model_type: str, **fields) -> dict:
    return {"architectures": [architecture], "model_type": model_type, "vocab_size": VOCAB, "torch_dtype": "bfloat16",
            "rms_norm_eps": 1e-6, "max_position_embeddings": 131072, "tie_word_embeddings": False, **fields}


def llama(name: str, hidden: int, heads: int, kv_heads: int, head_dim: int, ff: int, vocab: int = VOCAB) -> Family:
    config = hf("LlamaForCausalLM", "llama", hidden_size=hidden, num_hidden_layers=2, num_attention_heads=heads,
                num_key_value_heads=kv_heads, head_dim=head_dim, intermediate_size=ff, vocab_size=vocab)
    metadata = gguf_keys("llama", **attention_keys(hidden, 2, heads, kv_heads, head_dim, ff),
                         rope__dimension_count=head_dim)
    if vocab != VOCAB:  # a larger vocabulary, for the logits in the compute buffer
        extra = vocab - VOCAB
        metadata["tokenizer.ggml.tokens"] += [f"u{i}" for i in range(extra)]
        metadata["tokenizer.ggml.scores"] += [0.0] * extra
        metadata["tokenizer.ggml.token_type"] += [1] * extra
    return Family(name, config, "llama", metadata, full=(kv_heads * head_dim, kv_heads * head_dim))


def gemma2() -> Family:
    hidden, layers, heads, kv, dim, window = 512, 4, 8, 4, 128, 512
    config = hf("Gemma2ForCausalLM", "gemma2", hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                num_key_value_heads=kv, head_dim=dim, intermediate_size=1024, sliding_window=window,
                query_pre_attn_scalar=dim, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True)
    metadata = gguf_keys("gemma2", **attention_keys(hidden, layers, heads, kv, dim, 1024),
                         attention__sliding_window=window, attn_logit_softcapping=50.0, final_logit_softcapping=30.0)
    return Family("gemma2", config, "gemma2", metadata, full=(kv * dim, kv * dim), swa=(kv * dim, kv * dim))


def gemma3() -> Family:
    hidden, layers, heads, kv, dim, window = 512, 6, 4, 1, 256, 512
    config = hf("Gemma3ForCausalLM", "gemma3_text", hidden_size=hidden, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=kv, head_dim=dim, intermediate_size=1024,
                sliding_window=window, sliding_window_pattern=6, query_pre_attn_scalar=dim,
                hidden_activation="gelu_pytorch_tanh", rope_theta=1000000.0, rope_local_base_freq=10000.0,
                tie_word_embeddings=True)
    metadata = gguf_keys("gemma3", **attention_keys(hidden, layers, heads, kv, dim, 1024),
                         attention__sliding_window=window)
    return Family("gemma3", config, "gemma3", metadata, full=(kv * dim, kv * dim), swa=(kv * dim, kv * dim))


def gpt_oss() -> Family:
    hidden, layers, heads, kv, dim, window = 512, 4, 8, 2, 64, 128
    config = hf("GptOssForCausalLM", "gpt_oss", hidden_size=hidden, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=kv, head_dim=dim, intermediate_size=256,
                sliding_window=window, num_local_experts=4, num_experts_per_tok=2, experts_per_token=2,
                layer_types=["sliding_attention", "full_attention"] * (layers // 2))
    metadata = gguf_keys("gpt-oss", **attention_keys(hidden, layers, heads, kv, dim, 256),
                         attention__sliding_window=window, expert_count=4, expert_used_count=2,
                         expert_feed_forward_length=256)
    return Family("gpt-oss", config, "gpt-oss", metadata, full=(kv * dim, kv * dim), swa=(kv * dim, kv * dim))


def olmo3() -> Family:
    """Every layer in one window (an explicit pattern; Olmo 3's own has every fourth layer global)."""
    hidden, layers, heads, kv, dim, window = 512, 2, 8, 8, 64, 256
    config = hf("Olmo3ForCausalLM", "olmo3", hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                num_key_value_heads=kv, intermediate_size=1024, sliding_window=window,
                layer_types=["sliding_attention"] * layers)
    metadata = gguf_keys("olmo2", **attention_keys(hidden, layers, heads, kv, dim, 1024),
                         attention__sliding_window=window, attention__sliding_window_pattern=[True] * layers)
    return Family("olmo3 all-SWA", config, "olmo2", metadata, swa=(kv * dim, kv * dim))


def deepseek2(name: str = "deepseek2 MLA", hidden: int = 512, heads: int = 8, q_rank: int = 256,
              mla: tuple = (512, 64, 128, 128), ff: int = 1024, experts: tuple = (4, 2, 128),
              layers: int = 2, sparse: bool = False, probe_experts: int = 0) -> Family:
    """MLA (`mla`: latent, RoPE, nope and V head sizes, queries down-projected to `q_rank`, or projected whole where
    it is 0), a dense MLP of `ff` on the first layer, `experts` (count, per token, width) beside a shared one on
    the others."""
    rank, rope, nope, v = mla
    config = hf("DeepseekV2ForCausalLM", "deepseek_v2", hidden_size=hidden, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=heads, q_lora_rank=q_rank or None, kv_lora_rank=rank,
                qk_rope_head_dim=rope, qk_nope_head_dim=nope, v_head_dim=v, intermediate_size=ff,
                moe_intermediate_size=experts[2], n_routed_experts=experts[0], num_experts_per_tok=experts[1],
                n_shared_experts=1, first_k_dense_replace=1, moe_layer_freq=1, topk_method="greedy", n_group=1,
                topk_group=1)
    metadata = gguf_keys("deepseek2", **attention_keys(hidden, layers, heads, 1, rank + rope, ff)
                         | dict(attention__value_length=rank), attention__q_lora_rank=q_rank,
                         attention__key_length_mla=nope + rope,
                         attention__value_length_mla=v, attention__kv_lora_rank=rank, rope__dimension_count=rope,
                         leading_dense_block_count=1, expert_count=experts[0], expert_used_count=experts[1],
                         expert_shared_count=1, expert_feed_forward_length=experts[2], expert_weights_scale=1.0)
    return Family(name, config, "deepseek2", metadata, full=(rank + rope, 0), sparse=sparse,
                  probe_experts=probe_experts)


def jamba() -> Family:
    hidden, layers, heads, kv, d_state, d_conv, expand = 512, 8, 8, 2, 16, 4, 2
    config = hf("JambaForCausalLM", "jamba", hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                num_key_value_heads=kv, intermediate_size=1024, attn_layer_period=8, attn_layer_offset=4,
                expert_layer_period=2, expert_layer_offset=1, num_experts=4, num_experts_per_tok=2,
                mamba_d_state=d_state, mamba_d_conv=d_conv, mamba_expand=expand, mamba_dt_rank=32)
    inner = expand * hidden
    metadata = gguf_keys("jamba", **attention_keys(hidden, layers, heads, [kv if i == 4 else 0 for i in range(8)],
                                                   hidden // heads, 1024),
                         ssm__conv_kernel=d_conv, ssm__inner_size=inner, ssm__state_size=d_state,
                         ssm__time_step_rank=32, expert_count=4, expert_used_count=2)
    dim = hidden // heads
    return Family("jamba", config, "jamba", metadata, full=(kv * dim, kv * dim),
                  recurrent=((d_conv - 1) * inner, d_state * inner), recurrent_layers=layers - 1)


def gated_deltanet(name: str, architecture: str, model_type: str, arch: str, experts: tuple = (),
                   hidden: int = 512, heads: int = 8, kv: int = 2, dim: int = 128, ff: int = 1024,
                   linear: tuple = (4, 8, 64, 64), sparse: bool = False) -> Family:
    """Gated DeltaNet on layers 0-2 (`linear`: key heads, value heads, key and value head sizes), attention on layer
    3; a dense MLP of `ff`, or `experts` (count, per token, width, the shared expert's width)."""
    layers, kernel = 4, 4
    k_heads, v_heads, k_dim, v_dim = linear
    fields = dict(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
                  head_dim=dim, intermediate_size=ff, full_attention_interval=4, linear_conv_kernel_dim=kernel,
                  linear_key_head_dim=k_dim, linear_value_head_dim=v_dim, linear_num_key_heads=k_heads,
                  linear_num_value_heads=v_heads, partial_rotary_factor=0.25,
                  layer_types=["linear_attention"] * (layers - 1) + ["full_attention"])
    keys = dict(ssm__conv_kernel=kernel, ssm__state_size=k_dim, ssm__group_count=k_heads,
                ssm__time_step_rank=v_heads, ssm__inner_size=v_dim * v_heads, full_attention_interval=4,
                rope__dimension_count=dim // 4)
    if experts:
        fields |= dict(num_experts=experts[0], num_experts_per_tok=experts[1], moe_intermediate_size=experts[2],
                       shared_expert_intermediate_size=experts[3], decoder_sparse_step=1, mlp_only_layers=[])
        keys |= dict(expert_count=experts[0], expert_used_count=experts[1], expert_feed_forward_length=experts[2],
                     expert_shared_feed_forward_length=experts[3])
    if arch.startswith("qwen35"):
        keys |= dict(rope__dimension_sections=[11, 11, 10, 0])
    metadata = gguf_keys(arch, **attention_keys(hidden, layers, heads, kv, dim, ff), **keys)
    inner = v_dim * v_heads
    return Family(name, hf(architecture, model_type, **fields), arch, metadata, full=(kv * dim, kv * dim),
                  recurrent=((kernel - 1) * (inner + 2 * k_heads * k_dim), k_dim * inner), recurrent_layers=layers - 1,
                  sparse=sparse)


def nemotron_h() -> Family:
    hidden, heads, kv, dim, m_heads, m_dim, groups, d_state, kernel = 512, 8, 2, 64, 16, 32, 2, 64, 4
    pattern = "M-M*"
    config = hf("NemotronHForCausalLM", "nemotron_h", hidden_size=hidden, num_hidden_layers=len(pattern),
                hybrid_override_pattern=pattern, num_attention_heads=heads, num_key_value_heads=kv, head_dim=dim,
                intermediate_size=1024, mamba_num_heads=m_heads, mamba_head_dim=m_dim, n_groups=groups,
                ssm_state_size=d_state, conv_kernel=kernel, mlp_hidden_act="relu2", layer_norm_epsilon=1e-5)
    inner = m_heads * m_dim
    keys = attention_keys(hidden, len(pattern), heads, [kv if c == "*" else 0 for c in pattern], dim,
                          [1024 if c == "-" else 0 for c in pattern])
    metadata = gguf_keys("nemotron_h", **keys, attention__layer_norm_epsilon=1e-5, ssm__conv_kernel=kernel,
                         ssm__inner_size=inner, ssm__state_size=d_state, ssm__time_step_rank=m_heads,
                         ssm__group_count=groups)
    return Family("nemotron_h", config, "nemotron_h", metadata, full=(kv * dim, kv * dim),
                  recurrent=((kernel - 1) * (inner + 2 * groups * d_state), d_state * inner),
                  recurrent_layers=pattern.count("M"))


def mamba() -> Family:
    hidden, d_state, kernel, expand = 512, 16, 4, 2
    config = hf("MambaForCausalLM", "mamba", hidden_size=hidden, num_hidden_layers=2, state_size=d_state,
                conv_kernel=kernel, expand=expand, time_step_rank=32, intermediate_size=expand * hidden,
                layer_norm_epsilon=1e-5)
    inner = expand * hidden
    metadata = gguf_keys("mamba", context_length=1 << 20, embedding_length=hidden, block_count=2,
                         feed_forward_length=0, attention__head_count=0, attention__layer_norm_rms_epsilon=1e-5,
                         ssm__conv_kernel=kernel, ssm__inner_size=inner, ssm__state_size=d_state,
                         ssm__time_step_rank=32)
    return Family("mamba", config, "mamba", metadata, recurrent=((kernel - 1) * inner, d_state * inner),
                  recurrent_layers=2)


def gemma3n(name: str = "gemma3n", hidden: int = 256, ff: int = 512) -> Family:
    """22 layers, so that llama.cpp's 20 layers with a KV cache leave 2 that reuse one; the file says 5
    (attention.shared_kv_layers), which llama.cpp does not read. kvplan reads the GGUF."""
    layers, heads, kv, dim, window = 22, 4, 2, 64, 128
    config = hf("Gemma3nForCausalLM", "gemma3n_text", hidden_size=hidden, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=kv, head_dim=dim, intermediate_size=ff)
    metadata = gguf_keys("gemma3n", **attention_keys(hidden, layers, heads, kv, dim, ff),
                         attention__sliding_window=window, attention__shared_kv_layers=5,
                         attention__sliding_window_pattern=[i % 5 != 4 for i in range(layers)])
    return Family(name, config, "gemma3n", metadata, full=(kv * dim, kv * dim), swa=(kv * dim, kv * dim),
                  tensors=gemma3n_tensors(hidden, layers, heads * dim, kv * dim, dim, ff))


def gemma3n_tensors(hidden: int, layers: int, q: int, kv: int, dim: int, ff: int) -> list:
    """`llama_model_gemma3n::load_arch_tensors` (src/models/gemma3n.cpp), whose architecture llama.cpp's model saver
    does not write: altup of 4 inputs, per-layer inputs of 256, laurel of rank 64 (llama_hparams defaults)."""
    altup, per_layer, laurel = 4, 256, 64
    out = [("token_embd.weight", [hidden, VOCAB]), ("altup_proj.weight", [hidden, hidden, altup - 1]),
           ("altup_unembd_proj.weight", [hidden, hidden, altup - 1]),
           ("per_layer_token_embd.weight", [per_layer * layers, VOCAB]),
           ("per_layer_model_proj.weight", [hidden, per_layer * layers]), ("per_layer_proj_norm.weight", [per_layer]),
           ("output_norm.weight", [hidden])]
    shapes = {"attn_norm": [hidden], "attn_q": [hidden, q], "attn_k": [hidden, kv], "attn_v": [hidden, kv],
              "attn_output": [q, hidden], "attn_q_norm": [dim], "attn_k_norm": [dim],
              "post_attention_norm": [hidden], "ffn_norm": [hidden], "ffn_gate": [hidden, ff], "ffn_up": [hidden, ff],
              "ffn_down": [ff, hidden], "post_ffw_norm": [hidden], "inp_gate": [hidden, per_layer],
              "proj": [per_layer, hidden], "post_norm": [hidden], "altup_correct_coef": [altup, altup],
              "altup_correct_scale": [hidden], "altup_predict_coef": [altup, altup * altup],
              "altup_router": [hidden, altup], "altup_router_norm": [hidden], "laurel_l": [hidden, laurel],
              "laurel_r": [laurel, hidden], "laurel_post_norm": [hidden]}
    return out + [(f"blk.{i}.{name}.weight", shape) for i in range(layers) for name, shape in shapes.items()]


def gemma4() -> Family:
    """Sliding layers 2 KV heads of 64, full ones (5 and 7) 1 of 128; the last 2 layers reuse layers 4 and 5.
    kvplan reads the GGUF."""
    hidden, layers, heads, window = 256, 8, 4, 128
    swa = [i not in (5, 7) for i in range(layers)]
    config = hf("Gemma4ForCausalLM", "gemma4_text", hidden_size=hidden, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=2, head_dim=64, intermediate_size=512)
    keys = attention_keys(hidden, layers, heads, [2 if s else 1 for s in swa], 128, 512)
    metadata = gguf_keys("gemma4", **keys, attention__key_length_swa=64, attention__value_length_swa=64,
                         attention__sliding_window=window, attention__sliding_window_pattern=swa,
                         attention__shared_kv_layers=2, embedding_length_per_layer_input=0,
                         rope__dimension_count=128, rope__dimension_count_swa=64)
    return Family("gemma4", config, "gemma4", metadata, full=(128, 128), swa=(2 * 64, 2 * 64))


def kimi_linear(name: str = "kimi-linear", hidden: int = 256, heads: int = 4, kda: int = 64, ff: int = 512,
                mla: tuple = (64, 32, 64, 64), experts: tuple = (4, 2, 128), scale: float = 1.0,
                sparse: bool = False) -> Family:
    """KDA on layers 0-2 (4 heads of 64 unless given, a convolution of 4), MLA on layer 3 (`mla`: latent, RoPE,
    nope and V head sizes), one dense layer of `ff` then `experts` (count, per token, width) beside a shared one;
    kvplan reads the GGUF."""
    layers, kernel = 4, 4
    rank, rope, nope, v = mla
    config = hf("KimiLinearForCausalLM", "kimi_linear", hidden_size=hidden, num_hidden_layers=layers)
    keys = attention_keys(hidden, layers, heads, [0, 0, 0, 1], rank + rope, ff)
    metadata = gguf_keys("kimi-linear", **keys, attention__kv_lora_rank=rank, attention__key_length_mla=nope + rope,
                         attention__value_length_mla=v, rope__dimension_count=rope, ssm__conv_kernel=kernel,
                         kda__head_dim=kda, expert_count=experts[0], expert_used_count=experts[1],
                         expert_feed_forward_length=experts[2], expert_shared_count=1, leading_dense_block_count=1,
                         expert_gating_func=2, expert_weights_scale=scale)
    return Family(name, config, "kimi-linear", metadata, full=(rank + rope, 0),
                  recurrent=(3 * (kernel - 1) * heads * kda, kda * kda * heads), recurrent_layers=3, sparse=sparse)


def qwen3moe(name: str, hidden: int, heads: int, kv: int, dim: int, experts: tuple, sparse: bool = False) -> Family:
    """Two layers of attention and `experts` (count, per token, width), no shared expert; kvplan reads the GGUF."""
    layers = 2
    metadata = gguf_keys("qwen3moe", **attention_keys(hidden, layers, heads, kv, dim, experts[2]),
                         expert_count=experts[0], expert_used_count=experts[1], expert_feed_forward_length=experts[2],
                         rope__dimension_count=dim)
    config = hf("Qwen3MoeForCausalLM", "qwen3_moe", hidden_size=hidden, num_hidden_layers=layers)
    return Family(name, config, "qwen3moe", metadata, full=(kv * dim, kv * dim), sparse=sparse)


def minimax01(name: str = "minimax-01", hidden: int = 256, heads: int = 4, dim: int = 64) -> Family:
    """Lightning attention on 7 layers of 8 (4 heads of 64 unless given), softmax attention on layer 7 (2 KV heads), 4
    experts; kvplan reads the GGUF."""
    layers, kv = 8, 2
    config = hf("MiniMaxText01ForCausalLM", "minimax", hidden_size=hidden, num_hidden_layers=layers)
    metadata = gguf_keys("minimax-01", **attention_keys(hidden, layers, heads, kv, dim, 256), residual_scale=1.0,
                         expert_count=4, expert_used_count=2, rope__dimension_count=dim // 2)
    return Family(name, config, "minimax-01", metadata, full=(kv * dim, kv * dim),
                  recurrent=(0, dim * dim * heads), recurrent_layers=layers - 1)


FAMILIES = {f.name: f for f in (
    llama("MQA head 80", 640, 8, 1, 80, 1024), gemma3n(), gemma4(), kimi_linear(), minimax01(),
    gemma3n("gemma3n E 2048", 2048, 4096), kimi_linear("kimi-linear 4 x 128", 512, 4, 128),
    minimax01("minimax-01 8 x 128", 1024, 8, 128),
    # real checkpoints' widths on few layers (model_specs/*.json; vocabulary 512, zero weights in a sparse file)
    kimi_linear("Kimi-Linear-48B widths", 2304, 32, 128, 9216, (512, 64, 128, 128), (256, 8, 1024), 2.446, True),
    qwen3moe("Qwen3-30B-A3B widths", 2048, 32, 4, 128, (128, 8, 768), sparse=True),
    deepseek2("DeepSeek-V3 widths", 7168, 128, 1536, (512, 64, 128, 128), 18432, (256, 8, 2048), sparse=True,
              probe_experts=16),
    deepseek2("DeepSeek-V2-Lite widths", 2048, 16, 0, (512, 64, 128, 128), 10944, (64, 6, 1408), sparse=True),
    deepseek2("deepseek2 MLA 1024", 1024, 16, 384, (256, 32, 64, 64), 2048, (8, 2, 256)),
    llama("dense GQA", 2048, 16, 4, 128, 5632, vocab=32000), llama("MQA", 1024, 8, 1, 128, 2816),
    llama("head 80", 640, 8, 8, 80, 1024), llama("draft", 512, 8, 2, 64, 1024, vocab=32000), gemma2(), gemma3(),
    gpt_oss(), olmo3(), deepseek2(), jamba(),
    gated_deltanet("qwen3next", "Qwen3NextForCausalLM", "qwen3_next", "qwen3next", (4, 2, 128, 128)),
    gated_deltanet("qwen35", "Qwen3_5ForCausalLM", "qwen3_5_text", "qwen35"),
    # real checkpoints' widths (model_specs/Qwen__Qwen3.5-27B.json, Qwen__Qwen3.5-35B-A3B.json)
    gated_deltanet("Qwen3.5-27B widths", "Qwen3_5ForCausalLM", "qwen3_5_text", "qwen35", hidden=5120, heads=24,
                   kv=4, dim=256, ff=17408, linear=(16, 48, 128, 128), sparse=True),
    gated_deltanet("Qwen3.5-35B-A3B widths", "Qwen3_5MoeForCausalLM", "qwen3_5_moe_text", "qwen35moe",
                   (256, 8, 512, 512), hidden=2048, heads=16, kv=2, dim=256, linear=(16, 32, 128, 128), sparse=True),
    nemotron_h(), mamba())}


# -------------------------------------------------------------------------------------------------- cases


@dataclass
class Case:
    """One llama.cpp context: n_seq_max sequences of ctx tokens each (n_ctx = seqs x ctx)."""

    family: str
    ctx: int
    seqs: int = 1
    unified: bool = True
    swa_full: bool = False
    flash_attn: str = "on"
    type_k: str = "f16"
    type_v: str = "f16"
    ubatch: int = 512
    batch: int = 2048
    rs_seq: int = 0
    refused: str = ""  # the reason llama.cpp gives, where it refuses the context
    frontend: str | None = None  # kvplan is given this --frontend alone; llama.cpp that front end's settings
    draft: str | None = None  # a draft model's family: llama-server's draft context beside the model's
    gguf: bool = False  # kvplan reads the GGUF llama.cpp runs, not the config.json

    @property
    def label(self) -> str:
        parts = [f"{self.seqs} x {self.ctx:,}", "unified" if self.unified else "per-slot", f"fa {self.flash_attn}",
                 f"ub {self.ubatch}"]
        if self.batch != 2048:
            parts.append(f"b {self.batch}")
        if self.swa_full:
            parts.append("swa_full")
        if (self.type_k, self.type_v) != ("f16", "f16"):
            parts.append(f"K {self.type_k} V {self.type_v}")
        if self.rs_seq:
            parts.append(f"n_rs_seq {self.rs_seq}")
        if self.frontend:
            parts.append(f"kvplan --frontend {self.frontend}")
        if self.draft:
            parts.append(f"draft {self.draft}")
        if self.gguf:
            parts.append("kvplan reads the GGUF")
        return ", ".join(parts)

    def source(self, built: Path) -> Path:
        """What kvplan reads of the family's `built` GGUF: the GGUF itself, or the config.json beside it."""
        return built if self.gguf else built.with_name("config.json")


def sliding(family: str) -> list[Case]:
    """Micro-batches of 256 and 1024 tokens, one and four sequences (unified and per slot), --swa-full."""
    return [Case(family, 8192, ubatch=256), Case(family, 8192, ubatch=1024, batch=1024),
            Case(family, 4096, seqs=4, ubatch=256), Case(family, 4096, seqs=4, unified=False, ubatch=1024),
            Case(family, 4096, seqs=4, swa_full=True), Case(family, 8192, flash_attn="off")]


QWEN35_WIDTHS = ("Qwen3.5-27B widths", "Qwen3.5-35B-A3B widths")
CASES = [
    # dense: the compute buffer with and without flash attention at several n_ctx; unified vs per-slot scores
    Case("dense GQA", 4096), Case("dense GQA", 16384), Case("dense GQA", 4096, flash_attn="off"),
    Case("dense GQA", 16384, flash_attn="off"), Case("dense GQA", 4096, seqs=4, flash_attn="off"),
    Case("dense GQA", 4096, seqs=4, unified=False, flash_attn="off"), Case("dense GQA", 8192, ubatch=1024),
    Case("dense GQA", 8192, ubatch=256, flash_attn="off"), Case("dense GQA", 300, batch=256),
    Case("dense GQA", 8192, type_k="q8_0", type_v="f16"), Case("dense GQA", 8192, type_k="f16", type_v="q4_0"),
    Case("dense GQA", 8192, type_k="q4_1", type_v="iq4_nl"), Case("dense GQA", 8192, type_k="bf16", type_v="q5_1"),
    Case("dense GQA", 8192, type_k="q8_0", type_v="q8_0", flash_attn="off",
         refused="quantized V cache requires flash_attn to be enabled"),
    Case("dense GQA", 16, seqs=300, refused="n_seq_max must be <= 256"),
    Case("dense GQA", 16, seqs=256), Case("dense GQA", 8192, flash_attn="auto"),
    Case("MQA", 8192, seqs=2, unified=False), Case("MQA", 8192, type_k="q4_0", type_v="q4_0"),
    Case("head 80", 4096, type_k="q8_0", type_v="q8_0",
         refused="K cache type q8_0 with block size 32 does not divide n_embd_head_k=80"),
    Case("head 80", 4096, type_k="f16", type_v="q4_0",
         refused="V cache type q4_0 with block size 32 does not divide n_embd_head_v=80"),
    Case("head 80", 4096, type_k="q8_0", type_v="f16", flash_attn="off"),
    *sliding("gemma2"), *sliding("gemma3"), *sliding("gpt-oss"),
    # llama-cpp-python's Llama(n_ctx=8192): n_batch 512, flash attention off, the C API's swa_full and per-slot cache
    Case("gemma3", 8192, unified=False, swa_full=True, flash_attn="off", batch=512, frontend="python"),
    Case("olmo3 all-SWA", 8192, seqs=2), Case("olmo3 all-SWA", 8192, seqs=2, swa_full=True),
    Case("deepseek2 MLA", 8192), Case("deepseek2 MLA", 8192, type_k="q8_0", type_v="q8_0"),
    Case("deepseek2 MLA", 8192, flash_attn="off"),
    Case("deepseek2 MLA", 8192, type_k="q8_0", type_v="f16",
         refused="model does not support different K (q8_0) and V (f16) cache types"),
    Case("jamba", 4096, seqs=4), Case("jamba", 4096, seqs=4, rs_seq=3),
    Case("jamba", 4096, seqs=2, type_k="q8_0", type_v="f16"),
    Case("qwen3next", 4096, seqs=2), Case("qwen3next", 4096, seqs=2, rs_seq=3),
    Case("qwen35", 4096, seqs=2), Case("qwen35", 4096, seqs=2, rs_seq=3), Case("qwen35", 4096, seqs=3, rs_seq=5),
    Case("nemotron_h", 4096, seqs=4, rs_seq=3), Case("nemotron_h", 4096, seqs=1),
    Case("nemotron_h", 4096, seqs=2, type_k="q8_0", type_v="q4_0"),
    Case("mamba", 4096, seqs=3), Case("mamba", 4096, seqs=3, rs_seq=3),
    # llama-server -md: the draft context beside the model's
    Case("dense GQA", 4096, draft="draft"), Case("dense GQA", 4096, seqs=4, draft="draft"),
    Case("dense GQA", 4096, seqs=4, unified=False, flash_attn="off", draft="draft"),
    Case("dense GQA", 8192, type_k="q8_0", type_v="q8_0", ubatch=256, draft="draft"),
    Case("gemma3", 4096, seqs=2, draft="MQA"), Case("qwen35", 4096, seqs=2, draft="MQA"),
    # K rows of partial blocks: llama.cpp aborts making the cache (1 KV head of 80); 8 of 80 are made (above)
    Case("MQA head 80", 4096, type_k="q8_0", flash_attn="off",
         refused="GGML_ASSERT"),
    # GGUFs read as llama.cpp loads them
    *(Case(name, 4096, seqs=2, gguf=True) for name in ("gemma3n", "gemma4", "kimi-linear", "minimax-01")),
    Case("gemma3n", 8192, ubatch=256, gguf=True), Case("gemma4", 4096, seqs=2, unified=False, gguf=True),
    Case("kimi-linear", 4096, seqs=2, flash_attn="off", gguf=True), Case("minimax-01", 8192, gguf=True),
    # their own graphs' terms, at other micro-batches and widths (hidden, KDA and lightning heads)
    Case("gemma3n", 4096, ubatch=1024, batch=1024, gguf=True),
    Case("gemma3n", 4096, seqs=2, flash_attn="off", gguf=True),
    Case("gemma3n E 2048", 4096, seqs=2, gguf=True), Case("gemma3n E 2048", 8192, ubatch=256, gguf=True),
    Case("gemma3n E 2048", 4096, seqs=2, flash_attn="off", gguf=True),
    Case("kimi-linear", 8192, ubatch=256, gguf=True), Case("kimi-linear", 4096, ubatch=1024, batch=1024, gguf=True),
    Case("kimi-linear 4 x 128", 4096, seqs=2, gguf=True), Case("kimi-linear 4 x 128", 8192, ubatch=256, gguf=True),
    Case("minimax-01", 8192, ubatch=256, gguf=True), Case("minimax-01", 4096, ubatch=1024, batch=1024, gguf=True),
    Case("minimax-01", 4096, seqs=2, flash_attn="off", gguf=True),
    Case("minimax-01 8 x 128", 4096, seqs=2, gguf=True), Case("minimax-01 8 x 128", 8192, ubatch=256, gguf=True),
    Case("minimax-01 8 x 128", 4096, seqs=2, flash_attn="off", gguf=True),
    # the routed experts' moment at real widths: the experts' outputs above their SwiGLU
    *(Case(name, 4096, seqs=2, gguf=True) for name in ("Kimi-Linear-48B widths", "Qwen3-30B-A3B widths")),
    *(Case(name, 8192, ubatch=256, gguf=True) for name in ("Kimi-Linear-48B widths", "Qwen3-30B-A3B widths")),
    Case("Kimi-Linear-48B widths", 4096, seqs=2, flash_attn="off", gguf=True),
    Case("Qwen3-30B-A3B widths", 4096, ubatch=1024, batch=1024, gguf=True),
    # MLA's queries absorbed into the latent (src/models/deepseek2.cpp), at another width and at DeepSeek's own
    Case("deepseek2 MLA 1024", 8192), Case("deepseek2 MLA 1024", 8192, ubatch=256),
    Case("deepseek2 MLA 1024", 4096, ubatch=1024, batch=1024),
    Case("deepseek2 MLA 1024", 4096, seqs=2, flash_attn="off"),
    *(Case(name, 8192, gguf=True) for name in ("DeepSeek-V3 widths", "DeepSeek-V2-Lite widths")),
    Case("DeepSeek-V3 widths", 8192, ubatch=256, gguf=True),
    *(Case(name, 4096, seqs=2, flash_attn="off", gguf=True) for name in ("DeepSeek-V3 widths",
                                                                           "DeepSeek-V2-Lite widths")),
    # Gated DeltaNet's states (n_rs_seq rollback rows) at Qwen3.5's real widths
    *(Case(name, 4096, seqs=2, gguf=True) for name in QWEN35_WIDTHS),
    *(Case(name, 4096, seqs=4, rs_seq=3, gguf=True) for name in QWEN35_WIDTHS),
    *(Case(name, 8192, ubatch=256, gguf=True) for name in QWEN35_WIDTHS),
    *(Case(name, 4096, seqs=2, flash_attn="off", gguf=True) for name in QWEN35_WIDTHS),
]


# ---------------------------------------------------------------------------------------------- llama.cpp

CHILD = r'''
import ctypes, json, os, pathlib, sys
args = json.loads(sys.stdin.read())
import numpy as np
import gguf
import llama_cpp

logs, last = [], [0]


@llama_cpp.llama_log_callback
def on_log(level, text, user_data):
    if level != 5:  # GGML_LOG_LEVEL_CONT continues the line before
        last[0] = level
    if last[0] != 1:  # GGML_LOG_LEVEL_DEBUG
        logs.append(text.decode("utf-8", "replace"))


llama_cpp.llama_log_set(on_log, ctypes.c_void_p(0))
llama_cpp.llama_backend_init()


def write_gguf(path, arch, metadata, tensors=(), rng=None):
    """Random weights from `rng`; without one, zero weights left a hole in the file (a sparse file)."""
    writer = gguf.GGUFWriter(path, arch)
    for key, value in metadata.items():
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value[0], int) and not isinstance(value[0], bool):
            writer.add_key_value(key, value, gguf.GGUFValueType.ARRAY, sub_type=gguf.GGUFValueType.INT32)
        else:
            writer.add_array(key, value)
    for name, shape in tensors:  # f32 vectors, f16 matrices
        dtype = np.dtype(np.float32 if len(shape) == 1 else np.float16)
        if rng is None:
            writer.add_tensor_info(name, list(reversed(shape)), dtype, int(np.prod(shape)) * dtype.itemsize)
        else:
            weights = rng.standard_normal(tuple(reversed(shape)), dtype=np.float32) * 0.02
            writer.add_tensor(name, weights.astype(dtype))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    if rng is None and tensors:
        writer.write_ti_data_to_file()
        end, align = writer.fout[0].tell(), writer.data_alignment
        writer.close()
        nbytes = [int(np.prod(shape)) * (4 if len(shape) == 1 else 2) for _, shape in tensors]
        data = sum(-(-n // align) * align for n in nbytes)
        os.truncate(path, -(-end // align) * align + data)
        return
    writer.write_tensors_to_file()
    writer.close()


class GgufInitParams(ctypes.Structure):
    _fields_ = [("no_alloc", ctypes.c_bool), ("ctx", ctypes.c_void_p)]


def tensors_wanted(meta_path):
    """The tensors llama.cpp's loader creates for the metadata, saved by llama.cpp and read back."""
    base = ctypes.CDLL(str(pathlib.Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
    base.gguf_init_from_file.restype = ctypes.c_void_p
    base.gguf_init_from_file.argtypes = [ctypes.c_char_p, GgufInitParams]
    meta = base.gguf_init_from_file(meta_path.encode(), GgufInitParams(True, None))
    params = llama_cpp.llama_model_default_params()
    params.n_gpu_layers = 0
    keep = llama_cpp.llama_model_set_tensor_data_t(lambda tensor, userdata: None)
    model = llama_cpp.llama_model_init_from_user(meta, keep, None, params)
    if not model:
        print("ORACLE " + json.dumps({"error": "".join(logs)[-2000:]}), flush=True)
        raise SystemExit(1)
    llama_cpp.llama_model_save_to_file(model, (meta_path + ".saved").encode())
    llama_cpp.llama_model_free(model)
    return [(t.name, [int(n) for n in t.shape]) for t in gguf.GGUFReader(meta_path + ".saved").tensors]


if args["mode"] == "tensors":
    write_gguf(args["path"] + ".meta", args["arch"], args["metadata"])
    print("ORACLE " + json.dumps({"tensors": tensors_wanted(args["path"] + ".meta")}), flush=True)
elif args["mode"] == "build":
    write_gguf(args["path"] + ".meta", args["arch"], args["metadata"])
    tensors = args.get("tensors") or tensors_wanted(args["path"] + ".meta")
    write_gguf(args["path"], args["arch"], args["metadata"], tensors,
               None if args.get("sparse") else np.random.default_rng(0))
    print("ORACLE " + json.dumps({"tensors": len(tensors)}), flush=True)
else:
    mparams = llama_cpp.llama_model_default_params()
    mparams.n_gpu_layers = 0
    model = llama_cpp.llama_model_load_from_file(args["path"].encode(), mparams)
    ok = False
    if model:
        cparams = llama_cpp.llama_context_default_params()
        for key, value in args["context"].items():
            setattr(cparams, key, value)
        cparams.n_threads = cparams.n_threads_batch = 1
        ctx = llama_cpp.llama_init_from_model(model, cparams)
        ok = bool(ctx)
    out = {"ok": ok, "log": "".join(logs)}
    if ok and args.get("draft"):  # llama-server's draft context (common_speculative_init_result)
        del logs[:]
        draft = llama_cpp.llama_model_load_from_file(args["draft"].encode(), mparams)
        cparams.n_ctx = llama_cpp.llama_n_ctx(ctx)
        cparams.type_k = cparams.type_v = 1  # f16: -ctkd, -ctvd
        cparams.n_rs_seq = 0
        cparams.n_outputs_max, cparams.n_outputs_max_per_seq = cparams.n_seq_max, 1
        cparams.ctx_other = ctx
        out["draft_ok"] = bool(draft) and bool(llama_cpp.llama_init_from_model(draft, cparams))
        out["draft_log"] = "".join(logs)
    print("ORACLE " + json.dumps(out), flush=True)
'''


def child(python: str, args: dict) -> dict:
    done = subprocess.run([python, "-c", CHILD], input=json.dumps(args), capture_output=True, text=True, timeout=600)
    for line in done.stdout.splitlines():
        if line.startswith("ORACLE "):
            return json.loads(line.removeprefix("ORACLE "))
    abort = ABORT.search(done.stderr)
    if args["mode"] == "run" and abort:  # llama.cpp aborted making the context: its refusal, in its words
        return {"ok": False, "log": f"llama_init_from_model: {abort[0]}"}
    raise RuntimeError(f"llama.cpp child failed: {(done.stderr.strip().splitlines() or ['no output'])[-1]}")


def build(python: str, family: Family, directory: Path) -> Path:
    """The family's GGUF (random weights; zero weights in a sparse file for a `sparse` family) and config.json, in
    `directory`."""
    path = directory / "model.gguf"
    tensors = family.tensors
    if family.probe_experts:  # llama.cpp's loader makes (allocates) every tensor: list them for fewer experts
        count, key = family.metadata[f"{family.arch}.expert_count"], f"{family.arch}.expert_count"
        probe = child(python, {"mode": "tensors", "path": str(directory / "probe.gguf"), "arch": family.arch,
                               "metadata": family.metadata | {key: family.probe_experts}})["tensors"]
        tensors = [(name, [count if n == family.probe_experts and re.search("exp|gate_inp", name) else n
                           for n in shape]) for name, shape in probe]
    built = child(python, {"mode": "build", "path": str(path), "arch": family.arch, "metadata": family.metadata,
                           "tensors": tensors, "sparse": family.sparse})
    if "error" in built:
        raise RuntimeError(f"llama.cpp's loader refused the {family.name} metadata: {built['error'][-300:]}")
    (directory / "config.json").write_text(json.dumps(family.config), encoding="utf-8")
    return path


def context_params(case: Case) -> dict:
    """The model's context. A llama-server case (every case but llama-cpp-python's) also gets the server's output
    limits (`server_output_limits`, tools/server/server-context.cpp, from `common_speculative_get_output_limits`):
    n_outputs_max = min(n_batch, slots x (1 + draft tokens)), n_outputs_max_per_seq = min(n_batch, 1 + draft
    tokens), the draft tokens being n_rs_seq's speculative length, or a draft model's default n_max of 3."""
    params = {"n_ctx": case.seqs * case.ctx, "n_seq_max": case.seqs, "kv_unified": case.unified,
              "swa_full": case.swa_full, "flash_attn_type": FLASH_ATTN[case.flash_attn],
              "type_k": GGML_TYPES[case.type_k], "type_v": GGML_TYPES[case.type_v], "n_ubatch": case.ubatch,
              "n_batch": case.batch, "n_rs_seq": case.rs_seq}
    if case.frontend != "python":
        per_seq = 1 + (case.rs_seq or (3 if case.draft else 0))
        params |= {"n_outputs_max": min(case.batch, case.seqs * per_seq),
                   "n_outputs_max_per_seq": min(case.batch, per_seq)}
    return params


KV_LINE = re.compile(r"llama_kv_cache: size = +([\d.]+) MiB \( *(\d+) cells, +(\d+) layers, +(\d+)/(\d+) seqs\), "
                     r"K \((\w+)\): +([\d.]+) MiB, V \((\w+)\): +([\d.]+) MiB")
ISWA_LINE = re.compile(r"llama_kv_cache_iswa: creating +(non-SWA|SWA) KV cache, size = (\d+) cells")
RS_LINE = re.compile(r"llama_memory_recurrent: size = +([\d.]+) MiB \( *(\d+) cells, +(\d+) layers, +(\d+) seqs +"
                     r"(\d+) rs_seq\), R \((\w+)\): +([\d.]+) MiB, S \((\w+)\): +([\d.]+) MiB")
COMPUTE_LINE = re.compile(r"CPU compute buffer size = +([\d.]+) MiB")
ABORT = re.compile(r"GGML_ASSERT\(.*\) failed")
REFUSAL = re.compile(r"(?:llama_init_from_model|llama_context): (?:failed to initialize the context: )?(.*)")


def row_bytes(type_name: str, elements: int) -> int:
    """ggml_row_size: whole blocks of the type."""
    return kv_dtype(type_name).bytes_for(elements)


def llama_cpp_bytes(family: Family, log: str) -> dict:
    """llama.cpp's KV and recurrent bytes rebuilt from the cells, layers and streams it logs, each checked to
    round to the MiB it logs beside them; and its compute buffer (MiB, two decimals)."""
    out = {"kv": 0, "state": 0, "cells": []}
    swa_sizes = [int(m[2]) for m in ISWA_LINE.finditer(log) if m[1] == "SWA"]
    for m in KV_LINE.finditer(log):
        cells, layers, streams = int(m[2]), int(m[3]), int(m[5])
        widths = family.swa if swa_sizes and cells == swa_sizes[0] and family.swa != (0, 0) else family.full
        if family.full == (0, 0):
            widths = family.swa
        k = layers * row_bytes(m[6], widths[0]) * cells * streams
        v = layers * row_bytes(m[8], widths[1]) * cells * streams
        for rebuilt, logged in ((k, m[7]), (v, m[9])):
            if f"{rebuilt / MiB:.2f}" != logged:
                raise RuntimeError(f"{family.name}: rebuilt {rebuilt} B does not round to the logged {logged} MiB")
        out["kv"] += k + v
        out["cells"].append(f"{cells}x{streams}")
    for m in RS_LINE.finditer(log):
        rows, layers = int(m[2]) * (1 + int(m[5])), family.recurrent_layers
        r, s = (layers * row_bytes(t, w) * rows for t, w in ((m[6], family.recurrent[0]), (m[8], family.recurrent[1])))
        for rebuilt, logged in ((r, m[7]), (s, m[9])):
            if f"{rebuilt / MiB:.2f}" != logged:
                raise RuntimeError(f"{family.name}: rebuilt {rebuilt} B does not round to the logged {logged} MiB")
        out["state"] += r + s
        out["cells"].append(f"{rows} rows")
    compute = COMPUTE_LINE.search(log)
    out["compute_mib"] = float(compute[1]) if compute else None
    return out


# ------------------------------------------------------------------------------------------------- kvplan


def kvplan_figures(config: Path, case: Case, draft: Path | None = None) -> dict:
    """kvplan's llama.cpp plan for `case.seqs` users of case.ctx tokens with the same settings (and the draft model
    of config.json `draft`), or its refusal."""
    options = EngineOptions(kv_unified=case.unified, swa_full=case.swa_full, flash_attn=case.flash_attn,
                            ubatch_size=case.ubatch, batch_size=case.batch, cache_type_k=case.type_k,
                            cache_type_v=case.type_v, speculative_tokens=case.rs_seq or None)
    if case.frontend:
        options = EngineOptions(frontend=case.frontend)
    spec = load_model(str(config))
    try:
        cap = capacity(spec, Workload(ctx=case.ctx, users=case.seqs), engine_name="llama.cpp", options=options,
                       kv_budget=1 << 50, draft=load_model(str(draft)) if draft else None)
    except KvplanError as err:
        return {"refused": str(err)}
    if not cap.fits:
        return {"refused": cap.reasons[0]}
    return {"bytes": cap.engine_kv_bytes_for_users, "compute": cap.engine_activation_bytes_for_users,
            "flat": spec.widths is None}


# ------------------------------------------------------------------------------------------------- report


def compare(python: str, cases: list[Case]) -> list[str]:
    rows = ["| model | context | llama.cpp cells | KV + state bytes llama.cpp / kvplan | same | "
            "compute buffer llama.cpp / kvplan (MiB) | error |", "|---|---|---|--:|---|--:|--:|"]
    with tempfile.TemporaryDirectory() as tmp:
        built: dict[str, Path] = {}
        for case in cases:
            family = FAMILIES[case.family]
            for name in filter(None, (case.family, case.draft)):
                if name not in built:
                    directory = Path(tmp) / re.sub(r"\W+", "-", name)
                    directory.mkdir()
                    built[name] = build(python, FAMILIES[name], directory)
            result = run(python, case, built)
            ours = kvplan_figures(case.source(built[case.family]), case,
                                  built[case.draft].with_name("config.json") if case.draft else None)
            rows.append(row(family, case, result, ours))
            print(rows[-1], file=sys.stderr, flush=True)
    return rows


def run(python: str, case: Case, built: dict[str, Path]) -> dict:
    """llama.cpp's context for the case (and its draft context), from the GGUFs `built` by family."""
    args = {"mode": "run", "path": str(built[case.family]), "context": context_params(case)}
    return child(python, args | ({"draft": str(built[case.draft])} if case.draft else {}))


def row(family: Family, case: Case, result: dict, ours: dict) -> str:
    start = f"| {family.name} | {case.label} |"
    if not result["ok"]:
        reasons = [m[1].strip() for m in REFUSAL.finditer(result["log"])]
        said = next((r for r in reasons if case.refused and case.refused in r), reasons[-1] if reasons else "?")
        same = bool(case.refused) and case.refused in said and case.refused in ours.get("refused", "")
        return (f"{start} refused: {said} | kvplan: {ours.get('refused', 'accepted')} | {'yes' if same else 'NO'} "
                "| | |")
    if "refused" in ours:
        return f"{start} accepted | kvplan refused: {ours['refused']} | NO | | |"
    theirs = llama_cpp_bytes(family, result["log"])
    if case.draft:  # the two contexts together
        if not result.get("draft_ok"):
            return f"{start} the draft context failed: {result.get('draft_log', '')[-200:]} | | NO | | |"
        drafted = llama_cpp_bytes(FAMILIES[case.draft], result["draft_log"])
        theirs = {"kv": theirs["kv"] + drafted["kv"], "state": theirs["state"] + drafted["state"],
                  "cells": theirs["cells"] + [f"draft {c}" for c in drafted["cells"]],
                  "compute_mib": theirs["compute_mib"] + drafted["compute_mib"]}
    total = theirs["kv"] + theirs["state"]
    same = total == ours["bytes"]
    compute, predicted = theirs["compute_mib"], ours["compute"] / MiB
    error = f"{(predicted - compute) / compute:+.1%}" if compute else ""
    if ours["flat"]:
        error = "kvplan's flat 0.5 GiB: it reads no widths for this family"
    return (f"{start} {', '.join(theirs['cells'])} | {total:,} / {ours['bytes']:,} | {'yes' if same else 'NO'} | "
            f"{compute:.2f} / {predicted:.2f} | {error} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-python", required=True, help="the interpreter of a venv with llama-cpp-python, gguf "
                                                              "and numpy")
    parser.add_argument("--cases", help="comma-separated model names (a prefix is enough); default: all")
    args = parser.parse_args()
    version = subprocess.run([args.llama_python, "-c", "import llama_cpp; print(llama_cpp.__version__)"],
                             capture_output=True, text=True).stdout.strip()
    wanted = [name.strip() for name in args.cases.split(",")] if args.cases else None
    cases = [c for c in CASES if not wanted or any(c.family.startswith(w) for w in wanted)]
    print(f"llama-cpp-python {version} on the CPU (flags: {cpu_flags()})\n")
    rows = compare(args.llama_python, cases)
    print("\n".join(rows))
    agree = sum(" | yes | " in r for r in rows)
    print(f"\n{agree} of {len(rows) - 2} cases agree")
    errors = [abs(float(r.rsplit("|", 2)[1].strip().rstrip("%"))) for r in rows[2:] if r.rstrip(" |").endswith("%")]
    if errors:
        print(f"compute buffer: mean error {sum(errors) / len(errors):.1f}%, largest {max(errors):.1f}%")


if __name__ == "__main__":
    main()
