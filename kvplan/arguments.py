"""The flags' values, checked and turned into the domain's types: engine options, the GPU, sizes and counts. The
public functions (`kvplan.api`) call these with the keywords they were given, which are the command's flags, so
that an error names the flag (`--batch must be between 1 and ...`) whether it came from the command line or from a
script."""

from __future__ import annotations

import json
from collections.abc import Mapping

from kvplan.errors import KvplanError
from kvplan.text import brief


def default_engine(spec, gpu_name: str | None) -> tuple[str, str | None]:
    """The engine planned when --engine is not given, and a note where the GPU chose it: llama.cpp for a GGUF file
    (its cache layout is llama.cpp's) and on Apple silicon (`kvplan.engines.default_engine`), else vLLM."""
    from kvplan.engines import default_engine as by_gpu

    if spec.checkpoint is not None and spec.checkpoint.format == "gguf":
        return "llama.cpp", None
    return by_gpu(gpu_name)


def limit_mm(text: str | Mapping | None) -> tuple[tuple[str, int], ...] | None:
    """--limit-mm-per-prompt as vLLM takes it, a JSON object of counts ('{"image": 0, "video": 2}'), or
    image=0,video=2 (from a script, a dict of counts too)."""
    if text is None:
        return None
    if isinstance(text, Mapping):
        text = json.dumps(dict(text))
    if not isinstance(text, str):
        raise KvplanError(f"--limit-mm-per-prompt is counts like image=0,video=0, got {brief(text)}")

    def once(pairs: list) -> dict:
        """The counts, each modality named once (a dict would keep the last of two silently)."""
        counts: dict = {}
        for name, count in pairs:
            if not name:
                raise KvplanError(f"--limit-mm-per-prompt {brief(text)} gives a count without a modality's name")
            if name in counts:
                raise KvplanError(f"--limit-mm-per-prompt gives {brief(name)} more than once: give each modality once")
            counts[name] = count
        return counts

    if text.strip().startswith("{"):
        try:
            counts = json.loads(text, object_pairs_hook=once)
        except ValueError:
            raise KvplanError(f"--limit-mm-per-prompt {brief(text)} is not a JSON object like "
                              '\'{"image": 0}\'') from None
    else:
        counts = once((name.strip(), int(count) if sep and count.strip().isdigit() and count.isascii() else count)
                      for name, sep, count in (item.partition("=") for item in
                                               filter(None, (part.strip() for part in text.split(",")))))
    if not counts or not isinstance(counts, dict):
        raise KvplanError(f"--limit-mm-per-prompt {brief(text)}: give counts like image=0,video=0 or "
                          '\'{"image": 0}\'')
    for name, count in counts.items():
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= MAX_COUNT:
            raise KvplanError(f"--limit-mm-per-prompt: the count for {brief(name)} must be a whole number from 0 "
                              f"(kvplan reads counts only), got {brief(str(count))}")
    return tuple(sorted(counts.items()))


# The flags of an engine's rules, by the keyword each has in `kvplan.estimate` and `kvplan.plan` (the flag's name)
ENGINE_FLAGS = ("engine_version", "gpu_memory_utilization", "block_size", "max_num_batched_tokens",
                "async_scheduling", "kv_unified", "swa_full", "cache_implementation", "expandable_segments",
                "ubatch_size", "batch_size", "cache_type_k", "cache_type_v", "flash_attn", "speculative_tokens",
                "frontend", "limit_mm_per_prompt", "language_model_only", "kv_offloading_size",
                "kv_offloading_backend", "cpu_offload_gb", "speculative_method", "enable_lora", "max_loras",
                "max_lora_rank", "max_cpu_loras", "gdn_prefill_backend", "mamba_ssm_cache_dtype", "lora",
                "max_mamba_cache_size", "mamba_full_memory_ratio", "max_num_seqs", "disable_radix_cache")
SWITCHES = ("expandable_segments", "language_model_only", "disable_radix_cache", "enable_expert_parallel")  # off: unset


def given(name: str, value) -> bool:
    """Whether a flag was given: not None, and a switch (`--language-model-only`) not off."""
    return value is not None and not (value is False and name in SWITCHES)


def texts(**flags) -> None:
    """Flags that take text (`--engine vllm` as engine="vllm") given something else, from a script."""
    for name, value in flags.items():
        if value is not None and not isinstance(value, str):
            raise KvplanError(f"--{name.replace('_', '-')} must be text, got {brief(value)}")


