"""Why a deployment does not fit and what would make it fit, and `capacity`, the whole report: the users counted
(`count`) with the reason and the suggestions where they fall short."""

from kvplan import engines
from kvplan.capacity.layout import describe_layout
from kvplan.capacity.plan import best_layout, kv_options, minimum_gpus
from kvplan.capacity.users import Capacity, count
from kvplan.dtypes import WEIGHT_DTYPES, kv_dtype, weight_dtype
from kvplan.engines import EngineOptions
from kvplan.memory import weights_bytes
from kvplan.model import Hardware, ModelSpec, Parallelism, Workload


def users_label(n: int) -> str:
    return f"{n:,} user" + ("" if n == 1 else "s")




def layout_label(cap: Capacity) -> str:
    """`TP >= 2` for one tensor-parallel group, else the whole layout: `16 GPUs (TP 8 x PP 2)`."""
    if cap.gpus == cap.tensor_parallel_size:
        return f"TP >= {cap.tensor_parallel_size}"
    return f"{cap.gpus} GPUs ({_layout(cap)})"


def _gib(n: int) -> str:
    return f"{n / (1 << 30):,.2f} GiB"


def _reason(cap: Capacity) -> str:
    if cap.kv_budget_bytes <= 0 and not cap.kv_budget_given:
        usable = int(cap.gpu_memory_bytes * cap.memory_fraction)
        beside = "".join(f", {what} ({_gib(size)})" for what, size in (
            ("draft weights", cap.draft_weights_bytes_per_gpu), ("LoRA slots", cap.lora_bytes_per_gpu)) if size)
        return (f"weights ({_gib(cap.weights_bytes_per_gpu)} per GPU){beside} and overhead "
                f"({_gib(cap.overhead_bytes)}) leave no KV memory in the {_gib(usable)} the engine may use")
    activations = cap.engine_activation_bytes_per_sequence
    label = engines.engine_class(cap.engine).activations_label
    also = f" and {_gib(activations)} of {label}" if activations else ""
    if cap.max_concurrent_users == 0:
        # named where one sequence alone would fit: then what the pools hold whatever the users is why it does not
        alone = cap.engine_kv_bytes_per_sequence + activations <= cap.kv_budget_bytes
        fixed = (f" beside the {_gib(cap.engine_kv_bytes_fixed)} its pools hold whatever the users"
                 if cap.engine_kv_bytes_fixed and alone else "")
        return (f"one sequence of {cap.ctx:,} tokens needs {_gib(cap.engine_kv_bytes_per_sequence)} of KV "
                f"cache{also}{fixed}; the budget is {_gib(cap.kv_budget_bytes)}")
    verb = "fits" if cap.max_concurrent_users == 1 else "fit"
    if cap.max_concurrent_users_bound == "sequence_limit":
        limit, engine = cap.sequence_limit, engines.engine_class(cap.engine)
        return (f"one {engine.label} instance holds at most {users_label(limit)} "
                f"({engine.sequence_limit_reason.format(limit=limit)}); {cap.users:,} asked")
    each = f"{_gib(cap.engine_kv_bytes_per_sequence_decode)} each"
    if cap.engine_kv_bytes_per_sequence_decode != cap.engine_kv_bytes_per_sequence:
        each += " in steady decode"
    each += f", {_gib(activations)} {label}" if also else ""
    return f"{users_label(cap.max_concurrent_users)} {verb} at {cap.ctx:,} tokens ({each}); {cap.users:,} asked"



def _suggestions(model: ModelSpec, workload: Workload, cap: Capacity, parallel: Parallelism,
                 kv_name: str | None, weights_name: str | None, settings: dict) -> list[str]:
    """What would make it fit, each one change that does: a smaller KV dtype, another layout of the same GPUs
    (`best_layout`, as `kvplan plan` ranks them), smaller weights, more GPUs (`minimum_gpus`, as `plan` finds
    them; asked only where no layout of these GPUs fits), or a shorter context."""
    out = []
    engine = engines.engine(cap.engine, settings["options"])
    kv = kv_dtype(cap.kv_dtype)
    smaller_kv = [d for d in kv_options(engine, model) if kv_dtype(d).bits < kv.bits]
    for name in smaller_kv[:1]:
        alt = count(model, workload, parallel=parallel, kv_dtype_name=name, weights_dtype_name=weights_name,
                    **settings)
        if alt.fits:
            out.append(f"{name} KV fits {users_label(alt.max_concurrent_users)}")
    if cap.kv_budget_bytes <= 0 and not cap.kv_budget_given:
        current = (weight_dtype(cap.weights_dtype).bits if cap.weights_dtype in WEIGHT_DTYPES  # GGUF: a mix of types
                   else 8 * weights_bytes(model)[0] / model.params.total)
        for name in ("fp8", "int4"):
            if weight_dtype(name).bits >= current:
                continue
            alt = count(model, workload, parallel=parallel, kv_dtype_name=kv_name, weights_dtype_name=name,
                        **settings)
            if alt.fits:
                out.append(f"{name} weights fit {users_label(alt.max_concurrent_users)}")
                break
    if not cap.kv_budget_given:
        here = best_layout(model, workload, parallel.gpus, type(engine), kv_name, weights_name, settings)
        if here is not None:
            out.append(f"{_layout(here)} on the same {here.gpus} GPUs fits {users_label(here.max_concurrent_users)}")
        else:
            more = minimum_gpus(model, workload, type(engine), kv_name, weights_name, settings, above=parallel.gpus)
            if more is not None:
                out.append(f"needs {layout_label(more)}: {more.gpus} x {cap.gpu or 'this GPU'} fit "
                           f"{users_label(more.max_concurrent_users)}")
    if workload.users and cap.max_ctx_for_users:
        verb = "fits" if workload.users == 1 else "fit"
        out.append(f"{users_label(workload.users)} {verb} at up to {cap.max_ctx_for_users:,} tokens each")
    return out


def _layout(cap: Capacity) -> str:
    return describe_layout(cap.tensor_parallel_size, cap.pipeline_parallel_size, cap.data_parallel_size,
                           cap.expert_parallel_size, cap.data_parallel_replicas)


def capacity(model: ModelSpec, workload: Workload, *, engine_name: str = "vllm",
             options: EngineOptions | None = None, hardware: Hardware | None = None,
             parallel: Parallelism | None = None, kv_dtype_name: str | None = None,
             weights_dtype_name: str | None = None, kv_budget: int | None = None,
             overhead: int | None = None, suggest: bool = True, draft: ModelSpec | None = None) -> Capacity:
    """Capacity of `parallel.gpus` GPUs serving `model` under one engine, for the workload (`count`), and where it
    falls short, the reason and (`suggest`) what would make it fit; `draft`: the draft model of speculative
    decoding."""
    options, hardware = options or EngineOptions(), hardware or Hardware()
    parallel = parallel or Parallelism()
    settings = dict(engine_name=engine_name, options=options, hardware=hardware, kv_budget=kv_budget,
                    overhead=overhead, draft=draft)
    result = count(model, workload, parallel=parallel, kv_dtype_name=kv_dtype_name,
                   weights_dtype_name=weights_dtype_name, **settings)
    if result.fits:
        return result
    update = {"reasons": [_reason(result)]}
    if suggest:
        update["suggestions"] = _suggestions(model, workload, result, parallel, kv_dtype_name,
                                             result.weights_dtype_override, settings)
    return result.model_copy(update=update)
