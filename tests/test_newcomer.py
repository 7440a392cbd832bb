"""What a newcomer meets first: installing, --version, -h, shell completion, local models told apart by name,
output at any width, GPU sets, plots, CPU profiles, exit statuses and the small things of `models`, `show`, YAML
specs and --out. The screens at 80 and 120 columns are in test_output_golden.py."""

import json
import sys

from conftest import ROOT, SPECS, assert_one_line_error, raw, run_cli, run_main

from kvplan import __version__

CPU_TORCH = "pip install torch --index-url https://download.pytorch.org/whl/cpu"


def test_the_cpu_only_torch_install_is_given_wherever_the_extra_is(monkeypatch, capsys, tmp_path):
    """`pip install '.[profile]'` alone takes torch's CUDA build from the package index, even on a machine without
    a GPU: the README, profile.md and the missing-torch error give PyTorch's CPU index first."""
    for page in ("README.md", "docs/profile.md"):
        text = (ROOT / page).read_text(encoding="utf-8")
        assert CPU_TORCH in text and "pip install '.[profile]'" in text, page
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError, as where it is missing
    code, _, err = run_main(monkeypatch, capsys, "profile", "--model", "llama-3-8b", "--ctx", "64", "--device",
                            "cpu")
    assert_one_line_error(code, err, "pip install '.[profile]' in kvplan's source directory", CPU_TORCH)


def test_install_lines_work_from_a_clone():
    """kvplan is installed from its source directory, not from the package index: `pip install 'kvplan[profile]'`
    finds no distribution, so no page or message says it. The README's test command names PyTorch's CPU index
    for torch (`torch==2.13.0` from the package index is the CUDA build on Linux), and CI runs that command."""
    import re

    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    sources = [*sorted((ROOT / "kvplan").rglob("*.py"))]
    said = [f"{path.relative_to(ROOT)}:{number}" for path in pages + sources
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
            if re.search(r"install '?kvplan\[", line)]
    assert not said, said
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    (test_line,) = [line for line in readme.splitlines() if line.startswith("pip install torch==")]
    assert test_line.startswith("pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu && ")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()[-1]
    assert ci.replace(" --quiet", "") == test_line


def test_version_help_and_completion(monkeypatch, capsys):
    code, out, _ = run_main(monkeypatch, capsys, "--version")
    assert (code, out.strip()) == (0, f"kvplan {__version__}")
    for args in (["-h"], ["estimate", "-h"], ["table", "-h"]):
        code, out, _ = run_main(monkeypatch, capsys, *args)
        assert code == 0 and out.startswith("Usage: kvplan")
    result = run_cli("--show-completion", "bash")
    assert result.returncode == 0 and "_kvplan_completion" in result.stdout


def test_estimate_help_groups_its_flags_by_what_they_set(monkeypatch, capsys):
    """`estimate --help` listed the flags of five engines in one list: they are under headings, as `vllm serve
    --help` groups its own, each engine's flags under its name; `plan`, `table` and `plot` share them."""
    import re

    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = run_main(monkeypatch, capsys, "estimate", "--help")
    sections = dict(re.findall(r"^(\S[^\n]*):\n((?:  [^\n]*\n|\n(?=  ))+)", out, re.M))
    assert code == 0 and list(sections) == ["Model", "Workload", "Speed targets", "GPUs, engine and budget",
                                            "Parallelism", "Speculative decoding", "vLLM", "vLLM and SGLang",
                                            "SGLang", "llama.cpp", "transformers", "Options"]
    for section, flags in {"Model": ["--model", "--kv-dtype"], "Workload": ["--ctx", "--users", "--isl", "--osl"],
                           "Speed targets": ["--max-tpot", "--max-ttft", "--min-tps"],
                           "GPUs, engine and budget": ["--gpu", "--kv-budget"], "Parallelism": ["--tp", "--dp"],
                           "vLLM": ["--block-size", "--enable-lora"], "SGLang": ["--max-mamba-cache-size"],
                           "llama.cpp": ["--ubatch-size", "--cache-type-k"], "Options": ["--json"],
                           "transformers": ["--cache-implementation"]}.items():
        assert all(flag in sections[section] for flag in flags), section
    for command in ("plan", "table", "plot"):
        code, out, _ = run_main(monkeypatch, capsys, command, "--help")
        assert code == 0 and "\nModel:\n" in out and "\nGPUs, engine and budget:\n" in out, command


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
    assert [row["model"] for row in json.loads(out)["rows"]] == ["llama-local", "qwen-local"]
    named = tmp_path / "my-model.json"
    named.write_text((SPECS / "Qwen__Qwen3-8B.json").read_text(encoding="utf-8").replace('"_name_or_path"', '"x"'),
                     encoding="utf-8")
    code, out, _ = run_main(monkeypatch, capsys, "estimate", "--model", str(named), "--ctx", "8k", "--json")
    assert json.loads(out)["model"] == "my-model"
    saved = tmp_path / "saved"  # save_pretrained writes the repo id as _name_or_path: it names the model
    saved.mkdir()
    data = json.loads((SPECS / "Qwen__Qwen3-8B.json").read_text(encoding="utf-8")) | {"_name_or_path": "Qwen/Qwen3-8B"}
    (saved / "config.json").write_text(json.dumps(data), encoding="utf-8")
    code, out, _ = run_main(monkeypatch, capsys, "show", "--model", str(saved), "--json")
    assert json.loads(out)["name"] == "Qwen/Qwen3-8B"


