"""Reading the store into the pure placement snapshot."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, cast

from ..api.states import ReplicaState
from ..fleetvocab import ACTIVE, heard_from, held_sources, shares_device
from ..placement import (
    DeviceView,
    ModelView,
    NodeView,
    PartView,
    Plan,
    ReplicaView,
    Snapshot,
    place,
)
from ..placement.capacity import silence
from ..placement.nodebase import NodeBase
from ..store.models import spec_of
from .drain import cordoned, draining_node, is_draining, replica_nodes
from .states import in_backoff, wanted_replicas


@functools.lru_cache(maxsize=16384)
def device_views(devices_json: str) -> tuple[DeviceView, ...]:
    """The devices of a node's report; cached by the text, since a reconcile pass reads
    every node each second and reports rarely change. A device's view is shared by every
    report that places it alike (``_DEVICES``): new temperature or power readings give
    the same objects, which compare at once."""
    out = []
    for dev in json.loads(devices_json):
        id_, klass = dev["id"], dev["class"]
        total, used = dev.get("memory_total_mb") or 0, dev.get("memory_used_mb") or 0
        # json gives int or bool for a whole number: ``type(v) is int`` leaves out bools
        if not (type(id_) is int and type(total) is int and type(used) is int
                and 0 <= id_ <= _MAX and 0 <= total <= _MAX and 0 <= used <= _MAX
                and type(klass) is str):
            raise ValueError(f"device {str(dev.get('id'))[:20]} has an id, class or memory "
                             "figure that is not a whole number in range")
        key = (id_, klass, total, used, dev.get("healthy", True) is True)
        view = _DEVICES.get(key)
        if view is None:
            if len(_DEVICES) >= 65536:
                _DEVICES.clear()
            view = _DEVICES[key] = DeviceView(*key)
        out.append(view)
    return tuple(out)


_MAX = 2**53
_DEVICES: dict[tuple[Any, ...], DeviceView] = {}


@functools.lru_cache(maxsize=16384)
def weights_views(weights_json: str) -> tuple[frozenset[str] | None, frozenset[str]]:
    """(sources held locally or None when the agent was never told where to look,
    sources seen on a shared filer) from a node's reported weights."""
    weights = json.loads(weights_json or "{}")
    if not isinstance(weights, dict) or not weights.get("dirs"):
        return None, frozenset()
    return held_sources(weights)


@functools.lru_cache(maxsize=65536)
def ids(devices_json: str) -> tuple[Any, ...]:
    """A JSON list (a replica's or a part's placement ids, a node's engines) as a tuple;
    cached by the text, as the devices above."""
    return tuple(json.loads(devices_json))


class Memo:
    """Views made of rows, remembered by the row object and the values they were made of:
    the leader's fleet in memory (control/incremental.py) hands every pass the same row
    objects for the rows that did not change, so a pass makes views only of those that
    did. A hit needs the same object with the same values (a row changed in place is made
    again); rows no longer passed are forgotten (``keep``)."""

    def __init__(self) -> None:
        self.seen: dict[int, tuple[Any, tuple[Any, ...], Any]] = {}

    def get(self, row: Any, values: tuple[Any, ...]) -> Any | None:
        hit = self.seen.get(id(row))
        return hit[2] if hit is not None and hit[0] is row and hit[1] == values else None

    def put(self, row: Any, values: tuple[Any, ...], view: Any) -> Any:
        self.seen[id(row)] = (row, values, view)
        return view

    def keep(self, rows: list[Any]) -> None:
        """Forget all but ``rows`` once the memo holds many more than those."""
        if len(self.seen) > 2 * len(rows) + 1024:
            ids_ = {id(r) for r in rows}
            self.seen = {k: v for k, v in self.seen.items() if k in ids_}


