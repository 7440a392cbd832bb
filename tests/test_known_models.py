"""kvplan against genuine Hugging Face config.json copies (model_specs/, from shared/hf_configs/SOURCES.tsv).

Every expected figure is derived here by hand from the published architecture (layers, KV heads, head_dim,
window) or is a published parameter count / worked example (shared/reference/engines.md section 7).
Per-token KV for plain attention: 2 (K and V) x layers x kv_heads x head_dim x bytes per element.
"""

import pytest
from conftest import GB, SHARED_CONFIGS, SPECS, GiB, MiB, load

from kvplan.memory import estimate
from kvplan.sources.hf_config import model_from_config

BF16 = 2

# file -> (bf16 KV bytes per token over all layers, the published facts that give it)
KV_PER_TOKEN_BF16 = {
    # Llama 3.1: 32 layers, 8 KV heads (GQA), head_dim 4096/32 = 128
    "meta-llama__Llama-3.1-8B.json": 2 * 32 * 8 * 128 * BF16,  # 131,072
    # 80 layers, 8 KV heads, head_dim 8192/64 = 128
    "meta-llama__Llama-3.1-70B.json": 2 * 80 * 8 * 128 * BF16,  # 327,680
    # 126 layers, 8 KV heads, head_dim 16384/128 = 128
    "meta-llama__Llama-3.1-405B.json": 2 * 126 * 8 * 128 * BF16,
    # Llama 3.2 1B: 16 layers, 8 KV heads, head_dim 64 (explicit)
    "meta-llama__Llama-3.2-1B-Instruct.json": 2 * 16 * 8 * 64 * BF16,
    # Llama 2 7B is MHA: 32 KV heads, not 8
    "meta-llama__Llama-2-7b-hf.json": 2 * 32 * 32 * 128 * BF16,  # 524,288
    # Llama 2 70B: GQA, 80 layers, 8 KV heads, head_dim 128
    "meta-llama__Llama-2-70b-hf.json": 2 * 80 * 8 * 128 * BF16,
    # Llama 4 Scout (text_config): 48 layers, 8 KV heads, head_dim 128
    "meta-llama__Llama-4-Scout-17B-16E-Instruct.json": 2 * 48 * 8 * 128 * BF16,
    # Qwen3-8B: 36 layers, 8 KV heads, head_dim 128
    "Qwen__Qwen3-8B.json": 2 * 36 * 8 * 128 * BF16,
    # Qwen3-32B: 64 layers, 8 KV heads, head_dim 128 explicit (hidden 5120 / 64 heads would be 80)
    "Qwen__Qwen3-32B.json": 2 * 64 * 8 * 128 * BF16,  # 262,144
    # Qwen3-30B-A3B: 48 layers, 4 KV heads, head_dim 128
    "Qwen__Qwen3-30B-A3B.json": 2 * 48 * 4 * 128 * BF16,
    # Qwen3-235B-A22B: 94 layers, 4 KV heads, head_dim 128
    "Qwen__Qwen3-235B-A22B.json": 2 * 94 * 4 * 128 * BF16,
    # Qwen2.5-7B: 28 layers, 4 KV heads, head_dim 3584/28 = 128
    "Qwen__Qwen2.5-7B.json": 2 * 28 * 4 * 128 * BF16,
    "Qwen__Qwen2.5-7B-Instruct.json": 2 * 28 * 4 * 128 * BF16,
    # DeepSeek V3 / R1: MLA, one latent row of kv_lora_rank 512 + qk_rope_head_dim 64 per layer, 61 layers
    "deepseek-ai__DeepSeek-V3.json": 61 * (512 + 64) * BF16,  # 70,272 (engines.md 7.3)
    "deepseek-ai__DeepSeek-R1.json": 61 * (512 + 64) * BF16,
    # DeepSeek-V2-Lite: MLA, 27 layers, 512 + 64
    "deepseek-ai__DeepSeek-V2-Lite.json": 27 * (512 + 64) * BF16,
    # gpt-oss: 8 KV heads x head_dim 64 on every layer (24 / 36 layers); windows change tokens held, not this
    "openai__gpt-oss-20b.json": 2 * 24 * 8 * 64 * BF16,
    "openai__gpt-oss-120b.json": 2 * 36 * 8 * 64 * BF16,
    # Mistral 7B v0.1 and Mixtral 8x7B: 32 layers, 8 KV heads, head_dim 128
    "mistralai__Mistral-7B-v0.1.json": 2 * 32 * 8 * 128 * BF16,
    "mistralai__Mixtral-8x7B-v0.1.json": 2 * 32 * 8 * 128 * BF16,
    # phi-2: MHA, 32 layers, 32 heads, head_dim 2560/32 = 80
    "microsoft__phi-2.json": 2 * 32 * 32 * 80 * BF16,
    # Phi-3-mini: MHA, 32 layers, 32 KV heads, head_dim 3072/32 = 96
    "microsoft__Phi-3-mini-4k-instruct.json": 2 * 32 * 32 * 96 * BF16,
    # phi-4: 40 layers, 10 KV heads, head_dim 5120/40 = 128
    "microsoft__phi-4.json": 2 * 40 * 10 * 128 * BF16,
    # Falcon-7B: multi_query -> 1 KV head, head_dim 4544/71 = 64, 32 layers
    "tiiuae__falcon-7b.json": 2 * 32 * 1 * 64 * BF16,  # 8,192
    # Gemma 2B: MQA (1 KV head), head_dim 256, 18 layers
    "google__gemma-2b-it.json": 2 * 18 * 1 * 256 * BF16,
    # Gemma 3 1B: 26 layers, 1 KV head, head_dim 256
    "google__gemma-3-1b-it.json": 2 * 26 * 1 * 256 * BF16,
    # GPT-2: MHA, 12 layers, 12 heads x 64 (n_embd 768 / 12)
    "openai__gpt2.json": 2 * 12 * 12 * 64 * BF16,  # 36,864
}


