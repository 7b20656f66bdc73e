"""Client and server LumberjackConnections talking in memory: windows, acks, errors."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from headrace.errors import FrameTooLarge, LocalProtocolError, RemoteProtocolError
from headrace.protocols.lumberjack import (
    Ack,
    Batch,
    Compressed,
    ConnectionClosed,
    ConnectionEvent,
    Data,
    Event,
    Frame,
    JsonData,
    Limits,
    LumberjackConnection,
    ProtocolVersion,
    Role,
    WindowSize,
    WindowState,
    encode_frame,
)
from headrace.protocols.lumberjack.states import transition_table_markdown
from tests._sansio import ConnectionPair

V1 = ProtocolVersion.V1
V2 = ProtocolVersion.V2
DOC = Path(__file__).parents[3] / "docs" / "protocols" / "lumberjack.md"


def u32(value: int) -> bytes:
    return struct.pack(">I", value)


def j(seq: int, message: str = "m") -> JsonData:
    return JsonData(seq, json.dumps({"message": message}).encode())


def d(seq: int, line: str = "m") -> Data:
    return Data(seq, ((b"line", line.encode()),))


def wire(version: ProtocolVersion, *frames: Frame) -> bytes:
    return b"".join(encode_frame(version, frame) for frame in frames)


def server_events(server: LumberjackConnection, data: bytes) -> list[ConnectionEvent]:
    server.receive_data(data)
    return list(server.events())


def server() -> LumberjackConnection:
    return LumberjackConnection(Role.SERVER)


def seqs(batch: ConnectionEvent) -> list[int]:
    assert isinstance(batch, Batch)
    return [event.seq for event in batch.events]


class Pair(ConnectionPair[LumberjackConnection]):
    """A client speaking ``version`` and a server."""

    def __init__(self, version: ProtocolVersion) -> None:
        client = LumberjackConnection(Role.CLIENT, version=version)
        super().__init__(client, LumberjackConnection(Role.SERVER))


# --------------------------------------------------------------------------- happy paths


def test_v2_window_round_trip() -> None:
    pair = Pair(V2)
    events = pair.to_server(WindowSize(2), Compressed((j(1, "hello"), j(2, "world"))))
    assert events == [
        Batch(
            V2,
            (Event(1, b'{"message": "hello"}'), Event(2, b'{"message": "world"}')),
            ack_seq=2,
        )
    ]
    assert pair.server.version is V2
    assert pair.server.awaiting_ack
    assert pair.client.unacked_windows == 1
    assert pair.to_client(Ack(2)) == [Ack(2)]
    assert pair.client.unacked_windows == 0
    assert not pair.server.awaiting_ack


def test_v1_window_round_trip_stores_pairs_as_json() -> None:
    pair = Pair(V1)
    events = pair.to_server(WindowSize(2), d(1, "hello"), d(2, "world"))
    assert events == [
        Batch(V1, (Event(1, b'{"line":"hello"}'), Event(2, b'{"line":"world"}')), ack_seq=2)
    ]
    assert pair.to_client(Ack(2)) == [Ack(2)]


def test_ack_bytes_are_one_six_byte_frame() -> None:
    srv = server()
    server_events(srv, wire(V1, WindowSize(1), d(5)))
    srv.send(Ack(5))
    assert srv.data_to_send() == b"1A" + u32(5)
    assert srv.data_to_send() == b""


def test_events_arrive_before_the_window_is_full() -> None:
    # Rule 2: store on arrival; the ack point comes with the last frame.
    srv = server()
    assert server_events(srv, wire(V2, WindowSize(3), j(1))) == [
        Batch(V2, (Event(1, j(1).payload),), None)
    ]
    assert server_events(srv, wire(V2, j(2))) == [Batch(V2, (Event(2, j(2).payload),), None)]
    assert server_events(srv, wire(V2, j(3))) == [Batch(V2, (Event(3, j(3).payload),), 3)]


def test_ack_is_the_last_seq_not_the_count() -> None:
    # pylogbeat keeps counting across batches: the second window is seq 3, 4.
    srv = server()
    server_events(srv, wire(V2, WindowSize(2), j(1), j(2)))
    srv.send(Ack(2))
    [batch] = server_events(srv, wire(V2, WindowSize(2), Compressed((j(3), j(4)))))
    assert isinstance(batch, Batch)
    assert batch.ack_seq == 4
    srv.send(Ack(4))
    assert srv.data_to_send() == b"2A" + u32(2) + b"2A" + u32(4)


def test_sequence_numbers_may_wrap_and_repeat() -> None:
    # logstash-forwarder wraps at u32; libbeat restarts at 1 for every window.
    srv = server()
    [batch] = server_events(srv, wire(V1, WindowSize(2), d(0xFFFFFFFF), d(0)))
    assert seqs(batch) == [0xFFFFFFFF, 0] and isinstance(batch, Batch) and batch.ack_seq == 0
    srv.send(Ack(0))
    [batch] = server_events(srv, wire(V1, WindowSize(2), d(1), d(2)))
    srv.send(Ack(2))
    [batch] = server_events(srv, wire(V1, WindowSize(2), d(1), d(2)))
    srv.send(Ack(2))
    assert not srv.awaiting_ack


def test_pipelined_windows_are_acked_in_order() -> None:
    # libbeat sends up to `pipelining` windows before the first ack (rule 3).
    srv = server()
    events = server_events(srv, wire(V2, WindowSize(1), j(1), WindowSize(1), j(1)))
    assert [e.ack_seq for e in events if isinstance(e, Batch)] == [1, 1]
    assert srv.pending_window_count == 2
    srv.send(Ack(1))
    srv.send(Ack(1))
    assert srv.pending_window_count == 0
    with pytest.raises(LocalProtocolError):
        srv.send(Ack(1))


def test_out_of_order_ack_is_refused() -> None:
    srv = server()
    server_events(srv, wire(V1, WindowSize(1), d(1), WindowSize(1), d(2)))
    with pytest.raises(LocalProtocolError, match="oldest pending ack point is 1"):
        srv.send(Ack(2))
    srv.send(Ack(1))
    srv.send(Ack(2))


def test_ack_of_an_undelivered_seq_is_refused() -> None:
    srv = server()
    server_events(srv, wire(V2, WindowSize(3), j(1), j(2)))
    with pytest.raises(LocalProtocolError, match="still open"):
        srv.send(Ack(3))
    with pytest.raises(LocalProtocolError, match="nothing has been received"):
        server().send(Ack(0))


def test_ack_with_nothing_pending_is_refused() -> None:
    srv = server()
    server_events(srv, wire(V2, WindowSize(1), j(1)))
    srv.send(Ack(1))
    with pytest.raises(LocalProtocolError, match="nothing received awaits"):
        srv.send(Ack(0))  # not even a keepalive


def test_w_once_client_gets_implicit_windows() -> None:
    # npm lumberjack-protocol / Ruby client: one W, then data forever (rule 4).
    srv = server()
    events = server_events(srv, wire(V1, WindowSize(2), *(d(n) for n in range(1, 6))))
    assert [(seqs(e), e.ack_seq) for e in events if isinstance(e, Batch)] == [
        ([1, 2], 2),
        ([3, 4], 4),
        ([5], None),
    ]
    assert srv.state is WindowState.IN_WINDOW
    assert server_events(srv, wire(V1, d(6))) == [Batch(V1, (Event(6, b'{"line":"m"}'),), 6)]
    assert srv.state.value == WindowState.WINDOW_FULL.value  # (a property: no narrowing)


def test_w_once_client_with_window_of_one() -> None:
    srv = server()
    events = server_events(srv, wire(V1, WindowSize(1), d(1), d(2), d(3)))
    assert [e.ack_seq for e in events if isinstance(e, Batch)] == [1, 2, 3]


def test_new_window_closes_an_incomplete_one() -> None:
    # Rule 5: ack the incomplete window with its last seq, then open the new one.
    srv = server()
    events = server_events(srv, wire(V2, WindowSize(3), j(1), WindowSize(1), j(2)))
    assert [(seqs(e), e.ack_seq) for e in events if isinstance(e, Batch)] == [
        ([1], 1),
        ([2], 2),
    ]


def test_window_with_no_data_before_the_next_w_is_dropped() -> None:
    srv = server()
    events = server_events(srv, wire(V2, WindowSize(3), WindowSize(1), j(1)))
    assert events == [Batch(V2, (Event(1, j(1).payload),), 1)]
    assert srv.pending_window_count == 1


def test_empty_window_first_gets_ack_zero() -> None:
    # pylogbeat send([]) on a fresh client: W=0 then an empty C (rule 6).
    pair = Pair(V2)
    events = pair.to_server(WindowSize(0), Compressed(()))
    assert events == [Batch(V2, (), ack_seq=0)]
    assert pair.to_client(Ack(0)) == [Ack(0)]
    assert pair.client.unacked_windows == 0


def test_empty_window_repeats_the_last_ack_behind_pending_windows() -> None:
    srv = server()
    events = server_events(srv, wire(V2, WindowSize(2), j(3), j(4), WindowSize(0), Compressed(())))
    assert [e.ack_seq for e in events if isinstance(e, Batch)] == [4, 4]
    with pytest.raises(LocalProtocolError):
        srv.send(Ack(5))
    srv.send(Ack(4))  # the window
    srv.send(Ack(4))  # the W=0 ack point
    assert not srv.awaiting_ack


def test_empty_window_during_an_incomplete_window() -> None:
    srv = server()
    events = server_events(srv, wire(V2, WindowSize(3), j(7), WindowSize(0)))
    assert [(seqs(e), e.ack_seq) for e in events if isinstance(e, Batch)] == [
        ([7], 7),
        ([], 7),
    ]
    assert srv.state is WindowState.AWAITING_WINDOW


# --------------------------------------------------------------------------- v2 keepalive, partial


def test_v2_keepalive_while_a_window_is_pending() -> None:
    pair = Pair(V2)
    pair.to_server(WindowSize(2), j(1), j(2))
    assert pair.to_client(Ack(0)) == [Ack(0)]
    assert pair.to_client(Ack(0)) == [Ack(0)]
    assert pair.client.unacked_windows == 1
    assert pair.to_client(Ack(2)) == [Ack(2)]


def test_v2_keepalive_while_waiting_for_the_window_data() -> None:
    srv = server()
    server_events(srv, wire(V2, WindowSize(2)))
    srv.send(Ack(0))
    assert srv.data_to_send() == bytes.fromhex("32 41 00 00 00 00")


def test_v2_partial_acks_in_order() -> None:
    srv = server()
    server_events(srv, wire(V2, WindowSize(4), j(1), j(2), j(3)))
    srv.send(Ack(1))
    srv.send(Ack(3))  # the open window's last delivered event
    with pytest.raises(LocalProtocolError):
        srv.send(Ack(2))  # behind the previous partial ack
    server_events(srv, wire(V2, j(4)))
    srv.send(Ack(4))
    assert not srv.awaiting_ack


def test_v2_partial_ack_only_for_the_oldest_window() -> None:
    srv = server()
    server_events(srv, wire(V2, WindowSize(1), j(1), WindowSize(2), j(5), j(6)))
    with pytest.raises(LocalProtocolError):
        srv.send(Ack(5))
    srv.send(Ack(1))
    srv.send(Ack(5))
    srv.send(Ack(6))


@pytest.mark.parametrize("seq", [0, 1])
def test_v1_has_no_keepalive_or_partial_ack(seq: int) -> None:
    srv = server()
    server_events(srv, wire(V1, WindowSize(2), d(1)))
    with pytest.raises(LocalProtocolError, match="v1 has no partial acks"):
        srv.send(Ack(seq))


# --------------------------------------------------------------------------- version rules


def test_version_is_fixed_by_the_first_byte() -> None:
    srv = server()
    srv.receive_data(b"1")
    assert list(srv.events()) == []
    srv.receive_data(b"W" + u32(1) + wire(V2, j(1)))
    with pytest.raises(RemoteProtocolError, match="V2 frame on a V1 connection"):
        list(srv.events())


def test_tls_on_a_plain_port_fails_on_the_first_byte() -> None:
    srv = server()
    srv.receive_data(b"\x16")
    with pytest.raises(RemoteProtocolError, match="TLS"):
        srv.events()


def test_server_pinned_to_a_version() -> None:
    srv = LumberjackConnection(Role.SERVER, version=V2)
    srv.receive_data(wire(V1, WindowSize(1)))
    with pytest.raises(RemoteProtocolError, match="speaks"):
        srv.events()


@pytest.mark.parametrize(
    ("version", "frame"),
    [(V1, j(1)), (V2, d(1)), (V2, Compressed((d(1),)))],
)
def test_data_frame_must_match_the_version(version: ProtocolVersion, frame: Frame) -> None:
    srv = server()
    srv.receive_data(wire(version, WindowSize(1), frame))
    with pytest.raises(RemoteProtocolError, match="connection"):
        srv.events()


def test_data_before_any_window_is_an_error() -> None:
    srv = server()
    srv.receive_data(wire(V2, j(1)))
    with pytest.raises(RemoteProtocolError, match="W must come first"):
        srv.events()


def test_data_after_an_empty_window_is_an_error() -> None:
    srv = server()
    srv.receive_data(wire(V2, WindowSize(1), j(1), WindowSize(0), j(2)))
    with pytest.raises(RemoteProtocolError, match="awaiting-window"):
        srv.events()


def test_client_may_not_send_an_ack() -> None:
    srv = server()
    srv.receive_data(wire(V2, Ack(1)))
    with pytest.raises(RemoteProtocolError, match="A \\(ack\\)"):
        srv.events()


def test_window_over_the_limit() -> None:
    srv = LumberjackConnection(Role.SERVER, limits=Limits(max_window_count=10))
    srv.receive_data(wire(V2, WindowSize(11)))
    with pytest.raises(RemoteProtocolError, match="limit of 10"):
        srv.events()


def test_too_many_pending_windows() -> None:
    srv = LumberjackConnection(Role.SERVER, limits=Limits(max_pending_windows=3))
    srv.receive_data(wire(V2, *[WindowSize(0)] * 3))
    assert len(list(srv.events())) == 3
    srv.receive_data(wire(V2, WindowSize(0)))
    with pytest.raises(RemoteProtocolError, match="more than 3 windows"):
        srv.events()


def test_receive_buffer_limit() -> None:
    limits = Limits(max_frame_bytes=64)
    srv = LumberjackConnection(Role.SERVER, limits=limits)
    with pytest.raises(FrameTooLarge):
        srv.receive_data(b"2" * (limits.max_buffered_bytes + 1))
    with pytest.raises(LocalProtocolError, match="already failed"):
        srv.receive_data(b"2")


# --------------------------------------------------------------------------- EOF and failure


def test_eof_at_a_frame_boundary() -> None:
    srv = server()
    server_events(srv, wire(V2, WindowSize(2), j(1)))
    srv.receive_data(b"")
    assert list(srv.events()) == [ConnectionClosed()]
    assert srv.state is WindowState.CLOSED
    assert list(srv.events()) == []
    srv.send(Ack(1))  # a partial ack after a half-close is still allowed
    with pytest.raises(LocalProtocolError, match="after EOF"):
        srv.receive_data(b"2")


def test_eof_with_events_in_the_same_call() -> None:
    srv = server()
    srv.receive_data(wire(V1, WindowSize(1), d(1)))
    srv.receive_data(b"")
    assert list(srv.events()) == [Batch(V1, (Event(1, b'{"line":"m"}'),), 1), ConnectionClosed()]
    srv.send(Ack(1))
    assert srv.data_to_send() == b"1A" + u32(1)


def test_eof_before_anything() -> None:
    srv = server()
    assert server_events(srv, b"") == [ConnectionClosed()]


def test_eof_part_way_through_a_frame() -> None:
    srv = server()
    srv.receive_data(wire(V2, WindowSize(1))[:4])
    srv.receive_data(b"")
    with pytest.raises(RemoteProtocolError, match="part-way"):
        srv.events()


def test_after_a_protocol_error_everything_is_refused() -> None:
    srv = server()
    srv.receive_data(wire(V2, WindowSize(1), j(1)) + b"2X")
    with pytest.raises(RemoteProtocolError):
        srv.events()
    with pytest.raises(LocalProtocolError):
        srv.events()
    with pytest.raises(LocalProtocolError):
        srv.send(Ack(1))  # the window's events were never handed out


def test_server_sends_only_acks() -> None:
    srv = server()
    server_events(srv, wire(V2, WindowSize(1)))
    with pytest.raises(LocalProtocolError, match="only sends acks"):
        srv.send(WindowSize(1))


def test_one_byte_at_a_time_gives_the_same_events() -> None:
    data = wire(V2, WindowSize(3), j(1), Compressed((j(2), j(3))), WindowSize(0))
    at_once = server_events(server(), data)
    srv = server()
    trickled: list[ConnectionEvent] = []
    for byte in data:
        trickled += server_events(srv, bytes([byte]))
    flatten = [(seqs(b), b.ack_seq) for b in at_once if isinstance(b, Batch)]
    assert flatten == [([1, 2, 3], 3), ([], 3)]
    assert [(seqs(b), b.ack_seq) for b in trickled if isinstance(b, Batch)] == [
        ([1], None),
        ([2, 3], 3),
        ([], 3),
    ]


# --------------------------------------------------------------------------- client role


def test_client_needs_a_version() -> None:
    with pytest.raises(LocalProtocolError, match="version"):
        LumberjackConnection(Role.CLIENT)


def test_client_data_needs_an_open_window() -> None:
    client = LumberjackConnection(Role.CLIENT, version=V2)
    with pytest.raises(LocalProtocolError, match="do not fit"):
        client.send(j(1))
    client.send(WindowSize(1))
    with pytest.raises(LocalProtocolError, match="do not fit"):
        client.send(Compressed((j(1), j(2))))
    with pytest.raises(LocalProtocolError, match="cannot send W"):
        client.send(WindowSize(1))
    client.send(j(1))
    assert client.state is WindowState.AWAITING_WINDOW
    assert client.data_to_send() == wire(V2, WindowSize(1), j(1))


def test_client_data_type_must_match_its_version() -> None:
    client = LumberjackConnection(Role.CLIENT, version=V1)
    client.send(WindowSize(1))
    with pytest.raises(LocalProtocolError, match="JsonData frame on a V1"):
        client.send(j(1))
    with pytest.raises(LocalProtocolError, match="does not send A"):
        client.send(Ack(1))


def test_client_frame_that_cannot_be_encoded_changes_nothing() -> None:
    client = LumberjackConnection(Role.CLIENT, version=V2)
    client.send(WindowSize(1))
    with pytest.raises(LocalProtocolError):
        client.send(JsonData(1, b"not json"))
    assert client.state is WindowState.IN_WINDOW
    client.send(j(1))


def test_client_refuses_non_ack_and_wrong_version_ack() -> None:
    client = LumberjackConnection(Role.CLIENT, version=V1)
    client.receive_data(wire(V2, Ack(0)))  # Logstash's hard-coded '2' keepalive
    with pytest.raises(RemoteProtocolError, match="version V2 on a V1"):
        client.events()
    client = LumberjackConnection(Role.CLIENT, version=V2)
    client.receive_data(wire(V2, WindowSize(1)))
    with pytest.raises(RemoteProtocolError, match="server sent a WindowSize"):
        client.events()


def test_client_sees_eof() -> None:
    client = LumberjackConnection(Role.CLIENT, version=V2)
    client.receive_data(wire(V2, Ack(0)))
    client.receive_data(b"")
    assert list(client.events()) == [Ack(0), ConnectionClosed()]
    assert client.state is WindowState.CLOSED


# --------------------------------------------------------------------------- docs


def test_docs_show_the_current_transition_tables() -> None:
    assert transition_table_markdown() in DOC.read_text(encoding="utf-8")
