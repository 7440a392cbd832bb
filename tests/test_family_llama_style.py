"""Families read through the Llama-style rules with blocks of their own (plain MLPs, LayerNorms, biases switched by
config flags, q/k norms, post-norms, attention sinks and gates, MoE field dialects, towers built by the causal-LM
class). tests/test_every_architecture.py checks each against transformers' own default config; here the config
switches those defaults leave off, the fields real config.json files omit, hand arithmetic from vLLM's allocation
rules and published parameter counts. Expected numbers come from transformers (meta-device builds and config classes),
hand arithmetic written out below, or model cards; never from kvplan.
"""

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import archkit  # noqa: E402
from test_every_architecture import EDITS  # noqa: E402

from kvplan.capacity import Workload, capacity  # noqa: E402
from kvplan.errors import KvplanError  # noqa: E402
from kvplan.model import FullAttention, NoCache, SlidingWindow  # noqa: E402
from kvplan.profiler import config as profile_config  # noqa: E402
from kvplan.sources.hf_config import model_from_config  # noqa: E402

GiB = 2**30
UNKNOWN_NOTE = "is not one kvplan knows: read as a Llama-style decoder"

# The sweep's model types of this group, by the model_type the reader sees (a multimodal config's text_config).
LLAMA_STYLE = ["afmoe", "apertus", "arcee", "aria_text", "bitnet", "cohere2_moe", "cohere_compass_text", "diffllama",
               "doge", "emu3", "ernie4_5_moe", "exaone4", "exaone_moe", "flex_olmo", "flint", "fuyu", "git", "glm",
               "glm4", "granite_swa", "granitemoe_swa", "hunyuan_v1_dense", "hyperclovax", "jais2", "jetmoe",
               "kolibri1", "laguna", "mellum", "ministral", "mllama", "moshi", "nanochat", "nemotron", "olmo", "olmo3",
               "olmoe", "persimmon", "phi4_multimodal", "phimoe", "seed_oss", "stablelm", "starcoder2"]


def llama_like(model_type: str, **fields) -> dict:
    """A small decoder config: 4 layers, hidden 256, 4 heads of 64, 2 KV heads, bf16."""
    config = {"model_type": model_type, "num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 4,
              "num_key_value_heads": 2, "intermediate_size": 512, "vocab_size": 1000, "torch_dtype": "bfloat16",
              "tie_word_embeddings": False}
    config.update(fields)
    return config


# ------------------------------------------------------------------------------------------- known and unknown types


def test_an_unknown_model_type_is_read_llama_style_with_a_note():
    spec = model_from_config(llama_like("brand_new_decoder"), "x", "test")
    assert any(UNKNOWN_NOTE in note for note in spec.notes)
    # and its count is the Llama one: per layer 4 x 256^2 (q, k, v, o at 4 heads and 2 KV heads of 64: q and o
    # 256 x 256, k and v 256 x 128) = 2 x 65,536 + 2 x 32,768 = 196,608; MLP 3 x 256 x 512 = 393,216; two norms 512;
    # 4 layers 2,361,344; embedding and lm_head 2 x 256,000; final norm 256
    assert spec.params.total == 4 * (196_608 + 393_216 + 512) + 2 * 256_000 + 256 == 2_873_600


@pytest.mark.parametrize("model_type", LLAMA_STYLE)
def test_this_groups_families_are_known(model_type):
    spec = model_from_config(archkit.shrunk(model_type), model_type, "test")
    assert not any(UNKNOWN_NOTE in note for note in spec.notes)


# --------------------------------------------------------------- against transformers: switches and omitted fields

LAYERS = 8


