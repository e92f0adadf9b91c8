"""What admission decided of a request, or of a ticket that waited: :class:`Admitted` at
a replica, or :class:`Rejected` with a reason. Below the core (``core.py``, which also
answers :class:`~.core.Queued`) and its queue (``queue.py``, whose tickets hold one), so
neither imports the other to name them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Reason = Literal["queue_full", "timeout", "no_replicas"]


@dataclass(frozen=True)
class Admitted:
    replica: str
    # at the prefix's remembered home (its cache is likely there): for the shell to say so
    # in release(), which keeps the service time of the others apart (what a move costs)
    at_home: bool = field(default=False, compare=False)


@dataclass(frozen=True)
class Rejected:
    reason: Reason
    retry_after_s: int      # whole seconds, at least 1: for the Retry-After header
