"""The ``llmgw`` entry point: only wiring, no logic."""

from __future__ import annotations

import sys

if "router" in sys.argv[1:4]:
    # The router serves on gevent. gevent must patch the standard library before anything
    # imports ssl (urllib, urllib3 do), or HTTPS sockets recurse forever in the workers.
    from gevent import monkey

    monkey.patch_all()

import importlib  # noqa: E402
import logging  # noqa: E402
from typing import Any  # noqa: E402

import click  # noqa: E402

from .. import __version__  # noqa: E402

# Each command's module is imported when the command runs, not at start: ``llmgw ctl
# status`` need not import the server's (SQLAlchemy, Flask) or the agent's modules, which
# took most of its second on a 2-core machine.
COMMANDS = {"up": ("up", "up"), "server": ("services", "server"),
            "agent": ("services", "agent"), "router": ("services", "router"),
            "ctl": ("ctl", "ctl"), "doctor": ("doctor", "doctor")}


class Commands(click.Group):
    """The top-level commands, each loaded from its module on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module, attr = COMMANDS[cmd_name]
        command: Any = getattr(importlib.import_module(f".{module}", __package__), attr)
        return command  # type: ignore[no-any-return]


@click.group(cls=Commands)
@click.version_option(__version__, prog_name="llmgw")
@click.option("--log-level", default="INFO", envvar="LLMGW_LOG_LEVEL", show_default=True)
def cli(log_level: str) -> None:
    """llmgw: many LLMs on your GPU nodes behind one OpenAI-compatible endpoint."""
    logging.basicConfig(level=log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def status_main() -> None:
    """``llmgw-status``: the same as ``llmgw ctl status`` (cli/ctl.py)."""
    from .ctl import status_main as run

    run()


def main() -> None:
    cli()


__all__ = ["main", "status_main"]


if __name__ == "__main__":
    main()
