"""The fleet summary and the placement dry run, for ``ctl status``, ``ctl plan`` and the
console: both derived by the fleet layer from the same rows as the listings."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, current_app, jsonify, request

from ..errors import ValidationError
from . import fleet, summary_view
from .web import fleet_settings, now_of, require, store, store_health

bp = Blueprint("status", __name__, url_prefix="/api/v1")
MAX_IDLE_AFTER_S = 1e9


def idle_after_arg() -> float | None:
    raw = request.args.get("idle_after_s")
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value <= MAX_IDLE_AFTER_S:
        raise ValidationError(f"idle_after_s={raw[:40]!r} must be a number of seconds, from "
                              f"0 to {MAX_IDLE_AFTER_S:g}")
    return value


@bp.get("/status")
@require("admin")
def status() -> Any:
    idle_after_s = idle_after_arg()
    if idle_after_s is None:
        idle_after_s = current_app.config["LLMGW"].idle_after_s
    settings = fleet_settings()
    with store().begin() as conn:       # the transaction reads; the summary is derived after
        rows = summary_view.read(conn, now_of(conn), settings)
    return jsonify(summary_view.build(rows, settings, idle_after_s=idle_after_s,
                                      store=store_health()))


@bp.get("/plan")
@require("admin")
def plan() -> Any:
    """What placement would do now, without doing it, and why."""
    with store().begin() as conn:
        return jsonify(fleet.plan_view(conn, now_of(conn), fleet_settings()).to_json())
