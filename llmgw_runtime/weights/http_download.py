"""An HTTP(S) download into ``<dest>/<name>.part`` that resumes with a Range request, checks
the catalog's size and sha256, and only then renames the file to ``<dest>/<name>``.

URLs in messages and logs lose their query string: that is where signed URLs keep secrets.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import urllib3
from urllib3.exceptions import HTTPError as Urllib3Error
from urllib3.util import Retry, Timeout

from .locate import complete
from .safepath import name_problem, outside
from .sources import Source
from .transfer import Fetch, FetchError

log = logging.getLogger(__name__)

CHUNK = 1 << 20
_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)")
_UNSATISFIED_RANGE = re.compile(r"bytes\s+\*/(\d+)")


class _Interrupted(Exception):
    """The transfer stopped early; the next attempt resumes from the ``.part``."""


@contextlib.contextmanager
def _exclusive(lock_path: Path, fetch: Fetch) -> Iterator[None]:
    """Hold an exclusive lock on ``lock_path`` (another fetch of the same file, in this process
    or another, waits), giving up when the fetch is cancelled."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                fetch.check_cancel()
                time.sleep(0.2)
            except OSError as exc:  # e.g. a filesystem without locks: go on unlocked
                log.warning("cannot lock %s (%s); downloading without a lock", lock_path, exc)
                break
        yield
    finally:
        os.close(fd)


class _Hash:
    """sha256 of the ``.part`` as it grows; rebuilt from disk when it does not match."""

    def __init__(self, wanted: bool) -> None:
        self.wanted = wanted
        self.h = hashlib.sha256()
        self.n = 0

    def sync(self, part: Path, offset: int) -> None:
        if not self.wanted or self.n == offset:
            return
        self.h, self.n = hashlib.sha256(), 0
        with part.open("rb") as f:
            while self.n < offset:
                block = f.read(min(CHUNK, offset - self.n))
                if not block:
                    break
                self.update(block)

    def update(self, block: bytes) -> None:
        if self.wanted:
            self.h.update(block)
            self.n += len(block)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _transfer(fetch: Fetch, src: Source, part: Path, pool: urllib3.PoolManager,
              digest: _Hash, timeout_s: float, size_bytes: int | None) -> None:
    """One GET; returns once the ``.part`` holds the whole body, else raises."""
    offset = _size(part)
    headers = {"Range": f"bytes={offset}-"} if offset else {}
    try:
        resp = pool.request("GET", src.url, headers=headers, preload_content=False,
                            timeout=Timeout(connect=min(10.0, timeout_s), read=timeout_s),
                            retries=Retry(connect=2, read=0, status=0, other=0, redirect=5,
                                          raise_on_status=False))
    except Urllib3Error as exc:
        reason = getattr(exc, "reason", None) or exc
        raise FetchError(f"download of {src.display} failed: cannot reach the server "
                         f"({type(reason).__name__})") from None
    try:
        total: int | None = None
        if resp.status == 416 and offset:
            m = _UNSATISFIED_RANGE.search(resp.headers.get("Content-Range", ""))
            if (int(m.group(1)) if m else size_bytes) == offset:
                fetch.set_total(offset)
                fetch.report_bytes(offset)
                return  # the .part already holds the whole file
            part.unlink(missing_ok=True)
            raise _Interrupted("the partial file does not fit the remote file; starting over")
        if resp.status == 206:
            m = _CONTENT_RANGE.search(resp.headers.get("Content-Range", ""))
            if not m or int(m.group(1)) != offset:
                part.unlink(missing_ok=True)
                raise _Interrupted("the server answered a different range; starting over")
            total = int(m.group(3)) if m.group(3) != "*" else None
        elif resp.status == 200:
            if offset:
                log.info("%s: the server ignored the Range request; starting over", src.display)
                offset = 0
            length = resp.headers.get("Content-Length")
            total = int(length) if length and length.isdigit() else None
        else:
            raise FetchError(f"download of {src.display} failed: the server answered "
                             f"HTTP {resp.status}")
        if size_bytes is not None and total is not None and total != size_bytes:
            part.unlink(missing_ok=True)
            raise FetchError(f"download of {src.display} failed: size mismatch, expected "
                             f"{size_bytes} bytes (catalog size_bytes), got {total} from the "
                             "server; nothing was kept")
        fetch.set_total(total)
        fetch.report_bytes(offset)
        with part.open("r+b" if offset else "wb") as f:
            f.seek(offset)
            f.truncate()
            digest.sync(part, offset)
            n = offset
            try:
                while block := resp.read1(CHUNK):  # whatever arrived: a cut loses nothing
                    fetch.check_cancel()
                    f.write(block)
                    digest.update(block)
                    n += len(block)
                    fetch.report_bytes(n)
            except Urllib3Error as exc:
                raise _Interrupted(f"the transfer stopped after {n} bytes "
                                   f"({type(exc).__name__})") from None
            finally:
                f.flush()
                os.fsync(f.fileno())
        if total is not None and n != total:
            raise _Interrupted(f"the transfer stopped after {n} of {total} bytes")
    finally:
        resp.close()  # never hand a half-read connection back to the pool
        resp.release_conn()


