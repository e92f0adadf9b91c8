"""The fleet's history in the store (``history_models``, ``history_classes``; revision
0017): one row per model or device class per minute (``step`` 60) and per hour (``step``
3600), ``t`` the period's start on the store's clock. Plain SQL; the control service
decides what to write (control/history.py: the reconciler's minute points, rollup and
pruning; control/fleet.py's ``record_idle``: the routers' counts). Every read and delete
goes by the (step, t) index: cheap.

A row is written only when something happened or was there (a missing point is all
zeros), so an idle catalog costs no rows.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..api.fields import MAX_INT
from ..api.history import HOUR_S, MINUTE_S
from ..api.router import FIRST_BYTE_BUCKETS_S
from .schema import history_classes, history_models
from .upsert import insert, most, put_rows, summed

MAX_COUNT = MAX_INT               # a stored count stops here (JSON's exact integers)
MAX_GAUGE = 1_000_000             # and a gauge here (api.fields.SmallCount)
N_BUCKETS = len(FIRST_BYTE_BUCKETS_S) + 1
GAUGES = ("ready", "wanted", "waiting", "busy", "slots")    # the most seen in a period
COUNTS = ("refused", "requests")                             # summed over a period
CLASS_GAUGES = ("devices", "used", "replicas")
MODEL_KEYS = ("model", "step", "t")                          # a row's key
CLASS_KEYS = ("device_class", "step", "t")


def period_of(when: float, step: int) -> float:
    """The start of the ``step``-second period ``when`` is in (60: its minute, 3600: its
    hour), Unix seconds."""
    return float(math.floor(when / step) * step)


def parse_counts(text: str | None) -> list[int]:
    """A stored ``first_byte`` as N_BUCKETS counts (NULL, malformed: none)."""
    try:
        value = json.loads(text) if text else None
    except ValueError:
        value = None
    if not isinstance(value, list) or len(value) != N_BUCKETS \
            or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                       for n in value):
        return [0] * N_BUCKETS
    return value


def add_counts(total: list[int], more: Sequence[int]) -> list[int]:
    """``total`` plus ``more`` bucket by bucket (``more`` may be shorter: an older router),
    each sum stopping at MAX_COUNT; ``total`` is changed and returned."""
    for i, n in enumerate(more[:N_BUCKETS]):
        total[i] = min(total[i] + n, MAX_COUNT)
    return total


def counts_text(counts: Sequence[int]) -> str | None:
    """``first_byte`` as stored: None when nothing was counted."""
    return json.dumps(list(counts), separators=(",", ":")) if any(counts) else None


def add_post(conn: Connection, model: str, minute: float, *, requests: int, refused: int,
             first_byte: Sequence[int], waiting: int, busy: int) -> None:
    """A router's post into ``model``'s minute row: requests answered and refused added,
    first-byte counts added bucket by bucket, requests waiting and slots busy (the load
    summed over routers as it stands after the post) kept if the most seen this minute.
    The upsert locks the row, so the first-byte counts of two posts at once both count."""
    stmt = insert(conn, history_models).values(
        model=model, step=MINUTE_S, t=minute, requests=min(requests, MAX_COUNT),
        refused=min(refused, MAX_COUNT), waiting=min(waiting, MAX_GAUGE),
        busy=min(busy, MAX_GAUGE))
    set_ = {**{c: summed(history_models, stmt, c, MAX_COUNT) for c in COUNTS},
            **{c: most(history_models, stmt, c) for c in ("waiting", "busy")}}
    stored = conn.execute(stmt.on_conflict_do_update(
        index_elements=list(MODEL_KEYS), set_=set_)
        .returning(history_models.c.first_byte)).scalar_one()
    if any(first_byte):
        merged = add_counts(parse_counts(stored), first_byte)
        conn.execute(history_models.update()
                     .where(history_models.c.model == model)
                     .where(history_models.c.step == MINUTE_S)
                     .where(history_models.c.t == minute)
                     .values(first_byte=counts_text(merged)))


def put_minute(conn: Connection, minute: float, models: Iterable[dict[str, Any]],
               classes: Iterable[dict[str, Any]]) -> None:
    """The reconciler's minute points (dicts of ``model`` or ``device_class`` and their
    gauges): replicas, slots and devices as seen; requests waiting and slots busy kept if
    the most seen this minute (routers' posts raise them too); the posts' counts stay."""
    model_rows = [{"model": m["model"], "step": MINUTE_S, "t": minute,
                   **{c: min(int(m.get(c, 0)), MAX_GAUGE) for c in GAUGES}}
                  for m in models]
    put_rows(conn, history_models, MODEL_KEYS, model_rows, lambda stmt: {
        **{c: stmt.excluded[c] for c in ("ready", "wanted", "slots")},
        **{c: most(history_models, stmt, c) for c in ("waiting", "busy")}})
    class_rows = [{"device_class": c["device_class"], "step": MINUTE_S, "t": minute,
                   **{g: min(int(c.get(g, 0)), MAX_GAUGE) for g in CLASS_GAUGES}}
                  for c in classes]
    put_rows(conn, history_classes, CLASS_KEYS, class_rows,
             lambda stmt: {g: stmt.excluded[g] for g in CLASS_GAUGES})


def put_hours(conn: Connection, models: Iterable[dict[str, Any]],
              classes: Iterable[dict[str, Any]]) -> None:
    """Hour rows as rolled up (dicts of every column, ``first_byte`` as counts): written,
    or written again over the same hour's rows (a rollup run twice gives the same)."""
    model_rows = [{**{k: v for k, v in m.items() if k != "first_byte"}, "step": HOUR_S,
                   "first_byte": counts_text(m.get("first_byte") or ())} for m in models]
    put_rows(conn, history_models, MODEL_KEYS, model_rows,
             lambda stmt: {c: stmt.excluded[c] for c in (*GAUGES, *COUNTS, "first_byte")})
    put_rows(conn, history_classes, CLASS_KEYS, [{**c, "step": HOUR_S} for c in classes],
             lambda stmt: {g: stmt.excluded[g] for g in CLASS_GAUGES})


def last_hour(conn: Connection) -> float | None:
    """The start of the newest hour rolled up (None: none yet)."""
    t = conn.execute(sa.select(sa.func.max(history_models.c.t))
                     .where(history_models.c.step == HOUR_S)).scalar()
    c = conn.execute(sa.select(sa.func.max(history_classes.c.t))
                     .where(history_classes.c.step == HOUR_S)).scalar()
    known = [float(v) for v in (t, c) if v is not None]
    return max(known) if known else None


def model_rows(conn: Connection, step: int, since: float, until: float,
               model: str | None = None) -> list[dict[str, Any]]:
    """Model rows of ``step`` with ``since <= t < until`` (one model's, or every model's),
    by model and t; ``first_byte`` as counts."""
    c = history_models.c
    query = (sa.select(history_models).where(c.step == step)
             .where(c.t >= since).where(c.t < until))
    if model is not None:
        query = query.where(c.model == model)
    # mappings: a Row's .t is SQLAlchemy's own (Row.t, its tuple)
    return [{"model": r["model"], "t": float(r["t"]),
             **{g: int(r[g]) for g in (*GAUGES, *COUNTS)},
             "first_byte": parse_counts(r["first_byte"])}
            for r in conn.execute(query.order_by(c.model, c.t)).mappings()]


def class_rows(conn: Connection, step: int, since: float, until: float
               ) -> list[dict[str, Any]]:
    """Device-class rows of ``step`` with ``since <= t < until``, by class and t."""
    c = history_classes.c
    query = (sa.select(history_classes).where(c.step == step)
             .where(c.t >= since).where(c.t < until).order_by(c.device_class, c.t))
    return [{"device_class": r["device_class"], "t": float(r["t"]),
             **{g: int(r[g]) for g in CLASS_GAUGES}} for r in conn.execute(query).mappings()]


def has_model(conn: Connection, model: str) -> bool:
    """Whether any point of ``model`` is stored."""
    return conn.execute(sa.select(history_models.c.t)
                        .where(history_models.c.model == model).limit(1)).first() is not None


def prune(conn: Connection, minutes_before: float, hours_before: float) -> int:
    """Forget minute rows with t before ``minutes_before`` and hour rows before
    ``hours_before`` (indexed deletes); how many rows went."""
    gone = 0
    for table in (history_models, history_classes):
        for step, before in ((MINUTE_S, minutes_before), (HOUR_S, hours_before)):
            gone += conn.execute(table.delete().where(table.c.step == step)
                                 .where(table.c.t < before)).rowcount or 0
    return gone
