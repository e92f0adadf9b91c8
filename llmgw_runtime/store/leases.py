"""Leases in the store: one holder at a time per name, by the database clock (the
reconciler's leadership, control/reconcile.py)."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from .schema import leases


def try_lease(conn: Connection, name: str, holder: str, now: float, ttl: float) -> bool:
    """Take or renew the lease ``name`` for ``holder`` if it is free, expired or ours.
    ``now`` is the database clock. Call inside a transaction."""
    taken = conn.execute(
        leases.update()
        .where(leases.c.name == name)
        .where(sa.or_(leases.c.holder == holder, leases.c.expires < now))
        .values(holder=holder, expires=now + ttl)).rowcount
    if taken:
        return True
    try:
        with conn.begin_nested():
            conn.execute(leases.insert().values(name=name, holder=holder, expires=now + ttl))
        return True
    except IntegrityError:
        return False


def holds_lease(conn: Connection, name: str, holder: str, now: float,
                lock: bool = False) -> bool:
    """Whether ``holder`` holds the unexpired lease. ``lock`` keeps the row locked to the
    end of the transaction (PostgreSQL), so nobody takes it over while we write."""
    query = sa.select(leases.c.holder, leases.c.expires).where(leases.c.name == name)
    if lock:
        query = query.with_for_update()
    row = conn.execute(query).first()
    return row is not None and row.holder == holder and row.expires >= now


def release_lease(conn: Connection, name: str, holder: str) -> None:
    conn.execute(leases.delete().where(leases.c.name == name)
                 .where(leases.c.holder == holder))


def lease_holder(conn: Connection, name: str, now: float) -> str | None:
    row = conn.execute(sa.select(leases).where(leases.c.name == name)).first()
    return row.holder if row is not None and row.expires >= now else None
