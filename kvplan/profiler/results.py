"""What `kvplan profile` returns: the profile, each measured figure beside kvplan's prediction, per component and per
layer kind, and what --find-max-batch and --compare-recompute found. Plain records: the run (`run.py`) fills them,
the report (`kvplan.report.print_profile`) and --json show them, and a recorded profile is read back into them."""

import statistics

from pydantic import BaseModel

from kvplan.profiler import runtime
from kvplan.profiler.bandwidth import DecodeBandwidth


class Component(BaseModel):
    """One line of predicted vs measured: bytes, error in bytes and in % of the measured figure."""

    name: str
    predicted: int | None
    measured: int | None
    error_bytes: int | None = None
    error_pct: float | None = None

    @classmethod
    def of(cls, name: str, predicted: int | None, measured: int | None) -> "Component":
        if predicted is None or measured is None:
            return cls(name=name, predicted=predicted, measured=measured)
        error = predicted - measured
        return cls(name=name, predicted=predicted, measured=measured, error_bytes=error,
                   error_pct=100.0 * error / measured if measured else (0.0 if not error else None))


class KindRow(BaseModel):
    """The cache layers of one kind: predicted and measured bytes after decode, for the whole batch."""

    kind: str
    layers: int
    tokens_measured: int | None
    predicted: int
    measured: int
    measured_view: int
    cache_layer_class: str
    dtypes: list[str]


class Trial(BaseModel):
    batch: int
    fits: bool
    peak_allocated: int | None = None


class MaxBatch(BaseModel):
    """--find-max-batch: the largest batch that ran prefill and decode at ctx, and kvplan's prediction."""

    measured: int
    predicted: int
    error_pct: float | None
    gpu_memory_bytes: int
    trials: list[Trial]
    within_target: bool | None


class Spread(BaseModel):
    """Seconds per token over the timed steps: their median and 10th and 90th percentiles."""

    median: float
    p10: float
    p90: float

    @classmethod
    def of(cls, seconds: list[float]) -> "Spread":
        """From two or more timings; the deciles linear between the nearest two (numpy's default)."""
        deciles = statistics.quantiles(seconds, n=10, method="inclusive")
        return cls(median=statistics.median(seconds), p10=deciles[0], p90=deciles[-1])


class RecomputeRow(BaseModel):
    """--compare-recompute at one length: decode with the cache vs recomputing the whole prefix per token, each
    timed step by step after `warmup_steps` untimed ones at that length."""

    tokens: int
    steps: int
    warmup_steps: int
    cached: Spread
    recompute: Spread
    speedup: float  # the medians' ratio
    speedup_low: float  # recompute's p10 over cached's p90
    speedup_high: float  # recompute's p90 over cached's p10
    cache_bytes: int
    recompute_peak_bytes: int | None  # CUDA: peak allocated above the weights while recomputing


class Profile(BaseModel):
    model: str
    architecture: str
    layers: int
    total_layers: int
    ctx: int
    batch: int
    prompt_tokens: int
    decode_steps: int
    device: str
    device_name: str
    dtype: str
    cache_implementation: str
    torch_version: str
    transformers_version: str
    cuda_version: str | None
    driver_version: str | None
    gpu_memory_bytes: int | None
    model_class: str
    cache_class: str | None = None
    attn_implementation: str | None = None
    predicted_kv_bytes: int
    measured_kv_bytes: int | None = None
    measured_kv_view_bytes: int | None = None
    cache_bookkeeping_bytes: int | None = None
    predicted_kv_after_prefill_bytes: int
    measured_kv_after_prefill_bytes: int | None = None
    predicted_weights_bytes: int
    measured_weights_bytes: int | None = None
    measured_buffer_bytes: int | None = None
    predicted_activation_bytes: int
    measured_activation_peak_bytes: int | None = None
    predicted_prefill_activation_bytes: int | None = None  # (None in records of kvplan before they were kept)
    measured_prefill_activation_bytes: int | None = None
    predicted_decode_above_cache_bytes: int | None = None
    measured_decode_above_cache_bytes: int | None = None
    predicted_reserved_bytes: int | None = None
    measured_reserved_bytes: int | None = None
    predicted_cuda_context_bytes: int
    measured_cuda_context_bytes: int | None = None  # NVML's process memory before the first allocation
    measured_non_torch_bytes: int | None = None
    predicted_total_bytes: int
    measured_total_bytes: int | None = None
    build_s: float | None = None
    estimated_prefill_s: float | None = None  # CPU: the notice's estimate, from a pilot, beside ttft_s
    estimated_decode_s: float | None = None
    ttft_s: float | None = None
    prefill_tokens_per_s: float | None = None
    decode_tokens_per_s: float | None = None
    decode_bandwidth: DecodeBandwidth | None = None
    by_kind: list[KindRow] = []
    components: list[Component] = []
    memory: list[runtime.Snapshot] = []
    kv_exact: bool | None = None
    verdict: str = ""
    findings: list[str] = []
    notes: list[str] = []
    max_batch: MaxBatch | None = None
    recompute: list[RecomputeRow] | None = None

    @property
    def measured_anything(self) -> bool:
        return self.measured_weights_bytes is not None
