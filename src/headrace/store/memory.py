"""MemoryStore: the reference implementation of the store contract.

Everything lives in dictionaries; nothing survives the process. It is the
model the conformance suite and the stateful property test compare
``DiskStore`` against, so it favours being obviously right over being fast.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from uuid import UUID

from headrace.errors import (
    BadOffset,
    LimitExceeded,
    SegmentExists,
    SegmentNotFound,
    SegmentSealed,
    SegmentTruncated,
    SegmentTypeMismatch,
    StoreClosed,
    StoreError,
)
from headrace.store._attributes import check_attribute_bound, set_attribute
from headrace.store._base import BaseStore, SegmentState, check_append
from headrace.store._timeindex import TimeIndex
from headrace.store.api import (
    MAX_NAME_BYTES,
    MAX_READ_BYTES,
    MAX_SEGMENT_ATTRIBUTES,
)
from headrace.types import (
    NULL_ATTRIBUTE_VALUE,
    AppendResult,
    ReadResult,
    SegmentInfo,
    SegmentKind,
    WriterAppend,
)

__all__ = ["MAX_MERGE_MEMORY", "MemoryStore", "check_name"]

MAX_MERGE_MEMORY = 10_000
"""How many recent merges are remembered so that a retried merge still succeeds;
a retry comes within seconds, so a few thousand transactions' worth is ample."""


def check_name(name: str) -> None:
    """Refuse names over ``MAX_NAME_BYTES`` of UTF-8 (any other string is fine)."""
    size = len(name.encode("utf-8", "surrogatepass"))
    if size > MAX_NAME_BYTES:
        raise LimitExceeded("segment name bytes", MAX_NAME_BYTES, size)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(slots=True)
class _Segment:
    kind: SegmentKind
    data: bytearray = field(default_factory=bytearray)
    data_base: int = 0  # segment offset of data[0]; bytes below were truncated away
    start_offset: int = 0
    sealed: bool = False
    attributes: dict[UUID, int] = field(default_factory=dict)
    last_modified_ms: int = field(default_factory=now_ms)
    times: TimeIndex = field(default_factory=TimeIndex)

    @property
    def length(self) -> int:
        return self.data_base + len(self.data)