def test_the_table_covers_every_genuine_config():
    """The 27 configs of shared/hf_configs/SOURCES.tsv, each copied into model_specs/."""
    sources = SHARED_CONFIGS / "SOURCES.tsv"
    if sources.is_file():
        listed = {line.split("\t")[0] for line in sources.read_text().splitlines()[1:] if line.strip()}
        assert listed == set(KV_PER_TOKEN_BF16)
    assert len(KV_PER_TOKEN_BF16) == 27
    for name in KV_PER_TOKEN_BF16:
        assert (SPECS / name).is_file(), name


@pytest.mark.parametrize("filename, expected", sorted(KV_PER_TOKEN_BF16.items()))
def test_kv_bytes_per_token_bf16(filename, expected):
    assert estimate(load(filename), ctx=1, kv_dtype_name="bf16").kv_bytes_per_token == expected


@pytest.mark.parametrize("filename, expected", sorted(KV_PER_TOKEN_BF16.items()))
def test_one_token_sequence_costs_one_token_of_every_layer(filename, expected):
    """At ctx 1 no window or chunk is smaller than the context, so per sequence = per token."""
    result = estimate(load(filename), ctx=1, kv_dtype_name="bf16")
    assert result.kv_bytes_per_sequence == expected


# Library additions after SOURCES.tsv, each found and checked as model_specs/library.json says. Hybrids count
# their attention layers only: a recurrent layer's state is per sequence, not per token.
LATER_KV_PER_TOKEN_BF16 = {
    # MiniMax-M2.7: 62 layers, 8 KV heads, head_dim 128
    "MiniMaxAI__MiniMax-M2.7.json": 2 * 62 * 8 * 128 * BF16,  # 253,952
    # Qwen3.6-35B-A3B: full attention on every 4th of 40 layers (10), 2 KV heads x head_dim 256
    "Qwen__Qwen3.6-35B-A3B.json": 2 * 10 * 2 * 256 * BF16,  # 20,480
    # Qwen3.6-27B: full attention on every 4th of 64 layers (16), 4 KV heads x head_dim 256
    "Qwen__Qwen3.6-27B.json": 2 * 16 * 4 * 256 * BF16,  # 65,536
    # Kimi Linear: MLA on the 7 full_attn_layers, one latent row of 512 + rope 64
    "moonshotai__Kimi-Linear-48B-A3B-Instruct.json": 7 * (512 + 64) * BF16,  # 8,064
    # LFM2-1.2B: attention on the 6 full_attn_idxs, 8 KV heads x head_dim 2048 / 32 = 64
    "LiquidAI__LFM2-1.2B.json": 2 * 6 * 8 * 64 * BF16,  # 12,288
    # Granite 4.0-H-Small: 4 attention layers of 40 (layer_types), 8 KV heads x head_dim 4096 / 32 = 128
    "ibm-granite__granite-4.0-h-small.json": 2 * 4 * 8 * 128 * BF16,  # 16,384
    # Granite 4.0-H-1B: 4 attention layers of 40, 4 KV heads x head_dim 1536 / 12 = 128
    "ibm-granite__granite-4.0-h-1b.json": 2 * 4 * 4 * 128 * BF16,  # 8,192
    # Falcon-H1-0.5B: attention in each of its 36 layers, 2 KV heads x head_dim 64
    "tiiuae__Falcon-H1-0.5B-Instruct.json": 2 * 36 * 2 * 64 * BF16,  # 18,432
    # Gemma 3n E2B: 20 of its 30 layers own a cache (the last 10 reuse it), 2 KV heads x head_dim 256
    "google__gemma-3n-E2B.json": 2 * 20 * 2 * 256 * BF16,  # 40,960
    # Mamba-2 2.7B: no attention layer
    "state-spaces__mamba2-2.7b.json": 0,
    # DeepSeek-V2: MLA, 60 layers, one latent row of kv_lora_rank 512 + qk_rope_head_dim 64
    "deepseek-ai__DeepSeek-V2.json": 60 * (512 + 64) * BF16,  # 69,120
    # MiniMax-M2.5: M2.7's 62 layers of 8 KV heads x head_dim 128
    "MiniMaxAI__MiniMax-M2.5.json": 2 * 62 * 8 * 128 * BF16,  # 253,952
    # Qwen3-235B-A22B-FP8: Qwen3-235B-A22B's 94 layers, 4 KV heads x head_dim 128 (fp8 weights, bf16 cache)
    "Qwen__Qwen3-235B-A22B-FP8.json": 2 * 94 * 4 * 128 * BF16,  # 192,512
    # Qwen3.5-397B-A17B: full attention on every 4th of 60 layers (15), 2 KV heads x head_dim 256
    "Qwen__Qwen3.5-397B-A17B.json": 2 * 15 * 2 * 256 * BF16,  # 30,720
}


