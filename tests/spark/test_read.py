"""Batch reads through ``spark.read.format("headrace")``."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime
from typing import Any

import pylogbeat
import pytest

from headrace.client import PravegaClient
from headrace.client.tank import TankClient
from headrace.protocols.pravega.routing import routing_key_position
from headrace.protocols.tank.commands import BundleMessage
from tests.spark.conftest import LUMBERJACK_STREAM, Server, stream_suffix


def test_batch_read_of_pravega_events_matches_what_was_written(
    server: Server, spark: Any, stream_name: str
) -> None:
    server.create_stream("sp", stream_name, segments=3)
    events = [(f"k{i % 50}", f"event-{i}".encode()) for i in range(3000)]
    server.write("sp", stream_name, events)

    df = (
        spark.read.format("headrace")
        .option("controller", server.uri)
        .option("scope", "sp")
        .option("stream", stream_name)
        .load()
    )
    rows = df.collect()
    assert sorted(bytes(r.value) for r in rows) == sorted(e for _, e in events)
    assert {r.stream for r in rows} == {stream_name}
    assert {r.scope for r in rows} == {"sp"}
    assert len({r.partition for r in rows}) == 3
    assert len({(r.partition, r.offset) for r in rows}) == 3000


def _read(spark: Any, server: Server, stream: str, **options: str) -> Any:
    reader = spark.read.format("headrace").option("controller", server.uri)
    reader = reader.option("stream", stream)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def test_batch_read_of_a_tank_topic_unpacks_bundles(server: Server, spark: Any) -> None:
    topic = f"topic-{stream_suffix()}"

    async def produce() -> None:
        async with await TankClient.connect("127.0.0.1", server.ports["tank"]) as client:
            await client.create_topic(topic, 2)
            for partition in range(2):
                for bundle in range(5):
                    messages = [
                        BundleMessage(
                            f"p{partition}-b{bundle}-m{m}".encode(),
                            timestamp_ms=1_700_000_000_000 + bundle * 1000 + m,
                            key=f"key{m}".encode(),
                        )
                        for m in range(20)
                    ]
                    await client.produce(topic, partition, messages)

    asyncio.run(produce())
    rows = _read(spark, server, f"tank/{topic}").collect()
    assert len(rows) == 2 * 5 * 20
    values = {bytes(r.value) for r in rows}
    assert values == {
        f"p{p}-b{b}-m{m}".encode() for p in range(2) for b in range(5) for m in range(20)
    }
    first = next(r for r in rows if bytes(r.value) == b"p1-b3-m7")
    assert bytes(first.key) == b"key7"
    assert first.partition == 1
    stamp = 1_700_000_000_000 + 3 * 1000 + 7
    assert first.timestamp == datetime.fromtimestamp(stamp / 1000, UTC).replace(tzinfo=None)
    assert {r.timestampType for r in rows} == {0}  # the producer's time: CreateTime


def test_batch_read_of_lumberjack_events_gives_the_shipped_documents(
    server: Server, spark: Any
) -> None:
    marker = stream_suffix()
    docs = [
        {
            "message": f"GET /x/{i}",
            "host": f"web-{i % 3}",
            "run": marker,
            "@timestamp": f"2026-01-31T12:{i // 60:02d}:{i % 60:02d}.{i % 1000:03d}Z",
        }
        for i in range(500)
    ]
    beat = pylogbeat.PyLogBeatClient("127.0.0.1", server.ports["lumberjack"], timeout=30.0)
    with beat:
        for first in range(0, len(docs), 100):
            beat.send(docs[first : first + 100])
    rows = _read(spark, server, LUMBERJACK_STREAM).collect()
    got = [json.loads(bytes(r.value)) for r in rows]
    mine = [d for d in got if d.get("run") == marker]
    assert sorted(d["message"] for d in mine) == sorted(d["message"] for d in docs)
    assert all(d["host"] == f"web-{int(d['message'].rsplit('/', 1)[1]) % 3}" for d in mine)
    # each document's own @timestamp is its timestamp (CreateTime)
    for row in rows:
        doc = json.loads(bytes(row.value))
        if doc.get("run") == marker:
            shipped = datetime.fromisoformat(doc["@timestamp"]).replace(tzinfo=None)
            assert (row.timestamp, row.timestampType) == (shipped, 0)


def test_batch_read_honours_offsets_and_min_partitions(
    server: Server, spark: Any, stream_name: str
) -> None:
    server.create_stream("sp", stream_name, segments=1)
    server.write("sp", stream_name, [(None, b"e%03d" % i) for i in range(100)])  # 12 bytes each
    name = f"sp/{stream_name}"
    df = _read(spark, server, name, minPartitions="4")
    assert df.rdd.getNumPartitions() == 4
    assert sorted(bytes(r.value) for r in df.collect()) == [b"e%03d" % i for i in range(100)]
    window = json.dumps({name: {"0": 120}}), json.dumps({name: {"0": 240}})
    rows = _read(spark, server, name, startingOffsets=window[0], endingOffsets=window[1]).collect()
    assert sorted(bytes(r.value) for r in rows) == [b"e%03d" % i for i in range(10, 20)]
    with_headers = _read(spark, server, name, includeHeaders="true")
    assert with_headers.columns[-1] == "headers"
    assert {r.headers for r in with_headers.collect()} == {None}


def test_a_bad_option_fails_at_planning_naming_it(server: Server, spark: Any) -> None:
    with pytest.raises(Exception, match="maxEventsPerTrigger"):
        _read(spark, server, "sp/x", maxEventsPerTrigger="lots").collect()
    with pytest.raises(Exception, match="'stream'"):
        spark.read.format("headrace").option("controller", server.uri).load().collect()


BOUNDARY_MS = 1_800_000_000_000
"""The known boundary time of the TANK two-phase tests (producer timestamps)."""


def _produce_phases(server: Server, topic: str) -> dict[bytes, int]:
    """Two partitions; bundles stamped before, across and after ``BOUNDARY_MS``.

    Returns every message with its timestamp.
    """
    stamps: dict[bytes, int] = {}

    async def produce() -> None:
        async with await TankClient.connect("127.0.0.1", server.ports["tank"]) as client:
            await client.create_topic(topic, 2)
            for partition in range(2):
                # Phase 1: three bundles before the boundary; then one bundle across it
                # (messages -10 ms .. +9 ms); phase 2: three bundles after it.
                for bundle, base in enumerate([-30_000, -20_000, -10_000, -10, 0, 10_000, 20_000]):
                    messages = []
                    for m in range(20):
                        stamp = BOUNDARY_MS + base + (m if base == -10 else m * 100)
                        value = f"p{partition}-b{bundle}-m{m}".encode()
                        messages.append(BundleMessage(value, timestamp_ms=stamp))
                        stamps[value] = stamp
                    await client.produce(topic, partition, messages)

    asyncio.run(produce())
    return stamps


def test_starting_timestamp_on_a_tank_topic_returns_exactly_the_later_messages(
    server: Server, spark: Any
) -> None:
    topic = f"topic-{stream_suffix()}"
    stamps = _produce_phases(server, topic)
    for since in (BOUNDARY_MS, BOUNDARY_MS + 1):  # + 1: those stamped at it go too
        later = sorted(v for v, t in stamps.items() if t >= since)
        assert 0 < len(later) < len(stamps)
        rows = _read(spark, server, f"tank/{topic}", startingTimestamp=str(since)).collect()
        assert sorted(bytes(r.value) for r in rows) == later
        first = datetime.fromtimestamp(min(stamps[v] for v in later) / 1000, UTC)
        assert min(r.timestamp for r in rows) == first.replace(tzinfo=None)


def _key_in(low: float, high: float) -> str:
    return next(k for i in range(1000) if low <= routing_key_position(k := f"key-{i}") < high)


def _quiet_boundary(server: Server, name: str) -> int:
    """A time after every append so far to ``name``'s segments, once the clock reached it."""
    scope, stream = name.split("/")

    async def last_modified(client: PravegaClient) -> int:
        segs = await client.controller.get_segments_at(scope, stream, 0)
        segs.update(
            {r.segment: 0 for r in await client.controller.get_current_segments(scope, stream)}
        )
        return max([(await client.segments.stat(s)).last_modified_ms for s in segs])

    boundary = server.run(last_modified) + 1
    deadline = time.monotonic() + 1.0
    while time.time_ns() // 1_000_000 < boundary:  # at most a millisecond of clock
        assert time.monotonic() < deadline, "the clock did not move"
    return boundary


