"""DeepSeek V4: shared-KV sliding windows, Compressed Sparse Attention (CSA, with its lightning indexer) and Heavily
Compressed Attention (HCA), hash-routed MoE layers and hyper-connections.

Expected numbers come from DeepSeek-V4-Flash's config.json (below), its model card (284B parameters), hand
arithmetic from transformers 5.23's `modeling_deepseek_v4.py` (written out beside each), and transformers' real
caches and meta-device builds; never from kvplan."""

import json

import pytest
from conftest import assert_one_line_error, run_main

from kvplan import engines
from kvplan.capacity import Workload, capacity, gpu_layers
from kvplan.dtypes import kv_dtype
from kvplan.engines import EngineOptions
from kvplan.errors import KvplanError
from kvplan.memory import estimate
from kvplan.model import CompressedKV, ParamCounts, SlidingKV
from kvplan.sources.hf_config import model_from_config

SLIDING, CSA, HCA = "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"

# deepseek-ai/DeepSeek-V4-Flash's config.json (architecture fields). Its compress_ratios has 44 entries for 43
# layers, the last its multi-token-prediction layer's: 0 and 0 (sliding window only), then CSA (4) and HCA (128) in
# turn, CSA on layer 42.
FLASH = {
    "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4", "vocab_size": 129280,
    "hidden_size": 4096, "moe_intermediate_size": 2048, "num_hidden_layers": 43, "num_attention_heads": 64,
    "num_key_value_heads": 1, "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 6,
    "first_k_dense_replace": 0, "max_position_embeddings": 1048576, "rms_norm_eps": 1e-6, "rope_theta": 10000,
    "q_lora_rank": 1024, "qk_rope_head_dim": 64, "head_dim": 512, "compress_ratios": [0, 0] + [4, 128] * 20 + [4, 0],
    "sliding_window": 128, "compress_rope_theta": 160000, "o_lora_rank": 1024, "o_groups": 8, "index_n_heads": 64,
    "index_head_dim": 128, "index_topk": 512, "num_hash_layers": 3, "hc_mult": 4, "hc_eps": 1e-6,
    "hc_sinkhorn_iters": 20, "swiglu_limit": 10.0, "routed_scaling_factor": 1.5, "scoring_func": "sqrtsoftplus",
    "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
}
# A tiny model with every layer type, compress rates of 4 (CSA) and 8 (HCA) and a window of 6, so that short
# contexts cross windows, close compressor windows and leave tokens buffered.
TINY = {
    "model_type": "deepseek_v4", "vocab_size": 128, "hidden_size": 64, "moe_intermediate_size": 32,
    "num_hidden_layers": 4, "num_attention_heads": 4, "head_dim": 32, "q_lora_rank": 16, "n_routed_experts": 4,
    "num_experts_per_tok": 2, "layer_types": [SLIDING, CSA, HCA, CSA], "compress_rates": {CSA: 4, HCA: 8},
    "sliding_window": 6, "o_groups": 2, "o_lora_rank": 8, "index_n_heads": 2, "index_head_dim": 16,
    "index_topk": 4, "hc_mult": 2, "partial_rotary_factor": 0.25, "mlp_layer_types": ["hash_moe"] + ["moe"] * 3,
    "torch_dtype": "float32",
}


def flash(**edits):
    return model_from_config({**FLASH, **edits}, "DeepSeek-V4-Flash", "test")


# ------------------------------------------------------------------------------------------------ layout


def test_flash_layout_from_its_compress_ratios():
    model = flash()
    assert model.num_layers == 43  # compress_ratios' 44th entry (the MTP layer) is cut, as transformers cuts it
    windows = [c for c in model.caches if isinstance(c, SlidingKV)]
    assert [c.layer for c in windows] == list(range(43)) and {(c.head_dim, c.window) for c in windows} == {(512, 128)}
    compressed = [(c.layer, c.ratio, c.head_dim, c.overlap) for c in model.caches
                  if isinstance(c, CompressedKV) and not c.indexer]
    indexers = [(c.layer, c.ratio, c.head_dim) for c in model.caches if isinstance(c, CompressedKV) and c.indexer]
    csa = [*range(2, 42, 2), 42]
    assert compressed == sorted([(i, 4, 512, True) for i in csa] + [(i, 128, 512, False) for i in range(3, 42, 2)])
    assert indexers == [(i, 4, 128) for i in csa]
    assert not any(c.split_by_tensor_parallel for c in model.caches)  # one shared K=V head


