"""The router's HTTP/1.1 server (router/http/server.py) under the real router (serve.run,
gunicorn with RouterWorker): what a client on a raw socket, urllib and the openai client
see. Keep-alive and pipelining, bodies with a length, chunked and behind
``Expect: 100-continue``, strict refusals of smuggling shapes and oversized heads, header
names with ``_`` dropped, HTTP/1.0, HEAD, streamed answers in chunked coding, deadlines for
heads and whole bodies, and the lingering close after an early answer. The in-process
tests (TCP_NODELAY, broken streams, the relay hook) are in test_server_inprocess.py."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import openai
import pytest
from fake_control import FakeControl

from llmgw_runtime.router import serve
from llmgw_runtime.router.config import RouterConfig
from llmgw_runtime.router.http.body_in import BODY_DEADLINE_ENV

from .conftest import API_KEY, ROUTER_TOKEN, model, running_router, table

CHAT = json.dumps({"model": "chat", "messages": [{"role": "user", "content": "hi"}]}).encode()
BODY_DEADLINE_S = 3     # the module's router: a whole request body within 3 s
MB = 1_000_000


@pytest.fixture(scope="module")
def router(engines: dict[str, str]) -> Iterator[tuple[str, int]]:
    """One worker, the default 16 MiB body limit, API keys required."""
    ctl = FakeControl(table(model("chat", endpoints=[("r-e1", engines["e1"])])),
                      ROUTER_TOKEN).start()
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(BODY_DEADLINE_ENV, str(BODY_DEADLINE_S))
            with running_router(ctl.url, workers=1) as url:
                host, port = url.removeprefix("http://").rsplit(":", 1)
                yield host, int(port)
    finally:
        ctl.stop()


def _url(router: tuple[str, int]) -> str:
    return f"http://{router[0]}:{router[1]}"


def _connect(router: tuple[str, int]) -> socket.socket:
    sock = socket.create_connection(router, timeout=10)
    return sock


def _post(body: bytes = CHAT, *extra: str, path: str = "/v1/chat/completions",
          length: bool = True) -> bytes:
    head = [f"POST {path} HTTP/1.1", "Host: router", f"Authorization: Bearer {API_KEY}",
            "Content-Type: application/json", *extra]
    if length:
        head.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode("utf-8") + body


class Reader:
    """Answers read off one connection, one at a time."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def _more(self) -> bool:
        data = self.sock.recv(65536)
        self.buf += data
        return bool(data)

    def answer(self, head_only: bool = False) -> tuple[int, dict[str, str], bytes]:
        while b"\r\n\r\n" not in self.buf:
            if not self._more():
                raise ConnectionError(f"closed before an answer: {self.buf!r}")
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, value = line.split(":", 1)
            assert name.lower() not in headers, f"{name} twice in {head!r}"
            headers[name.lower()] = value.strip()
        if status == 100 or head_only:
            return status, headers, b""
        if "content-length" in headers:
            n = int(headers["content-length"])
            while len(self.buf) < n:
                assert self._more(), "closed inside a body"
            body, self.buf = self.buf[:n], self.buf[n:]
            return status, headers, body
        if headers.get("transfer-encoding") == "chunked":
            body = b""
            while True:
                while b"\r\n" not in self.buf:
                    assert self._more(), "closed inside a chunked body"
                size_line, self.buf = self.buf.split(b"\r\n", 1)
                size = int(size_line, 16)
                while len(self.buf) < size + 2:
                    assert self._more(), "closed inside a chunk"
                chunk, self.buf = self.buf[:size], self.buf[size + 2:]
                if size == 0:
                    return status, headers, body
                body += chunk
        while self._more():
            pass
        body, self.buf = self.buf, b""
        return status, headers, body

    def closed(self) -> bool:
        try:
            return not self._more() and not self.buf
        except ConnectionResetError:
            return True


def test_keep_alive_and_pipelined_requests_are_answered_in_order(
        router: tuple[str, int]) -> None:
    with _connect(router) as sock:
        reader = Reader(sock)
        for _ in range(3):
            sock.sendall(_post())
            status, headers, body = reader.answer()
            assert status == 200 and json.loads(body)["object"] == "chat.completion"
            assert "date" in headers and "connection" not in headers
        sock.sendall(_post() + _post(b'{"model": "nope"}'))      # two at once
        assert reader.answer()[0] == 200
        status, _, body = reader.answer()
        assert status == 404 and json.loads(body)["error"]["code"] == "model_not_found"


