"""One simulated agent's keep-alive connection, driven by the gevent loop's own watchers
(``loop.io``, ``loop.timer``) with callbacks, not by a greenlet per agent.

The simulator shares the benchmark's machine with the control plane it measures. A
greenlet per agent cost a switch into the hub and back for every wait (the send time, the
answer) and about 0.1 ms of CPU per report: half a core at 10,000 agents every 2 s, taken
from the two cores the control service and PostgreSQL are measured on. Here a report is a
non-blocking ``send`` and, when the answer is readable, a ``recv`` in the loop's callback:
no switch. Connecting, which may wait (a full accept queue while thousands join), still
runs in a greenlet of its own. Import it only in a gevent-patched process."""

from __future__ import annotations

import _socket
import socket
import time
from collections.abc import Callable
from typing import Any

import gevent
import loadgen
from gevent import get_hub

Answer = Callable[[int, bytes], None]
Failed = Callable[[BaseException, bool], None]


def loop() -> Any:
    return get_hub().loop


def at(when: float, callback: Callable[[], None]) -> Any:
    """A started one-shot timer calling ``callback`` at ``when`` (``time.perf_counter``)."""
    timer = loop().timer(max(0.0, when - time.perf_counter()))
    timer.start(callback, update=True)
    return timer


class Wire:
    """A connection to ``host:port`` for one request at a time: :meth:`exchange` sends it
    and calls ``on_answer(status, body)`` with the response, or ``on_failed(error,
    reused)`` (``reused``: the connection had served before, so the server may have closed
    it while idle and the request may be sent again on a new one)."""

    __slots__ = ("host", "port", "sock", "buf", "out", "reader", "writer", "reused",
                 "on_answer", "on_failed", "closed_idle")

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.sock: Any = None
        self.buf = b""
        self.out = b""
        self.reader: Any = None
        self.writer: Any = None
        self.reused = False
        self.on_answer: Answer | None = None
        self.on_failed: Failed | None = None
        self.closed_idle = 0               # kept-alive connections the server closed

    def exchange(self, request: bytes, on_answer: Answer, on_failed: Failed) -> None:
        self.on_answer, self.on_failed = on_answer, on_failed
        if self.sock is None:
            gevent.spawn(self._connect_then, request)
            return
        self.reused = True
        self._send(request)

    def _connect_then(self, request: bytes) -> None:
        try:
            conn = socket.create_connection((self.host, self.port))
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.sock = _socket.socket(fileno=conn.detach())
            self.sock.setblocking(False)
        except OSError as exc:
            self._failed(exc)
            return
        self.reader = loop().io(self.sock.fileno(), 1)
        self.reader.start(self._readable)
        self.reused = False
        self._send(request)

    def _send(self, data: bytes) -> None:
        try:
            sent = self.sock.send(data)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            self._failed(exc)
            return
        if sent < len(data):              # the socket's buffer is full: the rest when it drains
            self.out = data[sent:]
            self.writer = loop().io(self.sock.fileno(), 2)
            self.writer.start(self._writable)

    def _writable(self) -> None:
        try:
            sent = self.sock.send(self.out)
        except BlockingIOError:
            return
        except OSError as exc:
            self._failed(exc)
            return
        self.out = self.out[sent:]
        if not self.out:
            self.writer.stop()
            self.writer = None

    def _readable(self) -> None:
        try:
            data = self.sock.recv(262144)
        except BlockingIOError:
            return
        except OSError as exc:
            self._failed(exc)
            return
        if not data:
            self._failed(ConnectionError("server closed the connection"))
            return
        self.buf += data
        try:
            whole = loadgen.response(self.buf)
        except ValueError as exc:
            self._failed(exc)
            return
        if whole is None:
            return
        status, body, self.buf = whole
        answer, self.on_answer, self.on_failed = self.on_answer, None, None
        if answer is not None:
            answer(status, body)

    def _failed(self, exc: BaseException) -> None:
        failed, self.on_answer, self.on_failed = self.on_failed, None, None
        self.close()
        if failed is None:
            self.closed_idle += 1           # an idle one: the next request opens another
        else:
            failed(exc, self.reused)

    def close(self) -> None:
        for watcher in (self.reader, self.writer):
            if watcher is not None:
                watcher.stop()
        self.reader = self.writer = None
        if self.sock is not None:
            self.sock.close()
        self.sock = None
        self.buf = self.out = b""
