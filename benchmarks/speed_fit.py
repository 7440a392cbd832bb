"""Fit the speed model's efficiencies on the calibration rows and write kvplan/data/speed_efficiencies.json.

    pip install numpy scipy        # this script's own needs; kvplan itself imports neither
    python benchmarks/speed_fit.py            # fit on every row, write the table
    python benchmarks/speed_fit.py --check    # fit, and exit 1 if the table differs from the shipped one

Every row is taken through kvplan's own speed model (`kvplan.speed.Deployment`: the bytes, FLOPs and times at peak
of its decode step and prefill) and the efficiencies are fitted by least squares on the logarithm of predicted over
measured TPOT and TTFT (TTFT at half weight, its measurements being the noisier; a soft-L1 loss, so a few runs far
off do not pull the rest), utilisations bounded to (0, 1]. The estimate's formulas are `kvplan.speed.calibrated`'s
own functions, run over numpy arrays. What is fitted by what:
    per engine    weights_bandwidth, kv_bandwidth, compute, prefill_compute, moe_compute, per_layer_us,
                  per_moe_layer_us, per_sequence_us, per_collective_us, request_ms
    for all       scale_out, steps_to_first_token, burst (the links beyond an NVLink domain, and what a first
                  token waits for, which is the benchmark's more than the engine's)
The GPUs differ by their peak rates alone: utilisations fitted per engine and GPU family (Hopper, Blackwell)
generalised worse to a GPU left out of the fit (B200: TPOT median |error| 31% against 17%).
"""

import datetime
import json
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from scipy.optimize import least_squares

sys.path.insert(0, str(Path(__file__).resolve().parent))
from speed_rows import CALIBRATION, Row, read_rows  # noqa: E402

from kvplan import gpus  # noqa: E402
from kvplan.sources import load_model  # noqa: E402
from kvplan.speed import Deployment, Efficiencies, Layout  # noqa: E402
from kvplan.speed.calibrated import TABLE, Terms, tpot_ms, ttft_ms  # noqa: E402

BY_ENGINE = ("weights_bandwidth", "kv_bandwidth", "compute", "prefill_compute", "moe_compute", "per_layer_us",
             "per_moe_layer_us", "per_sequence_us", "per_collective_us", "request_ms")
FOR_ALL = ("scale_out", "steps_to_first_token", "burst")
UTILISATIONS = ("weights_bandwidth", "kv_bandwidth", "compute", "prefill_compute", "moe_compute")
TTFT_WEIGHT = 0.5


class Points:
    """Every row's terms (`kvplan.speed.calibrated.Terms` of numpy arrays) and what it is fitted by."""

    def __init__(self, rows: list[Row]):
        models, deployments, terms = {}, {}, []
        for row in rows:
            model = models.get(row.model) or models.setdefault(row.model, load_model(row.model))
            key = (row.model, row.engine, row.gpu, row.tp, row.dp, row.ep, row.weights_dtype, row.isl, row.osl)
            if key not in deployments:
                deployments[key] = Deployment(model, gpus.find(row.gpu), row.engine,
                                              Layout(tp=row.tp, dp=row.dp, ep=row.ep), row.isl, row.osl,
                                              row.weights_dtype)
            terms.append(deployments[key].point(row.concurrency).terms)
        self.rows = rows
        self.deployments = [deployments[(row.model, row.engine, row.gpu, row.tp, row.dp, row.ep, row.weights_dtype,
                                         row.isl, row.osl)] for row in rows]
        self.terms = Terms(*(np.array(column, float) for column in zip(*terms, strict=True)))
        self.engine = np.array([row.engine for row in rows])
        self.model = np.array([row.model for row in rows])
        self.gpu = np.array([row.gpu for row in rows])
        self.tpot = np.array([row.tpot_ms for row in rows])
        self.ttft = np.array([row.ttft_ms for row in rows])


class Parameters:
    """The fitted values' names for the rows of `mask`: (engine, name) for each engine they hold, and name."""

    def __init__(self, points: Points, mask: np.ndarray):
        self.points = points
        self.engines = sorted(set(points.engine[mask]))
        self.names = [(e, n) for e in self.engines for n in BY_ENGINE] + list(FOR_ALL)
        self.lower = np.array([0.0 if _name(n) in UTILISATIONS else -np.inf for n in self.names])

    def values(self, theta: np.ndarray) -> dict:
        """Utilisations exp(-theta) in (0, 1], everything else exp(theta) > 0."""
        return {n: float(np.exp(-t) if _name(n) in UTILISATIONS else np.exp(t))
                for n, t in zip(self.names, theta, strict=True)}

    def per_row(self, values: dict) -> SimpleNamespace:
        """Each row's efficiencies as arrays: its engine's, and those fitted for all."""
        p = self.points
        out = {n: np.zeros(len(p.rows)) for n in Efficiencies.model_fields}
        for engine in self.engines:
            for n in BY_ENGINE:
                out[n][p.engine == engine] = values[(engine, n)]
        for n in FOR_ALL:
            out[n][:] = values[n]
        return SimpleNamespace(**out)


