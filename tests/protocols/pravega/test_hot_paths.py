"""The fast paths (``protocols/pravega/_fast.py``) agree with the codec they stand in for.

Every append is one AppendBlockEnd decoded and one DataAppended sent, every
read one ReadSegment and one SegmentRead; each has a shortcut (precompiled
``struct``s, no layout walk, no command built). These tests hold each
shortcut to the layout walk of ``codec.py``, including every malformed or
short payload, where the shortcut must step aside so the walk refuses it
with its own message.
"""

from __future__ import annotations

from uuid import UUID

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headrace.errors import LocalProtocolError, RemoteProtocolError
from headrace.protocols import pravega as p
from headrace.protocols.pravega import _fast, codec

I64 = st.integers(-(2**63), 2**63 - 1)
I32 = st.integers(-(2**31), 2**31 - 1)


def _outcome(decode: object, payload: bytes | memoryview) -> object:
    try:
        return decode(p.CommandType.APPEND_BLOCK_END, payload)  # type: ignore[operator]
    except RemoteProtocolError as exc:
        return ("error", str(exc))


@given(
    writer=st.uuids(),
    whole=I32,
    data=st.binary(max_size=64),
    count=I32,
    last=I64,
    request_id=I64,
    cut=st.integers(0, 120),
    as_view=st.booleans(),
)
def test_append_block_end_shortcut_decodes_as_the_layout_walk(
    writer: UUID,
    whole: int,
    data: bytes,
    count: int,
    last: int,
    request_id: int,
    cut: int,
    as_view: bool,
) -> None:
    frame = p.encode_command(p.AppendBlockEnd(writer, whole, data, count, last, request_id))
    full = frame[8:]
    for payload in (full, full[: max(0, len(full) - cut)], full + b"\x00" * (cut % 9)):
        given_payload: bytes | memoryview = memoryview(payload) if as_view else payload
        fast = _outcome(_fast.decode_payload, given_payload)
        assert fast == _outcome(codec.decode_payload, given_payload)
        if isinstance(fast, p.AppendBlockEnd):
            assert type(fast.data) is type(given_payload[:0])  # a view stays a view


def test_append_block_end_shortcut_is_taken_and_ids_are_shared() -> None:
    writer = UUID(int=7)
    frame = p.encode_command(p.AppendBlockEnd(writer, 3, b"abc", 1, 5, 9))
    assert _fast.decode_append_block_end(frame[8:]) == p.AppendBlockEnd(writer, 3, b"abc", 1, 5, 9)
    first = _fast.decode_payload(p.CommandType.APPEND_BLOCK_END, frame[8:])
    again = _fast.decode_payload(p.CommandType.APPEND_BLOCK_END, frame[8:])
    assert isinstance(first, p.AppendBlockEnd) and isinstance(again, p.AppendBlockEnd)
    assert first.writer_id is again.writer_id  # decoded once, then from the cache
    without_request_id = frame[8:-8]  # old Java clients omit it: the walk decodes that
    assert _fast.decode_append_block_end(without_request_id) is None
    decoded = _fast.decode_payload(p.CommandType.APPEND_BLOCK_END, without_request_id)
    assert decoded == p.AppendBlockEnd(writer, 3, b"abc", 1, 5)


def test_uuid_cache_is_bounded() -> None:
    for i in range(codec.UUID_CACHE_SIZE + 10):
        assert codec._uuid(UUID(int=i).bytes) == UUID(int=i)
    assert len(codec._UUIDS) <= codec.UUID_CACHE_SIZE


@given(writer=st.uuids(), number=I64, previous=I64, request_id=I64, offset=I64)
def test_data_appended_shortcut_encodes_as_encode_command(
    writer: UUID, number: int, previous: int, request_id: int, offset: int
) -> None:
    expected = p.encode_command(p.DataAppended(writer, number, previous, request_id, offset))
    assert _fast.encode_data_appended(writer, number, previous, request_id, offset) == expected


def _server_with_writer(writer: UUID) -> p.PravegaConnection:
    conn = p.PravegaConnection(p.Role.SERVER)
    conn.receive_data(
        p.encode_command(p.Hello(p.WIRE_VERSION, p.OLDEST_COMPATIBLE_VERSION))
        + p.encode_command(p.SetupAppend(1, writer, "s", ""))
    )
    list(conn.events())
    conn.send(p.AppendSetup(1, "s", writer, p.NULL_ATTRIBUTE_VALUE))  # accepted
    conn.data_to_send()
    return conn


def test_send_data_appended_is_send_of_the_command() -> None:
    writer = UUID(int=3)
    general, shortcut = _server_with_writer(writer), _server_with_writer(writer)
    general.send(p.DataAppended(writer, 10, -1, 2, 1080))
    shortcut.send_data_appended(writer, 10, -1, 2, 1080)
    assert shortcut.data_to_send() == general.data_to_send()
    assert shortcut.writers[writer].last_acked == general.writers[writer].last_acked == 10
    # Acks go out in event-number order, on both paths.
    with pytest.raises(LocalProtocolError, match="event-number order"):
        shortcut.send_data_appended(writer, 9, 10, 3, 1080)


