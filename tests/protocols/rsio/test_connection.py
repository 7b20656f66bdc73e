"""ReactiveConnection: subscriber and publisher ends talking in memory, bytes in, events out.

``Pair`` joins a client and a server connection (``tests/_sansio.py``).
Misbehaving peers are played by feeding hand-encoded frames to one
connection with ``feed``; what it answers is read back with ``replies``.
"""

from __future__ import annotations

import pytest

from headrace.errors import ConfigError, FrameTooLarge, LocalProtocolError, RemoteProtocolError
from headrace.protocols._buffer import ReceiveBuffer
from headrace.protocols.rsio import (
    DEFAULT_MAX_FRAME_BYTES,
    MAX_DEMAND,
    MIN_MAX_FRAME_BYTES,
    Cancel,
    ClientHello,
    ConnectionClosed,
    ConnectionState,
    Event,
    Goodbye,
    IllegalDemand,
    Message,
    OnComplete,
    OnError,
    OnNext,
    OnNextLastPart,
    OnNextPacked,
    OnNextPart,
    PublisherState,
    ReactiveConnection,
    Request,
    Role,
    ServerHello,
    Subscribe,
    Subscribed,
    SubscriberState,
    SubscriptionAborted,
    decode_message,
    encode_frame,
)
from headrace.protocols.rsio.codec import encode_varint, read_frame
from tests._sansio import ConnectionPair


class Pair(ConnectionPair[ReactiveConnection]):
    """A client and a server connection with hellos exchanged."""

    def __init__(self, **limits: int) -> None:
        client = ReactiveConnection(Role.CLIENT, **limits)
        super().__init__(client, ReactiveConnection(Role.SERVER, **limits))
        assert self.to_server() == [ClientHello(0)]
        assert self.to_client() == [ServerHello(0)]

    def subscribe(
        self, subscriber: int = 1, initial_demand: int = 0, element_size: int = 0
    ) -> None:
        """Client subscribes, server answers subscribed."""
        subscribe = Subscribe("logs", subscriber, initial_demand)
        assert self.to_server(subscribe) == [subscribe]
        subscribed = Subscribed(subscriber, element_size)
        assert self.to_client(subscribed) == [subscribed]


def feed(conn: ReactiveConnection, *messages: Message, element_size: int = 0) -> list[Event]:
    """Hand-encoded frames from a (possibly misbehaving) peer; the events they give."""
    conn.receive_data(b"".join(encode_frame(m, element_size) for m in messages))
    return list(conn.events())


def replies(conn: ReactiveConnection, element_size: int = 0) -> list[Message]:
    """Decode everything ``conn`` has queued for the peer."""
    buffer = ReceiveBuffer(DEFAULT_MAX_FRAME_BYTES + 10)
    buffer.feed(conn.data_to_send())
    out = []
    while (body := read_frame(buffer, DEFAULT_MAX_FRAME_BYTES)) is not None:
        out.append(decode_message(body, element_size))
    assert not buffer
    return out


def client_after_hello() -> ReactiveConnection:
    client = ReactiveConnection(Role.CLIENT)
    assert replies(client) == [ClientHello(0)]
    assert feed(client, ServerHello(0)) == [ServerHello(0)]
    return client


def server_after_hello() -> ReactiveConnection:
    server = ReactiveConnection(Role.SERVER)
    assert replies(server) == [ServerHello(0)]
    assert feed(server, ClientHello(0)) == [ClientHello(0)]
    return server


def subscribed_client(
    subscriber: int = 1, initial_demand: int = 0, element_size: int = 0
) -> ReactiveConnection:
    """A client whose subscription ``subscriber`` has been answered by a hand-played server."""
    client = client_after_hello()
    client.send(Subscribe("logs", subscriber, initial_demand))
    client.data_to_send()
    assert feed(client, Subscribed(subscriber, element_size)) == [
        Subscribed(subscriber, element_size)
    ]
    return client


def subscribed_server(subscriber: int = 1, initial_demand: int = 0) -> ReactiveConnection:
    """A server that has answered ``subscribe(subscriber)`` from a hand-played client."""
    server = server_after_hello()
    assert feed(server, Subscribe("logs", subscriber, initial_demand)) == [
        Subscribe("logs", subscriber, initial_demand)
    ]
    server.send(Subscribed(subscriber, 0))
    server.data_to_send()
    return server


def protocol_error(conn: ReactiveConnection) -> RemoteProtocolError:
    with pytest.raises(RemoteProtocolError) as info:
        list(conn.events())
    return info.value


# ----------------------------------- the worked example, the whole session (rsio.md#worked-example)


