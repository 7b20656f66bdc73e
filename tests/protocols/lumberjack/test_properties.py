"""Hypothesis: round-trips, chunking independence, and garbage -> RemoteProtocolError only."""

from __future__ import annotations

import itertools
import json
import struct
import zlib

from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.errors import LocalProtocolError, RemoteProtocolError
from headrace.protocols.lumberjack import (
    Ack,
    Batch,
    Compressed,
    ConnectionClosed,
    ConnectionEvent,
    Data,
    Frame,
    InnerFrame,
    JsonData,
    Limits,
    LumberjackConnection,
    ProtocolVersion,
    Role,
    WindowSize,
    decode_frames,
    encode_frame,
)

U32 = st.integers(min_value=0, max_value=0xFFFFFFFF)
VERSIONS = st.sampled_from(list(ProtocolVersion))
SMALL_LIMITS = Limits(
    max_frame_bytes=2048,
    max_decompressed_bytes=4096,
    max_compressed_depth=2,
    max_data_pairs=8,
    max_key_bytes=64,
    max_value_bytes=512,
    max_window_count=16,
    max_pending_windows=4,
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=8,
)
json_objects = st.dictionaries(st.text(max_size=8), json_values, max_size=4)
separators = st.sampled_from([(",", ":"), (", ", ": ")])


@st.composite
def json_frames(draw: st.DrawFn, seq: st.SearchStrategy[int] = U32) -> JsonData:
    document = json.dumps(draw(json_objects), separators=draw(separators), ensure_ascii=False)
    return JsonData(draw(seq), document.encode())


@st.composite
def data_frames(draw: st.DrawFn, seq: st.SearchStrategy[int] = U32) -> Data:
    pairs = draw(st.lists(st.tuples(st.binary(max_size=8), st.binary(max_size=16)), max_size=5))
    return Data(draw(seq), tuple(pairs))


def inner_frames(version: ProtocolVersion) -> st.SearchStrategy[InnerFrame]:
    data: st.SearchStrategy[InnerFrame] = (
        data_frames() if version is ProtocolVersion.V1 else json_frames()
    )
    return st.recursive(
        data,
        lambda children: st.lists(children, max_size=3).map(lambda f: Compressed(tuple(f))),
        max_leaves=6,
    )


@st.composite
def versioned_frames(draw: st.DrawFn) -> tuple[ProtocolVersion, Frame]:
    version = draw(VERSIONS)
    frame: Frame = draw(
        st.one_of(
            U32.map(WindowSize),
            U32.map(Ack),
            data_frames(),
            json_frames(),
            inner_frames(version),
        )
    )
    return version, frame


@given(versioned_frames(), st.integers(min_value=0, max_value=9))
@settings(deadline=None)
def test_encode_decode_round_trip(framed: tuple[ProtocolVersion, Frame], level: int) -> None:
    version, frame = framed
    assert decode_frames(encode_frame(version, frame, compress_level=level)) == [(version, frame)]


@st.composite
def client_streams(draw: st.DrawFn) -> tuple[ProtocolVersion, bytes]:
    """Bytes a well-behaved client could send: windows of bare and compressed data."""
    version = draw(VERSIONS)
    client = LumberjackConnection(Role.CLIENT, version=version)
    seq = st.integers(min_value=0, max_value=50)
    data: st.SearchStrategy[Data | JsonData] = (
        data_frames(seq) if version is ProtocolVersion.V1 else json_frames(seq)
    )
    for _ in range(draw(st.integers(min_value=0, max_value=4))):
        frames = draw(st.lists(data, max_size=5))
        client.send(WindowSize(len(frames)))
        while frames:
            cut = draw(st.integers(min_value=1, max_value=len(frames)))
            group, frames = frames[:cut], frames[cut:]
            if draw(st.booleans()):
                client.send(Compressed(tuple(group)))
            else:
                for frame in group:
                    client.send(frame)
        if draw(st.booleans()):
            client.send(Compressed(()))
    return version, client.data_to_send()


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(data)) for c in cuts})
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def flatten(events: list[ConnectionEvent]) -> list[tuple[str, int | None, bytes]]:
    """Batches cut where the bytes were cut; events and ack points in order are what count."""
    items: list[tuple[str, int | None, bytes]] = []
    for event in events:
        if isinstance(event, Batch):
            items += [("event", e.seq, e.payload) for e in event.events]
            if event.ack_seq is not None:
                items.append(("ack", event.ack_seq, b""))
        else:
            items.append((type(event).__name__, None, b""))
    return items


def run_server(chunks: list[bytes]) -> list[ConnectionEvent]:
    server = LumberjackConnection(Role.SERVER)
    events: list[ConnectionEvent] = []
    for chunk in [*(c for c in chunks if c), b""]:  # b"" only once: it means EOF
        server.receive_data(chunk)
        events += server.events()
    return events


