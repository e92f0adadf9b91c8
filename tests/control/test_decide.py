"""The fleet's rules, table-tested on the pure ``decide``: parking after N failures, backoff,
a ready replica ending a streak, idle stops, start timeouts, replacement of a silent node's
replicas, unparking on a new definition or retry, rendezvous ports."""

from __future__ import annotations

import itertools
import json
from types import SimpleNamespace
from typing import Any

import pytest

from llmgw_runtime.api.catalog import ModelSpec, Profile
from llmgw_runtime.control.decide import (
    Fleet,
    Settings,
    decide,
    failure_of,
    free_port,
    new_definition,
    record_failure,
    unpark_values,
)
from llmgw_runtime.control.states import backoff_s
from llmgw_runtime.store.models import spec_to_row

NOW = 10_000.0
CPU = {"id": 0, "uuid": "cpu", "class": "cpu", "memory_total_mb": 64000,
       "memory_used_mb": 0, "healthy": True}


def model(name: str = "m", **kw: Any) -> SimpleNamespace:
    """A ``models`` row: a default spec as the store writes it (store/models.py), then
    the fleet's state of it, then ``kw``."""
    spec = ModelSpec(name=name, source=f"/m/{name}.gguf", engine="llama.cpp",
                     profile=Profile.model_validate({"class": "cpu"}))
    row = dict(name=name, **spec_to_row(spec), parked=0, consecutive_failures=0,
               last_failure_at=None, activated_at=None, placement_reason=None,
               last_error=None)
    row["definition_hash"] = "h1"
    row.update(kw)
    return SimpleNamespace(**row)


def node(name: str = "n1", last_report: float | None = NOW - 1, **kw: Any) -> SimpleNamespace:
    row = dict(name=name, fabric=None, address="127.0.0.1", last_report=last_report,
               devices=json.dumps([CPU]), engines=json.dumps(["llama.cpp"]), weights="{}",
               problem=None, plan_problem=None)
    row.update(kw)
    return SimpleNamespace(**row)


def replica(rid: str = "r-1", model_: str = "m", node_: str = "n1", state: str = "ready",
            **kw: Any) -> SimpleNamespace:
    row = dict(id=rid, model=model_, node=node_, devices="[0]", state=state, desired=1,
               started=NOW - 10, updated=NOW - 1, last_used=None, last_error=None,
               rendezvous_port=None, port=4000, pid=9)
    row.update(kw)
    return SimpleNamespace(**row)


def fleet(models: list[Any], nodes: list[Any], replicas: list[Any] = (),  # type: ignore[assignment]
          parts: dict[str, list[Any]] | None = None) -> Fleet:
    return Fleet(models={m.name: m for m in models}, nodes={n.name: n for n in nodes},
                 replicas=list(replicas), parts=parts or {})


def settings(**kw: Any) -> Settings:
    ids = (f"r-new{i}" for i in itertools.count())
    return Settings(new_id=lambda: next(ids), **kw)


@pytest.mark.parametrize("failures_before,parked_after,kinds", [
    (0, 0, ["failure", "backoff"]),
    (3, 0, ["failure", "backoff"]),
    (4, 1, ["failure", "park"]),          # the 5th failure in a row parks
    (9, 1, ["failure", "park"]),
])
def test_a_failed_start_counts_and_the_fifth_parks(failures_before: int, parked_after: int,
                                                   kinds: list[str]) -> None:
    m = model(consecutive_failures=failures_before)
    changes = decide(fleet([m], [node()], [replica(state="failed", last_error="oom")]),
                     NOW, settings())
    values = changes.model_updates["m"]
    assert values["consecutive_failures"] == failures_before + 1
    assert values.get("parked", 0) == parked_after
    assert values["last_error"] == "oom" and values["last_failure_at"] == NOW
    assert [k for k, s, _ in changes.events if s == "m"][:2] == kinds
    assert "r-1" in changes.delete_replicas


@pytest.mark.parametrize("failures,delay", [(0, 0), (1, 5), (2, 10), (3, 20), (7, 300)])
def test_backoff_doubles_up_to_the_cap(failures: int, delay: float) -> None:
    assert backoff_s(failures, 5.0, 300.0) == delay


def test_the_backoff_event_names_the_next_delay() -> None:
    _, events = record_failure(model(consecutive_failures=2), "boom", NOW, (5.0, 300.0))
    assert events == [("failure", "start failure 3 in a row: boom"),
                      ("backoff", "next start in 20 s")]


@pytest.mark.parametrize("rep,parts,expected", [
    (replica(state="ready"), [], None),
    (replica(state="failed", last_error="bad gguf"), [], "bad gguf"),
    (replica(state="starting", started=NOW - 500), [], "not ready within 180 s"),
    (replica(state="starting", started=NOW - 100), [], None),
    (replica(state="pending", started=NOW - 181), [], "not ready within 180 s"),
    (replica(state="ready"), [SimpleNamespace(rank=1, node="n2", state="failed",
                                              last_error="rpc lost")], "part 1 on n2"),
])
def test_what_counts_as_a_failed_start(rep: Any, parts: list[Any],
                                       expected: str | None) -> None:
    found = failure_of(rep, parts, NOW, 180.0)
    assert (found is None) if expected is None else (expected in (found or ""))