def number(flag: str, value) -> None:
    """A flag that takes a number (--gpu-memory-utilization 0.9) given something else, from a script."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise KvplanError(f"{flag} must be a number, got {brief(value)}")


def engine_options(*, engine_version=None, gpu_memory_utilization=None, block_size=None,
                   max_num_batched_tokens=None, async_scheduling=None, platform=None, kv_unified=None, swa_full=None,
                   cache_implementation=None, expandable_segments=False, ubatch_size=None, batch_size=None,
                   cache_type_k=None, cache_type_v=None, flash_attn=None, speculative_tokens=None, frontend=None,
                   limit_mm_per_prompt=None, language_model_only=False, kv_offloading_size=None,
                   kv_offloading_backend=None, cpu_offload_gb=None, speculative_method=None, enable_lora=None,
                   max_loras=None, max_lora_rank=None, max_cpu_loras=None, gdn_prefill_backend=None,
                   mamba_ssm_cache_dtype=None, lora=None, max_mamba_cache_size=None, mamba_full_memory_ratio=None,
                   max_num_seqs=None, disable_radix_cache=False):
    """The engine's options (`kvplan.engines.EngineOptions`) from its flags (`ENGINE_FLAGS`), checked."""
    from kvplan.engines import EngineOptions
    from kvplan.units import parse_gib

    counts(block_size=block_size, max_num_batched_tokens=max_num_batched_tokens, ubatch_size=ubatch_size,
           batch_size=batch_size, max_loras=max_loras, max_lora_rank=max_lora_rank, max_cpu_loras=max_cpu_loras,
           max_mamba_cache_size=max_mamba_cache_size, max_num_seqs=max_num_seqs)
    number("--gpu-memory-utilization", gpu_memory_utilization)
    number("--mamba-full-memory-ratio", mamba_full_memory_ratio)
    if gpu_memory_utilization is not None and not 0 < gpu_memory_utilization <= 1:
        raise KvplanError(f"--gpu-memory-utilization must be in (0, 1], got {gpu_memory_utilization}")
    if mamba_full_memory_ratio is not None and not 0 < mamba_full_memory_ratio < float("inf"):
        raise KvplanError(f"--mamba-full-memory-ratio must be a number above 0, got {mamba_full_memory_ratio}")
    for flag, value, choices in (("--cache-implementation", cache_implementation, ("dynamic", "static")),
                                 ("--flash-attn", flash_attn, ("on", "off", "auto")),
                                 ("--frontend", frontend, ("server", "python")),
                                 ("--platform", platform, ("gpu", "cpu")),
                                 ("--kv-offloading-backend", kv_offloading_backend, ("native", "lmcache")),
                                 ("--speculative-method", speculative_method,
                                  ("draft_model", "eagle", "eagle3", "mtp", "ngram")),
                                 ("--gdn-prefill-backend", gdn_prefill_backend, ("flashinfer", "triton", "cutedsl")),
                                 ("--mamba-ssm-cache-dtype", mamba_ssm_cache_dtype,
                                  ("auto", "float32", "float16", "bfloat16"))):
        if value not in (None, *choices):
            raise KvplanError(f"{flag} is {' or '.join(choices)}, got {brief(value)}")
    if speculative_tokens is not None and (isinstance(speculative_tokens, bool) or
                                           not isinstance(speculative_tokens, int)
                                           or not 0 <= speculative_tokens <= MAX_COUNT):
        raise KvplanError(f"--speculative-tokens must be between 0 and {MAX_COUNT:,}, got {brief(speculative_tokens)}")
    return EngineOptions(version=engine_version, memory_fraction=gpu_memory_utilization, block_size=block_size,
                         max_num_batched_tokens=max_num_batched_tokens, async_scheduling=async_scheduling,
                         platform=platform, kv_unified=kv_unified, swa_full=swa_full,
                         cache_implementation=cache_implementation, expandable_segments=expandable_segments or None,
                         ubatch_size=ubatch_size,
                         batch_size=batch_size, cache_type_k=cache_type_k, cache_type_v=cache_type_v,
                         flash_attn=flash_attn, speculative_tokens=speculative_tokens, frontend=frontend,
                         limit_mm_per_prompt=limit_mm(limit_mm_per_prompt),
                         language_model_only=language_model_only or None,
                         kv_offloading_size=parse_gib(kv_offloading_size, "--kv-offloading-size")
                         if kv_offloading_size is not None else None,
                         kv_offloading_backend=kv_offloading_backend,
                         cpu_offload_bytes=parse_gib(cpu_offload_gb, "--cpu-offload-gb")
                         if cpu_offload_gb is not None else None,
                         speculative_method=speculative_method, enable_lora=enable_lora,
                         max_loras=max_loras, max_lora_rank=max_lora_rank, max_cpu_loras=max_cpu_loras,
                         gdn_prefill_backend=gdn_prefill_backend, mamba_ssm_cache_dtype=mamba_ssm_cache_dtype,
                         lora_adapters=lora_adapters(lora), max_mamba_cache_size=max_mamba_cache_size,
                         mamba_full_memory_ratio=mamba_full_memory_ratio, max_num_seqs=max_num_seqs,
                         disable_radix_cache=disable_radix_cache or None)


def lora_adapters(paths: list[str] | str | None):
    """--lora: each adapter GGUF's header, read as llama.cpp loads the file (from a script, one path or a list)."""
    if not paths:
        return None
    if isinstance(paths, str):
        paths = [paths]
    if not isinstance(paths, list | tuple) or not all(isinstance(path, str) for path in paths):
        raise KvplanError(f"--lora is a path to an adapter GGUF (from a script, a list of paths), got {brief(paths)}")
    from pathlib import Path

    from kvplan.sources.gguf_model import read_lora_adapter

    return tuple(read_lora_adapter(Path(path).expanduser()) for path in paths)


