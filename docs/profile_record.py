#!/usr/bin/env python3
"""Run the `kvplan profile` record of docs/accuracy.md and turn its JSON into the page's tables.

    python docs/profile_record.py run --device cpu --out DIR    # the CPU record, one JSON per run
    python docs/profile_record.py run --device cuda --out DIR   # the GPU record (see accuracy.md), same
    python docs/profile_record.py run --device cuda --out DIR --only llama3-8b-b1,qwen3-8b
    python docs/profile_record.py table DIR                     # Markdown tables from DIR/*.json

Each run is a real `python -m kvplan profile ... --json` in a subprocess; a run that fails leaves its one-line
error in DIR/NAME.err and the others go on. The tables print every figure the page records, with the device,
versions and date taken from the JSON, so the page shows what was measured and nothing else.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from datetime import date
from pathlib import Path

# name -> kvplan profile arguments (besides --device and --json)
CPU_RUNS = {
    "llama3-8b": "--model meta-llama/Llama-3-8B --ctx 1024 --layers 2 --decode-steps 8",
    "llama3-8b-b4": "--model meta-llama/Llama-3-8B --ctx 2048 --batch 4 --layers 2 --decode-steps 8",
    "mistral-above": "--model mistralai/Mistral-7B-v0.1 --ctx 4160 --layers 1 --decode-steps 8",
    "mistral-below": "--model mistralai/Mistral-7B-v0.1 --ctx 1024 --layers 1 --decode-steps 8",
    "gemma3-4b": "--model google/gemma-3-4b-it --ctx 1088 --layers 6 --decode-steps 8",
    "gemma2-2b": "--model google/gemma-2-2b --ctx 2048 --batch 2 --layers 2 --dtype bf16 --decode-steps 8",
    "qwen3-8b": "--model Qwen/Qwen3-8B --ctx 1024 --layers 2 --decode-steps 8",
    "deepseek-v2-lite": "--model deepseek-ai/DeepSeek-V2-Lite --ctx 1024 --layers 2 --decode-steps 8",
    "gpt-oss-20b": "--model openai/gpt-oss-20b --ctx 1024 --layers 2 --decode-steps 8",
    "falcon-7b": "--model tiiuae/falcon-7b --ctx 1024 --layers 2 --decode-steps 8",
    "falcon-40b": "--model tiiuae/falcon-40b --ctx 512 --layers 1 --decode-steps 8",
    "gpt2": "--model gpt2 --ctx 1024 --batch 2 --decode-steps 8",
    "jamba": "--model ai21labs/Jamba-v0.1 --ctx 256 --layers 5 --decode-steps 4",
    "qwen3-next": "--model Qwen/Qwen3-Next-80B-A3B-Thinking --ctx 256 --layers 4 --decode-steps 4",
}
GPU_RUNS = {
    "llama3-8b-b1": "--model meta-llama/Llama-3-8B --ctx 8192 --batch 1",
    "llama3-8b-b16": "--model meta-llama/Llama-3-8B --ctx 8192 --batch 16",
    "qwen3-8b": "--model Qwen/Qwen3-8B --ctx 8192",
    "gemma3-12b": "--model google/gemma-3-12b-it --ctx 8192",
    "gpt-oss-20b": "--model openai/gpt-oss-20b --ctx 8192",
    "deepseek-v2-lite": "--model deepseek-ai/DeepSeek-V2-Lite --ctx 8192",
    "llama3-8b-max-batch": "--model meta-llama/Llama-3-8B --ctx 8192 --find-max-batch",
    "llama3-8b-recompute": "--model meta-llama/Llama-3-8B --ctx 8192 --compare-recompute",
}


def run(device: str, out: Path, only: list[str] | None, timeout: float) -> int:
    runs = GPU_RUNS if device.startswith("cuda") else CPU_RUNS
    unknown = sorted(set(only or ()) - set(runs))
    if unknown:
        sys.exit(f"profile_record: no run named {', '.join(unknown)} (have: {', '.join(runs)})")
    out.mkdir(parents=True, exist_ok=True)
    failed = 0
    for name, args in runs.items():
        if only and name not in only:
            continue
        command = [sys.executable, "-m", "kvplan", "profile", "--device", device, "--json", *args.split()]
        print(f"{name}: {' '.join(command[2:])}", flush=True)
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
            error = done.stderr.strip().splitlines()[-1] if done.returncode and done.stderr.strip() else ""
        except subprocess.TimeoutExpired:
            done, error = None, f"timed out after {timeout:g} s"
        if done is not None and done.returncode == 0:
            (out / f"{name}.json").write_text(done.stdout, encoding="utf-8")
        else:
            failed += 1
            (out / f"{name}.err").write_text(error or f"exit {done.returncode}", encoding="utf-8")
            print(f"  failed: {error}", flush=True)
    return 1 if failed else 0


def _bytes(n: int | None) -> str:
    return "n/a" if n is None else f"{n:,}"


def _pct(predicted: int | None, measured: int | None) -> str:
    if predicted is None or measured is None or not measured:
        return "n/a"
    return f"{100 * (predicted - measured) / measured:+.1f}%"


def _layers(r: dict) -> str:
    kinds = ", ".join(f"{k['layers']} {k['kind']}" for k in r["by_kind"])
    return f"{r['layers']} of {r['total_layers']}: {kinds}"


def _other_attention(results: list[dict]) -> str:
    """The models whose attention differs from the first's, grouped: ' (eager for a and b)'."""
    first = results[0]["attn_implementation"]
    others: dict[str, list[str]] = {}
    for r in results:
        if r["attn_implementation"] != first and r["model"] not in others.get(r["attn_implementation"], []):
            others.setdefault(r["attn_implementation"], []).append(r["model"])
    return "".join(f" ({kind} for {' and '.join(models)})" for kind, models in others.items())


