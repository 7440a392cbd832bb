"""The math: a ModelSpec and a workload in, exact analytic bytes out (no engine rules; those are in engines).

For each cache layer (see `kvplan.model`):
    bytes per token    = K row + V row = bytes(kv_heads x head_dim) + bytes(kv_heads x head_dim_v)
                         (MLA: bytes(kv_lora_rank + qk_rope_head_dim), one row shared by all heads)
    bytes per sequence = bytes per token x tokens held at ctx + recurrent state
    tokens held        = ctx (full, MLA), min(ctx, W) (sliding), min(ctx, C) (chunked), encoder length (cross),
                         ctx // m entries of a compressed cache (DeepSeek V4: bytes per token are per entry)
and for the model: the sum over layers, times the batch. For plain attention this is the familiar
2 x layers x kv_heads x head_dim x bytes x tokens x batch (e.g. vLLM's `AttentionSpec.page_size_bytes` per token).
Weights, when the checkpoint's safetensors headers (or its GGUF file's header) were read and no --weights-dtype is
given, are exact:
    weights = sum over dtypes of ceil(elements x bits of the dtype / 8)
    (GGUF: sum over ggml types of elements / elements per block x bytes per block, `kvplan.dtypes.GGML_TYPES`)
(the bytes the tensors hold, packed quantised ones included); otherwise parameters x bytes per parameter of the
dtype each parameter group is stored in.
"""

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict

