"""kvplan's public functions, re-exported by the package (`kvplan.estimate`, ...; docs/api.md). The command line
(`kvplan.cli`) parses flags into these calls and prints their results: each keyword is the flag of the same name
(snake_case), each result's `model_dump_json()` is the command's `--json`, and each error is the `KvplanError`
whose message the command prints on its one error line."""

from __future__ import annotations

from kvplan.errors import KvplanError
from kvplan.model import ModelSpec
from kvplan.text import brief

# The keywords of estimate and plan that take text, as their flags do (checked so that a script's 3 for "vllm" is a
# one-line error).
TEXT_FLAGS = ("revision", "token", "gguf_file", "gpu", "engine", "engine_version", "kv_dtype", "weights_dtype",
              "cache_implementation", "platform", "cache_type_k", "cache_type_v", "flash_attn", "frontend",
              "kv_offloading_backend", "draft_model", "speculative_method", "gdn_prefill_backend",
              "mamba_ssm_cache_dtype")


def load_model(source: str, *, revision: str | None = None, token: str | None = None,
               gguf_file: str | None = None) -> ModelSpec:
    """The model `source` names, read as `--model` reads it: a library name or alias, a config.json or a directory
    holding one, a YAML spec, a GGUF file, or a Hub id (`org/name`, `org/name:Q4_K_M`; `revision` and `token` for
    the Hub, `gguf_file` for a GGUF file in a Hub repo). Nothing Hub-related is imported unless the Hub is asked."""
    from kvplan.sources import load_model as load

    if not isinstance(source, str):
        raise KvplanError(f"--model is a name or a path (a str), got {type(source).__name__}")
    return load(source, revision, token, gguf_file)


def schema(name: str) -> dict:
    """The JSON Schema of `name`'s output (estimate, table or plan), as `kvplan schema NAME` prints it."""
    import json

    from kvplan.schemas import text

    return json.loads(text(name))


def _model(model, revision: str | None, token: str | None, gguf_file: str | None) -> ModelSpec:
    """`model` as --model names it, or a ModelSpec already loaded (then there is nothing to fetch)."""
    if isinstance(model, ModelSpec):
        if revision is not None or gguf_file is not None:
            raise KvplanError("--revision and --gguf-file say where to read a model: this one is read already")
        return model
    return load_model(model, revision=revision, token=token, gguf_file=gguf_file)


