"""``llmgw server init`` checks every store host's ssh key before anything changes, and
the playbook runs with strict host key checking: against a real OpenSSH server
(tests/support/sshd.py) on 127.0.0.1 and 127.0.0.2, one port, two store hosts."""

from __future__ import annotations

import ipaddress
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from llmgw_runtime.cli.main import cli
from llmgw_runtime.storeops import patroni
from llmgw_runtime.storeops.runner import run_playbook
from llmgw_runtime.storeops.ssh import (
    SshTrust,
    SshView,
    check_host_keys,
    check_hosts,
    host_text,
    judge_ssh,
    known_name,
    ssh_view,
)
from tests.support.sshd import Sshd, keygen, sshd  # noqa: F401 - sshd is a fixture

ENV_TEXT = "LLMGW_DATABASE_URL=sqlite:////old/llmgw.db\nLLMGW_ADMIN_TOKEN=tok\n"

# A stand-in store playbook that leaves a mark wherever it runs: it must never run when a
# host key is refused. `raw` needs no Python on the host, yet goes over ssh.
MARKING_PLAYBOOK = """---
- name: store | Leave a mark
  hosts: all
  gather_facts: false
  tasks:
    - name: Mark
      ansible.builtin.raw: echo "{{ inventory_hostname }} {{ llmgw_store_control_address | default('none') }}" >> MARK
      changed_when: true
"""

# Runs something on each store host over ssh (debug/assert would never connect).
SSH_PLAYBOOK = """---
- name: store | Reach the hosts
  hosts: llmgw_store
  gather_facts: false
  tasks:
    - name: Run something there
      ansible.builtin.raw: "true"
      changed_when: false
"""


def _hosts(server: Sshd) -> list[str]:
    return [f"root@{a}:{server.port}" for a in server.addresses]


def _store_hosts(server: Sshd) -> list[patroni.StoreHost]:
    return patroni.parse_hosts(_hosts(server))


def _fingerprint(public_key: Path) -> str:
    out = subprocess.run(["ssh-keygen", "-lf", str(public_key)], check=True,
                         capture_output=True, text=True).stdout
    return out.split()[1]


@pytest.fixture
def wrong_key(tmp_path: Path) -> Path:
    """The public key of an impostor (a key pair no server uses)."""
    return keygen(tmp_path / "impostor", "impostor").with_suffix(".pub")


def _init(tmp_path: Path, server: Sshd, known_hosts: Path, *extra: str) -> Result:
    playbooks = tmp_path / "playbooks"
    playbooks.mkdir(exist_ok=True)
    (playbooks / "store.yml").write_text(MARKING_PLAYBOOK.replace("MARK",
                                                                  str(tmp_path / "mark")))
    return CliRunner().invoke(cli, [
        "server", "--state-dir", str(tmp_path / "state"), "init", "--patroni",
        *_hosts(server), "--env-file", str(tmp_path / "control.env"),
        "--known-hosts", str(known_hosts), "--ssh-key", str(server.client_key),
        "--playbooks", str(playbooks), "--wait", "0",
        "--systemd-dir", str(playbooks), *extra])     # as if this host ran systemd


def _init_env(tmp_path: Path) -> Path:
    env = tmp_path / "control.env"
    env.write_text(ENV_TEXT)
    env.chmod(0o640)
    return env


def _nothing_changed(tmp_path: Path, env: Path, known_hosts: Path, before: str) -> None:
    assert env.read_text() == ENV_TEXT and oct(env.stat().st_mode & 0o777) == "0o640"
    assert not (tmp_path / "state" / patroni.PASSWORDS_FILE).exists()
    assert not (tmp_path / "mark").exists()
    assert known_hosts.read_text() == before


def _command(message: str, starting: str) -> str:
    """The backticked command in ``message`` that starts with ``starting``."""
    found = re.findall(r"`([^`]+)`", message)
    return next(c for c in found if c.startswith(starting))


# ---------------------------------------------------------------- server init, for real


