"""``llmgw server init --patroni USER@HOST ...``: set up the replicated store (PostgreSQL +
Patroni + etcd, playbooks/store.yml) and move the store in use into it.

The steps, each checked before it runs, so a re-run on a cluster that is up changes
nothing: the preflight (this host's tools, the hosts, their ssh host keys, python3 and
sudo there, the address each sees this host at: nothing is written anywhere before it
passes) and the inventory; what Patroni says now; the playbook (whose first play checks
every voter, systemd and free ports among them, before any host changes); a healthy
cluster and a working login; the copy (or "already there"); the switch, written to the
control service's store env file. Anything that fails before the switch leaves the old
store in use. The decisions live in :mod:`.patroni`, :mod:`.move`, :mod:`.switch`,
:mod:`.ssh`, :mod:`.progress` and :mod:`.runner`; this module only runs them in order and
says what happens."""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..errors import ConfigError, LlmgwError
from ..store.db import Store, redact_url
from ..store.members import rest_url
from . import patroni
from .move import MoveError, backup_sqlite, move, snapshot
from .progress import failure_report
from .runner import local_problems, run_playbook
from .ssh import SshTrust, check_hosts
from .switch import (
    DATABASE_KEY,
    ETCD_KEY,
    PATRONI_KEY,
    ServiceControl,
    SwitchError,
    check_writable,
    parse_env,
    store_env_path,
    store_env_text,
    write_env_file,
)

MARKER_FILE = "store-move.json"
# What says this host was booted with systemd (sd_booted(3)): etcd runs as etcd.service on
# every voter, this control host (the witness) included.
SYSTEMD_DIR = Path("/run/systemd/system")
Echo = Callable[[str], None]


class InitError(LlmgwError):
    reason = "server_init_failed"


def default_playbooks() -> Path | None:
    """``playbooks/`` of the repository this package sits in, when it has store.yml."""
    root = Path(__file__).resolve().parents[2] / "playbooks"
    return root if (root / "store.yml").is_file() else None


@dataclass(frozen=True)
class Current:
    """The store the control service uses now, and where its state lives."""

    url: str
    state_dir: Path


def current_store(given_url: str | None, given_state_dir: str | None,
                  env_file: dict[str, str], default_state_dir: Path,
                  store_env: dict[str, str] | None = None) -> Current:
    """A flag or ``LLMGW_*`` variable wins; then the store env file (server init's), then
    the control service's env file (the role's); then the default SQLite file in the
    state dir."""
    state_dir = Path(given_state_dir or env_file.get("LLMGW_STATE_DIR") or default_state_dir)
    url = given_url or (store_env or {}).get(DATABASE_KEY) or env_file.get(DATABASE_KEY) or \
        f"sqlite:///{(state_dir / 'llmgw.db').resolve()}"
    return Current(url, state_dir)


def _is_local(address: str) -> bool:
    """Whether ``address`` is one of this host's (a socket can be bound to it)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.bind((address, 0))
        return True
    except OSError:
        return False


def login_advice(error: str, settings: patroni.StoreSettings, rerun: str) -> str:
    """What to do when logging in to the new cluster failed (pure)."""
    refused = re.search(r'no pg_hba\.conf entry for host "([^"]+)"', error)
    if refused:
        address = refused[1]
        net = f"{address}/128" if ":" in address else f"{address}/32"
        return (f"The store hosts do not admit {address}, the address this host connects "
                "to them from (pg_hba admits the address each store host saw this host's "
                "ssh connection come from, and --allow networks). Re-run with that "
                f"address allowed: `{rerun} --allow {net}`; nothing was moved: the store "
                "in use is unchanged.")
    if "password authentication failed" in error:
        return (f"The password of {settings.user} in {patroni.PASSWORDS_FILE} is not the "
                "one the cluster has: restore the file this cluster was built with, then "
                f"re-run `{rerun}`. Nothing was moved: the store in use is unchanged.")
    return (f"The playbook makes role {settings.user} and database {settings.database}; "
            "nothing was moved: the store in use is unchanged. Look at `journalctl -u "
            f"patroni` on the store hosts, then re-run `{rerun}`.")


def _wait_healthy(hosts: list[str], settings: patroni.StoreSettings,
                  wait_s: float) -> patroni.ClusterView:
    deadline = time.monotonic() + wait_s
    while True:
        view = patroni.judge_cluster(patroni.fetch_cluster(hosts, settings.rest_port),
                                     len(hosts))
        if view.healthy or time.monotonic() >= deadline:
            return view
        time.sleep(2)


def _check_login(url: str) -> str:
    import sqlalchemy as sa

    store = Store(url)
    try:
        with store.begin() as conn:
            row = conn.execute(sa.text("SELECT current_user, current_database(), "
                                       "pg_is_in_recovery()")).one()
    finally:
        store.dispose()
    if row[2]:
        raise InitError(f"{redact_url(url)} reached a read-only standby: "
                        "target_session_attrs=read-write was not honoured; re-run")
    return f"logged in as {row[0]} to database {row[1]} on the primary"


def store_values(url: str, rest_hosts: list[str], settings: patroni.StoreSettings,
                 witness_host: str | None = None) -> dict[str, str]:
    """What the store env file holds: the URL, the members' Patroni REST APIs and every
    etcd voter's client URL (this control host's, the witness, on 127.0.0.1; a --witness
    host's at its name), for ctl status and /metrics."""
    etcd = [f"http://{'[' + h + ']' if ':' in h else h}:{settings.etcd_port}"
            for h in [*rest_hosts, witness_host or "127.0.0.1"]]
    return {DATABASE_KEY: url,
            PATRONI_KEY: ",".join(rest_url(h, settings.rest_port) for h in rest_hosts),
            ETCD_KEY: ",".join(etcd)}


