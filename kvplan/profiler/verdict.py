"""The judging: each component's error against the measured figure, the one-line verdict (KV exact to the byte,
total within 3%), and what the run measured outside torch's allocator beside kvplan's CUDA context."""

from kvplan.engines.transformers_engine import CUDA_CONTEXT
from kvplan.profiler.prediction import Prediction, runtime_major
from kvplan.profiler.results import Component, Profile

TOTAL_TOLERANCE = 0.03  # total VRAM within 3%


def judge(result: Profile, predicted: Prediction) -> None:
    comps = [Component.of("weights", predicted.weights, result.measured_weights_bytes),
             Component.of("KV after decode", predicted.kv, result.measured_kv_bytes),
             Component.of("KV right after prefill", predicted.kv_after_prefill,
                          result.measured_kv_after_prefill_bytes),
             Component.of("activations and other (peak)", predicted.activations_and_other,
                          result.measured_activation_peak_bytes),
             Component.of("allocator reserved", predicted.reserved, result.measured_reserved_bytes),
             Component.of("CUDA context and non-torch", predicted.cuda_context, result.measured_non_torch_bytes),
             Component.of("total", predicted.total, result.measured_total_bytes)]
    result.components = comps
    parts = []
    if result.measured_kv_bytes is not None:
        kv_ok = result.measured_kv_bytes == predicted.kv and (
            result.measured_kv_after_prefill_bytes in (None, predicted.kv_after_prefill))
        result.kv_exact = kv_ok
        parts.append("KV cache: measured = predicted to the byte" if kv_ok else
                     f"KV cache: predicted {_signed(comps[1])}, after prefill {_signed(comps[2])}")
    if comps[0].measured is not None:
        parts.append("weights: exact" if comps[0].error_bytes == 0 else f"weights: {_signed(comps[0])}")
    if comps[3].measured is not None:
        parts.append(f"activations: {_signed(comps[3])}")
    total = comps[-1]
    if total.measured is not None:
        within = abs(total.error_bytes) <= TOTAL_TOLERANCE * total.measured
        parts.append(f"total: {_signed(total)} ({'within' if within else 'outside'} the 3% target)")
    elif result.measured_kv_bytes is not None and not result.device.startswith("cuda"):
        parts.append("total: not measured on the CPU (allocator and driver figures are CUDA's)")
    if result.max_batch is not None:
        mb = result.max_batch
        parts.append(f"max batch: measured {mb.measured:,}, predicted {mb.predicted:,}")
    result.verdict = "; ".join(parts) if parts else "nothing measured"


def _signed(comp: Component) -> str:
    if comp.error_bytes is None:
        return "n/a"
    if comp.error_bytes == 0:
        return "exact"
    pct = f", {comp.error_pct:+.2f}%" if comp.error_pct is not None else ""
    return f"off by {comp.error_bytes:+,} B{pct}"


CONTEXT_TOLERANCE = 0.05  # a measured CUDA context this far from kvplan's figure is worth saying


def context_notes(result: Profile) -> list[str]:
    """What the run measured outside torch's allocator, beside the figure kvplan uses for this CUDA runtime, where
    kvplan has none of its own for the runtime or the two differ."""
    measured = result.measured_non_torch_bytes
    if measured is None:
        return []
    runtime = runtime_major(result.cuda_version)
    at_start = result.measured_cuda_context_bytes
    start = f" ({at_start:,} B before the first allocation)" if at_start is not None else ""
    if runtime not in CUDA_CONTEXT:
        return [f"CUDA {result.cuda_version}: kvplan has no measurement of its own for this runtime and assumes "
                f"{result.predicted_cuda_context_bytes:,} B outside torch's allocator; this run measured "
                f"{measured:,} B{start}"]
    if abs(measured - result.predicted_cuda_context_bytes) > CONTEXT_TOLERANCE * measured:
        return [f"outside torch's allocator this run measured {measured:,} B{start}; kvplan uses "
                f"{result.predicted_cuda_context_bytes:,} B for CUDA {runtime}, measured on an H100"]
    return []
