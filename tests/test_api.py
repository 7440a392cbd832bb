"""kvplan as a library: `import kvplan` and its public functions only (docs/api.md). Each result's JSON is what the
command prints with --json, over a matrix of models, engines and GPUs; each error is the command's one line; a
plan from the bundled library imports no torch, transformers, huggingface_hub or matplotlib, and the import itself
nothing at all."""

import inspect
import json
import sys

import pytest
from conftest import GiB, run_main, run_python

import kvplan

MODELS = ["meta-llama/Llama-3-8B", "google/gemma-3-27b-it", "deepseek-ai/DeepSeek-V3", "openai/gpt-oss-120b",
          "ibm-granite/granite-4.0-h-small", "Qwen/Qwen3-32B"]
ENGINES = ["vllm", "sglang", "llama.cpp", "transformers", "tensorrt-llm", "ideal"]
GPUS = [{"gpu": "h100"}, {"gpu": "4xh100"}, {"gpu": "l40s", "gpus": 2}, {"vram": "24GiB"}]
LIGHT = ["meta-llama/Llama-3-8B", "google/gemma-3-27b-it", "ibm-granite/granite-4.0-h-small"]


def command_line(keywords: dict) -> list[str]:
    """The flags that ask what `keywords` asks: each keyword as its flag (snake_case to --kebab-case)."""
    args = []
    for name, value in keywords.items():
        flag = "--" + name.replace("_", "-")
        args += [flag] if value is True else [flag, str(value)]
    return args


def cli_json(monkeypatch, capsys, command: str, *args: str, json_flag: str = "--json") -> tuple[int, dict]:
    code, out, err = run_main(monkeypatch, capsys, command, *args, *json_flag.split())
    assert code in (0, 1), err
    return code, json.loads(out)


def same_as_cli(result, cli_output: dict) -> None:
    assert json.loads(result.model_dump_json()) == cli_output
    assert result.model_dump() == cli_output


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("engine", ENGINES)
def test_estimate_is_the_command_for_every_engine(model, engine, monkeypatch, capsys):
    keywords = {"gpu": "8xh200", "engine": engine}
    try:
        result = kvplan.estimate(model, "32k", **keywords)
    except kvplan.KvplanError as err:  # an engine that does not run the model says so, as the command does
        code, _, cli_err = run_main(monkeypatch, capsys, "estimate", "-m", model, "--ctx", "32k",
                                    *command_line(keywords))
        assert (code, cli_err) == (2, f"kvplan: error: {err}\n")
        return
    code, output = cli_json(monkeypatch, capsys, "estimate", "-m", model, "--ctx", "32k", *command_line(keywords))
    same_as_cli(result, output)
    assert (code == 0) == result.fits


@pytest.mark.parametrize("model", LIGHT)
@pytest.mark.parametrize("gpu", GPUS, ids=lambda gpu: command_line(gpu)[1])
@pytest.mark.parametrize("extra", [{}, {"batch": 8, "kv_dtype": "fp8"}, {"users": 20, "avg_ctx": "4k"},
                                   {"tp": 1, "kv_budget": "20GiB"}], ids=["default", "batch-fp8", "avg", "budget"])
def test_estimate_is_the_command_on_every_gpu(model, gpu, extra, monkeypatch, capsys):
    keywords = gpu | extra
    if "gpus" in keywords and "tp" in keywords:
        keywords.pop("tp")
    result = kvplan.estimate(model, 8192, **keywords)
    code, output = cli_json(monkeypatch, capsys, "estimate", "-m", model, "--ctx", "8192", *command_line(keywords))
    same_as_cli(result, output)
    assert (code == 0) == result.fits


