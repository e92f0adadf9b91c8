"""The reconciler's memos (control/snapshot.py, control/planmemo.py): a pass whose snapshot
places what the last one did gets the last plan again without placing; anything placement
reads that moved (a node going silent or coming back, a replica, a model, a device) places
again; and the plan handed out is always what ``placement.place`` answers for that
snapshot."""

from __future__ import annotations

import random
from dataclasses import replace
from types import SimpleNamespace

from llmgw_runtime.control import planmemo, snapshot
from llmgw_runtime.placement import place

from ..placement.builders import (
    NOW,
    as_running,
    gpu,
    gpus,
    node,
    rep,
    small_fleet,
    snap,
    want,
)


def moved(s, seconds: float, names: set[str] | None = None):
    """``s`` later by ``seconds``, the named nodes (all: None) having reported now."""
    nodes = tuple(n if names is not None and n.name not in names
                  else n.reported(NOW + seconds - 1.0) for n in s.nodes)
    return replace(s, nodes=nodes, now=NOW + seconds)


def test_report_times_alone_do_not_place_again() -> None:
    memo = planmemo.PlanMemo()
    first = small_fleet()
    plan = memo.place(first)
    assert plan == place(first) and plan.starts and memo.placed == 1
    for later in (2.0, 4.0, 6.0):                  # every node heard from again
        assert memo.place(moved(first, later)) == plan
    assert memo.placed == 1


def test_what_placement_reads_places_again() -> None:
    memo = planmemo.PlanMemo()
    base = snap([want(2, name="m")], [node("a", *gpus(1)), node("b", *gpus(1)),
                                      node("c", *gpus(1))])
    assert [s.node for s in memo.place(base).starts] == ["a", "b"]
    # node a silent past the node timeout: no capacity any more
    silent = moved(base, 40.0, names={"b", "c"})
    assert [s.node for s in memo.place(silent).starts] == ["b", "c"] and memo.placed == 2
    back = moved(base, 42.0)                        # it reports again
    assert [s.node for s in memo.place(back).starts] == ["a", "b"] and memo.placed == 3
    # a replica running, a model wanting more, a device gone unhealthy: each places again
    running = as_running(back, place(back))
    assert memo.place(running).starts == [] and memo.placed == 4
    more = replace(running, models=(want(3, name="m"),))
    assert [s.node for s in memo.place(more).starts] == ["c"] and memo.placed == 5
    sick = replace(more, nodes=tuple(
        replace(n, devices=(replace(n.devices[0], healthy=False),)) if n.name == "c" else n
        for n in more.nodes))
    assert memo.place(sick).starts == [] and memo.placed == 6


def test_a_replica_on_a_node_silent_past_replace_after_is_stopped_when_it_gets_there() -> None:
    memo = planmemo.PlanMemo()
    base = snap([want(1, name="m")], [node("a", *gpus(1)), node("b", *gpus(1))],
                [rep("r1", "m", "a", (0,))], replace_after=120.0)
    assert memo.place(moved(base, 60.0, names={"b"})).stops == []     # silent, not for long
    late = moved(base, 130.0, names={"b"})
    assert memo.place(late).stops == ["r1"] and memo.place(late) == place(late)


def test_the_plan_handed_out_is_a_copy() -> None:
    memo = planmemo.PlanMemo()
    s = small_fleet()
    memo.place(s).unplaceable["x"] = "changed by a pass"    # control/steps.py does this
    memo.place(s).starts.clear()
    assert memo.place(s) == place(s) and memo.placed == 1


def test_the_memo_answers_what_placement_does_over_a_random_walk() -> None:
    """Seeded walk: each step moves report times (some past the timeouts), runs the last
    plan, or changes a model's wants; the memo's plan is place's after every step."""
    rnd = random.Random(11)
    memo = planmemo.PlanMemo()
    s = small_fleet(seed=5, size=30)
    at = 0.0
    for _ in range(60):
        roll = rnd.random()
        if roll < 0.5:
            at += rnd.choice([1.0, 2.0, 45.0])
            s = moved(s, at, names={n.name for n in s.nodes if rnd.random() < 0.8})
        elif roll < 0.8:
            s = as_running(s, place(s))
        else:
            i = rnd.randrange(len(s.models))
            models = list(s.models)
            models[i] = replace(models[i], wanted=rnd.randint(0, 4))
            s = replace(s, models=tuple(models))
        assert memo.place(s) == place(s)
    assert 1 < memo.placed < 60


