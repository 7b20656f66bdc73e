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
    "cluster": ("headrace.cli.cluster", "cluster"),
    "scope": ("headrace.cli.scope", "scope"),
    "group": ("headrace.cli.group", "group"),
    "kv": ("headrace.cli.kv", "kv"),
    "bench": ("headrace.cli.bench", "bench"),
    "context": ("headrace.cli.context", "context"),
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
        _show_envvars(command)
        return command


def _show_envvars(command: click.Command) -> None:
    """Every option read from a ``HEADRACE_*`` variable says so in its ``--help``."""
    for param in command.params:
        if isinstance(param, click.Option) and param.envvar:
            param.show_envvar = True
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            _show_envvars(sub)


ENVIRONMENT: dict[str, str] = {
    "HEADRACE_CONTEXT": "saved context to use (--context)",
    "HEADRACE_CONTROLLER": "controller URI of the client commands (--controller)",
    "HEADRACE_CA": "CA file to trust (--ca)",
    "HEADRACE_CLIENT_CERT": "client certificate (--client-cert)",
    "HEADRACE_CLIENT_KEY": "client key (--client-key)",
    "HEADRACE_USER": "auth user (--user)",
    "HEADRACE_PASSWORD_FILE": "auth password file (--password-file)",
    "HEADRACE_HOST": "server host of headrace status (--host)",
    "HEADRACE_HTTP_PORT": "HTTP port of headrace status (--http-port)",
    "HEADRACE_AUTH_PASSWORD_FILE": "password file of headrace user (--file)",
    "HEADRACE_CONFIG": "TOML file of headrace serve (--config)",
    "HEADRACE_<OPTION>": "any headrace serve option (see headrace serve --help)",
}
"""The environment variables of every command, listed in ``headrace --help``."""

_CLIENT_FREE = frozenset({"serve", "verify", "repair", "user", "context", "demo", "status"})
"""Commands a saved context does not apply to: they take no controller (``status``
reads an HTTP port, where a context's CA would turn HTTPS on)."""


def _epilog() -> str:
    width = max(len(name) for name in ENVIRONMENT)
    lines = [f"  {name.ljust(width)}  {meaning}" for name, meaning in ENVIRONMENT.items()]
    return "\b\nEnvironment variables (a flag wins over its variable):\n" + "\n".join(lines)


@click.group(cls=LazyGroup, epilog=_epilog())
@click.version_option(__version__, prog_name="headrace")
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
@click.option(
    "--context",
    "context_name",
    envvar="HEADRACE_CONTEXT",
    show_envvar=True,
    help="Saved context (headrace context add) for the client commands; default: the current one.",
)
@click.pass_context
def main(ctx: click.Context, verbose: int, context_name: str | None) -> None:
    """headrace: a durable streaming storage service."""
    from headrace.cli._logging import configure_logging

    configure_logging(logging.WARNING - 10 * min(verbose, 2))
    if ctx.invoked_subcommand not in _CLIENT_FREE and not ctx.resilient_parsing:
        from headrace.cli.context import apply_context

        apply_context(context_name)
