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
    "falcon": {"tie_word_embeddings": True},
    "gpt_neox": {"tie_word_embeddings": False},
    "cohere": {"tie_word_embeddings": True},
    "cohere2": {"tie_word_embeddings": True, "sliding_window_pattern": 4},
    "olmo2": {"tie_word_embeddings": False},
    "granite": {"tie_word_embeddings": True},
    "deepseek_v2": {"tie_word_embeddings": False},
    "deepseek_v3": {"tie_word_embeddings": False},
    "deepseek_v32": {"tie_word_embeddings": False},
    "glm_moe_dsa": {"tie_word_embeddings": False},
    "glm4_moe": {"tie_word_embeddings": False},
    "hy_v3": {"tie_word_embeddings": False, "first_k_dense_replace": 1},
    "axk1": {"tie_word_embeddings": False},
    "axk2": {"tie_word_embeddings": False, "gated_norm_rank": 16},
    "minimax_m3_vl_text": {"tie_word_embeddings": False},
    # transformers' HYV4Config (and vLLM's): one dense layer first; indexers on layer 0 and every 4th from 1
    "hy_v4": {"tie_word_embeddings": False, "first_k_dense_replace": 1, "index_topk_freq": 4, "hc_mult": 4},
    "hunyuan_v1_moe": {"tie_word_embeddings": False},
    "longcat_flash": {"tie_word_embeddings": False},
    "kimi_linear": {"tie_word_embeddings": False},
    "beam": {"tie_word_embeddings": False},
    "dots1": {"tie_word_embeddings": False},
    "gpt_oss": {"tie_word_embeddings": False},
    "jamba": {"tie_word_embeddings": False, "attn_layer_period": 8, "attn_layer_offset": 4},
    "nemotron_h": {"tie_word_embeddings": False},
    "nemotron-nas": {"tie_word_embeddings": False},
    "t5": {"tie_word_embeddings": True},
}


# Families whose modeling takes head_dim = hidden_size // num_attention_heads, rounded down, when the config gives
# none (transformers' and vLLM's glm4_moe: the GLM-4.5-Air shape, 4,096 / 96 heads, gives 42).
HEAD_DIM_ROUNDED_DOWN = {"glm4_moe"}


MODEL_TYPE_ALIASES = {"RefinedWebModel": "falcon", "gemma3": "gemma3_text",
                      "llama4": "llama4_text", "deci": "nemotron-nas", "mt5": "t5"}


# Config fields saying that layers keep something none of kvplan's layer kinds holds (transformers' config classes
# of DeepSeek-V3.2, GLM-5, Gemma 3n and Gemma 4, among others). Reading such a model as plain attention would give a KV
# figure that is wrong with no sign of it, so it is refused, naming the field.
UNMODELLED_CACHE_FIELDS = {
    "indexer_compress_ratio": "a compressed indexer cache",
    "compress_rates": "compressed attention caches",
    "num_kv_shared_layers": "layers that reuse an earlier layer's KV cache",
    "swa_num_key_value_heads": "sliding-window layers with their own KV heads",
    "swa_head_dim": "sliding-window layers with their own head size",
    "per_layer_config": "per-layer overrides of the attention shape",
    "attention_k_eq_v": "keys that double as values",
}


# DeepSeek Sparse Attention: MLA with an indexer whose keys are cached beside the latent (transformers'
# `DeepseekV32Config` and the classes derived from it). A config of these types, or one with any of these fields,
# must state the indexer's shape.
DSA_MODEL_TYPES = {"axk2", "deepseek_v32", "glm_moe_dsa", "hy_v4"}
DSA_FIELDS = ("index_head_dim", "index_n_heads", "index_topk")
# Families whose layout rule decides which layers keep indexer keys, so index fields alone are no sign of a cache
# the layout lacks (MiniMax-M3's `minimax_m3_sparse` layers; none by transformers' default).
INDEXED_MODEL_TYPES = DSA_MODEL_TYPES | {"minimax_m3_vl_text"}


