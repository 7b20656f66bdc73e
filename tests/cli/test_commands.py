"""Every registered subcommand loads and answers --help; verify stays light."""

from __future__ import annotations

import subprocess
import sys

import pytest
from click.testing import CliRunner

from headrace.cli import COMMANDS, main


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
