"""Byte layouts of every DiskStore file, with pure encoders and decoders.

This module is the format's definition: nothing here does I/O, and
``docs/storage-format.md`` repeats these tables with the lifecycle around
them. All integers are big-endian. Every byte written to disk is covered by a
CRC-32 (the IEEE polynomial of ``zlib.crc32``; computed with zlib-ng's
vectorised ``crc32``, same values, see ``crc32`` below): a record's or file's own
checksum, or, for segment data files, the sidecar's per-block checksums.

Manifest (``<root>/manifest``, written once when a data dir is created)::

    position  size  field
    0         8     magic b"HRMANIF1"
    8         4     format version (u32), FORMAT_VERSION
    12        4     container count (u32), fixed for the life of the data dir
    16        8     creation time, ms since the epoch (i64)
    24        4     CRC-32 of bytes 0..24

A data dir whose segments are placed by another mapping than the plain hash
(``layout.SegmentMapping``) has a 32-byte manifest saying which, so that a
release that knows no mapping refuses the dir instead of looking for its
segments in the wrong containers::

    0         8     magic b"HRMANIF2"
    8         4     format version (u32), FORMAT_VERSION
    12        4     container count (u32)
    16        8     creation time, ms since the epoch (i64)
    24        4     segment mapping (u32, ``SegmentMapping``; never 0, ``HASH``)
    28        4     CRC-32 of bytes 0..28

Write-ahead log file (``containers/NNNN/wal/<first_seq:020d>.wal``)::

    file header:
    0         8     magic b"HRWAL001"
    8         4     format version (u32)
    12        4     container id (u32)
    16        8     sequence number of the file's first record (u64)
    24        4     CRC-32 of bytes 0..24
    synced mark (version 3; versions 1 and 2 have none, their records start at 28):
    28        8     synced end: a file position this file was fsynced up to (u64)
    36        4     CRC-32 of bytes 28..36
    then records, back to back (from 40):
    +0        4     payload size P (u32), bytes after this 8-byte frame header
    +4        4     CRC-32 of the 4 size bytes followed by the P payload bytes
    +8        8     record sequence number (u64), +1 per record within a container
    +16       1     record type (u8, ``RecordType``)
    +17       P-9   body, by type (below)

Record bodies (``data`` and names run to the end of the payload)::

    CREATE        segment id u64, kind u8 (0 stream, 1 table), modified ms i64, name (UTF-8)
    APPEND        segment id u64, offset u64, modified ms i64, has writer u8,
                  writer id 16 bytes, event number i64, data
    APPEND_REF    segment id u64, offset u64, modified ms i64, has writer u8,
                  writer id 16 bytes, event number i64, size u32, CRC-32 of the data u32
    SEAL          segment id u64, modified ms i64
    TRUNCATE      segment id u64, new start offset u64, modified ms i64
    DELETE        segment id u64, merged u8 (1: deleted by a merge), target name (UTF-8)
    ATTRIBUTE     segment id u64, attribute id 16 bytes, value i64, modified ms i64
    MERGE_DATA    target segment id u64, offset u64, data (one chunk of the source)
    MERGE_COMMIT  target segment id u64, new length u64, modified ms i64,
                  source segment id u64, source name (UTF-8)

A merge is zero or more MERGE_DATA records followed by their MERGE_COMMIT,
always written back to back; the chunks take effect only with the commit.

APPEND_REF (format version 2) is an append whose data is *not* in the log: it
was written once, to the segment's data file at ``offset``, and the record
carries its size and CRC-32 instead (architecture.md#invariant-torn-tail: checksums beside the
data). The container writes the data before the record and, under every
policy, syncs the data file before the WAL sync that covers the record, so a
durable APPEND_REF always has its bytes; recovery reads them back and treats
missing or mismatching bytes as a torn tail (``recovery.py``). Large appends
use it (``container.REF_APPEND_BYTES``: 256 KiB under ``fsync always``, 16 KiB
under ``interval`` and ``never``), smaller ones stay APPENDs: for them a
data-file sync per round, or the reference's own cost, is more than the second
page-cache copy.

The synced mark (format version 3) is rewritten in place after every WAL
sync, with the file size the sync covered, and reaches the disk with the next
sync: it never claims more than was synced, and lags the truth by at most one
sync. Recovery uses it to tell a torn write of never-synced records (damage at
or past the mark, even with valid records after it: cut) from damage to
synced records (refused). A mark whose CRC fails says nothing (the file is then
read as a version 2 file is: damage with valid records after it is refused).

Version 1, 2 and 3 data dirs are read as they are (version 1 and 2 WAL files
have no mark, no snapshot before version 4 has a time index); opening one with
this version rewrites its manifest to version 4 before any
record is written, so that an older release refuses the dir instead of
misreading the newer files.

Container snapshot (``containers/NNNN/snapshot``, replaced atomically)::

    header:
    0         8     magic b"HRSNAP01"
    8         4     format version (u32)
    12        4     container id (u32)
    16        8     sequence number of the last record it covers (u64)
    24        8     next segment id to hand out (u64)
    32        4     segment count S (u32)
    36        4     merged-source count M (u32)
    40        4     merge-commit count C (u32)
    S segments:
    +0        8     segment id (u64)
    +8        1     kind (u8)
    +9        8     start offset (u64)
    +17       8     length (u64)
    +25       1     sealed (u8)
    +26       8     last modified ms (i64)
    +34       4     name size N (u32)
    +38       4     attribute count A (u32)
    +42       8     sidecar size in bytes that covers [0, length) (u64)
    +50       N     name (UTF-8)
    then A x (attribute id 16 bytes, value i64)
    then (version 4) the segment's append-time index:
    +0        4     step in ms between entries (u32, at least 1)
    +4        4     entry count T (u32), at most MAX_TIME_INDEX_ENTRIES
    then T x (segment offset u64, append time ms i64), both ascending
    M merged sources (recent merges, so a retried merge still succeeds):
    +0        4     source name size (u32)
    +4        4     target name size (u32)
    then both names (UTF-8)
    C merge commits (recent merges into this container's segments):
    +0        8     source segment id (u64)
    +8        4     source name size (u32)
    +12       4     target name size (u32)
    then both names (UTF-8)
    trailer:
    +0        4     CRC-32 of every byte before the trailer

Checksum sidecar (``containers/NNNN/segments/<id:016x>.crc``)::

    file header:
    0         8     magic b"HRCRC001"
    8         4     format version (u32)
    12        8     segment id (u64)
    20        4     CRC-32 of bytes 0..20
    then entries, one per block of the data file, contiguous from offset 0:
    +0        8     segment offset of the block (u64) (= position in the data file)
    +8        4     block size in bytes (u32), at most SIDECAR_BLOCK_BYTES
    +12       4     CRC-32 of the block's bytes in the data file
    +16       4     CRC-32 of the entry's first 16 bytes

Segment data file (``containers/NNNN/segments/<id:016x>.data``): the segment's
bytes, offset N at position N, no header and no framing (architecture.md#invariant-torn-tail).
"""