def first_layers(data: dict, layers: int = LAYERS) -> dict:
    """The decoder cut to its first `layers` layers: per-layer lists cut, layer indices past the cut dropped."""
    decoder = archkit.decoder_of(data)
    total = decoder["num_hidden_layers"]
    if total > layers:
        decoder["num_hidden_layers"] = layers
        for field, value in decoder.items():
            if isinstance(value, list) and len(value) == total:
                decoder[field] = value[:layers]
        if isinstance(decoder.get("cross_attention_layers"), list):
            decoder["cross_attention_layers"] = [i for i in decoder["cross_attention_layers"] if i < layers]
    return data


def kvplan_and_transformers(data: dict):
    """(kvplan's spec as the causal-LM class builds it, transformers' config, its meta-device parameter count)."""
    spec = model_from_config(data, "test", "test")
    model_type, fields, _ = profile_config.transformers_fields(data)
    config = transformers.CONFIG_MAPPING[model_type](**fields)
    return profile_config.as_built(spec, data), config, archkit.meta_parameters(model_type, fields)


# Config switches the default configs leave at one setting: each counted as transformers builds it.
SWITCHES = [
    ("apertus", {"attention_bias": True}),
    ("arcee", {"mlp_bias": True}),
    ("afmoe", {"num_dense_layers": 2, "num_shared_experts": 0}),
    ("cohere2_moe", {"num_shared_experts": 1, "prefix_dense_intermediate_size": 96,
                     "mlp_layer_types": ["dense", "dense"] + ["sparse"] * 38}),
    ("doge", {"is_moe": True, "num_experts": 64, "num_experts_per_tok": 4}),
    ("ernie4_5_moe", {"use_bias": True, "tie_word_embeddings": False, "moe_layer_start_index": 2,
                      "moe_layer_interval": 2}),
    ("git", {"num_image_with_embedding": 2}),
    ("granitemoe_swa", {"shared_intermediate_size": 48}),
    ("hyperclovax", {"use_post_norm": False}),
    ("jetmoe", {"tie_word_embeddings": False}),
    ("laguna", {"gating": False}),
    ("persimmon", {"qk_layernorm": False}),
    ("phimoe", {"attention_bias": True, "lm_head_bias": True}),
    ("seed_oss", {"attention_out_bias": True}),
    ("stablelm", {"use_parallel_residual": True, "qk_layernorm": True, "use_qkv_bias": True}),
    ("starcoder2", {"use_bias": False}),
]


@pytest.mark.parametrize(("model_type", "switch"), SWITCHES, ids=[m for m, _ in SWITCHES])
def test_config_switches_count_as_transformers_builds_them(model_type, switch):
    data = first_layers(archkit.shrunk(model_type, **switch))
    spec, _, measured = kvplan_and_transformers(data)
    assert spec.params.total == measured


# Fields a config.json may leave out, which the config classes fill in: per-layer types, MoE layer kinds, biases,
# norms and tied embeddings.
OMITTABLE = ("layer_types", "mlp_layer_types", "mlp_only_layers", "num_attention_heads_per_layer",
             "tie_word_embeddings", "attention_bias", "mlp_bias", "use_bias", "use_qkv_bias", "attention_out_bias",
             "qk_layernorm", "use_post_norm", "use_parallel_residual", "lm_head_bias", "gating", "is_moe")


@pytest.mark.parametrize("model_type", LLAMA_STYLE)
def test_omitted_fields_read_as_the_config_class_fills_them(model_type):
    fields, _ = EDITS.get(model_type, ({}, ""))
    data = first_layers(archkit.shrunk(model_type, **fields))
    decoder = archkit.decoder_of(data)
    for field in OMITTABLE:
        decoder.pop(field, None)
        if decoder is not data:
            data.pop(field, None)
    spec, config, measured = kvplan_and_transformers(data)
    if getattr(config, "layer_types", None) is not None:
        read = ["sliding_attention" if isinstance(c, SlidingWindow) else "full_attention" for c in spec.caches]
        assert read == list(config.layer_types)
    assert spec.params.total == measured


