"""Pravega segment-store wire commands: type codes and one frozen dataclass per command.

This module is the vocabulary of the protocol and nothing else: no bytes are
read or written here (that is ``codec.py``), no state is kept (that is
``connection.py`` / ``states.py``). Class names and field names follow the
Java server's ``WireCommands.java`` (pravega/pravega,
``shared/protocol/src/main/java/io/pravega/shared/protocol/netty/``), and
fields are declared in wire order, so that code and upstream can be searched
together. Layouts and rules: ``docs/protocols/pravega.md#commands``; a
reference such as ``pravega.md#segments`` below names an anchor of that page.

Every command class carries two class attributes:

* ``type``: its :class:`CommandType` (the frame's type code);
* ``direction``: who may send it (:class:`Direction`).

Fields that a peer may omit at the end of a frame (marked *opt* in pravega.md#commands) have
defaults; the codec fills them in when they are absent and always writes them.
Lists are tuples so that commands stay hashable and immutable.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import ClassVar
from uuid import UUID

from headrace.types import NO_VERSION, NOT_EXISTS, NULL_ATTRIBUTE_VALUE

__all__ = [
    "NOT_EXISTS",
    "NO_VERSION",
    "NULL_ATTRIBUTE_VALUE",
    "NULL_TABLE_SEGMENT_OFFSET",
    "AppendBlock",
    "AppendBlockEnd",
    "AppendSetup",
    "AuthTokenCheckFailed",
    "ChunkInfo",
    "Command",
    "CommandType",
    "ConditionalAppend",
    "ConditionalAttributeUpdate",
    "ConditionalBlockEnd",
    "ConditionalCheckFailed",
    "CreateSegment",
    "CreateTableSegment",
    "CreateTransientSegment",
    "DataAppended",
    "DeleteSegment",
    "DeleteTableSegment",
    "Direction",
    "ErrorMessage",
    "Event",
    "FlushToStorage",
    "GetSegmentAttribute",
    "GetStreamSegmentInfo",
    "GetTableSegmentInfo",
    "Hello",
    "InvalidEventNumber",
    "KeepAlive",
    "ListStorageChunks",
    "LocateOffset",
    "MergeSegments",
    "MergeSegmentsBatch",
    "MergeTableSegments",
    "NoSuchSegment",
    "OffsetLocated",
    "OperationUnsupported",
    "Padding",
    "PartialEvent",
    "ReadSegment",
    "ReadSegmentTimes",
    "ReadTable",
    "ReadTableEntries",
    "ReadTableEntriesDelta",
    "ReadTableKeys",
    "RemoveTableKeys",
    "SealSegment",
    "SealTableSegment",
    "SegmentAlreadyExists",
    "SegmentAttribute",
    "SegmentAttributeUpdated",
    "SegmentCreated",
    "SegmentDeleted",
    "SegmentIsSealed",
    "SegmentIsTruncated",
    "SegmentPolicyUpdated",
    "SegmentRead",
    "SegmentSealed",
    "SegmentTimesRead",
    "SegmentTruncated",
    "SegmentsBatchMerged",
    "SegmentsMerged",
    "SetupAppend",
    "StorageChunksListed",
    "StorageFlushed",
    "StreamSegmentInfo",
    "TableEntries",
    "TableEntriesDeltaRead",
    "TableEntriesRead",
    "TableEntriesUpdated",
    "TableIteratorArgs",
    "TableKey",
    "TableKeyBadVersion",
    "TableKeyDoesNotExist",
    "TableKeysRead",
    "TableKeysRemoved",
    "TableRead",
    "TableSegmentInfo",
    "TableSegmentNotEmpty",
    "TableValue",
    "TruncateSegment",
    "UpdateSegmentAttribute",
    "UpdateSegmentPolicy",
    "UpdateTableEntries",
    "WrongHost",
]

NULL_TABLE_SEGMENT_OFFSET = -1
"""``table_segment_offset`` meaning "no condition on the table's length"
(pravega.md#table-semantics)."""


class CommandType(enum.IntEnum):
    """Frame type codes (pravega.md#commands). Sent as a big-endian i32; all fit in a signed
    byte."""

    # Hashed as the int it equals (dict lookups per frame), not Enum's hash of the
    # name: a C slot instead of a Python call, and consistent with ``==`` on ints.
    __hash__ = int.__hash__

    HELLO = -127
    """Handshake, both directions."""
    PADDING = -1
    """Zero bytes closing a Java append block early."""
    PARTIAL_EVENT = -2
    """First part of an event straddling a Java append block."""
    FLUSH_TO_STORAGE = -3
    """Admin: flush a container to long-term storage."""
    STORAGE_FLUSHED = -4
    """Admin reply to FlushToStorage."""
    LIST_STORAGE_CHUNKS = -5
    """Admin: list a segment's storage chunks."""
    STORAGE_CHUNKS_LISTED = -6
    """Admin reply to ListStorageChunks."""
    EVENT = 0
    """One event's framing inside append data and segment bytes."""
    SETUP_APPEND = 1
    """Open a writer session on a segment."""
    APPEND_SETUP = 2
    """Reply to SetupAppend with the writer's last event number."""
    APPEND_BLOCK = 3
    """Java append block header plus block bytes."""
    APPEND_BLOCK_END = 4
    """End of an append block; the Rust client sends it alone, data inline."""
    CONDITIONAL_APPEND = 5
    """Append one event if the segment has the expected length."""
    DATA_APPENDED = 7
    """Acknowledgement of durable appends. There is no code 6."""
    CONDITIONAL_CHECK_FAILED = 8
    """A conditional append found another segment length."""
    READ_SEGMENT = 9
    """Read bytes from a segment."""
    SEGMENT_READ = 10
    """Reply to ReadSegment."""
    GET_STREAM_SEGMENT_INFO = 11
    """Segment metadata request."""
    STREAM_SEGMENT_INFO = 12
    """Reply to GetStreamSegmentInfo."""
    CREATE_SEGMENT = 20
    """Create a stream segment."""
    SEGMENT_CREATED = 21
    """Reply to CreateSegment, CreateTableSegment, CreateTransientSegment."""
    SEAL_SEGMENT = 28
    """Seal a segment."""
    SEGMENT_SEALED = 29
    """Reply to SealSegment."""
    DELETE_SEGMENT = 30
    """Delete a segment."""
    SEGMENT_DELETED = 31
    """Reply to DeleteSegment and DeleteTableSegment."""
    UPDATE_SEGMENT_POLICY = 32
    """Change a segment's scaling policy."""
    SEGMENT_POLICY_UPDATED = 33
    """Reply to UpdateSegmentPolicy."""
    GET_SEGMENT_ATTRIBUTE = 34
    """Read one segment attribute."""
    SEGMENT_ATTRIBUTE = 35
    """Reply to GetSegmentAttribute."""
    UPDATE_SEGMENT_ATTRIBUTE = 36
    """Compare-and-set one segment attribute."""
    SEGMENT_ATTRIBUTE_UPDATED = 37
    """Reply to UpdateSegmentAttribute."""
    TRUNCATE_SEGMENT = 38
    """Move a segment's start offset forward."""
    SEGMENT_TRUNCATED = 39
    """Reply to TruncateSegment."""
    CREATE_TRANSIENT_SEGMENT = 40
    """Create a transient segment for a large event."""
    LOCATE_OFFSET = 41
    """Java only: locate an offset in a segment."""
    OFFSET_LOCATED = 42
    """Reply to LocateOffset."""
    WRONG_HOST = 50
    """Error: the segment is owned by another node."""
    SEGMENT_IS_SEALED = 51
    """Error: the segment is sealed."""
    SEGMENT_ALREADY_EXISTS = 52
    """Error: the segment exists already."""
    NO_SUCH_SEGMENT = 53
    """Error: the segment does not exist."""
    INVALID_EVENT_NUMBER = 55
    """Error: a writer's event number is stale; layouts differ. No code 54."""
    SEGMENT_IS_TRUNCATED = 56
    """Error: a read below the segment's start offset."""
    OPERATION_UNSUPPORTED = 57
    """Error: the server does not implement the request."""
    MERGE_SEGMENTS = 58
    """Append one segment's bytes to another and delete the source."""
    SEGMENTS_MERGED = 59
    """Reply to MergeSegments."""
    AUTH_TOKEN_CHECK_FAILED = 60
    """Error: the delegation token was refused."""
    ERROR_MESSAGE = 61
    """Error: generic message with a code."""
    GET_TABLE_SEGMENT_INFO = 68
    """Table segment metadata request."""
    TABLE_SEGMENT_INFO = 69
    """Reply to GetTableSegmentInfo, Java layout."""
    CREATE_TABLE_SEGMENT = 70
    """Create a table segment."""
    DELETE_TABLE_SEGMENT = 71
    """Delete a table segment."""
    MERGE_TABLE_SEGMENTS = 72
    """Rust enum only, removed from Java."""
    SEAL_TABLE_SEGMENT = 73
    """Rust enum only, removed from Java."""
    UPDATE_TABLE_ENTRIES = 74
    """Conditional batch update of table entries."""
    TABLE_ENTRIES_UPDATED = 75
    """Reply to UpdateTableEntries: the new versions."""
    REMOVE_TABLE_KEYS = 76
    """Conditional batch removal of table keys."""
    TABLE_KEYS_REMOVED = 77
    """Reply to RemoveTableKeys."""
    READ_TABLE = 78
    """Read the entries of given keys."""
    TABLE_READ = 79
    """Reply to ReadTable."""
    TABLE_SEGMENT_NOT_EMPTY = 80
    """Error: DeleteTableSegment(must_be_empty) on a non-empty table."""
    TABLE_KEY_DOES_NOT_EXIST = 81
    """Error: a conditional table operation named an absent key."""
    TABLE_KEY_BAD_VERSION = 82
    """Error: a conditional table operation expected another version."""
    READ_TABLE_KEYS = 83
    """Iterate over table keys."""
    TABLE_KEYS_READ = 84
    """Reply to ReadTableKeys."""
    READ_TABLE_ENTRIES = 85
    """Iterate over table entries."""
    TABLE_ENTRIES_READ = 86
    """Reply to ReadTableEntries."""
    TABLE_ENTRIES_DELTA_READ = 87
    """Reply to ReadTableEntriesDelta: the reply is 87."""
    READ_TABLE_ENTRIES_DELTA = 88
    """Read table changes from a log position: the request is 88."""
    CONDITIONAL_BLOCK_END = 89
    """Conditional append of raw bytes: ByteStream writes, large-event chunks."""
    MERGE_SEGMENTS_BATCH = 90
    """Merge several sources into one target."""
    SEGMENTS_BATCH_MERGED = 91
    """Reply to MergeSegmentsBatch, Java layout."""
    KEEP_ALIVE = 100
    """Idle-connection probe, echoed by the server."""
    READ_SEGMENT_TIMES = 150
    """headrace extension: the append-time index entries covering a range of a segment."""
    SEGMENT_TIMES_READ = 151
    """headrace extension: reply to ReadSegmentTimes."""


class Direction(enum.Enum):
    """Who may put a command on the wire as a frame of its own ("dir")."""

    REQUEST = "client to server"
    REPLY = "server to client"
    BOTH = "both directions"
    EMBEDDED = "only inside append data"
    """Event, PartialEvent and Padding frames live inside AppendBlock data
    (pravega.md#java-append-blocks)."""


class Command:
    """Base of every wire command; subclasses are frozen, slotted dataclasses."""

    __slots__ = ()
    type: ClassVar[CommandType]
    direction: ClassVar[Direction]

    @property
    def request_id_or_default(self) -> int:
        """The command's request id: its ``request_id`` field, 0 for Hello (pravega.md#request-ids),
        else -1 (KeepAlive by definition, and frames that carry none)."""
        request_id = getattr(self, "request_id", None)
        if isinstance(request_id, int):
            return request_id
        return 0 if self.type == CommandType.HELLO else -1

    @property
    def segment_or_none(self) -> str | None:
        """The segment a request names, exactly as sent, for error replies (pravega.md#errors).

        ``segment``, ``segment_name``, ``target`` (merges) or
        ``parent_segment`` (CreateTransientSegment), whichever the command has.
        """
        for name in ("segment", "segment_name", "target", "parent_segment"):
            value = getattr(self, name, None)
            if isinstance(value, str):
                return value
        return None


# --------------------------------------------------------------------------- auxiliary structures


@dataclass(frozen=True, slots=True)
class TableKey:
    """A table key with its version (pravega.md#table-keys).

    On the wire: ``payload:i32`` (= 4 + len(key) + 8, a redundant size hint),
    ``key:bytes``, ``version:i64``. An empty key is written the Java way,
    without the version (see ``codec.py``); it therefore always has
    ``NO_VERSION``.

    Attributes:
        key: the key bytes (opaque to the server).
        version: ``NO_VERSION`` (unconditional), ``NOT_EXISTS`` (must be
            absent / absent) or the key's version (>= 0).
    """

    key: bytes
    version: int = NO_VERSION


@dataclass(frozen=True, slots=True)
class TableValue:
    """A table value (pravega.md#table-keys): ``payload:i32`` (= 4 + len(value)),
    ``value:bytes``."""

    value: bytes


@dataclass(frozen=True, slots=True)
class TableEntries:
    """A list of (key, value) pairs (pravega.md#table-keys): ``count:i32``, then each TableKey and
    TableValue."""

    entries: tuple[tuple[TableKey, TableValue], ...] = ()


@dataclass(frozen=True, slots=True)
class TableIteratorArgs:
    """Java's iterator arguments (pravega.md#table-keys): four byte arrays, each optional at the
    frame's end.

    The Rust client sends only ``continuation_token``; ``prefix_filter`` is
    always empty (deprecated by Java, which writes an empty one).
    """

    continuation_token: bytes = b""
    prefix_filter: bytes = b""
    from_key: bytes = b""
    to_key: bytes = b""


@dataclass(frozen=True, slots=True)
class ConditionalAttributeUpdate:
    """One attribute update carried by MergeSegments (pravega.md#segments); 33 bytes on the wire."""

    REPLACE: ClassVar[int] = 1
    REPLACE_IF_EQUALS: ClassVar[int] = 4

    attribute_id: UUID
    update_type: int
    new_value: int
    old_value: int


@dataclass(frozen=True, slots=True)
class ChunkInfo:
    """One storage chunk listed by StorageChunksListed (pravega.md#segments)."""

    length_in_metadata: int
    length_in_storage: int
    start_offset: int
    chunk_name: str
    exists_in_storage: bool


# ----------------------------------------------------------------- handshake (pravega.md#handshake)


@dataclass(frozen=True, slots=True)
class Hello(Command):
    """Version handshake; the request id of a Hello is defined as 0."""

    type: ClassVar[CommandType] = CommandType.HELLO
    direction: ClassVar[Direction] = Direction.BOTH

    high_version: int
    low_version: int


@dataclass(frozen=True, slots=True)
class KeepAlive(Command):
    """Empty probe; the server echoes it. Its request id is defined as -1
    (pravega.md#request-ids)."""

    type: ClassVar[CommandType] = CommandType.KEEP_ALIVE
    direction: ClassVar[Direction] = Direction.BOTH


# --------------------------------------------------------------------- appends (pravega.md#appends)


@dataclass(frozen=True, slots=True)
class Event(Command):
    """One event frame (pravega.md#event-framing): ``00000000``, i32 length, the event's bytes.

    Events are stored in segments in this framing. As a frame of its own it is
    only valid inside append data; ConditionalAppend embeds one.
    """

    type: ClassVar[CommandType] = CommandType.EVENT
    direction: ClassVar[Direction] = Direction.EMBEDDED

    data: bytes


@dataclass(frozen=True, slots=True)
class Padding(Command):
    """``length`` zero bytes filling a Java append block closed early
    (pravega.md#java-append-blocks)."""

    type: ClassVar[CommandType] = CommandType.PADDING
    direction: ClassVar[Direction] = Direction.EMBEDDED

    length: int


@dataclass(frozen=True, slots=True)
class PartialEvent(Command):
    """The first part of an event that did not fit in a Java append block
    (pravega.md#java-append-blocks)."""

    type: ClassVar[CommandType] = CommandType.PARTIAL_EVENT
    direction: ClassVar[Direction] = Direction.EMBEDDED

    data: bytes


@dataclass(frozen=True, slots=True)
class SetupAppend(Command):
    """Open writer ``writer_id``'s session on ``segment`` (pravega.md#append-sessions)."""

    type: ClassVar[CommandType] = CommandType.SETUP_APPEND
    direction: ClassVar[Direction] = Direction.REQUEST

    request_id: int
    writer_id: UUID
    segment: str
    delegation_token: str = ""


@dataclass(frozen=True, slots=True)
class AppendSetup(Command):
    """Reply to SetupAppend; note the field order differs from SetupAppend."""

    type: ClassVar[CommandType] = CommandType.APPEND_SETUP
    direction: ClassVar[Direction] = Direction.REPLY

    request_id: int
    segment: str
    writer_id: UUID
    last_event_number: int


@dataclass(frozen=True, slots=True)
class AppendBlock(Command):
    """Java append block (pravega.md#java-append-blocks): writer id, then the block bytes (the rest
    of the frame).

    ``data`` is a run of whole Event frames, optionally ending with one
    PartialEvent or Padding frame.
    """

    type: ClassVar[CommandType] = CommandType.APPEND_BLOCK
    direction: ClassVar[Direction] = Direction.REQUEST

    writer_id: UUID
    data: bytes | memoryview  # a view of the received frame when it is large


@dataclass(frozen=True, slots=True)
class AppendBlockEnd(Command):
    """End of an append block; the Rust client sends it alone with the events inline."""

    type: ClassVar[CommandType] = CommandType.APPEND_BLOCK_END
    direction: ClassVar[Direction] = Direction.REQUEST

    writer_id: UUID
    size_of_whole_events: int
    data: bytes | memoryview  # a view of the received frame when it is large
    num_events: int
    last_event_number: int
    request_id: int = -1  # opt: old Java clients omit it


@dataclass(frozen=True, slots=True)
class ConditionalAppend(Command):
    """Append one event if the segment length equals ``expected_offset``
    (pravega.md#append-sessions)."""

    type: ClassVar[CommandType] = CommandType.CONDITIONAL_APPEND
    direction: ClassVar[Direction] = Direction.REQUEST

    writer_id: UUID
    event_number: int
    expected_offset: int
    event: Event
    request_id: int = -1  # opt in Java's reader


@dataclass(frozen=True, slots=True)
class ConditionalBlockEnd(Command):
    """Append raw ``data`` if the segment length equals ``expected_offset``
    (pravega.md#large-events)."""

    type: ClassVar[CommandType] = CommandType.CONDITIONAL_BLOCK_END
    direction: ClassVar[Direction] = Direction.REQUEST

    writer_id: UUID
    event_number: int
    expected_offset: int
    data: bytes | memoryview  # a view of the received frame when it is large
    request_id: int


@dataclass(frozen=True, slots=True)
class DataAppended(Command):
    """Durable-append acknowledgement; ``request_id`` comes after the event numbers."""

    type: ClassVar[CommandType] = CommandType.DATA_APPENDED
    direction: ClassVar[Direction] = Direction.REPLY

    writer_id: UUID
    event_number: int
    previous_event_number: int = NULL_ATTRIBUTE_VALUE
    request_id: int = -1
    current_segment_write_offset: int = -1


@dataclass(frozen=True, slots=True)
class ConditionalCheckFailed(Command):
    """A conditional append found another segment length (pravega.md#append-sessions)."""

    type: ClassVar[CommandType] = CommandType.CONDITIONAL_CHECK_FAILED
    direction: ClassVar[Direction] = Direction.REPLY

    writer_id: UUID
    event_number: int
    request_id: int = -1


@dataclass(frozen=True, slots=True)
class CreateTransientSegment(Command):
    """Create a transient segment under ``parent_segment`` for a large event
    (pravega.md#large-events)."""

    type: ClassVar[CommandType] = CommandType.CREATE_TRANSIENT_SEGMENT
    direction: ClassVar[Direction] = Direction.REQUEST

    request_id: int
    writer_id: UUID
    parent_segment: str
    delegation_token: str = ""


# ------------------------------------------------------------------------- reads (pravega.md#reads)


@dataclass(frozen=True, slots=True)
class ReadSegment(Command):
    """Read up to about ``suggested_length`` bytes from ``offset``."""

    type: ClassVar[CommandType] = CommandType.READ_SEGMENT
    direction: ClassVar[Direction] = Direction.REQUEST

    segment: str
    offset: int
    suggested_length: int
    delegation_token: str = ""
    request_id: int = -1  # opt in Java's reader


@dataclass(frozen=True, slots=True)
class SegmentRead(Command):
    """Reply to ReadSegment; ``offset`` must echo the request's offset."""

    type: ClassVar[CommandType] = CommandType.SEGMENT_READ
    direction: ClassVar[Direction] = Direction.REPLY

    segment: str
    offset: int
    at_tail: bool
    end_of_segment: bool
    data: bytes | memoryview  # a view of the received frame when it is large
    request_id: int = -1


# --------------------------------------------------------- segment management (pravega.md#segments)


@dataclass(frozen=True, slots=True)
class ReadSegmentTimes(Command):
    """headrace extension (pravega.md#segment-times): when the bytes of
    ``[offset, end)`` of a stream segment were appended."""

    type: ClassVar[CommandType] = CommandType.READ_SEGMENT_TIMES
    direction: ClassVar[Direction] = Direction.REQUEST

    request_id: int
    segment: str
    offset: int
    end: int
    delegation_token: str = ""


@dataclass(frozen=True, slots=True)
class SegmentTimesRead(Command):
    """Reply to ReadSegmentTimes: ``times`` is ``offset, ms, offset, ms, ...``,
    the time index entries that give the append time of every event in the
    range (the last one at or below ``offset`` and each one inside)."""

    type: ClassVar[CommandType] = CommandType.SEGMENT_TIMES_READ
    direction: ClassVar[Direction] = Direction.REPLY

    request_id: int
    segment: str
    times: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class GetStreamSegmentInfo(Command):
    """Segment metadata request."""

    type: ClassVar[CommandType] = CommandType.GET_STREAM_SEGMENT_INFO
    direction: ClassVar[Direction] = Direction.REQUEST

    request_id: int
    segment_name: str
    delegation_token: str = ""


@dataclass(frozen=True, slots=True)
class StreamSegmentInfo(Command):
    """Segment metadata; ``write_offset`` is the length, ``last_modified`` in ms."""

    type: ClassVar[CommandType] = CommandType.STREAM_SEGMENT_INFO
    direction: ClassVar[Direction] = Direction.REPLY

    request_id: int
    segment_name: str
    exists: bool
    is_sealed: bool
    is_deleted: bool
    last_modified: int
    write_offset: int
    start_offset: int = 0  # opt in Java's reader; always written


@dataclass(frozen=True, slots=True)
class CreateSegment(Command):
    """Create a stream segment; ``scale_type`` 0 none, 1 KiB/s, 2 events/s."""

    NO_SCALE: ClassVar[int] = 0
    IN_KBYTES_PER_SEC: ClassVar[int] = 1
    IN_EVENTS_PER_SEC: ClassVar[int] = 2

    type: ClassVar[CommandType] = CommandType.CREATE_SEGMENT
    direction: ClassVar[Direction] = Direction.REQUEST

    request_id: int
    segment: str
    target_rate: int
    scale_type: int
    delegation_token: str = ""
    rollover_size_bytes: int = 0  # opt: the Rust client omits it


@dataclass(frozen=True, slots=True)
class SegmentCreated(Command):
    """Reply to CreateSegment / CreateTableSegment / CreateTransientSegment
    (pravega.md#large-events)."""

    type: ClassVar[CommandType] = CommandType.SEGMENT_CREATED
    direction: ClassVar[Direction] = Direction.REPLY

    request_id: int
    segment: str


@dataclass(frozen=True, slots=True)
class SealSegment(Command):
    """Seal a segment."""

    type: ClassVar[CommandType] = CommandType.SEAL_SEGMENT
    direction: ClassVar[Direction] = Direction.REQUEST

    request_id: int
    segment: str
    delegation_token: str = ""


@dataclass(frozen=True, slots=True)
class SegmentSealed(Command):
    """Reply to SealSegment."""

    type: ClassVar[CommandType] = CommandType.SEGMENT_SEALED
    direction: ClassVar[Direction] = Direction.REPLY

    request_id: int
    segment: str


@dataclass(frozen=True, slots=True)
class DeleteSegment(Command):
    """Delete a segment."""

    type: ClassVar[CommandType] = CommandType.DELETE_SEGMENT
    direction: ClassVar[Direction] = Direction.REQUEST

    request_id: int
    segment: str
    delegation_token: str = ""


@dataclass(frozen=True, slots=True)
class SegmentDeleted(Command):
    """Reply to DeleteSegment and DeleteTableSegment."""

    type: ClassVar[CommandType] = CommandType.SEGMENT_DELETED
    direction: ClassVar[Direction] = Direction.REPLY

    request_id: int
    segment: str


@dataclass(frozen=True, slots=True)
class UpdateSegmentPolicy(Command):
    """Change a segment's scaling policy."""

    type: ClassVar[CommandType] = CommandType.UPDATE_SEGMENT_POLICY
    direction: ClassVar[Direction] = Direction.REQUEST

    request_id: int
    segment: str
    target_rate: int
    scale_type: int
    delegation_token: str = ""


@dataclass(frozen=True, slots=True)
class SegmentPolicyUpdated(Command):
    """Reply to UpdateSegmentPolicy."""

    type: ClassVar[CommandType] = CommandType.SEGMENT_POLICY_UPDATED
    direction: ClassVar[Direction] = Direction.REPLY

    request_id: int
    segment: str


@dataclass(frozen=True, slots=True)
class TruncateSegment(Command):
    """Make bytes before ``truncation_offset`` unreadable."""

    type: ClassVar[CommandType] = CommandType.TRUNCATE_SEGMENT
    direction: ClassVar[Direction] = Direction.REQUEST

    request_id: int
    segment: str
    truncation_offset: int
    delegation_token: str = ""


@dataclass(frozen=True, slots=True)
class SegmentTruncated(Command):
    """Reply to TruncateSegment."""

    type: ClassVar[CommandType] = CommandType.SEGMENT_TRUNCATED
    direction: ClassVar[Direction] = Direction.REPLY

    request_id: int
    segment: str


@dataclass(frozen=True, slots=True)
class MergeSegments(Command):
    """Append ``source``'s bytes to ``target`` and delete ``source`` (pravega.md#large-events)."""

    type: ClassVar[CommandType] = CommandType.MERGE_SEGMENTS
    direction: ClassVar[Direction] = Direction.REQUEST

    request_id: int
    target: str
    source: str
    delegation_token: str = ""
    attribute_updates: tuple[ConditionalAttributeUpdate, ...] = ()  # opt: Rust omits it


@dataclass(frozen=True, slots=True)
class SegmentsMerged(Command):
    """Reply to MergeSegments with the target's new length."""

    type: ClassVar[CommandType] = CommandType.SEGMENTS_MERGED
    direction: ClassVar[Direction] = Direction.REPLY

    request_id: int
    target: str
    source: str
    new_target_write_offset: int = -1


@dataclass(frozen=True, slots=True)
class MergeSegmentsBatch(Command):
    """Merge several sources into ``target``."""

    type: ClassVar[CommandType] = CommandType.MERGE_SEGMENTS_BATCH
    direction: ClassVar[Direction] = Direction.REQUEST

    request_id: int
    target: str
    sources: tuple[str, ...]
    delegation_token: str = ""


@dataclass(frozen=True, slots=True)
class SegmentsBatchMerged(Command):
    """Reply to MergeSegmentsBatch in Java's layout: (source, offset) pairs
    (pravega.md#differences).

    ``sources`` and ``new_target_write_offsets`` have the same length.
    """

    type: ClassVar[CommandType] = CommandType.SEGMENTS_BATCH_MERGED
    direction: ClassVar[Direction] = Direction.REPLY

    request_id: int
    target: str
    sources: tuple[str, ...]
    new_target_write_offsets: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class LocateOffset(Command):
    """Java only: locate ``target_offset`` in a segment."""

    type: ClassVar[CommandType] = CommandType.LOCATE_OFFSET
    direction: ClassVar[Direction] = Direction.REQUEST

    request_id: int
    segment: str
    target_offset: int
    delegation_token: str = ""


@dataclass(frozen=True, slots=True)
class OffsetLocated(Command):
    """Reply to LocateOffset."""

    type: ClassVar[CommandType] = CommandType.OFFSET_LOCATED
    direction: ClassVar[Direction] = Direction.REPLY

    request_id: int
    segment: str
    offset: int


@dataclass(frozen=True, slots=True)
class FlushToStorage(Command):
    """Admin: flush a segment container to long-term storage."""

    type: ClassVar[CommandType] = CommandType.FLUSH_TO_STORAGE
    direction: ClassVar[Direction] = Direction.REQUEST

    container_id: int
    delegation_token: str
    request_id: int


@dataclass(frozen=True, slots=True)
class StorageFlushed(Command):
    """Admin reply to FlushToStorage."""

    type: ClassVar[CommandType] = CommandType.STORAGE_FLUSHED
    direction: ClassVar[Direction] = Direction.REPLY

    request_id: int


@dataclass(frozen=True, slots=True)
class ListStorageChunks(Command):
    """Admin: list a segment's storage chunks."""

    type: ClassVar[CommandType] = CommandType.LIST_STORAGE_CHUNKS
    direction: ClassVar[Direction] = Direction.REQUEST

    segment: str
    delegation_token: str
    request_id: int


@dataclass(frozen=True, slots=True)
class StorageChunksListed(Command):
    """Admin reply to ListStorageChunks."""

    type: ClassVar[CommandType] = CommandType.STORAGE_CHUNKS_LISTED
    direction: ClassVar[Direction] = Direction.REPLY

    request_id: int
    chunks: tuple[ChunkInfo, ...] = ()


# --------------------------------------------------------------- attributes (pravega.md#attributes)


@dataclass(frozen=True, slots=True)
class GetSegmentAttribute(Command):
    """Read attribute ``attribute_id`` of a segment."""

    type: ClassVar[CommandType] = CommandType.GET_SEGMENT_ATTRIBUTE
    direction: ClassVar[Direction] = Direction.REQUEST

    request_id: int
    segment_name: str
    attribute_id: UUID
    delegation_token: str = ""


@dataclass(frozen=True, slots=True)
class SegmentAttribute(Command):
    """Reply to GetSegmentAttribute; ``NULL_ATTRIBUTE_VALUE`` if unset."""

    type: ClassVar[CommandType] = CommandType.SEGMENT_ATTRIBUTE
    direction: ClassVar[Direction] = Direction.REPLY

    request_id: int
    value: int


@dataclass(frozen=True, slots=True)
class UpdateSegmentAttribute(Command):
    """Compare-and-set one attribute."""

    type: ClassVar[CommandType] = CommandType.UPDATE_SEGMENT_ATTRIBUTE
    direction: ClassVar[Direction] = Direction.REQUEST

    request_id: int
    segment_name: str
    attribute_id: UUID
    new_value: int
    expected_value: int
    delegation_token: str = ""


@dataclass(frozen=True, slots=True)
class SegmentAttributeUpdated(Command):
    """Reply to UpdateSegmentAttribute; a failed compare is ``success=False``."""

    type: ClassVar[CommandType] = CommandType.SEGMENT_ATTRIBUTE_UPDATED
    direction: ClassVar[Direction] = Direction.REPLY

    request_id: int
    success: bool


# --------------------------------------------------------------- table segments (pravega.md#tables)


@dataclass(frozen=True, slots=True)
class GetTableSegmentInfo(Command):
    """Table segment metadata request."""

    type: ClassVar[CommandType] = CommandType.GET_TABLE_SEGMENT_INFO
    direction: ClassVar[Direction] = Direction.REQUEST

    request_id: int
    segment_name: str
    delegation_token: str = ""


@dataclass(frozen=True, slots=True)
class TableSegmentInfo(Command):
    """Table segment metadata in Java's layout (the Rust struct is wrong and unused,
    pravega.md#differences)."""

    type: ClassVar[CommandType] = CommandType.TABLE_SEGMENT_INFO
    direction: ClassVar[Direction] = Direction.REPLY

    request_id: int
    segment_name: str
    start_offset: int
    length: int
    entry_count: int
    key_length: int


@dataclass(frozen=True, slots=True)
class CreateTableSegment(Command):
    """Create a table segment; the Rust client sends none of the optional fields."""

    type: ClassVar[CommandType] = CommandType.CREATE_TABLE_SEGMENT
    direction: ClassVar[Direction] = Direction.REQUEST

    request_id: int
    segment: str
    delegation_token: str = ""
    sorted: bool = False  # opt
    key_length: int = 0  # opt
    rollover_size_bytes: int = 0  # opt


@dataclass(frozen=True, slots=True)
class DeleteTableSegment(Command):
    """Delete a table segment, optionally only if it is empty."""

    type: ClassVar[CommandType] = CommandType.DELETE_TABLE_SEGMENT
    direction: ClassVar[Direction] = Direction.REQUEST

    request_id: int
    segment: str
    must_be_empty: bool
    delegation_token: str = ""


@dataclass(frozen=True, slots=True)
class MergeTableSegments(Command):
    """Rust-only request (layout from the Rust client); Java removed it (pravega.md#differences)."""

    type: ClassVar[CommandType] = CommandType.MERGE_TABLE_SEGMENTS
    direction: ClassVar[Direction] = Direction.REQUEST

    request_id: int
    target: str
    source: str
    delegation_token: str = ""


@dataclass(frozen=True, slots=True)
class SealTableSegment(Command):
    """Rust-only request (layout from the Rust client); Java removed it (pravega.md#differences)."""

    type: ClassVar[CommandType] = CommandType.SEAL_TABLE_SEGMENT
    direction: ClassVar[Direction] = Direction.REQUEST

    request_id: int
    segment: str
    delegation_token: str = ""


@dataclass(frozen=True, slots=True)
class UpdateTableEntries(Command):
    """Conditional batch update (pravega.md#table-semantics)."""

    type: ClassVar[CommandType] = CommandType.UPDATE_TABLE_ENTRIES
    direction: ClassVar[Direction] = Direction.REQUEST

    request_id: int
    segment: str
    delegation_token: str
    table_entries: TableEntries
    table_segment_offset: int = NULL_TABLE_SEGMENT_OFFSET  # opt in Java's reader


@dataclass(frozen=True, slots=True)
class TableEntriesUpdated(Command):
    """The new versions, one per entry, in request order."""

    type: ClassVar[CommandType] = CommandType.TABLE_ENTRIES_UPDATED
    direction: ClassVar[Direction] = Direction.REPLY

    request_id: int
    versions: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class RemoveTableKeys(Command):
    """Conditional batch removal (pravega.md#table-semantics)."""

    type: ClassVar[CommandType] = CommandType.REMOVE_TABLE_KEYS
    direction: ClassVar[Direction] = Direction.REQUEST

    request_id: int
    segment: str
    delegation_token: str
    keys: tuple[TableKey, ...]
    table_segment_offset: int = NULL_TABLE_SEGMENT_OFFSET  # opt in Java's reader


@dataclass(frozen=True, slots=True)
class TableKeysRemoved(Command):
    """Reply to RemoveTableKeys."""

    type: ClassVar[CommandType] = CommandType.TABLE_KEYS_REMOVED
    direction: ClassVar[Direction] = Direction.REPLY

    request_id: int
    segment: str


@dataclass(frozen=True, slots=True)
class ReadTable(Command):
    """Read the entries of ``keys`` (versions are ``NO_VERSION``)."""

    type: ClassVar[CommandType] = CommandType.READ_TABLE
    direction: ClassVar[Direction] = Direction.REQUEST

    request_id: int
    segment: str
    delegation_token: str
    keys: tuple[TableKey, ...]


@dataclass(frozen=True, slots=True)
class TableRead(Command):
    """Reply to ReadTable: one entry per requested key, in order (pravega.md#table-semantics)."""

    type: ClassVar[CommandType] = CommandType.TABLE_READ
    direction: ClassVar[Direction] = Direction.REPLY

    request_id: int
    segment: str
    entries: TableEntries


@dataclass(frozen=True, slots=True)
class ReadTableKeys(Command):
    """Iterate over keys; an empty continuation token starts at the beginning."""

    type: ClassVar[CommandType] = CommandType.READ_TABLE_KEYS
    direction: ClassVar[Direction] = Direction.REQUEST

    request_id: int
    segment: str
    delegation_token: str
    suggested_key_count: int
    args: TableIteratorArgs = field(default_factory=TableIteratorArgs)  # each part opt


@dataclass(frozen=True, slots=True)
class TableKeysRead(Command):
    """A page of keys; an empty list ends the iteration (pravega.md#table-semantics)."""

    type: ClassVar[CommandType] = CommandType.TABLE_KEYS_READ
    direction: ClassVar[Direction] = Direction.REPLY

    request_id: int
    segment: str
    keys: tuple[TableKey, ...]
    continuation_token: bytes


@dataclass(frozen=True, slots=True)
class ReadTableEntries(Command):
    """Iterate over entries; an empty continuation token starts at the beginning."""

    type: ClassVar[CommandType] = CommandType.READ_TABLE_ENTRIES
    direction: ClassVar[Direction] = Direction.REQUEST

    request_id: int
    segment: str
    delegation_token: str
    suggested_entry_count: int
    args: TableIteratorArgs = field(default_factory=TableIteratorArgs)  # each part opt


@dataclass(frozen=True, slots=True)
class TableEntriesRead(Command):
    """A page of entries; an empty list ends the iteration (pravega.md#table-semantics)."""

    type: ClassVar[CommandType] = CommandType.TABLE_ENTRIES_READ
    direction: ClassVar[Direction] = Direction.REPLY

    request_id: int
    segment: str
    entries: TableEntries
    continuation_token: bytes


@dataclass(frozen=True, slots=True)
class ReadTableEntriesDelta(Command):
    """Read table changes from log position ``from_position`` (code 88,
    pravega.md#table-semantics)."""

    type: ClassVar[CommandType] = CommandType.READ_TABLE_ENTRIES_DELTA
    direction: ClassVar[Direction] = Direction.REQUEST

    request_id: int
    segment: str
    delegation_token: str
    from_position: int
    suggested_entry_count: int


@dataclass(frozen=True, slots=True)
class TableEntriesDeltaRead(Command):
    """Reply to ReadTableEntriesDelta (code 87); ``last_position`` must advance
    (pravega.md#table-semantics)."""

    type: ClassVar[CommandType] = CommandType.TABLE_ENTRIES_DELTA_READ
    direction: ClassVar[Direction] = Direction.REPLY

    request_id: int
    segment: str
    entries: TableEntries
    should_clear: bool
    reached_end: bool
    last_position: int


# ---------------------------------------------------------------- error replies (pravega.md#errors)


@dataclass(frozen=True, slots=True)
class WrongHost(Command):
    """The segment is owned by ``correct_host``."""

    type: ClassVar[CommandType] = CommandType.WRONG_HOST
    direction: ClassVar[Direction] = Direction.REPLY

    request_id: int
    segment: str
    correct_host: str
    server_stack_trace: str = ""


@dataclass(frozen=True, slots=True)
class SegmentIsSealed(Command):
    """The segment is sealed; ``offset`` is where."""

    type: ClassVar[CommandType] = CommandType.SEGMENT_IS_SEALED
    direction: ClassVar[Direction] = Direction.REPLY

    request_id: int
    segment: str
    server_stack_trace: str = ""
    offset: int = -1


@dataclass(frozen=True, slots=True)
class SegmentAlreadyExists(Command):
    """The segment (or table segment) exists already."""

    type: ClassVar[CommandType] = CommandType.SEGMENT_ALREADY_EXISTS
    direction: ClassVar[Direction] = Direction.REPLY

    request_id: int
    segment: str
    server_stack_trace: str = ""


@dataclass(frozen=True, slots=True)
class NoSuchSegment(Command):
    """The segment does not exist; ``offset`` echoes the request's, or -1."""

    type: ClassVar[CommandType] = CommandType.NO_SUCH_SEGMENT
    direction: ClassVar[Direction] = Direction.REPLY

    request_id: int
    segment: str
    server_stack_trace: str = ""
    offset: int = -1


@dataclass(frozen=True, slots=True)
class InvalidEventNumber(Command):
    """A writer's event number is stale, in Java's layout (pravega.md#differences).

    The Rust client decodes the same bytes as (writer_id, event_number,
    server_stack_trace): it reads Java's ``request_id`` as its event number
    and ignores the trailing i64. We send Java's layout (pravega.md#differences).
    """

    type: ClassVar[CommandType] = CommandType.INVALID_EVENT_NUMBER
    direction: ClassVar[Direction] = Direction.REPLY

    writer_id: UUID
    request_id: int
    server_stack_trace: str = ""
    event_number: int = -1  # Java's reader default when absent


@dataclass(frozen=True, slots=True)
class SegmentIsTruncated(Command):
    """A read below ``start_offset``; ``offset`` is the requested offset."""

    type: ClassVar[CommandType] = CommandType.SEGMENT_IS_TRUNCATED
    direction: ClassVar[Direction] = Direction.REPLY

    request_id: int
    segment: str
    start_offset: int
    server_stack_trace: str = ""
    offset: int = -1


@dataclass(frozen=True, slots=True)
class OperationUnsupported(Command):
    """The server does not implement ``operation_name``."""

    type: ClassVar[CommandType] = CommandType.OPERATION_UNSUPPORTED
    direction: ClassVar[Direction] = Direction.REPLY

    request_id: int
    operation_name: str
    server_stack_trace: str = ""


@dataclass(frozen=True, slots=True)
class AuthTokenCheckFailed(Command):
    """The delegation token was refused.

    ``error_code`` must be one of the three class constants: the Rust client
    panics on any other value.
    """

    UNSPECIFIED: ClassVar[int] = -1
    TOKEN_CHECK_FAILED: ClassVar[int] = 0
    TOKEN_EXPIRED: ClassVar[int] = 1

    type: ClassVar[CommandType] = CommandType.AUTH_TOKEN_CHECK_FAILED
    direction: ClassVar[Direction] = Direction.REPLY

    request_id: int
    server_stack_trace: str = ""
    error_code: int = -1


@dataclass(frozen=True, slots=True)
class ErrorMessage(Command):
    """Generic error; ``error_code`` -1 unspecified, 0 illegal argument."""

    UNSPECIFIED: ClassVar[int] = -1
    ILLEGAL_ARGUMENT: ClassVar[int] = 0

    type: ClassVar[CommandType] = CommandType.ERROR_MESSAGE
    direction: ClassVar[Direction] = Direction.REPLY

    request_id: int
    segment: str
    message: str
    error_code: int = -1


@dataclass(frozen=True, slots=True)
class TableSegmentNotEmpty(Command):
    """DeleteTableSegment(must_be_empty=True) on a table with keys."""

    type: ClassVar[CommandType] = CommandType.TABLE_SEGMENT_NOT_EMPTY
    direction: ClassVar[Direction] = Direction.REPLY

    request_id: int
    segment: str
    server_stack_trace: str = ""


@dataclass(frozen=True, slots=True)
class TableKeyDoesNotExist(Command):
    """A conditional table operation named an absent key (pravega.md#table-semantics)."""

    type: ClassVar[CommandType] = CommandType.TABLE_KEY_DOES_NOT_EXIST
    direction: ClassVar[Direction] = Direction.REPLY

    request_id: int
    segment: str
    server_stack_trace: str = ""


@dataclass(frozen=True, slots=True)
class TableKeyBadVersion(Command):
    """A conditional table operation expected another version (pravega.md#table-semantics)."""

    type: ClassVar[CommandType] = CommandType.TABLE_KEY_BAD_VERSION
    direction: ClassVar[Direction] = Direction.REPLY

    request_id: int
    segment: str
    server_stack_trace: str = ""
