"""Parsing and formatting of token counts and byte sizes.

Token counts use the model-card convention: k = 1,024 and M = 1,048,576 (`8k` = 8,192, `128K` = 131,072).
Byte sizes are printed in binary units (KiB, MiB, GiB = 2**30) unless decimal ones are asked for by name.
"""

import re

from kvplan.errors import KvplanError
from kvplan.text import brief

TOKEN_SUFFIXES = {"": 1, "k": 1024, "m": 1024**2}
BYTE_UNITS = {
    "b": 1,
    "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}
_TOKENS = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmM]?)\s*$")
_BYTES = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_tokens(text: str | int, what: str = "ctx") -> int:
    """`8192`, `8k`, `128K`, `1M`, `1.5k` -> tokens (k = 1,024, M = 1,048,576); must be a positive whole count."""
    match = _TOKENS.match(str(text))
    if not match:
        raise KvplanError(f"--{what} {brief(text)} is not a token count: use a number like 8192, 8k, 128K or 1M")
    tokens = float(match.group(1)) * TOKEN_SUFFIXES[match.group(2).lower()]
    if tokens != int(tokens):
        raise KvplanError(f"--{what} {brief(text)} is not a whole number of tokens ({tokens:g})")
    if tokens <= 0:
        raise KvplanError(f"--{what} must be at least 1 token, got {brief(text)}")
    return int(tokens)


def parse_bytes(text: str, what: str) -> int:
    """`24GiB`, `80GB`, `512MiB`, `1073741824` -> bytes. GB is 10**9 and GiB 2**30, as written."""
    match = _BYTES.match(str(text))
    unit = match.group(2).lower() if match else ""
    if not match or unit not in BYTE_UNITS:
        raise KvplanError(f"{what} {brief(text)} is not a size: use a number with a unit, like 24GiB, 80GB or 512MiB")
    size = float(match.group(1)) * BYTE_UNITS[unit]
    if size <= 0:
        raise KvplanError(f"{what} must be more than 0 bytes, got {brief(text)}")
    return int(size)


def format_bytes(n: int | float, decimal: bool = False) -> str:
    """Human size in binary units (GiB = 2**30) or, with decimal=True, SI units (GB = 10**9)."""
    if decimal:
        base, units = 1000, ["B", "kB", "MB", "GB", "TB", "PB"]
    else:
        base, units = 1024, ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]
    value = float(n)
    for unit in units:
        if abs(value) < base or unit == units[-1]:
            return f"{int(value):,} B" if unit == "B" else f"{value:,.2f} {unit}"
        value /= base
    raise AssertionError("unreachable")
