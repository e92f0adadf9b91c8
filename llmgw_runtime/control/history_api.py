"""History API: the fleet's history the control service keeps (control/history.py) for
the console's charts, ``GET /api/v1/history?range=24h|7d&model=NAME`` (admin token)."""

from __future__ import annotations

import re
from typing import Any

from flask import Blueprint, jsonify, request

from ..api.fields import MAX_NAME, NAME_RE
from ..api.history import RANGES
from ..errors import ValidationError
from .history import history, known
from .web import now_of, require, store

bp = Blueprint("history", __name__, url_prefix="/api/v1")
DEFAULT_RANGE = "24h"


def range_of(value: str | None) -> str:
    """``range`` of a query (24h, the default, or 7d), or a 400 naming the fix."""
    value = DEFAULT_RANGE if value is None else value
    if value not in RANGES:
        raise ValidationError(f"range={value[:40]!r} is not known; use one of "
                              f"{', '.join(RANGES)} (minute points of the last day, hour "
                              "points of the last week)")
    return value


def model_of(value: str | None) -> str | None:
    """``model`` of a query: a model name, or None (every model), else a 400."""
    if value is None:
        return None
    if not value or len(value) > MAX_NAME or not re.match(NAME_RE, value):
        raise ValidationError(f"model={value[:40]!r} is not a model name; name a model "
                              "`llmgw ctl models` lists, or leave model out for every model")
    return value


@bp.get("/history")
@require("admin")
def read() -> Any:
    range_, model = range_of(request.args.get("range")), model_of(request.args.get("model"))
    with store().begin() as conn:
        if model is not None and not known(conn, model):
            raise ValidationError(f"model={model!r} is not in the catalog and has no "
                                  "history; name a model `llmgw ctl models` lists")
        answer = history(conn, now_of(conn), range_, model)
    return jsonify(answer.to_json())
