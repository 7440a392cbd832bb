"""Properties of the math that hold for every model, and a fuzzer for the config reader.

The reader's contract: for ANY dict it returns a ModelSpec or raises KvplanError (which the CLI turns into one
line and exit 2). Any other exception is a bug.
"""

import math
from functools import cache

import pytest
from conftest import load
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvplan.dtypes import kv_dtype
from kvplan.engines import PrefillActivations
from kvplan.errors import KvplanError
from kvplan.memory import estimate
from kvplan.model import ModelSpec
from kvplan.sources.hf_config import model_from_config

GENUINE = [  # genuine config.json copies covering every layer kind of decoders
    "meta-llama__Llama-3.1-8B.json",
    "meta-llama__Llama-2-7b-hf.json",
    "Qwen__Qwen3-30B-A3B.json",
    "deepseek-ai__DeepSeek-V3.json",
    "openai__gpt-oss-20b.json",
    "openai__gpt2.json",
    "tiiuae__falcon-7b.json",
    "google__gemma-3-1b-it.json",
    "google__gemma-2b-it.json",
    "mistralai__Mistral-7B-v0.1.json",
    "microsoft__Phi-3-mini-4k-instruct.json",
    "meta-llama__Llama-4-Scout-17B-16E-Instruct.json",
    "Qwen__Qwen2.5-7B-Instruct.json",
    "deepseek-ai__DeepSeek-V2-Lite.json",
    "microsoft__phi-2.json",
]

