"""The subscriber's fast path for plain ``onNext`` frames changes nothing observable.

``ReactiveConnection._receive_frame`` delivers the common ``onNext`` (one-byte
Id and length, an active variable-size subscription with demand) without the
general decoding; everything else goes through ``_receive_message``. A twin
connection that takes the general path for every frame must see the same
events, replies and demand for any sequence of publisher frames, right or
wrong.
"""

from __future__ import annotations

from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from headrace.errors import RemoteProtocolError
from headrace.protocols.rsio import (
    MAX_DEMAND,
    Goodbye,
    OnComplete,
    OnError,
    OnNext,
    OnNextLastPart,
    OnNextPart,
    ReactiveConnection,
    Role,
    ServerHello,
    Subscribe,
    Subscribed,
    encode_frame,
)
from headrace.protocols.rsio.codec import encode_varint

SUBSCRIBERS = (1, 5, 130)
"""The client's subscription Ids: one-byte varints and a two-byte one (130)."""

# Mostly the subscriptions' own Ids (the fast path's case), sometimes any Id
# across the one-byte varint boundary (127/128).
ids = st.one_of(st.sampled_from(SUBSCRIBERS), st.integers(0, 200))
elements = st.binary(max_size=200)


def _raw_on_next(subscriber: int, element: bytes, extra: bytes) -> bytes:
    """An onNext frame, possibly with bytes after the element (malformed)."""
    body = bytes([8]) + encode_varint(subscriber) + encode_varint(len(element)) + element + extra
    return encode_varint(len(body)) + body


on_next = st.builds(lambda i, e: encode_frame(OnNext(i, e)), ids, elements)
frames = st.one_of(
    on_next,
    on_next,  # twice: well-formed onNext frames are the fast path's case
    st.builds(_raw_on_next, ids, elements, st.binary(min_size=1, max_size=3)),
    st.builds(lambda i, n, d: encode_frame(OnNextPart(i, n, d)), ids, st.integers(0, 3), elements),
    st.builds(
        lambda i, n, d: encode_frame(OnNextLastPart(i, n, d)), ids, st.integers(0, 3), elements
    ),
    st.builds(lambda i, size: encode_frame(Subscribed(i, size)), ids, st.integers(0, 4)),
    st.builds(lambda i: encode_frame(OnComplete(i)), ids),
    st.builds(lambda i: encode_frame(OnError(i, "x")), ids),
    st.just(encode_frame(Goodbye("bye"))),
)


def _client(demands: list[int], general: bool) -> ReactiveConnection:
    client = ReactiveConnection(Role.CLIENT)
    if general:
        client._receive_frame = client._receive_message  # type: ignore[method-assign]
    for subscriber, demand in zip(SUBSCRIBERS, demands, strict=False):
        client.send(Subscribe("logs", subscriber, demand))
    client.receive_data(encode_frame(ServerHello(0)))
    return client


def _outcome(client: ReactiveConnection, demands: list[int]) -> tuple[Any, ...]:
    events: list[object] = []
    error = None
    try:
        for event in client.events():
            events.append(event)
    except RemoteProtocolError as exc:
        error = str(exc)
    subs = SUBSCRIBERS[: len(demands)]
    return (
        events,
        error,
        client.data_to_send(),
        [(client.subscription_state(i), client.subscription_demand(i)) for i in subs],
    )


@settings(max_examples=300)
@given(
    st.lists(st.sampled_from([0, 1, 2, 5, MAX_DEMAND]), min_size=1, max_size=3),
    st.lists(frames, max_size=25),
)
@example([2], [encode_frame(OnNext(1, b"a"))] * 3)  # bounded demand used up, then beyond it
def test_fast_and_general_paths_agree(demands: list[int], sequence: list[bytes]) -> None:
    fast, general = _client(demands, general=False), _client(demands, general=True)
    fast.data_to_send()
    general.data_to_send()
    for subscriber in SUBSCRIBERS[: len(demands)]:
        for client in (fast, general):  # every subscription answered, so onNext is deliverable
            client.receive_data(encode_frame(Subscribed(subscriber, 0)))
    data = b"".join(sequence)
    fast.receive_data(data)
    general.receive_data(data)
    assert _outcome(fast, demands) == _outcome(general, demands)


def test_the_fast_path_delivers_a_plain_on_next() -> None:
    client = _client([2], general=False)
    client.receive_data(encode_frame(Subscribed(1, 0)))
    client.receive_data(encode_frame(OnNext(1, b"a")) + encode_frame(OnNext(1, b"b" * 127)))
    got = [e for e in client.events() if isinstance(e, OnNext)]
    assert got == [OnNext(1, b"a"), OnNext(1, b"b" * 127)]
    assert client.subscription_demand(1) == 0
