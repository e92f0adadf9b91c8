"""``llmgw server init --patroni`` end to end against a real two-member Patroni + etcd
cluster on loopback (synchronous replication), the playbook stood in by
tests/fixtures/server_init (Molecule runs the real one): the copy, a re-run, refusals and
failures that leave the store in use unchanged, the control service stopped and started."""

from __future__ import annotations

import json
import re
import socket
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg2
import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from llmgw_runtime.cli.main import cli
from llmgw_runtime.errors import LlmgwError
from llmgw_runtime.store import Store, repo
from llmgw_runtime.store.schema import metadata
from llmgw_runtime.storeops import patroni
from llmgw_runtime.storeops.init import current_store, run_init
from llmgw_runtime.storeops.switch import (
    ServiceControl,
    parse_env,
)
from tests.storeops.test_move import populate
from tests.support.patroni_cluster import PatroniCluster
from tests.support.procs import free_port, wait_until

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "server_init"

# ---------------------------------------------------------------- the command end to end


class ClusterStore:
    """The session's real Patroni cluster (tests/support/patroni_cluster.py) as the target
    of ``server init``: its REST API, its PostgreSQL hosts, a fresh database per test."""

    def __init__(self, cluster: PatroniCluster) -> None:
        self.cluster = cluster

    @property
    def rest_port(self) -> int:
        return self.cluster.nodes[self.cluster.leader() or "pg0"].rest_port

    def database(self) -> str:
        """A new database owned by llmgw, made on the primary."""
        name = f"init_{uuid.uuid4().hex[:8]}"
        leader = self.cluster.leader()
        assert leader, "the cluster has no leader"
        conn = psycopg2.connect(self.cluster.superuser_dsn(leader))
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE {name} OWNER llmgw")
        conn.close()
        wait_until(lambda: all(self._has(member, name) for member in self.cluster.nodes),
                   20, f"database {name} on every member")
        return name

    def _has(self, member: str, database: str) -> bool:
        """libpq tries the hosts in order: a standby that has not replayed the CREATE
        DATABASE yet refuses the connection before the primary is tried."""
        conn = psycopg2.connect(self.cluster.superuser_dsn(member))
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,))
                return cur.fetchone() is not None
        finally:
            conn.close()

    def url(self, database: str) -> str:
        return self.cluster.url(database)

    def passwords(self) -> dict[str, str]:
        """What the playbook would have set: the llmgw role's password is the cluster's."""
        return {"llmgw_store_password": self.cluster.password,
                "llmgw_store_superuser_password": "s" * 24,
                "llmgw_store_replication_password": "r" * 24}


@pytest.fixture(scope="module")
def two_member_cluster() -> Iterator[PatroniCluster]:
    """The shape `server init` makes: two PostgreSQL + Patroni members (the third etcd vote
    is the control host's)."""
    cluster = PatroniCluster(2).start()
    try:
        yield cluster
    finally:
        cluster.stop()
        assert not cluster.pids(), f"the Patroni cluster left processes: {cluster.pids()}"


@pytest.fixture
def cluster_store(two_member_cluster: PatroniCluster) -> ClusterStore:
    two_member_cluster.wait_healthy(60)
    return ClusterStore(two_member_cluster)


@pytest.fixture
def site(tmp_path: Path) -> dict[str, Any]:
    """A control host as the llmgw_control role leaves it: an env file, a SQLite store."""
    state = tmp_path / "state"
    store = Store(f"sqlite:///{state}/llmgw.db")
    store.migrate()
    populate(store)
    store.dispose()
    env = tmp_path / "etc" / "control.env"
    env.parent.mkdir()
    text = (f"# Ansible managed\nLLMGW_HOST=0.0.0.0\nLLMGW_STATE_DIR={state}\n"
            f"LLMGW_DATABASE_URL=sqlite:///{state}/llmgw.db\nLLMGW_ADMIN_TOKEN=admintok\n")
    env.write_text(text)
    env.chmod(0o640)
    return {"state": state, "env": env, "db": state / "llmgw.db", "env_text": text}


def init(site: dict[str, Any], target: ClusterStore, database: str,
         url_hosts: str | None = None, playbooks: Path = FIXTURES,
         hosts: tuple[str, ...] = ("me@127.0.0.1", "me@localhost")) -> tuple[int, str]:
    pw_file = site["state"] / patroni.PASSWORDS_FILE
    if not pw_file.exists():           # as a first run that installed this cluster left it
        pw_file.write_text(json.dumps(target.passwords()))
    args = ["server", "init", "--patroni", *hosts, "--playbooks", str(playbooks),
            "--env-file", str(site["env"]), "--patroni-rest-port", str(target.rest_port),
            "--store-database", database, "--wait", "10",
            "--connection", "local", "--store-url-hosts", url_hosts or target.cluster.hosts()]
    result = CliRunner().invoke(cli, args, env={"LLMGW_DATABASE_URL": None,
                                                "LLMGW_STATE_DIR": None})
    return result.exit_code, result.output


