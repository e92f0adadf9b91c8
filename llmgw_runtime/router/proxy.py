"""Forwarding one request to an engine replica, streaming its answer back.

Connections come from :mod:`.http.client` (a keep-alive pool per upstream on gevent
sockets, made lazily in the worker after gevent has patched). A streamed answer (and a whole
one above ``max_buffered`` bytes) is carried to the client piece by piece as it arrives, by
the relay loop (``http/_relay.py``) when the server hands it the client's socket; a client
that goes away closes the half-read upstream connection instead of returning it to the
pool, and an answer that breaks after its head ends the client's connection without the
chunked terminator. A replica that cannot be connected to is marked down in this worker and
handed to ``on_unreachable`` (the router tells the control service on its next tick, never
on the request's time).

What an engine answers reaches the client without its hop-by-hop fields (and those its
``Connection`` field names), ``Set-Cookie`` and ``Access-Control-*`` (the router's origin is
not the engine's) and any ``X-Llmgw-*`` field (those are the router's to say).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple, Protocol

import gevent

from ..api.router import Endpoint
from .balancer import Balancer
from .errors import ReplicasUnreachable, UpstreamError
from .http.client import Answer, BrokeOff, Closed, FailedBeforeAnswer, Malformed, Pools, Unreachable
from .http.errors import StreamBroken
from .http.rawsock import os_socket, sender
from .http.relay import impl

log = logging.getLogger(__name__)

HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "te", "trailer",
                        "trailers", "upgrade", "proxy-authorization", "proxy-authenticate",
                        "proxy-connection"})
# The client's API key is the router's business, not the engine's: it is never forwarded.
# Expect: the router has read the whole body already (an engine asked to wait for a 100
# that never comes would hang the request).
_DROP_UP = HOP_BY_HOP | {"host", "content-length", "authorization", "x-api-key", "expect"}
# An engine's CORS fields (llama.cpp sends an empty Access-Control-Allow-Origin) are not
# the router's answer to a browser: the router's own come from its cors_origins (cors.py).
CORS_FIELDS = frozenset({"access-control-allow-origin", "access-control-allow-credentials",
                         "access-control-allow-methods", "access-control-allow-headers",
                         "access-control-expose-headers", "access-control-max-age"})
_DROP_DOWN = HOP_BY_HOP | CORS_FIELDS | {"date", "server", "content-length", "set-cookie",
                                         "set-cookie2"}
_OURS = "x-llmgw-"
_STREAM_HEADERS = (("X-Accel-Buffering", "no"), ("Cache-Control", "no-cache"))  # unless set
REPLICA_HEADER = "X-Llmgw-Replica"     # names the replica that served (not a secret)
MODEL_HEADER = "X-Llmgw-Model"         # names the model that served (a fallback, say)


# environ key -> header name, or None when not forwarded (bounded: clients name headers)
_UP_NAMES: dict[str, str | None] = {}
_MAX_NAMES = 1000


def upstream_headers(environ: dict[str, Any]) -> dict[str, str]:
    """The client's request headers (from the WSGI environ) that go on to the engine."""
    out: dict[str, str] = {}
    for key, value in environ.items():
        if key.startswith("HTTP_") or key == "CONTENT_TYPE":
            name = _UP_NAMES.get(key, "")
            if name == "":
                name = _header_name(key)
                if len(_UP_NAMES) < _MAX_NAMES:
                    _UP_NAMES[key] = name
            if name is not None:
                out[name] = value
    return out


def _header_name(key: str) -> str | None:
    name = "Content-Type" if key == "CONTENT_TYPE" else key[5:].replace("_", "-").title()
    return None if name.lower() in _DROP_UP else name


