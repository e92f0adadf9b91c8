"""The Flask app in-process (no gunicorn) for key settings and control failures."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator

import openai
import pytest
from fake_control import FakeControl
from flask import Flask

from llmgw_runtime.router.app import create_app
from llmgw_runtime.router.config import RouterConfig
from tests.control.conftest import served

from .conftest import ROUTER_TOKEN, model, table


@pytest.fixture
def keyless_control(engines: dict[str, str]) -> Iterator[FakeControl]:
    ctl = FakeControl(table(model("chat", endpoints=[("r-e1", engines["e1"])]), keys=()),
                      ROUTER_TOKEN).start()
    yield ctl
    ctl.stop()


def _app(control_url: str, **kw: object) -> Flask:
    kw.setdefault("refresh_interval_s", 0.2)
    cfg = RouterConfig(control_url=control_url, router_token=ROUTER_TOKEN,
                       **kw)  # type: ignore[arg-type]
    app = create_app(cfg)
    return app


def _stop(app: Flask) -> None:
    app.extensions["llmgw_router"].routes.stop()


def test_no_keys_configured_is_refused_with_how_to_create_one(keyless_control: FakeControl) -> None:
    app = _app(keyless_control.url)
    try:
        resp = app.test_client().post("/v1/chat/completions", json={"model": "chat"},
                                      headers={"Authorization": "Bearer sk-llmgw-x"})
        assert resp.status_code == 401
        err = resp.get_json()["error"]
        assert err["code"] == "invalid_api_key"
        assert "llmgw ctl keys create NAME" in err["message"]
    finally:
        _stop(app)


def test_keys_not_required_lets_requests_through_without_one(
        keyless_control: FakeControl) -> None:
    app = _app(keyless_control.url, require_api_key=False)
    try:
        resp = app.test_client().post("/v1/chat/completions",
                                      json={"model": "chat", "messages": []})
        assert resp.status_code == 200
        assert resp.get_json()["system_fingerprint"] == "e1"
    finally:
        _stop(app)


def test_a_new_worker_is_healthy_on_its_first_request(keyless_control: FakeControl) -> None:
    # Each gunicorn worker has its own table: the one that answers /healthz first (a
    # load balancer's probe, the role's check) must not say 503 because it is new.
    app = _app(keyless_control.url)
    try:
        resp = app.test_client().get("/healthz")
        assert (resp.status_code, resp.get_json()) == (200, {"status": "ok", "models": 1})
    finally:
        _stop(app)


def test_unreachable_control_gives_503_and_unhealthy(dead_url: str) -> None:
    app = _app(dead_url)
    try:
        c = app.test_client()
        resp = c.post("/v1/chat/completions", json={"model": "chat"})
        assert resp.status_code == 503
        assert resp.get_json()["error"]["code"] == "model_not_ready"
        assert "unreachable" in resp.get_json()["error"]["message"]
        assert c.get("/healthz").status_code == 503
    finally:
        _stop(app)


def test_invalid_request_when_model_missing(keyless_control: FakeControl) -> None:
    app = _app(keyless_control.url, require_api_key=False)
    try:
        resp = app.test_client().post("/v1/embeddings", json={"input": "x"})
        assert resp.status_code == 400
        assert resp.get_json()["error"] == {
            "message": resp.get_json()["error"]["message"], "type": "invalid_request_error",
            "code": "invalid_request", "param": "model"}
    finally:
        _stop(app)


@pytest.fixture
def open_app(keyless_control: FakeControl) -> Iterator[Flask]:
    app = _app(keyless_control.url, require_api_key=False, max_body_mb=0.25)
    yield app
    _stop(app)


def _post(app: Flask, body: bytes) -> tuple[int, dict[str, object]]:
    resp = app.test_client().post("/v1/chat/completions", data=body,
                                  content_type="application/json")
    err = resp.get_json()["error"]
    assert set(err) == {"message", "type", "code", "param"}
    return resp.status_code, err


def test_deep_nesting_is_refused_with_the_limit_not_a_500(open_app: Flask) -> None:
    status, err = _post(open_app, b"[" * 50_000 + b"]" * 50_000)
    assert (status, err["code"]) == (400, "invalid_request")
    assert "64" in str(err["message"])
    # 64 levels are fine: the body is then refused for not being an object
    status, err = _post(open_app, b"[" * 64 + b"]" * 64)
    assert (status, err["code"]) == (400, "invalid_request")
    assert "not an array" in str(err["message"])


@pytest.mark.parametrize("body", [b'{"model": "chat"\xff}', "{\"model\": \"\u00e9\"}".encode("utf-16"),
                                  b'{"model": "chat", "t": NaN}', b'{"model": "chat", "t": 1e999}',
                                  b'{"model": "chat", "n": ' + b"9" * 5000 + b"}",
                                  b'{"model": "ch\x01at"}'])
def test_bodies_that_are_not_strict_utf8_json_are_400_invalid_json(open_app: Flask,
                                                                 body: bytes) -> None:
    status, err = _post(open_app, body)
    assert (status, err["code"], err["type"]) == (400, "invalid_json", "invalid_request_error")


@pytest.mark.parametrize("body", [b"[]", b'"chat"', b"3", b"null", b"true"])
def test_json_that_is_not_an_object_is_400(open_app: Flask, body: bytes) -> None:
    status, err = _post(open_app, body)
    assert (status, err["code"]) == (400, "invalid_request")
    assert "JSON object" in str(err["message"])


@pytest.mark.parametrize("model", [3, None, [], {}, True, ""])
def test_model_that_is_not_a_string_is_400(open_app: Flask, model: object) -> None:
    status, err = _post(open_app, json.dumps({"model": model}).encode())
    assert (status, err["code"], err["param"]) == (400, "invalid_request", "model")


def test_very_long_model_name_is_400_with_the_bound(open_app: Flask) -> None:
    status, err = _post(open_app, json.dumps({"model": "m" * 100_000}).encode())
    assert (status, err["code"], err["param"]) == (400, "invalid_request", "model")
    assert "200" in str(err["message"]) and len(str(err["message"])) < 300


def test_body_over_the_limit_is_413_in_openai_shape(open_app: Flask) -> None:
    status, err = _post(open_app, b'{"model": "chat", "p": "' + b"x" * 300_000 + b'"}')
    assert (status, err["code"], err["type"]) == (413, "request_too_large",
                                                  "invalid_request_error")
    assert "LLMGW_MAX_BODY_MB" in str(err["message"])
    assert "262144 bytes" in str(err["message"])
    # without a Content-Length (a stream), read only up to the limit
    resp = open_app.test_client().post("/v1/chat/completions",
                                       input_stream=io.BytesIO(b"x" * 300_000))
    assert resp.status_code == 413
    assert resp.get_json()["error"]["code"] == "request_too_large"


def test_method_not_allowed_keeps_the_allow_header(open_app: Flask) -> None:
    c = open_app.test_client()
    resp = c.get("/v1/chat/completions")
    assert resp.status_code == 405
    assert set(resp.headers["Allow"].replace(" ", "").split(",")) == {"OPTIONS", "POST"}
    assert resp.get_json()["error"]["code"] == "method_not_allowed"
    resp = c.delete("/v1/models")
    assert resp.status_code == 405 and "GET" in resp.headers["Allow"]


def test_retrieve_a_model_whose_name_has_a_slash_with_the_openai_client(
        engines: dict[str, str]) -> None:
    control = FakeControl(table(model("org/chat", endpoints=[("r-e1", engines["e1"])]),
                                keys=()), ROUTER_TOKEN).start()
    app = _app(control.url, require_api_key=False)
    try:
        with served(app) as url:
            client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
            assert client.models.retrieve("org/chat").id == "org/chat"
            with pytest.raises(openai.NotFoundError) as info:
                client.models.retrieve("org/nope")
            assert info.value.response.json()["error"]["code"] == "model_not_found"
    finally:
        _stop(app)
        control.stop()
