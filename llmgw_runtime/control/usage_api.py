"""Usage API: routers report what each API key used of each model (``POST /api/v1/usage``,
router token: applied once per reporter and sequence number, control/usage.py), admins
read it back (``GET /api/v1/usage?since=24h&by=key``: ``llmgw ctl usage``), and the
device-hours of the models' replicas, per model or shared per key by tokens
(``GET /api/v1/usage/gpu-hours``: ``llmgw ctl usage --gpu-hours``, control/gpu_hours.py)."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, current_app, jsonify, request

from ..api.parse import parse_json
from ..api.usage import UsageAck, UsageReport
from .gpu_hours import device_hours, parse_costs
from .usage import apply_report, by_of, since_s, usage_list
from .web import now_of, require, store

bp = Blueprint("usage", __name__, url_prefix="/api/v1")


@bp.post("/usage")
@require("router")
def report() -> Any:
    body = parse_json(UsageReport, request.get_data(cache=True), what="usage report")
    # Idempotent (a report applied once, by its seq): retried through a store failover.
    applied = store().write(lambda conn: apply_report(conn, body, now_of(conn)))
    return jsonify(UsageAck(applied=applied).to_json())


@bp.get("/usage")
@require("admin")
def read() -> Any:
    since, by = since_s(request.args.get("since")), by_of(request.args.get("by"))
    with store().begin() as conn:
        answer = usage_list(conn, now_of(conn), since, by)
    return jsonify(answer.to_json())


@bp.get("/usage/gpu-hours")
@require("admin")
def gpu_hours() -> Any:
    since, by = since_s(request.args.get("since")), by_of(request.args.get("by"))
    costs = parse_costs(current_app.config["LLMGW"].cost_per_device_hour)   # validated
    with store().begin() as conn:
        answer = device_hours(conn, now_of(conn), since, by, costs)
    return jsonify(answer.to_json())
