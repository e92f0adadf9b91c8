"""What the planner reads and writes: plain frozen views of the fleet, and the plan.

The control service builds a Snapshot from the store (control/snapshot.py); tests and the
benchmark build them directly. Nothing here does I/O or reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..api.catalog import ModelSpec


@dataclass(frozen=True)
class DeviceView:
    id: int                     # placement id: card index, or 1000 + 100 x card + instance
    klass: str
    memory_total_mb: int
    memory_used_mb: int = 0
    healthy: bool = True


@dataclass(frozen=True)
class NodeView:
    name: str
    devices: tuple[DeviceView, ...]
    engines: tuple[str, ...]
    last_report: float | None
    fabric: str | None = None
    # Catalog sources this node's agent found complete on local storage. None: the agent was
    # never told where to look (it ranks with one that looked and found nothing).
    weights: frozenset[str] | None = None
    # Sources it found on a shared filer (nfs, lustre, ...): they count for its whole fabric.
    shared_weights: frozenset[str] = frozenset()
    # Cordoned or draining (``ctl nodes cordon``/``drain``): its devices are no capacity for
    # new replicas; what runs there keeps running until it is moved.
    cordoned: bool = False
    # The classes of its devices, in name order: made once with the view (the planner asks
    # every pass, of every node).
    classes: tuple[str, ...] = field(init=False, repr=False, compare=False)
    # Its healthy devices by class, made once with the view too: the planner's index of a
    # class counts them on every node that has one (10,000 nodes each time it places).
    healthy: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "classes", tuple(sorted({d.klass for d in self.devices})))
        healthy = dict.fromkeys(self.classes, 0)
        for dev in self.devices:
            healthy[dev.klass] += dev.healthy
        object.__setattr__(self, "healthy", healthy)

    def reported(self, last_report: float | None) -> NodeView:
        """This view with another report time: a copy, made without the work of a new one
        (a node reports every few seconds; nothing else of its view moves)."""
        new = object.__new__(NodeView)
        new.__dict__.update(self.__dict__, last_report=last_report)
        return new


@dataclass(frozen=True)
class PartView:
    """A worker part (rank >= 1) of a multi-node replica; rank 0 is the replica itself."""

    rank: int
    node: str
    devices: tuple[int, ...]


@dataclass(frozen=True)
class ReplicaView:
    id: str
    model: str
    node: str                   # the head node (rank 0)
    devices: tuple[int, ...]
    state: str
    started: float
    desired: bool = True
    parts: tuple[PartView, ...] = ()
    # Whether it is one of its model's replicas: False while it drains, or while it leaves
    # a draining node (it still holds its devices, and its model gets a replacement).
    counts: bool = True
    # It runs an older definition of its model (a rollout replaces it): it counts, but
    # spreading the new replicas does not avoid its node.
    old: bool = False


@dataclass(frozen=True)
class ModelView:
    spec: ModelSpec
    wanted: int                 # replicas the model should have now
    parked: bool = False
    hold_starts: bool = False   # in backoff after a failure: start nothing new yet


@dataclass(frozen=True)
class Snapshot:
    models: tuple[ModelView, ...]
    nodes: tuple[NodeView, ...]
    replicas: tuple[ReplicaView, ...]
    now: float
    node_timeout_s: float = 30.0     # silent longer than this: the node is not capacity
    replace_after_s: float = 120.0   # silent longer than this: its replicas are replaced


@dataclass(frozen=True)
class PartStart:
    rank: int
    node: str
    devices: tuple[int, ...]


@dataclass(frozen=True)
class Start:
    model: str
    node: str                        # head node (rank 0)
    devices: tuple[int, ...]
    parts: tuple[PartStart, ...] = ()   # worker nodes of a multi-node replica, rank 1..n-1
    why: str = ""                    # operator words: why here ("holds the weights; ...")


@dataclass
class Plan:
    starts: list[Start] = field(default_factory=list)
    stops: list[str] = field(default_factory=list)          # replica ids
    stop_reasons: dict[str, str] = field(default_factory=dict)  # replica id -> why
    unplaceable: dict[str, str] = field(default_factory=dict)   # model -> reason
