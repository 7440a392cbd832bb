"""A profile's decode steps beside the speed model's bound: the bytes a step reads, the bandwidth the measured steps
reached, and its share of the GPU's (the catalogue's, for the GPU the profile ran on).

    step time      = batch / decode tokens/s                     (the profile's S steps timed together)
    bytes a step   = the speed model's decode step at the mean context the steps attend, prompt + (S + 1) // 2
                     (`kvplan.speed.work`: every weight but the embedding, the experts its tokens touch, the KV
                     cache and recurrent state read)
    bandwidth      = bytes a step / step time
    utilisation    = bandwidth / the catalogue's bandwidth of the GPU
    bound          = the step at the GPU's peak rates (`kvplan.speed.bound`), where the catalogue gives them
beside what a serving engine reaches: the share of the bandwidth vLLM's weight reads reach in the speed model's
fitted efficiencies (`kvplan.speed.calibrated`). transformers' eager decode runs kernel after kernel, without the
CUDA graphs, fused kernels and batching of a serving engine, far below that.

Nothing here imports torch: the figures come from a profile's results, so a recorded GPU profile can be checked on
a CPU. A CPU, or a GPU the catalogue does not hold, has no known bandwidth: no figure is made up for it.
"""

from pydantic import BaseModel, ConfigDict

from kvplan import gpus
from kvplan.errors import KvplanError
from kvplan.model import ModelSpec
from kvplan.speed.bound import step_times
from kvplan.speed.calibrated import table
from kvplan.speed.work import Layout, ServingShape


class DecodeBandwidth(BaseModel):
    """The bandwidth a profile's decode steps reached on `gpu` (a catalogue name): bytes in bytes, times in ms,
    bandwidths in GB/s (10**9 bytes)."""

    model_config = ConfigDict(frozen=True)

    gpu: str
    bytes_per_step: int
    step_ms: float
    bandwidth_gbs: float
    gpu_bandwidth_gbs: float
    utilisation: float
    step_ms_bound: float | None
    bound_by: str | None
    serving_utilisation: float  # vLLM's weights_bandwidth in the speed model's fitted efficiencies


def decode_bandwidth(model: ModelSpec, device_name: str, dtype: str, batch: int, prompt: int, steps: int,
                     decode_tokens_per_s: float) -> DecodeBandwidth | None:
    """The bandwidth `steps` decode steps of `batch` sequences after a `prompt`-token prefill reached, in `dtype`
    (weights and cache alike, as the profile builds them), at `decode_tokens_per_s` on the GPU called `device_name`
    (as CUDA names it: the catalogue's aliases hold those names); None for a GPU the catalogue does not hold."""
    try:
        gpu = gpus.find(device_name)
    except KvplanError:
        return None
    shape = ServingShape(model, Layout(), "transformers", dtype, dtype)
    work = shape.decode_step(batch, prompt + (steps + 1) // 2)
    step_ms = batch / decode_tokens_per_s * 1000
    bandwidth = work.hbm_bytes / step_ms / 1e6
    try:
        peak = step_times(work, gpu, shape.weights_dtype_name, shape.kv.name)
        bound_ms, bound_by = peak.bound_ms, peak.binding
    except KvplanError:  # the catalogue gives no tensor throughput for this GPU: no bound, the bandwidth stands
        bound_ms = bound_by = None
    return DecodeBandwidth(gpu=gpu.name, bytes_per_step=work.hbm_bytes, step_ms=step_ms, bandwidth_gbs=bandwidth,
                           gpu_bandwidth_gbs=gpu.bandwidth_gbs, utilisation=bandwidth / gpu.bandwidth_gbs,
                           step_ms_bound=bound_ms, bound_by=bound_by,
                           serving_utilisation=table()["engines"]["vllm"]["efficiencies"]["weights_bandwidth"])
