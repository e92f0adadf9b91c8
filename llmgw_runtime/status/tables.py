"""The status screen's pieces of text: values as cells (numbers, durations, sizes), cells
as tables padded and clipped to the width, colour for a terminal, and lines fitted to it.

Pure, and shared: ``status/render.py`` lays the screen out with them; ``ctl``'s other
commands, its listings (``cli/output.py``) and the console write numbers, durations and
sizes as the screen does.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any

MIN_WIDTH = 60

COLOURS = {"red": "31", "yellow": "33", "green": "32", "dim": "2", "bold": "1"}
ANSI = re.compile(r"\x1b\[[0-9;]*m")
Paint = Callable[[str, str], str]


def painter(color: bool) -> Paint:
    """``paint(text, colour)``: ANSI colour on a terminal, the text unchanged otherwise."""
    if not color:
        return lambda text, _colour: text
    return lambda text, colour: f"\x1b[{COLOURS[colour]}m{text}\x1b[0m" if text else text


def number(n: int | float) -> str:
    return f"{n:,}"


def plural(n: int, word: str) -> str:
    return f"{number(n)} {word}" + ("" if n == 1 else "s")


def duration(seconds: float) -> str:
    """``-`` for unknown (negative), else ``45s``, ``12m``, ``3h05m``, ``2d04h``."""
    if seconds < 0:
        return "-"
    s = int(seconds)
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    if s < 172800:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def largest_unit(seconds: float) -> str:
    """``3 d``, ``5 h``, ``12 min``, ``40 s``: the largest whole unit (a key's expiry)."""
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{math.floor(seconds / size)} {unit}"
    return f"{math.ceil(seconds)} s"


def human_bytes(n: float | None) -> str:
    """``512 B``, ``1.2 GB``; ``-`` when unknown."""
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


def gigabytes(mb: float) -> str:
    return f"{mb / 1024:,.1f} GB"


def clip(text: str, width: int) -> str:
    text = " ".join(str(text).split())
    if width <= 0:
        return ""
    return text if len(text) <= width else text[:max(0, width - 1)] + "…"


def clip_painted(text: str, width: int) -> str:
    """Colour codes do not take room on screen; clip only text without them."""
    return text if "\x1b[" in text else clip(text, width)


def fit(line: str, width: int) -> str:
    """A line too wide even after its last column was clipped (a narrow terminal): cut,
    dropping its colour rather than cutting inside a colour code."""
    line = line.replace("\n", "\\x0a")     # one line stays one line
    plain = ANSI.sub("", line)
    return line if len(plain) <= width else plain[:width - 1] + "…"


def bar(used: int, unhealthy: int, total: int, width: int) -> str:
    """``[####!!.....]``: used ``#``, unhealthy ``!``, free ``.``."""
    if total <= 0 or width < 3:
        return ""
    inner = width - 2
    n_used = round(inner * used / total)
    n_bad = min(inner - n_used, round(inner * unhealthy / total))
    if unhealthy and not n_bad and n_used < inner:
        n_bad = 1
    return "[" + "#" * n_used + "!" * n_bad + "." * (inner - n_used - n_bad) + "]"


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str], width: int,
          paint: Paint | None = None, colour_of: Callable[[int, str], str | None] | None = None,
          indent: int = 2) -> list[str]:
    """Columns padded to fit; the last column is clipped so no line exceeds ``width``
    (the others keep their width: they hold names and numbers). ``colour_of(column,
    text)`` names a colour for a cell after padding, so colour never shifts columns."""
    cells = [[str(h) for h in headers]] + [["-" if c is None else str(c) for c in r]
                                           for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    fixed = indent + sum(widths[:-1]) + 2 * (len(widths) - 1)
    widths[-1] = max(1, min(widths[-1], width - fixed))
    out = []
    for n, row in enumerate(cells):
        parts = []
        for i, (cell, w) in enumerate(zip(row, widths, strict=True)):
            text = clip(cell, w) if i == len(widths) - 1 else cell.ljust(w)
            colour = colour_of(i, cell) if (colour_of and paint and n) else None
            if n == 0 and paint:
                text = paint(text, "bold")
            elif colour and paint:
                text = paint(text, colour)
            parts.append(text)
        out.append((" " * indent + "  ".join(parts)).rstrip())
    return out


def capped(rows: list[Any], cap: int, more: str) -> tuple[list[Any], str | None]:
    if len(rows) <= cap:
        return rows, None
    return rows[:cap], f"  ... and {number(len(rows) - cap)} more ({more})"
