"""Reading the fleet's change log (issue 30): what changed since a generation a reader saw.

Every transaction that moves the "fleet" generation writes, with it, one entry per thing it
changed (store/db.py ``fleet_changed`` and ``bump``): a node (kind ``node``), a node's
device readings only (``telemetry``), a model, a replica (written with the nodes it lives
on), or ``all``. Generations move in commit order (the generation row's lock), so a reader
that read generation G finds every entry up to G. Control processes use it to forget only
what changed of their caches (control/reports.py), the reconciler to re-read only that.

The leader prunes entries older than a few minutes (:func:`prune`); a reader whose last
generation is older than what is left re-reads everything.
"""

from __future__ import annotations

from dataclasses import dataclass

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
