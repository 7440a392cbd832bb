#!/usr/bin/env python3
"""Time `kvplan estimate --json` end to end, as a user runs it, and check what it imports.

Standalone (no pytest). Each run starts a fresh interpreter through the installed `kvplan` console
script, so the figure includes interpreter start-up, imports, reading the library and printing the JSON:

    python benchmarks/bench_estimate.py                 # 20 runs of the default model
    python benchmarks/bench_estimate.py --runs 50 --importtime

kvplan's own modules are compiled to bytecode once and the cache reused (in a temporary
PYTHONPYCACHEPREFIX), as they are in an installed wheel, even where PYTHONDONTWRITEBYTECODE is set;
`--no-bytecode-cache` runs with the environment as it is.

It then runs the same command once inside `python -c`, with its output swallowed, and inspects
`sys.modules` afterwards: planning must not import torch, transformers or huggingface_hub (they are for
profiling and the Hub source, and cost seconds). `--importtime` adds a `python -X importtime` breakdown
(medians over several runs).

Exit status: 0 when the command works and none of those modules was imported; 1 when the command fails
(for example the model name does not resolve: its error is printed) or a heavy module was imported.
"""

import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_MODEL = "meta-llama/Llama-3-8B"
DEFAULT_CTX = "8192"
TARGET_MEDIAN_S = 0.15
HEAVY = ("torch", "transformers", "huggingface_hub")

# Runs the CLI in-process with stdout captured, then reports the exit code and the heavy modules loaded.
PROBE = r"""
import contextlib, io, json, sys
heavy = json.loads(sys.argv[2])
sys.argv = ["kvplan", *json.loads(sys.argv[1])]
code = 0
with contextlib.redirect_stdout(io.StringIO()):
    from kvplan.cli import main
    try:
        main()
    except SystemExit as exit:
        code = exit.code if isinstance(exit.code, int) else 1
loaded = sorted(name for name in sys.modules if name.split(".")[0] in heavy)
print(json.dumps({"exit": code, "heavy_loaded": loaded, "modules": len(sys.modules)}))
"""

_IMPORTTIME = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)")


def kvplan_command(python: str) -> list[str]:
    """The `kvplan` script beside the interpreter (a venv's bin/), else on PATH, else `python -m kvplan`."""
    beside = Path(python).parent / ("kvplan.exe" if os.name == "nt" else "kvplan")
    if beside.is_file():
        return [str(beside)]
    found = shutil.which("kvplan")
    return [found] if found else [python, "-m", "kvplan"]


def run_env(bytecode_cache: bool) -> dict[str, str]:
    """The environment for every child: this one, or this one with a writable bytecode cache."""
    env = dict(os.environ)
    if bytecode_cache:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(Path(tempfile.gettempdir()) / "kvplan-bench-pycache")
    return env


def percentile(sorted_values: list[float], fraction: float) -> float:
    """Nearest-rank percentile of an already sorted list."""
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[rank - 1]


def time_runs(command: list[str], runs: int, warmup: int, env: dict[str, str]) -> list[float]:
    times = []
    for i in range(warmup + runs):
        start = time.perf_counter()
        subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=False)
        elapsed = time.perf_counter() - start
        if i >= warmup:
            times.append(elapsed)
    return times


