"""Every causal-LM model type of the installed transformers, each built from its own config class (their defaults
are the published checkpoints' shapes): kvplan's prediction must equal the cache transformers really builds, after
prefill and after decode, and its parameter count the meta-device build's (less the rows transformers allocates
that no checkpoint holds: archkit.phantom_parameters), or the type must be listed below with the reason it is not
checked. See tests/archkit.py for how each model is shrunk and cut.
"""

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import archkit  # noqa: E402
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES  # noqa: E402

from kvplan.errors import KvplanError  # noqa: E402

QWEN4_EXP_QSA = {"indexer_n_heads": 4, "indexer_kv_heads": 1, "indexer_head_dim": 128, "indexer_budget": 2048,
                 "indexer_compress_ratio": 4,
                 "rope_parameters": {"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25,
                                     "mrope_section": [11, 11, 10]}}
# Decoder fields set before building, where transformers' default config cannot be built or run as it stands but
# every published checkpoint sets the field: model_type -> (fields, why).
EDITS: dict[str, tuple[dict, str]] = {
    "bamba": ({"attn_layer_indices": [3]},
              "transformers cannot run a Bamba without attention layers (get_seq_length needs one), its default; "
              "published checkpoints have them (Bamba-9B: layers 9, 18, 27)"),
    "granitemoehybrid": ({"layer_types": ["mamba"] * 3 + ["attention"] + ["mamba"] * 28},
                         "transformers cannot run it without attention layers (get_seq_length needs one), its "
                         "default; every Granite 4.0-H checkpoint has them"),
    "zamba": ({"layers_block_type": ["mamba", "mamba", "hybrid", "hybrid"] + ["mamba"] * 72},
              "transformers cannot build a Zamba whose shared block is applied once (tying it across hybrid layers "
              "finds nothing to tie), as the 4-layer cut of the default would be; Zamba-7B applies it 13 times"),
    # llama-style: the config classes leave these None, which their modeling files cannot build from
    "cohere_compass_text": ({"rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 50000.0},
                                                 "full_attention": None},
                             "layer_types": ["sliding_attention" if (i + 1) % 4 else "full_attention"
                                             for i in range(40)]},
                            "rope_parameters by layer type, as North-Micro-Vision sets them (its full-attention "
                            "layers have no rotary embedding); its layer_types, three sliding layers to a global one"),
    "hunyuan_v1_dense": ({"head_dim": 128}, "Hunyuan-7B and Hy-MT set head_dim"),
    "ministral": ({"head_dim": 128}, "Ministral-8B sets head_dim"),
    "nemotron": ({"num_key_value_heads": 8}, "Nemotron-4 and Minitron checkpoints set num_key_value_heads (8)"),
    "gemma4_assistant": ({"hidden_size_per_layer_input": 0, "vocab_size_per_layer_input": 0},
                         "Gemma4AssistantConfig() fails its own validation (an assistant has no per-layer "
                         "embeddings); the published assistants set both to 0"),
    "lfm2_moe": ({"layer_types": ["conv", "conv", "full_attention", "conv"] * 8},
                 "Lfm2MoeConfig has no default layout (layer_types None, which its model indexes); LFM2-8B-A1B "
                 "lists its layer_types"),
    # The BERT family runs as a causal LM only as a decoder: transformers' *ForCausalLM classes ask for is_decoder
    # (without it they attend bidirectionally, so a cached decode computes something else); XMOD also needs the
    # language whose adapters it runs.
    **{model_type: ({"is_decoder": True}, "transformers runs a BERT-family causal LM only with is_decoder")
       for model_type in ("bert", "bert-generation", "big_bird", "camembert", "data2vec-text", "electra", "ernie",
                          "megatron-bert", "rembert", "roberta", "roberta-prelayernorm", "roc_bert", "roformer",
                          "xlm-roberta", "xlm-roberta-xl")},
    "xmod": ({"is_decoder": True, "default_language": "en_XX"},
             "a decoder, and the language adapter to run (set_default_language writes default_language)"),
    # An encoder-decoder's causal-LM class is its decoder alone: the class itself sets these two on its config.
    **{model_type: ({"is_decoder": True, "is_encoder_decoder": False},
                    "the causal-LM class is the decoder alone, as it sets on its own config")
       for model_type in ("bart", "bigbird_pegasus", "blenderbot", "blenderbot-small", "marian", "mbart", "mvp",
                          "pegasus", "plbart", "prophetnet", "whisper")},
    # Qwen4ExpTextConfig leaves the QSA indexer's fields None, which its attention layers cannot be built from; and
    # its default RoPE (every head_dim channel) does not fit that indexer's head. The released checkpoint (its
    # config.json, as vLLM's and other ports' tests quote it): 4 indexer heads of 128, one key head, a budget of
    # 2,048 tokens in blocks of 4; RoPE on 64 of the 256 channels, mrope_section [11, 11, 10].
    **{model_type: (QWEN4_EXP_QSA, "every Qwen4-Exp checkpoint sets its QSA indexer and partial RoPE")
       for model_type in ("qwen4_exp", "qwen4_exp_text")},
    "dbrx": ({"attn_config": {"kv_n_heads": 1, "clip_qkv": 8, "rope_theta": 500_000}},
             "DbrxAttention reads attn_config.rope_theta, which DbrxAttentionConfig does not define, and clamps "
             "q, k, v to clip_qkv even when it is None (the default), which torch refuses; DBRX's published "
             "configs set both (rope_theta 500000, clip_qkv 8)"),
    # The shrink cuts experts to 4 before these edits, so expert counts and top-k here are shrunk values.
    "deepseek_v2": ({"num_experts_per_tok": 2}, "the router's top-k defaults to None; DeepSeek-V2 and V2-Lite set 6"),
    "dots1": ({"n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 2, "first_k_dense_replace": 1},
              "experts, top-k and shared experts default to None; dots.llm1 sets 128, 6, 2 and one dense layer"),
    "hunyuan_v1_moe": ({"head_dim": 128}, "the attention reads head_dim, None by default; Hunyuan-A13B sets 128"),
    "reformer": ({"is_decoder": True}, "ReformerModelWithLMHead, its causal-LM class, asserts is_decoder; "
                 "ReformerConfig's default is false (a masked LM)"),
    "cpmant": ({"dim_ff": 64}, "its MLP width has a name the shrink does not know (CPM-Ant 10B: dim_ff 10240); at "
               "full width the cut model alone takes 3 GB"),
    "longcat_flash": ({"zero_expert_num": 2, "expert_ffn_hidden_size": 32, "ffn_hidden_size": 64, "moe_topk": 2},
                      "its widths and top-k have names the shrink does not know (LongCat-Flash: 256 zero experts, "
                      "top-12); at full width the model does not fit in memory"),
}
# transformers itself cannot build or run these on the CPU from its own config class (docs/formulas.md lists them):
# model_type -> a fragment of the one-line error kvplan gives; the test fails once transformers can.
TRANSFORMERS_CANNOT: dict[str, str] = {
    # A Gemma 4 assistant's every layer reads its target model's KV: transformers 5.23 cannot build it (its text
    # config's kv_sharing_modes refuses a decoder with no layer producing a cache), and its forward needs the
    # target's shared_kv_states. kvplan reads it: no cache of its own, its parameters by the modeling file.
    "gemma4_assistant": "layer types producing a cache is different",
    "gemma4_unified_assistant": "layer types producing a cache is different",
    # BltConfig has no num_hidden_layers, so the cache generate() and BltModel make, DynamicCache(config=...), raises
    # AttributeError in transformers 5.23; kvplan refuses BLT anyway: its patch count depends on the text.
    "blt": "is not one decoder stack",
    # BlenderbotConfig maps num_hidden_layers to encoder_layers, so the DynamicCache generate() builds from it has
    # encoder_layers (2) layers while the decoder has more (24; every published Blenderbot has 2 encoder layers and
    # 12 or 24 decoder layers): the cached decode indexes past them.
    "blenderbot": "IndexError: list index out of range",
    # AutoModelForCausalLM maps these types to MusicgenForCausalLM / MusicgenMelodyForCausalLM, which take the
    # nested decoder config (musicgen_decoder), not the type's own composite config (text encoder, audio codec,
    # decoder): building from it fails on the first decoder field.
    "musicgen": "'MusicgenConfig' object has no attribute 'dropout'",
    "musicgen_melody": "'MusicgenMelodyConfig' object has no attribute 'dropout'",
}
@pytest.mark.parametrize("model_type", sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES))
def test_cache_and_parameters_equal_transformers(tmp_path, model_type):
    fields, _ = EDITS.get(model_type, ({}, ""))
    data = archkit.shrunk(model_type, **fields)
    if model_type in TRANSFORMERS_CANNOT:
        with pytest.raises(KvplanError, match=TRANSFORMERS_CANNOT[model_type]):
            archkit.check(tmp_path, model_type, data)
        return
    result = archkit.check(tmp_path, model_type, data)
    assert result.exact, result
