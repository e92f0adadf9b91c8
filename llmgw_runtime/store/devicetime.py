"""Device-time in the store: the device-seconds each model's replicas held per hour
(``bucket``: the hour's start, store clock) and device class (``device_time``, revision
0017). The reconciler adds what it counted (control/gpu_hours.py decides what counts);
``GET /api/v1/usage/gpu-hours`` reads it back. Plain SQL, one upsert for SQLite and
PostgreSQL alike."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from .schema import device_time, usage
from .upsert import add_rows

Bucket = tuple[float, str, str]      # (hour start, model, device class)


class DeviceTime(NamedTuple):
    """The device-seconds one model's replicas held of one device class in one hour."""

    bucket: float
    model: str
    device_class: str
    seconds: float


def add(conn: Connection, seconds: Mapping[Bucket, float]) -> None:
    """Add ``seconds`` (by (hour start, model, device class)) to the rows there, inserting
    those not there yet (a statement a thousand rows, upsert.put_rows; zero and negative
    amounts are left out)."""
    rows = [{"bucket": float(bucket), "model": model, "device_class": device_class,
             "seconds": float(amount)}
            for (bucket, model, device_class), amount in sorted(seconds.items())
            if amount > 0]
    add_rows(conn, device_time, ("bucket", "model", "device_class"), rows, ("seconds",))


def read(conn: Connection, since: float, until: float) -> list[DeviceTime]:
    """The rows whose hour starts from ``since`` up to ``until`` (both included), by hour,
    model and class."""
    query = (sa.select(device_time)
             .where(device_time.c.bucket >= since).where(device_time.c.bucket <= until)
             .order_by(device_time.c.bucket, device_time.c.model,
                       device_time.c.device_class))
    return [DeviceTime(float(r.bucket), r.model, r.device_class, float(r.seconds))
            for r in conn.execute(query)]


def tokens_by_hour(conn: Connection, since: float,
                   until: float) -> dict[tuple[float, str], dict[str, int]]:
    """Each key's tokens (prompt + completion) of each model per hour, from the usage
    table (store/usage.py), for the hours from ``since`` up to ``until``: {(hour start,
    model): {key: tokens}}, what a model's device-time is shared by."""
    query = (sa.select(usage.c.bucket, usage.c.model, usage.c.key,
                       usage.c.prompt_tokens, usage.c.completion_tokens)
             .where(usage.c.bucket >= since).where(usage.c.bucket <= until))
    out: dict[tuple[float, str], dict[str, int]] = {}
    for r in conn.execute(query):
        tokens = int(r.prompt_tokens or 0) + int(r.completion_tokens or 0)
        out.setdefault((float(r.bucket), r.model), {})[r.key] = tokens
    return out


def prune(conn: Connection, before: float) -> int:
    """Forget the hours that start before ``before``; how many rows went."""
    return conn.execute(device_time.delete().where(device_time.c.bucket < before)).rowcount
