"""HTTP/1.1 to the engines: one keep-alive connection pool per upstream, on geventhttpclient.

geventhttpclient parses with llhttp (C) and costs about 120 us of CPU per proxied request
against about 330 us for urllib3 over http.client (measured on these machines: 4,000
sequential POSTs to the fake engine under gevent; ../shared/recipes/router-gevent.md has
the same ranking). Pools are made lazily in the worker (after gevent patched).

Failures are sorted by what a caller may do about them:

- :class:`Unreachable`: no connection could be made (refused, no route, connect timeout):
  nothing reached the engine; the replica may be marked down.
- :class:`FailedBeforeAnswer`: connected, but the engine answered nothing (a reset of a
  reused keep-alive connection, a close): the request may be tried once more elsewhere.
- :class:`BrokeOff`: the answer started and then broke: too late to retry.

Streams: geventhttpclient's own iterator waits for a full block; :meth:`Answer.chunks`
yields whatever has arrived (an SSE event as soon as its bytes do).
"""

from __future__ import annotations

import errno
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit

import gevent
import gevent.queue
from geventhttpclient import HTTPClient
from geventhttpclient.response import HTTPConnectionClosed, HTTPSocketPoolResponse

from .rawsock import receiver

BLOCK = 65536
RESOLVE_TTL_S = 10.0     # an upstream's address is looked up again after this long
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


def describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:300]


class Answer:
    """One upstream answer: status and headers read, the body still on the socket."""

    __slots__ = ("_resp", "status", "headers", "_done", "_timeout_s")

    def __init__(self, resp: HTTPSocketPoolResponse, timeout_s: float = 600.0) -> None:
        self._resp = resp
        self._timeout_s = timeout_s
        self.status = resp.status_code
        self.headers: list[tuple[str, str]] = list(resp.items())
        self._done = False

    def header(self, name: str) -> str | None:
        value = self._resp.get(name)
        return value if value is None or isinstance(value, str) else str(value)

    def read(self) -> bytes:
        """The whole body; the connection goes back to its pool."""
        try:
            data = bytes(self._resp.read())
        except (OSError, HTTPConnectionClosed, gevent.Timeout) as exc:
            self.close()
            raise BrokeOff(describe(exc)) from None
        self._release()
        return data

    def chunks(self) -> Iterator[bytes]:
        """The body as it arrives (chunked transfer decoded); the connection goes back to
        its pool at the end, or is closed when the caller stops early (:meth:`close`).

        Between chunks it waits for the socket to be readable on one watcher and one
        timer made for the whole stream, and then reads the OS socket (the gevent
        socket's own ``recv`` would first try a read that finds nothing, then make a new
        timeout for every wait: a fifth of the router's CPU per chunk of a paced stream).
        No data for the pool's network timeout breaks the stream off, as the socket's
        timeout would."""
        resp = self._resp
        readable = stalled = None
        try:
            while True:
                buffered = resp._body_buffer
                if buffered:
                    data = bytes(buffered)
                    del buffered[:]
                    yield data
                    continue
                sock = resp._sock     # None: the whole answer came with its headers
                if resp.message_complete or sock is None:
                    break
                if readable is None:
                    hub = gevent.get_hub()
                    readable = hub.loop.io(sock.fileno(), 1)
                    stalled = hub.loop.timer(self._timeout_s)
                    throw = gevent.getcurrent().throw
                    why = TimeoutError(f"no data from the engine for {self._timeout_s:g} s")
                    receive = receiver(sock)
                assert stalled is not None
                stalled.start(throw, why)
                try:
                    hub.wait(readable)
                finally:
                    stalled.stop()
                got = receive(BLOCK)
                if got is None:
                    continue          # woken, but nothing to read after all
                if not got:
                    if resp.message_complete:
                        break
                    raise HTTPConnectionClosed("the engine closed the connection mid-answer")
                resp.feed(got)
        except (OSError, HTTPConnectionClosed, gevent.Timeout) as exc:
            self.close()
            raise BrokeOff(describe(exc)) from None
        finally:
            if readable is not None:
                readable.close()
            if stalled is not None:
                stalled.close()
        self._release()

    def _release(self) -> None:
        if not self._done:
            self._done = True
            self._resp.release()

    def close(self) -> None:
        """Drop the connection (a half-read body must never be reused)."""
        if not self._done:
            self._done = True
            resp = self._resp
            pool, sock = resp._pool, resp._sock
            resp._sock = resp._pool = None
            if sock is not None and pool is not None:
                pool.release_socket(sock)     # closes it and frees its place in the pool


