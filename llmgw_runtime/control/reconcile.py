"""The reconciler: its own process, one per control host (``llmgw server`` starts it next
to the web workers), so agent reports and the API never wait behind a reconcile pass.

Every reconciler tries to take the leader lease each cycle; only the holder acts, and every
write it makes re-checks the lease in the same transaction (fencing), so two instances
never both act. A pass is the fleet layer's read -> decide -> write (``control/fleet.py``),
the read incremental: the leader keeps the fleet in memory and reads what the store's
change log names since its last pass (control/incremental.py), everything when it takes the
lease, when its last pass began more than a lease's time ago and after a failed pass, and
every row once in ``incremental.FULL_EVERY`` passes (a rolling full check). The leader prunes
the change log once a minute, and logs its passes' durations every 10 s."""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from types import FrameType, SimpleNamespace
from typing import Any

from .. import gckeeper
from ..api.states import ReplicaState
from ..errors import StoreError
from ..store import Store, changes, repo
from . import fleet, history, sampler
from .config import ControlConfig
from .decide import Changes, Fleet, Settings
from .gpu_hours import DeviceClock
from .incremental import View
from .tracing import passes

log = logging.getLogger(__name__)

LEASE = "reconciler"
PRUNE_EVERY_S = 60.0        # the change log's old entries go (store/changes.py prune)
TIMINGS_EVERY_S = 10.0      # a log line of the passes' durations


class PassTimes:
    """The durations of the passes that led, logged every ``TIMINGS_EVERY_S`` as
    ``reconcile passes last 10s: n=.. full=.. p50_ms=.. p99_ms=.. max_ms=.. cpu_p50_ms=..
    cpu_p99_ms=..`` (the benchmarks read this line): wall time, and the CPU the pass's
    thread used (the rest of its wall time it waited: for the store, or for a core)."""

    def __init__(self, every_s: float = TIMINGS_EVERY_S) -> None:
        self.every_s = every_s
        self.since = time.monotonic()
        self.times: list[float] = []
        self.cpu: list[float] = []
        self.full = 0

    def add(self, seconds: float, full: bool, cpu_s: float = 0.0) -> None:
        self.times.append(seconds)
        self.cpu.append(cpu_s)
        self.full += int(full)
        now = time.monotonic()
        if now - self.since >= self.every_s:
            log.info("%s", self.line())
            self.since, self.times, self.cpu, self.full = now, [], [], 0

    def line(self) -> str:
        wall, cpu = sorted(self.times) or [0.0], sorted(self.cpu) or [0.0]

        def at(ordered: list[float], q: float) -> float:
            return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

        return (f"reconcile passes last 10s: n={len(self.times)} full={self.full} "
                f"p50_ms={at(wall, 0.5):.1f} p99_ms={at(wall, 0.99):.1f} "
                f"max_ms={wall[-1] * 1000:.1f} cpu_p50_ms={at(cpu, 0.5):.1f} "
                f"cpu_p99_ms={at(cpu, 0.99):.1f}")


