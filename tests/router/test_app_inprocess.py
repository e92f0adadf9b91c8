"""The Flask app in-process (no gunicorn) for key settings and control failures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fake_control import FakeControl
from flask import Flask

from llmgw_runtime.router.app import create_app
from llmgw_runtime.router.config import RouterConfig

from .conftest import ROUTER_TOKEN, model, table


@pytest.fixture
def keyless_control(engines: dict[str, str]) -> Iterator[FakeControl]:
    ctl = FakeControl(table(model("chat", endpoints=[("r-e1", engines["e1"])]), keys=()),
                      ROUTER_TOKEN).start()
    yield ctl
    ctl.stop()


def _app(control_url: str, **kw: object) -> Flask:
    cfg = RouterConfig(control_url=control_url, router_token=ROUTER_TOKEN,
                       refresh_interval_s=0.2, **kw)  # type: ignore[arg-type]
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
