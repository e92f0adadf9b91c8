"""The fleet summary, derived from the same rows the tables show, so ``ctl status``,
``ctl plan``, the console and the JSON API can never disagree. Pure: no I/O, ``now`` in."""

from __future__ import annotations

from collections import Counter
from typing import Any

from ..devices.model import label
from ..weights.scan import held_sources

ACTIVE = ("pending", "fetching", "starting", "ready")
NO_FABRIC = "(none)"


def device_label(dev: dict[str, Any]) -> str:
    """``0`` for a whole GPU (or the CPU), ``0/mig1`` for a MIG instance, from a reported
    device object (``devices.model.label`` on the dataclass)."""
    if dev.get("mig") is not None:
        return label(dev.get("card", 0), dev["mig"])
    return str(dev.get("card", dev.get("id")))


def node_alive(node: dict[str, Any], now: float, node_timeout_s: float) -> bool:
    return node.get("last_report") is not None and now - node["last_report"] <= node_timeout_s


def devices_by_class(nodes: list[dict[str, Any]], replicas: list[dict[str, Any]],
                     now: float, node_timeout_s: float) -> dict[str, dict[str, int]]:
    """Per device class: total, used, free, unhealthy. An unhealthy device is neither used
    nor free; a node that stopped reporting counts in ``unreachable``, not in free."""
    used: set[tuple[str, int]] = set()
    for r in replicas:
        if r.get("desired", True) and r["state"] in ACTIVE:
            used.update((r["node"], d) for d in r["devices"])
            for part in r.get("parts") or []:
                used.update((part["node"], d) for d in part["devices"])
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
            node_timeout_s: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """Weights per fabric, from reporting nodes: which models each fabric holds (a copy on
    some node, or on a shared filer its nodes see), and per model which fabrics could serve
    it without a copy and how many nodes hold it (a shared filer counts for every node of
    its fabric). Nodes without a fabric are listed together under ``(none)``."""
    out: dict[str, Any] = {}
    local_of: dict[str, frozenset[str]] = {}
    shared_of: dict[str, set[str]] = {}
    members: dict[str, list[str]] = {}
    for node in nodes:
        name = node.get("fabric") or NO_FABRIC
        entry = out.setdefault(name, {"nodes": 0, "reporting": 0, "models": []})
        entry["nodes"] += 1
        if not node_alive(node, now, node_timeout_s):
            continue
        entry["reporting"] += 1
        local, shared = held_sources(node.get("weights") or {})
        local_of[node["name"]] = local
        # without a fabric a node shares its filer with nobody
        shared_of.setdefault(name if node.get("fabric") else "node:" + node["name"],
                             set()).update(shared)
        members.setdefault(name, []).append(node["name"])
    per_model: dict[str, Any] = {}
    for m in models:
        src, where, count = m["source"], [], 0
        for fabric, names in members.items():
            holders = [n for n in names if src in local_of[n]
                       or src in shared_of.get(fabric if fabric != NO_FABRIC else "node:" + n,
                                               set())]
            count += len(holders)
            if holders:
                where.append(fabric)
                out[fabric]["models"].append(m["name"])
        per_model[m["name"]] = {"fabrics_with_weights": sorted(where),
                                "nodes_with_weights": count}
    for entry in out.values():
        entry["models"].sort()
    return dict(sorted(out.items())), per_model


def build(models: list[dict[str, Any]], nodes: list[dict[str, Any]],
          replicas: list[dict[str, Any]], now: float,
          node_timeout_s: float = 30.0) -> dict[str, Any]:
    """The summary: nodes, devices by class, replicas by state, models and what is wrong."""
    alive = sum(1 for n in nodes if node_alive(n, now, node_timeout_s))
    by_fabric, weights = fabrics(models, nodes, now, node_timeout_s)
    return {
        "nodes": {"total": len(nodes), "reporting": alive, "silent": len(nodes) - alive},
        "devices": devices_by_class(nodes, replicas, now, node_timeout_s),
        "cards_unusable": idle_cards(nodes),
        "replicas": dict(sorted(Counter(r["state"] for r in replicas).items())),
        "models": [{"name": m["name"], "state": m["state"], "ready": m["ready"],
                    "wanted": m["wanted"], "reason": m["reason"],
                    "on_demand": m["on_demand"], **weights[m["name"]]} for m in models],
        "fabrics": by_fabric,
    }