class NodeMemo:
    """Node views by node name, with the row and the values they were made of but the
    report time: a view is made again only when something else of its node changed, and
    otherwise copied with the new time (``NodeView.reported``). The leader's view
    (control/incremental.py) patches a node's report time and device readings into its
    record in place and gives any other change a new record, so a record seen before (the
    same object) with the same devices text (the same object too) is known by those and
    its report time alone; another is compared by its values. ``made`` counts the views
    made with other placement inputs than the node's
    last (a new node, other devices or engines; not new readings alone): while it stays,
    each node's view places as the one before it did, report time aside (``PlanMemo``)."""

    def __init__(self) -> None:
        self.seen: dict[str, tuple[Any, tuple[Any, ...], NodeView]] = {}
        self.made = 0
        # the last walk of a fleet that came with a serial (:meth:`views`)
        self._walked: _Walk | None = None
        self.walks = 0                  # walks of every node, for tests and benches
        self.last: tuple[tuple[NodeView, ...], dict[str, str]] = ((), {})   # the last views

    def views(self, rows: list[Any], since: tuple[int, int, frozenset[str]] | None = None
              ) -> tuple[tuple[NodeView, ...], dict[str, str]]:
        """Every node's view, and why each node whose stored report cannot be used is left
        out (:func:`node_views`). With ``since`` (the leader's view, ``Fleet.nodes_since``:
        the serial of the fleet it handed out before, this one's, and the nodes whose
        records changed between them) and a last walk of that earlier fleet, only those
        nodes are looked up again: the others are the same records, unchanged, so their
        views are the ones the last walk made (a pass of 10,000 nodes looks up the few
        hundred whose report time it read)."""
        walked = self._walked
        if since is not None and walked is not None and walked.serial == since[0] \
                and len(rows) == len(walked.slots) and since[2] <= walked.index.keys():
            slots, bad = list(walked.slots), dict(walked.bad)
            for name in since[2]:
                i = walked.index[name]
                if rows[i].name != name:
                    break
                slots[i] = self._one(rows[i], bad)
            else:
                return self._keep(since[1], walked.index, slots, bad)
        self.keep(rows)
        self.walks += 1
        bad = {}
        slots = [self._one(row, bad) for row in rows]
        return self._keep(None if since is None else since[1],
                          {row.name: i for i, row in enumerate(rows)}, slots, bad)

    def _one(self, row: Any, bad: dict[str, str]) -> NodeView | None:
        """The row's view, or None with why its stored report cannot be used in ``bad``."""
        try:
            view = self.view(row)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            bad[row.name] = (f"its stored report cannot be used ({type(exc).__name__}: "
                             f"{str(exc)[:200]}); it gets no replicas until it reports again")
            return None
        bad.pop(row.name, None)
        return view

    def _keep(self, serial: int | None, index: dict[str, int], slots: list[NodeView | None],
              bad: dict[str, str]) -> tuple[tuple[NodeView, ...], dict[str, str]]:
        # no node left out: every slot holds a view
        views = cast("tuple[NodeView, ...]", tuple(slots)) if not bad \
            else tuple(v for v in slots if v is not None)
        self._walked = None if serial is None else _Walk(serial, index, slots, bad)
        self.last = (views, dict(bad))
        return self.last

    def view(self, row: Any) -> NodeView:
        hit = self.seen.get(row.name)
        if hit is not None and hit[0] is row and hit[1][1] is row.devices:
            view = hit[2]
            if view.last_report == row.last_report:
                return view
            view = view.reported(row.last_report)
            self.seen[row.name] = (row, hit[1], view)
            return view
        values = (*_NODE_KEY(row), _cordoned(row))
        if hit is not None and hit[1] == values:
            view = hit[2]
            if view.last_report != row.last_report:
                view = view.reported(row.last_report)
        else:
            local, shared = weights_views(row.weights)
            view = NodeView(name=row.name, devices=device_views(row.devices),
                            engines=ids(row.engines), last_report=row.last_report,
                            fabric=row.fabric, weights=local, shared_weights=shared,
                            cordoned=values[-1])
            if hit is None or _inputs(hit[2]) != _inputs(view):
                self.made += 1          # not new readings alone (a temperature)
        self.seen[row.name] = (row, values, view)
        return view

    def keep(self, rows: list[Any]) -> None:
        """Forget all but ``rows``' nodes once the memo holds many more than those."""
        if len(self.seen) > 2 * len(rows) + 1024:
            names = {r.name for r in rows}
            self.seen = {k: v for k, v in self.seen.items() if k in names}


