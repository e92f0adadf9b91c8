"""The web console: server-rendered pages (no JavaScript needed to read them) over the same
summary and rows as ``ctl``: the summary, nodes with their devices, models with a Retry
button for parked ones, replicas with idle time, recent events, usage. Charts of the
fleet's history (console_charts.py, drawn as SVG by charts.py) on the Summary, a model's
page and Usage, over ``?range=24h`` or ``7d``. Login: console_auth.py."""

from __future__ import annotations

import logging
import math
import time
from typing import Any
from urllib.parse import urlencode

from flask import (
    Blueprint,
    Response,
    current_app,
    g,
    make_response,
    redirect,
    render_template,
    request,
    url_for,
)
from werkzeug.exceptions import HTTPException

from .. import throttle
from ..api.history import RANGES
from ..errors import LlmgwError, NotFoundError, StoreError
from ..status import changes, render, tables
from ..status.summary import at_capacity, device_label, failing_of, location, node_alive
from ..status.telling import telling_line
from ..store import repo
from ..store import usage as usage_store
from . import console_auth as auth
from . import console_charts as charts
from . import fleet, gpu_hours, history, summary_view, usage
from .web import clock, fleet_settings, now_of, store, store_health

log = logging.getLogger(__name__)

bp = Blueprint("console", __name__, template_folder="templates", static_folder="static",
               static_url_path="/console/static")

PER_PAGE = 200               # rows per page of nodes, replicas and models (10,000 nodes: 50)
EVENTS = 200                 # events shown by default (at most 1,000)
CSP = ("default-src 'none'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")


# ---------------------------------------------------------------- rendering


def page(template: str, title: str, status: int = 200, refresh: bool = True,
         **context: Any) -> Response:
    """A console page; read pages reload themselves every ``console_refresh_s``."""
    interval = current_app.config["LLMGW"].console_refresh_s if refresh else 0
    keep = {k: v for k, v in request.args.items()
            if k in ("page", "q", "limit", "since", "by", "range")}
    refresh_url = request.path + ("?" + urlencode(keep) if keep else "")
    html = render_template(template, title=title, refresh=int(interval) if interval > 0
                           else 0, refresh_url=refresh_url, user=g.get("console_user"),
                           csrf=g.get("console_csrf"), now=clock(), **context)
    return make_response(html, status)


def paginate(items: list[Any]) -> tuple[list[Any], dict[str, int]]:
    pages = max(1, math.ceil(len(items) / PER_PAGE))
    try:
        number = int(request.args.get("page", "1"))
    except ValueError:
        number = 1
    number = min(max(1, number), pages)
    start = (number - 1) * PER_PAGE
    chunk = items[start:start + PER_PAGE]
    return chunk, {"page": number, "pages": pages, "total": len(items),
                   "first": start + 1 if chunk else 0, "last": start + len(chunk)}


@bp.app_template_filter("duration")
def duration(seconds: float | None) -> str:
    """As ``ctl status`` writes it (``45s``, ``12m``, ``3h05m``); ``-`` when unknown."""
    return "-" if seconds is None else tables.duration(seconds)


@bp.app_template_filter("utc")
def utc(when: float | None) -> str:
    if when is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(when))


@bp.app_template_filter("gb")
def gb(mb: float | None) -> str:
    return "-" if mb is None else f"{mb / 1024:.1f}"


bp.add_app_template_filter(tables.human_bytes, "bytes")
bp.add_app_template_filter(telling_line, "telling")
bp.add_app_template_filter(render.scaling_window, "scaling_window")


@bp.after_request
def headers(resp: Response) -> Response:
    resp.headers["Content-Security-Policy"] = CSP
    resp.headers["X-Frame-Options"] = "DENY"
    resp.headers["X-Content-Type-Options"] = "nosniff"
    resp.headers["Referrer-Policy"] = "same-origin"
    if request.endpoint != "console.static":
        resp.headers["Cache-Control"] = "no-store"
    return resp


@bp.errorhandler(Exception)
def error(exc: Exception) -> Any:
    """Errors as a page that says what happened and what to do, not JSON."""
    if isinstance(exc, HTTPException) and exc.code is not None and exc.code < 400:
        return exc
    if isinstance(exc, LlmgwError):
        status, message = exc.status, exc.message
        if status >= 500:
            log.warning("console: %s: %s", exc.reason, exc.message)
    elif isinstance(exc, HTTPException):
        status, message = exc.code or 500, exc.description or exc.name
    else:
        log.exception("console: unexpected error on %s %s", request.method, request.path)
        status, message = 500, "the control service failed unexpectedly; see its log"
    titles = {403: "Refused", 404: "Not found", 503: "Store unavailable"}
    return page("error.html", titles.get(status, f"Error {status}"), status=status,
                refresh=isinstance(exc, StoreError), message=message, code=status)


