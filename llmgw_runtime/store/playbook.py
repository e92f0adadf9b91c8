"""Running a playbook through ansible-runner with one line per step, over ssh that checks
every host's key.

:class:`Progress` folds ansible-runner's event dicts into lines (pure, fed sample events in
the tests); :func:`run_playbook` is the thin shell around ``ansible_runner.run``.
:class:`SshTrust` is how ssh checks the hosts' keys (strictly, against known_hosts), for
the playbook and for :func:`check_host_keys`, which asks ssh itself before anything
changes; :func:`judge_ssh` turns what ssh said into the problem and the command to fix it
(pure)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import LlmgwError
from .patroni import StoreHost

_HOST_ORDER = ("failed", "unreachable", "changed", "ok", "skipped")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class PlaybookError(LlmgwError):
    reason = "playbook_failed"


@dataclass(frozen=True)
class Failure:
    host: str
    task: str
    message: str
    unreachable: bool = False


@dataclass
class Outcome:
    """What a whole run did."""

    ok: bool
    steps: int
    changed: dict[str, int] = field(default_factory=dict)
    oks: dict[str, int] = field(default_factory=dict)
    failures: list[Failure] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)   # ansible's own ERROR! lines

    @property
    def changed_total(self) -> int:
        return sum(self.changed.values())

    def summary(self) -> str:
        hosts = sorted(set(self.oks) | set(self.changed))
        per_host = ", ".join(f"{h} ok={self.oks.get(h, 0)} changed={self.changed.get(h, 0)}"
                             for h in hosts)
        verdict = ("nothing changed" if self.changed_total == 0
                   else f"{self.changed_total} change(s)")
        return f"{self.steps} steps, {verdict} ({per_host or 'no hosts'})"


def task_label(event_data: dict[str, Any]) -> str:
    """``role : task`` as ansible prints it."""
    task = str(event_data.get("task") or event_data.get("name") or "?").strip()
    role = event_data.get("role")
    return f"{role} : {task}" if role else task


def failure_message(res: dict[str, Any]) -> str:
    """The useful part of a failed task's result."""
    for key in ("msg", "stderr", "module_stderr", "reason", "stdout", "censored"):
        value = res.get(key)
        if isinstance(value, str) and value.strip():
            lines = value.strip().splitlines()
            return "\n".join(lines[:8]) + (" ..." if len(lines) > 8 else "")
    return "no message (run ansible-playbook by hand with -v for details)"


def redact(text: str, secrets: list[str]) -> str:
    for s in secrets:
        if s:
            text = text.replace(s, "***")
    return text


def _rank(result: str) -> int:
    """Failures first, then changes, then the rest."""
    word = result.split()[0].lower()
    return _HOST_ORDER.index(word) if word in _HOST_ORDER else len(_HOST_ORDER)


