"""The replicated store's shape: which hosts, the Ansible inventory, the client URL, the
passwords, and what Patroni says about the cluster (``llmgw server init --patroni``).

Everything here but :func:`load_or_create_passwords` and :func:`fetch_cluster` is a pure
function of its arguments."""

from __future__ import annotations

import ipaddress
import json
import os
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ..errors import ConfigError
from ..store.members import get_json, rest_url

STORE_GROUP = "llmgw_store"
WITNESS_GROUP = "llmgw_store_witness"
PASSWORD_KEYS = ("llmgw_store_password", "llmgw_store_superuser_password",
                 "llmgw_store_replication_password")
PASSWORDS_FILE = "store-passwords.json"
# A host reached with the local connection runs modules with the Python running Ansible
# (Ansible's advice for localhost): no interpreter discovery on the control host. Modules
# that need the system's bindings (apt) re-run themselves under the system Python.
LOCAL = {"ansible_python_interpreter": "{{ ansible_playbook_python }}"}

_USER = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$")
_HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                       r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")


@dataclass(frozen=True)
class StoreHost:
    """One PostgreSQL + Patroni + etcd host, from ``user@host[:port]``."""

    user: str
    host: str
    ssh_port: int | None = None

    @property
    def name(self) -> str:
        """Its inventory name: the host as given (an IPv6 address without brackets)."""
        return self.host


@dataclass(frozen=True)
class StoreSettings:
    """What the playbook is told and what the client URL is made of."""

    user: str = "llmgw"
    database: str = "llmgw"
    port: int = 5432
    rest_port: int = 8008
    etcd_port: int = 2379
    scope: str = "llmgw"


def parse_host(text: str) -> StoreHost:
    """``user@host``, ``user@host:22`` or ``user@[v6::addr]:22``; ConfigError says which
    part is wrong."""
    user, at, rest = text.partition("@")
    if not at or not user or not rest:
        raise ConfigError(f"{text!r} is not user@host: give each store host as "
                          "USER@HOST[:SSH_PORT], e.g. admin@db1.example.com")
    if not _USER.match(user):
        raise ConfigError(f"{text!r}: {user!r} is not a user name")
    port: int | None = None
    if rest.startswith("["):
        host, close, tail = rest[1:].partition("]")
        if not close or ":" not in host:
            raise ConfigError(f"{text!r}: write an IPv6 address as [ADDRESS]:PORT")
        if tail:
            if not tail.startswith(":"):
                raise ConfigError(f"{text!r}: unexpected {tail!r} after the address")
            port = _port(text, tail[1:])
    else:
        host, colon, tail = rest.partition(":")
        if colon:
            port = _port(text, tail)
        if not _HOSTNAME.match(host):
            raise ConfigError(f"{text!r}: {host!r} is not a host name or IPv4 address")
    return StoreHost(user=user, host=host, ssh_port=port)


def _port(text: str, raw: str) -> int:
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise ConfigError(f"{text!r}: the SSH port {raw!r} is not a TCP port (1-65535)")
    return int(raw)


def parse_hosts(texts: list[str] | tuple[str, ...],
                witness: str = "this control host") -> list[StoreHost]:
    """Every given host, refusing a malformed one, a duplicate, or a count that makes an
    even number of etcd voters (the witness, ``witness``, is one more); every problem at
    once."""
    problems: list[str] = []
    hosts: list[StoreHost] = []
    for text in texts:
        try:
            hosts.append(parse_host(text))
        except ConfigError as exc:
            problems.append(exc.message)
    seen: set[str] = set()
    for h in hosts:
        if h.host.lower() in seen:
            problems.append(f"{h.host} is given twice: each store host once")
        seen.add(h.host.lower())
    problem = voter_problem(len(texts), witness)
    if problem:
        problems.append(problem)
    if problems:
        raise ConfigError("cannot build the store cluster from these hosts", details=problems)
    return hosts


def voter_problem(store_hosts: int, witness: str = "this control host") -> str | None:
    """Why this many store hosts (plus the etcd witness, ``witness``) is refused."""
    voters = store_hosts + 1
    if store_hosts < 1:
        return "give at least two store hosts (user@host), e.g. two: 3 etcd voters"
    if voters % 2 == 0:
        choices = " or ".join(str(n) for n in (store_hosts - 1, store_hosts + 1) if n >= 2)
        return (f"{store_hosts} store host(s) + {witness} make {voters} etcd voters, "
                f"an even number: it survives no more failures than {voters - 1} and can "
                f"split in half; give {choices} store hosts")
    return None


