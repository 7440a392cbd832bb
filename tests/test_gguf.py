"""GGUF files as a model source: kvplan's own header reader against llama.cpp's Python package (gguf-py: its
writer makes the files, its GGUFReader and block table are the outside figures), llama.cpp's cache layouts worked
by hand from the metadata, and kvplan's own config.json reading of the same models (checked against transformers
elsewhere) where llama.cpp and transformers cache alike."""

import json
import os
import random
import struct
import time
from pathlib import Path

import pytest
from conftest import SPECS, assert_one_line_error, load, run_cli, run_main
from gguf import GGML_QUANT_SIZES, GGUFReader
from ggufkit import (
    ARCH_LLAMA,
    LLAMA3_8B,
    Q,
    Typed,
    V,
    header_bytes,
    llama3_8b_q4_k_m,
    raw_header,
    raw_kv,
    raw_tensor,
    reader_bytes,
    reader_elements,
    tensor_nbytes,
    use_more_bits,
    write_gguf,
)
from hubkit import GOOD_TOKEN, FakeHub, Sparse, hub_environment, put_in_cache

from kvplan.dtypes import GGML_TYPES, kv_dtype
from kvplan.errors import KvplanError
from kvplan.sources import gguf, gguf_model, load_model

F16 = kv_dtype("fp16")
# A small Llama: 2 layers, hidden 256, 4 heads of 64, 2 KV heads, MLP 512, vocab 1024.
TINY = {".block_count": 2, ".context_length": 4096, ".embedding_length": 256, ".feed_forward_length": 512,
        ".attention.head_count": 4, ".attention.head_count_kv": 2, "general.file_type": 15}


def tiny_tensors(types=(Q.Q4_K, Q.Q6_K, Q.IQ4_XS, Q.IQ2_XXS, Q.Q8_0, Q.Q5_K)):
    q, v, o, gate, up, down = types
    out = [("token_embd.weight", [256, 1024], Q.Q4_K)]
    for i in range(2):
        out += [(f"blk.{i}.attn_norm.weight", [256], Q.F32), (f"blk.{i}.attn_q.weight", [256, 256], q),
                (f"blk.{i}.attn_k.weight", [256, 128], q), (f"blk.{i}.attn_v.weight", [256, 128], v),
                (f"blk.{i}.attn_output.weight", [256, 256], o), (f"blk.{i}.ffn_norm.weight", [256], Q.F32),
                (f"blk.{i}.ffn_gate.weight", [256, 512], gate), (f"blk.{i}.ffn_up.weight", [256, 512], up),
                (f"blk.{i}.ffn_down.weight", [512, 256], down)]
    return out + [("output_norm.weight", [256], Q.F32), ("output.weight", [256, 1024], Q.Q6_K)]


def estimate_json(monkeypatch, capsys, *args: str) -> dict:
    code, out, err = run_main(monkeypatch, capsys, "estimate", "--ctx", "8k", "--json", *args)
    assert code == 0, err
    return json.loads(out)


# ---------------------------------------------------------------------------------------------- bytes


