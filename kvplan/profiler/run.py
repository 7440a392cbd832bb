"""The profile itself: build the model, prefill N - S tokens, decode S, measure, and set kvplan's prediction (the
`transformers` engine's, for the same model, layers, ctx, batch and dtype) beside every measured figure.

Measured:
    cache          every tensor of the cache object after prefill and after decode, shared storage once
                   (storage bytes: the memory held; view bytes: what the cache exposes)
    weights        parameter storage (tied embeddings once); buffers apart
    allocator      torch.cuda memory_allocated / max_memory_allocated / memory_reserved around each phase
    driver         NVML device used memory and this process's used memory
    time           time to first token (prefill and first token) and decode tokens/s; on a catalogue GPU the
                   bandwidth the decode steps reached beside the speed model's bound (`bandwidth.py`)
Predicted: weights = kvplan.memory.weights_bytes in the profile dtype; KV = TransformersPool.bytes_held and
bytes_after_prefill; activations = the prefill's peak (engines.PrefillActivations) and the decode phase's above its
cache (`decode_above_cache`), and on a GPU the BLAS workspace; the allocator's reserve = the run's allocations
replayed through torch's caching allocator (the pool's DeviceRun, as capacity plans it, with
PYTORCH_CUDA_ALLOC_CONF's expandable_segments as set); CUDA context = what the process holds outside the allocator
under this CUDA runtime (engines.transformers_engine.CUDA_CONTEXT); total = the reserve + the CUDA context, or, for a
model whose allocations kvplan does not replay, the peak of live tensors (`Prediction.live_peak`) + the CUDA
context.
"""

import inspect
import math
import os
import platform
import statistics
from collections import Counter
from contextlib import contextmanager, nullcontext

from pydantic import BaseModel

from kvplan import engines
from kvplan.capacity import gpu_layers
from kvplan.dtypes import FLOAT_DTYPES, kv_dtype
from kvplan.engines.transformers_engine import CUDA_CONTEXT, PLANNED_RUNTIME, cuda_context
from kvplan.errors import KvplanError
from kvplan.memory import kind_label, weights_bytes
from kvplan.model import ModelSpec
from kvplan.profiler import config as profile_config
from kvplan.profiler import runtime
from kvplan.profiler.bandwidth import DecodeBandwidth, decode_bandwidth

TOTAL_TOLERANCE = 0.03  # total VRAM within 3%
MAX_BATCH_TOLERANCE = 0.05  # predicted max batch within 5% of the measured one
MAX_BATCH_LIMIT = 1 << 14
RECOMPUTE_STEPS = 16  # timed steps per length and way: enough for a median and its p10-p90 spread
RECOMPUTE_WARMUP = 2  # untimed steps per length and way first: kernels chosen, memory allocated
RECOMPUTE_SHORTEST = RECOMPUTE_WARMUP + RECOMPUTE_STEPS + 1  # a prompt of one token, then the steps


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


# ------------------------------------------------------------------------------------------------ progress


class Progress:
    """What the profile tells while it runs; the CLI gives a progress bar or lines, tests and --json nothing."""

    def notice(self, text: str) -> None:
        """Something to know before a long run starts."""

    @contextmanager
    def phase(self, description: str, total: int | None = None):
        yield lambda steps=1: None


# ---------------------------------------------------------------------------------------------- prediction


class Prediction(BaseModel):
    kv: int
    kv_after_prefill: int
    weights: int
    activations: int  # the prefill's peak above the cache it filled
    decode_above_cache: int  # the decode phase's peak above the cache it ends with
    workspace: int  # cuBLAS's workspace, allocated by the first matmul on a GPU and kept
    reserved: int | None  # torch's memory_reserved after decode, where kvplan replays the model's allocations
    cuda_context: int
    by_kind: dict[str, tuple[int, int]]  # kind label -> (layers, bytes)
    notes: list[str]  # what the activation figure rests on

    @property
    def activations_and_other(self) -> int:
        """The measured component's counterpart: the larger of the two phases' peaks above their cache, and the
        workspace held through both."""
        return max(self.activations, self.decode_above_cache) + self.workspace

    @property
    def live_peak(self) -> int:
        """The peak of live tensors: the weights, the workspace, and the larger of the prefill's (its cache and
        activations) and the decode phase's (the final cache and what a step holds above it)."""
        return self.weights + self.workspace + max(self.kv_after_prefill + self.activations,
                                                   self.kv + self.decode_above_cache)

    @property
    def total(self) -> int:
        """The process's device memory once it has decoded: what torch's allocator reserves (it keeps the prefill's
        peak and its splits cached) and the CUDA context; the live peak where the allocations are not replayed."""
        return (self.live_peak if self.reserved is None else self.reserved) + self.cuda_context


def transformers_engine(version: str, cache: str, gpu_name: str | None = None,
                        expandable_segments: bool = False) -> engines.Engine:
    """The `transformers` engine at the installed release (its numeric part: 5.24.0.dev0 -> 5.24.0), on this GPU."""
    numeric = runtime.release(version)
    options = engines.EngineOptions(version=".".join(map(str, numeric)) or None,
                                    cache_implementation="static" if cache == "static" else None,
                                    expandable_segments=expandable_segments or None)
    return engines.engine("transformers", options, gpu_name)


