"""Heartbeats (issue 30): a steady node's small message, answered from the control
process's memory; a change elsewhere in the fleet leaves it there, a change of its own
node reaches it; a heartbeat the process cannot place asks for the full report; a hostile
one is refused naming the field. On SQLite and PostgreSQL (the ``api`` fixture)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import event

from llmgw_runtime.api.agent import report_digest
from llmgw_runtime.control import beats, heartbeat, reports
from llmgw_runtime.control.agent_api import SteadyHeartbeats
from llmgw_runtime.store import changes, repo

from .conftest import CPU, Api, statements

CATALOG = """models:
  - name: tiny
    source: file:///models/tiny.gguf
    engine: llama.cpp
    profile: {class: cpu}
"""
HEARTBEAT = "/api/v1/agent/heartbeat"


def full(api: Api, cred: str, node: str = "n1", **extra: Any) -> tuple[Any, str]:
    """A full report as an agent sends it; returns the answer and the report's digest."""
    body = json.dumps({"node": node, "address": "127.0.0.1", "agent_version": "t",
                       "devices": [CPU], "engines": ["llama.cpp"], "weights": {},
                       "replicas": [], **extra}).encode()
    answer = api.call("POST", "/api/v1/agent/report", cred, data=body,
                      content_type="application/json")
    assert answer.status_code == 200, answer.json
    return answer.json, report_digest(body)


def beat(api: Api, cred: str, digest: str, node: str = "n1", **extra: Any) -> Any:
    return api.call("POST", HEARTBEAT, cred, json={"node": node, "digest": digest, **extra})


@pytest.fixture
def batched(api: Api, monkeypatch: pytest.MonkeyPatch) -> Iterator[beats.Heartbeats]:
    """The app's heartbeat writer batching (as in a gunicorn worker), flushed by hand."""
    beats: beats.Heartbeats = api.client.application.extensions["llmgw.heartbeats"]
    beats.every_s = 3600
    beats.start()
    yield beats
    beats.stop()


def placed(api: Api, cred: str) -> tuple[str, str]:
    """n1 runs tiny's replica, ready and steady; returns its id and the last digest."""
    assert api.call("PUT", "/api/v1/catalog", data=CATALOG).status_code == 200
    full(api, cred)
    api.reconciler.run_cycle()
    [assignment], _ = full(api, cred)[0]["assignments"], None
    rid = assignment["replica_id"]
    ready = [{"id": rid, "model": "tiny", "state": "ready", "port": 41000, "pid": 7}]
    for _ in range(2):                  # the write, then the same again: from the caches
        answer, digest = full(api, cred, replicas=ready)
    assert [a["replica_id"] for a in answer["assignments"]] == [rid]
    return rid, digest


def test_a_steady_heartbeat_is_answered_from_memory_with_no_store_statement(
        api: Api, batched: beats.Heartbeats, monkeypatch: pytest.MonkeyPatch) -> None:
    cred = api.join()
    rid, digest = placed(api, cred)
    assert beat(api, cred, digest).status_code == 200     # the caches are current now
    monkeypatch.setattr(reports, "GENERATION_TTL_S", 60.0)
    moves = api.store.moves
    with statements(api.store) as sql:
        for used in (1000, 1000, 3000):                   # readings change: still steady
            answer = beat(api, cred, digest, devices=[{**CPU, "memory_used_mb": used}])
            assert answer.status_code == 200, answer.json
            assert not answer.json.get("full_report")
            assert [a["replica_id"] for a in answer.json["answer"]["assignments"]] == [rid]
    assert sql == [] and api.store.moves == moves
    with api.store.begin() as conn:
        last = changes.since(conn, None).generation
    batched.flush()                                       # one batched write of them
    with api.store.begin() as conn:
        node = repo.get_node(conn, "n1")
        logged = changes.since(conn, last)
    assert node is not None and json.loads(node.devices)[0]["memory_used_mb"] == 3000
    assert logged.nodes == {"n1"} and logged.telemetry_only == {"n1"}


def test_a_change_of_another_node_leaves_the_heartbeat_in_memory_and_one_of_this_node_reaches_it(  # noqa: E501
        api: Api, batched: beats.Heartbeats, monkeypatch: pytest.MonkeyPatch) -> None:
    cred, other = api.join(), api.join("n2")
    full(api, other, node="n2")
    rid, digest = placed(api, cred)
    assert beat(api, cred, digest).status_code == 200
    monkeypatch.setattr(reports, "GENERATION_TTL_S", 0.0)  # every request reads the log
    with api.store.begin() as conn:                       # a replica of n2's changes
        repo.add_replica(conn, "elsewhere", "tiny", "n2", (0,), api.store.now(conn))
    with statements(api.store) as sql:
        answer = beat(api, cred, digest)
    assert [a["replica_id"] for a in answer.json["answer"]["assignments"]] == [rid]
    touched = [s for s in sql if "nodes" in s or "replicas" in s]
    assert touched == [], touched                        # not the transaction path

    with api.store.begin() as conn:                       # now n1's own replica stops
        repo.update_replica(conn, rid, desired=0)
        repo.add_replica(conn, "mine", "tiny", "n1", (0,), api.store.now(conn))
    answer = beat(api, cred, digest)
    assert [a["replica_id"] for a in answer.json["answer"]["assignments"]] == ["mine"]


