"""Models at capacity: the summary marks a model a router reported at capacity within
AT_CAPACITY_S, and ctl status shows it on the model's line and in its own list."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import jsonschema
import pytest

from llmgw_runtime.status import summary
from llmgw_runtime.status.render import render
from tests.status.builders import NOW, gpu, model, node, replica

SCHEMA = json.loads(resources.files("llmgw_runtime.status")
                    .joinpath("status.schema.json").read_text())
REPORT = {"since": NOW - 12, "reports": 9, "waiting": 6, "in_flight": 4, "slots": 4,
          "rejected": 14, "wait_p90_s": 2.5}


def full(name: str, ago: float | None, report: dict[str, Any] | None = None,
         **kw: Any) -> dict[str, Any]:
    """A model as models_view gives it, last reported at capacity ``ago`` seconds ago."""
    return {**model(name, **kw), "capacity_at": None if ago is None else NOW - ago,
            "capacity": REPORT if report is None else report}


@pytest.mark.parametrize(("ago", "at_capacity"), [
    (None, False),                        # never reported
    (0.0, True),
    (5.0, True),
    (summary.AT_CAPACITY_S, True),        # the edge counts
    (summary.AT_CAPACITY_S + 0.1, False),
    (3600.0, False),
])
def test_a_model_is_at_capacity_only_when_reported_within_the_window(
        ago: float | None, at_capacity: bool) -> None:
    assert (summary.at_capacity(full("m", ago), NOW) is not None) == at_capacity


def test_what_is_at_capacity_says() -> None:
    c = summary.at_capacity(full("m", 3.0), NOW)
    assert c == {"reported_s_ago": 3.0, "waiting": 6, "in_flight": 4, "slots": 4,
                 "rejected": 14, "wait_p90_s": 2.5, "window_s": 12.0,
                 "note": "6 waiting, 14 refused in the last 12 s; 4/4 slots busy; "
                         "p90 wait 2.5 s"}
    quiet = summary.at_capacity(full("m", 1.0, {**REPORT, "rejected": 0, "wait_p90_s": 0}),
                                NOW)
    assert quiet is not None and quiet["note"] == "6 waiting; 4/4 slots busy"


def fleet(*models: dict[str, Any]) -> dict[str, Any]:
    nodes = [node("gpu-01", gpu(0), gpu(1))]
    replicas = [replica(f"r-{m['name']}", m["name"], "gpu-01", [i])
                for i, m in enumerate(models[:2])]
    return summary.build(list(models), nodes, replicas, NOW, 30.0, idle_after_s=900)


def test_the_summary_lists_models_at_capacity_and_matches_its_schema() -> None:
    s = fleet(full("busy", 2.0), full("calm", 120.0), model("plain"))
    jsonschema.validate(s, SCHEMA)
    by_name = {m["name"]: m for m in s["models"]}
    assert by_name["busy"]["at_capacity"]["waiting"] == 6
    assert by_name["calm"]["at_capacity"] is None and by_name["plain"]["at_capacity"] is None
    assert [c["name"] for c in s["at_capacity"]] == ["busy"]


def test_ctl_status_shows_at_capacity_on_the_models_line_and_in_its_list() -> None:
    text = render(fleet(full("busy", 2.0), model("plain")), 160)
    [line] = [ln for ln in text.splitlines() if ln.strip().startswith("busy ")
              and "ready" in ln]
    assert "ready, at capacity" in line and "6 waiting, 14 refused" in line
    [plain] = [ln for ln in text.splitlines() if ln.strip().startswith("plain ")]
    assert "capacity" not in plain
    assert "at capacity (1): requests waited for a slot or were refused in the last 30 s" \
        in text
    assert any(ln.split()[:4] == ["busy", "6", "14", "4/4"] for ln in text.splitlines())


def test_a_ready_model_at_capacity_is_listed_among_many_fine_ones() -> None:
    models = [model(f"m{i:02d}") for i in range(30)] + [full("busy", 1.0)]
    text = render(fleet(*models), 120)
    assert "models: 30 of 31 ready or idle; the others:" in text
    assert "ready, at capacity" in text


def test_at_capacity_is_yellow_on_a_terminal() -> None:
    text = render(fleet(full("busy", 2.0)), 160, color=True)
    assert "\x1b[33mready, at capacity" in text
