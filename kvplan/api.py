"""kvplan's public functions, re-exported by the package (`kvplan.estimate`, ...; docs/api.md). The command line
(`kvplan.cli`) parses flags into these calls and prints their results: each keyword is the flag of the same name
(snake_case), each result's `model_dump_json()` is the command's `--json`, and each error is the `KvplanError`
whose message the command prints on its one error line."""

from kvplan.errors import KvplanError
from kvplan.model import ModelSpec


def load_model(source: str, *, revision: str | None = None, token: str | None = None,
               gguf_file: str | None = None) -> ModelSpec:
    """The model `source` names, read as `--model` reads it: a library name or alias, a config.json or a directory
    holding one, a YAML spec, a GGUF file, or a Hub id (`org/name`, `org/name:Q4_K_M`; `revision` and `token` for
    the Hub, `gguf_file` for a GGUF file in a Hub repo). Nothing Hub-related is imported unless the Hub is asked."""
    from kvplan.sources import load_model as load

    if not isinstance(source, str):
        raise KvplanError(f"--model is a name or a path (a str), got {type(source).__name__}")
    return load(source, revision, token, gguf_file)


def schema(name: str) -> dict:
    """The JSON Schema of `name`'s output (estimate, table or plan), as `kvplan schema NAME` prints it."""
    import json

    from kvplan.schemas import text

    return json.loads(text(name))