def inventory(hosts: list[StoreHost], control_name: str, connection: str = "ssh",
              seen_at: dict[str, str] | None = None,
              witness_address: str | None = None,
              witness: StoreHost | None = None) -> dict[str, Any]:
    """The Ansible inventory (ansible-runner's dict form): the store hosts in
    ``llmgw_store``, this control host in ``llmgw_store_witness`` (local), or ``witness``
    there (``--witness``: another host, reached as the store hosts are).

    ``seen_at``: store host -> the address this control host connects from, as that host
    sees it (its ssh connection): its pg_hba admits that address
    (``llmgw_store_control_address``). ``witness_address``: this host's etcd address when
    the store hosts reach it at one of its own addresses."""
    store: dict[str, Any] = {}
    for h in hosts:
        hv = _remote(h, connection)
        if seen_at and seen_at.get(h.name):
            hv["llmgw_store_control_address"] = seen_at[h.name]
        store[h.name] = hv
    if witness is not None:
        voter = {witness.name: _remote(witness, connection)}
    else:
        local: dict[str, Any] = {"ansible_connection": "local", **LOCAL}
        if witness_address:
            local["llmgw_store_address"] = witness_address
        voter = {control_name: local}
    return {"all": {"children": {
        STORE_GROUP: {"hosts": store},
        WITNESS_GROUP: {"hosts": voter},
    }}}


def _remote(h: StoreHost, connection: str) -> dict[str, Any]:
    """A host reached over ``connection`` (ssh) as ``user@host[:port]`` says."""
    hv: dict[str, Any] = {"ansible_host": h.host, "ansible_user": h.user,
                          "ansible_connection": connection}
    if h.ssh_port is not None:
        hv["ansible_port"] = h.ssh_port
    if connection == "local":
        hv.update(LOCAL)
    return hv


def pick_witness_address(seen_at: dict[str, str],
                         is_local: Callable[[str], bool]) -> str | None:
    """The address the store hosts all see this control host at, when it is one IPv4
    address of this host (etcd's peers reach the witness there); else None (the etcd
    role's default: the host's default IPv4 address)."""
    seen = set(seen_at.values())
    if len(seen) != 1:
        return None
    address = seen.pop()
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return None
    if ip.version != 4 or ip.is_loopback or not is_local(address):
        return None
    return address


def parse_networks(texts: list[str] | tuple[str, ...]) -> list[str]:
    """``--allow`` networks, strictly: ``10.1.2.0/24`` or ``fd00::/64`` (an address alone
    is a /32 or /128); refused, every one at once: a malformed one, host bits set, /0."""
    problems = []
    out: list[str] = []
    for text in texts:
        try:
            net = ipaddress.ip_network(text.strip(), strict=True)
        except ValueError as exc:
            problems.append(f"--allow {text!r}: {exc}; give a network such as 10.1.2.0/24 "
                            "(its address with the host bits zero) or one address")
            continue
        if net.prefixlen == 0:
            problems.append(f"--allow {text!r} admits every address: give the network the "
                            "control hosts and operators connect from")
            continue
        if str(net) not in out:
            out.append(str(net))
    if problems:
        raise ConfigError("cannot admit these networks to the store", details=problems)
    return out


def extravars(settings: StoreSettings, passwords: dict[str, str],
              allowed: list[str] | None = None) -> dict[str, Any]:
    """The playbook's variables (the passwords among them: never print this)."""
    return {**passwords, "llmgw_store_allowed_cidrs": list(allowed or []),
            "llmgw_store_user": settings.user, "llmgw_store_database": settings.database,
            "llmgw_store_port": settings.port, "llmgw_patroni_rest_port": settings.rest_port,
            "llmgw_etcd_client_port": settings.etcd_port, "llmgw_store_scope": settings.scope}


def url_hosts(hosts: list[StoreHost], port: int) -> list[tuple[str, int]]:
    return [(h.host, port) for h in hosts]


