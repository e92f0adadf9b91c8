"""The store through a real failover: 3 etcd + 3 Patroni/PostgreSQL members on loopback
(tests/support/patroni_cluster.py), synchronous replication. kill -9 the primary's
postmaster; writes resume on the new primary and no acknowledged write is lost."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import requests
import sqlalchemy as sa

from llmgw_runtime.store import NotAcknowledged, Store
from tests.integration.conftest import Cluster
from tests.support.patroni_cluster import PatroniCluster
from tests.support.store_probe import TABLE, WriteProbe, create_table

pytestmark = pytest.mark.slow

RESUME_BOUND_S = 60      # generous: the targets (PostgreSQL killed < 5 s) are in the bench


def test_store_writes_resume_after_the_primarys_postgres_is_killed_losing_nothing(
        healthy_cluster: PatroniCluster) -> None:
    store = Store(healthy_cluster.url())
    probe = WriteProbe(store, run="store-kill").start()
    try:
        time.sleep(1.0)
        old = healthy_cluster.leader()
        assert old is not None
        killed_at = time.monotonic()
        healthy_cluster.kill_postgres(old)
        resumed = probe.wait_acked_after(killed_at, timeout=RESUME_BOUND_S)
        time.sleep(0.5)
    finally:
        probe.stop()
    print(f"\nstore writes resumed {resumed - killed_at:.1f} s after kill -9 of {old}'s "
          f"postmaster (longest pause {probe.longest_pause(killed_at):.1f} s); "
          f"{len(probe.acked)} rows acknowledged")
    assert probe.errors == [], "a write failed through its retries: " + probe.errors[0][1]
    assert healthy_cluster.leader() not in (None, old)
    fresh = Store(healthy_cluster.url())          # read after the failover, new connections
    try:
        assert probe.lost(fresh) == []
    finally:
        fresh.dispose()
    # The same Store keeps working: its pool was emptied of connections to the old primary.
    with store.begin() as conn:
        assert store.now(conn) > 0
    store.dispose()
    assert resumed - killed_at < RESUME_BOUND_S


def test_a_commit_the_sync_standby_never_confirms_is_not_acknowledged(
        healthy_cluster: PatroniCluster) -> None:
    """The sync standby hangs (SIGSTOP): COMMIT waits for it, the store cancels the wait
    after commit_timeout_s, PostgreSQL says "committed locally, but might not have been
    replicated", and the write is refused; once the standby is back it is acknowledged."""
    sync = healthy_cluster.sync_standby()
    assert sync is not None
    store = Store(healthy_cluster.url(), commit_timeout_s=1.5)
    create_table(store)
    insert = sa.text(f"INSERT INTO {TABLE} (run, n) VALUES ('hung-standby', :n)")
    healthy_cluster.freeze_postgres(sync)
    try:
        started = time.monotonic()
        with pytest.raises(NotAcknowledged) as info:
            with store.begin() as conn:
                conn.execute(insert, {"n": 1})
        waited = time.monotonic() - started
    finally:
        healthy_cluster.thaw_postgres(sync)
    assert "might not have been replicated" in str(info.value), str(info.value)
    assert 1.4 < waited < 10, waited
    with store.begin() as conn:
        conn.execute(insert, {"n": 2})
    store.dispose()


class _Loop(threading.Thread):
    def __init__(self, step: Any) -> None:
        super().__init__(daemon=True)
        self.step = step
        self.halt = threading.Event()

    def run(self) -> None:
        i = 0
        while not self.halt.is_set():
            i += 1
            self.step(i)
            self.halt.wait(0.05)


def test_the_control_service_keeps_writing_through_a_failover(
        healthy_cluster: PatroniCluster, tmp_path: Path) -> None:
    control = Cluster(healthy_cluster.url(), tmp_path)
    control.start_control()
    base = control.control_url + "/api/v1"
    admin = {"Authorization": f"Bearer {control.admin_token}"}
    acked: list[tuple[str, float, float]] = []      # (model, started, acknowledged)
    refused: list[tuple[int, str]] = []
    reports: list[tuple[float, int]] = []

    def put_catalog(i: int) -> None:
        name = f"w-{i}"
        body = (f"models:\n  - {{name: {name}, source: /m/{name}.gguf, engine: llama.cpp, "
                "profile: {class: cpu}, on_demand: true}\n")
        started = time.monotonic()
        resp = requests.put(base + "/catalog", data=body, timeout=60,
                            headers={**admin, "Content-Type": "application/yaml"})
        if resp.status_code == 200:
            acked.append((name, started, time.monotonic()))
        else:
            refused.append((resp.status_code, resp.text))

    agents = []
    for n in range(2):
        node = f"sim-{n}"
        joined = requests.post(base + "/agent/join", json={"node": node}, timeout=10,
                               headers={"Authorization": f"Bearer {control.join_token}"})
        assert joined.status_code == 200, joined.text
        auth = {"Authorization": f"Bearer {joined.json()['credential']}"}

        def report(_: int, node: str = node, auth: dict[str, str] = auth) -> None:
            resp = requests.post(base + "/agent/report", headers=auth, timeout=60,
                                 json={"node": node, "devices": [], "replicas": []})
            reports.append((time.monotonic(), resp.status_code))
        agents.append(_Loop(report))
    writer = _Loop(put_catalog)
    try:
        for loop in (writer, *agents):
            loop.start()
        time.sleep(1.5)
        old = healthy_cluster.leader()
        assert old is not None and acked, control.logs()
        killed_at = time.monotonic()
        healthy_cluster.kill_postgres(old)
        deadline = killed_at + RESUME_BOUND_S
        while not [a for _, began, a in acked if began > killed_at]:
            assert time.monotonic() < deadline, f"no catalog write acknowledged within " \
                f"{RESUME_BOUND_S} s of the failover; refused: {refused[-3:]}\n" \
                + control.logs()
            time.sleep(0.05)
        resumed = min(a for _, began, a in acked if began > killed_at)
        time.sleep(1.0)
    finally:
        for loop in (writer, *agents):
            loop.halt.set()
        for loop in (writer, *agents):
            loop.join(60)
    try:
        print(f"\ncontrol service writes resumed {resumed - killed_at:.1f} s after kill -9 "
              f"of {old}'s postmaster; {len(acked)} catalog writes acknowledged, "
              f"{len(refused)} refused, {len(reports)} agent reports")
        # Refusals while the store was down are the clear 503, nothing else.
        assert all(code == 503 and "store_unavailable" in text for code, text in refused), \
            refused[:3]
        assert any(code == 200 and at > resumed for at, code in reports), "agents resumed"
        models = requests.get(base + "/models", headers=admin, timeout=30).json()["models"]
        have = {m["name"] for m in models}
        lost = [name for name, _, _ in acked if name not in have]
        assert lost == [], f"acknowledged catalog writes lost in the failover: {lost}"
        assert resumed - killed_at < RESUME_BOUND_S
    finally:
        control.stop()
