"""Agent API: join, then report (a full report, or a heartbeat when nothing but replica
states and device readings changed); the answer carries the node's assignments.

Most of a fleet's requests are steady nodes' heartbeats. :class:`SteadyHeartbeats` answers
those a process can answer from memory before Flask's request machinery, with the same
function the view uses (``heartbeat.steady_heartbeat``); everything else, errors included,
is the view's."""

from __future__ import annotations

import hmac
import io
from collections.abc import Callable, Iterable
from typing import Any

from flask import Blueprint, Flask, jsonify, request

from ..api.agent import JoinAnswer, JoinRequest
from ..api.parse import parse_json
from ..errors import ConflictError
from ..security import bearer, hash_token, new_token
from ..store import failover, repo
from .beats import Heartbeats
from .heartbeat import answer_heartbeat, answer_report, repeated, steady_heartbeat
from .reports import ReportCache
from .resolve import Resolver
from .web import now_of, refused_s, require, store

HEARTBEAT_PATH = "/api/v1/agent/heartbeat"
STEADY_MAX_BYTES = 65536    # a larger heartbeat goes the view's way

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
    beats = app.extensions["llmgw.heartbeats"] = Heartbeats(
        lambda: app.extensions["llmgw.store"], cache.forget)
    cache.named = beats.unwritten
    app.extensions["llmgw.resolver"] = resolver or Resolver()
    if not app.config["LLMGW"].otel_endpoint:     # traced: every request gets its span
        app.wsgi_app = SteadyHeartbeats(app, app.wsgi_app)  # type: ignore[method-assign]


class SteadyHeartbeats:
    """A WSGI layer answering a steady node's heartbeat from memory, without Flask's request
    (its context, routing, hooks and response object were a tenth of a control worker's
    CPU per heartbeat: docs/performance.md); any other request, and any heartbeat
    :func:`.heartbeat.steady_heartbeat` declines, goes on to ``inner`` with its body. The
    throttle of wrong tokens and the store's wait bound hold here as in the view."""

    def __init__(self, app: Flask, inner: Callable[..., Iterable[bytes]]) -> None:
        self.app, self.inner = app, inner
        self.config = app.config["LLMGW"]
        self.wait_s = self.config.store_wait_s

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == HEARTBEAT_PATH and environ["REQUEST_METHOD"] == "POST":
            body = self._answer(environ)
            if body is not None:
                start_response("200 OK", [("Content-Type", "application/json"),
                                          ("Content-Length", str(len(body)))])
                return [body]
        return self.inner(environ, start_response)

    def _answer(self, environ: dict[str, Any]) -> bytes | None:
        token = bearer(environ.get("HTTP_AUTHORIZATION"))
        text = environ.get("CONTENT_LENGTH") or ""
        length = int(text) if text.isascii() and text.isdigit() else 0
        if token is None or not 0 < length <= STEADY_MAX_BYTES:
            return None
        raw = environ["wsgi.input"].read(length)
        environ["wsgi.input"] = io.BytesIO(raw)       # the view reads it again
        peer = environ.get("REMOTE_ADDR")
        if len(raw) != length or refused_s(self.app.extensions, peer, token) > 0:
            return None
        failover.set_wait(self.wait_s)
        try:
            token_hash = hash_token(token)
            body = repeated(self.app.extensions, self.config, token_hash, raw, peer)
            if body is None:
                with self.app.app_context():
                    body = steady_heartbeat(token_hash, raw, peer)
            return body
        finally:
            failover.set_wait(None)


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