def table(folder: Path) -> None:
    results = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(folder.glob("*.json"))]
    if not results:
        sys.exit(f"profile_record: no JSON in {folder}")
    first = results[0]
    print(f"Measured {date.today().isoformat()} on {first['device_name']}"
          + (f" (driver {first['driver_version']}, CUDA {first['cuda_version']})" if first["cuda_version"] else "")
          + f"; torch {first['torch_version']}, transformers {first['transformers_version']}, "
            f"{first['cache_class']}, {first['attn_implementation']} attention" + _other_attention(results) + ".\n")
    print("| model | layers | ctx x batch (prefill + decode) | dtype | KV predicted (B) | KV measured (B) | "
          "after prefill predicted / measured (B) | weights predicted / measured (B) | TTFT | decode tok/s |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['model']} | {_layers(r)} | {r['ctx']:,} x {r['batch']} ({r['prompt_tokens']:,} + "
              f"{r['decode_steps']}) | {r['dtype']} | {_bytes(r['predicted_kv_bytes'])} | "
              f"{_bytes(r['measured_kv_bytes'])} | {_bytes(r['predicted_kv_after_prefill_bytes'])} / "
              f"{_bytes(r['measured_kv_after_prefill_bytes'])} | {_bytes(r['predicted_weights_bytes'])} / "
              f"{_bytes(r['measured_weights_bytes'])} | {r['ttft_s']:.2f} s | {r['decode_tokens_per_s']:.1f} |")
    totals = any(r["measured_total_bytes"] is not None for r in results)  # the CPU has no total
    print("\n| model | ctx x batch | activations predicted (B) | measured peak (B) | error |"
          + (" total predicted (B) | total measured (B) | error |" if totals else ""))
    print("|---|---|---:|---:|---:|" + ("---:|---:|---:|" if totals else ""))
    for r in results:
        total = (f" {_bytes(r['predicted_total_bytes'])} | {_bytes(r['measured_total_bytes'])} | "
                 f"{_pct(r['predicted_total_bytes'], r['measured_total_bytes'])} |") if totals else ""
        print(f"| {r['model']} | {r['ctx']:,} x {r['batch']} | {_bytes(r['predicted_activation_bytes'])} | "
              f"{_bytes(r['measured_activation_peak_bytes'])} | "
              f"{_pct(r['predicted_activation_bytes'], r['measured_activation_peak_bytes'])} |" + total)
    searched = [r for r in results if r.get("max_batch")]
    if searched:
        print("\n| model | ctx | max batch predicted | measured | error | trials (batch: fits) |")
        print("|---|---:|---:|---:|---:|---|")
        for r in searched:
            mb = r["max_batch"]
            trials = ", ".join(f"{t['batch']}: {'yes' if t['fits'] else 'OOM'}" for t in mb["trials"])
            print(f"| {r['model']} | {r['ctx']:,} | {mb['predicted']:,} | {mb['measured']:,} | "
                  f"{_pct(mb['predicted'], mb['measured'])} | {trials} |")
    findings = [(r["model"], f) for r in results for f in r["findings"]]
    for model, finding in findings:
        print(f"\n- {model}: {finding}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    runner = sub.add_parser("run")
    runner.add_argument("--device", default="cpu")
    runner.add_argument("--out", type=Path, required=True)
    runner.add_argument("--only", type=lambda text: text.split(","))
    runner.add_argument("--timeout", type=float, default=600)
    tabler = sub.add_parser("table")
    tabler.add_argument("folder", type=Path)
    args = parser.parse_args()
    if args.command == "run":
        return run(args.device, args.out, args.only, args.timeout)
    table(args.folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
