"""Rollouts, drains and node drains through the real store (SQLite and PostgreSQL), the
reconciler and the agent and router endpoints: what an operator and the routers see at
each step."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from llmgw_runtime.control import drain_ops, fleet, rollout_ops
from llmgw_runtime.errors import ConflictError, NotFoundError
from llmgw_runtime.store import repo

from .conftest import ROUTER, Api

V1 = """models:
  - name: tiny
    source: /m/tiny.gguf
    engine: llama.cpp
    profile: {class: cpu}
    args: ["-c", "2048"]
"""
V2 = V1.replace('"2048"', '"4096"')
OTHER = """  - name: other
    source: /m/other.gguf
    engine: llama.cpp
    profile: {class: cpu}
"""


def put(api: Api, text: str, **query: str) -> Any:
    resp = api.call("PUT", "/api/v1/catalog", data=text, query_string=query,
                    headers={"Content-Type": "application/yaml"})
    assert resp.status_code == 200, resp.json
    return resp.json


def quick(api: Api) -> None:
    """Drains settle at once (the routers in these tests post before the pass)."""
    api.reconciler.settings = dataclasses.replace(api.reconciler.settings,
                                                  drain_settle_s=0.0)


def report(api: Api, cred: str, ready: list[str], node: str = "n1") -> list[dict[str, Any]]:
    resp = api.report(cred, node, replicas=[{"id": rid, "state": "ready", "port": 41000 + i,
                                             "pid": 1} for i, rid in enumerate(ready)])
    assert resp.status_code == 200, resp.json
    return list(resp.json["assignments"])


def idle(api: Api, in_flight: dict[str, int], worker: str = "1") -> None:
    resp = api.call("POST", "/api/v1/idle", ROUTER, json={
        "replicas": {}, "router": "r", "worker": worker, "in_flight": in_flight})
    assert resp.status_code == 204, resp.json


def routes(api: Api, name: str = "tiny") -> dict[str, Any]:
    table = api.call("GET", "/api/v1/routes", ROUTER).json
    return next(m for m in table["models"] if m["name"] == name)


def call(api: Api, fn: Any, name: str, *rest: Any, **kw: Any) -> Any:
    """``fn(conn, name, now, *rest, **kw)`` in a transaction of its own."""
    with api.store.begin() as conn:
        return fn(conn, name, api.store.now(conn), *rest, **kw)


def running(api: Api, text: str = V1) -> tuple[str, str]:
    """The catalog applied, node n1 reporting, one ready replica: (credential, id)."""
    quick(api)
    put(api, text)
    cred = api.join()
    report(api, cred, [])
    api.reconciler.run_cycle()
    assigned = [a["replica_id"] for a in report(api, cred, [])]
    report(api, cred, assigned)
    [tiny] = [a["replica_id"] for a in report(api, cred, assigned) if a["model"] == "tiny"]
    return cred, tiny


def test_a_new_definition_rolls_with_no_request_without_a_replica(api: Api) -> None:
    cred, old = running(api)
    dry = api.call("PUT", "/api/v1/catalog/dry-run", data=V2).json
    assert dry["rolls"] == ["tiny"] and dry["dry_run"]
    assert put(api, V2)["rolls"] == ["tiny"]
    status = call(api, rollout_ops.rollout_status, "tiny", None)
    assert (status.state, status.old_total, status.new_total) == ("rolling", 1, 0)
    assert status.previous is not None and status.previous != status.definition
    api.reconciler.run_cycle()                       # the new one starts beside the old
    got = {a["replica_id"]: a["args"] for a in report(api, cred, [old])}
    new = next(rid for rid in got if rid != old)
    assert got == {old: ["-c", "2048"], new: ["-c", "4096"]}     # the old keeps its args
    report(api, cred, [old, new])
    api.reconciler.run_cycle()                       # the new one is ready: the old drains
    table = routes(api)
    assert [e["replica_id"] for e in table["endpoints"]] == [new]
    assert table["draining"] == [old] and table["state"] == "ready"
    idle(api, {old: 1})
    api.reconciler.run_cycle()
    with api.store.begin() as conn:
        [row] = [r for r in repo.list_replicas(conn) if r.id == old]
        shown = fleet.replica_view(row, [], api.store.now(conn))
    assert row.desired and shown["draining"]["in_flight"] == 1 and not shown["current"]
    idle(api, {})                                    # its last request finished
    api.reconciler.run_cycle()
    assert not any(a["replica_id"] == old for a in report(api, cred, [new]))
    report(api, cred, [new])                         # the agent stopped it: the row goes
    api.reconciler.run_cycle()
    status = call(api, rollout_ops.rollout_status, "tiny", None)
    assert (status.state, status.new_ready, status.old_total) == ("none", 1, 0)
    events = [e["message"] for e in api.call("GET", "/api/v1/events").json["events"]]
    assert any(m.startswith("rollout of tiny done") for m in events)
    assert any("drained after" in m for m in events)


def test_undo_applies_the_previous_definition_and_promote_needs_a_canary(api: Api) -> None:
    running(api)
    with pytest.raises(ConflictError, match="no previous definition"):
        call(api, rollout_ops.rollout_undo, "tiny", by="t")
    put(api, V2)
    with pytest.raises(ConflictError, match="no canary to promote"):
        call(api, rollout_ops.rollout_promote, "tiny", by="t")
    status = call(api, rollout_ops.rollout_undo, "tiny", by="t")
    assert status.state == "none"                  # the running replica is the old one
    with api.store.begin() as conn:
        assert '"2048"' in repo.get_model(conn, "tiny").args
    with pytest.raises(NotFoundError):
        call(api, rollout_ops.rollout_status, "nope", None)


def test_a_canary_holds_until_promoted(api: Api) -> None:
    cred, old = running(api, V1.replace("args:", "rollout: {canary_percent: 10}\n    args:"))
    put(api, V2.replace("args:", "rollout: {canary_percent: 10}\n    args:"))
    api.reconciler.run_cycle()
    new = next(a["replica_id"] for a in report(api, cred, [old]) if a["replica_id"] != old)
    report(api, cred, [old, new])
    api.reconciler.run_cycle()
    table = routes(api)
    assert table["canary_percent"] == 10 and table["draining"] == []
    assert {e["replica_id"]: e["canary"] for e in table["endpoints"]} == {old: False,
                                                                          new: True}
    api.call("POST", "/api/v1/idle", ROUTER, json={"replicas": {}, "router": "r",
                                                   "worker": "1", "versions": {"tiny": {
                                                       "canary": {"requests": 4}}}})
    status = call(api, rollout_ops.rollout_promote, "tiny", by="t")
    assert status.state == "rolling" and status.versions["canary"].requests == 4
    api.reconciler.run_cycle()
    assert routes(api)["draining"] == [old] and routes(api)["canary_percent"] == 0


def test_a_deleted_model_leaves_every_list_and_its_replica_drains_first(api: Api) -> None:
    cred, rid = running(api, V1 + OTHER)
    api.call("DELETE", "/api/v1/models/tiny")
    assert [m["name"] for m in api.call("GET", "/api/v1/models").json["models"]] == ["other"]
    assert [m["name"] for m in api.call("GET", "/api/v1/routes", ROUTER).json["models"]] \
        == ["other"]
    idle(api, {rid: 2})
    api.reconciler.run_cycle()
    assert any(a["replica_id"] == rid for a in report(api, cred, [rid]))   # still runs
    idle(api, {})
    api.reconciler.run_cycle()
    report(api, cred, [])
    api.reconciler.run_cycle()
    with api.store.begin() as conn:
        assert repo.get_model(conn, "tiny", deleted=True) is None
    assert put(api, V1 + OTHER)["created"] == ["tiny"]


def test_applying_a_deleted_name_again_brings_it_back(api: Api) -> None:
    cred, rid = running(api, V1 + OTHER)
    assert put(api, OTHER.join(["models:\n", ""]), prune="true")["deleted"] == ["tiny"]
    with api.store.begin() as conn:
        assert repo.get_model(conn, "tiny") is None
        assert repo.get_model(conn, "tiny", deleted=True) is not None
    assert put(api, V1 + OTHER)["created"] == ["tiny"]
    api.reconciler.run_cycle()
    assert [a["replica_id"] for a in report(api, cred, [rid])
            if a["model"] == "tiny"] == [rid]       # served again, nothing new started


def test_drain_cut_counts_survive_as_a_total(api: Api) -> None:
    cred, rid = running(api)
    with api.store.begin() as conn:
        repo.update_model(conn, "tiny", drain_timeout_s=1.0, replicas=0)
        repo.merge_rollout_state(conn, "tiny", {}, cut=2)
        repo.update_replica(conn, rid, drain_since=api.store.now(conn) - 5,
                            drain_reason="scale-down", drain_timeout_s=1.0)
    idle(api, {rid: 3})
    api.reconciler.run_cycle()
    with api.store.begin() as conn:
        assert fleet.drain_cut_totals(conn) == {"tiny": 5}
        assert rollout_ops.rollout_failed(conn) == {"tiny": 0}
        assert any("cutting them" in e["message"] for e in repo.list_events(conn, 5))


def test_cordon_and_drain_of_a_node(api: Api) -> None:
    cred, rid = running(api)
    with pytest.raises(NotFoundError):
        call(api, drain_ops.cordon, "nope", "t", on=True)
    answer = call(api, drain_ops.cordon, "n1", "t", on=True)
    assert answer.cordoned and not answer.draining
    assert api.call("GET", "/api/v1/nodes").json["nodes"][0]["cordoned"] is True
    settings = api.reconciler.settings
    with pytest.raises(ConflictError) as refused:
        call(api, drain_ops.drain_node, "n1", settings, force=False, by="t")
    assert "tiny" in str(refused.value) and "--force" in str(refused.value)
    cred2 = api.join("n2")
    report(api, cred2, [], node="n2")
    answer = call(api, drain_ops.drain_node, "n1", settings, force=False, by="t")
    assert (answer.draining, answer.moved, answer.total) == (True, 0, 1)
    api.reconciler.run_cycle()                       # the replacement first, on n2
    [new] = [a["replica_id"] for a in report(api, cred2, [], node="n2")]
    status = call(api, drain_ops.node_drain_status, "n1", settings)
    assert status.waiting_for.startswith(f"{new} (tiny) on n2 to be ready")
    report(api, cred2, [new], node="n2")
    api.reconciler.run_cycle()                       # then the old one drains
    assert routes(api)["draining"] == [rid]
    idle(api, {})
    api.reconciler.run_cycle()
    report(api, cred, [])
    api.reconciler.run_cycle()
    status = call(api, drain_ops.node_drain_status, "n1", settings)
    assert (status.done, status.moved, status.total, status.cordoned) == (True, 1, 1, True)
    assert any(e["message"].startswith("node n1 drained") for e in
               api.call("GET", "/api/v1/events").json["events"])
    answer = call(api, drain_ops.cordon, "n1", "t", on=False)
    assert not answer.cordoned and not answer.draining


def test_a_forced_drain_with_no_room_names_what_loses_capacity(api: Api) -> None:
    running(api)
    answer = call(api, drain_ops.drain_node, "n1", api.reconciler.settings, force=True,
                  by="t")
    assert answer.lose_capacity == ["tiny"] and answer.draining
