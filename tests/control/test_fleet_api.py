"""The control service's side of the fleet: multi-node assignments, parts failing their
replica, the catalog sources agents look for, weights per fabric, fetch progress."""

from __future__ import annotations

from typing import Any

from .conftest import CPU, Api

BIG = """models:
  - name: big
    source: hf://Org/Big-GGUF/big.gguf
    engine: llama.cpp
    profile: {class: cpu, gpus: 1, nodes: 2, tp: 2}
"""
SMALL = """models:
  - name: small
    source: https://files.example/small.gguf
    engine: llama.cpp
    profile: {class: cpu}
"""


def put(api: Api, text: str) -> None:
    resp = api.call("PUT", "/api/v1/catalog", data=text,
                    headers={"Content-Type": "application/yaml"})
    assert resp.status_code == 200, resp.json


def fleet(api: Api, fabrics: dict[str, str]) -> dict[str, str]:
    creds = {}
    for node, fabric in fabrics.items():
        creds[node] = api.join(node)
        assert api.report(creds[node], node, fabric=fabric).status_code == 200
    return creds


def assignments(api: Api, creds: dict[str, str], node: str, **extra: Any) -> list[Any]:
    resp = api.report(creds[node], node, **extra)
    assert resp.status_code == 200, resp.json
    return list(resp.json["assignments"])


def test_a_two_node_replica_is_a_head_and_a_worker_in_one_fabric(api: Api) -> None:
    creds = fleet(api, {"n1": "ib-a", "n2": "ib-a", "n3": "ib-b"})
    put(api, BIG)
    api.reconciler.run_cycle()
    got = {n: assignments(api, creds, n) for n in creds}
    assert got["n3"] == []
    (head,) = got["n1"]
    (worker,) = got["n2"]
    assert head["role"] == "head" and head["rank"] == 0 and head["nodes"] == 2
    assert worker["role"] == "worker" and worker["rank"] == 1
    assert worker["replica_id"] == head["replica_id"] + ".w1"
    assert worker["replica"] == head["replica_id"]
    assert head["rendezvous_port"] == worker["rendezvous_port"] == 29500
    assert worker["head_address"] == "127.0.0.1"
    assert [p["node"] for p in head["peers"]] == ["n1", "n2"]
    assert head["profile"] == {"gpus": 1, "tp": 2, "pp": 1, "nodes": 2}

    # the worker fails: the whole replica fails, with the part's reason
    assignments(api, creds, "n2", replicas=[{"id": worker["replica_id"], "state": "failed",
                                              "last_error": "rpc-server: out of memory"}])
    api.reconciler.run_cycle()
    model = api.call("GET", "/api/v1/models/big").json
    assert model["last_error"] == "part 1 on n2 failed: rpc-server: out of memory"
    assert model["consecutive_failures"] == 1


def test_replicas_list_their_parts_and_download_progress(api: Api) -> None:
    creds = fleet(api, {"n1": "ib-a", "n2": "ib-a"})
    put(api, BIG)
    api.reconciler.run_cycle()
    (head,) = assignments(api, creds, "n1", replicas=[])
    progress = {"bytes": 1024, "total": 4096, "rate_bps": 512.0}
    assignments(api, creds, "n1", replicas=[{"id": head["replica_id"], "state": "fetching",
                                              "progress": progress}])
    (rep,) = api.call("GET", "/api/v1/replicas").json["replicas"]
    assert rep["state"] == "fetching" and rep["progress"] == progress
    assert [(p["rank"], p["node"], p["state"]) for p in rep["parts"]] == [(1, "n2", "pending")]


def test_agents_get_the_catalog_sources_only_when_they_changed(api: Api) -> None:
    put(api, BIG + SMALL.split("models:\n")[1])
    cred = api.join("n1")
    first = api.report(cred, "n1", sources_hash="").json
    assert first["sources"] == ["hf://Org/Big-GGUF/big.gguf",
                                "https://files.example/small.gguf"]
    again = api.report(cred, "n1", sources_hash=first["sources_hash"]).json
    assert "sources" not in again
    assert "sources" not in api.report(cred, "n1").json     # no weights dirs: no list


def test_status_and_plan_say_which_fabric_holds_which_model(api: Api) -> None:
    put(api, BIG + SMALL.split("models:\n")[1])
    creds = fleet(api, {"n1": "ib-a", "n2": "ib-a", "n3": "ib-b"})
    seen = {"dirs": [{"path": "/srv", "fstype": "nfs4", "shared": True, "exists": True}],
            "sources": {"https://files.example/small.gguf": {"path": "/srv/small.gguf",
                                                              "shared": True}}}
    api.report(creds["n1"], "n1", fabric="ib-a", weights=seen)
    status = api.call("GET", "/api/v1/status").json
    assert status["fabrics"]["ib-a"]["models"] == ["small"]
    assert status["fabrics"]["ib-b"]["models"] == []
    small = next(m for m in status["models"] if m["name"] == "small")
    # a shared filer seen from ib-a counts for both nodes of ib-a
    assert small["fabrics_with_weights"] == ["ib-a"] and small["nodes_with_weights"] == 2
    plan = api.call("GET", "/api/v1/plan").json
    assert plan["models"]["small"] == {"fabrics_with_weights": ["ib-a"],
                                       "nodes_with_weights": 2}
    assert plan["models"]["big"]["fabrics_with_weights"] == []


def test_status_and_plan_count_the_same_free_whole_nodes(api: Api) -> None:
    from llmgw_runtime.store import repo

    put(api, SMALL)
    fleet(api, {"n1": "ib-a", "n2": "ib-a", "n3": "ib-b"})
    with api.store.begin() as conn:        # a starting replica holds n3's only device
        repo.add_replica(conn, "r-busy", "small", "n3", (CPU["id"],), 1.0)
    status = api.call("GET", "/api/v1/status").json
    plan = api.call("GET", "/api/v1/plan").json
    assert status["fabrics"]["ib-b"]["free_nodes"] == 0
    assert status["fabrics"]["ib-a"]["free_nodes"] == 2
    assert plan["fabrics"] == status["fabrics"]


def test_a_placement_warning_is_logged_once_per_reason_not_every_tick(
        api: Api, caplog: Any) -> None:
    import logging

    put(api, BIG)                                   # two nodes needed, none reporting
    with caplog.at_level(logging.WARNING, logger="llmgw_runtime.control.reconcile"):
        for _ in range(5):
            api.reconciler.run_cycle()
        fleet(api, {"n1": "ib-a"})                  # a new reason: one node, no partner
        for _ in range(5):
            api.reconciler.run_cycle()
    warnings = [r.getMessage() for r in caplog.records if "cannot be placed" in r.getMessage()]
    assert len(warnings) == 2, warnings
    assert "no reporting node" in warnings[0] and "ib-a has 1 free" in warnings[1]