@given(client_streams(), st.lists(st.integers(min_value=0, max_value=2000), max_size=20))
@settings(deadline=None)
def test_arbitrary_chunking_gives_the_same_events(
    stream: tuple[ProtocolVersion, bytes], cuts: list[int]
) -> None:
    _, data = stream
    whole = run_server([data])
    chunked = run_server(split(data, cuts))
    assert flatten(chunked) == flatten(whole)
    assert whole[-1] == ConnectionClosed()


@given(client_streams())
@settings(deadline=None)
def test_server_can_ack_every_ack_point_in_order(stream: tuple[ProtocolVersion, bytes]) -> None:
    version, data = stream
    server = LumberjackConnection(Role.SERVER)
    server.receive_data(data)
    points = [e.ack_seq for e in server.events() if isinstance(e, Batch) and e.ack_seq is not None]
    for seq in points:
        server.send(Ack(seq))
    assert not server.awaiting_ack or server.state.value == "in-window"
    assert server.data_to_send() == b"".join(encode_frame(version, Ack(s)) for s in points)


def feed_garbage(role: Role, chunks: list[bytes], limits: Limits) -> None:
    version = ProtocolVersion.V2 if role is Role.CLIENT else None
    connection = LumberjackConnection(role, version=version, limits=limits)
    try:
        for chunk in [*(c for c in chunks if c), b""]:  # b"" only once: it means EOF
            connection.receive_data(chunk)
            for event in connection.events():
                if isinstance(event, Batch) and event.ack_seq is not None:
                    connection.send(Ack(event.ack_seq))
    except RemoteProtocolError:
        pass


prefixes = st.sampled_from([b"", b"1", b"2", b"1W", b"2W", b"1D", b"2J", b"2C", b"1C", b"2A"])
limits_choice = st.sampled_from([Limits(), SMALL_LIMITS])


@given(
    prefixes,
    st.lists(st.binary(max_size=64), max_size=8),
    st.sampled_from(list(Role)),
    limits_choice,
)
@settings(deadline=None)
def test_arbitrary_bytes_give_events_or_remote_protocol_error(
    prefix: bytes, chunks: list[bytes], role: Role, limits: Limits
) -> None:
    feed_garbage(role, [prefix, *chunks], limits)


@given(
    VERSIONS,
    st.binary(max_size=200),
    st.booleans(),
    st.binary(max_size=8),
    limits_choice,
)
@settings(deadline=None)
def test_compressed_garbage_gives_remote_protocol_error_only(
    version: ProtocolVersion, content: bytes, valid_zlib: bool, tail: bytes, limits: Limits
) -> None:
    body = zlib.compress(content) if valid_zlib else content
    frame = bytes([version, ord("C")]) + struct.pack(">I", len(body)) + body + tail
    window = bytes([version, ord("W")]) + struct.pack(">I", 3)
    feed_garbage(Role.SERVER, [window, frame], limits)


@given(client_streams(), st.integers(min_value=0), st.binary(min_size=1, max_size=4))
@settings(deadline=None)
def test_corrupted_valid_streams_give_remote_protocol_error_only(
    stream: tuple[ProtocolVersion, bytes], position: int, noise: bytes
) -> None:
    _, data = stream
    if not data:
        return
    at = position % len(data)
    corrupted = data[:at] + noise + data[at + len(noise) :]
    feed_garbage(Role.SERVER, [corrupted], SMALL_LIMITS)
    feed_garbage(Role.SERVER, [corrupted], Limits())


@given(client_streams(), st.data())
@settings(deadline=None)
def test_server_acks_only_delivered_seqs_and_ack_points_in_order(
    stream: tuple[ProtocolVersion, bytes], data: st.DataObject
) -> None:
    version, wire = stream
    server = LumberjackConnection(Role.SERVER)
    server.receive_data(wire)
    batches = [e for e in server.events() if isinstance(e, Batch)]
    delivered = {event.seq for batch in batches for event in batch.events}
    points = [batch.ack_seq for batch in batches if batch.ack_seq is not None]
    candidates = st.sampled_from(sorted(delivered | set(points) | {0})) | U32
    final_acks: list[int] = []
    for seq in data.draw(st.lists(candidates, max_size=30)):
        pending_before = server.pending_window_count
        try:
            server.send(Ack(seq))
        except LocalProtocolError:
            continue
        if server.pending_window_count < pending_before:
            final_acks.append(seq)
        else:  # a keepalive or a partial ack: v2 only, for something delivered
            assert version is ProtocolVersion.V2
            assert seq == 0 or seq in delivered
    assert final_acks == points[: len(final_acks)]
