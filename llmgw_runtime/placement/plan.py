"""The first placement function: single-node replicas by device class and free memory.

Pure: a snapshot in, a plan out; no I/O and no clock (``now`` is in the snapshot). The fleet
planner (multi-node, fabrics, weights locality, spread) grows from this interface.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from ..catalog import ModelSpec, is_mig_class

ACTIVE = ("pending", "starting", "ready")
CPU_CLASS = "cpu"


@dataclass(frozen=True)
class DeviceView:
    id: int
    klass: str
    memory_total_mb: int
    memory_used_mb: int = 0
    healthy: bool = True


@dataclass(frozen=True)
class NodeView:
    name: str
    devices: tuple[DeviceView, ...]
    engines: tuple[str, ...]
    last_report: float | None
    fabric: str | None = None


@dataclass(frozen=True)
class ReplicaView:
    id: str
    model: str
    node: str
    devices: tuple[int, ...]
    state: str
    started: float
    desired: bool = True


@dataclass(frozen=True)
class ModelView:
    spec: ModelSpec
    wanted: int                 # replicas the model should have now
    parked: bool = False
    hold_starts: bool = False   # in backoff after a failure: start nothing new yet


@dataclass(frozen=True)
class Snapshot:
    models: tuple[ModelView, ...]
    nodes: tuple[NodeView, ...]
    replicas: tuple[ReplicaView, ...]
    now: float
    node_timeout_s: float = 30.0


@dataclass(frozen=True)
class Start:
    model: str
    node: str
    devices: tuple[int, ...]


@dataclass
class Plan:
    starts: list[Start] = field(default_factory=list)
    stops: list[str] = field(default_factory=list)          # replica ids
    unplaceable: dict[str, str] = field(default_factory=dict)  # model -> reason


def _alive(node: NodeView, snap: Snapshot) -> bool:
    return node.last_report is not None and snap.now - node.last_report <= snap.node_timeout_s


class _Capacity:
    """Free memory per (node, device), updated as the plan takes devices."""

    def __init__(self, snap: Snapshot, specs: dict[str, ModelSpec]) -> None:
        self.nodes = {n.name: n for n in snap.nodes if _alive(n, snap)}
        self.free: dict[tuple[str, int], float] = {}
        self.exclusive: set[tuple[str, int]] = set()
        self.used_by: dict[tuple[str, int], int] = {}
        for node in self.nodes.values():
            for dev in node.devices:
                if dev.healthy:
                    self.free[(node.name, dev.id)] = (
                        dev.memory_total_mb - dev.memory_used_mb) / 1024.0
        for rep in snap.replicas:
            spec = specs.get(rep.model)
            if rep.state not in ACTIVE or not rep.desired:
                continue
            for dev_id in rep.devices:
                self._take(rep.node, dev_id, spec, counted=rep.state == "ready")
                self.used_by[(rep.node, dev_id)] = self.used_by.get((rep.node, dev_id), 0) + 1

    def _take(self, node: str, dev_id: int, spec: ModelSpec | None, counted: bool) -> None:
        key = (node, dev_id)
        if key not in self.free:
            return
        memory = spec.profile.memory_gb if spec else None
        if memory is None:
            if spec is None or spec.profile.klass != CPU_CLASS:
                self.exclusive.add(key)
        elif not counted:   # a ready engine's memory already shows in memory_used
            self.free[key] -= memory

    def candidates(self, spec: ModelSpec) -> tuple[list[tuple[str, tuple[int, ...]]], str]:
        """Device sets that fit ``spec``, best fit first, or why there are none."""
        klass, need = spec.profile.klass, spec.profile.memory_gb
        exclusive = need is None and klass != CPU_CLASS
        of_class = [(n, d) for n in self.nodes.values() for d in n.devices
                    if d.klass == klass]
        if not of_class:
            seen = sorted({d.klass for n in self.nodes.values() for d in n.devices})
            return [], (f"no reporting node has a device of class {klass}"
                        + (f" (classes seen: {', '.join(seen)})" if seen else
                           " (no node is reporting)"))
        with_engine = [(n, d) for n, d in of_class if spec.engine in n.engines]
        if not with_engine:
            return [], f"no node with class {klass} has the {spec.engine} engine installed"
        healthy = [(n, d) for n, d in with_engine if (n.name, d.id) in self.free]
        if not healthy:
            return [], f"every {klass} device is unhealthy"
        usable = [(n, d) for n, d in healthy if (n.name, d.id) not in self.exclusive
                  and not (exclusive and self._shared(n.name, d.id))
                  and (need is None or self.free[(n.name, d.id)] >= need)]
        by_node: dict[str, list[DeviceView]] = {}
        for node, dev in usable:
            by_node.setdefault(node.name, []).append(dev)
        out = []
        for node_name, devs in by_node.items():
            if len(devs) >= spec.profile.gpus:
                devs.sort(key=lambda d: (self.free[(node_name, d.id)], d.id))
                chosen = devs[: spec.profile.gpus]
                out.append((node_name, tuple(d.id for d in chosen)))
        if out:
            out.sort(key=lambda c: (sum(self.free[(c[0], i)] for i in c[1]), c[0], c[1]))
            return out, ""
        largest = max(self.free[(n.name, d.id)] for n, d in healthy)
        if need is not None and spec.profile.gpus == 1:
            return [], (f"no {klass} device has {need:g} GB free "
                        f"(largest free: {largest:.1f} GB)")
        return [], (f"no node has {spec.profile.gpus} free {klass} device(s)"
                    + (f" with {need:g} GB each" if need is not None else ""))

    def _shared(self, node: str, dev_id: int) -> bool:
        return self.used_by.get((node, dev_id), 0) > 0

    def take(self, node: str, devices: Iterable[int], spec: ModelSpec) -> None:
        for dev_id in devices:
            self._take(node, dev_id, spec, counted=False)
            self.used_by[(node, dev_id)] = self.used_by.get((node, dev_id), 0) + 1


def place(snap: Snapshot) -> Plan:
    """Decide which replicas to start and stop, and why a model cannot be placed."""
    plan = Plan()
    specs = {m.spec.name: m.spec for m in snap.models}
    cap = _Capacity(snap, specs)
    by_model: dict[str, list[ReplicaView]] = {}
    for rep in snap.replicas:
        if rep.desired and rep.state in ACTIVE:
            by_model.setdefault(rep.model, []).append(rep)
    for rep in snap.replicas:
        if rep.desired and rep.model not in specs:
            plan.stops.append(rep.id)       # its model left the catalog
    for model in sorted(snap.models, key=lambda m: m.spec.name):
        spec = model.spec
        active = by_model.get(spec.name, [])
        wanted = 0 if model.parked else model.wanted
        if len(active) > wanted:
            # Stop the least useful first: not ready before ready, newest first.
            extra = sorted(active, key=lambda r: (r.state == "ready", -r.started))
            plan.stops.extend(r.id for r in extra[: len(active) - wanted])
            continue
        if model.parked or model.hold_starts:
            continue
        if spec.profile.nodes > 1:
            if len(active) < wanted:
                plan.unplaceable[spec.name] = (
                    f"profile.nodes is {spec.profile.nodes}: multi-node replicas are placed by "
                    "the fleet planner, which this version does not have yet")
            continue
        if is_mig_class(spec.profile.klass) and spec.profile.gpus != 1:
            plan.unplaceable[spec.name] = ("a MIG class runs on exactly one instance; "
                                           "set profile.gpus to 1")
            continue
        for _ in range(wanted - len(active)):
            options, reason = cap.candidates(spec)
            if not options:
                plan.unplaceable[spec.name] = reason
                break
            node, devices = options[0]
            cap.take(node, devices, spec)
            plan.starts.append(Start(model=spec.name, node=node, devices=devices))
    return plan
