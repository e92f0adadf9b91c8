"""Rollouts, table-tested on the pure rules (control/rollout.py) and ``decide``: Kubernetes'
RollingUpdate arithmetic for every surge/unavailable pair, a canary of one new replica, a
failed new replica stopping the rollout without parking the model, the done event,
rolling back by applying the old definition again, a canary rolled back by its error
rate, and "no room" said plainly."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from llmgw_runtime.api.catalog import ModelSpec, Profile
from llmgw_runtime.api.router import ModelVersions, VersionCounts
from llmgw_runtime.control import rollout
from llmgw_runtime.control.decide import decide
from llmgw_runtime.control.routes import routes_of

from .test_decide import NOW, fleet, model, node, replica, settings
from .test_drain import gpu_node

OLD, NEW = "h0", "h1"          # test_decide's model() has definition_hash h1


def rolling(name: str = "m", surge: int = 1, unavailable: int = 0, canary: int = 0,
            state: dict[str, Any] | None = None, **kw: Any) -> SimpleNamespace:
    settings_ = json.dumps({"max_surge": surge, "max_unavailable": unavailable,
                            "canary_percent": canary})
    kw.setdefault("profile", json.dumps({"class": "a100"}))
    kw.setdefault("replicas", 2)
    stored = state if state is not None else {"state": "canary" if canary else "rolling",
                                              "since": NOW - 60, "hash": NEW}
    return model(name, rollout=settings_, rollout_state=json.dumps(stored), **kw)


def old(rid: str, **kw: Any) -> SimpleNamespace:
    return replica(rid, definition_hash=OLD, **kw)


def new(rid: str, **kw: Any) -> SimpleNamespace:
    return replica(rid, definition_hash=NEW, **kw)


def rep_(rid: str, state: str = "ready", started: float = 0.0) -> SimpleNamespace:
    return SimpleNamespace(id=rid, state=state, started=started)


# ------------------------------------------------------------------ the arithmetic


@pytest.mark.parametrize("mode,wanted,surge,olds,news,target", [
    ("none", 3, 1, 0, 3, 3),
    ("rolling", 3, 1, 3, 0, 4),          # one new beside the three old
    ("rolling", 3, 2, 3, 0, 5),          # two at once
    ("rolling", 3, 0, 3, 0, 3),          # no surge: a new one only once an old one left
    ("rolling", 3, 0, 2, 0, 3),
    ("rolling", 3, 1, 1, 2, 4),
    ("rolling", 3, 1, 0, 4, 4),          # more new than wanted: the planner stops one later
    ("canary", 3, 1, 3, 0, 4),           # one canary beside the old ones
    ("canary", 3, 5, 3, 1, 4),           # and never more
    ("failed", 3, 1, 3, 1, 4),           # no new start
    ("failed", 3, 1, 3, 0, 3),
])
def test_the_planner_keeps_the_old_and_may_start_new_up_to_the_surge(
        mode: str, wanted: int, surge: int, olds: int, news: int, target: int) -> None:
    parts = rollout.Split(old=[rep_(f"o{i}") for i in range(olds)],
                          new=[rep_(f"n{i}") for i in range(news)])
    assert rollout.target(mode, wanted, surge, parts) == target


@pytest.mark.parametrize("wanted,unavailable,olds,news,drained", [
    (2, 0, ["ready", "ready"], ["starting"], []),          # the new one is not ready yet
    (2, 0, ["ready", "ready"], ["ready"], ["o0"]),         # it is: one old drains
    (2, 0, ["ready", "ready"], ["ready", "ready"], ["o0", "o1"]),
    (2, 1, ["ready", "ready"], [], ["o0"]),                # one may go before its successor
    (2, 2, ["ready", "ready"], [], ["o0", "o1"]),
    (3, 1, ["ready", "ready", "ready"], ["ready"], ["o0", "o1"]),
])
def test_an_old_replica_drains_while_enough_stay_ready(
        wanted: int, unavailable: int, olds: list[str], news: list[str],
        drained: list[str]) -> None:
    parts = rollout.Split(old=[rep_(f"o{i}", s, i) for i, s in enumerate(olds)],
                          new=[rep_(f"n{i}", s, 10 + i) for i, s in enumerate(news)])
    out = rollout.retire("rolling", wanted, unavailable, parts)
    assert [rid for rid, _ in out.drains] == drained and not out.stops


def test_an_old_replica_that_serves_nothing_stops_at_once() -> None:
    parts = rollout.Split(old=[rep_("o0", "starting"), rep_("o1")], new=[rep_("n0")])
    out = rollout.retire("rolling", 2, 0, parts)
    assert [rid for rid, _ in out.stops] == ["o0"] and out.drains == []


@pytest.mark.parametrize("mode", ["canary", "failed"])
def test_a_canary_or_a_failed_rollout_drains_no_old_replica(mode: str) -> None:
    parts = rollout.Split(old=[rep_("o0"), rep_("o1")], new=[rep_("n0")])
    out = rollout.retire(mode, 2, 1, parts)
    assert out.drains == [] and out.stops == []


# ------------------------------------------------------------------ in a pass


def test_a_new_definition_starts_one_new_replica_beside_the_old_ones() -> None:
    m = rolling()
    nodes = [gpu_node("n1", count=3)]
    reps = [old("r-1"), old("r-2", devices="[1]")]
    changes = decide(fleet([m], nodes, reps), NOW, settings())
    assert [(s.model, s.definition_hash) for s in changes.starts] == [("m", NEW)]
    assert json.loads(changes.starts[0].launch)["engine"] == "llama.cpp"
    assert not changes.drains and not changes.stops


def test_once_the_new_one_is_ready_an_old_one_drains_for_the_rollout() -> None:
    m = rolling()
    reps = [old("r-1", started=NOW - 50), old("r-2", devices="[1]", started=NOW - 40),
            new("r-3", devices="[2]")]
    changes = decide(fleet([m], [gpu_node("n1", count=3)], reps), NOW, settings())
    assert [(rid, why) for rid, why, _ in changes.drains] == [("r-1", "rollout")]
    assert not changes.starts


def test_with_no_room_to_surge_the_reason_says_so_and_names_the_fix() -> None:
    m = rolling()
    reps = [old("r-1"), old("r-2", devices="[1]")]
    changes = decide(fleet([m], [gpu_node("n1", count=2)], reps), NOW, settings())
    reason = changes.unplaceable["m"] or ""
    assert reason.startswith("no room to start a new replica beside the 2 old one(s) "
                             "(max_surge 1): no node has 1 free a100")
    assert "set rollout.max_unavailable: 1" in reason
    assert not changes.drains


def test_max_unavailable_replaces_in_place_on_a_full_fleet() -> None:
    m = rolling(surge=0, unavailable=1)
    reps = [old("r-1", started=NOW - 50), old("r-2", devices="[1]", started=NOW - 40)]
    changes = decide(fleet([m], [gpu_node("n1", count=2)], reps), NOW, settings())
    assert [rid for rid, _, _ in changes.drains] == ["r-1"] and not changes.starts


def test_a_canary_is_one_new_replica_and_drains_no_old_one() -> None:
    m = rolling(canary=10)
    reps = [old("r-1"), old("r-2", devices="[1]")]
    first = decide(fleet([m], [gpu_node("n1", count=4)], reps), NOW, settings())
    assert len(first.starts) == 1
    held = decide(fleet([m], [gpu_node("n1", count=4)], reps + [new("r-3", devices="[2]")]),
                  NOW, settings())
    assert not held.starts and not held.drains


def test_the_routes_mark_a_canarys_replicas_and_its_share() -> None:
    m = rolling(canary=10)
    reps = [old("r-1", port=4001), new("r-3", port=4003)]
    [routed] = routes_of([m], {"n1": node()}, reps, [], NOW, (5.0, 300.0)).models
    assert routed.canary_percent == 10
    assert {e.replica_id: e.canary for e in routed.endpoints} == {"r-1": False, "r-3": True}
    promoted = rolling(canary=10, state={"state": "rolling", "promoted": True, "hash": NEW})
    [routed] = routes_of([promoted], {"n1": node()}, reps, [], NOW, (5.0, 300.0)).models
    assert routed.canary_percent == 0 and not any(e.canary for e in routed.endpoints)


def test_a_new_replica_that_fails_stops_the_rollout_without_parking() -> None:
    m = rolling()
    reps = [old("r-1"), old("r-2", devices="[1]"),
            new("r-3", devices="[2]", state="failed", last_error="bad magic")]
    changes = decide(fleet([m], [gpu_node("n1", count=3)], reps), NOW, settings())
    assert changes.delete_replicas == ["r-3"]
    assert changes.rollouts["m"]["state"] == "failed"
    assert changes.rollouts["m"]["error"] == "bad magic"
    assert "parked" not in changes.model_updates.get("m", {})
    assert "consecutive_failures" not in changes.model_updates.get("m", {})
    assert any(kind == "rollout" and "old definition keep serving" in text
               for kind, _, text in changes.events)
    after = decide(fleet([SimpleNamespace(**{**vars(m), "rollout_state": json.dumps(
        {"state": "failed", "hash": NEW, "error": "bad magic"})})],
        [gpu_node("n1", count=3)], reps[:2]), NOW, settings())
    assert not after.starts and not after.drains and not after.stops   # the old ones serve


def test_a_rollout_with_no_old_replica_left_is_done_once() -> None:
    m = rolling()
    changes = decide(fleet([m], [gpu_node("n1", count=2)], [new("r-3")]), NOW, settings())
    assert changes.rollouts["m"]["state"] is None
    assert ("rollout", "m", "rollout of m done in 60 s") in changes.events
    quiet = rolling(state={"cut": 2})
    assert "m" not in decide(fleet([quiet], [gpu_node("n1", count=2)], [new("r-3")]),
                             NOW, settings()).rollouts


def test_applying_the_old_definition_again_rolls_the_new_replicas_back() -> None:
    back = rolling(definition_hash=OLD, state={"state": "rolling", "hash": OLD})
    reps = [old("r-1"), old("r-2", devices="[1]"), new("r-3", devices="[2]")]
    changes = decide(fleet([back], [gpu_node("n1", count=3)], reps), NOW, settings())
    assert [(rid, why) for rid, why, _ in changes.drains] == [("r-3", "rollout")]
    assert not changes.starts


def test_a_canary_over_its_error_budget_is_rolled_back() -> None:
    spec = ModelSpec(name="m", source="/m/m.gguf", engine="llama.cpp",
                     profile=Profile.model_validate({"class": "a100"}), args=("--old",))
    state = rollout.add_versions({"state": "canary", "hash": NEW}, ModelVersions(
        stable=VersionCounts(requests=200, errors=2), canary=VersionCounts(requests=20,
                                                                           errors=3)))
    m = rolling(canary=10, state=state, previous_definition=spec.model_dump_json(by_alias=True))
    reps = [old("r-1"), new("r-3", devices="[1]")]
    changes = decide(fleet([m], [gpu_node("n1", count=2)], reps), NOW, settings())
    values = changes.model_updates["m"]
    assert values["definition_hash"] == spec.definition_hash
    assert json.loads(values["args"]) == ["--old"]
    assert changes.rollouts["m"]["error"] == "canary error rate 15.0 % over 5.0 %; rolled back"


@pytest.mark.parametrize("canary,stable,due", [
    ((19, 19), (100, 0), False),          # too few requests to judge
    ((20, 1), (100, 0), False),           # 5 %: not over
    ((20, 2), (100, 0), True),
    ((40, 6), (100, 10), False),          # 15 % is under twice the stable 10 %
    ((40, 9), (100, 10), True),
])
def test_the_canary_error_budget(canary: tuple[int, int], stable: tuple[int, int],
                                 due: bool) -> None:
    state = rollout.add_versions({}, ModelVersions(
        stable=VersionCounts(requests=stable[0], errors=stable[1]),
        canary=VersionCounts(requests=canary[0], errors=canary[1])))
    assert (rollout.rollback_due(state) is not None) == due


def test_a_replica_keeps_the_launch_fields_it_was_placed_with() -> None:
    assert json.loads(rollout.launch_fields(ModelSpec(
        name="m", source="/x.gguf", engine="llama.cpp", args=("-c", "2048"), slots=2,
        profile=Profile.model_validate({"class": "cpu"})))) == {
        "engine": "llama.cpp", "source": "/x.gguf", "sha256": None, "size_bytes": None,
        "args": ["-c", "2048"], "slots": 2,
        "profile": {"class": "cpu", "gpus": 1, "tp": 1, "pp": 1, "nodes": 1}}


def test_replacing_in_place_waits_for_the_old_one_without_calling_it_unplaceable() -> None:
    m = rolling(surge=0, unavailable=1, replicas=1)
    going = old("r-1", drain_since=NOW - 5, drain_reason="rollout", drain_timeout_s=120.0,
                in_flight=json.dumps({"r/1": [1, NOW]}))
    changes = decide(fleet([m], [gpu_node("n1", count=1)], [going]), NOW, settings())
    assert not changes.starts and changes.unplaceable["m"] is None
    assert "placement_reason" not in changes.model_updates.get("m", {})


def test_going_back_from_a_canary_rolls_back_instead_of_holding_a_canary_of_the_old() -> None:
    # `ctl rollout undo` (or the old definition applied again) during a 10 % canary: the
    # old version's replicas are the current ones again, and the canary replica drains.
    during = rolling(canary=10, definition_hash=OLD,
                     state={"state": "canary", "hash": NEW, "from": OLD, "since": NOW - 60})
    assert rollout.started(during, NEW, NOW)["state"] == "rolling"
    assert rollout.started(during, NEW, NOW)["rolled_back"] is True
    back = rolling(canary=10, definition_hash=OLD, state=rollout.started(during, NEW, NOW))
    reps = [old("r-1"), old("r-2", devices="[1]"), new("r-3", devices="[2]")]
    changes = decide(fleet([back], [gpu_node("n1", count=3)], reps), NOW, settings())
    assert [(rid, why) for rid, why, _ in changes.drains] == [("r-3", "rollout")]
    assert not changes.starts
    [routed] = routes_of([back], {"n1": node()}, [old("r-1", port=4001)], [], NOW,
                         (5.0, 300.0)).models
    assert routed.canary_percent == 0


def test_a_new_definition_during_a_canary_is_a_canary_again() -> None:
    during = rolling(canary=10, definition_hash="h2",
                     state={"state": "canary", "hash": NEW, "from": OLD, "since": NOW - 60})
    assert rollout.started(during, NEW, NOW)["state"] == "canary"
