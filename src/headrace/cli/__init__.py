"""The ``headrace`` command. The only place that configures logging or reads the terminal.

Subcommands are imported only when they run (``LazyGroup``): ``headrace verify``
must not pay for importing the server, gRPC and the client.
"""

from __future__ import annotations

import importlib
import logging
import os

import click

from headrace import __version__

__all__ = ["main"]

COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("headrace.cli.serve", "serve"),
    "verify": ("headrace.cli.verify", "verify"),
    "repair": ("headrace.cli.repair", "repair"),
    "demo": ("headrace.cli.demo", "demo"),
    "stream": ("headrace.cli.stream", "stream"),
    "write": ("headrace.cli.events", "write"),
    "read": ("headrace.cli.events", "read"),
    "tail": ("headrace.cli.events", "tail"),
    "status": ("headrace.cli.status", "status"),
    "user": ("headrace.cli.user", "user"),
    "cert": ("headrace.cli.cert", "cert"),
}
"""Command name -> (module, attribute) of its click command."""


class LazyGroup(click.Group):
    """A click group that imports a subcommand's module when it is looked up."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module, attribute = target
        if cmd_name != "serve":
            # gRPC's C core logs every failed TLS handshake or connect attempt to
            # stderr on its own; a client command says what went wrong in one
            # line instead (set GRPC_VERBOSITY to see them). Before grpc loads.
            os.environ.setdefault("GRPC_VERBOSITY", "NONE")
        command = getattr(importlib.import_module(module), attribute)
        assert isinstance(command, click.Command), (module, attribute)
        return command


@click.group(cls=LazyGroup)
@click.version_option(__version__, prog_name="headrace")
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
def main(verbose: int) -> None:
    """headrace: a durable streaming storage service."""
    from headrace.cli._logging import configure_logging

    configure_logging(logging.WARNING - 10 * min(verbose, 2))
