"""The replicated store's members from Patroni's REST API: role, state, lag, and a member
that stopped or stopped answering shown as missing. Shapes are Patroni 3.0.2's answers,
captured from the loopback cluster (tests/support/patroni_cluster.py)."""

from __future__ import annotations

from typing import Any

import pytest

from llmgw_runtime.store.members import (
    StoreHealth,
    database_hosts,
    members_of,
    patroni_urls,
)

A, B, C = "http://10.0.0.1:8008", "http://10.0.0.2:8008", "http://10.0.0.3:8008"


def member(name: str, base: str, role: str, state: str = "running",
           lag: Any = 0) -> dict[str, Any]:
    out = {"name": name, "role": role, "state": state, "api_url": base + "/patroni",
           "host": base.split("//")[1].split(":")[0], "port": 5432, "timeline": 1}
    if role != "leader":
        out["lag"] = lag
    return out


HEALTHY = {"members": [member("db1", A, "leader"), member("db2", B, "sync_standby"),
                       member("db3", C, "replica", lag=4096)]}
PROBES_OK = {A: {"state": "running", "role": "master"}, B: {"state": "running"},
             C: {"state": "running"}}


def test_a_healthy_cluster() -> None:
    rows = members_of({A: HEALTHY, B: HEALTHY, C: HEALTHY}, PROBES_OK, [A, B, C])
    assert [(r["name"], r["role"], r["state"], r["lag_bytes"], r["missing"])
            for r in rows] == [("db1", "leader", "running", None, False),
                               ("db2", "sync_standby", "running", 0, False),
                               ("db3", "replica", "running", 4096, False)]


def test_a_member_whose_api_does_not_answer_is_missing_whatever_cluster_says() -> None:
    # kill -9: /cluster keeps the member's last state for up to ttl
    probes = dict(PROBES_OK, **{C: "[Errno 111] Connection refused"})
    rows = members_of({A: HEALTHY, B: HEALTHY, C: "[Errno 111] Connection refused"},
                      probes, [A, B, C])
    db3 = rows[2]
    assert db3["missing"] and "does not answer" in db3["problem"]
    assert not rows[0]["missing"] and not rows[1]["missing"]


def test_a_stopped_member_is_missing() -> None:
    view = {"members": [member("db1", A, "leader"),
                        member("db2", B, "replica", state="stopped", lag="unknown")]}
    rows = members_of({A: view}, {A: {"state": "running"}, B: {"state": "stopped"}}, [A, B])
    assert rows[1]["missing"] and rows[1]["problem"].startswith("stopped")
    assert rows[1]["lag_bytes"] is None


def test_a_configured_member_absent_from_every_view_is_missing_by_address() -> None:
    view = {"members": [member("db1", A, "leader"), member("db2", B, "sync_standby")]}
    rows = members_of({A: view, B: view, C: "timed out"}, PROBES_OK, [A, B, C])
    assert next(r for r in rows if r["api_url"] == C) == {"name": "10.0.0.3", "api_url": C, "role": None, "state": None,
                        "lag_bytes": None, "missing": True,
                        "problem": "its REST API does not answer: timed out"}


def test_the_view_naming_a_leader_wins_over_a_stale_one() -> None:
    stale = {"members": [member("db1", A, "replica"), member("db2", B, "replica")]}
    fresh = {"members": [member("db1", A, "replica"), member("db2", B, "leader")]}
    rows = members_of({A: stale, B: fresh}, PROBES_OK, [A, B])
    assert [r["role"] for r in rows] == ["replica", "leader"]


def test_nothing_answers_means_every_member_missing_and_no_leader() -> None:
    rows = members_of({A: "refused", B: "refused"}, {A: "refused", B: "refused"}, [A, B])
    assert all(r["missing"] for r in rows) and not any(r["role"] == "leader" for r in rows)


@pytest.mark.parametrize("url,hosts", [
    ("postgresql://llmgw:pw@db1:5432,db2:5432,db3/llmgw?target_session_attrs=read-write",
     ["db1", "db2", "db3"]),
    ("postgresql://llmgw@[fd00::1]:5432,[fd00::2]:5432/llmgw", ["fd00::1", "fd00::2"]),
    ("postgresql:///llmgw?host=db1,db2&port=5432,5432", ["db1", "db2"]),
    ("postgresql://llmgw@db1/llmgw", ["db1"]),
    ("sqlite:////var/lib/llmgw/llmgw.db", []),
])
def test_database_hosts(url: str, hosts: list[str]) -> None:
    assert database_hosts(url) == hosts


def test_patroni_urls_from_config_or_the_multi_host_database_url() -> None:
    url = "postgresql://llmgw:pw@db1:5432,db2:5432/llmgw"
    assert patroni_urls("", url) == ["http://db1:8008", "http://db2:8008"]
    assert patroni_urls("https://a:8009/, https://b:8009", url) == ["https://a:8009",
                                                                     "https://b:8009"]
    assert patroni_urls("", "postgresql://llmgw@db1/llmgw") == []      # no Patroni known
    assert patroni_urls("", "sqlite:///x.db") == []


def test_store_health_asks_at_most_once_per_ttl() -> None:
    asked: list[str] = []
    now = [0.0]

    def fetch(url: str, timeout: float) -> Any:
        asked.append(url)
        return HEALTHY if url.endswith("/cluster") else {"state": "running"}

    health = StoreHealth([A, B, C], ttl_s=5, fetch=fetch, clock=lambda: now[0])
    assert [r["name"] for r in health.members() or []] == ["db1", "db2", "db3"]
    first = len(asked)
    now[0] = 4.9
    health.members()
    assert len(asked) == first
    now[0] = 5.1
    health.members()
    assert len(asked) == 2 * first
    assert StoreHealth([]).members() is None
