"""What one worker knows of a model's replicas beyond the routes table: which it may use
and when each was last used. Small, and no I/O.

Admission chooses the replica (``admission/``); this only narrows what it may choose from
and records what it chose. A replica this worker could not connect to is marked down
(:meth:`Balancer.mark_down`) and left out of :meth:`Balancer.usable` until a routes table no
longer lists it (the control service has taken it out) or ``DOWN_COOL_DOWN_S`` passes.
Each request sent records its replica's last use (:meth:`Balancer.touch`), which the
routes tick hands the control service as the idle map (what it parks idle replicas by).
State is per worker process (each gunicorn worker has its own).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Sequence

from ..api.router import Endpoint  # a replica of the routes table (url without a final /)

DOWN_COOL_DOWN_S = 30.0


class Balancer:
    """Replicas marked down, and when each replica was last sent a request."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._last_used: dict[str, float] = {}
        self._down: dict[str, tuple[float, str]] = {}   # replica id -> (until, why)

    def touch(self, replica_id: str) -> None:
        """``replica_id`` was just sent a request (admission chose it)."""
        with self._lock:
            self._last_used[replica_id] = self._clock()

    def last_used(self) -> dict[str, float]:
        """Replica id -> last use (Unix seconds), only for replicas used since start."""
        with self._lock:
            return dict(self._last_used)

    def forget_except(self, replica_ids: Collection[str]) -> None:
        """Drop last-use records and down marks of replicas no longer in the routes table.
        A replica listed again later was reported ready by its agent after it left: it is
        tried again."""
        with self._lock:
            for rid in [r for r in self._last_used if r not in replica_ids]:
                del self._last_used[rid]
            for rid in [r for r in self._down if r not in replica_ids]:
                del self._down[rid]

    def mark_down(self, replica_id: str, why: str,
                  cool_down_s: float = DOWN_COOL_DOWN_S) -> bool:
        """Skip ``replica_id`` for ``cool_down_s``; True when it was not marked already."""
        with self._lock:
            fresh = self._down_locked(replica_id) is None
            self._down[replica_id] = (self._clock() + cool_down_s, why)
            return fresh

    def _down_locked(self, replica_id: str) -> str | None:
        mark = self._down.get(replica_id)
        if mark is None:
            return None
        if self._clock() >= mark[0]:
            del self._down[replica_id]
            return None
        return mark[1]

    def down(self, replica_id: str) -> str | None:
        """Why ``replica_id`` is marked down, or None when it is not."""
        with self._lock:
            return self._down_locked(replica_id)

    def usable(self, endpoints: Sequence[Endpoint]) -> tuple[Endpoint, ...]:
        """The endpoints not marked down."""
        with self._lock:
            return tuple(e for e in endpoints if self._down_locked(e.replica_id) is None)