def expandable_segments(setting: str | None) -> bool:
    """Whether PYTORCH_CUDA_ALLOC_CONF turns expandable segments on ("expandable_segments:True", among other
    comma-separated key:value options, as c10's allocator config parses them)."""
    pairs = (part.split(":", 1) for part in (setting or "").split(",") if ":" in part)
    return any(key.strip() == "expandable_segments" and value.strip() == "True" for key, value in pairs)


def predict(spec: ModelSpec, ctx: int, batch: int, prompt: int, dtype: str, engine: engines.Engine,
            device: str = "cuda", cuda: str | None = None) -> Prediction:
    """The transformers engine's prediction for the (cut) model on `device`: KV after decode and after prefill, per
    kind, the prefill's activations and the decode phase's peak, and on a GPU the BLAS workspace and what torch's
    allocator reserves for the run (`TransformersPool.device`, as capacity plans it) under CUDA runtime `cuda`
    ("13.0"; None: the runtime kvplan plans for)."""
    kv = kv_dtype(dtype)
    caches = engine.cached_layers(spec)
    pool = engine.pool(gpu_layers(caches, [spec.num_layers], 1)[0], spec, kv)
    kinds = layer_kinds(spec, caches, engine, kv)
    by_kind: dict[str, tuple[int, int]] = {}
    for kind, count in Counter(kinds).items():
        layers, size = by_kind.get(kind.label, (0, 0))
        by_kind[kind.label] = (layers + count, size + count * kind.pool.bytes_held(batch, ctx))
    activations = pool.activations if device.startswith("cuda") else engines.PrefillActivations(spec, kv, device)
    kv_held, kv_after_prefill = pool.bytes_held(batch, ctx), pool.bytes_after_prefill(batch, prompt, ctx)
    workspace = engine.blas_workspace() if device.startswith("cuda") else 0
    run = pool.device if device.startswith("cuda") else None
    if run is None:
        prefill = activations.peak(batch, prompt)
        decode = max(decode_above_cache(kinds, batch, prompt, ctx), activations.decode_step(batch))
    else:  # the replayed allocations' own peaks, the same events as the reserve
        prefill_peak, decode_peak = run.live_peaks(batch, prompt, ctx - prompt)
        prefill, decode = prefill_peak - kv_after_prefill - workspace, decode_peak - kv_held - workspace
    return Prediction(kv=kv_held, kv_after_prefill=kv_after_prefill, weights=weights_bytes(spec, dtype)[0],
                      activations=prefill, decode_above_cache=decode, workspace=workspace,
                      reserved=None if run is None else run.reserved(batch, prompt, ctx - prompt),
                      cuda_context=cuda_context(runtime_major(cuda)), by_kind=by_kind, notes=activations.notes())


def runtime_major(cuda: str | None) -> int:
    """The major version of a CUDA runtime ("13.0" -> 13); the one kvplan plans for where unknown."""
    major = (cuda or "").split(".")[0]
    return int(major) if major.isdigit() else PLANNED_RUNTIME


def decode_above_cache(kinds: list["LayerKind"], batch: int, prompt: int, ctx: int) -> int:
    """The decode phase's peak above the cache it ends with. A layer's update makes its new tensors before it lets
    go of the old, so a step peaks at some layer, those before it updated, those after it not. A DynamicCache's
    full layer concatenates its keys, then its values, each replacing the old (`DynamicLayer.update`); a sliding
    layer makes both before either replaces the old, and on the first step cuts the whole prompt it held to its
    window (`DynamicSlidingWindowLayer.update`); a StaticCache writes in place. So the first step starts from the
    cache right after prefill, the last ends at the final cache: the peak is at one of them. For a sliding model
    it is the first, the prompt's keys and values on every sliding layer above the windows they keep."""
    first = {kind: (kind.pool.bytes_after_prefill(batch, prompt, ctx), kind.pool.bytes_held(batch, prompt + 1),
                    _update_bytes(kind.pool, batch, prompt + 1)) for kind in set(kinds)}
    last = {kind: (kind.pool.bytes_held(batch, ctx - 1), kind.pool.bytes_held(batch, ctx),
                   _update_bytes(kind.pool, batch, ctx)) for kind in set(kinds)}
    final = sum(last[kind][1] for kind in kinds)
    return max(_step_peak(kinds, first), _step_peak(kinds, last)) - final


def _update_bytes(pool: engines.KVPool, batch: int, tokens: int) -> int:
    """What a layer's cache update makes before it frees the tensors it replaces: nothing in a StaticCache; one of
    a full layer's keys and values (alike in size); the whole of any other cache."""
    if pool.static:
        return 0
    held = pool.bytes_held(batch, tokens)
    return held // 2 if all(row.kind == "full" for row in pool.table) else held


def _step_peak(kinds: list["LayerKind"], sizes: dict) -> int:
    """One decode step over the layers in order: each holds `before` until its update makes `new` beside it, then
    holds `after`."""
    held = peak = sum(sizes[kind][0] for kind in kinds)
    for kind in kinds:
        before, after, new = sizes[kind]
        peak = max(peak, held + new)
        held += after - before
    return peak


