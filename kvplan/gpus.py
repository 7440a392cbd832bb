"""The GPU catalogue (`kvplan/data/gpus.json`): memory as the driver reports it, bandwidth, BF16 throughput.

Its fields:
    memory_bytes     total memory as the driver reports it (nvidia-smi's "MiB" column x 2**20, rocm-smi's "VRAM Total
                     Memory (B)"), not the marketing figure: an "80 GB" H100 reports 81,559 MiB = 79.6 GiB. For Apple
                     silicon, the unified memory, of which Metal lets the GPU wire `usable_fraction`
                     (recommendedMaxWorkingSetSize, as llama.cpp logs it: 3/4 of RAM on machines with 64 GB or more)
    bandwidth_gbs    memory bandwidth, GB/s (10**9 bytes)
    bf16_tflops      dense (no sparsity) BF16 tensor throughput, TFLOP/s; null where the part has no BF16 tensor path
                     or the vendor publishes none (the note says what there is)
    source           the datasheet for bandwidth and TFLOP/s; `reported`: where the memory figure comes from

It is JSON, which the standard library reads at once, so that planning on a GPU does not import a YAML parser.

Names resolve case-insensitively, ignoring spaces, hyphens and underscores, through each entry's name and
aliases (`h100`, `H100-80GB`, `"H100 80GB"`); an unknown name gets the closest ones.
"""

import difflib
import json
import re
from functools import cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kvplan.errors import KvplanError

CATALOGUE = Path(__file__).parent / "data" / "gpus.json"


class Gpu(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    name: str
    aliases: list[str] = []
    memory_bytes: int = Field(gt=0, description="total memory as the driver reports it")
    usable_fraction: float = Field(1.0, gt=0, le=1, description="share the GPU may use (unified memory)")
    reported: str
    bandwidth_gbs: float = Field(gt=0)
    bf16_tflops: float | None = Field(None, gt=0)
    source: str
    note: str = ""

    @property
    def usable_bytes(self) -> int:
        """Memory the GPU can use: memory_bytes x usable_fraction."""
        return int(self.memory_bytes * self.usable_fraction)


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
