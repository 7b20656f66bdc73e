"""Hypothesis properties of the rsio-v0 codec and connection.

1. Every message round-trips through ``encode_frame`` / ``read_frame`` /
   ``decode_message``, and every varint through its codec.
2. Feeding the same bytes in any chunking gives the same events, the same
   error and the same replies.
3. Arbitrary bytes give events or ``RemoteProtocolError``, never any other
   exception ("anything else is a bug").
4. The demand window: whatever the two sides do, the publisher never gets an
   ``onNext`` past the subscriber's demand, and both ends agree on what is
   outstanding.
"""

from __future__ import annotations

import contextlib
import itertools
from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from headrace.errors import LocalProtocolError, RemoteProtocolError
from headrace.protocols._buffer import ReceiveBuffer
from headrace.protocols.rsio import (
    MAX_DEMAND,
    MIN_MAX_FRAME_BYTES,
    Cancel,
    ClientHello,
    Event,
    Goodbye,
    Message,
    OnComplete,
    OnError,
    OnNext,
    OnNextLastPart,
    OnNextPacked,
    OnNextPart,
    ReactiveConnection,
    Request,
    Role,
    ServerHello,
    Subscribe,
    Subscribed,
    SubscriptionAborted,
    decode_message,
    encode_frame,
)
from headrace.protocols.rsio.codec import (
    MAX_VARINT,
    decode_varint,
    encode_message,
    encode_varint,
    read_frame,
)
from tests._sansio import ConnectionPair

varints = st.integers(min_value=0, max_value=MAX_VARINT)
small_ids = st.integers(min_value=0, max_value=3)  # collide often, to reach every state
texts = st.text(max_size=20)
blobs = st.binary(max_size=40)


@st.composite
def packed(draw: st.DrawFn, element_size: int) -> OnNextPacked:
    count = draw(st.integers(min_value=1, max_value=5))
    messages = draw(st.binary(min_size=count * element_size, max_size=count * element_size))
    return OnNextPacked(draw(varints), count, messages)


def messages(element_size: int) -> st.SearchStrategy[Message]:
    """Every message type; ``onNext`` and ``onNextPacked`` laid out for ``element_size``."""
    fixed = st.binary(min_size=element_size, max_size=element_size)
    element = fixed if element_size else blobs
    extensions = st.lists(varints, max_size=4).map(tuple)
    choices: list[st.SearchStrategy[Message]] = [
        st.builds(ClientHello, varints, extensions),
        st.builds(ServerHello, varints, extensions),
        st.builds(Goodbye, texts),
        st.builds(Subscribe, texts, varints, varints),
        st.builds(Request, varints, varints),
        st.builds(Cancel, varints),
        st.builds(Subscribed, varints, varints),
        st.builds(OnNext, varints, element),
        st.builds(OnNextPart, varints, varints, blobs),
        st.builds(OnNextLastPart, varints, varints, blobs),
        st.builds(OnComplete, varints),
        st.builds(OnError, varints, texts),
    ]
    if element_size:
        choices.append(packed(element_size))
    return st.one_of(choices)


@st.composite
def message_with_element_size(draw: st.DrawFn) -> tuple[Message, int]:
    element_size = draw(st.sampled_from([0, 1, 4, 9]))
    return draw(messages(element_size)), element_size


# --------------------------------------------------------------------------- 1. round trips


@given(varints)
def test_varint_roundtrip(value: int) -> None:
    raw = encode_varint(value)
    assert decode_varint(raw, 0) == (value, len(raw))


@given(message_with_element_size())
def test_message_roundtrip(case: tuple[Message, int]) -> None:
    message, element_size = case
    frame = encode_frame(message, element_size)
    buffer = ReceiveBuffer(len(frame))
    buffer.feed(frame)
    body = read_frame(buffer, MIN_MAX_FRAME_BYTES)
    assert body == encode_message(message, element_size)
    assert decode_message(body, element_size) == message


# --------------------------------------------------------------------------- 2. chunking


@dataclass
class Outcome:
    events: list[Event]
    error: str | None
    replies: bytes


def run(role: Role, prologue: list[Message], data: bytes, cuts: list[int]) -> Outcome:
    """Feed ``data`` to a fresh connection in pieces cut at ``cuts``, then EOF."""
    conn = ReactiveConnection(role)
    for message in prologue:
        conn.send(message)
    events: list[Event] = []
    error = None
    positions = [0, *sorted(cut % (len(data) + 1) for cut in cuts), len(data)]
    try:
        for start, end in itertools.pairwise(positions):
            if start < end:  # b"" would mean EOF
                conn.receive_data(data[start:end])
            events += conn.events()
        conn.receive_data(b"")
        events += conn.events()
    except RemoteProtocolError as exc:
        error = f"{type(exc).__name__}: {exc}"
    return Outcome(events, error, conn.data_to_send())


subscriber_side = st.one_of(
    st.builds(Subscribe, texts, small_ids, st.integers(0, MAX_DEMAND + 1)),
    st.builds(Request, small_ids, st.sampled_from([0, 1, 2, MAX_DEMAND, MAX_DEMAND + 1])),
    st.builds(Cancel, small_ids),
    st.builds(Goodbye, texts),
)

