"""Fit the speed model's efficiencies on the calibration rows and write kvplan/data/speed_efficiencies.json.

    pip install numpy scipy        # this script's own needs; kvplan itself imports neither
    python benchmarks/speed_fit.py            # fit on every row, write the table (half a minute)
    python benchmarks/speed_fit.py --check    # fit, and exit 1 if the table (its errors too) is not the shipped one

Every row is taken through kvplan's own speed model (`kvplan.speed.Deployment`: the bytes, FLOPs and times at peak
of its decode step and prefill) and the efficiencies are fitted by least squares on the logarithm of predicted over
measured TPOT and TTFT (TTFT at half weight, its measurements being the noisier; a soft-L1 loss, so a few runs far
off do not pull the rest), utilisations bounded to (0, 1], from three starting points (the fit has several local
minima; the lowest wins). The estimate's formulas are `kvplan.speed.calibrated`'s own functions, run over numpy
arrays. What is fitted by what:
    per engine    kv_bandwidth, compute, moe_compute, per_kernel_us, per_sequence_us, request_ms,
                  burst (its kernels and its scheduler: SGLang's rounds of requests start together, vLLM's and
                  TensorRT-LLM's stagger), dequant_us (its W4A16 MoE kernels; only for an engine with runs that
                  dequantise 4-bit experts, else 0: not charged)
    for all       weights_bandwidth, prefill_compute, per_collective_us, link_bandwidth (what the GPU and its kernel
                  libraries set: a GEMV's share of HBM bandwidth, a large GEMM's of the tensor rate, an NVLink
                  collective's latency and share of NVLink's bandwidth; fitted per engine they carried worse to a
                  model left out: Llama-3.1-70B's TTFT median |error| 74% against 35% with prefill_compute per
                  engine), balance_steps (TensorRT-LLM's attention-DP balance cap: only its runs wait),
                  acceptance (a drafted token's, by MTP layers: only the runs that drafted exercise it)
    fixed         steps_to_first_token 3 (kvplan.speed.calibrated), scale_out 1 (no run spans more than one NVLink
                  domain, so the links beyond one are taken at InfiniBand's 400 Gb/s per GPU, not fitted)
The GPUs differ by their peak rates alone: utilisations fitted per engine and GPU family (Hopper, Blackwell)
generalised worse to a GPU left out of the fit (B200: TPOT median |error| 31% against 17%).

The table's provenance records the estimate's error: in-sample, and on models and GPUs left out of the fit (each
model, then each GPU, refitted without its rows and judged on them, the groups pooled: `held_out`). The command line
states the held-out figures (kvplan.speed.targets.stated_error), a user's model being one the fit has not seen.
"""

import datetime
import json
import os
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

# one BLAS thread: the fit's small SVDs run ten times slower with threads fighting over shared cores
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np  # noqa: E402
from scipy.optimize import least_squares  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from speed_rows import CALIBRATION, Row, read_rows, release_terms  # noqa: E402

from kvplan import gpus  # noqa: E402
from kvplan.sources import load_model  # noqa: E402
from kvplan.speed import Deployment, Efficiencies, Layout  # noqa: E402
from kvplan.speed.calibrated import TABLE, Terms, tpot_ms, ttft_ms  # noqa: E402

BY_ENGINE = ("kv_bandwidth", "compute", "moe_compute", "per_kernel_us", "per_sequence_us", "request_ms", "burst",
             "dequant_us")
FOR_ALL = ("weights_bandwidth", "prefill_compute", "per_collective_us", "link_bandwidth", "balance_steps",
           "acceptance")
# an engine's efficiency that only some runs exercise: fitted where its runs do, else 0 (not charged)
EXERCISED_BY = {"dequant_us": "w4a16_moe_layers"}
FIXED = {"steps_to_first_token": 3.0, "scale_out": 1.0}
UTILISATIONS = ("weights_bandwidth", "kv_bandwidth", "compute", "prefill_compute", "moe_compute", "link_bandwidth",
                "acceptance")
