"""Surviving a PostgreSQL failover (Patroni): what a dead or demoted primary looks like to a
client, and a bound on a COMMIT that waits for the synchronous standby.

- libpq settings so a dead primary is noticed in seconds (TCP keepalives, tcp_user_timeout),
  added only where the URL does not set them.
- :func:`classify`: which database errors mean "the server went away or is not the primary
  any more" (retry elsewhere) rather than "this statement is wrong".
- :class:`CommitWatchdog`: one thread that cancels a COMMIT still waiting after a bound.
  statement_timeout does not fire there, and a cancelled wait still reports success, with a
  WARNING that the transaction "might not have been replicated": :func:`unreplicated_notice`
  finds it, and the store treats that write as not acknowledged.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from typing import Any

from sqlalchemy.exc import DBAPIError, OperationalError

from ..errors import StoreError

log = logging.getLogger(__name__)

# Noticed within keepalives_idle + count x interval = 11 s when a peer vanishes silently;
# unacknowledged data gives up after tcp_user_timeout (ms).
LIBPQ_DEFAULTS = {"connect_timeout": "5", "keepalives": "1", "keepalives_idle": "5",
                  "keepalives_interval": "2", "keepalives_count": "3",
                  "tcp_user_timeout": "10000"}

READ_ONLY = "25006"            # read_only_sql_transaction: a standby, or a demoted primary


class StoreUnavailable(StoreError):
    """The store cannot be reached, or the server reached is not the writable primary.
    The transaction did not happen, or (for a COMMIT) may or may not have: an idempotent
    write may be retried."""


class NotAcknowledged(StoreUnavailable):
    """The COMMIT was cancelled while waiting for the synchronous standby: the write is
    committed on the old primary only and may be lost in a failover."""


def connect_kwargs(dsn: str) -> dict[str, str]:
    """The libpq defaults the DSN does not set itself (a URL's values win)."""
    from psycopg2.extensions import parse_dsn

    given = parse_dsn(dsn)
    return {k: v for k, v in LIBPQ_DEFAULTS.items() if k not in given}


def classify(exc: DBAPIError) -> str | None:
    """Why this error means "try again, maybe on another server", or None when it is
    about the statement itself (a constraint, a syntax error) and must propagate."""
    if exc.connection_invalidated:
        return "the connection was lost"
    if getattr(exc.orig, "pgcode", None) == READ_ONLY:
        return "the server is a read-only standby (a failover is under way)"
    if isinstance(exc, OperationalError):
        return "the server cannot be reached"
    return None


def unreplicated_notice(notices: list[str]) -> str | None:
    """PostgreSQL's warning that a COMMIT stopped waiting for the synchronous standby."""
    for notice in notices:
        if "synchronous replication" in notice or "might not have been replicated" in notice:
            return " ".join(notice.split())
    return None


class _Watch:
    __slots__ = ("raw", "deadline", "fired", "done")

    def __init__(self, raw: Any, deadline: float) -> None:
        self.raw = raw
        self.deadline = deadline
        self.fired = False
        self.done = False


class CommitWatchdog:
    """Cancels (``connection.cancel()``, libpq's cancel request) a COMMIT that waits past
    its deadline. One daemon thread for the whole process, started on first use."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, _Watch]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def watch(self, raw: Any, timeout_s: float) -> _Watch:
        entry = _Watch(raw, time.monotonic() + timeout_s)
        with self._cond:
            heapq.heappush(self._heap, (entry.deadline, next(self._seq), entry))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="llmgw-commit-watchdog")
                self._thread.start()
            elif self._heap[0][2] is entry:
                self._cond.notify()
        return entry

    def done(self, entry: _Watch) -> bool:
        """The COMMIT returned; True when it was cancelled (not acknowledged)."""
        with self._cond:
            entry.done = True
            if not entry.fired:
                entry.raw = None           # popped at its deadline; keep no connection alive
            return entry.fired

    def _run(self) -> None:
        while True:
            due: list[_Watch] = []
            with self._cond:
                now = time.monotonic()
                while self._heap and (self._heap[0][2].done or self._heap[0][0] <= now):
                    _, _, entry = heapq.heappop(self._heap)
                    if not entry.done:
                        entry.fired = True
                        due.append(entry)
                if not due:
                    wait = self._heap[0][0] - now if self._heap else 60.0
                    self._cond.wait(wait)
                    continue
            for entry in due:      # outside the lock: a cancel to a dead host may block
                try:
                    entry.raw.cancel()
                except Exception as exc:  # noqa: BLE001 - the COMMIT's own error tells more
                    log.warning("could not cancel a COMMIT waiting past its bound: %s", exc)


WATCHDOG = CommitWatchdog()
