"""Capacity: how many users fit on one GPU or several, computed the way the serving engine allocates memory.

    KV budget per GPU = GPU memory x fraction - weights per GPU - overhead   (engine rules: kvplan.engines)
                        or exactly --kv-budget
    max users at ctx  = replicas x the largest N whose pool.peak_bytes(N, ctx) fits the budget on every stage
    max ctx for N     = the largest ctx whose pool.peak_bytes(N / replicas, ctx) fits it on every stage
peak_bytes is the KV the engine allocates plus activations that grow with the batch, which only transformers has
(it prefills the whole batch in one pass; the others' activations are fixed overhead). The KV is counted two ways,
which differ for sliding-window and chunked models under vLLM:
    at start-up  (pool.bytes_for): what the engine reserves per request to admit it, vLLM's start-up check and
                 its logged "Maximum concurrency": each request's window plus all in-flight tokens;
    steady decode (pool.steady_bytes_for): what the requests hold while decoding without preemption, windows
                 freed as they slide, the in-flight tokens' blocks counted once for the engine.
The headline `max_concurrent_users` is the steady-decode figure (0 where the start-up check fails: the engine
refuses to start); `max_users_at_startup` the other.
Tensor parallelism splits KV heads, max(1, kv_heads // tp) per GPU (replicated when tp > kv_heads), and
recurrent state, never the MLA latent; pipeline parallelism splits layers into stages (vLLM's
`get_pp_indices`) and the fullest stage binds; GPUs beyond tp x pp are data-parallel replicas.
Weights per GPU = (what every TP rank holds whole + the rest / tp) / pp: MLA's down-projections, DSA indexers, norms
and routers are whole on every rank (the `_replicated` parameter groups, `Engine.weight_shares`).
Data-parallel attention (vLLM --data-parallel-size, SGLang --enable-dp-attention --dp) runs dp ranks of attention
TP tp each, every rank with its own users and KV pool, while the routed experts are split over all dp x tp GPUs
of a stage (expert parallelism, --ep, places them whole):
    weights per GPU = sum over parameter groups of the group's bytes x the share the fullest GPU holds
                      (engine rules: `Engine.weight_shares`; attention by the attention TP, experts by dp x tp)
    max users       = dp x the users one rank's pool serves (the replicas above multiply it too)
so for an MLA model, whose latent every TP rank stores whole, dp ranks of TP 1 hold up to dp times the users that
TP dp holds on the same GPUs, less what the attention weights each rank repeats take from every GPU's budget.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from kvplan import engines
from kvplan.dtypes import WEIGHT_DTYPES, DType, kv_dtype, weight_dtype
from kvplan.engines import Engine, EngineOptions, KVPool, LoraSlots, ServingExtras, VllmPool, cdiv
from kvplan.errors import KvplanError
from kvplan.memory import (
    checkpoint_bytes,
    vision_bytes,
    weights_by_group,
    weights_bytes,
    weights_from_checkpoint,
)
from kvplan.model import LayerCache, ModelSpec, RecurrentState

SEARCH_LIMIT = 1 << 24  # longest context searched for models that state no maximum
GPU_COUNTS = (1, 2, 4, 8, 16, 32, 64)
SPLIT_DEGREES = (1, 2, 4, 8)  # TP within a node; PP degrees tried by `plan`
ATTENTION_KINDS = ("full", "sliding", "chunked", "cross", "prefixed")


class Hardware(BaseModel):
    """The GPU: its catalogue name (None for --vram) and the memory it may use; nothing with --kv-budget."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    name: str | None = None
    memory_bytes: int | None = None


class Parallelism(BaseModel):
    """A layout: `replicas` independent copies, each `dp` data-parallel attention ranks of `tp` x `pp` GPUs (tp:
    the attention tensor parallelism of one rank), the routed experts over the dp x tp GPUs of a stage, whole on
    `ep` expert-parallel ranks (1: sliced by TP)."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    replicas: int = 1
    from_gpus: bool = Field(False, description="TP or PP taken from --gpus, not given")

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp * self.replicas

    @property
    def ranks(self) -> int:
        """The KV pools that serve users on their own: DP ranks x replicas."""
        return self.dp * self.replicas


class Workload(BaseModel):
    """Users each holding ctx tokens (prompt plus output); avg_ctx: their mean length; shared_prefix: the
    tokens of a system prompt every user starts with, cached once by prefix caching."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    ctx: int
    users: int | None = None
    avg_ctx: int | None = None
    shared_prefix: int = 0

    @property
    def target(self) -> int:
        return self.users or 1


class Capacity(BaseModel):
    """One deployment's capacity. Sizes in bytes, per GPU unless named otherwise."""

    model_config = ConfigDict(defer_build=True)

    engine: str
    engine_version: str
    engine_version_given: bool
    engine_assumptions: list[str]
    gpu: str | None
    gpu_memory_bytes: int | None
    gpus: int
    tensor_parallel_size: int = Field(description="attention tensor parallelism of one data-parallel rank")
    pipeline_parallel_size: int
    data_parallel_size: int = Field(1, description="data-parallel attention ranks sharing the experts")
    expert_parallel_size: int = Field(1, description="ranks the routed experts are placed on whole (1: sliced)")
    data_parallel_replicas: int
    ctx: int
    kv_dtype: str
    v_dtype: str | None = Field(None, description="the V cache's dtype where it differs from kv_dtype, the K "
                                "cache's (llama.cpp --cache-type-v)")
    weights_dtype: str
    weights_dtype_override: str | None = Field(None, exclude=True, description="dtype weights were cast to")
    memory_fraction: float | None
    weights_bytes_per_gpu: int
    weights_bytes_per_gpu_experts: int = Field(0, description="of weights_bytes_per_gpu, the routed experts' share")
    overhead_bytes: int | None
    overhead: dict[str, int] | None
    kv_budget_bytes: int
    kv_budget_given: bool
    engine_kv_bytes_per_sequence: int
    users: int
    engine_kv_bytes_for_users: int
    engine_activation_bytes_for_users: int = 0  # activations that grow with the batch (transformers prefill)
    engine_activation_bytes_per_sequence: int = 0
    engine_gpu_bytes_for_users: int | None = Field(None, description="device memory the engine's process holds for "
                                                   "the users asked, as the driver counts it (transformers: what "
                                                   "torch's caching allocator reserves and the CUDA context)")
    engine_kv_bytes_per_sequence_decode: int  # what a sequence holds in steady decode (sliding layers trimmed)
    engine_kv_bytes_in_flight: int = 0  # what the in-flight tokens add to the steady hold, once for the engine
    engine_kv_bytes_fixed: int = Field(0, description="what the engine's pools hold whatever the users (vLLM's null "
                                       "block, SGLang's --max-mamba-cache-size slots)")
    max_concurrent_users: int = Field(description="users served at ctx in steady decode without preemption")
    max_users_at_startup: int = Field(description="users the engine's start-up reservation admits (vLLM's "
                                      "start-up check and logged maximum concurrency)")
    sequence_limit: int | None = Field(None, description="the most sequences one engine instance (a DP rank) runs "
                                       "at once, where the engine has a limit (llama.cpp: 256, LLAMA_MAX_SEQ; vLLM: "
                                       "max_num_seqs; SGLang: max_running_requests)")
    max_users_per_rank: int = Field(0, description="max_concurrent_users of one data-parallel rank (one replica "
                                                   "without data-parallel attention)")
    max_ctx_for_users: int | None
    avg_ctx: int | None
    max_users_at_avg_ctx: int | None
    shared_prefix: int
    fits: bool
    reasons: list[str]
    suggestions: list[str]
    notes: list[str]
    vllm_num_blocks: int | None = None
    vllm_kv_cache_tokens: int | None = None
    vllm_max_concurrency: float | None = None
    vllm_log: list[str] | None = None
    vllm_block_bytes: int | None = None
    vllm_blocks_per_sequence: int | None = None
    vllm_kv_bytes_per_sequence_decode: int | None = None
    vllm_kv_offload_blocks: int | None = Field(None, description="blocks the native CPU offloading connector holds, "
                                               "each one GPU block of every worker")
    vllm_kv_offload_tokens: int | None = Field(None, description="prefix tokens those blocks hold (one KV-cache "
                                               "group); None for hybrid layouts")
    weights_not_loaded_bytes: int = Field(0, description="vision tower weights the engine does not load (text-only "
                                          "serving), all GPUs together")
    weights_offloaded_bytes_per_gpu: int = Field(0, description="weights each GPU keeps in host memory (vLLM "
                                                 "--cpu-offload-gb)")
    kv_offload_bytes: int = Field(0, description="host memory for offloaded KV blocks, per engine instance")
    host_memory_bytes: int = Field(0, description="host memory the deployment pins: offloaded weights of every GPU "
                                   "and offloaded KV of every replica")
    speculative_method: str | None = Field(None, description="the speculative decoder: draft_model, mtp or ngram")
    speculative_tokens: int | None = Field(None, description="draft tokens per step (num_speculative_tokens)")
    draft_model: str | None = Field(None, description="the draft: a draft model, or the checkpoint's MTP layers")
    draft_weights_bytes_per_gpu: int = 0
    engine_kv_bytes_per_sequence_draft: int = Field(0, description="what speculative decoding adds to "
                                                    "engine_kv_bytes_per_sequence: the draft's layers, and the slots "
                                                    "of a step's drafts where the engine keeps them per request")
    lora_slots: int | None = Field(None, description="LoRA adapters held on each GPU at once (vLLM max_loras; "
                                   "llama.cpp: the --lora files)")
    lora_rank: int | None = Field(None, description="the largest adapter rank a slot holds (max_lora_rank)")
    lora_bytes_per_gpu: int = 0
    lora_host_bytes_per_gpu: int | None = Field(None, description="host memory of each GPU's worker for "
                                                "max_cpu_loras cached adapters, at most (llama.cpp: the token "
                                                "embeddings' pairs)")

    @property
    def headroom_bytes(self) -> int:
        return self.kv_budget_bytes - self.engine_kv_bytes_for_users - self.engine_activation_bytes_for_users

    def unused_extras(self) -> set[str]:
        """The speculative-decoding and LoRA fields of a deployment that has neither, left out of --json."""
        unused = set() if self.engine_gpu_bytes_for_users is not None else {"engine_gpu_bytes_for_users"}
        if self.speculative_method is None:
            unused |= {"speculative_method", "speculative_tokens", "draft_model", "draft_weights_bytes_per_gpu",
                       "engine_kv_bytes_per_sequence_draft"}
        if self.lora_slots is None:
            unused |= {"lora_slots", "lora_rank", "lora_bytes_per_gpu", "lora_host_bytes_per_gpu"}
        return unused


