"""The reconciler: its own process, one per control host (``llmgw server`` starts it next
to the web workers), so agent reports and the API never wait behind a reconcile pass.

Every reconciler tries to take the leader lease each cycle; only the holder acts, and every
write it makes re-checks the lease in the same transaction (fencing), so two instances
never both act. A pass is the fleet layer's read -> decide -> write (``control/fleet.py``)."""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import subprocess
import sys
import threading
import uuid
from types import FrameType

from ..errors import StoreError
from ..store import Store, repo
from . import fleet, history
from .config import ControlConfig
from .decide import Changes, Settings
from .gpu_hours import DeviceClock
from .tracing import passes

log = logging.getLogger(__name__)

LEASE = "reconciler"


class Reconciler:
    def __init__(self, store: Store, config: ControlConfig, holder: str | None = None) -> None:
        self.store = store
        self.config = config
        self.settings = Settings.of(config)
        self.holder = holder or f"{config.holder}:{uuid.uuid4().hex[:6]}"
        self.is_leader = False
        self._stop = threading.Event()
        self._last_error: str | None = None
        self._warned: dict[str, tuple[str, float]] = {}
        # the fleet's history: a point per minute (control/history.py)
        self.history = history.Recorder(config.history_days, self.settings.node_timeout_s)
        self.device_clock = DeviceClock(config)     # GPU-hours (control/gpu_hours.py)
        self.passes = passes(config)    # a span per pass, with LLMGW_OTEL_ENDPOINT

    # ------------------------------------------------------------ one cycle

    def run_cycle(self) -> bool:
        """Try to lead; when leading, reconcile once. Returns whether this instance led."""
        with self.store.begin() as conn:
            now = self.store.now(conn)
            leader = repo.try_lease(conn, LEASE, self.holder, now, self.config.lease_ttl_s)
        if leader != self.is_leader:
            log.info("%s %s leadership", self.holder, "took" if leader else "lost")
            self.is_leader = leader
        if not leader:
            self.device_clock.flush(self.store)     # what it counted while leading
            return False
        with self.store.begin() as conn:
            now = self.store.now(conn)
            if not repo.holds_lease(conn, LEASE, self.holder, now, lock=True):
                self.is_leader = False
                return False
            changes, seen = fleet.reconcile(conn, now, self.settings)
            self.device_clock.observe(conn, now, seen.nodes.values())
        self._log_placement(changes, now)
        self.history.tick(self.store, now)
        return True

    def _log_placement(self, changes: Changes, now: float) -> None:
        """Log a model that cannot be placed when its reason changes, else at most every
        ``placement_warning_every_s`` (not every tick: a cluster once logged "no placement"
        250 times)."""
        every_s = self.config.placement_warning_every_s
        for model, reason in changes.unplaceable.items():
            if reason is None:
                self._warned.pop(model, None)
                continue
            last = self._warned.get(model)
            if last is None or last[0] != reason or now - last[1] >= every_s:
                log.warning("model %s cannot be placed: %s", model, reason)
                self._warned[model] = (reason, now)

    def release(self) -> None:
        self.device_clock.flush(self.store)
        try:
            with self.store.begin() as conn:
                repo.release_lease(conn, LEASE, self.holder)
        except StoreError:
            pass
        self.is_leader = False

    # ------------------------------------------------------------ the loop

    def run_forever(self) -> None:
        while not self._stop.is_set():
            try:
                if self.passes is None:
                    self.run_cycle()
                else:
                    self.passes.run(self.run_cycle, self.holder)
                self._last_error = None
            except StoreError as exc:
                if str(exc) != self._last_error:
                    log.warning("reconcile cycle failed: %s", exc)
                    self._last_error = str(exc)
                self.is_leader = False
            except Exception:
                log.exception("reconcile cycle failed unexpectedly; continuing")
                self.is_leader = False
            self._stop.wait(self.config.reconcile_interval_s)
        self.release()

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run_forever, name="llmgw-reconcile", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self._stop.set()


# ---------------------------------------------------------------- its own process


def config_env(config: ControlConfig) -> dict[str, str]:
    """``config`` as the ``LLMGW_*`` variables that load it again (for the process)."""
    out = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        text = ("true" if value else "false") if isinstance(value, bool) else str(value)
        out["LLMGW_" + f.name.upper()] = text
    return out


def start_process(config: ControlConfig) -> subprocess.Popen[bytes]:
    """Start the reconciler in a process of its own (``python -m
    llmgw_runtime.control.reconcile``), sharing no state or connections with the web
    workers; its log lines go where the server's go."""
    env = {**os.environ, **config_env(config)}
    return subprocess.Popen([sys.executable, "-m", "llmgw_runtime.control.reconcile"],
                            env=env, stdin=subprocess.DEVNULL)


def main() -> int:
    """The reconciler process: its own store connection pool; SIGTERM ends it after the
    current cycle and releases the lease, so another instance takes over at once."""
    from .. import settings

    logging.basicConfig(level=logging.INFO,
                        format="[%(asctime)s] [%(process)d] [reconciler] %(message)s")
    config = settings.load(ControlConfig)
    reconciler = Reconciler(Store(config.store_url), config)

    def on_signal(signum: int, frame: FrameType | None) -> None:
        reconciler.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info("reconciler %s started (pid %d)", reconciler.holder, os.getpid())
    try:
        reconciler.run_forever()
    finally:
        reconciler.store.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
