"""Presentation only: rich tables of numbers computed elsewhere. Nothing here computes memory.

Text from a config, a file name or the Hub is data: it is printed through a Console with markup off (`console()`),
styles are given as Text styles, and such text passes through `kvplan.text.plain`, so a model name holding
`[/dim]` or an escape sequence is shown as it is written."""

import sys
from itertools import groupby

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

from kvplan.memory import Estimate, checkpoint_bytes_by_dtype, kind_label
from kvplan.model import ModelSpec
from kvplan.text import narrow, plain
from kvplan.units import format_bytes, format_figure


class _TrailingSpacesStripped:
    """A text stream that drops the spaces rich pads table lines with: piped output is clean text."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> int:
        return self.stream.write("\n".join(line.rstrip(" ") for line in text.split("\n")))

    def flush(self) -> None:
        self.stream.flush()


def console(stderr: bool = False) -> Console:
    """The Console reports print to: markup and emoji codes are never parsed, so no string can become a style, a
    hyperlink or a picture; a pipe or a file gets no trailing spaces."""
    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty():
        return Console(markup=False, emoji=False, stderr=stderr)
    return Console(markup=False, emoji=False, file=_TrailingSpacesStripped(stream))


def text_of(draw, width: int = 80) -> str:
    """What `draw(console)` prints, as plain text `width` columns wide: a result's view in a notebook."""
    import io

    buffer = io.StringIO()
    draw(Console(file=_TrailingSpacesStripped(buffer), width=width, markup=False, emoji=False, color_system=None))
    return buffer.getvalue()


def print_table(console: Console, table: Table, whole: tuple[int, ...] = (0,)) -> None:
    """Print a table without breaking what must stay whole: numbers (right-justified columns) and the columns in
    `whole` (model ids, GPU names) keep their widest line on one line, while headers wrap between words and prose
    labels wrap. A terminal too narrow even for that gets the table at the width it needs (the terminal wraps the
    lines) rather than a cut id or number. In a table of labels and values, rows stay single-spaced: a label that
    wraps continues indented under itself (`_hang`), so that its second line does not read as a row of its own."""
    needed = _measure(console, table, whole)
    if needed.maximum > console.width and not table.show_header:
        table = _hang(console, table, needed.maximum - console.width)
        needed = table.__rich_measure__(console, console.options)
    if needed.minimum <= console.width < needed.maximum:
        _narrow(table, needed.maximum - console.width)
    console.print(table, width=max(console.width, needed.minimum), crop=False)


def _hang(console: Console, table: Table, excess: int) -> Table:
    """A table of labels and values `excess` cells too wide, as a copy whose labels (the first column) are wrapped
    `excess` cells narrower, each further line indented two cells past the label's own indent."""
    labels, *others = table.columns
    width = max(max((cell_len(str(c)) for c in labels.cells), default=0) - excess, 12)
    hung = Table(show_header=False, box=table.box, padding=table.padding)
    for column in table.columns:
        hung.add_column(justify=column.justify)
    for label, *values in zip(labels.cells, *(column.cells for column in others), strict=True):
        text = label if isinstance(label, Text) else Text(str(label))
        indent = " " * (len(text.plain) - len(text.plain.lstrip(" ")) + 2)
        lines = text.wrap(console, width)
        hung.add_row(Text("\n").join([lines[0], *(Text(indent) + line for line in lines[1:])]), *values)
    return hung


def _measure(console: Console, table: Table, whole: tuple[int, ...]):
    """The table's (minimum, maximum) width once numbers and the `whole` columns are kept on one line."""
    for index, column in enumerate(table.columns):
        if column.justify == "right" or index in whole:
            lines = [line for c in column.cells if isinstance(c, str | Text) for line in str(c).split("\n")]
            header = str(column.header).split()
            column.min_width = max([*map(cell_len, lines), *map(cell_len, header)], default=0)
    return table.__rich_measure__(console, console.options)


def _narrow(table: Table, excess: int) -> None:
    """Take `excess` cells off the columns, from the column with the most to give (`kvplan.text.narrow`: its widest
    line less its floor, its min_width or else its longest word), and cap each column there: headers and prose wrap
    between words, and nothing kept whole is cut. (rich's own collapse takes from every column alike, then puts
    back what a column's min_width needs, and can leave the table wider than the terminal.)"""
    widths, floors = [], []
    for column in table.columns:
        lines = [line for c in (column.header, *column.cells) for line in str(c).split("\n")]
        widths.append(max(map(cell_len, lines), default=0))
        words = [cell_len(word) for line in lines for word in line.split()]
        floors.append(column.min_width if column.min_width is not None else max(words, default=0))
    for column, width in zip(table.columns, narrow(widths, floors, excess), strict=True):
        column.max_width = width


def _min_width(console: Console, table: Table, whole: tuple[int, ...]) -> int:
    return _measure(console, table, whole).minimum


def styled(text: object, style: str) -> Text:
    return Text(plain(text), style=style)


def line(*parts: str | tuple[str, str]) -> Text:
    """Plain parts and (text, style) parts, every part made safe; a part that is exactly a newline is kept."""
    return Text.assemble(*((plain(p[0]), p[1]) if isinstance(p, tuple) else p if p == "\n" else plain(p)
                           for p in parts))


