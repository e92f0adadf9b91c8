"""The fleet's change log (store/changes.py), on SQLite and PostgreSQL: each write names
what it changed, concurrent committers never lose an entry for a reader, and a reader the
pruned log no longer reaches re-reads everything."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import psycopg2
import sqlalchemy as sa

from llmgw_runtime.api.agent import DeviceReport, Report
from llmgw_runtime.api.catalog import ModelSpec
from llmgw_runtime.store import Store, changes, repo
from llmgw_runtime.store.db import fleet_changed
from tests.support.postgres import PostgresServer

SPEC = ModelSpec.model_validate({"name": "tiny", "source": "file:///m/tiny.gguf",
                                 "engine": "llama.cpp", "profile": {"class": "cpu"}})

CPU = DeviceReport.model_validate({"id": 0, "uuid": "cpu-host", "class": "cpu",
                                   "memory_total_mb": 16000, "memory_used_mb": 1000})


def generation(store: Store) -> int:
    with store.begin() as conn:
        return changes.since(conn, None).generation


def since(store: Store, last: int | None) -> changes.Changed:
    with store.begin() as conn:
        return changes.since(conn, last)


def three_nodes(store: Store) -> float:
    """Nodes n1, n2 and n3, joined and reported; the store's time then."""
    with store.begin() as conn:
        now = store.now(conn)
        for name in ("n1", "n2", "n3"):
            repo.set_node_credential(conn, name, name * 16, now)
            repo.record_report(conn, name, Report(node=name, address="10.0.0.1"), now)
    return now


def test_each_write_names_the_nodes_models_and_replicas_it_changed(store: Store) -> None:
    now = three_nodes(store)
    last = generation(store)
    with store.begin() as conn:
        repo.apply_catalog(conn, [SPEC], now)
    got = since(store, last)
    assert (got.models, got.nodes, got.replicas, got.everything) == (
        {"tiny"}, frozenset(), frozenset(), False)

    last = got.generation
    with store.begin() as conn:         # a replica headed on n1 with a worker part on n2
        repo.add_replica(conn, "r1", "tiny", "n1", (0,), now, parts=((1, "n2", (0,)),))
    got = since(store, last)
    assert got.replicas == {"r1"} and got.nodes == {"n1", "n2"} and not got.models

    last = got.generation
    with store.begin() as conn:         # the part's state: the replica and all its nodes
        repo.update_part(conn, "r1", 1, state="ready")
    assert since(store, last).nodes == {"n1", "n2"}

    last = generation(store)
    with store.begin() as conn:         # deleted: its nodes were looked up before
        repo.delete_replica(conn, "r1")
    got = since(store, last)
    assert got.replicas == {"r1"} and got.nodes == {"n1", "n2"}

    last = got.generation
    with store.begin() as conn:         # the same report again: nothing to log
        repo.record_report(conn, "n3", Report(node="n3", address="10.0.0.1"), now + 1,
                           before=repo.node_by_credential(conn, "n3" * 16))
    assert since(store, last).nothing
    with store.begin() as conn:         # new device readings: telemetry only
        repo.record_report(conn, "n3", Report(node="n3", address="10.0.0.1", devices=[CPU]),
                           now + 2, before=repo.node_by_credential(conn, "n3" * 16))
        repo.set_node_drain(conn, "n1", True, {"since": now})
    got = since(store, last)
    assert got.nodes == {"n1", "n3"} and got.telemetry_only == {"n3"}

    last = got.generation
    with store.begin() as conn:         # device readings and a reset in one transaction
        fleet_changed(conn, telemetry=("n2",))
        repo.reset_node_credential(conn, "n2")
    got = since(store, last)
    assert got.nodes == {"n2"} and got.telemetry_only == frozenset()
    assert since(store, got.generation).nothing


def test_a_write_that_names_nothing_means_everything(store: Store) -> None:
    last = generation(store)
    with store.begin() as conn:
        fleet_changed(conn)
    got = since(store, last)
    assert got.everything and got.generation == last + 1
    assert since(store, None).everything             # a reader that never read


