"""The fleet summary: one pure function behind ctl status, llmgw-status, the console and
the JSON API."""

from __future__ import annotations

import json
from importlib import resources

import jsonschema
import pytest

from llmgw_runtime.status import summary
from tests.status.builders import NOW, gpu, mig, model, node, replica, small_fleet

SCHEMA = json.loads(resources.files("llmgw_runtime.status")
                    .joinpath("status.schema.json").read_text())


def build(**kwargs: object) -> dict:
    models, nodes, replicas = small_fleet()
    return summary.build(models, nodes, replicas, NOW, 30.0, idle_after_s=900, **kwargs)


def test_capacity_by_class_counts_unhealthy_as_neither_used_nor_free() -> None:
    s = build()
    assert s["devices"]["a100-80g"] == {"total": 10, "used": 4, "free": 3, "unhealthy": 1,
                                        "unreachable": 2}
    assert s["devices"]["a100-80g-mig-3g.40gb"] == {"total": 2, "used": 1, "free": 1,
                                                    "unhealthy": 0, "unreachable": 0}


def test_free_whole_nodes_per_fabric_decide_multi_node_replicas() -> None:
    models, nodes, replicas = small_fleet()
    nodes.append(node("gpu-04", gpu(0), gpu(1), fabric="ib-a"))
    nodes.append(node("gpu-05", gpu(0), fabric="ib-b"))
    s = summary.build(models, nodes, replicas, NOW)
    # gpu-01 runs replicas, gpu-02 has an unhealthy card, mig-01 runs one: only gpu-04
    assert s["fabrics"]["ib-a"]["free_nodes"] == 1
    # gpu-03 is silent: not capacity, so not free
    assert s["fabrics"]["ib-b"] == {"nodes": 2, "reporting": 1, "free_nodes": 1, "models": []}


def test_a_multi_node_replica_uses_every_part_s_devices() -> None:
    nodes = [node("a", gpu(0), fabric="f"), node("b", gpu(0), fabric="f")]
    reps = [replica("r1", "big", "a", [0], parts=[("b", [0])])]
    s = summary.build([model("big")], nodes, reps, NOW)
    assert s["devices"]["a100-80g"]["used"] == 2 and s["fabrics"]["f"]["free_nodes"] == 0


def test_models_desired_vs_ready_parked_with_last_error_unplaceable_with_reason() -> None:
    s = build()
    by_name = {m["name"]: m for m in s["models"]}
    assert (by_name["qwen-7b"]["ready"], by_name["qwen-7b"]["wanted"]) == (2, 3)
    assert by_name["chat-demand"]["wanted"] == 0 and by_name["chat-demand"]["on_demand"]
    assert s["parked"] == [{"name": "broken", "failures": 5,
                            "last_error": "loading model\nerror: tensor 'blk.0.attn_q' "
                                          "has wrong shape"}]
    assert s["unplaceable"] == [{"name": "huge", "reason": "needs 2 whole nodes in one "
                                 "fabric; ib-a has 0 free, ib-b 0"}]
    assert s["replicas"] == {"ready": 3, "starting": 1}


def test_idle_lists_unused_replicas_longest_first_and_keeps_unknown_apart() -> None:
    models, nodes, replicas = small_fleet()
    replicas.append(replica("r-old", "llama-70b", "gpu-01", [3], last_used_ago=86400))
    s = summary.build(models, nodes, replicas, NOW, idle_after_s=900)
    idle = s["idle"]
    assert [r["id"] for r in idle["replicas"]] == ["r-old", "r-qwen-1"]   # r-llama: 30 s
    assert idle["replicas"][1] == {"id": "r-qwen-1", "model": "qwen-7b", "node": "mig-01",
                                   "devices": ["mig-01:0/mig1"], "cards": 1,
                                   "idle_s": 7200.0}
    assert idle["cards"] == 2
    assert [(r["id"], r["idle_s"]) for r in idle["unknown"]] == [("r-qwen-2", -1)]
    # a starting replica is neither idle nor unknown
    assert "r-starting" not in {r["id"] for r in idle["replicas"] + idle["unknown"]}


def test_idle_threshold_is_a_parameter() -> None:
    models, nodes, replicas = small_fleet()
    s = summary.build(models, nodes, replicas, NOW, idle_after_s=10)
    assert [r["id"] for r in s["idle"]["replicas"]] == ["r-qwen-1", "r-llama"]


def test_weights_per_fabric() -> None:
    s = build()
    assert s["fabrics"]["ib-a"]["models"] == ["llama-70b"]
    assert next(m for m in s["models"] if m["name"] == "llama-70b")[
        "fabrics_with_weights"] == ["ib-a"]


def test_store_health_is_passed_through() -> None:
    members = [{"name": "pg1", "role": "leader", "state": "running", "lag_bytes": 0,
                "missing": False}]
    s = build(store={"backend": "postgresql", "members": members})
    assert s["store"]["members"] == members
    assert build()["store"] == {"backend": "unknown", "members": None}


@pytest.mark.parametrize("fleet", ["small", "empty", "mig-only"])
def test_the_summary_matches_its_documented_json_schema(fleet: str) -> None:
    if fleet == "small":
        s = build(store={"backend": "postgresql", "members": [
            {"name": "pg1", "role": "leader", "state": "running", "lag_bytes": 0,
             "missing": False},
            {"name": "pg2", "role": None, "state": None, "lag_bytes": None, "missing": True,
             "problem": "its REST API does not answer"}]})
    elif fleet == "empty":
        s = summary.build([], [], [], NOW)
    else:
        s = summary.build([model("m")], [node("m1", mig(0, 1), mig(0, 2))],
                          [replica("r", "m", "m1", [1001], last_used_ago=5000)], NOW)
    jsonschema.validate(json.loads(json.dumps(s)), SCHEMA)


def test_the_schema_refuses_what_it_should() -> None:
    s = json.loads(json.dumps(build()))
    s["idle"]["unknown"][0]["idle_s"] = "unknown"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(s, SCHEMA)
