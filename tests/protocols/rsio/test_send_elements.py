"""``ReactiveConnection.send_elements``: a run of onNext frames, the same as one ``send`` each.

The publisher's fast path must not be a second protocol: every property is
checked against a twin connection that sends the same elements one
``OnNext`` at a time (bytes, demand, state), and every refusal must leave
the connection as it was.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headrace.errors import LocalProtocolError
from headrace.protocols.rsio import (
    MAX_DEMAND,
    ClientHello,
    OnNext,
    OnNextPart,
    PublisherState,
    ReactiveConnection,
    Request,
    Role,
    ServerHello,
    Subscribe,
    Subscribed,
    encode_frame,
)
from headrace.protocols.rsio._fast import encode_on_next_frames


def publisher(initial_demand: int, element_size: int = 0, **limits: int) -> ReactiveConnection:
    """A server that answered ``subscribe(1)`` of a client played by hand."""
    server = ReactiveConnection(Role.SERVER, **limits)
    server.receive_data(encode_frame(ClientHello(0)))
    server.receive_data(encode_frame(Subscribe("logs", 1, initial_demand)))
    list(server.events())
    server.send(Subscribed(1, element_size))
    server.data_to_send()
    return server


def one_by_one(conn: ReactiveConnection, elements: list[bytes]) -> bytes:
    for element in elements:
        conn.send(OnNext(1, element))
    return conn.data_to_send()


def assert_unchanged(conn: ReactiveConnection, demand: int) -> None:
    assert conn.data_to_send() == b""
    assert conn.publication_demand(1) == demand
    assert conn.publication_state(1) is PublisherState.ACTIVE


# Lengths on both sides of the one-byte varint (127/128) for the element and its frame.
elements_strategy = st.lists(st.binary(max_size=300), max_size=40)


@given(elements_strategy, st.booleans())
def test_a_run_is_the_bytes_of_one_send_each(elements: list[bytes], unbounded: bool) -> None:
    demand = MAX_DEMAND if unbounded else len(elements) + 3
    batched, single = publisher(demand), publisher(demand)
    batched.send_elements(1, elements)
    assert batched.data_to_send() == one_by_one(single, elements)
    assert batched.publication_demand(1) == single.publication_demand(1)
    assert batched.publication_state(1) is PublisherState.ACTIVE


@given(st.integers(1, 200), st.integers(0, 20))
def test_fixed_size_elements_are_sent_without_a_length(size: int, count: int) -> None:
    elements = [bytes([i % 256]) * size for i in range(count)]
    batched, single = publisher(count, element_size=size), publisher(count, element_size=size)
    batched.send_elements(1, elements)
    assert batched.data_to_send() == one_by_one(single, elements)
    assert batched.publication_demand(1) == 0


def test_the_subscriber_decodes_the_run_in_order() -> None:
    client = ReactiveConnection(Role.CLIENT)
    client.send(Subscribe("logs", 1, MAX_DEMAND))
    client.receive_data(encode_frame(ServerHello(0)) + encode_frame(Subscribed(1, 0)))
    elements = [b"", b"a", b"x" * 127, b"y" * 128, b"z" * 60_000]
    server = publisher(MAX_DEMAND, max_send_frame_bytes=1 << 20)
    server.send_elements(1, elements)
    client.receive_data(server.data_to_send())
    got = [e for e in client.events() if isinstance(e, OnNext)]
    assert got == [OnNext(1, element) for element in elements]


def test_beyond_the_demand_is_refused_and_changes_nothing() -> None:
    server = publisher(2)
    with pytest.raises(LocalProtocolError, match="exceeds the outstanding demand 2"):
        server.send_elements(1, [b"a", b"b", b"c"])
    assert_unchanged(server, 2)
    server.send_elements(1, [b"a", b"b"])
    assert server.publication_demand(1) == 0


def test_a_wrong_fixed_size_element_is_refused_and_changes_nothing() -> None:
    server = publisher(5, element_size=4)
    with pytest.raises(LocalProtocolError, match="onNext element of 3 bytes"):
        server.send_elements(1, [b"abcd", b"abc"])
    assert_unchanged(server, 5)


def test_a_frame_over_the_send_limit_is_refused_and_changes_nothing() -> None:
    server = publisher(5, max_send_frame_bytes=100)
    with pytest.raises(LocalProtocolError, match="exceeds max_send_frame_bytes 100"):
        server.send_elements(1, [b"ok", b"x" * 100])
    assert_unchanged(server, 5)
    single = publisher(5, max_send_frame_bytes=100)
    with pytest.raises(LocalProtocolError, match="exceeds max_send_frame_bytes 100"):
        single.send(OnNext(1, b"x" * 100))  # the same limit as one send


def test_a_subscription_that_is_not_active_is_refused() -> None:
    server = publisher(5)
    with pytest.raises(LocalProtocolError, match="subscriber 2 in state closed"):
        server.send_elements(2, [b"a"])
    server.send(OnNextPart(1, 0, b"half"))
    with pytest.raises(LocalProtocolError, match="in state sending parts"):
        server.send_elements(1, [b"a"])
    assert server.publication_demand(1) == 4  # the split element took one


def test_an_empty_run_is_nothing() -> None:
    server = publisher(0)
    server.send_elements(1, [])
    assert_unchanged(server, 0)
    server.receive_data(encode_frame(Request(1, 1)))
    list(server.events())
    server.send_elements(1, [b"now"])
    assert server.publication_demand(1) == 0


def test_encode_on_next_frames_checks_the_subscriber_id() -> None:
    with pytest.raises(LocalProtocolError, match="varint out of range"):
        encode_on_next_frames(-1, [b"a"], 0, 1000)
