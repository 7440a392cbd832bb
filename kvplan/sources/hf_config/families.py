"""What kvplan knows of each family by name: transformers' defaults for fields configs omit, old names of model
types, how a family builds its blocks (for parameter counts), and the fields that say a layer keeps a cache of a
kind the reader has no rule for."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, NamedTuple

from kvplan.sources.hf_config.fields import Fields

# Field defaults of transformers' config classes for fields that real config.json files often omit.
GEMMA4_TEXT_DEFAULTS: dict[str, Any] = {
    "tie_word_embeddings": True, "vocab_size": 262_144, "head_dim": 256, "global_head_dim": 512,
    "num_key_value_heads": 4, "sliding_window": 512, "hidden_size_per_layer_input": 256,
    "vocab_size_per_layer_input": 262_144, "hidden_activation": "gelu_pytorch_tanh",
}
GEMMA4_ASSISTANT_DEFAULTS: dict[str, Any] = {"use_ordered_embeddings": False, "num_centroids": 2048}
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
    "gemma3n_text": {
        "tie_word_embeddings": True, "vocab_size": 262_400, "head_dim": 256, "num_key_value_heads": 2,
        "sliding_window": 512, "num_kv_shared_layers": 15, "hidden_size_per_layer_input": 256,
        "vocab_size_per_layer_input": 262_144, "altup_num_inputs": 4, "laurel_rank": 64,
        "hidden_activation": "gelu_pytorch_tanh",
    },
    "gemma4_text": GEMMA4_TEXT_DEFAULTS,
    "gemma4_unified_text": {**GEMMA4_TEXT_DEFAULTS, "sliding_window": 1024, "hidden_size_per_layer_input": 0},
    # Assistants are read from their text_config with the top-level fields that size their projections.
    "gemma4_assistant": {**GEMMA4_TEXT_DEFAULTS, "backbone_hidden_size": 1536, **GEMMA4_ASSISTANT_DEFAULTS},
    "gemma4_unified_assistant": {**GEMMA4_TEXT_DEFAULTS, "sliding_window": 1024, "hidden_size_per_layer_input": 0,
                                 "backbone_hidden_size": 3840, **GEMMA4_ASSISTANT_DEFAULTS},
    "recurrent_gemma": {"tie_word_embeddings": True, "block_types": ["recurrent", "recurrent", "attention"],
                        "attention_window_size": 2048, "conv1d_width": 4, "hidden_activation": "gelu_pytorch_tanh"},
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
    "mamba": {"tie_word_embeddings": True},
    "falcon_mamba": {"tie_word_embeddings": True},
    "mamba2": {"tie_word_embeddings": False},
    "bamba": {"tie_word_embeddings": False},
    "granitemoehybrid": {"tie_word_embeddings": False},
    "falcon_h1": {"tie_word_embeddings": False},
    "zamba": {"tie_word_embeddings": True, "attn_layer_period": 6, "attn_layer_offset": 4},
    "zamba2": {"tie_word_embeddings": True},
    "zaya": {"tie_word_embeddings": True},
    "olmo_hybrid": {"tie_word_embeddings": False},
    # Qwen4ExpTextConfig's defaults for the fields that shape its cache and weights
    "qwen4_exp_text": {"tie_word_embeddings": False, "head_dim": 256, "num_key_value_heads": 2,
                       "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
                       "linear_num_key_heads": 16, "linear_num_value_heads": 32, "hc_count": 4, "hc_lowrank": 320,
                       "ple_conv_kernel_size": 4, "ngram_size": 3, "heads_per_ngram": 8,
                       "ngram_vocab_size_base": 20_000_000, "make_ngram_vocab_size_divisible_by": 128},
    # Dots3NoteTextConfig's defaults for the fields that shape its cache and weights
    "dots3_note_text": {"tie_word_embeddings": False, "kv_lora_rank": 512, "q_lora_rank": 1024,
                        "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128, "index_head_dim": 128,
                        "index_n_heads": 64, "n_shared_experts": 1, "shared_experts_intermediate_size": 1536},
    "qwen3_5_text": {"tie_word_embeddings": False},
    "qwen3_5_moe_text": {"tie_word_embeddings": False},
    "nemotron-nas": {"tie_word_embeddings": False},
    "t5": {"tie_word_embeddings": True},
    **dict.fromkeys(["afmoe", "apertus", "arcee", "aria_text", "bitnet", "diffllama", "doge", "emu3_text_model",
                     "exaone4", "exaone_moe", "flex_olmo", "flint", "git", "granitemoe_swa", "hunyuan_v1_dense",
                     "kolibri1", "laguna", "mellum", "ministral", "mllama_text_model", "moshi", "nanochat", "nemotron",
                     "olmo", "olmo3", "olmoe", "phi4_multimodal", "phimoe", "stablelm"],
                    {"tie_word_embeddings": False}),
    "glm": {"tie_word_embeddings": False, "attention_bias": True},
    "glm4": {"tie_word_embeddings": False, "attention_bias": True},
    "hyperclovax": {"tie_word_embeddings": False, "use_post_norm": True},
    "jais2": {"tie_word_embeddings": False, "attention_bias": True, "mlp_bias": True},
    "persimmon": {"tie_word_embeddings": False, "qk_layernorm": True},
    "seed_oss": {"tie_word_embeddings": False, "attention_bias": True},
    "starcoder2": {"use_bias": True},
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
    # GPT-2-era decoders with caches of their own (legacy.py): the fields those rules read
    "xlnet": {"tie_word_embeddings": True, "mem_len": 512, "use_mems_eval": True},
    "reformer": {"attn_layers": ["local", "lsh", "local", "lsh", "local", "lsh"], "attention_head_size": 64,
                 "is_decoder": False, "num_hashes": 1, "lsh_attn_chunk_length": 64, "local_attn_chunk_length": 64,
                 "axial_pos_embds": True, "axial_pos_shape": [64, 64], "axial_pos_embds_dim": [64, 192],
                 "max_position_embeddings": 4096, "feed_forward_size": 512},
    "cpmant": {"dim_head": 128, "dim_ff": 10240, "prompt_length": 32, "prompt_types": 32, "segment_types": 32,
               "position_bias_num_buckets": 512},
}


def _global_every(n: int, k: int, first: int = 0) -> list[str]:
    """Layer types with layer i global when (i + 1 - first) % k == 0 and sliding otherwise, from layer `first` on."""
    return ["full_attention" if (i + 1 - first) % k == 0 else "sliding_attention" for i in range(first, n)]


def _exaone_layer_types(cfg: Fields, n: int) -> list[str]:
    if cfg.get("sliding_window", default=None) is None:  # EXAONE 4 sets the pattern to 0: no sliding layers
        return ["full_attention"] * n
    return _global_every(n, cfg.int("sliding_window_pattern", default=4))


def _cohere2_moe_layer_types(cfg: Fields, n: int) -> list[str]:
    """The first_k_dense_replace dense layers follow their own pattern, the MoE layers theirs, each counted from
    its own first layer."""
    dense = min(cfg.int("first_k_dense_replace", default=0, minimum=0), n)
    prefix = _global_every(dense, cfg.int("prefix_dense_sliding_window_pattern", default=1))
    return prefix + _global_every(n, cfg.int("sliding_window_pattern", default=4), first=dense)


# Per-layer fields a family's config class fills in when a config.json omits them (the __post_init__ of transformers
# 5.23's configuration_<family>.py): model_type -> fields for a config of n layers. Without them a config that gives
# only sliding_window would read as sliding on every layer.
OMITTED_PER_LAYER_FIELDS: dict[str, Callable[[Fields, int], dict[str, list]]] = {
    "afmoe": lambda cfg, n: {"layer_types": _global_every(n, cfg.int("global_attn_every_n_layers", default=4))},
    "cohere2_moe": lambda cfg, n: {"layer_types": _cohere2_moe_layer_types(cfg, n)},
    "cohere_compass_text": lambda cfg, n: {"layer_types": ["full_attention"] * n},
    "exaone4": lambda cfg, n: {"layer_types": _exaone_layer_types(cfg, n)},
    "exaone_moe": lambda cfg, n: {"layer_types": _exaone_layer_types(cfg, n)},
    "flint": lambda cfg, n: {"layer_types": ["full_attention" if i < 2 or i % 4 == 1 or i == n - 1
                                             else "sliding_attention" for i in range(n)], "mlp_only_layers": [0, 1]},
    "granite_swa": lambda cfg, n: {"layer_types": ["full_attention" if i % 4 == 0 else "sliding_attention"
                                                   for i in range(n)]},
    "granitemoe_swa": lambda cfg, n: {"layer_types": ["full_attention" if i % 4 == 0 else "sliding_attention"
                                                      for i in range(n)]},
    "kolibri1": lambda cfg, n: {"layer_types": _global_every(n, 5)},
    "laguna": lambda cfg, n: {"layer_types": ["full_attention"] * n,
                              "mlp_layer_types": ["dense"] + ["sparse"] * (n - 1)},
    "mellum": lambda cfg, n: {"layer_types": ["full_attention"] * n},
    "olmo3": lambda cfg, n: {"layer_types": _global_every(n, 4)},
}


# Families whose modeling takes head_dim = hidden_size // num_attention_heads, rounded down, when the config gives
# none (transformers' and vLLM's glm4_moe: the GLM-4.5-Air shape, 4,096 / 96 heads, gives 42).
HEAD_DIM_ROUNDED_DOWN = {"glm4_moe"}


MODEL_TYPE_ALIASES = {"RefinedWebModel": "falcon", "gemma3": "gemma3_text", "gemma3n": "gemma3n_text",
                      "gemma4": "gemma4_text", "gemma4_unified": "gemma4_unified_text",
                      "llama4": "llama4_text", "deci": "nemotron-nas", "mt5": "t5",
                      "minimax_m1": "minimax",  # MiniMax-M1's remote-code config: transformers' minimax
                      "dots3_note": "dots3_note_text"}  # dots3's released config: the decoder's fields at the top


# Model types kvplan refuses whole, with the reason.
REFUSED_FAMILIES = {
    "blt": "blt (Byte Latent Transformer) is not one decoder stack: a byte-level encoder and decoder around a global "
           "transformer over patches that an entropy model cuts at run time, so what it caches depends on the text; "
           "kvplan does not lay it out",
}


# Families that nest fields in sub-objects: model_type -> {name the shared rules read: (object, field)}. DBRX's
# attention and MoE shapes live in attn_config and ffn_config (DbrxConfig; vLLM reads attn_config.kv_n_heads).
NESTED_FIELDS: dict[str, dict[str, tuple[str, str]]] = {
    "dbrx": {"num_key_value_heads": ("attn_config", "kv_n_heads"),
             "moe_intermediate_size": ("ffn_config", "ffn_hidden_size"),
             "num_local_experts": ("ffn_config", "moe_num_experts"),
             "num_experts_per_tok": ("ffn_config", "moe_top_k")},
}


# Config fields saying that layers keep something none of kvplan's layer kinds holds (transformers' config classes
# of DeepSeek-V3.2, GLM-5, Inkling and dots3, among others). Reading such a model as plain attention would give a KV
# figure that is wrong with no sign of it, so it is refused, naming the field, unless the family's own layout reads it.
UNMODELLED_CACHE_FIELDS = {
    "indexer_compress_ratio": "a compressed indexer cache",
    "compress_rates": "compressed attention caches",
    "num_kv_shared_layers": "layers that reuse an earlier layer's KV cache",
    "swa_num_key_value_heads": "sliding-window layers with their own KV heads",
    "swa_head_dim": "sliding-window layers with their own head size",
    "per_layer_config": "per-layer overrides of the attention shape",
    "attention_k_eq_v": "keys that double as values",
}
# The fields of UNMODELLED_CACHE_FIELDS a family's own layout reads (`kvplan.sources.hf_config.gemma`).
_GEMMA4_FIELDS = ("num_kv_shared_layers", "per_layer_config", "attention_k_eq_v")
MODELLED_BY_FAMILY = {"gemma3n_text": ("num_kv_shared_layers",), "gemma4_text": _GEMMA4_FIELDS,
                      "gemma4_unified_text": _GEMMA4_FIELDS, "gemma4_assistant": _GEMMA4_FIELDS,
                      "gemma4_unified_assistant": _GEMMA4_FIELDS}


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
RECURRENT_FIELDS = ("mamba_d_state", "mamba_n_heads", "n_mamba_heads", "state_size", "ssm_state_size",
                    "conv_L_cache", "short_conv_kernel_size", "number_of_conv_states", "linear_num_heads",
                    "linear_num_key_heads", "layers_block_type", "block_types")


# The Mamba mixer a family's recurrent layers run (transformers' modeling_<family>.py): Mamba (Gu & Dao) or Mamba-2.
# Recurrent layers of the other families are Gated DeltaNet (Qwen3-Next, Qwen3.5, OLMo Hybrid).
MAMBA_MIXERS = {"mamba": "mamba", "falcon_mamba": "mamba", "jamba": "mamba", "zamba": "mamba",
                "mamba2": "mamba2", "bamba": "mamba2", "granitemoehybrid": "mamba2", "nemotron_h": "mamba2",
                "falcon_h1": "mamba2", "zamba2": "mamba2"}


# Families with no attention at all: every layer a Mamba mixer, num_attention_heads 0 (Mamba-2's num_heads are its
# SSM heads).
ATTENTION_FREE = frozenset({"mamba", "falcon_mamba", "mamba2"})


# MoE routers that keep a load-balancing bias per routed expert (`e_score_correction_bias`, which checkpoints store
# and transformers registers as a buffer): the families whose modeling files define it, as of transformers 5.23.
# AFMoE keeps it as a parameter named expert_bias.
CORRECTION_BIAS_ROUTERS = {"afmoe", "axk1", "axk2", "beam", "deepseek_v3", "deepseek_v32", "dots1", "ernie4_5_moe",
                           "exaone_moe", "glm4_moe", "glm4_moe_lite", "glm_moe_dsa", "hy_v3", "hy_v4", "kimi_linear",
                           "kolibri1", "laguna", "longcat_flash", "mimo_v2_flash", "minimax_m2", "minimax_m3_vl_text",
                           "solar_open"}


# MoE blocks that scale their shared expert by a learned gate (`shared_expert_gate`, hidden -> 1) as of transformers
# 5.23: the Qwen families. Others with a shared_expert_intermediate_size (Flint, Kolibri, Laguna) add it ungated.
SHARED_EXPERT_GATES = {"qwen2_moe", "qwen3_next", "qwen3_5_moe_text", "qwen3_omni_moe_text", "qwen4_exp_text"}


# Draft models (Gemma 4 assistants) whose decoder, in text_config, runs on its target model's KV cache: read by
# their own model_type, with these top-level fields that size their projections.
ASSISTANT_TYPES = ("gemma4_assistant", "gemma4_unified_assistant")
ASSISTANT_FIELDS = ("backbone_hidden_size", "use_ordered_embeddings", "num_centroids")


# Encoders with no decoder mode (the BERT family, which may run as a decoder, is read in encoders.py).
ENCODER_ONLY = {"distilbert", "deberta", "deberta-v2", "albert", "modernbert", "mpnet", "nomic_bert"}


class Family(NamedTuple):
    """How a decoder family builds its blocks, for parameter counting (from each family's modeling file).

    Biases are the family's own (`qkv_bias`, `o_bias`, `mlp_bias`: always there) or switched by the config flag its
    modeling file reads (`*_bias_field`: Llama's attention_bias and mlp_bias, StarCoder2's use_bias)."""

    gated_mlp: bool = True          # gate/up/down (SwiGLU, GeGLU) vs up/down
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qkv_bias_field: str = "attention_bias"
    o_bias_field: str | None = "attention_bias"  # None: the output projection never has a bias (Qwen2, GLM)
    mlp_bias_field: str = "mlp_bias"
    lm_head_bias: bool = False      # the output projection has a bias (Phi-2, GIT)
    lm_head_bias_field: str = "lm_head_bias"  # the config flag that gives it one (PhiMoE; ERNIE 4.5's use_bias)
    norms_per_layer: int = 2        # hidden-sized norm vectors per layer
    layer_norm: bool = False        # LayerNorm (weight + bias) rather than RMSNorm (weight)
    norm_weights: bool = True       # False: norms with no learned weights (OLMo's LayerNorm, nanochat's RMSNorm)
    qk_norm: str | None = None      # "head": one head_dim vector each for q and k; "full": over all heads
    qk_norm_field: str | None = None  # the config flag that switches the q/k norms on (None: always on)
    qk_norm_bias: bool = False      # q/k norms are LayerNorms with a bias (Persimmon)
    attention_sinks: bool = False   # one learned sink logit per query head (gpt-oss, Flint, Granite SWA)
    attention_gate: str | None = None  # output gate from the hidden state: "full" one per head_dim element
                                       # (Qwen3-Next, AFMoE), "head" one per head (Laguna)
    learned_positions: bool = False  # GPT-2 style position embedding table
    position_offset: int = 0        # rows the position table keeps beyond its positions (OPT, BioGPT: 2)
    embedding_norm: bool = False    # a norm on the token embeddings (BLOOM word_embeddings_layernorm)
    final_norm: bool = True         # a norm after the last layer (GPT-1 has none)
    bias_flag: str | None = None    # a config flag that gives every linear a bias (Falcon `bias`)
    moe_output_norm: bool = False   # an RMSNorm on each MoE block's output (A.X-K1 post_mlp_layernorm)
    output_gate: bool = False       # a query-sized sigmoid gate on the attention output, one bias per head (Beam)
    gated_query: bool = False       # MLA query and output gate from one projection (A.X-K2 q_gate_proj)
    gated_norms: bool = False       # RMSNorms followed by a low-rank sigmoid gate (A.X-K2 AXK2GatedRMSNorm)
    hyper_connections: bool = False  # hc_mult residual streams mixed around attention and MLP (Hy V4)


FAMILIES: dict[str, Family] = {
    "qwen2": Family(qkv_bias=True, o_bias_field=None),
    "qwen2_moe": Family(qkv_bias=True, o_bias_field=None),
    "qwen3": Family(qk_norm="head"),
    "qwen3_moe": Family(qk_norm="head"),
    "qwen3_next": Family(qk_norm="head", attention_gate="full"),
    "gemma2": Family(norms_per_layer=4),
    "gemma3_text": Family(norms_per_layer=4, qk_norm="head"),
    "phi": Family(gated_mlp=False, qkv_bias=True, o_bias=True, mlp_bias=True, lm_head_bias=True, norms_per_layer=1,
                  layer_norm=True),
    "gpt2": Family(gated_mlp=False, qkv_bias=True, o_bias=True, mlp_bias=True, layer_norm=True,
                   learned_positions=True),
    "gpt_bigcode": Family(gated_mlp=False, qkv_bias=True, o_bias=True, mlp_bias=True, layer_norm=True,
                          learned_positions=True),
    "gpt_neox": Family(gated_mlp=False, qkv_bias=True, o_bias=True, mlp_bias=True, layer_norm=True),
    "falcon": Family(gated_mlp=False, layer_norm=True, bias_flag="bias"),
    "cohere": Family(norms_per_layer=1),
    "cohere2": Family(norms_per_layer=1),
    "olmo2": Family(qk_norm="full"),
    "gpt_oss": Family(qkv_bias=True, o_bias=True, attention_sinks=True),
    "glm4_moe": Family(qk_norm="head", qk_norm_field="use_qk_norm", o_bias_field=None),
    "hy_v3": Family(qk_norm="head"),
    "axk1": Family(moe_output_norm=True),
    "axk2": Family(gated_query=True, gated_norms=True),
    "minimax_m3_vl_text": Family(qk_norm="head"),
    "hy_v4": Family(output_gate=True, hyper_connections=True),
    "hunyuan_v1_moe": Family(qk_norm="head"),
    "beam": Family(norms_per_layer=4, qk_norm="head", output_gate=True),
    "dots1": Family(qk_norm="head"),
    "nemotron_h": Family(gated_mlp=False, norms_per_layer=1),
    "olmo_hybrid": Family(qk_norm="full"),
    "qwen3_5_text": Family(qk_norm="head", attention_gate="full"),
    "qwen3_5_moe_text": Family(qk_norm="head", attention_gate="full"),
    "modernbert-decoder": Family(),  # parameters: params.FAMILY_PARAMS
    # parameters counted by their own rules (params.FAMILY_PARAMS); q and k normalised per head
    **dict.fromkeys(("gemma3n_text", "gemma4_text", "gemma4_unified_text", "lfm2", "lfm2_moe"), Family(qk_norm="head")),
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
    # Families read through the Llama-style rules with their own blocks (transformers 5.23's modeling files); those
    # with a counting rule of their own are in params.FAMILY_PARAMS.
    "afmoe": Family(norms_per_layer=4, qk_norm="head", attention_gate="full"),
    "apertus": Family(gated_mlp=False, qk_norm="head"),
    "arcee": Family(gated_mlp=False),
    "aria_text": Family(),
    "bitnet": Family(),
    "cohere2_moe": Family(norms_per_layer=1),
    "cohere_compass_text": Family(norms_per_layer=1),
    "diffllama": Family(),
    "doge": Family(norms_per_layer=4, qk_norm="head"),
    "emu3_text_model": Family(),
    "ernie4_5_moe": Family(qkv_bias_field="use_bias", o_bias_field="use_bias", mlp_bias_field="use_bias",
                           lm_head_bias_field="use_bias"),
    "exaone4": Family(qk_norm="head"),
    "exaone_moe": Family(qk_norm="head"),
    "flex_olmo": Family(qk_norm="full"),
    "flint": Family(qk_norm="head", attention_sinks=True),
    "git": Family(gated_mlp=False, qkv_bias=True, o_bias=True, mlp_bias=True, lm_head_bias=True, layer_norm=True,
                  learned_positions=True),
    "glm": Family(o_bias_field=None),
    "glm4": Family(o_bias_field=None, norms_per_layer=4),
    "granite_swa": Family(attention_sinks=True),
    "granitemoe_swa": Family(attention_sinks=True),
    "hunyuan_v1_dense": Family(qk_norm="head"),
    "hyperclovax": Family(),
    "jais2": Family(gated_mlp=False, layer_norm=True),
    "jetmoe": Family(),
    "kolibri1": Family(norms_per_layer=4, qk_norm="head"),
    "laguna": Family(qk_norm="head", attention_gate="head"),
    "mellum": Family(qk_norm="head"),
    "ministral": Family(),
    "mllama_text_model": Family(),
    "moshi": Family(),
    "nanochat": Family(gated_mlp=False, norm_weights=False),
    "nemotron": Family(gated_mlp=False, layer_norm=True),
    "olmo": Family(norm_weights=False),
    "olmo3": Family(qk_norm="full"),
    "olmoe": Family(qk_norm="full"),
    "persimmon": Family(gated_mlp=False, qkv_bias=True, o_bias=True, mlp_bias=True, layer_norm=True, qk_norm="head",
                        qk_norm_field="qk_layernorm", qk_norm_bias=True),
    "phi4_multimodal": Family(),
    "phimoe": Family(layer_norm=True),
    "seed_oss": Family(o_bias_field="attention_out_bias"),
    "stablelm": Family(layer_norm=True, qkv_bias_field="use_qkv_bias", o_bias_field=None, qk_norm="full",
                       qk_norm_field="qk_layernorm"),
    "starcoder2": Family(gated_mlp=False, layer_norm=True, qkv_bias_field="use_bias", o_bias_field="use_bias",
                         mlp_bias_field="use_bias"),
}


LLAMA_LIKE = Family()


# The MLP width of families whose MLP is 4 x hidden unless a field says otherwise (None: always 4 x hidden, as
# transformers' modeling files build it).
FOUR_X_MLP_FIELD: dict[str, str | None] = {
    "gpt2": "n_inner", "gpt_bigcode": "n_inner", "codegen": "n_inner", "gptj": "n_inner",
    "gpt_neo": "intermediate_size", "falcon": "ffn_hidden_size", "bloom": None, "openai-gpt": None, "xlm": None,
}


# Families whose rules live in a module of their own, which registers them when imported (layout.FAMILY_LAYOUTS,
# params.FAMILY_PARAMS and FAMILY_WIDTHS, layout.LAYER_CUTS, MODEL_TYPE_DEFAULTS): model_type -> module. Only the
# module of the family read is imported (`load_rules`), so a planning command does not load every family's.
RULE_MODULES: dict[str, str] = {
    **dict.fromkeys(("gemma3n_text", "gemma4_text", "gemma4_unified_text", "gemma4_assistant",
                     "gemma4_unified_assistant", "recurrent_gemma"), "gemma"),
    **dict.fromkeys(("lfm2", "lfm2_moe", "lfm3", "minimax", "bailing_hybrid", "inkling_text", "inkling2_text",
                     "rwkv", "xlstm", "hrm_text"), "recurrent"),
    **dict.fromkeys(("xlnet", "reformer", "cpmant"), "legacy"),
    "deepseek_v4": "deepseek_v4",
    "dots3_note_text": "dots3",
    "qwen4_exp_text": "qwen4_exp",
}


def load_rules(model_type: str) -> None:
    """Import the module holding `model_type`'s own rules (RULE_MODULES), which registers them."""
    module = RULE_MODULES.get(model_type)
    if module is not None:
        importlib.import_module(f"kvplan.sources.hf_config.{module}")
