"""Property-based: whatever body arrives, the router answers 2xx/4xx (or its documented
502/503 when no upstream can take the request), never a 500, and every error in OpenAI's
shape. The app runs in-process with a routes table whose only routable model has a dead
replica, so nothing here depends on an engine."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fake_control import FakeControl
from flask import Flask
from flask.testing import FlaskClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmgw_runtime.router.app import create_app
from llmgw_runtime.router.config import RouterConfig

from .conftest import ROUTER_TOKEN, model, table

PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
MODELS = ("dead", "parked", "nope", "")
FUZZ = settings(max_examples=120, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])


@pytest.fixture(scope="module")
def fuzz_client(dead_url: str) -> Iterator[FlaskClient]:
    ctl = FakeControl(table(model("dead", endpoints=[("r-dead", dead_url)]),
                            model("parked", "parked", reason="engine exited"), keys=()),
                      ROUTER_TOKEN).start()
    app: Flask = create_app(RouterConfig(control_url=ctl.url, router_token=ROUTER_TOKEN,
                                         require_api_key=False, refresh_interval_s=0.5,
                                         activation_timeout_s=0.05, max_body_mb=0.0625))
    try:
        yield app.test_client()
    finally:
        app.extensions["llmgw_router"].routes.stop()
        ctl.stop()


def _check(client: FlaskClient, path: str, body: bytes, **kw: Any) -> None:
    resp = client.post(path, data=body, **kw)
    assert resp.status_code < 500 or resp.status_code in (502, 503), (resp.status_code,
                                                                     resp.data[:300])
    if resp.status_code >= 400:
        doc = json.loads(resp.data)
        err = doc["error"]
        assert set(doc) == {"error"} and set(err) == {"message", "type", "code", "param"}
        assert all(isinstance(err[k], str) and err[k] for k in ("message", "type", "code"))
        assert err["param"] is None or isinstance(err["param"], str)


json_scalars = (st.none() | st.booleans() | st.integers() | st.floats()
                | st.text() | st.integers(min_value=-10**400, max_value=10**400))
json_values = st.recursive(json_scalars,
                           lambda inner: st.lists(inner, max_size=5)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=5),
                           max_leaves=30)
model_values = st.sampled_from(MODELS) | json_values
paths = st.sampled_from(PATHS)


def _dumps(value: Any) -> bytes:
    # allow_nan: NaN/Infinity literals reach the router as some clients send them
    return json.dumps(value, allow_nan=True, ensure_ascii=False).encode("utf-8",
                                                                        "surrogatepass")


@FUZZ
@given(paths, st.binary(max_size=4096))
def test_arbitrary_bytes(fuzz_client: FlaskClient, path: str, body: bytes) -> None:
    _check(fuzz_client, path, body, content_type="application/json")


@FUZZ
@given(paths, json_values)
def test_arbitrary_json_values(fuzz_client: FlaskClient, path: str, value: Any) -> None:
    _check(fuzz_client, path, _dumps(value))


@FUZZ
@given(paths, model_values, st.dictionaries(st.text(max_size=8), json_values, max_size=4))
def test_objects_with_any_model(fuzz_client: FlaskClient, path: str, name: Any,
                                extra: dict[str, Any]) -> None:
    _check(fuzz_client, path, _dumps({**extra, "model": name}))


@FUZZ
@given(paths, st.integers(1, 20_000), st.sampled_from([b"[", b'{"a":', b'[{"b":']),
       st.booleans())
def test_deep_nesting(fuzz_client: FlaskClient, path: str, depth: int, opener: bytes,
                      closed: bool) -> None:
    closer = {b"[": b"]", b'{"a":': b"}", b'[{"b":': b"}]"}[opener]
    inner = opener * depth + b"1" + (closer * depth if closed else b"")
    _check(fuzz_client, path, b'{"model": "dead", "x": ' + inner + b"}")
    _check(fuzz_client, path, inner)


@FUZZ
@given(paths, st.sampled_from([b"NaN", b"Infinity", b"-Infinity", b"1e999", b"-1e400"])
       | st.integers(1, 6000).map(lambda n: b"7" * n)
       | st.integers(1, 6000).map(lambda n: b"1." + b"3" * n + b"e308"))
def test_huge_and_non_finite_numbers(fuzz_client: FlaskClient, path: str,
                                     number: bytes) -> None:
    _check(fuzz_client, path, b'{"model": "dead", "temperature": ' + number + b"}")
    _check(fuzz_client, path, number)


@FUZZ
@given(paths, st.text(st.characters(max_codepoint=0x9f), max_size=40),
       st.sampled_from(["model", "prompt"]))
def test_strings_with_control_characters(fuzz_client: FlaskClient, path: str, text: str,
                                         field: str) -> None:
    raw = {"model": "dead", field: "{text}"}
    body = json.dumps(raw).replace("{text}", text.replace("\\", "\\\\").replace('"', '\\"'))
    _check(fuzz_client, path, body.encode("utf-8"))   # raw control characters: not JSON
    _check(fuzz_client, path, json.dumps({**raw, field: text}).encode())   # escaped ones


def test_oversized_fuzzed_body_is_413(fuzz_client: FlaskClient) -> None:
    resp = fuzz_client.post(PATHS[0], data=b"[" * 70_000)
    assert resp.status_code == 413
    _check(fuzz_client, PATHS[0], b"[" * 70_000)
