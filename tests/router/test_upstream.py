"""The router's upstream client (router/http/client.py) against a real socket server."""

from __future__ import annotations

import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from llmgw_runtime.router.http.client import BrokeOff, FailedBeforeAnswer, Pools, Unreachable

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
    pools = Pools(idle_s=10)
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
        Pools(idle_s=5).post(f"http://127.0.0.1:{port}", "/", b"", {})


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
    answer = Pools(idle_s=0.5).post(stalls, "/v1/chat/completions", b"{}", {})
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
    pools = Pools(idle_s=10)
    for _ in range(3):
        answer = pools.post(whole_streams, "/v1/chat/completions", b"{}", {})
        assert b"".join(answer.chunks()) == b"".join(EVENTS)


def answering(*answers: bytes, pause_s: float = 0.0,
              split: int | None = None) -> Callable[[socket.socket], None]:
    """A server body that answers the requests of a connection with ``answers`` in turn
    (each cut into pieces of ``split`` bytes, ``pause_s`` apart, when given)."""
    def serve(conn: socket.socket) -> None:
        for answer in answers:
            if not _read_request(conn):
                return
            step = split or len(answer)
            for at in range(0, len(answer), step):
                conn.sendall(answer[at:at + step])
                if pause_s:
                    time.sleep(pause_s)
        conn.recv(1)
    return serve


@contextmanager
def counting(serve: Callable[[socket.socket], None]) -> Iterator[tuple[str, list[int]]]:
    """``serving(serve)``, and a list that gets an item per connection accepted."""
    connections: list[int] = []

    def counted(conn: socket.socket) -> None:
        connections.append(1)
        serve(conn)

    with serving(counted) as url:
        yield url, connections


CHUNKED = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
           b"Transfer-Encoding: chunked\r\n\r\n"
           b"5;name=value\r\nhello\r\n7\r\n, world\r\n0\r\nX-Trailer: 1\r\n\r\n")


@pytest.mark.parametrize("split", [None, 1, 3])
def test_a_chunked_answer_is_decoded_however_it_is_cut_and_its_connection_reused(
        split: int | None) -> None:
    with counting(answering(CHUNKED, CHUNKED, split=split)) as (url, connections):
        pools = Pools(idle_s=10)
        for _ in range(2):
            answer = pools.post(url, "/v1/chat/completions", b"{}", {})
            assert answer.status == 200
            assert answer.header("content-type") == "text/event-stream"
            assert b"".join(answer.chunks()) == b"hello, world"
        assert len(connections) == 1


def test_an_answer_with_a_length_is_read_to_its_length_across_pieces() -> None:
    body = b'{"ok": true, "pad": "' + b"x" * 200000 + b'"}'
    whole = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    with counting(answering(whole, whole, split=65000)) as (url, connections):
        pools = Pools(idle_s=10)
        for _ in range(2):
            assert pools.post(url, "/", b"{}", {}).read() == body
        assert len(connections) == 1


def test_an_answer_without_length_or_chunks_ends_at_the_close_and_is_not_reused() -> None:
    def serve(conn: socket.socket) -> None:
        if _read_request(conn):
            conn.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it")
            conn.shutdown(socket.SHUT_WR)
            conn.recv(1)

    with counting(serve) as (url, connections):
        pools = Pools(idle_s=10)
        for _ in range(2):
            answer = pools.post(url, "/", b"{}", {})
            assert answer.header("content-length") is None
            assert answer.read() == b"all of it"
        assert len(connections) == 2


def test_interim_answers_before_the_answer_are_skipped() -> None:
    answer = b"HTTP/1.1 100 Continue\r\n\r\n" + ANSWER
    with counting(answering(answer)) as (url, _):
        got = Pools(idle_s=10).post(url, "/", b"{}", {})
        assert (got.status, got.read()) == (200, b"{}")


def test_bytes_after_an_answer_keep_its_connection_out_of_the_pool() -> None:
    with counting(answering(ANSWER + b"junk", ANSWER)) as (url, connections):
        pools = Pools(idle_s=10)
        assert pools.post(url, "/", b"{}", {}).read() == b"{}"
        assert pools.post(url, "/", b"{}", {}).read() == b"{}"
        assert len(connections) == 2


