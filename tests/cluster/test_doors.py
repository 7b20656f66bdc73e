"""TANK, Lumberjack and RS-IO on a node that does not hold the data.

These doors have no redirect: the node a client reached creates streams at
the cluster leader and reaches each segment at its owner, answering only
after the owner did. Three real ``headrace serve --cluster`` nodes with every
door open and a real ZooKeeper; each client talks to one node and the data
is checked through another.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pylogbeat
import pytest

from headrace.client.pravega import PravegaClient
from headrace.client.rsio import RsioClient, decode_record
from headrace.client.tank import TankClient
from headrace.controller.records import ScalingPolicy, StreamConfig
from headrace.protocols import tank as t
from headrace.protocols.pravega.controller import Segment
from headrace.store.disk.layout import container_of
from tests._server import ServerProcess
from tests._zookeeper import ZooKeeper
from tests.cluster._nodes import ALL_DOORS, CONTAINERS, leader, owners, settle, start_node

NODES: Final = ("n1", "n2", "n3")
WAIT_S: Final = 30.0
"""Bound on one client step (a read, a subscription element)."""
BEATS_TIMEOUT_S: Final = 60.0
"""Bound on pylogbeat's whole send (it blocks: it runs in a thread)."""


@pytest.fixture
def nodes(shared_zookeeper: ZooKeeper, tmp_path: Path) -> Iterator[dict[str, ServerProcess]]:
    url = shared_zookeeper.url(f"/doors-{uuid.uuid4().hex[:12]}")
    started: dict[str, ServerProcess] = {}
    try:
        for name in NODES:
            started[name] = start_node(url, tmp_path / name, name, doors=ALL_DOORS)
        settle(started)
        yield started
    finally:
        for node in started.values():
            node.stop()


def stranger(nodes: dict[str, ServerProcess], segments: list[str]) -> str:
    """A follower owning as few of ``segments`` as any follower does (with more
    containers than nodes, usually none): its doors must forward."""
    by_container = owners(nodes)
    followers = [n for n in NODES if n != leader(nodes)]
    return min(
        followers,
        key=lambda n: sum(by_container[container_of(s, CONTAINERS)] == n for s in segments),
    )


def _next_ms() -> int:
    """The wall clock's next millisecond, once it came: what the servers stamped
    before this call is earlier than the value returned."""
    now = time.time_ns() // 1_000_000
    deadline = time.monotonic() + WAIT_S
    while time.time_ns() // 1_000_000 <= now:
        assert time.monotonic() < deadline, "the wall clock stands still"
    return time.time_ns() // 1_000_000


async def read_stream(node: ServerProcess, scope: str, stream: str) -> list[bytes]:
    """Every event of ``scope/stream``, read through ``node``'s controller."""
    async with PravegaClient(node.uri) as client:
        reader = client.record_reader(scope, stream)
        return [record.value async for record in reader]


async def test_tank_produce_and_consume_through_a_node_without_the_data(
    nodes: dict[str, ServerProcess],
) -> None:
    topic = "orders"
    node = stranger(nodes, [Segment("tank", topic, p).name for p in range(4)])
    other = next(n for n in NODES if n != node)
    async with await TankClient.connect("127.0.0.1", nodes[other].port_of("tank")) as tank:
        assert await tank.create_topic(topic, 4) is t.CreateTopicResult.CREATED
    # At once through another node: a follower that does not know the topic yet
    # looks again before it answers UNKNOWN_TOPIC.
    async with await TankClient.connect("127.0.0.1", nodes[node].port_of("tank")) as tank:
        for partition in range(4):
            messages = [t.BundleMessage(b"p%d-m%d" % (partition, i)) for i in range(50)]
            await tank.produce(topic, partition, messages)
    async with await TankClient.connect("127.0.0.1", nodes[other].port_of("tank")) as tank:
        for partition in range(4):
            result = await tank.consume(topic, partition, 0)
            assert [m.content for m in result.messages] == [
                b"p%d-m%d" % (partition, i) for i in range(50)
            ], partition


def test_pylogbeat_ships_through_a_node_without_the_data(
    nodes: dict[str, ServerProcess],
) -> None:
    node = stranger(nodes, [Segment("logs", "beats", 0).name])
    events = [{"message": f"line {i}", "id": i} for i in range(500)]
    outcome: dict[str, Any] = {}

    def ship() -> None:
        try:
            port = nodes[node].port_of("lumberjack")
            with pylogbeat.PyLogBeatClient("127.0.0.1", port, timeout=WAIT_S) as beat:
                for first in range(0, len(events), 100):
                    beat.send(events[first : first + 100])
                outcome["acked"] = beat._last_ack
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=ship, daemon=True)
    thread.start()
    thread.join(BEATS_TIMEOUT_S)
    assert not thread.is_alive(), "pylogbeat hung"
    assert "error" not in outcome, outcome
    other = next(n for n in NODES if n != node)
    stored = asyncio.run(read_stream(nodes[other], "logs", "beats"))
    assert sorted(json.loads(event)["id"] for event in stored) == list(range(len(events)))


async def test_rsio_subscription_through_a_node_without_the_data(
    nodes: dict[str, ServerProcess],
) -> None:
    scope, stream = "rs", "feed"
    segments = [Segment(scope, stream, p).name for p in range(3)]
    node = stranger(nodes, segments)
    writer_node = next(n for n in NODES if n != node)
    events = [b"event-%d" % i for i in range(300)]
    async with PravegaClient(nodes[writer_node].uri) as client:
        await client.controller.create_scope(scope)
        config = StreamConfig(scaling=ScalingPolicy(min_num_segments=3))
        await client.controller.create_stream(scope, stream, config)
        writer = await client.create_writer(scope, stream)
        for i, event in enumerate(events):
            await writer.write(event, f"k{i % 7}")
            if i == 149:  # the second half is appended after a known time
                await writer.flush()
                half_ms = _next_ms()
        await writer.flush()
        await writer.aclose()
        await client.controller.seal_stream(scope, stream)
    rsio = await RsioClient.connect("127.0.0.1", nodes[node].port_of("rsio"))
    try:
        sub = rsio.subscribe(f"{scope}/{stream}", batch=0)
        await sub.request(len(events) + 10)
        got: list[bytes] = []
        while len(got) < len(events):
            got.append(await asyncio.wait_for(sub.next(), WAIT_S))
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(sub.next(), WAIT_S)
        # By append time, through the owners' time indexes (ReadSegmentTimes).
        sub = rsio.subscribe(f"{scope}/{stream}?from=time:{half_ms}&format=record", batch=0)
        await sub.request(len(events))
        later = []
        with contextlib.suppress(StopAsyncIteration):
            while True:
                later.append(decode_record(await asyncio.wait_for(sub.next(), WAIT_S)))
    finally:
        await rsio.goodbye()
    assert sorted(got) == sorted(events)
    assert sorted(r.value for r in later) == sorted(events[150:])
    assert all((r.timestamp_ms or 0) >= half_ms for r in later)