def test_worked_example_session_produces_the_spec_bytes() -> None:
    client = ReactiveConnection(Role.CLIENT)
    server = ReactiveConnection(Role.SERVER)
    client.send(Subscribe("logs", 1, 0))  # pipelined before the serverHello
    client_bytes = client.data_to_send()
    server_bytes = server.data_to_send()  # serverHello before the clientHello arrives

    server.receive_data(client_bytes)
    assert list(server.events()) == [ClientHello(0), Subscribe("logs", 1, 0)]
    server.send(Subscribed(1, 0))
    server_bytes += server.data_to_send()

    client.receive_data(server_bytes)
    assert list(client.events()) == [ServerHello(0), Subscribed(1, 0)]
    client.send(Request(1, 2))
    more = client.data_to_send()
    client_bytes += more

    server.receive_data(more)
    assert list(server.events()) == [Request(1, 2)]
    server.send(OnNext(1, b"hello"))
    server.send(OnNext(1, b"world"))
    server.send(OnComplete(1))
    tail = server.data_to_send()
    server_bytes += tail

    client.receive_data(tail)
    assert list(client.events()) == [OnNext(1, b"hello"), OnNext(1, b"world"), OnComplete(1)]
    client.send(Goodbye("done"))
    bye = client.data_to_send()
    client_bytes += bye

    server.receive_data(bye)
    assert list(server.events()) == [Goodbye("done")]
    reply = server.data_to_send()
    server_bytes += reply
    client.receive_data(reply)
    assert list(client.events()) == [Goodbye("")]

    assert client_bytes == bytes.fromhex("030100000804046c6f6773010003050102060304646f6e65")
    assert server_bytes == bytes.fromhex(
        "03020000030701000808010568656c6c6f08080105776f726c64020c01020300"
    )
    assert client.state is ConnectionState.CLOSED
    assert server.state is ConnectionState.CLOSED


# --------------------------------------------------------------------- hellos (rsio.md#rule-hellos)


def test_hello_is_queued_at_construction() -> None:
    assert ReactiveConnection(Role.CLIENT).data_to_send() == bytes.fromhex("03010000")
    assert ReactiveConnection(Role.SERVER).data_to_send() == bytes.fromhex("03020000")


def test_peer_hello_opens_the_connection() -> None:
    server = ReactiveConnection(Role.SERVER)
    states = [server.state]
    assert feed(server, ClientHello(0)) == [ClientHello(0)]
    states.append(server.state)
    assert states == [ConnectionState.AWAITING_HELLO, ConnectionState.OPEN]


def test_message_before_hello_is_protocol_error() -> None:
    server = ReactiveConnection(Role.SERVER)
    server.data_to_send()
    server.receive_data(encode_frame(Subscribe("logs", 1)))
    error = protocol_error(server)
    assert error.reply_hint == Goodbye("SUBSCRIBE before the peer's hello")
    assert server.state is ConnectionState.ERROR


def test_goodbye_before_hello_is_protocol_error() -> None:
    client = ReactiveConnection(Role.CLIENT)
    client.receive_data(encode_frame(Goodbye("")))
    assert "before the peer's hello" in str(protocol_error(client))


def test_second_hello_is_protocol_error() -> None:
    server = server_after_hello()
    server.receive_data(encode_frame(ClientHello(0)))
    assert protocol_error(server).reply_hint == Goodbye("second hello")


def test_hello_with_the_wrong_role_is_protocol_error() -> None:
    server = ReactiveConnection(Role.SERVER)
    server.receive_data(encode_frame(ServerHello(0)))
    assert "SERVER_HELLO received by the server" in str(protocol_error(server))


def test_unsupported_version_is_answered_with_goodbye() -> None:
    client = ReactiveConnection(Role.CLIENT)
    client.data_to_send()
    client.receive_data(encode_frame(ServerHello(1)))
    error = protocol_error(client)
    assert error.reply_hint == Goodbye("unsupported version")
    assert isinstance(error.reply_hint, Goodbye)
    client.send(error.reply_hint)
    assert replies(client) == [Goodbye("unsupported version")]
    assert client.state is ConnectionState.CLOSED


def test_peer_extensions_are_ignored() -> None:
    server = ReactiveConnection(Role.SERVER)
    assert feed(server, ClientHello(0, (5, 200))) == [ClientHello(0, (5, 200))]
    assert server.state is ConnectionState.OPEN


def test_application_cannot_send_a_hello() -> None:
    with pytest.raises(LocalProtocolError, match="its own hello"):
        ReactiveConnection(Role.CLIENT).send(ClientHello(0))


def test_subscriber_may_pipeline_before_the_peer_hello() -> None:
    client = ReactiveConnection(Role.CLIENT)
    client.data_to_send()
    client.send(Subscribe("logs", 1, 4))
    client.send(Request(1, 4))
    assert replies(client) == [Subscribe("logs", 1, 4), Request(1, 4)]
    assert client.state is ConnectionState.AWAITING_HELLO


# --------------------------------------------------------------------------- demand, publisher side


def test_initial_demand_allows_that_many_on_next() -> None:
    pair = Pair()
    pair.subscribe(initial_demand=2)
    assert pair.server.publication_demand(1) == 2
    pair.server.send(OnNext(1, b"a"))
    pair.server.send(OnNext(1, b"b"))
    with pytest.raises(LocalProtocolError, match="exceeds the outstanding demand 0"):
        pair.server.send(OnNext(1, b"c"))
    assert pair.to_client() == [OnNext(1, b"a"), OnNext(1, b"b")]


