"""Capacity: how many users fit on one GPU or several, computed the way the serving engine allocates memory.

    KV budget per GPU = GPU memory x fraction - weights per GPU - overhead   (engine rules: kvplan.engines)
                        or exactly --kv-budget
    max users at ctx  = replicas x the largest N whose pool.peak_bytes(N, ctx) fits the budget on every stage
    max ctx for N     = the largest ctx whose pool.peak_bytes(N / replicas, ctx) fits it on every stage
peak_bytes is the KV the engine allocates plus activations that grow with the batch, which only transformers has
(it prefills the whole batch in one pass; the others' activations are fixed overhead). The KV is counted two ways,
which differ for sliding-window and chunked models under vLLM:
    at start-up  (pool.bytes_for): what the engine reserves per request to admit it, vLLM's start-up check and
                 its logged "Maximum concurrency": each request's window plus all in-flight tokens;
    steady decode (pool.steady_bytes_for): what the requests hold while decoding without preemption, windows
                 freed as they slide, the in-flight tokens' blocks counted once for the engine.
The headline `max_concurrent_users` is the steady-decode figure (0 where the start-up check fails: the engine
refuses to start); `max_users_at_startup` the other.
Tensor parallelism splits KV heads, max(1, kv_heads // tp) per GPU (replicated when tp > kv_heads), and
recurrent state, never the MLA latent; pipeline parallelism splits layers into stages (vLLM's
`get_pp_indices`) and the fullest stage binds; GPUs beyond tp x pp are data-parallel replicas.
Weights per GPU = weights / (tp x pp).
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from kvplan import engines
from kvplan.dtypes import DType, kv_dtype, weight_dtype
from kvplan.engines import Engine, EngineOptions, KVPool, VllmPool
from kvplan.errors import KvplanError
from kvplan.memory import weights_bytes
from kvplan.model import LayerCache, ModelSpec, RecurrentState

SEARCH_LIMIT = 1 << 24  # longest context searched for models that state no maximum
GPU_COUNTS = (1, 2, 4, 8, 16, 32, 64)
SPLIT_DEGREES = (1, 2, 4, 8)  # TP within a node; PP degrees tried by `plan`
ATTENTION_KINDS = ("full", "sliding", "chunked", "cross")


class Hardware(BaseModel):
    """The GPU: its catalogue name (None for --vram) and the memory it may use; nothing with --kv-budget."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    name: str | None = None
    memory_bytes: int | None = None


class Parallelism(BaseModel):
    model_config = ConfigDict(frozen=True, defer_build=True)

    tp: int = 1
    pp: int = 1
    replicas: int = 1
    from_gpus: bool = Field(False, description="TP or PP taken from --gpus, not given")

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.replicas


class Workload(BaseModel):
    """Users each holding ctx tokens (prompt plus output); avg_ctx: their mean length; shared_prefix: the
    tokens of a system prompt every user starts with, cached once by prefix caching."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    ctx: int
    users: int | None = None
    avg_ctx: int | None = None
    shared_prefix: int = 0

    @property
    def target(self) -> int:
        return self.users or 1


class Capacity(BaseModel):
    """One deployment's capacity. Sizes in bytes, per GPU unless named otherwise."""

    model_config = ConfigDict(defer_build=True)

    engine: str
    engine_version: str
    engine_version_given: bool
    engine_assumptions: list[str]
    gpu: str | None
    gpu_memory_bytes: int | None
    gpus: int
    tensor_parallel_size: int
    pipeline_parallel_size: int
    data_parallel_replicas: int
    ctx: int
    kv_dtype: str
    weights_dtype: str
    weights_dtype_override: str | None = Field(None, exclude=True, description="dtype weights were cast to")
    memory_fraction: float | None
    weights_bytes_per_gpu: int
    overhead_bytes: int | None
    overhead: dict[str, int] | None
    kv_budget_bytes: int
    kv_budget_given: bool
    engine_kv_bytes_per_sequence: int
    users: int
    engine_kv_bytes_for_users: int
    engine_activation_bytes_for_users: int = 0  # activations that grow with the batch (transformers prefill)
    engine_activation_bytes_per_sequence: int = 0
    engine_kv_bytes_per_sequence_decode: int  # what a sequence holds in steady decode (sliding layers trimmed)
    engine_kv_bytes_in_flight: int = 0  # what the in-flight tokens add to the steady hold, once for the engine
    max_concurrent_users: int = Field(description="users served at ctx in steady decode without preemption")
    max_users_at_startup: int = Field(description="users the engine's start-up reservation admits (vLLM's "
                                      "start-up check and logged maximum concurrency)")
    max_ctx_for_users: int | None
    avg_ctx: int | None
    max_users_at_avg_ctx: int | None
    shared_prefix: int
    fits: bool
    reasons: list[str]
    suggestions: list[str]
    notes: list[str]
    vllm_num_blocks: int | None = None
    vllm_kv_cache_tokens: int | None = None
    vllm_max_concurrency: float | None = None
    vllm_log: list[str] | None = None
    vllm_block_bytes: int | None = None
    vllm_blocks_per_sequence: int | None = None
    vllm_kv_bytes_per_sequence_decode: int | None = None

    @property
    def headroom_bytes(self) -> int:
        return self.kv_budget_bytes - self.engine_kv_bytes_for_users - self.engine_activation_bytes_for_users


