"""The collection's tests: a real control service on loopback (the integration helpers) and
real ansible-playbook / ansible-inventory processes that load llmgw.cluster from collections/."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.conftest import Cluster, cluster_factory, tiny_model  # noqa: F401
from tests.support.procs import ROOT

COLLECTIONS = ROOT / "collections"
BIN = Path(sys.executable).parent


def ansible_env(cluster: Cluster, home: Path, **extra: str) -> dict[str, str]:
    """ansible-* in a clean environment: only this repository's collections, no ansible.cfg
    from the working directory, the control service's URL and admin token in LLMGW_*."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LLMGW_", "ANSIBLE_"))}
    env.update(PATH=f"{BIN}:{env.get('PATH', '')}", ANSIBLE_COLLECTIONS_PATH=str(COLLECTIONS),
               ANSIBLE_CONFIG=str(home / "ansible.cfg"), ANSIBLE_HOME=str(home),
               ANSIBLE_PYTHON_INTERPRETER=sys.executable, ANSIBLE_NOCOLOR="1",
               ANSIBLE_LOCAL_TEMP=str(home / "tmp"), ANSIBLE_DEPRECATION_WARNINGS="0",
               LLMGW_CONTROL_URL=cluster.control_url, LLMGW_ADMIN_TOKEN=cluster.admin_token)
    env.update(extra)
    (home / "ansible.cfg").write_text("[defaults]\n")
    return env


class Playbook:
    """Runs tasks against localhost through ansible-playbook; each task's result back."""

    def __init__(self, cluster: Cluster, workdir: Path) -> None:
        self.cluster = cluster
        self.workdir = workdir
        self.env = ansible_env(cluster, workdir)
        self.runs = 0

    def run(self, *tasks: dict[str, Any], expect_rc: int = 0) -> list[dict[str, Any]]:
        self.runs += 1
        path = self.workdir / f"play{self.runs}.yml"
        path.write_text(yaml.safe_dump([{
            "name": "test | llmgw.cluster", "hosts": "localhost", "connection": "local",
            "gather_facts": False, "tasks": list(tasks)}], sort_keys=False))
        proc = subprocess.run(
            ["ansible-playbook", "-i", "localhost,", str(path)], cwd=self.workdir,
            env={**self.env, "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json"},
            capture_output=True, text=True, timeout=120)
        assert proc.returncode == expect_rc, proc.stdout[-4000:] + proc.stderr[-4000:]
        report = json.loads(proc.stdout)
        return [task["hosts"]["localhost"] for task in report["plays"][0]["tasks"]]


@pytest.fixture
def control(cluster_factory: Any) -> Cluster:  # noqa: F811 - the fixture re-exported above
    """A control service alone (no router, no agent), stopped after the test."""
    cluster: Cluster = cluster_factory()
    # The inventory tests register nodes at 10.0.0.x from loopback, as agents behind a NAT.
    cluster.start_control(env={"LLMGW_AGENT_NETWORKS": "10.0.0.0/24"})
    return cluster


@pytest.fixture
def playbook(control: Cluster, tmp_path: Path) -> Playbook:
    workdir = tmp_path / "ansible"
    workdir.mkdir()
    return Playbook(control, workdir)
