"""The fleet's history for the console's charts (``GET /api/v1/history``, issue 29),
kept by the control service itself, so no Prometheus is needed.

Once a minute the leading reconciler writes what status shows of each model (replicas
ready and wanted, requests waiting, slots busy of the ready replicas' slots) and of each
device class (devices of live nodes, devices held by replicas, ready replicas), from the
same fleet view and functions as the summary (control/fleet.py, status/summary.py). The
routers' posts add their requests answered and refused and their first-byte counts to
the model's minute (fleet.record_idle). Each hour, once it has ended, is rolled up into
an hour row; minute rows are kept MINUTES_KEPT_S (two days), hour rows ``history_days``.

The decisions are pure functions below (aggregating, quantiles from bucket counts, what
to roll up and prune); store/history.py holds the SQL; :class:`Recorder` is the
reconciler's hook (one store transaction a minute, nothing in between).
"""

from __future__ import annotations

import json
import logging
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy.engine import Connection

from ..api.fields import MAX_INT, MAX_LIST
from ..api.history import (
    HOUR_S,
    MAX_POINTS,
    MINUTE_S,
    MINUTES_KEPT_S,
    RANGES,
    ClassPoint,
    History,
    ModelPoint,
    Range,
)
from ..api.router import FIRST_BYTE_BUCKETS_S
from ..errors import StoreError
from ..status import summary as status_summary
from ..store import Store, repo
from ..store import history as stored
from . import autoscale, capacity, drain, summary_view
from .states import model_state

log = logging.getLogger(__name__)

# An hour is rolled up this long after it ends: a router's post received just before the
# hour ended has committed its minute by then.
ROLL_AFTER_S = MINUTE_S
DAY_S = 86_400
QUANTILES = (0.5, 0.9)


# ---------------------------------------------------------------- pure decisions


def quantile(counts: Sequence[int], q: float,
             bounds: Sequence[float] = FIRST_BYTE_BUCKETS_S) -> float | None:
    """The ``q`` quantile (0-1) of times counted per bucket (``counts``: len(bounds) + 1,
    each of the times up to its bound, the last of those above them), interpolated
    linearly inside its bucket as Prometheus' histogram_quantile does; one in the last
    bucket is the highest bound. None when nothing was counted."""
    total = sum(counts)
    if total <= 0:
        return None
    rank = q * total
    below = 0
    for i, n in enumerate(counts):
        if n and below + n >= rank:
            if i >= len(bounds):
                return float(bounds[-1])
            lower = bounds[i - 1] if i else 0.0
            return lower + (bounds[i] - lower) * max(0.0, rank - below) / n
        below += n
    return float(bounds[-1])


def aggregate_models(rows: Iterable[dict[str, Any]], step: int) -> list[dict[str, Any]]:
    """Model rows (of any step) per model and ``step`` period: gauges the most seen,
    requests and refusals summed, first-byte counts summed bucket by bucket; by model and
    t."""
    out: dict[tuple[str, float], dict[str, Any]] = {}
    for row in rows:
        key = (row["model"], stored.period_of(row["t"], step))
        got = out.get(key)
        if got is None:
            out[key] = {**row, "t": key[1],
                        "first_byte": list(row.get("first_byte") or [0] * stored.N_BUCKETS)}
            continue
        for g in stored.GAUGES:
            got[g] = max(got[g], row[g])
        for c in stored.COUNTS:
            got[c] = min(got[c] + row[c], MAX_INT)
        stored.add_counts(got["first_byte"], row.get("first_byte") or ())
    return [out[k] for k in sorted(out)]


def aggregate_classes(rows: Iterable[dict[str, Any]], step: int) -> list[dict[str, Any]]:
    """Device-class rows per class and ``step`` period, each gauge the most seen."""
    out: dict[tuple[str, float], dict[str, Any]] = {}
    for row in rows:
        key = (row["device_class"], stored.period_of(row["t"], step))
        got = out.setdefault(key, {**row, "t": key[1]})
        for g in stored.CLASS_GAUGES:
            got[g] = max(got[g], row[g])
    return [out[k] for k in sorted(out)]


def kept_s(history_days: float) -> float:
    """How far back hour rows are kept (seconds); 0: none."""
    return max(0.0, history_days) * DAY_S


def roll_span(last_hour: float | None, now: float, history_days: float
              ) -> tuple[float, float] | None:
    """The hours [first, end) to roll up now: those after the last one rolled
    (``last_hour``; None: none yet) that ended ROLL_AFTER_S ago, none that began before
    the minutes kept (some of its minutes are gone) or the hours kept; None when there
    are none."""
    oldest = math.ceil((now - min(MINUTES_KEPT_S, kept_s(history_days))) / HOUR_S) * HOUR_S
    first = oldest if last_hour is None else max(oldest, last_hour + HOUR_S)
    end = stored.period_of(now - ROLL_AFTER_S, HOUR_S)
    return (first, end) if end > first else None


def prune_before(now: float, history_days: float) -> tuple[float, float]:
    """(minute rows before, hour rows before): what to forget now. ``history_days`` 0
    keeps nothing, minutes included."""
    if history_days <= 0:
        return now + HOUR_S, now + HOUR_S
    return now - MINUTES_KEPT_S, now - kept_s(history_days)