from __future__ import annotations

import enum
import itertools
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from uuid import UUID

from zlib_ng.zlib_ng import crc32 as _zlib_ng_crc32
from zlib_ng.zlib_ng import crc32_combine as _zlib_ng_crc32_combine

from headrace.errors import CorruptionError
from headrace.store._timeindex import MAX_TIME_INDEX_ENTRIES
from headrace.store.api import MAX_APPEND_BYTES, MAX_NAME_BYTES
from headrace.store.disk.layout import SegmentMapping
from headrace.types import SegmentKind, WriterAppend

__all__ = [
    "FORMAT_VERSION",
    "FRAME_HEADER",
    "MAX_RECORD_PAYLOAD_BYTES",
    "MERGE_CHUNK_BYTES",
    "READABLE_VERSIONS",
    "SIDECAR_BLOCK_BYTES",
    "SIDECAR_ENTRY",
    "SIDECAR_HEADER",
    "SYNCED_MARK",
    "SYNCED_MARK_VERSION",
    "TIME_INDEX_VERSION",
    "WAL_HEADER",
    "WAL_HEADER_V2",
    "AppendRecord",
    "AppendRefRecord",
    "AttributeRecord",
    "CreateRecord",
    "DeleteRecord",
    "Manifest",
    "MergeCommitRecord",
    "MergeDataRecord",
    "Record",
    "RecordType",
    "SealRecord",
    "SidecarEntry",
    "Snapshot",
    "SnapshotSegment",
    "TruncateRecord",
    "WalHeader",
    "crc32",
    "crc32_combine",
    "decode_manifest",
    "decode_record",
    "decode_sidecar",
    "decode_snapshot",
    "decode_wal_header",
    "encode_manifest",
    "encode_record",
    "encode_sidecar_entries",
    "encode_sidecar_header",
    "encode_snapshot",
    "encode_synced_mark",
    "encode_wal_header",
]

FORMAT_VERSION = 4
"""Bumped on any incompatible change; a reader refuses versions it does not know.
Version 2 added the APPEND_REF record; version 3 the WAL file's synced mark;
version 4 the snapshot's per-segment time index; every other layout is version 1's."""

READABLE_VERSIONS = frozenset({1, 2, 3, FORMAT_VERSION})
"""Versions this code reads: version 1, 2 and 3 data dirs are opened (their files
are the same layouts, version 1 holds no APPEND_REF, neither 1 nor 2 has a
synced mark, no snapshot before 4 has a time index); files written now carry
version 4."""

TIME_INDEX_VERSION = 4
"""First format version whose snapshots carry each segment's time index."""

SYNCED_MARK_VERSION = 3
"""First format version whose WAL files carry a synced mark."""

crc32 = _zlib_ng_crc32
"""CRC-32 with the IEEE polynomial, exactly ``zlib.crc32``'s values (the format
did not change), from zlib-ng: its carry-less-multiply kernel runs at 15-40 GB/s
here against the system zlib's 2 GB/s, and every appended byte is checksummed
twice (WAL frame, sidecar block), which made the CRC the largest single cost of
a large append (a third of the server's CPU for 10 KiB events)."""

crc32_combine = _zlib_ng_crc32_combine
"""``crc32_combine(crc_a, crc_b, len_b)``: the CRC-32 of A + B from the CRCs of A
and B (zlib's function, O(log len_b), no data read). An APPEND_REF's payload is
checksummed once and that CRC extends the sidecar block too."""

