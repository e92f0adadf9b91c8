"""The catalog's replicas as a range and its autoscale settings (catalog_scale.py): what is
kept, what on_demand means next to a range, and a clear problem for each bad value."""

from __future__ import annotations

from typing import Any

import pytest

from llmgw_runtime.api.catalog import Autoscale
from llmgw_runtime.catalog import parse as catalog
from llmgw_runtime.catalog.scale import replica_range, scales
from llmgw_runtime.store.models import row_to_spec
from tests.test_catalog import entry, problems


def spec(**over: Any) -> catalog.ModelSpec:
    [one] = catalog.validate({"models": [entry(**over)]})
    return one


@pytest.mark.parametrize(("over", "count", "maximum", "on_demand", "shown", "scaled"), [
    ({}, 1, None, False, (1, 1), False),
    ({"replicas": 3}, 3, None, False, (3, 3), False),
    ({"replicas": {"min": 1, "max": 3}}, 1, 3, False, (1, 3), True),
    ({"replicas": {"min": 2, "max": 2}}, 2, None, False, (2, 2), False),
    # min 0 is on demand: nothing until the first request, which starts one
    ({"replicas": {"min": 0, "max": 4}}, 0, 4, True, (0, 4), True),
    ({"replicas": {"min": 0, "max": 4}, "on_demand": True}, 0, 4, True, (0, 4), True),
    ({"replicas": {"min": 0, "max": 1}}, 0, 1, True, (0, 1), False),
    # on_demand as before: its first request starts `replicas` of them
    ({"on_demand": True}, 1, None, True, (0, 1), False),
    ({"on_demand": True, "replicas": 2}, 2, None, True, (0, 2), False),
])
def test_replicas_as_a_number_or_a_range(over: dict[str, Any], count: int,
                                         maximum: int | None, on_demand: bool,
                                         shown: tuple[int, int], scaled: bool) -> None:
    got = spec(**over)
    assert (got.replicas, got.replicas_max, got.on_demand) == (count, maximum, on_demand)
    assert replica_range(got.replicas, got.replicas_max, got.on_demand) == shown
    assert scales(got.replicas, got.replicas_max, got.on_demand) is scaled
    assert (got.autoscale == Autoscale()) is scaled and (got.autoscale is None) is not scaled


def test_autoscale_settings_are_kept_and_durations_read() -> None:
    got = spec(replicas={"min": 1, "max": 4}, max_wait_s=60,
               autoscale={"wait_target_s": "5s", "up_after_s": "2m", "busy_below": 0.25,
                          "down_after_s": 600, "cooldown_s": "90s"})
    assert got.autoscale == Autoscale(wait_target_s=5.0, up_after_s=120.0, busy_below=0.25,
                                      down_after_s=600.0, cooldown_s=90.0)
    again = row_to_spec(_row(got))
    assert again.autoscale == got.autoscale and again.replicas_max == 4


def test_an_idle_stop_is_allowed_on_a_range_from_zero() -> None:
    got = spec(replicas={"min": 0, "max": 2}, idle_stop_after="10m")
    assert got.idle_stop_after_s == 600.0


def test_the_range_and_its_settings_are_not_part_of_the_definition() -> None:
    plain = spec()
    ranged = spec(replicas={"min": 1, "max": 5}, autoscale={"cooldown_s": 5})
    assert plain.definition_hash == ranged.definition_hash


