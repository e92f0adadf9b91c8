"""HTTP/1.1 to the engines: one keep-alive connection pool per upstream, on gevent sockets.

The router sends one kind of request (a POST with a body it has read whole) and reads
answers of three framings (a length, chunks, or up to the close), so it speaks just that
much HTTP itself. The request goes out in one send; the answer's head is parsed in one
pass; a streamed answer's chunks are decoded as they arrive, each read straight on the OS
socket after one wait for it to be readable (and sent on with :mod:`.rawsock`). Side by
side with ``../shared/bench-proxy``'s engine this costs about 15 % less CPU per proxied
request than geventhttpclient did, which ran a Python callback per header field and per
body piece, built each request through its Headers class and made watchers for a
``select`` on every pooled connection it handed out (docs/performance.md).

An answer that is not HTTP/1.1 as :mod:`.http1` reads it breaks off with a message saying
why.

Failures are sorted by what a caller may do about them:

- :class:`Unreachable`: no connection could be made (refused, no route, no such host):
  nothing reached the engine; the replica may be marked down.
- :class:`FailedBeforeAnswer`: connected, but the engine answered nothing (a reset, a
  close, a timeout): the request may be tried once more elsewhere. A kept-alive
  connection the engine closed as it was reused (llama.cpp closes idle ones after 5 s)
  is not that: the request is sent once more on a new connection first.
- :class:`BrokeOff`: the answer started and then broke: too late to retry.
"""

from __future__ import annotations

import errno
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit

import gevent
import gevent.socket
from gevent import ssl as gssl

from .http1 import CLOSE, MAX_HEAD, Body, Malformed, framing, parse_head, request
from .rawsock import os_socket, sender

BLOCK = 65536
RESOLVE_TTL_S = 10.0      # an upstream's address is looked up again after this long
_UNREACHABLE_ERRNOS = frozenset({errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH,
                                 errno.EADDRNOTAVAIL})


class UpstreamFailure(Exception):
    """Base of the failures below; the message says what happened, for logs and errors."""


class Unreachable(UpstreamFailure):
    """No connection could be made to the upstream."""


class FailedBeforeAnswer(UpstreamFailure):
    """Connected, but no answer came."""


class BrokeOff(UpstreamFailure):
    """The answer started, then broke off."""


class _Closed(Exception):
    """The engine closed the connection before its answer was complete."""


def describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:300]


class _Link:
    """One connection to an engine, with what has been read from it and not yet used, and
    the one io watcher and timer its reads wait on (made at its first wait, kept while it
    is pooled: a watcher not started costs nothing)."""

    __slots__ = ("sock", "buf", "sendall", "_raw", "_timeout_s", "_hub", "_io", "_timer",
                 "_why")

    def __init__(self, sock: Any, timeout_s: float) -> None:
        self.sock = sock
        self.buf = bytearray()
        self.sendall = sender(sock)
        self._raw = os_socket(sock)    # None: TLS
        self._timeout_s = timeout_s
        self._hub: Any = None
        self._io: Any = None
        self._timer: Any = None
        self._why = TimeoutError(f"no data from the engine for {timeout_s:g} s")

    def fill(self) -> bool:
        """Wait (at most the pool's network timeout) for more of the answer and add it to
        the buffer; False when the engine closed the connection. No data for that long
        raises TimeoutError. (Called for every chunk of a stream: written for that.)"""
        raw = self._raw
        if raw is None:            # TLS: its object may hold data the socket does not show
            self.sock.settimeout(self._timeout_s)
            got = self.sock.recv(BLOCK)
        else:
            if self._io is None:
                self._hub = gevent.get_hub()
                self._io = self._hub.loop.io(self.sock.fileno(), 1)
                self._timer = self._hub.loop.timer(self._timeout_s)
            timer = self._timer
            while True:
                timer.start(gevent.getcurrent().throw, self._why)
                try:
                    self._hub.wait(self._io)
                finally:
                    timer.stop()
                try:
                    got = raw.recv(BLOCK)
                    break
                except BlockingIOError:
                    continue       # woken, but nothing to read after all
        if not got:
            return False
        self.buf += got
        return True

    def alive(self) -> bool:
        """Whether an idle pooled connection is still open: a peek that finds nothing to
        read (the engine neither closed it nor sent anything unasked)."""
        raw = self._raw
        if raw is None:
            return True            # TLS: a stale one fails its request, which is resent
        try:
            raw.recv(1, socket.MSG_PEEK)
        except BlockingIOError:
            return True
        except OSError:
            return False
        return False               # closed (b""), or bytes nobody asked for

    def close(self) -> None:
        if self._io is not None:
            self._io.close()
            self._timer.close()
            self._io = self._timer = self._hub = None
        try:
            self.sock.close()
        except OSError:
            pass


