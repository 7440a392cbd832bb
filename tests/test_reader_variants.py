"""The config.json reader on small inline configs, one per field variant of engines.md section 6.

Expected figures are derived by hand in each test: per layer per token, plain attention costs
2 (K and V) x kv_heads x head_dim x bytes per element.
"""

import subprocess
import sys
import time

import pytest
from conftest import raw, run_python

from kvplan.errors import KvplanError
from kvplan.memory import estimate
from kvplan.model import ModelSpec
from kvplan.sources.hf_config import model_from_config, parse_json

BF16 = 2


def llama(**overrides) -> dict:
    """A small Llama-style decoder: 4 layers, hidden 512, 8 heads (head_dim 64), 2 KV heads."""
    config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "num_hidden_layers": 4,
        "hidden_size": 512,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "intermediate_size": 1024,
        "vocab_size": 1000,
        "max_position_embeddings": 4096,
        "torch_dtype": "bfloat16",
    }
    config.update(overrides)
    return {k: v for k, v in config.items() if v is not _DROP}


_DROP = object()


def read(config: dict, name: str = "test/model") -> ModelSpec:
    return model_from_config(config, name, "inline test config")


def per_token(config: dict, kv: str = "bf16") -> int:
    return estimate(read(config), ctx=1, kv_dtype_name=kv).kv_bytes_per_token


def per_sequence(config: dict, ctx: int, kv: str = "bf16") -> int:
    return estimate(read(config), ctx=ctx, kv_dtype_name=kv).kv_bytes_per_sequence


def kinds(model: ModelSpec) -> list[str]:
    return [c.kind for c in model.caches]


# -------------------------------------------------------------------------------------- heads and dims


def test_base_gqa():
    assert per_token(llama()) == 2 * 4 * 2 * 64 * BF16  # 4 layers x 2 KV heads x 512/8 = 64


def test_missing_num_key_value_heads_is_mha():
    assert per_token(llama(num_key_value_heads=_DROP)) == 2 * 4 * 8 * 64 * BF16


def test_null_num_key_value_heads_is_mha():
    # Nemotron-Super's config carries "num_key_value_heads": null at the top level
    assert per_token(llama(num_key_value_heads=None)) == 2 * 4 * 8 * 64 * BF16


def test_explicit_head_dim_beats_hidden_over_heads():
    # Gemma-3-27B / Qwen3-32B style: head_dim 128 although hidden / heads = 64
    assert per_token(llama(head_dim=128)) == 2 * 4 * 2 * 128 * BF16


def test_attention_head_dim_field():
    # Nemotron-H names it attention_head_dim
    assert per_token(llama(attention_head_dim=128)) == 2 * 4 * 2 * 128 * BF16


def test_hidden_not_divisible_by_heads_without_head_dim_is_an_error():
    with pytest.raises(KvplanError, match="head"):
        read(llama(hidden_size=500))


def test_gpt2_field_names():
    # GPT-2 medium: n_layer 24, n_head 16, n_embd 1024 (head_dim 64), MHA, no num_key_value_heads
    config = {
        "model_type": "gpt2",
        "n_layer": 24,
        "n_head": 16,
        "n_embd": 1024,
        "n_positions": 1024,
        "n_ctx": 1024,
        "vocab_size": 50257,
    }
    model = read(config)
    assert model.num_layers == 24
    assert per_token(config) == 2 * 24 * 16 * 64 * BF16
    # GPT-2 medium has 354,823,168 parameters (wte 50257 x 1024, wpe 1024 x 1024, 24 blocks of
    # 12 x 1024^2 weights + 13 x 1024 biases and LayerNorms, final LayerNorm 2 x 1024; tied head)
    assert model.params.total == 50257 * 1024 + 1024 * 1024 + 24 * (12 * 1024 * 1024 + 13 * 1024) + 2 * 1024
    assert model.params.total == 354_823_168
    assert model.max_context == 1024


def test_falcon_multi_query_old_format():
    # Falcon-7B RefinedWebModel format: n_layer 32, n_head 71, hidden 4544, multi_query -> one KV head of 64
    config = {
        "model_type": "RefinedWebModel",
        "n_layer": 32,
        "n_head": 71,
        "hidden_size": 4544,
        "multi_query": True,
        "vocab_size": 65024,
        "torch_dtype": "bfloat16",
    }
    assert per_token(config) == 2 * 32 * 1 * 64 * BF16


