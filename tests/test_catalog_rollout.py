"""The catalog's rollout settings and drain_timeout_s (docs/operations.md): their defaults,
durations, and a clear refusal of every hostile value."""

from __future__ import annotations

import pytest

from llmgw_runtime.catalog import parse as catalog
from tests.test_catalog import entry, problems


def test_rollout_and_drain_timeout_have_their_defaults() -> None:
    [spec] = catalog.validate({"models": [entry()]})
    assert (spec.rollout, spec.drain_timeout_s) == (None, 120.0)


def test_rollout_settings_and_a_drain_timeout_as_a_duration_are_kept() -> None:
    [spec] = catalog.validate({"models": [entry(
        rollout={"max_surge": 0, "max_unavailable": 1, "canary_percent": 10},
        drain_timeout_s="10m")]})
    assert spec.rollout is not None
    assert (spec.rollout.max_surge, spec.rollout.max_unavailable,
            spec.rollout.canary_percent) == (0, 1, 10)
    assert spec.drain_timeout_s == 600.0


@pytest.mark.parametrize(("over", "says"), [
    ({"rollout": "fast"}, "rollout must be a mapping like {max_surge: ..., "),
    ({"rollout": [1]}, "rollout must be a mapping"),
    ({"rollout": {"max_surge": 0, "max_unavailable": 0}},
     "max_surge and max_unavailable are both 0"),
    ({"rollout": {"surge": 1}}, "rollout.surge"),
    ({"rollout": {"max_surge": -1}}, "rollout.max_surge must be at least 0"),
    ({"rollout": {"max_surge": 10**30}}, "rollout.max_surge must be at most 256"),
    ({"rollout": {"max_unavailable": "1"}}, "rollout.max_unavailable must be a whole number"),
    ({"rollout": {"canary_percent": 100}}, "rollout.canary_percent must be at most 99"),
    ({"rollout": {"canary_percent": 2.5}}, "rollout.canary_percent must be a whole number"),
    ({"rollout": {"canary_percent": True}}, "rollout.canary_percent must be a whole number"),
    ({"rollout": {"max_surge": {"a": {"b": 1}}}}, "rollout.max_surge must be a whole number"),
    ({"drain_timeout_s": 0}, "drain_timeout_s must be a number of seconds above 0"),
    ({"drain_timeout_s": -5}, "drain_timeout_s must be a number of seconds above 0"),
    ({"drain_timeout_s": 86401}, "drain_timeout_s must be a number of seconds above 0 and "
                                 "at most 86400 (llmgw's MAX_DRAIN_TIMEOUT_S)"),
    ({"drain_timeout_s": "2d"}, "at most 86400"),
    ({"drain_timeout_s": float("inf")}, "drain_timeout_s must be a number of seconds"),
    ({"drain_timeout_s": float("nan")}, "drain_timeout_s must be a number of seconds"),
    ({"drain_timeout_s": "\x1b[2J"}, "is not a duration"),
    ({"drain_timeout_s": "2 minutes"}, "is not a duration; write it like 30m"),
    ({"drain_timeout_s": [120]}, "drain_timeout_s must be a number of seconds"),
    ({"drain_timeout_s": True}, "drain_timeout_s must be a number of seconds"),
])
def test_a_bad_rollout_or_drain_timeout_names_the_model_field_and_what_is_allowed(
        over: dict[str, object], says: str) -> None:
    found = problems(entry(**over))
    assert found and all(m.startswith("models[0] (qwen): ") for m in found), found
    assert any(says in m for m in found), found
