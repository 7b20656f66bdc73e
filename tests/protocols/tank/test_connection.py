"""TankConnection: a client and a server connection talking in memory."""

from __future__ import annotations

from pathlib import Path

import pytest

from headrace.errors import FrameTooLarge, LocalProtocolError, RemoteProtocolError
from headrace.protocols.tank import (
    FIRST_REQUEST_TIMEOUT_S,
    BundleMessage,
    ConnectionClosed,
    ConnectionState,
    Consume,
    ConsumeError,
    ConsumePartition,
    ConsumePartitionResult,
    ConsumeResponse,
    ConsumeTopic,
    ConsumeTopicResult,
    CreateTopic,
    CreateTopicResponse,
    CreateTopicResult,
    Event,
    Message,
    Ping,
    Produce,
    ProduceError,
    ProducePartition,
    ProducePartitionResult,
    ProduceResponse,
    ProduceTopic,
    ProduceTopicResult,
    ProduceWithSeqnum,
    Role,
    Status,
    StatusResponse,
    TankConnection,
    decode_chunk,
    encode,
    encode_bundle,
    encode_chunk_entry,
)
from headrace.protocols.tank.states import TRANSITIONS, transition_table_markdown
from tests._sansio import ConnectionPair

DOCS = Path(__file__).resolve().parents[3] / "docs" / "protocols" / "tank.md"


class Pair(ConnectionPair[TankConnection]):
    """A client and a server connection; the server's greeting is still queued."""

    def __init__(self) -> None:
        super().__init__(TankConnection(Role.CLIENT), TankConnection(Role.SERVER))


def state(connection: TankConnection) -> ConnectionState:
    """The state, read through a call so that mypy does not narrow it across calls."""
    return connection.state


def produce(request_id: int, topic: str = "logs", partition: int = 0) -> Produce:
    bundle = encode_bundle([BundleMessage(b"hello", 1)])
    return Produce(request_id, (ProduceTopic(topic, (ProducePartition(partition, bundle),)),))


def produce_ok(request_id: int, topic: str = "logs", partition: int = 0) -> ProduceResponse:
    result = ProducePartitionResult(partition)
    return ProduceResponse(request_id, (ProduceTopicResult(topic, (result,)),))


def consume(request_id: int) -> Consume:
    return Consume(request_id, (ConsumeTopic("logs", (ConsumePartition(0, 1, 4096),)),), 5000)


# --------------------------------------------------------------------------- lifecycle


def test_server_greets_with_a_ping_before_anything_else() -> None:
    server = TankConnection(Role.SERVER)
    assert server.role is Role.SERVER
    assert server.data_to_send() == bytes.fromhex("0300000000")
    assert server.data_to_send() == b""
    assert state(server) is ConnectionState.AWAITING_REQUEST
    assert FIRST_REQUEST_TIMEOUT_S == 16.0


def test_server_may_send_heartbeat_pings_until_eof() -> None:
    server = TankConnection(Role.SERVER)
    server.data_to_send()
    server.send(Ping())
    assert server.data_to_send() == bytes.fromhex("0300000000")
    assert state(server) is ConnectionState.AWAITING_REQUEST
    server.receive_data(b"")
    with pytest.raises(LocalProtocolError, match="cannot send Ping"):
        server.send(Ping())


def test_client_moves_to_open_on_the_greeting() -> None:
    pair = Pair()
    assert state(pair.client) is ConnectionState.AWAITING_GREETING
    pair.client.receive_data(pair.server.data_to_send())
    assert list(pair.client.events()) == [Ping()]
    assert state(pair.client) is ConnectionState.OPEN


def test_client_may_send_before_the_greeting() -> None:
    pair = Pair()
    greeting = pair.server.data_to_send()
    assert pair.to_server(produce(1)) == [produce(1)]
    pair.client.receive_data(greeting)
    assert pair.to_client(produce_ok(1)) == [Ping(), produce_ok(1)]


def test_response_before_the_greeting_is_a_protocol_error() -> None:
    client = TankConnection(Role.CLIENT)
    client.send(Status(1))
    with pytest.raises(RemoteProtocolError, match="receive response in state awaiting-greeting"):
        client.receive_data(encode(StatusResponse(1, 0, 0)))
    assert state(client) is ConnectionState.ERROR
    with pytest.raises(LocalProtocolError, match="state error"):
        client.receive_data(b"\x03")
    with pytest.raises(LocalProtocolError):
        client.send(Status(2))


