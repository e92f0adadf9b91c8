from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import event
from werkzeug.serving import make_server

from llmgw_runtime.control.app import create_app
from llmgw_runtime.control.bootstrap import bootstrap
from llmgw_runtime.control.config import ControlConfig
from llmgw_runtime.control.reconcile import Reconciler
from llmgw_runtime.store import Store

ADMIN, JOIN, ROUTER = ("llmgw-admin-test-0123456789abcdef", "llmgw-join-test-0123456789abcdef",
                       "llmgw-router-test-0123456789abcdef")
CPU = {"id": 0, "uuid": "cpu-host", "card": 0, "mig": None, "class": "cpu",
       "memory_total_mb": 16000, "memory_used_mb": 1000, "healthy": True, "reason": None}


class Api:
    def __init__(self, client: FlaskClient, store: Store, config: ControlConfig) -> None:
        self.client, self.store, self.config = client, store, config
        self.reconciler = Reconciler(store, config, holder="test")

    def call(self, method: str, path: str, token: str | None = ADMIN, **kw: Any) -> Any:
        headers = kw.pop("headers", {})
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return self.client.open(path, method=method, headers=headers, **kw)

    def join(self, node: str = "n1") -> str:
        resp = self.call("POST", "/api/v1/agent/join", JOIN, json={"node": node})
        assert resp.status_code == 200, resp.json
        return str(resp.json["credential"])

    def report(self, cred: str, node: str = "n1", replicas: list[Any] | None = None,
               devices: list[Any] | None = None, **extra: Any) -> Any:
        return self.call("POST", "/api/v1/agent/report", cred, json={
            "node": node, "address": "127.0.0.1", "agent_version": "t",
            "devices": [CPU] if devices is None else devices, "engines": ["llama.cpp"],
            "weights": {}, "replicas": replicas or [], **extra})


@pytest.fixture
def api(store: Store, tmp_path: Path) -> Iterator[Api]:
    config = ControlConfig(state_dir=tmp_path, admin_token=ADMIN, join_token=JOIN,
                           router_token=ROUTER, start_timeout_s=60)
    bootstrap(store, config)
    app = create_app(config, store_=store)
    yield Api(app.test_client(), store, config)


@contextlib.contextmanager
def statements(store: Any, containing: str = "") -> Iterator[list[str]]:
    """The SQL statements this process sends ``store`` meanwhile (those containing
    ``containing``, when given)."""
    seen: list[str] = []

    def note(conn: Any, cursor: Any, sql: str, *args: Any) -> None:
        if containing in sql:
            seen.append(sql)

    event.listen(store.engine, "before_cursor_execute", note)
    try:
        yield seen
    finally:
        event.remove(store.engine, "before_cursor_execute", note)


@contextlib.contextmanager
def served(app: Flask) -> Iterator[str]:
    """``app`` on a loopback port in a thread (real HTTP, for ``ctl`` and a router);
    yields its URL."""
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        server.shutdown()
        thread.join(5)