class Progress:
    """Folds ansible-runner events into one line per step: the line of a step is made when
    the next step starts or the play ends. ``feed`` returns the lines that are complete."""

    def __init__(self, listed: list[str] | None = None,
                 secrets: list[str] | None = None) -> None:
        # The total counts the listed tasks plus each unlisted one that runs (tasks of a
        # dynamic include, handlers), so [n/total] never runs past its end.
        self._unseen = Counter(listed or [])
        self.total = len(listed) if listed else None
        self.secrets = list(secrets or [])
        self.step = 0
        self._label: str | None = None
        self._hosts: dict[str, str] = {}
        self.outcome = Outcome(ok=True, steps=0)
        self._error_lines = 0

    def _flush(self) -> list[str]:
        if self._label is None:
            return []
        count = f"{self.step}/{self.total}" if self.total else str(self.step)
        results = sorted(self._hosts.items(), key=lambda kv: (_rank(kv[1]), kv[0]))
        hosts = ", ".join(f"{h} {r}" for h, r in results) or "no hosts"
        line = redact(f"[{count}] {self._label}  {hosts}", self.secrets)
        self._label, self._hosts = None, {}
        return [line]

    def feed(self, event: dict[str, Any]) -> list[str]:
        kind = event.get("event", "")
        data = event.get("event_data") or {}
        host = str(data.get("host") or data.get("remote_addr") or "")
        if kind in ("playbook_on_task_start", "playbook_on_handler_task_start"):
            lines = self._flush()
            self.step += 1
            self.outcome.steps = self.step
            self._label = task_label(data)
            if self._unseen[self._label] > 0:
                self._unseen[self._label] -= 1
            elif self.total is not None:
                self.total += 1
            return lines
        if kind == "runner_on_ok":
            res = data.get("res") or {}
            self._hosts[host] = "changed" if res.get("changed") else "ok"
        elif kind == "runner_on_skipped":
            self._hosts[host] = "skipped"
        elif kind == "runner_on_failed":
            res = data.get("res") or {}
            if data.get("ignore_errors"):
                self._hosts[host] = "ok (failure ignored)"
            else:
                self._hosts[host] = "FAILED"
                self.outcome.ok = False
                self.outcome.failures.append(Failure(
                    host, task_label(data), redact(failure_message(res), self.secrets)))
        elif kind == "runner_on_unreachable":
            res = data.get("res") or {}
            self._hosts[host] = "UNREACHABLE"
            self.outcome.ok = False
            self.outcome.failures.append(Failure(
                host, task_label(data), redact(failure_message(res), self.secrets),
                unreachable=True))
        elif kind == "playbook_on_no_hosts_matched":
            lines = self._flush()
            play = str(data.get("play") or "").strip()
            return lines + [f"(play {play + ' ' if play else ''}skipped: no hosts match)"]
        elif kind == "verbose":
            # Ansible's own errors (a bad playbook, a missing role) come as plain output:
            # keep the error line and the few lines after it (where, the source excerpt).
            text = _ANSI.sub("", str(event.get("stdout") or "")).rstrip()
            if text.lstrip().startswith(("ERROR!", "[ERROR]")):
                self._error_lines = 8
            if self._error_lines > 0 and text.strip():
                self._error_lines -= 1
                self.outcome.errors.append(redact(text, self.secrets))
        elif kind == "playbook_on_stats":
            lines = self._flush()
            self.outcome.changed = {h: int(n) for h, n in (data.get("changed") or {}).items()}
            self.outcome.oks = {h: int(n) for h, n in (data.get("ok") or {}).items()}
            return lines
        return []

    def finish(self, rc: int) -> list[str]:
        """The remaining line; a non-zero exit without a failed task is still a failure."""
        lines = self._flush()
        if rc != 0:
            self.outcome.ok = False
        return lines


def listed_tasks(list_tasks_stdout: str) -> list[str] | None:
    """The tasks ``ansible-playbook --list-tasks`` lists, as ``role : task`` (None when
    there are none to read)."""
    out = []
    for line in list_tasks_stdout.splitlines():
        label, tab, _ = line.strip().partition("\tTAGS: [")
        if tab and not label.startswith("play #"):
            out.append(label.strip())
    return out or None


def failure_report(outcome: Outcome, rerun: str) -> str:
    """What failed, where, and what to do."""
    lines = []
    for f in outcome.failures:
        what = "cannot be reached" if f.unreachable else "failed"
        lines.append(f"{f.host}: step '{f.task}' {what}: {f.message}")
    if outcome.errors:
        lines.append("ansible-playbook stopped:")
        lines += [f"  {e}" for e in outcome.errors]
    if not lines:
        lines.append("ansible-playbook stopped with an error and no failed step "
                     "(run it by hand with -v to see why)")
    if any(f.unreachable for f in outcome.failures):
        hint = ("Check that you can `ssh USER@HOST` to the unreachable host(s) without a "
                "password prompt, then ")
    elif outcome.failures:
        hint = "Fix the cause on that host, then "
    else:
        hint = "Fix what ansible-playbook reports, then "
    return "\n".join(lines) + f"\nNothing was moved: the store in use is unchanged. {hint}" \
        f"re-run `{rerun}` (it is safe: steps already done change nothing)."


# ---------------------------------------------------------------- ssh host keys

