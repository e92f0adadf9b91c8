"""``llmgw server init``: what is checked before any host changes (this host's tools, the
store hosts over ssh, and the store playbook's first play: systemd and free ports on every
etcd voter), the progress lines counted up front, the addresses pg_hba admits, and the one
owner of the control service's database URL (store.env). Real ansible-playbook runs on
this machine (local connection) where Ansible is needed."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from llmgw_runtime.cli.main import cli
from llmgw_runtime.errors import ConfigError
from llmgw_runtime.storeops import patroni
from llmgw_runtime.storeops.init import current_store, login_advice, store_values
from llmgw_runtime.storeops.progress import HIDDEN, Progress, failure_report, parse_plan
from llmgw_runtime.storeops.runner import (
    INSTALL,
    judge_local,
    local_problems,
    missing_collections,
    run_playbook,
)
from llmgw_runtime.storeops.ssh import HostFacts, judge_facts, parse_probe
from llmgw_runtime.storeops.switch import parse_env, store_env_text

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "server_init"
PASSWORDS = {k: f"{k[:6]}-Sekr1t-" + "x" * 16 for k in patroni.PASSWORD_KEYS}


def ev(kind: str, stdout: str = "", **data: Any) -> dict[str, Any]:
    return {"event": kind, "stdout": stdout, "event_data": data}


def local_inventory(*names: str) -> dict[str, Any]:
    hosts = [patroni.StoreHost("nobody", n) for n in names]
    return patroni.inventory(hosts, "witness", connection="local")


def _pid1_is_systemd() -> bool:
    return Path("/run/systemd/system").is_dir()


# ---------------------------------------------------------------- this host's tools


def test_missing_tools_are_named_with_the_one_install_that_brings_them(tmp_path: Path) -> None:
    assert judge_local(True, "/x/ansible-playbook", []) == []
    [problem] = judge_local(False, None, ["community.postgresql"])
    assert "ansible-runner" in problem and "ansible-playbook" in problem
    assert "community.postgresql" in problem
    assert "pip install 'llmgw[server-init]'" in problem and INSTALL in problem
    # Collections are looked up where ansible-playbook looks: found in one root, or not.
    root = tmp_path / "site"
    (root / "ansible_collections" / "community" / "postgresql").mkdir(parents=True)
    assert missing_collections(["community.postgresql"], [tmp_path / "none", root]) == []
    assert missing_collections(["community.postgresql"], [tmp_path / "none"]) == \
        ["community.postgresql"]


def test_the_server_init_extra_brings_every_tool() -> None:
    """`pip install 'llmgw[server-init]'` (the Makefile installs it for the tests) gives
    server init everything: nothing is reported missing for the repository's playbooks."""
    assert local_problems(ROOT / "playbooks") == []


