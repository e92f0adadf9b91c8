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
- A wait bound per thread (:func:`set_wait`; the control service's web requests,
  ``LLMGW_STORE_WAIT_S``): each statement of a transaction, its COMMIT or ROLLBACK, its
  pooled connection's ping and a new connection each wait at most that long for the
  server (store/db.py ``arm``: the client's own work between statements is not counted),
  after which the same watchdog severs the connection's socket (:func:`sever`: the
  blocked read returns at once, the connection is dropped) unless the server's answer is
  already waiting in it (then this process is the late one, and the wait goes on), and
  retries stop that long after the request began. A server that stops answering (a lost
  node before its keepalives tell, a paused postmaster) is then a 503 with Retry-After
  within seconds, not a request hanging past its client's timeout. Server-side timeouts
  (statement_timeout, lock_timeout) cannot do this: a server that does not run does not
  time out.
"""

from __future__ import annotations

import _socket
import heapq
import itertools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
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
RETRY_AFTER_S = 5              # what a 503 for an unavailable store asks clients to wait
MIN_CONNECT_TIMEOUT_S = 2      # libpq's own floor for connect_timeout


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


_BOUND = threading.local()


def set_wait(seconds: float | None) -> None:
    """Bound this thread's waits for the store to ``seconds`` from now on (None: unbound,
    as the reconciler and migrations run): each transaction, ping and connection waits at
    most ``seconds`` for the server, and retries stop ``seconds`` after this call."""
    _BOUND.wait_s = seconds
    _BOUND.until = None if seconds is None else time.monotonic() + seconds
    _BOUND.cut = None


def note_cut() -> None:
    """This thread's wait just ended because its bound severed the connection (store/db.py
    ``disarm``): the error it gets says so (:func:`unavailable`), not "cannot be reached"."""
    _BOUND.cut = wait_s()


def first_line(exc: DBAPIError) -> str:
    """The driver's own first line of a database error (SQLAlchemy's text adds its own)."""
    return str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)


def unavailable(where: str, exc: DBAPIError, why: str) -> StoreUnavailable:
    """The error for a lost connection (``why``: :func:`classify`'s): a wait that this
    thread's bound cut off names the bound, since a store that answers slowly (overloaded,
    or a failover under way) is not one that is down."""
    first = first_line(exc)
    cut, _BOUND.cut = getattr(_BOUND, "cut", None), None
    if cut is not None:
        return StoreUnavailable(
            f"the store at {where} did not answer within {cut:g} s, the bound on each wait "
            "of a request (LLMGW_STORE_WAIT_S), so the request was cut off: PostgreSQL or "
            "this control service is overloaded, or a failover is under way. Retry in a few "
            "seconds; if it persists, see `llmgw ctl status` and the control service's CPU")
    return StoreUnavailable(f"the store at {where} cannot be reached: {first}"
                            + (f" ({why})" if why != "the server cannot be reached" else "")
                            + "; check that the database is up, then retry")


def wait_s() -> float | None:
    """This thread's bound on one wait for the server (None: unbound)."""
    return getattr(_BOUND, "wait_s", None)


def retry_left_s() -> float | None:
    """Seconds left for retries under this thread's bound (None: unbound)."""
    until = getattr(_BOUND, "until", None)
    return None if until is None else until - time.monotonic()


def connect_timeout_s(bound_s: float) -> str:
    """libpq's connect_timeout for a connection made under a wait bound of ``bound_s``:
    whole seconds, at least libpq's floor, at most the default."""
    ceiling = int(LIBPQ_DEFAULTS["connect_timeout"])
    return str(max(MIN_CONNECT_TIMEOUT_S, min(ceiling, int(bound_s + 0.999))))


