"""What comes in: a request head llhttp parsed (in ``server.py``) as a WSGI environ, its
body as the app reads it (``wsgi.input``), and the lingering close after an answer given
before the body arrived.

The body is pulled from the client only as the app reads it (llhttp, in ``server.py``,
takes the framing off); the whole body must arrive within one deadline,
:data:`BODY_DEADLINE_S` from the first read, however it trickles: a per-read timeout let a
client that sends one byte every 20 s hold a connection for ever, and enough such clients
starved ``/healthz``.

:func:`linger` is nginx's lingering close: after an answer given before the body was read
(a 413, a 401), the server shuts its sending side and reads and discards what the client
still sends, for at most :data:`LINGER_S` and :data:`LINGER_BYTES`, before it closes. A
client still uploading then reads the status instead of a connection reset (a close with
unread data sends a reset, which can destroy the answer before the client reads it).
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any, Protocol
from urllib.parse import unquote_to_bytes

import httptools

MAX_HEAD = 65536              # bytes of request line and headers
MAX_REQUEST_LINE = 8190       # bytes of the request target
MAX_HEADERS = 100
BODY_DEADLINE_ENV = "LLMGW_ROUTER_BODY_DEADLINE_S"
SMALL_UNREAD_BODY = 1 << 16   # drained after the answer to keep the connection; more closes it
LINGER_S = 5.0                # the most a lingering close reads what the client still sends
LINGER_BYTES = 64 << 20       # and the most it reads, whatever the body's announced size
_BLOCK = 65536
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_431 = "431 Request Header Fields Too Large"


def _deadline_from_env() -> float:
    text = os.environ.get(BODY_DEADLINE_ENV, "").strip()
    try:
        value = float(text) if text else 60.0
    except ValueError:
        value = -1.0
    if not 0 < value < 86400:
        raise RuntimeError(f"{BODY_DEADLINE_ENV}={text!r}: set it to the seconds a client "
                           "has to send a whole request body (a number above 0; default 60)")
    return value


BODY_DEADLINE_S = _deadline_from_env()   # read at import: tests may set it on the module


class BadRequest(Exception):
    """The request cannot be served; answered with ``status`` and the connection closed."""

    def __init__(self, status: str, why: str, detail: str = "") -> None:
        super().__init__(why)
        self.status = status
        self.detail = detail or why


def environ_of(base: dict[str, Any], method: bytes, version: str, url: bytes,
               fields: list[tuple[bytes, bytes]]) -> tuple[dict[str, Any], int | None, bool]:
    """A head llhttp parsed as a WSGI environ (``base`` and the request's keys), with its
    body's length (None: chunked) and whether the client waits for ``100 Continue``."""
    if version not in ("1.1", "1.0"):
        raise BadRequest("505 HTTP Version Not Supported", "only HTTP/1.0 and 1.1")
    if len(url) + sum(len(n) + len(v) + 4 for n, v in fields) > MAX_HEAD:
        raise BadRequest(_431, f"a head over {MAX_HEAD} bytes")
    if url[:1] != b"/" and url != b"*" and b"://" not in url[:10]:
        raise BadRequest("400 Bad Request", "the request target is malformed")
    try:
        parts = httptools.parse_url(url)
    except httptools.HttpParserInvalidURLError:
        raise BadRequest("400 Bad Request", "the request target is malformed") from None
    path = parts.path or b"/"
    environ = dict(base)
    environ["REQUEST_METHOD"] = method.decode("ascii")
    environ["SERVER_PROTOCOL"] = "HTTP/" + version
    environ["RAW_URI"] = url.decode("latin-1")
    environ["PATH_INFO"] = (unquote_to_bytes(path) if b"%" in path else path).decode("latin-1")
    environ["QUERY_STRING"] = (parts.query or b"").decode("latin-1")
    for name, value in fields:
        if b"_" in name:
            continue
        key = name.upper().replace(b"-", b"_").decode("ascii")
        if key not in ("CONTENT_TYPE", "CONTENT_LENGTH"):
            key = "HTTP_" + key
        text = value.strip(b" \t").decode("latin-1")
        if key in environ:
            if key == "HTTP_HOST" and environ[key] != text:
                raise BadRequest("400 Bad Request", "two different Host fields")
            text = environ[key] + "," + text
        environ[key] = text
    coding = environ.get("HTTP_TRANSFER_ENCODING")
    length: int | None = int(environ.get("CONTENT_LENGTH") or 0)   # digits: llhttp checked
    if coding is not None:
        if coding.strip().lower() != "chunked" or version != "1.1":
            raise BadRequest("501 Not Implemented", "only the chunked transfer coding "
                             "(and only in HTTP/1.1)")
        environ["wsgi.input_terminated"] = True
        length = None
    expect = environ.get("HTTP_EXPECT", "").lower() == "100-continue" and version == "1.1"
    return environ, length, expect


class BodyError(OSError):
    """The body cannot be read: its framing is malformed (400) or it did not arrive in
    time (408). The server answers ``status`` itself, whatever the app made of the error,
    and closes the connection. An OSError, as a failed read of ``wsgi.input`` is (werkzeug
    turns one into a 400 where it reads)."""

    def __init__(self, status: str, why: str) -> None:
        super().__init__(why)
        self.status = status


class Source(Protocol):
    """The connection a body comes from (``server.Connection``)."""

    def pull(self, body: BodyIn, deadline: float) -> None:
        """Receive once before ``deadline`` and feed the parser (TimeoutError past it,
        ConnectionResetError when the client closed, BodyError on bad framing)."""

    def sendall(self, data: bytes) -> None:
        """Send ``data`` to the client."""


class BodyIn:
    """``wsgi.input``: the bytes llhttp gave for one request (:meth:`take`), more pulled
    from the connection as the app reads. ``left``: bytes still to arrive (None: chunked,
    unknown); ``done``: the whole body arrived."""

    def __init__(self, source: Source, length: int | None, expect: bool) -> None:
        self.source = source
        self.left = length
        self.done = length == 0
        self.expect = expect and length != 0
        self.buf = bytearray()
        self.deadline: float | None = None
        self.error: BodyError | None = None
        self.failed = False            # a read failed: the rest of the body is unknown

    def take(self, data: bytes) -> None:
        """A piece of the body from the parser."""
        self.buf += data
        if self.left is not None:
            self.left -= len(data)

    def _fill(self, want: int) -> None:
        """At least ``want`` bytes buffered, or the whole body."""
        while len(self.buf) < want and not self.done:
            if self.error is not None:
                raise self.error
            if self.expect:
                self.expect = False
                self.source.sendall(_CONTINUE)
            if self.deadline is None:
                self.deadline = time.monotonic() + BODY_DEADLINE_S
            try:
                self.source.pull(self, self.deadline)
            except BodyError as exc:
                self.error = exc
                raise
            except TimeoutError:
                self.error = BodyError(
                    "408 Request Timeout",
                    f"the request body did not arrive within {BODY_DEADLINE_S:g} s (the "
                    f"whole body; the router's setting {BODY_DEADLINE_ENV}): send it faster")
                raise self.error from None
            except OSError:
                self.failed = True
                raise

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            self._fill(1 << 62)
            size = len(self.buf)
        elif len(self.buf) < size:
            self._fill(size)
        data = bytes(self.buf[:size])
        del self.buf[:size]
        return data

    def readline(self, size: int | None = -1) -> bytes:
        limit = 1 << 62 if size is None or size < 0 else size
        while True:
            end = self.buf.find(b"\n", 0, limit)
            if end >= 0:
                return self.read(end + 1)
            if len(self.buf) >= limit or self.done:
                return self.read(limit)
            self._fill(len(self.buf) + 1)

    def __iter__(self) -> Any:
        return iter(self.readline, b"")

    def keeps(self) -> bool:
        """Whether the connection may go on after the answer whatever the app read: what
        is still to arrive is known and at most :data:`SMALL_UNREAD_BODY` (drained), and
        the client is not waiting for a ``100 Continue`` that never came."""
        if self.done:
            return True
        if self.error is not None or self.failed or self.expect or self.left is None:
            return False
        return self.left <= SMALL_UNREAD_BODY

    def finish(self) -> bool:
        """After the answer: the unread rest drained (True: the connection may serve the
        next request), or not (False: close it)."""
        if not self.keeps():
            return False
        try:
            self._fill(1 << 62)
        except OSError:
            return False
        self.buf.clear()
        return True


def linger(sock: Any) -> None:
    """Shut the sending side (the client reads the answer, then the end), then read and
    discard what the client still sends until it closes, :data:`LINGER_S` pass or
    :data:`LINGER_BYTES` arrived; the caller closes the socket."""
    try:
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        return
    deadline = time.monotonic() + LINGER_S
    scratch = bytearray(_BLOCK)
    got = 0
    try:
        while got < LINGER_BYTES:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            sock.settimeout(left)
            n = sock.recv_into(scratch)
            if not n:
                return
            got += n
    except OSError:
        return
