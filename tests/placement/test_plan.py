"""Single-node placement: device class, engine, memory, health, counts and stops."""

from __future__ import annotations

import pytest

from llmgw_runtime.placement import DeviceView, ModelView, place

from .builders import MIG, NOW, gpu, mig, node, rep, snap, spec, want, where


def test_places_a_replica_on_a_device_of_its_class() -> None:
    plan = place(snap([want()], [node("n1", gpu(0, "h100-80g")), node("n2", gpu(0))]))
    assert where(plan) == [("m", "n2", (0,))]
    assert plan.unplaceable == {}


def test_whole_gpu_without_memory_is_exclusive() -> None:
    plan = place(snap([want(3)], [node("n1", gpu(0), gpu(1))]))
    assert sorted(s.devices for s in plan.starts) == [(0,), (1,)]
    assert plan.unplaceable["m"] == ("no node has 1 free a100-80g: all 2 healthy ones are taken; "
                                     "2 of 3 replicas placed")


def test_memory_decides_how_many_share_a_device() -> None:
    plan = place(snap([want(3, memory=30)], [node("n1", gpu(0, used_gb=5))]))
    assert len(plan.starts) == 2
    assert plan.unplaceable["m"] == ("no a100-80g device has 30 GB free (largest free: 15.0 GB); "
                                     "2 of 3 replicas placed")


def test_best_fit_prefers_the_fuller_device() -> None:
    plan = place(snap([want(memory=10)], [node("n1", gpu(0, used_gb=0), gpu(1, used_gb=60))]))
    assert plan.starts[0].devices == (1,)


def test_a_second_memory_replica_shares_the_device_already_in_use() -> None:
    plan = place(snap([want(2, memory=20)], [node("n1", *(gpu(i) for i in range(4)))]))
    assert where(plan) == [("m", "n1", (0,)), ("m", "n1", (0,))]
    assert plan.starts[1].why == (
        "binpack: shares a device already in use with 1 other replica(s); 3 free a100-80g "
        "left on the node; 40.0 GB memory free on the device after its 20 GB")


def test_a_replica_sharing_the_cpu_says_the_memory_left_not_zero_free_cpus() -> None:
    # Issue 28: "0 free cpu left on the node" while status showed 20 GB free and more
    # replicas were placed. The CPU is one shared device: what is left is its memory, as
    # status's FREE counts it (reported free less what replicas not yet ready will take).
    starting = (rep("r0", "other", "n1", (0,), state="starting"),)
    views = [want(3, klass="cpu", memory=4), want(1, name="other", klass="cpu", memory=4)]
    plan = place(snap(views, [node("n1", gpu(0, klass="cpu", total_gb=32, used_gb=4))],
                      starting))
    whys = [s.why for s in plan.starts]
    assert whys == [
        f"binpack: shares a device already in use with {n} other replica(s); "
        f"{free:.1f} GB memory free on the device after its 4 GB"
        for n, free in ((1, 20), (2, 16), (3, 12))]
    assert not any("free cpu" in why for why in whys), whys
    unset = place(snap([want(klass="cpu")], [node("n1", gpu(0, klass="cpu", total_gb=32))]))
    assert unset.starts[0].why == ("binpack: no partly used node fits; 32.0 GB memory free "
                                   "on the device (its memory_gb is unset: it reserves none)")


def test_a_ready_replica_memory_is_not_counted_twice() -> None:
    # The ready replica's 30 GB already shows in memory_used (35 of 80): 45 GB are free.
    running = (rep("r1", "m", "n1", (0,), state="ready"),)
    plan = place(snap([want(2, memory=30)], [node("n1", gpu(0, used_gb=35))], running))
    assert where(plan) == [("m", "n1", (0,))]


def test_a_starting_replica_memory_is_subtracted() -> None:
    starting = (rep("r1", "m", "n1", (0,), state="starting"),)
    plan = place(snap([want(2, memory=50)], [node("n1", gpu(0, used_gb=5))], starting))
    assert plan.starts == []
    assert plan.unplaceable["m"] == ("no a100-80g device has 50 GB free (largest free: 25.0 GB); "
                                     "1 of 2 replicas placed")


def test_an_exclusive_replica_never_lands_on_a_shared_device() -> None:
    busy = (rep("r1", "small", "n1", (0,)),)
    models = [want(1, name="small", memory=10), want(1, name="big")]
    plan = place(snap(models, [node("n1", gpu(0))], busy))
    assert plan.starts == []
    assert plan.unplaceable["big"] == "no node has 1 free a100-80g: all 1 healthy ones are taken"


@pytest.mark.parametrize(("devices", "reason"), [
    ((gpu(0, healthy=False),), "every a100-80g device is unhealthy"),
    ((gpu(0, healthy=False), gpu(1)), ""),
])
def test_unhealthy_devices_are_never_used(devices: tuple[DeviceView, ...], reason: str) -> None:
    plan = place(snap([want()], [node("n1", *devices)]))
    assert [s.devices for s in plan.starts] == ([] if reason else [(1,)])
    assert plan.unplaceable.get("m", "") == reason


def test_an_unhealthy_device_is_not_counted_as_free_in_the_reason() -> None:
    plan = place(snap([want(gpus=2)], [node("n1", gpu(0), gpu(1, healthy=False)),
                                       node("n2", gpu(0), gpu(1, healthy=False))]))
    assert plan.unplaceable["m"] == ("needs 2 x a100-80g on one node; the most free on one "
                                     "node is 1 (n1)")


def test_a_node_that_stopped_reporting_is_not_capacity() -> None:
    plan = place(snap([want()], [node("n1", gpu(0), age=600)]))
    assert plan.unplaceable["m"] == ("no reporting node has a device of class a100-80g "
                                     "(no node is reporting)")