def test_a_replica_state_in_a_heartbeat_is_written(api: Api) -> None:
    cred = api.join()
    assert api.call("PUT", "/api/v1/catalog", data=CATALOG).status_code == 200
    full(api, cred)
    api.reconciler.run_cycle()
    answer, digest = full(api, cred)
    rid = answer["assignments"][0]["replica_id"]
    ready = [{"id": rid, "model": "tiny", "state": "ready", "port": 41000, "pid": 7}]
    answer = beat(api, cred, digest, replicas=ready)
    assert answer.status_code == 200 and answer.json["answer"]["assignments"]
    with api.store.begin() as conn:
        row = repo.get_replica(conn, rid)
    assert row is not None and (row.state, row.port, row.pid) == ("ready", 41000, 7)
    events = api.call("GET", "/api/v1/events?limit=50").json["events"]
    assert any(e["kind"] == "ready" and rid in e["message"] for e in events)


def test_a_heartbeat_this_process_cannot_place_asks_for_the_full_report(api: Api) -> None:
    cred = api.join()
    _, digest = full(api, cred)
    assert beat(api, cred, "0" * 64).json == {"full_report": True}
    api.client.application.extensions["llmgw.reports"].reports.clear()   # a restart
    assert beat(api, cred, digest).json == {"full_report": True}
    _, newer = full(api, cred, fabric="rack-2")
    assert beat(api, cred, digest).json == {"full_report": True}   # not the last one sent
    assert beat(api, cred, newer).json["answer"]["assignments"] == []


def test_a_heartbeat_with_a_wrong_or_another_nodes_credential_is_refused(api: Api) -> None:
    cred, other = api.join(), api.join("n2")
    _, digest = full(api, cred)
    assert beat(api, "llmgw-node-" + "x" * 40, digest).status_code == 401
    assert beat(api, other, digest).status_code == 403
    assert beat(api, other, "0" * 64).status_code == 403


HOSTILE = [
    ("digest", "not-a-digest", "digest"),
    ("node", "n 1", "node"),
    ("replicas", [{"id": f"r{i}", "state": "ready"} for i in range(4097)], "replicas"),
    ("replicas", [{"id": "r1", "state": "ready"}] * 2, "replicas: id 'r1' appears twice"),
    ("devices", [{**CPU, "memory_used_mb": -1}], "devices[0].memory_used_mb"),
    ("sources", ["x"], "sources"),
]


def test_a_hostile_heartbeat_is_a_400_naming_the_field(api: Api) -> None:
    cred = api.join()
    _, digest = full(api, cred)
    moves = api.store.moves
    for field, value, named in HOSTILE:
        body = {"node": "n1", "digest": digest, field: value}
        answer = api.call("POST", HEARTBEAT, cred, json=body)
        assert answer.status_code == 400, (field, answer.json)
        assert any(d.startswith(named) for d in answer.json["error"]["details"]), answer.json
    assert api.store.moves == moves


