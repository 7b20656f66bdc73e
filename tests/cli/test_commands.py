"""Every registered subcommand loads and answers --help; verify stays light."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import click
import pytest
from click.testing import CliRunner

from headrace.cli import COMMANDS, ENVIRONMENT, main


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_loads_and_has_help(name: str) -> None:
    result = CliRunner().invoke(main, [name, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output


def test_unknown_command_is_a_usage_error() -> None:
    result = CliRunner().invoke(main, ["no-such-command"])
    assert result.exit_code == 2
    assert "No such command" in result.output


def test_verify_does_not_import_the_server_or_grpc() -> None:
    code = (
        "import sys\n"
        "from headrace.cli import main\n"
        "main.get_command(None, 'verify')\n"
        "print(sorted(m for m in sys.modules if m in {'grpc', 'headrace.server.app'}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def _options(command: click.Command) -> Iterator[click.Option]:
    for param in command.params:
        if isinstance(param, click.Option):
            yield param
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            yield from _options(sub)


def test_every_headrace_variable_is_shown_in_help() -> None:
    """Each option read from a variable says so, and ``headrace --help`` lists the
    variables of every command (``headrace serve``'s as ``HEADRACE_<OPTION>``)."""
    ctx = click.Context(main)
    top = subprocess.run(
        [sys.executable, "-m", "headrace", "--help"], capture_output=True, text=True, timeout=60
    )
    assert top.returncode == 0, top.stderr
    assert "HEADRACE_CONTEXT" in top.stdout
    for name in sorted(COMMANDS):
        command = main.get_command(ctx, name)
        assert command is not None
        for option in _options(command):
            names = [option.envvar] if isinstance(option.envvar, str) else option.envvar or []
            for envvar in names:
                assert option.show_envvar, (name, option.name)
                if name != "serve":
                    assert envvar in ENVIRONMENT and envvar in top.stdout, (name, envvar)
    read_help = " ".join(CliRunner().invoke(main, ["read", "--help"]).output.split())
    assert "env var: HEADRACE_CONTROLLER" in read_help
