"""Pure helpers for ``llmgw ctl plan`` and ``ctl status``: what the planner sees, in counts.

They read the same snapshot and the same capacity rules as the planner, so the numbers an
operator reads are the numbers placement decides with.
"""

from __future__ import annotations

from .capacity import Capacity
from .model import Snapshot

NO_FABRIC = "(none)"


def counts_by_class(snap: Snapshot) -> dict[str, dict[str, int]]:
    """Per device class, devices of reporting nodes: total, free, used, unhealthy.

    Free: healthy and not used by an active replica or part (a node held whole by a
    multi-node replica has none free). Unhealthy devices are neither used nor free. MIG
    instances count under their MIG class.
    """
    cap = Capacity(snap, {m.spec.name: m.spec for m in snap.models})
    out: dict[str, dict[str, int]] = {}
    for node in cap.reporting():
        free = {k: node.free_ids(k) for k in node.by_class}
        for dev in cap.views[node.name].devices:
            c = out.setdefault(dev.klass, {"total": 0, "free": 0, "used": 0, "unhealthy": 0})
            c["total"] += 1
            if not dev.healthy:
                c["unhealthy"] += 1
            elif node.blocked or dev.id not in free.get(dev.klass, ()):
                c["used"] += 1
            else:
                c["free"] += 1
    return dict(sorted(out.items()))


def fabric_weights(snap: Snapshot) -> dict[str, list[str]]:
    """Per fabric ("(none)" for nodes without one), the sources held anywhere in it: on a
    node's local storage or on a shared filer. Every fabric in the snapshot is listed."""
    out: dict[str, set[str]] = {}
    for node in snap.nodes:
        held = out.setdefault(node.fabric if node.fabric is not None else NO_FABRIC, set())
        held.update(node.weights or ())
        held.update(node.shared_weights)
    return {fabric: sorted(held) for fabric, held in sorted(out.items())}


def nodes_holding(snap: Snapshot, source: str) -> list[str]:
    """Nodes that can read ``source`` without a copy: held locally, or shared in the fabric
    (a node without a fabric shares only with itself)."""
    shared = {n.fabric for n in snap.nodes if n.fabric is not None and source in n.shared_weights}
    return sorted(n.name for n in snap.nodes
                  if source in (n.weights or ()) or source in n.shared_weights
                  or (n.fabric is not None and n.fabric in shared))


def fabrics_without_copy(snap: Snapshot, source: str) -> list[str]:
    """Fabrics where some node holds ``source`` (locally or shared), so a replica placed there
    needs no copy; "(none)" stands for nodes without a fabric."""
    views = {n.name: n for n in snap.nodes}
    return sorted({views[name].fabric or NO_FABRIC for name in nodes_holding(snap, source)})
