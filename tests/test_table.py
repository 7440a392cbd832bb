"""`kvplan table`: the numbers (hand arithmetic from published architecture facts, never kvplan's own output),
the shape of each format parsed back, and one-line errors with exit 2 for every kind of bad input."""

import csv
import io
import json

import pytest
from conftest import GiB, assert_one_line_error, run_cli, run_main, run_python

from kvplan import tables as planning

LLAMA3 = "meta-llama/Meta-Llama-3-8B"  # max context 8,192
LLAMA31 = "meta-llama/Llama-3.1-8B"  # max context 131,072
# Llama-3-8B and 3.1-8B: 32 layers x 8 KV heads x head_dim 128 x 2 (K and V) x 2 bytes (bf16)
KV_PER_TOKEN = 32 * 8 * 128 * 2 * 2  # 131,072 B = 128 KiB
WEIGHTS = 8_030_261_248 * 2  # published parameter count x 2 bytes (bf16) = 16,060,522,496 B
# vLLM 0.33 on an H100 SXM (81,559 MiB as the driver reports it), docs/engines.md:
# budget = ceil(85,520,809,984 x 0.92) - weights - (1.25 GiB activations at 8,192 batched tokens
#          + 0.5 GiB non-torch + 0.5 GiB CUDA graphs) = 78,679,145,186 - 16,060,522,496 - 2,415,919,104
H100_BYTES = 81_559 * 2**20
H100_BUDGET = 78_679_145_186 - WEIGHTS - 2_415_919_104  # 60,202,703,586
# blocks of 16 tokens x 131,072 B = 2 MiB: 28,706 in the budget, one of them vLLM's null block
H100_BLOCKS = H100_BUDGET // (16 * KV_PER_TOKEN) - 1  # 28,705


def h100_users(ctx: int) -> int:
    return H100_BLOCKS // (ctx // 16)


