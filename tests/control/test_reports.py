"""The report path (control/reports.py): what a report changes, table-tested; and what a
steady node's report answered from a process's caches still guarantees when another
process (another gunicorn worker, the reconciler) changes the fleet, and that a change of
one node leaves the others' reports in the caches."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from llmgw_runtime.api.agent import ReplicaReport, Report
from llmgw_runtime.control import beats, reports
from llmgw_runtime.control.app import create_app
from llmgw_runtime.control.config import ControlConfig
from llmgw_runtime.control.decide import failure_of
from llmgw_runtime.control.reports import head_change, part_change, unchanged
from llmgw_runtime.store import Store, repo
from llmgw_runtime.store.changes import Changed

from .conftest import ADMIN, JOIN, ROUTER, Api, statements

CATALOG = """models:
  - name: tiny
    source: file:///models/tiny.gguf
    engine: llama.cpp
    profile: {class: cpu}
"""


def head(**kw: Any) -> Any:
    row = {"id": "r1", "node": "n1", "model": "tiny", "desired": 1, "state": "ready",
           "port": 9000, "pid": 42, "progress": None, "last_error": None}
    return SimpleNamespace(**{**row, **kw})


def said(rid: str = "r1", **kw: Any) -> ReplicaReport:
    """What an agent reports of a replica (or part): ready on port 9000, pid 42, then ``kw``."""
    return ReplicaReport.model_validate(
        {"id": rid, "state": "ready", "port": 9000, "pid": 42, "last_error": None, **kw})


READY = said()


@pytest.mark.parametrize("row,rep,expect", [
    (head(), READY, None),                                             # steady: no write
    (head(state="starting"), READY, {"state": "ready", "last_error": None}),
    (head(pid=41), READY, {"pid": 42}),                                # restarted engine
    (head(), said(state="stopped", last_error="oom"), {"state": "failed", "last_error": "oom"}),
    (head(), None, "lost"),                  # a restarted agent lost it: no failed start
    (head(state="starting"), None, "lost"),
    (head(state="fetching"), None, "lost"),
    (head(state="unreachable"), None, {"state": "failed"}),  # a router saw it gone
    (head(state="pending"), None, None),                               # not started yet
    (head(desired=0), None, "delete"),                                 # stopped as asked
    (head(desired=0), READY, None),                                    # still stopping
    (head(state="failed"), READY, None),                               # failed stays failed
    (head(state="unreachable"), READY, {"state": "ready"}),            # confirmed again
])
def test_what_a_report_changes_of_a_replica(row: Any, rep: Any, expect: Any) -> None:
    change = head_change(row, rep, 100.0)
    if expect is None:
        assert change is None
    elif expect in ("delete", "lost"):
        assert change is not None and change.delete and change.gone
        assert change.lost == (expect == "lost") and change.values is None
    else:
        assert change is not None and change.values is not None
        assert {k: change.values[k] for k in expect} == expect
        assert change.gone == (change.values["state"] == "failed")


def test_an_engine_that_starts_again_after_serving_long_is_no_failed_start() -> None:
    """A replica placed long ago (more than the start timeout) whose engine the agent
    starts again: the start timeout counts from the restart, so it is not a failed start
    (it was replaced and its model backed off, parked at the fifth in a row); one
    still starting a start timeout after the restart is."""
    placed, restarted = 0.0, 1000.0
    change = head_change(head(started=placed), said(state="starting", pid=43), restarted)
    assert change is not None and change.values is not None
    assert change.values["started"] == restarted and not change.gone
    row = head(**{**vars(head(started=placed)), **change.values})
    assert failure_of(row, [], restarted + 170.0, 180.0) is None
    assert "not ready within 180 s" in (failure_of(row, [], restarted + 190.0, 180.0) or "")
    ready = head_change(row, said(pid=43), restarted + 30.0)   # ready again: kept as it is
    assert ready is not None and ready.values is not None and "started" not in ready.values
    # a replica still starting for the first time keeps its placement time
    first = head_change(head(state="pending", started=placed), said(state="starting"), 50.0)
    assert first is not None and first.values is not None and "started" not in first.values


def test_a_worker_part_changes_only_when_its_state_or_process_does() -> None:
    part = SimpleNamespace(replica_id="r1", rank=1, node="n2", state="ready", pid=7)
    assert part_change(part, said("r1.w1", pid=7), 1.0) is None
    assert part_change(part, said("r1.w1", pid=8), 1.0)["pid"] == 8  # type: ignore[index]
    assert part_change(part, None, 1.0)["state"] == "failed"  # type: ignore[index]
    assert unchanged([head()], [part], {"r1": READY, "r1.w1": said("r1.w1", pid=7)})
    assert not unchanged([head()], [part], {"r1": READY})


# ------------------------------------------------------------------ two processes


@pytest.fixture
def two(store_url: str, tmp_path: Path) -> Any:
    """Two control processes' apps on one store (each its own Store and caches), as two
    gunicorn workers are."""
    config = ControlConfig(state_dir=tmp_path, admin_token=ADMIN, join_token=JOIN,
                           router_token=ROUTER, start_timeout_s=60)
    stores = [Store(store_url), Store(store_url)]
    stores[0].migrate()
    from llmgw_runtime.control.bootstrap import bootstrap
    bootstrap(stores[0], config)
    apis = [Api(create_app(config, store_=s).test_client(), s, config) for s in stores]
    yield apis
    for s in stores:
        s.dispose()


def settle() -> None:
    time.sleep(reports.GENERATION_TTL_S + 0.1)      # another process's change is seen


def test_a_reset_credential_stops_working_in_every_process(two: list[Api]) -> None:
    a, b = two
    cred = a.join()
    assert a.report(cred).status_code == 200
    assert a.report(cred).status_code == 200       # answered from a's caches
    assert b.call("POST", "/api/v1/nodes/n1/reset").status_code == 200
    settle()
    refused = a.report(cred)
    assert refused.status_code == 401, refused.json


def test_a_replica_placed_by_another_process_reaches_the_agent(two: list[Api]) -> None:
    a, b = two
    assert b.call("PUT", "/api/v1/catalog", data=CATALOG).status_code == 200
    cred = a.join()
    assert a.report(cred).json["assignments"] == []
    assert a.report(cred).json["assignments"] == []     # cached
    assert b.reconciler.run_cycle()                      # the reconciler: another process
    settle()
    [assignment] = a.report(cred).json["assignments"]
    assert assignment["model"] == "tiny"


def test_a_change_of_one_node_sends_only_that_nodes_next_report_through_a_transaction(
        two: list[Api]) -> None:
    """Per-node invalidation (issue 30): an old agent's full report stays answered from
    the caches when another node's replica changes in another process."""
    a, b = two
    assert b.call("PUT", "/api/v1/catalog", data=CATALOG).status_code == 200
    creds = {n: a.join(n) for n in ("n1", "n2")}
    for _ in range(2):
        for node, cred in creds.items():
            assert a.report(cred, node=node).status_code == 200     # cached the second time
    with b.store.begin() as conn:                   # another process adds n2 a replica
        repo.add_replica(conn, "r2", "tiny", "n2", (0,), b.store.now(conn))
    settle()
    checked: dict[str, list[str]] = {}
    for node, cred in creds.items():
        with credential_lookups(a.store) as seen:
            answer = a.report(cred, node=node)
        checked[node] = seen
        assert answer.status_code == 200
    assert checked["n1"] == [] and len(checked["n2"]) == 1
    assert [x["replica_id"] for x in a.report(creds["n2"], node="n2").json["assignments"]] \
        == ["r2"]