# ---------------------------------------------------------------------------------------------- parallelism


def check_parallel(model: ModelSpec, tp: int, pp: int, from_gpus: bool = False, dp: int = 1) -> None:
    """TP must divide the attention heads, and split KV heads evenly or replicate them whole (tp a multiple of
    kv_heads); PP cannot exceed the layers. `from_gpus`: the degrees came from --gpus, so the error says so; with
    `dp` data-parallel attention ranks tp is the attention TP of one rank."""
    if tp < 1 or pp < 1:
        raise KvplanError(f"--tp and --pp must be at least 1, got {tp} and {pp}")
    problem = _tp_problem(model, tp)
    flag = f"--gpus {tp * pp} as TP {tp}" if from_gpus else f"--tp {tp}"
    if dp > 1:
        flag, from_gpus = f"attention TP {tp} (with --dp {dp})", False
    if problem:
        hint = "; give --tp with --gpus" if from_gpus else ""
        raise KvplanError(f"{flag} {problem} (valid TP: {', '.join(map(str, valid_tp(model)))}{hint})")
    if pp > model.num_layers:
        flag = f"--gpus {tp * pp} as PP {pp}" if from_gpus else f"--pp {pp}"
        raise KvplanError(f"{flag} exceeds {model.name}'s {model.num_layers} layers")


def _tp_problem(model: ModelSpec, tp: int) -> str | None:
    heads = model.num_attention_heads
    if heads % tp:
        return f"does not divide {model.name}'s {heads} attention heads: each GPU must hold whole heads"
    split = {c.kv_heads for c in model.caches if c.kind in ATTENTION_KINDS and c.split_by_tensor_parallel}
    for kv in sorted(split):
        if (kv >= tp and kv % tp) or (tp > kv and tp % kv):
            return (f"cannot share {model.name}'s {kv} KV heads: TP must divide them, or be a multiple of "
                    "them to replicate them")
    for state in {c for c in model.caches if c.kind == "recurrent"}:
        problem = _recurrent_tp_problem(state, tp)
        if problem:
            return f"{problem} of {model.name}'s {state.mixer} layers"
    return None


def _recurrent_tp_problem(state: RecurrentState, tp: int) -> str | None:
    """vLLM's mixers split a recurrent state by heads (Mamba-2, Gated DeltaNet: `num_heads % tp == 0`), B and C
    groups only when tp divides them or there is one group to replicate (`mamba_mixer2.py`), and Mamba's
    channels evenly (`divide(intermediate_size, tp)`)."""
    if state.heads:
        if state.heads % tp:
            return f"does not divide the {state.heads} SSM heads"
        if state.groups and state.groups % tp and state.groups != 1:
            return f"does not divide the {state.groups} B/C groups (only a single group is replicated)"
    elif state.conv_kernel and state.conv_elements // (state.conv_kernel - 1) % tp:
        return f"does not divide the {state.conv_elements // (state.conv_kernel - 1):,} channels"
    return None


def valid_tp(model: ModelSpec, limit: int = 64) -> list[int]:
    candidates = range(1, min(limit, model.num_attention_heads or limit) + 1)
    return [tp for tp in candidates if _tp_problem(model, tp) is None]


