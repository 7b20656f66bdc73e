"""The subscriber's fast path for plain ``onNext`` frames changes nothing observable.

``ReactiveConnection._receive_frame`` delivers the common ``onNext`` (one-byte
Id and length, an active variable-size subscription with demand) without the
general decoding; everything else goes through ``_receive_message``. A twin
connection that takes the general path for every frame must see the same
events, replies and demand for any sequence of publisher frames, right or
wrong.
"""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import example, given
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
from headrace.protocols.rsio.codec import encode_varint, read_frame

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


# --------------------------------------------------------------------------- receive_data


class _BufferedTwin(ReactiveConnection):
    """``receive_data`` without the fast path, the reference it must match: every
    byte through the receive buffer, every frame through ``read_frame``."""

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        if self._eof or not data or self._error is not None:
            super().receive_data(data)
            return
        view = memoryview(data)
        position = 0
        try:
            while position < len(view):
                room = self._buffer_limit - len(self._buffer)
                chunk = view[position : position + room]
                self._buffer.feed(chunk)
                position += len(chunk)
                while (body := read_frame(self._buffer, self._max_frame_bytes)) is not None:
                    self._receive_frame(body)
        except RemoteProtocolError as exc:
            self._fail(exc)


def _prefixed(body: bytes) -> bytes:
    return encode_varint(len(body)) + body


# Frames with one-, two- and three-byte length prefixes, and prefixes the
# buffer path must word: length 0, an overlong varint, one over the limit.
data_frames = st.one_of(
    frames,
    st.builds(lambda i, e: encode_frame(OnNext(i, e)), ids, st.binary(min_size=120, max_size=400)),
    st.builds(lambda i, n: encode_frame(OnNext(i, bytes(n))), ids, st.integers(16_380, 16_400)),
    st.sampled_from(
        [b"\x00", b"\x85\x00" + bytes(5), b"\x80\x80\x00", encode_varint((1 << 20) + 1) + b"x"]
    ),
)


@given(
    st.lists(st.sampled_from([0, 1, 2, 5, MAX_DEMAND]), min_size=1, max_size=3),
    st.lists(data_frames, max_size=20),
    st.lists(st.integers(0, 20_000), max_size=8),
)
@example([MAX_DEMAND], [encode_frame(OnNext(1, b"ab"))] * 3, [1, 2, 7])  # a prefix alone
@example([MAX_DEMAND], [encode_frame(OnNext(1, bytes(300)))] * 2, [1, 2, 300])  # a split prefix
def test_frames_from_the_view_match_frames_through_the_buffer(
    demands: list[int], sequence: list[bytes], cuts: list[int]
) -> None:
    """Any bytes, split at any points, give what the buffer-only twin gives them whole."""
    taken = ReactiveConnection(Role.CLIENT)
    twin = _BufferedTwin(Role.CLIENT)
    for client in (taken, twin):
        for subscriber, demand in zip(SUBSCRIBERS, demands, strict=False):
            client.send(Subscribe("logs", subscriber, demand))
        client.receive_data(encode_frame(ServerHello(0)))
        for subscriber in SUBSCRIBERS[: len(demands)]:
            client.receive_data(encode_frame(Subscribed(subscriber, 0)))
    data = b"".join(sequence)
    bounds = sorted({0, len(data), *(c for c in cuts if c < len(data))})
    for start, stop in itertools.pairwise(bounds):
        taken.receive_data(data[start:stop])
    if data:  # b"" would be the end of input
        twin.receive_data(data)
    assert _outcome(taken, demands) == _outcome(twin, demands)
    if _outcome(taken, demands)[1] is None:  # no error: the same partial frame waits
        assert taken.buffered_bytes == twin.buffered_bytes


def test_a_frame_split_after_its_prefix_is_delivered_whole() -> None:
    client = _client([MAX_DEMAND], general=False)
    client.receive_data(encode_frame(Subscribed(1, 0)))
    frame = encode_frame(OnNext(1, b"x" * 200))  # a two-byte prefix
    client.receive_data(frame[:1])
    assert client.buffered_bytes == 1
    client.receive_data(frame[1:5])
    client.receive_data(frame[5:] + encode_frame(OnNext(1, b"y")))
    got = [e for e in client.events() if isinstance(e, OnNext)]
    assert got == [OnNext(1, b"x" * 200), OnNext(1, b"y")]
    assert client.buffered_bytes == 0
