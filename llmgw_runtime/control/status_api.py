"""The fleet summary and the placement dry run, for ``ctl status``, ``ctl plan`` and the
console: both derived from the same rows as the listings."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, current_app, jsonify, request

from ..errors import ValidationError
from ..placement import place
from ..status import summary
from ..store import repo
from . import snapshot
from .admin_api import models_out
from .web import clock, require, store

bp = Blueprint("status", __name__, url_prefix="/api/v1")


def current(idle_after_s: float | None = None) -> dict[str, Any]:
    """The fleet summary now: what ``GET /api/v1/status``, ``ctl status`` and the console
    show, from one read of the store."""
    config = current_app.config["LLMGW"]
    with store().begin() as conn:
        now = clock()
        models = models_out(conn, now)
        nodes = [repo.node_to_dict(n) for n in repo.list_nodes(conn)]
        parts = repo.parts_by_replica(conn)
        replicas = [repo.replica_to_dict(r, parts.get(r.id)) for r in repo.list_replicas(conn)]
    return summary.build(models, nodes, replicas, now, config.node_timeout_s,
                         idle_after_s=config.idle_after_s if idle_after_s is None
                         else idle_after_s,
                         store=store_health())


def store_health() -> dict[str, Any]:
    """The store's backend and, for a replicated one, its members (Patroni's REST API)."""
    health = current_app.extensions["llmgw.store_health"]
    return {"backend": store().dialect, "members": health.members()}


def idle_after_arg() -> float | None:
    raw = request.args.get("idle_after_s")
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise ValidationError(f"idle_after_s={raw!r} must be a number of seconds, 0 or more")
    return value


@bp.get("/status")
@require("admin")
def status() -> Any:
    return jsonify(current(idle_after_arg()))


@bp.get("/plan")
@require("admin")
def plan() -> Any:
    """What placement would do now, without doing it, and why."""
    config = current_app.config["LLMGW"]
    with store().begin() as conn:
        models, nodes, replicas = (repo.list_models(conn), repo.list_nodes(conn),
                                   repo.list_replicas(conn))
        parts = repo.parts_by_replica(conn)
        now = clock()
    live = [r for r in replicas if r.desired and r.state != "failed"]
    snap = snapshot.build(models, nodes, live, now, config.node_timeout_s, parts=parts,
                          replace_after_s=config.replace_after_s, backoff=config.backoff)
    result = place(snap)
    node_dicts = [repo.node_to_dict(n) for n in nodes]
    replica_dicts = [repo.replica_to_dict(r, parts.get(r.id)) for r in live]
    by_id = {r.id: r for r in live}
    used = summary.used_devices(replica_dicts)
    fabrics, model_weights = summary.fabrics(
        [repo.model_to_dict(m) for m in models], node_dicts, now, config.node_timeout_s, used)
    return jsonify({
        "starts": [{"model": s.model, "node": s.node, "devices": list(s.devices),
                    "parts": [{"rank": p.rank, "node": p.node, "devices": list(p.devices)}
                              for p in s.parts], "why": s.why}
                   for s in result.starts],
        "stops": [{"replica": rid, "model": getattr(by_id.get(rid), "model", None),
                   "node": getattr(by_id.get(rid), "node", None),
                   "why": result.stop_reasons.get(rid, "no longer wanted")}
                  for rid in result.stops],
        "unplaceable": result.unplaceable,
        "devices": summary.devices_by_class(node_dicts, replica_dicts, now,
                                            config.node_timeout_s, used),
        "cards_unusable": summary.idle_cards(node_dicts),
        "fabrics": fabrics,
        "models": model_weights,
    })