def test_falcon_multi_query_new_format():
    config = {
        "model_type": "falcon",
        "num_hidden_layers": 32,
        "num_attention_heads": 71,
        "hidden_size": 4544,
        "multi_query": True,
        "new_decoder_architecture": False,
        "vocab_size": 65024,
        "torch_dtype": "bfloat16",
    }
    assert per_token(config) == 2 * 32 * 1 * 64 * BF16


def test_falcon_without_multi_query_is_mha():
    config = {
        "model_type": "falcon",
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "hidden_size": 512,
        "multi_query": False,
        "vocab_size": 1000,
        "torch_dtype": "bfloat16",
    }
    assert per_token(config) == 2 * 2 * 8 * 64 * BF16


def test_falcon_new_decoder_architecture_num_kv_heads():
    # Falcon-40B: 60 layers, 128 heads of 8192/128 = 64, 8 KV groups (num_kv_heads)
    config = {
        "model_type": "falcon",
        "num_hidden_layers": 60,
        "num_attention_heads": 128,
        "hidden_size": 8192,
        "new_decoder_architecture": True,
        "num_kv_heads": 8,
        "multi_query": True,
        "vocab_size": 65024,
        "torch_dtype": "bfloat16",
    }
    assert per_token(config) == 2 * 60 * 8 * 64 * BF16  # 122,880


def test_falcon_40b_refinedweb_n_head_kv():
    # the original Falcon-40B config: model_type RefinedWeb, n_head_kv 8
    config = {
        "model_type": "RefinedWeb",
        "n_layer": 60,
        "n_head": 128,
        "n_head_kv": 8,
        "hidden_size": 8192,
        "vocab_size": 65024,
        "torch_dtype": "bfloat16",
    }
    assert per_token(config) == 2 * 60 * 8 * 64 * BF16


def test_gpt_neox_20b():
    # GPT-NeoX-20B (Black et al. 2022): 44 layers, hidden 6144, 64 heads (96 dims), MHA, vocab 50432 (untied),
    # 20,554,567,680 parameters
    config = {
        "model_type": "gpt_neox",
        "num_hidden_layers": 44,
        "hidden_size": 6144,
        "num_attention_heads": 64,
        "intermediate_size": 24576,
        "vocab_size": 50432,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
        "torch_dtype": "float16",
    }
    assert per_token(config, "fp16") == 2 * 44 * 64 * 96 * 2  # 1,081,344
    assert read(config).params.total == 20_554_567_680


def test_mqa_and_gqa_aliases():
    # vLLM reads n_head_kv, num_kv_heads, num_key_value_heads, multi_query_group_num, num_attention_groups
    for field in ("num_kv_heads", "n_head_kv", "multi_query_group_num", "num_attention_groups"):
        assert per_token(llama(num_key_value_heads=_DROP, **{field: 4})) == 2 * 4 * 4 * 64 * BF16, field


# ---------------------------------------------------------------------------------------------- T5, BERT


T5_SMALL = {
    "model_type": "t5",
    "architectures": ["T5ForConditionalGeneration"],
    "d_model": 512,
    "d_kv": 64,
    "d_ff": 2048,
    "num_heads": 8,
    "num_layers": 6,
    "vocab_size": 32128,
    "is_encoder_decoder": True,
    "feed_forward_proj": "relu",
    "relative_attention_num_buckets": 32,
    "n_positions": 512,
}


def test_t5_self_and_cross_attention_per_decoder_layer():
    # 6 decoder layers, each with a self-attention and a cross-attention cache of 8 heads x d_kv 64
    model = read(T5_SMALL)
    assert kinds(model).count("full") == 6 and kinds(model).count("cross") == 6
    layer = 2 * 8 * 64 * BF16
    assert per_token(T5_SMALL) == 6 * 2 * layer
    # cross-attention holds the encoder's tokens: T5 has no fixed input length, taken as long as the context
    assert per_sequence(T5_SMALL, 1000) == 6 * 1000 * layer + 6 * 1000 * layer


