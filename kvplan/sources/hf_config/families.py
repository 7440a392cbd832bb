"""What kvplan knows of each family by name: transformers' defaults for fields configs omit, old names of model
types, how a family builds its blocks (for parameter counts), and the fields that say a layer keeps a cache of a
kind the reader has no rule for."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Field defaults of transformers' config classes for fields that real config.json files often omit.
MODEL_TYPE_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {"tie_word_embeddings": False, "vocab_size": 32000},
    "mistral": {"tie_word_embeddings": False, "sliding_window": 4096},
    "mixtral": {"tie_word_embeddings": False, "sliding_window": None},
    "qwen2": {"tie_word_embeddings": False, "use_sliding_window": False},
    "qwen2_moe": {"tie_word_embeddings": False, "use_sliding_window": False},
    "qwen3": {"tie_word_embeddings": False, "use_sliding_window": False},
    "qwen3_moe": {"tie_word_embeddings": False, "use_sliding_window": False},
    "qwen3_next": {"tie_word_embeddings": False, "full_attention_interval": 4},
    "gemma": {"tie_word_embeddings": True},
    "gemma2": {"tie_word_embeddings": True, "sliding_window": 4096, "hidden_activation": "gelu_pytorch_tanh"},
    "gemma3_text": {
        "tie_word_embeddings": True, "vocab_size": 262_208, "sliding_window": 4096, "sliding_window_pattern": 6,
        "head_dim": 256, "max_position_embeddings": 131_072, "num_attention_heads": 8, "num_key_value_heads": 4,
        "hidden_activation": "gelu_pytorch_tanh",
    },
    "llama4_text": {"tie_word_embeddings": False, "no_rope_layer_interval": 4, "interleave_moe_layer_step": 1},
    "phi3": {"tie_word_embeddings": False},
    "phi": {"tie_word_embeddings": False},
    "gpt2": {"tie_word_embeddings": True, "n_inner": None},
    "falcon": {"tie_word_embeddings": True, "multi_query": True},
    "gpt_neox": {"tie_word_embeddings": False},
    "cohere": {"tie_word_embeddings": True},
    "cohere2": {"tie_word_embeddings": True, "sliding_window_pattern": 4},
    "olmo2": {"tie_word_embeddings": False},
    "granite": {"tie_word_embeddings": True},
    "deepseek_v2": {"tie_word_embeddings": False},
    "deepseek_v3": {"tie_word_embeddings": False},
    "gpt_oss": {"tie_word_embeddings": False},
    "jamba": {"tie_word_embeddings": False, "attn_layer_period": 8, "attn_layer_offset": 4},
    "nemotron_h": {"tie_word_embeddings": False},
    "nemotron-nas": {"tie_word_embeddings": False},
    "t5": {"tie_word_embeddings": True},
    # GPT-2-era decoders (transformers' config classes)
    "biogpt": {"tie_word_embeddings": True, "max_position_embeddings": 1024},
    "bloom": {"tie_word_embeddings": True},
    "codegen": {"tie_word_embeddings": False},
    "ctrl": {"tie_word_embeddings": True},
    "dbrx": {"tie_word_embeddings": False},
    "gpt_neo": {"tie_word_embeddings": True, "attention_types": [[["global", "local"], 12]], "window_size": 256,
                "max_position_embeddings": 2048},
    "gpt_neox_japanese": {"tie_word_embeddings": True, "intermediate_multiple_size": 4},
    "gptj": {"tie_word_embeddings": False},
    "mpt": {"tie_word_embeddings": True, "expansion_ratio": 4},
    "openai-gpt": {"tie_word_embeddings": True, "n_positions": 512},
    "opt": {"tie_word_embeddings": True, "do_layer_norm_before": True, "enable_bias": True,
            "layer_norm_elementwise_affine": True, "max_position_embeddings": 2048},
    "xglm": {"tie_word_embeddings": True},
    "xlm": {"tie_word_embeddings": True, "causal": False, "n_langs": 1, "use_lang_emb": True,
            "max_position_embeddings": 512},
}


MODEL_TYPE_ALIASES = {"RefinedWebModel": "falcon", "gemma3": "gemma3_text",
                      "llama4": "llama4_text", "deci": "nemotron-nas", "mt5": "t5"}


# Families that nest fields in sub-objects: model_type -> {name the shared rules read: (object, field)}. DBRX's
# attention and MoE shapes live in attn_config and ffn_config (DbrxConfig; vLLM reads attn_config.kv_n_heads).
NESTED_FIELDS: dict[str, dict[str, tuple[str, str]]] = {
    "dbrx": {"num_key_value_heads": ("attn_config", "kv_n_heads"),
             "moe_intermediate_size": ("ffn_config", "ffn_hidden_size"),
             "num_local_experts": ("ffn_config", "moe_num_experts"),
             "num_experts_per_tok": ("ffn_config", "moe_top_k")},
}


# Config fields saying that layers keep something none of kvplan's layer kinds holds (transformers' config classes
# of DeepSeek-V3.2, GLM-5, Gemma 3n and Gemma 4, among others). Reading such a model as plain attention would give a KV
# figure that is wrong with no sign of it, so it is refused, naming the field.
UNMODELLED_CACHE_FIELDS = {
    "index_head_dim": "a sparse-attention indexer's key cache",
    "indexer_compress_ratio": "a compressed indexer cache",
    "compress_rates": "compressed attention caches",
    "num_kv_shared_layers": "layers that reuse an earlier layer's KV cache",
    "swa_num_key_value_heads": "sliding-window layers with their own KV heads",
    "swa_head_dim": "sliding-window layers with their own head size",
    "per_layer_config": "per-layer overrides of the attention shape",
    "attention_k_eq_v": "keys that double as values",
}


# Families whose generation keeps something no layer kind of kvplan holds (their modeling files in transformers):
# refused, saying what they keep.
UNMODELLED_FAMILIES = {
    "xlnet": "it keeps Transformer-XL memories (mems: each layer's input hidden states of the last mem_len "
             "tokens), not keys and values",
    "reformer": "it keeps each layer's hidden states, and on LSH layers their hash buckets (past_buckets_states), "
                "not keys and values",
    "cpmant": "it puts prompt_length prompt tokens before every sequence and caches them with it, which kvplan's "
              "layer kinds (ctx tokens) do not hold",
}


# Fields of recurrent mixers (Mamba, RG-LRU, short convolutions, linear attention): refused when the layout kvplan
# reads from the config has no recurrent layer, since that state would be missing from the figures.
RECURRENT_FIELDS = ("mamba_d_state", "mamba_n_heads", "n_mamba_heads", "state_size", "ssm_state_size", "lru_width",
                    "conv_L_cache", "short_conv_kernel_size", "number_of_conv_states", "linear_num_heads",
                    "linear_num_key_heads", "layers_block_type", "block_types")


# MoE routers that keep a load-balancing bias per routed expert (`e_score_correction_bias`, which checkpoints store
# and transformers registers as a buffer): the families whose modeling files define it, as of transformers 5.23.
CORRECTION_BIAS_ROUTERS = {"deepseek_v3", "dots1", "ernie4_5_moe", "exaone_moe", "glm4_moe", "glm4_moe_lite", "hy_v3",
                           "laguna", "longcat_flash", "mimo_v2_flash", "minimax_m2", "solar_open"}


ENCODER_ONLY = {"bert", "roberta", "xlm-roberta", "distilbert", "deberta", "deberta-v2", "electra", "albert",
                "modernbert", "camembert", "mpnet", "nomic_bert", "xlm-roberta-xl"}


@dataclass(frozen=True)
class Family:
    """How a decoder family builds its blocks, for parameter counting (from each family's modeling file)."""

    gated_mlp: bool = True          # gate/up/down (SwiGLU, GeGLU) vs up/down
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    norms_per_layer: int = 2        # hidden-sized norm vectors per layer
    layer_norm: bool = False        # LayerNorm (weight + bias) rather than RMSNorm (weight)
    qk_norm: str | None = None      # "head": one head_dim vector each for q and k; "full": over all heads
    learned_positions: bool = False  # GPT-2 style position embedding table
    position_offset: int = 0        # rows the position table keeps beyond its positions (OPT, BioGPT: 2)
    embedding_norm: bool = False    # a norm on the token embeddings (BLOOM word_embeddings_layernorm)
    final_norm: bool = True         # a norm after the last layer (GPT-1 has none)
    lm_head_bias: bool = False      # the output projection has a bias (Phi, GPT-J, CodeGen, CTRL)
    bias_flag: str | None = None    # a config flag that gives every linear a bias (Falcon `bias`)


FAMILIES: dict[str, Family] = {
    "qwen2": Family(qkv_bias=True),
    "qwen2_moe": Family(qkv_bias=True),
    "qwen3": Family(qk_norm="head"),
    "qwen3_moe": Family(qk_norm="head"),
    "qwen3_next": Family(qk_norm="head"),
    "gemma2": Family(norms_per_layer=4),
    "gemma3_text": Family(norms_per_layer=4, qk_norm="head"),
    "phi": Family(gated_mlp=False, qkv_bias=True, o_bias=True, mlp_bias=True, norms_per_layer=1, layer_norm=True,
                  lm_head_bias=True),
    "gpt2": Family(gated_mlp=False, qkv_bias=True, o_bias=True, mlp_bias=True, layer_norm=True,
                   learned_positions=True),
    "gpt_bigcode": Family(gated_mlp=False, qkv_bias=True, o_bias=True, mlp_bias=True, layer_norm=True,
                          learned_positions=True),
    "gpt_neox": Family(gated_mlp=False, qkv_bias=True, o_bias=True, mlp_bias=True, layer_norm=True),
    "falcon": Family(gated_mlp=False, layer_norm=True, bias_flag="bias"),
    "cohere": Family(norms_per_layer=1),
    "cohere2": Family(norms_per_layer=1),
    "olmo2": Family(qk_norm="full"),
    "gpt_oss": Family(qkv_bias=True, o_bias=True),
    "nemotron_h": Family(gated_mlp=False, norms_per_layer=1),
    # GPT-2-era decoders: plain GELU/ReLU MLPs and LayerNorms, each family's own biases and position tables
    "biogpt": Family(gated_mlp=False, qkv_bias=True, o_bias=True, mlp_bias=True, layer_norm=True,
                     learned_positions=True, position_offset=2),
    "bloom": Family(gated_mlp=False, qkv_bias=True, o_bias=True, mlp_bias=True, layer_norm=True, embedding_norm=True),
    "codegen": Family(gated_mlp=False, mlp_bias=True, norms_per_layer=1, layer_norm=True, lm_head_bias=True),
    "ctrl": Family(gated_mlp=False, qkv_bias=True, o_bias=True, mlp_bias=True, layer_norm=True, lm_head_bias=True),
    "gpt_neo": Family(gated_mlp=False, o_bias=True, mlp_bias=True, layer_norm=True, learned_positions=True),
    "gpt_neox_japanese": Family(gated_mlp=False, layer_norm=True),  # and the last layer's dense_bias (params.py)
    "gptj": Family(gated_mlp=False, mlp_bias=True, norms_per_layer=1, layer_norm=True, lm_head_bias=True),
    "mpt": Family(gated_mlp=False),  # LayerNorms without biases: one vector each, as RMSNorm
    "openai-gpt": Family(gated_mlp=False, qkv_bias=True, o_bias=True, mlp_bias=True, layer_norm=True,
                         learned_positions=True, final_norm=False),
    "xglm": Family(gated_mlp=False, qkv_bias=True, o_bias=True, mlp_bias=True, layer_norm=True),
    "xlm": Family(gated_mlp=False, qkv_bias=True, o_bias=True, mlp_bias=True, layer_norm=True,
                  learned_positions=True, embedding_norm=True, final_norm=False, lm_head_bias=True),
    # Checked against transformers' classes only (tests/test_transformers_params.py): no bundled model.
    "glm4_moe_lite": Family(),
    "mimo_v2_flash": Family(),
    "minicpm3": Family(),
    "minimax_m2": Family(qk_norm="full"),
    "solar_open": Family(),
}


LLAMA_LIKE = Family()


# The MLP width of families whose MLP is 4 x hidden unless a field says otherwise (None: always 4 x hidden, as
# transformers' modeling files build it).
FOUR_X_MLP_FIELD: dict[str, str | None] = {
    "gpt2": "n_inner", "gpt_bigcode": "n_inner", "codegen": "n_inner", "gptj": "n_inner",
    "gpt_neo": "intermediate_size", "falcon": "ffn_hidden_size", "bloom": None, "openai-gpt": None, "xlm": None,
}
