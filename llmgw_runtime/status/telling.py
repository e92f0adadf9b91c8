"""The one line of an engine's output that says why it failed.

An engine that exits early prints its cause somewhere in its last lines, and the last line
is often noise after it (a usage listing, "exiting due to ...", "please check the input
params", a stack frame). ``telling_line`` picks the line an operator needs, for every
one-line view: ``ctl status``'s parked table, ``ctl models``/``replicas``/``events`` and the
console. The full text stays in ``-o json``. Pure.
"""
from __future__ import annotations

import re

# Most telling first: the first pattern that matches some line wins; among lines matching
# it, the last one (the newest) is taken.
TELLING = (
    # arguments the engine refused (argparse, llama-server, vLLM)
    re.compile(r"unsupported (argument|flag|option)s?|unrecognized (argument|option)s?"
               r"|unknown (argument|option|flag)|invalid (argument|choice|int value)"
               r"|cannot be given again|is set by the agent", re.I),
    # a concrete cause
    re.compile(r"out of memory|\boom\b|cannot allocate|failed to allocate|no such file"
               r"|not found|permission denied|address already in use|couldn.t bind"
               r"|could not bind|invalid magic"
               r"|corrupt|not within the file bounds|unknown model architecture"
               r"|no module named|cuda error|no cuda|no device|\bkilled\b", re.I),
    # an error naming what failed
    re.compile(r"\berror loading\b|\b[A-Z]\w*(Error|Exception): |\berror: |\bfatal\b", re.I),
    # any failure word
    re.compile(r"\b(error|failed|failure|cannot|can.t|could not|couldn.t|unable|invalid"
               r"|denied)\b", re.I),
    re.compile(r"\b(exception|traceback|abort|panic|exited with)\b", re.I),
)
# Lines that are never the cause however they read: listings, stack frames, the agent's
# own start marker (it holds the command line), and generic words after the cause.
NOISE = re.compile(r"^\s*(supported flags:|usage:|at\s|File \"|---\s*llmgw:|Traceback \()"
                   r"|exiting due to|please check the input params|cleaning up before exit"
                   r"|the CPU engine accepts ", re.I)
# llama.cpp's log prefix: "0.00.019.557 E " (time and level).
LOG_PREFIX = re.compile(r"^\d+(\.\d+){3}\s+[A-Z]\s+")


def lines_of(text: str | None) -> list[str]:
    """The non-blank lines of ``text`` without llama.cpp's log prefix, each run of spaces
    made one."""
    return [LOG_PREFIX.sub("", " ".join(line.split())) for line in (text or "").splitlines()
            if line.strip()]


def telling_line(text: str | None) -> str:
    """The line of ``text`` that best says what went wrong; ``-`` for no text.

    A message that the agent prefixed ("engine exited with code 2; last log lines:")
    keeps its first clause in front when the telling line comes from the log tail, so
    the operator sees both what happened and why."""
    lines = lines_of(text)
    if not lines:
        return "-"
    head = lines[0]
    tail = lines[1:] if head.endswith("last log lines:") else lines
    candidates = [line for line in tail if not NOISE.search(line)]
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


def error_line(text: str | None, limit: int) -> str | None:
    """An error as one-line views and answers carry it (the routes table, the router's
    refusals): the telling line of ``text``, printable, at most ``limit`` characters;
    None for no text. Applied again to its own result, it gives that result."""
    if not text or not text.strip():
        return None
    line = _UNPRINTABLE.sub("?", telling_line(text))
    return line if len(line) <= limit else line[:limit - 1] + "…"


_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
