"""Lumberjack configuration and routing-key extraction (no sockets)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from headrace.cli import main
from headrace.errors import ConfigError
from headrace.protocols.lumberjack import parse_json_object
from headrace.protocols.lumberjack.codec import document_parser
from headrace.server.lumberjack_config import (
    DEFAULT_ROUTING_KEY_FIELDS,
    LumberjackConfig,
    StreamTemplate,
    parse_field_path,
)
from headrace.server.lumberjack_target import (
    _field_text,
    _routing_key,
    add_metadata,
    certificate_subject,
    connection_metadata,
)

_DOC_PARSER = document_parser(("@metadata",))

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


def test_stream_template_names_a_stream_from_fields() -> None:
    template = StreamTemplate.parse("logs/{[@metadata][beat]}")
    assert template.fields == (("@metadata", "beat"),)
    assert template.render(("filebeat",)) == "logs/filebeat"
    assert template.render(("my_app  v2",)) == "logs/my-app-v2"  # runs of bad characters
    assert template.render((None,)) is None
    assert template.render(("",)) is None
    assert template.render(("___",)) is None  # nothing of the value is left
    assert template.render(("x" * 300,)) is None  # over the name length
    both = StreamTemplate.parse("%{team}/app-{[fields][app]}")  # Logstash's %{...} too
    assert both.render(("ops", "web")) == "ops/app-web"
    assert StreamTemplate.parse("logs/beats").fields == ()
    for bad in ("logs", "logs/{host}/x", "{host}", "lo gs/{host}", "logs/{[a]b}", "logs/{}"):
        with pytest.raises(ConfigError):
            StreamTemplate.parse(bad)


def test_template_field_text() -> None:
    def text(doc: object, path: tuple[str, ...]) -> str | None:
        payload = json.dumps(doc).encode()
        return _field_text(parse_json_object(payload), payload, path)

    assert text({"a": {"b": "x"}}, ("a", "b")) == "x"
    assert text({"host": {"name": "web-1"}}, ("host",)) == "web-1"
    assert text({"n": 7, "t": True}, ("n",)) == "7"
    assert text({"n": 7, "t": True}, ("t",)) == "true"
    for absent in ({"a": None}, {"a": [1]}, {"a": {"c": 1}}, {}):
        assert text(absent, ("a",)) is None


def test_template_config_validation() -> None:
    config = LumberjackConfig(stream="logs/{[@metadata][beat]}", default_stream="logs/other")
    config.validate()
    assert config.template is not None
    assert config.scope_and_stream == ("logs", "other")
    assert config.scopes() == ("logs",)
    assert LumberjackConfig(stream="{team}/x", default_stream="d/y").scopes() == ("d",)
    with pytest.raises(ConfigError, match="--lumberjack-default-stream"):
        LumberjackConfig(stream="logs/{x}", default_stream="nope").validate()


def test_metadata_goes_first_or_replaces_the_clients_own() -> None:
    meta: dict[str, object] = {"ip_address": "10.0.0.7"}
    meta_json = b'{"ip_address":"10.0.0.7"}'

    def added(payload: bytes) -> bytes:
        return add_metadata(payload, _DOC_PARSER(payload), meta, meta_json)

    assert added(b'{"message":"hi" }') == b'{"@metadata":{"ip_address":"10.0.0.7"},"message":"hi" }'
    assert added(b" { } ") == b'{"@metadata":{"ip_address":"10.0.0.7"}}'
    forged = b'{"@metadata":{"beat":"filebeat","ip_address":"6.6.6.6"},"message":"hi"}'
    assert json.loads(added(forged)) == {
        "@metadata": {"beat": "filebeat", "ip_address": "10.0.0.7"},
        "message": "hi",
    }
    assert json.loads(added(b'{"@metadata":"text","n":1e400}'))["@metadata"] == meta


def test_connection_metadata_names_the_peer_and_its_certificate() -> None:
    assert connection_metadata(("127.0.0.1", 5), False, None) == {"ip_address": "127.0.0.1"}
    assert connection_metadata(("::1", 5, 0, 0), True, None) == {
        "ip_address": "::1",
        "tls_peer": {"status": "unverified"},
    }
    cert = {
        "subject": (
            (("countryName", "FR"),),
            (("organizationName", "A, B"),),
            (("commonName", "beat-1"),),
        )
    }
    assert certificate_subject(cert) == "CN=beat-1,O=A\\, B,C=FR"