SSH_CONNECT_TIMEOUT_S = 10
# Ansible's default ssh_args, kept after ours: ssh takes the first value it is given for an
# option, so nothing later (not even ANSIBLE_HOST_KEY_CHECKING=False, which appends
# StrictHostKeyChecking=no) can turn the check off.
_ANSIBLE_SSH_ARGS = ["-C", "-o", "ControlMaster=auto", "-o", "ControlPersist=60s"]
# Never reuse a connection someone else opened (a multiplexed master skips the key check).
_NO_SHARING = ["-o", "ControlMaster=no", "-o", "ControlPath=none"]
_CHANGED = ("REMOTE HOST IDENTIFICATION HAS CHANGED", "has changed and you have requested "
            "strict checking")
_REVOKED = "REVOKED HOST KEY"
_UNKNOWN = ("host key is known for", "Host key verification failed")


@dataclass(frozen=True)
class SshTrust:
    """How ssh trusts the store hosts, the same for the check before anything changes and
    for the playbook: strict host key checking (an unknown or changed key refuses the
    connection) against ``known_hosts`` (None: ssh's own, ``~/.ssh/known_hosts`` and
    ``/etc/ssh/ssh_known_hosts``); ``identity`` is a private key to log in with besides
    ssh's own (ssh-agent, ``~/.ssh/id_*``)."""

    known_hosts: Path | None = None
    identity: Path | None = None

    def options(self) -> list[str]:
        opts = ["-o", "StrictHostKeyChecking=yes"]
        if self.known_hosts is not None:
            opts += ["-o", f"UserKnownHostsFile={_ssh_value(self.known_hosts)}"]
        if self.identity is not None:
            opts += ["-o", f"IdentityFile={_ssh_value(self.identity)}"]
        return opts


def _ssh_value(path: Path) -> str:
    """A path as an ssh option's value (ssh splits a value on blanks unless quoted)."""
    text = str(path)
    return f'"{text}"' if any(c.isspace() for c in text) else text


@dataclass(frozen=True)
class SshView:
    """What ssh's configuration makes of one host (``ssh -G``): the port it connects to,
    the name its key is listed under in known_hosts, and the known_hosts file."""

    port: int
    known_name: str
    known_hosts: str


@dataclass(frozen=True)
class HostKeyProblem:
    """Why ssh refuses one store host (``kind``: unknown, changed, revoked, or login: not
    reached or not logged in), with the command that fixes it in ``message``."""

    host: str
    kind: str
    message: str


def host_text(host: StoreHost) -> str:
    """``user@host[:port]`` as the operator wrote it."""
    name = f"[{host.host}]" if ":" in host.host and host.ssh_port else host.host
    return f"{host.user}@{name}" + (f":{host.ssh_port}" if host.ssh_port else "")


def known_name(host: str, port: int, alias: str | None = None) -> str:
    """The name ssh looks a host's key up under: ``HOST``, or ``[HOST]:PORT`` off port 22
    (or the HostKeyAlias)."""
    if alias:
        return alias
    return host if port == 22 else f"[{host}]:{port}"


def ssh_view(host: StoreHost, config_text: str, trust: SshTrust) -> SshView:
    """From ``ssh -G``'s output (empty when it failed): the port, the known_hosts name and
    file (the first user file; ``~`` expanded)."""
    values: dict[str, str] = {}
    for line in config_text.splitlines():
        key, _, value = line.strip().partition(" ")
        values.setdefault(key.lower(), value.strip())
    port_text = values.get("port", "")
    port = int(port_text) if port_text.isdigit() else (host.ssh_port or 22)
    alias = values.get("hostkeyalias")
    alias = None if not alias or alias == "none" else alias
    files = shlex.split(values.get("userknownhostsfile", "")) or \
        ([str(trust.known_hosts)] if trust.known_hosts else ["~/.ssh/known_hosts"])
    return SshView(port, known_name(host.host, port, alias), os.path.expanduser(files[0]))