FAST = settings(
    max_examples=60,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@cache
def model(filename: str) -> ModelSpec:
    return load(filename)


models = st.sampled_from(GENUINE).map(model)
contexts = st.integers(min_value=1, max_value=10_000_000)
kv_dtypes = st.sampled_from(["bf16", "fp16", "fp32", "fp8", "int8", "int4", "q8_0", "q4_0", "q5_1"])


@FAST
@given(models, contexts, st.integers(min_value=1, max_value=4096), kv_dtypes)
def test_kv_is_linear_in_batch(spec, ctx, batch, kv):
    one = estimate(spec, ctx, 1, kv)
    many = estimate(spec, ctx, batch, kv)
    assert many.kv_bytes_total == batch * one.kv_bytes_per_sequence
    assert many.kv_bytes_per_sequence == one.kv_bytes_per_sequence
    assert many.kv_bytes_per_token == one.kv_bytes_per_token


@FAST
@given(models, contexts, contexts, kv_dtypes)
def test_kv_is_monotone_in_context(spec, a, b, kv):
    small, large = sorted((a, b))
    assert (
        estimate(spec, small, 1, kv).kv_bytes_per_sequence
        <= estimate(spec, large, 1, kv).kv_bytes_per_sequence
    )


@FAST
@given(st.integers(min_value=4096, max_value=10**9), st.integers(min_value=4096, max_value=10**9))
def test_all_sliding_model_is_flat_past_the_window(a, b):
    # Mistral-7B-v0.1: sliding_window 4096 on all 32 layers
    spec = model("mistralai__Mistral-7B-v0.1.json")
    assert estimate(spec, a).kv_bytes_per_sequence == estimate(spec, b).kv_bytes_per_sequence
    assert estimate(spec, a).kv_bytes_per_sequence == 32 * 4096 * (2 * 8 * 128 * 2)


@FAST
@given(st.integers(min_value=1, max_value=4096))
def test_all_sliding_model_below_the_window_is_linear(ctx):
    spec = model("mistralai__Mistral-7B-v0.1.json")
    assert estimate(spec, ctx).kv_bytes_per_sequence == 32 * ctx * (2 * 8 * 128 * 2)


def _smallest_span(spec: ModelSpec, ctx: int) -> int:
    spans = [ctx]
    for c in spec.caches:
        if c.kind == "sliding":
            spans.append(c.window)
        elif c.kind == "chunked":
            spans.append(c.chunk)
    return min(spans)


@FAST
@given(models, contexts, kv_dtypes)
def test_per_sequence_between_window_floor_and_full_ceiling(spec, ctx, kv):
    result = estimate(spec, ctx, 1, kv)
    # every layer holds at least min(ctx, smallest window) tokens and at most ctx
    assert result.kv_bytes_per_sequence >= result.kv_bytes_per_token * _smallest_span(spec, ctx)
    assert result.kv_bytes_per_sequence <= result.kv_bytes_per_token * ctx + result.state_bytes_per_sequence


@FAST
@given(models, contexts)
def test_quantised_kv_is_never_larger(spec, ctx):
    sizes = [
        estimate(spec, ctx, 1, kv).kv_bytes_per_sequence for kv in ("fp32", "bf16", "q8_0", "fp8", "q4_0")
    ]
    assert sizes == sorted(sizes, reverse=True)
    assert sizes[0] == 2 * sizes[1]  # fp32 is 4 bytes, bf16 2


@FAST
@given(models, contexts, st.integers(min_value=1, max_value=64))
def test_total_is_weights_plus_kv(spec, ctx, batch):
    result = estimate(spec, ctx, batch)
    assert result.total_bytes == result.weights_bytes + result.kv_bytes_total
    assert result.params_active <= result.params_total


@FAST
@given(models, st.integers(min_value=0, max_value=4096), contexts, st.integers(min_value=0, max_value=1_250_000),
       st.sampled_from(["bf16", "fp32"]))
def test_prefill_activations_grow_with_batch_and_prompt(spec, users, short, blocks, dtype):
    """The transformers engine's prefill activations: none without users, every sequence its own share (what the
    batch shares aside: its masks, position tables and cache positions), and never less for a longer prompt of the
    same length modulo 8 (on CUDA a masked prompt that is not a multiple of 8 gets a padded copy of its mask, so
    4,627,083 tokens can hold more than 5,107,040)."""
    activations = PrefillActivations(spec, kv_dtype(dtype))
    long = short + 8 * blocks
    assert activations.peak(0, short) == 0
    assert activations.peak(users, short) <= activations.peak(users, long)
    assert activations.peak(users, short) <= activations.peak(users + 1, short)
    shared = activations.shared(short) if activations.widths is not None else 0
    assert activations.peak(users, short) == users * (activations.peak(1, short) - shared) + (shared if users else 0)


# ---------------------------------------------------------------------------------------------- the fuzzer

# Fields that drive per-layer loops or ranges get small values here; huge ones are tested one by one in a
# separate, memory-capped interpreter (test_reader_variants.py), since a bug there hangs or exhausts memory.
LAYER_KEYS = [
    "num_hidden_layers",
    "n_layer",
    "num_layers",
    "n_layers",
    "num_decoder_layers",
    "first_k_dense_replace",
]
INT_KEYS = [
    "hidden_size",
    "n_embd",
    "d_model",
    "dim",
    "num_attention_heads",
    "n_head",
    "num_heads",
    "num_key_value_heads",
    "num_kv_heads",
    "n_head_kv",
    "multi_query_group_num",
    "head_dim",
    "attention_head_dim",
    "d_kv",
    "intermediate_size",
    "intermediate_size_mlp",
    "moe_intermediate_size",
    "ffn_hidden_size",
    "n_inner",
    "d_ff",
    "vocab_size",
    "sliding_window",
    "sliding_window_pattern",
    "max_window_layers",
    "attention_chunk_size",
    "no_rope_layer_interval",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "qk_nope_head_dim",
    "v_head_dim",
    "q_lora_rank",
    "num_local_experts",
    "num_experts",
    "n_routed_experts",
    "num_experts_per_tok",
    "experts_per_token",
    "n_shared_experts",
    "shared_expert_intermediate_size",
    "decoder_sparse_step",
    "interleave_moe_layer_step",
    "moe_layer_freq",
    "full_attention_interval",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_conv_kernel_dim",
    "attn_layer_period",
    "attn_layer_offset",
    "expert_layer_period",
    "expert_layer_offset",
    "mamba_d_state",
    "mamba_d_conv",
    "mamba_expand",
    "mamba_dt_rank",
    "mamba_num_heads",
    "mamba_head_dim",
    "mamba_n_groups",
    "ssm_state_size",
    "n_groups",
    "conv_kernel",
    "expand",
    "max_position_embeddings",
    "n_positions",
    "n_ctx",
    "type_vocab_size",
    "relative_attention_num_buckets",
    "padded_vocab_size",
]
FLAG_KEYS = [
    "use_sliding_window",
    "tie_word_embeddings",
    "multi_query",
    "new_decoder_architecture",
    "is_encoder_decoder",
    "attention_bias",
    "mamba_conv_bias",
    "use_conv_bias",
    "mamba_proj_bias",
]
OTHER_KEYS = [
    "model_type",
    "architectures",
    "torch_dtype",
    "dtype",
    "layer_types",
    "no_rope_layers",
    "mlp_only_layers",
    "hybrid_override_pattern",
    "block_configs",
    "quantization_config",
    "text_config",
    "auto_map",
    "mamba_ssm_cache_dtype",
    "mamba_ssm_dtype",
    "feed_forward_proj",
    "modules_to_not_convert",
]
ALL_KEYS = LAYER_KEYS + INT_KEYS + FLAG_KEYS + OTHER_KEYS

MODEL_TYPES = [
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen3",
    "qwen3_moe",
    "qwen3_next",
    "gemma",
    "gemma2",
    "gemma3",
    "gemma3_text",
    "llama4",
    "llama4_text",
    "phi",
    "phi3",
    "gpt2",
    "falcon",
    "RefinedWebModel",
    "gpt_neox",
    "cohere2",
    "deepseek_v2",
    "deepseek_v3",
    "gpt_oss",
    "jamba",
    "nemotron_h",
    "nemotron-nas",
    "deci",
    "t5",
    "mt5",
    "bert",
    "roberta",
    "gpt_bigcode",
    "unknown_arch",
    "",
]
LAYER_TYPES = [
    "full_attention",
    "sliding_attention",
    "chunked_attention",
    "attention",
    "linear_attention",
    "mamba",
    "mamba2",
    "mlp",
    "moe",
    "bogus",
]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-3, max_value=300),
    st.sampled_from([0, -1, 1, 2, 3, 4, 8, 64, 128, 4096, 2**31, 2**63, 10**30, 10**400]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1.0, 2.0, 0.5, 2.625, -1.0]),
    st.text(max_size=8),
    st.sampled_from(["4096", "bfloat16", "float16", "fp8", "auto", ""]),
)
anything = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=8,
)
small_layers = st.sampled_from([-1, 0, 1, 2, 3, 4, 6, 8, 1.0, 2.5, "2", None, True, [4]])


