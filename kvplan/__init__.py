"""kvplan: VRAM and capacity planner for LLM inference.

The domain model lives in `kvplan.model`; sources (`kvplan.sources`) turn configs and specs into it;
`kvplan.memory` turns it into bytes; `kvplan.cli` and `kvplan.report` present the numbers.
"""

__version__ = "0.1.0"


def main() -> None:
    """The `kvplan` command (`kvplan.cli.main`), with Python's cycle collector off from the first import: a run is
    short and its objects hold no reference cycles worth collecting, while the collector's passes over what typer,
    pydantic and rich create at import cost `kvplan estimate` about 4% of its instructions. `kvplan profile`, which
    runs torch, turns it back on."""
    import gc

    gc.disable()
    from kvplan.cli import main as run

    run()
