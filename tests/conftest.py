"""Shared fixtures. Expected numbers in the tests come from published architecture facts and hand arithmetic
written out in each test, never from kvplan itself."""

import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

# One torch thread per test process, set before torch is first imported: pytest-xdist runs a process per core, and
# torch's own threads on top of those oversubscribe the cores (the architecture sweep took 2.4x as long).
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402

from kvplan.sources.hf_config import read_config_file  # noqa: E402

# A bug in kvplan raises in the tests, traceback and all, instead of becoming the one line users see (`cli.main`).
os.environ["KVPLAN_DEBUG"] = "1"

ROOT = Path(__file__).resolve().parent.parent
SPECS = ROOT / "model_specs"
DATA = ROOT / "tests" / "data"  # third-party data the tests read, each file's source in its README.md
SHARED_CONFIGS = ROOT.parent / "shared" / "hf_configs"

GB = 10**9
MiB = 2**20
GiB = 2**30


def load(filename: str):
    """A genuine config.json copy from model_specs/, read by kvplan's config reader."""
    return read_config_file(SPECS / filename)


def raw(filename: str) -> dict:
    """The config.json dict itself (for building variants of a genuine config)."""
    return json.loads((SPECS / filename).read_text(encoding="utf-8"))


def load_script(path: str, name: str):
    """A script of the repository (docs/generate.py, benchmarks/...) as a module, run from its file."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_cli(*args: str, timeout: float = 60, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The real command line, in a fresh interpreter."""
    return subprocess.run(
        [sys.executable, "-m", "kvplan", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd or ROOT,
    )


def run_main(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """kvplan.cli.main() in this process, as the console script runs it: (exit status, stdout, stderr)."""
    from kvplan import cli

    monkeypatch.setattr(sys, "argv", ["kvplan", *args])
    code = 0
    try:
        cli.main()
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code: int, err: str, *fragments: str) -> None:
    """Bad input: exit 2 and one line on stderr, "kvplan: error: ...", holding each fragment; no traceback."""
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("kvplan: error:"), err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment.lower() in lines[0].lower(), (fragment, lines[0])


def assert_error_after_progress(code: int, err: str, *fragments: str) -> None:
    """A profile failing part-way: the notice and the phase lines it printed before ("note: ...", "kvplan: ..."),
    then the one error line."""
    lines = err.strip().splitlines()
    started = [line for line in lines if line.startswith("note: ") or
               (line.startswith("kvplan: ") and not line.startswith("kvplan: error:"))]
    assert lines[:len(started)] == started, err
    assert_one_line_error(code, "\n".join(lines[len(started):]), *fragments)


def run_python(code: str, timeout: float = 30) -> subprocess.CompletedProcess:
    """A snippet in a fresh interpreter, killed after `timeout` seconds (for things that must finish
    quickly)."""
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )


@pytest.fixture
def write_json(tmp_path):
    def write(data, name: str = "config.json") -> Path:
        path = tmp_path / name
        path.write_text(json.dumps(data) if not isinstance(data, str) else data, encoding="utf-8")
        return path

    return write


# Tests that build models with torch or transformers: marked `torch`, so that `pytest -m "not torch"` runs the rest
# (the planner's) in well under a minute.
MODULE_NEEDS_TORCH = re.compile(r'^(\w+ = )?pytest\.importorskip\("(torch|transformers)"\)', re.MULTILINE)
TEST_NEEDS_TORCH = re.compile(r'importorskip\("(torch|transformers)"\)')


def pytest_collection_modifyitems(items):
    sources: dict[str, bool] = {}
    for item in items:
        module = item.module.__name__
        if module not in sources:
            sources[module] = bool(MODULE_NEEDS_TORCH.search(inspect.getsource(item.module)))
        if sources[module] or TEST_NEEDS_TORCH.search(inspect.getsource(item.function)):
            item.add_marker(pytest.mark.torch)

