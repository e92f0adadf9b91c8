"""What the console's charts show, from the answers the API gives (pure: the views read
the store, these pick the series, charts.py draws them). Summary: each device class's
devices, devices used and ready replicas. A model's page: requests and tokens per hour,
first-byte p50/p90, waiting and refused, replicas and slots. Usage: tokens per hour of
the busiest keys and the rest as "other", and GPU-hours by model and by key."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from markupsafe import Markup

from ..api.history import HOUR_S, RANGES, ClassPoint, History, ModelPoint, Range
from ..api.usage import DeviceHoursList, DeviceHoursRow
from .charts import Bar, Point, Series, bar_chart, line_chart, number, utc_text

DEFAULT_RANGE: Range = "24h"
TOP_KEYS = 5                 # keys drawn one by one on the Usage page; the rest are "other"
OTHER = "other"
TOP_BARS = 10                # GPU-hours bars drawn one by one; the rest are one bar


P = TypeVar("P", ModelPoint, ClassPoint)


@dataclass(frozen=True)
class Chart:
    """A chart as a page shows it: its figure's id, title, the SVG, and a caption line."""

    id: str
    title: str
    svg: Markup
    caption: str = ""


def range_of(value: str | None) -> Range:
    """The ``?range=`` asked (24h or 7d); anything else is the default."""
    return cast(Range, value) if value in RANGES else DEFAULT_RANGE


def hour_of(t: float) -> float:
    return math.floor(t / HOUR_S) * HOUR_S


def per_hour(points: Iterable[tuple[float, float]]) -> dict[float, float]:
    """Values summed per hour (the hour's start), hours with at least one point only."""
    sums: dict[float, float] = {}
    for t, value in points:
        sums[hour_of(t)] = sums.get(hour_of(t), 0) + value
    return sums


def every_hour(sums: Mapping[float, float], since: float, until: float) -> list[Point]:
    """One point per hour from ``since``'s hour to ``until``'s, 0 where ``sums`` has none
    (usage: an hour without a row used nothing)."""
    start, end = hour_of(since), hour_of(until)
    count = int((end - start) // HOUR_S) + 1
    return [(start + i * HOUR_S, sums.get(start + i * HOUR_S, 0)) for i in range(count)]


def filled(points: Sequence[P], h: History, blank: Callable[[float], P]) -> list[P]:
    """``points`` with a ``blank`` one at every step of ``h`` that has none: the store
    keeps a point only when something happened or was there (store/history.py), so a
    missing step is zeros, drawn as zeros."""
    have = {p.t: p for p in points}
    step = h.step_s
    times = set(have)
    t = math.floor(h.since / step) * step
    while t <= h.until:
        if t >= h.since:
            times.add(float(t))
        t += step
    return [have[t] if t in have else blank(t) for t in sorted(times)]


def _line(ident: str, title: str, series: Sequence[Series], since: float, until: float,
          unit: str, step_s: float | None, caption: str = "") -> Chart:
    return Chart(ident, title, line_chart(title, series, since, until, unit=unit,
                                          step_s=step_s), caption)


def class_charts(h: History) -> list[Chart]:
    """Per device class: its devices (of live nodes), those held by replicas, and the
    replicas ready on them."""
    charts = []
    for klass, stored in sorted(h.classes.items()):
        points = filled(stored, h, lambda t: ClassPoint(t=t))
        series = [Series(label, [(p.t, float(getattr(p, field))) for p in points])
                  for label, field in (("devices", "devices"), ("used", "used"),
                                       ("replicas ready", "replicas"))]
        last = stored[-1] if stored else None
        caption = (f"{last.used} of {last.devices} devices used, {last.replicas} replica"
                   f"{'' if last.replicas == 1 else 's'} ready at {utc_text(last.t)}" if last else "nothing recorded yet")
        charts.append(_line(f"chart-class-{klass}", f"{klass}: devices used",
                            series, h.since, h.until, "devices", h.step_s, caption))
    return charts


def _of(points: Sequence[ModelPoint], field: str) -> list[Point]:
    return [(p.t, None if getattr(p, field) is None else float(getattr(p, field)))
            for p in points]


def model_charts(h: History, name: str, tokens: Sequence[Mapping[str, Any]]) -> list[Chart]:
    """One model's charts over ``h``'s range; ``tokens``: its usage rows per hour
    (``bucket``, ``prompt_tokens``, ``completion_tokens``) from the usage table."""
    points = filled(h.models.get(name, []), h, lambda t: ModelPoint(t=t))
    step = h.step_s
    per = "minute" if step == 60 else "hour"
    hours_since = hour_of(h.since)
    requests = every_hour(per_hour((p.t, float(p.requests)) for p in points), h.since,
                          h.until)
    answered = sum(p.requests for p in points)
    prompt = {float(r["bucket"]): float(r["prompt_tokens"]) for r in tokens}
    completion = {float(r["bucket"]): float(r["completion_tokens"]) for r in tokens}
    used = sum(prompt.values()) + sum(completion.values())
    p90 = [p.first_byte_p90_s for p in points if p.first_byte_p90_s is not None]
    return [
        _line("chart-requests", "Requests per hour", [Series("answered", requests)],
              hours_since, h.until, "requests/h", HOUR_S,
              f"{number(answered)} answered in this range"),
        _line("chart-tokens", "Tokens per hour", [
            Series("prompt", every_hour(prompt, h.since, h.until)),
            Series("completion", every_hour(completion, h.since, h.until))],
              hours_since, h.until, "tokens/h", HOUR_S,
              f"{number(used)} tokens in this range, as the routers reported them"),
        _line("chart-first-byte", "First-byte time", [
            Series("p50", _of(points, "first_byte_p50_s")),
            Series("p90", _of(points, "first_byte_p90_s"))], h.since, h.until, "seconds",
              step, f"highest p90 {number(max(p90))} s" if p90 else
              "no answered requests in this range"),
        _line("chart-waiting", "Waiting and refused", [
            Series("waiting (most)", _of(points, "waiting")),
            Series(f"refused per {per}", _of(points, "refused"))], h.since, h.until,
              "requests", step, f"{number(sum(p.refused for p in points))} refused in this "
              "range"),
        _line("chart-replicas", "Replicas and slots", [
            Series("ready", _of(points, "ready")), Series("wanted", _of(points, "wanted")),
            Series("slots busy", _of(points, "busy")), Series("slots", _of(points, "slots"))],
              h.since, h.until, "", step),
    ]


def top_keys(totals: Mapping[str, float], count: int = TOP_KEYS) -> list[str]:
    """The ``count`` keys that used the most tokens (ties by name)."""
    return [k for k, _ in sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))[:count]]


