"""GGUF files (llama.cpp's model format): the header, read by kvplan's own reader, never the tensor data.

The layout (ggml's docs/gguf.md; llama.cpp reads it in ggml/src/gguf.cpp), all little-endian:
    magic "GGUF", version u32 (2 or 3), tensor count u64, metadata count u64;
    metadata, each: key (string), value type u32, value; a string is a u64 length and that many UTF-8 bytes; an
        array is an element type u32, a u64 count and the elements;
    tensor infos, each: name (string), dimension count u32, dimensions u64 each (ne[0], the row, first), ggml type
        u32, offset u64 from the start of the data;
    padding to `general.alignment` (default 32), then the tensor data.
A tensor's bytes are its elements / elements per block x bytes per block of its ggml type (`GGML_TYPES`).

Bounded as the rest of kvplan's input: the header is read in growing pieces (a local file or HTTP range requests,
`read_header`), never past `MAX_HEADER` bytes; every length and count is checked against the bytes the file
holds before anything is read or kept, long arrays (the tokenizer's) are stepped over, not kept; what llama.cpp's
reader refuses (version 1, a nested array, a duplicate key or tensor, a tensor name of 64 bytes or more, more than
4 dimensions, rows that are not whole blocks, offsets out of order) is refused here too, in one line.
"""

from __future__ import annotations

import math
import os
import stat
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kvplan.dtypes import GGML_TYPES, DType
from kvplan.errors import KvplanError
from kvplan.text import brief

MAGIC = b"GGUF"
MAX_HEADER = 64 * 2**20  # real headers (tokenizer and all) are a few MiB: a Gemma 3 vocabulary of 262k is ~6 MiB
FIRST_READ = 2**20
KEPT_ARRAY = 4096  # arrays up to this long are kept (per-layer values: llama.cpp allows 512 layers); longer ones,
#                    the tokenizer's, are stepped over
MAX_NAME = 64  # GGML_MAX_NAME: a tensor name must be shorter
MAX_DIMS = 4  # GGML_MAX_DIMS
DEFAULT_ALIGNMENT = 32  # GGUF_DEFAULT_ALIGNMENT
INT64_MAX = 2**63 - 1

# Value types (`enum gguf_type`): struct format and size of the scalar ones.
STRING, ARRAY = 8, 9
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "B", 10: "Q", 11: "q", 12: "d"}
TYPE_NAMES = {0: "u8", 1: "i8", 2: "u16", 3: "i16", 4: "u32", 5: "i32", 6: "f32", 7: "bool", 8: "str", 9: "arr",
              10: "u64", 11: "i64", 12: "f64"}
BOOL = 7
INTEGERS = frozenset({0, 1, 2, 3, 4, 5, 10, 11})
# ggml types llama.cpp no longer loads from a file (their type traits have no block size).
REMOVED_TYPES = {4: "Q4_2", 5: "Q4_3", 31: "Q4_0_4_4", 32: "Q4_0_4_8", 33: "Q4_0_8_8", 36: "IQ4_NL_4_4",
                 37: "IQ4_NL_4_8", 38: "IQ4_NL_8_8"}


@dataclass(frozen=True)
class Value:
    """A metadata value and its GGUF type: a scalar, a string, or an array (`element_type` set), whose items are
    kept when it has at most KEPT_ARRAY of them (`items` None otherwise)."""

    type: int
    value: object = None
    element_type: int | None = None
    length: int = 0
    items: tuple | None = None

    @property
    def type_name(self) -> str:
        if self.element_type is None:
            return TYPE_NAMES[self.type]
        return f"array of {self.length:,} {TYPE_NAMES[self.element_type]}"


@dataclass(frozen=True)
class Tensor:
    name: str
    dims: tuple[int, ...]  # ne[0] (the row) first, as GGUF stores them
    ggml_type: int
    offset: int

    @property
    def dtype(self) -> DType:
        return GGML_TYPES[self.ggml_type]

    @property
    def elements(self) -> int:
        return math.prod(self.dims)

    @property
    def nbytes(self) -> int:
        return self.dtype.bytes_for(self.elements)


@dataclass(frozen=True)
class Header:
    version: int
    metadata: dict[str, Value]
    tensors: tuple[Tensor, ...]
    data_offset: int  # where the tensor data starts
    file_bytes: int


class _Short(Exception):
    """The bytes read so far end before the header does: read up to `need`, and parse again."""

    def __init__(self, need: int) -> None:
        self.need = need


