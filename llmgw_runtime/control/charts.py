"""The console's charts, drawn on the server as SVG (issue 29): no JavaScript, no CDN,
nothing the console's CSP refuses; colours and sizes are classes of console.css (``s0`` to
``s7`` per series), never inline styles. Pure: series in, an ``<svg>`` string out, every
name escaped. The SVG has a ``viewBox`` and no fixed size, so it is as wide as its box
(the console's CSS sets 100%): a laptop and a phone both draw it whole.

Each series is a ``<g class="series sN" data-name="NAME" data-values="JSON">``, JSON being
``[[t, value], ...]`` exactly as drawn (t: Unix seconds, store clock; value null: no
point, a gap), so a test or a reader of the page's source gets the numbers behind the
line. Its line is one ``<polyline>`` per run of points without a gap; a point alone (or
every point of a short series) is a ``<circle>`` with a ``<title>`` saying time and value.
Time labels are UTC (``HH:MM``, a day ``MM-DD``), the same for every reader.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from markupsafe import Markup, escape

WIDTH = 640                  # the viewBox's width; the height follows the legend's rows
PLOT_HEIGHT = 170            # the plot area's height
LEFT, RIGHT, BOTTOM = 62, 30, 30     # margins: value labels, the last time label, time labels
COLOURS = 8                  # series classes s0..s7 in console.css, then again
LEGEND_ROW = 24              # a legend row's height
CHAR_W = 11.5                # a character's width at the phone's font (20 units, console.css)
LEGEND_CHARS = 28            # a longer name is cut (the whole name in its title)
MARKERS_UP_TO = 60           # a series of this many points or fewer marks each point
Y_TICKS = 4                  # about this many steps up the value axis
X_TICKS = 9                  # at most this many time labels (24 h: every 3 h)
# Time between labels: the first that gives at most X_TICKS labels over the range.
TICK_STEPS_S = (300, 600, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400, 2 * 86400,
                7 * 86400, 14 * 86400, 28 * 86400)
DAY_S = 86400
BAR_ROW = 46                 # a bar's row: its label line, then the bar
BAR_HEIGHT = 14

Point = tuple[float, float | None]


@dataclass(frozen=True)
class Series:
    """A named line: ``(t, value)`` points in time order; value None is a gap."""

    name: str
    points: Sequence[Point]


@dataclass(frozen=True)
class Bar:
    """A named bar: its value, and what its label says besides (``note``: a cost)."""

    name: str
    value: float
    note: str = ""


def number(value: float) -> str:
    """A value as an axis or a label writes it: ``950``, ``1.2k``, ``3.4M``, ``0.25``."""
    size = abs(value)
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if size >= limit:
            return f"{value / limit:.3g}{suffix}"
    if value == int(value):
        return str(int(value))
    return f"{value:.3g}"


def utc_label(t: float, step_s: float) -> str:
    """A time label: ``HH:MM`` UTC between days, ``MM-DD`` for a day (locale-free)."""
    if step_s >= DAY_S or t % DAY_S == 0:
        return time.strftime("%m-%d", time.gmtime(t))
    return time.strftime("%H:%M", time.gmtime(t))


def utc_text(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t))


def value_ticks(top: float) -> list[float]:
    """Round steps from 0 to at least ``top`` (0 to 1 when everything is 0)."""
    if not top > 0:
        return [0.0, 0.25, 0.5, 0.75, 1.0]
    raw = top / Y_TICKS
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if raw <= m * magnitude * 1.0001)
    return [i * step for i in range(math.ceil(top / step - 1e-9) + 1)]


def time_ticks(since: float, until: float) -> tuple[list[float], float]:
    """Label times (multiples of a round step, UTC-aligned) inside ``since..until``."""
    span = max(until - since, 1.0)
    step = next((s for s in TICK_STEPS_S if span / s <= X_TICKS), TICK_STEPS_S[-1])
    first = math.ceil(since / step) * step
    ticks = []
    t = first
    while t <= until:
        ticks.append(float(t))
        t += step
    return ticks, step


def runs(points: Sequence[Point], gap_s: float | None) -> list[list[tuple[float, float]]]:
    """The points split where a value is missing or, with ``gap_s``, where two points lie
    further apart than it (a time nothing was recorded): each run is drawn as one line."""
    out: list[list[tuple[float, float]]] = []
    current: list[tuple[float, float]] = []
    last_t: float | None = None
    for t, value in points:
        broken = value is None or (gap_s is not None and last_t is not None
                                   and t - last_t > gap_s)
        if broken and current:
            out.append(current)
            current = []
        if value is not None and math.isfinite(value):
            current.append((t, value))
        last_t = t
    if current:
        out.append(current)
    return out


def _attr(value: object) -> str:
    return str(escape(str(value)))


def _f(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".")


def _legend(names: Sequence[str], top: float) -> tuple[list[str], float]:
    """Legend items laid out in rows across the width; the parts and the height taken."""
    parts, x, y = [], float(LEFT), top
    for i, name in enumerate(names):
        shown = name if len(name) <= LEGEND_CHARS else name[:LEGEND_CHARS - 1] + "…"
        width = 18 + CHAR_W * len(shown) + 18
        if x + width > WIDTH - RIGHT and x > LEFT:
            x, y = float(LEFT), y + LEGEND_ROW
        parts.append(f'<g class="key s{i % COLOURS}"><title>{escape(name)}</title>'
                     f'<rect class="swatch" x="{_f(x)}" y="{_f(y - 11)}" width="12" '
                     f'height="12"/><text x="{_f(x + 18)}" y="{_f(y)}">{escape(shown)}'
                     '</text></g>')
        x += width
    return parts, (y - top) + LEGEND_ROW if names else 0.0


def line_chart(title: str, series: Sequence[Series], since: float, until: float, *,
               unit: str = "", step_s: float | None = None) -> Markup:
    """An SVG line chart of ``series`` over ``since..until`` (x: time, labelled in UTC;
    y: from 0, labelled in ``unit``). With ``step_s`` (the points' spacing), two points
    more than 1.5 steps apart are not joined: a time with nothing recorded shows as a
    gap. No points at all draws the axes and says so."""
    until = max(until, since + 1)
    legend, legend_h = _legend([s.name for s in series], 22.0)
    plot_top = 22 + legend_h + 8
    plot_bottom = plot_top + PLOT_HEIGHT
    height = plot_bottom + BOTTOM
    plot_w = WIDTH - LEFT - RIGHT
    values = [v for s in series for _, v in s.points if v is not None and math.isfinite(v)]
    ticks = value_ticks(max(values, default=0.0))
    low, high = min(0.0, min(values, default=0.0)), ticks[-1]
    if low < 0:
        ticks = [low, *[t for t in ticks if t > low]]

    def x_of(t: float) -> float:
        return LEFT + plot_w * min(max((t - since) / (until - since), 0.0), 1.0)

    def y_of(v: float) -> float:
        return plot_bottom - PLOT_HEIGHT * (v - low) / ((high - low) or 1.0)

    out = [f'<svg class="chart" viewBox="0 0 {WIDTH} {_f(height)}" role="img" '
           f'xmlns="http://www.w3.org/2000/svg" preserveAspectRatio="xMidYMin meet" '
           f'data-since="{_f(since)}" data-until="{_f(until)}">',
           f"<title>{escape(title)}</title>", *legend]
    if unit:
        out.append(f'<text class="unit" x="{LEFT}" y="{_f(plot_top - 6)}">'
                   f"{escape(unit)}</text>")
    for v in ticks:
        y = y_of(v)
        out.append(f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{_f(y)}" '
                   f'y2="{_f(y)}"/><text class="ytick" x="{LEFT - 6}" y="{_f(y + 4)}">'
                   f"{number(v)}</text>")
    labels, label_step = time_ticks(since, until)
    for t in labels:
        x = x_of(t)
        out.append(f'<line class="tick" x1="{_f(x)}" x2="{_f(x)}" y1="{_f(plot_bottom)}" '
                   f'y2="{_f(plot_bottom + 4)}"/><text class="xtick" x="{_f(x)}" '
                   f'y="{_f(plot_bottom + 20)}">{utc_label(t, label_step)}</text>')
    out.append(f'<line class="axis" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{_f(plot_bottom)}" '
               f'y2="{_f(plot_bottom)}"/><line class="axis" x1="{LEFT}" x2="{LEFT}" '
               f'y1="{_f(plot_top)}" y2="{_f(plot_bottom)}"/>')
    gap = None if step_s is None else step_s * 1.5
    for i, s in enumerate(series):
        data = json.dumps([[t, v] for t, v in s.points], separators=(",", ":"))
        out.append(f'<g class="series s{i % COLOURS}" data-name="{_attr(s.name)}" '
                   f'data-values="{_attr(data)}">')
        parts = runs(s.points, gap)
        for run in parts:
            if len(run) > 1:
                out.append('<polyline points="' + " ".join(
                    f"{_f(x_of(t))},{_f(y_of(v))}" for t, v in run) + '"/>')
        marked = sum(len(r) for r in parts) <= MARKERS_UP_TO
        for run in parts:
            if len(run) == 1 or marked:
                out.extend(f'<circle cx="{_f(x_of(t))}" cy="{_f(y_of(v))}" r="2.5"><title>'
                           f"{escape(s.name)}: {number(v)} at {utc_text(t)}</title></circle>"
                           for t, v in run)
        out.append("</g>")
    if not values:
        out.append(f'<text class="empty" x="{_f(LEFT + plot_w / 2)}" '
                   f'y="{_f(plot_top + PLOT_HEIGHT / 2)}">nothing recorded in this range</text>')
    out.append("</svg>")
    return Markup("".join(out))


def bar_chart(title: str, bars: Sequence[Bar], unit: str = "") -> Markup:
    """An SVG bar chart: one row per bar, its name, value (and note) above a bar whose
    length is its share of the largest. Each bar is ``<g class="bar sN" data-name
    data-value>``; no bars draws a line saying so."""
    top = max((b.value for b in bars), default=0.0) or 1.0
    height = max(len(bars), 1) * BAR_ROW + 8
    plot_w = WIDTH - 2 * RIGHT
    out = [f'<svg class="chart bars" viewBox="0 0 {WIDTH} {height}" role="img" '
           'xmlns="http://www.w3.org/2000/svg" preserveAspectRatio="xMidYMin meet">',
           f"<title>{escape(title)}</title>"]
    for i, b in enumerate(bars):
        y = 8 + i * BAR_ROW
        shown = b.name if len(b.name) <= LEGEND_CHARS else b.name[:LEGEND_CHARS - 1] + "…"
        label = f"{shown}: {number(b.value)}{' ' + unit if unit else ''}"
        label += f", {b.note}" if b.note else ""
        width = max(plot_w * max(b.value, 0.0) / top, 1.0)
        out.append(f'<g class="bar s{i % COLOURS}" data-name="{_attr(b.name)}" '
                   f'data-value="{_attr(json.dumps(b.value))}"><title>{escape(b.name)}</title>'
                   f'<text x="{RIGHT}" y="{y + 16}">{escape(label)}</text>'
                   f'<rect x="{RIGHT}" y="{y + 24}" width="{_f(width)}" '
                   f'height="{BAR_HEIGHT}"/></g>')
    if not bars:
        out.append(f'<text class="empty" x="{WIDTH / 2:g}" y="30">nothing to show</text>')
    out.append("</svg>")
    return Markup("".join(out))
