"""One background download: its state (``fetching``, ``done``, ``failed``), its progress
and its cancellation. The download itself is a job function (http_download, hf_download)."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import EngineError, LlmgwError
from .sources import parse_source

log = logging.getLogger(__name__)

FETCHING, DONE, FAILED = "fetching", "done", "failed"


class FetchError(LlmgwError):
    """A download failed; the message names the source and the reason."""

    reason = "fetch_failed"


class FetchCancelled(Exception):
    """Raised inside a download when its fetch was cancelled."""


class _Meter:
    """Transfer rate over the last ``window_s`` seconds of byte counts."""

    def __init__(self, clock: Callable[[], float], window_s: float = 10.0) -> None:
        self._clock = clock
        self._window_s = window_s
        self._samples: deque[tuple[float, int]] = deque()
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        now = self._clock()
        with self._lock:
            if self._samples and n < self._samples[-1][1]:
                self._samples.clear()  # started over
            if len(self._samples) >= 2 and now - self._samples[-2][0] < 0.2:
                self._samples[-1] = (now, n)  # keep samples 0.2 s apart, the last one current
            else:
                self._samples.append((now, n))
            while len(self._samples) > 2 and now - self._samples[0][0] > self._window_s:
                self._samples.popleft()

    def rate(self) -> float:
        with self._lock:
            if len(self._samples) < 2:
                return 0.0
            (t0, b0), (t1, b1) = self._samples[0], self._samples[-1]
        return (b1 - b0) / (t1 - t0) if t1 > t0 else 0.0


def _disk_usage(path: Path) -> int:
    try:
        if path.is_file():
            return path.stat().st_size
        return sum((Path(r) / n).stat().st_size for r, _, ns in os.walk(path) for n in ns)
    except OSError:
        return 0


class Fetch:
    """One download in a background thread. ``state`` is ``fetching``, ``done`` (``path`` set)
    or ``failed`` (``error`` set: a plain reason naming the source)."""

    def __init__(self, source: str, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.source = source
        try:
            self.display = parse_source(source).display
        except EngineError:
            self.display = source
        self.state = FETCHING
        self.path: Path | None = None
        self.error: str | None = None
        self._cancel = threading.Event()
        self._finished = threading.Event()
        self._meter = _Meter(clock)
        self._bytes = 0
        self._total: int | None = None
        self._poll: Callable[[], int] | None = None
        self._thread: threading.Thread | None = None

    @classmethod
    def done(cls, source: str, path: Path) -> Fetch:
        """A fetch with nothing to do: the weights are already at ``path``."""
        fetch = cls(source)
        fetch._bytes = fetch._total = _disk_usage(path)
        fetch._finish(path=path)
        return fetch

    @classmethod
    def failed(cls, source: str, error: str) -> Fetch:
        """A fetch that cannot even start."""
        fetch = cls(source)
        fetch._finish(error=error)
        return fetch

    def start(self, job: Callable[[Fetch], Path], name: str = "fetch") -> None:
        """Run ``job(self)`` in a daemon thread; its return value is the weights' path."""
        self._thread = threading.Thread(target=self._run, args=(job,), name=name, daemon=True)
        self._thread.start()

    def _run(self, job: Callable[[Fetch], Path]) -> None:
        try:
            path = job(self)
        except FetchCancelled:
            self._finish(error=f"fetch of {self.display} was cancelled")
        except LlmgwError as exc:
            self._finish(error=exc.message)
        except Exception as exc:  # a download must never kill the agent
            log.exception("fetch of %s failed unexpectedly", self.display)
            self._finish(error=f"fetch of {self.display} failed: {type(exc).__name__}: {exc}")
        else:
            self._finish(path=path)

    def _finish(self, *, path: Path | None = None, error: str | None = None) -> None:
        if path is not None:
            n = self._current()
            if self._total is None:
                self._total = n
            self.path, self.state = path, DONE
        else:
            if error and self.source.startswith(("http://", "https://")) and "?" in self.source:
                # never show a URL's query string, whoever wrote the message
                error = error.replace(self.source.split("?", 1)[1], "***")
            self.error, self.state = error, FAILED
            if error:
                log.info("%s", error)  # the supervisor reports it with the replica
        self._finished.set()

    # -- used by the download jobs --------------------------------------------------------

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def check_cancel(self) -> None:
        """Raise :class:`FetchCancelled` when the fetch was cancelled."""
        if self._cancel.is_set():
            raise FetchCancelled()

    def set_total(self, total: int | None) -> None:
        self._total = total

    def report_bytes(self, n: int) -> None:
        """Bytes of the final file on disk so far (a resumed download starts above zero)."""
        self._bytes = n
        self._meter.add(n)

    def poll_bytes_with(self, poll: Callable[[], int]) -> None:
        """Count bytes by calling ``poll`` whenever progress is asked for."""
        self._poll = poll

    # -- used by the supervisor ---------------------------------------------------------

    def _current(self) -> int:
        if self._poll is not None and self.state == FETCHING:
            try:
                self.report_bytes(self._poll())
            except OSError:
                pass
        return self._bytes

    def progress(self) -> dict[str, Any]:
        """``{"bytes": n, "total": n or None, "rate_bps": float}``."""
        n = self._current()
        rate = self._meter.rate() if self.state == FETCHING else 0.0
        return {"bytes": n, "total": self._total, "rate_bps": round(rate, 1)}

    def as_dict(self) -> dict[str, Any]:
        """State, path, error and progress, for an agent report."""
        return {"source": self.display, "state": self.state,
                "path": str(self.path) if self.path else None, "error": self.error,
                **self.progress()}

    def cancel(self) -> None:
        """Ask the thread to stop at its next chunk; a ``.part`` stays for a later resume."""
        self._cancel.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until done or failed; True when it is."""
        return self._finished.wait(timeout)