def parse_url_hosts(text: str) -> list[tuple[str, int]]:
    """``h1:5432,h2:5433`` (the hidden test option --store-url-hosts)."""
    out = []
    for part in text.split(","):
        host, _, port = part.strip().rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"--store-url-hosts: {part!r} is not HOST:PORT")
        out.append((host, int(port)))
    return out


def store_url(settings: StoreSettings, password: str, hosts: list[tuple[str, int]]) -> str:
    """The control service's URL: every host, libpq picks the writable one."""
    netloc = ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in hosts)
    return (f"postgresql://{quote(settings.user, safe='')}:{quote(password, safe='')}"
            f"@{netloc}/{quote(settings.database, safe='')}"
            "?target_session_attrs=read-write&connect_timeout=3")


def same_store(a: str, b: str) -> bool:
    """Whether two PostgreSQL URLs name the same user, hosts and database (passwords and
    options aside)."""
    def key(url: str) -> tuple[str, str]:
        rest = url.partition("://")[2]
        creds, _, where = rest.rpartition("@")
        return creds.split(":", 1)[0], where.split("?", 1)[0].lower()
    return a.startswith("postgres") and b.startswith("postgres") and key(a) == key(b)


# ---------------------------------------------------------------- passwords


def load_or_create_passwords(path: Path) -> tuple[dict[str, str], bool]:
    """The store passwords from ``path`` (0600), made once; returns (passwords, created)."""
    if path.exists():
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{path} cannot be read as the store passwords ({exc}); restore "
                              "it from a backup (the cluster was set up with those)") from None
        missing = [k for k in PASSWORD_KEYS if not isinstance(data.get(k), str) or not data[k]]
        if missing:
            raise ConfigError(f"{path} lacks {', '.join(missing)}; restore it from a backup")
        os.chmod(path, 0o600)
        return {k: data[k] for k in PASSWORD_KEYS}, False
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)   # a new state dir: 0700
    passwords = {k: secrets.token_urlsafe(24) for k in PASSWORD_KEYS}
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(passwords, f, indent=2)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return passwords, True


# ---------------------------------------------------------------- what Patroni says


@dataclass
class ClusterView:
    """The cluster as the members' REST APIs describe it."""

    healthy: bool
    summary: str
    answered: list[str] = field(default_factory=list)   # hosts whose REST API answered
    problems: list[str] = field(default_factory=list)


def judge_cluster(answers: dict[str, dict[str, Any] | str], expected: int) -> ClusterView:
    """From each host's ``GET /cluster`` JSON (or the error text): healthy means one leader
    running, every other member replicating, and ``expected`` members."""
    answered = [h for h, a in answers.items() if isinstance(a, dict)]
    if not answered:
        errors = "; ".join(f"{h}: {a}" for h, a in answers.items())
        return ClusterView(False, f"no Patroni answers ({errors})", [],
                           ["Patroni is not running on any store host"])
    # The first answer that has members (each member reports the whole cluster).
    view = next(a for a in answers.values() if isinstance(a, dict))
    members = view.get("members") or []
    problems = [f"{h}: Patroni's REST API does not answer ({a})"
                for h, a in answers.items() if not isinstance(a, dict)]
    leaders = [m for m in members if m.get("role") == "leader"]
    if len(leaders) != 1:
        problems.append(f"{len(leaders)} leaders (one is needed)")
    elif leaders[0].get("state") != "running":
        problems.append(f"the leader {leaders[0].get('name')} is {leaders[0].get('state')}")
    for m in members:
        # Patroni 3 says "running" for a replica that replicates, newer ones "streaming".
        if m.get("role") != "leader" and m.get("state") not in ("streaming", "running"):
            problems.append(f"{m.get('name')} is {m.get('state')}, not streaming")
    if len(members) != expected:
        problems.append(f"{len(members)} members, {expected} expected")
    parts = [f"{m.get('name')} {m.get('role')} {m.get('state')}" for m in members]
    summary = ", ".join(parts) or "no members"
    return ClusterView(not problems, summary, answered, problems)


def fetch_cluster(hosts: list[str], rest_port: int,
                  timeout: float = 3.0) -> dict[str, dict[str, Any] | str]:
    """``GET http://HOST:REST_PORT/cluster`` on each host: its JSON, or why not."""
    return {host: get_json(rest_url(host, rest_port) + "/cluster", timeout) for host in hosts}
