"""Request traces (issue 29): the real router (serve.run, a gevent worker) with
LLMGW_OTEL_ENDPOINT set exports its spans with the real OTLP/HTTP exporter to a receiver
in the test (decoded with opentelemetry-proto), continuing the client's traceparent, and
the engine is sent a traceparent naming the router's upstream span; with it unset the
router imports no opentelemetry and the client's traceparent reaches the engine as sent."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import harness
import openai
import pytest
import requests
from fake_control import FakeControl
from werkzeug.serving import make_server
from werkzeug.wrappers import Request, Response

from llmgw_runtime.security import hash_token
from tests.support.otlp import Receiver, Span

from .conftest import API_KEY, ROUTER_TOKEN, model, table

SERVER, CLIENT = 2, 3           # opentelemetry.proto Span.SpanKind
ERROR = 2                       # Status.StatusCode
PROMPT = "a prompt that must never leave the host"


class Engine:
    """An OpenAI engine that records the headers of each request and answers a chat
    stream with its usage (7 prompt, 3 completion tokens); model "broken" gets a 500."""

    def __init__(self) -> None:
        self.headers: list[dict[str, str]] = []
        self._server = make_server("127.0.0.1", 0, self._wsgi, threaded=True)
        self.url = f"http://127.0.0.1:{self._server.server_port}"
        threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True).start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def seen(self, marker: str) -> dict[str, str]:
        return next(h for h in reversed(self.headers) if h.get("X-Test") == marker)

    def _wsgi(self, environ: dict[str, Any], start_response: Any) -> Any:
        req = Request(environ)
        self.headers.append(dict(req.headers))
        doc = json.loads(req.get_data())
        if doc["model"] == "broken":
            return Response(b'{"error": {"message": "boom"}}', 500,
                            content_type="application/json")(environ, start_response)
        chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1,
                 "model": doc["model"], "choices": [{"index": 0, "finish_reason": "stop",
                                                     "delta": {"content": "ok"}}]}
        usage = {"id": "c", "object": "chat.completion.chunk", "created": 1,
                 "model": doc["model"], "choices": [],
                 "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}}
        data = f"data: {json.dumps(chunk)}\n\ndata: {json.dumps(usage)}\n\ndata: [DONE]\n\n"
        return Response(data.encode(), 200, content_type="text/event-stream")(
            environ, start_response)


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    eng = Engine()
    yield eng
    eng.stop()


@pytest.fixture(scope="module")
def control(engine: Engine) -> Iterator[FakeControl]:
    ctl = FakeControl(table(model("chat", endpoints=[("r-chat", engine.url)]),
                            model("broken", endpoints=[("r-broken", engine.url)])),
                      ROUTER_TOKEN).start()
    yield ctl
    ctl.stop()


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    rec = Receiver()
    yield rec
    rec.stop()


@pytest.fixture(scope="module")
def traced_router(control: FakeControl, receiver: Receiver) -> Iterator[str]:
    """The real router (one gevent worker) sending its spans to ``receiver``; the batch
    processor sends every 50 ms (OTEL_BSP_SCHEDULE_DELAY, read by the SDK)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
        proc, url = harness.start_router(control.url, ROUTER_TOKEN, workers=1,
                                         refresh_interval_s=0.2,
                                         otel_endpoint=receiver.url, otel_sample_ratio=1.0)
    try:
        yield url
    finally:
        harness.stop(proc)


def _traceparent() -> tuple[str, str, str]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, f"00-{trace_id}-{span_id}-01"


def _of_trace(trace_id: str, *names: str) -> Any:
    """A wait condition: the spans of ``trace_id`` once every name in ``names`` is there."""
    def found(spans: list[Span]) -> dict[str, Span] | None:
        mine = {s.name: s for s in spans if s.trace_id == trace_id}
        return mine if all(n in mine for n in names) else None
    return found


def test_a_streamed_request_is_one_trace_under_the_clients_span_and_the_engine_continues_it(
        traced_router: str, receiver: Receiver, engine: Engine) -> None:
    trace_id, client_span, traceparent = _traceparent()
    client = openai.OpenAI(base_url=traced_router + "/v1", api_key=API_KEY, max_retries=0,
                           timeout=20)
    pieces = list(client.chat.completions.create(
        model="chat", messages=[{"role": "user", "content": PROMPT}], stream=True,
        extra_headers={"traceparent": traceparent, "tracestate": "vendor=abc",
                       "X-Test": "stream"}))
    assert "".join(p.choices[0].delta.content or "" for p in pieces if p.choices) == "ok"

    spans = receiver.wait(_of_trace(trace_id, "POST /v1/chat/completions", "key check",
                                    "admission", "upstream"))
    request = spans["POST /v1/chat/completions"]
    assert (request.kind, request.parent_id) == (SERVER, client_span)
    assert request.service == "llmgw-router"
    attrs = request.attributes
    assert attrs["llmgw.model"] == "chat" and attrs["llmgw.stream"] is True
    assert attrs["llmgw.key.id"] == hash_token(API_KEY)[:16]
    assert attrs["http.response.status_code"] == 200
    assert (attrs["gen_ai.usage.input_tokens"], attrs["gen_ai.usage.output_tokens"]) == (7, 3)
    assert request.event("first byte") is not None
    assert request.event("stream end") == {"llmgw.outcome": "complete",
                                           "gen_ai.usage.input_tokens": 7,
                                           "gen_ai.usage.output_tokens": 3}
    for name in ("key check", "admission", "upstream"):
        assert spans[name].parent_id == request.span_id, name
    admission = spans["admission"].attributes
    assert admission["llmgw.replica"] == "r-chat"
    assert admission["llmgw.admission.reason"] == "load"
    assert admission["llmgw.queue.wait_s"] >= 0
    upstream = spans["upstream"]
    assert upstream.kind == CLIENT and upstream.status != ERROR
    assert upstream.event("answer head") == {"http.response.status_code": 200}

    # the engine's parent is the router's upstream span, in the client's trace
    seen = engine.seen("stream")
    assert seen["Traceparent"] == f"00-{trace_id}-{upstream.span_id}-01"
    assert seen["Tracestate"] == "vendor=abc"

    # names and numbers leave the host, never the key or the prompt
    sent = b"".join(receiver.bodies)
    assert API_KEY.encode() not in sent and PROMPT.encode() not in sent