def test_a_replica_state_placement_does_not_read_places_nothing_again() -> None:
    """Seeded walk over a running fleet: replicas restart (ready, starting, ready), start
    (pending, fetching), fail, stop, start later; nodes go silent past replace_after_s
    (their replicas are replaced) and come back; models want fewer (the least useful stop
    first: readiness and start time count) or more than fits (a memory model's reason
    names the largest free memory, which a replica not ready yet reserves). Placement
    reads a replica's state only as active or not, and its readiness and start only for a
    model with memory_gb or with more replicas than it wants (``replica_inputs``): the memo
    places again only when those moved, and its plan is placement's after every step."""
    rnd = random.Random(17)
    memo = planmemo.PlanMemo()
    s = small_fleet(seed=9, size=12)
    s = as_running(s, place(s))
    copies = 0
    for step in range(300):
        roll = rnd.random()
        reps, models, nodes = list(s.replicas), list(s.models), list(s.nodes)
        i = rnd.randrange(len(reps))
        if roll < 0.6:
            reps[i] = replace(reps[i], state=rnd.choice(
                ["ready", "ready", "starting", "fetching", "pending", "unreachable", "failed",
                 "stopping"]))
        elif roll < 0.75:
            reps[i] = replace(reps[i], started=reps[i].started + rnd.choice([-50.0, 50.0]))
        elif roll < 0.8:
            reps[i] = replace(reps[i], counts=not reps[i].counts)
        elif roll < 0.85:         # a node silent past replace_after_s, or back
            k = rnd.randrange(len(nodes))
            nodes[k] = replace(nodes[k], last_report=NOW - rnd.choice([1.0, 200.0]))
        else:
            j = rnd.randrange(len(models))
            models[j] = replace(models[j], wanted=rnd.randint(0, 9))
        s = replace(s, replicas=tuple(reps), models=tuple(models), nodes=tuple(nodes))
        before = memo.placed
        assert memo.place(s) == place(s), step
        copies += memo.placed == before
    assert 50 < copies < 250


def test_what_placement_reads_asked_of_some_models_is_the_whole_answer_cut_to_them() -> None:
    """``readiness_read`` asked only of the models whose readiness moved (as the memo asks
    it) counts only their replicas, unless one of them has memory_gb; its answer is the
    whole fleet's cut to them, over a seeded walk of a running fleet with memory models
    (a model short of replicas on a shared device makes every memory model's readiness
    read)."""
    rnd = random.Random(23)
    s = small_fleet(seed=4, size=12)
    s = as_running(s, place(s))
    kinds = set()
    for step in range(400):
        reps, models = list(s.replicas), list(s.models)
        i = rnd.randrange(len(reps))
        if rnd.random() < 0.7:
            reps[i] = replace(reps[i], state=rnd.choice(["ready", "starting", "failed"]))
        else:
            j = rnd.randrange(len(models))
            models[j] = replace(models[j], wanted=rnd.randint(0, 6))
        s = replace(s, replicas=tuple(reps), models=tuple(models))
        present = planmemo.present_nodes(s)
        whole = planmemo.readiness_read(s, present)
        among = {m.spec.name for m in rnd.sample(s.models, rnd.randint(0, 4))}
        assert planmemo.readiness_read(s, present, among) == whole & among, step
        kinds.add((bool(whole & among), any(s.models[k].spec.profile.memory_gb is not None
                                            for k in range(len(s.models))
                                            if s.models[k].spec.name in among)))
    assert {(False, False), (True, False), (True, True)} <= kinds


def test_a_copied_plan_compares_the_next_pass_with_its_own_snapshot(monkeypatch) -> None:
    """A pass that gets the last plan again is the one the next pass is compared with: a
    replica that moved once is not compared again in every later pass (at 10,000 nodes,
    the snapshot placed minutes ago had other view objects for every replica, so each
    pass compared 4,000), and the plans stay placement's."""
    compared: list[str] = []
    real = planmemo._placed_as
    monkeypatch.setattr(planmemo, "_placed_as", lambda r: compared.append(r.id) or real(r))
    memo = planmemo.PlanMemo()
    s = small_fleet(seed=9, size=12)
    s = as_running(s, place(s))
    memo.place(s)
    for step in range(6):          # one replica restarts, then another, each once
        reps = list(s.replicas)
        reps[step] = replace(reps[step], state="starting" if step % 2 else "ready",
                             started=reps[step].started + 1.0)
        s = replace(s, replicas=tuple(reps))
        compared.clear()
        assert memo.place(s) == place(s)
        assert sorted(set(compared)) == [reps[step].id], step
    assert memo.placed == 1          # each plan a copy


