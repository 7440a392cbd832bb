"""Gemma 3n, Gemma 4 and RecurrentGemma: layers that read an earlier layer's KV, per-layer attention shapes, keys
that double as values, RG-LRU state. Expected numbers come from the configs by hand (transformers' modeling files
say which tensors exist), from vLLM 0.32's allocation rules, from transformers' real caches and meta-device builds,
and from published parameter counts; never from kvplan itself."""

import copy
import json

import archkit
import pytest
from conftest import MiB, raw, run_cli

from kvplan.capacity import Hardware, Workload, capacity
from kvplan.errors import KvplanError
from kvplan.profiler import config as profile_config
from kvplan.sources import load_model
from kvplan.sources.hf_config import model_from_config

H100 = Hardware(name="NVIDIA H100 SXM", memory_bytes=81_559 * MiB)


def layers_of(spec, kind: str) -> list[int]:
    return [c.layer for c in spec.caches if c.kind == kind]


# --------------------------------------------------------------------------------------------- Gemma 4 31B


def test_gemma4_31b_full_layers_have_their_own_heads_and_head_size():
    # text_config: 60 layers, every 6th full; sliding layers 16 KV heads x head_dim 256, full layers
    # num_global_key_value_heads 4 x global_head_dim 512 (attention_k_eq_v: the value is the key projection,
    # and both are cached)
    spec = load_model("google/gemma-4-31B-it")
    assert layers_of(spec, "full") == list(range(5, 60, 6))
    assert len(layers_of(spec, "sliding")) == 50
    full = next(c for c in spec.caches if c.kind == "full")
    sliding = next(c for c in spec.caches if c.kind == "sliding")
    assert (full.kv_heads, full.head_dim, full.head_dim_v) == (4, 512, 512)
    assert (sliding.kv_heads, sliding.head_dim, sliding.window) == (16, 256, 1024)
    # bf16: 50 x 2 x 16 x 256 x 2 + 10 x 2 x 4 x 512 x 2 = 819,200 + 81,920
    assert sum(c.bytes_per_token(_bf16()) for c in spec.caches) == 901_120


def test_gemma4_31b_parameters_match_the_model_card():
    # Gemma 4 model card: 31B dense, 30.7B parameters in the decoder; the vision tower comes on top
    params = load_model("google/gemma-4-31B-it").params
    assert round((params.total - params.vision) / 1e9, 1) == 30.7


def test_vllm_gemma4_31b_pages_and_groups_by_hand():
    # vLLM 0.32 (Attention.get_kv_cache_spec, unify_kv_cache_spec_page_size, _get_kv_cache_groups_uniform_page_size):
    # sliding page 16 tokens x 2 x 16 x 256 x 2 = 262,144 B; full page 16 x 2 x 4 x 512 x 2 = 131,072 B, which
    # divides it: the full layers take blocks of 32 tokens for one 262,144 B page. 50 sliding and 10 full layers:
    # group size 10, 5 sliding groups and 1 full group; a block is 10 pages = 2,621,440 B.
    # Per request at L = 8,192 with I = 2 x 8,192 in flight: full cdiv(8192, 32) = 256,
    # sliding 5 x (cdiv(min(1023 + 16384, 8192), 16) + 1) = 5 x 513 = 2,565.
    result = run_cli("estimate", "--model", "google/gemma-4-31B-it", "--ctx", "8k", "--gpu", "h100",
                     "--engine", "vllm", "--json")
    assert result.returncode in (0, 1), result.stderr  # 1: printed, and 1 user does not fit
    out = json.loads(result.stdout)
    assert out["vllm_block_bytes"] == 10 * 262_144 == 2_621_440
    assert out["vllm_blocks_per_sequence"] == 256 + 5 * 513 == 2821
    assert out["engine_kv_bytes_per_sequence"] == 2821 * 2_621_440


