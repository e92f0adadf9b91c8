"""Whether a waiting request's client is still there: the shell (``gate.py``) asks this
while the request waits for a slot, and drops the request when its client has gone.
Under gevent it need not ask on a timer alone: :func:`watch_client` wakes the waiter the
moment the client's socket turns readable (a close, or pipelined bytes), so a client
that hangs up leaves the queue at once."""

from __future__ import annotations

import select
import socket
from collections.abc import Callable
from typing import Any

from gevent import monkey

_poll = monkey.get_original("select", "poll")   # the OS's poll: never yields to the hub


def client_gone(environ: dict[str, Any]) -> bool:
    """True when the client of this request closed its connection (gunicorn puts the
    socket in ``environ['gunicorn.socket']``; without it, never). Never blocks."""
    sock = environ.get("gunicorn.socket")
    if sock is None:
        return False
    try:
        poller = _poll()
        poller.register(sock.fileno(), select.POLLIN | select.POLLERR | select.POLLHUP)
        events = poller.poll(0)
        if not events:
            return False
        if events[0][1] & (select.POLLERR | select.POLLHUP):
            return True
        return sock.recv(1, socket.MSG_PEEK) == b""     # readable: closed, or pipelined data
    except (OSError, ValueError):
        return True


def _nothing() -> None:
    return None


def watch_client(environ: dict[str, Any], wake: Callable[[], None]) -> Callable[[], None]:
    """Call ``wake`` once, in a greenlet of its own, when this request's client socket
    turns readable; return what stops the watch (call it whatever happened). A no-op
    where gevent does not run the sockets (there the waiter's timer is all there is).
    The watch fires once: pipelined bytes leave the timer to ask again."""
    sock = environ.get("gunicorn.socket")
    if sock is None or not monkey.is_module_patched("socket"):
        return _nothing
    import gevent
    try:
        watcher = gevent.get_hub().loop.io(sock.fileno(), 1)
    except (OSError, ValueError):
        return _nothing

    def readable() -> None:     # on the hub: nothing here may block, so hand it on
        watcher.stop()
        gevent.spawn(wake)
    watcher.start(readable)
    return watcher.close