class _Pool:
    """Idle keep-alive connections to one upstream (the most recently used first)."""

    def __init__(self, url: str, connect_timeout: float, timeout_s: float,
                 maxsize: int) -> None:
        parts = urlsplit(url)
        self.tls = parts.scheme == "https"
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if self.tls else 80)
        self.authority = parts.netloc.rpartition("@")[2] or self.host
        self._connect_timeout = connect_timeout
        self._timeout_s = timeout_s
        self._maxsize = maxsize
        self._idle: list[_Link] = []
        self._closed = False       # the upstream left the routes table
        self._resolved: tuple[float, list[Any]] | None = None
        self._context = gssl.create_default_context() if self.tls else None

    def get(self) -> tuple[_Link, bool]:
        """A connection, and whether it was used before."""
        while self._idle:
            link = self._idle.pop()
            if link.alive():
                return link, True
            link.close()
        return _Link(self._connect(), self._timeout_s), False

    def put(self, link: _Link) -> None:
        if len(self._idle) < self._maxsize and not self._closed:
            self._idle.append(link)
        else:
            link.close()

    def drop_idle(self) -> None:
        while self._idle:
            self._idle.pop().close()

    def _addresses(self) -> list[Any]:
        """The upstream's addresses, looked up at most every :data:`RESOLVE_TTL_S` (under
        gevent each lookup is a trip through the resolver's thread pool, even for an IP
        address: a tenth of the router's CPU while a thousand streams open their
        connections)."""
        now = time.monotonic()
        if self._resolved is None or now - self._resolved[0] > RESOLVE_TTL_S:
            found = gevent.socket.getaddrinfo(self.host, self.port, 0, socket.SOCK_STREAM)
            self._resolved = (now, [(f, a) for f, _, _, _, a in found])
        return self._resolved[1]

    def _connect(self) -> Any:
        last: OSError | None = None
        for family, address in self._addresses():
            sock = gevent.socket.socket(family, socket.SOCK_STREAM)
            try:
                sock.settimeout(self._connect_timeout)
                sock.connect(address)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if self._context is not None:
                    sock = self._context.wrap_socket(sock, server_hostname=self.host)
                sock.settimeout(None)
                return sock
            except OSError as exc:
                sock.close()
                last = exc
        raise last or OSError(f"no address for {self.host}")

    def close(self) -> None:
        """No more idle connections: those idle now are closed, those in use when their
        answers end."""
        self._closed = True
        self.drop_idle()


class Answer:
    """One upstream answer: status and headers read, the body still on the connection."""

    __slots__ = ("status", "headers", "_fields", "_link", "_pool", "_body", "_keep", "_done")

    def __init__(self, link: _Link, pool: _Pool, status: int, headers: list[tuple[str, str]],
                 fields: dict[str, str], body: Body, keep: bool) -> None:
        self.status = status
        self.headers = headers
        self._fields = fields
        self._link = link
        self._pool = pool
        self._body = body
        self._keep = keep
        self._done = False

    def header(self, name: str) -> str | None:
        return self._fields.get(name.lower())

    def read(self) -> bytes:
        """The whole body; the connection goes back to its pool."""
        return b"".join(self.chunks())

    def chunks(self) -> Iterator[bytes]:
        """The body as it arrives (chunked transfer decoded); the connection goes back to
        its pool at the end, or is closed when the caller stops early (:meth:`close`).
        No data for the pool's network timeout breaks the answer off."""
        link, buf, body = self._link, self._link.buf, self._body
        take = body.take
        try:
            while True:
                if buf:
                    data = take(buf)
                    if data:
                        yield data
                if body.ended:
                    break
                if not link.fill():
                    if body.at_close():
                        break
                    raise _Closed("the engine closed the connection mid-answer")
        except (OSError, _Closed, Malformed) as exc:
            self.close()
            raise BrokeOff(describe(exc)) from None
        self._release()

    def _release(self) -> None:
        if not self._done:
            self._done = True
            if self._keep and not self._link.buf:
                self._pool.put(self._link)
            else:
                self._link.close()

    def close(self) -> None:
        """Drop the connection (a half-read body must never be reused)."""
        if not self._done:
            self._done = True
            self._link.close()


