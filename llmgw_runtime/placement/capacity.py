"""Capacity bookkeeping for the planner: which devices are free, shared or taken, indexed so
that the best node for a replica is found without scanning the fleet.

Nodes are bucketed per (device class, engine) by fabric, by "whole" (nothing runs on the node)
and by how many devices of the class are free; each bucket is a list of node ranks (position
in name order) kept sorted, so a walk in bucket order meets candidates best first.

A device is taken whole, or shared (the CPU class always; another class when the replica
declares memory_gb). A shared device takes at most MAX_REPLICAS_PER_SHARED_DEVICE replicas,
and each with memory_gb only while that much is free on it, so what a fleet can hold is finite
and a plan never holds more starts than the devices can take.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from dataclasses import dataclass
from operator import attrgetter

from ..api.catalog import ModelSpec
from ..fleetvocab import (
    ACTIVE,
    CPU_CLASS,
    MAX_REPLICAS_PER_SHARED_DEVICE,
    shares_device,
)
from .model import DeviceView, NodeView, ReplicaView, Snapshot
from .nodebase import Group, NodeBase

Bucket = tuple[bool, int]   # (whole, free devices of the class)


def silence(node: NodeView | None, now: float) -> float:
    """Seconds since the node last reported; infinite when it never did or is unknown."""
    if node is None or node.last_report is None:
        return math.inf
    return now - node.last_report


def _device_id(dev: DeviceView) -> int:
    return dev.id


def replica_nodes(rep: ReplicaView) -> tuple[str, ...]:
    return (rep.node, *(p.node for p in rep.parts))


class _Dev:
    """One healthy device of a node: what is free on it and who uses it."""

    __slots__ = ("id", "klass", "free_gb", "users", "exclusive")

    def __init__(self, id_: int, klass: str, free_gb: float) -> None:
        self.id = id_
        self.klass = klass
        self.free_gb = free_gb
        self.users = 0
        self.exclusive = False

    @property
    def joinable(self) -> bool:
        """Another shared replica may join it (memory aside)."""
        return not self.exclusive and self.users < MAX_REPLICAS_PER_SHARED_DEVICE


class NodeState:
    """A reporting node: its healthy devices by class and what runs on it."""

    __slots__ = ("name", "rank", "fabric", "engines", "by_class", "users", "blocked")

    def __init__(self, view: NodeView, rank: int) -> None:
        self.name = view.name
        self.rank = rank
        self.fabric = view.fabric
        self.engines = tuple(sorted(set(view.engines)))
        self.by_class: dict[str, list[_Dev]] = {}
        for dev in sorted(view.devices, key=_device_id):
            if dev.healthy:
                self.by_class.setdefault(dev.klass, []).append(_Dev(
                    dev.id, dev.klass, (dev.memory_total_mb - dev.memory_used_mb) / 1024.0))
        self.users = 0          # replicas and parts on the node
        self.blocked = False    # used whole by a multi-node replica

    @property
    def whole(self) -> bool:
        return self.users == 0 and not self.blocked

    def free(self, klass: str) -> int:
        return sum(1 for d in self.by_class.get(klass, ()) if d.users == 0)


@dataclass(frozen=True)
class Request:
    """One replica to place."""

    klass: str
    engine: str
    gpus: int
    nodes: int
    memory_gb: float | None
    source: str
    spread: bool = False
    on_node: tuple[tuple[str, int], ...] = ()       # this model's replicas per node
    in_fabric: tuple[tuple[str, int], ...] = ()     # ... and per fabric

    @property
    def shareable(self) -> bool:
        return shares_device(self.klass, self.memory_gb)

    @property
    def signature(self) -> tuple[str, str, int, int, float | None]:
        """Requests with one signature fit the same nodes (ranking aside)."""
        return (self.klass, self.engine, self.gpus, self.nodes, self.memory_gb)


@dataclass(frozen=True)
class Choice:
    node: str
    devices: tuple[int, ...]
    fabric: str | None
    holds: bool             # the node (or, multi-node, some chosen node) holds the weights
    whole: bool             # the node was whole (nothing running) before this placement
    takes_free: int         # free devices this placement takes (fewer: shares used ones)
    left: int               # free devices of the class left on the node after it
    on_node: int = 0        # other replicas of the model on the node (spread)
    in_fabric: int = 0      # other replicas of the model in the fabric (spread)
    parts: tuple[tuple[str, tuple[int, ...]], ...] = ()
    holders: int = 0        # multi-node: chosen nodes that hold the weights
    # A shared request (the CPU, or memory_gb): the memory (GB) left on its fullest chosen
    # device after it, and the replicas already there; None for devices taken whole.
    free_gb: float | None = None
    sharing: int = 0


@dataclass
class _Fit:
    devices: tuple[int, ...]
    takes_free: int


class _Index:
    """The nodes that have one class and one engine, bucketed for best-first walks."""

    def __init__(self) -> None:
        self.buckets: dict[Group, dict[Bucket, list[int]]] = {}
        self.pos: dict[int, tuple[Group, Bucket]] = {}
        self.members: set[int] = set()
        # Members with a used device that another shared replica may join, by the most memory
        # free on such a device: ``room`` by rank, and (-room, rank) kept sorted, so a request
        # for memory_gb walks only the nodes that may have it.
        self.room: dict[int, float] = {}
        self.by_room: list[tuple[float, int]] = []
        self.maxf = 0

    def set_room(self, rank: int, room: float | None) -> None:
        """Record the node's room for shared replicas (None: it takes no more)."""
        old = self.room.get(rank)
        if old == room:
            return
        if old is not None:
            del self.by_room[bisect_left(self.by_room, (-old, rank))]
            del self.room[rank]
        if room is not None:
            insort(self.by_room, (-room, rank))
            self.room[rank] = room

    def sharing(self, need: float | None) -> list[int]:
        """Ranks of the nodes whose used devices may take a shared replica of ``need`` GB
        (None: any), most room first."""
        out = []
        for neg, rank in self.by_room:
            if need is not None and -neg < need:
                break
            out.append(rank)
        return out

    def put_last(self, rank: int, group: Group, bucket: Bucket) -> None:
        """:meth:`put` of a rank above every rank put so far, not put before (an index
        filled in rank order: 10,000 nodes each time a plan first asks for a class)."""
        self.buckets.setdefault(group, {}).setdefault(bucket, []).append(rank)
        self.pos[rank] = (group, bucket)

    def put(self, rank: int, group: Group, bucket: Bucket | None) -> None:
        old = self.pos.get(rank)
        if old == (group, bucket):
            return
        if old is not None:
            lst = self.buckets[old[0]][old[1]]
            del lst[bisect_left(lst, rank)]
            del self.pos[rank]
        if bucket is not None:
            insort(self.buckets.setdefault(group, {}).setdefault(bucket, []), rank)
            self.pos[rank] = (group, bucket)