def test_a_typo_in_a_bundled_name_suggests_it_even_offline(monkeypatch, capsys, tmp_path):
    from conftest import assert_one_line_error
    from hubkit import hub_environment

    hub_environment(monkeypatch, tmp_path / "hf", offline=True)
    code, _, err = run_main(monkeypatch, capsys, "estimate", "--model", "meta-lama/Llama-3-8B", "--ctx", "8k")
    assert_one_line_error(code, err, "HF_HUB_OFFLINE", "did you mean meta-llama/Meta-Llama-3-8B")


def test_a_hub_id_missing_its_suffix_suggests_the_bundled_model_first(monkeypatch, capsys, tmp_path):
    """`meta-llama/Llama-3.2-1B` (the library has the -Instruct model of that size): the name that holds it as
    whole words comes first, before names of other sizes that are spelt alike (3.2-3B, 2-13b)."""
    from hubkit import hub_environment

    from kvplan.sources import library

    assert library.suggestions("meta-llama/Llama-3.2-1B")[0] == "meta-llama/Llama-3.2-1B-Instruct"
    assert library.suggestions("Qwen/Qwen3-8B-Instruct")[0] == "Qwen/Qwen3-8B"  # a name it holds
    hub_environment(monkeypatch, tmp_path / "hf", offline=True)
    code, _, err = run_main(monkeypatch, capsys, "estimate", "--model", "meta-llama/Llama-3.2-1B", "--ctx", "8k")
    assert_one_line_error(code, err, "did you mean meta-llama/Llama-3.2-1B-Instruct or")


def test_a_size_pasted_with_decimals_is_rounded_down_to_a_byte(monkeypatch, capsys):
    """`--kv-budget 64.68GiB`, as a log prints it: 64.68 x 2^30 = 69,449,621,176.32 bytes, rounded down as the
    engines round a size (vLLM keeps int(GiB x 2^30)); a count of bytes itself must still be whole."""
    code, out, err = run_main(monkeypatch, capsys, "estimate", "--model", "llama-3-8b", "--ctx", "8k",
                              "--kv-budget", "64.68GiB", "--json")
    assert code == 0, err
    assert json.loads(out)["kv_budget_bytes"] == 6468 * 2**30 // 100 == 69_449_621_176
    code, _, err = run_main(monkeypatch, capsys, "estimate", "--model", "llama-3-8b", "--ctx", "8k", "--vram",
                            "23.99GiB")
    assert code == 0, err
    code, _, err = run_main(monkeypatch, capsys, "estimate", "--model", "llama-3-8b", "--ctx", "8k",
                            "--kv-budget", "1.5B")
    assert_one_line_error(code, err, "not a whole number of bytes")


# ---------------------------------------------------------------------------------------------- output width


def rendered(width: int, draw) -> str:
    """What `draw(console)` prints on a terminal `width` columns wide (colours off)."""
    import io

    from rich.console import Console

    buffer = io.StringIO()
    draw(Console(file=buffer, width=width, markup=False, color_system=None, force_terminal=True))
    return buffer.getvalue()


def test_ids_and_numbers_are_never_broken_at_80_or_120_columns():
    from kvplan import tables as planning
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


