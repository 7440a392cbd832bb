"""The speed model's error on the calibration rows: in-sample, leave-one-model-out and leave-one-GPU-out.

    pip install numpy scipy
    python benchmarks/speed_accuracy.py          # about 15 minutes on 2 cores: 12 fits

In-sample: the efficiencies fitted on every row (what kvplan ships), judged on every row. Leave-one-model-out: for
each of the 7 models, the efficiencies refitted without its rows, judged on its rows; likewise leave-one-GPU-out
for each of the 4 GPUs (a GPU family left with no rows for an engine takes that engine's other family's
efficiencies, as kvplan does for a GPU it has no rows on). Printed: the median and 90th percentile of
|predicted / measured - 1| for TPOT and TTFT, in-sample by the regimes the estimate flags, each held-out group and
all of them pooled. docs/accuracy.md records
these figures.
"""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from speed_fit import Points, engine_efficiencies, errors, fit  # noqa: E402
from speed_rows import read_rows  # noqa: E402


def summary(tpot: np.ndarray, ttft: np.ndarray) -> str:
    def pair(err: np.ndarray) -> str:
        return f"{np.median(abs(err)):6.1%} {np.percentile(abs(err), 90):6.1%}"

    return f"{len(tpot):5d}  {pair(tpot)}   {pair(ttft)}"


def held_out(points: Points, groups: np.ndarray, label: str) -> None:
    pooled_tpot, pooled_ttft = [], []
    for name in sorted(set(groups)):
        held = groups == name
        parameters, values = fit(points, ~held)
        tpot, ttft = errors(points, parameters, values)
        pooled_tpot.append(tpot[held])
        pooled_ttft.append(ttft[held])
        print(f"  {name:32s} {summary(tpot[held], ttft[held])}", flush=True)
    print(f"  {label + ', all':32s} {summary(np.concatenate(pooled_tpot), np.concatenate(pooled_ttft))}")


# The regimes the estimate flags (kvplan.speed.serving), by a part of the flag's text.
REGIMES = {"TP ": "TP >= 4, little work per GPU", "MoE at a small batch": "MoE at a small batch",
           "prefill-heavy": "prefill-heavy", "GPUs are more than one NVLink domain": "beyond one NVLink domain",
           "requests a rank against": "requests queue", "kvplan's memory model finds no room": "no room found"}


def by_regime(points: Points, parameters, values: dict, tpot: np.ndarray, ttft: np.ndarray) -> None:
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
    by_regime(points, parameters, values, tpot, ttft)
    print("leave one model out")
    held_out(points, points.model, "held-out models")
    print("leave one GPU out")
    held_out(points, points.gpu, "held-out GPUs")


if __name__ == "__main__":
    main()
