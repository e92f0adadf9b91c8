"""Models at capacity and their load: merging routers' reports (POST /api/v1/idle).
Pure: ``now`` in.

Each router worker posts, with its idle map, the models it found at capacity since its
last post (every slot taken and requests waiting, or refused). Several routers (and
several workers of one) post about once a second each, so the stored report is a window:
a report within ``CAPACITY_WINDOW_S`` of the window's start is merged into it (waiting,
in flight, slots and the 90th percentile wait: the largest any post saw; refused: the
sum, since each post counts only its own interval); a later one starts a new window.

The load (what autoscaling reads, control/autoscale.py) is kept apart: each report of a
model, at capacity or not, is a post of its router, and the load is the posts of the last
``LOAD_WINDOW_S``: per router its largest counts (its workers repeat the router's
figures), summed over routers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..api.router import ModelCapacity
from ..status.summary import AT_CAPACITY_S

CAPACITY_WINDOW_S = AT_CAPACITY_S


def merge(stored: dict[str, Any] | None, report: ModelCapacity, now: float) -> dict[str, Any]:
    """The model's capacity record once ``report`` (received at ``now``, store clock) is
    merged into the one stored (None: none)."""
    fresh = {"since": now, "reports": 1, "waiting": report.waiting,
             "in_flight": report.in_flight, "slots": report.slots,
             "rejected": report.rejected, "wait_p90_s": report.wait_p90_s}
    if not stored or not isinstance(stored.get("since"), int | float) \
            or not 0 <= now - stored["since"] <= CAPACITY_WINDOW_S:
        return fresh
    out = dict(fresh, since=stored["since"], reports=int(stored.get("reports", 1)) + 1,
               rejected=int(stored.get("rejected", 0)) + report.rejected)
    for key in ("waiting", "in_flight", "slots", "wait_p90_s"):
        out[key] = max(out[key], stored.get(key) or 0)
    return out


# -- the load signal (docs/autoscaling.md) --------------------------------------------------

LOAD_WINDOW_S = 3.0       # the signal is what routers posted within this many seconds
MAX_LOAD_POSTS = 256      # posts kept per model (routers x workers x posts in the window)
UNKNOWN_ROUTER = "-"      # a router older than IdleMap.router


@dataclass(frozen=True)
class Load:
    """What routers reported of one model within LOAD_WINDOW_S, summed over routers:
    requests waiting, slots busy (each router's peak), refusals for capacity; the longest
    wait any router saw (the p90 of finished waits or the oldest still waiting)."""

    waiting: int = 0
    busy: int = 0
    rejected: int = 0
    wait_s: float = 0.0
    routers: int = 0


def _post(item: Any) -> bool:
    return (isinstance(item, list) and len(item) == 6 and isinstance(item[0], str)
            and all(isinstance(v, int | float) and not isinstance(v, bool)
                    and math.isfinite(v) for v in item[1:]))


def _posts(stored: Any, now: float) -> list[list[Any]]:
    """The stored posts still within the window (anything malformed left out)."""
    items = stored.get("posts") if isinstance(stored, dict) else None
    if not isinstance(items, list):
        return []
    # a post from another control host may read a hair ahead of this one's clock
    return [p for p in items if _post(p) and -1.0 <= now - p[1] <= LOAD_WINDOW_S]


def record_load(stored: Any, router: str | None, report: ModelCapacity,
                now: float) -> dict[str, Any]:
    """The model's load record once ``report`` from ``router`` (received at ``now``, store
    clock) is added: the posts of the last LOAD_WINDOW_S, at most MAX_LOAD_POSTS."""
    posts = _posts(stored, now)
    posts.append([router or UNKNOWN_ROUTER, now, report.waiting,
                  max(report.busy, report.in_flight),
                  max(report.wait_p90_s, report.oldest_wait_s), report.rejected])
    return {"posts": posts[-MAX_LOAD_POSTS:]}


def load_of(stored: Any, now: float) -> Load:
    """The model's load now from its record (None or malformed: nothing reported). One
    router's workers report the same router-wide figures: its largest counts."""
    by_router: dict[str, list[float]] = {}
    for name, _at, waiting, busy, wait_s, rejected in _posts(stored, now):
        got = by_router.setdefault(name, [0, 0, 0.0, 0])
        got[0], got[1] = max(got[0], waiting), max(got[1], busy)
        got[2], got[3] = max(got[2], wait_s), got[3] + rejected
    return Load(waiting=int(sum(g[0] for g in by_router.values())),
                busy=int(sum(g[1] for g in by_router.values())),
                rejected=int(sum(g[3] for g in by_router.values())),
                wait_s=max((g[2] for g in by_router.values()), default=0.0),
                routers=len(by_router))
