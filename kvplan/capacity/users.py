"""The users a deployment serves: at the context asked, in steady decode and at start-up, on every pipeline stage
(`count`, whose report is `Capacity`), and a planning table's sweep of GPU sets x contexts (`users_sweep`)."""

import math
from collections.abc import Sequence
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from kvplan.capacity.deployment import Deployment, LayoutSplit, deploy
from kvplan.capacity.search import SEARCH_LIMIT, UNBOUNDED_USERS, capped, max_ctx, max_users
from kvplan.engines import EngineOptions, KVPool, VllmPool
from kvplan.errors import KvplanError
from kvplan.model import Hardware, ModelSpec, Parallelism, Workload


class Capacity(BaseModel):
    """One deployment's capacity. Sizes in bytes, per GPU unless named otherwise."""

    model_config = ConfigDict(defer_build=True)

    engine: str
    engine_version: str
    engine_version_given: bool
    engine_assumptions: list[str]
    gpu: str | None
    gpu_memory_bytes: int | None
    platform: str = Field("gpu", description="where the engine runs: gpu, or cpu (vLLM's CPU platform)")
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
    max_concurrent_users_bound: str = Field("memory", description="what bounds max_concurrent_users: memory, or "
                                            "sequence_limit (as many users as the engine runs at once)")
    max_ctx_for_users: int | None
    max_ctx_for_users_bound: str | None = Field(None, description="what bounds max_ctx_for_users: memory, "
                                                "max_context (the model's; memory would hold more), search_limit "
                                                "(a model stating no maximum), or sequence_limit (more users than "
                                                "the engine runs at once: 0)")
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


class UsersServed(NamedTuple):
    """Users at ctx on every stage, times the ranks (DP ranks x replicas): in steady decode (the headline) and as
    the start-up reservation admits them; `binding` is the stage that binds the headline, and `at_limit` whether
    its users are as many as its engine runs at once (its sequence limit), however much memory is left."""

    steady: int
    at_startup: int
    binding: KVPool
    at_limit: bool = False


def _bounding_pools(model: ModelSpec, pools: list[KVPool], ctx: int, budget: int) -> list[KVPool]:
    """The stages where enough users at ctx need more than the budget, which alone bound their number: a pipeline
    stage whose layers keep no cache of their own (no-op attention, KV-shared layers) holds any number of users in
    its fixed buffers (llama.cpp's compute buffer is as large for 8 users as for 2**40). Refuses a model none of
    whose stages does: nothing would bound its users. A user's cost grows with ctx, so a stage that bounds at one
    ctx bounds at every longer one."""
    bounding = [p for p in pools if p.peak_bytes(UNBOUNDED_USERS, ctx) > budget]
    if not bounding:
        raise KvplanError(f"{model.name} keeps no per-sequence cache: memory does not bound its concurrency")
    return bounding


