"""A store that stops answering (issue 28): the control service answers 503 with
Retry-After within its bound (LLMGW_STORE_WAIT_S, about twice it at most) instead of
holding the request past its client's timeout, for reads and writes alike, and serves
again once the store answers. The store is the suite's real PostgreSQL, paused with
SIGSTOP (its postmaster and every backend: a server that does not run at all, as a lost
node looks before its keepalives tell)."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import requests

from llmgw_runtime.control.app import create_app
from llmgw_runtime.control.bootstrap import bootstrap
from llmgw_runtime.control.config import ControlConfig
from llmgw_runtime.store import Store
from tests.support.postgres import PostgresServer

from .conftest import ADMIN, JOIN, ROUTER, served

WAIT_S = 1.5


def _server_pids(pg: PostgresServer) -> list[int]:
    """The postmaster and its children (every backend and helper)."""
    postmaster = int((pg.data / "postmaster.pid").read_text().split()[0])
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == postmaster:
            children.append(int(stat.parent.name))
    return [postmaster, *children]


@contextmanager
def paused(pg: PostgresServer) -> Iterator[None]:
    pids = _server_pids(pg)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


def test_a_store_that_stops_answering_is_a_503_with_retry_after_within_the_bound(
        postgres: PostgresServer, tmp_path: Path) -> None:
    store = Store(postgres.create_database(f"t_{uuid.uuid4().hex[:10]}"))
    store.migrate()
    config = ControlConfig(state_dir=tmp_path, admin_token=ADMIN, join_token=JOIN,
                           router_token=ROUTER, store_wait_s=WAIT_S)
    bootstrap(store, config)
    admin = {"Authorization": f"Bearer {ADMIN}"}
    router = {"Authorization": f"Bearer {ROUTER}"}
    idle = {"replicas": {}, "router": "rt-pause", "keys_optional": False}
    try:
        with served(create_app(config, store_=store)) as url:
            assert requests.get(url + "/api/v1/models", headers=admin, timeout=10).ok
            with paused(postgres):
                for method, path, headers, body in (
                        ("GET", "/api/v1/models", admin, None),        # a read
                        ("POST", "/api/v1/idle", router, idle),        # a retried write
                        ("POST", "/api/v1/keys", admin, {"name": "k"}),
                        ("GET", "/healthz", {}, None)):
                    began = time.monotonic()
                    resp = requests.request(method, url + path, headers=headers, json=body,
                                            timeout=30)
                    took = time.monotonic() - began
                    assert resp.status_code == 503, (path, resp.text)
                    assert resp.headers["Retry-After"] == "5", path
                    assert took < 2 * WAIT_S + 1.5, (path, took)
                    if path != "/healthz":
                        error = resp.json()["error"]
                        assert error["reason"] == "store_unavailable"
                        assert "Retry-After" in " ".join(error["details"])
                        if path == "/api/v1/models":    # its pooled connection's wait
                            assert f"did not answer within {WAIT_S:g} s" in error["message"]
            deadline = time.monotonic() + 15
            while not requests.get(url + "/api/v1/models", headers=admin, timeout=10).ok:
                assert time.monotonic() < deadline, "the store's return was not noticed"
                time.sleep(0.2)
            made = requests.post(url + "/api/v1/keys", headers=admin, json={"name": "k"},
                                 timeout=10)
            assert made.status_code == 201, made.text
    finally:
        store.dispose()
