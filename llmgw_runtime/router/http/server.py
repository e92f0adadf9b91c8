"""The router's HTTP/1.1 server: gunicorn's gevent worker (arbiter, signals, graceful
shutdown, TLS, ``worker_connections``) serving each connection with :class:`Connection`.

Nothing is parsed by hand: httptools (llhttp, uvicorn's parser) reads request lines,
headers, Content-Length and chunked bodies, and refuses the malformed and the smuggling
shapes (Content-Length with Transfer-Encoding, two Content-Lengths). The limits on top
(here and in ``body_in.environ_of``): only ``chunked`` (501), HTTP/1.0 and 1.1 (505),
``MAX_HEAD`` bytes and ``MAX_HEADERS`` fields (431), ``MAX_REQUEST_LINE`` (414), names with ``_``
dropped (``X_Api_Key`` must not pass for ``X-Api-Key``, gunicorn's ``header_map = drop``).
A head must arrive whole within the keep-alive time, a body within
``body_in.BODY_DEADLINE_S``, however slowly either trickles.

Answers go out in as few sends as they can: a list body with its head in one send, a
stream's head with its first piece. A body with a ``relay`` method sends itself
(``relay(sock, head, chunked)``). A stream broken after its head went out ends the
connection without the chunked terminator, so the client sees it broken (as nginx does).
"""

from __future__ import annotations

import errno
import logging
import socket
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from email.utils import formatdate
from itertools import chain
from typing import Any

import httptools
from gunicorn import util
from gunicorn.workers.ggevent import GeventWorker

from . import body_in
from .body_in import BadRequest, BodyError, BodyIn, environ_of, linger
from .errors import StreamBroken
from .rawsock import os_socket, sender

HEAD_DEADLINE_S = 5.0         # a head's time when keep-alive is off
SWEEP_S = 0.5                 # how often a worker ends the waits for a head past its deadline
_BLOCK = 65536
_500 = "500 Internal Server Error"
_FAILED = "the router failed on this request (its log says why)"
_QUIET_ERRNOS = frozenset({errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN, errno.ESHUTDOWN})
log = logging.getLogger(__name__)
_dated: list[Any] = [-1, ""]


def _date() -> str:
    """The Date header's value, formatted once a second."""
    second = int(time.time())
    if second != _dated[0]:
        _dated[:] = [second, formatdate(second, usegmt=True)]
    return str(_dated[1])


class RouterWorker(GeventWorker):
    """gunicorn's gevent worker, each connection served by :class:`Connection`. The
    control service's web worker on PostgreSQL is one too (``control/worker.py``), under
    its own name."""

    software = "llmgw-router"       # SERVER_SOFTWARE
    failed_text = _FAILED           # a 500's text when the app raised

    def handle(self, listener: Any, client: Any, addr: Any) -> None:
        client.setblocking(1)
        if client.family in (socket.AF_INET, socket.AF_INET6):
            # Nagle with the client's delayed ACK holds a stream's second small send
            # for up to 40 ms.
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            Connection(self, client, addr, listener).serve()
        except OSError as exc:
            if exc.errno not in _QUIET_ERRNOS:
                log.exception("socket error serving a connection")
        except Exception:
            log.exception("error serving a connection")
        finally:
            util.close(client)


Request = tuple[dict[str, Any], BodyIn, bool]   # environ, its body, keep-alive asked


class Waiting:
    """The connections of one worker waiting for a request's head, with its deadline, and
    one greenlet that ends those past it (every ``SWEEP_S``): the wait itself is untimed.

    A timed read makes a gevent ``Timeout``, its timer and a ``TimeoutError`` per wait.
    Thousands of idle keep-alive connections (one per agent at the control service, each
    idle the seconds between its reports) kept that many of each alive at once, and every
    collection of the young generations walked them: 50-220 ms stops of the worker
    (docs/performance.md). Here a wait costs a dict entry and no collected object."""

    def __init__(self) -> None:
        self.until: dict[Connection, float] = {}
        self.sweeper: Any = None

    def add(self, conn: Connection, deadline: float) -> None:
        self.until[conn] = deadline
        if self.sweeper is None:
            import gevent
            self.sweeper = gevent.spawn(self._sweep)

    def _sweep(self) -> None:
        import gevent
        try:
            while self.until:
                gevent.sleep(SWEEP_S)
                now = time.monotonic()
                for conn in [c for c, t in self.until.items() if t <= now]:
                    del self.until[conn]
                    conn.expire()
        finally:
            self.sweeper = None


