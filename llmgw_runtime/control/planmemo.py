"""The plan memo (issue 30): a reconcile pass whose snapshot places what the last one did
gets a copy of the last plan instead of placing again (placement is pure). What placement
reads of a snapshot, told apart from what it does not: the nodes' report times only as
their liveness answers, a replica's state only as active or not (and its readiness where
placement reads it)."""

from __future__ import annotations

import math
from operator import attrgetter
from typing import Any

from ..api.states import ReplicaState
from ..fleetvocab import ACTIVE, heard_from, shares_device
from ..placement import Plan, ReplicaView, Snapshot, place
from ..placement.capacity import silence
from ..placement.nodebase import NodeBase
from .snapshot import inputs_of


def node_inputs(snap: Snapshot) -> tuple[Any, ...]:
    """What ``placement.place`` reads of a snapshot's nodes: all of them but their report
    times, which it reads only to tell whether each node reports (within
    ``node_timeout_s`` of ``now``) and whether it has been silent past ``replace_after_s``:
    those two answers stand in for them. Two snapshots whose models, replicas, timeouts and
    node inputs are equal get equal plans."""
    now, timeout, replace = snap.now, snap.node_timeout_s, snap.replace_after_s
    return tuple((n.name, *inputs_of(n), heard_from(n.last_report, now, timeout),
                  silence(n, now) > replace) for n in snap.nodes)


def liveness(snap: Snapshot) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """What placement reads of the nodes' report times: which nodes (by position) it has
    not heard from within ``node_timeout_s``, and which have been silent past
    ``replace_after_s``, in one walk (every pass asks it of every node)."""
    now, timeout, replace = snap.now, snap.node_timeout_s, snap.replace_after_s
    times = [n.last_report for n in snap.nodes]
    # heard_from's and silence's rules, inline (a call each for 10,000 nodes cost more
    # than the rest): a node never heard from is unheard and silent for ever
    never = math.inf > replace
    return (tuple(i for i, t in enumerate(times) if t is None or not now - t <= timeout),
            tuple(i for i, t in enumerate(times) if (never if t is None else now - t > replace)))


def _placed_as(r: ReplicaView) -> tuple[Any, ...]:
    """What placement reads of a replica but its state and start time: all of it, and of
    its state only whether it is active."""
    return (r.id, r.model, r.node, r.devices, r.desired, r.parts, r.counts, r.old,
            r.state in _ACTIVE)


def present_nodes(snap: Snapshot) -> frozenset[str]:
    """The nodes not silent past ``replace_after_s`` (placement replaces the replicas on
    the others, and on nodes no longer in the fleet)."""
    now, replace = snap.now, snap.replace_after_s
    return frozenset(n.name for n in snap.nodes if silence(n, now) <= replace)


def readiness_read(snap: Snapshot, present: frozenset[str],
                   among: set[str] | None = None) -> set[str]:
    """The models whose replicas' readiness and start time placement reads:
    - a model with more replicas than it wants (the least useful stop first: not ready,
      newest);
    - a model with memory_gb, while some model is to be placed on a shared device (one
      not ready yet reserves its memory there, and that placement reads what is free).

    A model's replicas are counted as placement counts them: active, its own (not
    draining), on nodes ``present``. Of any other replica placement reads only whether
    it is active: an engine's restart (ready, starting, ready again) or a replica's start
    (pending, fetching, starting) places as before.

    ``among``: only these models are asked about (the answer is the same set, cut to
    them): their replicas alone are counted, and every model's only when one of them has
    memory_gb (whether some model is to be placed on a shared device)."""
    by_name = {m.spec.name: m for m in snap.models}
    asked = by_name.keys() if among is None else among & by_name.keys()
    if not asked:
        return set()
    shared_asked = any(by_name[n].spec.profile.memory_gb is not None for n in asked)
    counted = None if shared_asked else asked
    active: dict[str, int] = {}
    for r in snap.replicas:
        if (counted is None or r.model in counted) and r.desired and r.counts \
                and r.state in _ACTIVE and r.node in present \
                and all(p.node in present for p in r.parts):
            active[r.model] = active.get(r.model, 0) + 1
    wanted = {n: 0 if m.parked else m.wanted for n, m in by_name.items()}
    shared = shared_asked and any(
        active.get(m.spec.name, 0) < wanted[m.spec.name]
        and shares_device(m.spec.profile.klass, m.spec.profile.memory_gb)
        for m in snap.models)
    return {n for n in asked
            if (shared and by_name[n].spec.profile.memory_gb is not None)
            or active.get(n, 0) > wanted[n]}


def replicas_alike(last: dict[str, ReplicaView], snap: Snapshot,
                   present: frozenset[str]) -> bool:
    """Whether ``snap``'s replicas place as ``last``'s (by id) do, for snapshots of the
    same models whose nodes place alike (``present``: their nodes not silent past
    ``replace_after_s``): the same ids, each replica the same view or placed alike
    (:func:`_placed_as`), and those whose readiness or start time moved all of models
    whose readiness placement does not read (:func:`readiness_read`: the counts it reads
    are the same in both). Only the replicas that are not the same view are compared."""
    if len(snap.replicas) != len(last) or len({r.id for r in snap.replicas}) != len(last):
        return False
    moved = set()
    for r in snap.replicas:
        old = last.get(r.id)
        if old is r:
            continue
        if old is None or _placed_as(old) != _placed_as(r):
            return False
        if (old.state == ReplicaState.READY, old.started) \
                != (r.state == ReplicaState.READY, r.started):
            moved.add(r.model)
    return not moved or not readiness_read(snap, present, moved)