def test_a_string_sliding_window_pattern_without_layer_types_is_refused():
    # EXAONE 4's docstring allows "LLLG", but its config class computes (i + 1) % pattern: it cannot lay it out
    config = llama_like("exaone4", sliding_window=4096, sliding_window_pattern="LLLG")
    with pytest.raises(KvplanError, match="sliding_window_pattern"):
        model_from_config(config, "x", "test")


def test_per_layer_query_heads_of_the_wrong_length_are_refused():
    config = llama_like("laguna", num_attention_heads_per_layer=[4, 4, 4])
    with pytest.raises(KvplanError, match="num_attention_heads_per_layer"):
        model_from_config(config, "x", "test")


def test_mllama_cross_attention_layers_cache_nothing_for_text():
    config = llama_like("mllama_text_model", cross_attention_layers=[1, 3])
    spec = model_from_config(config, "x", "test")
    assert [type(c) for c in spec.caches] == [FullAttention, NoCache, FullAttention, NoCache]
    assert any("layers 1, 3 cross-attend to the image" in note for note in spec.notes)
    with pytest.raises(KvplanError, match="cross_attention_layers"):
        model_from_config(llama_like("mllama_text_model", cross_attention_layers=[4]), "x", "test")


# --------------------------------------------------------------------------------------- published parameter counts


