"""Tables and JSON for listing commands (every listing has ``-o json``).

A table is fitted to the terminal's width like ``ctl status``: a column that would not fit
wraps its text onto the following lines of its row (between words; a word longer than the
column is broken, never cut). Width goes to the columns that need it: a column with no
values and the ``optional`` ones go first when the table is too wide, every column keeps
its longest word before the last column (a reason, an error, a message) gives up more
than a quarter of the line, and only then are words broken. Pure: ``table`` and
``layout``; the full text is also in ``-o json``."""

from __future__ import annotations

import json
import shutil
import textwrap
import time
from collections.abc import Sequence
from typing import Any

import click

from ..status.tables import MIN_WIDTH, fit

GAP = 2           # spaces between columns
EMPTY = ("", "-")  # what a cell without a value shows


def terminal_width() -> int:
    """The terminal's width (``COLUMNS`` first), as ``ctl status`` reads it."""
    return shutil.get_terminal_size((100, 40)).columns


def emit(data: Any, rows: Sequence[Sequence[Any]], headers: Sequence[str], fmt: str,
         width: int | None = None, optional: Sequence[int] = ()) -> None:
    """``-o json``: ``data`` as is; else ``rows`` as a table fitted to ``width`` (the
    terminal's), dropping the ``optional`` columns (in that order) when it is narrow."""
    if fmt == "json":
        click.echo(json.dumps(data, indent=2, sort_keys=False))
        return
    click.echo(table(rows, headers, terminal_width() if width is None else width, optional))


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str], width: int = 100,
          optional: Sequence[int] = ()) -> str:
    """The rows under their headers in lines of at most ``max(width, 60)`` characters,
    a cell's text wrapped onto as many lines as its row needs (``layout``)."""
    width = max(width, MIN_WIDTH)
    cells = [["-" if c is None else " ".join(str(c).split()) for c in row] for row in rows]
    heads = [" ".join(str(h).split()) for h in headers]
    columns = [[heads[i], *(row[i] for row in cells)] for i in range(len(heads))]
    keep, widths = layout([longest_word(h) for h in heads],
                          [max(map(len, col)) for col in columns],
                          [max(map(longest_word, col)) for col in columns],
                          [all(c in EMPTY for c in col[1:]) for col in columns],
                          width, optional)
    lines: list[str] = []
    for row in [heads, *cells]:
        lines += row_lines([row[i] for i in keep], widths)
    return "\n".join(fit(line, width) for line in lines)


def longest_word(text: str) -> int:
    return max((len(w) for w in text.split()), default=0)


def wrap(text: str, width: int) -> list[str]:
    """``text`` in lines of at most ``width``, broken between words; a longer word is
    broken inside (nothing is cut). At least one line."""
    return textwrap.wrap(text, max(1, width), break_on_hyphens=False) or [""]


def row_lines(cells: Sequence[str], widths: Sequence[int]) -> list[str]:
    """One row as lines: each cell wrapped to its column, the columns side by side."""
    wrapped = [wrap(c, w) for c, w in zip(cells, widths, strict=True)]
    height = max(len(w) for w in wrapped)
    return [(" " * GAP).join((w[n] if n < len(w) else "").ljust(widths[i])
                             for i, w in enumerate(wrapped)).rstrip()
            for n in range(height)]


MIN_LAST = 20     # the last column (a reason, an error) keeps at least this, or a quarter


def layout(header_words: Sequence[int], natural: Sequence[int], words: Sequence[int],
           empty: Sequence[bool], width: int, optional: Sequence[int] = ()
           ) -> tuple[list[int], list[int]]:
    """Which columns to show and how wide, so that a line fits in ``width``. Per column:
    its header's longest word, its widest cell (header included: ``natural``), its longest
    word (``words``) and whether it has no value (``empty``). While the table is wider than
    ``width`` with the last column at ``min(its width, max(20, width // 4))``: the empty
    columns are dropped, then the ``optional`` ones in order. Then, while too wide, the
    last column narrows to that, then the others to their longest word (widest margin
    first: text wraps between words), then the last one to its longest word, then words
    are broken (widest column first, none below its header's longest word). Pure: lengths
    in. Returns (the columns kept, their widths)."""
    n = len(natural)
    last = n - 1
    last_min = min(natural[last], max(MIN_LAST, width // 4))

    def needed(cols: list[int]) -> int:
        return (sum(natural[c] for c in cols if c != last) + GAP * (len(cols) - 1)
                + (last_min if last in cols else 0))

    keep = list(range(n))
    for col in [c for c in range(n) if empty[c]] + list(optional):
        if needed(keep) <= width:
            break
        if (col != last or empty[col]) and col in keep and len(keep) > 1:
            keep.remove(col)
    widths = {c: natural[c] for c in keep}
    over = sum(widths.values()) + GAP * (len(keep) - 1) - width

    def narrow(cols: Sequence[int], floor: dict[int, int]) -> None:
        nonlocal over
        while over > 0:
            col = max(cols, key=lambda c: (widths[c] - floor[c], widths[c]), default=None)
            if col is None or widths[col] <= floor[col]:
                return
            widths[col] -= 1
            over -= 1

    others = [c for c in keep if c != last]
    tail = [last] if last in keep else []
    word = {c: max(words[c], header_words[c], 1) for c in keep}
    narrow(tail, {last: max(last_min, word.get(last, 1))})
    narrow(others, word)
    narrow(tail, word)
    narrow(keep, {c: max(header_words[c], 1) for c in keep})
    return keep, [widths[c] for c in keep]


def ago(when: float | None, now: float | None = None) -> str:
    if not when:
        return "-"
    secs = max(0, int((now or time.time()) - when))
    if secs < 120:
        return f"{secs}s ago"
    if secs < 7200:
        return f"{secs // 60}m ago"
    return f"{secs // 3600}h ago"


def output_option(fn: Any) -> Any:
    return click.option("-o", "--output", "fmt", type=click.Choice(["table", "json"]),
                        default="table", show_default=True, help="output format")(fn)
