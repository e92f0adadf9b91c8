"""What an engine sends, held to the router's rules through the real router (serve.run,
gunicorn gevent workers): every wait for an engine has the whole idle limit (a pooled
connection's past waits never count), a stream that keeps sending is never cut, a request
is never sent twice once the engine may have started it, a large whole answer is passed
through rather than read whole, an engine's cookies, ``X-Llmgw-*`` fields and ``101`` never
reach the client, and a stream that breaks reaches the openai client as an error."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import openai
import pytest
import requests
from fake_control import FakeControl
from harness import start_router, stop

from .conftest import API_KEY, ROUTER_TOKEN, model, table

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
OK = b'{"choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}]}'


def _read_request(conn: socket.socket, buf: bytearray) -> bool:
    """One request (head and Content-Length body) off ``conn``; False at its close."""
    while b"\r\n\r\n" not in buf:
        got = conn.recv(65536)
        if not got:
            return False
        buf += got
    end = buf.index(b"\r\n\r\n") + 4
    head = bytes(buf[:end]).lower()
    length = int(head.split(b"content-length:")[1].split(b"\r\n")[0]) \
        if b"content-length:" in head else 0
    while len(buf) < end + length:
        buf += conn.recv(65536)
    del buf[:end + length]
    return True


class Engine:
    """A scripted engine on a real socket: ``answer(conn, n)`` answers its n-th request
    (0-based, counted over every connection); connections are kept alive."""

    def __init__(self, answer: Callable[[socket.socket, int], None]) -> None:
        self.answer = answer
        self.requests = 0
        self.connections = 0
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        buf = bytearray()
        with conn:
            try:
                while _read_request(conn, buf):
                    n, self.requests = self.requests, self.requests + 1
                    self.answer(conn, n)
            except OSError:
                pass

    def close(self) -> None:
        # shutdown first: it wakes the accepting thread now, so that it cannot take a
        # connection meant for a later listener that gets the same descriptor number
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()


class Routed:
    def __init__(self, url: str, engine: Engine, pid: int) -> None:
        self.url, self.engine, self.pid = url, engine, pid

    def peak_rss_kib(self) -> int:
        """The largest peak RSS of the router's workers (its master's children)."""
        peaks = []
        for child in os.listdir("/proc"):
            try:
                with open(f"/proc/{child}/status") as f:
                    status = f.read()
            except OSError:
                continue
            if f"PPid:\t{self.pid}\n" in status:
                peaks.append(int(status.split("VmHWM:")[1].split()[0]))
        return max(peaks)


@contextmanager
def routed(answer: Callable[[socket.socket, int], None], *others: Engine,
           **settings: Any) -> Iterator[Routed]:
    """The real router (one worker, keys required) in front of a scripted engine (and
    ``others``, after it, as replicas of the same model)."""
    engine = Engine(answer)
    endpoints = [("r-0", engine.url)] + [(f"r-{i + 1}", e.url) for i, e in enumerate(others)]
    ctl = FakeControl(table(model("m", endpoints=endpoints)), ROUTER_TOKEN).start()
    proc, url = start_router(ctl.url, ROUTER_TOKEN, workers=1, refresh_interval_s=0.2,
                             **settings)
    try:
        yield Routed(url, engine, proc.pid)
    finally:
        stop(proc)
        ctl.stop()
        engine.close()


def _post(url: str, body: dict[str, Any] | None = None, **kw: Any) -> requests.Response:
    return requests.post(url + "/v1/chat/completions", json=body or CHAT, timeout=30,
                         headers={"Authorization": f"Bearer {API_KEY}"}, **kw)


def _whole(body: bytes, *fields: bytes) -> bytes:
    return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + b"".join(fields)
            + b"Content-Length: %d\r\n\r\n" % len(body) + body)


def _event(i: int) -> bytes:
    data = json.dumps({"id": "c", "object": "chat.completion.chunk", "created": 1,
                       "model": "m", "choices": [{"index": 0, "delta": {"content": f"t{i}"},
                                                  "finish_reason": None}]}).encode()
    event = b"data: " + data + b"\n\n"
    return b"%x\r\n%b\r\n" % (len(event), event)


_SSE_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
             b"Transfer-Encoding: chunked\r\n\r\n")


def test_each_answer_on_a_pooled_connection_gets_the_whole_idle_limit() -> None:
    def slow(conn: socket.socket, n: int) -> None:
        time.sleep(0.6)                  # 0.6 of the 1 s limit, four times on one connection
        conn.sendall(_whole(OK))

    with routed(slow, upstream_timeout_s=1.0) as r, requests.Session() as session:
        codes = [session.post(r.url + "/v1/chat/completions", json=CHAT, timeout=30,
                              headers={"Authorization": f"Bearer {API_KEY}"}).status_code
                 for _ in range(4)]
        assert codes == [200, 200, 200, 200]
        assert (r.engine.requests, r.engine.connections) == (4, 1)


def test_a_stream_that_keeps_sending_is_never_cut_by_the_idle_limit() -> None:
    def trickle(conn: socket.socket, n: int) -> None:
        conn.sendall(_SSE_HEAD)
        for i in range(8):               # 2.8 s in all, a piece every 0.35 s, limit 1 s
            time.sleep(0.35)
            conn.sendall(_event(i))
        conn.sendall(b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")

    with routed(trickle, upstream_timeout_s=1.0) as r:
        client = openai.OpenAI(base_url=r.url + "/v1", api_key=API_KEY, max_retries=0)
        pieces = [c.choices[0].delta.content for c in
                  client.chat.completions.create(model="m", messages=CHAT["messages"],
                                                 stream=True)]
        assert pieces == [f"t{i}" for i in range(8)]


def test_an_engine_silent_past_the_limit_is_not_sent_the_request_again() -> None:
    def silent(conn: socket.socket, n: int) -> None:
        time.sleep(3)

    other = Engine(silent)          # a second replica: the request must not go there too

    try:
        with routed(silent, other, upstream_timeout_s=1.0) as r:
            resp = _post(r.url)
            tried = r.engine.requests
            assert resp.status_code in (502, 504), resp.text
            assert "no data from the engine for 1 s" in resp.json()["error"]["message"]
            assert tried + other.requests == 1, (tried, other.requests)
    finally:
        other.close()


def test_an_engines_cookies_and_llmgw_fields_never_reach_the_client() -> None:
    def forging(conn: socket.socket, n: int) -> None:
        conn.sendall(_whole(OK, b"Set-Cookie: session=engine\r\n",
                            b"X-Llmgw-Replica: r-forged\r\nX-Llmgw-Model: forged\r\n",
                            b"Connection: keep-alive, X-Secret\r\nX-Secret: 1\r\n",
                            b"X-Engine-Note: kept\r\n"))

    with routed(forging) as r:
        resp = _post(r.url)
        assert resp.status_code == 200
        assert "set-cookie" not in resp.headers and "x-secret" not in resp.headers
        assert resp.headers["X-Llmgw-Replica"] == "r-0"
        assert resp.headers["X-Llmgw-Model"] == "m"
        assert resp.headers["X-Engine-Note"] == "kept"


def test_an_engines_101_is_a_502() -> None:
    def upgrade(conn: socket.socket, n: int) -> None:
        conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n"
                     b"Connection: upgrade\r\n\r\n")

    with routed(upgrade) as r:
        resp = _post(r.url)
        assert resp.status_code == 502
        assert "101 Switching Protocols" in resp.json()["error"]["message"]


def test_a_large_whole_answer_is_passed_through_not_read_whole() -> None:
    big = b'{"data":"' + b"x" * (60 << 20) + b'"}'
    answer = _whole(big)

    def large(conn: socket.socket, n: int) -> None:
        conn.sendall(_whole(OK) if n == 0 else answer)

    with routed(large, max_buffered_answer_mb=1) as r:
        assert _post(r.url).status_code == 200          # the worker is up and warm
        before = r.peak_rss_kib()
        resp = _post(r.url, stream=True)
        got = sum(len(piece) for piece in resp.iter_content(1 << 20))
        assert resp.status_code == 200 and got == len(big)
        assert resp.headers["Content-Length"] == str(len(big))
        grew = r.peak_rss_kib() - before
        assert grew < 20 << 10, f"the worker grew by {grew >> 10} MiB"


def test_a_stream_that_breaks_reaches_the_openai_client_as_an_error() -> None:
    def breaks(conn: socket.socket, n: int) -> None:
        conn.sendall(_SSE_HEAD + _event(0) + _event(1))
        time.sleep(0.2)
        conn.sendall(b"zz\r\n")          # a malformed chunk: the engine's answer is broken
        conn.close()

    with routed(breaks) as r:
        url = r.url
        client = openai.OpenAI(base_url=url + "/v1", api_key=API_KEY, max_retries=0)
        got: list[Any] = []
        with pytest.raises((openai.APIConnectionError, openai.APIError)):
            for chunk in client.chat.completions.create(model="m", messages=CHAT["messages"],
                                                        stream=True):
                got.append(chunk.choices[0].delta.content)
        assert got == ["t0", "t1"]
        # on the wire: the chunked terminator never comes, the connection just ends
        with socket.create_connection((url.split("//")[1].split(":")[0],
                                       int(url.rsplit(":", 1)[1]))) as raw:
            body = json.dumps(dict(CHAT, stream=True)).encode()
            raw.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\n"
                        b"Authorization: Bearer " + API_KEY.encode() + b"\r\n"
                        b"Content-Type: application/json\r\n"
                        b"Content-Length: %d\r\n\r\n%b" % (len(body), body))
            raw.settimeout(10)
            wire = bytearray()
            while chunk := raw.recv(65536):
                wire += chunk
        assert b"t1" in wire and not wire.endswith(b"0\r\n\r\n")


def test_a_stream_silent_past_the_idle_limit_is_cut_and_looks_cut() -> None:
    def stalls(conn: socket.socket, n: int) -> None:
        conn.sendall(_SSE_HEAD + _event(0))
        time.sleep(0.5)
        conn.sendall(_event(1))          # progress: the limit starts again here
        time.sleep(4)

    with routed(stalls, upstream_timeout_s=1.0) as r:
        client = openai.OpenAI(base_url=r.url + "/v1", api_key=API_KEY, max_retries=0)
        got: list[Any] = []
        started = time.monotonic()
        with pytest.raises((openai.APIConnectionError, openai.APIError)):
            for chunk in client.chat.completions.create(model="m", messages=CHAT["messages"],
                                                        stream=True):
                got.append(chunk.choices[0].delta.content)
        took = time.monotonic() - started
        assert got == ["t0", "t1"]
        assert 1.4 < took < 3.0, f"cut after {took:.1f} s (1 s of silence after 0.5 s)"
