"""The control service's Flask application factory (gunicorn calls ``create_app``)."""

from __future__ import annotations

import logging
from typing import Any

from flask import Blueprint, Flask, jsonify

from .. import __version__, settings
from ..api.admin import Health
from ..api.openapi import control_document
from ..errors import StoreError
from ..store import Store, repo
from ..store.members import StoreHealth
from . import (
    admin_api,
    agent_api,
    console,
    keys_api,
    metrics,
    rollout_api,
    routes_api,
    status_api,
    usage_api,
)
from .config import ControlConfig
from .reconcile import LEASE
from .web import install_error_handlers, store

log = logging.getLogger(__name__)

health = Blueprint("health", __name__)


@health.get("/healthz")
def healthz() -> Any:
    try:
        with store().begin() as conn:
            holder = repo.lease_holder(conn, LEASE, store().now(conn))
    except StoreError as exc:
        return jsonify(Health(status="store_unavailable", message=exc.message, leader=None,
                              version=__version__).to_json()), 503
    return jsonify(Health(status="ok", leader=holder, version=__version__).to_json())


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
    install_error_handlers(app)
    agent_api.install(app)
    for bp in (health, agent_api.bp, routes_api.bp, admin_api.bp, keys_api.bp, status_api.bp,
               usage_api.bp, rollout_api.bp, console.bp):
        app.register_blueprint(bp)
    metrics.install(app, app.extensions["llmgw.store"], config)
    return app