def _small(n: int) -> int:
    return max(0, min(int(n), stored.MAX_GAUGE))


def model_point(row: dict[str, Any]) -> ModelPoint:
    """A stored or aggregated model row as the answer's point."""
    counts = row.get("first_byte") or ()
    p50, p90 = (quantile(counts, q) for q in QUANTILES)
    return ModelPoint(t=row["t"], **{g: _small(row[g]) for g in stored.GAUGES},
                      refused=min(row["refused"], MAX_INT),
                      requests=min(row["requests"], MAX_INT),
                      first_byte_p50_s=None if p50 is None else round(p50, 4),
                      first_byte_p90_s=None if p90 is None else round(p90, 4))


def class_point(row: dict[str, Any]) -> ClassPoint:
    return ClassPoint(t=row["t"], **{g: _small(row[g]) for g in stored.CLASS_GAUGES})


def series(rows: Iterable[dict[str, Any]], key: str) -> dict[str, list[dict[str, Any]]]:
    """Rows by ``key`` (model or device_class), each list its newest MAX_POINTS by t; at
    most MAX_LIST lists (an answer's bound: with more, those heard of last; deleted
    models' history stays), by name."""
    out: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        out.setdefault(row[key], []).append(row)
    lists = {name: sorted(got, key=lambda r: r["t"])[-MAX_POINTS:]
             for name, got in out.items()}
    kept = sorted(lists, key=lambda n: (-lists[n][-1]["t"], n))[:MAX_LIST]
    return {name: lists[name] for name in sorted(kept)}


# ---------------------------------------------------------------- what status shows


def _json(text: str | None) -> Any:
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def model_samples(model_rows: Iterable[Any], replica_rows: Iterable[Any], now: float
                  ) -> list[dict[str, Any]]:
    """Each model (rows as the store or the kept fleet holds them, not deleted) now as
    status shows it: ready and wanted (states.model_state, as fleet.models_view), requests
    waiting and slots busy summed over routers and the ready replicas' slots (what
    autoscale.view shows: capacity.load_of, autoscale.ready_slots). Models with all of
    them 0 are left out (no row)."""
    reps: dict[str, list[Any]] = {}
    for rep in replica_rows:
        reps.setdefault(rep.model, []).append(rep)
    out = []
    for row in model_rows:
        mine = reps.get(row.name, [])
        state = model_state(row, mine, now)
        load = capacity.load_of(_json(row.load), now)
        serving = [r for r in mine if not drain.is_draining(r)]
        sample = {"model": row.name, "ready": state.ready, "wanted": state.wanted,
                  "waiting": load.waiting, "busy": load.busy,
                  "slots": autoscale.ready_slots(row, serving) or 0}
        sample.update({g: _small(sample[g]) for g in stored.GAUGES})
        if any(sample[g] for g in stored.GAUGES):
            out.append(sample)
    return out


def class_counts(nodes: list[dict[str, Any]], replicas: list[dict[str, Any]], now: float,
                 node_timeout_s: float, models: list[dict[str, Any]],
                 facts: Mapping[str, status_summary.Facts] | None = None
                 ) -> list[dict[str, Any]]:
    """Each device class as status shows it (status.summary.devices_by_class): devices
    of live nodes (all but the unreachable), devices held by replicas; and the ready
    replicas (not draining) on a device of the class. Pure: the status summary's
    inputs (``facts``: the nodes' kept facts, as the summary has them)."""
    by_class = status_summary.devices_by_class(
        nodes, replicas, now, node_timeout_s, status_summary.used_devices(replicas), models,
        facts)
    by_name = {n["name"]: n for n in nodes}
    classes: dict[str, dict[Any, str]] = {}     # of the nodes ready replicas are on

    def class_of(node: str, device: Any) -> str | None:
        if node not in classes:
            found = by_name.get(node)
            classes[node] = {d["id"]: d["class"] for d in found.get("devices", [])} \
                if found is not None else {}
        return classes[node].get(device)

    ready: Counter[str] = Counter()
    for r in replicas:
        if not (r.get("desired", True) and r["state"] == "ready" and not r.get("draining")):
            continue
        spots = [(r["node"], d) for d in r["devices"]] + [
            (p["node"], d) for p in r.get("parts") or [] for d in p["devices"]]
        for klass in {class_of(*s) for s in spots}:
            if klass is not None:
                ready[klass] += 1
    return [{"device_class": klass, "devices": _small(c["total"] - c["unreachable"]),
             "used": _small(c["used"]), "replicas": _small(ready[klass])}
            for klass, c in by_class.items()]


