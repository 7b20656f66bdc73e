"""Bad input gets ``goodbye(<reason>)`` and a close, and harms no other connection
(rsio.md#connection-rules, rsio.md#goodbye)."""

from __future__ import annotations

import asyncio

import pytest

from headrace.client import PravegaClient
from headrace.client.rsio import RsioClient
from headrace.protocols._buffer import ReceiveBuffer
from headrace.protocols.rsio import (
    Goodbye,
    Message,
    OnError,
    OnNext,
    ReactiveConnection,
    Role,
    ServerHello,
    Subscribe,
    Subscribed,
    decode_message,
    encode_frame,
)
from headrace.protocols.rsio.codec import read_frame

from .conftest import WAIT_S, Server, new_stream, write_events

HELLO = bytes.fromhex("03010000")


async def _until_closed(port: int, data: bytes) -> list[Message]:
    """Send ``data``; every message the server sent before it closed the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        received = b""
        while chunk := await asyncio.wait_for(reader.read(65536), WAIT_S):
            received += chunk
    finally:
        writer.close()
    buffer = ReceiveBuffer(1 << 24)
    buffer.feed(received)
    messages: list[Message] = []
    while (body := read_frame(buffer, 1 << 24)) is not None:
        messages.append(decode_message(body))
    assert not buffer, "the server sent a partial frame"
    return messages


def _subscribe(publisher: str, sid: int, demand: int = 0) -> bytes:
    return encode_frame(Subscribe(publisher, sid, demand))


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"GET /rsio HTTP/1.1\r\nHost: x\r\n\r\n" * 4, ""),
        (HELLO + bytes.fromhex("8000"), "overlong varint"),
        (HELLO + bytes.fromhex("03058000"), "overlong varint"),
        (HELLO + b"\x00", "frame length 0"),
        (HELLO + bytes.fromhex("80808008"), "frame too large"),
        (bytes.fromhex("03050102") + HELLO, "before the peer's hello"),
        (bytes.fromhex("03010100"), "unsupported version"),
        (bytes.fromhex("03020000"), "SERVER_HELLO received by the server"),
        (HELLO + HELLO, "second hello"),
        (HELLO + bytes.fromhex("021e00"), ""),  # a reserved type code
    ],
    ids=[
        "garbage",
        "overlong-length",
        "overlong-field",
        "zero-length-frame",
        "frame-over-limit",
        "message-before-hello",
        "wrong-version",
        "wrong-role-hello",
        "second-hello",
        "reserved-type",
    ],
)
async def test_bad_input_gets_goodbye_with_reason_then_close(
    server: Server, data: bytes, reason: str
) -> None:
    messages = await _until_closed(server.rsio_port, data)
    assert isinstance(messages[0], ServerHello)
    assert isinstance(messages[-1], Goodbye)
    assert messages[-1].reason, "a goodbye for bad input says why"
    assert reason in messages[-1].reason


async def test_duplicate_live_id_is_a_connection_error(
    server: Server, pravega: PravegaClient
) -> None:
    scope, stream = await new_stream(pravega)  # not sealed: subscription 1 stays open
    messages = await _until_closed(
        server.rsio_port,
        HELLO + _subscribe(f"{scope}/{stream}", 1) + _subscribe(f"{scope}/{stream}", 1),
    )
    assert messages[-1] == Goodbye("duplicate subscriber id")


async def test_illegal_demand_ends_only_that_subscription(
    server: Server, pravega: PravegaClient
) -> None:
    scope, stream = await new_stream(pravega)
    await write_events(pravega, scope, stream, [b"a", b"b"])
    reader, writer = await asyncio.open_connection("127.0.0.1", server.rsio_port)
    try:
        writer.write(
            HELLO
            + _subscribe(f"{scope}/{stream}", 1)
            + bytes.fromhex("03050100")  # request(1, 0): illegal
            + _subscribe(f"{scope}/{stream}", 2, 2)
        )
        got = b""
        want = encode_frame(OnError(1, "illegal demand"))
        while want not in got or encode_frame(OnNext(2, b"b")) not in got:
            chunk = await asyncio.wait_for(reader.read(65536), WAIT_S)
            assert chunk
            got += chunk
        assert encode_frame(Subscribed(1, 0)) in got
        # Subscription 2 goes on: both of its elements arrive.
        assert encode_frame(OnNext(2, b"a")) in got and encode_frame(OnNext(2, b"b")) in got
    finally:
        writer.close()


async def test_offer_beyond_demand_is_cancelled_with_on_error(
    server: Server, pravega: PravegaClient
) -> None:
    scope, stream = await new_stream(pravega)
    conn = ReactiveConnection(Role.CLIENT, extensions=(1,))
    reader, writer = await asyncio.open_connection("127.0.0.1", server.rsio_port)
    try:
        conn.send(Subscribe(f"offer:{scope}/{stream}", 3, 0))
        writer.write(conn.data_to_send())
        events: list[object] = []
        while not any(isinstance(e, Subscribe) for e in events):
            conn.receive_data(await asyncio.wait_for(reader.read(65536), WAIT_S))
            events += list(conn.events())
        granted = next(e for e in events if isinstance(e, Subscribe)).initial_demand
        conn.send(Subscribed(3, 0))
        for i in range(granted):
            conn.send(OnNext(3, b"%d" % i))
        # One more than granted, written by hand (the connection refuses to send it).
        writer.write(conn.data_to_send() + encode_frame(OnNext(3, b"over")))
        while not any(isinstance(e, OnError) for e in events):
            data = await asyncio.wait_for(reader.read(65536), WAIT_S)
            assert data
            conn.receive_data(data)
            events += list(conn.events())
        error = next(e for e in events if isinstance(e, OnError))
        assert error.subscriber == 3 and "beyond demand" in error.error
    finally:
        writer.close()


async def test_bad_connections_do_not_disturb_a_live_subscription(
    server: Server, pravega: PravegaClient
) -> None:
    scope, stream = await new_stream(pravega)
    client = await RsioClient.connect("127.0.0.1", server.rsio_port)
    try:
        sub = client.subscribe(f"{scope}/{stream}", batch=8)
        await asyncio.wait_for(sub.wait_subscribed(), WAIT_S)
        for garbage in (b"\x00", HELLO + b"\x80\x00", b"\xff" * 11):
            messages = await _until_closed(server.rsio_port, garbage)
            assert isinstance(messages[-1], Goodbye)
        await write_events(pravega, scope, stream, [b"still", b"here"])
        assert [await asyncio.wait_for(sub.next(), WAIT_S) for _ in range(2)] == [
            b"still",
            b"here",
        ]
    finally:
        await client.goodbye()
