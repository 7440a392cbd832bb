"""The math: a ModelSpec and a workload in, exact analytic bytes out (no engine rules; those are in engines).

For each cache layer (see `kvplan.model`):
    bytes per token    = K row + V row = bytes(kv_heads x head_dim) + bytes(kv_heads x head_dim_v)
                         (MLA: bytes(kv_lora_rank + qk_rope_head_dim), one row shared by all heads)
    bytes per sequence = bytes per token x tokens held at ctx + recurrent state
    tokens held        = ctx (full, MLA), min(ctx, W) (sliding), min(ctx, C) (chunked), encoder length (cross)
and for the model: the sum over layers, times the batch. For plain attention this is the familiar
2 x layers x kv_heads x head_dim x bytes x tokens x batch (e.g. vLLM's `AttentionSpec.page_size_bytes` per token).
Weights, when the checkpoint's safetensors headers were read and no --weights-dtype is given, are exact:
    weights = sum over dtypes of ceil(elements x bits of the dtype / 8)
(the bytes the tensors hold, packed quantised ones included); otherwise parameters x bytes per parameter of the
dtype each parameter group is stored in.
"""

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict

from kvplan.dtypes import FLOAT_DTYPES, SAFETENSORS_BITS, DType, kv_dtype, weight_dtype
from kvplan.model import KV_KINDS, LINEAR_GROUPS, CheckpointTensors, LayerCache, ModelSpec, ParamCounts


class KindTotals(BaseModel):
    """All the layers of one kind (and window), summed: a row of the report's breakdown."""

    model_config = ConfigDict(defer_build=True)

    kind: str
    layers: int
    bytes_per_token: int
    tokens_held: int
    bytes_per_sequence: int


class Estimate(BaseModel):
    model_config = ConfigDict(defer_build=True)

    model: str
    ctx: int
    batch: int
    kv_dtype: str
    weights_dtype: str
    kv_bytes_per_token: int
    kv_bytes_per_sequence: int
    kv_bytes_total: int
    state_bytes_per_sequence: int
    weights_bytes: int
    weights_source: str = "config"  # "checkpoint": exact, from the safetensors tensors; "config": derived
    total_bytes: int
    params_total: int
    params_active: int
    breakdown: list[KindTotals]
    warnings: list[str]
    notes: list[str]  # how the model was read (the text output's "note:" lines)


def default_kv_dtype(model: ModelSpec) -> str:
    """The checkpoint's KV dtype if its quantization config sets one, else the model's float dtype
    (vLLM's kv_cache_dtype "auto")."""
    return model.kv_dtype or model.dtype


