"""The physical bound: a step's work (`kvplan.speed.work`) over the GPU's peak rates (`kvplan.gpus`).

    HBM time      = bytes read / HBM bandwidth
    compute time  = linear FLOPs / peak of the weights' dtype + attention FLOPs / peak of the KV dtype
    link time     = bytes sent / NVLink bandwidth one way (half the both-ways figure NVIDIA gives)
    bound         = the largest of the three

No step can take less (no queueing, no kernel inefficiency, perfect overlap of everything with everything): a
lower bound on the time per output token of a decode step, and on the time to first token of a prefill.
Peak rates by dtype: a linear layer stored in NVFP4 or MXFP4 runs at the GPU's FP4 tensor rate where it has one,
FP8 weights (and 8-bit integers) at its FP8 rate, anything else at its BF16 rate; each falls back to the next wider
rate the GPU has, and attention runs at the FP8 rate with an 8-bit KV cache, else at BF16. A layout that spans more
GPUs than one NVLink domain still gets NVLink's bandwidth: the bound stays a bound, with a flag.
"""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from kvplan.errors import KvplanError
from kvplan.gpus import Gpu
from kvplan.speed.work import StepWork

FP4 = ("nvfp4", "mxfp4", "int4", "nf4")
# InfiniBand NDR, 400 Gb/s = 50 GB/s each way per GPU: one ConnectX-7 per GPU in NVIDIA's DGX H100 and DGX B200
SCALE_OUT_GBS = 50
FP8 = ("fp8", "fp8_e4m3", "fp8_e5m2", "int8")


class StepTimes(BaseModel):
    """A step's work at the GPU's peak rates, milliseconds: each part on its own, then the three times and which
    one binds."""

    model_config = ConfigDict(frozen=True)

    weights_ms: float = Field(description="every weight but the routed experts, over HBM bandwidth")
    expert_weights_ms: float = Field(description="the routed experts touched, over HBM bandwidth")
    kv_ms: float = Field(description="the KV cache and recurrent states read, over HBM bandwidth")
    dense_ms: float = Field(description="FLOPs of every linear layer but the routed experts, at the weights' rate")
    expert_ms: float = Field(description="routed experts' FLOPs, at the weights' rate")
    attention_ms: float = Field(description="attention's FLOPs, at the KV dtype's rate")
    link_ms: float = Field(description="bytes sent over NVLink, one way")

    @property
    def hbm_ms(self) -> float:
        return self.weights_ms + self.expert_weights_ms + self.kv_ms

    @property
    def compute_ms(self) -> float:
        return self.dense_ms + self.expert_ms + self.attention_ms

    @property
    def bound_ms(self) -> float:
        return max(self.hbm_ms, self.compute_ms, self.link_ms)

    @property
    def binding(self) -> Literal["memory bandwidth", "compute", "link"]:
        times = {"memory bandwidth": self.hbm_ms, "compute": self.compute_ms, "link": self.link_ms}
        return max(times, key=times.get)


def tensor_tflops(gpu: Gpu, dtype: str) -> float:
    """The GPU's dense tensor rate for GEMMs on operands stored in `dtype`, TFLOP/s."""
    rates = [gpu.bf16_tflops]
    if dtype in FP8 or dtype in FP4:
        rates.insert(0, gpu.fp8_tflops)
    if dtype in FP4:
        rates.insert(0, gpu.fp4_tflops)
    for rate in rates:
        if rate:
            return rate
    raise KvplanError(f"the speed model needs {gpu.name}'s tensor throughput, which the GPU catalogue does not "
                      "give (`kvplan gpus`)")


def dequantised_in_kernel(gpu: Gpu, dtype: str) -> bool:
    """Whether GEMMs on weights stored in `dtype` dequantise them to BF16 inside the kernel (W4A16): 4-bit integers
    always (no tensor core since Ampere multiplies them), NVFP4 and MXFP4 on a GPU with no FP4 tensor rate (Hopper:
    TensorRT-LLM's examples/models/core/gpt_oss/README.md, vLLM's select_mxfp4_moe_backend). The bound still takes
    the faster rate such a GPU has (`tensor_tflops`): a W4A8 kernel could reach it."""
    return dtype in ("int4", "nf4") or (dtype in FP4 and not gpu.fp4_tflops)


def step_times(work: StepWork, gpu: Gpu, weights_dtype: str, kv_dtype: str) -> StepTimes:
    """The work at peak: HBM bytes over bandwidth, FLOPs over the dtype's tensor rate, link bytes over NVLink."""
    linear = tensor_tflops(gpu, weights_dtype) * 1e9  # FLOPs per millisecond
    attention = tensor_tflops(gpu, kv_dtype if kv_dtype in FP8 else "bf16") * 1e9
    hbm = gpu.bandwidth_gbs * 1e6  # bytes per millisecond
    link = work.link_bytes / (gpu.nvlink_gbs / 2 * 1e6) if gpu.nvlink_gbs else 0.0
    return StepTimes(weights_ms=work.weights_bytes / hbm, expert_weights_ms=work.expert_bytes / hbm,
                     kv_ms=work.kv_bytes / hbm,
                     dense_ms=work.dense_flops / linear, expert_ms=work.expert_flops / linear,
                     attention_ms=work.attention_flops / attention, link_ms=link)


def scale_out_slowdown(gpu: Gpu) -> float:
    """How many more times NVLink's time the same bytes take between NVLink domains: NVLink's one-way bandwidth
    over InfiniBand's (`SCALE_OUT_GBS`), less one (H100: 450 / 50 - 1 = 8; B200: 17). The estimate's links beyond
    one domain; the bound keeps NVLink's rate, so it stays a bound."""
    return max(gpu.nvlink_gbs / 2 / SCALE_OUT_GBS - 1, 0.0) if gpu.nvlink_gbs else 0.0
