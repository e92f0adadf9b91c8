"""What revision 0015 stores, on both backends: a replica's definition and launch, its
drain; a model deleted while its replicas drain; a node's cordon and drain; the rollout
state merged on the row as it is now."""

from __future__ import annotations

import json

from llmgw_runtime.catalog import parse as catalog
from llmgw_runtime.control import drain, fleet
from llmgw_runtime.store import Store, repo

CAT = """models:
  - {name: a, source: /a.gguf, engine: llama.cpp, profile: {class: cpu}}
  - {name: b, source: /b.gguf, engine: llama.cpp, profile: {class: cpu}}
"""


def setup(store: Store) -> None:
    with store.begin() as conn:
        repo.apply_catalog(conn, catalog.parse(CAT), 1.0)
        repo.set_node_credential(conn, "n1", "x" * 64, 1.0)


def test_a_replica_keeps_its_definition_and_shows_whether_it_is_current(store: Store) -> None:
    setup(store)
    with store.begin() as conn:
        repo.add_replica(conn, "r-1", "a", "n1", (0,), 2.0, definition_hash="old",
                         launch=json.dumps({"engine": "llama.cpp", "source": "/a.gguf"}))
        row = repo.get_replica(conn, "r-1")
        [listed] = repo.list_replicas(conn)
    assert row.definition_hash == "old" and json.loads(row.launch)["source"] == "/a.gguf"
    assert fleet.replica_view(listed)["current"] is False
    assert fleet.replica_view(listed)["draining"] is None


def test_a_draining_replica_shows_why_what_is_in_flight_and_what_time_is_left(
        store: Store) -> None:
    setup(store)
    with store.begin() as conn:
        repo.add_replica(conn, "r-1", "a", "n1", (0,), 2.0)
        repo.update_replica(conn, "r-1", **drain.drain_values(drain.IDLE, 30.0, 10.0))
        repo.update_replica(conn, "r-1", in_flight=drain.record_in_flight(None, "r/1", 2,
                                                                          12.0))
        [row] = repo.draining_replicas(conn, lock=True)
    assert fleet.replica_view(row, now=20.0)["draining"] == {
        "reason": "idle stop", "in_flight": 2, "left_s": 20.0, "since": 10.0}


def test_a_model_with_a_running_replica_is_deleted_once_it_drained(store: Store) -> None:
    setup(store)
    with store.begin() as conn:
        repo.add_replica(conn, "r-1", "a", "n1", (0,), 2.0)
        assert repo.delete_model(conn, "a", 3.0) and repo.delete_model(conn, "b", 3.0)
        assert [m.name for m in repo.list_models(conn)] == []
        assert [m.name for m in repo.list_models(conn, deleted=True)] == ["a"]   # b: at once
        assert repo.get_model(conn, "a") is None
        assert repo.get_model(conn, "a", deleted=True).deleted_at == 3.0
        assert not repo.delete_model(conn, "a", 4.0)          # already deleted
        again = repo.apply_catalog(conn, catalog.parse(CAT), 5.0)
        assert again["created"] == ["a", "b"]
        assert repo.get_model(conn, "a").deleted_at is None


def test_prune_marks_what_runs_and_deletes_what_does_not(store: Store) -> None:
    setup(store)
    with store.begin() as conn:
        repo.add_replica(conn, "r-1", "a", "n1", (0,), 2.0)
        result = repo.apply_catalog(conn, [], 3.0, prune=True)
        again = repo.apply_catalog(conn, [], 4.0, prune=True)
        assert result["deleted"] == ["a", "b"] and again["deleted"] == []
        assert [m.name for m in repo.list_models(conn, deleted=True)] == ["a"]


def test_a_nodes_cordon_and_drain_are_stored_and_shown(store: Store) -> None:
    setup(store)
    with store.begin() as conn:
        assert repo.set_node_drain(conn, "n1", True, {"since": 5.0, "total": 2})
        assert not repo.set_node_drain(conn, "nope", True, None)
        shown = fleet.node_view(repo.get_node(conn, "n1"))
        assert (shown["cordoned"], shown["draining"]) == (True, True)
        repo.set_node_drain(conn, "n1", True, {"since": 5.0, "total": 2, "done": 9.0})
        shown = fleet.node_view(repo.get_node(conn, "n1"))
        assert (shown["cordoned"], shown["draining"]) == (True, False)


def test_the_rollout_state_is_merged_and_the_cut_count_adds_up(store: Store) -> None:
    setup(store)
    with store.begin() as conn:
        repo.merge_rollout_state(conn, "a", {"state": "rolling", "since": 1.0}, cut=2)
        repo.merge_rollout_state(conn, "a", {"state": None, "since": None}, cut=3)
        assert json.loads(repo.get_model(conn, "a").rollout_state) == {"cut": 5}
        assert repo.model_to_dict(repo.get_model(conn, "a"))["rollout_state"] == {"cut": 5}
        assert repo.merge_rollout_state(conn, "nope", {"state": "x"}) is None