def downstream_headers(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """The engine's answer fields that go on to the client."""
    out = []
    named: set[str] = set()
    for name, value in headers:
        low = name.lower()
        if low == "connection":
            named.update(v.strip().lower() for v in value.split(","))
        if low not in _DROP_DOWN and not low.startswith(_OURS):
            out.append((name, value))
    return [(k, v) for k, v in out if k.lower() not in named] if named else out


class Upstreams:
    """Connection pools per upstream URL, and the forward-with-one-retry logic."""

    def __init__(self, balancer: Balancer, timeout_s: float, maxsize: int = 2000,
                 on_unreachable: Callable[[str, str], None] | None = None,
                 max_buffered: int = 8 << 20) -> None:
        self._balancer = balancer
        self._on_unreachable = on_unreachable
        self._pools = Pools(timeout_s, maxsize)
        self._max_buffered = max_buffered

    def forget_except(self, urls: set[str]) -> None:
        """Close pools of upstreams that left the routes table."""
        self._pools.forget_except(urls)

    def forward(self, model: str, endpoints: Sequence[Endpoint], path: str, body: bytes,
                headers: dict[str, str], admit: Admit) -> Answered:
        """POST ``body`` to an endpoint not marked down: the one ``admit`` gives a slot at
        (admission: it may wait, or raise a 429). A failure before the first byte is tried
        once more, admitted again (on another replica when there is one: a replica that
        refused the connection is marked down and skipped), unless the engine may have
        started it (it was sent and the engine stayed silent: the client gets the error,
        never a second run). Raises ReplicasUnreachable when no endpoint could be connected
        to (nothing reached an engine: the caller may wait for the control service's view
        and try again)."""
        failures: list[str] = []
        unreachable_only = True
        for _ in range(2):
            usable = self._balancer.usable(endpoints)
            slot = admit(usable) if usable else None
            if slot is None:
                break
            ep = slot.endpoint
            try:
                answer = self._pools.post(ep.url, path, body, headers)
            except (Unreachable, FailedBeforeAnswer) as exc:
                slot.release()
                failures.append(f"{ep.replica_id} ({ep.url}): {exc}")
                if isinstance(exc, Unreachable):
                    self._unreachable(model, ep, str(exc))
                else:
                    unreachable_only = False
                    log.warning("replica %s of %s failed before answering (%s)",
                                ep.replica_id, model, exc)
                    if not exc.retryable:
                        break
                continue
            except BaseException:
                slot.release()
                raise
            self._balancer.touch(ep.replica_id)
            return self._respond(model, slot, answer)
        if unreachable_only:
            raise ReplicasUnreachable(
                f"no replica of model '{model}' could be reached from this router"
                + (": " + "; ".join(failures) if failures else " (every one is marked "
                   "down after a failed connection)")
                + ". Retry shortly; `llmgw ctl status` shows the replicas' state")
        raise UpstreamError(f"every tried replica of model '{model}' failed before answering: "
                            + "; ".join(failures)
                            + ". Retry shortly; `llmgw ctl status` shows the replicas' state")

    def _unreachable(self, model: str, ep: Endpoint, why: str) -> None:
        if not self._balancer.mark_down(ep.replica_id, why):
            return
        log.warning("replica %s of %s (%s) refused the connection (%s); not routing to it "
                    "from this worker until the control service confirms it", ep.replica_id,
                    model, ep.url, why)
        if self._on_unreachable is not None:
            self._on_unreachable(ep.replica_id, why)

    def _respond(self, model: str, slot: Slot, answer: Answer) -> Answered:
        ep = slot.endpoint
        ctype = answer.header("content-type") or ""
        length = answer.header("content-length")
        streaming = (length is None or ctype.startswith("text/event-stream")
                     or int(length) > self._max_buffered)
        headers = downstream_headers(answer.headers)
        headers.append((REPLICA_HEADER, ep.replica_id))
        headers.append((MODEL_HEADER, model))
        if length is not None and streaming:
            headers.append(("Content-Length", length))   # passed through as it comes
        if not streaming:
            try:
                data = answer.read()
            except BrokeOff as exc:
                raise UpstreamError(f"replica {ep.replica_id} of model '{model}' broke off its "
                                    f"answer: {exc}; retry the request") from None
            finally:
                slot.release()
            headers.append(("Content-Length", str(len(data))))
            return Answered(answer.status, headers, [data])
        named = {k.lower() for k, _ in headers}
        headers += [(k, v) for k, v in _STREAM_HEADERS if k.lower() not in named]
        return Answered(answer.status, headers, Stream(slot, answer))


class Answered(NamedTuple):
    """An engine's answer, for the WSGI server: status, headers, body (an iterable whose
    ``close``, when it has one, the server calls at the end)."""

    status: int
    headers: list[tuple[str, str]]
    body: Iterable[bytes]


class Stream:
    """A streamed answer, carried to the client as it comes: by the relay loop when the
    server hands over the client's socket (:meth:`relay`), else piece by piece (iterated).
    Its slot is given back when the server closes it (also when it never started: the
    client went away first). ``scan`` (usage, ``usage.py``) sees every piece; ``first_byte``
    is called before the first one goes out; ``on_close`` callbacks run at the close."""

    __slots__ = ("_slot", "_answer", "scan", "first_byte", "outcome", "_closers", "_closed")

    def __init__(self, slot: Slot, answer: Answer) -> None:
        self._slot = slot
        self._answer = answer
        self.scan: Any = None
        self.first_byte: Callable[[], None] | None = None
        self.outcome = "open"      # then "complete", or "broken" (the engine's side)
        self._closers: list[Callable[[], None]] = []
        self._closed = False

    def on_close(self, callback: Callable[[], None]) -> None:
        self._closers.append(callback)

    def relay(self, sock: Any, head: bytes, chunked: bool) -> None:
        """The whole answer to the client's socket ``sock``, after ``head`` (the server's
        contract: StreamBroken when the answer broke, OSError when the client left)."""
        answer = self._answer
        link = answer.link
        try:
            up, client = link.raw, os_socket(sock)
            if up is not None and client is not None:   # plain TCP on both sides
                impl.pump(gevent.get_hub(), up, answer.reader, client, head, chunked,
                          self.scan, self.first_byte, link.idle_s)
            else:                                       # TLS on a side: greenlet waits
                impl.relay(link, answer.reader, sender(sock), head, chunked, self.scan,
                           self.first_byte)
        except (Closed, Malformed) as exc:
            self._broke(exc)
        self.outcome = "complete"
        answer.release()

    def _broke(self, exc: BaseException) -> None:
        """(The server logs it, with the request's method and path.)"""
        self.outcome = "broken"
        raise StreamBroken(f"the answer of replica {self._slot.endpoint.replica_id} broke "
                           f"off: {exc}") from None

    def __iter__(self) -> Iterator[bytes]:
        outgoing = impl.Outgoing(None, False, self.scan, self.first_byte)
        try:
            for data in self._answer.chunks():
                out = outgoing.piece(data)
                if out:
                    yield out
        except BrokeOff as exc:
            self._broke(exc)
        self.outcome = "complete"
        rest = outgoing.end()
        if rest:
            yield rest

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._answer.close()   # a no-op after a complete answer; else never reuse it
        finally:
            self._slot.release()
            for callback in self._closers:
                try:
                    callback()
                except Exception:
                    log.exception("a stream's close callback failed")


class Slot(Protocol):
    """A replica chosen for one request, held until ``release`` (called at least once:
    it must act only on the first call)."""

    endpoint: Endpoint

    def release(self) -> None: ...


Admit = Callable[[Sequence[Endpoint]], "Slot | None"]