def test_on_next_beyond_demand_is_refused_and_changes_nothing() -> None:
    server = subscribed_server()
    with pytest.raises(LocalProtocolError):
        server.send(OnNext(1, b"x"))
    assert server.data_to_send() == b""
    assert server.publication_demand(1) == 0
    assert server.publication_state(1) is PublisherState.ACTIVE


def test_requests_add_up() -> None:
    server = subscribed_server(initial_demand=1)
    assert feed(server, Request(1, 2), Request(1, 3)) == [Request(1, 2), Request(1, 3)]
    assert server.publication_demand(1) == 6


def test_demand_saturates_at_unbounded() -> None:
    server = subscribed_server(initial_demand=MAX_DEMAND - 1)
    assert feed(server, Request(1, 5)) == [Request(1, 5)]
    assert server.publication_demand(1) == MAX_DEMAND


def test_unbounded_demand_is_not_used_up() -> None:
    server = subscribed_server()
    feed(server, Request(1, MAX_DEMAND))
    for _ in range(3):
        server.send(OnNext(1, b"x"))
    assert server.publication_demand(1) == MAX_DEMAND
    feed(server, Request(1, MAX_DEMAND))  # adding to unbounded stays unbounded
    assert server.publication_demand(1) == MAX_DEMAND


def test_bounded_demand_is_used_up_one_per_on_next() -> None:
    server = subscribed_server(initial_demand=3)
    server.send(OnNext(1, b"x"))
    assert server.publication_demand(1) == 2


def test_request_zero_is_answered_with_illegal_demand() -> None:
    server = subscribed_server()
    assert feed(server, Request(1, 0)) == [IllegalDemand(1, 0)]
    assert replies(server) == [OnError(1, "illegal demand")]
    assert server.publication_state(1) is PublisherState.CLOSED


def test_request_above_long_max_is_answered_with_illegal_demand() -> None:
    server = subscribed_server()
    assert feed(server, Request(1, MAX_DEMAND + 1)) == [IllegalDemand(1, MAX_DEMAND + 1)]
    assert replies(server) == [OnError(1, "illegal demand")]


def test_illegal_demand_before_subscribed_sends_subscribed_first() -> None:
    server = server_after_hello()
    assert feed(server, Subscribe("logs", 1), Request(1, 0)) == [
        Subscribe("logs", 1),
        IllegalDemand(1, 0),
    ]
    assert replies(server) == [Subscribed(1, 0), OnError(1, "illegal demand")]
    with pytest.raises(LocalProtocolError):
        server.send(Subscribed(1, 0))  # too late: the subscription is gone


def test_illegal_demand_while_sending_parts_ends_the_element() -> None:
    server = subscribed_server(initial_demand=1)
    server.send(OnNextPart(1, 0, b"he"))
    server.data_to_send()
    assert feed(server, Request(1, 0)) == [IllegalDemand(1, 0)]
    assert replies(server) == [OnError(1, "illegal demand")]


def test_illegal_initial_demand_is_rejected_without_an_event() -> None:
    server = server_after_hello()
    assert feed(server, Subscribe("logs", 1, MAX_DEMAND + 1)) == []
    assert replies(server) == [Subscribed(1, 0), OnError(1, "illegal demand")]
    assert server.publication_state(1) is PublisherState.CLOSED


def test_request_before_subscribed_is_accumulated() -> None:
    server = server_after_hello()
    assert feed(server, Subscribe("logs", 1), Request(1, 2)) == [
        Subscribe("logs", 1),
        Request(1, 2),
    ]
    assert server.publication_demand(1) == 2
    server.send(Subscribed(1, 0))
    server.send(OnNext(1, b"x"))


def test_on_next_packed_uses_count_demand() -> None:
    pair = Pair()
    pair.subscribe(initial_demand=3, element_size=2)
    with pytest.raises(LocalProtocolError, match="outstanding demand 3"):
        pair.server.send(OnNextPacked(1, 4, b"\x00" * 8))
    pair.server.send(OnNextPacked(1, 3, b"aabbcc"))
    assert pair.server.publication_demand(1) == 0
    assert pair.to_client() == [OnNextPacked(1, 3, b"aabbcc")]
    assert pair.client.subscription_demand(1) == 0


def test_on_next_packed_needs_fixed_size() -> None:
    server = subscribed_server(initial_demand=2)
    with pytest.raises(LocalProtocolError, match="elementSize > 0"):
        server.send(OnNextPacked(1, 1, b"a"))


# -------------------------------------------------------------------------- demand, subscriber side


def test_on_next_beyond_demand_aborts_the_subscription() -> None:
    client = subscribed_client(initial_demand=1)
    assert feed(client, OnNext(1, b"a"), OnNext(1, b"b")) == [
        OnNext(1, b"a"),
        SubscriptionAborted(1, "1 element(s) beyond demand 0"),
    ]
    assert replies(client) == [Cancel(1)]
    assert client.subscription_state(1) is SubscriberState.CLOSED


