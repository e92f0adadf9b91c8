"""Requests in flight at each replica, shared by every gunicorn worker of one router.

Admission (``admission/gate.py``) must never send a replica more requests than its slots, counting
the requests of *all* workers. :func:`create_file` (``serve.run``, before any worker forks)
makes a small file in a private directory and names it in :data:`FILE_ENV`; each worker
maps it (:class:`SharedSlots`) and owns one row, its *slot row* (a stable index 0..rows-1
that gunicorn's ``pre_fork`` hook gives it: the lowest one no live worker holds, passed in
:data:`ROW_ENV`). Each replica has a column, found through a directory of replica-id
hashes in the file; a column whose replica left the routes table and whose counts are all
0 is reused when the directory is full.

Every check-and-take runs under one lock shared by the router's processes: read the other
workers' counts, decide, write this worker's count. The critical section is a few
microseconds and never yields. The lock is an exclusive ``flock`` on a file description
each :class:`SharedSlots` opens for itself (:class:`FileLock`). Such a lock belongs to its
open file description, so only the kernel releases it from a holder: at ``LOCK_UN``, or
when the holder's process dies and its descriptors close. No process ever takes it from
another, so mutual exclusion holds however long a live holder is held up (a starved or
SIGSTOPped holder keeps it, and the others wait: admission is late, never over). For a
holder killed inside the critical section the kernel frees it as the process ends; what
it left in its row (some counts updated, some not, each int whole) counts requests that
died with it, until the master zeroes the row. ``flock`` rather than ``lockf``/``fcntl``
locks, which belong to a process, not a description: two :class:`SharedSlots` of one
process would not exclude each other. A child forked from a process with
:class:`SharedSlots` opens its own description (``os.register_at_fork``): a shared one
would let parent and child hold the lock at once.

The price: two system calls per take and give (``flock`` with ``LOCK_NB``, then
``LOCK_UN``), 1 to 1.5 us, and ``with counts.locked():`` about 2 us in all, against 0.6 us
with the POSIX semaphore it replaced, which a dead holder could not give back, so a
waiter took it over after a second, from live holders too. A worker that finds the lock
taken never waits in the kernel (that would stop its gevent loop): it yields to its other
greenlets (``time.sleep(0)`` :data:`SPINS` times), then tries again after short real
sleeps from :data:`BACKOFF_S` doubling up to :data:`MAX_BACKOFF_S`, for as long as the
lock is held, and logs a wait past :data:`LONG_WAIT_S`.

The master zeroes a dead worker's row (:func:`zero_row` from ``child_exit``) without the
lock, so that a stopped worker holding it cannot stop the master too. That is safe
because a row has one writer, its worker, and this one is dead: the master's zeroes race
only with readers, who see in each int the dead worker's count, 0 or (half zeroed)
something between, never more than it had, and with a worker claiming a column, which
writes zeroes too. gunicorn calls ``child_exit`` before it forks the worker that takes the
row again.

Without gunicorn (an app made in-process) :class:`LocalSlots` keeps the same interface in
memory: this process is the only one counting.

:func:`share` is how several routers split one replica's slots (``LLMGW_SLOT_SHARE``).
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import mmap
import os
import struct
import threading
import time
import weakref
from collections.abc import Collection, Mapping, Sequence

log = logging.getLogger(__name__)

FILE_ENV = "LLMGW_SLOTS_FILE"
ROW_ENV = "LLMGW_SLOTS_ROW"
UNLIMITED = 1 << 20        # the slots of a replica whose slots are unknown
COLUMNS = 4096             # replicas one router tracks at once (api.fields.MAX_LIST)
SPARE_ROWS = 8             # rows beyond the configured workers (gunicorn TTIN, reloads)
_MAGIC = b"LLMGWSL1"
_HEADER = struct.Struct("<8sII")     # magic, rows, columns
SPINS = 3                  # yields to the event loop before real sleeps between tries
BACKOFF_S = 0.0002         # the first real sleep; each next one twice as long ...
MAX_BACKOFF_S = 0.005      # ... up to this (admission.gate.POLL_S)
LONG_WAIT_S = 1.0          # a wait this long is logged (at most every WARN_EVERY_S)
WARN_EVERY_S = 600.0
_EX_NB = fcntl.LOCK_EX | fcntl.LOCK_NB
_last_warned = -WARN_EVERY_S


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
    return path


class FileLock:
    """An exclusive ``flock`` on an open file description of its own: only the kernel
    gives it back for a holder (``LOCK_UN``, or the holder's death)."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        _OPEN_LOCKS.add(self)

    def try_take(self) -> bool:
        """Take it if no other description holds it; never waits."""
        try:
            fcntl.flock(self._fd, _EX_NB)
        except BlockingIOError:
            return False
        return True

    def give(self) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)

    def reopen(self) -> None:
        """A description of this process's own (in a forked child): closing the inherited
        descriptor leaves the parent's lock as it was. A file already gone (the router
        is stopping) keeps the inherited one."""
        try:
            fd = os.open(self._path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        os.close(self._fd)
        self._fd = fd

    def close(self) -> None:
        _OPEN_LOCKS.discard(self)
        os.close(self._fd)


_OPEN_LOCKS: weakref.WeakSet[FileLock] = weakref.WeakSet()


def _reopen_after_fork() -> None:
    for lock in list(_OPEN_LOCKS):
        lock.reopen()


os.register_at_fork(after_in_child=_reopen_after_fork)


def take(lock: FileLock) -> None:
    """Take ``lock``: at once when free; else yield to gevent's other greenlets in a worker
    (``time.sleep(0)`` :data:`SPINS` times), then try again after real sleeps from
    :data:`BACKOFF_S` doubling up to :data:`MAX_BACKOFF_S`, until its holder gives it back
    or dies. The real sleeps matter on a busy machine: a holder the kernel took the CPU
    from keeps the lock for a time slice, and a worker spinning through its event loop
    for that long takes the CPU the holder needs to give it back."""
    global _last_warned
    if lock.try_take():
        return
    spins, pause, since = 0, BACKOFF_S, time.monotonic()
    warned = False
    while not lock.try_take():
        spins += 1
        if spins <= SPINS:
            time.sleep(0)
            continue
        time.sleep(pause)
        pause = min(pause * 2, MAX_BACKOFF_S)
        now = time.monotonic()
        if not warned and now - since > LONG_WAIT_S:
            warned = True
            if now - _last_warned >= WARN_EVERY_S:
                _last_warned = now
                log.warning("the slot counts' lock has been held by another process for "
                            "over %g s (stopped or starved?); admission waits for it",
                            LONG_WAIT_S)


def rows_of(path: str) -> int:
    with open(path, "rb") as f:
        magic, rows, _cols = _HEADER.unpack(f.read(_HEADER.size))
    if magic != _MAGIC:
        raise ValueError(f"{path} is not a slots file")
    return int(rows)


def zero_row(path: str, row: int) -> None:
    """Forget what worker ``row`` had in flight (it exited): in the master, ``child_exit``.
    Without the lock (the module's docstring says why that is safe). A file already gone
    (the router is stopping) is nothing to do."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        magic, rows, cols = _HEADER.unpack(os.pread(fd, _HEADER.size, 0))
        if magic != _MAGIC or not 0 <= row < rows:
            return
        os.pwrite(fd, bytes(4 * cols), _HEADER.size + 8 * cols + 4 * row * cols)
    finally:
        os.close(fd)


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
        self._shared = FileLock(path)
        with self.locked():
            for col in range(cols):
                self._counts[self._mine_at + col] = 0

    def locked(self) -> SharedSlots:
        """``with counts.locked():`` holds the file lock (and this process's)."""
        return self

    def __enter__(self) -> None:
        self._lock.acquire()
        try:
            if not self._shared.try_take():
                take(self._shared)
        except BaseException:
            self._lock.release()
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            self._shared.give()
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
        self._shared.close()


SlotCounts = LocalSlots | SharedSlots


def for_this_process() -> SlotCounts:
    """The shared counts when this process is a worker of ``serve.run``, else local ones."""
    path, row = os.environ.get(FILE_ENV), os.environ.get(ROW_ENV)
    if path and row is not None and os.path.exists(path):
        return SharedSlots(path, int(row))
    return LocalSlots()
