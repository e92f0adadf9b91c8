"""Shared fixtures: a real PostgreSQL server for the session, every store test run on both
backends (SQLite and PostgreSQL), and a real Patroni + etcd cluster on loopback (started
once per session, only when a test asks for it: 10-20 s)."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw_runtime.store import Store
from tests.support.llama_cpp import built_bin_dir
from tests.support.patroni_cluster import PatroniCluster, missing_tools
from tests.support.postgres import PostgresServer

# `ctl`'s tables fit the terminal (COLUMNS first, else 100 columns off a terminal); the
# tests that read them expect a non-terminal's width unless they set COLUMNS themselves,
# and pytest-xdist's workers (make test runs two) export COLUMNS=80.
os.environ.pop("COLUMNS", None)
os.environ.pop("LINES", None)


@pytest.fixture(scope="session")
def llama_cpp_bin() -> Path:
    """llama.cpp's llama-server and ggml-rpc-server, built once per machine by
    `make llama-cpp` (tests/support/llama_cpp.py)."""
    return built_bin_dir()


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    server = PostgresServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path_factory.mktemp('store')}/llmgw.db"
    server: PostgresServer = request.getfixturevalue("postgres")
    return server.create_database(f"t_{uuid.uuid4().hex[:10]}")


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    s = Store(store_url)
    s.migrate()
    yield s
    s.dispose()


@pytest.fixture(scope="session")
def patroni_cluster() -> Iterator[PatroniCluster]:
    why = missing_tools()
    if why:
        pytest.fail(why)
    cluster = PatroniCluster(3).start()
    try:
        yield cluster
    finally:
        root = str(cluster.root)
        cluster.stop()
        left = subprocess.run(["pgrep", "-f", root], capture_output=True, text=True).stdout
        assert not cluster.pids() and not left.strip(), \
            f"the Patroni cluster left processes behind: {cluster.pids()} {left}"


@pytest.fixture
def healthy_cluster(patroni_cluster: PatroniCluster) -> PatroniCluster:
    """The session's cluster, healed from whatever the previous test did to it."""
    for name, member in patroni_cluster.nodes.items():
        if member.proc is None or member.proc.poll() is not None:
            patroni_cluster.start_member(name)
    patroni_cluster.wait_healthy(90)
    return patroni_cluster
