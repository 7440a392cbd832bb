"""GPT-2-era decoders: BLOOM, CodeGen, CTRL, DBRX, Falcon, GPT-Neo, GPT-NeoX-Japanese, GPT-J, MPT, GPT-1, OPT,
XGLM, XLM, and those whose cache is not plain keys and values: XLNet and Reformer (hidden states, hash buckets),
CPM-Ant (a prompt prefix).

Expected figures are published parameter counts, hand arithmetic from the config (written out here), vLLM's
allocation rules applied by hand, or transformers' own meta-device builds and caches; never kvplan's output.
"""

import pytest
from conftest import GiB

from kvplan.capacity import Parallelism, Workload, capacity
from kvplan.engines import EngineOptions
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

# xlnet-base-cased (config.json): 12 layers of 12 heads, d_model 768, d_inner 3072; mem_len and reuse_len null
XLNET_BASE = {"model_type": "xlnet", "n_layer": 12, "n_head": 12, "d_model": 768, "d_inner": 3072, "d_head": 64,
              "vocab_size": 32000, "mem_len": None, "reuse_len": None, "use_mems_eval": True, "attn_type": "bi",
              "ff_activation": "gelu", "untie_r": True}
# A causal Reformer: local and LSH layers in turn, 2 heads of 64 over hidden 256, chunks of 64, one hash round
REFORMER = {"model_type": "reformer", "num_hidden_layers": 6, "attn_layers": ["local", "lsh"] * 3,
            "num_attention_heads": 2, "attention_head_size": 64, "hidden_size": 256, "feed_forward_size": 512,
            "lsh_attn_chunk_length": 64, "local_attn_chunk_length": 64, "num_hashes": 1, "num_buckets": [64, 128],
            "axial_pos_shape": [512, 1024], "axial_pos_embds_dim": [64, 192], "max_position_embeddings": 524288,
            "is_decoder": True, "vocab_size": 320}
# openbmb/cpm-ant-10b: transformers' CpmAntConfig defaults (48 layers, 32 heads of 128, hidden 4096, dim_ff 10240,
# 32 prompt tokens of 32 types)
CPM_ANT_10B = {"model_type": "cpmant", "num_hidden_layers": 48, "num_attention_heads": 32, "dim_head": 128,
               "hidden_size": 4096, "dim_ff": 10240, "vocab_size": 30720, "prompt_length": 32, "prompt_types": 32,
               "segment_types": 32, "position_bias_num_buckets": 512}


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
    ("xlnet", {"d_model": 64, "n_head": 4, "n_layer": 2, "d_inner": 96, "vocab_size": 512}),
    ("xlnet", {"d_model": 64, "n_head": 4, "n_layer": 2, "d_inner": 96, "vocab_size": 512,
               "tie_word_embeddings": False}),
    # every layer LSH, one position table instead of the axial ones; all local with their query and key
    ("reformer", {"hidden_size": 64, "num_attention_heads": 2, "attention_head_size": 16, "feed_forward_size": 96,
                  "attn_layers": ["lsh", "lsh"], "axial_pos_embds": False, "max_position_embeddings": 256,
                  "is_decoder": True, "vocab_size": 512}),
    ("reformer", {"hidden_size": 64, "num_attention_heads": 2, "attention_head_size": 16, "feed_forward_size": 96,
                  "attn_layers": ["local"] * 3, "axial_pos_shape": [8, 16], "axial_pos_embds_dim": [16, 48],
                  "is_decoder": True, "vocab_size": 512}),
    ("cpmant", {"hidden_size": 64, "num_attention_heads": 4, "dim_head": 8, "dim_ff": 96, "num_hidden_layers": 2,
                "prompt_length": 8, "prompt_types": 3, "segment_types": 5, "position_bias_num_buckets": 64,
                "vocab_size": 512}),
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
    (dict(XLNET_BASE, reuse_len=256), "reuse_len"),
    (dict(XLNET_BASE, d_head=32), "d_head"),
    (dict(REFORMER, attn_layers=["local", "lsh"] * 2 + ["global"] * 2), "attn_layers"),
    (dict(REFORMER, attn_layers="lsh"), "attn_layers"),
    (dict(REFORMER, axial_pos_shape=[64]), "axial_pos_shape"),
])
def test_bad_fields_are_refused_naming_the_field(config, field):
    with pytest.raises(KvplanError, match=field) as refused:
        read(config)
    assert "\n" not in str(refused.value)