def test_unknown_class_names_the_classes_seen() -> None:
    plan = place(snap([want(klass="h200-141g")], [node("n1", gpu(0))]))
    assert plan.unplaceable["m"] == ("no reporting node has a device of class h200-141g "
                                     "(classes seen: a100-80g)")


def test_engine_must_be_installed_on_the_node() -> None:
    nodes = [node("n1", gpu(0), engines=("llama.cpp",)), node("n2", gpu(0), engines=("vllm",))]
    assert where(place(snap([want(engine="vllm")], nodes))) == [("m", "n2", (0,))]
    plan = place(snap([want(engine="vllm")], nodes[:1]))
    assert plan.unplaceable["m"] == "no node with class a100-80g has the vllm engine installed"


def test_existing_replicas_count_and_extras_are_stopped_not_ready_first() -> None:
    reps = (rep("r1", "m", "n1", (0,), "ready", NOW - 100),
            rep("r2", "m", "n1", (1,), "starting", NOW - 10))
    plan = place(snap([want(1)], [node("n1", gpu(0), gpu(1))], reps))
    assert plan.starts == [] and plan.stops == ["r2"]
    assert plan.stop_reasons["r2"] == ("model m wants 1 replica(s) and has 2: stopping the "
                                       "least useful")


def test_among_ready_extras_the_newest_is_stopped() -> None:
    reps = (rep("old", "m", "n1", (0,), started=NOW - 500),
            rep("new", "m", "n1", (1,), started=NOW - 5))
    assert place(snap([want(1)], [node("n1", gpu(0), gpu(1))], reps)).stops == ["new"]


def test_parked_model_stops_its_replicas_and_starts_none() -> None:
    reps = (rep("r1", "m", "n1", (0,)),)
    plan = place(snap([ModelView(spec(), wanted=1, parked=True)], [node("n1", gpu(0), gpu(1))],
                      reps))
    assert plan.starts == [] and plan.stops == ["r1"]
    assert plan.stop_reasons["r1"] == "model m is parked"


def test_backoff_starts_nothing_new_but_keeps_what_runs() -> None:
    nodes = [node("n1", gpu(0), gpu(1))]
    reps = (rep("r1", "m", "n1", (0,)),)
    plan = place(snap([ModelView(spec(), wanted=2, hold_starts=True)], nodes, reps))
    assert plan.starts == [] and plan.stops == [] and plan.unplaceable == {}


def test_replicas_of_removed_models_are_stopped() -> None:
    plan = place(snap([], [node("n1", gpu(0))], (rep("r1", "gone", "n1", (0,)),)))
    assert plan.stops == ["r1"]
    assert plan.stop_reasons["r1"] == "model gone is no longer in the catalog"


def test_multi_gpu_replica_takes_devices_on_one_node() -> None:
    plan = place(snap([want(gpus=2)], [node("n1", gpu(0)), node("n2", gpu(0), gpu(1))]))
    assert where(plan) == [("m", "n2", (0, 1))]


def test_multi_gpu_reason_names_the_node_with_the_most_free() -> None:
    nodes = [node("gpu-06", gpu(0, "h100-80g")), node("gpu-07", *(gpu(i, "h100-80g")
                                                                 for i in range(2)))]
    busy = (rep("r1", "other", "gpu-07", (0,)),)
    plan = place(snap([want(gpus=2, klass="h100-80g"), want(0, name="other",
                                                            klass="h100-80g")], nodes, busy))
    assert plan.unplaceable["m"] == ("needs 2 x h100-80g on one node; the most free on one "
                                     "node is 1 (gpu-06)")


def test_a_model_placed_only_in_part_still_gets_a_reason() -> None:
    plan = place(snap([want(3)], [node("n1", gpu(0), gpu(1))]))
    assert len(plan.starts) == 2
    assert plan.unplaceable["m"].startswith("no node has 1 free a100-80g")


def test_cpu_class_is_shared_by_several_replicas() -> None:
    cpu = DeviceView(id=0, klass="cpu", memory_total_mb=16000, memory_used_mb=2000)
    plan = place(snap([want(2, klass="cpu")], [node("n1", cpu)]))
    assert where(plan) == [("m", "n1", (0,)), ("m", "n1", (0,))]


def test_a_mig_class_replica_takes_exactly_one_instance_each() -> None:
    node_ = node("n1", mig(0, 0), mig(0, 1), mig(0, 2, "a100-80g-mig-1g.10gb"), gpu(1))
    plan = place(snap([want(3, klass=MIG)], [node_]))
    assert sorted(s.devices for s in plan.starts) == [(1000,), (1001,)]
    assert plan.unplaceable["m"].startswith("no node has 1 free a100-80g-mig-3g.40gb")


@pytest.mark.parametrize(("gpus", "nodes"), [(2, 1), (1, 2)])
def test_placement_refuses_more_than_one_instance_on_a_mig_class(gpus: int, nodes: int) -> None:
    plan = place(snap([want(klass=MIG, gpus=gpus, nodes=nodes)],
                      [node("n1", mig(0, 0), mig(0, 1), fabric="ib-a"),
                       node("n2", mig(0, 0), mig(0, 1), fabric="ib-a")]))
    assert plan.starts == []
    assert "exactly one instance" in plan.unplaceable["m"]


def test_a_whole_gpu_class_never_lands_on_a_mig_instance() -> None:
    plan = place(snap([want(klass="a100-80g")], [node("n1", mig(0, 0, "a100-80g-mig-7g.80gb"))]))
    assert plan.starts == [] and "classes seen: a100-80g-mig-7g.80gb" in plan.unplaceable["m"]