# ---------------------------------------------------------------- login


@bp.get("/")
def root() -> Any:
    return redirect(auth.HOME)


def login_page(status: int = 200, **context: Any) -> Response:
    """The login page, saying where the admin token is (``auth.WHERE_THE_TOKEN_IS``)."""
    return page("login.html", "Log in", status=status, refresh=False,
                where=auth.WHERE_THE_TOKEN_IS, **context)


@bp.route("/console/login", methods=["GET", "POST"])
def login() -> Any:
    target = auth.safe_next(request.values.get("next"))
    if request.method == "GET":
        if auth.current() is not None:
            return redirect(target)
        notes = {"ended": "Your session ended (it expired, or you logged out); log in again.",
                 "out": "You are logged out."}
        note = next((v for k, v in notes.items() if request.args.get(k)), None)
        return login_page(next=target, note=note)
    auth.check_origin()
    wait = auth.login_wait()
    if wait > 0:
        resp = login_page(status=429, next=target,
                          error=f"too many failed logins from your address; wait "
                                f"{throttle.retry_after(wait)} s, then try again")
        resp.headers["Retry-After"] = throttle.retry_after(wait)
        return resp
    token = request.form.get("token", "")
    account, problem = auth.admin_of(token)
    done: Any = redirect(target, 303)
    started = auth.start_session(done, token) if account is not None else None
    if started is None:
        problem = problem or "that admin token was just replaced; use the new one"
        if token.strip():                # a guess (an empty form is not)
            auth.login_failed()
        log.warning("console login refused from %s: %s", request.remote_addr,
                    problem.split(";")[0])
        return login_page(status=401, next=target, error=problem)
    auth.login_succeeded()
    return started


@bp.post("/console/logout")
@auth.login_required
def logout() -> Any:
    auth.check_csrf()
    log.info("console logout: %s", g.console_user)
    return auth.end_session(redirect(auth.login_url(out="1"), 303))  # type: ignore[arg-type]


# ---------------------------------------------------------------- pages


@bp.get("/console/")
@auth.login_required
def summary() -> Any:
    span = charts.range_of(request.args.get("range"))
    settings = fleet_settings()
    with store().begin() as conn:       # the transaction reads; the summary is derived after
        now = now_of(conn)
        rows = summary_view.read(conn, now, settings)
        past = history.history(conn, now, span, with_models=False)
    data = summary_view.build(rows, settings,
                              idle_after_s=current_app.config["LLMGW"].idle_after_s,
                              store=store_health())
    shown, pager = paginate(data["models"])     # the models table, a page at a time
    return page("summary.html", "Summary", s=data, models=shown, paging=pager, span=span,
                spans=list(RANGES), class_charts=charts.class_charts(past))


@bp.get("/console/nodes")
@auth.login_required
def nodes() -> Any:
    config = current_app.config["LLMGW"]
    query = request.args.get("q", "").strip()
    with store().begin() as conn:
        rows = repo.list_nodes(conn)
        now = now_of(conn)
    if query:
        rows = [r for r in rows if query.lower() in r.name.lower()
                or query.lower() in (r.fabric or "").lower()]
    chunk, pager = paginate(rows)
    shown = []
    for row in chunk:          # decode only this page's nodes: 200 of 2,000
        node = fleet.node_view(row)
        hardware = node.get("hardware") or {}
        shown.append({
            **node, "alive": node_alive(node, now, config.node_timeout_s),
            "devs": [{**d, "label": device_label(d)} for d in node["devices"]],
            "bad_cards": [c for c in hardware.get("cards", []) if c.get("problem")],
            "problems": ([node["problem"]] if node.get("problem") else [])
            + (hardware.get("problems", []) if not node["devices"] else [])})
    return page("nodes.html", "Nodes", nodes=shown, paging=pager, q=query)


@bp.get("/console/models")
@auth.login_required
def models() -> Any:
    with store().begin() as conn:
        now = now_of(conn)
        rows = summary_view.read(conn, now, fleet_settings(), nodes=False)
    chunk, pager = paginate(rows.models)
    # each model's capacity, rollout and failing streak as the summary says them (the
    # summary's own functions over the same rows)
    items = [{**m, "at_capacity": at_capacity(m, now), "failing": failing_of(m),
              "rollout": changes.rollout_of(m, rows.replicas)} for m in chunk]
    retried = request.args.get("retried")
    return page("models.html", "Models", models=items, paging=pager,
                retried=retried if retried in {m["name"] for m in rows.models} else None)


