"""The fleet planner: a snapshot of the fleet in, a plan (starts, stops, reasons) out.

Pure: no I/O and no clock (``snap.now`` is the time). Capacity bookkeeping and the node
ranking live in capacity.py; this module decides how many replicas each model needs, which
to stop, and words the reasons an operator reads.

Bounded whatever the snapshot says: a model gets at most MAX_REPLICAS replicas (a store row
from before that bound, or a larger ``wanted``, is cut to it and says so), its starts stop at
the first replica that does not fit (capacity only shrinks within a plan), and the fleet can
hold only so many (capacity.py), so a pass plans at most what the fleet can hold.
"""

from __future__ import annotations

import math
from operator import attrgetter

from ..api.catalog import ModelSpec, is_mig_class
from ..catalog.bounds import MAX_REPLICAS
from ..fleetvocab import ACTIVE, CPU_CLASS, MAX_REPLICAS_PER_SHARED_DEVICE
from .capacity import Capacity, Choice, NodeState, Request, replica_nodes, silence
from .model import (
    ModelView,
    NodeView,
    PartStart,
    Plan,
    ReplicaView,
    Snapshot,
    Start,
)
from .nodebase import NodeBase


def place(snap: Snapshot, nodes: NodeBase | None = None) -> Plan:
    """Decide which replicas to start and stop, and why a model cannot be placed.
    ``nodes``: what capacity.py reads of the nodes alone, kept from an earlier snapshot
    whose nodes place as ``snap``'s do (nodebase.py); else read from ``snap``."""
    plan = Plan()
    models = {m.spec.name: m for m in snap.models}
    views = {n.name: n for n in snap.nodes}
    active = _keep_or_stop(snap, models, views, plan)
    cap: Capacity | None = None             # built only when something must be placed
    failed: dict[tuple[str, str, int, int, float | None], str] = {}
    for model in sorted(models.values(), key=_order):
        spec = model.spec
        reps = active.get(spec.name, [])
        wanted = 0 if model.parked else model.wanted
        if len(reps) > wanted:
            _stop_extras(spec.name, reps, wanted, model.parked, views, snap, plan)
            continue
        if len(reps) == wanted or model.hold_starts:
            continue
        refused = _refused(spec)
        if refused:
            plan.unplaceable[spec.name] = refused
            continue
        if cap is None:
            cap = Capacity(snap, {m.spec.name: m.spec for m in snap.models}, nodes)
        _place_model(cap, spec, reps, wanted, views, plan, failed)
    return plan


def _order(model: ModelView) -> tuple[int, int, str]:
    """Multi-node models first (they need whole nodes), then the largest, then by name."""
    return (-model.spec.profile.nodes, -model.spec.profile.gpus, model.spec.name)


# -- replicas that exist -------------------------------------------------------------------


def _keep_or_stop(snap: Snapshot, models: dict[str, ModelView], views: dict[str, NodeView],
                  plan: Plan) -> dict[str, list[ReplicaView]]:
    """Stop replicas of models that left the catalog and those on nodes silent past
    ``replace_after_s``; return the rest of the active ones by model (those that count:
    a draining replica, or one leaving a draining node, holds its devices only)."""
    active: dict[str, list[ReplicaView]] = {}
    now = snap.now
    for rep in sorted(snap.replicas, key=_ID):
        if not rep.desired or not rep.counts:
            continue        # a replica that drains or leaves its node stops on its own
        if rep.model not in models:
            _stop(plan, rep.id, f"model {rep.model} is no longer in the catalog")
            continue
        if rep.state not in ACTIVE:
            continue
        if rep.parts:
            quiet, name = max((silence(views.get(n), now), n) for n in replica_nodes(rep))
        else:       # one node (most replicas: every pass of a changed fleet asks each)
            quiet, name = silence(views.get(rep.node), now), rep.node
        if quiet > snap.replace_after_s:
            _stop(plan, rep.id, _silent_words(name, views.get(name), quiet, snap)
                  + ": replacing this replica elsewhere")
            continue
        active.setdefault(rep.model, []).append(rep)
    return active


_ID = attrgetter("id")


def _silent_words(name: str, view: NodeView | None, quiet: float, snap: Snapshot) -> str:
    if view is None:
        return f"node {name} is no longer in the fleet"
    if view.last_report is None or math.isinf(quiet):
        return f"node {name} has never reported"
    return f"node {name} silent for {quiet:.0f} s (over {snap.replace_after_s:.0f} s)"


def _stop_extras(name: str, reps: list[ReplicaView], wanted: int, parked: bool,
                 views: dict[str, NodeView], snap: Snapshot, plan: Plan) -> None:
    """Stop the least useful first: on a silent node, not ready, newest."""
    def useful(rep: ReplicaView) -> tuple[bool, bool, float, str]:
        heard = all(silence(views.get(n), snap.now) <= snap.node_timeout_s
                    for n in replica_nodes(rep))
        return (heard, rep.state == "ready", -rep.started, rep.id)

    why = (f"model {name} is parked" if parked else
           f"model {name} wants {wanted} replica(s) and has {len(reps)}: "
           "stopping the least useful")
    for rep in sorted(reps, key=useful)[: len(reps) - wanted]:
        _stop(plan, rep.id, why)


