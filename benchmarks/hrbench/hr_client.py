"""headrace driven from the suite's own process: streams, produce and catch-up
through ``PravegaClient``, memory per connection and parked reader, the real
``pravega`` client's child, and TANK bundles."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from typing import Any

import _common as common

from hrbench.config import (
    LARGE,
    LARGE_BUNDLE_MESSAGES,
    LARGE_DISTINCT_BUNDLES,
    LARGE_TANK_IN_FLIGHT,
    SMALL,
)
from hrbench.measure import Measured, Profiler
from hrbench.results import Memory


async def hr_produce(
    uri: str,
    stream: str,
    size: int,
    count: int,
    *,
    segments: int = 1,
    producers: int = 1,
) -> float:
    """Seconds for ``count`` events of ``size`` bytes through ``EventWriter``s."""
    from headrace.client import PravegaClient, ScalingPolicy, StreamConfig

    event = os.urandom(size)
    async with PravegaClient(uri) as client:
        await client.controller.create_scope("bench")
        config = StreamConfig(ScalingPolicy.fixed(segments))
        await client.controller.create_stream("bench", stream, config)
        writers = [await client.create_writer("bench", stream) for _ in range(producers)]
        for writer in writers:
            await writer.write_and_wait(event)  # connections set up before timing

        async def produce(writer: Any, n: int) -> None:
            for _ in range(n):
                await writer.write(event)
            await writer.flush()

        began = time.perf_counter()
        await asyncio.gather(*(produce(w, count // producers) for w in writers))
        seconds = time.perf_counter() - began
        for writer in writers:
            await writer.aclose()
    return seconds


async def hr_catchup(
    uri: str, stream: str, passes: int = 1, *, views: bool = False
) -> tuple[float, int]:
    """Read every byte of a stored one-segment stream with 2 MiB ``ReadSegment``s
    through ``PravegaClient.segments.read`` (or, with ``views``, ``read_view``:
    the data left where the socket put it), ``passes`` times: (seconds, bytes)."""
    from headrace.client import PravegaClient

    async with PravegaClient(uri) as client:
        ranges = await client.controller.get_current_segments("bench", stream)
        segment = ranges[0].segment
        end = (await client.segments.stat(segment)).length
        read = client.segments.read_view if views else client.segments.read
        began = time.perf_counter()
        for _ in range(passes):
            offset = 0
            while offset < end:
                data = await read(segment, offset)
                offset += len(data.data)
        seconds = time.perf_counter() - began
    return seconds, end * passes


async def hr_stream(uri: str, stream: str, segments: int = 1) -> tuple[str, int]:
    """Create ``bench/<stream>`` (if new); the name and length of its first segment."""
    from headrace.client import PravegaClient, ScalingPolicy, StreamConfig

    async with PravegaClient(uri) as client:
        await client.controller.create_scope("bench")
        config = StreamConfig(ScalingPolicy.fixed(segments))
        await client.controller.create_stream("bench", stream, config)
        segment = (await client.controller.get_current_segments("bench", stream))[0].segment
        return segment.name, (await client.segments.stat(segment)).length


def hr_stream_now(uri: str, stream: str) -> tuple[str, int]:
    return asyncio.run(hr_stream(uri, stream))


async def hr_memory(uri: str, port: int, pid: int, idle: int, parked: int) -> Memory:
    """Server RSS growth for ``idle`` silent TCP connections, then for ``parked``
    more connections each holding one ``ReadSegment`` at the tail of a segment
    (parked until data arrives or the server's hold ends). Everything stays open
    until both are measured, so freed memory is never reused in between."""
    from headrace.client import PravegaClient, ScalingPolicy, StreamConfig
    from headrace.client._conn import SegmentStoreConnection
    from headrace.protocols import pravega as p

    async with PravegaClient(uri) as client:
        await client.controller.create_scope("bench")
        config = StreamConfig(ScalingPolicy.fixed(1))
        await client.controller.create_stream("bench", "parked", config)
        segment = (await client.controller.get_current_segments("bench", "parked"))[0].segment
        await asyncio.sleep(0.5)  # the server settles
        start = common.memory_kib(pid).get("VmRSS", 0)
        socks = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(idle)]
        await asyncio.sleep(1.5)  # every connection accepted and set up
        with_idle = common.memory_kib(pid).get("VmRSS", 0)
        conns = []
        for i in range(parked):
            conn = await SegmentStoreConnection.connect("127.0.0.1", port)
            conn.send_nowait(p.ReadSegment(segment.name, 0, 1024, request_id=1_000_000 + i))
            conns.append(conn)
        await asyncio.sleep(1.5)  # every read parked
        with_parked = common.memory_kib(pid).get("VmRSS", 0)
        for conn in conns:
            await conn.aclose()
        for sock in socks:
            sock.close()
    return Memory(
        connections=idle,
        kib_per_connection=round((with_idle - start) / idle, 2),
        readers=parked,
        kib_per_reader_and_connection=round((with_parked - with_idle) / parked, 2),
    )


def rust_produce(uri: str, stream: str, count: int, size: int = SMALL) -> float:
    """Seconds for ``count`` events through the real ``pravega`` client's child."""
    import client_write  # the Rust-client child of benchmarks/client_write.py

    seconds, _ = client_write._rust_round(uri, stream, count, 10_000, size)
    return seconds


def tank_produce(port: int, count: int, profile: Profiler, pid: int) -> tuple[float, float, float]:
    """TANK bundles of 8192 produced (``profile`` around that only), then read back:
    produce seconds, the server's CPU seconds while producing, consume seconds."""
    import tank_produce as tank

    from headrace.client.tank import TankClient

    bundles = tank._bundles(count)

    async def run() -> tuple[float, float, float]:
        async with await TankClient.connect("127.0.0.1", port) as client:
            await client.create_topic(tank.TOPIC, 1)
            with profile, Measured(pid) as m:
                produce_s = await tank._produce(client, bundles, 1)
            consume_s, _ = await tank._consume_raw(client, count)
        return produce_s, m.cpu, consume_s

    return asyncio.run(run())


def tank_large_produce(port: int, topic: str, count: int, pid: int) -> tuple[float, float]:
    """``count`` 10 KiB messages in uncompressed TANK bundles of
    ``LARGE_BUNDLE_MESSAGES``, ``LARGE_TANK_IN_FLIGHT`` in flight (so the bytes
    stored are the bytes counted): seconds, and the server's CPU seconds."""
    import tank_produce as tank

    from headrace.client.tank import TankClient

    distinct = tank._bundles(
        min(count, LARGE_BUNDLE_MESSAGES * LARGE_DISTINCT_BUNDLES),
        LARGE,
        LARGE_BUNDLE_MESSAGES,
        compress=False,
    )
    whole, rest = divmod(count, LARGE_BUNDLE_MESSAGES)
    bundles = [distinct[i % len(distinct)] for i in range(whole)]
    if rest:
        bundles += tank._bundles(rest, LARGE, LARGE_BUNDLE_MESSAGES, compress=False)

    async def produce() -> tuple[float, float]:
        async with await TankClient.connect("127.0.0.1", port) as client:
            await client.create_topic(topic, 1)
            with Measured(pid) as m:
                seconds = await tank._produce(client, bundles, LARGE_TANK_IN_FLIGHT, topic)
        return seconds, m.cpu

    return asyncio.run(produce())


def tank_topic(port: int, topic: str) -> None:
    """Create a one-partition TANK topic."""
    from headrace.client.tank import TankClient

    async def create() -> None:
        async with await TankClient.connect("127.0.0.1", port) as client:
            await client.create_topic(topic, 1)

    asyncio.run(create())
