"""kvplan's prediction for a profile: the `transformers` engine's, for the same (cut) model, layers, ctx, batch,
dtype and device. Nothing here imports torch.

weights = kvplan.memory.weights_bytes in the profile dtype; KV = TransformersPool.bytes_held and
bytes_after_prefill; activations = the prefill's peak (engines.PrefillActivations) and the decode phase's above its
cache (`decode_above_cache`), and on a GPU the BLAS workspace; the allocator's reserve = the run's allocations
replayed through torch's caching allocator (the pool's DeviceRun, as capacity plans it, with
PYTORCH_CUDA_ALLOC_CONF's expandable_segments as set); CUDA context = what the process holds outside the allocator
under this CUDA runtime (engines.transformers_engine.CUDA_CONTEXT); total = the reserve + the CUDA context, or, for a
model whose allocations kvplan does not replay, the peak of live tensors (`Prediction.live_peak`) + the CUDA
context.
"""

from collections import Counter

from pydantic import BaseModel

from kvplan import engines
from kvplan.capacity import gpu_layers
from kvplan.dtypes import kv_dtype
from kvplan.engines.transformers_engine import PLANNED_RUNTIME, cuda_context
from kvplan.memory import kind_label, weights_bytes
from kvplan.model import ModelSpec
from kvplan.profiler import runtime


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


def layer_caches(caches) -> dict[int, list]:
    """The caches of each layer, in layer order: transformers keeps one cache layer per decoder layer, holding
    both caches of a layer that has two (MLA and its indexer keys, attention beside a Mamba mixer)."""
    out: dict[int, list] = {}
    for cache in caches:
        out.setdefault(cache.layer, []).append(cache)
    return out


def layer_label(caches) -> str:
    return " + ".join(kind_label(c) for c in caches)
