"""The router's gunicorn worker: gunicorn's gevent worker with a lean HTTP/1.1 loop.

gunicorn's own loop (``AsyncWorker.handle_request``) is general: a parser of many small
objects and regular expressions, hooks and timestamps for every request, the status line
and headers sent in one system call and the body in another. Under
``../shared/bench-proxy`` that was about a third of the router's CPU per proxied request
(py-spy: parsing 11 %, writing 18 %, of which 14 % the separate header send). This worker
keeps gunicorn for everything around the connection (the arbiter, signals, graceful
shutdown, TLS, worker heartbeat, ``worker_connections``) and serves each connection with
:class:`Connection`:

- the request head is read with one timeout for the whole head (``keepalive`` seconds:
  a slow or idle client is dropped, as gunicorn does) and parsed strictly: one request line
  of an allowed method token and ``HTTP/1.0`` or ``HTTP/1.1``, at most
  :data:`MAX_HEADERS` fields in :data:`MAX_HEAD` bytes, field names that are tokens,
  values without control characters. A header name with ``_`` is dropped (``X_Api_Key``
  must not pass for ``X-Api-Key`` in the WSGI environ, gunicorn's ``header_map = drop``).
  Both Content-Length and Transfer-Encoding, two different Content-Lengths, or a
  transfer coding other than ``chunked`` are refused: the ways a request is smuggled.
- the answer goes out in as few sends as it can: a list body (every non-streamed
  answer) with its status line and headers in one ``sendall``; a stream's head with its
  first chunk, then one send per chunk (chunked transfer coding when the length is
  unknown).
- a body the app did not read is drained after the answer when at most
  :data:`SMALL_UNREAD_BODY` bytes are left; otherwise (or a chunked body not read to its
  end) the answer says ``Connection: close`` and the connection is closed (a 413 or 401
  answered before the body).
"""

from __future__ import annotations

import errno
import sys
import time
from collections.abc import Callable, Iterable
from email.utils import formatdate
from typing import Any
from urllib.parse import unquote_to_bytes

from gunicorn import util
from gunicorn.workers.ggevent import GeventWorker

from .http1 import BAD_VALUE, TOKEN
from .rawsock import sender

MAX_HEAD = 65536              # bytes of request line and headers
MAX_REQUEST_LINE = 8190
MAX_HEADERS = 100
SMALL_UNREAD_BODY = 1 << 16   # drained to keep the connection; anything larger closes it
BODY_TIMEOUT_S = 60.0         # the most a client may pause while sending its body
_BLOCK = 65536
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_QUIET_ERRNOS = frozenset({errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN, errno.ESHUTDOWN})


class BadRequest(Exception):
    """The request cannot be served; answered with ``status`` and the connection closed."""

    def __init__(self, status: str, why: str) -> None:
        super().__init__(why)
        self.status = status


class _Date:
    """The Date header's value, formatted once a second."""

    second = -1
    value = ""

    @classmethod
    def now(cls) -> str:
        second = int(time.time())
        if second != cls.second:
            cls.second, cls.value = second, formatdate(second, usegmt=True)
        return cls.value


class RouterWorker(GeventWorker):
    """gunicorn's gevent worker, each connection served by :class:`Connection`."""

    def handle(self, listener: Any, client: Any, addr: Any) -> None:
        client.setblocking(1)
        try:
            Connection(self, client, addr, listener).serve()
        except OSError as exc:
            if exc.errno not in _QUIET_ERRNOS:
                self.log.exception("socket error serving a connection")
        except Exception:
            self.log.exception("error serving a connection")
        finally:
            util.close(client)