@pytest.mark.parametrize("keywords", [
    {"model": "meta-llama/Llama-3.1-8B", "isl": "1k", "osl": "1k"},  # no GPU: a note, no speed
    {"model": "meta-llama/Llama-3.1-8B", "isl": 1024, "osl": 512, "ctx": "8k", "gpu": "h100", "users": 32},
    {"model": "openai/gpt-oss-120b", "isl": "2k", "osl": "1k", "gpu": "h200", "users": 256, "max_tpot": 20},
    {"model": "Qwen/Qwen3-32B", "isl": "4k", "osl": "1k", "gpu": "2xh100", "engine": "sglang", "max_ttft": 2000,
     "min_tps": 20.5},
    {"model": "meta-llama/Llama-3.1-70B", "isl": "1k", "osl": "1k", "gpu": "4xh100", "pp": 2},  # no speed: PP
], ids=["no-gpu", "users", "tpot", "sglang-ttft-tps", "pp"])
def test_estimate_with_requests_is_the_command(keywords, monkeypatch, capsys):
    result = kvplan.estimate(**keywords)
    args = command_line(keywords)
    code, output = cli_json(monkeypatch, capsys, "estimate", *args)
    same_as_cli(result, output)
    assert (code == 0) == result.fits
    monkeypatch.setenv("COLUMNS", "80")
    _, out, _ = run_main(monkeypatch, capsys, "estimate", *args)
    assert result.report() == out
    if "max_tpot" in keywords:  # memory holds the 256 users asked; the target serves fewer, and says so
        assert result.capacity.fits and not result.fits and result.capacity.max_concurrent_users >= 256
        assert result.max_concurrent_users == result.speed.users < 256
        assert result.max_concurrent_users_bound == "speed"


def test_estimate_without_capacity_and_its_attributes(monkeypatch, capsys):
    result = kvplan.estimate("meta-llama/Llama-3-8B", ctx=8192)
    _, output = cli_json(monkeypatch, capsys, "estimate", "-m", "meta-llama/Llama-3-8B", "--ctx", "8192")
    same_as_cli(result, output)
    # Llama-3-8B: 32 layers x 8 KV heads x 128 x 2 (K and V) x 2 bytes = 131,072 B a token; 8,192 tokens = 1 GiB
    assert result.kv_bytes_per_token == 131_072 and result.kv_bytes_per_sequence == GiB
    assert result.capacity is None and result.fits and result.schema_version == output["schema_version"]
    with pytest.raises(AttributeError):
        result.max_concurrent_users  # noqa: B018 (no capacity was asked)
    planned = kvplan.estimate("meta-llama/Llama-3-8B", ctx="8k", gpu="h100")
    assert planned.max_concurrent_users == planned.capacity.max_concurrent_users == 56  # the docs' H100 example
    assert planned.ctx == 8192 and planned.memory.ctx == 8192


def test_a_loaded_model_is_taken_as_it_is(tmp_path):
    spec = kvplan.load_model("llama-3-8b")
    assert spec.name == "meta-llama/Meta-Llama-3-8B"
    assert kvplan.estimate(spec, 8192, gpu="h100").model_dump() == \
        kvplan.estimate("meta-llama/Llama-3-8B", 8192, gpu="h100").model_dump()
    table = kvplan.table([spec, "Qwen/Qwen3-32B"], ["8k", 32768], gpu=["h100"])
    assert [row.model for row in table.rows] == [spec.name, spec.name, "Qwen/Qwen3-32B", "Qwen/Qwen3-32B"]
    with pytest.raises(kvplan.KvplanError, match="read already"):
        kvplan.estimate(spec, 8192, revision="main")


@pytest.mark.parametrize("keywords", [
    {"models": "meta-llama/Llama-3.1-8B,Qwen/Qwen3-32B,deepseek-ai/DeepSeek-V3", "ctx": "8k,128k",
     "gpu": "h100,l40s,4xh100"},
    {"models": "meta-llama/Llama-3.1-8B,openai/gpt-oss-20b", "ctx": "4k,1M"},
    {"filter": "gemma-3", "ctx": "8k", "vram": "24GiB,48GB", "engine": "llama.cpp", "batch": 4},
    {"models": "meta-llama/Llama-3.1-8B,MiniMaxAI/MiniMax-M2,no/such-model-here", "ctx": "8k", "gpu": "h100",
     "keep_going": True},
], ids=["gpus", "no-gpu", "vram-llama.cpp", "keep-going"])
def test_table_is_the_command(keywords, monkeypatch, capsys):
    result = kvplan.table(**keywords)
    code, out, err = run_main(monkeypatch, capsys, "table", *command_line(keywords), "--format", "json")
    same_as_cli(result, json.loads(out))
    assert (code == 0) == (not result.failures)
    if result.failures:
        assert err == f"kvplan: error: {result.failure_line()}\n"
    for fmt in ("markdown", "csv", "rich"):
        _, text, _ = run_main(monkeypatch, capsys, "table", *command_line(keywords), "--format", fmt)
        assert result.render(fmt) == text


