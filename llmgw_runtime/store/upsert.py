"""Upserts for SQLite and PostgreSQL alike: both dialects' INSERT ... ON CONFLICT, so a
store module writes a row or changes the one there in one statement."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection


def insert(conn: Connection, table: sa.Table) -> Any:
    """An INSERT of ``table`` in the connection's dialect, with ``on_conflict_do_update``."""
    from sqlalchemy.dialects import postgresql, sqlite

    return (postgresql.insert(table) if conn.dialect.name == "postgresql"
            else sqlite.insert(table))


def summed(table: sa.Table, stmt: Any, column: str, cap: int | None = None) -> Any:
    """The stored ``column`` plus the one being inserted, stopping at ``cap`` if given."""
    total = table.c[column] + stmt.excluded[column]
    return total if cap is None else sa.case((total > cap, cap), else_=total)


def most(table: sa.Table, stmt: Any, column: str) -> Any:
    """The larger of the stored ``column`` and the one being inserted (portable GREATEST)."""
    return sa.case((stmt.excluded[column] > table.c[column], stmt.excluded[column]),
                   else_=table.c[column])


def add_rows(conn: Connection, table: sa.Table, keys: Sequence[str],
             rows: list[dict[str, Any]], columns: Sequence[str],
             cap: int | None = None) -> None:
    """Insert ``rows``, or add their ``columns`` to the row there with the same ``keys``,
    each sum stopping at ``cap`` if given (one statement, executed for every row)."""
    if not rows:
        return
    stmt = insert(conn, table)
    conn.execute(stmt.on_conflict_do_update(
        index_elements=list(keys),
        set_={c: summed(table, stmt, c, cap) for c in columns}), rows)
