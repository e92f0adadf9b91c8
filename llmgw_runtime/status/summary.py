"""The fleet summary, derived from the same rows the tables show, so ``ctl status``,
``ctl plan``, the console and the JSON API can never disagree. Pure: no I/O, ``now`` in."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from typing import Any

from ..coop import sliced
from ..fleetvocab import (
    ACTIVE,
    CPU_CLASS,
    MAX_REPLICAS_PER_SHARED_DEVICE,
    heard_from,
    home_wait_s,
    label,
    label_of_id,
    shares_device,
)
from . import changes
from .node_facts import Facts, Tally, device_tally, node_facts

__all__ = ["Facts", "Tally", "build", "device_tally", "node_facts"]

NO_FABRIC = "(none)"
SCHEMA = 1                      # bump when a field changes meaning or goes away
# A model a router reported at capacity (every slot taken and requests waiting, or refused)
# within this many seconds is "at capacity" (control/capacity.py merges the reports).
AT_CAPACITY_S = 30.0
# The catalog's routing by prompt prefix (api.catalog.Routing, which the summary does not
# import: tests/status hold the two equal).
AFFINITY = "prefix-affinity"
NODE_PROBLEMS_CAP = 50          # nodes the summary lists by name (all are counted)


def device_label(dev: dict[str, Any]) -> str:
    """``0`` for a whole GPU (or the CPU), ``0/mig1`` for a MIG instance, from a reported
    device object (``fleetvocab.label``, as ``devices.model.Device.label`` shows it)."""
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


def device_users(replicas: list[dict[str, Any]]) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """(node, device id) -> the active replicas (or parts of one) that hold it."""
    users: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in replicas:
        if r.get("desired", True) and r["state"] in ACTIVE:
            for node, devs in [(r["node"], r["devices"])] + [
                    (p["node"], p["devices"]) for p in r.get("parts") or []]:
                for d in devs:
                    users.setdefault((node, d), []).append(r)
    return users


def profiles(models: list[dict[str, Any]] | None) -> dict[str, tuple[str, float | None]]:
    """Model name -> (profile class, profile memory_gb), from the models' stored profile."""
    out: dict[str, tuple[str, float | None]] = {}
    for m in models or []:
        prof = m.get("profile") or {}
        out[m["name"]] = (str(prof.get("class", "")), prof.get("memory_gb"))
    return out


def _memory_free_mb(dev: dict[str, Any], users: list[dict[str, Any]],
                    prof: dict[str, tuple[str, float | None]]) -> tuple[bool, float]:
    """(shared, MB another replica could still use) of a reachable healthy device, as
    placement counts it: a free device its reported free memory; one held whole none; a
    shared one its reported free memory less what its replicas not yet ready will take,
    none once it runs MAX_REPLICAS_PER_SHARED_DEVICE."""
    free = max(0.0, float(dev.get("memory_total_mb", 0)) - float(dev.get("memory_used_mb", 0)))
    if not users:
        return False, free
    klass = dev["class"]
    shared = all(shares_device(*prof.get(r["model"], (klass, None))) or klass == CPU_CLASS
                 for r in users)
    if not shared or len(users) >= MAX_REPLICAS_PER_SHARED_DEVICE:
        return shared, 0.0
    pending = sum((prof.get(r["model"], (klass, None))[1] or 0) * 1024
                  for r in users if r["state"] != "ready")
    return True, max(0.0, free - pending)


def facts_of(node: dict[str, Any], facts: Mapping[str, Facts] | None) -> Facts:
    """A node's facts: those the caller kept (``facts``), else made now."""
    found = facts.get(node["name"]) if facts is not None else None
    return found if found is not None else node_facts(node)


