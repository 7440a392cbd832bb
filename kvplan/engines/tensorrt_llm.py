"""TensorRT-LLM: KvCacheConfig's block pools, its budget a fraction of the memory free after the engine loads."""

import math

from kvplan.dtypes import DType, kv_dtype
from kvplan.engines.base import BlockPool, Engine, GiB, Layers, Overhead, rows
from kvplan.model import ModelSpec


class TensorRtLlm(Engine):
    """TensorRT-LLM `KvCacheConfig`: tokens_per_block 32, free_gpu_memory_fraction 0.9 of the memory free
    after the engine loads; one pool per attention window, a sequence holding the blocks its window needs."""

    name = "tensorrt-llm"
    label = "TensorRT-LLM"
    default_version = "KvCacheConfig docs"
    reads = frozenset({"memory_fraction", "block_size"})
    kv_dtypes = ("fp32", "bf16", "fp16", "fp8", "fp8_e4m3", "int8")
    fraction_flag = "--free-gpu-memory-fraction"
    # SchedulerConfig capacity_scheduler_policy GUARANTEED_NO_EVICT (llmapi/llm_args.py): a request is scheduled
    # only with blocks for its prompt and all its output tokens
    reserves_whole_request = True
    # attention_dp_config enable_balance (tensorrt_llm/_torch/pyexecutor/py_executor.py _balance_adp_requests): a
    # context request waits until every DP rank has one, or timeout_iters steps
    balances_attention_dp = True

    def default_fraction(self) -> float:
        return 0.9

    def overhead(self) -> Overhead:
        """Runtime buffers 1 GiB, CUDA context 0.5 GiB."""
        return Overhead(activations=GiB, cuda_context=GiB // 2)

    def kv_budget(self, gpu_bytes: int, fraction: float, weights: int, overhead: int) -> int:
        """KV budget = free_gpu_memory_fraction x (GPU memory - weights - overhead)."""
        return math.floor(fraction * (gpu_bytes - weights - overhead))

    compressed_attention = "the KvCacheConfig documentation kvplan follows describes no compressed caches"

    def pool(self, layers: Layers, model: ModelSpec, kv: DType) -> BlockPool:
        self.refuse_compressed_attention(model)
        block = self.options.block_size or 32
        return BlockPool(rows(layers, kv, kv_dtype(model.dtype)), block, [f"tokens_per_block {block}"])