def pg_counts(target: ClusterStore, database: str) -> dict[str, int]:
    store = Store(target.url(database))
    try:
        with store.begin() as conn:
            return {t.name: conn.execute(sa.select(sa.func.count()).select_from(t))
                    .scalar_one() for t in metadata.sorted_tables}
    finally:
        store.dispose()


def test_init_moves_the_store_into_the_cluster_and_a_rerun_changes_nothing(
        site: dict[str, Any], cluster_store: ClusterStore) -> None:
    database = cluster_store.database()
    code, out = init(site, cluster_store, database)
    assert code == 0, out
    passwords = json.loads((site["state"] / patroni.PASSWORDS_FILE).read_text())
    assert not any(p in out for p in passwords.values())
    assert f"inventory: 127.0.0.1, localhost in llmgw_store, {socket.gethostname()} in " \
           "llmgw_store_witness (3 etcd voters)" in out
    assert re.search(r"Patroni cluster up: .*pg\d leader running", out), out
    assert "[1/2] Check the store variables are given  127.0.0.1 ok, localhost ok, " in out
    assert "playbook done: 2 steps, nothing changed" in out
    assert "the cluster database is empty" in out and "rows, the same on both sides" in out
    backups = sorted(site["state"].glob("llmgw.db.before-patroni-*"))
    assert len(backups) == 1 and f"backup of the store in use: {backups[0]}" in out
    with sqlite3.connect(backups[0]) as conn:
        assert conn.execute("SELECT count(*) FROM models").fetchone() == (2,)
    old = Store(f"sqlite:///{site['db']}")
    with old.begin() as conn:
        sqlite_counts = {t.name: conn.execute(sa.select(sa.func.count()).select_from(t))
                         .scalar_one() for t in metadata.sorted_tables}
        old_models = [repo.model_to_dict(r) for r in repo.list_models(conn)]
    old.dispose()
    assert pg_counts(cluster_store, database) == sqlite_counts
    env_text = site["env"].read_text()
    store_env = site["env"].with_name("store.env")
    stored = parse_env(store_env.read_text())
    url = stored["LLMGW_DATABASE_URL"]
    assert url == (f"postgresql://llmgw:{passwords['llmgw_store_password']}@"
                   f"{cluster_store.cluster.hosts()}/{database}"
                   "?target_session_attrs=read-write&connect_timeout=3")
    # The role's env file is not touched: the URL has one owner, store.env (docs/store.md).
    assert env_text == site["env_text"] and oct(site["env"].stat().st_mode & 0o777) == "0o640"
    assert oct(store_env.stat().st_mode & 0o777) == "0o600"
    assert stored["LLMGW_PATRONI_URLS"] == f"http://127.0.0.1:{cluster_store.rest_port}," \
                                           f"http://localhost:{cluster_store.rest_port}"
    assert stored["LLMGW_ETCD_URLS"].endswith(",http://127.0.0.1:2379")
    assert f"{store_env}: LLMGW_DATABASE_URL now points at the cluster" in out
    assert "now restart the control service" in out
    new = Store(url)
    with new.begin() as conn:
        assert [repo.model_to_dict(r) for r in repo.list_models(conn)] == old_models
    new.dispose()

    code, again = init(site, cluster_store, database)
    assert code == 0, again
    assert "store already in the cluster" in again and "nothing copied" in again
    assert "playbook done: 2 steps, nothing changed" in again
    assert site["env"].read_text() == env_text
    assert parse_env(store_env.read_text()) == stored
    assert f"nothing to do: {store_env} holds the cluster URL" in again
    assert sorted(site["state"].glob("llmgw.db.before-patroni-*")) == backups
    assert not any(p in again for p in passwords.values())

    # An init by an older llmgw left the URL in the role's env file and no store.env: a
    # re-run moves it to store.env, so the role's next run keeps the cluster.
    store_env.unlink()
    site["env"].write_text(env_text.replace(f"sqlite:///{site['state']}/llmgw.db", url))
    code, upgraded = init(site, cluster_store, database)
    assert code == 0, upgraded
    assert "store already in the cluster" in upgraded
    assert parse_env(store_env.read_text())["LLMGW_DATABASE_URL"] == url