def test_agents_routers_and_the_control_service_never_load_ansible_runner() -> None:
    """ansible-runner is the server-init extra's, not the base package's: the agent, the
    router, the control service and the CLI (server init's command included) import and
    run without it."""
    modules = ["llmgw_runtime.cli.main", "llmgw_runtime.control.app",
               "llmgw_runtime.router.app", "llmgw_runtime.agent.loop"]
    code = ("import sys, " + ", ".join(modules) + "\n"
            "print(','.join(sorted(m for m in sys.modules "
            "if m.split('.')[0] in ('ansible_runner', 'ansible'))))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"importing the services loaded {done.stdout}"


def test_the_base_package_does_not_depend_on_ansible() -> None:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = " ".join(project["dependencies"]).lower()
    assert "ansible" not in base
    extra = " ".join(project["optional-dependencies"]["server-init"]).lower()
    assert all(p in extra for p in ("ansible-core", "ansible-runner", "ansible>="))
    makefile = (ROOT / "Makefile").read_text()
    assert "server-init" in makefile.split("$(BIN)/pip install -q -e '.[")[1].split("]")[0]
    common = (ROOT / "roles" / "llmgw_common" / "defaults" / "main.yml").read_text()
    assert "llmgw_common_extras: []" in common        # agents and routers: the base only


def test_bad_allowed_networks_are_refused_all_at_once_before_anything_is_written(
        tmp_path: Path) -> None:
    playbooks = tmp_path / "playbooks"
    playbooks.mkdir()
    (playbooks / "store.yml").write_text("---\n[]\n")
    env = tmp_path / "control.env"
    result = CliRunner().invoke(cli, [
        "server", "--state-dir", str(tmp_path / "state"), "init", "--patroni", "a@db1",
        "b@db2", "--env-file", str(env), "--playbooks", str(playbooks),
        "--allow", "10.0.0.1/24", "--allow", "0.0.0.0/0"])
    out = result.output
    assert result.exit_code == 1, out
    assert "server init cannot start; nothing was done anywhere" in out
    assert "--allow '10.0.0.1/24'" in out and "has host bits set" in out
    assert "--allow '0.0.0.0/0' admits every address" in out
    assert not env.exists() and not (tmp_path / "state").exists()


def test_llmgw_installed_without_the_repository_asks_for_the_playbooks(tmp_path: Path) -> None:
    """As on a control host the llmgw_common role installed (a wheel): the package alone,
    no playbooks/ next to it. The command stops before anything, saying what to pass."""
    import shutil

    site = tmp_path / "site-packages"
    shutil.copytree(ROOT / "llmgw_runtime", site / "llmgw_runtime",
                    ignore=shutil.ignore_patterns("__pycache__"))
    env = tmp_path / "control.env"
    done = subprocess.run(
        [sys.executable, "-c", "from llmgw_runtime.cli.main import main; main()", "server",
         "--state-dir", str(tmp_path / "state"), "init", "--patroni", "a@db1", "b@db2",
         "--env-file", str(env)],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site), "HOME": str(tmp_path)})
    out = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 1, out
    assert "server init cannot start; nothing was done anywhere" in out
    assert ("playbooks/store.yml is not next to this llmgw (it was installed from a wheel, "
            "without the repository): pass --playbooks DIR, the playbooks/ directory of an "
            "llmgw checkout of the same version") in out
    assert not env.exists() and not (tmp_path / "state").exists()


# ---------------------------------------------------------------- the store hosts over ssh


def test_what_a_store_host_lacks_is_named_with_the_fix() -> None:
    facts = parse_probe("ssh_connection=10.9.8.7 50122 10.0.0.5 22\nuid=1000\n")
    assert facts == HostFacts(client_address="10.9.8.7", root=False, python3=False,
                              sudo=False)
    host = patroni.parse_host("admin@db1:2222")
    kinds = {p.kind: p.message for p in judge_facts(host, facts)}
    assert set(kinds) == {"python", "sudo"}
    assert "`ssh -p 2222 admin@db1 sudo apt-get install -y python3`" in kinds["python"]
    assert "admin ALL=(ALL) NOPASSWD: ALL" in kinds["sudo"]
    assert judge_facts(host, parse_probe("uid=0\npython3=yes\n")) == []
    assert judge_facts(host, parse_probe("uid=7\npython3=yes\nsudo=yes\n")) == []
    assert parse_probe("ssh_connection=not-an-ip 1 2 3\n").client_address is None


def test_pg_hba_admits_where_each_store_host_sees_this_host_and_given_networks() -> None:
    hosts = patroni.parse_hosts(["a@db1", "b@db2"])
    inv = patroni.inventory(hosts, "ctl", seen_at={"db1": "10.9.0.4", "db2": "10.9.0.4"},
                            witness_address="10.9.0.4")
    store = inv["all"]["children"]["llmgw_store"]["hosts"]
    assert store["db1"]["llmgw_store_control_address"] == "10.9.0.4"
    assert inv["all"]["children"]["llmgw_store_witness"]["hosts"]["ctl"][
        "llmgw_store_address"] == "10.9.0.4"
    assert patroni.pick_witness_address({"db1": "10.9.0.4", "db2": "10.9.0.4"},
                                        lambda a: True) == "10.9.0.4"
    assert patroni.pick_witness_address({"db1": "10.9.0.4", "db2": "10.9.0.5"},
                                        lambda a: True) is None
    assert patroni.pick_witness_address({"db1": "10.9.0.4"}, lambda a: False) is None
    assert patroni.parse_networks(["10.1.2.0/24", "fd00::/64", "10.1.2.0/24",
                                   "192.0.2.7"]) == ["10.1.2.0/24", "fd00::/64",
                                                     "192.0.2.7/32"]
    with pytest.raises(ConfigError) as err:
        patroni.parse_networks(["10.1.2.3/24", "nonsense", "::/0"])
    assert len(err.value.details) == 3
    assert patroni.extravars(patroni.StoreSettings(), PASSWORDS, ["10.1.2.0/24"])[
        "llmgw_store_allowed_cidrs"] == ["10.1.2.0/24"]


