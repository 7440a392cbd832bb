"""The measured steps: a model built on its device (`Session`), prefilled and decoded, the cache measured after
each phase and the allocator and driver around each (`decode_run`), set beside the prediction layer kind by layer
kind. What the profile tells while it runs goes to a `Progress`."""

import inspect
from contextlib import contextmanager, nullcontext

from kvplan.model import ModelSpec
from kvplan.profiler import runtime
from kvplan.profiler.prediction import Prediction, layer_caches, layer_label
from kvplan.profiler.results import KindRow, Profile


class Progress:
    """What the profile tells while it runs; the CLI gives a progress bar or lines, tests and --json nothing."""

    def notice(self, text: str) -> None:
        """Something to know before a long run starts."""

    @contextmanager
    def phase(self, description: str, total: int | None = None):
        yield lambda steps=1: None


class Session:
    """One model built on one device, ready for prefill and decode runs. A model whose forward takes the whole
    sequence at every cached step (`engines.Transformers.WHOLE_SEQUENCE_DECODE`) is fed it, as generate() does:
    the session keeps the sequence of its latest run."""

    def __init__(self, torch, transformers, model, device: str, vocab: int, cache: str, ctx: int,
                 whole_sequence: bool = False):
        self.torch, self.transformers, self.model = torch, transformers, model
        self.device, self.vocab, self.cache, self.ctx = device, vocab, cache, ctx
        self.whole_sequence, self.sequence = whole_sequence, None
        self.forwards = 0  # forward passes run
        parameters = inspect.signature(model.forward).parameters
        self.logits_to_keep = "logits_to_keep" in parameters
        self.cache_name = runtime.cache_argument(transformers, model)
        self.generator = torch.Generator(device=device).manual_seed(1)

    def new_cache(self):
        return runtime.new_cache(self.transformers, self.model, self.ctx if self.cache == "static" else None)

    def tokens(self, batch: int, length: int):
        return self.torch.randint(0, self.vocab, (batch, length), device=self.device, generator=self.generator)

    def prefill(self, ids, cache):
        """The prompt's forward pass: the next token of each sequence."""
        self.sequence = ids
        return self.forward(ids, cache)

    def step(self, token, cache):
        """One cached decode step on the token just made (or on the whole sequence so far)."""
        if not self.whole_sequence:
            return self.forward(token, cache)
        self.sequence = self.torch.cat([self.sequence, token], dim=-1)
        return self.forward(self.sequence, cache)

    def forward(self, ids, cache=None, last_only: bool = True):
        """The next token of each sequence; an OOM propagates (a finding), any other failure of the model's code
        becomes a one-line error."""
        kwargs = {"logits_to_keep": 1} if last_only and self.logits_to_keep else {}
        self.forwards += 1
        try:
            if cache is None:
                out = self.model(input_ids=ids, use_cache=False, **kwargs)
            elif isinstance(cache, runtime.ModelCache):  # the model's own cache: made by the first forward
                out = self.model(input_ids=ids, use_cache=True, **{cache.argument: cache.value}, **kwargs)
                cache.value = getattr(out, cache.argument)
            else:
                out = self.model(input_ids=ids, use_cache=True, **{self.cache_name: cache}, **kwargs)
        except Exception as err:
            if runtime.is_oom(self.torch, err):
                raise
            raise runtime.failed(self.transformers, f"running {self.model.config.model_type} on {ids.shape[0]:,} x "
                                 f"{ids.shape[1]:,} tokens", err) from None
        return out.logits[:, -1:].argmax(-1)