def plausible(key: str):
    if key in LAYER_KEYS:
        return small_layers
    if key in INT_KEYS:
        return st.one_of(
            st.integers(min_value=-2, max_value=9), st.sampled_from([16, 64, 128, 512, 4096]), scalars
        )
    if key in FLAG_KEYS:
        return st.one_of(st.booleans(), scalars)
    if key == "model_type":
        return st.one_of(st.sampled_from(MODEL_TYPES), scalars)
    if key == "architectures":
        return st.one_of(
            st.lists(st.sampled_from(["LlamaForCausalLM", "BertForMaskedLM", "T5Model"]), max_size=2), scalars
        )
    if key in ("torch_dtype", "dtype", "mamba_ssm_cache_dtype", "mamba_ssm_dtype"):
        return st.one_of(
            st.sampled_from(["bfloat16", "float16", "float32", "torch.bfloat16", "int8", "fp8"]), scalars
        )
    if key == "layer_types":
        return st.one_of(st.lists(st.sampled_from(LAYER_TYPES), max_size=8), scalars)
    if key in ("no_rope_layers", "mlp_only_layers"):
        return st.one_of(st.lists(st.one_of(st.integers(-1, 8), scalars), max_size=8), scalars)
    if key == "hybrid_override_pattern":
        return st.one_of(st.text(alphabet="M*-EX", max_size=8), scalars)
    if key == "block_configs":
        attention = st.one_of(
            st.fixed_dictionaries(
                {},
                optional={
                    "n_heads_in_group": plausible("hidden_size"),
                    "no_op": scalars,
                    "replace_with_linear": scalars,
                },
            ),
            scalars,
        )
        ffn = st.one_of(
            st.fixed_dictionaries(
                {},
                optional={
                    "ffn_mult": st.one_of(st.floats(allow_nan=True, allow_infinity=True), scalars),
                    "no_op": scalars,
                    "replace_with_linear": scalars,
                },
            ),
            scalars,
        )
        block = st.one_of(st.fixed_dictionaries({}, optional={"attention": attention, "ffn": ffn}), scalars)
        return st.one_of(st.lists(block, max_size=8), scalars)
    if key in ("quantization_config",):
        return st.one_of(
            st.fixed_dictionaries(
                {},
                optional={
                    "quant_method": st.one_of(
                        st.sampled_from(
                            ["fp8", "mxfp4", "awq", "gptq", "bitsandbytes", "compressed-tensors", "modelopt",
                             "bogus"]
                        ),
                        scalars,
                    ),
                    "bits": scalars,
                    "load_in_4bit": scalars,
                    "modules_to_not_convert": anything,
                    "config_groups": anything,
                    "kv_cache_scheme": anything,
                    "quant_algo": st.one_of(st.sampled_from(["NVFP4", "FP8", "W4A8_AWQ"]), scalars),
                    "quantization": anything,
                    "ignore": anything,
                    "exclude_modules": anything,
                    "kv_cache_quant_algo": anything,
                },
            ),
            anything,
        )
    if key == "text_config":
        return st.one_of(st.deferred(lambda: configs), anything)
    return anything


