"""``llmgw server``, ``llmgw agent`` and ``llmgw router``: run one process of llmgw.

Each reads its typed settings from ``LLMGW_*`` variables; a flag given here wins."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from .. import settings
from ..errors import LlmgwError
from .server_init import init as server_init

F = TypeVar("F", bound=Callable[..., Any])


def friendly(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except LlmgwError as exc:
        raise click.ClickException(str(exc)) from None


@click.group(invoke_without_command=True)
@click.option("--host", default=None, help="bind address [127.0.0.1]")
@click.option("--port", type=int, default=None, help="port [8470]")
@click.option("--database-url", default=None, help="sqlite:///PATH or postgresql://...")
@click.option("--state-dir", type=click.Path(path_type=Path), default=None)
@click.option("--workers", type=int, default=None)
@click.pass_context
def server(ctx: click.Context, **flags: Any) -> None:
    """Run the control service (migrates the store first)."""
    from ..control.config import ControlConfig

    config = friendly(lambda: settings.load(ControlConfig, **flags))
    ctx.obj = config
    if ctx.invoked_subcommand is None:
        from ..control.serve import run
        from ..security import private_dir

        private_dir(config.state_dir)          # the SQLite store's directory: 0700
        friendly(lambda: run(config))


@server.command()
@click.pass_obj
def migrate(config: Any) -> None:
    """Apply the store's migrations and exit."""
    from ..security import private_dir
    from ..store import Store

    private_dir(config.state_dir)
    revision = friendly(lambda: Store(config.store_url).migrate())
    click.echo(f"store migrated to revision {revision}")


server.add_command(server_init)      # llmgw server init --patroni USER@HOST ...


@click.command()
@click.option("--control-url", default=None)
@click.option("--node-name", default=None)
@click.option("--state-dir", type=click.Path(path_type=Path), default=None)
@click.option("--devices", default=None, help="auto | nvml | nvidia-smi | cpu | fake:FILE | none")
@click.option("--fabric", default=None,
              help="the interconnect this node is on (multi-node replicas stay in one)")
@click.option("--weights-dir", "weights_dirs", multiple=True,
              help="a directory to look for weights in and download to (repeatable)")
@click.option("--stop-engines-on-exit", is_flag=True, default=None,
              help="stop engines when the agent exits; by default they keep "
                   "serving and the next agent adopts them")
def agent(**flags: Any) -> None:
    """Run the node agent: report devices, start and watch engines."""
    from ..agent.config import AgentConfig
    from ..agent.loop import run

    flags["weights_dirs"] = tuple(flags["weights_dirs"]) or None
    config = friendly(lambda: settings.load(AgentConfig, **flags))
    config.prepare_state_dir()     # its credential, engine records and logs: 0700
    friendly(lambda: run(config))


@click.command()
@click.option("--control-url", default=None)
@click.option("--host", default=None)
@click.option("--port", type=int, default=None)
@click.option("--workers", type=int, default=None)
@click.option("--require-api-key/--no-require-api-key", default=None,
              help="whether every request needs an API key (`llmgw ctl keys create`); "
                   "keys are required unless --no-require-api-key (a trusted network) "
                   "[$LLMGW_REQUIRE_API_KEY]")
@click.option("--cors-origins", default=None, metavar="ORIGINS",
              help="origins whose web pages may call the router from a browser: a comma "
                   "list of scheme://host[:port], or * for any; none by default "
                   "[$LLMGW_CORS_ORIGINS]")
def router(**flags: Any) -> None:
    """Run the OpenAI-compatible router."""
    from ..router.config import RouterConfig
    from ..router.serve import run

    config = friendly(lambda: settings.load(RouterConfig, **flags))
    friendly(lambda: run(config))
