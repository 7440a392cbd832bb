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