def test_a_chunked_request_body_is_read(router: tuple[str, int]) -> None:
    half = len(CHAT) // 2
    chunked = (f"{half:x}\r\n".encode() + CHAT[:half] + b"\r\n"
               + f"{len(CHAT) - half:x};ext=1\r\n".encode() + CHAT[half:] + b"\r\n0\r\n\r\n")
    with _connect(router) as sock:
        reader = Reader(sock)
        sock.sendall(_post(chunked, "Transfer-Encoding: chunked", length=False))
        assert reader.answer()[0] == 200
        sock.sendall(_post())                 # the connection goes on after it
        assert reader.answer()[0] == 200


def test_expect_100_continue_gets_its_interim_answer(router: tuple[str, int]) -> None:
    with _connect(router) as sock:
        reader = Reader(sock)
        head = _post(b"", "Expect: 100-continue", length=False)[:-2]
        sock.sendall(head + f"Content-Length: {len(CHAT)}\r\n\r\n".encode())
        status, _, _ = reader.answer()
        assert status == 100
        sock.sendall(CHAT)
        assert reader.answer()[0] == 200


@pytest.mark.parametrize(("request_bytes", "status"), [
    (b"GARBAGE\r\n\r\n", 400),
    (b"GET /healthz HTTP/2.0\r\nHost: x\r\n\r\n", 505),
    (b"GET /healthz HTTP/1.1\r\nHost x\r\n\r\n", 400),
    (b"GET /healthz HTTP/1.1\r\n Host: x\r\n\r\n", 400),
    (b"GET /healthz HTTP/1.1\r\nX-A: a\x01b\r\n\r\n", 400),
    (_post(b"5\r\nhello\r\n0\r\n\r\n", "Transfer-Encoding: chunked"), 400),  # CL and TE
    (_post(CHAT, "Content-Length: 3"), 400),                                 # two CLs
    (_post(CHAT, "Transfer-Encoding: gzip", length=False), 501),
    (_post(CHAT, "Transfer-Encoding: gzip, chunked", length=False), 501),
    (_post(CHAT, "Content-Length: -1", length=False), 400),
    (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: \xb2\r\n\r\n",
     400),                                    # "\xb2" is "²" in latin-1: str.isdigit() passes
    (b"GET /healthz HTTP/1.2\r\nHost: x\r\n\r\n", 505),
    (b"GET /healthz HTTP/1.1\nHost: x\n\n", 400),
    (b"GET /healthz HTTP/1.1\r\n" + b"X-Big: " + b"a" * 70000 + b"\r\n\r\n", 431),
    (b"GET /healthz HTTP/1.1\r\n" + b"X-A: b\r\n" * 101 + b"\r\n", 431),
    (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n\r\n", 414),
])
def test_malformed_and_smuggling_requests_are_refused_and_closed(
        router: tuple[str, int], request_bytes: bytes, status: int) -> None:
    with _connect(router) as sock:
        reader = Reader(sock)
        sock.sendall(request_bytes)
        got, headers, body = reader.answer()
        assert got == status, body
        assert headers["connection"] == "close"
        assert reader.closed()


def test_a_header_name_with_an_underscore_is_dropped(router: tuple[str, int]) -> None:
    # X_Api_Key would land in the environ as HTTP_X_API_KEY, where X-Api-Key goes: dropped.
    with _connect(router) as sock:
        reader = Reader(sock)
        plain = _post()
        sock.sendall(plain.replace(f"Authorization: Bearer {API_KEY}".encode(),
                                   f"X_Api_Key: {API_KEY}".encode()))
        status, _, body = reader.answer()
        assert status == 401 and b"no API key" in body
        sock.sendall(plain.replace(f"Authorization: Bearer {API_KEY}".encode(),
                                   f"X-Api-Key: {API_KEY}".encode()))
        assert reader.answer()[0] == 200


def test_http_1_0_and_head(router: tuple[str, int]) -> None:
    with _connect(router) as sock:
        reader = Reader(sock)
        sock.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
        status, headers, body = reader.answer()
        assert status == 200 and headers["connection"] == "close" and b'"ok"' in body
        assert reader.closed()
    with _connect(router) as sock:
        reader = Reader(sock)
        sock.sendall(b"GET /healthz HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        assert reader.answer()[1]["connection"] == "keep-alive"
        sock.sendall(b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        status, headers, _ = reader.answer(head_only=True)
        assert status == 200 and int(headers["content-length"]) > 0
        # No body followed the HEAD answer: the next answer starts right after it.
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert reader.answer()[0] == 200


def test_a_stream_is_sent_in_chunks_as_it_comes(router: tuple[str, int]) -> None:
    body = json.dumps({"model": "chat", "stream": True,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    with _connect(router) as sock:
        reader = Reader(sock)
        sock.sendall(_post(body))
        status, headers, streamed = reader.answer()
        assert status == 200 and headers["transfer-encoding"] == "chunked"
        events = [e for e in streamed.split(b"\n\n") if e]
        assert events[-1] == b"data: [DONE]" and len(events) > 2
        sock.sendall(_post())                 # and the connection goes on
        assert reader.answer()[0] == 200


def test_a_large_unread_body_closes_the_connection_a_small_one_does_not(
        router: tuple[str, int]) -> None:
    wrong_key = _post(b"x" * 1000).replace(API_KEY.encode(), b"sk-llmgw-wrong")
    with _connect(router) as sock:
        reader = Reader(sock)
        sock.sendall(wrong_key)               # answered 401 unread, 1 KB drained
        assert reader.answer()[0] == 401
        sock.sendall(_post())
        assert reader.answer()[0] == 200
    big = _post(b"", "Content-Length: 10000000", length=False)
    with _connect(router) as sock:
        reader = Reader(sock)
        sock.sendall(big.replace(API_KEY.encode(), b"sk-llmgw-wrong") + b"x" * 100_000)
        status, headers, _ = reader.answer()
        assert status == 401 and headers["connection"] == "close"
        assert reader.closed()


def test_a_client_that_never_finishes_its_head_is_dropped(router: tuple[str, int]) -> None:
    with _connect(router) as sock:
        sock.settimeout(15)
        started = time.monotonic()
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        for _ in range(3):                    # a byte now and then: the head's deadline holds
            time.sleep(1)
            sock.sendall(b"X")
        assert Reader(sock).closed()
        assert time.monotonic() - started < 8     # keepalive is 5 s


def test_an_unfinished_chunked_body_is_answered_at_once_and_closed(
        router: tuple[str, int]) -> None:
    # Refused before its body was read (a wrong key): the answer does not wait for a body
    # whose length nobody knows, and the connection closes instead of reading the rest.
    with _connect(router) as sock:
        reader = Reader(sock)
        started = time.monotonic()
        sock.sendall(_post(b"10\r\n0123456789abcdef\r\n", "Transfer-Encoding: chunked",
                           length=False).replace(API_KEY.encode(), b"sk-llmgw-wrong"))
        status, headers, _ = reader.answer()
        assert status == 401 and headers["connection"] == "close"
        assert reader.closed() and time.monotonic() - started < 3


# -- deadlines -------------------------------------------------------------------------------


def _trickle(sock: socket.socket, stop: threading.Event, every_s: float = 0.3) -> None:
    """A byte of body now and then, until told to stop or the router closes."""
    while not stop.wait(every_s):
        try:
            sock.sendall(b"x")
        except OSError:
            return


def test_a_trickling_body_the_app_reads_is_cut_at_the_whole_body_deadline(
        router: tuple[str, int]) -> None:
    # One byte every 0.3 s never trips a per-read timeout; the whole-body deadline does.
    with _connect(router) as sock:
        stop = threading.Event()
        started = time.monotonic()
        sock.sendall(_post(b"", "Content-Length: 60000", length=False))
        threading.Thread(target=_trickle, args=(sock, stop), daemon=True).start()
        try:
            reader = Reader(sock)
            status, headers, body = reader.answer()
            assert status == 408 and headers["connection"] == "close", body
            assert BODY_DEADLINE_ENV.encode() in body
            assert BODY_DEADLINE_S - 0.5 < time.monotonic() - started < BODY_DEADLINE_S + 3
            assert reader.closed()
        finally:
            stop.set()


def test_a_trickling_body_answered_unread_is_not_drained_past_the_deadline(
        router: tuple[str, int]) -> None:
    # No API key: a 401 before the body; 60,000 bytes are few enough to drain for the next
    # request, but the draining is held to the body's deadline too (it was not: 60 such
    # connections held the worker's connections for ever).
    with _connect(router) as sock:
        stop = threading.Event()
        started = time.monotonic()
        sock.sendall(_post(b"", "Content-Length: 60000", length=False)
                     .replace(f"Authorization: Bearer {API_KEY}\r\n".encode(), b""))
        threading.Thread(target=_trickle, args=(sock, stop), daemon=True).start()
        try:
            reader = Reader(sock)
            assert reader.answer()[0] == 401
            assert reader.closed()
            assert time.monotonic() - started < BODY_DEADLINE_S + 3
        finally:
            stop.set()


# -- bodies the router cannot read -----------------------------------------------------------


@pytest.mark.parametrize("chunked_body", [
    b"zz\r\nhello\r\n0\r\n\r\n",                 # a chunk size that is not hex
    b"5\r\nhelloXX0\r\n\r\n",                    # no CRLF after the chunk's data
])
def test_a_malformed_chunked_body_is_a_400_naming_the_fault(
        router: tuple[str, int], chunked_body: bytes) -> None:
    with _connect(router) as sock:
        reader = Reader(sock)
        sock.sendall(_post(chunked_body, "Transfer-Encoding: chunked", length=False))
        status, headers, body = reader.answer()
        assert status == 400 and headers["connection"] == "close", body
        assert b"chunk" in body and b"malformed" in body
        assert reader.closed()


# -- answers before the body: the lingering close ---------------------------------------------


def _too_large_count(router: tuple[str, int]) -> float:
    with urllib.request.urlopen(_url(router) + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("llmgw_router_errors_total")
               and 'code="request_too_large"' in line)


def test_urllib_uploading_40_mb_reads_the_413_not_a_reset(router: tuple[str, int]) -> None:
    request = urllib.request.Request(
        _url(router) + "/v1/chat/completions", data=b"x" * (40 * MB), method="POST",
        headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=30)
    assert caught.value.code == 413
    assert json.loads(caught.value.read())["error"]["code"] == "request_too_large"


def test_urllib_uploading_12_mb_with_a_wrong_key_reads_the_401(
        router: tuple[str, int]) -> None:
    request = urllib.request.Request(
        _url(router) + "/v1/chat/completions", data=b"x" * (12 * MB), method="POST",
        headers={"Authorization": "Bearer sk-llmgw-wrong", "Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=30)
    assert caught.value.code == 401


def test_openai_client_gets_the_413_once_and_does_not_retry(router: tuple[str, int]) -> None:
    client = openai.OpenAI(base_url=_url(router) + "/v1", api_key=API_KEY, max_retries=2,
                           timeout=30)
    before = _too_large_count(router)
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "x" * (40 * MB)}])
    assert caught.value.status_code == 413
    assert _too_large_count(router) - before == 1        # one request: no retries


def test_an_unauthenticated_body_is_drained_only_within_the_linger_bound(
        router: tuple[str, int]) -> None:
    # A client that keeps sending after its 401 is cut off within the lingering close's
    # bound (5 s, 64 MiB), whatever the 10 GB it announced.
    with _connect(router) as sock:
        sock.sendall(_post(b"", "Content-Length: 10000000000", length=False)
                     .replace(API_KEY.encode(), b"sk-llmgw-wrong"))
        started = time.monotonic()
        sent = 0
        block = b"x" * 65536
        sock.settimeout(15)
        with pytest.raises(OSError):
            while time.monotonic() - started < 15:
                sock.sendall(block)
                sent += len(block)
        assert time.monotonic() - started < 9
        assert sent < 80 * 2**20


def test_the_listen_backlog_is_2048_or_llmgw_router_backlog(
        monkeypatch: pytest.MonkeyPatch) -> None:
    config = RouterConfig(control_url="http://c", router_token="t")
    assert serve.gunicorn_options(config)["backlog"] == 2048
    monkeypatch.setenv(serve.BACKLOG_ENV, "4096")
    assert serve.gunicorn_options(config)["backlog"] == 4096
    monkeypatch.setenv(serve.BACKLOG_ENV, "lots")
    with pytest.raises(ValueError, match="LLMGW_ROUTER_BACKLOG='lots': set it to a whole"):
        serve.gunicorn_options(config)
