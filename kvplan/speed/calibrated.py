"""The calibrated estimate: how an aggregated serving instance runs in steady state, with named efficiencies fitted on
real runs (kvplan/data/speed_efficiencies.json; `benchmarks/speed_fit.py` refits them).

An instance holds C requests per rank (closed loop: a finished request is replaced at once), each of I prompt and O
output tokens. At most N of them run (the engine's limit: its KV pool and its request cap, `kvplan.capacity`):

    running b         = min(C, N) requests decoding each step
    TPOT              = GEMMs(u_compute) + max(KV at peak / u_kv, attention FLOPs at peak / u_compute)
                      + s x (link bytes at NVLink peak + collectives x t_collective)          the all-reduces
                      + layers x t_layer + MoE layers x t_moe_layer + b x t_sequence          fixed costs
                      + b / (O - 1) x prompt                                                  the prompts mixed in
    GEMMs(u)          = max(dense weights / u_weights, dense FLOPs / u)                        each at the slower of
                      + max(experts touched / u_weights, expert FLOPs / (u x u_moe))          its reads and FLOPs
    prompt            = GEMMs(u_prefill) of a prompt + its attention FLOPs / u_prefill
    prefill           = prompt + its link time + the fixed costs
    TTFT              = t_request + prefill + k x TPOT + w x C x prefill + queue
    queue             = (C - N) / N x (prefill + (O - 1) x TPOT) where C exceeds N (Little's law: the requests
                        beyond the running ones wait a whole request's time for a slot)
with s = 1 for an instance within one NVLink domain and 1 + scale_out beyond it. Each step's own prompts: every
decoding request was a prompt once, so b / (O - 1) prompts enter per step in steady state. w x C x prefill is the
requests that arrive together (a benchmark starts all C at once): what the data show of TTFT growing with C at
loads far from saturation. The times at peak are the bound's (`kvplan.speed.bound`); u are utilisations (0 to 1],
t fixed times, fitted per engine (k, w and s for all engines): GPUs differ by their peak rates alone.

The arithmetic takes numbers or numpy arrays alike (`_max`), so the fit runs these same functions over every row.
"""

import json
from functools import cache
from pathlib import Path
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from kvplan.errors import KvplanError
from kvplan.gpus import Gpu

TABLE = Path(__file__).resolve().parent.parent / "data" / "speed_efficiencies.json"


class Efficiencies(BaseModel):
    """The named efficiencies of one engine: what share of the GPU's peak rates it reaches, and what each step,
    layer, request and collective costs beyond them. Any can be overridden by name."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    weights_bandwidth: float = Field(gt=0, le=1, description="share of HBM bandwidth weight reads achieve")
    kv_bandwidth: float = Field(gt=0, le=1, description="share of HBM bandwidth attention's KV reads achieve")
    compute: float = Field(gt=0, le=1, description="share of the peak tensor rate decode GEMMs and attention achieve")
    prefill_compute: float = Field(gt=0, le=1, description="share of the peak tensor rate a prefill achieves")
    moe_compute: float = Field(gt=0, le=1, description="routed experts' GEMM rate relative to dense GEMMs'")
    per_layer_us: float = Field(ge=0, description="fixed time per layer and step (kernel launches, norms)")
    per_moe_layer_us: float = Field(ge=0, description="further fixed time per MoE layer and step (routing)")
    per_sequence_us: float = Field(ge=0, description="time per running request and step (sampling, scheduling)")
    per_collective_us: float = Field(ge=0, description="latency of one all-reduce or all-to-all")
    scale_out: float = Field(ge=0, description="extra link time, as a multiple of NVLink's, for an instance wider "
                                               "than one NVLink domain")
    request_ms: float = Field(ge=0, description="fixed time to first token (request handling)")
    steps_to_first_token: float = Field(ge=0, description="decode steps a new request waits through")
    burst: float = Field(ge=0, description="share of the other requests' prefills a new one waits for")


class Terms(NamedTuple):
    """What the estimate is made of for one serving point: times at the GPU's peak rates (ms), counts, and the
    workload. Fields may be numpy arrays, one entry per calibration row."""

    weights_ms: float
    expert_weights_ms: float
    kv_ms: float
    dense_ms: float
    expert_ms: float
    attention_ms: float
    link_ms: float
    collectives: float
    layers: float
    moe_layers: float
    running: float
    prefill_weights_ms: float
    prefill_expert_weights_ms: float
    prefill_dense_ms: float
    prefill_expert_ms: float
    prefill_attention_ms: float
    prefill_link_ms: float
    prefill_collectives: float
    concurrency: float
    running_limit: float
    osl: float
    scale_out: float  # 1 where the instance spans more GPUs than an NVLink domain, else 0


def _max(a, b):
    """max for numbers and numpy arrays alike."""
    return (a + b + abs(a - b)) / 2


def _fixed_ms(t: Terms, e: Efficiencies) -> float:
    return (t.layers * e.per_layer_us + t.moe_layers * e.per_moe_layer_us) / 1000


def _gemms_ms(weights_ms, expert_weights_ms, dense_ms, expert_ms, e: Efficiencies, compute: float) -> float:
    """The dense GEMMs, then the experts' grouped GEMMs, each at the slower of its weights' reads and its FLOPs."""
    return (_max(weights_ms / e.weights_bandwidth, dense_ms / compute)
            + _max(expert_weights_ms / e.weights_bandwidth, expert_ms / (compute * e.moe_compute)))


def prompt_ms(t: Terms, e: Efficiencies) -> float:
    """One prompt's GEMMs and attention at the rates prefills reach."""
    return (_gemms_ms(t.prefill_weights_ms, t.prefill_expert_weights_ms, t.prefill_dense_ms, t.prefill_expert_ms, e,
                      e.prefill_compute)
            + t.prefill_attention_ms / e.prefill_compute)