def test_the_readme_counts_the_library_as_it_is():
    from conftest import ROOT

    from kvplan.sources import library

    assert f"the bundled library of {len(library.entries())} popular models" in " ".join(
        (ROOT / "README.md").read_text().split())


def test_piped_output_has_no_trailing_spaces(monkeypatch, capsys):
    for args in (["estimate", "--model", "google/gemma-3-27b-it", "--ctx", "32k", "--gpu", "h100"], ["gpus"],
                 ["show", "--model", "llama-3-8b"], ["models"]):
        code, out, _ = run_main(monkeypatch, capsys, *args)
        assert code == 0
        assert not any(line.endswith(" ") for line in out.splitlines()), args


CAPACITY_RUNS = {  # runs whose capacity block had a label too long for 80 columns, each kind of block
    "MoE on a GPU set": ["--model", "deepseek-v3", "--ctx", "32k", "--gpu", "8xh200", "--users", "64"],
    "DP ranks and EP": ["--model", "deepseek-v3", "--ctx", "32k", "--gpu", "8xh200", "--dp", "8", "--ep", "8"],
    "draft model": ["--model", "llama-3-8b", "--ctx", "8k", "--gpu", "h100", "--draft-model",
                    "llama-3.2-1b-instruct", "--speculative-tokens", "4", "--users", "100"],
    "llama.cpp": ["--model", "llama-3.1-70b", "--ctx", "8k", "--gpu", "h100", "--engine", "llama.cpp"],
    "hybrid under SGLang": ["--model", "granite-4.0-h-small", "--ctx", "128k", "--gpu", "h100", "--engine",
                            "sglang", "--users", "16"],
    "two figures": ["--model", "gemma-3-27b-it", "--ctx", "32k", "--gpu", "h100", "--batch", "8"],
    "mean context, shared prefix": ["--model", "gpt-oss-120b", "--ctx", "32k", "--gpu", "4xh100", "--dp", "4",
                                    "--ep", "4", "--users", "5000", "--avg-ctx", "8k", "--shared-prefix", "1k"],
    "transformers": ["--model", "llama-3-8b", "--ctx", "8k", "--gpu", "rtx-4090", "--engine", "transformers",
                     "--users", "4"],
    "LoRA and offloading": ["--model", "llama-3-8b", "--ctx", "8k", "--gpu", "h100", "--enable-lora", "--max-loras",
                            "4", "--kv-offloading-size", "64", "--cpu-offload-gb", "4", "--users", "1000"],
}


def capacity_block(monkeypatch, args: list[str], width: int) -> list[str]:
    """The label-and-value rows of `kvplan estimate ARGS`' capacity block on a terminal `width` columns wide (the
    real command line, rich at that width): from the GPU's memory (or --kv-budget) to the last figure."""
    from test_output_golden import screen

    lines = screen(["estimate", *args], width, monkeypatch).splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith(("  GPU memory", "  KV budget per GPU")))
    end = next(i for i in range(first, len(lines)) if not lines[i].startswith("  "))
    return lines[first:end]


def test_capacity_rows_stay_single_spaced_at_80_columns(monkeypatch):
    """On an 80-column terminal every label of the capacity block fits beside its value (as many rows as on a
    wide one) and no blank line splits the rows; on a narrower one a label wraps, indented under itself, and the
    rows stay single-spaced."""
    for name, args in CAPACITY_RUNS.items():
        at_80, wide = capacity_block(monkeypatch, args, 80), capacity_block(monkeypatch, args, 200)
        assert len(at_80) == len(wide) and all(line.strip() for line in at_80), (name, "\n".join(at_80))
        assert max(map(len, at_80)) <= 80, name
        narrow = capacity_block(monkeypatch, args, 50)
        assert all(line.strip() for line in narrow), (name, "\n".join(narrow))
    narrow = capacity_block(monkeypatch, CAPACITY_RUNS["MoE on a GPU set"], 50)
    wrapped = next(i for i, line in enumerate(narrow) if line.strip().startswith("max users at 32,768"))
    assert narrow[wrapped + 1].startswith("    tokens") and narrow[wrapped].endswith("21")


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
    rows = {row["gpu"]: row["max_users"] for row in json.loads(out)["rows"]}
    assert rows == {"NVIDIA H100 SXM": 0, "4 x NVIDIA H100 SXM": users("--gpu", "h100", "--gpus", "4")}
    code, out, err = run_main(monkeypatch, capsys, "table", "--models", "llama-3.1-70b", "--ctx", "8k", "--gpu",
                              "4xh100", "--tp", "2", "-f", "json")
    assert json.loads(out)["rows"][0]["max_users"] == users("--gpu", "h100", "--gpus", "4", "--tp", "2")


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
    """Before a CPU run: how long it will take, timed on pilot prefills of the model just built; while it runs,
    with stderr not a terminal, one line per phase; after it, that the first layers held no global layer (Gemma 3:
    every 6th is global)."""
    import pytest

    pytest.importorskip("torch")
    code, out, err = run_main(monkeypatch, capsys, "profile", "--model", "google/gemma-3-1b-it", "--ctx", "40",
                              "--device", "cpu", "--layers", "2", "--decode-steps", "2", "--dtype", "fp32")
    assert code == 0, err
    lines = err.splitlines()
    assert any(line.startswith("note: a CPU profile: about") and "pilot prefills of 9 and 38 tokens" in line
               for line in lines)
    assert any(line.startswith("kvplan: prefill: 1 x 38 tokens: done in") for line in lines)
    assert "hold no full attention layer" in " ".join(out.split()) and "--layers 6" in out


