"""Placement: a pure function from a snapshot of the fleet to a plan."""

from .model import (
    ACTIVE,
    CPU_CLASS,
    MAX_REPLICAS_PER_SHARED_DEVICE,
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

__all__ = ["ACTIVE", "CPU_CLASS", "MAX_REPLICAS_PER_SHARED_DEVICE", "DeviceView", "ModelView",
           "NodeView", "PartStart", "PartView", "Plan", "ReplicaView", "Snapshot", "Start",
           "place"]
