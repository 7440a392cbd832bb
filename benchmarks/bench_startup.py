#!/usr/bin/env python3
"""kvplan's own cost, as ratios measured side by side: `kvplan estimate` against the floor (cli_floor.py, a typer app
with the same options that does nothing), and a planning table of the whole library against one estimate.

    python benchmarks/bench_startup.py               # 30 rounds
    python benchmarks/bench_startup.py --rounds 60

Each round runs every command once, in turn, each in a fresh interpreter, so that a machine shared with other jobs
slows all of them alike; the figures are medians over the rounds, of the wall time and of the CPU time the command
used (user + system, from the child's resource usage), which other jobs disturb far less. kvplan's modules are
compiled to bytecode once and the cache reused, as in an installed wheel.

The commands:
    floor           cli_floor.py: typer, pydantic and rich imported, estimate's options parsed, `{}` printed
    floor --json    the same without rich (kvplan's --json output does not import it)
    floor, no GC    each floor again as the `kvplan` command runs: Python's cycle collector off, objects frozen at
                    exit (not targets: the ratios against them are kvplan's own work alone)
    estimate        kvplan estimate --model meta-llama/Llama-3-8B --ctx 8192 (the table output, to a pipe)
    estimate --json the same as JSON
    table md        kvplan table over the whole library (the models vLLM runs) x 11 contexts (1k to 1M) x 8 GPUs,
                    --format markdown --out FILE
    table rich      the same, --format rich
    import pydantic python -c "import pydantic"
    import kvplan   python -c "import kvplan": the library's import, which loads each public name on first use

Targets: estimate at most 1.15x its floor (each output against its own); the markdown table at most 2x one
estimate (`kvplan estimate` as a user runs it, with its table output; the ratio to the faster `--json` estimate is
printed too, not a target); the rich table under 1 s; `import kvplan` at most 1.1x `import pydantic`. The script
prints each ratio and whether it is within its target, with the load average and CPU count; it exits 0 either way
(timings depend on the machine) and 1 if a command fails.
"""

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_estimate import kvplan_command, run_env  # noqa: E402

HERE = Path(__file__).resolve().parent
MODEL, CTX = "meta-llama/Llama-3-8B", "8192"
SWEEP_CTX = "1k,2k,4k,8k,16k,32k,64k,128k,256k,512k,1M"
SWEEP_GPUS = "h100,h200,b200,a100-80gb,a100-40gb,l40s,rtx-4090,mi300x"
TARGETS = {"estimate": 1.15, "estimate --json": 1.15, "table md": 2.0, "import kvplan": 1.1}
RICH_TARGET_S = 1.0


def library_models() -> tuple[list[str], list[str]]:
    """The library's ids that kvplan plans under vLLM on every one of these GPUs, and why the others are left out
    (the failures, and the cells not planned)."""
    from kvplan import tables as table
    from kvplan.sources import library

    names = [entry.id for entry in library.entries()]
    result = table.build(names, table.parse_ctxs(SWEEP_CTX), gpus=table.parse_gpus(SWEEP_GPUS, None),
                         keep_going=True)
    refused = {row.estimate.model: cell.not_planned for row in result.rows for cell in row.users if cell.not_planned}
    planned = {row.estimate.model for row in result.rows} - set(refused)
    return [name for name in names if name in planned], [*result.failures, *refused.values()]


def run(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the child) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"error: {' '.join(command)} exited {done.returncode}: {done.stderr.decode().strip()}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30, help="timed rounds (default 30)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds first (default 2)")
    parser.add_argument("--python", default=sys.executable, help="interpreter with kvplan installed")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")

    env = run_env(bytecode_cache=True)
    kvplan = kvplan_command(args.python)
    floor = [args.python, str(HERE / "cli_floor.py"), "estimate", "--model", MODEL, "--ctx", CTX]
    estimate = [*kvplan, "estimate", "--model", MODEL, "--ctx", CTX]
    names, left_out = library_models()
    with tempfile.TemporaryDirectory() as tmp:
        listing = Path(tmp) / "models.txt"
        listing.write_text("\n".join(names) + "\n", encoding="utf-8")
        sweep = [*kvplan, "table", "--models", f"@{listing}", "--ctx", SWEEP_CTX, "--gpu", SWEEP_GPUS]
        commands = {
            "floor": floor, "estimate": estimate,
            "floor --json": [*floor, "--json"], "estimate --json": [*estimate, "--json"],
            "floor, no GC": floor, "floor --json, no GC": [*floor, "--json"],
            "table md": [*sweep, "--format", "markdown", "--out", str(Path(tmp) / "t.md")],
            "table rich": [*sweep, "--format", "rich", "--out", str(Path(tmp) / "t.txt")],
            "import pydantic": [args.python, "-c", "import pydantic"],
            "import kvplan": [args.python, "-c", "import kvplan"],
        }
        load_before = os.getloadavg()
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
        for round_ in range(args.warmup + args.rounds):
            for name, command in commands.items():
                measured = run(command, env | ({"FLOOR_NO_GC": "1"} if name.endswith("no GC") else {}))
                if round_ >= args.warmup:
                    times[name].append(measured)
        load_after = os.getloadavg()

    wall = {name: statistics.median(t[0] for t in runs) for name, runs in times.items()}
    cpu = {name: statistics.median(t[1] for t in runs) for name, runs in times.items()}
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average {load_before[0]:.1f} before and "
          f"{load_after[0]:.1f} after; {args.rounds} rounds, medians")
    print(f"sweep: {len(names)} library models x 11 contexts x 8 GPUs = {len(names) * 11 * 8:,} cells"
          + (f" (left out, vLLM does not plan them: {'; '.join(left_out)})" if left_out else ""))
    print(f"{'command':<20} {'wall':>8} {'CPU':>8}")
    for name in commands:
        print(f"{name:<20} {wall[name]:7.3f}s {cpu[name]:7.3f}s")
    against = {"estimate": "floor", "estimate --json": "floor --json", "table md": "estimate",
               "import kvplan": "import pydantic"}
    # kvplan runs with the cycle collector off and freezes its objects at exit (`kvplan.main`); against floors that
    # do too, what is left is kvplan's own work; and the table against the faster, JSON, estimate. Not targets
    alike = {"estimate": "floor, no GC", "estimate --json": "floor --json, no GC", "table md": "estimate --json"}
    print(f"{'ratio':<39} {'wall':>6} {'CPU':>6}  target")
    for name, base in against.items():
        by_wall, by_cpu = wall[name] / wall[base], cpu[name] / cpu[base]
        verdict = "within" if max(by_wall, by_cpu) <= TARGETS[name] else "OVER"
        print(f"{name + ' / ' + base:<39} {by_wall:5.2f}x {by_cpu:5.2f}x  <= {TARGETS[name]}x: {verdict}")
    for name, base in alike.items():
        by_wall, by_cpu = wall[name] / wall[base], cpu[name] / cpu[base]
        print(f"{name + ' / ' + base:<39} {by_wall:5.2f}x {by_cpu:5.2f}x  (not a target)")
    verdict = "within" if wall["table rich"] < RICH_TARGET_S else "OVER"
    print(f"{'table rich':<39} {wall['table rich']:5.2f}s {cpu['table rich']:5.2f}s  < {RICH_TARGET_S} s: {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
