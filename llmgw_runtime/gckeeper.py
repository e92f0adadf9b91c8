"""Keep Python's cyclic garbage collector from stopping a process that holds a large fleet.

A control web worker at 10,000 nodes holds about a million objects that live long: each
node's last report and answer, the credential caches, the fleet the status summary keeps.
The collector's full collection walks every one of them. Measured at 10,000 agents every
2 s on this 2-core machine (bench/control_bench.py, a ``gc.callbacks`` probe): 43-47 full
collections in 4 minutes across the two web workers, 0.3 to 1.7 s each, and each stops
every request of its worker; those stops were the report p99 of hundreds of ms. The
reconciler, which keeps the fleet in memory, stops the same way inside its passes.

So the keeper takes what lives long out of that walk. Every ``freeze_every_s`` it collects
the young generations (their garbage is not kept) and freezes whatever is still tracked
(``gc.freeze``): the full collections that follow walk only what was made since, a few
seconds' worth. With it the same run saw 3 full collections (30, of at most 0.2 s, when
freezing every 5 s); b's report p99 went from 0.45-0.8 s to 0.12-0.19 s and the
reconciler's pass p99 from 1.1-1.4 s to 0.5-0.85 s (docs/performance.md). A cycle that
was alive when frozen and dropped later is not freed by those collections, so every
``unfreeze_every_s`` the keeper unfreezes everything and runs one full collection: one
stop of the old length every quarter of an hour, instead of one every few seconds, and no
garbage kept longer than that. Reference counting frees everything else at once, frozen or
not.

The young collections were long too: a web worker holds one keep-alive connection per
agent, and each idle connection's wait (a gevent timeout, its timer, a ``TimeoutError``)
and last request lived the seconds between an agent's reports, so a young collection
walked 75,000-108,000 such objects: 50-220 ms stops, up to 110 ms of CPU each (a
``gc.callbacks`` probe in b at 10,000 agents). The server now drops a served request
before it waits, and that wait is an untimed read whose deadline a sweeper per worker
keeps (router/http/server.py ``Waiting``), so an idle connection leaves almost nothing
young. Freezing every 0.25 s instead of 2 s had cut those stops too, but the churn runs
after it were worse than those before (docs/performance.md, stop 40), so the interval
stays 2 s.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)

FREEZE_EVERY_S = 2.0
UNFREEZE_EVERY_S = 900.0


class Keeper:
    def __init__(self, freeze_every_s: float = FREEZE_EVERY_S,
                 unfreeze_every_s: float = UNFREEZE_EVERY_S) -> None:
        self.freeze_every_s = freeze_every_s
        self.unfreeze_every_s = unfreeze_every_s
        self.thawed_at: float | None = None     # the last full collection (monotonic)
        self.ticked_at: float | None = None     # the last tick (monotonic)
        self.stopped = threading.Event()
        self.thread: threading.Thread | None = None

    def tick(self, now: float) -> None:
        """Freeze what lives; first, once ``unfreeze_every_s`` has passed since the last
        time, unfreeze everything and collect it all (``now``: a monotonic clock)."""
        self.ticked_at = now
        if self.thawed_at is None:
            self.thawed_at = now
        elif now - self.thawed_at >= self.unfreeze_every_s:
            self.thawed_at = now
            gc.unfreeze()
            started = time.perf_counter()
            freed = gc.collect()
            log.info("garbage collector: the full collection of everything took %.2f s and "
                     "freed %d objects", time.perf_counter() - started, freed)
        gc.collect(1)
        gc.freeze()

    def due(self, now: float) -> bool:
        """Whether a tick is due at ``now`` (monotonic), for a caller that ticks the keeper
        itself between its own work (the reconciler: :func:`paused` passes)."""
        return self.ticked_at is None or now - self.ticked_at >= self.freeze_every_s

    def start(self) -> None:
        """Tick every ``freeze_every_s`` on a thread of its own (a greenlet in a gevent
        worker), from now on."""
        self.tick(time.monotonic())
        self.thread = threading.Thread(target=self._run, name="llmgw-gc", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.stopped.set()

    def _run(self) -> None:
        while not self.stopped.wait(self.freeze_every_s):
            self.tick(time.monotonic())


@contextmanager
def paused() -> Iterator[None]:
    """The cyclic collector paused while a burst of short-lived objects is made (a status
    summary's ~100,000, a reconcile pass's): each collection inside it would walk what the
    burst holds so far and what was made since the last freeze, and a full one the same
    (28-110 ms at 10,000 nodes, one in a few passes). Reference counting frees them as
    always; the next collection, or the keeper's next tick, after it takes any cycle."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
