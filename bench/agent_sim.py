"""Simulated node agents for the control-service benchmark: each joins, then reports on a
fixed schedule over its own keep-alive connection (gevent raw sockets, ``loadgen.Conn``),
with eight fake A100 devices and the replicas it was assigned reported as ready.

Open loop: agent ``i`` of ``n`` sends at ``t0 + i/n * period + k * period``; latency is
measured from that scheduled time, so time spent queued behind a slow server counts.
Import it only in a gevent-patched process."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import gevent
import loadgen

CLASS = "a100-80g"
GPUS = 8
REPORT = "/api/v1/agent/report"


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


@dataclass
class Sample:
    sched: float                  # scheduled send time (perf_counter)
    latency: float | None         # seconds from the scheduled time to the whole answer
    error: str | None = None


@dataclass
class Record:
    samples: list[Sample] = field(default_factory=list)
    reconnects: int = 0


class SimAgent:
    def __init__(self, host: str, port: int, index: int, credential: str,
                 shared_weights: bool = False) -> None:
        self.host, self.port, self.index = host, port, index
        self.shared_weights = shared_weights
        self.name = node_name(index)
        self.credential = credential
        self.devices = fake_devices(index)
        self.cards = fake_cards(index)
        self.assigned: dict[str, dict[str, Any]] = {}    # replica id -> assignment
        self.ports: dict[str, int] = {}
        self.sources: list[str] = []                    # the catalog's, from the answers
        self.sources_hash = ""
        self.conn: loadgen.Conn | None = None
        self.inflight: float | None = None              # scheduled time of the open request
        self._request: bytes | None = None
        self._last_answer = b""

    def body(self) -> dict[str, Any]:
        devices = [dict(d) for d in self.devices]
        replicas = []
        for rid, a in self.assigned.items():
            port = self.ports.setdefault(rid, 20000 + len(self.ports))
            pid = 100000 + port
            for dev_id in a.get("devices", []):
                if 0 <= dev_id < GPUS:
                    devices[dev_id].update(memory_used_mb=72000, utilization_pct=35, processes=[
                        {"pid": pid, "name": "python3", "used_memory_mb": 72000,
                         "type": "C"}])
            replicas.append({"id": rid, "model": a.get("model"), "state": "ready",
                             "port": port, "pid": pid, "last_error": None})
        return {"node": self.name, "address": f"10.{self.index >> 16 & 255}."
                f"{self.index >> 8 & 255}.{self.index & 255}", "agent_version": "0.1.0",
                "fabric": "ib-0", "devices": devices, "device_problems": [],
                "device_source": "nvml", "driver_version": "550.54.15", "cards": self.cards,
                "engines": ["llama.cpp", "vllm"], "replicas": replicas,
                "weights": self.weights(), "sources_hash": self.sources_hash}

    def weights(self) -> dict[str, Any]:
        """What the agent's weights scan finds: on a local disk the weights of the models it
        runs; on shared storage (NFS) every source of the catalog."""
        shared = self.shared_weights
        found = self.sources if shared else [a["source"] for a in self.assigned.values()]
        return {"dirs": [{"path": "/srv/models", "fstype": "nfs4" if shared else "ext4",
                          "shared": shared, "exists": True}],
                "sources": {src: {"path": "/srv/models/" + src.split("://", 1)[-1],
                                  "shared": shared} for src in found}}

    def request(self) -> bytes:
        if self._request is None:
            self._request = loadgen.build_request(
                self.host, self.port, REPORT, json.dumps(self.body()).encode(), self.credential)
        return self._request

    def absorb(self, answer: bytes) -> None:
        """Run what the answer assigns (as ready at once); drop what it no longer lists."""
        if answer == self._last_answer:
            return
        self._last_answer = answer
        data = json.loads(answer)
        if "sources" in data:
            self.sources, self.sources_hash = data["sources"], data.get("sources_hash", "")
            self._request = None
        assigned = {a["replica_id"]: a for a in data["assignments"]}
        if assigned.keys() != self.assigned.keys():
            self.assigned = assigned
            self._request = None

    def roundtrip(self, record: Record) -> tuple[int, bytes]:
        for attempt in (0, 1):
            fresh = self.conn is None
            if self.conn is None:
                self.conn = loadgen.Conn(self.host, self.port)
            try:
                return self.conn.roundtrip(self.request())
            except OSError:
                self.conn.close()
                self.conn = None
                if fresh or attempt:
                    raise
                record.reconnects += 1      # a kept-alive connection the server closed
        raise AssertionError("unreachable")

    def run(self, t0: float, period: float, record: Record) -> None:
        sched = t0
        try:
            while True:
                delay = sched - time.perf_counter()
                if delay > 0:
                    gevent.sleep(delay)
                self.inflight = sched
                try:
                    status, answer = self.roundtrip(record)
                except OSError as exc:
                    record.samples.append(Sample(sched, None, type(exc).__name__))
                else:
                    latency = time.perf_counter() - sched
                    if status == 200:
                        record.samples.append(Sample(sched, latency))
                        self.absorb(answer)
                    else:
                        record.samples.append(Sample(sched, None, f"HTTP {status}"))
                self.inflight = None
                sched += period
        finally:
            if self.conn is not None:
                self.conn.close()
                self.conn = None


def node_name(index: int) -> str:
    return f"node-{index:05d}"


class Fleet:
    """Agents that all join first (on an idle server), then start reporting a step at a
    time and report until ``stop``; the reporting fleet only grows."""

    def __init__(self, host: str, port: int, join_token: str, period: float,
                 shared_weights: bool = False) -> None:
        self.host, self.port, self.join_token, self.period = host, port, join_token, period
        self.shared_weights = shared_weights
        self.joined: list[SimAgent] = []
        self.agents: list[SimAgent] = []           # the ones reporting
        self.greenlets: list[gevent.Greenlet] = []
        self.record = Record()

    def _join(self, index: int) -> SimAgent:
        body = json.dumps({"node": node_name(index)}).encode()
        status, answer = request(self.host, self.port, "POST", "/api/v1/agent/join", body,
                                 self.join_token)
        if status != 200:
            raise RuntimeError(f"join of {node_name(index)} failed: HTTP {status} {answer!r}")
        return SimAgent(self.host, self.port, index, json.loads(answer)["credential"],
                        self.shared_weights)

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

    def grow(self, total: int) -> None:
        """Start agents up to ``total``; the new ones spread evenly over one period, as the
        running ones are, so the sends stay evenly spread."""
        first = len(self.agents)
        self.join(total)
        now, new = time.perf_counter(), self.joined[first:total]
        for j, agent in enumerate(new):
            self.agents.append(agent)
            t0 = now + (j + 0.5) * self.period / len(new)
            self.greenlets.append(gevent.spawn(agent.run, t0, self.period, self.record))

    def stop(self) -> None:
        gevent.killall(self.greenlets, block=True, timeout=10)
        self.greenlets.clear()


@dataclass
class Window:
    start: float
    end: float
    ok: int
    latencies: list[float]
    errors: dict[str, int]
    late: int                      # scheduled in the window, still unanswered at the end

    @property
    def rate(self) -> float:
        return self.ok / (self.end - self.start)

    def pct(self, p: float) -> float:
        xs = sorted(self.latencies)
        return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] if xs else float("nan")


def window(fleet: Fleet, start: float, end: float) -> Window:
    lat: list[float] = []
    errors: dict[str, int] = {}
    for s in fleet.record.samples:
        if start <= s.sched < end:
            if s.latency is not None:
                lat.append(s.latency)
            else:
                errors[s.error or "?"] = errors.get(s.error or "?", 0) + 1
    late = sum(1 for a in fleet.agents if a.inflight is not None and start <= a.inflight < end)
    return Window(start, end, len(lat), lat, errors, late)
