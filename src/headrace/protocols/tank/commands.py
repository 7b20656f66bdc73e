"""TANK wire messages and bundle values: one frozen dataclass per message.

Names follow the protocol reference (``docs/protocols/tank.md``, which also
says what headrace implements; ``tank.md#...`` below names its anchors): message
ids are :class:`MessageType`, each request has a class named after TANK's own
(``Produce``, ``Consume``, ``CreateTopic``...) and each response the same name
plus ``Response``. Result and error bytes are
IntEnums, so a value that TANK does not define cannot be represented.

This module only describes values. The byte layouts live in ``codec.py`` and
the connection rules in ``connection.py`` / ``states.py``.

Words keep one meaning (``docs/architecture.md#naming``): ``seq_num`` is a message sequence number,
``*_count`` a number of items, ``*_bytes`` a size. Topic names are ``str``
(decoded as UTF-8 with ``surrogateescape``, so any byte string survives a
round trip); client ids, keys, contents, bundles and chunks are ``bytes``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = [
    "CONSUME_FLAGS_MIN_CLIENT_VERSION",
    "DEFAULT_CLIENT_VERSION",
    "DEFAULT_PORT",
    "MAX_FETCH_SIZE_BYTES",
    "MAX_MIN_BYTES",
    "MAX_WAIT_MS",
    "SEQ_NUM_TAIL",
    "TOPIC_LEVEL_PRODUCE_ERRORS",
    "BundleCodec",
    "BundleHeader",
    "BundleMessage",
    "ConnectionClosed",
    "Consume",
    "ConsumeError",
    "ConsumePartition",
    "ConsumePartitionResult",
    "ConsumeResponse",
    "ConsumeTopic",
    "ConsumeTopicResult",
    "ConsumeUnknownTopic",
    "CreateTopic",
    "CreateTopicResponse",
    "CreateTopicResult",
    "DecodedChunk",
    "DiscoverPartitions",
    "DiscoverPartitionsError",
    "DiscoverPartitionsResponse",
    "DiscoverTopics",
    "DiscoverTopicsResponse",
    "DiscoverTopology",
    "DiscoverTopologyResponse",
    "Endpoint",
    "Event",
    "Message",
    "MessageFlags",
    "MessageType",
    "PartitionSeqNums",
    "Ping",
    "Produce",
    "ProduceError",
    "ProducePartition",
    "ProducePartitionResult",
    "ProduceResponse",
    "ProduceTopic",
    "ProduceTopicResult",
    "ProduceWithSeqnum",
    "ReloadConf",
    "ReloadConfResponse",
    "ReloadConfResult",
    "Request",
    "Response",
    "Status",
    "StatusCluster",
    "StatusDetails",
    "StatusResponse",
    "TopicInfo",
    "TopologyNode",
]

# --------------------------------------------------------------------------- constants

DEFAULT_PORT = 11011
"""The conventional broker port (tank.md#lifecycle: ``tank-cli`` and the upstream image use it)."""

SEQ_NUM_TAIL = 2**64 - 1
"""Consume ``seq_num`` meaning "only messages published from now on" (tank.md#consume-semantics)."""

DEFAULT_CLIENT_VERSION = 2
"""``client_version`` the C++ client sends (tank.md#produce)."""

CONSUME_FLAGS_MIN_CLIENT_VERSION = 3
"""From this consume ``client_version`` on, a ``consume_flags`` byte follows ``min_bytes`` (6.1)."""

MAX_FETCH_SIZE_BYTES = 64 * 1024 * 1024
"""The broker caps each partition's ``fetch_size`` at 64 MiB (tank.md#consume); servers clamp to
it."""

MAX_MIN_BYTES = 64 * 1024 * 1024
"""The broker caps a consume's ``min_bytes`` at 64 MiB (tank.md#consume); servers clamp to it."""

MAX_WAIT_MS = 3_600_000
"""A parked consume waits at most one hour whatever ``max_wait_ms`` says (tank.md#long-polling)."""


# --------------------------------------------------------------------------- enums


class MessageType(enum.IntEnum):
    """Frame message ids, TANK's ``TankAPIMsgType`` (tank.md#message-ids)."""

    PRODUCE = 0x01
    """Produce request; also the id of every produce response."""
    CONSUME = 0x02
    PING = 0x03
    """Broker greeting, no payload; client pings are accepted and ignored."""
    OBSOLETE_REG_REPLICA = 0x04
    """Obsolete; a broker closes the connection when it receives it."""
    PRODUCE_WITH_SEQNUM = 0x05
    """Produce with an explicit first sequence number; answered with ``PRODUCE``."""
    DISCOVER_PARTITIONS = 0x06
    CREATE_TOPIC = 0x07
    RELOAD_CONF = 0x08
    CONSUME_PEER = 0x09
    """Broker-to-broker replication (cluster mode only, tank.md#cluster); not supported."""
    STATUS = 0x0A
    DISCOVER_TOPICS = 0x0B
    DISCOVER_TOPOLOGY = 0x0C


class ProduceError(enum.IntEnum):
    """Per-partition (or topic-level) result byte of a produce response (tank.md#produce)."""

    OK = 0x00
    UNKNOWN_PARTITION = 0x01
    IO_FAULT = 0x02
    PENDING = 0x03
    """Cluster mode: acks could not be collected in time."""
    INSUFFICIENT_REPLICAS = 0x04
    INVALID_SEQ_NUMS = 0x0A
    """Explicit (0x05 or sparse) sequence numbers not above the high-water mark."""
    NOT_LEADER = 0xFC
    """Cluster mode; followed by the leader's :class:`Endpoint`."""
    NO_LEADER = 0xFD
    READ_ONLY = 0xFE
    """Topic-level only: one byte replaces all of the topic's partition entries."""
    UNKNOWN_TOPIC = 0xFF
    """Topic-level only: one byte replaces all of the topic's partition entries."""


TOPIC_LEVEL_PRODUCE_ERRORS = frozenset({ProduceError.READ_ONLY, ProduceError.UNKNOWN_TOPIC})
"""Produce codes that stand for a whole topic: one byte replaces its partition entries."""


class ConsumeError(enum.IntEnum):
    """``errorOrFlags`` of a consume response partition header (tank.md#consume)."""

    OK = 0x00
    BOUNDARY_CHECK = 0x01
    """Requested seq num out of range; ``first_available_seq_num`` is included."""
    SYSTEM_ERROR = 0xFB
    OTHER_LEADER = 0xFC
    """Cluster mode; the header carries the leader's :class:`Endpoint`."""
    NO_LEADER = 0xFD
    SPARSE_BUNDLE = 0xFE
    """Not an error: the chunk's first bundle is sparse, so no base seq num is sent."""
    UNKNOWN_PARTITION = 0xFF


class CreateTopicResult(enum.IntEnum):
    """Result byte of a CreateTopic response (tank.md#create-topic)."""

    CREATED = 0
    ALREADY_EXISTS = 1
    SYSTEM_ERROR = 2
    INVALID_CONFIG = 4
    READ_ONLY = 5
    INVALID_REQUEST = 10
    NOT_SUPPORTED = 11
    """Client-side meaning only; a broker never sends it."""


class ReloadConfResult(enum.IntEnum):
    """Result byte of a ReloadConf response (tank.md#reload-conf)."""

    RELOADED = 0
    CLIENT_UNKNOWN_TOPIC = 1
    """Never sent by a broker; the C++ client maps it to "unknown topic"."""
    SYSTEM_ERROR = 2
    PARSE_ERROR = 3
    UNKNOWN_PARTITION = 10
    UNKNOWN_TOPIC = 11
    NOT_SUPPORTED = 12
    """Cluster mode."""


class DiscoverPartitionsError(enum.IntEnum):
    """Reason byte after an all-ones DiscoverPartitions entry (tank.md#discover-partitions)."""

    SYSTEM_ERROR = 0xFB
    OTHER_LEADER = 0xFC
    """Followed by the leader's :class:`Endpoint`."""
    NO_LEADER = 0xFD


class BundleCodec(enum.IntEnum):
    """Bundle flags bits 0-1 (tank.md#bundles): how the message set is stored."""

    NONE = 0
    SNAPPY = 1
    """Raw Snappy block, no framing (tank.md#compression)."""


class MessageFlags(enum.IntFlag):
    """Per-message flags inside a bundle's message set (``BundleMsgFlags``,
    tank.md#bundle-messages)."""

    HAVE_KEY = 0x01
    USE_LAST_SPECIFIED_TS = 0x02
    SEQ_NUM_PREV_PLUS_ONE = 0x04


# --------------------------------------------------------------------------- shared values


@dataclass(frozen=True, slots=True)
class Endpoint:
    """An IPv4 broker address in cluster-mode redirects (tank.md#primitives, ``endpoint``).

    Attributes:
        address: dotted quad, e.g. ``"127.0.0.1"``.
        port: TCP port.
    """

    address: str
    port: int


@dataclass(frozen=True, slots=True)
class Ping:
    """Message id 0x03 with an empty payload: the broker's greeting (tank.md#lifecycle)."""


@dataclass(frozen=True, slots=True)
class ConnectionClosed:
    """The peer closed its side of the connection (``receive_data(b"")``)."""


# --------------------------------------------------------------------------- produce


@dataclass(frozen=True, slots=True)
class ProducePartition:
    """One bundle for one partition in a produce request (tank.md#produce).

    Attributes:
        partition_id: the partition (u16).
        bundle: the bundle bytes (tank.md#bundles), without the length varint.
        first_seq_num: only carried by :class:`ProduceWithSeqnum`; 0 means
            "assign the next sequence number", as in a plain Produce.
    """

    partition_id: int
    bundle: bytes
    first_seq_num: int = 0


@dataclass(frozen=True, slots=True)
class ProduceTopic:
    name: str
    partitions: tuple[ProducePartition, ...]


@dataclass(frozen=True, slots=True)
class Produce:
    """Message 0x01: append one bundle to each listed partition (tank.md#produce).

    Attributes:
        request_id: echoed in the response.
        topics: in request order; the response follows the same order.
        client_version: ignored by the broker.
        client_id: ignored by the broker.
        required_acks: cluster mode only.
        ack_timeout_ms: cluster mode only.
    """

    request_id: int
    topics: tuple[ProduceTopic, ...]
    client_version: int = DEFAULT_CLIENT_VERSION
    client_id: bytes = b""
    required_acks: int = 0
    ack_timeout_ms: int = 0


@dataclass(frozen=True, slots=True)
class ProduceWithSeqnum:
    """Message 0x05: like :class:`Produce`, plus each partition's ``first_seq_num``.

    The response is a :class:`ProduceResponse` (message id 0x01).
    """

    request_id: int
    topics: tuple[ProduceTopic, ...]
    client_version: int = DEFAULT_CLIENT_VERSION
    client_id: bytes = b""
    required_acks: int = 0
    ack_timeout_ms: int = 0


@dataclass(frozen=True, slots=True)
class ProducePartitionResult:
    """The result byte of one requested partition (tank.md#produce).

    ``partition_id`` is not on the wire: the decoder takes it from the request.
    ``leader`` is present exactly when ``error`` is ``NOT_LEADER``.
    """

    partition_id: int
    error: ProduceError = ProduceError.OK
    leader: Endpoint | None = None


@dataclass(frozen=True, slots=True)
class ProduceTopicResult:
    """The results for one requested topic (tank.md#produce).

    ``name`` is not on the wire: the decoder takes it from the request.
    ``error`` is ``OK`` or one of the topic-level codes (``UNKNOWN_TOPIC``,
    ``READ_ONLY``); a topic-level code is one byte on the wire and replaces
    every partition entry, so ``partitions`` is then empty.
    """

    name: str
    partitions: tuple[ProducePartitionResult, ...] = ()
    error: ProduceError = ProduceError.OK


@dataclass(frozen=True, slots=True)
class ProduceResponse:
    """Message 0x01 from the broker, answering Produce and ProduceWithSeqnum."""

    request_id: int
    topics: tuple[ProduceTopicResult, ...]


# --------------------------------------------------------------------------- consume


@dataclass(frozen=True, slots=True)
class ConsumePartition:
    """One partition of a consume request (tank.md#consume).

    Attributes:
        partition_id: the partition (u16).
        seq_num: first message wanted; 0 = from the first available,
            :data:`SEQ_NUM_TAIL` = only new messages (tank.md#consume-semantics).
        fetch_size: byte budget for this partition's chunk (u32).
    """

    partition_id: int
    seq_num: int
    fetch_size: int


@dataclass(frozen=True, slots=True)
class ConsumeTopic:
    name: str
    partitions: tuple[ConsumePartition, ...]


@dataclass(frozen=True, slots=True)
class Consume:
    """Message 0x02: read chunks of bundles, long-polling when at EOF (tank.md#consume).

    Attributes:
        request_id: echoed in the response.
        topics: partitions to read.
        max_wait_ms: long-poll limit (u64); 0 answers at once.
        min_bytes: bytes to collect before a parked request is answered (u32).
        client_version: >= 3 puts ``consume_flags`` on the wire.
        client_id: ignored by the broker.
        consume_flags: bit 0 = prefer local node (cluster only); must be 0
            when ``client_version`` < 3.
    """

    request_id: int
    topics: tuple[ConsumeTopic, ...]
    max_wait_ms: int = 0
    min_bytes: int = 0
    client_version: int = DEFAULT_CLIENT_VERSION
    client_id: bytes = b""
    consume_flags: int = 0


@dataclass(frozen=True, slots=True)
class ConsumePartitionResult:
    """One partition header of a consume response, with its chunk (tank.md#consume).

    Which fields are on the wire depends on ``error_or_flags``:

    - ``OK``: base_seq_num, high_water_mark, chunk;
    - ``SPARSE_BUNDLE``: high_water_mark, chunk (``base_seq_num`` stays 0);
    - ``BOUNDARY_CHECK``: base_seq_num, high_water_mark, chunk,
      first_available_seq_num;
    - ``OTHER_LEADER``: leader;
    - the other errors: nothing.

    Attributes:
        partition_id: the partition (u16, never 0xFFFF).
        chunk: back-to-back ``varint(bundle_length) + bundle`` entries; see
            ``codec.decode_chunk``.
    """

    partition_id: int
    error_or_flags: ConsumeError = ConsumeError.OK
    base_seq_num: int = 0
    high_water_mark: int = 0
    chunk: bytes = b""
    first_available_seq_num: int = 0
    leader: Endpoint | None = None


@dataclass(frozen=True, slots=True)
class ConsumeTopicResult:
    name: str
    partitions: tuple[ConsumePartitionResult, ...]


@dataclass(frozen=True, slots=True)
class ConsumeUnknownTopic:
    """A requested topic the broker does not have (tank.md#consume: ``u16 0xFFFF``).

    ``partitions_count`` echoes how many partitions the request listed.
    """

    name: str
    partitions_count: int


@dataclass(frozen=True, slots=True)
class ConsumeResponse:
    """Message 0x02 from the broker (tank.md#consume)."""

    request_id: int
    topics: tuple[ConsumeTopicResult | ConsumeUnknownTopic, ...]


# --------------------------------------------------------------------------- administration


@dataclass(frozen=True, slots=True)
class CreateTopic:
    """Message 0x07 (tank.md#create-topic).

    Attributes:
        partitions_count: u16, >= 1 for a valid request.
        config: ``key=value`` lines separated by ``\\n`` (may be empty).
    """

    request_id: int
    topic: str
    partitions_count: int
    config: bytes = b""


@dataclass(frozen=True, slots=True)
class CreateTopicResponse:
    request_id: int
    topic: str
    result: CreateTopicResult


@dataclass(frozen=True, slots=True)
class DiscoverPartitions:
    """Message 0x06 (tank.md#discover-partitions); ``partition_ids`` empty means "all
    partitions"."""

    request_id: int
    topic: str
    partition_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class PartitionSeqNums:
    """One DiscoverPartitions entry (tank.md#discover-partitions).

    Partition ids are not on the wire: they are ``0..n-1`` for an "all"
    request, or the requested ids in order. ``error`` set means the wire
    carried all-ones seq nums and a reason byte (both seq nums are then 0
    here); ``leader`` accompanies ``OTHER_LEADER``.
    """

    first_available_seq_num: int = 0
    high_water_mark: int = 0
    error: DiscoverPartitionsError | None = None
    leader: Endpoint | None = None


@dataclass(frozen=True, slots=True)
class DiscoverPartitionsResponse:
    """Message 0x06 from the broker; no entries means "unknown topic"."""

    request_id: int
    topic: str
    partitions: tuple[PartitionSeqNums, ...]


@dataclass(frozen=True, slots=True)
class ReloadConf:
    """Message 0x08 (tank.md#reload-conf): re-read one partition's config file."""

    request_id: int
    topic: str
    partition_id: int


@dataclass(frozen=True, slots=True)
class ReloadConfResponse:
    request_id: int
    topic: str
    partition_id: int
    result: ReloadConfResult


@dataclass(frozen=True, slots=True)
class Status:
    """Message 0x0A (tank.md#status)."""

    request_id: int


@dataclass(frozen=True, slots=True)
class StatusCluster:
    """Status fields present only when the broker is cluster-aware."""

    flags: int
    name: str
    available_nodes: int


@dataclass(frozen=True, slots=True)
class StatusDetails:
    """The trailing Status fields that older brokers omit (tank.md#status)."""

    open_partitions: int
    open_partitions_time_us: int
    startup_ts_s: int
    version: int
    """``major * 100 + minor``; 400 = TANK 4.0."""


@dataclass(frozen=True, slots=True)
class StatusResponse:
    request_id: int
    topics_count: int
    partitions_count: int
    global_flags: int = 0
    cluster: StatusCluster | None = None
    details: StatusDetails | None = None


@dataclass(frozen=True, slots=True)
class DiscoverTopics:
    """Message 0x0B (tank.md#discover-topics)."""

    request_id: int
    flags: int = 0


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """One topic of a DiscoverTopics response; ``replication_factor`` only when cluster-aware."""

    name: str
    enabled: bool
    partitions_count: int
    replication_factor: int | None = None


@dataclass(frozen=True, slots=True)
class DiscoverTopicsResponse:
    request_id: int
    topics: tuple[TopicInfo, ...]
    cluster_aware: bool = False


@dataclass(frozen=True, slots=True)
class DiscoverTopology:
    """Message 0x0C (tank.md#discover-topology)."""

    request_id: int
    flags: int = 0


@dataclass(frozen=True, slots=True)
class TopologyNode:
    node_id: int
    partitions_count: int
    endpoint: Endpoint | None = None
    available: bool = False
    blocked: bool = False


@dataclass(frozen=True, slots=True)
class DiscoverTopologyResponse:
    """``cluster_name`` None means standalone (``nodes`` = 0xFFFF on the wire)."""

    request_id: int
    cluster_name: str | None = None
    nodes: tuple[TopologyNode, ...] = ()


# --------------------------------------------------------------------------- bundles


@dataclass(frozen=True, slots=True)
class BundleMessage:
    """One message of a bundle's message set (tank.md#bundle-messages).

    Attributes:
        content: the message value.
        timestamp_ms: u64, milliseconds since the Unix epoch by convention.
        key: up to 255 bytes; empty means "no key".
        seq_num: filled in by the decoder; the encoder reads it only for
            sparse bundles.
    """

    content: bytes
    timestamp_ms: int = 0
    key: bytes = b""
    seq_num: int = 0


@dataclass(frozen=True, slots=True)
class BundleHeader:
    """What a broker reads from a bundle without touching its message set (tank.md#bundles).

    Attributes:
        codec: how the message set is stored.
        msg_count: number of messages (1..65535).
        first_seq_num: for a sparse bundle, its first message's seq num;
            None otherwise (the broker assigns it).
        last_seq_num: for a sparse bundle, its last message's seq num.
        size_bytes: bytes the header occupies; the message set follows.
    """

    codec: BundleCodec
    msg_count: int
    first_seq_num: int | None
    last_seq_num: int | None
    size_bytes: int

    @property
    def sparse(self) -> bool:
        return self.first_seq_num is not None


@dataclass(frozen=True, slots=True)
class DecodedChunk:
    """The messages a consume chunk holds (tank.md#chunks).

    Attributes:
        messages: kept messages, with seq nums, in order.
        next_seq_num: the seq num after the last bundle walked (decoded or
            skipped), or None if no bundle was.
        truncated_entry_bytes: when the chunk ended inside an entry, that
            entry's full size (length varint + bundle), so a client can grow
            its ``fetch_size``; -1 if even the length varint was cut; None when
            the chunk was not cut.
    """

    messages: tuple[BundleMessage, ...]
    next_seq_num: int | None
    truncated_entry_bytes: int | None


# --------------------------------------------------------------------------- unions

Request = (
    Produce
    | ProduceWithSeqnum
    | Consume
    | CreateTopic
    | DiscoverPartitions
    | ReloadConf
    | Status
    | DiscoverTopics
    | DiscoverTopology
)
"""Every message a client sends with a request id."""

Response = (
    ProduceResponse
    | ConsumeResponse
    | CreateTopicResponse
    | DiscoverPartitionsResponse
    | ReloadConfResponse
    | StatusResponse
    | DiscoverTopicsResponse
    | DiscoverTopologyResponse
)
"""Every message a broker sends in answer to a request."""

Message = Request | Response | Ping
"""Everything ``encode`` and ``TankConnection.send`` accept."""

Event = Request | Response | Ping | ConnectionClosed
"""Everything ``TankConnection.events`` yields."""
