"""Value types shared by every layer: what the store hands out and takes in.

All of them are frozen, slotted dataclasses: cheap to build, safe to share
between connections, and comparable in tests. Words keep one meaning
everywhere (``docs/architecture.md#naming``): ``offset`` is a byte position inside a segment,
``position`` a byte position inside a file, ``count`` a number of items.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar
from uuid import UUID

__all__ = [
    "NOT_EXISTS",
    "NO_VERSION",
    "NULL_ATTRIBUTE_VALUE",
    "AppendResult",
    "FileRegion",
    "ReadResult",
    "RegionRead",
    "SegmentInfo",
    "SegmentKind",
    "TableDelta",
    "TableEntry",
    "TableInfo",
    "TableKey",
    "TablePage",
    "TableUpdate",
    "WriterAppend",
]

NULL_ATTRIBUTE_VALUE = -(2**63)
"""Value of an attribute that was never set (Pravega's ``Attributes.NULL_ATTRIBUTE_VALUE``).

It is also the "last event number" of a writer that never appended.
"""

NO_VERSION = -(2**63)
"""Table version meaning "no condition": an unconditional put or removal."""

NOT_EXISTS = -1
"""Table version meaning "the key must be absent" (on update), or "absent" (on read)."""


class SegmentKind(enum.StrEnum):
    """What a segment holds; table operations only work on ``TABLE`` segments."""

    STREAM = "stream"
    """Raw bytes: events in Pravega framing, byte streams, transaction data."""

    TABLE = "table"
    """A key/value table stored as a log of update and removal records."""


@dataclass(frozen=True, slots=True)
class WriterAppend:
    """The writer identity carried by an append, for deduplication across retries.

    The store keeps the writer's last event number as the segment attribute
    whose id is ``writer_id``. An append whose ``event_number`` is not greater
    than the stored one has been applied before and is not stored again.

    Attributes:
        writer_id: the writer's UUID (also the attribute id).
        event_number: the number of the last event in this append.
        event_count: the events in this append when the caller knows it (the
            Pravega door does, from ``AppendBlockEnd``); 0: not said.
    """

    writer_id: UUID
    event_number: int
    event_count: int = 0


@dataclass(frozen=True, slots=True)
class AppendResult:
    """What an acknowledged append did.

    Attributes:
        offset: where the appended bytes start in the segment (for a duplicate,
            the segment length at the time, as nothing was written).
        length: the segment length after the append.
        previous_event_number: the writer's last event number before this append
            (``NULL_ATTRIBUTE_VALUE`` without a writer or for a new writer).
        duplicate: True when the writer's event number showed the append had
            already been stored; nothing was written.
    """

    offset: int
    length: int
    previous_event_number: int = NULL_ATTRIBUTE_VALUE
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class ReadResult:
    """Bytes read from a segment, starting exactly at ``offset``.

    Attributes:
        offset: the offset that was asked for.
        data: between 0 and ``max_bytes`` bytes starting at ``offset``.
        at_tail: ``offset + len(data)`` is the current length.
        end_of_segment: the segment is sealed and ``data`` reaches its end.
    """

    offset: int
    data: bytes
    at_tail: bool
    end_of_segment: bool


class FileRegion:
    """Bytes of a segment that lie contiguously in one file, for zero-copy sending.

    ``size_bytes`` bytes at file ``position`` of the file open as ``fd``: what a
    server hands to ``os.sendfile`` instead of copying the bytes through Python.
    The region owns ``fd`` (opened for this region alone, so its file position
    is nobody else's), and whoever receives it must ``close`` it (idempotent;
    also a context manager). While it is open the store keeps those bytes in
    place: a truncation does not free their blocks until it is closed.

    Attributes:
        fd: a read-only descriptor of the file (-1 once closed).
        position: where the bytes start in the file.
        size_bytes: how many bytes.
    """

    __slots__ = ("_release", "fd", "position", "size_bytes")

    def __init__(
        self,
        fd: int,
        position: int,
        size_bytes: int,
        release: Callable[[], None] | None = None,
    ) -> None:
        self.fd = fd
        self.position = position
        self.size_bytes = size_bytes
        self._release = release

    def read(self) -> bytes:
        """Copy the bytes out (for a connection that cannot ``sendfile``, e.g. TLS).

        Raises:
            OSError: the file ends early (it never does for a live region) or
                the region is closed.
        """
        data = os.pread(self.fd, self.size_bytes, self.position)
        while len(data) < self.size_bytes:
            more = os.pread(self.fd, self.size_bytes - len(data), self.position + len(data))
            if not more:
                raise OSError(f"file ends {self.size_bytes - len(data)} bytes early")
            data += more
        return data

    def close(self) -> None:
        """Close the descriptor and let the store free what it kept for the region."""
        fd, self.fd = self.fd, -1
        if fd < 0:
            return
        release, self._release = self._release, None
        try:
            os.close(fd)
        finally:
            if release is not None:
                release()

    def __enter__(self) -> FileRegion:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"FileRegion(fd={self.fd}, position={self.position}, size_bytes={self.size_bytes})"


@dataclass(frozen=True, slots=True)
class RegionRead:
    """A read answered with where the bytes are instead of the bytes (``read_region``).

    Attributes:
        offset: the offset that was asked for.
        region: ``size_bytes`` bytes starting at ``offset``, in a file (close it).
        at_tail: ``offset + region.size_bytes`` is the current length.
        end_of_segment: the segment is sealed and the region reaches its end.
    """

    offset: int
    region: FileRegion
    at_tail: bool
    end_of_segment: bool


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """A snapshot of a segment's metadata.

    Attributes:
        name: the segment's full name.
        kind: plain stream segment or table segment.
        start_offset: first readable offset (moved by truncation).
        length: the durable length (one past the last readable byte).
        sealed: no more appends will be accepted.
        last_modified_ms: wall clock of the last change, milliseconds since the epoch.
        attributes: a copy of the segment's attributes (writer ids included).
    """

    name: str
    kind: SegmentKind
    start_offset: int
    length: int
    sealed: bool
    last_modified_ms: int
    attributes: Mapping[UUID, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TableUpdate:
    """One entry of a conditional batch update.

    ``expected_version``: ``NO_VERSION`` puts unconditionally, ``NOT_EXISTS``
    requires the key to be absent, a value >= 0 requires exactly that version.
    """

    key: bytes
    value: bytes
    expected_version: int = NO_VERSION


@dataclass(frozen=True, slots=True)
class TableKey:
    """A key with a version: a removal condition (same rules as ``TableUpdate``)
    on the way in, the key's current version on the way out."""

    key: bytes
    version: int = NO_VERSION


@dataclass(frozen=True, slots=True)
class TableEntry:
    """A key, its value and its version (the offset of the record that wrote it)."""

    key: bytes
    value: bytes
    version: int


T = TypeVar("T", TableKey, TableEntry)


@dataclass(frozen=True, slots=True)
class TablePage(Generic[T]):
    """One page of an ordered table iteration.

    An empty ``items`` list means the iteration is over. Pass
    ``continuation_token`` back to get the next page; it is opaque to callers.
    """

    items: list[T]
    continuation_token: bytes


@dataclass(frozen=True, slots=True)
class TableDelta:
    """The result of a delta read of a table's record log (Pravega's ``TableEntriesDeltaRead``).

    Attributes:
        entries: the latest surviving update of each key seen in the walked
            range, each with its current version; removals are not reported.
        last_position: the log position just after the last record walked;
            pass it as the next ``from_position``.
        reached_end: ``last_position`` is the current end of the log.
        should_clear: the requested position preceded the log's start; the
            caller must discard what it has and start over.
    """

    entries: list[TableEntry]
    last_position: int
    reached_end: bool
    should_clear: bool


@dataclass(frozen=True, slots=True)
class TableInfo:
    """Size and shape of a table segment."""

    name: str
    start_offset: int
    length: int
    entry_count: int
