"""What tensor parallelism cannot split: the parameter groups every TP rank holds whole (`attention_replicated`,
`other_replicated`), counted from configs, checked against transformers' own modules, and the weights per GPU
they make under each engine, worked by hand from the engines' sharding (docs/engines.md, "Parallelism")."""

import re

import pytest
from conftest import GiB, raw

from kvplan.capacity import Hardware, Parallelism, Workload, capacity, weights_on_gpu
from kvplan.engines import EngineOptions, engine
from kvplan.memory import weights_by_group
from kvplan.model import REPLICATED_GROUPS
from kvplan.profiler import config as profile_config
from kvplan.sources import load_model
from kvplan.sources.hf_config import model_from_config

H200 = Hardware(name="NVIDIA H200", memory_bytes=150_754_820_096)  # nvidia-smi: 143,771 MiB
DSV3 = "deepseek-ai/DeepSeek-V3"


def test_deepseek_v3_groups_by_hand():
    """DeepSeek-V3 (config.json: hidden 7,168, 61 layers, q_lora_rank 1,536, kv_lora_rank 512, rope 64, 128 heads of
    128 + 64 and v 128; 58 MoE layers of 256 experts). vLLM 0.33.0 `models/deepseek_v2.py`:
        fused_qkv_a_proj (q_a 7,168 x 1,536 and kv_a_proj_with_mqa 7,168 x 576, MergedColumnParallelLinear with
        disable_tp): 61 x 7,168 x 2,112 = 923,467,776 whole on every rank, fp8 like the other linear layers;
        q_a_layernorm 1,536, kv_a_layernorm 512, two norms of 7,168 a layer, the final norm (RMSNorm), and the
        routers (GateLinear: 256 x 7,168 and 256 correction biases on 58 layers): 107,451,904 whole, bf16;
        q_b_proj, kv_b_proj (ColumnParallelLinear) and o_proj (RowParallelLinear) split by head."""
    params = load_model(DSV3).params
    assert params.attention_replicated == 61 * 7_168 * (1_536 + 512 + 64) == 923_467_776
    assert params.attention == 61 * (1_536 * 128 * 192 + 512 * 128 * 256 + 128 * 128 * 7_168) == 10_489_954_304
    assert params.other_replicated == 58 * (256 * 7_168 + 256) + 61 * (2 * 7_168 + 1_536 + 512) + 7_168 \
        == 107_451_904
    assert params.other == 0
    groups, label = weights_by_group(load_model(DSV3))
    assert label == "fp8"
    assert groups["attention_replicated"] == 923_467_776  # 1 B a parameter
    assert groups["other_replicated"] == 2 * 107_451_904  # bf16


