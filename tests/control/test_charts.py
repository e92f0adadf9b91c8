"""The console's SVG charts (control/charts.py) and what they show (console_charts.py),
as pure functions: a hostile name stays text, an empty range, one point and a gap draw
what they are, labels are UTC, the busiest keys are drawn one by one and the rest as
"other"."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from typing import Any

from llmgw_runtime.api.history import History, ModelPoint
from llmgw_runtime.api.usage import DeviceHoursList, DeviceHoursRow
from llmgw_runtime.control import console_charts as cc
from llmgw_runtime.control.charts import Bar, Series, bar_chart, line_chart, number, runs

SVG = "{http://www.w3.org/2000/svg}"
HOSTILE = "\"><script>alert('x')</script><svg onload=alert(1)>&amp;"
DAY = 1_764_892_800.0            # 2025-12-05 00:00 UTC


def parse(svg: str) -> ET.Element:
    return ET.fromstring(svg)   # well-formed XML or it raises


def groups(svg: str) -> dict[str, Any]:
    """Each series' name -> its data-values, as a test reads them off the page."""
    return {g.get("data-name"): json.loads(g.get("data-values") or "null")
            for g in parse(svg).iter(SVG + "g") if "series" in (g.get("class") or "")}


def texts(svg: str, cls: str) -> list[str]:
    return [t.text or "" for t in parse(svg).iter(SVG + "text") if t.get("class") == cls]


def test_a_hostile_name_is_text_in_the_legend_and_the_data() -> None:
    svg = line_chart(HOSTILE, [Series(HOSTILE, [(DAY, 1.0), (DAY + 60, 2.0)])],
                     DAY, DAY + 3600, unit="<b>u</b>")
    assert "<script" not in svg and "<svg onload" not in svg and "<b>" not in svg
    assert groups(svg) == {HOSTILE: [[DAY, 1.0], [DAY + 60, 2.0]]}
    root = parse(svg)
    assert root.find(SVG + "title").text == HOSTILE                  # type: ignore[union-attr]
    legend = [t.text for g in root.iter(SVG + "g") if "key" in (g.get("class") or "")
              for t in g.iter(SVG + "text")]
    assert legend == [HOSTILE[:27] + "…"]
    bars = bar_chart(HOSTILE, [Bar(HOSTILE, 2.5, "cost <1>")], "h")
    bar = next(g for g in parse(bars).iter(SVG + "g") if g.get("data-name") == HOSTILE)
    assert json.loads(bar.get("data-value") or "") == 2.5 and "<script" not in bars


def test_no_points_draws_the_axes_and_says_so() -> None:
    for series in ([], [Series("a", [])], [Series("a", [(DAY, None)])]):
        svg = line_chart("empty", series, DAY, DAY + 86400)
        assert texts(svg, "empty") == ["nothing recorded in this range"]
        assert texts(svg, "ytick") == ["0", "0.25", "0.5", "0.75", "1"]
        assert not list(parse(svg).iter(SVG + "polyline"))
    assert "nothing to show" in bar_chart("no bars", [])


def test_one_point_is_a_marker_and_a_gap_breaks_the_line() -> None:
    one = line_chart("one", [Series("a", [(DAY + 3600, 7.0)])], DAY, DAY + 7200)
    assert not list(parse(one).iter(SVG + "polyline"))
    (dot,) = parse(one).iter(SVG + "circle")
    assert dot.find(SVG + "title").text == "a: 7 at 2025-12-05 01:00 UTC"  # type: ignore[union-attr]

    points = [(DAY + i * 60, None if i == 3 else float(i)) for i in range(100)]
    svg = line_chart("gap", [Series("a", points)], DAY, DAY + 6000, step_s=60)
    lines = list(parse(svg).iter(SVG + "polyline"))
    assert [len((ln.get("points") or "").split()) for ln in lines] == [3, 96]
    assert groups(svg)["a"][3] == [DAY + 180, None]          # the gap is in the data too
    # points further apart than 1.5 steps are not joined: nothing was recorded between
    assert [len(r) for r in runs([(0, 1.0), (60, 1.0), (300, 1.0)], 90)] == [2, 1]


