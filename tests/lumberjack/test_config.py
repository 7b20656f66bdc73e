"""Lumberjack configuration and routing-key extraction (no sockets)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from headrace.cli import main
from headrace.errors import ConfigError
from headrace.protocols.lumberjack import parse_json_object
from headrace.server.lumberjack_config import (
    DEFAULT_ROUTING_KEY_FIELDS,
    LumberjackConfig,
    parse_field_path,
)
from headrace.server.lumberjack_target import _routing_key

PATHS = tuple(parse_field_path(f) for f in DEFAULT_ROUTING_KEY_FIELDS)


def _key(doc: object) -> str | None:
    payload = json.dumps(doc).encode()
    return _routing_key(parse_json_object(payload), payload, PATHS)


def test_parse_field_path_plain_and_nested() -> None:
    assert parse_field_path("host") == ("host",)
    assert parse_field_path("log.file.path") == ("log.file.path",)
    assert parse_field_path("[beat][hostname]") == ("beat", "hostname")
    for bad in ("", "[beat]hostname", "beat[hostname]", "[beat][", "[]"):
        with pytest.raises(ConfigError):
            parse_field_path(bad)


def test_routing_key_takes_the_first_field_present() -> None:
    assert _key({"host": "h1", "beat": {"hostname": "b1"}}) == "h1"
    assert _key({"beat": {"hostname": "b1"}}) == "b1"
    assert _key({"host": None, "beat": {"hostname": "b1"}}) == "b1"
    assert _key({"host": {"name": "ecs-1", "os": {}}}) == "ecs-1"  # Beats >= 6.3
    assert _key({"host": {"b": 1, "a": 2}}) == '{"a":2,"b":1}'
    assert _key({"host": 7}) == "7"
    assert _key({"host": 1.50}) == "1.5"  # a number's key is its JSON text, as parsed
    assert _key({"host": {"name": 5, "b": [True, None]}}) == '{"b":[true,null],"name":5}'
    assert _key({"host": False}) == "false"
    assert _key({"host": ["a"]}) == '["a"]'
    assert _key({"message": "no host here"}) is None
    assert _key({"message": 'mentions "host" only in text'}) is None
    payload = b'{"\\u0068ost":"escaped"}'  # the field name written with an escape
    assert _routing_key(parse_json_object(payload), payload, PATHS) == "escaped"
    assert _routing_key({"host": "h"}, b'{"host":"h"}', ()) is None  # no fields configured


def test_config_validation_refuses_bad_values() -> None:
    LumberjackConfig().validate()
    for bad in (
        LumberjackConfig(stream="no-slash"),
        LumberjackConfig(stream="bad name/x"),
        LumberjackConfig(routing_key_fields=("[a",)),
        LumberjackConfig(keepalive_interval_s=0),
        LumberjackConfig(max_pending_bytes=10),
        LumberjackConfig(window_linger_s=-1),
    ):
        with pytest.raises(ConfigError):
            bad.validate()


def test_serve_flags_refuse_a_tls_key_without_a_certificate(tmp_path: Path) -> None:
    key = tmp_path / "k.pem"
    key.write_text("x")
    result = CliRunner().invoke(
        main, ["serve", "--data-dir", str(tmp_path / "d"), "--tls-key", str(key)]
    )
    assert result.exit_code == 2
    assert "--tls-cert and --tls-key go together" in result.output
    result = CliRunner().invoke(
        main, ["serve", "--data-dir", str(tmp_path / "d"), "--lumberjack-stream", "x"]
    )
    assert result.exit_code == 2  # a bad value is a usage error naming the option
    assert "--lumberjack-stream" in result.output
    assert not (tmp_path / "d").exists()
