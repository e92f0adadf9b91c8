"""Admin API: the catalog, listings and retry (API keys: keys_api.py). Admin token on every
route."""

from __future__ import annotations

import hashlib
from typing import Any

from flask import Blueprint, jsonify, request

from ..api.admin import (
    CatalogResult,
    Deleted,
    Event,
    EventList,
    ModelList,
    Node,
    NodeList,
    NodeReset,
    Replica,
    ReplicaList,
    Retried,
)
from ..catalog import parse as catalog
from ..errors import ConflictError, NotFoundError, ValidationError
from ..store import repo
from . import fleet
from .web import by_whom, fleet_settings, now_of, require, store

bp = Blueprint("admin", __name__, url_prefix="/api/v1")


class _DryRun(Exception):
    """Raised inside a dry run's transaction to roll it back; carries what it found."""

    def __init__(self, result: CatalogResult) -> None:
        super().__init__("dry run")
        self.result = result


def _flag(name: str) -> bool:
    """A boolean query parameter: absent is false; anything but true/false (1/0, yes/no)
    is a 400 naming it."""
    value = request.args.get(name, "false").lower()
    if value not in ("1", "true", "yes", "0", "false", "no"):
        raise ValidationError(f"?{name}={value!r} is not a boolean: use {name}=true or "
                              f"{name}=false")
    return value in ("1", "true", "yes")


def kept_models(before: list[str], specs: list[catalog.ModelSpec], prune: bool) -> list[str]:
    """The models in the store that the catalog does not name and that stay (no prune)."""
    if prune:
        return []
    return sorted(set(before) - {s.name for s in specs})


@bp.put("/catalog")
@require("admin")
def apply_catalog() -> Any:
    """Apply the catalog; ``?prune=true`` deletes models it does not name."""
    return _apply(dry_run=False)


@bp.put("/catalog/dry-run")
@require("admin")
def dry_run_catalog() -> Any:
    """What ``PUT /catalog`` with the same body and ``?prune`` would create, update and
    delete, and nothing changes: the very same apply, in a transaction rolled back (one
    place computes it). A path of its own, so that a control service too old to have it
    answers 404 instead of applying."""
    return _apply(dry_run=True)


def deleted_digest(names: list[str]) -> str:
    """What ``?deletes=`` holds: a short digest of the sorted names a prune deletes, so
    ``ctl apply --prune`` deletes exactly what it showed and was confirmed."""
    return hashlib.sha256("\n".join(sorted(names)).encode()).hexdigest()[:16]


def _apply(dry_run: bool) -> Any:
    text = request.get_data(as_text=True)
    prune = _flag("prune")
    with store().begin() as conn:       # so that the check names every problem at once
        staying = fleet.staying_names(conn, prune)
    specs = catalog.parse(text, staying)    # 0.35 s at 1,000 models, in slices (coop.py)
    expected = request.args.get("deletes")

    def write(conn: Any) -> CatalogResult:
        # Idempotent: applying the same specs again changes nothing and logs no event,
        # so it is retried through a store failover.
        stored = repo.all_models(conn)      # once: each read waits behind the heartbeats
        before = [m.name for m in repo.listed(stored)]
        result = fleet.apply_catalog(conn, specs, now_of(conn), prune, stored)
        if expected is not None and deleted_digest(result["deleted"]) != expected:
            # Raised inside the transaction: nothing of this apply is written.
            raise ConflictError(
                "the models --prune would delete changed since they were shown (now: "
                + (", ".join(result["deleted"]) or "none")
                + "); nothing was applied. Run `llmgw ctl apply --prune` again to see them")
        return CatalogResult(**result, kept=kept_models(before, specs, prune),
                             dry_run=dry_run, deletes=deleted_digest(result["deleted"]))

    if not dry_run:
        return jsonify(store().write(write).to_json())
    try:
        with store().begin() as conn:
            raise _DryRun(write(conn))
    except _DryRun as done:
        return jsonify(done.result.to_json())


@bp.get("/models")
@require("admin")
def models() -> Any:
    with store().begin() as conn:
        return jsonify(ModelList(models=fleet.model_answers(conn, now_of(conn))).to_json())


@bp.get("/models/<path:name>")
@require("admin")
def model(name: str) -> Any:
    with store().begin() as conn:
        for item in fleet.model_answers(conn, now_of(conn)):
            if item.name == name:
                return jsonify(item.to_json())
    raise NotFoundError(f"model {name!r} is not in the catalog; see `llmgw ctl models`")


@bp.delete("/models/<path:name>")
@require("admin")
def delete_model(name: str) -> Any:
    with store().begin() as conn:
        fleet.delete_model(conn, name, now_of(conn))
    return jsonify(Deleted(deleted=name).to_json())


@bp.post("/models/<path:name>/retry")
@require("admin")
def retry(name: str) -> Any:
    """Unpark ``name`` and forget its failures; ``was_parked`` says whether it was parked
    (a model that was not only has its failure count reset)."""
    with store().begin() as conn:
        was_parked = fleet.unpark(conn, name, now_of(conn), by=by_whom())
    return jsonify(Retried(model=name, parked=False, was_parked=was_parked).to_json())


@bp.get("/nodes")
@require("admin")
def nodes() -> Any:
    with store().begin() as conn:
        nodes = [Node.model_validate(fleet.node_view(n)) for n in repo.list_nodes(conn)]
    return jsonify(NodeList(nodes=nodes).to_json())


@bp.get("/replicas")
@require("admin")
def replicas() -> Any:
    with store().begin() as conn:
        parts, now = repo.parts_by_replica(conn), now_of(conn)
        replicas = [Replica.model_validate(fleet.replica_view(r, parts.get(r.id), now))
                    for r in repo.list_replicas(conn)]
    return jsonify(ReplicaList(replicas=replicas).to_json())


@bp.get("/events")
@require("admin")
def events() -> Any:
    try:
        limit = int(request.args.get("limit", "100"))
    except ValueError:
        raise ValidationError("limit must be a whole number") from None
    with store().begin() as conn:
        events = [Event.model_validate(e)
                  for e in repo.list_events(conn, max(1, min(limit, 1000)))]
    return jsonify(EventList(events=events).to_json())


# ---------------------------------------------------------------- revocation


@bp.post("/nodes/<path:name>/reset")
@require("admin")
def reset_node(name: str) -> Any:
    """Forget the node's credential: its (reinstalled) host joins again with the join
    token, and whatever holds the old credential can no longer report."""
    with store().begin() as conn:
        fleet.reset_node(conn, name, now_of(conn), by=by_whom())
    return jsonify(NodeReset(node=name, credential=None).to_json())


@bp.delete("/nodes/<path:name>")
@require("admin")
def delete_node(name: str) -> Any:
    """Delete a node that is gone, with the replicas that used it (the reconciler places
    them again elsewhere). A node that reported within the node timeout is refused unless
    ``?force=true``: its agent looks alive and would join again at once."""
    force = request.args.get("force", "false").lower() in ("1", "true", "yes")
    with store().begin() as conn:
        answer = fleet.delete_node(conn, name, now_of(conn), fleet_settings(), force=force,
                                   by=by_whom())
    return jsonify(answer.to_json())