def test_t5_num_decoder_layers():
    config = dict(T5_SMALL, num_decoder_layers=3)
    assert per_token(config) == 3 * 2 * (2 * 8 * 64 * BF16)


def test_t5_small_parameters():
    # t5-small: 60,506,624 parameters (shared 32128 x 512 embedding, tied head)
    assert read(T5_SMALL).params.total == 60_506_624


BERT_BASE = {
    "model_type": "bert",
    "architectures": ["BertForMaskedLM"],
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "vocab_size": 30522,
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
}


def test_bert_is_encoder_only_with_no_kv_cache():
    model = read(BERT_BASE)
    result = estimate(model, ctx=512)
    assert result.kv_bytes_per_token == 0
    assert result.kv_bytes_per_sequence == 0
    assert result.state_bytes_per_sequence == 0
    assert any("no kv cache" in note.lower() for note in model.notes)


def test_bert_base_parameters():
    # BertModel bert-base-uncased: 109,482,240 (embeddings 23,837,184 + 12 x 7,087,872 + pooler 590,592)
    assert read(BERT_BASE).params.total == 109_482_240


def test_masked_lm_without_model_type_is_encoder_only():
    config = {k: v for k, v in BERT_BASE.items() if k != "model_type"}
    assert estimate(read(config), ctx=128).kv_bytes_per_sequence == 0


# ---------------------------------------------------------------------------------------------- windows


def test_layer_types_list():
    config = llama(sliding_window=16, layer_types=["sliding_attention", "full_attention"] * 2)
    model = read(config)
    assert kinds(model) == ["sliding", "full", "sliding", "full"]
    layer = 2 * 2 * 64 * BF16
    assert per_sequence(config, 100) == 2 * 16 * layer + 2 * 100 * layer


def test_layer_types_sliding_without_window_is_an_error():
    with pytest.raises(KvplanError, match="sliding_window"):
        read(llama(layer_types=["sliding_attention"] * 4))


def test_layer_types_unknown_type_is_an_error():
    with pytest.raises(KvplanError, match="warp_attention"):
        read(llama(layer_types=["full_attention"] * 3 + ["warp_attention"]))


GEMMA2_9B = {  # google/gemma-2-9b config.json
    "model_type": "gemma2",
    "architectures": ["Gemma2ForCausalLM"],
    "num_hidden_layers": 42,
    "hidden_size": 3584,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 256,
    "intermediate_size": 14336,
    "vocab_size": 256000,
    "sliding_window": 4096,
    "max_position_embeddings": 8192,
    "torch_dtype": "float32",
}


def test_gemma2_alternates_starting_with_sliding():
    model = read(GEMMA2_9B)
    assert kinds(model)[:4] == ["sliding", "full", "sliding", "full"]
    assert kinds(model).count("sliding") == 21 and kinds(model).count("full") == 21
    # per layer per token 2 x 8 x 256 x 2 = 8,192; at 8k: 21 layers hold 8,192 tokens, 21 hold 4,096
    assert per_sequence(GEMMA2_9B, 8192) == 21 * 8192 * 8192 + 21 * 4096 * 8192


def test_gemma2_9b_parameters():
    # gemma-2-9b: 9.24B parameters (per layer q/o 3584 x 4096, k/v 3584 x 2048, MLP 3 x 3584 x 14336, 4 norms)
    per_layer = 2 * 3584 * 4096 + 2 * 3584 * 2048 + 3 * 3584 * 14336 + 4 * 3584
    assert read(GEMMA2_9B).params.total == 256000 * 3584 + 42 * per_layer + 3584  # 9,241,705,984


def test_gemma3_pattern_default_six():
    # gemma3_text: sliding_window_pattern 6 -> layer i slides iff (i + 1) % 6 != 0
    config = {
        "model_type": "gemma3_text",
        "num_hidden_layers": 12,
        "hidden_size": 640,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 256,
        "intermediate_size": 2048,
        "vocab_size": 262144,
        "sliding_window": 512,
        "torch_dtype": "bfloat16",
    }
    assert [c.layer for c in read(config).caches if c.kind == "full"] == [5, 11]
    config["sliding_window_pattern"] = 3
    assert [c.layer for c in read(config).caches if c.kind == "full"] == [2, 5, 8, 11]