def _fuzzed(base: dict):
    overlay = st.lists(st.sampled_from(ALL_KEYS), unique=True, max_size=6).flatmap(
        lambda keys: st.fixed_dictionaries({k: plausible(k) for k in keys})
    )
    drops = st.sets(st.sampled_from(sorted(base) or ["model_type"]), max_size=3)
    return st.tuples(overlay, drops).map(
        lambda t: {**{k: v for k, v in base.items() if k not in t[1]}, **t[0]}
    )


BASES = [
    {
        "model_type": "llama",
        "num_hidden_layers": 4,
        "hidden_size": 512,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "intermediate_size": 1024,
        "vocab_size": 1000,
        "torch_dtype": "bfloat16",
    },
    {
        "model_type": "gemma3_text",
        "num_hidden_layers": 6,
        "hidden_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "intermediate_size": 512,
        "vocab_size": 100,
        "sliding_window": 16,
        "sliding_window_pattern": 3,
        "torch_dtype": "bfloat16",
    },
    {
        "model_type": "qwen3_next",
        "num_hidden_layers": 4,
        "hidden_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "intermediate_size": 512,
        "vocab_size": 100,
        "full_attention_interval": 2,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 16,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_value_head_dim": 16,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 64,
        "shared_expert_intermediate_size": 64,
        "torch_dtype": "bfloat16",
    },
    {
        "model_type": "nemotron_h",
        "num_hidden_layers": 4,
        "hybrid_override_pattern": "M-M*",
        "hidden_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "attention_head_dim": 64,
        "mamba_num_heads": 4,
        "mamba_head_dim": 32,
        "ssm_state_size": 16,
        "n_groups": 2,
        "conv_kernel": 4,
        "expand": 2,
        "intermediate_size": 512,
        "vocab_size": 100,
        "torch_dtype": "bfloat16",
    },
    {
        "model_type": "jamba",
        "num_hidden_layers": 4,
        "hidden_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 512,
        "vocab_size": 100,
        "attn_layer_period": 2,
        "attn_layer_offset": 1,
        "expert_layer_period": 2,
        "expert_layer_offset": 1,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "mamba_d_state": 8,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
        "mamba_dt_rank": 16,
        "torch_dtype": "bfloat16",
    },
    {
        "model_type": "deepseek_v3",
        "num_hidden_layers": 3,
        "hidden_size": 256,
        "num_attention_heads": 4,
        "kv_lora_rank": 64,
        "qk_rope_head_dim": 16,
        "qk_nope_head_dim": 32,
        "v_head_dim": 32,
        "q_lora_rank": 64,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "n_shared_experts": 1,
        "moe_intermediate_size": 64,
        "first_k_dense_replace": 1,
        "intermediate_size": 512,
        "vocab_size": 100,
        "torch_dtype": "bfloat16",
        "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
    },
    {
        "model_type": "llama4_text",
        "num_hidden_layers": 4,
        "hidden_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "intermediate_size": 256,
        "intermediate_size_mlp": 512,
        "num_local_experts": 4,
        "num_experts_per_tok": 1,
        "vocab_size": 100,
        "attention_chunk_size": 64,
        "no_rope_layers": [],
        "torch_dtype": "bfloat16",
    },
    {
        "model_type": "nemotron-nas",
        "num_hidden_layers": 2,
        "hidden_size": 256,
        "num_attention_heads": 4,
        "vocab_size": 100,
        "torch_dtype": "bfloat16",
        "block_configs": [
            {"attention": {"n_heads_in_group": 2}, "ffn": {"ffn_mult": 2.0}},
            {"attention": {"no_op": True}, "ffn": {"ffn_mult": 1.0}},
        ],
    },
    {
        "model_type": "gpt_oss",
        "num_hidden_layers": 2,
        "hidden_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "intermediate_size": 256,
        "num_local_experts": 4,
        "experts_per_token": 2,
        "vocab_size": 100,
        "sliding_window": 16,
        "layer_types": ["sliding_attention", "full_attention"],
        "quantization_config": {
            "quant_method": "mxfp4",
            "modules_to_not_convert": ["model.layers.*.self_attn"],
        },
    },
    {
        "model_type": "t5",
        "d_model": 64,
        "d_kv": 16,
        "d_ff": 128,
        "num_heads": 4,
        "num_layers": 2,
        "vocab_size": 100,
        "is_encoder_decoder": True,
    },
    {
        "model_type": "bert",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "vocab_size": 100,
    },
    {"model_type": "gpt2", "n_layer": 2, "n_head": 4, "n_embd": 64, "n_positions": 128, "vocab_size": 100},
    {
        "model_type": "falcon",
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "hidden_size": 64,
        "new_decoder_architecture": True,
        "num_kv_heads": 2,
        "vocab_size": 100,
    },
    {
        "model_type": "llava",
        "torch_dtype": "float16",
        "text_config": {
            "model_type": "llama",
            "num_hidden_layers": 2,
            "hidden_size": 64,
            "num_attention_heads": 4,
            "intermediate_size": 128,
            "vocab_size": 100,
        },
    },
]

