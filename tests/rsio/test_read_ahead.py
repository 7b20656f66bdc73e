"""Subscriptions read against demand: without demand nothing is read, and what a
connection's subscriptions hold (TANK bundles unpacked included) stays bounded,
so many idle subscriptions neither fill the server's memory nor stall it."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable
from pathlib import Path

from headrace.client import PravegaClient
from headrace.client.rsio import RsioClient, Subscription
from headrace.client.tank import TankClient
from headrace.protocols.rsio import (
    OnNext,
    ReactiveConnection,
    Request,
    Role,
    Subscribe,
    Subscribed,
)
from headrace.protocols.tank import (
    BundleMessage,
    CreateTopicResult,
    ProduceError,
    encode_bundle,
)
from tests._server import memory_kib, reset_memory_peak

from .conftest import WAIT_S, Server, new_stream, start_server, stop, write_events

IDLE_SUBSCRIPTIONS = 400
HEALTH_WITHIN_S = 2.0
"""Longest ``/health`` may take while the subscriptions come in (unbounded, reading
ahead for them stalled the server for seconds)."""


async def _health_s(server: Server) -> float:
    """How long one ``GET /health`` takes, to its last byte."""
    began = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.http_port)
    try:
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
        assert head.startswith(b"HTTP/1.1 200"), head[:100]
        length = re.search(rb"(?i)content-length: *(\d+)", head)
        assert length is not None
        await asyncio.wait_for(reader.readexactly(int(length.group(1))), WAIT_S)
    finally:
        writer.close()
    return time.monotonic() - began


async def _slowest_health_s(server: Server, work: Awaitable[object]) -> float:
    """The slowest ``/health`` while ``work`` runs (asked one after the other)."""
    task = asyncio.ensure_future(work)
    slowest = 0.0
    try:
        while not task.done():
            slowest = max(slowest, await _health_s(server))
        await task
    finally:
        task.cancel()
    return slowest


class _Idle:
    """One connection with many subscriptions at demand 0, sent in one write."""

    def __init__(self, server: Server) -> None:
        self._server = server
        self._conn = ReactiveConnection(Role.CLIENT)

    async def open(self, publisher: str, count: int) -> None:
        self.reader, self.writer = await asyncio.open_connection(
            "127.0.0.1", self._server.rsio_port
        )
        for sid in range(1, count + 1):
            self._conn.send(Subscribe(publisher, sid, 0))
        self.writer.write(self._conn.data_to_send())
        subscribed = 0
        while subscribed < count:  # every subscription is started by then
            for event in await self._events():
                subscribed += isinstance(event, Subscribed)

    async def _events(self) -> list[object]:
        data = await asyncio.wait_for(self.reader.read(65536), WAIT_S)
        assert data, "the server closed the connection"
        self._conn.receive_data(data)
        return list(self._conn.events())

    async def first_element(self, sid: int) -> bytes:
        """Ask subscription ``sid`` for one element and wait for it."""
        self._conn.send(Request(sid, 1))
        self.writer.write(self._conn.data_to_send())
        while True:
            for event in await self._events():
                if isinstance(event, OnNext) and event.subscriber == sid:
                    return event.element

    def close(self) -> None:
        self.writer.close()


async def _read_all(client: RsioClient, publisher: str, count: int) -> list[bytes]:
    sub: Subscription = client.subscribe(publisher, batch=8)
    return [await asyncio.wait_for(sub.next(), WAIT_S) for _ in range(count)]


async def test_subscriptions_without_demand_read_nothing(tmp_path: Path) -> None:
    server = start_server(tmp_path / "data")  # its own process: its memory is ours to read
    try:
        pravega = PravegaClient(server.controller_uri)
        try:
            scope, stream = await new_stream(pravega)
            # 40 MB of 2 MB events: each subscription that read one ahead would hold 2 MB.
            events = [bytes([i]) * 2_000_000 for i in range(20)]
            await write_events(pravega, scope, stream, events)
        finally:
            await pravega.aclose()
        name = f"{scope}/{stream}"
        pid = server.process.pid
        reset_memory_peak(pid)
        before = memory_kib(pid, "VmRSS")
        idle = _Idle(server)
        client = await RsioClient.connect("127.0.0.1", server.rsio_port)
        try:
            slowest = await _slowest_health_s(server, idle.open(name, IDLE_SUBSCRIPTIONS))
            # Another subscriber reads the whole stream meanwhile.
            reading = _read_all(client, name, len(events))
            slowest = max(slowest, await _slowest_health_s(server, reading))
            peak = memory_kib(pid, "VmHWM")
            # The idle subscriptions are alive: demand gets an element at once.
            assert await idle.first_element(IDLE_SUBSCRIPTIONS) == events[0]
        finally:
            idle.close()
            await client.goodbye()
        assert slowest < HEALTH_WITHIN_S, f"/health took {slowest:.1f} s"
        grown_kib = peak - before
        assert grown_kib < 64 * 1024, f"peak grew by {grown_kib} KiB"
    finally:
        stop(server)


async def test_compressible_tank_bundles_cost_bounded_memory(tmp_path: Path) -> None:
    server = start_server(tmp_path / "data")
    try:
        # Bundles of 15 MB of zeros: 0.7 MB each as stored, Snappy unpacks them 20-fold.
        messages = [BundleMessage(bytes(240_000), i, b"") for i in range(64)]
        bundle = encode_bundle(messages, compress=True)
        assert len(bundle) * 20 < 64 * 240_000
        async with await TankClient.connect("127.0.0.1", server.tank_port) as tank:
            assert await tank.create_topic("packed", 1) is CreateTopicResult.CREATED
            for _ in range(10):
                assert await tank.produce_bundle("packed", 0, bundle) is ProduceError.OK
            # A bundle that unpacks to more than an append can hold is refused.
            bomb = encode_bundle([BundleMessage(bytes(17 * 1024 * 1024), 1, b"")], compress=True)
            assert await tank.produce_bundle("packed", 0, bomb) is ProduceError.INVALID_SEQ_NUMS
        pid = server.process.pid
        reset_memory_peak(pid)
        before = memory_kib(pid, "VmRSS")
        idle = _Idle(server)
        client = await RsioClient.connect("127.0.0.1", server.rsio_port)
        try:
            slowest = await _slowest_health_s(server, idle.open("tank/packed", 100))
            reading = _read_all(client, "tank/packed", 10 * len(messages))
            slowest = max(slowest, await _slowest_health_s(server, reading))
            peak = memory_kib(pid, "VmHWM")
            assert await idle.first_element(1) == bytes(240_000)
        finally:
            idle.close()
            await client.goodbye()
        assert slowest < HEALTH_WITHIN_S, f"/health took {slowest:.1f} s"
        grown_kib = peak - before
        assert grown_kib < 96 * 1024, f"peak grew by {grown_kib} KiB"
    finally:
        stop(server)
