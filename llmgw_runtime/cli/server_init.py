"""``llmgw server init --patroni USER@HOST ...``: set up the replicated store (PostgreSQL +
Patroni + etcd, playbooks/store.yml) and move the store in use into it.

The steps, each checked before it runs, so a re-run on a cluster that is up changes
nothing: the hosts, their ssh host keys (ssh itself refuses an unknown or changed key,
before anything is written anywhere) and the inventory; what Patroni says now; the playbook; a healthy
cluster and a working login; the copy (or "already there"); the switch of the control
service's env file. Anything that fails before the switch leaves the old store in use.
The decisions live in ``store/patroni.py``, ``store/move.py``, ``store/switch.py`` and
``store/playbook.py``; this module only gathers inputs and says what happens."""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from ..errors import ConfigError, LlmgwError
from ..store import patroni
from ..store.db import Store, redact_url
from ..store.members import rest_url
from ..store.move import MoveError, backup_sqlite, move, snapshot
from ..store.playbook import SshTrust, check_host_keys, failure_report, run_playbook
from ..store.switch import (
    DATABASE_KEY,
    ServiceControl,
    SwitchError,
    check_writable,
    parse_env,
    service_control,
    set_env,
    write_env_file,
)

DEFAULT_ENV_FILE = Path("/etc/llmgw/control.env")
MARKER_FILE = "store-move.json"


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
                  env_file: dict[str, str], default_state_dir: Path) -> Current:
    """A flag or ``LLMGW_*`` variable wins; then the control service's env file; then the
    default SQLite file in the state dir."""
    state_dir = Path(given_state_dir or env_file.get("LLMGW_STATE_DIR") or default_state_dir)
    url = given_url or env_file.get(DATABASE_KEY) or \
        f"sqlite:///{(state_dir / 'llmgw.db').resolve()}"
    return Current(url, state_dir)


def _step(n: int, text: str) -> None:
    click.secho(f"==> {n}/6 {text}", bold=True)


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


def _switch(env_path: Path, env_text: str, url: str, svc: ServiceControl,
            was_active: bool, patroni_urls: str) -> None:
    # The members' REST APIs too, so ctl status and /metrics show each member's health.
    env_text = set_env(env_text, "LLMGW_PATRONI_URLS", patroni_urls)
    write_env_file(env_path, set_env(env_text, DATABASE_KEY, url))
    click.echo(f"{env_path}: {DATABASE_KEY} now points at the cluster")
    if was_active:
        try:
            svc.start()
        except SwitchError as exc:
            raise InitError(f"{env_path} points at the cluster, but the control service "
                            f"did not start: {exc}. Fix that and start it again; the old "
                            "store is kept as the backup named above") from None
        click.echo("llmgw-control started on the cluster store")
    else:
        click.echo(f"now restart the control service, reading {env_path}, so it uses the "
                   f"cluster: {svc.hint()}")


def _check_ssh(hosts: list[patroni.StoreHost], ssh: SshTrust, rerun: str) -> None:
    """Refuse, before anything is written anywhere, a host ssh does not trust."""
    problems = check_host_keys(hosts, ssh)
    if problems:
        raise InitError(
            "ssh refuses the store host(s) below, so nothing was done: no host was "
            "touched, no password made, the env file and the store in use are as they "
            "were.\n  " + "\n  ".join(p.message for p in problems)
            + f"\nThen re-run `{rerun}`.")
    click.echo("ssh host keys: every store host's key is the one known_hosts holds "
               f"({', '.join(h.host for h in hosts)})")


