"""Least-outstanding-requests balancing across a model's ready endpoints. Pure and small.

State is per worker process (each gunicorn worker has its own balancer). ``acquire``
records the last use of the chosen replica under the lock it already holds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Endpoint:
    replica_id: str
    url: str


class Balancer:
    """Counts outstanding requests per replica and remembers when each was last used."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._outstanding: dict[str, int] = {}
        self._last_used: dict[str, float] = {}
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
        """Drop last-use records of replicas no longer in the routes table (outstanding
        counts drain by themselves)."""
        with self._lock:
            for rid in [r for r in self._last_used if r not in replica_ids]:
                del self._last_used[rid]