def credential_lookups(store: Store) -> contextlib.AbstractContextManager[list[str]]:
    """The statements that look a node credential up (the transaction path's first)."""
    return statements(store, "credential_hash")


def test_an_agent_back_after_stopping_is_used_again_whichever_worker_hears_it(
        two: list[Api]) -> None:
    a, b = two
    cred = a.join()
    assert a.report(cred).status_code == 200
    assert a.report(cred).status_code == 200            # a caches the node as alive
    assert b.report(cred, stopping=True).status_code == 200
    node = a.call("GET", "/api/v1/nodes").json["nodes"][0]
    assert node["last_report"] is None and "agent stopped" in node["problem"]
    for _ in range(2):                                   # the agent runs again
        assert a.report(cred).status_code == 200
    node = a.call("GET", "/api/v1/nodes").json["nodes"][0]
    assert node["last_report"] is not None and node["problem"] is None


def test_a_steady_report_refreshes_the_devices_shown(api: Api) -> None:
    cred = api.join()
    for used in (1000, 1000, 5000):                      # the last one from the caches
        assert api.report(cred, devices=[{**CPU_DEVICE, "memory_used_mb": used}]) \
            .status_code == 200
    node = api.call("GET", "/api/v1/nodes").json["nodes"][0]
    assert node["devices"][0]["memory_used_mb"] == 5000


