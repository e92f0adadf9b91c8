"""The fleet summary, derived from the same rows the tables show, so ``ctl status``,
``ctl plan``, the console and the JSON API can never disagree. Pure: no I/O, ``now`` in."""

from __future__ import annotations

from collections import Counter
from typing import Any

from ..api.states import LIVE_REPLICA_STATES, ReplicaState
from ..devices.model import label, label_of_id
from ..placement.model import heard_from
from ..weights.scan import held_sources

ACTIVE = (ReplicaState.PENDING, *LIVE_REPLICA_STATES)
NO_FABRIC = "(none)"
SCHEMA = 1                      # bump when a field changes meaning or goes away


def device_label(dev: dict[str, Any]) -> str:
    """``0`` for a whole GPU (or the CPU), ``0/mig1`` for a MIG instance, from a reported
    device object (``devices.model.label`` on the dataclass)."""
    if dev.get("mig") is not None:
        return label(dev.get("card", 0), dev["mig"])
    return str(dev.get("card", dev.get("id")))


def location(replica: dict[str, Any]) -> str:
    """Where a replica runs, as every view shows it: ``gpu-01:0/mig1`` or, across nodes,
    ``gpu-01:0,1 + gpu-02:0,1``."""
    spots = [(replica["node"], replica["devices"])] + [
        (p["node"], p["devices"]) for p in replica.get("parts") or []]
    return " + ".join(f"{node}:{','.join(label_of_id(d) for d in devs)}"
                      for node, devs in spots)


def node_alive(node: dict[str, Any], now: float, node_timeout_s: float) -> bool:
    return heard_from(node.get("last_report"), now, node_timeout_s)


def used_devices(replicas: list[dict[str, Any]]) -> set[tuple[str, int]]:
    """(node, device id) of every device an active replica (or one of its parts) holds."""
    used: set[tuple[str, int]] = set()
    for r in replicas:
        if r.get("desired", True) and r["state"] in ACTIVE:
            used.update((r["node"], d) for d in r["devices"])
            for part in r.get("parts") or []:
                used.update((part["node"], d) for d in part["devices"])
    return used


def devices_by_class(nodes: list[dict[str, Any]], replicas: list[dict[str, Any]],
                     now: float, node_timeout_s: float,
                     used: set[tuple[str, int]] | None = None) -> dict[str, dict[str, int]]:
    """Per device class: total, used, free, unhealthy. An unhealthy device is neither used
    nor free; a node that stopped reporting counts in ``unreachable``, not in free."""
    used = used_devices(replicas) if used is None else used
    counts: dict[str, Counter[str]] = {}
    for node in nodes:
        alive = node_alive(node, now, node_timeout_s)
        for dev in node.get("devices", []):
            c = counts.setdefault(dev["class"], Counter())
            c["total"] += 1
            if not alive:
                c["unreachable"] += 1
            elif not dev.get("healthy", True):
                c["unhealthy"] += 1
            elif (node["name"], dev["id"]) in used:
                c["used"] += 1
            else:
                c["free"] += 1
    keys = ("total", "used", "free", "unhealthy", "unreachable")
    return {k: {key: v[key] for key in keys} for k, v in sorted(counts.items())}


def free_whole(node: dict[str, Any], used: set[tuple[str, int]]) -> bool:
    """A node a multi-node replica could take: it has devices, all healthy, none in use."""
    devices = node.get("devices") or []
    return bool(devices) and all(dev.get("healthy", True)
                                 and (node["name"], dev["id"]) not in used for dev in devices)


