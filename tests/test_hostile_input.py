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


@pytest.mark.parametrize("name", ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"])
def test_a_token_in_the_environment_is_checked_as_token_is(monkeypatch, capsys, hub_env, name):
    """huggingface_hub sends HF_TOKEN when no --token is given: a non-ASCII one failed in its HTTP client, blamed on
    HF_ENDPOINT; it is refused first, named and not shown. A --token replaces it, so it is not checked then."""
    hub, _ = hub_env
    monkeypatch.setenv(name, f"hf_Sécret {TOKEN}")
    code, out, err = run_main(monkeypatch, capsys, "estimate", "--model", "org/gated", "--ctx", "1k")
    assert_one_line_error(code, err, name)
    assert "Secret" not in out + err and "cret" not in err and not hub.requests
    code, out, err = run_main(monkeypatch, capsys, "estimate", "--model", "org/gated", "--ctx", "1k", "--token",
                              GOOD_TOKEN)
    assert code == 0, err


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


def test_usage_errors_are_short_and_plain(monkeypatch, capsys):
    """typer's own messages (an unknown option, an extra argument) quote what was typed: cut and escaped too."""
    for args in (["--" + "x" * 100_000], ["--x\x1b[2J"], ["extra\x1b]0;t\x07"]):
        code, _, err = run_main(monkeypatch, capsys, "estimate", "--model", "llama-3-8b", "--ctx", "8k", *args)
        assert_one_line_error(code, err)
        assert len(err) < 1100 and "\x1b" not in err and "\x07" not in err


def test_json_mode_warnings_show_config_text_as_text(monkeypatch, capsys, llama_named):
    """With --json the warnings go to stderr as plain lines: the model name in them is escaped as in reports."""
    code, out, err = run_main(monkeypatch, capsys, "estimate", "--model", llama_named("clear\x1b[2J\x07"), "--ctx",
                              "64k", "--json")
    assert code == 0 and json.loads(out)["ctx"] == 65536
    assert err.startswith("warning: ctx 65,536 is beyond clear\\x1b[2J\\x07's max context")
    assert "\x1b" not in err and "\x07" not in err


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


def test_out_never_overwrites_an_input_named_another_way(monkeypatch, capsys, tmp_path):
    """`--models ./cfg.json --out cfg.json`; a checkpoint directory, whose config.json, index and shards kvplan
    reads; a bundled config (here a copy standing in for the library's folder)."""
    from hubkit import safetensors_file, tiny_tensors

    from kvplan.sources import library

    monkeypatch.chdir(tmp_path)
    (tmp_path / "cfg.json").write_text(json.dumps(TINY_CONFIG), encoding="utf-8")
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(json.dumps(TINY_CONFIG), encoding="utf-8")
    (checkpoint / "model.safetensors").write_bytes(safetensors_file(tiny_tensors()))
    bundled = tmp_path / "specs"
    bundled.mkdir()
    entry = library.find("llama-3-8b")
    (bundled / entry.file).write_bytes(LLAMA.read_bytes())
    monkeypatch.setattr(library, "library_dir", lambda: bundled)
    before = {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()}
    for models, out in [("./cfg.json", "cfg.json"), ("./ckpt", "ckpt/config.json"), ("ckpt/", "ckpt/model.safetensors"),
                        ("llama-3-8b", f"specs/{entry.file}")]:
        code, _, err = table_to(monkeypatch, capsys, out, "-f", "csv", models=models)
        assert_one_line_error(code, err, "one of this command's inputs")
    assert {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()} == before
    code, _, err = table_to(monkeypatch, capsys, "ckpt/table.md", models="./ckpt")  # beside them is fine
    assert code == 0 and err.strip() == "kvplan: wrote ckpt/table.md"


def test_out_never_overwrites_another_part_of_a_split_gguf(monkeypatch, capsys, tmp_path):
    """Naming one part of a split GGUF reads all of them (tests/test_gguf.py): each is an input, not only the one
    named."""
    from test_gguf import write_split

    parts = write_split(tmp_path)
    before = [part.read_bytes() for part in parts]
    for named, out in ((parts[0], parts[2]), (parts[1], parts[0]), (parts[2], parts[1])):
        code, _, err = table_to(monkeypatch, capsys, str(out), "-f", "csv", models=str(named))
        assert_one_line_error(code, err, "one of this command's inputs")
    assert [part.read_bytes() for part in parts] == before


def test_out_takes_any_name_the_file_system_does(monkeypatch, capsys, tmp_path):
    """A file name may have 255 bytes; the temporary file written beside it had 14 more, so a name of 242 to 255
    bytes could not be written at all."""
    target = tmp_path / ("t" * 252 + ".md")
    code, _, err = table_to(monkeypatch, capsys, str(target))
    assert code == 0, err
    assert "| model" in target.read_text() and os.listdir(tmp_path) == [target.name]


@pytest.mark.parametrize("name", ["t" * 253 + ".md", "d/" * 2100 + "t.md"], ids=["256-byte name", "4200-byte path"])
def test_out_past_the_file_systems_limits_is_one_line(monkeypatch, capsys, tmp_path, name):
    """Past 255 bytes a name, or PATH_MAX a path, every look at the file failed (ENAMETOOLONG, exit 70)."""
    code, _, err = table_to(monkeypatch, capsys, str(tmp_path / name))
    assert_one_line_error(code, err, "cannot write", "too long")
    assert os.listdir(tmp_path) == []


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


# ---------------------------------------------------------------------------------------------- numbers


@pytest.mark.parametrize(("flag", "value", "fragment"), [
    ("--ctx", "9007199254740993", "more tokens than any model"),  # 2**53 + 1: a float would make it ...992
    ("--ctx", "1.0000000000000001", "not a whole number"),  # a float would take it as 1
    ("--ctx", "٣٢k", "not a token count"),  # Arabic-Indic digits
    ("--ctx", "9" * 5000, "not a token count"),
    ("--batch", "9" * 5000, "--batch"),  # click refuses it, past its own limit
    ("--batch", "9" * 20, "a 20-digit number"),
    ("--users", "99999999999", "--users must be between 1 and"),
    ("--block-size", "0", "--block-size must be between 1 and"),
    ("--kv-budget", "0.5B", "not a whole number of bytes"),  # a float would make it 0 bytes
    ("--kv-budget", "10EiB", "not a size"),
    ("--kv-budget", "2000000TiB", "more memory than any GPU set"),
    ("--engine-version", "٣.1", "not a release number"),
    ("--engine-version", "0.3²", "not a release number"),
])
def test_numbers_are_parsed_exactly_and_bounded(monkeypatch, capsys, flag, value, fragment):
    code, _, err = run_main(monkeypatch, capsys, "estimate", "--model", "llama-3-8b", "--ctx", "8k", "--gpu",
                            "h100", flag, value)
    assert_one_line_error(code, err, fragment)
    assert len(err) < 400


def test_exact_sizes_and_counts(monkeypatch, capsys):
    def plan(*args):
        code, out, err = run_main(monkeypatch, capsys, "estimate", "--model", "llama-3-8b", "--json", *args)
        assert code in (0, 1), err  # 1: printed, does not fit
        return json.loads(out)

    assert plan("--ctx", "9007199254740991")["ctx"] == 2**53 - 1
    assert plan("--ctx", "1.5k")["ctx"] == 1536
    assert plan("--ctx", "8k", "--kv-budget", "1073741824")["kv_budget_bytes"] == 2**30  # plain bytes
    assert plan("--ctx", "8k", "--gpu", "h100", "--overhead", "0GiB")["overhead_bytes"] == 0


def test_misleading_messages_name_what_was_given(monkeypatch, capsys):
    code, _, err = run_main(monkeypatch, capsys, "estimate", "--model", "llama-3-8b", "--ctx", "8k", "--gpu",
                            "h100", "--gpus", "3")
    assert_one_line_error(code, err, "--gpus 3 as TP 3")
    code, _, err = run_main(monkeypatch, capsys, "estimate", "--model", "llama-3-8b", "--ctx", "8k", "--engine",
                            "sglang", "--vram", "512KiB")
    assert_one_line_error(code, err, "SGLang's default --mem-fraction-static", "set the fraction yourself")


def test_kv_budget_prints_no_memory_fraction(monkeypatch, capsys):
    """--kv-budget is the KV memory itself: no gpu_memory_utilization applies, and the report said one did."""
    for extra in ((), ("--engine", "sglang"), ("--engine", "llama.cpp")):
        code, out, err = run_main(monkeypatch, capsys, "estimate", "--model", "llama-3-8b", "--ctx", "8k",
                                  "--kv-budget", "20GiB", *extra)
        assert code == 0, err
        assert "gpu_memory_utilization" not in out and "mem_fraction" not in out
    code, out, err = run_main(monkeypatch, capsys, "estimate", "--model", "llama-3-8b", "--ctx", "8k", "--gpu", "h100")
    assert code == 0 and "note: gpu_memory_utilization 0.92" in out  # where it does apply, it is said


@pytest.mark.parametrize("value", ["image=0,image=5", '{"image": 0, "image": 5}', "image=5, image=0"])
def test_a_modality_given_twice_is_refused(monkeypatch, capsys, value):
    """The second count silently replaced the first (a dict keeps the last); vLLM's JSON form is read by Python's
    json, which does the same."""
    code, _, err = run_main(monkeypatch, capsys, "estimate", "--model", "google/gemma-3-27b-it", "--ctx", "8k",
                            "--gpu", "h100", "--limit-mm-per-prompt", value)
    assert_one_line_error(code, err, "'image' more than once")


@pytest.mark.parametrize("value_of", ["--model", "--ctx", "--out"])
def test_debug_is_never_an_options_value(monkeypatch, capsys, tmp_path, value_of):
    """`--debug` was taken out of the arguments wherever it stood, so `--model --debug` left --model without its
    value and turned debugging on; an option's value is now its value."""
    monkeypatch.delenv("KVPLAN_DEBUG")
    monkeypatch.chdir(tmp_path)
    args = {"--model": ("estimate", "--model", "--debug", "--ctx", "8k"),
            "--ctx": ("estimate", "--model", "llama-3-8b", "--ctx", "--debug"),
            "--out": ("table", "--models", "llama-3-8b", "--ctx", "8k", "-f", "md", "--out", "--debug")}[value_of]
    code, _, err = run_main(monkeypatch, capsys, *args)
    if value_of == "--out":
        assert code == 0 and err.strip() == "kvplan: wrote --debug" and (tmp_path / "--debug").is_file()
    else:
        assert_one_line_error(code, err, "'--debug'")


def test_debug_is_still_a_flag_before_or_after_the_command(monkeypatch, capsys):
    from kvplan import memory

    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(memory, "estimate", broken)
    monkeypatch.delenv("KVPLAN_DEBUG")
    for args in (("--debug", "estimate", "--model", "llama-3-8b", "--ctx", "8k"),
                 ("estimate", "--model", "llama-3-8b", "--debug", "--ctx", "8k"),
                 ("estimate", "--json", "--debug", "--model", "llama-3-8b", "--ctx", "8k")):
        with pytest.raises(RuntimeError):
            run_main(monkeypatch, capsys, *args)
    code, _, err = run_main(monkeypatch, capsys, "estimate", "--model", "llama-3-8b", "--ctx", "8k")
    assert code == 70 and "bug in kvplan" in err


# config file, decoder fields: top-k above the expert count. Mixtral (MoE.read), Nemotron-H's MoE blocks and Gemma 4's
# MoE block each read it; Gemma 4 26B-A4B's published shape (128 experts of 704) on the 31B's config.
TOP_K = [("mistralai__Mixtral-8x7B-v0.1.json", {"num_experts_per_tok": 16}, "num_experts_per_tok"),
         ("nvidia__NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.json", {"num_experts_per_tok": 200}, "num_experts_per_tok"),
         ("google__gemma-4-31B-it.json", {"enable_moe_block": True, "num_experts": 128, "top_k_experts": 200,
                                          "moe_intermediate_size": 704}, "top_k_experts")]


@pytest.mark.parametrize(("filename", "edits", "field"), TOP_K)
def test_top_k_above_the_expert_count_is_refused(monkeypatch, capsys, tmp_path, filename, edits, field):
    """Accepted once, it counted more active parameters than the model has (Mixtral "46.70B params (91.80B
    active)")."""
    data = json.loads((SPECS / filename).read_text(encoding="utf-8"))
    (data["text_config"] if "text_config" in data else data).update(edits)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    code, _, err = run_main(monkeypatch, capsys, "estimate", "--model", str(path), "--ctx", "8k")
    assert_one_line_error(code, err, field, "cannot exceed the expert count")


@pytest.mark.parametrize("value", [10**400, 1e300, float("nan")], ids=["10**400", "1e300", "nan"])
@pytest.mark.parametrize(("filename", "path"), [("LiquidAI__LFM2-1.2B.json", ("block_ffn_dim_multiplier",)),
                                                ("nvidia__Llama-3_3-Nemotron-Super-49B-v1.json",
                                                 ("block_configs", 0, "ffn", "ffn_mult"))])
def test_a_factor_too_large_for_a_float_is_one_line(monkeypatch, capsys, tmp_path, filename, path, value):
    """An MLP multiplier of 10**400 overflowed converting to a float, and one of 1e300 overflowed the sizes made
    from it (a traceback)."""
    data = json.loads((SPECS / filename).read_text(encoding="utf-8"))
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    config = tmp_path / "config.json"
    config.write_text(json.dumps(data), encoding="utf-8")
    code, _, err = run_main(monkeypatch, capsys, "estimate", "--model", str(config), "--ctx", "8k", "--gpu", "h100")
    assert_one_line_error(code, err, path[-1], "positive number up to")
    assert len(err) < 400


@pytest.mark.parametrize(("field", "value", "line"), [("total: 13_000_000_000", str(10**400), 9),
                                                      ("kv_heads: 8", str(10**300), 23),
                                                      ("ssm_elements: 1048576", ".inf", 19)])
def test_a_yaml_number_too_large_for_a_float_is_one_line(monkeypatch, capsys, tmp_path, field, value, line):
    from conftest import ROOT

    text = (ROOT / "docs" / "examples" / "hybrid-example.yaml").read_text(encoding="utf-8")
    assert field in text
    path = tmp_path / "spec.yaml"
    path.write_text(text.replace(field, f"{field.split(':')[0]}: {value}", 1), encoding="utf-8")
    code, _, err = run_main(monkeypatch, capsys, "estimate", "--model", str(path), "--ctx", "8k", "--gpu", "h100")
    assert_one_line_error(code, err, f"spec.yaml:{line}:", field.split(":")[0], "a number no real model has")
    assert len(err) < 400


@pytest.mark.parametrize("name", ["a$\\foo{$b", "x$^{$y", "_hidden", "clear\x1b[2J\x07"])
def test_a_chart_shows_model_names_as_text(monkeypatch, capsys, tmp_path, llama_named, name):
    """matplotlib parses `$...$` as mathtext (a malformed one raised), drops a legend label starting with `_`,
    and warns on stderr for a control character: each name is drawn as written, escapes shown."""
    pytest.importorskip("matplotlib")
    from kvplan import plot

    legends = []
    save = plot._save

    def keep_legend(figure, *args):  # the real save, the legend's texts noted
        legends.append([text.get_text() for text in figure.axes[0].get_legend().get_texts()])
        save(figure, *args)

    monkeypatch.setattr(plot, "_save", keep_legend)
    config = llama_named(name)
    target = tmp_path / "chart.svg"
    code, _, err = run_main(monkeypatch, capsys, "plot", "--models", config, "--ctx", "4k,8k", "--out", str(target),
                            "--title", "cost in $ and $\\")
    assert code == 0 and err.strip() == f"kvplan: wrote {target}"
    shown = name.replace("\x1b", "\\x1b").replace("\x07", "\\x07").replace("$", "\\$")
    assert legends == [[shown]]


def test_plot_of_users_when_nothing_fits_is_one_line(monkeypatch, capsys, tmp_path):
    pytest.importorskip("matplotlib")
    code, _, err = run_main(monkeypatch, capsys, "plot", "--models", "llama-3-70b", "--gpu", "rtx-4090", "--kind",
                            "users", "--ctx", "8k", "--out", str(tmp_path / "x.png"))
    assert_one_line_error(code, err, "no user fits")
    assert not (tmp_path / "x.png").exists()


def test_profile_device_names_are_checked(monkeypatch, capsys):
    pytest.importorskip("torch")
    code, _, err = run_main(monkeypatch, capsys, "profile", "--model", "llama-3-8b", "--ctx", "64", "--device",
                            "cuda:x")
    assert_one_line_error(code, err, "--device", "cuda:N")


# ---------------------------------------------------------------------------------------------- files


def test_a_fifo_or_device_is_refused_not_read(monkeypatch, capsys, tmp_path):
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    code, _, err = run_main(monkeypatch, capsys, "estimate", "--model", str(fifo), "--ctx", "8k")
    assert_one_line_error(code, err, "not a regular file")
    code, _, err = run_main(monkeypatch, capsys, "table", "--models", f"@{fifo}", "--ctx", "8k")
    assert_one_line_error(code, err, "not a regular file")
    code, _, err = run_main(monkeypatch, capsys, "table", "--models", "@/dev/zero", "--ctx", "8k")
    assert_one_line_error(code, err, "not a regular file")


def test_a_huge_config_is_not_read(monkeypatch, capsys, tmp_path):
    path = tmp_path / "config.json"
    with path.open("w", encoding="utf-8") as handle:
        handle.write('{"padding": "' + "x" * (17 * 2**20) + '"}')
    code, _, err = run_main(monkeypatch, capsys, "estimate", "--model", str(path), "--ctx", "8k")
    assert_one_line_error(code, err, "larger than 16 MiB")


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, '{"num_hidden_layers": ' + "9" * 5000 + "}",
                                  '{"a": ' * 50_000 + "1" + "}" * 50_000])
