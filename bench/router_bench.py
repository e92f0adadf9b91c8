"""Benchmark of the router against a fast fake engine, on loopback.

    .venv/bin/python bench/router_bench.py [--quick]

Starts the fake engine, a stand-in control service and the real router (serve.run in a
subprocess, 2 gevent workers), measures, prints a table against the targets, and stops every
process it started. Exit status 1 when a target is missed.
"""

from __future__ import annotations

from gevent import monkey

monkey.patch_all()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import urllib.request  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import harness  # noqa: E402
import loadgen  # noqa: E402
from fake_control import FakeControl  # noqa: E402

from llmgw_runtime.security import hash_token  # noqa: E402

TOKEN = "llmgw-router-bench"
KEY = "sk-llmgw-bench"
CHAT = json.dumps({"model": "bench", "messages": [{"role": "user", "content": "hi"}],
                   "max_tokens": 8}).encode()
STREAM_CHUNKS = 50


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="router benchmark")
    parser.add_argument("--quick", action="store_true", help="shorter runs (smoke test)")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    duration = 2.0 if args.quick else 5.0
    sequential = 500 if args.quick else 2000

    engine, engine_url = harness.start_engine("bench", chunks=STREAM_CHUNKS)
    control = FakeControl({"models": [{"name": "bench", "state": "ready", "reason": None,
                                       "on_demand": False,
                                       "endpoints": [{"replica_id": "r-bench",
                                                      "url": engine_url}]}],
                           "api_key_hashes": [hash_token(KEY)]}, TOKEN).start()
    router = None
    try:
        router, router_url = harness.start_router(control.url, TOKEN, workers=args.workers,
                                                  worker_connections=2000)
        host = "127.0.0.1"
        eport = int(engine_url.rsplit(":", 1)[1])
        rport = int(router_url.rsplit(":", 1)[1])
        direct_req = loadgen.build_request(host, eport, "/v1/chat/completions", CHAT, None)
        router_req = loadgen.build_request(host, rport, "/v1/chat/completions", CHAT, KEY)

        # warm up: both workers fetch the table and open upstream connections
        loadgen.closed_loop(host, rport, router_req, 16, 1.0)
        loadgen.closed_loop(host, eport, direct_req, 16, 0.5)

        lat_direct = loadgen.closed_loop(host, eport, direct_req, 1, 60, sequential)
        lat_router = loadgen.closed_loop(host, rport, router_req, 1, 60, sequential)
        thr_direct = loadgen.closed_loop(host, eport, direct_req, 64, duration)
        thr_router = loadgen.closed_loop(host, rport, router_req, 64, duration)

        stream_body = json.dumps({"model": "bench", "stream": True, "messages": [],
                                  "fake_chunks": STREAM_CHUNKS,
                                  "fake_chunk_delay_s": 0.1}).encode()
        urllib.request.urlopen(urllib.request.Request(engine_url + "/stats", data=b"",
                                                      method="POST"), timeout=5).read()
        sres = loadgen.streams(host, rport,
                               loadgen.build_request(host, rport, "/v1/chat/completions",
                                                     stream_body, KEY),
                               1000, STREAM_CHUNKS, timeout_s=60)
        stats = json.loads(urllib.request.urlopen(engine_url + "/stats", timeout=5).read())
    finally:
        if router is not None:
            harness.stop(router)
        harness.stop(engine)
        control.stop()

    added_p50 = lat_router.pct(50) - lat_direct.pct(50)
    added_p99 = lat_router.pct(99) - lat_direct.pct(99)
    rows = [
        ("latency c=1 p50 (direct / router)",
         f"{_ms(lat_direct.pct(50))} / {_ms(lat_router.pct(50))}", "", ""),
        ("latency c=1 p99 (direct / router)",
         f"{_ms(lat_direct.pct(99))} / {_ms(lat_router.pct(99))}", "", ""),
        ("added p50 latency", _ms(added_p50), "<= 1 ms", added_p50 <= 0.001),
        ("added p99 latency", _ms(added_p99), "(report)", ""),
        ("req/s c=64 direct", f"{thr_direct.rate:,.0f}", "(report)", ""),
        ("req/s c=64 router", f"{thr_router.rate:,.0f}", ">= 1,000",
         thr_router.rate >= 1000 and not thr_router.errors),
        ("1,000 streams x 50 chunks",
         f"{len(sres.latencies)} ok, {len(sres.errors)} errors, {sres.elapsed:.1f} s, "
         f"engine saw {stats['max_active']} at once", "0 errors", not sres.errors),
    ]
    print(f"\nrouter benchmark ({args.workers} gevent workers, {os.cpu_count()} CPUs, loopback)")
    print(f"{'measure':38} {'value':58} {'target':10} result")
    for name, value, target, ok in rows:
        verdict = "" if ok == "" else ("PASS" if ok else "MISS")
        print(f"{name:38} {value:58} {target:10} {verdict}")
    for res, label in ((thr_router, "router c=64"), (sres, "streams")):
        if res.errors:
            print(f"{label}: first errors: {res.errors[:3]}")
    missed = [r for r in rows if r[3] is False]
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