def test_a_refused_login_says_which_address_to_allow() -> None:
    settings = patroni.StoreSettings()
    error = ('connection to server at "db1" (10.0.0.5), port 5432 failed: FATAL:  no '
             'pg_hba.conf entry for host "172.16.4.9", user "llmgw", database "llmgw", '
             "no encryption")
    advice = login_advice(error, settings, "llmgw server init --patroni a@db1 b@db2")
    assert "do not admit 172.16.4.9, the address this host connects" in advice
    assert "`llmgw server init --patroni a@db1 b@db2 --allow 172.16.4.9/32`" in advice
    assert "makes role" not in advice
    assert "store-passwords.json" in login_advice(
        'FATAL:  password authentication failed for user "llmgw"', settings, "R")


# ---------------------------------------------------------------- the playbook's preflight


@pytest.mark.skipif(_pid1_is_systemd(), reason="this machine runs systemd")
def test_a_voter_without_systemd_stops_the_store_playbook_before_any_host_changes() -> None:
    """The real playbooks/store.yml on this machine (no systemd, as a control host in a
    container): its first play refuses every voter, the witness named as such, and no
    step that installs anything starts. The steps are counted before the run."""
    lines: list[str] = []
    outcome = run_playbook(ROOT / "playbooks" / "store.yml", local_inventory("s1", "s2"),
                           patroni.extravars(patroni.StoreSettings(), PASSWORDS),
                           lines.append, secrets=list(PASSWORDS.values()))
    assert not outcome.ok
    failed = {f.host: f for f in outcome.failures}
    assert set(failed) == {"s1", "s2", "witness"}, outcome.failures
    assert {f.task for f in failed.values()} == {"etcd : Preflight | every voter runs systemd"}
    assert "witness (this control host, the etcd witness) does not run systemd" in \
        failed["witness"].message
    assert "nothing was changed" in failed["s1"].message
    totals = {line.split("]")[0].split("/")[-1] for line in lines}
    assert len(totals) == 1 and all(line.startswith("[") for line in lines), lines
    assert lines[0].startswith("[1/") and "[+]" not in "".join(lines)
    assert not any("Install" in line for line in lines), lines
    assert not any(p in "\n".join(lines) for p in PASSWORDS.values())
    report = failure_report(outcome, "RERUN")
    assert "does not run systemd" in report and "re-run `RERUN`" in report


def test_a_port_held_by_another_program_is_refused_naming_it() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        for var, task in (("llmgw_etcd_client_port", "etcd's ports are free"),
                          ("llmgw_store_port", "PostgreSQL's and Patroni's ports are free")):
            lines: list[str] = []
            outcome = run_playbook(FIXTURES / "ports.yml", local_inventory("s1"),
                                   {var: port}, lines.append)
            assert not outcome.ok, lines
            [failure] = [f for f in outcome.failures if f.host == "s1"]
            assert failure.task == f"Preflight | {task}"
            assert f"port {port} users:((" in failure.message
            assert "already in use by another program" in failure.message
    # Free ports pass.
    outcome = run_playbook(FIXTURES / "ports.yml", local_inventory("s1"),
                           {"llmgw_etcd_client_port": port, "llmgw_store_port": port},
                           lambda _: None)
    assert outcome.ok, outcome.failures


# ---------------------------------------------------------------- progress


STORE_LIST = """
playbook: store.yml

  play #1 (llmgw_store:llmgw_store_witness): store | preflight\tTAGS: []
    tasks:
      Preflight | facts\tTAGS: []
      etcd : Preflight | systemd\tTAGS: []

  play #2 (llmgw_control): store | control hosts' addresses\tTAGS: []
    pattern: ['llmgw_control']
    hosts (0):
    tasks:
      Addresses | facts\tTAGS: []

  play #3 (llmgw_store): store | patroni\tTAGS: []
    tasks:
      patroni : Database | the llmgw role\tTAGS: [database, patroni]
      patroni : Service | wait\tTAGS: [patroni, service]
"""


