"""Requests in flight at each replica, shared by every gunicorn worker of one router.

Admission (``admit.py``) must never send a replica more requests than its slots, counting
the requests of *all* workers. :func:`create_file` (``serve.run``, before any worker forks)
makes a small file in a private directory and names it in :data:`FILE_ENV`; each worker
maps it (:class:`SharedSlots`) and owns one row, its *slot row* (a stable index 0..rows-1
that gunicorn's ``pre_fork`` hook gives it: the lowest one no live worker holds, passed in
:data:`ROW_ENV`). Each replica has a column, found through a directory of replica-id
hashes in the file; a column whose replica left the routes table and whose counts are all
0 is reused when the directory is full.

Every check-and-take runs under one lock shared by the router's processes: read the other
workers' counts, decide, write this worker's count. The critical section is a few
microseconds and never yields. The lock is a POSIX semaphore made with the file, before
any worker forks (:func:`create_file`): taking and giving it back costs no system call
while nobody waits (0.2 us, against 4 us for the two ``fcntl.lockf`` calls it replaced,
taken several times per request). A worker that finds it taken yields to its other
greenlets until it is free; a holder that died inside the critical section (killed in
those microseconds) cannot give it back, so after :data:`LOCK_STALE_S` the waiter takes
it over, with a warning. A file opened without its semaphore (a process that did not
fork from the one that made it) falls back to ``fcntl.lockf``. The master zeroes a dead
worker's row (:func:`zero_row` from ``child_exit``).

Without gunicorn (an app made in-process) :class:`LocalSlots` keeps the same interface in
memory: this process is the only one counting.

:func:`share` is how several routers split one replica's slots (``LLMGW_SLOT_SHARE``).
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import mmap
import multiprocessing
import os
import struct
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any

log = logging.getLogger(__name__)

FILE_ENV = "LLMGW_SLOTS_FILE"
ROW_ENV = "LLMGW_SLOTS_ROW"
UNLIMITED = 1 << 20        # the slots of a replica whose slots are unknown
COLUMNS = 4096             # replicas one router tracks at once (api.fields.MAX_LIST)
SPARE_ROWS = 8             # rows beyond the configured workers (gunicorn TTIN, reloads)
_MAGIC = b"LLMGWSL1"
_HEADER = struct.Struct("<8sII")     # magic, rows, columns
LOCK_STALE_S = 1.0         # a lock held this long belongs to a dead worker: taken over
SPINS = 3                  # yields to the event loop before waiting BACKOFF_S between tries
BACKOFF_S = 0.0002
# path -> the semaphore made with the file (create_file, in the master; inherited by fork)
_FORK_LOCKS: dict[str, Any] = {}


def stable_hash(text: str) -> int:
    """A 64-bit hash of ``text`` that every process and host agrees on (SHA-256)."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()[:8],
                          "big")


def share(slots: int, replica_id: str, index: int, count: int) -> int:
    """Router ``index`` of ``count`` (1-based) takes ``floor(slots / count)`` of a replica's
    slots, plus one for ``slots % count`` of the routers, chosen per replica by a stable
    hash so that the remainders spread over the routers. Summed over the routers: ``slots``."""
    base, rest = divmod(slots, count)
    return base + (1 if ((index - 1) + stable_hash(replica_id)) % count < rest else 0)


def model_shares(slots: Mapping[str, int | None], index: int, count: int) -> dict[str, int]:
    """This router's slots at each replica of one model (replica -> slots, None: unknown,
    unlimited). When every replica comes out at 0 (more routers than slots), one replica,
    chosen by a stable hash per router, gets 1 so that the model is still served: the
    routers together may then exceed the replica's slots (docs/routing.md)."""
    out = {rid: UNLIMITED if n is None else share(n, rid, index, count)
           for rid, n in slots.items()}
    if out and not any(out.values()):
        pick = min(out, key=lambda rid: stable_hash(f"{index}/{count}/{rid}"))
        out[pick] = 1
    return out


