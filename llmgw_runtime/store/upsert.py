"""Upserts for SQLite and PostgreSQL alike: both dialects' INSERT ... ON CONFLICT, so a
store module writes a row or changes the one there in one statement, and many rows in a
statement a thousand (``put_rows``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
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


def put_rows(conn: Connection, table: sa.Table, keys: Sequence[str],
             rows: Sequence[dict[str, Any]], set_: Callable[[Any], dict[str, Any]]) -> None:
    """Insert ``rows`` (dicts of the same columns, no two with the same ``keys``), or
    change the row there with the same ``keys`` as ``set_(stmt)`` says (``stmt``: the
    statement, for ``stmt.excluded``; no bound parameters of its own), a thousand rows a
    statement. An upsert handed a list of rows runs once per row (1,000 round trips a
    minute for the GPU-hours of 1,000 models: 90-470 ms of a reconciler pass at 10,000
    nodes; as many for the history's points) unless it returns something: then SQLAlchemy's
    "insertmanyvalues" sends its rows as VALUES (...), (...) ... pages. So it returns the
    first key. Two rows with the same keys in one statement are an error in PostgreSQL
    (a row changed twice): they raise ValueError here, naming the keys."""
    if len({tuple(row[k] for k in keys) for row in rows}) != len(rows):
        raise ValueError(f"rows for {table.name} repeat a key ({', '.join(keys)}): "
                         "merge them before writing")
    if not rows:
        return
    stmt = insert(conn, table)
    conn.execute(stmt.on_conflict_do_update(index_elements=list(keys), set_=set_(stmt))
                 .returning(table.c[keys[0]]), list(rows))


def add_rows(conn: Connection, table: sa.Table, keys: Sequence[str],
             rows: list[dict[str, Any]], columns: Sequence[str],
             cap: int | None = None) -> None:
    """Insert ``rows``, or add their ``columns`` to the row there with the same ``keys``,
    each sum stopping at ``cap`` if given (:func:`put_rows`)."""
    put_rows(conn, table, keys, rows,
             lambda stmt: {c: summed(table, stmt, c, cap) for c in columns})
