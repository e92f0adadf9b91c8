"""What the planner's capacity bookkeeping (capacity.py) reads of the nodes alone: their
names in rank order, which report and take replicas, the classes each has, and what later
queries count of them (who holds which weights; healthy devices per class, from the views).

None of it depends on the replicas, so a pass that places again because replicas changed,
over nodes whose placement inputs and liveness did not (control/snapshot.py ``PlanMemo``:
a churning fleet), hands the last pass's ``NodeBase`` to the planner instead of walking
10,000 nodes again. Made lazily: a pass that places nothing never builds one.
"""

from __future__ import annotations

from ..fleetvocab import heard_from
from .model import NodeView, Snapshot

Group = str | None          # a fabric name; None groups the nodes that have no fabric


class NodeBase:
    """The nodes of ``snap`` as capacity.py reads them, computed at :meth:`built`."""

    def __init__(self, snap: Snapshot) -> None:
        self._snap: Snapshot | None = snap
        self.views: dict[str, NodeView] = {}
        self.names: list[str] = []                  # rank -> name
        self.rank: dict[str, int] = {}
        self.cordoned: list[str] = []               # reporting, taking no new replica
        self.alive: list[int] = []                  # reporting and not cordoned (ranks)
        self.alive_set: frozenset[int] = frozenset()
        self.classes: dict[str, list[int]] = {}     # class -> alive ranks that have one
        # source -> (ranks holding it on their own, fabrics whose filer holds it)
        self.holders: dict[str, tuple[frozenset[int], frozenset[Group]]] | None = None

    def built(self) -> NodeBase:
        """This base, computed from its snapshot on first use."""
        snap = self._snap
        if snap is None:
            return self
        self._snap = None
        self.views = {n.name: n for n in snap.nodes}
        self.names = sorted(self.views)
        self.rank = {name: i for i, name in enumerate(self.names)}
        ranked = [self.views[name] for name in self.names]
        now, timeout = snap.now, snap.node_timeout_s
        reporting = [r for r, view in enumerate(ranked)
                     if heard_from(view.last_report, now, timeout)]
        # A cordoned (or draining) node reports, but takes no new replica.
        self.cordoned = [self.names[r] for r in reporting if ranked[r].cordoned]
        self.alive = [r for r in reporting if not ranked[r].cordoned]
        self.alive_set = frozenset(self.alive)
        for rank in self.alive:
            for klass in ranked[rank].classes:
                self.classes.setdefault(klass, []).append(rank)
        return self

    def holding(self, source: str) -> tuple[frozenset[int], frozenset[Group]]:
        """Ranks of nodes holding ``source`` on their own, and fabrics sharing it (a filer
        seen by any node of the fabric, even a silent one: the filer is still there)."""
        if self.holders is None:
            local: dict[str, set[int]] = {}
            fabrics: dict[str, set[Group]] = {}
            for name, view in self.views.items():
                rank = self.rank[name]
                for src in view.weights or ():
                    local.setdefault(src, set()).add(rank)
                for src in view.shared_weights:
                    if view.fabric is None:     # a node without a fabric shares with itself
                        local.setdefault(src, set()).add(rank)
                    else:
                        fabrics.setdefault(src, set()).add(view.fabric)
            self.holders = {src: (frozenset(local.get(src, ())), frozenset(fabrics.get(src, ())))
                            for src in {*local, *fabrics}}
        return self.holders.get(source, (frozenset(), frozenset()))
