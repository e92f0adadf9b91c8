"""The catalog's admission settings: routing, slots, max_queue, max_wait_s."""

from __future__ import annotations

import pytest

from llmgw_runtime.catalog import parse as catalog
from tests.test_catalog import entry, problems


def test_admission_settings_have_their_defaults() -> None:
    [spec] = catalog.validate({"models": [entry()]})
    assert (spec.routing, spec.slots, spec.max_queue, spec.max_wait_s) == (
        "prefix-affinity", None, 100, 30.0)


def test_admission_settings_are_kept() -> None:
    [spec] = catalog.validate({"models": [entry(routing="least-outstanding", slots=8,
                                                max_queue=0, max_wait_s=2.5)]})
    assert (spec.routing, spec.slots, spec.max_queue, spec.max_wait_s) == (
        "least-outstanding", 8, 0, 2.5)


@pytest.mark.parametrize(("over", "says"), [
    ({"routing": "sticky"}, "routing 'sticky' is unknown; use prefix-affinity (the default"),
    ({"routing": None}, "routing None is unknown"),
    ({"slots": 0}, "slots must be at least 1, not 0"),
    ({"slots": 5000}, "slots must be at most 4096 (llmgw's MAX_SLOTS_PER_REPLICA)"),
    ({"slots": "4"}, "slots must be a whole number, not '4'"),
    ({"slots": True}, "slots must be a whole number, not True"),
    ({"max_queue": -1}, "max_queue must be at least 0, not -1"),
    ({"max_queue": 2.5}, "max_queue must be a whole number"),
    ({"max_wait_s": 0}, "max_wait_s must be a number of seconds above 0 and at most 3600"),
    ({"max_wait_s": 3601}, "max_wait_s must be a number of seconds above 0"),
    ({"max_wait_s": "30s"}, "max_wait_s must be a number of seconds"),
    ({"max_wait_s": float("nan")}, "max_wait_s must be a number of seconds"),
])
def test_a_bad_admission_setting_names_the_model_field_and_what_is_allowed(
        over: dict[str, object], says: str) -> None:
    [msg] = problems(entry(**over))
    assert msg.startswith("models[0] (qwen): ") and says in msg


@pytest.mark.parametrize(("engine", "args", "flag"), [
    ("llama.cpp", ["--parallel", "4"], "--parallel 4"),
    ("llama.cpp", ["-np=2"], "--parallel 2"),
    ("vllm", ["--max-num-seqs", "16"], "--max-num-seqs 16"),
])
def test_slots_that_disagree_with_the_engines_flag_in_args_are_refused(
        engine: str, args: list[str], flag: str) -> None:
    [msg] = problems(entry(engine=engine, slots=8, args=args))
    assert f"slots is 8 but args set {flag}" in msg and "make them agree" in msg


def test_slots_that_agree_with_the_args_are_accepted() -> None:
    [spec] = catalog.validate({"models": [entry(slots=4, args=["--parallel", "4"])]})
    assert spec.slots == 4


def test_every_admission_problem_is_reported_at_once() -> None:
    found = problems(entry(routing="x", slots=0, max_queue=-1, max_wait_s=-1))
    assert len(found) == 4
