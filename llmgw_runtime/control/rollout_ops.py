"""What the views call for rollouts (``ctl rollout status|undo|promote``, ``ctl apply``'s
"rolls"): the store-facing side of control/rollout.py's rules. A view parses, calls one of
these and answers; the reconciler (control/decide.py) carries the rollout out."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy.engine import Connection

from ..api.admin import ModelChange, RolloutStatus, VersionTally
from ..api.catalog import ModelSpec
from ..api.states import ReplicaState
from ..coop import sliced
from ..errors import ConflictError, NotFoundError
from ..store import repo
from ..store.models import row_to_spec
from . import catalog_diff, drain, rollout
from .decide import new_definition, unpark_values
from .states import wanted_replicas


def apply_specs(conn: Connection, specs: list[ModelSpec], now: float,
                prune: bool, stored: list[Any] | None = None) -> dict[str, Any]:
    """Store catalog entries (checked by the caller) with what a new definition means: its
    failures are forgotten, it is unparked, and the replicas that run another definition
    roll (``rolls``). Events for what was created, updated and deleted. ``changes``: per
    updated model, its changed fields and the replicas it replaces (api.admin.ModelChange)."""
    stored = repo.all_models(conn) if stored is None else stored
    rows = {m.name: m for m in repo.listed(stored)}
    result: dict[str, Any] = repo.apply_catalog(conn, specs, now, prune=prune, stored=stored)
    replaces = start_rollouts(conn, rows, specs, now)
    result["rolls"] = sorted(replaces)
    by_name = {s.name: s for s in specs}
    result["changes"] = {name: ModelChange(
        fields=catalog_diff.field_changes(row_to_spec(rows[name]), by_name[name]),
        replaces=replaces.get(name, [])) for name in result["updated"]}
    for spec in sliced(specs):  # a gevent worker's loop keeps serving (llmgw_runtime/coop.py)
        old = rows.get(spec.name)
        if new_definition(getattr(old, "definition_hash", None), spec.definition_hash):
            repo.update_model(conn, spec.name, **unpark_values())
    for verb in ("created", "updated", "deleted"):
        for name in result[verb]:
            repo.add_event(conn, now, "catalog", name, f"model {verb}")
    return result


def start_rollouts(conn: Connection, before: dict[str, Any], specs: list[ModelSpec],
                   now: float) -> dict[str, list[str]]:
    """After a catalog is stored: the models whose serving replicas run another definition
    than their new one start to roll (the old entry is kept for ``ctl rollout undo``).
    Returns their names, each with the ids of the replicas the rollout replaces. The
    replicas are read only when a stored model's definition changed (most applies change
    none: a replica count, a new model; at 10,000 nodes that read was 4,000 rows on the web
    worker answering half the fleet's heartbeats)."""
    changed = [(spec, before[spec.name]) for spec in sliced(specs) if spec.name in before
               and before[spec.name].definition_hash != spec.definition_hash]
    if not changed:
        return {}
    serving: dict[str, list[Any]] = {}
    for rep in repo.list_replicas(conn):
        if rep.desired and rep.state != ReplicaState.FAILED and not drain.is_draining(rep):
            serving.setdefault(rep.model, []).append(rep)
    rolls: dict[str, list[str]] = {}
    for spec, old in changed:
        runs = [r for r in serving.get(spec.name, [])
                if (r.definition_hash or old.definition_hash) != spec.definition_hash]
        if not runs:
            continue
        rolls[spec.name] = sorted(r.id for r in runs)
        row = repo.get_model(conn, spec.name)
        repo.update_model(conn, spec.name, previous_definition=row_to_spec(old)
                          .model_dump_json(by_alias=True))
        state = repo.merge_rollout_state(conn, spec.name,
                                         rollout.started(row, old.definition_hash, now))
        how = (f"a canary with {rollout.settings_of(row).canary_percent} % of the requests "
               "until `llmgw ctl rollout promote`"
               if (state or {}).get("state") == rollout.CANARY else "replaced one by one")
        repo.add_event(conn, now, rollout.EVENT, spec.name,
                       f"rollout of {spec.name} started: {len(runs)} replica(s) run "
                       f"definition {old.definition_hash[:12]}; the new one "
                       f"{spec.definition_hash[:12]} starts beside them ({how})")
    return rolls


def forget_failure(conn: Connection, row: Any, now: float) -> None:
    """``ctl retry``: a failed rollout tries its new definition again."""
    state = rollout.parse_state(row.rollout_state)
    if state.get("state") != rollout.FAILED:
        return
    canary = rollout.settings_of(row).canary_percent and not state.get("promoted")
    repo.merge_rollout_state(conn, row.name, {
        "state": rollout.CANARY if canary else rollout.ROLLING, "error": None,
        "failed_at": None, "hash": row.definition_hash})


def _model(conn: Connection, name: str) -> Any:
    row = repo.get_model(conn, name)
    if row is None:
        raise NotFoundError(f"model {name!r} is not in the catalog; see `llmgw ctl models`")
    return row


def rollout_status(conn: Connection, name: str, now: float, settings: Any = None
                   ) -> RolloutStatus:
    """Where the model's rollout stands (``ctl rollout status``)."""
    row = _model(conn, name)
    reps = [r for r in repo.list_replicas(conn) if r.model == name and r.desired
            and r.state != ReplicaState.FAILED]
    return status_of(row, reps, now)


