"""Spark against three ``headrace serve --cluster`` nodes: a batch read and the
exactly-once sink, given one follower's controller.

The connector finds each segment's owner through the controller (``getURI``)
as any Pravega client does; the sink's transactions are created, committed
and merged by the cluster leader, each transaction segment in its parent's
container.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from headrace.client import PravegaClient, ScalingPolicy, StreamConfig
from tests._server import ServerProcess
from tests._zookeeper import ZooKeeper, zookeeper_installed
from tests.cluster._nodes import leader, settle, start_node

NODES = ("n1", "n2", "n3")
QUERY_TIMEOUT_S = 180.0


@pytest.fixture(scope="module")
def follower_uri(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A settled 3-node cluster on its own ZooKeeper; the controller URI of a node
    that does not lead it."""
    assert zookeeper_installed(), "ZooKeeper is missing: make test installs it (apt zookeeper)"
    base = tmp_path_factory.mktemp("spark-cluster")
    zookeeper = ZooKeeper(base / "zookeeper")
    zookeeper.start()
    nodes: dict[str, ServerProcess] = {}
    try:
        url = zookeeper.url(f"/spark-{uuid.uuid4().hex[:8]}")
        for name in NODES:
            nodes[name] = start_node(url, base / name, name)
        settle(nodes)
        boss = leader(nodes)
        yield next(nodes[n].uri for n in NODES if n != boss)
    finally:
        for node in nodes.values():
            node.stop()
        zookeeper.kill()


def _run(uri: str, work: Any) -> Any:
    async def main() -> Any:
        async with PravegaClient(uri) as client:
            return await work(client)

    return asyncio.run(main())


def _create(uri: str, scope: str, stream: str, segments: int) -> None:
    async def work(client: PravegaClient) -> None:
        await client.controller.create_scope(scope)
        config = StreamConfig(ScalingPolicy.fixed(segments))
        await client.controller.create_stream(scope, stream, config)

    _run(uri, work)


def _write(uri: str, scope: str, stream: str, events: list[tuple[str, bytes]]) -> None:
    async def work(client: PravegaClient) -> None:
        async with await client.create_writer(scope, stream) as writer:
            for key, event in events:
                await writer.write(event, key)
            await writer.flush()

    _run(uri, work)


def _stored(uri: str, scope: str, stream: str) -> Counter[bytes]:
    async def work(client: PravegaClient) -> list[bytes]:
        reader = client.record_reader(scope, stream)
        try:
            return [r.value async for r in reader]
        finally:
            await reader.aclose()

    return Counter(_run(uri, work))


@pytest.mark.slow
def test_batch_read_and_exactly_once_sink_on_three_nodes(
    follower_uri: str, spark: Any, tmp_path: Path
) -> None:
    from pyspark.sql.functions import col

    uri = follower_uri
    _create(uri, "spc", "in", 6)
    _create(uri, "spc", "out", 3)
    events = [(f"k{i % 17}", b"row-%04d" % i) for i in range(900)]
    _write(uri, "spc", "in", events)

    batch = (
        spark.read.format("headrace").option("controller", uri).option("stream", "spc/in").load()
    )
    assert Counter(bytes(r.value) for r in batch.select("value").collect()) == Counter(
        e for _, e in events
    )

    df = (
        spark.readStream.format("headrace")
        .option("controller", uri)
        .option("stream", "spc/in")
        .option("startingOffsets", "earliest")
        .option("maxEventsPerTrigger", "400")
        .load()
    )
    query = (
        df.select(col("partition").cast("string").alias("key"), col("value"))
        .writeStream.format("headrace")
        .option("controller", uri)
        .option("stream", "spc/out")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(QUERY_TIMEOUT_S)
    assert _stored(uri, "spc", "out") == Counter(e for _, e in events)
