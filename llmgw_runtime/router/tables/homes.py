"""Which replica served each prompt prefix last, shared by every worker of one router.

Prefix affinity (``admission/core.py``) sends a conversation's later turns to the replica that
has its prefix cached. Hashing alone agrees on that replica everywhere without state, but
it places conversations by their hash, not by load: a dozen conversations on two replicas
often split 4/8, and the busier replica's queue then eats what its cache saves. With this
table a new prefix goes to the least-loaded replica and is *remembered* there; its later
turns find it here, from whichever worker takes them, and follow it when bounded load or a
spill moves it (the engine that served the last turn holds the cache now).

:func:`create_file` (``serve.run``, before the workers fork) makes the table in the
router's private directory and names it in :data:`FILE_ENV`; each worker maps it. Without
it (an app made in-process) the table lives in this process's memory. Callers hold the
slot counts' lock (``slots.py``) around every call: the same lock admission decides under.

The table is a set-associative cache: :data:`SETS` sets of :data:`WAYS` entries of (key
tag, replica tag, last use); a new key takes its set's least recently used entry, so the
table holds the :data:`SETS` x :data:`WAYS` most recently served prefixes (a forgotten one
is placed again, by load). Tags are 64-bit SHA-256 prefixes: a collision costs one
request a cache miss, never a wrong answer.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable

from . import shm
from .slots import stable_hash

FILE_ENV = "LLMGW_HOMES_FILE"
SETS = 4096
WAYS = 4
_ENTRY = struct.Struct("<QQd")      # key tag, replica tag, last use (time.monotonic)
SIZE = SETS * WAYS * _ENTRY.size    # 384 KiB


def create_file(directory: str) -> str:
    """The empty table for one router, in ``directory`` (private: mode 0700)."""
    return shm.create(directory, "homes", SIZE)


class Homes:
    """The table over a shared map of the file, or over private memory."""

    def __init__(self, path: str | None = None) -> None:
        self._buf = shm.mapped(path, SIZE, "homes table")
        self._tags: dict[str, int] = {}

    def get(self, key: bytes, replicas: Iterable[str]) -> str | None:
        """The replica of ``replicas`` that last served ``key``, if remembered."""
        tag, base = _where(key)
        for way in range(WAYS):
            found, replica, _ = _ENTRY.unpack_from(self._buf, base + way * _ENTRY.size)
            if found == tag:
                for rid in replicas:
                    if self._tag(rid) == replica:
                        return rid
                return None
        return None

    def put(self, key: bytes, replica: str, now: float) -> None:
        """``replica`` serves ``key`` now."""
        tag, base = _where(key)
        oldest, oldest_at = 0, float("inf")
        for way in range(WAYS):
            offset = base + way * _ENTRY.size
            found, _, used = _ENTRY.unpack_from(self._buf, offset)
            if found == tag:
                oldest = offset
                break
            if used < oldest_at:
                oldest, oldest_at = offset, used
        _ENTRY.pack_into(self._buf, oldest, tag, self._tag(replica), now)

    def _tag(self, replica: str) -> int:
        tag = self._tags.get(replica)
        if tag is None:
            if len(self._tags) > 100_000:
                self._tags.clear()
            tag = self._tags[replica] = stable_hash(replica) or 1
        return tag


def _where(key: bytes) -> tuple[int, int]:
    """A key's tag (never 0: 0 marks an empty entry) and its set's offset."""
    tag = int.from_bytes(key[:8], "big") or 1
    index = int.from_bytes(key[8:12], "big") % SETS if len(key) >= 12 else tag % SETS
    return tag, index * WAYS * _ENTRY.size


def for_this_process() -> Homes:
    """The router's shared table when serve.run made one, else a private one."""
    path = os.environ.get(FILE_ENV)
    return Homes(path) if path else Homes()