random_configs = st.lists(st.sampled_from(ALL_KEYS), unique=True, max_size=12).flatmap(
    lambda keys: st.fixed_dictionaries({k: plausible(k) for k in keys})
)
configs = st.one_of(st.sampled_from(BASES).flatmap(_fuzzed), random_configs)


def check_reader(config) -> None:
    try:
        spec = model_from_config(config, "fuzz/model", "fuzz")
    except KvplanError:
        return
    assert isinstance(spec, ModelSpec)
    result = estimate(spec, 1000, 2)
    assert result.kv_bytes_total == 2 * result.kv_bytes_per_sequence >= 0


@settings(
    max_examples=400,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
@given(configs)
def test_reader_never_crashes_on_fuzzed_configs(config):
    check_reader(config)


@pytest.mark.parametrize("base", BASES, ids=[str(b.get("model_type")) for b in BASES])
def test_fuzz_bases_are_valid(base):
    """The fuzzer's starting points read cleanly, so mutations explore past the first checks."""
    spec = model_from_config(base, "base", "test")
    assert spec.num_layers >= 2
    assert math.isfinite(estimate(spec, 100).kv_bytes_per_sequence)


# Malformed configs found by fuzzing and by reading the reader: each must be refused with a KvplanError.
_BASE = BASES[0]
_MOE = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64}
_NAS = BASES[7]
MALFORMED = {
    "architectures-not-a-list": {**{k: v for k, v in _BASE.items() if k != "model_type"}, "architectures": 5},
    "modules_to_not_convert-int": {
        **_BASE,
        "quantization_config": {"quant_method": "fp8", "modules_to_not_convert": 5},
    },
    "config_groups-list": {
        **_BASE,
        "quantization_config": {"quant_method": "compressed-tensors", "config_groups": [1]},
    },
    "num_bits-list": {
        **_BASE,
        "quantization_config": {
            "quant_method": "compressed-tensors",
            "config_groups": {"g": {"weights": {"num_bits": [8]}}},
        },
    },
    "no_rope_layers-int": {**BASES[6], "no_rope_layers": 5},
    "no_rope_layers-dict": {**BASES[6], "no_rope_layers": {"a": 1, "b": 2, "c": 3, "d": 4}},
    "mlp_only_layers-int": {**_BASE, **_MOE, "mlp_only_layers": 5},
    "mlp_only_layers-nested-list": {**_BASE, **_MOE, "mlp_only_layers": [[1]]},
    "nas-ffn-list": {**_NAS, "block_configs": [{"attention": {"n_heads_in_group": 2}, "ffn": [1]}] * 2},
    "nas-ffn_mult-infinity": {
        **_NAS,
        "block_configs": [{"attention": {"n_heads_in_group": 2}, "ffn": {"ffn_mult": math.inf}}] * 2,
    },
    "nas-ffn_mult-nan": {
        **_NAS,
        "block_configs": [{"attention": {"n_heads_in_group": 2}, "ffn": {"ffn_mult": math.nan}}] * 2,
    },
    "mla-with-block_configs-dict": {**BASES[5], "block_configs": {"a": 1}},
    "nemotron_h-layer_types-without-pattern": {
        **{k: v for k, v in BASES[3].items() if k != "hybrid_override_pattern"},
        "layer_types": ["full_attention"] * 4,
    },
    "nemotron_h-E-without-experts": {**BASES[3], "hybrid_override_pattern": "M-E*"},
    "nemotron_h-pattern-null": {**BASES[3], "hybrid_override_pattern": None},
    "mla-with-block_configs-int": {**BASES[5], "block_configs": 7},
    # a 400-digit integer is valid JSON and too large for a float
    "vocab-10**400": {**_BASE, "vocab_size": 10**400},
    "nas-hidden-10**400": {**_NAS, "hidden_size": 10**400, "head_dim": 64},
}