def test_table_with_requests_is_the_command(monkeypatch, capsys):
    keywords = {"models": "meta-llama/Llama-3.1-8B,openai/gpt-oss-20b", "isl": "1k", "osl": "1k", "ctx": "2k,8k",
                "gpu": "h100,l40s", "users": 16}
    result = kvplan.table(**keywords)
    _, out, _ = run_main(monkeypatch, capsys, "table", *command_line(keywords), "--format", "json")
    same_as_cli(result, json.loads(out))
    assert {row.speed_concurrency for row in result.rows} == {16} and result.rows[0].decode_step_ms > 0
    for metric in ("tpot", "tps-gpu"):
        _, text, _ = run_main(monkeypatch, capsys, "table", *command_line(keywords), "--format", "csv", "--pivot",
                              "--metric", metric)
        assert result.render("csv", pivot=True, metric=metric) == text


def test_table_writes_as_the_command_does(tmp_path, monkeypatch, capsys):
    keywords = {"models": "meta-llama/Llama-3.1-8B,Qwen/Qwen3-32B", "ctx": "8k,32k", "gpu": "h100"}
    result = kvplan.table(**keywords)
    assert result.write(str(tmp_path / "api.md")) == f"wrote {tmp_path / 'api.md'}"
    code, _, err = run_main(monkeypatch, capsys, "table", *command_line(keywords), "--out", str(tmp_path / "cli.md"))
    assert code == 0 and err == f"kvplan: wrote {tmp_path / 'cli.md'}\n"
    assert (tmp_path / "api.md").read_text() == (tmp_path / "cli.md").read_text()
    result.write(str(tmp_path / "p.csv"), "md", pivot=True)  # the format given wins over the extension
    assert (tmp_path / "p.csv").read_text() == result.render("markdown", pivot=True)
    with pytest.raises(kvplan.KvplanError, match="--metric chooses"):
        result.render("csv", metric="kv")


@pytest.mark.parametrize("keywords", [
    {"model": "meta-llama/Llama-3.1-70B", "ctx": "32k", "users": 64, "gpu": "h100"},
    {"model": "openai/gpt-oss-120b", "ctx": "128k", "users": 200, "gpu": "h200", "engine": "sglang"},
    {"model": "meta-llama/Llama-3.1-70B", "ctx": "1M", "users": 64, "gpu": "rtx-4090", "max_gpus": 2},
], ids=["llama-h100", "sglang", "none-fits"])
def test_plan_is_the_command(keywords, monkeypatch, capsys):
    result = kvplan.plan(**keywords)
    code, output = cli_json(monkeypatch, capsys, "plan", *command_line(keywords))
    same_as_cli(result, output)
    assert (code == 0) == bool(result.rows)


@pytest.mark.parametrize("keywords", [
    {"model": "openai/gpt-oss-120b", "isl": 1024, "osl": 1024, "users": 256, "gpu": "h200", "max_tpot": 20},
    {"model": "meta-llama/Llama-3.1-70B", "isl": "1k", "osl": "1k", "ctx": "8k", "users": 64, "gpu": "h100"},
    {"model": "meta-llama/Llama-3.1-8B", "isl": "1k", "osl": "1k", "users": 8, "vram": "24GiB",
     "engine": "llama.cpp"},  # the speed model has no llama.cpp: a note
], ids=["tpot", "requests", "no-speed"])
def test_plan_with_requests_is_the_command(keywords, monkeypatch, capsys):
    result = kvplan.plan(**keywords)
    args = command_line(keywords)
    code, output = cli_json(monkeypatch, capsys, "plan", *args)
    same_as_cli(result, output)
    assert (code == 0) == bool(result.rows)
    monkeypatch.setenv("COLUMNS", "80")
    _, out, _ = run_main(monkeypatch, capsys, "plan", *args)
    assert result.report() == out


