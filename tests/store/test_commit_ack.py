"""A write is acknowledged only when it is on the synchronous standby, and only idempotent
writes are retried. On a dedicated PostgreSQL server (not the shared one): its
synchronous_standby_names names a standby that never connects, so every COMMIT waits."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator

import psycopg2
import pytest
import sqlalchemy as sa

from llmgw_runtime.store import NotAcknowledged, Store, StoreUnavailable, repo
from llmgw_runtime.store.db import fleet_changed
from tests.support.postgres import PostgresServer

pytestmark = pytest.mark.slow


class WaitingPrimary:
    """A PostgreSQL whose database ``waits`` commits synchronously to a missing standby."""

    def __init__(self) -> None:
        self.server = PostgresServer().start()
        self.url = self.server.create_database("waits")
        Store(self.url).migrate()                 # before commits start waiting
        self.admin("ALTER DATABASE waits SET synchronous_commit = on")
        self.set_standby("nobody")

    def admin(self, sql: str) -> None:
        conn = psycopg2.connect(self.server.url("postgres"))   # synchronous_commit off here
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(sql)
        conn.close()

    def set_standby(self, names: str) -> None:
        self.admin(f"ALTER SYSTEM SET synchronous_standby_names = '{names}'")
        self.admin("SELECT pg_reload_conf()")
        time.sleep(0.3)

    def events(self) -> list[str]:
        conn = psycopg2.connect(self.url)
        with conn.cursor() as cur:
            cur.execute("SELECT message FROM events ORDER BY id")
            rows = [r[0] for r in cur.fetchall()]
        conn.close()
        return rows


@pytest.fixture(scope="module")
def primary() -> Iterator[WaitingPrimary]:
    p = WaitingPrimary()
    try:
        yield p
    finally:
        p.server.stop()


@pytest.fixture
def waiting(primary: WaitingPrimary) -> Iterator[WaitingPrimary]:
    primary.set_standby("nobody")
    primary.admin("ALTER DATABASE waits SET default_transaction_read_only = off")
    yield primary
    primary.set_standby("")


def test_a_commit_cancelled_while_waiting_for_the_standby_is_not_acknowledged(
        waiting: WaitingPrimary) -> None:
    store = Store(waiting.url, commit_timeout_s=1.0)
    started = time.monotonic()
    with pytest.raises(NotAcknowledged) as info:
        with store.begin() as conn:
            repo.add_event(conn, 1.0, "test", "s", "unreplicated write")
    took = time.monotonic() - started
    message = str(info.value)
    assert "did not acknowledge the write" in message
    assert "might not have been replicated" in message and "retry" in message
    assert 0.9 < took < 5, took
    # PostgreSQL did commit it locally: that is exactly why success must not be reported.
    assert "unreplicated write" in waiting.events()
    assert info.value.status == 503 and info.value.reason == "store_unavailable"
    with store.begin() as conn:            # the pool was emptied; reads still work
        assert store.now(conn) > 0
    store.dispose()


def test_a_fleet_change_waiting_for_the_standby_is_not_acknowledged(
        waiting: WaitingPrimary) -> None:
    """The bump, its log entries and the COMMIT go as one message (store/db.py
    ``bump_and_commit``): its wait for the standby is bounded and reported as one COMMIT's."""
    store = Store(waiting.url, commit_timeout_s=1.0)
    started = time.monotonic()
    with pytest.raises(NotAcknowledged, match="might not have been replicated"):
        with store.begin() as conn:
            repo.add_event(conn, 1.0, "test", "s", "unreplicated fleet change")
            fleet_changed(conn, nodes=["n1"])
    assert 0.9 < time.monotonic() - started < 5
    assert "unreplicated fleet change" in waiting.events()
    store.dispose()


def test_a_forked_child_bounds_its_commits_too(waiting: WaitingPrimary) -> None:
    """gunicorn forks its workers from a process that may have committed already: the
    child has none of the parent's threads, so its commit watchdog starts its own."""
    store = Store(waiting.url, commit_timeout_s=1.0)
    with pytest.raises(NotAcknowledged):             # the parent's watchdog thread runs
        with store.begin() as conn:
            repo.add_event(conn, 1.0, "test", "s", "parent")
    store.dispose()
    pid = os.fork()
    if pid == 0:                                      # the child: exit 0 when bounded
        code = 1
        try:
            child = Store(waiting.url, commit_timeout_s=1.0)
            started = time.monotonic()
            try:
                with child.begin() as conn:
                    repo.add_event(conn, 1.0, "test", "s", "child")
            except NotAcknowledged:
                code = 0 if time.monotonic() - started < 5 else 2
        finally:
            os._exit(code)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.1)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail("the forked child's COMMIT waited past its bound")


def test_a_non_idempotent_write_is_not_retried(waiting: WaitingPrimary) -> None:
    store = Store(waiting.url, commit_timeout_s=0.5)
    calls = []

    def write(conn: sa.Connection) -> None:
        calls.append(1)
        repo.add_event(conn, 1.0, "test", "s", "once")

    with pytest.raises(NotAcknowledged):
        store.transaction(write, idempotent=False)
    assert len(calls) == 1
    store.dispose()


