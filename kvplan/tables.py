"""`kvplan table`: planning tables of models x contexts (x GPUs), as rich, Markdown, CSV or JSON. (The module is
`kvplan.tables`: `kvplan.table` is the public function, `kvplan.api.table`, whose result renders through here.)

Presentation only. Every number comes from `kvplan.memory.estimate` (KV per token, KV per sequence, weights,
total), `kvplan.capacity.users_sweep` (max users on a GPU under an engine, by the budget, pools and search
`capacity` uses) and, with requests of isl + osl tokens, `kvplan.speed.targets.speed_sweep` (TPOT, TTFT and
tokens/s at the users of each cell); nothing here computes memory or speed. Each model is loaded once, its split
(each GPU's caches and weights) built once per parallel layout, and each (model, GPU) deployment once, whatever the
number of contexts.

Column names of the CSV and JSON output are stable (docs/tables.md lists them); their sizes are integer bytes.
Text formats print sizes in GiB (KV per token in KiB) with two decimals and name the unit in the header.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from kvplan.errors import KvplanError
from kvplan.memory import Estimate, estimates
from kvplan.model import ModelSpec
from kvplan.output import write_output
from kvplan.text import narrow, plain
from kvplan.units import format_figure

if TYPE_CHECKING:  # imported where a table plans capacity (`build`), not for a table without GPUs
    from kvplan.capacity import UsersAt
    from kvplan.speed.targets import SpeedAt

FORMATS = ("rich", "markdown", "csv", "json")
FORMAT_ALIASES = {"md": "markdown", "text": "rich", "txt": "rich"}
EXTENSIONS = {".md": "markdown", ".markdown": "markdown", ".csv": "csv", ".json": "json", ".txt": "rich"}
# the speed metrics: the SpeedAt field each shows, what it is and its unit
SPEED_METRICS = {"tpot": ("decode_step_ms", "TPOT", "ms"), "ttft": ("ttft_ms", "TTFT", "ms"),
                 "tps-user": ("tokens_per_s_per_user", "tokens/s per user", ""),
                 "tps-gpu": ("tokens_per_s_per_gpu", "tokens/s per GPU", "")}
METRICS = ("kv", "total", "users", *SPEED_METRICS)
LIST_SUFFIXES = (".txt", ".list")
KiB, GiB = 1 << 10, 1 << 30
MARKDOWN_SPECIAL = "\\|*_`[]<>"  # what a Markdown cell escapes with a backslash (the backslash itself first)

# CSV / JSON columns, in order: one record per model x ctx, or per model x ctx x GPU when GPUs are given.
ESTIMATE_FIELDS = ("model", "ctx", "batch", "kv_dtype", "weights_dtype", "kv_bytes_per_token",
                   "kv_bytes_per_sequence", "weights_bytes", "total_bytes")  # of kvplan.memory.Estimate
FIELDS = (*ESTIMATE_FIELDS, "max_context", "beyond_max_context")
GPU_FIELDS = ("engine", "engine_version", "gpu", "gpu_memory_bytes", "kv_budget_bytes",
              "engine_kv_bytes_per_user", "max_users", "max_users_bound", "not_planned")
# with --isl and --osl: the speed of each model x ctx x GPU (kvplan.speed.targets.SpeedAt)
SPEED_FIELDS = ("isl", "osl", "speed_concurrency", "decode_step_ms_bound", "decode_step_ms", "ttft_ms_bound",
                "ttft_ms", "tokens_per_s_per_user", "tokens_per_s_per_gpu", "speed_not_estimated")


class Gpu(NamedTuple):
    """The GPUs to plan on: `count` of a catalogue entry (`name`) or of a --vram size (`name` None); `short`: its
    first alias or its size, with the count (`h100`, `4xh100`, `24.00GiB`), for headers a Markdown table keeps
    narrow."""

    label: str
    name: str | None
    memory_bytes: int  # one GPU's
    count: int = 1
    short: str = ""


class Row(NamedTuple):
    """One model at one ctx: kvplan.memory's estimate, the model's context limit, its capacity on each GPU of the
    table, in their order (`kvplan.capacity.users_sweep`'s cells; max_users None where the model keeps no
    per-sequence cache, so memory does not bound its users), and with --isl and --osl its speed on each
    (`kvplan.speed.targets.speed_sweep`'s cells)."""

    estimate: Estimate
    max_context: int | None
    users: tuple[UsersAt, ...] = ()
    speed: tuple[SpeedAt, ...] = ()

    @property
    def beyond_max_context(self) -> bool:
        return self.max_context is not None and self.estimate.ctx > self.max_context


class Table(NamedTuple):
    rows: list[Row]
    ctxs: list[int]
    batch: int
    gpus: list[Gpu]
    engine: str | None  # engine name when capacity was planned
    engine_version: str | None
    failures: list[str]  # one message per model left out (--keep-going)
    isl: int | None = None  # with osl: the requests the speed cells are for
    osl: int | None = None
    users: int | None = None  # the requests the speed cells are at; None: the users memory holds in each cell


# ---------------------------------------------------------------------------------------------- model lists


def parse_models(models: str | None, filter_text: str | None = None) -> list[str]:
    """`--models` and `--filter` -> model names, in order, without repeats.

    `--models` is a comma list (`a,b,c`), or `@FILE`, or a path ending in .txt or .list: a file with one model
    per line, blank lines and `#` comments ignored. `--filter TEXT` adds the library models whose id or alias
    contains TEXT (case-insensitive), as `kvplan models TEXT` lists them.
    """
    names: list[str] = []
    if models is not None:
        list_file = _list_file(models)
        if list_file is not None:
            names += _read_list(Path(list_file).expanduser())
        else:
            names += [n.strip() for n in models.split(",") if n.strip()]
    if filter_text is not None:
        from kvplan.sources import library

        wanted = filter_text.strip().lower()
        if not wanted:
            raise KvplanError("--filter is empty: give part of a model name, like llama or qwen3")
        matches = [e.id for e in library.entries() if any(wanted in n.lower() for n in (e.id, *e.aliases))]
        if not matches:
            raise KvplanError(f"--filter {filter_text!r} matches no library model (`kvplan models` lists "
                              "them)")
        names += matches
    names = list(dict.fromkeys(names))
    if not names:
        raise KvplanError("no models given: --models a,b,c, --models @models.txt, or --filter TEXT")
    return names


def _split_parts(path: Path) -> list[str]:
    """Every part of the split GGUF `path` is one of (`<prefix>-00002-of-00003.gguf`): kvplan reads them all, from
    the one named (`kvplan.sources.gguf_model.part_names`, the names llama.cpp finds the parts by)."""
    if not path.name.endswith(".gguf"):
        return []
    from kvplan.sources.gguf_model import SPLIT_NAME, part_names

    match = SPLIT_NAME.match(path.name)
    if match is None or not 0 < int(match["no"]) <= int(match["count"]):
        return []
    return [str(path.with_name(part)) for part in
            part_names(path.name, int(match["no"]) - 1, int(match["count"]), str(path))]


def _list_file(models: str) -> str | None:
    """The model list file `--models` names (`@FILE`, or a single .txt/.list path), if it names one."""
    text = models.strip()
    if text.startswith("@") or (text.lower().endswith(LIST_SUFFIXES) and "," not in text):
        return text.removeprefix("@")
    return None


def _read_list(path: Path) -> list[str]:
    from kvplan.sources.hf_config import read_text

    try:
        text = read_text(path)
    except KvplanError as err:
        raise KvplanError(f"cannot read the model list: {err}") from None
    return [line.split("#", 1)[0].strip() for line in text.splitlines() if line.split("#", 1)[0].strip()]


def parse_ctxs(text: str) -> list[int]:
    """`4k,8k,32k,128k` -> token counts (k = 1,024), in order, without repeats."""
    from kvplan.units import parse_tokens

    items = [t.strip() for t in str(text).split(",") if t.strip()]
    if not items:
        raise KvplanError("--ctx is empty: give token counts like 4k,8k,32k,128k")
    return list(dict.fromkeys(parse_tokens(t) for t in items))


def parse_gpus(gpu: str | None, vram: str | None) -> list[Gpu]:
    """`--gpu h100,4xh100` (catalogue names, a count in front for several) and `--vram 24GiB,2x48GB` (any GPU)
    -> GPU sets, in that order."""
    from kvplan.gpus import count_and_name, find
    from kvplan.units import parse_bytes

    out: list[Gpu] = []
    for flag, text in (("--gpu", gpu), ("--vram", vram)):
        if text is None:
            continue
        items = [n.strip() for n in text.split(",") if n.strip()]
        if not items:
            example = "h100,4xh100" if flag == "--gpu" else "24GiB,2x48GB"
            raise KvplanError(f"{flag} is empty: give {example} (`kvplan gpus` lists the catalogue)")
        for item in items:
            count, name = count_and_name(item)
            count = count or 1
            if flag == "--gpu":
                found = find(name)
                label, memory, short = found.name, found.usable_bytes, (found.aliases or [found.name])[0]
            else:
                memory = parse_bytes(name, "--vram")
                label, short = f"{_gib(memory)} GiB GPU", f"{_gib(memory)}GiB"
            out.append(Gpu(label=label if count == 1 else f"{count} x {label}", name=found.name if flag == "--gpu"
                           else None, memory_bytes=memory, count=count,
                           short=short if count == 1 else f"{count}x{short}"))
    return list(dict.fromkeys(out))


def parse_format(fmt: str | None, out: str | None) -> str:
    """--format, else the --out file's extension (.md, .csv, .json, .txt), else rich."""
    if fmt is None:
        return EXTENSIONS.get(Path(out).suffix.lower(), "rich") if out else "rich"
    key = FORMAT_ALIASES.get(fmt.strip().lower(), fmt.strip().lower())
    if key not in FORMATS:
        raise KvplanError(f"unknown format {fmt!r}: choose rich, markdown, csv or json")
    return key


# --------------------------------------------------------------------------------------------------- build


def build(names: Sequence[str], ctxs: Sequence[int], *, batch: int = 1, gpus: Sequence[Gpu] = (),
          engine_name: str | None = None, options=None, kv_dtype_name: str | None = None,
          weights_dtype_name: str | None = None, overhead: int | None = None, keep_going: bool = False,
          revision: str | None = None, token: str | None = None, tp: int | None = None, pp: int | None = None,
          loader: Callable[[str], ModelSpec] | None = None, isl: int | None = None, osl: int | None = None,
          users: int | None = None) -> Table:
    """The table: each model loaded once, estimated at each ctx, its capacity planned once per GPU set (its
    count split as `kvplan.capacity.parallelism` splits --gpus, with `tp` and `pp` as given).

    With GPUs or an engine, dtypes are the engine's (as `kvplan estimate --gpu` uses them: an fp32
    checkpoint is loaded in bf16, llama.cpp caches fp16); otherwise the model's own. A model that cannot be
    loaded or planned is an error naming it; with keep_going it is left out and named in `failures`. Models
    are read by `loader`, by default `kvplan.sources.load_model` with `revision` and `token` (--revision and
    --token, the same for every model). With `isl` and `osl` (and GPUs), each cell's speed too, at `users`
    requests or else at the users memory holds (`kvplan.speed.targets.speed_sweep`).
    """
    from kvplan import capacity, engines
    from kvplan.dtypes import kv_dtype, weight_dtype

    if batch < 1:
        raise KvplanError(f"--batch must be at least 1, got {batch}")
    if not ctxs:
        raise KvplanError("--ctx is empty: give token counts like 4k,8k,32k,128k")
    if kv_dtype_name:
        kv_dtype(kv_dtype_name)
    if weights_dtype_name:
        weight_dtype(weights_dtype_name)
    planning = bool(gpus) or engine_name is not None
    if engine_name is None and gpus:  # llama.cpp on Apple silicon, vLLM elsewhere (`engines.default_engine`)
        chosen = {engines.default_engine(gpu.name)[0] for gpu in gpus}
        if len(chosen) > 1:
            raise KvplanError("a table plans one engine for every GPU: give --engine (the default is llama.cpp on "
                              "Apple silicon, vllm on the others)")
        engine_name = chosen.pop()
    engine_name = engine_name or "vllm"
    options = options or engines.EngineOptions()
    engine = engines.engine(engine_name, options) if planning else None
    if engine is not None and kv_dtype_name:
        engine.check_kv_dtype(kv_dtype(kv_dtype_name))
    if loader is None:
        from kvplan.sources import load_model

        loader = partial(load_model, revision=revision, token=token)
    # each GPU set and how it is split, the same for every model
    hardware = [(capacity.Hardware(name=gpu.name, memory_bytes=gpu.memory_bytes),
                 capacity.parallelism(engine_name, gpu.count, tp, pp)) for gpu in gpus]
    rows: list[Row] = []
    failures: list[str] = []
    for name in names:
        try:
            rows += _model_rows(loader(name), ctxs, batch, gpus, hardware, engine_name if planning else None,
                                options, kv_dtype_name, weights_dtype_name, overhead, capacity,
                                (isl, osl, users) if isl is not None else None)
        except KvplanError as err:
            message = str(err)
            failures.append(message if name.lower() in message.lower() else f"{name}: {message}")
    if failures and not keep_going:
        raise KvplanError(_failure_line(failures, len(names), hint=True))
    return Table(rows=rows, ctxs=list(ctxs), batch=batch, gpus=list(gpus),
                 engine=engine.name if engine else None, engine_version=engine.version if engine else None,
                 failures=failures, isl=isl, osl=osl, users=users)


def _model_rows(spec: ModelSpec, ctxs, batch, gpus, hardware, engine_name, options, kv_name, weights_name, overhead,
                capacity, requests: tuple[int, int, int | None] | None = None) -> list[Row]:
    if engine_name is not None:
        kv_name, weights_name = capacity.engine_dtypes(spec, engine_name, kv_name, weights_name)
    by_ctx = estimates(spec, ctxs, batch, kv_name, weights_name)
    per_gpu: list[list[UsersAt]] = []
    if gpus and all(e.kv_bytes_per_sequence == 0 for e in by_ctx):
        per_gpu = [[capacity.UsersAt(None, None, None)] * len(ctxs)] * len(gpus)
    elif gpus:
        per_gpu = capacity.users_sweep(spec, ctxs, hardware, engine_name=engine_name, options=options,
                                       kv_dtype_name=kv_name, weights_dtype_name=weights_name, overhead=overhead)
    speeds: list[list[SpeedAt]] = []
    if gpus and requests is not None:
        from kvplan.speed.targets import speed_sweep

        speeds = speed_sweep(spec, [(h.name, parallel) for h, parallel in hardware], engine_name, kv_name,
                             weights_name, per_gpu, *requests)
    return [Row(e, spec.max_context, tuple(cells[i] for cells in per_gpu), tuple(cells[i] for cells in speeds))
            for i, e in enumerate(by_ctx)]


def _failure_line(failures: list[str], total: int, hint: bool = False) -> str:
    left = f"{len(failures)} of {total} models failed" if len(failures) > 1 else "a model failed"
    line = f"{left}: {'; '.join(failures)}" if len(failures) > 1 else failures[0]
    return line + (" (--keep-going renders the others)" if hint and total > len(failures) else "")


def failure_line(table: Table, total: int) -> str:
    """The one-line error for the models --keep-going left out."""
    return _failure_line(table.failures, total)


# ------------------------------------------------------------------------------------------------- columns


class Column(NamedTuple):
    header: str
    numeric: bool
    cell: Callable[[Row], str]


def ctx_label(tokens: int) -> str:
    """8192 -> 8k, 131072 -> 128k, 1048576 -> 1M (k = 1,024 as --ctx reads it), else 5,000."""
    if tokens % (1 << 20) == 0:
        return f"{tokens >> 20}M"
    if tokens % 1024 == 0:
        return f"{tokens >> 10}k"
    return f"{tokens:,}"


def _gib(n: int) -> str:
    return f"{n / GiB:,.2f}"


def _count(n: int | None) -> str:
    return "-" if n is None else f"{n:,}"


def total_header(batch: int) -> str:
    return f"total, {batch:,} user{'' if batch == 1 else 's'} (GiB)"


# The users figure tables and plots show: what `capacity` reports as max_concurrent_users, the users served in
# steady decode without preemption (the start-up reservation admits fewer where sliding windows are freed).
USERS_FIGURE = "max users in steady decode"
AT_LIMIT = "\N{DAGGER}"  # marks a users cell at the engine's limit on running requests
NOT_PLANNED = "n/a"  # a users cell the engine cannot plan (the reason is in a note under the table)


def users_header(gpu: Gpu) -> str:
    return f"{USERS_FIGURE}, {gpu.label}"


def users_cell(users: UsersAt) -> str:
    """`56`; `256†` at the engine's limit on running requests; `n/a` where the engine cannot plan it; `-`
    for a model that keeps no per-sequence cache."""
    if users.not_planned is not None:
        return NOT_PLANNED
    return _count(users.max_users) + (AT_LIMIT if users.sequence_limit is not None else "")


def text_columns(table: Table, mark: str = "*", short: bool = False) -> list[Column]:
    """The long-form columns of the text formats: one row per model x ctx, one max-users column per GPU (headed
    `users, h100` where `short`: the figure and the GPU's name are in `legend`)."""
    columns = [
        Column("model", False, lambda r: r.estimate.model),
        Column("ctx", True, lambda r: ctx_label(r.estimate.ctx) + (mark if r.beyond_max_context else "")),
        Column("dtype (W / KV)", False, lambda r: f"{r.estimate.weights_dtype} / {r.estimate.kv_dtype}"),
        Column("KV / token (KiB)", True, lambda r: f"{r.estimate.kv_bytes_per_token / KiB:,.2f}"),
        Column("KV / seq (GiB)", True, lambda r: _gib(r.estimate.kv_bytes_per_sequence)),
        Column("weights (GiB)", True, lambda r: _gib(r.estimate.weights_bytes)),
        Column(total_header(table.batch), True, lambda r: _gib(r.estimate.total_bytes)),
    ]
    for i, gpu in enumerate(table.gpus):
        header = f"users, {gpu.short}" if short else users_header(gpu)
        columns.append(Column(header, True, lambda r, i=i: users_cell(r.users[i])))
    return columns


def default_metric(table: Table) -> str:
    return "users" if table.gpus else "kv"


def per_gpu(metric: str) -> bool:
    """Whether a metric's pivot has a row per model x GPU (users and the speed metrics)."""
    return metric == "users" or metric in SPEED_METRICS


def check_metric(metric: str | None, gpus: bool, requests: bool) -> None:
    """A metric the table can show: users needs a GPU, the speed metrics GPUs and --isl and --osl."""
    if metric is None:
        return
    if metric not in METRICS:
        raise KvplanError(f"unknown --metric {metric!r}: choose {', '.join(METRICS[:-1])} or {METRICS[-1]}")
    check_inputs("--metric", metric, gpus, requests)


def check_inputs(flag: str, metric: str, gpus: bool, requests: bool) -> None:
    """What a metric (a table's --metric, a chart's --kind) is computed from: users and the speed metrics need a
    GPU, the speed metrics the requests too."""
    if per_gpu(metric) and not gpus:
        raise KvplanError(f"{flag} {metric} needs a GPU: give --gpu or --vram")
    if metric in SPEED_METRICS and not requests:
        raise KvplanError(f"{flag} {metric} needs --isl and --osl: the requests the speed model times")


def speed_cell(speed: SpeedAt, field: str) -> str:
    """`21.4`; `n/a` where the speed model cannot estimate it (why: in a note); `-` where no user fits."""
    if speed.not_estimated is not None:
        return NOT_PLANNED
    value = getattr(speed, field)
    return "-" if value is None else format_figure(value)


def pivot_grid(table: Table, metric: str | None, mark: str = "*") -> tuple[list[str], list[bool], list[list]]:
    """ctx as columns: headers, which are numeric, and rows of (text cells, raw values).

    kv: KV per sequence; total: weights + KV for --batch users; users: max users, one row per model x GPU
    (raw values: model, GPU, then one per ctx; the text cells name the GPU only when there are several, and the
    figure in `legend`).
    """
    metric = metric or default_metric(table)
    check_metric(metric, bool(table.gpus), table.isl is not None)
    by_model: dict[str, list[Row]] = {}
    for row in table.rows:
        by_model.setdefault(row.estimate.model, []).append(row)
    what = {"kv": "KV / seq", "total": total_header(table.batch).rsplit(" (", 1)[0], "users": "users",
            **{name: label for name, (_, label, _) in SPEED_METRICS.items()}}[metric]
    if per_gpu(metric) and len(table.gpus) == 1:
        what += f", {table.gpus[0].short}"
    symbol = SPEED_METRICS[metric][2] if metric in SPEED_METRICS else "" if metric == "users" else "GiB"
    unit = f" ({symbol})" if symbol else ""
    headers = [f"model ({what})"]
    numeric = [False]
    if per_gpu(metric) and len(table.gpus) > 1:
        headers.append("GPU")
        numeric.append(False)
    headers += [ctx_label(c) + unit for c in table.ctxs]
    numeric += [True] * len(table.ctxs)
    grid = []
    for model, rows in by_model.items():
        if per_gpu(metric):
            field = SPEED_METRICS[metric][0] if metric in SPEED_METRICS else None
            for i, gpu in enumerate(table.gpus):
                if field is None:
                    values = [r.users[i].max_users for r in rows]
                    shown = [users_cell(r.users[i]) for r in rows]
                else:
                    values = [getattr(r.speed[i], field) for r in rows]
                    shown = [speed_cell(r.speed[i], field) for r in rows]
                cells = [cell + (mark if r.beyond_max_context else "") for cell, r in zip(shown, rows, strict=True)]
                lead = [model, gpu.label] if len(table.gpus) > 1 else [model]
                grid.append((lead + cells, [model, gpu.label, *values]))
        else:
            key = "kv_bytes_per_sequence" if metric == "kv" else "total_bytes"
            values = [getattr(r.estimate, key) for r in rows]
            cells = [_gib(getattr(r.estimate, key)) + (mark if r.beyond_max_context else "") for r in rows]
            grid.append(([model, *cells], [model, *values]))
    return headers, numeric, grid


def footnote(table: Table) -> str | None:
    """Which models a starred ctx is beyond the max context of."""
    limits = {r.estimate.model: r.max_context for r in table.rows if r.beyond_max_context}
    if not limits:
        return None
    listed = ", ".join(f"{model} {limit:,} tokens" for model, limit in limits.items())
    return f"beyond the model's max context ({listed})"


def below(table: Table, *, pivot: bool = False, metric: str | None = None, short: bool = False) -> list[str]:
    """The lines under a text table: the starred contexts, what a `users, h100` header holds where the headers
    are short (`short`, and every users pivot), and the notes of the marked cells."""
    note = footnote(table)
    out = [f"* {note}"] if note else []
    metric = metric or default_metric(table)
    if pivot and metric in SPEED_METRICS:
        return out + [speed_legend(table, metric), *speed_notes(table)]
    users = metric == "users" if pivot else short and bool(table.gpus)
    speed = [SPEED_HINT] if not pivot and table.isl is not None and table.gpus else []
    return out + ([legend(table)] if users else []) + notes(table) + speed


def legend(table: Table) -> str:
    """What a `users, h100` header holds: the figure, the engine, and each GPU set's full name."""
    names = "; ".join(f"{gpu.short}: {gpu.label}" for gpu in table.gpus)
    return f"users: {USERS_FIGURE} with {table.engine} {table.engine_version} ({names})"


SPEED_HINT = ("TPOT, TTFT and tokens/s for these requests: --pivot --metric tpot, ttft, tps-user or tps-gpu, or "
              "--format csv or json")


def speed_legend(table: Table, metric: str) -> str:
    """What a speed pivot's cells are: the estimate, for which requests, at how many users, on which GPUs."""
    from kvplan.speed.targets import stated_error

    _, label, unit = SPEED_METRICS[metric]
    at = f"{table.users:,} users" if table.users else "the users memory holds in each cell"
    names = "; ".join(f"{gpu.short}: {gpu.label}" for gpu in table.gpus)
    error = stated_error()
    off = error.tpot_median if metric != "ttft" else error.ttft_median
    return (f"{label}{' (' + unit + ')' if unit else ''}: the speed model's calibrated estimate with {table.engine} "
            f"{table.engine_version}, for requests of {table.isl:,} + {table.osl:,} tokens at {at} ({names}); off by "
            f"a median {off:.0%} on models and GPUs left out of its fit (docs/accuracy.md)")


def speed_notes(table: Table) -> list[str]:
    """Why the `n/a` cells of a speed pivot have no estimate."""
    why: dict[str, list[str]] = {}
    for row in table.rows:
        for gpu, speed in zip(table.gpus, row.speed, strict=True):
            if speed.not_estimated is not None and gpu.label not in why.setdefault(speed.not_estimated, []):
                why[speed.not_estimated].append(gpu.label)
    return [f"{NOT_PLANNED}: not estimated: " + "; ".join(f"{', '.join(gpus)}: {reason}"
                                                        for reason, gpus in why.items())] if why else []


def notes(table: Table) -> list[str]:
    """The notes under a text table, each for its mark: cells at the engine's limit on running requests (the KV
    cache would hold as many or more), and cells the engine cannot plan, with why."""
    from kvplan import engines

    out = []
    limits = {}  # GPU set -> the limits its cells reach
    not_planned: dict[tuple[str, str], list[str]] = {}  # (model, why) -> the GPU sets
    for row in table.rows:
        for gpu, users in zip(table.gpus, row.users, strict=True):
            if users.sequence_limit is not None:
                limits.setdefault(gpu.label, set()).add(users.sequence_limit)
            if users.not_planned is not None:
                gpus = not_planned.setdefault((row.estimate.model, users.not_planned), [])
                gpus += [gpu.label] if gpu.label not in gpus else []
    if limits:
        engine = engines.engine_class(table.engine)
        each = ", ".join(f"{engine.sequence_limit_reason.format(limit=limit)} on {gpu}"
                         for gpu, found in limits.items() for limit in sorted(found))
        out.append(f"{AT_LIMIT} as many users as one {engine.label} instance runs at once ({each}), not as many "
                   "as memory holds")
    if not_planned:
        why = "; ".join(f"{model}{'' if len(gpus) == len(table.gpus) else ' on ' + ', '.join(gpus)}: {reason}"
                        for (model, reason), gpus in not_planned.items())
        out.append(f"{NOT_PLANNED}: not planned: {why}")
    return out


# ------------------------------------------------------------------------------------------------- formats


def check_view(fmt: str, pivot: bool, metric: str | None) -> None:
    """--pivot and --metric as the format takes them (before any model is read)."""
    if metric is not None and not pivot:
        raise KvplanError("--metric chooses what a --pivot table shows: add --pivot")
    if pivot and fmt == "json":
        raise KvplanError("--pivot is for rich, markdown and csv: json is always one object per model x ctx "
                          "(x GPU)")


def render(table: Table, fmt: str, *, pivot: bool = False, metric: str | None = None) -> str:
    """The table as text in one of FORMATS (rich is rendered without colour)."""
    check_view(fmt, pivot, metric)
    if fmt == "markdown":
        return to_markdown(table, pivot=pivot, metric=metric)
    if fmt == "csv":
        return to_csv(table, pivot=pivot, metric=metric)
    if fmt == "json":
        return json.dumps(document(table), indent=2) + "\n"
    return boxed(table, pivot=pivot, metric=metric)


_SPECIAL = frozenset(MARKDOWN_SPECIAL)


def escape_markdown(cell: str) -> str:
    """Text in Markdown as text: no line breaks, pipes, emphasis, links or HTML."""
    text = plain(cell)
    if _SPECIAL.isdisjoint(text):  # most cells: numbers and names
        return text
    for char in MARKDOWN_SPECIAL:
        text = text.replace(char, "\\" + char)
    return text


def markdown_table(headers: Sequence[str], numeric: Sequence[bool], rows: Iterable[Sequence[str]]) -> str:
    """A GitHub-flavoured table: cells padded to the column's width, numbers right-aligned (`---:`)."""
    body = [[escape_markdown(c) for c in row] for row in rows]
    head = [escape_markdown(h) for h in headers]
    widths = [max(3, len(h), *(len(r[i]) for r in body)) for i, h in enumerate(head)]

    def line(cells: Sequence[str]) -> str:
        padded = (c.rjust(w) if num else c.ljust(w) for c, w, num in zip(cells, widths, numeric, strict=True))
        return "| " + " | ".join(padded) + " |"

    rule = "| " + " | ".join(("-" * (w - 1) + ":") if num else ("-" * w)
                              for w, num in zip(widths, numeric, strict=True)) + " |"
    return "\n".join([line(head), rule, *(line(r) for r in body)]) + "\n"


def to_markdown(table: Table, *, pivot: bool = False, metric: str | None = None) -> str:
    """GitHub Markdown, headers kept short (`users, h100`) with their long form under the table (`legend`), so
    that a terminal showing the text does not wrap every row."""
    if pivot:
        headers, numeric, grid = pivot_grid(table, metric)
        text = markdown_table(headers, numeric, [cells for cells, _ in grid])
    else:
        columns = text_columns(table, short=True)
        text = markdown_table([c.header for c in columns], [c.numeric for c in columns],
                              [[c.cell(r) for c in columns] for r in table.rows])
    return text + "".join(f"\n{escape_markdown(line)}\n" for line in below(table, pivot=pivot, metric=metric,
                                                                           short=True))


def document(table: Table) -> dict:
    """The JSON output (`kvplan.table_results.TableResult`): the schema's version, the records, and the models left
    out (--keep-going), one message each."""
    from kvplan.schemas import SCHEMA_VERSION

    return {"schema_version": SCHEMA_VERSION, "rows": records(table), "failures": table.failures}


def records(table: Table) -> list[dict]:
    """Long form, raw values: one record per model x ctx, or per model x ctx x GPU with GPUs."""
    out = []
    for row in table.rows:
        base = {name: getattr(row.estimate, name) for name in ESTIMATE_FIELDS}
        base |= {"max_context": row.max_context, "beyond_max_context": row.beyond_max_context}
        if not table.gpus:
            out.append(base)
        for i, (gpu, users) in enumerate(zip(table.gpus, row.users, strict=True)):
            record = base | {"engine": table.engine, "engine_version": table.engine_version,
                             "gpu": gpu.label, "gpu_memory_bytes": gpu.memory_bytes,
                             "kv_budget_bytes": users.kv_budget_bytes,
                             "engine_kv_bytes_per_user": users.engine_kv_bytes_per_sequence,
                             "max_users": users.max_users, "max_users_bound": _bound(users),
                             "not_planned": users.not_planned}
            if row.speed:
                from kvplan.speed.targets import SpeedFigures

                speed = row.speed[i]
                record |= {"isl": table.isl, "osl": table.osl, "speed_concurrency": speed.concurrency,
                           **SpeedFigures.of(speed),
                           "speed_not_estimated": speed.not_estimated}
            out.append(record)
    return out


def _bound(users: UsersAt) -> str | None:
    """What bounds a cell's users: memory, or sequence_limit (the engine's limit on running requests); None where
    nothing was counted."""
    if users.max_users is None:
        return None
    return "memory" if users.sequence_limit is None else "sequence_limit"


FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")  # what makes a spreadsheet read a cell as a formula


def _csv_value(value) -> str:
    """A CSV cell: numbers as written; text safe to show, and quoted with ' where a spreadsheet would take it for
    a formula (OWASP's CSV injection advice)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    text = plain(value)
    return "'" + text if text.startswith(FORMULA_STARTS) else text


def to_csv(table: Table, *, pivot: bool = False, metric: str | None = None) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    if pivot:
        _, _, grid = pivot_grid(table, metric)
        lead = ["model", "gpu"] if per_gpu(metric or default_metric(table)) else ["model"]
        writer.writerow([*lead, *(str(c) for c in table.ctxs)])
        for _, raw in grid:
            writer.writerow([_csv_value(v) for v in raw])
        return buffer.getvalue()
    fields = FIELDS + (GPU_FIELDS if table.gpus else ()) + (SPEED_FIELDS if table.gpus and table.isl else ())
    writer.writerow(fields)
    for record in records(table):
        writer.writerow([_csv_value(record[f]) for f in fields])
    return buffer.getvalue()


def title(table: Table, metric: str | None = None) -> str:
    """The rich table's title; a speed pivot's (`metric`) names its figure."""
    if metric in SPEED_METRICS:
        return (f"Estimated {SPEED_METRICS[metric][1]} by model, GPU and context with {table.engine} "
                f"{table.engine_version}")
    text = "KV cache and weights by model and context"
    if table.gpus:
        text += f"; {USERS_FIGURE} per GPU with {table.engine} {table.engine_version}"
    return text


def rich_cells(table: Table, *, pivot: bool = False, metric: str | None = None):
    """The rich table's headers, which columns are numbers, its rows of cells and whether each row ends a model's
    section; a GPU's column is headed by its name alone, the title naming the figure (drawn by `boxed`)."""
    if pivot:
        headers, numeric, grid = pivot_grid(table, metric)
        return headers, numeric, [[plain(c) for c in cells] for cells, _ in grid], [False] * len(grid)
    columns = text_columns(table)
    rows, ends = [], []
    for i, row in enumerate(table.rows):
        first = i == 0 or table.rows[i - 1].estimate.model != row.estimate.model
        cells = [plain(column.cell(row)) for column in columns]
        rows.append([cells[0] if first else "", *cells[1:]])
        ends.append(i == len(table.rows) - 1 or table.rows[i + 1].estimate.model != row.estimate.model)
    headers = [column.header.removeprefix(f"{USERS_FIGURE}, ") for column in columns]
    return headers, [column.numeric for column in columns], rows, ends


# rich's HEAVY_HEAD box, each rule as (left, fill, cross, right)
TOP, BELOW_HEADER, SECTION, BOTTOM = "┏━┳┓", "┡━╇┩", "├─┼┤", "└─┴┘"


def boxed(table: Table, *, pivot: bool = False, metric: str | None = None, width: int | None = None) -> str:
    """The rich table as text, drawn as rich lays it out (title, HEAVY_HEAD box, one space of padding, numbers
    right-aligned) without laying it out through rich, which takes seconds for a whole library. At a terminal's
    `width`, the columns are narrowed as `kvplan.report.print_table` narrows them: headers wrap between words,
    bottom-aligned, and no cell is ever cut (a table that cannot fit is drawn at the width it needs)."""
    import textwrap

    from rich.cells import cell_len

    headers, numeric, rows, ends = rich_cells(table, pivot=pivot, metric=metric)
    cells = [max((cell_len(cells[i]) for cells in rows), default=0) for i in range(len(headers))]
    widths = [max(cell, cell_len(header)) for cell, header in zip(cells, headers, strict=True)]
    if width is not None:
        floors = [max(cell, *map(cell_len, header.split())) for cell, header in zip(cells, headers, strict=True)]
        widths = narrow(widths, floors, sum(widths) + 3 * len(widths) + 1 - width)
    wrap = partial(textwrap.wrap, break_on_hyphens=False)  # between words, as rich wraps
    head = [wrap(header, w) or [""] for header, w in zip(headers, widths, strict=True)]
    head = [[""] * (max(map(len, head)) - len(lines)) + lines for lines in head]  # bottom-aligned

    def rule(chars: str) -> str:
        left, fill, cross, right = chars
        return left + cross.join(fill * (w + 2) for w in widths) + right

    def line(cells: Sequence[str], bar: str = "│") -> str:
        padded = (" " * (w - cell_len(cell)) + cell if number else cell + " " * (w - cell_len(cell))
                  for cell, w, number in zip(cells, widths, numeric, strict=True))
        return (bar + bar.join(f" {cell} " for cell in padded) + bar).rstrip()

    heading = title(table, metric if pivot else None)
    out = wrap(heading, sum(widths) + 3 * len(widths) + 1) if width is not None else [heading]
    out += [rule(TOP), *(line(cells, "┃") for cells in zip(*head, strict=True)), rule(BELOW_HEADER)]
    for i, (cells, end) in enumerate(zip(rows, ends, strict=True)):
        out.append(line(cells))
        if end and i < len(rows) - 1:
            out.append(rule(SECTION))
    out.append(rule(BOTTOM))
    for line in below(table, pivot=pivot, metric=metric):
        out += wrap(plain(line), width) if width is not None else [plain(line)]
    return "\n".join(out) + "\n"


def print_rich(console, table: Table, *, pivot: bool = False, metric: str | None = None) -> None:
    """The table on a terminal, drawn by `boxed` at the terminal's width: every cell is an id, a number or a dtype,
    kept whole at any width."""
    from rich.text import Text

    console.print(Text(boxed(table, pivot=pivot, metric=metric, width=console.width).rstrip("\n")), soft_wrap=True)


def write(out: str, text: str, inputs: Sequence[str] = (), force: bool = False) -> str:
    """Write the rendered table to --out (`kvplan.output.write_output`); returns what was written."""
    return write_output(out, lambda path: path.write_text(text, encoding="utf-8"), inputs, force)


def input_files(models: str | None, names: Sequence[str]) -> list[str]:
    """The files a table is made from, which --out must not overwrite: a model list file, local configs and
    specs, every part of a split GGUF, what a checkpoint directory holds that kvplan reads (config.json, the
    safetensors index and shards), and bundled configs. (os.path's tests answer False for a name the file system
    cannot examine, too long a name: no file kvplan read.)"""
    from kvplan.sources import library
    from kvplan.sources import safetensors as st

    files = []
    for name in names:
        path = Path(name).expanduser()
        if os.path.isdir(path):
            try:
                shards = st.shard_names(path) or []
            except st.HeaderError:
                shards = []
            files += [str(path / f) for f in ("config.json", st.INDEX_FILE, *shards)]
        elif os.path.exists(path):
            files += [name, *_split_parts(path)]
        elif (entry := library.find(name)) is not None:
            files.append(str(library.config_path(entry)))
    list_file = _list_file(models) if models is not None else None
    return files + ([list_file] if list_file else [])
