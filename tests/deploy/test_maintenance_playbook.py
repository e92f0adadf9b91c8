"""playbooks/maintenance.yml (issue 27) through real ansible-playbook runs against a real
control service, router and two agents on this machine (the agent hosts are ansible's
local connection): it drains a node under a request loop (4 clients, half streamed, the
real openai client) with no failed request, runs the operator's tasks file, waits for the
agent's fresh report and uncordons the node; a drain the control service refuses (no room
for the node's replicas) stops the play, names the models and the force option, and leaves
the node as it was; a node that is not an agent is refused before anything changes. The
Molecule cluster scenario runs the same playbook on containers (molecule/cluster/verify.yml).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.conftest import Cluster, RequestLoop, tiny_catalog
from tests.support.procs import ROOT, wait_until

pytestmark = pytest.mark.slow

PLAYBOOK = ROOT / "playbooks" / "maintenance.yml"
WORK = """\
- name: Work | when it ran
  ansible.builtin.copy:
    content: "{{ lookup('ansible.builtin.pipe', 'date +%s.%N') }}"
    dest: "{{ marker }}"
    mode: "0644"
"""


def maintenance(c: Cluster, tmp_path: Path, *extra: str,
                nodes: tuple[str, ...] = ("node1", "node2")) -> subprocess.CompletedProcess[str]:
    """ansible-playbook playbooks/maintenance.yml with an inventory of the agents' nodes
    (ansible's local connection, no become) and the control service's URL and admin token,
    as a site inventory has them."""
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {
        "vars": {"llmgw_control_url": c.control_url, "llmgw_admin_token": c.admin_token,
                 "ansible_python_interpreter": sys.executable},
        "hosts": {"localhost": {"ansible_connection": "local"}},
        "children": {"llmgw_agents": {"hosts": {
            n: {"ansible_connection": "local"} for n in nodes}}}}}))
    home = tmp_path / "ansible"
    home.mkdir(exist_ok=True)
    (home / "ansible.cfg").write_text(f"[defaults]\nroles_path = {ROOT / 'roles'}\n")
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(tmp_path),
           "ANSIBLE_CONFIG": str(home / "ansible.cfg"), "ANSIBLE_HOME": str(home),
           "ANSIBLE_LOCAL_TEMP": str(home / "tmp"), "ANSIBLE_NOCOLOR": "1"}
    return subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory),
         str(PLAYBOOK), "-e", "ansible_become=false", *extra],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def nodes(c: Cluster) -> dict[str, dict[str, Any]]:
    return {n["name"]: n for n in c.admin.get("/api/v1/nodes")["nodes"]}


def test_a_node_is_drained_worked_on_and_uncordoned_under_load_with_no_failed_request(
        cluster_factory: Any, tiny_model: Path, tmp_path: Path) -> None:
    c: Cluster = cluster_factory()
    c.start_two_nodes()
    c.apply(tiny_catalog(tiny_model, replicas=2))
    wait_until(lambda: len(c.serving("tiny")) == 2, 90, "two ready replicas of tiny")
    node = sorted(r["node"] for r in c.serving("tiny"))[0]
    moving = [r for r in c.live("tiny") if r["node"] == node]
    (tmp_path / "work.yml").write_text(WORK)
    marker = tmp_path / "work-ran"

    with RequestLoop(c.router_url, "tiny") as loop:
        loop.wait_requests(20)
        t0, wall0 = time.monotonic(), time.time()
        done = maintenance(c, tmp_path, "-e", f"node={node}",
                           "-e", f"maintenance_tasks_file={tmp_path / 'work.yml'}",
                           "-e", f"marker={marker}", "-e", "maintenance_drain_timeout_s=120")
        t1 = time.monotonic()
        loop.wait_requests(20)

    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert f"{node} drained: {len(moving)} of {len(moving)} replicas moved" in done.stdout
    during = loop.done(t0, t1)
    failures = loop.failures()
    assert not failures, f"{len(failures)} of {len(loop.done())} requests failed:\n" + \
        "\n".join(failures[:20])
    assert sum(o.streamed for o in during) >= 4 and sum(not o.streamed for o in during) >= 4, \
        f"the loop hardly ran during the playbook ({len(during)} requests)"
    assert not [r for r in c.replicas() if r["desired"] and r["node"] == node], c.replicas()
    assert len(c.serving("tiny")) == 2
    assert not nodes(c)[node]["cordoned"] and not nodes(c)[node]["draining"], nodes(c)[node]
    assert float(marker.read_text()) > wall0
    assert any(node in e["message"] and "drained" in e["message"] for e in c.events())


def test_a_drain_without_room_stops_the_play_says_why_and_changes_nothing(
        cluster_factory: Any, tiny_model: Path, tmp_path: Path) -> None:
    c: Cluster = cluster_factory()
    c.start_control()
    c.start_agent()
    wait_until(lambda: "node1" in nodes(c), 30, "node1's report")
    c.apply(tiny_catalog(tiny_model))
    c.wait_ready("tiny", timeout=90)
    (tmp_path / "work.yml").write_text(WORK)
    marker = tmp_path / "work-ran"

    done = maintenance(c, tmp_path, "-e", "node=node1", "-e", f"marker={marker}",
                       "-e", f"maintenance_tasks_file={tmp_path / 'work.yml'}",
                       nodes=("node1",))

    assert done.returncode != 0, done.stdout[-4000:]
    out = " ".join(done.stdout.split())
    assert "did not drain node node1 (HTTP 409)" in out, done.stdout[-4000:]
    assert "tiny" in out and "-e maintenance_force=true" in out, done.stdout[-4000:]
    assert not marker.exists()
    assert not nodes(c)["node1"]["cordoned"] and not nodes(c)["node1"]["draining"]
    assert [r for r in c.live("tiny") if r["node"] == "node1"]


def test_a_node_that_is_no_agent_is_refused_before_anything_changes(
        cluster_factory: Any, tmp_path: Path) -> None:
    c: Cluster = cluster_factory()          # never started: nothing may be asked of it

    for node, said in [("gpu9", '"gpu9" matches no host'),
                       ("localhost", "hosts outside llmgw_agents: localhost")]:
        done = maintenance(c, tmp_path, "-e", f"node={node}")

        assert done.returncode != 0, done.stdout[-4000:]
        assert said in " ".join(done.stdout.split()), done.stdout[-4000:]
        assert "Drain |" not in done.stdout
