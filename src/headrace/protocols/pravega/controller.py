"""The controller API's vocabulary: its value types, naming rules and message conversions.

The client (``headrace.client.controller``) and the controller
(``headrace.controller``) speak the same gRPC messages (``controller.proto``);
what those messages carry is defined here once, as frozen dataclasses with the
messages' field names in snake case, so that both sides build and read them
alike. Pure: no I/O, only the generated message classes.

Naming rules, fixed by the real clients, which build the same strings and ids
themselves (``docs/protocols/pravega-controller.md#naming``):

* segment id (int64) = ``epoch << 32 | segment_number``, both parts >= 0,
  where ``epoch`` is the epoch that **created** the segment;
* qualified segment name ``<scope>/<stream>/<number>.#epoch.<epoch>``;
* transaction segment name ``<parent name>#transaction.<32 hex digits>``:
  the 16 hex digits of ``TxnId.highBits`` then of ``lowBits``, lower case,
  two's complement;
* transaction id: ``highBits = epoch << 32``, ``lowBits`` = a per-stream
  counter that stays below 2**63 (the client sign-extends ``lowBits``, so a
  negative value would corrupt the id it rebuilds).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field

from . import controller_pb2 as pb

__all__ = [
    "INT64_MAX",
    "KVTABLE_SUFFIX",
    "MAX_SEGMENT_NUMBER",
    "GroupRetention",
    "KeyValueTableConfig",
    "ReaderGroupConfig",
    "RetentionPolicy",
    "RetentionType",
    "ScalingPolicy",
    "ScalingType",
    "Segment",
    "SegmentRange",
    "StreamConfig",
    "TxnId",
    "TxnState",
    "config_from_proto",
    "config_to_proto",
    "kvtable_config_from_proto",
    "kvtable_config_to_proto",
    "kvtable_segment_name",
    "reader_group_config_from_proto",
    "reader_group_config_to_proto",
    "segment_epoch",
    "segment_id",
    "segment_name",
    "segment_number",
    "transaction_segment_name",
    "txn_id_from_proto",
    "txn_id_to_proto",
]

INT64_MAX = 2**63 - 1
"""The largest proto int64: the ``retentionMax`` of a policy without an upper bound."""

MAX_SEGMENT_NUMBER = 2**31 - 1
"""Segment numbers and epochs are the two non-negative int32 halves of an int64 id."""

_INT64_MASK = 2**64 - 1


# --------------------------------------------------------------------------- naming


def segment_id(epoch: int, number: int) -> int:
    """The 64-bit segment id of segment ``number`` created in ``epoch``."""
    assert 0 <= epoch <= MAX_SEGMENT_NUMBER and 0 <= number <= MAX_SEGMENT_NUMBER
    return epoch << 32 | number


def segment_number(sid: int) -> int:
    return sid & 0xFFFFFFFF


def segment_epoch(sid: int) -> int:
    return sid >> 32


def segment_name(scope: str, stream: str, sid: int) -> str:
    """``<scope>/<stream>/<number>.#epoch.<epoch>``, e.g. ``sc/st/0.#epoch.0``."""
    return f"{scope}/{stream}/{segment_number(sid)}.#epoch.{segment_epoch(sid)}"


def transaction_segment_name(parent: str, txn: TxnId) -> str:
    """``<parent>#transaction.<32 hex>``: where a transaction's events for ``parent`` go."""
    return f"{parent}#transaction.{txn.hex}"


@dataclass(frozen=True, slots=True, order=True)
class Segment:
    """One segment of a stream: scope, stream and 64-bit id (``epoch << 32 | number``).

    ``name`` is the qualified name the segment store knows it by, e.g.
    ``sc/st/3.#epoch.1``.
    """

    scope: str
    stream: str
    segment_id: int

    @property
    def number(self) -> int:
        return segment_number(self.segment_id)

    @property
    def epoch(self) -> int:
        return segment_epoch(self.segment_id)

    @property
    def name(self) -> str:
        return segment_name(self.scope, self.stream, self.segment_id)

    @classmethod
    def parse(cls, name: str) -> Segment:
        """The segment named by a qualified name ``scope/stream/n.#epoch.e``.

        Raises:
            ValueError: not such a name.
        """
        scope, stream, last = name.split("/")
        number, _, epoch = last.partition(".#epoch.")
        return cls(scope, stream, (int(epoch or 0) << 32) | int(number))

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True, slots=True)
class SegmentRange:
    """A segment and the part ``[min_key, max_key)`` of the key space it owns."""

    segment: Segment
    min_key: float
    max_key: float


# --------------------------------------------------------------------------- streams


class ScalingType(enum.IntEnum):
    """``ScalingPolicy.ScalingPolicyType`` values."""

    FIXED_NUM_SEGMENTS = 0
    BY_RATE_IN_KBYTES_PER_SEC = 1
    BY_RATE_IN_EVENTS_PER_SEC = 2


class RetentionType(enum.IntEnum):
    """``RetentionPolicy.RetentionPolicyType`` values; ``UNKNOWN`` means no retention."""

    UNKNOWN = 0
    TIME = 1
    SIZE = 2