def _stop(plan: Plan, replica_id: str, why: str) -> None:
    plan.stops.append(replica_id)
    plan.stop_reasons[replica_id] = why


# -- new replicas --------------------------------------------------------------------------


def _refused(spec: ModelSpec) -> str:
    prof = spec.profile
    if is_mig_class(prof.klass) and (prof.gpus != 1 or prof.nodes != 1):
        return ("a MIG class runs on exactly one instance; set profile.gpus and profile.nodes "
                "to 1")
    if prof.gpus < 1 or prof.nodes < 1:
        return "profile.gpus and profile.nodes must be at least 1"
    return ""


def _place_model(cap: Capacity, spec: ModelSpec, reps: list[ReplicaView], wanted: int,
                 views: dict[str, NodeView], plan: Plan,
                 failed: dict[tuple[str, str, int, int, float | None], str]) -> None:
    """Plan the model's missing replicas (up to MAX_REPLICAS in all) until one does not fit;
    the model's reason then says why, and how many of those it wants are placed."""
    prof = spec.profile
    on_node: dict[str, int] = {}
    in_fabric: dict[str, int] = {}
    for rep in reps:
        if not rep.old:     # a rollout replaces it: the new replicas spread among the rest
            _count(rep.node, [p.node for p in rep.parts], views, on_node, in_fabric)
    placed = len(reps)
    for _ in range(min(wanted, MAX_REPLICAS) - placed):
        req = Request(klass=prof.klass, engine=spec.engine, gpus=prof.gpus, nodes=prof.nodes,
                      memory_gb=prof.memory_gb, source=spec.source,
                      spread=spec.strategy == "spread",
                      on_node=tuple(sorted(on_node.items())),
                      in_fabric=tuple(sorted(in_fabric.items())))
        reason = failed.get(req.signature)    # capacity only shrinks within a plan
        choice = None
        if reason is None:
            choice = cap.best_multi(req) if prof.nodes > 1 else cap.best_single(req)
            if choice is None:
                reason = failed[req.signature] = _cordoned_words(cap, _reason(cap, req))
        if choice is None:
            plan.unplaceable[spec.name] = _placed_words(str(reason), placed, wanted)
            return
        cap.take(choice, spec)
        placed += 1
        plan.starts.append(Start(
            model=spec.name, node=choice.node, devices=choice.devices,
            parts=tuple(PartStart(rank=i, node=n, devices=d)
                        for i, (n, d) in enumerate(choice.parts, start=1)),
            why=_why(choice, req)))
        _count(choice.node, [n for n, _ in choice.parts], views, on_node, in_fabric)
    if wanted > MAX_REPLICAS:
        plan.unplaceable[spec.name] = (
            f"wants {wanted} replicas, over the maximum of {MAX_REPLICAS} (MAX_REPLICAS); "
            f"{placed} of them placed; set replicas to at most {MAX_REPLICAS}")


def _placed_words(reason: str, placed: int, wanted: int) -> str:
    """The reason, and how many of the wanted replicas are placed when some are."""
    return f"{reason}; {placed} of {wanted} replicas placed" if placed else reason


def _count(head: str, parts: list[str], views: dict[str, NodeView],
           on_node: dict[str, int], in_fabric: dict[str, int]) -> None:
    fabrics = set()
    for name in (head, *parts):
        on_node[name] = on_node.get(name, 0) + 1
        view = views.get(name)
        if view is not None and view.fabric is not None:
            fabrics.add(view.fabric)
    for fabric in fabrics:
        in_fabric[fabric] = in_fabric.get(fabric, 0) + 1


def _why(choice: Choice, req: Request) -> str:
    """Why this node, in short operator words."""
    if req.nodes > 1:
        out = f"{req.nodes} whole nodes in fabric {choice.fabric}"
        if choice.holders:
            out += f"; {choice.holders} of them hold the weights"
        if req.spread and choice.in_fabric == 0:
            out = f"spread: no other replica of this model in fabric {choice.fabric}; " + out
        return out
    said = ["holds the weights"] if choice.holds else []
    left = _left(choice, req)
    if req.spread and choice.on_node == 0:
        fabric = (f" or in fabric {choice.fabric}"
                  if choice.fabric is not None and choice.in_fabric == 0 else "")
        said.append(f"spread: no other replica of this model on the node{fabric}")
    elif req.spread:
        said.append(f"spread: every node that fits runs this model; {choice.on_node} "
                    "other replica(s) here")
    elif choice.whole and not choice.holds:
        said.append(f"binpack: no partly used node fits; {left}")
    elif choice.takes_free < req.gpus:
        with_ = f" with {choice.sharing} other replica(s)" if choice.free_gb is not None else ""
        said.append(f"binpack: shares a device already in use{with_}; {left}")
    else:
        said.append(f"binpack: {left}")
    return "; ".join(said)