def keywords_of(command: str) -> set[str]:
    from kvplan import cli

    params = cli._app_for([command]).registered_commands[0].callback
    return set(inspect.signature(params).parameters)


@pytest.mark.parametrize("command, function, own", [
    ("estimate", kvplan.estimate, {"as_json"}),
    ("plan", kvplan.plan, {"as_json"}),
    ("table", kvplan.table, {"fmt", "out", "pivot", "metric", "force"}),
    ("profile", kvplan.profile, {"as_json"}),
])
def test_every_flag_is_a_keyword_of_the_same_name(command, function, own):
    """What the command computes, the function takes by the flag's name; the command's own flags (--json, --out,
    --format, --pivot, --metric, --force) are the result's methods (`model_dump_json`, `write`, `render`)."""
    assert keywords_of(command) - own == set(inspect.signature(function).parameters) - {"progress"}


@pytest.mark.parametrize("call, args", [
    (lambda: kvplan.estimate("meta-llama/Llama-3-8B", "8q"), ["estimate", "-m", "meta-llama/Llama-3-8B", "--ctx",
                                                              "8q"]),
    (lambda: kvplan.estimate("no-such-model", 8192), ["estimate", "-m", "no-such-model", "--ctx", "8192"]),
    (lambda: kvplan.estimate("llama-3-8b", 8192, batch=0), ["estimate", "-m", "llama-3-8b", "--ctx", "8192",
                                                            "--batch", "0"]),
    (lambda: kvplan.estimate("llama-3-8b", 8192, gpu="h1000"), ["estimate", "-m", "llama-3-8b", "--ctx", "8192",
                                                                "--gpu", "h1000"]),
    (lambda: kvplan.estimate("llama-3-8b", 8192, gpu="h100", gpu_memory_utilization=1.5),
     ["estimate", "-m", "llama-3-8b", "--ctx", "8192", "--gpu", "h100", "--gpu-memory-utilization", "1.5"]),
    (lambda: kvplan.plan("llama-3-8b", 8192, 10), ["plan", "-m", "llama-3-8b", "--ctx", "8192", "--users", "10"]),
    (lambda: kvplan.table("llama-3-8b", "8k", pp=0), ["table", "-m", "llama-3-8b", "--ctx", "8k", "--pp", "0"]),
    (lambda: kvplan.table("llama-3-8b,nope/none-such", "8k"), ["table", "-m", "llama-3-8b,nope/none-such",
                                                               "--ctx", "8k"]),
    (lambda: kvplan.estimate("llama-3-8b", isl="1k"), ["estimate", "-m", "llama-3-8b", "--isl", "1k"]),
    (lambda: kvplan.estimate("llama-3-8b", "8k", max_tpot=20), ["estimate", "-m", "llama-3-8b", "--ctx", "8k",
                                                                "--max-tpot", "20"]),
    (lambda: kvplan.estimate("llama-3-8b", isl="1k", osl="1k", max_ttft=500),
     ["estimate", "-m", "llama-3-8b", "--isl", "1k", "--osl", "1k", "--max-ttft", "500"]),
    (lambda: kvplan.plan("llama-3-8b", "1k", 8, isl="1k", osl="1k", gpu="h100"),
     ["plan", "-m", "llama-3-8b", "--ctx", "1k", "--users", "8", "--isl", "1k", "--osl", "1k", "--gpu", "h100"]),
    (lambda: kvplan.table("llama-3-8b", "8k", users=4), ["table", "-m", "llama-3-8b", "--ctx", "8k", "--users",
                                                         "4"]),
], ids=["ctx", "model", "batch", "gpu", "fraction", "plan-gpu", "pp", "table-model", "isl-alone", "target-alone",
        "target-no-gpu", "ctx-short", "users-alone"])
def test_errors_are_the_command_s_line(call, args, monkeypatch, capsys):
    with pytest.raises(kvplan.KvplanError) as raised:
        call()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, _, err = run_main(monkeypatch, capsys, *args)
    assert (code, err) == (2, f"kvplan: error: {raised.value}\n")


