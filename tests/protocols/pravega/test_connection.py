"""A client and a server PravegaConnection talking in memory (h11's ConnectionPair)."""

from __future__ import annotations

import struct
from uuid import UUID

import pytest

from headrace.errors import FrameTooLarge, LocalProtocolError, RemoteProtocolError
from headrace.protocols.pravega import (
    NULL_ATTRIBUTE_VALUE,
    OLDEST_COMPATIBLE_VERSION,
    WIRE_VERSION,
    AppendBlock,
    AppendBlockEnd,
    AppendData,
    AppendSetup,
    AuthTokenCheckFailed,
    ConditionalAppend,
    ConditionalBlockEnd,
    ConditionalCheckFailed,
    ConnectionClosed,
    ConnectionEvent,
    CreateTableSegment,
    CreateTransientSegment,
    DataAppended,
    Event,
    Hello,
    KeepAlive,
    MergeSegments,
    NoSuchSegment,
    Padding,
    PartialEvent,
    PravegaConnection,
    ReadSegment,
    ReadTableEntriesDelta,
    Role,
    SegmentCreated,
    SegmentRead,
    SegmentsMerged,
    SetupAppend,
    StreamState,
    TableEntries,
    TableEntriesDeltaRead,
    decode_events,
    encode_command,
    encode_event,
)
from headrace.protocols.pravega.states import CLIENT_STREAM, format_table
from tests._sansio import ConnectionPair

W1 = UUID(int=1)
W2 = UUID(int=2)
SEGMENT = "sc/st/0.#epoch.0"


class Pair(ConnectionPair[PravegaConnection]):
    """A client and a server connection, the hellos exchanged unless ``handshake`` is false."""

    def __init__(self, *, handshake: bool = True, **server_limits: int) -> None:
        client = PravegaConnection(Role.CLIENT)
        super().__init__(client, PravegaConnection(Role.SERVER, **server_limits))
        if handshake:
            assert self.to_server() == [Hello(WIRE_VERSION, OLDEST_COMPATIBLE_VERSION)]
            assert self.to_client() == [Hello(WIRE_VERSION, OLDEST_COMPATIBLE_VERSION)]

    def setup(self, writer: UUID = W1, segment: str = SEGMENT) -> None:
        assert self.to_server(SetupAppend(1, writer, segment)) == [SetupAppend(1, writer, segment)]
        setup = AppendSetup(1, segment, writer, NULL_ATTRIBUTE_VALUE)
        assert self.to_client(setup) == [setup]


def server_with(*frames: bytes) -> PravegaConnection:
    """A server that has received the given raw frames (after a Hello)."""
    server = PravegaConnection(Role.SERVER)
    server.receive_data(encode_command(Hello(15, 5)) + b"".join(frames))
    return server


def drain(conn: PravegaConnection) -> list[ConnectionEvent]:
    return list(conn.events())


# --------------------------------------------------------------------------- handshake


def test_client_sends_hello_on_creation() -> None:
    client = PravegaConnection(Role.CLIENT)
    assert client.data_to_send() == encode_command(Hello(17, 5))
    assert client.data_to_send() == b""
    assert client.our_state is StreamState.OPEN


def test_server_answers_hello_of_rust_client() -> None:
    server = PravegaConnection(Role.SERVER)
    server.receive_data(encode_command(Hello(15, 5)))
    assert drain(server) == [Hello(15, 5)]
    assert server.data_to_send() == encode_command(Hello(17, 5))
    assert server.peer_hello == Hello(15, 5)
    assert server.their_state is StreamState.OPEN


def test_server_hello_incompatible_client_gets_hello_hint() -> None:
    server = PravegaConnection(Role.SERVER)
    server.receive_data(encode_command(Hello(4, 1)))
    with pytest.raises(RemoteProtocolError, match="incompatible") as info:
        server.next_event()
    assert info.value.reply_hint == Hello(17, 5)  # Java answers its Hello, then closes
    assert server.data_to_send() == b""


def test_client_refuses_incompatible_server() -> None:
    pair = Pair(handshake=False)
    pair.to_server()
    pair.server.data_to_send()
    pair.client.receive_data(encode_command(Hello(4, 1)))
    with pytest.raises(RemoteProtocolError, match="versions"):
        pair.client.next_event()


