"""Test kit for GGUF: real GGUF files written by llama.cpp's own Python writer (the `gguf` package, gguf-py), an
implementation outside kvplan, and byte-level headers for the files that writer would never make.

Shapes are given in ggml order, as llama.cpp documents tensors (ne[0], the row, first): token_embd is
[n_embd, n_vocab]. Tensor data is raw zero bytes of the size gguf-py's own block table (GGML_QUANT_SIZES) gives
for the type, so K-quant and IQ tensors are written as llama-quantize writes them, byte for byte in size.
"""

from __future__ import annotations

import math
import os
import struct
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter

Q = GGMLQuantizationType
V = GGUFValueType


class Typed:
    """A metadata value written with an explicit GGUF type (`sub` for an array's elements)."""

    def __init__(self, kind: GGUFValueType, value, sub: GGUFValueType | None = None) -> None:
        self.kind, self.value, self.sub = kind, value, sub


def tensor_nbytes(shape: list[int], qtype: GGMLQuantizationType) -> int:
    """Bytes gguf-py gives a tensor: rows of ne[0] / block elements, each block `type size` bytes."""
    block, size = GGML_QUANT_SIZES[qtype]
    return math.prod(shape) // block * size


SPARSE_FROM = 16 * 2**20  # tensor data past this is left a hole unless `sparse` says otherwise