# Fields of recurrent mixers (Mamba, RG-LRU, short convolutions, linear attention): refused when the layout kvplan
# reads from the config has no recurrent layer, since that state would be missing from the figures.
RECURRENT_FIELDS = ("mamba_d_state", "mamba_n_heads", "n_mamba_heads", "state_size", "ssm_state_size", "lru_width",
                    "conv_L_cache", "short_conv_kernel_size", "number_of_conv_states", "linear_num_heads",
                    "linear_num_key_heads", "layers_block_type", "block_types")


# MoE routers that keep a load-balancing bias per routed expert (`e_score_correction_bias`, which checkpoints store
# and transformers registers as a buffer): the families whose modeling files define it, as of transformers 5.23.
CORRECTION_BIAS_ROUTERS = {"axk1", "axk2", "beam", "deepseek_v3", "deepseek_v32", "dots1", "ernie4_5_moe",
                           "exaone_moe", "glm4_moe", "glm4_moe_lite", "glm_moe_dsa", "hy_v3", "hy_v4", "kimi_linear", "laguna",
                           "longcat_flash", "mimo_v2_flash", "minimax_m2", "minimax_m3_vl_text", "solar_open"}


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
    qk_norm_flag: str | None = None  # a config flag that turns the qk norm on (GLM-4.5 use_qk_norm)
    learned_positions: bool = False  # GPT-2 style position embedding table
    moe_output_norm: bool = False   # an RMSNorm on each MoE block's output (A.X-K1 post_mlp_layernorm)
    output_gate: bool = False       # a query-sized sigmoid gate on the attention output, one bias per head (Beam)
    gated_query: bool = False       # MLA query and output gate from one projection (A.X-K2 q_gate_proj)
    gated_norms: bool = False       # RMSNorms followed by a low-rank sigmoid gate (A.X-K2 AXK2GatedRMSNorm)
    hyper_connections: bool = False  # hc_mult residual streams mixed around attention and MLP (Hy V4)


FAMILIES: dict[str, Family] = {
    "qwen2": Family(qkv_bias=True),
    "qwen2_moe": Family(qkv_bias=True),
    "qwen3": Family(qk_norm="head"),
    "qwen3_moe": Family(qk_norm="head"),
    "qwen3_next": Family(qk_norm="head"),
    "gemma2": Family(norms_per_layer=4),
    "gemma3_text": Family(norms_per_layer=4, qk_norm="head"),
    "phi": Family(gated_mlp=False, qkv_bias=True, o_bias=True, mlp_bias=True, norms_per_layer=1, layer_norm=True),
    "gpt2": Family(gated_mlp=False, qkv_bias=True, o_bias=True, mlp_bias=True, layer_norm=True,
                   learned_positions=True),
    "gpt_bigcode": Family(gated_mlp=False, qkv_bias=True, o_bias=True, mlp_bias=True, layer_norm=True,
                          learned_positions=True),
    "gpt_neox": Family(gated_mlp=False, qkv_bias=True, o_bias=True, mlp_bias=True, layer_norm=True),
    "falcon": Family(gated_mlp=False, layer_norm=True),
    "cohere": Family(norms_per_layer=1),
    "cohere2": Family(norms_per_layer=1),
    "olmo2": Family(qk_norm="full"),
    "gpt_oss": Family(qkv_bias=True, o_bias=True),
    "glm4_moe": Family(qk_norm="head", qk_norm_flag="use_qk_norm"),
    "hy_v3": Family(qk_norm="head"),
    "axk1": Family(moe_output_norm=True),
    "axk2": Family(gated_query=True, gated_norms=True),
    "minimax_m3_vl_text": Family(qk_norm="head"),
    "hy_v4": Family(output_gate=True, hyper_connections=True),
    "hunyuan_v1_moe": Family(qk_norm="head"),
    "beam": Family(norms_per_layer=4, qk_norm="head", output_gate=True),
    "dots1": Family(qk_norm="head"),
    "nemotron_h": Family(gated_mlp=False, norms_per_layer=1),
    # Checked against transformers' classes only (tests/test_transformers_params.py): no bundled model.
    "glm4_moe_lite": Family(),
    "mimo_v2_flash": Family(),
    "minicpm3": Family(),
    "minimax_m2": Family(qk_norm="full"),
    "solar_open": Family(),
}


LLAMA_LIKE = Family()
