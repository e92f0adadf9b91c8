"""Benchmark of the replicated store through failures: how long writes stop, and whether an
acknowledged write is lost.

    .venv/bin/python bench/store_bench.py [--runs N]

Starts 3 etcd and 3 Patroni/PostgreSQL 15 members on loopback (tests/support/
patroni_cluster.py; ttl 20, loop_wait 1, retry_timeout 5, synchronous_mode), then for each
failure of the primary — its PostgreSQL killed (kill -9 of the postmaster), the whole node
crashed (Patroni and PostgreSQL kill -9 together), a clean stop (SIGTERM to Patroni) — with
the cluster healthy again and a writer inserting rows through ``Store.write`` (the retry path
the control service uses; every acknowledged row recorded), it injects the failure and
measures how long writes stopped (the longest time without an acknowledged write after the
failure; a clean stop keeps acknowledging for a moment before the switchover) and the
acknowledged rows missing afterwards, read on the new primary. Prints
a table with the targets; stops every process it started; exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from llmgw_runtime.store import Store  # noqa: E402
from tests.support.patroni_cluster import PatroniCluster, missing_tools  # noqa: E402
from tests.support.store_probe import WriteProbe  # noqa: E402

TARGETS_S = {"postgres-killed": 5.0, "node-crash": 25.0, "clean-stop": 5.0}


def _clean_stop(cluster: PatroniCluster, name: str) -> None:
    # SIGTERM now; Patroni's own shutdown (a few seconds) runs while we measure.
    threading.Thread(target=cluster.stop_member, args=(name,), daemon=True).start()


FAILURES: dict[str, Callable[[PatroniCluster, str], object]] = {
    "postgres-killed": PatroniCluster.kill_postgres,
    "node-crash": PatroniCluster.crash_node,
    "clean-stop": _clean_stop,
}


def one(cluster: PatroniCluster, failure: str, run: int) -> tuple[float, int, int, int]:
    """Inject ``failure`` on the primary under writes: (pause s, acknowledged, lost,
    writes that failed even after their retries)."""
    cluster.wait_healthy(120)
    store = Store(cluster.url())
    probe = WriteProbe(store, run=f"{failure}-{run}-{time.time_ns()}").start()
    try:
        time.sleep(2.0)
        leader = cluster.leader()
        assert leader is not None, "no leader"
        failed_at = time.monotonic()
        FAILURES[failure](cluster, leader)
        probe.wait_acked_after(failed_at, timeout=90)
        time.sleep(2.0)
    finally:
        probe.stop()
    pause = probe.longest_pause(failed_at)
    fresh = Store(cluster.url())
    try:
        lost = len(probe.lost(fresh))
    finally:
        fresh.dispose()
        store.dispose()
    # Heal: a crashed or stopped member is started again (a killed postmaster is restarted
    # by its own Patroni, rewound and rejoined as a replica).
    member = cluster.nodes[leader]
    if member.proc is None or member.proc.poll() is not None:
        cluster.restart_member(leader, timeout=120)
    return pause, len(probe.acked), lost, len(probe.errors)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1, help="runs of each failure")
    args = parser.parse_args()
    why = missing_tools()
    if why:
        print(f"store bench skipped: {why}")
        return 0
    started = time.monotonic()
    cluster = PatroniCluster(3)
    try:
        cluster.start(timeout=120)
        print(f"cluster healthy in {time.monotonic() - started:.1f} s "
              f"(3 etcd, 3 Patroni, synchronous_mode)")
        results: dict[str, list[tuple[float, int, int, int]]] = {}
        for failure in FAILURES:
            for run in range(args.runs):
                res = one(cluster, failure, run)
                results.setdefault(failure, []).append(res)
                print(f"  {failure} run {run + 1}: writes paused {res[0]:.1f} s, "
                      f"{res[1]} acknowledged, {res[2]} lost, {res[3]} failed writes",
                      flush=True)
    finally:
        cluster.stop()
    ok = True
    print("\n| failure of the primary | writes paused s, median (max) | target | rows acked | rows lost "
          "| verdict |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    for failure, rows in results.items():
        worst = max(r[0] for r in rows)
        lost = sum(r[2] for r in rows)
        met = worst < TARGETS_S[failure] and lost == 0
        ok &= met
        median = statistics.median(r[0] for r in rows)
        shown = f"{median:.1f} ({worst:.1f})" if len(rows) > 1 else f"{worst:.1f}"
        print(f"| {failure} | {shown} | < {TARGETS_S[failure]:.0f} | "
              f"{sum(r[1] for r in rows)} | {lost} (target 0) | {'PASS' if met else 'MISS'} |")
    print(f"\ntotal {time.monotonic() - started:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
