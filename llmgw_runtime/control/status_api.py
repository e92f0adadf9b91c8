"""The fleet summary and the placement dry run, for ``ctl status``, ``ctl plan`` and the
console: both derived from the same rows as the listings."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, current_app, jsonify

from ..placement import place
from ..status import summary
from ..store import repo
from . import snapshot
from .admin_api import models_out
from .web import clock, require, store

bp = Blueprint("status", __name__, url_prefix="/api/v1")


def _rows() -> tuple[list[Any], list[Any], list[Any], float]:
    with store().begin() as conn:
        return (repo.list_models(conn), repo.list_nodes(conn), repo.list_replicas(conn),
                clock())


@bp.get("/status")
@require("admin")
def status() -> Any:
    config = current_app.config["LLMGW"]
    with store().begin() as conn:
        now = clock()
        models = models_out(conn, now)
        nodes = [repo.node_to_dict(n) for n in repo.list_nodes(conn)]
        replicas = [repo.replica_to_dict(r) for r in repo.list_replicas(conn)]
    return jsonify(summary.build(models, nodes, replicas, now, config.node_timeout_s))


@bp.get("/plan")
@require("admin")
def plan() -> Any:
    """What placement would do now, without doing it."""
    config = current_app.config["LLMGW"]
    models, nodes, replicas, now = _rows()
    live = [r for r in replicas if r.desired and r.state != "failed"]
    result = place(snapshot.build(models, nodes, live, now, config.node_timeout_s))
    node_dicts = [repo.node_to_dict(n) for n in nodes]
    replica_dicts = [repo.replica_to_dict(r) for r in live]
    return jsonify({
        "starts": [{"model": s.model, "node": s.node, "devices": list(s.devices)}
                   for s in result.starts],
        "stops": result.stops,
        "unplaceable": result.unplaceable,
        "devices": summary.devices_by_class(node_dicts, replica_dicts, now,
                                            config.node_timeout_s),
        "cards_unusable": summary.idle_cards(node_dicts),
    })
