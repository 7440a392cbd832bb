"""Input from an attacker or a careless user: no secret echoed, no user file destroyed, config text shown as text,
no traceback, no hang. Every error is one line and exit 2 (`assert_one_line_error`)."""

import csv
import io
import json
import os

import pytest
from conftest import SPECS, assert_one_line_error, run_main
from hubkit import GOOD_TOKEN, TINY_CONFIG, FakeHub, hub_environment

LLAMA = SPECS / "meta-llama__Meta-Llama-3-8B.json"
TOKEN = "hf_SecretTokenValue123"


@pytest.fixture
def hub_env(monkeypatch, tmp_path):
    """A loopback Hub holding a gated repo `org/gated` that GOOD_TOKEN may read."""
    hub = FakeHub()
    hub.add("org/gated", {"config.json": json.dumps(TINY_CONFIG).encode()}, gated=True)
    env = hub_environment(monkeypatch, tmp_path / "hf", endpoint=hub.url)
    yield hub, env
    hub.close()


@pytest.fixture
def llama_named(tmp_path):
    """A genuine config.json whose model name is the given text."""
    def write(name: str, **fields) -> str:
        data = json.loads(LLAMA.read_text(encoding="utf-8")) | {"_name_or_path": name, **fields}
        path = tmp_path / "config.json"
        path.write_text(json.dumps(data), encoding="utf-8")
        return str(path)

    return write


# ---------------------------------------------------------------------------------------------- secrets


@pytest.mark.parametrize("token", [f"hf_Secret\x1bToken{TOKEN}", f"{TOKEN} extra", "\t\r\n", f"hf_Sécret{TOKEN}"])
def test_a_token_kvplan_cannot_send_is_refused_and_never_echoed(monkeypatch, capsys, hub_env, token):
    hub, _ = hub_env
    code, out, err = run_main(monkeypatch, capsys, "estimate", "--model", "org/gated", "--ctx", "1k", "--token",
                              token)
    assert_one_line_error(code, err, "--token")
    assert "Secret" not in out + err and not hub.requests  # refused before anything is sent


def test_a_token_read_from_a_crlf_file_works(monkeypatch, capsys, hub_env):
    """`--token "$(cat token.txt)"` of a file saved with Windows line endings keeps its CR: it is stripped, as
    huggingface_hub strips HF_TOKEN, and the token is sent and never shown."""
    code, out, err = run_main(monkeypatch, capsys, "estimate", "--model", "org/gated", "--ctx", "1k", "--token",
                              GOOD_TOKEN + "\r", "--json")
    assert code == 0, err
    assert GOOD_TOKEN not in out + err


def test_a_bug_is_one_line_without_the_traceback_or_its_values(monkeypatch, capsys):
    """The last resort: an exception kvplan did not foresee says it is a bug, exit 70, and shows neither its
    message (which may hold a token or a path) nor a traceback unless --debug asks."""
    from kvplan import memory

    def broken(*args, **kwargs):
        raise RuntimeError(f"failed with {TOKEN}")

    monkeypatch.setattr(memory, "estimate", broken)
    monkeypatch.delenv("KVPLAN_DEBUG")
    code, out, err = run_main(monkeypatch, capsys, "estimate", "--model", "llama-3-8b", "--ctx", "8k")
    assert code == 70
    assert err.count("\n") == 1 and "bug in kvplan" in err and "RuntimeError" in err
    assert TOKEN not in err and "Traceback" not in err
    with pytest.raises(RuntimeError):
        run_main(monkeypatch, capsys, "estimate", "--model", "llama-3-8b", "--ctx", "8k", "--debug")


# ---------------------------------------------------------------------------------------------- config text


HOSTILE_NAMES = ["evil[/dim]", "[link=https://example.com]click[/link]", "x\x1b]0;pwned\x07y", "clear\x1b[2J",
                 "bidi\u202eevil", "two\nlines", "[bold red]loud"]


@pytest.mark.parametrize("name", HOSTILE_NAMES)
@pytest.mark.parametrize("command", [["estimate", "--ctx", "8k"], ["estimate", "--ctx", "8k", "--gpu", "h100"],
                                     ["show"], ["plan", "--ctx", "8k", "--users", "4", "--gpu", "h100"]])
def test_config_text_is_shown_as_text(monkeypatch, capsys, llama_named, name, command):
    code, out, err = run_main(monkeypatch, capsys, command[0], "--model", llama_named(name), *command[1:])
    assert code == 0, err
    assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out
    shown = name.replace("\x1b", "\\x1b").replace("\x07", "\\x07").replace("\u202e", "\\u202e") \
        .replace("\n", "\\x0a")
    assert shown in out  # brackets and all: markup is never parsed


