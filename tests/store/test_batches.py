"""A reconcile pass's writes in batches (store/repo.py ``add_replicas``,
``update_replicas``, ``delete_replicas``, ``add_events``; control/fleet.py ``write``), on
SQLite and PostgreSQL: many rows at once, past one IN list's bound, each named in the change
log as one at a time was, events in the order decided; and a pass's write costs a few
statements, not one per row (on a loaded host each statement waits its turn: a churning
pass's hundred of them were most of its wall time)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from llmgw_runtime.control import fleet
from llmgw_runtime.control.decide import Changes, Start
from llmgw_runtime.store import Store, devicetime, repo, upsert
from llmgw_runtime.store.schema import device_time, replica_parts

from .test_changes import SPEC, generation, since, three_nodes

MANY = repo.CHUNK * 2 + 17          # three IN lists


def fleet_of(store: Store) -> float:
    now = three_nodes(store)
    with store.begin() as conn:
        repo.apply_catalog(conn, [SPEC], now)
    return now


def test_many_replicas_are_added_stopped_and_deleted_at_once(store: Store) -> None:
    now = fleet_of(store)
    ids = [f"r{i:04d}" for i in range(MANY)]
    last = generation(store)
    with store.begin() as conn:        # every tenth with a worker part on n3
        repo.add_replicas(conn, [repo.NewReplica(
            rid, "tiny", "n1" if i % 2 else "n2", (0,),
            ((1, "n3", (0,)),) if i % 10 == 0 else ()) for i, rid in enumerate(ids)], now)
    got = since(store, last)
    assert got.replicas == set(ids) and got.nodes == {"n1", "n2", "n3"}
    with store.begin() as conn:
        stored = repo.list_replicas(conn)
        parts = repo.parts_by_replica(conn)
    assert sorted(r.id for r in stored) == ids
    assert {r.state for r in stored} == {"pending"} and {r.desired for r in stored} == {1}
    assert sorted(parts) == ids[::10] and parts["r0010"][0].node == "n3"

    last = got.generation
    stopped = ids[: repo.CHUNK + 3]
    with store.begin() as conn:
        repo.update_replicas(conn, stopped, desired=0, state="stopping", updated=now)
    got = since(store, last)
    assert got.replicas == set(stopped) and got.nodes == {"n1", "n2", "n3"}
    with store.begin() as conn:
        states = {r.id: (r.desired, r.state) for r in repo.list_replicas(conn)}
    assert {states[r] for r in stopped} == {(0, "stopping")}
    assert {states[r] for r in ids if r not in stopped} == {(1, "pending")}

    last = got.generation
    with store.begin() as conn:
        repo.delete_replicas(conn, ids[1:])
    got = since(store, last)
    assert got.replicas == set(ids[1:]) and got.nodes == {"n1", "n2", "n3"}
    with store.begin() as conn:
        assert [r.id for r in repo.list_replicas(conn)] == ["r0000"]
        left = conn.execute(sa.select(replica_parts.c.replica_id)).scalars().all()
    assert left == ["r0000"]


def test_events_are_stored_in_the_order_they_were_decided(store: Store) -> None:
    with store.begin() as conn:
        now = store.now(conn)
        repo.add_events(conn, now, [("catalog", f"m{i}", f"event {i}") for i in range(7)])
        repo.add_events(conn, now, [])
        repo.add_event(conn, now, "node", "n1", "last")
    with store.begin() as conn:
        listed = repo.list_events(conn, limit=8)
    assert [e["message"] for e in reversed(listed)] == [f"event {i}" for i in range(7)] + [
        "last"]


def statements(store: Store, write: Callable[[Any], None]) -> list[str]:
    """The statements ``write`` sends in a transaction of its own."""
    sent: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        sent.append(statement)

    sa.event.listen(store.engine, "before_cursor_execute", count)
    try:
        with store.begin() as conn:
            write(conn)
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", count)
    return sent


def test_a_pass_writes_its_rows_in_a_few_statements(store: Store) -> None:
    """Twenty deletes, starts and stops and sixty events: a dozen statements, as many as
    for one of each (each was a statement, three for a delete: 160 in all)."""
    now = fleet_of(store)
    with store.begin() as conn:
        repo.add_replicas(conn, [repo.NewReplica(f"old{i}", "tiny", "n1", (0,))
                                 for i in range(40)], now)
    decided = Changes()
    decided.delete_replicas = [f"old{i}" for i in range(20)]
    decided.stops = [(f"old{i}", "no longer wanted") for i in range(20, 40)]
    decided.starts = [Start(replica_id=f"new{i}", model="tiny", node="n2", devices=(0,))
                      for i in range(20)]
    decided.events = [("replica", f"r{i}", f"event {i}") for i in range(60)]
    sent = statements(store, lambda conn: fleet.write(conn, decided, now))
    writes = [s for s in sent if not s.lstrip().upper().startswith(("SAVEPOINT", "RELEASE"))]
    assert len(writes) <= 12, writes
    with store.begin() as conn:
        rows = {r.id: (r.desired, r.state) for r in repo.list_replicas(conn)}
        listed = repo.list_events(conn, limit=60)
    assert sorted(rows) == sorted([f"old{i}" for i in range(20, 40)]
                                  + [f"new{i}" for i in range(20)])
    assert {rows[f"old{i}"] for i in range(20, 40)} == {(0, "stopping")}
    assert [e["message"] for e in reversed(listed)] == [f"event {i}" for i in range(60)]


def test_a_thousand_upserted_rows_go_in_pages_not_one_statement_each(store: Store) -> None:
    """The GPU-hours the reconciler writes each minute (and the history's rows, the keys'
    usage: store/upsert.py ``put_rows``): 1,500 rows in two statements, not one round trip
    per row (an upsert handed a list ran once per row: 220 ms of a pass at 1,000 models on
    PostgreSQL), each added to the row there; two rows with one key are refused, naming
    it, before anything is written."""
    pending = {(3600.0, f"m{i:04d}", "h100-80g"): 2.0 for i in range(1500)}
    with store.begin() as conn:
        devicetime.add(conn, pending)
    sent = statements(store, lambda conn: devicetime.add(
        conn, {**pending, (7200.0, "m0000", "h100-80g"): 1.0}))
    # rows a statement sends: its VALUES (...), (...) groups
    sizes = sorted(s.count("), (") + 1 for s in sent if s.lstrip().upper().startswith("INSERT"))
    assert sizes == [501, 1000], sizes
    with store.begin() as conn:
        rows = devicetime.read(conn, 0.0, 10_000.0)
    assert len(rows) == 1501 and {r.seconds for r in rows if r.bucket == 3600.0} == {4.0}
    with pytest.raises(ValueError, match=r"device_time repeat a key \(bucket, model"):
        with store.begin() as conn:
            upsert.add_rows(conn, device_time, ("bucket", "model", "device_class"),
                            [{"bucket": 1.0, "model": "m", "device_class": "c",
                              "seconds": 1.0}] * 2, ("seconds",))