def test_a_replica_on_a_silent_node_is_not_counted_when_telling_what_placement_reads() -> None:
    """Model m's one replica is on a node silent past replace_after_s, so placement
    replaces it, on the device where n's replica runs with memory_gb: whether n's replica
    is ready (its memory already shows as used) or still starting (it reserves its 30 GB)
    changes the memory m's new replica leaves free, so the memo places again."""
    memo = planmemo.PlanMemo()
    nodes = [node("a", gpu(0)), node("b", gpu(0), age=200.0)]
    models = [want(1, name="m", memory=30.0), want(1, name="n", memory=30.0)]
    ready = snap(models, nodes, [rep("rm", "m", "b", (0,)), rep("rn", "n", "a", (0,))],
                 replace_after=120.0)
    starting = replace(ready, replicas=(ready.replicas[0],
                                        replace(ready.replicas[1], state="starting")))
    first, second = memo.place(ready), memo.place(starting)
    assert (first, second) == (place(ready), place(starting)) and first != second
    assert first.stops == ["rm"] and [s.node for s in second.starts] == ["a"]
    # as the reconciler runs it: the node views known unchanged (its NodeMemo's count)
    memo = planmemo.PlanMemo()
    assert (memo.place(ready, 7), memo.place(starting, 7)) == (first, second)


def test_node_views_are_copied_with_a_new_report_time_not_made_again() -> None:
    row = SimpleNamespace(name="gpu-1", devices='[{"id": 0, "class": "a100-80g", '
                          '"memory_total_mb": 81920, "memory_used_mb": 0}]',
                          engines='["vllm"]', weights="{}", fabric="ib-a", cordoned=0,
                          drain=None, last_report=NOW)
    first = snapshot.node_view(row)
    again = snapshot.node_view(SimpleNamespace(**{**vars(row), "last_report": NOW + 2}))
    assert again.last_report == NOW + 2 and again.devices is first.devices
    assert again == replace(first, last_report=NOW + 2) and again.classes == ("a100-80g",)
    other = snapshot.node_view(SimpleNamespace(**{**vars(row), "fabric": "ib-b"}))
    assert other.fabric == "ib-b"


def device_text(healthy: bool = True, temperature: float = 40.0) -> str:
    return ('[{"id": 0, "class": "a100-80g", "memory_total_mb": 81920, "memory_used_mb": 0, '
            f'"healthy": {str(healthy).lower()}, "temperature_c": {temperature}}}]')


def test_the_reconcilers_node_memo_tells_the_plan_memo_when_a_node_moved() -> None:
    """As the reconciler runs them (its records patched in place for a report time, a new
    record for anything else): report times and new readings alone place nothing again,
    without comparing the nodes; a device gone unhealthy, a node gone silent, a node
    joining do,
    and each plan is placement's own."""
    nodes, plans = snapshot.NodeMemo(), planmemo.PlanMemo()
    rows = [SimpleNamespace(name=f"gpu-{i}", devices=device_text(),
                            engines='["llama.cpp", "vllm"]', weights="{}", fabric="ib-a", cordoned=0, drain=None,
                            last_report=NOW) for i in range(3)]

    def pass_(at: float) -> tuple[object, object]:
        s = snap([want(2, name="m")], [nodes.view(r) for r in rows])
        s = replace(s, now=NOW + at)
        return plans.place(s, nodes.made), place(s)

    first, expected = pass_(0.0)
    assert first == expected and plans.placed == 1 and [s.node for s in first.starts] == [
        "gpu-0", "gpu-1"]
    for at in (2.0, 4.0):
        for row in rows:
            row.last_report = NOW + at              # a heartbeat, patched in place
        rows[1] = SimpleNamespace(**{**vars(rows[1]), "devices": device_text(temperature=at)})
        assert pass_(at) == (first, expected) and plans.placed == 1
    rows[0] = SimpleNamespace(**{**vars(rows[0]), "devices": device_text(healthy=False)})
    got, expected = pass_(4.0)
    assert got == expected and plans.placed == 2 and [s.node for s in got.starts] == [
        "gpu-1", "gpu-2"]                         # gpu-0's device is not usable
    rows[1].last_report = NOW - 60.0                # silent past the node timeout
    got, expected = pass_(4.0)
    assert got == expected and plans.placed == 3 and [s.node for s in got.starts] == ["gpu-2"]
    rows.append(SimpleNamespace(**{**vars(rows[2]), "name": "gpu-3"}))
    got, expected = pass_(4.0)
    assert got == expected and plans.placed == 4 and len(got.starts) == 2


