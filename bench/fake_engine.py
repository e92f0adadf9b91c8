"""A fast fake OpenAI engine for router tests and benchmarks (gevent, raw HTTP/1.1).

    python bench/fake_engine.py --port 9001 --name e1 [--chunks 5]

Routes: ``GET /health``, ``GET /v1/models``, ``POST /v1/chat/completions`` (fixed small JSON,
or with ``"stream": true`` N SSE chunks ending ``data: [DONE]``), ``POST /v1/completions``,
``POST /v1/embeddings``, ``GET /stats`` (requests, active, max_active), ``POST /stats/reset``.
Request fields for tests: ``fake_chunks`` (stream length), ``fake_chunk_delay_s`` (pause
before each chunk), ``fake_delay_s`` (pause before answering). Every answer names the engine
in ``system_fingerprint`` so tests can tell which replica served.
"""

from __future__ import annotations

from gevent import monkey

monkey.patch_all()

import argparse  # noqa: E402
import json  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
from typing import Any  # noqa: E402

import gevent  # noqa: E402
from gevent.server import StreamServer  # noqa: E402

STATS = {"requests": 0, "active": 0, "max_active": 0}


def _http(status: str, body: bytes, ctype: bytes = b"application/json") -> bytes:
    return (b"HTTP/1.1 " + status.encode() + b"\r\nContent-Type: " + ctype
            + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


class Engine:
    def __init__(self, name: str, chunks: int) -> None:
        self.name = name
        self.chunks = chunks
        self._chat_cache: dict[bytes, bytes] = {}

    def chat(self, model: str) -> bytes:
        key = model.encode()
        cached = self._chat_cache.get(key)
        if cached is None:
            cached = _http("200 OK", json.dumps({
                "id": "chatcmpl-fake", "object": "chat.completion", "created": 1733180000,
                "model": model, "system_fingerprint": self.name,
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": "Hello from " + self.name}}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
            }).encode())
            self._chat_cache[key] = cached
        return cached

    def stream(self, sock: socket.socket, model: str, n: int, delay: float) -> None:
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n")
        for i in range(n):
            if delay:
                gevent.sleep(delay)
            delta: dict[str, Any] = {"content": f"tok{i} "}
            if i == 0:
                delta["role"] = "assistant"
            event = {"id": "chatcmpl-fake", "object": "chat.completion.chunk",
                     "created": 1733180000, "model": model, "system_fingerprint": self.name,
                     "choices": [{"index": 0, "delta": delta,
                                  "finish_reason": "stop" if i == n - 1 else None}]}
            data = b"data: " + json.dumps(event).encode() + b"\n\n"
            sock.sendall(b"%x\r\n%s\r\n" % (len(data), data))
        done = b"data: [DONE]\n\n"
        sock.sendall(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))

    def answer(self, sock: socket.socket, method: bytes, path: bytes, body: bytes) -> None:
        if path == b"/health":
            sock.sendall(_http("200 OK", b'{"status":"ok"}'))
            return
        if path in (b"/stats", b"/stats/reset"):
            if method == b"POST":
                STATS.update(requests=0, max_active=STATS["active"])
            sock.sendall(_http("200 OK", json.dumps(STATS).encode()))
            return
        if path == b"/v1/models":
            sock.sendall(_http("200 OK", b'{"object":"list","data":[]}'))
            return
        if method != b"POST" or path not in (b"/v1/chat/completions", b"/v1/completions",
                                             b"/v1/embeddings"):
            sock.sendall(_http("404 Not Found", b'{"error":{"message":"no such route"}}'))
            return
        try:
            doc = json.loads(body)
            model = str(doc.get("model", "fake"))
        except ValueError:
            sock.sendall(_http("400 Bad Request", b'{"error":{"message":"bad json"}}'))
            return
        STATS["requests"] += 1
        STATS["active"] += 1
        STATS["max_active"] = max(STATS["max_active"], STATS["active"])
        try:
            if doc.get("fake_delay_s"):
                gevent.sleep(float(doc["fake_delay_s"]))
            if path == b"/v1/embeddings":
                sock.sendall(_http("200 OK", json.dumps({
                    "object": "list", "model": model,
                    "data": [{"object": "embedding", "index": 0, "embedding": [0.1, 0.2, 0.3]}],
                    "usage": {"prompt_tokens": 2, "total_tokens": 2}}).encode()))
            elif path == b"/v1/completions" and not doc.get("stream"):
                sock.sendall(_http("200 OK", json.dumps({
                    "id": "cmpl-fake", "object": "text_completion", "created": 1733180000,
                    "model": model, "system_fingerprint": self.name,
                    "choices": [{"index": 0, "text": "hello", "finish_reason": "stop",
                                 "logprobs": None}]}).encode()))
            elif doc.get("stream"):
                self.stream(sock, model, int(doc.get("fake_chunks") or self.chunks),
                            float(doc.get("fake_chunk_delay_s") or 0))
            else:
                sock.sendall(self.chat(model))
        finally:
            STATS["active"] -= 1

    def handle(self, sock: socket.socket, _addr: Any) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    data = sock.recv(65536)
                    if not data:
                        return
                    buf += data
                head, _, buf = buf.partition(b"\r\n\r\n")
                lines = head.split(b"\r\n")
                method, path, _version = lines[0].split(b" ", 2)
                length = 0
                close = False
                for line in lines[1:]:
                    key, _, value = line.partition(b":")
                    key = key.strip().lower()
                    if key == b"content-length":
                        length = int(value)
                    elif key == b"connection" and value.strip().lower() == b"close":
                        close = True
                while len(buf) < length:
                    data = sock.recv(65536)
                    if not data:
                        return
                    buf += data
                body, buf = buf[:length], buf[length:]
                self.answer(sock, method, path.split(b"?", 1)[0], body)
                if close:
                    return
        except OSError:
            return
        finally:
            sock.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--name", default="fake")
    parser.add_argument("--chunks", type=int, default=5)
    args = parser.parse_args(argv)
    engine = Engine(args.name, args.chunks)
    server = StreamServer((args.host, args.port), engine.handle, backlog=4096)
    server.start()
    for sig in (signal.SIGINT, signal.SIGTERM):
        gevent.signal_handler(sig, server.stop, 0.5)
    print(f"fake engine {args.name} listening on {args.host}:{args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