def test_a_cpu_profile_suggests_fp32_where_this_cpu_emulates_bf16(monkeypatch, tmp_path):
    """On a CPU without native bf16 (bf16 matmuls at a tenth of fp32 here) the notice suggests --dtype fp32, and
    not where bf16 is as fast. The rates are the CPU's measurement, set here so that both cases are seen on any
    machine; the estimates it gives are kept in the result beside the times measured."""
    import pytest

    pytest.importorskip("torch")
    from kvplan.profiler import run
    from kvplan.profiler.session import Progress

    notices = []

    class Listen(Progress):
        def notice(self, text):
            notices.append(text)

    path = tmp_path / "llama.json"
    path.write_text(json.dumps({**raw("meta-llama__Meta-Llama-3-8B.json"), "intermediate_size": 64,
                                "vocab_size": 512}), encoding="utf-8")
    for rates in ({"fp32": 300e9, "bf16": 30e9}, {"fp32": 300e9, "bf16": 300e9}):
        monkeypatch.setattr(run, "_matmul_rate", lambda torch, dtype, rates=rates: rates[dtype])
        result = run.run_profile(str(path), 40, 1, device="cpu", dtype="bf16", layers=1, decode_steps=2,
                                 progress=Listen())
        assert result.estimated_prefill_s > 0 and result.estimated_decode_s > 0
    assert "bf16 matmuls at 30 GFLOP/s and fp32 at 300: --dtype fp32 is faster here" in notices[0]
    assert "--dtype fp32" not in notices[1]


# ---------------------------------------------------------------------------------------------- plots and GPU sets


def test_log_axis_labels_share_one_format_with_weights(monkeypatch, capsys, tmp_path):
    """--with-weights spans decades (2 to 70 GiB here): every y label, major (10, 100) and minor (20, 50), is a plain
    number, none in matplotlib's 10^k notation."""
    import re

    import pytest

    pytest.importorskip("matplotlib")
    out = tmp_path / "w.svg"
    code, _, err = run_main(monkeypatch, capsys, "plot", "--models", "llama-3-8b,qwen3-32b", "--gpu", "h100",
                            "--with-weights", "--out", str(out))
    assert code == 0, err
    svg = out.read_text(encoding="utf-8")
    y_axis = svg[svg.index('id="matplotlib.axis_2"'):svg.index("weights + KV cache (GiB)")]
    labels = re.findall(r"<!-- (.*?) -->", y_axis)
    assert {"20", "50", "100"} <= set(labels), labels
    assert all(re.fullmatch(r"\d+(\.\d+)?", label) for label in labels), labels