# ------------------------------------------------------------------ XLNet, Reformer, CPM-Ant: caches of their own

SERVING_ENGINES = ("vllm", "sglang", "llama.cpp", "tensorrt-llm")


@pytest.mark.parametrize("config", [XLNET_BASE, REFORMER, CPM_ANT_10B], ids=["xlnet", "reformer", "cpmant"])
@pytest.mark.parametrize("engine", SERVING_ENGINES)
def test_serving_engines_refuse_them_in_one_line(config, engine):
    # no vLLM, SGLang, llama.cpp or TensorRT-LLM release has a model class for them (vLLM: registry.py)
    with pytest.raises(KvplanError, match=f"does not run {config['model_type']} models.*--engine transformers") as no:
        capacity(read(config), Workload(ctx=4096), engine_name=engine, kv_budget=BUDGET)
    assert "\n" not in str(no.value)


@pytest.mark.parametrize("config", [XLNET_BASE, REFORMER, CPM_ANT_10B], ids=["xlnet", "reformer", "cpmant"])
def test_transformers_static_cache_is_refused(config):
    # XLNet and Reformer make caches of their own; CPM-Ant's prompt tokens overflow a StaticCache of ctx tokens
    # (transformers 5.23: "index 40 is out of bounds for dimension 2 with size 40" at ctx 40)
    with pytest.raises(KvplanError, match="static: a StaticCache of ctx tokens cannot hold") as refused:
        capacity(read(config), Workload(ctx=4096), engine_name="transformers", kv_budget=BUDGET,
                 options=EngineOptions(cache_implementation="static"))
    assert "\n" not in str(refused.value)


def test_xlnet_base_keeps_every_layers_input_for_every_token():
    # mem_len null: XLNetModel.cache_mem keeps all of them; 12 layers x d_model 768 x 2 B
    spec = read(XLNET_BASE)
    assert {(c.kind, c.width, c.memory) for c in spec.caches} == {("states", 768, None)}
    assert per_token(XLNET_BASE) == 12 * 768 * BF16 == 18_432
    assert estimate(spec, ctx=8192, kv_dtype_name="bf16").kv_bytes_per_sequence == 8192 * 18_432


def test_xlnet_memories_stop_at_mem_len():
    # mem_len 512: the last 512 tokens' hidden states, whatever the context
    config = {**XLNET_BASE, "mem_len": 512}
    assert estimate(read(config), ctx=300, kv_dtype_name="bf16").kv_bytes_per_sequence == 300 * 18_432
    assert estimate(read(config), ctx=8192, kv_dtype_name="bf16").kv_bytes_per_sequence == 512 * 18_432
    # XLNetConfig's default when a config omits mem_len is 512 too; mem_len 0 keeps all, as null does
    omitted = {k: v for k, v in config.items() if k != "mem_len"}
    assert estimate(read(omitted), ctx=8192, kv_dtype_name="bf16").kv_bytes_per_sequence == 512 * 18_432
    assert estimate(read({**config, "mem_len": 0}), ctx=8192).kv_bytes_per_token == 12 * 768 * 4