def test_error_lines_show_file_names_safely_and_values_briefly(monkeypatch, capsys, tmp_path):
    bad = tmp_path / "bad\x1b[2J\x07.json"
    bad.write_text("{not json", encoding="utf-8")
    code, _, err = run_main(monkeypatch, capsys, "estimate", "--model", str(bad), "--ctx", "8k")
    assert_one_line_error(code, err, "malformed JSON", "bad\\x1b[2J\\x07.json")
    assert "\x1b" not in err and "\x07" not in err
    code, _, err = run_main(monkeypatch, capsys, "estimate", "--model", "llama-3-8b", "--ctx", "8x" * 10**6)
    assert_one_line_error(code, err, "--ctx", "more characters")
    assert len(err) < 1000


def test_csv_cells_cannot_become_formulas(monkeypatch, capsys, llama_named):
    path = llama_named("=HYPERLINK(\"http://example.com\",\"x\")")
    code, out, err = run_main(monkeypatch, capsys, "table", "--models", path, "--ctx", "8k", "-f", "csv")
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    assert rows[0]["model"].startswith("'=HYPERLINK")
    assert all(not cell.startswith(("=", "+", "@")) for row in rows for cell in row.values())


def test_markdown_cells_hold_one_line_of_text(monkeypatch, capsys, llama_named):
    path = llama_named("a|b\n| injected | row |\n<script>[x](y)")
    code, out, err = run_main(monkeypatch, capsys, "table", "--models", path, "--ctx", "8k", "-f", "md")
    assert code == 0, err
    lines = out.strip().splitlines()
    assert len(lines) == 3  # header, rule, one row
    assert "\\|" in lines[2] and "<script>" not in out and "\\[x\\]" in out


# ---------------------------------------------------------------------------------------------- --out


def table_to(monkeypatch, capsys, out: str, *extra: str, models: str = "llama-3-8b"):
    return run_main(monkeypatch, capsys, "table", "--models", models, "--ctx", "8k", "-f", "md", "--out", out,
                    *extra)


def test_out_says_where_it_went_and_what_it_replaced(monkeypatch, capsys, tmp_path):
    target = tmp_path / "t.md"
    code, _, err = table_to(monkeypatch, capsys, str(target))
    assert code == 0 and err.strip() == f"kvplan: wrote {target}"
    target.write_text("old", encoding="utf-8")
    code, _, err = table_to(monkeypatch, capsys, str(target))
    assert code == 0 and err.strip() == f"kvplan: replaced {target}" and "| model" in target.read_text()


def test_out_never_overwrites_an_input(monkeypatch, capsys, tmp_path, llama_named):
    config = llama_named("m")
    before = open(config, encoding="utf-8").read()
    code, _, err = table_to(monkeypatch, capsys, config, models=config)
    assert_one_line_error(code, err, "one of this command's inputs")
    listing = tmp_path / "models.txt"
    listing.write_text("llama-3-8b\n", encoding="utf-8")
    code, _, err = table_to(monkeypatch, capsys, str(listing), models=f"@{listing}")
    assert_one_line_error(code, err, "one of this command's inputs")
    assert open(config, encoding="utf-8").read() == before and listing.read_text() == "llama-3-8b\n"


def test_out_does_not_follow_a_symlink_without_force(monkeypatch, capsys, tmp_path):
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me", encoding="utf-8")
    link, dangling = tmp_path / "link.md", tmp_path / "dangling.md"
    link.symlink_to(precious)
    dangling.symlink_to(tmp_path / "nowhere" / "x.md")
    for target in (link, dangling):
        code, _, err = table_to(monkeypatch, capsys, str(target))
        assert_one_line_error(code, err, "symbolic link", "--force")
    assert precious.read_text() == "keep me" and not (tmp_path / "nowhere").exists()
    code, _, err = table_to(monkeypatch, capsys, str(link), "--force")
    assert code == 0 and link.is_symlink() and "| model" in precious.read_text()


def test_a_failed_write_leaves_the_old_file_whole(monkeypatch, capsys, tmp_path):
    """A write that fails part way (a full disk) must not leave a truncated file where the old one was."""
    target = tmp_path / "t.md"
    target.write_text("the old table", encoding="utf-8")
    from pathlib import Path

    real = Path.write_text

    def disk_full(self, text, *args, **kwargs):
        real(self, text[:10], *args, **kwargs)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", disk_full)
    code, _, err = table_to(monkeypatch, capsys, str(target))
    monkeypatch.undo()
    assert_one_line_error(code, err, "no space left", "unchanged")
    assert target.read_text() == "the old table"
    assert os.listdir(tmp_path) == ["t.md"]  # no temporary file left behind


def test_plot_out_is_written_the_same_way(monkeypatch, capsys, tmp_path, llama_named):
    pytest.importorskip("matplotlib")
    config = llama_named("m")
    link = tmp_path / "chart.svg"
    link.symlink_to(tmp_path / "elsewhere.svg")
    code, _, err = run_main(monkeypatch, capsys, "plot", "--models", config, "--ctx", "4k,8k", "--out", str(link))
    assert_one_line_error(code, err, "symbolic link")
    target = tmp_path / "chart2.svg"
    code, _, err = run_main(monkeypatch, capsys, "plot", "--models", config, "--ctx", "4k,8k", "--out", str(target))
    assert code == 0 and err.strip() == f"kvplan: wrote {target}" and target.read_text().startswith("<?xml")
