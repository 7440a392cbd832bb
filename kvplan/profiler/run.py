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
Predicted (`prediction.py`): weights, KV after prefill and after decode, activations, the allocator's reserve, the
CUDA context and their total.

This module checks the request (on the CPU, the memory the run needs and the time it will take) and runs the
profile's parts in turn (`kvplan.profiler` lists them).
"""

import math
import os
import platform

from kvplan import engines
from kvplan.dtypes import FLOAT_DTYPES
from kvplan.errors import KvplanError
from kvplan.model import ModelSpec
from kvplan.profiler import config as profile_config
from kvplan.profiler import max_batch, recompute, runtime
from kvplan.profiler.bandwidth import decode_bandwidth
from kvplan.profiler.prediction import Prediction, expandable_segments, predict, transformers_engine
from kvplan.profiler.recompute import RECOMPUTE_SHORTEST, RECOMPUTE_STEPS, RECOMPUTE_WARMUP, recompute_lengths
from kvplan.profiler.results import Profile
from kvplan.profiler.session import Progress, Session, decode_run
from kvplan.profiler.verdict import context_notes, judge


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
        decode_run(session, probe, result, predicted, spec, progress, times)
        if device.startswith("cuda") and result.decode_tokens_per_s:
            result.decode_bandwidth = decode_bandwidth(spec, result.device_name, dtype, batch, prompt, decode_steps,
                                                       result.decode_tokens_per_s)
            if result.decode_bandwidth is None:
                result.notes.append(f"{result.device_name} is not in the GPU catalogue (`kvplan gpus`): its "
                                    "bandwidth, and the decode steps' share of it, are unknown")
        if compare_recompute:
            result.recompute = recompute.compare_recompute(session, probe, ctx, progress)
        if find_max_batch:
            result.max_batch = max_batch.find_max_batch(session, probe, spec, source, ctx, batch, prompt,
                                                        decode_steps, dtype, engine, progress)
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
    result.notes.extend(context_notes(result))
    judge(result, predicted)
    return result


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
