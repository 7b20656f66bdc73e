"""Hypothesis: round-trips, arbitrary chunking, and garbage in -> RemoteProtocolError only."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import TypeVar

from hypothesis import given
from hypothesis import strategies as st

from headrace.errors import RemoteProtocolError
from headrace.protocols.tank import codec
from headrace.protocols.tank.bundle import (
    decode_bundle,
    decode_bundle_header,
    decode_chunk,
    encode_bundle,
    encode_chunk_entry,
)
from headrace.protocols.tank.codec import (
    decode_request,
    decode_response,
    encode,
)
from headrace.protocols.tank.commands import (
    SEQ_NUM_TAIL,
    TOPIC_LEVEL_PRODUCE_ERRORS,
    BundleMessage,
    Consume,
    ConsumeError,
    ConsumePartition,
    ConsumePartitionResult,
    ConsumeResponse,
    ConsumeTopic,
    ConsumeTopicResult,
    ConsumeUnknownTopic,
    CreateTopic,
    CreateTopicResponse,
    CreateTopicResult,
    DiscoverPartitions,
    DiscoverPartitionsError,
    DiscoverPartitionsResponse,
    DiscoverTopics,
    DiscoverTopicsResponse,
    DiscoverTopology,
    DiscoverTopologyResponse,
    Endpoint,
    Event,
    MessageType,
    PartitionSeqNums,
    Ping,
    Produce,
    ProduceError,
    ProducePartition,
    ProducePartitionResult,
    ProduceResponse,
    ProduceTopic,
    ProduceTopicResult,
    ProduceWithSeqnum,
    ReloadConf,
    ReloadConfResponse,
    ReloadConfResult,
    Request,
    Response,
    Status,
    StatusCluster,
    StatusDetails,
    StatusResponse,
    TopicInfo,
    TopologyNode,
)
from headrace.protocols.tank.connection import TankConnection
from headrace.protocols.tank.states import Role

T = TypeVar("T")

u8 = st.integers(0, 2**8 - 1)
u16 = st.integers(0, 2**16 - 1)
u32 = st.integers(0, 2**32 - 1)
u64 = st.integers(0, 2**64 - 1)
small_bytes = st.binary(max_size=40)
# Any byte string is a topic name on the wire; realistic ones are short text.
names = st.one_of(
    st.text(max_size=16),
    st.binary(max_size=64).map(lambda b: b.decode("utf-8", "surrogateescape")),
)
endpoints = st.builds(Endpoint, st.ip_addresses(v=4).map(str), u16)


def tuples(elements: st.SearchStrategy[T], max_size: int = 4) -> st.SearchStrategy[tuple[T, ...]]:
    return st.lists(elements, max_size=max_size).map(tuple)


def split(frame: bytes) -> tuple[int, bytes]:
    return frame[0], frame[5:]


# --------------------------------------------------------------------------- requests

produce_topics = tuples(
    st.builds(ProduceTopic, names, tuples(st.builds(ProducePartition, u16, small_bytes)))
)
seqnum_topics = tuples(
    st.builds(ProduceTopic, names, tuples(st.builds(ProducePartition, u16, small_bytes, u64)))
)
produces = st.builds(Produce, u32, produce_topics, u16, small_bytes, u8, u32)
produce_with_seqnums = st.builds(ProduceWithSeqnum, u32, seqnum_topics, u16, small_bytes, u8, u32)
consume_topics = tuples(
    st.builds(ConsumeTopic, names, tuples(st.builds(ConsumePartition, u16, u64, u32)))
)
consumes = st.one_of(
    st.builds(Consume, u32, consume_topics, u64, u32, st.integers(0, 2), small_bytes),
    st.builds(Consume, u32, consume_topics, u64, u32, st.integers(3, 2**16 - 1), small_bytes, u8),
)
requests: st.SearchStrategy[Request] = st.one_of(
    produces,
    produce_with_seqnums,
    consumes,
    st.builds(CreateTopic, u32, names, u16, small_bytes),
    st.builds(DiscoverPartitions, u32, names, tuples(u16)),
    st.builds(ReloadConf, u32, names, u16),
    st.builds(Status, u32),
    st.builds(DiscoverTopics, u32, u8),
    st.builds(DiscoverTopology, u32, u8),
)


@given(requests)
def test_every_request_round_trips(request: Request) -> None:
    frame = encode(request)
    assert int.from_bytes(frame[1:5], "little") == len(frame) - 5
    assert decode_request(*split(frame)) == request


# --------------------------------------------------------------------------- responses

partition_level_errors = st.sampled_from(
    [e for e in ProduceError if e not in TOPIC_LEVEL_PRODUCE_ERRORS]
)


@st.composite
def produce_exchanges(draw: st.DrawFn) -> tuple[Produce, ProduceResponse]:
    """A produce request and a response that fits its shape."""
    request_topics = []
    result_topics = []
    for _ in range(draw(st.integers(0, 4))):
        name = draw(names)
        ids = draw(st.lists(u16, max_size=4))
        topic_error = draw(
            st.sampled_from([ProduceError.OK, ProduceError.UNKNOWN_TOPIC, ProduceError.READ_ONLY])
        )
        request_topics.append(ProduceTopic(name, tuple(ProducePartition(i, b"b") for i in ids)))
        if topic_error != ProduceError.OK and ids:
            result_topics.append(ProduceTopicResult(name, (), topic_error))
            continue
        results = []
        for partition_id in ids:
            error = draw(partition_level_errors)
            leader = draw(endpoints) if error == ProduceError.NOT_LEADER else None
            results.append(ProducePartitionResult(partition_id, error, leader))
        result_topics.append(ProduceTopicResult(name, tuple(results)))
    request_id = draw(u32)
    return (
        Produce(request_id, tuple(request_topics)),
        ProduceResponse(request_id, tuple(result_topics)),
    )


@st.composite
def consume_partition_results(draw: st.DrawFn) -> ConsumePartitionResult:
    partition_id = draw(st.integers(0, 0xFFFE))
    flags = draw(st.sampled_from(ConsumeError))
    if flags == ConsumeError.OTHER_LEADER:
        return ConsumePartitionResult(partition_id, flags, leader=draw(endpoints))
    if flags in (ConsumeError.OK, ConsumeError.SPARSE_BUNDLE, ConsumeError.BOUNDARY_CHECK):
        base = 0 if flags == ConsumeError.SPARSE_BUNDLE else draw(u64)
        first = draw(u64) if flags == ConsumeError.BOUNDARY_CHECK else 0
        return ConsumePartitionResult(
            partition_id, flags, base, draw(u64), draw(small_bytes), first
        )
    return ConsumePartitionResult(partition_id, flags)


short_names = st.text(max_size=16)  # see docs: a 0-partition topic before a 0xFF-named one
consume_responses = st.builds(
    ConsumeResponse,
    u32,
    tuples(
        st.one_of(
            st.builds(ConsumeTopicResult, short_names, tuples(consume_partition_results())),
            st.builds(ConsumeUnknownTopic, short_names, u8),
        )
    ),
)


@st.composite
def partition_seq_nums(draw: st.DrawFn) -> PartitionSeqNums:
    error = draw(st.none() | st.sampled_from(DiscoverPartitionsError))
    if error is None:
        first = draw(u64)
        hwm = draw(u64.filter(lambda v: v != 2**64 - 1 or first != 2**64 - 1))
        return PartitionSeqNums(first, hwm)
    leader = draw(endpoints) if error == DiscoverPartitionsError.OTHER_LEADER else None
    return PartitionSeqNums(0, 0, error, leader)


@st.composite
def discover_topics_responses(draw: st.DrawFn) -> DiscoverTopicsResponse:
    cluster_aware = draw(st.booleans())
    rf = u8 if cluster_aware else st.none()
    topics = draw(tuples(st.builds(TopicInfo, names, st.booleans(), u16, rf)))
    return DiscoverTopicsResponse(draw(u32), topics, cluster_aware)


topology_responses = st.one_of(
    st.builds(DiscoverTopologyResponse, u32),
    st.builds(
        DiscoverTopologyResponse,
        u32,
        names,
        tuples(
            st.builds(TopologyNode, u16, u16, st.none() | endpoints, st.booleans(), st.booleans())
        ),
    ),
)

responses: st.SearchStrategy[Response] = st.one_of(
    consume_responses,
    st.builds(CreateTopicResponse, u32, names, st.sampled_from(CreateTopicResult)),
    st.builds(DiscoverPartitionsResponse, u32, names, tuples(partition_seq_nums())),
    st.builds(ReloadConfResponse, u32, names, u16, st.sampled_from(ReloadConfResult)),
    st.builds(
        StatusResponse,
        u32,
        u32,
        u32,
        u8,
        st.none() | st.builds(StatusCluster, u8, names, u32),
        st.none() | st.builds(StatusDetails, u32, u32, u32, u32),
    ),
    discover_topics_responses(),
    topology_responses,
)


@given(responses)
def test_every_response_round_trips(response: Response) -> None:
    assert decode_response(*split(encode(response))) == response


@given(produce_exchanges())
def test_produce_responses_round_trip_with_their_request(
    exchange: tuple[Produce, ProduceResponse],
) -> None:
    request, response = exchange
    assert decode_response(*split(encode(response)), request) == response


# --------------------------------------------------------------------------- bundles

bundle_messages = st.builds(BundleMessage, st.binary(max_size=30), u64, st.binary(max_size=255))


@given(
    st.lists(bundle_messages, min_size=1, max_size=40),
    st.none() | st.booleans(),
    st.integers(1, 2**40),
)
def test_bundles_round_trip(
    messages: list[BundleMessage], compress: bool | None, first: int
) -> None:
    bundle = encode_bundle(messages, compress=compress)
    expected = tuple(
        BundleMessage(m.content, m.timestamp_ms, m.key, first + i) for i, m in enumerate(messages)
    )
    assert decode_bundle(bundle, first) == expected
    header = decode_bundle_header(bundle)
    assert (header.msg_count, header.sparse) == (len(messages), False)


@st.composite
def sparse_messages(draw: st.DrawFn) -> list[BundleMessage]:
    messages = draw(st.lists(bundle_messages, min_size=1, max_size=20))
    seq_num = draw(st.integers(1, 2**40))
    out = []
    for message in messages:
        out.append(BundleMessage(message.content, message.timestamp_ms, message.key, seq_num))
        seq_num += draw(st.integers(1, 1000))
    return out


@given(sparse_messages(), st.booleans())
def test_sparse_bundles_round_trip(messages: list[BundleMessage], compress: bool) -> None:
    bundle = encode_bundle(messages, compress=compress, sparse=True)
    assert decode_bundle(bundle, None) == tuple(messages)
    header = decode_bundle_header(bundle)
    assert (header.first_seq_num, header.last_seq_num) == (
        messages[0].seq_num,
        messages[-1].seq_num,
    )


@given(st.lists(st.lists(bundle_messages, min_size=1, max_size=5), max_size=5), st.booleans())
def test_chunks_decode_to_all_their_messages(
    bundles: list[list[BundleMessage]], compress: bool
) -> None:
    chunk = b"".join(encode_chunk_entry(encode_bundle(b, compress=compress)) for b in bundles)
    flat = [m for bundle in bundles for m in bundle]
    decoded = decode_chunk(chunk, 1, min_seq_num=SEQ_NUM_TAIL)
    assert [(m.content, m.key, m.seq_num) for m in decoded.messages] == [
        (m.content, m.key, i + 1) for i, m in enumerate(flat)
    ]
    assert decoded.truncated_entry_bytes is None


@given(st.lists(bundle_messages, min_size=1, max_size=8), st.data())
def test_cut_chunks_give_a_prefix_of_the_messages(
    messages: list[BundleMessage], data: st.DataObject
) -> None:
    chunk = encode_chunk_entry(encode_bundle(messages, compress=False))
    cut = data.draw(st.integers(0, len(chunk)))
    decoded = decode_chunk(chunk[:cut], 1)
    assert [m.content for m in decoded.messages] == [m.content for m in messages][
        : len(decoded.messages)
    ]
    assert (decoded.truncated_entry_bytes is None) == (cut in (0, len(chunk)))


# --------------------------------------------------------------------------- chunking


@given(st.lists(requests, max_size=6), st.data())
def test_any_chunking_gives_the_same_server_events(
    messages: list[Request], data: st.DataObject
) -> None:
    stream = b"".join(encode(m) for m in messages)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    server = TankConnection(Role.SERVER)
    events: list[Event] = []
    start = 0
    for end in [*cuts, len(stream)]:
        if end > start:
            server.receive_data(stream[start:end])
            events += server.events()
            start = end
    assert events == messages


@given(st.lists(responses, max_size=6), st.data())
def test_any_chunking_gives_the_same_client_events(
    messages: list[Response], data: st.DataObject
) -> None:
    client = TankConnection(Role.CLIENT)
    expected: list[Event] = [Ping()]
    for index, message in enumerate(messages):
        # Give every response a distinct request of the matching type to answer.
        request_id = index
        message = _with_request_id(message, request_id)
        client.send(_request_for(message))
        expected.append(message)
    stream = encode(Ping()) + b"".join(encode(m) for m in expected[1:])  # type: ignore[arg-type]
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    events: list[Event] = []
    start = 0
    for end in [*cuts, len(stream)]:
        if end > start:
            client.receive_data(stream[start:end])
            events += client.events()
            start = end
    assert events == expected
    assert client.in_flight_count == 0


def _with_request_id(response: Response, request_id: int) -> Response:
    return dataclasses.replace(response, request_id=request_id)


_REQUEST_FOR: dict[MessageType, Callable[[int], Request]] = {
    MessageType.CONSUME: lambda i: Consume(i, ()),
    MessageType.CREATE_TOPIC: lambda i: CreateTopic(i, "t", 1),
    MessageType.DISCOVER_PARTITIONS: lambda i: DiscoverPartitions(i, "t"),
    MessageType.RELOAD_CONF: lambda i: ReloadConf(i, "t", 0),
    MessageType.STATUS: Status,
    MessageType.DISCOVER_TOPICS: DiscoverTopics,
    MessageType.DISCOVER_TOPOLOGY: DiscoverTopology,
}


def _request_for(response: Response) -> Request:
    return _REQUEST_FOR[codec.message_type(response)](response.request_id)


# --------------------------------------------------------------------------- garbage

frames_with_garbage = st.tuples(
    st.sampled_from(sorted(codec.REQUEST_TYPES)), st.binary(max_size=80)
).map(lambda t: codec.encode_frame(t[0], t[1]))
garbage_streams = st.lists(st.binary(max_size=40) | frames_with_garbage, max_size=5).map(b"".join)


@given(garbage_streams)
def test_garbage_gives_a_server_events_or_remote_protocol_error(data: bytes) -> None:
    server = TankConnection(Role.SERVER, max_payload_bytes=4096)
    try:
        if data:  # b"" would be EOF already
            server.receive_data(data)
        server.receive_data(b"")
    except RemoteProtocolError:
        pass
    list(server.events())


@given(garbage_streams)
def test_garbage_gives_a_client_events_or_remote_protocol_error(data: bytes) -> None:
    client = TankConnection(Role.CLIENT, max_payload_bytes=4096)
    for request_id in range(4):
        client.send(Produce(request_id, (ProduceTopic("t", (ProducePartition(0, b"x"),)),)))
    for request_id in range(4, 8):
        client.send(Consume(request_id, ()))
    try:
        client.receive_data(encode(Ping()) + data)
        client.receive_data(b"")
    except RemoteProtocolError:
        pass
    list(client.events())


@given(st.sampled_from(sorted(codec.REQUEST_TYPES | codec.RESPONSE_TYPES)), st.binary(max_size=120))
def test_garbage_payloads_decode_or_raise_remote_protocol_error(
    msg_id: int, payload: bytes
) -> None:
    produce = Produce(1, (ProduceTopic("t", (ProducePartition(0, b""), ProducePartition(1, b""))),))
    for decode in (
        lambda: decode_request(msg_id, payload),
        lambda: decode_response(msg_id, payload, produce),
    ):
        with contextlib.suppress(RemoteProtocolError):
            decode()


@given(st.binary(max_size=200), st.none() | st.integers(1, 2**40))
def test_garbage_bundles_and_chunks_decode_or_raise_remote_protocol_error(
    data: bytes, first: int | None
) -> None:
    for decode in (
        lambda: decode_bundle_header(data),
        lambda: decode_bundle(data, first if first is not None else 1),
        lambda: decode_chunk(data, first),
        lambda: decode_chunk(data, first, min_seq_num=5, high_water_mark=10),
    ):
        with contextlib.suppress(RemoteProtocolError):
            decode()
