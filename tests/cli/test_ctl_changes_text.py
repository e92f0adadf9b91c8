"""What ``ctl rollout status [--watch]``, ``ctl nodes drain --wait``, ``ctl apply`` and
``ctl replicas`` print for rollouts and drains, from the answers as the admin API gives
them (the commands against a real control service: test_ctl_rollout.py)."""

from __future__ import annotations

from typing import Any

import click
import pytest

from llmgw_runtime.api.admin import NodeDrain, RolloutStatus
from llmgw_runtime.cli import nodes, rollout
from llmgw_runtime.cli.ctl import apply_lines, state_text


def status(**fields: Any) -> dict[str, Any]:
    base = {"model": "chat", "state": "rolling", "definition": "3f2a9c1b7d4e",
            "previous": "9a8b7c6d5e4f", "wanted": 2, "old_ready": 1, "old_total": 1,
            "new_ready": 1, "new_total": 2, "draining": 1, "max_surge": 1,
            "max_unavailable": 0, "waiting_for": "r-abc to be ready", "since": 1.0,
            "for_s": 40.0}
    return RolloutStatus.model_validate({**base, **fields}).to_json()


def test_a_rolling_model_says_old_and_new_ready_what_it_waits_for_and_how_long() -> None:
    assert rollout.status_lines(status()) == [
        "model chat: rolling to definition 3f2a9c1b7d4e for 40s (max_surge 1, "
        "max_unavailable 0)",
        "  new: 1/2 ready (2 started)",
        "  old: 1/1 ready (definition 9a8b7c6d5e4f), 1 draining",
        "  waiting for r-abc to be ready"]


def test_a_canary_shows_requests_errors_first_byte_and_tokens_per_version() -> None:
    doc = status(state="canary", canary_percent=10, new_ready=1, new_total=1, wanted=2,
                 old_ready=2, old_total=2, draining=0, waiting_for=None, versions={
                     "canary": {"requests": 100, "errors": 2, "tokens": 5000,
                                "first_byte_s": 0.25},
                     "stable": {"requests": 900, "errors": 9, "tokens": 45000,
                                "first_byte_s": 0.2}})
    lines = [" ".join(line.split()) for line in rollout.status_lines(doc)]
    assert lines[0] == ("model chat: canary of definition 3f2a9c1b7d4e with 10 % of the "
                        "requests for 40s")
    assert lines[3:6] == ["VERSION REQUESTS ERRORS ERROR RATE FIRST BYTE TOKENS",
                          "stable 900 9 1.0 % 0.20 s 45000",
                          "canary 100 2 2.0 % 0.25 s 5000"]
    assert "`llmgw ctl rollout promote chat`" in lines[-1]


def test_a_failed_rollout_says_the_engines_error_and_what_to_do() -> None:
    lines = rollout.status_lines(status(state="failed", error="wrong magic number",
                                        waiting_for=None, draining=0))
    assert lines[0] == "model chat: rollout failed for 40s: wrong magic number"
    assert lines[1] == "  the old replicas keep serving: 1/1 ready (definition 9a8b7c6d5e4f)"
    assert "`llmgw ctl rollout undo chat`" in lines[2] and "`llmgw ctl retry chat`" in lines[2]


def test_no_rollout_names_the_definition_and_the_one_undo_goes_back_to() -> None:
    assert rollout.status_lines(status(state="none", waiting_for=None)) == [
        "model chat: no rollout; every replica runs definition 3f2a9c1b7d4e",
        "  previous definition 9a8b7c6d5e4f (`llmgw ctl rollout undo chat` goes back to it)"]


def test_watch_prints_each_change_once_until_done(capsys: pytest.CaptureFixture[str]) -> None:
    answers = iter([status(), status(new_ready=2, old_ready=0, old_total=1,
                                     waiting_for="r-old to drain"),
                    status(state="none", waiting_for=None)])
    sleeps: list[float] = []
    end = rollout.follow(lambda: next(answers), status(), sleep=sleeps.append)
    assert end["state"] == "none" and sleeps == [2.0, 2.0, 2.0]
    assert capsys.readouterr().out.splitlines() == [
        "rolling: new 2/2 ready, old 0 ready, 1 draining; waiting for r-old to drain"]