def both_units(n: int) -> str:
    """GiB (2**30) first, GB (10**9) in brackets: both named, never mixed up."""
    return f"{format_bytes(n)} ({format_bytes(n, decimal=True)})"


def billions(n: int) -> str:
    return f"{n / 1e9:,.2f}B" if n >= 1e9 else f"{n / 1e6:,.1f}M"


def model_header(model: ModelSpec) -> Text:
    params = f"{billions(model.params.total)} params"
    if model.params.active != model.params.total:
        params += f" ({billions(model.params.active)} active)"
    if model.checkpoint is not None:
        params += f" ({model.checkpoint.format}: {checkpoint_summary(model)})"
    quant = ""
    if model.quantization:
        method = model.quantization.method
        quant = f", weights {model.quantization.weights_dtype}" + ("" if method == model.quantization.weights_dtype
                                                                   else f" ({method})")
    ctx = f", max context {model.max_context:,}" if model.max_context else ""
    layout = f"{model.architecture}, {model.num_layers} layers, {params}, {model.dtype}"
    return line((model.name, "bold"), "\n", f"{layout}{quant}{ctx}")


def checkpoint_summary(model: ModelSpec) -> str:
    """The checkpoint's tensor elements, by dtype when there are several: '8.03B BF16', '1.27B elements: I32 ...'."""
    elements = model.checkpoint.elements
    if len(elements) == 1:
        ((dtype, count),) = elements.items()
        return f"{billions(count)} {dtype}"
    by_dtype = ", ".join(f"{d} {billions(n)}" for d, n in elements.items())
    return f"{billions(model.checkpoint.total)} elements: {by_dtype}"


def print_estimate(console: Console, model: ModelSpec, est: Estimate) -> None:
    console.print(model_header(model))
    console.print(styled(f"source: {model.source}", "dim"))
    for note in model.notes:
        console.print(styled(f"note: {note}", "dim"))
    table = Table(title=f"KV cache per sequence at {est.ctx:,} tokens ({est.kv_dtype})", title_justify="left")
    for column in ("layer kind", "layers", "per token", "tokens held", "per sequence"):
        table.add_column(column, justify="left" if column == "layer kind" else "right")
    for row in est.breakdown:
        table.add_row(plain(row.kind), str(row.layers), format_bytes(row.bytes_per_token), f"{row.tokens_held:,}",
                      format_bytes(row.bytes_per_sequence))
    print_table(console, table)
    summary = Table(show_header=False, box=None, padding=(0, 2))
    summary.add_column()
    summary.add_column(justify="right")
    summary.add_row("KV per token (all attention layers)", f"{est.kv_bytes_per_token:,} B")
    summary.add_row(f"KV per sequence ({est.ctx:,} tokens)", both_units(est.kv_bytes_per_sequence))
    if est.state_bytes_per_sequence:
        state = "compressor" if any(c.kind == "compressed" for c in model.caches) else "recurrent"
        summary.add_row(f"  of which {state} state", both_units(est.state_bytes_per_sequence))
    summary.add_row(f"KV for batch {est.batch:,}", both_units(est.kv_bytes_total))
    exact = f", exact from {model.checkpoint.format}" if est.weights_source == "checkpoint" else ""
    summary.add_row(f"weights ({est.weights_dtype}{exact})", both_units(est.weights_bytes))
    summary.add_row(styled("weights + KV", "bold"), styled(both_units(est.total_bytes), "bold"))
    print_table(console, summary, whole=())
    for warning in est.warnings:
        console.print(styled(f"warning: {warning}", "yellow"))


def print_estimate_result(console: Console, result) -> None:
    """`kvplan estimate`'s report (kvplan.results.EstimateResult): the estimate and its notes, then the capacity if
    planned, its speed if asked, and the verdict."""
    print_estimate(console, result.spec, result.memory)
    for note in result.notes:
        console.print(f"note: {note}", style="dim")
    if result.capacity is not None:
        print_capacity(console, result.capacity)
        if result.speed is not None:
            print_speed(console, result.speed)
        print_verdict(console, result.served, result.speed)


def print_layout(console: Console, model: ModelSpec) -> None:
    """The normalised layer layout: runs of consecutive layers with the same cache, then parameters."""
    console.print(model_header(model))
    console.print(styled(f"source: {model.source}", "dim"))
    for note in model.notes:
        console.print(styled(f"note: {note}", "dim"))
    table = Table(title="layers", title_justify="left")
    for column in ("layers", "cache", "shape per token", "split by TP"):
        table.add_column(column)
    layers = [list(caches) for _, caches in groupby(model.caches, key=lambda c: c.layer)]
    for _, run in groupby(layers, key=lambda caches: [c.model_dump(exclude={"layer"}) for c in caches]):
        run = list(run)
        first, last = run[0][0].layer, run[-1][0].layer
        span = str(first) if first == last else f"{first}-{last}"
        for i, cache in enumerate(run[0]):  # a layer with two caches (MLA and its indexer) gets two lines
            split = "yes" if cache.split_by_tensor_parallel else "no"
            table.add_row(span if i == 0 else "", plain(kind_label(cache)), plain(_shape(cache)), split)
    print_table(console, table)
    params = Table(title="parameters", title_justify="left")
    params.add_column("group")
    params.add_column("count", justify="right")
    for group, count in model.params.model_dump(exclude={"active_experts"}).items():
        if count or group != "vision":  # text-only models have no vision row
            params.add_row(group, f"{count:,}")
    params.add_row(styled("total", "bold"), styled(f"{model.params.total:,}", "bold"))
    if model.params.active != model.params.total:
        params.add_row("active per token", f"{model.params.active:,}")
    print_table(console, params)
    if model.widths is not None:
        console.print(f"forward widths (for prefill activations): {_widths(model.widths)}")
    if model.mtp is not None:
        many = model.mtp.layers > 1
        console.print(f"{model.mtp.layers} MTP layer{'s' if many else ''} beside the model "
                      f"({billions(model.mtp.params.total)} params, not in the total; --speculative-method mtp runs "
                      f"{'them' if many else 'it'})")
    if model.checkpoint is not None:
        _print_checkpoint(console, model)


