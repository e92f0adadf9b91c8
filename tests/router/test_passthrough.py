"""OpenAI's Responses API and Anthropic's Messages API passed through the router (issue 17):
the real llama.cpp engine (the CPU launcher with the tiny GGUF) serves both, asked through
the real openai and anthropic clients, with the router's keys, admission and errors; an
engine that does not serve one (it answers 404) gets an OpenAI-shaped error naming it."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import anthropic
import openai
import pytest
import requests
from fake_control import FakeControl
from werkzeug.serving import make_server
from werkzeug.wrappers import Response

from llmgw_runtime.router.admission.affinity import prefix_key
from tests.engines.conftest import cpu_engine
from tests.support.tiny_gguf import write_tiny_gguf

from .conftest import API_KEY, ROUTER_TOKEN, model, running_router, table


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    where = tmp_path_factory.mktemp("passthrough")
    with cpu_engine(write_tiny_gguf(where / "tiny.gguf"), where / "engine.log",
                    "--parallel", "2", "--ctx-size", "1024") as url:
        yield url


@pytest.fixture(scope="module")
def no_such_api() -> Iterator[str]:
    """An engine without the two APIs: 404 to every path, as vLLM's server answers one."""
    server = make_server("127.0.0.1", 0, Response(b'{"detail":"Not Found"}', 404,
                                                  content_type="application/json"),
                         threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.port}"
    server.shutdown()
    thread.join(5)


@pytest.fixture(scope="module")
def router(engine: str, no_such_api: str) -> Iterator[str]:
    """The real router (serve.run, 2 gevent workers) in front of both engines."""
    ctl = FakeControl(table(
        dict(model("tiny", endpoints=[("r-tiny", engine)]), engine="llama.cpp",
             aliases=["claude-small"]),
        dict(model("older", endpoints=[("r-old", no_such_api)]), engine="vllm")),
        ROUTER_TOKEN).start()
    try:
        with running_router(ctl.url, workers=2) as url:
            yield url
    finally:
        ctl.stop()


def test_the_responses_api_is_served_by_the_engine(router: str) -> None:
    client = openai.OpenAI(base_url=router + "/v1", api_key=API_KEY, max_retries=0,
                           timeout=60)
    raw = client.responses.with_raw_response.create(model="tiny", input="Say hi",
                                                    max_output_tokens=8)
    assert raw.headers["X-Llmgw-Model"] == "tiny"
    answer = raw.parse()
    assert answer.status == "completed"
    assert answer.usage is not None and answer.usage.output_tokens > 0
    assert answer.output[0].type == "message"


def test_a_responses_stream_passes_through_event_by_event(router: str) -> None:
    client = openai.OpenAI(base_url=router + "/v1", api_key=API_KEY, max_retries=0,
                           timeout=60)
    kinds = [event.type for event in client.responses.create(
        model="tiny", input=[{"role": "user", "content": "Say hi"}],
        instructions="You are terse.", max_output_tokens=8, stream=True)]
    assert kinds[0] == "response.created"
    assert "response.output_text.delta" in kinds
    assert kinds[-1] == "response.completed"


def test_the_messages_api_is_served_with_an_anthropic_key_header(router: str) -> None:
    # The anthropic client sends its key as X-Api-Key, not Authorization.
    client = anthropic.Anthropic(base_url=router, api_key=API_KEY, max_retries=0, timeout=60)
    message = client.messages.create(model="claude-small", max_tokens=8, system="Be terse.",
                                     messages=[{"role": "user", "content": "Say hi"}])
    assert message.type == "message" and message.role == "assistant"
    assert message.usage.output_tokens > 0
    kinds = []
    with client.messages.stream(model="tiny", max_tokens=8,
                                messages=[{"role": "user", "content": "Say hi"}]) as stream:
        kinds = [event.type for event in stream]
    # (This llama.cpp build sometimes leaves out message_start: its own race, seen on the
    # engine directly too.)
    assert kinds[-1] == "message_stop"
    assert "content_block_delta" in kinds and "message_delta" in kinds


def test_the_key_is_checked_on_the_passed_through_paths(router: str) -> None:
    wrong = anthropic.Anthropic(base_url=router, api_key="sk-llmgw-wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        wrong.messages.create(model="tiny", max_tokens=4,
                              messages=[{"role": "user", "content": "hi"}])
    answer = requests.post(router + "/v1/responses", json={"model": "tiny", "input": "hi"},
                           timeout=30)
    assert answer.status_code == 401
    assert answer.json()["error"]["code"] == "invalid_api_key"


@pytest.mark.parametrize("path", ["/v1/responses", "/v1/messages"])
def test_an_engine_that_does_not_serve_the_api_is_named(router: str, path: str) -> None:
    answer = requests.post(router + path, json={"model": "older", "input": "hi",
                                                "max_tokens": 4,
                                                "messages": [{"role": "user",
                                                              "content": "hi"}]},
                           headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30)
    assert answer.status_code == 404
    error = answer.json()["error"]
    assert error["code"] == "unsupported_endpoint"
    assert error["type"] == "invalid_request_error"
    assert f"model 'older' (vllm) does not serve POST {path}" in error["message"]
    assert "/v1/chat/completions" in error["message"]
    # The router's own 404s (an unknown model) keep their code.
    unknown = requests.post(router + path, json={"model": "nope", "input": "hi"},
                            headers={"Authorization": f"Bearer {API_KEY}"}, timeout=30)
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "model_not_found"


def test_prefix_keys_of_the_passed_through_apis() -> None:
    user = {"role": "user", "content": "What is the capital of France?"}
    # Anthropic's system prompt is part of the prefix: two applications, two keys.
    a = prefix_key({"system": "You are A.", "messages": [user]}, "/v1/messages")
    b = prefix_key({"system": "You are B.", "messages": [user]}, "/v1/messages")
    assert a and b and a != b
    # A later turn of one conversation keeps its key.
    later = prefix_key({"system": "You are A.", "messages": [
        user, {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "And Spain?"}]}, "/v1/messages")
    assert later == a
    # Responses: instructions + input; a plain input text is one user turn.
    text = prefix_key({"instructions": "You are A.", "input": user["content"]},
                      "/v1/responses")
    listed = prefix_key({"instructions": "You are A.", "input": [user]}, "/v1/responses")
    assert text == listed == a
    # An embeddings request's input is not a prefix.
    assert prefix_key({"input": "some text"}, "/v1/embeddings") is None
    assert prefix_key({"input": ""}, "/v1/responses") is None


def test_the_router_document_lists_the_passed_through_paths(router: str) -> None:
    paths = requests.get(router + "/openapi.json", timeout=10).json()["paths"]
    for path in ("/v1/responses", "/v1/messages"):
        assert "text/event-stream" in paths[path]["post"]["responses"]["200"]["content"]


def test_hostile_engine_names_refuse_the_routes_table() -> None:
    from llmgw_runtime.router.routes import parse_table
    for bad in (["llama.cpp"], {"a": 1}, "x" * 10_000, "llama\x1b[31m", 7):
        with pytest.raises(ValueError, match="engine"):
            parse_table({"models": [dict(model("m"), engine=bad)], "api_key_hashes": []},
                       0.0)

