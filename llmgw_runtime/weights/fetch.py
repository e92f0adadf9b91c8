"""Getting weights onto a node that has none: one background :class:`Fetch` per replica, kept
by a :class:`FetchManager` that the agent's (single-threaded) supervisor drives.

A download lands under a partial name (``.part``, or huggingface_hub's ``.incomplete`` blobs)
and gets its final name only once complete and verified, so a half-finished download never
counts as weights.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import urllib3

from ..errors import EngineError
from .hf_download import download_hf
from .http_download import download_http
from .locate import complete, find_for
from .sources import Source, parse_source
from .transfer import DONE, FAILED, FETCHING, Fetch, FetchCancelled, FetchError

__all__ = ["DONE", "FAILED", "FETCHING", "Fetch", "FetchCancelled", "FetchError",
           "FetchManager", "pick_dest"]


def pick_dest(dirs: Sequence[str | Path], fallback: str | Path | None = None) -> Path | None:
    """The first weights directory this process can write into, else ``fallback`` (created),
    else None."""
    for d in dirs:
        path = Path(d).expanduser()
        if path.is_dir() and os.access(path, os.W_OK | os.X_OK):
            return path
    if fallback is not None:
        path = Path(fallback).expanduser()
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError:
            return None
        if os.access(path, os.W_OK | os.X_OK):
            return path
    return None


class FetchManager:
    """The fetches of one agent, by key (a replica id). Not thread-safe: one caller."""

    def __init__(self, *, fallback_dir: str | Path | None = None,
                 http: urllib3.PoolManager | None = None, hf_endpoint: str | None = None,
                 http_attempts: int = 3, timeout_s: float = 60.0) -> None:
        self.fallback_dir = fallback_dir
        self.http = http or urllib3.PoolManager()
        self.hf_endpoint = hf_endpoint
        self.http_attempts = http_attempts
        self.timeout_s = timeout_s
        self._fetches: dict[str, Fetch] = {}

    def ensure(self, key: str, source: str, dirs: Sequence[str | Path], *,
               sha256: str | None = None, size_bytes: int | None = None,
               token: str | None = None) -> Fetch:
        """The fetch for ``key``: the existing one for the same source (whatever its state;
        :meth:`forget` it to try again), else a new one, already done when the weights are
        here, started in a thread otherwise."""
        existing = self._fetches.get(key)
        if existing is not None and existing.source == source:
            return existing
        if existing is not None:
            existing.cancel()
        fetch = self._new(key, source, list(dirs), sha256, size_bytes, token)
        self._fetches[key] = fetch
        return fetch

    def _new(self, key: str, source: str, dirs: list[str | Path], sha256: str | None,
             size_bytes: int | None, token: str | None) -> Fetch:
        try:
            src = parse_source(source)
        except EngineError as exc:
            return Fetch.failed(source, exc.message)
        found = find_for(src, dirs)
        if found is not None:
            return self._found(src, found, size_bytes)
        if src.kind == "file":
            assert src.path is not None
            return Fetch.failed(source, f"source {src.display!r}: {complete(src.path)}")
        dest = pick_dest(dirs, self.fallback_dir)
        if dest is None:
            looked = ", ".join(str(d) for d in dirs) or "none configured"
            return Fetch.failed(source, (
                f"source {src.display!r}: not found, and none of the weights directories "
                f"({looked}) exists and is writable to download it into; create one, or "
                "set LLMGW_WEIGHTS_DIRS"))
        fetch = Fetch(source)
        fetch.start(self._job(src, dest, sha256, size_bytes, token), name=f"fetch-{key}")
        return fetch

    @staticmethod
    def _found(src: Source, path: Path, size_bytes: int | None) -> Fetch:
        if src.kind == "http" and size_bytes is not None and path.is_file():
            size = path.stat().st_size
            if size != size_bytes:
                return Fetch.failed(src.raw, (
                    f"source {src.display!r}: {path} has {size} bytes but the catalog says "
                    f"size_bytes {size_bytes}; remove the file or correct the catalog"))
        return Fetch.done(src.raw, path)

    def _job(self, src: Source, dest: Path, sha256: str | None, size_bytes: int | None,
             token: str | None) -> Callable[[Fetch], Path]:
        if src.kind == "hf":
            endpoint = self.hf_endpoint
            return lambda f: download_hf(f, src, dest, token=token, endpoint=endpoint)
        http, attempts, timeout_s = self.http, self.http_attempts, self.timeout_s
        return lambda f: download_http(f, src, dest, pool=http, sha256=sha256,
                                       size_bytes=size_bytes, attempts=attempts,
                                       timeout_s=timeout_s)

    def get(self, key: str) -> Fetch | None:
        return self._fetches.get(key)

    def keys(self) -> list[str]:
        return list(self._fetches)

    def cancel(self, key: str) -> bool:
        """Stop the fetch for ``key`` (it ends failed, "cancelled"); True if there was one."""
        fetch = self._fetches.get(key)
        if fetch is None:
            return False
        fetch.cancel()
        return True

    def forget(self, key: str) -> Fetch | None:
        """Drop the fetch for ``key``, cancelling it if it still runs."""
        fetch = self._fetches.pop(key, None)
        if fetch is not None and fetch.state == FETCHING:
            fetch.cancel()
        return fetch

    def close(self, timeout_s: float = 5.0) -> None:
        """Cancel every fetch and wait a little for the threads to stop."""
        for fetch in self._fetches.values():
            fetch.cancel()
        deadline = time.monotonic() + timeout_s
        for fetch in self._fetches.values():
            fetch.wait(max(0.0, deadline - time.monotonic()))
