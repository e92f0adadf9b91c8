"""llmgw.cluster.llmgw_nodes through a real ansible-inventory run against a real control
service, with nodes registered through the agent API (join, then one report) and no agent."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from llmgw_runtime.cli.client import Client
from tests.collection.conftest import ansible_env
from tests.integration.conftest import Cluster

pytestmark = pytest.mark.slow


def device(dev_id: int, klass: str, card: int, mig: int | None = None) -> dict[str, Any]:
    profile = klass.split("-mig-")[1] if mig is not None else None
    return {"id": dev_id, "uuid": f"GPU-{card}-{mig}", "card": card, "mig": mig,
            "class": klass, "memory_total_mb": 81920, "memory_used_mb": 0, "processes": [],
            "temperature_c": None, "power_w": None,
            "utilization_pct": None if mig is not None else 0, "healthy": True,
            "reason": None, "gpu_instance": mig, "compute_instance": 0 if mig is not None
            else None, "profile": profile}


def register_node(cluster: Cluster, name: str, address: str, fabric: str | None,
                  devices: list[dict[str, Any]]) -> None:
    """What an agent does on its first contact: join, then report its devices."""
    joined = Client(cluster.control_url, cluster.join_token).post(
        "/api/v1/agent/join", {"node": name})
    Client(cluster.control_url, joined["credential"]).post("/api/v1/agent/report", {
        "node": name, "address": address, "agent_version": "0.1.0", "fabric": fabric,
        "devices": devices, "device_source": "nvml", "driver_version": "550.54.15",
        "cards": [], "device_problems": [], "engines": ["llama.cpp", "vllm"],
        "weights": {"dirs": []}, "replicas": []})


def inventory(cluster: Cluster, workdir: Path, config: str) -> dict[str, Any]:
    path = workdir / "site.llmgw_nodes.yml"
    path.write_text(config)
    proc = subprocess.run(["ansible-inventory", "-i", str(path), "--list"], cwd=workdir,
                          env=ansible_env(cluster, workdir), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "WARNING" not in proc.stderr, proc.stderr
    return dict(json.loads(proc.stdout))


def plain(value: Any) -> Any:
    """ansible-inventory --list marks values from the API as unsafe (never templated:
    a node's report is not trusted with Jinja); the values themselves, for comparing."""
    if isinstance(value, dict):
        if set(value) == {"__ansible_unsafe"}:
            return value["__ansible_unsafe"]
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def hosts_of(listing: dict[str, Any], group: str) -> list[str]:
    return sorted(listing.get(group, {}).get("hosts", []))


def test_nodes_become_hosts_grouped_by_fabric_and_device_class(control: Cluster,
                                                               tmp_path: Path) -> None:
    register_node(control, "gpu-01", "10.0.0.11", "ib-a",
                  [device(0, "h100-80g", 0), device(1, "h100-80g", 1),
                   device(1000, "a100-80g-mig-3g.40gb", 0, mig=0)])
    register_node(control, "gpu-02", "10.0.0.12", "ib-b", [device(0, "h100-80g", 0)])
    register_node(control, "cpu-01", "10.0.0.13", None, [device(0, "cpu", 0)])

    # The URL and token come from LLMGW_CONTROL_URL and LLMGW_ADMIN_TOKEN; the file adds a
    # constructed group to show those options work too.
    listing = inventory(control, tmp_path, "plugin: llmgw.cluster.llmgw_nodes\n"
                                           "groups:\n  llmgw_agents: true\n")

    assert hosts_of(listing, "fabric_ib_a") == ["gpu-01"]
    assert hosts_of(listing, "fabric_ib_b") == ["gpu-02"]
    assert hosts_of(listing, "class_h100_80g") == ["gpu-01", "gpu-02"]
    assert hosts_of(listing, "class_a100_80g_mig_3g_40gb") == ["gpu-01"]
    assert hosts_of(listing, "class_cpu") == ["cpu-01"]
    assert hosts_of(listing, "fabric_ib_a_class_h100_80g") == ["gpu-01"]
    assert hosts_of(listing, "fabric_ib_a_class_a100_80g_mig_3g_40gb") == ["gpu-01"]
    assert hosts_of(listing, "fabric_ib_b_class_h100_80g") == ["gpu-02"]
    assert hosts_of(listing, "llmgw_agents") == ["cpu-01", "gpu-01", "gpu-02"]
    assert not [g for g in listing if g.startswith("fabric_none")]

    hostvars = plain(listing["_meta"]["hostvars"])
    gpu = hostvars["gpu-01"]
    assert gpu["ansible_host"] == "10.0.0.11"
    assert gpu["llmgw_fabric"] == "ib-a"
    assert gpu["llmgw_device_classes"] == ["a100-80g-mig-3g.40gb", "h100-80g"]
    assert [d["id"] for d in gpu["llmgw_devices"]] == [0, 1, 1000]
    assert gpu["llmgw_devices"][2]["mig"] == 0
    assert isinstance(gpu["llmgw_last_report"], float)
    assert hostvars["cpu-01"]["llmgw_fabric"] is None


def test_a_wrong_token_fails_with_the_servers_message(control: Cluster, tmp_path: Path) -> None:
    path = tmp_path / "bad.llmgw_nodes.yml"
    path.write_text("plugin: llmgw.cluster.llmgw_nodes\ntoken: llmgw-admin-wrong\n"
                    f"control_url: {control.control_url}\n")
    env = ansible_env(control, tmp_path, ANSIBLE_INVENTORY_UNPARSED_FAILED="1")
    proc = subprocess.run(["ansible-inventory", "-i", str(path), "--list"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "llmgw_nodes: the token matches no account" in proc.stderr, proc.stderr