def run_init(hosts_text: tuple[str, ...], *, current: Current, env_path: Path,
             playbooks: Path | None, settings: patroni.StoreSettings, connection: str,
             url_hosts: str | None, wait_s: float, svc: ServiceControl,
             ssh: SshTrust | None = None) -> None:
    rerun = "llmgw server init --patroni " + " ".join(hosts_text)
    ssh = ssh or SshTrust()

    _step(1, "hosts, ssh host keys, inventory, passwords")
    hosts = patroni.parse_hosts(list(hosts_text))
    witness = socket.gethostname()
    if any(h.name.lower() == witness.lower() for h in hosts):
        raise ConfigError(f"{witness} is this control host, the etcd witness: "
                          "give the store hosts only")
    if playbooks is None:
        raise ConfigError("playbooks/store.yml is not next to this llmgw: pass --playbooks "
                          "DIR (the playbooks/ directory of the llmgw repository)")
    playbook = playbooks / "store.yml"
    if not playbook.is_file():
        raise ConfigError(f"{playbook} does not exist: --playbooks must name the playbooks/ "
                          "directory of the llmgw repository")
    problem = check_writable(env_path)
    if problem:
        raise ConfigError(problem)
    if connection == "ssh":
        _check_ssh(hosts, ssh, rerun)
    pw_path = current.state_dir / patroni.PASSWORDS_FILE
    passwords, created = patroni.load_or_create_passwords(pw_path)
    click.echo(f"store passwords {'made and kept' if created else 'reused from'} "
               f"{pw_path} (0600)")
    target_hosts = (patroni.parse_url_hosts(url_hosts) if url_hosts
                    else patroni.url_hosts(hosts, settings.port))
    target = patroni.store_url(settings, passwords["llmgw_store_password"], target_hosts)
    inv = patroni.inventory(hosts, witness, connection)
    click.echo(f"inventory: {', '.join(h.name for h in hosts)} in {patroni.STORE_GROUP}, "
               f"{witness} in {patroni.WITNESS_GROUP} ({len(hosts) + 1} etcd voters)")

    _step(2, "what is there now")
    rest_hosts = [h.host for h in hosts]
    view = patroni.judge_cluster(patroni.fetch_cluster(rest_hosts, settings.rest_port),
                                 len(hosts))
    if view.healthy:
        click.echo(f"Patroni cluster up: {view.summary}")
    elif view.answered:
        click.echo(f"Patroni cluster not healthy: {'; '.join(view.problems)}")
    else:
        click.echo("no Patroni answers yet: a first install")
    in_cluster = patroni.same_store(current.url, target)
    click.echo(f"store in use: {redact_url(current.url)}"
               + (" (the cluster)" if in_cluster else ""))

    _step(3, f"playbook {playbook}")
    secrets = list(passwords.values())
    outcome = run_playbook(playbook, inv, patroni.extravars(settings, passwords), click.echo,
                           secrets=secrets, ssh=ssh)
    if not outcome.ok:
        raise InitError("the playbook failed:\n" + failure_report(outcome, rerun))
    click.echo(f"playbook done: {outcome.summary()}")

    _step(4, "cluster health and login")
    view = _wait_healthy(rest_hosts, settings, wait_s)
    if not view.healthy:
        raise InitError(
            "the Patroni cluster is not healthy after the playbook:\n  "
            + "\n  ".join(view.problems)
            + f"\nNothing was moved: the store in use is unchanged. Look at `journalctl -u "
              f"patroni` on the store hosts, then re-run `{rerun}`.")
    click.echo(f"healthy: {view.summary}")
    try:
        click.echo(_check_login(target))
    except LlmgwError as exc:
        raise InitError(f"{exc}\nThe playbook makes role {settings.user} and database "
                        f"{settings.database}; nothing was moved: the store in use is "
                        f"unchanged. Re-run `{rerun}`.") from None

    if in_cluster:
        _step(5, "data: store already in the cluster")
        with _Closing(Store(target)) as store:
            revision = store.migrate()
            with store.begin() as conn:
                rows = snapshot(conn)
        click.echo(f"store already in the cluster (schema at revision {revision}); "
                   "nothing copied")
        click.echo("rows in the cluster: " + ", ".join(f"{t} {s.rows}" for t, s in rows.items()))
        _step(6, "switch: nothing to do, the control service uses the cluster")
        return

    _step(5, "data: copy the store in use into the cluster")
    was_active = svc.is_active()
    if was_active:
        click.echo("stopping llmgw-control so nothing writes to the store while it is copied")
        svc.stop()
    else:
        click.echo("llmgw-control is not active here: make sure no `llmgw server` writes "
                   f"to {redact_url(current.url)} until this command is done")
    backup: Path | None = None
    try:
        if current.url.startswith("sqlite:///"):
            db = Path(current.url.removeprefix("sqlite:///"))
            if db.exists():
                backup = backup_sqlite(db, datetime.now(UTC))
                click.echo(f"backup of the store in use: {backup}")
        # One large transaction: give its COMMIT time to reach the synchronous standby.
        with _Closing(Store(current.url)) as source, \
                _Closing(Store(target, commit_timeout_s=300.0)) as dest:
            result = move(source, dest, current.state_dir / MARKER_FILE, click.echo)
        click.echo(result.decision.reason)
        click.echo("rows, the same on both sides: "
                   + ", ".join(f"{t} {n}" for t, n in result.counts.items()))
        _step(6, "switch the control service to the cluster")
        env_text = env_path.read_text() if env_path.exists() else ""
        _switch(env_path, env_text, target, svc, was_active,
                ",".join(rest_url(h, settings.rest_port) for h in rest_hosts))
    except KeyboardInterrupt:
        if was_active:
            svc.start()
        raise
    except (LlmgwError, OSError) as exc:
        if isinstance(exc, InitError):
            raise
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
    click.echo(f"done: the store is in the cluster ({redact_url(target)})")
    if backup is not None:
        click.echo(f"the old store is kept as {backup}")
    click.echo(f"the store passwords are in {pw_path}: keep a copy somewhere safe")
    click.echo("note: the llmgw_control role writes the env file too; before the next "
               "site.yml run set llmgw_control_database_url in your inventory to the cluster "
               "URL (its password is llmgw_store_password in that file), or it switches "
               "the control service back to SQLite")