publisher_side = st.one_of(
    st.builds(Subscribed, small_ids, st.just(0)),
    st.builds(OnNext, small_ids, blobs),
    st.builds(OnNextPart, small_ids, small_ids, blobs),
    st.builds(OnNextLastPart, small_ids, small_ids, blobs),
    st.builds(OnComplete, small_ids),
    st.builds(OnError, small_ids, texts),
)


@given(st.lists(subscriber_side, max_size=12), st.lists(st.integers(0, 10_000), max_size=8))
def test_server_chunking_gives_the_same_outcome(peer: list[Message], cuts: list[int]) -> None:
    data = b"".join(encode_frame(m) for m in [ClientHello(0), *peer])
    assert run(Role.SERVER, [], data, cuts) == run(Role.SERVER, [], data, [])


@given(
    st.lists(
        st.builds(Subscribe, texts, small_ids, st.integers(0, 3)),
        max_size=4,
        unique_by=lambda m: m.subscriber,
    ),
    st.lists(publisher_side, max_size=12),
    st.lists(st.integers(0, 10_000), max_size=8),
)
def test_client_chunking_gives_the_same_outcome(
    subscriptions: list[Message], peer: list[Message], cuts: list[int]
) -> None:
    data = b"".join(encode_frame(m) for m in [ServerHello(0), *peer])
    assert run(Role.CLIENT, subscriptions, data, cuts) == run(Role.CLIENT, subscriptions, data, [])


# --------------------------------------------------------------------------- 3. garbage


def feed_anything(role: Role, chunks: list[bytes]) -> None:
    conn = ReactiveConnection(role)
    try:
        for chunk in [*chunks, b""]:
            conn.receive_data(chunk)
            for _ in conn.events():
                pass
    except RemoteProtocolError:
        pass


@given(st.sampled_from(Role), st.lists(st.binary(min_size=1, max_size=64), max_size=6))
def test_arbitrary_bytes_give_events_or_remote_protocol_error(
    role: Role, chunks: list[bytes]
) -> None:
    feed_anything(role, chunks)


@given(
    st.sampled_from(Role),
    st.lists(st.binary(min_size=1, max_size=24), max_size=8),
)
def test_arbitrary_frames_after_hello_give_events_or_remote_protocol_error(
    role: Role, bodies: list[bytes]
) -> None:
    hello = ServerHello(0) if role is Role.CLIENT else ClientHello(0)
    frames = [encode_frame(hello)] + [encode_varint(len(b)) + b for b in bodies]
    feed_anything(role, frames)


@given(st.binary(max_size=40), st.sampled_from([0, 1, 4]))
def test_arbitrary_body_decodes_or_raises_remote_protocol_error(
    body: bytes, element_size: int
) -> None:
    with contextlib.suppress(RemoteProtocolError):
        decode_message(body, element_size)


# --------------------------------------------------------------------------- 4. demand


operations = st.lists(
    st.one_of(
        st.tuples(st.just("request"), st.sampled_from([1, 2, 3, MAX_DEMAND // 2, MAX_DEMAND])),
        st.tuples(st.just("next"), st.integers(1, 3)),
        st.tuples(st.just("pack"), st.integers(1, 3)),
        st.tuples(st.just("split"), st.integers(1, 3)),
        st.tuples(st.just("pump"), st.just(0)),
    ),
    max_size=30,
)


@given(st.integers(0, 3), operations)
def test_publisher_never_exceeds_demand(initial_demand: int, ops: list[tuple[str, int]]) -> None:
    pair = ConnectionPair(ReactiveConnection(Role.CLIENT), ReactiveConnection(Role.SERVER))
    client, server = pair.client, pair.server
    pair.to_server(Subscribe("s", 1, initial_demand))
    server.send(Subscribed(1, 1))
    received: list[Event] = []

    def pump() -> None:
        received.extend(pair.pump()[1])

    sent = 0
    for op, n in ops:
        try:
            if op == "request":
                client.send(Request(1, n))
            elif op == "next":
                server.send(OnNext(1, b"x"))
                sent += 1
            elif op == "pack":
                server.send(OnNextPacked(1, n, b"x" * n))
                sent += n
            elif op == "split":
                server.send(OnNextPart(1, n, b"x"[: n % 2]))
                server.send(OnNextLastPart(1, n, b"x"[n % 2 :]))
                sent += 1
            else:
                pump()
        except LocalProtocolError:
            pass  # refused: beyond demand
    pump()
    assert not any(isinstance(event, SubscriptionAborted) for event in received)
    elements = sum(
        event.count if isinstance(event, OnNextPacked) else 1
        for event in received
        if isinstance(event, OnNext | OnNextPacked)
    )
    assert elements == sent
    # In quiet state the publisher's window never exceeds the subscriber's, and they are
    # equal unless the subscriber went unbounded while an onNext was in flight: the
    # publisher then caps a sum that the in-flight element had already lowered.
    subscriber_view = client.subscription_demand(1)
    publisher_view = server.publication_demand(1)
    assert publisher_view <= subscriber_view
    assert publisher_view == subscriber_view or subscriber_view == MAX_DEMAND