def test_on_next_packed_beyond_demand_aborts_the_subscription() -> None:
    client = subscribed_client(initial_demand=2, element_size=1)
    events = feed(client, OnNextPacked(1, 3, b"abc"), element_size=1)
    assert events == [SubscriptionAborted(1, "3 element(s) beyond demand 2")]
    assert replies(client) == [Cancel(1)]


def test_subscriber_tracks_its_outstanding_demand() -> None:
    client = subscribed_client(initial_demand=2)
    client.send(Request(1, 3))
    feed(client, OnNext(1, b"a"))
    assert client.subscription_demand(1) == 4


def test_request_of_zero_is_refused_locally() -> None:
    client = subscribed_client()
    client.data_to_send()
    for demand in (0, -1, MAX_DEMAND + 1):
        with pytest.raises(LocalProtocolError, match="demand must be"):
            client.send(Request(1, demand))
    assert client.data_to_send() == b""
    assert client.subscription_demand(1) == 0


def test_illegal_initial_demand_is_refused_locally() -> None:
    client = client_after_hello()
    with pytest.raises(LocalProtocolError, match="initialDemand"):
        client.send(Subscribe("logs", 1, -1))
    assert client.subscription_state(1) is SubscriberState.CLOSED


def test_request_after_cancel_is_a_no_op() -> None:
    client = subscribed_client()
    client.send(Cancel(1))
    assert replies(client) == [Cancel(1)]
    client.send(Request(1, 5))  # Reactive Streams §3.6
    client.send(Cancel(1))  # Reactive Streams §3.7
    assert client.data_to_send() == b""


def test_request_after_on_complete_is_a_no_op() -> None:
    client = subscribed_client(initial_demand=1)
    feed(client, OnComplete(1))
    client.send(Request(1, 1))
    assert client.data_to_send() == b""


def test_request_after_cancel_is_ignored_by_the_publisher() -> None:
    server = subscribed_server()
    assert feed(server, Cancel(1), Request(1, 5), Cancel(1)) == [Cancel(1)]
    assert server.data_to_send() == b""


# --------------------------------------------------------- rules 3, 6, 7 (rsio.md#connection-rules)


def test_subscribed_is_required_before_on_next() -> None:
    server = server_after_hello()
    feed(server, Subscribe("logs", 1, 5))
    for message in (OnNext(1, b"x"), OnComplete(1), OnError(1, "no")):
        with pytest.raises(LocalProtocolError, match="subscribe received"):
            server.send(message)


def test_publisher_messages_before_subscribed_are_dropped() -> None:
    client = client_after_hello()
    client.send(Subscribe("logs", 1, 1))
    # Leftovers of an earlier use of Id 1, then the real answer.
    events = feed(client, OnNext(1, b"old"), OnComplete(1), Subscribed(1, 0), OnNext(1, b"new"))
    assert events == [Subscribed(1, 0), OnNext(1, b"new")]


def test_id_reuse_after_cancel_drops_in_flight_messages() -> None:
    pair = Pair()
    pair.subscribe(initial_demand=5)
    pair.server.send(OnNext(1, b"old-1"))
    pair.client.send(Cancel(1))
    pair.client.send(Subscribe("logs", 1, 1))  # reused at once
    pair.server.send(OnNext(1, b"old-2"))
    assert pair.to_server() == [Cancel(1), Subscribe("logs", 1, 1)]
    pair.server.send(Subscribed(1, 0))
    pair.server.send(OnNext(1, b"new"))
    assert pair.to_client() == [Subscribed(1, 0), OnNext(1, b"new")]


def test_cancel_before_subscribed_keeps_the_id_until_subscribed_arrives() -> None:
    client = client_after_hello()
    client.send(Subscribe("logs", 1, 1))
    client.send(Cancel(1))
    assert client.subscription_state(1) is SubscriberState.CANCELLED
    with pytest.raises(LocalProtocolError, match="in use"):
        client.send(Subscribe("logs", 1))
    assert feed(client, Subscribed(1, 0), OnNext(1, b"late")) == []
    assert client.subscription_state(1) is SubscriberState.CLOSED
    client.send(Subscribe("logs", 1))  # free again


def test_subscribe_on_an_id_in_use_is_refused() -> None:
    client = subscribed_client()
    with pytest.raises(LocalProtocolError, match="in use"):
        client.send(Subscribe("other", 1))


def test_duplicate_live_subscriber_id_is_protocol_error() -> None:
    server = subscribed_server()
    server.receive_data(encode_frame(Subscribe("logs", 1)))
    assert protocol_error(server).reply_hint == Goodbye("duplicate subscriber id")


def test_peer_may_reuse_id_after_on_complete() -> None:
    server = subscribed_server(initial_demand=1)
    server.send(OnComplete(1))
    assert feed(server, Subscribe("logs", 1)) == [Subscribe("logs", 1)]