def devices_by_class(nodes: list[dict[str, Any]], replicas: list[dict[str, Any]],
                     now: float, node_timeout_s: float,
                     used: set[tuple[str, int]] | None = None,
                     models: list[dict[str, Any]] | None = None,
                     facts: Mapping[str, Facts] | None = None) -> dict[str, dict[str, Any]]:
    """Per device class: total, used, free, unhealthy devices. An unhealthy device is
    neither used nor free; a node that stopped reporting counts in ``unreachable``, not in
    free. A class is ``shared`` when it is the CPU class or a device of it runs replicas
    placed by memory (profile.memory_gb, ``models`` say which): several replicas share one
    device, so its ``memory_*`` (MB, over reachable healthy devices; ``memory_free_mb`` is
    what more replicas could use) say how full it is, and ``replicas`` how many run there.
    A node nothing runs on is counted from its facts' tally (``facts``: node name -> those
    the caller kept; see ``facts_of``)."""
    users = device_users(replicas)
    used = set(users) if used is None else used
    prof = profiles(models)
    # per class: total, used, free, unhealthy, unreachable, replicas (one pass over every
    # device of the fleet, 100,000 at 10,000 nodes: plain lists, no per-device objects)
    counts: dict[str, list[int]] = {}
    memory: dict[str, list[float]] = {}
    shared: set[str] = set()
    touched = {name for name, _ in used} | {name for name, _ in users}
    for node in sliced(nodes):          # a web worker's loop keeps serving (coop.py)
        alive = node_alive(node, now, node_timeout_s)
        name = node["name"]
        quiet = name not in touched         # most nodes: nothing on any of its devices
        if quiet:
            for klass, n, bad, total_mb, free_mb in facts_of(node, facts).tally:
                c = counts.get(klass)
                if c is None:
                    c = counts[klass] = [0, 0, 0, 0, 0, 0]
                    memory[klass] = [0.0, 0.0]
                c[0] += n
                if not alive:
                    c[4] += n
                    continue
                c[3] += bad
                c[2] += n - bad
                mem = memory[klass]
                mem[0] += total_mb
                mem[1] += free_mb
                if klass == CPU_CLASS:
                    shared.add(klass)
            continue
        for dev in node.get("devices", []):
            klass = dev["class"]
            c = counts.get(klass)
            if c is None:
                c = counts[klass] = [0, 0, 0, 0, 0, 0]
                memory[klass] = [0.0, 0.0]
            c[0] += 1
            if not alive:
                c[4] += 1
                continue
            if not dev.get("healthy", True):
                c[3] += 1
                continue
            key = (name, dev["id"])
            c[1 if key in used else 2] += 1
            on_it = users.get(key)
            total = float(dev.get("memory_total_mb", 0))
            if on_it is None:           # nobody on it: its reported free memory
                free_mb = max(0.0, total - float(dev.get("memory_used_mb", 0)))
                is_shared = False
            else:
                c[5] += len(on_it)
                is_shared, free_mb = _memory_free_mb(dev, on_it, prof)
            if is_shared or klass == CPU_CLASS:
                shared.add(klass)
            mem = memory[klass]
            mem[0] += total
            mem[1] += free_mb
    keys = ("total", "used", "free", "unhealthy", "unreachable", "replicas")
    return {k: {**dict(zip(keys, v, strict=True)), "shared": k in shared,
                "memory_total_mb": round(memory[k][0]),
                "memory_used_mb": round(memory[k][0] - memory[k][1]),
                "memory_free_mb": round(memory[k][1])}
            for k, v in sorted(counts.items())}


def node_problems(nodes: list[dict[str, Any]], now: float, node_timeout_s: float,
                  cap: int = NODE_PROBLEMS_CAP, facts: Mapping[str, Facts] | None = None
                  ) -> dict[str, Any]:
    """Nodes that need a look, by name: silent (``silent for 10m``, ``never reported``),
    reporting a problem, or with unhealthy devices (``2 unhealthy devices: XID 79``). Their
    ``total`` and the first ``cap`` of them: at 10,000 nodes a list, not the fleet."""
    listed: list[dict[str, Any]] = []
    total = 0
    for node in sliced(nodes):
        why = []
        if not node_alive(node, now, node_timeout_s):
            last = node.get("last_report")
            why.append("never reported" if last is None else
                       f"silent for {_ago(now - last)}")
        if node.get("problem"):
            why.append(str(node["problem"]))
        bad = facts_of(node, facts).unhealthy
        if bad:
            why.append(bad)
        if why:
            total += 1
            if len(listed) < cap:
                listed.append({"name": node["name"], "problem": "; ".join(why)})
    return {"total": total, "nodes": listed}


