"""One deployment before any search: the engine with its options, the KV and weights dtypes, the KV budget and its
terms, and each pipeline stage's KV pool."""

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from kvplan import engines
from kvplan.capacity.draft import DraftAndAdapters, draft_and_adapters, speculation_options
from kvplan.capacity.layout import GpuWeights, check_parallel, gpu_layers, weights_on_gpu
from kvplan.dtypes import DType, kv_dtype
from kvplan.engines import Engine, EngineOptions, KVPool, ServingExtras
from kvplan.errors import KvplanError
from kvplan.memory import vision_bytes
from kvplan.model import Hardware, ModelSpec, Parallelism, Workload


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
    problem = engine.prefix_sharing_problem() if workload.shared_prefix else None
    if problem:
        raise KvplanError(f"--shared-prefix {workload.shared_prefix:,}: {problem}")


def engine_dtypes(model: ModelSpec, engine_name: str = "vllm", kv_dtype_name: str | None = None,
                  weights_dtype_name: str | None = None) -> tuple[str, str | None]:
    """The KV dtype and the weights dtype override `capacity` runs `model` with under an engine: those given,
    else the engine's defaults (llama.cpp's fp16 cache; fp32 checkpoints loaded in bf16)."""
    engine = engines.engine(engine_name, EngineOptions())
    kv = kv_dtype(kv_dtype_name or engine.default_kv_dtype(model))
    engine.check_kv_dtype(kv)
    return kv.name, weights_dtype_name or engine.default_weights_dtype(model)


class LayoutSplit(NamedTuple):
    """What a deployment derives from the model and its parallel layout alone, whatever the GPU: each pipeline
    stage's per-GPU caches (`gpu_layers`) and the weights on the fullest GPU before any offload (`weights_on_gpu`).
    `users_sweep` builds it once per layout and hands it to the deployments of every GPU set of that layout."""

    stages: list
    weights: GpuWeights


@dataclass
class Deployment:
    """What one deployment builds before any search: the engine, the dtypes, the KV budget and its terms, and
    each pipeline stage's KV pool (`split.stages`: the per-GPU layer split the pools were built from)."""

    engine: Engine
    kv: DType
    weights_label: str
    weights_dtype_name: str | None
    weights_per_gpu: int
    experts_per_gpu: int
    fraction: float | None
    overhead_bytes: int | None
    breakdown: dict[str, int] | None
    budget: int
    split: LayoutSplit
    pools: list[KVPool]
    notes: list[str]
    extras: ServingExtras
    offloaded: int
    added: DraftAndAdapters = field(default_factory=DraftAndAdapters)
    target_pools: list[KVPool] | None = None  # the pools without the draft's layers, where a draft adds some


def deploy(model: ModelSpec, workloads: Sequence[Workload], engine_name: str, options: EngineOptions,
            hardware: Hardware, parallel: Parallelism, kv_dtype_name: str | None,
            weights_dtype_name: str | None, kv_budget: int | None, overhead: int | None,
            split: LayoutSplit | None = None, draft: ModelSpec | None = None) -> Deployment:
    # A split given is that of a layout whose first deployment, under the same engine, has checked the model.
    if split is None:
        check_parallel(model, parallel.tp, parallel.pp, parallel.from_gpus, parallel.dp)
    options = speculation_options(model, draft, engine_name, options, parallel)
    engine = engines.engine(engine_name, options, hardware.name, hardware.memory_bytes, parallel.tp,
                            parallel.pp, parallel.dp, parallel.ep)
    if split is None:
        engine.check_caches(model)
        problem = engine.parallel_problem(model, parallel.tp, parallel.dp, parallel.ep)
        if problem:
            raise KvplanError(problem)
    for workload in workloads:
        check_workload(engine, workload)
    if kv_budget is not None and (options.memory_fraction is not None or overhead is not None):
        raise KvplanError("--kv-budget is the KV memory itself: it cannot be combined with "
                          "--gpu-memory-utilization or --overhead")
    kv = kv_dtype(kv_dtype_name or engine.default_kv_dtype(model))
    engine.check_kv_dtype(kv)
    engine.check_model_kv(model, kv)
    notes = []
    if weights_dtype_name is None and engine.default_weights_dtype(model):
        weights_dtype_name = engine.default_weights_dtype(model)
        notes.append(f"fp32 checkpoint: {engine.label} loads it in {weights_dtype_name}")
    extras = engine.serving_extras(model, vision_bytes(model, weights_dtype_name), max(w.ctx for w in workloads))
    notes += extras.notes
    if split is None:
        split = LayoutSplit(gpu_layers(engine.cached_layers(model), engine.stage_sizes(model.num_layers), parallel.tp),
                            weights_on_gpu(model, engine, weights_dtype_name, extras.tower_not_loaded))
    weights_label, weights_per_gpu, experts_per_gpu, groups, shares = split.weights
    offloaded = engine.weights_offloaded(model, weights_per_gpu, weights_dtype_name, groups, shares)
    weights_per_gpu -= offloaded
    added = draft_and_adapters(model, draft, engine, parallel, weights_dtype_name)
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
        breakdown = {"given": overhead} if overhead is not None else engine.overhead().model_dump() | extras.overhead
        overhead_bytes = sum(breakdown.values())
        budget = engine.kv_budget(hardware.memory_bytes, fraction, weights_per_gpu + added.gpu_bytes,
                                  overhead_bytes)
    pools = [engine.pool(layers, model, kv) for layers in split.stages]
    target_pools = None
    if added.method:  # one stage: speculation_options refuses PP
        target_pools = pools
        pools = [engine.speculative_pool(split.stages[0], added.draft_layers, added.draft, model, kv)]
    return Deployment(engine, kv, weights_label, weights_dtype_name, weights_per_gpu, experts_per_gpu, fraction,
                       overhead_bytes, breakdown, budget, split, pools, [*notes, *added.notes], extras, offloaded,
                       added, target_pools)
