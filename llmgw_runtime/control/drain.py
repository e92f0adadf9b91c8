"""Draining replicas and nodes, as pure rules (docs/operations.md, "graceful stops").

A replica that is to stop while it serves (ready, on nodes heard from) first *drains*: its
row keeps ``desired`` (its agent keeps the engine running), ``drain_since`` says since
when, the routes table stops sending it new requests, and the routers post what they still
have in flight there (``IdleMap.in_flight``, one entry per router worker in the row's
``in_flight`` JSON: ``{worker: [count, store time]}``). It stops once every router worker
heard from lately says none is left, or when its ``drain_timeout_s`` is over (what is left
is cut, and counted). A node drain moves every replica off a node: each gets a replacement
elsewhere first (control/rollout.py counts them), then drains.

No I/O, no clock: ``now`` (the store's clock) is passed in. control/decide.py applies these
rules in a reconcile pass; control/fleet.py and control/drain_ops.py store them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..api.catalog import default
from ..api.states import ReplicaState

SETTLE_S = 3.0           # routers refresh routes every 1 s and post every 1 s
STALE_S = 10.0           # a router worker not heard from for this long no longer counts
KEEP_S = 60.0            # entries older than this are dropped from the row
DEFAULT_TIMEOUT_S = float(default("drain_timeout_s"))   # the catalog's (model row gone)

# Why a replica drains (replicas.drain_reason): the words ``ctl replicas`` shows.
IDLE = "idle stop"
SCALE_DOWN = "scale-down"
DELETED = "model deleted"
PARKED = "model parked"
ROLLOUT = "rollout"
NODE_DRAIN = "node drain"
# A draining replica of these may serve again when its model wants it back.
UNDRAINABLE = frozenset({IDLE, SCALE_DOWN, DELETED})


def is_draining(rep: Any) -> bool:
    """A wanted replica that finishes its requests in flight before it stops."""
    return bool(rep.desired) and getattr(rep, "drain_since", None) is not None


def in_flight_of(rep: Any) -> dict[str, list[float]]:
    """The row's ``in_flight`` JSON: ``{router worker: [count, store time]}``."""
    return parse_in_flight(getattr(rep, "in_flight", None))


def parse_in_flight(text: str | None) -> dict[str, list[float]]:
    """``in_flight`` JSON as stored; anything unreadable reads as no entry."""
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return {}
    if not isinstance(value, dict):
        return {}
    return {str(k): v for k, v in value.items()
            if isinstance(v, list) and len(v) == 2
            and all(isinstance(x, int | float) and not isinstance(x, bool) for x in v)}


def fresh_in_flight(rep: Any, now: float, stale_s: float = STALE_S) -> list[int]:
    """What each router worker heard from within ``stale_s`` says it has in flight."""
    return [int(count) for count, at in in_flight_of(rep).values() if now - at <= stale_s]


def record_in_flight(stored: str | None, worker: str, count: int, now: float) -> str:
    """The ``in_flight`` JSON once ``worker`` said it has ``count`` in flight at ``now``
    (entries not heard from for ``KEEP_S`` are dropped)."""
    value = {k: v for k, v in parse_in_flight(stored).items() if now - v[1] <= KEEP_S}
    value[worker] = [max(0, int(count)), now]
    return json.dumps(value, sort_keys=True)


@dataclass(frozen=True)
class Verdict:
    """A draining replica stops now: ``cut`` requests were still in flight (0: drained)."""

    cut: int
    message: str


def verdict(rep: Any, now: float, settle_s: float = SETTLE_S,
            stale_s: float = STALE_S) -> Verdict | None:
    """Whether a draining replica stops now, and the event's words; None: it keeps
    draining. Drained: ``settle_s`` passed (every router has its new routes) and every
    router worker heard from lately says 0. Timed out: its ``drain_timeout_s`` passed."""
    since = float(rep.drain_since)
    counts = fresh_in_flight(rep, now, stale_s)
    timeout = float(getattr(rep, "drain_timeout_s", None) or DEFAULT_TIMEOUT_S)
    waited = now - since
    if waited >= settle_s and not any(counts):
        return Verdict(0, f"replica {rep.id} drained after {waited:.0f} s; stopping")
    if waited >= timeout:
        cut = sum(counts)
        return Verdict(cut, f"replica {rep.id} still had {cut} request(s) in flight "
                            f"after its drain timeout of {timeout:g} s; stopping and "
                            f"cutting them")
    return None


def stop_at_once(rep: Any, heard: bool) -> str | None:
    """Why a draining replica stops without waiting (None: it waits): its node went
    silent, or it no longer serves (its agent reports it not ready)."""
    if not heard:
        return f"replica {rep.id} is on a node not heard from; stopping it at once"
    if rep.state != ReplicaState.READY:
        return f"replica {rep.id} is {rep.state} while draining; stopping it at once"
    return None


def view(rep: Any, now: float | None) -> dict[str, Any] | None:
    """What ``ctl replicas`` shows of a draining replica (api/admin.py ``ReplicaDrain``):
    why, what the routers heard from lately say is in flight, and the seconds left before
    what is left is cut. Without ``now``, the routers' latest post stands for it (they post
    every second while a replica drains). None: it does not drain."""
    if not is_draining(rep):
        return None
    since = float(rep.drain_since)
    timeout = float(getattr(rep, "drain_timeout_s", None) or DEFAULT_TIMEOUT_S)
    if now is None:
        now = max([since, *(at for _, at in in_flight_of(rep).values())])
    return {"reason": rep.drain_reason or "stopping",
            "in_flight": sum(fresh_in_flight(rep, now)),
            "left_s": round(max(0.0, since + timeout - now), 1), "since": since}


def drain_values(reason: str, timeout_s: float | None, now: float) -> dict[str, Any]:
    """A replica's row once it starts draining."""
    return {"drain_since": now, "drain_reason": reason,
            "drain_timeout_s": float(timeout_s or DEFAULT_TIMEOUT_S), "in_flight": None}


UNDRAIN_VALUES: dict[str, Any] = {"drain_since": None, "drain_reason": None,
                                  "drain_timeout_s": None, "in_flight": None}


# ------------------------------------------------------------------ nodes


def node_drain(row: Any) -> dict[str, Any] | None:
    """A node's ``drain`` JSON ({since, force, by, total, done}), None when not draining."""
    text = getattr(row, "drain", None)
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def cordoned(row: Any) -> bool:
    """No new replica is placed on it: cordoned, or draining."""
    return bool(getattr(row, "cordoned", 0)) or node_drain(row) is not None


def draining_node(row: Any) -> bool:
    """Its replicas are moving elsewhere (a drain not done yet)."""
    drain = node_drain(row)
    return drain is not None and not drain.get("done")


def draining_nodes(rows: Iterable[Any]) -> set[str]:
    """The names of the nodes whose replicas are moving elsewhere (:func:`draining_node`;
    a node with no drain at all is passed over without parsing)."""
    return {row.name for row in rows if getattr(row, "drain", None) and draining_node(row)}


def replica_nodes(rep: Any, parts: list[Any]) -> set[str]:
    return {rep.node, *(p.node for p in parts)}

