"""The fleet planner: multi-node and fabrics, binpack and spread, weights locality, silent
nodes, and stable plans."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest

from llmgw_runtime.placement import (
    ModelView,
    NodeView,
    PartStart,
    PartView,
    ReplicaView,
    place,
)

from .builders import (
    NOW,
    SRC,
    as_running,
    gpu,
    gpus,
    node,
    rep,
    small_fleet,
    snap,
    want,
    where,
)

H100 = "h100-80g"


def h100(name: str, n: int = 8, **kwargs: Any) -> NodeView:
    return node(name, *gpus(n, H100), **kwargs)


def two_node(n: int = 1, **kwargs: Any) -> ModelView:
    return want(n, klass=H100, gpus=8, nodes=2, engine="vllm", **kwargs)


# -- multi-node replicas -------------------------------------------------------------------


def test_a_multi_node_replica_takes_whole_nodes_of_one_fabric() -> None:
    nodes = [h100("a1", fabric="ib-a"), h100("b1", fabric="ib-b"), h100("a2", fabric="ib-a")]
    plan = place(snap([two_node()], nodes))
    [start] = plan.starts
    assert (start.node, start.devices) == ("a1", tuple(range(8)))
    assert start.parts == (PartStart(rank=1, node="a2", devices=tuple(range(8))),)
    assert start.why == "2 whole nodes in fabric ib-a"


def test_a_multi_node_replica_takes_gpus_per_node_and_the_whole_nodes() -> None:
    nodes = [h100("a1", fabric="ib-a"), h100("a2", fabric="ib-a"), h100("b1", fabric="ib-b")]
    models = [want(1, name="pair", klass=H100, gpus=2, nodes=2, engine="vllm"),
              want(1, name="single", klass=H100)]
    plan = place(snap(models, nodes))
    assert [(s.model, s.node, s.devices, s.parts) for s in plan.starts] == [
        ("pair", "a1", (0, 1), (PartStart(1, "a2", (0, 1)),)),
        ("single", "b1", (0,), ()),     # not on the 6 devices a1 and a2 leave unused
    ]


@pytest.mark.parametrize(("nodes", "reason"), [
    pytest.param([h100("a1", fabric="ib-a"), h100("b1", fabric="ib-b")],
                 "needs 2 whole nodes in one fabric; ib-a has 1 free, ib-b 1",
                 id="enough-only-across-two-fabrics"),
    pytest.param([h100("n1"), h100("n2")],
                 "needs 2 whole nodes in one fabric; no node with class h100-80g is in a "
                 "fabric (a node with no fabric cannot be combined with others)",
                 id="no-fabric-nodes-are-isolated"),
    pytest.param([h100("a1", fabric="ib-a"), h100("n2")],
                 "needs 2 whole nodes in one fabric; ib-a has 1 free; 1 node(s) with no "
                 "fabric cannot be combined",
                 id="no-fabric-node-never-joins-a-fabric"),
    pytest.param([h100("a1", fabric="ib-a"), h100("a2", 4, fabric="ib-a")],
                 "needs 2 whole nodes in one fabric; ib-a has 1 free",
                 id="too-few-gpus-on-a-node"),
    pytest.param([h100("a1", fabric="ib-a"), node("a2", *gpus(7, H100), gpu(7, H100,
                                                                         healthy=False),
                                                   fabric="ib-a")],
                 "needs 2 whole nodes in one fabric; ib-a has 1 free",
                 id="an-unhealthy-device-makes-a-node-too-small"),
])
def test_multi_node_reasons_give_free_nodes_per_fabric(nodes: list[NodeView],
                                                       reason: str) -> None:
    plan = place(snap([two_node()], nodes))
    assert plan.starts == []
    assert plan.unplaceable["m"] == reason


def test_a_node_with_one_replica_is_not_whole() -> None:
    nodes = [h100("a1", fabric="ib-a"), h100("a2", fabric="ib-a")]
    busy = (rep("r1", "small", "a2", (0,)),)
    plan = place(snap([two_node(), want(1, name="small", klass=H100)], nodes, busy))
    assert plan.starts == []
    assert plan.unplaceable["m"] == "needs 2 whole nodes in one fabric; ib-a has 1 free"


def test_an_existing_multi_node_replica_holds_its_nodes_whole() -> None:
    nodes = [h100("a1", fabric="ib-a"), h100("a2", fabric="ib-a"), h100("a3", fabric="ib-a")]
    pair = (rep("r1", "pair", "a1", (0, 1), parts=(PartView(1, "a2", (0, 1)),)),)
    models = [want(1, name="pair", klass=H100, gpus=2, nodes=2, engine="vllm"),
              want(2, name="single", klass=H100)]
    plan = place(snap(models, nodes, pair))
    assert where(plan) == [("single", "a3", (0,)), ("single", "a3", (1,))]


def test_multi_node_models_are_placed_before_smaller_ones_take_their_nodes() -> None:
    nodes = [h100("a1", fabric="ib-a"), h100("a2", fabric="ib-a"), h100("b1", fabric="ib-b")]
    plan = place(snap([want(1, name="aaa", klass=H100), two_node(name="zzz")], nodes))
    assert [(s.model, s.node) for s in plan.starts] == [("zzz", "a1"), ("aaa", "b1")]


@pytest.mark.parametrize(("b_nodes", "head", "why"), [
    pytest.param(dict(shared=frozenset({SRC})), "b1",
                 "2 whole nodes in fabric ib-b; 2 of them hold the weights", id="shared"),
    pytest.param(dict(weights=frozenset({SRC})), "b1",
                 "2 whole nodes in fabric ib-b; 2 of them hold the weights", id="local"),
])
def test_a_multi_node_replica_prefers_the_fabric_that_holds_the_weights(
        b_nodes: dict[str, Any], head: str, why: str) -> None:
    nodes = [h100("a1", fabric="ib-a"), h100("a2", fabric="ib-a"),
             h100("b1", fabric="ib-b", **b_nodes), h100("b2", fabric="ib-b", **b_nodes)]
    [start] = place(snap([two_node()], nodes)).starts
    assert (start.node, start.why) == (head, why)


def test_within_a_fabric_the_node_holding_the_weights_is_the_head() -> None:
    nodes = [h100("a1", fabric="ib-a"), h100("a2", fabric="ib-a"),
             h100("a3", fabric="ib-a", weights=frozenset({SRC}))]
    [start] = place(snap([two_node()], nodes)).starts
    assert (start.node, [p.node for p in start.parts]) == ("a3", ["a1"])


# -- binpack and spread --------------------------------------------------------------------


@pytest.mark.parametrize(("busy", "expected", "why"), [
    pytest.param({"n2": 1}, "n2", "binpack: 6 free a100-80g left on the node",
                 id="partly-used-node-before-a-whole-one"),
    pytest.param({"n2": 1, "n3": 5}, "n3", "binpack: 2 free a100-80g left on the node",
                 id="the-fullest-node-that-fits"),
    pytest.param({"n2": 8, "n3": 8}, "n1",
                 "binpack: no partly used node fits; 7 free a100-80g left on the node",
                 id="a-whole-node-when-no-partly-used-one-fits"),
])
def test_binpack_fills_busy_nodes_first(busy: dict[str, int], expected: str, why: str) -> None:
    nodes = [node(n, *gpus(8)) for n in ("n1", "n2", "n3")]
    reps = [rep(f"{n}-{i}", "other", n, (i,)) for n, count in busy.items() for i in range(count)]
    models = [want(1), want(len(reps), name="other")]
    [start] = place(snap(models, nodes, reps)).starts
    assert (start.node, start.why) == (expected, why)


def test_binpack_keeps_a_small_whole_node_whole_in_any_fabric() -> None:
    # a1 would be the tighter fit (1 left) but is whole; b1 is partly used: b1.
    nodes = [node("a1", *gpus(2), fabric="ib-a"), node("b1", *gpus(8), fabric="ib-b")]
    busy = (rep("o1", "other", "b1", (0,)),)
    [start] = place(snap([want(1), want(1, name="other")], nodes, busy)).starts
    assert (start.node, start.devices) == ("b1", (1,))


def test_binpack_puts_replicas_together_and_spread_apart() -> None:
    nodes = [node(n, *gpus(4)) for n in ("n1", "n2", "n3")]
    packed = place(snap([want(3)], nodes))
    spread = place(snap([want(3, strategy="spread")], nodes))
    assert [s.node for s in packed.starts] == ["n1", "n1", "n1"]
    assert [s.node for s in spread.starts] == ["n1", "n2", "n3"]
    assert spread.starts[1].why == "spread: no other replica of this model on the node"


def test_spread_prefers_another_fabric_after_another_node() -> None:
    nodes = [node("a1", *gpus(2), fabric="ib-a"), node("a2", *gpus(2), fabric="ib-a"),
             node("b1", *gpus(2), fabric="ib-b")]
    running = (rep("r1", "m", "a1", (0,)),)
    [start] = place(snap([want(2, strategy="spread")], nodes, running)).starts
    assert start.node == "b1"
    assert start.why == "spread: no other replica of this model on the node or in fabric ib-b"


def test_spread_doubles_up_only_when_every_node_has_one() -> None:
    nodes = [node("n1", *gpus(2)), node("n2", *gpus(2))]
    plan = place(snap([want(3, strategy="spread")], nodes))
    assert [s.node for s in plan.starts] == ["n1", "n2", "n1"]
    assert plan.starts[2].why == ("spread: every node that fits runs this model; 1 other "
                                  "replica(s) here")


def test_spread_counts_replicas_of_this_model_only() -> None:
    nodes = [node("n1", *gpus(4)), node("n2", *gpus(4))]
    others = (rep("o1", "other", "n2", (0,)), rep("o2", "other", "n2", (1,)))
    models = [want(2, strategy="spread"), want(2, name="other")]
    plan = place(snap(models, nodes, others))
    assert sorted(s.node for s in plan.starts) == ["n1", "n2"]


# -- weights locality ----------------------------------------------------------------------


def test_holding_the_weights_wins_over_binpack() -> None:
    nodes = [node("n1", *gpus(8)), node("n2", *gpus(8), weights=frozenset({SRC}))]
    busy = (rep("o1", "other", "n1", (0,)),)
    [start] = place(snap([want(1), want(1, name="other")], nodes, busy)).starts
    assert start.node == "n2"
    assert start.why.startswith("holds the weights; binpack: 7 free a100-80g left")


def test_weights_are_a_preference_never_a_filter() -> None:
    nodes = [node("n1", gpu(0), weights=frozenset({SRC})), node("n2", gpu(0))]
    busy = (rep("o1", "other", "n1", (0,)),)
    plan = place(snap([want(1), want(1, name="other")], nodes, busy))
    assert where(plan) == [("m", "n2", (0,))]


@pytest.mark.parametrize("n1_weights", [None, frozenset(), frozenset({"hf://org/else"})])
@pytest.mark.parametrize("n2_weights", [None, frozenset(), frozenset({"hf://org/else"})])
def test_never_asked_and_looked_and_found_nothing_rank_the_same(
        n1_weights: frozenset[str] | None, n2_weights: frozenset[str] | None) -> None:
    # n1 is the binpack choice (partly used); turning weights on anywhere must not move it.
    nodes = [node("n1", *gpus(8), weights=n1_weights), node("n2", *gpus(8), weights=n2_weights)]
    busy = (rep("o1", "other", "n1", (0,)),)
    [start] = place(snap([want(1), want(1, name="other")], nodes, busy)).starts
    assert start.node == "n1"


@pytest.mark.parametrize(("filer_fabric", "expected", "holds"), [
    pytest.param("ib-a", "a2", True, id="shared-source-counts-for-every-node-of-the-fabric"),
    pytest.param("ib-c", "b1", False, id="but-not-for-another-fabric"),
])
def test_a_shared_source_counts_for_its_whole_fabric(filer_fabric: str, expected: str,
                                                     holds: bool) -> None:
    # f1 sees the filer but is full; a2 (never told where to look) is whole; b1 is the
    # binpack choice (partly used).
    nodes = [node("f1", gpu(0), fabric=filer_fabric, shared=frozenset({SRC})),
             node("a2", *gpus(4), fabric="ib-a"),
             node("b1", *gpus(4), fabric="ib-b")]
    busy = (rep("o1", "other", "f1", (0,)), rep("o2", "other", "b1", (0,)))
    [start] = place(snap([want(1), want(2, name="other")], nodes, busy)).starts
    assert start.node == expected
    assert start.why.startswith("holds the weights") is holds


def test_a_shared_source_on_a_node_without_a_fabric_counts_for_that_node_only() -> None:
    nodes = [node("n1", gpu(0), shared=frozenset({SRC})), node("n2", *gpus(4)),
             node("n3", *gpus(4))]
    busy = (rep("o1", "other", "n1", (0,)), rep("o2", "other", "n3", (0,)))
    [start] = place(snap([want(1), want(2, name="other")], nodes, busy)).starts
    assert start.node == "n3"       # binpack; n2 does not count as holding n1's filer
    assert not start.why.startswith("holds the weights")


# -- silent nodes --------------------------------------------------------------------------


def test_a_silent_node_is_not_capacity() -> None:
    nodes = [node("n1", *gpus(2), age=60), node("n2", *gpus(2))]
    assert where(place(snap([want()], nodes))) == [("m", "n2", (0,))]


@pytest.mark.parametrize(("age", "stopped"), [
    pytest.param(60, False, id="within-grace-it-keeps-counting"),
    pytest.param(180, True, id="after-grace-it-is-replaced"),
])
def test_replicas_on_a_silent_node(age: float, stopped: bool) -> None:
    nodes = [node("gpu-07", *gpus(2), age=age), node("gpu-08", *gpus(2))]
    plan = place(snap([want(1)], nodes, (rep("r1", "m", "gpu-07", (0,)),)))
    if not stopped:
        assert plan.starts == [] and plan.stops == [] and plan.unplaceable == {}
        return
    assert plan.stops == ["r1"]
    assert plan.stop_reasons["r1"] == ("node gpu-07 silent for 180 s (over 120 s): replacing "
                                       "this replica elsewhere")
    assert where(plan) == [("m", "gpu-08", (0,))]


def test_a_multi_node_replica_with_a_silent_part_is_replaced() -> None:
    nodes = [h100("a1", fabric="ib-a"), h100("a2", fabric="ib-a", age=300),
             h100("a3", fabric="ib-a"), h100("a4", fabric="ib-a")]
    pair = (rep("r1", "m", "a1", tuple(range(8)), parts=(PartView(1, "a2", tuple(range(8))),)),)
    plan = place(snap([two_node()], nodes, pair))
    assert plan.stops == ["r1"]
    assert plan.stop_reasons["r1"].startswith("node a2 silent for 300 s (over 120 s)")
    assert [(s.node, [p.node for p in s.parts]) for s in plan.starts] == [("a3", ["a4"])]


def test_replicas_on_a_node_that_never_reported_or_left_are_replaced() -> None:
    nodes = [node("n1", gpu(0), age=None), node("n2", *gpus(3))]
    reps = (rep("r1", "m", "n1", (0,)), rep("r2", "m", "gone", (0,)))
    plan = place(snap([want(2)], nodes, reps))
    assert plan.stops == ["r1", "r2"]
    assert plan.stop_reasons == {
        "r1": "node n1 has never reported: replacing this replica elsewhere",
        "r2": "node gone is no longer in the fleet: replacing this replica elsewhere"}
    assert [s.node for s in plan.starts] == ["n2", "n2"]


def test_a_replica_on_a_silent_node_is_the_first_extra_stopped() -> None:
    nodes = [node("n1", gpu(0), age=60), node("n2", gpu(0))]
    reps = (rep("r1", "m", "n1", (0,), started=NOW - 5), rep("r2", "m", "n2", (0,)))
    assert place(snap([want(1)], nodes, reps)).stops == ["r1"]


# -- stability -----------------------------------------------------------------------------


def test_the_same_snapshot_gives_the_same_plan() -> None:
    fleet = small_fleet()
    first = place(fleet)
    assert len(first.starts) > 20
    assert place(fleet) == first


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_order_of_nodes_and_replicas_does_not_change_the_plan(seed: int) -> None:
    fleet = small_fleet()
    half = as_running(fleet, place(fleet))
    half = dataclasses.replace(half, replicas=half.replicas[::2])
    rnd = random.Random(seed)
    nodes, replicas = list(half.nodes), list(half.replicas)
    rnd.shuffle(nodes)
    rnd.shuffle(replicas)
    shuffled = dataclasses.replace(half, nodes=tuple(nodes), replicas=tuple(replicas))
    assert place(shuffled) == place(half)


def test_no_replica_moves_when_nothing_changed() -> None:
    fleet = small_fleet()
    plan = place(fleet)
    again = place(as_running(fleet, plan))
    assert again.starts == [] and again.stops == []
    assert again.unplaceable == plan.unplaceable


def test_a_healthy_replica_is_never_stopped_to_rebalance() -> None:
    # Everything on n1 although n2 holds the weights and is empty: nothing moves.
    nodes = [node("n1", *gpus(4)), node("n2", *gpus(4), weights=frozenset({SRC}))]
    reps = [rep(f"r{i}", "m", "n1", (i,)) for i in range(3)]
    plan = place(snap([want(3, strategy="spread")], nodes, reps))
    assert plan.starts == [] and plan.stops == []


def _states(replicas: tuple[ReplicaView, ...]) -> set[str]:
    return {r.state for r in replicas}


def test_fleet_builder_is_deterministic() -> None:
    assert small_fleet() == small_fleet()
    assert _states(as_running(small_fleet(), place(small_fleet())).replicas) == {"ready"}


def test_a_rollout_spreads_the_new_replicas_not_around_the_old_ones() -> None:
    # Rolling two replicas, one per node, one at a time: the first new one went to n1 (and
    # n1's old one drained); the second must go to n2, where only an old one runs, not
    # back to n1 as if n2's old replica were staying.
    nodes = [node("n1", *gpus(4)), node("n2", *gpus(4))]
    running = (rep("r3", "m", "n1", (1,)),
               dataclasses.replace(rep("r2", "m", "n2", (0,)), old=True))
    [start] = place(snap([want(3, strategy="spread")], nodes, running)).starts
    assert start.node == "n2"
