"""`kvplan plot`: charts of a planning table (`kvplan.tables`), drawn with matplotlib (the `plot` extra).

kind kv     KV cache for --batch sequences (GiB) against context, one line per model, with each GPU's
            memory as a labelled horizontal line; `with_weights` plots weights + KV (the table's total
            column) instead.
kind users  max concurrent users on each GPU against context: one colour per model, one line style per GPU.
kind tpot, ttft, tps-user, tps-gpu
            with requests of isl + osl tokens: the speed model's estimated TPOT, TTFT, output tokens/s per user or
            per GPU on each GPU against context, at the users memory holds at each context (or the table's users),
            drawn as the users chart is.

Every number comes from the table (so from kvplan.memory and kvplan.capacity); this module only draws.
Context is on a log2 axis with a tick at each context asked for (4k, 8k, ...). matplotlib is imported here
only, on the Agg canvas, with no global pyplot state. SVG output is deterministic (fixed hash salt, no date)
and carries the plotted numbers as JSON in its Description metadata, so docs/examples can be checked for
staleness.
"""

from __future__ import annotations

import json
from pathlib import Path

from kvplan.errors import KvplanError
from kvplan.output import write_output
from kvplan.tables import SPEED_METRICS, GiB, Table, check_inputs, ctx_label
from kvplan.text import plain

KINDS = ("kv", "users", *SPEED_METRICS)
SCALES = ("log", "linear")
OUTPUT_FORMATS = {".png": "png", ".svg": "svg"}
SVG_SALT = "kvplan"
DESCRIPTION_PREFIX = "kvplan plot data: "
LINE_STYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
MAX_MODELS = 10  # one colour each (tab10); more lines than that cannot be told apart
GPU_LABEL_GAP = 0.08  # GPU lines closer than this (relative) share a label


def output_format(out: str) -> str:
    """png or svg, from the --out file's extension."""
    fmt = OUTPUT_FORMATS.get(Path(out).suffix.lower())
    if fmt is None:
        raise KvplanError(f"--out {out!r} must end in .png or .svg")
    return fmt


def check_kind(kind: str, table_has_gpus: bool, requests: bool = False) -> str:
    """A kind the chart can draw: users needs a GPU, the speed kinds a GPU and the requests (--isl, --osl)."""
    key = kind.strip().lower()
    if key not in KINDS:
        raise KvplanError(f"unknown --kind {kind!r}: choose {', '.join(KINDS[:-1])} or {KINDS[-1]}")
    check_inputs("--kind", key, table_has_gpus, requests)
    return key


def series(table: Table, kind: str, with_weights: bool = False) -> dict:
    """What the chart plots, as plain data: the contexts, one line per model (x GPU), the GPU lines."""
    by_model: dict[str, list] = {}
    for row in table.rows:
        by_model.setdefault(row.estimate.model, []).append(row)
    lines = []
    for model, rows in by_model.items():
        beyond = [r.beyond_max_context for r in rows]
        if kind == "kv":
            values = [r.estimate.total_bytes if with_weights else r.estimate.kv_bytes_total for r in rows]
            lines.append({"model": model, "gpu": None, "values": values, "beyond_max_context": beyond})
        else:
            for i, gpu in enumerate(table.gpus):
                line = {"model": model, "gpu": gpu.label, "beyond_max_context": beyond}
                if kind == "users":
                    line["values"] = [r.users[i].max_users for r in rows]
                else:
                    line["values"] = [getattr(r.speed[i], SPEED_METRICS[kind][0]) for r in rows]
                    line["not_estimated"] = [r.speed[i].not_estimated for r in rows]
                lines.append(line)
    data = {"kind": kind, "with_weights": with_weights, "batch": table.batch, "engine": table.engine,
            "engine_version": table.engine_version, "ctx": table.ctxs, "lines": lines,
            "gpus": [{"label": g.label, "memory_bytes": g.memory_bytes} for g in table.gpus]}
    if kind in SPEED_METRICS:
        data |= {"isl": table.isl, "osl": table.osl, "users": table.users}
    return data


def require_matplotlib():
    """matplotlib, imported only here (the `plot` extra), or a one-line error saying how to get it."""
    try:
        import matplotlib
    except ImportError:
        raise KvplanError("kvplan plot needs matplotlib: pip install '.[plot]' in kvplan's source directory (or "
                          "pip install matplotlib)") from None
    return matplotlib


