"""The floor under the router's cost per relayed stream chunk: a bare gevent relay.

It serves ``POST /v1/chat/completions`` by opening a connection to an engine, sending the
request on and passing the engine's chunked answer back byte for byte: no parsing beyond
the heads, no usage scan, no metrics, no admission. What it costs per chunk is what any
relay on gevent pays before the router's own work (docs/performance.md, "Where a relayed
chunk's CPU goes"). Three ways of moving a chunk:

- ``raw``: wait on an io watcher, then ``recv`` and ``send`` on the OS sockets;
- ``gevent``: the gevent socket's ``recv`` and ``sendall``;
- ``callback``: a libev callback that reads and sends (no greenlet switch per chunk).

Usage, with ``../shared/bench-proxy``'s engine on ENGINE_PORT and its load tool::

    .venv/bin/python bench/relay_floor.py PORT ENGINE_PORT raw|gevent|callback

then, for 64 streams of 64 chunks 20 ms apart, read the relay's CPU from
``/proc/PID/stat`` (utime + stime) before and after
``load.py --url http://127.0.0.1:PORT --concurrency 64 --duration 10 --stream --chunks
64 --chunk-delay-ms 20`` and divide by the streams done; runs with ``--chunks 8`` give
the per-request part, the difference the per-chunk part.
"""

from gevent import monkey

monkey.patch_all()

import socket  # noqa: E402
import sys  # noqa: E402
from typing import Any  # noqa: E402

import gevent  # noqa: E402
import gevent.event  # noqa: E402
from gevent.server import StreamServer  # noqa: E402

HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n")
END = b"0\r\n\r\n"


def _request(client: Any, buf: bytes) -> tuple[bytes, bytes] | None:
    """The next request's body, and what was read past it; None when the client closed."""
    while b"\r\n\r\n" not in buf:
        data = client.recv(65536)
        if not data:
            return None
        buf += data
    head, _, buf = buf.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    while len(buf) < length:
        buf += client.recv(65536)
    return buf[:length], buf[length:]


def _relay(mode: str, client: Any, upstream: Any, rest: bytes) -> None:
    """Pass the engine's chunked body on until its last chunk."""
    raw_up, raw_client = upstream._sock, client._sock
    hub = gevent.get_hub()
    watcher = hub.loop.io(upstream.fileno(), 1)
    try:
        if mode == "callback":
            done = gevent.event.Event()

            def step() -> None:
                try:
                    data = raw_up.recv(65536)
                except BlockingIOError:
                    return
                if data:
                    raw_client.send(data)
                if not data or data.endswith(END):
                    watcher.stop()
                    done.set()
            watcher.start(step)
            done.wait()
            return
        while not rest.endswith(END):
            if mode == "raw":
                hub.wait(watcher)
                rest = raw_up.recv(65536)
                if rest:
                    raw_client.send(rest)
            else:
                rest = upstream.recv(65536)
                if rest:
                    client.sendall(rest)
            if not rest:
                return
    finally:
        watcher.close()


def main() -> None:
    port, engine_port, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    if mode not in ("raw", "gevent", "callback"):
        raise SystemExit("mode: raw, gevent or callback")

    def handle(client: Any, _addr: Any) -> None:
        buf = b""
        while True:
            got = _request(client, buf)
            if got is None:
                return
            body, buf = got
            with socket.create_connection(("127.0.0.1", engine_port)) as upstream:
                upstream.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: engine\r\n"
                                 b"Content-Type: application/json\r\n"
                                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
                answer = b""
                while b"\r\n\r\n" not in answer:
                    answer += upstream.recv(65536)
                rest = answer.partition(b"\r\n\r\n")[2]
                client.sendall(HEAD + rest)
                if not rest.endswith(END):
                    _relay(mode, client, upstream, rest)

    StreamServer(("127.0.0.1", port), handle).serve_forever()


if __name__ == "__main__":
    main()
