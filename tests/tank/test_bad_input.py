"""Malformed bundles get the invalid-request code; garbage frames close only their
own connection; other connections and stored data are unaffected."""

from __future__ import annotations

import socket
import struct
from collections.abc import AsyncIterator

import cramjam
import pytest

from headrace.client.tank import TankClient
from headrace.protocols.tank import (
    BundleMessage,
    CreateTopicResult,
    ProduceError,
    encode_bundle,
)
from tests.tank.conftest import TankServer

READ_TIMEOUT_S = 10.0
TS = b"\x00" * 8


@pytest.fixture
async def client(server: TankServer) -> AsyncIterator[TankClient]:
    async with await TankClient.connect("127.0.0.1", server.port) as c:
        yield c


GOOD = encode_bundle([BundleMessage(b"fine", 7, b"k")], compress=False)

MALFORMED_BUNDLES = {
    "empty": b"",
    "undefined codec 2": bytes([0x04 | 0x02]) + b"\x00" + TS + b"\x00",
    "reserved bit 7": bytes([0x84]) + b"\x00" + TS + b"\x00",
    "count varint 0": b"\x00\x00",
    "count over 65535": b"\x00\x80\x80\x04",
    "message set missing": bytes([0x04]),
    "message cut in its timestamp": bytes([0x04]) + b"\x00\x01\x02",
    "content longer than the bundle": bytes([0x04]) + b"\x00" + TS + b"\x10abc",
    "trailing bytes": GOOD + b"\x00",
    "fewer messages than counted": bytes([0x08]) + b"\x00" + TS + b"\x01a",
    "snappy that does not decompress": bytes([0x05]) + b"\x0a\xff\xff\xff",
    "snappy of a bad message set": bytes([0x05]) + bytes(cramjam.snappy.compress_raw(b"\x00\x01")),
    "sparse last before first": bytes([0x40 | 0x08]) + struct.pack("<Q", 2**64 - 1) + b"\x05",
}


@pytest.mark.parametrize("name", sorted(MALFORMED_BUNDLES))
async def test_malformed_bundle_gets_invalid_request(client: TankClient, name: str) -> None:
    topic = "malformed-" + name.replace(" ", "-")[:40]
    assert await client.create_topic(topic, 1) is CreateTopicResult.CREATED
    assert await client.produce_bundle(topic, 0, GOOD) is ProduceError.OK
    assert await client.produce_bundle(topic, 0, MALFORMED_BUNDLES[name]) is (
        ProduceError.INVALID_SEQ_NUMS
    )
    # nothing was stored: the next good bundle is seq num 2
    assert await client.produce_bundle(topic, 0, GOOD) is ProduceError.OK
    result = await client.consume(topic, 0, 0)
    assert [(m.seq_num, m.content) for m in result.messages] == [(1, b"fine"), (2, b"fine")]


def closes_after(port: int, data: bytes) -> bytes:
    """Send ``data`` on a fresh connection; return what came back before the close."""
    with socket.create_connection(("127.0.0.1", port), timeout=READ_TIMEOUT_S) as sock:
        sock.sendall(data)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
        return received


GARBAGE_FRAMES = {
    "unknown msg id": b"\xee\x00\x00\x00\x00",
    "obsolete replica id 0x04": b"\x04\x02\x00\x00\x00\x01\x00",
    "consume peer 0x09": b"\x09\x00\x00\x00\x00",
    "frame over 256 MiB": b"\x02\x01\x00\x00\x10",
    "truncated produce payload": b"\x01\x03\x00\x00\x00\x02\x00\x01",
    "status with trailing bytes": b"\x0a\x05\x00\x00\x00\x01\x00\x00\x00\x00",
    "random bytes": bytes(range(256)) * 4,
}


@pytest.mark.parametrize("name", sorted(GARBAGE_FRAMES))
async def test_garbage_closes_only_that_connection(
    server: TankServer, client: TankClient, name: str
) -> None:
    topic = "garbage-" + name.replace(" ", "-")[:40]
    assert await client.create_topic(topic, 1) is CreateTopicResult.CREATED
    await client.produce(topic, 0, [BundleMessage(b"before")])
    # The greeting, then nothing but the close: TANK has no error reply for these.
    assert closes_after(server.port, GARBAGE_FRAMES[name]) == b"\x03\x00\x00\x00\x00"
    await client.produce(topic, 0, [BundleMessage(b"after")])
    result = await client.consume(topic, 0, 0)
    assert [m.content for m in result.messages] == [b"before", b"after"]


async def test_client_ping_gets_no_reply(server: TankServer) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=READ_TIMEOUT_S) as sock:
        sock.sendall(b"\x03\x00\x00\x00\x00" + b"\x0c\x05\x00\x00\x00\x02\x00\x00\x00\x00")
        received = b""
        while len(received) < 5 + 11:
            received += sock.recv(65536)
        assert received == b"\x03\x00\x00\x00\x00" + b"\x0c\x06\x00\x00\x00\x02\x00\x00\x00\xff\xff"
