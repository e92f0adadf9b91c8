"""The control service's web worker on PostgreSQL: the router's HTTP/1.1 server (gunicorn's
gevent worker with llmgw's own connection loop, ``router/http/server.py``) with psycopg2
waiting on the event loop instead of blocking it.

Why not gunicorn's gthread worker, as on SQLite: a request's trip through gthread (its
Python parser, its response writer, a thread pool's hand-off and its keep-alive poller)
cost 340 us of CPU before the app ran, measured with a WSGI app that only answers
(wrk, 16 kept-alive connections, one worker); the router's loop costs 49 us. Agents report
every 2 s, so at 10,000 nodes that is the difference between 1.7 cores and 0.25 of a core
(docs/performance.md, "The control plane at 10,000 nodes"). The loop also brings the
router's bounds to the agent API: a whole head within the keep-alive time, a whole body
within ``LLMGW_ROUTER_BODY_DEADLINE_S``, a lingering close after an early answer.

A gevent worker serves every connection on one thread, so nothing may block it:

- psycopg2 waits through :func:`wait` (its wait callback), on the event loop. libpq ignores
  ``connect_timeout`` for such a connection (the application polls it), so :func:`wait`
  keeps it: a connection not made within it fails as libpq's own would, ``timeout
  expired``. The store's wait bounds (``store/failover.py``) work as under threads: its
  thread-local and its watchdog, made at import before the patch, are made again after it
  (``failover.renew_after_patch``), so each greenlet has its own bound, and a severed
  socket ends the wait on it.
- Long CPU work (a catalog apply of 1,000 models: about half a second) computes in slices
  of at most 5 ms, the loop serving what is ready between them (``llmgw_runtime/coop.py``:
  its loops walk ``sliced``). A native thread does not help: it and the loop share
  the interpreter's lock, which the loop gives up at every system call.
- SQLite does not run here: its writes lock the file, and a wait for that lock inside
  sqlite3 would stall every connection of the worker. ``control/serve.py`` runs gthread
  workers on SQLite (one machine, a small fleet).
"""

from __future__ import annotations

import time
import warnings
from typing import Any

from gevent.monkey import MonkeyPatchWarning

from ..router.http.server import RouterWorker

DEFAULT_CONNECT_TIMEOUT_S = 5.0   # store/failover.LIBPQ_DEFAULTS' when a DSN names none


class ControlWorker(RouterWorker):
    """A control web worker: the router's server, the control service's names, psycopg2
    on the event loop."""

    software = "llmgw-control"
    failed_text = "the control service failed on this request (its log says why)"

    def patch(self) -> None:
        # The master imported urllib3 (with the whole app: weights/http_download), which
        # took names from ssl before the patch; no web worker speaks TLS through urllib3
        # (the store's members are asked through urllib.request), so gevent's warning at
        # every worker's start says nothing an operator can act on.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=MonkeyPatchWarning)
            super().patch()             # gevent's monkey.patch_all
        after_patch()


def after_patch() -> None:
    """What a control worker sets up once gevent patched the standard library."""
    from .. import coop
    from ..store import failover
    from . import summary_view

    failover.renew_after_patch()
    summary_view.renew_after_patch()
    cooperative_psycopg2()
    coop.enable_gevent()            # long loops give the event loop its turn


def cooperative_psycopg2() -> None:
    """psycopg2 waits for its server through :func:`wait` (process-wide)."""
    from psycopg2 import extensions

    extensions.set_wait_callback(wait)


def wait(conn: Any, timeout: float | None = None) -> None:
    """psycopg2's wait callback: poll ``conn`` until its operation is done, waiting for its
    socket on the event loop; a connection being made is given its ``connect_timeout``."""
    from gevent.socket import wait_read, wait_write
    from psycopg2 import OperationalError, extensions

    deadline = None
    if conn.status == extensions.STATUS_SETUP:        # connecting
        limit = connect_timeout_s(conn.dsn)
        deadline = None if limit is None else time.monotonic() + limit
    while True:
        state = conn.poll()
        if state == extensions.POLL_OK:
            return
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise OperationalError("timeout expired")
        try:
            if state == extensions.POLL_READ:
                wait_read(conn.fileno(), timeout=left)
            elif state == extensions.POLL_WRITE:
                wait_write(conn.fileno(), timeout=left)
            else:
                raise OperationalError(f"psycopg2's poll answered {state!r}")
        except TimeoutError:
            raise OperationalError("timeout expired") from None


def connect_timeout_s(dsn: str) -> float | None:
    """The DSN's ``connect_timeout`` as libpq reads it: below 2 s counts as 2 s, 0 as no
    limit (None); none given, :data:`DEFAULT_CONNECT_TIMEOUT_S` (the store always gives
    one: ``store/failover.LIBPQ_DEFAULTS``)."""
    from psycopg2.extensions import parse_dsn

    text = parse_dsn(dsn).get("connect_timeout")
    if text is None:
        return DEFAULT_CONNECT_TIMEOUT_S
    try:
        value = int(text)
    except ValueError:
        return DEFAULT_CONNECT_TIMEOUT_S
    return float(max(value, 2)) if value > 0 else None
