"""The GPU catalogue (`kvplan/data/gpus.json`): memory as the driver reports it, bandwidth, tensor throughput by
dtype, NVLink.

Its fields:
    vendor              nvidia, amd or apple: engines' defaults differ by platform (CUDA, ROCm, Metal)
    memory_bytes        total memory as the driver reports it (nvidia-smi's "MiB" column x 2**20, rocm-smi's "VRAM
                        Total Memory (B)"), not the marketing figure: an "80 GB" H100 reports 81,559 MiB = 79.6 GiB.
                        For Apple silicon, the unified memory, of which Metal lets the GPU use `usable_fraction`: its
                        recommendedMaxWorkingSetSize, which llama.cpp logs at start-up ("ggml_metal_init:
                        recommendedMaxWorkingSetSize = ... MB", MB = 10**6 bytes; logs before 2024 printed MiB).
                        Values published in llama.cpp logs follow one rule: 2/3 of RAM up to 32 GB (16 GB: 11,453.25
                        MB, 24 GB: 17,179.89 MB, 32 GB: 21,845.34 MiB), 3/4 from 36 GB (36 GB: 28,991.03 MB, 48 GB:
                        38,654.71 MB, 64 GB: 51,539.61 MB, 96 GB: 73,728.00 MiB). Entries are listed only for memory
                        sizes with a published value; macOS 26 reports more on some machines (128 GB: 107.52 GiB) and
                        `sudo sysctl iogpu.wired_limit_mb=N` raises it: give --vram with the figure your own llama.cpp
                        log shows.
    bandwidth_gbs       memory bandwidth, GB/s (10**9 bytes)
    bf16_tflops         dense (no sparsity) BF16 tensor throughput, TFLOP/s; null where the part has no BF16 tensor
                        path or the vendor publishes none (the note says what there is)
    fp8_tflops          dense FP8 (E4M3) tensor throughput, TFLOP/s; null where there is none or none is given
    fp4_tflops          dense FP4 tensor throughput (NVFP4 and MXFP4 on Blackwell), TFLOP/s; null likewise.
                        Datasheets give these "with sparsity" (2:4 structured) beside or instead of dense: the
                        catalogue keeps the dense figure, half the sparse one, which is what a model's GEMMs can use
    nvlink_gbs          NVLink bandwidth of one GPU, GB/s, both directions together as NVIDIA states it (H100 SXM 900,
                        Blackwell 1,800); null for a GPU without NVLink
    nvlink_gpus         how many GPUs one NVLink domain joins: 8 on an HGX board, 72 in an NVL72 rack, 2 for NVLink
                        bridges of PCIe cards. Grace-Blackwell entries (GB200, GB300) are one GPU of a superchip (a
                        Grace CPU and two GPUs), every figure per GPU
    source              the datasheet for bandwidth and TFLOP/s; `reported`: where the memory figure comes from
    compute_capability  NVIDIA GPUs' CUDA compute capability, major.minor (https://developer.nvidia.com/cuda-gpus):
                        engines choose kernels by it (vLLM's Gated DeltaNet prefill: FlashInfer on 9.0, 10.x, 12.x)

It is JSON, which the standard library reads at once, so that planning on a GPU does not import a YAML parser.

Names resolve case-insensitively, ignoring spaces, hyphens and underscores, through each entry's name and
aliases (`h100`, `H100-80GB`, `"H100 80GB"`); an unknown name gets the closest ones.
"""

import difflib
import json
import re
from functools import cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from kvplan.errors import KvplanError

CATALOGUE = Path(__file__).parent / "data" / "gpus.json"
PAGE = 16 << 10  # Apple silicon's memory page