def _figure():
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(9, 5.4), layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def draw(table: Table, kind: str, out: str, *, with_weights: bool = False, title: str | None = None,
         y_scale: str = "log", inputs: tuple[str, ...] = (), force: bool = False) -> tuple[dict, str]:
    """Draw the chart into `out` (.png or .svg, written as `kvplan.output.write_output` writes; `inputs` and
    `force` are its) and return the plotted data and what was written."""
    fmt = output_format(out)
    kind = check_kind(kind, bool(table.gpus), table.isl is not None)
    if y_scale not in SCALES:
        raise KvplanError(f"unknown --y-scale {y_scale!r}: choose log or linear")
    models = list(dict.fromkeys(row.estimate.model for row in table.rows))
    if len(models) > MAX_MODELS:
        raise KvplanError(f"{len(models)} models in one chart cannot be told apart: plot at most {MAX_MODELS} at a "
                          "time (--models or a narrower --filter), or use `kvplan table` for all of them")
    if kind in SPEED_METRICS:
        reasons = {speed.not_estimated for row in table.rows for speed in row.speed}
        if None not in reasons:
            raise KvplanError(f"no speed estimate to draw: {'; '.join(sorted(reasons))}")
    data = series(table, kind, with_weights)
    if kind != "kv" and y_scale == "log" and not any(v for line in data["lines"] for v in line["values"]):
        raise KvplanError("no user fits on any GPU at any of these contexts: nothing to draw on a log scale "
                          "(`kvplan table` shows the figures; a larger GPU, fp8 KV or a shorter --ctx may fit)")
    matplotlib = require_matplotlib()
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullLocator

    figure = _figure()
    axes = figure.add_subplot()
    colours = matplotlib.colormaps["tab10"].colors
    models = list(dict.fromkeys(line["model"] for line in data["lines"]))
    gpu_index = {g.label: i for i, g in enumerate(table.gpus)}
    ctxs = data["ctx"]
    any_beyond = False
    handles = []  # passed to the legend as they are: it would drop a model whose name starts with "_"
    for line in data["lines"]:
        index = models.index(line["model"])
        colour, marker = colours[index % len(colours)], MARKERS[index % len(MARKERS)]
        style = LINE_STYLES[gpu_index.get(line["gpu"], 0) % len(LINE_STYLES)]
        triples = zip(ctxs, line["values"], line["beyond_max_context"], strict=True)
        if kind == "kv":
            points = [(c, v / GiB, b) for c, v, b in triples]
            label = line["model"]
        else:  # a log axis cannot show 0 (does not fit) or None (no KV cache, no estimate): those are left out
            points = [(c, v, b) for c, v, b in triples if v]
            label = line["model"] + (f", {line['gpu']}" if len(table.gpus) > 1 else "")
            if not points and kind == "users":
                label += " (does not fit)" if any(v == 0 for v in line["values"]) else " (no KV cache)"
            elif not points:
                label += " (no estimate)" if any(line["not_estimated"]) else " (does not fit)"
        handles += axes.plot([p[0] for p in points], [p[1] for p in points], linestyle=style, color=colour,
                             marker=marker, markersize=5, linewidth=1.8, label=_text(label))
        beyond = [p for p in points if p[2]]
        if beyond:  # hollow markers where ctx is past the model's max context
            any_beyond = True
            axes.plot([p[0] for p in beyond], [p[1] for p in beyond], linestyle="none", marker=marker,
                      markersize=5, markerfacecolor="white", markeredgecolor=colour)

    axes.set_xscale("log", base=2)
    axes.xaxis.set_major_locator(FixedLocator(ctxs))
    axes.xaxis.set_major_formatter(FuncFormatter(lambda x, _: ctx_label(int(round(x)))))
    axes.xaxis.set_minor_locator(NullLocator())
    axes.set_xlim(ctxs[0] / 1.25, ctxs[-1] * 1.25)
    axes.set_xlabel("context per sequence (tokens, k = 1,024)")
    axes.set_yscale(y_scale)
    axes.grid(True, which="major", alpha=0.3)
    axes.grid(True, which="minor", axis="y", alpha=0.1)
    if kind == "kv":
        _gpu_lines(axes, table)
        what = "weights + KV cache" if with_weights else "KV cache"
        per = f"{table.batch:,} sequence{'' if table.batch == 1 else 's'}"
        axes.set_ylabel(f"{what} (GiB)")
        gib = FuncFormatter(lambda y, _: f"{y:g}")
        axes.yaxis.set_major_formatter(gib)
        if y_scale == "log":  # one format for every label: minor ticks at 2 and 5 x 10^k, labelled alike
            axes.yaxis.set_minor_locator(LogLocator(base=10, subs=(2, 5)))
            axes.yaxis.set_minor_formatter(gib)
        default_title = f"{what[0].upper()}{what[1:]} for {per} vs context"
    elif kind == "users":
        axes.set_ylabel("max concurrent users in steady decode")
        axes.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:,.0f}" if y >= 1 else f"{y:g}"))
        gpus = table.gpus[0].label if len(table.gpus) == 1 else "each GPU"
        default_title = (f"Max concurrent users in steady decode on {gpus} vs context "
                         f"({table.engine} {table.engine_version})")
    else:
        _, what, unit = SPEED_METRICS[kind]
        axes.set_ylabel(f"estimated {what}" + (f" ({unit})" if unit else ""))
        figure_format = FuncFormatter(lambda y, _: f"{y:,.0f}" if y >= 1 else f"{y:g}")
        axes.yaxis.set_major_formatter(figure_format)
        if y_scale == "log":  # as the kv chart: minor ticks at 2 and 5 x 10^k, labelled alike
            axes.yaxis.set_minor_locator(LogLocator(base=10, subs=(2, 5)))
            axes.yaxis.set_minor_formatter(figure_format)
        at = f"{table.users:,} users" if table.users else "memory's max users"
        default_title = (f"Estimated {what} at {at} ({table.isl:,} + {table.osl:,} tokens, {table.engine} "
                         f"{table.engine_version})")
    if y_scale == "linear":
        axes.set_ylim(bottom=0)
    axes.set_title(_text(title) if title else default_title)
    if any_beyond:
        handles.append(Line2D([], [], linestyle="none", marker="o", markersize=5, markerfacecolor="white",
                              markeredgecolor="0.3", label="hollow: beyond the model's max context"))
    axes.legend(handles=handles, loc="best", fontsize="small", framealpha=0.9, handlelength=3.5)
    written = write_output(out, lambda path: _save(figure, path, fmt, data), inputs, force)
    return data, written