class Connection:
    """One client connection: requests read, served by the WSGI app and answered in turn
    until either side closes it or the worker stops."""

    def __init__(self, worker: Any, sock: Any, addr: Any, listener: Any) -> None:
        self.worker = worker
        self.sock = sock
        self.sendall = sender(sock)
        self.buf = bytearray()
        cfg = worker.cfg
        self.keepalive_s = float(cfg.keepalive or 0)
        name = listener.getsockname()
        host, port = name[:2] if isinstance(name, tuple) else (str(name), "")
        self.base = {
            "wsgi.version": (1, 0), "wsgi.url_scheme": "https" if cfg.is_ssl else "http",
            "wsgi.errors": sys.stderr, "wsgi.multithread": True,
            "wsgi.multiprocess": cfg.workers > 1, "wsgi.run_once": False,
            "SCRIPT_NAME": "", "SERVER_SOFTWARE": "llmgw-router", "SERVER_NAME": str(host),
            "SERVER_PORT": str(port), "gunicorn.socket": sock,
            "REMOTE_ADDR": addr[0] if isinstance(addr, tuple) else str(addr),
            "REMOTE_PORT": str(addr[1]) if isinstance(addr, tuple) else "",
        }

    # -- reading -------------------------------------------------------------------------

    def recv_into_buf(self, timeout_s: float | None) -> bool:
        """Append what arrives to the buffer; False when the client closed."""
        self.sock.settimeout(timeout_s)
        data = self.sock.recv(_BLOCK)
        if not data:
            return False
        self.buf += data
        return True

    def read_head(self) -> bytes | None:
        """The next request's head (without its blank line), or None when the client
        closed or stayed silent for the keep-alive time before sending one."""
        buf = self.buf
        deadline = time.monotonic() + self.keepalive_s if self.keepalive_s else None
        while True:
            while buf[:2] == b"\r\n":           # blank lines before a request: ignored
                del buf[:2]
            end = buf.find(b"\r\n\r\n")
            if end >= 0:
                head = bytes(buf[:end])
                del buf[:end + 4]
                return head
            if len(buf) > MAX_HEAD:
                raise BadRequest("431 Request Header Fields Too Large",
                                 f"the request head is over {MAX_HEAD} bytes")
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            try:
                if not self.recv_into_buf(left):
                    return None
            except TimeoutError:
                return None

    # -- one request -----------------------------------------------------------------------

    def serve(self) -> None:
        worker = self.worker
        while worker.alive:
            try:
                head = self.read_head()
                if head is None:
                    return
                environ, body = self.parse(head)
            except BadRequest as exc:
                self.refuse(exc)
                return
            worker.nr += 1
            if worker.nr >= worker.max_requests and worker.alive:
                worker.log.info("Autorestarting worker after current request.")
                worker.alive = False
            if not self.respond(environ, body) or not worker.alive:
                return

    def parse(self, head: bytes) -> tuple[dict[str, Any], Body]:
        if len(head) > MAX_HEAD:
            raise BadRequest("431 Request Header Fields Too Large",
                             f"the request head is over {MAX_HEAD} bytes")
        line_end = head.find(b"\r\n")
        line = head if line_end < 0 else head[:line_end]
        if len(line) > MAX_REQUEST_LINE:
            raise BadRequest("414 URI Too Long", "the request line is too long")
        parts = line.split(b" ")
        if len(parts) != 3 or not TOKEN.match(parts[0]):
            raise BadRequest("400 Bad Request", "the request line is malformed")
        method, target, version = parts
        if version not in (b"HTTP/1.1", b"HTTP/1.0"):
            raise BadRequest("505 HTTP Version Not Supported", "only HTTP/1.0 and 1.1")
        if target[:1] != b"/":
            if target == b"*" or b"://" in target[:10]:
                target = _origin_form(target)
            else:
                raise BadRequest("400 Bad Request", "the request target is malformed")
        path, _, query = target.partition(b"?")
        path = path.partition(b"#")[0]
        environ = dict(self.base)
        environ["REQUEST_METHOD"] = method.decode("ascii")
        environ["SERVER_PROTOCOL"] = version.decode("ascii")
        environ["RAW_URI"] = target.decode("latin-1")
        environ["PATH_INFO"] = (unquote_to_bytes(path) if b"%" in path else path
                                ).decode("latin-1")
        environ["QUERY_STRING"] = query.partition(b"#")[0].decode("latin-1")
        if line_end >= 0:
            lines = head[line_end + 2:].split(b"\r\n")
            if len(lines) > MAX_HEADERS:
                raise BadRequest("431 Request Header Fields Too Large",
                                 f"more than {MAX_HEADERS} header fields")
            for field in lines:
                name, colon, value = field.partition(b":")
                if not colon or not TOKEN.match(name):
                    raise BadRequest("400 Bad Request", "a header field is malformed")
                value = value.strip(b" \t")
                if BAD_VALUE.search(value):
                    raise BadRequest("400 Bad Request", "a header value has control bytes")
                if b"_" in name:
                    continue
                key = name.upper().replace(b"-", b"_").decode("ascii")
                if key not in ("CONTENT_TYPE", "CONTENT_LENGTH"):
                    key = "HTTP_" + key
                text = value.decode("latin-1")
                if key in environ:
                    if key in ("CONTENT_LENGTH", "HTTP_HOST") and environ[key] != text:
                        raise BadRequest("400 Bad Request", f"two different {name!r} fields")
                    if key not in ("CONTENT_LENGTH", "HTTP_HOST"):
                        text = environ[key] + "," + text
                environ[key] = text
        return environ, self.body_of(environ)

    def body_of(self, environ: dict[str, Any]) -> Body:
        coding = environ.get("HTTP_TRANSFER_ENCODING")
        length = environ.get("CONTENT_LENGTH")
        expect = environ.get("HTTP_EXPECT", "").lower() == "100-continue"
        if coding is not None:
            if length is not None:
                raise BadRequest("400 Bad Request",
                                 "both Content-Length and Transfer-Encoding")
            if coding.strip().lower() != "chunked" or environ["SERVER_PROTOCOL"] != "HTTP/1.1":
                raise BadRequest("501 Not Implemented", "only the chunked transfer coding")
            body: Body = Chunked(self, expect)
            environ["wsgi.input_terminated"] = True
        elif length is not None:
            if not length.isdigit() or len(length) > 18:
                raise BadRequest("400 Bad Request", "Content-Length is not a number")
            body = Body(self, int(length), expect)
        else:
            body = Body(self, 0, False)
        environ["wsgi.input"] = body
        return body

    def refuse(self, exc: BadRequest) -> None:
        text = f"{exc}\n".encode()
        try:
            self.sock.settimeout(5.0)
            self.sock.sendall(f"HTTP/1.1 {exc.status}\r\nContent-Type: text/plain\r\n"
                              f"Content-Length: {len(text)}\r\nConnection: close\r\n\r\n"
                              .encode("latin-1") + text)
        except OSError:
            pass

    # -- answering -------------------------------------------------------------------------

    def respond(self, environ: dict[str, Any], body: Body) -> bool:
        """Serve one request; True when the connection may serve another."""
        keep = (environ["SERVER_PROTOCOL"] == "HTTP/1.1"
                and "close" not in environ.get("HTTP_CONNECTION", "").lower()) or (
            environ["SERVER_PROTOCOL"] == "HTTP/1.0"
            and "keep-alive" in environ.get("HTTP_CONNECTION", "").lower())
        if not self.keepalive_s or not self.worker.alive:
            keep = False
        started: list[Any] = []

        def start_response(status: str, headers: list[tuple[str, str]],
                           exc_info: Any = None) -> Callable[[bytes], None]:
            if exc_info and started and started[0] is _SENT:
                raise exc_info[1].with_traceback(exc_info[2])
            started[:] = [status, headers]
            return legacy.append

        legacy: list[bytes] = []
        self.sock.settimeout(None)
        try:
            answer = self.worker.wsgi(environ, start_response)
        except Exception:
            self.worker.log.exception("the app failed on %s %s", environ["REQUEST_METHOD"],
                                      environ["PATH_INFO"])
            self.refuse(BadRequest("500 Internal Server Error", "the router failed on this "
                                   "request (its log says why)"))
            return False
        try:
            if not started:
                raise RuntimeError("the app did not call start_response")
            head_only = environ["REQUEST_METHOD"] == "HEAD"
            # What the app left of the body: drained after the answer when small, else
            # the answer says the connection closes.
            keep = self.write(started, answer, legacy, keep and body.drainable(), head_only,
                              environ)
        finally:
            close = getattr(answer, "close", None)
            if close is not None:
                close()
        return keep and body.finish()

    def write(self, started: list[Any], answer: Iterable[bytes], legacy: list[bytes],
              keep: bool, head_only: bool, environ: dict[str, Any]) -> bool:
        status, headers = started
        length = None
        dated = False
        lines = [f"HTTP/1.1 {status}\r\n"]
        for name, value in headers:
            if "\n" in value or "\r" in value or "\n" in name or "\r" in name:
                raise ValueError(f"response header {name!r} has a line break")
            low = name.lower()
            if low == "content-length":
                length = value
                continue
            if low == "connection":
                if "close" in value.lower():
                    keep = False
                continue
            elif low == "transfer-encoding":
                continue
            elif low == "date":
                dated = True
            lines.append(f"{name}: {value}\r\n")
        if not dated:
            lines.append(f"Date: {_Date.now()}\r\n")
        whole: list[bytes] | None = None
        if isinstance(answer, list | tuple):
            whole = [*legacy, *answer]
            if length is None:
                length = str(sum(len(part) for part in whole))
        if length is not None:
            lines.append(f"Content-Length: {length}\r\n")
            chunked = False
        elif head_only:
            chunked = False
        elif environ["SERVER_PROTOCOL"] == "HTTP/1.1":
            lines.append("Transfer-Encoding: chunked\r\n")
            chunked = True
        else:
            chunked, keep = False, False     # HTTP/1.0, no length: the close ends it
        if not keep:
            lines.append("Connection: close\r\n")
        elif environ["SERVER_PROTOCOL"] == "HTTP/1.0":
            lines.append("Connection: keep-alive\r\n")
        lines.append("\r\n")
        started[0] = _SENT
        head = "".join(lines).encode("latin-1")
        sendall = self.sendall
        if head_only:
            sendall(head)
            return keep
        if whole is not None:
            sendall(head + b"".join(whole))
            return keep
        pending: bytes | None = head
        for part in (_chain(legacy, answer) if legacy else answer):
            if not part:
                continue
            if chunked:
                part = b"%x\r\n%b\r\n" % (len(part), part)
            if pending is not None:
                part, pending = pending + part, None
            sendall(part)
        tail = b"0\r\n\r\n" if chunked else b""
        if pending is not None or tail:
            sendall((pending or b"") + tail)
        return keep


