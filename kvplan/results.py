"""The results of kvplan's public functions (`kvplan.api`), as a script or a notebook gets them. Each one's JSON
(`model_dump_json`) is the command's `--json` output, with "schema_version" (`kvplan.schemas`), and each renders
itself in a notebook (`_repr_markdown_`, `_repr_html_`) as the command prints it. Here `kvplan.estimate`'s;
`kvplan.table`'s is in `kvplan.table_results`, and `kvplan.plan` returns `kvplan.capacity.Plan` itself.

Presentation and packaging only: every number comes from `kvplan.memory`, `kvplan.capacity` and `kvplan.tables`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvplan.memory import Estimate
from kvplan.model import ModelSpec
from kvplan.notebook import ShownAsReport
from kvplan.schemas import SCHEMA_VERSION

if TYPE_CHECKING:  # a plain estimate never imports the capacity package (25 ms of imports)
    from kvplan.capacity import Capacity


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
