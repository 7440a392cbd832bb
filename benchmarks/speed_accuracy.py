"""The speed model's error on the calibration rows: in-sample, leave-one-model-out and leave-one-GPU-out.

    pip install numpy scipy
    python benchmarks/speed_accuracy.py          # about 15 minutes on 2 cores: 12 fits

In-sample: the efficiencies fitted on every row (what kvplan ships), judged on every row. Leave-one-model-out: for
each of the 7 models, the efficiencies refitted without its rows, judged on its rows; likewise leave-one-GPU-out
for each of the 4 GPUs (a GPU family left with no rows for an engine takes that engine's other family's
efficiencies, as kvplan does for a GPU it has no rows on). Printed: the median and 90th percentile of
|predicted / measured - 1| for TPOT and TTFT, each held-out group and all of them pooled. docs/accuracy.md records
these figures.
"""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from speed_fit import Points, errors, fit  # noqa: E402
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


def main() -> None:
    points = Points(read_rows())
    print(f"{'':34s} {'rows':>5s}  {'TPOT |error|':>13s}   {'TTFT |error|':>13s}")
    print(f"{'':34s} {'':5s}  {'median':>6s} {'p90':>6s}   {'median':>6s} {'p90':>6s}")
    parameters, values = fit(points, np.ones(len(points.rows), bool))
    print(f"in-sample\n  {'every row':32s} {summary(*errors(points, parameters, values))}", flush=True)
    print("leave one model out")
    held_out(points, points.model, "held-out models")
    print("leave one GPU out")
    held_out(points, points.gpu, "held-out GPUs")


if __name__ == "__main__":
    main()