def draft(name: str | None, token: str | None):
    """--draft-model, read as --model is (its Hub revision: main), or an EAGLE head's config."""
    if name is None:
        return None
    from kvplan.sources import load_model

    return load_model(name, None, token, eagle_head=True)


def hardware(gpu: str | None, vram: str | None, gpus: int | None = None):
    """(the GPU, how many): --gpu h100 or --vram 24GiB, with a count written in front (`4xh100`, `2x24GiB`)
    or given by --gpus."""
    from kvplan.capacity import Hardware
    from kvplan.gpus import count_and_name, find

    if gpu and vram:
        raise KvplanError("--gpu and --vram both name the GPU's memory: give one")
    texts(gpu=gpu)
    if isinstance(vram, int):  # from a script, bytes
        vram = str(vram)
    texts(vram=vram)
    count, name = count_and_name(gpu or vram or "")
    if count is not None and gpus is not None and count != gpus:
        raise KvplanError(f"--gpu {gpu or vram} says {count} GPUs and --gpus {gpus}: give the count once")
    count = count or gpus
    if gpu:
        found = find(name)
        return Hardware(name=found.name, memory_bytes=found.usable_bytes), count
    return Hardware(memory_bytes=size(name if vram else None, "--vram")), count


def size(text: str | int | None, flag: str, allow_zero: bool = False) -> int | None:
    """A size flag (--overhead 2GiB), or from a script a number of bytes."""
    from kvplan.units import parse_bytes

    return None if text is None else parse_bytes(text, flag, allow_zero)


MAX_COUNT = 2**31 - 1  # users, GPUs, layers, block sizes: far above any real deployment


def counts(**flags: int | None) -> None:
    """Whole-number flags (`--batch 4` as batch=4): at least 1 and at most MAX_COUNT, so that no later product
    of them leaves exact arithmetic."""
    for name, value in flags.items():
        flag = "--" + name.replace("_", "-")
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise KvplanError(f"{flag} must be a whole number, got {brief(value)}")
        if value is not None and not 1 <= value <= MAX_COUNT:
            shown = f"{value}" if abs(value) < 10**12 else f"a {len(str(abs(value)))}-digit number"
            raise KvplanError(f"{flag} must be between 1 and {MAX_COUNT:,}, got {shown}")


def request_lengths(ctx: int | str | None, isl: int | str | None,
                    osl: int | str | None) -> tuple[int, int | None, int | None]:
    """(--ctx, --isl, --osl) in tokens. --isl and --osl go together; --ctx defaults to their sum, and given beside
    them must be at least that: memory is planned for what each user may hold (--ctx), speed for the requests
    (--isl, --osl)."""
    from kvplan.units import parse_tokens

    ctxs, isl, osl = contexts([parse_tokens(ctx)] if ctx is not None else None, isl, osl)
    return ctxs[0], isl, osl


def contexts(ctxs: list[int] | None, isl: int | str | None,
             osl: int | str | None) -> tuple[list[int], int | None, int | None]:
    """(the contexts, --isl, --osl) as `request_lengths` takes them, for each of several contexts."""
    from kvplan.units import parse_tokens

    if (isl is None) != (osl is None):
        raise KvplanError("--isl and --osl go together: give both (prompt and output tokens per request)")
    if isl is None:
        if ctxs is None:
            raise KvplanError("give --ctx, or --isl and --osl (--ctx is then their sum)")
        return ctxs, None, None
    prompt, output = parse_tokens(isl, "isl"), parse_tokens(osl, "osl")
    if output < 2:
        raise KvplanError(f"--osl must be at least 2 tokens (a time per output token is the time between two), got "
                          f"{output:,}")
    if ctxs is None:
        return [prompt + output], prompt, output
    if min(ctxs) < prompt + output:
        raise KvplanError(f"--ctx {min(ctxs):,} is shorter than --isl + --osl = {prompt + output:,}: a request of "
                          f"{prompt:,} + {output:,} tokens needs at least that (or leave --ctx out)")
    return ctxs, prompt, output


def targets(max_tpot: float | None, max_ttft: float | None, min_tps: float | None,
            isl: int | None) -> tuple[str, dict] | None:
    """(the first target flag given, the targets by `kvplan.speed.targets.Targets`' names), or None: each a number
    above 0, and --isl and --osl given."""
    given = {flag: value for flag, value in (("--max-tpot", max_tpot), ("--max-ttft", max_ttft),
                                             ("--min-tps", min_tps)) if value is not None}
    for flag, value in given.items():
        number(flag, value)
        if not 0 < value < float("inf"):
            unit = "output tokens/s" if flag == "--min-tps" else "milliseconds"
            raise KvplanError(f"{flag} must be a number of {unit} above 0, got {value:g}")
    if not given:
        return None
    first = next(iter(given))
    if isl is None:
        raise KvplanError(f"{first} needs --isl and --osl: the prompt and output tokens per request the speed model "
                          "times")
    return first, {"max_tpot_ms": max_tpot, "max_ttft_ms": max_ttft, "min_tokens_per_s_per_user": min_tps}