def test_xlnet_under_transformers_holds_the_whole_prompt_until_decoding():
    # XLNetModel.cache_mem cuts each layer's input to its last mem_len rows by slicing, a view: right after a
    # prompt of ctx - 1 tokens every row is still held, and once decoding runs the mem_len + 1 rows each step
    # concatenates
    cap = capacity(read({**XLNET_BASE, "mem_len": 512}), Workload(ctx=8192), engine_name="transformers",
                   kv_budget=BUDGET, kv_dtype_name="bf16")
    assert cap.engine_kv_bytes_per_sequence == 8191 * 18_432
    assert cap.engine_kv_bytes_per_sequence_decode == 513 * 18_432
    assert engine_per_sequence(XLNET_BASE, 8192, "transformers", kv_dtype_name="bf16") == 8192 * 18_432


def test_xlnet_without_memories_keeps_nothing():
    spec = read({**XLNET_BASE, "use_mems_eval": False})
    assert {c.kind for c in spec.caches} == {"none"}
    assert estimate(spec, ctx=4096).kv_bytes_per_sequence == 0
    with pytest.raises(KvplanError, match="keeps no per-sequence cache"):
        capacity(spec, Workload(ctx=4096), engine_name="transformers", kv_budget=BUDGET)


def test_xlnet_base_parameters_by_hand():
    # embeddings 32000 x 768 and a mask embedding of 768; per layer q, k, v, o, r of 768 x 768, three per-head
    # biases and a segment embedding (5 x 768), two LayerNorms (4 x 768), an MLP 768 -> 3072 -> 768 with biases;
    # the output projection tied, with a bias of 32000
    per_layer = 5 * 768 * 768 + 5 * 768 + 4 * 768 + 2 * 768 * 3072 + 3072 + 768
    assert read(XLNET_BASE).params.total == 32000 * 768 + 768 + 12 * per_layer + 32000 == 116_750_336


def test_reformer_hidden_states_and_hash_buckets_past_the_chunk():
    # every layer: hidden_size 256 values a token; the 3 LSH layers also 2 heads x 1 hash round of int64 buckets,
    # once the prompt is longer than lsh_attn_chunk_length (64) and so was hashed
    spec = read(REFORMER)
    states = 6 * 256 * BF16
    assert per_token(REFORMER) == states + 3 * 2 * 1 * 8 == 3_120
    assert estimate(spec, ctx=64, kv_dtype_name="bf16").kv_bytes_per_sequence == 64 * states
    assert estimate(spec, ctx=65, kv_dtype_name="bf16").kv_bytes_per_sequence == 65 * (states + 3 * 2 * 8)
    assert estimate(read({**REFORMER, "num_hashes": 4}), ctx=100).kv_bytes_per_sequence == \
        100 * (6 * 256 * 4 + 3 * 2 * 4 * 8)


def test_reformer_prompt_padded_past_the_lsh_chunk_is_hashed():
    # local chunks of 48 do not divide the LSH chunk of 64: a prompt of 49 or more is padded to a multiple of
    # lcm(64, 48) = 192 and LSH layers hash it, though it is not longer than 64
    spec = read({**REFORMER, "local_attn_chunk_length": 48})
    buckets = [c for c in spec.caches if c.holds == "hash buckets"]
    assert {c.after for c in buckets} == {48}
    assert buckets[0].tokens_held(48) == 0 and buckets[0].tokens_held(49) == 49
    # a local chunk that divides the LSH chunk pads no prompt of 64 or fewer past it
    assert {c.after for c in read({**REFORMER, "local_attn_chunk_length": 32}).caches if c.after} == {64}


def test_masked_lm_reformer_caches_nothing():
    spec = read({**REFORMER, "is_decoder": False})
    assert {c.kind for c in spec.caches} == {"none"}


