"""What every engine shares: its flags (EngineOptions, FLAG_NAMES), the questions it answers (`Engine`, `KVPool`),
what it answers with (Overhead, ServingExtras, LoraSlots, EagleHeadWeights), a GPU's caches as the rows its pool is
built from (`rows`), and BlockPool, the per-layer block pool of TensorRT-LLM and ideal. No engine module is
imported here."""

import functools
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import ClassVar, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict

from kvplan.dtypes import DType
from kvplan.errors import KvplanError
from kvplan.memory import default_kv_dtype, kind_label
from kvplan.model import (
    EMPTY_KINDS,
    REPLICATED_GROUPS,
    TRANSFORMERS_ONLY_KINDS,
    WEIGHT_GROUPS,
    LayerCache,
    LoraAdapter,
    ModelSpec,
    distinct_caches,
    remembered,
)
from kvplan.text import brief

GiB = 1 << 30
MiB = 1 << 20
Layers = Sequence[tuple[LayerCache, int]]  # one GPU's caches, identical layers counted once


def no_data_parallel(label: str, flag: str) -> str:
    return (f"{flag} is a vLLM and SGLang setting: {label} has no data-parallel attention or expert parallelism "
            "(use --gpus for independent replicas)")


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


class ServingExtras(BaseModel):
    """What an engine keeps for a deployment besides the weights, the KV cache and its fixed overhead: a multimodal
    model's start-up reservation for its inputs, the vision tower it does not load, and what it keeps in host
    memory. Bytes per GPU unless named otherwise."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    tower_not_loaded: int = 0  # vision tower weights left out (text-only serving), before the GPU split
    overhead: dict[str, int] = {}  # further overhead terms, by name
    kv_offload_bytes: int = 0  # host memory for offloaded KV, per engine instance (all its GPUs)
    notes: list[str] = []


class EngineOptions(BaseModel):
    """Engine flags as given on the command line; None means the engine's own default."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    version: str | None = None
    memory_fraction: float | None = None
    block_size: int | None = None
    max_num_batched_tokens: int | None = None
    async_scheduling: bool | None = None
    platform: Literal["gpu", "cpu"] | None = None  # vLLM: the platform it runs on (None: a GPU)
    kv_unified: bool | None = None
    swa_full: bool | None = None
    cache_implementation: Literal["dynamic", "static"] | None = None
    expandable_segments: bool | None = None  # transformers: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    ubatch_size: int | None = None
    batch_size: int | None = None
    cache_type_k: str | None = None
    cache_type_v: str | None = None
    flash_attn: Literal["on", "off", "auto"] | None = None
    speculative_tokens: int | None = None
    frontend: Literal["server", "python"] | None = None
    limit_mm_per_prompt: tuple[tuple[str, int], ...] | None = None
    language_model_only: bool | None = None
    kv_offloading_size: int | None = None  # bytes of host memory
    kv_offloading_backend: Literal["native", "lmcache"] | None = None
    cpu_offload_bytes: int | None = None
    speculative_method: Literal["draft_model", "eagle", "eagle3", "mtp", "ngram"] | None = None
    enable_lora: bool | None = None
    max_loras: int | None = None
    max_lora_rank: int | None = None
    max_cpu_loras: int | None = None
    gdn_prefill_backend: Literal["flashinfer", "triton", "cutedsl"] | None = None
    mamba_ssm_cache_dtype: Literal["auto", "float32", "float16", "bfloat16"] | None = None
    max_mamba_cache_size: int | None = None  # SGLang: Mamba state slots in all, over the DP ranks
    mamba_full_memory_ratio: float | None = None  # SGLang: the Mamba pool's memory over the KV pool's
    max_num_seqs: int | None = None  # vLLM --max-num-seqs (a DP rank's), SGLang --max-running-requests (all ranks')
    disable_radix_cache: bool | None = None  # SGLang: no radix cache (no prefix sharing, no MambaRadixCache)
    lora_adapters: tuple[LoraAdapter, ...] | None = None  # llama.cpp --lora files, as read


