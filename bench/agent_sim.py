"""Simulated node agents for the control-service benchmark, in a process of their own.

    .venv/bin/python bench/agent_sim.py      # driven over stdin/stdout by control_bench.py

Each agent joins, then reports on a fixed schedule over its own keep-alive connection
(``sim_wire``: the gevent loop's watchers, no greenlet per agent) to one of the control
hosts (agent ``i`` to host ``i % hosts``), with eight fake A100 devices and the replicas it
was assigned reported as ready. With ``reports: heartbeat`` it speaks the heartbeat protocol as the real agent does
(api/agent.py ``Heartbeat``): a full report first, whenever anything but its replicas'
states and its devices' readings changed, when answered ``full_report``, and at least every
``FULL_REPORT_EVERY_S`` (the first of these at a random point of that span, so a short run
sees the steady share of them); a heartbeat otherwise, carrying its replicas and devices
when they differ from the last full report (and in every heartbeat from then on until the
next full report). With ``reports: full`` every report is a full report.

Open loop: agent ``i`` of ``n`` sends at ``t0 + i/n * period + k * period``; latency is
measured from that scheduled time, so time spent queued behind a slow server counts. An
agent whose answer comes after its next slot skips the slots it missed (it has one request
open at a time, as the real agent), so an overloaded server answers fewer than the target.
Each sample also keeps how late its send began (this process busy or not scheduled: the
simulator shares the machine), so a window reports that lateness's p99 and the latency
from the send, beside the latency from the schedule the targets are judged by.

The protocol: one JSON object per line on stdin, one answer per line on stdout (every
answer has ``ok``). Commands: ``init`` (hosts, join_token, period, reports, shared_weights,
seed), ``join`` (total), ``grow`` (total, rate: new agents started per second at most),
``period`` (seconds: every agent moves to it), ``churn`` (per_min: the share of nodes that
change per minute, 0 stops), ``window`` (start, end: perf_counter times, the same clock in
every process on Linux). It ends at the end of stdin or on SIGTERM. The benchmark counts
this process's CPU on its own."""

from __future__ import annotations

if __name__ == "__main__":
    from gevent import monkey

    monkey.patch_all()

import json  # noqa: E402
import math  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import gevent  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))
from sim_agent import SimAgent, node_name, request  # noqa: E402
from sim_record import Record, window  # noqa: E402


