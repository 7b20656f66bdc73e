"""Large frames received straight into a buffer of their own (``PravegaHandler.frame_buffer``).

The connection loop asks the handler for a buffer before every receive; while
a large frame is arriving, the kernel writes its bytes there and the loop
calls ``frame_received`` instead of ``feed``. These tests drive a real
``PravegaHandler`` (memory store) the way the loop does, with the byte stream
cut at points hypothesis picks and each piece received either through
``frame_buffer`` (when offered) or through ``feed`` (TLS, or bytes read
before the frame was known), and check that the events, the replies and the
stored bytes are those of the stream fed whole.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.errors import RemoteProtocolError
from headrace.protocols import pravega as p
from headrace.server._frames import FRAME_AHEAD_BYTES
from headrace.server.pravega import LARGE_FRAME_BYTES, PravegaHandler
from headrace.store.memory import MemoryStore
from tests._hypothesis import examples

SEG = "sc/st/0.#epoch.0"
WRITER = uuid.UUID(int=7)
_ABE_BYTES = len(p.encode_command(p.AppendBlockEnd(WRITER, 0, b"", 0, 0, 0)))
"""An AppendBlockEnd frame's size without its data."""
PAYLOAD_SIZES = (
    100,
    LARGE_FRAME_BYTES + 5,
    3,
    2 * LARGE_FRAME_BYTES,
    LARGE_FRAME_BYTES - _ABE_BYTES,  # the smallest frame received into its own buffer
    LARGE_FRAME_BYTES - _ABE_BYTES - 1,  # the largest that is not
)


def _payload(i: int, size: int) -> bytes:
    return p.encode_event(bytes([65 + i]) * (size - 8))


PAYLOADS = [_payload(i, size) for i, size in enumerate(PAYLOAD_SIZES)]


def _stream() -> bytes:
    """Hello, SetupAppend, then appends of every size with a KeepAlive among them."""
    frames = [
        p.Hello(p.WIRE_VERSION, p.OLDEST_COMPATIBLE_VERSION),
        p.SetupAppend(1, WRITER, SEG, ""),
    ]
    for n, data in enumerate(PAYLOADS, start=1):
        frames.append(p.AppendBlockEnd(WRITER, len(data), data, 1, n, 10 + n))
        if n == 2:
            frames.append(p.KeepAlive())
    return b"".join(p.encode_command(frame) for frame in frames)


STREAM = _stream()


async def _drive(pieces: list[bytes], direct: list[bool]) -> tuple[list[str], bytes, bytes]:
    """Receive ``pieces`` as the loop would; the events' names, the replies, the segment."""
    store = MemoryStore()
    await store.create_segment(SEG)
    handler = PravegaHandler(store)
    handler.on_start()
    seen: list[str] = []

    async def run(events: Iterable[object]) -> None:
        for event in events:
            seen.append(type(event).__name__)
            await handler.handle(event)

    for piece, use_view in zip(pieces, direct, strict=True):
        rest = memoryview(piece)
        while rest:
            view = handler.frame_buffer() if use_view else None
            if view is None:
                await run(handler.feed(bytes(rest)))
                break
            count = min(len(view), len(rest))  # a receive fills at most the view
            view[:count] = rest[:count]
            await run(handler.frame_received(count))
            rest = rest[count:]
    await run(handler.feed(b""))
    assert handler.partial_frame_bytes() == 0
    replies = handler.data_to_send()
    info = await store.info(SEG)
    stored = (await store.read(SEG, 0, info.length)).data
    await store.close()
    return seen, replies, stored


def _whole() -> tuple[list[str], bytes, bytes]:
    return asyncio.run(_drive([STREAM], [False]))


WHOLE = _whole()


def test_the_stream_fed_whole_appends_everything() -> None:
    seen, replies, stored = WHOLE
    assert seen.count("AppendData") == len(PAYLOADS)
    assert seen[-1] == "ConnectionClosed"
    assert stored == b"".join(PAYLOADS)
    assert replies  # Hello, AppendSetup and the DataAppended acks


@settings(max_examples=examples(60), deadline=None)
@given(
    cuts=st.lists(st.integers(1, len(STREAM) - 1), max_size=14, unique=True),
    direct=st.lists(st.booleans(), min_size=15, max_size=15),
)
def test_any_cut_and_any_receive_path_give_the_same_result(
    cuts: list[int], direct: list[bool]
) -> None:
    bounds = [0, *sorted(cuts), len(STREAM)]
    pieces = [STREAM[a:b] for a, b in itertools.pairwise(bounds)]
    assert asyncio.run(_drive(pieces, direct[: len(pieces)])) == WHOLE


