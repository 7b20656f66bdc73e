"""Producing and consuming through the TANK front door of a live ``headrace serve``."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator

import pytest

from headrace.client.tank import ConsumeResult, TankClient
from headrace.errors import ServerError
from headrace.protocols.tank import (
    SEQ_NUM_TAIL,
    BundleMessage,
    Consume,
    ConsumeError,
    ConsumePartition,
    ConsumeResponse,
    ConsumeTopic,
    ConsumeTopicResult,
    ConsumeUnknownTopic,
    CreateTopicResult,
    ProduceError,
    decode_bundle_header,
    decode_chunk,
    encode_bundle,
)
from tests.tank.conftest import TankServer

TOTAL_MESSAGES = 100_000
BUNDLE_SIZES = (1, 8192, 2, 15, 16, 17, 511, 513, 4096, 100, 1000, 3, 8191, 64)
LONG_WAIT_MS = 30_000
"""A long poll that must be woken by a produce; it returning in a fraction of this
shows the produce, not the timer, ended it."""
WOKEN_WITHIN_S = 5.0


@pytest.fixture
async def client(server: TankServer) -> AsyncIterator[TankClient]:
    async with await TankClient.connect("127.0.0.1", server.port) as c:
        yield c


def message(seq: int, *, keyed: bool) -> BundleMessage:
    """Content, key and timestamp derived from the seq num, so each can be checked."""
    content = b"message-%d-" % seq + bytes([seq % 251]) * (seq % 97)
    key = b"key-%d" % (seq % 1000) if keyed else b""
    return BundleMessage(content, 1_700_000_000_000 + seq // 3, key)  # runs of equal timestamps


def expected(seq: int, keyed: bool) -> BundleMessage:
    m = message(seq, keyed=keyed)
    return BundleMessage(m.content, m.timestamp_ms, m.key, seq)


async def consume_all(
    client: TankClient, topic: str, seq_num: int, hwm: int
) -> list[BundleMessage]:
    got: list[BundleMessage] = []
    while True:
        result = await client.consume(topic, 0, seq_num, fetch_size=256 * 1024)
        assert result.error is ConsumeError.OK
        got += result.messages
        seq_num = result.next_seq_num
        if seq_num > hwm:
            return got
        assert result.messages, f"no progress at {seq_num}"


async def test_hundred_thousand_messages_in_mixed_bundles(client: TankClient) -> None:
    assert await client.create_topic("bulk", 1) is CreateTopicResult.CREATED
    bundles: list[bytes] = []
    keyed_of: dict[int, bool] = {}
    seq = 1
    for i, size in enumerate(itertools.cycle(BUNDLE_SIZES)):
        size = min(size, TOTAL_MESSAGES - seq + 1)
        if size <= 0:
            break
        keyed = i % 2 == 1
        compress = (i // 2) % 2 == 1
        batch = [message(s, keyed=keyed) for s in range(seq, seq + size)]
        bundles.append(encode_bundle(batch, compress=compress))
        for s in range(seq, seq + size):
            keyed_of[s] = keyed
        seq += size
    assert {decode_bundle_header(b).codec for b in bundles} == {0, 1}
    # Pipelined: every request is written before the first answer arrives.
    errors = await asyncio.gather(*(client.produce_bundle("bulk", 0, b) for b in bundles))
    assert set(errors) == {ProduceError.OK}

    partitions = await client.discover_partitions("bulk")
    assert partitions is not None and len(partitions) == 1
    assert (partitions[0].first_available_seq_num, partitions[0].high_water_mark) == (1, 100_000)

    got = await consume_all(client, "bulk", 0, TOTAL_MESSAGES)
    assert len(got) == TOTAL_MESSAGES
    for m in got:
        assert m == expected(m.seq_num, keyed_of[m.seq_num])
    assert [m.seq_num for m in got] == list(range(1, TOTAL_MESSAGES + 1))

    middle = 54_321
    got = await consume_all(client, "bulk", middle, TOTAL_MESSAGES)
    assert got[0].seq_num == middle
    assert [m.seq_num for m in got] == list(range(middle, TOTAL_MESSAGES + 1))

    # On the wire: the chunk starts with the bundle holding the seq num and
    # holds whole bundles only, however small the fetch size.
    for fetch_size in (1, 100, 70_000):
        request = Consume(
            client.next_request_id(),
            (ConsumeTopic("bulk", (ConsumePartition(0, middle, fetch_size),)),),
        )
        response = await client.request(request)
        assert isinstance(response, ConsumeResponse)
        entry = response.topics[0]
        assert not isinstance(entry, type(None))
        part = entry.partitions[0]  # type: ignore[union-attr]
        assert part.base_seq_num <= middle and part.high_water_mark == TOTAL_MESSAGES
        decoded = decode_chunk(part.chunk, part.base_seq_num, high_water_mark=part.high_water_mark)
        assert decoded.truncated_entry_bytes is None
        assert decoded.messages[0].seq_num == part.base_seq_num
        assert decoded.messages[-1].seq_num >= middle


async def produce_some(client: TankClient, topic: str, first: int, count: int) -> None:
    await client.produce(topic, 0, [message(s, keyed=True) for s in range(first, first + count)])


async def test_long_poll_at_the_next_seq_num_is_woken_by_a_produce(client: TankClient) -> None:
    assert await client.create_topic("poll-next", 1) is CreateTopicResult.CREATED
    await produce_some(client, "poll-next", 1, 10)
    began = time.monotonic()
    waiting = asyncio.ensure_future(
        client.start_consume("poll-next", 0, 11, max_wait_ms=LONG_WAIT_MS)
    )
    await produce_some(client, "poll-next", 11, 5)
    result = await asyncio.wait_for(waiting, LONG_WAIT_MS / 1000)
    assert time.monotonic() - began < WOKEN_WITHIN_S
    assert [m.seq_num for m in result.messages] == [11, 12, 13, 14, 15]
    assert result.messages[0] == expected(11, True)
    assert result.high_water_mark == 15


async def test_long_poll_at_the_tail_is_woken_by_a_produce(client: TankClient) -> None:
    assert await client.create_topic("poll-tail", 1) is CreateTopicResult.CREATED
    await produce_some(client, "poll-tail", 1, 3)
    began = time.monotonic()
    # The consume is on the wire before the produce, on the same connection, so
    # it parks at the old tail.
    waiting = asyncio.ensure_future(
        client.start_consume("poll-tail", 0, SEQ_NUM_TAIL, max_wait_ms=LONG_WAIT_MS)
    )
    await produce_some(client, "poll-tail", 4, 2)
    result = await asyncio.wait_for(waiting, LONG_WAIT_MS / 1000)
    assert time.monotonic() - began < WOKEN_WITHIN_S
    assert [m.seq_num for m in result.messages] == [4, 5]


async def test_long_poll_on_an_empty_partition_from_zero(client: TankClient) -> None:
    assert await client.create_topic("poll-empty", 1) is CreateTopicResult.CREATED
    waiting = asyncio.ensure_future(
        client.start_consume("poll-empty", 0, 0, max_wait_ms=LONG_WAIT_MS)
    )
    began = time.monotonic()
    await produce_some(client, "poll-empty", 1, 1)
    result = await asyncio.wait_for(waiting, LONG_WAIT_MS / 1000)
    assert time.monotonic() - began < WOKEN_WITHIN_S
    assert [m.seq_num for m in result.messages] == [1]


async def test_long_poll_waits_for_min_bytes(client: TankClient) -> None:
    assert await client.create_topic("poll-min", 1) is CreateTopicResult.CREATED
    first = encode_bundle([message(1, keyed=False)], compress=False)
    second = encode_bundle([message(2, keyed=False)], compress=False)
    min_bytes = len(first) + 2  # more than the first bundle's entry, less than both
    waiting = asyncio.ensure_future(
        client.start_consume(
            "poll-min", 0, SEQ_NUM_TAIL, max_wait_ms=LONG_WAIT_MS, min_bytes=min_bytes
        )
    )
    assert await client.produce_bundle("poll-min", 0, first) is ProduceError.OK
    assert await client.produce_bundle("poll-min", 0, second) is ProduceError.OK
    result = await asyncio.wait_for(waiting, LONG_WAIT_MS / 1000)
    # Woken by the second bundle only: the response carries both.
    assert [m.seq_num for m in result.messages] == [1, 2]


async def test_long_poll_times_out_empty(client: TankClient) -> None:
    assert await client.create_topic("poll-quiet", 1) is CreateTopicResult.CREATED
    await produce_some(client, "poll-quiet", 1, 2)
    began = time.monotonic()
    result = await client.consume("poll-quiet", 0, 3, max_wait_ms=400)
    elapsed = time.monotonic() - began
    assert 0.39 <= elapsed < WOKEN_WITHIN_S
    assert result == ConsumeResult((), 2, 3)


async def test_consume_at_the_end_without_wait_answers_at_once(client: TankClient) -> None:
    assert await client.create_topic("at-end", 1) is CreateTopicResult.CREATED
    assert await client.consume("at-end", 0, 0) == ConsumeResult((), 0, 0)
    await produce_some(client, "at-end", 1, 4)
    assert await client.consume("at-end", 0, 5) == ConsumeResult((), 4, 5)
    assert await client.consume("at-end", 0, SEQ_NUM_TAIL) == ConsumeResult((), 4, 5)


async def test_boundary_check_carries_the_first_available(client: TankClient) -> None:
    assert await client.create_topic("bounds", 1) is CreateTopicResult.CREATED
    await produce_some(client, "bounds", 1, 4)
    result = await client.consume("bounds", 0, 6)
    assert result.error is ConsumeError.BOUNDARY_CHECK
    assert (result.first_available_seq_num, result.high_water_mark) == (1, 4)


async def test_unknown_topic_and_partition(client: TankClient) -> None:
    assert await client.create_topic("two", 2) is CreateTopicResult.CREATED
    assert (await client.consume("no-such-topic", 0, 0)).unknown_topic
    assert (await client.consume("two", 2, 0)).error is ConsumeError.UNKNOWN_PARTITION
    bundle = encode_bundle([message(1, keyed=False)])
    assert await client.produce_bundle("no-such-topic", 0, bundle) is ProduceError.UNKNOWN_TOPIC
    assert await client.produce_bundle("two", 2, bundle) is ProduceError.UNKNOWN_PARTITION
    assert await client.produce_bundle("two", 1, bundle) is ProduceError.OK
    assert await client.discover_partitions("no-such-topic") is None
    with pytest.raises(ServerError, match="unknown topic") as refused:
        await client.produce("no-such-topic", 0, [message(1, keyed=False)])
    assert refused.value.code is ProduceError.UNKNOWN_TOPIC
    with pytest.raises(ServerError, match="unknown partition"):
        await client.produce("two", 2, [message(1, keyed=False)])


async def test_explicit_and_sparse_seq_nums(client: TankClient) -> None:
    assert await client.create_topic("explicit", 1) is CreateTopicResult.CREATED
    await produce_some(client, "explicit", 1, 3)
    # ProduceWithSeqnum, an ordinary bundle numbered from 1000
    bundle = encode_bundle([message(s, keyed=False) for s in range(1000, 1004)])
    assert await client.produce_bundle("explicit", 0, bundle, first_seq_num=1000) is ProduceError.OK
    # a sparse bundle: 2000, 2001, 2005
    sparse = [BundleMessage(b"s%d" % s, 5, b"", s) for s in (2000, 2001, 2005)]
    assert await client.produce_bundle("explicit", 0, encode_bundle(sparse, sparse=True)) is (
        ProduceError.OK
    )
    # and an ordinary one after them continues from the last
    await produce_some(client, "explicit", 2006, 2)
    # going backwards is refused
    backwards = encode_bundle([message(1, keyed=False)])
    assert await client.produce_bundle("explicit", 0, backwards, first_seq_num=2007) is (
        ProduceError.INVALID_SEQ_NUMS
    )
    seqs = [m.seq_num for m in await consume_all(client, "explicit", 0, 2007)]
    assert seqs == [1, 2, 3, 1000, 1001, 1002, 1003, 2000, 2001, 2005, 2006, 2007]
    # a seq num in a gap starts at the next bundle
    result = await client.consume("explicit", 0, 500)
    assert result.messages[0].seq_num == 1000
    # the sparse bundle first in the chunk: errorOrFlags 0xfe on the wire, decoded anyway
    result = await client.consume("explicit", 0, 2001, fetch_size=1)
    assert [m.seq_num for m in result.messages] == [2001, 2005]
    assert result.messages[0].content == b"s2001"


async def test_long_poll_over_several_partitions_and_topics(client: TankClient) -> None:
    assert await client.create_topic("multi-a", 2) is CreateTopicResult.CREATED
    assert await client.create_topic("multi-b", 1) is CreateTopicResult.CREATED
    await produce_some(client, "multi-a", 1, 2)  # multi-a/0 holds 1..2
    tail = SEQ_NUM_TAIL
    request = Consume(
        client.next_request_id(),
        (
            ConsumeTopic(
                "multi-a", (ConsumePartition(0, 3, 65536), ConsumePartition(1, tail, 65536))
            ),
            ConsumeTopic("multi-b", (ConsumePartition(0, 0, 65536),)),
        ),
        max_wait_ms=LONG_WAIT_MS,
    )
    began = time.monotonic()
    future = client.send(request)  # parked before the produce below is sent
    await produce_some(client, "multi-b", 1, 3)
    response = await client.response(request.request_id, future, timeout_s=LONG_WAIT_MS / 1000)
    assert time.monotonic() - began < WOKEN_WITHIN_S
    assert isinstance(response, ConsumeResponse)
    a, b = response.topics
    assert isinstance(a, ConsumeTopicResult) and isinstance(b, ConsumeTopicResult)
    # the partitions without new data: empty, base 0, their high-water marks
    assert [(p.partition_id, p.base_seq_num, p.high_water_mark, p.chunk) for p in a.partitions] == [
        (0, 0, 2, b""),
        (1, 0, 0, b""),
    ]
    (woken,) = b.partitions
    assert (woken.base_seq_num, woken.high_water_mark) == (1, 3)
    decoded = decode_chunk(woken.chunk, woken.base_seq_num, high_water_mark=3)
    assert [m.seq_num for m in decoded.messages] == [1, 2, 3]


async def test_consume_of_several_partitions_answers_at_once_when_one_has_data(
    client: TankClient,
) -> None:
    assert await client.create_topic("some-data", 2) is CreateTopicResult.CREATED
    await produce_some(client, "some-data", 1, 2)
    request = Consume(
        client.next_request_id(),
        (
            ConsumeTopic(
                "some-data", (ConsumePartition(0, 1, 65536), ConsumePartition(1, 0, 65536))
            ),
            ConsumeTopic("absent", (ConsumePartition(0, 0, 65536),)),
        ),
        max_wait_ms=LONG_WAIT_MS,
    )
    began = time.monotonic()
    response = await client.request(request)
    assert time.monotonic() - began < WOKEN_WITHIN_S
    assert isinstance(response, ConsumeResponse)
    topic, absent = response.topics
    assert isinstance(topic, ConsumeTopicResult)
    assert absent == ConsumeUnknownTopic("absent", 1)
    with_data, empty = topic.partitions
    assert (with_data.base_seq_num, with_data.high_water_mark) == (1, 2) and with_data.chunk
    # at its end, answered at once: base = first available (0: empty), its hwm
    assert (empty.partition_id, empty.base_seq_num, empty.high_water_mark, empty.chunk) == (
        1,
        0,
        0,
        b"",
    )