def _widths(widths) -> str:
    parts = [f"hidden {widths.hidden:,}"]
    if widths.mlp_intermediate:
        gate = "gated" if widths.gated_mlp else "plain"
        parts.append(f"MLP {widths.mlp_intermediate:,} ({gate}, {widths.mlp_activation})")
    if widths.experts_per_token:
        parts.append(f"top-{widths.experts_per_token} experts of {widths.expert_intermediate:,}")
    return ", ".join(parts)


def _print_checkpoint(console: Console, model: ModelSpec) -> None:
    """The checkpoint's real tensors: elements and bytes by stored dtype."""
    table = Table(title=plain(f"checkpoint tensors ({model.checkpoint.source})"), title_justify="left")
    for column in ("dtype", "elements", "bytes"):
        table.add_column(column, justify="left" if column == "dtype" else "right")
    sizes = checkpoint_bytes_by_dtype(model.checkpoint)
    for dtype, count in model.checkpoint.elements.items():
        table.add_row(dtype, f"{count:,}", both_units(sizes[dtype]))
    table.add_row(styled(f"{model.checkpoint.tensors:,} tensors", "bold"),
                  styled(f"{model.checkpoint.total:,}", "bold"), styled(both_units(sum(sizes.values())), "bold"))
    print_table(console, table)


def _shape(cache) -> str:
    if cache.kind in ("full", "sliding", "chunked", "cross", "prefixed"):
        dims = f"{cache.head_dim}" if cache.head_dim == cache.head_dim_v else f"{cache.head_dim}+{cache.head_dim_v}"
        return f"K,V: {cache.kv_heads} heads x {dims}"
    if cache.kind == "mla":
        return f"latent {cache.latent_dim} + rope {cache.rope_dim}, 1 head"
    if cache.kind == "recurrent" and cache.token_ids:
        return f"state: conv {cache.conv_elements:,} elements + {cache.token_ids} token ids (int64)"
    if cache.kind == "indexer":
        return f"indexer key {cache.head_dim}, 1 head"
    if cache.kind == "recurrent":
        return f"state: conv {cache.conv_elements:,} + ssm {cache.ssm_elements:,} elements"
    if cache.kind == "sliding_kv":
        return f"K=V {cache.head_dim}, 1 head"
    if cache.kind == "compressed":
        overlap = ", overlapping windows" if cache.overlap else ""
        return f"entry {cache.head_dim}, 1 head; compressor state{overlap}"
    if cache.kind == "shared":
        return f"reads layer {cache.source}'s K,V"
    if cache.kind == "states":
        stored = f" x {cache.element_bytes} B" if cache.element_bytes else ""
        return f"{cache.width:,} values{stored}, not K,V"
    return cache.reason


