"""The router's HTTP/1.1 server (router/http/server.py) in process: RouterWorker serving a
WSGI app of the test's own on a gevent server whose hub runs in a thread. Accepted sockets
have TCP_NODELAY, a stream that breaks after its head ends without the chunked terminator,
and an answer body with a ``relay`` method sends itself (the relay hook)."""

from __future__ import annotations

import contextlib
import logging
import queue
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from llmgw_runtime import tls
from llmgw_runtime.router.http import server
from llmgw_runtime.router.http.errors import StreamBroken
from llmgw_runtime.router.http.server import RouterWorker
from tests.support.certs import make_pki

from .test_server import Reader

WSGIApp = Callable[[dict[str, Any], Any], Any]


@contextlib.contextmanager
def serving(app: WSGIApp, keepalive: float = 5,
            pki: Path | None = None) -> Iterator[tuple[str, int]]:
    """RouterWorker.handle serving ``app`` on a gevent StreamServer whose hub runs in a
    thread of its own (gunicorn's worker object faked with what ``handle`` reads)."""
    ready: queue.Queue[int] = queue.Queue()
    stop = threading.Event()

    def run() -> None:
        import gevent
        from gevent.server import StreamServer

        worker = SimpleNamespace(
            cfg=SimpleNamespace(keepalive=keepalive, is_ssl=False, workers=1), wsgi=app,
            alive=True, nr=0, max_requests=1 << 40, log=logging.getLogger("test-worker"))
        def handle(client: Any, addr: Any) -> None:
            RouterWorker.handle(worker, server.socket, client, addr)  # type: ignore[arg-type]

        ssl_args: dict[str, Any] = {}
        if pki is not None:                   # as gunicorn's gevent worker, with our hook
            import gevent.ssl

            def default_context() -> Any:
                context = gevent.ssl.SSLContext(gevent.ssl.PROTOCOL_TLS_SERVER)
                context.load_cert_chain(pki / "router.crt", pki / "router.key")
                return context
            ssl_args["ssl_context"] = tls.lazy_handshake(None, default_context)
        server: Any = StreamServer(("127.0.0.1", 0), handle, **ssl_args)
        server.start()
        ready.put(server.server_port)
        while not stop.is_set():
            gevent.sleep(0.02)
        server.stop(timeout=1)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield "127.0.0.1", ready.get(timeout=10)
    finally:
        stop.set()
        thread.join(5)


def _get(path: str = "/") -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode()


def _stream_app(parts: Callable[[], Iterator[bytes]]) -> WSGIApp:
    def app(environ: dict[str, Any], start_response: Any) -> Any:
        start_response("200 OK", [("Content-Type", "text/event-stream")])
        return parts()
    return app


def _raw_until_closed(sock: socket.socket) -> bytes:
    data = b""
    sock.settimeout(5)
    while True:
        try:
            piece = sock.recv(65536)
        except ConnectionResetError:
            return data
        if not piece:
            return data
        data += piece


def test_accepted_connections_have_tcp_nodelay() -> None:
    def app(environ: dict[str, Any], start_response: Any) -> Any:
        sock = environ["gunicorn.socket"]
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"%d" % bool(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))]

    with serving(app) as address, socket.create_connection(address, timeout=5) as sock:
        sock.sendall(_get())
        assert Reader(sock).answer()[2] == b"1"


@pytest.mark.parametrize("error", [StreamBroken("the engine went away"),
                                   RuntimeError("a bug in the stream")])
def test_a_stream_that_breaks_after_its_head_ends_without_the_terminator(
        error: Exception, caplog: pytest.LogCaptureFixture) -> None:
    def parts() -> Iterator[bytes]:
        yield b"data: 1\n\n"
        raise error

    caplog.set_level(logging.WARNING)
    with serving(_stream_app(parts)) as address, \
            socket.create_connection(address, timeout=5) as sock:
        sock.sendall(_get())
        data = _raw_until_closed(sock)
    assert data.startswith(b"HTTP/1.1 200 OK\r\n") and b"data: 1" in data
    assert b"0\r\n\r\n" not in data
    records = [r for r in caplog.records if "broke off" in r.getMessage()
               or "failed while being sent" in r.getMessage()]
    assert len(records) == 1
    if isinstance(error, StreamBroken):        # expected on a network: no traceback
        assert records[0].levelno == logging.WARNING and records[0].exc_info is None
    else:
        assert records[0].levelno == logging.ERROR and records[0].exc_info is not None


