"""What the views call to cordon and drain nodes (``ctl nodes cordon|uncordon|drain``):
the store-facing side of control/drain.py's rules. A view parses, calls one of these and
answers; the reconciler (control/decide.py, steps.py) moves the replicas."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

from sqlalchemy.engine import Connection

from ..api.admin import NodeDrain
from ..api.states import ReplicaState
from ..errors import ConflictError, NotFoundError
from ..store import repo
from . import drain, fleet
from .decide import Fleet, Settings, decide


def _node(conn: Connection, name: str) -> Any:
    row = repo.get_node(conn, name)
    if row is None:
        raise NotFoundError(f"there is no node named {name!r}; see `llmgw ctl nodes`")
    return row


def cordon(conn: Connection, name: str, now: float, by: str, on: bool) -> NodeDrain:
    """Cordon the node (no new replica is placed on it; what runs there keeps running), or
    uncordon it (``on`` false: it takes new replicas again, and a drain ends)."""
    row = _node(conn, name)
    state = drain.node_drain(row)
    if on:
        if not row.cordoned:
            repo.set_node_drain(conn, name, True, state)
            repo.add_event(conn, now, "node", name, f"node {name} cordoned by {by}: no new "
                           "replica is placed on it; what runs there keeps running")
    elif row.cordoned or state is not None:
        repo.set_node_drain(conn, name, False, None)
        ended = " and its drain ended" if state is not None and not state.get("done") else ""
        repo.add_event(conn, now, "node", name, f"node {name} uncordoned by {by}{ended}: "
                       "it takes new replicas again")
    return node_drain_status(conn, name, now)


def lose_capacity(fleet_: Fleet, name: str, now: float, settings: Settings) -> dict[str, str]:
    """The models that would have no room for the replacements of their replicas on node
    ``name`` if it were drained, with the planner's reason: a reconcile pass of the fleet
    with the node draining, decided and thrown away. Pure."""
    row = fleet_.nodes[name]
    fields = dict(row._mapping) if hasattr(row, "_mapping") else dict(vars(row))
    fields.update(cordoned=1, drain=json.dumps({"since": now}))
    nodes = {**fleet_.nodes, name: SimpleNamespace(**fields)}
    on_node = {r.model for r in fleet_.replicas if r.desired
               and name in drain.replica_nodes(r, fleet_.parts.get(r.id, []))}
    changes = decide(Fleet(fleet_.models, nodes, fleet_.replicas, fleet_.parts), now, settings)
    return {m: str(reason) for m, reason in sorted(changes.unplaceable.items())
            if m in on_node and reason}


def drain_node(conn: Connection, name: str, now: float, settings: Settings, *,
               force: bool, by: str) -> NodeDrain:
    """Cordon the node and move its replicas elsewhere: each gets a replacement first,
    then drains once the replacement is ready. Refused (ConflictError naming the models
    that would lose capacity) when some have no room elsewhere, unless ``force``: then
    those drain at once and their models run short until there is room."""
    row = _node(conn, name)
    state = drain.node_drain(row)
    if state is not None and not state.get("done"):
        if force and not state.get("force"):
            repo.set_node_drain(conn, name, True, {**state, "force": True})
            repo.add_event(conn, now, "node", name, f"node {name}: drain forced by {by}")
        return node_drain_status(conn, name, now)
    lose = lose_capacity(fleet.read(conn), name, now, settings)
    if lose and not force:
        said = "; ".join(f"{m}: {why}" for m, why in lose.items())
        raise ConflictError(
            f"draining node {name!r} would leave {', '.join(lose)} without room for the "
            f"replicas that run there ({said}). Free room elsewhere first, or pass --force "
            "(drain them anyway: those models lose capacity until there is room)")
    total = sum(1 for r in repo.replicas_using_node(conn, name) if r.desired)
    repo.set_node_drain(conn, name, True, {"since": now, "force": force, "by": by,
                                           "total": total})
    short = f"; {', '.join(lose)} lose capacity (forced)" if lose else ""
    repo.add_event(conn, now, "node", name, f"node {name} draining (by {by}): {total} "
                   f"replica(s) move elsewhere, each once its replacement is ready{short}")
    answer = node_drain_status(conn, name, now)
    return answer.model_copy(update={"lose_capacity": sorted(lose)})


def node_drain_status(conn: Connection, name: str, now: float, settings: Any = None
                      ) -> NodeDrain:
    """The node's cordon and drain: what moved of what was there, what it waits for."""
    row = _node(conn, name)
    state = drain.node_drain(row)
    left = [r for r in repo.replicas_using_node(conn, name) if r.desired]
    if state is None:
        return NodeDrain(node=name, cordoned=bool(row.cordoned), draining=False)
    models = {r.model for r in left}
    others = [r for r in repo.list_replicas(conn) if r.model in models and r.desired
              and r.id not in {x.id for x in left}]
    reasons = {m: getattr(repo.get_model(conn, m, deleted=True), "placement_reason", None)
               for m in models}
    total = max(int(state.get("total") or 0), len(left))
    done = bool(state.get("done")) or not left
    return NodeDrain(node=name, cordoned=bool(row.cordoned), draining=not done, done=done,
                     moved=total - len(left), total=total,
                     waiting_for=None if done else waiting_for(left, others, reasons, now),
                     since=state.get("since"))


def waiting_for(left: list[Any], others: list[Any], reasons: dict[str, str | None],
                now: float) -> str:
    """What a node drain waits for: the first replica still on the node, its drain, its
    replacement, or why there is no room for one. Pure."""
    rep = sorted(left, key=lambda r: (not drain.is_draining(r), r.model, r.id))[0]
    if drain.is_draining(rep):
        view = drain.view(rep, now) or {}
        return (f"{rep.id} ({rep.model}) to finish its {view.get('in_flight', 0)} request(s) "
                f"in flight ({view.get('left_s', 0):.0f} s left)")
    starting = [r for r in others if r.model == rep.model and not drain.is_draining(r)
                and r.state != ReplicaState.READY]
    if starting:
        new = starting[0]
        return (f"{new.id} ({rep.model}) on {new.node} to be ready ({new.state}); then "
                f"{rep.id} drains")
    if reasons.get(rep.model):
        return f"room for a replacement of {rep.id} ({rep.model}): {reasons[rep.model]}"
    return f"a replacement of {rep.id} ({rep.model}) to be placed"
