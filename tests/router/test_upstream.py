"""The router's upstream client (router/upstream.py) against a real socket server."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from llmgw_runtime.router.upstream import BrokeOff, Pools, Unreachable

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


def _read_request(conn: socket.socket) -> bool:
    data = b""
    while b"\r\n\r\n" not in data:
        part = conn.recv(65536)
        if not part:
            return False
        data += part
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        body += conn.recv(65536)
    return True


@contextmanager
def serving(serve: Callable[[socket.socket], None]) -> Iterator[str]:
    """A loopback server that hands each connection to ``serve`` in a thread; its URL.
    Connections still open at the end are closed."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def run(conn: socket.socket) -> None:
        with conn:
            try:
                serve(conn)
            except OSError:     # closed under it at the end
                pass

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            held.append(conn)
            threading.Thread(target=run, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        server.close()
        for conn in held:
            conn.close()


@pytest.fixture()
def closes_reused() -> Iterator[tuple[str, list[int]]]:
    """A server that answers the first request of each connection and closes the
    connection, unanswered, when a second request arrives on it: what a kept-alive
    connection looks like when the engine closed it as it was being reused."""
    answered: list[int] = []

    def serve(conn: socket.socket) -> None:
        if _read_request(conn):
            answered.append(1)      # before the answer: the client may finish first
            conn.sendall(ANSWER)
            _read_request(conn)     # the reuse: closed without an answer

    with serving(serve) as url:
        yield url, answered


def test_a_reused_connection_the_engine_closed_is_sent_again_on_a_new_one(
        closes_reused: tuple[str, list[int]]) -> None:
    url, answered = closes_reused
    pools = Pools(timeout_s=10)
    for _ in range(3):
        answer = pools.post(url, "/v1/chat/completions", b'{"model": "m"}',
                            {"Content-Type": "application/json"})
        assert answer.status == 200 and answer.read() == b"{}"
    assert len(answered) == 3


def test_a_port_nobody_listens_on_is_unreachable() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(Unreachable, match="ConnectionRefused"):
        Pools(timeout_s=5).post(f"http://127.0.0.1:{port}", "/", b"", {})


@pytest.fixture()
def stalls() -> Iterator[str]:
    """A server that starts a chunked stream, sends one chunk and then nothing."""
    def serve(conn: socket.socket) -> None:
        if _read_request(conn):
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n6\r\ndata: \r\n")
            conn.recv(1)            # holds the connection until the client goes

    with serving(serve) as url:
        yield url


def test_a_stream_that_stalls_past_the_timeout_breaks_off(stalls: str) -> None:
    answer = Pools(timeout_s=0.5).post(stalls, "/v1/chat/completions", b"{}", {})
    chunks = answer.chunks()
    assert next(chunks) == b"data: "
    with pytest.raises(BrokeOff, match="no data from the engine for 0.5 s"):
        next(chunks)


EVENTS = (b'data: {"a":1}\n\n', b"data: [DONE]\n\n")
STREAM = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
          b"Transfer-Encoding: chunked\r\n\r\n"
          + b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in EVENTS) + b"0\r\n\r\n")


@pytest.fixture()
def whole_streams() -> Iterator[str]:
    """A server that answers every request of a kept-alive connection with a whole
    chunked stream in one write: it arrives with its headers."""
    def serve(conn: socket.socket) -> None:
        while _read_request(conn):
            conn.sendall(STREAM)

    with serving(serve) as url:
        yield url


def test_a_stream_that_arrives_with_its_headers_is_passed_whole(whole_streams: str) -> None:
    pools = Pools(timeout_s=10)
    for _ in range(3):
        answer = pools.post(whole_streams, "/v1/chat/completions", b"{}", {})
        assert b"".join(answer.chunks()) == b"".join(EVENTS)