def test_nothing_may_follow_a_terminal_signal() -> None:
    server = subscribed_server(initial_demand=2)
    server.send(OnError(1, "gone"))
    with pytest.raises(LocalProtocolError, match="closed"):
        server.send(OnNext(1, b"x"))
    with pytest.raises(LocalProtocolError):
        server.send(OnComplete(1))


def test_sending_after_the_peer_cancelled_is_refused() -> None:
    server = subscribed_server(initial_demand=2)
    assert feed(server, Cancel(1)) == [Cancel(1)]
    with pytest.raises(LocalProtocolError):
        server.send(OnNext(1, b"x"))


def test_cancel_before_subscribed_is_delivered_to_the_publisher() -> None:
    server = server_after_hello()
    assert feed(server, Subscribe("logs", 1), Cancel(1)) == [Subscribe("logs", 1), Cancel(1)]
    assert server.publication_state(1) is PublisherState.CLOSED


def test_cancel_before_subscribed_gets_the_subscribed_still_owed() -> None:
    # Both frames in one read: the publisher's application only sees the
    # Subscribe after the cancel closed it, and could not answer any more.
    server = server_after_hello()
    server.data_to_send()
    assert feed(server, Subscribe("logs", 1), Cancel(1)) == [Subscribe("logs", 1), Cancel(1)]
    assert server.data_to_send() == encode_frame(Subscribed(1, 0))
    with pytest.raises(LocalProtocolError):
        server.send(Subscribed(1, 0))
    # The subscriber's Id is free once it arrives.
    client = client_after_hello()
    client.send(Subscribe("logs", 1))
    client.send(Cancel(1))
    assert feed(client, Subscribed(1, 0)) == []
    assert client.subscription_state(1) is SubscriberState.CLOSED


def test_messages_for_unknown_ids_are_ignored() -> None:
    client = subscribed_client()
    assert feed(client, OnNext(9, b"x"), OnComplete(9), Subscribed(9, 0)) == []
    server = subscribed_server()
    assert feed(server, Request(9, 1), Cancel(9)) == []
    assert client.data_to_send() == server.data_to_send() == b""


def test_unknown_fixed_size_frames_are_dropped_without_decoding() -> None:
    client = subscribed_client()
    # onNext for an Id we no longer hold, laid out for a 4-byte elementSize.
    assert feed(client, OnNext(7, b"\x00\x00\x00\x01"), element_size=4) == []


def test_duplicate_subscribed_aborts_the_subscription() -> None:
    client = subscribed_client()
    assert feed(client, Subscribed(1, 0)) == [
        SubscriptionAborted(1, "SUBSCRIBED while active"),
    ]
    assert replies(client) == [Cancel(1)]


def test_fixed_size_elements_are_decoded_with_the_subscribed_size() -> None:
    pair = Pair()
    pair.subscribe(initial_demand=1, element_size=4)
    with pytest.raises(LocalProtocolError, match="elementSize 4"):
        pair.server.send(OnNext(1, b"abc"))
    pair.server.send(OnNext(1, b"abcd"))
    assert pair.to_client() == [OnNext(1, b"abcd")]


def test_rejected_publisher_is_subscribed_then_on_error() -> None:
    pair = Pair()
    pair.client.send(Subscribe("nope", 1))
    pair.to_server()
    pair.server.send(Subscribed(1, 0))
    pair.server.send(OnError(1, "no such stream"))
    assert pair.to_client() == [Subscribed(1, 0), OnError(1, "no such stream")]
    assert pair.client.subscription_state(1) is SubscriberState.CLOSED


def test_too_many_subscriptions_are_rejected() -> None:
    server = ReactiveConnection(Role.SERVER, max_publications=2)
    server.data_to_send()
    events = feed(server, ClientHello(0), Subscribe("a", 1), Subscribe("b", 2), Subscribe("c", 3))
    assert events == [ClientHello(0), Subscribe("a", 1), Subscribe("b", 2)]
    assert replies(server) == [Subscribed(3, 0), OnError(3, "too many subscriptions")]


# --------------------------------------------------------------------------- multiple subscriptions


def test_subscriptions_have_independent_demand() -> None:
    pair = Pair()
    pair.subscribe(1, initial_demand=1)
    pair.subscribe(2, initial_demand=2)
    pair.server.send(OnNext(2, b"b1"))
    pair.server.send(OnNext(1, b"a1"))
    pair.server.send(OnNext(2, b"b2"))
    with pytest.raises(LocalProtocolError):
        pair.server.send(OnNext(1, b"a2"))
    pair.server.send(OnComplete(2))
    assert pair.to_client() == [OnNext(2, b"b1"), OnNext(1, b"a1"), OnNext(2, b"b2"), OnComplete(2)]
    assert pair.client.subscription_state(1) is SubscriberState.ACTIVE
    assert pair.client.subscription_state(2) is SubscriberState.CLOSED


