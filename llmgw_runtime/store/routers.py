"""Routers heard from: whether each serves requests without an API key (its idle posts'
``keys_optional``) and when that was last heard, on the store's clock. Plain SQL; the
control service's router API records it (control/routes_api.py) and creating a key reads
it (control/keys.py). Cheap: a router's posts (one per worker per tick) write only when
the value changed or the stored time is :data:`REFRESH_S` old."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from .schema import routers
from .upsert import insert

REFRESH_S = 10.0            # a stored time this old is written again
KEEP_S = 86400.0            # a router silent this long is forgotten (its id is per start)


def needs_write(stored: tuple[bool, float] | None, keys_optional: bool, now: float) -> bool:
    """Whether a post saying ``keys_optional`` at ``now`` changes what is stored (``stored``:
    the router's row as (keys_optional, heard), None when there is none)."""
    return (stored is None or stored[0] != keys_optional
            or now - stored[1] >= REFRESH_S)


def heard(conn: Connection, router: str, keys_optional: bool, now: float) -> bool:
    """Record that ``router`` said ``keys_optional`` at ``now``; whether it wrote."""
    row = conn.execute(sa.select(routers.c.keys_optional, routers.c.heard)
                       .where(routers.c.id == router)).first()
    stored = None if row is None else (bool(row.keys_optional), float(row.heard))
    if not needs_write(stored, keys_optional, now):
        return False
    values = {"keys_optional": int(keys_optional), "heard": now}
    stmt = insert(conn, routers).values(id=router, **values)
    # Two workers of one router may post at once: the later one's word wins.
    conn.execute(stmt.on_conflict_do_update(index_elements=["id"], set_=values))
    if row is None:                 # a new router (once per start): forget silent ones
        conn.execute(routers.delete().where(routers.c.heard < now - KEEP_S))
    return True


def keys_optional_since(conn: Connection, since: float) -> list[str]:
    """The routers heard since ``since`` that serve requests without a key."""
    return [r.id for r in conn.execute(
        sa.select(routers.c.id).where(routers.c.keys_optional == 1)
        .where(routers.c.heard >= since).order_by(routers.c.id))]
