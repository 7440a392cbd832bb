#!/usr/bin/env python3
"""Regenerate every example in the docs with kvplan itself: what each `$ kvplan ...` block of README.md and
docs/*.md shows, the tables and charts in docs/examples/, and the snippets embedded in docs/tables.md between
`<!-- generated: FILE -->` and `<!-- end generated -->` markers.

    python docs/generate.py            # rewrite them in place
    python docs/generate.py --check    # exit 1, naming them, if any committed file is stale
    python docs/generate.py --out DIR  # write the same files under DIR instead (tests/test_docs_fresh.py)

Every example is a real `kvplan` command line, run in this process through the CLI, so the docs show exactly what
the command prints; so are the few figures the prose states (`FACTS`). A fenced block whose first line is
`$ kvplan ...` is an example: each `$` line is run as a person at a terminal 80 columns wide runs it, in a scratch
directory holding the files the examples name (`fixtures`), and the lines after it become what it prints (its
output, then its errors). A comment on the line before the block sets how (`<!-- example: width=160 -->`):

    width=N         the terminal's columns (default 80)
    from=TEXT       show the output from its first line starting with TEXT (after `  ... (trimmed: NOTE)`)
    head=N          show the first N lines of the output (then `  ... (trimmed: NOTE)`)
    note=TEXT       what a trimmed part held
    output=none     run the commands (each must succeed) but show only the command lines

Charts are SVG, which kvplan writes deterministically; where the installed matplotlib differs from the one that
drew the committed SVG (its Creator metadata), the check compares the plotted numbers kept in the SVG's metadata
instead of the bytes.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shlex
import sys
import tempfile
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
PAGE = "tables.md"
EXAMPLES = "examples"
MODELS = "meta-llama/Llama-3.1-8B,Qwen/Qwen3-32B,google/gemma-3-27b-it,openai/gpt-oss-20b"
CTX = "4k,8k,32k,128k"
GPUS = "h100,l40s"

# file under examples/ -> the kvplan arguments that make it (an --out into examples/ is added)
EXAMPLE_COMMANDS: dict[str, list[str]] = {
    "table-h100-l40s.md": ["table", "--models", MODELS, "--ctx", CTX, "--gpu", GPUS, "--format", "markdown"],
    "table-users-pivot.md": ["table", "--models", MODELS, "--ctx", CTX, "--gpu", GPUS, "--pivot",
                             "--format", "markdown"],
    "table-kv-pivot.md": ["table", "--models", MODELS, "--ctx", "1k,4k,16k,64k,128k", "--pivot",
                          "--format", "markdown"],
    "table.csv": ["table", "--models", "meta-llama/Llama-3.1-8B,openai/gpt-oss-20b", "--ctx", "8k,32k",
                  "--gpu", "h100", "--format", "csv"],
    "kv-vs-context.svg": ["plot", "--models", MODELS, "--gpu", GPUS, "--kind", "kv"],
    "users-vs-context.svg": ["plot", "--models", MODELS, "--gpu", GPUS, "--kind", "users"],
    "table-tpot-pivot.md": ["table", "--models", MODELS, "--gpu", "h100,h200", "--isl", "1k", "--osl", "1k", "--ctx",
                            "2k,8k,32k", "--pivot", "--metric", "tpot", "--format", "markdown"],
    "tpot-vs-context.svg": ["plot", "--models", MODELS, "--gpu", "h100", "--isl", "1k", "--osl", "1k", "--kind",
                            "tpot"],
}
MARKER = re.compile(r"(<!-- generated: (?P<name>[\w.-]+) -->\n)(?P<body>.*?)(<!-- end generated -->)", re.S)
# a `$ kvplan` block, with the options comment before it
BLOCK = re.compile(r"^(?:<!-- example: (?P<options>[^\n]*?) -->\n)?(?P<fence>```[\w-]*\n)(?P<body>\$ kvplan[^\n]*\n"
                   r"(?:(?!```)[^\n]*\n)*?)```$", re.M)
PAGES = ["README.md", *(f"docs/{page.name}" for page in sorted(DOCS.glob("*.md")))]
WIDTH = 80
SPEC = "docs/examples/hybrid-example.yaml"


def _layers_empty(text: str) -> str:
    return text[:text.index("\nlayers:")] + "\nlayers: []\n"


# broken copies of the YAML spec example (docs/yaml-spec.md#errors): file -> what is changed
YAML_ERRORS = {
    "windw.yaml": lambda t: t.replace("    window: 4096", "    windw: 4096"),
    "tied.yaml": lambda t: t.replace("  lm_head: 524_288_000       # 0 when tied to the embedding\n",
                                     "  lm_head: 524_288_000       # 0 when tied to the embedding\n  tied: true\n"),
    "heads-text.yaml": lambda t: t.replace("num_attention_heads: 32 ", 'num_attention_heads: "32" '),
    "kind-unknown.yaml": lambda t: t.replace("  - kind: chunked ", "  - kind: chunky  "),
    "no-reason.yaml": lambda t: t.replace("    reason: MLP-only block\n", ""),
    "count-zero.yaml": lambda t: t.replace("  - kind: full               # global attention (GQA)\n    count: 4",
                                           "  - kind: full               # global attention (GQA)\n    count: 0"),
    "full-window.yaml": lambda t: t.replace("    head_dim: 128            # head_dim_v defaults to head_dim\n",
                                            "    head_dim: 128            # head_dim_v defaults to head_dim\n"
                                            "    window: 5\n"),
    "no-layers.yaml": _layers_empty,
    "bad-indent.yaml": lambda t: t.replace("  - kind: mla ", "   - kind: mla "),
    "empty.yaml": lambda t: "",
    "a-list.yaml": lambda t: "- name: example/Hybrid-13B-demo\n",
    "active-over-total.yaml": lambda t: t.replace("  active: 5_500_000_000 ", "  active: 15_500_000_000"),
}


def fixtures(where: Path) -> None:
    """The files the examples name, in the scratch directory they run in: the YAML spec example (at its path in
    the repository) and broken copies of it, a model list, and a Llama-3-8B GGUF header whose 291 tensors are
    typed by llama-quantize's Q4_K_M recipe (tests/ggufkit.py; the file is sparse, the weights a hole)."""
    spec = (ROOT / SPEC).read_text(encoding="utf-8")
    (where / SPEC).parent.mkdir(parents=True)
    (where / SPEC).write_text(spec, encoding="utf-8")
    for name, change in YAML_ERRORS.items():
        broken = change(spec)
        if broken == spec:
            raise SystemExit(f"generate.py: {name} changes nothing in {SPEC}")
        (where / name).write_text(broken, encoding="utf-8")
    (where / "models.txt").write_text("meta-llama/Llama-3.1-8B\nQwen/Qwen3-32B\n", encoding="utf-8")
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        from ggufkit import LLAMA3_8B, llama3_8b_q4_k_m, write_gguf
    finally:
        sys.path.remove(str(ROOT / "tests"))
    write_gguf(where / "Meta-Llama-3-8B-Instruct-Q4_K_M.gguf", "llama", LLAMA3_8B, llama3_8b_q4_k_m(), sparse=True)


