"""How ``llmgw up`` keeps its children running: a pure restart policy (when a child exited,
how long it ran and how often it failed in a row decide the delay and the one line shown),
and a thin shell that watches the processes, prints that line and starts them again.

The policy reads no clock: the shell passes the times. A child that ran for at least
``reset_after_s`` counts as healthy, so its next failure starts the backoff from the first
delay again; quick failures in a row double the delay up to ``max_delay_s``.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from ..text import printable


@dataclass(frozen=True)
class RestartPolicy:
    """Backoff for a child that exits: ``first_delay_s`` doubling to ``max_delay_s``,
    back to ``first_delay_s`` after a run of at least ``reset_after_s``."""

    first_delay_s: float = 1.0
    max_delay_s: float = 30.0
    reset_after_s: float = 60.0
    tail_lines: int = 3          # log lines quoted in the message
    tail_chars: int = 160        # each cut to this length


@dataclass(frozen=True)
class Restart:
    """What to do about one exit: wait ``delay_s``, then start the child again; its
    quick-failure count is now ``failures``; ``message`` is the line for the terminal."""

    delay_s: float
    failures: int
    message: str


def exit_status(returncode: int) -> str:
    """``exited with code 1``, or ``was killed by SIGKILL (-9)`` for a negative return code
    (subprocess's way of saying a signal ended the process)."""
    if returncode >= 0:
        return f"exited with code {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    return f"was killed by {name} ({returncode})"


def _quote_tail(lines: Iterable[str], policy: RestartPolicy) -> str:
    kept = [printable(line.strip()) for line in lines if line.strip()][-policy.tail_lines:]
    if not kept:
        return "its log of this run is empty"
    cut = [line if len(line) <= policy.tail_chars else line[:policy.tail_chars - 3] + "..."
           for line in kept]
    return "last log lines: " + " | ".join(cut)


def decide_restart(policy: RestartPolicy, name: str, returncode: int, started: float,
                   exited: float, failures: int, log_tail: Iterable[str]) -> Restart:
    """The restart of child ``name`` that ran from ``started`` to ``exited`` (seconds on
    one clock) and had failed ``failures`` times in a row before; ``log_tail`` is what it
    wrote to its log during this run only. The message is one line."""
    ran = max(0.0, exited - started)
    previous = 0 if ran >= policy.reset_after_s else max(0, failures)
    delay = min(policy.max_delay_s, policy.first_delay_s * 2.0 ** min(previous, 30))
    message = (f"llmgw: the {name} {exit_status(returncode)} after {ran:.0f} s; "
               f"restarting it in {delay:g} s; {_quote_tail(log_tail, policy)}")
    return Restart(delay_s=delay, failures=previous + 1, message=message)


def log_since(path: Path, offset: int, max_bytes: int = 65536) -> list[str]:
    """The lines written to ``path`` after byte ``offset`` (its size when the child
    started: logs are appended across runs), at most the last ``max_bytes`` of them; a
    line cut by that limit is dropped."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            start = max(offset, size - max_bytes)
            fh.seek(start)
            data = fh.read(size - start)
    except OSError:
        return []
    lines = data.decode("utf-8", errors="replace").splitlines()
    if start > offset and lines:
        lines = lines[1:]
    return lines


class Process(Protocol):
    """What the shell needs of a child process (``up.Child`` is one)."""

    name: str

    def alive(self) -> bool: ...

    def returncode(self) -> int: ...

    def tail_lines(self) -> list[str]:
        """Its log lines of this run only."""
        ...

    def reap(self) -> None:
        """Release what the dead child held (its log handle, what its group left)."""
        ...


P = TypeVar("P", bound=Process)


class Supervised(Generic[P]):
    """One child kept running: ``check(now)`` notices an exit, says so through ``echo``
    and starts a fresh process (``start()``) once the policy's delay has passed."""

    def __init__(self, start: Callable[[], P], policy: RestartPolicy,
                 echo: Callable[[str], None], now: float) -> None:
        self._start, self.policy, self._echo = start, policy, echo
        self.proc = start()
        self.started = now
        self.failures = 0
        self.restart_at: float | None = None

    @property
    def name(self) -> str:
        return self.proc.name

    def check(self, now: float) -> None:
        if self.restart_at is None:
            if self.proc.alive():
                return
            self.proc.reap()
            plan = decide_restart(self.policy, self.proc.name, self.proc.returncode(),
                                  self.started, now, self.failures, self.proc.tail_lines())
            self._echo(plan.message)
            self.failures, self.restart_at = plan.failures, now + plan.delay_s
        if now >= self.restart_at:
            self.proc = self._start()
            self.started, self.restart_at = now, None