def test_vllm_pads_a_page_that_does_not_divide_the_largest():
    # 31B with 48 query heads and 3 global KV heads: full pages of 16 x 2 x 3 x 512 x 2 = 98,304 B do not divide
    # the sliding 262,144 B, so vLLM 0.32 pads them to 262,144 B and keeps blocks of 16 tokens
    # (unify_kv_cache_spec_page_size, page_size_padded). Per request at 8,192: full cdiv(8192, 16) = 512,
    # sliding 5 x 513 as before; a block is still 10 x 262,144 B.
    data = raw("google__gemma-4-31B-it.json")
    data["text_config"].update(num_attention_heads=48, num_global_key_value_heads=3)
    cap = capacity(model_from_config(data, "padded", "test"), Workload(ctx=8192), hardware=H100)
    assert cap.vllm_block_bytes == 2_621_440
    assert cap.vllm_blocks_per_sequence == 512 + 5 * 513
    assert any("padded to 262,144 B" in note for note in cap.notes)


def test_gemma4_vision_towers_equal_transformers_modules():
    """The Gemma 4 vision tower and its projector against transformers' own multimodal class on the meta device
    (text decoder cut to one layer); E2B's audio tower is not counted, and says so."""
    import torch
    import transformers

    for filename in ("google__gemma-4-31B-it.json", "google__gemma-4-E2B-it.json"):
        data = raw(filename)
        spec = model_from_config(data, filename, "test")
        data["text_config"].update(num_hidden_layers=1, layer_types=["full_attention"], num_kv_shared_layers=0)
        with torch.device("meta"):
            model = transformers.Gemma4ForConditionalGeneration(transformers.Gemma4Config.from_dict(data))
        vision = sum(p.numel() for name, p in model.named_parameters()
                     if ".vision_tower." in name or ".embed_vision." in name)
        assert spec.params.vision == vision > 0
        assert ("the audio encoder of gemma4 is not counted" in spec.notes) == (data["audio_config"] is not None)


# ---------------------------------------------------------------------------------------------- Gemma 4 E2B


def test_gemma4_e2b_shared_layers_read_the_last_unshared_layer_of_their_type():
    # 35 layers, every 5th full (4, 9, ..., 34), num_kv_shared_layers 20: layers 15-34 compute no K/V; the sliding
    # ones read layer 13, the full ones layer 14 (transformers kv_sharing_modes, vLLM kv_sharing_target_layer_name)
    spec = load_model("google/gemma-4-E2B-it")
    shared = [c for c in spec.caches if c.kind == "shared"]
    assert [c.layer for c in shared] == list(range(15, 35))
    assert {c.layer: c.source for c in shared if c.layer % 5 == 4} == dict.fromkeys(range(19, 35, 5), 14)
    assert {c.source for c in shared if c.layer % 5 != 4} == {13}
    # 12 sliding layers of 1 KV head x 256 and 3 full of 1 x 512 cache anything: bf16, 8,192 tokens, W = 512:
    # 12 x 1,024 B x 512 + 3 x 2,048 B x 8,192 = 6,291,456 + 50,331,648
    assert sum(c.bytes_per_token(_bf16()) for c in spec.caches) == 12 * 1024 + 3 * 2048
    assert sum(c.bytes_per_token(_bf16()) * c.tokens_held(8192) for c in spec.caches) == 56_623_104


def test_gemma4_e2b_effective_parameters_match_the_model_card():
    # Gemma 4 model card: E2B has 2.3B effective parameters, the per-layer embeddings (262,144 x 35 x 256 =
    # 2,348,810,240, looked up rather than multiplied) left out
    params = load_model("google/gemma-4-E2B-it").params
    assert round((params.total - params.vision - 262_144 * 35 * 256) / 1e9, 1) == 2.3


def test_vllm_gemma4_e2b_shared_layers_allocate_nothing():
    # Only layers 0-14 get a KV spec: 12 sliding pages of 16 x 2 x 1 x 256 x 2 = 16,384 B and 3 full pages of
    # 16 x 2 x 1 x 512 x 2 = 32,768 B; the sliding layers take blocks of 32 tokens for one 32,768 B page.
    # Group size 3: 4 sliding groups, 1 full; a block is 3 pages = 98,304 B.
    # At L = 8,192, I = 16,384: full cdiv(8192, 16) = 512, sliding 4 x (cdiv(min(511 + 16384, 8192), 32) + 1) = 4 x 257
    cap = capacity(load_model("google/gemma-4-E2B-it"), Workload(ctx=8192), hardware=H100)
    assert cap.vllm_block_bytes == 3 * 32_768
    assert cap.vllm_blocks_per_sequence == 512 + 4 * 257
    assert cap.engine_kv_bytes_per_sequence == 1540 * 98_304