def test_both_sides_may_subscribe_with_the_same_id() -> None:
    pair = Pair()
    pair.subscribe(1, initial_demand=1)  # client -> server, Id 1 in the client's namespace
    pair.server.send(Subscribe("metrics", 1, 1))  # server -> client, Id 1 in the server's
    assert pair.to_client() == [Subscribe("metrics", 1, 1)]
    pair.client.send(Subscribed(1, 0))
    pair.client.send(OnNext(1, b"to-server"))
    pair.server.send(OnNext(1, b"to-client"))
    assert pair.to_server() == [Subscribed(1, 0), OnNext(1, b"to-server")]
    assert pair.to_client() == [OnNext(1, b"to-client")]
    assert pair.server.subscription_state(1) is SubscriberState.ACTIVE
    assert pair.server.publication_state(1) is PublisherState.ACTIVE


# ---------------------------------------------------------- split elements (rsio.md#split-elements)


def test_split_element_is_delivered_as_one_on_next() -> None:
    pair = Pair()
    pair.subscribe(initial_demand=1)
    pair.server.send(OnNextPart(1, 7, b"hel"))
    assert pair.server.publication_demand(1) == 0  # taken at the first part
    assert pair.server.publication_state(1) is PublisherState.SENDING_PARTS
    pair.server.send(OnNextPart(1, 7, b""))  # parts may be empty
    pair.server.send(OnNextLastPart(1, 7, b"lo"))
    assert pair.to_client() == [OnNext(1, b"hello")]
    assert pair.client.subscription_demand(1) == 0


def test_split_element_needs_demand() -> None:
    server = subscribed_server()
    with pytest.raises(LocalProtocolError, match="outstanding demand 0"):
        server.send(OnNextPart(1, 0, b"x"))
    client = subscribed_client()
    assert feed(client, OnNextPart(1, 0, b"x")) == [
        SubscriptionAborted(1, "split element beyond demand 0")
    ]


def test_split_element_must_finish_before_anything_else() -> None:
    server = subscribed_server(initial_demand=5)
    server.send(OnNextPart(1, 0, b"x"))
    for message in (OnNext(1, b"y"), OnComplete(1), OnNextPart(1, 1, b"z")):
        with pytest.raises(LocalProtocolError):
            server.send(message)
    server.send(OnNextLastPart(1, 0, b"x"))
    server.send(OnNext(1, b"y"))


def test_on_error_may_interrupt_a_split_element() -> None:
    pair = Pair()
    pair.subscribe(initial_demand=1)
    pair.server.send(OnNextPart(1, 0, b"part"))
    pair.server.send(OnError(1, "store failed"))
    assert pair.to_client() == [OnError(1, "store failed")]


def test_lone_last_part_is_refused() -> None:
    server = subscribed_server(initial_demand=1)
    with pytest.raises(LocalProtocolError):
        server.send(OnNextLastPart(1, 0, b"x"))
    client = subscribed_client(initial_demand=1)
    assert feed(client, OnNextLastPart(1, 0, b"x")) == [
        SubscriptionAborted(1, "ON_NEXT_LAST_PART while active")
    ]


@pytest.mark.parametrize(
    ("interloper", "reason"),
    [
        (OnNextPart(1, 8, b"?"), "split element 7 interrupted by element 8"),
        (OnNextLastPart(1, 8, b"?"), "split element 7 interrupted by element 8"),
        (OnNext(1, b"?"), "ON_NEXT while receiving parts"),
        (OnComplete(1), "ON_COMPLETE while receiving parts"),
        (Subscribed(1, 0), "SUBSCRIBED while receiving parts"),
    ],
)
def test_interrupted_split_element_aborts_the_subscription(
    interloper: Message, reason: str
) -> None:
    client = subscribed_client(initial_demand=5)
    assert feed(client, OnNextPart(1, 7, b"he"), interloper) == [SubscriptionAborted(1, reason)]
    assert replies(client) == [Cancel(1)]


def test_split_element_over_the_size_limit_aborts_the_subscription() -> None:
    client = ReactiveConnection(Role.CLIENT, max_element_bytes=4)
    feed(client, ServerHello(0))
    client.send(Subscribe("logs", 1, 1))
    client.data_to_send()
    events = feed(client, Subscribed(1, 0), OnNextPart(1, 0, b"abc"), OnNextPart(1, 0, b"de"))
    assert events == [Subscribed(1, 0), SubscriptionAborted(1, "split element over 4 bytes")]
    assert replies(client) == [Cancel(1)]


def test_split_element_at_the_size_limit_is_delivered() -> None:
    client = ReactiveConnection(Role.CLIENT, max_element_bytes=4)
    feed(client, ServerHello(0))
    client.send(Subscribe("logs", 1, 1))
    events = feed(client, Subscribed(1, 0), OnNextPart(1, 0, b"ab"), OnNextLastPart(1, 0, b"cd"))
    assert events == [Subscribed(1, 0), OnNext(1, b"abcd")]