def waiting_of(worker: Any) -> Waiting:
    found: Waiting | None = getattr(worker, "llmgw_waiting", None)
    if found is None:
        found = worker.llmgw_waiting = Waiting()
    return found


class Connection:
    """One client connection: requests parsed by llhttp, served by the WSGI app and
    answered in turn until either side closes it or the worker stops. It is also the
    parser's protocol object (the ``on_*`` callbacks)."""

    def __init__(self, worker: Any, sock: Any, addr: Any, listener: Any) -> None:
        self.worker = worker
        self.sock = sock
        self.sendall = sender(sock)
        self.raw = os_socket(sock)               # the OS socket; None: TLS
        self.kept = False                        # answered a request: waits before a read
        self.failed_text = getattr(worker, "failed_text", _FAILED)
        cfg = worker.cfg
        self.keepalive_s = float(cfg.keepalive or 0)
        self.waiting = waiting_of(worker)
        self.expired = False                     # the sweeper ended the wait for a head
        self.parser = httptools.HttpRequestParser(self)
        self.ready: deque[Request] = deque()     # parsed heads not served yet (pipelining)
        self.failed: BadRequest | None = None   # the parser stopped on this
        self.ended = False                       # an upgrade: nothing more is parsed
        self.in_head = True
        self.head_fed = 0                        # bytes fed while a head is unfinished
        self.url = bytearray()
        self.fields: list[tuple[bytes, bytes]] = []
        self.body: BodyIn | None = None          # the body the parser is filling
        name = listener.getsockname()
        software = getattr(worker, "software", "llmgw-router")
        host, port = name[:2] if isinstance(name, tuple) else (str(name), "")
        self.base = {
            "wsgi.version": (1, 0), "wsgi.url_scheme": "https" if cfg.is_ssl else "http",
            "wsgi.errors": sys.stderr, "wsgi.multithread": True,
            "wsgi.multiprocess": cfg.workers > 1, "wsgi.run_once": False,
            "SCRIPT_NAME": "", "SERVER_SOFTWARE": software, "SERVER_NAME": str(host),
            "SERVER_PORT": str(port), "gunicorn.socket": sock,
            "REMOTE_ADDR": addr[0] if isinstance(addr, tuple) else str(addr),
            "REMOTE_PORT": str(addr[1]) if isinstance(addr, tuple) else "",
        }

    # -- the parser's callbacks ------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.url.clear()
        self.fields = []
        self.in_head = True

    def on_url(self, part: bytes) -> None:
        self.url += part
        if len(self.url) > body_in.MAX_REQUEST_LINE:
            raise BadRequest("414 URI Too Long",
                             f"a target over {body_in.MAX_REQUEST_LINE} bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        self.fields.append((name, value))
        if len(self.fields) > body_in.MAX_HEADERS:
            raise BadRequest(body_in._431, f"more than {body_in.MAX_HEADERS} header fields")

    def on_headers_complete(self) -> None:
        self.in_head = False
        self.head_fed = 0
        environ, length, expect = environ_of(
            self.base, self.parser.get_method(), self.parser.get_http_version(),
            bytes(self.url), self.fields)
        body = environ["wsgi.input"] = BodyIn(self, length, expect)
        self.body = body
        self.ready.append((environ, body, self.parser.should_keep_alive()))

    def on_body(self, data: bytes) -> None:
        assert self.body is not None
        self.body.take(data)

    def on_message_complete(self) -> None:
        if self.body is not None:
            self.body.done = True
        self.in_head = True

    # -- reading -------------------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        """Parse what arrived; a refusal is kept in :attr:`failed` (it concerns the request
        being parsed, which may come after the one being served)."""
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.ended = True            # served as a plain request, then closed
        except httptools.HttpParserCallbackError as exc:
            if not isinstance(exc.__context__, BadRequest):
                raise
            self.failed = exc.__context__
        except httptools.HttpParserError as exc:
            why = str(exc)
            status = ("505 HTTP Version Not Supported" if "HTTP version" in why
                      else "400 Bad Request")
            self.failed = BadRequest(status, f"the request is malformed: {why}", why)
        if self.in_head and self.failed is None:
            self.head_fed += len(data)    # llhttp holds an unfinished field: bound it
            if self.head_fed > body_in.MAX_HEAD + _BLOCK:
                self.failed = BadRequest(body_in._431,
                                         f"a head over {body_in.MAX_HEAD} bytes")

    def _recv(self, deadline: float) -> bytes:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        self.sock.settimeout(left)
        try:
            return self.sock.recv(_BLOCK)     # type: ignore[no-any-return]
        finally:
            self.sock.settimeout(None)

    def _recv_head(self, deadline: float) -> bytes:
        """A read while waiting for a head: untimed, ended by the worker's sweeper once
        ``deadline`` passed (:class:`Waiting`); b"" then, as when the client closed."""
        if deadline <= time.monotonic():
            return b""
        waiting = self.waiting
        waiting.add(self, deadline)
        try:
            if self.kept and self.raw is not None:
                return self._read_when_ready(self.raw)
            return self.sock.recv(_BLOCK)     # type: ignore[no-any-return]
        except OSError as exc:
            import ssl  # here, not at import: gevent patches it in the worker first

            # A TLS connection shakes hands at this first read (tls.LazyHandshake): one
            # cut off by the sweeper, or whose client is not speaking TLS, just ends.
            if self.expired or isinstance(exc, ssl.SSLError):
                log.debug("connection from %s ended before a request: %s",
                          self.base["REMOTE_ADDR"], exc)
                return b""
            raise
        finally:
            waiting.until.pop(self, None)

    def _read_when_ready(self, raw: Any) -> bytes:
        """A kept-alive connection's next read: the socket waited on first, then the OS
        socket read. Its next request comes seconds later (an agent's, a router's poll),
        so gevent's ``recv``, which reads first, failed once per request (EAGAIN: a system
        call and an exception each, 5,000 a second at 10,000 agents)."""
        sock = self.sock
        while True:
            sock._wait(sock._read_event)
            try:
                return raw.recv(_BLOCK)       # type: ignore[no-any-return]
            except BlockingIOError:
                continue                      # woken, but nothing to read after all

    def expire(self) -> None:
        """End the wait for a head (the sweeper's call): the read side is shut, so the
        read returns at once with what had arrived, then with nothing."""
        self.expired = True
        try:
            getattr(self.sock, "_sock", self.sock).shutdown(socket.SHUT_RD)
        except OSError:
            pass

    def next_request(self, deadline: float) -> Request | None:
        """The next request (its head whole, its body to be read), or None when the client
        closed or did not send a whole head before ``deadline``."""
        while not self.ready:
            if self.failed is not None:
                raise self.failed
            if self.ended:
                return None
            data = self._recv_head(deadline)
            if not data:
                return None
            self.feed(data)
        return self.ready.popleft()

    def pull(self, body: BodyIn, deadline: float) -> None:
        """More of ``body`` (``body_in.Source``); the parser may have stopped inside it
        already, when it parsed the head."""
        if not body.done and self.failed is None and not self.ended:
            data = self._recv(deadline)
            if not data:
                raise ConnectionResetError("the client closed before sending its whole body")
            self.feed(data)
        if not body.done and (self.failed is not None or self.ended):
            why = self.failed.detail if self.failed is not None else "an upgrade"
            raise BodyError("400 Bad Request", f"the request body is malformed: {why}")

    # -- serving ---------------------------------------------------------------------------

    def serve(self) -> None:
        worker = self.worker
        while worker.alive:
            try:
                request = self.next_request(time.monotonic()
                                            + (self.keepalive_s or HEAD_DEADLINE_S))
            except BadRequest as exc:
                self.refuse(exc)
                return
            if request is None:
                return
            worker.nr += 1
            if worker.nr >= worker.max_requests and worker.alive:
                worker.log.info("Autorestarting worker after current request.")
                worker.alive = False
            environ, body, keep = request
            if not self.respond(environ, body, keep) or not worker.alive:
                return
            self.kept = True
            # Nothing of a served request lives on while the connection waits for its next
            # one (an agent's, seconds later): thousands of idle keep-alive connections'
            # last requests were the young objects every collection walked.
            if self.body is body:
                self.body = None
            del request, environ, body

    def refuse(self, exc: BadRequest | BodyError, lingers: bool = True) -> None:
        """Answer ``exc`` with ``Connection: close``; then a lingering close, as the client
        may still be sending."""
        text = f"{exc}\n".encode()
        try:
            self.sock.settimeout(5.0)
            self.sock.sendall(f"HTTP/1.1 {exc.status}\r\nContent-Type: text/plain\r\n"
                              f"Content-Length: {len(text)}\r\nConnection: close\r\n\r\n"
                              .encode("latin-1") + text)
        except OSError:
            return
        if lingers:
            linger(self.sock)

    def respond(self, environ: dict[str, Any], body: BodyIn, keep: bool) -> bool:
        """Serve one request; True when the connection may serve another."""
        keep = keep and bool(self.keepalive_s) and self.worker.alive and not self.ended
        started: list[Any] = []
        legacy: list[bytes] = []

        def start_response(status: str, headers: list[tuple[str, str]],
                           exc_info: Any = None) -> Callable[[bytes], None]:
            if exc_info and started and started[0] is _SENT:
                raise exc_info[1].with_traceback(exc_info[2])
            started[:] = [status, headers]
            return legacy.append

        try:
            answer = self.worker.wsgi(environ, start_response)
        except Exception:
            if body.error is None:
                log.exception("the app failed on %s %s", environ["REQUEST_METHOD"],
                              environ["PATH_INFO"])
            self.refuse(body.error or BadRequest(_500, self.failed_text), lingers=not body.done)
            return False
        try:
            if body.error is not None:     # the body could not be read: the server answers
                self.refuse(body.error, lingers=not body.done)
                return False
            if not started:
                raise RuntimeError("the app did not call start_response")
            keep = self.write(started, answer, legacy, keep and body.keeps(), environ)
        finally:
            close = getattr(answer, "close", None)
            if close is not None:
                close()
        if keep and body.finish():
            return True
        if not body.done and not body.failed and body.error is None:
            linger(self.sock)
        return False

    def write(self, started: list[Any], answer: Iterable[bytes], legacy: list[bytes],
              keep: bool, environ: dict[str, Any]) -> bool:
        """Send the answer; True when the connection may go on after it."""
        status, headers = started
        length = None
        dated = False
        http10 = environ["SERVER_PROTOCOL"] == "HTTP/1.0"
        head_only = environ["REQUEST_METHOD"] == "HEAD"
        lines = [f"HTTP/1.1 {status}\r\n"]
        for name, value in headers:
            if "\n" in value or "\r" in value or "\n" in name or "\r" in name:
                raise ValueError(f"response header {name!r} has a line break")
            low = name.lower()
            if low == "content-length":
                length = value
                continue
            if low == "connection":
                keep = keep and "close" not in value.lower()
                continue
            if low == "transfer-encoding":
                continue
            dated = dated or low == "date"
            lines.append(f"{name}: {value}\r\n")
        if not dated:
            lines.append(f"Date: {_date()}\r\n")
        whole: list[bytes] | None = None
        if isinstance(answer, list | tuple):
            whole = [*legacy, *answer]
            if length is None:
                length = str(sum(len(part) for part in whole))
        chunked = False
        if length is not None:
            lines.append(f"Content-Length: {length}\r\n")
        elif not head_only:
            if http10:
                keep = False                 # HTTP/1.0, no length: the close ends it
            else:
                lines.append("Transfer-Encoding: chunked\r\n")
                chunked = True
        if not keep:
            lines.append("Connection: close\r\n")
        elif http10:
            lines.append("Connection: keep-alive\r\n")
        lines.append("\r\n")
        started[0] = _SENT
        head = "".join(lines).encode("latin-1")
        if head_only:
            self.sendall(head)
            return keep
        if whole is not None:
            self.sendall(head + b"".join(whole))
            return keep
        relay = getattr(answer, "relay", None)
        if relay is not None and not legacy:
            return self.relayed(relay, head, chunked, environ) and keep
        return self.streamed(head, chain(legacy, answer), chunked, environ) and keep

    def relayed(self, relay: Callable[[Any, bytes, bool], None], head: bytes, chunked: bool,
                environ: dict[str, Any]) -> bool:
        """The body's own relay sends head and body; False when it broke off."""
        self.sock.settimeout(None)
        try:
            relay(self.sock, head, chunked)
        except OSError:
            return False                     # the client went away
        except Exception as exc:
            _log_broken(exc, environ)
            return False
        return True

    def streamed(self, head: bytes, parts: Iterator[bytes], chunked: bool,
                 environ: dict[str, Any]) -> bool:
        """Send the head with the first piece, then each piece; False when the body broke
        off (the connection ends without the terminator)."""
        sendall = self.sendall
        pending: bytes | None = head
        while True:
            try:
                part = next(parts)
            except StopIteration:
                break
            except Exception as exc:
                _log_broken(exc, environ)
                if pending is not None:      # nothing went out yet: a plain 500 still can
                    self.refuse(BadRequest(_500, self.failed_text), lingers=False)
                return False
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
        return True


_SENT = object()


def _log_broken(exc: Exception, environ: dict[str, Any]) -> None:
    where = f"{environ['REQUEST_METHOD']} {environ['PATH_INFO']}"
    if isinstance(exc, StreamBroken):
        log.warning("the answer to %s broke off: %s", where, exc)
    else:
        log.error("the answer to %s failed while being sent", where, exc_info=exc)
