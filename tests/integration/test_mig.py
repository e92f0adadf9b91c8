"""MIG end to end: an agent reading a real H100 MIG capture through `nvidia-smi` reports
four instances; a replica of a MIG class lands on exactly one instance and its engine gets
CUDA_VISIBLE_DEVICES=MIG-<uuid>; `ctl nodes` shows `0/migN`. (The engine is the CPU build of
llama.cpp: it ignores the variable and serves, which lets the whole path run here.)"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from llmgw_runtime.cli.ctl import ctl
from tests.support.captures import OWN, SHARED, fake_nvidia_smi, list_section
from tests.support.procs import wait_until

from .conftest import Cluster

pytestmark = pytest.mark.slow

CAPTURE = "h100-80gb-hbm3-mig-4-instances-drv590-capture.txt"
CLASS = "h100-80g-mig-1g.10gb"


def engine_env(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def test_mig_replicas_land_on_one_instance_each_with_the_mig_uuid(
        cluster_factory: Any, tiny_model: Path, tmp_path: Path) -> None:
    list_text = list_section((SHARED / CAPTURE).read_text(encoding="utf-8"))
    xml_text = (OWN / "h100-80gb-hbm3-mig-4-instances-v13.xml").read_text()
    fake_nvidia_smi(tmp_path / "bin", list_text, xml_text)
    c: Cluster = cluster_factory()
    c.start_control()
    c.apply(f"""models:
  - name: small
    source: file://{tiny_model}
    engine: llama.cpp
    profile: {{class: {CLASS}}}
    replicas: 2
    args: ["--ctx-size", "256"]
""")
    c.start_agent(devices="nvidia-smi",
                  env={"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"})
    c.wait_ready("small")
    wait_until(lambda: len([r for r in c.replicas("small") if r["state"] == "ready"]) == 2,
               30, "both replicas ready")

    [node] = c.admin.get("/api/v1/nodes")["nodes"]
    mig_ids = {d["id"]: d for d in node["devices"]}
    assert sorted(mig_ids) == [1000, 1001, 1002, 1003]
    replicas = c.replicas("small")
    used = sorted(d for r in replicas for d in r["devices"])
    assert used == [1002, 1003]                      # the two 1g.10gb instances
    for rep in replicas:
        [dev_id] = rep["devices"]
        env = engine_env(rep["pid"])
        assert env["CUDA_VISIBLE_DEVICES"] == mig_ids[dev_id]["uuid"]
        assert env["CUDA_VISIBLE_DEVICES"].startswith("MIG-")
        assert not any(k.startswith("GGML_VK") for k in env)

    out = CliRunner().invoke(ctl, ["--url", c.control_url, "--token", c.admin_token,
                                   "nodes"]).output
    for label in ("0/mig0", "0/mig1", "0/mig2", "0/mig3"):
        assert label in out
    assert "h100-80g-mig-3g.40gb" in out and CLASS in out
    status = json.loads(CliRunner().invoke(ctl, ["--url", c.control_url, "--token",
                                                 c.admin_token, "status", "-o", "json"]).output)
    assert {k: status["devices"][CLASS][k] for k in (
        "total", "used", "free", "unhealthy", "unreachable")} == {
        "total": 2, "used": 2, "free": 0, "unhealthy": 0, "unreachable": 0}
    assert status["devices"]["h100-80g-mig-3g.40gb"]["free"] == 1


def test_a_card_with_nothing_carved_runs_nothing_and_says_why(
        cluster_factory: Any, tiny_model: Path, tmp_path: Path) -> None:
    fake_nvidia_smi(tmp_path / "bin",
                    (OWN / "h100-80gb-hbm3-mig-nothing-carved-L.txt").read_text(),
                    (OWN / "h100-80gb-hbm3-mig-nothing-carved-v13.xml").read_text())
    c: Cluster = cluster_factory()
    c.start_control()
    c.apply(f"""models:
  - {{name: big, source: "file://{tiny_model}", engine: llama.cpp, profile: {{class: h100-80g}}}}
""")
    c.start_agent(devices="nvidia-smi",
                  env={"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"})

    def unplaceable() -> dict[str, Any] | None:
        model = c.model("big")
        reported = c.admin.get("/api/v1/status")["nodes"]["reporting"] == 1
        return model if reported and "report no devices" in (model["reason"] or "") else None

    model = wait_until(unplaceable, 30, "the model to be refused")
    assert model["state"] == "unplaceable"
    assert "no reporting node has a device of class h100-80g" in model["reason"]
    out = CliRunner().invoke(ctl, ["--url", c.control_url, "--token", c.admin_token,
                                   "status"]).output
    assert "cards that can run nothing" in out and "nvidia-smi mig" in out
    nodes_out = CliRunner().invoke(ctl, ["--url", c.control_url, "--token", c.admin_token,
                                         "nodes"]).output
    assert "RUNS NOTHING" in nodes_out