def test_split_fixed_size_element_must_join_to_element_size() -> None:
    pair = Pair()
    pair.subscribe(initial_demand=2, element_size=4)
    pair.server.send(OnNextPart(1, 0, b"ab"))
    with pytest.raises(LocalProtocolError, match="elementSize 4"):
        pair.server.send(OnNextLastPart(1, 0, b"c"))
    with pytest.raises(LocalProtocolError, match="elementSize 4"):
        pair.server.send(OnNextPart(1, 0, b"cde"))
    pair.server.send(OnNextLastPart(1, 0, b"cd"))
    assert pair.to_client() == [OnNext(1, b"abcd")]


@pytest.mark.parametrize(
    ("parts", "reason"),
    [
        ([OnNextPart(1, 0, b"ab"), OnNextLastPart(1, 0, b"c")], "shorter than elementSize 4"),
        ([OnNextPart(1, 0, b"abc"), OnNextPart(1, 0, b"de")], "longer than elementSize 4"),
    ],
)
def test_received_split_fixed_size_element_of_wrong_size_aborts(
    parts: list[Message], reason: str
) -> None:
    client = subscribed_client(initial_demand=1, element_size=4)
    assert feed(client, *parts) == [SubscriptionAborted(1, f"split element {reason}")]


def test_split_element_id_may_be_reused_after_its_last_part() -> None:
    pair = Pair()
    pair.subscribe(initial_demand=2)
    for data in (b"one", b"two"):
        pair.server.send(OnNextPart(1, 0, data[:1]))
        pair.server.send(OnNextLastPart(1, 0, data[1:]))
    assert pair.to_client() == [OnNext(1, b"one"), OnNext(1, b"two")]


def test_frame_over_the_send_limit_is_refused() -> None:
    pair = Pair(max_send_frame_bytes=64)
    pair.subscribe(initial_demand=1)
    with pytest.raises(LocalProtocolError, match="split the element"):
        pair.server.send(OnNext(1, b"x" * 64))
    assert pair.server.publication_demand(1) == 1  # nothing was taken


# ------------------------------------------------------------------------ goodbye (rsio.md#goodbye)


def test_peer_goodbye_is_answered_and_ends_every_subscription() -> None:
    pair = Pair()
    pair.subscribe(1)
    pair.client.send(Subscribe("pending", 2))  # not answered yet
    pair.to_server()
    pair.server.send(Subscribe("back", 5))  # the server subscribes to the client too
    pair.to_client()
    pair.server.send(Goodbye("shutting down"))
    assert pair.to_client() == [
        OnError(1, "goodbye: shutting down"),
        OnError(2, "goodbye: shutting down"),
        Cancel(5),
        Goodbye("shutting down"),
    ]
    assert replies(pair.client) == [Goodbye("")]
    assert pair.client.state is ConnectionState.CLOSED
    with pytest.raises(LocalProtocolError, match="closed"):
        pair.client.send(Request(1, 1))


def test_our_goodbye_drops_later_messages_until_the_reply() -> None:
    pair = Pair()
    pair.subscribe(1, initial_demand=1)
    pair.client.send(Goodbye("done"))
    states = [pair.client.state]
    pair.server.send(OnNext(1, b"in flight"))
    assert pair.to_client() == []
    assert pair.to_server() == [Cancel(1), Goodbye("done")]
    assert pair.to_client() == [Goodbye("")]
    states.append(pair.client.state)
    assert states == [ConnectionState.GOODBYE_SENT, ConnectionState.CLOSED]
    assert pair.client.data_to_send() == b""  # no reply to a reply


def test_nothing_is_sent_after_our_goodbye() -> None:
    client = subscribed_client()
    client.send(Goodbye(""))
    for message in (Request(1, 1), Goodbye(""), Subscribe("x", 2)):
        with pytest.raises(LocalProtocolError):
            client.send(message)


def test_messages_after_peer_goodbye_are_dropped() -> None:
    server = subscribed_server()
    assert feed(server, Goodbye(""), Request(1, 1), Subscribe("x", 2), Goodbye("")) == [
        Cancel(1),
        Goodbye(""),
    ]


# --------------------------------------------------------------------------- EOF and errors


def test_eof_ends_every_subscription_then_reports_connection_closed() -> None:
    pair = Pair()
    pair.subscribe(1)
    pair.client.receive_data(b"")
    assert list(pair.client.events()) == [OnError(1, "connection closed"), ConnectionClosed()]
    assert pair.client.state is ConnectionState.CLOSED
    pair.client.receive_data(b"")  # a second EOF is harmless
    with pytest.raises(LocalProtocolError, match="after EOF"):
        pair.client.receive_data(b"\x02\x0c\x01")


def test_eof_after_goodbye_exchange_reports_only_connection_closed() -> None:
    pair = Pair()
    pair.client.send(Goodbye(""))
    pair.to_server()
    pair.to_client()
    pair.client.receive_data(b"")
    assert list(pair.client.events()) == [ConnectionClosed()]


def test_eof_before_any_hello_reports_connection_closed() -> None:
    server = ReactiveConnection(Role.SERVER)
    server.receive_data(b"")
    assert list(server.events()) == [ConnectionClosed()]