def test_starting_timestamp_on_pravega_events_starts_at_the_first_event_appended_since(
    server: Server, spark: Any, stream_name: str
) -> None:
    server.create_stream("sp", stream_name, segments=1)
    name = f"sp/{stream_name}"
    server.write("sp", stream_name, [(f"k{i}", b"one-%03d" % i) for i in range(100)])

    async def scale(client: PravegaClient) -> None:
        await client.controller.scale_stream("sp", stream_name, [0], [(0.0, 0.5), (0.5, 1.0)])

    server.run(scale)
    low, high = _key_in(0.0, 0.5), _key_in(0.5, 1.0)
    server.write("sp", stream_name, [(low, b"one-low-%03d" % i) for i in range(100)])
    server.write("sp", stream_name, [(high, b"one-high-%03d" % i) for i in range(3)])
    boundary = _quiet_boundary(server, name)
    # Phase 2, after the boundary: only the upper segment is appended to.
    phase2 = [b"two-%03d" % i for i in range(100)]
    server.write("sp", stream_name, [(high, e) for e in phase2])

    rows = _read(spark, server, name, startingTimestamp=str(boundary)).collect()
    # The first segment was sealed before the boundary (an earlier epoch), the lower
    # one has not been appended to since: neither is read; the upper one is read from
    # its first event appended at or after the boundary (the store's time index).
    assert sorted(bytes(r.value) for r in rows) == phase2
    # each event's append time (LogAppendTime), none before the boundary
    since = datetime.fromtimestamp(boundary / 1000, UTC).replace(tzinfo=None)
    assert all(r.timestamp >= since and r.timestampType == 1 for r in rows)
    everything = _read(spark, server, name, startingTimestamp="0").count()
    assert everything == 303
    before = _read(spark, server, name, endingTimestamp=str(boundary)).collect()
    assert len(before) == 203 and not any(bytes(r.value).startswith(b"two") for r in before)
    future = str(boundary + 86_400_000)
    with pytest.raises(Exception, match="nothing in"):
        _read(
            spark,
            server,
            name,
            startingTimestamp=future,
            startingOffsetsByTimestampStrategy="error",
        ).count()
    with pytest.raises(Exception, match="exclude each other"):
        _read(spark, server, name, startingTimestamp="0", startingOffsets="earliest").count()
