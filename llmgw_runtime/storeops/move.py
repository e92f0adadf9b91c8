"""Moving the store in use (SQLite) into another store (the PostgreSQL cluster).

Every row of every table of ``schema.metadata`` is copied in foreign-key order in one
transaction on the target, while the source is held in one transaction too (on SQLite a
``BEGIN IMMEDIATE``: no writer can slip in). Each table is then compared on both sides (row
count and a digest of the rows); any difference rolls the copy back.

Whether to copy is :func:`decide`, a pure function of the two sides' snapshots and of the
snapshot written after the last copy (the marker file): a re-run never overwrites rows that
somebody else wrote."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from ..errors import LlmgwError, StoreError
from ..store.changes import bump
from ..store.db import Store, redact_url
from ..store.schema import metadata

log = logging.getLogger(__name__)

BATCH = 1000
# Every table but the fleet generation (a counter that tells processes their caches are
# stale, not data): the target keeps its own, moved by the copy.
TABLES = [t for t in metadata.sorted_tables if t.name != "generations"]


class MoveError(LlmgwError):
    reason = "store_move_failed"


@dataclass(frozen=True)
class TableState:
    rows: int
    digest: str


Snapshot = dict[str, TableState]


@dataclass(frozen=True)
class Decision:
    action: str            # copy | replace | already | refuse
    reason: str


@dataclass
class MoveResult:
    decision: Decision
    counts: dict[str, int]


# ---------------------------------------------------------------- pure


def _normal(column: sa.Column[Any], value: Any) -> Any:
    if value is None:
        return None
    if isinstance(column.type, sa.Float):
        return float(value)
    if isinstance(column.type, sa.Integer):
        return int(value)
    return str(value)


def table_state(table: sa.Table, rows: list[Any]) -> TableState:
    """The row count and a digest of the rows' values, the same on SQLite and PostgreSQL."""
    cols = list(table.columns)
    lines = sorted(json.dumps([_normal(c, row[c.name]) for c in cols]) for row in rows)
    digest = hashlib.sha256("\n".join(lines).encode()).hexdigest()
    return TableState(len(lines), digest)


def decide(source: Snapshot, target: Snapshot, copies: list[Snapshot]) -> Decision:
    """Copy into an empty target; skip when it already holds the same rows; replace what an
    earlier init copied and nobody changed since (``copies``: the marker); refuse anything
    else."""
    if all(s.rows == 0 for s in target.values()):
        return Decision("copy", "the cluster database is empty")
    if target == source:
        return Decision("already", "the cluster database already holds the same rows "
                                   "(copied by an earlier init)")
    if target in copies:
        return Decision("replace", "the cluster database holds an earlier init's copy that "
                                   "nobody has changed since; it is replaced by a fresh copy")
    differ = [f"{name}: {source[name].rows} row(s) here, {state.rows} in the cluster"
              + (" (same count, other values)" if source[name].rows == state.rows else "")
              for name, state in target.items() if state != source.get(name)]
    return Decision("refuse", "the cluster database already holds other rows than the store "
                    "in use:\n  " + "\n  ".join(differ))


def count_differences(source: Snapshot, target: Snapshot) -> list[str]:
    return [f"{name}: {state.rows} row(s) in the store in use, "
            f"{target[name].rows if name in target else 'none'} in the cluster"
            for name, state in source.items() if target.get(name) != state]


def backup_name(db: Path, now: datetime) -> Path:
    return db.with_name(f"{db.name}.before-patroni-{now.strftime('%Y%m%dT%H%M%SZ')}")


# ---------------------------------------------------------------- I/O


def snapshot(conn: Connection) -> Snapshot:
    return {t.name: table_state(t, list(conn.execute(sa.select(t)).mappings()))
            for t in TABLES}


def _fix_sequences(conn: Connection) -> None:
    """After rows came with their ids, each serial's next value follows the largest id."""
    for table in metadata.sorted_tables:
        pk = list(table.primary_key.columns)
        if len(pk) != 1 or not isinstance(pk[0].type, sa.Integer):
            continue
        col = pk[0].name
        conn.execute(sa.text(
            f"SELECT setval(pg_get_serial_sequence(:t, :c), "
            f"COALESCE((SELECT MAX({col}) FROM {table.name}), 1), "
            f"(SELECT MAX({col}) FROM {table.name}) IS NOT NULL)"),
            {"t": table.name, "c": col})


