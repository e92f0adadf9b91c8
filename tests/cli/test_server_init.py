"""``llmgw server init --patroni``: the pure parts (hosts, inventory, URL, env file, the
step lines), ansible-runner for real on small local playbooks, and the command's
refusals; the command end to end is in test_server_init_cluster.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from llmgw_runtime.cli.main import cli
from llmgw_runtime.errors import ConfigError, LlmgwError
from llmgw_runtime.store.db import redact_url
from llmgw_runtime.storeops import patroni
from llmgw_runtime.storeops.init import current_store
from llmgw_runtime.storeops.progress import Plan, Progress, failure_report
from llmgw_runtime.storeops.runner import run_playbook
from llmgw_runtime.storeops.switch import (
    Systemd,
    parse_env,
    set_env,
    write_env_file,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "server_init"

# ---------------------------------------------------------------- hosts and inventory


def test_user_at_host_with_optional_port_and_ipv6() -> None:
    assert patroni.parse_host("admin@db1.example.com") == \
        patroni.StoreHost("admin", "db1.example.com", None)
    assert patroni.parse_host("root@10.0.0.5:2222") == patroni.StoreHost("root", "10.0.0.5", 2222)
    assert patroni.parse_host("ops@[fd00::5]:22") == patroni.StoreHost("ops", "fd00::5", 22)


@pytest.mark.parametrize("text, says", [
    ("db1", "is not user@host"),
    ("@db1", "is not user@host"),
    ("admin@", "is not user@host"),
    ("ad min@db1", "is not a user name"),
    ("admin@db_1!", "is not a host name"),
    ("admin@db1:99999", "is not a TCP port"),
    ("admin@[fd00::5", "write an IPv6 address as [ADDRESS]:PORT"),
])
def test_a_malformed_host_is_refused_naming_it(text: str, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        patroni.parse_host(text)
    assert says in str(err.value) and repr(text) in str(err.value)


def test_an_even_number_of_voters_and_duplicates_are_refused_all_at_once() -> None:
    with pytest.raises(ConfigError) as err:
        patroni.parse_hosts(["a@db1", "b@DB1", "c@db3"])
    text = str(err.value)
    assert "db1 is given twice" in text.lower()
    assert "3 store host(s) + this control host make 4 etcd voters" in text
    assert "give 2 or 4 store hosts" in text
    assert patroni.voter_problem(2) is None and patroni.voter_problem(4) is None
    assert "give 2 store hosts" in (patroni.voter_problem(1) or "")


def test_the_inventory_puts_the_hosts_in_the_store_and_this_host_as_witness() -> None:
    hosts = patroni.parse_hosts(["admin@db1", "root@10.0.0.2:2222"])
    assert patroni.inventory(hosts, "ctl1") == {"all": {"children": {
        "llmgw_store": {"hosts": {
            "db1": {"ansible_host": "db1", "ansible_user": "admin",
                    "ansible_connection": "ssh"},
            "10.0.0.2": {"ansible_host": "10.0.0.2", "ansible_user": "root",
                         "ansible_connection": "ssh", "ansible_port": 2222}}},
        "llmgw_store_witness": {"hosts": {"ctl1": {
            "ansible_connection": "local",
            "ansible_python_interpreter": "{{ ansible_playbook_python }}"}}},
    }}}


def test_the_store_url_names_every_host_and_the_password_is_redacted() -> None:
    settings = patroni.StoreSettings()
    url = patroni.store_url(settings, "pw-1_x", [("db1", 5432), ("fd00::5", 5432)])
    assert url == ("postgresql://llmgw:pw-1_x@db1:5432,[fd00::5]:5432/llmgw"
                   "?target_session_attrs=read-write&connect_timeout=3")
    assert "pw-1_x" not in redact_url(url)
    assert patroni.same_store(url, url.replace("pw-1_x", "other"))
    assert not patroni.same_store(url, url.replace("db1:", "db9:"))
    assert not patroni.same_store("sqlite:////x/llmgw.db", url)


def test_passwords_are_made_once_0600_and_reused(tmp_path: Path) -> None:
    path = tmp_path / "state" / patroni.PASSWORDS_FILE
    first, created = patroni.load_or_create_passwords(path)
    again, created_again = patroni.load_or_create_passwords(path)
    assert created and not created_again and first == again
    assert set(first) == set(patroni.PASSWORD_KEYS)
    assert all(len(p) >= 20 for p in first.values()) and len(set(first.values())) == 3
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_the_store_in_use_comes_from_flags_then_the_env_file_then_the_state_dir() -> None:
    env = {"LLMGW_STATE_DIR": "/var/lib/llmgw", "LLMGW_DATABASE_URL": ""}
    assert current_store(None, None, env, Path(".llmgw")) == \
        current_store(None, None, env, Path("x"))
    got = current_store(None, None, env, Path(".llmgw"))
    assert got.url == "sqlite:////var/lib/llmgw/llmgw.db"
    assert got.state_dir == Path("/var/lib/llmgw")
    env["LLMGW_DATABASE_URL"] = "postgresql://u@h/db"
    assert current_store(None, None, env, Path(".llmgw")).url == "postgresql://u@h/db"
    assert current_store("sqlite:////a.db", "/s", env, Path(".llmgw")).url == "sqlite:////a.db"


# ---------------------------------------------------------------- the env file

ENV = """# Ansible managed
LLMGW_HOST=0.0.0.0
LLMGW_DATABASE_URL=
LLMGW_ADMIN_TOKEN=tok
export LLMGW_DATABASE_URL="sqlite:////old.db"
LLMGW_EXTRA=1
"""


def test_setting_the_database_url_keeps_every_other_line() -> None:
    out = set_env(ENV, "LLMGW_DATABASE_URL", "postgresql://llmgw:x@h1:5432,h2:5432/llmgw?a=b")
    assert out == ENV.replace("LLMGW_DATABASE_URL=\n",
                              "LLMGW_DATABASE_URL=postgresql://llmgw:x@h1:5432,h2:5432/"
                              "llmgw?a=b\n").replace('export LLMGW_DATABASE_URL="sqlite:'
                                                     '////old.db"\n', "")
    assert parse_env(out)["LLMGW_DATABASE_URL"].endswith("/llmgw?a=b")
    assert parse_env(out)["LLMGW_ADMIN_TOKEN"] == "tok"
    assert set_env("A=1", "B", "2") == "A=1\nB=2\n"
    assert parse_env('export X="quoted"\n# c=d\n') == {"X": "quoted"}


def test_the_env_file_keeps_its_mode_and_a_new_one_is_0600(tmp_path: Path) -> None:
    old = tmp_path / "control.env"
    old.write_text(ENV)
    old.chmod(0o640)
    write_env_file(old, "A=1\n")
    new = tmp_path / "new" / "control.env"
    write_env_file(new, "A=1\n")
    assert oct(old.stat().st_mode & 0o777) == "0o640" and old.read_text() == "A=1\n"
    assert oct(new.stat().st_mode & 0o777) == "0o600"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["control.env", "new"]


# ---------------------------------------------------------------- step lines


def ev(kind: str, **data: Any) -> dict[str, Any]:
    return {"event": kind, "event_data": data}


def test_one_line_per_step_from_runner_events() -> None:
    plan = Plan((("store | patroni", ("patroni : Install Patroni", "patroni : Start Patroni",
                                      "Extra")),))
    progress = Progress(plan, secrets=["hunter22"])
    events = [
        ev("playbook_on_start"), ev("playbook_on_play_start", play="store | patroni"),
        ev("playbook_on_task_start", task="Install Patroni", role="patroni"),
        ev("runner_on_start", host="store1"),
        ev("runner_on_ok", host="store2", task="Install Patroni", res={"changed": True}),
        ev("runner_on_ok", host="store1", task="Install Patroni", res={"changed": False}),
        ev("playbook_on_task_start", task="Start Patroni", role="patroni"),
        ev("runner_on_skipped", host="store2"),
        ev("runner_on_failed", host="store1", task="Start Patroni", role="patroni",
           res={"msg": "password hunter22 rejected"}),
        ev("playbook_on_handler_task_start", task="Restart etcd", role="etcd"),
        ev("runner_on_unreachable", host="store2", task="Restart etcd", role="etcd",
           res={"msg": "ssh: connect to host store2 port 22: No route to host"}),
        ev("playbook_on_task_start", task="Extra"),
        ev("playbook_on_stats", ok={"store1": 1}, changed={"store2": 1}),
    ]
    lines = [line for e in events for line in progress.feed(e)] + progress.finish(2)
    assert lines == [
        "[1/3] patroni : Install Patroni  store2 changed, store1 ok",
        "[2/3] patroni : Start Patroni  store1 FAILED, store2 skipped",
        "[+] etcd : Restart etcd  store2 UNREACHABLE",
        "[3/3] Extra",
    ]
    out = progress.outcome
    assert not out.ok and out.steps == 3 and out.handlers == 1 and out.changed_total == 1
    report = failure_report(out, "llmgw server init --patroni a@store1 b@store2")
    assert "store1: step 'patroni : Start Patroni' failed: password *** rejected" in report
    assert "store2: step 'etcd : Restart etcd' cannot be reached: ssh: connect" in report
    assert "ssh USER@HOST" in report and "re-run `llmgw server init --patroni" in report
    assert "hunter22" not in report + "\n".join(lines)


def test_ansible_errors_outside_any_step_are_reported_with_their_context() -> None:
    progress = Progress()
    for text in ("\x1b[0;31m[ERROR]: the role 'patroni' was not found\x1b[0m",
                 "\x1b[0;31mOrigin: /x/store.yml:5:7\x1b[0m", "", "5     - role: patroni"):
        progress.feed({"event": "verbose", "stdout": text})
    progress.finish(1)
    report = failure_report(progress.outcome, "RERUN")
    assert not progress.outcome.ok
    assert report.startswith("ansible-playbook stopped:\n  [ERROR]: the role 'patroni' was "
                             "not found\n  Origin: /x/store.yml:5:7\n  5     - role: patroni\n")
    assert "Fix what ansible-playbook reports, then re-run `RERUN`" in report


def test_nothing_changed_is_said_at_the_end() -> None:
    progress = Progress()
    for e in (ev("playbook_on_task_start", task="A"), ev("runner_on_ok", host="h", res={}),
              ev("playbook_on_stats", ok={"h": 1, "w": 1}, changed={})):
        progress.feed(e)
    assert progress.outcome.summary() == "1 steps, nothing changed (h ok=1 changed=0, " \
                                         "w ok=1 changed=0)"


# ---------------------------------------------------------------- ansible-runner for real


def local_inventory(*names: str) -> dict[str, Any]:
    hosts = [patroni.StoreHost("nobody", n) for n in names]
    return patroni.inventory(hosts, "witness", connection="local")


def test_a_real_run_prints_a_line_per_step_and_reports_the_failing_host() -> None:
    lines: list[str] = []
    outcome = run_playbook(FIXTURES / "progress.yml", local_inventory("s1", "s2"),
                           {"fail_here": "s2", "leak": " (pw=Sekr1t)"}, lines.append,
                           secrets=["Sekr1t"])
    assert lines == [
        "[1/6] Look around  s1 ok, s2 ok, witness ok",
        "[2/6] Change something  s1 changed, s2 changed, witness changed",
        "[3/6] Change something quietly  s1 changed, s2 changed, witness changed",
        "[4/6] Skip on every host  s1 skipped, s2 skipped, witness skipped",
        "[5/6] Break on purpose  s2 FAILED, s1 skipped, witness skipped",
        "[6/6] After the failure  s1 ok, witness ok",
    ]
    assert not outcome.ok
    assert [(f.host, f.task) for f in outcome.failures] == [("s2", "Break on purpose")]
    assert outcome.failures[0].message == "the disk is full on s2 (pw=***)"


def test_a_real_run_without_failures_counts_the_changes() -> None:
    lines: list[str] = []
    outcome = run_playbook(FIXTURES / "store.yml", local_inventory("s1", "s2"),
                           patroni.extravars(patroni.StoreSettings(),
                                             {k: "x" * 24 for k in patroni.PASSWORD_KEYS}),
                           lines.append)
    assert outcome.ok and outcome.changed_total == 0
    assert lines == ["[1/2] Check the store variables are given  s1 ok, s2 ok, witness ok",
                     "[2/2] Say which group this host is in  s1 ok, s2 ok, witness ok"]


# ---------------------------------------------------------------- the command's refusals


def test_bad_hosts_are_refused_before_anything_runs(tmp_path: Path) -> None:
    env = tmp_path / "control.env"
    result = CliRunner().invoke(cli, ["server", "--state-dir", str(tmp_path), "init",
                                      "--patroni", "a@db1", "b@db2", "db3",
                                      "--env-file", str(env)])
    assert result.exit_code == 1
    assert "'db3' is not user@host" in result.output
    assert "4 etcd voters" in result.output
    assert not env.exists() and not (tmp_path / patroni.PASSWORDS_FILE).exists()


def test_the_test_only_options_are_hidden_from_help() -> None:
    result = CliRunner().invoke(cli, ["server", "init", "--help"])
    assert result.exit_code == 0 and "--playbooks" in result.output
    assert "--connection" not in result.output and "--store-url-hosts" not in result.output
    assert "--known-hosts" in result.output and "--ssh-key" in result.output
    assert "/etc/llmgw/control.env" in result.output


def test_systemd_is_asked_through_systemctl(tmp_path: Path) -> None:
    log = tmp_path / "calls"
    fake = tmp_path / "systemctl"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {log}\n'
                    'case "$1" in is-active) exit 3;; start) echo "unit failed" >&2; exit 1;; '
                    'esac\n')
    fake.chmod(0o755)
    unit = Systemd(systemctl=str(fake))
    assert not unit.is_active()
    unit.stop()
    with pytest.raises(LlmgwError) as err:
        unit.start()
    assert "`systemctl start llmgw-control` failed: unit failed" in str(err.value)
    assert log.read_text().splitlines() == ["is-active --quiet llmgw-control",
                                            "stop llmgw-control", "start llmgw-control"]
