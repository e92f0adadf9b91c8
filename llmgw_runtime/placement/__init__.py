"""Placement: a pure function from a snapshot of the fleet to a plan."""

from .model import (
    DeviceView,
    ModelView,
    NodeView,
    PartStart,
    PartView,
    Plan,
    ReplicaView,
    Snapshot,
    Start,
)
from .plan import place

__all__ = ["DeviceView", "ModelView", "NodeView", "PartStart", "PartView", "Plan",
           "ReplicaView", "Snapshot", "Start", "place"]