def parse_markdown(text: str) -> tuple[list[str], list[str], list[list[str]]]:
    """A GitHub table back into (headers, separator cells, rows); checks the shape on the way."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    assert len({len(line) for line in lines}) == 1, "every line of the table is padded to the same width"

    def cells(line: str) -> list[str]:
        assert line.startswith("| ") and line.endswith(" |"), line
        return [c.strip() for c in line[2:-2].split(" | ")]

    head, rule, *rows = (cells(line) for line in lines)
    assert all(len(row) == len(head) for row in [rule, *rows])
    return head, rule, rows


# ---------------------------------------------------------------------------------------------- the numbers


def test_hand_values_markdown(monkeypatch, capsys):
    code, out, err = run_main(monkeypatch, capsys, "table", "-m", LLAMA31, "--ctx", "4k,8k,32k", "--gpu",
                              "h100", "--format", "markdown")
    assert code == 0, err
    head, rule, rows = parse_markdown(out)
    assert head == ["model", "ctx", "dtype (W / KV)", "KV / token (KiB)", "KV / seq (GiB)", "weights (GiB)",
                    "total, 1 user (GiB)", "users, h100"]
    assert "\nusers: max users in steady decode with vllm 0.33.0 (h100: NVIDIA H100 SXM)\n" in out
    # numbers right-aligned, text left
    assert [r.endswith(":") for r in rule] == [False, True, False, True, True, True, True, True]
    assert all(set(r.rstrip(":")) == {"-"} for r in rule)
    by_ctx = {row[1]: row for row in rows}
    assert list(by_ctx) == ["4k", "8k", "32k"]
    eight = by_ctx["8k"]
    assert eight[0] == LLAMA31 and eight[2] == "bf16 / bf16"
    assert eight[3] == "128.00"  # 131,072 B / 1,024
    assert eight[4] == "1.00"  # 131,072 x 8,192 = 2^30
    assert eight[5] == "14.96"  # 16,060,522,496 / 2^30 = 14.957
    assert eight[6] == "15.96"  # weights + one sequence
    assert by_ctx["32k"][4] == "4.00"
    assert [by_ctx[c][7] for c in ("4k", "8k", "32k")] == [str(h100_users(n)) for n in (4096, 8192, 32768)]
    assert [h100_users(n) for n in (4096, 8192, 32768)] == [112, 56, 14]
    assert "\\*" not in out  # no context here is beyond Llama-3.1's 131,072


def test_csv_is_raw_bytes(monkeypatch, capsys):
    code, out, err = run_main(monkeypatch, capsys, "table", "-m", f"{LLAMA31},openai/gpt-oss-20b", "--ctx",
                              "8k,32k", "--gpu", "h100,l40s", "--format", "csv")
    assert code == 0, err
    records = list(csv.DictReader(io.StringIO(out)))
    assert list(records[0]) == [*planning.FIELDS, *planning.GPU_FIELDS]
    assert len(records) == 2 * 2 * 2  # model x ctx x GPU
    row = next(r for r in records
               if r["model"] == LLAMA31 and r["ctx"] == "8192" and r["gpu"] == "NVIDIA H100 SXM")
    assert int(row["kv_bytes_per_token"]) == KV_PER_TOKEN
    assert int(row["kv_bytes_per_sequence"]) == KV_PER_TOKEN * 8192 == GiB
    assert int(row["weights_bytes"]) == WEIGHTS
    assert int(row["total_bytes"]) == WEIGHTS + GiB
    assert int(row["gpu_memory_bytes"]) == H100_BYTES
    assert int(row["kv_budget_bytes"]) == H100_BUDGET
    assert int(row["engine_kv_bytes_per_user"]) == GiB  # 512 blocks of 16 tokens, no rounding at 8k
    assert int(row["max_users"]) == 56
    assert (row["batch"], row["max_context"], row["beyond_max_context"]) == ("1", "131072", "false")
    assert (row["engine"], row["engine_version"]) == ("vllm", "0.33.0")
    # gpt-oss-20b: 24 layers x 8 KV heads x 64 x 2 x 2 B (bf16: vLLM loads the fp32 config in bf16) = 49,152 B
    oss = next(r for r in records if r["model"] == "openai/gpt-oss-20b" and r["ctx"] == "8192")
    assert int(oss["kv_bytes_per_token"]) == 49_152
    assert (oss["kv_dtype"], oss["weights_dtype"]) == ("bf16", "mxfp4")
    # 12 full layers x 8,192 tokens + 12 sliding layers x 128 tokens, 2,048 B per layer-token
    assert int(oss["kv_bytes_per_sequence"]) == 12 * 2048 * 8192 + 12 * 2048 * 128
    for record in records:  # sizes are whole numbers of bytes, never unit strings
        for key in ("kv_bytes_per_token", "kv_bytes_per_sequence", "weights_bytes", "total_bytes",
                    "gpu_memory_bytes", "kv_budget_bytes", "engine_kv_bytes_per_user", "max_users"):
            assert record[key].isdigit(), (key, record[key])


def test_json_records_match_csv(monkeypatch, capsys):
    args = ("table", "-m", LLAMA31, "--ctx", "8k", "--gpu", "h100")
    code, out, err = run_main(monkeypatch, capsys, *args, "--format", "json")
    assert code == 0, err
    document = json.loads(out)
    assert list(document) == ["schema_version", "rows", "failures"] and document["failures"] == []
    data = document["rows"]
    assert isinstance(data, list) and len(data) == 1
    assert list(data[0]) == [*planning.FIELDS, *planning.GPU_FIELDS]
    assert data[0]["kv_bytes_per_sequence"] == GiB and data[0]["max_users"] == 56
    assert data[0]["beyond_max_context"] is False
    _, csv_out, _ = run_main(monkeypatch, capsys, *args, "--format", "csv")
    (record,) = csv.DictReader(io.StringIO(csv_out))
    assert {k: "" if v is None else str(v).lower() for k, v in data[0].items()} == {k: v.lower() for k, v in
                                                                                    record.items()}


def test_without_gpu_no_users_column(monkeypatch, capsys):
    code, out, err = run_main(monkeypatch, capsys, "table", "-m", LLAMA31, "--ctx", "8k", "-f", "csv")
    assert code == 0, err
    (record,) = csv.DictReader(io.StringIO(out))
    assert list(record) == list(planning.FIELDS)
    code, out, err = run_main(monkeypatch, capsys, "table", "-m", LLAMA31, "--ctx", "8k", "-f", "md")
    head, _, _ = parse_markdown(out)
    assert not any("max users" in h for h in head)


def test_batch_multiplies_kv_in_total(monkeypatch, capsys):
    code, out, err = run_main(monkeypatch, capsys, "table", "-m", LLAMA31, "--ctx", "8k", "--batch", "8",
                              "-f", "json")
    assert code == 0, err
    (record,) = json.loads(out)["rows"]
    assert record["total_bytes"] == WEIGHTS + 8 * GiB and record["kv_bytes_per_sequence"] == GiB
    _, md, _ = run_main(monkeypatch, capsys, "table", "-m", LLAMA31, "--ctx", "8k", "--batch", "8",
                        "-f", "md")
    head, _, rows = parse_markdown(md)
    assert "total, 8 users (GiB)" in head
    assert rows[0][head.index("total, 8 users (GiB)")] == "22.96"  # 14.96 + 8.00


def test_beyond_max_context_is_marked(monkeypatch, capsys):
    code, out, err = run_main(monkeypatch, capsys, "table", "-m", LLAMA3, "--ctx", "8k,32k", "-f", "md")
    assert code == 0, err
    _, _, rows = parse_markdown(out)
    assert [r[1] for r in rows] == ["8k", "32k\\*"]  # escaped so GitHub shows a literal *
    assert "beyond the model's max context" in out and "8,192 tokens" in out
    _, data, _ = run_main(monkeypatch, capsys, "table", "-m", LLAMA3, "--ctx", "8k,32k", "-f", "json")
    assert [r["beyond_max_context"] for r in json.loads(data)["rows"]] == [False, True]


def test_engine_rules_and_vram(monkeypatch, capsys):
    """llama.cpp caches fp16 and pads; a --vram GPU is named by its size."""
    code, out, err = run_main(monkeypatch, capsys, "table", "-m", LLAMA31, "--ctx", "8k", "--vram", "24GiB",
                              "--engine", "llama.cpp", "-f", "json")
    assert code == 0, err
    (record,) = json.loads(out)["rows"]
    assert record["kv_dtype"] == "fp16" and record["engine"] == "llama.cpp"
    assert record["gpu"] == "24.00 GiB GPU" and record["gpu_memory_bytes"] == 24 * GiB
    # 24 GiB - 13.98 GiB weights on the GPU (14.96 GiB less the 0.98 GiB of token embeddings llama.cpp keeps in
    # host memory) - 0.5 GiB CUDA context = 9.52 GiB: 9 users of 1 GiB (9 x 8,192 cells, a multiple of llama.cpp's
    # 256-cell padding) and a compute buffer of about 0.3 GiB; 10 would need 10 GiB
    assert record["max_users"] == 9


def test_no_kv_cache_model_has_no_user_bound(monkeypatch, capsys):
    code, out, err = run_main(monkeypatch, capsys, "table", "-m", "google-bert/bert-base-uncased", "--ctx",
                              "512", "--gpu", "h100", "-f", "json")
    assert code == 0, err
    (record,) = json.loads(out)["rows"]
    assert record["kv_bytes_per_sequence"] == 0 and record["max_users"] is None
    _, md, _ = run_main(monkeypatch, capsys, "table", "-m", "google-bert/bert-base-uncased", "--ctx", "512",
                        "--gpu", "h100", "-f", "md")
    assert parse_markdown(md)[2][0][-1] == "-"


def test_pivot(monkeypatch, capsys):
    code, out, err = run_main(monkeypatch, capsys, "table", "-m", f"{LLAMA31},{LLAMA3}", "--ctx", "4k,8k,32k",
                              "--gpu", "h100,l40s", "--pivot", "-f", "md")
    assert code == 0, err
    head, rule, rows = parse_markdown(out)
    assert head == ["model (users)", "GPU", "4k", "8k", "32k"]
    assert "users: max users in steady decode with vllm 0.33.0 (h100: NVIDIA H100 SXM; l40s: NVIDIA L40S)" in out
    assert rows[0] == [LLAMA31, "NVIDIA H100 SXM", "112", "56", "14"]
    assert len(rows) == 4 and rows[3][4] == "6\\*"  # Llama-3-8B at 32k: starred
    code, out, err = run_main(monkeypatch, capsys, "table", "-m", LLAMA31, "--ctx", "4k,8k", "--pivot",
                              "-f", "md")
    head, _, rows = parse_markdown(out)
    assert head == ["model (KV / seq)", "4k (GiB)", "8k (GiB)"] and rows == [[LLAMA31, "0.50", "1.00"]]
    code, out, err = run_main(monkeypatch, capsys, "table", "-m", LLAMA31, "--ctx", "4k,8k", "--pivot",
                              "--metric", "total", "-f", "csv")
    assert list(csv.reader(io.StringIO(out))) == [["model", "4096", "8192"],
                                                  [LLAMA31, str(WEIGHTS + GiB // 2), str(WEIGHTS + GiB)]]


def test_rich_default_and_out_file(monkeypatch, capsys, tmp_path):
    out_file = tmp_path / "t.md"
    code, out, err = run_main(monkeypatch, capsys, "table", "-m", LLAMA31, "--ctx", "8k", "--out",
                              str(out_file))
    assert code == 0, err
    assert out == ""  # the extension chose markdown; nothing on stdout
    head, _, rows = parse_markdown(out_file.read_text())
    assert rows[0][4] == "1.00"
    code, out, err = run_main(monkeypatch, capsys, "table", "-m", LLAMA31, "--ctx", "8k")
    assert code == 0, err
    assert "KV / seq (GiB)" in out and "1.00" in out and "128.00" in out


def drawn_by_rich(result, width: int, **options) -> str:
    """The rich table as rich itself lays it out at `width` columns (numbers and cells kept whole, as
    `kvplan.report.print_table` keeps them), lines right-trimmed."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from kvplan.report import print_table

    headers, numeric, rows, ends = planning.rich_cells(result, **options)
    table = Table(title=Text(planning.title(result)), title_justify="left")
    for header, number in zip(headers, numeric, strict=True):
        table.add_column(Text(header), justify="right" if number else "left", overflow="fold")
    for cells, end in zip(rows, ends, strict=True):
        table.add_row(*map(Text, cells), end_section=end)
    console = Console(file=io.StringIO(), width=width, color_system=None, markup=False, emoji=False)
    print_table(console, table, whole=tuple(range(len(headers))))
    for line in planning.below(result, **options):
        console.print(Text(line))
    return "".join(line.rstrip() + "\n" for line in console.file.getvalue().splitlines())