@pytest.mark.parametrize("filename, expected", sorted(LATER_KV_PER_TOKEN_BF16.items()))
def test_later_library_kv_bytes_per_token_bf16(filename, expected):
    result = estimate(load(filename), ctx=1, kv_dtype_name="bf16")
    assert result.kv_bytes_per_token == expected
    # one token of every attention layer plus the recurrent state of the others
    assert result.kv_bytes_per_sequence == expected + result.state_bytes_per_sequence


def test_qwen36_35b_state_by_hand():
    # 30 Gated DeltaNet layers: conv (2 x 16 x 128 keys + 32 x 128 values) x (4 - 1) = 24,576 bf16 elements and
    # an fp32 (mamba_ssm_dtype) state of 32 heads x 128 x 128 = 524,288 elements
    result = estimate(load("Qwen__Qwen3.6-35B-A3B.json"), ctx=32768, kv_dtype_name="bf16")
    assert result.state_bytes_per_sequence == 30 * (24_576 * 2 + 524_288 * 4)  # 64,389,120
    assert result.kv_bytes_per_sequence == 10 * 2 * 2 * 256 * 2 * 32768 + 64_389_120


def test_granite_4_h_small_state_by_hand():
    # 36 Mamba-2 layers (128 heads of 64 = 8,192 channels, d_state 128, 1 group, kernel 4): conv (8,192 + 2 x 128)
    # x 3 and ssm 128 x 64 x 128 elements, bf16
    result = estimate(load("ibm-granite__granite-4.0-h-small.json"), ctx=8192, kv_dtype_name="bf16")
    assert result.state_bytes_per_sequence == 36 * ((8192 + 2 * 128) * 3 + 128 * 64 * 128) * BF16  # 77,322,240


def test_granite_4_h_parameters_match_the_model_cards():
    # IBM's model cards: Granite-4.0-H-Small 32B total, 9B active; Granite-4.0-H-1B 1.5B
    small = load("ibm-granite__granite-4.0-h-small.json").params
    one_b = load("ibm-granite__granite-4.0-h-1b.json").params
    assert round(small.total / 1e9) == 32 and round(small.active / 1e9) == 9
    assert round(one_b.total / 1e9, 1) == 1.5


def test_deepseek_v2_parameters_match_the_model_card():
    # DeepSeek-V2's model card and paper: 236B total parameters, 21B activated per token
    params = load("deepseek-ai__DeepSeek-V2.json").params
    assert round(params.total / 1e9) == 236 and round(params.active / 1e9) == 21


def test_falcon_h1_05b_state_and_parameters():
    # 36 Mamba-2 mixers beside the attention, mamba_d_ssm 1,536 channels (24 heads of 64), d_state 128, 1 group:
    # conv (1,536 + 2 x 128) x 3 and ssm 24 x 64 x 128 elements, bf16
    model = load("tiiuae__Falcon-H1-0.5B-Instruct.json")
    result = estimate(model, ctx=16384, kv_dtype_name="bf16")
    assert result.state_bytes_per_sequence == 36 * ((1536 + 2 * 128) * 3 + 24 * 64 * 128) * BF16  # 14,542,848
    assert round(model.params.total / 1e9, 1) == 0.5  # the model's name


def test_qwen36_27b_state_by_hand():
    # 48 Gated DeltaNet layers: conv (2 x 16 x 128 keys + 48 x 128 values) x 3 = 30,720 bf16 elements and an fp32
    # state of 48 heads x 128 x 128 = 786,432 elements
    result = estimate(load("Qwen__Qwen3.6-27B.json"), ctx=32768, kv_dtype_name="bf16")
    assert result.state_bytes_per_sequence == 48 * (30_720 * 2 + 786_432 * 4)  # 153,944,064


# ---------------------------------------------------------------------------------------------- windows


def test_gemma3_1b_sliding_pattern_at_8k():
    # 26 layers, sliding_window 512, pattern 6: layers 5, 11, 17, 23 global (4), the other 22 slide.
    # 1 KV head x head_dim 256: per layer per token 2 x 1 x 256 x 2 = 1,024 bytes.
    result = estimate(load("google__gemma-3-1b-it.json"), ctx=8192, kv_dtype_name="bf16")
    assert result.kv_bytes_per_sequence == 4 * 8192 * 1024 + 22 * 512 * 1024  # 45,088,768
    # ignoring the windows would give 26 full layers
    assert result.kv_bytes_per_sequence < 26 * 8192 * 1024


def test_gemma3_1b_global_layers_are_every_sixth():
    model = load("google__gemma-3-1b-it.json")
    full = [c.layer for c in model.caches if c.kind == "full"]
    sliding = [c for c in model.caches if c.kind == "sliding"]
    assert full == [5, 11, 17, 23]
    assert len(sliding) == 22 and {c.window for c in sliding} == {512}


MISTRAL_LAYER_TOKEN = 2 * 8 * 128 * BF16  # 4,096 bytes per layer per token: 8 KV heads x head_dim 128


def test_mistral_7b_window_caps_every_layer_at_32k():
    # sliding_window 4096 on all 32 layers: at 32k tokens each layer holds 4,096 tokens
    result = estimate(load("mistralai__Mistral-7B-v0.1.json"), ctx=32768, kv_dtype_name="bf16")
    assert result.kv_bytes_per_sequence == 32 * 4096 * MISTRAL_LAYER_TOKEN  # 512 MiB
    assert result.kv_bytes_per_sequence == 512 * MiB