def test_client_accepts_narrow_server_range_containing_its_version() -> None:
    client = PravegaConnection(Role.CLIENT, high_version=15)
    client.receive_data(encode_command(Hello(15, 15)))
    assert drain(client) == [Hello(15, 15)]


def test_server_refuses_request_before_hello() -> None:
    server = PravegaConnection(Role.SERVER)
    server.receive_data(encode_command(ReadSegment(SEGMENT, 0, 10, "", 1)))
    with pytest.raises(RemoteProtocolError, match="ReadSegment is not allowed"):
        server.next_event()


def test_server_refuses_second_hello() -> None:
    pair = Pair()
    pair.server.receive_data(encode_command(Hello(15, 5)))
    with pytest.raises(RemoteProtocolError, match="Hello"):
        pair.server.next_event()


def test_client_refuses_reply_before_server_hello() -> None:
    # The Rust client fails on any frame before the Hello reply.
    client = PravegaConnection(Role.CLIENT)
    client.receive_data(encode_command(SegmentCreated(1, "s")))
    with pytest.raises(RemoteProtocolError, match="not allowed from the server"):
        client.next_event()


def test_server_cannot_send_before_hello() -> None:
    server = PravegaConnection(Role.SERVER)
    with pytest.raises(LocalProtocolError):
        server.send(SegmentCreated(1, "s"))


def test_hello_is_never_sent_by_hand() -> None:
    pair = Pair()
    with pytest.raises(LocalProtocolError, match="itself"):
        pair.client.send(Hello(15, 5))
    with pytest.raises(LocalProtocolError, match="itself"):
        pair.server.send(Hello(17, 5))


def test_client_may_pipeline_requests_behind_its_hello() -> None:
    pair = Pair(handshake=False)
    pair.client.send(CreateTableSegment(1, "t"))
    assert pair.to_server() == [Hello(17, 5), CreateTableSegment(1, "t")]


# --------------------------------------------------------------------------- keep-alive


def test_server_echoes_keep_alive() -> None:
    pair = Pair()
    assert pair.to_server(KeepAlive()) == [KeepAlive()]
    assert pair.server.data_to_send() == encode_command(KeepAlive())


def test_client_receives_keep_alive_echo() -> None:
    pair = Pair()
    pair.to_server(KeepAlive())
    assert pair.to_client() == [KeepAlive()]


def test_server_never_sends_unsolicited_keep_alive() -> None:
    pair = Pair()
    with pytest.raises(LocalProtocolError):
        pair.server.send(KeepAlive())


# --------------------------------------------------------------------------- requests and replies


def test_read_segment_round_trip() -> None:
    pair = Pair()
    assert pair.to_server(ReadSegment(SEGMENT, 0, 8 << 20, "", 12)) == [
        ReadSegment(SEGMENT, 0, 8 << 20, "", 12)
    ]
    reply = SegmentRead(SEGMENT, 0, False, False, encode_event(b"ab"), 12)
    assert pair.to_client(reply) == [reply]


def test_table_delta_round_trip() -> None:
    pair = Pair()
    pair.to_server(ReadTableEntriesDelta(3, "t", "", 0, 10))
    reply = TableEntriesDeltaRead(3, "t", TableEntries(()), False, True, 0)
    assert pair.to_client(reply) == [reply]


def test_several_frames_in_one_read() -> None:
    pair = Pair()
    pair.client.send(CreateTableSegment(1, "a"))
    pair.client.send(CreateTableSegment(2, "b"))
    assert pair.to_server() == [CreateTableSegment(1, "a"), CreateTableSegment(2, "b")]


def test_frame_split_across_reads() -> None:
    pair = Pair()
    pair.client.send(ReadSegment(SEGMENT, 5, 10, "", 2))
    data = pair.client.data_to_send()
    for byte in data[:-1]:
        pair.server.receive_data(bytes([byte]))
        assert pair.server.next_event() is None
    pair.server.receive_data(data[-1:])
    assert pair.server.next_event() == ReadSegment(SEGMENT, 5, 10, "", 2)


def test_client_cannot_send_a_reply() -> None:
    pair = Pair()
    with pytest.raises(LocalProtocolError, match="SegmentCreated"):
        pair.client.send(SegmentCreated(1, "s"))


def test_server_cannot_send_a_request() -> None:
    pair = Pair()
    with pytest.raises(LocalProtocolError):
        pair.server.send(ReadSegment("s", 0, 1))


