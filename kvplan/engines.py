"""Serving engines: how each one sizes the KV cache out of the memory it is given.

Every engine answers the capacity planner (`kvplan.capacity`) the same three questions:
    memory fraction and overhead  -> KV budget = GPU memory x fraction - weights - overhead
                                     (TensorRT-LLM: fraction x (GPU memory - weights - overhead))
    `pool(layers, kv)`            -> the KV pool it builds for one GPU's layers; `pool.bytes_for(users, ctx)`
                                     is the memory it needs to serve `users` sequences of `ctx` tokens,
                                     with its own blocks, padding and rounding.
Rules, defaults and the release each belongs to are in docs/engines.md; the facts come from the engines' own
source (vLLM 0.33.0, SGLang 0.5.23, llama.cpp 0c1e57098b, transformers 5.23.0, TensorRT-LLM docs), each rule
naming its file. Engine behaviour never branches on a model's name: it reads the cache kinds of
`kvplan.model`, and where an engine treats a model family specially it keys on `ModelSpec.architecture` here.
"""

import functools
import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict

from kvplan.dtypes import DType, kv_dtype
from kvplan.errors import KvplanError
from kvplan.memory import default_kv_dtype
from kvplan.model import (
    EMPTY_KINDS,
    FullAttention,
    IndexerKeys,
    LayerCache,
    ModelSpec,
    NoCache,
    RecurrentState,
    SlidingWindow,
)
from kvplan.text import brief

GiB = 1 << 30
MiB = 1 << 20
Layers = Sequence[tuple[LayerCache, int]]  # one GPU's caches, identical layers counted once


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def pad(n: int, multiple: int) -> int:
    return cdiv(n, multiple) * multiple


class Overhead(BaseModel):
    """What an engine keeps on each GPU besides weights and KV cache, in bytes."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    activations: int = 0
    non_torch: int = 0
    cuda_graphs: int = 0
    cuda_context: int = 0

    @property
    def total(self) -> int:
        return self.activations + self.non_torch + self.cuda_graphs + self.cuda_context


class EngineOptions(BaseModel):
    """Engine flags as given on the command line; None means the engine's own default."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    version: str | None = None
    memory_fraction: float | None = None
    block_size: int | None = None
    max_num_batched_tokens: int | None = None
    async_scheduling: bool | None = None
    kv_unified: bool | None = None
    swa_full: bool | None = None
    cache_implementation: Literal["dynamic", "static"] | None = None


FLAG_NAMES = {
    "version": "--engine-version", "memory_fraction": "--gpu-memory-utilization",
    "block_size": "--block-size", "max_num_batched_tokens": "--max-num-batched-tokens",
    "async_scheduling": "--async-scheduling/--no-async-scheduling",
    "kv_unified": "--kv-unified", "swa_full": "--swa-full", "cache_implementation": "--cache-implementation",
}


@functools.cache  # asked for at every rule that depends on the release, a few thousand times in a table sweep
def version_tuple(text: str) -> tuple[int, ...]:
    """`0.33.0`, `v0.19`, `5.15.1` -> (0, 33, 0), ... ; anything else is bad input."""
    parts = text.strip().removeprefix("v").split(".")
    if not parts or not all(p.isascii() and p.isdigit() and len(p) <= 6 for p in parts):
        raise KvplanError(f"--engine-version {brief(text)} is not a release number like 0.33.0")
    return tuple(int(p) for p in parts)


WINDOWED = ("sliding", "chunked")


class Row(BaseModel):
    """`count` identical layers of one GPU, as an engine treats them: `kind` is the cache kind, with MLA and
    cross-attention counted as full, and windowed layers too where the engine ignores their window."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    cache: LayerCache
    kind: str
    count: int
    bytes_per_token: int  # one layer
    state_bytes: int  # one layer's recurrent state per sequence

    @property
    def window(self) -> int:
        """The sliding window or chunk, in tokens (0 for other kinds)."""
        if self.kind == "sliding":
            return self.cache.window
        return self.cache.chunk if self.kind == "chunked" else 0

    def tokens(self, ctx: int) -> int:
        """Tokens the layer needs for a ctx-token sequence, before any engine rounding."""
        return ctx if self.kind == "full" and self.cache.kind in WINDOWED else self.cache.tokens_held(ctx)


def rows(layers: Layers, kv: DType, state_dtype: DType, sliding_as_full: bool = False) -> list[Row]:
    """A GPU's caches as rows; layers that store nothing of their own (no cache, KV shared) are dropped."""
    out = []
    for cache, count in layers:
        kind = "full" if cache.kind in ("mla", "indexer", "cross") or (sliding_as_full and cache.kind in WINDOWED) \
            else cache.kind
        if kind not in EMPTY_KINDS:
            out.append(Row(cache=cache, kind=kind, count=count, bytes_per_token=cache.bytes_per_token(kv),
                           state_bytes=cache.state_bytes(state_dtype)))
    return out


class KVPool(ABC):
    """One GPU's KV pool as an engine builds it."""

    notes: list[str]

    @abstractmethod
    def bytes_for(self, users: int, ctx: int, shared_prefix: int = 0) -> int:
        """Memory needed for `users` sequences of `ctx` tokens whose first `shared_prefix` tokens are cached
        once (prefix caching); monotone in users and ctx."""

    def activation_bytes(self, users: int, ctx: int) -> int:
        """Activation memory that grows with the batch (beyond the engine's fixed overhead), at its peak for
        `users` sequences of ctx tokens; 0 where the fixed overhead covers it."""
        return 0

    def steady_bytes_for(self, users: int, ctx: int, shared_prefix: int = 0) -> int:
        """Memory `users` sequences of ctx tokens hold in steady decode, where the engine frees what a sequence no
        longer reads; the same as bytes_for where it reserves every sequence's whole context."""
        return self.bytes_for(users, ctx, shared_prefix)

    def peak_bytes(self, users: int, ctx: int, shared_prefix: int = 0, steady: bool = False) -> int:
        """What `users` sequences of ctx tokens need at the engine's peak: the cache (as reserved, or as held in
        steady decode) and the batch's activations."""
        cache = self.steady_bytes_for if steady else self.bytes_for
        return cache(users, ctx, shared_prefix) + self.activation_bytes(users, ctx)

    def users_within(self, budget: int, ctx: int, shared_prefix: int = 0, steady: bool = False) -> int | None:
        """The most users whose `peak_bytes` fits in `budget`, where the pool can count them without a search; None:
        search (`kvplan.capacity.search_users`)."""
        return None

    def bytes_per_sequence(self, ctx: int) -> int:
        """What the engine reserves or holds for one sequence at ctx."""
        return self.bytes_for(1, ctx) - self.bytes_for(0, ctx)

    def bytes_per_sequence_decode(self, ctx: int) -> int:
        """What one sequence holds in steady decode at ctx, where that is less than what capacity must allow."""
        return self.bytes_per_sequence(ctx)


