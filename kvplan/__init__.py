"""kvplan: VRAM and capacity planner for LLM inference, as a command (`kvplan`) and as a library:

    import kvplan
    result = kvplan.estimate("meta-llama/Llama-3-8B", ctx=8192, gpu="h100")
    result.kv_bytes_per_sequence, result.capacity.max_concurrent_users

The public functions are those of `kvplan.api` (docs/api.md); their results are pydantic types whose JSON is the
command's `--json` output. The domain model lives in `kvplan.model`; sources (`kvplan.sources`) turn configs and
specs into it; `kvplan.memory` and `kvplan.capacity` turn it into bytes and users; `kvplan.cli` and
`kvplan.report` present the numbers.

`import kvplan` imports nothing else: each public name is looked up on first use (`__getattr__`), so a script
that plans from the bundled library never loads torch, transformers or huggingface_hub, and the command pays
for nothing it does not run.
"""

__version__ = "0.1.0"
__all__ = ["KvplanError", "__version__", "estimate", "load_model", "plan", "profile", "schema", "table"]

_LAZY = {"KvplanError": "kvplan.errors", "estimate": "kvplan.api", "load_model": "kvplan.api",
         "plan": "kvplan.api", "profile": "kvplan.api", "schema": "kvplan.api", "table": "kvplan.api"}


def __getattr__(name: str):
    """A public name, imported when first asked for and kept (PEP 562)."""
    if name not in _LAZY:
        raise AttributeError(f"module 'kvplan' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


def main() -> None:
    """The `kvplan` command (`kvplan.cli.main`), with Python's cycle collector off from the first import: a run is
    short and its objects hold no reference cycles worth collecting, while the collector's passes over what typer,
    pydantic and rich create at import cost `kvplan estimate` about 4% of its instructions. At exit the interpreter
    still makes one last pass over every object, whatever the collector's setting (about 6% more): a run that kept
    the collector off freezes its objects first (`gc.freeze`), which that pass skips. Nothing is lost: atexit
    handlers run and the standard streams are flushed as before, and every file kvplan writes is closed by then.
    `kvplan profile`, which runs torch, turns the collector back on and is left to the last pass."""
    import gc

    gc.disable()
    try:
        from kvplan.cli import main as run

        run()
    finally:
        if not gc.isenabled():
            gc.freeze()
