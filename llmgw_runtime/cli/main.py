"""The ``llmgw`` entry point: only wiring, no logic."""

from __future__ import annotations

import sys

if "router" in sys.argv[1:4]:
    # The router serves on gevent. gevent must patch the standard library before anything
    # imports ssl (urllib, urllib3 do), or HTTPS sockets recurse forever in the workers.
    from gevent import monkey

    monkey.patch_all()

import logging  # noqa: E402

import click  # noqa: E402

from .. import __version__  # noqa: E402
from .ctl import ctl, status_main  # noqa: E402
from .doctor import doctor  # noqa: E402
from .services import agent, router, server  # noqa: E402
from .up import up  # noqa: E402


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
