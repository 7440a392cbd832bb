"""Generate the shipped JSON Schemas from the result types (`python -m kvplan.schemas`; `--check` exits 1 where a
shipped file differs). Each is pydantic's serialization schema of the type, with every key the output always
holds required; `estimate`'s merges the memory estimate's, the capacity's and the speed's, as its output does
(`kvplan.results.EstimateResult.model_dump`): the capacity's keys are required once "engine" is there, the speed's
once "isl" is, and the targets' once "speed_fit_users" is. A plan's and a table's speed keys are required where
"isl" is."""

import json
import sys

from pydantic import BaseModel, Field

from kvplan.schemas import NAMES, SCHEMA_VERSION, path
from kvplan.speed.targets import SpeedFigures, StatedError, Targets

DRAFT = "https://json-schema.org/draft/2020-12/schema"


def _all_required(schema: dict) -> dict:
    """Every property of the schema and of its definitions required: the types' outputs hold every field."""
    for part in (schema, *schema.get("$defs", {}).values()):
        if "properties" in part:
            part["required"] = list(part["properties"])
    return schema


def _head(name: str, description: str) -> dict:
    return {"$schema": DRAFT, "title": f"kvplan {name} --json (schema {SCHEMA_VERSION})", "description": description}


class SpeedKeys(SpeedFigures, Targets):
    """The keys an estimate's speed adds to its JSON (`kvplan.speed.targets.Speed.fields`): milliseconds and output
    tokens/s; the targets' keys and the last three only with a target."""

    isl: int = Field(description="prompt tokens per request (--isl)")
    osl: int = Field(description="output tokens per request (--osl)")
    speed_concurrency: int = Field(description="the requests the speed is at: --users, else --batch, else the "
                                   "users memory holds")
    tokens_per_s_per_user_bound: float
    tokens_per_s_per_gpu_bound: float
    decode_step_binding: str = Field(description="what bounds a decode step: memory bandwidth, compute or link")
    speed_efficiencies: dict[str, float]
    speed_flags: list[str] = Field(description="regimes the estimate is known to be poor in")
    speed_error: StatedError = Field(description="the estimate's error on the serving runs it was fitted on")
    speed_fit_users: int = Field(description="the users that meet the targets")
    speed_fit_limited_by: str
    max_concurrent_users_memory: int = Field(description="the users memory holds")


TARGETED = ("max_tpot_ms", "max_ttft_ms", "min_tokens_per_s_per_user", "speed_fit_users", "speed_fit_limited_by",
            "max_concurrent_users_memory")


def estimate_schema() -> dict:
    from kvplan.capacity import Capacity, Plan
    from kvplan.memory import Estimate
    from kvplan.results import left_out_of_capacity

    memory = _all_required(Estimate.model_json_schema(mode="serialization"))
    capacity = _all_required(Capacity.model_json_schema(mode="serialization"))
    version = Plan.model_json_schema(mode="serialization")["properties"]["schema_version"]
    optional = {"v_dtype"}
    sometimes = left_out_of_capacity(Capacity.model_construct(engine="sglang", sequence_limit=None, v_dtype=None))
    speed = _all_required(SpeedKeys.model_json_schema(mode="serialization"))
    properties = {"schema_version": version} | memory["properties"] | capacity["properties"] | speed["properties"]
    return _head("estimate", "The memory estimate of one model at one context, and, where a GPU, an engine, a "
                 "budget or an engine's flag is given, its capacity (the keys from engine on), and with --isl and "
                 "--osl on a GPU its speed (the keys from isl on). Sizes in bytes, per GPU unless named otherwise; "
                 "times in milliseconds.") | {
        "type": "object",
        "properties": properties,
        "required": ["schema_version", *(key for key in memory["required"] if key not in optional)],
        "dependentRequired": {"engine": [key for key in capacity["required"] if key not in sometimes],
                              "isl": [key for key in speed["required"] if key not in TARGETED],
                              "speed_fit_users": list(TARGETED)},
        "$defs": memory.get("$defs", {}) | capacity.get("$defs", {}) | speed.get("$defs", {}),
    }


def table_schema() -> dict:
    from kvplan.table_results import TableDocument

    schema = _all_required(TableDocument.model_json_schema(mode="serialization"))
    return _head("table", "A planning table: one row per model x context, or per model x context x GPU set. "
                 "Sizes in bytes.") | {key: value for key, value in schema.items() if key not in ("title",
                                                                                            "description")}


def _required_with(part: dict, plain: type[BaseModel], key: str) -> None:
    """Of a schema's properties, the plain type's required, the others once `key` is there: a plan's speed keys."""
    fields = set(plain.model_json_schema(mode="serialization")["properties"])
    part["required"] = [name for name in part["properties"] if name in fields]
    part["dependentRequired"] = {key: [name for name in part["properties"] if name not in fields]}


def plan_schema() -> dict:
    from kvplan.capacity import Plan, PlanRow
    from kvplan.speed.targets import SpeedPlan

    schema = _all_required(SpeedPlan.model_json_schema(mode="serialization"))
    _required_with(schema, Plan, "isl")
    _required_with(schema["$defs"]["SpeedPlanRow"], PlanRow, "decode_step_ms")
    return _head("plan", "The configurations that serve a number of users at a context on a GPU type, fewest GPUs "
                 "first, and with --isl and --osl the speed of each (the keys from isl on, and in each row from "
                 "decode_step_ms_bound on). Sizes in bytes, per GPU unless named otherwise; times in "
                 "milliseconds.") | {key: value for key, value in schema.items() if key not in ("title", "description")}


def generate() -> dict[str, str]:
    """Each schema's file text, by name."""
    schemas = {"estimate": estimate_schema(), "table": table_schema(), "plan": plan_schema()}
    return {name: json.dumps(schemas[name], indent=2) + "\n" for name in NAMES}


def main(args: list[str]) -> int:
    texts = generate()
    if args == ["--check"]:
        stale = [str(path(name)) for name, text in texts.items()
                 if not path(name).exists() or path(name).read_text(encoding="utf-8") != text]
        if stale:
            print(f"stale schemas (run: python -m kvplan.schemas): {', '.join(stale)}", file=sys.stderr)
            return 1
        return 0
    if args:
        print("usage: python -m kvplan.schemas [--check]", file=sys.stderr)
        return 2
    for name, text in texts.items():
        path(name).write_text(text, encoding="utf-8")
        print(f"wrote {path(name)}")
    return 0