@dataclass(frozen=True, slots=True)
class ScalingPolicy:
    """How many segments a stream has and when it scales (``ScalingPolicy`` message)."""

    scale_type: ScalingType = ScalingType.FIXED_NUM_SEGMENTS
    target_rate: int = 0
    scale_factor: int = 0
    min_num_segments: int = 1

    @classmethod
    def fixed(cls, segments: int) -> ScalingPolicy:
        """A fixed number of segments: the stream never scales by itself."""
        return cls(min_num_segments=segments)


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """How much a stream keeps (``RetentionPolicy`` message): nothing is dropped
    (``UNKNOWN``), or by time (``retention_param`` ms) or by size
    (``retention_param`` bytes), at most ``retention_max``."""

    retention_type: RetentionType = RetentionType.UNKNOWN
    retention_param: int = 0
    retention_max: int = INT64_MAX


@dataclass(frozen=True, slots=True)
class StreamConfig:
    """What a user configures on a stream (``StreamConfig`` minus its ``streamInfo``)."""

    scaling: ScalingPolicy = field(default_factory=ScalingPolicy)
    retention: RetentionPolicy = field(default_factory=RetentionPolicy)
    tags: tuple[str, ...] = ()


def config_to_proto(scope: str, stream: str, config: StreamConfig) -> pb.StreamConfig:
    """The ``StreamConfig`` message of ``scope/stream`` (no ``tags`` field without tags)."""
    msg = pb.StreamConfig(
        streamInfo=pb.StreamInfo(scope=scope, stream=stream),
        scalingPolicy=pb.ScalingPolicy(
            scaleType=int(config.scaling.scale_type),  # type: ignore[arg-type]
            targetRate=config.scaling.target_rate,
            scaleFactor=config.scaling.scale_factor,
            minNumSegments=config.scaling.min_num_segments,
        ),
        retentionPolicy=pb.RetentionPolicy(
            retentionType=int(config.retention.retention_type),  # type: ignore[arg-type]
            retentionParam=config.retention.retention_param,
            retentionMax=config.retention.retention_max,
        ),
    )
    if config.tags:
        msg.tags.tag.extend(config.tags)
    return msg


def config_from_proto(msg: pb.StreamConfig) -> StreamConfig:
    """The configuration a ``StreamConfig`` message carries; a message without a
    retention policy means none (an absent message field reads as zeros).

    Raises:
        ValueError: a scaling or retention type this API does not define.
    """
    sp, rp = msg.scalingPolicy, msg.retentionPolicy
    scale_type = ScalingType(sp.scaleType)
    retention = (
        RetentionPolicy(RetentionType(rp.retentionType), rp.retentionParam, rp.retentionMax)
        if msg.HasField("retentionPolicy")
        else RetentionPolicy()
    )
    return StreamConfig(
        scaling=ScalingPolicy(scale_type, sp.targetRate, sp.scaleFactor, sp.minNumSegments),
        retention=retention,
        tags=tuple(msg.tags.tag),
    )


# --------------------------------------------------------------------------- key-value tables

KVTABLE_SUFFIX = "_kvtable"
"""A key-value table ``T`` keeps its partitions in the pseudo-stream ``T_kvtable``
(Java's ``NameUtils.getQualifiedTableSegmentName``)."""


def kvtable_segment_name(scope: str, table: str, partition: int) -> str:
    """``<scope>/<table>_kvtable/<partition>.#epoch.0``: partition ``partition``
    of a key-value table (partitions are created in epoch 0 and never scale)."""
    return segment_name(scope, table + KVTABLE_SUFFIX, partition)


@dataclass(frozen=True, slots=True)
class KeyValueTableConfig:
    """A key-value table's shape (``KeyValueTableConfig`` minus its names).

    A key is ``primary_key_length`` bytes of primary key followed by
    ``secondary_key_length`` bytes of secondary key; the primary key alone picks
    the partition, so all keys of one primary key share a partition and can be
    updated together. ``rollover_size_bytes`` is recorded (0: the server's default).
    """

    partition_count: int = 1
    primary_key_length: int = 1
    secondary_key_length: int = 0
    rollover_size_bytes: int = 0

    @property
    def key_length(self) -> int:
        return self.primary_key_length + self.secondary_key_length


def kvtable_config_to_proto(
    scope: str, table: str, config: KeyValueTableConfig
) -> pb.KeyValueTableConfig:
    return pb.KeyValueTableConfig(
        scope=scope,
        kvtName=table,
        partitionCount=config.partition_count,
        primaryKeyLength=config.primary_key_length,
        secondaryKeyLength=config.secondary_key_length,
        rolloverSizeBytes=config.rollover_size_bytes,
    )


def kvtable_config_from_proto(msg: pb.KeyValueTableConfig) -> KeyValueTableConfig:
    return KeyValueTableConfig(
        partition_count=msg.partitionCount,
        primary_key_length=msg.primaryKeyLength,
        secondary_key_length=msg.secondaryKeyLength,
        rollover_size_bytes=msg.rolloverSizeBytes,
    )


