#!/usr/bin/env python3
"""Time `kvplan plan`'s search in-process, and count the work it repeats.

Standalone (no pytest). Each case is planned through `kvplan.api.plan` (the function behind `kvplan plan`),
`--rounds` times (a model of 100,000 layers at most DEEP_ROUNDS times) after one untimed plan that loads the library
and imports what planning needs; the figure is the median CPU time of the process (time.process_time) over the
rounds, which other jobs on a shared machine disturb less than wall time.
One more run under cProfile counts the calls that say how much work the search repeats: the speed model's
deployments built (`Deployment.__init__`) and the capacity counts made (`kvplan.capacity.users.count`).

    python benchmarks/bench_plan.py             # 10 rounds of each case
    python benchmarks/bench_plan.py --rounds 30
"""

import argparse
import cProfile
import json
import pstats
import statistics
import tempfile
import time
from pathlib import Path

from kvplan import api

ROOT = Path(__file__).resolve().parent.parent

CASES = {
    "gpt-oss-120b, H200, 256 users, TPOT <= 20 ms": dict(
        model="openai/gpt-oss-120b", gpu="h200", isl=1024, osl=1024, users=256, max_tpot=20),
    "Llama-3.1-70B, H100, 64 users, TPOT <= 30 ms": dict(
        model="meta-llama/Llama-3.1-70B", gpu="h100", isl=1024, osl=1024, users=64, max_tpot=30),
    "Llama-3.1-70B, H100, 64 users, no target": dict(
        model="meta-llama/Llama-3.1-70B", gpu="h100", isl=1024, osl=1024, users=64),
}

DEEP_LAYERS = 100_000  # a config far deeper than any published model: the search's per-layer scans dominate
DEEP_ROUNDS = 3  # rounds of a deep case at most (each took 37 s to 83 s before their layers were grouped once)

COUNTED = {"Deployment.__init__": ("speed/serving.py", "__init__"), "capacity count": ("capacity/users.py", "count")}


def cpu_seconds(case: dict) -> float:
    start = time.process_time()
    api.plan(**case)
    return time.process_time() - start


def calls(case: dict) -> dict[str, int]:
    """How many times each function of COUNTED ran in one plan."""
    profile = cProfile.Profile()
    profile.runcall(api.plan, **case)
    stats = pstats.Stats(profile).stats
    return {name: sum(row[1] for (file, _, function), row in stats.items()
                      if file.endswith(path) and function == wanted)
            for name, (path, wanted) in COUNTED.items()}


def deep_config(folder: Path, spec: str) -> Path:
    """model_specs/`spec` with DEEP_LAYERS layers, written to `folder`: a hybrid's per-layer pattern (Nemotron-H's
    hybrid_override_pattern) repeated to that length; Jamba's attention and expert periods need nothing more."""
    config = json.loads((ROOT / "model_specs" / spec).read_text(encoding="utf-8"))
    config["num_hidden_layers"] = DEEP_LAYERS
    if "hybrid_override_pattern" in config:
        pattern = config["hybrid_override_pattern"]
        config["hybrid_override_pattern"] = (pattern * -(-DEEP_LAYERS // len(pattern)))[:DEEP_LAYERS]
    path = folder / spec
    path.write_text(json.dumps(config), encoding="utf-8")
    return path


def deep_cases(folder: Path) -> dict[str, dict]:
    """Configs of DEEP_LAYERS layers planned on H100s for 16 users at 8k: nothing up to 64 GPUs holds their weights,
    so every layout of every GPU count is counted. Llama-3-8B's layers are all alike; Jamba's (attention every 8th,
    Mamba beside it) and Nemotron-H's (Mamba-2 and attention) are stored by vLLM and SGLang in forms of their own."""
    workload = dict(ctx=8192, users=16, gpu="h100")
    return {
        f"Llama-3-8B of {DEEP_LAYERS:,} layers, H100, 16 users at 8k": dict(
            model=str(deep_config(folder, "meta-llama__Meta-Llama-3-8B.json")), **workload),
        f"Jamba of {DEEP_LAYERS:,} layers, H100, 16 users at 8k": dict(
            model=str(deep_config(folder, "ai21labs__Jamba-v0.1.json")), **workload),
        f"Nemotron-H of {DEEP_LAYERS:,} layers, SGLang, H100, 16 users at 8k": dict(
            model=str(deep_config(folder, "nvidia__Nemotron-H-56B-Base-8K.json")), engine="sglang", **workload),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10, help="timed rounds of each case (default 10)")
    rounds = parser.parse_args().rounds
    with tempfile.TemporaryDirectory() as folder:
        cases = {**CASES, **deep_cases(Path(folder))}
        api.plan(**next(iter(CASES.values())))  # the library read, the modules imported
        for name, case in cases.items():
            runs = rounds if name in CASES else min(rounds, DEEP_ROUNDS)
            median = statistics.median(cpu_seconds(case) for _ in range(runs))
            counted = ", ".join(f"{function} {n}" for function, n in calls(case).items())
            print(f"{name}\n  {median * 1000:8.1f} ms CPU (median of {runs}); {counted}")


if __name__ == "__main__":
    main()
