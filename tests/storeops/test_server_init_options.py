"""``llmgw server init``: the re-run it prints repeats every option given, so after a
changed key it checks the known_hosts file its fix commands name (issue 28, 17); a control
host without systemd is refused in the first step, before ssh and before anything is
written (18). ssh is faked at the one place the check runs it (ssh._run)."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from llmgw_runtime.cli.main import cli
from llmgw_runtime.storeops import init as init_module
from llmgw_runtime.storeops import patroni, ssh

CHANGED = ("@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@\n"
           "@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\n"
           "The fingerprint for the ED25519 key sent by the remote host is\n"
           "SHA256:bm90IHRoZSBvbGQga2V5.\n"
           "Offending ED25519 key in {kh}:1\n"
           "Host key verification failed.\n")


@pytest.fixture
def site(tmp_path: Path) -> dict[str, Path]:
    playbooks = tmp_path / "playbooks"
    playbooks.mkdir()
    (playbooks / "store.yml").write_text("---\n[]\n")
    systemd = tmp_path / "run-systemd-system"
    systemd.mkdir()
    key = tmp_path / "id_store"
    key.write_text("not a key\n")
    return {"state": tmp_path / "state", "env": tmp_path / "etc" / "control.env",
            "kh": tmp_path / "hosts" / "known_hosts", "key": key, "playbooks": playbooks,
            "systemd": systemd}


def fake_ssh(monkeypatch: pytest.MonkeyPatch, calls: list[list[str]]) -> None:
    """ssh refuses every host: its key changed (as the known_hosts file given says)."""
    def run(argv: list[str], timeout_s: float, stdin: str | None = None
            ) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        given = [a.split("=", 1)[1] for a in argv if a.startswith("UserKnownHostsFile=")]
        kh = given[0] if given else str(Path("~/.ssh/known_hosts").expanduser())
        if "-G" in argv:
            return subprocess.CompletedProcess(argv, 0, f"port 22\nuserknownhostsfile {kh}\n",
                                               "")
        return subprocess.CompletedProcess(argv, 255, "", CHANGED.format(kh=kh))
    monkeypatch.setattr(ssh, "_run", run)


def invoke(args: list[str]) -> Result:
    return CliRunner().invoke(cli, args, env={"LLMGW_DATABASE_URL": None,
                                              "LLMGW_STATE_DIR": None})


def rerun_of(out: str) -> list[str]:
    flat = " ".join(out.split())
    command = flat.split("re-run `", 1)[1].split("`", 1)[0]
    return shlex.split(command)


def test_the_rerun_repeats_every_option_and_checks_the_file_the_fix_names(
        site: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []
    fake_ssh(monkeypatch, calls)
    first = invoke(["server", "--state-dir", str(site["state"]), "init", "--patroni",
                    "admin@db1", "admin@db2", "--env-file", str(site["env"]),
                    "--known-hosts", str(site["kh"]), "--ssh-key", str(site["key"]),
                    "--playbooks", str(site["playbooks"]), "--allow", "10.1.2.0/24",
                    "--allow", "10.9.0.0/16", "--store-port", "6432",
                    "--systemd-dir", str(site["systemd"])])
    out = first.output
    assert first.exit_code == 1, out
    assert "its ssh host key has CHANGED" in out
    flat = " ".join(out.split())
    assert f"`ssh-keygen -R db1 -f {site['kh']}`" in flat
    assert f"`ssh-keyscan db1 >> {site['kh']}`" in flat
    rerun = rerun_of(out)
    assert rerun[:6] == ["llmgw", "server", "--state-dir", str(site["state"]), "init",
                         "--patroni"]
    assert rerun[6:8] == ["admin@db1", "admin@db2"]
    words = " ".join(rerun)
    for given in (f"--env-file {site['env']}", f"--known-hosts {site['kh']}",
                  f"--ssh-key {site['key']}", f"--playbooks {site['playbooks']}",
                  "--allow 10.1.2.0/24 --allow 10.9.0.0/16", "--store-port 6432"):
        assert given in words, words
    assert not site["state"].exists() and not site["env"].parent.exists()

    # Run the re-run as printed: ssh checks the very file the fix commands named.
    calls.clear()
    again = invoke(rerun[1:])
    assert again.exit_code == 1, again.output
    checked = {a for argv in calls for a in argv if a.startswith("UserKnownHostsFile=")}
    assert checked == {f"UserKnownHostsFile={site['kh']}"}
    assert rerun_of(again.output) == rerun


def test_a_control_host_without_systemd_is_refused_first_and_nothing_is_written(
        site: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []
    fake_ssh(monkeypatch, calls)
    result = invoke(["server", "--state-dir", str(site["state"]), "init", "--patroni",
                     "admin@db1", "admin@db2", "--env-file", str(site["env"]),
                     "--known-hosts", str(site["kh"]), "--playbooks", str(site["playbooks"]),
                     "--systemd-dir", str(site["systemd"] / "absent")])
    out = " ".join(result.output.split())
    assert result.exit_code == 1, out
    assert "server init cannot start; nothing was done anywhere" in out
    assert f"does not run systemd ({site['systemd'] / 'absent'} is missing" in out
    assert "it is the etcd witness" in out
    assert "run `llmgw server init` from a host (or VM) booted with systemd" in out
    assert "add `--witness USER@HOST`" in out
    assert f"re-run `llmgw server --state-dir {site['state']} init --patroni admin@db1" in out
    assert "==> 2/6" not in out and "[1/" not in out
    assert calls == []                                   # no ssh login, not even ssh -G
    assert not site["state"].exists()                    # no passwords file
    assert not (site["state"] / patroni.PASSWORDS_FILE).exists()
    assert not site["env"].parent.exists()               # no store.env
    assert init_module.SYSTEMD_DIR == Path("/run/systemd/system")   # the one it probes


def test_a_witness_host_named_instead_of_this_one_is_checked_over_ssh(
        site: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """Without systemd here, --witness names another host to run the third etcd vote: this
    host's systemd is not asked, the witness's key, python3 and sudo are checked with the
    store hosts', and the re-run keeps it."""
    calls: list[list[str]] = []
    fake_ssh(monkeypatch, calls)
    result = invoke(["server", "--state-dir", str(site["state"]), "init", "--patroni",
                     "admin@db1", "admin@db2", "--witness", "ops@wit1:2222",
                     "--env-file", str(site["env"]), "--known-hosts", str(site["kh"]),
                     "--playbooks", str(site["playbooks"]),
                     "--systemd-dir", str(site["systemd"] / "absent")])
    out = " ".join(result.output.split())
    assert result.exit_code == 1, out
    assert "does not run systemd" not in out
    assert "ops@wit1:2222: its ssh host key has CHANGED" in out
    assert "admin@db1: its ssh host key" in out and "admin@db2: its ssh host key" in out
    assert "--witness ops@wit1:2222" in " ".join(rerun_of(result.output))
    assert not site["state"].exists()

    wit = patroni.parse_host("ops@wit1:2222")
    hosts = patroni.parse_hosts(["admin@db1", "admin@db2"])
    inv = patroni.inventory(hosts, "ctl", seen_at={"db1": "10.0.0.9"}, witness=wit)
    assert inv["all"]["children"]["llmgw_store_witness"] == {"hosts": {"wit1": {
        "ansible_host": "wit1", "ansible_user": "ops", "ansible_connection": "ssh",
        "ansible_port": 2222}}}
    assert init_module.store_values("postgresql://x", ["db1", "db2"],
                                    patroni.StoreSettings(), "wit1")["LLMGW_ETCD_URLS"] == \
        "http://db1:2379,http://db2:2379,http://wit1:2379"
    with pytest.raises(Exception, match="make 4 etcd voters"):
        patroni.parse_hosts(["a@db1", "a@db2", "a@db3"], "the witness wit1")


def test_the_systemd_refusal_names_both_ways_out(site: dict[str, Path]) -> None:
    problem = init_module.witness_problem("ctl", Path("/run/systemd/system"), False)
    assert problem is not None
    assert "run `llmgw server init` from a host (or VM) booted with systemd" in problem
    assert "add `--witness USER@HOST`" in problem
    assert init_module.witness_problem("ctl", Path("/x"), True) is None
