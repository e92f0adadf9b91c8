"""Least-outstanding-requests balancing across a model's ready endpoints. Pure and small.

State is per worker process (each gunicorn worker has its own balancer). ``acquire``
records the last use of the chosen replica under the lock it already holds. A replica this
worker could not connect to is marked down: skipped until a routes table no longer lists
it (the control service has taken it out) or ``DOWN_COOL_DOWN_S`` passes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

DOWN_COOL_DOWN_S = 30.0


@dataclass(frozen=True)
class Endpoint:
    replica_id: str
    url: str
    slots: int | None = None     # requests it serves at once; None: unknown, not limited


class Balancer:
    """Counts outstanding requests per replica and remembers when each was last used."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._outstanding: dict[str, int] = {}
        self._last_used: dict[str, float] = {}
        self._down: dict[str, tuple[float, str]] = {}   # replica id -> (until, why)
        self._turn = 0  # rotates the start so ties do not always pick the first endpoint

    def acquire(self, endpoints: Sequence[Endpoint],
                avoid: Collection[str] = ()) -> Endpoint | None:
        """The endpoint with the fewest outstanding requests, preferring those not in
        ``avoid`` (replicas that already failed this request); None when there is none."""
        if not endpoints:
            return None
        with self._lock:
            candidates = [e for e in endpoints if e.replica_id not in avoid] or list(endpoints)
            n = len(candidates)
            self._turn = (self._turn + 1) % n if n else 0
            best: Endpoint | None = None
            best_count = 0
            for i in range(n):
                ep = candidates[(self._turn + i) % n]
                count = self._outstanding.get(ep.replica_id, 0)
                if best is None or count < best_count:
                    best, best_count = ep, count
            assert best is not None
            self._outstanding[best.replica_id] = best_count + 1
            self._last_used[best.replica_id] = self._clock()
            return best

    def touch(self, replica_id: str) -> None:
        """``replica_id`` was just sent a request chosen elsewhere (admission)."""
        with self._lock:
            self._last_used[replica_id] = self._clock()

    def release(self, replica_id: str) -> None:
        with self._lock:
            count = self._outstanding.get(replica_id, 0) - 1
            if count > 0:
                self._outstanding[replica_id] = count
            else:
                self._outstanding.pop(replica_id, None)

    def outstanding(self, replica_id: str) -> int:
        with self._lock:
            return self._outstanding.get(replica_id, 0)

    def last_used(self) -> dict[str, float]:
        """Replica id -> last use (Unix seconds), only for replicas used since start."""
        with self._lock:
            return dict(self._last_used)

    def forget_except(self, replica_ids: Collection[str]) -> None:
        """Drop last-use records and down marks of replicas no longer in the routes table
        (outstanding counts drain by themselves). A replica listed again later was
        reported ready by its agent after it left: it is tried again."""
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