def estimate(model: str | ModelSpec, ctx: int | str | None = None, *, isl: int | str | None = None,
             osl: int | str | None = None, revision: str | None = None, token: str | None = None,
             gguf_file: str | None = None, batch: int | None = None, kv_dtype: str | None = None,
             weights_dtype: str | None = None, gpu: str | None = None, vram: str | int | None = None,
             gpus: int | None = None, tp: int | None = None, pp: int | None = None, dp: int | None = None,
             ep: int | None = None, enable_expert_parallel: bool = False, engine: str | None = None,
             engine_version: str | None = None, gpu_memory_utilization: float | None = None,
             kv_budget: str | int | None = None, overhead: str | int | None = None, users: int | None = None,
             avg_ctx: int | str | None = None, shared_prefix: int | str | None = None, block_size: int | None = None,
             max_num_batched_tokens: int | None = None, async_scheduling: bool | None = None,
             platform: str | None = None, kv_unified: bool | None = None, swa_full: bool | None = None,
             cache_implementation: str | None = None, expandable_segments: bool = False,
             ubatch_size: int | None = None, batch_size: int | None = None,
             cache_type_k: str | None = None, cache_type_v: str | None = None, flash_attn: str | None = None,
             speculative_tokens: int | None = None, frontend: str | None = None,
             limit_mm_per_prompt: str | dict | None = None, language_model_only: bool = False,
             kv_offloading_size: str | float | None = None, kv_offloading_backend: str | None = None,
             cpu_offload_gb: str | float | None = None, draft_model: str | None = None,
             speculative_method: str | None = None, enable_lora: bool | None = None, max_loras: int | None = None,
             max_lora_rank: int | None = None, max_cpu_loras: int | None = None,
             gdn_prefill_backend: str | None = None, mamba_ssm_cache_dtype: str | None = None,
             lora: list[str] | str | None = None, max_mamba_cache_size: int | None = None,
             mamba_full_memory_ratio: float | None = None, max_num_seqs: int | None = None,
             disable_radix_cache: bool = False, max_tpot: float | None = None, max_ttft: float | None = None,
             min_tps: float | None = None):
    """`kvplan estimate`: the KV cache per token, per sequence and per batch (default 1) and the weights of `model`
    at `ctx` tokens (8192, "8k", "128K"; k = 1,024); with a GPU, an engine, a budget or any engine flag, also how
    many users fit under that engine's rules and whether `users` (default `batch`) do. With requests of `isl`
    prompt + `osl` output tokens (`ctx` then defaults to their sum), also how fast, and with the targets `max_tpot`,
    `max_ttft`, `min_tps` how many users they leave. Each keyword is the flag of that name (docs/cli.md). Returns a
    `kvplan.results.EstimateResult`; raises KvplanError for bad input."""
    flags = dict(locals())
    from kvplan import arguments
    from kvplan.dtypes import kv_dtype as check_kv
    from kvplan.dtypes import weight_dtype as check_weights
    from kvplan.memory import estimate as run_estimate
    from kvplan.results import EstimateResult
    from kvplan.units import parse_tokens

    arguments.texts(**{name: flags[name] for name in TEXT_FLAGS if name in flags})
    tokens, isl, osl = arguments.request_lengths(ctx, isl, osl)
    targets = arguments.targets(max_tpot, max_ttft, min_tps, isl)
    arguments.counts(batch=batch, users=users, gpus=gpus, tp=tp, pp=pp, dp=dp, ep=ep, block_size=block_size,
                     max_num_batched_tokens=max_num_batched_tokens)
    asked = users if users is not None else batch  # the concurrency the speed is at (None: what memory holds)
    batch = batch or 1
    if kv_dtype:
        check_kv(kv_dtype)
    if weights_dtype:
        check_weights(weights_dtype)
    capacity_flags = ("gpu", "vram", "gpus", "tp", "pp", "dp", "ep", "enable_expert_parallel", "engine", "kv_budget",
                      "overhead", "users", "avg_ctx", "shared_prefix", "draft_model", "platform",
                      *arguments.ENGINE_FLAGS)
    spec = _model(model, revision, token, gguf_file)
    cap = workload = None
    if any(arguments.given(name, flags[name]) for name in capacity_flags):
        from kvplan import capacity

        options = arguments.engine_options(platform=platform,
                                           **{name: flags[name] for name in arguments.ENGINE_FLAGS})
        workload = capacity.Workload(
            ctx=tokens, users=users if users is not None else batch,
            avg_ctx=parse_tokens(avg_ctx, "avg-ctx") if avg_ctx else None,
            shared_prefix=parse_tokens(shared_prefix, "shared-prefix") if shared_prefix else 0, isl=isl, osl=osl)
        hardware, gpus = arguments.hardware(gpu, vram, gpus)
        engine_name, chosen = (engine, None) if engine else arguments.default_engine(spec, hardware.name)
        cap = capacity.capacity(
            spec, workload, engine_name=engine_name, options=options, hardware=hardware,
            parallel=capacity.parallelism(engine_name, gpus, tp, pp, dp, ep, enable_expert_parallel),
            kv_dtype_name=kv_dtype, weights_dtype_name=weights_dtype,
            kv_budget=arguments.size(kv_budget, "--kv-budget"),
            overhead=arguments.size(overhead, "--overhead", allow_zero=True),
            draft=arguments.draft(draft_model, token))
        if chosen:
            cap = cap.model_copy(update={"notes": [chosen, *cap.notes]})
        kv_dtype, weights_dtype = cap.kv_dtype, cap.weights_dtype_override
    served = None
    notes = []  # a plain estimate's: why there is no speed estimate
    if isl is not None:
        served, why = _speed(spec, cap, workload, targets, asked)
        if why and cap is not None:
            cap = cap.model_copy(update={"notes": [*cap.notes, why]})
        elif why:
            notes.append(why)
    v_dtype = cap.v_dtype if cap is not None else None
    return EstimateResult(spec, run_estimate(spec, tokens, batch, kv_dtype, weights_dtype, v_dtype), cap, served,
                          notes)


def _speed(spec, cap, workload, targets: tuple[str, dict] | None, asked: int | None):
    """(the speed of the deployment `cap` plans (None: no GPU given) at the concurrency asked, None; or None and a
    note saying why the speed model cannot describe it, which is an error where a target needs it)."""
    from kvplan.speed import targets as speed

    why = speed.problem(None, "") if cap is None else speed.problem(cap.gpu, cap.engine, cap.pipeline_parallel_size,
                                                                    cap.platform)
    if why:
        return None, _no_speed(why, targets)
    return speed.speed(spec, cap, workload, concurrency=asked,
                       targets=speed.Targets(**targets[1]) if targets else None), None


