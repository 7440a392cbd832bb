"""The results of kvplan's public functions (`kvplan.api`), as a script or a notebook gets them. Each one's JSON
(`model_dump_json`) is the command's `--json` output, with "schema_version" (`kvplan.schemas`), and each renders
itself in a notebook (`_repr_markdown_`, `_repr_html_`) as the command prints it. `kvplan.plan` returns
`kvplan.capacity.Plan` itself.

Presentation and packaging only: every number comes from `kvplan.memory`, `kvplan.capacity` and `kvplan.tables`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from kvplan.errors import KvplanError
from kvplan.memory import Estimate
from kvplan.model import ModelSpec
from kvplan.notebook import ShownAsReport
from kvplan.schemas import SCHEMA_VERSION, version_field

if TYPE_CHECKING:  # a plain estimate never imports the capacity package (25 ms of imports)
    from kvplan.capacity import Capacity
    from kvplan.tables import Table


@dataclass(frozen=True)
class EstimateResult(ShownAsReport):
    """`kvplan.estimate`: the model read (`spec`), its memory estimate (`memory`), and, where a GPU, an engine, a
    budget or an engine's flag was given, its capacity (`capacity`, else None).

    Its JSON is `kvplan estimate --json`: one object, the estimate's keys and then the capacity's, where both
    have a key (ctx, the dtypes, notes) the capacity's. Every key of that object is an attribute too
    (`result.kv_bytes_per_sequence`, `result.max_concurrent_users`), read from the same place."""

    spec: ModelSpec
    memory: Estimate
    capacity: Capacity | None = None
    schema_version: str = field(default=SCHEMA_VERSION)

    def __getattr__(self, name: str):
        """A key of the JSON output: the capacity's, else the estimate's."""
        for part in (self.__dict__.get("capacity"), self.__dict__.get("memory")):
            if part is not None and name in type(part).model_fields:
                return getattr(part, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def fits(self) -> bool:
        """Whether the capacity asked for fits (True where none was planned): `kvplan estimate` exits 1 if not."""
        return self.capacity is None or self.capacity.fits

    def model_dump(self) -> dict:
        """The `--json` object: the estimate's v_dtype only where it differs from kv_dtype; the capacity's keys
        where they apply (sequence_limit where the engine has one, vllm_* under vLLM, the speculative-decoding
        and LoRA keys where they are used: `Capacity.unused_extras`)."""
        memory, cap = self.memory, self.capacity
        data = {"schema_version": self.schema_version}
        data |= memory.model_dump(exclude=set() if memory.v_dtype else {"v_dtype"})
        if cap is not None:
            data |= cap.model_dump(exclude=left_out_of_capacity(cap))
        return data

    def model_dump_json(self, *, indent: int | None = None) -> str:
        return json.dumps(self.model_dump(), indent=indent)

    def report(self, width: int = 80) -> str:
        """What `kvplan estimate` prints, as text `width` columns wide."""
        from kvplan.report import print_estimate_result, text_of

        return text_of(lambda console: print_estimate_result(console, self), width)


def left_out_of_capacity(cap: Capacity) -> set[str]:
    """The capacity's keys an estimate's JSON leaves out: sequence_limit and v_dtype where unset, vllm_* under the
    other engines, the speculative-decoding and LoRA keys of a deployment without them."""
    unset = {key for key in ("sequence_limit", "v_dtype") if not getattr(cap, key)} | cap.unused_extras()
    if cap.engine != "vllm":
        unset |= {key for key in type(cap).model_fields if key.startswith("vllm_")}
    return unset


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


class TableResult(BaseModel):
    """`kvplan.table`: its JSON is `kvplan table --format json`; `render` and `write` give the other formats."""

    model_config = ConfigDict(defer_build=True)

    schema_version: str = version_field()
    rows: list[TableGpuRow | TableRow] = Field(description="one per model x ctx, or per model x ctx x GPU set")
    failures: list[str] = Field(description="the models left out (keep_going), one message each")
    _grid: Table | None = PrivateAttr(None)
    _asked: int = PrivateAttr(0)
    _inputs: list[str] = PrivateAttr(default_factory=list)

    @classmethod
    def of(cls, grid: Table, names: list[str], inputs: list[str]) -> TableResult:
        """The result of a table built (`kvplan.tables.build`) for the models `names`, read from `inputs` (the
        files an --out must not replace)."""
        from kvplan.tables import document

        result = cls.model_validate(document(grid))
        result._grid, result._asked, result._inputs = grid, len(names), inputs
        return result

    @property
    def grid(self) -> Table:
        """The table as `kvplan.tables` renders and `kvplan.plot` draws it."""
        if self._grid is None:
            raise KvplanError("this table was read back from JSON: only kvplan.table's own result renders")
        return self._grid

    @property
    def input_files(self) -> list[str]:
        return self._inputs

    def failure_line(self) -> str | None:
        """The one-line error naming the models left out (keep_going), or None."""
        from kvplan.tables import failure_line

        return failure_line(self.grid, self._asked) if self.failures else None

    def render(self, format: str = "markdown", *, pivot: bool = False, metric: str | None = None) -> str:
        """The table as `kvplan table --format FORMAT` prints it to a file: rich (drawn without colour),
        markdown, csv or json; `pivot` and `metric` as --pivot and --metric."""
        from kvplan import tables

        return tables.render(self.grid, tables.parse_format(format, None), pivot=pivot, metric=metric)

    def write(self, out: str, format: str | None = None, *, pivot: bool = False, metric: str | None = None,
              force: bool = False) -> str:
        """`kvplan table --out OUT`: the format from `format`, else from OUT's extension; the file replaced whole,
        never one of the table's inputs (`kvplan.output.write_output`; `force` as --force). Returns what the
        command says ("wrote OUT")."""
        from kvplan import tables

        text = tables.render(self.grid, tables.parse_format(format, out), pivot=pivot, metric=metric)
        return tables.write(out, text, self._inputs, force)

    def _repr_markdown_(self) -> str:
        return self.render("markdown")

    def _repr_html_(self) -> str:
        from kvplan.notebook import table_html

        return table_html(self.grid)