def test_mistral_7b_below_the_window_holds_everything():
    result = estimate(load("mistralai__Mistral-7B-v0.1.json"), ctx=2048, kv_dtype_name="bf16")
    assert result.kv_bytes_per_sequence == 32 * 2048 * MISTRAL_LAYER_TOKEN  # 256 MiB


def test_phi3_mini_window_2047_on_all_layers():
    # 32 layers, 32 KV heads x 96: 2 x 32 x 96 x 2 = 12,288 bytes per layer per token; window 2047
    model = load("microsoft__Phi-3-mini-4k-instruct.json")
    assert {c.kind for c in model.caches} == {"sliding"}
    assert estimate(model, ctx=4096, kv_dtype_name="bf16").kv_bytes_per_sequence == 32 * 2047 * 12288
    assert estimate(model, ctx=1000, kv_dtype_name="bf16").kv_bytes_per_sequence == 32 * 1000 * 12288


def test_qwen25_instruct_sliding_window_unused():
    # sliding_window 131072 but use_sliding_window false: every layer is full attention
    model = load("Qwen__Qwen2.5-7B-Instruct.json")
    assert {c.kind for c in model.caches} == {"full"}
    per_token = 2 * 28 * 4 * 128 * BF16
    assert estimate(model, ctx=32768, kv_dtype_name="bf16").kv_bytes_per_sequence == per_token * 32768


def test_gpt_oss_20b_alternating_window_128_at_8k():
    # 24 layers alternating sliding (W 128) / full; 8 KV heads x 64: 2 x 8 x 64 x 2 = 2,048 bytes per layer
    # per token
    result = estimate(load("openai__gpt-oss-20b.json"), ctx=8192, kv_dtype_name="bf16")
    assert result.kv_bytes_per_sequence == 12 * 8192 * 2048 + 12 * 128 * 2048  # 204,472,320


def test_gpt_oss_120b_alternating_window_128_at_128k():
    # 36 layers: 18 full, 18 sliding (W 128)
    result = estimate(load("openai__gpt-oss-120b.json"), ctx=131072, kv_dtype_name="bf16")
    assert result.kv_bytes_per_sequence == 18 * 131072 * 2048 + 18 * 128 * 2048


def test_llama4_scout_chunked_attention_at_32k():
    # attention_chunk_size 8192; every 4th layer (3, 7, ..., 47) is global NoPE attention, the other 36
    # chunked.
    # 8 KV heads x 128: 2 x 8 x 128 x 2 = 4,096 bytes per layer per token.
    model = load("meta-llama__Llama-4-Scout-17B-16E-Instruct.json")
    assert [c.layer for c in model.caches if c.kind == "full"] == list(range(3, 48, 4))
    result = estimate(model, ctx=32768, kv_dtype_name="bf16")
    assert result.kv_bytes_per_sequence == (12 * 32768 + 36 * 8192) * (8 * 128 * 2 * 2)


def test_llama4_scout_below_one_chunk_holds_everything():
    result = estimate(load("meta-llama__Llama-4-Scout-17B-16E-Instruct.json"), ctx=4096, kv_dtype_name="bf16")
    assert result.kv_bytes_per_sequence == 48 * 4096 * 4096


# ------------------------------------------------------------------------------------- worked examples


def test_llama3_70b_fp16_per_token():
    # Llama-3-70B (same attention as 3.1): 80 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes = 327,680
    result = estimate(load("meta-llama__Llama-3.1-70B.json"), ctx=1, kv_dtype_name="fp16")
    assert result.kv_bytes_per_token == 327_680


def test_llama3_8b_batch_of_16_at_8000_tokens_fp16():
    # Llama-3-8B: 131,072 B/token (engines.md 7.1); 8000 tokens x 16 sequences = 16.78 GB
    result = estimate(load("meta-llama__Llama-3.1-8B.json"), ctx=8000, batch=16, kv_dtype_name="fp16")
    assert result.kv_bytes_per_token == 131_072
    assert result.kv_bytes_total == 131_072 * 8000 * 16  # 16,777,216,000
    assert round(result.kv_bytes_total / GB, 1) == 16.8
    assert result.kv_bytes_per_sequence == 131_072 * 8000


def test_llama3_8b_batch_of_16_fp8_is_half():
    result = estimate(load("meta-llama__Llama-3.1-8B.json"), ctx=8000, batch=16, kv_dtype_name="fp8")
    assert result.kv_bytes_total == 131_072 * 8000 * 16 // 2


def test_deepseek_v3_mla_bf16_and_fp8():
    model = load("deepseek-ai__DeepSeek-V3.json")
    assert estimate(model, ctx=1, kv_dtype_name="bf16").kv_bytes_per_token == 70_272  # 61 x 576 x 2
    assert estimate(model, ctx=1, kv_dtype_name="fp8").kv_bytes_per_token == 35_136  # 61 x 576 x 1
    # one latent row per layer, no KV heads: the nominal num_key_value_heads 128 must not count
    assert estimate(model, ctx=1000, kv_dtype_name="bf16").kv_bytes_per_sequence == 70_272 * 1000


def test_deepseek_v3_default_kv_dtype_is_the_model_dtype():
    # vLLM kv_cache_dtype "auto" = model dtype (bf16); the fp8 quantization_config is about weights
    result = estimate(load("deepseek-ai__DeepSeek-V3.json"), ctx=1)
    assert result.kv_dtype == "bf16"
    assert result.kv_bytes_per_token == 70_272