def test_steps_are_counted_up_front_and_a_handler_is_one_line() -> None:
    plan = parse_plan(STORE_LIST)
    assert plan is not None and plan.total == 4     # the play matching no host runs nothing
    progress = Progress(plan, secrets=["Sekr1t"])
    censored = {"censored": "the output has been hidden due to the fact that 'no_log: "
                            "true' was specified for this result"}
    events = [
        ev("playbook_on_play_start", name="store | preflight"),
        ev("playbook_on_task_start", task="Preflight | facts"),
        ev("runner_on_ok", host="db1", res={"changed": False}),
        ev("playbook_on_task_start", task="Preflight | systemd", role="etcd"),
        ev("runner_on_ok", host="db1", res={}),
        ev("playbook_on_no_hosts_matched", play="store | control hosts' addresses"),
        ev("playbook_on_play_start", name="store | control hosts' addresses"),
        ev("playbook_on_play_start", name="store | patroni"),
        ev("playbook_on_task_start", task="Database | the llmgw role", role="patroni"),
        ev("runner_on_ok", "changed: [db1]", host="db1", res=censored),
        ev("runner_on_ok", "ok: [db2]", host="db2", res=censored),
        # A handler with throttle: Ansible announces it once per host.
        ev("playbook_on_handler_task_start", task="Restart etcd", role="etcd"),
        ev("runner_on_ok", host="db1", res={"changed": True}),
        ev("playbook_on_handler_task_start", task="Restart etcd", role="etcd"),
        ev("runner_on_ok", host="db2", res={"changed": True}),
        ev("playbook_on_handler_task_start", task="Restart etcd", role="etcd"),
        ev("runner_on_ok", host="ctl", res={"changed": True}),
        ev("playbook_on_task_start", task="Service | wait", role="patroni"),
        ev("runner_on_failed", '[ERROR]: Task failed: Module failed: unable to connect to '
           'database: password Sekr1t refused\nfatal: [db1]: FAILED! => {"censored": '
           '"..."}', host="db1", task="Service | wait", role="patroni", res=censored),
        ev("runner_on_failed", "fatal: [db2]: FAILED! => {}", host="db2",
           task="Service | wait", role="patroni", res=censored),
        ev("playbook_on_stats", ok={"db1": 3}, changed={"db1": 2}),
    ]
    lines = [line for e in events for line in progress.feed(e)] + progress.finish(2)
    assert lines == [
        "[1/4] Preflight | facts  db1 ok",
        "[2/4] etcd : Preflight | systemd  db1 ok",
        "[3/4] patroni : Database | the llmgw role  db1 changed, db2 ok",
        "[+] etcd : Restart etcd  ctl changed, db1 changed, db2 changed",
        "[4/4] patroni : Service | wait  db1 FAILED, db2 FAILED",
    ]
    messages = {f.host: f.message for f in progress.outcome.failures}
    assert messages == {"db1": "unable to connect to database: password *** refused",
                        "db2": HIDDEN}


# ---------------------------------------------------------------- one owner of the URL


def test_the_store_env_file_wins_over_the_roles_env_file() -> None:
    role = {"LLMGW_STATE_DIR": "/var/lib/llmgw",
            "LLMGW_DATABASE_URL": "sqlite:////var/lib/llmgw/llmgw.db"}
    store = {"LLMGW_DATABASE_URL": "postgresql://llmgw:pw@db1:5432,db2:5432/llmgw"}
    assert current_store(None, None, role, Path("x"), store).url == store["LLMGW_DATABASE_URL"]
    assert current_store(None, None, role, Path("x"), {}).url == role["LLMGW_DATABASE_URL"]
    values = store_values("postgresql://u:p@db1:5432/llmgw", ["db1", "fd00::5"],
                          patroni.StoreSettings())
    assert values["LLMGW_ETCD_URLS"] == ("http://db1:2379,http://[fd00::5]:2379,"
                                         "http://127.0.0.1:2379")
    assert values["LLMGW_PATRONI_URLS"] == "http://db1:8008,http://[fd00::5]:8008"
    text = store_env_text("", values)
    assert text.startswith("# Written by `llmgw server init`") and parse_env(text) == values
    assert store_env_text(text, values) == text