@pytest.mark.parametrize(("answer", "says"), [
    (b"SMTP ready\r\n\r\n", "malformed: Expected HTTP/"),
    (b"HTTP/1.1 2x0 OK\r\n\r\n", "Invalid status code"),
    (b"HTTP/1.1 200 OK\r\nbad header\r\n\r\n", "Invalid header"),
    (b"HTTP/1.1 200 OK\r\nBad Name: x\r\n\r\n", "Invalid header token"),
    (b"HTTP/1.1 200 OK\r\nX-A: a\x1b[2Jb\r\n\r\n", "Invalid header value char"),
    (b"HTTP/1.1 200 OK\r\nX-A: a\nX-Injected: 1\r\n\r\n", "Missing expected CR"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
     "Duplicate Content-Length"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: -2\r\n\r\n{}", "Invalid character in Content-Length"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: \xc2\xb2\r\n\r\n{}",
     "Invalid character in Content-Length"),
    (b"HTTP/1.1 200 OK\r\n" + b"X-Pad: y\r\n" * 101 + b"\r\n", "more than 100 header fields"),
    (b"HTTP/1.1 200 OK\r\nX-Pad: " + b"y" * 70000, "head is over 65536 bytes"),
    (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: upgrade\r\n\r\n",
     "101 Switching Protocols"),
])
def test_an_answer_that_is_not_http_fails_before_answering_and_says_why(
        answer: bytes, says: str) -> None:
    with counting(answering(answer)) as (url, _):
        with pytest.raises(FailedBeforeAnswer, match=says):
            Pools(idle_s=10).post(url, "/", b"{}", {})


@pytest.mark.parametrize(("body", "says"), [
    (b"zz\r\nhello\r\n", "Invalid character in chunk size"),
    (b"0x5\r\nhello\r\n", "Invalid character in chunk size"),
    (b"5\r\nhelloXX", "Expected LF after chunk data"),
    (b"5" * 5000, "Chunk size overflow"),
])
def test_a_chunked_body_that_is_malformed_breaks_off_and_says_why(body: bytes,
                                                                   says: str) -> None:
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    with counting(answering(head + body)) as (url, _):
        answer = Pools(idle_s=10).post(url, "/", b"{}", {})
        with pytest.raises(BrokeOff, match=says):
            answer.read()


def test_an_engine_that_closes_mid_answer_breaks_it_off() -> None:
    def serve(conn: socket.socket) -> None:
        if _read_request(conn):
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf")

    with counting(serve) as (url, _):
        answer = Pools(idle_s=10).post(url, "/", b"{}", {})
        with pytest.raises(BrokeOff, match="closed the connection mid-answer"):
            answer.read()


def test_the_request_carries_the_host_its_length_and_the_given_headers() -> None:
    seen: list[bytes] = []

    def serve(conn: socket.socket) -> None:
        data = b""
        while b"\r\n\r\n" not in data or not data.endswith(b"{}"):
            data += conn.recv(65536)
        seen.append(data)
        conn.sendall(ANSWER)
        conn.recv(1)

    with counting(serve) as (url, _):
        Pools(idle_s=10).post(url, "/v1/embeddings", b"{}",
                                 {"Content-Type": "application/json"}).read()
    head = seen[0].split(b"\r\n")
    assert head[0] == b"POST /v1/embeddings HTTP/1.1"
    assert f"Host: {url.split('//')[1]}".encode() in head
    assert b"Content-Length: 2" in head and b"Content-Type: application/json" in head


def test_a_header_value_with_a_line_break_is_never_sent() -> None:
    with counting(answering(ANSWER)) as (url, connections):
        with pytest.raises(ValueError, match="line break"):
            Pools(idle_s=10).post(url, "/", b"{}", {"X-Evil": "a\r\nX-Injected: 1"})


@pytest.fixture()
def tls_engine(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An engine behind TLS with a certificate for 127.0.0.1, trusted through
    SSL_CERT_FILE (what a default context reads), answering two chunked streams."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert), str(key))
    serve = answering(CHUNKED, CHUNKED, split=7)

    def tls(conn: socket.socket) -> None:
        with context.wrap_socket(conn, server_side=True) as wrapped:
            serve(wrapped)

    with counting(tls) as (url, connections):
        yield url.replace("http://", "https://")
        assert len(connections) == 1


def test_an_engine_behind_tls_is_verified_streamed_and_its_connection_reused(
        tls_engine: str) -> None:
    pools = Pools(idle_s=10)
    for _ in range(2):
        answer = pools.post(tls_engine, "/v1/chat/completions", b"{}", {})
        assert b"".join(answer.chunks()) == b"hello, world"


def test_an_engine_whose_certificate_is_not_trusted_is_not_spoken_to(
        tls_engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SSL_CERT_FILE")
    with pytest.raises(FailedBeforeAnswer, match="CERTIFICATE_VERIFY_FAILED"):
        Pools(idle_s=10).post(tls_engine, "/", b"{}", {})


def test_an_upstream_that_left_the_table_keeps_no_connection_after_its_last_answer(
        ) -> None:
    closed = threading.Event()

    def serve(conn: socket.socket) -> None:
        if _read_request(conn):
            conn.sendall(CHUNKED)
            if conn.recv(1) == b"":            # the router closed it
                closed.set()

    with serving(serve) as url:
        pools = Pools(idle_s=10)
        answer = pools.post(url, "/", b"{}", {})
        pools.forget_except(set())            # it left while the answer streamed
        assert b"".join(answer.chunks()) == b"hello, world"
        assert closed.wait(5)                 # closed at the answer's end, not pooled