def _ago(seconds: float) -> str:
    """``45s``, ``12m``, ``3h``, ``2d``: how long a node has been silent."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{max(0, int(seconds))}s"


def free_whole(node: dict[str, Any], used: set[tuple[str, int]]) -> bool:
    """A node a multi-node replica could take: it has devices, all healthy, none in use."""
    devices = node.get("devices") or []
    return bool(devices) and all(dev.get("healthy", True)
                                 and (node["name"], dev["id"]) not in used for dev in devices)


def idle_cards(nodes: list[dict[str, Any]], facts: Mapping[str, Facts] | None = None
               ) -> list[dict[str, Any]]:
    """Cards that can run nothing (MIG with nothing carved, a pending MIG change, a driver
    problem) with the reason and what to do (``node_facts.unusable_cards``)."""
    return [dict(card) for node in nodes for card in facts_of(node, facts).unusable]


def fabrics(models: list[dict[str, Any]], nodes: list[dict[str, Any]], now: float,
            node_timeout_s: float, used: set[tuple[str, int]] | None = None,
            facts: Mapping[str, Facts] | None = None,
            ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Weights per fabric, from reporting nodes: which models each fabric holds (a copy on
    some node, or on a shared filer its nodes see), and per model which fabrics could serve
    it without a copy and how many nodes hold it (a shared filer counts for every node of
    its fabric). Also the whole nodes free in each fabric (reporting, healthy, nothing
    running), which decide whether a multi-node replica can land there (``used`` as from
    ``used_devices``; none given, nothing is in use). Nodes without a fabric are listed
    together under ``(none)``."""
    used = used or set()
    used_nodes = {node for node, _ in used}
    out: dict[str, Any] = {}
    local_of: dict[str, frozenset[str]] = {}
    shared_of: dict[str, set[str]] = {}
    alive: list[tuple[str, str]] = []          # (node, fabric) of reporting nodes
    for node in sliced(nodes):
        name = node.get("fabric") or NO_FABRIC
        entry = out.get(name)
        if entry is None:
            entry = out[name] = {"nodes": 0, "reporting": 0, "free_nodes": 0, "models": []}
        entry["nodes"] += 1
        if not node_alive(node, now, node_timeout_s):
            continue
        entry["reporting"] += 1
        known = facts_of(node, facts)
        if node["name"] in used_nodes:
            entry["free_nodes"] += free_whole(node, used)
        else:                           # nothing runs on it: whole if all are healthy
            entry["free_nodes"] += known.whole
        local, shared = known.local, known.shared
        local_of[node["name"]] = local
        if shared:
            shared_of.setdefault(_filer_group(name, node["name"]), set()).update(shared)
        alive.append((node["name"], name))
    # holders[fabric][source]: reporting nodes of the fabric that see the source
    holders: dict[str, Counter[str]] = {}
    for node_name, fabric in alive:
        seen = local_of[node_name]
        filer = shared_of.get(_filer_group(fabric, node_name))
        if filer:
            seen = seen | filer
        held = holders.get(fabric)
        if held is None:
            held = holders[fabric] = Counter()
        if seen:
            held.update(seen)
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
    for r in sliced(replicas):
        if r["state"] != "ready" or not r.get("desired", True) or r.get("draining"):
            continue                               # a draining one is already stopping
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
            "cards": distinct_devices(idle), "unknown_cards": distinct_devices(unknown)}


def distinct_devices(entries: list[dict[str, Any]]) -> int:
    """Devices held by these replicas, each counted once: replicas sharing one device (the
    CPU, or a GPU shared by memory_gb) hold one device between them, not one each."""
    return len({d for e in entries for d in e["devices"]})


def waiting_for_home(waiting: int, busy: int, slots: int | None,
                     model: dict[str, Any]) -> str | None:
    """Why requests wait while a slot is free: with prefix affinity each waits for the
    replica holding its prompt's prefix, at most ``fleetvocab.home_wait_s`` of the model's
    max_wait_s, then takes any free slot (docs/routing.md). ``2 waiting for the replica
    holding their prompt's prefix (at most 15 s, then any free slot)``; None when nothing
    waits, no slot is free, or the model routes by load alone."""
    max_wait_s = model.get("max_wait_s")
    if not waiting or not slots or busy >= slots or model.get("routing") != AFFINITY \
            or not max_wait_s:
        return None
    bound = home_wait_s(float(max_wait_s))
    return (f"{waiting} waiting for the replica holding their prompt's prefix "
            f"(at most {bound:g} s, then any free slot)")


def at_capacity(model: dict[str, Any], now: float) -> dict[str, Any] | None:
    """What routers reported of ``model`` at capacity within AT_CAPACITY_S (its stored
    ``capacity_at`` and ``capacity``), with a one-line ``note``; None when nothing was."""
    at, report = model.get("capacity_at"), model.get("capacity")
    if at is None or not isinstance(report, dict) or now - at > AT_CAPACITY_S:
        return None
    out = {"reported_s_ago": round(max(0.0, now - at), 1),
           **{k: report.get(k) or 0 for k in ("waiting", "in_flight", "slots", "rejected",
                                              "wait_p90_s")},
           "window_s": round(max(0.0, now - report.get("since", at)), 1)}
    out["note"] = capacity_note(out, waiting_for_home(out["waiting"], out["in_flight"],
                                                      out["slots"], model))
    return out