@pytest.mark.parametrize("config", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_configs_never_crash_the_reader(config):
    """Each of these once raised TypeError, KeyError, AttributeError, OverflowError or ValueError."""
    check_reader(config)


REFUSED = {
    k: MALFORMED[k]
    for k in MALFORMED
    if not k.startswith(("mla-with-block_configs", "nemotron_h", "vocab-", "nas-hidden-"))
}


@pytest.mark.parametrize("config", REFUSED.values(), ids=REFUSED.keys())
def test_malformed_field_values_are_refused_with_kvplan_error(config):
    """A field that decides the layout or the weights but has the wrong shape is an error, not ignored."""
    with pytest.raises(KvplanError):
        model_from_config(config, "bad/model", "test")


@pytest.mark.parametrize("pattern", [None, "missing"])
def test_nemotron_h_without_pattern_is_refused(pattern):
    # Nemotron-H's layout (which layers are Mamba2, attention, MLP, MoE) is only in hybrid_override_pattern;
    # transformers' NemotronHConfig cannot build the model without one that matches num_hidden_layers. Reading
    # such a config as all-attention would give a KV figure for a model that does not exist.
    config = {k: v for k, v in BASES[3].items() if k != "hybrid_override_pattern"}
    if pattern is None:
        config["hybrid_override_pattern"] = None
    with pytest.raises(KvplanError, match="hybrid_override_pattern"):
        model_from_config(config, "bad/model", "test")
