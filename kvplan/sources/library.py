"""The bundled model library: `model_specs/library.json` indexes config.json copies kept as data (JSON, which the
standard library reads at once, rather than YAML: the index is read on every planning command).

Names resolve case-insensitively through each entry's id and aliases; an unknown name gets the closest ones.
Only the index is read to resolve a name, and only the one config file of the model asked for.
"""

import difflib
import json
import re
from functools import cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from kvplan.errors import KvplanError


class LibraryEntry(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    id: str
    file: str
    aliases: list[str] = []
    provenance: str
    source: str
    revision: str
    notes: str = ""


@cache
def library_dir() -> Path:
    """model_specs/ inside the installed package (wheel), or beside it in a source checkout."""
    here = Path(__file__).resolve().parent.parent
    for candidate in (here / "model_specs", here.parent / "model_specs"):
        if (candidate / "library.json").is_file():
            return candidate
    raise KvplanError("the bundled model library (model_specs/library.json) is missing from this install")


@cache
def entries() -> tuple[LibraryEntry, ...]:
    path = library_dir() / "library.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return tuple(LibraryEntry(**item) for item in data["models"])
    except (ValueError, ValidationError, KeyError, TypeError) as err:
        raise KvplanError(f"{path}: the bundled library index is broken: {err}".splitlines()[0]) from None


@cache
def _by_name() -> dict[str, LibraryEntry]:
    names = {}
    for entry in entries():
        for name in (entry.id, *entry.aliases):
            names[name.lower()] = entry
    return names


def find(name: str) -> LibraryEntry | None:
    """The entry whose id or alias is `name` (any case), or None."""
    return _by_name().get(name.strip().lower())


def suggestions(name: str, limit: int = 3) -> list[str]:
    """Closest library ids to a name that did not resolve, best first: names that hold the one given, or that it
    holds, as whole words (`Llama-3.2-1B` in `Llama-3.2-1B-Instruct`, `Qwen3-8B` in `Qwen3-8B-Instruct`), then the
    others alike enough (difflib's ratio, of the names without their organisation or of the whole names)."""
    wanted = name.strip().lower()
    tail = wanted.rsplit("/", 1)[-1]
    ranked = []
    for other, entry in _by_name().items():
        other_tail = other.rsplit("/", 1)[-1]
        nested = bool(tail) and (_holds(other_tail, tail) or _holds(tail, other_tail))
        alike = max(difflib.SequenceMatcher(None, tail, other_tail).ratio(),
                    difflib.SequenceMatcher(None, wanted, other).ratio())
        if nested or alike >= 0.5:
            ranked.append((not nested, -alike, entry.id))
    return list(dict.fromkeys(entry_id for *_, entry_id in sorted(ranked)))[:limit]


def _holds(name: str, part: str) -> bool:
    """Whether `part` is in `name` as whole words (bounded by the name's ends or by - _ . /)."""
    return re.search(rf"(?:^|[-_./]){re.escape(part)}(?:$|[-_./])", name) is not None


def config_path(entry: LibraryEntry) -> Path:
    return library_dir() / entry.file