def test_concurrent_committers_never_lose_an_entry_for_a_reader(store: Store) -> None:
    """Writers commit while a reader follows the log from generation to generation: every
    entry written is seen once the writers are done, none skipped between two reads."""
    last = generation(store)
    writers, commits = 4, 15
    done = threading.Event()
    seen: set[str] = set()
    everything: list[bool] = []

    def write(w: int) -> None:
        for k in range(commits):
            with store.begin() as conn:
                fleet_changed(conn, nodes=(f"w{w}-{k}",), replicas=(f"r{w}-{k}",))

    def read() -> None:
        nonlocal last
        while True:
            finished = done.is_set()
            got = since(store, last)
            everything.append(got.everything)
            seen.update(got.nodes)
            last = got.generation
            if finished:
                return

    reader = threading.Thread(target=read)
    reader.start()
    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    reader.join()
    assert not any(everything)
    assert seen == {f"w{w}-{k}" for w in range(writers) for k in range(commits)}
    assert last == generation(store)


def test_a_reader_the_pruned_log_no_longer_reaches_rereads_everything(store: Store) -> None:
    old = generation(store)
    with store.begin() as conn:
        fleet_changed(conn, nodes=("a",))
    recent = generation(store)
    with store.begin() as conn:
        now = store.now(conn)
        assert changes.prune(conn, now, keep_s=3600) == 0     # nothing that old
        assert changes.prune(conn, now + 10, keep_s=1) >= 1   # gone
    assert since(store, old).everything                       # its entries went
    assert not since(store, recent).everything                # saw them before they went
    with store.begin() as conn:
        fleet_changed(conn, models=("m",))
    got = since(store, recent)
    assert not got.everything and got.models == {"m"}


def test_a_fleet_change_holds_the_generation_lock_only_while_the_server_commits(
        postgres: PostgresServer) -> None:
    """Every fleet-changing writer takes the generation's row lock to keep the log in
    commit order. Held across this client's waits for answers, a busy control worker kept it
    while serving its other requests and every other writer queued behind: so the bump, the
    log and the COMMIT go to the server in one message, and whenever the writer has an
    answer in hand the lock is free again."""
    url = postgres.create_database(f"t_{uuid.uuid4().hex[:10]}")
    store = Store(url)
    store.migrate()
    probe = psycopg2.connect(url)
    seen: list[str] = []

    def after(conn: Any, *_: Any) -> None:       # the writer has the server's answer
        with probe.cursor() as cur:
            try:
                cur.execute("SELECT value FROM generations WHERE name = 'fleet' "
                            "FOR UPDATE NOWAIT")
                seen.append("free")
            except psycopg2.errors.LockNotAvailable:
                seen.append("held")
        probe.rollback()

    try:
        before = generation(store)
        sa.event.listen(store.engine, "after_cursor_execute", after)
        sa.event.listen(store.engine, "commit", after)
        with store.begin() as conn:
            fleet_changed(conn, nodes=["n1", "n2"], models=["tiny"])
        sa.event.remove(store.engine, "after_cursor_execute", after)
        sa.event.remove(store.engine, "commit", after)
        assert seen and "held" not in seen, seen
        got = since(store, before)
        assert (got.generation, got.nodes, got.models) == (
            before + 1, {"n1", "n2"}, {"tiny"})
    finally:
        probe.close()
        store.dispose()


def test_a_fleet_change_commits_without_a_warning(postgres: PostgresServer) -> None:
    """The bump's own COMMIT went ahead of the driver's, which then found no transaction:
    PostgreSQL logged "WARNING: there is no transaction in progress" for every write that
    moved the fleet (10,801 in one 4-minute benchmark run)."""
    store = Store(postgres.create_database(f"t_{uuid.uuid4().hex[:10]}"))
    store.migrate()
    try:
        before = generation(store)
        with store.begin() as conn:
            fleet_changed(conn, nodes=["n1"])
            raw = conn.connection.dbapi_connection
        assert not [n for n in raw.notices if "no transaction" in n], raw.notices
        assert since(store, before).nodes == {"n1"}
        with store.begin() as conn:             # the connection serves the next one
            assert conn.exec_driver_sql("SELECT 1").scalar_one() == 1
            assert conn.connection.dbapi_connection.get_transaction_status() == \
                psycopg2.extensions.TRANSACTION_STATUS_INTRANS
    finally:
        store.dispose()