def test_the_rich_table_is_drawn_as_rich_draws_it():
    """`boxed` draws the rich table itself (rich took seconds to lay out a whole library): at full width, as in a
    file or a pipe, and at every terminal width from 30 to 228 columns it must match rich's own drawing, except
    that a title wider than the table stays on one line in a file, and a table that cannot fit is drawn at its
    least width, which rich's column collapse does not always reach."""
    result = planning.build([LLAMA31, "Qwen/Qwen3-32B", "google/gemma-3-27b-it", "deepseek-ai/DeepSeek-V3"],
                            [4096, 131072], gpus=planning.parse_gpus("h100,l40s,4xh100", None))
    for options in ({}, {"pivot": True}, {"pivot": True, "metric": "kv"}):
        boxed = planning.render(result, "rich", **options)
        assert boxed.startswith(planning.title(result) + "\n┏")
        assert boxed.split("┏", 1)[1] == drawn_by_rich(result, 10_000, **options).split("┏", 1)[1]
        for width in range(30, 230, 6):
            ours, rich = planning.boxed(result, width=width, **options), drawn_by_rich(result, width, **options)
            widest = max(len(line) for line in ours.splitlines() if line[:1] in "┏┃│└")
            assert ours == rich or width < widest <= max(map(len, rich.splitlines())), (width, ours)