class _Relayed:
    """An answer body with the relay hook: sends head and pieces itself."""

    def __init__(self, pieces: list[bytes], broken: bool = False) -> None:
        self.pieces = pieces
        self.broken = broken
        self.calls: list[tuple[bytes, bool, float | None, int]] = []
        self.closed = False

    def relay(self, sock: Any, head: bytes, chunked: bool) -> None:
        nodelay = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        self.calls.append((head, chunked, sock.gettimeout(), nodelay))
        out = head
        for piece in self.pieces:
            sock.sendall(out + (b"%x\r\n%b\r\n" % (len(piece), piece) if chunked else piece))
            out = b""
        if self.broken:
            raise StreamBroken("the engine's answer broke off")
        if chunked:
            sock.sendall(b"0\r\n\r\n")

    def __iter__(self) -> Iterator[bytes]:
        raise AssertionError("a relayed body is never iterated")

    def close(self) -> None:
        self.closed = True


def _relay_app(bodies: list[_Relayed]) -> WSGIApp:
    def app(environ: dict[str, Any], start_response: Any) -> Any:
        start_response("200 OK", [("Content-Type", "text/event-stream")])
        return bodies.pop(0)
    return app


def test_a_relayed_answer_keeps_the_connection() -> None:
    first, second = _Relayed([b"a", b"bc"]), _Relayed([b"d"])
    with serving(_relay_app([first, second])) as address, \
            socket.create_connection(address, timeout=5) as sock:
        reader = Reader(sock)
        sock.sendall(_get())
        status, headers, body = reader.answer()
        assert (status, headers["transfer-encoding"], body) == (200, "chunked", b"abc")
        sock.sendall(_get())
        assert reader.answer()[2] == b"d"
    head, chunked, timeout, nodelay = first.calls[0]
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and head.endswith(b"\r\n\r\n")
    assert b"Transfer-Encoding: chunked\r\n" in head and chunked
    assert timeout is None and nodelay
    assert first.closed and second.closed


def test_a_relay_that_breaks_closes_without_the_terminator() -> None:
    body = _Relayed([b"a"], broken=True)
    with serving(_relay_app([body])) as address, \
            socket.create_connection(address, timeout=5) as sock:
        sock.sendall(_get())
        data = _raw_until_closed(sock)
    assert data.startswith(b"HTTP/1.1 200 OK\r\n") and data.endswith(b"1\r\na\r\n")
    assert body.closed


def test_a_head_request_is_never_relayed() -> None:
    body, after = _Relayed([b"a"]), _Relayed([b"b"])
    with serving(_relay_app([body, after])) as address, \
            socket.create_connection(address, timeout=5) as sock:
        reader = Reader(sock)
        sock.sendall(b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert reader.answer(head_only=True)[0] == 200
        sock.sendall(_get())             # no body followed the HEAD's answer
        assert reader.answer()[2] == b"b"
    assert body.calls == [] and body.closed


class _Marker:
    """Something an app leaves in the WSGI environ, to see when the environ is freed."""


def test_a_served_request_is_freed_while_its_connection_waits_for_the_next() -> None:
    """Thousands of agents keep a connection open between reports seconds apart; what
    a served request held (its environ, its body) must not live on until the next one
    arrives, or every garbage collection walks it (docs/performance.md)."""
    import time
    import weakref

    refs: list[weakref.ref[_Marker]] = []

    def app(environ: dict[str, Any], start_response: Any) -> Any:
        marker = _Marker()
        environ["test.marker"] = marker
        refs.append(weakref.ref(marker))
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"ok"]

    with serving(app) as address, socket.create_connection(address, timeout=5) as sock:
        reader = Reader(sock)
        sock.sendall(_get())
        assert reader.answer()[2] == b"ok"
        deadline = time.monotonic() + 2
        while refs[0]() is not None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert refs[0]() is None, "the served request lives on while the connection idles"
        sock.sendall(_get())                # and the connection still serves
        assert reader.answer()[2] == b"ok"


def _ok(environ: dict[str, Any], start_response: Any) -> Any:
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok"]


class _CountingReads:
    """An OS socket whose reads are counted, and those that found nothing."""

    def __init__(self, raw: Any) -> None:
        self.raw, self.reads, self.empty = raw, 0, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)

    def recv(self, *args: Any) -> bytes:
        self.reads += 1
        try:
            return self.raw.recv(*args)  # type: ignore[no-any-return]
        except BlockingIOError:
            self.empty += 1
            raise