def _write_store_env(store_env: Path, values: dict[str, str], echo: Echo) -> bool:
    """Write ``values`` into the store env file; False when it held them already."""
    before = store_env.read_text() if store_env.exists() else ""
    text = store_env_text(before, values)
    if text == before:
        return False
    write_env_file(store_env, text)
    echo(f"{store_env}: {DATABASE_KEY} now points at the cluster (llmgw-control reads it "
         "after control.env; the llmgw_control role never writes it)")
    return True


def _start_after_switch(store_env: Path, svc: ServiceControl, was_active: bool,
                        echo: Echo) -> None:
    if was_active:
        try:
            svc.start()
        except SwitchError as exc:
            raise InitError(f"{store_env} points at the cluster, but the control service "
                            f"did not start: {exc}. Fix that and start it again; the old "
                            "store is kept as the backup named above") from None
        echo("llmgw-control started on the cluster store")
    else:
        echo(f"now restart the control service so it reads {store_env} and uses the "
             f"cluster: {svc.hint()}")


def witness_problem(witness: str, systemd_dir: Path, booted_with_systemd: bool) -> str | None:
    """What to do when this control host, the etcd witness, runs without systemd (pure)."""
    if booted_with_systemd:
        return None
    return (f"this control host ({witness}) does not run systemd ({systemd_dir} is "
            "missing: a container, or a host started without it), and it is the etcd "
            "witness: etcd runs on every voter as etcd.service. Either run `llmgw server "
            "init` from a host (or VM) booted with systemd that reaches the store hosts, "
            "with the same options, or name another host booted with systemd as the "
            "witness (it runs etcd only, a vote without data): add `--witness USER@HOST`")


def preflight(hosts: list[patroni.StoreHost], *, playbooks: Path | None,
              env_path: Path, connection: str, ssh: SshTrust, allow: tuple[str, ...],
              rerun: str, echo: Echo, systemd_dir: Path | None = None,
              witness: patroni.StoreHost | None = None
              ) -> tuple[Path, list[str], dict[str, str]]:
    """Everything checked before anything is written anywhere: the playbook, the env
    files, this host's tools and, when it is the witness, systemd (``systemd_dir``
    present: :data:`SYSTEMD_DIR`), the --allow networks, each store host (and a --witness
    host) over ssh. Every problem at once. Returns the playbook, the networks and where
    each store host sees us. The test-only local connection (the store hosts are this
    machine) checks neither systemd here nor ssh."""
    problems: list[str] = []
    if connection == "ssh" and witness is None:
        probed = systemd_dir or SYSTEMD_DIR
        problem = witness_problem(socket.gethostname(), probed, probed.is_dir())
        if problem:
            problems.append(problem)
    playbook: Path | None = None
    if playbooks is None:
        problems.append("playbooks/store.yml is not next to this llmgw (it was installed "
                        "from a wheel, without the repository): pass --playbooks DIR, the "
                        "playbooks/ directory of an llmgw checkout of the same version")
    elif not (playbooks / "store.yml").is_file():
        problems.append(f"{playbooks / 'store.yml'} does not exist: --playbooks must name "
                        "the playbooks/ directory of the llmgw repository")
    else:
        playbook = playbooks / "store.yml"
        problems += local_problems(playbooks)
    problem = check_writable(store_env_path(env_path))      # the env file is only read
    if problem:
        problems.append(problem)
    try:
        networks = patroni.parse_networks(allow)
    except ConfigError as exc:
        problems += exc.details
        networks = []
    if problems:
        raise ConfigError("server init cannot start; nothing was done anywhere (no host "
                          "was touched, no password made, no file written). Fix each "
                          f"problem below, then re-run `{rerun}`:", details=problems)
    assert playbook is not None
    seen: dict[str, str] = {}
    if connection == "ssh":
        voters = hosts + ([witness] if witness else [])
        check = check_hosts(voters, ssh)
        if check.problems:
            raise InitError(
                "the store host(s) below are not ready, so nothing was done: no host was "
                "touched, no password made, the env file and the store in use are as they "
                "were.\n  " + "\n  ".join(p.message for p in check.problems)
                + f"\nThen re-run `{rerun}`.")
        names = {h.name for h in hosts}
        seen = {h: a for h, a in check.client_addresses().items() if h in names}
        echo("ssh: every store host's key is the one known_hosts holds, python3 and sudo "
             f"are there ({', '.join(h.host for h in voters)})")
        if seen:
            echo("the store hosts see this host at "
                 + ", ".join(f"{a} ({h})" for h, a in seen.items()) + ": pg_hba admits it")
    return playbook, networks, seen


