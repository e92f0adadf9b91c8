"""llmgw.cluster.llmgw_model through real ansible-playbook runs against a real control
service: create, idempotence, update with diff, check mode, delete, server refusals; every
catalog field (a replicas range, autoscale, routing, aliases, fallback, max_tokens,
rollout, drain_timeout_s, ...)
applied and compared as the server stores it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from llmgw_runtime.cli.client import ApiError
from tests.collection.conftest import Playbook
from tests.integration.conftest import Cluster
from tests.support.certs import make_pki

pytestmark = pytest.mark.slow


def model_task(name: str = "qwen", **fields: Any) -> dict[str, Any]:
    """One llmgw_model task; the connection comes from LLMGW_CONTROL_URL/LLMGW_ADMIN_TOKEN."""
    args: dict[str, Any] = {"name": name}
    if fields.get("state") != "absent":
        args.update(source="file:///srv/models/qwen.gguf", engine="llama.cpp",
                    profile={"class": "cpu"})
    args.update(fields)
    return {"name": f"model {name}", "llmgw.cluster.llmgw_model": args}


def stored(playbook: Playbook, name: str) -> dict[str, Any] | None:
    try:
        return playbook.cluster.model(name)
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise


def test_present_creates_the_model_and_a_second_run_changes_nothing(playbook: Playbook) -> None:
    playbook.cluster.apply("models:\n  - {name: other, source: /srv/other.gguf, "
                           "engine: llama.cpp, profile: {class: cpu}}\n")
    # Server defaults left out (gpus/tp/pp/nodes, replicas) and the duration written as 30m:
    # the second run must still see no difference from what the server stored.
    declared = model_task(on_demand=True, idle_stop_after="30m", args=["--ctx-size", 512])

    first, second = playbook.run(declared, declared)

    assert first["changed"] is True
    assert first["model"]["name"] == "qwen"
    assert first["model"]["idle_stop_after_s"] == 1800
    assert first["model"]["profile"] == {"class": "cpu", "gpus": 1, "tp": 1, "pp": 1,
                                         "nodes": 1}
    assert "state" in first["model"]
    assert second["changed"] is False, second
    assert second["changed_fields"] == []
    assert stored(playbook, "qwen")["args"] == ["--ctx-size", "512"]
    assert stored(playbook, "other") is not None, "the upsert must not delete other models"


def test_a_changed_field_updates_the_model_and_the_diff_shows_it(playbook: Playbook) -> None:
    playbook.run(model_task(replicas=1))

    changed, again = playbook.run({**model_task(replicas=3), "diff": True},
                                  model_task(replicas=3))

    assert changed["changed"] is True
    assert changed["changed_fields"] == ["replicas"]
    assert changed["diff"]["before"]["replicas"] == 1
    assert changed["diff"]["after"]["replicas"] == 3
    assert changed["model"]["replicas"] == 3
    assert stored(playbook, "qwen")["replicas"] == 3
    assert again["changed"] is False


def test_check_mode_reports_the_change_but_leaves_the_server_untouched(
        playbook: Playbook) -> None:
    new, = playbook.run({**model_task(), "check_mode": True})
    assert new["changed"] is True
    assert stored(playbook, "qwen") is None

    playbook.run(model_task(engine="llama.cpp"))
    update, delete = playbook.run({**model_task(engine="vllm"), "check_mode": True},
                                  {**model_task(state="absent"), "check_mode": True})

    assert update["changed"] is True and update["changed_fields"] == ["engine"]
    assert update["model"]["engine"] == "vllm"          # the preview
    assert delete["changed"] is True
    model = stored(playbook, "qwen")
    assert model is not None and model["engine"] == "llama.cpp"


def test_absent_deletes_the_model_and_a_second_run_changes_nothing(playbook: Playbook) -> None:
    playbook.run(model_task())

    deleted, again = playbook.run({**model_task(state="absent"), "diff": True},
                                  model_task(state="absent"))

    assert deleted["changed"] is True
    assert deleted["diff"]["before"]["name"] == "qwen" and deleted["diff"]["after"] == {}
    assert again["changed"] is False
    assert stored(playbook, "qwen") is None


def test_an_entry_the_server_refuses_fails_with_its_message(playbook: Playbook) -> None:
    # The connection given as options this time, not through the environment.
    task = model_task(engine="foo", control_url=playbook.cluster.control_url,
                      token=playbook.cluster.admin_token)
    playbook.env.pop("LLMGW_CONTROL_URL")
    playbook.env.pop("LLMGW_ADMIN_TOKEN")

    failed, = playbook.run(task, expect_rc=2)

    assert failed["failed"] is True
    assert failed["status"] == 400 and failed["reason"] == "invalid_catalog"
    assert "engine 'foo' is unknown" in failed["msg"]
    assert any("engine 'foo' is unknown" in d for d in failed["details"])
    assert playbook.cluster.admin_token not in str(failed)
    assert stored(playbook, "qwen") is None


def test_https_verifies_the_control_service_with_ca_path(cluster_factory: Any,
                                                         tmp_path: Path) -> None:
    ca = make_pki(tmp_path / "pki")
    cluster: Cluster = cluster_factory(pki=tmp_path / "pki")
    cluster.start_control()
    workdir = tmp_path / "ansible"
    workdir.mkdir()
    playbook = Playbook(cluster, workdir)

    trusted, untrusted = playbook.run(model_task(ca_path=str(ca)),
                                      {**model_task(name="other"), "ignore_errors": True})

    assert trusted["changed"] is True and cluster.model("qwen")["engine"] == "llama.cpp"
    assert untrusted["failed"] is True
    assert "cannot verify the TLS certificate" in untrusted["msg"], untrusted["msg"]


# ------------------------------------------------------------ the catalog's newer fields

RANGE_AND_AUTOSCALE: dict[str, Any] = {
    "replicas": {"min": 1, "max": 3},
    "autoscale": {"wait_target_s": 5, "up_after_s": "2m", "busy_below": 0.25,
                  "down_after_s": "15m", "cooldown_s": 90},
    "routing": "least-outstanding", "slots": 4, "max_queue": 10, "max_wait_s": 20,
    "aliases": ["gpt-4o-mini", "small-chat"], "fallback": ["other"], "strategy": "spread",
    "sha256": "AB" * 32, "size_bytes": 1234,
    "max_tokens": {"default": 256, "max": 4096, "clamp": True}}


def other_model(playbook: Playbook) -> None:
    """A model for fallbacks to name."""
    playbook.cluster.apply("models:\n  - {name: other, source: /srv/other.gguf, "
                           "engine: llama.cpp, profile: {class: cpu}}\n")


def test_every_catalog_field_is_applied_and_a_second_run_changes_nothing(
        playbook: Playbook) -> None:
    other_model(playbook)
    full = model_task(**RANGE_AND_AUTOSCALE)
    # min 0 and no autoscale: the server stores on_demand true and every autoscale default.
    on_demand = model_task("batch", replicas={"min": 0, "max": 3}, idle_stop_after="30m")

    first, first_batch, second, second_batch = playbook.run(full, on_demand,
                                                            {**full, "diff": True}, on_demand)

    assert first["changed"] is True and first_batch["changed"] is True
    model = stored(playbook, "qwen")
    assert (model["replicas"], model["replicas_max"], model["on_demand"]) == (1, 3, False)
    assert model["autoscale"] == {"wait_target_s": 5.0, "up_after_s": 120.0,
                                  "busy_below": 0.25, "down_after_s": 900.0,
                                  "cooldown_s": 90.0}
    assert {k: model[k] for k in ("routing", "slots", "max_queue", "max_wait_s", "aliases",
                                  "fallback", "strategy", "sha256", "size_bytes",
                                  "max_tokens")} == {
        "routing": "least-outstanding", "slots": 4, "max_queue": 10, "max_wait_s": 20.0,
        "aliases": ["gpt-4o-mini", "small-chat"], "fallback": ["other"],
        "strategy": "spread", "sha256": "ab" * 32, "size_bytes": 1234,
        "max_tokens": {"default": 256, "max": 4096, "clamp": True}}
    assert first["model"]["replicas_max"] == 3
    batch = stored(playbook, "batch")
    assert (batch["replicas"], batch["replicas_max"], batch["on_demand"]) == (0, 3, True)
    assert batch["autoscale"]["down_after_s"] == 300.0
    assert second["changed"] is False and second["changed_fields"] == [], second
    assert second["diff"]["before"] == second["diff"]["after"]
    assert second_batch["changed"] is False, second_batch


def test_max_tokens_is_created_compared_with_its_defaults_and_changed(
        playbook: Playbook) -> None:
    capped = model_task(max_tokens={"max": 4096})

    first, second, clamped, again, lifted = playbook.run(
        capped, {**capped, "diff": True},
        model_task(max_tokens={"max": 4096, "clamp": True}),
        model_task(max_tokens={"max": 4096, "clamp": True}),
        model_task())

    assert first["changed"] is True
    assert first["model"]["max_tokens"] == {"default": None, "max": 4096, "clamp": False}
    assert second["changed"] is False and second["changed_fields"] == [], second
    assert second["diff"]["before"] == second["diff"]["after"]
    assert clamped["changed_fields"] == ["max_tokens"]
    assert again["changed"] is False, again
    assert lifted["changed_fields"] == ["max_tokens"]
    assert stored(playbook, "qwen")["max_tokens"] is None


def test_rollout_and_drain_timeout_are_created_compared_as_stored_and_changed(
        playbook: Playbook) -> None:
    declared = model_task(replicas=2, rollout={"max_unavailable": 1}, drain_timeout_s="2m")

    first, second, surged, longer, again, unset = playbook.run(
        declared, {**declared, "diff": True},
        model_task(replicas=2, rollout={"max_surge": 2, "max_unavailable": 1},
                   drain_timeout_s="2m"),
        model_task(replicas=2, rollout={"max_surge": 2, "max_unavailable": 1},
                   drain_timeout_s=600),
        model_task(replicas=2, rollout={"max_surge": 2, "max_unavailable": 1},
                   drain_timeout_s="10m"),
        model_task(replicas=2))

    assert first["changed"] is True
    assert first["model"]["rollout"] == {"max_surge": 1, "max_unavailable": 1,
                                         "canary_percent": 0}
    assert first["model"]["drain_timeout_s"] == 120.0
    assert second["changed"] is False and second["changed_fields"] == [], second
    assert second["diff"]["before"] == second["diff"]["after"]
    assert surged["changed_fields"] == ["rollout"]
    assert longer["changed_fields"] == ["drain_timeout_s"]
    assert again["changed"] is False, again
    assert unset["changed_fields"] == ["rollout", "drain_timeout_s"]
    model = stored(playbook, "qwen")
    assert (model["rollout"], model["drain_timeout_s"]) == (None, 120.0)


def test_a_changed_range_is_reported_and_applied(playbook: Playbook) -> None:
    playbook.run(model_task(replicas={"min": 1, "max": 3}))

    preview, wider, tuned, fixed, again = playbook.run(
        {**model_task(replicas={"min": 1, "max": 5}), "check_mode": True},
        {**model_task(replicas={"min": 1, "max": 5}), "diff": True},
        model_task(replicas={"min": 1, "max": 5}, autoscale={"cooldown_s": "5m"}),
        model_task(replicas=2),
        model_task(replicas=2))

    assert preview["changed"] is True and preview["changed_fields"] == ["replicas_max"]
    assert preview["model"]["replicas_max"] == 5
    assert wider["changed"] is True and wider["changed_fields"] == ["replicas_max"]
    assert wider["diff"]["before"]["replicas_max"] == 3
    assert wider["diff"]["after"]["replicas_max"] == 5
    assert wider["model"]["replicas_max"] == 5
    assert tuned["changed_fields"] == ["autoscale"]
    assert tuned["model"]["autoscale"]["cooldown_s"] == 300.0
    # a number: no max, nothing to scale, so no autoscale settings either
    assert fixed["changed_fields"] == ["replicas", "replicas_max", "autoscale"]
    assert again["changed"] is False
    model = stored(playbook, "qwen")
    assert (model["replicas"], model["replicas_max"], model["autoscale"]) == (2, None, None)


def test_a_bad_value_is_refused_with_the_servers_message(playbook: Playbook) -> None:
    other_model(playbook)
    playbook.run(model_task(replicas={"min": 0, "max": 3}))
    bad = {
        # the same model as stored but for on_demand: false, which min 0 contradicts
        "replicas.min 0 means on demand": {"replicas": {"min": 0, "max": 3},
                                           "on_demand": False},
        "replicas.min (3) is above replicas.max (1); swap them": {
            "replicas": {"min": 3, "max": 1}},
        "autoscale applies to a model whose replicas is a range": {
            "replicas": 2, "autoscale": {"cooldown_s": 30}},
        "autoscale.busy_below must be a share of the slots between 0 and 1": {
            "replicas": {"min": 0, "max": 3}, "autoscale": {"busy_below": 30}},
        "routing 'sticky' is unknown": {"routing": "sticky"},
        "fallback nope is not a model of the catalog": {"fallback": ["nope"]},
        "alias other is already the name of model other": {"aliases": ["other"]},
        "max_tokens default (5000) is above max (100); lower the default or raise the max": {
            "replicas": {"min": 0, "max": 3}, "max_tokens": {"default": 5000, "max": 100}},
        "max_surge and max_unavailable are both 0": {
            "replicas": {"min": 0, "max": 3}, "rollout": {"max_surge": 0, "max_unavailable": 0}},
    }

    results = playbook.run(*({**model_task(**fields), "ignore_errors": True}
                             for fields in bad.values()))

    for why, result in zip(bad, results, strict=True):
        assert result["failed"] is True and result["status"] == 400, result
        assert why in result["msg"], (why, result["msg"])
    model = stored(playbook, "qwen")
    assert (model["replicas"], model["replicas_max"], model["on_demand"]) == (0, 3, True)
    assert (model["routing"], model["fallback"], model["aliases"], model["max_tokens"]) == (
        "prefix-affinity", [], [], None)