# ---------------------------------------------------------------------------------------------- parallelism


def check_parallel(model: ModelSpec, tp: int, pp: int, from_gpus: bool = False) -> None:
    """TP must divide the attention heads, and split KV heads evenly or replicate them whole (tp a multiple of
    kv_heads); PP cannot exceed the layers. `from_gpus`: the degrees came from --gpus, so the error says so."""
    if tp < 1 or pp < 1:
        raise KvplanError(f"--tp and --pp must be at least 1, got {tp} and {pp}")
    problem = _tp_problem(model, tp)
    flag = f"--gpus {tp * pp} as TP {tp}" if from_gpus else f"--tp {tp}"
    if problem:
        hint = "; give --tp with --gpus" if from_gpus else ""
        raise KvplanError(f"{flag} {problem} (valid TP: {', '.join(map(str, valid_tp(model)))}{hint})")
    if pp > model.num_layers:
        flag = f"--gpus {tp * pp} as PP {pp}" if from_gpus else f"--pp {pp}"
        raise KvplanError(f"{flag} exceeds {model.name}'s {model.num_layers} layers")


def _tp_problem(model: ModelSpec, tp: int) -> str | None:
    heads = model.num_attention_heads
    if heads % tp:
        return f"does not divide {model.name}'s {heads} attention heads: each GPU must hold whole heads"
    split = {c.kv_heads for c in model.caches if c.kind in ATTENTION_KINDS and c.split_by_tensor_parallel}
    for kv in sorted(split):
        if (kv >= tp and kv % tp) or (tp > kv and tp % kv):
            return (f"cannot share {model.name}'s {kv} KV heads: TP must divide them, or be a multiple of "
                    "them to replicate them")
    for state in {c for c in model.caches if c.kind == "recurrent"}:
        problem = _recurrent_tp_problem(state, tp)
        if problem:
            return f"{problem} of {model.name}'s {state.mixer} layers"
    return None


def _recurrent_tp_problem(state: RecurrentState, tp: int) -> str | None:
    """vLLM's mixers split a recurrent state by heads (Mamba-2, Gated DeltaNet: `num_heads % tp == 0`), B and C
    groups only when tp divides them or there is one group to replicate (`mamba_mixer2.py`), and Mamba's
    channels evenly (`divide(intermediate_size, tp)`)."""
    if state.heads:
        if state.heads % tp:
            return f"does not divide the {state.heads} SSM heads"
        if state.groups and state.groups % tp and state.groups != 1:
            return f"does not divide the {state.groups} B/C groups (only a single group is replicated)"
    elif state.conv_kernel and state.conv_elements // (state.conv_kernel - 1) % tp:
        return f"does not divide the {state.conv_elements // (state.conv_kernel - 1):,} channels"
    return None


def valid_tp(model: ModelSpec, limit: int = 64) -> list[int]:
    candidates = range(1, min(limit, model.num_attention_heads or limit) + 1)
    return [tp for tp in candidates if _tp_problem(model, tp) is None]