def test_server_refuses_a_reply_from_the_client() -> None:
    server = server_with(encode_command(SegmentCreated(1, "s")))
    with pytest.raises(RemoteProtocolError, match="SegmentCreated"):
        drain(server)


def test_client_refuses_a_request_from_the_server() -> None:
    pair = Pair()
    pair.client.receive_data(encode_command(ReadSegment("s", 0, 1)))
    with pytest.raises(RemoteProtocolError):
        pair.client.next_event()


def test_embedded_frames_alone_are_refused() -> None:
    for cmd in (Event(b"x"), PartialEvent(b"x"), Padding(3)):
        server = server_with(encode_command(cmd))
        with pytest.raises(RemoteProtocolError, match="not allowed"):
            drain(server)


def test_send_encoding_error_leaves_state_unchanged() -> None:
    pair = Pair()
    with pytest.raises(LocalProtocolError):
        pair.client.send(ReadSegment("x" * 70000, 0, 1))
    assert pair.client.data_to_send() == b""
    assert pair.to_server(KeepAlive()) == [KeepAlive()]


# --------------------------------------------------------------------------- appends: Rust form


def test_append_block_end_alone_becomes_append_data() -> None:
    pair = Pair()
    pair.setup()
    data = encode_event(b"ab") + encode_event(b"xyz")
    events = pair.to_server(AppendBlockEnd(W1, len(data), data, 2, 2, 7))
    assert events == [AppendData(W1, SEGMENT, data, 2, 2, 7)]
    assert pair.server.writers[W1].last_event_number == 2
    ack = DataAppended(W1, 2, NULL_ATTRIBUTE_VALUE, 7, 21)
    assert pair.to_client(ack) == [ack]


def test_append_without_setup_append_closes() -> None:
    pair = Pair()
    with pytest.raises(RemoteProtocolError, match="without an accepted SetupAppend") as info:
        pair.to_server(AppendBlockEnd(W1, 10, encode_event(b"ab"), 1, 1, 2))
    assert info.value.reply_hint is None


def test_setup_append_is_per_writer() -> None:
    pair = Pair()
    pair.setup(W1)
    with pytest.raises(RemoteProtocolError, match="without an accepted SetupAppend"):
        pair.to_server(AppendBlockEnd(W2, 10, encode_event(b"ab"), 1, 1, 2))


def test_two_writers_share_a_connection() -> None:
    pair = Pair()
    pair.setup(W1, "a")
    pair.setup(W2, "b")
    events = pair.to_server(
        AppendBlockEnd(W1, 0, b"1", 1, 1, 5), AppendBlockEnd(W2, 0, b"2", 1, 1, 6)
    )
    assert [(e.segment, e.data) for e in events if isinstance(e, AppendData)] == [
        ("a", b"1"),
        ("b", b"2"),
    ]


def test_last_event_number_may_repeat_but_not_go_back() -> None:
    pair = Pair()
    pair.setup()
    pair.to_server(AppendBlockEnd(W1, 0, b"a", 1, 5, 2))
    # type: ignore[union-attr]
    assert pair.to_server(AppendBlockEnd(W1, 0, b"b", 1, 5, 3))[0].last_event_number == 5
    with pytest.raises(RemoteProtocolError, match="goes back"):
        pair.to_server(AppendBlockEnd(W1, 0, b"c", 1, 4, 4))


def test_connection_error_is_sticky() -> None:
    pair = Pair()
    with pytest.raises(RemoteProtocolError):
        pair.to_server(AppendBlockEnd(W1, 0, b"a", 1, 5, 2))
    with pytest.raises(RemoteProtocolError):
        pair.server.next_event()
    with pytest.raises(LocalProtocolError, match="failed"):
        pair.server.send(SegmentCreated(1, "s"))


def test_append_needs_at_least_one_event() -> None:
    pair = Pair()
    pair.setup()
    with pytest.raises(RemoteProtocolError, match="0 events"):
        pair.to_server(AppendBlockEnd(W1, 0, b"", 0, 1, 2))


def test_setup_append_again_resets_the_session() -> None:
    pair = Pair()
    pair.setup()
    pair.to_server(AppendBlockEnd(W1, 0, b"a", 1, 5, 2))
    pair.setup()
    # type: ignore[union-attr]
    assert pair.to_server(AppendBlockEnd(W1, 0, b"a", 1, 1, 3))[0].last_event_number == 1


