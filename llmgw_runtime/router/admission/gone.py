"""Whether a waiting request's client is still there: the shell (``gate.py``) asks this
while the request waits for a slot, and drops the request when its client has gone."""

from __future__ import annotations

import select
import socket
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