def parse_share(text: str) -> tuple[int, int]:
    """``"I/N"`` -> (I, N) with 1 <= I <= N; raises ValueError saying what is wrong."""
    index_text, sep, count_text = text.strip().partition("/")
    try:
        if not sep:
            raise ValueError
        index, count = int(index_text), int(count_text)
    except ValueError:
        raise ValueError(f"slot_share {text!r} is not of the form I/N (this router's index I "
                         "among N routers, e.g. 1/2 and 2/2 for two routers; 1/1 alone)"
                         ) from None
    if not 1 <= count <= 1024 or not 1 <= index <= count:
        raise ValueError(f"slot_share {text!r}: need 1 <= I <= N <= 1024 (router I of N)")
    return index, count


class LocalSlots:
    """In-memory counts for one process alone (no gunicorn): the others hold nothing."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._mine: dict[str, int] = {}

    def locked(self) -> threading.Lock:
        return self._lock

    def others(self, replica_ids: Sequence[str]) -> list[int]:
        return [0] * len(replica_ids)

    def set_mine(self, replica_id: str, count: int) -> None:
        if count:
            self._mine[replica_id] = count
        else:
            self._mine.pop(replica_id, None)

    def totals(self, replica_ids: Sequence[str]) -> list[int]:
        return [self._mine.get(rid, 0) for rid in replica_ids]

    def forget_except(self, replica_ids: Collection[str]) -> None:
        return None


def create_file(directory: str, workers: int) -> str:
    """The zeroed counts file for a router of ``workers`` workers, in ``directory``."""
    rows = workers + SPARE_ROWS
    path = os.path.join(directory, "slots")
    size = _HEADER.size + 8 * COLUMNS + 4 * rows * COLUMNS
    with open(path, "wb") as f:
        f.write(_HEADER.pack(_MAGIC, rows, COLUMNS))
        f.truncate(size)
    _FORK_LOCKS[path] = multiprocessing.Lock()
    return path


def _take_shared(lock: Any) -> None:
    """Take the file's semaphore: at once when free; else yield to gevent's other
    greenlets in a worker until it is (``time.sleep(0)`` a few times, then short real
    sleeps of :data:`BACKOFF_S`), taking it over after :data:`LOCK_STALE_S` from a holder
    that must have died. The real sleeps matter on a busy machine: a holder the kernel
    took the CPU from keeps the lock for a time slice, and a worker spinning through its
    event loop for that long takes the CPU the holder needs to give it back."""
    if lock.acquire(False):
        return
    deadline = time.monotonic() + LOCK_STALE_S
    spins = 0
    while not lock.acquire(False):
        if time.monotonic() > deadline:
            log.warning("the slot counts' lock was held for over %g s: its holder must have "
                        "died inside it; taking it over", LOCK_STALE_S)
            return      # held now on the dead holder's behalf; given back at the end
        spins += 1
        time.sleep(0 if spins <= SPINS else BACKOFF_S)


def _give_shared(lock: Any) -> None:
    try:
        lock.release()
    except ValueError:      # already given back: it was taken over from a slow holder
        pass


def rows_of(path: str) -> int:
    with open(path, "rb") as f:
        magic, rows, _cols = _HEADER.unpack(f.read(_HEADER.size))
    if magic != _MAGIC:
        raise ValueError(f"{path} is not a slots file")
    return int(rows)


def zero_row(path: str, row: int) -> None:
    """Forget what worker ``row`` had in flight (it exited): in the master, ``child_exit``.
    A file already gone (the router is stopping) is nothing to do."""
    try:
        f = open(path, "r+b")  # noqa: SIM115
    except FileNotFoundError:
        return
    with f:
        magic, rows, cols = _HEADER.unpack(f.read(_HEADER.size))
        if magic != _MAGIC or not 0 <= row < rows:
            return
        shared = _FORK_LOCKS.get(path)
        if shared is not None:
            _take_shared(shared)
        else:
            fcntl.lockf(f.fileno(), fcntl.LOCK_EX)
        try:
            f.seek(_HEADER.size + 8 * cols + 4 * row * cols)
            f.write(b"\0" * (4 * cols))
            f.flush()
        finally:
            if shared is not None:
                _give_shared(shared)
            else:
                fcntl.lockf(f.fileno(), fcntl.LOCK_UN)


class SharedSlots:
    """This worker's view of the counts file: row ``row`` is its own."""

    def __init__(self, path: str, row: int) -> None:
        self._file = open(path, "r+b")  # noqa: SIM115 - held for the worker's life
        self._fd = self._file.fileno()
        self._mm = mmap.mmap(self._fd, 0)
        magic, rows, cols = _HEADER.unpack_from(self._mm, 0)
        if magic != _MAGIC:
            raise ValueError(f"{path} is not a slots file")
        if not 0 <= row < rows:
            raise ValueError(f"slot row {row} is outside the file's {rows} rows")
        self.row, self.rows, self.cols = row, rows, cols
        view = memoryview(self._mm)
        self._dir = view[_HEADER.size:_HEADER.size + 8 * cols].cast("Q")
        start = _HEADER.size + 8 * cols
        self._counts = view[start:start + 4 * rows * cols].cast("i")
        self._mine_at = row * cols
        self._col: dict[str, int] = {}          # replica -> column (checked on every use)
        self._hash: dict[str, int] = {}
        self._live: frozenset[int] = frozenset()   # hashes of replicas in the routes table
        self._lock = threading.Lock()
        self._shared = _FORK_LOCKS.get(path)
        with self.locked():
            for col in range(cols):
                self._counts[self._mine_at + col] = 0

    def locked(self) -> SharedSlots:
        """``with counts.locked():`` holds the file lock (and this process's)."""
        return self

    def __enter__(self) -> None:
        self._lock.acquire()
        try:
            if self._shared is not None:
                _take_shared(self._shared)
            else:
                fcntl.lockf(self._fd, fcntl.LOCK_EX)
        except BaseException:
            self._lock.release()
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            if self._shared is not None:
                _give_shared(self._shared)
            else:
                fcntl.lockf(self._fd, fcntl.LOCK_UN)
        finally:
            self._lock.release()

    def _h(self, replica_id: str) -> int:
        h = self._hash.get(replica_id)
        if h is None:
            h = self._hash[replica_id] = stable_hash(replica_id) or 1
        return h

    def _column(self, replica_id: str, take: bool) -> int:
        """The replica's column (under the lock); -1 when it has none (and ``take`` is
        false, or the directory is full of replicas still counting)."""
        h = self._h(replica_id)
        col = self._col.get(replica_id)
        if col is not None and self._dir[col] == h:
            return col
        self._col.pop(replica_id, None)
        directory = self._dir
        for i in range(self.cols):
            if directory[i] == h:
                self._col[replica_id] = i
                return i
        if not take:
            return -1
        for i in range(self.cols):
            if directory[i] == 0:
                break
        else:
            for i in range(self.cols):
                if directory[i] not in self._live and not self._total(i):
                    break
            else:
                return -1
        directory[i] = h
        for r in range(self.rows):
            self._counts[r * self.cols + i] = 0
        self._col[replica_id] = i
        return i

    def _total(self, col: int) -> int:
        return sum(self._counts[col::self.cols])

    def others(self, replica_ids: Sequence[str]) -> list[int]:
        """What the other workers have in flight at each replica (under the lock)."""
        out = []
        for rid in replica_ids:    # a column now, so that later calls find it at once
            col = self._column(rid, take=True)
            out.append(0 if col < 0 else self._total(col) - self._counts[self._mine_at + col])
        return out

    def set_mine(self, replica_id: str, count: int) -> None:
        """This worker now has ``count`` requests in flight at the replica (under the lock)."""
        col = self._column(replica_id, take=count > 0)
        if col >= 0:
            self._counts[self._mine_at + col] = count

    def totals(self, replica_ids: Sequence[str]) -> list[int]:
        """What all workers have in flight at each replica (under the lock)."""
        out = []
        for rid in replica_ids:
            col = self._column(rid, take=True)
            out.append(0 if col < 0 else self._total(col))
        return out

    def forget_except(self, replica_ids: Collection[str]) -> None:
        """The replicas of the current routes table: columns of others may be reused."""
        self._live = frozenset(self._h(rid) for rid in replica_ids)
        for rid in [r for r in self._hash if r not in replica_ids]:
            del self._hash[rid]
            self._col.pop(rid, None)

    def close(self) -> None:
        self._dir.release()
        self._counts.release()
        self._mm.close()
        self._file.close()


SlotCounts = LocalSlots | SharedSlots


def for_this_process() -> SlotCounts:
    """The shared counts when this process is a worker of ``serve.run``, else local ones."""
    path, row = os.environ.get(FILE_ENV), os.environ.get(ROW_ENV)
    if path and row is not None and os.path.exists(path):
        return SharedSlots(path, int(row))
    return LocalSlots()
