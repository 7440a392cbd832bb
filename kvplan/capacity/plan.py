"""Planning: the layouts and dtypes that serve a target, fewest GPUs first (`kvplan plan`), and the fewest GPUs that
fit a workload (`minimum_gpus`, which the suggestions also ask)."""

from collections.abc import Callable

from pydantic import BaseModel, ConfigDict, Field

from kvplan import engines
from kvplan.capacity.layout import valid_tp
from kvplan.capacity.users import Capacity, count
from kvplan.dtypes import kv_dtype
from kvplan.engines import Engine, EngineOptions
from kvplan.errors import KvplanError
from kvplan.memory import weights_bytes
from kvplan.model import Hardware, ModelSpec, Parallelism, Workload
from kvplan.notebook import ShownAsReport
from kvplan.schemas import version_field

GPU_COUNTS = (1, 2, 4, 8, 16, 32, 64)
SPLIT_DEGREES = (1, 2, 4, 8)  # TP within a node; PP degrees tried by `plan`


def kv_options(engine: Engine, model: ModelSpec) -> list[str]:
    """KV dtypes worth trying, the engine's default first: its 8-bit cache (and llama.cpp's q4_0), where the engine
    lets the model have it (llama.cpp: a quantised V cache needs flash attention)."""
    smaller = {"llama.cpp": ["q8_0", "q4_0"], "transformers": []}.get(engine.name, ["fp8"])
    options = [engine.default_kv_dtype(model), *(name for name in smaller if _offered(engine, model, name))]
    return list(dict.fromkeys(options))  # the default may be the 8-bit cache itself (vLLM's DeepSeek V4)


def _offered(engine: Engine, model: ModelSpec, name: str) -> bool:
    try:
        engine.check_model_kv(model, kv_dtype(name))
    except KvplanError:
        return False
    return True


def layouts(model: ModelSpec, gpus: int, engine: type[Engine]) -> list[Parallelism]:
    """Ways to use `gpus` GPUs: TP within a node (1, 2, 4, 8), PP stages, the rest as replicas; for a
    mixture-of-experts model under an engine with data-parallel attention, the rest also as DP ranks sharing the
    experts, placed whole on every GPU of a stage (expert parallelism) where the engine can, else sliced."""
    tps = [t for t in SPLIT_DEGREES if t <= gpus and (engine.splits_heads or t == 1) and t in valid_tp(model, 8)]
    out = []
    for tp in tps:
        for pp in SPLIT_DEGREES:
            if tp * pp > gpus or gpus % (tp * pp) or pp > model.num_layers or (
                    pp > 1 and not engine.splits_into_stages(model)):
                continue
            rest = gpus // (tp * pp)
            out.append(Parallelism(tp=tp, pp=pp, replicas=rest))
            if rest > 1 and engine.data_parallel and model.params.experts:
                ep = next(ep for ep in (tp * rest, 1) if not engine.parallel_problem(model, tp, rest, ep))
                out.append(Parallelism(tp=tp, pp=pp, dp=rest, ep=ep))
    return out


def best_layout(model: ModelSpec, workload: Workload, gpus: int, engine: type[Engine], kv_name: str | None,
                weights_name: str | None, settings: dict, accept: Callable[[Capacity], bool] | None = None
                ) -> Capacity | None:
    """Of the layouts of `gpus` GPUs that fit (and that `accept`, where given: `kvplan.speed.targets` checks
    latency targets), the one with the fewest pipeline stages (TP keeps a node's GPUs in step; PP adds a stage of
    latency), then the most users, then the fewest DP ranks. A speculative decoder is sized on one stage. A layout
    the engine refuses (a stage it cannot build, a default memory fraction below zero at that many DP ranks:
    `count` raises) serves no one and is passed over; `plan` has checked that the engine runs the model at all."""
    options = settings.get("options")
    one_stage = settings.get("draft") is not None or (options is not None and options.speculative_method)
    fitting = []
    for layout in layouts(model, gpus, engine):
        if layout.pp > 1 and one_stage:
            continue
        try:
            cap = count(model, workload, parallel=layout, kv_dtype_name=kv_name, weights_dtype_name=weights_name,
                        **settings)
        except KvplanError:
            continue
        if cap.fits:
            fitting.append(cap)
    fitting.sort(key=lambda cap: (cap.pipeline_parallel_size, -cap.max_concurrent_users, cap.data_parallel_size))
    return next((cap for cap in fitting if accept is None or accept(cap)), None)  # best first: accept may be slow


def minimum_gpus(model: ModelSpec, workload: Workload, engine: type[Engine], kv_name: str | None,
                 weights_name: str | None, settings: dict, above: int = 0, max_gpus: int = 64,
                 accept: Callable[[Capacity], bool] | None = None) -> Capacity | None:
    """The fewest GPUs (more than `above`) that fit the workload, in their best layout (`best_layout`)."""
    for gpus in GPU_COUNTS:
        if above < gpus <= max_gpus:
            best = best_layout(model, workload, gpus, engine, kv_name, weights_name, settings, accept)
            if best is not None:
                return best
    return None