def test_transformers_engine_keeps_no_cache_for_shared_layers():
    # DynamicCache with a DummyLayer on each shared layer: a decoded 8,192-token sequence holds the 12 sliding
    # layers' last 512 tokens and the 3 full layers' 8,192 (bf16): 56,623,104 B
    cap = capacity(load_model("google/gemma-4-E2B-it"), Workload(ctx=8192), engine_name="transformers",
                   hardware=H100)
    assert cap.engine_kv_bytes_per_sequence_decode == 56_623_104


def test_profile_cut_keeps_the_shared_layers_among_the_first_layers():
    # Cut to 20 layers: 15 unshared and the first 5 shared ones, so num_kv_shared_layers becomes 5
    source = profile_config.resolve("google/gemma-4-E2B-it")
    data, spec = profile_config.first_layers(source, 20)
    assert data["text_config"]["num_kv_shared_layers"] == 5
    assert [c.source for c in spec.caches if c.kind == "shared"] == [13, 13, 13, 13, 14]
    # a cut ending on a sliding layer is not the model's first layers: Gemma 4 makes its last layer full
    with pytest.raises(KvplanError, match="changed the layout"):
        profile_config.first_layers(source, 17)


# --------------------------------------------------------------------- variants against transformers' caches


SMALL_GEMMA4 = {"vocab_size": 512, "vocab_size_per_layer_input": 512, "hidden_size": 256, "intermediate_size": 64,
                "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "global_head_dim": 64,
                "sliding_window": 16, "num_hidden_layers": 9, "hidden_size_per_layer_input": 16,
                "layer_types": ["sliding_attention"] * 2 + ["full_attention"] + ["sliding_attention"] * 2
                + ["full_attention"] + ["sliding_attention"] * 2 + ["full_attention"]}


@pytest.mark.parametrize("model_type, fields", [
    # keys double as values on full layers (no v_proj; both cached), their own KV heads, shared layers with a
    # double-wide MLP, and the MoE block beside the MLP
    ("gemma4_text", {**SMALL_GEMMA4, "attention_k_eq_v": True, "num_global_key_value_heads": 1,
                     "num_kv_shared_layers": 3, "use_double_wide_mlp": True, "enable_moe_block": True,
                     "num_experts": 4, "top_k_experts": 2, "moe_intermediate_size": 32}),
    # per_layer_config in place of global_head_dim (the same for every layer of a type: transformers' rotary
    # tables are per type)
    ("gemma4_text", {**SMALL_GEMMA4, "global_head_dim": 128, "per_layer_config": {
        str(i): {"head_dim": 48, "num_key_value_heads": 1} for i in (2, 5, 8)}}),
    ("gemma4_unified_text", {**{k: v for k, v in SMALL_GEMMA4.items() if "per_layer_input" not in k},
                             "num_kv_shared_layers": 4, "attention_bias": True}),
    # per-layer MLP widths, AltUp with 3 streams, LAuReL rank 8
    ("gemma3n_text", {"vocab_size": 512, "vocab_size_per_layer_input": 512, "hidden_size": 128,
                      "intermediate_size": [64, 96, 64, 96, 64, 96, 64], "num_hidden_layers": 7,
                      "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "sliding_window": 16,
                      "layer_types": ["sliding_attention", "sliding_attention", "full_attention"] * 2
                      + ["sliding_attention"], "num_kv_shared_layers": 3, "altup_num_inputs": 3,
                      "laurel_rank": 8, "activation_sparsity_pattern": [0.0] * 7}),
])
def test_variants_equal_transformers_cache_and_parameters(tmp_path, model_type, fields):
    """Every layer kept (no --layers cut): the cache after prefill and decode, and the meta-device parameters."""
    data = {"model_type": model_type, **fields}
    result = archkit.check(tmp_path, model_type, data, layers=None)
    assert result.exact, result


