"""In-memory metadata of a container's segments, and the one function that changes it.

``ContainerState.apply`` is the only code that mutates segment metadata: the
live store builds a WAL record, writes it, and applies it; recovery and
``verify`` read records back and apply them. So what the store did and what
recovery rebuilds cannot drift apart. (``apply_append_ref`` is its live twin
for a large append logged as an APPEND_REF: the record's CRC is only known
once the bytes are checksummed, so it applies first and returns the record;
it runs the same steps as ``apply`` does for that record in replay.)

A live segment has two lengths: ``length`` counts every append written to the
WAL (offsets and ``expected_offset`` checks use it), ``durable_length`` only
those the durability policy has made safe (reads and ``info`` use it);
``sealed`` and ``sealed_durable`` likewise. Recovery sets both to the
replayed values.

Every appended byte is also fed to the segment's checksum blocks: the open
block grows until ``SIDECAR_BLOCK_BYTES`` and is closed then, or at a
checkpoint, which writes the closed blocks into the sidecar file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from uuid import UUID

from headrace.store._attributes import set_attribute, trim_attributes
from headrace.store._timeindex import TimeIndex
from headrace.store.api import MAX_SEGMENT_ATTRIBUTES
from headrace.store.disk.checks import BlockChecks
from headrace.store.disk.format import (
    SIDECAR_BLOCK_BYTES,
    SIDECAR_HEADER,
    AppendRecord,
    AppendRefRecord,
    AttributeRecord,
    CreateRecord,
    DeleteRecord,
    MergeCommitRecord,
    MergeDataRecord,
    Record,
    SealRecord,
    SidecarEntry,
    Snapshot,
    SnapshotSegment,
    TruncateRecord,
    crc32,
    crc32_combine,
    encode_sidecar_entries,
)
from headrace.store.memory import MAX_MERGE_MEMORY
from headrace.types import NULL_ATTRIBUTE_VALUE, SegmentKind, WriterAppend

__all__ = ["ContainerState", "ReplayError", "Segment", "Write"]

Write = tuple[int, int, "bytes | memoryview"]
"""A data-file write a record implies: (segment id, offset, bytes)."""


class ReplayError(Exception):
    """A record does not fit the state it is applied to (the log is inconsistent)."""


@dataclass(slots=True)
class Segment:
    segment_id: int
    name: str
    kind: SegmentKind
    modified_ms: int
    start_offset: int = 0
    length: int = 0
    durable_length: int = 0
    sealed: bool = False
    sealed_durable: bool = False
    attributes: dict[UUID, int] = field(default_factory=dict)
    hidden: bool = False
    """Being merged away: invisible to the API, still on disk until its DELETE."""
    sidecar_size: int = SIDECAR_HEADER.size
    """Sidecar bytes that cover the data up to the last checkpoint."""
    blocks: list[SidecarEntry] = field(default_factory=list)
    """Closed checksum blocks not yet in the sidecar."""
    block_offset: int = 0
    block_size: int = 0
    block_crc: int = 0
    dirty: bool = False
    """Data written since the last checkpoint (the data file needs an fsync)."""
    punched_offset: int = 0
    """Start offset up to which a checkpoint has freed the truncated bytes."""
    open_regions: int = 0
    """File regions handed out by ``read_region`` and not yet closed: while any is
    open, checkpoints leave the truncated blocks in place (a later one frees them),
    so a zero-copy send never reads a punched hole."""
    unchecked_end: int = 0
    """Reads below this offset check their blocks first (``checks.py``): the
    length the segment had when the store opened, 0 once every block of it was
    checked (and always for segments created since)."""
    checks: BlockChecks | None = None
    """Which blocks below ``unchecked_end`` were checked (None when it is 0)."""
    times: TimeIndex = field(default_factory=TimeIndex)
    """The append-time index (``store/_timeindex.py``): in the snapshot, and
    rebuilt since it from the APPEND records' times."""

    def extend_checksum(self, offset: int, data: bytes | memoryview) -> None:
        assert offset == self.block_offset + self.block_size, (offset, self.block_offset)
        size = len(data)
        if size and self.block_size + size <= SIDECAR_BLOCK_BYTES:  # the common case
            self.block_crc = crc32(data, self.block_crc)
            self.block_size += size
            self.dirty = True
            return
        view = memoryview(data)
        position = 0
        while position < len(view):
            if self.block_size == SIDECAR_BLOCK_BYTES:
                self._close_block()
            chunk = view[position : position + SIDECAR_BLOCK_BYTES - self.block_size]
            self.block_crc = crc32(chunk, self.block_crc)
            self.block_size += len(chunk)
            position += len(chunk)
        if len(view):
            self.dirty = True

    def extend_checksum_crc(self, offset: int, data: bytes | memoryview) -> int:
        """``extend_checksum``, and return the CRC-32 of ``data`` itself from the
        same single pass over the bytes (an APPEND_REF's CRC): each piece's CRC
        is combined into both (``crc32_combine`` reads no data)."""
        assert offset == self.block_offset + self.block_size, (offset, self.block_offset)
        view = memoryview(data)
        total = 0
        position = 0
        while position < len(view):
            if self.block_size == SIDECAR_BLOCK_BYTES:
                self._close_block()
            chunk = view[position : position + SIDECAR_BLOCK_BYTES - self.block_size]
            size = len(chunk)
            piece = crc32(chunk)
            self.block_crc = crc32_combine(self.block_crc, piece, size)
            total = crc32_combine(total, piece, size) if position else piece
            self.block_size += size
            position += size
        if len(view):
            self.dirty = True
        return total

    def _close_block(self) -> None:
        if self.block_size:
            self.blocks.append(SidecarEntry(self.block_offset, self.block_size, self.block_crc))
            self.block_offset += self.block_size
            self.block_size = 0
            self.block_crc = 0

    def add_blocks(self, blocks: list[SidecarEntry]) -> None:
        """Append whole, already checksummed blocks (a merge's chunks)."""
        self._close_block()
        for block in blocks:
            assert block.offset == self.block_offset, (block, self.block_offset)
            self.blocks.append(block)
            self.block_offset += block.size_bytes
        if blocks:
            self.dirty = True

    def take_blocks(self) -> list[SidecarEntry]:
        """Close the open block and hand over every block not yet in the sidecar."""
        self._close_block()
        blocks, self.blocks = self.blocks, []
        return blocks


