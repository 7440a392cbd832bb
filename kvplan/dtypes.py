"""Storage formats for the KV cache and for weights, as blocks of elements stored in a whole number of bytes.

A format stores `block_elements` values in `block_bytes` bytes, so n values take ceil(n / block_elements) x
block_bytes bytes. Plain types are one-element blocks (bf16: 1 value in 2 bytes). Block-quantised types carry
their scales inside the block, which is where their overhead comes from:
- llama.cpp (ggml-common.h): q8_0 = 32 int8 + one fp16 scale = 34 bytes; q4_0 = 32 x 4 bit + fp16 scale = 18;
  q4_1 = + fp16 min = 20; q5_0 = 22; q5_1 = 24; iq4_nl = 18.
- AWQ/GPTQ-style int4 weights (group size 128): 128 x 4 bit + fp16 scale + 4-bit zero point
  = 64 + 2 + 0.5 bytes, i.e. 133 bytes per 256 weights (4.156 bits each).
- MXFP4 (OCP microscaling, used by gpt-oss): 32 x 4 bit + one 8-bit shared exponent = 17 bytes.
- NVFP4 (NVIDIA's, TensorRT Model Optimizer's export; Blackwell tensor cores): 16 x 4-bit E2M1 + one FP8 E4M3
  scale = 9 bytes, plus one fp32 scale per tensor (`weight_scale_2`), a few bytes a tensor, not counted.
- bitsandbytes NF4: 64 x 4 bit + one fp32 absmax = 36 bytes (no double quantisation).
fp8 and int8 KV caches keep per-tensor scales outside the pages (vLLM), so they count 1 byte per element.
"""

from typing import NamedTuple

from kvplan.errors import KvplanError


