"""Admin API: the catalog, listings and retry (API keys: keys_api.py). Admin token on every
route."""

from __future__ import annotations

import hashlib
from typing import Any

from flask import Blueprint, current_app, jsonify, request

from ..catalog import parse as catalog
from ..errors import ConflictError, NotFoundError, ValidationError
from ..fleetvocab import heard_from
from ..store import repo
from . import fleet
from .web import by_whom, now_of, require, store

bp = Blueprint("admin", __name__, url_prefix="/api/v1")


class _DryRun(Exception):
    """Raised inside a dry run's transaction to roll it back; carries what it found."""

    def __init__(self, result: dict[str, Any]) -> None:
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
    specs = catalog.parse(text)
    prune = _flag("prune")
    expected = request.args.get("deletes")

    def write(conn: Any) -> dict[str, Any]:
        # Idempotent: applying the same specs again changes nothing and logs no event,
        # so it is retried through a store failover.
        before = [m.name for m in repo.list_models(conn)]
        result = fleet.apply_catalog(conn, specs, now_of(conn), prune)
        if expected is not None and deleted_digest(result["deleted"]) != expected:
            # Raised inside the transaction: nothing of this apply is written.
            raise ConflictError(
                "the models --prune would delete changed since they were shown (now: "
                + (", ".join(result["deleted"]) or "none")
                + "); nothing was applied. Run `llmgw ctl apply --prune` again to see them")
        return {**result, "kept": kept_models(before, specs, prune), "dry_run": dry_run,
                "deletes": deleted_digest(result["deleted"])}

    if not dry_run:
        return jsonify(store().write(write))
    try:
        with store().begin() as conn:
            raise _DryRun(write(conn))
    except _DryRun as done:
        return jsonify(done.result)


@bp.get("/models")
@require("admin")
def models() -> Any:
    with store().begin() as conn:
        return jsonify({"models": fleet.models_view(conn, now_of(conn))})


@bp.get("/models/<path:name>")
@require("admin")
def model(name: str) -> Any:
    with store().begin() as conn:
        for item in fleet.models_view(conn, now_of(conn)):
            if item["name"] == name:
                return jsonify(item)
    raise NotFoundError(f"model {name!r} is not in the catalog; see `llmgw ctl models`")


@bp.delete("/models/<path:name>")
@require("admin")
def delete_model(name: str) -> Any:
    with store().begin() as conn:
        if not repo.delete_model(conn, name):
            raise NotFoundError(f"model {name!r} is not in the catalog")
        repo.add_event(conn, now_of(conn), "catalog", name, "model deleted")
    return jsonify({"deleted": name})


@bp.post("/models/<path:name>/retry")
@require("admin")
def retry(name: str) -> Any:
    """Unpark ``name`` and forget its failures; ``was_parked`` says whether it was parked
    (a model that was not only has its failure count reset)."""
    with store().begin() as conn:
        was_parked = fleet.unpark(conn, name, now_of(conn), by=by_whom())
    return jsonify({"model": name, "parked": False, "was_parked": was_parked})


@bp.get("/nodes")
@require("admin")
def nodes() -> Any:
    with store().begin() as conn:
        return jsonify({"nodes": [repo.node_to_dict(n) for n in repo.list_nodes(conn)]})


@bp.get("/replicas")
@require("admin")
def replicas() -> Any:
    with store().begin() as conn:
        parts = repo.parts_by_replica(conn)
        return jsonify({"replicas": [repo.replica_to_dict(r, parts.get(r.id))
                                     for r in repo.list_replicas(conn)]})


@bp.get("/events")
@require("admin")
def events() -> Any:
    try:
        limit = int(request.args.get("limit", "100"))
    except ValueError:
        raise ValidationError("limit must be a whole number") from None
    with store().begin() as conn:
        return jsonify({"events": repo.list_events(conn, max(1, min(limit, 1000)))})


# ---------------------------------------------------------------- revocation


@bp.post("/nodes/<path:name>/reset")
@require("admin")
def reset_node(name: str) -> Any:
    """Forget the node's credential: its (reinstalled) host joins again with the join
    token, and whatever holds the old credential can no longer report."""
    with store().begin() as conn:
        if not repo.reset_node_credential(conn, name):
            raise NotFoundError(f"there is no node named {name!r}; see `llmgw ctl nodes`")
        repo.add_event(conn, now_of(conn), "node", name,
                       f"credential reset by {by_whom()}: the old credential is refused; the "
                       "host joins again with the join token")
    return jsonify({"node": name, "credential": None})


@bp.delete("/nodes/<path:name>")
@require("admin")
def delete_node(name: str) -> Any:
    """Delete a node that is gone, with the replicas that used it (the reconciler places
    them again elsewhere). A node that reported within the node timeout is refused unless
    ``?force=true``: its agent looks alive and would join again at once."""
    force = request.args.get("force", "false").lower() in ("1", "true", "yes")
    timeout = current_app.config["LLMGW"].node_timeout_s
    with store().begin() as conn:
        now = now_of(conn)
        row = repo.get_node(conn, name)
        if row is None:
            raise NotFoundError(f"there is no node named {name!r}; see `llmgw ctl nodes`")
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
                           f"replica {rep.id} deleted with node {name}; it is placed "
                           "again elsewhere")
        repo.add_event(conn, now, "node", name,
                       f"node deleted by {by_whom()}" + (" (forced)" if force else "")
                       + f" with {len(gone)} replica(s) that used it")
    return jsonify({"deleted": name, "replicas": [r.id for r in gone]})