def test_eof_in_the_middle_of_a_frame_is_protocol_error() -> None:
    client = client_after_hello()
    client.receive_data(encode_frame(Goodbye("bye"))[:-1])
    client.receive_data(b"")
    error = protocol_error(client)
    assert "middle of a frame" in str(error)
    assert error.reply_hint is None
    assert client.state is ConnectionState.CLOSED


def test_protocol_error_comes_after_the_events_before_it() -> None:
    client = client_after_hello()
    client.send(Subscribe("logs", 1, 1))
    client.receive_data(encode_frame(Subscribed(1, 0)) + bytes.fromhex("8000") + b"\x05")
    events = client.events()
    assert next(events) == Subscribed(1, 0)
    with pytest.raises(RemoteProtocolError, match="overlong"):
        next(events)
    with pytest.raises(RemoteProtocolError):  # and again on every later call
        list(client.events())


def test_data_after_a_protocol_error_is_discarded() -> None:
    client = client_after_hello()
    client.receive_data(bytes.fromhex("00"))
    client.receive_data(encode_frame(Goodbye("")))
    with pytest.raises(RemoteProtocolError, match="frame length 0"):
        list(client.events())
    client.send(Goodbye("frame length 0"))
    with pytest.raises(LocalProtocolError):
        client.send(Goodbye("twice"))


def test_error_after_our_goodbye_has_no_reply_hint() -> None:
    client = client_after_hello()
    client.send(Goodbye(""))
    client.receive_data(b"\x00")
    assert protocol_error(client).reply_hint is None
    assert client.state is ConnectionState.CLOSED


def test_frame_over_the_receive_limit_is_refused_from_its_prefix() -> None:
    client = client_after_hello()
    client.receive_data(encode_varint(DEFAULT_MAX_FRAME_BYTES + 1))
    with pytest.raises(FrameTooLarge) as info:
        list(client.events())
    assert info.value.reply_hint == Goodbye("frame too large")


def test_one_read_larger_than_the_frame_limit_is_parsed() -> None:
    client = ReactiveConnection(Role.CLIENT, max_frame_bytes=MIN_MAX_FRAME_BYTES)
    client.send(Subscribe("logs", 1, MAX_DEMAND))
    element = b"e" * (64 * 1024)
    count = 20  # 20 x 64 KiB: well over the 1 MiB receive buffer, in one call
    data = b"".join(
        [encode_frame(ServerHello(0)), encode_frame(Subscribed(1, 0))]
        + [encode_frame(OnNext(1, element))] * count
    )
    assert len(data) > MIN_MAX_FRAME_BYTES + 10
    client.receive_data(data)
    assert (
        list(client.events()) == [ServerHello(0), Subscribed(1, 0)] + [OnNext(1, element)] * count
    )


def test_limits_below_the_spec_floor_are_refused() -> None:
    with pytest.raises(ConfigError, match="at least"):
        ReactiveConnection(Role.SERVER, max_frame_bytes=MIN_MAX_FRAME_BYTES - 1)
    with pytest.raises(ConfigError, match="positive"):
        ReactiveConnection(Role.SERVER, max_publications=0)


def test_receive_data_accepts_bytearray_and_memoryview() -> None:
    server = ReactiveConnection(Role.SERVER)
    server.receive_data(bytearray(encode_frame(ClientHello(0))))
    server.receive_data(memoryview(encode_frame(Subscribe("logs", 1))))
    assert list(server.events()) == [ClientHello(0), Subscribe("logs", 1)]


# ------------------------------------------------------------------------ malformed for a live Id


def test_fixed_size_on_next_of_the_wrong_size_is_protocol_error() -> None:
    client = subscribed_client(initial_demand=1, element_size=4)
    client.receive_data(bytes.fromhex("0408016162"))  # onNext(1) with 2 of 4 bytes
    assert "runs past the end" in str(protocol_error(client))


def test_packed_on_a_variable_size_subscription_is_protocol_error() -> None:
    client = subscribed_client(initial_demand=2)
    client.receive_data(encode_frame(OnNextPacked(1, 2, b"ab"), element_size=1))
    assert protocol_error(client).reply_hint == Goodbye(
        "onNextPacked on a subscription with variable-size elements"
    )


def test_cancel_during_a_split_element_drops_its_parts() -> None:
    client = subscribed_client(initial_demand=1)
    assert feed(client, OnNextPart(1, 0, b"he")) == []
    assert client.subscription_state(1) is SubscriberState.RECEIVING_PARTS
    client.send(Cancel(1))
    assert feed(client, OnNextLastPart(1, 0, b"llo")) == []
    assert client.subscription_state(1) is SubscriberState.CLOSED


def test_request_during_a_split_element_is_sent() -> None:
    client = subscribed_client(initial_demand=1)
    client.data_to_send()
    feed(client, OnNextPart(1, 0, b"he"))
    client.send(Request(1, 1))
    assert replies(client) == [Request(1, 1)]
    assert feed(client, OnNextLastPart(1, 0, b"llo"), OnNext(1, b"x")) == [
        OnNext(1, b"hello"),
        OnNext(1, b"x"),
    ]
