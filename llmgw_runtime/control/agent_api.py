"""Agent API: join, then report; the answer to a report carries the node's assignments."""

from __future__ import annotations

import json
from typing import Any

from flask import Blueprint, current_app, g, jsonify

from ..errors import ForbiddenError, ValidationError
from ..security import hash_token, new_token
from ..store import repo
from .web import clock, json_body, require, store

bp = Blueprint("agent", __name__, url_prefix="/api/v1/agent")

REPORTED_STATES = ("starting", "ready", "failed", "stopped")


@bp.post("/join")
@require("join")
def join() -> Any:
    body = json_body(required=("node",))
    node = body["node"]
    if not isinstance(node, str) or not node.strip() or len(node) > 200:
        raise ValidationError("node must be a non-empty name of at most 200 characters")
    credential = new_token("node")
    with store().begin() as conn:
        now = clock()
        repo.set_node_credential(conn, node, hash_token(credential), now)
        repo.add_event(conn, now, "join", node, "node joined (new credential issued)")
    return jsonify({"node": node, "credential": credential})


def _check_report(body: dict[str, Any]) -> list[str]:
    problems = []
    for key, kind in (("devices", list), ("replicas", list), ("engines", list),
                      ("cards", list), ("device_problems", list)):
        if not isinstance(body.get(key, []), kind):
            problems.append(f"{key} must be a list")
    for i, dev in enumerate(body.get("devices") or []):
        if not isinstance(dev, dict) or not isinstance(dev.get("id"), int) \
                or not isinstance(dev.get("class"), str):
            problems.append(f"devices[{i}] needs an integer id and a class")
    for i, rep in enumerate(body.get("replicas") or []):
        if not isinstance(rep, dict) or not isinstance(rep.get("id"), str):
            problems.append(f"replicas[{i}] needs a string id")
        elif rep.get("state") not in REPORTED_STATES:
            problems.append(f"replicas[{i}].state {rep.get('state')!r} is not one of "
                            f"{', '.join(REPORTED_STATES)}")
    return problems


@bp.post("/report")
@require("node")
def report() -> Any:
    body = json_body(required=("node",))
    if body["node"] != g.principal:
        raise ForbiddenError(f"this credential belongs to node {g.principal!r}, "
                             f"not {body['node']!r}")
    problems = _check_report(body)
    if problems:
        raise ValidationError("the report is malformed", details=problems)
    reported = {r["id"]: r for r in body.get("replicas", [])}
    with store().begin() as conn:
        now = clock()
        repo.record_report(conn, g.principal, body, now)
        for row in repo.list_replicas(conn, node=g.principal):
            rep = reported.get(row.id)
            if rep is None:
                if not row.desired:
                    repo.delete_replica(conn, row.id)        # stopped as asked
                elif row.state in ("starting", "ready"):
                    repo.update_replica(
                        conn, row.id, state="failed", updated=now,
                        last_error=f"the agent on {row.node} no longer runs this replica")
                continue
            if not row.desired or row.state == "failed":
                continue
            state = rep["state"] if rep["state"] != "stopped" else "failed"
            values: dict[str, Any] = {"state": state, "port": rep.get("port"),
                                      "pid": rep.get("pid"), "updated": now}
            if state == "failed":
                values["last_error"] = rep.get("last_error") or "the engine stopped"
            repo.update_replica(conn, row.id, **values)
            if state != row.state and state in ("ready", "failed"):
                repo.add_event(conn, now, state, row.model,
                               f"replica {row.id} on {row.node} is {state}"
                               + (f": {values['last_error']}" if state == "failed" else ""))
        models = {m.name: m for m in repo.list_models(conn)}
        assignments = []
        for row in repo.list_replicas(conn, node=g.principal):
            model = models.get(row.model)
            if not row.desired or row.state == "failed" or model is None:
                continue
            assignments.append(_assignment(row, model, body.get("devices") or []))
    return jsonify({"assignments": assignments,
                    "report_interval_s": current_app.config["LLMGW"].report_interval_s})


def _assignment(row: Any, model: Any, devices: list[dict[str, Any]]) -> dict[str, Any]:
    ids = json.loads(row.devices)
    by_id = {d["id"]: d for d in devices}
    chosen = [by_id[i] for i in ids if i in by_id]
    if any(d.get("class") == "cpu" for d in chosen) or not chosen:
        kind = "cpu"
    else:
        kind = "mig" if any(d.get("mig") is not None for d in chosen) else "gpu"
    return {"replica_id": row.id, "model": model.name, "engine": model.engine,
            "source": model.source, "args": json.loads(model.args), "devices": ids,
            "device_uuids": [d.get("uuid") for d in chosen], "device_kind": kind}
