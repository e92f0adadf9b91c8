"""The pieces make_dashboards.py describes a dashboard with (``Q``, ``Panel``, ``Row``,
``Var``, ``Dashboard`` and the ``ts`` and ``stat`` shorthands), and the Grafana dashboard
JSON it writes for one (``render``: schemaVersion 39, the panels laid out left to right in
rows of 24 columns, every query on the ``datasource`` variable's Prometheus)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

SCHEMA_VERSION = 39
TAG = "llmgw"
WIDTH = 24                       # Grafana's grid is 24 columns wide
DS = {"type": "prometheus", "uid": "${datasource}"}


# ---------------------------------------------------------------------- the description


@dataclass(frozen=True)
class Q:
    """One query of a panel: PromQL and the legend of its series."""

    expr: str
    legend: str = ""
    instant: bool = False


@dataclass(frozen=True)
class Panel:
    title: str
    queries: tuple[Q, ...]
    description: str
    unit: str = "short"
    kind: str = "timeseries"     # timeseries, stat, table, bargauge, heatmap
    width: int = 12
    height: int = 8
    stack: bool = False


@dataclass(frozen=True)
class Row:
    title: str


@dataclass(frozen=True)
class Var:
    """A query variable from ``label_values(metric, label)``."""

    name: str
    label: str
    query: str


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    variables: tuple[Var, ...]
    items: tuple[Panel | Row, ...] = field(default=())


def ts(title: str, description: str, *queries: Q, **kw: Any) -> Panel:
    return Panel(title, queries, description, **kw)


def stat(title: str, description: str, *queries: Q, **kw: Any) -> Panel:
    return Panel(title, queries, description, kind="stat", width=kw.pop("width", 6),
                 height=kw.pop("height", 4), **kw)


# ---------------------------------------------------------------------- the JSON


def _variables(dash: Dashboard) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{
        "name": "datasource", "label": "Prometheus", "type": "datasource",
        "query": "prometheus", "current": {}, "hide": 0, "options": [], "refresh": 1,
        "regex": "", "includeAll": False, "multi": False}]
    for var in dash.variables:
        out.append({
            "name": var.name, "label": var.label, "type": "query", "datasource": DS,
            "definition": var.query,
            "query": {"qryType": 1, "query": var.query,
                      "refId": "PrometheusVariableQueryEditor-VariableQuery"},
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
            "includeAll": True, "allValue": ".*", "multi": True, "hide": 0,
            "options": [], "refresh": 2, "regex": "", "sort": 1})
    return out


def _field_config(panel: Panel) -> dict[str, Any]:
    defaults: dict[str, Any] = {"unit": panel.unit}
    if panel.kind == "timeseries":
        defaults["custom"] = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10,
                              "showPoints": "never", "spanNulls": False,
                              "stacking": {"mode": "normal" if panel.stack else "none",
                                           "group": "A"}}
        defaults["min"] = 0
    return {"defaults": defaults, "overrides": []}


def _options(panel: Panel) -> dict[str, Any]:
    if panel.kind == "timeseries":
        return {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                "tooltip": {"mode": "multi", "sort": "desc"}}
    if panel.kind == "stat":
        return {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                "colorMode": "value", "graphMode": "none", "textMode": "value_and_name",
                "orientation": "auto", "justifyMode": "auto"}
    if panel.kind == "bargauge":
        return {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                "orientation": "horizontal", "displayMode": "basic", "showUnfilled": True}
    if panel.kind == "heatmap":
        return {"calculate": False, "yAxis": {"unit": "s"}, "cellGap": 1,
                "color": {"mode": "scheme", "scheme": "Oranges", "steps": 64},
                "tooltip": {"show": True, "yHistogram": True}}
    return {"showHeader": True, "cellHeight": "sm"}


def _target(q: Q, ref: str, panel: Panel) -> dict[str, Any]:
    target: dict[str, Any] = {"datasource": DS, "refId": ref, "expr": q.expr,
                              "legendFormat": q.legend or "__auto", "range": not q.instant,
                              "instant": q.instant, "editorMode": "code"}
    if panel.kind == "table":
        target["format"] = "table"
    elif panel.kind == "heatmap":
        target["format"] = "heatmap"
    return target


def _layout(items: Iterable[Panel | Row]) -> list[dict[str, Any]]:
    """Grafana panels, laid out left to right in rows of 24 columns; a Row starts a new
    line the whole width."""
    panels: list[dict[str, Any]] = []
    x = y = line = 0
    for n, item in enumerate(items, start=1):
        if isinstance(item, Row):
            y, x, line = y + line, 0, 0
            panels.append({"id": n, "type": "row", "title": item.title, "collapsed": False,
                           "gridPos": {"h": 1, "w": WIDTH, "x": 0, "y": y}, "panels": []})
            y += 1
            continue
        if x + item.width > WIDTH:
            y, x, line = y + line, 0, 0
        panels.append({
            "id": n, "type": item.kind, "title": item.title, "description": item.description,
            "datasource": DS,
            "gridPos": {"h": item.height, "w": item.width, "x": x, "y": y},
            "targets": [_target(q, chr(ord("A") + i), item) for i, q in enumerate(item.queries)],
            "fieldConfig": _field_config(item), "options": _options(item),
            **({"transformations": [{"id": "merge", "options": {}}]}
               if item.kind == "table" else {})})
        x += item.width
        line = max(line, item.height)
    return panels


def render(dash: Dashboard) -> dict[str, Any]:
    """The Grafana dashboard JSON of ``dash`` (no ``id``: Grafana gives one on import)."""
    return {
        "uid": dash.uid, "title": dash.title, "description": dash.description,
        "tags": [TAG], "schemaVersion": SCHEMA_VERSION, "version": 1, "editable": True,
        "graphTooltip": 1, "timezone": "", "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"}, "timepicker": {},
        "fiscalYearStartMonth": 0, "liveNow": False, "weekStart": "",
        "annotations": {"list": [{
            "builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
            "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
            "name": "Annotations & Alerts", "type": "dashboard"}]},
        "links": [{"title": "llmgw dashboards", "type": "dashboards", "tags": [TAG],
                   "asDropdown": True, "includeVars": False, "keepTime": True,
                   "icon": "external link", "targetBlank": False, "tooltip": "",
                   "url": ""}],
        "templating": {"list": _variables(dash)},
        "panels": _layout(dash.items),
    }
