"""A small, fast HTTP/1.1 load generator on gevent raw sockets (keep-alive, pre-built
requests, minimal parsing), so that Python itself is not the bottleneck of the benchmark.
Import it only in a gevent-patched process."""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field

import gevent


def build_request(host: str, port: int, path: str, body: bytes, token: str | None) -> bytes:
    auth = b"Authorization: Bearer " + token.encode() + b"\r\n" if token else b""
    return (b"POST " + path.encode() + b" HTTP/1.1\r\nHost: " + f"{host}:{port}".encode()
            + b"\r\n" + auth + b"Content-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n\r\n" + body)


def response(buf: bytes) -> tuple[int, bytes, bytes] | None:
    """(status, body, what follows) of the whole response at the start of ``buf``, or None
    while it is not whole yet."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return None
    head = buf[:end]
    status = int(head[9:12])
    start = end + 4
    length = -1
    for line in head.split(b"\r\n")[1:]:
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    if length >= 0:
        if len(buf) - start < length:
            return None
        return status, buf[start:start + length], buf[start + length:]
    done = buf.find(b"\r\n0\r\n\r\n", start - 2)      # chunked: up to the last chunk
    if done < 0:
        return None
    return status, buf[start:done + 7], buf[done + 7:]


class Conn:
    def __init__(self, host: str, port: int) -> None:
        self.sock = socket.create_connection((host, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def _fill(self) -> None:
        data = self.sock.recv(262144)
        if not data:
            raise ConnectionError("server closed the connection")
        self.buf += data

    def roundtrip(self, request: bytes) -> tuple[int, bytes]:
        """Send one request, read one whole response; returns (status, body)."""
        self.sock.sendall(request)
        while (whole := response(self.buf)) is None:
            self._fill()
        status, body, self.buf = whole
        return status, body

    def close(self) -> None:
        self.sock.close()


@dataclass
class Result:
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    elapsed: float = 0.0

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.elapsed if self.elapsed else 0.0

    def pct(self, p: float) -> float:
        xs = sorted(self.latencies)
        return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] if xs else float("nan")


def closed_loop(host: str, port: int, request: bytes, concurrency: int, duration_s: float,
                max_requests: int | None = None) -> Result:
    """``concurrency`` keep-alive connections, each sending the next request as soon as the
    previous answer is read, for ``duration_s`` (or ``max_requests`` in all)."""
    result = Result()
    deadline = time.perf_counter() + duration_s
    budget = [max_requests if max_requests is not None else 1 << 62]

    def one() -> None:
        conn = Conn(host, port)
        try:
            while time.perf_counter() < deadline and budget[0] > 0:
                budget[0] -= 1
                t0 = time.perf_counter()
                status, _ = conn.roundtrip(request)
                if status != 200:
                    result.errors.append(f"HTTP {status}")
                else:
                    result.latencies.append(time.perf_counter() - t0)
        except OSError as exc:
            result.errors.append(repr(exc))
        finally:
            conn.close()

    started = time.perf_counter()
    gevent.joinall([gevent.spawn(one) for _ in range(concurrency)])
    result.elapsed = time.perf_counter() - started
    return result


def streams(host: str, port: int, request: bytes, count: int, chunks: int,
            timeout_s: float) -> Result:
    """``count`` concurrent streaming requests; each must bring ``chunks`` data events and
    ``data: [DONE]``. Latency here is each stream's whole duration."""
    result = Result()

    def one() -> None:
        try:
            conn = Conn(host, port)
        except OSError as exc:
            result.errors.append(repr(exc))
            return
        try:
            t0 = time.perf_counter()
            status, body = conn.roundtrip(request)
            events = body.count(b"data: ")
            if status != 200 or b"data: [DONE]" not in body or events != chunks + 1:
                result.errors.append(f"HTTP {status}, {events} events")
            else:
                result.latencies.append(time.perf_counter() - t0)
        except OSError as exc:
            result.errors.append(repr(exc))
        finally:
            conn.close()

    started = time.perf_counter()
    greenlets = [gevent.spawn(one) for _ in range(count)]
    gevent.joinall(greenlets, timeout=timeout_s)
    unfinished = sum(1 for g in greenlets if not g.ready())
    gevent.killall(greenlets, block=False)
    result.errors += ["timed out"] * unfinished
    result.elapsed = time.perf_counter() - started
    return result