def _gemma3_27b():
    path = SPECS / "google__gemma-3-27b-it.json"
    if path.is_file():
        return load(path.name)
    # Gemma3ForConditionalGeneration layout, values from google/gemma-3-27b-it's config.json
    config = {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "torch_dtype": "bfloat16",
        "text_config": {
            "model_type": "gemma3_text",
            "num_hidden_layers": 62,
            "num_attention_heads": 32,
            "num_key_value_heads": 16,
            "head_dim": 128,
            "hidden_size": 5376,
            "intermediate_size": 21504,
            "sliding_window": 1024,
            "sliding_window_pattern": 6,
            "vocab_size": 262208,
        },
        "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152},
    }
    return model_from_config(config, "google/gemma-3-27b-it", "inline")


def test_gemma3_27b_windows_at_8k():
    # 62 layers = 10 full (5, 11, ..., 59) + 52 sliding (W 1024); 16 KV heads x head_dim 128 (not 5376/32 =
    # 168):
    # 2 x 16 x 128 x 2 = 8,192 bytes per layer per token (engines.md 7.2)
    model = _gemma3_27b()
    assert [c.layer for c in model.caches if c.kind == "full"] == list(range(5, 62, 6))
    result = estimate(model, ctx=8192, kv_dtype_name="bf16")
    assert result.kv_bytes_per_token == 62 * 8192
    # kvplan's analytic figure keeps min(ctx, W) = 1024 tokens per sliding layer (HF's DynamicCache keeps W -
    # 1)
    assert result.kv_bytes_per_sequence == 10 * 8192 * 8192 + 52 * 1024 * 8192  # 1,107,296,256
    assert round(result.kv_bytes_per_sequence / GB, 1) == 1.1
    # all-full would be 62 x 8192 x 8192 = 4.2 GB
    assert result.kv_bytes_per_sequence < 62 * 8192 * 8192 / 3


# ---------------------------------------------------------------------------------------------- parameters

# file -> published total parameters (model cards / safetensors metadata on the Hub)
PUBLISHED_TOTAL = {
    "meta-llama__Llama-3.1-8B.json": 8.03e9,
    "meta-llama__Llama-3.1-70B.json": 70.6e9,
    "meta-llama__Llama-3.1-405B.json": 405.85e9,
    "mistralai__Mixtral-8x7B-v0.1.json": 46.7e9,
    "deepseek-ai__DeepSeek-V3.json": 671e9,  # without the 14B multi-token-prediction module
    "deepseek-ai__DeepSeek-V4-Flash.json": 284e9,  # model card: 284B total, 13B activated
    "Qwen__Qwen3-30B-A3B.json": 30.5e9,
    "openai__gpt-oss-120b.json": 116.83e9,  # gpt-oss model card
    "openai__gpt-oss-20b.json": 20.91e9,
    "Qwen__Qwen3-8B.json": 8.19e9,
    "Qwen__Qwen3-32B.json": 32.8e9,
    "meta-llama__Llama-2-7b-hf.json": 6.74e9,
    "meta-llama__Llama-2-70b-hf.json": 68.98e9,
    "mistralai__Mistral-7B-v0.1.json": 7.24e9,
    "microsoft__phi-2.json": 2.78e9,
    "microsoft__Phi-3-mini-4k-instruct.json": 3.82e9,
    "microsoft__phi-4.json": 14.7e9,
    "google__gemma-2b-it.json": 2.51e9,
    "google__gemma-3-1b-it.json": 1.0e9,
    "openai__gpt2.json": 124.4e6,
    "tiiuae__falcon-7b.json": 6.92e9,
    "deepseek-ai__DeepSeek-V2-Lite.json": 15.7e9,
    "Qwen__Qwen2.5-7B.json": 7.62e9,
    # multimodal: the vision tower and projector are loaded with the decoder and count in the total
    "google__gemma-3-4b-it.json": 4.3e9,
    "google__gemma-3-12b-it.json": 12.2e9,
    "google__gemma-3-27b-it.json": 27.4e9,
    "meta-llama__Llama-4-Scout-17B-16E-Instruct.json": 109e9,
    "meta-llama__Llama-4-Maverick-17B-128E-Instruct.json": 400e9,
    "LiquidAI__LFM2-1.2B.json": 1.17e9,  # LFM2 model card: 1.17B
    "MiniMaxAI__MiniMax-M2.7.json": 230e9,  # MiniMax-M2 model cards: 230B total, 10B active
    "MiniMaxAI__MiniMax-M2.5.json": 230e9,
    "Qwen__Qwen3-235B-A22B-FP8.json": 235e9,  # model card: 235B in total, 22B activated
    "Qwen__Qwen3.5-397B-A17B.json": 397e9,  # model card: 397B in total, 17B activated
}


@pytest.mark.parametrize("filename, published", sorted(PUBLISHED_TOTAL.items()))
def test_parameter_total_within_1_percent_of_published(filename, published):
    total = load(filename).params.total
    assert abs(total - published) <= 0.01 * published, f"{total:,} vs published {published:,.0f}"


