"""Batch reads through ``spark.read.format("headrace")``."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Any

import pylogbeat
import pytest

from headrace.client.tank import TankClient
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


def test_batch_read_of_lumberjack_events_gives_the_shipped_documents(
    server: Server, spark: Any
) -> None:
    marker = stream_suffix()
    docs = [{"message": f"GET /x/{i}", "host": f"web-{i % 3}", "run": marker} for i in range(500)]
    beat = pylogbeat.PyLogBeatClient("127.0.0.1", server.ports["lumberjack"], timeout=30.0)
    with beat:
        for first in range(0, len(docs), 100):
            beat.send(docs[first : first + 100])
    rows = _read(spark, server, LUMBERJACK_STREAM).collect()
    got = [json.loads(bytes(r.value)) for r in rows]
    mine = [d for d in got if d.get("run") == marker]
    assert sorted(d["message"] for d in mine) == sorted(d["message"] for d in docs)
    assert all(d["host"] == f"web-{int(d['message'].rsplit('/', 1)[1]) % 3}" for d in mine)


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
