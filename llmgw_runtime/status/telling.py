"""The one line of an engine's output that says why it failed.

An engine that exits early prints its cause somewhere in its last lines, and the last line
is often noise after it (a usage listing, "exiting", a stack frame). ``telling_line`` picks
the line an operator needs, for every one-line view: ``ctl status``'s parked table,
``ctl models``/``replicas``/``events`` and the console. The full text stays in ``-o json``.
"""
from __future__ import annotations

import re

# Most telling first: the first pattern that matches some line wins; among lines matching
# it, the last one (the newest) is taken.
TELLING = (
    re.compile(r"unsupported (argument|flag|option)s?|unrecognized argument"
               r"|unknown (argument|option|flag)", re.I),
    re.compile(r"\b(error|fatal|failed|failure|cannot|can.t|could not|unable|not found"
               r"|no such|invalid|denied|out of memory|oom)\b", re.I),
    re.compile(r"\b(exception|traceback|abort|panic|killed|exited with)\b", re.I),
)
# Lines that are never the cause however they read.
NOISE = re.compile(r"^\s*(supported flags:|usage:|\s*at\s|File \")", re.I)


def lines_of(text: str | None) -> list[str]:
    return [line.strip() for line in (text or "").splitlines() if line.strip()]


def telling_line(text: str | None) -> str:
    """The line of ``text`` that best says what went wrong; ``-`` for no text.

    A message that the agent prefixed ("start failed: exited with 2; last log lines:")
    keeps its first clause in front when the telling line comes from the log tail, so
    the operator sees both what happened and why."""
    lines = lines_of(text)
    if not lines:
        return "-"
    head = lines[0]
    candidates = [line for line in lines[1:] if not NOISE.match(line)]
    for pattern in TELLING:
        hits = [line for line in candidates if pattern.search(line)]
        if hits:
            return _with_head(head, hits[-1])
    if candidates:
        return _with_head(head, candidates[-1])
    return head


def _with_head(head: str, line: str) -> str:
    prefix = head.split("; last log lines:")[0].rstrip(":; ")
    if head.endswith("last log lines:") and prefix and prefix != line:
        return f"{prefix}: {line}"
    return line
