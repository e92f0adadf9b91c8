"""The fleet's change log (issue 30): written with each move of the "fleet" generation
(:func:`bump`, :func:`bump_and_commit`), read as what changed since a generation a reader saw.

Every transaction that moves the "fleet" generation writes, with it, one entry per thing it
changed (store/db.py ``fleet_changed``, then ``bump``): a node (kind ``node``), a node's
device readings only (``telemetry``), a model, a replica (written with the nodes it lives
on), or ``all``. Generations move in commit order (the generation row's lock), so a reader
that read generation G finds every entry up to G. Control processes use it to forget only
what changed of their caches (control/reports.py), the reconciler to re-read only that.

The leader prunes entries older than a few minutes (:func:`prune`); a reader whose last
generation is older than what is left re-reads everything.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from .schema import changes, generations

FLOOR = "changes_floor"       # the generations row: entries up to it may be gone


@dataclass(frozen=True)
class Changed:
    """What changed after the generation a reader last saw, up to ``generation``."""

    generation: int              # read up to and including this generation
    everything: bool             # a kind 'all' entry, or the log no longer reaches back
    nodes: frozenset[str]        # node rows changed (kind 'node' or 'telemetry')
    telemetry_only: frozenset[str]  # of those, nodes whose only change is device readings
    models: frozenset[str]
    replicas: frozenset[str]     # replica ids added, changed or deleted (with their parts)

    @property
    def nothing(self) -> bool:
        """Whether nothing changed at all."""
        return not (self.everything or self.nodes or self.models or self.replicas)


_NONE: frozenset[str] = frozenset()


def _value(conn: Connection, name: str) -> int | None:
    value = conn.execute(sa.select(generations.c.value)
                         .where(generations.c.name == name)).scalar()
    return int(value) if value is not None else None


def since(conn: Connection, last: int | None) -> Changed:
    """What changed after generation ``last`` (None: never read, so everything), up to the
    fleet generation as this reads it."""
    current = _value(conn, "fleet") or 0
    if last is None or last > current:        # a reader of another store (moved, restored)
        return Changed(current, True, _NONE, _NONE, _NONE, _NONE)
    if last == current:
        return Changed(current, False, _NONE, _NONE, _NONE, _NONE)
    if last < (_value(conn, FLOOR) or 0):
        return Changed(current, True, _NONE, _NONE, _NONE, _NONE)
    rows = conn.execute(sa.select(changes.c.kind, changes.c.key)
                        .where(changes.c.seq > last, changes.c.seq <= current))
    found: dict[str, set[str]] = {}
    for kind, key in rows:
        found.setdefault(kind, set()).add(key)
    nodes = found.get("node", set())
    telemetry = found.get("telemetry", set()) - nodes
    # Pruned meanwhile (by another process, after the floor was read): entries may be gone.
    everything = "all" in found or last < (_value(conn, FLOOR) or 0)
    return Changed(current, everything, frozenset(nodes | telemetry), frozenset(telemetry),
                   frozenset(found.get("model", ())), frozenset(found.get("replica", ())))


def prune(conn: Connection, now: float, keep_s: float = 600.0) -> int:
    """Delete the entries older than ``keep_s`` (``now``: the store's clock) and raise the
    floor to the newest generation deleted, so a reader whose last generation is older
    is told to re-read everything. Returns how many entries went."""
    newest = conn.execute(sa.select(sa.func.max(changes.c.seq))
                          .where(changes.c.at < now - keep_s)).scalar()
    if newest is None:
        return 0
    gone = conn.execute(changes.delete().where(changes.c.seq <= newest)).rowcount
    raise_floor(conn, int(newest))
    return int(gone or 0)


def raise_floor(conn: Connection, value: int) -> None:
    """Entries up to generation ``value`` may be gone: a reader whose last generation is
    below it re-reads everything."""
    floor = generations.c
    done = conn.execute(generations.update().where(floor.name == FLOOR, floor.value < value)
                        .values(value=value))
    if done.rowcount == 0 and _value(conn, FLOOR) is None:
        conn.execute(generations.insert().values(name=FLOOR, value=value))


def _entries(changed: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """The change log's rows of ``changed``: each (kind, key) once, in order, keys cut to
    the column's 255 characters."""
    return [(kind, key[:255]) for kind, key in sorted(set(changed))]


def _clock(conn: Connection) -> Any:
    """The store's clock (Unix seconds) as an SQL expression."""
    if conn.dialect.name == "sqlite":
        return sa.literal_column("(julianday('now') - 2440587.5) * 86400.0")
    return sa.literal_column("extract(epoch from clock_timestamp())")


def bump(conn: Connection, changed: Iterable[tuple[str, str]] | None = None) -> int:
    """Move the "fleet" generation and write the change log entries of ``changed``
    ((kind, key) pairs) under the new generation, which is returned. None (a store moved
    or restored as a whole): no entry, the log's floor is raised to the new generation
    instead, so every reader re-reads everything.

    The last writes of the transaction (on PostgreSQL, :func:`bump_and_commit` sends them
    with the COMMIT): the generation's row lock (the UPDATE) is held only while committing, so there is no lock-order cycle with any other row, and it
    serialises committing writers, so the generations entries carry are in commit order: a
    reader that sees generation G committed finds every entry up to G."""
    row = generations.c
    move = generations.update().where(row.name == "fleet").values(value=row.value + 1)
    if conn.dialect.update_returning:
        value = conn.execute(move.returning(row.value)).scalar()
    else:                                   # SQLite before 3.35: the write lock is held
        conn.execute(move)
        value = conn.execute(sa.select(row.value).where(row.name == "fleet")).scalar()
    if value is None:
        conn.execute(generations.insert().values(name="fleet", value=1))
        value = 1
    if changed is None:
        raise_floor(conn, int(value))
        return int(value)
    conn.execute(changes.insert().values(at=_clock(conn)),
                 [{"seq": value, "kind": kind, "key": key} for kind, key in _entries(changed)])
    return int(value)


# On PostgreSQL the bump, the log and the COMMIT go in one message (the simple query
# protocol runs it statement by statement, and stops at the first error): the server takes
# the generation's row lock and releases it at the COMMIT without waiting for this client
# in between. Sent as separate statements, each wait for an answer held the lock while a
# busy gevent worker served its other requests, and every other writer queued behind it (a
# convoy of 10-50 backends on this lock at 10,000 agents, docs/performance.md). The upsert
# also makes the row if a store lacks it.
_BUMP_AND_COMMIT = (
    "WITH g AS (INSERT INTO generations (name, value) VALUES ('fleet', 1) "
    "ON CONFLICT (name) DO UPDATE SET value = generations.value + 1 RETURNING value) "
    "INSERT INTO changes (seq, kind, key, at) "
    "SELECT g.value, v.kind, v.key, {clock} "
    "FROM g, (VALUES {rows}) AS v (kind, key); COMMIT; BEGIN")


def bump_and_commit(conn: Connection, changed: Iterable[tuple[str, str]]) -> None:
    """:func:`bump` with entries, then COMMIT, in one message to PostgreSQL (above). The
    driver still thinks the transaction open and sends its own COMMIT after this one: the
    message ends with a BEGIN for it to end (an empty transaction). Without it that COMMIT
    found none, and the server logged "WARNING: there is no transaction in progress" for
    every write that moved the fleet, about 45 a second at 10,000 agents."""
    rows = _entries(changed)
    sql = _BUMP_AND_COMMIT.format(rows=", ".join(["(%s, %s)"] * len(rows)),
                                  clock=str(_clock(conn)))
    conn.exec_driver_sql(sql, tuple(part for row in rows for part in row))