class _Cursor:
    def __init__(self, buf: bytes | bytearray, size: int, where: str) -> None:
        self.buf, self.size, self.where, self.pos = buf, size, where, 0
        self.part = "its first 24 bytes"

    def fail(self, message: str) -> KvplanError:
        return KvplanError(f"{self.where}: {message}")

    def need(self, n: int, what: str = "") -> int:
        """Claim the next n bytes (checked against the file and the header cap); their start."""
        start, end = self.pos, self.pos + n
        if end > self.size:
            if what:
                raise self.fail(f"{what} in {self.part} runs past the end of the file ({self.size:,} bytes): a "
                                "damaged file")
            raise self.fail(f"the file ({self.size:,} bytes) ends inside {self.part}: it is cut short, or not a "
                            "GGUF file")
        if end > MAX_HEADER:
            raise self.fail(f"the header is larger than {MAX_HEADER // 2**20} MiB ({self.part} ends past it), far "
                            "past any real model's")
        if end > len(self.buf):
            raise _Short(end)
        self.pos = end
        return start

    def unpack(self, fmt: str):
        start = self.need(struct.calcsize(fmt))
        return struct.unpack_from(fmt, self.buf, start)

    def u32(self) -> int:
        return self.unpack("<I")[0]

    def u64(self) -> int:
        return self.unpack("<Q")[0]

    def raw_string(self, what: str = "a string") -> bytes:
        length = self.u64()
        start = self.need(length, f"{what} of {length:,} bytes")
        return bytes(self.buf[start:start + length])

    def string(self, what: str = "a string") -> str:
        return self.raw_string(what).decode("utf-8", errors="replace")

    def skip_strings(self, count: int) -> None:
        """Step over `count` strings without keeping them (a tokenizer's hundreds of thousands): lengths only, as
        far as the bytes read so far go; the string that runs past them is read as any other, which asks for
        more bytes or names what is wrong."""
        buf, pos, done = self.buf, self.pos, 0
        limit = min(len(buf), self.size, MAX_HEADER)
        while done < count and pos + 8 <= limit:
            (length,) = struct.unpack_from("<Q", buf, pos)
            if pos + 8 + length > limit:
                break
            pos += 8 + length
            done += 1
        self.pos = pos
        for _ in range(count - done):
            self.raw_string()