def test_acks_go_out_in_event_number_order() -> None:
    pair = Pair()
    pair.setup()
    pair.to_server(AppendBlockEnd(W1, 0, b"a", 1, 1, 2), AppendBlockEnd(W1, 0, b"b", 1, 2, 3))
    pair.server.send(DataAppended(W1, 2, NULL_ATTRIBUTE_VALUE, 3, 2))
    with pytest.raises(LocalProtocolError, match="order"):
        pair.server.send(DataAppended(W1, 1, NULL_ATTRIBUTE_VALUE, 2, 1))


def test_writer_limit_per_connection() -> None:
    pair = Pair(max_writers=2)
    pair.setup(W1, "a")
    pair.setup(W2, "a")
    pair.setup(W1, "b")  # same writer again: no new session
    assert len(pair.server.writers) == 2
    with pytest.raises(RemoteProtocolError, match="more than 2 writers"):
        pair.to_server(SetupAppend(4, UUID(int=3), "a"))


def test_a_refused_setup_append_opens_no_session() -> None:
    pair = Pair()
    pair.to_server(SetupAppend(1, W1, SEGMENT, "bad token"))
    refusal = AuthTokenCheckFailed(1, "", AuthTokenCheckFailed.TOKEN_CHECK_FAILED)
    assert pair.to_client(refusal) == [refusal]
    assert W1 not in pair.server.writers
    with pytest.raises(RemoteProtocolError, match="without an accepted SetupAppend"):
        pair.to_server(AppendBlockEnd(W1, 0, b"a", 1, 1, 2))


def test_an_append_before_the_setup_is_answered_closes() -> None:
    pair = Pair()
    with pytest.raises(RemoteProtocolError, match="without an accepted SetupAppend"):
        pair.to_server(SetupAppend(1, W1, SEGMENT), ConditionalAppend(W1, 1, 0, Event(b"z"), 2))


def test_setup_append_again_ends_the_session_until_answered() -> None:
    pair = Pair()
    pair.setup(W1, "a")
    assert pair.to_server(SetupAppend(2, W1, "b", "token for a only")) == [
        SetupAppend(2, W1, "b", "token for a only")
    ]
    assert W1 not in pair.server.writers  # not "a" any more, not "b" yet
    with pytest.raises(RemoteProtocolError, match="without an accepted SetupAppend"):
        pair.to_server(AppendBlockEnd(W1, 0, b"a", 1, 1, 3))


# --------------------------------------------------------------------------- appends: conditional


def test_conditional_block_end_carries_expected_offset() -> None:
    pair = Pair()
    pair.setup()
    events = pair.to_server(ConditionalBlockEnd(W1, 1, 0, b"hello", 22))
    assert events == [AppendData(W1, SEGMENT, b"hello", 1, 1, 22, expected_offset=0)]
    failed = ConditionalCheckFailed(W1, 1, 22)
    assert pair.to_client(failed) == [failed]


def test_conditional_append_stores_the_event_framing() -> None:
    pair = Pair()
    pair.setup()
    events = pair.to_server(ConditionalAppend(W1, 3, 100, Event(b"z"), 4))
    assert events == [AppendData(W1, SEGMENT, encode_event(b"z"), 1, 3, 4, expected_offset=100)]


def test_conditional_append_needs_setup_append() -> None:
    pair = Pair()
    with pytest.raises(RemoteProtocolError, match="without an accepted SetupAppend"):
        pair.to_server(ConditionalBlockEnd(W1, 1, 0, b"x", 2))


def test_large_event_flow() -> None:
    # pravega.md#large-events: transient segment, chunks as conditional appends
    # numbered from 0, merge.
    pair = Pair()
    parent = "sc/st/0.#epoch.0"
    transient = parent + "#transient." + "0" * 32 + "." + "1" * 32
    pair.to_server(CreateTransientSegment(1, W1, parent))
    assert pair.to_client(SegmentCreated(1, transient)) == [SegmentCreated(1, transient)]
    pair.setup(W1, transient)
    framed = encode_event(b"x" * 30)
    chunks = [framed[:16], framed[16:32], framed[32:]]
    offset = 0
    for number, chunk in enumerate(chunks):
        (event,) = pair.to_server(ConditionalBlockEnd(W1, number, offset, chunk, 10 + number))
        assert isinstance(event, AppendData)
        assert (event.segment, event.expected_offset, event.data) == (transient, offset, chunk)
        offset += len(chunk)
        pair.to_client(DataAppended(W1, number, number - 1, 10 + number, offset))
    assert pair.to_server(MergeSegments(20, parent, transient)) == [
        MergeSegments(20, parent, transient)
    ]
    merged = SegmentsMerged(20, parent, transient, offset)
    assert pair.to_client(merged) == [merged]


