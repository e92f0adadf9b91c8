"""The messages' parsers: every bad field is named, nothing non-finite, unbounded or
unprintable gets through, and what a sender cannot control is cleaned before sending."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llmgw_runtime.api.agent import JoinRequest, Report, ReportAnswer
from llmgw_runtime.api.fields import MAX_TEXT, clean
from llmgw_runtime.api.parse import MAX_DETAILS, InvalidJSON, parse, parse_json
from llmgw_runtime.api.router import IdleMap, Routes, Unreachable
from llmgw_runtime.api.states import ModelState, ReplicaState, ReportedState
from llmgw_runtime.errors import ValidationError

CPU = {"id": 0, "uuid": "cpu-host", "class": "cpu", "memory_total_mb": 16000}


def report(**extra: Any) -> dict[str, Any]:
    return {"node": "n1", "address": "10.0.0.1", "devices": [CPU], **extra}


def problems_of(cls: Any, data: Any) -> list[str]:
    with pytest.raises(ValidationError) as err:
        parse(cls, data, what="report")
    return err.value.details


def test_a_clean_report_parses_with_defaults() -> None:
    parsed = parse(Report, report(), what="report")
    assert parsed.devices[0].klass == "cpu" and parsed.devices[0].memory_used_mb == 0
    assert parsed.to_json()["devices"][0]["class"] == "cpu"


@pytest.mark.parametrize("device,field", [
    ({**CPU, "memory_total_mb": 1e309}, "devices[0].memory_total_mb"),
    ({**CPU, "memory_used_mb": float("nan")}, "devices[0].memory_used_mb"),
    ({**CPU, "memory_total_mb": 2**64}, "devices[0].memory_total_mb"),
    ({**CPU, "memory_total_mb": "16000"}, "devices[0].memory_total_mb"),
    ({**CPU, "memory_total_mb": True}, "devices[0].memory_total_mb"),
    ({**CPU, "id": -1}, "devices[0].id"),
    ({**CPU, "temperature_c": float("inf")}, "devices[0].temperature_c"),
    ({**CPU, "class": ["cpu"]}, "devices[0].class"),
    ({**CPU, "uuid": "x\x1b[2Jy"}, "devices[0].uuid"),
    ({**CPU, "surprise": 1}, "devices[0].surprise"),
])
def test_a_bad_device_field_is_named(device: dict[str, Any], field: str) -> None:
    details = problems_of(Report, report(devices=[device]))
    assert any(d.startswith(field + ":") for d in details), details


@pytest.mark.parametrize("extra,field", [
    ({"address": {"ip": "1.2.3.4"}}, "address"),
    ({"fabric": ["ib0"]}, "fabric"),
    ({"agent_version": 7}, "agent_version"),
    ({"agent_version": "v" * 41}, "agent_version"),
    ({"cards": ["not an object"]}, "cards[0]"),
    ({"replicas": [{"id": "r-1", "state": "weird"}]}, "replicas[0].state"),
    ({"replicas": [{"id": "r-1", "state": "ready", "port": 70000}]}, "replicas[0].port"),
    ({"node": "n1\x1b]0;owned\x07"}, "node"),
    ({"node": "a" * 201}, "node"),
    ({"devices": [CPU, CPU]}, "(the body)"),
    ({"devices": [CPU] * 1025}, "devices"),
])
def test_a_bad_report_field_is_named(extra: dict[str, Any], field: str) -> None:
    details = problems_of(Report, report(**extra))
    assert any(d.startswith(field) for d in details), details


def test_every_problem_is_listed_at_once_and_the_list_is_bounded() -> None:
    devices = [{**CPU, "id": i, "memory_total_mb": -1, "healthy": "yes"} for i in range(50)]
    details = problems_of(Report, report(devices=devices))
    assert len(details) == MAX_DETAILS + 1 and details[-1].startswith("... and 80 more")
    assert sum(len(d) for d in details) < 10_000


def test_deep_nesting_and_non_finite_literals_are_invalid_json_not_a_crash() -> None:
    with pytest.raises(InvalidJSON, match="deeper than|nests"):
        parse_json(Report, b"[" * 100_000 + b"]" * 100_000, what="report")
    for literal in (b"Infinity", b"NaN", b"-Infinity"):
        with pytest.raises(InvalidJSON):
            parse_json(IdleMap, b'{"replicas": {"r-1": ' + literal + b"}}", what="idle map")
    with pytest.raises(InvalidJSON):
        parse_json(IdleMap, b'{"replicas": {"r-1": 1e400}}', what="idle map")


def test_idle_times_are_finite_seconds_since_last_use() -> None:
    assert parse(IdleMap, {"replicas": {"r-1": 30}}, what="idle map").replicas["r-1"] == 30.0
    assert parse(IdleMap, {"replicas": {"r-1": 0}}, what="idle map").replicas["r-1"] == 0.0
    for bad in (-5, 1e300, "30", None):
        with pytest.raises(ValidationError):
            parse(IdleMap, {"replicas": {"r-1": bad}}, what="idle map")


def test_join_names_are_bounded_and_printable() -> None:
    assert parse(JoinRequest, {"node": "gpu-01.dc1"}, what="join").node == "gpu-01.dc1"
    for bad in ("", " n", "n\n", "a/b", "x" * 201, 5):
        with pytest.raises(ValidationError):
            parse(JoinRequest, {"node": bad}, what="join")


def test_an_answer_ignores_fields_a_newer_server_adds_but_checks_the_known_ones() -> None:
    answer = {"assignments": [], "report_interval_s": 2, "something_new": {"x": 1}}
    assert parse(ReportAnswer, answer, what="answer").report_interval_s == 2.0
    with pytest.raises(ValidationError):
        parse(ReportAnswer, {**answer, "report_interval_s": 0}, what="answer")
    routes = {"models": [{"name": "m", "state": "ready", "endpoints": [
        {"replica_id": "r-1", "url": "http://evil.example:1/x?y"}]}]}
    with pytest.raises(ValidationError, match="malformed"):
        parse(Routes, routes, what="routes")


def test_text_from_engines_is_cleaned_before_it_is_sent() -> None:
    log = "\x1b[31merror\x1b[0m: out of memory\n" + "x" * (2 * MAX_TEXT)
    cleaned = clean({"replicas": [{"last_error": log}]})["replicas"][0]["last_error"]
    assert "\x1b" not in cleaned and cleaned.startswith("?[31merror")
    assert len(cleaned) == MAX_TEXT and "\n" in cleaned


def test_states_are_written_once_and_compare_as_text() -> None:
    assert ReplicaState.READY == "ready" and ModelState.PARKED == "parked"
    assert set(ReportedState) - set(ReplicaState) == {ReportedState.STOPPED}
    assert json.dumps({"s": ReplicaState.FAILED}) == '{"s": "failed"}'


@pytest.mark.parametrize("cls,base,field,bad", [
    (JoinRequest, {"node": "n1"}, "credential", 12),
    (JoinRequest, {"node": "n1"}, "credential", "llmgw-node-" + "x" * 2000),
    (JoinRequest, {"node": "n1"}, "credential", "llmgw-node-\x1b[2J"),
    (JoinRequest, {"node": "n1"}, "credential", {"nested": ["x"]}),
    (Report, {"node": "n1"}, "stopping", "yes"),
    (Report, {"node": "n1"}, "stopping", 1),
    (Unreachable, {"replica_id": "r-1"}, "reason", "refused\x1b]0;owned\x07"),
    (Unreachable, {"replica_id": "r-1"}, "reason", "x" * (MAX_TEXT + 1)),
    (Unreachable, {"replica_id": "r-1"}, "reason", ["refused"]),
    (Unreachable, {"reason": "refused"}, "replica_id", float("inf")),
])
def test_a_hostile_value_of_each_new_field_is_named(cls: Any, base: dict[str, Any],
                                                    field: str, bad: Any) -> None:
    details = problems_of(cls, {**base, field: bad})
    assert any(d.startswith(field) for d in details), details


def test_a_report_naming_a_device_or_replica_twice_is_refused_naming_the_id() -> None:
    ready = {"id": "r1", "state": "ready"}
    assert any("devices: id 0 appears twice" in p
               for p in problems_of(Report, report(devices=[CPU, CPU])))
    assert any("replicas: id 'r1' appears twice" in p
               for p in problems_of(Report, report(replicas=[ready, ready])))
