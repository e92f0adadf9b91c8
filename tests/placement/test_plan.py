"""The first placement function: single-device replicas by class and free memory."""

from __future__ import annotations

from llmgw_runtime.catalog import ModelSpec, Profile
from llmgw_runtime.placement import (
    DeviceView,
    ModelView,
    NodeView,
    ReplicaView,
    Snapshot,
    place,
)

NOW = 1_000_000.0


def spec(name: str = "m", klass: str = "a100-80g", memory: float | None = None,
         gpus: int = 1, engine: str = "llama.cpp") -> ModelSpec:
    return ModelSpec(name=name, source="/x", engine=engine,
                     profile=Profile(klass=klass, gpus=gpus, tp=gpus, memory_gb=memory))


def node(name: str, *devices: DeviceView, engines: tuple[str, ...] = ("llama.cpp",),
         age: float = 1.0) -> NodeView:
    return NodeView(name=name, devices=devices, engines=engines, last_report=NOW - age)


def gpu(i: int, klass: str = "a100-80g", total_gb: float = 80, used_gb: float = 0,
        healthy: bool = True) -> DeviceView:
    return DeviceView(id=i, klass=klass, memory_total_mb=int(total_gb * 1024),
                      memory_used_mb=int(used_gb * 1024), healthy=healthy)


def snap(models: list[ModelView], nodes: list[NodeView],
         replicas: tuple[ReplicaView, ...] = ()) -> Snapshot:
    return Snapshot(models=tuple(models), nodes=tuple(nodes), replicas=replicas, now=NOW)


def test_places_a_replica_on_a_device_of_its_class() -> None:
    plan = place(snap([ModelView(spec(), wanted=1)],
                      [node("n1", gpu(0, "h100-80g")), node("n2", gpu(0))]))
    assert [(s.node, s.devices) for s in plan.starts] == [("n2", (0,))]
    assert plan.unplaceable == {}


def test_whole_gpu_without_memory_is_exclusive() -> None:
    plan = place(snap([ModelView(spec(), wanted=3)], [node("n1", gpu(0), gpu(1))]))
    assert sorted(s.devices for s in plan.starts) == [(0,), (1,)]
    assert "no node has 1 free a100-80g" in plan.unplaceable["m"]


def test_memory_decides_how_many_share_a_device() -> None:
    plan = place(snap([ModelView(spec(memory=30), wanted=3)], [node("n1", gpu(0, used_gb=5))]))
    assert len(plan.starts) == 2
    assert "no a100-80g device has 30 GB free (largest free: 15.0 GB)" == plan.unplaceable["m"]


def test_best_fit_prefers_the_fuller_device() -> None:
    plan = place(snap([ModelView(spec(memory=10), wanted=1)],
                      [node("n1", gpu(0, used_gb=0), gpu(1, used_gb=60))]))
    assert plan.starts[0].devices == (1,)


def test_unhealthy_devices_are_never_used() -> None:
    plan = place(snap([ModelView(spec(), wanted=1)], [node("n1", gpu(0, healthy=False))]))
    assert plan.starts == [] and plan.unplaceable["m"] == "every a100-80g device is unhealthy"


def test_a_node_that_stopped_reporting_is_not_capacity() -> None:
    plan = place(snap([ModelView(spec(), wanted=1)], [node("n1", gpu(0), age=600)]))
    assert "no node is reporting" in plan.unplaceable["m"]


def test_unknown_class_names_the_classes_seen() -> None:
    plan = place(snap([ModelView(spec(klass="h200-141g"), wanted=1)], [node("n1", gpu(0))]))
    assert plan.unplaceable["m"] == ("no reporting node has a device of class h200-141g "
                                     "(classes seen: a100-80g)")


def test_engine_must_be_installed_on_the_node() -> None:
    plan = place(snap([ModelView(spec(engine="vllm"), wanted=1)], [node("n1", gpu(0))]))
    assert "vllm engine installed" in plan.unplaceable["m"]


def test_existing_replicas_count_and_extras_are_stopped_not_ready_first() -> None:
    reps = (ReplicaView("r1", "m", "n1", (0,), "ready", NOW - 100),
            ReplicaView("r2", "m", "n1", (1,), "starting", NOW - 10))
    plan = place(snap([ModelView(spec(), wanted=1)], [node("n1", gpu(0), gpu(1))], reps))
    assert plan.starts == [] and plan.stops == ["r2"]


def test_parked_and_backoff_models_start_nothing() -> None:
    nodes = [node("n1", gpu(0), gpu(1))]
    assert place(snap([ModelView(spec(), wanted=1, parked=True)], nodes)).starts == []
    assert place(snap([ModelView(spec(), wanted=1, hold_starts=True)], nodes)).starts == []


def test_replicas_of_removed_models_are_stopped() -> None:
    reps = (ReplicaView("r1", "gone", "n1", (0,), "ready", NOW),)
    assert place(snap([], [node("n1", gpu(0))], reps)).stops == ["r1"]


def test_multi_gpu_replica_takes_devices_on_one_node() -> None:
    plan = place(snap([ModelView(spec(gpus=2), wanted=1)],
                      [node("n1", gpu(0)), node("n2", gpu(0), gpu(1))]))
    assert [(s.node, s.devices) for s in plan.starts] == [("n2", (0, 1))]


def test_cpu_class_is_shared_by_several_replicas() -> None:
    cpu = DeviceView(id=0, klass="cpu", memory_total_mb=16000, memory_used_mb=2000)
    plan = place(snap([ModelView(spec(klass="cpu"), wanted=2)], [node("n1", cpu)]))
    assert len(plan.starts) == 2


MIG = "a100-80g-mig-3g.40gb"


def mig(card: int, instance: int, klass: str = MIG) -> DeviceView:
    return DeviceView(id=1000 + 100 * card + instance, klass=klass,
                      memory_total_mb=40 * 1024)


def test_a_mig_class_replica_takes_exactly_one_instance_each() -> None:
    node_ = node("n1", mig(0, 0), mig(0, 1), mig(0, 2, "a100-80g-mig-1g.10gb"), gpu(1))
    plan = place(snap([ModelView(spec(klass=MIG), wanted=3)], [node_]))
    assert sorted(s.devices for s in plan.starts) == [(1000,), (1001,)]
    assert plan.unplaceable["m"].startswith("no node has 1 free a100-80g-mig-3g.40gb")


def test_placement_refuses_more_than_one_instance_on_a_mig_class() -> None:
    plan = place(snap([ModelView(spec(klass=MIG, gpus=2), wanted=1)],
                      [node("n1", mig(0, 0), mig(0, 1))]))
    assert plan.starts == []
    assert "exactly one instance" in plan.unplaceable["m"]


def test_a_whole_gpu_class_never_lands_on_a_mig_instance() -> None:
    plan = place(snap([ModelView(spec(klass="a100-80g"), wanted=1)],
                      [node("n1", mig(0, 0, "a100-80g-mig-7g.80gb"))]))
    assert plan.starts == [] and "classes seen: a100-80g-mig-7g.80gb" in plan.unplaceable["m"]