def test_a_kept_alive_connection_waits_for_its_next_request_before_reading(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An agent's connection idles seconds between reports: after an answer, the server
    waits until the socket is readable and then reads it, instead of a read that finds
    nothing first (a system call and an exception per request, docs/performance.md);
    pipelined requests and requests seconds apart are served alike."""
    import time

    counted: list[_CountingReads] = []

    def counting(sock: Any) -> Any:
        raw = sock._sock if type(sock).__name__ == "socket" and hasattr(sock, "_sock") \
            else None
        if raw is None:
            return None
        counted.append(_CountingReads(raw))
        return counted[-1]

    monkeypatch.setattr(server, "os_socket", counting)
    with serving(_ok) as address, socket.create_connection(address, timeout=5) as sock:
        reader = Reader(sock)
        for pause in (0.0, 0.3, 0.1, 0.3):
            time.sleep(pause)
            sock.sendall(_get())
            assert reader.answer()[2] == b"ok"
        sock.sendall(_get() + _get())          # two at once: both answered
        assert reader.answer()[2] == b"ok" and reader.answer()[2] == b"ok"
    [reads] = counted
    assert reads.reads >= 4 and reads.empty == 0, (reads.reads, reads.empty)


def test_an_idle_keep_alive_connection_is_closed_at_its_deadline_not_before() -> None:
    """Waits for a head are untimed reads ended by the worker's sweeper (server.Waiting):
    the keep-alive time still holds, within a sweep, both after a served request and for
    a connection that never sends one."""
    import time

    with serving(_ok, keepalive=1.5) as address, \
            socket.create_connection(address, timeout=10) as served, \
            socket.create_connection(address, timeout=10) as silent:
        reader = Reader(served)
        served.sendall(_get())
        assert reader.answer()[2] == b"ok"
        started = time.monotonic()
        time.sleep(1.0)                       # within the keep-alive time: still served
        served.sendall(_get())
        assert reader.answer()[2] == b"ok"
        assert reader.closed()                # then closed once idle for 1.5 s
        idle = time.monotonic() - started - 1.0
        assert 1.4 < idle < 1.5 + 2 * server.SWEEP_S + 1.0, idle
        assert _raw_until_closed(silent) == b""


def test_idle_connections_hold_no_timer_each() -> None:
    """Each timed read made a gevent Timeout (with its timer and a TimeoutError) that lived
    as long as the connection idled: at 10,000 agents, tens of thousands of young objects
    that every collection walked (docs/performance.md)."""
    import gc
    import time

    from gevent import Timeout

    with serving(_ok, keepalive=30) as address:
        socks = [socket.create_connection(address, timeout=10) for _ in range(50)]
        try:
            for sock in socks:
                sock.sendall(_get())
                assert Reader(sock).answer()[2] == b"ok"
            time.sleep(0.2)                   # every connection waits for its next request
            timers = sum(type(o) is Timeout for o in gc.get_objects())
            assert timers < 10, f"{timers} gevent Timeouts alive for 50 idle connections"
        finally:
            for sock in socks:
                sock.close()


def test_a_tls_client_that_never_shakes_hands_is_dropped_at_the_deadline(
        tmp_path: Path) -> None:
    """gevent's server shook hands before the handler ran, with no deadline: a client
    that connected and sent nothing held its connection for ever. The handshake now
    waits for the first read (tls.LazyHandshake), under the head's deadline."""
    import ssl
    import time

    ca = make_pki(tmp_path / "pki")
    with serving(_ok, keepalive=1.5, pki=tmp_path / "pki") as address:
        client = ssl.create_default_context(cafile=str(ca))
        with socket.create_connection(address, timeout=10) as raw, \
                client.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
            sock.sendall(_get())              # a TLS client is served, and kept alive
            reader = Reader(sock)
            assert reader.answer()[2] == b"ok"
            sock.sendall(_get())
            assert reader.answer()[2] == b"ok"
        with socket.create_connection(address, timeout=10) as silent:
            started = time.monotonic()
            assert b"HTTP" not in _raw_until_closed(silent)    # at most a TLS alert
            assert time.monotonic() - started < 1.5 + 2 * server.SWEEP_S + 1.0
        with socket.create_connection(address, timeout=10) as plain:
            plain.sendall(_get())             # not TLS: the handshake fails, it ends
            assert b"HTTP/1.1 200" not in _raw_until_closed(plain)