@bp.get("/console/models/<path:name>")
@auth.login_required
def model_page(name: str) -> Any:
    """One model's charts over ``?range=24h`` or ``7d``, and its hours as a table."""
    span = charts.range_of(request.args.get("range"))
    with store().begin() as conn:
        now = now_of(conn)
        found = [m for m in fleet.models_view(conn, now) if m["name"] == name]
        if not found:
            raise NotFoundError(f"no model {name[:200]!r} in the catalog; the Models page "
                                "lists those there are")
        past = history.history(conn, now, span, model=name)
        tokens = usage_store.series(conn, past.since, "model", only=[name])
    return page("model.html", name, model=found[0], span=span, spans=list(RANGES),
                charts=charts.model_charts(past, name, tokens),
                hours=charts.hour_rows(past.models.get(name, []), tokens))


@bp.post("/console/models/<path:name>/retry")
@auth.login_required
def retry(name: str) -> Any:
    auth.check_csrf()
    with store().begin() as conn:
        fleet.unpark(conn, name, now_of(conn), by=f"{g.console_user} (console)")
    log.info("console: %s unparked model %s", g.console_user, name)
    return redirect(url_for("console.models", retried=name), 303)


@bp.get("/console/replicas")
@auth.login_required
def replicas() -> Any:
    with store().begin() as conn:
        rows = repo.list_replicas(conn)
        parts = repo.parts_by_replica(conn)
        now = now_of(conn)
    chunk, pager = paginate(rows)
    shown = []
    for row in chunk:
        rep = fleet.replica_view(row, parts.get(row.id), now)
        idle = (now - rep["last_used"] if rep["state"] == "ready"
                and rep["last_used"] is not None else None)
        shown.append({**rep, "where": location(rep), "idle_s": idle,
                      "state_text": changes.replica_state(rep)})
    return page("replicas.html", "Replicas", replicas=shown, paging=pager)


@bp.get("/console/events")
@auth.login_required
def events() -> Any:
    try:
        limit = max(1, min(int(request.args.get("limit", EVENTS)), 1000))
    except ValueError:
        limit = EVENTS
    with store().begin() as conn:
        items = repo.list_events(conn, limit)
    return page("events.html", "Events", events=items, limit=limit)


@bp.get("/console/usage")
@auth.login_required
def usage_page() -> Any:
    """Tokens per API key and model over a period (``?since=24h``), as ``ctl usage``; its
    busiest keys' tokens per hour, and GPU-hours by model and key, charted."""
    period = request.args.get("since", usage.DEFAULT_SINCE)
    if period not in usage.PERIODS:
        period = usage.DEFAULT_SINCE
    costs = gpu_hours.parse_costs(current_app.config["LLMGW"].cost_per_device_hour)
    with store().begin() as conn:
        now = now_of(conn)
        seconds = usage.since_s(period)
        data = usage.usage_view(conn, now, seconds, "key,model")
        keys = usage_by_key(data["rows"])
        top = charts.top_keys({k: t["prompt_tokens"] + t["completion_tokens"]
                               for k, t in keys.items()})
        per_key = usage_store.series(conn, data["since"], "key", only=top) if top else []
        everything = usage_store.series(conn, data["since"], "") if top else []
        gpu = {by: gpu_hours.device_hours(conn, now, seconds, by, costs)
               for by in ("model", "key")}
    shown = [charts.key_tokens_chart(per_key, everything, top, data["since"], now,
                                     others=len(keys) > len(top)),
             charts.gpu_hours_chart("chart-gpu-models", "GPU-hours by model",
                                    gpu["model"].rows, "model"),
             charts.gpu_hours_chart("chart-gpu-keys", "GPU-hours by key",
                                    [*gpu["key"].rows, *charts.unattributed(gpu["key"])],
                                    "key")]
    return page("usage.html", "Usage", usage=data, keys=keys, period=period,
                periods=usage.PERIODS, charts=shown, gpu=gpu)


def usage_by_key(rows: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Usage rows by key and model summed per key, in the rows' order."""
    keys: dict[str, dict[str, int]] = {}
    for row in rows:
        total = keys.setdefault(row["key"], {"requests": 0, "prompt_tokens": 0,
                                             "completion_tokens": 0, "refused": 0})
        for field in total:
            total[field] += row.get(field, 0)
    return keys