def test_a_pass_whose_replicas_changed_places_again_over_the_nodes_it_read_last() -> None:
    """A churning fleet: replicas change each pass (one fails, one is placed), the nodes
    only report. Each plan is placed again and is placement's own, over the node base the
    memo read once (placement/nodebase.py); a node gone silent, one joining and a device
    gone unhealthy each make it read the nodes again."""
    nodes, plans = snapshot.NodeMemo(), planmemo.PlanMemo()
    rows = [SimpleNamespace(name=f"gpu-{i}", devices=device_text(), engines='["llama.cpp"]',
                            weights="{}", fabric="ib-a", cordoned=0, drain=None,
                            last_report=NOW) for i in range(4)]
    running: list = []

    def pass_(at: float, wanted: int) -> tuple[object, object]:
        s = replace(snap([want(wanted, name="m")], [nodes.view(r) for r in rows],
                         list(running)), now=NOW + at)
        return plans.place(s, nodes.made), place(s)

    got, expected = pass_(0.0, 2)
    assert got == expected and len(got.starts) == 2 and (plans.placed, plans.bases) == (1, 1)
    for turn, at in enumerate((2.0, 4.0, 6.0)):
        for row in rows:
            row.last_report = NOW + at                  # heartbeats, patched in place
        running[:] = [rep(f"r{turn}", "m", s.node, s.devices) for s in got.starts[:1]]
        got, expected = pass_(at, 2)                    # the other replica failed: place it
        assert got == expected and len(got.starts) == 1
        assert got.starts[0].node != running[0].node
    assert (plans.placed, plans.bases) == (4, 1)
    rows[3].last_report = NOW - 60.0                    # silent past the node timeout
    got, expected = pass_(6.0, 4)
    assert got == expected and plans.bases == 2
    assert "gpu-3" not in {s.node for s in got.starts} and len(got.starts) == 2
    rows.append(SimpleNamespace(**{**vars(rows[0]), "name": "gpu-4", "last_report": NOW + 6}))
    got, expected = pass_(6.0, 4)
    assert got == expected and plans.bases == 3 and "gpu-4" in {s.node for s in got.starts}
    rows[4] = SimpleNamespace(**{**vars(rows[4]), "devices": device_text(healthy=False)})
    got, expected = pass_(6.0, 4)
    assert got == expected and plans.bases == 4 and "gpu-4" not in {s.node for s in got.starts}


def test_the_nodes_liveness_in_one_walk_is_the_one_rule_of_each_node() -> None:
    """``planmemo.liveness`` (which the plan memo compares instead of report times)
    answers what ``heard_from`` and ``silence`` answer of each node, at the bounds too:
    a node never heard from, one just within the node timeout, one just past it."""
    from llmgw_runtime.fleetvocab import heard_from
    from llmgw_runtime.placement.capacity import silence

    rnd = random.Random(5)
    base = small_fleet()
    for _ in range(500):
        timeout, after = rnd.choice([(10.0, 30.0), (30.0, 10.0), (5.0, float("inf"))])
        ages = [None, 0.0, timeout, after, timeout + 1e-9, after + 0.5, rnd.uniform(0, 60)]
        nodes = tuple(node(f"n{i}", gpu(0), age=rnd.choice(ages)) for i in range(12))
        s = replace(base, nodes=nodes, now=NOW, node_timeout_s=timeout,
                    replace_after_s=after)
        unheard, silent = planmemo.liveness(s)
        assert unheard == tuple(i for i, n in enumerate(nodes)
                                if not heard_from(n.last_report, NOW, timeout))
        assert silent == tuple(i for i, n in enumerate(nodes) if silence(n, NOW) > after)