def plan(model: str | ModelSpec, ctx: int | str | None = None, users: int | None = None, *,
         isl: int | str | None = None, osl: int | str | None = None, revision: str | None = None,
         token: str | None = None, gguf_file: str | None = None, gpu: str | None = None,
         vram: str | int | None = None, engine: str | None = None, engine_version: str | None = None,
         gpu_memory_utilization: float | None = None, overhead: str | int | None = None,
         block_size: int | None = None, max_num_batched_tokens: int | None = None,
         async_scheduling: bool | None = None, kv_unified: bool | None = None, swa_full: bool | None = None,
         cache_implementation: str | None = None, expandable_segments: bool = False,
         ubatch_size: int | None = None, batch_size: int | None = None, flash_attn: str | None = None,
         speculative_tokens: int | None = None, frontend: str | None = None,
         limit_mm_per_prompt: str | dict | None = None, language_model_only: bool = False,
         kv_offloading_size: str | float | None = None, kv_offloading_backend: str | None = None,
         cpu_offload_gb: str | float | None = None, draft_model: str | None = None,
         speculative_method: str | None = None, enable_lora: bool | None = None, max_loras: int | None = None,
         max_lora_rank: int | None = None, max_cpu_loras: int | None = None, gdn_prefill_backend: str | None = None,
         mamba_ssm_cache_dtype: str | None = None, lora: list[str] | str | None = None,
         max_mamba_cache_size: int | None = None, mamba_full_memory_ratio: float | None = None,
         max_num_seqs: int | None = None, disable_radix_cache: bool = False, max_gpus: int = 64,
         max_tpot: float | None = None, max_ttft: float | None = None, min_tps: float | None = None):
    """`kvplan plan`: the configurations (GPU count, TP, PP, KV and weights dtypes) that serve `users` at `ctx` on
    the GPU type `gpu` (or `vram`), fewest GPUs first, with the KV memory left over; with requests of `isl` + `osl`
    tokens (`ctx` then defaults to their sum) their speed at `users` in its place, and with the targets `max_tpot`,
    `max_ttft`, `min_tps` only the layouts that meet them. Returns a `kvplan.capacity.Plan`, with requests a
    `kvplan.speed.targets.SpeedPlan` (no rows: nothing up to `max_gpus` fits); raises KvplanError for bad input."""
    flags = dict(locals())
    from kvplan import arguments, capacity

    if users is None:
        raise KvplanError("give --users: the concurrent users to serve")
    arguments.texts(**{name: flags[name] for name in TEXT_FLAGS if name in flags})
    tokens, isl, osl = arguments.request_lengths(ctx, isl, osl)
    targets = arguments.targets(max_tpot, max_ttft, min_tps, isl)
    arguments.counts(users=users, max_gpus=max_gpus)
    hardware, count = arguments.hardware(gpu, vram)
    if count is not None:
        raise KvplanError(f"plan finds the GPU count itself: give --gpu {gpu or vram} without one (--max-gpus caps "
                          "it)")
    if hardware.memory_bytes is None:
        raise KvplanError("plan needs a GPU: give --gpu or --vram")
    options = arguments.engine_options(**{name: flags[name] for name in arguments.ENGINE_FLAGS if name in flags})
    spec = _model(model, revision, token, gguf_file)
    engine_name, chosen = (engine, None) if engine else arguments.default_engine(spec, hardware.name)
    settings = dict(engine_name=engine_name, options=options,
                    overhead=arguments.size(overhead, "--overhead", allow_zero=True), max_gpus=max_gpus,
                    draft=arguments.draft(draft_model, token))
    workload = capacity.Workload(ctx=tokens, users=users, isl=isl, osl=osl)
    why = None
    if isl is not None:
        from kvplan.speed import targets as speed

        why = speed.problem(hardware.name, engine_name)
        note = _no_speed(why, targets) if why else None
    if isl is None or why:
        result = capacity.plan(spec, workload, hardware, **settings)
        if why:
            result = result.model_copy(update={"notes": [*result.notes, note]})
    else:
        result = speed.plan(spec, workload, hardware, speed.Targets(**targets[1]) if targets else None, **settings)
    if chosen:
        result = result.model_copy(update={"notes": [chosen, *result.notes]})
    return result


def _no_speed(why: str, targets: tuple[str, dict] | None) -> str:
    """Where the speed model cannot describe a deployment: an error if a target needs it, else the note saying so."""
    if targets:
        raise KvplanError(f"{targets[0]}: {why}")
    return f"no speed estimate: {why}"


def _comma_list(values, flag: str) -> str | None:
    """A comma list as the command takes it, from a list (or already one, or one value: 8192, a size in bytes)."""
    if values is None or isinstance(values, str):
        return values
    if isinstance(values, int | float):
        return str(values)
    if not isinstance(values, list | tuple):
        raise KvplanError(f"{flag} is a comma list (from a script, a list), got {brief(values)}")
    return ",".join(str(value) for value in values)


