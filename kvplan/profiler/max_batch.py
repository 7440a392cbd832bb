"""--find-max-batch: the largest batch that runs prefill and decode at ctx on the GPU, found by doubling and
bisection, beside kvplan's capacity for the transformers engine on the same GPU memory."""

from kvplan.model import ModelSpec
from kvplan.profiler import runtime
from kvplan.profiler.results import MaxBatch, Trial
from kvplan.profiler.session import Progress, Session

MAX_BATCH_TOLERANCE = 0.05  # predicted max batch within 5% of the measured one
MAX_BATCH_LIMIT = 1 << 14


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


def find_max_batch(session: Session, probe, spec: ModelSpec, source, ctx: int, batch: int, prompt: int,
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
