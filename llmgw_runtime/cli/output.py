"""Tables and JSON for listing commands (every listing has ``-o json``).

A table is one line per row, fitted to the terminal's width like ``ctl status`` (the
helpers of ``status.render``): the last column (a reason, an error, a message) is clipped,
and a line still too wide on a narrow terminal is cut. The full text is in ``-o json``."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Sequence
from typing import Any

import click

from ..status.render import MIN_WIDTH, clip, fit
from ..status.render import table as render_table


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
    """Every row on one line of at most ``max(width, 60)`` characters (``layout``)."""
    width = max(width, MIN_WIDTH)
    cells = [["-" if c is None else " ".join(str(c).split()) for c in row] for row in rows]
    keep, limits = layout([len(h) for h in headers],
                          [[len(c) for c in row] for row in cells], width, optional)
    shown = [[clip(row[i], limits.get(i, len(row[i]))) for i in keep] for row in cells]
    return "\n".join(fit(line, width) for line in
                     render_table(shown, [headers[i] for i in keep], width, indent=0))


MIN_LAST = 20     # the last column (a reason, an error) keeps at least this much, or a quarter


def layout(header_widths: Sequence[int], rows: Sequence[Sequence[int]], width: int,
           optional: Sequence[int] = ()) -> tuple[list[int], dict[int, int]]:
    """Which columns to show and the widths to clip some to, so that a line fits in
    ``width`` and the last column keeps ``min(its own width, max(20, width // 4))``:
    first the ``optional`` columns are dropped, in order, while it does not fit; then the
    widest columns are narrowed, none below its header (or 8). Pure: lengths in.
    Returns (the columns kept, {column: width} for the narrowed ones)."""
    n = len(header_widths)
    widths = [max([header_widths[i], *(r[i] for r in rows)]) for i in range(n)]
    last = n - 1
    last_min = min(widths[last], max(MIN_LAST, width // 4))

    def needed(cols: list[int]) -> int:
        return sum(widths[c] for c in cols if c != last) + 2 * (len(cols) - 1) + last_min

    keep = list(range(n))
    for col in optional:
        if needed(keep) <= width:
            break
        if col != last and col in keep:
            keep.remove(col)
    floors = {c: max(8, header_widths[c]) for c in keep if c != last}
    limits: dict[int, int] = {}
    while needed(keep) > width and floors:
        col = max(floors, key=lambda c: widths[c] - floors[c])
        if widths[col] <= floors[col]:
            break                     # a very narrow terminal: fit() cuts the line
        widths[col] -= 1
        limits[col] = widths[col]
    return keep, limits


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
