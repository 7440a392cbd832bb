"""What a newcomer meets first: --version, -h, shell completion, and local models told apart by name."""

import json

from conftest import SPECS, run_cli, run_main

from kvplan import __version__


def test_version_help_and_completion(monkeypatch, capsys):
    code, out, _ = run_main(monkeypatch, capsys, "--version")
    assert (code, out.strip()) == (0, f"kvplan {__version__}")
    for args in (["-h"], ["estimate", "-h"], ["table", "-h"]):
        code, out, _ = run_main(monkeypatch, capsys, *args)
        assert code == 0 and out.startswith("Usage: kvplan")
    result = run_cli("--show-completion", "bash")
    assert result.returncode == 0 and "_kvplan_completion" in result.stdout


def test_the_shell_completes_commands(monkeypatch):
    """The protocol the installed script uses: the shell runs kvplan with _KVPLAN_COMPLETE set."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "_KVPLAN_COMPLETE": "complete_bash", "COMP_WORDS": "kvplan est", "COMP_CWORD": "1"}
    result = subprocess.run([sys.executable, "-m", "kvplan"], capture_output=True, text=True, env=env, timeout=60)
    assert result.stdout.split() == ["estimate"]


def test_local_configs_are_named_by_their_directory(monkeypatch, capsys, tmp_path):
    """Two plain config.json files in a table are two rows you can tell apart, named as their directories."""
    paths = []
    for name, spec in (("llama-local", "meta-llama__Meta-Llama-3-8B.json"), ("qwen-local", "Qwen__Qwen3-8B.json")):
        data = json.loads((SPECS / spec).read_text(encoding="utf-8"))
        data.pop("_name_or_path", None)
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(data), encoding="utf-8")
        paths.append(str(tmp_path / name / "config.json"))
    code, out, err = run_main(monkeypatch, capsys, "table", "--models", ",".join(paths), "--ctx", "8k", "-f",
                              "json")
    assert code == 0, err
    assert [row["model"] for row in json.loads(out)] == ["llama-local", "qwen-local"]
    named = tmp_path / "my-model.json"
    named.write_text((SPECS / "Qwen__Qwen3-8B.json").read_text(encoding="utf-8").replace('"_name_or_path"', '"x"'),
                     encoding="utf-8")
    code, out, _ = run_main(monkeypatch, capsys, "estimate", "--model", str(named), "--ctx", "8k", "--json")
    assert json.loads(out)["model"] == "my-model"


def test_a_typo_in_a_bundled_name_suggests_it_even_offline(monkeypatch, capsys, tmp_path):
    from conftest import assert_one_line_error
    from hubkit import hub_environment

    hub_environment(monkeypatch, tmp_path / "hf", offline=True)
    code, _, err = run_main(monkeypatch, capsys, "estimate", "--model", "meta-lama/Llama-3-8B", "--ctx", "8k")
    assert_one_line_error(code, err, "HF_HUB_OFFLINE", "did you mean meta-llama/Meta-Llama-3-8B")


# ---------------------------------------------------------------------------------------------- output width


def rendered(width: int, draw) -> str:
    """What `draw(console)` prints on a terminal `width` columns wide (colours off)."""
    import io

    from rich.console import Console

    buffer = io.StringIO()
    draw(Console(file=buffer, width=width, markup=False, color_system=None, force_terminal=True))
    return buffer.getvalue()


def test_ids_and_numbers_are_never_broken_at_80_or_120_columns():
    from kvplan import table as planning
    from kvplan.gpus import catalogue
    from kvplan.report import print_gpus

    models = ["meta-llama/Llama-3.1-8B", "Qwen/Qwen3-32B", "deepseek-ai/DeepSeek-V3"]
    result = planning.build(models, [4096, 131072], batch=1, gpus=planning.parse_gpus("h100,l40s,rtx-4090", None))
    numbers = {cell for row in result.rows for cell in [c.cell(row) for c in planning.text_columns(result)][1:]}
    for width in (80, 120):
        text = rendered(width, lambda c: planning.print_rich(c, result))
        assert all(model in text for model in models)
        assert all(number in text for number in numbers)  # every figure whole, on one line
        gpus = rendered(width, lambda c: print_gpus(c, catalogue()))
        assert all(gpu.name in gpus and all(alias in gpus for alias in gpu.aliases[:1]) for gpu in catalogue())


def test_models_lists_every_id_and_alias_whole(monkeypatch, capsys):
    from kvplan.sources import library

    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = run_main(monkeypatch, capsys, "models")
    assert code == 0 and "…" not in out
    for entry in library.entries():
        assert entry.id in out and all(alias in out for alias in entry.aliases)


def test_piped_output_has_no_trailing_spaces(monkeypatch, capsys):
    for args in (["estimate", "--model", "google/gemma-3-27b-it", "--ctx", "32k", "--gpu", "h100"], ["gpus"],
                 ["show", "--model", "llama-3-8b"], ["models"]):
        code, out, _ = run_main(monkeypatch, capsys, *args)
        assert code == 0
        assert not any(line.endswith(" ") for line in out.splitlines()), args


def test_a_wrapped_capacity_label_is_set_off_from_the_next_row():
    """Too narrow for a label and its value: a blank line after each row, so a label's second line is not read as
    a row of its own."""
    from kvplan.capacity import Hardware, Workload, capacity
    from kvplan.report import print_capacity
    from kvplan.sources import load_model

    cap = capacity(load_model("google/gemma-3-27b-it"), Workload(ctx=32768, users=8),
                   hardware=Hardware(name="H100", memory_bytes=80 * 2**30))
    def after_gpu_memory(width: int) -> str:
        lines = rendered(width, lambda c: print_capacity(c, cap)).splitlines()
        return next(lines[i + 1] for i, line in enumerate(lines) if "GPU memory" in line).strip()

    assert after_gpu_memory(50) == "" and after_gpu_memory(120).startswith("x memory fraction")


# ---------------------------------------------------------------------------------------------- GPU sets


def test_a_gpu_set_is_named_wherever_a_gpu_is(monkeypatch, capsys):
    """`4xh100` in --gpu is --gpu h100 --gpus 4, in estimate and in table, where each GPU set gets its column."""
    def users(*args) -> int:
        code, out, err = run_main(monkeypatch, capsys, "estimate", "--model", "llama-3.1-70b", "--ctx", "8k",
                                  "--json", *args)
        assert code in (0, 1), err
        return json.loads(out)["max_concurrent_users"]

    assert users("--gpu", "4xh100") == users("--gpu", "h100", "--gpus", "4") == users("--gpu", "4 x H100") > 0
    assert users("--gpu", "4xh100", "--tp", "2") == users("--gpu", "h100", "--gpus", "4", "--tp", "2")
    code, out, err = run_main(monkeypatch, capsys, "table", "--models", "llama-3.1-70b", "--ctx", "8k", "--gpu",
                              "h100,4xh100", "-f", "json")
    assert code == 0, err
    rows = {row["gpu"]: row["max_users"] for row in json.loads(out)}
    assert rows == {"NVIDIA H100 SXM": 0, "4 x NVIDIA H100 SXM": users("--gpu", "h100", "--gpus", "4")}
    code, out, err = run_main(monkeypatch, capsys, "table", "--models", "llama-3.1-70b", "--ctx", "8k", "--gpu",
                              "4xh100", "--tp", "2", "-f", "json")
    assert json.loads(out)[0]["max_users"] == users("--gpu", "h100", "--gpus", "4", "--tp", "2")


def test_gpu_counts_that_disagree_are_one_line(monkeypatch, capsys):
    from conftest import assert_one_line_error

    code, _, err = run_main(monkeypatch, capsys, "estimate", "--model", "llama-3-8b", "--ctx", "8k", "--gpu",
                            "4xh100", "--gpus", "8")
    assert_one_line_error(code, err, "give the count once")
    code, _, err = run_main(monkeypatch, capsys, "plan", "--model", "llama-3-8b", "--ctx", "8k", "--users", "4",
                            "--gpu", "4xh100")
    assert_one_line_error(code, err, "plan finds the GPU count itself")
    code, _, err = run_main(monkeypatch, capsys, "table", "--models", "llama-3-8b", "--ctx", "8k", "--gpu",
                            "0xh100")
    assert_one_line_error(code, err, "between 1 and")


# ---------------------------------------------------------------------------------------------- plots


def test_gpu_lines_close_together_share_one_label(monkeypatch, capsys, tmp_path):
    """An H100's 79.65 GiB and an A100's 80 GiB would overprint two labels: they share one."""
    import pytest

    pytest.importorskip("matplotlib")
    out = tmp_path / "kv.svg"
    code, _, err = run_main(monkeypatch, capsys, "plot", "--models", "llama-3-8b", "--gpu", "h100,a100-80gb,l40s",
                            "--ctx", "4k,8k", "--out", str(out))
    assert code == 0, err
    svg = out.read_text(encoding="utf-8")
    # SVG text is drawn as paths (svg.fonttype path); the label strings are kept as comments beside them
    assert svg.count("NVIDIA L40S (44.99 GiB)") == 1
    assert "NVIDIA A100 80GB SXM (80.00 GiB), NVIDIA H100 SXM (79.65 GiB)" in svg


def test_too_many_models_for_one_chart_is_one_line(monkeypatch, capsys, tmp_path):
    from conftest import assert_one_line_error

    code, _, err = run_main(monkeypatch, capsys, "plot", "--filter", "qwen", "--ctx", "4k", "--out",
                            str(tmp_path / "x.png"))
    assert_one_line_error(code, err, "cannot be told apart", "at most 10")


# ---------------------------------------------------------------------------------------------- CPU profiles


def test_a_cpu_profile_says_what_it_costs_and_what_it_leaves_out(monkeypatch, capsys):
    """Before a CPU run: its matmul work and this CPU's measured rate; while it runs, with stderr not a terminal,
    one line per phase; after it, that the first layers held no global layer (Gemma 3: every 6th is global)."""
    import pytest

    pytest.importorskip("torch")
    code, out, err = run_main(monkeypatch, capsys, "profile", "--model", "google/gemma-3-1b-it", "--ctx", "40",
                              "--device", "cpu", "--layers", "2", "--decode-steps", "2", "--dtype", "fp32")
    assert code == 0, err
    lines = err.splitlines()
    assert any("FLOP of matmuls" in line and "GFLOP/s" in line for line in lines)
    assert any(line.startswith("kvplan: prefill: 1 x 38 tokens: done in") for line in lines)
    assert "hold no full attention layer" in " ".join(out.split()) and "--layers 6" in out
