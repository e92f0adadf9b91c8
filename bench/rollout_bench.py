"""Benchmark of graceful changes under load: a rollout, a node drain, a scale down, an idle
stop and a delete, each timed while a request loop runs (issue 27).

    .venv/bin/python bench/rollout_bench.py [--baseline-s 10] [--threads 4] [--json FILE]

Starts, all on 127.0.0.1 with free ports and a SQLite store in a temporary directory: the
real control service, the real router and two real agents (node1 and node2, class cpu), as
tests/integration/test_rollouts.py does. The catalog: ``tiny`` (the tiny random-weight GGUF,
2 replicas, spread), ``lazy`` (the tiny GGUF, on demand, idle_stop_after 3s) and ``story``
(the demo model SmolLM2-135M, 1 replica). A request loop of 4 openai clients (half
streamed, max_tokens 8, 50 ms between one client's requests) sends ``tiny`` requests
through the router the whole time. Then, one after the other:

- baseline: the loop alone for ``--baseline-s`` seconds;
- rollout: new args for ``tiny`` (``--ctx-size`` 512 -> 768) until both replicas are new
  and ready, the old ones stopped and the rollout state none;
- node drain: ``POST /nodes/node2/drain`` until the node reports done (then uncordon);
- scale down: ``tiny`` replicas 2 -> 1 until one is left;
- idle stop: one request starts ``lazy``; timed from that request's answer until its
  replica has drained and stopped (idle_stop_after 3 s included);
- delete: ``DELETE /models/story`` until its replica has drained and stopped.

Prints a markdown table: each operation's duration, the loop's requests, failures, p50 and
p99 latency during it, and p99 against the baseline. Exits 1 when any request failed (or an
operation did not finish within its timeout). Stops every process it started. See
bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llmgw_runtime.cli.up import demo_model_path  # noqa: E402
from tests.integration.conftest import (  # noqa: E402
    Cluster,
    RequestLoop,
    catalog_of,
    model_entry,
    one_request,
    percentile,
    router_client,
)
from tests.support.procs import wait_until  # noqa: E402
from tests.support.tiny_gguf import write_tiny_gguf  # noqa: E402

CONTROL_ENV = {"LLMGW_BACKOFF_BASE_S": "0.2", "LLMGW_BACKOFF_CAP_S": "1"}


class Bench:
    def __init__(self, c: Cluster, tiny: Path, threads: int) -> None:
        self.c, self.tiny = c, tiny
        self.lazy = model_entry("lazy", tiny, on_demand="true", idle_stop_after="3s")
        self.story = model_entry("story", demo_model_path(), ctx=1024)
        self.loop = RequestLoop(c.router_url, "tiny", threads=threads)
        self.rows: list[dict[str, Any]] = []
        self.baseline_p99 = 0.0

    def apply(self, ctx: int, replicas: int) -> Any:
        """The catalog with ``tiny`` at ``--ctx-size ctx`` and ``replicas``."""
        tiny = model_entry("tiny", self.tiny, ctx=ctx, replicas=replicas, strategy="spread")
        return self.c.apply(catalog_of(tiny, self.lazy, self.story))

    def live(self, model: str) -> list[dict[str, Any]]:
        return [r for r in self.c.replicas(model) if r["desired"]]

    def serving(self, model: str) -> list[dict[str, Any]]:
        return [r for r in self.c.replicas(model)
                if r["desired"] and r["state"] == "ready" and not r.get("draining")]

    def row(self, name: str, since: float, until: float, note: str = "") -> dict[str, Any]:
        done = self.loop.done(since, until)
        lat = [o.latency for o in done if not o.error]
        p99 = percentile(lat, 99)
        row = {"operation": name, "duration_s": until - since, "requests": len(done),
               "streamed": sum(o.streamed for o in done),
               "failed": len(self.loop.failures(since, until)),
               "p50_ms": percentile(lat, 50) * 1000, "p99_ms": p99 * 1000,
               "p99_vs_baseline": p99 / self.baseline_p99 if self.baseline_p99 else 1.0,
               "note": note, "errors": self.loop.failures(since, until)[:5]}
        self.rows.append(row)
        print(f"  {name}: {row['duration_s']:.1f} s, {row['requests']} requests, "
              f"{row['failed']} failed, p99 {row['p99_ms']:.0f} ms {note}", flush=True)
        return row

    def timed(self, name: str, act: Callable[[], Any], done: Callable[[], Any],
              timeout: float, note: Callable[[], str] = lambda: "") -> None:
        t0 = time.monotonic()
        act()
        wait_until(done, timeout, name, interval=0.2)
        self.row(name, t0, time.monotonic(), note())

    def ids(self, model: str) -> str:
        return ", ".join(sorted(f"{r['id']}@{r['node']}" for r in self.live(model)))

    def run(self, baseline_s: float) -> None:
        c = self.c
        self.apply(512, 2)
        wait_until(lambda: len(self.serving("tiny")) == 2 and len(self.serving("story")) == 1,
                   120, "tiny's 2 replicas and story's ready")
        self.loop.start()
        time.sleep(1.0)                                   # connections, caches
        t0 = time.monotonic()
        time.sleep(baseline_s)
        base = self.row("baseline (loop alone)", t0, time.monotonic())
        self.baseline_p99 = base["p99_ms"] / 1000
        base["p99_vs_baseline"] = 1.0

        on_node2 = [r["id"] for r in c.replicas() if r["desired"] and r["node"] == "node2"]
        if not on_node2:
            raise RuntimeError(f"spread put no replica on node2: {self.ids('tiny')}")
        self.timed("node drain (node2)",
                   lambda: c.post("/api/v1/nodes/node2/drain", {"force": False}),
                   lambda: c.node_drain("node2")["done"], 180,
                   lambda: "moved {moved}/{total}: ".format(**c.node_drain("node2"))
                   + ", ".join(on_node2))
        c.post("/api/v1/nodes/node2/uncordon")

        first = {r["id"] for r in self.serving("tiny")}
        before = self.ids("tiny")

        def rolled() -> bool:
            live = {r["id"] for r in self.live("tiny")}
            return (len(live) == 2 and not live & first and len(self.serving("tiny")) == 2
                    and c.rollout("tiny")["state"] == "none")
        self.timed("rollout of 2 replicas (new args)",
                   lambda: self.apply(768, 2),
                   rolled, 180, lambda: f"{before} -> {self.ids('tiny')}")

        before = self.ids("tiny")
        self.timed("scale down 2 -> 1",
                   lambda: self.apply(768, 1),
                   lambda: len(self.live("tiny")) == 1 and len(self.serving("tiny")) == 1,
                   120, lambda: f"{before} -> {self.ids('tiny')}")

        answer = one_request(router_client(c.router_url), "lazy", False, 4)
        if answer.error:
            raise RuntimeError(f"the request that starts lazy failed: {answer.error}")
        lazy = self.ids("lazy")
        self.timed("idle stop (3 s idle + drain)", lambda: None,
                   lambda: not c.replicas("lazy") and c.model("lazy")["state"] == "idle",
                   120, lambda: f"{lazy} stopped")

        story = self.ids("story")
        self.timed("delete (story)", lambda: c.admin.delete("/api/v1/models/story"),
                   lambda: not c.replicas("story"), 120, lambda: f"{story} stopped")
        time.sleep(1.0)
        self.loop.stop()
        self.row("whole run", t0, time.monotonic())


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| operation | duration s | requests | streamed | failed | p50 ms | p99 ms "
             "| p99 / baseline | replicas |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        lines.append(f"| {r['operation']} | {r['duration_s']:.1f} | {r['requests']:,} "
                     f"| {r['streamed']:,} | {r['failed']} | {r['p50_ms']:.0f} "
                     f"| {r['p99_ms']:.0f} | {r['p99_vs_baseline']:.2f} | {r['note']} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline-s", type=float, default=10.0)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    opts = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="llmgw-rollout-bench-"))
    tiny = write_tiny_gguf(root / "tiny.gguf")
    c = Cluster(f"sqlite:///{root}/llmgw.db", root)
    bench = Bench(c, tiny, opts.threads)
    problem = None
    started = time.monotonic()
    try:
        c.start_two_nodes(env=CONTROL_ENV)
        bench.run(opts.baseline_s)
    except Exception as exc:  # noqa: BLE001 - reported with the rows so far, exit 1
        problem = f"{type(exc).__name__}: {exc}"
    finally:
        bench.loop.stop()
        c.stop()
    print()
    print(table(bench.rows))
    failed = sum(r["failed"] for r in bench.rows if r["operation"] != "whole run")
    total = bench.loop.failures()
    print(f"\n{len(bench.loop.done()):,} requests in all, {len(total)} failed; "
          f"{time.monotonic() - started:.0f} s (logs in {root})")
    for line in total[:20]:
        print("  FAILED", line)
    if opts.json:
        opts.json.write_text(json.dumps(bench.rows, indent=2))
    if problem:
        print(f"FAIL: {problem}\n{c.logs()[-4000:]}")
        return 1
    if total or failed:
        print("FAIL: requests failed during the changes")
        return 1
    print("PASS: 0 failed requests")
    return 0


if __name__ == "__main__":
    sys.exit(main())