def test_json_too_deep_or_too_long_is_one_line(monkeypatch, capsys, tmp_path, text):
    path = tmp_path / "config.json"
    path.write_text(text, encoding="utf-8")
    code, _, err = run_main(monkeypatch, capsys, "estimate", "--model", str(path), "--ctx", "8k")
    assert_one_line_error(code, err, "config.json")
    assert len(err) < 400


@pytest.mark.parametrize("text", ["a: " + "[" * 50_000 + "]" * 50_000, "name: x\nnum_attention_heads: " + "9" * 5000])
def test_yaml_too_deep_or_too_long_is_one_line(monkeypatch, capsys, tmp_path, text):
    path = tmp_path / "spec.yaml"
    path.write_text(text, encoding="utf-8")
    code, _, err = run_main(monkeypatch, capsys, "estimate", "--model", str(path), "--ctx", "8k")
    assert_one_line_error(code, err, "spec.yaml")


def checkpoint_dir(tmp_path, weight_map: dict) -> str:
    from hubkit import safetensors_file, tiny_tensors

    directory = tmp_path / "model"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(TINY_CONFIG), encoding="utf-8")
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}),
                                                            encoding="utf-8")
    (tmp_path / "outside.safetensors").write_bytes(safetensors_file(tiny_tensors()))
    return str(directory)


