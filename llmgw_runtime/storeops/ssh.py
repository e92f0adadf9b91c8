"""ssh to the store hosts, checking every host's key: :class:`SshTrust` is how ssh checks
the hosts' keys (strictly, against known_hosts), for the playbook and for
:func:`check_hosts`, which logs in with ssh itself before anything changes and asks each
host which address this control host connects from; :func:`judge_ssh` turns what ssh said
into the problem and the command to fix it (pure)."""

from __future__ import annotations

import ipaddress
import os
import re
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import LlmgwError
from .patroni import StoreHost


class SshError(LlmgwError):
    reason = "ssh_failed"


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
        # The old key goes from the file ssh found it in; the new one into the file checked.
        stale = shlex.quote(offending[1]) if offending else kh
        what = ("is REVOKED" if revoked else
                f"has CHANGED: it is not the key {where} holds for {view.known_name}")
        return HostKeyProblem(given, "revoked" if revoked else "changed", (
            f"{given}: its ssh host key {what}"
            + (f" (it sent {sent[1]})" if sent else "")
            + ". Someone may be impersonating this host (a man-in-the-middle), or it was "
            "reinstalled. Only if you know it was reinstalled: "
            f"compare the new key with its fingerprint {on_host}, then replace the old key: "
            f"`ssh-keygen -R {shlex.quote(view.known_name)} -f {stale}` and "
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
        raise SshError(f"{argv[0]} is not installed: apt-get install openssh-client "
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


# What the login runs on each host: changes nothing, says which address this host connects
# from (as the store host sees it: pg_hba must admit that one), whether python3 is there
# (Ansible's modules need it) and whether sudo works without a password (or it is root).
PROBE = ('echo "ssh_connection=$SSH_CONNECTION"; echo "uid=$(id -u)"; '
         'command -v python3 >/dev/null 2>&1 && echo python3=yes; '
         'sudo -n true >/dev/null 2>&1 && echo sudo=yes; true')


@dataclass(frozen=True)
class HostFacts:
    """What :data:`PROBE` printed on one store host."""

    client_address: str | None = None
    root: bool = False
    python3: bool = False
    sudo: bool = False


def parse_probe(stdout: str) -> HostFacts:
    """:data:`PROBE`'s output; ``client_address`` only when it is an IP address."""
    values = dict(line.strip().partition("=")[::2] for line in stdout.splitlines()
                  if "=" in line)
    client = (values.get("ssh_connection") or "").split()
    address: str | None = None
    if client:
        try:
            address = str(ipaddress.ip_address(client[0]))
        except ValueError:
            address = None
    return HostFacts(client_address=address, root=values.get("uid") == "0",
                     python3=values.get("python3") == "yes", sudo=values.get("sudo") == "yes")


def judge_facts(host: StoreHost, facts: HostFacts) -> list[HostKeyProblem]:
    """What a logged-in store host lacks for the playbook (pure)."""
    given = host_text(host)
    problems = []
    if not facts.python3:
        problems.append(HostKeyProblem(given, "python", (
            f"{given}: python3 is not installed there (Ansible's modules run with it): "
            f"`ssh {_port_flag(host)}{host.user}@{host.host} sudo apt-get install -y "
            "python3`, then re-run")))
    if not facts.root and not facts.sudo:
        problems.append(HostKeyProblem(given, "sudo", (
            f"{given}: {host.user} may not run sudo without a password (the playbook "
            "installs packages as root): log in as root (root@HOST), or on the host run "
            f"`echo '{host.user} ALL=(ALL) NOPASSWD: ALL' | sudo tee "
            f"/etc/sudoers.d/{host.user}-llmgw`, then re-run")))
    return problems


def _port_flag(host: StoreHost) -> str:
    return f"-p {host.ssh_port} " if host.ssh_port and host.ssh_port != 22 else ""


@dataclass
class SshCheck:
    """Every problem ssh or a host showed, and the address each host sees this one at."""

    problems: list[HostKeyProblem] = field(default_factory=list)
    seen: dict[str, HostFacts] = field(default_factory=dict)

    def client_addresses(self) -> dict[str, str]:
        """Store host name -> the address this control host connects from, as it sees it."""
        return {h: f.client_address for h, f in self.seen.items() if f.client_address}


def check_hosts(hosts: list[StoreHost], trust: SshTrust,
                timeout_s: float = 30.0) -> SshCheck:
    """Log in to each host with ssh itself, as the playbook will (strict host key
    checking, no prompt, no shared connection), running :data:`PROBE`: changes nothing on
    any host. Returns a problem per host ssh refuses or that lacks python3 or sudo, every
    one at once, and what each host that let us in said."""
    check = SshCheck()
    for host in hosts:
        port = ["-p", str(host.ssh_port)] if host.ssh_port else []
        target = [*port, "-l", host.user, "--", host.host]
        config = _run(["ssh", "-G", *trust.options(), *target], timeout_s)
        view = ssh_view(host, config.stdout if config.returncode == 0 else "", trust)
        done = _run(["ssh", "-o", "BatchMode=yes", "-o",
                     f"ConnectTimeout={SSH_CONNECT_TIMEOUT_S}", *_NO_SHARING,
                     *trust.options(), *target, PROBE], timeout_s)
        offered = []
        if done.returncode != 0 and any(m in done.stderr for m in _UNKNOWN) and \
                not any(m in done.stderr for m in _CHANGED):
            offered = _offered_keys(host.host, view.port)
        problem = judge_ssh(host, done.returncode, done.stderr, view, offered)
        if problem is not None:
            check.problems.append(problem)
            continue
        facts = parse_probe(done.stdout)
        check.seen[host.name] = facts
        check.problems += judge_facts(host, facts)
    return check


def check_host_keys(hosts: list[StoreHost], trust: SshTrust,
                    timeout_s: float = 30.0) -> list[HostKeyProblem]:
    """The problems of :func:`check_hosts` alone."""
    return check_hosts(hosts, trust, timeout_s).problems
