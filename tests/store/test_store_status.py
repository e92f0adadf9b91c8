"""The replicated store's members as the operator sees them, against a real Patroni +
etcd cluster on loopback: ctl status lists each member's role, state and lag, a stopped
member shows as MISSING, /metrics says so, and the JSON says which member leads."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import requests
from click.testing import CliRunner

from llmgw_runtime.cli.ctl import ctl
from tests.integration.conftest import Cluster
from tests.support.patroni_cluster import PatroniCluster
from tests.support.procs import wait_until

pytestmark = pytest.mark.slow


def status(control: Cluster, *args: str) -> str:
    result = CliRunner().invoke(ctl, ["--url", control.control_url, "--token",
                                      control.admin_token, "status", *args])
    assert result.exit_code == 0, result.output
    return result.output


def metric(control: Cluster, name: str, member: str) -> float | None:
    text = requests.get(control.control_url + "/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith(f'{name}{{member="{member}"}} '):
            return float(line.split()[-1])
    return None


def test_ctl_status_and_metrics_show_each_member_and_a_stopped_one_as_missing(
        healthy_cluster: PatroniCluster, tmp_path: Path) -> None:
    urls = ",".join(m.rest("") for m in healthy_cluster.nodes.values())
    control = Cluster(healthy_cluster.url(), tmp_path)
    control.start_control(env={"LLMGW_PATRONI_URLS": urls})
    try:
        leader = healthy_cluster.leader()
        members = json.loads(status(control, "-o", "json"))["store"]["members"]
        assert {m["name"]: m["role"] for m in members}[leader] == "leader"
        assert sorted(m["name"] for m in members) == sorted(healthy_cluster.nodes)
        assert not any(m["missing"] for m in members)
        assert any(m["role"] == "sync_standby" and isinstance(m["lag_bytes"], int)
                   for m in members)
        text = status(control)
        assert f"store: postgresql, {len(members)} members" in text
        assert "NO LEADER" not in text and "MISSING" not in text
        assert metric(control, "llmgw_store_member_leader", leader) == 1.0

        standby = next(n for n in healthy_cluster.nodes if n != leader)
        healthy_cluster.stop_member(standby)             # SIGTERM: Patroni and PostgreSQL
        time.sleep(5.5)                                  # past the 5 s cache
        wait_until(lambda: "MISSING" in status(control), 20, f"{standby} shown missing")
        row = next(line for line in status(control).splitlines()
                   if line.strip().startswith(standby))
        assert "MISSING" in row and "does not answer" in row
        assert metric(control, "llmgw_store_member_up", standby) == 0.0
        assert metric(control, "llmgw_store_member_up", leader) == 1.0
    finally:
        control.stop()