def run_init(hosts_text: tuple[str, ...], *, current: Current, env_path: Path,
             playbooks: Path | None, settings: patroni.StoreSettings, connection: str,
             url_hosts: str | None, wait_s: float, svc: ServiceControl,
             ssh: SshTrust | None = None, allow: tuple[str, ...] = (),
             echo: Echo = print, step: Echo = print, rerun: str | None = None,
             systemd_dir: Path | None = None, witness_text: str | None = None) -> None:
    """``rerun``: the command that runs this again, every option given (the CLI's
    :func:`~llmgw_runtime.cli.server_init.rerun_command`), named in every message that
    says to re-run. ``witness_text``: ``USER@HOST[:PORT]`` of the etcd witness when it is
    not this control host (``--witness``)."""
    rerun = rerun or "llmgw server init --patroni " + " ".join(hosts_text)
    ssh = ssh or SshTrust()
    store_env = store_env_path(env_path)

    step("==> 1/6 preflight: this host, the store hosts, ssh host keys, inventory, passwords")
    other = patroni.parse_host(witness_text) if witness_text else None
    hosts = patroni.parse_hosts(list(hosts_text),
                                f"the witness {other.host}" if other else "this control host")
    witness = other.name if other else socket.gethostname()
    if any(h.name.lower() == witness.lower() for h in hosts):
        raise ConfigError(f"{witness} is given as a store host and as the witness "
                          "(--witness), which runs etcd only: give it once" if other else
                          f"{witness} is this control host, the etcd witness: "
                          "give the store hosts only")
    playbook, networks, seen = preflight(
        hosts, playbooks=playbooks, env_path=env_path, connection=connection, ssh=ssh,
        allow=allow, rerun=rerun, echo=echo, systemd_dir=systemd_dir, witness=other)
    pw_path = current.state_dir / patroni.PASSWORDS_FILE
    passwords, created = patroni.load_or_create_passwords(pw_path)
    echo(f"store passwords {'made and kept' if created else 'reused from'} {pw_path} (0600)")
    target_hosts = (patroni.parse_url_hosts(url_hosts) if url_hosts
                    else patroni.url_hosts(hosts, settings.port))
    target = patroni.store_url(settings, passwords["llmgw_store_password"], target_hosts)
    inv = patroni.inventory(hosts, witness, connection, seen_at=seen, witness=other,
                            witness_address=None if other else
                            patroni.pick_witness_address(seen, _is_local))
    echo(f"inventory: {', '.join(h.name for h in hosts)} in {patroni.STORE_GROUP}, "
         f"{witness} in {patroni.WITNESS_GROUP} ({len(hosts) + 1} etcd voters)")

    step("==> 2/6 what is there now")
    rest_hosts = [h.host for h in hosts]
    view = patroni.judge_cluster(patroni.fetch_cluster(rest_hosts, settings.rest_port),
                                 len(hosts))
    if view.healthy:
        echo(f"Patroni cluster up: {view.summary}")
    elif view.answered:
        echo(f"Patroni cluster not healthy: {'; '.join(view.problems)}")
    else:
        echo("no Patroni answers yet: a first install")
    in_cluster = patroni.same_store(current.url, target)
    echo(f"store in use: {redact_url(current.url)}" + (" (the cluster)" if in_cluster else ""))

    step(f"==> 3/6 playbook {playbook}")
    outcome = run_playbook(playbook, inv, patroni.extravars(settings, passwords, networks),
                           echo, secrets=list(passwords.values()), ssh=ssh)
    if not outcome.ok:
        raise InitError("the playbook failed:\n" + failure_report(outcome, rerun))
    echo(f"playbook done: {outcome.summary()}")

    step("==> 4/6 cluster health and login")
    view = _wait_healthy(rest_hosts, settings, wait_s)
    if not view.healthy:
        raise InitError(
            "the Patroni cluster is not healthy after the playbook:\n  "
            + "\n  ".join(view.problems)
            + f"\nNothing was moved: the store in use is unchanged. Look at `journalctl -u "
              f"patroni` on the store hosts, then re-run `{rerun}`.")
    echo(f"healthy: {view.summary}")
    try:
        echo(_check_login(target))
    except LlmgwError as exc:
        # The store's own advice ("check that the database is up") is wrong for a refused
        # login: keep what PostgreSQL said and say what to do instead.
        said = str(exc).split("; check that the database is up")[0]
        raise InitError(f"{said}\n{login_advice(str(exc), settings, rerun)}") from None
    values = store_values(target, rest_hosts, settings, other.host if other else None)

    if in_cluster:
        step("==> 5/6 data: store already in the cluster")
        with _Closing(Store(target)) as store:
            revision = store.migrate()
            with store.begin() as conn:
                rows = snapshot(conn)
        echo(f"store already in the cluster (schema at revision {revision}); nothing copied")
        echo("rows in the cluster: " + ", ".join(f"{t} {s.rows}" for t, s in rows.items()))
        step("==> 6/6 switch: the control service uses the cluster")
        if not _write_store_env(store_env, values, echo):
            echo(f"nothing to do: {store_env} holds the cluster URL")
        return
    _copy_and_switch(current, target, values, store_env, svc, rerun, echo, step)
    echo(f"the store passwords are in {pw_path}: keep a copy somewhere safe")


