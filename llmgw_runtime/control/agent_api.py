"""Agent API: join, then report; the answer to a report carries the node's assignments."""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from flask import Blueprint, current_app, g, jsonify

from ..errors import ForbiddenError, ValidationError
from ..security import hash_token, new_token
from ..store import repo
from .assignments import assignments_for, part_id
from .web import clock, json_body, require, store

bp = Blueprint("agent", __name__, url_prefix="/api/v1/agent")

REPORTED_STATES = ("fetching", "starting", "ready", "failed", "stopped")
SOURCES_TTL_S = 5.0
_sources_cache: dict[str, Any] = {"at": -1e9, "sources": [], "hash": ""}


def catalog_sources(conn: Any) -> tuple[list[str], str]:
    """The catalog's sources and their hash, re-read at most every few seconds per process
    (agents look for these in their weights directories)."""
    now = time.monotonic()
    if now - _sources_cache["at"] > SOURCES_TTL_S:
        sources = sorted({m.source for m in repo.list_models(conn)})
        digest = hashlib.sha256("\n".join(sources).encode()).hexdigest()[:16]
        _sources_cache.update(at=now, sources=sources, hash=digest)
    return _sources_cache["sources"], _sources_cache["hash"]


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
                      ("cards", list), ("device_problems", list), ("weights", dict)):
        if not isinstance(body.get(key, kind()), kind):
            problems.append(f"{key} must be a {'list' if kind is list else 'mapping'}")
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
        elif rep.get("progress") is not None and not isinstance(rep.get("progress"), dict):
            problems.append(f"replicas[{i}].progress must be a mapping")
    return problems


def _progress(rep: dict[str, Any]) -> str | None:
    progress = rep.get("progress")
    if rep["state"] != "fetching" or not isinstance(progress, dict):
        return None
    keep = {k: progress.get(k) for k in ("bytes", "total", "rate_bps")
            if isinstance(progress.get(k), int | float) and not isinstance(progress.get(k), bool)}
    return json.dumps(keep)


def _apply_heads(conn: Any, heads: list[Any], reported: dict[str, Any],
                 now: float) -> set[str]:
    """Write what the agent says of the replicas it heads; returns the ids that are gone
    or failed now (they get no assignment)."""
    gone: set[str] = set()
    for row in heads:
        rep = reported.get(row.id)
        if rep is None:
            if not row.desired:
                repo.delete_replica(conn, row.id)        # stopped as asked
                gone.add(row.id)
            elif row.state in ("fetching", "starting", "ready"):
                repo.update_replica(
                    conn, row.id, state="failed", updated=now,
                    last_error=f"the agent on {row.node} no longer runs this replica")
                gone.add(row.id)
            continue
        if not row.desired or row.state == "failed":
            continue
        state = rep["state"] if rep["state"] != "stopped" else "failed"
        values: dict[str, Any] = {"state": state, "port": rep.get("port"),
                                  "pid": rep.get("pid"), "updated": now,
                                  "progress": _progress(rep)}
        if state == "failed":
            values["last_error"] = rep.get("last_error") or "the engine stopped"
            gone.add(row.id)
        if all(getattr(row, k) == v for k, v in values.items() if k != "updated"):
            continue                                     # nothing new: no write
        repo.update_replica(conn, row.id, **values)
        if state != row.state and state in ("ready", "failed"):
            repo.add_event(conn, now, state, row.model,
                           f"replica {row.id} on {row.node} is {state}"
                           + (f": {values['last_error']}" if state == "failed" else ""))
    return gone


def _apply_parts(conn: Any, parts: list[Any], reported: dict[str, Any],
                 now: float) -> set[str]:
    """The same for worker parts on this node; returns the part ids failed now."""
    gone: set[str] = set()
    for part in parts:
        rep = reported.get(part_id(part.replica_id, part.rank))
        if part.state == "failed":
            continue
        if rep is None:
            if part.state in ("starting", "ready"):
                repo.update_part(conn, part.replica_id, part.rank, state="failed", updated=now,
                                 last_error=f"the agent on {part.node} no longer runs this "
                                            "part")
                gone.add(part_id(part.replica_id, part.rank))
            continue
        state = rep["state"] if rep["state"] != "stopped" else "failed"
        error = (rep.get("last_error") or "the engine stopped") if state == "failed" else None
        if state == "failed":
            gone.add(part_id(part.replica_id, part.rank))
        if state != part.state or rep.get("pid") != part.pid:
            repo.update_part(conn, part.replica_id, part.rank, state=state, pid=rep.get("pid"),
                             last_error=error, updated=now)
    return gone


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
    node, interval = g.principal, current_app.config["LLMGW"].report_interval_s

    def write(conn: Any) -> dict[str, Any]:
        # Idempotent (the report states what is, the answer is re-read): retried through
        # a store failover, so agents see a pause rather than errors.
        answer: dict[str, Any] = {"report_interval_s": interval}
        now = clock()
        repo.record_report(conn, node, body, now)
        heads = repo.list_replicas(conn, node=node)
        parts = repo.parts_on_node(conn, node)
        gone = _apply_heads(conn, heads, reported, now)
        gone |= _apply_parts(conn, parts, reported, now)
        answer["assignments"] = assignments_for(
            conn, body.get("devices") or [],
            heads=[r for r in heads if r.id not in gone],
            parts=[p for p in parts if part_id(p.replica_id, p.rank) not in gone])
        if "sources_hash" in body:
            sources, digest = catalog_sources(conn)
            if body["sources_hash"] != digest:
                answer.update(sources=sources, sources_hash=digest)
        return answer
    return jsonify(store().write(write))
