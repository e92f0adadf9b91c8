"""Connecting to the store and migrating it.

SQLite (one file, one control instance) or PostgreSQL through psycopg2. A PostgreSQL URL is
handed to libpq as it is, so several hosts and ``target_session_attrs=read-write`` work:
``postgresql://llmgw@db1:5432,db2:5432/llmgw?target_session_attrs=read-write``.

On PostgreSQL the store survives a failover (see ``failover.py``): a dead primary is noticed
in seconds (TCP keepalives), a lost or read-only connection empties the pool, a COMMIT that
waits too long for the synchronous standby is cancelled and reported as not acknowledged,
and :meth:`Store.transaction` retries an idempotent write until a new primary answers.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, PendingRollbackError

from ..errors import ConfigError
from .changes import bump, bump_and_commit
from .failover import (
    WATCHDOG,
    NotAcknowledged,
    StoreUnavailable,
    classify,
    connect_kwargs,
    connect_timeout_s,
    first_line,
    note_cut,
    retry_left_s,
    sever,
    unavailable,
    unreplicated_notice,
    wait_s,
)
from .schema import generations

log = logging.getLogger(__name__)

T = TypeVar("T")

COMMIT_TIMEOUT_S = 10.0    # a COMMIT waiting longer for the sync standby is not acknowledged
CLOCK_REFRESH_S = 10.0      # how often Store.clock measures its offset again
RETRY_FOR_S = 30.0         # longer than a node-crash failover (Patroni ttl 20 s + promotion)

MIGRATIONS = Path(__file__).parent / "migrations"


SQLITE_FILES = ("", "-wal", "-shm", "-journal")   # the database and SQLite's own files


def _private_sqlite_file(path: Path) -> None:
    """The store (tokens' hashes, the catalog, the fleet) readable by its owner only: the
    database is created 0600 before SQLite opens it (its -wal and -shm files take its
    mode), and an existing one and its files are made 0600. Its directory, when made
    here, is 0700."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    # O_EXCL: never an extra descriptor on an existing database, whose close would drop
    # this process's SQLite locks on it (POSIX locks are per process and file).
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        pass
    except OSError:
        return                      # not ours to create: SQLite says why when it opens it
    for suffix in SQLITE_FILES:
        extra = path.with_name(path.name + suffix)
        try:
            if extra.exists() and extra.stat().st_mode & 0o077:
                extra.chmod(0o600)
        except OSError as exc:
            log.warning("%s cannot be made 0600 (%s): make it readable by its owner only",
                        extra, exc)


def _sqlite_engine(url: str) -> Engine:
    path = url.split("sqlite:///", 1)[1] if url.startswith("sqlite:///") else ""
    if path and path != ":memory:" and not path.startswith("file:"):
        _private_sqlite_file(Path(path.split("?", 1)[0]))
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
    extra = connect_kwargs(dsn)

    def connect() -> Any:
        # Under a wait bound (failover.set_wait) a new connection waits no longer than it,
        # unless the URL sets connect_timeout itself.
        bound = wait_s()
        if bound is not None and "connect_timeout" in extra:
            return psycopg2.connect(dsn, **{**extra,
                                            "connect_timeout": connect_timeout_s(bound)})
        return psycopg2.connect(dsn, **extra)

    engine = sa.create_engine(
        "postgresql+psycopg2://",
        creator=connect,
        pool_pre_ping=True,
        pool_size=12,          # gunicorn threads + the reconciler, without churn
        max_overflow=10,
    )
    # The ping of a pooled connection is bounded too: to a server that stopped answering
    # it would wait for ever (its kernel still acknowledges, so no keepalive fails).
    ping = engine.dialect.do_ping

    def bounded_ping(dbapi_conn: Any) -> bool:
        with bounded(dbapi_conn):
            return bool(ping(dbapi_conn))

    setattr(engine.dialect, "do_ping", bounded_ping)  # noqa: B010 - an instance's own
    # Each statement, COMMIT and ROLLBACK is bounded while it waits for the server
    # (``arm``, then ``disarm`` once it returned), not the transaction as a whole: the
    # client's own work between statements (a catalog of 1,000 models checked and
    # written on a busy web worker: seconds) is not the server failing to answer.
    event.listen(engine, "before_cursor_execute",
                 lambda conn, cursor, *_: arm(conn, cursor.connection))
    event.listen(engine, "after_cursor_execute", _after_execute)
    event.listen(engine, "handle_error", lambda ctx: disarm(ctx.connection))
    event.listen(engine, "commit", _arm_ending)
    event.listen(engine, "rollback", _arm_ending)
    return engine


def _after_execute(conn: Connection, cursor: Any, *_: Any) -> None:
    disarm(conn)
    # SQLAlchemy's psycopg2 dialect logs and clears the driver's notices after each
    # statement; the COMMIT sent with the bump (``bump_and_commit``) may leave one saying
    # it was not replicated, so keep them for ``Store._commit``.
    notices = cursor.connection.notices
    if notices:
        kept = conn.info.setdefault(NOTICES, [])
        kept.extend(notices)
        del kept[:-50]                  # as many as psycopg2 keeps


def _arm_ending(conn: Connection) -> None:
    """A COMMIT or ROLLBACK is about to wait for the server (not on a connection already
    lost: there is nothing to wait for)."""
    if not conn.invalidated:
        arm(conn, conn.connection.dbapi_connection)


WAITING = "llmgw.waiting"       # conn.info: the watch of the wait under way, if any


def arm(conn: Connection | None, raw: Any) -> None:
    """A wait for the server begins on ``conn``: under this thread's wait bound
    (failover.set_wait) its connection ``raw`` is severed (failover.sever) if the server
    has not answered within it. Unbounded threads arm nothing."""
    bound = wait_s()
    if conn is None or bound is None:
        return
    disarm(conn)
    conn.info[WAITING] = WATCHDOG.watch(raw, bound, action=sever)


def info_of(conn: Connection) -> dict[Any, Any]:
    """``conn.info``; an empty dict once the connection was lost inside its transaction,
    which SQLAlchemy will not reach before the rollback (``PendingRollbackError``). A
    primary killed during a COMMIT raised that from here instead of the write's
    :class:`NotAcknowledged`, and the writer died with it (tests/store/test_failover.py).
    What the lost connection's info held goes with it: a watch left in it fires on a
    closed connection, which does nothing."""
    try:
        return conn.info
    except PendingRollbackError:
        return {}


def disarm(conn: Connection | None) -> None:
    """The server answered (or the statement failed): the wait's watch is done."""
    entry = None if conn is None else info_of(conn).pop(WAITING, None)
    if entry is not None and WATCHDOG.done(entry):
        note_cut()                      # the bound severed it: the error says so


@contextmanager
def waiting(conn: Connection) -> Iterator[None]:
    """Within: one wait for the server on ``conn`` outside SQLAlchemy's execution (a
    driver cursor of its own, control/incremental.py), bounded as a statement is."""
    if conn.dialect.name != "postgresql":
        yield
        return
    arm(conn, conn.connection.dbapi_connection)
    try:
        yield
    finally:
        disarm(conn)


@contextmanager
def bounded(raw: Any) -> Iterator[None]:
    """Within: the connection ``raw`` is severed (failover.sever) when this thread's wait
    bound (failover.set_wait) passes first; unbounded threads wait as long as it takes."""
    bound = wait_s()
    entry = None if bound is None else WATCHDOG.watch(raw, bound, action=sever)
    try:
        yield
    finally:
        if entry is not None and WATCHDOG.done(entry):
            note_cut()


CHANGED = "llmgw.fleet_changed"
NOTICES = "llmgw.notices"         # the server's notices to this transaction's statements
MIGRATION_LOCK = 0x6C6D6777   # "lmgw": the advisory lock migrations take on PostgreSQL
ALL = ("all", "")                 # a change log entry: anything may have changed


def fleet_changed(conn: Connection, *, nodes: Iterable[str] = (), models: Iterable[str] = (),
                  replicas: Iterable[str] = (), telemetry: Iterable[str] = ()) -> None:
    """Note that this transaction changes what a node should run or what is stored of a
    node beyond its last report, and what: the nodes, models and replicas (a replica with
    the nodes it lives on) it writes, and ``telemetry``, nodes whose device readings only
    it writes. When it commits, the "fleet" generation moves and one change log entry per
    key is written with it (:func:`bump`); no key at all means anything may have changed
    (kind ``all``). Control processes forget what they cached of exactly those
    (control/reports.py) and the reconciler re-reads them (store/changes.py)."""
    keys: set[tuple[str, str]] = conn.info.setdefault(CHANGED, set())
    named = [(kind, str(name)) for kind, names in (
        ("node", nodes), ("model", models), ("replica", replicas), ("telemetry", telemetry))
        for name in names]
    # a key named again in one transaction is no unnamed change: only a call naming
    # nothing at all means anything may have changed
    keys.update(named or [ALL])


def generation() -> Any:
    """The "fleet" generation as a scalar subquery (NULL before revision 0007)."""
    return (sa.select(generations.c.value).where(generations.c.name == "fleet")
            .scalar_subquery())


class Store:
    """An engine plus the few things that differ between backends.

    ``begin()`` is one transaction, no retry. ``transaction(fn, idempotent=True)`` (or
    ``write(fn)``) runs ``fn(conn)`` in a transaction and, on PostgreSQL, retries it for up
    to ``retry_for_s`` when the store is unavailable or did not acknowledge the COMMIT.
    """

    def __init__(self, url: str, *, commit_timeout_s: float = COMMIT_TIMEOUT_S,
                 retry_for_s: float = RETRY_FOR_S) -> None:
        self.url = url
        self._clock_offset = (0.0, -1e9)         # (database - local seconds, when measured)
        self.moves = 0                            # fleet generation moves committed here
        self.commit_timeout_s = commit_timeout_s
        self.retry_for_s = retry_for_s
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
        """A transaction; a connection failure becomes a StoreError saying what to do
        (:class:`StoreUnavailable`; :class:`NotAcknowledged` for a COMMIT cancelled while
        waiting for the synchronous standby)."""
        try:
            with self.engine.connect() as conn:
                # under a wait bound, each wait for the server is bounded (``arm``)
                try:
                    with conn.begin() as trans:
                        conn.info.pop(CHANGED, None)
                        yield conn
                        moved = conn.info.pop(CHANGED, None)
                        if self.dialect == "postgresql":
                            self._commit(conn, trans, moved)
                        elif moved:
                            bump(conn, moved)
                finally:
                    disarm(conn)       # the COMMIT's or ROLLBACK's wait ended
            if moved:
                self.moves += 1            # this process reads its own writes at once
        except DBAPIError as exc:
            why = classify(exc)
            if why is None:
                raise
            if self.dialect == "postgresql":
                self.engine.dispose()      # every pooled connection may be to the old primary
            raise unavailable(redact_url(self.url), exc, why) from exc

    def _commit(self, conn: Connection, trans: Any, moved: Any = None) -> None:
        """COMMIT (with the bump and log of ``moved``, :func:`bump_and_commit`), cancelled
        after ``commit_timeout_s``; a cancelled wait for the synchronous standby reports
        success with a WARNING: not acknowledged."""
        raw: Any = conn.connection.dbapi_connection
        del raw.notices[:]
        conn.info.pop(NOTICES, None)
        entry = WATCHDOG.watch(raw, self.commit_timeout_s)
        try:
            if moved:
                bump_and_commit(conn, moved)
            trans.commit()
        except DBAPIError as exc:
            cancelled = WATCHDOG.done(entry)
            notice = unreplicated_notice(info_of(conn).pop(NOTICES, []) + raw.notices)
            if cancelled or notice:
                self._not_acknowledged(conn, notice or f"the COMMIT was cancelled after "
                                       f"{self.commit_timeout_s:.0f} s ({exc.orig})")
            if classify(exc):              # e.g. the primary died during the COMMIT
                self._not_acknowledged(conn, f"the connection failed during the COMMIT "
                                       f"({first_line(exc)}), so it may or may not have "
                                       "committed")
            raise
        cancelled = WATCHDOG.done(entry)
        notice = unreplicated_notice(conn.info.pop(NOTICES, []) + raw.notices)
        if notice or cancelled:
            self._not_acknowledged(conn, notice or f"the COMMIT was cancelled after "
                                                   f"{self.commit_timeout_s:.0f} s")

    def _not_acknowledged(self, conn: Connection, what: str) -> None:
        conn.invalidate()                  # a late cancel must not hit the next statement
        self.engine.dispose()
        raise NotAcknowledged(
            f"the store at {redact_url(self.url)} did not acknowledge the write: {what}. "
            "It may be committed on the primary without being on a synchronous standby, so "
            "a failover could lose it; check the standbys (`patronictl list`), then retry")

    def transaction(self, fn: Callable[[Connection], T], *, idempotent: bool,
                    retry_for_s: float | None = None) -> T:
        """``fn(conn)`` in a transaction. When ``idempotent`` (running it twice leaves what
        running it once does) and the store is PostgreSQL, a :class:`StoreUnavailable`
        (including :class:`NotAcknowledged`) is retried with backoff for up to
        ``retry_for_s`` (default: the store's), so a failover costs a pause, not an error.
        ``fn`` may run more than once: it must not act outside the transaction."""
        budget = self.retry_for_s if retry_for_s is None else retry_for_s
        if not idempotent or self.dialect != "postgresql":
            budget = 0.0
        left = retry_left_s()           # a web request's bound (failover.set_wait)
        if left is not None:
            budget = max(0.0, min(budget, left))
        started = time.monotonic()
        delay, attempts = 0.05, 0
        while True:
            attempts += 1
            try:
                with self.begin() as conn:
                    return fn(conn)
            except StoreUnavailable as exc:
                waited = time.monotonic() - started
                if waited + delay > budget:
                    if attempts == 1:
                        raise
                    raise type(exc)(f"{exc.message} (tried {attempts} times over "
                                    f"{waited:.0f} s)") from exc
                if attempts == 1:
                    log.warning("store write failed, retrying for up to %.0f s: %s",
                                budget, exc.message)
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
            else:
                if attempts > 1:
                    log.info("store write succeeded after %d attempts (%.1f s)", attempts,
                             time.monotonic() - started)

    def write(self, fn: Callable[[Connection], T]) -> T:
        """An idempotent write, retried through a failover (``transaction(fn,
        idempotent=True)``)."""
        return self.transaction(fn, idempotent=True)

    def now(self, conn: Connection) -> float:
        """The database clock, in Unix seconds (used for leases: one clock for all)."""
        if self.dialect == "sqlite":
            sql = "SELECT (julianday('now') - 2440587.5) * 86400.0"
        else:
            sql = "SELECT extract(epoch from clock_timestamp())"
        return float(conn.exec_driver_sql(sql).scalar_one())

    def clock(self, conn: Connection) -> float:
        """The database clock without a query per call: this process's wall clock plus its
        offset from the database's, measured again every CLOCK_REFRESH_S (one query per
        process per refresh instead of one per request). Web views use it; leases and the
        reconciler read ``now`` itself."""
        local = time.time()
        offset, measured_at = self._clock_offset
        if time.monotonic() - measured_at > CLOCK_REFRESH_S:
            before = time.time()
            db = self.now(conn)
            after = time.time()
            offset = db - (before + after) / 2
            self._clock_offset = (offset, time.monotonic())
            local = after
        return local + offset

    def clock_cached(self) -> float:
        """The store's clock from the offset last measured by :meth:`clock` (no query)."""
        return time.time() + self._clock_offset[0]

    def migrate(self) -> str:
        """Apply every Alembic migration; returns the revision now in place."""
        from alembic import command
        from alembic.config import Config
        from alembic.runtime.migration import MigrationContext

        cfg = Config()
        cfg.set_main_option("script_location", str(MIGRATIONS))
        with self.engine.begin() as conn:
            if self.dialect == "postgresql":
                # control hosts starting at once on one database migrate one at a time:
                # the next finds the revision in place and does nothing
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"),
                             {"key": MIGRATION_LOCK})
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