def print_capacity(console: Console, cap) -> None:
    """The capacity plan (kvplan.capacity.Capacity): budget, users, what vLLM would log, the verdict."""
    if cap.platform == "cpu":
        where = "the CPU"
    elif cap.gpu:
        where = f"{cap.gpus} x {cap.gpu}"
    else:
        where = f"{cap.gpus} x {format_bytes(cap.gpu_memory_bytes)} GPU" if cap.gpu_memory_bytes else "GPU"
    from kvplan.engines import engine_class  # capacity has imported it already

    engine = engine_class(cap.engine)
    tp, dp, ep = cap.tensor_parallel_size, cap.data_parallel_size, cap.expert_parallel_size
    layout = f"{'DP ' + str(dp) + ' x ' if dp > 1 else ''}TP {tp}, PP {cap.pipeline_parallel_size}"
    if ep > 1:
        layout += f", EP {ep}"
    if cap.data_parallel_replicas > 1:
        layout += f", {cap.data_parallel_replicas} replicas"
    version = cap.engine_version + ("" if cap.engine_version_given else ", assumed")
    console.print(line("\n", (f"Capacity on {where}", "bold"), f" ({layout}) with {cap.engine} {version}"))
    if engine.tp_spans_dp and dp > 1:
        console.print(styled(f"{engine.label} --tp {tp * dp} --dp {dp} --enable-dp-attention: attention TP "
                             f"{tp * dp} / {dp} = {tp}", "dim"))
    table = Table(show_header=False, box=None, padding=(0, 2))
    table.add_column()
    table.add_column(justify="right")
    if cap.kv_budget_given:
        per = "on the CPU" if cap.platform == "cpu" else "per GPU"
        table.add_row(f"KV budget {per} (--kv-budget)", both_units(cap.kv_budget_bytes))
    else:
        table.add_row("GPU memory", both_units(cap.gpu_memory_bytes))
        table.add_row("x memory fraction", f"{cap.memory_fraction:g}")
        table.add_row(f"- weights per GPU ({cap.weights_dtype})", both_units(cap.weights_bytes_per_gpu))
        if dp > 1 or ep > 1:
            for part, size in _weights_split(cap):
                table.add_row(styled(f"    {part}", "dim"), styled(format_bytes(size), "dim"))
        if cap.weights_offloaded_bytes_per_gpu:
            table.add_row(styled("    and in host memory (--cpu-offload-gb)", "dim"),
                          styled(format_bytes(cap.weights_offloaded_bytes_per_gpu), "dim"))
        if cap.draft_weights_bytes_per_gpu:
            table.add_row("- draft weights", both_units(cap.draft_weights_bytes_per_gpu))
        if cap.lora_bytes_per_gpu:
            held = (f"adapters ({cap.lora_slots:,}, rank up to {cap.lora_rank:,})" if cap.engine == "llama.cpp" else
                    f"slots ({cap.lora_slots:,} x rank {cap.lora_rank:,})")
            table.add_row(f"- LoRA {held}", both_units(cap.lora_bytes_per_gpu))
        table.add_row("- overhead" + ("" if any(cap.overhead.values()) else " (none)"), both_units(cap.overhead_bytes))
        for name, size in cap.overhead.items():
            if size:
                table.add_row(styled(f"    {name.replace('_', ' ')}", "dim"), styled(format_bytes(size), "dim"))
        table.add_row(styled("= KV budget per GPU", "bold"), styled(both_units(cap.kv_budget_bytes), "bold"))
    decode = cap.engine_kv_bytes_per_sequence_decode
    two_figures = cap.max_users_at_startup != cap.max_concurrent_users
    if decode == cap.engine_kv_bytes_per_sequence:
        table.add_row(f"KV per user ({cap.kv_dtype})", both_units(decode))
    else:
        table.add_row(f"KV per user ({cap.kv_dtype}), steady decode", both_units(decode))
        table.add_row("KV per user reserved at start-up", both_units(cap.engine_kv_bytes_per_sequence))
    if cap.engine_kv_bytes_per_sequence_draft:
        table.add_row("  of which the draft", both_units(cap.engine_kv_bytes_per_sequence_draft))
    if cap.engine_activation_bytes_for_users:
        table.add_row(f"{engine.activations_label} for {_users(cap.users)}",
                      both_units(cap.engine_activation_bytes_for_users))
    if cap.engine_gpu_bytes_for_users is not None:
        table.add_row(f"process GPU memory, {_users(cap.users)}", both_units(cap.engine_gpu_bytes_for_users))
    label = engine.label
    if dp > 1:
        table.add_row(f"max users of one DP rank (x {dp:,})", f"{cap.max_users_per_rank:,}")
    headline = f"max users at {cap.ctx:,} tokens" + (", steady decode" if two_figures else "")
    table.add_row(styled(headline, "bold"), styled(f"{cap.max_concurrent_users:,}", "bold"))
    if two_figures:
        table.add_row(f"max users {label}'s start-up check admits", f"{cap.max_users_at_startup:,}")
    if cap.max_users_at_avg_ctx is not None:
        table.add_row(f"max users at the mean {cap.avg_ctx:,} tokens", f"{cap.max_users_at_avg_ctx:,}")
    if cap.shared_prefix:
        table.add_row("shared prefix cached once", f"{cap.shared_prefix:,} tokens")
    if cap.max_ctx_for_users:
        capped = CTX_CAPS.get(cap.max_ctx_for_users_bound, "")
        table.add_row(f"longest context for {_users(cap.users)}{capped}", f"{cap.max_ctx_for_users:,} tokens")
    if cap.vllm_kv_offload_blocks is not None:
        held = f" ({cap.vllm_kv_offload_tokens:,} tokens)" if cap.vllm_kv_offload_tokens is not None else ""
        table.add_row("KV blocks in host memory (prefix hits)", f"{cap.vllm_kv_offload_blocks:,}{held}")
    if cap.host_memory_bytes:
        table.add_row("host memory pinned, all GPUs", both_units(cap.host_memory_bytes))
    print_table(console, table, whole=())
    if two_figures:
        console.print(plain(
            f"In steady decode a user holds only what it still reads (windows freed as they slide, a state's prefill "
            f"checkpoint freed): {_users(cap.max_concurrent_users)} served without preemption. A prompt being "
            f"admitted takes more (a window plus the in-flight tokens of its prefill, a checkpoint page), and "
            f"{label}'s start-up check reserves that for every request: {_users(cap.max_users_at_startup)}, as it "
            "logs."))
    if cap.vllm_log:
        _print_vllm_log(console, cap)
    for note in [*cap.engine_assumptions, *_extras_notes(cap), *cap.notes]:
        console.print(styled(f"note: {note}", "dim"))