def test_a_large_frame_is_received_into_its_own_buffer() -> None:
    """After a large frame's header and a few bytes, the handler offers the rest
    of a buffer of exactly the frame's size, and the append's data is a view of
    that buffer, not a copy."""

    async def go() -> None:
        store = MemoryStore()
        await store.create_segment(SEG)
        handler = PravegaHandler(store)
        setup = p.encode_command(p.Hello(p.WIRE_VERSION, p.OLDEST_COMPATIBLE_VERSION))
        setup += p.encode_command(p.SetupAppend(1, WRITER, SEG, ""))
        for event in handler.feed(setup):
            await handler.handle(event)
        data = PAYLOADS[3]
        frame = p.encode_command(p.AppendBlockEnd(WRITER, len(data), data, 1, 1, 5))
        assert list(handler.feed(frame[:100])) == []
        view = handler.frame_buffer()
        assert view is not None and len(view) == len(frame) - 100
        assert handler.partial_frame_bytes() == len(frame)  # held: the frame's buffer
        view[:] = frame[100:]
        (event,) = handler.frame_received(len(view))
        assert isinstance(event, p.AppendData)
        assert isinstance(event.data, memoryview) and event.data.obj is view.obj
        assert handler.frame_buffer() is None
        await store.close()

    asyncio.run(go())


def test_eof_inside_a_large_frame_is_a_protocol_error() -> None:
    handler = PravegaHandler(MemoryStore())
    data = PAYLOADS[1]
    frame = p.encode_command(p.Hello(p.WIRE_VERSION, p.OLDEST_COMPATIBLE_VERSION))
    frame += p.encode_command(p.AppendBlockEnd(WRITER, len(data), data, 1, 1, 5))
    assert [type(e) for e in handler.feed(frame[:-10])] == [p.Hello]
    assert handler.frame_buffer() is not None
    with pytest.raises(RemoteProtocolError, match="closed inside a frame"):
        list(handler.feed(b""))


@pytest.mark.parametrize("data_size", [PAYLOAD_SIZES[4], 3 * LARGE_FRAME_BYTES])
async def test_a_frame_received_whole_while_the_loop_holds_its_view(data_size: int) -> None:
    """The transport holds the view ``frame_buffer`` gave while ``frame_received``
    runs, so decoding must not resize that buffer (a frame just at the size limit
    carries data too small to be handed over as a view, so it is copied out)."""
    store = MemoryStore()
    await store.create_segment(SEG)
    handler = PravegaHandler(store)
    data = _payload(0, data_size)
    hello = p.encode_command(p.Hello(p.WIRE_VERSION, p.OLDEST_COMPATIBLE_VERSION))
    setup = p.encode_command(p.SetupAppend(1, WRITER, SEG, ""))
    for event in handler.feed(hello + setup):
        await handler.handle(event)  # answers SetupAppend, as the loop would
    frame = p.encode_command(p.AppendBlockEnd(WRITER, len(data), data, 1, 1, 5))
    assert list(handler.feed(frame[:20])) == []
    view = handler.frame_buffer()
    assert view is not None
    view[:] = frame[20:]
    (event,) = handler.frame_received(len(view))
    assert isinstance(event, p.AppendData) and bytes(event.data) == data
    view.release()
    await store.close()


async def test_a_large_frame_buffer_grows_with_what_arrives() -> None:
    """A header announcing a large frame allocates nothing; then the buffer holds
    at most ``FRAME_AHEAD_BYTES`` (or as much again as arrived) beyond what
    arrived, and the whole frame still comes out as a view of one buffer."""
    store = MemoryStore()
    await store.create_segment(SEG)
    handler = PravegaHandler(store)
    hello = p.encode_command(p.Hello(p.WIRE_VERSION, p.OLDEST_COMPATIBLE_VERSION))
    for event in handler.feed(hello + p.encode_command(p.SetupAppend(1, WRITER, SEG, ""))):
        await handler.handle(event)
    data = _payload(1, 4 * 1024 * 1024)
    frame = p.encode_command(p.AppendBlockEnd(WRITER, len(data), data, 1, 1, 5))
    assert list(handler.feed(frame[:8])) == []
    assert handler.partial_frame_bytes() == 8  # the header only: no buffer yet
    got = 8
    events: list[object] = []
    while got < len(frame):
        view = handler.frame_buffer()
        assert view is not None
        held = handler.partial_frame_bytes()
        assert held <= got + max(FRAME_AHEAD_BYTES, got), (got, held)
        count = min(len(view), 100_000)  # a receive fills part of the view
        view[:count] = frame[got : got + count]
        view.release()
        events += handler.frame_received(count)
        got += count
    (event,) = events
    assert isinstance(event, p.AppendData) and bytes(event.data) == data
    assert isinstance(event.data, memoryview)  # received in place, not copied out
    await store.close()
