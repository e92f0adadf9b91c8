"""Steady nodes' last reports written in batches (store/noderows.record_heartbeats), on
SQLite and PostgreSQL (one UPDATE of three arrays there): each node's time and devices
move forward only, a node whose agent said it stopped is left alone, and the nodes whose
stored state moved on are returned, so their next heartbeat asks for a full report."""

from __future__ import annotations

import json

from llmgw_runtime.api.agent import Report
from llmgw_runtime.store import Store, changes, noderows, repo
from llmgw_runtime.store.schema import nodes


def rows_of(store: Store) -> dict[str, tuple[float | None, str]]:
    with store.begin() as conn:
        return {r.name: (r.last_report, r.devices)
                for r in conn.execute(nodes.select())}


def test_a_batch_refreshes_its_nodes_forward_only_and_names_the_ones_that_moved_on(
        store: Store) -> None:
    with store.begin() as conn:
        for name in ("n1", "n2", "n3", "n4", "n5"):
            repo.set_node_credential(conn, name, name * 16, 100.0)
            repo.record_report(conn, name, Report(node=name, address="10.0.0.1"), 100.0)
        conn.execute(nodes.update().where(nodes.c.name == "n3").values(last_report=None))
        conn.execute(nodes.update().where(nodes.c.name == "n4").values(last_report=500.0))
    with store.begin() as conn:
        last = changes.since(conn, None).generation
    gpu = json.dumps([{"id": 0, "memory_used_mb": 7}])
    beats = [("n1", 200.0, gpu), ("n2", 200.0, "[]"), ("n3", 200.0, gpu),
             ("n4", 200.0, gpu), ("n5", 201.0, gpu), ("gone", 200.0, gpu)]
    with store.begin() as conn:
        stale = noderows.record_heartbeats(conn, beats, telemetry=("n1", "n3", "n5"))
    # stopped (n3), newer in the store (n4) or deleted: not written, named
    assert sorted(stale) == ["gone", "n3", "n4"]
    got = rows_of(store)
    assert got["n1"] == (200.0, gpu) and got["n5"] == (201.0, gpu)
    assert got["n2"] == (200.0, "[]")
    assert got["n3"][0] is None and got["n4"][0] == 500.0 and got["n4"][1] != gpu
    with store.begin() as conn:
        logged = changes.since(conn, last)
    # only the refreshed nodes whose readings changed reach the change log
    assert logged.nodes == logged.telemetry_only == {"n1", "n5"}


def test_a_heartbeat_without_devices_moves_the_time_and_keeps_the_stored_devices(
        store: Store) -> None:
    gpu = json.dumps([{"id": 0, "memory_used_mb": 7}])
    with store.begin() as conn:
        repo.set_node_credential(conn, "n1", "n1" * 16, 100.0)
        repo.record_report(conn, "n1", Report(node="n1", address="10.0.0.1"), 100.0)
        assert noderows.record_heartbeats(conn, [("n1", 200.0, gpu)]) == []
    with store.begin() as conn:
        assert noderows.record_heartbeats(conn, [("n1", 300.0, None)]) == []
    assert rows_of(store)["n1"] == (300.0, gpu)