@pytest.mark.parametrize("engine_name", ["vllm", "sglang"])
def test_deepseek_v3_tp8_weights_per_gpu(engine_name):
    """TP 8: 923,467,776 B of fp8 down-projections and 214,903,808 B of bf16 norms and routers on every GPU, the
    other 671,848,857,600 B over 8 (SGLang's `models/deepseek_v2.py` builds them the same way:
    fused_qkv_a_proj_with_mqa a ReplicatedLinear, MoEGate, RMSNorm):
        1,138,371,584 + 83,981,107,200 = 85,119,478,784 B a GPU (79.27 GiB), 996,075,136 B (0.93 GiB) more than
        672,987,229,184 / 8. The same at TP 8 x PP 2: (1,138,371,584 + 671,848,857,600 / 8) / 2 on the fullest
        stage's GPU."""
    model = load_model(DSV3)
    label, per_gpu, *_ = weights_on_gpu(model, engine(engine_name, EngineOptions(), tp=8), None)
    assert label == "fp8" and per_gpu == 1_138_371_584 + 671_848_857_600 // 8 == 85_119_478_784
    assert per_gpu - 672_987_229_184 // 8 == 996_075_136
    staged = weights_on_gpu(model, engine(engine_name, EngineOptions(), tp=8, pp=2), None).per_gpu
    assert staged == (1_138_371_584 + 671_848_857_600 // 8) // 2


def test_dense_llama_moves_only_its_norms():
    """Llama-3-70B (bf16, 80 layers of hidden 8,192) has no MLA and no router: only its norms, 80 x 2 x 8,192 +
    8,192 = 1,318,912 parameters (2,637,824 B), stay whole. At TP 8: 2,637,824 + (141,107,412,992 - 2,637,824) / 8
    = 17,640,734,720 B a GPU, 2,308,096 B more than an even split. Its users on 8 x H200 at 8,192 tokens (vLLM:
    budget 138,694,434,489 - 17,640,734,720 - 3,489,660,928 = 117,564,038,841 B; blocks of 80 x 16 x 2 x 1 head x
    128 x 2 = 655,360 B, 179,388 of them, 179,392 with an even split; 512 a user) stay (179,388 - 1) // 512 = 350."""
    model = load_model("meta-llama/Meta-Llama-3-70B")
    assert model.params.other_replicated == 80 * 2 * 8_192 + 8_192 == 1_318_912
    assert model.params.attention_replicated == model.params.other == 0
    total = 2 * model.params.total
    assert total == 141_107_412_992
    cap = capacity(model, Workload(ctx=8192), hardware=H200, parallel=Parallelism(tp=8))
    assert cap.weights_bytes_per_gpu == 2_637_824 + (total - 2_637_824) // 8 == 17_640_734_720
    assert cap.weights_bytes_per_gpu - total // 8 == 2_308_096
    assert cap.kv_budget_bytes == 117_564_038_841 and cap.vllm_block_bytes == 655_360
    assert (cap.vllm_num_blocks, cap.vllm_blocks_per_sequence, cap.max_concurrent_users) == (179_388, 512, 350)
    assert ((cap.kv_budget_bytes + 2_308_096) // 655_360 - 1) // 512 == 350  # an even split's


def test_engines_that_split_by_layer_or_not_at_all():
    """llama.cpp and transformers split by layer alone (TP 1): every group over PP. TensorRT-LLM builds MLA's
    kv_a_proj_with_mqa (q_a fused in) with no TP mapping (`_torch/modules/attention.py`): whole like vLLM's."""
    model = load_model(DSV3)
    for name, tp, pp in (("llama.cpp", 1, 4), ("transformers", 1, 4), ("tensorrt-llm", 8, 1), ("ideal", 8, 2)):
        shares = engine(name, EngineOptions(), tp=tp, pp=pp).weight_shares(model)
        assert {g: shares[g] for g in REPLICATED_GROUPS} == dict.fromkeys(REPLICATED_GROUPS, 1 / pp), name
        assert shares["attention"] == 1 / (tp * pp), name


def test_a_quantised_checkpoint_that_keeps_attention_unquantised_keeps_the_down_projections_too():
    """modules_to_not_convert naming the attention (gpt-oss's self_attn) leaves every attention group, the
    replicated one too, in the float dtype."""
    config = raw("deepseek-ai__DeepSeek-V3.json")
    config["quantization_config"] = {**config["quantization_config"], "modules_to_not_convert": ["self_attn"]}
    model = model_from_config(config, "dsv3-bf16-attention", "test")
    groups, _ = weights_by_group(model)
    assert groups["attention_replicated"] == 2 * model.params.attention_replicated
    assert groups["attention"] == 2 * model.params.attention
    assert groups["experts"] == model.params.experts


def test_dp_attention_replicates_everything_but_experts_either_way():
    """With DP 8 x TP 1 every group but the routed experts is whole anyway: the replicated groups change nothing
    there (100,817,054,720 B a GPU, tests/test_data_parallel.py)."""
    cap = capacity(load_model(DSV3), Workload(ctx=32_768), hardware=H200, parallel=Parallelism(tp=1, dp=8, ep=8),
                   kv_budget=GiB)
    assert cap.weights_bytes_per_gpu == 100_817_054_720


# ------------------------------------------------------------- the groups against transformers' own modules


# transformers' names of the tensors vLLM and SGLang keep whole: MLA's down-projections and a DSA indexer's wq_b and
# wk (quantised with the linear layers); norms, routers (DeepSeek's and Qwen's mlp.gate, gpt-oss's mlp.router, their
# correction biases, Qwen's shared_expert_gate) and an indexer's weights_proj (float)
ATTENTION_WHOLE = re.compile(r"\.(q_a_proj|kv_a_proj_with_mqa|indexer\.wq_b|indexer\.wk)\.weight$")
OTHER_WHOLE = re.compile(r"norm|\.mlp\.gate\.(weight|e_score_correction_bias)$|\.mlp\.router\.|shared_expert_gate"
                         r"|indexer\.weights_proj")


@pytest.mark.torch
@pytest.mark.parametrize("model_id, layers", [
    (DSV3, 4), ("deepseek-ai/DeepSeek-V3.2", 4), ("meta-llama/Llama-3.1-8B", 2), ("Qwen/Qwen3-30B-A3B", 2),
    ("openai/gpt-oss-20b", 2), ("google/gemma-3-1b-it", 2), ("Qwen/Qwen3-Next-80B-A3B-Thinking", 4),
])
def test_replicated_groups_equal_transformers_tensors(model_id, layers):
    """The first layers of each model, built by transformers on the meta device: the elements of the tensors whose
    names say they are held whole equal kvplan's replicated groups, and the rest its other groups."""
    import archkit

    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    data, spec = profile_config.first_layers(profile_config.resolve(model_id), layers)
    model_type, fields, _ = profile_config.transformers_fields(data)
    model = archkit.meta_build(model_type, fields)
    tensors = dict(model.named_parameters())
    tensors |= {name: b for name, b in model.named_buffers() if name.endswith(archkit.CHECKPOINT_BUFFERS)}
    attention = sum(t.numel() for name, t in tensors.items() if ATTENTION_WHOLE.search(name))
    other = sum(t.numel() for name, t in tensors.items() if not ATTENTION_WHOLE.search(name)
                and OTHER_WHOLE.search(name))
    assert (spec.params.attention_replicated, spec.params.other_replicated) == (attention, other)