def test_layer_types_and_compress_ratios_read_alike():
    types = {0: SLIDING, 4: CSA, 128: HCA}
    stated = flash(layer_types=[types[r] for r in FLASH["compress_ratios"][:43]], compress_ratios=None)
    assert stated.caches == flash().caches


def test_default_layer_types_are_transformers_defaults():
    """Neither layer_types nor compress_ratios: DeepseekV4Config's own default (two HCA layers, then HCA and CSA in
    turn)."""
    transformers = pytest.importorskip("transformers")
    expected = transformers.DeepseekV4Config(num_hidden_layers=9).layer_types
    model = flash(num_hidden_layers=9, compress_ratios=None)
    ratios = {c.layer: c.ratio for c in model.caches if isinstance(c, CompressedKV)}
    assert [{4: CSA, 128: HCA}[ratios[i]] for i in range(9)] == expected


def test_legacy_compress_rates_fold_in():
    """compress_rate_csa / compress_rate_hca override compress_rates, as DeepseekV4Config.__post_init__ folds them."""
    model = flash(compress_rate_csa=8, compress_rate_hca=64, compress_rates={CSA: 4, HCA: 128})
    ratios = {(c.overlap, c.ratio) for c in model.caches if isinstance(c, CompressedKV)}
    assert ratios == {(True, 8), (False, 64)}


def test_num_hash_layers_sets_the_token_table_layers():
    # a hash layer keeps tid2eid (vocab x top-k = 129,280 x 6) instead of the router's correction bias (256)
    per_hash_layer = 129_280 * 6 - 256
    assert flash(num_hash_layers=5).params.other_replicated - flash().params.other_replicated == 2 * per_hash_layer
    assert flash(mlp_layer_types=["moe"] * 43).params == flash(num_hash_layers=0).params


# ------------------------------------------------------------------------------------------------ parameters


def test_flash_matches_its_model_card():
    # DeepSeek-V4-Flash model card: 284B total parameters, 13B activated
    params = flash().params
    assert round(params.total / 1e9) == 284
    assert 13e9 <= params.active < 14e9


def test_hyper_connection_and_grouped_output_parameters_by_hand():
    """One layer of Flash, from modeling_deepseek_v4.py (hidden 4,096, 64 heads of 512, q_lora_rank 1,024,
    o_groups 8 of o_lora_rank 1,024, hc_mult 4)."""
    one, two = flash(num_hidden_layers=1, compress_ratios=[0]), flash(num_hidden_layers=2, compress_ratios=[0, 0])
    layer = {group: getattr(two.params, group) - getattr(one.params, group) for group in ParamCounts.model_fields}
    # split by head: q_b 1,024 x 32,768 + o_a 8 x 1,024 x 4,096 + o_b 8,192 x 4,096; whole on every TP rank (vLLM's
    # fused_wqa_wkv): q_a 4,096 x 1,024 + kv_proj 4,096 x 512
    assert layer["attention"] == 33_554_432 + 33_554_432 + 33_554_432
    assert layer["attention_replicated"] == 4_194_304 + 2_097_152
    # whole: two hyper-connections (fn 24 x 16,384, base 24, scale 3 each), two norms 4,096, q_a_norm 1,024,
    # kv_norm 512, the router 256 x 4,096 and its tid2eid table (layer 1 hashes too) 129,280 x 6; split: 64 sinks
    assert layer["other_replicated"] == 2 * (24 * 16_384 + 24 + 3) + 2 * 4096 + 1024 + 512 + 256 * 4096 \
        + 129_280 * 6
    assert layer["other"] == 64