_ACTIVE = frozenset(ACTIVE)
_NAME = attrgetter("name")


class PlanMemo:
    """The last snapshot placed and its plan: a pass whose snapshot places what the last
    one did (a steady fleet: only report times moved, within the same answers; replicas
    whose state moved where placement does not read it, :func:`replicas_alike`) gets a
    copy of that plan without placing again. Placement is pure, so the copy is what it
    would answer. The models are compared first (the memos' own view objects, mostly
    identities), then the replicas that are not the views placed last; the nodes' inputs
    only when those are alike. ``made`` (the reconciler's:
    ``NODES.made`` as it built the snapshot) spares comparing the nodes themselves: while it
    stays, the nodes of the same names are the views placed last, report times aside, so
    only the names and the answers the report times give (:func:`liveness`) are compared;
    once it moved, a node's inputs did, and the pass places without comparing."""

    def __init__(self) -> None:
        # the last snapshot placed, its plan, and its node inputs once they were needed
        self.last: tuple[Snapshot, Plan] | None = None
        self._inputs: tuple[Any, ...] | None = None
        self._by_id: dict[str, ReplicaView] | None = None   # the last's replicas
        self._present: frozenset[str] | None = None         # present_nodes of the last
        self._made: int | None = None
        self._live: tuple[tuple[str, ...], Any] | None = None
        # what the planner read of the last snapshot's nodes alone (placement/nodebase.py)
        self._nodes: NodeBase | None = None
        self.placed = 0                 # plans made (not copied), for tests and benches
        self.bases = 0                  # node bases made, for tests and benches

    def place(self, snap: Snapshot, made: int | None = None) -> Plan:
        last = self.last
        same_nodes = last is not None and self._same_nodes(last[0], snap, made)
        if last is None or not self._same(last[0], snap, made, same_nodes):
            if not same_nodes or self._nodes is None:
                # another fleet of nodes: read afresh (lazily: only if something is placed)
                self._nodes = NodeBase(snap)
                self.bases += 1
                self._live = self._present = None
            self.placed += 1
            last = self.last = (snap, place(snap, self._nodes))
            self._inputs = self._by_id = None
        elif snap is not last[0]:
            # ``snap`` places as the last did, so it is the last from now on: the next
            # pass's replica views are mostly its very objects (against the snapshot placed
            # minutes ago, every replica was compared each pass once any view moved)
            last = self.last = (snap, last[1])
            self._by_id = None
        self._made = made
        plan = last[1]
        # a copy: the pass changes what it was handed (control/steps.py, a rollout's room)
        return Plan(starts=list(plan.starts), stops=list(plan.stops),
                    stop_reasons=dict(plan.stop_reasons), unplaceable=dict(plan.unplaceable))

    def _same_nodes(self, last: Snapshot, snap: Snapshot, made: int | None) -> bool:
        """Whether ``snap``'s nodes place as ``last``'s did, known without comparing them:
        ``made`` did not move (each node's view is the one placed last, report time
        aside), and the same names give the same answers of their report times."""
        if made is None or made != self._made or last.node_timeout_s != snap.node_timeout_s \
                or last.replace_after_s != snap.replace_after_s:
            return False
        if self._live is None:
            self._live = (tuple(map(_NAME, last.nodes)), liveness(last))
        names, live = self._live
        return len(names) == len(snap.nodes) \
            and names == tuple(map(_NAME, snap.nodes)) and live == liveness(snap)

    def _same(self, last: Snapshot, snap: Snapshot, made: int | None, same_nodes: bool) -> bool:
        if not (last.node_timeout_s == snap.node_timeout_s
                and last.replace_after_s == snap.replace_after_s
                and last.models == snap.models) or (made is not None and not same_nodes):
            return False            # made moved: a node's inputs did (no compare)
        if last.replicas != snap.replicas:
            if self._by_id is None:
                self._by_id = {r.id: r for r in last.replicas}
            if len(self._by_id) != len(last.replicas) or not replicas_alike(
                    self._by_id, snap, self._present_of(last, snap, made)):
                return False
        if made is not None:
            return True             # same_nodes
        if self._inputs is None:
            self._inputs = node_inputs(last)
        inputs = node_inputs(snap)
        if inputs != self._inputs:
            return False
        self._inputs = inputs           # the same answers, this snapshot's objects
        return True

    def _present_of(self, last: Snapshot, snap: Snapshot, made: int | None
                    ) -> frozenset[str]:
        """``present_nodes`` of ``snap``, whose nodes give the same answers as the last's
        when ``made`` is known (kept with those); else of ``snap`` itself (its nodes are
        compared with the last's after)."""
        if made is None or self._live is None:
            return present_nodes(snap)
        if self._present is None:
            names, (_, silent) = self._live
            self._present = frozenset(names) - {names[i] for i in silent}
        return self._present


PLANS = PlanMemo()