def key_token_series(rows: Sequence[Mapping[str, Any]], everything: Sequence[Mapping[str, Any]],
                     keys: Sequence[str], since: float, until: float) -> list[Series]:
    """Tokens per hour of each of ``keys`` (``rows``: per hour and key), and of the other
    keys together (``everything``: per hour, all keys, less the named ones)."""
    def tokens(r: Mapping[str, Any]) -> float:
        return float(r["prompt_tokens"] + r["completion_tokens"])

    series = []
    named: dict[float, float] = {}
    for key in keys:
        sums = {float(r["bucket"]): tokens(r) for r in rows if r["key"] == key}
        for bucket, n in sums.items():
            named[bucket] = named.get(bucket, 0) + n
        series.append(Series(key, every_hour(sums, since, until)))
    rest = {float(r["bucket"]): tokens(r) - named.get(float(r["bucket"]), 0)
            for r in everything}
    if any(v > 0 for v in rest.values()):
        series.append(Series(OTHER, every_hour(rest, since, until)))
    return series


def key_tokens_chart(rows: Sequence[Mapping[str, Any]],
                     everything: Sequence[Mapping[str, Any]], keys: Sequence[str],
                     since: float, until: float, others: bool) -> Chart:
    """The Usage page's tokens per hour of the busiest ``keys`` (and "other")."""
    title = "Tokens per hour by key"
    return _line("chart-usage-keys", title,
                 key_token_series(rows, everything, keys, since, until), hour_of(since),
                 until, "tokens/h", HOUR_S,
                 f"the {len(keys)} keys that used the most tokens"
                 + (", the rest as other" if others else "") if keys else "")


def unattributed(answer: DeviceHoursList) -> list[DeviceHoursRow]:
    """A by-key answer's unattributed hours as rows of their own, each named for its
    model: held while no tokens were reported."""
    return [r.model_copy(update={"key": f"(unattributed: {r.model or '-'})"})
            for r in answer.unattributed]


def gpu_hour_bars(rows: Sequence[DeviceHoursRow], label: str,
                  count: int = TOP_BARS) -> list[Bar]:
    """A bar per row (``label``: "model" or "key", with its device class), the largest
    first; past ``count`` the rest as one bar. A priced row's note is its cost."""
    ordered = sorted(rows, key=lambda r: (-r.device_hours, getattr(r, label) or "",
                                          r.device_class))

    def note(cost: float | None) -> str:
        return "" if cost is None else f"cost {cost:.2f}"

    bars = [Bar(f"{getattr(r, label) or '-'} ({r.device_class})", r.device_hours,
                note(r.cost)) for r in ordered[:count]]
    rest = ordered[count:]
    if rest:
        costs = [r.cost for r in rest]
        bars.append(Bar(f"{len(rest)} others", sum(r.device_hours for r in rest),
                        note(None if None in costs else sum(c or 0 for c in costs))))
    return bars


def gpu_hours_chart(ident: str, title: str, rows: Sequence[DeviceHoursRow],
                    label: str) -> Chart:
    total = sum(r.device_hours for r in rows)
    return Chart(ident, title, bar_chart(title, gpu_hour_bars(rows, label), "h"),
                 f"{number(total)} device-hours in this period")


HOUR_ROWS = 24               # hours in a model page's table, newest first


def hour_rows(points: Sequence[ModelPoint], tokens: Sequence[Mapping[str, Any]],
              count: int = HOUR_ROWS) -> list[dict[str, Any]]:
    """A model's hours as its page's table says them (the chart's numbers without the
    chart): requests and refused summed, the most waiting, the worst step's p90 first-byte
    time, tokens; the ``count`` latest hours with anything recorded, newest first."""
    hours: dict[float, dict[str, Any]] = {}

    def row(t: float) -> dict[str, Any]:
        return hours.setdefault(hour_of(t), {
            "t": hour_of(t), "hour": time.strftime("%m-%d %H:%M", time.gmtime(hour_of(t))),
            "requests": 0, "refused": 0, "waiting": 0, "p90": None, "tokens": 0})
    for p in points:
        r = row(p.t)
        r["requests"] += p.requests
        r["refused"] += p.refused
        r["waiting"] = max(r["waiting"], p.waiting)
        if p.first_byte_p90_s is not None:
            r["p90"] = max(r["p90"] or 0.0, p.first_byte_p90_s)
    for u in tokens:
        row(float(u["bucket"]))["tokens"] += u["prompt_tokens"] + u["completion_tokens"]
    return sorted(hours.values(), key=lambda r: -r["t"])[:count]