def test_parameters_equal_transformers_meta_build():
    pytest.importorskip("torch")
    import archkit

    for edits in ({}, {"mlp_bias": True, "hc_mult": 3, "num_hash_layers": 2, "layer_types": None,
                       "compress_ratios": [0, 4, 128, 4], "mlp_layer_types": None}):
        fields = {k: v for k, v in {**TINY, **edits}.items() if k not in ("model_type", "torch_dtype")}
        model = model_from_config({**TINY, **edits}, "tiny", "test")
        assert model.params.total == archkit.meta_parameters("deepseek_v4", fields)


# ------------------------------------------------------------------------------------------------ caches


def test_flash_cache_at_one_million_tokens_by_hand():
    """kvplan's model-level figure in bf16 at 1,048,576 tokens: 43 windows of 128 rows of 512; 21 CSA layers of
    262,144 entries of 512 and of 128 (indexer); 20 HCA layers of 8,192 entries of 512; compressor state at its
    largest: CSA 3 buffered tokens' kv and gate of 1,024 each (2 x 3 x 1,024 x 2 B) and the overlap, 4 x (512 +
    512) x 2 B, its indexer the same at 128; HCA 127 buffered tokens' kv and gate of 512."""
    ctx = 1_048_576
    windows = 43 * 128 * 512 * 2
    entries = 21 * 262_144 * (512 + 128) * 2 + 20 * 8192 * 512 * 2
    state = 21 * (2 * 3 * 1024 * 2 + 4 * 1024 * 2 + 2 * 3 * 256 * 2 + 4 * 256 * 2) + 20 * 2 * 127 * 512 * 2
    est = estimate(flash(), ctx)
    assert est.state_bytes_per_sequence == state == 5_739_520
    assert est.kv_bytes_per_sequence == windows + entries + state


TRANSFORMERS_FLASH_AT_1000 = (
    2 * 128 * 512 * 2 * 2  # layers 0-1: DynamicSlidingWindowLayer keeps K and V, 128 rows of 512 each
    + 41 * 128 * 512 * 2  # the compressed layers keep the window once (K = V)
    # CSA: 250 entries; (999 % 4) + 1 = 4 buffered rows of kv and gate of 1,024; overlap 4 x 512, its gate in fp32
    + 21 * (250 * 512 * 2 + 2 * 4 * 1024 * 2 + 4 * (512 * 2 + 512 * 4))
    + 21 * (250 * 128 * 2 + 2 * 4 * 256 * 2 + 4 * (128 * 2 + 128 * 4))  # its indexer, the same at 128
    + 20 * (7 * 512 * 2 + 2 * 104 * 512 * 2)  # HCA: 7 entries; (999 % 128) + 1 = 104 buffered rows of 512
)


def test_transformers_flash_after_decode_by_hand():
    engine = engines.engine("transformers", EngineOptions())
    model = flash()
    (layers,) = gpu_layers(engine.cached_layers(model), [model.num_layers], 1)
    pool = engine.pool(layers, model, kv_dtype("bf16"))
    assert pool.bytes_held(1, 1000) == TRANSFORMERS_FLASH_AT_1000 == 17_774_080
    # right after a 999-token prefill every window and compressor buffer holds the whole prompt
    prefill = (2 * 999 * 512 * 2 * 2 + 41 * 999 * 512 * 2
               + 21 * (249 * 512 * 2 + 2 * 999 * 1024 * 2 + 4 * (512 * 2 + 512 * 4))
               + 21 * (249 * 128 * 2 + 2 * 999 * 256 * 2 + 4 * (128 * 2 + 128 * 4))
               + 20 * (7 * 512 * 2 + 2 * 999 * 512 * 2))
    assert pool.bytes_after_prefill(1, 999, 1000) == prefill == 201_524_480
    assert pool.bytes_for(1, 1000) == max(prefill, TRANSFORMERS_FLASH_AT_1000)


def measured_profile(tmp_path, data: dict, ctx: int, steps: int, batch: int = 2):
    from kvplan.profiler import run as profile_run

    path = tmp_path / "config.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return profile_run.run_profile(str(path), ctx, batch, device="cpu", dtype="fp32", decode_steps=steps)