def test_attention_k_eq_v_full_layers_have_no_v_proj():
    # num_global_key_value_heads applies with attention_k_eq_v only: the 3 full layers go from k_proj and v_proj of
    # 2 heads x 64 to a k_proj of 1 head x 64 (Gemma4TextConfig.__post_init__, Gemma4TextAttention)
    base = {"model_type": "gemma4_text", **SMALL_GEMMA4, "num_global_key_value_heads": 1}
    plain = model_from_config(base, "plain", "test")
    k_eq_v = model_from_config({**base, "attention_k_eq_v": True}, "k_eq_v", "test")
    assert plain.params.total - k_eq_v.params.total == 3 * (2 * 256 * (2 * 64) - 256 * (1 * 64))
    full = [c for c in k_eq_v.caches if c.kind == "full"]
    assert [(c.kv_heads, c.head_dim, c.head_dim_v) for c in full] == [(1, 64, 64)] * 3


# ----------------------------------------------------------------------------------------- Gemma 4 assistants


def test_gemma4_assistant_caches_nothing_and_counts_its_projections():
    """A drafter whose every layer reads its target's KV. transformers 5.23 cannot build it, so its parameters
    are counted by hand from `Gemma4AssistantForCausalLM` and `Gemma4TextModel`."""
    config = {"model_type": "gemma4_assistant", "backbone_hidden_size": 1536, "use_ordered_embeddings": True,
              "num_centroids": 2048, "text_config": {
                  "model_type": "gemma4_text", "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
                  "num_key_value_heads": 1, "head_dim": 256, "global_head_dim": 512, "intermediate_size": 2048,
                  "vocab_size": 262_144, "hidden_size_per_layer_input": 0, "vocab_size_per_layer_input": 0,
                  "num_kv_shared_layers": 4,
                  "layer_types": ["sliding_attention"] * 3 + ["full_attention"]}}
    spec = model_from_config(config, "assistant", "test")
    assert {c.kind for c in spec.caches} == {"none"} and spec.architecture == "gemma4_assistant"
    sliding = 256 * 1024 + 1024 * 256 + 256 + 3 * 256 * 2048 + 4 * 256  # q, o, q_norm, MLP, 4 norms: no k, v
    full = 256 * 2048 + 2048 * 256 + 512 + 3 * 256 * 2048 + 4 * 256
    embeddings, final_norm = 262_144 * 256, 256
    projections = 2 * 1536 * 256 + 256 * 1536 + 256 * 2048  # pre, post, centroids
    assert spec.params.total == embeddings + 3 * sliding + full + final_norm + projections == 77_731_328
    assert not any("encoder" in note for note in spec.notes)
    with pytest.raises(KvplanError, match="no per-sequence cache"):
        capacity(spec, Workload(ctx=8192), hardware=H100)


# -------------------------------------------------------------------------------------------- RecurrentGemma

# google/recurrentgemma-2b's config.json fields (its block pattern is under "_block_types", so transformers
# takes the default recurrent, recurrent, attention).
RECURRENTGEMMA_2B = {
    "_block_types": ["recurrent", "recurrent", "attention"], "architectures": ["RecurrentGemmaForCausalLM"],
    "attention_bias": False, "attention_window_size": 2048, "conv1d_width": 4, "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 2560, "intermediate_size": 15360,
    "lru_width": 2560, "model_type": "recurrent_gemma", "num_attention_heads": 10, "num_hidden_layers": 26,
    "num_key_value_heads": 1, "vocab_size": 256000, "torch_dtype": "bfloat16",
}