def test_first_request_opens_the_server_and_client_pings_are_ignored() -> None:
    pair = Pair()
    pair.client.receive_data(pair.server.data_to_send())
    assert pair.to_server(Ping()) == [Ping()]
    assert state(pair.server) is ConnectionState.AWAITING_REQUEST
    assert pair.server.data_to_send() == b""  # no reply to a client ping
    pair.to_server(Status(1))
    assert state(pair.server) is ConnectionState.OPEN
    assert pair.to_server(Ping()) == [Ping()]


def test_later_pings_from_the_broker_are_tolerated() -> None:
    client = TankConnection(Role.CLIENT)
    client.receive_data(encode(Ping()) * 2)
    assert list(client.events()) == [Ping(), Ping()]


# --------------------------------------------------------------------------- exchanges


@pytest.fixture
def pair() -> Pair:
    pair = Pair()
    pair.client.receive_data(pair.server.data_to_send())
    assert list(pair.client.events()) == [Ping()]
    return pair


def test_produce_exchange(pair: Pair) -> None:
    assert pair.to_server(produce(1)) == [produce(1)]
    assert pair.server.in_flight_count == 1
    assert pair.client.in_flight_count == 1
    assert pair.to_client(produce_ok(1)) == [produce_ok(1)]
    assert pair.server.in_flight_count == pair.client.in_flight_count == 0


def test_produce_response_is_decoded_with_the_requests_names(pair: Pair) -> None:
    request = Produce(
        2,
        (
            ProduceTopic("nope", (ProducePartition(0, b"\x04\x00" + bytes(8) + b"\x00"),)),
            ProduceTopic("logs", (ProducePartition(3, b"\x04\x00" + bytes(8) + b"\x00"),)),
        ),
    )
    pair.to_server(request)
    response = ProduceResponse(
        2,
        (
            ProduceTopicResult("nope", (), ProduceError.UNKNOWN_TOPIC),
            ProduceTopicResult(
                "logs", (ProducePartitionResult(3, ProduceError.UNKNOWN_PARTITION),)
            ),
        ),
    )
    assert pair.to_client(response) == [response]


def test_produce_with_seqnum_is_answered_with_produce(pair: Pair) -> None:
    bundle = encode_bundle([BundleMessage(b"x", 1)])
    request = ProduceWithSeqnum(
        3, (ProduceTopic("logs", (ProducePartition(0, bundle, first_seq_num=50),)),)
    )
    assert pair.to_server(request) == [request]
    reply = pair.to_client(produce_ok(3))
    assert reply == [produce_ok(3)]
    assert encode(produce_ok(3))[0] == 0x01


def test_consume_exchange_and_chunk(pair: Pair) -> None:
    assert pair.to_server(consume(4)) == [consume(4)]
    chunk = encode_chunk_entry(encode_bundle([BundleMessage(b"a", 7), BundleMessage(b"b", 7)]))
    response = ConsumeResponse(
        4,
        (ConsumeTopicResult("logs", (ConsumePartitionResult(0, ConsumeError.OK, 1, 2, chunk),)),),
    )
    (event,) = pair.to_client(response)
    assert event == response
    assert isinstance(event, ConsumeResponse)
    topic = event.topics[0]
    assert isinstance(topic, ConsumeTopicResult)
    partition = topic.partitions[0]
    decoded = decode_chunk(partition.chunk, partition.base_seq_num, min_seq_num=1)
    assert [(m.seq_num, m.content) for m in decoded.messages] == [(1, b"a"), (2, b"b")]


def test_pipelined_requests_may_be_answered_out_of_order(pair: Pair) -> None:
    requests: list[Message] = [consume(1), produce(2), CreateTopic(3, "new", 4)]
    assert pair.to_server(*requests) == requests
    created = CreateTopicResponse(3, "new", CreateTopicResult.CREATED)
    empty = ConsumeResponse(
        1, (ConsumeTopicResult("logs", (ConsumePartitionResult(0, high_water_mark=2),)),)
    )
    assert pair.to_client(created, produce_ok(2)) == [created, produce_ok(2)]
    assert pair.to_client(empty) == [empty]
    assert pair.client.in_flight_count == 0


def test_frames_split_byte_by_byte_give_the_same_events(pair: Pair) -> None:
    pair.client.send(produce(1))
    pair.client.send(consume(2))
    data = pair.client.data_to_send()
    events: list[Event] = []
    for index in range(len(data)):
        pair.server.receive_data(data[index : index + 1])
        events += pair.server.events()
    assert events == [produce(1), consume(2)]


