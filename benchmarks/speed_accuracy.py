"""The speed model's error on the calibration rows: in-sample, leave-one-model-out and leave-one-GPU-out.

    pip install numpy scipy
    python benchmarks/speed_accuracy.py          # 12 fits, under a minute on 2 shared cores

In-sample: the efficiencies fitted on every row (what kvplan ships), judged on every row. Leave-one-model-out: for
each of the 7 models, the efficiencies refitted without its rows, judged on its rows; likewise leave-one-GPU-out
for each of the 4 GPUs. Printed: the median and 90th percentile of
|predicted / measured - 1| for TPOT and TTFT, in-sample by the regimes the estimate flags, each held-out group and
all of them pooled (the pooled figures are those benchmarks/speed_fit.py writes into the shipped table's provenance,
which the command line states). docs/accuracy.md records these figures.
"""

import os
import sys
from pathlib import Path

# one BLAS thread: the fit's small SVDs run ten times slower with threads fighting over shared cores
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from speed_fit import Points, engine_efficiencies, errors, fit, held_out  # noqa: E402
from speed_rows import read_rows  # noqa: E402


def summary(tpot: np.ndarray, ttft: np.ndarray) -> str:
    def pair(err: np.ndarray) -> str:
        return f"{np.median(abs(err)):6.1%} {np.percentile(abs(err), 90):6.1%}"

    return f"{len(tpot):5d}  {pair(tpot)}   {pair(ttft)}"


def print_held_out(points: Points, groups: np.ndarray, label: str) -> None:
    held = held_out(points, groups)
    for name, (tpot, ttft) in held.items():
        print(f"  {name:32s} {summary(tpot, ttft)}")
    tpot, ttft = (np.concatenate(column) for column in zip(*held.values(), strict=True))
    print(f"  {label + ', all':32s} {summary(tpot, ttft)}", flush=True)


# The regimes the estimate flags (kvplan.speed.serving), by a part of the flag's text.
REGIMES = {"with little work per GPU": "TP >= 4, little work per GPU", "MoE at a small batch": "MoE at a small batch",
           "drafted a step by the MTP layers": "speculative decoding (MTP)",
           "prefill-heavy": "prefill-heavy", "GPUs are more than one NVLink domain": "beyond one NVLink domain",
           "requests a rank against": "requests queue", "kvplan's memory model finds no room": "no room found"}


def by_regime(points: Points, values: dict, tpot: np.ndarray, ttft: np.ndarray) -> None:
    """In-sample error of the rows each flag is on, and of the rows with none."""
    flagged = {label: [] for label in REGIMES.values()}
    clean = []
    for i, (row, deployment) in enumerate(zip(points.rows, points.deployments, strict=True)):
        flags = deployment.estimate(row.concurrency, engine_efficiencies(values, row.engine), []).flags
        labels = [label for text, label in REGIMES.items() if any(text in flag for flag in flags)]
        for label in labels:
            flagged[label].append(i)
        if not labels:
            clean.append(i)
    for label, rows in [*flagged.items(), ("no flag", clean)]:
        if rows:
            print(f"  {label:32s} {summary(tpot[rows], ttft[rows])}")


def main() -> None:
    points = Points(read_rows())
    print(f"{'':34s} {'rows':>5s}  {'TPOT |error|':>13s}   {'TTFT |error|':>13s}")
    print(f"{'':34s} {'':5s}  {'median':>6s} {'p90':>6s}   {'median':>6s} {'p90':>6s}")
    parameters, values = fit(points, np.ones(len(points.rows), bool))
    tpot, ttft = errors(points, parameters, values)
    print(f"in-sample\n  {'every row':32s} {summary(tpot, ttft)}", flush=True)
    by_regime(points, values, tpot, ttft)
    print("leave one model out")
    print_held_out(points, points.model, "held-out models")
    print("leave one GPU out")
    print_held_out(points, points.gpu, "held-out GPUs")


if __name__ == "__main__":
    main()
