"""The JSON Schemas of kvplan's JSON output (`kvplan estimate|table|plan --json`, and the results of
`kvplan.estimate`, `kvplan.table` and `kvplan.plan`), shipped as files beside this module and printed by
`kvplan schema NAME`. They are generated from the result types (`kvplan.results`, `kvplan.capacity.Plan`) by

    python -m kvplan.schemas            # rewrite them
    python -m kvplan.schemas --check    # exit 1, naming them, if a shipped file is not what the types give

Every output carries SCHEMA_VERSION as "schema_version": MAJOR.MINOR. A minor release of the schema only adds keys
(or values a key may take that a reader can ignore); a major one may remove or rename a key, or change its type,
unit or meaning (docs/api.md).
"""

from pathlib import Path

from kvplan.errors import KvplanError

SCHEMA_VERSION = "1.1"
NAMES = ("estimate", "table", "plan")
DIRECTORY = Path(__file__).resolve().parent


def version_field():
    """The "schema_version" field of a result type: always SCHEMA_VERSION, which its schema states as a constant."""
    from pydantic import Field

    return Field(SCHEMA_VERSION, description="MAJOR.MINOR of this output's schema (docs/api.md)",
                 json_schema_extra={"const": SCHEMA_VERSION})


def path(name: str) -> Path:
    """The shipped schema file of output `name` (one of NAMES)."""
    if name not in NAMES:
        raise KvplanError(f"no schema named {name!r}: choose {', '.join(NAMES)}")
    return DIRECTORY / f"{name}.json"


def text(name: str) -> str:
    """The schema of output `name`, as shipped (JSON text)."""
    return path(name).read_text(encoding="utf-8")
