"""Models at capacity: merging routers' reports (POST /api/v1/idle). Pure: ``now`` in.

Each router worker posts, with its idle map, the models it found at capacity since its
last post (every slot taken and requests waiting, or refused). Several routers (and
several workers of one) post about once a second each, so the stored report is a window:
a report within ``CAPACITY_WINDOW_S`` of the window's start is merged into it (waiting,
in flight, slots and the 90th percentile wait: the largest any post saw; refused: the
sum, since each post counts only its own interval); a later one starts a new window.
"""

from __future__ import annotations

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
