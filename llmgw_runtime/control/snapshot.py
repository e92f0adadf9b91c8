"""Reading the store into the pure placement snapshot: the planner's views of nodes and
replicas, remembered across passes (the plan memo is control/planmemo.py)."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, cast

from ..fleetvocab import held_sources
from ..placement import (
    DeviceView,
    ModelView,
    NodeView,
    PartView,
    ReplicaView,
    Snapshot,
)
from ..store.models import spec_of
from .drain import cordoned, draining_nodes, is_draining, replica_nodes
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
    each node's view places as the one before it did, report time aside
    (control/planmemo.py ``PlanMemo``)."""

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
            if hit is None or inputs_of(hit[2]) != inputs_of(view):
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


def inputs_of(view: NodeView) -> tuple[Any, ...]:
    """What placement reads of a node view but its name and report time."""
    return (view.devices, view.engines, view.fabric, view.weights, view.shared_weights,
            view.cordoned)


class ReplicaMemo(Memo):
    """Replica views (:func:`replica_view`), with a quicker hit first: the same row object
    with the same worker parts object and its model's current definition, while the
    draining nodes stay the same, is the view made of it last pass, its values not read
    again (4,000 replicas a pass). The leader's view never changes a replica's record in
    place (control/incremental.py: a changed row gets a new record, unchanged parts keep
    their list) and a full read's rows are new objects."""

    def __init__(self) -> None:
        super().__init__()
        self.quick: dict[int, tuple[Any, Any, Any, ReplicaView]] = {}
        self.leaving: frozenset[str] = frozenset()
        self.last: tuple[tuple[Any, ...], tuple[ReplicaView, ...]] = ((), ())  # inputs, views
        self.made = 0                   # views not taken by the quick hit, for tests

    def views(self, rows: list[Any], parts: dict[str, list[Any]], leaving: set[str],
              current: dict[str, str | None]) -> tuple[ReplicaView, ...]:
        if leaving != self.leaving:
            self.quick, self.leaving = {}, frozenset(leaving)
        self.keep(rows)
        quick, kept, out = self.quick, {}, []
        for r in rows:
            mine, hash_ = parts.get(r.id, _NO_PARTS), current.get(r.model)
            hit = quick.get(id(r))
            if hit is not None and hit[0] is r and hit[1] is mine and hit[2] == hash_:
                view = hit[3]
            else:
                view = replica_view(r, mine, leaving, current, self)
                self.made += 1
            kept[id(r)] = (r, mine, hash_, view)
            out.append(view)
        self.quick = kept
        self.last = ((rows, parts, leaving, current), tuple(out))
        return self.last[1]


_NO_PARTS: tuple[Any, ...] = ()
NODES, REPLICAS = NodeMemo(), ReplicaMemo()
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


def replica_view(r: Any, parts: Any, leaving: set[str], current: dict[str, str | None],
                 memo: Memo) -> ReplicaView:
    """The planner's view of a replica's row and worker parts (``leaving``: the draining
    nodes; ``current``: each model's definition), remembered in ``memo`` as node views
    are (``ReplicaMemo.views``)."""
    counts = not is_draining(r) and not (leaving and replica_nodes(r, parts) & leaving)
    old = getattr(r, "definition_hash", None) not in (None, current.get(r.model))
    values = (*_REPLICA_KEY(r), counts, old, *((p.rank, p.node, p.devices) for p in parts))
    view = memo.get(r, values)
    if view is not None:
        return view  # type: ignore[no-any-return]
    return memo.put(r, values, ReplicaView(  # type: ignore[no-any-return]
        id=r.id, model=r.model, node=r.node, devices=ids(r.devices), state=r.state,
        started=r.started, desired=bool(r.desired),
        parts=tuple(PartView(rank=p.rank, node=p.node, devices=ids(p.devices))
                    for p in parts), counts=counts, old=old))


def build(models: list[Any], nodes: list[Any], replicas: list[Any], now: float,
          node_timeout_s: float, *, parts: dict[str, list[Any]],
          replace_after_s: float, backoff: tuple[float, float],
          unusable: dict[str, str] | None = None,
          targets: dict[str, int] | None = None,
          nodes_since: tuple[int, int, frozenset[str]] | None = None,
          leaving: set[str] | None = None) -> Snapshot:
    """The planner's snapshot; ``parts`` are the worker parts by replica id (every caller
    must pass them, or the nodes of multi-node replicas would look free). ``targets``:
    the replicas each model keeps in this pass (a rollout's, control/steps.py), else what
    it wants. A draining replica, or one on a draining node, holds its devices but is not
    one of its model's replicas (so its replacement is placed). ``nodes_since``: the
    leader's view's ``Fleet.nodes_since``, with ``nodes`` its nodes in its order.
    ``leaving``: the draining nodes, when the caller knows them (``steps.Pass``)."""
    targets = targets or {}
    by_model: dict[str, list[Any]] = {}
    if any(m.name not in targets for m in models):      # what they want, not a roll's
        for rep in replicas:
            by_model.setdefault(rep.model, []).append(rep)
    if leaving is None:
        leaving = draining_nodes(nodes)
    current = {m.name: getattr(m, "definition_hash", None) for m in models}
    model_views = tuple(
        ModelView(spec=spec_of(m),
                  wanted=targets[m.name] if m.name in targets
                  else wanted_replicas(m, by_model.get(m.name, []), now),
                  parked=bool(m.parked),
                  hold_starts=in_backoff(m.consecutive_failures, m.last_failure_at, now,
                                         *backoff))
        for m in models)
    replica_views = REPLICAS.views(replicas, parts, leaving, current)
    views, bad = node_views(nodes, nodes_since)
    if unusable is not None:
        unusable.update(bad)
    return Snapshot(models=model_views, nodes=views,
                    replicas=replica_views, now=now, node_timeout_s=node_timeout_s,
                    replace_after_s=replace_after_s)