def idle_cards(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Cards that can run nothing (MIG with nothing carved, a pending MIG change, a driver
    problem) with the reason and what to do."""
    out = []
    for node in nodes:
        for card in node.get("hardware", {}).get("cards", []):
            if card.get("problem"):
                out.append({"node": node["name"], "card": card.get("index"),
                            "name": card.get("name"), "problem": card["problem"],
                            "hint": card.get("hint")})
        if not node.get("hardware", {}).get("cards") and not node.get("devices"):
            for problem in node.get("hardware", {}).get("problems", []):
                out.append({"node": node["name"], "card": None, "name": None,
                            "problem": problem, "hint": None})
    return out


def fabrics(models: list[dict[str, Any]], nodes: list[dict[str, Any]], now: float,
            node_timeout_s: float, used: set[tuple[str, int]] | None = None,
            ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Weights per fabric, from reporting nodes: which models each fabric holds (a copy on
    some node, or on a shared filer its nodes see), and per model which fabrics could serve
    it without a copy and how many nodes hold it (a shared filer counts for every node of
    its fabric). Also the whole nodes free in each fabric (reporting, healthy, nothing
    running), which decide whether a multi-node replica can land there (``used`` as from
    ``used_devices``; none given, nothing is in use). Nodes without a fabric are listed
    together under ``(none)``."""
    used = used or set()
    out: dict[str, Any] = {}
    local_of: dict[str, frozenset[str]] = {}
    shared_of: dict[str, set[str]] = {}
    alive: list[tuple[str, str]] = []          # (node, fabric) of reporting nodes
    for node in nodes:
        name = node.get("fabric") or NO_FABRIC
        entry = out.setdefault(name, {"nodes": 0, "reporting": 0, "free_nodes": 0,
                                       "models": []})
        entry["nodes"] += 1
        if not node_alive(node, now, node_timeout_s):
            continue
        entry["reporting"] += 1
        entry["free_nodes"] += free_whole(node, used)
        local, shared = held_sources(node.get("weights") or {})
        local_of[node["name"]] = local
        shared_of.setdefault(_filer_group(name, node["name"]), set()).update(shared)
        alive.append((node["name"], name))
    # holders[fabric][source]: reporting nodes of the fabric that see the source
    holders: dict[str, Counter[str]] = {}
    for node_name, fabric in alive:
        seen = local_of[node_name] | shared_of.get(_filer_group(fabric, node_name), set())
        holders.setdefault(fabric, Counter()).update(seen)
    per_model: dict[str, Any] = {}
    for m in models:
        src, where, count = m["source"], [], 0
        for fabric, held in holders.items():
            if held[src]:
                count += held[src]
                where.append(fabric)
                out[fabric]["models"].append(m["name"])
        per_model[m["name"]] = {"fabrics_with_weights": sorted(where),
                                "nodes_with_weights": count}
    for entry in out.values():
        entry["models"].sort()
    return dict(sorted(out.items())), per_model


def idle_replicas(replicas: list[dict[str, Any]], nodes: list[dict[str, Any]], now: float,
                  idle_after_s: float) -> dict[str, Any]:
    """"What can I stop": ready replicas nobody asked for in the last ``idle_after_s``
    (from the routers' idle map), longest idle first, with the cards they hold. A replica
    no router has reported is unknown, not idle: listed apart, ``idle_s`` -1."""
    idle, unknown = [], []
    for r in replicas:
        if r["state"] != "ready" or not r.get("desired", True):
            continue
        if r.get("last_used") is not None and now - r["last_used"] < idle_after_s:
            continue                               # in use: no labels to make
        spots = [(r["node"], r["devices"])] + [(p["node"], p["devices"])
                                               for p in r.get("parts") or []]
        held = [f"{node}:{label_of_id(d)}" for node, devs in spots for d in devs]
        entry = {"id": r["id"], "model": r["model"], "node": r["node"], "devices": held,
                 "cards": len(held)}
        if r.get("last_used") is None:
            unknown.append({**entry, "idle_s": -1})
        else:
            idle.append({**entry, "idle_s": round(now - r["last_used"], 1)})
    idle.sort(key=lambda e: (-e["idle_s"], e["id"]))
    unknown.sort(key=lambda e: e["id"])
    return {"after_s": idle_after_s, "replicas": idle, "unknown": unknown,
            "cards": sum(e["cards"] for e in idle)}


def _filer_group(fabric: str, node: str) -> str:
    """Who shares a node's filer: its fabric; without a fabric, nobody but itself."""
    return "node:" + node if fabric == NO_FABRIC else fabric


def build(models: list[dict[str, Any]], nodes: list[dict[str, Any]],
          replicas: list[dict[str, Any]], now: float, node_timeout_s: float = 30.0, *,
          idle_after_s: float = 900.0, store: dict[str, Any] | None = None) -> dict[str, Any]:
    """The summary every status view renders (schema: docs/api.md, "GET /api/v1/status"):
    nodes, devices by class, free whole nodes and weights per fabric, replicas by state,
    models desired vs ready, parked and unplaceable models, idle replicas, the store."""
    alive = sum(1 for n in nodes if node_alive(n, now, node_timeout_s))
    used = used_devices(replicas)
    by_fabric, weights = fabrics(models, nodes, now, node_timeout_s, used)
    return {
        "schema": SCHEMA,
        "generated_at": now,
        "nodes": {"total": len(nodes), "reporting": alive, "silent": len(nodes) - alive},
        "devices": devices_by_class(nodes, replicas, now, node_timeout_s, used),
        "cards_unusable": idle_cards(nodes),
        "replicas": dict(sorted(Counter(r["state"] for r in replicas).items())),
        "models": [{"name": m["name"], "state": m["state"], "ready": m["ready"],
                    "wanted": m["wanted"], "reason": m["reason"],
                    "on_demand": m["on_demand"], "parked": bool(m.get("parked")),
                    "consecutive_failures": m.get("consecutive_failures", 0),
                    "last_error": m.get("last_error"), **weights[m["name"]]}
                   for m in models],
        "parked": [{"name": m["name"], "failures": m.get("consecutive_failures", 0),
                    "last_error": m.get("last_error") or m["reason"]}
                   for m in models if m["state"] == "parked"],
        "unplaceable": [{"name": m["name"], "reason": m["reason"]}
                        for m in models if m["state"] == "unplaceable"],
        "idle": idle_replicas(replicas, nodes, now, idle_after_s),
        "fabrics": by_fabric,
        "store": store or {"backend": "unknown", "members": None},
    }
