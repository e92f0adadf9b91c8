"""What a node should run: the answer to its report.

A single-node replica is one assignment on its node. A multi-node replica is an assignment
per node: the head (rank 0, the replica's own id, serves HTTP) and a worker per other node
(id ``<replica id>.w<rank>``); every part learns the replica's rendezvous port and its
peers' addresses, which the engine driver turns into the engine's own flags.
"""

from __future__ import annotations

import json
from typing import Any

from ..api.agent import Assignment, DeviceReport
from ..fleetvocab import CPU_CLASS
from ..store import repo
from ..store.models import row_to_spec
from .rollout import launch_fields

PART_SEP = ".w"


def part_id(replica_id: str, rank: int) -> str:
    return f"{replica_id}{PART_SEP}{rank}"


def _devices(ids: list[int], reported: list[DeviceReport]) -> dict[str, Any]:
    by_id = {d.id: d for d in reported}
    chosen = [by_id[i] for i in ids if i in by_id]
    if any(d.klass == CPU_CLASS for d in chosen) or not chosen:
        kind = "cpu"
    else:
        kind = "mig" if any(d.mig is not None for d in chosen) else "gpu"
    return {"devices": ids, "device_uuids": [d.uuid for d in chosen], "device_kind": kind}


def _base(replica_id: str, replica: Any, model: Any, ids: list[int],
          reported: list[DeviceReport]) -> dict[str, Any]:
    """The launch of a replica (or part): the definition it was placed with
    (``replicas.launch``, so an old one keeps its own through a rollout and an agent
    restart), else its model's current one."""
    launch = _launch(replica) or json.loads(launch_fields(row_to_spec(model)))
    profile = launch.get("profile") or {}
    out = {"replica_id": replica_id, "model": model.name, "engine": launch["engine"],
           "source": launch["source"], "sha256": launch.get("sha256"),
           "size_bytes": launch.get("size_bytes"), "args": list(launch.get("args") or []),
           "profile": {k: profile.get(k, 1) for k in ("gpus", "tp", "pp", "nodes")},
           **_devices(ids, reported)}
    if launch.get("slots") is not None:     # the catalog's: the driver sets the engine's flag
        out["slots"] = launch["slots"]
    return out


def _launch(replica: Any) -> dict[str, Any] | None:
    text = getattr(replica, "launch", None)
    try:
        value = json.loads(text) if text else None
    except ValueError:
        return None
    return value if isinstance(value, dict) and "engine" in value and "source" in value \
        else None


class _Addresses:
    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.cache: dict[str, str | None] = {}

    def __call__(self, node: str) -> str | None:
        if node not in self.cache:
            row = repo.get_node(self.conn, node)
            self.cache[node] = row.address if row is not None else None
        return self.cache[node]


def _peers(head: Any, parts: list[Any], address: _Addresses) -> list[dict[str, Any]]:
    return [{"rank": 0, "node": head.node, "address": address(head.node)}] + [
        {"rank": p.rank, "node": p.node, "address": address(p.node)} for p in parts]


def _multi(head: Any, parts: list[Any], rank: int, address: _Addresses) -> dict[str, Any]:
    return {"role": "head" if rank == 0 else "worker", "rank": rank,
            "nodes": 1 + len(parts), "rendezvous_port": head.rendezvous_port,
            "head_address": address(head.node), "peers": _peers(head, parts, address)}


def assignments_for(conn: Any, reported: list[DeviceReport], *, heads: list[Any],
                    parts: list[Any]) -> list[Assignment]:
    """Every replica and worker part a node should run, for its agent (docs/api.md), from
    the rows of the replicas it heads and the parts it runs (read once per report) and
    the devices it reported."""
    heads = [r for r in heads if r.desired and r.state != "failed"]
    my_parts = [p for p in parts if p.state != "failed"]
    part_heads = {rid: repo.get_replica(conn, rid) for rid in {p.replica_id for p in my_parts}}
    names = {r.model for r in heads} | {r.model for r in part_heads.values() if r is not None}
    models = repo.models_named(conn, names)
    multi = {r.id for r in heads if r.rendezvous_port is not None} | set(part_heads)
    all_parts = repo.parts_of(conn, sorted(multi))
    address = _Addresses(conn)
    out = []
    for row in heads:
        model = models.get(row.model)
        if model is None:
            continue
        item = _base(row.id, row, model, json.loads(row.devices), reported)
        parts = all_parts.get(row.id, [])
        if parts:
            item.update(_multi(row, parts, 0, address))
        out.append(item)
    for part in my_parts:
        head = part_heads.get(part.replica_id)
        model = models.get(head.model) if head is not None else None
        if head is None or model is None or not head.desired or head.state == "failed":
            continue
        item = _base(part_id(head.id, part.rank), head, model, json.loads(part.devices),
                     reported)
        item.update(_multi(head, all_parts.get(head.id, []), part.rank, address))
        item["replica"] = head.id
        out.append(item)
    return [Assignment(**item) for item in out]


def devices_key(reported: list[DeviceReport]) -> tuple[Any, ...]:
    """What an assignment takes from a report's devices (``_devices``)."""
    return tuple((d.id, d.uuid, d.klass, d.mig is not None) for d in reported)