def judge_ssh(host: StoreHost, rc: int, stderr: str, view: SshView,
              offered: list[str] | None = None) -> HostKeyProblem | None:
    """What ``ssh -o BatchMode=yes -o StrictHostKeyChecking=yes USER@HOST true`` said:
    None when it logged in, else the problem and the exact commands that fix it."""
    if rc == 0:
        return None
    given = host_text(host)
    text = stderr.strip()
    kh = shlex.quote(view.known_hosts)
    scan = ("ssh-keyscan " + (f"-p {view.port} " if view.port != 22 else "")
            + shlex.quote(host.host))
    on_host = ("on the host itself (its console, not over this network): "
               "`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub`")
    if any(marker in text for marker in _CHANGED) or _REVOKED in text:
        revoked = _REVOKED in text
        sent = re.search(r"key sent by the remote host is\s+(\S+?)\.?$", text, re.M)
        offending = re.search(r"Offending \S+ key in (.+):(\d+)$", text, re.M)
        where = f"{offending[1]} line {offending[2]}" if offending else view.known_hosts
        what = ("is REVOKED" if revoked else
                f"has CHANGED: it is not the key {where} holds for {view.known_name}")
        return HostKeyProblem(given, "revoked" if revoked else "changed", (
            f"{given}: its ssh host key {what}"
            + (f" (it sent {sent[1]})" if sent else "")
            + ". Someone may be impersonating this host (a man-in-the-middle), or it was "
            "reinstalled. Only if you know it was reinstalled: "
            f"compare the new key with its fingerprint {on_host}, then replace the old key: "
            f"`ssh-keygen -R {shlex.quote(view.known_name)} -f {kh}` and "
            f"`{scan} >> {kh}`"))
    if any(marker in text for marker in _UNKNOWN):
        fingerprints = (f"; it offers {', '.join(offered)}" if offered else "")
        return HostKeyProblem(given, "unknown", (
            f"{given}: ssh does not know its host key (no {view.known_name} in {kh})"
            f"{fingerprints}. Check the fingerprint {on_host}, "
            f"then accept the key: `{scan} >> {kh}`"))
    last = text.splitlines()[-1] if text else f"ssh exited with status {rc}"
    port = f"-p {view.port} " if view.port != 22 else ""
    return HostKeyProblem(given, "login", (
        f"{given}: cannot log in over ssh: {last}. server init logs in with your ssh keys "
        f"or ssh-agent, without a prompt: make `ssh {port}{host.user}@{host.host} true` "
        "work, then re-run"))


def fingerprints(keygen_stdout: str) -> list[str]:
    """``SHA256:... (ED25519)`` for each key, from ``ssh-keyscan HOST | ssh-keygen -lf -``."""
    out = []
    for line in keygen_stdout.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1].startswith("SHA256:"):
            out.append(f"{parts[1]} {parts[-1]}")
    return out


def _run(argv: list[str], timeout_s: float, stdin: str | None = None
         ) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, input=stdin, capture_output=True, text=True,
                              timeout=timeout_s, check=False,
                              stdin=None if stdin is not None else subprocess.DEVNULL)
    except FileNotFoundError:
        raise PlaybookError(f"{argv[0]} is not installed: apt-get install openssh-client "
                            "(server init logs in to the store hosts with ssh)") from None
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 255, "", f"{argv[0]} did not finish "
                                           f"within {timeout_s:.0f} s")


def _offered_keys(host: str, port: int) -> list[str]:
    """The fingerprints the host offers now (ssh-keyscan), best effort, for the message."""
    scan = _run(["ssh-keyscan", "-T", "5", "-p", str(port), host], 20)
    if scan.returncode != 0 or not scan.stdout.strip():
        return []
    listing = _run(["ssh-keygen", "-lf", "-"], 10, stdin=scan.stdout)
    return fingerprints(listing.stdout) if listing.returncode == 0 else []


def check_host_keys(hosts: list[StoreHost], trust: SshTrust,
                    timeout_s: float = 30.0) -> list[HostKeyProblem]:
    """Log in to each host with ssh itself, as the playbook will (strict host key
    checking, no prompt, no shared connection), running ``true``: changes nothing on any
    host. Returns a problem per host ssh refuses, every one at once."""
    problems = []
    for host in hosts:
        port = ["-p", str(host.ssh_port)] if host.ssh_port else []
        target = [*port, "-l", host.user, "--", host.host]
        config = _run(["ssh", "-G", *trust.options(), *target], timeout_s)
        view = ssh_view(host, config.stdout if config.returncode == 0 else "", trust)
        done = _run(["ssh", "-o", "BatchMode=yes", "-o",
                     f"ConnectTimeout={SSH_CONNECT_TIMEOUT_S}", *_NO_SHARING,
                     *trust.options(), *target, "true"], timeout_s)
        offered = []
        if done.returncode != 0 and any(m in done.stderr for m in _UNKNOWN) and \
                not any(m in done.stderr for m in _CHANGED):
            offered = _offered_keys(host.host, view.port)
        problem = judge_ssh(host, done.returncode, done.stderr, view, offered)
        if problem is not None:
            problems.append(problem)
    return problems