def table(models=None, ctx=None, *, isl: int | str | None = None, osl: int | str | None = None,
          filter: str | None = None, revision: str | None = None, token: str | None = None, batch: int = 1,
          users: int | None = None, gpu=None, vram=None, engine: str | None = None,
          engine_version: str | None = None, gpu_memory_utilization: float | None = None,
          overhead: str | int | None = None, kv_dtype: str | None = None, weights_dtype: str | None = None,
          keep_going: bool = False, tp: int | None = None, pp: int | None = None):
    """`kvplan table`: KV per token and per sequence, weights, total and, with GPUs, max users on each GPU set, for
    every model x context. `models`: a comma list or @FILE as --models takes it, or a list of names and loaded
    ModelSpecs; `ctx`, `gpu`, `vram`: comma lists or lists. With requests of `isl` + `osl` tokens (`ctx` then
    defaults to their sum), each cell's speed on each GPU too, at `users` or else at the users memory holds in the
    cell. With `keep_going`, models that fail are left out and
    named in the result's `failures`. Returns a `kvplan.table_results.TableResult`; raises KvplanError for bad input."""
    from kvplan import arguments
    from kvplan import tables as planning
    from kvplan.sources import load_model as load
    from kvplan.table_results import TableResult

    arguments.texts(filter=filter, revision=revision, token=token, engine=engine, engine_version=engine_version,
                    kv_dtype=kv_dtype, weights_dtype=weights_dtype)
    arguments.counts(batch=batch, tp=tp, pp=pp, users=users)
    if isinstance(models, ModelSpec):
        models = [models]
    listed = planning.parse_ctxs(_comma_list(ctx, "--ctx")) if ctx is not None else None
    ctxs, isl, osl = arguments.contexts(listed, isl, osl)
    gpus = planning.parse_gpus(_comma_list(gpu, "--gpu"), _comma_list(vram, "--vram"))
    if users is not None and isl is None:
        raise KvplanError("--users sets the concurrency of the speed figures: give --isl and --osl with it")
    loaded = {}
    if models is not None and not isinstance(models, str):
        loaded = {item.name: item for item in models if isinstance(item, ModelSpec)}
        models = ",".join(item.name if isinstance(item, ModelSpec) else str(item) for item in models)
    names = planning.parse_models(models, filter)
    result = planning.build(names, ctxs, batch=batch, gpus=gpus, engine_name=engine,
                            options=arguments.engine_options(engine_version=engine_version,
                                                             gpu_memory_utilization=gpu_memory_utilization),
                            kv_dtype_name=kv_dtype, weights_dtype_name=weights_dtype,
                            overhead=arguments.size(overhead, "--overhead", allow_zero=True), keep_going=keep_going,
                            tp=tp, pp=pp, isl=isl, osl=osl, users=users,
                            loader=lambda name: loaded.get(name) or load(name, revision=revision, token=token))
    if not result.rows:
        raise KvplanError(planning.failure_line(result, len(names)))
    return TableResult(result, len(names), planning.input_files(models, names))


def profile(model: str, ctx: int | str, *, batch: int = 1, device: str = "cuda", dtype: str | None = None,
            layers: int | None = None, decode_steps: int = 32, cache_implementation: str | None = None,
            find_max_batch: bool = False, compare_recompute: bool = False, revision: str | None = None,
            token: str | None = None, progress=None):
    """`kvplan profile`: build `model` with random weights on `device` (transformers' own classes), prefill
    ctx - decode_steps tokens, decode the rest, and measure the cache, the allocator and the driver beside kvplan's
    transformers prediction. Imports torch and transformers (the `profile` extra) only when called;
    `progress` reports each phase (`kvplan.report.ProfileProgress`, as the command shows it). Returns a
    `kvplan.profiler.results.Profile`; raises KvplanError for bad input."""
    from kvplan import arguments
    from kvplan.profiler.run import run_profile
    from kvplan.units import parse_tokens

    if not isinstance(model, str):
        raise KvplanError("profile builds the model from its config: give --model as a name or a path")
    tokens = parse_tokens(ctx)
    arguments.counts(batch=batch, layers=layers, decode_steps=decode_steps)
    return run_profile(model, tokens, batch, device=device, dtype=dtype, layers=layers, decode_steps=decode_steps,
                       cache=cache_implementation or "dynamic", find_max_batch=find_max_batch,
                       compare_recompute=compare_recompute, revision=revision, token=token, progress=progress)