def print_verdict(console: Console, cap, served=None) -> None:
    """Whether the users asked fit, by memory and, with speed targets (`served`, kvplan.speed.targets.Speed), by
    speed too; where not, why and what would."""
    if cap.fits:
        room = f"room for {cap.max_concurrent_users:,}"
        if served is not None and served.targets is not None:
            room = f"room for {served.memory_users:,}, {served.users:,} within {served.targets.label()}"
        console.print(line(("fits", "green bold"), f": {_users(cap.users)} at {cap.ctx:,} tokens ({room})"))
        return
    console.print(line(("does not fit", "red bold"), f": {'; '.join(cap.reasons)}"))
    for suggestion in cap.suggestions:
        console.print(line(f"  - {suggestion}"))


def _ms(value: float) -> str:
    return f"{format_figure(value)} ms"


BINDS = {"speed": "speed binds", "memory": "memory binds", "sequence_limit": "the engine's request limit binds"}


def print_speed(console: Console, served) -> None:
    """kvplan.speed.targets.Speed: the bound and the calibrated estimate side by side at the concurrency, what
    binds a decode step, what each figure is and how far off the estimate has been, its flags, and with targets
    the users served within them."""
    e = served.estimate
    instances = "" if served.replicas == 1 else f", {e.concurrency:,} on each of {served.replicas:,} replicas"
    console.print(line("\n", (f"Speed at {_users(served.concurrency)}", "bold"),
                       f" of {served.isl:,} prompt + {served.osl:,} output tokens{instances}"))
    if served.targets is not None:
        console.print(f"targets: {served.targets.label()}")
    table = Table(box=None, padding=(0, 2), show_edge=False)
    table.add_column()
    table.add_column("bound", justify="right")
    table.add_column("estimate", justify="right")
    table.add_row("time per output token (TPOT)", _ms(e.decode_step_ms_bound), _ms(e.decode_step_ms))
    table.add_row("time to first token (TTFT)", _ms(e.ttft_ms_bound), _ms(e.ttft_ms))
    table.add_row("output tokens/s per user", format_figure(served.tokens_per_s_per_user_bound),
                  format_figure(e.tokens_per_s_per_user))
    table.add_row("output tokens/s per GPU", format_figure(served.tokens_per_s_per_gpu_bound),
                  format_figure(e.tokens_per_s_per_gpu))
    if served.targets is not None:
        table.add_row("users within the targets", "", f"{served.fit_users:,}")
        table.add_row(f"max users at {served.ctx:,} tokens (capacity, above)", "", f"{served.memory_users:,}")
        table.add_row(styled(f"users served ({BINDS[served.bound]})", "bold"), "", styled(f"{served.users:,}", "bold"))
    print_table(console, table, whole=())
    error = served.error
    console.print(plain(f"bound: the work of each step at the GPU's peak rates ({e.binding} binds a decode step), "
                        "with no queueing and no kernel inefficiency: no run is faster."))
    console.print(plain(
        f"estimate: steady continuous batching with {e.engine}'s efficiencies, fitted on {error.runs:,} serving "
        f"runs of {error.models} models on {error.gpus} GPUs; on a model or GPU left out of the fit its median "
        f"error is {error.tpot_median:.0%} for TPOT (p90 {error.tpot_p90:.0%}) and {error.ttft_median:.0%} for TTFT "
        f"(p90 {error.ttft_p90:.0%}) (docs/accuracy.md)."))
    for flag in e.flags:
        console.print(styled(f"flag: {flag}", "yellow"))


# what the longest context for N users stops at, where memory would hold more (Capacity.max_ctx_for_users_bound)
CTX_CAPS = {"max_context": " (model's max)", "search_limit": " (search limit)"}


def _weights_split(cap) -> list[tuple[str, int]]:
    """Weights per GPU as data-parallel attention and expert parallelism split them: the routed experts over
    the DP x TP GPUs of a stage, the rest by the attention TP, a copy on every DP rank."""
    stage = cap.tensor_parallel_size * cap.data_parallel_size
    placed = f"EP {cap.expert_parallel_size}" if cap.expert_parallel_size > 1 else "sliced"
    return [("attention, dense, embeddings", cap.weights_bytes_per_gpu - cap.weights_bytes_per_gpu_experts),
            (f"routed experts (over {stage} GPUs, {placed})", cap.weights_bytes_per_gpu_experts)]
def _extras_notes(cap) -> list[str]:
    """Speculative decoding and LoRA, in words."""
    out = []
    if cap.speculative_method:
        out.append(f"speculative decoding ({cap.speculative_method}, {cap.speculative_tokens:,} draft token"
                   f"{'s' if cap.speculative_tokens > 1 else ''} per step): {cap.draft_model}")
    if cap.lora_slots and cap.engine == "llama.cpp":
        if cap.lora_host_bytes_per_gpu:
            out.append(f"LoRA adapters: {format_bytes(cap.lora_host_bytes_per_gpu)} of them (the token embeddings' "
                       "pairs) in host memory with the embeddings")
    elif cap.lora_slots:
        out.append(f"LoRA host cache: up to {format_bytes(cap.lora_host_bytes_per_gpu)} of host memory per GPU "
                   f"worker (max_cpu_loras adapters of rank {cap.lora_rank:,} on every LoRA module)")
    return out


