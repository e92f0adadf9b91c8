"""Where a reconcile pass's CPU goes at 10,000 nodes: each part of the leader's pass timed
on its own (thread CPU), under the churn of control_bench's scenario c.

    .venv/bin/python bench/pass_parts.py [--nodes 10000] [--passes 30] [--root DIR]

The fleet is bench/reconcile_bench.py's (N nodes x 8 GPUs, 1,000 models; 4,000 replicas
from 5,000 nodes on), placed and ready, in a PostgreSQL started from
tests/support/postgres.py. A ``Reconciler`` leads it with the gc keeper on (as its own
process runs: ticked between passes), on one core. Before each pass: half the nodes'
report times move (a second of heartbeats at 10,000 agents every 2 s), four replicas
restart (ready to starting, or back), four nodes send new device readings, and every
tenth pass a catalog apply adds one replica to the first model or takes it back.
Printed: each kind of pass's CPU (p50, mean, max) and the mean milliseconds of each part
that ran. ``--root``: import llmgw_runtime from another checkout (a worktree of an older
commit), to compare.
``--profile FILE``: cProfile the passes (their times then include its cost) and write the
stats of those without an apply to FILE, of the others to FILE.apply.
Analysis, not a target: not in ``make bench``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent
PARTS = [  # (module, owner, name): what is timed
    ("llmgw_runtime.control.incremental", "View", "refresh"),
    ("llmgw_runtime.control.incremental", "View", "_volatile"),
    ("llmgw_runtime.control.fleet", None, "decide"),
    ("llmgw_runtime.control.fleet", None, "write"),
    ("llmgw_runtime.control.decide", None, "_place"),
    ("llmgw_runtime.control.snapshot", None, "build"),
    ("llmgw_runtime.control.snapshot", None, "node_views"),
    ("llmgw_runtime.control.snapshot", "PlanMemo", "place"),      # before stop 48
    ("llmgw_runtime.control.planmemo", "PlanMemo", "place"),
    ("llmgw_runtime.control.steps", "Pass", "__init__"),
    ("llmgw_runtime.control.steps", "Pass", "rolls"),
    ("llmgw_runtime.control.steps", "Pass", "leave"),
    ("llmgw_runtime.control.steps", "Pass", "finish"),
    ("llmgw_runtime.control.decide", None, "_reasons"),
    ("llmgw_runtime.control.gpu_hours", "DeviceClock", "observe"),
    ("llmgw_runtime.control.gpu_hours", "DeviceClock", "_count"),
]


def timed(spent: dict[str, float]) -> None:
    """Wrap each part so that its thread CPU adds to ``spent`` (by its name)."""
    import importlib

    for module, owner, name in PARTS:
        try:
            where: Any = importlib.import_module(module)
        except ImportError:             # a build (``--root``) without this module
            continue
        if owner is not None:
            where = getattr(where, owner, None)
        label = f"{owner or module.rsplit('.', 1)[1]}.{name}"
        original = getattr(where, name, None)
        if original is None:            # a build without this part
            continue

        def wrapper(*args: Any, __f: Any = original, __label: str = label,
                    **kwargs: Any) -> Any:
            started = time.thread_time()
            try:
                return __f(*args, **kwargs)
            finally:
                spent[__label] += time.thread_time() - started

        setattr(where, name, wrapper)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=10000)
    ap.add_argument("--passes", type=int, default=30)
    ap.add_argument("--root", default=str(HERE), help="the checkout to import from")
    ap.add_argument("--profile", metavar="FILE",
                    help="also profile the passes (cProfile): FILE, FILE.apply")
    args = ap.parse_args()
    sys.path.insert(0, args.root)
    sys.path.insert(1, str(HERE))
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})   # one core
    import sqlalchemy as sa

    import llmgw_runtime
    from bench import planner_bench, reconcile_bench
    from bench.control_bench import machine_speed_ms as speed_ms
    from llmgw_runtime import gckeeper
    from llmgw_runtime.control import fleet
    from llmgw_runtime.control.config import ControlConfig
    from llmgw_runtime.control.reconcile import Reconciler
    from llmgw_runtime.store import Store, repo
    from llmgw_runtime.store.schema import nodes as nodes_table
    from tests.support.postgres import PostgresServer

    print(f"llmgw_runtime from {Path(llmgw_runtime.__file__).parent}; machine speed "
          f"{speed_ms():.0f} ms (a fixed loop; lower is faster)", flush=True)
    spent: dict[str, float] = collections.defaultdict(float)
    timed(spent)
    rnd = random.Random(3)
    server = PostgresServer().start()
    try:
        store = Store(server.create_database("pass_parts"))
        store.migrate()
        reconcile_bench.populate(store, args.nodes)
        specs = [m.spec.model_copy(update={"replicas": m.wanted * 2})
                 for m in planner_bench.models()]
        config = ControlConfig(state_dir=Path(tempfile.mkdtemp()), node_timeout_s=3600.0,
                               replace_after_s=3600.0, start_timeout_s=3600.0,
                               lease_ttl_s=3600.0)
        leader = Reconciler(store, config)
        leader.history.tick = lambda *a, **k: None      # type: ignore[method-assign]
        for _ in range(3):
            leader.run_cycle()
        if hasattr(leader, "collect"):  # the keeper ticks between passes, as in its process
            leader.keeper = gckeeper.Keeper()
            between = leader.collect
        else:                           # an older build: the keeper on its own thread
            gckeeper.Keeper().start()
            between = lambda: None      # noqa: E731

        def churn(step: int) -> None:
            beats = [f"gpu-{i:05d}" for i in range(step % 2, args.nodes, 2)]
            readings = {f"gpu-{rnd.randrange(args.nodes):05d}" for _ in range(4)}
            with store.begin() as conn:
                now = store.now(conn)
                stored = dict(conn.execute(
                    sa.select(nodes_table.c.name, nodes_table.c.devices)
                    .where(nodes_table.c.name.in_(readings))).all())
                rows = []
                for name in beats:
                    devices = None
                    if name in readings:
                        parsed = json.loads(stored[name])
                        for dev in parsed:
                            dev["temperature_c"] = 40.0 + step % 7
                        devices = json.dumps(parsed)
                    rows.append((name, now, devices))
                repo.record_heartbeats(conn, rows, telemetry=readings & set(beats))
                for rep in rnd.sample(repo.list_replicas(conn), 4):
                    repo.update_replica(conn, rep.id, updated=now, state="starting"
                                        if rep.state == "ready" else "ready")
            if step % 10 == 9:
                more = step % 20 == 9
                with store.begin() as conn:
                    fleet.apply_catalog(conn, [
                        s.model_copy(update={"replicas": s.replicas + 1})
                        if i == 0 and more else s for i, s in enumerate(specs)],
                        store.now(conn), prune=False)

        cpu: dict[str, list[float]] = collections.defaultdict(list)
        parts: dict[str, dict[str, float]] = collections.defaultdict(
            lambda: collections.defaultdict(float))
        import cProfile
        profiles = {kind: cProfile.Profile() for kind in ("plain", "apply")} \
            if args.profile else {}
        for step in range(args.passes):
            churn(step)
            between()
            time.sleep(0.3)               # as between real passes
            spent.clear()
            kind = "apply" if step % 10 == 9 else "plain"
            profile = profiles.get(kind)
            if profile is not None:
                profile.enable()
            started = time.thread_time()
            leader.run_cycle()
            if profile is not None:
                profile.disable()
            cpu[kind].append(time.thread_time() - started)
            for label, seconds in spent.items():
                parts[kind][label] += seconds
        for kind, values in cpu.items():
            values.sort()
            n = len(values)
            print(f"{kind} passes ({n}): CPU ms p50 {values[n // 2] * 1000:.1f} mean "
                  f"{sum(values) / n * 1000:.1f} max {values[-1] * 1000:.1f}")
            for label, seconds in sorted(parts[kind].items(), key=lambda kv: -kv[1]):
                print(f"  {label:28s} {seconds / n * 1000:7.1f} ms a pass")
        for kind, profile in profiles.items():
            profile.dump_stats(args.profile if kind == "plain" else f"{args.profile}.{kind}")
        store.dispose()
    finally:
        server.stop()
    print(f"machine speed at the end {speed_ms():.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
