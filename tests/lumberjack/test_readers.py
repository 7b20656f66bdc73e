"""Events shipped over Lumberjack are readable through the record reader
(``headrace.client.records``) and the real Pravega client's reader group."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path

from headrace.client import PravegaClient
from headrace.client.records import Record, RecordReader
from headrace.protocols.lumberjack import Compressed, Data, JsonData, ProtocolVersion, WindowSize
from tests._real_pravega import run_scenario
from tests.lumberjack.harness import LumberjackClient, Server, as_stored, start_server

READER_TIMEOUT_S = 90.0
V2_EVENTS = 300


def _ship(server: Server) -> set[bytes]:
    """300 v2 events from 6 hosts and 2 v1 events; returns the payloads as stored."""
    sent: set[bytes] = set()
    with LumberjackClient(server.port, ProtocolVersion.V2) as client:
        for window in range(3):
            frames = []
            for i in range(100):
                n = window * 100 + i
                payload = json.dumps({"message": f"event {n}", "host": f"h{n % 6}"}).encode()
                frames.append(JsonData(i + 1, payload))
                sent.add(as_stored(payload))
            client.send(WindowSize(100), Compressed(tuple(frames)))
            client.wait_for_ack(100)
    with LumberjackClient(server.port, ProtocolVersion.V1) as client:
        client.send(WindowSize(2), Data(1, ((b"line", b"a"),)), Data(2, ((b"line", b"b"),)))
        client.wait_for_ack(2)
    return sent | {as_stored(b'{"line":"a"}'), as_stored(b'{"line":"b"}')}


async def _read_records(uri: str) -> list[Record]:
    async with PravegaClient(uri) as client, RecordReader(client, "logs", "beats") as reader:
        return [r async for r in reader]


def test_lumberjack_events_are_readable_by_record_and_pravega_readers(tmp_path: Path) -> None:
    server = start_server(tmp_path / "data", pravega=True)
    try:
        sent = _ship(server)
        uri = f"tcp://127.0.0.1:{server.controller_port}"
        records = asyncio.run(asyncio.wait_for(_read_records(uri), READER_TIMEOUT_S))
        assert Counter(r.value for r in records) == Counter(sent)
        assert all(r.stream == "logs/beats" for r in records)
        read = run_scenario("read_group", uri, "logs", "beats", "pravega", str(len(sent)))
        events = read["events"]
        assert Counter(e.encode("latin-1") for e in events) == Counter(sent)
    finally:
        assert server.stop() == 0, server.stderr
