"""Safetensors headers -> the checkpoint's tensor inventory (CheckpointTensors), read without torch or the
safetensors package: only each file's header (8-byte little-endian length, then a JSON object mapping tensor
names to dtype, shape and data offsets) is read, never the tensor data.

Used for local checkpoint directories and for Hub snapshots already in the Hugging Face cache; Hub repos not
downloaded have their headers read by range requests in `kvplan.sources.hub`. The file layout is the one
transformers writes and huggingface_hub reads: `model.safetensors`, or `model.safetensors.index.json` naming
the shards in its `weight_map`.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from pydantic import ValidationError

from kvplan.dtypes import SAFETENSORS_BITS
from kvplan.model import CheckpointTensors
from kvplan.text import brief

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
MAX_HEADER = 100_000_000  # the safetensors format refuses larger headers
MAX_INDEX = 64 * 2**20  # an index names each tensor once: a trillion-parameter model's is under 10 MiB


class HeaderError(Exception):
    """A safetensors header that cannot be read; the caller falls back to config-derived weights."""


def tensors_of(header: dict, where: str, data_bytes: int | None = None) -> list[tuple[str, int]]:
    """(dtype, elements) of each tensor in one parsed header (the `__metadata__` entry is not a tensor), checked as
    the safetensors library checks a file before it reads a tensor (safetensors 0.8, `Metadata::validate` and
    `SafeTensors::read_metadata` in safetensors/src/tensor.rs): in the order of their data_offsets the tensors
    tile the data from byte 0, each spanning exactly its elements x its dtype's size, and the last ends where the
    file does (`data_bytes`: the bytes after the header, where the file's size is known). So a header that only
    claims tensors (a shape of 2^62 rows over no data) is not counted as weights."""
    spans = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if (
            not isinstance(info, dict)
            or not isinstance(info.get("dtype"), str)
            or not isinstance(info.get("shape"), list)
        ):
            raise HeaderError(f"{where}: tensor {brief(name)} has no dtype and shape")
        dtype, shape, offsets = info["dtype"], info["shape"], info.get("data_offsets")
        if not all(_whole(d) for d in shape):
            raise HeaderError(f"{where}: tensor {brief(name)} has shape {brief(shape)}")
        if dtype not in SAFETENSORS_BITS:
            raise HeaderError(f"{where}: tensor dtype {brief(dtype)} is not one kvplan knows")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(_whole(o) for o in offsets)):
            raise HeaderError(f"{where}: tensor {brief(name)} has data_offsets {brief(offsets)}, not [begin, end]")
        spans.append((offsets[0], offsets[1], name, dtype, math.prod(shape)))
    end = 0
    for begin, stop, name, dtype, elements in sorted(spans):
        if begin != end or (stop - begin) * 8 != elements * SAFETENSORS_BITS[dtype]:
            raise HeaderError(f"{where}: the data_offsets [{begin:,}, {stop:,}] of tensor {brief(name)} are not "
                              f"where its {elements:,} {dtype} elements would lie")
        end = stop
    if data_bytes is not None and end != data_bytes:
        raise HeaderError(f"{where}: its tensors end at byte {end:,} of the data, but the file holds {data_bytes:,}")
    return [(dtype, elements) for _, _, _, dtype, elements in spans]


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def inventory(tensors: Iterable[tuple[str, int]], files: int, source: str) -> CheckpointTensors:
    """Sum (dtype, elements) pairs into a CheckpointTensors; checkpoint files that hold no tensor hold no weights,
    so they are refused too (the weights then come from the config)."""
    elements: Counter[str] = Counter()
    count = 0
    for dtype, n in tensors:
        elements[dtype] += n
        count += 1
    if not count:
        raise HeaderError("the safetensors files hold no tensors")
    try:
        return CheckpointTensors(
            elements=dict(sorted(elements.items(), key=lambda kv: -kv[1])),
            tensors=count,
            files=files,
            source=source,
        )
    except ValidationError as err:
        raise HeaderError(str(err).splitlines()[0]) from None


def read_header(path: Path) -> tuple[dict, int]:
    """The JSON header of one local safetensors file, and the bytes of tensor data that follow it."""
    try:
        with path.open("rb") as f:
            prefix = f.read(8)
            if len(prefix) < 8:
                raise HeaderError(f"{path.name}: too short to be a safetensors file")
            (size,) = struct.unpack("<Q", prefix)
            if size > MAX_HEADER:
                raise HeaderError(f"{path.name}: header of {size:,} bytes is past the format's limit")
            raw = f.read(size)
            data_bytes = os.fstat(f.fileno()).st_size - 8 - size
    except OSError as err:
        raise HeaderError(f"{path.name}: cannot read ({err.strerror or err})") from None
    if len(raw) < size:
        raise HeaderError(f"{path.name}: header is cut short")
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):  # ValueError: malformed, or a number of 5,000 digits
        raise HeaderError(f"{path.name}: header is not JSON a checkpoint writes") from None
    if not isinstance(header, dict):
        raise HeaderError(f"{path.name}: header is not a JSON object")
    return header, data_bytes


def shard_names(directory: Path) -> list[str] | None:
    """The safetensors files of a checkpoint directory; None if it has none (or an index naming none). Each must
    be a file in the directory: a name that is absolute, holds `..` or resolves elsewhere (a symbolic link out of
    it) is refused, so a crafted index or link cannot make kvplan read (or count as the model's weights) a file
    elsewhere. In a Hugging Face cache snapshot the files link to their blobs in the same repo folder."""
    index_path = directory / INDEX_FILE
    if index_path.is_file():
        if index_path.stat().st_size > MAX_INDEX:
            raise HeaderError(f"{INDEX_FILE}: larger than {MAX_INDEX // 2**20} MiB, far past any real index")
        try:
            index = json.loads(index_path.read_text(encoding="utf-8"))
            names = sorted(set(index["weight_map"].values()))
            if not all(isinstance(name, str) and name for name in names):
                raise TypeError("a shard name is not a string")
        except (OSError, ValueError, RecursionError, KeyError, TypeError, AttributeError):
            raise HeaderError(f"{INDEX_FILE}: not a readable index (a weight_map of file names)") from None
        where = INDEX_FILE
    elif (directory / SINGLE_FILE).is_file():
        names, where = [SINGLE_FILE], SINGLE_FILE
    else:
        return None
    root = directory.resolve()
    if root.parent.name == "snapshots":  # models--org--name/snapshots/<commit>/ -> models--org--name/blobs/
        root = root.parent.parent
    for name in names:
        inside = (directory / name).resolve().is_relative_to(root)
        if Path(name).is_absolute() or ".." in Path(name).parts or not inside:
            raise HeaderError(f"{where}: shard {name!r} is outside the checkpoint directory")
    return names or None


def from_directory(directory: Path, source: str) -> CheckpointTensors | None:
    """The tensor inventory of the safetensors files in `directory`; None if it holds none, or not all the
    shards its index names (a partial download). HeaderError if a header cannot be read."""
    names = shard_names(directory)
    if names is None or not all((directory / name).is_file() for name in names):
        return None
    tensors = []
    for name in names:
        header, data_bytes = read_header(directory / name)
        tensors += tensors_of(header, name, data_bytes)
    return inventory(tensors, len(names), source)
