"""GPT-2-era decoders: BLOOM, CodeGen, CTRL, DBRX, Falcon, GPT-Neo, GPT-NeoX-Japanese, GPT-J, MPT, GPT-1, OPT,
XGLM, XLM, and the families kvplan refuses (XLNet, Reformer, CPM-Ant).

Expected figures are published parameter counts, hand arithmetic from the config (written out here), vLLM's
allocation rules applied by hand, or transformers' own meta-device builds and caches; never kvplan's output.
"""

import pytest
from conftest import GiB

from kvplan.capacity import Parallelism, Workload, capacity
from kvplan.errors import KvplanError
from kvplan.memory import estimate
from kvplan.sources.hf_config import model_from_config

BF16 = 2
BUDGET = 60 * GiB


def read(config: dict):
    return model_from_config(config, "test/model", "inline test config")


def per_token(config: dict) -> int:
    return estimate(read(config), ctx=1, kv_dtype_name="bf16").kv_bytes_per_token


def engine_per_sequence(config: dict, ctx: int, engine: str, **kwargs) -> int:
    return capacity(read(config), Workload(ctx=ctx), engine_name=engine, kv_budget=BUDGET,
                    **kwargs).engine_kv_bytes_per_sequence


def transformers_parameters(model_type: str, fields: dict) -> int:
    """transformers' causal-LM class for these fields, built on the meta device: its parameters, tied ones once."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(CONFIG_MAPPING[model_type](**fields))
    return sum(p.numel() for p in model.parameters())


# bigscience/bloom (config.json): 70 layers, 112 heads, hidden 14336, vocab 250880; ALiBi, no position table
BLOOM_176B = {"model_type": "bloom", "n_layer": 70, "n_head": 112, "hidden_size": 14336, "vocab_size": 250880,
              "torch_dtype": "bfloat16"}
# databricks/dbrx-instruct (config.json): 40 layers, 48 heads, d_model 6144, 8 KV heads, 16 experts of 10752, top 4
DBRX = {"model_type": "dbrx", "n_layers": 40, "n_heads": 48, "d_model": 6144, "vocab_size": 100352,
        "max_seq_len": 32768, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "attn_config": {"kv_n_heads": 8, "clip_qkv": 8, "rope_theta": 500000},
        "ffn_config": {"ffn_act_fn": {"name": "silu"}, "ffn_hidden_size": 10752, "moe_num_experts": 16,
                       "moe_top_k": 4}}
# EleutherAI/gpt-neo-1.3B (config.json): 24 layers alternating global and local (window 256), 16 heads of 128
GPT_NEO_13B = {"model_type": "gpt_neo", "num_layers": 24, "num_heads": 16, "hidden_size": 2048, "vocab_size": 50257,
               "max_position_embeddings": 2048, "window_size": 256, "intermediate_size": None,
               "attention_types": [[["global", "local"], 12]], "torch_dtype": "float32"}


# ------------------------------------------------------------------------------------- published checkpoints


def test_bloom_176b_parameters_as_published():
    # BLOOM's model card: 176,247,271,424 parameters. By hand: embeddings 250880 x 14336 and their LayerNorm;
    # per layer 12 x 14336^2 weights (qkv 3, dense 1, MLP 2 x 4), biases 3h + h + 4h + h, two LayerNorms 4h;
    # final LayerNorm 2h; tied head.
    h = 14336
    per_layer = 12 * h * h + 9 * h + 4 * h
    assert read(BLOOM_176B).params.total == 250880 * h + 2 * h + 70 * per_layer + 2 * h == 176_247_271_424


def test_bloom_kv_is_full_mha_per_layer():
    # ALiBi leaves keys and values as plain MHA: 2 x 70 layers x 112 heads x 128 x 2 B
    assert per_token(BLOOM_176B) == 2 * 70 * 112 * 128 * BF16 == 4_014_080


def test_bloom_vllm_block():
    # vLLM (bloom.py, FullAttentionSpec): page = 16 tokens x 2 x 112 heads x 128 x 2 B = 917,504 B a layer; one
    # group of 70 layers -> a block of 64,225,280 B; 8,192 tokens = 512 blocks
    cap = capacity(read(BLOOM_176B), Workload(ctx=8192), kv_budget=BUDGET)
    assert cap.vllm_block_bytes == 70 * 16 * 2 * 112 * 128 * BF16 == 64_225_280
    assert cap.vllm_blocks_per_sequence == 512


def test_dbrx_total_and_active_as_published():
    # Databricks: 132B total parameters, 36B active. By hand: embeddings and head 2 x 100352 x 6144; per layer
    # Wqkv 6144 x (6144 + 2 x 8 x 128), out 6144^2, 16 experts of 3 x 6144 x 10752 (4 active), router 6144 x 16,
    # two weight-only LayerNorms; final LayerNorm.
    spec = read(DBRX)
    attention = 6144 * (6144 + 2 * 8 * 128) + 6144 * 6144
    expert = 3 * 6144 * 10752
    rest = 2 * 100352 * 6144 + 6144
    assert spec.params.total == rest + 40 * (attention + 16 * expert + 6144 * 16 + 2 * 6144) == 131_596_523_520
    assert spec.params.active == rest + 40 * (attention + 4 * expert + 6144 * 16 + 2 * 6144)
    assert spec.params.total == pytest.approx(132e9, rel=0.01)
    assert spec.params.active == pytest.approx(36e9, rel=0.02)


def test_dbrx_kv_heads_from_attn_config():
    # attn_config.kv_n_heads 8 (DbrxAttention; vLLM's DbrxModelArchConfigConvertor): 2 x 40 x 8 x 128 x 2 B
    assert per_token(DBRX) == 2 * 40 * 8 * 128 * BF16 == 163_840
    # a top-level num_key_value_heads (DbrxConfig writes one) does not override the nested field
    assert per_token({**DBRX, "num_key_value_heads": 48}) == 163_840


def test_dbrx_and_mpt_context_limit_is_max_seq_len():
    assert read(DBRX).max_context == 32768
    assert read({"model_type": "mpt", "d_model": 4096, "n_heads": 32, "n_layers": 32, "vocab_size": 50432,
                 "max_seq_len": 2048}).max_context == 2048


def test_dbrx_vllm_tp8_holds_one_kv_head_per_gpu():
    # 8 KV heads over TP 8: 1 head per GPU; page = 16 x 2 x 1 x 128 x 2 B = 8,192 B a layer, x 40 layers
    cap = capacity(read(DBRX), Workload(ctx=8192), kv_budget=BUDGET, parallel=Parallelism(gpus=8, tp=8))
    assert cap.vllm_block_bytes == 40 * 16 * 2 * 1 * 128 * BF16


# -------------------------------------------------------------------------------------------------- Falcon


def test_falcon_saved_by_transformers_multi_query_wins_over_num_kv_heads():
    # FalconConfig writes num_kv_heads = num_attention_heads (71) into every config it saves, while multi_query
    # keeps one KV head (FalconAttention: num_kv_heads counts only with new_decoder_architecture). Reading
    # num_kv_heads gave 71 heads, 71 times too many.
    saved = {"model_type": "falcon", "num_hidden_layers": 32, "num_attention_heads": 71, "num_kv_heads": 71,
             "hidden_size": 4544, "multi_query": True, "new_decoder_architecture": False, "vocab_size": 65024,
             "torch_dtype": "bfloat16"}
    assert per_token(saved) == 2 * 32 * 1 * 64 * BF16 == 8192
    # multi_query absent: FalconConfig's default is true
    assert per_token({k: v for k, v in saved.items() if k != "multi_query"}) == 8192
    # multi_query false: every head, whatever num_kv_heads says
    assert per_token({**saved, "multi_query": False, "num_kv_heads": 8}) == 2 * 32 * 71 * 64 * BF16


@pytest.mark.parametrize("model_id, expected", [
    ("tiiuae/falcon-7b", 2 * 32 * 1 * 64 * BF16),  # multi_query: one KV head of 4544 / 71 = 64
    ("tiiuae/falcon-40b", 2 * 60 * 8 * 64 * BF16),  # RefinedWeb: n_head_kv 8, head_dim 8192 / 128 = 64
])
def test_bundled_falcon_models_keep_their_kv(model_id, expected):
    from kvplan.sources import load_model

    assert estimate(load_model(model_id), ctx=1).kv_bytes_per_token == expected


# --------------------------------------------------------------------------------------------------- GPT-Neo


def test_gpt_neo_local_layers_slide_over_window_size():
    spec = read(GPT_NEO_13B)
    assert [c.kind for c in spec.caches[:4]] == ["full", "sliding", "full", "sliding"]
    assert {c.window for c in spec.caches if c.kind == "sliding"} == {256}
    # at 8,192 tokens: 12 global layers hold 8,192 tokens, 12 local ones 256; 16 heads x 128, 2 x 2 B
    per_layer_token = 2 * 16 * 128 * BF16
    assert estimate(spec, ctx=8192, kv_dtype_name="bf16").kv_bytes_per_sequence == \
        12 * 8192 * per_layer_token + 12 * 256 * per_layer_token


def test_gpt_neo_attention_layers_win_over_attention_types():
    # GPTNeoConfig expands attention_types, then a saved attention_layers overrides it
    config = {**GPT_NEO_13B, "attention_layers": ["local"] * 24}
    assert {c.kind for c in read(config).caches} == {"sliding"}


def test_gpt_neo_transformers_keeps_local_layers_whole():
    # transformers' DynamicCache sees no sliding_window in GPTNeoConfig: every layer keeps all 8,192 tokens
    per_layer_token = 2 * 16 * 128 * BF16
    assert engine_per_sequence(GPT_NEO_13B, 8192, "transformers", kv_dtype_name="bf16") == \
        24 * 8192 * per_layer_token


def test_gpt_neo_vllm_sliding_groups():
    # Under vLLM's hybrid rules: 12 full and 12 sliding layers, group size 12; page = 16 x 2 x 16 x 128 x 2 B =
    # 131,072 B; a block = 12 pages. At L = 8,192 with I = 16,384: full cdiv(8192, 16) = 512 blocks, sliding
    # cdiv(min(255 + 16384, 8192), 16) + 1 = 513.
    cap = capacity(read(GPT_NEO_13B), Workload(ctx=8192), kv_budget=BUDGET, kv_dtype_name="bf16")
    assert cap.vllm_block_bytes == 12 * 16 * 2 * 16 * 128 * BF16
    assert cap.vllm_blocks_per_sequence == 512 + 513


def test_gpt_neo_window_crossed_in_a_real_cache(tmp_path):
    # window 16 at ctx 40: the model masks local layers to 16 tokens, but transformers' cache keeps all of them
    archkit = pytest.importorskip("archkit")
    pytest.importorskip("torch")
    result = archkit.check(tmp_path, "gpt_neo", archkit.shrunk("gpt_neo", window_size=16))
    assert result.exact, result


# ---------------------------------------------------------------------------- GPT-1 and XLM: no cache to keep


def test_transformers_keeps_no_cache_for_gpt1_and_xlm():
    gpt1 = {"model_type": "openai-gpt", "n_layer": 12, "n_head": 12, "n_embd": 768, "vocab_size": 40478,
            "n_positions": 512}
    xlm = {"model_type": "xlm", "n_layers": 12, "n_heads": 8, "emb_dim": 1024, "vocab_size": 64139, "causal": True}
    # what an engine that caches them would keep: 12 layers x 2 x every head (768 and 1024 wide) x 2 B
    assert per_token(gpt1) == 2 * 12 * 768 * BF16
    assert per_token(xlm) == 2 * 12 * 1024 * BF16
    for config in (gpt1, xlm):
        # generate() runs the whole sequence again for every token: nothing is kept
        assert engine_per_sequence(config, 512, "transformers") == 0


def test_bidirectional_xlm_caches_nothing():
    xlm = {"model_type": "xlm", "n_layers": 12, "n_heads": 16, "emb_dim": 2048, "vocab_size": 30145}
    spec = read(xlm)  # causal is false by default: a masked LM
    assert {c.kind for c in spec.caches} == {"none"}
    with pytest.raises(KvplanError, match="keeps no per-sequence cache"):
        capacity(spec, Workload(ctx=4096), kv_budget=BUDGET)


def test_causal_xlm_cache_is_empty_in_a_real_decode(tmp_path):
    archkit = pytest.importorskip("archkit")
    pytest.importorskip("torch")
    result = archkit.check(tmp_path, "xlm", archkit.shrunk("xlm", causal=True))
    assert result.exact and result.measured_kv == 0, result


# ------------------------------------------------------------------------------------- meta-device parameters


@pytest.mark.parametrize("model_type, fields", [
    # OPT-350m's shape: 512-wide embeddings projected to 1024, LayerNorm after each block, no final norm
    ("opt", {"hidden_size": 1024, "word_embed_proj_dim": 512, "num_hidden_layers": 2, "num_attention_heads": 16,
             "ffn_dim": 4096, "do_layer_norm_before": False, "vocab_size": 512}),
    ("opt", {"hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4, "ffn_dim": 64,
             "enable_bias": False, "layer_norm_elementwise_affine": False, "tie_word_embeddings": False,
             "vocab_size": 512}),
    # Falcon-RW style: every linear with a bias, MHA, sequential attention and MLP
    ("falcon", {"hidden_size": 256, "num_attention_heads": 4, "num_hidden_layers": 2, "multi_query": False,
                "bias": True, "parallel_attn": False, "alibi": True, "vocab_size": 512}),
    # Falcon-180B style: grouped KV heads, one LayerNorm before the parallel attention and MLP
    ("falcon", {"hidden_size": 256, "num_attention_heads": 8, "num_kv_heads": 2, "num_hidden_layers": 2,
                "new_decoder_architecture": True, "num_ln_in_parallel_attn": 1, "vocab_size": 512}),
    # the last layer alone has the attention output bias
    ("gpt_neox_japanese", {"hidden_size": 128, "num_attention_heads": 4, "num_hidden_layers": 1,
                           "vocab_size": 512}),
    ("gpt_neox_japanese", {"hidden_size": 128, "num_attention_heads": 4, "num_hidden_layers": 3,
                           "intermediate_multiple_size": 2, "vocab_size": 512}),
    ("xlm", {"emb_dim": 128, "n_heads": 4, "n_layers": 2, "n_langs": 3, "vocab_size": 512}),
    ("xlm", {"emb_dim": 128, "n_heads": 4, "n_layers": 2, "n_langs": 3, "use_lang_emb": False, "causal": True,
             "vocab_size": 512}),
    ("gpt_neo", {"hidden_size": 128, "num_heads": 4, "num_layers": 3, "intermediate_size": 96,
                 "attention_types": [[["local"], 3]], "vocab_size": 512}),
    ("codegen", {"n_embd": 128, "n_head": 4, "n_layer": 2, "n_inner": 96, "rotary_dim": 16, "vocab_size": 512}),
])
def test_variants_count_as_transformers_builds_them(model_type, fields):
    assert read({"model_type": model_type, **fields}).params.total == transformers_parameters(model_type, fields)


# ------------------------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize("config, field", [
    (dict(GPT_NEO_13B, attention_types=[["global", 24]]), "attention_types"),
    (dict(GPT_NEO_13B, attention_types=[[[["global"]], 24]]), "attention_types"),
    (dict(GPT_NEO_13B, attention_types=[[["global", "local"], 11]]), "attention_types"),
    (dict(GPT_NEO_13B, attention_layers=["global"] * 23), "attention_layers"),
    (dict(GPT_NEO_13B, attention_layers=["global", "sparse"] * 12), "global"),
    (dict(GPT_NEO_13B, window_size=0), "window_size"),
    (dict(DBRX, attn_config={"clip_qkv": 8}), "kv_n_heads"),
    (dict(DBRX, attn_config=8), "attn_config"),
    (dict(DBRX, ffn_config={"ffn_hidden_size": 10752, "moe_top_k": 4}), "moe_num_experts"),
    ({"model_type": "gpt_neox_japanese", "num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 128,
      "vocab_size": 512, "intermediate_multiple_size": "four"}, "intermediate_multiple_size"),
    ({"model_type": "mpt", "d_model": 128, "n_heads": 4, "n_layers": 2, "vocab_size": 512,
      "attn_config": {"attn_type": "grouped_query_attention", "kv_n_heads": 2}}, "attn_type"),
    ({"model_type": "mpt", "d_model": 128, "n_heads": 4, "n_layers": 2, "vocab_size": 512,
      "attn_config": {"alibi": False}}, "alibi"),
    ({"model_type": "mpt", "d_model": 128, "n_heads": 4, "n_layers": 2, "vocab_size": 512, "no_bias": False},
     "no_bias"),
    ({"model_type": "xlm", "emb_dim": 128, "n_heads": 4, "n_layers": 2, "vocab_size": 512, "asm": True}, "asm"),
])
def test_bad_fields_are_refused_naming_the_field(config, field):
    with pytest.raises(KvplanError, match=field) as refused:
        read(config)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("config, kept", [
    ({"model_type": "xlnet", "n_layer": 24, "n_head": 16, "d_model": 1024, "d_inner": 4096, "vocab_size": 32000,
      "mem_len": 512}, "mems"),
    ({"model_type": "reformer", "num_hidden_layers": 6, "num_attention_heads": 2, "hidden_size": 256,
      "attention_head_size": 128, "vocab_size": 320}, "hash buckets"),
    ({"model_type": "cpmant", "num_hidden_layers": 48, "num_attention_heads": 32, "hidden_size": 4096,
      "dim_head": 128, "vocab_size": 30720}, "prompt_length"),
])
def test_families_keeping_other_state_are_refused_saying_what_they_keep(config, kept):
    with pytest.raises(KvplanError, match=kept) as refused:
        read(config)
    assert "\n" not in str(refused.value)
