"""The console's and the status endpoint's summary (control/summary_view.py: each table
read once, nodes' JSON decoded once per text and kept between calls) is the fleet layer's
summary, on both store backends, also after a node's devices changed."""

from __future__ import annotations

import json
import time

from llmgw_runtime.api.catalog import ModelSpec, Profile
from llmgw_runtime.control import fleet, summary_view
from llmgw_runtime.control.decide import Settings
from llmgw_runtime.store import repo
from llmgw_runtime.store.schema import nodes

from .conftest import Api

CPU = {"id": 0, "card": 0, "mig": None, "class": "cpu", "memory_total_mb": 16000,
       "memory_used_mb": 100, "healthy": True, "reason": None}


def test_the_summary_view_answers_what_the_fleet_layer_does(api: Api) -> None:
    """summary_view (decoded JSON kept between calls) and fleet.summary agree, also after
    a node's devices changed (its cached text is decoded again)."""
    settings = Settings()
    now = time.time()
    with api.store.begin() as conn:
        conn.execute(nodes.insert(), [
            {"name": f"node-{i:03d}", "fabric": "ib-a", "devices": json.dumps([CPU]),
             "engines": '["llama.cpp"]', "weights": "{}", "hardware": "{}", "created": now,
             "last_report": now} for i in range(300)])
        repo.apply_catalog(conn, [ModelSpec(name=f"model-{i:02d}",
                                            source=f"file:///m/{i}.gguf", engine="llama.cpp",
                                            profile=Profile(klass="cpu"))
                                  for i in range(20)], now)
        for i in range(20):
            repo.add_replica(conn, f"r-{i:02d}", f"model-{i:02d}", f"node-{i:03d}", (0,), now)
    for used in (100, 900):
        with api.store.begin() as conn:
            conn.execute(nodes.update().where(nodes.c.name == "node-007").values(
                devices=json.dumps([{**CPU, "memory_used_mb": used}])))
            repo.set_node_drain(conn, "node-009", True, None)
            repo.update_replica(conn, "r-05", state="ready" if used == 900 else "starting")
            now = time.time()
            for row in repo.list_nodes(conn):
                assert summary_view.DECODED.node(row) == fleet.node_view(row)
            parts = repo.parts_by_replica(conn)
            for rep in repo.list_replicas(conn):
                assert summary_view.DECODED.replica(rep, parts.get(rep.id), now) \
                    == fleet.replica_view(rep, parts.get(rep.id), now)
            ours = summary_view.summary(conn, now, settings, idle_after_s=900.0, store={})
            theirs = fleet.summary(conn, now, settings, idle_after_s=900.0, store={})
        assert ours == theirs
        assert ours["devices"]["cpu"]["memory_used_mb"] == 299 * 100 + used
        assert ours["maintenance"] == [{"name": "node-009", "state": "cordoned",
                                        "replicas": 1}]
