"""The fleet service layer: the one place the control service's rules are applied.

``read`` gets the fleet from the store, ``decide.decide`` (pure) says what changes, and
``write`` stores it. The reconciler process and every view call only this layer (views do
not import each other and do not read tables to derive anything themselves); the store only
stores. Every time that decides liveness, idleness, backoff or parking is the store's clock
(``Store.now``), read once per transaction, so control instances on hosts whose clocks
drift still agree, and a lease, a report and a reconcile pass measure time alike.
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy.engine import Connection

from ..api.catalog import ModelSpec
from ..catalog.names import fallback_problems, name_clashes
from ..errors import CatalogError, NotFoundError
from ..placement import place
from ..status import summary as status_summary
from ..store import repo
from ..store.models import row_to_spec
from . import autoscale, snapshot
from .decide import Changes, Fleet, Settings, decide, new_definition, unpark_values
from .states import model_state, start_streak

log = logging.getLogger(__name__)


def read(conn: Connection) -> Fleet:
    """The fleet as the store holds it, read in one transaction."""
    return Fleet(models={m.name: m for m in repo.list_models(conn)},
                 nodes={n.name: n for n in repo.list_nodes(conn)},
                 replicas=repo.list_replicas(conn), parts=repo.parts_by_replica(conn))


def dry_snapshot(fleet: Fleet, now: float, settings: Settings) -> Any:
    """The planner's snapshot of the fleet as it stands, its failed replicas left out
    (what ``ctl plan`` and an activation place against)."""
    live = [r for r in fleet.replicas if r.desired and r.state != "failed"]
    return snapshot.build(list(fleet.models.values()), list(fleet.nodes.values()), live,
                          now, settings.node_timeout_s, parts=fleet.parts,
                          replace_after_s=settings.replace_after_s, backoff=settings.backoff)


def write(conn: Connection, changes: Changes, now: float) -> None:
    """Store what ``decide`` decided, events last and in the order they were decided."""
    for replica_id in changes.delete_replicas:
        repo.delete_replica(conn, replica_id)
    for name, values in changes.model_updates.items():
        repo.update_model(conn, name, **values)
    for name, problem in changes.node_problems.items():
        repo.set_plan_problem(conn, name, problem)
    for start in changes.starts:
        repo.add_replica(conn, start.replica_id, start.model, start.node, start.devices, now,
                         parts=start.parts, rendezvous_port=start.rendezvous_port)
    for replica_id, _ in changes.stops:
        repo.update_replica(conn, replica_id, desired=0, state="stopping", updated=now)
    for kind, subject, message in changes.events:
        repo.add_event(conn, now, kind, subject, message)


def reconcile(conn: Connection, now: float, settings: Settings) -> Changes:
    """One pass: read, decide, write. Returns the changes (the reconciler logs from them)."""
    changes = decide(read(conn), now, settings)
    write(conn, changes, now)
    return changes


# ------------------------------------------------------------------ what views ask


def models_view(conn: Connection, now: float) -> list[dict[str, Any]]:
    """Every model with its state (``ctl models``, the console, the status summary)."""
    reps_by_model: dict[str, list[Any]] = {}
    for rep in repo.list_replicas(conn):
        reps_by_model.setdefault(rep.model, []).append(rep)
    out = []
    for row in repo.list_models(conn):
        item = repo.model_to_dict(row)
        reps = reps_by_model.get(row.name, [])
        state = model_state(row, reps, now)
        item.update(state=state.state, reason=state.reason, ready=state.ready,
                    wanted=state.wanted, scaling=autoscale.view(row, reps, now))
        out.append(item)
    return out


def summary(conn: Connection, now: float, settings: Settings, *, idle_after_s: float,
            store: dict[str, Any]) -> dict[str, Any]:
    """The fleet summary every status view renders, from one read of the store."""
    models = models_view(conn, now)
    nodes = [repo.node_to_dict(n) for n in repo.list_nodes(conn)]
    parts = repo.parts_by_replica(conn)
    replicas = [repo.replica_to_dict(r, parts.get(r.id)) for r in repo.list_replicas(conn)]
    return status_summary.build(models, nodes, replicas, now, settings.node_timeout_s,
                                idle_after_s=idle_after_s, store=store)


def plan_view(conn: Connection, now: float, settings: Settings) -> dict[str, Any]:
    """What placement would do now, without doing it, and why (``ctl plan``)."""
    fleet = read(conn)
    live = [r for r in fleet.replicas if r.desired and r.state != "failed"]
    result = place(dry_snapshot(fleet, now, settings))
    node_dicts = [repo.node_to_dict(n) for n in fleet.nodes.values()]
    replica_dicts = [repo.replica_to_dict(r, fleet.parts.get(r.id)) for r in live]
    by_id = {r.id: r for r in live}
    used = status_summary.used_devices(replica_dicts)
    fabrics, model_weights = status_summary.fabrics(
        [repo.model_to_dict(m) for m in fleet.models.values()], node_dicts, now,
        settings.node_timeout_s, used)
    return {
        "starts": [{"model": s.model, "node": s.node, "devices": list(s.devices),
                    "parts": [{"rank": p.rank, "node": p.node, "devices": list(p.devices)}
                              for p in s.parts], "why": s.why}
                   for s in result.starts],
        "stops": [{"replica": rid, "model": getattr(by_id.get(rid), "model", None),
                   "node": getattr(by_id.get(rid), "node", None),
                   "why": result.stop_reasons.get(rid, "no longer wanted")}
                  for rid in result.stops],
        "unplaceable": result.unplaceable,
        "devices": status_summary.devices_by_class(
            node_dicts, replica_dicts, now, settings.node_timeout_s, used,
            [repo.model_to_dict(m) for m in fleet.models.values()]),
        "cards_unusable": status_summary.idle_cards(node_dicts),
        "fabrics": fabrics,
        "models": model_weights,
    }


def apply_catalog(conn: Connection, specs: list[ModelSpec], now: float,
                  prune: bool) -> dict[str, list[str]]:
    """Store the catalog; a new definition of a model forgets its failures and unparks it
    (the rule lives here, the store only stores). Idempotent: the same specs again change
    nothing and log no event."""
    rows = repo.list_models(conn)
    before = {m.name: m.definition_hash for m in rows}
    named = {s.name for s in specs}
    # the models that stay (no --prune) must not share a name with the new ones, and
    # fallbacks may name them
    staying = {} if prune else {m.name: row_to_spec(m).aliases for m in rows
                                if m.name not in named}
    clashes = name_clashes(specs, staying) + fallback_problems(specs, staying)
    if clashes:
        raise CatalogError("the catalog does not fit the models it names; nothing was "
                           "applied", details=clashes[:20] + [
                               "rename the alias or the fallback; --prune drops the "
                               "models the catalog no longer lists"])
    result = repo.apply_catalog(conn, specs, now, prune=prune)
    for spec in specs:
        if new_definition(before.get(spec.name), spec.definition_hash):
            repo.update_model(conn, spec.name, **unpark_values())
    for verb in ("created", "updated", "deleted"):
        for name in result[verb]:
            repo.add_event(conn, now, "catalog", name, f"model {verb}")
    return result


def unpark(conn: Connection, name: str, now: float, by: str = "an operator") -> bool:
    """Forget ``name``'s failures and unpark it (``ctl retry``, the console's Retry);
    returns whether it was parked. The event says who."""
    row = repo.get_model(conn, name)
    if row is None:
        raise NotFoundError(f"model {name!r} is not in the catalog")
    values = unpark_values()
    values.pop("last_error")
    repo.update_model(conn, name, **values)
    repo.add_event(conn, now, "retry", name, f"unparked by {by}" if row.parked
                   else f"failures forgotten by {by} (it was not parked)")
    return bool(row.parked)


def activate(conn: Connection, name: str, now: float, settings: Settings
             ) -> tuple[str, str | None, dict[str, Any]]:
    """Someone wants ``name`` now: forget the last placement result, want an on-demand
    model, and try placing at once. Returns (state, reason, the current start streak)
    for the router. A model whose current streak failed keeps its activation time, so the
    failure stays current for every router (``states.start_streak``) until the next start."""
    model = repo.get_model(conn, name)
    if model is None:
        raise NotFoundError(f"model {name!r} is not in the catalog")
    streak = start_streak(model, now, settings.backoff)
    repo.update_model(conn, name, placement_reason=None,
                      activated_at=now if model.on_demand and not streak["failures"]
                      else model.activated_at)
    fleet = read(conn)
    plan = place(dry_snapshot(fleet, now, settings))
    reason = plan.unplaceable.get(name)
    if reason:
        repo.update_model(conn, name, placement_reason=reason)
    model = repo.get_model(conn, name)
    state = model_state(model, [r for r in fleet.replicas if r.model == name], now)
    if state.state in ("idle", "activating") and not reason:
        return "starting", state.reason, streak
    return state.state, state.reason, streak
