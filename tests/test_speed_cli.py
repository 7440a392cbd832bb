"""Speed on the command line: `--isl`, `--osl` and the targets `--max-tpot`, `--max-ttft`, `--min-tps` on `estimate`,
`plan`, `table` and `plot`. The measured figures are real vLLM runs of Llama-3.1-70B in fp8 on one H200
(tests/data/speed/calibration.csv, ai-dynamo/aiconfigurator's measurements; tests/data/README.md)."""

import json
import re

import pytest
from conftest import assert_one_line_error, run_cli, run_main, run_python

from kvplan.speed.calibrated import TABLE

LLAMA70B_H200 = ["--model", "meta-llama/Llama-3.1-70B", "--gpu", "h200", "--tp", "1", "--weights-dtype", "fp8",
                 "--isl", "1024", "--osl", "1024"]
# vLLM, Llama-3.1-70B fp8, one H200, requests of 1,024 + 1,024 tokens: concurrency -> (TTFT ms, TPOT ms) measured
# (calibration.csv rows 2026_04_06_llama_3_1_70b_h200_sxm_vllm_fp8_agg_1024x1024_c{4,8,16,32,64}_tp1_ep1)
MEASURED = {4: (202.756, 21.466), 8: (255.468, 22.557), 16: (315.761, 24.724), 32: (465.679, 33.191),
            64: (729.679, 37.438)}
SPEED_KEYS = {"isl", "osl", "speed_concurrency", "decode_step_ms_bound", "decode_step_ms", "ttft_ms_bound", "ttft_ms",
              "tokens_per_s_per_user", "tokens_per_s_per_gpu", "tokens_per_s_per_user_bound",
              "tokens_per_s_per_gpu_bound", "decode_step_binding", "speed_efficiencies", "speed_flags", "speed_error"}
TARGET_KEYS = {"max_tpot_ms", "max_ttft_ms", "min_tokens_per_s_per_user", "speed_fit_users", "speed_fit_limited_by",
               "max_concurrent_users_memory"}


def stated() -> dict:
    """The estimate's error on models and GPUs left out of its fit, as the shipped table's provenance records it
    (benchmarks/speed_fit.py): each figure the larger of leave-one-model-out's and leave-one-GPU-out's."""
    held = json.loads(TABLE.read_text(encoding="utf-8"))["provenance"]["held_out"]
    return {figure: max(held["models"][figure], held["gpus"][figure])
            for figure in ("tpot_median", "tpot_p90", "ttft_median", "ttft_p90")}


def estimate_json(monkeypatch, capsys, *args: str) -> tuple[int, dict]:
    code, out, err = run_main(monkeypatch, capsys, "estimate", *args, "--json")
    assert code in (0, 1), err
    return code, json.loads(out)


