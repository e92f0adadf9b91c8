"""HTTP/1.1 to the engines: a keep-alive connection pool per upstream, on gevent sockets,
answers read by httptools (``relay.impl.Reader``).

The router sends one kind of request (a POST with a body it has read whole), in one send.
Every wait for the engine has the pool's idle limit, restarted on every byte that arrives:
a stream that keeps sending is never cut, and a pooled connection's past waits never count
against its next request.

Failures are sorted by what a caller may do about them:

- :class:`Unreachable`: no connection could be made (refused, no route, no such host):
  nothing reached the engine; the replica may be marked down.
- :class:`FailedBeforeAnswer`: the engine answered nothing. ``retryable`` says whether the
  request may be sent elsewhere: only when the engine closed or reset the connection
  before a single byte of its answer (it died, or dropped a kept-alive connection). After
  the idle limit with no answer the engine may be working on it: never sent again. A
  kept-alive connection the engine closed as it was reused (llama.cpp closes idle ones
  after 5 s) is sent once more on a new connection first.
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

from .rawsock import os_socket, sender
from .relay import impl

BLOCK = 65536
RESOLVE_TTL_S = 10.0      # an upstream's address is looked up again after this long
_UNREACHABLE_ERRNOS = frozenset({errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH,
                                 errno.EADDRNOTAVAIL})
Malformed = impl.Malformed
Closed = impl.Closed


class UpstreamFailure(Exception):
    """Base of the failures below; the message says what happened, for logs and errors."""


class Unreachable(UpstreamFailure):
    """No connection could be made to the upstream."""


class FailedBeforeAnswer(UpstreamFailure):
    """Connected, but no answer came; ``retryable``: nothing says the engine started it."""

    def __init__(self, message: str, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


class BrokeOff(UpstreamFailure):
    """The answer started, then broke off."""


class Idle(TimeoutError):
    """No byte from the engine for the idle limit."""


def describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:300]


def request(path: str, authority: str, headers: Mapping[str, str], body: bytes) -> bytes:
    """A POST of ``body`` with ``headers`` (none may hold a line break: ValueError)."""
    lines = [f"POST {path} HTTP/1.1\r\nHost: {authority}\r\nContent-Length: {len(body)}\r\n"]
    for name, value in headers.items():
        if "\n" in value or "\r" in value or "\n" in name or "\r" in name:
            raise ValueError(f"request header {name!r} has a line break")
        lines.append(f"{name}: {value}\r\n")
    lines.append("\r\n")
    return "".join(lines).encode("latin-1") + body


class Link:
    """One connection to an engine, with the io watcher and the timer its waits use (made
    at its first wait, kept while it is pooled: a watcher not started costs nothing)."""

    __slots__ = ("sock", "sendall", "got_bytes", "raw", "idle_s", "_hub", "_io", "_timer",
                 "_idle")

    def __init__(self, sock: Any, idle_s: float) -> None:
        self.sock = sock
        self.sendall = sender(sock)
        self.got_bytes = False      # any byte of the current answer read
        self.raw = os_socket(sock)     # the OS socket; None: TLS
        self.idle_s = idle_s
        self._idle = f"no data from the engine for {idle_s:g} s"
        self._hub: Any = None
        self._io: Any = None
        self._timer: Any = None

    def read(self) -> bytes:
        """What arrives next (b"" when the engine closed), after a wait of at most the idle
        limit (Idle), which starts again at every call."""
        raw = self.raw
        if raw is None:            # TLS: its object may hold data the socket does not show
            self.sock.settimeout(self.idle_s)
            try:
                got: bytes = self.sock.recv(BLOCK)
            except TimeoutError:
                raise Idle(self._idle) from None
        else:
            try:
                got = raw.recv(BLOCK)      # often there already: no wait at all
            except BlockingIOError:
                got = self._wait_and_read(raw)
        if got:
            self.got_bytes = True
        return got

    def _wait_and_read(self, raw: Any) -> bytes:
        if self._io is None:
            self._hub = gevent.get_hub()
            self._io = self._hub.loop.io(self.sock.fileno(), 1)
            # repeat = the limit: again() arms it for the whole limit from now, every wait
            self._timer = self._hub.loop.timer(self.idle_s, self.idle_s)
        timer = self._timer
        while True:
            timer.again(gevent.getcurrent().throw, Idle, self._idle)
            try:
                self._hub.wait(self._io)
            finally:
                timer.stop()
            try:
                return raw.recv(BLOCK)    # type: ignore[no-any-return]
            except BlockingIOError:
                continue       # woken, but nothing to read after all

    def alive(self) -> bool:
        """Whether an idle pooled connection is still open: a peek that finds nothing to
        read (the engine neither closed it nor sent anything unasked)."""
        raw = self.raw
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

    def __init__(self, url: str, connect_timeout: float, idle_s: float, maxsize: int) -> None:
        parts = urlsplit(url)
        self.tls = parts.scheme == "https"
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if self.tls else 80)
        self.authority = parts.netloc.rpartition("@")[2] or self.host
        self._connect_timeout = connect_timeout
        self.idle_s = idle_s
        self._maxsize = maxsize
        self._idle: list[Link] = []
        self._closed = False       # the upstream left the routes table
        self._resolved: tuple[float, list[Any]] | None = None
        self._context = gssl.create_default_context() if self.tls else None

    def get(self) -> tuple[Link, bool]:
        """A connection, and whether it was used before."""
        while self._idle:
            link = self._idle.pop()
            if link.alive():
                link.got_bytes = False
                return link, True
            link.close()
        return Link(self._connect(), self.idle_s), False

    def put(self, link: Link) -> None:
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
        address)."""
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

    __slots__ = ("status", "headers", "link", "reader", "_pool", "_done")

    def __init__(self, link: Link, pool: _Pool, reader: Any) -> None:
        self.status: int = reader.status
        self.headers: list[tuple[str, str]] = reader.headers
        self.link = link
        self.reader = reader
        self._pool = pool
        self._done = False

    def header(self, name: str) -> str | None:
        return self.reader.fields.get(name.lower())  # type: ignore[no-any-return]

    def read(self) -> bytes:
        """The whole body; the connection goes back to its pool."""
        return b"".join(self.chunks())

    def chunks(self) -> Iterator[bytes]:
        """The body as it arrives (decoded); the connection goes back to its pool at the
        end, or is closed when the caller stops early (:meth:`close`)."""
        next_piece, link, reader = impl.next_piece, self.link, self.reader
        try:
            while True:
                data = next_piece(link, reader)
                if data is None:
                    break
                yield data
        except (OSError, Closed, Malformed) as exc:
            self.close()
            raise BrokeOff(describe(exc)) from None
        self.release()

    def release(self) -> None:
        """The answer was read to its end: its connection back to the pool, unless it may
        not be reused."""
        if not self._done:
            self._done = True
            reader = self.reader
            if reader.keep and not reader.extra and reader.done:
                self._pool.put(self.link)
            else:
                self.link.close()

    def close(self) -> None:
        """Drop the connection (a half-read body must never be reused)."""
        if not self._done:
            self._done = True
            self.link.close()