def test_reformer_parameters_by_hand():
    # word embeddings 320 x 256 and axial position tables 512 x 64 + 1024 x 192; per layer a LayerNorm (512), the
    # attention (LSH: query_key and value, local: query, key and value; 256 x 128 each, and an output 128 x 256),
    # a LayerNorm and an MLP 256 -> 512 -> 256 with biases; a LayerNorm over both streams (2 x 512) and the output
    # projection from them (320 x 512 and a bias)
    width = 2 * 64
    layer = 2 * 256 + width * 256 + 2 * 256 + 256 * 512 + 512 + 512 * 256 + 256
    lsh, local = layer + 2 * 256 * width, layer + 3 * 256 * width
    total = 320 * 256 + 512 * 64 + 1024 * 192 + 3 * (lsh + local) + 2 * 512 + 320 * 512 + 320
    assert read(REFORMER).params.total == total == 2_748_224


def test_cpm_ant_caches_its_prompt_tokens_before_every_sequence():
    # 48 layers of 32 heads x 128, K and V: 786,432 B a token in fp16, for ctx + 32 prompt tokens
    spec = read({**CPM_ANT_10B, "torch_dtype": "float16"})
    per_layer = 2 * 32 * 128 * 2
    assert estimate(spec, ctx=1).kv_bytes_per_token == 48 * per_layer == 786_432
    assert estimate(spec, ctx=2048).kv_bytes_per_sequence == (2048 + 32) * 786_432
    # transformers (a prompt of up to ctx - 1 tokens, its prompt tokens ahead) and ideal, split over 2 GPUs
    fp16 = {**CPM_ANT_10B, "torch_dtype": "float16"}
    assert engine_per_sequence(fp16, 2048, "transformers") == (2048 + 32) * 786_432
    assert engine_per_sequence(fp16, 2048, "ideal", parallel=Parallelism(gpus=2, tp=2)) == (2048 + 32) * 786_432 // 2
    # no prompt tokens: plain full attention
    assert {c.kind for c in read({**CPM_ANT_10B, "prompt_length": 0}).caches} == {"full"}


def test_cpm_ant_10b_parameters_by_hand():
    # input embeddings of 30720 tokens and 32 x 32 prompt tokens, 32 segment embeddings; per layer two
    # weight-only norms, q, k, v, o of 4096 x 4096 and a gated MLP of 3 x 4096 x 10240; a final norm; relative
    # position biases (32^2 segment pairs + 512 buckets) x 32 heads; an untied output projection 30720 x 4096
    h = 4096
    per_layer = 2 * h + 4 * h * h + 3 * h * 10240
    total = (30720 + 32 * 32 + 32) * h + 48 * per_layer + h + (32 * 32 + 512) * 32 + 30720 * h
    assert read(CPM_ANT_10B).params.total == total == 9_517_453_312
    assert total == pytest.approx(10e9, rel=0.05)  # "cpm-ant-10b"


def test_show_prints_what_they_keep(monkeypatch, capsys, write_json):
    from conftest import run_main

    monkeypatch.setenv("COLUMNS", "160")
    for config, shown in (({**XLNET_BASE, "mem_len": 512}, ["hidden states, last 512 tokens", "768 values, not K,V"]),
                          (REFORMER, ["hash buckets, beyond 64 tokens", "2 values x 8 B, not K,V"]),
                          (CPM_ANT_10B, ["full attention + 32 prompt tokens", "K,V: 32 heads x 128"])):
        code, out, err = run_main(monkeypatch, capsys, "show", "--model", str(write_json(config)))
        assert code == 0, err
        for text in shown:
            assert text in " ".join(out.split()), out


# -------------------------------------------------------------------- real caches, past mem_len and chunk lengths


def profiled(tmp_path, data: dict, ctx: int, decode_steps: int):
    """kvplan profile on the CPU in fp32, batch 2, every layer: the prediction and the cache transformers holds."""
    import json

    from kvplan.profiler.run import run_profile

    path = tmp_path / "config.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return run_profile(str(path), ctx, 2, device="cpu", dtype="fp32", decode_steps=decode_steps)