CPU_DEVICE = {"id": 0, "uuid": "cpu-host", "card": 0, "mig": None, "class": "cpu",
              "memory_total_mb": 16000, "memory_used_mb": 1000, "healthy": True,
              "reason": None}


def test_batched_heartbeats_never_move_a_node_backwards_nor_revive_it(store: Store) -> None:
    with store.begin() as conn:
        now = store.now(conn)
        for name in ("up", "stopped"):
            repo.set_node_credential(conn, name, name * 8, now)
            repo.record_report(conn, name, Report(node=name, address="10.0.0.1"), now)
        repo.record_report(conn, "stopped", Report(node="stopped"), now, alive=False)
    forgotten: list[str] = []
    writer = beats.Heartbeats(lambda: store, forgotten.extend, every_s=0.05)
    writer.start()
    try:
        writer.put("up", now - 10, "[]")                  # older than what is stored
        writer.put("stopped", now + 1, "[]")
        deadline = time.monotonic() + 5
        while len(forgotten) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        writer.put("up", now + 2, '[{"id": 0}]')
    finally:
        writer.stop()                                     # writes what it still holds
    assert sorted(forgotten) == ["stopped", "up"]        # their next reports: in full
    with store.begin() as conn:
        up, stopped = repo.get_node(conn, "up"), repo.get_node(conn, "stopped")
    assert up is not None and stopped is not None
    assert up.last_report == pytest.approx(now + 2) and up.devices == '[{"id": 0}]'
    assert stopped.last_report is None


def test_a_replica_lost_with_a_restarted_agent_is_not_a_failed_start(api: Api) -> None:
    """`llmgw up` stopped with Ctrl-C (its engines stopped), then started again: the new
    agent does not run the ready replica. No failure, no backoff: a new replica at once."""
    api.call("PUT", "/api/v1/catalog", data=CATALOG)
    cred = api.join()
    api.report(cred)
    api.reconciler.run_cycle()
    rid = api.report(cred).json["assignments"][0]["replica_id"]
    api.report(cred, replicas=[{"id": rid, "state": "ready", "port": 41000, "pid": 7}])

    answer = api.report(cred, replicas=[])          # the restarted agent lost it
    assert answer.json["assignments"] == []
    api.reconciler.run_cycle()
    model = api.call("GET", "/api/v1/models/tiny").json
    kinds = [e["kind"] for e in api.call("GET", "/api/v1/events?limit=200").json["events"]]
    assert "failure" not in kinds and "backoff" not in kinds, kinds
    assert model["consecutive_failures"] == 0 and model["state"] == "starting", model
    [lost] = [e["message"] for e in api.call("GET", "/api/v1/events?limit=200").json["events"]
              if e["kind"] == "lost"]
    assert f"replica {rid} on n1 (ready) is gone" in lost and "not a failed start" in lost
    [again] = api.report(cred).json["assignments"]
    assert again["replica_id"] != rid               # placed again at once, no backoff


