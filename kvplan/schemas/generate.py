"""Generate the shipped JSON Schemas from the result types (`python -m kvplan.schemas`; `--check` exits 1 where a
shipped file differs). Each is pydantic's serialization schema of the type, with every key the output always
holds required; `estimate`'s merges the memory estimate's and the capacity's, as its output does
(`kvplan.results.EstimateResult.model_dump`): the capacity's keys are required once "engine" is there."""

import json
import sys

from kvplan.schemas import NAMES, SCHEMA_VERSION, path

DRAFT = "https://json-schema.org/draft/2020-12/schema"


def _all_required(schema: dict) -> dict:
    """Every property of the schema and of its definitions required: the types' outputs hold every field."""
    for part in (schema, *schema.get("$defs", {}).values()):
        if "properties" in part:
            part["required"] = list(part["properties"])
    return schema


def _head(name: str, description: str) -> dict:
    return {"$schema": DRAFT, "title": f"kvplan {name} --json (schema {SCHEMA_VERSION})", "description": description}


def estimate_schema() -> dict:
    from kvplan.capacity import Capacity, Plan
    from kvplan.memory import Estimate
    from kvplan.results import left_out_of_capacity

    memory = _all_required(Estimate.model_json_schema(mode="serialization"))
    capacity = _all_required(Capacity.model_json_schema(mode="serialization"))
    version = Plan.model_json_schema(mode="serialization")["properties"]["schema_version"]
    optional = {"v_dtype"}
    sometimes = left_out_of_capacity(Capacity.model_construct(engine="sglang", sequence_limit=None, v_dtype=None))
    properties = {"schema_version": version} | memory["properties"] | capacity["properties"]
    return _head("estimate", "The memory estimate of one model at one context, and, where a GPU, an engine, a "
                 "budget or an engine's flag is given, its capacity (the keys from engine on). Sizes in bytes, "
                 "per GPU unless named otherwise.") | {
        "type": "object",
        "properties": properties,
        "required": ["schema_version", *(key for key in memory["required"] if key not in optional)],
        "dependentRequired": {"engine": [key for key in capacity["required"] if key not in sometimes]},
        "$defs": memory.get("$defs", {}) | capacity.get("$defs", {}),
    }


def table_schema() -> dict:
    from kvplan.table_results import TableDocument

    schema = _all_required(TableDocument.model_json_schema(mode="serialization"))
    return _head("table", "A planning table: one row per model x context, or per model x context x GPU set. "
                 "Sizes in bytes.") | {key: value for key, value in schema.items() if key not in ("title",
                                                                                            "description")}


def plan_schema() -> dict:
    from kvplan.capacity import Plan

    schema = _all_required(Plan.model_json_schema(mode="serialization"))
    return _head("plan", "The configurations that serve a number of users at a context on a GPU type, fewest GPUs "
                 "first. Sizes in bytes, per GPU unless named otherwise.") | {
        key: value for key, value in schema.items() if key not in ("title", "description")}


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
