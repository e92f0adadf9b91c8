"""Agent API: join, then report (a full report, or a heartbeat when nothing but replica
states and device readings changed); the answer carries the node's assignments."""

from __future__ import annotations

import hmac
from typing import Any

from flask import Blueprint, jsonify, request

from ..api.agent import JoinAnswer, JoinRequest
from ..api.parse import parse_json
from ..errors import ConflictError
from ..security import hash_token, new_token
from ..store import repo
from .heartbeat import answer_heartbeat, answer_report
from .reports import Heartbeats, ReportCache
from .resolve import Resolver
from .web import now_of, require, store

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


@bp.post("/report")
@require("node", in_transaction=True)
def report() -> Any:
    """A node's full report, answered with its assignments: from this process's caches
    when it repeats what is stored, else in one transaction whose first statement checks
    the credential (control/heartbeat.py)."""
    return jsonify(answer_report(request.get_data(cache=True)).to_json())


@bp.post("/heartbeat")
@require("node", in_transaction=True)
def heartbeat() -> Any:
    """A node's heartbeat (the digest of its last full report, and its replicas' states
    and devices' readings when they changed): answered as that report would be, or with
    ``full_report`` when this process does not hold it (control/heartbeat.py)."""
    return jsonify(answer_heartbeat(request.get_data(cache=True)).to_json())
