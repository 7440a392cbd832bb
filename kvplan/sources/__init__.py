"""Sources turn what the user names into a ModelSpec: a local file, the bundled library, or the Hugging Face
Hub."""

import re
from pathlib import Path

from kvplan.errors import KvplanError
from kvplan.model import ModelSpec
from kvplan.sources import library
from kvplan.sources.hf_config import read_config_file
from kvplan.text import brief

_REPO_ID = re.compile(r"^\b[\w.-]+\b/\b[\w.-]{1,96}\b$")
_GGUF_TAG = re.compile(r"^(?P<repo>[^:\s]+/[^:\s]+):(?P<tag>[\w.+-]+)$")  # org/name:Q4_K_M, org/name:file.gguf
_FILE_SUFFIXES = (".json", ".yaml", ".yml", ".safetensors", ".gguf", ".bin")


def is_repo_id(name: str) -> bool:
    """Whether `name` has the shape of a Hub model id, `org/name` (huggingface_hub's repo id rules), and not
    that of a file path."""
    name = name.strip()
    return (bool(_REPO_ID.match(name)) and "--" not in name and ".." not in name
            and not name.lower().endswith(_FILE_SUFFIXES))


def load_model(name: str, revision: str | None = None, token: str | None = None,
               gguf_file: str | None = None, eagle_head: bool = False) -> ModelSpec:
    """`_load_model`, refusing an EAGLE draft head (`ModelSpec.eagle`) unless `eagle_head`: it is a draft, read
    for --draft-model, not a model kvplan plans for."""
    spec = _load_model(name, revision, token, gguf_file)
    if spec.eagle is not None and not eagle_head:
        raise KvplanError(f"{brief(name)} is an EAGLE draft head ({spec.eagle.architecture}), not a model to serve: "
                          "give it as --draft-model with --speculative-method eagle or eagle3")
    return spec


def _load_model(name: str, revision: str | None = None, token: str | None = None,
                gguf_file: str | None = None) -> ModelSpec:
    """Resolve `--model`: an existing local path (config.json, a directory, a YAML spec, a GGUF file), then the
    bundled library, then the Hub for names shaped `org/name` (docs/hub.md), or `org/name:TAG` and `gguf_file`
    for a GGUF file in a Hub repo (its header alone, by range requests). `revision` asks for a Hub revision, so a
    library name with one is read from the Hub; `token` is for gated and private repos (default: HF_TOKEN or
    the stored login, as huggingface_hub finds it). Nothing Hub-related is imported before the Hub is needed."""
    token = clean_token(token)
    path = Path(name).expanduser()
    local = _on_disk(path)
    if gguf_file is not None or (_GGUF_TAG.match(name.strip()) and not local):
        return _hub_gguf(name.strip(), revision, token, gguf_file)
    if local:
        if revision:
            raise KvplanError(f"--revision is for Hub repos; {name} is a local path")
        if path.suffix.lower() == ".gguf":
            from kvplan.sources.gguf_model import load_file

            return load_file(path)
        if path.suffix.lower() in (".yaml", ".yml"):
            from kvplan.sources.yaml_spec import read_yaml_spec  # lazy: spares library lookups its pydantic types

            return read_yaml_spec(path)
        spec = read_config_file(path)
        if path.is_dir():
            spec = _with_local_checkpoint(spec, path)
        return spec
    entry = library.find(name)
    if entry is not None and not revision:
        source = (f"bundled library: {entry.file} ({entry.provenance} config.json, source revision "
                  f"{entry.revision[:12]})")
        return read_config_file(library.config_path(entry), name=entry.id, source=source)
    repo_id = entry.id if entry is not None else name.strip()
    if is_repo_id(repo_id):
        from kvplan.sources import hub

        return hub.load(repo_id, revision, token, closest=tuple(library.suggestions(name)))
    if revision:
        raise KvplanError(f"--revision is for Hub repos: {name!r} is not a Hub id (org/name)")
    close = library.suggestions(name)
    hint = f"; closest: {', '.join(close)}" if close else ""
    raise KvplanError(f"unknown model {name!r}: not a local file, not in the bundled library, and not a Hub id "
                      f"(org/name){hint} (`kvplan models` lists the library)")


