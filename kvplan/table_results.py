"""`kvplan.table`'s result: the planning table (`kvplan.tables.Table`), rendered in any of the command's formats,
written as --out writes it, and, for a script, its rows as typed records. Its JSON is `kvplan table --format json`
(`TableDocument`, whose schema is shipped: `kvplan.schemas`). The command renders the table without building the
records: they are made on first use (`rows`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property

from pydantic import BaseModel, ConfigDict, Field

from kvplan.notebook import table_html
from kvplan.schemas import SCHEMA_VERSION, version_field
from kvplan.tables import Table, document, failure_line, parse_format, render, write


class TableRow(BaseModel):
    """One model at one context: `kvplan table`'s JSON and CSV columns (docs/tables.md). Sizes in bytes."""

    model_config = ConfigDict(defer_build=True)

    model: str
    ctx: int
    batch: int
    kv_dtype: str
    weights_dtype: str
    kv_bytes_per_token: int
    kv_bytes_per_sequence: int
    weights_bytes: int
    total_bytes: int = Field(description="weights + KV for batch sequences")
    max_context: int | None = Field(description="the model's maximum context, where its config states one")
    beyond_max_context: bool


class TableGpuRow(TableRow):
    """One model at one context on one GPU set (a table with GPUs)."""

    engine: str
    engine_version: str
    gpu: str = Field(description="the GPU set, as --gpu names it: NVIDIA H100 SXM, 4 x NVIDIA H100 SXM")
    gpu_memory_bytes: int = Field(description="one GPU's")
    kv_budget_bytes: int | None = Field(description="per GPU; null where nothing was planned")
    engine_kv_bytes_per_user: int | None
    max_users: int | None = Field(description="users served in steady decode; null where the model keeps no "
                                  "per-sequence cache or the deployment was not planned")
    max_users_bound: str | None = Field(description="memory, or sequence_limit (the engine's limit on running "
                                        "requests)")
    not_planned: str | None = Field(description="why the engine cannot plan this model on this GPU set")


class TableSpeedRow(TableGpuRow):
    """With --isl and --osl: the speed of requests of isl + osl tokens at `speed_concurrency` users (by default the
    users memory holds in the cell), in ms and output tokens/s; null where no user fits or the speed model cannot
    estimate it (`speed_not_estimated` says why)."""

    isl: int
    osl: int
    speed_concurrency: int | None
    decode_step_ms_bound: float | None
    decode_step_ms: float | None = Field(description="the estimated time per output token (TPOT)")
    ttft_ms_bound: float | None
    ttft_ms: float | None
    tokens_per_s_per_user: float | None
    tokens_per_s_per_gpu: float | None
    speed_not_estimated: str | None


class TableDocument(BaseModel):
    """`kvplan table --format json`: one record per model x ctx (x GPU set), and the models left out."""

    model_config = ConfigDict(defer_build=True)

    schema_version: str = version_field()
    rows: list[TableSpeedRow | TableGpuRow | TableRow] = Field(description="one per model x ctx, or per model x "
                                                                "ctx x GPU set")
    failures: list[str] = Field(description="the models left out (keep_going), one message each")


@dataclass(frozen=True)
class TableResult:
    """`kvplan.table`: the table (`grid`) of the models asked (`asked` of them, read from `input_files`, which an
    --out never replaces)."""

    grid: Table
    asked: int
    input_files: list[str] = field(default_factory=list)
    schema_version: str = SCHEMA_VERSION

    @property
    def failures(self) -> list[str]:
        """The models left out (keep_going), one message each."""
        return self.grid.failures

    @cached_property
    def rows(self) -> list[TableSpeedRow | TableGpuRow | TableRow]:
        """The records of the JSON output, typed."""
        return TableDocument.model_validate(self.model_dump()).rows

    def model_dump(self) -> dict:
        return document(self.grid)

    def model_dump_json(self, *, indent: int | None = None) -> str:
        return json.dumps(self.model_dump(), indent=indent)

    def failure_line(self) -> str | None:
        """The one-line error naming the models left out (keep_going), or None."""
        return failure_line(self.grid, self.asked) if self.failures else None

    def render(self, format: str = "markdown", *, pivot: bool = False, metric: str | None = None) -> str:
        """The table as `kvplan table --format FORMAT` prints it to a file: rich (drawn without colour),
        markdown, csv or json; `pivot` and `metric` as --pivot and --metric."""
        return render(self.grid, parse_format(format, None), pivot=pivot, metric=metric)

    def write(self, out: str, format: str | None = None, *, pivot: bool = False, metric: str | None = None,
              force: bool = False) -> str:
        """`kvplan table --out OUT`: the format from `format`, else from OUT's extension; the file replaced whole,
        never one of the table's inputs (`kvplan.output.write_output`; `force` as --force). Returns what the
        command says ("wrote OUT")."""
        text = render(self.grid, parse_format(format, out), pivot=pivot, metric=metric)
        return write(out, text, self.input_files, force)

    def _repr_markdown_(self) -> str:
        return self.render("markdown")

    def _repr_html_(self) -> str:
        return table_html(self.grid)