def _copy_and_switch(current: Current, target: str, values: dict[str, str],
                     store_env: Path, svc: ServiceControl, rerun: str, echo: Echo,
                     step: Echo) -> None:
    step("==> 5/6 data: copy the store in use into the cluster")
    was_active = svc.is_active()
    if was_active:
        echo("stopping llmgw-control so nothing writes to the store while it is copied")
        svc.stop()
    else:
        echo("llmgw-control is not active here: make sure no `llmgw server` writes "
             f"to {redact_url(current.url)} until this command is done")
    backup: Path | None = None
    try:
        if current.url.startswith("sqlite:///"):
            db = Path(current.url.removeprefix("sqlite:///"))
            if db.exists():
                backup = backup_sqlite(db, datetime.now(UTC))
                echo(f"backup of the store in use: {backup}")
        # One large transaction: give its COMMIT time to reach the synchronous standby.
        with _Closing(Store(current.url)) as source, \
                _Closing(Store(target, commit_timeout_s=300.0)) as dest:
            result = move(source, dest, current.state_dir / MARKER_FILE, echo)
        echo(result.decision.reason)
        echo("rows, the same on both sides: "
             + ", ".join(f"{t} {n}" for t, n in result.counts.items()))
        step("==> 6/6 switch the control service to the cluster")
        _write_store_env(store_env, values, echo)
    except KeyboardInterrupt:
        if was_active:
            svc.start()
        raise
    except (LlmgwError, OSError) as exc:
        restarted = ""
        if was_active:
            try:
                svc.start()
                restarted = " llmgw-control was started again on it."
            except SwitchError as again:
                restarted = f" Starting llmgw-control again failed too: {again}."
        what = ("Empty the cluster database or find out who wrote to it, then "
                if isinstance(exc, MoveError) and "other rows" in str(exc) else
                "Fix the cause, then ")
        raise InitError(
            f"{exc}\nThe control service still uses the old store "
            f"({redact_url(current.url)}); nothing was switched.{restarted} "
            f"{what}re-run `{rerun}` (it is safe).") from None
    _start_after_switch(store_env, svc, was_active, echo)
    echo(f"done: the store is in the cluster ({redact_url(target)})")
    if backup is not None:
        echo(f"the old store is kept as {backup}")


class _Closing:
    """``with`` for a Store: dispose its engine at the end."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def __enter__(self) -> Store:
        return self.store

    def __exit__(self, *exc: Any) -> None:
        self.store.dispose()


def read_env_files(env_path: Path) -> tuple[dict[str, str], dict[str, str]]:
    """The control service's env file and the store env file next to it (empty when
    absent)."""
    store_env = store_env_path(env_path)
    return (parse_env(env_path.read_text()) if env_path.is_file() else {},
            parse_env(store_env.read_text()) if store_env.is_file() else {})