def test_what_a_transaction_read_is_cached_unless_a_change_it_missed_names_it() -> None:
    """A transaction that read under generation 5 finishes after this process applied
    changes up to 7: its node's answer is cached unless those changes named the node or a
    model it runs (the log moves with every node's device readings: caching must not wait
    for a still moment)."""
    cache = reports.ReportCache()

    def changed(gen: int, nodes: frozenset[str] = frozenset(),
                models: frozenset[str] = frozenset()) -> Changed:
        return Changed(gen, False, frozenset(nodes), frozenset(), frozenset(models),
                       frozenset())

    def put(node: str, models: set[str]) -> bool:
        answer = reports.Answer((), [], [], [], frozenset(models))
        cache.put(5, f"hash-{node}", reports.NodeEntry(node, None, None, None), answer,
                  (["s"], "h"))
        return node in cache.answers

    cache._apply(changed(5))
    cache._apply(changed(6, nodes=frozenset({"other"})))
    cache._apply(changed(7, models=frozenset({"big"})))
    assert put("n1", {"tiny"}) and cache.sources is None      # sources: a model changed
    assert not put("other", set())                           # named after 5
    assert not put("n2", {"big"})                            # runs a model changed after 5
    assert put("n3", set())                                  # nothing named it
    cache._apply(Changed(9, True, *[frozenset()] * 4))       # everything: forgot all
    assert not put("n4", set()) and cache.answers == {}      # nothing known since 5


def test_a_model_change_drops_the_sources_and_the_answers_running_it_only() -> None:
    cache = reports.ReportCache()
    cache._apply(Changed(1, False, *[frozenset()] * 4))
    for node, models in (("a", {"tiny"}), ("b", {"big"}), ("c", set())):
        cache.put(1, f"hash-{node}", reports.NodeEntry(node, None, None, None),
                  reports.Answer((), [], [], [], frozenset(models)), (["s"], "h"))
    assert sorted(cache.answers) == ["a", "b", "c"] and cache.sources == (["s"], "h")
    cache._apply(Changed(2, False, frozenset(), frozenset(), frozenset({"tiny"}),
                         frozenset()))
    assert sorted(cache.answers) == ["b", "c"] and sorted(cache.nodes) == ["hash-b", "hash-c"]
    assert cache.sources is None
    cache._apply(Changed(3, False, frozenset({"b", "c"}), frozenset({"c"}), frozenset(),
                         frozenset()))          # b's row changed; c's readings only
    assert sorted(cache.answers) == ["c"]


def test_while_one_request_reads_the_change_log_the_others_use_the_last_read_unless_this_process_committed_since(  # noqa: E501
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = reports.ReportCache()
    first = cache.current(store)
    assert first is not None
    monkeypatch.setattr(reports, "GENERATION_TTL_S", 0.0)     # every call reads it again

    def request() -> tuple[threading.Thread, list[int | None]]:
        got: list[int | None] = []
        thread = threading.Thread(target=lambda: got.append(cache.current(store)), daemon=True)
        thread.start()
        thread.join(0.5)
        return thread, got

    with cache._lock:                        # another request is reading the log now
        _, got = request()
        assert got == [first]                                # answered at once meanwhile
        with store.begin() as conn:                          # a commit of this process
            repo.set_node_credential(conn, "n1", "h" * 32, 1.0)
            repo.record_report(conn, "n1", Report(node="n1", address="10.0.0.1"), 1.0)
        waiting, got = request()
        assert waiting.is_alive() and got == []             # it waits for a read of its own
    waiting.join(5)
    assert got and got[0] is not None and got[0] > first