def checkpoint_bytes_by_dtype(checkpoint: CheckpointTensors) -> dict[str, int]:
    """Bytes the checkpoint's tensors hold, by safetensors dtype: ceil(elements x bits / 8)."""
    return {dtype: -(-count * SAFETENSORS_BITS[dtype] // 8) for dtype, count in checkpoint.elements.items()}


def checkpoint_bytes(checkpoint: CheckpointTensors) -> int:
    return sum(checkpoint_bytes_by_dtype(checkpoint).values())


def weights_from_checkpoint(model: ModelSpec, dtype_name: str | None = None) -> bool:
    """Whether weights_bytes counts the checkpoint's real tensors (read, and no dtype override)."""
    return not dtype_name and model.checkpoint is not None


def weights_bytes(model: ModelSpec, dtype_name: str | None = None) -> tuple[int, str]:
    """Bytes of the weights and the dtype label.

    No override: the checkpoint's own storage. With its safetensors headers read (`model.checkpoint`), the
    exact bytes of its tensors; else derived from the config's parameter counts (its quantization config on
    the groups it covers, its float dtype elsewhere). The label is the dtype either way.
    An override is applied to the config's parameter counts: a float one (fp32/bf16/fp16) to every parameter,
    a quantised one (fp8, int8, int4, mxfp4, nf4) to the linear layers only, with embeddings, lm_head and norms
    kept in the checkpoint's float dtype, as AWQ, GPTQ and vLLM's fp8 quantisation leave them.
    """
    native = weight_dtype(model.dtype)
    groups: tuple[str, ...] = ()
    if dtype_name:
        chosen = weight_dtype(dtype_name)
        label = chosen.name
        groups = tuple(ParamCounts.model_fields) if chosen.name in FLOAT_DTYPES else LINEAR_GROUPS
    elif model.quantization:
        chosen = weight_dtype(model.quantization.weights_dtype)
        label = chosen.name
        groups = model.quantization.groups
    else:
        chosen, label = native, native.name
    if weights_from_checkpoint(model, dtype_name):
        return checkpoint_bytes(model.checkpoint), label
    counts = model.params.model_dump(exclude={"active_experts"})
    total = sum((chosen if group in groups else native).bytes_for(count) for group, count in counts.items())
    return total, label


def kind_label(cache) -> str:
    if cache.kind == "sliding":
        return f"sliding window {cache.window:,}"
    if cache.kind == "chunked":
        return f"chunked {cache.chunk:,}"
    if cache.kind == "recurrent":
        return f"recurrent ({cache.mixer})"
    return {"full": "full attention", "mla": "MLA latent", "indexer": "DSA indexer keys", "cross": "cross-attention",
            "shared": "KV shared with an earlier layer", "none": "no cache"}[cache.kind]


def kinds(model: ModelSpec, kv: DType) -> dict[str, list[tuple[LayerCache, int, int, int]]]:
    """The model's caches under their report labels, in first-seen layer order, identical layers (every field but
    the layer index) once: {label: [(cache, layers, bytes per token of one, state bytes of one)]}. A model has a
    handful, so an estimate at many contexts (`kvplan table`) walks them rather than every layer each time."""
    model_dtype = kv_dtype(model.dtype)
    labels: dict[str, dict[tuple, list]] = {}
    for cache in model.caches:
        same = (type(cache), *(value for name, value in cache.__dict__.items() if name != "layer"))
        group = labels.setdefault(kind_label(cache), {})
        if same in group:
            group[same][1] += 1
        else:
            group[same] = [cache, 1, cache.bytes_per_token(kv), cache.state_bytes(model_dtype)]
    return {label: [tuple(entry) for entry in group.values()] for label, group in labels.items()}


def breakdown(model: ModelSpec, ctx: int, kv: DType) -> list[KindTotals]:
    """Per-kind totals for one sequence at ctx, in first-seen layer order."""
    return _rows(kinds(model, kv), ctx)


def _rows(by_label: dict[str, list[tuple[LayerCache, int, int, int]]], ctx: int) -> list[KindTotals]:
    """A row per kind: its layers, their bytes per token, the tokens a layer holds (the most, where they differ)
    and the bytes of one sequence: per token x tokens held + state, summed."""
    return [KindTotals(kind=label, layers=sum(n for _, n, _, _ in group),
                       bytes_per_token=sum(n * per_token for _, n, per_token, _ in group),
                       tokens_held=max(cache.tokens_held(ctx) for cache, _, _, _ in group),
                       bytes_per_sequence=sum(n * (per_token * cache.tokens_held(ctx) + state)
                                              for cache, n, per_token, state in group))
            for label, group in by_label.items()]


def estimate(model: ModelSpec, ctx: int, batch: int = 1, kv_dtype_name: str | None = None,
             weights_dtype_name: str | None = None) -> Estimate:
    """Analytic memory for `batch` sequences each holding `ctx` tokens (prompt plus generated)."""
    return estimates(model, [ctx], batch, kv_dtype_name, weights_dtype_name)[0]


def estimates(model: ModelSpec, ctxs: Sequence[int], batch: int = 1, kv_dtype_name: str | None = None,
              weights_dtype_name: str | None = None) -> list[Estimate]:
    """`estimate` at each ctx, the layers grouped once."""
    kv = kv_dtype(kv_dtype_name or default_kv_dtype(model))
    by_label = kinds(model, kv)
    groups = [entry for group in by_label.values() for entry in group]
    per_token = sum(n * bytes_per_token for cache, n, bytes_per_token, _ in groups if cache.kind in KV_KINDS)
    state = sum(n * state_bytes for _, n, _, state_bytes in groups)
    weights, weights_label = weights_bytes(model, weights_dtype_name)
    source = "checkpoint" if weights_from_checkpoint(model, weights_dtype_name) else "config"
    out = []
    for ctx in ctxs:
        rows = _rows(by_label, ctx)
        per_sequence = sum(r.bytes_per_sequence for r in rows)
        warnings = []
        if model.max_context and ctx > model.max_context:
            warnings.append(f"ctx {ctx:,} is beyond {model.name}'s max context of {model.max_context:,} tokens")
        out.append(Estimate(
            model=model.name, ctx=ctx, batch=batch, kv_dtype=kv.name, weights_dtype=weights_label,
            kv_bytes_per_token=per_token, kv_bytes_per_sequence=per_sequence, kv_bytes_total=per_sequence * batch,
            state_bytes_per_sequence=state, weights_bytes=weights, total_bytes=weights + per_sequence * batch,
            weights_source=source, params_total=model.params.total, params_active=model.params.active,
            breakdown=rows, warnings=warnings, notes=list(model.notes),
        ))
    return out
