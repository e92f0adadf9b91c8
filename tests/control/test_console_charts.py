"""The console's charts through Flask's test client, on both store backends: the numbers
the store holds (history, usage, device-time rows written as the control service writes
them) are the numbers each chart's SVG carries; the range switch is a link; a hostile key
name is text; the pages keep their tables and the strict CSP (no script, no inline
style in the charts)."""

from __future__ import annotations

import json
import math
import re
import xml.etree.ElementTree as ET
from typing import Any

from llmgw_runtime.store.schema import device_time, history_classes, history_models, usage

from .conftest import Api
from .test_console import login

CATALOG = """models:
  - {name: tiny, source: file:///models/tiny.gguf, engine: llama.cpp, profile: {class: cpu}}
"""
SVG = "{http://www.w3.org/2000/svg}"
HOSTILE_KEY = "k<script>alert(1)</script>\"'&"


def figures(html: str) -> dict[str, ET.Element]:
    """Each chart's figure id -> its SVG, parsed (well-formed XML or it raises)."""
    found = re.findall(r'<figure class="chart" id="([^"]+)">.*?(<svg.*?</svg>)', html, re.S)
    return {ident: ET.fromstring(svg) for ident, svg in found}


def series(svg: ET.Element) -> dict[str, list[list[Any]]]:
    return {g.get("data-name") or "": json.loads(g.get("data-values") or "null")
            for g in svg.iter(SVG + "g") if "series" in (g.get("class") or "")}


def at(points: list[list[Any]], t: float) -> Any:
    return next(v for when, v in points if when == t)


def seed(api: Api) -> tuple[float, float]:
    """Rows of the last hours as the control service writes them; the store's minute (two
    minutes back) and hour (the current one: in an hour's first two minutes the minute is
    of the hour before)."""
    assert api.call("PUT", "/api/v1/catalog", data=CATALOG).status_code == 200
    with api.store.begin() as conn:
        now = api.store.clock(conn)
        minute = math.floor(now / 60) * 60 - 120
        hour = math.floor(now / 3600) * 3600
        conn.execute(history_classes.insert(), [
            {"device_class": "cpu", "step": 60, "t": minute, "devices": 4, "used": 3,
             "replicas": 2},
            {"device_class": "cpu", "step": 3600, "t": hour - 7200, "devices": 4, "used": 1,
             "replicas": 1}])
        conn.execute(history_models.insert(), [
            {"model": "tiny", "step": 60, "t": minute, "ready": 2, "wanted": 3, "waiting": 6,
             "busy": 2, "slots": 2, "refused": 4, "requests": 17, "first_byte": None}])
        conn.execute(usage.insert(), [
            {"bucket": hour, "key": k, "model": "tiny", "requests": 1, "prompt_tokens": p,
             "completion_tokens": 10} for k, p in (("alice", 900), (HOSTILE_KEY, 50))])
        conn.execute(device_time.insert(), [
            {"bucket": hour, "model": "tiny", "device_class": "cpu", "seconds": 5400.0}])
    return minute, hour


def test_charts_draw_the_numbers_the_store_holds(api: Api) -> None:
    minute, hour = seed(api)
    assert login(api).status_code == 303

    summary = api.client.get("/console/")
    html = summary.get_data(as_text=True)
    assert "script-src" not in summary.headers["Content-Security-Policy"]
    cpu = series(figures(html)["chart-class-cpu"])
    assert at(cpu["used"], minute) == 3 and at(cpu["devices"], minute) == 4
    assert at(cpu["replicas ready"], minute) == 2
    assert at(cpu["used"], minute - 60) == 0            # a minute without a row: zero
    assert 'id="devices"' in html or "No devices reported yet" in html   # the table stays
    assert '<a href="/console/?range=7d">7d</a>' in html and "<b>24h</b>" in html
    week = series(figures(api.client.get("/console/?range=7d").get_data(as_text=True))
                  ["chart-class-cpu"])
    assert at(week["used"], hour - 7200) == 1

    page = api.client.get("/console/models/tiny").get_data(as_text=True)
    charts = {k: series(v) for k, v in figures(page).items()}
    assert at(charts["chart-waiting"]["waiting (most)"], minute) == 6
    assert at(charts["chart-waiting"]["refused per minute"], minute) == 4
    assert at(charts["chart-requests"]["answered"], math.floor(minute / 3600) * 3600) == 17
    assert at(charts["chart-tokens"]["prompt"], hour) == 950
    assert at(charts["chart-replicas"]["wanted"], minute) == 3
    assert 'id="model-hours"' in page                    # the numbers as a table too
    models = api.client.get("/console/models").get_data(as_text=True)
    assert 'href="/console/models/tiny"' in models
    assert api.client.get("/console/models/nope").status_code == 404

    used = api.client.get("/console/usage").get_data(as_text=True)
    shown = figures(used)
    keys = series(shown["chart-usage-keys"])
    assert at(keys["alice"], hour) == 910 and at(keys[HOSTILE_KEY], hour) == 60
    bars = {g.get("data-name"): json.loads(g.get("data-value") or "0")
            for g in shown["chart-gpu-models"].iter(SVG + "g")}
    assert bars == {"tiny (cpu)": 1.5}
    assert "<script>alert" not in used and 'id="gpu-hours"' in used
    for html in (used, page):
        svgs = "".join(re.findall(r"<svg.*?</svg>", html, re.S))
        assert " style=" not in svgs and "<script" not in svgs