MANIFEST_MAGIC = b"HRMANIF1"
MAPPED_MANIFEST_MAGIC = b"HRMANIF2"
WAL_MAGIC = b"HRWAL001"
SNAPSHOT_MAGIC = b"HRSNAP01"
SIDECAR_MAGIC = b"HRCRC001"

MANIFEST = struct.Struct(">8sIIqI")
assert MANIFEST.size == 28

MAPPED_MANIFEST = struct.Struct(">8sIIqII")
"""A manifest recording a segment mapping other than ``HASH`` (see above)."""
assert MAPPED_MANIFEST.size == 32

WAL_HEADER_V2 = struct.Struct(">8sIIQI")
"""magic, version, container id, first record sequence number, CRC of the rest:
a whole version 1 or 2 header, and the first part of a version 3 one."""
assert WAL_HEADER_V2.size == 28

SYNCED_MARK = struct.Struct(">QI")
"""synced end (a file position), CRC of it; after the version 3 header's first part."""
assert SYNCED_MARK.size == 12

WAL_HEADER = struct.Struct(">8sIIQIQI")
"""The version 3 WAL file header: the first part, then the synced mark. Records
start at its size."""
assert WAL_HEADER.size == WAL_HEADER_V2.size + SYNCED_MARK.size == 40

FRAME_HEADER = struct.Struct(">II")
"""payload size, CRC-32 over (size bytes + payload)."""
assert FRAME_HEADER.size == 8

PAYLOAD_HEADER = struct.Struct(">QB")
"""record sequence number, record type."""
assert PAYLOAD_HEADER.size == 9

CREATE_BODY = struct.Struct(">QBq")
assert CREATE_BODY.size == 17
APPEND_BODY = struct.Struct(">QQqB16sq")
assert APPEND_BODY.size == 49
APPEND_REF_BODY = struct.Struct(">QQqB16sqII")
assert APPEND_REF_BODY.size == 57
SEAL_BODY = struct.Struct(">Qq")
assert SEAL_BODY.size == 16
TRUNCATE_BODY = struct.Struct(">QQq")
assert TRUNCATE_BODY.size == 24
DELETE_BODY = struct.Struct(">QB")
assert DELETE_BODY.size == 9
ATTRIBUTE_BODY = struct.Struct(">Q16sqq")
assert ATTRIBUTE_BODY.size == 40
MERGE_DATA_BODY = struct.Struct(">QQ")
assert MERGE_DATA_BODY.size == 16
MERGE_COMMIT_BODY = struct.Struct(">QQqQ")
assert MERGE_COMMIT_BODY.size == 32

SNAPSHOT_HEADER = struct.Struct(">8sIIQQIII")
assert SNAPSHOT_HEADER.size == 44
SNAPSHOT_SEGMENT = struct.Struct(">QBQQBqIIQ")
assert SNAPSHOT_SEGMENT.size == 50
SNAPSHOT_ATTRIBUTE = struct.Struct(">16sq")
assert SNAPSHOT_ATTRIBUTE.size == 24
SNAPSHOT_TIME_INDEX = struct.Struct(">II")
assert SNAPSHOT_TIME_INDEX.size == 8
SNAPSHOT_TIME_ENTRY = struct.Struct(">Qq")
assert SNAPSHOT_TIME_ENTRY.size == 16
SNAPSHOT_MERGED = struct.Struct(">II")
assert SNAPSHOT_MERGED.size == 8
SNAPSHOT_COMMIT = struct.Struct(">QII")
assert SNAPSHOT_COMMIT.size == 16
SNAPSHOT_TRAILER = struct.Struct(">I")
assert SNAPSHOT_TRAILER.size == 4

SIDECAR_HEADER = struct.Struct(">8sIQI")
assert SIDECAR_HEADER.size == 24
SIDECAR_ENTRY = struct.Struct(">QIII")
assert SIDECAR_ENTRY.size == 20

SIDECAR_BLOCK_BYTES = 1024 * 1024
"""Largest data block one sidecar entry covers: 20 bytes of checksum per MiB
(0.002 %), and a damaged block still pins the damage to within 1 MiB."""

MERGE_CHUNK_BYTES = SIDECAR_BLOCK_BYTES
"""Source bytes per MERGE_DATA record. Each chunk becomes exactly one sidecar
block when its commit is applied, so a merge never has to hold the moved bytes
in memory to checksum them; a GiB transaction is a thousand records."""

MAX_RECORD_PAYLOAD_BYTES = MAX_APPEND_BYTES + MAX_NAME_BYTES + 4096
"""Largest payload a valid record can have: the largest append plus the
longest name plus fixed fields. A size field above it is damage, not a record."""

KIND_CODES = {SegmentKind.STREAM: 0, SegmentKind.TABLE: 1}
KINDS_BY_CODE = {code: kind for kind, code in KIND_CODES.items()}

_NAME_ERRORS = "surrogatepass"
"""Names are any ``str``; lone surrogates round-trip through UTF-8 with this handler."""


def encode_name(name: str) -> bytes:
    return name.encode("utf-8", _NAME_ERRORS)


def decode_name(raw: bytes | memoryview, path: str, position: int) -> str:
    try:
        return bytes(raw).decode("utf-8", _NAME_ERRORS)
    except UnicodeDecodeError as exc:
        raise CorruptionError(path, position, f"name is not UTF-8: {exc}") from None