class Capacity:
    """The fleet's reporting nodes and what the plan has taken on them so far."""

    def __init__(self, snap: Snapshot, specs: dict[str, ModelSpec],
                 nodes: NodeBase | None = None) -> None:
        """``nodes``: what is read of ``snap``'s nodes alone, when a caller kept it from a
        snapshot whose nodes place as these do (control/snapshot.py ``PlanMemo``)."""
        base = (nodes or NodeBase(snap)).built()
        self.base = base
        self.views, self.names, self.rank = base.views, base.names, base.rank
        self.cordoned, self.alive, self.classes = base.cordoned, base.alive, base.classes
        # A node's devices are read when a query first needs that node; what the existing
        # replicas use is applied then, in replica id order.
        self._states: dict[int, NodeState] = {}
        self._uses: dict[int, list[tuple[tuple[int, ...], ModelSpec | None, bool, bool]]] = {}
        reporting = base.alive_set
        for rep in sorted(snap.replicas, key=attrgetter("id")):
            if not rep.desired or rep.state not in ACTIVE:
                continue
            spec = specs.get(rep.model)
            multi = bool(rep.parts) or (spec is not None and spec.profile.nodes > 1)
            for name, devices in ((rep.node, rep.devices), *((p.node, p.devices)
                                                             for p in rep.parts)):
                rank = self.rank.get(name, -1)
                if rank in reporting:
                    self._uses.setdefault(rank, []).append(
                        (devices, spec, rep.state == "ready", multi))
        self._indexes: dict[tuple[str, str], _Index] = {}

    def node(self, rank: int) -> NodeState:
        """A reporting node's state, read on first use."""
        state = self._states.get(rank)
        if state is None:
            state = self._states[rank] = NodeState(self.views[self.names[rank]], rank)
            for devices, spec, counted, block in self._uses.pop(rank, ()):
                self._apply(state, devices, spec, counted, block)
        return state

    def reporting(self) -> list[NodeState]:
        """Every reporting node, in name order."""
        return [self.node(r) for r in self.alive]

    # -- bookkeeping -----------------------------------------------------------------------

    @staticmethod
    def _apply(node: NodeState, devices: tuple[int, ...], spec: ModelSpec | None,
               counted: bool, block: bool) -> None:
        wanted = set(devices)
        memory = spec.profile.memory_gb if spec is not None else None
        shareable = spec is not None and shares_device(spec.profile.klass, memory)
        for devs in node.by_class.values():
            for dev in devs:
                if dev.id not in wanted:
                    continue
                dev.users += 1
                if not shareable and dev.klass != CPU_CLASS:
                    dev.exclusive = True
                elif memory is not None and not counted:
                    dev.free_gb -= memory   # a ready engine's memory shows in memory_used
        node.users += 1
        node.blocked = node.blocked or block

    def take(self, choice: Choice, spec: ModelSpec) -> None:
        """Record a planned start, so later placements in this plan see it."""
        multi = spec.profile.nodes > 1
        for name, devices in ((choice.node, choice.devices), *choice.parts):
            node = self.node(self.rank[name])
            self._apply(node, devices, spec, counted=False, block=multi)
            for (klass, engine), ix in self._indexes.items():
                if klass in node.by_class and engine in node.engines:
                    self._reindex(ix, node, klass)

    def _reindex(self, ix: _Index, node: NodeState, klass: str) -> None:
        devs = node.by_class[klass]
        rooms = [d.free_gb for d in devs if d.users and d.joinable]
        ix.set_room(node.rank, max(rooms) if rooms and not node.blocked else None)
        free = sum(1 for d in devs if d.users == 0)
        bucket = None if node.blocked or free == 0 else (node.whole, free)
        ix.put(node.rank, node.fabric, bucket)

    def index(self, klass: str, engine: str) -> _Index:
        ix = self._indexes.get((klass, engine))
        if ix is None:
            ix = self._indexes[(klass, engine)] = _Index()
            views, names, states, uses = self.views, self.names, self._states, self._uses
            for rank in self.classes.get(klass, ()):        # in rank order
                view = views[names[rank]]
                healthy = view.healthy.get(klass, 0)
                if not healthy or engine not in view.engines:
                    continue
                ix.members.add(rank)
                if healthy > ix.maxf:
                    ix.maxf = healthy
                if rank in states or rank in uses:
                    self._reindex(ix, self.node(rank), klass)
                else:                           # nothing on it yet: whole, every one free
                    ix.put_last(rank, view.fabric, (True, healthy))
        return ix

    # -- weights ---------------------------------------------------------------------------

    def holders(self, source: str) -> tuple[frozenset[int], frozenset[Group]]:
        """Ranks of nodes holding ``source`` on their own, and fabrics sharing it."""
        return self.base.holding(source)

    def holds(self, node: NodeState, source: str) -> bool:
        return self.rank_holds(node.rank, source)

    def rank_holds(self, rank: int, source: str) -> bool:
        """The node of this rank holds ``source`` (its own copy, or its fabric's filer)."""
        local, fabrics = self.holders(source)
        if rank in local:
            return True
        fabric = self.views[self.names[rank]].fabric
        return fabric is not None and fabric in fabrics

    # -- single-node placement -------------------------------------------------------------

    @staticmethod
    def _fit(node: NodeState, req: Request) -> _Fit | None:
        devs = node.by_class.get(req.klass, ())
        if not req.shareable:
            ids = [d.id for d in devs if d.users == 0][: req.gpus]
            return _Fit(tuple(ids), req.gpus) if len(ids) == req.gpus else None
        need = req.memory_gb
        ok = [d for d in devs if d.joinable and (need is None or d.free_gb >= need)]
        if len(ok) < req.gpus:
            return None
        ok.sort(key=lambda d: (d.users == 0, d.free_gb, d.id))
        chosen = ok[: req.gpus]
        return _Fit(tuple(sorted(d.id for d in chosen)), sum(d.users == 0 for d in chosen))

    def _choice(self, node: NodeState, fit: _Fit, req: Request,
                on_node: dict[str, int], in_fabric: dict[str, int]) -> Choice:
        mine = on_node.get(node.name, 0)
        fab = mine if node.fabric is None else in_fabric.get(node.fabric, 0)
        chosen = [d for d in node.by_class.get(req.klass, ()) if d.id in fit.devices]
        free_gb = None
        if req.shareable and chosen:
            free_gb = min(d.free_gb for d in chosen) - (req.memory_gb or 0.0)
        return Choice(node=node.name, devices=fit.devices, fabric=node.fabric,
                      holds=self.holds(node, req.source), whole=node.whole,
                      takes_free=fit.takes_free, left=node.free(req.klass) - fit.takes_free,
                      on_node=mine, in_fabric=fab, free_gb=free_gb,
                      sharing=max((d.users for d in chosen), default=0))

    @staticmethod
    def _key(c: Choice, rank: int, spread: bool) -> tuple[int, ...]:
        head = (c.on_node, not c.holds, c.in_fabric) if spread else (not c.holds,)
        return (*head, c.whole, c.takes_free, c.left, rank)

    def best_single(self, req: Request) -> Choice | None:
        """The best node for one single-node replica, or None when nothing fits.

        Order: (spread: fewest replicas of the model on the node), holds the weights,
        (spread: fewest in the fabric), not a whole node, takes fewest free devices, leaves
        fewest free devices, node name.

        Each fabric's walk meets its best node with enough free devices; a shared request
        also looks at the nodes whose used devices it may join (only those with the memory
        it needs), so a pass costs what the candidates are, not the size of the fleet.
        """
        ix = self.index(req.klass, req.engine)
        if not ix.members:
            return None
        on_node, in_fabric = dict(req.on_node), dict(req.in_fabric)
        exclude = ({self.rank[n] for n, c in on_node.items() if c and n in self.rank}
                   if req.spread else set())
        local, fabrics = self.holders(req.source)
        best: tuple[tuple[int, ...], Choice] | None = None

        def consider(node: NodeState, fit: _Fit | None) -> None:
            nonlocal best
            if fit is None:
                return
            choice = self._choice(node, fit, req, on_node, in_fabric)
            key = self._key(choice, node.rank, req.spread)
            if best is None or key < best[0]:
                best = (key, choice)

        def sweep(walks: list[tuple[Group, frozenset[int] | None]], holders_only: bool) -> None:
            for group, only in walks:
                found = self._walk(ix, group, req, exclude, only)
                if found is not None:
                    consider(*found)
            shared = [r for r in (ix.sharing(req.memory_gb) if req.shareable else ())
                      if not holders_only or self.holds(self.node(r), req.source)]
            for rank in shared:
                if rank not in exclude:
                    node = self.node(rank)
                    consider(node, self._fit(node, req))

        # Holders first: every node of a fabric whose filer holds the weights, and the nodes
        # holding them on their own in the other fabrics.
        holding = [g for g in fabrics if g in ix.buckets]
        walks: list[tuple[Group, frozenset[int] | None]] = [(g, None) for g in holding]
        if local:
            walks += [(g, local) for g in ix.buckets if g not in holding]
        sweep(walks, holders_only=True)
        if best is None:
            sweep([(g, None) for g in ix.buckets], holders_only=False)
        if best is None:
            for rank in sorted(exclude & ix.members):
                node = self.node(rank)
                consider(node, self._fit(node, req))
        return best[1] if best is not None else None

    def _walk(self, ix: _Index, group: Group, req: Request, exclude: set[int],
              only: frozenset[int] | None = None) -> tuple[NodeState, _Fit] | None:
        """The first node of a fabric (among ``only``, when given), in bucket order, where
        the request fits."""
        buckets = ix.buckets.get(group, {})
        if only is not None:
            # Few nodes hold the weights: order them by bucket (the walk's order) instead of
            found = []
            for rank in only:
                pos = ix.pos.get(rank)
                if pos is not None and pos[0] == group and rank not in exclude \
                        and req.gpus <= pos[1][1] <= ix.maxf:
                    found.append((pos[1], rank))
            for _, rank in sorted(found):      # walking thousands of nodes for them
                node = self.node(rank)
                fit = self._fit(node, req)
                if fit is not None:
                    return node, fit
            return None
        for whole in (False, True):
            for free in range(req.gpus, ix.maxf + 1):
                for rank in buckets.get((whole, free), ()):
                    if rank in exclude or (only is not None and rank not in only):
                        continue
                    node = self.node(rank)
                    fit = self._fit(node, req)
                    if fit is not None:
                        return node, fit
        return None

    # -- multi-node placement --------------------------------------------------------------

    def whole_nodes(self, klass: str, engine: str, gpus: int) -> dict[Group, list[int]]:
        """Whole free nodes with ``gpus`` healthy devices of the class, per fabric."""
        ix = self.index(klass, engine)
        out: dict[Group, list[int]] = {}
        for group, buckets in ix.buckets.items():
            ranks = sorted(r for (whole, free), lst in buckets.items()
                           if whole and free >= gpus for r in lst)
            out[group] = ranks
        return out

    def best_multi(self, req: Request) -> Choice | None:
        """Whole nodes of one fabric for a multi-node replica, or None."""
        in_fabric = dict(req.in_fabric)
        best: tuple[tuple[int, int, int, str], Choice] | None = None
        for fabric, ranks in self.whole_nodes(req.klass, req.engine, req.gpus).items():
            if fabric is None or len(ranks) < req.nodes:
                continue
            local, fabrics = self.holders(req.source)
            if fabric in fabrics:               # the fabric's filer: every node holds it
                chosen = ranks[: req.nodes]
            else:                               # holders first, then by rank
                mine = [r for r in ranks if r in local]
                chosen = (mine + [r for r in ranks if r not in local])[: req.nodes]
            holders = sum(self.rank_holds(r, req.source) for r in chosen)
            spread = in_fabric.get(fabric, 0) if req.spread else 0
            key = (-holders, spread, len(ranks) - req.nodes, fabric)
            nodes = [self.node(r) for r in chosen]
            placed = [(n.name, tuple(d.id for d in n.by_class[req.klass][: req.gpus]))
                      for n in nodes]
            choice = Choice(node=placed[0][0], devices=placed[0][1], fabric=fabric,
                            holds=holders > 0, whole=True, takes_free=req.gpus,
                            left=nodes[0].free(req.klass) - req.gpus,
                            in_fabric=in_fabric.get(fabric, 0), parts=tuple(placed[1:]),
                            holders=holders)
            if best is None or key < best[0]:
                best = (key, choice)
        return best[1] if best is not None else None