def test_models_from_file_and_filter(monkeypatch, capsys, tmp_path):
    listing = tmp_path / "models.txt"
    listing.write_text(f"# planning set\n{LLAMA31}\n\n  openai/gpt-oss-20b   # the small MoE\n",
                       encoding="utf-8")
    for spec in (f"@{listing}", str(listing)):
        code, out, err = run_main(monkeypatch, capsys, "table", "-m", spec, "--ctx", "8k", "-f", "json")
        assert code == 0, err
        assert [r["model"] for r in json.loads(out)["rows"]] == [LLAMA31, "openai/gpt-oss-20b"]
    code, out, err = run_main(monkeypatch, capsys, "table", "--filter", "gpt-oss", "--ctx", "8k",
                              "-f", "json")
    assert code == 0, err
    assert sorted(r["model"] for r in json.loads(out)["rows"]) == ["openai/gpt-oss-120b", "openai/gpt-oss-20b"]


def test_each_model_loaded_once(monkeypatch):
    calls = []

    def loader(name):
        from kvplan.sources import load_model

        calls.append(name)
        return load_model(name)

    table = planning.build([LLAMA31, "openai/gpt-oss-20b"], [1024, 8192, 32768],
                           gpus=planning.parse_gpus("h100,l40s", None), loader=loader)
    assert calls == [LLAMA31, "openai/gpt-oss-20b"]
    assert len(table.rows) == 6 and all(len(row.users) == 2 for row in table.rows)


