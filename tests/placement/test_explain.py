"""What ``ctl plan`` / ``ctl status`` show: devices per class, weights per fabric."""

from __future__ import annotations

from llmgw_runtime.placement import (
    PartView,
    counts_by_class,
    fabric_weights,
    fabrics_without_copy,
    nodes_holding,
    place,
)

from .builders import MIG, as_running, gpu, gpus, mig, node, rep, snap, want


def test_counts_by_class_splits_free_used_and_unhealthy() -> None:
    nodes = [node("n1", gpu(0), gpu(1), gpu(2, healthy=False), gpu(3, "h100-80g")),
             node("n2", gpu(0), age=600)]          # silent: not counted at all
    reps = (rep("r1", "m", "n1", (0,)),)
    assert counts_by_class(snap([want(1)], nodes, reps)) == {
        "a100-80g": {"total": 3, "free": 1, "used": 1, "unhealthy": 1},
        "h100-80g": {"total": 1, "free": 1, "used": 0, "unhealthy": 0},
    }


def test_mig_instances_count_under_their_mig_class() -> None:
    nodes = [node("n1", mig(0, 0), mig(0, 1), mig(1, 0, "a100-80g-mig-1g.10gb"))]
    reps = (rep("r1", "m", "n1", (1001,)),)
    assert counts_by_class(snap([want(1, klass=MIG)], nodes, reps)) == {
        "a100-80g-mig-1g.10gb": {"total": 1, "free": 1, "used": 0, "unhealthy": 0},
        MIG: {"total": 2, "free": 1, "used": 1, "unhealthy": 0},
    }


def test_a_node_held_by_a_multi_node_replica_has_nothing_free() -> None:
    nodes = [node("a1", *gpus(4), fabric="ib-a"), node("a2", *gpus(4), fabric="ib-a")]
    pair = (rep("r1", "m", "a1", (0, 1), parts=(PartView(1, "a2", (0, 1)),)),)
    counts = counts_by_class(snap([want(1, gpus=2, nodes=2, engine="vllm")], nodes, pair))
    assert counts == {"a100-80g": {"total": 8, "free": 0, "used": 8, "unhealthy": 0}}


def test_counts_agree_with_what_the_planner_can_still_place() -> None:
    nodes = [node("n1", *gpus(4)), node("n2", *gpus(2))]
    before = snap([want(3)], nodes)
    after = as_running(before, place(before))
    free = counts_by_class(after)["a100-80g"]["free"]
    more = place(snap([want(3), want(10, name="more")], nodes, after.replicas))
    assert free == 3 and len(more.starts) == 3


def test_fabric_weights_lists_local_and_shared_sources_per_fabric() -> None:
    nodes = [node("a1", gpu(0), fabric="ib-a", weights=frozenset({"s2", "s1"})),
             node("a2", gpu(0), fabric="ib-a", shared=frozenset({"filer"})),
             node("b1", gpu(0), fabric="ib-b", weights=None),
             node("x1", gpu(0), weights=frozenset({"s3"}))]
    assert fabric_weights(snap([], nodes)) == {
        "(none)": ["s3"], "ib-a": ["filer", "s1", "s2"], "ib-b": []}


def test_which_nodes_and_fabrics_can_serve_without_a_copy() -> None:
    nodes = [node("a1", gpu(0), fabric="ib-a", shared=frozenset({"s"})),
             node("a2", gpu(0), fabric="ib-a"),                  # sees a1's filer
             node("b1", gpu(0), fabric="ib-b", weights=frozenset()),
             node("c1", gpu(0), fabric="ib-c", weights=frozenset({"s"})),
             node("c2", gpu(0), fabric="ib-c"),                  # c1's copy is local to it
             node("x1", gpu(0), shared=frozenset({"s"})),        # no fabric: only itself
             node("x2", gpu(0))]
    fleet = snap([], nodes)
    assert nodes_holding(fleet, "s") == ["a1", "a2", "c1", "x1"]
    assert fabrics_without_copy(fleet, "s") == ["(none)", "ib-a", "ib-c"]
    assert fabrics_without_copy(fleet, "missing") == []
