"""The fleet summary: one pure function behind ctl status, llmgw-status, the console and
the JSON API."""

from __future__ import annotations

import json
from importlib import resources

import jsonschema
import pytest

from llmgw_runtime.status import summary
from tests.status.builders import (
    NOW,
    big_fleet,
    cpu,
    gpu,
    mig,
    model,
    node,
    replica,
    small_fleet,
)

SCHEMA = json.loads(resources.files("llmgw_runtime.status")
                    .joinpath("status.schema.json").read_text())


def build(**kwargs: object) -> dict:
    models, nodes, replicas = small_fleet()
    return summary.build(models, nodes, replicas, NOW, 30.0, idle_after_s=900, **kwargs)


def test_capacity_by_class_counts_unhealthy_as_neither_used_nor_free() -> None:
    s = build()
    counts = ("total", "used", "free", "unhealthy", "unreachable")
    assert {k: s["devices"]["a100-80g"][k] for k in counts} == {
        "total": 10, "used": 4, "free": 3, "unhealthy": 1, "unreachable": 2}
    assert {k: s["devices"]["a100-80g-mig-3g.40gb"][k] for k in counts} == {
        "total": 2, "used": 1, "free": 1, "unhealthy": 0, "unreachable": 0}
    # whole cards: nothing shared, memory free only on the free cards (3 x 80 GB)
    assert not s["devices"]["a100-80g"]["shared"]
    assert s["devices"]["a100-80g"]["memory_free_mb"] == 3 * 81920


def cpu_fleet(*reps: dict, used_gb: float = 8) -> dict:
    """One node with --devices cpu (32 GB, ``used_gb`` in use) running ``reps`` of a CPU
    model that declares 1 GB and one that declares nothing."""
    models = [model("smol", klass="cpu", memory_gb=1), model("tiny", klass="cpu")]
    return summary.build(models, [node("cpu-01", cpu(32, used_gb))], list(reps), NOW,
                         idle_after_s=900)


def test_a_cpu_running_two_replicas_shows_its_free_memory_not_zero_free_devices() -> None:
    s = cpu_fleet(replica("a", "smol", "cpu-01", [0]), replica("b", "tiny", "cpu-01", [0]))
    c = s["devices"]["cpu"]
    assert c["shared"] and c["replicas"] == 2
    assert (c["used"], c["free"]) == (1, 0)           # one device, held
    assert c["memory_free_mb"] == 24 * 1024          # but 24 GB is still there for more
    assert c["memory_used_mb"] == 8 * 1024 and c["memory_total_mb"] == 32 * 1024


def test_shared_memory_free_counts_what_starting_replicas_will_take_like_placement() -> None:
    s = cpu_fleet(replica("a", "smol", "cpu-01", [0], state="starting"),
                  replica("b", "smol", "cpu-01", [0], state="pending"))
    # not ready yet: their 1 GB each is not in the reported memory, so it is set aside
    assert s["devices"]["cpu"]["memory_free_mb"] == 22 * 1024


def test_a_shared_device_at_its_replica_limit_has_no_memory_free() -> None:
    reps = [replica(f"r{i}", "tiny", "cpu-01", [0]) for i in range(16)]
    assert cpu_fleet(*reps)["devices"]["cpu"]["memory_free_mb"] == 0
    assert cpu_fleet(*reps[:15])["devices"]["cpu"]["memory_free_mb"] == 24 * 1024


def test_a_gpu_shared_by_memory_gb_is_shared_and_a_card_held_whole_has_no_memory_free() -> None:
    models = [model("small", memory_gb=20), model("whole")]
    nodes = [node("g", gpu(0), gpu(1), gpu(2))]
    reps = [replica("s1", "small", "g", [0]), replica("s2", "small", "g", [0]),
            replica("w", "whole", "g", [1])]
    c = summary.build(models, nodes, reps, NOW)["devices"]["a100-80g"]
    assert c["shared"] and c["replicas"] == 3 and (c["used"], c["free"]) == (2, 1)
    assert c["memory_free_mb"] == 2 * 81920          # card 0 (shared) and card 2 (free)
    # Without the models (what holds card 0 is unknown) card 0 is held whole, like placement
    c = summary.build([], nodes, reps, NOW)["devices"]["a100-80g"]
    assert not c["shared"] and c["memory_free_mb"] == 81920


def test_the_memory_free_is_what_placement_would_place_by() -> None:
    """The summary and the planner agree: a model of memory_gb just under the CPU's free
    memory is placed there, one just over it is not."""
    from llmgw_runtime.placement import place
    from tests.placement import builders as pb

    reps = (replica("a", "smol", "cpu-01", [0], state="starting"),)
    free_gb = cpu_fleet(*reps)["devices"]["cpu"]["memory_free_mb"] / 1024
    assert free_gb == 23
    view = pb.node("cpu-01", pb.gpu(0, "cpu", total_gb=32, used_gb=8), age=1.0)
    existing = (pb.rep("a", "smol", "cpu-01", (0,), state="starting"),)
    for need, fits in ((free_gb - 0.5, True), (free_gb + 0.5, False)):
        snap = pb.Snapshot(models=(pb.ModelView(pb.spec("smol", "cpu", memory=1), wanted=1),
                                   pb.want(1, name="next", klass="cpu", memory=need)),
                           nodes=(view,), replicas=existing, now=pb.NOW)
        plan = place(snap)
        assert bool(plan.starts) is fits, (need, plan)