@pytest.mark.parametrize(("over", "says"), [
    ({"replicas": "3"}, "replicas must be a whole number or a range like {min: 1, max: 3}, "
                        "not '3'"),
    ({"replicas": 1.5}, "replicas must be a whole number or a range"),
    ({"replicas": -1}, "replicas must be at least 0, not -1"),
    ({"replicas": {"min": 1}}, "replicas as a range needs both min and max, like "
                               "{min: 1, max: 3}"),
    ({"replicas": {"min": 1, "max": 3, "step": 1}}, "replicas.step is not a known field; "
                                                    "a range is {min: M, max: N}"),
    ({"replicas": {"min": 3, "max": 1}}, "replicas.min (3) is above replicas.max (1); "
                                         "swap them"),
    ({"replicas": {"min": 0, "max": 0}}, "replicas.max must be at least 1, not 0"),
    ({"replicas": {"min": -1, "max": 2}}, "replicas.min must be at least 0, not -1"),
    ({"replicas": {"min": 1, "max": 999}}, "replicas.max must be at most 256 (llmgw's "
                                           "MAX_REPLICAS)"),
    ({"replicas": {"min": True, "max": 2}}, "replicas.min must be a whole number, not True"),
    ({"replicas": {"min": 0, "max": 2}, "on_demand": False},
     "replicas.min 0 means on demand (no replica until the first request); remove "
     "on_demand: false, or set min to 1"),
    ({"replicas": {"min": 1, "max": 2}, "on_demand": True},
     "on_demand: true is the same as replicas.min 0; write replicas: {min: 0, max: 2}"),
    ({"replicas": {"min": 1, "max": 2}, "idle_stop_after": "5m"},
     "idle_stop_after applies only to on_demand models; remove it, or set on_demand: true "
     "(or replicas.min 0)"),
    ({"autoscale": {"cooldown_s": 5}}, "autoscale applies to a model whose replicas is a "
                                       "range it can grow in"),
    ({"replicas": {"min": 0, "max": 1}, "autoscale": {}}, "autoscale applies to a model"),
    ({"replicas": {"min": 1, "max": 2}, "autoscale": [1]}, "autoscale must be a mapping"),
    ({"replicas": {"min": 1, "max": 2}, "autoscale": {"wait_target": 2}},
     "autoscale.wait_target is not a known field; known: wait_target_s, up_after_s, "
     "busy_below, down_after_s, cooldown_s"),
    ({"replicas": {"min": 1, "max": 2}, "autoscale": {"up_after_s": "soon"}},
     "autoscale.up_after_s 'soon' is not a duration; write it like 30m, 1h or 90s"),
    ({"replicas": {"min": 1, "max": 2}, "autoscale": {"down_after_s": 0}},
     "autoscale.down_after_s must be above zero"),
    ({"replicas": {"min": 1, "max": 2}, "autoscale": {"cooldown_s": float("inf")}},
     "autoscale.cooldown_s must be a finite number of seconds"),
    ({"replicas": {"min": 1, "max": 2}, "autoscale": {"cooldown_s": "2d"}},
     "autoscale.cooldown_s must be at most 86400 s, not 172800 s"),
    ({"replicas": {"min": 1, "max": 2}, "autoscale": {"wait_target_s": 30}},
     "autoscale.wait_target_s (30 s) must be below max_wait_s (30 s)"),
    ({"replicas": {"min": 1, "max": 2}, "autoscale": {"busy_below": 1}},
     "autoscale.busy_below must be a share of the slots between 0 and 1 (0.3: under 30 % "
     "busy), not 1"),
    ({"replicas": {"min": 1, "max": 2}, "autoscale": {"busy_below": "30%"}},
     "autoscale.busy_below must be a share of the slots between 0 and 1"),
    ({"replicas": {"min": 1, "max": 2}, "autoscale": {"busy_below": float("nan")}},
     "autoscale.busy_below must be a share"),
])
def test_a_bad_range_or_setting_names_the_model_the_field_and_the_fix(
        over: dict[str, Any], says: str) -> None:
    [msg] = problems(entry(**over))
    assert msg.startswith("models[0] (qwen): ") and says in msg, msg


def test_every_autoscale_problem_is_reported_at_once() -> None:
    found = problems(entry(replicas={"min": 1, "max": 3},
                           autoscale={"up_after_s": -1, "busy_below": 2, "nope": 1}))
    assert len(found) == 3


def _row(s: catalog.ModelSpec) -> Any:
    """The store's row of a spec (store/models.py spec_to_row), as row_to_spec reads it."""
    from types import SimpleNamespace

    from llmgw_runtime.store.models import spec_to_row

    return SimpleNamespace(name=s.name, **spec_to_row(s))
