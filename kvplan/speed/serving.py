"""The speed model's public functions: `serving` (the bound and the calibrated estimate of one serving point) and
`max_concurrency` (the most requests an instance holds within latency targets)."""

from collections.abc import Callable
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from kvplan import engines
from kvplan.capacity import Hardware, Parallelism, Workload, capacity
from kvplan.errors import KvplanError
from kvplan.gpus import Gpu
from kvplan.model import ModelSpec
from kvplan.speed.bound import StepTimes, dequantised_in_kernel, scale_out_slowdown, step_times
from kvplan.speed.calibrated import Efficiencies, Terms, efficiencies, prompt_ms, tpot_ms, ttft_ms
from kvplan.speed.work import Layout, ServingShape, StepWork

# Regimes flagged where they apply (docs/speed.md); docs/accuracy.md gives the estimate's error in each.
WIDE_TP, LITTLE_WORK_MS = 4, 2.0  # TP of 4 or more whose decode step reads under 2 ms at peak per GPU
SMALL_MOE_BATCH = 0.5  # an MoE model whose step's tokens touch under half its experts
PREFILL_HEAVY = 0.3  # prompts mixed into the decode steps take over 30% of the TPOT


class SpeedEstimate(BaseModel):
    """One serving point: its bounds, the calibrated estimate, what binds, the efficiencies used and the flags of
    regimes the estimate is known to be poor in. Times in milliseconds; the work per step and GPU in bytes and
    FLOPs (`decode_step`, `prefill`)."""

    model_config = ConfigDict(frozen=True)

    model: str
    gpu: str
    engine: str
    tp: int
    dp: int
    ep: int
    gpus: int
    isl: int
    osl: int
    concurrency: int = Field(description="requests the instance holds (all its DP ranks)")
    weights_dtype: str
    kv_dtype: str
    running: float = Field(description="requests decoding each step, per DP rank")
    running_limit: int | None = Field(description="the most one rank runs at once (its KV pool and request cap, "
                                                  "kvplan.capacity); None where the memory model finds none")
    decode_step_ms_bound: float = Field(description="the least TPOT at the GPU's peak rates: a decode step's bytes, "
                                                    "FLOPs or link bytes at peak, over 1 + the tokens it drafts")
    decode_step_ms: float = Field(description="the estimated time per output token (TPOT)")
    ttft_ms_bound: float
    ttft_ms: float
    tokens_per_s_per_user: float
    tokens_per_s_per_gpu: float
    binding: str = Field(description="what bounds a decode step: memory bandwidth, compute or link")
    efficiencies: dict[str, float]
    flags: list[str]
    decode_step: StepWork
    decode_peak: StepTimes
    prefill: StepWork
    prefill_peak: StepTimes


def serving(model: ModelSpec, gpu: Gpu, *, engine: str = "vllm", tp: int = 1, dp: int = 1, ep: int = 1, isl: int,
            osl: int, concurrency: int, weights_dtype: str | None = None, kv_dtype: str | None = None,
            mtp_drafts: int = 0, speculative: bool = False,
            overrides: dict[str, float] | None = None) -> SpeedEstimate:
    """The speed of one aggregated instance of `dp` ranks of `tp` GPUs serving `concurrency` requests of `isl`
    prompt and `osl` output tokens, under `engine` (vllm, sglang, tensorrt-llm). `mtp_drafts`: tokens a step drafts
    with the checkpoint's MTP layers (speculative decoding). `speculative`: the engine drafts otherwise (a draft
    model, an EAGLE head, n-grams), which the model does not describe (flagged). `overrides`: efficiencies by name
    (`Efficiencies`)."""
    deployment = Deployment(model, gpu, engine, Layout(tp=tp, dp=dp, ep=ep), isl, osl, weights_dtype, kv_dtype,
                            mtp_drafts)
    return deployment.estimate(concurrency, *efficiencies(deployment.engine, gpu, overrides), speculative)


class SpeedFit(BaseModel):
    """The most requests an instance holds within the targets, what stops it there, and its estimate there (None
    where even one request misses them)."""

    model_config = ConfigDict(frozen=True)

    users: int
    limited_by: str = Field(description="a target (TPOT, TTFT, tokens/s per user), the requests the instance "
                                        "runs at once (memory), or the search limit")
    estimate: SpeedEstimate | None