def test_a_steady_heartbeat_is_answered_before_flask_with_the_views_own_bytes(
        api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    cred = api.join()
    _, digest = placed(api, cred)
    app = api.client.application
    layer = app.wsgi_app
    assert isinstance(layer, SteadyHeartbeats)
    hooks: list[str] = []
    app.before_request_funcs.setdefault(None, []).append(lambda: hooks.append("flask"))
    fast = beat(api, cred, digest)
    assert fast.status_code == 200 and hooks == []     # no Flask request was made
    monkeypatch.setattr(app, "wsgi_app", layer.inner)  # the view alone
    slow = beat(api, cred, digest)
    assert hooks == ["flask"]
    assert fast.data == slow.data
    assert fast.headers["Content-Type"] == slow.headers["Content-Type"] == "application/json"


def test_an_address_refused_for_wrong_tokens_gets_the_views_429_not_a_steady_answer(
        api: Api) -> None:
    cred = api.join()
    _, digest = placed(api, cred)
    assert beat(api, cred, digest).status_code == 200
    wrong = "llmgw-node-" + "x" * 40
    statuses = [beat(api, wrong, digest).status_code for _ in range(12)]
    assert statuses[-1] == 429
    refused = beat(api, cred, digest)                  # the right credential, same address
    assert refused.status_code == 429 and refused.headers["Retry-After"]


def test_a_repeated_heartbeat_gets_its_last_bytes_until_what_answered_it_changes(
        api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    cred = api.join()
    rid, digest = placed(api, cred)
    parsed: list[str] = []
    real = heartbeat.parse_json

    def counting(model: Any, raw: bytes, what: str) -> Any:
        parsed.append(what)
        return real(model, raw, what=what)

    monkeypatch.setattr(heartbeat, "parse_json", counting)
    first = beat(api, cred, digest)
    assert first.status_code == 200 and parsed == ["heartbeat"]
    again = beat(api, cred, digest)                    # the same bytes: not parsed again
    assert again.data == first.data and parsed == ["heartbeat"]
    readings = beat(api, cred, digest, devices=[{**CPU, "memory_used_mb": 5}])
    assert readings.status_code == 200 and parsed == ["heartbeat"] * 2
    beat(api, cred, digest)                            # other bytes than the last: parsed
    assert parsed == ["heartbeat"] * 3
    elsewhere = api.call("POST", HEARTBEAT, cred, json={"node": "n1", "digest": digest},
                         environ_base={"REMOTE_ADDR": "127.0.0.2"})
    assert elsewhere.status_code == 200 and len(parsed) > 3   # another address: decided
    beat(api, cred, digest)
    with api.store.begin() as conn:                    # n1's replica stops: a new answer
        repo.update_replica(conn, rid, desired=0)
    monkeypatch.setattr(reports, "GENERATION_TTL_S", 0.0)
    moved = beat(api, cred, digest)
    assert moved.status_code == 200 and moved.json["answer"]["assignments"] == []


def test_unchanged_devices_are_not_sent_again_unless_another_writer_wrote_the_node(
        api: Api, batched: beats.Heartbeats, monkeypatch: pytest.MonkeyPatch) -> None:
    cred = api.join()
    _, digest = placed(api, cred)
    monkeypatch.setattr(reports, "GENERATION_TTL_S", 0.0)   # every request reads the log
    mine, theirs = [{**CPU, "memory_used_mb": 1000}], [{**CPU, "memory_used_mb": 9}]
    sent: list[Any] = []

    def note(conn: Any, cursor: Any, sql: str, params: Any, *args: Any) -> None:
        if sql.startswith("UPDATE nodes SET last_report"):    # with the devices or not
            values = params.values() if isinstance(params, dict) else params
            sent.append(any("memory_used_mb" in str(v) for v in values))

    def stored() -> Any:
        with api.store.begin() as conn:
            node = repo.get_node(conn, "n1")
        assert node is not None
        return json.loads(node.devices)[0]["memory_used_mb"]

    event.listen(api.store.engine, "before_cursor_execute", note)
    try:
        for _ in range(3):                                   # the same readings
            assert beat(api, cred, digest, devices=mine).status_code == 200
            batched.flush()
        assert stored() == 1000
        # the first logged them (this process then sends them once more, as it would
        # after another writer's change); from then on the batch moves the time only
        assert sent[0] and not sent[-1]
        with api.store.begin() as conn:                      # another host writes n1
            # after this process's last batch: that may be stamped ahead of the store's
            # clock by up to half the round trip that measured their offset (Store.clock:
            # tens of milliseconds on a busy machine), and a batch never goes backwards
            node = repo.get_node(conn, "n1")
            assert node is not None
            at = max(api.store.now(conn), node.last_report + 0.001)
            repo.record_heartbeats(conn, [("n1", at, json.dumps(theirs))], telemetry=["n1"])
        assert stored() == 9
        assert beat(api, cred, digest, devices=mine).status_code == 200
        batched.flush()
        assert stored() == 1000                              # what this agent says, again
    finally:
        event.remove(api.store.engine, "before_cursor_execute", note)


def test_a_catalog_apply_elsewhere_leaves_steady_heartbeats_in_memory(
        api: Api, batched: beats.Heartbeats, monkeypatch: pytest.MonkeyPatch) -> None:
    cred = api.join()
    rid, digest = placed(api, cred)
    assert beat(api, cred, digest).status_code == 200
    monkeypatch.setattr(reports, "GENERATION_TTL_S", 0.0)   # every request reads the log
    parsed: list[str] = []
    real = heartbeat.parse_json
    monkeypatch.setattr(heartbeat, "parse_json",
                        lambda model, raw, what: parsed.append(what) or real(model, raw,
                                                                            what=what))
    other = CATALOG + """  - name: other
    source: file:///models/tiny.gguf
    engine: llama.cpp
    profile: {class: h100-80g}
    replicas: %d
"""
    for replicas in (1, 2):                       # a model n1 does not run: added, changed
        assert api.call("PUT", "/api/v1/catalog", data=other % replicas).status_code == 200
        with statements(api.store) as sql:
            answer = beat(api, cred, digest)
        assert [a["replica_id"] for a in answer.json["answer"]["assignments"]] == [rid]
        touched = [s for s in sql if "nodes" in s or "replicas" in s]
        assert touched == [], touched              # not the transaction path
    assert parsed == []                            # the same sources: the same answer
