"""The calibrated estimate: how an aggregated serving instance runs in steady state, with named efficiencies fitted on
real runs (kvplan/data/speed_efficiencies.json; `benchmarks/speed_fit.py` refits them).

An instance holds C requests per rank (closed loop: a finished request is replaced at once), each of I prompt and O
output tokens. At most N of them run (the engine's limit: its KV pool and its request cap at the tokens a running
request holds, `kvplan.speed.serving`):

    running b         = min(C, N) requests decoding each step
    TPOT              = step / A
    step              = GEMMs(u_compute) + max(KV at peak / u_kv, attention FLOPs at peak / u_compute)
                      + s x ((a x link time + b A / (O - 1) x a prompt's link time) / u_link
                             + collectives x t_collective)                                    the all-reduces
                      + kernels x t_kernel + b x (1 + 2d) x t_sequence                        fixed costs
                      + W4A16 MoE layers x t_dequant
                      + b x A / (O - 1) x prompt(dp)                                          the prompts mixed in
    A                 = (1 - a^(d + 1)) / (1 - a)    tokens a step emits: 1 without drafts; with d drafted a step
                        (the checkpoint's MTP layers, `kvplan.speed.work`), each accepted with probability a given
                        the ones before it, the expected accepted run plus the verified token (Leviathan et al.,
                        "Fast Inference from Transformers via Speculative Decoding", ICML 2023, eq. 1); a drafting
                        step samples 1 + 2d rows of logits a request (the 1 + d it verifies, the d it drafts)
    GEMMs(u, r)       = max(dense weights / u_weights, dense FLOPs / u)                        each at the slower of
                      + max(experts touched / u_weights, r x expert FLOPs / (u x u_moe))      its reads and FLOPs
    prompt(r)         = GEMMs(u_prefill, r) of a prompt + its attention FLOPs / u_prefill
    prefill(r)        = prompt(r) + s x (its link time / u_link + collectives x t_collective) + the fixed costs
    TTFT              = t_request + prefill(dp) + 3 x step + w x C x prefill(dp) + balance + queue
    balance           = min~(n, m) x step, n = H(dp) x (O - 1) / (A x C)    TensorRT-LLM with attention DP only
    queue             = (C - N) / N x (prefill(dp) + (O - 1) x TPOT) where C exceeds N (Little's law: the requests
                        beyond the running ones wait a whole request's time for a slot)
Link times at peak count ring all-reduces (2 (tp - 1) / tp of the message each GPU sends, `kvplan.speed.work`);
a decode step's all-reduces are small, and the engines run them one-shot, each GPU reading every peer's whole
message, (tp - 1) of it: a = tp / 2 without attention DP (EP or not), 1 with it (TensorRT-LLM's customAllReduceUtils.h
picks ONESHOT up to 128 tokens at hidden 8,192 and TP 8 on Blackwell; vLLM's csrc/custom_all_reduce.cuh runs one
shot below 256 KB at TP 8, and SGLang's sgl-kernel copies it). The prompts mixed into a step pass their all-reduces
too, at the ring's bytes (large messages). u_link is the share of NVLink's one-way bandwidth the collectives reach.
W4A16 MoE layers: a model's MoE layers where its experts are stored in a 4-bit format on a GPU with no FP4 tensor
cores, which dequantises them to BF16 inside the MoE kernels (TensorRT-LLM's examples/models/core/gpt_oss/README.md:
BF16 activations x MXFP4 weights on Hopper's TRITON and CUTLASS backends, MXFP8 x MXFP4 on Blackwell; vLLM's
select_mxfp4_moe_backend runs W4A16 kernels only on SM90); t_dequant is fitted per engine, 0 for an engine no
calibration run measured so. balance: TensorRT-LLM's attention-DP balance holds a new prompt back until every rank
has one or `timeout_iters` steps pass (tensorrt_llm/_torch/pyexecutor/py_executor.py `_balance_adp_requests`,
docs/source/blogs/tech_blog/blog10_ADP_Balance_Strategy.md): each rank receives C / (O - 1) new requests a step, so
the last of dp ranks has one after n = H(dp) x (O - 1) / C steps on average (H the harmonic number), and the wait is
the smaller of n and a fitted m steps, taken smoothly (n x m / (n + m)).
With s = 1 within one NVLink domain and 1 + scale_out x (NVLink's one-way bandwidth / InfiniBand's - 1) beyond it.
Each step's own prompts: every decoding request was a prompt once, so b A / (O - 1) prompts enter per step in steady
state, on every one of the dp attention-DP ranks at once; a rank's attention and dense layers take its own, but the
routed experts, spread over all the instance's GPUs, take every rank's tokens (r = dp: the expert FLOPs of one
prompt on a GPU are its share of all GPUs', `kvplan.speed.work`). A prompt's own prefill runs beside the other
ranks' too: a step lasts as long as its slowest rank, so the engines prefill the ranks' prompts together
(TensorRT-LLM's attention-DP balance, docs/source/blogs/tech_blog/blog10_ADP_Balance_Strategy.md; SGLang's scheduler
gathers every DP rank's batch into each step, prepare_mlp_sync_batch, an idle one where a rank has none). 3 steps
(steps_to_first_token): a new request waits out the step running when it arrives (half of one on average) and the
one already scheduled (vLLM's async scheduling, SGLang's and TensorRT-LLM's overlap schedulers), is prefilled in the
next and its token leaves while the one after runs. w x C x prefill: the requests that arrive together. A benchmark
starts all C at once: where prompts are chunked into the decode steps (vLLM, TensorRT-LLM) the first round's staggered
first tokens stagger the rounds after it, so only the first round waits behind the others' prefills (C a rank, each
with every rank's at the experts); SGLang prefills waiting requests before it decodes, so every round starts
together and waits again (w per engine). The times at peak are the bound's (`kvplan.speed.bound`); u are
utilisations (0 to 1], t fixed times. What the GPU and its kernel libraries set (u_weights, u_prefill, t_collective)
is fitted for all engines, what the engine's kernels and scheduler set per engine; GPUs differ by their peak rates
alone.

The routed experts' reads are those of the GPU whose experts the step touches most (`kvplan.speed.work`,
`expert_imbalance`): with experts whole over EP GPUs a step waits for it.

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
    per_kernel_us: float = Field(ge=0, description="fixed time per kernel a decode step launches (its launch and "
                                                   "the small kernels' own run: norms, rotary, routing)")
    per_sequence_us: float = Field(ge=0, description="time per row of logits a step samples for a running request "
                                                     "(sampling, bookkeeping): one, or 1 + 2d with d drafts")
    per_collective_us: float = Field(ge=0, description="latency of one all-reduce or all-to-all")
    link_bandwidth: float = Field(gt=0, le=1, description="share of NVLink's one-way bandwidth collectives reach")
    dequant_us: float = Field(ge=0, description="further fixed time per MoE layer and step where 4-bit experts are "
                                                "dequantised to BF16 in the kernel (no FP4 tensor cores)")
    scale_out: float = Field(ge=0, description="the share of InfiniBand's slowdown against NVLink the links beyond "
                                               "one NVLink domain pay (1: at 400 Gb/s per GPU)")
    request_ms: float = Field(ge=0, description="fixed time to first token (request handling)")
    steps_to_first_token: float = Field(ge=0, description="decode steps a new request waits through")
    burst: float = Field(ge=0, description="share of the other requests' prefills a new one waits for (the rounds "
                                           "of a benchmark that starts them together)")
    balance_steps: float = Field(ge=0, description="the most decode steps an engine that balances attention-DP "
                                                   "ranks holds a new prompt back (TensorRT-LLM's timeout_iters)")
    acceptance: float = Field(gt=0, lt=1, description="the chance a drafted token is accepted, given the ones "
                                                      "before it were (speculative decoding by MTP layers)")


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
    oneshot: float  # a decode all-reduce's bytes over the ring's: tp / 2 without attention DP, else 1
    kernels: float  # kernels a decode step launches on each GPU (`kvplan.speed.work`)
    w4a16_moe_layers: float  # MoE layers whose 4-bit experts the GPU dequantises to BF16 (no FP4 tensor cores)
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
    ranks: float  # DP ranks whose prompts share the routed experts' GEMMs (1 without attention DP)
    balance_need: float  # steps until every DP rank has a new request, where the engine waits for it; else 0
    scale_out: float  # NVLink's one-way bandwidth over InfiniBand's, less one, beyond one NVLink domain; else 0
    drafts: float  # tokens drafted a step (speculative decoding by MTP layers), else 0


def _max(a, b):
    """max for numbers and numpy arrays alike."""
    return (a + b + abs(a - b)) / 2


def _fixed_ms(t: Terms, e: Efficiencies) -> float:
    return (t.kernels * e.per_kernel_us + t.w4a16_moe_layers * e.dequant_us) / 1000


def _links_ms(t: Terms, e: Efficiencies, link_ms, collectives) -> float:
    """Link time at the collectives' share of NVLink, their latencies, slowed beyond one NVLink domain."""
    return (1 + t.scale_out * e.scale_out) * (link_ms / e.link_bandwidth + collectives * e.per_collective_us / 1000)


