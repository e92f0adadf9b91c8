"""``llmgw server init --patroni USER@HOST ...``: the command line of
:mod:`llmgw_runtime.storeops.init` (set up the replicated store and move the store in use
into it). It only reads the options and the env files and prints what happens."""

from __future__ import annotations

import logging
import os
import shlex
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from ..errors import LlmgwError
from ..store.db import redact_url
from ..storeops import patroni
from ..storeops.init import current_store, default_playbooks, read_env_files, run_init
from ..storeops.ssh import SshTrust
from ..storeops.switch import service_control

DEFAULT_ENV_FILE = Path("/etc/llmgw/control.env")


def _step(text: str) -> None:
    click.secho(text, bold=True)


def _value(value: Any) -> str:
    """An option's value as the re-run gives it: a path absolute (it works from any
    directory, and names the very file this run used), a URL without its password."""
    if isinstance(value, Path):
        return str(value.expanduser().absolute())
    text = str(value)
    return redact_url(text) if "://" in text else text


def given_options(ctx: click.Context) -> list[str]:
    """The options given on the command line to ``ctx``'s command, in the command's order,
    as words (a repeatable option once per value; arguments left out)."""
    words: list[str] = []
    for param in ctx.command.params:
        if not isinstance(param, click.Option) or param.name is None or \
                ctx.get_parameter_source(param.name) is not ParameterSource.COMMANDLINE:
            continue
        name = max(param.opts, key=len)
        value = ctx.params[param.name]
        if param.is_flag:
            words.append(name)
        else:
            for one in value if param.multiple else (value,):
                words += [name, _value(one)]
    return words


def rerun_command(parent: list[str], own: list[str], hosts: tuple[str, ...]) -> str:
    """``llmgw server [its options] init --patroni HOSTS [the other options]``: the command
    that runs this again with every option given (pure)."""
    rest = [w for w in own if w != "--patroni"]
    return shlex.join(["llmgw", "server", *parent, "init", "--patroni", *hosts, *rest])


@click.command("init")
@click.option("--patroni", "patroni_", is_flag=True, required=True,
              help="PostgreSQL replicated by Patroni, with etcd (the one kind there is)")
@click.argument("hosts", nargs=-1, required=True, metavar="USER@HOST[:SSH_PORT]...")
@click.option("--playbooks", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="the llmgw playbooks/ directory [the one next to this llmgw]")
@click.option("--env-file", type=click.Path(path_type=Path, dir_okay=False),
              default=DEFAULT_ENV_FILE, show_default=True,
              help="the control service's env file (the llmgw_control role's); the cluster's "
                   "URL goes to store.env next to it")
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
@click.option("--witness", metavar="USER@HOST[:SSH_PORT]", default=None,
              help="another host booted with systemd as the etcd witness (a vote without "
                   "data), reached over ssh as the store hosts are [this control host]")
@click.option("--allow", "allow", multiple=True, metavar="CIDR",
              help="a network the store admits besides the control host (pg_hba), e.g. "
                   "10.1.2.0/24; repeatable")
@click.option("--wait", "wait_s", type=float, default=120.0, show_default=True,
              help="seconds to wait for a healthy cluster after the playbook")
@click.option("--connection", default="ssh", hidden=True,
              help="TESTS ONLY: the inventory's ansible_connection for the store hosts")
@click.option("--store-url-hosts", default=None, hidden=True,
              help="TESTS ONLY: HOST:PORT,... in the cluster URL instead of the store hosts")
@click.option("--systemd-dir", type=click.Path(path_type=Path), default=None, hidden=True,
              help="TESTS ONLY: the directory whose presence says this host runs systemd "
                   "[/run/systemd/system]")
@click.pass_context
def init(ctx: click.Context, patroni_: bool, hosts: tuple[str, ...], playbooks: Path | None,
         env_file: Path, store_database: str, store_port: int, patroni_rest_port: int,
         etcd_port: int, scope: str, known_hosts: Path | None, ssh_key: Path | None,
         witness: str | None, allow: tuple[str, ...], wait_s: float, connection: str,
         store_url_hosts: str | None, systemd_dir: Path | None) -> None:
    """Set up the replicated store on the given hosts and move the store in use into it.

    First checks, before anything changes anywhere, what it needs: ansible and its
    collections here (pip install 'llmgw[server-init]'), each host's ssh host key (an
    unknown or changed key stops it, saying the command that accepts the key), python3 and
    sudo there, systemd here (this host is the etcd witness, unless --witness names
    another); the playbook's first play checks systemd and free ports on every etcd voter.
    Then runs playbooks/store.yml over ssh (PostgreSQL 15, Patroni and etcd on each host;
    the witness adds an etcd vote), copies every row of the store in use (SQLite) into the
    cluster, checks the counts, keeps the old file as a backup, and points the control
    service at the cluster (in store.env, next to the env file). Safe to re-run: a cluster that is up changes nothing."""
    logging.getLogger("alembic").setLevel(logging.WARNING)   # the steps say what happens
    parent = ctx.parent.params if ctx.parent else {}
    env_path = env_file
    env_values, store_values = read_env_files(env_path)
    config = ctx.obj
    current = current_store(
        parent.get("database_url") or os.environ.get("LLMGW_DATABASE_URL") or None,
        str(parent.get("state_dir") or os.environ.get("LLMGW_STATE_DIR") or "") or None,
        env_values, Path(getattr(config, "state_dir", ".llmgw")), store_values)
    settings = patroni.StoreSettings(database=store_database, port=store_port,
                                     rest_port=patroni_rest_port, etcd_port=etcd_port,
                                     scope=scope)
    rerun = rerun_command(given_options(ctx.parent) if ctx.parent else [],
                          given_options(ctx), hosts)
    try:
        run_init(hosts, current=current, env_path=env_path,
                 playbooks=playbooks or default_playbooks(), settings=settings,
                 connection=connection, url_hosts=store_url_hosts, wait_s=wait_s,
                 svc=service_control(),
                 ssh=SshTrust(known_hosts=known_hosts and known_hosts.expanduser().absolute(),
                              identity=ssh_key and ssh_key.expanduser().absolute()),
                 allow=allow, echo=click.echo, step=_step, rerun=rerun,
                 systemd_dir=systemd_dir, witness_text=witness)
    except LlmgwError as exc:
        raise click.ClickException(str(exc)) from None
