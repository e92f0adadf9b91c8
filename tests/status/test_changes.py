"""Rollouts, drains and cordons in the one summary and in ``ctl status``: what an operator
sees of a model whose replicas a new definition replaces, a canary, a failed rollout, a
replica finishing its requests, a node taken out of placement (issue 27)."""

from __future__ import annotations

import json
from importlib import resources

import jsonschema

from llmgw_runtime.status import changes, summary
from llmgw_runtime.status.render import render
from tests.status.builders import NOW, gpu, model, node, replica

SCHEMA = json.loads(resources.files("llmgw_runtime.status")
                    .joinpath("status.schema.json").read_text())


def rolling(name: str, state: str, **stored: object) -> dict:
    m = model(name, ready=2, wanted=2)
    m["rollout_state"] = json.dumps({"state": state, "since": NOW - 40, **stored})
    m["rollout"] = {"max_surge": 1, "max_unavailable": 0,
                    "canary_percent": 10 if state == "canary" else 0}
    return m


def fleet() -> dict:
    """chat rolls (one new replica ready of two, one old one draining), embed runs a
    canary, code's rollout failed, gpu-02 is cordoned and gpu-03 draining."""
    models = [rolling("chat", "rolling"), rolling("embed", "canary"),
              rolling("code", "failed", error="llama_model_load: wrong magic number"),
              model("plain")]
    nodes = [node("gpu-01", gpu(0), gpu(1), gpu(2), gpu(3)),
             {**node("gpu-02", gpu(0)), "cordoned": True},
             {**node("gpu-03", gpu(0), gpu(1)), "cordoned": True, "draining": True}]
    old = {"current": False}
    draining = {"draining": {"reason": "rollout", "in_flight": 3, "left_s": 39.2,
                             "since": NOW - 80}}
    replicas = [
        {**replica("r-chat-new", "chat", "gpu-01", [0]), "current": True},
        {**replica("r-chat-old", "chat", "gpu-01", [1]), **old},
        {**replica("r-chat-gone", "chat", "gpu-03", [0]), **old, **draining},
        {**replica("r-embed-new", "embed", "gpu-01", [2])},
        {**replica("r-embed-old", "embed", "gpu-03", [1]), **old},
        {**replica("r-code-old", "code", "gpu-02", [0]), **old},
        replica("r-plain", "plain", "gpu-01", [3]),
    ]
    return summary.build(models, nodes, replicas, NOW, 30.0, idle_after_s=900)


def test_the_summary_says_which_models_roll_and_which_nodes_are_out() -> None:
    s = fleet()
    jsonschema.validate(s, SCHEMA)
    assert s["nodes"]["cordoned"] == 1 and s["nodes"]["draining"] == 1
    assert s["maintenance"] == [{"name": "gpu-02", "state": "cordoned", "replicas": 1},
                                {"name": "gpu-03", "state": "draining", "replicas": 2}]
    assert s["replicas_draining"] == 1
    assert [(r["name"], r["text"]) for r in s["rollouts"]] == [
        ("chat", "rolling 1/2"), ("embed", "canary 10 %"),
        ("code", "rollout failed: llama_model_load: wrong magic number")]
    by_name = {m["name"]: m for m in s["models"]}
    assert by_name["plain"]["rollout"] is None
    # the draining old replica counts neither as old nor as new
    assert (by_name["chat"]["rollout"]["new_ready"],
            by_name["chat"]["rollout"]["old_ready"]) == (1, 1)


def test_ctl_status_shows_rollouts_and_nodes_out_of_placement() -> None:
    text = render(fleet(), 100)
    lines = [" ".join(line.split()) for line in text.splitlines()]
    assert lines[:2] == ["nodes 3/3 reporting; 1 cordoned, 1 draining",
                         "replicas: ready 7 (1 draining)"]
    assert "chat ready, rolling 1/2 2/2 -" in lines
    assert "embed ready, canary 10 % 2/2 -" in lines
    assert "code ready, rollout failed 2/2 -" in lines
    assert "rollouts (3): llmgw ctl rollout status MODEL" in lines
    assert "chat 40s rolling 1/2" in lines
    assert "code 40s rollout failed: llama_model_load: wrong magic number" in lines
    assert "nodes out of placement (2): llmgw ctl nodes uncordon NAME takes one back" in lines
    assert "gpu-03 draining 2" in lines and "gpu-02 cordoned 1" in lines
    # a draining replica is already stopping: not one "you could stop"
    assert "r-chat-gone" not in text


def test_a_fleet_with_nothing_changing_shows_no_new_lines() -> None:
    s = summary.build([model("plain")], [node("gpu-01", gpu(0))],
                      [replica("r-plain", "plain", "gpu-01", [0])], NOW, 30.0)
    assert (s["rollouts"], s["maintenance"], s["replicas_draining"]) == ([], [], 0)
    text = render(s, 100)
    assert "rollout" not in text and "cordoned" not in text and "draining" not in text


def test_a_replica_state_says_draining_or_old_definition() -> None:
    base = replica("r-1", "chat", "gpu-01", [0])
    assert changes.replica_state(base) == "ready"
    assert changes.replica_state({**base, "current": True}) == "ready"
    assert changes.replica_state({**base, "current": False}) == "ready, old definition"
    assert changes.replica_state({**base, "draining": {
        "reason": "idle", "in_flight": 3, "left_s": 39.2, "since": NOW}}) == \
        "draining (3 in flight, 40 s left)"
    assert changes.drain_text({"in_flight": 0, "left_s": 600}) == \
        "draining (0 in flight, 10 min left)"
    # a replica already told to stop is not "old definition": it is stopping
    assert changes.replica_state({**base, "state": "stopping", "desired": False,
                                  "current": False}) == "stopping"


def test_a_promoted_canary_rolls_and_a_rollout_state_of_none_is_no_rollout() -> None:
    m = rolling("chat", "canary", promoted=True)
    assert changes.rollout_of(m, [])["text"] == "rolling 0/2"
    for stored in (None, "", "not json", json.dumps({"state": "none"}), json.dumps([1])):
        assert changes.rollout_of({**model("x"), "rollout_state": stored}, []) is None
    assert changes.rollout_of({**model("x"), "rollout_state": {"state": "failed"}},
                              [])["text"] == "rollout failed"
