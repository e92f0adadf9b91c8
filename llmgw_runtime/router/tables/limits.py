"""Per-key limits: requests per minute (rpm) and tokens per minute (tpm), docs/keys.md.

Each limit is a bucket that holds at most a minute's allowance and refills continuously
(``limit / 60`` a second): a key may send a minute's worth at once, then at the limit's
pace. A request is let through when its key has at least one request (rpm) and one token
(tpm) of allowance left; it takes one request and an *estimate* of its tokens
(:func:`estimate_tokens`), and when it ends the estimate is replaced by the tokens of the
engine's usage object (:meth:`Limiter.settle`), so the bucket may go below zero: the key
then waits until it has refilled. The decisions are pure functions of the levels and
``now`` (:func:`decide`, :func:`settled`).

Router I of N (``LLMGW_SLOT_SHARE``, as for slots) enforces ``limit / N`` of each, with a
bucket of at least one request or token (a limit below N still lets each router serve
one request at its share's pace). The levels are shared by every worker of one router:
a small table in a file made before the workers fork (:func:`create_file`), mapped by
each worker, read and written under the slot counts' lock (``slots.py``; the same lock
admission decides under). The table is set-associative, :data:`SETS` sets of
:data:`WAYS` entries (key tag, time, when it is full again, levels): a key takes its
set's entry that is full again (forgetting it loses nothing), else the one that will be
full soonest. Only keys with a limit are looked up; a key without one costs nothing.
"""

from __future__ import annotations

import contextlib
import math
import os
import struct
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, NamedTuple

from . import shm
from .slots import stable_hash

FILE_ENV = "LLMGW_LIMITS_FILE"
WINDOW_S = 60.0          # the limits are per minute
SETS = 4096
WAYS = 8
_ENTRY = struct.Struct("<Qdddd")    # key tag, at (time.monotonic), full at, rpm, tpm levels
SIZE = SETS * WAYS * _ENTRY.size    # 1.25 MiB
BYTES_PER_TOKEN = 4      # the prompt's estimate: about four bytes of the body a token
MAX_OUTPUT_ESTIMATE = 10_000_000
_OUTPUT_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


@dataclass(frozen=True)
class KeyLimit:
    """One key's limits as the routes table carries them (``api.router.KeyLimits``)."""

    name: str
    rpm: int | None = None
    tpm: int | None = None


class Allowance(NamedTuple):
    """This router's share of one limit: ``rate`` a second, holding at most ``burst``."""

    rate: float
    burst: float


def allowance(limit: int | None, routers: int) -> Allowance | None:
    """This router's share (one of ``routers``) of ``limit`` per minute; None: no limit."""
    if limit is None:
        return None
    per_minute = limit / routers
    return Allowance(per_minute / WINDOW_S, max(per_minute, 1.0))


def level_at(level: float | None, at: float, now: float, a: Allowance) -> float:
    """The allowance left at ``now`` of a bucket at ``level`` at ``at`` (None, or NaN as
    stored for a kind without a limit then: full)."""
    if level is None or level != level:
        return a.burst
    return min(a.burst, level + max(0.0, now - at) * a.rate)


class Verdict(NamedTuple):
    allowed: bool
    rpm: float                 # the levels at now, after taking (when allowed); NaN for
    tpm: float                 # a kind without a limit
    refused: str | None        # "requests" or "tokens": the limit that refused it
    retry_after_s: float       # when the refusing bucket has room for one again


def decide(rpm_level: float | None, tpm_level: float | None, at: float, now: float,
           rpm: Allowance | None, tpm: Allowance | None, estimate: int) -> Verdict:
    """Whether a request of ``estimate`` tokens may go now, and the levels after it."""
    r = level_at(rpm_level, at, now, rpm) if rpm is not None else math.nan
    t = level_at(tpm_level, at, now, tpm) if tpm is not None else math.nan
    waits = []
    if rpm is not None and r < 1.0:
        waits.append(((1.0 - r) / rpm.rate, "requests"))
    if tpm is not None and t < 1.0:
        waits.append(((1.0 - t) / tpm.rate, "tokens"))
    if waits:
        wait, which = max(waits)
        return Verdict(False, r, t, which, wait)
    return Verdict(True, r - 1.0 if rpm is not None else math.nan,
                   t - estimate if tpm is not None else math.nan, None, 0.0)


def settled(tpm_level: float | None, at: float, now: float, tpm: Allowance,
            charged: int, used: int) -> float:
    """The token level once a request charged ``charged`` tokens turned out to use
    ``used``."""
    return min(tpm.burst, level_at(tpm_level, at, now, tpm) + charged - used)


def full_at(rpm_level: float, tpm_level: float, now: float, rpm: Allowance | None,
            tpm: Allowance | None) -> float:
    """When both buckets will be full again (an entry forgotten then loses nothing)."""
    when = now
    for level, a in ((rpm_level, rpm), (tpm_level, tpm)):
        if a is not None and level < a.burst:      # NaN (no limit) compares False
            when = max(when, now + (a.burst - level) / a.rate)
    return when