def status_of(row: Any, reps: list[Any], now: float) -> RolloutStatus:
    """The rollout of a model (its row and wanted replicas), as ``ctl rollout status``
    shows it. Pure."""
    serving = [r for r in reps if not drain.is_draining(r)]
    old = [r for r in serving if rollout.is_old(r, row.definition_hash)]
    new = [r for r in serving if not rollout.is_old(r, row.definition_hash)]
    mode = rollout.mode_of(row, bool(old))
    state = rollout.parse_state(row.rollout_state)
    settings = rollout.settings_of(row)
    since = state.get("since") if mode != rollout.NONE else None
    ready = ReplicaState.READY
    return RolloutStatus(
        model=row.name, state=mode, definition=row.definition_hash[:12],
        previous=_previous_hash(row), wanted=wanted_replicas(row, serving, now),
        old_ready=sum(r.state == ready for r in old), old_total=len(old),
        new_ready=sum(r.state == ready for r in new), new_total=len(new),
        draining=len(reps) - len(serving), max_surge=settings.max_surge,
        max_unavailable=settings.max_unavailable, canary_percent=settings.canary_percent,
        waiting_for=waiting_for(row, mode, old, new, reps, now),
        since=since, for_s=round(now - since, 1) if isinstance(since, int | float) else None,
        error=state.get("error"),
        versions={k: VersionTally(**v) for k, v in rollout.tally(state).items()})


def _previous_hash(row: Any) -> str | None:
    text = getattr(row, "previous_definition", None)
    if not text:
        return None
    try:
        return ModelSpec.model_validate(json.loads(text), strict=False).definition_hash[:12]
    except ValueError:
        return None


def waiting_for(row: Any, mode: str, old: list[Any], new: list[Any], reps: list[Any],
                now: float) -> str | None:
    """What the rollout waits for now, in operator words (None: nothing rolls)."""
    name = row.name
    if mode == rollout.NONE:
        return None
    if mode == rollout.FAILED:
        return ("nothing: the new definition did not start; apply the old one again, or "
                f"`llmgw ctl rollout undo {name}`, or `llmgw ctl retry {name}` to try again")
    starting = [r for r in new if r.state != ReplicaState.READY]
    if row.placement_reason and not starting:
        return row.placement_reason
    if starting:
        rep = starting[0]
        return f"{rep.id} on {rep.node} to be ready ({rep.state})"
    if mode == rollout.CANARY:
        return (f"`llmgw ctl rollout promote {name}`: the canary holds "
                f"{rollout.settings_of(row).canary_percent} % of the requests")
    draining = [r for r in reps if drain.is_draining(r) and rollout.is_old(r, row.definition_hash)]
    if draining:
        view = drain.view(draining[0], now) or {}
        return (f"{draining[0].id} to finish its {view.get('in_flight', 0)} request(s) in "
                f"flight ({view.get('left_s', 0):.0f} s left)")
    return f"the next reconcile pass to replace {len(old)} old replica(s)"


def rollout_undo(conn: Connection, name: str, now: float, by: str) -> RolloutStatus:
    """Apply the model's previous definition again (``ctl rollout undo``): its replicas
    roll back to it. Only the definition goes back: replicas, routing and the rest stay."""
    row = _model(conn, name)
    if not row.previous_definition:
        raise ConflictError(f"model {name!r} has no previous definition to go back to: its "
                            "definition never changed while replicas ran")
    try:
        previous = ModelSpec.model_validate(json.loads(row.previous_definition), strict=False)
    except ValueError as exc:
        raise ConflictError(f"model {name!r}'s previous definition cannot be read "
                            f"({str(exc)[:200]}); apply the definition you want") from None
    spec = rollout.undo_spec(row_to_spec(row), previous)
    repo.add_event(conn, now, rollout.EVENT, name,
                   f"rollout undo by {by}: back to definition {spec.definition_hash[:12]} "
                   f"from {row.definition_hash[:12]}")
    apply_specs(conn, [spec], now, prune=False)
    return rollout_status(conn, name, now)


def rollout_promote(conn: Connection, name: str, now: float, by: str) -> RolloutStatus:
    """Promote the model's canary (``ctl rollout promote``): the new definition replaces
    every old replica, as any rollout."""
    row = _model(conn, name)
    reps = [r for r in repo.list_replicas(conn) if r.model == name and r.desired
            and r.state != ReplicaState.FAILED and not drain.is_draining(r)]
    mode = rollout.mode_of(row, any(rollout.is_old(r, row.definition_hash) for r in reps))
    if mode != rollout.CANARY:
        raise ConflictError(f"model {name!r} has no canary to promote (its rollout is "
                            f"{mode}); see `llmgw ctl rollout status {name}`")
    repo.merge_rollout_state(conn, name, {"promoted": True, "state": rollout.ROLLING})
    repo.add_event(conn, now, rollout.EVENT, name,
                   f"canary promoted by {by}: definition {row.definition_hash[:12]} "
                   "replaces every old replica")
    return rollout_status(conn, name, now)


def rollout_failed(conn: Connection) -> dict[str, int]:
    """1 for each model whose rollout failed, 0 for the others
    (``llmgw_model_rollout_failed``)."""
    out = {}
    for row in repo.list_models(conn):
        state = rollout.parse_state(row.rollout_state)
        out[row.name] = int(state.get("state") == rollout.FAILED
                            and state.get("hash") == row.definition_hash)
    return out
