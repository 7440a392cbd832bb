"""--compare-recompute: decode with the cache against recomputing the whole sequence for every token, at a quarter,
half and all of ctx, each step timed on its own after untimed warm-up steps."""

from kvplan.profiler import runtime
from kvplan.profiler.results import RecomputeRow, Spread
from kvplan.profiler.session import Progress, Session

RECOMPUTE_STEPS = 16  # timed steps per length and way: enough for a median and its p10-p90 spread
RECOMPUTE_WARMUP = 2  # untimed steps per length and way first: kernels chosen, memory allocated
RECOMPUTE_SHORTEST = RECOMPUTE_WARMUP + RECOMPUTE_STEPS + 1  # a prompt of one token, then the steps


def recompute_lengths(ctx: int) -> list[int]:
    """A quarter, half and all of ctx, each long enough for a prompt, the warm-up and the timed steps."""
    return sorted({max(RECOMPUTE_SHORTEST, ctx // 4), max(RECOMPUTE_SHORTEST, ctx // 2), ctx})


def compare_recompute(session: Session, probe, ctx: int, progress: Progress) -> list[RecomputeRow]:
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
    RECOMPUTE_STEPS timed one by one (`runtime.timed`: synchronised before and after): the spread of the timed ones,
    and the forward passes the model ran in the untimed ones."""
    torch, device = session.torch, session.device
    next(steps)
    before = session.forwards
    for _ in range(RECOMPUTE_WARMUP):
        next(steps)
        advance()
    warm = session.forwards - before
    seconds, times = [], {}
    for _ in range(RECOMPUTE_STEPS):
        with runtime.timed(torch, device, times, "step"):
            next(steps)
        seconds.append(max(times["step"], 1e-9))
        advance()
    steps.close()  # lets go of the cache or sequence it holds
    return Spread.of(seconds), warm