class Pools:
    """A connection pool per upstream URL (scheme://host:port)."""

    def __init__(self, timeout_s: float, maxsize: int = 2000) -> None:
        self._connect_timeout = min(10.0, timeout_s)
        self._timeout = timeout_s
        self._maxsize = maxsize
        self._clients: dict[str, HTTPClient] = {}
        self._lock = threading.Lock()

    def client(self, url: str) -> HTTPClient:
        client = self._clients.get(url)
        if client is None:
            with self._lock:
                client = self._clients.get(url)
                if client is None:
                    parts = urlsplit(url)
                    client = HTTPClient(parts.hostname or "127.0.0.1", parts.port,
                                        concurrency=self._maxsize,
                                        connection_timeout=self._connect_timeout,
                                        network_timeout=self._timeout,
                                        ssl=parts.scheme == "https", block_size=BLOCK)
                    pool = client._connection_pool
                    pool._resolve = _cached(pool._resolve)  # type: ignore[method-assign]
                    self._clients[url] = client
        return client

    def forget_except(self, urls: set[str]) -> None:
        """Close the pools of upstreams that left the routes table."""
        with self._lock:
            for url in [u for u in self._clients if u not in urls]:
                self._clients.pop(url).close()

    def post(self, url: str, path: str, body: bytes, headers: Mapping[str, str]) -> Answer:
        """POST ``body``; the answer with its headers read. Raises Unreachable or
        FailedBeforeAnswer (nothing of an answer arrived)."""
        client = self.client(url)
        try:
            try:
                resp = client.request("POST", path, body=body, headers=dict(headers))
            except (HTTPConnectionClosed, ConnectionResetError, BrokenPipeError):
                # A kept-alive connection the engine closed as it was reused (llama.cpp
                # closes idle ones after 5 s): the others idle as long are likely closed
                # too. Drop them and send once more, on a new connection.
                _drop_idle(client)
                resp = client.request("POST", path, body=body, headers=dict(headers))
        except (ConnectionRefusedError, socket.gaierror) as exc:
            raise Unreachable(describe(exc)) from None
        except OSError as exc:
            if exc.errno in _UNREACHABLE_ERRNOS:
                raise Unreachable(describe(exc)) from None
            raise FailedBeforeAnswer(describe(exc)) from None
        except (HTTPConnectionClosed, gevent.Timeout) as exc:
            raise FailedBeforeAnswer(describe(exc)) from None
        return Answer(resp, self._timeout)


def _cached(resolve: Callable[[], Any]) -> Callable[[], Any]:
    """``resolve`` (a pool's getaddrinfo), its answer kept for :data:`RESOLVE_TTL_S`: under
    gevent each lookup is a trip through the resolver's thread pool, even for an IP address
    (a tenth of the router's CPU while a thousand streams open their connections)."""
    kept: list[Any] = []

    def cached() -> Any:
        now = time.monotonic()
        if not kept or now - kept[0] > RESOLVE_TTL_S:
            kept[:] = [now, resolve()]
        return kept[1]
    return cached


def _drop_idle(client: HTTPClient) -> None:
    """Close the idle connections of ``client``'s pool (its free places stay free)."""
    queue = client._connection_pool._socket_queue
    while not queue.empty():
        try:
            sock = queue.get(block=False)
        except gevent.queue.Empty:
            break
        try:
            sock.close()
        except OSError:
            pass