def assert_weights_from_config_not_outside(monkeypatch, capsys, directory):
    """The weights come from the config, with a note, where a checkpoint's file lies outside its directory."""
    code, out, err = run_main(monkeypatch, capsys, "estimate", "--model", directory, "--ctx", "1k", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["weights_source"] == "config"
    assert any("outside the checkpoint directory" in note for note in data["notes"])


@pytest.mark.parametrize("shard", ["../outside.safetensors", "/etc/passwd", "sub/../../outside.safetensors",
                                   "link.safetensors", "linked/outside.safetensors"])
def test_an_index_cannot_name_files_outside_the_checkpoint(monkeypatch, capsys, tmp_path, shard):
    """Named outright, or through a link in the directory (to the file, or to the folder holding it): the first
    8 bytes of /etc/passwd were once shown as a header length, and a file elsewhere counted as the weights."""
    directory = checkpoint_dir(tmp_path, {"embed.weight": shard})
    os.symlink(tmp_path / "outside.safetensors", os.path.join(directory, "link.safetensors"))
    os.symlink(tmp_path, os.path.join(directory, "linked"))
    assert_weights_from_config_not_outside(monkeypatch, capsys, directory)


@pytest.mark.parametrize("target", ["/etc/passwd", "../outside.safetensors"])
def test_a_single_file_checkpoint_cannot_link_outside(monkeypatch, capsys, tmp_path, target):
    directory = checkpoint_dir(tmp_path, {})
    os.unlink(os.path.join(directory, "model.safetensors.index.json"))
    os.symlink(target, os.path.join(directory, "model.safetensors"))
    assert_weights_from_config_not_outside(monkeypatch, capsys, directory)


def test_a_link_inside_the_checkpoint_is_followed(monkeypatch, capsys, tmp_path):
    """A shard that links to a file in the same directory is read (a cache snapshot's links are tested in
    test_hub_cache)."""
    from hubkit import safetensors_file, tiny_tensors

    directory = checkpoint_dir(tmp_path, {"embed.weight": "model.safetensors"})
    os.unlink(os.path.join(directory, "model.safetensors.index.json"))
    with open(os.path.join(directory, "weights.bin"), "wb") as handle:
        handle.write(safetensors_file(tiny_tensors()))
    os.symlink("weights.bin", os.path.join(directory, "model.safetensors"))
    code, out, err = run_main(monkeypatch, capsys, "estimate", "--model", directory, "--ctx", "1k", "--json")
    assert code == 0 and json.loads(out)["weights_source"] == "checkpoint", err


# a header: what it holds, and the note's reason
HEADERS = {"deep": (b"[" * 100_000 + b"]" * 100_000, "header is not JSON a checkpoint writes"),
           "digits": (b'{"a": {"dtype": "BF16", "shape": [' + b"9" * 5000 + b'], "data_offsets": [0, 0]}}',
                      "header is not JSON a checkpoint writes"),
           "past the limit": (b"{}", "past the format's limit")}


@pytest.mark.parametrize("kind", list(HEADERS))
def test_a_hostile_safetensors_header_is_a_note(monkeypatch, capsys, tmp_path, kind):
    import struct

    directory = checkpoint_dir(tmp_path, {})
    os.unlink(os.path.join(directory, "model.safetensors.index.json"))
    body, reason = HEADERS[kind]
    length = 2**63 if kind == "past the limit" else len(body)
    with open(os.path.join(directory, "model.safetensors"), "wb") as handle:
        handle.write(struct.pack("<Q", length) + body)
    code, out, err = run_main(monkeypatch, capsys, "estimate", "--model", directory, "--ctx", "1k", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["weights_source"] == "config"
    assert any("safetensors header unreadable" in note and reason in note for note in data["notes"])


@pytest.mark.parametrize(("text", "reason"), [
    ('{"weight_map": ' + "[" * 100_000 + "]" * 100_000 + "}", "not a readable"),
    ('{"weight_map": {"a": ' + "9" * 5000 + "}}", "not a readable"),
    ("{}", "larger than 64 MiB"),
], ids=["deep", "digits", "huge"])
def test_a_hostile_index_is_a_note(monkeypatch, capsys, tmp_path, text, reason):
    directory = checkpoint_dir(tmp_path, {})
    index = os.path.join(directory, "model.safetensors.index.json")
    with open(index, "w", encoding="utf-8") as handle:
        handle.write(text)
    if text == "{}":
        os.truncate(index, 65 * 2**20)  # past MAX_INDEX (a sparse file: nothing is written)
    code, out, err = run_main(monkeypatch, capsys, "estimate", "--model", directory, "--ctx", "1k", "--json")
    assert code == 0, err
    assert any(f"model.safetensors.index.json: {reason}" in note for note in json.loads(out)["notes"])


def test_keep_going_contains_hostile_files(monkeypatch, capsys, tmp_path):
    """--keep-going leaves out a deep JSON or a YAML with a 5,000-digit number like any other bad model."""
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")
    (tmp_path / "digits.yaml").write_text("name: x\nnum_attention_heads: " + "9" * 5000, encoding="utf-8")
    code, out, err = run_main(monkeypatch, capsys, "table", "--models",
                              f"llama-3-8b,{tmp_path / 'deep.json'},{tmp_path / 'digits.yaml'}", "--ctx", "8k",
                              "-f", "csv", "--keep-going")
    assert_one_line_error(code, err, "2 of 3")
    assert [row["model"] for row in csv.DictReader(io.StringIO(out))] == ["meta-llama/Meta-Llama-3-8B"]


@pytest.mark.parametrize("weight_map", [{"a": 7}, {"a": ["x"]}, {"a": None}, ["x"]])
def test_an_index_of_the_wrong_shape_is_a_note(monkeypatch, capsys, tmp_path, weight_map):
    directory = checkpoint_dir(tmp_path, weight_map)
    code, out, err = run_main(monkeypatch, capsys, "estimate", "--model", directory, "--ctx", "1k", "--json")
    assert code == 0, err
    assert any("not a readable index" in note for note in json.loads(out)["notes"])


# ---------------------------------------------------------------------------------------------- the Hub


class MisbehavingHub:
    """A loopback server at HF_ENDPOINT that answers every request in one wrong way: `mode` is html (a captive
    portal's 200 page), redirect-loop, redirect-file, wrong-shape (model info that is a list), trickle (a
    complete-looking answer sent one byte every 0.3 s), huge-config (model info saying config.json is 300 MB),
    size-text or name-list (model info whose file listing holds a size that is text, a name that is a list)."""

    def __init__(self, mode: str):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.requests: list[str] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                hub.requests.append(self.path)
                hub.answer(self, mode)

            do_HEAD = do_GET

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

    def answer(self, req, mode: str) -> None:
        import time

        def send(status: int, body: bytes, **headers) -> None:
            try:
                req.send_response(status)
                for name, value in headers.items():
                    req.send_header(name.replace("_", "-"), value)
                req.send_header("Content-Length", str(len(body)))
                req.end_headers()
                if mode == "trickle":
                    for byte in body:
                        req.wfile.write(bytes([byte]))
                        req.wfile.flush()
                        time.sleep(0.3)
                else:
                    req.wfile.write(body)
            except OSError:
                pass  # kvplan gave up: what it should do

        if mode == "html":
            return send(200, b"<html><body>Please log in to the hotel wifi</body></html>", Content_Type="text/html")
        if mode == "redirect-loop":
            return send(302, b"", Location=req.path)
        if mode == "redirect-file":
            return send(302, b"", Location="file:///etc/passwd")
        if mode == "wrong-shape":
            return send(200, b'["not", "a", "model"]', Content_Type="application/json")
        if mode in ("size-text", "name-list"):
            sibling = {"rfilename": "config.json", "size": "big"} if mode == "size-text" else {"rfilename": ["x"]}
            info = {"id": "org/model", "sha": "0" * 40, "siblings": [sibling]}
            return send(200, json.dumps(info).encode(), Content_Type="application/json")
        info = {"id": "org/model", "sha": "0" * 40, "siblings": [{"rfilename": "config.json", "size": 300 * 2**20}]}
        return send(200, json.dumps(info).encode(), Content_Type="application/json")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("mode", ["html", "redirect-loop", "redirect-file", "wrong-shape", "trickle",
                                  "huge-config", "size-text", "name-list"])
def test_a_server_that_is_not_the_hub_is_one_line(monkeypatch, capsys, tmp_path, mode):
    import time

    hub = MisbehavingHub(mode)
    try:
        hub_environment(monkeypatch, tmp_path / "hf", endpoint=hub.url, etag_timeout=1, download_timeout=1)
        start = time.monotonic()
        code, _, err = run_main(monkeypatch, capsys, "estimate", "--model", "org/model", "--ctx", "1k")
        assert time.monotonic() - start < 20  # 3 s a call at most with these timeouts
    finally:
        hub.close()
    fragment = {"trickle": "did not answer in time", "huge-config": "far past any real config"}
    assert_one_line_error(code, err, fragment.get(mode, "HF_ENDPOINT"))
    if mode == "huge-config":
        assert not any("/resolve/" in path for path in hub.requests)  # never downloaded


@pytest.mark.parametrize(("name", "value"), [("HF_HUB_ETAG_TIMEOUT", "ten"), ("HF_HUB_DOWNLOAD_TIMEOUT", "1.5"),
                                             ("HF_ENDPOINT", "huggingface.co"), ("HF_ENDPOINT", "http://[::1")])
def test_a_malformed_hub_variable_is_named(monkeypatch, capsys, tmp_path, name, value):
    import sys

    hub_environment(monkeypatch, tmp_path / "hf")
    monkeypatch.setenv(name, value)
    for module in [m for m in sys.modules if m.startswith("huggingface_hub")]:  # it reads them on import
        monkeypatch.delitem(sys.modules, module)
    code, _, err = run_main(monkeypatch, capsys, "estimate", "--model", "org/model", "--ctx", "1k")
    assert_one_line_error(code, err, name)


def test_the_most_layers_a_config_may_have_do_not_hang(tmp_path):
    """99,999 layers (MAX_LAYERS is 100,000): reading them once per layer made this take minutes (found by the
    fuzzer); it must answer well within the timeout."""
    from conftest import run_cli

    data = json.loads((SPECS / "google__gemma-3-27b-it.json").read_text(encoding="utf-8"))
    data["text_config"]["num_hidden_layers"] = 99_999
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    result = run_cli("estimate", "--model", str(path), "--ctx", "8k", "--json", timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["breakdown"][0]["layers"] > 80_000
