"""`kvplan plot`: PNG and SVG files, deterministic SVG carrying the plotted numbers, and one-line errors."""

import sys

import pytest
from conftest import GiB, assert_one_line_error, run_main

from kvplan import plot
from kvplan import tables as planning

pytest.importorskip("matplotlib")

LLAMA31 = "meta-llama/Llama-3.1-8B"
MODELS = f"{LLAMA31},openai/gpt-oss-20b"
KV_PER_TOKEN = 32 * 8 * 128 * 2 * 2  # Llama-3.1-8B: layers x KV heads x head_dim x (K, V) x bf16 bytes
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_kv_png(monkeypatch, capsys, tmp_path):
    target = tmp_path / "kv.png"
    code, out, err = run_main(monkeypatch, capsys, "plot", "-m", MODELS, "--gpu", "h100,l40s", "--out",
                              str(target))
    assert code == 0, err
    assert out == "" and target.read_bytes().startswith(PNG_SIGNATURE)
    assert target.stat().st_size > 20_000  # a real chart, not an empty canvas


def test_users_png_and_linear(monkeypatch, capsys, tmp_path):
    target = tmp_path / "users.png"
    code, _, err = run_main(monkeypatch, capsys, "plot", "-m", MODELS, "--gpu", "h100", "--kind", "users",
                            "--y-scale", "linear", "--title", "Users", "--out", str(target))
    assert code == 0, err
    assert target.read_bytes().startswith(PNG_SIGNATURE)


def test_svg_is_deterministic_and_carries_the_data(monkeypatch, capsys, tmp_path):
    first, second = tmp_path / "a.svg", tmp_path / "b.svg"
    for target in (first, second):
        code, _, err = run_main(monkeypatch, capsys, "plot", "-m", MODELS, "--ctx", "1k,8k,32k", "--gpu",
                                "h100", "--out", str(target))
        assert code == 0, err
    assert first.read_bytes() == second.read_bytes()
    text = first.read_text()
    assert "<dc:date>" not in text
    data = plot.svg_data(text)
    assert data["kind"] == "kv" and data["ctx"] == [1024, 8192, 32768]
    llama = next(line for line in data["lines"] if line["model"] == LLAMA31)
    assert llama["values"] == [KV_PER_TOKEN * n for n in (1024, 8192, 32768)]  # 1 GiB at 8k
    assert llama["values"][1] == GiB
    assert data["gpus"] == [{"label": "NVIDIA H100 SXM", "memory_bytes": 81_559 * 2**20}]


def test_series_users_and_weights():
    table = planning.build([LLAMA31], [4096, 8192], gpus=planning.parse_gpus("h100", None))
    users = plot.series(table, "users")
    assert users["lines"] == [{"model": LLAMA31, "gpu": "NVIDIA H100 SXM", "values": [112, 56],
                               "beyond_max_context": [False, False]}]
    weights = plot.series(table, "kv", with_weights=True)["lines"][0]["values"]
    assert weights == [8_030_261_248 * 2 + KV_PER_TOKEN * n for n in (4096, 8192)]


def test_matplotlib_missing_is_one_line(monkeypatch, capsys, tmp_path):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    code, _, err = run_main(monkeypatch, capsys, "plot", "-m", LLAMA31, "--out", str(tmp_path / "x.png"))
    assert_one_line_error(code, err, "needs matplotlib", "pip install '.[plot]' in kvplan's source directory")


@pytest.mark.parametrize("args, fragment", [
    (["--out", "chart.pdf"], "must end in .png or .svg"),
    (["--out", "chart.png", "--kind", "users"], "needs a gpu"),
    (["--out", "chart.png", "--kind", "pie"], "unknown --kind"),
    (["--out", "chart.png", "--y-scale", "cubic"], "unknown --y-scale"),
    (["--out", "chart.png", "--ctx", ""], "--ctx is empty"),
])
def test_bad_input(monkeypatch, capsys, tmp_path, args, fragment):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_main(monkeypatch, capsys, "plot", "-m", LLAMA31, *args)
    assert_one_line_error(code, err, fragment)
    assert not list(tmp_path.iterdir())  # nothing written


def test_unwritable_and_unknown_model(monkeypatch, capsys, tmp_path):
    target = tmp_path / "no" / "dir" / "x.svg"
    code, _, err = run_main(monkeypatch, capsys, "plot", "-m", LLAMA31, "--out", str(target))
    assert_one_line_error(code, err, "cannot write", str(target))
    code, _, err = run_main(monkeypatch, capsys, "plot", "-m", f"{LLAMA31},no-such-model", "--out",
                            str(tmp_path / "x.svg"))
    assert_one_line_error(code, err, "no-such-model")
    assert not (tmp_path / "x.svg").exists()
    code, _, err = run_main(monkeypatch, capsys, "plot", "-m", f"{LLAMA31},no-such-model", "--keep-going",
                            "--out", str(tmp_path / "x.svg"))
    assert_one_line_error(code, err, "no-such-model")
    assert plot.svg_data((tmp_path / "x.svg").read_text())["lines"][0]["model"] == LLAMA31