@pytest.mark.parametrize(("ctx", "steps"), [
    (5, 2),    # prompt of 3: no window closed at prefill, the CSA one closes while decoding
    (9, 1),    # prompt of 8: both compressors close windows exactly at the prefill's end
    (16, 3),   # prompt of 13: windows of 6 crossed, 13 % 4 and 13 % 8 tokens buffered
    (23, 6),   # decoding closes several windows, the buffers emptying and refilling
    (40, 2),
])
def test_cache_equals_transformers_after_prefill_and_decode(tmp_path, ctx, steps):
    pytest.importorskip("torch")
    result = measured_profile(tmp_path, TINY, ctx, steps)
    assert result.measured_kv_after_prefill_bytes == result.predicted_kv_after_prefill_bytes
    assert result.measured_kv_bytes == result.predicted_kv_bytes
    assert result.kv_exact


def test_flash_config_cut_by_the_profiler_and_measured(tmp_path):
    """Flash's own config.json fields (compress_ratios one longer than the layers, num_hash_layers), widths
    shrunk: `kvplan profile` cuts it to its first layers holding every kind (two sliding, a CSA, an HCA) and
    transformers' cache and meta build equal kvplan's."""
    pytest.importorskip("torch")
    import archkit

    small = {"vocab_size": 512, "hidden_size": 256, "moe_intermediate_size": 32, "n_routed_experts": 4,
             "num_experts_per_tok": 2, "num_attention_heads": 4, "head_dim": 64, "qk_rope_head_dim": 16,
             "q_lora_rank": 32, "o_groups": 2, "o_lora_rank": 16, "index_n_heads": 2, "index_head_dim": 32,
             "sliding_window": 16}
    result = archkit.check(tmp_path, "deepseek_v4", {**FLASH, **small})
    assert result.layers == 4 and result.exact, result


def test_bf16_from_pretrained_keeps_overlap_gates_in_fp32(tmp_path):
    """A checkpoint loaded in bf16 keeps position_bias in fp32 (`_keep_in_fp32_modules_strict`), so CSA's saved
    overlap gates are fp32 while everything else is bf16: the transformers engine's figure for this model."""
    torch = pytest.importorskip("torch")
    import transformers

    from kvplan.profiler import prediction, runtime

    fields = {k: v for k, v in TINY.items() if k not in ("model_type", "torch_dtype")}
    config = transformers.DeepseekV4Config(**fields)
    transformers.DeepseekV4ForCausalLM(config).save_pretrained(tmp_path)
    model = transformers.DeepseekV4ForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16).eval()
    batch, ctx, steps = 2, 19, 3
    cache = transformers.DynamicCache(config=model.config)
    with torch.inference_mode():
        ids = torch.randint(0, 128, (batch, ctx - steps), generator=torch.Generator().manual_seed(0))
        token = model(input_ids=ids, past_key_values=cache, use_cache=True).logits[:, -1:].argmax(-1)
        after_prefill = sum(layer.kv_storage for layer in runtime.cache_layers(cache))
        for _ in range(steps):
            token = model(input_ids=token, past_key_values=cache, use_cache=True).logits[:, -1:].argmax(-1)
    measured = sum(layer.kv_storage for layer in runtime.cache_layers(cache))
    assert cache.layers[1].overlap_gate["compressor"].dtype == torch.float32
    spec = model_from_config(TINY, "tiny", "test")
    predicted = prediction.predict(spec, ctx, batch, ctx - steps, "bf16",
                                   engines.engine("transformers", EngineOptions()))
    assert (predicted.kv_after_prefill, predicted.kv) == (after_prefill, measured)


# ------------------------------------------------------------------------------------------------ engines


@pytest.mark.parametrize(("engine", "fragments"), [
    ("sglang", ("SGLang 0.5.23", "deepseek_v4_memory_pool.py")),
    ("llama.cpp", ("llama.cpp 0c1e57098b", "llama-kv-cache-dsv4.cpp")),
    ("tensorrt-llm", ("TensorRT-LLM",)),
])
def test_engines_with_their_own_v4_layouts_refuse_it(monkeypatch, capsys, write_json, engine, fragments):
    path = write_json(FLASH)
    code, _, err = run_main(monkeypatch, capsys, "estimate", "--model", str(path), "--ctx", "32k", "--gpu", "h200",
                            "--engine", engine)
    assert_one_line_error(code, err, "compressed attention", *fragments, "--engine transformers")


