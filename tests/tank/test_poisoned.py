"""A TANK topic holds only bundles: every front door's appends into the TANK scope
are checked, and an event that is not a bundle all the same (stored behind the
server's back) is skipped and counted by every reader instead of hiding what
follows it."""

from __future__ import annotations

import asyncio
import re
import struct
import urllib.request
from pathlib import Path

import pytest

from headrace.client import PravegaClient
from headrace.client.errors import ReplyError
from headrace.client.rsio import RsioClient, RsioError
from headrace.client.tank import TankClient
from headrace.protocols.tank import BundleMessage, CreateTopicResult, encode_bundle
from headrace.store.disk import DiskStore
from tests.rsio.conftest import WAIT_S, Server, start_server

SEGMENT = "tank/poisoned/0.#epoch.0"
NOT_BUNDLES = (
    b"hello world",  # parses as a sparse bundle header: only a full check tells
    b'{"message": "a log line"}',
)


def _event(payload: bytes) -> bytes:
    return struct.pack(">ii", 0, len(payload)) + payload


def _metric(server: Server, name: str, **labels: str) -> float:
    url = f"http://127.0.0.1:{server.http_port}/metrics"
    with urllib.request.urlopen(url, timeout=WAIT_S) as reply:
        text = reply.read().decode()
    wanted = ",".join(f'{key}="{value}"' for key, value in labels.items())
    match = re.search(rf"^{name}{{{wanted}}} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


async def _poison(data_dir: Path) -> None:
    """What a writer behind the server's back leaves: events that are not bundles."""
    store = await DiskStore.open(data_dir)
    try:
        for payload in NOT_BUNDLES:
            await store.append(SEGMENT, _event(payload))
    finally:
        await store.close()


async def test_readers_skip_and_count_events_that_are_not_bundles(tmp_path: Path) -> None:
    server = start_server(tmp_path / "data")
    try:
        async with await TankClient.connect("127.0.0.1", server.tank_port) as tank:
            assert await tank.create_topic("poisoned", 1) is CreateTopicResult.CREATED
            await tank.produce("poisoned", 0, [BundleMessage(b"m1", 1)])
        server.stop()
        await _poison(tmp_path / "data")
        server.start()
        async with await TankClient.connect("127.0.0.1", server.tank_port) as tank:
            # Produces after the bad events are acknowledged and reachable.
            await tank.produce("poisoned", 0, [BundleMessage(b"m2", 2)])
            await tank.produce("poisoned", 0, [BundleMessage(b"m3", 3, b"k3")])
            result = await asyncio.wait_for(tank.consume("poisoned", 0, 0, max_wait_ms=0), WAIT_S)
            assert [(m.seq_num, m.content) for m in result.messages] == [
                (1, b"m1"),
                (2, b"m2"),
                (3, b"m3"),
            ]
            later = await asyncio.wait_for(tank.consume("poisoned", 0, 3, max_wait_ms=0), WAIT_S)
            assert [m.content for m in later.messages] == [b"m3"]
        assert _metric(server, "headrace_skipped_events_total", reader="tank") >= len(NOT_BUNDLES)
        # RS-IO subscribes to the topic and gets every message.
        client = await RsioClient.connect("127.0.0.1", server.rsio_port)
        try:
            sub = client.subscribe("tank/poisoned", batch=8)
            got = [await asyncio.wait_for(sub.next(), WAIT_S) for _ in range(3)]
            assert got == [b"m1", b"m2", b"m3"]
        finally:
            await client.goodbye()
        assert _metric(server, "headrace_skipped_events_total", reader="rsio") == len(NOT_BUNDLES)
        # So does the record reader (the CLI's and Spark's), counting what it skipped.
        async with (
            PravegaClient(server.controller_uri) as pravega,
            pravega.record_reader("tank", "poisoned") as reader,
        ):
            records = [r async for r in reader]
            assert [(r.key, r.value) for r in records] == [
                (None, b"m1"),
                (None, b"m2"),
                (b"k3", b"m3"),
            ]
            assert reader.skipped == len(NOT_BUNDLES)
    finally:
        server.kill()


async def test_appends_into_the_tank_scope_that_are_not_bundles_are_refused(
    tmp_path: Path,
) -> None:
    server = start_server(tmp_path / "data")
    try:
        async with await TankClient.connect("127.0.0.1", server.tank_port) as tank:
            assert await tank.create_topic("guarded", 1) is CreateTopicResult.CREATED
            await tank.produce("guarded", 0, [BundleMessage(b"t1", 1)])
            async with PravegaClient(server.controller_uri) as pravega:
                writer = await pravega.create_writer("tank", "guarded")
                async with writer:
                    with pytest.raises(ReplyError, match="not a TANK bundle"):
                        await writer.write(b"not a bundle")
                        await writer.flush()
                # A bundle is welcome through any door.
                writer = await pravega.create_writer("tank", "guarded")
                async with writer:
                    await writer.write(encode_bundle([BundleMessage(b"p2", 2)]))
                    await writer.flush()
            rsio = await RsioClient.connect("127.0.0.1", server.rsio_port)
            try:
                with pytest.raises(RsioError, match="not a TANK bundle"):
                    await asyncio.wait_for(
                        rsio.offer("tank/guarded", [b"not a bundle either"]), WAIT_S
                    )
            finally:
                await rsio.goodbye()
            await tank.produce("guarded", 0, [BundleMessage(b"t3", 3)])
            result = await asyncio.wait_for(tank.consume("guarded", 0, 0, max_wait_ms=0), WAIT_S)
        assert [(m.seq_num, m.content) for m in result.messages] == [
            (1, b"t1"),
            (2, b"p2"),
            (3, b"t3"),
        ]
        assert _metric(server, "headrace_skipped_events_total", reader="tank") == 0
    finally:
        server.kill()
