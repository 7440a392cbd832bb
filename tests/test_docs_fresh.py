"""The examples in docs/ are what kvplan prints today: docs/generate.py regenerates them into a temporary
directory and every committed file must match (SVGs drawn by another matplotlib release are compared by the
numbers they plot). To refresh them: python docs/generate.py"""

import pytest
from conftest import ROOT, load_script

pytest.importorskip("matplotlib")


def load_generator():
    return load_script("docs/generate.py", "docs_generate")


def test_docs_examples_are_fresh(tmp_path):
    generate = load_generator()
    written = generate.generate(tmp_path)
    assert len(written) == len(generate.EXAMPLE_COMMANDS) + 1
    stale = generate.stale(tmp_path)
    assert not stale, f"stale docs (run: python docs/generate.py): {', '.join(stale)}"


def test_every_example_is_embedded_or_linked():
    generate = load_generator()
    page = (ROOT / "docs" / generate.PAGE).read_text(encoding="utf-8")
    for name in generate.EXAMPLE_COMMANDS:
        assert f"<!-- generated: {name} -->" in page, name


def test_staleness_is_detected(tmp_path):
    generate = load_generator()
    generate.generate(tmp_path)
    table = tmp_path / "examples" / "table.csv"
    table.write_text(table.read_text().replace("56", "57"), encoding="utf-8")
    assert generate.stale(tmp_path) == ["examples/table.csv"]
