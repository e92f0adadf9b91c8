"""Connecting to the store and migrating it.

SQLite (one file, one control instance) or PostgreSQL through psycopg2. A PostgreSQL URL is
handed to libpq as it is, so several hosts and ``target_session_attrs=read-write`` work:
``postgresql://llmgw@db1:5432,db2:5432/llmgw?target_session_attrs=read-write``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, OperationalError

from ..errors import ConfigError, StoreError

log = logging.getLogger(__name__)

MIGRATIONS = Path(__file__).parent / "migrations"


def _sqlite_engine(url: str) -> Engine:
    path = url.split("sqlite:///", 1)[1] if url.startswith("sqlite:///") else ""
    if path and path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    engine = sa.create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy issue BEGIN itself (so BEGIN IMMEDIATE below takes the write lock).
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def _postgres_engine(url: str) -> Engine:
    import psycopg2

    dsn = url.replace("postgresql+psycopg2://", "postgresql://", 1)
    return sa.create_engine(
        "postgresql+psycopg2://",
        creator=lambda: psycopg2.connect(dsn, connect_timeout=5),
        pool_pre_ping=True,
        pool_size=12,          # gunicorn threads + the reconciler, without churn
        max_overflow=10,
    )


class Store:
    """An engine plus the few things that differ between backends."""

    def __init__(self, url: str) -> None:
        self.url = url
        if url.startswith("sqlite:"):
            self.dialect = "sqlite"
            self.engine = _sqlite_engine(url)
        elif url.startswith(("postgresql:", "postgres:", "postgresql+psycopg2:")):
            self.dialect = "postgresql"
            self.engine = _postgres_engine(url)
        else:
            raise ConfigError(
                f"database_url {redact_url(url)!r} is not supported; use sqlite:///PATH or "
                "postgresql://USER@HOST[,HOST2]/DB?target_session_attrs=read-write")

    @contextmanager
    def begin(self) -> Iterator[Connection]:
        """A transaction; a connection failure becomes a StoreError saying what to do."""
        try:
            with self.engine.begin() as conn:
                yield conn
        except (OperationalError, DBAPIError) as exc:
            if isinstance(exc, DBAPIError) and not exc.connection_invalidated \
                    and not isinstance(exc, OperationalError):
                raise
            raise StoreError(
                f"the store at {redact_url(self.url)} cannot be reached: "
                f"{str(exc.orig).strip().splitlines()[0] if exc.orig else exc}; "
                "check that the database is up, then retry") from exc

    def now(self, conn: Connection) -> float:
        """The database clock, in Unix seconds (used for leases: one clock for all)."""
        if self.dialect == "sqlite":
            sql = "SELECT (julianday('now') - 2440587.5) * 86400.0"
        else:
            sql = "SELECT extract(epoch from clock_timestamp())"
        return float(conn.exec_driver_sql(sql).scalar_one())

    def migrate(self) -> str:
        """Apply every Alembic migration; returns the revision now in place."""
        from alembic import command
        from alembic.config import Config
        from alembic.runtime.migration import MigrationContext

        cfg = Config()
        cfg.set_main_option("script_location", str(MIGRATIONS))
        with self.engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")
        with self.engine.connect() as conn:
            rev = MigrationContext.configure(conn).get_current_revision()
        return rev or "base"

    def dispose(self) -> None:
        self.engine.dispose()


def redact_url(url: str) -> str:
    """The URL without its password, for messages and logs."""
    try:
        scheme, rest = url.split("://", 1)
    except ValueError:
        return url
    if "@" not in rest:
        return url
    creds, host = rest.rsplit("@", 1)
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}" if ":" in creds else url


def connect(url: str) -> Store:
    return Store(url)
