"""Broker behaviour that needs the broker's own knobs: heartbeats, and parked
consumes let go when their connection goes. In-process, over a MemoryStore."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from headrace.client.tank import TankClient
from headrace.controller.model import ControllerModel
from headrace.errors import ConnectionLost
from headrace.protocols.tank import (
    SEQ_NUM_TAIL,
    BundleMessage,
    Consume,
    ConsumeError,
    ConsumePartition,
    ConsumeTopic,
    CreateTopicResult,
    PartitionSeqNums,
    ProduceError,
    encode,
    encode_bundle,
)
from headrace.server._context import Listener
from headrace.server._listen import start_tcp_listener
from headrace.server.tank import MAX_QUEUED_CHUNK_BYTES, TankHandler
from headrace.server.tank_broker import (
    INDEX_INTERVAL_BYTES,
    MAX_INDEX_ENTRIES,
    Partition,
    TankBroker,
)
from headrace.store.memory import MemoryStore

HEARTBEAT_S = 0.05
WAIT_S = 10.0


@pytest.fixture
async def broker() -> AsyncIterator[TankBroker]:
    store = MemoryStore()
    broker = TankBroker(store, await ControllerModel.open(store))
    await broker.start()
    yield broker
    await store.close()


@pytest.fixture
async def listener(broker: TankBroker) -> AsyncIterator[Listener]:
    listener = await start_tcp_listener(
        "tank", "127.0.0.1", 0, lambda: TankHandler(broker, heartbeat_interval_s=HEARTBEAT_S)
    )
    yield listener
    await listener.aclose()


async def test_heartbeat_pings_arrive(listener: Listener) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
    try:
        frames = await asyncio.wait_for(reader.readexactly(15), WAIT_S)
        assert frames == b"\x03\x00\x00\x00\x00" * 3  # the greeting, then two heartbeats
    finally:
        writer.close()
        await writer.wait_closed()


class _WatchedSet(set[object]):
    """A set that says when something leaves it."""

    def __init__(self) -> None:
        super().__init__()
        self.emptied = asyncio.Event()

    def discard(self, item: object) -> None:
        super().discard(item)
        if not self:
            self.emptied.set()


async def test_parked_consume_is_released_when_its_client_goes(
    broker: TankBroker, listener: Listener
) -> None:
    async with await TankClient.connect("127.0.0.1", listener.port) as client:
        assert await client.create_topic("parked", 1) is CreateTopicResult.CREATED
        part = await broker.partition("parked", 0)
        watched = _WatchedSet()
        part.waiters = watched  # type: ignore[assignment]
        parked = asyncio.ensure_future(
            client.start_consume("parked", 0, SEQ_NUM_TAIL, max_wait_ms=600_000)
        )
        # Requests run in arrival order and a consume at the tail parks before its
        # first pause, so once this later request is answered the consume is parked.
        await client.status()
        assert len(watched) == 1
    with pytest.raises(ConnectionLost):
        await parked
    # The broker saw the close and let the consume go (not its hour-long timer).
    await asyncio.wait_for(watched.emptied.wait(), WAIT_S)
    assert not part.waiters


async def _three_bundles(client: TankClient, topic: str) -> list[int]:
    """Bundles of 1, 2 and 3 messages (seq 1, 2-3, 4-6); their event offsets."""
    assert await client.create_topic(topic, 1) is CreateTopicResult.CREATED
    offsets, offset = [], 0
    for count in (1, 2, 3):
        bundle = encode_bundle([BundleMessage(b"m", 1)] * count)
        assert await client.produce_bundle(topic, 0, bundle) is ProduceError.OK
        offsets.append(offset)
        offset += 8 + len(bundle)
    return offsets


async def test_truncated_head_keeps_the_numbering(broker: TankBroker, listener: Listener) -> None:
    async with await TankClient.connect("127.0.0.1", listener.port) as client:
        offsets = await _three_bundles(client, "cut")
        assert [m.seq_num for m in (await client.consume("cut", 0, 0)).messages] == list(
            range(1, 7)
        )
        # Retention (through the Pravega side) drops the first bundle.
        await broker.store.truncate("tank/cut/0.#epoch.0", offsets[1])
        result = await client.consume("cut", 0, 0)
        assert [m.seq_num for m in result.messages] == [2, 3, 4, 5, 6]
        assert (await client.consume("cut", 0, 1)).error is ConsumeError.BOUNDARY_CHECK
        partitions = await client.discover_partitions("cut")
        assert partitions == (PartitionSeqNums(2, 6),)


async def test_truncated_head_keeps_the_numbering_across_a_restart(
    broker: TankBroker, listener: Listener
) -> None:
    async with await TankClient.connect("127.0.0.1", listener.port) as client:
        offsets = await _three_bundles(client, "cut-restart")
    # A restart loads the partition (anchoring its tail), then, while the
    # broker is down again, the head is truncated.
    store = broker.store
    restarted = TankBroker(store, await ControllerModel.open(store))
    await restarted.start()
    assert (await restarted.partition("cut-restart", 0)).hwm == 6
    await store.truncate("tank/cut-restart/0.#epoch.0", offsets[2])
    again = TankBroker(store, await ControllerModel.open(store))
    await again.start()
    part = await again.partition("cut-restart", 0)
    assert (part.first_seq, part.hwm) == (4, 6)


async def test_no_chunks_are_built_while_queued_responses_wait(broker: TankBroker) -> None:
    """A client that does not read: once queued consume responses fill the room,
    the next consume waits until the writer took them and drained them (its next take)."""
    handler = TankHandler(broker)
    handler.data_to_send()  # the greeting
    await broker.create_topic("slow-reader", 1, b"")
    consume = Consume(1, (ConsumeTopic("slow-reader", (ConsumePartition(0, 0, 1024),)),))
    for event in handler.feed(encode(consume)):
        await handler.handle(event)  # answered: queued, not yet taken
    handler._queued_bytes = MAX_QUEUED_CHUNK_BYTES  # as if that response were huge
    second = Consume(2, consume.topics)
    (event,) = list(handler.feed(encode(second)))
    waiting = asyncio.ensure_future(handler.handle(event))
    await asyncio.sleep(0)  # let it run up to its first pause
    assert not waiting.done()
    assert handler.data_to_send()  # the writer takes what was queued...
    for _ in range(2):  # ...which counts until two takes later (a take may not be sent yet)
        await asyncio.sleep(0)
        assert not waiting.done()
        assert not handler.data_to_send()
    await asyncio.wait_for(waiting, WAIT_S)  # ...then the consume goes on
    assert handler.data_to_send().startswith(b"\x02")


def test_partition_index_is_thinned_past_its_limit() -> None:
    part = Partition("tank/t/0.#epoch.0")
    for i in range(MAX_INDEX_ENTRIES + 1):
        part.note(i * INDEX_INTERVAL_BYTES, 1 + 10 * i)
    assert len(part.index_offsets) == MAX_INDEX_ENTRIES // 2 + 1
    # lookups still start at or before the wanted seq num, on a real entry
    offset, seq = part.floor(10 * 12345 + 5)
    assert seq <= 10 * 12345 + 5 and offset == (seq - 1) // 10 * INDEX_INTERVAL_BYTES
    # entries closer than the interval are not added
    part.note(1, 2)
    assert 1 not in part.index_offsets