def decode_run(session: Session, probe, result: Profile, predicted: Prediction, spec: ModelSpec,
                progress: Progress, times: dict) -> None:
    """Prefill the prompt, decode the steps; the cache measured after each, the allocator around each."""
    torch, device, batch = session.torch, session.device, result.batch
    built_allocated = result.memory[-1].allocated
    cache = session.new_cache()
    ids = session.tokens(batch, result.prompt_tokens)
    # torch.cuda counts the allocator's peak on a GPU; on the CPU the allocator's own records (allocator_peak)
    counted = runtime.allocator_peak if not device.startswith("cuda") else lambda torch: nullcontext()
    with torch.inference_mode():
        with progress.phase(f"prefill: {batch:,} x {result.prompt_tokens:,} tokens"):
            probe.reset_peak()
            with runtime.timed(torch, device, times, "prefill"), counted(torch) as prefill:
                token = session.prefill(ids, cache)
        result.ttft_s = times["prefill"]
        result.prefill_tokens_per_s = batch * result.prompt_tokens / times["prefill"]
        result.cache_class = type(runtime.cache_object(cache)).__name__
        after_prefill = runtime.cache_layers(cache, session.model)
        result.measured_kv_after_prefill_bytes = sum(layer.kv_storage for layer in after_prefill)
        snap = probe.snapshot("after prefill")
        result.memory.append(snap)
        # allocated above the built model: at the prefill's peak, and once it is done
        peak, held = (snap.max_allocated - built_allocated, snap.allocated - built_allocated) if prefill is None \
            else (prefill.peak, prefill.net)
        result.measured_prefill_activation_bytes = peak - result.measured_kv_after_prefill_bytes
        with progress.phase(f"decode: {result.decode_steps:,} steps", total=result.decode_steps) as advance:
            probe.reset_peak()
            with runtime.timed(torch, device, times, "decode"), counted(torch) as decode:
                for _ in range(result.decode_steps):
                    token = session.step(token, cache)
                    advance()
        result.decode_tokens_per_s = batch * result.decode_steps / times["decode"]
    final = runtime.cache_layers(cache, session.model)
    result.measured_kv_bytes = sum(layer.kv_storage for layer in final)
    result.measured_kv_view_bytes = sum(layer.kv_view for layer in final)
    result.cache_bookkeeping_bytes = sum(layer.storage.get("bookkeeping", 0) for layer in final)
    snap = probe.snapshot("after decode")
    result.memory.append(snap)
    peak = snap.max_allocated - built_allocated if decode is None else held + decode.peak
    result.measured_decode_above_cache_bytes = peak - result.measured_kv_bytes
    result.measured_activation_peak_bytes = max(result.measured_prefill_activation_bytes,
                                                 result.measured_decode_above_cache_bytes)
    if snap.reserved is not None:
        result.measured_reserved_bytes = snap.reserved
        result.measured_cuda_context_bytes = result.memory[0].process_used
    if snap.process_used is not None:
        result.measured_non_torch_bytes = snap.process_used - snap.reserved
        result.measured_total_bytes = snap.process_used
    elif snap.device_used is not None and result.memory[0].device_used is not None:
        result.measured_total_bytes = snap.device_used - result.memory[0].device_used
        result.measured_non_torch_bytes = result.measured_total_bytes - snap.reserved
    result.by_kind = _by_kind(final, spec.caches, predicted, result)


def _by_kind(final, spec_caches, predicted: Prediction, result: Profile) -> list[KindRow]:
    """Measured layers grouped as the prediction groups them (kvplan's kind labels, in layer order)."""
    rows: dict[str, KindRow] = {}
    by_layer = list(layer_caches(spec_caches).values())
    for layer, caches in zip(final, by_layer, strict=False):
        label = layer_label(caches)
        layers, size = predicted.by_kind.get(label, (0, 0))
        row = rows.setdefault(label, KindRow(kind=label, layers=layers, tokens_measured=layer.tokens,
                                             predicted=size, measured=0, measured_view=0,
                                             cache_layer_class=layer.layer_class, dtypes=[]))
        row.measured += layer.kv_storage
        row.measured_view += layer.kv_view
        row.dtypes = sorted(set(row.dtypes) | layer.dtypes)
        if layer.layer_class not in row.cache_layer_class.split(", "):
            row.cache_layer_class += f", {layer.layer_class}"
    if len(final) != len(by_layer):
        result.findings.append(f"the cache has {len(final)} layers; kvplan's layout has {len(by_layer)}")
    return list(rows.values())
