"""kvplan: VRAM and capacity planner for LLM inference.

The domain model lives in `kvplan.model`; sources (`kvplan.sources`) turn configs and specs into it;
`kvplan.memory` turns it into bytes; `kvplan.cli` and `kvplan.report` present the numbers.
"""

__version__ = "0.1.0"


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
