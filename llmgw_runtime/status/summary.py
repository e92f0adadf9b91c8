"""The fleet summary, derived from the same rows the tables show, so ``ctl status``,
``ctl plan``, the console and the JSON API can never disagree. Pure: no I/O, ``now`` in."""

from __future__ import annotations

from collections import Counter
from typing import Any

from ..devices.model import label

ACTIVE = ("pending", "starting", "ready")


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
    used = {(r["node"], d) for r in replicas if r.get("desired", True)
            and r["state"] in ACTIVE for d in r["devices"]}
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


def build(models: list[dict[str, Any]], nodes: list[dict[str, Any]],
          replicas: list[dict[str, Any]], now: float,
          node_timeout_s: float = 30.0) -> dict[str, Any]:
    """The summary: nodes, devices by class, replicas by state, models and what is wrong."""
    alive = sum(1 for n in nodes if node_alive(n, now, node_timeout_s))
    return {
        "nodes": {"total": len(nodes), "reporting": alive, "silent": len(nodes) - alive},
        "devices": devices_by_class(nodes, replicas, now, node_timeout_s),
        "cards_unusable": idle_cards(nodes),
        "replicas": dict(sorted(Counter(r["state"] for r in replicas).items())),
        "models": [{"name": m["name"], "state": m["state"], "ready": m["ready"],
                    "wanted": m["wanted"], "reason": m["reason"],
                    "on_demand": m["on_demand"]} for m in models],
    }
