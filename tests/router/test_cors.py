"""CORS (issue 28): the router answers an allowed origin's preflight and marks its answers,
gives any other origin nothing, and never passes an engine's own CORS fields on. The router
in-process in front of an engine that answers as llama-server does (its empty
``Access-Control-Allow-Origin``). The same in a real Chromium: tests/integration/
test_router_cors_browser.py."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from fake_control import FakeControl
from flask import Flask

from llmgw_runtime.errors import ConfigError
from llmgw_runtime.router.config import RouterConfig
from llmgw_runtime.settings import load

from .conftest import API_KEY, ROUTER_TOKEN, model, table
from .test_app_inprocess import _app, _stop
from .test_hostile_engine import Engine

PAGE = "http://page.test:8000"
OK = b'{"choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}]}'
AUTH = {"Authorization": f"Bearer {API_KEY}"}
PREFLIGHT = {"Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "authorization,content-type,x-stainless-os"}


def llama_like(conn: socket.socket, n: int) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nServer: llama.cpp\r\nAccess-Control-Allow-Origin: \r\n"
                 b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(OK) + OK)


@pytest.fixture(scope="module")
def control() -> Iterator[FakeControl]:
    engine = Engine(llama_like)
    ctl = FakeControl(table(model("m", endpoints=[("r-0", engine.url)])), ROUTER_TOKEN).start()
    yield ctl
    ctl.stop()
    engine.close()


@pytest.fixture
def app(control: FakeControl, request: pytest.FixtureRequest) -> Iterator[Flask]:
    made = _app(control.url, **getattr(request, "param", {}))
    yield made
    _stop(made)


@pytest.mark.parametrize("app", [{"cors_origins": f"{PAGE}, https://other.test"}],
                         indirect=True)
def test_an_allowed_origin_is_answered_its_preflight_and_its_requests(app: Flask) -> None:
    web = app.test_client()
    pre = web.options("/v1/chat/completions", headers={"Origin": PAGE, **PREFLIGHT})
    assert pre.status_code == 204
    assert pre.headers["Access-Control-Allow-Origin"] == PAGE
    assert pre.headers["Vary"] == "Origin"
    assert "POST" in pre.headers["Access-Control-Allow-Methods"]
    allowed = [h.strip().lower() for h in pre.headers["Access-Control-Allow-Headers"].split(",")]
    assert {"authorization", "content-type", "x-api-key", "x-stainless-os"} <= set(allowed)
    assert int(pre.headers["Access-Control-Max-Age"]) > 0
    resp = web.post("/v1/chat/completions", json={"model": "m", "messages": []},
                    headers={"Origin": PAGE, **AUTH})
    assert resp.status_code == 200
    assert resp.headers.getlist("Access-Control-Allow-Origin") == [PAGE]    # not the engine's
    assert "Retry-After" in resp.headers["Access-Control-Expose-Headers"]
    refused = web.get("/v1/models", headers={"Origin": PAGE})           # errors are marked too
    assert refused.status_code == 401 and refused.headers["Access-Control-Allow-Origin"] == PAGE
    # another origin gets nothing its browser would accept
    other = web.options("/v1/chat/completions",
                        headers={"Origin": "http://evil.test", **PREFLIGHT})
    assert "Access-Control-Allow-Origin" not in other.headers
    other = web.post("/v1/chat/completions", json={"model": "m", "messages": []},
                     headers={"Origin": "http://evil.test", **AUTH})
    assert other.status_code == 200 and "Access-Control-Allow-Origin" not in other.headers


@pytest.mark.parametrize("app", [{"cors_origins": "*"}], indirect=True)
def test_any_origin_when_set_to_a_star(app: Flask) -> None:
    pre = app.test_client().options("/v1/models", headers={"Origin": PAGE, **PREFLIGHT})
    assert pre.status_code == 204 and pre.headers["Access-Control-Allow-Origin"] == "*"


def test_by_default_no_origin_is_allowed_and_the_engines_cors_field_is_dropped(
        app: Flask) -> None:
    web = app.test_client()
    pre = web.options("/v1/chat/completions", headers={"Origin": PAGE, **PREFLIGHT})
    assert not [h for h in pre.headers.keys() if h.lower().startswith("access-control-")]
    resp = web.post("/v1/chat/completions", json={"model": "m", "messages": []},
                    headers={"Origin": PAGE, **AUTH})
    assert resp.status_code == 200
    assert not [h for h in resp.headers.keys() if h.lower().startswith("access-control-")]


@pytest.mark.parametrize("value", ["page.test", "http://page.test/app", "*, http://a.test",
                                   "ftp://a.test"])
def test_a_malformed_origin_is_refused_at_start_saying_how_to_write_it(value: str) -> None:
    with pytest.raises(ConfigError) as bad:
        load(RouterConfig, env={"LLMGW_CONTROL_URL": "http://127.0.0.1:8470",
                                "LLMGW_ROUTER_TOKEN": ROUTER_TOKEN,
                                "LLMGW_CORS_ORIGINS": value})
    assert "LLMGW_CORS_ORIGINS" in str(bad.value.details)