# --------------------------------------------------------------------------- transactions


@dataclass(frozen=True, slots=True, order=True)
class TxnId:
    """A 128-bit transaction id as the two signed int64 halves of ``TxnId`` messages."""

    high_bits: int
    low_bits: int

    @classmethod
    def new(cls, epoch: int, counter: int) -> TxnId:
        """The id of a stream's ``counter``-th transaction, created in ``epoch``."""
        assert 0 <= epoch <= MAX_SEGMENT_NUMBER and 0 <= counter < 2**63
        return cls(epoch << 32, counter)

    @property
    def epoch(self) -> int:
        """The epoch the transaction was created in (id bits 127..96)."""
        return (self.high_bits & _INT64_MASK) >> 32

    @property
    def hex(self) -> str:
        """32 lower-case hex digits, two's complement of each half (the segment suffix)."""
        return f"{self.high_bits & _INT64_MASK:016x}{self.low_bits & _INT64_MASK:016x}"

    def segment_name(self, parent: Segment) -> str:
        """The name of this transaction's segment for ``parent``."""
        return transaction_segment_name(parent.name, self)


def txn_id_to_proto(txn: TxnId) -> pb.TxnId:
    return pb.TxnId(highBits=txn.high_bits, lowBits=txn.low_bits)


def txn_id_from_proto(msg: pb.TxnId) -> TxnId:
    return TxnId(msg.highBits, msg.lowBits)


class TxnState(enum.IntEnum):
    """A transaction's state, with the values of ``TxnState.State``.

    The controller records ``COMMITTING``/``ABORTING`` before the store work
    starts, so a restart finishes what was begun; ``UNKNOWN`` is only ever
    an answer (no such transaction).
    """

    UNKNOWN = 0
    OPEN = 1
    COMMITTING = 2
    COMMITTED = 3
    ABORTING = 4
    ABORTED = 5


# --------------------------------------------------------------------------- reader groups


class GroupRetention(enum.IntEnum):
    """``ReaderGroupConfiguration.RetentionType``: whether a reader group holds back
    the retention of the streams it reads (a *subscriber*), and who reports its
    stream cuts: nobody (NONE), the application (MANUAL), or the readers at
    each checkpoint (AUTOMATIC)."""

    NONE = 0
    MANUAL = 1
    AUTOMATIC = 2


@dataclass(frozen=True, slots=True)
class ReaderGroupConfig:
    """A ``ReaderGroupConfiguration``: the streams a group reads, by scoped name
    ``<scope>/<stream>``, each with the stream cut it starts at (``start``) and,
    optionally, ends at (``end``); an empty cut is unbounded (the head, the tail).
    ``group_id`` and ``generation`` are the controller's (empty and 0 to create)."""

    scope: str
    group: str
    start: dict[str, dict[int, int]]
    end: dict[str, dict[int, int]] = field(default_factory=dict)
    retention: GroupRetention = GroupRetention.NONE
    refresh_ms: int = 3000
    checkpoint_ms: int = 30000
    max_outstanding_checkpoints: int = 3
    group_id: str = ""
    generation: int = 0


def _cuts_to_proto(cuts: dict[str, dict[int, int]]) -> list[pb.StreamCut]:
    out = []
    for name, cut in sorted(cuts.items()):
        scope, _, stream = name.partition("/")
        out.append(pb.StreamCut(streamInfo=pb.StreamInfo(scope=scope, stream=stream), cut=cut))
    return out


def _cuts_from_proto(cuts: Iterable[pb.StreamCut]) -> dict[str, dict[int, int]]:
    return {f"{c.streamInfo.scope}/{c.streamInfo.stream}": dict(c.cut.items()) for c in cuts}


def reader_group_config_to_proto(config: ReaderGroupConfig) -> pb.ReaderGroupConfiguration:
    return pb.ReaderGroupConfiguration(
        scope=config.scope,
        readerGroupName=config.group,
        groupRefreshTimeMillis=config.refresh_ms,
        automaticCheckpointIntervalMillis=config.checkpoint_ms,
        maxOutstandingCheckpointRequest=config.max_outstanding_checkpoints,
        retentionType=int(config.retention),
        generation=config.generation,
        readerGroupId=config.group_id,
        startingStreamCuts=_cuts_to_proto(config.start),
        endingStreamCuts=_cuts_to_proto(config.end),
    )


def reader_group_config_from_proto(msg: pb.ReaderGroupConfiguration) -> ReaderGroupConfig:
    """Raises: ValueError: a retention type this API does not define."""
    return ReaderGroupConfig(
        scope=msg.scope,
        group=msg.readerGroupName,
        start=_cuts_from_proto(msg.startingStreamCuts),
        end=_cuts_from_proto(msg.endingStreamCuts),
        retention=GroupRetention(msg.retentionType),
        refresh_ms=msg.groupRefreshTimeMillis,
        checkpoint_ms=msg.automaticCheckpointIntervalMillis,
        max_outstanding_checkpoints=msg.maxOutstandingCheckpointRequest,
        group_id=msg.readerGroupId,
        generation=msg.generation,
    )
