"""Options of Spark's Kafka source and sink, against streams of known contents.

The reader-level tests call the data source's stream reader as Spark's
driver-side runner does (same methods, same offsets), so they need no Spark
query; the others run Spark.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import Row
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    StringType,
    StructField,
    StructType,
)

from headrace.client.tank import TankClient
from headrace.protocols.tank.commands import BundleMessage
from headrace.spark import read_options, write_options
from headrace.spark.options import KAFKA_ONLY, READ_OPTIONS, WRITE_OPTIONS
from headrace.spark.progress import offsets_behind_latest
from headrace.spark.source import (
    SCHEMA,
    HeadraceDataSource,
    HeadraceStreamReader,
    HeadraceWriter,
    TxnMessage,
    _write,
)
from tests.spark.conftest import Server, stream_suffix

EVENT_BYTES = 12  # 4-byte payload + the 8-byte event header
QUERY_TIMEOUT_S = 180.0
MESSAGES_PER_BUNDLE = 5


def _events(server: Server, name: str, first: int, count: int) -> None:
    scope, stream = name.split("/")
    server.write(scope, stream, [(None, b"e%03d" % i) for i in range(first, first + count)])


def _tank_topic(server: Server, bundles: int) -> str:
    """A one-partition TANK topic of ``bundles`` bundles of ``MESSAGES_PER_BUNDLE``."""
    topic = f"topic-{stream_suffix()}"

    async def produce() -> None:
        async with await TankClient.connect("127.0.0.1", server.ports["tank"]) as client:
            await client.create_topic(topic, 1)
            for b in range(bundles):
                messages = [
                    BundleMessage(b"b%02d-m%d" % (b, m), timestamp_ms=1_700_000_000_000 + b)
                    for m in range(MESSAGES_PER_BUNDLE)
                ]
                await client.produce(topic, 0, messages)

    asyncio.run(produce())
    return f"tank/{topic}"


def _reader(server: Server, **options: str) -> HeadraceStreamReader:
    opts = read_options({"controller": server.uri, **options}, streaming=True)
    return HeadraceStreamReader(opts)


def test_min_offsets_per_trigger_waits_for_enough_events_or_the_delay(
    server: Server, stream_name: str
) -> None:
    server.create_stream("sp", stream_name, segments=1)
    name = f"sp/{stream_name}"
    _events(server, name, 0, 30)
    reader = _reader(
        server,
        stream=name,
        startingOffsets="earliest",
        minOffsetsPerTrigger="50",
        maxTriggerDelay="1h",
    )
    limit = reader.getDefaultReadLimit()
    assert limit == ReadMinRows(50)
    start = reader.initialOffset()
    assert start == {name: {"0": 0}}
    # The first look triggers whatever there is, as Kafka's source does.
    assert reader.latestOffset(start, limit) == {name: {"0": 30 * EVENT_BYTES}}

    start = {name: {"0": 30 * EVENT_BYTES}}
    _events(server, name, 30, 40)
    assert reader.latestOffset(start, limit) == start  # 40 < 50: no micro-batch
    assert reader.reportLatestOffset() == {name: {"0": 70 * EVENT_BYTES}}
    _events(server, name, 70, 10)
    assert reader.latestOffset(start, limit) == {name: {"0": 80 * EVENT_BYTES}}

    start = {name: {"0": 80 * EVENT_BYTES}}
    _events(server, name, 80, 5)
    assert reader.latestOffset(start, limit) == start
    reader.last_trigger_ms = time.time() * 1000 - 3_600_000  # the delay has passed
    assert reader.latestOffset(start, limit) == {name: {"0": 85 * EVENT_BYTES}}
    # A trigger that reads everything (Trigger.Once) ignores the limits.
    assert reader.latestOffset({name: {"0": 0}}, ReadAllAvailable()) == {
        name: {"0": 85 * EVENT_BYTES}
    }


def test_trigger_limits_on_a_tank_topic_count_messages(server: Server) -> None:
    name = _tank_topic(server, bundles=6)
    reader = _reader(server, stream=name, startingOffsets="earliest", maxOffsetsPerTrigger="12")
    assert reader.getDefaultReadLimit() == ReadMaxRows(12)
    start = reader.initialOffset()
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    ranges = reader.partitions(start, end)
    rows = [row for part in ranges for batch in reader.read(part) for row in batch.to_pylist()]
    assert [r["value"] for r in rows] == [b"b%02d-m%d" % (b, m) for b in range(2) for m in range(5)]

    min_reader = _reader(server, stream=name, startingOffsets="earliest", minOffsetsPerTrigger="31")
    min_reader.last_trigger_ms = time.time() * 1000  # not the first look
    assert min_reader.latestOffset(start, ReadMinRows(31)) == start  # 30 messages in 6 bundles


def _batch(server: Server, **options: str) -> list[list[dict[str, Any]]]:
    """The rows of a batch read, per Spark partition, through the data source's
    own planning and reads (what Spark's driver and tasks call)."""
    reader = HeadraceDataSource({"controller": server.uri, **options}).reader(SCHEMA)
    return [
        [row for batch in reader.read(part) for row in batch.to_pylist()]
        for part in reader.partitions()
    ]


def test_max_records_per_partition_splits_a_batch_read(server: Server, stream_name: str) -> None:
    server.create_stream("sp", stream_name, segments=1)
    name = f"sp/{stream_name}"
    _events(server, name, 0, 50)
    topic = _tank_topic(server, bundles=6)
    parts = _batch(server, streams=f"{name},{topic}", maxRecordsPerPartition="12")
    assert [len(p) for p in parts] == [12, 12, 12, 12, 2, 10, 10, 10]  # bundles stay whole
    values = [r["value"] for p in parts for r in p]
    assert values[:50] == [b"e%03d" % i for i in range(50)]
    assert values[50:] == [b"b%02d-m%d" % (b, m) for b in range(6) for m in range(5)]


def test_stream_pattern_reads_the_matching_streams_and_follows_new_ones(server: Server) -> None:
    scope = f"pat{stream_suffix()}".replace("-", "")
    for stream in ("orders-eu", "orders-us", "payments"):
        server.create_stream(scope, stream, segments=1)
        _events(server, f"{scope}/{stream}", 0, 3)
    pattern = f"{scope}/orders-.*"
    rows = [r for part in _batch(server, streamPattern=pattern) for r in part]
    assert sorted((r["stream"], r["value"]) for r in rows) == [
        (s, b"e%03d" % i) for s in ("orders-eu", "orders-us") for i in range(3)
    ]

    reader = _reader(server, streamPattern=pattern, startingOffsets="latest")
    start = reader.initialOffset()
    assert set(start) == {f"{scope}/orders-eu", f"{scope}/orders-us"}
    server.create_stream(scope, "orders-jp", segments=1)
    _events(server, f"{scope}/orders-jp", 0, 4)
    end = reader.latestOffset(start, ReadAllAvailable())
    assert end[f"{scope}/orders-jp"] == {"0": 4 * EVENT_BYTES}  # a new stream, from its head
    assert f"{scope}/payments" not in end


def test_progress_reports_the_latest_offsets_and_kafkas_lag_figures(
    server: Server, spark: Any, stream_name: str, tmp_path: Path
) -> None:
    """Also the streaming sink with exactlyOnce=false and a partition column."""
    server.create_stream("sp", stream_name, segments=1)
    server.create_stream("sp", stream_name + "-out", segments=2)
    name = f"sp/{stream_name}"
    _events(server, name, 0, 100)
    query = (
        spark.readStream.format("headrace")
        .option("controller", server.uri)
        .option("stream", name)
        .option("startingOffsets", "earliest")
        .option("maxEventsPerTrigger", "60")
        .load()
        .selectExpr("value", "CAST(1 AS INT) AS partition")
        .writeStream.format("headrace")
        .option("controller", server.uri)
        .option("stream", name + "-out")
        .option("exactlyOnce", "false")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(QUERY_TIMEOUT_S), "query did not finish in time"
    sources = [p.sources[0] for p in query.recentProgress if p.numInputRows]
    assert [json.loads(s.latestOffset) for s in sources] == [{name: {"0": 100 * EVENT_BYTES}}] * 2
    assert [json.loads(s.endOffset) for s in sources] == [
        {name: {"0": n * EVENT_BYTES}} for n in (60, 100)
    ]
    assert [offsets_behind_latest(s) for s in sources] == [
        {
            "minOffsetsBehindLatest": str(n * EVENT_BYTES),
            "maxOffsetsBehindLatest": str(n * EVENT_BYTES),
            "avgOffsetsBehindLatest": str(float(n * EVENT_BYTES)),
        }
        for n in (40, 0)
    ]
    written = _batch(server, stream=name + "-out")
    assert sorted(r["value"] for p in written for r in p) == [b"e%03d" % i for i in range(100)]
    assert {r["partition"] for p in written for r in p} == {1}


def test_the_sink_writes_the_partition_column_to_that_segment_with_or_without_exactly_once(
    server: Server, stream_name: str
) -> None:
    server.create_stream("sp", stream_name, segments=3)
    name = f"sp/{stream_name}"
    rows = [Row(value=f"v{i}", partition=i % 3, headers=[]) for i in range(30)]
    for exactly_once in ("true", "false"):
        opts = write_options(
            {"controller": server.uri, "stream": name, "exactlyOnce": exactly_once}
        )
        writer = HeadraceWriter(opts)
        message = writer.write(iter(rows))
        assert isinstance(message, TxnMessage) and bool(message.txns) == (exactly_once == "true")
        writer.commit([message])
    got = sorted((r["partition"], r["value"]) for p in _batch(server, stream=name) for r in p)
    assert got == sorted((i % 3, b"v%d" % i) for i in range(30) for _ in range(2))
    header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
    schema = StructType(
        [
            StructField("value", StringType()),
            StructField("partition", IntegerType()),
            StructField("headers", ArrayType(header)),
        ]
    )
    assert HeadraceDataSource({"controller": server.uri, "stream": name}).writer(schema, False)


def test_the_sink_refuses_headers_and_a_segment_that_is_not_open(
    server: Server, stream_name: str
) -> None:
    server.create_stream("sp", stream_name, segments=2)
    opts = write_options({"controller": server.uri, "stream": f"sp/{stream_name}"})
    with pytest.raises(ValueError, match="headrace stores no record headers"):
        _write(opts, iter([Row(value=b"x", headers=[Row(key="h", value=b"v")])]))
    with pytest.raises(ValueError, match=r"'partition' column: segment 7 is not an open segment"):
        _write(opts, iter([Row(value=b"x", partition=7)]))


def test_docs_name_every_option_and_every_kafka_option() -> None:
    """``docs/spark.md`` stays current: every option the source and sink take,
    and every Kafka option they refuse, is in its tables."""
    docs = (Path(__file__).resolve().parents[2] / "docs" / "spark.md").read_text()
    named = {m.lower() for m in re.findall(r"`([A-Za-z.]+)`", docs)}
    taken = {o.lower() for o in (*READ_OPTIONS, *WRITE_OPTIONS)}
    assert taken - named == set()
    assert set(KAFKA_ONLY) - named == set()
