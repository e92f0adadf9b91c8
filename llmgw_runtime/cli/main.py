"""The ``llmgw`` entry point: only wiring, no logic."""

from __future__ import annotations

import logging

import click

from .. import __version__
from .ctl import ctl, status_main
from .doctor import doctor
from .services import agent, router, server
from .up import up


@click.group()
@click.version_option(__version__, prog_name="llmgw")
@click.option("--log-level", default="INFO", envvar="LLMGW_LOG_LEVEL", show_default=True)
def cli(log_level: str) -> None:
    """llmgw: many LLMs on your GPU nodes behind one OpenAI-compatible endpoint."""
    logging.basicConfig(level=log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


for command in (up, server, agent, router, ctl, doctor):
    cli.add_command(command)


def main() -> None:
    cli()


__all__ = ["main", "status_main"]


if __name__ == "__main__":
    main()