def test_qwen2_use_sliding_window_from_max_window_layers():
    # Qwen2.5-7B with sliding turned on: layers >= max_window_layers (21) slide, the first 21 stay full.
    # 4 KV heads x 128: 2 x 4 x 128 x 2 = 2,048 bytes per layer per token
    config = dict(
        raw("Qwen__Qwen2.5-7B.json"), use_sliding_window=True, sliding_window=4096, max_window_layers=21
    )
    model = read(config)
    assert kinds(model) == ["full"] * 21 + ["sliding"] * 7
    assert per_sequence(config, 32768) == 21 * 32768 * 2048 + 7 * 4096 * 2048


def test_qwen2_use_sliding_window_false_ignores_window():
    config = dict(raw("Qwen__Qwen2.5-7B.json"), use_sliding_window=False, sliding_window=4096)
    assert set(kinds(read(config))) == {"full"}


def test_window_larger_than_context_holds_the_context():
    # Qwen2.5 window 131072 switched on, at 32k tokens: nothing is dropped
    config = dict(raw("Qwen__Qwen2.5-7B.json"), use_sliding_window=True, max_window_layers=0)
    assert set(kinds(read(config))) == {"sliding"}
    assert per_sequence(config, 32768) == 28 * 32768 * 2048


def test_mistral_window_on_all_layers():
    config = llama(model_type="mistral", sliding_window=4096)
    assert set(kinds(read(config))) == {"sliding"}
    layer = 2 * 2 * 64 * BF16
    assert per_sequence(config, 100) == 4 * 100 * layer
    assert per_sequence(config, 10000) == 4 * 4096 * layer


def test_mistral_null_window_is_full():
    # Mistral-7B-v0.2 and later: "sliding_window": null
    assert set(kinds(read(llama(model_type="mistral", sliding_window=None)))) == {"full"}


LLAMA4 = {
    "model_type": "llama4_text",
    "num_hidden_layers": 8,
    "hidden_size": 1024,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "intermediate_size": 1024,
    "intermediate_size_mlp": 2048,
    "vocab_size": 1000,
    "attention_chunk_size": 8192,
    "torch_dtype": "bfloat16",
}


def test_llama4_empty_no_rope_layers_means_every_fourth_global():
    model = read(dict(LLAMA4, no_rope_layers=[]))
    assert kinds(model) == ["chunked", "chunked", "chunked", "full"] * 2
    assert {c.chunk for c in model.caches if c.kind == "chunked"} == {8192}
    layer = 2 * 2 * 128 * BF16
    assert per_sequence(dict(LLAMA4, no_rope_layers=[]), 32768) == 2 * 32768 * layer + 6 * 8192 * layer


def test_llama4_explicit_no_rope_layers():
    # no_rope_layers[i] == 0: NoPE layer, global attention; 1: RoPE layer, chunked
    model = read(dict(LLAMA4, no_rope_layers=[1, 0, 1, 1, 0, 1, 1, 1]))
    assert [c.layer for c in model.caches if c.kind == "full"] == [1, 4]


def test_llama4_without_chunk_size_is_full():
    model = read(dict(LLAMA4, attention_chunk_size=None))
    assert set(kinds(model)) == {"full"}


def test_deepseek_mla_latent_row():
    # DeepSeek-V2-Lite-style MLA: one row of kv_lora_rank 512 + qk_rope_head_dim 64 per layer, shared by all
    # 16 heads; num_key_value_heads is nominal
    config = {
        "model_type": "deepseek_v2",
        "num_hidden_layers": 3,
        "hidden_size": 1024,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        "q_lora_rank": None,
        "intermediate_size": 2048,
        "vocab_size": 1000,
        "torch_dtype": "bfloat16",
    }
    model = read(config)
    assert set(kinds(model)) == {"mla"}
    assert all(not c.split_by_tensor_parallel for c in model.caches)
    assert per_token(config) == 3 * (512 + 64) * BF16
    assert per_token(config, "fp8") == 3 * (512 + 64)


# ---------------------------------------------------------------------------------------------- hybrids