_SENT = object()


def _chain(first: list[bytes], rest: Iterable[bytes]) -> Iterable[bytes]:
    yield from first
    yield from rest


def _origin_form(target: bytes) -> bytes:
    """``http://host/path?q`` (absolute form) as ``/path?q``; ``*`` as ``*``."""
    if target == b"*":
        return target
    rest = target.split(b"://", 1)[1]
    slash = rest.find(b"/")
    return b"/" if slash < 0 else rest[slash:]


class Body:
    """``wsgi.input`` of a request with a Content-Length (0: no body)."""

    def __init__(self, conn: Connection, length: int, expect: bool) -> None:
        self.conn = conn
        self.left = length
        self.expect = expect

    def _continue(self) -> None:
        if self.expect:
            self.expect = False
            self.conn.sock.sendall(_CONTINUE)

    def _fill(self, want: int) -> None:
        """At least ``want`` bytes buffered (fewer when the client closed); a client
        silent for :data:`BODY_TIMEOUT_S` raises TimeoutError."""
        self._continue()
        conn = self.conn
        try:
            while len(conn.buf) < want:
                if not conn.recv_into_buf(BODY_TIMEOUT_S):
                    return
        finally:
            conn.sock.settimeout(None)

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0 or size > self.left:
            size = self.left
        if size == 0:
            return b""
        buf = self.conn.buf
        if len(buf) < size:
            self._fill(size)
        n = min(size, len(buf))
        if n == 0:
            self.left = 0
            raise ConnectionResetError("the client closed before sending its whole body")
        data = bytes(buf[:n])
        del buf[:n]
        self.left -= n
        return data

    def readline(self, size: int | None = -1) -> bytes:
        out = bytearray()
        while self.left and (size is None or size < 0 or len(out) < size):
            byte = self.read(1)
            out += byte
            if byte == b"\n":
                break
        return bytes(out)

    def __iter__(self) -> Any:
        return iter(self.readline, b"")

    def drainable(self) -> bool:
        """Whether what is left unread may be drained to keep the connection: at most
        :data:`SMALL_UNREAD_BODY` bytes, and not a body behind a 100-continue never sent
        (its client sends nothing more)."""
        return self.left <= SMALL_UNREAD_BODY and not (self.expect and self.left)

    def finish(self) -> bool:
        """After the answer: the unread rest drained (True: the connection may go on), or
        left unread when large (False: close it)."""
        if not self.drainable():
            return False
        try:
            while self.left:
                self.read(min(self.left, _BLOCK))
        except (OSError, TimeoutError):
            return False
        return True