def test_many_frames_fed_at_once_beyond_the_buffer_limit() -> None:
    server = TankConnection(Role.SERVER, max_payload_bytes=16)
    data = b"".join(encode(Status(n)) for n in range(50))
    server.receive_data(data)
    assert list(server.events()) == [Status(n) for n in range(50)]


# --------------------------------------------------------------------------- request ids


def test_client_cannot_reuse_a_request_id_in_flight(pair: Pair) -> None:
    pair.client.send(Status(1))
    with pytest.raises(LocalProtocolError, match="already in flight"):
        pair.client.send(Status(1))
    pair.server.receive_data(pair.client.data_to_send())
    list(pair.server.events())
    pair.to_client(StatusResponse(1, 0, 0))
    pair.client.send(Status(1))  # free again


def test_abandoned_request_response_is_dropped(pair: Pair) -> None:
    pair.to_server(Status(1), Status(2))
    pair.client.abandon(1)
    with pytest.raises(LocalProtocolError, match="already in flight"):
        pair.client.send(Status(1))
    assert pair.to_client(StatusResponse(1, 0, 0), StatusResponse(2, 0, 0)) == [
        StatusResponse(2, 0, 0)
    ]
    assert pair.client.in_flight_count == 0
    pair.client.send(Status(1))  # free again
    with pytest.raises(LocalProtocolError, match="to abandon"):
        pair.client.abandon(7)
    with pytest.raises(LocalProtocolError, match="to abandon"):
        pair.server.abandon(1)


def test_response_to_no_request_is_a_protocol_error(pair: Pair) -> None:
    with pytest.raises(RemoteProtocolError, match="request id 9"):
        pair.client.receive_data(encode(StatusResponse(9, 0, 0)))


def test_response_of_another_type_is_a_protocol_error(pair: Pair) -> None:
    pair.client.send(Status(1))
    with pytest.raises(RemoteProtocolError, match="not waiting"):
        pair.client.receive_data(encode(CreateTopicResponse(1, "t", CreateTopicResult.CREATED)))


def test_server_answers_only_requests_it_received(pair: Pair) -> None:
    with pytest.raises(LocalProtocolError, match="cannot send response in state awaiting-request"):
        pair.server.send(StatusResponse(1, 0, 0))
    pair.to_server(Status(1))
    with pytest.raises(LocalProtocolError, match="awaits a response"):
        pair.server.send(StatusResponse(2, 0, 0))
    with pytest.raises(LocalProtocolError, match="awaits a response"):
        pair.server.send(CreateTopicResponse(1, "t", CreateTopicResult.CREATED))
    pair.server.send(StatusResponse(1, 0, 0))
    with pytest.raises(LocalProtocolError, match="awaits a response"):
        pair.server.send(StatusResponse(1, 0, 0))


def test_server_tolerates_a_request_id_used_twice() -> None:
    server = TankConnection(Role.SERVER)
    server.receive_data(encode(Status(1)) * 2)
    assert server.in_flight_count == 2
    server.send(StatusResponse(1, 0, 0))
    server.send(StatusResponse(1, 0, 0))
    assert server.in_flight_count == 0


def test_in_flight_limit_on_both_sides() -> None:
    client = TankConnection(Role.CLIENT, max_in_flight_requests=2)
    client.send(Status(1))
    client.send(Status(2))
    with pytest.raises(LocalProtocolError, match="in flight"):
        client.send(Status(3))
    server = TankConnection(Role.SERVER, max_in_flight_requests=2)
    with pytest.raises(RemoteProtocolError, match="in flight"):
        server.receive_data(client.data_to_send() + encode(Status(3)))
    assert list(server.events()) == [Status(1), Status(2)]  # decoded before the bad frame


# --------------------------------------------------------------------------- roles and misuse


def test_roles_send_only_their_side_of_the_protocol(pair: Pair) -> None:
    with pytest.raises(LocalProtocolError, match="client cannot send response"):
        pair.client.send(StatusResponse(1, 0, 0))
    with pytest.raises(LocalProtocolError, match="server cannot send request"):
        pair.server.send(Status(1))
    with pytest.raises(LocalProtocolError, match="not a TANK message"):
        pair.client.send(object())  # type: ignore[arg-type]


def test_unencodable_message_queues_nothing_and_tracks_nothing(pair: Pair) -> None:
    bad = Produce(1, (ProduceTopic("logs", (ProducePartition(0, b"x", first_seq_num=5),)),))
    with pytest.raises(LocalProtocolError):
        pair.client.send(bad)
    assert pair.client.data_to_send() == b""
    assert pair.client.in_flight_count == 0


