"""The router's body limit, against the real router (gunicorn gevent worker, 1 MiB limit):
refused before the body is read, bounded for chunked bodies, and without memory growth."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import harness
import pytest
import requests
from fake_control import FakeControl

from .conftest import API_KEY, ROUTER_TOKEN

LIMIT = 1024 * 1024
AUTH = f"Authorization: Bearer {API_KEY}\r\n".encode()


@pytest.fixture(scope="module")
def small_router(control: FakeControl) -> Iterator[tuple[str, int]]:
    """One worker, so one process holds every request; answers with its URL and pid."""
    proc, url = harness.start_router(control.url, ROUTER_TOKEN, workers=1, max_body_mb=1,
                                     refresh_interval_s=0.2, activation_timeout_s=2.0)
    yield url, proc.pid
    harness.stop(proc)


def _address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def _worker_pid(master: int) -> int:
    children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
    assert len(children) == 1, children
    return int(children[0])


def _peak_rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def _read_answer(sock: socket.socket, timeout_s: float = 5.0) -> tuple[int, dict[str, str], bytes]:
    """One HTTP answer with a Content-Length, read off a raw socket."""
    sock.settimeout(timeout_s)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before an answer: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (x.split(":", 1) for x in lines[1:])}
    while len(body) < int(headers["content-length"]):
        chunk = sock.recv(65536)
        assert chunk
        body += chunk
    return int(lines[0].split()[1]), headers, body


def _assert_too_large(body: bytes) -> None:
    err = json.loads(body)["error"]
    assert set(err) == {"message", "type", "code", "param"}
    assert err["code"] == "request_too_large"
    assert err["type"] == "invalid_request_error"
    assert "LLMGW_MAX_BODY_MB" in err["message"] and str(LIMIT) in err["message"]


def test_declared_oversized_body_is_refused_before_it_is_sent(
        small_router: tuple[str, int]) -> None:
    url, _ = small_router
    with socket.create_connection(_address(url)) as sock:
        started = time.monotonic()
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + AUTH
                     + b"Content-Type: application/json\r\nContent-Length: 209715200\r\n\r\n"
                     + b'{"model": "chat", "messages": [')
        status, headers, body = _read_answer(sock)
        assert status == 413
        assert time.monotonic() - started < 5
        _assert_too_large(body)
        assert "209715200 bytes" in json.loads(body)["error"]["message"]
        # the router closes the connection instead of reading the 200 MB it was promised
        sock.settimeout(5)
        assert sock.recv(65536) == b""


def test_chunked_body_is_refused_once_past_the_limit(small_router: tuple[str, int]) -> None:
    url, _ = small_router
    with socket.create_connection(_address(url)) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + AUTH
                     + b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
        block = b"x" * 65536
        for _ in range(LIMIT // len(block) + 2):   # past the limit, and never ended
            sock.sendall(b"%x\r\n" % len(block) + block + b"\r\n")
        status, _, body = _read_answer(sock)
    assert status == 413
    _assert_too_large(body)


def test_oversized_bodies_leave_the_worker_memory_alone(small_router: tuple[str, int]) -> None:
    url, master = small_router
    worker = _worker_pid(master)
    big = b'{"model": "chat", "pad": "' + b"x" * (40 * 1024 * 1024) + b'"}'
    before = _peak_rss_bytes(worker)

    def chunked() -> Iterator[bytes]:
        for _ in range(40):
            yield b"y" * (1024 * 1024)

    for body in (big, big, chunked(), chunked()):
        resp = requests.post(url + "/v1/chat/completions", data=body, timeout=30,
                             headers={"Authorization": f"Bearer {API_KEY}",
                                      "Content-Type": "application/json"})
        assert resp.status_code == 413
        _assert_too_large(resp.content)
    assert _worker_pid(master) == worker
    # 160 MB were sent; the worker held at most the limit of them at any time
    assert _peak_rss_bytes(worker) - before < 8 * LIMIT


def test_bodies_under_the_limit_still_pass(small_router: tuple[str, int]) -> None:
    url, _ = small_router
    content = "z" * (LIMIT - 4096)
    auth = {"Authorization": f"Bearer {API_KEY}"}
    resp = requests.post(url + "/v1/chat/completions", timeout=30, headers=auth,
                         json={"model": "chat",
                               "messages": [{"role": "user", "content": content}]})
    assert resp.status_code == 200, resp.text

    def chunked() -> Iterator[bytes]:
        yield b'{"model": "chat", "messages": []'
        yield b', "pad": "' + b"p" * (LIMIT // 2) + b'"}'

    resp = requests.post(url + "/v1/chat/completions", data=chunked(), timeout=30,
                         headers={**auth, "Content-Type": "application/json"})
    assert resp.status_code == 200, resp.text


def test_deep_nesting_is_a_400_naming_the_limit(small_router: tuple[str, int]) -> None:
    url, _ = small_router
    body = b'{"model": "chat", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    resp = requests.post(url + "/v1/chat/completions", data=body, timeout=30,
                         headers={"Authorization": f"Bearer {API_KEY}"})
    assert resp.status_code == 400
    err = resp.json()["error"]
    assert err["code"] == "invalid_request" and "64" in err["message"]
