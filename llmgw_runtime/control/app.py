"""The control service's Flask application factory (gunicorn calls ``create_app``)."""

from __future__ import annotations

import logging
from typing import Any

from flask import Blueprint, Flask, jsonify
from sqlalchemy.exc import DBAPIError

from .. import __version__, settings
from ..api.admin import Health
from ..api.openapi import control_document
from ..errors import StoreError
from ..store import Store, failover, repo
from ..store.db import redact_url
from ..store.members import StoreHealth
from . import (
    admin_api,
    agent_api,
    console,
    history_api,
    keys_api,
    metrics,
    rollout_api,
    routes_api,
    status_api,
    usage_api,
)
from .config import ControlConfig
from .reconcile import LEASE
from .tracing import install as install_tracing
from .web import error_response, install_error_handlers, store

log = logging.getLogger(__name__)

health = Blueprint("health", __name__)


@health.get("/healthz")
def healthz() -> Any:
    try:
        with store().begin() as conn:
            holder = repo.lease_holder(conn, LEASE, store().now(conn))
    except StoreError as exc:
        return jsonify(Health(status="store_unavailable", message=exc.message, leader=None,
                              version=__version__).to_json()), 503, RETRY_AFTER
    return jsonify(Health(status="ok", leader=holder, version=__version__).to_json())


RETRY_AFTER = {"Retry-After": str(failover.RETRY_AFTER_S)}
STORE_RETRY = (f"retry in {failover.RETRY_AFTER_S} s (Retry-After); the store pauses for up "
               "to half a minute while a failover elects a new primary. A write answered "
               "so may have been saved: sending the same request again is safe (a "
               "catalog, report or change applied twice counts once; a create answers "
               "409 if the first was saved)")


def install_store_waits(app: Flask, wait_s: float) -> None:
    """Each request waits at most ``wait_s`` for the store (store/failover.py set_wait:
    a transaction, a connection, the retries), and a store that does not answer is a 503
    with Retry-After instead of a request that hangs past its client's timeout."""

    @app.before_request
    def _bound() -> None:
        failover.set_wait(wait_s)

    @app.teardown_request
    def _unbound(_exc: BaseException | None) -> None:
        failover.set_wait(None)

    @app.errorhandler(StoreError)
    def _store(exc: StoreError) -> Any:
        app.logger.warning("%s: %s", exc.reason, exc.message)
        body, status = error_response(503, exc.reason, exc.message,
                                      [*exc.details, STORE_RETRY])
        body.headers.update(RETRY_AFTER)
        return body, status

    @app.errorhandler(DBAPIError)
    def _database(exc: DBAPIError) -> Any:
        why = failover.classify(exc)
        if why is None:                     # about the statement: a bug, a 500
            app.logger.exception("database error")
            return error_response(500, "internal_error", "the control service failed "
                                  "unexpectedly; see its log")
        return _store(failover.unavailable(redact_url(app.extensions["llmgw.store"].url),
                                           exc, why))


@health.get("/openapi.json")
def openapi() -> Any:
    return jsonify(control_document(__version__))


def create_app(config: ControlConfig | None = None, *, store_: Store | None = None) -> Flask:
    """The web app: APIs and the console. It never runs a reconcile pass: the reconciler
    is a process of its own (``control/reconcile.py``, started by ``serve.run``)."""
    config = config or settings.load(ControlConfig)
    app = Flask("llmgw.control")
    app.config["LLMGW"] = config
    app.config["MAX_CONTENT_LENGTH"] = 8 * 1024 * 1024
    app.json.sort_keys = False  # type: ignore[attr-defined]
    app.extensions["llmgw.store"] = store_ or Store(config.store_url)
    app.extensions["llmgw.store_health"] = StoreHealth(config.store_members_urls,
                                                       etcd=config.store_etcd_urls)
    install_tracing(app, config)     # spans of its requests, with LLMGW_OTEL_ENDPOINT
    install_error_handlers(app)
    install_store_waits(app, config.store_wait_s)
    agent_api.install(app)
    for bp in (health, agent_api.bp, routes_api.bp, admin_api.bp, keys_api.bp, status_api.bp,
               usage_api.bp, rollout_api.bp, history_api.bp, console.bp):
        app.register_blueprint(bp)
    metrics.install(app, app.extensions["llmgw.store"], config)
    return app