@pytest.mark.parametrize("msg_id", [0x04, 0x09, 0x0D, 0xFF])
def test_server_rejects_unknown_ids_as_soon_as_the_header_arrives(msg_id: int) -> None:
    server = TankConnection(Role.SERVER)
    with pytest.raises(RemoteProtocolError, match=f"{msg_id:#04x}"):
        server.receive_data(bytes([msg_id]) + b"\x10\x00\x00\x00")
    assert state(server) is ConnectionState.ERROR


def test_client_rejects_produce_with_seqnum_id() -> None:
    client = TankConnection(Role.CLIENT)
    with pytest.raises(RemoteProtocolError, match="0x05"):
        client.receive_data(b"\x05\x00\x00\x00\x00")


def test_oversized_frame_is_rejected_before_its_payload_arrives() -> None:
    server = TankConnection(Role.SERVER, max_payload_bytes=1024)
    with pytest.raises(FrameTooLarge) as info:
        server.receive_data(b"\x01" + (1025).to_bytes(4, "little"))
    assert (info.value.limit_bytes, info.value.got_bytes) == (1024, 1025)


def test_malformed_payload_is_a_protocol_error() -> None:
    server = TankConnection(Role.SERVER)
    with pytest.raises(RemoteProtocolError, match="truncated"):
        server.receive_data(b"\x0a\x02\x00\x00\x00\x01\x00")


# --------------------------------------------------------------------------- EOF


def test_eof_gives_connection_closed(pair: Pair) -> None:
    pair.server.receive_data(b"")
    assert list(pair.server.events()) == [ConnectionClosed()]
    assert state(pair.server) is ConnectionState.PEER_CLOSED
    with pytest.raises(LocalProtocolError, match="peer-closed"):
        pair.server.receive_data(b"x")


def test_server_may_answer_after_the_client_half_closes(pair: Pair) -> None:
    pair.client.send(Status(1))
    pair.server.receive_data(pair.client.data_to_send())
    pair.server.receive_data(b"")
    assert list(pair.server.events()) == [Status(1), ConnectionClosed()]
    pair.server.send(StatusResponse(1, 0, 0))
    pair.client.receive_data(pair.server.data_to_send())
    assert list(pair.client.events()) == [StatusResponse(1, 0, 0)]


def test_client_can_do_nothing_after_eof(pair: Pair) -> None:
    pair.client.receive_data(b"")
    assert list(pair.client.events()) == [ConnectionClosed()]
    with pytest.raises(LocalProtocolError):
        pair.client.send(Status(1))


def test_eof_before_the_greeting() -> None:
    server = TankConnection(Role.SERVER)
    server.receive_data(b"")
    assert list(server.events()) == [ConnectionClosed()]
    client = TankConnection(Role.CLIENT)
    client.receive_data(b"")
    assert list(client.events()) == [ConnectionClosed()]


def test_eof_inside_a_frame_is_a_protocol_error(pair: Pair) -> None:
    pair.server.receive_data(encode(Status(1))[:3])
    with pytest.raises(RemoteProtocolError, match="inside a frame"):
        pair.server.receive_data(b"")
    assert state(pair.server) is ConnectionState.ERROR


# --------------------------------------------------------------------------- the table


def test_every_live_state_can_fail() -> None:
    for (role, state, event), (_, next_state) in TRANSITIONS.items():
        assert state is not ConnectionState.ERROR
        if event.name == "PROTOCOL_ERROR":
            assert next_state is ConnectionState.ERROR, (role, state)


def test_docs_show_the_generated_transition_table() -> None:
    assert transition_table_markdown() in DOCS.read_text(encoding="utf-8")


def test_send_split_refuses_what_send_refuses_and_settles_nothing(pair: Pair) -> None:
    response = ConsumeResponse(1, ())
    with pytest.raises(LocalProtocolError, match="cannot send response in state awaiting-request"):
        pair.server.send_split(response, {})
    pair.to_server(Status(1))
    with pytest.raises(LocalProtocolError, match="awaits a response"):
        pair.server.send_split(response, {})  # request 1 is a Status, not a Consume
    assert pair.server.in_flight_count == 1
    pair.to_server(consume(2))
    pair.server.send_split(ConsumeResponse(2, ()), {})
    assert pair.server.in_flight_count == 1
    with pytest.raises(LocalProtocolError, match="awaits a response"):
        pair.server.send_split(ConsumeResponse(2, ()), {})
