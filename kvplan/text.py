"""Text from outside (config fields, file names, Hub answers, error values) made safe to show: control and format
characters escaped, so that a model name cannot move the cursor, clear the screen or set the terminal title, and
long values shortened, so that an error stays one readable line. Markup is never parsed: reports print through a
rich Console with markup off (`kvplan.report`)."""

import unicodedata

SHORT = 80  # characters of a bad value quoted in an error
LINE = 1000  # characters of an error line at most


def plain(text: object) -> str:
    """`text` with every control, format or unassigned character (ESC, CR, BEL, bidi overrides) written as an
    escape (\\x1b, \\u202e), so it is shown, not obeyed."""
    text = str(text)
    if text.isprintable():  # no character of category C (nor a separator but the space): nothing to escape
        return text
    out = []
    for char in text:
        if unicodedata.category(char)[0] == "C":
            code = ord(char)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
        else:
            out.append(char)
    return "".join(out)


def shorten(text: str, limit: int = SHORT) -> str:
    """At most `limit` characters: the start, an ellipsis and how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit:,} more characters)"


def brief(value: object) -> str:
    """A bad value as an error quotes it: its repr, safe and short."""
    return shorten(plain(repr(value)))


def narrow(widths: list[int], floors: list[int], excess: int) -> list[int]:
    """Column widths with `excess` cells taken off, one at a time from the column with the most to give (its width
    less its floor), none below its floor: tables at a terminal's width (`kvplan.report`, `kvplan.tables`)."""
    widths = list(widths)
    for _ in range(excess):
        room, index = max((width - floor, i) for i, (width, floor) in enumerate(zip(widths, floors, strict=True)))
        if room <= 0:
            break
        widths[index] -= 1
    return widths