def class_samples(held: summary_view.HeldRows, now: float, node_timeout_s: float
                  ) -> list[dict[str, Any]]:
    """:func:`class_counts` of the fleet as the status summary reads it
    (control/summary_view.py ``HELD.fleet``): the process's kept fleet, so a minute's
    sample of 10,000 nodes reads again only what the change log names and the report
    times, and makes views and facts only of the nodes that changed (it read every node's
    devices and compared every row's values: 0.6 s of the reconciler's CPU each minute at
    10,000 nodes, 0.2-0.3 s then)."""
    model_rows, node_rows, replica_rows, parts, reports = held
    decoded = summary_view.DECODED
    nodes, facts = decoded.nodes(node_rows, reports)
    replicas = [decoded.replica(r, parts.get(r.id), now) for r in replica_rows]
    models = [decoded.model(m) for m in model_rows]
    return class_counts(nodes, replicas, now, node_timeout_s, models, facts)


# ---------------------------------------------------------------- the reconciler's minute


def record_minute(conn: Connection, now: float, history_days: float,
                  node_timeout_s: float) -> None:
    """The minute's points, the hours due rolled up, rows past their time forgotten.
    With ``history_days`` 0 nothing is written and everything is forgotten."""
    if history_days > 0:
        # one read of the kept fleet for both samples: at 10,000 nodes the models' own
        # reads (fleet.models_view, every model and replica twice) and a map of every
        # device's class were 0.25 s and 0.1 s of the reconciler's minute
        held = summary_view.HELD.fleet(conn)
        stored.put_minute(conn, stored.period_of(now, MINUTE_S),
                          model_samples(held[0], held[2], now),
                          class_samples(held, now, node_timeout_s))
        span = roll_span(stored.last_hour(conn), now, history_days)
        if span is not None:
            first, end = span
            stored.put_hours(conn,
                             aggregate_models(stored.model_rows(conn, MINUTE_S, first, end),
                                              HOUR_S),
                             aggregate_classes(stored.class_rows(conn, MINUTE_S, first, end),
                                               HOUR_S))
    stored.prune(conn, *prune_before(now, history_days))


class Recorder:
    """The reconciler's hook: :meth:`tick` after each pass it led; a store transaction
    only at the first pass of each minute (:func:`record_minute`). A failure is logged
    (again only when its reason changes) and the minute skipped: the history never stops
    the reconciler."""

    def __init__(self, history_days: float, node_timeout_s: float) -> None:
        self.history_days = history_days
        self.node_timeout_s = node_timeout_s
        self._minute: float | None = None
        self._failed: str | None = None

    def due(self, now: float) -> bool:
        return stored.period_of(now, MINUTE_S) != self._minute

    def tick(self, store: Store, now: float) -> None:
        if not self.due(now):
            return
        self._minute = stored.period_of(now, MINUTE_S)
        try:
            with store.begin() as conn:
                record_minute(conn, store.now(conn), self.history_days, self.node_timeout_s)
            self._failed = None
        except Exception as exc:  # never the reconciler's problem; next minute again
            if str(exc) != self._failed:
                log.warning("the fleet's history of this minute was not recorded (the "
                            "charts miss it; tried again each minute): %s", exc,
                            exc_info=not isinstance(exc, StoreError))
            self._failed = str(exc)


# ---------------------------------------------------------------- the answer


def history(conn: Connection, now: float, range: str = "24h",
            model: str | None = None, *, with_models: bool = True) -> History:
    """The fleet's history over ``range`` (api.history.RANGES): ``24h``, the minute
    points of the last day; ``7d``, the hour points of the last week (hours rolled up,
    and the minutes of those not rolled up yet summed into hours). Per model (only
    ``model``'s when named) and, without ``model``, per device class; each series sorted
    by t, at most MAX_POINTS, only the periods with a stored point (a missing period:
    all zeros). ``since``: the first period's start; ``until``: ``now``.
    ``with_models=False``: the device classes only, without reading a model's row (a
    page that draws the classes: a day of every model's minutes is the large part)."""
    span, step = RANGES[range]
    end = stored.period_of(now, step) + step
    since = end - step - span
    models: list[dict[str, Any]] = []
    if step == MINUTE_S:
        if with_models:
            models = stored.model_rows(conn, MINUTE_S, since, end, model)
        classes = stored.class_rows(conn, MINUTE_S, since, end) if model is None else []
    else:
        last = stored.last_hour(conn)
        split = max(since, min(end, last + HOUR_S)) if last is not None else since
        if with_models:
            models = stored.model_rows(conn, HOUR_S, since, split, model) + aggregate_models(
                stored.model_rows(conn, MINUTE_S, split, end, model), HOUR_S)
        classes = [] if model is not None else (
            stored.class_rows(conn, HOUR_S, since, split) + aggregate_classes(
                stored.class_rows(conn, MINUTE_S, split, end), HOUR_S))
    return History(range=_range(range), since=since, until=now, step_s=step,
                   models={name: [model_point(r) for r in rows]
                           for name, rows in series(models, "model").items()},
                   classes={name: [class_point(r) for r in rows]
                            for name, rows in series(classes, "device_class").items()})


def _range(value: str) -> Range:
    if value == "24h":
        return "24h"
    if value == "7d":
        return "7d"
    raise ValueError(f"range {value!r} is not one of {', '.join(RANGES)}")


def known(conn: Connection, model: str) -> bool:
    """Whether ``model`` is in the catalog or has points stored (a deleted model's
    history is still there)."""
    return repo.get_model(conn, model, deleted=True) is not None \
        or stored.has_model(conn, model)

