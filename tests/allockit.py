"""The allocation sequence of a real transformers model, recorded: every tensor storage its build, prefill and decode
steps create and free, as `kvplan profile` runs them, in the encoding of `kvplan.engines.transformers_allocations`
(a size allocates the next slot, ~slot frees it).

The model runs on the meta device, so a full-size model at a full-size batch costs no memory and no arithmetic; a
TorchDispatchMode sees every storage an aten op returns that none of its inputs owns, and a weakref on the storage
sees it freed. On the meta device torch's SDPA would take its math path, so `scaled_dot_product_attention` is
replaced, while recording, by the path torch takes on CUDA (`aten/src/ATen/native/transformers/attention.cpp`,
`cuda/sdp_utils.cpp`): the flash kernel where there is no mask and q, k and v share a head size of at most 256
(fp16/bf16), else the memory-efficient kernel, with a boolean mask made additive (`convert_boolean_attn_mask`) and
padded to a multiple of 8 columns where its strides are not (`preprocess_mask`), each through torch's own meta
kernel for that op; the memory-efficient kernel's fp32 output accumulator, which CUTLASS's kernel keeps for head
sizes over 128 (`kNeedsOutputAccumulatorBuffer`), is added. The cuBLAS workspace is not a tensor: the generator
adds it."""

import weakref
from contextlib import contextmanager

import torch
import transformers
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from kvplan.profiler import config as profile_config
from kvplan.profiler import runtime

LOW_PRECISION = (torch.float16, torch.bfloat16)


class Recorder(TorchDispatchMode):
    """Storage allocations and frees on the meta device, as kvplan's event encoding."""

    def __init__(self):
        super().__init__()
        self.events: list[int] = []
        self.slots: dict[int, int] = {}  # live storage (its StorageImpl's address) -> slot
        self.count = 0

    def _freed(self, key: int) -> None:
        self.events.append(~self.slots.pop(key))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        owned = {t.untyped_storage()._cdata for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for tensor in tree_leaves(out):
            if not isinstance(tensor, torch.Tensor) or tensor.device.type != "meta":
                continue
            storage = tensor.untyped_storage()
            key, size = storage._cdata, storage.nbytes()
            if size and key not in owned and key not in self.slots:
                self.slots[key] = self.count
                self.count += 1
                self.events.append(size)
                weakref.finalize(storage, self._freed, key)
        return out


def cuda_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """torch's SDPA as it runs on CUDA, on meta tensors: flash or memory-efficient attention (see the module)."""
    aten = torch.ops.aten
    same_dims = query.shape[-1] == key.shape[-1] == value.shape[-1] <= 256
    if attn_mask is None and same_dims and query.dtype in LOW_PRECISION:
        return aten._scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal, False,
                                                        scale=scale)[0]
    assert not enable_gqa and query.shape[1] == key.shape[1], "memory-efficient attention needs as many k as q heads"
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        zero = torch.scalar_tensor(0.0, dtype=query.dtype, device=query.device)
        attn_mask = torch.where(attn_mask.logical_not(), float("-inf"), zero)
    if attn_mask is not None and not _aligned(attn_mask):  # pad_bias<8>
        columns = attn_mask.shape[-1]
        attn_mask = torch.nn.functional.pad(attn_mask, (0, 8 - columns % 8))[..., :columns]
    if attn_mask is not None:
        attn_mask = attn_mask.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])
    out = aten._scaled_dot_product_efficient_attention(query, key, value, attn_mask, False, dropout_p, is_causal,
                                                       scale=scale)[0]
    if value.shape[-1] > 128 and query.dtype != torch.float32:  # CUTLASS's fp32 output accumulator, while it runs
        torch.empty(*query.shape[:-1], value.shape[-1], dtype=torch.float32, device=query.device)
    return out


def _aligned(mask) -> bool:
    """aligned_tensor<8>: every stride but the last a multiple of 8, the last 1."""
    return mask.stride(-1) == 1 and all(stride % 8 == 0 for stride in mask.stride()[:-1])


@contextmanager
def cuda_attention():
    saved = torch.nn.functional.scaled_dot_product_attention
    torch.nn.functional.scaled_dot_product_attention = cuda_sdpa
    try:
        yield
    finally:
        torch.nn.functional.scaled_dot_product_attention = saved


def record_run(model: str, batch: int, prompt: int, steps: int, dtype: str = "bf16",
               layers: int | None = None) -> tuple[list[int], list[int]]:
    """(events, phase ends: after build, after prefill, after decode) of `kvplan profile`'s run of `model` (a
    library name or config.json path, its first `layers` layers): built with random weights, `batch` prompts of
    `prompt` tokens prefilled with logits for the last token, `steps` cached decode steps
    (kvplan/profiler/session.py)."""
    source = profile_config.resolve(model)
    data, _ = profile_config.first_layers(source, layers)
    model_type, fields, _ = profile_config.transformers_fields(data)
    config = runtime.make_config(transformers, model_type, fields)
    model_class = runtime.causal_lm_class(transformers, config)
    from transformers.initialization import no_init_weights

    recorder = Recorder()
    ends = []
    with cuda_attention(), recorder:
        with torch.device("meta"), no_init_weights():
            built = model_class._from_config(config, dtype=getattr(torch, runtime.TORCH_DTYPES[dtype]))
        built.tie_weights()
        built.eval()
        ends.append(len(recorder.events))
        with torch.inference_mode():
            ids = torch.empty(batch, prompt, dtype=torch.long, device="meta")
            cache = runtime.new_cache(transformers, built)
            token = _next(built, ids, cache)
            ends.append(len(recorder.events))
            for _ in range(steps):
                token = _next(built, token, cache)
            ends.append(len(recorder.events))
        del token, cache, ids, built
    return recorder.events[:ends[-1]], ends


def _next(model, ids, cache):
    """session.Session.forward: the next token of each sequence, logits for the last one only."""
    out = model(input_ids=ids, use_cache=True, past_key_values=cache, logits_to_keep=1)
    return out.logits[:, -1:].argmax(-1)
