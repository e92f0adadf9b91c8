"""Benchmark of the fleet summary, ``llmgw ctl status`` and the console at 10,000 nodes.

    .venv/bin/python bench/status_bench.py [--sizes 1000,2000,5000,10000] [--nodes 10000]
    .venv/bin/python bench/status_bench.py --pure-only      # the curve alone, no PostgreSQL

1. The curve, pure (no I/O), best of 5: for fleets of N nodes x 8 GPUs in 4 fabrics
   (every 10th node split into MIG instances, 1 % silent, a few unhealthy cards), N/5
   models and about two replicas each (tests/status/builders.big_fleet; 10,000 nodes:
   2,000 models, ~3,900 replicas): ``status.summary.build``, the summary through JSON and
   back (what travels to ``ctl``) and ``status.render.render`` at 120 columns.

2. The same --nodes fleet in a real PostgreSQL (tests/support/postgres.py, initdb on a
   free loopback port): the catalog through ``repo.apply_catalog``, node and replica rows
   inserted in bulk. Best of 5 unless said:
   - ``control.summary_view.summary`` (what the status endpoint and the console call),
     split into the store read (rows to the views' dicts) and the pure summary;
   - ``GET /api/v1/status`` over HTTP from the real control app (werkzeug, threaded, in
     this process), the answer's bytes;
   - ``llmgw ctl status`` end to end as a subprocess (interpreter start, HTTP, render), best
     of 3, and how many lines it prints (the node list is summarised: it must not grow
     with the fleet);
   - each console page (Flask test client, logged in): the summary, nodes page 1 and a
     middle page, replicas, models, events.

Targets: pure summary < 200 ms at 10,000 nodes; the summary with its store read < 200 ms;
``ctl status`` < 1 s end to end; every console page < 1 s. Exit status 1 when one is missed.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import resource
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from llmgw_runtime.status import summary  # noqa: E402
from llmgw_runtime.status.render import render  # noqa: E402
from tests.control.conftest import served  # noqa: E402
from tests.status.builders import NOW, big_fleet  # noqa: E402

TARGET_SUMMARY_S = 0.200
TARGET_CTL_S = 1.0
TARGET_PAGE_S = 1.0
ADMIN = "llmgw-admin-bench-0123456789abcdef"
JOIN = "llmgw-join-bench-0123456789abcdef"
ROUTER = "llmgw-router-bench-0123456789abcdef"
CONSOLE_PAGES = ("/console/", "/console/nodes", "/console/nodes?page=50",
                 "/console/replicas", "/console/models", "/console/events")


def cpu_now() -> float:
    """CPU seconds of this process (every thread: the HTTP server's too) and of its
    finished children (``ctl``); PostgreSQL's are not counted."""
    child = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + child.ru_utime + child.ru_stime


def best(fn: Callable[[], Any], runs: int = 5) -> tuple[float, float, Any]:
    """Wall seconds of the fastest of ``runs`` calls, the least CPU seconds one took, and
    the last call's result."""
    times, cpus, out = [], [], None
    for _ in range(runs):
        t, c = time.perf_counter(), cpu_now()
        out = fn()
        times.append(time.perf_counter() - t)
        cpus.append(cpu_now() - c)
    return min(times), min(cpus), out


def models_of(n: int) -> int:
    return max(4, n // 5)


def pure_curve(sizes: list[int]) -> bool:
    print("pure: summary.build + JSON + render, best of 5 (ms)")
    print(f"{'nodes':>6} {'models':>6} {'replicas':>8} {'summary':>8} {'cpu':>6} "
          f"{'wire':>6} {'render':>7} {'lines':>6}  target")
    ok = True
    for n in sizes:
        models, nodes, replicas = big_fleet(n, models_of(n))
        t_sum, c_sum, s = best(partial(summary.build, models, nodes, replicas, NOW))
        t_wire, _, wire = best(partial(json.loads, json.dumps(s)))
        t_render, _, text = best(partial(render, wire, 120))
        verdict = ""
        if n >= 10_000:
            met = t_sum < TARGET_SUMMARY_S
            verdict = f"summary < {TARGET_SUMMARY_S * 1000:.0f} ms " + ("PASS" if met else
                                                                       "MISS")
            ok = ok and met
        print(f"{n:>6} {len(models):>6} {len(replicas):>8} {t_sum * 1000:>8.1f} "
              f"{c_sum * 1000:>6.1f} {t_wire * 1000:>6.1f} {t_render * 1000:>7.1f} "
              f"{len(str(text).splitlines()):>6}  {verdict}")
    return ok


def fill(store: Any, n: int) -> tuple[int, int, int]:
    """The big_fleet of ``n`` nodes in the store: models through apply_catalog, nodes and
    replicas in bulk. Returns (models, nodes, replicas)."""
    from llmgw_runtime.api.catalog import ModelSpec, Profile
    from llmgw_runtime.store import repo
    from llmgw_runtime.store.schema import nodes as nodes_t
    from llmgw_runtime.store.schema import replicas as replicas_t

    models, nodes, replicas = big_fleet(n, models_of(n))
    now = time.time()
    specs = [ModelSpec(name=m["name"], source=m["source"], engine="vllm",
                       profile=Profile(klass="h100-80g"), replicas=m["wanted"] or 1)
             for m in models]
    with store.begin() as conn:
        repo.apply_catalog(conn, specs, now)
        for m in models:
            if m["state"] == "parked":
                repo.update_model(conn, m["name"], parked=1, consecutive_failures=5,
                                  last_error=m["last_error"])
        conn.execute(nodes_t.insert(), [
            {"name": nd["name"], "fabric": nd["fabric"], "address": nd["address"],
             "last_report": now - (NOW - nd["last_report"]),
             "agent_version": nd["agent_version"],
             # readings differ from node to node, as on a real fleet (no two texts alike)
             "devices": json.dumps([{**d, "memory_used_mb": (i * 37 + d["id"]) % 4096}
                                    for d in nd["devices"]]),
             "engines": json.dumps(nd["engines"]), "weights": json.dumps(nd["weights"]),
             "hardware": json.dumps(nd["hardware"]), "created": now}
            for i, nd in enumerate(nodes)])
        conn.execute(replicas_t.insert(), [
            {"id": r["id"], "model": r["model"], "node": r["node"],
             "devices": json.dumps(r["devices"]), "port": r["port"], "pid": r["pid"],
             "state": r["state"], "desired": 1, "started": now - 3600, "updated": now,
             "last_used": None if r["last_used"] is None else now - (NOW - r["last_used"])}
            for r in replicas])
        for i in range(300):
            repo.add_event(conn, now - i, "replica", f"r-{i:04d}", f"event {i}")
    return len(models), len(nodes), len(replicas)


def refresh(store: Any, n: int) -> None:
    """Every node heard from a second ago but big_fleet's silent ones (1 in 100, 10
    minutes), at the store's clock: the steps below run longer than the node timeout."""

    from llmgw_runtime.store.schema import nodes as nodes_t

    silent = [f"gpu-{i:04d}" for i in range(n) if i % 100 == 42]
    with store.begin() as conn:
        now = store.clock(conn)
        conn.execute(nodes_t.update().values(last_report=now - 1.0))
        conn.execute(nodes_t.update().where(nodes_t.c.name.in_(silent))
                     .values(last_report=now - 600.0))


def get(url: str) -> bytes:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {ADMIN}"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return bytes(resp.read())


def ctl_status(url: str) -> str:
    exe = Path(sys.executable).parent / "llmgw"
    argv = ([str(exe)] if exe.exists() else [sys.executable, "-m", "llmgw_runtime.cli.main"])
    env = {**os.environ, "COLUMNS": "120", "NO_COLOR": "1"}
    done = subprocess.run([*argv, "ctl", "--url", url, "--token", ADMIN, "status"],
                          capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"ctl status failed: {done.stderr[-2000:]}")
    return done.stdout


def with_store(n: int) -> bool:
    from llmgw_runtime.control import summary_view
    from llmgw_runtime.control.app import create_app
    from llmgw_runtime.control.bootstrap import bootstrap
    from llmgw_runtime.control.config import ControlConfig
    from llmgw_runtime.control.decide import Settings
    from llmgw_runtime.store import Store
    from tests.support.postgres import PostgresServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)    # no line per request
    pg = PostgresServer().start()
    ok = True
    try:
        store = Store(pg.create_database("status_bench"))
        config = ControlConfig(state_dir=Path(tempfile.mkdtemp(prefix="llmgw-status-bench-")),
                               admin_token=ADMIN, join_token=JOIN, router_token=ROUTER,
                               # times, not the 4 s bound on a request's transaction: on a
                               # busy machine a read may take longer
                               store_wait_s=30.0)
        bootstrap(store, config, out=io.StringIO())
        t = time.perf_counter()
        counts = fill(store, n)
        print(f"\nPostgreSQL: {counts[1]} nodes, {counts[0]} models, {counts[2]} replicas "
              f"stored in {time.perf_counter() - t:.1f} s")
        settings = Settings()

        def read() -> Any:
            with store.begin() as conn:
                return summary_view.read(conn, store.clock(conn), settings)

        def whole() -> Any:
            with store.begin() as conn:
                return summary_view.summary(conn, store.clock(conn), settings,
                                            idle_after_s=900.0, store={})

        refresh(store, n)
        cold = best(read, runs=1)        # the first: every node's devices decoded
        warm = best(read)
        rows = warm[2]
        pure = best(lambda: summary_view.build(rows, settings, idle_after_s=900.0, store={}))
        both = best(whole)
        app = create_app(config, store_=store)
        refresh(store, n)
        with served(app) as url:
            http = best(partial(get, url + "/api/v1/status"))
            ctl = best(partial(ctl_status, url), runs=3)
        body, text = http[2], ctl[2]
        rows_ = [("store read, first (every node's JSON decoded)", *cold[:2], None),
                 ("store read (rows to dicts; unchanged nodes' JSON cached)", *warm[:2], None),
                 ("pure summary of those", *pure[:2], TARGET_SUMMARY_S),
                 ("summary_view.summary (read + summary)", *both[:2], TARGET_SUMMARY_S),
                 (f"GET /api/v1/status over HTTP ({len(body) // 1024} KiB)", *http[:2], None),
                 (f"llmgw ctl status, subprocess ({len(text.splitlines())} lines)", *ctl[:2],
                  TARGET_CTL_S)]
        refresh(store, n)
        client = app.test_client()
        client.post("/console/login", data={"token": ADMIN})
        for path in CONSOLE_PAGES:
            resp = client.get(path)
            if resp.status_code != 200:
                raise RuntimeError(f"{path}: {resp.status_code}")
            took, cpu, resp = best(partial(client.get, path), runs=3)
            if resp.status_code != 200:
                raise RuntimeError(f"{path}: {resp.status_code}")
            rows_.append((f"console {path} ({len(resp.data) // 1024} KiB)", took, cpu,
                          TARGET_PAGE_S))
        print(f"{'step (best of 5; ctl and console pages best of 3)':<60} {'ms':>8} "
              f"{'cpu ms':>7}  target (wall)")
        for label, took, cpu, target in rows_:
            verdict = ""
            if target is not None:
                met = took < target
                ok = ok and met
                verdict = f"< {target * 1000:.0f} ms " + ("PASS" if met else "MISS")
            print(f"{label:<60} {took * 1000:>8.1f} {cpu * 1000:>7.1f}  {verdict}")
        print("\nllmgw ctl status at", n, "nodes (first 40 lines):")
        print("\n".join(text.splitlines()[:40]))
    finally:
        pg.stop()
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,2000,5000,10000",
                        help="fleet sizes (nodes) of the pure curve")
    parser.add_argument("--nodes", type=int, default=10_000,
                        help="fleet size stored in PostgreSQL")
    parser.add_argument("--pure-only", action="store_true", help="the pure curve alone")
    args = parser.parse_args()
    print(f"load average at start: {' '.join(f'{x:.1f}' for x in os.getloadavg())} "
          f"({os.cpu_count()} CPUs); cpu: this process's threads and its children, not "
          "PostgreSQL's")
    ok = pure_curve([int(x) for x in args.sizes.split(",")])
    if not args.pure_only:
        ok = with_store(args.nodes) and ok
    print("targets " + ("met" if ok else "MISSED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
