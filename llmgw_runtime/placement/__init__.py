"""Placement: a pure function from a snapshot of the fleet to a plan."""

from .explain import counts_by_class, fabric_weights, fabrics_without_copy, nodes_holding
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
           "Plan", "ReplicaView", "Snapshot", "Start", "counts_by_class", "fabric_weights",
           "fabrics_without_copy", "nodes_holding", "place"]