def test_a_gpu_set_in_a_plot(monkeypatch, capsys, tmp_path):
    """`4xh100` in plot: its memory line is the set's (4 x 81,559 MiB, nvidia-smi's H100 = 318.59 GiB), and --tp
    splits it as in a table."""
    import pytest

    pytest.importorskip("matplotlib")
    out = tmp_path / "set.svg"
    code, _, err = run_main(monkeypatch, capsys, "plot", "--models", "llama-3.1-70b", "--gpu", "h100,4xh100",
                            "--ctx", "8k,32k", "--out", str(out))
    assert code == 0, err
    svg = out.read_text(encoding="utf-8")
    assert "4 x NVIDIA H100 SXM (318.59 GiB)" in svg and "NVIDIA H100 SXM (79.65 GiB)" in svg
    code, _, err = run_main(monkeypatch, capsys, "plot", "--models", "llama-3.1-70b", "--gpu", "4xh100", "--tp", "2",
                            "--kind", "users", "--ctx", "8k,32k", "--out", str(tmp_path / "users.svg"))
    assert code == 0, err
    from kvplan.plot import svg_data

    plotted = svg_data((tmp_path / "users.svg").read_text(encoding="utf-8"))["lines"][0]["values"]
    code, out_, _ = run_main(monkeypatch, capsys, "table", "--models", "llama-3.1-70b", "--gpu", "4xh100", "--tp",
                             "2", "--ctx", "8k,32k", "-f", "json")
    assert plotted == [row["max_users"] for row in json.loads(out_)["rows"]]


# ---------------------------------------------------------------------------------------------- docs for users


def test_docs_speak_to_users():
    """The docs cite upstream sources a user can read (engine source files and releases, papers, model cards), not
    files of the project's own workspace, and do not speak of how the project is run."""
    import re

    internal = re.compile(r"shared/reference|shared/hf_configs|\.\./shared|\bhelpers?\b|\bthe team\b|\bsession\b|"
                          r"\bworktree\b|\bwe scheduled\b|\(issue \d+\)|\bGPU budget\b", re.IGNORECASE)
    pages = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    found = [f"{page.relative_to(ROOT)}:{number}: {line.strip()}" for page in pages
             for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1) if internal.search(line)]
    assert not found, "\n".join(found)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    # what was measured on a GPU, and what was not: the other engines' activation and overhead figures
    assert "**On a GPU**" in readme and "not kvplan measurements" in readme


# ---------------------------------------------------------------------------------------------- small things


def test_the_target_not_fitting_exits_1(monkeypatch, capsys):
    """Scripts branch on it: the plan is printed, and the status says it does not fit (docs/cli.md, exit codes)."""
    code, out, _ = run_main(monkeypatch, capsys, "estimate", "--model", "google/gemma-3-27b-it", "--ctx", "32k",
                            "--gpu", "h100", "--batch", "8")
    assert code == 1 and "does not fit" in out
    code, out, _ = run_main(monkeypatch, capsys, "plan", "--model", "deepseek-v3", "--users", "100", "--ctx", "128k",
                            "--gpu", "rtx-4090", "--max-gpus", "2")
    assert code == 1 and "no configuration" in out
    code, _, _ = run_main(monkeypatch, capsys, "estimate", "--model", "llama-3-8b", "--ctx", "8k", "--gpu", "h100")
    assert code == 0
    assert "| 1 | the plan is printed, and the target does not fit" in (ROOT / "docs" / "cli.md").read_text("utf-8")


def test_models_sorted_and_a_filter_matching_nothing(monkeypatch, capsys):
    code, out, _ = run_main(monkeypatch, capsys, "models", "--json")
    ids = [entry["id"] for entry in json.loads(out)]
    assert code == 0 and ids == sorted(ids, key=str.lower) and len(ids) > 50
    code, _, err = run_main(monkeypatch, capsys, "models", "nonexistent")
    assert_one_line_error(code, err, "no bundled model matches 'nonexistent'")


def test_show_json_is_the_layout_kvplan_read(monkeypatch, capsys):
    code, out, _ = run_main(monkeypatch, capsys, "show", "--model", "llama-3-8b", "--json")
    data = json.loads(out)
    assert code == 0 and data["num_layers"] == 32 and len(data["caches"]) == 32
    assert {cache["kind"] for cache in data["caches"]} == {"full"} and data["caches"][0]["kv_heads"] == 8
    assert data["params"]["total"] == 8_030_261_248  # Llama 3 8B's published count


def test_yaml_specs_take_config_dtype_names(tmp_path):
    from kvplan.sources import load_model

    example = (ROOT / "docs" / "examples" / "hybrid-example.yaml").read_text(encoding="utf-8")
    for written, meant in (("bfloat16", "bf16"), ("float16", "fp16"), ("float32", "fp32")):
        path = tmp_path / f"{written}.yaml"
        path.write_text(example.replace("dtype: bf16 ", f"dtype: {written} "), encoding="utf-8")
        assert load_model(str(path)).dtype == meant