JAMBA = {  # ai21labs/Jamba-v0.1 config.json
    "model_type": "jamba",
    "architectures": ["JambaForCausalLM"],
    "num_hidden_layers": 32,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "vocab_size": 65536,
    "attn_layer_period": 8,
    "attn_layer_offset": 4,
    "expert_layer_period": 2,
    "expert_layer_offset": 1,
    "num_experts": 16,
    "num_experts_per_tok": 2,
    "mamba_d_state": 16,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_dt_rank": 256,
    "mamba_conv_bias": True,
    "mamba_proj_bias": False,
    "max_position_embeddings": 262144,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def test_jamba_attention_every_eighth_layer_from_four():
    model = read(JAMBA)
    assert [c.layer for c in model.caches if c.kind == "full"] == [4, 12, 20, 28]
    assert kinds(model).count("recurrent") == 28
    # 4 attention layers x 2 x 8 KV heads x 128 x 2 bytes
    result = estimate(model, ctx=8192, kv_dtype_name="bf16")
    assert result.kv_bytes_per_token == 4 * 2 * 8 * 128 * BF16
    # Mamba1 state per layer: conv d_inner (2 x 4096) x (d_conv - 1) + ssm d_inner x d_state 16, bf16
    state_layer = (8192 * 3 + 8192 * 16) * BF16
    assert result.state_bytes_per_sequence == 28 * state_layer
    assert result.kv_bytes_per_sequence == 4 * 8192 * 4096 + 28 * state_layer


def test_jamba_other_period_and_offset():
    model = read(dict(JAMBA, num_hidden_layers=6, attn_layer_period=3, attn_layer_offset=0))
    assert [c.layer for c in model.caches if c.kind == "full"] == [0, 3]


def test_jamba_parameters():
    # Jamba v0.1: 52B total, 12B active (AI21)
    params = read(JAMBA).params
    assert abs(params.total - 52e9) <= 0.01 * 52e9
    assert abs(params.active - 12e9) <= 0.02 * 12e9


QWEN3_NEXT = {  # Qwen/Qwen3-Next-80B-A3B config.json
    "model_type": "qwen3_next",
    "architectures": ["Qwen3NextForCausalLM"],
    "num_hidden_layers": 48,
    "hidden_size": 2048,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "intermediate_size": 5120,
    "vocab_size": 151936,
    "full_attention_interval": 4,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_value_head_dim": 128,
    "num_experts": 512,
    "num_experts_per_tok": 10,
    "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "max_position_embeddings": 262144,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
# GDN state per layer: conv (2 x Hk x Dk + Hv x Dv) x (kernel - 1) + recurrent Hv x Dv x Dk elements
GDN_ELEMENTS = (2 * 16 * 128 + 32 * 128) * (4 - 1) + 32 * 128 * 128


def test_qwen3_next_gdn_state_matches_vllm_page():
    assert GDN_ELEMENTS * BF16 == 1_097_728  # engines.md 7.5: vLLM's GDN page for Qwen3-Next-80B in bf16
    model = read(QWEN3_NEXT)
    recurrent = [c for c in model.caches if c.kind == "recurrent"]
    assert len(recurrent) == 36
    result = estimate(model, ctx=4096)
    assert result.state_bytes_per_sequence == 36 * 1_097_728


def test_qwen3_next_every_fourth_layer_is_attention():
    model = read(QWEN3_NEXT)
    assert [c.layer for c in model.caches if c.kind == "full"] == list(range(3, 48, 4))
    # 12 layers x 2 x 2 KV heads x 256 x 2 bytes
    result = estimate(model, ctx=4096, kv_dtype_name="bf16")
    assert result.kv_bytes_per_token == 12 * 2 * 2 * 256 * BF16
    assert result.kv_bytes_per_sequence == 12 * 4096 * 2048 + 36 * 1_097_728


def test_qwen3_next_state_does_not_grow_with_context():
    model = read(QWEN3_NEXT)
    short, long = estimate(model, ctx=1000), estimate(model, ctx=100_000)
    assert short.state_bytes_per_sequence == long.state_bytes_per_sequence
    assert long.kv_bytes_per_sequence - short.kv_bytes_per_sequence == 12 * 99_000 * 2048


def test_qwen3_next_interval_two():
    model = read(dict(QWEN3_NEXT, num_hidden_layers=4, full_attention_interval=2))
    assert kinds(model) == ["recurrent", "full", "recurrent", "full"]


NEMOTRON_H = {  # Nemotron-H field names, small
    "model_type": "nemotron_h",
    "architectures": ["NemotronHForCausalLM"],
    "num_hidden_layers": 4,
    "hybrid_override_pattern": "M-M*",
    "hidden_size": 1024,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "attention_head_dim": 128,
    "mamba_num_heads": 16,
    "mamba_head_dim": 64,
    "ssm_state_size": 128,
    "n_groups": 8,
    "conv_kernel": 4,
    "expand": 2,
    "intermediate_size": 4096,
    "vocab_size": 1000,
    "torch_dtype": "bfloat16",
}


def test_nemotron_h_hybrid_pattern():
    model = read(NEMOTRON_H)
    assert kinds(model) == ["recurrent", "none", "recurrent", "full"]
    result = estimate(model, ctx=1000, kv_dtype_name="bf16")
    assert result.kv_bytes_per_token == 2 * 2 * 128 * BF16  # one attention layer
    # Mamba2 state: conv (d_inner 16 x 64 + 2 x n_groups 8 x d_state 128) x (kernel - 1) in bf16 + ssm 16 x 64 x 128
    # in fp32, Nemotron-H's SSM dtype when its config names none (vLLM NemotronHForCausalLMConfig, transformers'
    # NemotronHConfig mamba_ssm_cache_dtype "float32")
    state = (16 * 64 + 2 * 8 * 128) * 3 * BF16 + 16 * 64 * 128 * 4
    assert result.state_bytes_per_sequence == 2 * state
    assert result.kv_bytes_per_sequence == 1000 * 1024 + 2 * state


def test_nemotron_h_pattern_of_wrong_length_is_an_error():
    with pytest.raises(KvplanError, match="hybrid_override_pattern"):
        read(dict(NEMOTRON_H, hybrid_override_pattern="M-M*M"))
    with pytest.raises(KvplanError, match="hybrid_override_pattern"):
        read(dict(NEMOTRON_H, hybrid_override_pattern="M-MX"))


def test_nemotron_h_moe_layer_without_expert_fields_is_an_error():
    # "E" marks an MoE layer; a config without the expert fields must be refused, not crash
    with pytest.raises(KvplanError):
        read(dict(NEMOTRON_H, hybrid_override_pattern="M-E*"))


NAS = {  # Nemotron NAS (DeciLM) field names, small: head_dim 1024 / 8 = 128
    "model_type": "nemotron-nas",
    "architectures": ["DeciLMForCausalLM"],
    "num_hidden_layers": 3,
    "hidden_size": 1024,
    "num_attention_heads": 8,
    "num_key_value_heads": None,
    "intermediate_size": None,
    "vocab_size": 1000,
    "torch_dtype": "bfloat16",
    "block_configs": [
        {
            "attention": {"n_heads_in_group": 4, "no_op": False, "replace_with_linear": False},
            "ffn": {"ffn_mult": 2.0, "no_op": False, "replace_with_linear": False},
        },
        {
            "attention": {"n_heads_in_group": None, "no_op": True, "replace_with_linear": False},
            "ffn": {"ffn_mult": 1.0, "no_op": False, "replace_with_linear": False},
        },
        {
            "attention": {"n_heads_in_group": 8, "no_op": False, "replace_with_linear": False},
            "ffn": {"ffn_mult": None, "no_op": True, "replace_with_linear": False},
        },
    ],
}


def test_nemotron_nas_block_configs():
    model = read(NAS)
    assert kinds(model) == ["full", "none", "full"]
    # layer 0: 8 / 4 = 2 KV heads; layer 1: attention removed; layer 2: 8 / 8 = 1 KV head
    assert [c.kv_heads for c in model.caches if c.kind == "full"] == [2, 1]
    assert per_token(NAS) == 2 * 2 * 128 * BF16 + 2 * 1 * 128 * BF16


def test_nemotron_nas_replace_with_linear_keeps_no_cache():
    blocks = [dict(b) for b in NAS["block_configs"]]
    blocks[0] = {"attention": {"replace_with_linear": True}, "ffn": {"ffn_mult": 1.0}}
    model = read(dict(NAS, block_configs=blocks))
    assert kinds(model) == ["none", "none", "full"]


def test_nemotron_nas_block_configs_of_wrong_length_is_an_error():
    with pytest.raises(KvplanError, match="block_configs"):
        read(dict(NAS, block_configs=NAS["block_configs"][:2]))


# ---------------------------------------------------------------------------------------------- nesting, JSON


def test_text_config_nesting():
    config = {
        "architectures": ["LlavaForConditionalGeneration"],
        "model_type": "llava",
        "torch_dtype": "float16",
        "text_config": llama(torch_dtype=_DROP, num_hidden_layers=6),
        "vision_config": {"model_type": "clip_vision_model", "hidden_size": 1024, "num_hidden_layers": 24},
    }
    model = read(config)
    assert model.num_layers == 6
    assert model.dtype == "fp16"  # inherited from the top level
    assert per_token(config) == 2 * 6 * 2 * 64 * BF16
    assert any("text_config" in note for note in model.notes)


def test_bare_infinity_in_json():
    # Nemotron-H's genuine config.json carries "time_step_limit": [0.0, Infinity]
    text = (
        '{"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4, '
        '"intermediate_size": 512, "vocab_size": 100, "torch_dtype": "bfloat16", '
        '"time_step_limit": [0.0, Infinity], "max_position_embeddings": Infinity}'
    )
    model = read(parse_json(text, "config.json"))
    assert model.max_context is None
    assert per_token(parse_json(text, "config.json")) == 2 * 2 * 4 * 64 * BF16


def test_auto_map_is_never_imported(tmp_path, monkeypatch):
    module = "kvplan_test_trap_module"
    (tmp_path / f"{module}.py").write_text("raise RuntimeError('remote code was imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    config = llama(
        auto_map={"AutoConfig": f"{module}.TrapConfig", "AutoModelForCausalLM": f"{module}.TrapModel"},
        trust_remote_code=True,
    )
    assert per_token(config) == 2 * 4 * 2 * 64 * BF16
    assert module not in sys.modules


def test_genuine_phi2_with_auto_map_reads():
    # an older revision of microsoft/phi-2 named remote code in auto_map; it is data only
    config = dict(raw("microsoft__phi-2.json"), auto_map={"AutoConfig": "configuration_phi.PhiConfig"})
    assert per_token(config) == 2 * 32 * 32 * 80 * BF16


def test_dtype_names():
    for name, expected in (
        ("bfloat16", "bf16"),
        ("float16", "fp16"),
        ("float32", "fp32"),
        ("torch.bfloat16", "bf16"),
    ):
        assert read(llama(torch_dtype=name)).dtype == expected
    assert read(llama(torch_dtype=_DROP)).dtype == "fp32"  # transformers loads an unnamed dtype as float32
    assert (
        read(llama(torch_dtype=_DROP, dtype="bfloat16")).dtype == "bf16"
    )  # transformers >= 4.56 writes `dtype`


def test_fp8_kv_cache_scheme_from_compressed_tensors():
    qc = {
        "quant_method": "compressed-tensors",
        "config_groups": {"group_0": {"weights": {"num_bits": 8, "type": "float"}}},
        "kv_cache_scheme": {"num_bits": 8, "type": "float"},
    }
    result = estimate(read(llama(quantization_config=qc)), ctx=1)
    assert result.kv_dtype == "fp8"
    assert result.kv_bytes_per_token == 2 * 4 * 2 * 64 * 1
    assert result.weights_dtype == "fp8"


# ---------------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize("field", ["num_hidden_layers", "hidden_size", "num_attention_heads"])
def test_missing_field_is_named(field):
    with pytest.raises(KvplanError, match=field):
        read(llama(**{field: _DROP}))


def test_zero_heads():
    with pytest.raises(KvplanError, match="num_attention_heads"):
        read(llama(num_attention_heads=0))


def test_zero_kv_heads():
    with pytest.raises(KvplanError, match="num_key_value_heads"):
        read(llama(num_key_value_heads=0))


def test_negative_layers():
    with pytest.raises(KvplanError, match="num_hidden_layers"):
        read(llama(num_hidden_layers=-3))


@pytest.mark.parametrize(
    "field, value",
    [
        ("hidden_size", "4096"),
        ("num_hidden_layers", "32"),
        ("num_key_value_heads", "eight"),
        ("head_dim", [128]),
        ("num_attention_heads", 8.5),
        ("num_hidden_layers", True),
        ("sliding_window", "4096"),
    ],
)
def test_wrong_type_for_a_number(field, value):
    config = llama(**{field: value})
    if field == "sliding_window":
        config["model_type"] = "mistral"
    with pytest.raises(KvplanError, match=field):
        read(config)


def test_whole_float_is_accepted():
    assert per_token(llama(num_hidden_layers=4.0)) == 2 * 4 * 2 * 64 * BF16


def test_heads_not_divisible_by_kv_heads():
    with pytest.raises(KvplanError, match="8 attention heads cannot be grouped over 3 KV heads"):
        read(llama(num_key_value_heads=3))


def test_absurd_layer_count_refused_quickly():
    start = time.perf_counter()
    with pytest.raises(KvplanError, match="layers"):
        read(llama(num_hidden_layers=10**12))
    assert time.perf_counter() - start < 1.0


@pytest.mark.parametrize(
    "config",
    [
        dict(T5_SMALL, num_layers=10**12),
        dict(T5_SMALL, num_decoder_layers=10**12),
        dict(BERT_BASE, num_hidden_layers=10**12),
        llama(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64, first_k_dense_replace=10**12),
    ],
    ids=["t5-encoder-layers", "t5-decoder-layers", "bert-layers", "moe-first_k_dense_replace"],
)
def test_absurd_counts_refused_quickly_in_a_fresh_interpreter(config):
    # run in a fresh interpreter capped at 2 GiB of address space and killed after 6 s (a loop or a set over
    # 10**12 layers never finishes); the answer must be a KvplanError, not a hang or a MemoryError
    code = (
        "import resource\n"
        "resource.setrlimit(resource.RLIMIT_AS, (2 * 2**30, 2 * 2**30))\n"
        "from kvplan.sources.hf_config import model_from_config\n"
        "from kvplan.errors import KvplanError\n"
        f"config = {config!r}\n"
        "try:\n"
        "    model_from_config(config, 'x', 'test')\n"
        "    print('ACCEPTED')\n"
        "except KvplanError as err:\n"
        "    print('REFUSED', err)\n"
    )
    try:
        result = run_python(code, timeout=6)
    except subprocess.TimeoutExpired:
        result = None  # the child was killed
    assert result is not None, "not refused within 6 s"
    assert result.stdout.startswith("REFUSED"), result.stdout + result.stderr[-500:]


def test_layer_types_of_wrong_length():
    with pytest.raises(KvplanError, match="layer_types"):
        read(llama(sliding_window=16, layer_types=["sliding_attention", "full_attention"]))


def test_layer_types_not_a_list():
    with pytest.raises(KvplanError, match="layer_types"):
        read(llama(layer_types="full_attention"))


def test_unknown_torch_dtype_named():
    with pytest.raises(KvplanError, match="torch_dtype"):
        read(llama(torch_dtype="float12"))


def test_config_that_is_not_an_object():
    with pytest.raises(KvplanError):
        parse_json("[1, 2, 3]", "config.json")
    with pytest.raises(KvplanError, match="line 2"):
        parse_json('{"a": 1,\n "b": }', "config.json")


def test_every_family_module_is_named_for_the_model_types_it_registers():
    """The reader imports a family's rule module only for the model types families.RULE_MODULES names: each
    registered rule of those modules must be named there, or its family would be read by the shared rules."""
    import importlib

    from kvplan.sources.hf_config import families, layout, params

    modules = set(families.RULE_MODULES.values())
    for module in modules:
        importlib.import_module(f"kvplan.sources.hf_config.{module}")
    for registry in (layout.FAMILY_LAYOUTS, layout.LAYER_CUTS, params.FAMILY_PARAMS, params.FAMILY_WIDTHS):
        for model_type, rule in registry.items():
            home = getattr(rule, "func", rule).__module__.rsplit(".", 1)[-1]
            if home in modules:
                assert families.RULE_MODULES.get(model_type) == home, model_type
