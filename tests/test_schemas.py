"""The JSON Schemas shipped in kvplan/schemas/: generated from the result types (a drift fails here), printed by
`kvplan schema`, and holding what the commands really print: every `--json` output of a matrix of models, engines
and GPUs validates against its schema (jsonschema, draft 2020-12), every key it prints is one the schema names, and
it carries the schema's version."""

import json

import pytest
from conftest import assert_one_line_error, run_main

jsonschema = pytest.importorskip("jsonschema")

from kvplan import schemas  # noqa: E402
from kvplan.schemas.generate import generate  # noqa: E402

ESTIMATES = [
    ("meta-llama/Llama-3-8B", "8k"),
    ("google/gemma-3-27b-it", "32k", "--gpu", "h100", "--batch", "8"),
    ("Qwen/Qwen3-32B", "128k", "--gpu", "h100", "--engine", "sglang"),
    ("deepseek-ai/DeepSeek-V3", "32k", "--gpu", "8xh200", "--tp", "8"),
    ("meta-llama/Llama-3.1-8B", "8k", "--vram", "24GiB", "--engine", "llama.cpp", "--cache-type-v", "q8_0"),
    ("meta-llama/Llama-3.1-8B", "8k", "--gpu", "h100", "--engine", "transformers"),
    ("meta-llama/Llama-3.1-8B", "8k", "--gpu", "h100", "--enable-lora", "--speculative-method", "ngram",
     "--speculative-tokens", "3"),
    ("openai/gpt-oss-120b", "128k", "--gpu", "l40s"),  # does not fit: exit 1, the JSON printed all the same
    ("meta-llama/Llama-3.1-8B", "8k", "--isl", "1k", "--osl", "1k"),  # no GPU: a note, no speed
    ("meta-llama/Llama-3.1-8B", "8k", "--isl", "1k", "--osl", "1k", "--gpu", "h100", "--users", "32"),
    ("openai/gpt-oss-120b", "4k", "--isl", "2k", "--osl", "1k", "--gpu", "h200", "--max-tpot", "20",
     "--min-tps", "30"),
]
TABLES = [
    ("--models", "meta-llama/Llama-3.1-8B,openai/gpt-oss-20b", "--ctx", "8k,1M"),
    ("--models", "meta-llama/Llama-3.1-8B,google-bert/bert-base-uncased,MiniMaxAI/MiniMax-M2", "--ctx", "8k",
     "--gpu", "h100,4xa100-80gb,m2-ultra", "--engine", "vllm"),
    ("--models", "meta-llama/Llama-3.1-8B,openai/gpt-oss-20b", "--isl", "1k", "--osl", "1k", "--ctx", "2k,8k",
     "--gpu", "h100,m2-ultra", "--engine", "vllm"),
]
PLANS = [
    ("--model", "meta-llama/Llama-3.1-70B", "--ctx", "32k", "--users", "64", "--gpu", "h100"),
    ("--model", "meta-llama/Llama-3.1-70B", "--ctx", "1M", "--users", "64", "--gpu", "rtx-4090", "--max-gpus", "2"),
    ("--model", "meta-llama/Llama-3.1-70B", "--isl", "1k", "--osl", "1k", "--users", "64", "--gpu", "h100"),
    ("--model", "openai/gpt-oss-120b", "--isl", "1k", "--osl", "1k", "--users", "256", "--gpu", "h200",
     "--max-tpot", "20"),
]


def shipped(name: str) -> dict:
    return json.loads(schemas.text(name))


def check(name: str, output: dict) -> None:
    schema = shipped(name)
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(output, schema, cls=jsonschema.Draft202012Validator)
    assert output["schema_version"] == schemas.SCHEMA_VERSION
    assert set(output) <= set(schema["properties"]), set(output) - set(schema["properties"])


def test_shipped_schemas_are_what_the_types_give():
    texts = generate()
    assert set(texts) == set(schemas.NAMES)
    for name, text in texts.items():
        assert schemas.text(name) == text, f"kvplan/schemas/{name}.json is stale: run python -m kvplan.schemas"


def test_schema_command_prints_the_shipped_file(monkeypatch, capsys):
    for name in schemas.NAMES:
        code, out, err = run_main(monkeypatch, capsys, "schema", name)
        assert (code, err) == (0, "") and out == schemas.text(name)
    code, _, err = run_main(monkeypatch, capsys, "schema", "<b>estimates</b>")
    assert_one_line_error(code, err, "no schema named '<b>estimates</b>'", "estimate, table, plan")


@pytest.mark.parametrize("args", ESTIMATES, ids=lambda args: " ".join(args))
def test_estimate_output_holds_to_its_schema(args, monkeypatch, capsys):
    model, ctx, *flags = args
    code, out, err = run_main(monkeypatch, capsys, "estimate", "--model", model, "--ctx", ctx, *flags, "--json")
    assert code in (0, 1), err
    output = json.loads(out)
    check("estimate", output)
    required = shipped("estimate")["dependentRequired"]
    planned = "--gpu" in flags or "--vram" in flags
    assert ("engine" in output) == planned and (not planned or set(required["engine"]) <= set(output))
    assert ("decode_step_ms" in output) == (planned and "--isl" in flags)
    assert ("speed_fit_users" in output) == ("--max-tpot" in flags)


@pytest.mark.parametrize("args", TABLES, ids=lambda args: " ".join(args))
def test_table_output_holds_to_its_schema(args, monkeypatch, capsys):
    code, out, err = run_main(monkeypatch, capsys, "table", *args, "--format", "json", "--keep-going")
    output = json.loads(out)
    check("table", output)
    assert output["rows"] and (code == 0) == (not output["failures"]), err


@pytest.mark.parametrize("args", PLANS, ids=lambda args: " ".join(args))
def test_plan_output_holds_to_its_schema(args, monkeypatch, capsys):
    code, out, err = run_main(monkeypatch, capsys, "plan", *args, "--json")
    assert code in (0, 1), err
    output = json.loads(out)
    check("plan", output)
    assert (code == 0) == bool(output["rows"])


def test_the_schemas_refuse_what_the_outputs_must_not_be(monkeypatch, capsys):
    """The checks above can fail: a key missing, a size that is not a whole number, another version."""
    _, out, _ = run_main(monkeypatch, capsys, "estimate", "--model", "meta-llama/Llama-3-8B", "--ctx", "8k",
                         "--gpu", "h100", "--json")
    output = json.loads(out)
    for broken in ({k: v for k, v in output.items() if k != "kv_bytes_per_sequence"},
                   {k: v for k, v in output.items() if k != "max_concurrent_users"},
                   output | {"kv_bytes_per_sequence": 1.5}, output | {"schema_version": "0.9"}):
        with pytest.raises(jsonschema.ValidationError):
            check("estimate", broken)