def _print_vllm_log(console: Console, cap) -> None:
    blocks = f"{cap.vllm_num_blocks:,} blocks of {format_bytes(cap.vllm_block_bytes)}"
    if cap.vllm_max_concurrency < 1:
        console.print(f"vLLM would refuse to start: {blocks} cannot hold one request of {cap.ctx:,} tokens "
                      f"({cap.vllm_blocks_per_sequence:,} blocks)")
        return
    who = f"Each of the {cap.data_parallel_size} DP ranks" if cap.data_parallel_size > 1 else "vLLM"
    console.print(f"{who} would log ({blocks}, {cap.vllm_blocks_per_sequence:,} per request; one is the null "
                  "block):")
    for log_line in cap.vllm_log:
        console.print(plain(f"  {log_line}"), highlight=False)


def _users(n: int) -> str:
    return f"{n:,} user" + ("" if n == 1 else "s")


def print_plan(console: Console, plan) -> None:
    """The configurations of kvplan.capacity.plan, fewest GPUs first; a plan for requests of isl + osl tokens
    (kvplan.speed.targets.SpeedPlan) with each one's estimated TPOT and TTFT at the users, in place of the KV
    headroom, and the targets they meet."""
    speed = getattr(plan, "isl", None) is not None
    gpu = plan.gpu or f"{format_bytes(plan.gpu_memory_bytes)} GPU"
    each = f" ({plan.isl:,} prompt + {plan.osl:,} output)" if speed else ""
    console.print(line((plan.model, "bold"), f": {plan.users:,} users at {plan.ctx:,} tokens{each} on {gpu} "
                       f"with {plan.engine} {plan.engine_version}"))
    for warning in plan.warnings:
        console.print(styled(f"warning: {warning}", "yellow"))
    within = f" within {plan.targets.label()}" if speed and plan.targets else ""
    if not plan.rows:
        for note in plan.notes:
            console.print(styled(f"note: {note}", "dim"))
        console.print(styled(f"no configuration of up to the largest GPU count considered fits{within}", "red"))
        return
    table = Table(title=f"configurations that fit{within}, fewest GPUs first", title_justify="left")
    last = ("TPOT ms", "TTFT ms") if speed else ("KV headroom/GPU",)
    for column in ("GPUs", "layout", "KV", "weights", "max users", *last):
        numeric = column in ("GPUs", "max users", *last)
        table.add_column(column, justify="right" if numeric else "left")
    from kvplan.capacity import describe_layout  # plan has imported it already

    for row in plan.rows:
        layout = describe_layout(row.tensor_parallel_size, row.pipeline_parallel_size, row.data_parallel_size,
                                 row.expert_parallel_size, row.data_parallel_replicas)
        if speed:
            times = [("-" if ms is None else format_figure(ms)) for ms in (row.decode_step_ms, row.ttft_ms)]
        else:
            times = [f"{format_bytes(row.headroom_bytes)} ({row.headroom_fraction:.0%})"]
        table.add_row(str(row.gpus), layout, row.kv_dtype, row.weights_dtype, f"{row.max_concurrent_users:,}", *times)
    print_table(console, table)
    if speed:
        error = plan.speed_error
        fewer = "max users: the fewer of what memory holds and what meets the targets. " if plan.targets else ""
        console.print(plain(
            f"{fewer}TPOT, TTFT: estimates at {plan.users:,} users, off by a median {error.tpot_median:.0%} and "
            f"{error.ttft_median:.0%} on models and GPUs left out of their fit (docs/accuracy.md)"))
    for note in plan.notes:
        console.print(styled(f"note: {note}", "dim"))
    first = plan.rows[0]
    held = [f"{what} {format_bytes(size)}" for what, size in (("draft weights", first.draft_weights_bytes_per_gpu),
                                                              ("LoRA slots", first.lora_bytes_per_gpu)) if size]
    if held:
        console.print(styled(f"note: each GPU of the first configuration also holds {', '.join(held)}", "dim"))


def print_gpus(console: Console, gpus) -> None:
    """The catalogue; units in the headers, so that the table fits 80 columns with every name on one line."""
    table = Table(title=f"{len(gpus)} GPUs (memory as the driver reports it)", title_justify="left")
    for column in ("GPU", "alias", "memory (GiB)", "usable (GiB)", "GB/s", "BF16 TFLOP/s"):
        table.add_column(column, justify="left" if column in ("GPU", "alias") else "right")
    for gpu in gpus:
        table.add_row(gpu.name, gpu.aliases[0] if gpu.aliases else "", f"{gpu.memory_bytes / 2**30:,.2f}",
                      f"{gpu.usable_bytes / 2**30:,.2f}", f"{gpu.bandwidth_gbs:,.0f}",
                      f"{gpu.bf16_tflops:,.1f}" if gpu.bf16_tflops else "-")
    print_table(console, table, whole=(0, 1))