# Exact totals published by the Hub (safetensors metadata) for dense models whose layout is fully in the
# config.
PUBLISHED_EXACT = {
    "openai__gpt2.json": 124_439_808,
    "meta-llama__Llama-3.1-8B.json": 8_030_261_248,
    "mistralai__Mistral-7B-v0.1.json": 7_241_732_096,
    "meta-llama__Llama-2-7b-hf.json": 6_738_415_616,
    # multimodal checkpoints: text decoder plus vision tower and projector, all in BF16
    "google__gemma-3-4b-it.json": 4_300_079_472,
    "google__gemma-3-12b-it.json": 12_187_325_040,
    "google__gemma-3-27b-it.json": 27_432_406_640,
    "meta-llama__Llama-4-Scout-17B-16E-Instruct.json": 108_641_793_536,
    "meta-llama__Llama-4-Maverick-17B-128E-Instruct.json": 401_583_781_376,
    # the checkpoint's tensors, summed from its safetensors headers (the model card rounds to "48B total, 3B
    # activated"); the routers' e_score_correction_bias is among them
    "moonshotai__Kimi-Linear-48B-A3B-Instruct.json": 49_122_681_728,
}


@pytest.mark.parametrize("filename, published", sorted(PUBLISHED_EXACT.items()))
def test_parameter_total_exact(filename, published):
    assert load(filename).params.total == published


def test_gpt2_parameters_by_hand():
    # GPT-2 small: wte 50257 x 768 + wpe 1024 x 768; per layer c_attn 768 x 2304 + 2304, c_proj 768 x 768 +
    # 768,
    # c_fc 768 x 3072 + 3072, mlp c_proj 3072 x 768 + 768, 2 LayerNorms 2 x 2 x 768; final LayerNorm 2 x 768;
    # tied head
    per_layer = (768 * 2304 + 2304) + (768 * 768 + 768) + (768 * 3072 + 3072) + (3072 * 768 + 768) + 4 * 768
    expected = 50257 * 768 + 1024 * 768 + 12 * per_layer + 2 * 768
    assert expected == 124_439_808
    assert load("openai__gpt2.json").params.total == expected


def test_llama31_8b_parameters_by_hand():
    # embed 128256 x 4096, untied lm_head the same; per layer q 4096x4096, k and v 4096x1024, o 4096x4096,
    # gate/up/down 3 x 4096 x 14336, 2 RMSNorms; final RMSNorm
    per_layer = 4096 * 4096 + 2 * 4096 * 1024 + 4096 * 4096 + 3 * 4096 * 14336 + 2 * 4096
    assert load("meta-llama__Llama-3.1-8B.json").params.total == 2 * 128256 * 4096 + 32 * per_layer + 4096


def test_minimax_m27_parameters_are_its_checkpoint_less_fp8_scales():
    # The checkpoint's safetensors hold 228,703,644,928 elements, fp8 block scales (weight_scale_inv, one per
    # 128 x 128 block) among them: per layer 256 experts x (w1 12 x 24 + w2 24 x 12 + w3 12 x 24) and attention
    # q 48 x 24 + k 8 x 24 + v 8 x 24 + o 24 x 48, over 62 layers
    scales = 62 * (256 * 3 * 12 * 24 + 48 * 24 + 8 * 24 + 8 * 24 + 24 * 48)
    assert load("MiniMaxAI__MiniMax-M2.7.json").params.total == 228_703_644_928 - scales


def test_mixtral_active_parameters():
    # Mixtral 8x7B: 46.7B total, 12.9B active (2 of 8 experts per token)
    params = load("mistralai__Mixtral-8x7B-v0.1.json").params
    assert abs(params.active - 12.9e9) <= 0.01 * 12.9e9


def test_qwen3_30b_a3b_active_parameters():
    # published "3.3B activated", a two-significant-figure figure: allow 2%
    params = load("Qwen__Qwen3-30B-A3B.json").params
    assert abs(params.active - 3.3e9) <= 0.02 * 3.3e9
    assert params.total > 9 * params.active


@pytest.mark.parametrize(("filename", "active"), [
    ("Qwen__Qwen3-235B-A22B-FP8.json", 22),  # model card: 22B activated
    ("Qwen__Qwen3.5-397B-A17B.json", 17),  # model card: 17B activated
])
def test_active_parameters_of_the_larger_qwen_moe_models(filename, active):
    """Model cards give whole billions; kvplan's active count is the decoder less the routed experts not
    chosen, embedding and lm_head included (22.19B and 17.35B)."""
    assert round(load(filename).params.active / 1e9) == active


def test_qwen35_397b_state_by_hand():
    # 45 Gated DeltaNet layers: conv (2 x 16 x 128 keys + 64 x 128 values) x (4 - 1) = 36,864 bf16 elements and
    # an fp32 (mamba_ssm_dtype) state of 64 heads x 128 x 128 = 1,048,576 elements
    result = estimate(load("Qwen__Qwen3.5-397B-A17B.json"), ctx=1, kv_dtype_name="bf16")
    assert result.state_bytes_per_sequence == 45 * (36_864 * 2 + 1_048_576 * 4)  # 192,055,296


def test_llama4_active_parameters_leave_the_vision_tower_out():
    # published "17B active parameters" for Scout (16 experts) and Maverick (128): two significant figures
    for filename in ("meta-llama__Llama-4-Scout-17B-16E-Instruct.json",
                     "meta-llama__Llama-4-Maverick-17B-128E-Instruct.json"):
        params = load(filename).params
        assert abs(params.active - 17e9) <= 0.02 * 17e9
        assert params.vision > 0 and params.active + params.vision < params.total