# ---------------------------------------------------------------- ansible-runner


def _ansible_env(playbook_dir: Path, ssh: SshTrust | None = None) -> dict[str, str]:
    """PATH with this Python's ansible-playbook first; the project's ansible.cfg (roles,
    collections) when the playbooks dir sits in the repository; ssh host key checking on
    (ansible-runner turns it off unless told) and strict, first in ssh's arguments."""
    env = {"PATH": os.pathsep.join([str(Path(sys.executable).parent),
                                    os.environ.get("PATH", "")]),
           "ANSIBLE_PYTHON_INTERPRETER": "auto_silent", "ANSIBLE_NOCOLOR": "1",
           "ANSIBLE_RETRY_FILES_ENABLED": "false",
           "ANSIBLE_HOST_KEY_CHECKING": "True", "ANSIBLE_SSH_HOST_KEY_CHECKING": "True",
           "ANSIBLE_SSH_ARGS": shlex.join((ssh or SshTrust()).options()
                                          + _ANSIBLE_SSH_ARGS)}
    cfg = playbook_dir.parent / "ansible.cfg"
    if cfg.is_file():
        env["ANSIBLE_CONFIG"] = str(cfg)
    return env


def _check_ansible(env: dict[str, str]) -> None:
    if shutil.which("ansible-playbook", path=env["PATH"]) is None:
        raise PlaybookError("ansible-playbook is not installed next to llmgw: install "
                            "ansible-core and ansible-runner in llmgw's Python "
                            "(pip install ansible-core ansible-runner)")


def run_playbook(playbook: Path, inventory: dict[str, Any], extravars: dict[str, Any],
                 echo: Callable[[str], None], secrets: list[str] | None = None,
                 ssh: SshTrust | None = None) -> Outcome:
    """Run ``playbook`` with ansible-runner, echoing one line per step, ssh checking each
    host's key as ``ssh`` says (strictly, against ssh's own known_hosts by default). The
    private data dir (it holds the extra vars: the passwords) is 0700 and removed
    afterwards; ssh's shared connections live in it, so none is reused from elsewhere."""
    import ansible_runner

    env = _ansible_env(playbook.parent, ssh)
    _check_ansible(env)
    private = Path(tempfile.mkdtemp(prefix="llmgw-store-init-"))
    os.chmod(private, 0o700)
    for sub in ("list", "run", "cp"):
        (private / sub).mkdir(mode=0o700)
    env["ANSIBLE_SSH_CONTROL_PATH_DIR"] = str(private / "cp")
    try:
        listed = None
        listing = ansible_runner.run(
            private_data_dir=str(private / "list"), project_dir=str(playbook.parent),
            playbook=playbook.name, inventory=inventory, extravars=extravars,
            cmdline="--list-tasks", quiet=True, envvars=env)
        if listing.rc == 0:
            listed = listed_tasks(listing.stdout.read())
        progress = Progress(listed=listed, secrets=secrets)

        def handler(event: dict[str, Any]) -> bool:
            for line in progress.feed(event):
                echo(line)
            return False          # do not keep the event in the artifacts dir

        result = ansible_runner.run(
            private_data_dir=str(private / "run"), project_dir=str(playbook.parent),
            playbook=playbook.name, inventory=inventory, extravars=extravars,
            event_handler=handler, quiet=True, envvars=env)
        for line in progress.finish(int(result.rc or 0)):
            echo(line)
        return progress.outcome
    finally:
        _close_shared_connections(private / "cp")
        shutil.rmtree(private, ignore_errors=True)


def _close_shared_connections(control_dir: Path) -> None:
    """End the run's ssh master connections (ControlPersist would keep them a minute)."""
    for sock in control_dir.iterdir() if control_dir.is_dir() else ():
        try:
            subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "llmgw-store"],
                           capture_output=True, timeout=10, check=False,
                           stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired):
            pass
