"""Table segments: a key/value map kept as a log of records inside a segment.

A table segment's bytes are a sequence of records, each written by one
update or removal; a key's version is the segment offset of the record that
last wrote it (Pravega's scheme, which makes delta reads a plain walk of the
log). The record layout matches the sizes Java Pravega produces, so versions
agree with a real cluster: inserting ``key1 -> value1`` then ``key2 -> value2``
into an empty table yields versions 0 and 27.

Record layout (all integers big-endian)::

    offset  size  field
    0       1     serialization version, always 0
    1       4     key length K (i32, >= 0)
    5       4     value length V (i32); -1 marks a removal (no value bytes)
    9       8     entry version (i64): the record's own segment offset
    17      K     key bytes
    17+K    V     value bytes (absent for a removal)

A batch update or removal is one append holding several records, so it is
all-or-nothing on disk as well. This module is pure (no I/O): the stores
feed it bytes and it keeps the in-memory index.
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from sortedcontainers import SortedDict

from headrace.errors import (
    CorruptionError,
    LimitExceeded,
    TableKeyBadVersion,
    TableKeyNotFound,
)
from headrace.types import NO_VERSION, NOT_EXISTS, TableEntry, TableKey, TableUpdate

__all__ = [
    "RECORD_HEADER",
    "TableIndex",
    "check_removals",
    "check_updates",
    "decode_records",
    "encode_removals",
    "encode_updates",
]

RECORD_HEADER = struct.Struct(">biiq")
"""serialization version, key length, value length (-1 = removal), entry version."""
assert RECORD_HEADER.size == 17  # Java's TableEntry header size; versions depend on it

SERIALIZATION_VERSION = 0
REMOVAL_VALUE_LENGTH = -1


@dataclass(frozen=True, slots=True)
class Record:
    """One decoded table record; ``value is None`` for a removal."""

    offset: int
    key: bytes
    value: bytes | None

    @property
    def end(self) -> int:
        return self.offset + record_size(self.key, self.value)


def record_size(key: bytes, value: bytes | None) -> int:
    return RECORD_HEADER.size + len(key) + (0 if value is None else len(value))


def _check_key(key: bytes, max_key_bytes: int) -> None:
    if len(key) > max_key_bytes:
        raise LimitExceeded("table key bytes", max_key_bytes, len(key))


def encode_updates(updates: Sequence[TableUpdate], base_offset: int) -> tuple[bytes, list[int]]:
    """Encode a batch of puts placed at ``base_offset``; return the bytes and versions."""
    parts: list[bytes] = []
    versions: list[int] = []
    offset = base_offset
    for u in updates:
        parts.append(RECORD_HEADER.pack(SERIALIZATION_VERSION, len(u.key), len(u.value), offset))
        parts.append(u.key)
        parts.append(u.value)
        versions.append(offset)
        offset += record_size(u.key, u.value)
    return b"".join(parts), versions


def encode_removals(keys: Sequence[bytes], base_offset: int) -> bytes:
    """Encode a batch of removal records placed at ``base_offset``."""
    parts: list[bytes] = []
    offset = base_offset
    for key in keys:
        parts.append(
            RECORD_HEADER.pack(SERIALIZATION_VERSION, len(key), REMOVAL_VALUE_LENGTH, offset)
        )
        parts.append(key)
        offset += record_size(key, None)
    return b"".join(parts)


def decode_records(data: bytes, base_offset: int, *, path: str = "<table>") -> Iterator[Record]:
    """Decode back-to-back records from ``data`` that starts at segment offset ``base_offset``.

    Raises:
        CorruptionError: a record is truncated, has an unknown serialization
            version, negative lengths, or a stored version that is not its offset.
    """
    view = memoryview(data)
    position = 0
    while position < len(data):
        if len(data) - position < RECORD_HEADER.size:
            raise CorruptionError(path, base_offset + position, "truncated table record header")
        ser, key_len, value_len, version = RECORD_HEADER.unpack_from(view, position)
        offset = base_offset + position
        if ser != SERIALIZATION_VERSION or key_len < 0 or value_len < REMOVAL_VALUE_LENGTH:
            raise CorruptionError(path, offset, "malformed table record header")
        if version != offset:
            raise CorruptionError(path, offset, f"table record version {version} != its offset")
        start = position + RECORD_HEADER.size
        end = start + key_len + max(value_len, 0)
        if end > len(data):
            raise CorruptionError(path, offset, "truncated table record body")
        key = bytes(view[start : start + key_len])
        value = None if value_len == REMOVAL_VALUE_LENGTH else bytes(view[start + key_len : end])
        yield Record(offset, key, value)
        position = end


@dataclass(slots=True)
class TableIndex:
    """The current state of one table, rebuilt from its record log.

    ``entries`` maps key -> (version, value) in key byte order;
    ``record_offsets`` lists every record's offset, for validating delta-read
    positions and for cutting delta reads at record boundaries.
    """

    start_offset: int = 0
    length: int = 0
    entries: SortedDict = field(default_factory=SortedDict)
    record_offsets: list[int] = field(default_factory=list)

    def apply(self, record: Record) -> None:
        """Apply one record; records must come in log order."""
        assert record.offset == self.length or not self.record_offsets, (record, self.length)
        if record.value is None:
            self.entries.pop(record.key, None)
        else:
            self.entries[record.key] = (record.offset, record.value)
        self.record_offsets.append(record.offset)
        self.length = record.end

    def version_of(self, key: bytes) -> int | None:
        found: tuple[int, bytes] | None = self.entries.get(key)
        return None if found is None else found[0]

    def get(self, key: bytes) -> TableEntry | None:
        found: tuple[int, bytes] | None = self.entries.get(key)
        return None if found is None else TableEntry(key, found[1], found[0])

    def is_record_boundary(self, position: int) -> bool:
        if position == self.length:
            return True
        i = bisect.bisect_left(self.record_offsets, position)
        return i < len(self.record_offsets) and self.record_offsets[i] == position

    def boundary_at_or_before(self, position: int) -> int:
        """The last record boundary <= ``position`` (or the log end if beyond)."""
        if position >= self.length:
            return self.length
        i = bisect.bisect_right(self.record_offsets, position)
        return self.record_offsets[i - 1] if i else self.start_offset

    def keys_after(self, after: bytes | None, max_count: int, max_bytes: int) -> list[bytes]:
        """Up to ``max_count`` keys strictly after ``after`` (from the start if None)."""
        keys: list[bytes] = []
        size = 0
        it = self.entries if after is None else self.entries.irange(after, inclusive=(False, True))
        for key in it:
            if len(keys) >= max_count or (keys and size >= max_bytes):
                break
            keys.append(key)
            size += len(key) + len(self.entries[key][1])
        return keys


def _check_condition(name: str, index: TableIndex, key: bytes, expected: int) -> None:
    if expected == NO_VERSION:
        return
    current = index.version_of(key)
    if expected == NOT_EXISTS:
        if current is not None:
            raise TableKeyBadVersion(name, key, expected, current)
        return
    if current is None:
        raise TableKeyNotFound(name, key)
    if current != expected:
        raise TableKeyBadVersion(name, key, expected, current)


def check_updates(
    name: str,
    index: TableIndex,
    updates: Sequence[TableUpdate],
    max_key_bytes: int,
    max_value_bytes: int,
) -> None:
    """Validate a batch against the pre-batch state; raise the first failure."""
    for u in updates:
        _check_key(u.key, max_key_bytes)
        if len(u.value) > max_value_bytes:
            raise LimitExceeded("table value bytes", max_value_bytes, len(u.value))
    for u in updates:
        _check_condition(name, index, u.key, u.expected_version)


def check_removals(
    name: str, index: TableIndex, keys: Sequence[TableKey], max_key_bytes: int
) -> None:
    """Validate a removal batch; an unconditional removal of an absent key passes."""
    for k in keys:
        _check_key(k.key, max_key_bytes)
    for k in keys:
        _check_condition(name, index, k.key, k.version)
