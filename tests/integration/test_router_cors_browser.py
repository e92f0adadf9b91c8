"""CORS in a real headless Chromium (issue 28): a page served from another origin calls the
router with fetch() (a JSON POST with an API key: the browser sends a preflight first). A
router that allows the page's origin serves it, though its engine answers with llama.cpp's
empty ``Access-Control-Allow-Origin``; a router that does not is refused by the browser."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import pytest
from werkzeug.wrappers import Request, Response

from llmgw_runtime.router.app import create_app
from llmgw_runtime.router.config import RouterConfig
from llmgw_runtime.security import hash_token
from tests.control.conftest import served
from tests.support.procs import ROOT

from .test_console_browser import browser  # noqa: F401  (the fixture: a headless Chromium)

if str(ROOT / "bench") not in sys.path:
    sys.path.insert(0, str(ROOT / "bench"))
from fake_control import FakeControl  # noqa: E402

pytestmark = pytest.mark.slow

TOKEN, KEY = "llmgw-router-cors-test-0123456789", "sk-llmgw-cors-test"
ANSWER = b'{"choices":[{"index":0,"message":{"role":"assistant","content":"hello"}}]}'
FETCH = """
const [url, key, done] = arguments;
fetch(url, {method: 'POST', body: JSON.stringify({model: 'm', messages: []}),
            headers: {'Authorization': 'Bearer ' + key, 'Content-Type': 'application/json'}})
  .then(r => r.json().then(j => done('ok ' + r.status + ' ' + j.choices[0].message.content)))
  .catch(e => done('failed: ' + e));
"""


@Request.application
def engine(request: Request) -> Response:
    """Answers as llama-server does, its empty CORS field included."""
    return Response(ANSWER, content_type="application/json",
                    headers={"Access-Control-Allow-Origin": ""})


@Request.application
def page(request: Request) -> Response:
    return Response("<!doctype html><title>app</title><p>a web app</p>", mimetype="text/html")


@pytest.fixture
def urls() -> Iterator[dict[str, str]]:
    """The page's origin, and two routers in front of the engine: one allowing it."""
    with ExitStack() as stack:
        page_url = stack.enter_context(served(page))  # type: ignore[arg-type]
        engine_url = stack.enter_context(served(engine))  # type: ignore[arg-type]
        ctl = FakeControl({"models": [{"name": "m", "state": "ready", "endpoints": [
            {"replica_id": "r-0", "url": engine_url}]}], "api_key_hashes": [hash_token(KEY)]},
            TOKEN).start()
        stack.callback(ctl.stop)
        out = {"page": page_url}
        for name, origins in (("allowing", page_url), ("closed", "")):
            app = create_app(RouterConfig(control_url=ctl.url, router_token=TOKEN,
                                          cors_origins=origins))
            stack.callback(app.extensions["llmgw_router"].routes.stop)
            out[name] = stack.enter_context(served(app))
        yield out


def test_a_page_of_an_allowed_origin_can_call_the_router_and_another_cannot(
        browser: Any, urls: dict[str, str]) -> None:  # noqa: F811
    browser.set_script_timeout(20)
    browser.get(urls["page"] + "/")
    allowed = browser.execute_async_script(FETCH, urls["allowing"] + "/v1/chat/completions",
                                           KEY)
    assert allowed == "ok 200 hello"
    refused = browser.execute_async_script(FETCH, urls["closed"] + "/v1/chat/completions", KEY)
    assert refused.startswith("failed: TypeError"), refused
    logs = " ".join(str(e) for e in browser.get_log("browser"))
    assert "CORS" in logs or "Access-Control-Allow-Origin" in logs, logs
