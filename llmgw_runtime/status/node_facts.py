"""What the fleet summary derives from one node's report alone: not from ``now``, not from
the replicas. Pure. ``status.summary.build`` makes them for every node it is given, unless
the caller hands in those it kept with each node's decoded report (control/summary_view.py
does: at 10,000 nodes this spares a pass over 100,000 devices per summary)."""

from __future__ import annotations

from typing import Any, NamedTuple

from ..fleetvocab import held_sources

# A node's devices per class: (class, devices, unhealthy, memory_total_mb and free MB of
# the healthy ones)
Tally = tuple[tuple[str, int, int, float, float], ...]


class Facts(NamedTuple):
    tally: Tally                    # device_tally of its devices
    whole: bool                     # it has devices, all healthy (free whole if unused)
    unhealthy: str | None           # "2 unhealthy devices: XID 79"; None: all healthy
    local: frozenset[str]           # sources its weights report holds on local storage
    shared: frozenset[str]          # ... and on a shared filer
    unusable: tuple[dict[str, Any], ...]    # its cards that can run nothing (idle_cards)


def device_tally(devices: list[dict[str, Any]]) -> Tally:
    """A node's devices per class, as ``devices_by_class`` counts a node nothing runs on."""
    return _tally(devices)[0]


def _tally(devices: list[dict[str, Any]]) -> tuple[Tally, int]:
    """``device_tally`` and how many devices are unhealthy, in one pass."""
    out: dict[str, list[Any]] = {}
    unhealthy = 0
    for dev in devices:
        t = out.get(dev["class"])
        if t is None:
            t = out[dev["class"]] = [dev["class"], 0, 0, 0.0, 0.0]
        t[1] += 1
        if not dev.get("healthy", True):
            t[2] += 1
            unhealthy += 1
            continue
        total = float(dev.get("memory_total_mb", 0))
        t[3] += total
        t[4] += max(0.0, total - float(dev.get("memory_used_mb", 0)))
    return tuple((k, n, bad, tot, free) for k, n, bad, tot, free in out.values()), unhealthy


def unhealthy_note(devices: list[dict[str, Any]]) -> str | None:
    """``2 unhealthy devices: XID 79``; None when every device is healthy."""
    bad = [d for d in devices if not d.get("healthy", True)]
    if not bad:
        return None
    reasons = sorted({str(d.get("reason")) for d in bad if d.get("reason")})
    return (f"{len(bad)} unhealthy device{'' if len(bad) == 1 else 's'}"
            + (": " + ", ".join(reasons) if reasons else ""))


def unusable_cards(node: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    """Cards that can run nothing (MIG with nothing carved, a pending MIG change, a driver
    problem) with the reason and what to do; a node with no card and no device: the
    problems its hardware report gives."""
    hardware = node.get("hardware") or {}
    out = [{"node": node["name"], "card": card.get("index"), "name": card.get("name"),
            "problem": card["problem"], "hint": card.get("hint")}
           for card in hardware.get("cards", []) if card.get("problem")]
    if not hardware.get("cards") and not node.get("devices"):
        out += [{"node": node["name"], "card": None, "name": None, "problem": problem,
                 "hint": None} for problem in hardware.get("problems", [])]
    return tuple(out)


def node_facts(node: dict[str, Any]) -> Facts:
    """The facts of a node as the views show it (``fleet.node_view``)."""
    devices = node.get("devices") or []
    tally, unhealthy = _tally(devices)
    local, shared = held_sources(node.get("weights") or {})
    hardware = node.get("hardware") or {}
    return Facts(tally=tally, whole=bool(devices) and not unhealthy,
                 unhealthy=unhealthy_note(devices) if unhealthy else None,
                 local=local, shared=shared,
                 unusable=unusable_cards(node) if hardware.get("problems")
                 or any(card.get("problem") for card in hardware.get("cards", ())) else ())