def _gemms_ms(weights_ms, expert_weights_ms, dense_ms, expert_ms, e: Efficiencies, compute: float) -> float:
    """The dense GEMMs, then the experts' grouped GEMMs, each at the slower of its weights' reads and its FLOPs."""
    return (_max(weights_ms / e.weights_bandwidth, dense_ms / compute)
            + _max(expert_weights_ms / e.weights_bandwidth, expert_ms / (compute * e.moe_compute)))


def prompt_ms(t: Terms, e: Efficiencies, ranks=1) -> float:
    """One prompt's GEMMs and attention at the rates prefills reach, beside `ranks` - 1 other ranks' prompts in the
    same step (their tokens reach the experts' GEMMs too)."""
    return (_gemms_ms(t.prefill_weights_ms, t.prefill_expert_weights_ms, t.prefill_dense_ms,
                      ranks * t.prefill_expert_ms, e, e.prefill_compute)
            + t.prefill_attention_ms / e.prefill_compute)


def accepted(t: Terms, e: Efficiencies) -> float:
    """Tokens a decode step emits per request: (1 - a^(d + 1)) / (1 - a), 1 without drafts."""
    return (1 - e.acceptance ** (t.drafts + 1)) / (1 - e.acceptance)


def step_ms(t: Terms, e: Efficiencies) -> float:
    """One decode step of the running requests, with the prompts mixed in."""
    gemms = _gemms_ms(t.weights_ms, t.expert_weights_ms, t.dense_ms, t.expert_ms, e, e.compute)
    attention = _max(t.kv_ms / e.kv_bandwidth, t.attention_ms / e.compute)
    share = t.running * accepted(t, e) / (t.osl - 1)  # prompts entering per step
    links = _links_ms(t, e, t.oneshot * t.link_ms + share * t.prefill_link_ms, t.collectives)
    prompts = share * prompt_ms(t, e, t.ranks)
    sampled = t.running * (1 + 2 * t.drafts)  # rows of logits sampled: 1 + d verified and d drafted a request
    return gemms + attention + links + _fixed_ms(t, e) + sampled * e.per_sequence_us / 1000 + prompts


