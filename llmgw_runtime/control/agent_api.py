"""Agent API: join, then report; the answer to a report carries the node's assignments."""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import time
from typing import Any

from flask import Blueprint, current_app, g, jsonify, request

from ..api.agent import JoinAnswer, JoinRequest, Report
from ..api.parse import parse_json
from ..api.states import LIVE_REPLICA_STATES, ReplicaState, ReportedState
from ..errors import ConflictError, ForbiddenError
from ..security import hash_token, new_token
from ..store import repo
from . import identity
from .assignments import assignments_for, part_id
from .web import now_of, require, store

bp = Blueprint("agent", __name__, url_prefix="/api/v1/agent")

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
    """A node gets its credential. A name that already has one is refused (409) unless the
    request carries that credential: the join token sits on every node, and must not let
    one node take over another's identity."""
    body = parse_json(JoinRequest, request.get_data(cache=True), what="join request")
    node = body.node
    credential = new_token("node")
    with store().begin() as conn:
        now = now_of(conn)
        row = repo.get_node(conn, node)
        if row is not None and row.credential_hash is not None and (
                body.credential is None
                or not hmac.compare_digest(hash_token(body.credential), row.credential_hash)):
            raise ConflictError(
                f"node {node!r} has joined already and this request does not carry its "
                "credential. If the host was reinstalled, an admin resets it with "
                f"`llmgw ctl nodes reset {node}`; if this is another host, give it "
                "another name (LLMGW_NODE_NAME)")
        repo.set_node_credential(conn, node, hash_token(credential), now)
        repo.add_event(conn, now, "join", node,
                       "node joined (new credential issued)" if row is None or
                       row.credential_hash is None else "node renewed its credential")
    return jsonify(JoinAnswer(node=node, credential=credential).to_json())


_resolved: dict[str, tuple[float, tuple[str, ...]]] = {}


def _resolve(name: str) -> tuple[str, ...]:
    """The addresses a host name resolves to, cached for a minute per process."""
    if not name or identity.is_ip(name):
        return ()
    now = time.monotonic()
    hit = _resolved.get(name)
    if hit is None or now - hit[0] > 60:
        try:
            infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
            hit = (now, tuple(sorted({str(i[4][0]) for i in infos})))
        except (OSError, UnicodeError):
            hit = (now, ())
        if len(_resolved) > 10_000:
            _resolved.clear()
        _resolved[name] = hit
    return hit[1]


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
            elif row.state in LIVE_REPLICA_STATES:
                repo.update_replica(
                    conn, row.id, state="failed", updated=now,
                    last_error=f"the agent on {row.node} no longer runs this replica")
                gone.add(row.id)
            continue
        if not row.desired or row.state == "failed":
            continue
        stopped = rep["state"] == ReportedState.STOPPED
        state = (ReplicaState.FAILED if stopped else ReplicaState(rep["state"])).value
        values: dict[str, Any] = {"state": state, "port": rep.get("port"),
                                  "pid": rep.get("pid"), "updated": now,
                                  "progress": _progress(rep)}
        if state == ReplicaState.FAILED:
            values["last_error"] = rep.get("last_error") or "the engine stopped"
            gone.add(row.id)
        elif state == ReplicaState.READY:
            values["last_error"] = None                  # the history stays in the events
        if all(getattr(row, k) == v for k, v in values.items() if k != "updated"):
            continue                                     # nothing new: no write
        repo.update_replica(conn, row.id, **values)
        if state != row.state:
            _replica_event(conn, row, state, values.get("last_error"), stopped, now)
    return gone


def _replica_event(conn: Any, row: Any, state: str, error: str | None, stopped: bool,
                   now: float) -> None:
    """The event of a replica that became ready or failed; a ready replica clears its
    model's last error (a model that serves again shows no stale error; `ctl events`
    keeps it)."""
    where = f"replica {row.id} on {row.node}"
    if state == ReplicaState.READY:
        again = (" again (its agent reports it ready after a router could not reach it)"
                 if row.state == ReplicaState.UNREACHABLE else "")
        repo.add_event(conn, now, "ready", row.model, f"{where} is ready{again}")
        model = repo.get_model(conn, row.model)
        if model is not None and model.last_error is not None:
            repo.update_model(conn, row.model, last_error=None)
    elif state == ReplicaState.FAILED:
        repo.add_event(conn, now, "stopped" if stopped else "failed", row.model,
                       f"{where} " + ("stopped" if stopped else "is failed") + f": {error}")


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
    parsed = parse_json(Report, request.get_data(cache=True), what="report")
    if parsed.node != g.principal:
        raise ForbiddenError(f"this credential belongs to node {g.principal!r}, "
                             f"not {parsed.node!r}")
    config = current_app.config["LLMGW"]
    problem = identity.address_problem(parsed.address, request.remote_addr,
                                       _resolve(parsed.address or ""),
                                       config.agent_network_list)
    if parsed.stopping:
        problem = ("its agent stopped and stopped its engines; the node is not used until "
                   "the agent runs again")
    body = parsed.model_dump(mode="json", by_alias=True)
    reported = {r["id"]: r for r in body["replicas"]}
    node, interval = g.principal, config.report_interval_s

    def write(conn: Any) -> dict[str, Any]:
        # Idempotent (the report states what is, the answer is re-read): retried through
        # a store failover, so agents see a pause rather than errors.
        answer: dict[str, Any] = {"report_interval_s": interval}
        now = now_of(conn)
        before = g.node_row             # read when its credential was checked
        repo.record_report(conn, node, body, now, problem, alive=not parsed.stopping)
        if before is not None and before.problem != problem:
            repo.add_event(conn, now, "node", node, problem or "the node's report is usable "
                           "in full again")
        if problem:
            answer["problems"] = [problem]
        heads = repo.list_replicas(conn, node=node)
        parts = repo.parts_on_node(conn, node)
        gone = _apply_heads(conn, heads, reported, now)
        gone |= _apply_parts(conn, parts, reported, now)
        answer["assignments"] = assignments_for(
            conn, body["devices"],
            heads=[r for r in heads if r.id not in gone],
            parts=[p for p in parts if part_id(p.replica_id, p.rank) not in gone])
        if parsed.sources_hash is not None:
            sources, digest = catalog_sources(conn)
            if body["sources_hash"] != digest:
                answer.update(sources=sources, sources_hash=digest)
        return answer
    return jsonify(store().write(write))
