"""A continuous writer through ``Store.write`` (the retry path) for the failover tests and
the store benchmark: it records which rows were acknowledged and when, so a test can ask
how long writes stopped and whether an acknowledged row was lost."""

from __future__ import annotations

import threading
import time

import sqlalchemy as sa

from llmgw_runtime.errors import StoreError
from llmgw_runtime.store import Store

TABLE = "failover_probe"


def create_table(store: Store) -> None:
    with store.begin() as conn:
        conn.execute(sa.text(f"CREATE TABLE IF NOT EXISTS {TABLE} "
                             "(run TEXT NOT NULL, n INTEGER NOT NULL, PRIMARY KEY (run, n))"))


class WriteProbe:
    """Inserts 1, 2, 3, ... into ``failover_probe``, one transaction each, as fast as the
    store acknowledges them (``interval_s`` apart at most)."""

    def __init__(self, store: Store, interval_s: float = 0.02, run: str = "run") -> None:
        self.store = store
        self.interval_s = interval_s
        self.run_id = run
        self.acked: list[tuple[int, float, float]] = []   # (row, started, acknowledged)
        self.errors: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="write-probe", daemon=True)
        create_table(store)

    def start(self) -> WriteProbe:
        self._thread.start()
        return self

    def _loop(self) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1

            def insert(conn: sa.Connection, n: int = n) -> None:   # idempotent: retried
                conn.execute(sa.text(f"INSERT INTO {TABLE} (run, n) VALUES (:r, :n) "
                                     "ON CONFLICT DO NOTHING"), {"r": self.run_id, "n": n})
            started = time.monotonic()
            try:
                self.store.write(insert)
                self.acked.append((n, started, time.monotonic()))
            except StoreError as exc:
                self.errors.append((time.monotonic(), str(exc)))
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)

    def wait_acked_after(self, t: float, count: int = 3, timeout: float = 60) -> float:
        """Wait until ``count`` writes begun after ``t`` were acknowledged; returns when the
        first of them was (writes resumed: a write in flight at ``t`` and retried through the
        failover ends just before it)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            after = [at for _, began, at in self.acked if began > t]
            if len(after) >= count:
                return after[0]
            time.sleep(0.05)
        raise AssertionError(f"writes did not resume within {timeout:.0f} s of the failure; "
                             f"last errors: {self.errors[-3:]}")

    def longest_pause(self, since: float) -> float:
        """The longest time without an acknowledged write from ``since`` on: the outage a
        failure at ``since`` caused (a clean stop keeps acknowledging for a moment)."""
        times = [since] + sorted(at for _, _, at in self.acked if at > since)
        return max((b - a for a, b in zip(times, times[1:], strict=False)), default=0.0)

    def lost(self, store: Store) -> list[int]:
        """Acknowledged rows the store does not have (read through ``store``)."""
        with store.begin() as conn:
            have = {r[0] for r in conn.execute(
                sa.text(f"SELECT n FROM {TABLE} WHERE run = :r"), {"r": self.run_id})}
        return sorted(n for n, _, _ in self.acked if n not in have)
