"""The llmgw_monitoring role installs the Grafana dashboards where a Grafana on the host
provisions them: a real ansible-playbook run of the role's tasks (tasks/grafana.yml) on
this machine, into temporary directories, for a host with Grafana (its provisioning
directory exists), one without and one that turned the dashboards off; run twice, the
second run changes nothing."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

from .support import DASHBOARDS, ROOT

PLAYBOOK = """\
- name: Dashboards | the llmgw_monitoring role's Grafana tasks
  hosts: all
  gather_facts: false
  tasks:
    - name: Dashboards | install them
      ansible.builtin.include_role:
        name: llmgw_monitoring
        tasks_from: grafana
"""


def run(tmp_path: Path, hosts: dict[str, dict[str, str]]) -> subprocess.CompletedProcess[str]:
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {
        name: {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
               # no Grafana runs here: the restart handler finds no such unit running
               "llmgw_monitoring_grafana_service": "llmgw-test-grafana.service", **host}
        for name, host in hosts.items()}}}))
    (tmp_path / "play.yml").write_text(PLAYBOOK)
    home = tmp_path / "ansible"
    home.mkdir(exist_ok=True)
    (home / "ansible.cfg").write_text(f"[defaults]\nroles_path = {ROOT / 'roles'}\n")
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(tmp_path),
           "ANSIBLE_CONFIG": str(home / "ansible.cfg"), "ANSIBLE_HOME": str(home),
           "ANSIBLE_LOCAL_TEMP": str(home / "tmp"), "ANSIBLE_NOCOLOR": "1"}
    done = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory),
         str(tmp_path / "play.yml")], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=120)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    return done


def changed(output: str) -> dict[str, int]:
    return {host: int(n) for host, n in re.findall(r"^(\S+)\s+: ok=\d+\s+changed=(\d+)",
                                                   output, re.M)}


def test_the_dashboards_go_where_grafana_provisions_them_and_nowhere_without_grafana(
        tmp_path: Path) -> None:
    grafana = tmp_path / "grafana"
    (grafana / "provisioning" / "dashboards").mkdir(parents=True)
    hosts = {
        "with-grafana": {
            "llmgw_monitoring_grafana_dashboards_dir": str(grafana / "dashboards" / "llmgw"),
            "llmgw_monitoring_grafana_provisioning_file":
                str(grafana / "provisioning" / "dashboards" / "llmgw.yaml")},
        "without-grafana": {
            "llmgw_monitoring_grafana_dashboards_dir": str(tmp_path / "none" / "dashboards"),
            "llmgw_monitoring_grafana_provisioning_file":
                str(tmp_path / "none" / "provisioning" / "dashboards" / "llmgw.yaml")},
        "dashboards-off": {"llmgw_monitoring_grafana_dashboards_dir": "",
                           "llmgw_monitoring_grafana_provisioning_file":
                               str(grafana / "provisioning" / "dashboards" / "off.yaml")},
    }
    first = run(tmp_path, hosts)

    installed = grafana / "dashboards" / "llmgw"
    repo = sorted(p.name for p in DASHBOARDS.glob("*.json"))
    assert sorted(p.name for p in installed.iterdir()) == repo
    for name in repo:
        assert (installed / name).read_bytes() == (DASHBOARDS / name).read_bytes()
        assert (installed / name).stat().st_mode & 0o777 == 0o644
    provider = yaml.safe_load((grafana / "provisioning" / "dashboards" / "llmgw.yaml")
                              .read_text())
    assert provider["apiVersion"] == 1
    [entry] = provider["providers"]
    assert (entry["type"], entry["folder"], entry["options"]["path"]) == \
        ("file", "llmgw", str(installed))

    assert not (tmp_path / "none").exists()
    assert "without-grafana: Grafana is not installed here" in first.stdout
    assert "docs/operations.md" in first.stdout
    assert not (grafana / "provisioning" / "dashboards" / "off.yaml").exists()
    # the directory, the dashboards (one looped task) and the provider file
    assert changed(first.stdout)["with-grafana"] == 3

    again = run(tmp_path, hosts)
    assert changed(again.stdout) == {"with-grafana": 0, "without-grafana": 0,
                                     "dashboards-off": 0}, again.stdout[-3000:]