def test_ggml_block_table_is_gguf_pys():
    """Every ggml type gguf-py knows has kvplan's name, elements per block and bytes per block, but two:
    Q2_0 (42), newer than gguf-py 0.19, is ggml-common.h's block_q2_0, an fp16 scale and 64 2-bit values (2 + 16
    bytes); Q8_1 (an intermediate type, in no model file) is 40 bytes in gguf-py 0.19 from when its scale and
    sum were fp32, 2 x fp16 + 32 = 36 in ggml-common.h and in llama.cpp's own gguf-py since."""
    for qtype, (block, size) in GGML_QUANT_SIZES.items():
        ours = GGML_TYPES[int(qtype)]
        if qtype != Q.Q8_1:
            assert (ours.name, ours.block_elements, ours.block_bytes) == (qtype.name, block, size)
    assert set(GGML_TYPES) - {int(q) for q in GGML_QUANT_SIZES} == {42}
    assert (GGML_TYPES[42].block_elements, GGML_TYPES[42].block_bytes) == (64, 2 + 64 * 2 // 8)
    assert GGML_QUANT_SIZES[Q.Q8_1] == (32, 4 + 4 + 32) and GGML_TYPES[9].block_bytes == 2 + 2 + 32


@pytest.mark.parametrize("types", [
    (Q.Q4_K, Q.Q6_K, Q.IQ4_XS, Q.IQ2_XXS, Q.Q8_0, Q.Q5_K),
    (Q.Q2_K, Q.Q3_K, Q.IQ3_XXS, Q.IQ3_S, Q.IQ2_XS, Q.IQ2_S),
    (Q.IQ1_S, Q.IQ1_M, Q.TQ1_0, Q.TQ2_0, Q.MXFP4, Q.IQ4_NL),
    (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.BF16, Q.F16),
])
def test_weights_are_the_tensor_bytes_gguf_reader_reports(tmp_path, monkeypatch, capsys, types):
    """K-quants, IQ types, ternary, MXFP4 and float tensors: kvplan's weights are the sum of the tensors' bytes
    as gguf-py's GGUFReader reports them (n_bytes), and its elements by type are the reader's."""
    path = write_gguf(tmp_path / "tiny.gguf", "llama", TINY, tiny_tensors(types))
    data = estimate_json(monkeypatch, capsys, "--model", str(path))
    assert data["weights_bytes"] == reader_bytes(path)
    assert data["weights_source"] == "checkpoint" and data["weights_dtype"] == "Q4_K_M"
    spec = load_model(str(path))
    assert spec.checkpoint.elements == reader_elements(path)
    assert spec.checkpoint.tensors == len(GGUFReader(str(path)).tensors) == 21


def test_llama_3_8b_q4_k_m(tmp_path, monkeypatch, capsys):
    """Llama-3-8B's metadata and 291 tensors typed by the Q4_K_M recipe (the file is sparse: the weights are a
    4.6 GiB hole). Weights = the sum of the tensors' bytes as GGUFReader reports them; 32 full-attention layers of
    8 KV heads x 128 (f16: 32 x 2 x 8 x 128 x 2 = 131,072 B per token, llama.cpp's default cache type); and the
    parameters by group are those kvplan reads from the model's own config.json (8,030,261,248 in all)."""
    path = write_gguf(tmp_path / "Meta-Llama-3-8B-Q4_K_M.gguf", "llama", LLAMA3_8B, llama3_8b_q4_k_m(), sparse=True)
    expected = reader_bytes(path)
    q6_layers = sum(use_more_bits(i, 32) for i in range(32))
    assert q6_layers == 16  # layers 0-3 and 28-31, and 6, 9, ..., 27 ((i - 4) % 3 == 2)
    assert expected == (tensor_nbytes([4096, 128256], Q.Q4_K) + tensor_nbytes([4096, 128256], Q.Q6_K)
                        + 32 * (tensor_nbytes([4096, 4096], Q.Q4_K) * 2 + tensor_nbytes([4096, 1024], Q.Q4_K)
                                + tensor_nbytes([4096, 14336], Q.Q4_K) * 2 + 2 * 4096 * 4)
                        + q6_layers * (tensor_nbytes([4096, 1024], Q.Q6_K) + tensor_nbytes([14336, 4096], Q.Q6_K))
                        + (32 - q6_layers) * (tensor_nbytes([4096, 1024], Q.Q4_K)
                                              + tensor_nbytes([14336, 4096], Q.Q4_K)) + 4096 * 4)
    data = estimate_json(monkeypatch, capsys, "--model", str(path))
    assert data["weights_bytes"] == expected
    assert data["kv_dtype"] == "fp16" and data["kv_bytes_per_token"] == 131_072
    spec = load_model(str(path))
    assert {c.kind for c in spec.caches} == {"full"} and len(spec.caches) == 32
    hf = load("meta-llama__Meta-Llama-3-8B.json")
    assert spec.params == hf.params and spec.params.total == 8_030_261_248
    assert spec.max_context == 8192 and spec.quantization.weights_dtype == "Q4_K_M"


def test_every_value_type_reads_as_gguf_reader_reads_it(tmp_path):
    """Scalars of all twelve GGUF types, strings, and arrays of each (short ones kept, long ones stepped over)
    read as GGUFReader reads them."""
    meta = {
        "t.u8": Typed(V.UINT8, 200), "t.i8": Typed(V.INT8, -5), "t.u16": Typed(V.UINT16, 60000),
        "t.i16": Typed(V.INT16, -30000), "t.u32": Typed(V.UINT32, 4_000_000_000), "t.i32": Typed(V.INT32, -7),
        "t.f32": Typed(V.FLOAT32, 0.5), "t.bool": Typed(V.BOOL, True), "t.str": "héllo",
        "t.u64": Typed(V.UINT64, 2**60), "t.i64": Typed(V.INT64, -(2**60)), "t.f64": Typed(V.FLOAT64, 1e300),
        "t.strs": ["a", "", "ccc"], "t.many": [f"token{i}" for i in range(5000)],
        "t.bools": [True, False, True], "t.long": Typed(V.ARRAY, list(range(10_000)), V.UINT32),
        **{f"t.arr_{k.name.lower()}": Typed(V.ARRAY, [1, 2, 3], k)
           for k in (V.UINT8, V.INT8, V.UINT16, V.INT16, V.UINT32, V.INT32, V.UINT64, V.INT64)},
        "t.floats": Typed(V.ARRAY, [0.25, 1.5], V.FLOAT64),
    }
    path = write_gguf(tmp_path / "types.gguf", "llama", meta, [("token_embd.weight", [32, 4], Q.F32)])
    header = gguf.read_file(path)
    ours = header.metadata
    theirs = {k: f for k, f in GGUFReader(str(path)).fields.items() if not k.startswith("GGUF.")}
    assert (header.version, len(ours), len(header.tensors)) == (3, len(theirs), 1)
    assert set(ours) == set(theirs)
    for key, field in theirs.items():
        value = ours[key]
        if value.element_type is None:
            expected = field.contents()
            assert value.value == pytest.approx(expected) if isinstance(expected, float) else value.value == expected
        else:
            items = field.contents()
            assert value.length == len(items)
            assert value.items is None if len(items) > gguf.KEPT_ARRAY else list(value.items) == items
    assert ours["t.many"].items is None and ours["t.long"].length == 10_000


# ---------------------------------------------------------------------------------------------- layouts


def layout(spec) -> list[tuple]:
    """What a layer caches and how wide, comparable across sources."""
    out = []
    for c in spec.caches:
        if c.kind in ("full", "sliding", "chunked"):
            out.append((c.layer, c.kind, c.kv_heads, c.head_dim, c.head_dim_v, getattr(c, "window", None)
                        or getattr(c, "chunk", None)))
        elif c.kind == "mla":
            out.append((c.layer, c.kind, c.latent_dim, c.rope_dim))
        elif c.kind == "recurrent":
            out.append((c.layer, c.kind, c.conv_elements, c.ssm_elements))
        elif c.kind == "shared":
            out.append((c.layer, c.kind, c.source))
        else:
            out.append((c.layer, c.kind))
    return out


def embd(n_embd: int, vocab: int = 32_768):
    """The token embeddings alone: enough weights (n_embd x 32,768) for the widths and states of the models the
    tests read from their headers, which kvplan bounds by the values a file's tensors hold."""
    return [("token_embd.weight", [n_embd, vocab], Q.Q8_0)]


def from_config(filename: str) -> dict:
    """A bundled config.json (its text_config for a multimodal one), whose values a converter writes."""
    data = json.loads((SPECS / filename).read_text(encoding="utf-8"))
    return data.get("text_config", data)


def config_meta(cfg: dict, context: int | None = None, **keys) -> dict:
    """The keys every llama.cpp converter writes from a config.json (TextModel.set_gguf_parameters), and more
    (`attention__key_length` for `<arch>.attention.key_length`)."""
    return {".block_count": cfg["num_hidden_layers"], ".context_length": context or cfg["max_position_embeddings"],
            ".embedding_length": cfg["hidden_size"], ".attention.head_count": cfg["num_attention_heads"],
            **{"." + k.replace("__", "."): v for k, v in keys.items()}}


def test_gemma_3_27b_slides_5_layers_in_6_as_transformers_does(tmp_path):
    """Gemma 3 27B as llama.cpp's converter writes it (Gemma3Model: sliding_window, key/value_length =
    head_dim, head_count_kv): llama.cpp's default pattern 6 makes layer il sliding unless il % 6 == 5, window
    1024, 16 KV heads of 128 - the layout kvplan reads from the model's config.json."""
    cfg = from_config("google__gemma-3-27b-it.json")
    meta = config_meta(cfg, 131072, attention__head_count_kv=cfg["num_key_value_heads"],
                       attention__key_length=cfg["head_dim"], attention__value_length=cfg["head_dim"],
                       attention__sliding_window=cfg["sliding_window"])
    spec = load_model(str(write_gguf(tmp_path / "g.gguf", "gemma3", meta, embd(cfg["hidden_size"]))))
    assert layout(spec) == layout(load("google__gemma-3-27b-it.json"))
    assert [c.layer for c in spec.caches if c.kind == "full"] == [5, 11, 17, 23, 29, 35, 41, 47, 53, 59]


def gpt_oss_gguf(tmp_path):
    """gpt-oss-20b as llama.cpp's converter writes it: its config.json's heads, window and experts as GGUF keys."""
    cfg = from_config("openai__gpt-oss-20b.json")
    meta = config_meta(cfg, attention__head_count_kv=cfg["num_key_value_heads"],
                       attention__key_length=cfg["head_dim"], attention__value_length=cfg["head_dim"],
                       attention__sliding_window=cfg["sliding_window"], expert_count=cfg["num_local_experts"],
                       expert_used_count=cfg["num_experts_per_tok"],
                       expert_feed_forward_length=cfg["intermediate_size"])
    return load_model(str(write_gguf(tmp_path / "oss.gguf", "gpt-oss", meta, embd(cfg["hidden_size"]))))


def test_gemma_2_and_gpt_oss_slide_every_other_layer_as_transformers_does(tmp_path):
    """Gemma 2 (window 4096) and gpt-oss (window 128, K and V of 64): llama.cpp's pattern 2 makes the even layers
    sliding, as their config.json layer types do."""
    cfg = from_config("google__gemma-2-9b.json")
    meta = config_meta(cfg, attention__head_count_kv=cfg["num_key_value_heads"],
                       attention__key_length=cfg["head_dim"], attention__value_length=cfg["head_dim"],
                       attention__sliding_window=cfg["sliding_window"])
    spec = load_model(str(write_gguf(tmp_path / "g2.gguf", "gemma2", meta, embd(cfg["hidden_size"]))))
    assert layout(spec) == layout(load("google__gemma-2-9b.json"))
    spec = gpt_oss_gguf(tmp_path)
    assert layout(spec) == layout(load("openai__gpt-oss-20b.json"))
    assert [c.kind for c in spec.caches[:3]] == ["sliding", "full", "sliding"] and spec.caches[0].window == 128


def test_a_gguf_is_planned_by_its_family_rules_under_llama_cpp(tmp_path):
    """gpt-oss-20b as its GGUF (architecture gpt-oss, model_type gpt_oss): llama.cpp keeps the 12 sliding layers at
    PAD(min(8,192, 128 + 512), 256) = 768 cells and the 12 full ones at 8,192, as for its config.json; 8 KV heads
    of 64 in f16 are 2,048 B a token a layer, so 12 x 2,048 x (768 + 8,192) B = 220,200,960 B a user."""
    from kvplan.capacity import Workload, capacity

    spec = gpt_oss_gguf(tmp_path)
    assert spec.architecture == "gpt_oss"
    for model in (spec, load("openai__gpt-oss-20b.json")):
        cap = capacity(model, Workload(ctx=8192), engine_name="llama.cpp", kv_budget=64 << 30)
        assert cap.engine_kv_bytes_per_sequence == 12 * 2048 * (768 + 8192)


@pytest.mark.parametrize("arch, keys, kinds", [
    ("gemma3", {".attention.sliding_window": 512, ".attention.sliding_window_pattern": 3}, "SSFSSFS"),
    ("gemma3", {".attention.sliding_window": 512,
                ".attention.sliding_window_pattern": [True, False, False, True]}, "SFFSFFF"),
    ("gemma3", {}, "FFFFFFF"),
    ("cohere2", {".attention.sliding_window": 512}, "SSSFSSS"),
    ("olmo2", {".attention.sliding_window": 0}, "FFFFFFF"),
    ("phi3", {".attention.sliding_window": 512}, "FFFFFFF"),
    ("llama", {".attention.sliding_window": 512}, "FFFFFFF"),
])
def test_sliding_window_patterns_as_llama_cpp_sets_them(tmp_path, arch, keys, kinds):
    """`set_swa_pattern(n)`: every n-th layer full, the others sliding; a bool array marks each layer (the layers
    past its end full); Gemma 3 without a window, OLMo 2 with a window of 0, Phi-3 (llama.cpp disables its window)
    and Llama (whose hyperparameters have no window) are all full. S sliding, F full, over 7 layers."""
    meta = {".block_count": 7, ".context_length": 4096, ".embedding_length": 256, ".attention.head_count": 4,
            ".attention.head_count_kv": 2, **keys}
    spec = load_model(str(write_gguf(tmp_path / "swa.gguf", arch, meta, embd(256))))
    assert "".join("S" if c.kind == "sliding" else "F" for c in spec.caches) == kinds
    assert all(c.window == 512 for c in spec.caches if c.kind == "sliding")


def ffn_tensors(cfg: dict, layers: list[tuple[int, int, int]], gated: bool = True, tied: bool = False) -> list:
    """token_embd (and output, unless tied) and each layer's feed-forward tensors as llama.cpp names and shapes
    them (ggml order), per layer (dense n_ff, shared-expert n_ff, routed experts): ffn_gate/up [n_embd, n_ff] and
    ffn_down [n_ff, n_embd]; ffn_*_shexp alike; ffn_gate_inp [n_embd, n_expert] and ffn_*_exps [.., n_expert] of
    expert_feed_forward_length. The forward widths are read from these."""
    h, vocab = cfg["hidden_size"], cfg["vocab_size"]
    experts, expert_ff = cfg.get("experts", 0), cfg.get("expert_ff", 0)
    out = [("token_embd.weight", [h, vocab], Q.Q8_0)] + ([] if tied else [("output.weight", [h, vocab], Q.Q8_0)])
    for i, (dense, shared, routed) in enumerate(layers):
        for suffix, ff in (("", dense), ("_shexp", shared)):
            if ff:
                out += [(f"blk.{i}.ffn_up{suffix}.weight", [h, ff], Q.Q8_0),
                        (f"blk.{i}.ffn_down{suffix}.weight", [ff, h], Q.Q8_0)]
                out += [(f"blk.{i}.ffn_gate{suffix}.weight", [h, ff], Q.Q8_0)] if gated else []
        if routed:
            out += [(f"blk.{i}.ffn_gate_inp.weight", [h, experts], Q.F32),
                    (f"blk.{i}.ffn_up_exps.weight", [h, expert_ff, experts], Q.Q8_0),
                    (f"blk.{i}.ffn_down_exps.weight", [expert_ff, h, experts], Q.Q8_0)]
            out += [(f"blk.{i}.ffn_gate_exps.weight", [h, expert_ff, experts], Q.Q8_0)] if gated else []
    return out


def gguf_twin(tmp_path, name: str):
    """A model's GGUF, written with its config.json's numbers as llama.cpp's converter writes them (the keys:
    conversion/*.py `set_gguf_parameters`) and its loader wants the tensors (their shapes)."""
    if name.startswith("meta-llama"):
        return write_gguf(tmp_path / "l.gguf", "llama", LLAMA3_8B, llama3_8b_q4_k_m(), sparse=True)
    cfg = from_config(name)
    arch, meta, layers, tied = TWINS[name.split("__")[1].removesuffix(".json")](cfg)
    tensors = ffn_tensors({"experts": meta.get(".expert_count", 0), **cfg}, layers, gated=arch != "nemotron_h",
                          tied=tied)
    if arch in QK_NORM_ARCHS:
        head_dim = meta.get(".attention.key_length") or cfg["hidden_size"] // cfg["num_attention_heads"]
        tensors += [(f"blk.{i}.attn_{x}_norm.weight", [head_dim], Q.F32) for i in range(len(layers)) for x in "qk"]
    return write_gguf(tmp_path / f"{arch}.gguf", arch, meta, tensors)


# llama.cpp's architectures whose layers load attn_q_norm and attn_k_norm (src/llama-model.cpp load_tensors)
QK_NORM_ARCHS = {"gemma3", "gemma3n", "gemma4", "qwen3moe"}


def heads(cfg: dict) -> dict:
    return {"attention__head_count_kv": cfg["num_key_value_heads"], "attention__key_length": cfg["head_dim"],
            "attention__value_length": cfg["head_dim"]}


def gemma3_twin(cfg):  # tied embeddings, a vocabulary of 262,208
    cfg["vocab_size"] = 262_208
    meta = config_meta(cfg, 131072, **heads(cfg), attention__sliding_window=cfg["sliding_window"])
    return "gemma3", meta, [(cfg["intermediate_size"], 0, 0)] * cfg["num_hidden_layers"], True


def qwen3moe_twin(cfg):  # every layer routed: 128 experts of 768, 8 a token
    cfg["expert_ff"] = cfg["moe_intermediate_size"]
    meta = config_meta(cfg, **heads(cfg), expert_count=128, expert_used_count=8)
    return "qwen3moe", meta, [(0, 0, 1)] * cfg["num_hidden_layers"], False


def gpt_oss_twin(cfg):  # 32 experts of 2,880, 4 a token, a window of 128 on every other layer
    cfg["expert_ff"] = cfg["intermediate_size"]
    meta = config_meta(cfg, **heads(cfg), attention__sliding_window=cfg["sliding_window"], expert_count=32,
                       expert_used_count=4)
    return "gpt-oss", meta, [(0, 0, 1)] * cfg["num_hidden_layers"], False


def jamba_twin(cfg):  # experts on odd layers (16 of 14,336, 2 a token); Mamba but on layers 4 of 8
    n, cfg["expert_ff"] = cfg["num_hidden_layers"], cfg["intermediate_size"]
    kv = [cfg["num_key_value_heads"] if i % 8 == 4 else 0 for i in range(n)]
    meta = config_meta(cfg, attention__head_count_kv=kv, ssm__conv_kernel=4, ssm__inner_size=2 * cfg["hidden_size"],
                       ssm__state_size=16, ssm__time_step_rank=256, expert_count=16, expert_used_count=2)
    return "jamba", meta, [(0, 0, 1) if i % 2 else (cfg["intermediate_size"], 0, 0) for i in range(n)], False


def mla_keys(cfg: dict) -> dict:
    """DeepseekV2Model / KimiLinearModel: MLA as MQA of one KV head of kv_lora_rank + rope, with the MLA head
    sizes."""
    rank, rope = cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
    return {"attention__kv_lora_rank": rank, "attention__key_length": rank + rope,
            "attention__key_length_mla": cfg["qk_nope_head_dim"] + rope,
            "attention__value_length_mla": cfg["v_head_dim"], "rope__dimension_count": rope}


def deepseek3_twin(cfg):  # 3 dense layers of 18,432, then a shared expert and 256 routed of 2,048, 8 a token
    n, cfg["expert_ff"], ff = cfg["num_hidden_layers"], cfg["moe_intermediate_size"], cfg["moe_intermediate_size"]
    meta = config_meta(cfg, **mla_keys(cfg), attention__head_count_kv=1, attention__value_length=cfg["kv_lora_rank"],
                       expert_count=256, expert_used_count=8, attention__q_lora_rank=cfg["q_lora_rank"],
                       expert_group_count=cfg["n_group"])
    return "deepseek2", meta, [(cfg["intermediate_size"], 0, 0)] * 3 + [(0, ff, 1)] * (n - 3), False


def gemma3n_twin(cfg):  # Gemma3NModel: a per-layer MLP width, the layer types as flags, shared_kv_layers
    meta = config_meta(cfg, **heads(cfg), attention__sliding_window=cfg["sliding_window"],
                       attention__sliding_window_pattern=[t == "sliding_attention" for t in cfg["layer_types"]],
                       attention__shared_kv_layers=cfg["num_kv_shared_layers"],
                       feed_forward_length=cfg["intermediate_size"])
    return "gemma3n", meta, [(ff, 0, 0) for ff in cfg["intermediate_size"]], False


def gemma4_twin(cfg):
    """Gemma4Model: key_length the full layers' head (global_head_dim), key_length_swa the sliding ones'; KV heads
    per layer where the full layers have their own count; MLPs twice as wide on KV-shared layers with
    use_double_wide_mlp."""
    n, shared, swa = cfg["num_hidden_layers"], cfg["num_kv_shared_layers"], cfg["layer_types"]
    ff = [cfg["intermediate_size"] * (2 if cfg["use_double_wide_mlp"] and i >= n - shared else 1) for i in range(n)]
    kv = [cfg["num_key_value_heads"] if t == "sliding_attention" else cfg["num_global_key_value_heads"]
          or cfg["num_key_value_heads"] for t in swa]
    meta = config_meta(cfg, attention__head_count_kv=kv, attention__key_length=cfg["global_head_dim"],
                       attention__value_length=cfg["global_head_dim"], attention__key_length_swa=cfg["head_dim"],
                       attention__value_length_swa=cfg["head_dim"], attention__sliding_window=cfg["sliding_window"],
                       attention__sliding_window_pattern=[t == "sliding_attention" for t in swa],
                       attention__shared_kv_layers=shared, feed_forward_length=ff,
                       embedding_length_per_layer_input=cfg["hidden_size_per_layer_input"] or 0)
    return "gemma4", meta, [(f, 0, 0) for f in ff], True


def kimi_linear_twin(cfg):
    """KimiLinearModel: KV heads 1 on the full_attn_layers (1-based) and 0 on the KDA layers, the MLA keys,
    ssm.conv_kernel and kda.head_dim; one dense layer of 9,216, then a shared expert and 256 of 1,024."""
    n, linear = cfg["num_hidden_layers"], cfg["linear_attn_config"]
    kv = [1 if i + 1 in linear["full_attn_layers"] else 0 for i in range(n)]
    cfg["expert_ff"] = ff = cfg["moe_intermediate_size"]
    meta = config_meta(cfg, cfg["model_max_length"], **mla_keys(cfg), attention__head_count_kv=kv, ssm__conv_kernel=4,
                       kda__head_dim=linear["head_dim"], expert_count=256, expert_used_count=8,
                       expert_shared_count=1, leading_dense_block_count=1)
    return "kimi-linear", meta, [(cfg["intermediate_size"], 0, 0)] + [(0, ff, 1)] * (n - 1), False


def minimax01_twin(cfg):  # MiniMaxText01Model: TextModel's keys alone; 32 experts of 9,216, 2 a token
    cfg["expert_ff"] = cfg["intermediate_size"]
    meta = config_meta(cfg, **heads(cfg), expert_count=32, expert_used_count=2, rope__dimension_count=64)
    return "minimax-01", meta, [(0, 0, 1)] * cfg["num_hidden_layers"], False


def nemotron_h_twin(cfg):  # NemotronHModel: KV heads on '*' layers, the MLP width on '-' layers (ReLU squared)
    pattern, ff = cfg["hybrid_override_pattern"], cfg["intermediate_size"]
    meta = config_meta(cfg, attention__head_count_kv=[8 if p == "*" else 0 for p in pattern],
                       feed_forward_length=[ff if p == "-" else 0 for p in pattern], attention__key_length=128,
                       attention__value_length=128, ssm__conv_kernel=4,
                       ssm__inner_size=cfg["mamba_num_heads"] * cfg["mamba_head_dim"], ssm__state_size=256,
                       ssm__group_count=8, ssm__time_step_rank=256)
    return "nemotron_h", meta, [(ff if p == "-" else 0, 0, 0) for p in pattern], False


TWINS = {"Nemotron-H-56B-Base-8K": nemotron_h_twin,
         "gemma-3-27b-it": gemma3_twin, "Qwen3-30B-A3B": qwen3moe_twin, "gpt-oss-20b": gpt_oss_twin,
         "Jamba-v0.1": jamba_twin, "DeepSeek-V3": deepseek3_twin, "gemma-3n-E2B": gemma3n_twin,
         "gemma-4-E2B-it": gemma4_twin, "gemma-4-31B-it": gemma4_twin,
         "Kimi-Linear-48B-A3B-Instruct": kimi_linear_twin, "MiniMax-M1-80k": minimax01_twin}
NEW_FAMILIES = ["google__gemma-3n-E2B.json", "google__gemma-4-E2B-it.json", "google__gemma-4-31B-it.json",
                "moonshotai__Kimi-Linear-48B-A3B-Instruct.json", "MiniMaxAI__MiniMax-M1-80k.json"]


@pytest.mark.parametrize("name", ["meta-llama__Meta-Llama-3-8B.json", "google__gemma-3-27b-it.json",
                                  "Qwen__Qwen3-30B-A3B.json", "openai__gpt-oss-20b.json",
                                  "ai21labs__Jamba-v0.1.json", "deepseek-ai__DeepSeek-V3.json",
                                  "nvidia__Nemotron-H-56B-Base-8K.json", *NEW_FAMILIES])
def test_a_gguf_and_its_config_give_the_same_compute_buffer(tmp_path, name):
    """The forward widths come from the GGUF's tensors (n_embd, the dense and shared-expert ffn_down, the routed
    ffn_down_exps, expert_used_count): llama.cpp's compute buffer for the GGUF is the one for the config.json, for
    dense, sliding, MoE, hybrid and MLA models, at one and at four users, with and without flash attention
    (Nemotron-H's ReLU-squared MLP blocks too, which its config.json gave no widths for before).
    Llama-3-8B at 8,192 tokens: 116 MiB, llama.cpp's own figure for the same shape (docs/accuracy.md), where a
    GGUF got a flat 0.5 GiB."""
    from kvplan.capacity import Workload, capacity
    from kvplan.engines import EngineOptions

    gguf_spec, config_spec = load_model(str(gguf_twin(tmp_path, name))), load(name)
    assert gguf_spec.widths == config_spec.widths
    for users, ctx, flash_attn in ((1, 8192, "auto"), (4, 4096, "off"), (1, 32768, "on")):
        buffers = [capacity(spec, Workload(ctx=ctx, users=users), engine_name="llama.cpp", kv_budget=1 << 40,
                            options=EngineOptions(flash_attn=flash_attn)).engine_activation_bytes_for_users
                   for spec in (gguf_spec, config_spec)]
        assert buffers[0] == buffers[1], (users, ctx, flash_attn)
    if name.startswith("meta-llama"):
        cap = capacity(gguf_spec, Workload(ctx=8192), engine_name="llama.cpp", kv_budget=1 << 40)
        assert round(cap.engine_activation_bytes_for_users / 2**20) == 116


@pytest.mark.parametrize("name", NEW_FAMILIES)
def test_gemma_4_gemma_3n_kimi_linear_minimax_01_cache_as_llama_cpp_allocates(tmp_path, name):
    """GGUFs of Gemma 3n, Gemma 4, Kimi Linear and MiniMax-01, written with the keys llama.cpp's converter writes
    (conversion/gemma.py, kimi_linear.py, minimax.py), read as llama.cpp's loader reads them (src/models/
    gemma3n.cpp, gemma4.cpp, kimi-linear.cpp, minimax-01.cpp; `create_memory`), and planned: each layer's cache
    is what kvplan reads from the model's config.json, which transformers confirms
    (tests/test_every_architecture.py). Gemma 3n E2B: 20 layers with KV (sliding 512, 2 KV heads of 256), the last
    10 reusing layers 18 and 19; Gemma 4 E2B: 15 with KV (sliding ones 1 KV head of 256, full ones of 512), 20
    reusing 13 and 14; Gemma 4 31B: full layers 4 KV heads of 512, sliding ones 16 of 256; Kimi Linear: MLA
    (512 + 64) on 7 layers, KDA elsewhere, 3 x (4 - 1) x 32 x 128 = 36,864 convolution and 128 x 128 x 32 =
    524,288 state values; MiniMax-01: lightning attention but on every 8th layer, 128 x 128 x 64 = 1,048,576
    values of state. Under llama.cpp's rules, 2 users of 8,192 tokens: the same cache bytes."""
    from kvplan.capacity import Workload, capacity

    spec, config_spec = load_model(str(gguf_twin(tmp_path, name))), load(name)
    assert layout(spec) == layout(config_spec) and spec.architecture == config_spec.architecture
    plans = [capacity(model, Workload(ctx=8192, users=2), engine_name="llama.cpp", kv_budget=1 << 40)
             for model in (spec, config_spec)]
    assert plans[0].engine_kv_bytes_for_users == plans[1].engine_kv_bytes_for_users > 0


def test_gemma_3n_keeps_the_first_20_layers_kv_as_llama_cpp_does(tmp_path):
    """llama.cpp sets n_layer_kv_from_start = 20 for every Gemma 3n (src/models/gemma3n.cpp), whatever
    attention.shared_kv_layers says: a 30-layer file that says 5 still caches 20 layers, the last 10 reusing
    layer 18 (sliding) or 19 (full); a 12-layer one caches all 12."""
    cfg = from_config("google__gemma-3n-E2B.json")
    _, meta, _, _ = gemma3n_twin(cfg)
    spec = load_model(str(write_gguf(tmp_path / "a.gguf", "gemma3n", {**meta, ".attention.shared_kv_layers": 5},
                                     embd(2048))))
    assert [c.kind for c in spec.caches].count("shared") == 10
    assert {c.source for c in spec.caches if c.kind == "shared"} == {18, 19}
    assert any("whatever its attention.shared_kv_layers (5)" in note for note in spec.notes)
    short = {**meta, ".block_count": 12, ".attention.sliding_window_pattern": [i % 5 < 4 for i in range(12)],
             ".feed_forward_length": [8192] * 12}
    spec = load_model(str(write_gguf(tmp_path / "b.gguf", "gemma3n", short, embd(2048))))
    assert "shared" not in {c.kind for c in spec.caches} and len(spec.caches) == 12


def test_gemma_4_needs_two_layers_of_its_own_kv(tmp_path, monkeypatch, capsys):
    """`create_memory` asserts n_layer_kv_from_start >= 2 for Gemma 4 (GGML_ASSERT): a file whose
    shared_kv_layers leaves fewer is refused in one line; its sliding_window_pattern is required (get_arr)."""
    cfg = from_config("google__gemma-4-E2B-it.json")
    _, meta, _, _ = gemma4_twin(cfg)
    for keys, fragment in (({".attention.shared_kv_layers": 34}, "shared_kv_layers is 34 of 35 layers"),
                           ({".attention.sliding_window_pattern": None}, "sliding_window_pattern is missing")):
        bad = {k: v for k, v in {**meta, **keys}.items() if v is not None}
        path = write_gguf(tmp_path / "bad.gguf", "gemma4", bad, embd(1536))
        code, _, err = run_main(monkeypatch, capsys, "show", "--model", str(path))
        assert_one_line_error(code, err, fragment)


def test_deepseek_v3_caches_the_mla_latent(tmp_path):
    """DeepSeek-V3 converted with the MLA keys (key_length 576 = kv_lora_rank 512 + rope 64, value_length 512,
    key_length_mla 192, value_length_mla 128, one KV head): llama.cpp caches one K row of 576 and no V (f16:
    1,152 B per layer per token), kvplan's MLA latent of 512 + 64 as from the config. Converted before the MLA
    keys existed (head_count_kv 128, key_length 192, value_length 128): every head's K and V, 128 x (192 + 128)
    x 2 = 81,920 B per layer per token."""
    cfg = from_config("deepseek-ai__DeepSeek-V3.json")
    rank, rope = cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
    base = config_meta(cfg, attention__kv_lora_rank=rank, attention__q_lora_rank=cfg["q_lora_rank"],
                       rope__dimension_count=rope)
    mla = {**base, ".attention.head_count_kv": 1, ".attention.key_length": rank + rope,
           ".attention.value_length": rank, ".attention.key_length_mla": cfg["qk_nope_head_dim"] + rope,
           ".attention.value_length_mla": cfg["v_head_dim"]}
    spec = load_model(str(write_gguf(tmp_path / "ds.gguf", "deepseek2", mla, embd(cfg["hidden_size"]))))
    assert layout(spec) == layout(load("deepseek-ai__DeepSeek-V3.json"))
    assert spec.caches[0].bytes_per_token(F16) == 1152
    legacy = {**base, ".attention.head_count_kv": 128, ".attention.key_length": 192, ".attention.value_length": 128}
    spec = load_model(str(write_gguf(tmp_path / "old.gguf", "deepseek2", legacy, embd(cfg["hidden_size"]))))
    assert {(c.kind, c.kv_heads, c.head_dim, c.head_dim_v) for c in spec.caches} == {("full", 128, 192, 128)}
    assert spec.caches[0].bytes_per_token(F16) == 81_920
    assert any("MLA latent" in note for note in spec.notes)


def test_jamba_mamba_where_no_kv_heads_as_transformers_does(tmp_path):
    """Jamba-v0.1 as llama.cpp's JambaModel converter writes it: head_count_kv 8 on layers i % 8 == 4 (attn offset 4,
    period 8) and 0 elsewhere, the Mamba layers. Mamba state: conv (4 - 1) x d_inner 8192 = 24,576, ssm d_state 16
    x 8192 = 131,072 values (f32 in llama.cpp) - as kvplan reads the config.json."""
    cfg = from_config("ai21labs__Jamba-v0.1.json")
    kv = [cfg["num_key_value_heads"] if i % 8 == 4 else 0 for i in range(cfg["num_hidden_layers"])]
    meta = config_meta(cfg, attention__head_count_kv=kv, ssm__conv_kernel=4, ssm__inner_size=2 * cfg["hidden_size"],
                       ssm__state_size=16, ssm__time_step_rank=256, expert_count=16, expert_used_count=2)
    spec = load_model(str(write_gguf(tmp_path / "j.gguf", "jamba", meta, embd(cfg["hidden_size"]))))
    assert layout(spec) == layout(load("ai21labs__Jamba-v0.1.json"))
    state = spec.caches[0]
    assert (state.conv_elements, state.ssm_elements, state.ssm_dtype, state.conv_dtype) == (24_576, 131_072, "fp32",
                                                                                            "fp32")


def test_lfm2_short_convolutions_and_qwen3_next_gated_deltanet_as_transformers_does(tmp_path):
    """LFM2-1.2B (LFM2Model converter: head_count_kv 0 on its conv layers, shortconv.l_cache 3): conv state
    2048 x (3 - 1) = 4,096 values; attention on full_attn_idxs with 8 KV heads of 2048 / 32 = 64.
    Qwen3-Next-80B (Qwen3NextModel: ssm.conv_kernel 4, state_size = key head dim 128, group_count = 16 key heads,
    time_step_rank = 32 value heads, inner_size 32 x 128 = 4096; full_attention_interval 4): Gated DeltaNet
    state conv (4 - 1) x (4096 + 2 x 16 x 128) = 24,576 and ssm 128 x 4096 = 524,288; attention on layers 3, 7,
    ..., 47 with 2 KV heads of 256."""
    cfg = from_config("LiquidAI__LFM2-1.2B.json")
    kv = [cfg["num_key_value_heads"] if i in cfg["full_attn_idxs"] else 0 for i in range(cfg["num_hidden_layers"])]
    meta = config_meta(cfg, attention__head_count_kv=kv, shortconv__l_cache=cfg["conv_L_cache"])
    spec = load_model(str(write_gguf(tmp_path / "lfm.gguf", "lfm2", meta, embd(cfg["hidden_size"]))))
    assert layout(spec) == layout(load("LiquidAI__LFM2-1.2B.json"))
    assert spec.caches[0].conv_elements == 4096
    cfg = from_config("Qwen__Qwen3-Next-80B-A3B-Thinking.json")
    meta = config_meta(cfg, attention__head_count_kv=2, attention__key_length=256, attention__value_length=256,
                       ssm__conv_kernel=4, ssm__state_size=128, ssm__group_count=16, ssm__time_step_rank=32,
                       ssm__inner_size=4096, full_attention_interval=4, expert_count=512, expert_used_count=10)
    spec = load_model(str(write_gguf(tmp_path / "next.gguf", "qwen3next", meta, embd(cfg["hidden_size"]))))
    assert layout(spec) == layout(load("Qwen__Qwen3-Next-80B-A3B-Thinking.json"))
    assert (spec.caches[0].conv_elements, spec.caches[0].ssm_elements) == (24_576, 524_288)
    assert [c.layer for c in spec.caches if c.kind == "full"] == list(range(3, 48, 4))


def test_nemotron_h_caches_mamba_and_attention_not_the_mlp_layers(tmp_path):
    """Nemotron-H-56B (NemotronHModel converter: head_count_kv 8 on '*' layers, feed_forward_length 32768 on '-'
    layers, 0 elsewhere): llama.cpp caches Mamba-2 state where both are 0 - conv (4 - 1) x (16384 + 2 x 8 x 256) =
    61,440, ssm 256 x 16384 = 4,194,304 - K and V where only the FFN length is 0, and nothing for the MLP layers,
    as kvplan reads the config.json."""
    cfg = from_config("nvidia__Nemotron-H-56B-Base-8K.json")
    pattern = cfg["hybrid_override_pattern"]
    inner = cfg["mamba_num_heads"] * cfg["mamba_head_dim"]
    meta = config_meta(cfg, attention__head_count_kv=[8 if p == "*" else 0 for p in pattern],
                       feed_forward_length=[32768 if p == "-" else 0 for p in pattern], attention__key_length=128,
                       attention__value_length=128, ssm__conv_kernel=4, ssm__inner_size=inner, ssm__state_size=256,
                       ssm__group_count=8, ssm__time_step_rank=256, attention__layer_norm_epsilon=1e-5)
    spec = load_model(str(write_gguf(tmp_path / "nh.gguf", "nemotron_h", meta, embd(cfg["hidden_size"]))))
    assert layout(spec) == layout(load("nvidia__Nemotron-H-56B-Base-8K.json"))
    assert (spec.caches[0].conv_elements, spec.caches[0].ssm_elements) == (61_440, 4_194_304)
    assert spec.caches[1].kind == "none" and spec.caches[0].heads == 256 and spec.caches[0].groups == 8


def test_mamba_and_falcon_h1_hold_a_state_per_layer(tmp_path):
    """Mamba-130m's numbers (MambaModel converter: d_inner 2 x 768, d_conv 4, d_state 16): conv 3 x 1536 = 4,608,
    ssm 16 x 1536 = 24,576 values in every layer, no attention. Falcon-H1: every layer both K/V and a Mamba-2
    state (here 2 heads of 64, inner 512, 1 group, state 16: conv 3 x (512 + 32) = 1,632, ssm 16 x 512)."""
    meta = {".block_count": 24, ".context_length": 2048, ".embedding_length": 768, ".ssm.conv_kernel": 4,
            ".ssm.inner_size": 1536, ".ssm.state_size": 16, ".ssm.time_step_rank": 48}
    spec = load_model(str(write_gguf(tmp_path / "m.gguf", "mamba", meta, embd(768))))
    assert {(c.kind, c.conv_elements, c.ssm_elements) for c in spec.caches} == {("recurrent", 4608, 24_576)}
    assert len(spec.caches) == 24 and spec.num_attention_heads == 0
    meta = {".block_count": 4, ".context_length": 16384, ".embedding_length": 256, ".attention.head_count": 4,
            ".attention.head_count_kv": 2, ".attention.key_length": 64, ".attention.value_length": 64,
            ".ssm.conv_kernel": 4, ".ssm.inner_size": 512, ".ssm.state_size": 16, ".ssm.group_count": 1,
            ".ssm.time_step_rank": 8}
    spec = load_model(str(write_gguf(tmp_path / "h1.gguf", "falcon-h1", meta, embd(256))))
    assert layout(spec)[:2] == [(0, "full", 2, 64, 64, None), (0, "recurrent", 1632, 8192)]
    assert len(spec.caches) == 8


def test_mamba2_and_granite_hybrid_state(tmp_path):
    """Mamba-2 with Granite 4.0-H-Tiny's mixer numbers (hidden 1536, inner 3072, state 128, 1 group, kernel 4, 48
    heads): conv 3 x (3072 + 2 x 1 x 128) = 9,984 values, ssm 128 x 3072 = 393,216, in every layer of a mamba2
    file, and in a granitehybrid file on the layers with no KV heads (attention, 4 KV heads of 1536 / 12 = 128,
    on the others)."""
    ssm = {".ssm.conv_kernel": 4, ".ssm.inner_size": 3072, ".ssm.state_size": 128, ".ssm.group_count": 1,
           ".ssm.time_step_rank": 48}
    meta = {".block_count": 4, ".context_length": 4096, ".embedding_length": 1536, **ssm}
    spec = load_model(str(write_gguf(tmp_path / "m2.gguf", "mamba2", meta, embd(1536))))
    assert {(c.kind, c.conv_elements, c.ssm_elements, c.heads, c.groups, c.state_size) for c in spec.caches} == \
        {("recurrent", 9984, 393_216, 48, 1, 128)}
    meta = {**meta, ".attention.head_count": 12, ".attention.head_count_kv": [0, 0, 4, 0]}
    spec = load_model(str(write_gguf(tmp_path / "gh.gguf", "granitehybrid", meta, embd(1536))))
    assert layout(spec) == [(0, "recurrent", 9984, 393_216), (1, "recurrent", 9984, 393_216),
                            (2, "full", 4, 128, 128, None), (3, "recurrent", 9984, 393_216)]


def test_llama4_chunks_3_layers_in_4_and_nextn_layers_get_no_cache(tmp_path):
    """Llama 4 in llama.cpp: chunked attention of 8192 on layers il % 4 < 3 (pattern 4), full on the rest.
    GLM-4.5 style nextn_predict_layers 1 of 3 blocks: the last block is loaded but not cached."""
    meta = {".block_count": 8, ".context_length": 10_485_760, ".embedding_length": 512, ".attention.head_count": 8,
            ".attention.head_count_kv": 2, ".expert_count": 16, ".expert_used_count": 1}
    spec = load_model(str(write_gguf(tmp_path / "l4.gguf", "llama4", meta, embd(512))))
    assert [c.kind for c in spec.caches] == ["chunked", "chunked", "chunked", "full"] * 2
    assert spec.caches[0].chunk == 8192
    meta = {".block_count": 3, ".context_length": 4096, ".embedding_length": 256, ".attention.head_count": 4,
            ".attention.head_count_kv": 2, ".nextn_predict_layers": 1}
    spec = load_model(str(write_gguf(tmp_path / "glm.gguf", "glm4moe", meta, embd(256))))
    assert [c.kind for c in spec.caches] == ["full", "full", "none"]
    assert any("NextN" in note for note in spec.notes)


def test_moe_parameters_from_the_expert_tensors(tmp_path):
    """Qwen3-30B-A3B's tensors as llama.cpp names them (ffn_*_exps [n_embd, n_ff_exp, 128] per layer, the router
    ffn_gate_inp): the parameters by group, total and active (8 of 128 experts), are those kvplan reads from the
    config.json."""
    cfg = from_config("Qwen__Qwen3-30B-A3B.json")
    h, e, ff, n, vocab = cfg["hidden_size"], cfg["num_experts"], cfg["moe_intermediate_size"], 48, cfg["vocab_size"]
    q, kv = cfg["num_attention_heads"] * cfg["head_dim"], cfg["num_key_value_heads"] * cfg["head_dim"]
    tensors = [("token_embd.weight", [h, vocab], Q.Q4_K), ("output.weight", [h, vocab], Q.Q6_K),
               ("output_norm.weight", [h], Q.F32)]
    for i in range(n):
        tensors += [(f"blk.{i}.attn_norm.weight", [h], Q.F32), (f"blk.{i}.attn_q.weight", [h, q], Q.Q4_K),
                    (f"blk.{i}.attn_k.weight", [h, kv], Q.Q4_K), (f"blk.{i}.attn_v.weight", [h, kv], Q.Q6_K),
                    (f"blk.{i}.attn_output.weight", [q, h], Q.Q4_K), (f"blk.{i}.attn_q_norm.weight", [128], Q.F32),
                    (f"blk.{i}.attn_k_norm.weight", [128], Q.F32), (f"blk.{i}.ffn_norm.weight", [h], Q.F32),
                    (f"blk.{i}.ffn_gate_inp.weight", [h, e], Q.F32),
                    (f"blk.{i}.ffn_gate_exps.weight", [h, ff, e], Q.Q4_K),
                    (f"blk.{i}.ffn_up_exps.weight", [h, ff, e], Q.Q4_K),
                    (f"blk.{i}.ffn_down_exps.weight", [ff, h, e], Q.Q6_K)]
    meta = {".block_count": n, ".context_length": 40960, ".embedding_length": h, ".attention.head_count": 32,
            ".attention.head_count_kv": 4, ".attention.key_length": 128, ".attention.value_length": 128,
            ".expert_count": e, ".expert_used_count": cfg["num_experts_per_tok"], ".expert_feed_forward_length": ff}
    path = write_gguf(tmp_path / "moe.gguf", "qwen3moe", meta, tensors, sparse=True)
    spec = load_model(str(path))
    assert spec.params == load("Qwen__Qwen3-30B-A3B.json").params
    assert spec.checkpoint.total == spec.params.total
    assert spec.params.active_experts == spec.params.experts * 8 // 128


def test_unmapped_architecture_is_refused_naming_it(tmp_path, monkeypatch, capsys):
    path = write_gguf(tmp_path / "bert.gguf", "bert", {".block_count": 2}, embd(64))
    code, _, err = run_main(monkeypatch, capsys, "show", "--model", str(path))
    assert_one_line_error(code, err, "general.architecture 'bert'", "bert.gguf")


@pytest.mark.parametrize("meta, fragment", [
    ({".context_length": 8, ".embedding_length": 64}, "llama.block_count is missing"),
    ({".block_count": 100_000, ".context_length": 8, ".embedding_length": 64}, "1 to 512"),
    ({**TINY, ".attention.head_count_kv": [2, 2, 2]}, "3 values for 2 layers"),
    ({**TINY, ".attention.head_count_kv": 0}, "layer 0 is an attention layer with 0 KV heads"),
    ({**TINY, ".block_count": 1.5}, "not a whole number"),
    ({**TINY, ".expert_used_count": 2}, "routes 2 experts of 0"),
])
def test_metadata_llama_cpp_would_refuse_is_one_line(tmp_path, monkeypatch, capsys, meta, fragment):
    path = write_gguf(tmp_path / "bad.gguf", "llama", meta, embd(256))
    code, _, err = run_main(monkeypatch, capsys, "estimate", "--model", str(path), "--ctx", "1k")
    assert_one_line_error(code, err, fragment, "bad.gguf")


SSM = {**TINY, ".attention.head_count": 0, ".ssm.conv_kernel": 4, ".ssm.inner_size": 512, ".ssm.state_size": 16,
       ".ssm.time_step_rank": 16}
LFM2 = {**TINY, ".attention.head_count_kv": [0, 2], ".shortconv.l_cache": 3}


@pytest.mark.parametrize("arch, meta, fragment", [
    # a short convolution of 0 taps: n_embd x (l_cache - 1) conv values, negative
    ("lfm2", {**LFM2, ".shortconv.l_cache": 0}, "lfm2.shortconv.l_cache is 0"),
    # Mamba widths of 0: a state of 0 bytes, which planned as "no user limit"
    ("mamba", {**SSM, ".ssm.inner_size": 0}, "mamba.ssm.inner_size is 0"),
    ("mamba", {**SSM, ".ssm.conv_kernel": 0, ".ssm.inner_size": 0, ".ssm.state_size": 0}, "ssm.conv_kernel is 0"),
    ("mamba2", {**SSM, ".ssm.group_count": 0}, "mamba2.ssm.group_count is 0"),
    # SSM widths of 2^32 - 1: 2^64 values of state per layer, 6.3e29 B a sequence
    ("mamba", {**SSM, ".ssm.conv_kernel": 2**32 - 1, ".ssm.inner_size": 2**32 - 1, ".ssm.state_size": 2**32 - 1,
               ".ssm.time_step_rank": 2**32 - 1}, "recurrent state is 36,893,488,125,944,266,755 values"),
    ("mamba", {**SSM, ".ssm.state_size": 2**20}, "more than the 8,388,608 weights"),
    ("llama", {**TINY, ".embedding_length": 2**32 - 1}, "embedding_length is 4,294,967,295 values"),
    ("llama", {**TINY, ".attention.key_length": 2**31}, "K and V row"),
    ("llama", {**TINY, ".feed_forward_length": 2**31}, "feed_forward_length is 2,147,483,648"),
    # every layer a NextN layer: llama.cpp caches them all (no trunk to filter them from), for an MTP draft
    ("glm4moe", {**TINY, ".nextn_predict_layers": 2}, "every layer: the file is a NextN/MTP draft head"),
])
def test_header_sizes_no_file_holds_are_one_line(tmp_path, monkeypatch, capsys, arch, meta, fragment):
    """Widths a GGUF header gives that no model has: each refused in one line, not planned (a negative or zero
    state, 10^29 bytes of it), the widths and states bounded by the weights the file's tensors hold (here the
    token embeddings of 256 x 32,768)."""
    path = write_gguf(tmp_path / "bad.gguf", arch, meta, embd(256))
    code, _, err = run_main(monkeypatch, capsys, "estimate", "--model", str(path), "--ctx", "1k", "--gpu", "h100",
                            "--engine", "llama.cpp")
    assert_one_line_error(code, err, fragment, "bad.gguf")


def test_sizes_a_file_holds_plan_as_before(tmp_path):
    """The bounds leave real shapes be: the same small Mamba, LFM2 and NextN model plan (a state of (4 - 1) x 512
    conv and 16 x 512 SSM values; LFM2 256 x (3 - 1) conv values; one NextN layer of two uncached)."""
    spec = load_model(str(write_gguf(tmp_path / "m.gguf", "mamba", SSM, embd(256))))
    assert (spec.caches[0].conv_elements, spec.caches[0].ssm_elements) == (3 * 512, 16 * 512)
    spec = load_model(str(write_gguf(tmp_path / "l.gguf", "lfm2", LFM2, embd(256))))
    assert [c.kind for c in spec.caches] == ["recurrent", "full"] and spec.caches[0].conv_elements == 512
    spec = load_model(str(write_gguf(tmp_path / "n.gguf", "glm4moe", {**TINY, ".nextn_predict_layers": 1},
                                     embd(256))))
    assert [c.kind for c in spec.caches] == ["full", "none"]


def test_a_fifo_named_gguf_is_refused_not_read(tmp_path):
    """A named pipe as --model, --lora or --draft-model: opening it to read blocks until a writer comes, so it is
    checked first (as config.json and YAML files are) and refused in one line, in a fresh interpreter under a
    time limit (a hang fails the test)."""
    model = write_gguf(tmp_path / "tiny.gguf", "llama", TINY, tiny_tensors())
    fifo = tmp_path / "pipe.gguf"
    os.mkfifo(fifo)
    for flags in (["--model", str(fifo)], ["--model", str(model), "--lora", str(fifo)],
                  ["--model", str(model), "--draft-model", str(fifo)]):
        result = run_cli("estimate", *flags, "--ctx", "1k", "--engine", "llama.cpp", "--gpu", "h100", timeout=30)
        assert_one_line_error(result.returncode, result.stderr, "pipe.gguf: not a regular file")


def test_a_vocabulary_only_file_is_refused(tmp_path, monkeypatch, capsys):
    path = write_gguf(tmp_path / "vocab.gguf", "llama", TINY, [])
    code, _, err = run_main(monkeypatch, capsys, "show", "--model", str(path))
    assert_one_line_error(code, err, "no tensors")


# ---------------------------------------------------------------------------------------------- split files


def write_split(directory: Path) -> list[Path]:
    """The tiny model split in 3 parts by gguf-py's writer (split_max_tensors 8), as llama.cpp names them."""
    import numpy as np
    from gguf import GGUFWriter

    writer = GGUFWriter(str(directory / "tiny.gguf"), "llama", split_max_tensors=8)
    for key, value in TINY.items():
        writer.add_uint32("llama" + key if key.startswith(".") else key, value)
    for name, shape, qtype in tiny_tensors():
        block, size = GGML_QUANT_SIZES[qtype]
        writer.add_tensor(name, np.zeros((*reversed(shape[1:]), shape[0] // block * size), np.uint8), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    parts = sorted(directory.glob("tiny-*-of-00003.gguf"))
    assert [p.name for p in parts] == [f"tiny-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    return parts


def test_a_split_model_counts_every_part(tmp_path, monkeypatch, capsys):
    """Naming any part of a split model reads all three; the weights are the tensors of all of them."""
    parts = write_split(tmp_path)
    total = sum(reader_bytes(p) for p in parts)
    for part in parts:
        data = estimate_json(monkeypatch, capsys, "--model", str(part))
        assert data["weights_bytes"] == total
    assert load_model(str(parts[1])).checkpoint.files == 3
    parts[2].unlink()
    code, _, err = run_main(monkeypatch, capsys, "show", "--model", str(parts[0]))
    assert_one_line_error(code, err, "tiny-00003-of-00003.gguf", "not beside it")


def test_a_split_model_on_the_hub(monkeypatch, tmp_path, capsys):
    """A split model in a folder of its repo (Q4_K_M/tiny-0000N-of-00003.gguf): the tag picks its first part and
    the header of each part is read."""
    parts = write_split(tmp_path)
    hub = FakeHub()
    hub.add("org/tiny-GGUF", {f"Q4_K_M/{p.name}": p.read_bytes() for p in parts})
    hub_environment(monkeypatch, tmp_path / "hf", endpoint=hub.url)
    try:
        data = estimate_json(monkeypatch, capsys, "--model", "org/tiny-GGUF:Q4_K_M")
        assert data["weights_bytes"] == sum(reader_bytes(p) for p in parts)
        assert data["model"] == "org/tiny-GGUF:Q4_K_M/tiny-00001-of-00003.gguf"
    finally:
        hub.close()


# ---------------------------------------------------------------------------------------------- hostile files


def raw_file(tmp_path, data: bytes, name: str = "bad.gguf") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


HOSTILE = {
    "empty": (b"", "cut short"),
    "not gguf": (b"GGML" + bytes(40), "not a GGUF file"),
    "version 1": (raw_header(0, 0, version=1), "version 1"),
    "big-endian": (b"GGUF" + struct.pack(">IQQ", 3, 0, 0), "big-endian"),
    "absurd kv count": (raw_header(0, 2**63), "cannot fit"),
    "absurd tensor count": (raw_header(2**40, 1) + ARCH_LLAMA, "cannot fit"),
    "key longer than the file": (raw_header(0, 1) + struct.pack("<Q", 2**40) + b"k", "runs past the end"),
    "string longer than the file": (raw_header(0, 1) + raw_kv("general.name", 8, struct.pack("<Q", 2**62)),
                                    "runs past the end"),
    "huge array": (raw_header(0, 1) + raw_kv("x", 9, struct.pack("<IQ", 4, 2**61)), "runs past the end"),
    "huge string array": (raw_header(0, 1) + raw_kv("x", 9, struct.pack("<IQ", 8, 2**50)), "more than the file"),
    "array of arrays": (raw_header(0, 1) + raw_kv("x", 9, struct.pack("<IQIQ", 9, 1, 9, 2**40)),
                        "array of arrays"),
    "unknown value type": (raw_header(0, 1) + raw_kv("x", 13, b"\0" * 8), "not one GGUF defines"),
    "duplicate key": (raw_header(0, 2) + ARCH_LLAMA + ARCH_LLAMA, "appears twice"),
    "empty key": (raw_header(0, 1) + raw_kv("", 4, b"\0" * 4), "empty key"),
    "bad alignment": (raw_header(0, 1) + raw_kv("general.alignment", 4, struct.pack("<I", 48)), "power of 2"),
    "five dimensions": (raw_header(1, 1) + ARCH_LLAMA + raw_tensor("t", [1] * 5, 0), "5 dimensions"),
    "2^64 elements": (raw_header(1, 1) + ARCH_LLAMA + raw_tensor("t", [2**32, 2**32], 0), "past 2^63"),
    "removed type": (raw_header(1, 1) + ARCH_LLAMA + raw_tensor("t", [32], 31), "Q4_0_4_4, removed"),
    "unknown type": (raw_header(1, 1) + ARCH_LLAMA + raw_tensor("t", [32], 99), "type 99"),
    "partial blocks": (raw_header(1, 1) + ARCH_LLAMA + raw_tensor("t", [100], int(Q.Q4_K)), "not whole blocks"),
    "long name": (raw_header(1, 1) + ARCH_LLAMA + raw_tensor("t" * 64, [32], 0), "allows 63"),
    "duplicate tensor": (raw_header(2, 1) + ARCH_LLAMA + raw_tensor("t", [8], 0) + raw_tensor("t", [8], 0, 32),
                         "appears twice"),
    "offsets out of order": (raw_header(1, 1) + ARCH_LLAMA + raw_tensor("t", [8], 0, 64), "starts at offset 64"),
    "data missing": (raw_header(1, 1) + ARCH_LLAMA + raw_tensor("t", [1024], 0), "cut short (a partial download"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_or_damaged_file_is_one_line_quickly(tmp_path, monkeypatch, capsys, case):
    data, fragment = HOSTILE[case]
    path = raw_file(tmp_path, data)
    start = time.monotonic()
    code, _, err = run_main(monkeypatch, capsys, "estimate", "--model", str(path), "--ctx", "1k")
    assert time.monotonic() - start < 5
    assert_one_line_error(code, err, fragment, "bad.gguf")


def test_a_header_past_64_mib_is_refused_without_reading_on(tmp_path, monkeypatch, capsys):
    """A string of 70 MiB in a 100 MiB file (a hole): past the header cap, refused after reading at most the cap."""
    path = raw_file(tmp_path, raw_header(0, 1) + raw_kv("general.name", 8, struct.pack("<Q", 70 * 2**20)))
    os.truncate(path, 100 * 2**20)
    reads = []
    original = gguf.read_header

    def counting(read_at, size, where):
        return original(lambda offset, length: reads.append(length) or read_at(offset, length), size, where)

    monkeypatch.setattr(gguf, "read_header", counting)
    code, _, err = run_main(monkeypatch, capsys, "show", "--model", str(path))
    assert_one_line_error(code, err, "larger than 64 MiB")
    assert sum(reads) <= 64 * 2**20


def test_every_cut_and_byte_flip_of_a_file_is_a_spec_or_one_error(tmp_path):
    """The tiny model cut at every 5th byte of its header, and 400 random bytes of its header changed: each
    reads as a model or fails with kvplan's one error, never another exception (in-process, so it is fast)."""
    path = write_gguf(tmp_path / "tiny.gguf", "llama", TINY, tiny_tensors())
    data = path.read_bytes()
    end = GGUFReader(str(path)).data_offset
    damaged = tmp_path / "damaged.gguf"
    rng = random.Random(0)
    cases = [data[:cut] for cut in range(0, end, 5)]
    for _ in range(400):
        flipped = bytearray(data)
        flipped[rng.randrange(end)] = rng.randrange(256)
        cases.append(bytes(flipped))
    outcomes = {"spec": 0, "error": 0}
    for case in cases:
        damaged.write_bytes(case)
        try:
            gguf_model.load_file(damaged)
            outcomes["spec"] += 1
        except KvplanError as err:
            assert "\n" not in str(err)
            outcomes["error"] += 1
    assert outcomes["error"] >= len(range(0, end, 5)) and outcomes["spec"] > 0


# ---------------------------------------------------------------------------------------------- the Hub


@pytest.fixture(scope="module")
def llama_gguf_files(tmp_path_factory):
    """Llama-3-8B at Q4_K_M with a 128,256-token vocabulary (a header of ~2.4 MiB, so reading it takes several
    range requests) and at Q8_0; their headers, and their tensor bytes as GGUFReader reports them (read from
    vocabulary-less twins: the tensors are the same, and gguf-py reads big string arrays slowly)."""
    root = tmp_path_factory.mktemp("llama-gguf")
    tokens = {"tokenizer.ggml.tokens": [f"token-{i}" for i in range(128_256)]}
    q4_tensors = llama3_8b_q4_k_m()
    q8_tensors = [(n, s, Q.Q8_0 if len(s) > 1 else Q.F32) for n, s, _ in q4_tensors]
    q4 = write_gguf(root / "q4.gguf", "llama", {**LLAMA3_8B, **tokens}, q4_tensors, sparse=True)
    q8 = write_gguf(root / "q8.gguf", "llama", {**LLAMA3_8B, "general.file_type": 7}, q8_tensors, sparse=True)
    twin = write_gguf(root / "twin.gguf", "llama", LLAMA3_8B, q4_tensors, sparse=True)
    return {"Meta-Llama-3-8B-Q4_K_M.gguf": Sparse(header_bytes(q4, q4_tensors), q4.stat().st_size),
            "Meta-Llama-3-8B-Q8_0.gguf": Sparse(header_bytes(q8, q8_tensors), q8.stat().st_size),
            "mmproj-Meta-Llama-3-8B-Q4_K_M.gguf": b"not read", "README.md": b"# GGUF\n"}, \
        {"Q4_K_M": reader_bytes(twin), "Q8_0": reader_bytes(q8), "header": len(header_bytes(q4, q4_tensors))}


@pytest.fixture
def gguf_hub(monkeypatch, tmp_path, llama_gguf_files):
    """A loopback Hub holding org/Llama-3-8B-GGUF: the two GGUF files of several GB whose headers alone exist, a
    README and a multimodal projector."""
    files, expected = llama_gguf_files
    hub = FakeHub()
    hub.add("org/Llama-3-8B-GGUF", files)
    hub_environment(monkeypatch, tmp_path / "hf", endpoint=hub.url)
    yield hub, expected
    hub.close()


def served_bytes(hub: FakeHub) -> int:
    """Bytes the CDN was asked for by range requests."""
    total = 0
    for _, path, wanted, _ in hub.requests:
        if wanted and path.startswith("/cdn/"):
            start, _, end = wanted.removeprefix("bytes=").partition("-")
            total += int(end) - int(start) + 1
    return total


def test_hub_gguf_by_quant_tag_reads_only_the_header(gguf_hub, monkeypatch, capsys):
    """`org/name:Q4_K_M` picks the one file carrying the tag (not the mmproj); weights = the tensors' bytes as
    GGUFReader reports them; the server is asked for a few MiB by range requests (the header is ~1.5 MiB of
    vocabulary), not the 4.6 GiB file."""
    hub, expected = gguf_hub
    data = estimate_json(monkeypatch, capsys, "--model", "org/Llama-3-8B-GGUF:q4_k_m")
    assert data["weights_bytes"] == expected["Q4_K_M"] and data["weights_dtype"] == "Q4_K_M"
    assert data["model"] == "org/Llama-3-8B-GGUF:Meta-Llama-3-8B-Q4_K_M.gguf"
    gets = [(path, wanted) for method, path, wanted, _ in hub.requests
            if method == "GET" and (path.endswith(".gguf") or path.startswith("/cdn/"))]
    assert all(wanted for _, wanted in gets)  # every GET of the file is a range request
    assert sum(path.startswith("/cdn/") for path, _ in gets) >= 2  # the header grew past the first read
    assert expected["header"] < served_bytes(hub) <= 4 * expected["header"] + 2**20


def test_hub_gguf_by_file_name(gguf_hub, monkeypatch, capsys):
    hub, expected = gguf_hub
    data = estimate_json(monkeypatch, capsys, "--model", "org/Llama-3-8B-GGUF", "--gguf-file",
                         "Meta-Llama-3-8B-Q8_0.gguf")
    assert data["weights_bytes"] == expected["Q8_0"] and data["weights_dtype"] == "Q8_0"
    data = estimate_json(monkeypatch, capsys, "--model", "org/Llama-3-8B-GGUF:Meta-Llama-3-8B-Q8_0.gguf")
    assert data["weights_bytes"] == expected["Q8_0"]


@pytest.mark.parametrize("args, fragments", [
    (["--model", "org/Llama-3-8B-GGUF:Q5_K_M"], ["no GGUF file", "Meta-Llama-3-8B-Q8_0.gguf"]),
    (["--model", "org/Llama-3-8B-GGUF:Meta-Llama-3-8B"], ["several GGUF files", "--gguf-file"]),
    (["--model", "org/Llama-3-8B-GGUF", "--gguf-file", "other.gguf"], ["has no file 'other.gguf'"]),
    (["--model", "org/Llama-3-8B-GGUF:Q8_0", "--gguf-file", "x.gguf"], ["leave --gguf-file out"]),
    (["--model", "org/Llama-3-8B-GGUF"], ["no config.json but GGUF files", ":TAG"]),
    (["--model", "llama-3-8b", "--gguf-file", "x.gguf"], ["for Hub repos"]),
])
def test_hub_gguf_choices_kvplan_cannot_make_are_one_line(gguf_hub, monkeypatch, capsys, args, fragments):
    code, _, err = run_main(monkeypatch, capsys, "show", *args)
    assert_one_line_error(code, err, *fragments)


def test_hub_gguf_in_the_cache_is_read_offline(monkeypatch, tmp_path, capsys):
    """A GGUF already in the Hugging Face cache (hf download) is read there with HF_HUB_OFFLINE: no request."""
    hub = FakeHub()
    path = write_gguf(tmp_path / "tiny.gguf", "llama", TINY, tiny_tensors())
    put_in_cache(tmp_path / "hf" / "hub", "org/tiny-GGUF", "a" * 40, {"tiny-Q4_K_M.gguf": path.read_bytes()})
    hub_environment(monkeypatch, tmp_path / "hf", endpoint=hub.url, offline=True)
    try:
        data = estimate_json(monkeypatch, capsys, "--model", "org/tiny-GGUF", "--gguf-file", "tiny-Q4_K_M.gguf")
        assert data["weights_bytes"] == reader_bytes(path) and not hub.requests
        code, _, err = run_main(monkeypatch, capsys, "show", "--model", "org/tiny-GGUF:Q4_K_M")
        assert_one_line_error(code, err, "HF_HUB_OFFLINE", "--gguf-file")
    finally:
        hub.close()


def test_a_gated_gguf_repo_wants_a_token(monkeypatch, tmp_path, capsys):
    hub = FakeHub()
    path = write_gguf(tmp_path / "tiny.gguf", "llama", TINY, tiny_tensors())
    hub.add("org/gated-GGUF", {"tiny-Q4_K_M.gguf": path.read_bytes()}, gated=True)
    hub_environment(monkeypatch, tmp_path / "hf", endpoint=hub.url)
    try:
        code, _, err = run_main(monkeypatch, capsys, "show", "--model", "org/gated-GGUF:Q4_K_M")
        assert_one_line_error(code, err, "gated")
        data = estimate_json(monkeypatch, capsys, "--model", "org/gated-GGUF:Q4_K_M", "--token", GOOD_TOKEN)
        assert data["weights_bytes"] == reader_bytes(path)
    finally:
        hub.close()


# ---------------------------------------------------------------------------------------------- planning


def test_a_gguf_plans_for_llama_cpp_unless_told(tmp_path, monkeypatch, capsys):
    """With a GPU and no --engine, a GGUF is planned with llama.cpp's rules (f16 cache, its pool); --engine still
    chooses."""
    path = write_gguf(tmp_path / "tiny.gguf", "llama", TINY, tiny_tensors())
    data = estimate_json(monkeypatch, capsys, "--model", str(path), "--gpu", "rtx-4090")
    assert data["engine"] == "llama.cpp" and data["kv_dtype"] == "fp16"
    data = estimate_json(monkeypatch, capsys, "--model", str(path), "--gpu", "rtx-4090", "--engine", "vllm")
    assert data["engine"] == "vllm"
    code, out, err = run_main(monkeypatch, capsys, "plan", "--model", str(path), "--ctx", "8k", "--users", "4",
                              "--gpu", "rtx-4090", "--json")
    assert code == 0, err
    assert json.loads(out)["engine"] == "llama.cpp"


def test_show_and_table_name_the_file_type(tmp_path, monkeypatch, capsys):
    path = write_gguf(tmp_path / "tiny.gguf", "llama", TINY, tiny_tensors())
    code, out, err = run_main(monkeypatch, capsys, "show", "--model", str(path))
    assert code == 0, err
    assert "weights Q4_K_M (gguf)" in out and "gguf:" in out
    code, out, err = run_main(monkeypatch, capsys, "table", "--models", str(path), "--ctx", "4k", "--format", "csv")
    assert code == 0, err
    assert "Q4_K_M" in out


def test_profile_does_not_take_a_gguf(tmp_path, monkeypatch, capsys):
    """profile builds with transformers from a config.json: a GGUF file is refused before anything is built."""
    path = write_gguf(tmp_path / "tiny.gguf", "llama", TINY, tiny_tensors())
    code, _, err = run_main(monkeypatch, capsys, "profile", "--model", str(path), "--ctx", "1k", "--device", "cpu")
    assert_one_line_error(code, err, "not from a GGUF file")


# ---------------------------------------------------------------------------------------------- real files


REAL = os.environ.get("KVPLAN_REAL_GGUF_DIR")


@pytest.mark.skipif(not REAL, reason="KVPLAN_REAL_GGUF_DIR names no directory of real GGUF files")
def test_real_gguf_files_read_as_gguf_reader_reads_them():
    """Real files from llama.cpp's converter (e.g. the vocabulary GGUFs llama.cpp ships in models/): every key,
    its type and value (or array length), and every tensor, as GGUFReader reads them."""
    paths = sorted(Path(REAL).glob("*.gguf"))
    assert paths
    for path in paths:
        header = gguf.read_file(path)
        reader = GGUFReader(str(path))
        fields = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}
        assert set(header.metadata) == set(fields), path
        for key, field in fields.items():
            value = header.metadata[key]
            if value.element_type is None:
                expected = field.contents()
                assert value.value == pytest.approx(expected) if isinstance(expected, float) \
                    else value.value == expected, (path, key)
            else:
                assert value.length == len(field.data), (path, key)
        assert [(t.name, t.nbytes) for t in header.tensors] == [(t.name, int(t.n_bytes)) for t in reader.tensors]