LOWER = {"acceptance": 1e-3}  # -log of a share below 1: a draft accepted always would emit unboundedly many
TTFT_WEIGHT = 0.5
# starting points (-log utilisation, log of the fixed times and shares): utilisations 0.90, 0.37, 0.61 with times
# and shares 1, 7.4 and 0.14 (us, ms, steps)
STARTS = ((0.1, 0.0), (1.0, 2.0), (0.5, -2.0))


class Points:
    """Every row's terms (`kvplan.speed.calibrated.Terms` of numpy arrays) and what it is fitted by."""

    def __init__(self, rows: list[Row]):
        models, built, self.deployments = {}, {}, []
        for row in rows:
            model = models.get(row.model) or models.setdefault(row.model, load_model(row.model))
            key = _configuration(row)
            if key not in built:
                built[key] = Deployment(model, gpus.find(row.gpu), row.engine, Layout(tp=row.tp, dp=row.dp, ep=row.ep),
                                        row.isl, row.osl, row.weights_dtype, mtp_drafts=row.mtp_drafts)
            self.deployments.append(built[key])
        terms = [release_terms(row, deployment) for row, deployment in zip(rows, self.deployments, strict=True)]
        self.rows = rows
        self.terms = Terms(*(np.array(column, float) for column in zip(*terms, strict=True)))
        self.engine = np.array([row.engine for row in rows])
        self.model = np.array([row.model for row in rows])
        self.gpu = np.array([row.gpu for row in rows])
        self.tpot = np.array([row.tpot_ms for row in rows])
        self.ttft = np.array([row.ttft_ms for row in rows])


def _configuration(row: Row) -> tuple:
    """What a row's Deployment is built from."""
    return (row.model, row.engine, row.gpu, row.tp, row.dp, row.ep, row.weights_dtype, row.isl, row.osl,
            row.mtp_drafts)