def print_models(console: Console, entries) -> None:
    """The bundled library, one model a row with its aliases one per line (each can be copied into --model). A
    terminal too narrow for ids and aliases side by side gets the aliases under the id, indented."""
    def table(beside: bool) -> Table:
        out = Table(title=f"{len(entries)} bundled model{'' if len(entries) == 1 else 's'}", title_justify="left")
        for column in ("model", "aliases", "provenance") if beside else ("model (aliases below)", "provenance"):
            out.add_column(column)
        for entry in entries:
            aliases = [plain(a) for a in entry.aliases]
            if beside:
                out.add_row(plain(entry.id), "\n".join(aliases), entry.provenance)
            else:
                out.add_row("\n".join([plain(entry.id), *(f"  {alias}" for alias in aliases)]), entry.provenance)
        return out

    side_by_side = table(beside=True)
    print_table(console, side_by_side if _min_width(console, side_by_side, whole=(0, 1)) <= console.width
                else table(beside=False), whole=(0, 1))


# ---------------------------------------------------------------------------------------------- kvplan profile


class ProfileProgress:
    """Progress on stderr for `kvplan profile` (build, prefill, decode): a transient rich bar on a terminal, one
    plain line per phase (with its time) when stderr is a pipe or a file."""

    def __init__(self):
        self.console = console(stderr=True)

    def notice(self, text: str) -> None:
        """Something to know before a long run starts: one unwrapped line when stderr is a pipe or a file."""
        if not self.console.is_terminal:
            print(f"note: {plain(text)}", file=sys.stderr, flush=True)
            return
        self.console.print(styled(f"note: {text}", "yellow"))

    def phase(self, description: str, total: int | None = None):
        import time
        from contextlib import contextmanager

        from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        if not self.console.is_terminal:
            @contextmanager
            def lines():
                start = time.monotonic()
                print(f"kvplan: {plain(description)} ...", file=sys.stderr, flush=True)
                yield lambda steps=1: None
                print(f"kvplan: {plain(description)}: done in {time.monotonic() - start:,.1f} s", file=sys.stderr,
                      flush=True)

            return lines()

        @contextmanager
        def run():
            columns = [SpinnerColumn(), TextColumn("{task.description}", markup=False)]
            if total:
                columns += [BarColumn(), MofNCompleteColumn()]
            columns.append(TimeElapsedColumn())
            with Progress(*columns, console=self.console, transient=True) as bar:
                task = bar.add_task(plain(description), total=total)
                yield lambda steps=1: bar.advance(task, steps)

        return run()


def _count(n: int | None) -> str:
    return "-" if n is None else f"{n:,}"


def _error(comp) -> tuple[str, str]:
    if comp.error_bytes is None:
        return "-", "-"
    pct = "-" if comp.error_pct is None else f"{comp.error_pct:+.2f}%"
    return f"{comp.error_bytes:+,}", pct


def print_profile(console: Console, result) -> None:
    """kvplan.profiler.results.Profile: predicted vs measured per component and per layer kind, time, verdict. Every
    table fits 80 columns without cutting a number or a class name: exact bytes in four columns at most, sizes
    where a column more is needed, what a row is stored as below its table."""
    cut = f"first {result.layers} of {result.total_layers} layers" if result.layers < result.total_layers \
        else f"{result.layers} layers"
    console.print(line((result.model, "bold"), f" ({result.architecture}, {cut}): {result.batch:,} x "
                       f"{result.ctx:,} tokens ({result.prompt_tokens:,} prefilled + {result.decode_steps:,} decoded), "
                       f"{result.dtype}"))
    versions = f"torch {result.torch_version}, transformers {result.transformers_version}"
    if result.cuda_version:
        versions += f", CUDA {result.cuda_version}"
    if result.driver_version:
        versions += f", driver {result.driver_version}"
    console.print(styled(f"{result.device_name} ({result.device}); {versions}; {result.model_class}, "
                         f"{result.cache_class or '-'}, attention {result.attn_implementation or '-'}", "dim"))
    cuda = result.device.startswith("cuda")
    table = Table(title="predicted (kvplan, transformers engine) vs measured, bytes", title_justify="left")
    for column in ("component", "predicted", "measured", "error", "error %"):
        table.add_column(column, justify="left" if column == "component" else "right")
    for comp in result.components:
        if comp.measured is None and not cuda:
            continue  # CUDA context and total are the allocator's and the driver's figures
        error, pct = _error(comp)
        table.add_row(comp.name, _count(comp.predicted), _count(comp.measured), error, pct)
    print_table(console, table, whole=())  # the labels wrap, the numbers stay whole
    if result.measured_prefill_activation_bytes is not None:
        console.print(styled(
            f"activations and other, by phase (predicted / measured): prefill "
            f"{_count(result.predicted_prefill_activation_bytes)} / {_count(result.measured_prefill_activation_bytes)}"
            f"; decode, above the cache it ends with, {_count(result.predicted_decode_above_cache_bytes)} / "
            f"{_count(result.measured_decode_above_cache_bytes)}", "dim"))
    if result.by_kind:
        kinds = Table(title=f"KV cache by layer kind after decode ({result.cache_class}), bytes",
                      title_justify="left")
        for column in ("layer kind", "tokens held", "predicted", "measured", "visible"):
            kinds.add_column(column, justify="left" if column == "layer kind" else "right")
        for row in result.by_kind:
            layers = f"{row.layers:,} layer{'s' if row.layers != 1 else ''}"
            kinds.add_row(f"{plain(row.kind)} ({layers})", _count(row.tokens_measured), _count(row.predicted),
                          _count(row.measured), _count(row.measured_view))
        print_table(console, kinds, whole=())
        console.print("stored as: " + "; ".join(f"{plain(row.kind)}: {row.cache_layer_class} "
                                                 f"({', '.join(row.dtypes)})" for row in result.by_kind))
    _print_profile_memory(console, result)
    if result.ttft_s is not None:
        timing = (f"time to first token {result.ttft_s * 1000:,.1f} ms ({result.prefill_tokens_per_s:,.0f} prefill "
                "tokens/s)")
        if result.decode_tokens_per_s is not None:
            timing += f"; decode {result.decode_tokens_per_s:,.1f} tokens/s (batch {result.batch:,})"
        console.print(timing)
    if result.decode_bandwidth is not None:
        _print_decode_bandwidth(console, result.decode_bandwidth)
    if result.recompute:
        _print_recompute(console, result.recompute)
    if result.max_batch is not None:
        mb = result.max_batch
        error = "-" if mb.error_pct is None else f"{mb.error_pct:+.1f}%"
        target = {True: "within", False: "outside", None: "n/a"}[mb.within_target]
        console.print(f"largest batch at {result.ctx:,} tokens on {format_bytes(mb.gpu_memory_bytes)}: measured "
                      f"{mb.measured:,}, predicted {mb.predicted:,} ({error}, {target} the 5% target); tried "
                      + ", ".join(f"{t.batch}{'' if t.fits else ' (OOM)'}" for t in mb.trials))
    for note in result.notes:
        console.print(styled(f"note: {note}", "dim"))
    for finding in result.findings:
        console.print(styled(f"finding: {finding}", "yellow"))
    style = "green" if result.kv_exact else "yellow"
    console.print(line(("verdict", f"{style} bold"), f": {result.verdict}"))


