"""Parsing and formatting of token counts and byte sizes.

Token counts use the model-card convention: k = 1,024 and M = 1,048,576 (`8k` = 8,192, `128K` = 131,072).
Byte sizes are printed in binary units (KiB, MiB, GiB = 2**30) unless decimal ones are asked for by name.
"""

import re
from fractions import Fraction

from kvplan.errors import KvplanError
from kvplan.text import brief

TOKEN_SUFFIXES = {"": 1, "k": 1024, "m": 1024**2}
BYTE_UNITS = {
    "": 1, "b": 1,
    "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}
MAX_TOKENS = 2**53  # as config fields are bounded (`Fields.int`): far past any model, and exact as a float
MAX_BYTES = 2**60  # an exbibyte: more memory than any GPU set has
_NUMBER = re.compile(r"^\s*([0-9]{1,30})(?:\.([0-9]{1,30}))?\s*([a-zA-Z]{0,3})\s*$")


def _exact(text: str, units: dict[str, int]) -> tuple[Fraction, str] | None:
    """`1.5k` -> (Fraction(1536), "k"): the number times its unit, exactly (no float round trip), or None when
    the text is not a number with one of `units`. ASCII digits only, at most 30 of them either side."""
    match = _NUMBER.match(text) if text.isascii() else None
    if not match or match.group(3).lower() not in units:
        return None
    whole, fraction, unit = match.groups()
    value = Fraction(int(whole + (fraction or "")), 10 ** len(fraction or ""))
    return value * units[unit.lower()], unit


def parse_tokens(text: str | int, what: str = "ctx") -> int:
    """`8192`, `8k`, `128K`, `1M`, `1.5k` -> tokens (k = 1,024, M = 1,048,576): a whole, positive count up to
    MAX_TOKENS."""
    parsed = _exact(str(text), TOKEN_SUFFIXES)
    if parsed is None:
        raise KvplanError(f"--{what} {brief(text)} is not a token count: use a number like 8192, 8k, 128K or 1M")
    tokens, _ = parsed
    if tokens.denominator != 1:
        raise KvplanError(f"--{what} {brief(text)} is not a whole number of tokens ({float(tokens):g})")
    if tokens <= 0:
        raise KvplanError(f"--{what} must be at least 1 token, got {brief(text)}")
    if tokens > MAX_TOKENS:
        raise KvplanError(f"--{what} {brief(text)} is more tokens than any model holds (at most {MAX_TOKENS:,})")
    return int(tokens)


def parse_bytes(text: str, what: str, allow_zero: bool = False) -> int:
    """`24GiB`, `80GB`, `512MiB`, `64.68GiB`, `1073741824` -> bytes: GB is 10**9 and GiB 2**30, as written; a plain
    number is bytes. A size in a unit above a byte is rounded down to a whole byte, as the engines round the sizes
    they are given (vLLM keeps int(GiB x 2**30) bytes: `parse_gib`); a count of bytes must be whole. Up to
    MAX_BYTES; 0 only where `allow_zero`."""
    parsed = _exact(str(text), BYTE_UNITS)
    if parsed is None:
        raise KvplanError(f"{what} {brief(text)} is not a size: use a number with a unit, like 24GiB, 80GB or 512MiB")
    size, unit = parsed
    if size.denominator != 1 and BYTE_UNITS[unit.lower()] == 1:
        raise KvplanError(f"{what} {brief(text)} is not a whole number of bytes")
    size = size.numerator // size.denominator
    if size < 0 or (size == 0 and not allow_zero):
        raise KvplanError(f"{what} must be more than 0 bytes, got {brief(text)}")
    if size > MAX_BYTES:
        raise KvplanError(f"{what} {brief(text)} is more memory than any GPU set has (at most 1 EiB)")
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


def format_figure(value: float) -> str:
    """A time or a rate to three significant figures or more, whole from 100: 0.52, 5.50, 21.4, 886, 1,234."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def parse_gib(text: str, what: str) -> int:
    """A size as vLLM's --kv-offloading-size and --cpu-offload-gb take it, GiB as a plain number (`64`, `2.5`; vLLM
    keeps int(value x 2**30) bytes), or with a unit (`64GiB`, `80GB`) -> bytes; 0 allowed (nothing offloaded)."""
    plain_number = _exact(str(text), {"": 1})
    if plain_number is not None:
        size = plain_number[0] * 2**30
        if size > MAX_BYTES:
            raise KvplanError(f"{what} {brief(text)} GiB is more memory than any host has (at most 1 EiB)")
        return int(size)
    return parse_bytes(text, what, allow_zero=True)
