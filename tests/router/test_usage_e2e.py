"""Usage through the real router (serve.run, 2 gevent workers) in front of the real
llama.cpp engine (the CPU launcher with the tiny GGUF): what the router reports per key and
model equals the sum of the usage objects the engine gave for the same requests, streaming
included, and the client receives exactly what the engine sends when nobody asks it for
usage (the router's own request for a stream's usage is invisible)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from llmgw_runtime.security import hash_token
from tests.engines.conftest import cpu_engine
from tests.support.procs import wait_until
from tests.support.tiny_gguf import write_tiny_gguf

from .conftest import ROUTER_TOKEN, model, table
from .usage_support import UsageControl, router_at

KEYS = [f"sk-llmgw-usage-{n}" for n in range(4)]
CHAT, COMPLETIONS, EMBEDDINGS = "/v1/chat/completions", "/v1/completions", "/v1/embeddings"
RESPONSES, MESSAGES = "/v1/responses", "/v1/messages"
GREEDY = {"temperature": 0, "seed": 7}
CHAT_BODY = {"messages": [{"role": "user", "content": "Say \"usage\": {} twice"}],
             "max_tokens": 6, **GREEDY}


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    where = tmp_path_factory.mktemp("usage")
    gguf = write_tiny_gguf(where / "tiny.gguf")
    with cpu_engine(gguf, where / "chat.log", "--parallel", "4", "--ctx-size", "2048") as chat, \
            cpu_engine(gguf, where / "embed.log", "--embeddings", "--pooling", "mean",
                       "--ctx-size", "512") as embed:
        yield {"chat": chat, "embed": embed}


@pytest.fixture(scope="module")
def control(engines: dict[str, str]) -> Iterator[UsageControl]:
    ctl = UsageControl(table(model("tiny", endpoints=[("r-chat", engines["chat"])]),
                             model("embed", endpoints=[("r-embed", engines["embed"])]),
                             keys=KEYS), ROUTER_TOKEN).start()
    yield ctl
    ctl.stop()


@pytest.fixture(scope="module")
def router(control: UsageControl) -> Iterator[str]:
    with router_at(control.url, workers=2) as url:
        yield url


def _post(base: str, path: str, body: dict[str, Any], key: str | None = None) -> bytes:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    resp = requests.post(base + path, json=body, headers=headers, timeout=60)
    assert resp.status_code == 200, resp.text
    return resp.content


def _events(raw: bytes) -> list[Any]:
    return [json.loads(line[5:]) for line in raw.split(b"\n")
            if line.startswith(b"data:") and line[5:].strip().startswith(b"{")]


def engine_usage(path: str, raw: bytes, stream: bool) -> tuple[int, int]:
    """(prompt, completion) as the engine's usage objects in ``raw`` say, read here by
    decoding everything (not with the router's code)."""
    docs = _events(raw) if stream else [json.loads(raw)]
    prompt = completion = 0
    for doc in docs:
        if path == RESPONSES:
            usage = (doc.get("response") or {}).get("usage") if stream else doc.get("usage")
            if usage:
                prompt, completion = usage["input_tokens"], usage["output_tokens"]
        elif path == MESSAGES:
            usage = doc["message"]["usage"] if doc.get("type") == "message_start" \
                else doc.get("usage")
            if usage:
                inputs = [usage[k] for k in ("input_tokens", "cache_read_input_tokens",
                                             "cache_creation_input_tokens") if k in usage]
                prompt = sum(inputs) if inputs else prompt
                completion = usage.get("output_tokens", completion)
        elif doc.get("usage"):
            prompt, completion = (doc["usage"]["prompt_tokens"],
                                  doc["usage"].get("completion_tokens", 0))
    return prompt, completion


def _asking(path: str, body: dict[str, Any]) -> dict[str, Any]:
    """``body`` as sent to see a stream's usage directly (chat and text completions)."""
    if path in (CHAT, COMPLETIONS) and body.get("stream"):
        return {**body, "stream_options": {"include_usage": True}}
    return body


CASES = [
    ("tiny", CHAT, CHAT_BODY),
    ("tiny", CHAT, {**CHAT_BODY, "stream": True}),
    ("tiny", CHAT, {**CHAT_BODY, "stream": True, "stream_options": {"include_usage": True}}),
    ("tiny", CHAT, {**CHAT_BODY, "stream": True,
                    "stream_options": {"include_usage": False}}),
    ("tiny", COMPLETIONS, {"prompt": "hello there", "max_tokens": 5, **GREEDY}),
    ("tiny", COMPLETIONS, {"prompt": "hello there", "max_tokens": 5, "stream": True,
                           **GREEDY}),
    ("tiny", RESPONSES, {"input": "Say hi", "max_output_tokens": 5, **GREEDY}),
    ("tiny", RESPONSES, {"input": "Say hi", "max_output_tokens": 5, "stream": True,
                         **GREEDY}),
    ("tiny", MESSAGES, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5,
                        **GREEDY}),
    ("tiny", MESSAGES, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5,
                        "stream": True, **GREEDY}),
    ("embed", EMBEDDINGS, {"input": ["hi", "there you are"]}),
]