class _Terminal(io.StringIO):
    """Standard output as a terminal: kvplan prints for a person (rich tables at the terminal's width)."""

    def isatty(self) -> bool:
        return True


@contextlib.contextmanager
def _terminal(width: int, cwd: Path):
    """This process as a terminal `width` columns wide, without colour, in `cwd`: yields (stdout, stderr)."""
    saved_env = {name: os.environ.get(name) for name in ("COLUMNS", "LINES", "TERM", "FORCE_COLOR", "NO_COLOR",
                                                         "TTY_COMPATIBLE", "TTY_INTERACTIVE", "HF_HUB_OFFLINE")}
    saved = sys.stdout, sys.stderr, sys.argv, Path.cwd()
    os.environ.update(COLUMNS=str(width), LINES="50", TERM="dumb", HF_HUB_OFFLINE="1")
    for name in ("FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        os.environ.pop(name, None)
    sys.stdout, sys.stderr = _Terminal(), io.StringIO()
    os.chdir(cwd)
    try:
        yield sys.stdout, sys.stderr
    finally:
        sys.stdout, sys.stderr, sys.argv = saved[:3]
        os.chdir(saved[3])
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def run_line(line: str, cwd: Path, width: int = WIDTH) -> tuple[int, str]:
    """`$ kvplan ...` (a shell line: `# comments`, and `> FILE` for stdout into a file) run through the real
    command line, `kvplan.cli.main`: (exit status, what it prints, stdout then stderr, lines right-trimmed)."""
    from kvplan import cli

    args = shlex.split(line.removeprefix("$ "), comments=True)
    if args[0] != "kvplan":
        raise SystemExit(f"generate.py: an example runs kvplan, not {line!r}")
    into = None
    if ">" in args:
        into, args = args[args.index(">") + 1], args[:args.index(">")]
    with _terminal(width, cwd) as (out, err):
        sys.argv = args
        try:
            cli.main()
            code = 0
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else 0 if exit_.code is None else 1
    text = out.getvalue()
    if into is not None:
        (cwd / into).write_text(text, encoding="utf-8")
        text = ""
    lines = [line.rstrip() for line in (text + err.getvalue()).splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return code, "".join(f"{line}\n" for line in lines)


def _trimmed(output: str, options: dict[str, str]) -> str:
    note = f"  ... (trimmed: {options['note']})\n" if "note" in options else "  ... (trimmed)\n"
    lines = output.splitlines(keepends=True)
    if "from" in options:
        start = next((i for i, line in enumerate(lines) if line.startswith(options["from"])), None)
        if start is None:
            raise SystemExit(f"generate.py: no line of the output starts with {options['from']!r}")
        lines = [note, *lines[start:]]
    if "head" in options and int(options["head"]) < len(lines):
        lines = [*lines[:int(options["head"])], note]
    return "".join(lines)


def example(body: str, options: dict[str, str], cwd: Path) -> str:
    """An example block's body regenerated: each `$` line as written, then what it prints now (a blank line
    before a `$` line is kept)."""
    unknown = set(options) - {"width", "from", "head", "note", "output"}
    if unknown:
        raise SystemExit(f"generate.py: unknown example option {', '.join(sorted(unknown))}")
    out, lines = [], body.splitlines()
    for i, line in enumerate(lines):
        if not line.startswith("$ "):
            continue
        if out and i and not lines[i - 1].strip():
            out.append("\n")
        code, printed = run_line(line, cwd, int(options.get("width", WIDTH)))
        if options.get("output") == "none":
            if code not in (0, 1):
                raise SystemExit(f"generate.py: {line!r} failed (exit {code}):\n{printed}")
            printed = ""
        out += [f"{line}\n", _trimmed(printed, options) if printed else ""]
    return "".join(out)


def _library_size(match: re.Match) -> str:
    from kvplan.sources import library

    return f"{match.group(1)}{len(library.entries())}{match.group(2)}"


# figures the prose states, from the running code
FACTS = {re.compile(r"(bundled library of )\d+( popular models)"): _library_size}


def examples(page: str, cwd: Path) -> str:
    """A page with every `$ kvplan` block outside the generated markers regenerated, and its `FACTS`."""
    for pattern, fact in FACTS.items():
        page = pattern.sub(fact, page)
    def fill(match: re.Match) -> str:
        options = dict(pair.split("=", 1) for pair in shlex.split(match.group("options") or ""))
        head = f"<!-- example: {match.group('options')} -->\n" if match.group("options") is not None else ""
        return head + match.group("fence") + example(match.group("body"), options, cwd) + "```"

    parts = MARKER.split(page)  # outside, then 4 groups per marked section
    step = MARKER.groups + 1
    return "".join(BLOCK.sub(fill, part) if i % step == 0 else part for i, part in enumerate(parts))


def run_kvplan(args: list[str]) -> None:
    """One kvplan command line, in this process, through the real CLI (what it says of its --out file unsaid)."""
    from kvplan.cli import app

    with contextlib.redirect_stderr(io.StringIO()):
        app(args=args, standalone_mode=False)


def shown(name: str) -> str:
    """The command line as the docs show it: tables print to stdout, charts name their --out file."""
    args = EXAMPLE_COMMANDS[name]
    if args[0] == "plot":
        args = [*args, "--out", f"docs/{EXAMPLES}/{name}"]
    return "kvplan " + shlex.join(args)


def snippet(name: str, content: str) -> str:
    """What goes between the markers for one example."""
    command = f"```console\n$ {shown(name)}\n```\n\n"
    if name.endswith(".md"):
        return command + content
    if name.endswith(".csv"):
        return command + f"```csv\n{content}```\n"
    return command + f"![{name}]({EXAMPLES}/{name})\n"


def generate(out: Path) -> list[Path]:
    """Write every example under out/docs/examples/, and every page with examples (README.md, docs/*.md) under
    out/ at its path in the repository; return the paths written."""
    (out / "docs" / EXAMPLES).mkdir(parents=True, exist_ok=True)
    written = []
    for name, args in EXAMPLE_COMMANDS.items():
        path = out / "docs" / EXAMPLES / name
        run_kvplan([*args, "--out", str(path)])
        written.append(path)

    def fill(match: re.Match) -> str:
        name = match.group("name")
        if name not in EXAMPLE_COMMANDS:
            raise SystemExit(f"{PAGE}: marker names {name}, which is not an example")
        content = (out / "docs" / EXAMPLES / name).read_text(encoding="utf-8")
        return match.group(1) + snippet(name, content) + match.group(4)

    with tempfile.TemporaryDirectory() as scratch:
        fixtures(Path(scratch))
        for page in PAGES:
            text = (ROOT / page).read_text(encoding="utf-8")
            new = examples(MARKER.sub(fill, text) if page == f"docs/{PAGE}" else text, Path(scratch))
            if new != text or (out / page).resolve() != (ROOT / page).resolve():
                (out / page).write_text(new, encoding="utf-8")
                written.append(out / page)
    return written


def _creator(svg: str) -> str | None:
    match = re.search(r"<dc:title>(Matplotlib v[^,<]+)", svg)
    return match.group(1) if match else None


def stale(generated: Path, committed: Path = ROOT) -> list[str]:
    """The files under `committed` that differ from those freshly generated under `generated`."""
    from kvplan.plot import svg_data

    out = []
    for path in [*(Path("docs") / EXAMPLES / name for name in EXAMPLE_COMMANDS), *map(Path, PAGES)]:
        new, old = generated / path, committed / path
        if not old.is_file():
            out.append(f"{path} (missing)")
            continue
        new_text, old_text = new.read_text(encoding="utf-8"), old.read_text(encoding="utf-8")
        if new_text == old_text:
            continue
        if path.suffix == ".svg" and _creator(new_text) != _creator(old_text):
            # another matplotlib draws different bytes: compare what was plotted
            if svg_data(new_text) == svg_data(old_text):
                continue
        out.append(str(path))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only report stale files (exit 1 if any)")
    parser.add_argument("--out", type=Path, help="write under this directory instead of the repository")
    args = parser.parse_args()
    if args.check:
        with tempfile.TemporaryDirectory() as tmp:
            generate(Path(tmp))
            found = stale(Path(tmp))
        for path in found:
            print(f"stale: {path}")
        if found:
            print("run: python docs/generate.py", file=sys.stderr)
        return 1 if found else 0
    for path in generate(args.out or ROOT):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
