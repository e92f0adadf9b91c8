"""Placement: a pure function from a snapshot of the fleet to a plan."""

from .plan import (
    DeviceView,
    ModelView,
    NodeView,
    Plan,
    ReplicaView,
    Snapshot,
    Start,
    place,
)

__all__ = ["DeviceView", "ModelView", "NodeView", "Plan", "ReplicaView", "Snapshot", "Start",
           "place"]
