"""Usage in the router (router/usage.py) and the key limits of the routes table: a report
is sent again with its number until it gets an answer, what is used meanwhile waits for the
next one, a refused one is dropped; a routes table with a hostile limit is refused whole."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from llmgw_runtime.api.usage import UsageReport
from llmgw_runtime.router.routes import ControlError, ControlRefused, parse_table
from llmgw_runtime.router.tables.limits import KeyLimit
from llmgw_runtime.router.tokens import Tokens, asking_usage_body
from llmgw_runtime.router.usage import UsageBook, UsageReporter

KEY = "ab" * 32


class Control:
    """Takes reports as the control service does (once per reporter and seq) or fails
    with ``fail`` (an exception) while it is set."""

    def __init__(self) -> None:
        self.applied: list[UsageReport] = []
        self.seen: list[tuple[str, int]] = []
        self.fail: Exception | None = None

    def send(self, report: UsageReport) -> bool:
        self.seen.append((report.reporter, report.seq))
        if self.fail is not None:
            raise self.fail
        if any(r.seq == report.seq for r in self.applied):
            return False
        self.applied.append(report)
        return True

    def totals(self) -> dict[tuple[str, str], tuple[int, int, int]]:
        out: dict[tuple[str, str], tuple[int, int, int]] = {}
        for report in self.applied:
            for e in report.entries:
                n, p, c = out.get((e.key, e.model), (0, 0, 0))
                out[(e.key, e.model)] = (n + e.requests, p + e.prompt_tokens,
                                         c + e.completion_tokens)
        return out


def _reporter(book: UsageBook, control: Control) -> UsageReporter:
    return UsageReporter(book, control.send, retry=(ControlError,),
                         refused=(ControlRefused,), reporter="router-test-1")


def test_a_report_without_an_answer_is_sent_again_with_its_number(
        caplog: pytest.LogCaptureFixture) -> None:
    book, control = UsageBook(), Control()
    reporter = _reporter(book, control)
    assert reporter.post() is True and control.seen == []       # nothing to say
    book.add(KEY, "chat", Tokens(10, 5))
    book.add("-", "chat", None)                                  # an answer without usage
    control.fail = ControlError("control service unreachable")
    with caplog.at_level(logging.WARNING):
        assert reporter.post() is False
        book.add(KEY, "chat", Tokens(1, 1))                      # used meanwhile
        assert reporter.post() is False
    assert caplog.text.count("not delivered") == 1              # said once, not per tick
    control.fail = None
    reporter.post()
    reporter.post()
    assert control.seen == [("router-test-1", 1)] * 3 + [("router-test-1", 2)]
    assert control.totals() == {(KEY, "chat"): (2, 11, 6), ("-", "chat"): (1, 0, 0)}


def test_a_refused_report_is_dropped_and_the_next_one_goes(
        caplog: pytest.LogCaptureFixture) -> None:
    book, control = UsageBook(), Control()
    reporter = _reporter(book, control)
    book.add(KEY, "chat", Tokens(1, 1))
    control.fail = ControlRefused("HTTP 400: the usage report is malformed")
    with caplog.at_level(logging.ERROR):
        reporter.post()
    assert "refused by the control service, dropped" in caplog.text
    control.fail = None
    book.add(KEY, "chat", Tokens(2, 2))
    reporter.flush()
    assert [r.seq for r in control.applied] == [2]
    assert control.totals() == {(KEY, "chat"): (1, 2, 2)}


def test_a_book_larger_than_a_report_goes_in_several() -> None:
    book, control = UsageBook(), Control()
    for n in range(25_000):
        book.add(KEY, f"m{n}", Tokens(1, 0))
    _reporter(book, control).flush()
    assert [len(r.entries) for r in control.applied] == [10_000, 10_000, 5_000]


def _table(**top: Any) -> dict[str, Any]:
    return {"models": [{"name": "m", "state": "ready", "endpoints": []}],
            "api_key_hashes": [KEY], **top}


def test_the_routes_table_carries_each_keys_limits() -> None:
    table = parse_table(_table(key_limits={KEY: {"name": "app", "rpm": 60, "tpm": None}}), 0)
    assert table.key_limits == {KEY: KeyLimit("app", 60, None)}
    assert parse_table(_table(), 0).key_limits == {}


@pytest.mark.parametrize("limits", [
    {KEY: {"name": "app", "rpm": 0}},
    {KEY: {"name": "app", "rpm": -5}},
    {KEY: {"name": "app", "rpm": 1_000_001}},
    {KEY: {"name": "app", "rpm": 2.5}},
    {KEY: {"name": "app", "rpm": "60"}},
    {KEY: {"name": "app", "rpm": True}},
    {KEY: {"name": "app", "tpm": 10**11}},
    {KEY: {"name": "app", "tpm": float("inf")}},
    {KEY: {"name": "app", "tpm": [1]}},
    {KEY: {"name": "has space", "rpm": 1}},
    {KEY: {"name": "app\x1b[2J", "rpm": 1}},
    {KEY: {"name": "a" * 201, "rpm": 1}},
    {KEY: {"rpm": 1}},
    {"not-a-hash": {"name": "app", "rpm": 1}},
    {KEY: "60"},
    ["app"],
])
def test_a_routes_table_with_a_hostile_key_limit_is_refused_whole(limits: Any) -> None:
    with pytest.raises(ValueError, match="malformed"):
        parse_table(_table(key_limits=limits), 0)


@pytest.mark.parametrize("body", [
    b'{"model":"m","stream":true,"messages":[]}',
    b'  {\n "model": "m", "stream": true}',
    b'{"stream":true,"stream_options":{"other":1},"model":"m"}',
    b'{"stream": true, "stream_options": {"include_usage": false}}',
])
def test_the_body_that_asks_for_usage_is_the_clients_json_with_include_usage(
        body: bytes) -> None:
    doc = json.loads(body)
    asked = json.loads(asking_usage_body(doc, body))
    options = doc.get("stream_options") or {}
    assert asked == {**doc, "stream_options": {**options, "include_usage": True}}
