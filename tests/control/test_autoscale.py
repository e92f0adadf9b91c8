"""Autoscaling, table-tested on the pure step (control/autoscale.py) and through ``decide``:
up when requests wait too long for a window, down when the slots stay mostly idle, the
cooldown, the floor and the max, a step the fleet has no room for taken back (reported,
not retried every tick, the model not unplaceable), and an event that says why."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llmgw_runtime.api.catalog import Autoscale
from llmgw_runtime.control import autoscale
from llmgw_runtime.control.autoscale import ScaleState, Step, step, unplaceable_step
from llmgw_runtime.control.capacity import Load
from llmgw_runtime.control.decide import decide

from .test_decide import CPU, NOW, fleet, model, node, replica, settings

S = Autoscale(wait_target_s=2.0, up_after_s=60.0, busy_below=0.3, down_after_s=300.0,
              cooldown_s=120.0)
WAITING = Load(waiting=5, busy=4, wait_s=4.1, routers=1)
REFUSED = Load(waiting=0, busy=4, rejected=3, routers=1)
QUIET = Load(waiting=0, busy=1, wait_s=0.0, routers=1)
NOTHING = Load()


def run(target: int | None = 2, state: ScaleState | None = None, load: Load = WAITING,
        slots: int | None = 8, starting: int = 0, floor: int = 1, ceiling: int = 3) -> Step:
    return step(S, floor, ceiling, target, state or ScaleState(), load, slots, starting, NOW)


@pytest.mark.parametrize(("state", "load", "starting", "target", "event"), [
    # requests wait too long: up only once the window is full
    (ScaleState(), WAITING, 0, 2, None),
    (ScaleState(high_since=NOW - 30), WAITING, 0, 2, None),
    (ScaleState(high_since=NOW - 60), WAITING, 0, 3,
     "queue wait 4.1 s > 2 s for 60 s: 2 -> 3"),
    # refusals for capacity count as waiting too long (a model that does not queue)
    (ScaleState(high_since=NOW - 90), REFUSED, 0, 3,
     "3 requests refused for capacity in 3 s for 90 s: 2 -> 3"),
    # a replica still starting is capacity on its way: no second step meanwhile
    (ScaleState(high_since=NOW - 90), WAITING, 1, 2, None),
    # within the cooldown of the last step: no step
    (ScaleState(high_since=NOW - 90, last_at=NOW - 100), WAITING, 0, 2, None),
    (ScaleState(high_since=NOW - 90, last_at=NOW - 120), WAITING, 0, 3,
     "queue wait 4.1 s > 2 s for 90 s: 2 -> 3"),
    # quiet slots: down only after the down window, never below the floor
    (ScaleState(low_since=NOW - 299), QUIET, 0, 2, None),
    (ScaleState(low_since=NOW - 300), QUIET, 0, 1,
     "busy 1 of 8 slots (12%) < 30%, nothing waiting for 300 s: 2 -> 1"),
    (ScaleState(low_since=NOW - 300, last_at=NOW - 10), QUIET, 0, 2, None),
    # nothing reported at all: no traffic, the slots are idle
    (ScaleState(low_since=NOW - 400), NOTHING, 0, 1,
     "busy 0 of 8 slots (0%) < 30%, nothing waiting for 400 s: 2 -> 1"),
])
def test_one_step_at_a_time_after_its_window_and_cooldown(
        state: ScaleState, load: Load, starting: int, target: int, event: str | None) -> None:
    out = run(state=state, load=load, starting=starting)
    assert (out.target, out.event) == (target, event)


def test_a_step_restarts_its_window_and_the_cooldown() -> None:
    up = run(state=ScaleState(high_since=NOW - 60))
    assert up.state.high_since == NOW and up.state.last_at == NOW
    down = run(state=ScaleState(low_since=NOW - 300), load=QUIET)
    assert down.state.low_since == NOW and down.state.last_at == NOW


@pytest.mark.parametrize(("load", "slots", "high", "low"), [
    (WAITING, 8, True, False),
    (Load(waiting=2, busy=1, wait_s=0.5), 8, False, False),   # waiting, within the target
    (Load(busy=3), 8, False, False),                          # 37 % busy: not low
    (Load(busy=2), 8, False, True),                           # 25 %: low
    (Load(busy=0), 0, False, False),                          # no ready slot: unknown
    (Load(busy=0), None, False, True),                        # slots unknown, nothing busy
    (Load(busy=1), None, False, False),
])
def test_which_load_starts_which_window(load: Load, slots: int | None, high: bool,
                                        low: bool) -> None:
    out = run(load=load, slots=slots)
    assert (out.state.high_since is not None, out.state.low_since is not None) == (high, low)


def test_a_break_in_the_signal_restarts_the_window() -> None:
    out = run(state=ScaleState(high_since=NOW - 59), load=QUIET)
    assert out.state.high_since is None and out.target == 2
    out = run(state=ScaleState(low_since=NOW - 299), load=WAITING)
    assert out.state.low_since is None


def test_at_its_max_it_says_so_once_per_episode() -> None:
    first = run(target=3, state=ScaleState(high_since=NOW - 60))
    assert first.target == 3
    assert first.event == ("queue wait 4.1 s > 2 s for 60 s, but it runs its max of 3 "
                           "replicas; raise replicas.max (or slots) to serve more")
    again = run(target=3, state=first.state)
    assert again.event is None and again.target == 3


def test_at_its_max_a_short_break_in_one_burst_does_not_say_it_again() -> None:
    # Issue 28: the "at max" note appeared twice in one burst, a pass under the target in
    # between. Once per burst: the note is said again only after cooldown_s of calm.
    def at(t: float, state: ScaleState, load: Load = WAITING) -> Step:
        return step(S, 1, 3, 3, state, load, 8, 0, NOW + t)

    said, state = [], ScaleState(high_since=NOW - 60)
    for t, load in [(0, WAITING), (5, QUIET), (10, WAITING), (80, WAITING), (90, WAITING)]:
        out = at(t, state, load)
        said += [t] if out.event else []
        state = out.state
    assert said == [0], said                # the burst, a 5 s break in it: said once
    for t in (100, 100 + S.cooldown_s):     # calm for the cooldown: the burst is over
        state = at(t, state, QUIET).state
    assert state.said is None
    state = at(300, state).state
    assert at(300 + S.up_after_s, state).event is not None   # a new burst is said


@pytest.mark.parametrize(("stored", "floor", "ceiling", "target", "event"), [
    (None, 1, 3, 1, None),                                    # no target yet: the floor
    (5, 1, 3, 3, "the catalog keeps 1 to 3 replicas now: 5 -> 3"),
    (1, 2, 4, 2, "the catalog keeps 2 to 4 replicas now: 1 -> 2"),
])
def test_a_target_outside_a_changed_range_is_brought_inside(
        stored: int | None, floor: int, ceiling: int, target: int, event: str | None) -> None:
    out = run(target=stored, load=Load(busy=4), floor=floor, ceiling=ceiling)
    assert (out.target, out.event) == (target, event)


@pytest.mark.parametrize(("target", "placed", "reason", "taken_back"), [
    (3, 2, "no node has 1 free cpu", True),
    (3, 3, None, False),                    # placed
    (3, 0, "no node has 1 free cpu", False),  # the floor itself does not fit: unplaceable
    (2, 2, "something else", False),        # nothing above what is placed
])
def test_a_step_the_fleet_has_no_room_for_is_taken_back(target: int, placed: int,
                                                        reason: str | None,
                                                        taken_back: bool) -> None:
    out = unplaceable_step(target, placed, 1, reason, ScaleState(high_since=NOW - 70),
                           NOW, 120.0)
    assert (out is not None) == taken_back
    if out is not None:
        assert out.target == placed and out.state.blocked == reason
        assert out.state.last_at == NOW and out.state.high_since == NOW - 70
        assert out.event == (f"cannot add a replica ({placed} -> {target}): {reason}; "
                             f"staying at {placed}, trying again in 120 s if requests "
                             "still wait")


# -- through decide: the rows as the store holds them ---------------------------------------


def scaled(name: str = "m", low: int = 1, high: int = 3, **kw: Any) -> Any:
    row = dict(replicas=low, replicas_max=high, on_demand=int(low == 0),
               autoscale=json.dumps(S.to_dict()), scale_target=None, scale_state=None,
               load=None, slots=4)
    return model(name, **{**row, **kw})


def load_text(waiting: int, busy: int, wait_s: float, routers: int = 1) -> str:
    return json.dumps({"posts": [[f"rt-{i}", NOW - 1, waiting, busy, wait_s, 0]
                                 for i in range(routers)]})


def events(changes: Any, kind: str = "autoscale") -> list[str]:
    return [text for k, _, text in changes.events if k == kind]


def test_decide_steps_up_and_places_the_new_replica() -> None:
    m = scaled(load=load_text(3, 2, 4.1, routers=2),
               scale_state=json.dumps({"high_since": NOW - 61}))
    changes = decide(fleet([m], [node()], [replica()]), NOW, settings())
    assert events(changes) == ["queue wait 4.1 s > 2 s for 61 s: 1 -> 2"]
    assert changes.model_updates["m"]["scale_target"] == 2
    assert [s.model for s in changes.starts] == ["m"]
    assert changes.unplaceable["m"] is None


def test_decide_keeps_the_floor_while_the_load_is_fine() -> None:
    m = scaled(load=load_text(0, 3, 0.0))          # 3 of 4 slots busy: neither up nor down
    changes = decide(fleet([m], [node()], [replica()]), NOW, settings())
    assert events(changes) == [] and not changes.starts and not changes.stops
    assert changes.model_updates.get("m", {}).get("scale_target") == 1


def test_decide_steps_down_and_stops_the_least_useful_replica() -> None:
    m = scaled(scale_target=2, scale_state=json.dumps({"low_since": NOW - 301}))
    reps = [replica("r-1"), replica("r-2", started=NOW - 5)]
    changes = decide(fleet([m], [node()], reps), NOW, settings())
    assert events(changes) == ["busy 0 of 8 slots (0%) < 30%, nothing waiting for 301 s: "
                               "2 -> 1"]
    # the newer one finishes its requests in flight first, then stops
    assert [(rid, why) for rid, why, _ in changes.drains] == [("r-2", "scale-down")]


def test_an_extra_replica_with_no_room_is_reported_once_not_every_tick() -> None:
    full = node(devices=json.dumps([{**CPU, "class": "a100-80g"}]))   # no cpu device left
    m = scaled(load=load_text(3, 4, 4.1), scale_state=json.dumps({"high_since": NOW - 61}))
    live = replica(node_="n0")
    nodes = [full, node("n0", devices=json.dumps([CPU]), engines=json.dumps(["vllm"]))]
    changes = decide(fleet([m], nodes, [live]), NOW, settings())
    said = events(changes)
    assert said[0] == "queue wait 4.1 s > 2 s for 61 s: 1 -> 2"
    assert said[1].startswith("cannot add a replica (1 -> 2): no node with class cpu has "
                              "the llama.cpp engine installed")
    assert changes.model_updates["m"]["scale_target"] == 1
    assert changes.unplaceable["m"] is None and not changes.starts
    assert "placement_reason" not in changes.model_updates["m"]
    # the next passes, within the cooldown: nothing tried, nothing said
    for later in (NOW + 1, NOW + 60):
        again = decide(fleet([_after(m, changes)], nodes, [live]), later, settings())
        assert events(again) == [] and not again.starts
        assert again.unplaceable["m"] is None


def _after(row: Any, changes: Any) -> Any:
    """The row once the pass's updates are written."""
    values = {**vars(row), **changes.model_updates.get(row.name, {})}
    return type(row)(**values)