class _Closing:
    """``with`` for a Store: dispose its engine at the end."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def __enter__(self) -> Store:
        return self.store

    def __exit__(self, *exc: Any) -> None:
        self.store.dispose()


@click.command("init")
@click.option("--patroni", "patroni_", is_flag=True, required=True,
              help="PostgreSQL replicated by Patroni, with etcd (the one kind there is)")
@click.argument("hosts", nargs=-1, required=True, metavar="USER@HOST[:SSH_PORT]...")
@click.option("--playbooks", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="the llmgw playbooks/ directory [the one next to this llmgw]")
@click.option("--env-file", type=click.Path(path_type=Path, dir_okay=False),
              default=DEFAULT_ENV_FILE, show_default=True,
              help="the control service's env file; its LLMGW_DATABASE_URL is switched")
@click.option("--store-database", default="llmgw", show_default=True,
              help="the database the playbook makes for llmgw")
@click.option("--store-port", type=int, default=5432, show_default=True)
@click.option("--patroni-rest-port", type=int, default=8008, show_default=True)
@click.option("--etcd-port", type=int, default=2379, show_default=True)
@click.option("--scope", default="llmgw", show_default=True, help="the Patroni cluster name")
@click.option("--known-hosts", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="the known_hosts file ssh checks the store hosts' keys against "
                   "[ssh's own: ~/.ssh/known_hosts, /etc/ssh/ssh_known_hosts]")
@click.option("--ssh-key", type=click.Path(path_type=Path, dir_okay=False, exists=True),
              default=None, help="a private key to log in to the store hosts with "
                                 "[ssh's own: ssh-agent, ~/.ssh/id_*]")
@click.option("--wait", "wait_s", type=float, default=120.0, show_default=True,
              help="seconds to wait for a healthy cluster after the playbook")
@click.option("--connection", default="ssh", hidden=True,
              help="TESTS ONLY: the inventory's ansible_connection for the store hosts")
@click.option("--store-url-hosts", default=None, hidden=True,
              help="TESTS ONLY: HOST:PORT,... in the cluster URL instead of the store hosts")
@click.pass_context
def init(ctx: click.Context, patroni_: bool, hosts: tuple[str, ...], playbooks: Path | None,
         env_file: Path, store_database: str, store_port: int, patroni_rest_port: int,
         etcd_port: int, scope: str, known_hosts: Path | None, ssh_key: Path | None,
         wait_s: float, connection: str, store_url_hosts: str | None) -> None:
    """Set up the replicated store on the given hosts and move the store in use into it.

    First checks each host's ssh host key with ssh itself: an unknown or changed key stops
    it before anything changes, saying the command that accepts the key. Then runs
    playbooks/store.yml over ssh (PostgreSQL 15, Patroni and etcd on each host; this
    host adds an etcd vote), copies every row of the store in use (SQLite) into the
    cluster, checks the counts, keeps the old file as a backup, and points the control
    service at the cluster. Safe to re-run: a cluster that is up changes nothing."""
    logging.getLogger("alembic").setLevel(logging.WARNING)   # the steps say what happens
    parent = ctx.parent.params if ctx.parent else {}
    env_path = env_file
    env_values = parse_env(env_path.read_text()) if env_path.is_file() else {}
    config = ctx.obj
    current = current_store(
        parent.get("database_url") or os.environ.get("LLMGW_DATABASE_URL") or None,
        str(parent.get("state_dir") or os.environ.get("LLMGW_STATE_DIR") or "") or None,
        env_values, Path(getattr(config, "state_dir", ".llmgw")))
    settings = patroni.StoreSettings(database=store_database, port=store_port, rest_port=patroni_rest_port,
                                     etcd_port=etcd_port, scope=scope)
    try:
        run_init(hosts, current=current, env_path=env_path,
                 playbooks=playbooks or default_playbooks(), settings=settings,
                 connection=connection, url_hosts=store_url_hosts, wait_s=wait_s,
                 svc=service_control(),
                 ssh=SshTrust(known_hosts=known_hosts and known_hosts.expanduser().absolute(),
                              identity=ssh_key and ssh_key.expanduser().absolute()))
    except LlmgwError as exc:
        raise click.ClickException(str(exc)) from None