class MemoryStore(BaseStore):
    """The store contract over dictionaries: no durability, no files.

    Args:
        max_segment_attributes: attributes a segment keeps, least recently set
            dropped first (``MAX_SEGMENT_ATTRIBUTES``).
    """

    def __init__(self, *, max_segment_attributes: int = MAX_SEGMENT_ATTRIBUTES) -> None:
        super().__init__()
        self.max_segment_attributes = check_attribute_bound(max_segment_attributes)
        self._segments: dict[str, _Segment] = {}
        self._merged: dict[str, str] = {}  # source -> target, insertion-ordered, bounded
        self._closed = False

    def _get(self, name: str) -> _Segment:
        if self._closed:
            raise StoreClosed("the store is closed")
        segment = self._segments.get(name)
        if segment is None:
            raise SegmentNotFound(name)
        return segment

    def _state(self, name: str) -> SegmentState:
        s = self._get(name)
        return SegmentState(s.kind, s.start_offset, s.length, s.sealed)

    def _time_index(self, name: str) -> TimeIndex:
        return self._get(name).times

    async def _create(self, name: str, kind: SegmentKind) -> None:
        if self._closed:
            raise StoreClosed("the store is closed")
        check_name(name)
        if name in self._segments:
            raise SegmentExists(name)
        self._segments[name] = _Segment(kind)
        self._merged.pop(name, None)

    async def _append(
        self,
        name: str,
        data: bytes | memoryview,
        expected_offset: int | None,
        writer: WriterAppend | None,
        kind: SegmentKind,
    ) -> AppendResult:
        s = self._get(name)
        previous, duplicate = check_append(name, s, len(data), expected_offset, writer, kind)
        if duplicate:
            return AppendResult(s.length, s.length, previous, duplicate=True)
        offset = s.length
        s.data += data
        if writer is not None:
            set_attribute(
                s.attributes, writer.writer_id, writer.event_number, self.max_segment_attributes
            )
        s.last_modified_ms = now_ms()
        if len(data) and s.kind is SegmentKind.STREAM:  # tables need no times
            s.times.note(offset, s.last_modified_ms)
        self._notify(name)
        return AppendResult(offset, s.length, previous)

    async def read(self, name: str, offset: int, max_bytes: int) -> ReadResult:
        s = self._get(name)
        if offset < s.start_offset:
            raise SegmentTruncated(name, s.start_offset)
        if offset > s.length:
            raise BadOffset(name, offset, s.length)
        count = max(0, min(max_bytes, MAX_READ_BYTES, s.length - offset))
        position = offset - s.data_base
        data = bytes(s.data[position : position + count])
        end = offset + count
        return ReadResult(offset, data, end == s.length, s.sealed and end == s.length)

    async def info(self, name: str) -> SegmentInfo:
        s = self._get(name)
        return SegmentInfo(
            name, s.kind, s.start_offset, s.length, s.sealed, s.last_modified_ms, dict(s.attributes)
        )

    async def seal(self, name: str) -> int:
        s = self._get(name)
        if not s.sealed:
            s.sealed = True
            s.last_modified_ms = now_ms()
            self._notify(name)
        return s.length

    async def _truncate(self, name: str, offset: int) -> None:
        s = self._get(name)
        if not s.start_offset <= offset <= s.length:
            raise BadOffset(name, offset, s.length)
        if offset > s.start_offset:
            s.start_offset = offset
            del s.data[: offset - s.data_base]
            s.data_base = offset
            s.times.truncate(offset)
            s.last_modified_ms = now_ms()

    async def _delete(self, name: str) -> None:
        self._get(name)
        del self._segments[name]

    async def merge(self, target: str, source: str) -> int:
        self._check_merge(target, source)
        if self._closed:
            raise StoreClosed("the store is closed")
        if source not in self._segments and self._merged.get(source) == target:
            return self._get(target).length
        t = self._get(target)
        s = self._get(source)
        if source == target:
            raise StoreError(f"cannot merge segment {source!r} into itself")
        for name, seg in ((target, t), (source, s)):
            if seg.kind is not SegmentKind.STREAM:
                raise SegmentTypeMismatch(name, SegmentKind.STREAM.value)
        if t.sealed:
            raise SegmentSealed(target, t.length)
        moved = bytes(s.data[s.start_offset - s.data_base :])
        if moved:
            t.times.note(t.length, now_ms())
        t.data += moved
        t.last_modified_ms = now_ms()
        del self._segments[source]
        self._tables.pop(source, None)
        self._merged[source] = target
        while len(self._merged) > MAX_MERGE_MEMORY:
            del self._merged[next(iter(self._merged))]
        self._notify(target)
        self._notify(source)
        return t.length

    async def get_attribute(self, name: str, attribute_id: UUID) -> int:
        return self._get(name).attributes.get(attribute_id, NULL_ATTRIBUTE_VALUE)

    async def update_attribute(
        self, name: str, attribute_id: UUID, new_value: int, expected_value: int
    ) -> bool:
        s = self._get(name)
        if s.attributes.get(attribute_id, NULL_ATTRIBUTE_VALUE) != expected_value:
            return False
        if new_value == NULL_ATTRIBUTE_VALUE:
            s.attributes.pop(attribute_id, None)
        else:
            set_attribute(s.attributes, attribute_id, new_value, self.max_segment_attributes)
        s.last_modified_ms = now_ms()
        return True

    async def list_segments(self) -> list[str]:
        if self._closed:
            raise StoreClosed("the store is closed")
        return sorted(self._segments)

    async def flush(self) -> None:
        if self._closed:
            raise StoreClosed("the store is closed")

    async def close(self) -> None:
        self._closed = True
        self._wake_all()
