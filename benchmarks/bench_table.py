#!/usr/bin/env python3
"""Time a `kvplan table` sweep: 40 models x 8 contexts x 5 GPUs (1,600 capacity cells), in-process and end to
end.

Standalone (no pytest; not a timed test). The models are the first 40 of the bundled library, in its order;
the contexts 1k to 128k in powers of two; the GPUs H100 SXM, A100 80GB SXM, L40S, RTX 4090 and H200; the
engine vLLM (the default with a GPU):

    python benchmarks/bench_table.py                  # 20 runs of each
    python benchmarks/bench_table.py --runs 50 --profile

in-process  kvplan.tables.build + render, from model names to CSV text, in this interpreter after one warm-up
            run (library index cached, every config.json read and every number computed again each run).
end to end  the `kvplan` console script in a fresh interpreter per run, `--format csv --out FILE` (and,
            once per format, markdown, json and rich), so the figure includes start-up and imports. kvplan's
            modules are compiled to bytecode once and the cache reused (PYTHONPYCACHEPREFIX), as in an
            installed wheel, even where PYTHONDONTWRITEBYTECODE is set.

The target is a median under 0.5 s wall on a 2-core machine; the script says whether each median is within
it and exits 0 either way (timings depend on the machine), 1 if the sweep fails or gives the wrong shape.
`--profile` prints the in-process cProfile top functions.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_estimate import kvplan_command, percentile, run_env  # noqa: E402

CTX = "1k,2k,4k,8k,16k,32k,64k,128k"
GPUS = "h100,a100-80gb,l40s,rtx-4090,h200"
MODELS = 40
TARGET_S = 0.5


def sweep_names() -> list[str]:
    from kvplan.sources import library

    return [entry.id for entry in library.entries()[:MODELS]]


def in_process(names: list[str], fmt: str = "csv") -> str:
    from kvplan import tables as table

    result = table.build(names, table.parse_ctxs(CTX), gpus=table.parse_gpus(GPUS, None))
    return table.render(result, fmt)


def summary(label: str, times: list[float]) -> float:
    times = sorted(times)
    median = statistics.median(times)
    verdict = "within" if median < TARGET_S else "OVER"
    print(f"{label:<28} median {median:.3f} s   p90 {percentile(times, 0.9):.3f} s   min {times[0]:.3f} s   "
          f"max {times[-1]:.3f} s   ({verdict} {TARGET_S} s)")
    return median


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="timed runs of each (default 20)")
    parser.add_argument("--profile", action="store_true", help="print an in-process cProfile")
    parser.add_argument("--python", default=sys.executable, help="interpreter with kvplan installed")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be at least 1")

    names = sweep_names()
    text = in_process(names)  # warm-up, and the shape check
    rows = text.strip().splitlines()
    expected = 1 + MODELS * 8 * 5
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs; {len(names)} models x 8 contexts x "
          f"5 GPUs = {len(rows) - 1} CSV rows")
    if len(rows) != expected:
        print(f"error: expected {expected} lines (header + one per model x ctx x GPU), got {len(rows)}",
              file=sys.stderr)
        return 1

    times = []
    for _ in range(args.runs):
        start = time.perf_counter()
        in_process(names)
        times.append(time.perf_counter() - start)
    summary("in-process build + csv", times)

    env = run_env(bytecode_cache=True)
    command = kvplan_command(args.python)
    with tempfile.TemporaryDirectory() as tmp:
        model_list = Path(tmp) / "models.txt"
        model_list.write_text("\n".join(names) + "\n", encoding="utf-8")
        base = [*command, "table", "--models", f"@{model_list}", "--ctx", CTX, "--gpu", GPUS]
        print(f"command: kvplan table --models @models.txt --ctx {CTX} --gpu {GPUS} --format F --out FILE")
        for fmt in ("csv", "markdown", "json", "rich"):
            cli = [*base, "--format", fmt, "--out", str(Path(tmp) / f"table.{fmt}")]
            first = subprocess.run(cli, capture_output=True, text=True, env=env, check=False)
            if first.returncode != 0:
                print(f"error: the command exited {first.returncode}: {first.stderr.strip()}",
                      file=sys.stderr)
                return 1
            runs = args.runs if fmt == "csv" else max(5, args.runs // 4)
            times = []
            for _ in range(runs):
                start = time.perf_counter()
                subprocess.run(cli, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                               check=False)
                times.append(time.perf_counter() - start)
            summary(f"end to end, {fmt} ({runs} runs)", times)
        # for scale: what every run pays before the sweep (start-up, imports, option parsing)
        one = [*command, "table", "--models", names[0], "--ctx", "8k", "--gpu", "h100", "--format", "csv"]
        for label, cli in (("kvplan --help", [*command, "--help"]), ("1 model x 1 ctx x 1 GPU", one)):
            times = []
            for _ in range(max(5, args.runs // 4)):
                start = time.perf_counter()
                subprocess.run(cli, stdout=subprocess.DEVNULL, env=env, check=False)
                times.append(time.perf_counter() - start)
            print(f"{'for scale: ' + label:<28} median {statistics.median(times):.3f} s")

    if args.profile:
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        profiler.runcall(in_process, names)
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)
    return 0


if __name__ == "__main__":
    sys.exit(main())