def test_transformers_static_cache_refused():
    with pytest.raises(KvplanError, match="StaticCache"):
        capacity(flash(), Workload(ctx=4096), engine_name="transformers",
                 options=EngineOptions(cache_implementation="static"), kv_budget=2**40)


def test_transformers_and_ideal_estimates_on_h200(monkeypatch, capsys, write_json):
    path = write_json(FLASH)
    code, out, _ = run_main(monkeypatch, capsys, "estimate", "--model", str(path), "--ctx", "1000", "--gpu", "h200",
                            "--engine", "transformers", "--json")
    assert code in (0, 1), out  # 1: printed; its bf16 weights (568 GB) do not fit one H200
    result = json.loads(out)
    assert result["engine_kv_bytes_per_sequence_decode"] == TRANSFORMERS_FLASH_AT_1000
    # 4 stages of about 11 layers each leave 4 x 140 GiB less 530 GiB of bf16 weights for the cache
    assert not result["fits"] and any("needs 4 GPUs (TP 1 x PP 4)" in s for s in result["suggestions"])
    code, out, _ = run_main(monkeypatch, capsys, "estimate", "--model", str(path), "--ctx", "128k", "--gpu", "h200",
                            "--gpus", "8", "--engine", "ideal", "--json")
    assert code == 0 and json.loads(out)["max_concurrent_users"] > 0


def test_show_prints_the_new_kinds(monkeypatch, capsys, write_json):
    monkeypatch.setenv("COLUMNS", "160")
    code, out, _ = run_main(monkeypatch, capsys, "show", "--model", str(write_json(FLASH)))
    assert code == 0
    text = " ".join(out.split())
    for label in ("sliding window 128, K=V", "compressed KV, 1 per 4 tokens", "compressed indexer keys, 1 per 4",
                  "compressed KV, 1 per 128 tokens", "overlapping windows"):
        assert label in text, label


def test_transformers_default_config_shows_and_estimates(monkeypatch, capsys, write_json):
    transformers = pytest.importorskip("transformers")
    path = write_json(transformers.DeepseekV4Config().to_dict())
    code, out, _ = run_main(monkeypatch, capsys, "show", "--model", str(path), "--json")
    assert code == 0 and json.loads(out)["params"]["total"] == 284_328_206_295  # the meta build's count
    code, out, _ = run_main(monkeypatch, capsys, "estimate", "--model", str(path), "--ctx", "32k", "--gpu", "h200",
                            "--gpus", "8", "--engine", "transformers", "--json")
    assert code in (0, 1), out  # 1: printed; the default config names no dtype, so fp32 weights (1.1 TB)
    result = json.loads(out)
    assert result["kv_dtype"] == "fp32" and result["engine_kv_bytes_per_sequence_decode"] > 0


# ------------------------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize(("edit", "field"), [
    ({"layer_types": [SLIDING] * 42, "compress_ratios": None}, "layer_types"),
    ({"layer_types": [SLIDING] * 42 + ["full_attention"], "compress_ratios": None}, "layer_types"),
    ({"compress_ratios": [0, 0, 4]}, "compress_ratios"),
    ({"compress_ratios": [0, 0] + [8, 128] * 20 + [4, 0]}, "compress_ratios"),
    ({"compress_rates": {CSA: 4}}, "compress_rates"),
    ({"compress_rates": {CSA: 4, HCA: 0}}, "compress_rates"),
    ({"mlp_layer_types": ["hash_moe"] * 3 + ["dense"] * 40}, "mlp_layer_types"),
    ({"mlp_layer_types": ["moe"] * 42}, "mlp_layer_types"),
    ({"o_groups": 3}, "o_groups"),
    ({"num_experts_per_tok": 300}, "num_experts_per_tok"),
])
def test_inconsistent_configs_get_one_line(monkeypatch, capsys, write_json, edit, field):
    path = write_json({**FLASH, **edit})
    code, _, err = run_main(monkeypatch, capsys, "show", "--model", str(path))
    assert_one_line_error(code, err, field)