def _kind(code: int, path: str, position: int) -> SegmentKind:
    kind = KINDS_BY_CODE.get(code)
    if kind is None:
        raise CorruptionError(path, position, f"unknown segment kind code {code}")
    return kind


# --------------------------------------------------------------------------- manifest


@dataclass(frozen=True, slots=True)
class Manifest:
    container_count: int
    created_ms: int
    version: int = FORMAT_VERSION
    """The version the file says (encoding always writes ``FORMAT_VERSION``)."""
    mapping: SegmentMapping = SegmentMapping.HASH
    """How segment names give containers; ``HASH`` when the file records none."""


def encode_manifest(manifest: Manifest) -> bytes:
    """The 28-byte manifest under ``HASH`` (what every release reads), else the 32-byte one."""
    count, created_ms = manifest.container_count, manifest.created_ms
    if manifest.mapping is SegmentMapping.HASH:
        head = MANIFEST.pack(MANIFEST_MAGIC, FORMAT_VERSION, count, created_ms, 0)[:-4]
    else:
        head = MAPPED_MANIFEST.pack(
            MAPPED_MANIFEST_MAGIC, FORMAT_VERSION, count, created_ms, manifest.mapping, 0
        )[:-4]
    return head + struct.pack(">I", crc32(head))


def decode_manifest(raw: bytes, path: str) -> Manifest:
    mapped = raw[:8] == MAPPED_MANIFEST_MAGIC
    layout = MAPPED_MANIFEST if mapped else MANIFEST
    if len(raw) != layout.size:
        raise CorruptionError(path, 0, f"manifest is {len(raw)} bytes, expected {layout.size}")
    if crc32(raw[:-4]) != struct.unpack_from(">I", raw, layout.size - 4)[0]:
        raise CorruptionError(path, 0, "manifest checksum mismatch")
    magic, version, count, created_ms = struct.unpack_from(">8sIIq", raw)
    if magic not in (MANIFEST_MAGIC, MAPPED_MANIFEST_MAGIC):
        raise CorruptionError(path, 0, f"bad manifest magic {magic!r}")
    if version not in READABLE_VERSIONS:
        raise CorruptionError(path, 8, f"unsupported format version {version}")
    if count < 1:
        raise CorruptionError(path, 12, "container count is zero")
    mapping = SegmentMapping.HASH
    if mapped:
        code = struct.unpack_from(">I", raw, 24)[0]
        try:
            mapping = SegmentMapping(code)
        except ValueError:
            raise CorruptionError(path, 24, f"unknown segment mapping {code}") from None
        if mapping is SegmentMapping.HASH:
            raise CorruptionError(path, 24, "segment mapping 0 in a mapped manifest")
    return Manifest(count, created_ms, version, mapping)


# --------------------------------------------------------------------------- WAL


@dataclass(frozen=True, slots=True)
class WalHeader:
    """What a WAL file's header says."""

    container_id: int
    first_seq: int
    version: int
    records_at: int
    """File position of the first record (the header's size for its version)."""
    synced_end: int | None
    """The synced mark: the file was fsynced at least up to this position (None:
    a version without one, or a mark whose CRC fails, which says nothing)."""


def encode_wal_header(container_id: int, first_seq: int) -> bytes:
    """A version 3 header whose synced mark covers the header itself."""
    head = WAL_HEADER_V2.pack(WAL_MAGIC, FORMAT_VERSION, container_id, first_seq, 0)[:-4]
    return head + struct.pack(">I", crc32(head)) + encode_synced_mark(WAL_HEADER.size)


def encode_synced_mark(synced_end: int) -> bytes:
    """The 12 bytes written at ``WAL_HEADER_V2.size`` after a sync up to ``synced_end``."""
    raw = struct.pack(">Q", synced_end)
    return raw + struct.pack(">I", crc32(raw))


def decode_wal_header(raw: bytes, path: str) -> WalHeader:
    """Decode a WAL file header (either layout).

    Raises:
        CorruptionError: incomplete, bad CRC, bad magic, unknown version
            (position 0 or 8). A synced mark whose CRC fails is not an error.
    """
    if len(raw) < WAL_HEADER_V2.size:
        raise CorruptionError(path, 0, "WAL header is incomplete")
    magic, version, container_id, first_seq, crc = WAL_HEADER_V2.unpack_from(raw)
    if crc32(raw[: WAL_HEADER_V2.size - 4]) != crc:
        raise CorruptionError(path, 0, "WAL header checksum mismatch")
    if magic != WAL_MAGIC:
        raise CorruptionError(path, 0, f"bad WAL magic {magic!r}")
    if version not in READABLE_VERSIONS:
        raise CorruptionError(path, 8, f"unsupported format version {version}")
    if version < SYNCED_MARK_VERSION:
        return WalHeader(container_id, first_seq, version, WAL_HEADER_V2.size, None)
    if len(raw) < WAL_HEADER.size:
        raise CorruptionError(path, 0, "WAL header is incomplete")
    synced_end, mark_crc = SYNCED_MARK.unpack_from(raw, WAL_HEADER_V2.size)
    start = WAL_HEADER_V2.size
    valid = crc32(raw[start : start + 8]) == mark_crc
    return WalHeader(
        container_id, first_seq, version, WAL_HEADER.size, synced_end if valid else None
    )