class LayerKind:
    """Layers that cache alike: kvplan's label for them and the transformers pool of one such layer alone."""

    def __init__(self, label: str, pool: engines.KVPool):
        self.label, self.pool = label, pool


def layer_kinds(spec: ModelSpec, caches, engine: engines.Engine, kv) -> list[LayerKind]:
    """The kind of each layer, in layer order, from the engine's `caches`; alike layers share one LayerKind, so the
    prediction's time grows with the layers, not their square (a pool reads the whole model)."""
    stored = layer_caches(caches)
    kinds: dict[tuple, LayerKind] = {}
    out = []
    for index, originals in layer_caches(spec.caches).items():
        own = stored.get(index, [])
        key = (tuple(c.alike_key() for c in originals), tuple(c.alike_key() for c in own))
        if key not in kinds:
            pool = engine.pool([(c.model_copy(update={"layer": 0}), 1) for c in own], spec, kv)
            kinds[key] = LayerKind(layer_label(originals), pool)
        out.append(kinds[key])
    return out


# ---------------------------------------------------------------------------------------------- the run


class Session:
    """One model built on one device, ready for prefill and decode runs. A model whose forward takes the whole
    sequence at every cached step (`engines.Transformers.WHOLE_SEQUENCE_DECODE`) is fed it, as generate() does:
    the session keeps the sequence of its latest run."""

    def __init__(self, torch, transformers, model, device: str, vocab: int, cache: str, ctx: int,
                 whole_sequence: bool = False):
        self.torch, self.transformers, self.model = torch, transformers, model
        self.device, self.vocab, self.cache, self.ctx = device, vocab, cache, ctx
        self.whole_sequence, self.sequence = whole_sequence, None
        self.forwards = 0  # forward passes run
        parameters = inspect.signature(model.forward).parameters
        self.logits_to_keep = "logits_to_keep" in parameters
        self.cache_name = runtime.cache_argument(transformers, model)
        self.generator = torch.Generator(device=device).manual_seed(1)

    def new_cache(self):
        return runtime.new_cache(self.transformers, self.model, self.ctx if self.cache == "static" else None)

    def tokens(self, batch: int, length: int):
        return self.torch.randint(0, self.vocab, (batch, length), device=self.device, generator=self.generator)

    def prefill(self, ids, cache):
        """The prompt's forward pass: the next token of each sequence."""
        self.sequence = ids
        return self.forward(ids, cache)

    def step(self, token, cache):
        """One cached decode step on the token just made (or on the whole sequence so far)."""
        if not self.whole_sequence:
            return self.forward(token, cache)
        self.sequence = self.torch.cat([self.sequence, token], dim=-1)
        return self.forward(self.sequence, cache)

    def forward(self, ids, cache=None, last_only: bool = True):
        """The next token of each sequence; an OOM propagates (a finding), any other failure of the model's code
        becomes a one-line error."""
        kwargs = {"logits_to_keep": 1} if last_only and self.logits_to_keep else {}
        self.forwards += 1
        try:
            if cache is None:
                out = self.model(input_ids=ids, use_cache=False, **kwargs)
            elif isinstance(cache, runtime.ModelCache):  # the model's own cache: made by the first forward
                out = self.model(input_ids=ids, use_cache=True, **{cache.argument: cache.value}, **kwargs)
                cache.value = getattr(out, cache.argument)
            else:
                out = self.model(input_ids=ids, use_cache=True, **{self.cache_name: cache}, **kwargs)
        except Exception as err:
            if runtime.is_oom(self.torch, err):
                raise
            raise runtime.failed(self.transformers, f"running {self.model.config.model_type} on {ids.shape[0]:,} x "
                                 f"{ids.shape[1]:,} tokens", err) from None
        return out.logits[:, -1:].argmax(-1)


