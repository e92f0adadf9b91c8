"""Moving the store in use (SQLite) into PostgreSQL: every row, counted on both sides, a
consistent backup, and re-runs that never overwrite rows somebody else wrote."""

from __future__ import annotations

import os
import sqlite3
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa

from llmgw_runtime.api.agent import Report
from llmgw_runtime.catalog import parse as catalog
from llmgw_runtime.store import Store, accounts, repo
from llmgw_runtime.store.schema import events
from llmgw_runtime.storeops.move import (
    TABLES,
    Decision,
    MoveError,
    TableState,
    backup_sqlite,
    decide,
    move,
    snapshot,
)
from tests.support.postgres import PostgresServer
from tests.support.procs import free_port

CAT = """models:
  - {name: small, source: /m/small.gguf, engine: llama.cpp, profile: {class: cpu},
     on_demand: true, idle_stop_after: 10m}
  - {name: big, source: hf://org/big, engine: vllm,
     profile: {class: a100-80g, gpus: 2, tp: 2}, args: ["--max-model-len", "4096"]}
"""


def populate(store: Store, events_n: int = 3) -> None:
    """A store as a running control service leaves it: every table has rows."""
    with store.begin() as conn:
        repo.apply_catalog(conn, catalog.parse(CAT), 1700000000.25)
        for i, name in enumerate(("gpu1", "gpu2")):
            repo.set_node_credential(conn, name, f"{i:064x}", 1700000001.5)
            repo.record_report(conn, name, Report.model_validate({
                "node": name, "address": f"10.0.0.{i + 1}", "fabric": "ib0",
                "agent_version": "1.0", "devices": [{"id": 0, "uuid": f"GPU-{i}",
                                                     "class": "a100-80g",
                                                     "memory_total_mb": 81920}]}),
                               1700000002.75)
        repo.add_replica(conn, "r-big-1", "big", "gpu1", (0, 1), 1700000003.0,
                         parts=((1, "gpu2", (0, 1)),), rendezvous_port=29500)
        repo.add_replica(conn, "r-small-1", "small", "gpu2", (2,), 1700000004.0)
        for i in range(events_n):
            repo.add_event(conn, 1700000005.0 + i, "placement", "big", f"placed #{i} ✓")
        accounts.put_account(conn, "admin", "admin", "a" * 64, 1700000006.0)
        accounts.put_account(conn, "app", "api_key", "b" * 64, 1700000007.0)
        repo.try_lease(conn, "reconciler", "host:1:abc", 1700000008.0, 10.0)


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[Store]:
    s = Store(f"sqlite:///{tmp_path}/state/llmgw.db")
    s.migrate()
    populate(s)
    yield s
    s.dispose()


@pytest.fixture
def pg_store(postgres: PostgresServer) -> Iterator[Store]:
    s = Store(postgres.create_database(f"move_{uuid.uuid4().hex[:10]}"))
    yield s
    s.dispose()


def counts(store: Store) -> dict[str, int]:
    with store.begin() as conn:
        return {t.name: conn.execute(sa.select(sa.func.count()).select_from(t)).scalar_one()
                for t in TABLES}


def test_every_row_of_every_table_is_copied_and_counted(
        sqlite_store: Store, pg_store: Store, tmp_path: Path) -> None:
    result = move(sqlite_store, pg_store, tmp_path / "marker.json")
    assert result.decision.action == "copy"
    assert counts(pg_store) == counts(sqlite_store) == result.counts
    filled = {"models", "nodes", "replicas", "replica_parts", "events", "accounts", "leases"}
    assert all(result.counts[t] > 0 for t in filled), result.counts
    with sqlite_store.begin() as a, pg_store.begin() as b:
        assert snapshot(a) == snapshot(b)
        assert [repo.model_to_dict(r) for r in repo.list_models(a)] == \
            [repo.model_to_dict(r) for r in repo.list_models(b)]


def test_ids_continue_after_the_copied_ones(
        sqlite_store: Store, pg_store: Store, tmp_path: Path) -> None:
    move(sqlite_store, pg_store, tmp_path / "marker.json")
    with pg_store.begin() as conn:
        repo.add_event(conn, 1.0, "test", "x", "after the move")
        ids = [r.id for r in conn.execute(sa.select(events.c.id).order_by(events.c.id))]
    assert ids == [1, 2, 3, 4]


def test_a_second_move_finds_the_rows_there_and_changes_nothing(
        sqlite_store: Store, pg_store: Store, tmp_path: Path) -> None:
    move(sqlite_store, pg_store, tmp_path / "marker.json")
    with pg_store.begin() as conn:
        before = snapshot(conn)
    again = move(sqlite_store, pg_store, tmp_path / "marker.json")
    assert again.decision.action == "already"
    with pg_store.begin() as conn:
        assert snapshot(conn) == before


