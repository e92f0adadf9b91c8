"""The rows the leader's fleet in memory is made of (control/incremental.py): how a row
is held (an attribute each column), and the reads the view makes each pass: rows by name,
every row's volatile columns through the driver's own cursor, report times by name."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from types import SimpleNamespace
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..store import repo
from ..store.db import waiting
from ..store.models import SPEC_COLUMNS
from ..store.schema import models as models_table
from ..store.schema import nodes as nodes_table
from ..store.schema import replicas as replicas_table

NODE_VOLATILE = ("last_report", "plan_problem")
REPLICA_VOLATILE = ("last_used", "in_flight")
MODEL_VOLATILE = tuple(c.name for c in models_table.c
                       if c.name != "name" and c.name not in SPEC_COLUMNS)


def record(row: Any) -> SimpleNamespace:
    """A row as the view holds it (an attribute each column, as a store row has)."""
    return SimpleNamespace(**row._mapping)


def node_record(row: Any) -> SimpleNamespace:
    """A node's row as the view holds it: without its credential's hash (a join after a
    credential reset writes it with no change log entry; no rule reads it)."""
    out = SimpleNamespace(**row._mapping)
    del out.credential_hash
    return out


def replica_query() -> Any:
    """``repo.list_replicas``'s read: each row with its model's current definition."""
    return (sa.select(replicas_table, models_table.c.definition_hash.label("model_hash"))
            .select_from(replicas_table.outerjoin(
                models_table, models_table.c.name == replicas_table.c.model)))


def chunks(keys: Iterable[str]) -> list[list[str]]:
    """``keys`` in key order, a list per IN (...) read (``repo.chunks``)."""
    return repo.chunks(sorted(keys))


def named(conn: Connection, table: Any, names: set[str],
           make: Callable[[Any], SimpleNamespace]) -> dict[str, SimpleNamespace]:
    """The rows of ``table`` (models, nodes: keyed by ``name``) named in ``names``."""
    found: dict[str, SimpleNamespace] = {}
    for chunk in chunks(names):
        found.update((row.name, make(row)) for row in conn.execute(
            sa.select(table).where(table.c.name.in_(chunk))))
    return found


def same_or_new(old: Any, new: Any) -> Any:
    """``old`` when it holds what ``new`` does, else ``new``: a row read again unchanged
    stays the same object, so what a pass made of it is made again only when it changed
    (control/snapshot.py ``Memo``)."""
    return old if old is not None and vars(old) == vars(new) else new


def patched(row: SimpleNamespace, values: dict[str, Any]) -> SimpleNamespace:
    return SimpleNamespace(**{**vars(row), **values})


def narrow(conn: Connection, table: Any, key: str, columns: tuple[str, ...]
            ) -> dict[Any, tuple[Any, ...]]:
    """``key`` -> (key, *columns) of every row of ``table`` (:func:`narrow_rows`)."""
    return {values[0]: values for values in narrow_rows(conn, table, key, columns)}


def narrow_rows(conn: Connection, table: Any, key: str, columns: tuple[str, ...]
                 ) -> list[tuple[Any, ...]]:
    """(key, *columns) of every row of ``table``, read through the driver's own cursor:
    plain tuples (thousands of rows each pass)."""
    return fetched(conn, str(sa.select(table.c[key], *(table.c[c] for c in columns))
                              .compile(dialect=conn.dialect)))


def fetched(conn: Connection, sql: str, params: tuple[Any, ...] = ()
             ) -> list[tuple[Any, ...]]:
    """The rows of ``sql`` as plain tuples, through the driver's own cursor."""
    cursor = conn.connection.cursor()
    try:
        with waiting(conn):               # bounded as a statement is, under a web request
            cursor.execute(sql, params)
            return list(cursor.fetchall())
    finally:
        cursor.close()


def reports_of(conn: Connection, names: set[str]) -> list[tuple[Any, ...]]:
    """(name, *NODE_VOLATILE) of the nodes ``names``. On PostgreSQL in one statement, the
    names as one array (an index lookup each), through the driver's own cursor: a few
    hundred nodes each pass."""
    if not names:
        return []
    if conn.dialect.name != "postgresql":
        columns = (nodes_table.c.name, *(nodes_table.c[c] for c in NODE_VOLATILE))
        return [tuple(row) for chunk in chunks(names) for row in conn.execute(
            sa.select(*columns).where(nodes_table.c.name.in_(chunk)))]
    return fetched(conn, _REPORTS_OF, (list(names),))


_REPORTS_OF = (f"SELECT name, {', '.join(NODE_VOLATILE)} FROM {nodes_table.name} "
               "WHERE name = ANY(%s)")
