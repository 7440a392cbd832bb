"""What the oracle scripts report of the machine they ran on."""


def cpu_flags() -> str:
    """The CPU features that change what the engines' CPU builds do (AVX-512 and AVX512-BF16 paths, AMX)."""
    try:
        flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return "unknown"
    return ", ".join(f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags) or "none of note"