def test_a_ready_replica_ends_the_streak() -> None:
    m = model(consecutive_failures=3, last_failure_at=NOW - 50)
    changes = decide(fleet([m], [node()], [replica()]), NOW, settings())
    assert changes.model_updates["m"] == {"consecutive_failures": 0, "last_failure_at": None}
    assert not changes.starts and not changes.delete_replicas


@pytest.mark.parametrize("last_used,stops", [(NOW - 3600, True), (NOW - 60, False),
                                             (None, True)])
def test_an_idle_on_demand_model_is_stopped(last_used: float | None, stops: bool) -> None:
    m = model(on_demand=1, activated_at=NOW - 7200, idle_stop_after_s=600.0)
    changes = decide(fleet([m], [node()], [replica(last_used=last_used, started=NOW - 7200)]),
                     NOW, settings())
    assert (changes.model_updates.get("m", {}).get("activated_at", "kept") is None) == stops
    assert any(k == "idle-stop" for k, _, _ in changes.events) == stops
    if stops:       # a ready replica finishes its requests in flight first
        assert [(rid, why) for rid, why, _ in changes.drains] == [("r-1", "idle stop")]
        assert not changes.stops


def test_a_silent_nodes_replica_is_replaced_after_the_grace_period_only() -> None:
    nodes = [node("gone", last_report=NOW - 100), node("n2", last_report=NOW + 29)]
    early = decide(fleet([model()], nodes, [replica(node_="gone")]), NOW,
                   settings(replace_after_s=120.0))
    assert not early.starts and not early.stops
    late = decide(fleet([model()], nodes, [replica(node_="gone")]), NOW + 30,
                  settings(replace_after_s=120.0))
    assert [(s.node, s.replica_id) for s in late.starts] == [("n2", "r-new0")]
    assert [rid for rid, _ in late.stops] == ["r-1"]


def test_an_unwanted_replica_on_a_dead_node_is_forgotten() -> None:
    changes = decide(fleet([model(replicas=0)], [node("gone", last_report=None)],
                           [replica(node_="gone", desired=0, state="stopping")]),
                     NOW, settings())
    assert changes.delete_replicas == ["r-1"]


def test_a_parked_model_is_not_placed_and_a_new_one_is() -> None:
    changes = decide(fleet([model("p", parked=1), model("fresh")], [node()]), NOW, settings())
    assert [s.model for s in changes.starts] == ["fresh"]
    assert any(e[:2] == ("place", "fresh") and e[2].startswith(
        "replica r-new0 placed on n1 device(s) 0") for e in changes.events)


@pytest.mark.parametrize("old,new,unparks", [(None, "h1", False), ("h1", "h1", False),
                                             ("h1", "h2", True)])
def test_only_a_new_definition_unparks(old: str | None, new: str, unparks: bool) -> None:
    assert new_definition(old, new) == unparks


def test_unparking_forgets_the_whole_streak() -> None:
    assert unpark_values() == {"parked": 0, "consecutive_failures": 0, "last_error": None,
                               "last_failure_at": None, "placement_reason": None}


def test_rendezvous_ports_skip_the_used_ones() -> None:
    assert free_port({29500, 29501}, range(29500, 29503)) == 29502
    assert free_port({29500}, range(29500, 29501)) is None


def test_a_reason_is_an_event_only_when_it_changes() -> None:
    big = model(profile=json.dumps({"class": "h100-80g"}))
    first = decide(fleet([big], [node()]), NOW, settings())
    assert first.unplaceable["m"] and first.model_updates["m"]["placement_reason"]
    same = decide(fleet([model(profile=big.profile,
                               placement_reason=first.unplaceable["m"])], [node()]),
                  NOW, settings())
    assert "m" not in same.model_updates
    assert not [e for e in same.events if e[0] == "unplaceable"]


def test_a_node_the_planner_left_out_is_used_again_once_its_report_is_usable() -> None:
    bad = node("n1", devices="not json", plan_problem=None)
    first = decide(fleet([model()], [bad, node("n2")]), NOW, settings())
    assert first.node_problems["n1"] and "n2" not in first.node_problems
    steady = decide(fleet([model()], [node("n1", devices="not json",
                                           plan_problem=first.node_problems["n1"])]),
                    NOW, settings())
    assert "n1" not in steady.node_problems                 # said once, not every pass
    fixed = decide(fleet([model()], [node("n1", plan_problem="old reason")]), NOW, settings())
    assert fixed.node_problems == {"n1": None}
    assert ("node", "n1", "node n1 is used for placement again") in fixed.events