def run_profile(model: str, ctx: int, batch: int = 1, *, device: str = "cpu", dtype: str | None = None,
                layers: int | None = None, decode_steps: int = 32, cache: str = "dynamic",
                find_max_batch: bool = False, compare_recompute: bool = False, revision: str | None = None,
                token: str | None = None, progress: Progress | None = None) -> Profile:
    """Profile `model` at `ctx` tokens per sequence and `batch` sequences; see the module docstring."""
    progress = progress or Progress()
    if batch < 1:
        raise KvplanError(f"--batch must be at least 1, got {batch}")
    if not 1 <= decode_steps < ctx:
        raise KvplanError(f"--decode-steps must be at least 1 and below --ctx ({ctx:,}) so that a prompt is left "
                          f"to prefill, got {decode_steps}")
    if compare_recompute and ctx < RECOMPUTE_SHORTEST:
        raise KvplanError(f"--compare-recompute decodes {RECOMPUTE_WARMUP} untimed and {RECOMPUTE_STEPS} timed steps "
                          f"after a prompt: --ctx must be at least {RECOMPUTE_SHORTEST}, got {ctx:,}")
    if cache not in ("dynamic", "static"):
        raise KvplanError(f"--cache-implementation is dynamic or static, got {cache!r}")
    if dtype is not None and dtype not in FLOAT_DTYPES:
        raise KvplanError(f"--dtype is one of {', '.join(FLOAT_DTYPES)}: random weights are made in a float "
                          f"dtype, got {dtype!r}")
    source = profile_config.resolve(model, revision, token)
    data, spec = profile_config.first_layers(source, layers)
    model_type, fields, notes = profile_config.transformers_fields(data)
    torch, transformers = runtime.imports()
    device = runtime.check_device(torch, device)
    if find_max_batch and not device.startswith("cuda"):
        raise KvplanError("--find-max-batch searches the GPU's memory: use --device cuda")
    dtype = dtype or ("bf16" if spec.dtype not in FLOAT_DTYPES else spec.dtype)
    prompt = ctx - decode_steps
    cuda = torch.version.cuda if device.startswith("cuda") else None
    probe = runtime.Probe(torch, device)
    expandable = bool(cuda) and expandable_segments(os.environ.get("PYTORCH_CUDA_ALLOC_CONF"))
    engine = transformers_engine(transformers.__version__, cache, probe.gpu_name, expandable)
    predicted = predict(spec, ctx, batch, prompt, dtype, engine, device, cuda)
    if device == "cpu":
        _check_ram(predicted, source.name, spec.num_layers)
    config = runtime.make_config(transformers, model_type, fields)
    result = Profile(
        model=source.name, architecture=spec.architecture, layers=spec.num_layers,
        total_layers=source.spec.num_layers, ctx=ctx, batch=batch, prompt_tokens=prompt, decode_steps=decode_steps,
        device=device, device_name=probe.gpu_name or _cpu_name(), dtype=dtype, cache_implementation=cache,
        torch_version=torch.__version__, transformers_version=transformers.__version__,
        cuda_version=cuda, driver_version=probe.driver, gpu_memory_bytes=probe.gpu_total, model_class="",
        predicted_kv_bytes=predicted.kv, predicted_kv_after_prefill_bytes=predicted.kv_after_prefill,
        predicted_weights_bytes=predicted.weights, predicted_activation_bytes=predicted.activations_and_other,
        predicted_prefill_activation_bytes=predicted.activations + predicted.workspace,
        predicted_decode_above_cache_bytes=predicted.decode_above_cache + predicted.workspace,
        predicted_reserved_bytes=predicted.reserved, predicted_cuda_context_bytes=predicted.cuda_context,
        predicted_total_bytes=predicted.total, notes=[*notes, *spec.notes, *predicted.notes],
    )
    if expandable:
        result.notes.append("PYTORCH_CUDA_ALLOC_CONF sets expandable_segments:True: predicted for it")
    if spec.max_context and ctx > spec.max_context:
        result.notes.append(f"ctx {ctx:,} is beyond {source.name}'s max context of {spec.max_context:,} tokens: "
                            "the cache is measured all the same, but the model was not trained for it")
    if spec.num_layers < source.spec.num_layers:
        result.notes.append(f"first {spec.num_layers} of {source.spec.num_layers} layers (--layers): the "
                            "prediction is cut the same way")
        missing = profile_config.kinds_left_out(source.spec, spec.num_layers)
        if missing:
            result.findings.append(f"the first {spec.num_layers} layers hold no {' or '.join(missing)} layer, so "
                                   "none is measured: --layers "
                                   f"{profile_config.representative_layers(source.spec) or source.spec.num_layers} "
                                   "keeps every kind")
    result.memory.append(probe.snapshot("start"))
    times: dict[str, float] = {}
    session = None
    oom = None
    try:
        with progress.phase(f"building {source.name} on {device} ({dtype}, random weights)"):
            with runtime.timed(torch, device, times, "build"):
                built = runtime.build(torch, transformers, config, device, dtype)
        session = Session(torch, transformers, built, device, int(config.get_text_config().vocab_size), cache, ctx,
                          whole_sequence=spec.architecture in engines.Transformers.WHOLE_SEQUENCE_DECODE)
        result.model_class = type(built).__name__
        result.attn_implementation = getattr(built.config, "_attn_implementation", None)
        result.build_s = times["build"]
        result.measured_weights_bytes, result.measured_buffer_bytes = runtime.model_bytes(built)
        result.memory.append(probe.snapshot("after build"))
        if device == "cpu":
            progress.notice(_cpu_time_notice(session, spec, result, compare_recompute))
        _decode_run(session, probe, result, predicted, spec, progress, times)
        if device.startswith("cuda") and result.decode_tokens_per_s:
            result.decode_bandwidth = decode_bandwidth(spec, result.device_name, dtype, batch, prompt, decode_steps,
                                                       result.decode_tokens_per_s)
            if result.decode_bandwidth is None:
                result.notes.append(f"{result.device_name} is not in the GPU catalogue (`kvplan gpus`): its "
                                    "bandwidth, and the decode steps' share of it, are unknown")
        if compare_recompute:
            result.recompute = _compare_recompute(session, probe, ctx, progress)
        if find_max_batch:
            result.max_batch = _find_max_batch(session, probe, spec, source, ctx, batch, prompt, decode_steps,
                                               dtype, engine, progress)
    except Exception as err:  # an OOM is a finding; its traceback (and the tensors it holds) goes here
        if not runtime.is_oom(torch, err):
            probe.close()
            raise
        oom = _oom_line(err)
    session = built = None
    runtime.free(torch, device)
    probe.close()
    if oom is not None:
        if not result.measured_anything:
            raise KvplanError(f"CUDA out of memory building {source.name} ({spec.num_layers} layers, {dtype}) on "
                              f"{result.device_name}: use --layers to build fewer layers ({oom})")
        result.findings.append(f"CUDA out of memory at batch {batch:,} x {ctx:,} tokens: {oom} (memory "
                               "freed; the figures are those measured before it)")
    result.notes.extend(probe.notes)
    result.notes.extend(_context_notes(result))
    _judge(result, predicted)
    return result


