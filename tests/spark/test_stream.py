"""Streaming reads: micro-batch limits, restart from the checkpoint, data loss."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import pytest

from headrace.client import PravegaClient, Segment
from headrace.client.tank import TankClient
from headrace.protocols.tank.commands import BundleMessage
from tests.spark.conftest import Server, stream_suffix
from tests.spark.test_read import BOUNDARY_MS, _produce_phases, _quiet_boundary

QUERY_TIMEOUT_S = 180.0
WRITER_TIMEOUT_S = 120.0


def _stream(spark: Any, server: Server, name: str, **options: str) -> Any:
    reader = spark.readStream.format("headrace").option("controller", server.uri)
    reader = reader.option("stream", name).option("startingOffsets", "earliest")
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def _run_to_parquet(df: Any, out: Path, checkpoint: Path) -> Any:
    query = (
        df.select("value", "partition", "offset")
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(QUERY_TIMEOUT_S), "query did not finish in time"
    return query


def test_available_now_with_a_limit_restarts_from_the_checkpoint_while_writing(
    server: Server, spark: Any, stream_name: str, tmp_path: Path
) -> None:
    server.create_stream("sp", stream_name, segments=2)
    name = f"sp/{stream_name}"
    first = [(f"k{i % 10}", b"a%05d" % i) for i in range(600)]
    server.write("sp", stream_name, first)
    later = [(f"k{i % 10}", b"b%05d" % i) for i in range(1500)]
    writer_error: list[BaseException] = []

    def keep_writing() -> None:
        try:
            for start in range(0, len(later), 100):
                server.write("sp", stream_name, later[start : start + 100])
        except BaseException as exc:
            writer_error.append(exc)

    writer = threading.Thread(target=keep_writing, daemon=True)
    writer.start()
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    q1 = _run_to_parquet(_stream(spark, server, name, maxEventsPerTrigger="250"), out, checkpoint)
    sizes = [p["numInputRows"] for p in q1.recentProgress if p["numInputRows"]]
    assert len(sizes) >= 3 and max(sizes) <= 250, sizes
    writer.join(WRITER_TIMEOUT_S)
    assert not writer.is_alive() and not writer_error, writer_error

    _run_to_parquet(_stream(spark, server, name, maxEventsPerTrigger="250"), out, checkpoint)
    rows = spark.read.parquet(str(out)).collect()
    values = sorted(bytes(r.value) for r in rows)
    assert values == sorted(e for _, e in first + later)  # nothing lost, nothing twice
    assert len({(r.partition, r.offset) for r in rows}) == len(rows)


def _truncate(server: Server, name: str, offset: int) -> None:
    scope, stream = name.split("/")

    async def work(client: PravegaClient) -> None:
        await client.controller.truncate_stream(scope, stream, {0: offset})
        stat = await client.segments.stat(Segment(scope, stream, 0))
        assert stat.start_offset == offset

    server.run(work)


@pytest.mark.parametrize("fail_on_data_loss", [True, False])
def test_fail_on_data_loss_after_truncation(
    server: Server, spark: Any, stream_name: str, tmp_path: Path, fail_on_data_loss: bool
) -> None:
    server.create_stream("sp", stream_name, segments=1)
    name = f"sp/{stream_name}"
    events = [b"e%03d" % i for i in range(200)]  # 12 bytes each with the event header
    server.write("sp", stream_name, [(None, e) for e in events[:100]])
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    option = {"failOnDataLoss": str(fail_on_data_loss).lower()}
    _run_to_parquet(_stream(spark, server, name, **option), out, checkpoint)
    server.write("sp", stream_name, [(None, e) for e in events[100:]])
    _truncate(server, name, 150 * 12)  # events 100..149 go before the query reads them

    if fail_on_data_loss:
        with pytest.raises(Exception, match="data loss") as info:
            _run_to_parquet(_stream(spark, server, name, **option), out, checkpoint)
        assert "failOnDataLoss" in str(info.value)
        return
    _run_to_parquet(_stream(spark, server, name, **option), out, checkpoint)
    values = sorted(bytes(r.value) for r in spark.read.parquet(str(out)).collect())
    assert values == events[:100] + events[150:]


def test_a_stream_that_scales_is_followed_through_its_successors(
    server: Server, spark: Any, stream_name: str, tmp_path: Path
) -> None:
    server.create_stream("sp", stream_name, segments=1)
    name = f"sp/{stream_name}"
    before = [(f"k{i % 20}", b"before-%04d" % i) for i in range(300)]
    after = [(f"k{i % 20}", b"after-%04d" % i) for i in range(300)]
    server.write("sp", stream_name, before)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    _run_to_parquet(_stream(spark, server, name, maxEventsPerTrigger="200"), out, checkpoint)

    async def scale(client: PravegaClient) -> None:
        new = await client.controller.scale_stream("sp", stream_name, [0], [(0.0, 0.5), (0.5, 1.0)])
        assert len(new) == 2

    server.run(scale)
    server.write("sp", stream_name, after)
    _run_to_parquet(_stream(spark, server, name, maxEventsPerTrigger="200"), out, checkpoint)
    rows = spark.read.parquet(str(out)).collect()
    assert sorted(bytes(r.value) for r in rows) == sorted(e for _, e in before + after)
    assert len({r.partition for r in rows}) == 3  # the first segment and its two successors
    batch = (
        spark.read.format("headrace").option("controller", server.uri).option("stream", name).load()
    )
    assert batch.count() == 600


def test_a_query_started_by_timestamp_keeps_dropping_earlier_stamped_rows(
    server: Server, spark: Any, stream_name: str, tmp_path: Path
) -> None:
    topic = f"topic-{stream_suffix()}"
    stamps = _produce_phases(server, topic)
    server.create_stream("sp", stream_name, segments=1)
    events = f"sp/{stream_name}"
    server.write("sp", stream_name, [(None, b"one-%03d" % i) for i in range(50)])
    by_stream = {f"tank/{topic}": BOUNDARY_MS, events: _quiet_boundary(server, events)}
    options = {
        "streams": f"tank/{topic},{events}",
        "startingOffsetsByTimestamp": json.dumps(by_stream),
    }

    def run() -> list[bytes]:
        reader = spark.readStream.format("headrace").option("controller", server.uri)
        for key, value in options.items():
            reader = reader.option(key, value)
        _run_to_parquet(reader.load(), tmp_path / "out", tmp_path / "checkpoint")
        return sorted(bytes(r.value) for r in spark.read.parquet(str(tmp_path / "out")).collect())

    later = sorted(v for v, t in stamps.items() if t >= BOUNDARY_MS)
    assert run() == later  # nothing of the Pravega stream: it is quiet since its boundary

    # After the start: Pravega events all count (appended later); TANK messages
    # stamped before the boundary are still dropped.
    server.write("sp", stream_name, [(None, b"two-%03d" % i) for i in range(50)])

    async def produce() -> None:
        async with await TankClient.connect("127.0.0.1", server.ports["tank"]) as client:
            late = [
                BundleMessage(b"late-%d" % m, timestamp_ms=BOUNDARY_MS - 5 + m) for m in range(10)
            ]
            await client.produce(topic, 0, late)

    asyncio.run(produce())
    want = later + [b"two-%03d" % i for i in range(50)] + [b"late-%d" % m for m in range(5, 10)]
    assert run() == sorted(want)