@pytest.mark.parametrize("call, says", [
    (lambda: kvplan.estimate("llama-3-8b", 8192, batch="4"), "--batch must be a whole number, got '4'"),
    (lambda: kvplan.estimate("llama-3-8b", 8192, gpu="h100", tp=2.0), "--tp must be a whole number, got 2.0"),
    (lambda: kvplan.estimate("llama-3-8b", 8192, gpu="h100", gpu_memory_utilization="0.9"),
     "--gpu-memory-utilization must be a number, got '0.9'"),
    (lambda: kvplan.estimate(["llama-3-8b"], 8192), "--model is a name or a path (a str), got list"),
    (lambda: kvplan.estimate("llama-3-8b"), "give --ctx, or --isl and --osl"),
    (lambda: kvplan.estimate("llama-3-8b", isl="1k", osl="1k", max_tpot="20"), "--max-tpot must be a number"),
    (lambda: kvplan.table(None, None, filter="llama"), "give --ctx"),
    (lambda: kvplan.profile(kvplan.load_model("llama-3-8b"), 8192), "give --model as a name or a path"),
    (lambda: kvplan.estimate("llama-3-8b", 8192, gpu=5), "--gpu must be text, got 5"),
    (lambda: kvplan.plan("llama-3-8b", 8192, 10, gpu=["h100"]), "--gpu must be text, got ['h100']"),
    (lambda: kvplan.estimate("llama-3-8b", 8192, engine=3), "--engine must be text, got 3"),
    (lambda: kvplan.estimate("llama-3-8b", 8192, cache_type_k=5), "--cache-type-k must be text, got 5"),
    (lambda: kvplan.estimate("llama-3-8b", 8192, lora=5), "--lora is a path to an adapter GGUF"),
    (lambda: kvplan.table("llama-3-8b", {8192: 1}), "--ctx is a comma list (from a script, a list), got {8192: 1}"),
    (lambda: kvplan.table("llama-3-8b", 8192, kv_dtype=8), "--kv-dtype must be text, got 8"),
], ids=["batch", "tp", "fraction", "model", "ctx", "target", "table-ctx", "profile-spec", "gpu", "plan-gpu", "engine",
        "cache-type", "lora", "table-ctx-type", "table-kv"])
def test_a_script_s_wrong_types_are_one_clear_error(call, says):
    with pytest.raises(kvplan.KvplanError) as raised:
        call()
    assert says in str(raised.value)


def test_script_values_as_python_takes_them():
    """Sizes as numbers of bytes, counts as dicts, token counts as ints, lists for comma lists."""
    as_text = kvplan.estimate("google/gemma-3-27b-it", "32k", gpu="h100", kv_budget="20GiB",
                              limit_mm_per_prompt="image=0")
    as_python = kvplan.estimate("google/gemma-3-27b-it", 32768, gpu="h100", kv_budget=20 * GiB,
                                limit_mm_per_prompt={"image": 0})
    assert as_text.model_dump() == as_python.model_dump()
    assert kvplan.table("llama-3-8b", [4096, "8k"], gpu=["h100", "l40s"]).model_dump() == \
        kvplan.table("llama-3-8b", "4k,8k", gpu="h100,l40s").model_dump()
    # one value where a list goes, a size in bytes as --vram, a loaded model as --models
    assert kvplan.estimate("llama-3-8b", 8192, vram=24 * GiB).model_dump() == \
        kvplan.estimate("llama-3-8b", 8192, vram="24GiB").model_dump()
    assert kvplan.table(kvplan.load_model("llama-3-8b"), 8192, vram=24 * GiB).model_dump() == \
        kvplan.table("llama-3-8b", "8k", vram="24GiB").model_dump()