def _verify(src: Source, part: Path, digest: _Hash, sha256: str | None,
            size_bytes: int | None) -> None:
    size = _size(part)
    if size_bytes is not None and size != size_bytes:
        part.unlink(missing_ok=True)
        raise FetchError(f"download of {src.display} failed: size mismatch, expected "
                         f"{size_bytes} bytes (catalog size_bytes), got {size}; the partial "
                         "file was deleted")
    if sha256 is None:
        return
    digest.sync(part, size)
    got = digest.h.hexdigest()
    if got != sha256.lower():
        part.unlink(missing_ok=True)
        raise FetchError(f"download of {src.display} failed: sha256 mismatch, expected "
                         f"{sha256.lower()}, got {got}; the partial file was deleted")


def download_http(fetch: Fetch, src: Source, dest: Path, *, pool: urllib3.PoolManager,
                  sha256: str | None = None, size_bytes: int | None = None,
                  attempts: int = 3, timeout_s: float = 60.0) -> Path:
    """Download ``src`` into ``dest``; the final path once complete and verified.

    FetchError, before anything is written, when the file name is not one plain path
    component or when the partial file or the lock would resolve (through a link) outside
    ``dest``; the final name is given by a rename, which replaces a link without following
    it."""
    problem = name_problem(src.name)
    if problem is not None:
        raise FetchError(f"download of {src.display} refused: its file name {src.name[:100]!r} "
                         f"{problem}; end the URL with a plain name like model.gguf")
    dest.mkdir(parents=True, exist_ok=True)
    final, part = dest / src.name, dest / f"{src.name}.part"
    lock = dest / ".locks" / f"{src.name}.lock"
    for what, path in (("the partial download", part), ("the download lock", lock)):
        problem = outside(dest, path, what)
        if problem is not None:
            raise FetchError(f"download of {src.display}: {problem}")
    with _exclusive(lock, fetch):
        if complete(final) is None:  # another fetch finished it while this one waited
            fetch.set_total(final.stat().st_size)
            fetch.report_bytes(final.stat().st_size)
            return final
        digest = _Hash(sha256 is not None)
        for attempt in range(1, attempts + 1):
            fetch.check_cancel()
            try:
                _transfer(fetch, src, part, pool, digest, timeout_s, size_bytes)
                break
            except _Interrupted as exc:
                if attempt == attempts:
                    raise FetchError(f"download of {src.display} failed: {exc}; the partial "
                                     "file is kept and the next attempt resumes it") from None
                log.info("%s: %s; resuming (attempt %d of %d)", src.display, exc,
                         attempt + 1, attempts)
        _verify(src, part, digest, sha256, size_bytes)
        os.replace(part, final)
    log.info("downloaded %s to %s", src.display, final)
    return final
