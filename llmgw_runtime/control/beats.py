"""The steady nodes' heartbeat writer: a node's refreshed last report time and devices,
from reports and heartbeats answered from a control process's caches (control/reports.py,
control/heartbeat.py), written in batches a fraction of a second later."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection

from ..errors import StoreError
from ..store import Store, repo
from .reports import ReportCache

log = logging.getLogger(__name__)

FLUSH_EVERY_S = 0.25        # how long a refreshed last report time may wait to be written
REWRITE_DEVICES_S = 60.0    # unchanged devices are written again after this long


class Heartbeats:
    """A steady node's refreshed last report time and devices, written in batches.

    Unless :meth:`start` ran (gunicorn workers: control/serve.py), each is written at once.
    A batch never moves a node's last report backwards, nor revives a node whose agent said
    it stopped (``repo.record_heartbeats``); a report written in a transaction drops the
    node's pending heartbeat. A node whose devices differ from what this writer wrote of
    it last is named in the change log (kind telemetry: the reconciler reads its devices
    again); one whose last report time only moved is not, and its devices are not sent
    (most of a steady fleet's batch was their text, quoted, parsed and stored again
    unchanged): unless :data:`REWRITE_DEVICES_S` passed since they were written, or
    the change log named the node since (:meth:`unwritten`: another process may have
    written its devices), so what is stored never lags what the agent said for long."""

    def __init__(self, store_of: Callable[[], Store], stale: Callable[[list[str]], None],
                 every_s: float = FLUSH_EVERY_S) -> None:
        self.store_of = store_of
        self.stale = stale                     # told the nodes whose state moved on
        self.every_s = every_s
        self.pending: dict[str, tuple[float, str]] = {}
        # node -> (hash of the devices written last, when: time.monotonic())
        self.written: dict[str, tuple[int, float]] = {}
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.stopped = threading.Event()
        self._failing = False

    def start(self) -> None:
        self.stopped.clear()
        self.thread = threading.Thread(target=self._run, name="llmgw-heartbeats", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.stopped.set()
        if self.thread is not None:
            self.thread.join(5)
            self.thread = None
        self.flush()

    def put(self, node: str, at: float, devices: str) -> None:
        if self.thread is None:
            stale = self._write({node: (at, devices)})
            if stale:
                self.stale(stale)
            return
        with self.lock:
            self.pending[node] = (at, devices)

    def drop(self, node: str) -> None:
        with self.lock:
            self.pending.pop(node, None)
            self.written.pop(node, None)

    def unwritten(self, nodes: Collection[str] | None) -> None:
        """The change log named ``nodes`` (None: perhaps any node): another process may
        have written their devices, so their next heartbeat sends them again (named in the
        log only if they differ from what this writer wrote last, as always)."""
        with self.lock:
            names = list(self.written) if nodes is None else nodes
            for node in names:
                last = self.written.get(node)
                if last is not None:
                    self.written[node] = (last[0], float("-inf"))

    def _write(self, batch: dict[str, tuple[float, str]]) -> list[str]:
        """Write ``batch``; returns the nodes whose stored state moved on."""
        now = time.monotonic()
        rows: list[tuple[str, float, str | None]] = []
        changed, sent = [], []
        for node, (at, devices) in batch.items():
            code = hash(devices)
            last = self.written.get(node)
            if last is None or last[0] != code:
                changed.append(node)
            if last is None or last[0] != code or now - last[1] >= REWRITE_DEVICES_S:
                rows.append((node, at, devices))
                sent.append((node, (code, now)))
            else:
                rows.append((node, at, None))
        stale = self.store_of().write(
            lambda conn: repo.record_heartbeats(conn, rows, telemetry=changed))
        with self.lock:
            if len(self.written) >= ReportCache.LIMIT:
                self.written.clear()
            self.written.update(sent)
            for node in stale:
                self.written.pop(node, None)
        return stale

    def flush(self) -> int:
        with self.lock:
            batch, self.pending = self.pending, {}
        if not batch:
            return 0
        try:
            stale = self._write(batch)
        except StoreError as exc:
            with self.lock:                    # keep them, unless newer ones came meanwhile
                for node, value in batch.items():
                    self.pending.setdefault(node, value)
            if not self._failing:
                log.warning("writing %d nodes' last reports failed, retrying: %s",
                            len(batch), exc)
            self._failing = True
            return 0
        self._failing = False
        if stale:
            self.stale(stale)
        return len(batch)

    def _run(self) -> None:
        while not self.stopped.wait(self.every_s):
            try:
                self.flush()
            except Exception:                  # never let the writer thread die
                log.exception("writing nodes' last reports failed unexpectedly")