def test_errors_are_recorded_on_the_spans(traced_router: str, receiver: Receiver) -> None:
    wrong_trace, _, wrong = _traceparent()
    resp = requests.post(traced_router + "/v1/chat/completions", timeout=10,
                         json={"model": "chat", "messages": []},
                         headers={"Authorization": "Bearer sk-llmgw-wrong", "traceparent": wrong})
    assert resp.status_code == 401
    broken_trace, _, broken = _traceparent()
    resp = requests.post(traced_router + "/v1/chat/completions", timeout=10,
                         json={"model": "broken", "messages": []},
                         headers={"Authorization": f"Bearer {API_KEY}", "traceparent": broken})
    assert resp.status_code == 500

    refused = receiver.wait(_of_trace(wrong_trace, "POST /v1/chat/completions", "key check"))
    request = refused["POST /v1/chat/completions"]
    assert request.status == ERROR and request.attributes["http.response.status_code"] == 401
    exception = request.event("exception")
    assert exception is not None and exception["exception.type"] == "InvalidApiKey"
    assert exception["exception.message"].startswith("invalid_api_key: the API key is not valid")
    assert refused["key check"].status == ERROR
    assert "admission" not in refused

    failed = receiver.wait(_of_trace(broken_trace, "POST /v1/chat/completions", "upstream"))
    assert failed["upstream"].status == ERROR
    assert failed["upstream"].status_message == "the engine answered 500"
    assert failed["POST /v1/chat/completions"].status == ERROR


_UNTRACED = """
import json, sys
from llmgw_runtime.router.app import create_app
from llmgw_runtime.router.config import RouterConfig
control_url, token, key, traceparent = sys.argv[1:5]
app = create_app(RouterConfig(control_url=control_url, router_token=token))
resp = app.test_client().post("/v1/chat/completions",
                              json={"model": "chat", "messages": []},
                              headers={"Authorization": "Bearer " + key,
                                       "traceparent": traceparent, "tracestate": "v=1",
                                       "X-Test": "untraced"})
app.extensions["llmgw_router"].routes.stop()
print(json.dumps({"status": resp.status_code,
                  "otel": sorted(m for m in sys.modules if m.startswith("opentelemetry"))}))
"""


def test_without_an_endpoint_no_opentelemetry_is_imported_and_the_traceparent_goes_on(
        control: FakeControl, engine: Engine) -> None:
    _, _, traceparent = _traceparent()
    out = subprocess.run([sys.executable, "-c", _UNTRACED, control.url, ROUTER_TOKEN, API_KEY,
                          traceparent], capture_output=True, text=True, timeout=60,
                         env={k: v for k, v in os.environ.items()
                              if not k.startswith("LLMGW_")}, cwd=harness.ROOT, check=True)
    answer = json.loads(out.stdout.strip().splitlines()[-1])
    assert answer == {"status": 200, "otel": []}
    seen = engine.seen("untraced")
    assert (seen["Traceparent"], seen["Tracestate"]) == (traceparent, "v=1")


def test_a_worker_sends_the_spans_it_holds_as_it_stops(
        control: FakeControl, receiver: Receiver) -> None:
    """Batches every minute: only the stopping worker's flush (serve.py) sends them."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OTEL_BSP_SCHEDULE_DELAY", "60000")
        proc, url = harness.start_router(control.url, ROUTER_TOKEN, workers=1,
                                         otel_endpoint=receiver.url)
    try:
        trace_id, _, traceparent = _traceparent()
        assert requests.post(url + "/v1/chat/completions", timeout=10,
                             json={"model": "chat", "messages": []},
                             headers={"Authorization": f"Bearer {API_KEY}",
                                      "traceparent": traceparent}).status_code == 200
    finally:
        harness.stop(proc)
    receiver.wait(_of_trace(trace_id, "POST /v1/chat/completions", "upstream"), 5)