def test_time_labels_are_utc_and_values_round() -> None:
    svg = line_chart("day", [Series("a", [(DAY - 43200, 1.0), (DAY + 43200, 1234.0)])],
                     DAY - 43200, DAY + 43200)
    assert texts(svg, "xtick") == ["12:00", "15:00", "18:00", "21:00", "12-05", "03:00",
                                   "06:00", "09:00", "12:00"]
    assert texts(svg, "ytick") == ["0", "500", "1k", "1.5k"]
    week = line_chart("week", [Series("a", [(DAY, 1.0)])], DAY - 6 * 86400, DAY + 86400)
    assert texts(week, "xtick") == ["11-29", "11-30", "12-01", "12-02", "12-03", "12-04",
                                    "12-05", "12-06"]
    assert [number(v) for v in (0, 950, 1200, 3.4e6, 0.25, 2.5e9)] == [
        "0", "950", "1.2k", "3.4M", "0.25", "2.5G"]


def test_a_model_page_charts_what_history_holds_with_missing_steps_as_zero() -> None:
    h = History(range="24h", since=DAY, until=DAY + 3 * 3600, step_s=60, models={"m": [
        ModelPoint(t=DAY + 60, requests=5, refused=1, waiting=2, first_byte_p50_s=0.2,
                   first_byte_p90_s=0.5),
        ModelPoint(t=DAY + 3600 + 120, requests=7)]})
    tokens = [{"bucket": DAY, "prompt_tokens": 100, "completion_tokens": 20},
              {"bucket": DAY + 7200, "prompt_tokens": 5, "completion_tokens": 1}]
    charts = {c.id: groups(c.svg) for c in cc.model_charts(h, "m", tokens)}
    assert charts["chart-requests"]["answered"][:3] == [[DAY, 5], [DAY + 3600, 7],
                                                        [DAY + 7200, 0]]
    assert charts["chart-tokens"]["prompt"][:3] == [[DAY, 100], [DAY + 3600, 0],
                                                    [DAY + 7200, 5]]
    waiting = charts["chart-waiting"]["waiting (most)"]
    assert len(waiting) == 3 * 60 + 1 and waiting[1] == [DAY + 60, 2] and waiting[2][1] == 0
    assert charts["chart-waiting"]["refused per minute"][1] == [DAY + 60, 1]
    p90 = charts["chart-first-byte"]["p90"]
    assert p90[1] == [DAY + 60, 0.5] and p90[0][1] is None    # none answered: no point
    rows = cc.hour_rows(h.models["m"], tokens)
    assert [(r["t"], r["requests"], r["tokens"]) for r in rows] == [
        (DAY + 7200, 0, 6), (DAY + 3600, 7, 0), (DAY, 5, 120)]


def test_usage_by_key_draws_the_busiest_keys_and_the_rest_as_other() -> None:
    totals = {"a": 10.0, "b": 500.0, "c": 30.0, "-": 30.0}
    top = cc.top_keys(totals, 2)
    assert top == ["b", "-"]
    rows = [{"bucket": DAY, "key": "b", "prompt_tokens": 400, "completion_tokens": 100},
            {"bucket": DAY + 3600, "key": "-", "prompt_tokens": 30, "completion_tokens": 0}]
    everything = [{"bucket": DAY, "prompt_tokens": 440, "completion_tokens": 100},
                  {"bucket": DAY + 3600, "prompt_tokens": 30, "completion_tokens": 0}]
    series = {s.name: s.points for s in
              cc.key_token_series(rows, everything, top, DAY, DAY + 3600)}
    assert series == {"b": [(DAY, 500), (DAY + 3600, 0)], "-": [(DAY, 0), (DAY + 3600, 30)],
                      "other": [(DAY, 40), (DAY + 3600, 0)]}


def test_gpu_hours_bars_say_the_cost_and_sum_the_rest() -> None:
    rows = [DeviceHoursRow(model=f"m{i}", device_class="h100", device_hours=float(i),
                           cost=2.0 * i) for i in range(1, 13)]
    bars = cc.gpu_hour_bars(rows, "model", count=10)
    assert bars[0] == Bar("m12 (h100)", 12.0, "cost 24.00")
    assert bars[-1] == Bar("2 others", 3.0, "cost 6.00")
    answer = DeviceHoursList(since=0, until=1, by="key", rows=[], unattributed=[
        DeviceHoursRow(model="m", device_class="cpu", device_hours=1.0)])
    assert cc.unattributed(answer)[0].key == "(unattributed: m)"
