"""Pure encode/decode of TANK frames and messages.

Byte layouts (all integers little-endian, no padding; anchors of
``docs/protocols/tank.md`` in brackets; ``tank.md#...`` below names them too)::

    frame     msg_id:u8  payload_size:u32  payload            [#framing]
    str8      len:u8  bytes                                     [#primitives]
    varint    unsigned LEB128, at most 5 bytes, value < 2**32   [#primitives]
    endpoint  addr:4 bytes in network order  port:u16           [#primitives]

Every ``decode_*`` function takes bytes that are complete as far as framing
goes and raises :class:`RemoteProtocolError` for anything malformed (never
``IndexError`` or ``struct.error``). Every ``encode*`` function raises
:class:`LocalProtocolError` for a value the wire cannot carry (a field out of
range, a key over 255 bytes...). Nothing here keeps state: the connection
(``connection.py``) owns framing across reads and request/response matching.

Requests and responses carry bundles and consume chunks as opaque bytes: the
store keeps them verbatim. Their layouts, and unpacking them into messages
for readers and clients, are ``bundle.py``'s.
"""

from __future__ import annotations

import ipaddress
import struct
from collections.abc import Mapping, Sequence
from typing import TypeGuard, TypeVar

from headrace.errors import LocalProtocolError, RemoteProtocolError
from headrace.protocols._varint import TRUNCATED, decode_leb128, encode_leb128
from headrace.protocols.tank.commands import (
    TOPIC_LEVEL_PRODUCE_ERRORS,
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
    Message,
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

__all__ = [
    "FRAME_HEADER_BYTES",
    "MAX_PAYLOAD_BYTES",
    "MAX_STR8_BYTES",
    "MAX_VARINT_BYTES",
    "MAX_VARINT_VALUE",
    "REQUEST_TYPES",
    "RESPONSE_TYPES",
    "decode_frame_header",
    "decode_request",
    "decode_response",
    "decode_varint",
    "encode",
    "encode_consume_split",
    "encode_frame",
    "encode_varint",
    "is_request",
    "is_response",
    "message_type",
    "response_request_id",
    "response_type_for",
]

# --------------------------------------------------------------------------- limits

FRAME_HEADER = struct.Struct("<BI")  # msg_id:u8, payload_size:u32 (tank.md#framing)
FRAME_HEADER_BYTES = 5
assert FRAME_HEADER.size == FRAME_HEADER_BYTES

MAX_PAYLOAD_BYTES = 256 * 1024 * 1024
"""Largest frame payload accepted: the C++ broker closes a connection announcing more
(tank.md#framing)."""

MAX_VARINT_BYTES = 5
"""A varint carries at most 32 bits, so 5 groups of 7 (tank.md#primitives)."""

MAX_VARINT_VALUE = 2**32 - 1
"""Varints are limited to 32-bit values; there is no 64-bit varint in the protocol
(tank.md#primitives)."""

MAX_STR8_BYTES = 255
"""A ``str8`` length is one byte (tank.md#primitives): topic names, client ids, keys."""

_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_U8_MAX = 0xFF
_U16_MAX = 0xFFFF
_U32_MAX = 0xFFFF_FFFF
_U64_MAX = 0xFFFF_FFFF_FFFF_FFFF
_UNKNOWN_TOPIC_MARK = 0xFFFF  # consume response: in place of the first partition id (6.5)
_STANDALONE_NODES = 0xFFFF  # DiscoverTopology "nodes" of a standalone broker (8.5)
_TOPOLOGY_HAS_ENDPOINT = 0x01
_TOPOLOGY_AVAILABLE = 0x02
_TOPOLOGY_BLOCKED = 0x04

_CodeT = TypeVar(
    "_CodeT",
    ProduceError,
    ConsumeError,
    CreateTopicResult,
    ReloadConfResult,
    DiscoverPartitionsError,
)

REQUEST_TYPES = frozenset(
    {
        MessageType.PRODUCE,
        MessageType.CONSUME,
        MessageType.PING,
        MessageType.PRODUCE_WITH_SEQNUM,
        MessageType.DISCOVER_PARTITIONS,
        MessageType.CREATE_TOPIC,
        MessageType.RELOAD_CONF,
        MessageType.STATUS,
        MessageType.DISCOVER_TOPICS,
        MessageType.DISCOVER_TOPOLOGY,
    }
)
"""Message ids a broker accepts; any other id closes the connection (tank.md#framing)."""

RESPONSE_TYPES = REQUEST_TYPES - {MessageType.PRODUCE_WITH_SEQNUM}
"""Message ids a client accepts (ProduceWithSeqnum is answered with Produce)."""


# --------------------------------------------------------------------------- primitives


class _Truncated(RemoteProtocolError):
    """The input ended inside a field. Only ``bundle.decode_chunk`` treats it as benign."""


class _Reader:
    """A cursor over a bytes-like value; every read is bounds-checked."""

    __slots__ = ("_data", "_end", "_position", "_what")

    def __init__(self, data: bytes | bytearray | memoryview, what: str) -> None:
        self._data = memoryview(data).cast("B")
        self._position = 0
        self._end = len(self._data)
        self._what = what

    @property
    def position(self) -> int:
        return self._position

    @property
    def remaining(self) -> int:
        return self._end - self._position

    def _need(self, count: int) -> None:
        if self._end - self._position < count:
            raise _Truncated(f"{self._what}: truncated (needed {count} more bytes)")

    def u8(self) -> int:
        self._need(1)
        value = self._data[self._position]
        self._position += 1
        return value

    def _unpack(self, fmt: struct.Struct) -> int:
        self._need(fmt.size)
        (value,) = fmt.unpack_from(self._data, self._position)
        self._position += fmt.size
        return int(value)

    def u16(self) -> int:
        return self._unpack(_U16)

    def peek_u16(self) -> int:
        self._need(2)
        (value,) = _U16.unpack_from(self._data, self._position)
        return int(value)

    def u32(self) -> int:
        return self._unpack(_U32)

    def u64(self) -> int:
        return self._unpack(_U64)

    def boolean(self) -> bool:
        value = self.u8()
        if value > 1:
            raise RemoteProtocolError(f"{self._what}: bool byte is {value}, not 0 or 1")
        return value == 1

    def varint(self) -> int:
        value, end = decode_leb128(self._data, self._position, MAX_VARINT_BYTES)
        if end == TRUNCATED:
            self._position = self._end
            self._need(1)
        if end < 0:
            raise RemoteProtocolError(f"{self._what}: varint longer than {MAX_VARINT_BYTES} bytes")
        self._position = end
        if value > MAX_VARINT_VALUE:
            raise RemoteProtocolError(f"{self._what}: varint above 32 bits")
        return value

    def take(self, count: int) -> bytes:
        self._need(count)
        start = self._position
        self._position += count
        return bytes(self._data[start : self._position])

    def take_rest(self) -> bytes:
        return self.take(self.remaining)

    def str8(self) -> bytes:
        return self.take(self.u8())

    def name(self) -> str:
        return self.str8().decode("utf-8", "surrogateescape")

    def endpoint(self) -> Endpoint:
        address = str(ipaddress.IPv4Address(self.take(4)))
        return Endpoint(address, self.u16())

    def expect_end(self) -> None:
        if self._position != self._end:
            raise RemoteProtocolError(f"{self._what}: {self.remaining} unexpected trailing bytes")


def _check(value: int, maximum: int, what: str, minimum: int = 0) -> int:
    if not minimum <= value <= maximum:
        raise LocalProtocolError(f"{what} = {value} is outside {minimum}..{maximum}")
    return value


class _Writer:
    """Accumulates an encoded payload; every write is range-checked."""

    __slots__ = ("_out",)

    def __init__(self) -> None:
        self._out = bytearray()

    def getvalue(self) -> bytes:
        return bytes(self._out)

    def __len__(self) -> int:
        return len(self._out)

    def u8(self, value: int, what: str) -> None:
        self._out.append(_check(value, _U8_MAX, what))

    def u16(self, value: int, what: str) -> None:
        self._out += _U16.pack(_check(value, _U16_MAX, what))

    def u32(self, value: int, what: str) -> None:
        self._out += _U32.pack(_check(value, _U32_MAX, what))

    def u64(self, value: int, what: str) -> None:
        self._out += _U64.pack(_check(value, _U64_MAX, what))

    def boolean(self, value: bool) -> None:
        self._out.append(1 if value else 0)

    def varint(self, value: int, what: str) -> None:
        self._out += encode_varint(_check(value, MAX_VARINT_VALUE, what))

    def raw(self, data: bytes | bytearray | memoryview) -> None:
        self._out += data

    def str8(self, data: bytes, what: str) -> None:
        self.u8(len(data), f"{what} length")
        self._out += data

    def name(self, name: str, what: str) -> None:
        try:
            data = name.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError as exc:
            raise LocalProtocolError(f"{what} {name!r} cannot be encoded: {exc}") from None
        self.str8(data, what)

    def endpoint(self, endpoint: Endpoint) -> None:
        try:
            packed = ipaddress.IPv4Address(endpoint.address).packed
        except ValueError as exc:
            raise LocalProtocolError(f"endpoint address: {exc}") from None
        self._out += packed
        self.u16(endpoint.port, "endpoint port")


def encode_varint(value: int) -> bytes:
    """Unsigned LEB128, 7 bits at a time, least significant first (tank.md#primitives).

    Raises:
        LocalProtocolError: ``value`` is negative or needs more than 32 bits.
    """
    return encode_leb128(_check(value, MAX_VARINT_VALUE, "varint"))


def decode_varint(data: bytes | bytearray | memoryview) -> tuple[int, int]:
    """Decode one varint at the start of ``data``.

    Returns:
        ``(value, size_bytes)``.

    Raises:
        RemoteProtocolError: truncated, longer than 5 bytes, or above 32 bits.
    """
    reader = _Reader(data, "varint")
    value = reader.varint()
    return value, reader.position


# --------------------------------------------------------------------------- framing


def encode_frame(msg_type: int, payload: bytes | bytearray) -> bytes:
    """``msg_id:u8 payload_size:u32 payload`` (tank.md#framing)."""
    _check(len(payload), MAX_PAYLOAD_BYTES, "payload size")
    return FRAME_HEADER.pack(_check(msg_type, _U8_MAX, "msg_id"), len(payload)) + bytes(payload)


def decode_frame_header(header: bytes | bytearray | memoryview) -> tuple[int, int]:
    """Split a 5-byte frame header into ``(msg_id, payload_size)``; no validation."""
    if len(header) != FRAME_HEADER_BYTES:
        raise LocalProtocolError(f"a frame header is {FRAME_HEADER_BYTES} bytes")
    msg_id, size = FRAME_HEADER.unpack(bytes(header))
    return int(msg_id), int(size)


def response_type_for(request: Request) -> MessageType:
    """The msg id that answers ``request`` (ProduceWithSeqnum is answered with Produce)."""
    if isinstance(request, ProduceWithSeqnum):
        return MessageType.PRODUCE
    return _REQUEST_TYPE[type(request)]


def response_request_id(msg_type: int, payload: bytes | bytearray | memoryview) -> int:
    """The request id a response payload echoes (consume responses put it 4 bytes in).

    Raises:
        RemoteProtocolError: the payload is too short to hold it.
    """
    reader = _Reader(payload, f"{_type_name(msg_type)} response")
    if msg_type == MessageType.CONSUME:
        reader.u32()  # header_length
    return reader.u32()


def _type_name(msg_type: int) -> str:
    try:
        return MessageType(msg_type).name
    except ValueError:
        return f"msg id {msg_type:#x}"


# --------------------------------------------------------------------------- encode


def encode(message: Message) -> bytes:
    """Encode a request, a response or a Ping as one complete frame.

    Raises:
        LocalProtocolError: a field is out of the range its wire type can hold.
    """
    writer = _Writer()
    match message:
        case Ping():
            msg_type = MessageType.PING
        case Produce() | ProduceWithSeqnum():
            msg_type = _REQUEST_TYPE[type(message)]
            _encode_produce(writer, message)
        case Consume():
            msg_type = MessageType.CONSUME
            _encode_consume(writer, message)
        case CreateTopic():
            msg_type = MessageType.CREATE_TOPIC
            writer.u32(message.request_id, "request_id")
            writer.name(message.topic, "topic")
            writer.u16(message.partitions_count, "partitions_count")
            writer.varint(len(message.config), "config length")
            writer.raw(message.config)
        case DiscoverPartitions():
            msg_type = MessageType.DISCOVER_PARTITIONS
            writer.u32(message.request_id, "request_id")
            writer.name(message.topic, "topic")
            for partition_id in message.partition_ids:
                writer.u16(partition_id, "partition_id")
        case ReloadConf():
            msg_type = MessageType.RELOAD_CONF
            writer.u32(message.request_id, "request_id")
            writer.name(message.topic, "topic")
            writer.u16(message.partition_id, "partition_id")
        case Status():
            msg_type = MessageType.STATUS
            writer.u32(message.request_id, "request_id")
        case DiscoverTopics() | DiscoverTopology():
            msg_type = _REQUEST_TYPE[type(message)]
            writer.u32(message.request_id, "request_id")
            writer.u8(message.flags, "flags")
        case ProduceResponse():
            msg_type = MessageType.PRODUCE
            _encode_produce_response(writer, message)
        case ConsumeResponse():
            msg_type = MessageType.CONSUME
            _encode_consume_response(writer, message)
        case CreateTopicResponse():
            msg_type = MessageType.CREATE_TOPIC
            writer.u32(message.request_id, "request_id")
            writer.name(message.topic, "topic")
            writer.u8(message.result, "result")
        case DiscoverPartitionsResponse():
            msg_type = MessageType.DISCOVER_PARTITIONS
            _encode_discover_partitions_response(writer, message)
        case ReloadConfResponse():
            msg_type = MessageType.RELOAD_CONF
            writer.u32(message.request_id, "request_id")
            writer.name(message.topic, "topic")
            writer.u16(message.partition_id, "partition_id")
            writer.u8(message.result, "result")
        case StatusResponse():
            msg_type = MessageType.STATUS
            _encode_status_response(writer, message)
        case DiscoverTopicsResponse():
            msg_type = MessageType.DISCOVER_TOPICS
            _encode_discover_topics_response(writer, message)
        case DiscoverTopologyResponse():
            msg_type = MessageType.DISCOVER_TOPOLOGY
            _encode_discover_topology_response(writer, message)
        case _:
            raise LocalProtocolError(f"not a TANK message: {message!r}")
    return encode_frame(msg_type, writer.getvalue())


def _encode_produce(writer: _Writer, message: Produce | ProduceWithSeqnum) -> None:
    with_seq_num = isinstance(message, ProduceWithSeqnum)
    writer.u16(message.client_version, "client_version")
    writer.u32(message.request_id, "request_id")
    writer.str8(message.client_id, "client_id")
    writer.u8(message.required_acks, "required_acks")
    writer.u32(message.ack_timeout_ms, "ack_timeout_ms")
    writer.u8(len(message.topics), "topics_count")
    for topic in message.topics:
        writer.name(topic.name, "topic")
        writer.u8(len(topic.partitions), "partitions_count")
        for partition in topic.partitions:
            writer.u16(partition.partition_id, "partition_id")
            writer.varint(len(partition.bundle), "bundle_length")
            if with_seq_num:
                writer.u64(partition.first_seq_num, "first_seq_num")
            elif partition.first_seq_num:
                raise LocalProtocolError("first_seq_num needs ProduceWithSeqnum, not Produce")
            writer.raw(partition.bundle)


def _encode_consume(writer: _Writer, message: Consume) -> None:
    writer.u16(message.client_version, "client_version")
    writer.u32(message.request_id, "request_id")
    writer.str8(message.client_id, "client_id")
    writer.u64(message.max_wait_ms, "max_wait_ms")
    writer.u32(message.min_bytes, "min_bytes")
    if message.client_version >= 3:
        writer.u8(message.consume_flags, "consume_flags")
    elif message.consume_flags:
        raise LocalProtocolError("consume_flags need client_version >= 3")
    writer.u8(len(message.topics), "topics_count")
    for topic in message.topics:
        writer.name(topic.name, "topic")
        writer.u8(len(topic.partitions), "partitions_count")
        for partition in topic.partitions:
            writer.u16(partition.partition_id, "partition_id")
            writer.u64(partition.seq_num, "seq_num")
            writer.u32(partition.fetch_size, "fetch_size")


def _encode_produce_response(writer: _Writer, message: ProduceResponse) -> None:
    writer.u32(message.request_id, "request_id")
    for topic in message.topics:
        if topic.error != ProduceError.OK:
            if topic.error not in TOPIC_LEVEL_PRODUCE_ERRORS:
                raise LocalProtocolError(f"{topic.error.name} is not a topic-level produce error")
            if topic.partitions:
                raise LocalProtocolError("a topic-level produce error replaces partition results")
            writer.u8(topic.error, "error")
            continue
        for partition in topic.partitions:
            if partition.error in TOPIC_LEVEL_PRODUCE_ERRORS:
                raise LocalProtocolError(f"{partition.error.name} is a topic-level produce error")
            writer.u8(partition.error, "error")
            if (partition.error == ProduceError.NOT_LEADER) != (partition.leader is not None):
                raise LocalProtocolError("a leader endpoint goes with NOT_LEADER and only with it")
            if partition.leader is not None:
                writer.endpoint(partition.leader)


# Header fields present for each errorOrFlags value (tank.md#consume).
_CONSUME_WITH_BASE = frozenset({ConsumeError.OK, ConsumeError.BOUNDARY_CHECK})
_CONSUME_WITH_CHUNK = frozenset(
    {ConsumeError.OK, ConsumeError.BOUNDARY_CHECK, ConsumeError.SPARSE_BUNDLE}
)


def _encode_consume_response(writer: _Writer, message: ConsumeResponse) -> None:
    header, chunks = _consume_response_parts(message, {})
    writer.u32(len(header), "header_length")
    writer.raw(header)
    for chunk in chunks:
        writer.raw(chunk)


ChunkParts = Sequence[bytes | bytearray | memoryview]
"""A chunk given as pieces that follow each other on the wire."""


def _consume_response_parts(
    message: ConsumeResponse, given: Mapping[tuple[int, int], ChunkParts]
) -> tuple[bytes, list[bytes | bytearray | memoryview]]:
    """The header of a consume response and its chunks in wire order.

    A partition (topic index, partition index) named in ``given`` has its chunk
    there, as pieces; the others carry theirs in ``chunk``.
    """
    header = _Writer()
    chunks: list[bytes | bytearray | memoryview] = []
    header.u32(message.request_id, "request_id")
    header.u8(len(message.topics), "topics_count")
    for ti, topic in enumerate(message.topics):
        header.name(topic.name, "topic")
        if isinstance(topic, ConsumeUnknownTopic):
            header.u8(topic.partitions_count, "partitions_count")
            header.u16(_UNKNOWN_TOPIC_MARK, "unknown topic mark")
            continue
        header.u8(len(topic.partitions), "partitions_count")
        for pi, partition in enumerate(topic.partitions):
            parts = given.get((ti, pi))
            if parts is not None and partition.chunk:
                raise LocalProtocolError("a chunk given as pieces must be empty in the message")
            chunk_parts: ChunkParts = (partition.chunk,) if parts is None else parts
            chunk_size = sum(len(part) for part in chunk_parts)
            header.u16(_check(partition.partition_id, _U16_MAX - 1, "partition_id"), "partition_id")
            flags = partition.error_or_flags
            header.u8(flags, "errorOrFlags")
            if (flags == ConsumeError.OTHER_LEADER) != (partition.leader is not None):
                raise LocalProtocolError("a leader endpoint goes with OTHER_LEADER only")
            if partition.leader is not None:
                header.endpoint(partition.leader)
            if flags not in _CONSUME_WITH_CHUNK:
                if chunk_size:
                    raise LocalProtocolError(f"{flags.name} carries no chunk")
                continue
            if flags in _CONSUME_WITH_BASE:
                header.u64(partition.base_seq_num, "base_seq_num")
            header.u64(partition.high_water_mark, "high_water_mark")
            header.u32(chunk_size, "chunk_length")
            if flags == ConsumeError.BOUNDARY_CHECK:
                header.u64(partition.first_available_seq_num, "first_available_seq_num")
            chunks += (part for part in chunk_parts if len(part))
    return header.getvalue(), chunks


def encode_consume_split(
    message: ConsumeResponse, chunks: Mapping[tuple[int, int], ChunkParts]
) -> list[bytes | bytearray | memoryview]:
    """A consume response's frame as pieces, its large chunks not copied.

    ``chunks`` maps (topic index, partition index) to that partition's chunk
    as pieces (its ``chunk`` in ``message`` stays empty); they are returned as
    they are, after one piece holding the frame header and the response
    header (chunks come last in a consume response, tank.md#consume). Joined, the
    pieces are ``encode`` of the message with those chunks in place.

    Raises:
        LocalProtocolError: as ``encode``; also for a named partition whose
            ``chunk`` is not empty.
    """
    header, parts = _consume_response_parts(message, chunks)
    size = _U32.size + len(header) + sum(len(part) for part in parts)
    _check(size, MAX_PAYLOAD_BYTES, "payload size")
    head = FRAME_HEADER.pack(MessageType.CONSUME, size) + _U32.pack(len(header)) + header
    return [head, *parts]


def _encode_discover_partitions_response(
    writer: _Writer, message: DiscoverPartitionsResponse
) -> None:
    writer.u32(message.request_id, "request_id")
    writer.name(message.topic, "topic")
    writer.u16(len(message.partitions), "count")
    for entry in message.partitions:
        if entry.error is None:
            if entry.first_available_seq_num == entry.high_water_mark == _U64_MAX:
                raise LocalProtocolError("all-ones seq nums are reserved for an error entry")
            writer.u64(entry.first_available_seq_num, "first_available_seq_num")
            writer.u64(entry.high_water_mark, "high_water_mark")
            if entry.leader is not None:
                raise LocalProtocolError("a leader endpoint goes with OTHER_LEADER only")
            continue
        writer.u64(_U64_MAX, "first_available_seq_num")
        writer.u64(_U64_MAX, "high_water_mark")
        writer.u8(entry.error, "reason")
        if (entry.error == DiscoverPartitionsError.OTHER_LEADER) != (entry.leader is not None):
            raise LocalProtocolError("a leader endpoint goes with OTHER_LEADER and only with it")
        if entry.leader is not None:
            writer.endpoint(entry.leader)


def _encode_status_response(writer: _Writer, message: StatusResponse) -> None:
    writer.u32(message.request_id, "request_id")
    writer.u8(message.global_flags, "global_flags")
    writer.boolean(message.cluster is not None)
    writer.u32(message.topics_count, "topics")
    writer.u32(message.partitions_count, "partitions")
    if message.cluster is not None:
        writer.u8(message.cluster.flags, "cluster_flags")
        writer.name(message.cluster.name, "cluster_name")
        writer.u32(message.cluster.available_nodes, "available_nodes")
    if message.details is not None:
        writer.u32(message.details.open_partitions, "open_partitions")
        writer.u32(message.details.open_partitions_time_us, "open_partitions_time")
        writer.u32(message.details.startup_ts_s, "startup_ts")
        writer.u32(message.details.version, "version")


def _encode_discover_topics_response(writer: _Writer, message: DiscoverTopicsResponse) -> None:
    writer.u32(message.request_id, "request_id")
    writer.u32(len(message.topics), "count")
    writer.boolean(message.cluster_aware)
    for topic in message.topics:
        writer.name(topic.name, "topic")
        writer.boolean(topic.enabled)
        writer.u16(topic.partitions_count, "partitions")
        if message.cluster_aware:
            if topic.replication_factor is None:
                raise LocalProtocolError("a cluster-aware topic list needs replication factors")
            writer.u8(topic.replication_factor, "replication_factor")
        elif topic.replication_factor is not None:
            raise LocalProtocolError("replication factors need cluster_aware")


def _encode_discover_topology_response(writer: _Writer, message: DiscoverTopologyResponse) -> None:
    writer.u32(message.request_id, "request_id")
    if message.cluster_name is None:
        if message.nodes:
            raise LocalProtocolError("a standalone topology has no nodes")
        writer.u16(_STANDALONE_NODES, "nodes")
        return
    writer.u16(_check(len(message.nodes), _STANDALONE_NODES - 1, "nodes"), "nodes")
    writer.name(message.cluster_name, "cluster_name")
    for node in message.nodes:
        writer.u16(node.node_id, "node id")
        flags = 0
        if node.endpoint is not None:
            flags |= _TOPOLOGY_HAS_ENDPOINT
        if node.available:
            flags |= _TOPOLOGY_AVAILABLE
        if node.blocked:
            flags |= _TOPOLOGY_BLOCKED
        writer.u8(flags, "node flags")
        if node.endpoint is not None:
            writer.endpoint(node.endpoint)
        writer.u16(node.partitions_count, "partitions")


_REQUEST_TYPE: dict[type[object], MessageType] = {
    Produce: MessageType.PRODUCE,
    ProduceWithSeqnum: MessageType.PRODUCE_WITH_SEQNUM,
    Consume: MessageType.CONSUME,
    CreateTopic: MessageType.CREATE_TOPIC,
    DiscoverPartitions: MessageType.DISCOVER_PARTITIONS,
    ReloadConf: MessageType.RELOAD_CONF,
    Status: MessageType.STATUS,
    DiscoverTopics: MessageType.DISCOVER_TOPICS,
    DiscoverTopology: MessageType.DISCOVER_TOPOLOGY,
}


_RESPONSE_TYPE: dict[type[object], MessageType] = {
    ProduceResponse: MessageType.PRODUCE,
    ConsumeResponse: MessageType.CONSUME,
    CreateTopicResponse: MessageType.CREATE_TOPIC,
    DiscoverPartitionsResponse: MessageType.DISCOVER_PARTITIONS,
    ReloadConfResponse: MessageType.RELOAD_CONF,
    StatusResponse: MessageType.STATUS,
    DiscoverTopicsResponse: MessageType.DISCOVER_TOPICS,
    DiscoverTopologyResponse: MessageType.DISCOVER_TOPOLOGY,
}


def is_request(message: object) -> TypeGuard[Request]:
    """Whether ``message`` is one of the request classes (Ping is neither)."""
    return type(message) in _REQUEST_TYPE


def is_response(message: object) -> TypeGuard[Response]:
    """Whether ``message`` is one of the response classes (Ping is neither)."""
    return type(message) in _RESPONSE_TYPE


def message_type(message: Message) -> MessageType:
    """The msg id ``message`` travels under.

    Raises:
        LocalProtocolError: ``message`` is not a TANK message.
    """
    if isinstance(message, Ping):
        return MessageType.PING
    kind = _REQUEST_TYPE.get(type(message)) or _RESPONSE_TYPE.get(type(message))
    if kind is None:
        raise LocalProtocolError(f"not a TANK message: {message!r}")
    return kind


# --------------------------------------------------------------------------- decode requests


def decode_request(msg_type: int, payload: bytes | bytearray | memoryview) -> Request | Ping:
    """Decode a client-to-broker frame payload (the broker's side).

    Raises:
        RemoteProtocolError: unknown or obsolete msg id, truncated or malformed
            payload, or trailing bytes (a broker closes the connection for all
            of them, tank.md#framing).
    """
    if msg_type not in REQUEST_TYPES:
        raise RemoteProtocolError(f"{_type_name(msg_type)} is not a request a broker accepts")
    kind = MessageType(msg_type)
    reader = _Reader(payload, f"{kind.name} request")
    request: Request | Ping
    match kind:
        case MessageType.PING:
            request = Ping()
        case MessageType.PRODUCE | MessageType.PRODUCE_WITH_SEQNUM:
            request = _decode_produce(reader, kind)
        case MessageType.CONSUME:
            request = _decode_consume(reader)
        case MessageType.CREATE_TOPIC:
            request_id = reader.u32()
            topic = reader.name()
            partitions_count = reader.u16()
            config = reader.take(reader.varint())
            request = CreateTopic(request_id, topic, partitions_count, config)
        case MessageType.DISCOVER_PARTITIONS:
            request_id = reader.u32()
            topic = reader.name()
            if reader.remaining % 2:
                raise RemoteProtocolError("DISCOVER_PARTITIONS: partition list of odd length")
            partition_ids = tuple(reader.u16() for _ in range(reader.remaining // 2))
            request = DiscoverPartitions(request_id, topic, partition_ids)
        case MessageType.RELOAD_CONF:
            request = ReloadConf(reader.u32(), reader.name(), reader.u16())
        case MessageType.STATUS:
            request = Status(reader.u32())
        case MessageType.DISCOVER_TOPICS:
            request = DiscoverTopics(reader.u32(), reader.u8())
        case MessageType.DISCOVER_TOPOLOGY:  # pragma: no branch - REQUEST_TYPES is exhaustive
            request = DiscoverTopology(reader.u32(), reader.u8())
    reader.expect_end()
    return request


def _decode_produce(reader: _Reader, kind: MessageType) -> Produce | ProduceWithSeqnum:
    with_seq_num = kind == MessageType.PRODUCE_WITH_SEQNUM
    client_version = reader.u16()
    request_id = reader.u32()
    client_id = reader.str8()
    required_acks = reader.u8()
    ack_timeout_ms = reader.u32()
    topics = []
    for _ in range(reader.u8()):
        name = reader.name()
        partitions = []
        for _ in range(reader.u8()):
            partition_id = reader.u16()
            bundle_length = reader.varint()
            first_seq_num = reader.u64() if with_seq_num else 0
            bundle = reader.take(bundle_length)
            partitions.append(ProducePartition(partition_id, bundle, first_seq_num))
        topics.append(ProduceTopic(name, tuple(partitions)))
    cls = ProduceWithSeqnum if with_seq_num else Produce
    return cls(request_id, tuple(topics), client_version, client_id, required_acks, ack_timeout_ms)


def _decode_consume(reader: _Reader) -> Consume:
    client_version = reader.u16()
    request_id = reader.u32()
    client_id = reader.str8()
    max_wait_ms = reader.u64()
    min_bytes = reader.u32()
    consume_flags = reader.u8() if client_version >= 3 else 0
    topics = []
    for _ in range(reader.u8()):
        name = reader.name()
        partitions = tuple(
            ConsumePartition(reader.u16(), reader.u64(), reader.u32()) for _ in range(reader.u8())
        )
        topics.append(ConsumeTopic(name, partitions))
    return Consume(
        request_id,
        tuple(topics),
        max_wait_ms,
        min_bytes,
        client_version,
        client_id,
        consume_flags,
    )


# --------------------------------------------------------------------------- decode responses


def decode_response(
    msg_type: int,
    payload: bytes | bytearray | memoryview,
    request: Request | None = None,
) -> Response | Ping:
    """Decode a broker-to-client frame payload (the client's side).

    Args:
        msg_type: the frame's msg id.
        payload: the frame's payload.
        request: the request being answered. A produce response carries
            neither topic names nor partition ids, so it is required for
            ``PRODUCE``; other responses ignore it.

    Raises:
        RemoteProtocolError: unknown msg id, unknown result code, truncated or
            malformed payload, or trailing bytes.
        LocalProtocolError: a produce response decoded without its request.
    """
    if msg_type not in RESPONSE_TYPES:
        raise RemoteProtocolError(f"{_type_name(msg_type)} is not a response a client accepts")
    kind = MessageType(msg_type)
    reader = _Reader(payload, f"{kind.name} response")
    response: Response | Ping
    match kind:
        case MessageType.PING:
            response = Ping()
        case MessageType.PRODUCE:
            if not isinstance(request, Produce | ProduceWithSeqnum):
                raise LocalProtocolError("a produce response is decoded with its request")
            response = _decode_produce_response(reader, request)
        case MessageType.CONSUME:
            response = _decode_consume_response(reader)
        case MessageType.CREATE_TOPIC:
            response = CreateTopicResponse(
                reader.u32(), reader.name(), _code(CreateTopicResult, reader.u8())
            )
        case MessageType.DISCOVER_PARTITIONS:
            response = _decode_discover_partitions_response(reader)
        case MessageType.RELOAD_CONF:
            response = ReloadConfResponse(
                reader.u32(), reader.name(), reader.u16(), _code(ReloadConfResult, reader.u8())
            )
        case MessageType.STATUS:
            response = _decode_status_response(reader)
        case MessageType.DISCOVER_TOPICS:
            response = _decode_discover_topics_response(reader)
        case MessageType.DISCOVER_TOPOLOGY:  # pragma: no branch - RESPONSE_TYPES is exhaustive
            response = _decode_discover_topology_response(reader)
    reader.expect_end()
    return response


def _code(enum_type: type[_CodeT], value: int) -> _CodeT:
    try:
        return enum_type(value)
    except ValueError:
        raise RemoteProtocolError(f"{enum_type.__name__}: unknown code {value:#04x}") from None


def _decode_produce_response(
    reader: _Reader, request: Produce | ProduceWithSeqnum
) -> ProduceResponse:
    request_id = reader.u32()
    topics = []
    for topic in request.topics:
        if not topic.partitions:
            # The broker walks (topic, partition) pairs: an empty topic writes nothing.
            topics.append(ProduceTopicResult(topic.name))
            continue
        first = _code(ProduceError, reader.u8())
        if first in TOPIC_LEVEL_PRODUCE_ERRORS:
            topics.append(ProduceTopicResult(topic.name, (), first))
            continue
        results = []
        for index, partition in enumerate(topic.partitions):
            error = first if index == 0 else _code(ProduceError, reader.u8())
            if error in TOPIC_LEVEL_PRODUCE_ERRORS:
                raise RemoteProtocolError(f"{error.name} after a partition-level result")
            leader = reader.endpoint() if error == ProduceError.NOT_LEADER else None
            results.append(ProducePartitionResult(partition.partition_id, error, leader))
        topics.append(ProduceTopicResult(topic.name, tuple(results)))
    return ProduceResponse(request_id, tuple(topics))


def _decode_consume_response(reader: _Reader) -> ConsumeResponse:
    header_length = reader.u32()
    if header_length > reader.remaining:
        raise RemoteProtocolError(f"CONSUME response: header_length {header_length} too large")
    header_end = reader.position + header_length
    request_id = reader.u32()
    # (partition header, chunk length) in order; chunks follow the headers.
    pending: list[tuple[ConsumePartitionResult, int]] = []
    topic_slots: list[str | ConsumeUnknownTopic] = []
    topic_partitions: list[list[int]] = []
    for _ in range(reader.u8()):
        name = reader.name()
        partitions_count = reader.u8()
        if _peek_unknown_topic(reader):
            reader.u16()
            topic_slots.append(ConsumeUnknownTopic(name, partitions_count))
            topic_partitions.append([])
            continue
        indexes = []
        for _ in range(partitions_count):
            indexes.append(len(pending))
            pending.append(_decode_consume_partition(reader))
        topic_slots.append(name)
        topic_partitions.append(indexes)
    if reader.position != header_end:
        raise RemoteProtocolError(
            f"CONSUME response: headers end at {reader.position - 4}, "
            f"header_length says {header_length}"
        )
    results = []
    for partition, chunk_length in pending:
        if chunk_length:
            partition = _replace_chunk(partition, reader.take(chunk_length))
        results.append(partition)
    topics: list[ConsumeTopicResult | ConsumeUnknownTopic] = []
    for slot, indexes in zip(topic_slots, topic_partitions, strict=True):
        if isinstance(slot, ConsumeUnknownTopic):
            topics.append(slot)
        else:
            topics.append(ConsumeTopicResult(slot, tuple(results[i] for i in indexes)))
    return ConsumeResponse(request_id, tuple(topics))


def _peek_unknown_topic(reader: _Reader) -> bool:
    """Whether the next u16 is the unknown-topic mark rather than a partition id.

    Partition ids never reach 0xFFFF (a topic has at most 65530 partitions), so
    the mark is unambiguous whenever the request listed partitions.
    """
    return reader.remaining >= 2 and reader.peek_u16() == _UNKNOWN_TOPIC_MARK


def _replace_chunk(partition: ConsumePartitionResult, chunk: bytes) -> ConsumePartitionResult:
    return ConsumePartitionResult(
        partition.partition_id,
        partition.error_or_flags,
        partition.base_seq_num,
        partition.high_water_mark,
        chunk,
        partition.first_available_seq_num,
        partition.leader,
    )


def _decode_consume_partition(reader: _Reader) -> tuple[ConsumePartitionResult, int]:
    partition_id = reader.u16()
    flags = _code(ConsumeError, reader.u8())
    if flags == ConsumeError.OTHER_LEADER:
        return ConsumePartitionResult(partition_id, flags, leader=reader.endpoint()), 0
    if flags not in _CONSUME_WITH_CHUNK:
        return ConsumePartitionResult(partition_id, flags), 0
    base_seq_num = reader.u64() if flags in _CONSUME_WITH_BASE else 0
    high_water_mark = reader.u64()
    chunk_length = reader.u32()
    first_available = reader.u64() if flags == ConsumeError.BOUNDARY_CHECK else 0
    result = ConsumePartitionResult(
        partition_id,
        flags,
        base_seq_num,
        high_water_mark,
        b"",
        first_available,
    )
    return result, chunk_length


def _decode_discover_partitions_response(reader: _Reader) -> DiscoverPartitionsResponse:
    request_id = reader.u32()
    topic = reader.name()
    entries = []
    for _ in range(reader.u16()):
        first = reader.u64()
        high_water_mark = reader.u64()
        if first == high_water_mark == _U64_MAX:
            reason = _code(DiscoverPartitionsError, reader.u8())
            leader = reader.endpoint() if reason == DiscoverPartitionsError.OTHER_LEADER else None
            entries.append(PartitionSeqNums(0, 0, reason, leader))
        else:
            entries.append(PartitionSeqNums(first, high_water_mark))
    return DiscoverPartitionsResponse(request_id, topic, tuple(entries))


_STATUS_DETAILS_BYTES = 16  # four u32 fields older brokers omit (8.3)


def _decode_status_response(reader: _Reader) -> StatusResponse:
    request_id = reader.u32()
    global_flags = reader.u8()
    cluster_aware = reader.boolean()
    topics_count = reader.u32()
    partitions_count = reader.u32()
    cluster = None
    if cluster_aware:
        cluster = StatusCluster(reader.u8(), reader.name(), reader.u32())
    details = None
    if reader.remaining:
        if reader.remaining != _STATUS_DETAILS_BYTES:
            raise RemoteProtocolError(f"STATUS response: {reader.remaining} trailing bytes")
        details = StatusDetails(reader.u32(), reader.u32(), reader.u32(), reader.u32())
    return StatusResponse(
        request_id, topics_count, partitions_count, global_flags, cluster, details
    )


def _decode_discover_topics_response(reader: _Reader) -> DiscoverTopicsResponse:
    request_id = reader.u32()
    count = reader.u32()
    cluster_aware = reader.boolean()
    topics = []
    for _ in range(count):  # each entry takes >= 4 bytes, so a lying count hits the end
        name = reader.name()
        enabled = reader.boolean()
        partitions_count = reader.u16()
        replication_factor = reader.u8() if cluster_aware else None
        topics.append(TopicInfo(name, enabled, partitions_count, replication_factor))
    return DiscoverTopicsResponse(request_id, tuple(topics), cluster_aware)


def _decode_discover_topology_response(reader: _Reader) -> DiscoverTopologyResponse:
    request_id = reader.u32()
    nodes_count = reader.u16()
    if nodes_count == _STANDALONE_NODES:
        return DiscoverTopologyResponse(request_id)
    cluster_name = reader.name()
    nodes = []
    for _ in range(nodes_count):
        node_id = reader.u16()
        flags = reader.u8()
        endpoint = reader.endpoint() if flags & _TOPOLOGY_HAS_ENDPOINT else None
        nodes.append(
            TopologyNode(
                node_id,
                reader.u16(),
                endpoint,
                bool(flags & _TOPOLOGY_AVAILABLE),
                bool(flags & _TOPOLOGY_BLOCKED),
            )
        )
    return DiscoverTopologyResponse(request_id, cluster_name, tuple(nodes))
