"""The console's and the status endpoint's summary (control/summary_view.py: each table
read once, nodes' JSON decoded once per text and kept between calls) is the fleet layer's
summary, on both store backends, also after a node's devices changed."""

from __future__ import annotations

import json
import time

from llmgw_runtime.api.catalog import ModelSpec, Profile
from llmgw_runtime.control import fleet, history, summary_view
from llmgw_runtime.control.decide import Settings
from llmgw_runtime.store import repo
from llmgw_runtime.store.db import fleet_changed
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
        with api.store.begin() as conn:     # as the heartbeat writer does: logged
            conn.execute(nodes.update().where(nodes.c.name == "node-007").values(
                devices=json.dumps([{**CPU, "memory_used_mb": used}])))
            fleet_changed(conn, telemetry=("node-007",))
            repo.set_node_drain(conn, "node-009", True, None)
            repo.update_replica(conn, "r-05", state="ready" if used == 900 else "starting")
        with api.store.begin() as conn:
            now = time.time()
            parts = repo.parts_by_replica(conn)
            # the history's minute samples read through the kept fleet too
            held = summary_view.HELD.fleet(conn)
            plain = [fleet.node_view(row) for row in repo.list_nodes(conn)]
            assert history.class_samples(held, now, settings.node_timeout_s) \
                == history.class_counts(plain, [fleet.replica_view(r, parts.get(r.id), now)
                                                for r in repo.list_replicas(conn)], now,
                                        settings.node_timeout_s,
                                        [repo.model_to_dict(m) for m in repo.list_models(conn)])
            samples = history.model_samples(held[0], held[2], now)
            assert samples == history.model_samples(repo.list_models(conn),
                                                    repo.list_replicas(conn), now)
            shown = {m["name"]: m for m in fleet.models_view(conn, now)}
            assert samples and all((s["ready"], s["wanted"]) == (
                shown[s["model"]]["ready"], shown[s["model"]]["wanted"]) for s in samples)
            for rep in repo.list_replicas(conn):
                assert summary_view.DECODED.replica(rep, parts.get(rep.id), now) \
                    == fleet.replica_view(rep, parts.get(rep.id), now)
            ours = summary_view.summary(conn, now, settings, idle_after_s=900.0, store={})
            theirs = fleet.summary(conn, now, settings, idle_after_s=900.0, store={})
        assert ours == theirs
        assert ours["devices"]["cpu"]["memory_used_mb"] == 299 * 100 + used
        assert ours["maintenance"] == [{"name": "node-009", "state": "cordoned",
                                        "replicas": 1}]


def test_the_kept_fleet_follows_reports_joins_and_removals(api: Api) -> None:
    """The summary's fleet kept between calls (each process's, read again only where the
    change log says) still shows a node going silent and coming back (its report time is
    written with no log entry), a problem the reconciler wrote, a node that joined and one
    removed: as the fleet layer's summary does, after each."""
    settings = Settings()

    def both() -> tuple[dict, dict]:
        with api.store.begin() as conn:
            now = api.store.clock(conn)
            return (summary_view.summary(conn, now, settings, idle_after_s=900.0, store={}),
                    fleet.summary(conn, now, settings, idle_after_s=900.0, store={}))

    with api.store.begin() as conn:
        now = api.store.clock(conn)
        conn.execute(nodes.insert(), [
            {"name": f"node-{i}", "fabric": "f", "devices": json.dumps([CPU]),
             "engines": "[]", "weights": "{}", "hardware": "{}", "created": now,
             "last_report": now} for i in range(3)])
    ours, theirs = both()
    assert ours == theirs and ours["nodes"]["reporting"] == 3
    with api.store.begin() as conn:     # the heartbeat writer's and the pass's columns
        now = api.store.clock(conn)
        conn.execute(nodes.update().where(nodes.c.name == "node-1").values(
            last_report=now - 3600))
        conn.execute(nodes.update().where(nodes.c.name == "node-2").values(
            plan_problem="no engine for model m"))
    ours, theirs = both()
    assert ours == theirs and ours["nodes"]["silent"] == 1
    assert {n["name"]: n["problem"] for n in ours["node_problems"]["nodes"]} == {
        "node-1": "silent for 1h", "node-2": "no engine for model m"}
    with api.store.begin() as conn:
        now = api.store.clock(conn)
        conn.execute(nodes.update().where(nodes.c.name == "node-1").values(last_report=now))
        conn.execute(nodes.insert().values(      # joined: no log entry before its report
            name="node-3", fabric="g", devices=json.dumps([CPU, {**CPU, "id": 1}]),
            engines="[]", weights="{}", hardware="{}", created=now, last_report=now))
        repo.delete_node(conn, "node-0")
    ours, theirs = both()
    assert ours == theirs
    assert ours["nodes"]["total"] == 3 and ours["nodes"]["silent"] == 0
    assert ours["devices"]["cpu"]["total"] == 4
    assert sorted(ours["fabrics"]) == ["f", "g"]