@dataclass(slots=True)
class Captured:
    """What a checkpoint takes from the state in one synchronous step."""

    snapshot: Snapshot
    sidecar_writes: list[tuple[int, int, bytes]]
    """(segment id, sidecar position, entry bytes) to append."""
    dirty_ids: list[int]
    deleted_ids: list[int]
    punches: list[tuple[int, int]] = field(default_factory=list)
    """(segment id, start offset) of segments truncated since the last checkpoint."""


class ContainerState:
    """Metadata of one container's segments, changed only by ``apply``."""

    def __init__(self, container_id: int, *, max_attributes: int = MAX_SEGMENT_ATTRIBUTES) -> None:
        self.container_id = container_id
        self.max_attributes = max_attributes
        """Attributes a segment keeps (``store/_attributes.py``): applied live and
        in replay alike, so a restart keeps what the stopped store kept."""
        self.last_seq = 0
        self.next_segment_id = 1
        self.by_id: dict[int, Segment] = {}
        self.by_name: dict[str, Segment] = {}
        self.merged: dict[str, str] = {}
        """source name -> target name of recent merges of this container's segments."""
        self.commits: dict[tuple[int, str], str] = {}
        """(source id, source name) -> target name of recent merges into this
        container's segments, oldest first (source ids are per container, so the
        name is part of the key)."""
        self.pending_merge: list[tuple[int, SidecarEntry]] = []
        """(target id, block) of each MERGE_DATA record awaiting its commit."""
        self.deleted_ids: list[int] = []
        """Segments deleted since the last checkpoint; their files go after the next one."""
        self.changed = False
        """Anything applied since the state was loaded from a snapshot."""

    # ------------------------------------------------------------------ snapshots

    @classmethod
    def from_snapshot(
        cls, snap: Snapshot, *, max_attributes: int = MAX_SEGMENT_ATTRIBUTES
    ) -> ContainerState:
        state = cls(snap.container_id, max_attributes=max_attributes)
        state.last_seq = snap.last_seq
        state.next_segment_id = snap.next_segment_id
        for s in snap.segments:
            seg = Segment(
                s.segment_id,
                s.name,
                s.kind,
                s.modified_ms,
                start_offset=s.start_offset,
                length=s.length,
                durable_length=s.length,
                sealed=s.sealed,
                sealed_durable=s.sealed,
                attributes=dict(s.attributes),
                sidecar_size=s.sidecar_size,
                block_offset=s.length,
                times=TimeIndex(s.times, s.time_step_ms),
            )
            if len(seg.attributes) > max_attributes:  # the bound was lowered since
                trim_attributes(seg.attributes, max_attributes)
            state.by_id[seg.segment_id] = seg
            state.by_name[seg.name] = seg
        state.merged = dict(snap.merged)
        state.commits = {(sid, source): target for sid, source, target in snap.commits}
        return state

    def capture(self) -> Captured:
        """Snapshot the metadata as of ``last_seq`` and take the pending checksum work."""
        snap = Snapshot(self.container_id, self.last_seq, self.next_segment_id)
        writes: list[tuple[int, int, bytes]] = []
        dirty: list[int] = []
        punches: list[tuple[int, int]] = []
        for seg in self.by_id.values():
            blocks = seg.take_blocks()
            if blocks:
                raw = encode_sidecar_entries(blocks)
                writes.append((seg.segment_id, seg.sidecar_size, raw))
                seg.sidecar_size += len(raw)
            if seg.dirty:
                dirty.append(seg.segment_id)
                seg.dirty = False
            if seg.start_offset > seg.punched_offset and not seg.open_regions:
                punches.append((seg.segment_id, seg.start_offset))
                seg.punched_offset = seg.start_offset
            snap.segments.append(
                SnapshotSegment(
                    seg.segment_id,
                    seg.name,
                    seg.kind,
                    seg.start_offset,
                    seg.length,
                    seg.sealed,
                    seg.modified_ms,
                    dict(seg.attributes),
                    seg.sidecar_size,
                    seg.times.step_ms,
                    seg.times.entries(),
                )
            )
        snap.merged = list(self.merged.items())
        snap.commits = [(sid, source, t) for (sid, source), t in self.commits.items()]
        deleted, self.deleted_ids = self.deleted_ids, []
        return Captured(snap, writes, dirty, deleted, punches)

    def finish_replay(self) -> None:
        """After recovery every replayed record is durable; a merge without its
        commit at the very end of the log never happened."""
        self.pending_merge.clear()
        for seg in self.by_id.values():
            seg.durable_length = seg.length
            seg.sealed_durable = seg.sealed

    # ------------------------------------------------------------------ apply

    def _segment(self, segment_id: int) -> Segment:
        seg = self.by_id.get(segment_id)
        if seg is None:
            raise ReplayError(f"record for unknown segment id {segment_id}")
        return seg

    def apply(self, seq: int, record: Record) -> list[Write]:
        """Apply one record (sequence number ``seq``) and return the data writes it implies."""
        if seq != self.last_seq + 1:
            raise ReplayError(f"record seq {seq} does not follow {self.last_seq}")
        if self.pending_merge and not isinstance(record, MergeDataRecord | MergeCommitRecord):
            raise ReplayError("a merge's data records are not followed by its commit")
        # Appends are the hot path: dispatched ahead of the match in _apply.
        if isinstance(record, AppendRecord):
            writes = self._apply_append(record)
        elif isinstance(record, AppendRefRecord):
            writes = self._apply_append_ref(record)
        else:
            writes = self._apply(record)
        self.last_seq = seq
        self.changed = True
        return writes

    def _apply_append(self, record: AppendRecord) -> list[Write]:
        seg = self.by_id.get(record.segment_id)
        if seg is None:
            raise ReplayError(f"record for unknown segment id {record.segment_id}")
        if record.offset != seg.length:
            raise ReplayError(f"append at {record.offset}, segment length {seg.length}")
        if seg.sealed:
            raise ReplayError(f"append to sealed segment {record.segment_id}")
        data = record.data
        seg.extend_checksum(record.offset, data)
        if len(data) and seg.kind is SegmentKind.STREAM:  # tables need no times
            seg.times.note(record.offset, record.modified_ms)
        seg.length += len(data)
        if record.writer is not None:
            w = record.writer
            set_attribute(seg.attributes, w.writer_id, w.event_number, self.max_attributes)
        seg.modified_ms = record.modified_ms
        return [(record.segment_id, record.offset, data)] if len(data) else []

    def _check_append(self, segment_id: int, offset: int) -> Segment:
        seg = self.by_id.get(segment_id)
        if seg is None:
            raise ReplayError(f"record for unknown segment id {segment_id}")
        if offset != seg.length:
            raise ReplayError(f"append at {offset}, segment length {seg.length}")
        if seg.sealed:
            raise ReplayError(f"append to sealed segment {segment_id}")
        return seg

    def _apply_append_ref(self, record: AppendRefRecord) -> list[Write]:
        """An APPEND_REF with its ``data`` attached (live: the bytes to write;
        replay: the bytes read back and checked). Same effect as an APPEND."""
        seg = self._check_append(record.segment_id, record.offset)
        data = record.data
        if len(data) != record.size_bytes or not data:
            raise ReplayError(f"reference to {record.size_bytes} bytes carries {len(data)}")
        seg.extend_checksum(record.offset, data)
        return self._appended(seg, record.offset, record.modified_ms, record.writer, data)

    def apply_append_ref(self, seq: int, record: AppendRecord) -> tuple[AppendRefRecord, Write]:
        """Apply a live append that is logged as an APPEND_REF, and return that
        record (its CRC from the same pass as the sidecar block's) and the data
        write. Same state change as ``apply(seq, AppendRefRecord(..., data))``."""
        if seq != self.last_seq + 1:
            raise ReplayError(f"record seq {seq} does not follow {self.last_seq}")
        if self.pending_merge:
            raise ReplayError("a merge's data records are not followed by its commit")
        seg = self._check_append(record.segment_id, record.offset)
        data = record.data
        crc = seg.extend_checksum_crc(record.offset, data)
        self._appended(seg, record.offset, record.modified_ms, record.writer, data)
        self.last_seq = seq
        self.changed = True
        ref = AppendRefRecord(
            record.segment_id,
            record.offset,
            record.modified_ms,
            record.writer,
            len(data),
            crc,
            data,
        )
        return ref, (record.segment_id, record.offset, data)

    def _appended(
        self,
        seg: Segment,
        offset: int,
        modified_ms: int,
        writer: WriterAppend | None,
        data: bytes | memoryview,
    ) -> list[Write]:
        if len(data) and seg.kind is SegmentKind.STREAM:
            seg.times.note(offset, modified_ms)
        seg.length += len(data)
        if writer is not None:
            set_attribute(
                seg.attributes, writer.writer_id, writer.event_number, self.max_attributes
            )
        seg.modified_ms = modified_ms
        return [(seg.segment_id, offset, data)] if len(data) else []

    def apply_unlogged(self, record: Record) -> list[Write]:
        """Apply a change recovery derives itself (no WAL record, no seq); the
        checkpoint that ends recovery makes it durable."""
        self.changed = True
        return self._apply(record)

    def _apply(self, record: Record) -> list[Write]:
        match record:
            case CreateRecord(sid, kind, ms, name):
                if sid in self.by_id or name in self.by_name:
                    raise ReplayError(f"segment id {sid} or its name already exists")
                seg = Segment(sid, name, kind, ms, dirty=True)  # its files are not synced yet
                self.by_id[sid] = self.by_name[name] = seg
                self.next_segment_id = max(self.next_segment_id, sid + 1)
                self.merged.pop(name, None)
            case AppendRecord():
                return self._apply_append(record)
            case AppendRefRecord():
                return self._apply_append_ref(record)
            case SealRecord(sid, ms):
                seg = self._segment(sid)
                seg.sealed = True
                seg.modified_ms = ms
            case TruncateRecord(sid, offset, ms):
                seg = self._segment(sid)
                if not seg.start_offset <= offset <= seg.length:
                    raise ReplayError(f"truncate of segment {sid} to {offset} out of range")
                seg.start_offset = offset
                seg.times.truncate(offset)
                seg.modified_ms = ms
            case DeleteRecord(sid, target):
                seg = self._segment(sid)
                del self.by_id[sid]
                del self.by_name[seg.name]
                self.deleted_ids.append(sid)
                if target is not None:
                    self.merged.pop(seg.name, None)
                    self.merged[seg.name] = target
                    while len(self.merged) > MAX_MERGE_MEMORY:
                        del self.merged[next(iter(self.merged))]
            case AttributeRecord(sid, attribute_id, value, ms):
                seg = self._segment(sid)
                if value == NULL_ATTRIBUTE_VALUE:
                    seg.attributes.pop(attribute_id, None)
                else:
                    set_attribute(seg.attributes, attribute_id, value, self.max_attributes)
                seg.modified_ms = ms
            case MergeDataRecord(sid, offset, data):
                # The chunk goes to the data file now, past the segment's length,
                # where nothing reads it until the commit moves the length over it.
                seg = self._segment(sid)
                expected = seg.length + sum(b.size_bytes for _, b in self.pending_merge)
                if (
                    offset != expected
                    or not 0 < len(data) <= SIDECAR_BLOCK_BYTES
                    or any(t != sid for t, _ in self.pending_merge)
                ):
                    raise ReplayError(f"merge data for segment {sid} at {offset} out of order")
                self.pending_merge.append((sid, SidecarEntry(offset, len(data), crc32(data))))
                return [(sid, offset, data)]
            case MergeCommitRecord(sid, length, ms, source_id, source_name):
                seg = self._segment(sid)
                chunks, self.pending_merge = self.pending_merge, []
                if any(t != sid for t, _ in chunks) or length != seg.length + sum(
                    b.size_bytes for _, b in chunks
                ):
                    raise ReplayError(f"merge commit for segment {sid} does not match its data")
                if seg.sealed:
                    raise ReplayError(f"merge into sealed segment {sid}")
                seg.add_blocks([b for _, b in chunks])
                if length > seg.length:
                    seg.times.note(seg.length, ms)
                seg.length = length
                seg.modified_ms = ms
                self.commits.pop((source_id, source_name), None)
                self.commits[(source_id, source_name)] = seg.name
                while len(self.commits) > MAX_MERGE_MEMORY:
                    del self.commits[next(iter(self.commits))]
        return []
