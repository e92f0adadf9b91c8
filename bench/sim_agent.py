"""One simulated node agent of bench/agent_sim.py: what it reports (eight fake A100
devices, the replicas it was assigned, ready), the heartbeat protocol as ``llmgw agent``
speaks it, and its sends, driven by the gevent loop's watchers (``sim_wire``). Import it
only in a gevent-patched process."""

from __future__ import annotations

import hashlib
import json
import random
import time
from typing import Any

import loadgen
import sim_wire

from llmgw_runtime.api.agent import FULL_REPORT_EVERY_S

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
    def __init__(self, fleet: Any, index: int, credential: str) -> None:
        """``fleet``: agent_sim.Fleet (its hosts, period, record and protocol)."""
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
        self.wire = sim_wire.Wire(self.host, self.port)
        self.inflight: float | None = None              # scheduled time of the open request
        self.offset = self.sched = self._began = 0.0
        self.timer: Any = None
        self.stopped = False
        self._carried: list[str] = []
        self._sent_beat: bytes | None = None
        self._request = b""
        self._then: sim_wire.Answer | None = None
        self._retried = False
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

    def start(self, offset: float) -> None:
        """Report at ``offset`` of the fleet's period, every period (it may change), until
        :meth:`stop`: each send is a timer's callback and each answer a readable socket's
        (``sim_wire``), with no greenlet of its own."""
        self.offset = offset
        self._arm(self.fleet.next_time(offset, time.perf_counter()))

    def stop(self) -> None:
        self.stopped = True
        if self.timer is not None:
            self.timer.stop()
        self.wire.close()

    def _arm(self, sched: float) -> None:
        self.sched = sched
        self.timer = sim_wire.at(sched, self._fire)

    def _fire(self) -> None:
        """One report or heartbeat (and the full report a heartbeat's answer asks for)."""
        if self.stopped:
            return
        self.inflight = self.sched
        self._carried = [rid for rid, left in self.restarting.items() if left]
        self._began = now = time.perf_counter()     # later than sched: this process was busy
        self._sent_beat = beat = self.heartbeat_request(now) if self.fleet.heartbeats else None
        if beat is not None:
            self._go(beat, self._beat_answer)
        else:
            self._go(self.full_request(), self._full_answer)

    def _go(self, request: bytes, then: sim_wire.Answer) -> None:
        self._request, self._then, self._retried = request, then, False
        self.wire.exchange(request, then, self._failed)

    def _failed(self, exc: BaseException, reused: bool) -> None:
        if reused and not self._retried and not self.stopped:
            self._retried = True
            self.fleet.record.reconnects += 1   # a kept-alive connection the server closed
            self.wire.exchange(self._request, self._then, self._failed)
            return
        self.fleet.record.add(self.sched, None, 0, self.host_index, type(exc).__name__)
        self._next()

    def _beat_answer(self, status: int, answer: bytes) -> None:
        try:
            if status != 200 or answer == self._last_beat_answer:   # the same: nothing to do
                if status == 200:
                    self.sent_beat()
                self._done(status, 1)
                return
            data = json.loads(answer)
            if not data.get("full_report"):
                self._last_beat_answer = answer
                self.sent_beat()
                if data.get("answer") is not None:
                    self.absorb(data["answer"])
                self._done(status, 1)
                return
        except ValueError as exc:
            self._failed(exc, False)
            return
        self.digest = None              # the control service does not hold it
        self._go(self.full_request(), self._full_answer)

    def _full_answer(self, status: int, answer: bytes) -> None:
        try:
            if status == 200:
                self.sent_full(self._began)
                if answer != self._last_answer:
                    self._last_answer, self._last_beat_answer = answer, b""
                    self.absorb(json.loads(answer))
        except ValueError as exc:
            self._failed(exc, False)
            return
        self._done(status, 0 if self._sent_beat is None else 2)

    def _done(self, status: int, kind: int) -> None:
        record = self.fleet.record
        if status == 200:
            record.add(self.sched, time.perf_counter() - self.sched, kind, self.host_index,
                       lag=self._began - self.sched)
            self._done_restart(self._carried)
        else:
            record.add(self.sched, None, kind, self.host_index, f"HTTP {status}")
        self._next()

    def _next(self) -> None:
        """The next slot after now: an answer that came after the next slot skips the slots
        it missed (as the real agent reports once per interval), so a server behind shows
        as a rate under the target, not a growing backlog."""
        self.inflight = None
        if not self.stopped:
            self._arm(self.fleet.next_time(self.offset,
                                           max(self.sched + 1e-6, time.perf_counter())))

    def _done_restart(self, carried: list[str]) -> None:
        """The restarted replicas this send said were starting are ready from now on."""
        for rid in carried:
            self.restarting.pop(rid, None)
        if carried:
            self.changed()
