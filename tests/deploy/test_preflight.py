"""A wrong inventory fails site.yml's preflight with the host and the variable named,
before any host changes. The hosts are this machine (local connection): preflight only
reads, so nothing here may change."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
GOOD = {
    "llmgw_admin_token": "llmgw-admin-" + "a" * 40,
    "llmgw_join_token": "llmgw-join-" + "b" * 40,
    "llmgw_router_token": "llmgw-router-" + "c" * 40,
    "llmgw_control_url": "https://ctl1:8470",
    "llmgw_common_source_dir": str(ROOT),
    "llmgw_engines_xllamacpp": True,
    "llmgw_agent_devices": "cpu",
}

pytestmark = pytest.mark.slow


def run_site(tmp_path: Path, all_vars: dict[str, object],
             agents: dict[str, dict[str, object]]) -> subprocess.CompletedProcess[str]:
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory = {"all": {"vars": all_vars, "children": {
        "llmgw_control": {"hosts": {"ctl1": local}},
        "llmgw_router": {"hosts": {"ctl1": local}},
        "llmgw_agents": {"hosts": {name: {**local, **v} for name, v in agents.items()}},
    }}}
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump(inventory))
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
           "ANSIBLE_ROLES_PATH": str(ROOT / "roles"), "ANSIBLE_NOCOLOR": "1"}
    return subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i",
                           str(path), str(ROOT / "site.yml")], capture_output=True,
                          text=True, env=env, timeout=300, cwd=ROOT)


def assert_nothing_changed(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode != 0
    assert "changed=0" in result.stdout and "changed=1" not in result.stdout
    assert not Path("/etc/llmgw").exists() or Path("/etc/llmgw").stat().st_mtime < 0


def test_an_agent_without_a_fabric_is_named(tmp_path: Path) -> None:
    result = run_site(tmp_path, GOOD, {"gpu1": {"llmgw_fabric": "a"}, "gpu2": {}})
    assert "gpu2" in result.stdout and "llmgw_fabric" in result.stdout
    assert_nothing_changed(result)


def test_missing_secrets_are_named(tmp_path: Path) -> None:
    bad = {k: v for k, v in GOOD.items() if k != "llmgw_join_token"}
    result = run_site(tmp_path, bad, {"gpu1": {"llmgw_fabric": "a"}})
    assert "llmgw_join_token" in result.stdout
    assert GOOD["llmgw_admin_token"] not in result.stdout   # secrets never printed
    assert_nothing_changed(result)


def test_no_engine_to_install_is_named(tmp_path: Path) -> None:
    bad = {**GOOD, "llmgw_engines_xllamacpp": False}
    result = run_site(tmp_path, bad, {"gpu1": {"llmgw_fabric": "a"}})
    assert "gpu1: no engine to install" in result.stdout
    assert_nothing_changed(result)