def test_gemma3_vision_tower_by_hand():
    # SigLIP So400m/14 at 896 px: patch conv 3 x 14 x 14 x 1152 + bias, 64 x 64 positions x 1152; per layer
    # q, k, v, o 1152 x 1152 + bias, fc1/fc2 1152 x 4304 + biases, 2 LayerNorms; 27 layers; post LayerNorm;
    # projector 1152 x 3840 (text hidden) and an RMSNorm of 1152
    layer = 4 * (1152 * 1152 + 1152) + 2 * 1152 * 4304 + 4304 + 1152 + 4 * 1152
    tower = 3 * 14 * 14 * 1152 + 1152 + 64 * 64 * 1152 + 27 * layer + 2 * 1152
    assert load("google__gemma-3-12b-it.json").params.vision == tower + 1152 * 3840 + 1152


def test_multimodal_tower_kvplan_does_not_know_is_left_out_with_a_note():
    llava = {"model_type": "llava", "vision_config": {"model_type": "clip_vision_model", "hidden_size": 1024},
             "text_config": {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
                             "num_attention_heads": 32, "intermediate_size": 11008, "vocab_size": 32064}}
    model = model_from_config(llava, "llava", "test")
    assert model.params.vision == 0
    assert any("vision encoder of llava is not counted" in note for note in model.notes)


def test_flat_multimodal_config_says_its_tower_is_not_counted():
    # Qwen2-VL's config.json on the Hub keeps vision_config beside the decoder's fields, with no text_config
    qwen2_vl = {"model_type": "qwen2_vl", "vision_config": {"depth": 32, "embed_dim": 1280}, "hidden_size": 3584,
                "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
                "intermediate_size": 18944, "vocab_size": 152064, "torch_dtype": "bfloat16"}
    model = model_from_config(qwen2_vl, "qwen2-vl", "test")
    assert model.params.vision == 0
    assert any("the vision encoder of qwen2_vl is not counted" in note for note in model.notes)


def test_qwen3_vl_235b_tower_against_vllms_loading_logs():
    """vLLM PR #26000 (Qwen3-VL-235B-A22B, TP 8): "Model loading took 55.4919 GiB" per GPU with the tower's weights
    split over the 8 ranks, 56.4331 GiB with the tower replicated on each (--mm-encoder-tp-mode data). The difference
    is 7/8 of the tower: 0.9412 x 8 / 7 = 1.0756 GiB in bf16. Its vision_config is Qwen3-VL's published one."""
    vision = {"depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16, "in_channels": 3,
              "patch_size": 16, "temporal_patch_size": 2, "spatial_merge_size": 2, "num_position_embeddings": 2304,
              "out_hidden_size": 4096, "deepstack_visual_indexes": [8, 16, 24]}
    text = {"model_type": "qwen3_vl_moe_text", "hidden_size": 4096, "num_hidden_layers": 94, "num_attention_heads": 64,
            "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 12288, "moe_intermediate_size": 1536,
            "num_experts": 128, "num_experts_per_tok": 8, "vocab_size": 151936}
    model = model_from_config({"model_type": "qwen3_vl_moe", "vision_config": vision, "text_config": text,
                               "torch_dtype": "bfloat16"}, "qwen3-vl-235b", "test")
    measured = (56.4331 - 55.4919) * 8 / 7 * 2**30
    assert abs(model.params.vision * 2 - measured) <= 0.005 * measured
    assert model.multimodal.tower_modalities == ("image", "video")


def test_dense_models_have_active_equal_total():
    for filename in ("meta-llama__Llama-3.1-8B.json", "Qwen__Qwen3-32B.json", "microsoft__phi-4.json"):
        params = load(filename).params
        assert params.active == params.total


# ---------------------------------------------------------------------------------------------- weights

LLAMA8B_EMBED = 128256 * 4096  # embedding; lm_head (untied) the same size
LLAMA8B_LINEAR = 32 * (4096 * 4096 + 2 * 4096 * 1024 + 4096 * 4096 + 3 * 4096 * 14336)  # 6,979,321,856
LLAMA8B_NORMS = 65 * 4096  # 2 per layer + final


def test_llama31_8b_bf16_weights_are_two_bytes_a_parameter():
    result = estimate(load("meta-llama__Llama-3.1-8B.json"), ctx=1)
    assert result.weights_dtype == "bf16"
    assert result.weights_bytes == 8_030_261_248 * 2


def test_llama31_8b_quantised_weights_keep_embeddings_in_bf16():
    model = load("meta-llama__Llama-3.1-8B.json")
    bf16 = estimate(model, ctx=1).weights_bytes
    fp8 = estimate(model, ctx=1, weights_dtype_name="fp8").weights_bytes
    int4 = estimate(model, ctx=1, weights_dtype_name="int4").weights_bytes
    assert int4 < fp8 < bf16
    kept_bf16 = (2 * LLAMA8B_EMBED + LLAMA8B_NORMS) * 2  # embedding, lm_head, norms stay bf16
    # fp8: 1 byte per linear weight
    assert fp8 == LLAMA8B_LINEAR + kept_bf16
    # AWQ/GPTQ int4, group 128: 128 x 4 bit + fp16 scale + 4-bit zero = 66.5 bytes per 128 weights = 133 per
    # 256
    assert int4 == LLAMA8B_LINEAR // 256 * 133 + kept_bf16  # 5,727,854,592
    assert int4 > kept_bf16  # embeddings are not quantised
    # int4 of everything would be far smaller than what kvplan reports
    assert int4 > 8_030_261_248 * 133 // 256 + 1e9


