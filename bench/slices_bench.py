"""What a request that computes for long does to the other requests of a gevent worker.

A gevent web worker serves every connection on one thread. This benchmark serves 2,000
kept-alive connections with the router's own HTTP loop (``router/http/server.py``
``Connection``, the control service's too) and a trivial app, paced at 2,500 requests a
second (a control worker's share of 10,000 agents reporting every 2 s), and every 5 s
parses the benchmark's catalog of 1,000 models (about 0.35 s of CPU) in one of three
ways:

- ``whole``: in a greenlet, in one go;
- ``thread``: on one of gevent's native threads (``threadpool.apply``), as the catalog PUT
  did until stop 44;
- ``slices``: in a greenlet, with the worker's checkpoints on (``llmgw_runtime/coop.py``),
  as it does now.

It prints each way's request latency (p50, p99, max, as the client saw it) and the
server's CPU per request. ``none`` (no parse) is the baseline. Usage::

    .venv/bin/python bench/slices_bench.py [--seconds 16] [--ways none,whole,thread,slices]

docs/performance.md ("A native thread does not keep the loop serving", stop 44).
"""

from __future__ import annotations

import argparse
import heapq
import os
import selectors
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONNS, RATE, EVERY_S = 2000, 2500.0, 5.0

SERVER = r"""
import os, sys, socket, time, types, logging
from gevent import monkey; monkey.patch_all()
import gevent
from llmgw_runtime import coop
from llmgw_runtime.catalog import parse as catalog
from llmgw_runtime.router.http.server import Connection
from bench.harness import catalog_json

WAY, BODY = sys.argv[2], b'{"ok":true}'
TEXT = catalog_json(1000, 2).decode()

def app(environ, start_response):
    environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
    start_response("200 OK", [("Content-Type", "application/json"),
                              ("Content-Length", str(len(BODY)))])
    return [BODY]

class Worker:
    cfg = types.SimpleNamespace(keepalive=75, is_ssl=False, workers=1)
    alive, nr, max_requests, log = True, 0, 1 << 62, logging.getLogger("w")
    wsgi = staticmethod(app)

def parses():
    while True:
        gevent.sleep(float(sys.argv[3]))
        if WAY == "thread":
            gevent.get_hub().threadpool.apply(catalog.parse, (TEXT, {}))
        elif WAY == "whole":
            catalog.parse(TEXT, {})
        elif WAY == "slices":
            coop.enable_gevent()
            catalog.parse(TEXT, {})
            coop.disable()

listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("127.0.0.1", 0))
listener.listen(4096)
print(listener.getsockname()[1], flush=True)
if WAY != "none":
    gevent.spawn(parses)
worker = Worker()

def serve(sock, addr):
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        Connection(worker, sock, addr, listener).serve()
    except OSError:
        pass                    # the load tool closed its connections: the way is done

while True:
    sock, addr = listener.accept()
    gevent.spawn(serve, sock, addr)
"""

REQUEST = (b"POST /api/v1/agent/heartbeat HTTP/1.1\r\nHost: 127.0.0.1\r\n"
           b"Authorization: Bearer llmgw-node-" + b"x" * 40 + b"\r\n"
           b"Content-Type: application/json\r\nContent-Length: 20\r\n\r\n"
           b'{"digest":"0123456"}')


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load(port: int, pid: int, seconds: float) -> dict[str, float]:
    """Each connection sends a request, waits for its answer, then sends again one period
    later (``RATE`` in all); the latencies of the answers within ``seconds``."""
    sel = selectors.DefaultSelector()
    socks = []
    for i in range(CONNS):
        s = socket.create_connection(("127.0.0.1", port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ, i)
        socks.append(s)
    period = CONNS / RATE
    start = time.monotonic()
    due = [(start + period * i / CONNS, i) for i in range(CONNS)]
    heapq.heapify(due)
    sent: dict[int, float] = {}
    latencies: list[float] = []
    begin = start + 2.0                # the connections' first round is not measured
    cpu0 = None
    while True:
        now = time.monotonic()
        if cpu0 is None and now >= begin:
            cpu0 = cpu_s(pid)
        if now >= begin + seconds:
            break
        while due and due[0][0] <= now:
            _, i = heapq.heappop(due)
            socks[i].send(REQUEST)
            sent[i] = now
        for key, _ in sel.select(max(0.0, due[0][0] - now) if due else 0.01):
            if not key.fileobj.recv(65536):
                raise SystemExit("the server closed a connection")
            if now >= begin:
                latencies.append(now - sent[key.data])
            heapq.heappush(due, (now + period, key.data))
    used = cpu_s(pid) - (cpu0 or 0.0)
    for s in socks:
        s.close()
    latencies.sort()
    return {"p50": latencies[len(latencies) // 2] * 1000,
            "p99": latencies[int(len(latencies) * 0.99)] * 1000,
            "max": latencies[-1] * 1000, "rate": len(latencies) / seconds,
            "cpu_us": used / max(1, len(latencies)) * 1e6}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=16.0, help="measured per way [16]")
    ap.add_argument("--ways", default="none,whole,thread,slices")
    args = ap.parse_args()
    print(f"{CONNS} connections, {RATE:.0f} requests/s, a 1,000-model catalog parsed every "
          f"{EVERY_S:g} s; latency as the client saw it")
    print(f"{'way':<8} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} {'req/s':>7} "
          f"{'server CPU us/request':>22}")
    for way in args.ways.split(","):
        server = subprocess.Popen([sys.executable, "-c", SERVER, "", way, str(EVERY_S)],
                                  cwd=ROOT, stdout=subprocess.PIPE, text=True,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)})
        try:
            assert server.stdout is not None
            port = int(server.stdout.readline())
            r = load(port, server.pid, args.seconds)
        finally:
            server.kill()
            server.wait()
        print(f"{way:<8} {r['p50']:>7.1f} {r['p99']:>7.1f} {r['max']:>7.0f} "
              f"{r['rate']:>7.0f} {r['cpu_us']:>22.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