class PlanRow(BaseModel):
    model_config = ConfigDict(defer_build=True)

    gpus: int
    tensor_parallel_size: int
    pipeline_parallel_size: int
    data_parallel_size: int
    expert_parallel_size: int
    data_parallel_replicas: int
    kv_dtype: str
    weights_dtype: str
    weights_dtype_override: str | None = Field(None, exclude=True, description="dtype weights were cast to")
    weights_bytes_per_gpu: int
    kv_budget_bytes: int
    max_concurrent_users: int
    headroom_bytes: int
    headroom_fraction: float
    draft_weights_bytes_per_gpu: int = 0
    lora_bytes_per_gpu: int = 0


class Plan(ShownAsReport, BaseModel):
    """`kvplan plan`'s result; its JSON is the command's `--json` output, and it shows in a notebook as the command
    prints it."""

    model_config = ConfigDict(defer_build=True)

    schema_version: str = version_field()
    model: str
    engine: str
    engine_version: str
    gpu: str | None
    gpu_memory_bytes: int
    ctx: int
    users: int
    rows: list[PlanRow]
    warnings: list[str]
    notes: list[str] = []

    def report(self, width: int = 80) -> str:
        """What `kvplan plan` prints, as text `width` columns wide."""
        from kvplan.report import print_plan, text_of

        return text_of(lambda console: print_plan(console, self), width)


def plan(model: ModelSpec, workload: Workload, hardware: Hardware, *, engine_name: str = "vllm",
         options: EngineOptions | None = None, overhead: int | None = None, max_gpus: int = 64,
         draft: ModelSpec | None = None, accept: Callable[[Capacity], bool] | None = None) -> Plan:
    """For each KV dtype x weights dtype worth trying, the fewest GPUs that serve workload.target users at
    ctx (in a layout `accept`s, where given); ranked by GPUs, then precision (checkpoint weights and the engine's
    own KV dtype first), then headroom (KV budget left per GPU once the users are served)."""
    options = options or EngineOptions()
    engine = engines.engine(engine_name, options, hardware.name, hardware.memory_bytes)
    settings = dict(engine_name=engine_name, options=options, hardware=hardware, overhead=overhead, draft=draft)
    count(model, workload, **settings)  # one GPU: what the engine refuses for the model, said once
    checkpoint = weights_bytes(model)[0]
    weights = [None, *(w for w in ("fp8", "int4") if weights_bytes(model, w)[0] < checkpoint)]
    rows = []
    for rank_w, weights_name in enumerate(weights):
        for rank_kv, kv_name in enumerate(kv_options(engine, model)):
            best = minimum_gpus(model, workload, type(engine), kv_name, weights_name, settings, max_gpus=max_gpus,
                                accept=accept)
            if best is not None:
                rows.append(((best.gpus, rank_w, rank_kv, -best.headroom_bytes), PlanRow(
                    gpus=best.gpus, tensor_parallel_size=best.tensor_parallel_size,
                    pipeline_parallel_size=best.pipeline_parallel_size, data_parallel_size=best.data_parallel_size,
                    expert_parallel_size=best.expert_parallel_size,
                    data_parallel_replicas=best.data_parallel_replicas, kv_dtype=best.kv_dtype,
                    weights_dtype=best.weights_dtype, weights_dtype_override=best.weights_dtype_override,
                    weights_bytes_per_gpu=best.weights_bytes_per_gpu,
                    kv_budget_bytes=best.kv_budget_bytes, max_concurrent_users=best.max_concurrent_users,
                    headroom_bytes=best.headroom_bytes,
                    headroom_fraction=best.headroom_bytes / best.kv_budget_bytes,
                    draft_weights_bytes_per_gpu=best.draft_weights_bytes_per_gpu,
                    lora_bytes_per_gpu=best.lora_bytes_per_gpu)))
    warnings = []
    if model.max_context and workload.ctx > model.max_context:
        warnings.append(f"ctx {workload.ctx:,} is beyond {model.name}'s max context of "
                        f"{model.max_context:,} tokens")
    notes = []
    if any(row.data_parallel_size > 1 for _, row in rows) and any(c.kind == "mla" for c in model.caches):
        notes.append(MLA_DATA_PARALLEL)
    return Plan(model=model.name, engine=engine.name, engine_version=engine.version, gpu=hardware.name,
                gpu_memory_bytes=hardware.memory_bytes, ctx=workload.ctx, users=workload.target,
                rows=[row for _, row in sorted(rows, key=lambda item: item[0])], warnings=warnings, notes=notes)


MLA_DATA_PARALLEL = ("DP attention holds more users of an MLA model: TP cannot split its latent (one row shared by "
                     "all heads), so every TP rank stores every user's latent, while each DP rank stores only its "
                     "own users'")