def _text(text: str) -> str:
    """Text matplotlib shows as written: control characters escaped (`plain`), and `$` too, so that a model
    name is not parsed as mathtext (which a stray `$\\` in it would fail)."""
    return plain(text).replace("$", r"\$")


def _gpu_lines(axes, table: Table) -> None:
    """Each GPU set's memory as a dashed line, labelled at its right end; sets within GPU_LABEL_GAP of each
    other (an H100's 79.65 GiB and an A100's 80 GiB) share one label, which would otherwise overprint."""
    memory = sorted(((gpu.memory_bytes * gpu.count / GiB, gpu.label) for gpu in table.gpus), reverse=True)
    labels: list[tuple[float, list[str]]] = []
    for y, label in memory:
        axes.axhline(y, color="0.35", linestyle="--", linewidth=1)
        if labels and labels[-1][0] <= y * (1 + GPU_LABEL_GAP):
            labels[-1][1].append(f"{label} ({y:,.2f} GiB)")
        else:
            labels.append((y, [f"{label} ({y:,.2f} GiB)"]))
    for y, names in labels:
        axes.annotate(", ".join(names), xy=(1, y), xycoords=("axes fraction", "data"), xytext=(-4, 3),
                      textcoords="offset points", ha="right", va="bottom", fontsize="small", color="0.25")
    if memory and axes.get_yscale() == "log":
        low, high = axes.get_ylim()
        axes.set_ylim(low, max(high, memory[0][0] * 1.6))


def _save(figure, path: Path, fmt: str, data: dict) -> None:
    from matplotlib import rc_context

    metadata = ({"Date": None, "Description": DESCRIPTION_PREFIX + json.dumps(data, sort_keys=True)}
                if fmt == "svg" else {"Software": None})
    with rc_context({"svg.hashsalt": SVG_SALT, "svg.fonttype": "path"}):
        figure.savefig(path, format=fmt, dpi=150, metadata=metadata)


def svg_data(svg_text: str) -> dict | None:
    """The plotted data stored in an SVG written by `draw` (None if it has none)."""
    import html
    import re

    match = re.search(r"<dc:description>(.*?)</dc:description>", svg_text, re.S)
    if not match:
        return None
    text = html.unescape(match.group(1))
    return json.loads(text[len(DESCRIPTION_PREFIX):]) if text.startswith(DESCRIPTION_PREFIX) else None
