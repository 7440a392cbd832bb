"""The results of kvplan's public functions (`kvplan.api`), as a script or a notebook gets them. Each one's JSON
(`model_dump_json`) is the command's `--json` output, with "schema_version" (`kvplan.schemas`), and each renders
itself in a notebook (`_repr_markdown_`, `_repr_html_`) as the command prints it. Here `kvplan.estimate`'s;
`kvplan.table`'s is in `kvplan.table_results`, and `kvplan.plan` returns `kvplan.capacity.Plan` itself.

Presentation and packaging only: every number comes from `kvplan.memory`, `kvplan.capacity`, `kvplan.speed` and
`kvplan.tables`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

from kvplan.memory import Estimate
from kvplan.model import ModelSpec
from kvplan.notebook import ShownAsReport
from kvplan.schemas import SCHEMA_VERSION

if TYPE_CHECKING:  # a plain estimate never imports the capacity package (25 ms of imports)
    from kvplan.capacity import Capacity
    from kvplan.speed.targets import Speed


@dataclass(frozen=True)
class EstimateResult(ShownAsReport):
    """`kvplan.estimate`: the model read (`spec`), its memory estimate (`memory`); where a GPU, an engine, a budget
    or an engine's flag was given, its capacity (`capacity`, what memory holds, else None); with requests of isl +
    osl tokens on a GPU, their speed (`speed`, `kvplan.speed.targets.Speed`, else None); and the notes of an
    estimate without a capacity (`notes`: why there is no speed estimate).

    Its JSON is `kvplan estimate --json`: one object, the estimate's keys, then the capacity's as the speed targets
    leave it (`served`), where both have a key (ctx, the dtypes, notes) the capacity's, then the speed's. Every key
    of that object but the speed's is an attribute too (`result.kv_bytes_per_sequence`,
    `result.max_concurrent_users`), read from the same place."""

    spec: ModelSpec
    memory: Estimate
    capacity: Capacity | None = None
    speed: Speed | None = None
    notes: list[str] = field(default_factory=list)
    schema_version: str = field(default=SCHEMA_VERSION)

    def __getattr__(self, name: str):
        """A key of the JSON output: the capacity's, else the estimate's."""
        if name.startswith("_"):
            raise AttributeError(name)
        for part in (self.served, self.__dict__.get("memory")):
            if part is not None and name in type(part).model_fields:
                return getattr(part, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @cached_property
    def served(self) -> Capacity | None:
        """The capacity as the speed targets leave it (`kvplan.speed.targets.judged`): the users served are the
        fewer of what memory holds and what meets the targets; without targets, `capacity`."""
        cap, speed = self.__dict__.get("capacity"), self.__dict__.get("speed")
        if cap is None or speed is None or speed.targets is None:
            return cap
        from kvplan.speed.targets import judged

        return judged(cap, speed)

    @property
    def fits(self) -> bool:
        """Whether the users asked fit, in memory and within the speed targets (True where no capacity was
        planned): `kvplan estimate` exits 1 if not."""
        return self.served is None or self.served.fits

    def model_dump(self) -> dict:
        """The `--json` object: the estimate's v_dtype only where it differs from kv_dtype; the capacity's keys
        where they apply (sequence_limit where the engine has one, vllm_* under vLLM, the speculative-decoding
        and LoRA keys where they are used: `Capacity.unused_extras`); the speed's keys (`Speed.fields`)."""
        memory, cap = self.memory, self.capacity
        data = {"schema_version": self.schema_version}
        data |= memory.model_dump(exclude=set() if memory.v_dtype else {"v_dtype"})
        data["notes"] += self.notes
        if cap is not None:
            data |= self.served.model_dump(exclude=left_out_of_capacity(cap))
        if self.speed is not None:
            data |= self.speed.fields()
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