def check_imports(python: str, cli_args: list[str], env: dict[str, str]) -> dict:
    done = subprocess.run([python, "-c", PROBE, json.dumps(cli_args), json.dumps(HEAVY)],
                          capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0 or not done.stdout.strip():
        return {"exit": done.returncode, "heavy_loaded": [], "modules": 0, "error": done.stderr.strip()}
    return json.loads(done.stdout.strip().splitlines()[-1])


def import_breakdown(python: str, cli_args: list[str], runs: int, top: int, env: dict[str, str]) -> None:
    """Median self and cumulative import time per module over `runs` runs of `python -X importtime`."""
    self_us: dict[str, list[int]] = {}
    cumulative_us: dict[str, list[int]] = {}
    totals = []
    for _ in range(runs):
        done = subprocess.run([python, "-X", "importtime", "-m", "kvplan", *cli_args],
                              capture_output=True, text=True, env=env, check=False)
        total = 0
        for match in _IMPORTTIME.finditer(done.stderr):
            own, cumulative, name = int(match[1]), int(match[2]), match[4]
            self_us.setdefault(name, []).append(own)
            cumulative_us.setdefault(name, []).append(cumulative)
            total += own
        totals.append(total)
    by_package: dict[str, float] = {}
    for name, values in self_us.items():
        package = name.split(".")[0]
        by_package[package] = by_package.get(package, 0) + statistics.median(values)
    print(f"\nimport time (python -X importtime, median of {runs} runs): "
          f"all imports {statistics.median(totals) / 1e6:.3f} s")
    print("  self time summed by top-level package:")
    for package, us in sorted(by_package.items(), key=lambda item: -item[1])[:top]:
        print(f"    {us / 1000:7.1f} ms  {package}")
    print("  largest cumulative times (a module and everything it imports):")
    ranked = sorted(cumulative_us.items(), key=lambda item: -statistics.median(item[1]))
    for name, values in ranked[:top]:
        print(f"    {statistics.median(values) / 1000:7.1f} ms  {name}")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="timed runs (default 20)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed runs first (default 2)")
    parser.add_argument("--model", default=DEFAULT_MODEL, help=f"--model to plan (default {DEFAULT_MODEL})")
    parser.add_argument("--ctx", default=DEFAULT_CTX, help=f"--ctx to plan (default {DEFAULT_CTX})")
    parser.add_argument("--python", default=sys.executable,
                        help="interpreter with kvplan installed (default: this one)")
    parser.add_argument("--importtime", action="store_true", help="also print a -X importtime breakdown")
    parser.add_argument("--top", type=int, default=12, help="rows of the import breakdown (default 12)")
    parser.add_argument("--no-bytecode-cache", dest="bytecode_cache", action="store_false",
                        help="run with the environment as it is (PYTHONDONTWRITEBYTECODE=1 recompiles "
                             "kvplan on every run)")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    return args


def main() -> int:
    args = parse_args()
    cli_args = ["estimate", "--model", args.model, "--ctx", args.ctx, "--json"]
    command = kvplan_command(args.python)
    env = run_env(args.bytecode_cache)
    cache = env["PYTHONPYCACHEPREFIX"] if args.bytecode_cache else "as the environment has it"
    print(f"command: {' '.join(command + cli_args)}")
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, bytecode cache: {cache}")

    first = subprocess.run(command + cli_args, capture_output=True, text=True, env=env, check=False)
    if first.returncode != 0:
        print(f"error: the command exited {first.returncode}:", file=sys.stderr)
        print(first.stderr.strip() or first.stdout.strip(), file=sys.stderr)
        return 1
    try:
        result = json.loads(first.stdout)
        print(f"model: {result['model']}, kv_bytes_per_token {result['kv_bytes_per_token']:,}, "
              f"kv_bytes_per_sequence {result['kv_bytes_per_sequence']:,}")
    except (ValueError, KeyError) as err:
        print(f"error: output is not the expected JSON ({err})", file=sys.stderr)
        return 1

    times = sorted(time_runs(command + cli_args, args.runs, args.warmup, env))
    median = statistics.median(times)
    print(f"runs: {len(times)} (after {args.warmup} warm-up)")
    print(f"median {median:.3f} s   p90 {percentile(times, 0.9):.3f} s   "
          f"min {times[0]:.3f} s   max {times[-1]:.3f} s")
    verdict = "within" if median <= TARGET_MEDIAN_S else "OVER"
    print(f"first target: median <= {TARGET_MEDIAN_S} s on a 2-core machine: {verdict} (kvplan's own share is held "
          "to a ratio against the floor: bench_startup.py)")

    probe = check_imports(args.python, cli_args, env)
    if probe.get("error") or probe["exit"] != 0:
        print(f"import check: could not run the command in-process (exit {probe['exit']}): "
              f"{probe.get('error', '')}", file=sys.stderr)
        return 1
    modules = f"({probe['modules']} modules in all)"
    if probe["heavy_loaded"]:
        print(f"import check: FAIL, imported {', '.join(probe['heavy_loaded'])} {modules}")
    else:
        print(f"import check: ok, none of {', '.join(HEAVY)} imported {modules}")

    if args.importtime:
        import_breakdown(args.python, cli_args, max(3, min(args.runs, 10)), args.top, env)
    return 1 if probe["heavy_loaded"] else 0


if __name__ == "__main__":
    sys.exit(main())