def sever(raw: Any) -> bool:
    """Shut down the socket of a psycopg2 connection from another thread: a read blocked
    on it returns at once ("server closed the connection unexpectedly"), and the pool drops
    the connection. The descriptor stays libpq's (a duplicate is shut down and closed).

    Unless the server has answered: when its answer is already waiting in the socket, this
    process is late to read it (a web worker busy with thousands of heartbeats, whose
    greenlet waiting here has not had its turn yet), not the server late to answer; the
    connection is left alone and False returned, so the wait goes on under a new bound.
    Cutting it off answered an operator's catalog apply 503 while PostgreSQL was fine."""
    try:
        fd = raw.fileno()
    except Exception:  # noqa: BLE001 - already closed: nothing waits on it
        return True
    try:
        # the C socket type, never gevent's: a peek that would block must not wait
        dup = _socket.socket(fileno=os.dup(fd))
    except OSError:
        return True
    try:
        try:
            if dup.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT):
                return False             # an answer waits to be read
        except OSError:
            pass                         # nothing yet (EAGAIN), or the socket failed
        dup.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        dup.close()
    return True


def unreplicated_notice(notices: list[str]) -> str | None:
    """PostgreSQL's warning that a COMMIT stopped waiting for the synchronous standby."""
    for notice in notices:
        if "synchronous replication" in notice or "might not have been replicated" in notice:
            return " ".join(notice.split())
    return None


class _Watch:
    __slots__ = ("raw", "deadline", "span", "fired", "done", "action")

    def __init__(self, raw: Any, span: float,
                 action: Callable[[Any], bool] | None = None) -> None:
        self.raw = raw
        self.span = span
        self.deadline = time.monotonic() + span
        self.fired = False
        self.done = False
        self.action = action


class CommitWatchdog:
    """Cancels (``connection.cancel()``, libpq's cancel request) a COMMIT that waits past
    its deadline, or runs another ``action`` on a connection at its deadline (:func:`sever`,
    run under the lock, so never on a connection whose watch is done: it may be another
    thread's by then). One daemon thread for the whole process, started on first use."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, _Watch]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def watch(self, raw: Any, timeout_s: float,
              action: Callable[[Any], bool] | None = None) -> _Watch:
        """Watch ``raw`` for ``timeout_s``; then cancel its COMMIT, or run ``action``, which
        returns False when it did nothing and the watch goes on for ``timeout_s`` more."""
        entry = _Watch(raw, timeout_s, action)
        with self._cond:
            heapq.heappush(self._heap, (entry.deadline, next(self._seq), entry))
            # no ``is_alive()``: under gevent it gives the loop away, once a COMMIT
            if self._thread is None:
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
        try:
            self._loop()
        finally:                    # the next watch starts another
            with self._cond:
                self._thread = None

    def _loop(self) -> None:
        while True:
            due: list[_Watch] = []
            with self._cond:
                now = time.monotonic()
                later: list[_Watch] = []
                while self._heap and (self._heap[0][2].done or self._heap[0][0] <= now):
                    _, _, entry = heapq.heappop(self._heap)
                    if entry.done:
                        continue
                    if entry.action is None:
                        entry.fired = True
                        due.append(entry)
                    elif entry.action(entry.raw):    # quick, and only while not done
                        entry.fired = True
                    else:                            # not now: watched for its span again
                        entry.deadline = now + entry.span
                        later.append(entry)
                for entry in later:
                    heapq.heappush(self._heap, (entry.deadline, next(self._seq), entry))
                if not due:
                    wait = self._heap[0][0] - now if self._heap else 60.0
                    self._cond.wait(max(wait, 0.0))
                    continue
            for entry in due:      # outside the lock: a cancel to a dead host may block
                try:
                    entry.raw.cancel()
                except Exception as exc:  # noqa: BLE001 - the COMMIT's own error tells more
                    log.warning("could not cancel a COMMIT waiting past its bound: %s", exc)


WATCHDOG = CommitWatchdog()
# A forked child has none of the parent's threads, and may have its lock taken.
os.register_at_fork(after_in_child=WATCHDOG.__init__)  # type: ignore[misc]


def renew_after_patch() -> None:
    """Make this module's per-thread bound and its watchdog again, in a process where gevent
    has just patched the standard library (the control service's gevent web workers,
    ``control/worker.py``): both were made at import, before the patch, as an OS thread's
    local (every greenlet of the worker would share one bound) and OS locks (a greenlet
    waiting on one stops the event loop). The watchdog is renewed in place: other modules
    hold it by name."""
    global _BOUND
    _BOUND = threading.local()
    WATCHDOG.__init__()  # type: ignore[misc]
