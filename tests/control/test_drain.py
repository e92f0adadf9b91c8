"""Graceful stops, table-tested on the pure rules (control/drain.py) and ``decide``: a ready
replica that is to stop drains first, stops once every router says nothing is in flight
(after the routes settled) or when its timeout cuts what is left (counted), serves again
when its model wants it back; a node drain moves replicas with a replacement first."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from llmgw_runtime.control import drain
from llmgw_runtime.control.decide import decide

from .test_decide import NOW, fleet, model, node, replica, settings

GPU = {"id": 0, "uuid": "g0", "class": "a100", "memory_total_mb": 80000,
       "memory_used_mb": 0, "healthy": True}


def draining(rid: str = "r-1", since: float = NOW - 5, reason: str = drain.SCALE_DOWN,
             in_flight: dict[str, list[float]] | None = None, timeout: float = 120.0,
             **kw: Any) -> SimpleNamespace:
    return replica(rid, drain_since=since, drain_reason=reason, drain_timeout_s=timeout,
                   in_flight=json.dumps(in_flight) if in_flight is not None else None, **kw)


def gpu_node(name: str = "n1", count: int = 1, **kw: Any) -> SimpleNamespace:
    devices = [{**GPU, "id": i, "uuid": f"{name}-g{i}"} for i in range(count)]
    return node(name, devices=json.dumps(devices), **kw)


def gpu_model(name: str = "m", **kw: Any) -> SimpleNamespace:
    return model(name, profile=json.dumps({"class": "a100"}), **kw)


# ------------------------------------------------------------------ the rule


@pytest.mark.parametrize("since,in_flight,timeout,expected", [
    (NOW - 1, {}, 120, None),                                   # routes not settled yet
    (NOW - 3, {}, 120, 0),                                      # settled, nobody posts
    (NOW - 5, {"r/1": [0, NOW - 1], "r/2": [0, NOW]}, 120, 0),  # every worker says 0
    (NOW - 5, {"r/1": [2, NOW - 1], "r/2": [0, NOW]}, 120, None),   # one still has 2
    (NOW - 5, {"r/1": [2, NOW - 30]}, 120, 0),                  # that worker went silent
    (NOW - 120, {"r/1": [3, NOW], "r/2": [1, NOW - 2]}, 120, 4),    # timeout: 4 cut
    (NOW - 60, {"r/1": [3, NOW]}, 30, 3),                       # the model's own timeout
])
def test_a_draining_replica_stops_when_drained_or_timed_out(
        since: float, in_flight: dict[str, list[float]], timeout: float,
        expected: int | None) -> None:
    found = drain.verdict(draining(since=since, in_flight=in_flight, timeout=timeout), NOW)
    assert (found.cut if found else None) == expected
    if found is not None and found.cut:
        assert f"{found.cut} request(s) in flight" in found.message


def test_a_worker_post_keeps_the_others_and_forgets_the_long_silent() -> None:
    stored = json.dumps({"a/1": [2, NOW - 5], "b/1": [1, NOW - 100]})
    assert json.loads(drain.record_in_flight(stored, "a/2", 3, NOW)) == {
        "a/1": [2, NOW - 5], "a/2": [3, NOW]}


def test_what_ctl_replicas_shows_of_a_draining_replica() -> None:
    rep = draining(since=NOW - 80, in_flight={"r/1": [3, NOW - 1], "r/2": [9, NOW - 60]})
    assert drain.view(rep, NOW) == {"reason": "scale-down", "in_flight": 3, "left_s": 40.0,
                                    "since": NOW - 80}
    assert drain.view(replica(), NOW) is None
    # without the clock, the routers' latest post (every second) stands for it
    assert drain.view(rep, None) == {"reason": "scale-down", "in_flight": 3, "left_s": 41.0,
                                     "since": NOW - 80}


# ------------------------------------------------------------------ in a pass


def test_a_ready_replica_scaled_down_drains_and_a_starting_one_stops_at_once() -> None:
    reps = [replica("r-1", started=NOW - 100), replica("r-2", state="starting",
                                                        started=NOW - 50),
            replica("r-3", started=NOW - 90)]
    changes = decide(fleet([model(replicas=1)], [node()], reps), NOW, settings())
    assert [rid for rid, _ in changes.stops] == ["r-2"]                 # serves nothing
    assert [(rid, why) for rid, why, _ in changes.drains] == [("r-3", "scale-down")]


def test_a_replica_on_a_silent_node_stops_at_once() -> None:
    nodes = [node("gone", last_report=NOW - 200), node("n2")]
    changes = decide(fleet([model()], nodes, [replica(node_="gone")]), NOW, settings())
    assert [rid for rid, _ in changes.stops] == ["r-1"] and not changes.drains


def test_a_drained_replica_stops_and_a_timed_out_one_counts_what_it_cut() -> None:
    m = model(replicas=0, drain_timeout_s=30.0)
    reps = [draining("r-1", since=NOW - 5, in_flight={"r/1": [0, NOW]}),
            draining("r-2", since=NOW - 31, timeout=30.0, in_flight={"r/1": [2, NOW]}),
            draining("r-3", since=NOW - 10, in_flight={"r/1": [1, NOW]})]
    changes = decide(fleet([m], [node()], reps), NOW, settings())
    assert sorted(rid for rid, _ in changes.stops) == ["r-1", "r-2"]     # r-3 still has 1
    assert changes.cuts == {"m": 2}
    assert any("cutting them" in text for kind, _, text in changes.events if kind == "stop")


def test_a_draining_replica_that_fails_or_loses_its_node_goes_at_once() -> None:
    nodes = [node(), node("gone", last_report=NOW - 100)]
    reps = [draining("r-1", state="failed"), draining("r-2", node_="gone")]
    changes = decide(fleet([model(replicas=0)], nodes, reps), NOW, settings())
    assert changes.delete_replicas == ["r-1"]          # no failure counted for it
    assert [rid for rid, _ in changes.stops] == ["r-2"]
    assert "m" not in changes.model_updates or \
        "consecutive_failures" not in changes.model_updates["m"]


def test_a_draining_replica_serves_again_when_its_model_wants_it_back() -> None:
    m = model(on_demand=1, activated_at=NOW - 1, idle_stop_after_s=600.0)
    changes = decide(fleet([m], [node()], [draining(reason=drain.IDLE)]), NOW, settings())
    assert changes.undrains == ["r-1"] and not changes.starts and not changes.stops


@pytest.mark.parametrize("kw", [
    {"reason": drain.ROLLOUT},                    # going away for a new definition
    {"definition_hash": "h0"},                    # runs an older definition
    {"state": "unreachable"},                     # not serving
])
def test_only_a_current_ready_replica_stopped_for_load_serves_again(kw: dict[str, Any]) -> None:
    changes = decide(fleet([model()], [node()], [draining(**kw)]), NOW, settings())
    assert not changes.undrains and [s.model for s in changes.starts] == ["m"]


def test_a_draining_replica_holds_its_devices_until_it_stops() -> None:
    m = gpu_model(replicas=1)
    busy = draining(reason=drain.ROLLOUT, definition_hash="h0", in_flight={"r/1": [1, NOW]})
    changes = decide(fleet([m], [gpu_node()], [busy]), NOW, settings())
    assert not changes.starts and "no node has 1 free a100" in changes.unplaceable["m"]


def test_a_deleted_models_replicas_drain_and_the_row_goes_with_the_last() -> None:
    gone = model(deleted_at=NOW - 1)
    changes = decide(fleet([gone], [node()], [replica()]), NOW, settings())
    assert [(rid, why) for rid, why, _ in changes.drains] == [("r-1", "model deleted")]
    assert not changes.delete_models and not changes.starts
    last = decide(fleet([gone], [node()], [replica(desired=0, state="stopping")]), NOW,
                  settings())
    assert last.delete_models == ["m"]


# ------------------------------------------------------------------ nodes


def drained_node(name: str = "n1", force: bool = False, **kw: Any) -> SimpleNamespace:
    return node(name, cordoned=1, drain=json.dumps({"since": NOW - 10, "force": force,
                                                    "total": 1}), **kw)


def test_a_cordoned_node_gets_no_new_replica_and_keeps_what_runs() -> None:
    changes = decide(fleet([model(replicas=2)], [node("n1", cordoned=1)], [replica()]),
                     NOW, settings())
    assert not changes.starts and not changes.stops and not changes.drains
    assert "cordoned or draining, so left out: n1" in changes.unplaceable["m"]


def test_a_draining_nodes_replica_gets_a_replacement_first_then_drains() -> None:
    nodes = [drained_node(), node("n2")]
    first = decide(fleet([model()], nodes, [replica()]), NOW, settings())
    assert [s.node for s in first.starts] == ["n2"] and not first.drains
    waiting = decide(fleet([model()], nodes, [replica(), replica("r-2", node_="n2",
                                                                 state="starting")]),
                     NOW, settings())
    assert not waiting.starts and not waiting.drains
    ready = decide(fleet([model()], nodes, [replica(), replica("r-2", node_="n2")]),
                   NOW, settings())
    assert [(rid, why) for rid, why, _ in ready.drains] == [("r-1", "node drain")]


@pytest.mark.parametrize("force,drains", [(False, []), (True, ["r-1"])])
def test_with_no_room_elsewhere_only_a_forced_drain_moves_the_replica(
        force: bool, drains: list[str]) -> None:
    m = gpu_model()
    nodes = [drained_node(force=force, devices=gpu_node().devices), gpu_node("n2", count=0)]
    changes = decide(fleet([m], nodes, [replica()]), NOW, settings())
    assert [rid for rid, _, _ in changes.drains] == drains and not changes.starts


def test_a_node_with_nothing_left_on_it_is_drained_once() -> None:
    changes = decide(fleet([model(replicas=0)], [drained_node()], []), NOW, settings())
    assert changes.nodes_drained == ["n1"]
    assert any(kind == "node" and "drained" in text for kind, _, text in changes.events)
    done = node("n1", cordoned=1, drain=json.dumps({"since": NOW - 10, "done": NOW - 1}))
    assert decide(fleet([model(replicas=0)], [done], []), NOW, settings()).nodes_drained == []