def test_a_changed_host_key_stops_server_init_before_anything_changes(
        tmp_path: Path, sshd: Sshd, wrong_key: Path) -> None:  # noqa: F811
    env = _init_env(tmp_path)
    known = sshd.known_hosts(tmp_path / "known_hosts", keys={"127.0.0.1": wrong_key})
    before = known.read_text()
    result = _init(tmp_path, sshd, known)
    out = result.output
    assert result.exit_code == 1, out
    name = f"[127.0.0.1]:{sshd.port}"
    assert f"root@127.0.0.1:{sshd.port}: its ssh host key has CHANGED: it is not the key " \
           f"{known} line 1 holds for {name}" in out
    assert _fingerprint(sshd.host_key) in out           # what the impostor sent
    assert "man-in-the-middle" in out
    assert f"`ssh-keygen -R '{name}' -f {known}`" in out
    assert f"`ssh-keyscan -p {sshd.port} 127.0.0.1 >> {known}`" in out
    assert f"root@127.0.0.2:{sshd.port}:" not in out     # its key is right
    assert "==> 2/6" not in out and "==> 3/6" not in out
    _nothing_changed(tmp_path, env, known, before)

    # The commands in the message are exact: run them, and the check passes.
    subprocess.run(_command(out, "ssh-keygen -R"), shell=True, check=True,
                   capture_output=True)
    subprocess.run(_command(out, "ssh-keyscan"), shell=True, check=True,
                   capture_output=True)
    assert check_host_keys(_store_hosts(sshd),
                           SshTrust(known_hosts=known, identity=sshd.client_key)) == []


def test_an_unknown_host_stops_server_init_with_the_command_that_accepts_it(
        tmp_path: Path, sshd: Sshd) -> None:  # noqa: F811
    env = _init_env(tmp_path)
    known = tmp_path / "known_hosts"
    known.write_text("")
    result = _init(tmp_path, sshd, known)
    out = result.output
    assert result.exit_code == 1, out
    for addr in sshd.addresses:
        assert f"root@{addr}:{sshd.port}: ssh does not know its host key (no " \
               f"[{addr}]:{sshd.port} in {known}); it offers " \
               f"{_fingerprint(sshd.host_key)} (ED25519)" in out
        assert f"then accept the key: `ssh-keyscan -p {sshd.port} {addr} >> {known}`" in out
    assert "ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub" in out
    _nothing_changed(tmp_path, env, known, "")

    for addr in sshd.addresses:
        accept = _command(out.split(f"root@{addr}:")[1], "ssh-keyscan")
        subprocess.run(accept, shell=True, check=True, capture_output=True)
    assert check_host_keys(_store_hosts(sshd),
                           SshTrust(known_hosts=known, identity=sshd.client_key)) == []


def test_the_right_keys_pass_the_check_and_the_playbook_runs_over_ssh(
        tmp_path: Path, sshd: Sshd) -> None:  # noqa: F811
    """Past the check the command goes on: passwords, then the (stand-in) playbook over
    ssh to both hosts; it stops at the health check, as there is no Patroni."""
    _need_ansible()
    env = _init_env(tmp_path)
    known = sshd.known_hosts(tmp_path / "known_hosts")
    result = _init(tmp_path, sshd, known)
    out = result.output
    assert "ssh: every store host's key is the one known_hosts holds, python3 and sudo " \
           "are there (127.0.0.1, 127.0.0.2)" in out
    # Each store host's pg_hba admits the address it saw this host's ssh come from.
    seen = check_hosts(_store_hosts(sshd),
                       SshTrust(known, sshd.client_key)).client_addresses()
    assert set(seen) == {"127.0.0.1", "127.0.0.2"}
    assert all(ipaddress.ip_address(a).is_loopback for a in seen.values())
    assert "the store hosts see this host at " + ", ".join(
        f"{a} ({h})" for h, a in seen.items()) + ": pg_hba admits it" in out
    assert re.search(r"\[1/1\] Mark  127\.0\.0\.1 changed, 127\.0\.0\.2 changed, \S+ "
                     r"changed", out), out
    assert result.exit_code == 1 and "not healthy after the playbook" in out
    assert env.read_text() == ENV_TEXT
    marks = sorted(m for m in (tmp_path / "mark").read_text().splitlines()
                   if m.startswith("127."))            # the store hosts, not the witness
    assert marks == sorted(f"{h} {a}" for h, a in seen.items())


