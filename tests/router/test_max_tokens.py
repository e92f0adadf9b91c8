"""A model's max_tokens at the router (issue 26): a chat or text completion request without
one gets the model's default, one above its max is refused with OpenAI's 400 naming the
cap (or, when the model clamps, lowered to it), and a model without a cap gets the body
byte for byte. The real router (serve.run, a gevent worker), a stand-in control service,
an engine that records what it is sent, the real openai client."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import openai
import pytest
import requests
from fake_control import FakeControl
from werkzeug.serving import make_server
from werkzeug.wrappers import Request, Response

from llmgw_runtime.api.catalog import MaxTokens
from llmgw_runtime.router.errors import InvalidRequest
from llmgw_runtime.router.max_tokens import capped
from llmgw_runtime.security import hash_token

from .conftest import API_KEY, ROUTER_TOKEN, model, running_router, table

TPM_CAPPED = "sk-llmgw-tpm-capped"
TPM_FREE = "sk-llmgw-tpm-free"
ASK = [{"role": "user", "content": "hi"}]
CAPS = {"capped": {"default": 256, "max": 4096},
        "clamped": {"max": 1024, "clamp": True},
        "small": {"max": 100}}


class RecordingEngine:
    """An OpenAI engine that keeps the body of every request it is sent and answers a
    fixed chat or text completion (without usage: a key's token estimate stays charged,
    docs/keys.md), or an embedding."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self._server = make_server("127.0.0.1", 0, self._wsgi, threaded=True)
        self.url = f"http://127.0.0.1:{self._server.server_port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def seen(self, marker: str) -> dict[str, Any]:
        """The last body sent with ``marker`` in it, decoded."""
        return json.loads(self.raw(marker))

    def raw(self, marker: str) -> bytes:
        return [b for b in self.bodies if marker.encode() in b][-1]

    def _wsgi(self, environ: dict[str, Any], start_response: Any) -> Any:
        req = Request(environ)
        body = req.get_data()
        self.bodies.append(body)
        doc = json.loads(body)
        name = doc["model"]
        if req.path == "/v1/embeddings":
            answer: dict[str, Any] = {
                "object": "list", "model": name,
                "data": [{"object": "embedding", "index": 0, "embedding": [0.5]}],
                "usage": {"prompt_tokens": 1, "total_tokens": 1}}
        elif req.path == "/v1/completions":
            answer = {"id": "cmpl-rec", "object": "text_completion", "created": 1,
                      "model": name, "choices": [{"index": 0, "text": "ok", "logprobs": None,
                                                  "finish_reason": "stop"}]}
        elif doc.get("stream"):
            chunk = {"id": "chatcmpl-rec", "object": "chat.completion.chunk", "created": 1,
                     "model": name, "choices": [{"index": 0, "finish_reason": "stop",
                                                 "delta": {"role": "assistant",
                                                           "content": "ok"}}]}
            data = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode()
            return Response(data, 200, content_type="text/event-stream")(
                environ, start_response)
        else:
            answer = {"id": "chatcmpl-rec", "object": "chat.completion", "created": 1,
                      "model": name, "choices": [{"index": 0, "finish_reason": "stop",
                                                  "message": {"role": "assistant",
                                                              "content": "ok"}}]}
        return Response(json.dumps(answer), 200, content_type="application/json")(
            environ, start_response)


@pytest.fixture(scope="module")
def engine() -> Iterator[RecordingEngine]:
    rec = RecordingEngine()
    yield rec
    rec.stop()


@pytest.fixture(scope="module")
def router(engine: RecordingEngine) -> Iterator[str]:
    def entry(name: str, **fields: Any) -> dict[str, Any]:
        return dict(model(name, endpoints=[(f"r-{name}", engine.url)]), **fields)

    routes = table(*(entry(name, max_tokens=cap) for name, cap in CAPS.items()),
                   entry("free"),
                   dict(model("big", state="parked", reason="engine exited"),
                        fallback=["small", "free"]),
                   keys=(API_KEY, TPM_CAPPED, TPM_FREE))
    routes["key_limits"] = {hash_token(key): {"name": name, "tpm": 200}
                            for name, key in (("capped", TPM_CAPPED), ("free", TPM_FREE))}
    ctl = FakeControl(routes, ROUTER_TOKEN).start()
    try:
        with running_router(ctl.url, workers=1) as url:
            yield url
    finally:
        ctl.stop()