def test_an_earlier_copy_nobody_used_is_replaced_by_a_fresh_one(
        sqlite_store: Store, pg_store: Store, tmp_path: Path) -> None:
    move(sqlite_store, pg_store, tmp_path / "marker.json")
    with sqlite_store.begin() as conn:     # the old store kept serving after a failed switch
        repo.add_event(conn, 1700000100.0, "park", "small", "parked")
    again = move(sqlite_store, pg_store, tmp_path / "marker.json")
    assert again.decision.action == "replace"
    assert counts(pg_store) == counts(sqlite_store)


def test_a_cluster_holding_other_rows_is_refused_and_left_as_it_was(
        sqlite_store: Store, pg_store: Store, tmp_path: Path) -> None:
    pg_store.migrate()
    with pg_store.begin() as conn:
        repo.add_event(conn, 5.0, "other", "someone", "else's store")
        before = snapshot(conn)
    with pytest.raises(MoveError) as err:
        move(sqlite_store, pg_store, tmp_path / "marker.json")
    assert "already holds other rows" in str(err.value)
    assert "events: 3 row(s) here, 1 in the cluster" in str(err.value)
    with pg_store.begin() as conn:
        assert snapshot(conn) == before


def test_an_unreachable_cluster_is_named_without_its_password(
        sqlite_store: Store, tmp_path: Path) -> None:
    target = Store(f"postgresql://llmgw:s3cretpw@127.0.0.1:{free_port()}/llmgw"
                   "?connect_timeout=2")
    with pytest.raises(MoveError) as err:
        move(sqlite_store, target, tmp_path / "marker.json")
    text = str(err.value)
    assert "the cluster database at postgresql://llmgw:***@127.0.0.1" in text
    assert "s3cretpw" not in text
    assert not (tmp_path / "marker.json").exists()


def test_once_the_cluster_is_written_to_a_move_from_the_old_store_refuses(
        sqlite_store: Store, pg_store: Store, tmp_path: Path) -> None:
    move(sqlite_store, pg_store, tmp_path / "marker.json")
    with sqlite_store.begin() as conn:        # the old store kept serving (switch failed)
        repo.add_event(conn, 1700000100.0, "park", "small", "parked")
    assert move(sqlite_store, pg_store, tmp_path / "marker.json").decision.action == "replace"
    with pg_store.begin() as conn:            # then the control service used the cluster
        repo.add_event(conn, 9.0, "control", "x", "the cluster is in use now")
    with sqlite_store.begin() as conn:
        repo.add_event(conn, 1700000200.0, "park", "big", "parked")
    with pytest.raises(MoveError) as err:
        move(sqlite_store, pg_store, tmp_path / "marker.json")
    assert "events: 5 row(s) here, 5 in the cluster (same count, other values)" \
        in str(err.value)


def test_the_backup_is_a_consistent_copy_that_opens(sqlite_store: Store, tmp_path: Path) -> None:
    db = tmp_path / "state" / "llmgw.db"
    when = datetime(2026, 12, 3, 7, 5, 9, tzinfo=UTC)
    first = backup_sqlite(db, when)
    second = backup_sqlite(db, when)
    assert first.name == "llmgw.db.before-patroni-20261203T070509Z"
    assert second.name == first.name + ".1"
    assert oct(os.stat(first).st_mode & 0o777) == "0o600"
    with sqlite3.connect(first) as conn:
        assert conn.execute("SELECT count(*) FROM models").fetchone() == (2,)
        assert conn.execute("SELECT count(*) FROM events").fetchone() == (3,)


def test_decide_copies_into_empty_skips_same_replaces_own_refuses_other() -> None:
    empty = {"models": TableState(0, "e"), "events": TableState(0, "e")}
    src = {"models": TableState(2, "m"), "events": TableState(3, "e3")}
    old_copy = {"models": TableState(2, "m"), "events": TableState(2, "e2")}
    other = {"models": TableState(2, "x"), "events": TableState(2, "e2")}
    assert decide(src, empty, []).action == "copy"
    assert decide(src, dict(src), []).action == "already"
    assert decide(src, old_copy, [src, old_copy]).action == "replace"
    refused = decide(src, other, [old_copy])
    assert refused == Decision("refuse", refused.reason)
    assert "models: 2 row(s) here, 2 in the cluster (same count, other values)" \
        in refused.reason
    assert decide(src, old_copy, []).action == "refuse"