def _name(name) -> str:
    return name if isinstance(name, str) else name[-1]


def engine_efficiencies(values: dict, engine: str) -> Efficiencies:
    """One engine's fitted efficiencies as the package takes them."""
    return Efficiencies(**{n: values[(engine, n)] for n in BY_ENGINE}, **{n: values[n] for n in FOR_ALL})


def predict(points: Points, efficiencies: SimpleNamespace) -> tuple[np.ndarray, np.ndarray]:
    tpot = tpot_ms(points.terms, efficiencies)
    return tpot, ttft_ms(points.terms, efficiencies, tpot)


def fit(points: Points, mask: np.ndarray) -> tuple[Parameters, dict]:
    parameters = Parameters(points, mask)

    def residuals(theta: np.ndarray) -> np.ndarray:
        tpot, ttft = predict(points, parameters.per_row(parameters.values(theta)))
        return np.concatenate([np.log(tpot[mask] / points.tpot[mask]),
                               TTFT_WEIGHT * np.log(ttft[mask] / points.ttft[mask])])

    start = np.where(np.isfinite(parameters.lower), 0.1, 0.0)
    result = least_squares(residuals, start, loss="soft_l1", f_scale=0.3, max_nfev=4000,
                           bounds=(parameters.lower, np.inf), ftol=1e-6, xtol=1e-6)
    return parameters, parameters.values(result.x)


def errors(points: Points, parameters: Parameters, values: dict) -> tuple[np.ndarray, np.ndarray]:
    """Predicted over measured, less one, for TPOT and TTFT of every row."""
    tpot, ttft = predict(points, parameters.per_row(values))
    return tpot / points.tpot - 1, ttft / points.ttft - 1


def table(points: Points, parameters: Parameters, values: dict) -> dict:
    """The shipped table: the fitted values (4 significant figures) with their provenance."""
    def rounded(x: float) -> float:
        return float(f"{x:.4g}")

    engines = {engine: {"rows": int((points.engine == engine).sum()),
                        "efficiencies": {n: rounded(values[(engine, n)]) for n in BY_ENGINE}}
               for engine in parameters.engines}
    tpot, ttft = errors(points, parameters, values)
    return {
        "about": "the speed model's efficiencies (kvplan.speed.calibrated), fitted by benchmarks/speed_fit.py",
        "provenance": {
            "file": CALIBRATION.relative_to(CALIBRATION.parents[3]).as_posix(),
            "source": "ai-dynamo/aiconfigurator aic-core/src/aiconfigurator_core/systems/silicon_sample.csv at "
                      "commit 095f58a5 (Apache-2.0), its aggregated runs of 7 models on 4 GPUs",
            "rows": len(points.rows), "rows_by_gpu": dict(sorted(Counter(points.gpu.tolist()).items())),
            "fitted": datetime.date.today().isoformat(),
            "in_sample": {"tpot_median": rounded(np.median(abs(tpot))),
                          "tpot_p90": rounded(np.percentile(abs(tpot), 90)),
                          "ttft_median": rounded(np.median(abs(ttft))),
                          "ttft_p90": rounded(np.percentile(abs(ttft), 90))}},
        "gpus": sorted({gpus.find(g).name for g in points.gpu}),
        "for_all": {n: rounded(values[n]) for n in FOR_ALL},
        "engines": engines}


def main(argv: list[str]) -> int:
    points = Points(read_rows())
    parameters, values = fit(points, np.ones(len(points.rows), bool))
    fitted = table(points, parameters, values)
    text = json.dumps(fitted, indent=2) + "\n"
    if "--check" in argv:
        shipped = json.loads(TABLE.read_text(encoding="utf-8"))
        same = {k: v for k, v in shipped.items() if k != "provenance"} == {
            k: v for k, v in fitted.items() if k != "provenance"}
        print("the shipped table is the fit" if same else f"{TABLE} differs from the fit: rerun without --check")
        return 0 if same else 1
    TABLE.write_text(text, encoding="utf-8")
    print(f"wrote {TABLE}: in-sample |error| TPOT median {fitted['provenance']['in_sample']['tpot_median']:.1%}, "
          f"TTFT median {fitted['provenance']['in_sample']['ttft_median']:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
