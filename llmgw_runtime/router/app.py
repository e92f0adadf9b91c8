"""The router's Flask app: OpenAI-compatible routes in front of the engine replicas (the
proxied POST routes are plain WSGI, ``wsgi.py``; what a worker keeps and does for them
before an engine answers is ``state.py``).

gunicorn calls :func:`create_app` in each gevent worker (after gevent has patched);
``gunicorn 'llmgw_runtime.router.app:create_app_from_env()'`` reads ``LLMGW_*`` variables.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlsplit

from flask import Blueprint, Flask, Response, jsonify, request
from werkzeug.exceptions import HTTPException

from ..settings import load
from ..throttle import retry_after
from .body import _too_large
from .config import RouterConfig
from .cors import Cors
from .errors import (
    ModelNotFound,
    NotControlService,
    RouterError,
    error_body,
)
from .metrics import CONTENT_TYPE, MetricsMiddleware, RouterMetrics
from .openapi import openapi_document
from .routes import (
    RoutesTable,
)
from .state import RouterState
from .usage import KEY_ID
from .wsgi import MAX_MODEL_NAME, ProxiedRoutes, retry_after_s

log = logging.getLogger(__name__)

VERSION = "0.1.0"

def _error_response(exc: RouterError) -> Response:
    RouterMetrics.error_answered(request.environ, exc.code)
    resp = jsonify(exc.body())
    resp.status_code = exc.status
    wait = retry_after_s(exc)
    if wait is not None:
        resp.headers["Retry-After"] = retry_after(wait)
    return resp


def _openai_blueprint(state: RouterState) -> Blueprint:
    bp = Blueprint("openai", __name__)
    bp.register_error_handler(RouterError, _error_response)

    @bp.get("/v1/models")
    def models() -> Response:
        table = state.current_table()
        state.check_api_key(table, request.environ)
        key_id = request.environ[KEY_ID]
        names = sorted([*table.models, *table.aliases])
        return jsonify({"object": "list", "data": [
            model_entry(table, name) for name in names
            if table.may_use(key_id, table.canonical(name))]})

    @bp.get("/v1/models/<path:model_id>")
    def model(model_id: str) -> Response:
        """One model, as in the list (the openai client's ``models.retrieve``); a model
        added a moment ago is looked up again before the 404, as for a request."""
        table = state.current_table()
        state.check_api_key(table, request.environ)
        if len(model_id) <= MAX_MODEL_NAME and model_id not in table.aliases:
            table = state.table_for(model_id, table)
        name = table.canonical(model_id)
        if name not in table.models or not table.may_use(request.environ[KEY_ID], name):
            raise ModelNotFound(f"model '{model_id[:MAX_MODEL_NAME]}' is not in the catalog; "
                                "GET /v1/models lists the models this router serves",
                                param="model")
        return jsonify(model_entry(table, model_id))

    @bp.route("/api", methods=_ALL_METHODS)
    @bp.route("/api/<path:rest>", methods=_ALL_METHODS)
    def admin_api(rest: str = "") -> Response:
        raise NotControlService(not_control_message(state.config.control_url))

    return bp


_ALL_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"]


def model_entry(table: RoutesTable, name: str) -> dict[str, Any]:
    """A model as OpenAI's ``GET /v1/models`` lists it (``api.router.ModelEntry``): created
    when it was first applied, the same on every router (from a control service older
    than ``RouteModel.created``: when this router first saw it)."""
    canonical = table.canonical(name)
    route = table.models.get(canonical)
    created = route.created if route is not None else None
    return {"id": name, "object": "model",
            "created": table.first_seen.get(canonical, 0) if created is None else created,
            "owned_by": "llmgw"}


def not_control_message(control_url: str) -> str:
    """What the router answers to an admin API path: ``llmgw ctl`` was pointed at it. The
    control service's URL is named without any user:password part."""
    parts = urlsplit(control_url)
    url = f"{parts.scheme}://{parts.netloc.rsplit('@', 1)[-1]}"
    return ("this is the llmgw router (the OpenAI API, /v1/...), not the control service: "
            f"`llmgw ctl` talks to the control service at {url} (`llmgw ctl --url {url} "
            "...`, or set LLMGW_CONTROL_URL)")


_HTTP_CODES = {400: "invalid_request", 404: "not_found", 405: "method_not_allowed",
               413: "request_too_large"}


def create_app(config: RouterConfig | None = None) -> Flask:
    """The router's WSGI app; ``config`` defaults to one loaded from ``LLMGW_*``."""
    if config is None:
        config = load(RouterConfig)
    app = Flask(__name__)
    app.json.sort_keys = False  # type: ignore[attr-defined]
    # A backstop: the proxied routes read bodies with read_body; anything that reads one
    # through Flask (get_data, get_json, forms) is held to the same limit.
    app.config["MAX_CONTENT_LENGTH"] = config.max_body_bytes
    state = RouterState(config)
    app.extensions["llmgw_router"] = state
    app.register_blueprint(_openai_blueprint(state))

    @app.get("/health")
    @app.get("/healthz")
    def healthz() -> Response:
        """Also at ``/health``, where llama.cpp and vLLM answer it (benchmarks and clients
        written for the engines check it first)."""
        state.routes.ensure_started()
        # A worker that has no table yet fetches one now (shared, at most every 0.5 s):
        # a fresh worker is not unhealthy, only new (each worker has its own table).
        table = state.routes.table or state.routes.refresh(max_age_s=0.5)
        if table is None:
            resp = jsonify({"status": "routes_unavailable", "models": 0,
                            "message": state.routes.problem or "no routes table yet"})
            resp.status_code = 503
            return resp
        return jsonify({"status": "ok", "models": len(table.models)})

    @app.get("/openapi.json")
    def openapi() -> Response:
        return jsonify(openapi_document(VERSION))

    @app.get("/metrics")
    def metrics() -> Response:
        """Open, like /healthz: counts and timings per model name, no secrets."""
        return Response(state.metrics.render(), content_type=CONTENT_TYPE)

    @app.errorhandler(HTTPException)
    def http_error(exc: HTTPException) -> Response:
        status = exc.code or 500
        code = _HTTP_CODES.get(status, "http_error")
        RouterMetrics.error_answered(request.environ, code)
        if status == 413:
            body = _too_large(config.max_body_bytes, request.content_length).body()
        else:
            body = error_body(f"{request.method} {request.path}: {exc.description}",
                              "server_error" if status >= 500 else "invalid_request_error",
                              code)
        resp = jsonify(body)
        resp.status_code = status
        # werkzeug's own headers of the error: Allow on a 405, WWW-Authenticate, Retry-After
        for name, value in exc.get_headers(request.environ):
            if name.lower() not in ("content-type", "content-length"):
                resp.headers[name] = value
        return resp

    app.wsgi_app = MetricsMiddleware(  # type: ignore[method-assign]
        ProxiedRoutes(state, app.wsgi_app), state.metrics)
    if config.cors_origin_set:        # browsers' pages allowed to call it (cors.py)
        app.wsgi_app = Cors(app.wsgi_app, config.cors_origin_set)  # type: ignore[method-assign]
    return app


def create_app_from_env() -> Flask:
    """For ``gunicorn 'llmgw_runtime.router.app:create_app_from_env()'``."""
    return create_app(load(RouterConfig))