def tpot_ms(t: Terms, e: Efficiencies) -> float:
    """The time per output token: one decode step of the running requests, with the prompts mixed in."""
    gemms = _gemms_ms(t.weights_ms, t.expert_weights_ms, t.dense_ms, t.expert_ms, e, e.compute)
    attention = _max(t.kv_ms / e.kv_bandwidth, t.attention_ms / e.compute)
    links = (1 + t.scale_out * e.scale_out) * (t.link_ms + t.collectives * e.per_collective_us / 1000)
    prompts = t.running / (t.osl - 1) * prompt_ms(t, e)
    return gemms + attention + links + _fixed_ms(t, e) + t.running * e.per_sequence_us / 1000 + prompts


def prefill_ms(t: Terms, e: Efficiencies) -> float:
    """One prompt's prefill: its GEMMs and attention, links and fixed costs."""
    links = (1 + t.scale_out * e.scale_out) * (t.prefill_link_ms + t.prefill_collectives * e.per_collective_us / 1000)
    return prompt_ms(t, e) + links + _fixed_ms(t, e)


def ttft_ms(t: Terms, e: Efficiencies, tpot: float) -> float:
    """The time to first token, given the TPOT."""
    prefill = prefill_ms(t, e)
    waiting = _max(t.concurrency - t.running_limit, 0) / t.running * (prefill + (t.osl - 1) * tpot)
    return e.request_ms + prefill + e.steps_to_first_token * tpot + e.burst * t.concurrency * prefill + waiting


# ---------------------------------------------------------------------------------------------- the fitted table


@cache
def table() -> dict:
    try:
        return json.loads(TABLE.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise KvplanError(f"{TABLE}: the speed model's efficiencies are unreadable: {err}") from None


def efficiencies(engine: str, gpu: Gpu, overrides: dict[str, float] | None = None) -> tuple[Efficiencies, list[str]]:
    """The engine's fitted efficiencies, any `overrides` by name, and a flag where no calibration row was measured
    on the GPU (its peak rates then carry the estimate alone)."""
    fitted = table()
    if engine not in fitted["engines"]:
        raise KvplanError(f"the speed model is calibrated for {', '.join(fitted['engines'])}, not {engine}")
    flags = []
    if gpu.name not in fitted["gpus"]:
        flags.append(f"no calibration rows on {gpu.name}: the efficiencies fitted on {', '.join(fitted['gpus'])} "
                     "are carried to it by its peak rates alone")
    unknown = sorted(set(overrides or {}) - set(Efficiencies.model_fields))
    if unknown:
        raise KvplanError(f"unknown efficiency {', '.join(unknown)}: the speed model's are "
                          f"{', '.join(Efficiencies.model_fields)}")
    values = fitted["engines"][engine]["efficiencies"] | fitted["for_all"] | (overrides or {})
    try:
        return Efficiencies(**values), flags
    except ValueError as err:
        raise KvplanError(f"efficiency override: {str(err).splitlines()[-1].strip()}") from None