def max_concurrency(model: ModelSpec, gpu: Gpu, *, engine: str = "vllm", tp: int = 1, dp: int = 1, ep: int = 1,
                    isl: int, osl: int, max_tpot_ms: float | None = None, max_ttft_ms: float | None = None,
                    min_tokens_per_s_per_user: float | None = None, weights_dtype: str | None = None,
                    kv_dtype: str | None = None, mtp_drafts: int = 0, speculative: bool = False,
                    overrides: dict[str, float] | None = None, limit: int = 1 << 16) -> SpeedFit:
    """The largest concurrency whose estimate meets every target given: TPOT at most `max_tpot_ms`, TTFT at most
    `max_ttft_ms`, at least `min_tokens_per_s_per_user`; never more than the instance runs at once (its KV pool and
    request cap: beyond them requests queue, however fast the steps) nor `limit`. The estimate grows with the
    concurrency, so the search doubles, then bisects. The users a deployment serves are the fewer of this and what
    its memory holds at the planned context."""
    deployment = Deployment(model, gpu, engine, Layout(tp=tp, dp=dp, ep=ep), isl, osl, weights_dtype, kv_dtype,
                            mtp_drafts)
    return concurrency_fit(deployment, *efficiencies(deployment.engine, gpu, overrides), max_tpot_ms=max_tpot_ms,
                           max_ttft_ms=max_ttft_ms, min_tokens_per_s_per_user=min_tokens_per_s_per_user,
                           speculative=speculative, limit=limit)


def concurrency_fit(deployment: "Deployment", eff: Efficiencies, flags: list[str], *,
                    max_tpot_ms: float | None = None, max_ttft_ms: float | None = None,
                    min_tokens_per_s_per_user: float | None = None, speculative: bool = False,
                    limit: int = 1 << 16) -> SpeedFit:
    """`max_concurrency` on a deployment already built, under its efficiencies (and their flags): what a planner
    that also estimates the deployment at a concurrency asks, without building it twice."""
    if max_tpot_ms is None and max_ttft_ms is None and min_tokens_per_s_per_user is None:
        raise KvplanError("give a target: a maximum TPOT or TTFT, or a minimum of tokens/s per user")
    dp = deployment.layout.dp
    ceiling, ceiling_reason = limit, "the search limit"
    if deployment.limit and deployment.limit * dp <= limit:
        ceiling, ceiling_reason = deployment.limit * dp, "the requests it runs at once (memory)"

    def missed(estimate: SpeedEstimate) -> str | None:
        """The first target the estimate misses, or None."""
        if max_tpot_ms is not None and estimate.decode_step_ms > max_tpot_ms:
            return "TPOT"
        if max_ttft_ms is not None and estimate.ttft_ms > max_ttft_ms:
            return "TTFT"
        if min_tokens_per_s_per_user is not None and estimate.tokens_per_s_per_user < min_tokens_per_s_per_user:
            return "tokens/s per user"
        return None

    return _largest(lambda users: deployment.estimate(users, eff, flags, speculative), missed, ceiling,
                    ceiling_reason)


def _largest(point: Callable[[int], SpeedEstimate], missed: Callable[[SpeedEstimate], str | None], ceiling: int,
             ceiling_reason: str) -> SpeedFit:
    best = point(1)
    if reason := missed(best):
        return SpeedFit(users=0, limited_by=reason, estimate=None)
    low, high, reason = 1, 2, ceiling_reason
    while high <= ceiling:
        estimate = point(high)
        if stop := missed(estimate):
            reason = stop
            break
        low, best, high = high, estimate, high * 2
    high = min(high, ceiling + 1)
    while high - low > 1:
        middle = (low + high) // 2
        estimate = point(middle)
        if stop := missed(estimate):
            high, reason = middle, stop
        else:
            low, best = middle, estimate
    return SpeedFit(users=low, limited_by=reason, estimate=best)


class Point(NamedTuple):
    """One concurrency's physics: the running requests a rank, the decode step's work and its times at peak, and
    the terms the calibrated estimate is made of."""

    running: float
    work: StepWork
    peak: StepTimes
    terms: Terms