def write_gguf(path: Path, arch: str, meta: dict, tensors: list[tuple[str, list[int], GGMLQuantizationType]],
               sparse: bool | None = None) -> Path:
    """A GGUF file by gguf-py's GGUFWriter. Keys starting with "." get the architecture's prefix; ints are
    written u32 (as llama.cpp reads its counts), floats f32, lists of ints i32 arrays (as gguf-py writes them),
    lists of bools bool arrays. `sparse`: the tensor data is left a hole (the file truncated to its full size),
    for a model of several GB; by default where it passes SPARSE_FROM bytes."""
    if sparse is None:
        sparse = sum(tensor_nbytes(shape, q) for _, shape, q in tensors) > SPARSE_FROM
    writer = GGUFWriter(str(path), arch)
    for key, value in meta.items():
        key = arch + key if key.startswith(".") else key
        if isinstance(value, Typed):
            writer.add_key_value(key, value.value, value.kind, sub_type=value.sub)
        elif isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        else:
            writer.add_array(key, value)
    for name, shape, qtype in tensors:
        nbytes = tensor_nbytes(shape, qtype)
        numpy_shape = list(reversed(shape))
        if sparse:
            writer.add_tensor_info(name, numpy_shape, np.dtype(np.float32), nbytes, raw_dtype=qtype)
        else:
            block, size = GGML_QUANT_SIZES[qtype]
            data = np.zeros((*numpy_shape[:-1], shape[0] // block * size), dtype=np.uint8)
            writer.add_tensor(name, data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    if not sparse:
        writer.write_tensors_to_file()
        writer.close()
        return path
    writer.write_ti_data_to_file()
    end = writer.fout[0].tell()
    writer.close()
    align = writer.data_alignment
    data = sum(-(-tensor_nbytes(shape, q) // align) * align for _, shape, q in tensors)
    os.truncate(path, -(-end // align) * align + data)
    return path


def reader_bytes(path: Path) -> int:
    """The tensor bytes gguf-py's GGUFReader reports for the file (its `n_bytes`, summed)."""
    return sum(int(t.n_bytes) for t in GGUFReader(str(path)).tensors)


def reader_elements(path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    for t in GGUFReader(str(path)).tensors:
        out[t.tensor_type.name] = out.get(t.tensor_type.name, 0) + int(t.n_elements)
    return out


def header_bytes(path: Path, tensors: list[tuple[str, list[int], GGMLQuantizationType]], align: int = 32) -> bytes:
    """The file up to its tensor data, which fills the end of the file (gguf-py pads each tensor to the
    alignment): what a server must send for kvplan to read it."""
    data = sum(-(-tensor_nbytes(shape, q) // align) * align for _, shape, q in tensors)
    with path.open("rb") as f:
        return f.read(path.stat().st_size - data)


# ---------------------------------------------------------------------------------------------- Llama-3-8B


def use_more_bits(i_layer: int, n_layers: int) -> bool:
    """llama-quant.cpp's rule for the layers Q4_K_M gives Q6_K in attn_v and ffn_down."""
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


# Meta-Llama-3-8B's metadata as llama.cpp's converter writes it (the same numbers as the vocabulary GGUF
# llama.cpp ships for it, models/ggml-vocab-llama-bpe.gguf, and as the model's config.json).
LLAMA3_8B = {".block_count": 32, ".context_length": 8192, ".embedding_length": 4096, ".feed_forward_length": 14336,
             ".attention.head_count": 32, ".attention.head_count_kv": 8, ".rope.freq_base": 500000.0,
             ".attention.layer_norm_rms_epsilon": 1e-5, ".vocab_size": 128256, ".rope.dimension_count": 128,
             "general.file_type": 15}


def llama3_8b_q4_k_m() -> list[tuple[str, list[int], GGMLQuantizationType]]:
    """Llama-3-8B's 291 tensors, typed as llama-quantize's Q4_K_M recipe types them (llama-quant.cpp
    `llama_tensor_get_type_impl`): Q4_K by default; output.weight Q6_K; attn_v and ffn_down Q6_K on the
    use_more_bits layers; the 1-d norms stay F32."""
    out = [("token_embd.weight", [4096, 128256], Q.Q4_K)]
    for i in range(32):
        more = Q.Q6_K if use_more_bits(i, 32) else Q.Q4_K
        out += [(f"blk.{i}.attn_norm.weight", [4096], Q.F32), (f"blk.{i}.attn_q.weight", [4096, 4096], Q.Q4_K),
                (f"blk.{i}.attn_k.weight", [4096, 1024], Q.Q4_K), (f"blk.{i}.attn_v.weight", [4096, 1024], more),
                (f"blk.{i}.attn_output.weight", [4096, 4096], Q.Q4_K), (f"blk.{i}.ffn_norm.weight", [4096], Q.F32),
                (f"blk.{i}.ffn_gate.weight", [4096, 14336], Q.Q4_K), (f"blk.{i}.ffn_up.weight", [4096, 14336], Q.Q4_K),
                (f"blk.{i}.ffn_down.weight", [14336, 4096], more)]
    return out + [("output_norm.weight", [4096], Q.F32), ("output.weight", [4096, 128256], Q.Q6_K)]


# ---------------------------------------------------------------------------------------------- raw bytes


def raw_string(text: str | bytes) -> bytes:
    data = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(data)) + data


def raw_header(n_tensors: int, n_kv: int, version: int = 3, magic: bytes = b"GGUF") -> bytes:
    return magic + struct.pack("<IQQ", version, n_tensors, n_kv)


def raw_kv(key: str, kind: int, payload: bytes) -> bytes:
    return raw_string(key) + struct.pack("<I", kind) + payload


def raw_tensor(name: str, dims: list[int], ggml_type: int, offset: int = 0) -> bytes:
    return raw_string(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, ggml_type, offset)


ARCH_LLAMA = raw_kv("general.architecture", 8, raw_string("llama"))


SCALAR_FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def raw_value(kind: int, value, sub: int | None = None) -> bytes:
    """A metadata value of GGUF type `kind` (an array of `sub` items for 9); integers are wrapped to the type's
    width, as a writer in another language would store them."""
    if kind == 8:
        return struct.pack("<I", 8) + raw_string(value)
    if kind == 9:
        items = b"".join(raw_value(sub, item)[4:] for item in value)
        return struct.pack("<IIQ", 9, sub, len(value)) + items
    fmt = SCALAR_FORMATS[kind]
    if fmt == "?":
        value = bool(value)
    elif fmt in "fd":
        value = float(value)
        value = math.copysign(math.inf, value) if fmt == "f" and abs(value) > 3.4e38 else value
    else:
        bits = 8 * struct.calcsize(fmt)
        value = int(value) % 2**bits
        if fmt.islower() and value >= 2 ** (bits - 1):
            value -= 2**bits
    return struct.pack("<I" + fmt, kind, value)


def raw_gguf(metadata: dict[str, tuple], tensors: list[tuple[str, list[int], int]],
             align: int = 32) -> tuple[bytes, int]:
    """A GGUF header by hand: metadata {key: (kind, value[, sub])}, tensors (name, dims, ggml type) laid out one
    after the other, each padded to `align`. Returns the header (padded) and the bytes of tensor data it
    declares, for the caller to append or leave a hole."""
    from kvplan.dtypes import GGML_TYPES

    kv = b"".join(raw_string(key) + raw_value(*value) for key, value in metadata.items())
    infos, offset = b"", 0
    for name, dims, ggml_type in tensors:
        infos += raw_tensor(name, dims, ggml_type, offset % 2**64)
        dtype = GGML_TYPES.get(ggml_type)
        size = dtype.bytes_for(math.prod(dims)) if dtype and dims and dims[0] % dtype.block_elements == 0 else 0
        offset += -(-size // align) * align
    head = raw_header(len(tensors), len(metadata)) + kv + infos
    return head + bytes(-len(head) % align), offset