class Engine(ABC):
    """An engine's rules for one deployment: its flags, the GPU it runs on, TP and PP degrees."""

    name: ClassVar[str]
    label: ClassVar[str]
    default_version: ClassVar[str]
    paged: ClassVar[bool] = True  # allocates as sequences grow, so average lengths and shared prefixes count
    reads: ClassVar[frozenset[str]] = frozenset({"memory_fraction"})  # EngineOptions fields it understands
    kv_dtypes: ClassVar[tuple[str, ...] | None] = None  # cache dtypes it offers (None: any)
    fraction_flag: ClassVar[str] = "--gpu-memory-utilization"
    splits_heads: ClassVar[bool] = True  # supports tensor parallelism
    downcasts_fp32: ClassVar[bool] = True  # loads fp32 checkpoints in bf16 (vLLM dtype "auto", since 0.10.1)

    def __init__(self, options: EngineOptions, gpu_name: str | None, gpu_bytes: int | None, tp: int, pp: int):
        for field, value in options.model_dump().items():
            if value is not None and field not in self.reads:
                raise KvplanError(f"{FLAG_NAMES[field]} is not a {self.label} setting")
        if options.version is not None:
            version_tuple(options.version)
        if tp > 1 and not self.splits_heads:
            raise KvplanError(f"{self.label} splits a model over GPUs by layers, not heads: "
                              f"use --pp {tp}, not --tp")
        self.options = options
        self.version = options.version or self.default_version
        self.version_given = options.version is not None
        self.gpu_name = gpu_name
        self.gpu_bytes = gpu_bytes
        self.tp, self.pp = tp, pp

    @property
    def title(self) -> str:
        assumed = "" if self.version_given else ", assumed"
        return f"{self.label} {self.version}{assumed}"

    def loads_in_bf16(self, model: ModelSpec) -> bool:
        return self.downcasts_fp32 and model.dtype == "fp32" and model.quantization is None

    def default_kv_dtype(self, model: ModelSpec) -> str:
        """The checkpoint's KV dtype (kv_cache_dtype "auto"); bf16 for an fp32 checkpoint loaded in bf16."""
        return "bf16" if self.loads_in_bf16(model) and not model.kv_dtype else default_kv_dtype(model)

    def default_weights_dtype(self, model: ModelSpec) -> str | None:
        """None: the weights as stored; bf16 for an fp32 checkpoint the engine loads in bf16."""
        return "bf16" if self.loads_in_bf16(model) else None

    def check_kv_dtype(self, dtype: DType) -> None:
        if self.kv_dtypes is not None and dtype.name not in self.kv_dtypes:
            offered = ", ".join(self.kv_dtypes)
            raise KvplanError(f"{self.label} has no {dtype.name} KV cache: it offers {offered}")

    def cached_layers(self, model: ModelSpec) -> tuple[LayerCache, ...]:
        """The caches as this engine stores them (before tensor and pipeline parallelism)."""
        return model.caches

    def memory_fraction(self) -> float:
        given = self.options.memory_fraction
        return given if given is not None else self.default_fraction()

    @abstractmethod
    def default_fraction(self) -> float: ...

    @abstractmethod
    def overhead(self) -> Overhead: ...

    def kv_budget(self, gpu_bytes: int, fraction: float, weights: int, overhead: int) -> int:
        """KV budget = floor(GPU memory x fraction) - weights - overhead."""
        return math.floor(gpu_bytes * fraction) - weights - overhead

    @abstractmethod
    def pool(self, layers: Layers, model: ModelSpec, kv: DType) -> KVPool: ...

    def assumptions(self) -> list[str]:
        """One line per default this engine applied, with its basis."""
        return []


# ----------------------------------------------------------------------------------------------------- vLLM


class VllmLog(BaseModel):
    """The numbers vLLM logs at start-up for max_model_len L (`kv_cache_utils.py`)."""

    model_config = ConfigDict(defer_build=True)

    num_blocks: int
    kv_cache_tokens: int
    max_concurrency: float
    lines: list[str]


class VllmGroup(BaseModel):
    """KV-cache groups of one layer spec: `groups` groups sharing the block pool."""

    model_config = ConfigDict(defer_build=True)

    kind: str
    groups: int
    block_size: int
    window: int = 0


