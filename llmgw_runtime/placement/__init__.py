"""Placement: a pure function from a snapshot of the fleet to a plan."""

from .model import (
    ACTIVE,
    CPU_CLASS,
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

__all__ = ["ACTIVE", "CPU_CLASS", "DeviceView", "ModelView", "NodeView", "PartStart", "PartView",
           "Plan", "ReplicaView", "Snapshot", "Start", "place"]