def _render_control(tmp_path: Path, store_env: str | None) -> dict[str, Any]:
    config = tmp_path / "etc"
    out = tmp_path / "out"
    config.mkdir(exist_ok=True)
    out.mkdir(exist_ok=True)
    if store_env is not None:
        (config / "store.env").write_text(store_env)
    lines: list[str] = []
    outcome = run_playbook(FIXTURES / "control_env.yml", local_inventory("ctl1"),
                           {"config_dir": str(config), "out_dir": str(out)}, lines.append)
    assert outcome.ok, (lines, outcome.failures)
    unit = (out / "llmgw-control.service").read_text()
    env: dict[str, str] = {}
    # What systemd hands the service: each EnvironmentFile in order, later values win
    # ("-": optional, skipped when absent).
    for line in unit.splitlines():
        if line.startswith("EnvironmentFile="):
            path = Path(line.split("=", 1)[1].lstrip("-"))
            if path.name == "control.env":
                path = out / "control.env"
            if path.is_file():
                env.update(parse_env(path.read_text()))
    return {"env": env, "control": (out / "control.env").read_text(), "unit": unit,
            "in_use": (out / "in_use").read_text().strip()}


def test_a_site_yml_run_after_server_init_keeps_the_cluster(tmp_path: Path) -> None:
    """The llmgw_control role's templates and store.env reading, rendered by Ansible."""
    before = _render_control(tmp_path, None)
    assert before["env"]["LLMGW_DATABASE_URL"] == "sqlite:////var/lib/llmgw/llmgw.db"
    assert before["in_use"] == "sqlite:////var/lib/llmgw/llmgw.db"
    url = "postgresql://llmgw:pw@db1:5432,db2:5432/llmgw?target_session_attrs=read-write"
    after = _render_control(tmp_path, store_env_text("", {"LLMGW_DATABASE_URL": url}))
    assert after["env"]["LLMGW_DATABASE_URL"] == url          # what the service gets
    assert after["in_use"] == url                           # what preflight checks
    assert "sqlite" not in after["control"]                 # control.env names no store
    assert f"EnvironmentFile=-{tmp_path / 'etc' / 'store.env'}" in after["unit"]
    assert after["unit"].index("control.env") < after["unit"].index("store.env")
    # No task of the role writes store.env: server init is its one owner.
    tasks = "\n".join(p.read_text() for p in (ROOT / "roles" / "llmgw_control").rglob("*.yml"))
    assert "dest: \"{{ _llmgw_control_store_env_file" not in tasks
    assert json.dumps(url) not in after["control"]


def test_each_store_hosts_pg_hba_admits_the_address_it_sees_and_the_allowed_networks(
        tmp_path: Path) -> None:
    """The patroni role's template, rendered by Ansible from the inventory and variables
    server init builds: a control host whose default address (10.0.0.9 here) is not the
    one it connects from (172.16.4.9, a management network) is still admitted."""
    import yaml

    hosts = patroni.parse_hosts(["a@10.0.0.1", "b@10.0.0.2"])
    inv = patroni.inventory(hosts, "witness", connection="local",
                            seen_at={"10.0.0.1": "172.16.4.9", "10.0.0.2": "172.16.5.9"})
    inv["all"]["children"]["llmgw_store_witness"]["hosts"]["witness"][
        "llmgw_store_address"] = "10.0.0.9"
    outcome = run_playbook(FIXTURES / "pg_hba.yml", inv,
                           {"out_dir": str(tmp_path), **patroni.extravars(
                               patroni.StoreSettings(), PASSWORDS, ["10.1.2.0/24"])},
                           lambda _: None, secrets=list(PASSWORDS.values()))
    assert outcome.ok, outcome.failures
    for host, seen in (("10.0.0.1", "172.16.4.9"), ("10.0.0.2", "172.16.5.9")):
        hba = yaml.safe_load((tmp_path / f"{host}.yml").read_text())["postgresql"]["pg_hba"]
        assert f"host all all {seen}/32 scram-sha-256" in hba
        assert "host all all 10.0.0.9/32 scram-sha-256" in hba      # the witness, as before
        assert "host all all 10.1.2.0/24 scram-sha-256" in hba      # --allow
    other = yaml.safe_load((tmp_path / "10.0.0.1.yml").read_text())["postgresql"]["pg_hba"]
    assert "host all all 172.16.5.9/32 scram-sha-256" not in other  # each host its own