def test_notebooks_show_what_the_command_prints(monkeypatch, capsys):
    result = kvplan.estimate("meta-llama/Llama-3-8B", 8192, gpu="h100")
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = run_main(monkeypatch, capsys, "estimate", "-m", "meta-llama/Llama-3-8B", "--ctx", "8192",
                            "--gpu", "h100")
    assert result._repr_markdown_() == f"```text\n{out}```\n"
    assert result._repr_html_().startswith("<pre>meta-llama/Meta-Llama-3-8B\n")
    plan = kvplan.plan("meta-llama/Llama-3.1-70B", "32k", 64, gpu="h100")
    assert "configurations that fit, fewest GPUs first" in plan._repr_markdown_()
    table = kvplan.table("meta-llama/Llama-3.1-8B", "8k,128k", gpu="h100")
    assert table._repr_markdown_() == table.render("markdown")
    html = table._repr_html_()
    assert html.startswith("<table><thead><tr><th>model</th>") and "<td style=\"text-align: right\">56</td>" in html


def test_config_text_is_data_in_a_notebook(tmp_path):
    """A model named with markup and backticks (its directory's name) is shown as written, never obeyed."""
    from conftest import SPECS

    name = "<img src=x onerror=alert(1)>```"
    (tmp_path / name).mkdir()
    (tmp_path / name / "config.json").write_text((SPECS / "meta-llama__Meta-Llama-3-8B.json").read_text())
    path = str(tmp_path / name)
    html = kvplan.estimate(path, 8192)._repr_html_() + kvplan.table(path, "8k")._repr_html_()
    assert "<img" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    markdown = kvplan.estimate(path, 8192)._repr_markdown_()
    assert markdown.startswith("````text\n") and markdown.endswith("\n````\n")  # a fence longer than the name's
    table = kvplan.table(path, "8k")._repr_markdown_()
    assert "\\<img src=x onerror=alert(1)\\>\\`\\`\\`" in table and table.count("<img") == 1  # escaped


def test_the_public_names():
    assert set(kvplan.__all__) == {"KvplanError", "__version__", "estimate", "load_model", "plan", "profile",
                                   "schema", "table"}
    assert set(kvplan.__all__) <= set(dir(kvplan))
    assert issubclass(kvplan.KvplanError, Exception)
    assert kvplan.schema("estimate")["properties"]["schema_version"]["const"] == \
        kvplan.estimate("llama-3-8b", 1024).schema_version
    with pytest.raises(AttributeError, match="no attribute 'estimates'"):
        kvplan.estimates  # noqa: B018
    namespace: dict = {}
    exec("from kvplan import *", namespace)
    assert callable(namespace["table"]) and callable(namespace["estimate"])


def test_import_and_a_library_estimate_load_nothing_heavy():
    """`import kvplan` imports no other module; an estimate from the bundled library, with a GPU, no torch,
    transformers, huggingface_hub or matplotlib; the one-line example of docs/api.md prints 1 GiB."""
    code = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "import kvplan\n"
        "print('IMPORTED', sorted(set(sys.modules) - before - {'kvplan'}))\n"
        "kvplan.estimate('meta-llama/Llama-3-8B', ctx=8192, gpu='h100').model_dump_json()\n"
        "kvplan.table('llama-3-8b,gemma-3-27b-it', '8k', gpu='h100').render('markdown')\n"
        "kvplan.plan('llama-3-8b', '8k', 100, gpu='l40s')\n"
        "kvplan.profile\n"
        "print('HEAVY', [m for m in ('torch', 'transformers', 'huggingface_hub', 'matplotlib') if m in sys.modules])\n"
    )
    result = run_python(code, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "IMPORTED []" in result.stdout and "HEAVY []" in result.stdout, result.stdout
    one_line = run_python("import kvplan; print(kvplan.estimate('meta-llama/Llama-3-8B', "
                          "ctx=8192).kv_bytes_per_sequence)")
    assert one_line.stdout == "1073741824\n", one_line.stderr


def test_the_command_itself_still_runs_as_it_did():
    """The lazy package leaves `kvplan.main` eager (the console script) and `python -m kvplan` working."""
    from conftest import run_cli

    result = run_cli("estimate", "-m", "llama-3-8b", "--ctx", "8k", "--json")
    assert result.returncode == 0 and json.loads(result.stdout)["kv_bytes_per_sequence"] == GiB
    assert "kvplan.main" not in sys.modules or callable(kvplan.main)