def split_for_tp(cache: LayerCache, tp: int) -> LayerCache:
    """One GPU's share of a layer's cache: max(1, kv_heads // tp) heads; recurrent state / tp; MLA whole.
    A Mamba-2 state whose B/C groups tp does not divide first gets tp - groups more groups of 2 x state_size
    conv channels, so that every GPU holds the group its heads read (vLLM `extra_groups_for_head_shards`)."""
    if tp == 1 or not cache.split_by_tensor_parallel:
        return cache
    if cache.kind in ATTENTION_KINDS:
        return cache.model_copy(update={"kv_heads": max(1, cache.kv_heads // tp)})
    if cache.kind == "recurrent":
        conv = cache.conv_elements
        if cache.groups and cache.groups % tp and cache.conv_kernel:
            conv += (tp - cache.groups) * 2 * cache.state_size * (cache.conv_kernel - 1)
        return cache.model_copy(update={"conv_elements": conv // tp, "ssm_elements": cache.ssm_elements // tp})
    return cache


def stage_bounds(num_layers: int, pp: int) -> list[tuple[int, int]]:
    """Layer ranges of the pipeline stages: num_layers // pp each, the remainder one apiece to the stages
    before the last, from the second-to-last backwards (vLLM `get_pp_indices`)."""
    sizes = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        sizes[-i] += 1
    bounds, start = [], 0
    for size in sizes:
        bounds.append((start, start + size))
        start += size
    return bounds


def gpu_layers(caches: tuple[LayerCache, ...], num_layers: int, tp: int, pp: int) -> list[engines.Layers]:
    """Per pipeline stage, the caches one GPU holds, identical ones counted once."""
    stages = []
    for start, end in stage_bounds(num_layers, pp):
        # Group on the fields besides `layer` (plain tuples), then copy one cache per group: a pydantic copy
        # and hash per layer was most of the time of a planning-table sweep.
        groups: dict[tuple, list] = {}
        for cache in caches:
            if start <= cache.layer < end:
                key = (type(cache), *(v for k, v in cache.__dict__.items() if k != "layer"))
                if key in groups:
                    groups[key][1] += 1
                else:
                    groups[key] = [cache, 1]
        counts: dict[LayerCache, int] = {}
        for cache, count in groups.values():
            key = split_for_tp(cache.model_copy(update={"layer": 0}), tp)
            counts[key] = counts.get(key, 0) + count
        stages.append(list(counts.items()))
    return stages


def parallelism(engine_name: str, gpus: int | None, tp: int | None, pp: int | None) -> Parallelism:
    """--gpus, --tp, --pp -> a layout. Without --tp the GPUs form one replica: tensor parallel where the
    engine splits heads, pipeline stages where it splits layers (llama.cpp, transformers); GPUs beyond
    TP x PP are data-parallel replicas."""
    for flag, value in (("--gpus", gpus), ("--tp", tp), ("--pp", pp)):
        if value is not None and value < 1:
            raise KvplanError(f"{flag} must be at least 1, got {value}")
    derived = bool(gpus) and tp is None
    if gpus and tp is None:
        if engines.engine_class(engine_name).splits_heads:
            tp = gpus // (pp or 1) or 1
        elif pp is None:
            pp = gpus
    tp, pp = tp or 1, pp or 1
    gpus = gpus or tp * pp
    if gpus % (tp * pp):
        raise KvplanError(f"--gpus {gpus} is not a multiple of TP x PP = {tp} x {pp}: give --gpus a multiple of "
                          "--tp x --pp")
    return Parallelism(tp=tp, pp=pp, replicas=gpus // (tp * pp), from_gpus=derived)


# ------------------------------------------------------------------------------------------------- searches


UNBOUNDED_USERS = 2**40  # a count no GPU serves; fitting this many means the pool does not grow with users


def max_users(pool: KVPool, budget: int, ctx: int, prefix: int = 0, steady: bool = False) -> int:
    """The largest N with pool.peak_bytes(N, ctx) <= budget (0 if not even one fits); `steady`: counting what
    the users hold in steady decode rather than what the engine reserves to admit them. The pool's own count
    where it has one (`KVPool.users_within`: vLLM's blocks are linear in users), else `search_users`."""
    exact = pool.users_within(budget, ctx, prefix, steady)
    return exact if exact is not None else search_users(pool, budget, ctx, prefix, steady)


def search_users(pool: KVPool, budget: int, ctx: int, prefix: int = 0, steady: bool = False) -> int:
    """`max_users` by search, for any pool whose peak grows with N. It starts at budget // peak_bytes(1), where
    pools linear in N (most) already have the answer, and gallops from there to a bracket, peak_bytes(low) <=
    budget < peak_bytes(high), before bisecting it."""
    def peak(users: int) -> int:
        return pool.peak_bytes(users, ctx, prefix, steady)

    one = peak(1)
    if one > budget:
        return 0
    if peak(UNBOUNDED_USERS) <= budget:  # users cost nothing: the search would not end
        raise KvplanError(f"at {ctx:,} tokens users need no KV memory of their own, so there is no user limit")
    guess = max(1, budget // one) if one > 0 else 1
    if peak(guess) <= budget:
        low, step = guess, 1
        while peak(low + step) <= budget:
            low, step = low + step, step * 2
        high = low + step
    else:
        high, step = guess, 1
        while high - step > 1 and peak(high - step) > budget:
            high, step = high - step, step * 2
        low = max(1, high - step)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if peak(mid) <= budget else (low, mid)
    return low


def max_ctx(pool: KVPool, budget: int, users: int, limit: int, prefix: int = 0) -> int:
    """The largest ctx in [max(1, prefix), limit] at which `users` are served (0 if none): the engine starts
    with max_model_len ctx (one request's reservation fits) and the users' steady-decode hold fits."""
    def fits(ctx: int) -> bool:
        return pool.peak_bytes(1, ctx, prefix) <= budget and pool.peak_bytes(users, ctx, prefix, True) <= budget

    low = max(1, prefix)
    if not fits(low):
        return 0
    high = limit + 1
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low


# ------------------------------------------------------------------------------------------------- capacity


def check_workload(engine: Engine, workload: Workload) -> None:
    if workload.users is not None and workload.users < 1:
        raise KvplanError(f"--users must be at least 1, got {workload.users}")
    if workload.avg_ctx is not None and workload.avg_ctx > workload.ctx:
        raise KvplanError(f"--avg-ctx {workload.avg_ctx:,} exceeds --ctx {workload.ctx:,}, the longest a "
                          "user gets")
    if not 0 <= workload.shared_prefix < min(workload.ctx, workload.avg_ctx or workload.ctx):
        raise KvplanError(f"--shared-prefix {workload.shared_prefix:,} must be shorter than the context: each "
                          "user holds tokens of its own (at least what it generates)")
    if not engine.paged and (workload.avg_ctx or workload.shared_prefix):
        raise KvplanError("--avg-ctx and --shared-prefix need a paged engine (vllm, sglang, tensorrt-llm, "
                          f"ideal): {engine.label} reserves every sequence's full context up front")


def engine_dtypes(model: ModelSpec, engine_name: str = "vllm", kv_dtype_name: str | None = None,
                  weights_dtype_name: str | None = None) -> tuple[str, str | None]:
    """The KV dtype and the weights dtype override `capacity` runs `model` with under an engine: those given,
    else the engine's defaults (llama.cpp's fp16 cache; fp32 checkpoints loaded in bf16)."""
    engine = engines.engine(engine_name, EngineOptions())
    kv = kv_dtype(kv_dtype_name or engine.default_kv_dtype(model))
    engine.check_kv_dtype(kv)
    return kv.name, weights_dtype_name or engine.default_weights_dtype(model)


@dataclass
class _Deployment:
    """What one deployment builds before any search: the engine, the dtypes, the KV budget and its terms, and
    each pipeline stage's KV pool (`stages`: the per-GPU layer split the pools were built from)."""

    engine: Engine
    kv: DType
    weights_label: str
    weights_dtype_name: str | None
    weights_per_gpu: int
    fraction: float | None
    overhead_bytes: int | None
    breakdown: dict[str, int] | None
    budget: int
    stages: list
    pools: list[KVPool]
    notes: list[str]


def _deploy(model: ModelSpec, workloads: Sequence[Workload], engine_name: str, options: EngineOptions,
            hardware: Hardware, parallel: Parallelism, kv_dtype_name: str | None,
            weights_dtype_name: str | None, kv_budget: int | None, overhead: int | None,
            stages: list | None = None) -> _Deployment:
    check_parallel(model, parallel.tp, parallel.pp, parallel.from_gpus)
    engine = engines.engine(engine_name, options, hardware.name, hardware.memory_bytes, parallel.tp,
                            parallel.pp)
    for workload in workloads:
        check_workload(engine, workload)
    if kv_budget is not None and (options.memory_fraction is not None or overhead is not None):
        raise KvplanError("--kv-budget is the KV memory itself: it cannot be combined with "
                          "--gpu-memory-utilization or --overhead")
    kv = kv_dtype(kv_dtype_name or engine.default_kv_dtype(model))
    engine.check_kv_dtype(kv)
    notes = []
    if weights_dtype_name is None and engine.default_weights_dtype(model):
        weights_dtype_name = engine.default_weights_dtype(model)
        notes.append(f"fp32 checkpoint: {engine.label} loads it in {weights_dtype_name}")
    weights, weights_label = weights_bytes(model, weights_dtype_name)
    weights_per_gpu = math.ceil(weights / (parallel.tp * parallel.pp))
    fraction = overhead_bytes = breakdown = None
    if kv_budget is not None:
        budget = kv_budget
    else:
        if hardware.memory_bytes is None:
            raise KvplanError("capacity needs a GPU: give --gpu, --vram or --kv-budget")
        fraction = engine.memory_fraction()
        if not 0 < fraction <= 1:
            if options.memory_fraction is not None:
                raise KvplanError(f"{engine.fraction_flag} must be in (0, 1], got {fraction}")
            raise KvplanError(f"{engine.label}'s default {engine.fraction_flag} for a GPU of "
                              f"{hardware.memory_bytes / 2**30:,.2f} GiB is {fraction}: it reserves more than the GPU "
                              "has; give a GPU with more memory or set the fraction yourself")
        breakdown = {"given": overhead} if overhead is not None else engine.overhead().model_dump()
        overhead_bytes = sum(breakdown.values())
        budget = engine.kv_budget(hardware.memory_bytes, fraction, weights_per_gpu, overhead_bytes)
    if stages is None:
        stages = gpu_layers(engine.cached_layers(model), model.num_layers, parallel.tp, parallel.pp)
    pools = [engine.pool(layers, model, kv) for layers in stages]
    return _Deployment(engine, kv, weights_label, weights_dtype_name, weights_per_gpu, fraction,
                       overhead_bytes, breakdown, budget, stages, pools, notes)


class UsersServed(NamedTuple):
    """Users at ctx on every stage, times the replicas: in steady decode (the headline) and as the start-up
    reservation admits them; `binding` is the stage that binds the headline."""

    steady: int
    at_startup: int
    binding: KVPool


def _users_at(model: ModelSpec, pools: list[KVPool], budget: int, ctx: int, prefix: int,
              replicas: int) -> UsersServed:
    """A user costs its cache and, where the engine's activations grow with the batch (transformers), its share
    of them. The steady figure is 0 where not one request passes the start-up check, and never below the
    start-up figure (what the engine admits it holds)."""
    if max(p.peak_bytes(1, ctx) - p.peak_bytes(0, ctx) for p in pools) == 0:
        raise KvplanError(f"{model.name} keeps no per-sequence cache: memory does not bound its concurrency")
    at_startup = min(max_users(p, budget, ctx, prefix) for p in pools)
    per_stage = [max_users(p, budget, ctx, prefix, steady=True) if at_startup else 0 for p in pools]
    steady = max(min(per_stage), at_startup)
    return UsersServed(steady * replicas, at_startup * replicas, pools[per_stage.index(min(per_stage))])


def capacity(model: ModelSpec, workload: Workload, *, engine_name: str = "vllm",
             options: EngineOptions | None = None, hardware: Hardware | None = None,
             parallel: Parallelism | None = None, kv_dtype_name: str | None = None,
             weights_dtype_name: str | None = None, kv_budget: int | None = None,
             overhead: int | None = None, suggest: bool = True) -> Capacity:
    """Capacity of `parallel.gpus` GPUs serving `model` under one engine, for the workload."""
    options, hardware = options or EngineOptions(), hardware or Hardware()
    parallel = parallel or Parallelism()
    d = _deploy(model, [workload], engine_name, options, hardware, parallel, kv_dtype_name,
                weights_dtype_name, kv_budget, overhead)
    engine, pools, budget = d.engine, d.pools, d.budget
    notes = list(dict.fromkeys([*d.notes, *(note for p in pools for note in p.notes)]))
    ctx, prefix = workload.ctx, workload.shared_prefix
    served = _users_at(model, pools, budget, ctx, prefix, parallel.replicas)
    users, binding = served.steady, served.binding
    need = math.ceil(workload.target / parallel.replicas)
    limit = model.max_context or SEARCH_LIMIT
    longest = min(max_ctx(p, budget, need, limit, prefix) for p in pools) if workload.users else None
    at_avg = None
    if workload.avg_ctx:
        at_avg = min(max_users(p, budget, workload.avg_ctx, prefix, steady=True) for p in pools) * parallel.replicas
    result = Capacity(
        engine=engine.name, engine_version=engine.version, engine_version_given=engine.version_given,
        engine_assumptions=engine.assumptions(), gpu=hardware.name, gpu_memory_bytes=hardware.memory_bytes,
        gpus=parallel.gpus, tensor_parallel_size=parallel.tp, pipeline_parallel_size=parallel.pp,
        data_parallel_replicas=parallel.replicas, ctx=ctx, kv_dtype=d.kv.name,
        weights_dtype=d.weights_label, weights_dtype_override=d.weights_dtype_name,
        memory_fraction=d.fraction, weights_bytes_per_gpu=d.weights_per_gpu,
        overhead_bytes=d.overhead_bytes, overhead=d.breakdown, kv_budget_bytes=budget,
        kv_budget_given=kv_budget is not None,
        engine_kv_bytes_per_sequence=binding.bytes_per_sequence(ctx), users=workload.target,
        engine_kv_bytes_per_sequence_decode=binding.bytes_per_sequence_decode(ctx),
        engine_kv_bytes_in_flight=(binding.steady_bytes_for(1, ctx) - binding.steady_bytes_for(0, ctx)
                                   - binding.bytes_per_sequence_decode(ctx)),
        engine_kv_bytes_for_users=max(p.steady_bytes_for(need, ctx, prefix) for p in pools),
        engine_activation_bytes_for_users=max(p.activation_bytes(need, ctx) for p in pools),
        engine_activation_bytes_per_sequence=binding.activation_bytes(1, ctx),
        max_concurrent_users=users, max_users_at_startup=served.at_startup, max_ctx_for_users=longest,
        avg_ctx=workload.avg_ctx, max_users_at_avg_ctx=at_avg, shared_prefix=prefix, fits=users >= workload.target,
        reasons=[], suggestions=[], notes=notes,
        **(_vllm_numbers(binding, budget, ctx) if isinstance(binding, VllmPool) else {}),
    )
    if result.fits:
        return result
    update = {"reasons": [_reason(result)]}
    if suggest:
        settings = dict(engine_name=engine_name, options=options, hardware=hardware, kv_budget=kv_budget,
                        overhead=overhead)
        update["suggestions"] = _suggestions(model, workload, result, engine, parallel, kv_dtype_name,
                                             d.weights_dtype_name, settings)
    return result.model_copy(update=update)


class UsersAt(NamedTuple):
    """One cell of a planning table: what `capacity` reports as max_concurrent_users and
    engine_kv_bytes_per_sequence at ctx, with the KV budget per GPU."""

    max_users: int
    engine_kv_bytes_per_sequence: int
    kv_budget_bytes: int


def users_sweep(model: ModelSpec, ctxs: Sequence[int], hardwares: Sequence[tuple[Hardware, Parallelism]], *,
                engine_name: str = "vllm", options: EngineOptions | None = None,
                kv_dtype_name: str | None = None, weights_dtype_name: str | None = None,
                overhead: int | None = None) -> list[list[UsersAt]]:
    """For each GPU set x ctx, the users `capacity` finds (the same budget, pools and search), without the rest of
    its report: `kvplan table`'s sweep. The per-GPU layer split is built once for each parallel layout."""
    options = options or EngineOptions()
    workloads = [Workload(ctx=ctx) for ctx in ctxs]
    stages: dict[tuple[int, int], list] = {}
    out = []
    for hardware, parallel in hardwares:
        layout = (parallel.tp, parallel.pp)
        d = _deploy(model, workloads, engine_name, options, hardware, parallel, kv_dtype_name,
                    weights_dtype_name, None, overhead, stages.get(layout))
        stages[layout] = d.stages
        row = []
        for ctx in ctxs:
            served = _users_at(model, d.pools, d.budget, ctx, 0, parallel.replicas)
            row.append(UsersAt(served.steady, served.binding.bytes_per_sequence(ctx), d.budget))
        out.append(row)
    return out


def _vllm_numbers(pool: VllmPool, budget: int, ctx: int) -> dict:
    log = pool.log(budget, ctx)
    return {"vllm_num_blocks": log.num_blocks, "vllm_kv_cache_tokens": log.kv_cache_tokens,
            "vllm_max_concurrency": log.max_concurrency, "vllm_log": log.lines,
            "vllm_block_bytes": pool.block_bytes, "vllm_blocks_per_sequence": pool.blocks_per_request(ctx),
            "vllm_kv_bytes_per_sequence_decode": pool.bytes_per_sequence_decode(ctx)}


def users_label(n: int) -> str:
    return f"{n:,} user" + ("" if n == 1 else "s")


def layout_label(cap: Capacity) -> str:
    """`TP >= 2` for one tensor-parallel group, else the whole layout: `16 GPUs (TP 8 x PP 2)`."""
    if cap.gpus == cap.tensor_parallel_size:
        return f"TP >= {cap.tensor_parallel_size}"
    parts = [f"TP {cap.tensor_parallel_size}"]
    if cap.pipeline_parallel_size > 1:
        parts.append(f"PP {cap.pipeline_parallel_size}")
    if cap.data_parallel_replicas > 1:
        parts.append(f"{cap.data_parallel_replicas} replicas")
    return f"{cap.gpus} GPUs ({' x '.join(parts)})"


def _gib(n: int) -> str:
    return f"{n / (1 << 30):,.2f} GiB"


def _reason(cap: Capacity) -> str:
    if cap.kv_budget_bytes <= 0 and not cap.kv_budget_given:
        usable = int(cap.gpu_memory_bytes * cap.memory_fraction)
        return (f"weights ({_gib(cap.weights_bytes_per_gpu)} per GPU) and overhead "
                f"({_gib(cap.overhead_bytes)}) leave no KV memory in the {_gib(usable)} the engine may use")
    activations = cap.engine_activation_bytes_per_sequence
    also = f" and {_gib(activations)} of prefill activations" if activations else ""
    if cap.max_concurrent_users == 0:
        return (f"one sequence of {cap.ctx:,} tokens needs {_gib(cap.engine_kv_bytes_per_sequence)} of KV "
                f"cache{also}; the budget is {_gib(cap.kv_budget_bytes)}")
    verb = "fits" if cap.max_concurrent_users == 1 else "fit"
    each = f"{_gib(cap.engine_kv_bytes_per_sequence_decode)} each"
    if cap.engine_kv_bytes_in_flight:
        each += f" in steady decode, {_gib(cap.engine_kv_bytes_in_flight)} in flight"
    each += f", {_gib(activations)} activations" if also else ""
    return f"{users_label(cap.max_concurrent_users)} {verb} at {cap.ctx:,} tokens ({each}); {cap.users:,} asked"



def _suggestions(model: ModelSpec, workload: Workload, cap: Capacity, engine: Engine, parallel: Parallelism,
                 kv_name: str | None, weights_name: str | None, settings: dict) -> list[str]:
    """What would make it fit: a smaller KV dtype, more GPUs, smaller weights, or a shorter context."""
    out = []
    kv = kv_dtype(cap.kv_dtype)
    smaller_kv = [d for d in kv_options(engine, model) if kv_dtype(d).bits < kv.bits]
    for name in smaller_kv[:1]:
        alt = capacity(model, workload, parallel=parallel, kv_dtype_name=name,
                       weights_dtype_name=weights_name, suggest=False, **settings)
        if alt.max_concurrent_users > cap.max_concurrent_users:
            out.append(f"{name} KV fits {users_label(alt.max_concurrent_users)}")
    if cap.kv_budget_bytes <= 0 and not cap.kv_budget_given:
        current = weight_dtype(cap.weights_dtype).bits
        for name in ("fp8", "int4"):
            if weight_dtype(name).bits >= current:
                continue
            alt = capacity(model, workload, parallel=parallel, kv_dtype_name=kv_name, weights_dtype_name=name,
                           suggest=False, **settings)
            if alt.fits:
                out.append(f"{name} weights fit {users_label(alt.max_concurrent_users)}")
                break
    if not cap.kv_budget_given:
        more = minimum_gpus(model, workload, engine.splits_heads, kv_name, weights_name, settings,
                            above=parallel.gpus)
        if more is not None:
            out.append(f"needs {layout_label(more)}: {more.gpus} x {cap.gpu or 'this GPU'} fit "
                       f"{users_label(more.max_concurrent_users)}")
    if workload.users and cap.max_ctx_for_users:
        verb = "fits" if workload.users == 1 else "fit"
        out.append(f"{users_label(workload.users)} {verb} at up to {cap.max_ctx_for_users:,} tokens each")
    return out


# ------------------------------------------------------------------------------------------------- planning


def kv_options(engine: Engine, model: ModelSpec) -> list[str]:
    """KV dtypes worth trying, the engine's default first: its 8-bit cache (and llama.cpp's q4_0)."""
    smaller = {"llama.cpp": ["q8_0", "q4_0"], "transformers": []}.get(engine.name, ["fp8"])
    return [engine.default_kv_dtype(model), *smaller]


def layouts(model: ModelSpec, gpus: int, splits_heads: bool) -> list[Parallelism]:
    """Ways to use `gpus` GPUs: TP within a node (1, 2, 4, 8), PP stages, the rest as replicas."""
    tps = [t for t in SPLIT_DEGREES if t <= gpus and (splits_heads or t == 1) and t in valid_tp(model, 8)]
    return [Parallelism(tp=tp, pp=pp, replicas=gpus // (tp * pp))
            for tp in tps for pp in SPLIT_DEGREES
            if tp * pp <= gpus and gpus % (tp * pp) == 0 and pp <= model.num_layers]


def best_layout(model: ModelSpec, workload: Workload, gpus: int, splits_heads: bool, kv_name: str | None,
                weights_name: str | None, settings: dict) -> Capacity | None:
    """Of the layouts of `gpus` GPUs that fit, the one with the fewest pipeline stages (TP keeps a node's GPUs
    in step; PP adds a stage of latency), then the most users."""
    fitting = [capacity(model, workload, parallel=layout, kv_dtype_name=kv_name,
                        weights_dtype_name=weights_name, suggest=False, **settings)
               for layout in layouts(model, gpus, splits_heads)]
    fitting = [cap for cap in fitting if cap.fits]
    return min(fitting, key=lambda cap: (cap.pipeline_parallel_size, -cap.max_concurrent_users), default=None)


def minimum_gpus(model: ModelSpec, workload: Workload, splits_heads: bool, kv_name: str | None,
                 weights_name: str | None, settings: dict, above: int = 0,
                 max_gpus: int = 64) -> Capacity | None:
    """The fewest GPUs (more than `above`) that fit the workload, in their best layout."""
    for gpus in GPU_COUNTS:
        if above < gpus <= max_gpus:
            best = best_layout(model, workload, gpus, splits_heads, kv_name, weights_name, settings)
            if best is not None:
                return best
    return None


class PlanRow(BaseModel):
    model_config = ConfigDict(defer_build=True)

    gpus: int
    tensor_parallel_size: int
    pipeline_parallel_size: int
    data_parallel_replicas: int
    kv_dtype: str
    weights_dtype: str
    weights_bytes_per_gpu: int
    kv_budget_bytes: int
    max_concurrent_users: int
    headroom_bytes: int
    headroom_fraction: float


class Plan(BaseModel):
    model_config = ConfigDict(defer_build=True)

    model: str
    engine: str
    engine_version: str
    gpu: str | None
    gpu_memory_bytes: int
    ctx: int
    users: int
    rows: list[PlanRow]
    warnings: list[str]


def plan(model: ModelSpec, workload: Workload, hardware: Hardware, *, engine_name: str = "vllm",
         options: EngineOptions | None = None, overhead: int | None = None, max_gpus: int = 64) -> Plan:
    """For each KV dtype x weights dtype worth trying, the fewest GPUs that serve workload.target users at
    ctx; ranked by GPUs, then precision (checkpoint weights and the engine's own KV dtype first), then
    headroom (KV budget left per GPU once the users are served)."""
    options = options or EngineOptions()
    engine = engines.engine(engine_name, options, hardware.name, hardware.memory_bytes)
    settings = dict(engine_name=engine_name, options=options, hardware=hardware, overhead=overhead)
    checkpoint = weights_bytes(model)[0]
    weights = [None, *(w for w in ("fp8", "int4") if weights_bytes(model, w)[0] < checkpoint)]
    rows = []
    for rank_w, weights_name in enumerate(weights):
        for rank_kv, kv_name in enumerate(kv_options(engine, model)):
            best = minimum_gpus(model, workload, engine.splits_heads, kv_name, weights_name, settings,
                                max_gpus=max_gpus)
            if best is not None:
                rows.append(((best.gpus, rank_w, rank_kv, -best.headroom_bytes), PlanRow(
                    gpus=best.gpus, tensor_parallel_size=best.tensor_parallel_size,
                    pipeline_parallel_size=best.pipeline_parallel_size,
                    data_parallel_replicas=best.data_parallel_replicas, kv_dtype=best.kv_dtype,
                    weights_dtype=best.weights_dtype, weights_bytes_per_gpu=best.weights_bytes_per_gpu,
                    kv_budget_bytes=best.kv_budget_bytes, max_concurrent_users=best.max_concurrent_users,
                    headroom_bytes=best.headroom_bytes,
                    headroom_fraction=best.headroom_bytes / best.kv_budget_bytes)))
    warnings = []
    if model.max_context and workload.ctx > model.max_context:
        warnings.append(f"ctx {workload.ctx:,} is beyond {model.name}'s max context of "
                        f"{model.max_context:,} tokens")
    return Plan(model=model.name, engine=engine.name, engine_version=engine.version, gpu=hardware.name,
                gpu_memory_bytes=hardware.memory_bytes, ctx=workload.ctx, users=workload.target,
                rows=[row for _, row in sorted(rows, key=lambda item: item[0])], warnings=warnings)