def test_estimate_json_answers_with_every_speed_key():
    """The command of the task, in a fresh interpreter: every key, and figures near the measured run (vLLM, 64
    requests: 37.4 ms a token, 730 ms to the first), within the error the estimate states for its runs."""
    result = run_cli("estimate", *LLAMA70B_H200, "--batch", "64", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert SPEED_KEYS <= set(data) and not TARGET_KEYS & set(data)
    assert (data["isl"], data["osl"], data["ctx"], data["speed_concurrency"]) == (1024, 1024, 2048, 64)
    ttft, tpot = MEASURED[64]
    assert data["decode_step_ms_bound"] < tpot and data["ttft_ms_bound"] < ttft
    assert abs(data["decode_step_ms"] / tpot - 1) < stated()["tpot_median"]
    assert abs(data["ttft_ms"] / ttft - 1) < stated()["ttft_p90"]
    assert data["tokens_per_s_per_user"] == pytest.approx(1000 / data["decode_step_ms"])
    assert data["tokens_per_s_per_gpu"] == pytest.approx(64 * 1000 / data["decode_step_ms"])  # one GPU, 64 running
    assert data["tokens_per_s_per_user_bound"] == pytest.approx(1000 / data["decode_step_ms_bound"])
    assert data["decode_step_binding"] == "memory bandwidth"
    assert set(data["speed_efficiencies"]) >= {"weights_bandwidth", "kv_bandwidth", "per_kernel_us"}
    assert data["speed_flags"] == [] and data["speed_error"]["runs"] == 1959


def test_a_tpot_target_serves_fewer_users_than_memory_holds(monkeypatch, capsys):
    """Memory holds 94 requests of 2,048 tokens (vLLM's defaults, tests/test_speed.py). The runs measured 33.2 ms a
    token at 32 requests and 37.4 ms at 64: at most 34 ms, between 32 and 63 users are served, speed binds, and 64
    asked do not fit (exit 1)."""
    code, data = estimate_json(monkeypatch, capsys, *LLAMA70B_H200, "--users", "64", "--max-tpot", "34")
    assert TARGET_KEYS <= set(data) and data["max_concurrent_users_memory"] == 94
    assert 32 <= data["speed_fit_users"] < 64 and data["speed_fit_limited_by"] == "TPOT"
    assert (data["max_concurrent_users"], data["max_concurrent_users_bound"]) == (data["speed_fit_users"], "speed")
    assert code == 1 and not data["fits"] and "TPOT <= 34 ms" in data["reasons"][0]
    assert data["speed_concurrency"] == 64 and data["decode_step_ms"] > 34  # the figures at the users asked


def test_without_users_asked_the_speed_is_that_of_the_users_served(monkeypatch, capsys):
    code, data = estimate_json(monkeypatch, capsys, *LLAMA70B_H200, "--max-tpot", "35")
    assert code == 0 and data["fits"]
    assert data["speed_concurrency"] == data["max_concurrent_users"] == data["speed_fit_users"]
    assert data["decode_step_ms"] <= 35
    code, data = estimate_json(monkeypatch, capsys, *LLAMA70B_H200)  # no target: at what memory holds
    assert data["speed_concurrency"] == data["max_concurrent_users"] == 94


def test_memory_binds_where_the_targets_are_loose(monkeypatch, capsys):
    code, data = estimate_json(monkeypatch, capsys, *LLAMA70B_H200, "--max-tpot", "1000", "--min-tps", "1")
    assert data["speed_fit_users"] >= 94 and data["max_concurrent_users"] == 94
    assert data["max_concurrent_users_bound"] == "memory" and code == 0


def test_a_ttft_target_binds_and_is_named(monkeypatch, capsys):
    """Measured: 466 ms to the first token at 32 requests, 730 at 64: within 600 ms, between 32 and 63."""
    code, data = estimate_json(monkeypatch, capsys, *LLAMA70B_H200, "--max-ttft", "600")
    assert data["speed_fit_limited_by"] == "TTFT" and 32 <= data["max_concurrent_users"] < 64


def test_replicas_split_the_users(monkeypatch, capsys):
    """Two H200s at TP 1 are two instances: 64 users are 32 on each, as fast as 32 on one."""
    _, two = estimate_json(monkeypatch, capsys, *LLAMA70B_H200, "--gpus", "2", "--batch", "64")
    _, one = estimate_json(monkeypatch, capsys, *LLAMA70B_H200, "--batch", "32")
    assert two["speed_concurrency"] == 64 and two["decode_step_ms"] == one["decode_step_ms"]
    assert two["tokens_per_s_per_gpu"] == pytest.approx(one["tokens_per_s_per_gpu"])


def test_ctx_defaults_to_isl_plus_osl_and_may_be_longer(monkeypatch, capsys):
    """Memory is planned at --ctx (what each user may hold), speed at the requests' lengths."""
    _, data = estimate_json(monkeypatch, capsys, *LLAMA70B_H200, "--ctx", "8k", "--batch", "8")
    assert (data["ctx"], data["isl"], data["osl"]) == (8192, 1024, 1024)
    _, short = estimate_json(monkeypatch, capsys, *LLAMA70B_H200, "--batch", "8")
    assert data["decode_step_ms"] == short["decode_step_ms"] and data["kv_bytes_per_sequence"] == 4 * short[
        "kv_bytes_per_sequence"]
    _, data = estimate_json(monkeypatch, capsys, "-m", "llama-3-8b", "--isl", "1k", "--osl", "3k")
    assert data["ctx"] == 4096 and "decode_step_ms" not in data


def test_no_speed_section_but_a_note_where_the_model_cannot_describe_the_deployment(monkeypatch, capsys):
    for args, why in ((["--gpu", "h100", "--engine", "llama.cpp"], "calibrated for"),
                      (["--vram", "80GB"], "GPU from the catalogue"), ([], "GPU from the catalogue"),
                      (["--gpu", "m3-max"], "tensor throughput"), (["--gpu", "2xh100", "--pp", "2"], "pipeline")):
        code, data = estimate_json(monkeypatch, capsys, "-m", "llama-3-8b", "--isl", "1k", "--osl", "1k", *args)
        assert not SPEED_KEYS - {"isl", "osl"} & set(data), args
        assert any(note.startswith("no speed estimate") and why in note for note in data["notes"]), args
        code, out, _ = run_main(monkeypatch, capsys, "estimate", "-m", "llama-3-8b", "--isl", "1k", "--osl", "1k",
                                *args)
        assert "Speed at" not in out and "no speed estimate" in out, args
    _, data = estimate_json(monkeypatch, capsys, "-m", "google/gemma-3-27b-it", "--isl", "1k", "--osl", "1k")
    assert data["notes"][0].startswith("text decoder read from text_config")  # the model's notes stay
    assert data["notes"][-1].startswith("no speed estimate")


@pytest.mark.parametrize("args, fragment", [
    (["--isl", "1k"], "--isl and --osl go together"),
    (["--osl", "1k"], "--isl and --osl go together"),
    ([], "give --ctx, or --isl and --osl"),
    (["--ctx", "1k", "--isl", "1k", "--osl", "1k"], "--ctx 1,024 is shorter than --isl + --osl = 2,048"),
    (["--isl", "0", "--osl", "1k"], "--isl must be at least 1"),
    (["--isl", "1k", "--osl", "1"], "--osl must be at least 2"),
    (["--isl", "1.3k", "--osl", "1k"], "not a whole number"),
    (["--ctx", "8k", "--gpu", "h100", "--max-tpot", "20"], "--max-tpot needs --isl and --osl"),
    (["--isl", "1k", "--osl", "1k", "--max-ttft", "200"], "--max-ttft: the speed model needs a GPU"),
    (["--isl", "1k", "--osl", "1k", "--vram", "80GB", "--min-tps", "20"], "--min-tps: the speed model needs a GPU"),
    (["--isl", "1k", "--osl", "1k", "--gpu", "h100", "--engine", "llama.cpp", "--max-tpot", "20"],
     "calibrated for sglang, tensorrt-llm, vllm, not llama.cpp"),
    (["--isl", "1k", "--osl", "1k", "--gpu", "t4", "--max-tpot", "20"], "tensor throughput"),
    (["--isl", "1k", "--osl", "1k", "--gpu", "2xh100", "--pp", "2", "--max-tpot", "20"], "not pipeline stages"),
    (["--isl", "1k", "--osl", "1k", "--gpu", "h100", "--max-tpot", "0"], "--max-tpot must be a number"),
    (["--isl", "1k", "--osl", "1k", "--gpu", "h100", "--max-ttft", "-5"], "--max-ttft must be a number"),
    (["--isl", "1k", "--osl", "1k", "--gpu", "h100", "--min-tps", "nan"], "--min-tps must be a number"),
    (["--isl", "1k", "--osl", "1k", "--gpu", "h100", "--max-tpot", "inf"], "above 0, got inf"),
    (["--isl", "1k", "--osl", "1k", "--gpu", "h100", "--max-tpot", "fast"], "--max-tpot"),
])
def test_bad_speed_flags_are_one_line(monkeypatch, capsys, args, fragment):
    code, _, err = run_main(monkeypatch, capsys, "estimate", "-m", "llama-3-8b", *args)
    assert_one_line_error(code, err, fragment)


def test_the_speed_block_reads_at_80_columns(monkeypatch, capsys):
    """Beside the capacity block: the bound and the estimate, each label on one line, the stated error read from
    the shipped table, what binds, the users each limit allows."""
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = run_main(monkeypatch, capsys, "estimate", *LLAMA70B_H200, "--users", "64", "--max-tpot", "34")
    block = out[out.index("\nSpeed at 64 users of 1,024 prompt + 1,024 output tokens\n"):]
    lines = block.strip("\n").splitlines()
    assert max(map(len, out.splitlines())) <= 80
    assert lines[1] == "targets: TPOT <= 34 ms" and lines[2].split() == ["bound", "estimate"]
    labels = ["time per output token (TPOT)", "time to first token (TTFT)", "output tokens/s per user",
              "output tokens/s per GPU", "users within the targets", "max users at 2,048 tokens (capacity, above)",
              "users served (speed binds)"]
    for label, row in zip(labels, lines[3:], strict=False):
        assert row.strip().startswith(label) and re.search(r"\d( ms)?$", row), row  # label and figures: one line
    assert lines[3].strip().endswith(" ms") and lines[9].split()[-1] == lines[7].split()[-1]
    error = stated()
    text = " ".join(block.split())
    for figure in ("tpot_median", "tpot_p90", "ttft_median", "ttft_p90"):
        assert f"{error[figure]:.0%}" in text, figure
    assert "1,959 serving runs of 7 models on 4 GPUs; on a model or GPU left out of the fit its median error is" in text
    assert "memory bandwidth binds a decode step" in text
    assert "does not fit: " in text and "(limited by TPOT); 64 asked" in text


def test_flags_of_poor_regimes_are_printed(monkeypatch, capsys):
    """gpt-oss-120b at TP 8 on an H200 board with 4 requests: the speed model flags TP 8 with little work per GPU;
    the flag reaches the text and the JSON."""
    args = ["estimate", "-m", "openai/gpt-oss-120b", "--gpu", "h200", "--tp", "8", "--isl", "1k", "--osl", "1k",
            "--batch", "4"]
    _, data = estimate_json(monkeypatch, capsys, *args[1:])
    assert any(flag.startswith("TP 8 with little work per GPU") for flag in data["speed_flags"])
    monkeypatch.setenv("COLUMNS", "80")
    _, out, _ = run_main(monkeypatch, capsys, *args)
    assert "flag: TP 8 with little work per GPU" in out


def test_estimate_without_isl_imports_no_speed_model():
    code = (
        "import sys\n"
        "from kvplan import cli\n"
        "sys.argv = ['kvplan', 'estimate', '-m', 'llama-3-8b', '--ctx', '8k', '--gpu', 'h100', '--json']\n"
        "cli.main()\n"
        "print('LOADED', [m for m in sys.modules if m.startswith('kvplan.speed')], file=sys.stderr)\n"
    )
    result = run_python(code)
    assert result.returncode == 0 and "LOADED []" in result.stderr, result.stderr


# ---------------------------------------------------------------------------------------------------- plan

GPT_OSS_PLAN = ["plan", "--model", "openai/gpt-oss-120b", "--gpu", "h200", "--isl", "1024", "--osl", "1024",
                "--users", "256"]


def plan_json(monkeypatch, capsys, *args: str) -> tuple[int, dict]:
    code, out, err = run_main(monkeypatch, capsys, *args, "--json")
    assert code in (0, 1), err
    return code, json.loads(out)


def test_plan_under_a_tpot_target_names_the_layouts_that_meet_it(monkeypatch, capsys):
    """Memory alone serves 256 users of gpt-oss-120b on one H200. vLLM measured 24.8 ms a token there at 64
    requests (calibration.csv, gpt_oss_120b_h200_sxm_vllm_fp4_agg_1024x1024_c64_tp1), so at 256 one H200 misses 20
    ms: every layout that meets it has more GPUs, and each row's speed fit and memory fit reach 256."""
    _, memory = plan_json(monkeypatch, capsys, *GPT_OSS_PLAN)
    assert memory["rows"][0]["gpus"] == 1 and memory["rows"][0]["speed_fit_users"] is None
    assert all(row["decode_step_ms"] > 20 for row in memory["rows"] if row["gpus"] == 1)
    code, fast = plan_json(monkeypatch, capsys, *GPT_OSS_PLAN, "--max-tpot", "20")
    assert code == 0 and fast["rows"] and fast["targets"]["max_tpot_ms"] == 20
    for row in fast["rows"]:
        assert row["gpus"] >= 2 and row["pipeline_parallel_size"] == 1
        assert row["speed_fit_users"] >= 256 and row["max_concurrent_users_memory"] >= 256
        assert row["max_concurrent_users"] == min(row["speed_fit_users"], row["max_concurrent_users_memory"])
        assert row["decode_step_ms"] <= 20 and row["ttft_ms"] > row["ttft_ms_bound"]


def test_plan_rows_show_tpot_and_ttft_at_80_columns(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = run_main(monkeypatch, capsys, *GPT_OSS_PLAN, "--max-tpot", "20")
    assert code == 0 and max(map(len, out.splitlines())) <= 80
    assert "configurations that fit within TPOT <= 20 ms" in out
    header = next(line for line in out.splitlines() if "layout" in line)
    assert "TPOT ms" in header and "TTFT ms" in header and "headroom" not in header
    rows = [line for line in out.splitlines() if line.startswith("│")]
    assert rows and all(line.split("│")[2].strip().startswith(("TP", "DP")) for line in rows)  # layouts whole


def test_plan_that_no_layout_meets(monkeypatch, capsys):
    code, data = plan_json(monkeypatch, capsys, *GPT_OSS_PLAN, "--max-tpot", "1")
    assert code == 1 and data["rows"] == []


@pytest.mark.parametrize("args, fragment", [
    (["--users", "8", "--ctx", "8k", "--gpu", "h100", "--max-tpot", "20"], "--max-tpot needs --isl and --osl"),
    (["--users", "8", "--isl", "1k", "--osl", "1k", "--vram", "80GB", "--max-ttft", "500"], "needs a GPU"),
    (["--users", "8", "--isl", "1k", "--osl", "1k", "--gpu", "h100", "--engine", "llama.cpp", "--min-tps", "5"],
     "not llama.cpp"),
    (["--users", "8", "--gpu", "h100"], "give --ctx, or --isl and --osl"),
    (["--users", "8", "--ctx", "1k", "--isl", "1k", "--osl", "1k", "--gpu", "h100"], "is shorter than"),
])
def test_plan_bad_speed_flags_are_one_line(monkeypatch, capsys, args, fragment):
    code, _, err = run_main(monkeypatch, capsys, "plan", "-m", "llama-3-8b", *args)
    assert_one_line_error(code, err, fragment)


# ------------------------------------------------------------------------------------------------ table, plot

TABLE_ARGS = ["table", "--models", "meta-llama/Llama-3.1-8B,openai/gpt-oss-20b", "--gpu", "h100,l40s", "--isl", "1k",
         "--osl", "1k", "--ctx", "2k,8k"]


def csv_records(monkeypatch, capsys, *args: str) -> list[dict]:
    import csv
    import io

    code, out, err = run_main(monkeypatch, capsys, *args, "--format", "csv")
    assert code == 0, err
    return list(csv.DictReader(io.StringIO(out)))


def test_table_records_carry_each_cells_speed_as_estimate_gives_it(monkeypatch, capsys):
    """Every model x ctx x GPU record has the speed keys, at the users memory holds in the cell, the same figures
    `kvplan estimate` gives for that deployment."""
    records = csv_records(monkeypatch, capsys, *TABLE_ARGS)
    assert len(records) == 8
    for record in records:
        assert record["isl"] == record["osl"] == "1024" and record["speed_concurrency"] == record["max_users"]
    llama = next(r for r in records if r["model"] == "meta-llama/Llama-3.1-8B" and r["ctx"] == "8192"
                 and r["gpu"] == "NVIDIA H100 SXM")
    _, data = estimate_json(monkeypatch, capsys, "-m", "meta-llama/Llama-3.1-8B", "--gpu", "h100", "--ctx", "8k",
                            "--isl", "1k", "--osl", "1k")
    assert int(llama["speed_concurrency"]) == data["speed_concurrency"] == 56  # docs/tables.md: 56 users at 8k
    for key in ("decode_step_ms", "ttft_ms", "decode_step_ms_bound", "tokens_per_s_per_gpu"):
        assert float(llama[key]) == pytest.approx(data[key]), key
    at_8 = csv_records(monkeypatch, capsys, *TABLE_ARGS, "--users", "8")
    assert {r["speed_concurrency"] for r in at_8} == {"8"}
    memory_only = csv_records(monkeypatch, capsys, *TABLE_ARGS[:-6], "--ctx", "2k,8k")[0]
    assert not {"isl", "decode_step_ms", "speed_concurrency"} & set(memory_only)


def test_table_pivots_on_the_speed_metrics(monkeypatch, capsys):
    records = csv_records(monkeypatch, capsys, *TABLE_ARGS)
    for metric, key, unit in (("tpot", "decode_step_ms", " (ms)"), ("ttft", "ttft_ms", " (ms)"),
                              ("tps-user", "tokens_per_s_per_user", ""), ("tps-gpu", "tokens_per_s_per_gpu", "")):
        code, out, err = run_main(monkeypatch, capsys, *TABLE_ARGS, "--pivot", "--metric", metric, "--format",
                                  "markdown")
        assert code == 0, err
        header, _, *rows = ([cell.strip() for cell in line.strip("|").split("|")] for line in out.splitlines()[:6])
        assert header[1:] == ["GPU", f"2k{unit}", f"8k{unit}"], header
        first = rows[0]
        expected = next(r for r in records if r["model"] == first[0] and r["gpu"] == first[1] and r["ctx"] == "2048")
        value = float(expected[key])
        shown = f"{value:,.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.2f}"
        assert first[2] == shown.replace(",", "\\,") or first[2] == shown, (metric, first)
        assert "calibrated estimate" in out and "1,024 + 1,024 tokens" in out


def test_table_speed_cells_the_model_cannot_estimate_are_named(monkeypatch, capsys):
    code, out, _ = run_main(monkeypatch, capsys, "table", "-m", "llama-3.1-8b", "--gpu", "h100,t4", "--isl", "1k",
                            "--osl", "1k", "--pivot", "--metric", "tpot", "--format", "markdown")
    assert code == 0 and "n/a" in out and "NVIDIA T4: the speed model needs NVIDIA T4's tensor throughput" in out


@pytest.mark.parametrize("args, fragment", [
    (["--ctx", "8k", "--gpu", "h100", "--pivot", "--metric", "tpot"], "--metric tpot needs --isl and --osl"),
    (["--isl", "1k", "--osl", "1k", "--pivot", "--metric", "ttft"], "--metric ttft needs a GPU"),
    (["--ctx", "8k", "--gpu", "h100", "--users", "8"], "--users sets the concurrency of the speed figures"),
    (["--ctx", "1k,8k", "--isl", "1k", "--osl", "1k", "--gpu", "h100"], "--ctx 1,024 is shorter than"),
    (["--ctx", "8k", "--pivot", "--metric", "speed"], "choose kv, total, users, tpot, ttft, tps-user or tps-gpu"),
    (["--gpu", "h100"], "give --ctx, or --isl and --osl"),
])
def test_table_bad_speed_flags_are_one_line(monkeypatch, capsys, args, fragment):
    code, _, err = run_main(monkeypatch, capsys, "table", "-m", "llama-3.1-8b", *args)
    assert_one_line_error(code, err, fragment)


def test_plot_draws_the_speed_metrics(monkeypatch, capsys, tmp_path):
    """The chart's data (kept in the SVG) are the table's: the estimated TPOT at each context, from isl + osl up
    to 128k by default; TTFT and tokens/s likewise."""
    pytest.importorskip("matplotlib")
    from kvplan import plot

    records = csv_records(monkeypatch, capsys, "table", "-m", "meta-llama/Llama-3.1-8B", "--gpu", "h100", "--isl",
                          "1k", "--osl", "1k", "--ctx", "2k,4k,8k,16k,32k,64k,128k")
    for kind, key in (("tpot", "decode_step_ms"), ("tps-gpu", "tokens_per_s_per_gpu")):
        target = tmp_path / f"{kind}.svg"
        code, _, err = run_main(monkeypatch, capsys, "plot", "-m", "meta-llama/Llama-3.1-8B", "--gpu", "h100",
                                "--isl", "1k", "--osl", "1k", "--kind", kind, "--out", str(target))
        assert code == 0, err
        data = plot.svg_data(target.read_text())
        assert data["kind"] == kind and data["ctx"] == [2048 << i for i in range(7)]
        assert (data["isl"], data["osl"], data["users"]) == (1024, 1024, None)
        assert data["lines"][0]["values"] == pytest.approx([float(r[key]) for r in records])


@pytest.mark.parametrize("args, fragment", [
    (["--gpu", "h100", "--kind", "tpot"], "--kind tpot needs --isl and --osl"),
    (["--isl", "1k", "--osl", "1k", "--kind", "ttft"], "--kind ttft needs a GPU"),
    (["--gpu", "h100", "--isl", "1k", "--osl", "1k", "--kind", "speed"], "choose kv, users, tpot"),
    (["--gpu", "h100", "--isl", "1k", "--osl", "1k", "--kind", "tpot", "--engine", "llama.cpp"],
     "no speed estimate to draw: the speed model is calibrated for sglang, tensorrt-llm, vllm, not llama.cpp"),
])
def test_plot_bad_speed_flags_are_one_line(monkeypatch, capsys, tmp_path, args, fragment):
    code, _, err = run_main(monkeypatch, capsys, "plot", "-m", "llama-3.1-8b", *args, "--out",
                            str(tmp_path / "x.png"))
    assert_one_line_error(code, err, fragment)


def test_an_engine_alias_is_the_engine_it_names():
    """`--engine trtllm` is TensorRT-LLM (its own name for the alias), whose speed the model is calibrated for, in
    plan and table as in estimate."""
    import kvplan

    for command in (kvplan.plan, kvplan.table):
        by_alias, by_name = (command("meta-llama/Llama-3.1-8B", users=16, isl=1024, osl=1024, gpu="h100",
                                     engine=name).model_dump() for name in ("trtllm", "tensorrt-llm"))
        assert by_alias == by_name
        assert "not trtllm" not in json.dumps(by_alias)


def test_mtp_drafting_is_estimated_and_other_drafts_are_flagged(monkeypatch, capsys):
    """SGLang with Qwen3.5's MTP layer drafting (--speculative-num-draft-tokens 4: a chain of 3 drafts), 16 requests
    of 1,024 + 1,024 tokens on 4 B200s at TP 4: measured 10.0 ms a token (calibration.csv,
    2026_04_06_qwen3_5_397b_b200_sxm_sglang_fp8_agg_1024x1024_c16_tp4_ep1_1505, a run of InferenceX's
    qwen3.5-fp8-b200-sglang-mtp). The estimate drafts 3 tokens a step, within the stated p90 of it, and faster than
    one token a step; n-grams are flagged and estimated at one token a step."""
    qwen = ["--model", "Qwen/Qwen3.5-397B-A17B", "--gpu", "b200", "--tp", "4", "--engine", "sglang",
            "--weights-dtype", "fp8", "--isl", "1024", "--osl", "1024", "--batch", "16"]
    _, drafting = estimate_json(monkeypatch, capsys, *qwen, "--speculative-method", "mtp", "--speculative-tokens", "4")
    _, plain = estimate_json(monkeypatch, capsys, *qwen)
    assert any(flag.startswith("speculative decoding: 3 tokens drafted") for flag in drafting["speed_flags"])
    assert abs(drafting["decode_step_ms"] / 10.023 - 1) < stated()["tpot_p90"]
    assert drafting["decode_step_ms"] < plain["decode_step_ms"]
    assert drafting["decode_step_ms_bound"] < plain["decode_step_ms_bound"]
    assert 0 < drafting["speed_efficiencies"]["acceptance"] < 1
    _, ngram = estimate_json(monkeypatch, capsys, *qwen, "--speculative-method", "ngram", "--speculative-tokens", "4")
    assert any("speculative decoding the estimate does not model" in flag for flag in ngram["speed_flags"])
    assert ngram["decode_step_ms"] == pytest.approx(plain["decode_step_ms"], rel=0.05)
    # SGLang's one draft token is the verified one: nothing drafted, so flagged rather than estimated as drafting
    _, one = estimate_json(monkeypatch, capsys, *qwen, "--speculative-method", "mtp", "--speculative-tokens", "1")
    assert any("speculative decoding the estimate does not model" in flag for flag in one["speed_flags"])