def test_float_weights_override_applies_to_everything():
    result = estimate(load("meta-llama__Llama-3.1-8B.json"), ctx=1, weights_dtype_name="fp32")
    assert result.weights_bytes == 8_030_261_248 * 4


def test_deepseek_v3_default_weights_are_fp8():
    # quantization_config quant_method fp8 (block 128x128): linear weights 1 byte; embeddings, norms bf16
    model = load("deepseek-ai__DeepSeek-V3.json")
    result = estimate(model, ctx=1)
    assert result.weights_dtype == "fp8"
    total = model.params.total
    assert total <= result.weights_bytes <= 1.01 * total
    # embedding 129280 x 7168 and the untied lm_head, at 2 bytes, are in it
    assert result.weights_bytes >= total + 2 * 129280 * 7168


def test_gpt_oss_120b_default_weights_mxfp4_on_experts_only():
    # quantization_config mxfp4, modules_to_not_convert self_attn, router, embed_tokens, lm_head
    model = load("openai__gpt-oss-120b.json")
    result = estimate(model, ctx=1)
    assert result.weights_dtype == "mxfp4"
    per_param = result.weights_bytes / model.params.total
    assert 0.5 < per_param < 0.6, per_param
    # experts: 36 layers x 128 experts x (gate_up 2880 x 5760 + down 2880 x 2880) in MXFP4 (17 bytes per 32)
    experts = 36 * 128 * 3 * 2880 * 2880
    assert result.weights_bytes > experts * 17 // 32
    # attention is not converted: it weighs more than if it were MXFP4
    mxfp4_everything = estimate(model, ctx=1, weights_dtype_name="mxfp4").weights_bytes
    assert result.weights_bytes > mxfp4_everything


# gpt-oss model card (OpenAI, Aug 2025), table 1: checkpoint size 60.8 GiB (120b) and 12.8 GiB (20b):
# MXFP4 experts, everything else stored in BF16.
@pytest.mark.parametrize(
    "filename, checkpoint_gib", [("openai__gpt-oss-120b.json", 60.8), ("openai__gpt-oss-20b.json", 12.8)]
)
def test_gpt_oss_weights_match_published_checkpoint_size(filename, checkpoint_gib):
    result = estimate(load(filename), ctx=1)
    assert abs(result.weights_bytes / GiB - checkpoint_gib) <= 0.03 * checkpoint_gib, (
        result.weights_bytes / GiB
    )


# ---------------------------------------------------------------------------------------------- KV dtypes


# llama.cpp figures for Llama-3-8B at n_ctx 8192 (engines.md 7.1): f16 1024 MiB, q8_0 544 MiB, q4_0 288 MiB.
# Each layer has a K and a V row of 8 x 128 = 1,024 elements per token; q8_0 stores 32 elements in 34 bytes,
# q4_0 in 18.
@pytest.mark.parametrize(
    "dtype, row_bytes, mib",
    [
        ("fp16", 1024 * 2, 1024),
        ("f16", 1024 * 2, 1024),
        ("q8_0", 1024 // 32 * 34, 544),
        ("q4_0", 1024 // 32 * 18, 288),
    ],
)
def test_llama_cpp_kv_dtypes(dtype, row_bytes, mib):
    result = estimate(load("meta-llama__Llama-3.1-8B.json"), ctx=8192, kv_dtype_name=dtype)
    assert result.kv_bytes_per_sequence == 32 * 2 * 8192 * row_bytes
    assert result.kv_bytes_per_sequence == mib * MiB


def test_fp32_kv_is_twice_bf16():
    model = load("openai__gpt2.json")
    assert estimate(model, ctx=1, kv_dtype_name="fp32").kv_bytes_per_token == 2 * 12 * 12 * 64 * 4


def test_gpt2_default_dtype_is_fp32():
    # GPT-2's config names no torch_dtype; transformers loads it in float32
    result = estimate(load("openai__gpt2.json"), ctx=1)
    assert result.kv_dtype == "fp32"
    assert result.kv_bytes_per_token == 2 * 12 * 12 * 64 * 4
    assert result.weights_bytes == 124_439_808 * 4


def test_max_context_warning():
    # Llama 2 has a 4,096-token context
    result = estimate(load("meta-llama__Llama-2-7b-hf.json"), ctx=4097)
    assert result.warnings and "4,096" in result.warnings[0]
    assert estimate(load("meta-llama__Llama-2-7b-hf.json"), ctx=4096).warnings == []


def test_state_is_zero_for_attention_only_models():
    assert estimate(load("meta-llama__Llama-3.1-8B.json"), ctx=8192).state_bytes_per_sequence == 0


def test_gpt_oss_default_kv_dtype_is_bf16():
    # gpt-oss's config.json names no torch_dtype, but the checkpoint stores every non-expert tensor in BF16
    # (the
    # model card's 12.8 GiB checkpoint only adds up that way), and engines serve it with a bf16 KV cache:
    # 2 x 24 layers x 8 KV heads x 64 x 2 bytes
    result = estimate(load("openai__gpt-oss-20b.json"), ctx=1)
    assert result.kv_dtype == "bf16"
    assert result.kv_bytes_per_token == 2 * 24 * 8 * 64 * 2
