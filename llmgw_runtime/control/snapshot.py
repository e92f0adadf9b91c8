"""Reading the store into the pure placement snapshot."""

from __future__ import annotations

import json
from typing import Any

from ..catalog import spec_from_row
from ..placement import DeviceView, ModelView, NodeView, ReplicaView, Snapshot
from .states import in_backoff, wanted_replicas


def device_views(devices_json: str) -> tuple[DeviceView, ...]:
    out = []
    for dev in json.loads(devices_json):
        out.append(DeviceView(id=int(dev["id"]), klass=str(dev["class"]),
                              memory_total_mb=int(dev.get("memory_total_mb") or 0),
                              memory_used_mb=int(dev.get("memory_used_mb") or 0),
                              healthy=bool(dev.get("healthy", True))))
    return tuple(out)


def build(models: list[Any], nodes: list[Any], replicas: list[Any], now: float,
          node_timeout_s: float) -> Snapshot:
    by_model: dict[str, list[Any]] = {}
    for rep in replicas:
        by_model.setdefault(rep.model, []).append(rep)
    model_views = tuple(
        ModelView(spec=spec_from_row(m),
                  wanted=wanted_replicas(m, by_model.get(m.name, []), now),
                  parked=bool(m.parked),
                  hold_starts=in_backoff(m.consecutive_failures, m.last_failure_at, now))
        for m in models)
    node_views = tuple(
        NodeView(name=n.name, devices=device_views(n.devices),
                 engines=tuple(json.loads(n.engines)), last_report=n.last_report,
                 fabric=n.fabric)
        for n in nodes)
    replica_views = tuple(
        ReplicaView(id=r.id, model=r.model, node=r.node,
                    devices=tuple(json.loads(r.devices)), state=r.state, started=r.started,
                    desired=bool(r.desired))
        for r in replicas)
    return Snapshot(models=model_views, nodes=node_views, replicas=replica_views, now=now,
                    node_timeout_s=node_timeout_s)