def split_for_tp(cache: LayerCache, tp: int) -> LayerCache:
    """One GPU's share of a layer's cache: max(1, kv_heads // tp) heads; recurrent state / tp; MLA whole.
    A Mamba-2 state whose B/C groups tp does not divide first gets tp - groups more groups of 2 x state_size
    conv channels, so that every GPU holds the group its heads read (vLLM `extra_groups_for_head_shards`)."""
    if tp == 1 or not cache.split_by_tensor_parallel:
        return cache
    if cache.kind in ATTENTION_KINDS:
        return cache.model_copy(update={"kv_heads": max(1, cache.kv_heads // tp)})
    if cache.kind == "recurrent":
        conv = cache.conv_elements
        if cache.groups and cache.groups % tp and cache.conv_kernel:
            conv += (tp - cache.groups) * 2 * cache.state_size * (cache.conv_kernel - 1)
        return cache.model_copy(update={"conv_elements": conv // tp, "ssm_elements": cache.ssm_elements // tp})
    return cache


def stage_bounds(sizes: list[int]) -> list[tuple[int, int]]:
    """Layer ranges of pipeline stages of these sizes (`Engine.stage_sizes`)."""
    bounds, start = [], 0
    for size in sizes:
        bounds.append((start, start + size))
        start += size
    return bounds


def gpu_layers(caches: tuple[LayerCache, ...], stage_sizes: list[int], tp: int) -> list[engines.Layers]:
    """Per pipeline stage (of `stage_sizes` layers each), the caches one GPU holds, identical ones counted once."""
    stages = []
    for start, end in stage_bounds(stage_sizes):
        # Group on `alike_key`, then copy one cache per group.
        groups: dict[tuple, list] = {}
        for cache in caches:
            if start <= cache.layer < end:
                key = cache.alike_key()
                if key in groups:
                    groups[key][1] += 1
                else:
                    groups[key] = [cache, 1]
        counts: dict[LayerCache, int] = {}
        for cache, count in groups.values():
            key = split_for_tp(cache.model_copy(update={"layer": 0}), tp)
            counts[key] = counts.get(key, 0) + count
        stages.append(list(counts.items()))
    return stages


def parallelism(engine_name: str, gpus: int | None, tp: int | None, pp: int | None, dp: int | None = None,
                ep: int | None = None, expert_parallel: bool = False) -> Parallelism:
    """--gpus, --tp, --pp (and --dp, --ep, --enable-expert-parallel) -> a layout. Without --tp the GPUs form one
    replica: tensor parallel where the engine splits heads, pipeline stages where it splits layers (llama.cpp,
    transformers); GPUs beyond TP x PP are data-parallel replicas. With --dp, --ep or --enable-expert-parallel
    see `data_parallelism`."""
    for flag, value in (("--gpus", gpus), ("--tp", tp), ("--pp", pp), ("--dp", dp), ("--ep", ep)):
        if value is not None and value < 1:
            raise KvplanError(f"{flag} must be at least 1, got {value}")
    if dp is not None or ep is not None or expert_parallel:
        return data_parallelism(engines.engine_class(engine_name), gpus, tp, pp, dp, ep, expert_parallel)
    derived = bool(gpus) and tp is None
    if gpus and tp is None:
        if engines.engine_class(engine_name).splits_heads:
            tp = gpus // (pp or 1) or 1
        elif pp is None:
            pp = gpus
    tp, pp = tp or 1, pp or 1
    gpus = gpus or tp * pp
    if gpus % (tp * pp):
        raise KvplanError(f"--gpus {gpus} is not a multiple of TP x PP = {tp} x {pp}: give --gpus a multiple of "
                          "--tp x --pp")
    return Parallelism(tp=tp, pp=pp, replicas=gpus // (tp * pp), from_gpus=derived)


def data_parallelism(engine: type[Engine], gpus: int | None, tp: int | None, pp: int | None, dp: int | None,
                     ep: int | None, expert_parallel: bool) -> Parallelism:
    """A layout with data-parallel attention or expert parallelism, each flag meaning what it means to the engine.
    vLLM: --tp is one DP rank's TP, so the GPUs are DP x TP x PP. SGLang: --tp is every GPU of a stage and the
    attention TP is tp / dp (--enable-dp-attention), so the GPUs are TP x PP. --gpus, when given, must be that
    count (independent replicas are a layout without --dp). --enable-expert-parallel (SGLang's --enable-ep-moe)
    places the experts on every GPU of a stage, EP = DP x attention TP."""
    if not engine.data_parallel:
        flag = "--dp" if dp is not None else "--ep" if ep is not None else "--enable-expert-parallel"
        raise KvplanError(engines.no_data_parallel(engine.label, flag))
    pp, dp = pp or 1, dp or 1
    if engine.tp_spans_dp:
        stage = tp or (gpus // pp if gpus else dp)
        if stage % dp:
            raise KvplanError(f"--dp {dp} does not divide --tp {stage}: SGLang's --tp counts every GPU of a stage and "
                              f"its attention TP is tp / dp (--tp {dp} --dp {dp} is attention TP 1)")
        attention_tp, count = stage // dp, "TP x PP"
    else:
        if tp is None and gpus and gpus % (dp * pp):
            raise KvplanError(f"--gpus {gpus} is not a multiple of DP x PP = {dp} x {pp}")
        attention_tp = tp or (gpus // (dp * pp) if gpus else 1)
        stage, count = dp * attention_tp, "DP x TP x PP"
    if gpus and gpus != stage * pp:
        raise KvplanError(f"--gpus {gpus} is not {engine.label}'s {count} = {stage * pp}: with --dp, --ep or "
                          "--enable-expert-parallel the GPUs are one data-parallel deployment")
    if expert_parallel and ep not in (None, stage):
        raise KvplanError(f"--enable-expert-parallel spreads the experts over all {stage} GPUs of a stage, but --ep "
                          f"is {ep}: give one of them")
    ep = stage if expert_parallel else ep or 1
    return Parallelism(tp=attention_tp, pp=pp, dp=dp, ep=ep)


# ------------------------------------------------------------------------------------------------- searches


UNBOUNDED_USERS = 2**40  # a count no GPU serves; fitting this many means the pool does not grow with users


def max_users(pool: KVPool, budget: int, ctx: int, prefix: int = 0, steady: bool = False) -> int:
    """The largest N with pool.peak_bytes(N, ctx) <= budget (0 if not even one fits); `steady`: counting what
    the users hold in steady decode rather than what the engine reserves to admit them. The pool's own count
    where it has one (`KVPool.users_within`: vLLM's blocks are linear in users), else `search_users`."""
    exact = pool.users_within(budget, ctx, prefix, steady)
    return exact if exact is not None else search_users(pool, budget, ctx, prefix, steady)


def search_users(pool: KVPool, budget: int, ctx: int, prefix: int = 0, steady: bool = False) -> int:
    """`max_users` by search, for any pool whose peak grows with N. It starts at budget // peak_bytes(1), where
    pools linear in N (most) already have the answer, and gallops from there to a bracket, peak_bytes(low) <=
    budget < peak_bytes(high), before bisecting it."""
    def peak(users: int) -> int:
        return pool.peak_bytes(users, ctx, prefix, steady)

    one = peak(1)
    if one > budget:
        return 0
    if peak(UNBOUNDED_USERS) <= budget:  # users cost nothing: the search would not end
        raise KvplanError(f"at {ctx:,} tokens users need no KV memory of their own, so there is no user limit")
    guess = max(1, budget // one) if one > 0 else 1
    if peak(guess) <= budget:
        low, step = guess, 1
        while peak(low + step) <= budget:
            low, step = low + step, step * 2
        high = low + step
    else:
        high, step = guess, 1
        while high - step > 1 and peak(high - step) > budget:
            high, step = high - step, step * 2
        low = max(1, high - step)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if peak(mid) <= budget else (low, mid)
    return low


def max_ctx(pool: KVPool, budget: int, users: int, limit: int, prefix: int = 0) -> int:
    """The largest ctx in [max(1, prefix), limit] at which `users` are served (0 if none): the engine starts
    with max_model_len ctx (one request's reservation fits) and the users' steady-decode hold fits. The pool's own
    count decides where it has one (SGLang's Mamba split serves fewer users just past a budget that adds a slot)."""
    def serves(count: int, ctx: int, steady: bool = False) -> bool:
        counted = pool.users_within(budget, ctx, prefix, steady)
        return counted >= count if counted is not None else pool.peak_bytes(count, ctx, prefix, steady) <= budget

    def fits(ctx: int) -> bool:
        return serves(1, ctx) and serves(users, ctx, True)

    if _capped(pool, users, budget) < users:
        return 0
    low = max(1, prefix)
    if not fits(low):
        return 0
    high = limit + 1
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low


# ------------------------------------------------------------------------------------------------- capacity


def check_workload(engine: Engine, workload: Workload) -> None:
    if workload.users is not None and workload.users < 1:
        raise KvplanError(f"--users must be at least 1, got {workload.users}")
    if workload.avg_ctx is not None and workload.avg_ctx > workload.ctx:
        raise KvplanError(f"--avg-ctx {workload.avg_ctx:,} exceeds --ctx {workload.ctx:,}, the longest a "
                          "user gets")
    if not 0 <= workload.shared_prefix < min(workload.ctx, workload.avg_ctx or workload.ctx):
        raise KvplanError(f"--shared-prefix {workload.shared_prefix:,} must be shorter than the context: each "
                          "user holds tokens of its own (at least what it generates)")
    if not engine.paged and (workload.avg_ctx or workload.shared_prefix):
        raise KvplanError("--avg-ctx and --shared-prefix need a paged engine (vllm, sglang, tensorrt-llm, "
                          f"ideal): {engine.label} reserves every sequence's full context up front")
    problem = engine.prefix_sharing_problem() if workload.shared_prefix else None
    if problem:
        raise KvplanError(f"--shared-prefix {workload.shared_prefix:,}: {problem}")


def engine_dtypes(model: ModelSpec, engine_name: str = "vllm", kv_dtype_name: str | None = None,
                  weights_dtype_name: str | None = None) -> tuple[str, str | None]:
    """The KV dtype and the weights dtype override `capacity` runs `model` with under an engine: those given,
    else the engine's defaults (llama.cpp's fp16 cache; fp32 checkpoints loaded in bf16)."""
    engine = engines.engine(engine_name, EngineOptions())
    kv = kv_dtype(kv_dtype_name or engine.default_kv_dtype(model))
    engine.check_kv_dtype(kv)
    return kv.name, weights_dtype_name or engine.default_weights_dtype(model)


# ------------------------------------------------------------------------------ speculative decoding and LoRA


DRAFTED = ("draft_model", "eagle", "eagle3")  # the methods whose draft is --draft-model


@dataclass
class DraftAndAdapters:
    """What a speculative decoder and LoRA adapters add to each GPU of a deployment: the draft's weights and its
    layers' caches (`draft_layers`, as `gpu_layers` gives them), the LoRA slots."""

    method: str | None = None
    tokens: int | None = None
    draft: ModelSpec | None = None  # the draft model, or the MTP layers as one
    draft_name: str | None = None
    draft_weights_per_gpu: int = 0
    draft_layers: list = field(default_factory=list)
    lora: LoraSlots | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def gpu_bytes(self) -> int:
        return self.draft_weights_per_gpu + (self.lora.gpu_bytes if self.lora else 0)


def speculation_options(model: ModelSpec, draft: ModelSpec | None, engine_name: str, options: EngineOptions,
                        parallel: Parallelism) -> EngineOptions:
    """The engine options with the speculative method and its draft tokens K resolved as vLLM's
    `SpeculativeConfig` resolves them: a --draft-model means method draft_model unless eagle or eagle3 is given
    (its EAGLE head); mtp runs the checkpoint's own MTP layers and K defaults to their count (n_predict), which a
    larger K must be a multiple of; the others need K. Under llama.cpp --speculative-tokens stays its own setting
    (recurrent rollback rows)."""
    method, tokens = options.speculative_method, options.speculative_tokens
    engine_class = engines.engine_class(engine_name)
    if model.eagle is not None:
        raise KvplanError(f"{model.name} is an EAGLE draft head ({model.eagle.architecture}), not a model to serve: "
                          "give it as --draft-model with --speculative-method eagle or eagle3")
    if draft is not None and engine_class.draft_models:  # llama-server -md: --speculative-tokens is its own
        return llama_cpp_draft(model, draft, parallel, options)
    if draft is not None:
        if not engine_class.speculative_methods:
            raise KvplanError(f"kvplan does not size {engine_class.label}'s speculative-decoding drafts: "
                              "--draft-model is for --engine vllm, sglang or llama.cpp")
        if method not in (None, *DRAFTED):
            raise KvplanError(f"--draft-model is the draft of --speculative-method draft_model, eagle or eagle3, not "
                              f"{method}")
        method = method or "draft_model"
        if draft.eagle is not None and method == "draft_model":
            raise KvplanError(f"--draft-model {draft.name} is an EAGLE draft head ({draft.eagle.architecture}): give "
                              "--speculative-method eagle or eagle3")
    if not engine_class.speculative_methods:  # llama.cpp's --speculative-tokens is its own; the engine refuses the rest
        return options
    if method is None:
        if tokens is not None:
            raise KvplanError(f"--speculative-tokens: {engine_class.label} speculates with a draft: give --draft-model "
                              "or --speculative-method mtp or ngram")
        return options
    if method in DRAFTED and draft is None:
        raise KvplanError(f"--speculative-method {method} needs --draft-model"
                          + (", the EAGLE head's config" if method != "draft_model" else ""))
    if parallel.pp > 1:
        raise KvplanError("kvplan sizes speculative decoding on one pipeline stage: give --pp 1")
    if method == "mtp":
        from kvplan.sources.hf_config.mtp import MTP_FAMILIES

        if model.mtp is None:
            raise KvplanError(f"--speculative-method mtp: kvplan reads no MTP layers in {model.name} (it reads those "
                              f"of {MTP_FAMILIES} checkpoints that state them)")
        layers = model.mtp.layers
        if tokens is None and engine_name == "vllm":
            tokens = layers  # SpeculativeConfig: "Default to max value defined in draft model config"
        if tokens is not None and tokens > layers and tokens % layers:
            raise KvplanError(f"--speculative-tokens {tokens} must be a multiple of the {layers} MTP layers "
                              "(vLLM: num_speculative_tokens must be divisible by n_predict)")
    if not tokens:
        raise KvplanError(f"--speculative-method {method} needs --speculative-tokens, the draft tokens per step "
                          "(vLLM num_speculative_tokens, SGLang --speculative-num-draft-tokens), at least 1")
    if method == "draft_model" and draft.vocab_size != model.vocab_size:
        sizes = (f"{model.vocab_size:,} and {draft.vocab_size:,}" if draft.vocab_size and model.vocab_size
                 else "one of them unknown")
        raise KvplanError(f"--draft-model {draft.name}: target and draft model should have the same vocabulary size "
                          f"({sizes}), as vLLM's SpeculativeConfig requires")
    return options.model_copy(update={"speculative_method": method, "speculative_tokens": tokens})


def llama_cpp_draft(model: ModelSpec, draft: ModelSpec, parallel: Parallelism,
                    options: EngineOptions) -> EngineOptions:
    """llama-server's -md draft model: one that shares the model's vocabulary (the draft-simple speculator refuses
    vocabularies whose sizes differ by more than 128, `common_speculative_are_compatible`) on one GPU; its
    tokens a step are --spec-draft-n-max (--speculative-tokens, default 3)."""
    if draft.eagle is not None:
        raise KvplanError(f"--draft-model {draft.name} is an EAGLE head: kvplan sizes llama.cpp's draft models (-md), "
                          "not its EAGLE3 drafts")
    if parallel.pp > 1:
        raise KvplanError("kvplan sizes llama.cpp's draft context on one GPU: give --pp 1 (--gpus 1)")
    if not (model.vocab_size and draft.vocab_size):
        raise KvplanError(f"--draft-model {draft.name}: kvplan needs both vocabulary sizes to check that llama.cpp "
                          "takes the draft")
    if abs(model.vocab_size - draft.vocab_size) > engines.LLAMA_CPP_VOCAB_DIFFERENCE:
        raise KvplanError(f"llama.cpp: the target and draft vocabs are not compatible ({model.vocab_size:,} and "
                          f"{draft.vocab_size:,} tokens: they may differ by {engines.LLAMA_CPP_VOCAB_DIFFERENCE} at "
                          "most)")
    return options


def draft_and_adapters(model: ModelSpec, draft: ModelSpec | None, engine: Engine, parallel: Parallelism,
                       weights_dtype_name: str | None) -> DraftAndAdapters:
    """The draft's weights and layers on each GPU, and the LoRA slots.

    The draft shards like the model: vLLM's draft_tensor_parallel_size defaults to the model's TP and takes no
    other value but 1, which its draft-model proposer refuses beside a larger TP ("must be the same",
    v1/spec_decode/draft_model.py), while EAGLE and MTP heads are built on the model's TP group. A draft model
    loads in the model's dtype (`SpeculativeConfig`: dtype=target_model_config.dtype), unquantised unless its own
    checkpoint is; MTP layers follow the model's quantisation, --weights-dtype included ("Align the quantization
    of draft model"). An EAGLE head is built by the engine around its layers, in the model's dtype, parts of it
    whole on every GPU (`Engine.eagle_head`)."""
    extras = DraftAndAdapters(lora=engine.lora_slots(model))
    method, tokens = engine.options.speculative_method, engine.options.speculative_tokens
    if draft is not None and engine.draft_models:
        method, tokens = "draft_model", tokens or engines.LLAMA_CPP_DRAFT_MAX
    if method is None:
        return extras
    extras.method, extras.tokens = method, tokens
    if method == "ngram":
        extras.draft_name = "n-gram lookup (no draft weights or cache)"
        return extras
    if method == "mtp":
        mtp = model.mtp
        runner = model.model_copy(update={
            "name": f"{model.name} MTP", "num_layers": mtp.layers, "params": mtp.params, "checkpoint": None,
            "caches": tuple(c.model_copy(update={"layer": c.layer - model.num_layers}) for c in mtp.caches),
            "mtp": None})
        extras.draft_name = f"{model.name}'s {mtp.layers} MTP layer{'s' if mtp.layers > 1 else ''}"
        draft_dtype = weights_dtype_name
        counted = weights_from_checkpoint(model, weights_dtype_name)
        if counted:
            extras.notes.append("the checkpoint's tensors, counted in the weights, hold the MTP layers")
    else:
        runner, counted = draft, False
        engine.check_caches(draft)
        compute = engine.default_weights_dtype(model) or model.dtype
        # llama.cpp loads the draft's GGUF as it is; vLLM and SGLang a draft in the model's dtype, unless quantised
        keep = engine.draft_models or draft.quantization or draft.dtype == compute
        draft_dtype = None if keep else compute
        extras.draft_name = draft.name
    try:
        check_parallel(runner, parallel.tp, 1)
    except KvplanError as err:
        raise KvplanError(f"the draft {runner.name}: {err}") from None
    extras.draft = runner
    if method in ("eagle", "eagle3"):  # the engine builds the head around its layers, some parts whole on every GPU
        head = engine.eagle_head(model, draft, method)
        extras.draft_weights_per_gpu = weight_dtype(compute).bytes_for(head.elements) + 8 * head.int64
        extras.notes += head.notes
    elif not counted:  # split as the engine splits the model's own groups: norms and routers whole on each GPU
        extras.draft_weights_per_gpu = weights_on_gpu(runner, engine, draft_dtype)[1]
    extras.draft_layers = gpu_layers(engine.cached_layers(runner), [runner.num_layers], parallel.tp)[0]
    return extras


class LayoutSplit(NamedTuple):
    """What a deployment derives from the model and its parallel layout alone, whatever the GPU: each pipeline
    stage's per-GPU caches (`gpu_layers`) and the weights on the fullest GPU before any offload (`weights_on_gpu`).
    `users_sweep` builds it once per layout and hands it to the deployments of every GPU set of that layout."""

    stages: list
    weights: tuple[str, int, int]


@dataclass
class _Deployment:
    """What one deployment builds before any search: the engine, the dtypes, the KV budget and its terms, and
    each pipeline stage's KV pool (`split.stages`: the per-GPU layer split the pools were built from)."""

    engine: Engine
    kv: DType
    weights_label: str
    weights_dtype_name: str | None
    weights_per_gpu: int
    experts_per_gpu: int
    fraction: float | None
    overhead_bytes: int | None
    breakdown: dict[str, int] | None
    budget: int
    split: LayoutSplit
    pools: list[KVPool]
    notes: list[str]
    extras: ServingExtras
    offloaded: int
    added: DraftAndAdapters = field(default_factory=DraftAndAdapters)
    target_pools: list[KVPool] | None = None  # the pools without the draft's layers, where a draft adds some


def _deploy(model: ModelSpec, workloads: Sequence[Workload], engine_name: str, options: EngineOptions,
            hardware: Hardware, parallel: Parallelism, kv_dtype_name: str | None,
            weights_dtype_name: str | None, kv_budget: int | None, overhead: int | None,
            split: LayoutSplit | None = None, draft: ModelSpec | None = None) -> _Deployment:
    # A split given is that of a layout whose first deployment, under the same engine, has checked the model.
    if split is None:
        check_parallel(model, parallel.tp, parallel.pp, parallel.from_gpus, parallel.dp)
    options = speculation_options(model, draft, engine_name, options, parallel)
    engine = engines.engine(engine_name, options, hardware.name, hardware.memory_bytes, parallel.tp,
                            parallel.pp, parallel.dp, parallel.ep)
    if split is None:
        engine.check_caches(model)
        problem = engine.parallel_problem(model, parallel.tp, parallel.dp, parallel.ep)
        if problem:
            raise KvplanError(problem)
    for workload in workloads:
        check_workload(engine, workload)
    if kv_budget is not None and (options.memory_fraction is not None or overhead is not None):
        raise KvplanError("--kv-budget is the KV memory itself: it cannot be combined with "
                          "--gpu-memory-utilization or --overhead")
    kv = kv_dtype(kv_dtype_name or engine.default_kv_dtype(model))
    engine.check_kv_dtype(kv)
    engine.check_model_kv(model, kv)
    notes = []
    if weights_dtype_name is None and engine.default_weights_dtype(model):
        weights_dtype_name = engine.default_weights_dtype(model)
        notes.append(f"fp32 checkpoint: {engine.label} loads it in {weights_dtype_name}")
    extras = engine.serving_extras(model, vision_bytes(model, weights_dtype_name), max(w.ctx for w in workloads))
    notes += extras.notes
    if split is None:
        split = LayoutSplit(gpu_layers(engine.cached_layers(model), engine.stage_sizes(model.num_layers), parallel.tp),
                            weights_on_gpu(model, engine, weights_dtype_name, extras.tower_not_loaded))
    weights_label, weights_per_gpu, experts_per_gpu = split.weights
    offloaded = engine.weights_offloaded(weights_per_gpu)
    weights_per_gpu -= offloaded
    added = draft_and_adapters(model, draft, engine, parallel, weights_dtype_name)
    fraction = overhead_bytes = breakdown = None
    if kv_budget is not None:
        budget = kv_budget
    else:
        if hardware.memory_bytes is None:
            raise KvplanError("capacity needs a GPU: give --gpu, --vram or --kv-budget")
        fraction = engine.memory_fraction()
        if not 0 < fraction <= 1:
            if options.memory_fraction is not None:
                raise KvplanError(f"{engine.fraction_flag} must be in (0, 1], got {fraction}")
            raise KvplanError(f"{engine.label}'s default {engine.fraction_flag} for a GPU of "
                              f"{hardware.memory_bytes / 2**30:,.2f} GiB is {fraction}: it reserves more than the GPU "
                              "has; give a GPU with more memory or set the fraction yourself")
        breakdown = {"given": overhead} if overhead is not None else engine.overhead().model_dump() | extras.overhead
        overhead_bytes = sum(breakdown.values())
        budget = engine.kv_budget(hardware.memory_bytes, fraction, weights_per_gpu + added.gpu_bytes,
                                  overhead_bytes)
    pools = [engine.pool(layers, model, kv) for layers in split.stages]
    target_pools = None
    if added.method:  # one stage: speculation_options refuses PP
        target_pools = pools
        pools = [engine.speculative_pool(split.stages[0], added.draft_layers, added.draft, model, kv)]
    return _Deployment(engine, kv, weights_label, weights_dtype_name, weights_per_gpu, experts_per_gpu, fraction,
                       overhead_bytes, breakdown, budget, split, pools, [*notes, *added.notes], extras, offloaded,
                       added, target_pools)


def weights_on_gpu(model: ModelSpec, engine: Engine, dtype_name: str | None,
                   tower_not_loaded: int = 0) -> tuple[str, int, int]:
    """(dtype label, weights on the fullest GPU, of which routed experts), in bytes:
        ceil(scale x sum over groups of bytes x the engine's share for the group)
    scale = the checkpoint's exact bytes / the config's where its safetensors headers were read (its tensors are not
    grouped), else 1. With every share 1 / (tp x pp) this is ceil(weights / (tp x pp)). `tower_not_loaded`: the
    vision tower's bytes the engine leaves out (text-only serving), taken from its group."""
    groups, label = weights_by_group(model, dtype_name)
    config = sum(groups.values())
    total = checkpoint_bytes(model.checkpoint) if weights_from_checkpoint(model, dtype_name) else config
    config = config or 1
    groups["vision"] -= min(groups["vision"], tower_not_loaded)
    shares = engine.weight_shares(model)
    # Exact in whole numbers: with the shares over their common denominator the sum is held / common (a Fraction
    # operation per group cost a planning table's sweep more than the rest of a deployment).
    common = math.lcm(*(share.denominator for share in shares.values()))
    held = sum(size * shares[group].numerator * (common // shares[group].denominator)
               for group, size in groups.items())
    experts = shares["experts"]
    return (label, cdiv(total * held, config * common),
            cdiv(total * groups["experts"] * experts.numerator, config * experts.denominator))


class UsersServed(NamedTuple):
    """Users at ctx on every stage, times the ranks (DP ranks x replicas): in steady decode (the headline) and as
    the start-up reservation admits them; `binding` is the stage that binds the headline."""

    steady: int
    at_startup: int
    binding: KVPool


def _check_users_cost(model: ModelSpec, pools: list[KVPool], ctx: int) -> None:
    """Refuses a model whose users cost no memory at ctx: nothing would bound their number. A user's cost grows
    with ctx, so a pool that passes at one ctx passes at every longer one."""
    if all(p.peak_bytes(1, ctx) == p.peak_bytes(0, ctx) for p in pools):
        raise KvplanError(f"{model.name} keeps no per-sequence cache: memory does not bound its concurrency")


def _users_at(pools: list[KVPool], budget: int, ctx: int, prefix: int, ranks: int) -> UsersServed:
    """A user costs its cache and, where the engine's activations grow with the batch (transformers), its share
    of them (`_check_users_cost` has refused pools where a user costs nothing). Over the stages, the fewest users;
    the binding stage is the first with the fewest in steady decode. The steady figure is 0 where not one request
    passes the start-up check, and never below the start-up figure (what the engine admits it holds)."""
    at_startup, steady, binding = None, None, pools[0]
    for pool in pools:  # a loop, not comprehensions: a planning table counts every cell
        admitted, held = _stage_users(pool, budget, ctx, prefix)
        at_startup = admitted if at_startup is None else min(at_startup, admitted)
        if steady is None or held < steady:
            steady, binding = held, pool
    if not at_startup:
        return UsersServed(0, 0, pools[0])
    return UsersServed(max(steady, at_startup) * ranks, at_startup * ranks, binding)


def _stage_users(pool: KVPool, budget: int, ctx: int, prefix: int) -> tuple[int, int]:
    """One stage's users, as its start-up check admits them and as they fit in steady decode, each at most its
    sequence limit; in steady decode as at start-up where the pool frees nothing as sequences decode."""
    admitted = _capped(pool, max_users(pool, budget, ctx, prefix), budget)
    if not (admitted and pool.frees_in_decode):
        return admitted, admitted
    return admitted, _capped(pool, max_users(pool, budget, ctx, prefix, steady=True), budget)


def _capped(pool: KVPool, users: int, budget: int) -> int:
    """Users one engine instance serves: those that fit, at most its sequence limit for this budget."""
    limit = pool.sequence_limit(budget)
    return users if limit is None else min(users, limit)


def capacity(model: ModelSpec, workload: Workload, *, engine_name: str = "vllm",
             options: EngineOptions | None = None, hardware: Hardware | None = None,
             parallel: Parallelism | None = None, kv_dtype_name: str | None = None,
             weights_dtype_name: str | None = None, kv_budget: int | None = None,
             overhead: int | None = None, suggest: bool = True, draft: ModelSpec | None = None) -> Capacity:
    """Capacity of `parallel.gpus` GPUs serving `model` under one engine, for the workload; `draft`: the draft
    model of speculative decoding (`draft_and_adapters`)."""
    options, hardware = options or EngineOptions(), hardware or Hardware()
    parallel = parallel or Parallelism()
    d = _deploy(model, [workload], engine_name, options, hardware, parallel, kv_dtype_name,
                weights_dtype_name, kv_budget, overhead, draft=draft)
    engine, pools, budget = d.engine, d.pools, d.budget
    notes = list(dict.fromkeys([*d.notes, *(note for p in pools for note in p.notes)]))
    ctx, prefix = workload.ctx, workload.shared_prefix
    _check_users_cost(model, pools, ctx)
    served = _users_at(pools, budget, ctx, prefix, parallel.ranks)
    users, binding = served.steady, served.binding
    notes += [note for note in binding.budget_notes(budget, ctx) if note not in notes]
    running = binding.sequence_limit(budget)
    if running and users == running * parallel.ranks and max_users(binding, budget, ctx, prefix, True) > running:
        reason = engine.sequence_limit_reason.format(limit=running)
        notes.append(f"{engine.label} runs at most {running:,} requests at once per instance ({reason}): the KV "
                     "cache would hold more")
    keys, values = engine.cache_types(d.kv)
    need = math.ceil(workload.target / parallel.ranks)
    limit = model.max_context or SEARCH_LIMIT
    longest = min(max_ctx(p, budget, need, limit, prefix) for p in pools) if workload.users else None
    at_avg = None
    if workload.avg_ctx:
        at_avg = min(_capped(p, max_users(p, budget, workload.avg_ctx, prefix, steady=True), budget)
                     for p in pools) * parallel.ranks
    result = Capacity(
        engine=engine.name, engine_version=engine.version, engine_version_given=engine.version_given,
        engine_assumptions=engine.assumptions(), gpu=hardware.name, gpu_memory_bytes=hardware.memory_bytes,
        gpus=parallel.gpus, tensor_parallel_size=parallel.tp, pipeline_parallel_size=parallel.pp,
        data_parallel_size=parallel.dp, expert_parallel_size=parallel.ep,
        data_parallel_replicas=parallel.replicas, ctx=ctx, kv_dtype=keys.name,
        v_dtype=values.name if values != keys else None,
        weights_dtype=d.weights_label, weights_dtype_override=d.weights_dtype_name,
        memory_fraction=d.fraction, weights_bytes_per_gpu=d.weights_per_gpu,
        weights_bytes_per_gpu_experts=d.experts_per_gpu, overhead_bytes=d.overhead_bytes, overhead=d.breakdown,
        kv_budget_bytes=budget, kv_budget_given=kv_budget is not None,
        engine_kv_bytes_per_sequence=binding.bytes_per_sequence(ctx), users=workload.target,
        engine_kv_bytes_per_sequence_decode=binding.bytes_per_sequence_decode(ctx),
        engine_kv_bytes_in_flight=(binding.steady_bytes_for(1, ctx) - binding.steady_bytes_for(0, ctx)
                                   - binding.bytes_per_sequence_decode(ctx)),
        engine_kv_bytes_fixed=binding.bytes_for(0, ctx),
        engine_kv_bytes_for_users=max(p.steady_bytes_for(need, ctx, prefix) for p in pools),
        engine_activation_bytes_for_users=max(p.activation_bytes(need, ctx) for p in pools),
        engine_activation_bytes_per_sequence=binding.activation_bytes(1, ctx),
        engine_gpu_bytes_for_users=binding.gpu_bytes_for(need, ctx),
        max_concurrent_users=users, max_users_at_startup=served.at_startup, sequence_limit=running,
        max_users_per_rank=users // parallel.ranks, max_ctx_for_users=longest,
        avg_ctx=workload.avg_ctx, max_users_at_avg_ctx=at_avg, shared_prefix=prefix, fits=users >= workload.target,
        reasons=[], suggestions=[], notes=notes,
        **(_vllm_numbers(binding, budget, ctx) if isinstance(binding, VllmPool) else {}),
        **_host_memory(d, parallel, binding),
        **_draft_and_adapter_numbers(d, binding, ctx),
    )
    if result.fits:
        return result
    update = {"reasons": [_reason(result)]}
    if suggest:
        settings = dict(engine_name=engine_name, options=options, hardware=hardware, kv_budget=kv_budget,
                        overhead=overhead, draft=draft)
        update["suggestions"] = _suggestions(model, workload, result, engine, parallel, kv_dtype_name,
                                             d.weights_dtype_name, settings)
    return result.model_copy(update=update)


class UsersAt(NamedTuple):
    """One cell of a planning table: what `capacity` reports as max_concurrent_users and
    engine_kv_bytes_per_sequence at ctx, with the KV budget per GPU (None, in a table, for a model that keeps no
    per-sequence cache: `users_sweep` does not plan one)."""

    max_users: int | None
    engine_kv_bytes_per_sequence: int | None
    kv_budget_bytes: int | None


def users_sweep(model: ModelSpec, ctxs: Sequence[int], hardwares: Sequence[tuple[Hardware, Parallelism]], *,
                engine_name: str = "vllm", options: EngineOptions | None = None,
                kv_dtype_name: str | None = None, weights_dtype_name: str | None = None,
                overhead: int | None = None) -> list[list[UsersAt]]:
    """For each GPU set x ctx, the users `capacity` finds (the same budget, pools and search), without the rest of
    its report: `kvplan table`'s sweep. The model's split (`LayoutSplit`) is built and checked once for each
    parallel layout; each deployment is sized for the longest context; users fall as the context grows, so past
    the shortest context at which none fits, none is counted."""
    options = options or EngineOptions()
    longest = [Workload(ctx=max(ctxs))]  # the workloads differ in ctx alone: a deployment is sized for the longest
    splits: dict[Parallelism, LayoutSplit] = {}
    out = []
    for hardware, parallel in hardwares:
        d = _deploy(model, longest, engine_name, options, hardware, parallel, kv_dtype_name,
                    weights_dtype_name, None, overhead, splits.get(parallel))
        splits[parallel] = d.split
        _check_users_cost(model, d.pools, min(ctxs))
        none_from = None  # the shortest ctx at which not one user fits: none fits at any longer one either
        row = []
        for ctx in ctxs:
            if none_from is not None and ctx >= none_from:
                served = UsersServed(0, 0, d.pools[0])  # as `_users_at` gives it
            else:
                served = _users_at(d.pools, d.budget, ctx, 0, parallel.ranks)
                if not served.steady:
                    none_from = ctx
            row.append(UsersAt(served.steady, served.binding.bytes_per_sequence(ctx), d.budget))
        out.append(row)
    return out


def _vllm_numbers(pool: VllmPool, budget: int, ctx: int) -> dict:
    log = pool.log(budget, ctx)
    return {"vllm_num_blocks": log.num_blocks, "vllm_kv_cache_tokens": log.kv_cache_tokens,
            "vllm_max_concurrency": log.max_concurrency, "vllm_log": log.lines,
            "vllm_block_bytes": pool.block_bytes, "vllm_blocks_per_sequence": pool.blocks_per_request(ctx),
            "vllm_kv_bytes_per_sequence_decode": pool.bytes_per_sequence_decode(ctx)}


def _host_memory(d: _Deployment, parallel: Parallelism, pool: KVPool) -> dict:
    """Host memory the deployment pins: each GPU's offloaded weights (--cpu-offload-gb) on every GPU, and each
    engine instance's KV offloading buffer (--kv-offloading-size, already summed over its TP x PP workers) once per
    data-parallel replica; the native connector's blocks and, for one KV-cache group, the prefix tokens they hold."""
    kv = d.extras.kv_offload_bytes
    out = {"weights_not_loaded_bytes": d.extras.tower_not_loaded, "weights_offloaded_bytes_per_gpu": d.offloaded,
           "kv_offload_bytes": kv, "host_memory_bytes": d.offloaded * parallel.gpus + kv * parallel.replicas}
    if kv and isinstance(pool, VllmPool) and (d.engine.options.kv_offloading_backend or "native") == "native":
        blocks = d.engine.offload_blocks(pool.block_bytes)
        one_group = len(pool.groups) == 1 and pool.groups[0].groups == 1
        out |= {"vllm_kv_offload_blocks": blocks,
                "vllm_kv_offload_tokens": blocks * pool.groups[0].block_size if one_group else None}
    return out


def _draft_and_adapter_numbers(d: _Deployment, binding: KVPool, ctx: int) -> dict:
    """The Capacity fields of speculative decoding and LoRA: the draft's weights, what speculation adds to a
    user's KV (what the binding stage's pool reserves per user beyond the same stage's pool without it), the LoRA
    slots."""
    e, out = d.added, {}
    if e.method:
        out.update(speculative_method=e.method, speculative_tokens=e.tokens, draft_model=e.draft_name,
                   draft_weights_bytes_per_gpu=e.draft_weights_per_gpu)
        if d.target_pools:  # what the pool reserves per user beyond the same pool without speculation
            target = d.target_pools[d.pools.index(binding)]
            out["engine_kv_bytes_per_sequence_draft"] = (binding.bytes_per_sequence(ctx)
                                                         - target.bytes_per_sequence(ctx))
    if e.lora:
        out.update(lora_slots=e.lora.slots, lora_rank=e.lora.rank, lora_bytes_per_gpu=e.lora.gpu_bytes,
                   lora_host_bytes_per_gpu=e.lora.host_bytes)
    return out


def users_label(n: int) -> str:
    return f"{n:,} user" + ("" if n == 1 else "s")


def describe_layout(tp: int, pp: int, dp: int = 1, ep: int = 1, replicas: int = 1) -> str:
    """`TP 8 x PP 2 x 2 replicas`, `DP 8 x TP 1, EP 8`: the degrees that are not 1 (TP always)."""
    parts = [f"DP {dp}"] if dp > 1 else []
    parts.append(f"TP {tp}")
    if pp > 1:
        parts.append(f"PP {pp}")
    if replicas > 1:
        parts.append(f"{replicas} replicas")
    return " x ".join(parts) + (f", EP {ep}" if ep > 1 else "")


def layout_label(cap: Capacity) -> str:
    """`TP >= 2` for one tensor-parallel group, else the whole layout: `16 GPUs (TP 8 x PP 2)`."""
    if cap.gpus == cap.tensor_parallel_size:
        return f"TP >= {cap.tensor_parallel_size}"
    layout = describe_layout(cap.tensor_parallel_size, cap.pipeline_parallel_size, cap.data_parallel_size,
                             cap.expert_parallel_size, cap.data_parallel_replicas)
    return f"{cap.gpus} GPUs ({layout})"


def _gib(n: int) -> str:
    return f"{n / (1 << 30):,.2f} GiB"


def _reason(cap: Capacity) -> str:
    if cap.kv_budget_bytes <= 0 and not cap.kv_budget_given:
        usable = int(cap.gpu_memory_bytes * cap.memory_fraction)
        beside = "".join(f", {what} ({_gib(size)})" for what, size in (
            ("draft weights", cap.draft_weights_bytes_per_gpu), ("LoRA slots", cap.lora_bytes_per_gpu)) if size)
        return (f"weights ({_gib(cap.weights_bytes_per_gpu)} per GPU){beside} and overhead "
                f"({_gib(cap.overhead_bytes)}) leave no KV memory in the {_gib(usable)} the engine may use")
    activations = cap.engine_activation_bytes_per_sequence
    label = engines.engine_class(cap.engine).activations_label
    also = f" and {_gib(activations)} of {label}" if activations else ""
    if cap.max_concurrent_users == 0:
        # named where one sequence alone would fit: then what the pools hold whatever the users is why it does not
        alone = cap.engine_kv_bytes_per_sequence + activations <= cap.kv_budget_bytes
        fixed = (f" beside the {_gib(cap.engine_kv_bytes_fixed)} its pools hold whatever the users"
                 if cap.engine_kv_bytes_fixed and alone else "")
        return (f"one sequence of {cap.ctx:,} tokens needs {_gib(cap.engine_kv_bytes_per_sequence)} of KV "
                f"cache{also}{fixed}; the budget is {_gib(cap.kv_budget_bytes)}")
    verb = "fits" if cap.max_concurrent_users == 1 else "fit"
    if cap.sequence_limit and cap.users > cap.sequence_limit * cap.data_parallel_size * cap.data_parallel_replicas:
        limit, engine = cap.sequence_limit, engines.engine_class(cap.engine)
        return (f"one {engine.label} instance holds at most {users_label(limit)} "
                f"({engine.sequence_limit_reason.format(limit=limit)}); {cap.users:,} asked")
    each = f"{_gib(cap.engine_kv_bytes_per_sequence_decode)} each"
    if cap.engine_kv_bytes_in_flight:
        each += f" in steady decode, {_gib(cap.engine_kv_bytes_in_flight)} in flight"
    each += f", {_gib(activations)} {label}" if also else ""
    return f"{users_label(cap.max_concurrent_users)} {verb} at {cap.ctx:,} tokens ({each}); {cap.users:,} asked"



def _suggestions(model: ModelSpec, workload: Workload, cap: Capacity, engine: Engine, parallel: Parallelism,
                 kv_name: str | None, weights_name: str | None, settings: dict) -> list[str]:
    """What would make it fit: a smaller KV dtype, more GPUs, smaller weights, or a shorter context."""
    out = []
    kv = kv_dtype(cap.kv_dtype)
    smaller_kv = [d for d in kv_options(engine, model) if kv_dtype(d).bits < kv.bits]
    for name in smaller_kv[:1]:
        alt = capacity(model, workload, parallel=parallel, kv_dtype_name=name,
                       weights_dtype_name=weights_name, suggest=False, **settings)
        if alt.max_concurrent_users > cap.max_concurrent_users:
            out.append(f"{name} KV fits {users_label(alt.max_concurrent_users)}")
    if cap.kv_budget_bytes <= 0 and not cap.kv_budget_given:
        current = (weight_dtype(cap.weights_dtype).bits if cap.weights_dtype in WEIGHT_DTYPES  # GGUF: a mix of types
                   else 8 * weights_bytes(model)[0] / model.params.total)
        for name in ("fp8", "int4"):
            if weight_dtype(name).bits >= current:
                continue
            alt = capacity(model, workload, parallel=parallel, kv_dtype_name=kv_name, weights_dtype_name=name,
                           suggest=False, **settings)
            if alt.fits:
                out.append(f"{name} weights fit {users_label(alt.max_concurrent_users)}")
                break
    if not cap.kv_budget_given:
        more = minimum_gpus(model, workload, type(engine), kv_name, weights_name, settings, above=parallel.gpus)
        if more is not None:
            out.append(f"needs {layout_label(more)}: {more.gpus} x {cap.gpu or 'this GPU'} fit "
                       f"{users_label(more.max_concurrent_users)}")
    if workload.users and cap.max_ctx_for_users:
        verb = "fits" if workload.users == 1 else "fit"
        out.append(f"{users_label(workload.users)} {verb} at up to {cap.max_ctx_for_users:,} tokens each")
    return out


# ------------------------------------------------------------------------------------------------- planning


def kv_options(engine: Engine, model: ModelSpec) -> list[str]:
    """KV dtypes worth trying, the engine's default first: its 8-bit cache (and llama.cpp's q4_0), where the engine
    lets the model have it (llama.cpp: a quantised V cache needs flash attention)."""
    smaller = {"llama.cpp": ["q8_0", "q4_0"], "transformers": []}.get(engine.name, ["fp8"])
    options = [engine.default_kv_dtype(model), *(name for name in smaller if _offered(engine, model, name))]
    return list(dict.fromkeys(options))  # the default may be the 8-bit cache itself (vLLM's DeepSeek V4)


def _offered(engine: Engine, model: ModelSpec, name: str) -> bool:
    try:
        engine.check_model_kv(model, kv_dtype(name))
    except KvplanError:
        return False
    return True


def layouts(model: ModelSpec, gpus: int, engine: type[Engine]) -> list[Parallelism]:
    """Ways to use `gpus` GPUs: TP within a node (1, 2, 4, 8), PP stages, the rest as replicas; for a
    mixture-of-experts model under an engine with data-parallel attention, the rest also as DP ranks sharing the
    experts, placed whole on every GPU of a stage (expert parallelism) where the engine can, else sliced."""
    tps = [t for t in SPLIT_DEGREES if t <= gpus and (engine.splits_heads or t == 1) and t in valid_tp(model, 8)]
    out = []
    for tp in tps:
        for pp in SPLIT_DEGREES:
            if tp * pp > gpus or gpus % (tp * pp) or pp > model.num_layers or (
                    pp > 1 and not engine.splits_into_stages(model)):
                continue
            rest = gpus // (tp * pp)
            out.append(Parallelism(tp=tp, pp=pp, replicas=rest))
            if rest > 1 and engine.data_parallel and model.params.experts:
                ep = next(ep for ep in (tp * rest, 1) if not engine.parallel_problem(model, tp, rest, ep))
                out.append(Parallelism(tp=tp, pp=pp, dp=rest, ep=ep))
    return out


def best_layout(model: ModelSpec, workload: Workload, gpus: int, engine: type[Engine], kv_name: str | None,
                weights_name: str | None, settings: dict) -> Capacity | None:
    """Of the layouts of `gpus` GPUs that fit, the one with the fewest pipeline stages (TP keeps a node's GPUs
    in step; PP adds a stage of latency), then the most users, then the fewest DP ranks. A speculative decoder is
    sized on one stage."""
    options = settings.get("options")
    one_stage = settings.get("draft") is not None or (options is not None and options.speculative_method)
    fitting = [capacity(model, workload, parallel=layout, kv_dtype_name=kv_name,
                        weights_dtype_name=weights_name, suggest=False, **settings)
               for layout in layouts(model, gpus, engine) if layout.pp == 1 or not one_stage]
    fitting = [cap for cap in fitting if cap.fits]
    return min(fitting, key=lambda cap: (cap.pipeline_parallel_size, -cap.max_concurrent_users,
                                         cap.data_parallel_size), default=None)


def minimum_gpus(model: ModelSpec, workload: Workload, engine: type[Engine], kv_name: str | None,
                 weights_name: str | None, settings: dict, above: int = 0,
                 max_gpus: int = 64) -> Capacity | None:
    """The fewest GPUs (more than `above`) that fit the workload, in their best layout."""
    for gpus in GPU_COUNTS:
        if above < gpus <= max_gpus:
            best = best_layout(model, workload, gpus, engine, kv_name, weights_name, settings)
            if best is not None:
                return best
    return None


class PlanRow(BaseModel):
    model_config = ConfigDict(defer_build=True)

    gpus: int
    tensor_parallel_size: int
    pipeline_parallel_size: int
    data_parallel_size: int
    expert_parallel_size: int
    data_parallel_replicas: int
    kv_dtype: str
    weights_dtype: str
    weights_bytes_per_gpu: int
    kv_budget_bytes: int
    max_concurrent_users: int
    headroom_bytes: int
    headroom_fraction: float
    draft_weights_bytes_per_gpu: int = 0
    lora_bytes_per_gpu: int = 0


class Plan(BaseModel):
    model_config = ConfigDict(defer_build=True)

    model: str
    engine: str
    engine_version: str
    gpu: str | None
    gpu_memory_bytes: int
    ctx: int
    users: int
    rows: list[PlanRow]
    warnings: list[str]
    notes: list[str] = []


def plan(model: ModelSpec, workload: Workload, hardware: Hardware, *, engine_name: str = "vllm",
         options: EngineOptions | None = None, overhead: int | None = None, max_gpus: int = 64,
         draft: ModelSpec | None = None) -> Plan:
    """For each KV dtype x weights dtype worth trying, the fewest GPUs that serve workload.target users at
    ctx; ranked by GPUs, then precision (checkpoint weights and the engine's own KV dtype first), then
    headroom (KV budget left per GPU once the users are served)."""
    options = options or EngineOptions()
    engine = engines.engine(engine_name, options, hardware.name, hardware.memory_bytes)
    settings = dict(engine_name=engine_name, options=options, hardware=hardware, overhead=overhead, draft=draft)
    checkpoint = weights_bytes(model)[0]
    weights = [None, *(w for w in ("fp8", "int4") if weights_bytes(model, w)[0] < checkpoint)]
    rows = []
    for rank_w, weights_name in enumerate(weights):
        for rank_kv, kv_name in enumerate(kv_options(engine, model)):
            best = minimum_gpus(model, workload, type(engine), kv_name, weights_name, settings, max_gpus=max_gpus)
            if best is not None:
                rows.append(((best.gpus, rank_w, rank_kv, -best.headroom_bytes), PlanRow(
                    gpus=best.gpus, tensor_parallel_size=best.tensor_parallel_size,
                    pipeline_parallel_size=best.pipeline_parallel_size, data_parallel_size=best.data_parallel_size,
                    expert_parallel_size=best.expert_parallel_size,
                    data_parallel_replicas=best.data_parallel_replicas, kv_dtype=best.kv_dtype,
                    weights_dtype=best.weights_dtype, weights_bytes_per_gpu=best.weights_bytes_per_gpu,
                    kv_budget_bytes=best.kv_budget_bytes, max_concurrent_users=best.max_concurrent_users,
                    headroom_bytes=best.headroom_bytes,
                    headroom_fraction=best.headroom_bytes / best.kv_budget_bytes,
                    draft_weights_bytes_per_gpu=best.draft_weights_bytes_per_gpu,
                    lora_bytes_per_gpu=best.lora_bytes_per_gpu)))
    warnings = []
    if model.max_context and workload.ctx > model.max_context:
        warnings.append(f"ctx {workload.ctx:,} is beyond {model.name}'s max context of "
                        f"{model.max_context:,} tokens")
    notes = []
    if any(row.data_parallel_size > 1 for _, row in rows) and any(c.kind == "mla" for c in model.caches):
        notes.append(MLA_DATA_PARALLEL)
    return Plan(model=model.name, engine=engine.name, engine_version=engine.version, gpu=hardware.name,
                gpu_memory_bytes=hardware.memory_bytes, ctx=workload.ctx, users=workload.target,
                rows=[row for _, row in sorted(rows, key=lambda item: item[0])], warnings=warnings, notes=notes)


MLA_DATA_PARALLEL = ("DP attention holds more users of an MLA model: TP cannot split its latent (one row shared by "
                     "all heads), so every TP rank stores every user's latent, while each DP rank stores only its "
                     "own users'")
