"""What every blueprint of the control service shares: the store, authentication and the
error shape ``{"error": {"code", "reason", "message", "details"}}`` (request bodies are
parsed as their messages: api/parse.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

from flask import Flask, current_app, g, jsonify, request
from werkzeug.exceptions import HTTPException

from ..errors import AuthError, ForbiddenError, LlmgwError
from ..security import PREFIXES, bearer, hash_token
from ..store import Store, accounts, repo
from .decide import Settings

F = TypeVar("F", bound=Callable[..., Any])


def store() -> Store:
    return current_app.extensions["llmgw.store"]  # type: ignore[no-any-return]


def clock() -> float:
    """This process's clock: for what is local to it (throttling, console sessions)."""
    return time.time()


def now_of(conn: Any) -> float:
    """The fleet's clock: the store's (``Store.clock``: its offset from this process's
    clock, measured every few seconds), for the transaction ``conn`` (fleet.py)."""
    return store().clock(conn)


def fleet_settings() -> Settings:
    """The fleet layer's settings from this service's configuration."""
    return Settings.of(current_app.config["LLMGW"])


def store_health() -> dict[str, Any]:
    """The store's backend and, for a replicated one, its members (Patroni's REST API)
    and its etcd voters (etcd's own health)."""
    health = current_app.extensions["llmgw.store_health"]
    return {"backend": store().dialect, "members": health.members(),
            "voters": health.voters()}


def error_response(status: int, reason: str, message: str,
                   details: list[str] | None = None) -> Any:
    body = {"error": {"code": status, "reason": reason, "message": message,
                      "details": details or []}}
    return jsonify(body), status


def install_error_handlers(app: Flask) -> None:
    @app.errorhandler(LlmgwError)
    def _llmgw(exc: LlmgwError) -> Any:
        if exc.status >= 500:
            app.logger.warning("%s: %s", exc.reason, exc.message)
        return error_response(exc.status, exc.reason, exc.message, exc.details)

    @app.errorhandler(HTTPException)
    def _http(exc: HTTPException) -> Any:
        reason = (exc.name or "error").lower().replace(" ", "_")
        body, status = error_response(exc.code or 500, reason, exc.description or exc.name)
        allow = dict(exc.get_headers()).get("Allow")
        if allow:                       # a 405 says which methods the path has
            body.headers["Allow"] = allow
        return body, status

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception) -> Any:
        app.logger.exception("unexpected error on %s %s", request.method, request.path)
        return error_response(500, "internal_error",
                              "the control service failed unexpectedly; see its log")


def by_whom() -> str:
    """Who asks, for an event: the admin account (API) or the console user."""
    return f"{g.get('principal', 'an operator')} (admin API)"


def require(*kinds: str, in_transaction: bool = False) -> Callable[[F], F]:
    """Only a bearer token of one of ``kinds`` (admin, router, join, node) may call this.

    With ``in_transaction`` (a node's report: the hot path) the view checks the token
    itself, as the first statement of its own transaction (:func:`authenticate`), so a
    report costs one transaction, not two."""

    def wrap(view: F) -> F:
        @wraps(view)
        def inner(*args: Any, **kwargs: Any) -> Any:
            _presented(kinds)
            if not in_transaction:
                # A read: retried through a store failover like the idempotent writes.
                store().transaction(authenticate, idempotent=True)
            return view(*args, **kwargs)

        return inner  # type: ignore[return-value]

    return wrap


def _presented(kinds: tuple[str, ...]) -> str:
    """The request's bearer token (kept as ``g.token``, its hash as ``g.token_hash``), unless
    its address is refused for repeated wrong tokens of this token's kind (throttle.py; per
    worker process, by TCP peer address and the token's prefix: before any check)."""
    from flask import after_this_request

    from ..throttle import TooManyFailures, retry_after

    token = bearer(request.headers.get("Authorization"))
    if token is None:
        raise AuthError("this API needs 'Authorization: Bearer <token>'; "
                        f"use {_either(kinds)} token")
    wait = refused_s(current_app.extensions, request.remote_addr, token)
    if wait > 0:
        def retry_header(resp: Any) -> Any:
            resp.headers["Retry-After"] = retry_after(wait)
            return resp

        after_this_request(retry_header)
        raise TooManyFailures(wait)
    g.required, g.token, g.token_hash = kinds, token, hash_token(token)
    return token


def refused_s(extensions: Any, peer: str | None, token: str) -> float:
    """Seconds the address ``peer`` is still refused for repeated wrong tokens of
    ``token``'s kind (this app's throttle, throttle.py); 0 when it may try."""
    from ..throttle import key, of

    throttle = of(extensions)
    if not throttle:                      # no address has failed lately
        return 0.0
    return throttle.wait_s(key(peer or "-", token), clock())


def _either(kinds: tuple[str, ...]) -> str:
    article = "an" if kinds[0][0] in "aeiou" else "a"
    return f"{article} {' or '.join(kinds)}"


def authenticate(conn: Any) -> None:
    """Check the request's token (``g.token``, ``g.token_hash``) in ``conn``: one indexed
    lookup, node credentials say what they are (llmgw-node-...). Sets ``g.principal_kind``,
    ``g.principal`` and, for a node, ``g.node_row`` (the node as stored before this request:
    ``repo.node_by_credential``)."""
    from ..throttle import key, of

    kinds: tuple[str, ...] = g.required
    token_hash: str = g.token_hash
    account = node = None
    if g.token.startswith(PREFIXES["node"]):
        node = repo.node_by_credential(conn, token_hash)
    else:
        account = accounts.account_by_hash(conn, token_hash)
    kind = account.kind if account else ("node" if node else None)
    guesses, address = of(current_app.extensions), request.remote_addr or "-"
    counted = key(address, g.token)
    if kind is None:
        refused_s = guesses.failed(counted, clock())
        if refused_s:
            current_app.logger.warning(
                "repeated wrong tokens from %s; refusing it for %.0f s", address, refused_s)
        raise AuthError("the token matches no account; check it, or get a new one")
    guesses.succeeded(counted)
    if kind not in kinds:
        raise ForbiddenError(f"a {kind} token cannot call this API; use {_either(kinds)} token")
    g.principal_kind = kind
    g.principal = account.name if account else node.name  # type: ignore[union-attr]
    g.node_row = node
