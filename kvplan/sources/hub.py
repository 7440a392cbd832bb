"""The Hugging Face Hub: a repo's config.json and its safetensors headers, through huggingface_hub.

This module is imported only for a name that is neither a local path nor in the bundled library, and it
imports huggingface_hub only when it runs, so the other paths never pay for it. What it does for `org/name`:

1. online, `HfApi.model_info` (one request, bounded by HF_HUB_ETAG_TIMEOUT, no retries) resolves the revision
   to a commit and lists the repo's files; the Hub's answers for a missing repo, a bad revision or a refused
   token come from it;
2. `hf_hub_download(config.json)` fetches the config into the Hugging Face cache as huggingface_hub always
   does (HF_HOME / HF_HUB_CACHE, refs/<revision>, snapshots/<commit>/), or finds it there when HF_HUB_OFFLINE
   is set; the commit kvplan reports is the snapshot the file sits in; a TensorRT Model Optimizer checkpoint's
   hf_quant_config.json too, where the repo lists one and config.json states no quantization_config;
3. the weights: the safetensors headers of that commit (`get_safetensors_metadata`: model.safetensors, or each
   shard of model.safetensors.index.json, by HTTP range requests, never the tensor data), or the same files if
   they are already in the snapshot; the element counts by dtype are kept in huggingface_hub's assets cache
   (HF_HOME/assets/kvplan/...) by commit, so a commit is read once. Without them weights are derived from
   the config, with a note.

For a GGUF file (`org/name:Q4_K_M`, `--gguf-file`, `load_gguf`): `model_info` lists the repo's files, the file
is chosen by name or quantisation tag, and its header alone is read by HTTP range requests that grow until it is
whole (`kvplan.sources.gguf.read_header`), or from the cache when the file is there; a split model's parts each.

The config is read as JSON data and nothing else: no remote code is imported or run, `auto_map` is ignored.
Every failure becomes a KvplanError that says what to do (docs/hub.md has the table).
"""

from __future__ import annotations

import json
import logging
import os
import re
import stat
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

from kvplan import __version__
from kvplan.errors import KvplanError
from kvplan.model import CheckpointTensors, ModelSpec
from kvplan.sources import safetensors as st
from kvplan.sources.hf_config import model_from_config, parse_json, read_text
from kvplan.sources.hf_config.fields import MAX_TEXT_FILE
from kvplan.sources.hf_config.reader import MODELOPT_SIDECAR, with_quant_sidecar
from kvplan.text import brief, plain, shorten

_ASSETS_FORMAT = 1
CALL_DEADLINE_TIMEOUTS = 3  # a call's deadline, in per-read timeouts: a request, a redirect, a slow answer
HEADER_DEADLINE_CALLS = 4  # the safetensors headers: one range request per shard, so a longer deadline
GGUF_DEADLINE_CALLS = 8  # a GGUF header: a few range requests that grow, several MiB in all
MAX_TIMEOUT = 3600  # seconds, HF_HUB_ETAG_TIMEOUT and HF_HUB_DOWNLOAD_TIMEOUT: an hour a read is patience enough
MAX_TOKEN_FILE = 64 * 2**10  # a token file holds one token (hf_ and 34 characters), a few hundred bytes at most
T = TypeVar("T")
_COMMIT = re.compile(r"[0-9a-f]{40}")


def load(
    repo_id: str, revision: str | None = None, token: str | None = None, closest: tuple[str, ...] = ()
) -> ModelSpec:
    """Read `repo_id` at `revision` (default main) from the Hub or the Hugging Face cache.

    `closest`: bundled library names to mention when the repo does not exist."""
    repo_id = repo_id.strip()
    return _guarded(repo_id, revision, closest, bool(token),
                    lambda hub: _load(hub, repo_id, revision or None, token or None))