def _client(router: str, key: str = API_KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=router + "/v1", api_key=key, max_retries=0, timeout=20)


def test_a_request_without_max_tokens_gets_the_models_default(
        router: str, engine: RecordingEngine) -> None:
    client = _client(router)
    client.chat.completions.create(model="capped", messages=ASK, user="default-chat")
    assert engine.seen("default-chat")["max_tokens"] == 256
    client.completions.create(model="capped", prompt="hi", user="default-text")
    assert engine.seen("default-text")["max_tokens"] == 256
    # a stream too (the router's own ask for its usage keeps the default)
    list(client.chat.completions.create(model="capped", messages=ASK, stream=True,
                                        user="default-stream"))
    seen = engine.seen("default-stream")
    assert seen["max_tokens"] == 256 and seen["stream_options"] == {"include_usage": True}
    # null is no value; one within the max goes as it is
    client.chat.completions.create(model="capped", messages=ASK, user="null",
                                   extra_body={"max_tokens": None})
    assert engine.seen("null")["max_tokens"] == 256
    client.chat.completions.create(model="capped", messages=ASK, max_tokens=4096,
                                   user="within")
    assert engine.seen("within")["max_tokens"] == 4096


def test_a_request_above_the_max_is_refused_naming_the_cap(
        router: str, engine: RecordingEngine) -> None:
    client = _client(router)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="capped", messages=ASK, max_tokens=5000,
                                       user="above")
    error = refused.value.body
    assert isinstance(error, dict)
    assert error["message"].startswith(
        "max_tokens 5000 is above model 'capped''s cap of 4096; ask for at most 4096")
    assert (error["param"], error["type"]) == ("max_tokens", "invalid_request_error")
    with pytest.raises(openai.BadRequestError) as newer:
        client.chat.completions.create(model="capped", messages=ASK,
                                       max_completion_tokens=9000, user="above-mct")
    assert "max_completion_tokens 9000 is above model 'capped''s cap" in str(newer.value)
    assert not [b for b in engine.bodies if b"above" in b]     # nothing reached the engine


def test_max_completion_tokens_counts_and_the_larger_of_both_governs(
        router: str, engine: RecordingEngine) -> None:
    client = _client(router)
    client.chat.completions.create(model="capped", messages=ASK, max_completion_tokens=50,
                                   user="mct")
    assert "max_tokens" not in engine.seen("mct")          # it set one: no default
    with pytest.raises(openai.BadRequestError) as both:
        client.chat.completions.create(model="capped", messages=ASK, max_tokens=10,
                                       max_completion_tokens=5000, user="both")
    assert both.value.body["param"] == "max_completion_tokens"  # type: ignore[index]
    client.chat.completions.create(model="clamped", messages=ASK, max_tokens=10,
                                   max_completion_tokens=5000, user="both-clamped")
    seen = engine.seen("both-clamped")
    assert (seen["max_tokens"], seen["max_completion_tokens"]) == (10, 1024)


def test_a_model_that_clamps_lowers_the_request_to_its_max(
        router: str, engine: RecordingEngine) -> None:
    client = _client(router)
    answer = client.chat.completions.create(model="clamped", messages=ASK, max_tokens=5000,
                                            user="clamp")
    assert answer.choices[0].message.content == "ok"
    assert engine.seen("clamp")["max_tokens"] == 1024
    client.completions.create(model="clamped", prompt="hi", max_tokens=2000,
                              user="clamp-text")
    assert engine.seen("clamp-text")["max_tokens"] == 1024
    client.chat.completions.create(model="clamped", messages=ASK, user="no-default")
    assert "max_tokens" not in engine.seen("no-default")     # it has a max, no default


BYTES = [  # odd spacing, an escape, raw UTF-8: what would not survive a re-serialisation
    b'{"model":"free",  "messages": [{"role": "user", "content": "caf\\u00e9 \xc3\xa9"}],'
    b' "user": "bytes-1"}',
    b'{"model":"free", "max_tokens": 100000, "messages": [], "user": "bytes-2"}',
    b'{"model":"capped", "max_tokens" : 12.0, "messages": [], "user": "bytes-3"}',  # within
]


