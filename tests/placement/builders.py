"""Small builders for planner tests: specs, nodes, devices, replicas, snapshots."""

from __future__ import annotations

import random
from typing import Any

from llmgw_runtime.api.catalog import ModelSpec, Profile
from llmgw_runtime.placement import (
    DeviceView,
    ModelView,
    NodeView,
    PartView,
    Plan,
    ReplicaView,
    Snapshot,
)

NOW = 1_000_000.0
SRC = "hf://org/model"
MIG = "a100-80g-mig-3g.40gb"


def spec(name: str = "m", klass: str = "a100-80g", gpus: int = 1, nodes: int = 1,
         memory: float | None = None, engine: str = "llama.cpp", source: str = SRC,
         strategy: str = "binpack") -> ModelSpec:
    return ModelSpec(name=name, source=source, engine=engine, strategy=strategy,
                     profile=Profile(klass=klass, gpus=gpus, tp=gpus * nodes, nodes=nodes,
                                     memory_gb=memory))


def want(n: int = 1, **kwargs: Any) -> ModelView:
    """A model view wanting ``n`` replicas; keyword arguments go to ``spec``."""
    return ModelView(spec(**kwargs), wanted=n)


def gpu(i: int, klass: str = "a100-80g", total_gb: float = 80, used_gb: float = 0,
        healthy: bool = True) -> DeviceView:
    return DeviceView(id=i, klass=klass, memory_total_mb=int(total_gb * 1024),
                      memory_used_mb=int(used_gb * 1024), healthy=healthy)


def gpus(n: int, klass: str = "a100-80g") -> tuple[DeviceView, ...]:
    return tuple(gpu(i, klass) for i in range(n))


def mig(card: int, instance: int, klass: str = MIG) -> DeviceView:
    return DeviceView(id=1000 + 100 * card + instance, klass=klass, memory_total_mb=40 * 1024)


def node(name: str, *devices: DeviceView, engines: tuple[str, ...] = ("llama.cpp", "vllm"),
         age: float | None = 1.0, fabric: str | None = None,
         weights: frozenset[str] | None = None,
         shared: frozenset[str] = frozenset()) -> NodeView:
    return NodeView(name=name, devices=devices, engines=engines,
                    last_report=None if age is None else NOW - age, fabric=fabric,
                    weights=weights, shared_weights=shared)


def rep(id_: str, model: str, node_: str, devices: tuple[int, ...], state: str = "ready",
        started: float = NOW - 100, parts: tuple[PartView, ...] = ()) -> ReplicaView:
    return ReplicaView(id=id_, model=model, node=node_, devices=devices, state=state,
                       started=started, parts=parts)


def snap(models: list[ModelView], nodes: list[NodeView],
         replicas: tuple[ReplicaView, ...] | list[ReplicaView] = (),
         replace_after: float = 120.0) -> Snapshot:
    return Snapshot(models=tuple(models), nodes=tuple(nodes), replicas=tuple(replicas),
                    now=NOW, replace_after_s=replace_after)


def where(plan: Plan) -> list[tuple[str, str, tuple[int, ...]]]:
    return [(s.model, s.node, s.devices) for s in plan.starts]


def as_running(before: Snapshot, plan: Plan) -> Snapshot:
    """The snapshot after ``plan``'s starts became ready replicas (and its stops went)."""
    kept = [r for r in before.replicas if r.id not in plan.stops]
    new = [ReplicaView(id=f"new-{i:04d}", model=s.model, node=s.node, devices=s.devices,
                       state="ready", started=before.now,
                       parts=tuple(PartView(p.rank, p.node, p.devices) for p in s.parts))
           for i, s in enumerate(plan.starts)]
    return Snapshot(models=before.models, nodes=before.nodes, replicas=(*kept, *new),
                    now=before.now, node_timeout_s=before.node_timeout_s,
                    replace_after_s=before.replace_after_s)


def small_fleet(seed: int = 3, size: int = 40) -> Snapshot:
    """A seeded mixed fleet: classes, MIG, fabrics (and none), weights, some busy models."""
    rnd = random.Random(seed)
    nodes = []
    for i in range(size):
        kind = rnd.choice(["a100-80g", "h100-80g", "mig"])
        devices = (tuple(mig(c, j) for c in range(2) for j in range(2)) if kind == "mig"
                   else tuple(gpu(c, kind, healthy=rnd.random() > 0.05) for c in range(8)))
        nodes.append(node(f"n{i:02d}", *devices,
                          fabric=rnd.choice(["ib-a", "ib-b", None]),
                          weights=rnd.choice([None, frozenset(), frozenset({f"s{i % 7}"})]),
                          shared=frozenset({"s1"}) if rnd.random() < 0.1 else frozenset()))
    models = []
    for i in range(30):
        roll = rnd.random()
        kw: dict[str, Any] = {"name": f"m{i:02d}", "source": f"s{i % 7}",
                                 "klass": rnd.choice(["a100-80g", "h100-80g"]),
                                 "strategy": rnd.choice(["binpack", "spread"])}
        if roll < 0.1:
            kw.update(gpus=8, nodes=2, engine="vllm")
        elif roll < 0.3:
            kw.update(klass=MIG)
        elif roll < 0.45:
            kw.update(memory=rnd.choice([10.0, 30.0]))
        else:
            kw.update(gpus=rnd.choice([1, 1, 2, 4]))
        models.append(want(rnd.randint(1, 4), **kw))
    return snap(models, nodes)


def cpu(total_gb: float = 16, used_gb: float = 0) -> DeviceView:
    """The CPU as one shared device (id 0), as the agent's CpuSource reports it."""
    return DeviceView(id=0, klass="cpu", memory_total_mb=int(total_gb * 1024),
                      memory_used_mb=int(used_gb * 1024))


def large_fleet(size: int = 2000, seed: int = 5) -> list[NodeView]:
    """A seeded synthetic fleet of ``size`` nodes: a quarter CPU-only, the rest 8 x a100-80g
    (a few unhealthy), in three fabrics and none, some holding the weights."""
    rnd = random.Random(seed)
    nodes = []
    for i in range(size):
        if i % 4 == 0:
            devices: tuple[DeviceView, ...] = (cpu(64, used_gb=rnd.choice([2, 8, 30])),)
        else:
            devices = tuple(gpu(c, healthy=rnd.random() > 0.02) for c in range(8))
        nodes.append(node(f"n{i:04d}", *devices, fabric=rnd.choice(["ib-a", "ib-b", "ib-c", None]),
                          weights=rnd.choice([None, frozenset({SRC})])))
    return nodes