def _users_at(pools: list[KVPool], budget: int, ctx: int, prefix: int, ranks: int) -> UsersServed:
    """A user costs its cache and, where the engine's activations grow with the batch (transformers), its share
    of them (`pools`: the stages where a user costs something, `_bounding_pools`). Over the stages, the fewest users;
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
    return UsersServed(max(steady, at_startup) * ranks, at_startup * ranks, binding,
                       steady == binding.sequence_limit(budget))


def _stage_users(pool: KVPool, budget: int, ctx: int, prefix: int) -> tuple[int, int]:
    """One stage's users, as its start-up check admits them and as they fit in steady decode, each at most its
    sequence limit; in steady decode as at start-up where the pool frees nothing as sequences decode."""
    admitted = capped(pool, max_users(pool, budget, ctx, prefix), budget)
    if not (admitted and pool.frees_in_decode):
        return admitted, admitted
    return admitted, capped(pool, max_users(pool, budget, ctx, prefix, steady=True), budget)


def count(model: ModelSpec, workload: Workload, *, engine_name: str = "vllm",
          options: EngineOptions | None = None, hardware: Hardware | None = None,
          parallel: Parallelism | None = None, kv_dtype_name: str | None = None,
          weights_dtype_name: str | None = None, kv_budget: int | None = None,
          overhead: int | None = None, draft: ModelSpec | None = None) -> Capacity:
    """The users `parallel.gpus` GPUs serve of `model` under one engine, for the workload, without the reasons and
    suggestions of a deployment that falls short (`kvplan.capacity.capacity` adds them); `draft`: the draft model
    of speculative decoding (`draft_and_adapters`)."""
    options, hardware = options or EngineOptions(), hardware or Hardware()
    parallel = parallel or Parallelism()
    d = deploy(model, [workload], engine_name, options, hardware, parallel, kv_dtype_name,
                weights_dtype_name, kv_budget, overhead, draft=draft)
    engine, pools, budget = d.engine, d.pools, d.budget
    notes = list(dict.fromkeys([*d.notes, *(note for p in pools for note in p.notes)]))
    ctx, prefix = workload.ctx, workload.shared_prefix
    bounding = _bounding_pools(model, pools, ctx, budget)
    served = _users_at(bounding, budget, ctx, prefix, parallel.ranks)
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
    longest = longest_bound = None
    if workload.users:
        longest = min(max_ctx(p, budget, need, limit, prefix) for p in bounding)
        longest_bound = _ctx_bound(longest, limit, model.max_context,
                                   any(capped(p, need, budget) < need for p in bounding))
    at_avg = None
    if workload.avg_ctx:
        at_avg = min(capped(p, max_users(p, budget, workload.avg_ctx, prefix, steady=True), budget)
                     for p in bounding) * parallel.ranks
    return Capacity(
        engine=engine.name, engine_version=engine.version, engine_version_given=engine.version_given,
        engine_assumptions=engine.assumptions(uses_fraction=d.fraction is not None), gpu=hardware.name,
        gpu_memory_bytes=hardware.memory_bytes, platform=engine.options.platform or "gpu",
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
        engine_kv_bytes_fixed=binding.bytes_for(0, ctx),
        engine_kv_bytes_for_users=max(p.steady_bytes_for(need, ctx, prefix) for p in pools),
        engine_activation_bytes_for_users=max(p.activation_bytes(need, ctx) for p in pools),
        engine_activation_bytes_per_sequence=binding.activation_bytes(1, ctx),
        engine_gpu_bytes_for_users=binding.gpu_bytes_for(need, ctx),
        max_concurrent_users=users, max_users_at_startup=served.at_startup, sequence_limit=running,
        max_users_per_rank=users // parallel.ranks, max_ctx_for_users=longest, max_ctx_for_users_bound=longest_bound,
        max_concurrent_users_bound="sequence_limit" if served.at_limit else "memory",
        avg_ctx=workload.avg_ctx, max_users_at_avg_ctx=at_avg, shared_prefix=prefix, fits=users >= workload.target,
        reasons=[], suggestions=[], notes=notes,
        **(_vllm_numbers(binding, budget, ctx) if isinstance(binding, VllmPool) else {}),
        **_host_memory(d, parallel, binding),
        **_draft_and_adapter_numbers(d, binding, ctx),
    )


def _ctx_bound(longest: int, limit: int, max_context: int | None, over_sequence_limit: bool) -> str:
    """What bounds the longest context for N users (`max_ctx` searched up to `limit`)."""
    if longest == 0 and over_sequence_limit:
        return "sequence_limit"
    if longest == limit:
        return "max_context" if max_context else "search_limit"
    return "memory"


class UsersAt(NamedTuple):
    """One cell of a planning table: what `capacity` reports as max_concurrent_users and
    engine_kv_bytes_per_sequence at ctx, with the KV budget per GPU (None, in a table, for a model that keeps no
    per-sequence cache: `users_sweep` does not plan one); `sequence_limit`: the engine's limit on running requests
    where the users reach it (an instance's, as `Capacity.sequence_limit`); `not_planned`: why the deployment
    cannot be planned (the engine does not run the model on that GPU or release), where it cannot."""

    max_users: int | None
    engine_kv_bytes_per_sequence: int | None
    kv_budget_bytes: int | None
    sequence_limit: int | None = None
    not_planned: str | None = None


def users_sweep(model: ModelSpec, ctxs: Sequence[int], hardwares: Sequence[tuple[Hardware, Parallelism]], *,
                engine_name: str = "vllm", options: EngineOptions | None = None,
                kv_dtype_name: str | None = None, weights_dtype_name: str | None = None,
                overhead: int | None = None) -> list[list[UsersAt]]:
    """For each GPU set x ctx, the users `capacity` finds (the same budget, pools and search), without the rest of
    its report: `kvplan table`'s sweep. The model's split (`LayoutSplit`) is built and checked once for each
    parallel layout; each deployment is sized for the longest context; users fall as the context grows, so past
    the shortest context at which none fits, none is counted. A GPU set the deployment cannot be planned on gets
    cells that say why (`UsersAt.not_planned`), and the others are still counted."""
    options = options or EngineOptions()
    longest = [Workload(ctx=max(ctxs))]  # the workloads differ in ctx alone: a deployment is sized for the longest
    splits: dict[Parallelism, LayoutSplit] = {}
    out = []
    for hardware, parallel in hardwares:
        try:
            d = deploy(model, longest, engine_name, options, hardware, parallel, kv_dtype_name,
                       weights_dtype_name, None, overhead, splits.get(parallel))
            bounding = _bounding_pools(model, d.pools, min(ctxs), d.budget)
        except KvplanError as err:
            out.append([UsersAt(None, None, None, not_planned=str(err))] * len(ctxs))
            continue
        splits[parallel] = d.split
        none_from = None  # the shortest ctx at which not one user fits: none fits at any longer one either
        row = []
        for ctx in ctxs:
            if none_from is not None and ctx >= none_from:
                served = UsersServed(0, 0, bounding[0])  # as `_users_at` gives it
            else:
                served = _users_at(bounding, d.budget, ctx, 0, parallel.ranks)
                if not served.steady:
                    none_from = ctx
            limit = served.binding.sequence_limit(d.budget) if served.at_limit else None
            row.append(UsersAt(served.steady, served.binding.bytes_per_sequence(ctx), d.budget, limit))
        out.append(row)
    return out


def _vllm_numbers(pool: VllmPool, budget: int, ctx: int) -> dict:
    log = pool.log(budget, ctx)
    return {"vllm_num_blocks": log.num_blocks, "vllm_kv_cache_tokens": log.kv_cache_tokens,
            "vllm_max_concurrency": log.max_concurrency, "vllm_log": log.lines,
            "vllm_block_bytes": pool.block_bytes, "vllm_blocks_per_sequence": pool.blocks_per_request(ctx),
            "vllm_kv_bytes_per_sequence_decode": pool.bytes_per_sequence_decode(ctx)}


def _host_memory(d: Deployment, parallel: Parallelism, pool: KVPool) -> dict:
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


def _draft_and_adapter_numbers(d: Deployment, binding: KVPool, ctx: int) -> dict:
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
