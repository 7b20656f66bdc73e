"""docs/configuration.md is generated from the option table and must stay current."""

from __future__ import annotations

from pathlib import Path

from headrace.cli.serve import render_docs, serve
from headrace.server.config import OPTIONS

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_configuration_doc_matches_the_option_table() -> None:
    assert DOC.read_text() == render_docs(), (
        "docs/configuration.md is stale: python -m headrace.cli.serve > docs/configuration.md"
    )


def test_every_option_is_a_flag_with_its_env_var() -> None:
    flags = {opt for param in serve.params for opt in getattr(param, "opts", [])}
    envvars = {getattr(param, "envvar", None) for param in serve.params}
    for option in OPTIONS:
        assert option.flag in flags
        assert option.envvar in envvars


def test_the_stable_flags_and_env_vars_still_exist() -> None:
    flags = {opt for param in serve.params for opt in getattr(param, "opts", [])}
    envvars = {getattr(param, "envvar", None) for param in serve.params}
    for name in ("controller", "segment-store", "tank", "lumberjack", "lumberjack-tls", "rsio"):
        assert f"--{name}-port" in flags
    assert "--http-port" in flags
    for flag in (
        "--data-dir",
        "--fsync",
        "--fsync-interval",
        "--host",
        "--tls-cert",
        "--tls-key",
        "--tls-ca",
        "--lumberjack-stream",
        "--lumberjack-routing-key-fields",
        "--lumberjack-keepalive-interval",
        "--lumberjack-window-linger",
        "--lumberjack-idle-timeout",
        "--lumberjack-max-window",
        "--lumberjack-max-frame-bytes",
        "--lumberjack-max-decompressed-bytes",
        "--lumberjack-max-pending-bytes",
        "--retention-interval",
        "--auto-scale-interval",
        "--tank-scope",
    ):
        assert flag in flags
        assert "HEADRACE_" + flag[2:].replace("-", "_").upper() in envvars
