"""llama.cpp's known error answers reach the client in OpenAI's shape with what to change in
the catalog (issue 28): the bodies are llama-server's own (0.3.36, captured with the tiny
model: no --embeddings; --embeddings --pooling none; --ctx-size 64 with a long prompt; an
embeddings input above the batch), through the router in-process to the real openai
client, from an engine that answers exactly as llama-server does."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import openai
import pytest
from fake_control import FakeControl

from llmgw_runtime.router.engine_errors import translate
from tests.control.conftest import served

from .conftest import API_KEY, ROUTER_TOKEN, model, table
from .test_app_inprocess import _app, _stop
from .test_hostile_engine import Engine

NO_EMBEDDINGS = (501, b'{"error":{"code":501,"message":"This server does not support '
                      b'embeddings. Start it with `--embeddings`","type":"not_supported_error"}}')
POOLING_NONE = (400, b'{"error":{"code":400,"message":"Pooling type \'none\' is not OAI '
                     b'compatible. Please use a different pooling type","type":'
                     b'"invalid_request_error"}}')
CONTEXT = (400, b'{"error":{"code":400,"message":"request (2443 tokens) exceeds the available '
                b'context size (256 tokens), try increasing it","type":'
                b'"exceed_context_size_error","n_prompt_tokens":2443,"n_ctx":256}}')
BATCH = (500, b'{"error":{"code":500,"message":"input (2402 tokens) is too large to process. '
              b'increase the physical batch size (current batch size: 64)","type":'
              b'"server_error"}}')


@pytest.mark.parametrize("engine,path,code,param,names", [
    (NO_EMBEDDINGS, "/v1/embeddings", "embeddings_not_enabled", "model",
     ["args: [--embeddings, --pooling, mean]", "llmgw ctl apply"]),
    (POOLING_NONE, "/v1/embeddings", "embeddings_pooling_unsupported", "model",
     ["--pooling mean"]),
    (CONTEXT, "/v1/chat/completions", "context_length_exceeded", "messages",
     ["2443 tokens", "256 tokens", "--ctx-size N", "llmgw ctl apply"]),
    (CONTEXT, "/v1/completions", "context_length_exceeded", "prompt", ["--ctx-size N"]),
    (BATCH, "/v1/embeddings", "context_length_exceeded", "input",
     ["2402 tokens", "--batch-size N", "--ubatch-size N"]),
])
def test_a_known_engine_error_is_a_400_in_openais_shape_naming_the_catalog_args(
        engine: tuple[int, bytes], path: str, code: str, param: str, names: list[str]) -> None:
    status, body = translate(*engine, "tiny", path)
    error = json.loads(body)["error"]
    assert status == 400 and set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", code,
                                                              param)
    assert "model 'tiny'" in error["message"]
    for name in names:
        assert name in error["message"], error["message"]


@pytest.mark.parametrize("status,body", [
    (500, b'{"error":{"code":500,"message":"something else","type":"server_error"}}'),
    (400, b'{"error":"not an object"}'), (502, b"<html>bad gateway</html>"),
    (400, b"{" + b" " * 20_000 + b"}"), (200, CONTEXT[1]),
])
def test_any_other_answer_passes_as_the_engine_gave_it(status: int, body: bytes) -> None:
    assert translate(status, body, "tiny", "/v1/chat/completions") == (status, body)


def _answer(status: int, body: bytes) -> bytes:
    """As llama-server answers an error (its empty CORS field and its close included)."""
    return (f"HTTP/1.1 {status} Error\r\nServer: llama.cpp\r\nAccess-Control-Allow-Origin: \r\n"
            "Content-Type: application/json; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body


@pytest.fixture
def llama_like() -> Iterator[str]:
    """The router in front of an engine answering embeddings 501 and chat 400, as
    llama-server started without --embeddings and with a small context does."""
    def answer(conn: socket.socket, n: int) -> None:
        conn.sendall(_answer(*(NO_EMBEDDINGS if n == 0 else CONTEXT)))
        conn.shutdown(socket.SHUT_WR)

    engine = Engine(answer)
    ctl = FakeControl(table(model("tiny", endpoints=[("r-0", engine.url)])),
                      ROUTER_TOKEN).start()
    app = _app(ctl.url)
    try:
        with served(app) as url:
            yield url
    finally:
        _stop(app)
        ctl.stop()
        engine.close()


def test_the_openai_client_gets_a_bad_request_that_names_the_fix(llama_like: str) -> None:
    client = openai.OpenAI(base_url=llama_like + "/v1", api_key=API_KEY, max_retries=0)
    with pytest.raises(openai.BadRequestError) as embeddings:       # not a 501 server error
        client.embeddings.create(model="tiny", input="hello")
    assert embeddings.value.code == "embeddings_not_enabled"
    assert "args: [--embeddings, --pooling, mean]" in embeddings.value.message
    assert "access-control-allow-origin" not in embeddings.value.response.headers
    with pytest.raises(openai.BadRequestError) as context:
        client.chat.completions.create(model="tiny",
                                       messages=[{"role": "user", "content": "long " * 2000}])
    assert context.value.code == "context_length_exceeded"
    assert "--ctx-size N" in context.value.message