def lowered(steps: int, fn: Any, *args: Any) -> None:
    """``fn(*args)`` on this thread with its nice value ``steps`` higher (this thread's
    only: Linux gives each thread its own), as far as 19 goes."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid,
                       min(19, os.getpriority(os.PRIO_PROCESS, tid) + steps))
    except OSError:
        pass            # not lowered: the sample runs at the reconciler's priority
    fn(*args)


def holding_nodes(seen: Fleet, decided: Changes) -> list[Any]:
    """The node rows the device clock needs after a pass: those a replica or worker part
    lives on, as read or as placed by the pass (a superset of what it holds after the
    pass's writes). The clock counts only devices replicas hold (gpu_hours.held), so the
    other nodes change nothing it counts; at 10,000 nodes, making each node's device map
    every pass cost about 100 ms."""
    names = {r.node for r in seen.replicas}
    for parts in seen.parts.values():
        names.update(p.node for p in parts)
    for start in decided.starts:
        names.add(start.node)
        names.update(node for _, node, _ in start.parts)
    return [seen.nodes[n] for n in names if n in seen.nodes]


def holding_after(seen: Fleet, decided: Changes
                  ) -> tuple[list[Any], dict[str, list[Any]]]:
    """The replicas that hold devices once the pass's changes are written (with their
    worker parts), made from what it read and what it decided, as ``fleet.write`` writes
    it: deleted rows go, a stopped replica is ``stopping`` (holding nothing), a start is a
    ``pending`` replica on its devices; drains and undrains keep a replica's state. The
    device clock counts with these instead of reading every replica again after a pass
    that changed some (40 ms at 10,000 nodes, in each pass that starts or stops one)."""
    gone = {*decided.delete_replicas, *(rid for rid, _ in decided.stops)}
    rows: list[Any] = [r for r in seen.replicas if r.id not in gone]
    parts = seen.parts
    if decided.starts:
        parts = dict(parts)
        for start in decided.starts:
            rows.append(SimpleNamespace(id=start.replica_id, model=start.model,
                                        node=start.node, devices=start.devices,
                                        state=ReplicaState.PENDING))
            if start.parts:
                parts[start.replica_id] = [SimpleNamespace(node=node, devices=devices)
                                           for _, node, devices in start.parts]
    return rows, parts


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
        # in the server's reconciler process: the sample's own process (control/sampler.py)
        self.sampler: sampler.Handle | None = None
        self.device_clock = DeviceClock(config)     # GPU-hours (control/gpu_hours.py)
        self.passes = passes(config)    # a span per pass, with LLMGW_OTEL_ENDPOINT
        # the fleet in memory (control/incremental.py); a node's report time read again
        # well before it could say anything else about the node than "heard"
        self.view = View(heard_s=min(config.node_timeout_s, config.replace_after_s))
        self.times = PassTimes()
        # the garbage collector keeper of its process, ticked between passes (main)
        self.keeper: gckeeper.Keeper | None = None
        self._pruned: float | None = None
        self._led_at: float | None = None     # when its last pass began (monotonic)

    # ------------------------------------------------------------ one cycle

    def run_cycle(self) -> bool:
        """Try to lead; when leading, reconcile once. Returns whether this instance led."""
        with self.store.begin() as conn:
            now = self.store.now(conn)
            leader = repo.try_lease(conn, LEASE, self.holder, now, self.config.lease_ttl_s)
        if leader != self.is_leader:
            log.info("%s %s leadership", self.holder, "took" if leader else "lost")
            self.is_leader = leader
            self.view.reset()          # another leader may have written anything meanwhile
        if not leader:
            self.device_clock.flush(self.store)     # what it counted while leading
            return False
        started, cpu = time.perf_counter(), time.thread_time()
        if self._led_at is None or started - self._led_at > self.config.lease_ttl_s:
            self.view.reset()          # the lease may have lapsed (and been held) since
        try:
            # no collection inside the pass (gckeeper.paused): the keeper's tick after it
            with gckeeper.paused(), self.store.begin() as conn:
                now = self.store.now(conn)
                if not repo.holds_lease(conn, LEASE, self.holder, now, lock=True):
                    self.is_leader = False
                    return False
                decided, seen = fleet.reconcile(conn, now, self.settings, view=self.view)
                self.device_clock.observe(conn, now, holding_nodes(seen, decided),
                                          holding_after(seen, decided))
                if self._pruned is None or now - self._pruned >= PRUNE_EVERY_S:
                    changes.prune(conn, now)
                    self._pruned = now
        except BaseException:
            self.view.reset()          # what it read may not be what the store holds
            raise
        self._led_at = started         # just after the lease was renewed
        self.times.add(time.perf_counter() - started, self.view.last_full,
                       time.thread_time() - cpu)
        self._log_placement(decided, now)
        self._record(now)
        return True

    def _record(self, now: float) -> None:
        """The minute's history sample (``history.Recorder``). In the server, the
        reconciler process hands it to a process of its own at nice 19
        (control/sampler.py: started here, again if it stopped), and never waits for it.
        Otherwise at the web workers' CPU priority (``web_nice`` steps below this
        thread's), on a thread of its own that lowers only itself (each Linux thread has
        its own nice value), which the reconciler waits for: 0.6 s of work once a minute
        at 10,000 nodes, which at the reconciler's priority took a core from the workers'
        reports."""
        if self.sampler is not None:
            self.sampler.ensure()
            return
        if not self.history.due(now):
            return
        steps = self.config.web_nice
        if steps <= 0:
            self.history.tick(self.store, now)
            return
        thread = threading.Thread(target=lowered, args=(steps, self.history.tick,
                                                        self.store, now),
                                  name="llmgw-history", daemon=True)
        thread.start()
        thread.join()

    def _log_placement(self, decided: Changes, now: float) -> None:
        """Log a model that cannot be placed when its reason changes, else at most every
        ``placement_warning_every_s`` (not every tick: a cluster once logged "no placement"
        250 times)."""
        every_s = self.config.placement_warning_every_s
        for model, reason in decided.unplaceable.items():
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
            self.collect()
            self._stop.wait(self.config.reconcile_interval_s)
        self.release()

    def collect(self) -> None:
        """The process's garbage collector keeper, ticked between passes when due: its
        collection and freeze never run while a pass waits (on a thread of its own they
        took the interpreter from a pass at any time)."""
        now = time.monotonic()
        if self.keeper is not None and self.keeper.due(now):
            self.keeper.tick(now)

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
    reconciler.keeper = gckeeper.Keeper()   # the fleet it keeps in memory leaves the walk
    if config.web_nice > 0:         # the history's minute below everything else
        reconciler.sampler = sampler.Handle(reconciler.holder,
                                            {**os.environ, **config_env(config)})
    try:
        reconciler.run_forever()
    finally:
        if reconciler.sampler is not None:
            reconciler.sampler.stop()
        reconciler.store.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