def _print_decode_bandwidth(console: Console, b) -> None:
    """kvplan.profiler.bandwidth.DecodeBandwidth: the measured step beside the bound, and the bandwidth reached."""
    bound = f", {_ms(b.step_ms_bound)} at peak ({b.bound_by} binds)" if b.step_ms_bound is not None else ""
    console.print(f"decode step {_ms(b.step_ms)}{bound}: {format_bytes(b.bytes_per_step, decimal=True)} read a "
                  f"step, {b.bandwidth_gbs:,.0f} GB/s: {b.utilisation:.1%} of {b.gpu}'s "
                  f"{b.gpu_bandwidth_gbs:,.0f} GB/s")
    console.print(styled(f"note: transformers' eager decode, kernel after kernel without a serving engine's CUDA "
                         f"graphs, fused kernels and batching, is far from one: vLLM's weight reads reach "
                         f"{b.serving_utilisation:.0%} of the bandwidth in the speed model's fit (docs/speed.md)",
                         "dim"))


def _print_recompute(console: Console, rows) -> None:
    """Per length: each way's median time per token over its p10-p90 range, and their ratio."""
    peaks = any(row.recompute_peak_bytes is not None for row in rows)
    table = Table(title=f"decode with the KV cache vs recomputing the prefix per token (batch 1; median over "
                        f"p10-p90 of {rows[0].steps} timed steps, after {rows[0].warmup_steps} untimed)",
                  title_justify="left")
    columns = ["tokens", "cached, per token", "recompute, per token", "speedup", "cache memory"]
    for column in columns + (["recompute peak"] if peaks else []):
        table.add_column(column, justify="right")
    for row in rows:
        cells = [f"{row.tokens:,}", _time_spread(row.cached), _time_spread(row.recompute),
                 f"{row.speedup:,.1f}x\n{row.speedup_low:,.1f}-{row.speedup_high:,.1f}x", format_bytes(row.cache_bytes)]
        if peaks:
            cells.append("-" if row.recompute_peak_bytes is None else format_bytes(row.recompute_peak_bytes))
        table.add_row(*cells)
    print_table(console, table)


def _time_spread(spread) -> str:
    """'43.5 ms' over '43.1-44.0': three significant figures, the range in the median's unit."""
    scale, unit = next(((s, u) for s, u in ((1, "s"), (1e-3, "ms")) if spread.median >= s), (1e-6, "\u00b5s"))
    return f"{_figures(spread.median / scale)} {unit}\n{_figures(spread.p10 / scale)}-{_figures(spread.p90 / scale)}"


def _figures(value: float) -> str:
    """Three significant figures (trailing zeros kept), whole numbers from 100 up."""
    return f"{value:,.0f}" if value >= 100 else f"{value:#.3g}".rstrip(".")


def _print_profile_memory(console: Console, result) -> None:
    """One column per phase, one row per figure (allocator and driver on a GPU, the process's RSS on the CPU)."""
    cuda = result.device.startswith("cuda")
    rows = (("allocated", "allocated"), ("max allocated", "max_allocated"), ("reserved", "reserved"),
            ("device used", "device_used"), ("process used", "process_used")) if cuda \
        else (("resident (RSS)", "rss"), ("peak RSS", "max_rss"))
    table = Table(title="memory after each phase" + ("" if cuda else " (process, CPU)"), title_justify="left")
    table.add_column("")
    for phase in result.memory:
        table.add_column(phase.phase, justify="right")
    for label, field in rows:
        table.add_row(label, *("-" if getattr(phase, field) is None else format_bytes(getattr(phase, field))
                               for phase in result.memory))
    print_table(console, table)
