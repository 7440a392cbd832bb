"""docs/api.md runs as written: its ```python blocks are doctests run in order in one namespace, as the cells of a
notebook, and each prints what the block shows. Nothing else in the page may look like an example that is not
run."""

import doctest
import re

import pytest
from conftest import ROOT

PAGE = ROOT / "docs" / "api.md"
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.M | re.S)


def blocks() -> list[tuple[int, str]]:
    text = PAGE.read_text(encoding="utf-8")
    return [(text[:match.start()].count("\n") + 1, match.group(1)) for match in BLOCK.finditer(text)]


def run(found: list[tuple[int, str]]) -> list[str]:
    """Each block's failures (doctest's report), the blocks sharing one namespace."""
    parser, namespace, failures = doctest.DocTestParser(), {}, []
    for line, source in found:
        test = parser.get_doctest(source, namespace, f"docs/api.md:{line}", str(PAGE), line)
        report: list[str] = []
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
        runner.run(test, out=report.append, clear_globs=False)
        namespace = test.globs
        failures += report
    return failures


def test_the_examples_print_what_they_show(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the library, never the network
    found = blocks()
    assert len(found) >= 6 and all(">>> " in source for _, source in found)
    failures = run(found)
    assert not failures, "".join(failures)


def test_a_wrong_example_fails():
    """The check can fail: an example whose shown output is not what it prints."""
    failures = run([(1, ">>> import kvplan\n>>> kvplan.estimate('meta-llama/Llama-3-8B', ctx=8192)"
                        ".kv_bytes_per_sequence\n1073741825\n")])
    assert failures and "1073741824" in "".join(failures)


def test_every_code_block_is_run():
    """A fenced block of Python without prompts would be shown and never run: the page has none."""
    text = PAGE.read_text(encoding="utf-8")
    fences = re.findall(r"^```(\w*)\n", text, re.M)
    assert fences.count("python") == len(blocks())
    assert not [fence for fence in fences if fence in ("py", "python3", "pycon")]


@pytest.mark.parametrize("name", ["estimate", "table", "plan", "load_model", "profile", "schema", "KvplanError"])
def test_the_page_names_every_public_name(name):
    assert f"kvplan.{name}" in PAGE.read_text(encoding="utf-8")