def tpot_ms(t: Terms, e: Efficiencies) -> float:
    """The time per output token: a decode step over the tokens it emits per request."""
    return step_ms(t, e) / accepted(t, e)


def prefill_ms(t: Terms, e: Efficiencies, ranks=1) -> float:
    """One prompt's prefill: its GEMMs and attention, links and fixed costs, beside `ranks` - 1 other ranks'."""
    return prompt_ms(t, e, ranks) + _links_ms(t, e, t.prefill_link_ms, t.prefill_collectives) + _fixed_ms(t, e)


def ttft_ms(t: Terms, e: Efficiencies, tpot: float) -> float:
    """The time to first token, given the TPOT."""
    prefill = prefill_ms(t, e, t.ranks)
    tokens = accepted(t, e)
    step = tpot * tokens
    waiting = _max(t.concurrency - t.running_limit, 0) / t.running * (prefill + (t.osl - 1) * tpot)
    burst = e.burst * t.concurrency * prefill
    need = t.balance_need / tokens  # a request's decode takes (O - 1) / A steps
    balance = need * e.balance_steps / _max(need + e.balance_steps, 1e-9)  # min~(n, m)
    return e.request_ms + prefill + e.steps_to_first_token * step + burst + balance * step + waiting


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
    values = fitted["engines"][engine]["efficiencies"] | fitted["for_all"] | fitted["fixed"] | (overrides or {})
    try:
        return Efficiencies(**values), flags
    except ValueError as err:
        raise KvplanError(f"efficiency override: {str(err).splitlines()[-1].strip()}") from None
