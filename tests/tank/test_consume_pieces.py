"""Consume responses whose large bundles go out as views (no copy into the chunk):
the chunks a real ``headrace serve`` sends are exactly the produced bundles."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from headrace.client.tank import TankClient
from headrace.client.tls import TlsOptions
from headrace.protocols.tank import (
    BundleMessage,
    Consume,
    ConsumePartition,
    ConsumePartitionResult,
    ConsumeResponse,
    ConsumeTopic,
    ConsumeTopicResult,
    CreateTopicResult,
    decode_response,
    encode,
    encode_bundle,
    encode_chunk_entry,
    encode_consume_split,
)
from headrace.server.tank_broker import VIEW_MIN_BYTES
from tests._server import make_certificate
from tests.tank.conftest import TankServer, running_server


@pytest.fixture
async def client(server: TankServer) -> AsyncIterator[TankClient]:
    async with await TankClient.connect("127.0.0.1", server.port) as c:
        yield c


def _bundles() -> list[bytes]:
    """Bundles below, at and above the view threshold, uncompressed (random content)."""
    sizes = [10, VIEW_MIN_BYTES - 40, VIEW_MIN_BYTES + 3, 300_000, 5, 1_000_000, 77]
    return [
        encode_bundle([BundleMessage(os.urandom(size), 1_700_000_000_000 + i)], compress=False)
        for i, size in enumerate(sizes)
    ]


async def test_chunks_are_the_produced_bundles_byte_for_byte(client: TankClient) -> None:
    assert await client.create_topic("pieces", 1) is CreateTopicResult.CREATED
    bundles = _bundles()
    for bundle in bundles:
        await client.produce_bundle("pieces", 0, bundle)
    expected = b"".join(encode_chunk_entry(b) for b in bundles)
    for fetch_size in (1, 70_000, 4 * 1024 * 1024):  # one bundle per chunk .. all of them
        got = b""
        seq_num = 1
        while seq_num <= len(bundles):
            wanted = (ConsumePartition(0, seq_num, fetch_size),)
            request = Consume(client.next_request_id(), (ConsumeTopic("pieces", wanted),))
            response = await client.request(request)
            assert isinstance(response, ConsumeResponse)
            topic = response.topics[0]
            assert isinstance(topic, ConsumeTopicResult)
            part = topic.partitions[0]
            assert part.base_seq_num == seq_num and part.chunk
            got += part.chunk
            seq_num = len(_entries_in(got)) + 1
        assert got == expected, fetch_size


def _entries_in(chunks: bytes) -> list[int]:
    """Start positions of the chunk entries in ``chunks``."""
    from headrace.protocols.tank.codec import decode_varint

    starts, position = [], 0
    while position < len(chunks):
        starts.append(position)
        length, used = decode_varint(chunks[position : position + 5])
        position += used + length
    return starts


def test_encode_consume_split_joins_to_encode() -> None:
    chunk_a = encode_chunk_entry(b"x" * 100)
    chunk_b = encode_chunk_entry(b"y" * 200_000)
    whole = ConsumeResponse(
        9,
        (
            ConsumeTopicResult(
                "t",
                (
                    ConsumePartitionResult(0, base_seq_num=1, high_water_mark=5, chunk=chunk_a),
                    ConsumePartitionResult(1, base_seq_num=3, high_water_mark=3, chunk=chunk_b),
                ),
            ),
        ),
    )
    split = ConsumeResponse(
        9,
        (
            ConsumeTopicResult(
                "t",
                (
                    ConsumePartitionResult(0, base_seq_num=1, high_water_mark=5, chunk=chunk_a),
                    ConsumePartitionResult(1, base_seq_num=3, high_water_mark=3),
                ),
            ),
        ),
    )
    view = memoryview(chunk_b)
    first, rest = view[:7], view[7:]
    pieces = encode_consume_split(split, {(0, 1): (first, rest)})
    assert b"".join(pieces) == encode(whole)
    assert pieces[-2] is first and pieces[-1] is rest  # handed over, not copied
    frame = b"".join(pieces)
    assert decode_response(frame[0], frame[5:]) == whole


async def test_chunks_over_tls_are_the_produced_bundles(tmp_path: Path) -> None:
    """The views of large bundles go through the cipher like any bytes."""
    pem = make_certificate(tmp_path / "pki", "tank")
    args = ("--tls-cert", str(pem.cert), "--tls-key", str(pem.key))
    bundles = _bundles()
    context = TlsOptions(ca_file=pem.cert).ssl_context()
    with running_server(tmp_path / "data", extra_args=args) as server:
        tank = await TankClient.connect("127.0.0.1", server.port, ssl_context=context)
        async with tank:
            assert await tank.create_topic("tls_pieces", 1) is CreateTopicResult.CREATED
            for bundle in bundles:
                await tank.produce_bundle("tls_pieces", 0, bundle)
            wanted = (ConsumePartition(0, 1, 4 * 1024 * 1024),)
            request = Consume(tank.next_request_id(), (ConsumeTopic("tls_pieces", wanted),))
            response = await tank.request(request)
    assert isinstance(response, ConsumeResponse)
    topic = response.topics[0]
    assert isinstance(topic, ConsumeTopicResult)
    assert topic.partitions[0].chunk == b"".join(encode_chunk_entry(b) for b in bundles)