def _left(choice: Choice, req: Request) -> str:
    """What is left on the node after this replica: free devices of the class, or, on a
    shared device (the CPU, or memory_gb), its memory as status shows it (FREE of a shared
    class: the reported free memory less what replicas not yet ready will take)."""
    devices = f"{choice.left} free {req.klass} left on the node"
    if choice.free_gb is None:
        return devices
    takes = ("(its memory_gb is unset: it reserves none)" if req.memory_gb is None
             else f"after its {req.memory_gb:g} GB")
    memory = f"{max(0.0, choice.free_gb):.1f} GB memory free on the device {takes}"
    return memory if req.klass == CPU_CLASS else f"{devices}; {memory}"


# -- why not -------------------------------------------------------------------------------


def _reason(cap: Capacity, req: Request) -> str:
    """Why nothing fits, in operator words: the first thing that rules the fleet out."""
    klass, engine, gpus = req.klass, req.engine, req.gpus
    if klass not in cap.classes:
        seen = sorted(cap.classes)
        return (f"no reporting node has a device of class {klass}"
                + (f" (classes seen: {', '.join(seen)})" if seen else
                   " (no node is reporting)" if not cap.alive else " (they report no devices)"))
    with_engine = [cap.node(r) for r in cap.classes[klass]
                   if engine in cap.views[cap.names[r]].engines]
    if not with_engine:
        return f"no node with class {klass} has the {engine} engine installed"
    healthy = sum(len(n.by_class.get(klass, ())) for n in with_engine)
    if healthy == 0:
        return (f"every {klass} device is unhealthy" if len(with_engine) == len(cap.classes[klass])
                else f"every {klass} device on a node with the {engine} engine is unhealthy")
    if req.nodes > 1:
        return _multi_reason(cap, req, with_engine)
    usable = [n for n in with_engine if not n.blocked]
    need = req.memory_gb
    if req.shareable and gpus == 1:
        shared = [d for n in usable for d in n.by_class.get(klass, ()) if not d.exclusive]
        joinable = [d for d in shared if d.joinable]
        if shared and not joinable:
            return (f"every {klass} device already runs {MAX_REPLICAS_PER_SHARED_DEVICE} "
                    "replicas, the most one shared device takes "
                    "(MAX_REPLICAS_PER_SHARED_DEVICE)")
        if need is not None and not joinable:
            return f"no {klass} device has {need:g} GB free (every healthy one is taken)"
        if need is not None:
            largest = max(d.free_gb for d in joinable)
            return f"no {klass} device has {need:g} GB free (largest free: {largest:.1f} GB)"

    def room(node: NodeState) -> int:
        """Devices of the class on the node that this replica could take."""
        devs = node.by_class.get(klass, ())
        if not req.shareable:
            return sum(d.users == 0 for d in devs)
        return sum(d.joinable and (need is None or d.free_gb >= need) for d in devs)

    most, _, where = max(((room(n), -n.rank, n.name) for n in usable), default=(0, 0, ""))
    if gpus == 1:
        return f"no node has 1 free {klass}: all {healthy} healthy ones are taken"
    what = f"{gpus} x {klass}" + (f" with {need:g} GB free each" if need is not None else "")
    if most == 0:
        return f"needs {what} on one node; none is free (all {healthy} healthy ones are taken)"
    return f"needs {what} on one node; the most free on one node is {most} ({where})"


def _cordoned_words(cap: Capacity, reason: str) -> str:
    """The reason, and the cordoned nodes left out when there are any."""
    if not cap.cordoned:
        return reason
    shown = ", ".join(cap.cordoned[:5]) + (" ..." if len(cap.cordoned) > 5 else "")
    return f"{reason}; cordoned or draining, so left out: {shown}"


def _multi_reason(cap: Capacity, req: Request, with_engine: list[NodeState]) -> str:
    whole = cap.whole_nodes(req.klass, req.engine, req.gpus)
    fabrics = sorted({n.fabric for n in with_engine if n.fabric is not None})
    loners = sum(1 for n in with_engine if n.fabric is None)
    head = f"needs {req.nodes} whole nodes in one fabric"
    if not fabrics:
        return (f"{head}; no node with class {req.klass} is in a fabric "
                "(a node with no fabric cannot be combined with others)")
    counts = [f"{f} {len(whole.get(f, ()))}" for f in fabrics[1:]]
    first = f"{fabrics[0]} has {len(whole.get(fabrics[0], ()))} free"
    out = f"{head}; {', '.join([first, *counts])}"
    if loners:
        out += f"; {loners} node(s) with no fabric cannot be combined"
    return out

