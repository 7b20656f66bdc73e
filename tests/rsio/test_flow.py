"""Demand as the only pace: many subscriptions, slow peers, the live tail, and offers."""

from __future__ import annotations

import asyncio
import statistics
import struct
import time
from pathlib import Path

import pytest

from headrace.client import PravegaClient
from headrace.client.rsio import RsioClient, RsioError
from headrace.protocols.rsio import MAX_DEMAND
from tests._server import memory_kib, reset_memory_peak

from .conftest import WAIT_S, Server, new_stream, start_server, stop, write_events


async def test_fifty_subscriptions_with_different_demand(
    server: Server, pravega: PravegaClient
) -> None:
    scope, stream = await new_stream(pravega)
    events = [b"f%d" % i for i in range(200)]
    await write_events(pravega, scope, stream, events)
    await pravega.controller.seal_stream(scope, stream)
    client = await RsioClient.connect("127.0.0.1", server.rsio_port)
    try:
        name = f"{scope}/{stream}"
        idle = client.subscribe(name, batch=0)  # never requests
        counted = client.subscribe(name, batch=0)
        await counted.request(7)
        readers = [client.subscribe(name, batch=b) for b in range(1, 49)]

        async def read_all(sub: object) -> list[bytes]:
            return [e async for e in sub]  # type: ignore[attr-defined]

        results = await asyncio.wait_for(asyncio.gather(*map(read_all, readers)), WAIT_S)
        assert all(result == events for result in results)
        seven = [await asyncio.wait_for(counted.next(), WAIT_S) for _ in range(7)]
        assert seven == events[:7]
        assert counted.received == 7 and counted.outstanding == 0
        assert idle.received == 0 and idle.outstanding == 0
        # Both still open: a request now is answered.
        await idle.request(2)
        assert [await asyncio.wait_for(idle.next(), WAIT_S) for _ in range(2)] == events[:2]
    finally:
        await client.goodbye()


async def test_a_connection_that_does_not_read_slows_no_other(
    server: Server, pravega: PravegaClient
) -> None:
    scope, stream = await new_stream(pravega)
    events = [bytes([i % 256]) * 50_000 for i in range(200)]  # 10 MB, more than socket buffers
    await write_events(pravega, scope, stream, events)
    await pravega.controller.seal_stream(scope, stream)
    name = f"{scope}/{stream}".encode()
    # Connection A: unbounded demand, never reads a byte.
    unbounded = bytes.fromhex("ffffffffffffffff7f")
    subscribe = bytes([0x04, len(name)]) + name + bytes([0x01]) + unbounded
    _, stalled = await asyncio.open_connection("127.0.0.1", server.rsio_port)
    stalled.write(bytes.fromhex("03010000") + bytes([len(subscribe)]) + subscribe)
    await stalled.drain()
    try:
        for _ in range(2):  # and again, once A's buffers are surely full
            client = await RsioClient.connect("127.0.0.1", server.rsio_port)
            try:
                sub = client.subscribe(name.decode(), batch=64)
                got = await asyncio.wait_for(_collect(sub), WAIT_S)
                assert got == events
            finally:
                await client.goodbye()
    finally:
        stalled.close()


async def _collect(sub: object) -> list[bytes]:
    return [e async for e in sub]  # type: ignore[attr-defined]


async def test_live_tail_median_latency_under_50_ms(server: Server, pravega: PravegaClient) -> None:
    scope, stream = await new_stream(pravega)
    await write_events(pravega, scope, stream, [b"before"])
    client = await RsioClient.connect("127.0.0.1", server.rsio_port)
    writer = await pravega.create_writer(scope, stream)
    try:
        sub = client.subscribe(f"{scope}/{stream}", batch=MAX_DEMAND)
        # Once the event written before arrives, the subscription waits at the tail.
        assert await asyncio.wait_for(sub.next(), WAIT_S) == b"before"
        latencies: list[float] = []
        for _ in range(1000):
            sent = time.perf_counter()
            await writer.write(struct.pack(">d", sent))
            await writer.flush()
            element = await asyncio.wait_for(sub.next(), WAIT_S)
            latencies.append(time.perf_counter() - struct.unpack(">d", element)[0])
        median = statistics.median(latencies)
        assert median < 0.050, f"median {median * 1000:.1f} ms"
    finally:
        await writer.aclose()
        await client.goodbye()


