"""Placement never plans more than the fleet holds: shared devices (the CPU) count memory and
replicas, a model gets at most MAX_REPLICAS, and a plan on a large fleet stays bounded."""

from __future__ import annotations

from collections import Counter

from llmgw_runtime.catalog.bounds import MAX_REPLICAS
from llmgw_runtime.fleetvocab import MAX_REPLICAS_PER_SHARED_DEVICE
from llmgw_runtime.placement import ModelView, Plan, place

from .builders import cpu, gpu, large_fleet, node, rep, snap, spec, want

CAP = MAX_REPLICAS_PER_SHARED_DEVICE


def per_device(plan: Plan) -> Counter[tuple[str, int]]:
    return Counter((s.node, d) for s in plan.starts for d in s.devices)


def test_a_cpu_takes_at_most_the_shared_device_cap_without_memory_gb() -> None:
    plan = place(snap([want(MAX_REPLICAS, klass="cpu")], [node("n1", cpu())]))
    assert len(plan.starts) == CAP
    assert plan.unplaceable["m"] == (
        f"every cpu device already runs {CAP} replicas, the most one shared device takes "
        f"(MAX_REPLICAS_PER_SHARED_DEVICE); {CAP} of {MAX_REPLICAS} replicas placed")


def test_replicas_already_on_a_cpu_count_towards_its_cap() -> None:
    running = [rep(f"r{i:02d}", "other", "n1", (0,)) for i in range(CAP - 1)]
    models = [want(CAP - 1, name="other", klass="cpu"), want(3, klass="cpu")]
    plan = place(snap(models, [node("n1", cpu())], running))
    assert [(s.model, s.node) for s in plan.starts] == [("m", "n1")]
    assert plan.unplaceable["m"].endswith("; 1 of 3 replicas placed")


def test_a_cpu_replica_with_memory_gb_needs_that_much_free() -> None:
    # 16 GB, 2 used: three 4 GB replicas fit, the fourth does not.
    plan = place(snap([want(5, klass="cpu", memory=4)], [node("n1", cpu(16, used_gb=2))]))
    assert len(plan.starts) == 3
    assert plan.unplaceable["m"] == ("no cpu device has 4 GB free (largest free: 2.0 GB); "
                                     "3 of 5 replicas placed")


def test_a_starting_cpu_replica_memory_is_subtracted() -> None:
    starting = [rep("r1", "m", "n1", (0,), state="starting")]
    plan = place(snap([want(2, klass="cpu", memory=10)], [node("n1", cpu(16))], starting))
    assert plan.starts == []
    assert plan.unplaceable["m"].startswith("no cpu device has 10 GB free (largest free: 6.0")


def test_a_gpu_shared_by_memory_takes_at_most_the_cap_too() -> None:
    plan = place(snap([want(40, memory=1)], [node("n1", gpu(0))]))
    assert len(plan.starts) == CAP and set(per_device(plan)) == {("n1", 0)}
    assert plan.unplaceable["m"].endswith(f"; {CAP} of 40 replicas placed")


def test_a_model_wanting_more_than_the_maximum_gets_at_most_the_maximum() -> None:
    # A store row from before the bound, or an autoscaler gone wild.
    plan = place(snap([ModelView(spec(klass="cpu", memory=1), wanted=100_000_000)],
                      large_fleet(200)))
    assert len(plan.starts) == MAX_REPLICAS
    assert plan.unplaceable["m"] == (
        f"wants 100000000 replicas, over the maximum of {MAX_REPLICAS} (MAX_REPLICAS); "
        f"{MAX_REPLICAS} of them placed; set replicas to at most {MAX_REPLICAS}")


def test_the_maximum_replicas_on_a_2000_node_fleet_plan_only_what_fits() -> None:
    nodes = large_fleet(2000)
    models = [want(MAX_REPLICAS, name="cpu", klass="cpu"),
              want(MAX_REPLICAS, name="cpu-mem", klass="cpu", memory=60),
              want(MAX_REPLICAS, name="gpu", gpus=8),
              want(MAX_REPLICAS, name="gpu-mem", memory=40),
              want(MAX_REPLICAS, name="two-node", gpus=8, nodes=2, engine="vllm"),
              ModelView(spec(name="huge", klass="cpu", memory=1), wanted=100_000_000)]
    plan = place(snap(models, nodes))

    per_model = Counter(s.model for s in plan.starts)
    assert max(per_model.values()) <= MAX_REPLICAS
    # Nothing is over-committed: whole devices once, shared ones up to the cap and memory.
    views = {n.name: {d.id: d for d in n.devices} for n in nodes}
    users = per_device(plan)
    assert max(users.values()) <= CAP
    memory: Counter[tuple[str, int]] = Counter()
    for s in plan.starts:
        for d in s.devices:
            dev = views[s.node][d]
            assert dev.healthy
            if s.model in ("gpu", "two-node"):
                assert users[(s.node, d)] == 1
            if s.model in ("cpu-mem", "gpu-mem", "huge"):
                memory[(s.node, d)] += {"cpu-mem": 60, "gpu-mem": 40, "huge": 1}[s.model]
    for (name, d), gb in memory.items():
        dev = views[name][d]
        assert gb <= (dev.memory_total_mb - dev.memory_used_mb) / 1024
    # 1,500 GPU nodes of 8 hold every GPU replica; of the 500 CPU nodes, only those with 62 GB
    # free (and not already running 16 replicas) take a 60 GB replica, one each, and the
    # reason says how many fit.
    assert per_model["cpu"] == per_model["gpu"] == per_model["gpu-mem"] == MAX_REPLICAS
    assert per_model["two-node"] == MAX_REPLICAS
    roomy = sum(1 for n in nodes if n.devices[0].klass == "cpu"
                and n.devices[0].memory_total_mb - n.devices[0].memory_used_mb >= 60 * 1024)
    assert 0 < per_model["cpu-mem"] <= roomy < MAX_REPLICAS
    assert plan.unplaceable == {
        "cpu-mem": (f"no cpu device has 60 GB free (largest free: 56.0 GB); "
                    f"{per_model['cpu-mem']} of "
                    f"{MAX_REPLICAS} replicas placed"),
        "huge": (f"wants 100000000 replicas, over the maximum of {MAX_REPLICAS} "
                 f"(MAX_REPLICAS); {MAX_REPLICAS} of them placed; set replicas to at most "
                 f"{MAX_REPLICAS}"),
    }
