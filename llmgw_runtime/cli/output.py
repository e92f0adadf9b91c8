"""Tables and JSON for listing commands (every listing has ``-o json``)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import click


def emit(data: Any, rows: Sequence[Sequence[Any]], headers: Sequence[str], fmt: str) -> None:
    if fmt == "json":
        click.echo(json.dumps(data, indent=2, sort_keys=False))
        return
    click.echo(table(rows, headers))


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> str:
    cells = [[str(h) for h in headers]] + [["-" if c is None else str(c) for c in r]
                                           for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
             for row in cells]
    return "\n".join(lines)


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