class DType(NamedTuple):
    name: str
    block_elements: int
    block_bytes: int
    about: str

    def bytes_for(self, elements: int) -> int:
        """Bytes to store `elements` values: whole blocks, rounded up."""
        return -(-elements // self.block_elements) * self.block_bytes  # integer ceiling: exact for any size

    @property
    def bits(self) -> float:
        return 8 * self.block_bytes / self.block_elements


def _table(*dtypes: DType) -> dict[str, DType]:
    return {d.name: d for d in dtypes}


FLOAT_DTYPES = _table(
    DType("fp32", 1, 4, "32-bit float"),
    DType("bf16", 1, 2, "bfloat16"),
    DType("fp16", 1, 2, "IEEE half"),
)
KV_DTYPES = FLOAT_DTYPES | _table(
    DType("fp8", 1, 1, "8-bit float (e4m3), per-tensor scales outside the cache"),
    DType("fp8_e4m3", 1, 1, "8-bit float e4m3"),
    DType("fp8_e5m2", 1, 1, "8-bit float e5m2"),
    DType("int8", 1, 1, "8-bit integer"),
    DType("int4", 2, 1, "4-bit integer, scales outside the cache"),
    DType("q8_0", 32, 34, "llama.cpp: 32 int8 + fp16 scale"),
    DType("q4_0", 32, 18, "llama.cpp: 32 x 4 bit + fp16 scale"),
    DType("q4_1", 32, 20, "llama.cpp: 32 x 4 bit + fp16 scale and min"),
    DType("q5_0", 32, 22, "llama.cpp: 32 x 5 bit + fp16 scale"),
    DType("q5_1", 32, 24, "llama.cpp: 32 x 5 bit + fp16 scale and min"),
    DType("iq4_nl", 32, 18, "llama.cpp: 32 x 4 bit non-linear + fp16 scale"),
)
WEIGHT_DTYPES = FLOAT_DTYPES | _table(
    DType("fp8", 1, 1, "8-bit float"),
    DType("int8", 1, 1, "8-bit integer (per-channel scales negligible)"),
    DType("int4", 256, 133, "AWQ/GPTQ 4-bit, group 128 with fp16 scale and 4-bit zero"),
    DType("mxfp4", 32, 17, "MXFP4: 32 x 4 bit + 8-bit shared exponent"),
    DType("nvfp4", 16, 9, "NVFP4: 16 x 4-bit E2M1 + FP8 E4M3 scale (per-tensor fp32 scale aside)"),
    DType("nf4", 64, 36, "bitsandbytes NF4: 64 x 4 bit + fp32 absmax"),
)

# Bits per element of each safetensors dtype (the `dtype` of a tensor in a safetensors header, as the
# safetensors crate names them). Packed quantised weights are stored in these too: AWQ/GPTQ pack eight 4-bit
# values into each I32, MXFP4 keeps two 4-bit values per U8 plus U8 (E8M0) scales, bitsandbytes packs into U8.
SAFETENSORS_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64, "C64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}

# ggml's tensor types, as a GGUF file's tensor infos number them (`enum ggml_type` in ggml/include/ggml.h), with
# each type's block: elements per block (`blck_size`) and bytes per block (`type_size`) from the type traits table
# in ggml/src/ggml.c, whose block structs' sizes ggml/src/ggml-common.h asserts (llama.cpp 0c1e57098b). A tensor
# of n elements takes n / block x bytes per block: ggml refuses a tensor whose rows are not whole blocks.
# QK_K = 256; the K-quants and most IQ types pack a 256-element super-block with its scales.
GGML_TYPES = {number: dtype for number, dtype in (
    (0, DType("F32", 1, 4, "32-bit float")),
    (1, DType("F16", 1, 2, "IEEE half")),
    (2, DType("Q4_0", 32, 18, "32 x 4 bit + fp16 scale")),
    (3, DType("Q4_1", 32, 20, "32 x 4 bit + fp16 scale and min")),
    (6, DType("Q5_0", 32, 22, "32 x 5 bit + fp16 scale")),
    (7, DType("Q5_1", 32, 24, "32 x 5 bit + fp16 scale and min")),
    (8, DType("Q8_0", 32, 34, "32 x 8 bit + fp16 scale")),
    (9, DType("Q8_1", 32, 36, "32 x 8 bit + fp16 scale and sum")),
    (10, DType("Q2_K", 256, 84, "2 fp16 + 16 scale bytes + 64 bytes of 2-bit quants")),
    (11, DType("Q3_K", 256, 110, "fp16 + 32 high-bit + 64 quant + 12 scale bytes")),
    (12, DType("Q4_K", 256, 144, "2 fp16 + 12 scale bytes + 128 bytes of 4-bit quants")),
    (13, DType("Q5_K", 256, 176, "2 fp16 + 12 scale + 32 high-bit + 128 quant bytes")),
    (14, DType("Q6_K", 256, 210, "128 low + 64 high quant bytes + 16 int8 scales + fp16")),
    (15, DType("Q8_K", 256, 292, "fp32 scale + 256 int8 + 16 int16 block sums")),
    (16, DType("IQ2_XXS", 256, 66, "fp16 + 32 uint16")),
    (17, DType("IQ2_XS", 256, 74, "fp16 + 32 uint16 + 8 scale bytes")),
    (18, DType("IQ3_XXS", 256, 98, "fp16 + 96 bytes")),
    (19, DType("IQ1_S", 256, 50, "fp16 + 32 quant bytes + 8 uint16")),
    (20, DType("IQ4_NL", 32, 18, "32 x 4 bit non-linear + fp16 scale")),
    (21, DType("IQ3_S", 256, 110, "fp16 + 64 quant + 8 high-bit + 32 sign + 4 scale bytes")),
    (22, DType("IQ2_S", 256, 82, "fp16 + 64 quant + 16 scale bytes")),
    (23, DType("IQ4_XS", 256, 136, "fp16 + uint16 + 4 + 128 bytes")),
    (24, DType("I8", 1, 1, "8-bit integer")),
    (25, DType("I16", 1, 2, "16-bit integer")),
    (26, DType("I32", 1, 4, "32-bit integer")),
    (27, DType("I64", 1, 8, "64-bit integer")),
    (28, DType("F64", 1, 8, "64-bit float")),
    (29, DType("IQ1_M", 256, 56, "32 quant + 16 + 8 scale bytes")),
    (30, DType("BF16", 1, 2, "bfloat16")),
    (34, DType("TQ1_0", 256, 54, "ternary: 48 + 4 bytes + fp16")),
    (35, DType("TQ2_0", 256, 66, "ternary: 64 bytes + fp16")),
    (39, DType("MXFP4", 32, 17, "32 x 4 bit + 8-bit shared exponent")),
    (40, DType("NVFP4", 64, 36, "64 x 4 bit + 4 fp8 scales")),
    (41, DType("Q1_0", 128, 18, "128 x 1 bit + fp16 scale")),
    (42, DType("Q2_0", 64, 18, "64 x 2 bit + fp16 scale")),
)}
GGML_BY_NAME = {dtype.name: dtype for dtype in GGML_TYPES.values()}

ALIASES = {
    "float32": "fp32", "f32": "fp32", "float": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16", "f16": "fp16", "half": "fp16",
    "float8": "fp8", "float8_e4m3fn": "fp8_e4m3", "e4m3": "fp8_e4m3", "float8_e5m2": "fp8_e5m2", "e5m2": "fp8_e5m2",
}


def kv_dtype(name: str) -> DType:
    return _lookup(name, KV_DTYPES, "KV cache dtype")


def weight_dtype(name: str) -> DType:
    return _lookup(name, WEIGHT_DTYPES, "weights dtype")


def _lookup(name: str, table: dict[str, DType], what: str) -> DType:
    if name in table:  # a canonical name, as kvplan passes them on
        return table[name]
    key = ALIASES.get(name.strip().lower(), name.strip().lower())
    if key not in table:
        raise KvplanError(f"unknown {what} {name!r}: valid ones are {', '.join(table)}")
    return table[key]