class Pools:
    """A connection pool per upstream URL (scheme://host:port)."""

    def __init__(self, timeout_s: float, maxsize: int = 2000) -> None:
        self._connect_timeout = min(10.0, timeout_s)
        self._timeout = timeout_s
        self._maxsize = maxsize
        self._pools: dict[str, _Pool] = {}
        self._lock = threading.Lock()

    def _pool(self, url: str) -> _Pool:
        pool = self._pools.get(url)
        if pool is None:
            with self._lock:
                pool = self._pools.get(url)
                if pool is None:
                    pool = self._pools[url] = _Pool(url, self._connect_timeout,
                                                    self._timeout, self._maxsize)
        return pool

    def forget_except(self, urls: set[str]) -> None:
        """Close the pools of upstreams that left the routes table."""
        with self._lock:
            for url in [u for u in self._pools if u not in urls]:
                self._pools.pop(url).close()

    def post(self, url: str, path: str, body: bytes, headers: Mapping[str, str]) -> Answer:
        """POST ``body``; the answer with its headers read. Raises Unreachable or
        FailedBeforeAnswer (nothing of an answer arrived)."""
        pool = self._pool(url)
        data = request(path, pool.authority, headers, body)
        for attempt in range(2):
            try:
                link, reused = pool.get()
            except (ConnectionRefusedError, socket.gaierror) as exc:
                raise Unreachable(describe(exc)) from None
            except OSError as exc:
                if exc.errno in _UNREACHABLE_ERRNOS:
                    raise Unreachable(describe(exc)) from None
                raise FailedBeforeAnswer(describe(exc)) from None
            try:
                link.sendall(data)
                return self._answer(link, pool)
            except (_Closed, ConnectionResetError, BrokenPipeError) as exc:
                link.close()
                if reused and attempt == 0:
                    # A kept-alive connection the engine closed as it was reused: the
                    # others idle as long are likely closed too. Drop them and send
                    # once more, on a new connection.
                    pool.drop_idle()
                    continue
                raise FailedBeforeAnswer(describe(exc)) from None
            except (OSError, Malformed) as exc:
                link.close()
                raise FailedBeforeAnswer(describe(exc)) from None
            except BaseException:
                link.close()
                raise
        raise AssertionError("unreachable")   # pragma: no cover

    def _answer(self, link: _Link, pool: _Pool) -> Answer:
        while True:
            head = _read_head(link)
            status, headers, fields = parse_head(head)
            if status >= 200 or status == 101:
                break                          # 1xx before the answer: skipped
        mode, length = framing(status, fields)
        keep = (mode != CLOSE and "close" not in fields.get("connection", "").lower()
                and head.startswith(b"HTTP/1.1"))
        return Answer(link, pool, status, headers, fields, Body(mode, length), keep)


def _read_head(link: _Link) -> bytes:
    buf = link.buf
    while True:
        end = buf.find(b"\r\n\r\n")
        if end >= 0:
            head = bytes(buf[:end])
            del buf[:end + 4]
            return head
        if len(buf) > MAX_HEAD:
            raise Malformed(f"the answer's head is over {MAX_HEAD} bytes")
        if not link.fill():
            raise _Closed("the engine closed the connection without an answer"
                          if not buf else "the engine closed the connection inside its "
                          "answer's head")
