"""``StreamCursor`` lets go of what it holds and reads it again without losing or
repeating an element, whatever the shape of the events (in-process, over a
``MemoryStore``: the cursor is driven step by step)."""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator

import pytest

from headrace.controller.records import StreamConfig
from headrace.protocols.rsio.codec import decode_varint
from headrace.protocols.tank import BundleMessage, encode_bundle
from headrace.server.app import ServerApp
from headrace.server.config import DEFAULT_PORTS, build_config
from headrace.server.rsio_cursor import PublisherQuery, StreamCursor
from headrace.store.memory import MemoryStore


@pytest.fixture
async def app() -> AsyncIterator[ServerApp]:
    no_listeners = build_config({f"{name}_port": 0 for name in DEFAULT_PORTS})
    app = ServerApp(no_listeners, store=MemoryStore())
    await app.start()
    yield app
    await app.aclose()


async def _stream(app: ServerApp, scope: str, payloads: list[bytes]) -> str:
    await app.controller.create_scope(scope)
    await app.controller.create_stream(scope, "s", StreamConfig())
    data = b"".join(struct.pack(">ii", 0, len(p)) + p for p in payloads)
    await app.store.append(f"{scope}/s/0.#epoch.0", data)
    await app.controller.seal_stream(scope, "s")  # reading ends: no wait at the tail
    return f"{scope}/s"


async def _take(cursor: StreamCursor, demand: int, count: int) -> list[bytes]:
    """``count`` elements, read ``demand`` at a time."""
    got: list[bytes] = []
    while len(got) < count:
        assert not cursor.done, f"the stream ended after {len(got)} of {count}"
        cursor.demand = demand
        if not cursor.has_elements:
            await cursor.fill()
            continue
        element = cursor.pop()
        if element is not None:
            got.append(element)
    return got


def _value(record: bytes) -> bytes:
    """The value of a ``format=record`` element of a plain event (no key; its
    append time, flag 2)."""
    position = 0
    for _ in range(3):  # segment id, offset, index
        _, position = decode_varint(record, position)
    assert record[position] == 2
    _, position = decode_varint(record, position + 1)
    return record[position:]


@pytest.mark.parametrize("fmt", ["value", "record"])
async def test_dropped_events_are_read_again_from_the_first_not_handed_out(
    app: ServerApp, fmt: str
) -> None:
    payloads = [bytes([i]) * (1 + 37 * i) for i in range(60)]
    name = await _stream(app, f"plain-{fmt}", payloads)
    scope, stream = name.split("/")
    cursor = StreamCursor(app.listener_context, PublisherQuery(scope, stream, fmt=fmt))
    await cursor.open()
    got = await _take(cursor, 50, 7)  # a read of more than seven events, seven handed out
    assert cursor.held_bytes > 0
    cursor.drop()
    assert cursor.held_bytes == 0
    got += await _take(cursor, 3, 10)
    cursor.drop()
    got += await _take(cursor, 1000, len(payloads) - 17)
    assert not cursor.has_elements
    if fmt == "record":
        got = [_value(element) for element in got]
    assert got == payloads


async def test_dropped_bundles_are_unpacked_again_past_the_messages_handed_out(
    app: ServerApp,
) -> None:
    messages = [b"m%03d" % i for i in range(25)]
    bundles = [
        encode_bundle([BundleMessage(m, 1, b"") for m in messages[:10]], compress=True),
        encode_bundle([BundleMessage(m, 1, b"") for m in messages[10:25]], compress=False),
    ]
    await app.controller.create_scope(app.config.tank_scope)
    await app.controller.create_stream(app.config.tank_scope, "s", StreamConfig())
    data = b"".join(struct.pack(">ii", 0, len(b)) + b for b in bundles)
    await app.store.append(f"{app.config.tank_scope}/s/0.#epoch.0", data)
    await app.controller.seal_stream(app.config.tank_scope, "s")
    cursor = StreamCursor(app.listener_context, PublisherQuery(app.config.tank_scope, "s"))
    await cursor.open()
    got = await _take(cursor, 4, 4)  # a bundle of ten unpacked, four handed out
    cursor.drop()
    got += await _take(cursor, 2, 2)
    cursor.drop()
    got += await _take(cursor, 3, 7)  # the rest of the first bundle, three of the second
    cursor.drop()
    got += await _take(cursor, 100, 12)
    assert got == messages
    assert await _take(cursor, 100, 0) == [] and not cursor.has_elements
