"""A web request's wait bound (LLMGW_STORE_WAIT_S, failover.set_wait) bounds each wait for
the server, not the transaction: a catalog apply that checks 1,000 models between its
statements on a busy worker takes seconds of its own and must commit, while a statement
the server does not answer is cut off within the bound. On the suite's real PostgreSQL;
the server "does not answer" by holding a lock the statement waits for, or sleeping."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Iterator

import psycopg2
import pytest
import sqlalchemy as sa

from llmgw_runtime.control.incremental import View
from llmgw_runtime.store import Store, StoreUnavailable, failover, repo
from tests.support.postgres import PostgresServer

BOUND_S = 0.5


@pytest.fixture
def pg_store(postgres: PostgresServer) -> Iterator[Store]:
    store = Store(postgres.create_database(f"w_{uuid.uuid4().hex[:10]}"))
    store.migrate()
    failover.set_wait(BOUND_S)
    try:
        yield store
    finally:
        failover.set_wait(None)
        store.dispose()


def test_client_work_between_statements_longer_than_the_bound_commits(
        pg_store: Store) -> None:
    def write(conn: sa.Connection) -> None:
        repo.set_node_credential(conn, "slow-1", "x" * 64, 0.0)
        time.sleep(3 * BOUND_S)              # the client's own work: the server is idle
        repo.set_node_credential(conn, "slow-2", "y" * 64, 0.0)

    failover.set_wait(BOUND_S)
    pg_store.write(write)
    with pg_store.begin() as conn:
        assert {n.name for n in repo.list_nodes(conn)} == {"slow-1", "slow-2"}


def test_a_statement_the_server_does_not_answer_is_cut_off_within_the_bound(
        pg_store: Store) -> None:
    began = time.monotonic()
    with pytest.raises(StoreUnavailable) as cut:
        with pg_store.begin() as conn:
            conn.exec_driver_sql("SELECT pg_sleep(10)")
    assert time.monotonic() - began < BOUND_S + 1.5
    # the error names the bound that cut it off, not a store that "cannot be reached"
    assert f"did not answer within {BOUND_S:g} s" in str(cut.value)
    assert "LLMGW_STORE_WAIT_S" in str(cut.value) and "cannot be reached" not in str(cut.value)
    failover.set_wait(BOUND_S)
    with pg_store.begin() as conn:           # the store serves again at once
        assert conn.exec_driver_sql("SELECT 1").scalar_one() == 1


def test_the_summary_views_own_cursor_is_bounded_too(
        pg_store: Store, postgres: PostgresServer) -> None:
    """The status summary's view reads every node's report time through a driver cursor
    of its own (control/incremental.py ``_narrow``), outside SQLAlchemy's events."""
    with pg_store.begin() as conn:
        repo.set_node_credential(conn, "n-1", "x" * 64, 0.0)
    view = View(10**6, reports_apart=True)     # no rolling re-read: the narrow read first
    with pg_store.begin() as conn:
        view.refresh(conn)                   # the first pass reads everything
    holder = psycopg2.connect(pg_store.url.replace("postgresql+psycopg2://", "postgresql://"))
    release = threading.Timer(6.0, holder.rollback)     # an unbounded read ends, late
    try:
        with holder.cursor() as cur:
            cur.execute("LOCK TABLE nodes IN ACCESS EXCLUSIVE MODE")
        release.start()
        failover.set_wait(BOUND_S)
        began = time.monotonic()
        with pytest.raises(StoreUnavailable, match="did not answer within"):
            with pg_store.begin() as conn:
                view.refresh(conn)
        assert time.monotonic() - began < BOUND_S + 1.5
    finally:
        release.cancel()
        holder.rollback()
        holder.close()
    failover.set_wait(BOUND_S)
    with pg_store.begin() as conn:
        assert set(view.refresh(conn).nodes) == {"n-1"}


class _Raw:
    """What the watchdog holds of a psycopg2 connection: its descriptor."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def fileno(self) -> int:
        return self.sock.fileno()


def test_an_answer_waiting_to_be_read_is_not_cut_off_and_a_silent_server_then_is() -> None:
    """A busy web worker may read the server's answer after the bound: the server answered,
    so the wait goes on (an apply under 10,000 agents was answered 503 while PostgreSQL was
    fine). Once the answer is read and nothing more comes, the bound cuts it off."""
    ours, server = socket.socketpair()
    try:
        server.sendall(b"answer")                      # answered; not read yet
        entry = failover.WATCHDOG.watch(_Raw(ours), 0.2, action=failover.sever)
        time.sleep(0.7)                                # past the bound, three times
        assert not entry.fired
        assert ours.recv(16) == b"answer"              # the connection still serves
        ours.sendall(b"next")
        assert server.recv(16) == b"next"
        deadline = time.monotonic() + 3
        while not entry.fired:                         # nothing more: cut off
            assert time.monotonic() < deadline, "the silent server was not cut off"
            time.sleep(0.05)
        assert ours.recv(16) == b""                    # its socket was shut down
        assert failover.WATCHDOG.done(entry)
    finally:
        ours.close()
        server.close()