def test_usage_per_key_and_model_is_the_sum_of_the_engines_usage_objects(
        router: str, control: UsageControl, engines: dict[str, str]) -> None:
    key = KEYS[0]
    expected: dict[str, list[int]] = {"tiny": [0, 0, 0], "embed": [0, 0, 0]}
    for name, path, body in CASES:
        through = _post(router, path, {"model": name, **body}, key)
        direct = _post(engines["chat" if name == "tiny" else "embed"], path,
                       _asking(path, {"model": name, **body}))
        stream = bool(body.get("stream"))
        prompt, completion = engine_usage(path, direct, stream)
        assert prompt > 0 and (completion > 0 or path == EMBEDDINGS), (path, body)
        if not stream or body.get("stream_options", {}).get("include_usage"):
            # the client saw the usage itself: the same as the engine gave directly
            assert engine_usage(path, through, stream) == (prompt, completion), (path, body)
        counts = expected[name]
        counts[0] += 1
        counts[1] += prompt
        counts[2] += completion
    digest = hash_token(key)
    want = {(digest, m): tuple(c) for m, c in expected.items()}
    wait_until(lambda: {k: v for k, v in control.totals().items() if k[0] == digest} == want,
               10, "the router's usage reports")


def _normal(raw: bytes) -> bytes:
    """A stream with what differs between two runs of the same request made equal: ids,
    times, the engine's timing figures and how much of the prompt it had cached."""
    raw = re.sub(rb'"(id|created|created_at|completed_at|cached_tokens)":("[^"]*"|\d+)',
                 rb'"\1":0', raw)
    return re.sub(rb'"timings":\{[^{}]*\}', rb'"timings":{}', raw)


@pytest.mark.parametrize(("path", "body"), [
    (CHAT, {**CHAT_BODY, "stream": True}),
    (CHAT, {**CHAT_BODY, "stream": True, "stream_options": {"include_usage": False}}),
    (CHAT, {**CHAT_BODY, "stream": True, "stream_options": {"include_usage": True}}),
    (COMPLETIONS, {"prompt": "hello there", "max_tokens": 5, "stream": True, **GREEDY}),
], ids=["chat", "chat-usage-false", "chat-usage-asked", "completions"])
def test_a_stream_reaches_the_client_as_the_engine_sends_it_without_a_usage_request(
        router: str, engines: dict[str, str], path: str, body: dict[str, Any]) -> None:
    through = _post(router, path, {"model": "tiny", **body}, KEYS[1])
    direct = _post(engines["chat"], path, {"model": "tiny", **body})
    assert _normal(through) == _normal(direct)
    asked = body.get("stream_options", {}).get("include_usage") is True
    usage_chunks = [d for d in _events(through) if d.get("choices") == [] and "usage" in d]
    assert len(usage_chunks) == (1 if asked and path == CHAT else 0)
    if path == CHAT and not asked:     # llama.cpp's timings stay on the finishing chunk
        assert "timings" in _events(through)[-1]


def test_a_report_whose_answer_was_lost_is_sent_again_and_counted_once(
        router: str, control: UsageControl, engines: dict[str, str]) -> None:
    """The control service applies a report but its answer is lost (a 503 here): the
    router sends the same report again (same reporter and seq), which is not counted
    twice, and what was used meanwhile comes in the next report."""
    key, digest = KEYS[2], hash_token(KEYS[2])
    duplicates = control.duplicates
    control.lose_answers = 1
    sent = 4
    prompt = completion = 0
    for _ in range(sent):
        body = {"model": "tiny", **CHAT_BODY}
        p, c = engine_usage(CHAT, _post(router, CHAT, body, key), stream=False)
        prompt, completion = prompt + p, completion + c
    # the report whose answer was lost comes again (a duplicate, not counted)
    wait_until(lambda: control.lose_answers == 0 and control.duplicates > duplicates, 10,
               "the report whose answer was lost, sent again")
    wait_until(lambda: control.totals().get((digest, "tiny")) == (sent, prompt, completion),
               10, "every request's usage, counted once")


def test_an_engine_error_is_not_counted_as_usage(router: str, control: UsageControl) -> None:
    key, digest = KEYS[3], hash_token(KEYS[3])
    resp = requests.post(router + CHAT, json={"model": "tiny", "messages": "not a list"},
                         headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert resp.status_code >= 400
    _post(router, CHAT, {"model": "tiny", **CHAT_BODY}, key)
    wait_until(lambda: control.totals().get((digest, "tiny"), (0,))[0] == 1, 10,
               "the report of the one answered request")