def test_a_cluster_holding_other_rows_is_refused_and_the_env_file_is_untouched(
        site: dict[str, Any], cluster_store: ClusterStore) -> None:
    database = cluster_store.database()
    other = Store(cluster_store.url(database))
    other.migrate()
    with other.begin() as conn:
        repo.add_event(conn, 1.0, "other", "x", "someone else's")
    other.dispose()
    before = site["env"].read_bytes()
    code, out = init(site, cluster_store, database)
    assert code == 1
    assert "already holds other rows" in out and "events: 3 row(s) here, 1 in the cluster" in out
    assert "The control service still uses the old store (sqlite:///" in out
    assert "Empty the cluster database or find out who wrote to it" in out
    assert "re-run `llmgw server init --patroni me@127.0.0.1 me@localhost --playbooks " in out
    assert f"--env-file {site['env']} " in out          # every option given, repeated
    assert site["env"].read_bytes() == before
    assert not site["env"].with_name("store.env").exists()
    assert pg_counts(cluster_store, database)["events"] == 1


def test_an_unreachable_cluster_stops_before_anything_moves(
        site: dict[str, Any], cluster_store: ClusterStore) -> None:
    before = site["env"].read_bytes()
    code, out = init(site, cluster_store, "llmgw", url_hosts=f"127.0.0.1:{free_port()}")
    assert code == 1
    assert "cannot be reached" in out and "postgresql://llmgw:***@127.0.0.1:" in out
    assert "nothing was moved: the store in use is unchanged" in out
    assert site["env"].read_bytes() == before
    assert not site["env"].with_name("store.env").exists()
    assert not list(site["state"].glob("llmgw.db.before-patroni-*"))


def test_a_failing_playbook_names_host_task_and_message_and_moves_nothing(
        site: dict[str, Any], cluster_store: ClusterStore) -> None:
    before = site["env"].read_bytes()
    code, out = init(site, cluster_store, "llmgw", playbooks=FIXTURES / "failing")
    assert code == 1
    assert "[1/1] Install PostgreSQL 15  127.0.0.1 FAILED, localhost skipped" in out
    assert "127.0.0.1: step 'Install PostgreSQL 15' failed: No package matching " \
           "'postgresql-15' is available" in out
    assert "Nothing was moved: the store in use is unchanged" in out
    assert site["env"].read_bytes() == before
    assert not site["env"].with_name("store.env").exists()
    assert not list(site["state"].glob("llmgw.db.before-patroni-*"))


# ---------------------------------------------------------------- the control service


class RecordingService(ServiceControl):
    """A control service that is active; records what init asks of it."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def is_active(self) -> bool:
        return True

    def stop(self) -> None:
        self.calls.append("stop")

    def start(self) -> None:
        self.calls.append("start")


def test_an_active_service_is_stopped_for_the_copy_and_started_again_either_way(
        site: dict[str, Any], cluster_store: ClusterStore) -> None:
    database = cluster_store.database()
    (site["state"] / patroni.PASSWORDS_FILE).write_text(json.dumps(cluster_store.passwords()))
    other = Store(cluster_store.url(database))
    other.migrate()
    with other.begin() as conn:
        repo.add_event(conn, 1.0, "other", "x", "someone else's")
    svc = RecordingService()
    env_before = site["env"].read_bytes()
    args: dict[str, Any] = dict(
        current=current_store(None, None, parse_env(site["env"].read_text()), Path("x")),
        env_path=site["env"], playbooks=FIXTURES, connection="local",
        settings=patroni.StoreSettings(database=database, rest_port=cluster_store.rest_port),
        url_hosts=cluster_store.cluster.hosts(), wait_s=10.0, svc=svc,
        echo=lambda _: None, step=lambda _: None)
    with pytest.raises(LlmgwError) as err:
        run_init(("me@127.0.0.1", "me@localhost"), **args)
    assert "llmgw-control was started again on it" in str(err.value)
    assert svc.calls == ["stop", "start"] and site["env"].read_bytes() == env_before

    with other.begin() as conn:        # the operator emptied the cluster database
        conn.execute(sa.text("DELETE FROM events"))
    other.dispose()
    svc.calls.clear()
    run_init(("me@127.0.0.1", "me@localhost"), **args)
    assert svc.calls == ["stop", "start"]
    assert site["env"].read_bytes() == env_before
    assert parse_env(site["env"].with_name("store.env").read_text())[
        "LLMGW_DATABASE_URL"].startswith("postgresql://")