async def test_offer_of_100000_elements_is_stored_once_in_order(
    server: Server, pravega: PravegaClient
) -> None:
    scope, stream = await new_stream(pravega, segments=2)
    elements = [b"o%06d" % i for i in range(100_000)]
    client = await RsioClient.connect("127.0.0.1", server.rsio_port)
    try:
        assert await asyncio.wait_for(client.offer(f"{scope}/{stream}", elements), 60) == 100_000
        await pravega.controller.seal_stream(scope, stream)
        sub = client.subscribe(f"{scope}/{stream}", batch=4096)
        stored = await asyncio.wait_for(_collect(sub), 60)
        assert stored == elements
    finally:
        await client.goodbye()


async def test_offer_split_and_packed_elements(server: Server, pravega: PravegaClient) -> None:
    scope, stream = await new_stream(pravega)
    big = [bytes([i]) * 150_000 for i in range(3)]  # split by the client, joined by the server
    fixed = [struct.pack(">Q", i) for i in range(5000)]  # packed: elementSize 8
    client = await RsioClient.connect("127.0.0.1", server.rsio_port)
    try:
        assert await asyncio.wait_for(client.offer(f"{scope}/{stream}", big), WAIT_S) == 3
        offered = client.offer(f"{scope}/{stream}", fixed, element_size=8)
        assert await asyncio.wait_for(offered, WAIT_S) == 5000
        await pravega.controller.seal_stream(scope, stream)
        stored = await asyncio.wait_for(_collect(client.subscribe(f"{scope}/{stream}")), WAIT_S)
        assert stored == big + fixed
    finally:
        await client.goodbye()


@pytest.mark.parametrize(
    ("stream", "reason"),
    [("rsio/not-there", "no such stream"), ("no-slash", "expected scope/stream")],
)
async def test_offer_to_a_bad_stream_is_refused(server: Server, stream: str, reason: str) -> None:
    client = await RsioClient.connect("127.0.0.1", server.rsio_port)
    try:
        with pytest.raises(RsioError, match=reason):
            await asyncio.wait_for(client.offer(stream, [b"x"]), WAIT_S)
    finally:
        await client.goodbye()


async def test_offer_to_a_sealed_stream_is_refused(server: Server, pravega: PravegaClient) -> None:
    scope, stream = await new_stream(pravega)
    await pravega.controller.seal_stream(scope, stream)
    client = await RsioClient.connect("127.0.0.1", server.rsio_port)
    try:
        with pytest.raises(RsioError, match="sealed"):
            await asyncio.wait_for(client.offer(f"{scope}/{stream}", [b"x"]), WAIT_S)
    finally:
        await client.goodbye()


async def test_a_subscriber_that_does_not_read_costs_bounded_memory(tmp_path: Path) -> None:
    server = start_server(tmp_path / "data")  # its own process, so its memory peak is ours to read
    try:
        pravega = PravegaClient(server.controller_uri)
        try:
            scope, stream = await new_stream(pravega)
            # 40 MB of 200 KB events (each above malloc's mmap threshold, so freed
            # memory leaves the process and the peak shows what was held at once).
            events = [bytes([i % 256]) * 200_000 for i in range(200)]
            await write_events(pravega, scope, stream, events)
            await pravega.controller.seal_stream(scope, stream)
        finally:
            await pravega.aclose()
        pid = server.process.pid
        reset_memory_peak(pid)
        before = memory_kib(pid, "VmRSS")
        name = f"{scope}/{stream}".encode()
        unbounded = bytes.fromhex("ffffffffffffffff7f")
        subscribe = bytes([0x04, len(name)]) + name + bytes([0x01]) + unbounded
        stalled = []
        for _ in range(2):  # two stalled connections, unbounded demand, never read
            _, writer = await asyncio.open_connection("127.0.0.1", server.rsio_port)
            writer.write(bytes.fromhex("03010000") + bytes([len(subscribe)]) + subscribe)
            stalled.append(writer)
        # A reader of the whole stream meanwhile: the stalled ones had all that time.
        client = await RsioClient.connect("127.0.0.1", server.rsio_port)
        try:
            got = await asyncio.wait_for(_collect(client.subscribe(name.decode(), batch=8)), 60)
            assert len(got) == len(events)
        finally:
            await client.goodbye()
        peak = memory_kib(pid, "VmHWM")
        for writer in stalled:
            writer.close()
        # Unbounded, each stalled subscription would hold the 40 MB stream.
        assert peak - before < 20_000, f"peak grew by {peak - before} KiB"
    finally:
        stop(server)