# --------------------------------------------------------------------------- appends: Java blocks


def block_with_partial(whole: list[bytes], partial: bytes) -> bytes:
    events = b"".join(encode_event(e) for e in whole)
    return events + encode_command(PartialEvent(partial))


def test_java_block_with_partial_event_is_joined() -> None:
    pair = Pair()
    pair.setup()
    second = encode_event(b"straddling event")
    block = block_with_partial([b"ab"], second[:5])
    assert pair.to_server(AppendBlock(W1, block)) == []  # held until its AppendBlockEnd
    assert pair.server.their_state.value == "IN_APPEND_BLOCK"
    (event,) = pair.to_server(AppendBlockEnd(W1, 10, second[5:], 2, 2, 9))
    assert isinstance(event, AppendData)
    assert decode_events(event.data) == [b"ab", b"straddling event"]
    assert (event.event_count, event.last_event_number, event.request_id) == (2, 2, 9)
    assert pair.server.their_state is StreamState.OPEN


def test_java_block_closed_with_padding() -> None:
    pair = Pair()
    pair.setup()
    block = encode_event(b"ab") + encode_command(Padding(6))
    events = pair.to_server(AppendBlock(W1, block), AppendBlockEnd(W1, 10, b"", 1, 1, 3))
    assert events == [AppendData(W1, SEGMENT, encode_event(b"ab"), 1, 1, 3)]


def test_java_block_of_whole_events_only() -> None:
    pair = Pair()
    pair.setup()
    block = encode_event(b"a") + encode_event(b"b")
    events = pair.to_server(AppendBlock(W1, block), AppendBlockEnd(W1, len(block), b"", 2, 2, 3))
    assert events == [AppendData(W1, SEGMENT, block, 2, 2, 3)]


def test_java_block_and_rust_form_give_the_same_event() -> None:
    data = encode_event(b"one") + encode_event(b"two")
    rust = Pair()
    rust.setup()
    java = Pair()
    java.setup()
    from_rust = rust.to_server(AppendBlockEnd(W1, len(data), data, 2, 2, 4))
    block = block_with_partial([b"one"], data[11:15])
    from_java = java.to_server(AppendBlock(W1, block), AppendBlockEnd(W1, 11, data[15:], 2, 2, 4))
    assert from_rust == from_java


def test_nothing_may_come_between_block_and_block_end() -> None:
    server = server_with(
        encode_command(SetupAppend(1, W1, SEGMENT)),
        encode_command(AppendBlock(W1, encode_event(b"a"))),
        encode_command(KeepAlive()),
    )
    assert server.next_event() == Hello(15, 5)
    assert server.next_event() == SetupAppend(1, W1, SEGMENT)
    server.send(AppendSetup(1, SEGMENT, W1, NULL_ATTRIBUTE_VALUE))
    with pytest.raises(RemoteProtocolError, match="KeepAlive is not allowed"):
        server.next_event()


def test_client_cannot_send_between_block_and_block_end() -> None:
    pair = Pair()
    pair.client.send(AppendBlock(W1, b""))
    with pytest.raises(LocalProtocolError):
        pair.client.send(KeepAlive())


def test_java_block_from_unknown_writer() -> None:
    pair = Pair()
    with pytest.raises(RemoteProtocolError, match="without an accepted SetupAppend"):
        pair.to_server(AppendBlock(W1, encode_event(b"a")))


def test_java_block_end_for_another_writer() -> None:
    pair = Pair()
    pair.setup(W1)
    pair.setup(W2)
    with pytest.raises(RemoteProtocolError, match="another writer"):
        pair.to_server(AppendBlock(W1, encode_event(b"a")), AppendBlockEnd(W2, 9, b"", 1, 1, 2))