def parse(buf: bytes | bytearray, size: int, where: str) -> Header:
    """The header of a GGUF file of `size` bytes whose first len(buf) bytes are `buf`; _Short if it needs more."""
    cur = _Cursor(buf, size, where)
    start = cur.need(4)
    if bytes(buf[start:start + 4]) != MAGIC:
        raise cur.fail(f"not a GGUF file (it starts with {bytes(buf[:4])!r}, not b'GGUF')")
    version = cur.u32()
    if version not in (2, 3):
        endian = ", a big-endian file" if version and not version & 0xFFFF else ""
        raise cur.fail(f"GGUF version {version:,}{endian}: llama.cpp loads versions 2 and 3, little-endian")
    n_tensors, n_kv = cur.u64(), cur.u64()
    # The smallest metadata entry takes 14 bytes, the smallest tensor info 24: a count beyond that is not a file's.
    if n_kv > size // 14 or n_tensors > size // 24:
        raise cur.fail(f"{n_kv:,} metadata entries and {n_tensors:,} tensors cannot fit in {size:,} bytes: a damaged "
                       "file")
    metadata: dict[str, Value] = {}
    for i in range(n_kv):
        cur.part = f"metadata entry {i + 1:,} of {n_kv:,}"
        key = cur.string("a key")
        if not key:
            raise cur.fail(f"{cur.part} has an empty key")
        if key in metadata:
            raise cur.fail(f"the key {_shown(key)} appears twice")
        cur.part = f"the value of {_shown(key)}"
        metadata[key] = _value(cur)
    alignment = metadata.get("general.alignment")
    if alignment is not None and (alignment.type != 4 or not alignment.value
                                  or alignment.value & (alignment.value - 1)):
        raise cur.fail("general.alignment must be a u32 power of 2")
    align = alignment.value if alignment is not None else DEFAULT_ALIGNMENT
    tensors, names, expected = [], set(), 0
    for i in range(n_tensors):
        cur.part = f"tensor info {i + 1:,} of {n_tensors:,}"
        tensor = _tensor(cur, names)
        if tensor.offset != expected:
            raise cur.fail(f"tensor {_shown(tensor.name)} starts at offset {tensor.offset:,} of the data, not "
                           f"{expected:,} where the one before it ends")
        expected += -(-tensor.nbytes // align) * align
        tensors.append(tensor)
    data_offset = -(-cur.pos // align) * align
    if tensors:
        end = data_offset + tensors[-1].offset + tensors[-1].nbytes
        if end > size:
            raise cur.fail(f"its tensors end at byte {end:,} but the file has {size:,}: it is cut short (a partial "
                           "download?)")
    return Header(version=version, metadata=metadata, tensors=tuple(tensors), data_offset=data_offset,
                  file_bytes=size)


def _value(cur: _Cursor) -> Value:
    kind = cur.u32()
    if kind in SCALARS:
        (value,) = cur.unpack("<" + SCALARS[kind])
        return Value(kind, value != 0 if kind == BOOL else value)
    if kind == STRING:
        return Value(kind, cur.string())
    if kind != ARRAY:
        raise cur.fail(f"{cur.part} has value type {kind}, not one GGUF defines")
    element, count = cur.u32(), cur.u64()
    if element == ARRAY:
        raise cur.fail(f"{cur.part} is an array of arrays, which llama.cpp's GGUF reader refuses")
    if element == STRING:
        if count > (min(cur.size, MAX_HEADER) - cur.pos) // 8:
            raise cur.fail(f"{cur.part} is an array of {count:,} strings, more than the file (or a header of "
                           f"{MAX_HEADER // 2**20} MiB) can hold")
        if count > KEPT_ARRAY:
            cur.skip_strings(count)
            return Value(kind, element_type=element, length=count)
        return Value(kind, element_type=element, length=count, items=tuple(cur.string() for _ in range(count)))
    if element not in SCALARS:
        raise cur.fail(f"{cur.part} is an array of value type {element}, not one GGUF defines")
    width = struct.calcsize(SCALARS[element])
    start = cur.need(count * width, f"an array of {count:,} {TYPE_NAMES[element]}")
    if count > KEPT_ARRAY:
        return Value(kind, element_type=element, length=count)
    items = struct.unpack_from(f"<{count}{SCALARS[element]}", cur.buf, start)
    if element == BOOL:
        items = tuple(item != 0 for item in items)
    return Value(kind, element_type=element, length=count, items=items)


def _tensor(cur: _Cursor, names: set[str]) -> Tensor:
    raw = cur.raw_string("a tensor name")
    name = raw.decode("utf-8", errors="replace")
    if len(raw) >= MAX_NAME:
        raise cur.fail(f"tensor name {_shown(name)} is {len(raw):,} bytes; llama.cpp allows {MAX_NAME - 1}")
    if name in names:
        raise cur.fail(f"tensor {_shown(name)} appears twice")
    names.add(name)
    cur.part = f"tensor {_shown(name)}"
    n_dims = cur.u32()
    if n_dims > MAX_DIMS:
        raise cur.fail(f"{cur.part} has {n_dims:,} dimensions; ggml allows {MAX_DIMS}")
    dims = cur.unpack(f"<{n_dims}Q")
    if any(d > INT64_MAX for d in dims) or math.prod(dims) > INT64_MAX:
        raise cur.fail(f"{cur.part} has shape {list(dims)}, past 2^63 elements")
    ggml_type, offset = cur.u32(), cur.u64()
    if ggml_type not in GGML_TYPES:
        removed = f" ({REMOVED_TYPES[ggml_type]}, removed from GGUF files)" if ggml_type in REMOVED_TYPES else ""
        raise cur.fail(f"{cur.part} has ggml type {ggml_type}{removed}, which llama.cpp does not load")
    dtype, row = GGML_TYPES[ggml_type], dims[0] if dims else 1
    if row % dtype.block_elements:
        raise cur.fail(f"{cur.part} is {dtype.name} with rows of {row:,} elements, not whole blocks of "
                       f"{dtype.block_elements}")
    return Tensor(name=name, dims=tuple(dims), ggml_type=ggml_type, offset=offset)


def _shown(text: str) -> str:
    return brief(text)


def read_header(read_at: Callable[[int, int], bytes], size: int, where: str) -> Header:
    """The header of a GGUF file of `size` bytes, reading it with read_at(offset, length) in pieces that grow (at
    least doubling) until the header is whole: a few reads for a header of several MiB, never past MAX_HEADER."""
    buf = bytearray()
    want = min(size, FIRST_READ)
    while True:
        while len(buf) < want:
            chunk = read_at(len(buf), want - len(buf))
            if not chunk:
                raise KvplanError(f"{where}: the file ended at byte {len(buf):,}, before the {size:,} bytes it "
                                  "said it has")
            buf += chunk[:want - len(buf)]
        try:
            return parse(buf, size, where)
        except _Short as short:
            want = min(size, MAX_HEADER, max(2 * len(buf), short.need))


def read_file(path: Path) -> Header:
    """The header of a local GGUF file. Only a regular file is read: it is opened without blocking and checked
    before any read, so a FIFO or a device named .gguf cannot block or stream forever."""
    where = str(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except IsADirectoryError:
        raise KvplanError(f"{where} is a directory, not a GGUF file") from None
    except OSError as err:
        raise KvplanError(f"cannot read {where} ({err.strerror or err})") from None
    with os.fdopen(fd, "rb") as f:
        try:
            info = os.fstat(fd)
            if stat.S_ISDIR(info.st_mode):
                raise KvplanError(f"{where} is a directory, not a GGUF file")
            if not stat.S_ISREG(info.st_mode):
                raise KvplanError(f"{where}: not a regular file (a pipe or a device), not a GGUF file")

            def read_at(offset: int, length: int) -> bytes:
                f.seek(offset)
                return f.read(length)

            return read_header(read_at, info.st_size, where)
        except OSError as err:
            raise KvplanError(f"cannot read {where} ({err.strerror or err})") from None
