"""What an agent reports about weights: its directories (filesystem, shared or not) and the
catalog sources whose complete weights it can see.

Report format::

    {"dirs": [{"path": "/models", "fstype": "nfs4", "shared": true, "exists": true}],
     "sources": {"hf://org/repo/f.gguf": {"path": "/models/f.gguf", "shared": true}}}

``fstype`` is ``"unknown"`` when no mount holds the path. ``sources`` lists only sources
found complete. An agent with no weights directories configured reports ``{}``.
A file source counts wherever it lies (the catalog names the exact path the engine will
open, so whether this node can read it is a fact about the node, not about its directories),
and its ``shared`` comes from its own mount.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from ..errors import EngineError
from .locate import find_for
from .mounts import Mount, fs_type_of, is_shared, read_mounts
from .sources import parse_source

log = logging.getLogger(__name__)


def scan(sources: Iterable[str], dirs: Sequence[str | Path],
         mounts: Sequence[Mount]) -> dict[str, Any]:
    """The weights report for ``sources`` (see the module docstring); ``{}`` without dirs."""
    if not dirs:
        return {}
    report_dirs = []
    for d in dirs:
        fstype = fs_type_of(d, mounts)
        report_dirs.append({"path": str(d), "fstype": fstype or "unknown",
                            "shared": is_shared(fstype),
                            "exists": os.path.isdir(os.path.expanduser(str(d)))})
    found: dict[str, dict[str, Any]] = {}
    for source in sources:
        if source in found:
            continue
        try:
            src = parse_source(source)
        except EngineError:
            continue  # the catalog validator reports bad sources; a scan only looks
        path = find_for(src, dirs)
        if path is not None:
            found[source] = {"path": str(path), "shared": is_shared(fs_type_of(path, mounts))}
    return {"dirs": report_dirs, "sources": found}


class Scanner:
    """Runs :func:`scan` at most every ``interval_s`` seconds, or at once when the set of
    sources changed or :meth:`invalidate` was called (e.g. after a download finished).
    The mount table is read again on every real scan."""

    def __init__(self, dirs: Sequence[str | Path], *, interval_s: float = 30.0,
                 mounts: Callable[[], Sequence[Mount]] = read_mounts,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.dirs = list(dirs)
        self.interval_s = interval_s
        self._mounts = mounts
        self._clock = clock
        self._last_at: float | None = None
        self._last_sources: frozenset[str] | None = None
        self._last: dict[str, Any] = {}
        self.scans = 0

    def invalidate(self) -> None:
        """Make the next :meth:`scan` look at the disks again."""
        self._last_at = None

    def scan(self, sources: Iterable[str]) -> dict[str, Any]:
        """The latest report, rescanned when stale or when ``sources`` changed."""
        wanted = frozenset(sources)
        now = self._clock()
        fresh = (self._last_at is not None and wanted == self._last_sources
                 and now - self._last_at < self.interval_s)
        if fresh:
            return self._last
        started = time.monotonic()
        self._last = scan(sorted(wanted), self.dirs, self._mounts())
        self._last_at, self._last_sources = now, wanted
        self.scans += 1
        log.debug("weights scan of %d sources took %.3f s", len(wanted),
                  time.monotonic() - started)
        return self._last