@dataclass
class _Walk:
    """A walk of a fleet's nodes (``NodeMemo.views``): the fleet's serial, each node's
    position, the view at each position (None: left out) and why those are left out."""

    serial: int
    index: dict[str, int]
    slots: list[NodeView | None]
    bad: dict[str, str]


def _inputs(view: NodeView) -> tuple[Any, ...]:
    """What placement reads of a node view but its name and report time."""
    return (view.devices, view.engines, view.fabric, view.weights, view.shared_weights,
            view.cordoned)


NODES, REPLICAS = NodeMemo(), Memo()
_NODE_KEY = attrgetter("name", "devices", "engines", "weights", "fabric")
_REPLICA_KEY = attrgetter("id", "model", "node", "devices", "state", "started", "desired")


def _cordoned(row: Any) -> bool:
    return bool(getattr(row, "cordoned", 0)) or (bool(getattr(row, "drain", None))
                                                 and cordoned(row))


def node_view(row: Any) -> NodeView:
    """The planner's view of a node's row (remembered: a pass makes one of every node each
    second and most are as they were)."""
    return NODES.view(row)


def node_views(nodes: list[Any], since: tuple[int, int, frozenset[str]] | None = None
               ) -> tuple[tuple[NodeView, ...], dict[str, str]]:
    """The planner's view of every node whose stored report it can use, and for the others
    why not (a row written before reports were parsed strictly, or by hand): one bad node
    is left out, the rest of the fleet is placed. ``since``: ``NodeMemo.views``."""
    return NODES.views(nodes, since)


def replica_view(r: Any, parts: list[Any], leaving: set[str],
                 current: dict[str, str | None]) -> ReplicaView:
    """The planner's view of a replica's row and worker parts (``leaving``: the draining
    nodes; ``current``: each model's definition), remembered as node views are."""
    counts = not is_draining(r) and not (leaving and replica_nodes(r, parts) & leaving)
    old = getattr(r, "definition_hash", None) not in (None, current.get(r.model))
    values = (*_REPLICA_KEY(r), counts, old, *((p.rank, p.node, p.devices) for p in parts))
    view = REPLICAS.get(r, values)
    if view is not None:
        return view  # type: ignore[no-any-return]
    return REPLICAS.put(r, values, ReplicaView(  # type: ignore[no-any-return]
        id=r.id, model=r.model, node=r.node, devices=ids(r.devices), state=r.state,
        started=r.started, desired=bool(r.desired),
        parts=tuple(PartView(rank=p.rank, node=p.node, devices=ids(p.devices))
                    for p in parts), counts=counts, old=old))


