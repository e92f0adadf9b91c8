"""Agent API: join, then report; the answer to a report carries the node's assignments."""

from __future__ import annotations

import hmac
from typing import Any

from flask import Blueprint, current_app, g, jsonify, request

from ..api.agent import JoinAnswer, JoinRequest, Report, ReportAnswer
from ..api.parse import parse_json
from ..errors import ConflictError, ForbiddenError
from ..security import hash_token, new_token
from ..store import repo
from . import identity
from .assignments import assignments_for, devices_key, part_id
from .reports import (
    Answer,
    Heartbeats,
    NodeEntry,
    ReportCache,
    apply_heads,
    apply_parts,
    report_answer,
    unchanged,
)
from .resolve import Resolver
from .web import authenticate, now_of, require, store

bp = Blueprint("agent", __name__, url_prefix="/api/v1/agent")


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


def install(app: Any, resolver: Resolver | None = None) -> None:
    """The app's report caches, heartbeat writer and host name cache (one per process: each
    gunicorn worker loads its own app, control/serve.py starts its writer)."""
    cache = app.extensions["llmgw.reports"] = ReportCache()
    app.extensions["llmgw.heartbeats"] = Heartbeats(lambda: app.extensions["llmgw.store"],
                                                    cache.forget)
    app.extensions["llmgw.resolver"] = resolver or Resolver()


def caches() -> tuple[ReportCache, Heartbeats]:
    ext = current_app.extensions
    return ext["llmgw.reports"], ext["llmgw.heartbeats"]


@bp.post("/report")
@require("node", in_transaction=True)
def report() -> Any:
    """A node's report, answered with its assignments: from this process's caches when it
    repeats what is stored, else in one transaction whose first statement checks the
    credential (control/reports.py)."""
    cache, heartbeats = caches()
    raw = request.get_data(cache=True)
    token_hash = g.token_hash
    config = current_app.config["LLMGW"]
    generation = cache.generation(store())
    entry = cache.nodes.get(token_hash, generation)
    parsed = None
    if entry is not None:                                # a credential seen in this process
        parsed = parse_json(Report, raw, what="report")
        answer = _steady(cache, heartbeats, entry, parsed, generation, config)
        if answer is not None:
            return jsonify(answer.to_json())

    def write(conn: Any) -> ReportAnswer:
        # Idempotent (the report states what is, the answer is re-read): retried through
        # a store failover, so agents see a pause rather than errors.
        authenticate(conn)
        report = parsed or parse_json(Report, raw, what="report")
        node, before = g.principal, g.node_row           # as stored before this report
        if report.node != node:
            raise ForbiddenError(f"this credential belongs to node {node!r}, "
                                 f"not {report.node!r}")
        problem = _problem(report, config)
        reported = {r.id: r for r in report.replicas}
        now = now_of(conn)
        heartbeats.drop(node)                            # this write supersedes it
        inventory = repo.record_report(conn, node, report, now, problem,
                                       alive=not report.stopping, before=before)
        if before.problem != problem:
            repo.add_event(conn, now, "node", node, problem or "the node's report is usable "
                           "in full again")
        heads = repo.list_replicas(conn, node=node)
        parts = repo.parts_on_node(conn, node)
        gone = apply_heads(conn, heads, reported, now)
        gone |= apply_parts(conn, parts, reported, now)
        assignments = assignments_for(
            conn, report.devices,
            heads=[r for r in heads if r.id not in gone],
            parts=[p for p in parts if part_id(p.replica_id, p.rank) not in gone])
        sources = cache.catalog_sources(conn, before.generation)
        if before.generation is not None and not report.stopping:
            # Valid under the generation read with the credential: if this transaction
            # moved it, nothing cached here is used again.
            cache.answers.put(node, Answer(before.generation, devices_key(report.devices),
                                           heads, parts, assignments))
            cache.nodes.put(token_hash, NodeEntry(
                node, report.address if problem is None else None, problem, inventory,
                before.generation))
        return report_answer(report, config.report_interval_s, assignments, problem,
                             sources)
    return jsonify(store().write(write).to_json())


def _problem(report: Report, config: Any) -> str | None:
    """What of the report is not used (its address), or the agent saying it stops."""
    if report.stopping:
        return ("its agent stopped and stopped its engines; the node is not used until "
                "the agent runs again")
    resolver: Resolver = current_app.extensions["llmgw.resolver"]
    return identity.address_problem(report.address, request.remote_addr,
                                    resolver(report.address or ""), config.agent_network_list)


def _steady(cache: ReportCache, heartbeats: Heartbeats, entry: NodeEntry, report: Report,
            generation: int | None, config: Any) -> ReportAnswer | None:
    """The answer to a report that repeats what is stored, from this process's caches, its
    last report time and devices left to the heartbeat writer; None when the report must
    be handled in a transaction."""
    if generation is None or report.node != entry.name or report.stopping:
        return None
    problem = _problem(report, config)
    address = report.address if problem is None else None
    if problem != entry.problem or address != entry.address \
            or repo.inventory_of(report)[1] != entry.inventory:
        return None
    hit = cache.answer(entry.name, generation, devices_key(report.devices))
    sources = cache.cached_sources(generation)
    if hit is None or sources is None:
        return None
    if not unchanged(hit.heads, hit.parts, {r.id: r for r in report.replicas}):
        return None
    g.principal_kind, g.principal = "node", entry.name
    heartbeats.put(entry.name, store().clock_cached(), repo.devices_of(report))
    return report_answer(report, config.report_interval_s, hit.assignments, problem, sources)
