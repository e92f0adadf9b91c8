"""The fleet service layer: where the control service's rules meet the store.

``read`` gets the fleet from the store, ``decide.decide`` (pure) says what changes, and
``write`` stores it; the reconciler process calls ``reconcile``. The views call this layer
for whatever derives from the fleet or changes it by a rule: a model's state
(``models_view``), the status summary and the plan, the routes table (``routes``, around
the pure ``routes.routes_of``), a router's activation, idle map and unreachable mark, the
catalog, a retry, deleting a model or a node, a credential reset. A view parses, calls and
answers: it does not read tables to derive anything itself (it may list rows as they are,
``repo.list_events``), and views do not import each other. A node's report has its own
layer (control/reports.py, assignments.py), so do API keys (store/accounts.py) and usage
(control/usage.py); the store only stores. Every time that decides liveness, idleness,
backoff or parking is the store's clock (``Store.now``), read once per transaction, so
control instances on hosts whose clocks drift still agree, and a lease, a report and a
reconcile pass measure time alike.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from sqlalchemy.engine import Connection

from ..api import admin
from ..api.admin import Model, NodeDeleted
from ..api.catalog import ModelSpec
from ..api.fields import clean
from ..api.history import MINUTE_S
from ..api.router import ERROR_LINE, ActivateAnswer, IdleMap, Routes, Unreachable
from ..api.states import Activation
from ..catalog.names import fallback_problems, name_clashes
from ..coop import sliced
from ..errors import CatalogError, ConflictError, NotFoundError
from ..fleetvocab import heard_from
from ..placement import place
from ..status import summary as status_summary
from ..status.telling import error_line
from ..store import accounts, history, repo
from ..store.models import spec_of
from . import autoscale, capacity, drain, rollout, rollout_ops, snapshot
from .decide import Changes, Fleet, Settings, decide, unpark_values
from .routes import routes_of
from .states import failing, model_state, start_streak

log = logging.getLogger(__name__)


def replica_view(row: Any, parts: list[Any] | None = None,
                 now: float | None = None) -> dict[str, Any]:
    """A replica as the admin API, the console and the summary show it: its row, its drain
    (``now``, the store's clock, says how long it has left: drain.view) and whether it
    runs its model's current definition (``model_hash``: repo.list_replicas joins it)."""
    return {**repo.replica_to_dict(row, parts), "draining": drain.view(row, now),
            "current": not rollout.is_old(row, getattr(row, "model_hash", None))}


def node_view(row: Any) -> dict[str, Any]:
    """A node as the admin API, the console and the summary show it: its row, and whether
    its replicas are moving elsewhere (a drain not done yet)."""
    return {**repo.node_to_dict(row), "draining": drain.draining_node(row)}


def read(conn: Connection) -> Fleet:
    """The fleet as the store holds it, read in one transaction (deleted models whose
    replicas still drain too)."""
    return Fleet(models={m.name: m for m in repo.list_models(conn, deleted=True)},
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
    """Store what ``decide`` decided, events last and in the order they were decided. The
    pass's deletes, starts, stops and events each go in one statement (a busy host answers
    each round trip late: a churning pass's 100 of them were most of its wall time)."""
    repo.delete_replicas(conn, changes.delete_replicas)
    for name, values in changes.model_updates.items():
        repo.update_model(conn, name, **values)
    for name in set(changes.rollouts) | set(changes.cuts):
        repo.merge_rollout_state(conn, name, changes.rollouts.get(name, {}),
                                 cut=changes.cuts.get(name, 0))
    for name, problem in changes.node_problems.items():
        repo.set_plan_problem(conn, name, problem)
    repo.add_replicas(conn, changes.starts, now)
    repo.update_replicas(conn, changes.undrains, updated=now, **drain.UNDRAIN_VALUES)
    for replica_id, reason, timeout in changes.drains:
        repo.update_replica(conn, replica_id, updated=now,
                            **drain.drain_values(reason, timeout, now))
    repo.update_replicas(conn, [replica_id for replica_id, _ in changes.stops], desired=0,
                         state="stopping", updated=now)
    for name in changes.delete_models:
        if repo.get_model(conn, name, deleted=True) is not None \
                and repo.get_model(conn, name) is None:   # still deleted, not applied again
            repo.delete_model(conn, name)
    for name in changes.nodes_drained:
        row = repo.get_node(conn, name)
        state = drain.node_drain(row) if row is not None else None
        if state is not None:
            repo.set_node_drain(conn, name, True, {**state, "done": now})
    repo.add_events(conn, now, changes.events)


def reconcile(conn: Connection, now: float, settings: Settings,
              view: Any | None = None) -> tuple[Changes, Fleet]:
    """One pass: read, decide, write. With ``view`` (the leader's fleet in memory,
    control/incremental.py) only what changed since its last pass is read; else all of it.
    Returns the changes (the reconciler logs from them) and the fleet it read, whose node
    rows the pass changes only in their ``plan_problem``, set into the view's records
    after the write (the device clock counts with them instead of reading every node's
    report again)."""
    fleet = read(conn) if view is None else view.refresh(conn, now)
    changes = decide(fleet, now, settings)
    write(conn, changes, now)
    if view is not None:
        view.wrote(changes.node_problems)
    return changes, fleet


# ------------------------------------------------------------------ what views ask


def models_view(conn: Connection, now: float,
                backoff: tuple[float, float] | None = None) -> list[dict[str, Any]]:
    """Every model with its state (``ctl models``, the console, the status summary); with
    the reconciler's ``backoff``, also a failing model's streak (``states.failing``)."""
    reps_by_model: dict[str, list[Any]] = {}
    for rep in repo.list_replicas(conn):
        reps_by_model.setdefault(rep.model, []).append(rep)
    out = []
    for row in repo.list_models(conn):
        item = repo.model_to_dict(row)
        reps = reps_by_model.get(row.name, [])
        state = model_state(row, reps, now)
        serving = [r for r in reps if not drain.is_draining(r)]
        item.update(state=state.state, reason=state.reason, ready=state.ready,
                    wanted=state.wanted, scaling=autoscale.view(row, serving, now))
        if backoff is not None:
            item["failing"] = failing(row, reps, state, now, backoff)
        out.append(item)
    return out


def model_answers(conn: Connection, now: float) -> list[Model]:
    """``models_view`` as the admin API answers it (``api.admin.Model``)."""
    return [Model.model_validate(item) for item in models_view(conn, now)]


def summary(conn: Connection, now: float, settings: Settings, *, idle_after_s: float,
            store: dict[str, Any]) -> dict[str, Any]:
    """The fleet summary as the plain definition reads it (every row, every node's JSON
    decoded). The views use control/summary_view.py, which must answer the same at 10,000
    nodes within the status targets; tests/control/test_summary_view.py holds it to this."""
    models = models_view(conn, now, settings.backoff)
    nodes = [node_view(n) for n in repo.list_nodes(conn)]
    parts = repo.parts_by_replica(conn)
    replicas = [replica_view(r, parts.get(r.id), now)
                for r in repo.list_replicas(conn)]
    return status_summary.build(models, nodes, replicas, now, settings.node_timeout_s,
                                idle_after_s=idle_after_s, store=store)


def plan_view(conn: Connection, now: float, settings: Settings) -> admin.Plan:
    """What placement would do now, without doing it, and why (``ctl plan``)."""
    fleet = read(conn)
    live = [r for r in fleet.replicas if r.desired and r.state != "failed"]
    result = place(dry_snapshot(fleet, now, settings))
    node_dicts = [node_view(n) for n in fleet.nodes.values()]
    replica_dicts = [replica_view(r, fleet.parts.get(r.id), now) for r in live]
    by_id = {r.id: r for r in live}
    used = status_summary.used_devices(replica_dicts)
    listed = [repo.model_to_dict(m) for m in fleet.models.values()
              if getattr(m, "deleted_at", None) is None]
    facts = {n["name"]: status_summary.node_facts(n) for n in node_dicts}   # made once
    fabrics, model_weights = status_summary.fabrics(listed, node_dicts, now,
                                                    settings.node_timeout_s, used, facts)
    return admin.Plan(
        starts=[admin.PlanStart(model=s.model, node=s.node, devices=list(s.devices),
                                parts=[admin.PlanPart(rank=p.rank, node=p.node,
                                                      devices=list(p.devices))
                                       for p in s.parts], why=s.why)
                for s in result.starts],
        stops=[admin.PlanStop(replica=rid, model=getattr(by_id.get(rid), "model", None),
                              node=getattr(by_id.get(rid), "node", None),
                              why=result.stop_reasons.get(rid, "no longer wanted"))
               for rid in result.stops],
        unplaceable=dict(result.unplaceable),
        devices=status_summary.devices_by_class(
            node_dicts, replica_dicts, now, settings.node_timeout_s, used, listed, facts),
        cards_unusable=status_summary.idle_cards(node_dicts, facts),
        fabrics=fabrics, models=model_weights)


def staying_names(conn: Connection, prune: bool,
                  stored: list[Any] | None = None) -> dict[str, tuple[str, ...]]:
    """The models in the store that a catalog's apply keeps beside the models it names
    (none with ``prune``), with their aliases: fallbacks may name them, aliases must not
    take their names (catalog/parse.validate's ``others``). ``stored``: ``repo.all_models``
    as the transaction read it, else read here."""
    if prune:
        return {}
    rows = repo.list_models(conn) if stored is None else repo.listed(stored)
    # 1,000 models: 30 ms, a gevent worker's loop serving meanwhile (llmgw_runtime/coop.py)
    return {m.name: spec_of(m).aliases for m in sliced(rows)}


def apply_catalog(conn: Connection, specs: list[ModelSpec], now: float,
                  prune: bool, stored: list[Any] | None = None) -> dict[str, Any]:
    """Store the catalog; a new definition of a model forgets its failures and unparks it,
    and rolls the replicas that run another one (``rolls``; the old entry is kept for
    ``ctl rollout undo``). The rules live here, the store only stores. Idempotent: the same
    specs again change nothing and log no event. ``stored``: every model row as this
    transaction read it (``repo.all_models``), read once for all three of its questions."""
    stored = repo.all_models(conn) if stored is None else stored
    named = {s.name for s in specs}
    # the models that stay (no --prune) must not share a name with the new ones, and
    # fallbacks may name them
    staying = {n: a for n, a in staying_names(conn, prune, stored).items() if n not in named}
    clashes = name_clashes(specs, staying) + fallback_problems(specs, staying)
    if clashes:
        raise CatalogError("the catalog does not fit the models it names; nothing was "
                           "applied", details=clashes[:20] + [
                               "rename the alias or the fallback; --prune drops the "
                               "models the catalog no longer lists"])
    return rollout_ops.apply_specs(conn, specs, now, prune, stored)


def unpark(conn: Connection, name: str, now: float, by: str = "an operator") -> bool:
    """Forget ``name``'s failures and unpark it (``ctl retry``, the console's Retry);
    returns whether it was parked. The event says who."""
    row = repo.get_model(conn, name)
    if row is None:
        raise NotFoundError(f"model {name!r} is not in the catalog")
    values = unpark_values()
    values.pop("last_error")
    repo.update_model(conn, name, **values)
    rollout_ops.forget_failure(conn, row, now)
    repo.add_event(conn, now, "retry", name, f"unparked by {by}" if row.parked
                   else f"failures forgotten by {by} (it was not parked)")
    return bool(row.parked)


def delete_model(conn: Connection, name: str, now: float) -> None:
    """Remove ``name`` from the catalog: it leaves every list at once; its ready replicas
    drain (the requests in flight finish), then the row goes with the last of them."""
    if not repo.delete_model(conn, name, now):
        raise NotFoundError(f"model {name!r} is not in the catalog")
    repo.add_event(conn, now, "catalog", name, "model deleted")


def reset_node(conn: Connection, name: str, now: float, by: str) -> None:
    """Forget the node's credential: its (reinstalled) host joins again with the join
    token, and whatever holds the old credential can no longer report."""
    if not repo.reset_node_credential(conn, name):
        raise NotFoundError(f"there is no node named {name!r}; see `llmgw ctl nodes`")
    repo.add_event(conn, now, "node", name,
                   f"credential reset by {by}: the old credential is refused; the host "
                   "joins again with the join token")


def delete_node(conn: Connection, name: str, now: float, settings: Settings, *,
                force: bool, by: str) -> NodeDeleted:
    """Delete a node that is gone, with the replicas that used it (the next pass places
    them again elsewhere). A node heard from within the node timeout is refused unless
    ``force``: its agent looks alive and would join again at once, as a new node."""
    row = repo.get_node(conn, name)
    if row is None:
        raise NotFoundError(f"there is no node named {name!r}; see `llmgw ctl nodes`")
    timeout = settings.node_timeout_s
    if heard_from(row.last_report, now, timeout) and not force:
        silent = now - row.last_report
        raise ConflictError(
            f"node {name!r} reported {max(0.0, silent):.0f} s ago (within the node "
            f"timeout of {timeout:g} s): its agent looks alive, and a live agent whose "
            "node is deleted joins again with the join token at once, as a new node. "
            f"Stop the agent on {name} first, wait {timeout:g} s and delete it again; "
            "or pass --force (?force=true) to delete it now")
    gone = repo.delete_node(conn, name) or []
    for rep in gone:
        repo.add_event(conn, now, "stop", rep.model,
                       f"replica {rep.id} deleted with node {name}; it is placed again "
                       "elsewhere")
    repo.add_event(conn, now, "node", name,
                   f"node deleted by {by}" + (" (forced)" if force else "")
                   + f" with {len(gone)} replica(s) that used it")
    return NodeDeleted(deleted=name, replicas=[r.id for r in gone])


def activate(conn: Connection, name: str, now: float, settings: Settings) -> ActivateAnswer:
    """Someone wants ``name`` now: forget the last placement result, want an on-demand
    model, and try placing at once. Answers the router with the state, its reason and the
    current start streak. A model whose current streak failed keeps its activation time, so
    the failure stays current for every router (``states.start_streak``) until the next
    start."""
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
    answer = Activation("starting" if state.state in ("idle", "activating") and not reason
                        else state.state)
    return ActivateAnswer(model=name, state=answer,
                          reason=error_line(clean(state.reason), ERROR_LINE),
                          failures=streak["failures"],
                          last_error=error_line(clean(streak["last_error"]), ERROR_LINE),
                          retry_after_s=streak["retry_after_s"])


# ------------------------------------------------------------------ what routers ask


def routes(conn: Connection, now: float, backoff: tuple[float, float]) -> Routes:
    """The routes table (``GET /api/v1/routes``): the rows it is made of, read in one
    transaction, through the pure ``routes.routes_of``."""
    return routes_of(repo.list_models(conn), {n.name: n for n in repo.list_nodes(conn)},
                     repo.list_replicas(conn), accounts.accounts_of_kind(conn, "api_key"),
                     now, backoff)


def record_idle(conn: Connection, body: IdleMap, now: float) -> None:
    """A router's idle map: each replica's last use and each model's load, what the
    posting worker has in flight on each draining replica, and a canary's requests per
    version. Idempotent for the last use (the newest time wins); the rest is this
    worker's latest word, so it is retried through a store failover."""
    # Routers send seconds since last use; the store's clock makes them times, so a
    # router host's clock never decides idleness.
    known = {r.id: r for r in repo.list_replicas(conn)}
    for replica_id, ago in body.replicas.items():
        when = now - ago
        row = known.get(replica_id)
        # Several routers post maps: keep the newest time seen.
        if row is not None and (row.last_used is None or when > row.last_used):
            repo.update_replica(conn, replica_id, last_used=float(when))
    _record_in_flight(conn, body, known, now)
    # Each model's load joins its router's posts (control/capacity.py: what autoscaling
    # reads); one at capacity is merged into the window of such reports too. A retry
    # after a failover may count one post's refusals twice: a display figure, and one
    # more reason to scale up.
    rows = repo.models_named(conn, set(body.capacity))
    loads: dict[str, capacity.Load] = {}
    for name, report in body.capacity.items():
        row = rows.get(name)
        if row is None:
            continue
        load = capacity.record_load(json.loads(row.load) if row.load else None,
                                    body.router, report, now)
        loads[name] = capacity.load_of(load, now)
        values: dict[str, Any] = {"load": json.dumps(load)}
        if report.at_capacity:
            stored = json.loads(row.capacity) if row.capacity else None
            values.update(capacity_at=now,
                          capacity=json.dumps(capacity.merge(stored, report, now)))
        repo.update_model(conn, name, **values)
    _record_history(conn, body, loads, now)
    for name, counts in body.versions.items():
        row = repo.get_model(conn, name)
        state = rollout.parse_state(row.rollout_state) if row is not None else {}
        if state.get("state") == rollout.CANARY:
            added = rollout.add_versions(state, counts)
            repo.merge_rollout_state(conn, name, {"versions": added["versions"]})


def _record_history(conn: Connection, body: IdleMap, loads: dict[str, capacity.Load],
                    now: float) -> None:
    """The post's requests answered (its first-byte counts) and refused, and the load
    summed over routers after it, into each model's minute of the fleet's history
    (store/history.py, control/history.py); models in name order, so two posts at once
    lock their rows in the same order. Nothing for a model with none of these."""
    minute = history.period_of(now, MINUTE_S)
    for name in sorted(loads):
        report, load = body.capacity[name], loads[name]
        answered = sum(report.first_byte)
        if answered or report.rejected or load.waiting or load.busy:
            history.add_post(conn, name, minute, requests=answered, refused=report.rejected,
                             first_byte=report.first_byte, waiting=load.waiting,
                             busy=load.busy)


def _record_in_flight(conn: Connection, body: IdleMap, known: dict[str, Any],
                      now: float) -> None:
    """This router worker's requests in flight on each draining replica (0 when the map
    does not name it), the rows locked so concurrent posts add up."""
    if not any(drain.is_draining(r) for r in known.values()):
        return
    worker = f"{body.router or '?'}/{body.worker or '?'}"
    for row in repo.draining_replicas(conn, lock=True):
        stored = drain.record_in_flight(row.in_flight, worker,
                                        body.in_flight.get(row.id, 0), now)
        repo.update_replica(conn, row.id, in_flight=stored)


def drain_cut_totals(conn: Connection) -> dict[str, int]:
    """Requests cut by drain timeouts, by model (``llmgw_drain_cut_requests_total``):
    counted on the model's row, deleted models whose replicas still drain included."""
    out = {}
    for row in repo.list_models(conn, deleted=True):
        cut = rollout.parse_state(row.rollout_state).get("cut")
        if isinstance(cut, int) and cut > 0:
            out[row.name] = cut
    return out


def mark_unreachable(conn: Connection, body: Unreachable, now: float) -> None:
    """A router could not connect to a replica: it is not routed until a report of its
    agent, received after this mark, says ready. Idempotent: only a ready replica is
    marked."""
    row = repo.mark_unreachable(conn, body.replica_id, now,
                                f"a router could not connect to it: {body.reason}")
    if row is not None:
        repo.add_event(conn, now, "unreachable", row.model,
                       f"replica {row.id} on {row.node} is unreachable from a router "
                       f"({body.reason}); not routed until its agent reports it ready again")