@pytest.mark.parametrize(
    ("block", "whole", "end_data", "message"),
    [
        (encode_event(b"a"), 10, b"", "outside the block"),
        (encode_event(b"a"), -1, b"", "outside the block"),
        (encode_event(b"a") + b"\xff\xff", 9, b"", "inside a frame header"),
        (encode_event(b"a") + encode_command(Padding(2))[:-1], 9, b"", "not exactly one frame"),
        (encode_event(b"a") + encode_event(b"b"), 9, b"", "not PartialEvent or Padding"),
        (encode_event(b"a") + encode_command(Padding(2)), 9, b"x", "after a Padding"),
        (encode_event(b"a"), 9, b"x", "without a PartialEvent"),
    ],
)
def test_java_block_malformed(block: bytes, whole: int, end_data: bytes, message: str) -> None:
    pair = Pair()
    pair.setup()
    with pytest.raises(RemoteProtocolError, match=message):
        pair.to_server(AppendBlock(W1, block), AppendBlockEnd(W1, whole, end_data, 1, 1, 2))


# ------------------------------------------------------------------------ end of input and limits


def test_eof_gives_connection_closed_every_time() -> None:
    pair = Pair()
    pair.server.receive_data(b"")
    assert drain(pair.server) == [ConnectionClosed()]
    assert pair.server.next_event() == ConnectionClosed()
    assert pair.server.their_state is StreamState.CLOSED


def test_frames_before_eof_are_delivered_first() -> None:
    pair = Pair()
    pair.client.send(CreateTableSegment(1, "t"))
    pair.server.receive_data(pair.client.data_to_send())
    pair.server.receive_data(b"")
    assert drain(pair.server) == [CreateTableSegment(1, "t"), ConnectionClosed()]


def test_eof_inside_a_frame_is_remote_error() -> None:
    pair = Pair()
    pair.client.send(CreateTableSegment(1, "t"))
    pair.server.receive_data(pair.client.data_to_send()[:-1])
    pair.server.receive_data(b"")
    with pytest.raises(RemoteProtocolError, match="inside a frame"):
        pair.server.next_event()


def test_eof_inside_an_append_block_just_closes() -> None:
    pair = Pair()
    pair.setup()
    pair.to_server(AppendBlock(W1, encode_event(b"a")))
    pair.server.receive_data(b"")
    assert drain(pair.server) == [ConnectionClosed()]


def test_eof_before_hello() -> None:
    server = PravegaConnection(Role.SERVER)
    server.receive_data(b"")
    assert server.next_event() == ConnectionClosed()


def test_data_after_eof_is_local_error() -> None:
    server = PravegaConnection(Role.SERVER)
    server.receive_data(b"")
    with pytest.raises(LocalProtocolError):
        server.receive_data(b"x")


def test_buffered_bytes_limit() -> None:
    server = PravegaConnection(Role.SERVER, max_buffered_bytes=64)
    server.receive_data(bytes(60))
    with pytest.raises(FrameTooLarge):
        server.receive_data(bytes(8))
    with pytest.raises(FrameTooLarge):
        server.next_event()


def test_frame_limit_is_checked_on_the_header() -> None:
    server = PravegaConnection(Role.SERVER, max_frame_bytes=512)
    server.receive_data(encode_command(Hello(15, 5)) + struct.pack(">ii", 9, 1000))
    assert server.next_event() == Hello(15, 5)
    with pytest.raises(FrameTooLarge):
        server.next_event()


def test_unknown_type_code_is_remote_error() -> None:
    server = server_with(struct.pack(">ii", 6, 0))
    with pytest.raises(RemoteProtocolError, match="unknown command type code 6"):
        drain(server)


def test_no_such_segment_reply_to_setup_append() -> None:
    pair = Pair()
    pair.to_server(SetupAppend(1, W1, SEGMENT))
    reply = NoSuchSegment(1, SEGMENT, "", -1)
    assert pair.to_client(reply) == [reply]


def test_roles() -> None:
    pair = Pair()
    assert (pair.client.role, pair.server.role) == (Role.CLIENT, Role.SERVER)


def test_data_appended_for_a_writer_set_up_elsewhere_is_not_checked() -> None:
    # A server may acknowledge an append after the writer re-connected; the
    # ordering check only covers sessions of this connection.
    pair = Pair()
    ack = DataAppended(W2, 1, NULL_ATTRIBUTE_VALUE, 1, 1)
    assert pair.to_client(ack) == [ack]


def test_transition_tables_render_as_markdown() -> None:
    table = format_table(CLIENT_STREAM)
    assert table.splitlines()[0] == "| state | input | action | next state |"
    assert "| IN_APPEND_BLOCK | AppendBlockEnd |" in table
    assert len(table.splitlines()) == len(CLIENT_STREAM) + 2