class Fleet:
    """Agents that all join first, then start reporting a step at a time and report until
    ``stop``; the reporting fleet only grows."""

    def __init__(self, hosts: list[tuple[str, int]], join_token: str, period: float,
                 reports: str = "heartbeat", shared_weights: bool = False,
                 seed: int = 1) -> None:
        self.hosts, self.join_token = hosts, join_token
        self.period, self.epoch = period, time.perf_counter()
        self.heartbeats = reports == "heartbeat"
        self.shared_weights = shared_weights
        self.joined: list[SimAgent] = []
        self.agents: list[SimAgent] = []           # the ones reporting
        self.greenlets: list[gevent.Greenlet] = []
        self.record = Record()
        self.churned = {"replica": 0, "device": 0}
        self._churn: gevent.Greenlet | None = None
        random.seed(seed)
        self._marker = gevent.spawn(self._mark)

    def _mark(self) -> None:
        while True:
            self.record.marks.append((time.perf_counter(), len(self.record.sched)))
            gevent.sleep(1.0)

    def next_time(self, offset: float, after: float) -> float:
        """The first send time at or after ``after`` of an agent sending at ``offset`` (a
        fraction) of every period since the epoch."""
        p = self.period
        k = math.ceil((after - self.epoch) / p - offset)
        return self.epoch + (k + offset) * p

    def set_period(self, period: float) -> None:
        """Every agent moves to ``period`` from its next send on (its phase kept)."""
        now = time.perf_counter()
        self.epoch, self.period = now, period

    def _join(self, index: int) -> SimAgent:
        host, port = self.hosts[index % len(self.hosts)]
        body = json.dumps({"node": node_name(index)}).encode()
        status, answer = request(host, port, "POST", "/api/v1/agent/join", body,
                                 self.join_token)
        if status != 200:
            raise RuntimeError(f"join of {node_name(index)} failed: HTTP {status} {answer!r}")
        return SimAgent(self, index, json.loads(answer)["credential"])

    def join(self, total: int, concurrency: int = 8) -> None:
        """Join agents up to ``total`` (each gets its node credential)."""
        todo = list(range(len(self.joined), total))[::-1]
        joined: dict[int, SimAgent] = {}

        def worker() -> None:
            while todo:
                i = todo.pop()
                joined[i] = self._join(i)

        gevent.joinall([gevent.spawn(worker) for _ in range(concurrency)], raise_error=True)
        self.joined += [joined[i] for i in sorted(joined)]

    def grow(self, total: int, rate: float) -> float:
        """Start agents up to ``total``, at most ``rate`` new ones a second (their first
        reports are full ones), spread so that the sends stay evenly spread over the
        period; returns the seconds until the last one has started."""
        first = len(self.agents)
        self.join(total)
        new = self.joined[first:total]
        if not new:
            return 0.0
        periods = max(1, math.ceil(len(new) / rate / self.period))
        per_period = math.ceil(len(new) / periods)
        now = time.perf_counter()
        base = (now - self.epoch) / self.period
        for j, agent in enumerate(new):
            self.agents.append(agent)
            wave, slot = divmod(j, per_period)
            offset = ((slot + (wave + 0.5) / periods) / per_period) % 1.0
            start = self.epoch + (math.floor(base) + 1 + wave + offset) * self.period
            self.greenlets.append(gevent.spawn_later(max(0.0, start - now - 0.05),
                                                     agent.start, offset))
        return periods * self.period + self.period

    def churn(self, per_min: float) -> None:
        """``per_min`` of the reporting nodes change each minute, in turn an engine restart
        on a node that runs a replica and new readings of one device on any node."""
        if self._churn is not None:
            self._churn.kill()
            self._churn = None
        if per_min > 0:
            self._churn = gevent.spawn(self._churning, per_min)

    def _churning(self, per_min: float) -> None:
        turn = 0
        while True:
            gevent.sleep(60.0 / max(1e-9, per_min * len(self.agents)))
            turn += 1
            if turn % 2:
                running = [a for a in self.agents if a.assigned]
                if running and random.choice(running).restart_replica():
                    self.churned["replica"] += 1
                    continue
            random.choice(self.agents).change_device()
            self.churned["device"] += 1

    def stop(self) -> None:
        self.churn(0)
        gevent.killall(self.greenlets + [self._marker], block=True, timeout=10)
        self.greenlets.clear()
        for agent in self.agents:
            agent.stop()


def serve(lines: Any, out: Any) -> None:
    """Answer the benchmark's commands until the end of stdin."""
    fleet: Fleet | None = None

    def say(obj: dict[str, Any]) -> None:
        out.write(json.dumps(obj) + "\n")
        out.flush()

    for line in lines:
        cmd = json.loads(line)
        what = cmd.pop("cmd")
        started = time.perf_counter()
        try:
            if what == "init":
                fleet = Fleet([tuple(h) for h in cmd["hosts"]], cmd["join_token"],
                              cmd["period"], cmd.get("reports", "heartbeat"),
                              cmd.get("shared_weights", False), cmd.get("seed", 1))
                say({"ok": True})
            elif fleet is None:
                say({"ok": False, "error": "init first"})
            elif what == "join":
                fleet.join(cmd["total"])
                say({"ok": True, "took_s": time.perf_counter() - started})
            elif what == "grow":
                say({"ok": True, "spread_s": fleet.grow(cmd["total"], cmd["rate"])})
            elif what == "period":
                fleet.set_period(cmd["seconds"])
                say({"ok": True})
            elif what == "churn":
                fleet.churn(cmd["per_min"])
                say({"ok": True})
            elif what == "window":
                late = [a.inflight for a in fleet.agents if a.inflight is not None]
                say(window(fleet.record, len(fleet.hosts), late, fleet.churned,
                           cmd["start"], cmd["end"]))
            else:
                say({"ok": False, "error": f"unknown command {what!r}"})
        except Exception as exc:              # the benchmark prints it and stops
            say({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
    if fleet is not None:
        fleet.stop()


def main() -> int:
    from gevent.fileobject import FileObjectPosix

    from llmgw_runtime import gckeeper

    # 10,000 agents hold over a million long-lived objects; without the product's own
    # keeper the collector's full walks of them stopped every send for 0.3-1 s at times
    # (a window's "lateness" p99 of 500-700 ms), counted as the control plane's latency.
    gckeeper.Keeper().start()
    stdin = FileObjectPosix(sys.stdin.fileno(), "r", close=False)
    serve(stdin, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
