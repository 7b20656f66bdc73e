"""Routing Lumberjack events to streams by their fields, with the real pylogbeat.

``--lumberjack-stream`` with ``{field}`` placeholders names each event's
stream (Logstash's ``%{[@metadata][beat]}`` idiom); events the template
cannot place go to ``--lumberjack-default-stream``. Each stored event gets
the connection's ``@metadata`` (the client's address), replacing what a
client wrote under those names.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pylogbeat

from headrace.client.sync import SyncClient
from tests.lumberjack.harness import IO_TIMEOUT_S, start_server, stored_events

CLIENT_TIMEOUT_S = 60.0


def _ship(port: int, events: list[dict[str, Any]]) -> None:
    """``events`` through pylogbeat (it blocks: a thread, a bounded join)."""
    outcome: dict[str, Any] = {}

    def client() -> None:
        try:
            with pylogbeat.PyLogBeatClient("127.0.0.1", port, timeout=IO_TIMEOUT_S) as beat:
                beat.send(events)
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=client, daemon=True)
    thread.start()
    thread.join(CLIENT_TIMEOUT_S)
    assert not thread.is_alive(), "pylogbeat hung"
    assert "error" not in outcome, outcome


def _messages(data_dir: Path, stream: str) -> list[dict[str, Any]]:
    return [json.loads(e) for events in stored_events(data_dir, stream).values() for e in events]


def test_template_routes_each_event_by_its_beat(tmp_path: Path) -> None:
    server = start_server(
        tmp_path / "data",
        "--lumberjack-stream",
        "logs/{[@metadata][beat]}",
        "--lumberjack-default-stream",
        "logs/other",
    )
    events = [
        {"@metadata": {"beat": "filebeat", "version": "8.15.0"}, "message": "f1"},
        {"@metadata": {"beat": "metric_beat"}, "message": "m1"},
        {"message": "no beat"},
        {"@metadata": {"beat": "filebeat", "ip_address": "6.6.6.6"}, "message": "f2"},
        {"@metadata": {"beat": None}, "message": "null beat"},
    ]
    try:
        _ship(server.port, events)
    finally:
        assert server.stop() == 0, server.stderr
    data = tmp_path / "data"
    filebeat = _messages(data, "logs/filebeat")
    assert [e["message"] for e in filebeat] == ["f1", "f2"]
    assert filebeat[0]["@metadata"] == {
        "beat": "filebeat",
        "version": "8.15.0",
        "ip_address": "127.0.0.1",
    }
    # the client's own ip_address is replaced by the connection's
    assert filebeat[1]["@metadata"] == {"beat": "filebeat", "ip_address": "127.0.0.1"}
    assert [e["message"] for e in _messages(data, "logs/metric-beat")] == ["m1"]
    other = _messages(data, "logs/other")
    assert [e["message"] for e in other] == ["no beat", "null beat"]
    assert other[0]["@metadata"] == {"ip_address": "127.0.0.1"}
    assert "events go to logs/other" in server.log_text()


def test_missing_streams_go_to_the_default_stream_when_creation_is_off(tmp_path: Path) -> None:
    server = start_server(
        tmp_path / "data",
        "--lumberjack-stream",
        "{[fields][team]}/app",
        "--lumberjack-default-stream",
        "logs/other",
        "--lumberjack-create-streams",
        "off",
        "--lumberjack-metadata",
        "off",
        pravega=True,
    )
    events = [
        {"fields": {"team": "ops"}, "message": "to ops"},
        {"fields": {"team": "dev"}, "message": "dev has no stream"},
        {"fields": {"team": "tank"}, "message": "the TANK scope is not for events"},
    ]
    try:
        with SyncClient(f"tcp://127.0.0.1:{server.controller_port}") as client:
            client.create_scope("ops")
            client.create_stream("ops", "app", segments=2)
        _ship(server.port, events)
        log = server.log_text()
    finally:
        assert server.stop() == 0, server.stderr
    data = tmp_path / "data"
    assert [e["message"] for e in _messages(data, "ops/app")] == ["to ops"]
    other = [e["message"] for e in _messages(data, "logs/other")]
    assert other == ["dev has no stream", "the TANK scope is not for events"]
    assert stored_events(data, "dev/app") == {}
    assert "dev/app does not exist" in log and "tank/app is in the TANK scope" in log
    # metadata off: events are stored as pylogbeat sent them
    assert stored_events(data, "ops/app") and all(
        "@metadata" not in e for e in _messages(data, "ops/app")
    )
