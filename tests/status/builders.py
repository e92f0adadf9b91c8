"""Fleets as the control service's API shows them (node, replica and model objects), for
the summary and its renderings."""

from __future__ import annotations

from typing import Any

NOW = 2_000_000.0


def gpu(i: int, klass: str = "a100-80g", healthy: bool = True,
        reason: str | None = None) -> dict[str, Any]:
    return {"id": i, "card": i, "mig": None, "class": klass, "memory_total_mb": 81920,
            "memory_used_mb": 0, "healthy": healthy, "reason": reason}


def mig(card: int, instance: int, klass: str = "a100-80g-mig-3g.40gb") -> dict[str, Any]:
    return {"id": 1000 + 100 * card + instance, "card": card, "mig": instance,
            "class": klass, "memory_total_mb": 40960, "memory_used_mb": 0, "healthy": True}


def cpu(total_gb: float = 32, used_gb: float = 8) -> dict[str, Any]:
    """The CPU as the agent reports it with --devices cpu: one device, the node's memory."""
    return {"id": 0, "card": 0, "mig": None, "class": "cpu",
            "memory_total_mb": int(total_gb * 1024), "memory_used_mb": int(used_gb * 1024),
            "healthy": True, "reason": None}


def node(name: str, *devices: dict[str, Any], fabric: str | None = None,
         age: float | None = 1.0, weights: dict[str, Any] | None = None,
         hardware: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"name": name, "fabric": fabric, "address": "10.0.0.1",
            "last_report": None if age is None else NOW - age, "agent_version": "0.1.0",
            "devices": list(devices), "engines": ["llama.cpp", "vllm"],
            "weights": weights or {}, "hardware": hardware or {}}


def replica(id_: str, model: str, node_: str, devices: list[int], state: str = "ready",
            last_used_ago: float | None = None,
            parts: list[tuple[str, list[int]]] = ()) -> dict[str, Any]:  # type: ignore[assignment]
    return {"id": id_, "model": model, "node": node_, "devices": devices, "port": 9000,
            "pid": 1, "state": state, "desired": True, "started": NOW - 3600,
            "updated": NOW, "last_error": None, "rendezvous_port": None, "progress": None,
            "last_used": None if last_used_ago is None else NOW - last_used_ago,
            "parts": [{"rank": i + 1, "node": n, "devices": d, "state": state, "pid": 2,
                       "last_error": None} for i, (n, d) in enumerate(parts)]}


def model(name: str, state: str = "ready", ready: int = 1, wanted: int = 1,
          reason: str | None = None, on_demand: bool = False, failures: int = 0,
          last_error: str | None = None, source: str | None = None,
          klass: str = "a100-80g", memory_gb: float | None = None) -> dict[str, Any]:
    return {"name": name, "source": source or f"hf://org/{name}", "state": state,
            "profile": {"class": klass, "gpus": 1, "memory_gb": memory_gb},
            "ready": ready, "wanted": wanted, "reason": reason, "on_demand": on_demand,
            "parked": state == "parked", "consecutive_failures": failures,
            "last_error": last_error}


def small_fleet() -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """Four nodes: two A100 nodes on ib-a (one with an unhealthy card), a MIG node, one
    silent node on ib-b; models ready, parked, unplaceable and on demand; replicas idle,
    recently used and never reported."""
    nodes = [
        node("gpu-01", gpu(0), gpu(1), gpu(2), gpu(3), fabric="ib-a",
             weights={"sources": {"hf://org/llama-70b": {"shared": False}}}),
        node("gpu-02", gpu(0), gpu(1, healthy=False, reason="XID 79: fell off the bus"),
             gpu(2), gpu(3), fabric="ib-a"),
        node("mig-01", mig(0, 1), mig(0, 2), fabric="ib-a", hardware={"cards": [
            {"index": 1, "name": "NVIDIA A100-SXM4-80GB", "klass": "a100-80g",
             "problem": "MIG mode is enabled but no GPU instance is carved",
             "hint": "carve instances: nvidia-smi mig -i 1 -cgi 9,9 -C"}]}),
        node("gpu-03", gpu(0), gpu(1), fabric="ib-b", age=600),
    ]
    models = [
        model("llama-70b", ready=1, wanted=1),
        model("qwen-7b", state="starting", ready=2, wanted=3),
        model("broken", state="parked", ready=0, wanted=1, failures=5,
              reason="parked after 5 failed starts",
              last_error="loading model\nerror: tensor 'blk.0.attn_q' has wrong shape"),
        model("huge", state="unplaceable", ready=0, wanted=1,
              reason="needs 2 whole nodes in one fabric; ib-a has 0 free, ib-b 0"),
        model("chat-demand", state="idle", ready=0, wanted=0, on_demand=True),
    ]
    replicas = [
        replica("r-llama", "llama-70b", "gpu-01", [0, 1], last_used_ago=30),
        replica("r-qwen-1", "qwen-7b", "mig-01", [1001], last_used_ago=7200),
        replica("r-qwen-2", "qwen-7b", "gpu-02", [0], last_used_ago=None),
        replica("r-starting", "qwen-7b", "gpu-01", [2], state="starting"),
    ]
    return models, nodes, replicas


def big_fleet(n_nodes: int = 2000, n_models: int = 1000,
              ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """``n_nodes`` x 8 GPUs in 4 fabrics (every 10th node MIG, 1 in 100 silent, a few
    unhealthy cards), ``n_models`` models, about two replicas per model: what an operator
    of a large fleet sees."""
    nodes, replicas, models = [], [], []
    for i in range(n_nodes):
        name = f"gpu-{i:04d}"
        if i % 10 == 9:
            devs = [mig(c, k) for c in range(8) for k in (1, 2)]
        else:
            devs = [gpu(c, "h100-80g", healthy=(i * 8 + c) % 997 != 0,
                        reason="XID 79") for c in range(8)]
        nodes.append(node(name, *devs, fabric=f"ib-{'abcd'[i % 4]}",
                          age=600 if i % 100 == 42 else 1.0))
    slot = 0
    for m in range(n_models):
        name = f"model-{m:04d}"
        if m % 97 == 5:
            models.append(model(name, state="parked", ready=0, wanted=1, failures=5,
                                reason="parked after 5 failed starts",
                                last_error=f"engine exited with code 1 on model {m}"))
            continue
        if m % 89 == 7:
            models.append(model(name, state="unplaceable", ready=0, wanted=2,
                                reason="needs 2 x h100-80g on one node; the most free on "
                                       "one node is 1 (gpu-0001)"))
            continue
        models.append(model(name, ready=2, wanted=2))
        for k in range(2):
            n = slot // 8 % n_nodes
            card = slot % 8
            slot += 8 if n % 10 == 9 else 1
            dev = 1000 + 100 * card + 1 if n % 10 == 9 else card
            replicas.append(replica(f"r-{m:04d}-{k}", name, f"gpu-{n:04d}", [dev],
                                    last_used_ago=None if m % 50 == 0
                                    else float((m * 37 + k * 11) % 7200)))
    return models, nodes, replicas