def test_subprocess_end_to_end():
    result = run_cli("table", "-m", LLAMA31, "--ctx", "8k", "--gpu", "h100", "--format", "csv")
    assert result.returncode == 0, result.stderr
    (record,) = csv.DictReader(io.StringIO(result.stdout))
    assert record["max_users"] == "56"


def test_table_does_not_import_matplotlib():
    done = run_python(
        "import sys, contextlib, io\n"
        "sys.argv = ['kvplan', 'table', '-m', 'llama-3-8b', '--ctx', '8k', '--gpu', 'h100', '-f', 'csv']\n"
        "from kvplan.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try:\n        main()\n    except SystemExit as e:\n        assert not e.code, e.code\n"
        "print('matplotlib' in sys.modules)\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


# ------------------------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize("models", ["", " , ", ","])
def test_empty_model_list(monkeypatch, capsys, models):
    code, out, err = run_main(monkeypatch, capsys, "table", "-m", models, "--ctx", "8k")
    assert_one_line_error(code, err, "no models given")
    assert out == ""


def test_empty_model_file_and_no_models(monkeypatch, capsys, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing here\n\n", encoding="utf-8")
    code, _, err = run_main(monkeypatch, capsys, "table", "-m", f"@{empty}", "--ctx", "8k")
    assert_one_line_error(code, err, "no models given")
    code, _, err = run_main(monkeypatch, capsys, "table", "--ctx", "8k")
    assert_one_line_error(code, err, "no models given")
    code, _, err = run_main(monkeypatch, capsys, "table", "-m", f"@{tmp_path / 'missing.txt'}", "--ctx", "8k")
    assert_one_line_error(code, err, "cannot read the model list", "missing.txt")
    code, _, err = run_main(monkeypatch, capsys, "table", "--filter", "no-such-family", "--ctx", "8k")
    assert_one_line_error(code, err, "--filter", "matches no library model")


@pytest.mark.parametrize("fmt", ["xml", "html", ""])
def test_unknown_format(monkeypatch, capsys, fmt):
    code, out, err = run_main(monkeypatch, capsys, "table", "-m", LLAMA31, "--ctx", "8k", "--format", fmt)
    assert_one_line_error(code, err, "unknown format", "rich, markdown, csv or json")
    assert out == ""


def test_unwritable_output(monkeypatch, capsys, tmp_path):
    for target, why in ((tmp_path / "no" / "such" / "dir" / "t.md", "cannot write"), (tmp_path, "is a directory")):
        code, out, err = run_main(monkeypatch, capsys, "table", "-m", LLAMA31, "--ctx", "8k", "-f", "md",
                                  "--out", str(target))
        assert_one_line_error(code, err, why, str(target))
        assert out == ""


def test_unknown_model_is_named_and_stops(monkeypatch, capsys):
    code, out, err = run_main(monkeypatch, capsys, "table", "-m", f"{LLAMA31},no-such-model", "--ctx", "8k",
                              "-f", "csv")
    assert_one_line_error(code, err, "no-such-model", "--keep-going")
    assert out == ""  # nothing rendered without --keep-going


def test_keep_going_renders_the_others(monkeypatch, capsys, tmp_path):
    code, out, err = run_main(monkeypatch, capsys, "table", "-m", f"{LLAMA31},no-such-model,also-missing",
                              "--ctx", "8k", "-f", "csv", "--keep-going")
    assert_one_line_error(code, err, "no-such-model", "also-missing", "2 of 3 models failed")
    assert [r["model"] for r in csv.DictReader(io.StringIO(out))] == [LLAMA31]
    target = tmp_path / "t.csv"
    code, out, err = run_main(monkeypatch, capsys, "table", "-m", f"no-such-model,{LLAMA31}", "--ctx", "8k",
                              "--keep-going", "--out", str(target))
    assert_one_line_error(code, err, "no-such-model")
    assert [r["model"] for r in csv.DictReader(io.StringIO(target.read_text()))] == [LLAMA31]
    code, out, err = run_main(monkeypatch, capsys, "table", "-m", "no-such-model", "--ctx", "8k",
                              "--keep-going")
    assert_one_line_error(code, err, "no-such-model")
    assert out == ""


def test_a_cell_the_engine_cannot_plan_is_marked_and_the_rest_rendered(monkeypatch, capsys):
    """The whole library on an A100 and an H100: vLLM 0.33 runs no MiniMax model (its last release that did is
    0.23), and kvplan lays out DeepSeek V4's cache for Hopper and Blackwell only. Those cells say so, in every
    format; every other cell is counted, the H100's DeepSeek V4 cells too, and the table exits 0."""
    args = ["table", "--filter", "-", "--ctx", "8k", "--gpu", "a100-80gb,h100"]
    code, out, err = run_main(monkeypatch, capsys, *args, "-f", "json")
    assert (code, err) == (0, "")
    records = json.loads(out)["rows"]
    from kvplan.sources import library

    assert {r["model"] for r in records} == {e.id for e in library.entries()}
    refused = {(r["model"], r["gpu"]): r["not_planned"] for r in records if r["not_planned"]}
    assert set(refused) == {("MiniMaxAI/MiniMax-M1-80k", "NVIDIA A100 80GB SXM"),
                            ("MiniMaxAI/MiniMax-M1-80k", "NVIDIA H100 SXM"),
                            ("deepseek-ai/DeepSeek-V4-Flash", "NVIDIA A100 80GB SXM"),
                            ("deepseek-ai/DeepSeek-V4-Pro", "NVIDIA A100 80GB SXM")}
    assert "0.23.0" in refused["MiniMaxAI/MiniMax-M1-80k", "NVIDIA H100 SXM"]
    assert all(r["max_users"] is None and r["max_users_bound"] is None for r in records if r["not_planned"])
    v4_h100 = next(r for r in records if (r["model"], r["gpu"]) == ("deepseek-ai/DeepSeek-V4-Flash", "NVIDIA H100 SXM"))
    assert isinstance(v4_h100["max_users"], int) and v4_h100["max_users_bound"] == "memory"
    code, out, _ = run_main(monkeypatch, capsys, *args, "-f", "csv")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert code == 0 and len(rows) == len(records)
    assert {(r["model"], r["gpu"]) for r in rows if r["not_planned"]} == set(refused)
    for fmt in ("md", "rich"):
        code, out, _ = run_main(monkeypatch, capsys, *args, "-f", fmt)
        assert code == 0 and "n/a" in out
        note = next(line for line in out.splitlines() if line.startswith("n/a: not planned: "))
        assert "MiniMax-M1-80k" in note and "DeepSeek-V4-Pro on NVIDIA A100 80GB SXM" in note


def test_a_cell_at_the_engines_request_limit_is_marked(monkeypatch, capsys):
    """Gemma-3-1B at 8k on an RTX 4090: vLLM runs at most max_num_seqs 256 requests on a GPU under 70 GiB
    (vllm/engine/arg_utils.py), while its cache would hold more; Llama-3.1-8B's 5 users are memory's."""
    args = ["table", "-m", f"{LLAMA31},google/gemma-3-1b-it", "--ctx", "8k", "--gpu", "rtx-4090"]
    _, out, _ = run_main(monkeypatch, capsys, "estimate", "-m", "google/gemma-3-1b-it", "--ctx", "8k", "--gpu",
                         "rtx-4090", "--max-num-seqs", "100000", "--json")
    assert json.loads(out)["max_concurrent_users"] > 256  # what the KV cache holds
    code, out, _ = run_main(monkeypatch, capsys, *args, "-f", "md")
    _, _, rows = parse_markdown(out)
    assert code == 0 and [row[-1] for row in rows] == ["5", "256†"]
    assert "† as many users as one vLLM instance runs at once (max\\_num\\_seqs 256 on NVIDIA GeForce RTX 4090)" in out
    code, out, _ = run_main(monkeypatch, capsys, *args, "-f", "rich")
    assert "256† │" in out and "† as many users as one vLLM instance runs at once" in out
    code, out, _ = run_main(monkeypatch, capsys, *args, "-f", "csv")
    assert [(r["max_users"], r["max_users_bound"]) for r in csv.DictReader(io.StringIO(out))] == [
        ("5", "memory"), ("256", "sequence_limit")]
    code, out, _ = run_main(monkeypatch, capsys, *args, "--pivot", "-f", "md")
    assert parse_markdown(out)[2][1][-1] == "256†"


def test_markdown_headers_stay_short(monkeypatch, capsys):
    """A header as wide as `max users in steady decode, NVIDIA GeForce RTX 4090` made every row wrap in a
    terminal: a users column is headed `users, rtx-4090`, and the long form is under the table."""
    code, out, _ = run_main(monkeypatch, capsys, "table", "-m", LLAMA31, "--ctx", "8k", "--gpu",
                            "rtx-4090,4xh100", "--vram", "48GB", "-f", "md")
    head, _, _ = parse_markdown(out)
    assert code == 0 and head[-3:] == ["users, rtx-4090", "users, 4xh100", "users, 44.70GiB"]
    assert max(map(len, head)) <= 20
    assert ("users: max users in steady decode with vllm 0.33.0 (rtx-4090: NVIDIA GeForce RTX 4090; 4xh100: "
            "4 x NVIDIA H100 SXM; 44.70GiB: 44.70 GiB GPU)") in out


@pytest.mark.parametrize("args, fragment", [
    (["--ctx", ""], "--ctx is empty"),
    (["--ctx", "8k,abc"], "not a token count"),
    (["--ctx", "8k", "--gpu", "h1000x"], "unknown gpu"),
    (["--ctx", "8k", "--gpu", ","], "--gpu is empty"),
    (["--ctx", "8k", "--vram", "lots"], "not a size"),
    (["--ctx", "8k", "--engine", "nope"], "unknown engine"),
    (["--ctx", "8k", "--kv-dtype", "fp7"], "fp7"),
    (["--ctx", "8k", "--engine", "llama.cpp", "--kv-dtype", "fp8"], "llama.cpp has no fp8"),
    (["--ctx", "8k", "--batch", "0"], "--batch must be between 1 and"),
    (["--ctx", "8k", "--metric", "users"], "add --pivot"),
    (["--ctx", "8k", "--pivot", "--metric", "users"], "needs a GPU"),
    (["--ctx", "8k", "--pivot", "--metric", "bogus"], "unknown --metric"),
    (["--ctx", "8k", "--pivot", "-f", "json"], "--pivot is for rich, markdown and csv"),
])
def test_other_bad_input(monkeypatch, capsys, args, fragment):
    code, out, err = run_main(monkeypatch, capsys, "table", "-m", LLAMA31, *args)
    assert_one_line_error(code, err, fragment)
    assert out == ""


@pytest.mark.parametrize("engine", ["vllm", "sglang", "llama.cpp", "transformers", "tensorrt-llm", "ideal"])
def test_sweep_agrees_with_capacity(engine):
    """The table's users are capacity()'s: same budget, pools and search, for sliding-window, MoE, MLA and
    hybrid models on GPUs of different memory buckets, one and two at a time (the sweep splits a model once per
    parallel layout); the contexts out of order, so that the sweep's count past the first context at which no
    user fits meets contexts both longer and shorter than that one."""
    from kvplan.capacity import Hardware, Workload, capacity, engine_dtypes, parallelism
    from kvplan.sources import load_model

    names = ["google/gemma-3-27b-it", "openai/gpt-oss-20b", "deepseek-ai/DeepSeek-V2-Lite", LLAMA31,
             "Qwen/Qwen3-Next-80B-A3B-Thinking"]
    ctxs = [65536, 1000, 1 << 20, 8192]
    gpus = planning.parse_gpus("h100,l40s,2xl40s,b200", None)
    table = planning.build(names, ctxs, gpus=gpus, engine_name=engine)
    for row in table.rows:
        spec = load_model(row.estimate.model)
        kv, weights = engine_dtypes(spec, engine)
        for gpu, cell in zip(table.gpus, row.users, strict=True):
            cap = capacity(spec, Workload(ctx=row.estimate.ctx), engine_name=engine, kv_dtype_name=kv,
                           weights_dtype_name=weights, suggest=False,
                           hardware=Hardware(name=gpu.name, memory_bytes=gpu.memory_bytes),
                           parallel=parallelism(engine, gpu.count, None, None))
            assert (cell.max_users, cell.engine_kv_bytes_per_sequence, cell.kv_budget_bytes) == (
                cap.max_concurrent_users, cap.engine_kv_bytes_per_sequence, cap.kv_budget_bytes), (row, cell)