CONTEXT_TOLERANCE = 0.05  # a measured CUDA context this far from kvplan's figure is worth saying


def _context_notes(result: Profile) -> list[str]:
    """What the run measured outside torch's allocator, beside the figure kvplan uses for this CUDA runtime, where
    kvplan has none of its own for the runtime or the two differ."""
    measured = result.measured_non_torch_bytes
    if measured is None:
        return []
    runtime = runtime_major(result.cuda_version)
    at_start = result.measured_cuda_context_bytes
    start = f" ({at_start:,} B before the first allocation)" if at_start is not None else ""
    if runtime not in CUDA_CONTEXT:
        return [f"CUDA {result.cuda_version}: kvplan has no measurement of its own for this runtime and assumes "
                f"{result.predicted_cuda_context_bytes:,} B outside torch's allocator; this run measured "
                f"{measured:,} B{start}"]
    if abs(measured - result.predicted_cuda_context_bytes) > CONTEXT_TOLERANCE * measured:
        return [f"outside torch's allocator this run measured {measured:,} B{start}; kvplan uses "
                f"{result.predicted_cuda_context_bytes:,} B for CUDA {runtime}, measured on an H100"]
    return []


CPU_PILOTS = (64, 256)  # prompt tokens of the two pilot prefills that time a CPU profile before it runs
CPU_PROBE = 1024  # matrix size of the dtype probe: a CPU's GEMM rate, not a small matrix's


