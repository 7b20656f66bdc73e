"""Configuration of ``headrace serve``: TOML < environment < flags; bad values fail at start."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from headrace.errors import ConfigError
from headrace.server.config import DEFAULT_PORTS, build_config
from tests.ops.conftest import START_TIMEOUT_S, free_port, listener_args, run_env, serve_command


def test_toml_then_env_then_flags_each_override_the_one_before(
    tmp_path: Path, start_serve: Any
) -> None:
    http, tank, rsio_toml, rsio_env = free_port(), free_port(), free_port(), free_port()
    lumberjack_env, lumberjack_flag = free_port(), free_port()
    config = tmp_path / "headrace.toml"
    config.write_text(
        f"http_port = {http}\n"
        f"tank_port = {tank}\n"
        f"rsio_port = {rsio_toml}\n"
        "lumberjack_port = 1\n"
        'log_format = "json"\n'
        "controller_port = 0\nsegment_store_port = 0\nlumberjack_tls_port = 0\n"
    )
    serve = start_serve(
        "--config",
        str(config),
        "--lumberjack-port",
        str(lumberjack_flag),
        env={
            "HEADRACE_RSIO_PORT": str(rsio_env),
            "HEADRACE_LUMBERJACK_PORT": str(lumberjack_env),
        },
    )
    assert serve.ports == {
        "http": http,  # TOML only
        "tank": tank,  # TOML only
        "rsio": rsio_env,  # the environment beats TOML
        "lumberjack": lumberjack_flag,  # the flag beats the environment
    }
    assert serve.get("/health")[0] == 200
    assert serve.wait_for_access(protocol="http")["requests"] == 1  # log_format from the file


def _fails_to_start(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None, ports: list[str]
) -> str:
    result = subprocess.run(
        [*serve_command(tmp_path / "data", *ports), *args],
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
        env=run_env(env),
    )
    assert result.returncode == 2, result.stderr
    assert not (tmp_path / "data").exists(), "nothing may start on a bad value"
    return result.stderr


@pytest.mark.parametrize(
    ("args", "env", "toml", "named"),
    [
        (["--max-connections", "0"], None, None, "--max-connections"),
        ([], {"HEADRACE_IDLE_TIMEOUT": "-1"}, None, "--idle-timeout"),
        ([], {"HEADRACE_PARTIAL_FRAME_TIMEOUT": "soon"}, None, "--partial-frame-timeout"),
        ([], None, 'tank_port = "eleven"', "--tank-port"),
        ([], None, "max_frame_bytes = -5", "--max-frame-bytes"),
        ([], None, 'log_format = "xml"', "--log-format"),
        ([], None, "no_such_option = 1", "no_such_option"),
        (["--lumberjack-stream", "no-slash"], None, None, "--lumberjack-stream"),
    ],
)
def test_a_bad_value_fails_at_start_naming_the_option(
    tmp_path: Path,
    args: list[str],
    env: dict[str, str] | None,
    toml: str | None,
    named: str,
) -> None:
    ports = listener_args()
    if toml is not None:  # ports set in the file too: a flag would override the bad value
        config = tmp_path / "headrace.toml"
        keys = [f"{name}_port" for name in DEFAULT_PORTS if f"{name}_port" not in toml]
        config.write_text("".join(f"{key} = 0\n" for key in keys) + toml + "\n")
        args, ports = ["--config", str(config), *args], []
    assert named in _fails_to_start(tmp_path, *args, env=env, ports=ports)


def test_a_lumberjack_stream_in_the_tank_scope_fails_at_start(tmp_path: Path) -> None:
    """Lumberjack events are JSON, not TANK bundles: they may not go into a TANK topic."""
    ports = listener_args(tank=free_port(), lumberjack=free_port())
    stderr = _fails_to_start(tmp_path, "--lumberjack-stream", "tank/logs", ports=ports)
    assert "--lumberjack-stream 'tank/logs' is in the TANK scope 'tank'" in stderr


def test_build_config_names_the_option_of_a_bad_value() -> None:
    with pytest.raises(ConfigError, match="--max-pending-requests"):
        build_config({"max_pending_requests": 0})
    with pytest.raises(ConfigError, match="unknown option 'nope'"):
        build_config({"nope": 1})
    config = build_config({"max_connections": 7, "partial_frame_timeout": 2.5})
    assert config.limits.max_connections == 7
    assert config.limits.partial_frame_timeout_s == 2.5
