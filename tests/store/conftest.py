"""The replicated store for the failover tests: a real Patroni + etcd cluster on loopback,
started once per session (10-20 s) and checked to leave no process behind."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from tests.support.patroni_cluster import PatroniCluster, missing_tools


@pytest.fixture(scope="session")
def patroni_cluster() -> Iterator[PatroniCluster]:
    why = missing_tools()
    if why:
        pytest.skip(why)
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
