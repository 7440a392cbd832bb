"""Every example in the docs is what kvplan prints today: docs/generate.py regenerates them into a temporary
directory (each `$ kvplan` block of README.md and docs/*.md, docs/examples/, the marked parts of docs/tables.md)
and every committed file must match (SVGs drawn by another matplotlib release are compared by the numbers they
plot). To refresh them: python docs/generate.py"""

import re

import pytest
from conftest import ROOT, load_script

pytest.importorskip("matplotlib")
pytest.importorskip("gguf")  # the GGUF example's file is written by llama.cpp's gguf-py


@pytest.fixture(scope="module")
def generate():
    return load_script("docs/generate.py", "docs_generate")


@pytest.fixture(scope="module")
def generated(generate, tmp_path_factory):
    out = tmp_path_factory.mktemp("docs")
    generate.generate(out)
    return out


def test_docs_examples_are_fresh(generate, generated):
    stale = generate.stale(generated)
    assert not stale, f"stale docs (run: python docs/generate.py): {', '.join(stale)}"


def test_every_example_is_embedded_or_linked(generate):
    page = (ROOT / "docs" / generate.PAGE).read_text(encoding="utf-8")
    for name in generate.EXAMPLE_COMMANDS:
        assert f"<!-- generated: {name} -->" in page, name


def test_every_kvplan_block_in_the_docs_is_run(generate):
    """A fenced block that shows a `$ kvplan` line is one the generator runs: its first line is the command (a
    block that opened with prose or output would keep whatever it says). The README and every page are read."""
    assert {"README.md", "docs/cli.md", "docs/yaml-spec.md", "docs/tables.md"} <= set(generate.PAGES)
    for name in generate.PAGES:
        text = (ROOT / name).read_text(encoding="utf-8")
        outside = "".join(generate.MARKER.split(text)[::generate.MARKER.groups + 1])
        blocks = re.findall(r"^```[\w-]*\n(.*?)^```$", outside, re.M | re.S)
        shown = [block for block in blocks if re.search(r"^\$ kvplan", block, re.M)]
        run = generate.BLOCK.findall(outside)
        assert len(run) == len(shown), name
        assert all(block.startswith("$ kvplan") for block in shown), name


def test_staleness_is_detected(generate, generated, tmp_path):
    """An example table, an example's output and a figure of the prose: each drifted copy is named."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(generated, copy)
    table = copy / "docs" / "examples" / "table.csv"
    table.write_text(table.read_text().replace("56", "57"), encoding="utf-8")
    cli = copy / "docs" / "cli.md"
    cli.write_text(cli.read_text().replace("max users at 8,192 tokens ", "max users at 8,192 tokens 1", 1),
                   encoding="utf-8")
    readme = copy / "README.md"
    readme.write_text(re.sub(r"library of \d+ popular", "library of 87 popular", readme.read_text()),
                      encoding="utf-8")
    assert generate.stale(generated, copy) == ["docs/examples/table.csv", "README.md", "docs/cli.md"]


def test_an_example_is_what_the_command_prints(generate, tmp_path):
    """The generator runs each `$` line as a person at an 80-column terminal does, output then errors, with the
    exit status; trims as asked."""
    code, printed = generate.run_line("$ kvplan estimate -m llama-3-8b --ctx 1.3k", tmp_path)
    assert (code, printed) == (2, "kvplan: error: --ctx '1.3k' is not a whole number of tokens (1331.2)\n")
    code, printed = generate.run_line("$ kvplan gpus", tmp_path)
    assert code == 0 and max(map(len, printed.splitlines())) <= 80
    body = "$ kvplan gpus\nold output\n"
    assert generate.example(body, {"head": "2", "note": "the rest"}, tmp_path) == (
        "$ kvplan gpus\n" + "".join(printed.splitlines(keepends=True)[:2]) + "  ... (trimmed: the rest)\n")