FLAG_NAMES = {
    "version": "--engine-version", "memory_fraction": "--gpu-memory-utilization",
    "block_size": "--block-size", "max_num_batched_tokens": "--max-num-batched-tokens",
    "async_scheduling": "--async-scheduling/--no-async-scheduling", "platform": "--platform",
    "kv_unified": "--kv-unified", "swa_full": "--swa-full", "cache_implementation": "--cache-implementation",
    "expandable_segments": "--expandable-segments",
    "ubatch_size": "--ubatch-size", "batch_size": "--batch-size", "cache_type_k": "--cache-type-k",
    "cache_type_v": "--cache-type-v", "flash_attn": "--flash-attn", "speculative_tokens": "--speculative-tokens",
    "frontend": "--frontend", "limit_mm_per_prompt": "--limit-mm-per-prompt",
    "language_model_only": "--language-model-only", "kv_offloading_size": "--kv-offloading-size",
    "kv_offloading_backend": "--kv-offloading-backend", "cpu_offload_bytes": "--cpu-offload-gb",
    "speculative_method": "--speculative-method", "enable_lora": "--enable-lora",
    "max_loras": "--max-loras", "max_lora_rank": "--max-lora-rank", "max_cpu_loras": "--max-cpu-loras",
    "gdn_prefill_backend": "--gdn-prefill-backend", "mamba_ssm_cache_dtype": "--mamba-ssm-cache-dtype",
    "lora_adapters": "--lora", "max_mamba_cache_size": "--max-mamba-cache-size",
    "mamba_full_memory_ratio": "--mamba-full-memory-ratio", "max_num_seqs": "--max-num-seqs",
    "disable_radix_cache": "--disable-radix-cache",
}


@functools.cache  # asked for at every rule that depends on the release, a few thousand times in a table sweep
def version_tuple(text: str) -> tuple[int, ...]:
    """`0.33.0`, `v0.19`, `5.15.1` -> (0, 33, 0), ... ; anything else is bad input."""
    parts = text.strip().removeprefix("v").split(".")
    if not parts or not all(p.isascii() and p.isdigit() and len(p) <= 6 for p in parts):
        raise KvplanError(f"--engine-version {brief(text)} is not a release number like 0.33.0")
    return tuple(int(p) for p in parts)


WINDOWED = ("sliding", "chunked")
COMPRESSED_KINDS = ("sliding_kv", "compressed")  # DeepSeek V4's shared-KV windows and compressors


def is_windowed(cache: LayerCache) -> bool:
    """A cache that keeps only its window: sliding, chunked, or an MLA latent with a sliding window."""
    return cache.kind in WINDOWED or (cache.kind == "mla" and cache.window is not None)


class Row(NamedTuple):
    """`count` identical layers of one GPU, as an engine treats them: `kind` is the cache kind, with MLA and
    cross-attention counted as full, and windowed layers too where the engine ignores their window. A plain record
    of values already validated, built for every pool of a planning table's sweep."""

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
        return ctx if self.kind == "full" and is_windowed(self.cache) else self.cache.tokens_held(ctx)


def engine_kind(cache: LayerCache, sliding_as_full: bool = False) -> str:
    """The kind an engine allocates a cache as: MLA latents, indexer keys and cross-attention as full attention,
    a sliding MLA latent as sliding, and windowed caches as full where the engine ignores their window."""
    if is_windowed(cache):
        return "full" if sliding_as_full else ("sliding" if cache.kind == "mla" else cache.kind)
    return "full" if cache.kind in ("mla", "indexer", "cross") else cache.kind


def rows(layers: Layers, kv: DType, state_dtype: DType, sliding_as_full: bool = False) -> list[Row]:
    """A GPU's caches as rows; layers that store nothing of their own (no cache, KV shared) are dropped."""
    out = []
    for cache, count in layers:
        kind = engine_kind(cache, sliding_as_full)
        if kind not in EMPTY_KINDS:
            out.append(Row(cache=cache, kind=kind, count=count, bytes_per_token=cache.bytes_per_token(kv),
                           state_bytes=cache.state_bytes(state_dtype)))
    return out


class KVPool(ABC):
    """One GPU's KV pool as an engine builds it."""

    notes: list[str]
    max_sequences: int | None = None  # the most sequences one engine instance holds, where it has a limit
    frees_in_decode: bool = False  # whether `steady_bytes_for` can be less than `bytes_for` (a sequence frees blocks)

    def sequence_limit(self, budget: int) -> int | None:
        """The most sequences one engine instance runs at once with `budget` for its pools: `max_sequences`, unless
        the engine sizes its limit by its pool (SGLang)."""
        return self.max_sequences

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

    def gpu_bytes_for(self, users: int, ctx: int) -> int | None:
        """The device memory the engine's process holds for `users` sequences of ctx tokens, where the engine's
        allocator is modelled (transformers); None elsewhere."""
        return None

    def budget_notes(self, budget: int, ctx: int) -> list[str]:
        """What the engine makes of this budget at ctx, where it splits it between pools of its own (SGLang's
        Mamba pool); none by default."""
        return []

    def bytes_per_sequence(self, ctx: int) -> int:
        """What the engine reserves or holds for one sequence at ctx."""
        return self.bytes_for(1, ctx) - self.bytes_for(0, ctx)

    def bytes_per_sequence_decode(self, ctx: int) -> int:
        """What one sequence holds in steady decode at ctx, where that is less than what capacity must allow."""
        return self.bytes_per_sequence(ctx)


