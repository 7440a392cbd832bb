"""The floor under `kvplan estimate`: a typer app with the same options (tests/test_newcomer.py holds the two
alike), importing pydantic (and, unless --json is given, rich's console and table, which kvplan's table output
needs), that does nothing and prints `{}`.

    python benchmarks/cli_floor.py estimate --model x --ctx 8k          # the floor under `kvplan estimate`
    python benchmarks/cli_floor.py estimate --model x --ctx 8k --json   # under `kvplan estimate --json`

Whatever `kvplan estimate` takes beyond it is kvplan's own: its imports, reading the config, the arithmetic and the
output. bench_startup.py times the two alternately (benchmarks/README.md).

With FLOOR_NO_GC=1 the floor runs as the `kvplan` command does (`kvplan.main`): Python's cycle collector off from
the start, and its objects frozen at exit so that the interpreter's last pass skips them. That is the floor kvplan's
own work is measured against, where the floor proper also pays for the collector and the last pass.
"""
import gc
import os
import sys

if os.environ.get("FLOOR_NO_GC") == "1":
    gc.disable()
from typing import Annotated

import pydantic  # noqa: F401  (kvplan's domain model needs it anyway; typer builds its option adapters with it)
import typer

if "--json" not in sys.argv:
    import rich.console  # noqa: F401
    import rich.table  # noqa: F401

app = typer.Typer(add_completion=False)


@app.command()
def estimate(model: Annotated[str, typer.Option()], ctx: str | None = None, isl: str | None = None,
             osl: str | None = None, revision: str | None = None, token: str | None = None,
             gguf_file: str | None = None, batch: int | None = None,
             kv_dtype: str | None = None, weights_dtype: str | None = None, gpu: str | None = None,
             vram: str | None = None, gpus: int | None = None, tp: int | None = None, pp: int | None = None,
             dp: int | None = None, ep: int | None = None, enable_expert_parallel: bool = False,
             engine: str | None = None, engine_version: str | None = None,
             gpu_memory_utilization: float | None = None, kv_budget: str | None = None, overhead: str | None = None,
             users: int | None = None, avg_ctx: str | None = None, shared_prefix: str | None = None,
             block_size: int | None = None, max_num_batched_tokens: int | None = None,
             async_scheduling: bool | None = None, platform: str | None = None, kv_unified: bool | None = None,
             swa_full: bool | None = None, cache_implementation: str | None = None, expandable_segments: bool = False,
             ubatch_size: int | None = None, batch_size: int | None = None, cache_type_k: str | None = None,
             cache_type_v: str | None = None, flash_attn: str | None = None,
             speculative_tokens: int | None = None, frontend: str | None = None,
             limit_mm_per_prompt: str | None = None, language_model_only: bool = False,
             kv_offloading_size: str | None = None, kv_offloading_backend: str | None = None,
             cpu_offload_gb: str | None = None, draft_model: str | None = None,
             speculative_method: str | None = None, enable_lora: bool | None = None, max_loras: int | None = None,
             max_lora_rank: int | None = None, max_cpu_loras: int | None = None,
             gdn_prefill_backend: str | None = None, mamba_ssm_cache_dtype: str | None = None,
             lora: list[str] | None = None, max_mamba_cache_size: int | None = None,
             mamba_full_memory_ratio: float | None = None, max_num_seqs: int | None = None,
             disable_radix_cache: bool = False,
             max_tpot: float | None = None, max_ttft: float | None = None, min_tps: float | None = None,
             as_json: Annotated[bool, typer.Option("--json")] = False):
    print("{}")


@app.command()
def other(x: int = 1):
    """A second command, so that typer builds a group with subcommands as kvplan's does."""


if __name__ == "__main__":
    try:
        app()
    finally:
        if os.environ.get("FLOOR_NO_GC") == "1":
            gc.freeze()