class Chunked(Body):
    """``wsgi.input`` of a request in the chunked transfer coding."""

    def __init__(self, conn: Connection, expect: bool) -> None:
        super().__init__(conn, 0, expect)
        self.done = False

    def _line(self) -> bytes:
        buf = self.conn.buf
        while True:
            end = buf.find(b"\r\n")
            if end >= 0:
                line = bytes(buf[:end])
                del buf[:end + 2]
                return line
            if len(buf) > 4096:
                raise BadRequest("400 Bad Request", "a chunk size line is too long")
            before = len(buf)
            self._fill(before + 1)
            if len(buf) == before:
                raise ConnectionResetError("the client closed inside a chunked body")

    def _next_chunk(self) -> None:
        size = self._line().split(b";", 1)[0].strip()
        if not size or len(size) > 16 or not all(c in b"0123456789abcdefABCDEF" for c in size):
            raise BadRequest("400 Bad Request", "a chunk size is malformed")
        self.left = int(size, 16)
        if self.left == 0:
            while self._line():             # trailers, up to the blank line
                pass
            self.done = True

    def read(self, size: int | None = -1) -> bytes:
        out = bytearray()
        while not self.done and (size is None or size < 0 or len(out) < size):
            if self.left == 0:
                self._next_chunk()
                continue
            want = self.left if size is None or size < 0 else min(self.left, size - len(out))
            out += Body.read(self, want)
            if self.left == 0:
                if self._line():
                    raise BadRequest("400 Bad Request", "a chunk does not end with CRLF")
        return bytes(out)

    def drainable(self) -> bool:
        """Only a chunked body read to its end: the rest's length is unknown."""
        return self.done

    def finish(self) -> bool:
        return self.done