def capacity_note(c: dict[str, Any], why: str | None = None) -> str:
    """``6 waiting, 14 refused in the last 12 s; 4/4 slots busy; p90 wait 2.5 s``; ``why``
    (``waiting_for_home``) in place of ``6 waiting`` when slots are free."""
    text = why or f"{c['waiting']} waiting"
    if c["rejected"]:
        text += f", {c['rejected']} refused in the last {max(1, round(c['window_s']))} s"
    text += f"; {c['in_flight']}/{c['slots']} slots busy"
    if c["wait_p90_s"]:
        text += f"; p90 wait {c['wait_p90_s']:.1f} s"
    return text


def failing_of(model: dict[str, Any]) -> dict[str, Any] | None:
    """A failing model's streak as the control service derived it (``states.failing``:
    failures, last_error, starting, next_start_in_s), with the ``text`` every view shows
    in place of its state: ``failing (3 in a row, next start in 20 s)``, ``failing (3 in a
    row, starting again)``. The same from one poll to the next, a start running or not."""
    streak = model.get("failing")
    if not streak:
        return None
    wait = streak.get("next_start_in_s")
    when = ("starting again" if streak.get("starting") else
            f"next start in {max(1, math.ceil(wait))} s" if wait else "next start now")
    return {**streak, "text": f"failing ({streak['failures']} in a row, {when})"}


def _filer_group(fabric: str, node: str) -> str:
    """Who shares a node's filer: its fabric; without a fabric, nobody but itself."""
    return "node:" + node if fabric == NO_FABRIC else fabric


def build(models: list[dict[str, Any]], nodes: list[dict[str, Any]],
          replicas: list[dict[str, Any]], now: float, node_timeout_s: float = 30.0, *,
          idle_after_s: float = 900.0, store: dict[str, Any] | None = None,
          facts: Mapping[str, Facts] | None = None) -> dict[str, Any]:
    """The summary every status view renders (schema: docs/api.md, "GET /api/v1/status"):
    nodes (cordoned and draining ones too), devices by class, free whole nodes and weights
    per fabric, replicas by state (and how many drain), models desired vs ready and in
    rollout, failing, parked, unplaceable and at-capacity models, idle replicas, the store.
    ``facts``: what the caller kept of each node (node name -> ``node_facts`` of it; the
    same summary, sooner); those missing are made here."""
    if facts is None or len(facts) < len(nodes):
        facts = {n["name"]: facts_of(n, facts) for n in sliced(nodes)}
    full = {m["name"]: at_capacity(m, now) for m in models}
    rolls = {m["name"]: changes.rollout_of(m, replicas) for m in models}
    out_of_service = changes.maintenance(nodes, replicas)
    alive = sum(1 for n in sliced(nodes) if node_alive(n, now, node_timeout_s))
    used = used_devices(replicas)
    by_fabric, weights = fabrics(models, nodes, now, node_timeout_s, used, facts)
    return {
        "schema": SCHEMA,
        "generated_at": now,
        "nodes": {"total": len(nodes), "reporting": alive, "silent": len(nodes) - alive,
                  **{state: sum(1 for n in out_of_service if n["state"] == state)
                     for state in ("cordoned", "draining")}},
        "maintenance": out_of_service,
        "node_problems": node_problems(nodes, now, node_timeout_s, facts=facts),
        "devices": devices_by_class(nodes, replicas, now, node_timeout_s, used, models,
                                    facts),
        "cards_unusable": idle_cards(nodes, facts),
        "replicas": dict(sorted(Counter(r["state"] for r in replicas).items())),
        "replicas_draining": sum(1 for r in replicas if r.get("draining")),
        "models": [{"name": m["name"], "state": m["state"], "ready": m["ready"],
                    "wanted": m["wanted"], "reason": m["reason"],
                    "on_demand": m["on_demand"], "parked": bool(m.get("parked")),
                    "consecutive_failures": m.get("consecutive_failures", 0),
                    "last_error": m.get("last_error"), "failing": failing_of(m),
                    "at_capacity": full[m["name"]],
                    "scaling": m.get("scaling"), "rollout": rolls[m["name"]],
                    **weights[m["name"]]}
                   for m in models],
        "rollouts": [{"name": name, **r} for name, r in rolls.items() if r is not None],
        "parked": [{"name": m["name"], "failures": m.get("consecutive_failures", 0),
                    "last_error": m.get("last_error") or m["reason"]}
                   for m in models if m["state"] == "parked"],
        "unplaceable": [{"name": m["name"], "reason": m["reason"]}
                        for m in models if m["state"] == "unplaceable"],
        "at_capacity": [{"name": name, **c} for name, c in full.items() if c is not None],
        "idle": idle_replicas(replicas, nodes, now, idle_after_s),
        "fabrics": by_fabric,
        "store": store or {"backend": "unknown", "members": None},
    }
