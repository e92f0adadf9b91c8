"""Simulated node agents for the control-service benchmark, in a process of their own.

    .venv/bin/python bench/agent_sim.py      # driven over stdin/stdout by control_bench.py

Each agent joins, then reports on a fixed schedule over its own keep-alive connection
(gevent raw sockets, ``loadgen.Conn``) to one of the control hosts (agent ``i`` to host
``i % hosts``), with eight fake A100 devices and the replicas it was assigned reported as
ready. With ``reports: heartbeat`` it speaks the heartbeat protocol as the real agent does
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

import hashlib  # noqa: E402
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
import loadgen  # noqa: E402
from sim_record import Record, window  # noqa: E402

from llmgw_runtime.api.agent import FULL_REPORT_EVERY_S  # noqa: E402

CLASS = "a100-80g"
GPUS = 8
REPORT = "/api/v1/agent/report"
HEARTBEAT = "/api/v1/agent/heartbeat"


def request(host: str, port: int, method: str, path: str, body: bytes, token: str,
            content_type: str = "application/json") -> tuple[int, bytes]:
    """One request on a fresh connection (join, catalog, listings)."""
    head = (f"{method} {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Authorization: Bearer {token}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    conn = loadgen.Conn(host, port)
    try:
        return conn.roundtrip(head.encode() + body)
    finally:
        conn.close()


def fake_devices(index: int) -> list[dict[str, Any]]:
    """What an 8 x A100-80GB node's discovery reports (Device.to_dict's fields)."""
    return [{"id": i, "uuid": f"GPU-{index:08x}-0000-4000-8000-{i:012x}", "card": i,
             "mig": None, "class": CLASS, "memory_total_mb": 81920, "memory_used_mb": 0,
             "processes": [], "temperature_c": 34, "power_w": 61.5, "utilization_pct": 0,
             "healthy": True, "reason": None, "gpu_instance": None,
             "compute_instance": None, "profile": None} for i in range(GPUS)]


def fake_cards(index: int) -> list[dict[str, Any]]:
    return [{"index": i, "uuid": f"GPU-{index:08x}-0000-4000-8000-{i:012x}",
             "name": "NVIDIA A100-SXM4-80GB", "klass": CLASS, "mig_current": False,
             "mig_pending": False, "instances": 0, "problem": None, "hint": None}
            for i in range(GPUS)]


def node_name(index: int) -> str:
    return f"node-{index:05d}"


class SimAgent:
    def __init__(self, fleet: Fleet, index: int, credential: str) -> None:
        self.fleet, self.index = fleet, index
        self.host_index = index % len(fleet.hosts)
        self.host, self.port = fleet.hosts[self.host_index]
        self.name = node_name(index)
        self.credential = credential
        self.devices = fake_devices(index)
        self.cards = fake_cards(index)
        self.assigned: dict[str, dict[str, Any]] = {}    # replica id -> assignment
        self.ports: dict[str, int] = {}
        self.pids: dict[str, int] = {}
        self.restarting: dict[str, int] = {}            # replica id -> reports as starting
        self.sources: list[str] = []                    # the catalog's, from the answers
        self.sources_hash = ""
        self.conn: loadgen.Conn | None = None
        self.inflight: float | None = None              # scheduled time of the open request
        self._body: dict[str, Any] | None = None
        self._full: bytes | None = None                 # the full report's request bytes
        self._full_raw = b""                            # and its JSON body
        self._last_answer = b""                         # the last report answer's bytes
        self._last_beat_answer = b""
        # the heartbeat protocol's state
        self.digest: str | None = None                  # of the last full report sent
        self.sent_static: str | None = None             # its parts besides replicas/devices
        self.sent_replicas: Any = None
        self.sent_devices: Any = None
        self.full_due = 0.0
        # The first periodic full report comes this long after a full report, the next
        # ones every FULL_REPORT_EVERY_S: a short run sees the steady share of them.
        self.first_due = random.uniform(0, FULL_REPORT_EVERY_S)
        self.periodic = False
        self.carried: set[str] = set()                  # in every heartbeat until a full one
        self._beat: bytes | None = None
        self._beat_keys: list[str] = []

    # ---------------------------------------------------------------- what it says

    def changed(self) -> None:
        self._body = self._full = self._beat = None

    def body(self) -> dict[str, Any]:
        if self._body is not None:
            return self._body
        devices = [dict(d) for d in self.devices]
        replicas = []
        for rid, a in self.assigned.items():
            port = self.ports.setdefault(rid, 20000 + len(self.ports))
            pid = self.pids.setdefault(rid, 100000 + port)
            for dev_id in a.get("devices", []):
                if 0 <= dev_id < GPUS:
                    devices[dev_id].update(memory_used_mb=72000, utilization_pct=35, processes=[
                        {"pid": pid, "name": "python3", "used_memory_mb": 72000,
                         "type": "C"}])
            state = "starting" if self.restarting.get(rid) else "ready"
            replicas.append({"id": rid, "model": a.get("model"), "state": state,
                             "port": port, "pid": pid, "last_error": None})
        self._body = {
            "node": self.name, "address": f"10.{self.index >> 16 & 255}."
            f"{self.index >> 8 & 255}.{self.index & 255}", "agent_version": "0.1.0",
            "fabric": "ib-0", "devices": devices, "device_problems": [],
            "device_source": "nvml", "driver_version": "550.54.15", "cards": self.cards,
            "engines": ["llama.cpp", "vllm"], "replicas": replicas, "weights": self.weights(),
            "sources_hash": self.sources_hash}
        return self._body

    def weights(self) -> dict[str, Any]:
        """What the agent's weights scan finds: on a local disk the weights of the models it
        runs; on shared storage (NFS) every source of the catalog."""
        shared = self.fleet.shared_weights
        found = self.sources if shared else [a["source"] for a in self.assigned.values()]
        return {"dirs": [{"path": "/srv/models", "fstype": "nfs4" if shared else "ext4",
                          "shared": shared, "exists": True}],
                "sources": {src: {"path": "/srv/models/" + src.split("://", 1)[-1],
                                  "shared": shared} for src in found}}

    def full_request(self) -> bytes:
        if self._full is None:
            raw = json.dumps(self.body()).encode()
            self._full = loadgen.build_request(self.host, self.port, REPORT, raw,
                                               self.credential)
            self._full_raw = raw
        return self._full

    def _static(self) -> str:
        body = self.body()
        return json.dumps({k: v for k, v in body.items() if k not in ("replicas", "devices")})

    def heartbeat_request(self, now: float) -> bytes | None:
        """The heartbeat to send, or None when a full report is due. As the real agent
        (agent/loop.py): the replicas and the devices when they differ from the last full
        report, and from then on in every heartbeat until the next full report."""
        if self.digest is None:
            return None
        if now >= self.full_due:
            self.periodic = True             # from now on every FULL_REPORT_EVERY_S
            return None
        if self._beat is None:
            body = self.body()
            if self._static() != self.sent_static:
                return None
            beat: dict[str, Any] = {"node": self.name, "digest": self.digest}
            if "replicas" in self.carried or body["replicas"] != self.sent_replicas:
                beat["replicas"] = body["replicas"]
            if "devices" in self.carried or body["devices"] != self.sent_devices:
                beat["devices"] = body["devices"]
            self._beat_keys = [k for k in ("replicas", "devices") if k in beat]
            self._beat = loadgen.build_request(self.host, self.port, HEARTBEAT,
                                               json.dumps(beat).encode(), self.credential)
        return self._beat

    def sent_full(self, now: float) -> None:
        body = self.body()
        self.digest = hashlib.sha256(self._full_raw).hexdigest()
        self.sent_static = self._static()
        self.sent_replicas, self.sent_devices = body["replicas"], body["devices"]
        self.carried = set()
        self.full_due = now + (FULL_REPORT_EVERY_S if self.periodic else self.first_due)
        self._beat = None

    def sent_beat(self) -> None:
        self.carried.update(self._beat_keys)

    def absorb(self, data: dict[str, Any]) -> None:
        """Run what the answer assigns (as ready at once); drop what it no longer lists."""
        if data.get("sources") is not None:
            if (data["sources"], data.get("sources_hash", "")) != (self.sources,
                                                                    self.sources_hash):
                self.sources, self.sources_hash = data["sources"], data.get("sources_hash", "")
                self.changed()
        assigned = {a["replica_id"]: a for a in data["assignments"]}
        if assigned.keys() != self.assigned.keys():
            self.assigned = assigned
            self.changed()

    # ---------------------------------------------------------------- churn

    def restart_replica(self) -> bool:
        """An engine restarts: one replica reported starting (a new pid) once, then ready."""
        if not self.assigned:
            return False
        rid = random.choice(sorted(self.assigned))
        self.pids[rid] = self.pids.get(rid, 100000) + 1
        self.restarting[rid] = 1
        self.changed()
        return True

    def change_device(self) -> None:
        """New readings of one device (temperature, power, utilization)."""
        dev = self.devices[random.randrange(GPUS)]
        dev["temperature_c"] = 30 + random.randrange(40)
        dev["power_w"] = round(60 + random.random() * 300, 1)
        dev["utilization_pct"] = random.randrange(101)
        self.changed()

    # ---------------------------------------------------------------- sending

    def roundtrip(self, request: bytes) -> tuple[int, bytes]:
        record = self.fleet.record
        for attempt in (0, 1):
            fresh = self.conn is None
            if self.conn is None:
                self.conn = loadgen.Conn(self.host, self.port)
            try:
                return self.conn.roundtrip(request)
            except OSError:
                self.conn.close()
                self.conn = None
                if fresh or attempt:
                    raise
                record.reconnects += 1      # a kept-alive connection the server closed
        raise AssertionError("unreachable")

    def send(self) -> tuple[int, int]:
        """One report or heartbeat (and the full report a heartbeat's answer asks for),
        whose answer it then follows; returns the HTTP status and the kind of exchange."""
        now = time.perf_counter()
        beat = self.heartbeat_request(now) if self.fleet.heartbeats else None
        if beat is not None:
            status, answer = self.roundtrip(beat)
            if status != 200:
                return status, 1
            if answer == self._last_beat_answer:      # the same answer: nothing to do
                self.sent_beat()
                return status, 1
            data = json.loads(answer)
            if not data.get("full_report"):
                self._last_beat_answer = answer
                self.sent_beat()
                if data.get("answer") is not None:
                    self.absorb(data["answer"])
                return status, 1
            self.digest = None              # the control service does not hold it
        status, answer = self.roundtrip(self.full_request())
        if status == 200:
            self.sent_full(now)
            if answer != self._last_answer:
                self._last_answer, self._last_beat_answer = answer, b""
                self.absorb(json.loads(answer))
        return status, 0 if beat is None else 2

    def run(self, offset: float) -> None:
        """Report at ``offset`` of the fleet's period, every period (it may change)."""
        fleet, record = self.fleet, self.fleet.record
        sched = fleet.next_time(offset, time.perf_counter())
        try:
            while True:
                delay = sched - time.perf_counter()
                if delay > 0:
                    gevent.sleep(delay)
                self.inflight = sched
                carried = [rid for rid, left in self.restarting.items() if left]
                began = time.perf_counter()     # later than sched: this process was busy
                try:
                    status, kind = self.send()
                except (OSError, ValueError) as exc:
                    record.add(sched, None, 0, self.host_index, type(exc).__name__)
                else:
                    if status == 200:
                        record.add(sched, time.perf_counter() - sched, kind, self.host_index,
                                   lag=began - sched)
                        self._done_restart(carried)
                    else:
                        record.add(sched, None, kind, self.host_index, f"HTTP {status}")
                self.inflight = None
                # The next slot after now: an answer that came after the next slot skips
                # the slots it missed (as the real agent reports once per interval), so a
                # server behind shows as a rate under the target, not a growing backlog.
                sched = fleet.next_time(offset, max(sched + 1e-6, time.perf_counter()))
        finally:
            if self.conn is not None:
                self.conn.close()
                self.conn = None

    def _done_restart(self, carried: list[str]) -> None:
        """The restarted replicas this send said were starting are ready from now on."""
        for rid in carried:
            self.restarting.pop(rid, None)
        if carried:
            self.changed()


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
                                                     agent.run, offset))
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