def _guarded(repo_id: str, revision: str | None, closest: tuple[str, ...], token_given: bool,
             call: Callable[[_Hub], T]) -> T:
    """`call` with huggingface_hub started and quiet, any failure of the Hub's made one line (`explain`);
    `token_given`: a --token replaces HF_TOKEN and the token file, which are then not checked."""
    _check_environment(token_given)
    try:
        hub = _Hub()
    except Exception as err:  # huggingface_hub reads its environment variables on import
        raise KvplanError(f"huggingface_hub cannot start ({_first_line(err)}): check the HF_* environment "
                          "variables") from None
    if not token_given:
        _check_token_file(Path(hub.constants.HF_TOKEN_PATH))
    with _quiet():
        try:
            return call(hub)
        except KvplanError:
            raise
        except Exception as err:
            message = explain(hub, err, repo_id, revision, closest)
            if message is None:
                raise
            # a typo of a bundled name read as a Hub id; not where the Hub refused a token or gated the repo (a
            # repo not found says so, with the closest names, in its own message)
            refused = _status(err) in (401, 403) or isinstance(err, hub.utils.GatedRepoError)
            if closest and "closest" not in message and not refused:
                message += f" (did you mean {' or '.join(closest)}, in the bundled library?)"
            raise KvplanError(message) from None