def test_an_on_demand_range_starts_one_at_the_first_request_and_forgets_its_target() -> None:
    idle = scaled(low=0, high=3, activated_at=None, scale_target=2,
                  scale_state=json.dumps({"last_at": NOW - 5}))
    changes = decide(fleet([idle], [node()]), NOW, settings())
    assert changes.model_updates["m"] == {"scale_target": None, "scale_state": None}
    assert not changes.starts
    woken = scaled(low=0, high=3, activated_at=NOW - 1)
    changes = decide(fleet([woken], [node()]), NOW, settings())
    assert len(changes.starts) == 1                # the floor of an activated one: 1


def test_a_fixed_model_is_left_alone() -> None:
    m = model(replicas=2)
    assert autoscale.decide_model(m, [], NOW) is None
    changes = decide(fleet([m], [node()]), NOW, settings())
    assert "scale_target" not in changes.model_updates.get("m", {})


def test_the_view_shows_current_target_min_max_and_the_signal() -> None:
    m = scaled(low=0, high=3, activated_at=NOW - 100, scale_target=2,
               load=load_text(5, 4, 4.1, routers=2),
               scale_state=json.dumps({"high_since": NOW - 20}))
    view = autoscale.view(m, [replica("r-1"), replica("r-2", state="starting")], NOW)
    assert view is not None
    assert {k: view[k] for k in ("current", "target", "min", "max", "up_for_s")} == {
        "current": 1, "target": 2, "min": 0, "max": 3, "up_for_s": 20.0}
    assert view["signal"] == {"waiting": 10, "busy": 8, "slots": 4, "wait_s": 4.1,
                              "rejected": 0, "routers": 2}
    assert view["note"] == "wait 4.1 s (target 2 s), 8/4 slots busy, 10 waiting"
    assert autoscale.view(model(), [], NOW) is None


def test_requests_waiting_beside_a_free_slot_say_they_wait_for_their_prefix() -> None:
    # Issue 28: "2/3 slots busy, 2 waiting" said nothing of why requests waited while a
    # slot was free (prefix affinity: each waits for the replica caching its prompt).
    m = scaled(slots=1, load=load_text(2, 2, 0.5))
    reps = [replica(f"r-{i}") for i in range(3)]
    assert autoscale.view(m, reps, NOW)["note"] == (
        "wait 0.5 s (target 2 s), 2/3 slots busy, 2 waiting for the replica holding their "
        "prompt's prefix (at most 15 s, then any free slot)")
    by_load = scaled(slots=1, load=load_text(2, 2, 0.5), routing="least-outstanding")
    assert autoscale.view(by_load, reps, NOW)["note"].endswith("2/3 slots busy, 2 waiting")
    full = scaled(slots=1, load=load_text(2, 3, 0.5))
    assert autoscale.view(full, reps, NOW)["note"].endswith("3/3 slots busy, 2 waiting")