class RecordType(enum.IntEnum):
    """The WAL record types; each is one mutation of one container."""

    CREATE = 1
    APPEND = 2
    SEAL = 3
    TRUNCATE = 4
    DELETE = 5
    ATTRIBUTE = 6
    MERGE_DATA = 7
    MERGE_COMMIT = 8
    APPEND_REF = 9


@dataclass(frozen=True, slots=True)
class CreateRecord:
    segment_id: int
    kind: SegmentKind
    modified_ms: int
    name: str


@dataclass(frozen=True, slots=True)
class AppendRecord:
    segment_id: int
    offset: int
    modified_ms: int
    writer: WriterAppend | None
    data: bytes | memoryview


@dataclass(frozen=True, slots=True)
class AppendRefRecord:
    """An append whose ``size_bytes`` bytes are in the data file, not in the log.

    ``data`` is not encoded: the live store sets it to the bytes it writes to
    the data file, recovery to the bytes it read back and checked against
    ``crc``; ``ContainerState.apply`` needs them for the sidecar's blocks.
    """

    segment_id: int
    offset: int
    modified_ms: int
    writer: WriterAppend | None
    size_bytes: int
    crc: int
    data: bytes | memoryview = field(default=b"", compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class SealRecord:
    segment_id: int
    modified_ms: int


@dataclass(frozen=True, slots=True)
class TruncateRecord:
    segment_id: int
    offset: int
    modified_ms: int


@dataclass(frozen=True, slots=True)
class DeleteRecord:
    segment_id: int
    merged_into: str | None = None
    """The merge target when a merge removed the segment (remembered for retries)."""


@dataclass(frozen=True, slots=True)
class AttributeRecord:
    segment_id: int
    attribute_id: UUID
    value: int
    modified_ms: int


@dataclass(frozen=True, slots=True)
class MergeDataRecord:
    segment_id: int
    offset: int
    data: bytes | memoryview


@dataclass(frozen=True, slots=True)
class MergeCommitRecord:
    segment_id: int
    length: int
    modified_ms: int
    source_id: int
    source_name: str


Record = (
    CreateRecord
    | AppendRecord
    | AppendRefRecord
    | SealRecord
    | TruncateRecord
    | DeleteRecord
    | AttributeRecord
    | MergeDataRecord
    | MergeCommitRecord
)


def _body(record: Record) -> tuple[RecordType, bytes, bytes | memoryview]:
    """The record's type, fixed-size body part and variable tail."""
    match record:
        case CreateRecord(sid, kind, ms, name):
            return RecordType.CREATE, CREATE_BODY.pack(sid, KIND_CODES[kind], ms), encode_name(name)
        case AppendRecord(sid, offset, ms, writer, data):
            wid, event = (writer.writer_id.bytes, writer.event_number) if writer else (bytes(16), 0)
            head = APPEND_BODY.pack(sid, offset, ms, writer is not None, wid, event)
            return RecordType.APPEND, head, data
        case AppendRefRecord(sid, offset, ms, writer, size, crc):
            wid, event = (writer.writer_id.bytes, writer.event_number) if writer else (bytes(16), 0)
            head = APPEND_REF_BODY.pack(sid, offset, ms, writer is not None, wid, event, size, crc)
            return RecordType.APPEND_REF, head, b""
        case SealRecord(sid, ms):
            return RecordType.SEAL, SEAL_BODY.pack(sid, ms), b""
        case TruncateRecord(sid, offset, ms):
            return RecordType.TRUNCATE, TRUNCATE_BODY.pack(sid, offset, ms), b""
        case DeleteRecord(sid, target):
            tail = b"" if target is None else encode_name(target)
            return RecordType.DELETE, DELETE_BODY.pack(sid, target is not None), tail
        case AttributeRecord(sid, attribute_id, value, ms):
            head = ATTRIBUTE_BODY.pack(sid, attribute_id.bytes, value, ms)
            return RecordType.ATTRIBUTE, head, b""
        case MergeDataRecord(sid, offset, data):
            return RecordType.MERGE_DATA, MERGE_DATA_BODY.pack(sid, offset), data
        case MergeCommitRecord(sid, length, ms, source_id, source_name):
            head = MERGE_COMMIT_BODY.pack(sid, length, ms, source_id)
            return RecordType.MERGE_COMMIT, head, encode_name(source_name)
    raise AssertionError(f"not a record: {record!r}")  # pragma: no cover


_SIZE = struct.Struct(">I")
_APPEND_HEAD = struct.Struct(">QBQQqB16sq")
"""PAYLOAD_HEADER + APPEND_BODY in one pack, for the hot path."""
assert _APPEND_HEAD.size == PAYLOAD_HEADER.size + APPEND_BODY.size
_APPEND_REF_HEAD = struct.Struct(">QBQQqB16sqII")
"""PAYLOAD_HEADER + APPEND_REF_BODY in one pack, for the hot path."""
assert _APPEND_REF_HEAD.size == PAYLOAD_HEADER.size + APPEND_REF_BODY.size
_NO_WRITER = bytes(16)


def encode_record(seq: int, record: Record) -> list[bytes | memoryview]:
    """The framed record as buffers for ``os.writev`` (the data is not copied)."""
    if type(record) is AppendRecord:  # the hot path: same bytes as the general one
        writer = record.writer
        payload_head = _APPEND_HEAD.pack(
            seq,
            RecordType.APPEND,
            record.segment_id,
            record.offset,
            record.modified_ms,
            writer is not None,
            _NO_WRITER if writer is None else writer.writer_id.bytes,
            0 if writer is None else writer.event_number,
        )
        tail: bytes | memoryview = record.data
    elif type(record) is AppendRefRecord:  # the same bytes as the general path too
        writer = record.writer
        payload_head = _APPEND_REF_HEAD.pack(
            seq,
            RecordType.APPEND_REF,
            record.segment_id,
            record.offset,
            record.modified_ms,
            writer is not None,
            _NO_WRITER if writer is None else writer.writer_id.bytes,
            0 if writer is None else writer.event_number,
            record.size_bytes,
            record.crc,
        )
        tail = b""
    else:
        kind, head, tail = _body(record)
        payload_head = PAYLOAD_HEADER.pack(seq, kind) + head
    size = len(payload_head) + len(tail)
    assert size <= MAX_RECORD_PAYLOAD_BYTES, size
    size_bytes = _SIZE.pack(size)
    crc = crc32(tail, crc32(payload_head, crc32(size_bytes)))
    return [size_bytes + _SIZE.pack(crc) + payload_head, tail]


def decode_record(payload: memoryview, path: str, position: int) -> tuple[int, Record]:
    """Decode a checksum-verified payload into ``(seq, record)``.

    ``position`` is the file position of the record's frame, for errors.
    """
    if len(payload) < PAYLOAD_HEADER.size:
        raise CorruptionError(path, position, "record payload too short")
    seq, code = PAYLOAD_HEADER.unpack_from(payload)
    body = payload[PAYLOAD_HEADER.size :]
    try:
        kind = RecordType(code)
    except ValueError:
        raise CorruptionError(path, position, f"unknown record type {code}") from None
    try:
        return seq, _decode_body(kind, body, path, position)
    except struct.error as exc:
        raise CorruptionError(path, position, f"malformed {kind.name} record: {exc}") from None


def _decode_body(kind: RecordType, body: memoryview, path: str, position: int) -> Record:
    if kind is RecordType.CREATE:
        sid, code, ms = CREATE_BODY.unpack_from(body)
        name = decode_name(body[CREATE_BODY.size :], path, position)
        return CreateRecord(sid, _kind(code, path, position), ms, name)
    if kind is RecordType.APPEND:
        sid, offset, ms, has_writer, wid, event = APPEND_BODY.unpack_from(body)
        writer = WriterAppend(UUID(bytes=wid), event) if has_writer else None
        return AppendRecord(sid, offset, ms, writer, body[APPEND_BODY.size :])
    if kind is RecordType.APPEND_REF:
        if len(body) != APPEND_REF_BODY.size:
            raise CorruptionError(path, position, f"APPEND_REF body of {len(body)} bytes")
        sid, offset, ms, has_writer, wid, event, size, crc = APPEND_REF_BODY.unpack_from(body)
        if not 0 < size <= MAX_APPEND_BYTES:
            raise CorruptionError(path, position, f"APPEND_REF of {size} bytes")
        writer = WriterAppend(UUID(bytes=wid), event) if has_writer else None
        return AppendRefRecord(sid, offset, ms, writer, size, crc)
    if kind is RecordType.SEAL:
        return SealRecord(*SEAL_BODY.unpack_from(body))
    if kind is RecordType.TRUNCATE:
        return TruncateRecord(*TRUNCATE_BODY.unpack_from(body))
    if kind is RecordType.DELETE:
        sid, merged = DELETE_BODY.unpack_from(body)
        target = decode_name(body[DELETE_BODY.size :], path, position) if merged else None
        return DeleteRecord(sid, target)
    if kind is RecordType.ATTRIBUTE:
        sid, aid, value, ms = ATTRIBUTE_BODY.unpack_from(body)
        return AttributeRecord(sid, UUID(bytes=aid), value, ms)
    if kind is RecordType.MERGE_DATA:
        sid, offset = MERGE_DATA_BODY.unpack_from(body)
        return MergeDataRecord(sid, offset, body[MERGE_DATA_BODY.size :])
    sid, length, ms, source_id = MERGE_COMMIT_BODY.unpack_from(body)
    name = decode_name(body[MERGE_COMMIT_BODY.size :], path, position)
    return MergeCommitRecord(sid, length, ms, source_id, name)


@dataclass(frozen=True, slots=True)
class FrameProblem:
    """Why no record could be read at ``position`` (a tear or damage)."""

    position: int
    reason: str


def scan_frames(
    buf: bytes, start: int, path: str
) -> Iterator[tuple[int, int, Record] | FrameProblem]:
    """Yield ``(position, seq, record)`` for each valid record from ``start``;
    stop at the end of ``buf`` or yield one ``FrameProblem`` and stop."""
    view = memoryview(buf)
    position = start
    end = len(buf)
    while position < end:
        problem = check_frame(buf, position)
        if problem is not None:
            yield FrameProblem(position, problem)
            return
        (size, _) = FRAME_HEADER.unpack_from(buf, position)
        payload = view[position + FRAME_HEADER.size : position + FRAME_HEADER.size + size]
        try:
            seq, record = decode_record(payload, path, position)
        except CorruptionError as exc:
            yield FrameProblem(position, exc.reason)
            return
        yield position, seq, record
        position += FRAME_HEADER.size + size


def check_frame(buf: bytes, position: int) -> str | None:
    """``None`` if a whole frame with a valid checksum starts at ``position``."""
    remaining = len(buf) - position
    if remaining < FRAME_HEADER.size:
        return "incomplete frame header"
    size, crc = FRAME_HEADER.unpack_from(buf, position)
    if size < PAYLOAD_HEADER.size or size > MAX_RECORD_PAYLOAD_BYTES:
        return f"implausible record size {size}"
    if remaining < FRAME_HEADER.size + size:
        return "incomplete record"
    start = position + FRAME_HEADER.size
    size_crc = crc32(buf[position : position + 4])
    actual = crc32(memoryview(buf)[start : start + size], size_crc)
    if actual != crc:
        return "record checksum mismatch"
    return None


def frame_seq(buf: bytes, position: int) -> int | None:
    """The sequence number a frame at ``position`` claims, without checking it."""
    if len(buf) - position < FRAME_HEADER.size + PAYLOAD_HEADER.size:
        return None
    seq: int = struct.unpack_from(">Q", buf, position + FRAME_HEADER.size)[0]
    return seq


# --------------------------------------------------------------------------- snapshot


@dataclass(slots=True)
class SnapshotSegment:
    segment_id: int
    name: str
    kind: SegmentKind
    start_offset: int
    length: int
    sealed: bool
    modified_ms: int
    attributes: dict[UUID, int]
    sidecar_size: int
    time_step_ms: int = 1
    times: list[tuple[int, int]] = field(default_factory=list)
    """The append-time index's entries (offset, ms); empty in a snapshot before version 4."""


@dataclass(slots=True)
class Snapshot:
    container_id: int
    last_seq: int
    next_segment_id: int
    segments: list[SnapshotSegment] = field(default_factory=list)
    merged: list[tuple[str, str]] = field(default_factory=list)
    """(source name, target name) of recent merges of this container's segments."""
    commits: list[tuple[int, str, str]] = field(default_factory=list)
    """(source id, source name, target name) of recent merges into this container's
    segments: recovery finishes a merge whose source deletion was not yet durable."""


def encode_snapshot(snapshot: Snapshot, *, version: int = FORMAT_VERSION) -> bytes:
    """The snapshot's bytes; an older ``version``'s layout (no time index before
    version 4) only to make test data of that version."""
    parts = [
        SNAPSHOT_HEADER.pack(
            SNAPSHOT_MAGIC,
            version,
            snapshot.container_id,
            snapshot.last_seq,
            snapshot.next_segment_id,
            len(snapshot.segments),
            len(snapshot.merged),
            len(snapshot.commits),
        )
    ]
    for s in snapshot.segments:
        name = encode_name(s.name)
        parts.append(
            SNAPSHOT_SEGMENT.pack(
                s.segment_id,
                KIND_CODES[s.kind],
                s.start_offset,
                s.length,
                s.sealed,
                s.modified_ms,
                len(name),
                len(s.attributes),
                s.sidecar_size,
            )
        )
        parts.append(name)
        parts.extend(SNAPSHOT_ATTRIBUTE.pack(a.bytes, v) for a, v in s.attributes.items())
        if version >= TIME_INDEX_VERSION:
            parts.append(SNAPSHOT_TIME_INDEX.pack(s.time_step_ms, len(s.times)))
            parts.extend(SNAPSHOT_TIME_ENTRY.pack(o, t) for o, t in s.times)
    for source, target in snapshot.merged:
        source_raw, target_raw = encode_name(source), encode_name(target)
        parts += [SNAPSHOT_MERGED.pack(len(source_raw), len(target_raw)), source_raw, target_raw]
    for source_id, source, target in snapshot.commits:
        source_raw, target_raw = encode_name(source), encode_name(target)
        parts += [
            SNAPSHOT_COMMIT.pack(source_id, len(source_raw), len(target_raw)),
            source_raw,
            target_raw,
        ]
    body = b"".join(parts)
    return body + SNAPSHOT_TRAILER.pack(crc32(body))


def decode_snapshot(raw: bytes, path: str) -> Snapshot:
    size = len(raw)
    if size < SNAPSHOT_HEADER.size + SNAPSHOT_TRAILER.size:
        raise CorruptionError(path, 0, f"snapshot is only {size} bytes")
    (crc,) = SNAPSHOT_TRAILER.unpack_from(raw, size - SNAPSHOT_TRAILER.size)
    if crc32(memoryview(raw)[: size - SNAPSHOT_TRAILER.size]) != crc:
        raise CorruptionError(path, size - SNAPSHOT_TRAILER.size, "snapshot checksum mismatch")
    try:
        return _decode_snapshot(raw, path)
    except (struct.error, IndexError) as exc:
        raise CorruptionError(path, 0, f"malformed snapshot: {exc}") from None


def _decode_snapshot(raw: bytes, path: str) -> Snapshot:
    end = len(raw) - SNAPSHOT_TRAILER.size
    magic, version, cid, last_seq, next_id, n_seg, n_merged, n_commits = (
        SNAPSHOT_HEADER.unpack_from(raw)
    )
    if magic != SNAPSHOT_MAGIC:
        raise CorruptionError(path, 0, f"bad snapshot magic {magic!r}")
    if version not in READABLE_VERSIONS:
        raise CorruptionError(path, 8, f"unsupported format version {version}")
    snap = Snapshot(cid, last_seq, next_id)
    pos = SNAPSHOT_HEADER.size

    def take(n: int) -> bytes:
        nonlocal pos
        if pos + n > end:
            raise CorruptionError(path, pos, "snapshot entry runs past the end")
        chunk = raw[pos : pos + n]
        pos += n
        return chunk

    for _ in range(n_seg):
        at = pos
        sid, code, start, length, sealed, ms, name_size, n_attr, sidecar = SNAPSHOT_SEGMENT.unpack(
            take(SNAPSHOT_SEGMENT.size)
        )
        name = decode_name(take(name_size), path, at)
        attrs: dict[UUID, int] = {}
        for _ in range(n_attr):
            aid, value = SNAPSHOT_ATTRIBUTE.unpack(take(SNAPSHOT_ATTRIBUTE.size))
            attrs[UUID(bytes=aid)] = value
        step, times = 1, []
        if version >= TIME_INDEX_VERSION:
            step, n_times = SNAPSHOT_TIME_INDEX.unpack(take(SNAPSHOT_TIME_INDEX.size))
            if step < 1 or n_times > MAX_TIME_INDEX_ENTRIES:
                raise CorruptionError(path, at, f"segment {sid} has a malformed time index")
            times = [
                SNAPSHOT_TIME_ENTRY.unpack(take(SNAPSHOT_TIME_ENTRY.size)) for _ in range(n_times)
            ]
            if any(a[0] > b[0] or a[1] > b[1] for a, b in itertools.pairwise(times)):
                raise CorruptionError(path, at, f"segment {sid} time index is out of order")
        if start > length:
            raise CorruptionError(path, at, f"segment {sid} starts past its length")
        snap.segments.append(
            SnapshotSegment(
                sid,
                name,
                _kind(code, path, at),
                start,
                length,
                bool(sealed),
                ms,
                attrs,
                sidecar,
                step,
                times,
            )
        )
    for _ in range(n_merged):
        at = pos
        source_size, target_size = SNAPSHOT_MERGED.unpack(take(SNAPSHOT_MERGED.size))
        source = decode_name(take(source_size), path, at)
        snap.merged.append((source, decode_name(take(target_size), path, at)))
    for _ in range(n_commits):
        at = pos
        source_id, source_size, target_size = SNAPSHOT_COMMIT.unpack(take(SNAPSHOT_COMMIT.size))
        source = decode_name(take(source_size), path, at)
        snap.commits.append((source_id, source, decode_name(take(target_size), path, at)))
    if pos != end:
        raise CorruptionError(path, pos, "trailing bytes after the snapshot entries")
    return snap


# --------------------------------------------------------------------------- sidecar


@dataclass(frozen=True, slots=True)
class SidecarEntry:
    offset: int
    size_bytes: int
    crc: int


def encode_sidecar_header(segment_id: int) -> bytes:
    head = SIDECAR_HEADER.pack(SIDECAR_MAGIC, FORMAT_VERSION, segment_id, 0)[:-4]
    return head + struct.pack(">I", crc32(head))


def encode_sidecar_entries(entries: list[SidecarEntry]) -> bytes:
    out = bytearray()
    for e in entries:
        head = struct.pack(">QII", e.offset, e.size_bytes, e.crc)
        out += head + struct.pack(">I", crc32(head))
    return bytes(out)


def decode_sidecar(raw: bytes, segment_id: int, path: str) -> list[SidecarEntry]:
    """All entries of a sidecar, checked: header, entry checksums, contiguity from 0."""
    if len(raw) < SIDECAR_HEADER.size:
        raise CorruptionError(path, 0, "sidecar header is incomplete")
    magic, version, sid, crc = SIDECAR_HEADER.unpack_from(raw)
    if crc32(raw[: SIDECAR_HEADER.size - 4]) != crc:
        raise CorruptionError(path, 0, "sidecar header checksum mismatch")
    if magic != SIDECAR_MAGIC or version not in READABLE_VERSIONS or sid != segment_id:
        raise CorruptionError(path, 0, f"sidecar header does not belong to segment {segment_id}")
    if (len(raw) - SIDECAR_HEADER.size) % SIDECAR_ENTRY.size:
        raise CorruptionError(path, len(raw), "sidecar ends inside an entry")
    entries = []
    expected_offset = 0
    for position in range(SIDECAR_HEADER.size, len(raw), SIDECAR_ENTRY.size):
        offset, size, data_crc, entry_crc = SIDECAR_ENTRY.unpack_from(raw, position)
        if crc32(raw[position : position + 16]) != entry_crc:
            raise CorruptionError(path, position, "sidecar entry checksum mismatch")
        if offset != expected_offset or size == 0 or size > SIDECAR_BLOCK_BYTES:
            raise CorruptionError(path, position, f"sidecar entry for offset {offset} out of order")
        entries.append(SidecarEntry(offset, size, data_crc))
        expected_offset = offset + size
    return entries