def _cpu_time_notice(session: Session, spec: ModelSpec, result: Profile, compare_recompute: bool) -> str:
    """What a CPU profile will cost, timed on the model just built: two pilot prefills (after an untimed one of up
    to 16 tokens that pays for the first call's allocations) give a forward pass's fixed cost and its cost per
    unit of work (`_work`), which scale to the run's prompt; a pilot decode step times the decode. A rate measured
    on one small matrix, times the FLOPs, said 17 s for a prefill that took 111 s: a CPU's rate depends on the
    shapes and its load, a forward pass is more than its matmuls (norms in fp32), and in bf16 oneDNN reorders every
    weight on every call, a cost per pass that does not grow with the prompt. Where this CPU runs the profile dtype
    much slower than fp32 (no AVX512-BF16 or AMX: emulated), it says so."""
    import time

    torch, batch = session.torch, result.batch
    long = min(CPU_PILOTS[1], result.prompt_tokens)
    short = max(1, min(CPU_PILOTS[0], long // 4))
    timed = {}
    with torch.inference_mode():
        session.forward(session.tokens(batch, min(16, long)), None)
        for tokens in (short, long):
            cache = session.new_cache()
            start = time.perf_counter()
            token = session.prefill(session.tokens(batch, tokens), cache)
            timed[tokens] = time.perf_counter() - start
        start = time.perf_counter()
        session.step(token, cache)
        step = time.perf_counter() - start
    del cache
    works = {tokens: _work(spec, batch, tokens) for tokens in (short, long)}
    per_work = max(timed[long] - timed[short], 0.0) / (works[long] - works[short]) if long > short else 0.0
    fixed = max(timed[short] - per_work * works[short], 0.0)

    def prefill_s(sequences: int, tokens: int) -> float:
        return fixed + per_work * _work(spec, sequences, tokens) if per_work else timed[long] * tokens / long

    result.estimated_prefill_s = prefill_s(batch, result.prompt_tokens)
    result.estimated_decode_s = step * result.decode_steps
    total = result.estimated_prefill_s + result.estimated_decode_s
    if compare_recompute:  # per length, each way's steps at batch 1: a cached step, a forward of the whole sequence
        runs = RECOMPUTE_WARMUP + RECOMPUTE_STEPS
        total += sum(runs * (step + prefill_s(1, length)) for length in recompute_lengths(result.ctx))
    text = (f"a CPU profile: about {_duration(total)} here (prefill {_duration(result.estimated_prefill_s)}, "
            f"decode {_duration(result.estimated_decode_s)}), timed on pilot prefills of {short:,} and {long:,} "
            "tokens of the model just built")
    rates = {name: _matmul_rate(torch, name) for name in dict.fromkeys((result.dtype, "fp32"))}
    if result.dtype != "fp32" and rates["fp32"] > 1.5 * rates[result.dtype]:
        text += (f"; this CPU runs {result.dtype} matmuls at {rates[result.dtype] / 1e9:,.0f} GFLOP/s and fp32 at "
                 f"{rates['fp32'] / 1e9:,.0f}: --dtype fp32 is faster here")
    if total > 60:
        text += "; --layers N builds fewer layers and cuts the time in proportion"
    return text


def _work(spec: ModelSpec, batch: int, tokens: int) -> float:
    """FLOPs of a prefill of `tokens` per sequence: 2 x the layers' active parameters per token (embeddings are
    lookups, and one token's logits are computed), and on each attention layer 4 x heads x head_dim per token pair
    it computes: half of them under a causal mask, all of them where a window mask is passed (SDPA then computes
    every block)."""
    layers = spec.params.active - spec.params.embedding - spec.params.lm_head
    pairs = 0.0
    for cache in spec.caches:
        if cache.kind in ("full", "sliding", "chunked"):
            window = cache.chunk if cache.kind == "chunked" else getattr(cache, "window", None)
            pairs += cache.head_dim * (tokens**2 if window and tokens >= window else tokens**2 / 2)
    return batch * (2 * layers * tokens + 4 * spec.num_attention_heads * pairs)


def _matmul_rate(torch, dtype: str) -> float:
    """FLOP/s of a CPU_PROBE-square matmul in `dtype`, best of a few runs."""
    import time

    a = torch.ones(CPU_PROBE, CPU_PROBE, dtype=getattr(torch, runtime.TORCH_DTYPES[dtype]))
    best = math.inf
    for _ in range(3):
        start = time.perf_counter()
        a @ a
        best = min(best, time.perf_counter() - start)
    return 2 * CPU_PROBE**3 / max(best, 1e-9)


def _duration(seconds: float) -> str:
    if seconds < 1:
        return "under a second"
    return f"{seconds:,.0f} s" if seconds < 120 else f"{seconds / 60:,.0f} min"


def _check_ram(predicted: Prediction, name: str, layers: int) -> None:
    """On the CPU a run larger than the free memory is killed by the kernel, with no error to report: refuse it
    first, from the prediction (weights + the KV and activation peak)."""
    available = runtime.available_ram()
    need = predicted.live_peak
    if available is not None and need > available:
        raise KvplanError(f"profiling {name} ({layers} layers) on the CPU needs about {need / 2**30:,.1f} GiB "
                          f"(weights {predicted.weights / 2**30:,.1f} GiB) and {available / 2**30:,.1f} GiB is free: "
                          "keep fewer layers with --layers, or lower --batch or --ctx")


def _decode_run(session: Session, probe, result: Profile, predicted: Prediction, spec: ModelSpec,
                progress: Progress, times: dict) -> None:
    """Prefill the prompt, decode the steps; the cache measured after each, the allocator around each."""
    torch, device, batch = session.torch, session.device, result.batch
    built_allocated = result.memory[-1].allocated
    cache = session.new_cache()
    ids = session.tokens(batch, result.prompt_tokens)
    # torch.cuda counts the allocator's peak on a GPU; on the CPU the allocator's own records (allocator_peak)
    counted = runtime.allocator_peak if not device.startswith("cuda") else lambda torch: nullcontext()
    with torch.inference_mode():
        with progress.phase(f"prefill: {batch:,} x {result.prompt_tokens:,} tokens"):
            probe.reset_peak()
            with runtime.timed(torch, device, times, "prefill"), counted(torch) as prefill:
                token = session.prefill(ids, cache)
        result.ttft_s = times["prefill"]
        result.prefill_tokens_per_s = batch * result.prompt_tokens / times["prefill"]
        result.cache_class = type(runtime.cache_object(cache)).__name__
        after_prefill = runtime.cache_layers(cache, session.model)
        result.measured_kv_after_prefill_bytes = sum(layer.kv_storage for layer in after_prefill)
        snap = probe.snapshot("after prefill")
        result.memory.append(snap)
        # allocated above the built model: at the prefill's peak, and once it is done
        peak, held = (snap.max_allocated - built_allocated, snap.allocated - built_allocated) if prefill is None \
            else (prefill.peak, prefill.net)
        result.measured_prefill_activation_bytes = peak - result.measured_kv_after_prefill_bytes
        with progress.phase(f"decode: {result.decode_steps:,} steps", total=result.decode_steps) as advance:
            probe.reset_peak()
            with runtime.timed(torch, device, times, "decode"), counted(torch) as decode:
                for _ in range(result.decode_steps):
                    token = session.step(token, cache)
                    advance()
        result.decode_tokens_per_s = batch * result.decode_steps / times["decode"]
    final = runtime.cache_layers(cache, session.model)
    result.measured_kv_bytes = sum(layer.kv_storage for layer in final)
    result.measured_kv_view_bytes = sum(layer.kv_view for layer in final)
    result.cache_bookkeeping_bytes = sum(layer.storage.get("bookkeeping", 0) for layer in final)
    snap = probe.snapshot("after decode")
    result.memory.append(snap)
    peak = snap.max_allocated - built_allocated if decode is None else held + decode.peak
    result.measured_decode_above_cache_bytes = peak - result.measured_kv_bytes
    result.measured_activation_peak_bytes = max(result.measured_prefill_activation_bytes,
                                                 result.measured_decode_above_cache_bytes)
    if snap.reserved is not None:
        result.measured_reserved_bytes = snap.reserved
        result.measured_cuda_context_bytes = result.memory[0].process_used
    if snap.process_used is not None:
        result.measured_non_torch_bytes = snap.process_used - snap.reserved
        result.measured_total_bytes = snap.process_used
    elif snap.device_used is not None and result.memory[0].device_used is not None:
        result.measured_total_bytes = snap.device_used - result.memory[0].device_used
        result.measured_non_torch_bytes = result.measured_total_bytes - snap.reserved
    result.by_kind = _by_kind(final, spec.caches, predicted, result)


def layer_caches(caches) -> dict[int, list]:
    """The caches of each layer, in layer order: transformers keeps one cache layer per decoder layer, holding
    both caches of a layer that has two (MLA and its indexer keys, attention beside a Mamba mixer)."""
    out: dict[int, list] = {}
    for cache in caches:
        out.setdefault(cache.layer, []).append(cache)
    return out


def layer_label(caches) -> str:
    return " + ".join(kind_label(c) for c in caches)


def _by_kind(final, spec_caches, predicted: Prediction, result: Profile) -> list[KindRow]:
    """Measured layers grouped as the prediction groups them (kvplan's kind labels, in layer order)."""
    rows: dict[str, KindRow] = {}
    by_layer = list(layer_caches(spec_caches).values())
    for layer, caches in zip(final, by_layer, strict=False):
        label = layer_label(caches)
        layers, size = predicted.by_kind.get(label, (0, 0))
        row = rows.setdefault(label, KindRow(kind=label, layers=layers, tokens_measured=layer.tokens,
                                             predicted=size, measured=0, measured_view=0,
                                             cache_layer_class=layer.layer_class, dtypes=[]))
        row.measured += layer.kv_storage
        row.measured_view += layer.kv_view
        row.dtypes = sorted(set(row.dtypes) | layer.dtypes)
        if layer.layer_class not in row.cache_layer_class.split(", "):
            row.cache_layer_class += f", {layer.layer_class}"
    if len(final) != len(by_layer):
        result.findings.append(f"the cache has {len(final)} layers; kvplan's layout has {len(by_layer)}")
    return list(rows.values())


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


def _oom_line(err: BaseException) -> str:
    return str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__


# ---------------------------------------------------------------------------------------------- verdict


def _judge(result: Profile, predicted: Prediction) -> None:
    comps = [Component.of("weights", predicted.weights, result.measured_weights_bytes),
             Component.of("KV after decode", predicted.kv, result.measured_kv_bytes),
             Component.of("KV right after prefill", predicted.kv_after_prefill,
                          result.measured_kv_after_prefill_bytes),
             Component.of("activations and other (peak)", predicted.activations_and_other,
                          result.measured_activation_peak_bytes),
             Component.of("allocator reserved", predicted.reserved, result.measured_reserved_bytes),
             Component.of("CUDA context and non-torch", predicted.cuda_context, result.measured_non_torch_bytes),
             Component.of("total", predicted.total, result.measured_total_bytes)]
    result.components = comps
    parts = []
    if result.measured_kv_bytes is not None:
        kv_ok = result.measured_kv_bytes == predicted.kv and (
            result.measured_kv_after_prefill_bytes in (None, predicted.kv_after_prefill))
        result.kv_exact = kv_ok
        parts.append("KV cache: measured = predicted to the byte" if kv_ok else
                     f"KV cache: predicted {_signed(comps[1])}, after prefill {_signed(comps[2])}")
    if comps[0].measured is not None:
        parts.append("weights: exact" if comps[0].error_bytes == 0 else f"weights: {_signed(comps[0])}")
    if comps[3].measured is not None:
        parts.append(f"activations: {_signed(comps[3])}")
    total = comps[-1]
    if total.measured is not None:
        within = abs(total.error_bytes) <= TOTAL_TOLERANCE * total.measured
        parts.append(f"total: {_signed(total)} ({'within' if within else 'outside'} the 3% target)")
    elif result.measured_kv_bytes is not None and not result.device.startswith("cuda"):
        parts.append("total: not measured on the CPU (allocator and driver figures are CUDA's)")
    if result.max_batch is not None:
        mb = result.max_batch
        parts.append(f"max batch: measured {mb.measured:,}, predicted {mb.predicted:,}")
    result.verdict = "; ".join(parts) if parts else "nothing measured"


def _signed(comp: Component) -> str:
    if comp.error_bytes is None:
        return "n/a"
    if comp.error_bytes == 0:
        return "exact"
    pct = f", {comp.error_pct:+.2f}%" if comp.error_pct is not None else ""
    return f"off by {comp.error_bytes:+,} B{pct}"


# ---------------------------------------------------------------------------------------------- --compare-recompute


def recompute_lengths(ctx: int) -> list[int]:
    """A quarter, half and all of ctx, each long enough for a prompt, the warm-up and the timed steps."""
    return sorted({max(RECOMPUTE_SHORTEST, ctx // 4), max(RECOMPUTE_SHORTEST, ctx // 2), ctx})


def _compare_recompute(session: Session, probe, ctx: int, progress: Progress) -> list[RecomputeRow]:
    """At each length, the sequence reaches it by RECOMPUTE_WARMUP untimed and then RECOMPUTE_STEPS timed steps:
    with the cache (one token a step), then recomputing the whole sequence (use_cache=False) from the same prompt.
    The first steps at a length pay for choosing kernels and allocating (timed with them, the cached time per token
    fell as the context grew: an H100's 0.274 s at 2k and 0.038 s at 8k for Llama-3-8B), so only the later ones
    are timed, each on its own."""
    torch, device = session.torch, session.device
    lengths = recompute_lengths(ctx)
    per_length = RECOMPUTE_WARMUP + RECOMPUTE_STEPS
    rows = []
    with torch.inference_mode(), progress.phase("cache vs recompute", total=2 * len(lengths) * per_length) as advance:
        for length in lengths:
            ids = session.tokens(1, length - per_length)
            cache = session.new_cache()
            cached, warm_cached = _timed_steps(session, _cached_steps(session, ids, cache), advance)
            cache_bytes = sum(layer.kv_storage for layer in runtime.cache_layers(cache, session.model))
            del cache
            runtime.free(torch, device)
            base = probe.snapshot("recompute").allocated
            probe.reset_peak()
            recompute, warm_recompute = _timed_steps(session, _recompute_steps(session, ids), advance)
            peak = probe.snapshot("recompute").max_allocated
            rows.append(RecomputeRow(
                tokens=length, steps=RECOMPUTE_STEPS, warmup_steps=min(warm_cached, warm_recompute),
                cached=cached, recompute=recompute, speedup=recompute.median / cached.median,
                speedup_low=recompute.p10 / cached.p90, speedup_high=recompute.p90 / cached.p10,
                cache_bytes=cache_bytes, recompute_peak_bytes=None if peak is None else peak - base))
    return rows


def _cached_steps(session: Session, ids, cache):
    """Prefill `ids`, then one cached decode step per iteration."""
    token = session.prefill(ids, cache)
    while True:
        yield
        token = session.step(token, cache)


def _recompute_steps(session: Session, ids):
    """One forward of the whole sequence so far per iteration (no cache), the token it makes appended."""
    sequence = ids
    while True:
        yield
        sequence = session.torch.cat([sequence, session.forward(sequence, None)], dim=-1)


def _timed_steps(session: Session, steps, advance) -> tuple[Spread, int]:
    """RECOMPUTE_WARMUP untimed steps of the generator `steps` (started first: a prefill is no step), then
    RECOMPUTE_STEPS timed one by one (synchronised): the spread of the timed ones, and the forward passes the model
    ran in the untimed ones."""
    import time

    torch, device = session.torch, session.device
    next(steps)
    before = session.forwards
    for _ in range(RECOMPUTE_WARMUP):
        next(steps)
        advance()
    warm = session.forwards - before
    runtime.sync(torch, device)
    seconds = []
    for _ in range(RECOMPUTE_STEPS):
        start = time.perf_counter()
        next(steps)
        runtime.sync(torch, device)
        seconds.append(max(time.perf_counter() - start, 1e-9))
        advance()
    steps.close()  # lets go of the cache or sequence it holds
    return Spread.of(seconds), warm


# ---------------------------------------------------------------------------------------------- --find-max-batch


def search_max_batch(fits, limit: int = MAX_BATCH_LIMIT) -> int:
    """The largest batch for which fits(batch) holds (0 if not even 1): doubling, then bisection; fits is
    taken to be monotone, as memory is."""
    low, high = 0, 1
    while high <= limit and fits(high):
        low, high = high, high * 2
    high = min(high, limit + 1)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low


def _find_max_batch(session: Session, probe, spec: ModelSpec, source, ctx: int, batch: int, prompt: int,
                    steps: int, dtype: str, engine, progress: Progress) -> MaxBatch:
    """Double the batch until prefill and decode at ctx run out of memory, then bisect; each failure is caught
    and its memory freed. The prediction: kvplan's capacity for the transformers engine on the same GPU memory."""
    from kvplan.capacity import Hardware, Workload, capacity

    torch, device = session.torch, session.device
    trials: list[Trial] = []

    def run(size: int) -> None:
        probe.reset_peak()
        with torch.inference_mode():
            cache = session.new_cache()
            token = session.prefill(session.tokens(size, prompt), cache)
            for _ in range(steps):
                token = session.step(token, cache)

    def fits(size: int) -> bool:
        ok = True
        try:
            run(size)
        except Exception as err:  # leaving this block drops the traceback and the tensors its frames hold
            if not runtime.is_oom(torch, err):
                raise
            ok = False
        peak = probe.snapshot("trial").max_allocated if ok else None
        runtime.free(torch, device)
        trials.append(Trial(batch=size, fits=ok, peak_allocated=peak))
        return ok

    with progress.phase("searching the largest batch that fits"):
        low = search_max_batch(fits)
    memory = probe.gpu_total
    cap = capacity(spec, Workload(ctx=ctx), engine_name="transformers", options=engine.options,
                   hardware=Hardware(name=session.torch.cuda.get_device_name(device), memory_bytes=memory),
                   kv_dtype_name=dtype, weights_dtype_name=dtype, suggest=False)
    predicted = cap.max_concurrent_users
    error = 100.0 * (predicted - low) / low if low else None
    return MaxBatch(measured=low, predicted=predicted, error_pct=error, gpu_memory_bytes=memory, trials=trials,
                    within_target=None if error is None else abs(error) <= 100 * MAX_BATCH_TOLERANCE)

