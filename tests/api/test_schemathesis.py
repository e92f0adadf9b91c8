"""Schemathesis against both services' generated /openapi.json, in-process: requests made
from the published schema (valid and invalid) never get a 5xx, every answer matches the
schema, and a method a path lacks gets a 405 with ``Allow``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import (
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
    unsupported_method,
)

from llmgw_runtime.control.app import create_app
from llmgw_runtime.control.bootstrap import bootstrap
from llmgw_runtime.control.config import ControlConfig
from llmgw_runtime.router.app import create_app as create_router
from llmgw_runtime.router.config import RouterConfig
from llmgw_runtime.store import Store

from ..control.conftest import ADMIN, CPU, JOIN, ROUTER, served

CHECKS = [not_a_server_error, response_schema_conformance, status_code_conformance,
          unsupported_method]
CATALOG = """models:
  - {name: tiny, source: /m/tiny.gguf, engine: llama.cpp, profile: {class: cpu}}
  - {name: big, source: /m/big.gguf, engine: llama.cpp, profile: {class: h100-80g}}
"""
SETTINGS = settings(max_examples=25, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck))


class Control:
    def __init__(self, tmp: Path) -> None:
        self.store = Store(f"sqlite:///{tmp / 'llmgw.db'}")
        self.store.migrate()
        config = ControlConfig(state_dir=tmp, admin_token=ADMIN, join_token=JOIN,
                               router_token=ROUTER)
        bootstrap(self.store, config)
        self.app = create_app(config, store_=self.store)
        client = self.app.test_client()
        joined = client.post("/api/v1/agent/join", json={"node": "n1"},
                             headers={"Authorization": f"Bearer {JOIN}"})
        self.node = joined.get_json()["credential"]
        auth = {"Authorization": f"Bearer {self.node}"}
        assert client.post("/api/v1/agent/report", headers=auth, json={
            "node": "n1", "address": "127.0.0.1", "devices": [CPU]}).status_code == 200
        assert client.put("/api/v1/catalog", data=CATALOG, headers={
            "Authorization": f"Bearer {ADMIN}"}).status_code == 200

    def token(self, path: str) -> str:
        if path == "/api/v1/agent/join":
            return JOIN
        if path == "/api/v1/agent/report":
            return self.node
        if path in ("/api/v1/idle", "/api/v1/routes", "/api/v1/activate"):
            return ROUTER
        return ADMIN


@pytest.fixture(scope="module")
def control(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Control]:
    ctl = Control(tmp_path_factory.mktemp("control"))
    yield ctl
    ctl.store.dispose()


@pytest.fixture(scope="module")
def control_schema(control: Control) -> Any:
    return schemathesis.openapi.from_wsgi("/openapi.json", control.app)


@pytest.fixture(scope="module")
def router(control: Control) -> Iterator[Any]:
    """A router in-process in front of the real control service served on loopback."""
    with served(control.app) as url:
        app = create_router(RouterConfig(control_url=url, router_token=ROUTER,
                                         require_api_key=False, refresh_interval_s=0.5,
                                         activation_timeout_s=1.0))
        yield app
        app.extensions["llmgw_router"].routes.stop()


@pytest.fixture(scope="module")
def router_schema(router: Any) -> Any:
    return schemathesis.openapi.from_wsgi("/openapi.json", router)


def run_schema(schema: Any, headers: Any, checks: list[Any] = CHECKS) -> list[str]:
    """Every operation of ``schema`` with generated requests (valid and invalid ones);
    returns the failures, each naming the operation."""
    failures: list[str] = []
    for result in schema.get_all_operations():
        operation = result.ok()

        @given(case=operation.as_strategy())
        @SETTINGS
        def check(case: Any) -> None:
            case.call_and_validate(headers=headers(case.path), checks=checks)
        try:
            check()
        except Exception as exc:                        # collect every operation's failure
            failures.append(f"{operation.method.upper()} {operation.path}: {exc}"[:3000])
    return failures


def test_control_answers_every_generated_request_within_its_schema(
        control: Control, control_schema: Any) -> None:
    failures = run_schema(control_schema, lambda path: {
        "Authorization": f"Bearer {control.token(path)}"})
    assert not failures, "\n\n".join(failures)


# What the router answers, by design, for a catalog model that cannot serve now (the
# catalog's "big" fits no device; "tiny" has no engine running here): a 503 naming why.
REFUSALS = frozenset({"model_parked", "model_unplaceable", "model_stopped", "model_not_ready",
                      "model_failing"})


def is_refusal(status: int, body: Any) -> bool:
    """A 503 naming one of the router's refusals of a model that cannot serve now."""
    try:
        return status == 503 and body["error"]["code"] in REFUSALS
    except (KeyError, TypeError):
        return False


def not_a_server_error_but_a_refusal(ctx: Any, response: Any, case: Any) -> bool | None:
    """``not_a_server_error``, except the router's documented 503 refusals of a model that
    cannot serve now (a generated body may name a catalog model)."""
    if response.status_code == 503:
        try:
            body = response.json()
        except ValueError:
            body = None
        if is_refusal(503, body):
            return None
    return not_a_server_error(ctx, response, case)


ROUTER_CHECKS = [schemathesis.check(not_a_server_error_but_a_refusal),
                 response_schema_conformance, status_code_conformance, unsupported_method]


def test_router_answers_every_generated_request_within_its_schema(router_schema: Any) -> None:
    failures = run_schema(router_schema, lambda path: {}, ROUTER_CHECKS)
    assert not failures, "\n\n".join(failures)


def test_a_refusal_of_a_catalog_model_is_accepted_and_any_other_5xx_is_not(
        router: Any, control: Control) -> None:
    # The generated requests before may have applied another catalog (``?prune=true`` with
    # no models): "big" is put back, and waited for in the router's next table.
    assert control.app.test_client().put("/api/v1/catalog", data=CATALOG, headers={
        "Authorization": f"Bearer {ADMIN}"}).status_code == 200
    client = router.test_client()
    deadline = time.monotonic() + 10
    while "big" not in {m["id"] for m in client.get("/v1/models").get_json()["data"]} \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    refused = client.post("/v1/responses", json={"model": "big", "stream": None})
    assert refused.status_code == 503
    assert is_refusal(refused.status_code, refused.get_json())
    assert not is_refusal(503, {"error": {"code": "internal_error"}})
    assert not is_refusal(500, refused.get_json())
    assert not is_refusal(503, ["not", "an", "error"])
