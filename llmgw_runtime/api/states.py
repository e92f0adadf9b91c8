"""Replica and model states: written once, used by the agent, control, router and ctl.

``StrEnum`` members compare equal to their text, so rows read from the store ("ready")
and enum members can be compared directly."""

from __future__ import annotations

from enum import StrEnum


class ReplicaState(StrEnum):
    """What the control service records of a replica (the ``replicas.state`` column)."""

    PENDING = "pending"
    FETCHING = "fetching"
    STARTING = "starting"
    READY = "ready"
    FAILED = "failed"
    STOPPING = "stopping"
    # A router could not connect to it; not routed until a report of its agent, received
    # after the mark, says ready again (docs/api.md, POST /api/v1/unreachable).
    UNREACHABLE = "unreachable"


class ReportedState(StrEnum):
    """What an agent may say of a replica it runs."""

    FETCHING = "fetching"
    STARTING = "starting"
    READY = "ready"
    FAILED = "failed"
    STOPPED = "stopped"


class ModelState(StrEnum):
    """The one answer to "what is this model doing" (routes, ctl, the console)."""

    READY = "ready"
    STARTING = "starting"
    ACTIVATING = "activating"
    IDLE = "idle"
    PARKED = "parked"
    UNPLACEABLE = "unplaceable"
    STOPPED = "stopped"


class Activation(StrEnum):
    """The answer to an activation request."""

    STARTING = "starting"
    READY = "ready"
    ACTIVATING = "activating"
    PARKED = "parked"
    UNPLACEABLE = "unplaceable"
    IDLE = "idle"
    STOPPED = "stopped"


# Replicas that hold their devices and count as the model's: an unreachable one is still
# running as far as its node knows, until its agent says otherwise.
LIVE_REPLICA_STATES = (ReplicaState.FETCHING, ReplicaState.STARTING, ReplicaState.READY,
                       ReplicaState.UNREACHABLE)