def test_watch_stops_at_a_failure() -> None:
    answers = iter([status(state="failed", error="boom")])
    assert rollout.follow(lambda: next(answers), status(), sleep=lambda _: None)[
        "state"] == "failed"


def drain(**fields: Any) -> dict[str, Any]:
    base = {"node": "gpu-01", "cordoned": True, "draining": True, "moved": 0, "total": 5}
    return NodeDrain.model_validate({**base, **fields}).to_json()


def test_drain_wait_prints_progress_when_it_changes_until_done(
        capsys: pytest.CaptureFixture[str]) -> None:
    answers = iter([drain(moved=0, waiting_for="r-abc to be ready"),
                    drain(moved=0, waiting_for="r-abc to be ready"),
                    drain(moved=3, waiting_for="r-def to be ready"),
                    drain(moved=5, done=True)])
    clock = iter(range(100))
    done, _ = nodes.follow(lambda: next(answers), None, nodes.progress_line(drain()),
                           clock=lambda: float(next(clock)), sleep=lambda _: None)
    assert done is not None and nodes.drained_line(done) == (
        "node gpu-01 drained (5/5 replicas moved); it stays cordoned until `llmgw ctl "
        "nodes uncordon gpu-01`")
    assert capsys.readouterr().out.splitlines() == [
        "moved 0/5, waiting for r-abc to be ready", "moved 3/5, waiting for r-def to be ready"]


def test_drain_wait_gives_up_at_the_timeout_with_what_is_left() -> None:
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    done, last = nodes.follow(lambda: drain(moved=2, waiting_for="r-x to be ready"), 5.0,
                              "moved 0/5", clock=lambda: now[0], sleep=sleep)
    assert done is None and last == "moved 2/5, waiting for r-x to be ready"
    assert now[0] == 5.0                      # slept to the deadline, not past it


def test_drain_timeout_is_a_duration_and_zero_waits_forever() -> None:
    assert nodes.wait_limit("10m") == 600 and nodes.wait_limit("0") is None
    assert nodes.wait_limit(None) is None
    with pytest.raises(click.BadParameter, match="not a duration"):
        nodes.wait_limit("soon")


def test_apply_says_which_models_roll() -> None:
    result = {"created": [], "updated": ["chat", "embed"], "unchanged": ["x"], "deleted": [],
              "rolls": ["chat", "embed"]}
    lines = apply_lines(result)
    assert [ln for ln in lines if ln.startswith("rolls: ")] == [
        "rolls: chat, embed (their replicas are replaced by the new definition, one at a "
        "time, each drained first: no request is dropped; `llmgw ctl rollout status MODEL` "
        "follows one)"]
    dry = apply_lines({**result, "dry_run": True})
    assert "rolls: chat, embed (their replicas would be replaced" in dry[-2]
    assert dry[-1] == "dry run: nothing was changed"
    assert not [ln for ln in apply_lines({**result, "rolls": []}) if "rolls" in ln]


def test_replicas_state_column_says_draining_and_old_definition() -> None:
    rep = {"id": "r-1", "state": "ready", "desired": True, "parts": [], "progress": None}
    assert state_text({**rep, "draining": {"reason": "rollout", "in_flight": 3,
                                           "left_s": 40.0, "since": 1.0}}) == \
        "draining (3 in flight, 40 s left)"
    assert state_text({**rep, "current": False}) == "ready, old definition"
    assert state_text({**rep, "current": True}) == "ready"


def test_nodes_listing_says_cordoned_and_draining_first() -> None:
    base = {"name": "gpu-01", "last_report": 0.0, "devices": [], "hardware": {}}
    rows = nodes.node_rows([{**base, "cordoned": True}], 0.0)
    assert rows[0] == ("gpu-01", "-", "-", "-", "-",
                       "CORDONED: no new replicas here (uncordon takes it back)")
    rows = nodes.node_rows([{**base, "cordoned": True, "draining": True}], 0.0)
    assert rows[0][-1] == "DRAINING: its replicas move elsewhere"
    assert nodes.node_rows([base], 0.0)[0][-1] == "no devices reported"
