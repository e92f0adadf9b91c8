"""The minute's history sample in a process of its own, at the lowest CPU priority
(issue 30; control/history.py).

At 10,000 nodes the sample is about 0.6 s of CPU once a minute (the fleet read again for
the summary's view, every device counted by class, a thousand rows written). On a thread
of the reconciler it ran at the web workers' priority while the reconciler waited for it:
a second of reports answered late once a minute, and no pass meanwhile. Here it runs at
nice 19, so it takes only the CPU that nothing else wants, and the reconciler never waits
for it. It samples only while the reconciler that started it holds the lease (the one
writer of the history, as before), and ends when that reconciler does (its parent gone,
or SIGTERM).

``python -m llmgw_runtime.control.sampler``, started by the reconciler process
(:class:`Handle`) with the control service's settings and the reconciler's lease holder
(``LLMGW_HISTORY_HOLDER``) and process id (``LLMGW_HISTORY_PARENT``) in its environment.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from types import FrameType

from ..errors import StoreError
from ..store import Store
from ..store.leases import holds_lease
from . import history
from .config import ControlConfig

log = logging.getLogger(__name__)

HOLDER_ENV = "LLMGW_HISTORY_HOLDER"
PARENT_ENV = "LLMGW_HISTORY_PARENT"        # the reconciler's pid: gone, the sampler ends
NICE = 19
RESTART_AFTER_S = 10.0      # a sampler that stopped is started again at most this often


def sample_if_leading(store: Store, recorder: history.Recorder, holder: str,
                      lease: str) -> bool:
    """One look: when ``holder`` holds ``lease`` and the recorder's minute is due, the
    minute's sample (``Recorder.tick``, which logs its own failures); whether it
    sampled."""
    with store.begin() as conn:
        now = store.now(conn)
        leads = holds_lease(conn, lease, holder, now)
    if not leads or not recorder.due(now):
        return False
    recorder.tick(store, now)
    return True


def until_next_minute(now: float, most_s: float = 5.0) -> float:
    """Seconds to wait before looking again: just past the next minute's start, at most
    ``most_s`` (a new leader samples soon after it took the lease)."""
    return min(most_s, history.MINUTE_S - now % history.MINUTE_S + 0.5)


class Handle:
    """The reconciler's sampler process: started with :meth:`ensure` (after each pass it
    leads; again if it stopped, at most every ``RESTART_AFTER_S``), ended with
    :meth:`stop`."""

    def __init__(self, holder: str, env: dict[str, str]) -> None:
        self.holder, self.env = holder, env
        self.proc: subprocess.Popen[bytes] | None = None
        self._started_at: float | None = None

    def ensure(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            return
        now = time.monotonic()
        if self._started_at is not None and now - self._started_at < RESTART_AFTER_S:
            return
        if self.proc is not None:
            log.warning("the history sampler stopped (exit status %s); starting it again",
                        self.proc.returncode)
        self._started_at = now
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "llmgw_runtime.control.sampler"],
            env={**self.env, HOLDER_ENV: self.holder, PARENT_ENV: str(os.getpid())},
            stdin=subprocess.DEVNULL)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main() -> int:
    """The sampler process: samples while its reconciler leads, until SIGTERM or until
    that reconciler (its parent) is gone."""
    from .. import settings
    from .reconcile import LEASE

    logging.basicConfig(level=logging.INFO,
                        format="[%(asctime)s] [%(process)d] [history] %(message)s")
    config = settings.load(ControlConfig)
    holder = os.environ.get(HOLDER_ENV, "")
    if not holder:
        log.error("%s is not set: the sampler samples for a reconciler; it is started "
                  "by one", HOLDER_ENV)
        return 2
    # the reconciler that started it (named, so that one gone before this line is seen)
    named = os.environ.get(PARENT_ENV) or str(os.getppid())
    if not (named.isascii() and named.isdigit() and 0 < len(named) <= 10):
        log.error("%s=%r is not a process id: the sampler samples for the reconciler "
                  "that starts it, which names itself", PARENT_ENV, named[:40])
        return 2
    parent = int(named)
    try:
        os.setpriority(os.PRIO_PROCESS, 0, NICE)
    except OSError:
        pass            # sampled at the priority it was given
    stopped = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopped.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    store = Store(config.store_url)
    recorder = history.Recorder(config.history_days, config.node_timeout_s)
    failed: str | None = None
    try:
        while not stopped.is_set() and os.getppid() == parent:
            try:
                sample_if_leading(store, recorder, holder, LEASE)
                failed = None
            except (StoreError, OSError) as exc:    # the store away: looked at again
                if str(exc) != failed:
                    log.warning("the history sampler could not read the lease: %s", exc)
                failed = str(exc)
            stopped.wait(until_next_minute(time.time()))
    finally:
        store.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