_STORED: dict = {}  # `remembered` engines' stored forms of caches (`Engine.stored_once`)


class Engine(ABC):
    """An engine's rules for one deployment: its flags, the GPU it runs on, TP and PP degrees."""

    name: ClassVar[str]
    label: ClassVar[str]
    default_version: ClassVar[str]
    paged: ClassVar[bool] = True  # allocates as sequences grow, so average lengths and shared prefixes count
    # admits a request only with KV room for all its tokens, prompt and output (TensorRT-LLM); False: holds the
    # tokens it has, so a running request holds its prompt and half its output on average (the speed model)
    reserves_whole_request: ClassVar[bool] = False
    # holds a new prompt back until every attention-DP rank has one, at most a number of steps (the speed model)
    balances_attention_dp: ClassVar[bool] = False
    reads: ClassVar[frozenset[str]] = frozenset({"memory_fraction"})  # EngineOptions fields it understands
    kv_dtypes: ClassVar[tuple[str, ...] | None] = None  # cache dtypes it offers (None: any)
    fraction_flag: ClassVar[str] = "--gpu-memory-utilization"
    splits_heads: ClassVar[bool] = True  # supports tensor parallelism
    downcasts_fp32: ClassVar[bool] = True  # loads fp32 checkpoints in bf16 (vLLM dtype "auto", since 0.10.1)
    # what the pool's activation_bytes are, in the report: memory that grows with the batch beside the cache
    activations_label: ClassVar[str] = "prefill activations"
    holds_transformers_only_caches: ClassVar[bool] = False  # runs the models with TRANSFORMERS_ONLY_KINDS caches
    data_parallel: ClassVar[bool] = False  # data-parallel attention and expert parallelism (vLLM, SGLang)
    tp_spans_dp: ClassVar[bool] = False  # its --tp counts every GPU of a stage, DP ranks included (SGLang)
    # speculative decoding methods whose memory kvplan sizes under this engine (EngineOptions.speculative_method)
    speculative_methods: ClassVar[tuple[str, ...]] = ()
    draft_models: ClassVar[bool] = False  # runs a --draft-model without a --speculative-method (llama-server -md)
    # why one instance runs at most {limit} sequences at once (KVPool.max_sequences), for messages
    sequence_limit_reason: ClassVar[str] = "its limit"

    @classmethod
    def drafted_tokens(cls, speculative_tokens: int | None) -> int:
        """Tokens a decode step drafts per request for `speculative_tokens` (vLLM's num_speculative_tokens: each
        one drafted)."""
        return speculative_tokens or 0

    def __init__(self, options: EngineOptions, gpu_name: str | None, gpu_bytes: int | None, tp: int, pp: int,
                 dp: int = 1, ep: int = 1):
        for field, value in options.__dict__.items():  # the fields (pydantic's iteration filters each name)
            if value is not None and field not in self.reads:
                raise KvplanError(f"{FLAG_NAMES[field]} is not a {self.label} setting")
        if options.version is not None:
            version_tuple(options.version)
        if tp > 1 and not self.splits_heads:
            raise KvplanError(f"{self.label} splits a model over GPUs by layers, not heads: "
                              f"use --pp {tp}, not --tp")
        if (dp > 1 or ep > 1) and not self.data_parallel:
            raise KvplanError(no_data_parallel(self.label, "--dp" if dp > 1 else "--ep"))
        self.options = options
        self.version = options.version or self.default_version
        self.version_given = options.version is not None
        self.gpu_name = gpu_name
        self.gpu_bytes = gpu_bytes
        self.tp, self.pp, self.dp, self.ep = tp, pp, dp, ep

    def prefix_sharing_problem(self) -> str | None:
        """Why this deployment would not keep a shared prefix once (--shared-prefix), where it would not."""
        return None

    @classmethod
    def splits_into_stages(cls, model: ModelSpec) -> bool:
        """Whether kvplan sizes `model` split into pipeline stages under this engine (`plan` tries PP layouts only
        where it does)."""
        return True

    def stage_sizes(self, num_layers: int) -> list[int]:
        """Layers of each of the `pp` pipeline stages: num_layers // pp each, the remainder one apiece to the stages
        before the last, from the second-to-last backwards (vLLM `get_pp_indices`, vllm/distributed/utils.py)."""
        sizes = [num_layers // self.pp] * self.pp
        for i in range(2, num_layers % self.pp + 2):
            sizes[-i] += 1
        return sizes

    def gpu_vendor(self) -> str | None:
        """The GPU's vendor (nvidia, amd, apple), which picks the engine's platform: None without a GPU or for one
        not in the catalogue (--vram)."""
        if not self.gpu_name:
            return None
        from kvplan.gpus import vendor

        return vendor(self.gpu_name)

    def stage_keeps_nothing(self, table: list[Row], model: ModelSpec) -> bool:
        """Whether this pipeline stage's layers (`table`, its rows) keep no cache of their own though the model's
        other layers do (no-op attention or KV-shared layers in one stage): vLLM refuses such a stage, and kvplan
        does not model SGLang's."""
        return not table and self.pp > 1 and any(c.kind not in EMPTY_KINDS for c in model.caches)

    @classmethod
    def ep_size_problem(cls, ep: int, stage: int) -> str | None:
        """What is wrong with expert-parallel size `ep` over a pipeline stage of `stage` GPUs (DP x attention TP),
        for engines with expert parallelism."""
        return None

    @classmethod
    def parallel_problem(cls, model: ModelSpec, tp: int, dp: int, ep: int) -> str | None:
        """What keeps this engine from splitting `model` with attention TP `tp`, `dp` data-parallel attention ranks
        and expert-parallel size `ep`, or None. Expert parallelism needs routed experts, their count, and an EP size
        the engine offers."""
        if ep == 1:
            return None
        if not model.params.experts:
            return f"--ep {ep}: {model.name} has no routed experts to split (it is not a mixture-of-experts model)"
        if model.widths is None or not model.widths.experts:
            return (f"--ep {ep}: kvplan does not know how many routed experts {model.name} has (its model spec gives "
                    "no expert count), so it cannot place them on EP ranks")
        return cls.ep_size_problem(ep, tp * dp)

    def weight_shares(self, model: ModelSpec) -> dict[str, Fraction]:
        """The share of each parameter group (`kvplan.memory.weights_by_group`) that the fullest GPU holds: here
        every group split over TP x PP, but the `_replicated` groups (MLA's down-projections, a DSA indexer, norms,
        routers), which every TP rank holds whole, over PP alone. vLLM: `ReplicatedLinear`, fused_qkv_a_proj with
        disable_tp, `RMSNorm`, `GateLinear` (`models/deepseek_v2.py`); TensorRT-LLM's MLA builds kv_a_proj_with_mqa
        (q_a fused in) with no TP mapping (`_torch/modules/attention.py`); llama.cpp and transformers split by layer
        alone (TP 1)."""
        shares = dict.fromkeys(WEIGHT_GROUPS, Fraction(1, self.tp * self.pp))
        shares.update(dict.fromkeys(REPLICATED_GROUPS, Fraction(1, self.pp)))
        return shares

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

    def cache_types(self, kv: DType) -> tuple[DType, DType]:
        """The dtypes of the keys and of the values for KV dtype `kv`: both `kv` (llama.cpp sets them apart)."""
        return kv, kv

    def check_model_kv(self, model: ModelSpec, kv: DType) -> None:
        """Refuse, as the engine does, a KV dtype this model cannot have (nothing by default)."""
        return None

    def check_kv_dtype(self, dtype: DType) -> None:
        if self.kv_dtypes is not None and dtype.name not in self.kv_dtypes:
            offered = ", ".join(self.kv_dtypes)
            raise KvplanError(f"{self.label} has no {dtype.name} KV cache: it offers {offered}")

    def cached_layers(self, model: ModelSpec) -> tuple[LayerCache, ...]:
        """The caches as this engine stores them (before tensor and pipeline parallelism): the same for every layout,
        read from nothing but the model and the engine's class, release and flags (`stored_once` relies on it)."""
        return model.caches

    def stored_once(self, model: ModelSpec, store: Callable[[], tuple[LayerCache, ...]]) -> tuple[LayerCache, ...]:
        """`store()`, this engine's `cached_layers` of `model`, built once for a search that asks it of every layout
        (a new tuple of a 100,000-layer model's caches, each layout, took most of a minute): remembered by the model
        (a frozen ModelSpec: the same object, the same caches, family and sizes) and the engine's class, release and
        flags, which are all `cached_layers` may read: not the layout's TP, PP and GPU."""
        return remembered(_STORED, model, (type(self), self.version, self.options), store)

    # Where this engine lays out DeepSeek V4's compressed attention (cache kinds COMPRESSED_KINDS) in a way kvplan
    # does not model: such a model is refused, naming it. None: the engine's rules size it.
    compressed_attention: ClassVar[str | None] = None

    def refuse_compressed_attention(self, model: ModelSpec) -> None:
        if self.compressed_attention and any(c.kind in COMPRESSED_KINDS for c in distinct_caches(model.caches)):
            raise KvplanError(f"kvplan does not model {self.label}'s cache for DeepSeek V4's compressed attention "
                              f"({self.compressed_attention}), so it cannot size {model.name} there: use --engine "
                              "transformers or ideal")
    def check_caches(self, model: ModelSpec) -> None:
        """A one-line refusal for a model whose cache is not keys, values or recurrent state (TRANSFORMERS_ONLY_KINDS:
        XLNet's and Reformer's hidden states, CPM-Ant's prompt prefix): no release of vLLM, SGLang, llama.cpp or
        TensorRT-LLM has a model class for these (vLLM's `model_executor/models/registry.py`; its Transformers
        backend needs models that run transformers' attention interface, `_supports_attention_backend`, which these
        do not), so only transformers, and kvplan's exact `ideal` arithmetic, size them."""
        kept = next((c for c in distinct_caches(model.caches) if c.kind in TRANSFORMERS_ONLY_KINDS), None)
        if kept is not None and not self.holds_transformers_only_caches:
            raise KvplanError(f"{self.label} does not run {model.architecture} models ({model.name}): no "
                              f"{self.label} release has a model class that keeps their cache ({kind_label(kept)}); "
                              "--engine transformers sizes it as transformers runs it")

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

    def assumptions(self, uses_fraction: bool = True) -> list[str]:
        """One line per default this engine applied, with its basis; `uses_fraction` False where the budget was given
        (--kv-budget), so that no memory fraction applied."""
        return []

    def serving_extras(self, model: ModelSpec, tower_bytes: int, max_len: int) -> ServingExtras:
        """What the engine keeps for a multimodal model's inputs and in host memory: nothing by default."""
        return ServingExtras()

    def weights_offloaded(self, model: ModelSpec, weights_per_gpu: int, dtype_name: str | None,
                          groups: dict[str, int], shares: dict[str, Fraction]) -> int:
        """Bytes of each GPU's `weights_per_gpu` (of `model` in `dtype_name`; the bytes of each parameter group and
        the share of it the GPU holds, which they were summed from) the engine keeps in host memory instead (0:
        none)."""
        return 0

    def speculative_pool(self, layers: Layers, draft_layers: Layers, draft: ModelSpec | None, model: ModelSpec,
                         kv: DType) -> KVPool:
        """One GPU's pool when the engine also runs a draft (`draft`: the draft model, MTP layers or EAGLE head, None
        for n-gram lookup; `draft_layers`: its caches on this GPU): by default the draft's layers join the model's
        in the one pool, once the engine's refusals of the draft's own kind are passed."""
        if draft_layers:
            self.pool(draft_layers, draft, kv)
        return self.pool([*layers, *draft_layers], model, kv)

    def lora_slots(self, model: ModelSpec) -> "LoraSlots | None":
        """The LoRA adapter slots this engine preallocates on each GPU (EngineOptions.enable_lora), or None."""
        return None

    def eagle_head(self, model: ModelSpec, head: ModelSpec, method: str) -> "EagleHeadWeights":
        """The weights of EAGLE head `head` on each GPU, as this engine builds it for `model` (engines whose
        speculative_methods include eagle and eagle3)."""
        raise KvplanError(f"kvplan does not size {self.label}'s EAGLE heads")


class LoraSlots(BaseModel):
    """LoRA adapters an engine keeps: `slots` on each GPU (`gpu_bytes` in all, at start-up), each of rank up to
    `rank` in `dtype`, and `host_bytes` of them in host memory (vLLM: max_cpu_loras adapters cached by each GPU's
    worker, one of the largest rank on every module the slots hold, unsharded, at most; llama.cpp: the token
    embeddings' pairs)."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    slots: int
    rank: int
    dtype: str
    gpu_bytes: int
    host_bytes: int


class EagleHeadWeights(BaseModel):
    """What an EAGLE head puts on each GPU: `elements` in the model's dtype and `int64` 8-byte token ids (its
    draft-to-model vocabulary map), and where its embeddings and output head come from."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    elements: int
    int64: int = 0
    notes: list[str] = []


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