def test_a_model_without_a_cap_gets_the_body_byte_for_byte(
        router: str, engine: RecordingEngine) -> None:
    for n, body in enumerate(BYTES, 1):
        resp = requests.post(router + "/v1/chat/completions", data=body, timeout=20,
                             headers={"Authorization": f"Bearer {API_KEY}",
                                      "Content-Type": "application/json"})
        assert resp.status_code == 200, resp.text
        assert engine.raw(f"bytes-{n}") == body
    embed = b'{"model": "capped", "input": "bytes-embed"}'
    resp = requests.post(router + "/v1/embeddings", data=embed, timeout=20,
                         headers={"Authorization": f"Bearer {API_KEY}"})
    assert resp.status_code == 200 and engine.raw("bytes-embed") == embed   # not capped


def test_a_fallback_is_held_to_its_own_max_tokens(
        router: str, engine: RecordingEngine) -> None:
    client = _client(router)
    raw = client.chat.completions.with_raw_response.create(
        model="big", messages=ASK, max_tokens=5000, user="fallback-above")
    assert raw.headers["X-Llmgw-Model"] == "free"     # above small's max: the next one
    raw = client.chat.completions.with_raw_response.create(
        model="big", messages=ASK, max_tokens=50, user="fallback-within")
    assert raw.headers["X-Llmgw-Model"] == "small"


def test_the_token_estimate_counts_the_default(router: str) -> None:
    """Keys of 200 tokens a minute, answers without usage (the estimate stays charged):
    a request to the model whose default is 256 is charged more than the key's minute, so
    the next is refused; to the model without a cap, the prompt alone is charged."""
    capped_key = _client(router, TPM_CAPPED)
    capped_key.chat.completions.create(model="capped", messages=ASK)
    with pytest.raises(openai.RateLimitError) as refused:
        capped_key.chat.completions.create(model="capped", messages=ASK)
    assert refused.value.body["type"] == "tokens"  # type: ignore[index]
    free_key = _client(router, TPM_FREE)
    for _ in range(3):
        free_key.chat.completions.create(model="free", messages=ASK)


CAP = MaxTokens(default=100, max=1000)
CHAT, TEXT = "/v1/chat/completions", "/v1/completions"


@pytest.mark.parametrize(("cap", "path", "doc", "changes"), [
    (CAP, CHAT, {}, {"max_tokens": 100}),
    (CAP, CHAT, {"max_tokens": None}, {"max_tokens": 100}),
    (CAP, CHAT, {"max_tokens": 1000}, {}),
    (CAP, CHAT, {"max_tokens": 1000.0}, {}),                 # a whole number, within
    (CAP, CHAT, {"max_completion_tokens": 7}, {}),
    (CAP, TEXT, {"max_completion_tokens": 7}, {"max_tokens": 100}),  # not a text field
    (CAP, "/v1/embeddings", {}, {}),
    (CAP, "/v1/responses", {"max_output_tokens": 10**6}, {}),
    (MaxTokens(max=10, clamp=True), CHAT, {"max_tokens": 11, "max_completion_tokens": 5},
     {"max_tokens": 10}),
    (MaxTokens(max=10, clamp=True), CHAT, {"max_tokens": 1e300}, {"max_tokens": 10}),
    (MaxTokens(max=10, clamp=True), CHAT, {}, {}),
    (MaxTokens(default=5), CHAT, {"max_tokens": "lots"}, {}),   # no max: the engine's say
])
def test_the_changes_a_cap_makes(cap: MaxTokens, path: str, doc: dict[str, Any],
                                 changes: dict[str, int]) -> None:
    assert capped(cap, path, doc, "m") == changes


@pytest.mark.parametrize(("doc", "said"), [
    ({"max_tokens": 1001}, "max_tokens 1001 is above model 'm''s cap of 1000; ask for at "
                           "most 1000, or leave max_tokens out for the model's default of 100"),
    ({"max_tokens": 2e3}, "max_tokens 2000 is above"),
    ({"max_tokens": "9999"}, "max_tokens must be a whole number of tokens, not '9999'"),
    ({"max_completion_tokens": 1.5}, "max_completion_tokens must be a whole number"),
    ({"max_tokens": True}, "max_tokens must be a whole number of tokens, not True"),
])
def test_what_a_cap_refuses(doc: dict[str, Any], said: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        capped(CAP, CHAT, doc, "m")
    assert refused.value.message.startswith(said)
    assert refused.value.param == next(iter(doc))
