"""Admin API: router API keys (``/api/v1/keys``): create, list, change, delete. Admin
token on every route. A key is shown once, at creation; the store keeps its SHA-256.

What a key may do is set here (what each change writes: keys.py) and carried to the
routers in the routes table (routes.py): its priority in a model's queue, the models it may use (a scope: other
models answer 404 as if absent), when it expires (refused from then on) and its limits,
requests and tokens per minute (refused with a 429 beyond them). Times are the store's
clock, so a control host's wall clock never decides an expiry.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, jsonify, request

from ..api.admin import KeyCreate, KeyUpdate
from ..api.parse import parse_json
from ..security import new_token
from . import keys
from .web import by_whom, now_of, require, store

bp = Blueprint("keys", __name__, url_prefix="/api/v1")


@bp.post("/keys")
@require("admin")
def create_key() -> Any:
    spec = parse_json(KeyCreate, request.get_data(cache=True), what="API key")
    with store().begin() as conn:
        created = keys.create(conn, spec, new_token("api_key"), now_of(conn))
    return jsonify(created.to_json()), 201


@bp.get("/keys")
@require("admin")
def list_keys() -> Any:
    with store().begin() as conn:
        return jsonify(keys.listing(conn, now_of(conn)).to_json())


@bp.patch("/keys/<path:name>")
@require("admin")
def update_key(name: str) -> Any:
    """Change API key ``name``'s priority, scope, expiry or limits; routers use it from
    their next routes refresh. The key itself does not change."""
    change = parse_json(KeyUpdate, request.get_data(cache=True), what="key update")
    with store().begin() as conn:
        info = keys.update(conn, name, change, now_of(conn), by_whom())
    return jsonify(info.to_json())


@bp.delete("/keys/<path:name>")
@require("admin")
def delete_key(name: str) -> Any:
    """Delete the API key ``name``; routers refuse it from their next routes refresh."""
    with store().begin() as conn:
        deleted = keys.delete(conn, name, now_of(conn), by_whom())
    return jsonify(deleted.to_json())