def test_a_quantised_checkpoint_names_its_dtype_once(monkeypatch, capsys):
    """DeepSeek-V3's quant_method is fp8, its weights' dtype too: "weights fp8", not "weights fp8 (fp8)"."""
    code, out, _ = run_main(monkeypatch, capsys, "show", "--model", "deepseek-v3")
    assert code == 0 and "weights fp8," in " ".join(out.split()) and "fp8 (fp8)" not in out


def test_out_says_where_it_wrote(monkeypatch, capsys, tmp_path):
    target = tmp_path / "t.md"
    code, out, err = run_main(monkeypatch, capsys, "table", "--models", "llama-3-8b", "--ctx", "8k", "--out",
                              str(target))
    assert (code, out, err.strip()) == (0, "", f"kvplan: wrote {target}")
    code, out, err = run_main(monkeypatch, capsys, "table", "--models", "llama-3-8b", "--ctx", "8k", "--out",
                              str(target))
    assert err.strip() == f"kvplan: replaced {target}"


def test_the_fast_subset_is_documented():
    """`pytest -m "not torch"` runs the planner's tests alone: the marker is declared and the README says how."""
    assert '"torch: builds models with torch or transformers' in (ROOT / "pyproject.toml").read_text("utf-8")
    assert 'python -m pytest -m "not torch"' in (ROOT / "README.md").read_text(encoding="utf-8")


def test_planning_imports_nothing_it_does_not_use():
    """Start-up (benchmarks/README.md): planning on a GPU reads the catalogue as JSON (no YAML parser) and never
    loads rich's emoji table (codes are not parsed); a run builds only the command it names, and a misspelt one gets
    the whole app, for its suggestions."""
    from conftest import run_python

    code = (
        "import sys\n"
        "from kvplan import cli\n"
        "for args in (['estimate', '-m', 'llama-3-8b', '--ctx', '8k', '--gpu', 'h100'],\n"
        "             ['table', '-m', 'llama-3-8b', '--ctx', '8k', '--gpu', 'h100']):\n"
        "    sys.argv = ['kvplan', *args]\n"
        "    cli.main()\n"
        "print('LOADED', [m for m in ('yaml', 'rich._emoji_codes') if m in sys.modules], file=sys.stderr)\n"
        "print('COMMANDS', len(cli._app_for(['table']).registered_commands),\n"
        "      len(cli._app_for(['tabel']).registered_commands), file=sys.stderr)\n"
    )
    result = run_python(code, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "LOADED []" in result.stderr and "COMMANDS 1 9" in result.stderr, result.stderr


def test_the_startup_floor_takes_estimates_options():
    """benchmarks/cli_floor.py is the floor `kvplan estimate`'s start-up is measured against: a typer app with the
    same options that does nothing. It must keep up with estimate's options, or the ratio flatters kvplan."""
    import ast
    import inspect

    from kvplan import cli

    tree = ast.parse((ROOT / "benchmarks" / "cli_floor.py").read_text(encoding="utf-8"))
    floor = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "estimate")
    assert [arg.arg for arg in floor.args.args] == list(inspect.signature(cli.estimate).parameters)


def test_the_command_runs_without_the_cycle_collector_but_profiles_with_it():
    """The `kvplan` script (`kvplan.main`) switches Python's cycle collector off before its first import, which
    spares a planning run the collector's passes over typer's, pydantic's and rich's objects, and freezes them when
    the command returns, so that the interpreter's last pass at exit skips them (benchmarks/README.md); `kvplan
    profile` switches the collector back on for torch."""
    import tomllib
    from conftest import run_python

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    assert scripts["kvplan"] == "kvplan:main"
    code = (
        "import gc, sys\n"
        "import kvplan\n"
        "sys.argv = ['kvplan', 'estimate', '-m', 'llama-3-8b', '--ctx', '8k', '--json']\n"
        "try:\n"
        "    kvplan.main()\n"
        "finally:\n"
        "    print('COLLECTOR', gc.isenabled(), 'typer' in sys.modules, gc.get_freeze_count() > 1000,\n"
        "          file=sys.stderr)\n"
    )
    result = run_python(code, timeout=120)
    assert result.returncode == 0 and "COLLECTOR False True True" in result.stderr, result.stderr
    source = (ROOT / "kvplan" / "cli.py").read_text(encoding="utf-8")
    profile = source[source.index("def profile("):source.index("_call(api.profile")]
    assert "gc.enable()" in profile