def _on_disk(path: Path) -> bool:
    """Whether `path` names something on disk; a name the system cannot look up (a part longer than its 255 bytes, a
    folder kvplan may not enter) is one line saying so, where Python 3.11's Path.exists raised an OSError."""
    try:
        path.stat()
    except (FileNotFoundError, NotADirectoryError, ValueError):  # ValueError: a NUL byte, from a model list
        return False
    except OSError as err:
        raise KvplanError(f"{brief(str(path))}: cannot look it up ({err.strerror or err})") from None
    return True


def _hub_gguf(name: str, revision: str | None, token: str | None, gguf_file: str | None) -> ModelSpec:
    """A GGUF file in a Hub repo: `org/name --gguf-file F`, `org/name:F.gguf`, or `org/name:TAG` for the file
    whose name carries the quantisation tag."""
    tagged = _GGUF_TAG.match(name)
    repo_id, tag = (tagged["repo"], tagged["tag"]) if tagged else (name, None)
    if gguf_file is not None and tag is not None:
        raise KvplanError(f"{name} names a GGUF file already: leave --gguf-file out, or the :{tag}")
    if gguf_file is not None and not gguf_file.strip():
        raise KvplanError("--gguf-file is empty: give the name of a .gguf file in the repo")
    if gguf_file is not None and _leaves_the_repo(gguf_file.strip()):
        raise KvplanError(f"--gguf-file {brief(gguf_file)} is not a path inside the repo (it starts at / or goes up "
                          "with ..): it names a file of the Hub repo; a local GGUF file is --model path/to/model.gguf")
    if not is_repo_id(repo_id):
        raise KvplanError(f"{brief(name)}: --gguf-file and :TAG are for Hub repos, org/name (a local GGUF file is "
                          "--model path/to/model.gguf)")
    if tag is not None and tag.lower().endswith(".gguf"):
        gguf_file, tag = tag, None
    from kvplan.sources import hub

    return hub.load_gguf(repo_id, revision, token, gguf_file=gguf_file, tag=tag)


def _leaves_the_repo(name: str) -> bool:
    """Whether a file name given for a Hub repo is absolute or climbs out of it with `..` (huggingface_hub refuses
    both, in a ValueError that reads as the Hub's)."""
    return name.startswith(("/", "\\")) or ".." in re.split(r"[/\\]", name)


def clean_token(token: str | None, what: str = "--token") -> str | None:
    """A --token (or HF_TOKEN: `what`) as huggingface_hub cleans HF_TOKEN: surrounding whitespace stripped (a
    token file saved with CRLF line endings, read with `$(cat file)`); any other control or space character
    refused. The token itself is never part of a message."""
    if token is None:
        return None
    token = token.strip()
    if not token or not token.isascii() or not token.isprintable() or " " in token:
        raise KvplanError(f"{what} is empty or holds a space, a control or a non-ASCII character: a Hugging Face "
                          "token is one word (hf_...); check the file or variable it came from")
    return token


def _with_local_checkpoint(spec: ModelSpec, directory: Path) -> ModelSpec:
    """A checkpoint directory with its safetensors files: weights from their headers."""
    from kvplan.sources import safetensors as st

    try:
        checkpoint = st.from_directory(directory, f"safetensors headers in {directory}")
    except st.HeaderError as err:
        note = f"safetensors header unreadable ({err}): weights derived from the config's parameter counts"
        return spec.model_copy(update={"notes": (*spec.notes, note)})
    return spec if checkpoint is None else spec.model_copy(update={"checkpoint": checkpoint})
