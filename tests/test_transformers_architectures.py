"""transformers failing on a config kvplan reads: one line, never a traceback. (Every architecture's cache and
parameters against transformers: tests/test_every_architecture.py.)"""

import json

import pytest
from archkit import shrunk
from conftest import assert_error_after_progress, run_main

pytest.importorskip("torch")
pytest.importorskip("transformers")


def edited_copy(tmp_path, model_type: str, **fields) -> str:
    path = tmp_path / f"{model_type}.json"
    path.write_text(json.dumps(shrunk(model_type, **fields)), encoding="utf-8")
    return str(path)


def test_a_config_transformers_rejects_is_one_line(tmp_path, monkeypatch, capsys):
    """transformers validates fields kvplan does not read: YaRN rope scaling needs its factor."""
    path = edited_copy(tmp_path, "glm4", rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0})
    code, _, err = run_main(monkeypatch, capsys, "profile", "--model", path, "--ctx", "40", "--device", "cpu",
                            "--layers", "1", "--decode-steps", "2")
    assert_error_after_progress(code, err, "rejects this glm4 config", "factor")


def test_a_model_transformers_cannot_build_is_one_line(tmp_path, monkeypatch, capsys):
    path = edited_copy(tmp_path, "glm4", hidden_act="no_such_activation")
    code, _, err = run_main(monkeypatch, capsys, "profile", "--model", path, "--ctx", "40", "--device", "cpu",
                            "--layers", "1", "--decode-steps", "2")
    assert_error_after_progress(code, err, "failed building its glm4 model", "no_such_activation")


def test_model_code_failing_is_one_line(tmp_path, monkeypatch, capsys):
    """X-MOD's forward raises until a language is set: transformers' code failing on a config it accepted (on the
    CPU first in the untimed pass of 16 tokens that opens the time estimate's pilot)."""
    code, _, err = run_main(monkeypatch, capsys, "profile", "--model", edited_copy(tmp_path, "xmod"), "--ctx", "40",
                            "--device", "cpu", "--layers", "1", "--decode-steps", "2")
    assert_error_after_progress(code, err, "failed running xmod on 1 x 16 tokens", "ValueError")
