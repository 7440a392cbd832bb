"""What kvplan prints on a terminal 80 and 120 columns wide, for the commands a newcomer runs first: `estimate`
(alone and with a GPU), `table`, `models` and `gpus`. Ids and numbers stay whole, headers and prose wrap
between words, and only a table that cannot fit (`table` at 80 columns) is wider than the terminal.

The expected screens are in tests/golden/ (trailing spaces, which a terminal does not show, are not compared).
After a deliberate change to the output, rewrite them and read the diff:

    python tests/test_output_golden.py
"""

import io
import sys
from pathlib import Path

import pytest

GOLDEN = Path(__file__).resolve().parent / "golden"
WIDTHS = (80, 120)
COMMANDS = {
    "estimate": ["estimate", "--model", "meta-llama/Llama-3-8B", "--ctx", "8192"],
    "estimate-gpu": ["estimate", "--model", "google/gemma-3-27b-it", "--ctx", "32k", "--gpu", "h100", "--batch",
                     "8"],
    "table": ["table", "--models", "meta-llama/Llama-3.1-8B,Qwen/Qwen3-32B,deepseek-ai/DeepSeek-V3", "--ctx",
              "8k,128k", "--gpu", "h100,l40s,4xh100"],
    "models": ["models", "mistral"],  # ids and aliases side by side at 120 columns, aliases below at 80
    "gpus": ["gpus"],
}
WIDER_THAN_THE_TERMINAL = {("table", 80)}  # eleven columns of whole ids and numbers need about 110


class Terminal(io.StringIO):
    """Standard output as a terminal: kvplan prints for a person (rich tables at the terminal's width)."""

    def isatty(self) -> bool:
        return True


def screen(args: list[str], width: int, monkeypatch) -> str:
    """What `kvplan ARGS` shows on a terminal `width` columns wide, without colour (TERM=dumb), lines right-trimmed."""
    from kvplan import cli

    for name, value in (("COLUMNS", str(width)), ("LINES", "50"), ("TERM", "dumb")):
        monkeypatch.setenv(name, value)
    for name in ("FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        monkeypatch.delenv(name, raising=False)
    terminal = Terminal()
    monkeypatch.setattr(sys, "stdout", terminal)
    monkeypatch.setattr(sys, "argv", ["kvplan", *args])
    try:
        cli.main()
    except SystemExit as exit_:
        assert exit_.code in (None, 0, 1), exit_.code  # 1: the capacity example does not fit, as it says
    return "".join(line.rstrip() + "\n" for line in terminal.getvalue().splitlines())


def golden_path(name: str, width: int) -> Path:
    return GOLDEN / f"{name}-{width}.txt"


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("name", COMMANDS)
def test_screen_matches_golden(name, width, monkeypatch):
    shown = screen(COMMANDS[name], width, monkeypatch)
    expected = golden_path(name, width).read_text(encoding="utf-8")
    assert shown == expected, f"output changed: see the module docstring to rewrite {golden_path(name, width)}"
    widest = max(len(line) for line in shown.splitlines())
    assert (widest > width) == ((name, width) in WIDER_THAN_THE_TERMINAL), widest


def test_goldens_show_ids_whole():
    """The goldens themselves hold what the issue asked for: every model id and GPU name on one line."""
    for width in WIDTHS:
        table = golden_path("table", width).read_text(encoding="utf-8")
        assert all(model in table for model in COMMANDS["table"][2].split(","))
        gpus = golden_path("gpus", width).read_text(encoding="utf-8")
        assert "NVIDIA GeForce RTX 4090" in gpus and "AMD Instinct MI300X" in gpus
        assert "mistralai/Mistral-Small-24B-Base-2501" in golden_path("models", width).read_text(encoding="utf-8")
        assert "…" not in table + gpus


def rewrite() -> None:
    """Rewrite every golden file from what kvplan prints now."""
    monkeypatch = pytest.MonkeyPatch()
    GOLDEN.mkdir(exist_ok=True)
    for name, args in COMMANDS.items():
        for width in WIDTHS:
            text = screen(args, width, monkeypatch)
            monkeypatch.undo()
            golden_path(name, width).write_text(text, encoding="utf-8")
            print(f"wrote {golden_path(name, width).relative_to(GOLDEN.parent.parent)}")


if __name__ == "__main__":
    rewrite()