def test_recurrentgemma_2b_layout_and_state_by_hand():
    spec = model_from_config(copy.deepcopy(RECURRENTGEMMA_2B), "recurrentgemma-2b", "test")
    assert layers_of(spec, "sliding") == list(range(2, 26, 3))
    assert len(layers_of(spec, "recurrent")) == 18
    # per RG-LRU layer: conv 2,560 x (4 - 1) bf16 + recurrence 2,560 fp32 = 15,360 + 10,240 = 25,600 B;
    # attention: 1 KV head x 256, 2,048-token window
    state = next(c for c in spec.caches if c.kind == "recurrent")
    assert state.state_bytes(_bf16()) == 25_600
    attention = next(c for c in spec.caches if c.kind == "sliding")
    assert (attention.kv_heads, attention.head_dim, attention.window) == (1, 256, 2048)
    # at 8,192 tokens: 8 x 1,024 B x 2,048 + 18 x 25,600
    held = sum(c.bytes_per_token(_bf16()) * c.tokens_held(8192) + c.state_bytes(_bf16()) for c in spec.caches)
    assert held == 16_777_216 + 460_800


def test_recurrentgemma_2b_parameters_equal_transformers_and_the_paper():
    """RecurrentGemma paper (Botev et al. 2024), table 1: 2.7B parameters, 2.0B of them outside the embedding."""
    import torch
    from transformers import AutoModelForCausalLM, RecurrentGemmaConfig

    spec = model_from_config(copy.deepcopy(RECURRENTGEMMA_2B), "recurrentgemma-2b", "test")
    _, fields, _ = profile_config.transformers_fields(copy.deepcopy(RECURRENTGEMMA_2B))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(RecurrentGemmaConfig(**fields))
    assert spec.params.total == sum(p.numel() for p in model.parameters())
    assert round(spec.params.total / 1e9, 1) == 2.7
    assert round((spec.params.total - spec.params.embedding) / 1e9, 1) == 2.0


def test_recurrentgemma_engines():
    spec = model_from_config(copy.deepcopy(RECURRENTGEMMA_2B), "recurrentgemma-2b", "test")
    with pytest.raises(KvplanError, match="vLLM has no recurrent_gemma model"):
        capacity(spec, Workload(ctx=8192), hardware=H100)
    # transformers holds the convolution's whole 4-input window once decoding runs (a view into the
    # concatenation): 18 x (2,560 x 4 x 2 + 2,560 x 4) + 8 x 1,024 x 2,048 after decoding to 8,192 tokens
    cap = capacity(spec, Workload(ctx=8192), engine_name="transformers", hardware=H100)
    assert cap.engine_kv_bytes_per_sequence_decode == 18 * (20_480 + 10_240) + 16_777_216


# ---------------------------------------------------------------------------------------------- bad input


def _e2b_text(**edits) -> dict:
    data = raw("google__gemma-4-E2B-it.json")
    data["text_config"].update(edits)
    return data


@pytest.mark.parametrize("data, field", [
    (_e2b_text(num_kv_shared_layers=36), "num_kv_shared_layers"),  # more shared layers than layers
    (_e2b_text(num_kv_shared_layers=35), "num_kv_shared_layers"),  # no unshared layer left to read
    (_e2b_text(layer_types=["sliding_attention"] * 34), "layer_types"),  # one short
    (_e2b_text(layer_types=["full_attention"] * 34 + ["mamba"]), "layer_types"),
    (_e2b_text(per_layer_config={"35": {"head_dim": 512}}), "per_layer_config"),  # no layer 35
    (_e2b_text(per_layer_config={"4": {"intermediate_size": 1}}), "per_layer_config"),  # not read per layer
    (_e2b_text(head_dim=None, per_layer_config={"4": {"head_dim": 512}}), "head_dim"),  # missing for layer 0
    ({"model_type": "gemma3n_text", "hidden_size": 128, "num_hidden_layers": 5, "num_attention_heads": 4,
      "intermediate_size": [64] * 4, "num_kv_shared_layers": 0}, "intermediate_size"),
    ({**RECURRENTGEMMA_2B, "block_types": ["recurrent", "mamba"]}, "block_types"),
    ({"model_type": "gemma4_assistant", "text_config": {
        "model_type": "gemma4_text", "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_kv_shared_layers": 2}}, "num_kv_shared_layers"),
])
def test_inconsistent_fields_are_refused_in_one_line(data, field):
    with pytest.raises(KvplanError) as err:
        model_from_config(data, "bad", "test")
    message = str(err.value)
    assert field in message and "\n" not in message


def _bf16():
    from kvplan.dtypes import kv_dtype

    return kv_dtype("bf16")
