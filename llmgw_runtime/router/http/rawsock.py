"""Sending on a gevent socket's OS socket first, gevent's machinery only when the OS
socket would block (reads: ``http/client.Link.read`` and the relay read the OS socket).

gevent's ``sendall`` asks the kernel for the send buffer's size (a ``getsockopt`` call)
and goes through four Python frames before its one ``send``; its ``recv`` tries a read
that, after the caller waited for the socket to be readable, cannot fail. A relayed stream
chunk pays both on every chunk: measured with ``../shared/bench-proxy``'s engine and load
tool (64 streams of 64 chunks), a bare gevent relay spent about 38 us of CPU per chunk on
the OS sockets and about 64 us through gevent's socket methods.

The fast path is taken only on a plain gevent TCP socket, whose ``_sock`` is the
non-blocking OS socket (gevent's own servers unwrap it the same way); a TLS socket, or
anything else, gets its own ``sendall``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gevent.socket import socket as _GeventSocket


def os_socket(sock: Any) -> Any | None:
    """The non-blocking OS socket under a plain gevent socket, else None."""
    return sock._sock if type(sock) is _GeventSocket else None


def sender(sock: Any) -> Callable[[bytes], None]:
    """A ``sendall`` for ``sock`` that first sends straight on the OS socket, and hands
    what the kernel did not take (a full send buffer: a slow client) to gevent's
    ``sendall``, which waits cooperatively under the socket's timeout."""
    raw = os_socket(sock)
    if raw is None:
        return sock.sendall            # type: ignore[no-any-return]
    send, sendall = raw.send, sock.sendall

    def send_all(data: bytes) -> None:
        try:
            sent = send(data)
        except BlockingIOError:
            sent = 0
        if sent < len(data):
            sendall(memoryview(data)[sent:])
    return send_all
