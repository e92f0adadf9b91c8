"""Reading the tokens of an engine's answer as it passes (router/tokens.py), on answers the
real llama.cpp server gave (tests/fixtures/llamacpp_usage: captured from the CPU launcher
with the tiny GGUF), cut into chunks anywhere; and engines' answers that lie."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from llmgw_runtime.router.tokens import (
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    MAX_SCANNED,
    MESSAGES,
    RESPONSES,
    BodyScan,
    StreamScan,
    Tokens,
    asking_usage,
    tokens_of,
    usage_asked,
    usage_in_body,
)

CAPTURED = Path(__file__).resolve().parents[1] / "fixtures" / "llamacpp_usage"


def _captured(name: str) -> bytes:
    return (CAPTURED / name).read_bytes()


def _through(scan: StreamScan | BodyScan, data: bytes, size: int) -> bytes:
    out = b"".join(scan.feed(data[i:i + size]) for i in range(0, len(data), size))
    return out + scan.end()


@pytest.mark.parametrize(("path", "name", "tokens"), [
    (CHAT, "chat.json", (58, 5)),
    (COMPLETIONS, "completions.json", (12, 4)),
    (RESPONSES, "responses.json", (45, 4)),
    (MESSAGES, "messages.json", (45, 4)),          # input 1 + 44 read from the cache
    (EMBEDDINGS, "embeddings.json", (14, 0)),
])
def test_the_usage_of_a_whole_answer(path: str, name: str, tokens: tuple[int, int]) -> None:
    data = _captured(name)
    assert usage_in_body(path, data) == tokens
    assert _through(BodyScan(path), data, 7) == data     # a chunked one: the same
    scan = BodyScan(path)
    _through(scan, data, 7)
    assert scan.tokens == tokens


@pytest.mark.parametrize("size", [1, 7, 64, 100_000])
@pytest.mark.parametrize(("path", "name", "tokens"), [
    (CHAT, "chat-stream-usage.sse", (58, 5)),
    (COMPLETIONS, "completions-stream.sse", (12, 4)),
    (RESPONSES, "responses-stream.sse", (45, 4)),
    (MESSAGES, "messages-stream.sse", (45, 4)),
])
def test_a_stream_passes_unchanged_and_its_usage_is_read(
        path: str, name: str, tokens: tuple[int, int], size: int) -> None:
    data = _captured(name)
    scan = StreamScan(path)
    assert _through(scan, data, size) == data
    assert scan.tokens == tokens


def _normal(raw: bytes) -> bytes:
    raw = re.sub(rb'"(id|created)":("[^"]*"|\d+)', rb'"\1":0', raw)
    return re.sub(rb'"timings":\{[^{}]*\}', rb'"timings":{}', raw)


@pytest.mark.parametrize("size", [1, 5, 300, 100_000])
def test_the_usage_chunk_the_router_asked_for_is_removed_and_timings_kept(size: int) -> None:
    """What the client gets is what llama.cpp sends when nobody asks for usage: no usage
    chunk, and its timings on the finishing chunk (where it puts them then)."""
    scan = StreamScan(CHAT, strip=True)
    out = _through(scan, _captured("chat-stream-usage.sse"), size)
    assert scan.tokens == (58, 5)
    assert _normal(out) == _normal(_captured("chat-stream.sse"))
    usage_doc = json.loads(_captured("chat-stream-usage.sse").split(b"\n\n")[-3][6:])
    last = json.loads(out.split(b"\n\n")[-3][6:])
    assert last["timings"] == usage_doc["timings"]      # the engine's figures, unchanged


def test_only_a_finishing_chunk_is_held_back_while_stripping() -> None:
    data = _captured("chat-stream-usage.sse")
    events = [e + b"\n\n" for e in data.split(b"\n\n") if e]
    scan = StreamScan(CHAT, strip=True)
    assert scan.feed(events[0]) == events[0]            # passed on at once
    assert scan.feed(events[1][:10]) == b""             # an incomplete event waits
    assert scan.feed(events[1][10:]) == events[1]
    finishing = next(i for i, e in enumerate(events) if b'"finish_reason":"' in e)
    for event in events[2:finishing]:
        assert scan.feed(event) == event
    assert scan.feed(events[finishing]) == b""          # held for the usage chunk
    assert scan.feed(events[finishing + 1]) == b""      # the usage chunk: dropped
    released = scan.feed(events[finishing + 2])         # [DONE]
    assert released.endswith(b"data: [DONE]\n\n") and b'"timings"' in released
    assert scan.end() == b""


def test_a_stream_without_a_usage_chunk_is_passed_on_whole() -> None:
    data = _captured("chat-stream.sse")
    scan = StreamScan(CHAT, strip=True)
    assert _through(scan, data, 9) == data and scan.tokens is None


def test_an_event_that_never_ends_is_passed_on_and_not_read() -> None:
    scan = StreamScan(CHAT, strip=True)
    head = b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1}}'
    out = scan.feed(head) + scan.feed(b"x" * MAX_SCANNED) + scan.feed(b"\n\nmore")
    assert out == head + b"x" * MAX_SCANNED + b"\n\nmore" and scan.tokens is None


@pytest.mark.parametrize("usage", [
    {"prompt_tokens": -1, "completion_tokens": 1},
    {"prompt_tokens": 1, "completion_tokens": 10**10},
    {"prompt_tokens": True, "completion_tokens": 1},
    {"prompt_tokens": "5", "completion_tokens": 1},
    {"prompt_tokens": 1.5, "completion_tokens": 1},
    {"completion_tokens": 1},
    [1, 2],
    None,
])
def test_an_engines_usage_that_is_not_believable_counts_nothing(usage: object) -> None:
    body = json.dumps({"choices": [], "usage": usage}).encode()
    assert usage_in_body(CHAT, body) is None
    scan = StreamScan(CHAT)
    scan.feed(b"data: " + body + b"\n\n")
    assert scan.tokens is None


def test_usage_written_inside_the_generated_text_is_not_taken_for_the_answers() -> None:
    text = 'x", "usage": {"prompt_tokens": 999999, "completion_tokens": 999999}, "y": "'
    body = json.dumps({"choices": [{"message": {"content": text}}],
                       "usage": {"prompt_tokens": 3, "completion_tokens": 2}}).encode()
    assert usage_in_body(CHAT, body) == (3, 2)
    no_usage = json.dumps({"choices": [{"message": {"content": text}}]}).encode()
    assert usage_in_body(CHAT, no_usage) is None


def test_anthropic_deltas_carry_the_running_output_and_keep_the_input() -> None:
    start = tokens_of(MESSAGES, {"input_tokens": 3, "cache_read_input_tokens": 40,
                                 "output_tokens": 1})
    assert start == (43, 1)
    assert tokens_of(MESSAGES, {"output_tokens": 9}, start) == (43, 9)
    assert tokens_of(MESSAGES, {"input_tokens": 50, "output_tokens": 9}, start) == (50, 9)
    assert tokens_of(MESSAGES, {"output_tokens": -1}, start) is None
    assert tokens_of(MESSAGES, {}, start) is None


@pytest.mark.parametrize(("path", "doc", "asked"), [
    (CHAT, {"stream": True}, True),
    (CHAT, {"stream": True, "stream_options": {"include_usage": False}}, True),
    (CHAT, {"stream": True, "stream_options": {"include_usage": True}}, False),
    (CHAT, {"stream": True, "stream_options": "odd"}, True),
    (COMPLETIONS, {"stream": True}, True),
    (CHAT, {}, False),
    (CHAT, {"stream": "yes"}, False),
    (RESPONSES, {"stream": True}, False),
    (MESSAGES, {"stream": True}, False),
])
def test_the_router_asks_for_a_completion_streams_usage_only_when_the_client_did_not(
        path: str, doc: dict[str, object], asked: bool) -> None:
    assert usage_asked(path, doc) is asked


def test_asking_for_usage_keeps_the_clients_other_stream_options() -> None:
    doc = {"model": "m", "stream": True, "stream_options": {"other": 1}}
    assert asking_usage(doc) == {**doc, "stream_options": {"other": 1, "include_usage": True}}
    assert doc["stream_options"] == {"other": 1}       # the client's own is untouched
    assert Tokens(1, 2) == (1, 2)