def test_an_idempotent_write_is_retried_until_the_standby_returns(
        waiting: WaitingPrimary) -> None:
    store = Store(waiting.url, commit_timeout_s=0.5, retry_for_s=20)
    calls = []

    def write(conn: sa.Connection) -> str:
        calls.append(time.monotonic())
        repo.set_node_credential(conn, "n1", "hash-n1", 1.0)     # idempotent upsert
        return "done"

    threading.Timer(1.8, waiting.set_standby, args=("",)).start()   # the standby "returns"
    assert store.write(write) == "done"
    assert len(calls) >= 2, calls
    store.dispose()


def test_an_idempotent_write_gives_up_after_its_budget_saying_so(
        waiting: WaitingPrimary) -> None:
    store = Store(waiting.url, commit_timeout_s=0.3)
    calls = []

    def write(conn: sa.Connection) -> None:
        calls.append(1)
        repo.set_node_credential(conn, "n2", "hash-n2", 1.0)

    started = time.monotonic()
    with pytest.raises(NotAcknowledged) as info:
        store.transaction(write, idempotent=True, retry_for_s=2)
    assert len(calls) >= 2 and time.monotonic() - started < 6
    assert f"tried {len(calls)} times" in str(info.value)
    store.dispose()


def test_a_read_only_server_is_a_failover_to_wait_out(waiting: WaitingPrimary) -> None:
    """A demoted primary answers "cannot execute ... in a read-only transaction": that is
    an unavailable store (retried), not a bad statement."""
    waiting.set_standby("")
    waiting.admin("ALTER DATABASE waits SET default_transaction_read_only = on")
    store = Store(waiting.url, retry_for_s=20)
    with pytest.raises(StoreUnavailable) as info:
        with store.begin() as conn:
            repo.add_event(conn, 1.0, "test", "s", "read-only")
    assert "read-only" in str(info.value)

    calls = []

    def write(conn: sa.Connection) -> None:
        calls.append(1)
        repo.set_node_credential(conn, "n3", "hash-n3", 1.0)

    threading.Timer(1.0, waiting.admin,
                    args=("ALTER DATABASE waits SET default_transaction_read_only = off",)
                    ).start()
    store.write(write)
    assert len(calls) >= 2
    store.dispose()


def test_libpq_gets_keepalives_unless_the_url_sets_them(postgres: PostgresServer) -> None:
    url = postgres.create_database("keepalive") + "?keepalives_idle=30"
    store = Store(url)
    with store.begin() as conn:
        params = conn.connection.dbapi_connection.get_dsn_parameters()  # type: ignore[union-attr]
    store.dispose()
    assert params["keepalives"] == "1" and params["keepalives_idle"] == "30"
    assert params["keepalives_interval"] == "2" and params["tcp_user_timeout"] == "10000"


def test_sqlite_is_never_retried(tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = Store(f"sqlite:///{tmp_path}/x.db")
    calls = []

    def write(conn: sa.Connection) -> None:
        calls.append(1)
        conn.exec_driver_sql("SELECT * FROM no_such_table_but_a_locked_db")

    with pytest.raises(StoreUnavailable):
        store.transaction(write, idempotent=True, retry_for_s=5)
    assert calls == [1]


def test_write_runs_once_in_one_transaction_and_returns_its_value(store: Store) -> None:
    calls = []

    def write(conn: sa.Connection) -> int:
        calls.append(1)
        repo.add_event(conn, 1.0, "test", "s", "written once")
        return 7

    assert store.write(write) == 7 and calls == [1]
    with store.begin() as conn:
        assert [e["message"] for e in repo.list_events(conn)] == ["written once"]


def test_an_error_of_the_write_itself_rolls_back_and_is_not_retried(store: Store) -> None:
    from llmgw_runtime.errors import ValidationError

    calls = []

    def write(conn: sa.Connection) -> None:
        calls.append(1)
        repo.add_event(conn, 1.0, "test", "s", "rolled back")
        raise ValidationError("bad input")

    with pytest.raises(ValidationError):
        store.write(write)
    assert calls == [1]
    with store.begin() as conn:
        assert repo.list_events(conn) == []


def test_a_connection_lost_at_the_commit_is_not_acknowledged_and_the_write_retried(
        postgres: PostgresServer) -> None:
    """The primary gone during the COMMIT (its backend terminated, as a killed PostgreSQL
    does): the write is not acknowledged and an idempotent one is run again. The lost
    connection's bookkeeping raised SQLAlchemy's PendingRollbackError instead, and the
    writer died with it (a CI run of test_failover's kill of the primary)."""
    store = Store(postgres.create_database(f"lost_{os.getpid()}_{time.monotonic_ns()}"))
    store.migrate()
    calls: list[int] = []

    def write(conn: sa.Connection) -> None:
        calls.append(1)
        repo.add_event(conn, 1.0, "test", "s", f"attempt {len(calls)}")
        if len(calls) < 3:                # the first two attempts lose their connection
            pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
            admin = psycopg2.connect(store.url.replace("postgresql+psycopg2://",
                                                       "postgresql://"))
            admin.autocommit = True
            with admin.cursor() as cur:
                cur.execute("SELECT pg_terminate_backend(%s)", (pid,))
            admin.close()

    try:
        with pytest.raises(NotAcknowledged, match="may or may not have committed"):
            store.transaction(write, idempotent=False)      # told, and not run again
        assert len(calls) == 1
        store.write(write)                                  # run again, then committed
        assert len(calls) == 3
        with store.begin() as conn:
            assert [e["message"] for e in repo.list_events(conn)] == ["attempt 3"]
    finally:
        store.dispose()