def test_send_data_appended_refuses_what_send_refuses() -> None:
    client = p.PravegaConnection(p.Role.CLIENT)
    with pytest.raises(LocalProtocolError):
        client.send_data_appended(UUID(int=1), 1, -1, 1, 1)
    server = p.PravegaConnection(p.Role.SERVER)  # before the handshake
    with pytest.raises(LocalProtocolError):
        server.send_data_appended(UUID(int=1), 1, -1, 1, 1)


# Names as clients send them, and the odd ones the codec must treat alike:
# non-ASCII, NUL (modified UTF-8 on the Java side), a lone surrogate (refused).
NAMES = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["scope/stream/0.#epoch.0", "a\x00b", "\ud800", "é" * 30]),
)


def _encoded(cmd: p.Command, max_frame_bytes: int, walk: bool) -> object:
    encode = codec.encode_command if walk else _fast.encode_command
    try:
        return encode(cmd, max_frame_bytes=max_frame_bytes)
    except LocalProtocolError as exc:
        return ("error", str(exc))


@given(
    segment=NAMES,
    offset=st.one_of(I64, st.just(2**63)),
    at_tail=st.booleans(),
    end=st.booleans(),
    data=st.binary(max_size=64),
    request_id=I64,
    limit=st.sampled_from([p.MAX_FRAME_BYTES, 40, 60]),
    view=st.booleans(),
)
def test_segment_read_shortcut_encodes_as_the_layout_walk(
    segment: str,
    offset: int,
    at_tail: bool,
    end: bool,
    data: bytes,
    request_id: int,
    limit: int,
    view: bool,
) -> None:
    payload: bytes | memoryview = memoryview(data) if view else data
    cmd = p.SegmentRead(segment, offset, at_tail, end, payload, request_id)
    assert _encoded(cmd, limit, walk=False) == _encoded(cmd, limit, walk=True)


def _read(decode: object, payload: bytes) -> object:
    try:
        return decode(p.CommandType.READ_SEGMENT, payload)  # type: ignore[operator]
    except RemoteProtocolError as exc:
        return ("error", str(exc))


@given(
    segment=NAMES.filter(lambda n: n != "\ud800"),
    offset=I64,
    suggested=I32,
    token=st.text(max_size=20),
    request_id=I64,
    cut=st.integers(0, 80),
    garbage=st.binary(min_size=1, max_size=4),
)
def test_read_segment_shortcut_decodes_as_the_layout_walk(
    segment: str,
    offset: int,
    suggested: int,
    token: str,
    request_id: int,
    cut: int,
    garbage: bytes,
) -> None:
    frame = p.encode_command(p.ReadSegment(segment, offset, suggested, token, request_id))
    full = frame[8:]
    spoiled = bytearray(full)
    spoiled[2:3] = b"\xff"  # an invalid UTF-8 byte in the name (when it has one)
    for payload in (full, full[: max(0, len(full) - cut)], full + garbage, bytes(spoiled)):
        assert _read(_fast.decode_payload, payload) == _read(codec.decode_payload, payload)
    expected = p.ReadSegment(segment, offset, suggested, token, request_id)
    assert _read(_fast.decode_payload, full) == expected


def test_every_way_to_send_refuses_what_send_refuses() -> None:
    writer = UUID(int=3)
    server = _server_with_writer(writer)
    for send in (
        lambda: server.send(p.Hello(p.WIRE_VERSION, p.OLDEST_COMPATIBLE_VERSION)),
        lambda: server.send_split(p.Hello(p.WIRE_VERSION, p.OLDEST_COMPATIBLE_VERSION), 0),
    ):
        with pytest.raises(LocalProtocolError, match="sent by the connection itself"):
            send()
    client = p.PravegaConnection(p.Role.CLIENT)  # a client sends no replies
    read = p.SegmentRead("s", 0, False, False, b"", 1)
    for send in (
        lambda: client.send(read),
        lambda: client.send_split(read, 10),
        lambda: client.send_data_appended(writer, 1, -1, 1, 1),
    ):
        with pytest.raises(LocalProtocolError, match="cannot send"):
            send()


def test_a_refused_ack_changes_nothing() -> None:
    writer = UUID(int=3)
    server = _server_with_writer(writer)
    server.send_data_appended(writer, 5, -1, 1, 100)
    server.data_to_send()
    with pytest.raises(LocalProtocolError, match="cannot encode"):
        server.send(p.DataAppended(writer, 10, 5, 2, 2**63))  # the offset is no i64
    assert server.writers[writer].last_acked == 5
    assert server.data_to_send() == b""
    server.send_data_appended(writer, 6, 5, 3, 100)  # 6 is still in order
    assert server.writers[writer].last_acked == 6