def test_idle_replicas_sharing_one_device_hold_one_device_not_one_each() -> None:
    s = cpu_fleet(replica("a", "smol", "cpu-01", [0], last_used_ago=3600),
                  replica("b", "tiny", "cpu-01", [0], last_used_ago=7200),
                  replica("c", "tiny", "cpu-01", [0]), replica("d", "smol", "cpu-01", [0]))
    assert [r["id"] for r in s["idle"]["replicas"]] == ["b", "a"]
    assert s["idle"]["cards"] == 1 and s["idle"]["unknown_cards"] == 1
    jsonschema.validate(json.loads(json.dumps(s)), SCHEMA)


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


# A failing model, poll after poll (issue 28: it showed `starting` for ~95 s with FAILURES
# 2, 3, 4, and its reason came and went between the error and blank).
ENGINE_LOG = ("start failed: exited with 1; last log lines:\nllama_model_loader: loaded\n"
              "error: unknown argument: --flash-attn-bogus\nusage: llama-server [options]")
TELLING = "start failed: exited with 1: error: unknown argument: --flash-attn-bogus"


def poll(row: object, reps: list[object], now: float) -> tuple[dict, str]:
    """The model as the control service shows it at ``now`` (fleet.models_view's state,
    reason and streak, from the pure states), the summary, and its line of ``ctl status``."""
    from llmgw_runtime.control import states
    from llmgw_runtime.status.render import render

    state = states.model_state(row, reps, now)
    entry = {**model("m", state=state.state, ready=state.ready, wanted=state.wanted,
                     reason=state.reason, klass="cpu", failures=row.consecutive_failures,
                     last_error=row.last_error),
             "failing": states.failing(row, reps, state, now,
                                       (states.BACKOFF_BASE_S, states.BACKOFF_CAP_S))}
    s = summary.build([entry], [node("n1", cpu())], [], now)
    jsonschema.validate(json.loads(json.dumps(s)), SCHEMA)
    line = next(line for line in render(s, width=160, sections=("models",)).splitlines()
                if line.startswith("  m "))
    return s["models"][0], line


def test_a_failing_model_says_failing_with_its_last_error_at_every_poll() -> None:
    from tests.control.test_decide import model as model_row
    from tests.control.test_decide import replica as replica_row

    t0 = NOW
    row = model_row(consecutive_failures=3, last_failure_at=t0, last_error=ENGINE_LOG)
    failed = replica_row("r-3", state="failed", desired=0, last_error=ENGINE_LOG)
    seen = []
    for t, reps in [(0, [failed]), (10, [failed]),             # the backoff after the 3rd
                    (20, [failed, replica_row("r-4", state="pending")]),   # the 4th start
                    (30, [failed, replica_row("r-4", state="starting")])]:
        m, line = poll(row, reps, t0 + t)
        assert m["state"] == "starting" and m["reason"] == ENGINE_LOG, (t, m)
        assert TELLING in line and "  starting" not in line, line
        seen.append(m["failing"]["text"])
    assert seen == ["failing (3 in a row, next start in 20 s)",
                    "failing (3 in a row, next start in 10 s)",
                    "failing (3 in a row, starting again)",
                    "failing (3 in a row, starting again)"]
    row.consecutive_failures, row.last_failure_at = 4, t0 + 50   # the 4th failed too
    m, line = poll(row, [failed], t0 + 50)
    assert m["failing"]["text"] == "failing (4 in a row, next start in 40 s)" and TELLING in line
    row.consecutive_failures = 0                                  # a start succeeded
    ready = replica_row("r-5", state="ready")
    assert poll(row, [ready], t0 + 99)[0]["failing"] is None


def test_at_capacity_with_a_slot_free_says_requests_wait_for_their_prefix() -> None:
    from llmgw_runtime.api.catalog import default

    assert summary.AFFINITY == default("routing")        # the one the summary may not import
    report = {"since": NOW - 5, "waiting": 2, "in_flight": 2, "slots": 3, "rejected": 0,
              "wait_p90_s": 0.0}
    m = {**model("chat"), "routing": "prefix-affinity", "max_wait_s": 30.0,
         "capacity_at": NOW - 1, "capacity": report}
    assert summary.at_capacity(m, NOW)["note"] == (
        "2 waiting for the replica holding their prompt's prefix (at most 15 s, then any "
        "free slot); 2/3 slots busy")
    by_load = {**m, "routing": "least-outstanding"}
    assert summary.at_capacity(by_load, NOW)["note"] == "2 waiting; 2/3 slots busy"
    full = {**m, "capacity": {**report, "in_flight": 3}}
    assert summary.at_capacity(full, NOW)["note"] == "2 waiting; 3/3 slots busy"


def test_kept_node_facts_give_the_same_summary() -> None:
    """The facts a caller keeps with each node's decoded report (control/summary_view)
    give the summary made without them: silent nodes, unhealthy cards, MIG, nodes with
    replicas (counted device by device), shared devices; and one kept for a node but not
    another."""
    cpus = ([model("m", klass="cpu")], [node("c1", cpu()), node("c2", cpu(), age=600),
                                         node("c3", cpu(used_gb=40))], [])
    for models, nodes, replicas in (small_fleet(), big_fleet(400, 60), cpus):
        facts = {n["name"]: summary.node_facts(n) for n in nodes}
        assert summary.build(models, nodes, replicas, NOW, facts=facts) \
            == summary.build(models, nodes, replicas, NOW)
        some = dict(list(facts.items())[::2])
        assert summary.build(models, nodes, replicas, NOW, facts=some) \
            == summary.build(models, nodes, replicas, NOW)