@pytest.mark.torch
@pytest.mark.parametrize("mem_len, held", [(16, 17), (None, 40)])
def test_xlnet_memories_in_a_real_decode(tmp_path, mem_len, held):
    # ctx 40, 38 prefilled and 2 decoded, 4 layers x batch 2 x d_model 1024 x 4 B: mem_len 16 shows 16 rows, views
    # of the whole 38-row prompt after prefill and of the 17 rows the last step concatenated after decode; mem_len
    # null keeps all
    archkit = pytest.importorskip("archkit")
    result = archkit.check(tmp_path, "xlnet", archkit.shrunk("xlnet", mem_len=mem_len))
    assert result.exact, result
    assert result.measured_kv_after_prefill == 4 * 2 * 38 * 1024 * 4
    assert result.measured_kv == 4 * 2 * held * 1024 * 4


@pytest.mark.torch
def test_reformer_buckets_in_a_real_decode(tmp_path):
    # chunks of 16: the 38-token prompt is padded to 48 and hashed; 2 local and 2 LSH layers of hidden 256 and 12
    # heads, batch 2
    archkit = pytest.importorskip("archkit")
    data = archkit.shrunk("reformer", is_decoder=True, lsh_attn_chunk_length=16, local_attn_chunk_length=16)
    result = archkit.check(tmp_path, "reformer", data)
    assert result.exact, result
    assert result.measured_kv_after_prefill == 4 * 2 * 48 * 256 * 4 + 2 * 2 * 48 * 12 * 8
    assert result.measured_kv == 4 * 2 * 40 * 256 * 4 + 2 * 2 * 40 * 12 * 8


@pytest.mark.torch
def test_reformer_short_prompt_padded_into_lsh_attention(tmp_path):
    # LSH chunk 16, local chunk 12: a 14-token prompt is padded to lcm 48 and hashed; right after prefill the 48
    # padded rows are held (the cut to 14 is a view), after decode the 16 of the sequence; batch 2, 12 heads
    archkit = pytest.importorskip("archkit")
    data = archkit.shrunk("reformer", is_decoder=True, lsh_attn_chunk_length=16, local_attn_chunk_length=12,
                          num_hidden_layers=2, attn_layers=["local", "lsh"])
    result = profiled(tmp_path, data, ctx=16, decode_steps=2)
    assert result.kv_exact, result.verdict
    assert result.measured_kv_after_prefill_bytes == 2 * 2 * 48 * 256 * 4 + 2 * 48 * 12 * 8
    assert result.measured_kv_bytes == 2 * 2 * 16 * 256 * 4 + 2 * 16 * 12 * 8


@pytest.mark.torch
def test_reformer_prompt_hashed_only_while_decoding_keeps_float32_buckets(tmp_path):
    # A 12-token prompt is not hashed (chunks of 16); decoding reaches 16 tokens and hashes all of them, appending
    # to transformers' empty float placeholder, so its 20 buckets are float32: 4 bytes each, not the 8 kvplan sizes
    archkit = pytest.importorskip("archkit")
    data = archkit.shrunk("reformer", is_decoder=True, lsh_attn_chunk_length=16, local_attn_chunk_length=16,
                          num_hidden_layers=2, attn_layers=["local", "lsh"], num_buckets=4)
    result = profiled(tmp_path, data, ctx=20, decode_steps=8)
    assert result.measured_kv_after_prefill_bytes == result.predicted_kv_after_prefill_bytes == 2 * 2 * 12 * 256 * 4
    assert result.predicted_kv_bytes - result.measured_kv_bytes == 2 * 20 * 12 * (8 - 4)


@pytest.mark.torch
def test_cpm_ant_prompt_tokens_in_a_real_decode(tmp_path):
    # decoded on the whole sequence each step, as generate() feeds it; 4 layers x batch 2 x (40 + 32) tokens x
    # 32 heads x 128 x K and V x 4 B
    archkit = pytest.importorskip("archkit")
    result = archkit.check(tmp_path, "cpmant", archkit.shrunk("cpmant", dim_ff=64))
    assert result.exact, result
    assert result.measured_kv == 4 * 2 * (40 + 32) * 32 * 128 * 2 * 4