from kvplan.dtypes import FLOAT_DTYPES, GGML_BY_NAME, SAFETENSORS_BITS, DType, kv_dtype, weight_dtype
from kvplan.model import (
    KV_KINDS,
    LINEAR_GROUPS,
    WEIGHT_GROUPS,
    CheckpointTensors,
    LayerCache,
    ModelSpec,
    ParamCounts,
)


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
    v_dtype: str | None = None  # the values' dtype where it differs from the keys' (llama.cpp --cache-type-v)
    weights_dtype: str
    kv_bytes_per_token: int
    kv_bytes_per_sequence: int
    kv_bytes_total: int
    state_bytes_per_sequence: int
    weights_bytes: int
    weights_source: str = "config"  # "checkpoint": exact, from the safetensors or GGUF tensors; "config": derived
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
    """Bytes the checkpoint's tensors hold, by stored dtype: ceil(elements x bits / 8) for safetensors; whole
    blocks of the ggml type for GGUF (every GGUF tensor's rows are whole blocks, so the elements of a type are
    too)."""
    if checkpoint.format == "gguf":
        return {dtype: GGML_BY_NAME[dtype].bytes_for(count) for dtype, count in checkpoint.elements.items()}
    return {dtype: -(-count * SAFETENSORS_BITS[dtype] // 8) for dtype, count in checkpoint.elements.items()}


def checkpoint_bytes(checkpoint: CheckpointTensors) -> int:
    return sum(checkpoint_bytes_by_dtype(checkpoint).values())


def vision_bytes(model: ModelSpec, dtype_name: str | None = None) -> int:
    """Bytes of the vision tower and projector within weights_bytes: in a float --weights-dtype where one is given,
    else the checkpoint's float dtype (quantised checkpoints and quantised overrides leave towers unquantised)."""
    chosen = weight_dtype(dtype_name) if dtype_name else None
    dtype = chosen if chosen is not None and chosen.name in FLOAT_DTYPES else weight_dtype(model.dtype)
    return dtype.bytes_for(model.params.vision)


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
    A GGUF file's label is its file type (Q4_K_M), a mix of ggml types no single weights dtype names.
    """
    by_group, label = weights_by_group(model, dtype_name)
    if weights_from_checkpoint(model, dtype_name):
        return checkpoint_bytes(model.checkpoint), label
    return sum(by_group.values()), label


def weights_by_group(model: ModelSpec, dtype_name: str | None = None) -> tuple[dict[str, int], str]:
    """Bytes of each parameter group (ParamCounts' fields but active_experts) as the config counts them, each in
    the dtype `weights_bytes` stores it in, and the dtype label. A checkpoint's exact bytes (`weights_bytes`) are
    not grouped by tensor; what parallelism splits by group scales these to them."""
    native = weight_dtype(model.dtype)
    groups: tuple[str, ...] = ()
    if dtype_name:
        chosen = weight_dtype(dtype_name)
        label = chosen.name
        groups = tuple(ParamCounts.model_fields) if chosen.name in FLOAT_DTYPES else LINEAR_GROUPS
    elif model.quantization and model.quantization.method == "gguf":
        # each tensor of a GGUF file has its own ggml type (its file type, Q4_K_M, names the mix): the groups in
        # the model dtype, which the file's exact bytes scale (`kvplan.capacity.weights_on_gpu`)
        chosen, label = native, model.quantization.weights_dtype
    elif model.quantization:
        chosen = weight_dtype(model.quantization.weights_dtype)
        label = chosen.name
        groups = model.quantization.groups
    else:
        chosen, label = native, native.name
    counts = model.params.__dict__  # its fields (model_dump copies them, which a planning sweep does per GPU)
    return {group: (chosen if group in groups else native).bytes_for(counts[group]) for group in WEIGHT_GROUPS}, label


def kind_label(cache) -> str:
    if cache.kind == "sliding":
        return f"sliding window {cache.window:,}"
    if cache.kind == "chunked":
        return f"chunked {cache.chunk:,}"
    if cache.kind == "recurrent":
        return f"recurrent ({cache.mixer})"
    if cache.kind == "mla" and cache.window:
        return f"MLA latent, sliding window {cache.window:,}"
    if cache.kind == "sliding_kv":
        return f"sliding window {cache.window:,}, K=V"
    if cache.kind == "compressed":
        what = "indexer keys" if cache.indexer else "KV"
        return f"compressed {what}, 1 per {cache.ratio:,} tokens"
    if cache.kind == "states":
        kept = f", last {cache.memory:,} tokens" if cache.memory else ""
        return f"{cache.holds}{kept}" + (f", beyond {cache.after:,} tokens" if cache.after else "")
    if cache.kind == "prefixed":
        return f"full attention + {cache.prefix:,} prompt tokens"
    return {"full": "full attention", "mla": "MLA latent", "indexer": "indexer keys", "cross": "cross-attention",
            "shared": "KV shared with an earlier layer", "none": "no cache"}[cache.kind]


def kinds(model: ModelSpec, kv: DType, v: DType | None = None) -> dict[str, list[tuple[LayerCache, int, int, int]]]:
    """The model's caches under their report labels, in first-seen layer order, identical layers (every field but
    the layer index) once: {label: [(cache, layers, bytes per token of one, state bytes of one)]}, values in `v`
    where given. A model has a handful, so an estimate at many contexts (`kvplan table`) walks them rather than
    every layer each time."""
    model_dtype = kv_dtype(model.dtype)
    alike: dict[tuple, list] = {}  # identical caches share a label, so it is made once for them
    labels: dict[str, list[list]] = {}
    for cache in model.caches:
        entry = alike.get(same := cache.alike_key())
        if entry is None:
            entry = alike[same] = [cache, 0, cache.bytes_per_token(kv, v), cache.state_bytes(model_dtype)]
            labels.setdefault(kind_label(cache), []).append(entry)
        entry[1] += 1
    return {label: [tuple(entry) for entry in group] for label, group in labels.items()}


def breakdown(model: ModelSpec, ctx: int, kv: DType, v: DType | None = None) -> list[KindTotals]:
    """Per-kind totals for one sequence at ctx, in first-seen layer order (values in `v` where given)."""
    return _rows(kinds(model, kv, v), ctx)


def _rows(by_label: dict[str, list[tuple[LayerCache, int, int, int]]], ctx: int) -> list[KindTotals]:
    """A row per kind: its layers, their bytes per token, the tokens a layer holds (the most, where they differ)
    and the bytes of one sequence: per token x tokens held + state, summed."""
    rows = []
    for label, group in by_label.items():
        layers = bytes_per_token = tokens_held = bytes_per_sequence = 0
        for cache, n, per_token, state in group:
            tokens = cache.tokens_held(ctx)
            layers += n
            bytes_per_token += n * per_token
            tokens_held = max(tokens_held, tokens)
            bytes_per_sequence += n * (per_token * tokens + state)
        rows.append(KindTotals(kind=label, layers=layers, bytes_per_token=bytes_per_token, tokens_held=tokens_held,
                               bytes_per_sequence=bytes_per_sequence))
    return rows


def estimate(model: ModelSpec, ctx: int, batch: int = 1, kv_dtype_name: str | None = None,
             weights_dtype_name: str | None = None, v_dtype_name: str | None = None) -> Estimate:
    """Analytic memory for `batch` sequences each holding `ctx` tokens (prompt plus generated); the values in
    `v_dtype_name` where given (keys and values in different dtypes)."""
    return estimates(model, [ctx], batch, kv_dtype_name, weights_dtype_name, v_dtype_name)[0]


def estimates(model: ModelSpec, ctxs: Sequence[int], batch: int = 1, kv_dtype_name: str | None = None,
              weights_dtype_name: str | None = None, v_dtype_name: str | None = None) -> list[Estimate]:
    """`estimate` at each ctx, the layers grouped once."""
    kv = kv_dtype(kv_dtype_name or default_kv_dtype(model))
    v = kv_dtype(v_dtype_name) if v_dtype_name else None
    by_label = kinds(model, kv, v)
    groups = [entry for group in by_label.values() for entry in group]
    per_token = sum(n * bytes_per_token for cache, n, bytes_per_token, _ in groups if cache.kind in KV_KINDS)
    state = sum(n * state_bytes for _, n, _, state_bytes in groups)
    weights, weights_label = weights_bytes(model, weights_dtype_name)
    source = "checkpoint" if weights_from_checkpoint(model, weights_dtype_name) else "config"
    params_total, params_active = model.params.total, model.params.active
    out = []
    for ctx in ctxs:
        rows = _rows(by_label, ctx)
        per_sequence = sum(r.bytes_per_sequence for r in rows)
        warnings = []
        if model.max_context and ctx > model.max_context:
            warnings.append(f"ctx {ctx:,} is beyond {model.name}'s max context of {model.max_context:,} tokens")
        out.append(Estimate(
            model=model.name, ctx=ctx, batch=batch, kv_dtype=kv.name, v_dtype=v.name if v and v != kv else None,
            weights_dtype=weights_label,
            kv_bytes_per_token=per_token, kv_bytes_per_sequence=per_sequence, kv_bytes_total=per_sequence * batch,
            state_bytes_per_sequence=state, weights_bytes=weights, total_bytes=weights + per_sequence * batch,
            weights_source=source, params_total=params_total, params_active=params_active,
            breakdown=rows, warnings=warnings, notes=list(model.notes),
        ))
    return out