class Gpu(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    name: str
    vendor: Literal["nvidia", "amd", "apple"] = Field(description="whose GPU: engines' defaults differ by platform "
                                                      "(CUDA, ROCm, Metal)")
    aliases: list[str] = []
    memory_bytes: int = Field(gt=0, description="total memory as the driver reports it")
    usable_fraction: float = Field(1.0, gt=0, le=1, description="share the GPU may use (unified memory)")
    reported: str
    bandwidth_gbs: float = Field(gt=0)
    bf16_tflops: float | None = Field(None, gt=0)
    fp8_tflops: float | None = Field(None, gt=0)
    fp4_tflops: float | None = Field(None, gt=0)
    nvlink_gbs: float | None = Field(None, gt=0)
    nvlink_gpus: int | None = Field(None, ge=2)
    source: str
    note: str = ""
    compute_capability: str | None = Field(None, pattern=r"^\d{1,2}\.\d$", description="NVIDIA's CUDA compute "
                                           "capability, major.minor (NVIDIA GPUs only): engines pick kernels by it")

    @model_validator(mode="after")
    def nvidia_only_capability(self) -> "Gpu":
        if (self.vendor == "nvidia") != (self.compute_capability is not None):
            raise ValueError(f"{self.name}: an NVIDIA GPU, and only an NVIDIA GPU, gives its compute_capability")
        return self

    @property
    def usable_bytes(self) -> int:
        """Memory the GPU can use: memory_bytes x usable_fraction, for a share (Metal's
        recommendedMaxWorkingSetSize) rounded up to whole 16 KiB pages, as the values llama.cpp logs are
        (32 GiB x 2/3 = 21,845.333 MiB; logged 21,845.34 MiB)."""
        if self.usable_fraction == 1:
            return self.memory_bytes
        return -(-int(self.memory_bytes * self.usable_fraction) // PAGE) * PAGE


@cache  # a sweep asks for the same few names once per model and GPU
def _key(name: str) -> str:
    return re.sub(r"[\s_\-]+", "", name.strip().lower())


@cache
def catalogue() -> tuple[Gpu, ...]:
    try:
        data = json.loads(CATALOGUE.read_text(encoding="utf-8"))
        return tuple(Gpu(**item) for item in data["gpus"])
    except (OSError, ValueError, ValidationError, KeyError, TypeError) as err:
        raise KvplanError(f"{CATALOGUE}: the GPU catalogue is broken: {err}".splitlines()[0]) from None


@cache
def _by_key() -> dict[str, Gpu]:
    return {_key(name): gpu for gpu in catalogue() for name in (gpu.name, *gpu.aliases)}


GPU_SET = re.compile(r"^\s*(\d{1,5})\s*[x×*]\s*(.+)$", re.IGNORECASE)
MAX_GPUS = 4096


def count_and_name(text: str) -> tuple[int | None, str]:
    """`4xh100`, `4 x H100`, `8×b200` -> (4, "h100"), ...; a plain name -> (None, name)."""
    match = GPU_SET.match(text)
    if match is None:
        return None, text
    count = int(match.group(1))
    if not 1 <= count <= MAX_GPUS:
        raise KvplanError(f"{text!r}: a GPU count must be between 1 and {MAX_GPUS:,}")
    return count, match.group(2)


def find(name: str) -> Gpu:
    """The GPU called `name` (or one of its aliases), or a KvplanError naming the closest ones."""
    gpu = _by_key().get(_key(name))
    if gpu is not None:
        return gpu
    keys, wanted = _by_key(), _key(name)
    close = [k for k in keys if wanted and wanted in k]
    close += difflib.get_close_matches(wanted, keys, n=8, cutoff=0.5)
    names = list(dict.fromkeys(keys[k].name for k in close))[:3]
    hint = f"; closest: {', '.join(names)}" if names else ""
    raise KvplanError(f"unknown GPU {name!r}{hint} (`kvplan gpus` lists them; --vram 24GiB for any other)")


def vendor(name: str) -> str | None:
    """The vendor of the catalogue GPU called `name` (nvidia, amd, apple), None for a name not in it."""
    gpu = _by_key().get(_key(name))
    return gpu.vendor if gpu else None


def compute_capability(name: str) -> tuple[int, int] | None:
    """(major, minor) CUDA compute capability of the catalogue GPU called `name`; None for other vendors and names
    not in the catalogue."""
    gpu = _by_key().get(_key(name))
    if gpu is None or gpu.compute_capability is None:
        return None
    major, minor = gpu.compute_capability.split(".")
    return int(major), int(minor)