class Pools:
    """A connection pool per upstream URL (scheme://host:port)."""

    def __init__(self, idle_s: float, maxsize: int = 2000) -> None:
        self._connect_timeout = min(10.0, idle_s)
        self.idle_s = idle_s
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
                                                    self.idle_s, self._maxsize)
        return pool

    def forget_except(self, urls: set[str]) -> None:
        """Close the pools of upstreams that left the routes table."""
        with self._lock:
            for url in [u for u in self._pools if u not in urls]:
                self._pools.pop(url).close()

    def post(self, url: str, path: str, body: bytes, headers: Mapping[str, str]) -> Answer:
        """POST ``body``; the answer with its head read. Raises Unreachable or
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
                raise FailedBeforeAnswer(describe(exc), retryable=True) from None
            try:
                link.sendall(data)
                return _answer(link, pool)
            except (Closed, ConnectionResetError, BrokenPipeError) as exc:
                link.close()
                if link.got_bytes:
                    raise FailedBeforeAnswer(describe(exc)) from None
                if reused and attempt == 0:
                    # A kept-alive connection the engine closed as it was reused: the
                    # others idle as long are likely closed too. Drop them and send
                    # once more, on a new connection.
                    pool.drop_idle()
                    continue
                raise FailedBeforeAnswer(describe(exc), retryable=True) from None
            except (OSError, Malformed) as exc:
                link.close()
                raise FailedBeforeAnswer(describe(exc)) from None
            except BaseException:
                link.close()
                raise
        raise AssertionError("unreachable")   # pragma: no cover


def _answer(link: Link, pool: _Pool) -> Answer:
    """Read until the answer's head is parsed (what came with it stays in the reader)."""
    reader = impl.Reader()
    while not reader.head_done:
        got = link.read()
        if not got:
            raise Closed("the engine closed the connection inside its answer's head"
                         if link.got_bytes else
                         "the engine closed the connection without an answer")
        reader.feed(got)
    return Answer(link, pool, reader)
