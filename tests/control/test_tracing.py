"""Traces of the control service (issue 29): with LLMGW_OTEL_ENDPOINT set its web requests
and its reconciler's passes are spans, sent with the real OTLP/HTTP exporter to a
receiver in the test (decoded with opentelemetry-proto); settings that cannot work are
refused with what to set."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw_runtime import tracing
from llmgw_runtime.control.app import create_app
from llmgw_runtime.control.bootstrap import bootstrap
from llmgw_runtime.control.config import ControlConfig
from llmgw_runtime.control.reconcile import Reconciler
from llmgw_runtime.router.config import RouterConfig
from llmgw_runtime.store import Store
from tests.support.otlp import Receiver

from .conftest import ADMIN, JOIN, ROUTER

SERVER, ERROR = 2, 2       # opentelemetry.proto Span.SpanKind, Status.StatusCode


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    rec = Receiver()
    yield rec
    tracing.shutdown()       # this process's tracers, made by the test
    rec.stop()


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[Store]:
    s = Store(f"sqlite:///{tmp_path}/llmgw.db")
    s.migrate()
    yield s
    s.dispose()


def _config(tmp_path: Path, receiver: Receiver) -> ControlConfig:
    return ControlConfig(state_dir=tmp_path, admin_token=ADMIN, join_token=JOIN,
                         router_token=ROUTER, otel_endpoint=receiver.url,
                         reconcile_interval_s=0.05)


def test_web_requests_are_spans_named_by_route_under_the_callers_trace(
        sqlite_store: Store, tmp_path: Path, receiver: Receiver) -> None:
    config = _config(tmp_path, receiver)
    bootstrap(sqlite_store, config)
    client = create_app(config, store_=sqlite_store).test_client()
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    assert client.get("/healthz", headers={"traceparent": f"00-{trace_id}-{parent}-01"}
                      ).status_code == 200
    assert client.get("/api/v1/models/nothing-here",
                      headers={"Authorization": f"Bearer {ADMIN}"}).status_code == 404
    assert client.get("/api/v1/status").status_code == 401     # no token
    tracing.shutdown()       # what a stopping worker does: its spans are sent

    spans = receiver.wait(lambda got: got if len(got) >= 3 else None)
    health = next(s for s in spans if s.trace_id == trace_id)
    assert (health.name, health.kind, health.parent_id) == ("GET /healthz", SERVER, parent)
    assert health.service == "llmgw-control"
    assert health.attributes == {"http.request.method": "GET", "http.route": "/healthz",
                                 "http.response.status_code": 200}
    by_route = {s.attributes.get("http.route"): s for s in spans}
    missing = by_route["/api/v1/models/<path:name>"]          # the rule, not the name asked
    assert missing.name == "GET /api/v1/models/<path:name>"
    assert missing.attributes["http.response.status_code"] == 404
    assert by_route["/api/v1/status"].attributes["http.response.status_code"] == 401
    assert b"nothing-here" not in b"".join(receiver.bodies)
    assert ADMIN.encode() not in b"".join(receiver.bodies)


def test_each_reconciler_pass_is_a_span_saying_whether_it_led(
        sqlite_store: Store, tmp_path: Path, receiver: Receiver) -> None:
    reconciler = Reconciler(sqlite_store, _config(tmp_path, receiver), holder="traced")
    thread = reconciler.start()
    try:
        deadline = time.monotonic() + 5
        while not reconciler.is_leader and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        reconciler.stop()
        thread.join(5)
    tracing.shutdown()
    passes = receiver.wait(lambda got: [s for s in got if s.name == "reconcile pass"])
    assert passes[0].service == "llmgw-reconciler"
    assert passes[0].attributes == {"llmgw.reconciler": "traced", "llmgw.leader": True}
    assert passes[0].status != ERROR


@pytest.mark.parametrize("cls", [ControlConfig, RouterConfig])
def test_tracing_settings_that_cannot_work_are_refused_with_what_to_set(cls: type) -> None:
    problems = "\n".join(cls(otel_endpoint="collector:4318", otel_sample_ratio=1.5).validate())
    assert "LLMGW_OTEL_ENDPOINT='collector:4318' is not an http(s) URL" in problems
    assert "e.g. http://collector:4318" in problems
    assert "LLMGW_OTEL_SAMPLE_RATIO=1.5 must be from 0 to 1" in problems
    assert tracing.traces_url("http://collector:4318") == "http://collector:4318/v1/traces"
    assert tracing.traces_url("https://c/otlp/v1/traces") == "https://c/otlp/v1/traces"