def test_olmoe_1b_7b_total_and_active_parameters():
    # allenai/OLMoE-1B-7B-0924: 16 layers, hidden 2048, 16 heads (MHA), 64 experts of 1024, top 8, vocab 50,304,
    # untied, q/k norms over all heads. The paper (Muennighoff et al. 2024, table 1) gives 6.9B total, 1.3B active.
    config = {"model_type": "olmoe", "num_hidden_layers": 16, "hidden_size": 2048, "num_attention_heads": 16,
              "num_key_value_heads": 16, "intermediate_size": 1024, "num_experts": 64, "num_experts_per_tok": 8,
              "vocab_size": 50304, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
    spec = model_from_config(config, "olmoe", "test")
    # per layer: attention 4 x 2048^2 = 16,777,216; q/k norms 2 x 2048; two norms 2 x 2048; router 64 x 2048 =
    # 131,072; experts 64 x 3 x 2048 x 1024 = 402,653,184 -> 419,569,664; x 16 = 6,713,114,624;
    # embedding and lm_head 2 x 50,304 x 2048 = 206,045,184; final norm 2,048
    assert spec.params.total == 6_713_114_624 + 206_045_184 + 2048 == 6_919_161_856
    # active: 8 of 64 experts, 8 x 3 x 2048 x 1024 = 50,331,648 a layer instead of 402,653,184
    assert spec.params.active == 6_919_161_856 - 16 * (402_653_184 - 50_331_648) == 1_282_017_280
    assert round(spec.params.total / 1e9, 1) == 6.9 and round(spec.params.active / 1e9, 1) == 1.3


def test_jetmoe_8b_attention_and_mlp_experts():
    # jetmoe/jetmoe-8b: 24 layers, hidden 2048, 8 experts of each kind, top 2, 16 KV heads of kv_channels 128
    # (attention experts 2048 wide), MLP experts of 5632, vocab 32,000, tied.
    config = {"model_type": "jetmoe", "num_hidden_layers": 24, "hidden_size": 2048, "num_attention_heads": 32,
              "num_key_value_heads": 16, "kv_channels": 128, "intermediate_size": 5632, "num_local_experts": 8,
              "num_experts_per_tok": 2, "vocab_size": 32000, "tie_word_embeddings": True, "torch_dtype": "bfloat16"}
    spec = model_from_config(config, "jetmoe", "test")
    # per layer: attention expert 2 x 2048 x 2048 = 8,388,608 and MLP expert 3 x 2048 x 5632 = 34,603,008, 8 of each:
    # 343,932,928; kv_proj 2048 x 4096 = 8,388,608; two routers 2 x 8 x 2048, two output biases and two norms
    # 4 x 2048: 40,960 -> 352,362,496; x 24 = 8,456,699,904; embedding 65,536,000; final norm 2,048
    assert spec.params.total == 8_456_699_904 + 65_536_000 + 2048 == 8_522_237_952
    # active: 2 of each kind of expert, 2 x 42,991,616 = 85,983,232 a layer instead of 343,932,928
    assert spec.params.active == 8_522_237_952 - 24 * (343_932_928 - 85_983_232) == 2_331_445_248
    assert spec.caches[0].head_dim == 128 and spec.caches[0].kv_heads == 16


# ------------------------------------------------------------------------------------------------ vLLM allocation


def test_vllm_exaone4_sliding_groups_from_the_pattern():
    # EXAONE 4 (transformers' Exaone4Config shapes): 32 layers, 32 KV heads of 128, window 4096, and no layer_types:
    # sliding_window_pattern 4 makes every 4th layer global, 24 sliding + 8 full.
    config = llama_like("exaone4", num_hidden_layers=32, hidden_size=4096, num_attention_heads=32,
                        num_key_value_heads=32, head_dim=128, intermediate_size=16384, vocab_size=102400,
                        sliding_window=4096, sliding_window_pattern=4)
    spec = model_from_config(config, "exaone4", "test")
    assert [isinstance(c, SlidingWindow) for c in spec.caches] == [(i + 1) % 4 != 0 for i in range(32)]
    cap = capacity(spec, Workload(ctx=32_768), kv_budget=60 * GiB)
    # vLLM (v1/kv_cache_interface.py, _get_kv_cache_groups_uniform_page_size): page = 16 tokens x 32 heads x
    # (128 + 128) x 2 B = 262,144 B; buckets of 24 sliding and 8 full layers, group size 8 (24 >= 1.5 x 8), so
    # 3 sliding groups and 1 full; a block is 8 x 262,144 = 2,097,152 B.
    assert cap.vllm_block_bytes == 2_097_152
    # per request at L = 32,768 with I = 2 x 8,192 tokens in flight: full cdiv(32,768, 16) = 2,048 blocks; each sliding
    # group cdiv(min(4,095 + 16,384, 32,768), 16) + 1 = 1,281 -> 2,048 + 3 x 1,281 = 5,891 blocks
    assert cap.vllm_blocks_per_sequence == 2048 + 3 * 1281 == 5891
    assert cap.engine_kv_bytes_per_sequence == 5891 * 2_097_152


def test_vllm_cohere2_moe_sliding_window_is_one_token_wider():
    # Cohere2-MoE, 8 layers of 8 KV heads of 128, window 4096, sliding_window_pattern 4: layers 3 and 7 global.
    # vLLM's models/cohere2_moe.py gives its sliding layers sliding_window + 1 = 4097 (the window and the current
    # token), which sets the reservation and the eviction.
    config = llama_like("cohere2_moe", num_hidden_layers=8, hidden_size=1024, num_attention_heads=8,
                        num_key_value_heads=8, head_dim=128, sliding_window=4096, num_experts=8,
                        num_experts_per_tok=2)
    cap = capacity(model_from_config(config, "cohere2_moe", "test"), Workload(ctx=32_768), kv_budget=60 * GiB)
    # page = 16 x 8 x (128 + 128) x 2 B = 65,536 B; 6 sliding and 2 full layers: group size 2, 3 sliding groups and
    # 1 full, a block 2 x 65,536 = 131,072 B
    assert cap.vllm_block_bytes == 131_072
    # reserved at L = 32,768, I = 16,384: full 2,048 blocks; sliding cdiv(min(4,097 - 1 + 16,384, 32,768), 16) + 1
    # = 1,281 per group
    assert cap.vllm_blocks_per_sequence == 2048 + 3 * 1281
    # steady decode: a sliding group keeps cdiv(4,097, 16) + 1 = 258 blocks (257 with a window of 4,096)
    assert cap.vllm_kv_bytes_per_sequence_decode == (2048 + 3 * 258) * 131_072