def test_the_check_itself_against_the_real_server(tmp_path: Path, sshd: Sshd,  # noqa: F811
                                                  wrong_key: Path) -> None:
    hosts = _store_hosts(sshd)
    right = sshd.known_hosts(tmp_path / "right")
    assert check_host_keys(hosts, SshTrust(right, sshd.client_key)) == []
    wrong = sshd.known_hosts(tmp_path / "wrong", keys={"127.0.0.2": wrong_key})
    problems = check_host_keys(hosts, SshTrust(wrong, sshd.client_key))
    assert [(p.host, p.kind) for p in problems] == [(f"root@127.0.0.2:{sshd.port}",
                                                      "changed")]
    # A key that ssh knows but a login it is not given: not a key problem, still refused.
    problems = check_host_keys(hosts[:1], SshTrust(right, tmp_path / "no-such-key"))
    assert [p.kind for p in problems] == ["login"]
    assert "Permission denied" in problems[0].message


# ---------------------------------------------------------------- the playbook's own ssh


def _need_ansible() -> None:
    if shutil.which("ansible-playbook", path=str(Path(sys.executable).parent)) is None:
        pytest.skip("ansible-core is not installed next to this Python (make ansible-deps)")


def _ssh_inventory(server: Sshd) -> dict[str, Any]:
    return patroni.inventory(_store_hosts(server), "witness")


def test_the_playbook_refuses_a_changed_key_even_when_the_environment_turns_checks_off(
        tmp_path: Path, sshd: Sshd, wrong_key: Path,  # noqa: F811
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Behind the check, ansible's ssh checks the keys too: ansible-runner's default
    (ANSIBLE_HOST_KEY_CHECKING=False) and an operator's environment cannot turn it off."""
    _need_ansible()
    monkeypatch.setenv("ANSIBLE_HOST_KEY_CHECKING", "False")
    monkeypatch.setenv("ANSIBLE_SSH_ARGS", "-o StrictHostKeyChecking=no")
    playbook = tmp_path / "store.yml"
    playbook.write_text(SSH_PLAYBOOK)
    known = sshd.known_hosts(tmp_path / "known_hosts", keys={"127.0.0.1": wrong_key})
    before = known.read_text()
    lines: list[str] = []
    outcome = run_playbook(playbook, _ssh_inventory(sshd), {}, lines.append,
                           ssh=SshTrust(known, sshd.client_key))
    assert not outcome.ok
    assert [(f.host, f.unreachable) for f in outcome.failures] == [("127.0.0.1", True)]
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in outcome.failures[0].message
    assert lines == ["[1/1] Run something there  127.0.0.1 UNREACHABLE, 127.0.0.2 ok"]
    assert known.read_text() == before            # nothing was accepted on the way

    outcome = run_playbook(playbook, _ssh_inventory(sshd), {}, lines.append,
                           ssh=SshTrust(sshd.known_hosts(known), sshd.client_key))
    assert outcome.ok, outcome.failures


# ---------------------------------------------------------------- the pure parts


def test_hosts_are_named_as_given_and_as_known_hosts_lists_them() -> None:
    assert host_text(patroni.parse_host("root@db1")) == "root@db1"
    assert host_text(patroni.parse_host("ops@[fd00::5]:2222")) == "ops@[fd00::5]:2222"
    assert known_name("db1", 22) == "db1" and known_name("db1", 2222) == "[db1]:2222"
    assert known_name("db1", 2222, "db1-alias") == "db1-alias"
    host = patroni.parse_host("root@db1")
    view = ssh_view(host, "user root\nport 2200\nhostkeyalias none\n"
                          "userknownhostsfile ~/.ssh/known_hosts ~/.ssh/known_hosts2\n",
                    SshTrust())
    assert view == SshView(2200, "[db1]:2200", str(Path.home() / ".ssh" / "known_hosts"))
    assert ssh_view(host, "", SshTrust(Path("/k h"))) == SshView(22, "db1", "/k h")
    assert SshTrust(Path("/k h"), Path("/id")).options() == [
        "-o", "StrictHostKeyChecking=yes", "-o", 'UserKnownHostsFile="/k h"',
        "-o", "IdentityFile=/id"]


def test_a_failure_that_is_not_about_the_key_says_how_to_log_in() -> None:
    host = patroni.parse_host("admin@db1")
    view = SshView(22, "db1", "/root/.ssh/known_hosts")
    assert judge_ssh(host, 0, "", view) is None
    problem = judge_ssh(host, 255, "ssh: connect to host db1 port 22: Connection refused\n",
                        view)
    assert problem is not None and problem.kind == "login"
    assert problem.message == (
        "admin@db1: cannot log in over ssh: ssh: connect to host db1 port 22: Connection "
        "refused. server init logs in with your ssh keys or ssh-agent, without a prompt: "
        "make `ssh admin@db1 true` work, then re-run")
