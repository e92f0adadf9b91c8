"""The replicated store's etcd voters: each healthy by etcd's own ``/health``, a voter
that never ran shown as such, in ``ctl status``, the console's data and ``/metrics``.
Against a real etcd cluster on loopback (three voters, one never started)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from llmgw_runtime.control.app import create_app
from llmgw_runtime.control.bootstrap import bootstrap
from llmgw_runtime.control.config import ControlConfig
from llmgw_runtime.status import render
from llmgw_runtime.store import Store
from llmgw_runtime.store.members import StoreHealth, etcd_urls, etcd_voters
from tests.support.patroni_cluster import ETCD
from tests.support.procs import free_port, wait_until

ID = {"a": "1111", "b": "2222", "c": "3333"}


def listed(*started: str) -> dict[str, Any]:
    """etcd 3.4's member list: every voter of the initial cluster; those that ran have
    published their client URLs."""
    return {"header": {}, "members": [
        {"ID": ID[n], "name": n, "peerURLs": [f"http://10.0.0.{i}:2380"],
         **({"clientURLs": [f"http://10.0.0.{i}:2379"]} if n in started else {})}
        for i, n in enumerate("abc", 1)]}


def test_each_voter_is_judged_by_its_own_health_and_a_voter_that_never_ran_is_named() -> None:
    urls = ["http://10.0.0.1:2379", "http://10.0.0.2:2379", "http://127.0.0.1:2379"]
    rows = etcd_voters(
        {urls[0]: listed("a", "b"), urls[2]: "connection refused"},
        {urls[0]: {"header": {"member_id": ID["a"]}}},
        {urls[0]: {"health": "true"}, urls[1]: {"health": "false", "reason": "no leader"}},
        urls)
    assert [(r["name"], r["healthy"]) for r in rows] == [("a", True), ("b", False),
                                                         ("c", False)]
    assert rows[1]["problem"] == "unhealthy: no leader"
    assert rows[2]["problem"].startswith("never started") and rows[2]["client_urls"] == []
    # No member list anywhere: each configured URL stands for a voter, none healthy.
    alone = etcd_voters({u: "connection refused" for u in urls}, {}, {}, urls)
    assert [r["healthy"] for r in alone] == [False, False, False]
    assert "connection refused" in alone[0]["problem"]
    assert etcd_urls(" http://a:2379/, ,http://b:2379") == ["http://a:2379", "http://b:2379"]


@pytest.fixture(scope="module")
def two_of_three(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    """An etcd cluster of three voters on 127.0.0.1 where the third never starts (as a
    witness on a control host without systemd): two make a quorum."""
    if not Path(ETCD).exists():
        pytest.skip("etcd is not installed (make system-deps)")
    root = tmp_path_factory.mktemp("etcd")
    ports = [(free_port(), free_port()) for _ in range(3)]
    initial = ",".join(f"v{i}=http://127.0.0.1:{p}" for i, (_, p) in enumerate(ports))
    procs = []
    for i, (client, peer) in enumerate(ports[:2]):
        log = open(root / f"v{i}.log", "ab")  # noqa: SIM115 - the child owns it
        procs.append(subprocess.Popen(
            [ETCD, "--name", f"v{i}", "--data-dir", str(root / f"v{i}"),
             "--listen-client-urls", f"http://127.0.0.1:{client}",
             "--advertise-client-urls", f"http://127.0.0.1:{client}",
             "--listen-peer-urls", f"http://127.0.0.1:{peer}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
             "--initial-cluster", initial, "--initial-cluster-state", "new",
             "--initial-cluster-token", "llmgw-test", "--listen-metrics-urls", ""],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True))
        log.close()
    urls = [f"http://127.0.0.1:{c}" for c, _ in ports]
    try:
        health = StoreHealth([], ttl_s=0, etcd=urls[:2])
        wait_until(lambda: all(v["healthy"] for v in health.voters() or [{"healthy": 0}]
                               if v["client_urls"]), 30, "two healthy etcd voters")
        yield urls
    finally:
        for proc in procs:       # a voter of a cluster missing one waits to hand over
            proc.kill()          # leadership on SIGTERM; these hold only test data
        for proc in procs:
            proc.wait(10)


def test_a_voter_that_never_ran_shows_in_status_and_metrics(two_of_three: list[str],
                                                            tmp_path: Path) -> None:
    voters = StoreHealth([], ttl_s=0, etcd=two_of_three).voters()
    assert voters is not None
    assert [(v["name"], v["healthy"]) for v in voters] == [("v0", True), ("v1", True),
                                                           ("v2", False)]
    assert voters[2]["problem"].startswith("never started")

    # ctl status: the store part of the summary, as the status API serves it and the
    # schema says, rendered for the terminal.
    admin = "llmgw-admin-" + "t" * 40
    config = ControlConfig(state_dir=tmp_path, etcd_urls=",".join(two_of_three),
                           admin_token=admin)
    store = Store(f"sqlite:///{tmp_path}/llmgw.db")
    store.migrate()
    bootstrap(store, config)
    app = create_app(config, store_=store)
    with app.test_request_context():
        from llmgw_runtime.control.web import store_health

        part = store_health()
    assert [v["name"] for v in part["voters"]] == ["v0", "v1", "v2"]
    schema = json.loads((Path(render.__file__).parent / "status.schema.json").read_text())
    jsonschema.validate(part, schema["properties"]["store"])
    screen = render.store({"store": part}, 120, render.painter(False))
    assert screen[0] == "etcd: 3 voters, 1 UNHEALTHY"
    assert any(line.split()[:2] == ["v2", "UNHEALTHY"] and "never started" in line
               for line in screen), screen

    # The console's summary page: an etcd table.
    client = app.test_client()
    assert client.post("/console/login", data={"token": admin}).status_code in (200, 302, 303)
    html = client.get("/console/").get_data(as_text=True)
    table = html.split('id="etcd"')[1].split("</table>")[0]
    assert "v2" in table and "unhealthy" in table and "never started" in table
    assert "etcd: 3 voters" in html and "1 unhealthy" in html

    # /metrics: one gauge per voter.
    text = app.test_client().get("/metrics").get_data(as_text=True)
    assert 'llmgw_store_etcd_member_healthy{member="v0"} 1.0' in text
    assert 'llmgw_store_etcd_member_healthy{member="v2"} 0.0' in text
    store.dispose()