class VllmPool(KVPool):
    """vLLM's block pool: every block costs `block_bytes` (group size x page), whatever group uses it."""

    def __init__(self, groups: list[VllmGroup], block_bytes: int, in_flight: int, encoder_tokens: int | None,
                 batched_tokens: int, log_formula: str, notes: list[str], state_pages: int):
        self.groups, self.block_bytes, self.in_flight = groups, block_bytes, in_flight
        self.encoder_tokens, self.batched_tokens = encoder_tokens, batched_tokens
        self.log_formula, self.notes, self.state_pages = log_formula, notes, state_pages
        # Block counts by ctx, summed over the groups once: a search for the users that fit asks at one ctx for
        # many user counts (`kvplan.capacity.max_users`).
        self._per_request: dict[int, int] = {}
        self._held: dict[int, int] = {}
        self._surge: dict[int, int] = {}

    def blocks(self, group: VllmGroup, max_len: int) -> int:
        """Blocks one request reserves in one group (`max_memory_usage_bytes` / page):
        full cdiv(L, B); sliding cdiv(min(W - 1 + I, L), B) + 1; chunked cdiv(min(C + I, L), B);
        Mamba `state_pages` (Vllm.state_pages); cross-attention cdiv(max_num_encoder_input_tokens,
        B), which vLLM sets to max_num_batched_tokens (`SchedulerConfig`), at least L for an encoder-decoder, whose
        chunked prefill is off (`EngineArgs`; vLLM refuses a smaller --max-num-batched-tokens)."""
        b, window = group.block_size, group.window
        if group.kind == "sliding":
            return cdiv(min(window - 1 + self.in_flight, max_len), b) + 1
        if group.kind == "chunked":
            return cdiv(min(window + self.in_flight, max_len), b)
        if group.kind == "recurrent":
            return self.state_pages
        if group.kind == "cross":
            return cdiv(max(self.batched_tokens, max_len), b)
        return cdiv(max_len, b)

    def decode_blocks(self, group: VllmGroup, ctx: int) -> int:
        """Blocks a sequence holds in steady decode: a sliding layer frees blocks below ctx - W + 1,
        keeping about cdiv(W, B) + 1; a chunked layer keeps its current chunk; a cross-attention layer holds
        the request's encoder tokens (the scheduler allocates cdiv(encoder tokens, B) for them; as many as the
        context for a text encoder)."""
        b, window = group.block_size, group.window
        if group.kind == "sliding":
            return min(cdiv(window, b) + 1, cdiv(ctx, b))
        if group.kind == "chunked":
            return min(cdiv(window, b), cdiv(ctx, b))
        if group.kind == "cross":
            return cdiv(self.encoder_tokens or ctx, b)
        return self.blocks(group, ctx)

    def blocks_per_request(self, max_len: int) -> int:
        if max_len not in self._per_request:
            self._per_request[max_len] = sum(g.groups * self.blocks(g, max_len) for g in self.groups)
        return self._per_request[max_len]

    def blocks_held(self, ctx: int) -> int:
        """Blocks one sequence holds in steady decode (`decode_blocks`, over the groups)."""
        if ctx not in self._held:
            self._held[ctx] = sum(g.groups * self.decode_blocks(g, ctx) for g in self.groups)
        return self._held[ctx]

    def shared_blocks(self, prefix: int) -> int:
        """Blocks a cached prefix saves each further request: its whole blocks in full-attention groups."""
        if not prefix:
            return 0
        return sum(g.groups * (prefix // g.block_size) for g in self.groups if g.kind == "full")

    def bytes_for(self, users: int, ctx: int, shared_prefix: int = 0) -> int:
        """(users x blocks per request - (users - 1) x shared prefix blocks + 1 null block) x block bytes."""
        if users == 0:
            return self.block_bytes
        shared = self.shared_blocks(shared_prefix)
        return (users * self.blocks_per_request(ctx) - (users - 1) * shared + 1) * self.block_bytes

    def bytes_per_sequence_decode(self, ctx: int) -> int:
        return self.blocks_held(ctx) * self.block_bytes

    def users_within(self, budget: int, ctx: int, shared_prefix: int = 0, steady: bool = False) -> int | None:
        """N users take N x (blocks per user - shared prefix blocks) + shared + 1 null block (+ the in-flight surge in
        steady decode), linear in N, so the most that fit is (budget // block bytes - the fixed blocks) // (blocks
        per user - shared); None where a user costs no block of its own (the search says so)."""
        per_user = self.blocks_held(ctx) if steady else self.blocks_per_request(ctx)
        shared = self.shared_blocks(shared_prefix)
        if per_user <= shared:
            return None
        fixed = shared + 1 + (self.surge_blocks(ctx) if steady else 0)
        return max(0, (budget // self.block_bytes - fixed) // (per_user - shared))

    def surge_blocks(self, ctx: int) -> int:
        """Blocks the engine's in-flight tokens add to the steady hold, once for the engine: the tokens scheduled
        but not yet settled (at most I across all requests, `max_in_flight_tokens`) keep the sliding and chunked
        blocks they were computed against until the step settles."""
        if ctx not in self._surge:
            self._surge[ctx] = sum(g.groups * cdiv(min(self.in_flight, ctx), g.block_size)
                                   for g in self.groups if g.kind in WINDOWED)
        return self._surge[ctx]

    def steady_bytes_for(self, users: int, ctx: int, shared_prefix: int = 0) -> int:
        """(users x blocks held in steady decode - (users - 1) x shared prefix blocks + in-flight surge + 1 null
        block) x block bytes: what `users` requests at ctx hold with no request preempted."""
        if users == 0:
            return self.block_bytes
        shared = self.shared_blocks(shared_prefix)
        return (users * self.blocks_held(ctx) - (users - 1) * shared + self.surge_blocks(ctx) + 1) * self.block_bytes

    def log(self, available: int, max_len: int) -> VllmLog:
        """num_blocks = available // block bytes; concurrency = num_blocks / blocks per request;
        tokens = int(concurrency x L) (0.21.0 on) or num_blocks // groups x block size (before)."""
        num_blocks = max(available, 0) // self.block_bytes
        concurrency = num_blocks / self.blocks_per_request(max_len)
        if self.log_formula == "concurrency":
            tokens = int(concurrency * max_len)
        else:
            n_groups = sum(g.groups for g in self.groups)
            tokens = num_blocks // n_groups * min(g.block_size for g in self.groups)
        return VllmLog(num_blocks=num_blocks, kv_cache_tokens=tokens, max_concurrency=concurrency, lines=[
            f"GPU KV cache size: {tokens:,} tokens",
            f"Maximum concurrency for {max_len:,} tokens per request: {concurrency:.2f}x",
        ])


class Vllm(Engine):
    """vLLM v1 (`vllm/v1/core/kv_cache_utils.py`, `kv_cache_interface.py`, `worker/gpu_worker.py`).

    Version-dependent defaults: from 0.21.0 gpu_memory_utilization is 0.92 (0.90 before) and the CUDA-graph
    estimate is subtracted at start-up (vLLM PR #38284); kvplan also applies the start-up log's
    tokens = int(concurrency x L) form from 0.21.0 (0.19.0 logs num_blocks // groups x block size, vLLM issue
    #40691; 0.33.0 the new form; the release in between is unconfirmed).
    """

    name = "vllm"
    label = "vLLM"
    default_version = "0.33.0"
    reads = frozenset({"version", "memory_fraction", "block_size", "max_num_batched_tokens", "async_scheduling"})
    kv_dtypes = ("fp32", "bf16", "fp16", "fp8", "fp8_e4m3", "fp8_e5m2")

    @property
    def modern(self) -> bool:
        return version_tuple(self.version) >= (0, 21)

    INDEXER_QUANT_BLOCK = 128
    # Families whose config's SSM state dtype vLLM adopts (`models/config.py`: NemotronHForCausalLMConfig reads
    # mamba_ssm_cache_dtype, Qwen3_5ForCausalLMConfig mamba_ssm_dtype); for the others mamba_ssm_cache_dtype
    # "auto" keeps the SSM state in the conv state's dtype, the model's (`mamba_utils.py` _mamba_state_dtype).
    READS_SSM_DTYPE = frozenset({"nemotron_h", "qwen3_5_text", "qwen3_5_moe_text"})
    # Mixers whose state dtype vLLM fixes whatever the config says: Kimi Delta Attention's recurrent state is fp32
    # (`mamba_utils.py` kda_state_dtype).
    FIXED_STATE_DTYPE = frozenset({"kda"})
    # Families whose vLLM model gives a sliding layer a window of sliding_window + 1: a Cohere sliding layer sees the
    # window and the current token (models/commandr.py for Cohere2, models/cohere2_moe.py), and the spec's window
    # sets both the reservation and the eviction.
    SLIDING_WINDOW_PLUS_ONE = frozenset({"cohere2", "cohere2_moe"})

    def cached_layers(self, model: ModelSpec) -> tuple[LayerCache, ...]:
        """The caches as vLLM stores them. DSA indexer keys whatever the KV dtype: fp8 values with one fp32 scale
        per 128 elements, index_head_dim + index_head_dim // 128 x 4 bytes per token (`DeepseekV32IndexerCache`,
        uint8; `models/deepseek_v2.py`). Recurrent states in the model dtype unless the family is one whose SSM
        dtype vLLM takes from the config (READS_SSM_DTYPE). Cohere's sliding windows one token wider."""
        keeps_ssm_dtype = model.architecture in self.READS_SSM_DTYPE
        plus_one = model.architecture in self.SLIDING_WINDOW_PLUS_ONE

        def as_stored(cache: LayerCache) -> LayerCache:
            if isinstance(cache, IndexerKeys):
                return cache.model_copy(update={"head_dim": cache.head_dim + cache.head_dim
                                                // self.INDEXER_QUANT_BLOCK * 4, "storage_dtype": "fp8"})
            if isinstance(cache, RecurrentState) and cache.ssm_dtype and not keeps_ssm_dtype \
                    and cache.mixer not in self.FIXED_STATE_DTYPE:
                return cache.model_copy(update={"ssm_dtype": None})
            if plus_one and isinstance(cache, SlidingWindow):
                return cache.model_copy(update={"window": cache.window + 1})
            return cache

        return tuple(as_stored(c) for c in model.caches)

    def default_fraction(self) -> float:
        return 0.92 if self.modern else 0.90

    def max_num_batched_tokens(self) -> int:
        """`vllm serve` default (`EngineArgs.get_batch_defaults`): 16384 on GPUs with >= 160 GiB (B200, B300,
        MI300X, MI325X; 0.28.0 on), 8192 on GPUs with >= 70 GiB that are not A100s (H100, H200), else 2048;
        8192 when no GPU is named."""
        if self.options.max_num_batched_tokens:
            return self.options.max_num_batched_tokens
        if self.gpu_bytes is None:
            return 8192
        if self.gpu_bytes >= 160 * GiB and version_tuple(self.version) >= (0, 28):
            return 16384
        large = self.gpu_bytes >= 70 * GiB and "a100" not in (self.gpu_name or "").lower()
        return 8192 if large else 2048

    def async_scheduling(self) -> bool:
        """On unless --no-async-scheduling (vLLM's default on GPU; the CPU backend turns it off,
        `platforms/cpu.py`)."""
        return self.options.async_scheduling is not False

    def in_flight_batches(self) -> int:
        """Batches scheduled but not yet settled, whose tokens sliding and chunked layers reserve for
        (`VllmConfig.max_concurrent_batches`, 0.26.0 on): with async scheduling pp + 1 under the V2 model runner
        (the default for every model from 0.28.0), 2 under the V1 runner at pp = 1 (0.26-0.27), else pp.
        Before 0.26.0 the reservation took one batch, whatever the scheduling (`SlidingWindowSpec`)."""
        version = version_tuple(self.version)
        if version < (0, 26):
            return 1
        if not self.async_scheduling():
            return self.pp
        if version >= (0, 28):
            return self.pp + 1
        return 2 if self.pp == 1 else self.pp

    def in_flight_tokens(self) -> int:
        """I = in-flight batches x max_num_batched_tokens (`VllmConfig.max_in_flight_tokens`)."""
        return self.in_flight_batches() * self.max_num_batched_tokens()

    def state_pages(self, model_mixers: set[str], attention: bool) -> int:
        """Pages a Mamba-style layer reserves per request (`MambaSpec.max_memory_usage_bytes`): 1 without prefix
        caching (mamba_cache_mode "none": attention-free models, and hybrids before 0.28.0, whose prefix caching
        was off by default, `EngineArgs._set_default_chunked_prefill_and_prefix_caching_args`); 2 in "align" mode
        (the running state and the last block-aligned one), plus 1 prefill checkpoint page for Mamba-2 mixers
        from 0.32.0 (`MambaMixer2.get_kv_cache_spec`, num_prefill_checkpoint_blocks = 1)."""
        version = version_tuple(self.version)
        if not attention or version < (0, 28):
            return 1
        return 3 if "mamba2" in model_mixers and version >= (0, 32) else 2

    def overhead(self) -> Overhead:
        """Activation peak of the profile run: 160 KiB per batched token (vLLM logs 1.26 GiB for Llama-3-8B
        at 8,192 tokens, PR #10511); non-torch memory 0.5 GiB, 1.5 GiB with TP (NCCL and custom all-reduce
        buffers); CUDA graphs 0.5 GiB from 0.21.0 (vLLM logs 0.17-0.65 GiB)."""
        return Overhead(activations=self.max_num_batched_tokens() * 160 * 1024,
                        non_torch=(GiB + GiB // 2) if self.tp > 1 else GiB // 2,
                        cuda_graphs=GiB // 2 if self.modern else 0)

    def kv_budget(self, gpu_bytes: int, fraction: float, weights: int, overhead: int) -> int:
        """available = ceil(total x gpu_memory_utilization) - non-KV memory (weights, activations, non-torch,
        CUDA graphs)."""
        return math.ceil(gpu_bytes * fraction) - weights - overhead

    # Model types with no vLLM implementation (none in vllm/model_executor/models as of 0.32.0).
    NO_MODEL = frozenset({"recurrent_gemma"})
    # Model types vLLM dropped, by config model_type, with the last release that ran them
    # (`_PREVIOUSLY_SUPPORTED_MODELS` in model_executor/models/registry.py, as of 0.32.0). MiniMax-Text-01 and
    # MiniMax-M1's lightning-attention state that release sized as `linear_attention_state_shape` does (heads / tp x
    # head_dim x head_dim in the model dtype), as kvplan's model spec has it.
    DROPPED = {"minimax": "0.23.0", "bamba": "0.23.0", "dots1": "0.23.0", "qwen": "0.23.0", "internlm": "0.23.0",
               "xverse": "0.23.0", "baichuan": "0.23.0", "jais": "0.22.0", "aquila": "0.24.0", "telechat": "0.25.0",
               "persimmon": "0.25.0", "plamo2": "0.26.0", "ouro": "0.26.0", "arctic": "0.28.0", "mpt": "0.28.0",
               "chameleon": "0.28.0", "stablelm_epoch": "0.28.0"}

    def pool(self, layers: Layers, model: ModelSpec, kv: DType) -> VllmPool:
        if model.architecture in self.NO_MODEL:
            raise KvplanError(f"vLLM has no {model.architecture} model (none as of vLLM 0.32): choose another "
                              "--engine")
        last = self.DROPPED.get(model.architecture)
        if last and version_tuple(self.version) > version_tuple(last):
            raise KvplanError(f"vLLM {self.version} does not run {model.architecture} models ({model.name}): its "
                              f"last release that did is {last} (give --engine-version {last})")
        # Recurrent states are kept in the dtype the model runs in (mamba_cache_dtype "auto"): bf16 for an fp32
        # checkpoint vLLM loads in bf16.
        table = rows(layers, kv, kv_dtype("bf16" if self.loads_in_bf16(model) else model.dtype))
        if not table:
            raise KvplanError(f"{model.name} keeps no per-sequence cache: vLLM allocates no KV blocks for it")
        mla = any(cache.kind == "mla" for cache, _ in layers)
        block = self.options.block_size or (64 if mla else 16)
        notes = [f"block size {block} tokens"
                 + (" (MLA backends use 64)" if mla and not self.options.block_size else "")]
        attention = [r for r in table if r.kind != "recurrent"]
        recurrent = [r for r in table if r.kind == "recurrent"]
        mamba_page = max((r.state_bytes for r in recurrent), default=0)
        if attention and recurrent:
            raised = self.hybrid_block_size(block, max(r.bytes_per_token for r in attention), mamba_page, mla)
            if raised > block:
                block = raised
                notes.append(f"attention block size raised to {block} tokens so a page holds a recurrent state")
            mamba_page = block * max(r.bytes_per_token for r in attention)
        elif recurrent:
            notes = ["attention-free: no prefix caching, so one state page per request (mamba_cache_mode none)"]
        pages = self.state_pages({r.cache.mixer for r in recurrent}, bool(attention))
        if attention and recurrent:
            notes.append(f"{pages} state page{'s' if pages > 1 else ''} per request for recurrent layers"
                         + (" (prefix caching off for hybrids before vLLM 0.28)" if pages == 1 else
                            " (prefix caching's align mode" + (", one a Mamba-2 prefill checkpoint)" if pages == 3
                                                                else ")")))
        # Each distinct layer spec: (kind, window, page bytes, block size).
        specs: dict[tuple[str, int, int], int] = {}
        for r in table:
            page = mamba_page if r.kind == "recurrent" else block * r.bytes_per_token
            kind = "cross" if r.cache.kind == "cross" else r.kind  # CrossAttentionSpec
            key = (kind, r.window, page)
            specs[key] = specs.get(key, 0) + r.count
        kinds = {(kind, window) for kind, window, _ in specs}
        in_flight = self.in_flight_tokens()
        encoder = next((r.cache.encoder_tokens for r in table if r.cache.kind == "cross"), None)
        formula = "concurrency" if self.modern else "groups"
        if len(kinds) == 1:
            # One spec, or one kind with different page sizes (UniformTypeKVCacheSpecs): one group, a block is
            # one page of every layer.
            (kind, window), = kinds
            block_bytes = sum(page * count for (_, _, page), count in specs.items())
            groups = [VllmGroup(kind=kind, groups=1, block_size=block, window=window)]
            return VllmPool(groups, block_bytes, in_flight, encoder, self.max_num_batched_tokens(), formula, notes,
                            state_pages=pages)
        # Hybrid: one page size for all (a smaller page that divides the largest gets a proportionally larger
        # block size; one that does not keeps its block size in a page padded to the largest, which MLA pages
        # cannot be: `unify_kv_cache_spec_page_size`), layers bucketed by spec, buckets cut into groups of
        # group_size layers (padding the last), one block pool.
        max_page = max(page for _, _, page in specs)
        groups, counts = [], []
        for (kind, window, page), count in specs.items():
            if max_page % page and mla:
                raise KvplanError(f"vLLM cannot give {model.name}'s layers one page size "
                                  f"({page} vs {max_page} B)")
            size = block if kind == "recurrent" or max_page % page else block * (max_page // page)
            if max_page % page:
                notes.append(f"{kind} pages of {page:,} B padded to {max_page:,} B")
            groups.append((kind, window, size, count))
            counts.append(count)
        group_size = min(counts)
        if max(counts) < 1.5 * min(counts):
            group_size = max(counts)
        padding = sum(cdiv(c, group_size) * group_size - c for c in counts)
        if padding:
            notes.append(f"{padding} padding layers: each KV-cache group has {group_size} layers")
        return VllmPool([VllmGroup(kind=k, groups=cdiv(c, group_size), block_size=s, window=w)
                         for k, w, s, c in groups], group_size * max_page, in_flight, encoder,
                        self.max_num_batched_tokens(), formula, notes, state_pages=pages)

    KERNEL_BLOCK = 16  # the smallest kernel block of FlashAttention and Triton attention on CUDA (MultipleOf(16))
    MLA_HYBRID_BLOCK = 128  # MLA decode kernels' alignment for MLA/Mamba hybrids

    def hybrid_block_size(self, block: int, attention_per_token: int, mamba_page: int, mla: bool) -> int:
        """Mamba hybrids (`Platform._align_hybrid_block_size`): the attention block size is raised until one
        attention page holds a Mamba state, in multiples of align = max(16, block size) (128 at least with MLA):
        block = max(block, 16 x cdiv(align x cdiv(state, align x attention bytes per token), 16)); the Mamba page is
        then padded to block x attention bytes per token."""
        align = max(self.KERNEL_BLOCK, block, self.MLA_HYBRID_BLOCK if mla else 0)
        needed = align * cdiv(mamba_page, align * attention_per_token)
        return max(block, self.KERNEL_BLOCK * cdiv(needed, self.KERNEL_BLOCK))

    def assumptions(self) -> list[str]:
        batches = self.in_flight_batches()
        why = "async scheduling" if self.async_scheduling() and batches > self.pp else \
            "pipeline stages" if batches > 1 else "one batch"
        lines = [f"in-flight tokens I = {self.in_flight_tokens():,} ({batches} batch{'es' if batches > 1 else ''}, "
                 f"{why}, x max_num_batched_tokens {self.max_num_batched_tokens():,})"]
        if self.options.memory_fraction is None:
            lines.append(f"gpu_memory_utilization {self.default_fraction()} (vLLM default "
                         f"{'from' if self.modern else 'before'} 0.21.0)")
        return lines


# --------------------------------------------------------------------------------------------------- SGLang

# Models SGLang gives separate full and sliding-window pools (`is_hybrid_swa_model`), by config model_type.
SGLANG_HYBRID_SWA = frozenset({"llama4", "llama4_text", "gpt_oss", "gemma4", "gemma4_text", "mimo_v2_flash",
                               "step3p5"})
SGLANG_SWA_FULL_TOKENS_RATIO = 0.8


class SglangPool(KVPool):
    """A token pool (page size 1) of `full_cell` bytes per token; allow-listed hybrids add a sliding-window
    pool holding swa_full_tokens_ratio (0.8) as many tokens, with `swa_cell` bytes per token."""

    def __init__(self, full_cell: int, swa_cell: int, window: int, state: int, notes: list[str]):
        self.full_cell, self.swa_cell, self.window = full_cell, swa_cell, window
        self.state, self.notes = state, notes

    def bytes_for(self, users: int, ctx: int, shared_prefix: int = 0) -> int:
        if users == 0:
            return 0
        full = users * ctx - (users - 1) * shared_prefix  # the radix cache keeps a shared prefix once
        state = users * self.state
        if not self.swa_cell:
            return full * self.full_cell + state
        ratio = SGLANG_SWA_FULL_TOKENS_RATIO
        full = max(full, math.ceil(users * min(ctx, self.window) / ratio))
        return full * self.full_cell + math.ceil(full * ratio) * self.swa_cell + state


class Sglang(Engine):
    """SGLang (`server_args.py` `_handle_gpu_memory_settings`, `model_runner.py` profile_max_num_token)."""

    name = "sglang"
    label = "SGLang"
    default_version = "0.5.23"
    kv_dtypes = ("fp32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "fp8")
    fraction_flag = "--mem-fraction-static"

    def _buckets(self) -> tuple[int, int]:
        """(chunked_prefill_size, cuda_graph_max_bs) by GPU memory in MiB, as SGLang picks them (CUDA)."""
        mib = self.gpu_bytes // MiB
        tp4 = self.tp >= 4
        if mib < 20 * 1024:
            return 2048, 8
        if mib < 35 * 1024:
            return 2048, 80 if tp4 else 24
        if mib < 60 * 1024:
            return 4096, 160 if tp4 else 32
        if mib < 160 * 1024:
            return 8192, 512 if tp4 else 256
        return 16384, 512

    def default_fraction(self) -> float:
        """mem_fraction_static = round((gpu - reserved) / gpu, 3), in MiB, with reserved = 512
        + 1.5 x max(chunked_prefill_size, 2048) + 2 x cuda_graph_max_bs + tp x pp / 8 x 1024, at least
        10 GiB on GPUs over 60 GiB."""
        if self.gpu_bytes is None:
            raise KvplanError("SGLang's default mem_fraction_static depends on the GPU: give --gpu or --vram")
        mib = self.gpu_bytes / MiB
        chunk, graph_bs = self._buckets()
        reserved = 512 + 1.5 * max(chunk, 2048) + 2 * graph_bs + self.tp * self.pp / 8 * 1024
        if mib > 60 * 1024:
            reserved = max(reserved, 10 * 1024)
        return round((mib - reserved) / mib, 3)

    def overhead(self) -> Overhead:
        """mem_fraction_static already leaves room for activations and CUDA graphs; what is used before the
        pool is sized (CUDA context, NCCL) counts against it: 0.5 GiB."""
        return Overhead(cuda_context=GiB // 2)

    def pool(self, layers: Layers, model: ModelSpec, kv: DType) -> SglangPool:
        hybrid = model.architecture in SGLANG_HYBRID_SWA
        table = rows(layers, kv, kv_dtype(model.dtype), sliding_as_full=not hybrid)
        windowed = [r for r in table if r.kind in WINDOWED]
        notes = []
        if hybrid and windowed:
            notes.append(f"separate sliding-window pool, {SGLANG_SWA_FULL_TOKENS_RATIO} x the full pool's "
                         "tokens")
        elif any(cache.kind in WINDOWED for cache, _ in layers):
            notes.append(f"{model.architecture} is not on SGLang's hybrid-SWA list: every layer sized full")
        return SglangPool(full_cell=sum(r.count * r.bytes_per_token for r in table if r.kind == "full"),
                          swa_cell=sum(r.count * r.bytes_per_token for r in windowed),
                          window=max((r.window for r in windowed), default=0),
                          state=sum(r.count * r.state_bytes for r in table), notes=notes)


# ------------------------------------------------------------------------------------------------ llama.cpp

LLAMA_CPP_PAD = 256
LLAMA_CPP_UBATCH = 512
# Architectures llama.cpp converts to its plain `llama` graph, which has no sliding window
# (convert_hf_to_gguf).
LLAMA_CPP_NO_SWA = frozenset({"llama", "mistral", "mixtral"})


class LlamaCppPool(KVPool):
    """`llama_kv_cache`: -c n_ctx cells (padded to 256) for -np n_seq_max slots; a unified cache is one stream
    of n_ctx cells shared by all slots, otherwise each slot gets PAD(n_ctx / n_seq_max, 256) cells.
    SWA layers: PAD(min(n_ctx_seq, n_swa x (unified ? n_seq_max : 1) + n_ubatch), 256) cells.
    Recurrent state: fp32, one per slot."""

    def __init__(self, table: list[Row], unified: bool, swa_full: bool, state: int, notes: list[str]):
        self.table, self.unified, self.swa_full = table, unified, swa_full
        self.state, self.notes = state, notes

    def bytes_for(self, users: int, ctx: int, shared_prefix: int = 0) -> int:
        if users == 0:
            return 0
        n_ctx = pad(users * ctx, LLAMA_CPP_PAD)
        streams = 1 if self.unified else users
        cells_seq = n_ctx if self.unified else pad(n_ctx // users, LLAMA_CPP_PAD)
        total = users * self.state
        for r in self.table:
            cells = cells_seq
            if r.kind in WINDOWED and not self.swa_full:
                cells = pad(min(cells_seq, r.window * (users if self.unified else 1) + LLAMA_CPP_UBATCH),
                            LLAMA_CPP_PAD)
            total += r.count * r.bytes_per_token * cells * streams
        return total


class LlamaCpp(Engine):
    """llama.cpp (`llama-kv-cache.cpp`, `llama-context.cpp`) as vendored in llama-cpp-python 0.3.36."""

    name = "llama.cpp"
    label = "llama.cpp"
    default_version = "0c1e57098b"
    paged = False
    splits_heads = False
    reads = frozenset({"memory_fraction", "kv_unified", "swa_full"})
    kv_dtypes = ("fp32", "fp16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")

    def default_kv_dtype(self, model: ModelSpec) -> str:
        return "fp16"  # --cache-type-k/-v default f16, whatever the weights

    def default_fraction(self) -> float:
        return 1.0

    def overhead(self) -> Overhead:
        """Compute buffer 0.5 GiB (llama.cpp logs a few hundred MiB at n_ubatch 512 for 7-30B models) and CUDA
        context 0.5 GiB."""
        return Overhead(activations=GiB // 2, cuda_context=GiB // 2)

    def pool(self, layers: Layers, model: ModelSpec, kv: DType) -> LlamaCppPool:
        ignores_swa = model.architecture in LLAMA_CPP_NO_SWA
        swa_full = bool(self.options.swa_full)
        table = rows(layers, kv, kv_dtype("fp32"), sliding_as_full=ignores_swa)
        notes = [f"{'unified' if self.unified else 'per-slot'} cache, n_ctx padded to {LLAMA_CPP_PAD}, "
                 f"n_ubatch {LLAMA_CPP_UBATCH}"]
        if ignores_swa and any(cache.kind == "sliding" for cache, _ in layers):
            notes.append(f"{model.architecture} runs as llama.cpp's plain llama graph: no sliding window")
        if kv.block_elements > 1:
            notes.append("a quantised V cache needs flash attention (-fa)")
        return LlamaCppPool([r for r in table if r.kind != "recurrent"], self.unified, swa_full,
                            sum(r.count * r.state_bytes for r in table), notes)

    @property
    def unified(self) -> bool:
        return self.options.kv_unified if self.options.kv_unified is not None else True

    def assumptions(self) -> list[str]:
        return ["llama-server slots share one unified cache (-kvu, its default with -np auto)"]


# --------------------------------------------------------------------------------------------- transformers


class TransformersPool(KVPool):
    """`past_key_values` of `generate()` for a batch (`cache_utils.py`; measured by `kvplan profile`).

    DynamicCache: full layers hold ctx tokens. A sliding (or chunked) layer exposes its last W - 1 tokens as a
    view into the tensor its last update concatenated, so once decoding has begun it holds min(ctx, W) tokens
    (`bytes_held`), and right after prefill the whole prompt (`bytes_after_prefill`). Capacity must allow the
    larger, for a prompt of up to ctx - 1 tokens (`bytes_for`).
    StaticCache: max_cache_len = ctx preallocated, min(W, ctx) on sliding layers, from the first token.
    Recurrent layers: the state `Transformers.cached_layers` describes (conv of `kernel` inputs, fp32 SSM);
    `prefill_states`, one per row, what each holds right after prefill where that is less."""

    def __init__(self, table: list[Row], static: bool, activations: "PrefillActivations", notes: list[str],
                 prefill_states: list[int]):
        self.table, self.static, self.activations, self.notes = table, static, activations, notes
        self.prefill_states = prefill_states

    def activation_bytes(self, users: int, ctx: int) -> int:
        """generate() prefills the batch's prompts (up to ctx - 1 tokens) in one forward pass."""
        return self.activations.peak(users, max(ctx - 1, 1))

    def bytes_for(self, users: int, ctx: int, shared_prefix: int = 0) -> int:
        """The peak for `users` sequences of ctx tokens: after prefilling a prompt of up to ctx - 1 tokens (at
        least one is generated) or at ctx, whichever holds more."""
        if self.static:
            return self.bytes_held(users, ctx)
        return max(self.bytes_held(users, ctx), self.bytes_after_prefill(users, max(ctx - 1, 1), ctx))

    def bytes_held(self, users: int, ctx: int) -> int:
        """What the cache holds for `users` sequences that decoded their way to ctx tokens."""
        return users * sum(r.count * (r.bytes_per_token * r.tokens(ctx) + r.state_bytes) for r in self.table)

    def bytes_per_sequence_decode(self, ctx: int) -> int:
        return self.bytes_held(1, ctx)

    def bytes_after_prefill(self, users: int, prompt: int, ctx: int) -> int:
        """What the cache holds right after prefilling `prompt` tokens of a ctx-token generation: a
        DynamicCache keeps the prompt on every attention layer (the sliding ones are cut at the first decode
        step), and a cross-attention layer its encoder's tokens; a StaticCache is already at its full size."""
        if self.static:
            return self.bytes_held(users, ctx)
        return users * sum(r.count * (r.bytes_per_token * (r.tokens(ctx) if r.cache.kind == "cross" else prompt)
                                      + state) for r, state in zip(self.table, self.prefill_states, strict=True))


# Recurrent states transformers computes in the model dtype, not fp32: MiniMax's lightning attention sums k^T v in
# the values' dtype (`MiniMaxLightningAttention`), xLSTM's cache is made in the embeddings' dtype (`xLSTMCache`).
MODEL_DTYPE_STATES = frozenset({"lightning", "mlstm"})
# Short convolutions transformers runs, and so caches, in fp32: Inkling's (`InklingShortConvolution`).
FP32_CONVS = frozenset({"inkling_conv"})


def transformers_state(cache: LayerCache) -> LayerCache:
    """A recurrent layer's state as transformers keeps it (`LinearAttentionLayer`): the conv state holds the
    last `conv_kernel` inputs (kvplan's conv_elements count kernel - 1), and the SSM state is stored in the
    dtype its scan returns, fp32 (the reference scans and the mamba_ssm / fla kernels alike), but for the mixers
    of MODEL_DTYPE_STATES; FP32_CONVS keep their conv state in fp32."""
    update: dict = {} if cache.mixer in MODEL_DTYPE_STATES else {"ssm_dtype": "fp32"}
    if cache.mixer in FP32_CONVS:
        update["conv_dtype"] = "fp32"
    if cache.conv_kernel:
        update["conv_elements"] = cache.conv_elements // (cache.conv_kernel - 1) * cache.conv_kernel
    return cache.model_copy(update=update)


class PrefillActivations:
    """The activation peak of one transformers forward pass over a batch of prompts, above the weights and
    the cache: inference mode, SDPA attention (eager where transformers has no SDPA path), logits for the last
    token only, as generate() prefills. Measured tensor by tensor on transformers 5.23 by `kvplan profile`
    (docs/accuracy.md); b is the model dtype's bytes. Per token, the largest of a layer's three moments (a
    one-layer model holds one hidden-sized tensor fewer: its layer input is the embedding output):
        norm     3 x hidden x b (embedding output, layer input, residual) + the norm's fp32 upcast:
                 2 x hidden x 4 (1 x when the model runs in fp32)
        MLP      4 x hidden x b (the same and the normed input) + f x intermediate x b, f = 3 gated (act(gate),
                 up, their product), 4 for gelu_new (its tanh formula runs op by op), else 2 (up, act(up))
        experts  4 x hidden x b + top_k x max(hidden x b + g x expert_intermediate x b, hidden x (2b + 8)):
                 grouped_mm's gathered tokens and gate_up output with its gating (g = 4: gate_up, act, product;
                 gpt-oss 10: a gathered bias and a clamped gate), then the fp32 routing-weighted rows and
                 their reordered copy
        Mamba    4 x hidden x b + 3 x d_inner x d_state x 4 (the reference selective scan's fp32 discretised
                 A, B and B x u, when mamba_ssm is not installed) + d_inner x (6b + 8) (in_proj output,
                 the conv and gate outputs, fp32 dt and skip)
    Per prompt of P tokens, with h attention heads: SDPA on windowed layers (and Falcon, MASK_ALWAYS) adds one
    P x P boolean mask for the batch. Eager attention (EAGER_ATTENTION: models transformers has no SDPA path for)
    adds two P x P masks in the model dtype per sequence, and its h x P x C probabilities (C = P + sinks columns)
    outlive attention (the layer returns them) into the MLP moment, while attention itself holds s bytes per
    score (gpt-oss: 3b, scores with sinks and max-subtracted; Gemma 2: b + 4 + b, masked scores, their fp32
    softmax and its cast back, the cast skipped in fp32):
        peak = batch x (2 P^2 b + max(P x per token + h P C b, P x 4 x hidden x b + h P C s))
    Without widths (a YAML spec without them, NAS blocks) a flat 1 GiB."""

    # `_supports_sdpa = False`: architecture -> (sink columns, score tensors in the model dtype, fp32 softmax)
    EAGER_ATTENTION = {"gpt_oss": (1, 3, False), "gemma2": (0, 1, True)}
    GATE_TENSORS = {"gpt_oss": 10}  # expert-intermediate-wide tensors of a routed token's gating, default 4
    PYTHON_GELU = frozenset({"gelu_new"})  # NewGELUActivation
    MODELLED_MIXERS = frozenset({"mamba"})  # others' scans (Gated DeltaNet's chunked fp32 one) are not
    MASK_ALWAYS = frozenset({"falcon"})  # builds its P x P mask even for SDPA (allow_is_causal_skip=False)

    def __init__(self, model: ModelSpec, dtype: DType):
        self.widths, self.bytes = model.widths, dtype.block_bytes / dtype.block_elements
        self.eager = self.EAGER_ATTENTION.get(model.architecture)
        self.heads = model.num_attention_heads
        self.gate_tensors = self.GATE_TENSORS.get(model.architecture, 4)
        self.residuals = 4 if model.num_layers > 1 else 3  # the first layer's input is the embedding output
        self.masked = model.architecture in self.MASK_ALWAYS or any(c.kind in WINDOWED for c in model.caches)
        mamba = [c for c in model.caches if c.kind == "recurrent" and c.mixer == "mamba" and c.conv_kernel]
        # (SSM elements, d_inner) of the widest Mamba mixer: d_inner channels, each conv_kernel - 1 conv inputs
        self.scan = max(((c.ssm_elements, c.conv_elements // (c.conv_kernel - 1)) for c in mamba), default=None)
        self.unmodelled = sorted({c.mixer for c in model.caches if c.kind == "recurrent"} - self.MODELLED_MIXERS)

    def per_token(self) -> int:
        w, b = self.widths, self.bytes
        stream = self.residuals * w.hidden * b
        norm = (self.residuals - 1) * w.hidden * b + (1 if b >= 4 else 2) * w.hidden * 4
        factor = 3 if w.gated_mlp else (4 if w.mlp_activation in self.PYTHON_GELU else 2)
        moments = [norm, stream + factor * w.mlp_intermediate * b]
        if self.scan:
            ssm, channels = self.scan
            moments.append(stream + 3 * ssm * 4 + channels * (6 * b + 8))
        if w.experts_per_token:
            gathered = max(w.hidden * b + self.gate_tensors * w.expert_intermediate * b, w.hidden * (2 * b + 8))
            moments.append(stream + w.experts_per_token * gathered)
        return math.ceil(max(moments))

    def peak(self, users: int, prompt: int) -> int:
        if not users:
            return 0
        if self.widths is None:
            return GiB
        layer = prompt * self.per_token()
        if self.eager is None:
            return users * layer + (prompt**2 if self.masked else 0)
        sinks, score_tensors, fp32_softmax = self.eager
        b = self.bytes
        per_score = score_tensors * b + (4 + (b if b < 4 else 0) if fp32_softmax else 0)
        scores = self.heads * prompt * (prompt + sinks)
        attention = prompt * self.residuals * self.widths.hidden * b + scores * per_score
        masks = 2 * prompt**2 * b
        return users * math.ceil(masks + max(layer + scores * b, attention))

    def notes(self) -> list[str]:
        if self.widths is None:
            return ["prefill activations: a flat 1 GiB (the model spec gives no forward widths)"]
        grows = "eager attention, quadratic in the prompt" if self.eager else \
            f"{self.per_token():,} B per prompt token"
        out = [f"prefill activations grow with batch x prompt ({grows})"]
        if self.scan:
            out.append("Mamba prefill sized for transformers' reference selective scan (mamba_ssm not installed); "
                       "the mamba_ssm kernels need far less")
        if self.unmodelled:
            out.append(f"{', '.join(self.unmodelled)} mixers' own transients are not in the prefill activations")
        return out


class Transformers(Engine):
    """Hugging Face transformers (`cache_utils.py`). From 5.15 DeepSeek's MLA caches the latent; 4.57-5.14
    cached decompressed per-head K and V, which kvplan's model spec does not carry."""

    name = "transformers"
    label = "transformers"
    default_version = "5.23.0"
    paged = False
    splits_heads = False
    downcasts_fp32 = False  # from_pretrained keeps the config's dtype
    reads = frozenset({"version", "memory_fraction", "cache_implementation"})
    kv_dtypes = ("fp32", "bf16", "fp16")
    # Families whose convolution state right after prefill is a fresh tensor of the last kernel - 1 inputs:
    # RecurrentGemma keeps its RG-LRU state on its modules (`RecurrentGemmaRecurrentBlock.conv1d_state`); each
    # decode step then keeps a view into the kernel-wide concatenation, which holds all of it.
    PREFILL_CONV_SHORT = frozenset({"recurrent_gemma"})
    WINDOWS_KEPT_WHOLE = frozenset({"gpt_neo"})  # local layers whose cache transformers does not cut to the window
    # Causal-LM classes that keep no cache between tokens: generate() runs the whole sequence again for each one.
    RECOMPUTES = {"openai-gpt": "OpenAIGPTLMHeadModel takes no cache",
                  "xlm": "generate() gives XLMWithLMHeadModel no cache (its forward takes `cache`, not "
                         "past_key_values)"}

    def cached_layers(self, model: ModelSpec) -> tuple[LayerCache, ...]:
        """The caches as transformers stores them. Falcon with new_decoder_architecture broadcasts K/V to every
        query head before caching; it is the only Falcon layout with 1 < kv_heads < num_attention_heads
        (multi_query has 1, plain MHA all). GPT-Neo's local layers keep every token: its config has no
        sliding_window, so DynamicCache makes plain layers, and the model masks the window itself. Recurrent
        states: `transformers_state`. Families in RECOMPUTES keep nothing."""
        if model.architecture in self.RECOMPUTES:
            return tuple(NoCache(layer=c.layer, reason=self.RECOMPUTES[model.architecture]) for c in model.caches)
        if any(c.kind == "mla" for c in model.caches) and version_tuple(self.version) < (5, 15):
            raise KvplanError(f"transformers {self.version} caches DeepSeek-style models' decompressed K/V, "
                              "which kvplan does not model: use --engine-version 5.15 or later")
        heads = model.num_attention_heads
        broadcast = model.architecture == "falcon"
        out = []
        for c in model.caches:
            if broadcast and c.kind in ("full", *WINDOWED) and 1 < c.kv_heads < heads:
                c = c.model_copy(update={"kv_heads": heads})
            elif c.kind == "sliding" and model.architecture in self.WINDOWS_KEPT_WHOLE:
                c = FullAttention(**c.model_dump(exclude={"kind", "window"}))
            elif c.kind == "recurrent":
                c = transformers_state(c)
            out.append(c)
        return tuple(out)

    def default_fraction(self) -> float:
        return 1.0

    def overhead(self) -> Overhead:
        """CUDA context 0.5 GiB; activations grow with the batch and are the pool's (`PrefillActivations`)."""
        return Overhead(cuda_context=GiB // 2)

    def pool(self, layers: Layers, model: ModelSpec, kv: DType) -> TransformersPool:
        """The cache is in the dtype the model runs in (no separate KV dtype), conv states included."""
        static = self.options.cache_implementation == "static"
        table = rows(layers, kv, kv)
        notes = ["StaticCache" if static else "DynamicCache"]
        if model.architecture in self.RECOMPUTES:
            notes[0] = (f"no cache: {self.RECOMPUTES[model.architecture]}, so generate() runs the whole sequence "
                        "again for every token")
        if not static and any(r.kind in WINDOWED for r in table):
            notes[0] = ("DynamicCache: sliding layers hold the whole prompt until the first decode step, then "
                        "min(ctx, W) tokens; sized for the peak, a prompt of up to ctx - 1 tokens")
        activations = PrefillActivations(model, kv)
        short = model.architecture in self.PREFILL_CONV_SHORT
        prefill_states = [r.state_bytes - kv.bytes_for(r.cache.conv_elements // r.cache.conv_kernel)
                          if short and r.kind == "recurrent" and r.cache.conv_kernel else r.state_bytes for r in table]
        return TransformersPool(table, static, activations, notes + activations.notes(), prefill_states)


# --------------------------------------------------------------------------------------------- TensorRT-LLM


class BlockPool(KVPool):
    """Per-layer pools of `block`-token blocks, each layer holding cdiv(tokens held, block) blocks; whole
    blocks of a shared prefix in full-attention layers are kept once. `block` = 1 is exact allocation."""

    def __init__(self, table: list[Row], block: int, notes: list[str]):
        self.table, self.block, self.notes = table, block, notes

    def bytes_for(self, users: int, ctx: int, shared_prefix: int = 0) -> int:
        total = 0
        for r in self.table:
            blocks = users * cdiv(r.tokens(ctx), self.block)
            if r.kind == "full" and users:
                blocks -= (users - 1) * (shared_prefix // self.block)
            total += r.count * (r.bytes_per_token * self.block * blocks + users * r.state_bytes)
        return total


class TensorRtLlm(Engine):
    """TensorRT-LLM `KvCacheConfig`: tokens_per_block 32, free_gpu_memory_fraction 0.9 of the memory free
    after the engine loads; one pool per attention window, a sequence holding the blocks its window needs."""

    name = "tensorrt-llm"
    label = "TensorRT-LLM"
    default_version = "KvCacheConfig docs"
    reads = frozenset({"memory_fraction", "block_size"})
    kv_dtypes = ("fp32", "bf16", "fp16", "fp8", "fp8_e4m3", "int8")
    fraction_flag = "--free-gpu-memory-fraction"

    def default_fraction(self) -> float:
        return 0.9

    def overhead(self) -> Overhead:
        """Runtime buffers 1 GiB, CUDA context 0.5 GiB."""
        return Overhead(activations=GiB, cuda_context=GiB // 2)

    def kv_budget(self, gpu_bytes: int, fraction: float, weights: int, overhead: int) -> int:
        """KV budget = free_gpu_memory_fraction x (GPU memory - weights - overhead)."""
        return math.floor(fraction * (gpu_bytes - weights - overhead))

    def pool(self, layers: Layers, model: ModelSpec, kv: DType) -> BlockPool:
        block = self.options.block_size or 32
        return BlockPool(rows(layers, kv, kv_dtype(model.dtype)), block, [f"tokens_per_block {block}"])


# ---------------------------------------------------------------------------------------------------- ideal


class Ideal(Engine):
    """No engine: exactly the tokens each layer holds (kvplan.memory), no blocks, no padding."""

    name = "ideal"
    label = "ideal"
    default_version = "exact"
    downcasts_fp32 = False

    def default_fraction(self) -> float:
        return 1.0

    def overhead(self) -> Overhead:
        """Activations 0.5 GiB and CUDA context 0.5 GiB: a bare 1 GiB."""
        return Overhead(activations=GiB // 2, cuda_context=GiB // 2)

    def pool(self, layers: Layers, model: ModelSpec, kv: DType) -> BlockPool:
        return BlockPool(rows(layers, kv, kv_dtype(model.dtype)), 1, ["exact tokens, no paging"])


ENGINES: dict[str, type[Engine]] = {
    e.name: e for e in (Vllm, Sglang, LlamaCpp, Transformers, TensorRtLlm, Ideal)}
ALIASES = {"llamacpp": "llama.cpp", "llama-cpp": "llama.cpp", "trtllm": "tensorrt-llm",
           "trt-llm": "tensorrt-llm", "hf": "transformers"}


def engine_class(name: str) -> type[Engine]:
    key = ALIASES.get(name.strip().lower(), name.strip().lower())
    if key not in ENGINES:
        raise KvplanError(f"unknown engine {name!r}: choose one of {', '.join(ENGINES)}")
    return ENGINES[key]


def engine(name: str, options: EngineOptions, gpu_name: str | None = None, gpu_bytes: int | None = None,
           tp: int = 1, pp: int = 1) -> Engine:
    return engine_class(name)(options, gpu_name, gpu_bytes, tp, pp)