class Deployment:
    """A serving configuration whatever its concurrency: the model's shape on the layout, the running limit, the
    prefill of one prompt. `point(concurrency)` is its physics at a concurrency; `estimate` adds the efficiencies."""

    def __init__(self, model: ModelSpec, gpu: Gpu, engine: str, layout: Layout, isl: int, osl: int,
                 weights_dtype: str | None = None, kv_dtype: str | None = None, mtp_drafts: int = 0):
        if isl < 1 or osl < 2:
            raise KvplanError(f"isl must be at least 1 and osl at least 2 tokens, got {isl} and {osl}")
        engine_class = engines.engine_class(engine)
        self.engine = engine_class.name
        self.model, self.gpu, self.layout, self.isl, self.osl = model, gpu, layout, isl, osl
        self.shape = ServingShape(model, layout, self.engine, weights_dtype, kv_dtype, mtp_drafts)
        self.limit = _running_limit(self)
        self.prefill = self.shape.prefill(isl)
        self.prefill_peak = step_times(self.prefill, gpu, self.shape.weights_dtype_name, self.shape.kv.name)
        self.scale_out = layout.gpus > (gpu.nvlink_gpus or 1)
        # how many times NVLink's time the links beyond one NVLink domain add (0 within one)
        self.scale_out_slowdown = scale_out_slowdown(gpu) if self.scale_out else 0.0
        # a decode all-reduce run one-shot (each GPU reads every peer's message) over the ring's bytes
        self.oneshot = layout.tp / 2 if layout.dp == 1 and layout.tp > 1 else 1.0
        dequantised = dequantised_in_kernel(gpu, self.shape.weights_dtype_name)
        self.w4a16_moe_layers = self.shape.moe_layers if dequantised else 0
        # where the engine holds a prompt back until every DP rank has one: C / (O - 1) requests arrive a rank and
        # step, and the last of dp ranks has one after H(dp) times the gap between them (H the harmonic number)
        balances = layout.dp > 1 and engine_class.balances_attention_dp
        self.balance_harmonic = sum(1 / rank for rank in range(1, layout.dp + 1)) if balances else 0.0

    def point(self, concurrency: int) -> Point:
        if concurrency < 1:
            raise KvplanError(f"concurrency must be at least 1, got {concurrency}")
        per_rank = concurrency / self.layout.dp
        running = min(per_rank, self.limit) if self.limit else per_rank
        work = self.shape.decode_step(running, self.isl + self.osl // 2)
        peak = step_times(work, self.gpu, self.shape.weights_dtype_name, self.shape.kv.name)
        prefill = self.prefill_peak
        balance_need = self.balance_harmonic * (self.osl - 1) / per_rank
        terms = Terms(
            weights_ms=peak.weights_ms, kv_ms=peak.kv_ms,
            expert_weights_ms=peak.expert_weights_ms * self.shape.expert_imbalance(running * self.layout.dp),
            dense_ms=peak.dense_ms, expert_ms=peak.expert_ms,
            attention_ms=peak.attention_ms, link_ms=peak.link_ms, collectives=work.collectives,
            oneshot=self.oneshot, kernels=self.shape.decode_kernels,
            w4a16_moe_layers=self.w4a16_moe_layers, running=running,
            prefill_weights_ms=prefill.weights_ms, prefill_expert_weights_ms=prefill.expert_weights_ms,
            prefill_dense_ms=prefill.dense_ms,
            prefill_expert_ms=prefill.expert_ms, prefill_attention_ms=prefill.attention_ms,
            prefill_link_ms=prefill.link_ms, prefill_collectives=self.prefill.collectives, concurrency=per_rank,
            running_limit=self.limit or per_rank, osl=self.osl, ranks=self.layout.dp, balance_need=balance_need,
            scale_out=self.scale_out_slowdown, drafts=self.shape.drafts)
        return Point(running, work, peak, terms)

    def estimate(self, concurrency: int, eff: Efficiencies, flags: list[str], speculative: bool = False
                 ) -> SpeedEstimate:
        running, work, peak, terms = self.point(concurrency)
        tpot = tpot_ms(terms, eff)
        layout = self.layout
        return SpeedEstimate(
            model=self.model.name, gpu=self.gpu.name, engine=self.engine, tp=layout.tp, dp=layout.dp, ep=layout.ep,
            gpus=layout.gpus, isl=self.isl, osl=self.osl, concurrency=concurrency,
            weights_dtype=self.shape.weights_label, kv_dtype=self.shape.kv.name, running=running,
            running_limit=self.limit, decode_step_ms_bound=peak.bound_ms / (1 + self.shape.drafts),
            decode_step_ms=tpot,
            ttft_ms_bound=self.prefill_peak.bound_ms, ttft_ms=ttft_ms(terms, eff, tpot),
            tokens_per_s_per_user=1000 / tpot, tokens_per_s_per_gpu=running * layout.dp * 1000 / tpot / layout.gpus,
            binding=peak.binding, efficiencies=eff.model_dump(),
            flags=[*flags, *self._flags(terms, peak, tpot, eff, speculative)], decode_step=work, decode_peak=peak,
            prefill=self.prefill, prefill_peak=self.prefill_peak)

    def _flags(self, terms: Terms, peak: StepTimes, tpot: float, eff: Efficiencies, speculative: bool) -> list[str]:
        """The regimes known to be hard for a speed model, where they apply (docs/accuracy.md: the error in each)."""
        layout, flags = self.layout, []
        if self.scale_out:
            flags.append(f"{layout.gpus} GPUs are more than one NVLink domain of {self.gpu.nvlink_gpus or 1}: the "
                         "links beyond it are slower than the bound assumes")
        if self.limit is None:
            flags.append("kvplan's memory model finds no room for the KV cache at the engine's defaults: every "
                         "request is taken to run at once")
        if speculative:
            flags.append("speculative decoding the estimate does not model (a draft model, an EAGLE head, "
                         "n-grams): the bound and the estimate are for one token per step, which drafts can beat")
        if drafts := self.shape.drafts:
            flags.append(f"speculative decoding: {drafts} token{'s' if drafts > 1 else ''} drafted a step by the MTP "
                         f"layers, each accepted at {eff.acceptance:.0%} (fitted on DeepSeek-R1's and Qwen3.5's runs); "
                         "a model's and its data's own rate moves the TPOT")
        if layout.tp >= WIDE_TP and peak.hbm_ms < LITTLE_WORK_MS:
            flags.append(f"TP {layout.tp} with little work per GPU ({peak.hbm_ms:.2f} ms of HBM reads a step at "
                         "peak): fixed costs and links make most of the step")
        touched = self.shape.touched(terms.running * layout.dp)
        if self.shape.experts and touched < SMALL_MOE_BATCH:
            flags.append(f"MoE at a small batch: a step's tokens touch {touched:.0%} of the experts, a share that "
                         "uneven routing moves")
        prompts = terms.running / (self.osl - 1) * prompt_ms(terms, eff, terms.ranks)
        if prompts > PREFILL_HEAVY * tpot:
            flags.append(f"prefill-heavy: the prompts mixed into each step take {prompts / tpot:.0%} of the TPOT")
        if self.limit and terms.concurrency > self.limit:
            flags.append(f"{terms.concurrency:,.0f} requests a rank against {self.limit:,} that fit: the rest queue, "
                         "and TTFT is a queueing estimate")
        return flags


def _running_limit(deployment: Deployment) -> int | None:
    """The requests one rank runs at once, by the engine's memory rules (`kvplan.capacity`; vLLM's for a
    TensorRT-LLM layout with DP ranks, which kvplan's TensorRT-LLM engine does not plan), at the tokens a running
    request holds: isl + osl where the engine reserves a request's whole length to admit it (TensorRT-LLM's
    GUARANTEED_NO_EVICT), else isl + osl / 2, its prompt and half its output on average (vLLM's KV cache manager
    allocates blocks as tokens arrive, preempting when they run out; SGLang reserves a decaying share of the output
    still to come, `new_token_ratio`)."""
    layout, gpu = deployment.layout, deployment.gpu
    whole = engines.engine_class(deployment.engine).reserves_whole_request
    held = deployment.isl + (deployment.osl if whole else deployment.osl // 2)
    try:
        fit = capacity(deployment.model, Workload(ctx=held),
                       engine_name=deployment.shape.engine.name,
                       hardware=Hardware(name=gpu.name, memory_bytes=gpu.memory_bytes),
                       parallel=Parallelism(tp=layout.tp, dp=layout.dp), kv_dtype_name=deployment.shape.kv.name,
                       weights_dtype_name=deployment.shape.weights_dtype, suggest=False)
    except KvplanError:
        return None
    return fit.max_concurrent_users // layout.dp or None


__all__ = ["Deployment", "SpeedEstimate", "SpeedFit", "max_concurrency", "serving"]