def _check_environment(token_given: bool) -> None:
    """The variables huggingface_hub reads, checked first so that a typo is one line naming it; a token in
    HF_TOKEN is checked as --token is, when no --token replaces it, and never shown."""
    from kvplan.sources import clean_token

    # the first of these that is set, as huggingface_hub reads them (an empty one is unset)
    sent = next((name for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN") if os.environ.get(name, "").strip()), None)
    if sent and not token_given:
        clean_token(os.environ[sent], sent)
    for name in ("HF_HUB_ETAG_TIMEOUT", "HF_HUB_DOWNLOAD_TIMEOUT"):  # bounded: a call's deadline is a few of them,
        value = os.environ.get(name, "").strip()  # and a thread cannot wait past threading.TIMEOUT_MAX
        if value and not (value.isascii() and value.isdigit() and 1 <= int(value) <= MAX_TIMEOUT):
            raise KvplanError(f"{name}={shorten(plain(value))} is not a whole number of seconds from 1 to "
                              f"{MAX_TIMEOUT:,}")
    endpoint = os.environ.get("HF_ENDPOINT", "").strip()
    if endpoint:
        try:
            url = urlsplit(endpoint)
            ok = url.scheme in ("http", "https") and bool(url.hostname)
        except ValueError:
            ok = False
        if not ok:
            shown = f"...@{endpoint.rpartition('@')[2]}" if "@" in endpoint else endpoint  # credentials, maybe
            raise KvplanError(f"HF_ENDPOINT={shorten(plain(shown))} is not an http(s) URL like https://huggingface.co")


def _check_token_file(path: Path) -> None:
    """The token file huggingface_hub reads when no token is given (HF_TOKEN_PATH, default HF_HOME/token), checked
    before it reads it: a regular file of at most MAX_TOKEN_FILE bytes holding one token, checked as HF_TOKEN is.
    huggingface_hub reads the whole file, on the worker thread a deadline abandons: /dev/zero grew without end."""
    from kvplan.sources import clean_token

    if os.environ.get("HF_OIDC_RESOURCE") or os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN"):
        return  # huggingface_hub takes its token from those first (`get_token`), and never reads the file
    what = f"the Hugging Face token file {plain(path)}"
    try:
        if not stat.S_ISREG(path.stat().st_mode):
            raise KvplanError(f"{what} is not a regular file (a directory, a pipe or a device): point HF_TOKEN_PATH "
                              "at the file `hf auth login` writes, or give --token")
        with path.open("rb") as handle:
            raw = handle.read(MAX_TOKEN_FILE + 1)
    except FileNotFoundError:
        return  # not logged in
    except OSError as err:
        raise KvplanError(f"cannot read {what} ({err.strerror or err})") from None
    if len(raw) > MAX_TOKEN_FILE:
        raise KvplanError(f"{what} is larger than {MAX_TOKEN_FILE // 2**10} KiB: it is not a token file")
    # cleaned as huggingface_hub's `_clean_token` cleans it; bytes that are not UTF-8 refused as non-ASCII
    token = raw.decode(errors="replace").replace("\r", "").replace("\n", "").strip()
    if token:
        clean_token(token, what)


_USERINFO = re.compile(r"(?<=://)[^/?#\s]*@")


def _without_userinfo(text: str) -> str:
    """`text` with the user:password of every URL in it taken out: HF_ENDPOINT may carry a mirror's credentials
    (http://user:pw@mirror), and errors quote the URLs they were sent to."""
    return _USERINFO.sub("", text)


class _Deadline(TimeoutError):
    """A Hub call that kept answering, slowly, past its deadline (huggingface_hub times each read, not the
    call)."""


def _within(seconds: float, call: Callable[[], T]) -> T:
    """`call()` on a worker thread, given up after `seconds`: a server that trickles its answer cannot hold
    kvplan forever. The abandoned thread is a daemon, gone when kvplan exits."""
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as err:  # handed to the caller's thread
            outcome["error"] = err

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise _Deadline(f"no complete answer within {seconds:g} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


class _Hub:
    """The parts of huggingface_hub kvplan uses, imported on first use."""

    def __init__(self) -> None:
        import huggingface_hub
        from huggingface_hub import constants, utils

        self.hf = huggingface_hub
        self.constants = constants
        self.utils = utils

    @property
    def endpoint(self) -> str:
        return self.constants.ENDPOINT

    @property
    def shown_endpoint(self) -> str:
        """The endpoint as messages show it: without the credentials it may carry."""
        return _without_userinfo(self.endpoint)

    @property
    def offline(self) -> bool:
        return bool(self.constants.HF_HUB_OFFLINE)

    @property
    def etag_timeout(self) -> float:
        return self.constants.HF_HUB_ETAG_TIMEOUT

    @property
    def download_timeout(self) -> float:
        return self.constants.HF_HUB_DOWNLOAD_TIMEOUT

    @property
    def deadline(self) -> float:
        """A whole call (its requests and redirects): a few of huggingface_hub's own per-read timeouts."""
        return CALL_DEADLINE_TIMEOUTS * max(self.etag_timeout, self.download_timeout)

    def api(self, token: str | None):
        return self.hf.HfApi(
            endpoint=self.endpoint, token=token, library_name="kvplan", library_version=__version__
        )

    def download(
        self, repo_id: str, filename: str, revision: str | None, token: str | None, local_only: bool = False
    ) -> Path:
        return Path(_within(self.deadline, lambda: self.hf.hf_hub_download(
            repo_id,
            filename,
            revision=revision,
            token=token,
            cache_dir=self.constants.HF_HUB_CACHE,
            library_name="kvplan",
            library_version=__version__,
            local_files_only=local_only,
            etag_timeout=self.etag_timeout,
        )))


@contextmanager
def _quiet() -> Iterator[None]:
    """No progress bars, retry warnings or Python warnings from huggingface_hub on kvplan's output: a failure
    is one line from kvplan. Restored afterwards."""
    from huggingface_hub import utils

    logger = logging.getLogger("huggingface_hub")
    level = logger.level
    bars_were_off = utils.are_progress_bars_disabled()
    logger.setLevel(logging.ERROR)
    if not bars_were_off:
        utils.disable_progress_bars()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)
        if not bars_were_off:
            utils.enable_progress_bars()


# ---------------------------------------------------------------------------------------------- reading


def _load(hub: _Hub, repo_id: str, revision: str | None, token: str | None) -> ModelSpec:
    notes: list[str] = []
    files: set[str] | None = None
    config_path: Path | None = None
    online = not hub.offline
    if online and revision and _COMMIT.fullmatch(revision):
        config_path = _cached(hub, repo_id, revision, token)  # a commit never changes: no need to ask
    if online and config_path is None:
        try:
            info = _within(hub.deadline, lambda: hub.api(token).model_info(
                repo_id, revision=revision, token=token, timeout=hub.etag_timeout, files_metadata=True))
            files, sizes = _listing(hub, info.siblings)
            if sizes.get("config.json", 0) > MAX_TEXT_FILE:
                raise KvplanError(f"{repo_id}'s config.json is {sizes['config.json']:,} bytes, far past any "
                                  "real config: not downloaded")
        except Exception as err:
            trouble = _network_trouble(err) or _hub_down(err)
            if trouble is None:
                raise
            # huggingface_hub's own rule when the Hub does not answer: the cache, if it has the file
            config_path = _cached(hub, repo_id, revision, token)
            if config_path is None:
                raise
            online = False
            notes.append(f"the Hub did not answer ({trouble}): read the cached config.json")
    if files is not None and "config.json" not in files:
        raise KvplanError(_no_config(repo_id, revision, files))
    if config_path is None:
        config_path = hub.download(repo_id, "config.json", revision, token)
    commit = config_path.parent.name  # snapshots/<commit>/config.json
    source = f"Hub: {repo_id} @ {commit}" + (
        f" (revision {revision})" if revision and revision != commit else ""
    )
    where = f"{repo_id} config.json"
    config = parse_json(read_text(config_path), where)
    sidecar = config_path.parent / MODELOPT_SIDECAR  # in the snapshot where it was downloaded before
    if online and files is not None and MODELOPT_SIDECAR in files and not config.get("quantization_config"):
        sidecar = hub.download(repo_id, MODELOPT_SIDECAR, commit, token)
    spec = model_from_config(with_quant_sidecar(config, sidecar), repo_id, source, where=where)
    checkpoint, note = _checkpoint(hub, repo_id, commit, token, config_path.parent, files, online)
    if note:
        notes.append(note)
    if checkpoint is not None and any("text_config" in n for n in spec.notes):
        notes.append("the weights are every tensor in the checkpoint, the vision/audio encoder's included")
    return spec.model_copy(update={"checkpoint": checkpoint, "notes": (*spec.notes, *notes)})


def _listing(hub: _Hub, siblings: list | None) -> tuple[set[str] | None, dict[str, int]]:
    """The repo's file names and their sizes from model info's `siblings` (None: not listed), each a name and
    a size in bytes as the Hub gives them; anything else is not the Hub's answer."""
    if siblings is None:
        return None, {}
    if not all(isinstance(s.rfilename, str) and (s.size is None or type(s.size) is int) for s in siblings):
        raise KvplanError(f"{hub.shown_endpoint} did not answer as the Hugging Face Hub does (a file listing of the "
                          "wrong shape): check HF_ENDPOINT and any proxy or captive portal")
    return {s.rfilename for s in siblings}, {s.rfilename: s.size for s in siblings if s.size is not None}


def _cached(hub: _Hub, repo_id: str, revision: str | None, token: str | None) -> Path | None:
    try:
        return hub.download(repo_id, "config.json", revision, token, local_only=True)
    except Exception:
        return None


def _checkpoint(
    hub: _Hub,
    repo_id: str,
    commit: str,
    token: str | None,
    snapshot: Path,
    files: set[str] | None,
    online: bool,
) -> tuple[CheckpointTensors | None, str | None]:
    """The tensor inventory of the commit's safetensors, from kvplan's assets cache, the snapshot's own files,
    or the Hub's headers; else None and the note saying why weights come from the config."""
    fallback = "weights derived from the config's parameter counts"
    cached = _assets_read(hub, repo_id, commit)
    if cached is not None:
        return cached, None
    try:
        local = st.from_directory(
            snapshot, f"safetensors headers in the Hugging Face cache, {repo_id} @ {commit[:12]}"
        )
    except st.HeaderError as err:
        return None, f"cached safetensors header unreadable ({err}): {fallback}"
    if local is not None:
        _assets_write(hub, repo_id, commit, local)
        return local, None
    if not online:
        return None, f"offline: the safetensors headers were not fetched, {fallback}"
    if files is not None and not {st.SINGLE_FILE, st.INDEX_FILE} & files:
        return None, f"the repo has no {st.SINGLE_FILE} or {st.INDEX_FILE}: {fallback}"
    try:
        meta = _within(HEADER_DEADLINE_CALLS * hub.deadline, lambda: hub.api(token).get_safetensors_metadata(
            repo_id, revision=commit, token=token, timeout=hub.download_timeout))
        tensors = [pair for name, f in meta.files_metadata.items() for pair in st.tensors_of(
            {key: {"dtype": t.dtype, "shape": t.shape, "data_offsets": list(t.data_offsets)}
             for key, t in f.tensors.items()}, name)]
        count = len(meta.files_metadata)
        found = st.inventory(
            tensors,
            count,
            f"safetensors headers of {count} file{'s' * (count > 1)} in {repo_id} @ {commit[:12]}",
        )
    except Exception as err:
        if isinstance(err, hub.utils.NotASafetensorsRepoError):
            return None, f"the repo has no {st.SINGLE_FILE} or {st.INDEX_FILE}: {fallback}"
        reason = _network_trouble(err) or _first_line(err)
        return None, f"could not read the safetensors headers ({reason}): {fallback}"
    _assets_write(hub, repo_id, commit, found)
    return found, None


def _assets_file(hub: _Hub, repo_id: str, commit: str) -> Path:
    root = Path(hub.constants.HF_ASSETS_CACHE).expanduser()
    return root / "kvplan" / repo_id.replace("/", "--") / "safetensors" / f"{commit}.json"


def _assets_read(hub: _Hub, repo_id: str, commit: str) -> CheckpointTensors | None:
    """A commit's inventory read before (a commit never changes, so it never goes stale)."""
    path = _assets_file(hub, repo_id, commit)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.pop("format", None) != _ASSETS_FORMAT:
            return None
        return CheckpointTensors(**data)
    except (OSError, ValueError, TypeError, AttributeError, RecursionError):  # a damaged file is read afresh
        return None


def _assets_write(hub: _Hub, repo_id: str, commit: str, checkpoint: CheckpointTensors) -> None:
    if not _COMMIT.fullmatch(commit):  # only immutable commits are worth keeping
        return
    path = _assets_file(hub, repo_id, commit)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        # the inventory is a safetensors one: its own `format` field is left to the default when read back
        tmp.write_text(json.dumps({"format": _ASSETS_FORMAT, **checkpoint.model_dump(exclude={"format"})}),
                       encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache only costs the next run its range requests


# ---------------------------------------------------------------------------------------------- GGUF


def load_gguf(repo_id: str, revision: str | None = None, token: str | None = None, gguf_file: str | None = None,
              tag: str | None = None) -> ModelSpec:
    """A GGUF file of `repo_id` at `revision`: `gguf_file`, or the one file (or split model) whose name carries
    `tag` (Q4_K_M). Only its header is read: from the Hugging Face cache when the file is there, else by HTTP
    range requests on the file's resolve URL with huggingface_hub's session and headers (as its
    `get_safetensors_metadata` reads safetensors headers), growing until the header is whole, never the
    tensors."""
    repo_id = repo_id.strip()
    return _guarded(repo_id, revision, (), bool(token),
                    lambda hub: _load_gguf(hub, repo_id, revision or None, token or None, gguf_file, tag))


def _load_gguf(hub: _Hub, repo_id: str, revision: str | None, token: str | None, gguf_file: str | None,
               tag: str | None) -> ModelSpec:
    from kvplan.sources import gguf_model

    if hub.offline:
        if gguf_file is None:
            raise KvplanError(f"HF_HUB_OFFLINE is set: kvplan cannot list {repo_id}'s files to find the {tag} "
                              "GGUF; name it with --gguf-file")
        first = hub.download(repo_id, gguf_file, revision, token, local_only=True)
        return gguf_model.load_file(first)
    info = _within(hub.deadline, lambda: hub.api(token).model_info(
        repo_id, revision=revision, token=token, timeout=hub.etag_timeout))
    commit, files = info.sha, _listing(hub, info.siblings)[0] or set()
    if not isinstance(commit, str) or not _COMMIT.fullmatch(commit):  # the file is read at this commit
        raise KvplanError(f"{hub.shown_endpoint} did not answer as the Hugging Face Hub does (model info without the "
                          "commit it describes): check HF_ENDPOINT and any proxy or captive portal")
    filename = gguf_file.strip() if gguf_file is not None else _tagged_gguf(repo_id, files, tag)
    if filename not in files:
        raise KvplanError(f"{repo_id} has no file {brief(filename)}: {_gguf_list(files)}")
    fetched = [0]  # bytes the range requests brought
    header = _gguf_header(hub, repo_id, commit, filename, token, fetched)
    no, count = gguf_model.split_count(header, filename)
    names, headers = [filename], [header]
    if count > 1:
        names = gguf_model.part_names(filename, no, count, f"{repo_id}/{filename}")
        missing = [name for name in names if name not in files]
        if missing:
            raise KvplanError(f"{repo_id} lacks {missing[0]}, a part of the split model {filename}")
        headers = [header if name == filename else _gguf_header(hub, repo_id, commit, name, token, fetched)
                   for name in names]
        gguf_model.check_parts(headers, names)
    parts = f" and its {count - 1} other part{'s' * (count > 2)}" if count > 1 else ""
    source = f"Hub: {repo_id} @ {commit}" + (f" (revision {revision})" if revision and revision != commit else "")
    return gguf_model.model_from_headers(
        headers, name=f"{repo_id}:{names[0]}", source=f"{source}, GGUF {names[0]}{parts}",
        read=f"GGUF header{'s' * (count > 1)} of {names[0]}{parts} in {repo_id} @ {commit[:12]}"
             + (f", {fetched[0]:,} bytes of {sum(h.file_bytes for h in headers):,} by range requests" if fetched[0]
                else ", in the Hugging Face cache"), where=f"{repo_id}/{names[0]}")


def _gguf_list(files: set[str]) -> str:
    ggufs = sorted(f for f in files if f.lower().endswith(".gguf"))
    if not ggufs:
        return "it has no .gguf files"
    return f"its GGUF files are {', '.join(ggufs[:8])}" + (f" and {len(ggufs) - 8} more" if len(ggufs) > 8 else "")


def _tagged_gguf(repo_id: str, files: set[str], tag: str) -> str:
    """The GGUF file whose path carries `tag` as a whole word (between -, ., / or the ends; case aside, as
    quantisers name them: Model-Q4_K_M.gguf, Q4_K_M/Model-Q4_K_M-00001-of-00002.gguf), the first part of a split
    one; multimodal projectors (mmproj-*) left out."""
    from kvplan.sources.gguf_model import SPLIT_NAME

    word = re.compile(rf"(?:^|[-./]){re.escape(tag)}(?:[-./]|$)", re.IGNORECASE)
    found = set()
    for name in files:
        if not name.lower().endswith(".gguf") or Path(name).name.lower().startswith("mmproj") or not word.search(name):
            continue
        part = SPLIT_NAME.match(name)
        if part is None or part["no"] == "00001":
            found.add(name)
    if len(found) != 1:
        which = f"several GGUF files: {', '.join(sorted(found)[:8])}" if found else "no GGUF file"
        raise KvplanError(f"{repo_id}: {brief(tag)} matches {which}; name one with --gguf-file "
                          f"({_gguf_list(files)})")
    return found.pop()


def _gguf_header(hub: _Hub, repo_id: str, commit: str, filename: str, token: str | None, fetched: list[int]):
    """One file's header: from the cache if the file is there, else by range requests (their bytes added to
    fetched[0])."""
    from kvplan.sources import gguf

    cached = hub.hf.try_to_load_from_cache(repo_id, filename, cache_dir=hub.constants.HF_HUB_CACHE, revision=commit)
    if isinstance(cached, str):
        return gguf.read_file(Path(cached))
    url = hub.hf.hf_hub_url(repo_id, filename, revision=commit, endpoint=hub.endpoint)
    headers = hub.utils.build_hf_headers(token=token, library_name="kvplan", library_version=__version__)
    meta = _within(hub.deadline, lambda: hub.hf.get_hf_file_metadata(
        url, token=token, timeout=hub.etag_timeout, library_name="kvplan", library_version=__version__))
    if meta.size is None:
        raise KvplanError(f"{repo_id}/{filename}: the Hub did not give the file's size")
    where = f"{repo_id}/{filename}"

    def read_at(offset: int, length: int) -> bytes:
        data = _read_range(hub, url, headers, offset, length, where)
        fetched[0] += len(data)
        return data

    return _within(GGUF_DEADLINE_CALLS * hub.deadline, lambda: gguf.read_header(read_at, meta.size, where))


def _read_range(hub: _Hub, url: str, headers: dict, offset: int, length: int, where: str) -> bytes:
    """Bytes offset .. offset + length - 1 of the file at `url` (all within the file), by one HTTP range request
    (redirects followed, as to the Hub's CDN); at most `length` bytes are taken from the answer, whatever the
    server sends. An answer that is not those bytes (another range in its Content-Range, fewer bytes) is refused:
    a server sending 7 bytes a request took 1,500 requests to read a header."""
    ranged = {**headers, "range": f"bytes={offset}-{offset + length - 1}"}
    with hub.utils.get_session().stream("GET", url, headers=ranged, timeout=hub.download_timeout) as response:
        hub.utils.hf_raise_for_status(response)
        if response.status_code != 206:
            raise KvplanError(f"{where}: the server answered {response.status_code} to a range request, not 206: "
                              "kvplan reads a GGUF's header by range requests, never the whole file")
        answered = response.headers.get("content-range", "")
        if not answered.startswith(f"bytes {offset}-"):
            raise KvplanError(f"{where}: the server answered a range request from byte {offset:,} with other bytes "
                              f"(Content-Range {brief(answered)}): check HF_ENDPOINT and any proxy")
        data = bytearray()
        for chunk in response.iter_bytes():
            data += chunk
            if len(data) >= length:
                break
    if len(data) < length:
        raise KvplanError(f"{where}: the server sent {len(data):,} of the {length:,} bytes a range request asked for: "
                          "check HF_ENDPOINT and any proxy")
    return bytes(data[:length])


# ---------------------------------------------------------------------------------------------- errors


def _chain(err: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    pending = [err]
    while pending:
        current = pending.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        pending += [e for e in (current.__cause__, current.__context__) if e is not None]


def _network_trouble(err: BaseException) -> str | None:
    """'timed out' / 'cannot connect' when the error (or its cause) is a timeout or a failed connection
    (httpx, requests and socket errors alike), else None. Offline mode is not trouble: it is asked for."""
    for e in _chain(err):
        names = {cls.__name__ for cls in type(e).__mro__}
        if "OfflineModeIsEnabled" in names:
            return None
        if names & {"TimeoutException", "Timeout", "TimeoutError", "ReadTimeout", "ConnectTimeout"}:
            return "timed out"
    for e in _chain(err):
        names = {cls.__name__ for cls in type(e).__mro__}
        if names & {"ConnectError", "NetworkError", "ConnectionError", "RemoteProtocolError", "ProxyError"}:
            return "cannot connect"
    return None


def _hub_down(err: BaseException) -> str | None:
    """'answered 503' for a server error or rate limit, when huggingface_hub would also try the cache."""
    status = _status(err)
    return f"answered {status}" if status is not None and (status >= 500 or status == 429) else None


def _first_line(err: BaseException) -> str:
    """The error's type and the first line of its message, without the credentials of any URL it quotes."""
    text = _without_userinfo(str(err)).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


def _no_config(repo_id: str, revision: str | None, files: set[str] | None = None) -> str:
    at = f" at revision {revision}" if revision else ""
    ggufs = sorted(f for f in files or () if f.lower().endswith(".gguf"))
    if ggufs:
        shown = ", ".join(ggufs[:6]) + (f" and {len(ggufs) - 6} more" if len(ggufs) > 6 else "")
        return (f"{repo_id}{at} has no config.json but GGUF files ({shown}): read one's header with "
                f"{repo_id}:TAG (its quantisation, e.g. Q4_K_M) or --gguf-file NAME")
    return (
        f"{repo_id}{at} has no config.json (not a transformers model, e.g. GGUF-only or a diffusers "
        "repo): give kvplan a config.json or a YAML spec (docs/yaml-spec.md)"
    )


def _status(err: BaseException) -> int | None:
    response = getattr(err, "response", None)
    return getattr(response, "status_code", None)


def _sent_token(err: BaseException) -> bool:
    """Whether the failed request carried a token (huggingface_hub sends it as a Bearer authorization; the user and
    password of an HF_ENDPOINT go as Basic, and are not a token)."""
    request = getattr(getattr(err, "response", None), "request", None)
    headers = getattr(request, "headers", None) or {}
    return any(key.lower() == "authorization" and str(value).startswith("Bearer ") for key, value in headers.items())


def explain(
    hub: _Hub, err: BaseException, repo_id: str, revision: str | None, closest: tuple[str, ...] = ()
) -> str | None:
    """One line for a huggingface_hub failure, saying what to do; None for an error that is not the Hub's."""
    u = hub.utils
    page = f"{hub.shown_endpoint}/{repo_id}"
    login = "give a token with --token, HF_TOKEN or `hf auth login`"
    timeout = (
        f"the Hub at {hub.shown_endpoint} did not answer in time (HF_HUB_ETAG_TIMEOUT={hub.etag_timeout:g}s, "
        f"HF_HUB_DOWNLOAD_TIMEOUT={hub.download_timeout:g}s) and {repo_id} is not in the cache: check the "
        "connection, raise those timeouts, or set HF_HUB_OFFLINE=1 to use cached models"
    )
    unreachable = (
        f"cannot reach the Hub at {hub.shown_endpoint} and {repo_id} is not in the cache: check the "
        "connection, proxy or HF_ENDPOINT, or set HF_HUB_OFFLINE=1 to use cached models"
    )
    offline = (
        f"HF_HUB_OFFLINE is set and {repo_id}"
        + (f" at revision {revision}" if revision else "")
        + f" is not in the Hugging Face cache ({hub.constants.HF_HUB_CACHE}): run once online, or "
        "unset HF_HUB_OFFLINE"
    )
    if isinstance(err, u.GatedRepoError):
        if _status(err) == 403 or _sent_token(err):
            return (
                f"{repo_id} is gated and this token's account has no access yet: accept its licence at "
                f"{page} (and wait for approval if asked), then retry"
            )
        return f"{repo_id} is gated: accept its licence at {page}, then {login}"
    if isinstance(err, u.RepositoryNotFoundError):
        hint = f"; closest in the bundled library: {', '.join(closest)}" if closest else ""
        if _sent_token(err):
            return f"{repo_id}: no such model repo on the Hub, or your token cannot see it (private){hint}"
        return f"{repo_id}: no such model repo on the Hub (if it is private, {login}){hint}"
    if isinstance(err, u.RevisionNotFoundError):
        return (
            f"{repo_id} has no revision {revision!r}: give a branch, tag or commit that exists "
            "(leave --revision out for main)"
        )
    if isinstance(err, u.LocalEntryNotFoundError):
        for cause in _chain(err):
            if isinstance(cause, u.OfflineModeIsEnabled):
                return offline
            if isinstance(cause, u.FileMetadataError):
                return (
                    f"{hub.shown_endpoint} does not answer like the Hugging Face Hub (no X-Repo-Commit): check "
                    "HF_ENDPOINT and the proxy"
                )
        trouble = _network_trouble(err)
        if trouble == "timed out":
            return timeout
        return unreachable if trouble else offline if hub.offline else unreachable
    if isinstance(err, u.EntryNotFoundError):
        return _no_config(repo_id, revision)
    if isinstance(err, u.OfflineModeIsEnabled):
        return offline
    if isinstance(err, u.HfHubHTTPError):
        status = _status(err)
        if status == 401:
            if _sent_token(err):
                return (
                    "the Hub refused the token (401 invalid credentials): check --token / HF_TOKEN, or run "
                    "`hf auth login` again"
                )
            return f"{repo_id}: the Hub wants a token (401): {login}"
        if status == 403:
            return f"the token may not read {repo_id} (403 forbidden): use a token with read access to it"
        if status == 429:
            return "the Hub is rate-limiting these requests (429): wait a minute and retry, or give a token"
        if status is not None and status >= 500:
            return (
                f"the Hub answered {status} for {repo_id}: try again later, or set HF_HUB_OFFLINE=1 to use "
                "the cache"
            )
        return f"the Hub refused the request for {repo_id} ({_first_line(err)})"
    if isinstance(err, u.HFValidationError):
        return f"{repo_id!r} is not a valid Hub repo id or revision: {_first_line(err)}"
    trouble = _network_trouble(err)
    if trouble == "timed out":
        return timeout
    if trouble:
        return unreachable
    if isinstance(err, OSError):  # the cache itself: read-only, full, or not a directory
        return (
            f"cannot use the Hugging Face cache at {hub.constants.HF_HUB_CACHE} ({_first_line(err)}): "
            "check HF_HOME / HF_HUB_CACHE"
        )
    if _raised_by_the_hub_client(err):  # HTML from a captive portal, a redirect loop, a file:// redirect, ...
        return (
            f"{hub.shown_endpoint} did not answer as the Hugging Face Hub does ({shorten(_first_line(err))}): check "
            "HF_ENDPOINT and any proxy or captive portal"
        )
    return None


# huggingface_hub and the HTTP clients it runs on: httpx and httpcore (huggingface_hub 1.x), httpx2 and httpcore2
# (2.x, whose `get_session` is an httpx2.Client), h11 under both.
HUB_CLIENT_MODULES = frozenset({"huggingface_hub", "httpx", "httpcore", "httpx2", "httpcore2", "h11"})


def _raised_by_the_hub_client(err: BaseException) -> bool:
    """Whether huggingface_hub or its HTTP client raised `err`: an answer the Hub would not give. An error
    raised by kvplan's own code is not the Hub's and stays a bug."""
    tb = err.__traceback__
    while tb is not None:
        module = tb.tb_frame.f_globals.get("__name__", "")
        if module.split(".")[0] in HUB_CLIENT_MODULES:
            return True
        tb = tb.tb_next
    return False
