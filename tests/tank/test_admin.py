"""Topic creation, discovery, status and the other administrative requests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from headrace.client.tank import TankClient
from headrace.protocols.tank import (
    CreateTopicResult,
    DiscoverPartitions,
    DiscoverPartitionsError,
    DiscoverPartitionsResponse,
    DiscoverTopology,
    DiscoverTopologyResponse,
    PartitionSeqNums,
    ReloadConf,
    ReloadConfResponse,
    ReloadConfResult,
)
from tests.tank.conftest import TankServer


@pytest.fixture
async def client(server: TankServer) -> AsyncIterator[TankClient]:
    async with await TankClient.connect("127.0.0.1", server.port) as c:
        yield c


@pytest.mark.parametrize(
    "name",
    ["", "-dash", "_under", "has space", "dot.ted", "x" * 65, "ü"],
)
async def test_invalid_topic_names_are_refused(client: TankClient, name: str) -> None:
    assert await client.create_topic(name, 1) is CreateTopicResult.INVALID_REQUEST


async def test_create_topic_checks_partitions_and_config(client: TankClient) -> None:
    assert await client.create_topic("zero-partitions", 0) is CreateTopicResult.INVALID_REQUEST
    assert await client.create_topic("bad-config", 1, b"log.segment.bytes=lots") is (
        CreateTopicResult.INVALID_CONFIG
    )
    assert await client.create_topic("no-equals", 1, b"log.segment.bytes") is (
        CreateTopicResult.INVALID_CONFIG
    )
    config = b"# comment\nlog.segment.bytes=64mb\nlog.retention.secs = 2d\nunknown.key=x\n"
    assert await client.create_topic("good-config", 3, config) is CreateTopicResult.CREATED
    assert await client.create_topic("good-config", 3) is CreateTopicResult.ALREADY_EXISTS


async def test_discovery_and_status(client: TankClient) -> None:
    assert await client.create_topic("with_underscore", 3) is CreateTopicResult.CREATED
    topics = {info.name: info for info in await client.discover_topics()}
    assert topics["with_underscore"].partitions_count == 3
    assert topics["with_underscore"].enabled
    partitions = await client.discover_partitions("with_underscore")
    assert partitions == (PartitionSeqNums(0, 0),) * 3
    status = await client.status()
    assert status.topics_count == len(topics)
    assert status.partitions_count == sum(info.partitions_count for info in topics.values())
    assert status.details is not None and status.details.version == 400
    assert status.cluster is None

    response = await client.request(
        DiscoverPartitions(client.next_request_id(), "with_underscore", (2, 7))
    )
    assert isinstance(response, DiscoverPartitionsResponse)
    assert response.partitions == (
        PartitionSeqNums(0, 0),
        PartitionSeqNums(error=DiscoverPartitionsError.SYSTEM_ERROR),
    )
    response = await client.request(DiscoverTopology(client.next_request_id()))
    assert isinstance(response, DiscoverTopologyResponse) and response.cluster_name is None


@pytest.mark.parametrize(
    ("topic", "partition", "result"),
    [
        ("reload-me", 0, ReloadConfResult.RELOADED),
        ("reload-me", 1, ReloadConfResult.UNKNOWN_PARTITION),
        ("no-such-topic", 0, ReloadConfResult.UNKNOWN_TOPIC),
    ],
)
async def test_reload_conf(
    client: TankClient, topic: str, partition: int, result: ReloadConfResult
) -> None:
    await client.create_topic("reload-me", 1)
    response = await client.request(ReloadConf(client.next_request_id(), topic, partition))
    assert isinstance(response, ReloadConfResponse)
    assert (response.topic, response.partition_id, response.result) == (topic, partition, result)