class Parameters:
    """The fitted values' names for the rows of `mask`: (engine, name) for each engine they hold, and name."""

    def __init__(self, points: Points, mask: np.ndarray):
        self.points = points
        self.engines = sorted(set(points.engine[mask]))
        self.names = [(e, n) for e in self.engines for n in BY_ENGINE if self._exercised(e, n, mask)] + list(FOR_ALL)
        self.lower = np.array([LOWER.get(_name(n), 0.0) if _name(n) in UTILISATIONS else -np.inf
                               for n in self.names])

    def _exercised(self, engine: str, name: str, mask: np.ndarray) -> bool:
        """Whether any of the engine's runs in `mask` has the term `name` multiplies (`EXERCISED_BY`)."""
        term = EXERCISED_BY.get(name)
        return term is None or bool(getattr(self.points.terms, term)[mask & (self.points.engine == engine)].any())

    def values(self, theta: np.ndarray) -> dict:
        """Utilisations exp(-theta) in (0, 1], everything else exp(theta) > 0; an engine's efficiency its runs do not
        exercise 0."""
        unexercised = {(e, n): 0.0 for e in self.engines for n in BY_ENGINE}
        return unexercised | {n: float(np.exp(-t) if _name(n) in UTILISATIONS else np.exp(t))
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
        for n, value in FIXED.items():
            out[n][:] = value
        return SimpleNamespace(**out)


def _name(name) -> str:
    return name if isinstance(name, str) else name[-1]


def engine_efficiencies(values: dict, engine: str) -> Efficiencies:
    """One engine's fitted efficiencies as the package takes them."""
    return Efficiencies(**{n: values[(engine, n)] for n in BY_ENGINE}, **{n: values[n] for n in FOR_ALL},
                        **FIXED)


def predict(points: Points, efficiencies: SimpleNamespace) -> tuple[np.ndarray, np.ndarray]:
    tpot = tpot_ms(points.terms, efficiencies)
    return tpot, ttft_ms(points.terms, efficiencies, tpot)


def fit(points: Points, mask: np.ndarray) -> tuple[Parameters, dict]:
    parameters = Parameters(points, mask)

    def residuals(theta: np.ndarray) -> np.ndarray:
        tpot, ttft = predict(points, parameters.per_row(parameters.values(theta)))
        return np.concatenate([np.log(tpot[mask] / points.tpot[mask]),
                               TTFT_WEIGHT * np.log(ttft[mask] / points.ttft[mask])])

    utilisation = np.isfinite(parameters.lower)
    fits = [least_squares(residuals, np.where(utilisation, u, t), loss="soft_l1", f_scale=0.3, max_nfev=4000,
                          bounds=(parameters.lower, np.inf), ftol=1e-8, xtol=1e-8) for u, t in STARTS]
    result = min(fits, key=lambda fit: fit.cost)
    return parameters, parameters.values(result.x)


def errors(points: Points, parameters: Parameters, values: dict) -> tuple[np.ndarray, np.ndarray]:
    """Predicted over measured, less one, for TPOT and TTFT of every row."""
    tpot, ttft = predict(points, parameters.per_row(values))
    return tpot / points.tpot - 1, ttft / points.ttft - 1


def held_out(points: Points, groups: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """For each group (a model, a GPU), the TPOT and TTFT errors of its rows under efficiencies fitted without
    them."""
    out = {}
    for name in sorted(set(groups)):
        held = groups == name
        parameters, values = fit(points, ~held)
        tpot, ttft = errors(points, parameters, values)
        out[name] = tpot[held], ttft[held]
    return out


def _rounded(x: float) -> float:
    return float(f"{x:.4g}")


def error_figures(tpot: np.ndarray, ttft: np.ndarray) -> dict:
    """The median and 90th percentile of |error| for TPOT and TTFT (4 significant figures)."""
    return {"tpot_median": _rounded(np.median(abs(tpot))), "tpot_p90": _rounded(np.percentile(abs(tpot), 90)),
            "ttft_median": _rounded(np.median(abs(ttft))), "ttft_p90": _rounded(np.percentile(abs(ttft), 90))}


def pooled(groups: dict[str, tuple[np.ndarray, np.ndarray]]) -> dict:
    """`error_figures` of every held-out group's rows together, with the number of groups."""
    tpot, ttft = (np.concatenate(column) for column in zip(*groups.values(), strict=True))
    return {"groups": len(groups), **error_figures(tpot, ttft)}


def table(points: Points, parameters: Parameters, values: dict, held: dict[str, dict]) -> dict:
    """The shipped table: the fitted values (4 significant figures) with their provenance, the error in-sample and
    `held` out (`pooled` figures by what was left out: models, gpus)."""
    engines = {engine: {"rows": int((points.engine == engine).sum()),
                        "efficiencies": {n: _rounded(values[(engine, n)]) for n in BY_ENGINE}}
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
            "in_sample": error_figures(tpot, ttft),
            "held_out": held},
        "gpus": sorted({gpus.find(g).name for g in points.gpu}),
        "for_all": {n: _rounded(values[n]) for n in FOR_ALL},
        "fixed": FIXED,
        "engines": engines}


def main(argv: list[str]) -> int:
    points = Points(read_rows())
    parameters, values = fit(points, np.ones(len(points.rows), bool))
    held = {"models": pooled(held_out(points, points.model)), "gpus": pooled(held_out(points, points.gpu))}
    fitted = table(points, parameters, values, held)
    text = json.dumps(fitted, indent=2) + "\n"
    if "--check" in argv:
        shipped = json.loads(TABLE.read_text(encoding="utf-8"))
        for each in (shipped, fitted):
            del each["provenance"]["fitted"]  # the date
        same = shipped == fitted
        print("the shipped table is the fit" if same else f"{TABLE} differs from the fit: rerun without --check")
        return 0 if same else 1
    TABLE.write_text(text, encoding="utf-8")
    for label, figures in (("in-sample", fitted["provenance"]["in_sample"]), ("held-out models", held["models"]),
                           ("held-out GPUs", held["gpus"])):
        print(f"{label}: |error| TPOT median {figures['tpot_median']:.1%} (p90 {figures['tpot_p90']:.1%}), "
              f"TTFT median {figures['ttft_median']:.1%} (p90 {figures['ttft_p90']:.1%})")
    print(f"wrote {TABLE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