def estimate_tokens(doc: dict[str, Any], body_bytes: int) -> int:
    """A request's tokens before the engine says: its body's bytes / 4 for the prompt,
    plus the most it may generate (``max_tokens``, ``max_completion_tokens`` or
    ``max_output_tokens``, the largest when it sets several, as the model's cap counts
    them; times ``n``), 0 when it does not say. ``doc`` is the body as forwarded: a model's
    default max_tokens is in it already (``max_tokens.py``)."""
    out = 0
    for name in _OUTPUT_FIELDS:
        value = doc.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > out:
            out = min(value, MAX_OUTPUT_ESTIMATE)
    n = doc.get("n")
    if isinstance(n, int) and not isinstance(n, bool) and 1 < n <= 128:
        out *= n
    return math.ceil(body_bytes / BYTES_PER_TOKEN) + out


def create_file(directory: str) -> str:
    """The empty table for one router, in ``directory`` (private: mode 0700)."""
    return shm.create(directory, "limits", SIZE)


class LimitTable:
    """The levels of every limited key, over a shared map of the file or private memory.
    Callers hold the slot counts' lock."""

    def __init__(self, path: str | None = None) -> None:
        self._buf = shm.mapped(path, SIZE, "limits table")

    def read(self, key_id: str) -> tuple[float, float, float] | None:
        """(at, rpm level, tpm level) of the key, or None when it is not remembered."""
        tag, base = _where(key_id)
        for way in range(WAYS):
            found, at, _, rpm, tpm = _ENTRY.unpack_from(self._buf, base + way * _ENTRY.size)
            if found == tag:
                return at, rpm, tpm
        return None

    def write(self, key_id: str, at: float, full: float, rpm: float, tpm: float) -> None:
        """Remember the key's levels at ``at`` (full again at ``full``), in its entry or
        the one of its set that is full soonest (an empty one, or one full already)."""
        tag, base = _where(key_id)
        victim, victim_full = base, math.inf
        for way in range(WAYS):
            offset = base + way * _ENTRY.size
            found, _, found_full, _, _ = _ENTRY.unpack_from(self._buf, offset)
            if found == tag:
                victim = offset
                break
            if found == 0:
                found_full = -math.inf
            if found_full < victim_full:
                victim, victim_full = offset, found_full
        _ENTRY.pack_into(self._buf, victim, tag, at, full, rpm, tpm)


def _where(key_id: str) -> tuple[int, int]:
    """A key's tag (never 0: 0 marks an empty entry) and its set's offset. ``key_id`` is
    the key's SHA-256 in hex; anything else is hashed the same way as a fallback."""
    try:
        tag, index = int(key_id[:16], 16), int(key_id[16:24], 16)
    except ValueError:
        tag = index = stable_hash(key_id)
    return tag or 1, (index % SETS) * WAYS * _ENTRY.size


class Limiter:
    """This worker's use of the router's limit table: ``check`` before a request is sent,
    ``settle`` when it ends. ``share``: (I, N) of ``LLMGW_SLOT_SHARE``."""

    def __init__(self, table: LimitTable, share: tuple[int, int] = (1, 1),
                 locked: Callable[[], AbstractContextManager[Any]] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._table = table
        self._routers = share[1]
        self._locked = locked or contextlib.nullcontext
        self._clock = clock
        self._allowances: dict[KeyLimit, tuple[Allowance | None, Allowance | None]] = {}

    def _of(self, limit: KeyLimit) -> tuple[Allowance | None, Allowance | None]:
        found = self._allowances.get(limit)
        if found is None:
            if len(self._allowances) > 100_000:
                self._allowances.clear()
            found = self._allowances[limit] = (allowance(limit.rpm, self._routers),
                                               allowance(limit.tpm, self._routers))
        return found

    def check(self, key_id: str, limit: KeyLimit, estimate: int) -> Verdict:
        """Take one request and ``estimate`` tokens of the key's allowance when it has
        room; the verdict says which limit refused it otherwise (nothing is taken)."""
        rpm, tpm = self._of(limit)
        with self._locked():
            now = self._clock()
            seen = self._table.read(key_id)
            at, r, t = seen if seen is not None else (now, None, None)
            verdict = decide(r, t, at, now, rpm, tpm, estimate)
            if verdict.allowed:
                self._table.write(key_id, now, full_at(verdict.rpm, verdict.tpm, now, rpm,
                                                       tpm), verdict.rpm, verdict.tpm)
        return verdict

    def settle(self, key_id: str, limit: KeyLimit, charged: int, used: int) -> None:
        """The request that took ``charged`` tokens used ``used``: give back or take the
        difference."""
        rpm, tpm = self._of(limit)
        if tpm is None or charged == used:
            return
        with self._locked():
            now = self._clock()
            seen = self._table.read(key_id)
            at, r, t = seen if seen is not None else (now, None, None)
            r_now = level_at(r, at, now, rpm) if rpm is not None else math.nan
            t_now = settled(t, at, now, tpm, charged, used)
            self._table.write(key_id, now, full_at(r_now, t_now, now, rpm, tpm), r_now, t_now)


def for_this_process() -> LimitTable:
    """The router's shared table when serve.run made one, else a private one."""
    path = os.environ.get(FILE_ENV)
    return LimitTable(path) if path else LimitTable()