def build(models: list[Any], nodes: list[Any], replicas: list[Any], now: float,
          node_timeout_s: float, *, parts: dict[str, list[Any]],
          replace_after_s: float, backoff: tuple[float, float],
          unusable: dict[str, str] | None = None,
          targets: dict[str, int] | None = None,
          nodes_since: tuple[int, int, frozenset[str]] | None = None) -> Snapshot:
    """The planner's snapshot; ``parts`` are the worker parts by replica id (every caller
    must pass them, or the nodes of multi-node replicas would look free). ``targets``:
    the replicas each model keeps in this pass (a rollout's, control/steps.py), else what
    it wants. A draining replica, or one on a draining node, holds its devices but is not
    one of its model's replicas (so its replacement is placed). ``nodes_since``: the
    leader's view's ``Fleet.nodes_since``, with ``nodes`` its nodes in its order."""
    by_model: dict[str, list[Any]] = {}
    for rep in replicas:
        by_model.setdefault(rep.model, []).append(rep)
    leaving = {n.name for n in nodes if getattr(n, "drain", None) and draining_node(n)}
    current = {m.name: getattr(m, "definition_hash", None) for m in models}
    targets = targets or {}
    model_views = tuple(
        ModelView(spec=spec_of(m),
                  wanted=targets.get(m.name, wanted_replicas(m, by_model.get(m.name, []), now)),
                  parked=bool(m.parked),
                  hold_starts=in_backoff(m.consecutive_failures, m.last_failure_at, now,
                                         *backoff))
        for m in models)
    REPLICAS.keep(replicas)
    replica_views = tuple(replica_view(r, parts.get(r.id, []), leaving, current)
                          for r in replicas)
    views, bad = node_views(nodes, nodes_since)
    if unusable is not None:
        unusable.update(bad)
    return Snapshot(models=model_views, nodes=views,
                    replicas=replica_views, now=now, node_timeout_s=node_timeout_s,
                    replace_after_s=replace_after_s)


def node_inputs(snap: Snapshot) -> tuple[Any, ...]:
    """What ``placement.place`` reads of a snapshot's nodes: all of them but their report
    times, which it reads only to tell whether each node reports (within
    ``node_timeout_s`` of ``now``) and whether it has been silent past ``replace_after_s``:
    those two answers stand in for them. Two snapshots whose models, replicas, timeouts and
    node inputs are equal get equal plans."""
    now, timeout, replace = snap.now, snap.node_timeout_s, snap.replace_after_s
    return tuple((n.name, *_inputs(n), heard_from(n.last_report, now, timeout),
                  silence(n, now) > replace) for n in snap.nodes)


def liveness(snap: Snapshot) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """What placement reads of the nodes' report times: which nodes (by position) it has
    not heard from within ``node_timeout_s``, and which have been silent past
    ``replace_after_s``, in one walk (every pass asks it of every node)."""
    now, timeout, replace = snap.now, snap.node_timeout_s, snap.replace_after_s
    unheard: list[int] = []
    silent: list[int] = []
    for i, n in enumerate(snap.nodes):
        if not heard_from(n.last_report, now, timeout):
            unheard.append(i)
        if silence(n, now) > replace:
            silent.append(i)
    return tuple(unheard), tuple(silent)


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


def readiness_read(snap: Snapshot, present: frozenset[str]) -> set[str]:
    """The models whose replicas' readiness and start time placement reads:
    - a model with more replicas than it wants (the least useful stop first: not ready,
      newest);
    - a model with memory_gb, while some model is to be placed on a shared device (one
      not ready yet reserves its memory there, and that placement reads what is free).

    A model's replicas are counted as placement counts them: active, its own (not
    draining), on nodes ``present``. Of any other replica placement reads only whether
    it is active: an engine's restart (ready, starting, ready again) or a replica's start
    (pending, fetching, starting) places as before."""
    active: dict[str, int] = {}
    for r in snap.replicas:
        if r.desired and r.counts and r.state in _ACTIVE and r.node in present \
                and all(p.node in present for p in r.parts):
            active[r.model] = active.get(r.model, 0) + 1
    wanted = {m.spec.name: 0 if m.parked else m.wanted for m in snap.models}
    shared = any(active.get(m.spec.name, 0) < wanted[m.spec.name]
                 and shares_device(m.spec.profile.klass, m.spec.profile.memory_gb)
                 for m in snap.models)
    return {m.spec.name for m in snap.models
            if (shared and m.spec.profile.memory_gb is not None)
            or active.get(m.spec.name, 0) > wanted[m.spec.name]}


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
    return not moved or not moved & readiness_read(snap, present)


_ACTIVE = frozenset(ACTIVE)


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
            self._live = (tuple(n.name for n in last.nodes), liveness(last))
        names, live = self._live
        return len(names) == len(snap.nodes) \
            and names == tuple(n.name for n in snap.nodes) and live == liveness(snap)

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