def _copy(src: Connection, dst: Connection, replace: bool, dialect: str) -> None:
    if replace:
        for table in reversed(TABLES):
            dst.execute(table.delete())
    for table in TABLES:
        result = src.execute(sa.select(table)).mappings()
        while True:
            batch = [dict(r) for r in result.fetchmany(BATCH)]
            if not batch:
                break
            dst.execute(table.insert(), batch)
    bump(dst)
    if dialect == "postgresql":
        _fix_sequences(dst)


def backup_sqlite(db: Path, now: datetime) -> Path:
    """A consistent copy of the SQLite store next to it (SQLite's backup API), 0600,
    checked to open; returns its path."""
    dest = backup_name(db, now)
    n = 1
    while dest.exists():
        dest = dest.with_name(f"{backup_name(db, now).name}.{n}")
        n += 1
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.close(fd)
    src = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        out = sqlite3.connect(dest)
        try:
            src.backup(out)
            ok = out.execute("PRAGMA integrity_check").fetchone()
        finally:
            out.close()
    finally:
        src.close()
    if not ok or ok[0] != "ok":
        raise MoveError(f"the backup {dest} of the store does not check out ({ok}); "
                        "nothing was moved: free some disk space and re-run")
    return dest


def read_marker(path: Path, target_url: str) -> list[Snapshot]:
    """The snapshots of the copies made into this target (row counts and digests)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    if data.get("target") != redact_url(target_url):
        return []
    return [{name: TableState(int(t["rows"]), str(t["digest"])) for name, t in c.items()}
            for c in data.get("copies", [])]


def write_marker(path: Path, target_url: str, copies: list[Snapshot]) -> None:
    """Written before each copy commits (a COMMIT can succeed and still report an error),
    so a re-run knows the copy as its own whichever way the commit went."""
    data = {"target": redact_url(target_url),
            "copies": [{n: {"rows": s.rows, "digest": s.digest} for n, s in c.items()}
                       for c in copies[-5:]]}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def _unreachable(store: Store, what: str, exc: Exception) -> MoveError:
    first = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return MoveError(f"{what} at {redact_url(store.url)} cannot be used: "
                     f"{first[0] if first else exc}")


def move(source: Store, target: Store, marker: Path,
         echo: Callable[[str], None] = lambda _: None) -> MoveResult:
    """Migrate the target, then copy (or skip, or refuse): see :func:`decide`. The target is
    compared with the source table by table before the transaction commits and again after;
    a difference raises MoveError and leaves the target as it was."""
    try:
        revision = target.migrate()
    except (DBAPIError, StoreError) as exc:
        raise _unreachable(target, "the cluster database", exc) from exc
    echo(f"cluster database schema at revision {revision}")
    try:
        source.migrate()
    except (DBAPIError, StoreError) as exc:
        raise _unreachable(source, "the store in use", exc) from exc
    try:
        with source.begin() as src, target.begin() as dst:
            before = snapshot(src)
            copies = read_marker(marker, target.url)
            decision = decide(before, snapshot(dst), copies)
            if decision.action == "refuse":
                raise MoveError(decision.reason)
            if decision.action in ("copy", "replace"):
                _copy(src, dst, decision.action == "replace", target.dialect)
                differ = count_differences(before, snapshot(dst))
                if differ:
                    raise MoveError("the copy does not match the store in use, so it was "
                                    "rolled back:\n  " + "\n  ".join(differ))
                if before not in copies:
                    write_marker(marker, target.url, [*copies, before])
    except (DBAPIError, StoreError) as exc:
        raise _unreachable(target, "the cluster database", exc) from exc
    # Again, after the commit, through a fresh connection (the multi-host URL's primary).
    try:
        with target.begin() as dst:
            after = snapshot(dst)
    except StoreError as exc:
        raise _unreachable(target, "the cluster database", exc) from exc
    differ = count_differences(before, after)
    if differ:
        raise MoveError("after the copy the cluster does not hold what the store in use "
                        "holds:\n  " + "\n  ".join(differ))
    return MoveResult(decision, {name: s.rows for name, s in after.items()})
