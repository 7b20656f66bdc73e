"""The write-ahead log: appending framed records, reading them back, and file syncing.

One WAL per container. Records are written with one ``writev`` each and
synced by the container's committer (group commit, see ``commit.py``).
A WAL file is never appended to again once a checkpoint has started the next
one, so only the *last* file of a container can have a torn tail.

Telling a torn tail from damage (``scan_wal``): reading stops at the first
frame that is incomplete or fails its checksum. In the last file that is a
torn write, unless a valid record with a later sequence number can still be
found further on; then the log is damaged in the middle, and recovery
refuses to guess (``CorruptionError``), unless the problem lies at or past
the file's synced mark: a write that was never synced can reach the disk
in pieces (its first and last pages, not the middle), and none of its
records was acknowledged. In any earlier file, any bad frame is damage.

The synced mark (``WalWriter.mark_synced``) is rewritten in the file's
header after every sync, through a descriptor of its own (the records'
descriptor appends, and ``pwrite`` on it would too). It costs no sync of its
own: the next sync of the file takes it to the disk, so it may lag one sync
behind, but never claims bytes that were not synced.
"""

from __future__ import annotations

import errno
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from headrace.errors import CorruptionError
from headrace.store.disk.format import (
    FRAME_HEADER,
    PAYLOAD_HEADER,
    WAL_HEADER,
    WAL_HEADER_V2,
    FrameProblem,
    Record,
    RecordType,
    check_frame,
    decode_wal_header,
    encode_synced_mark,
    encode_wal_header,
    frame_seq,
    scan_frames,
)

__all__ = [
    "DIR_MODE",
    "FILE_MODE",
    "FileOps",
    "WalScan",
    "WalWriter",
    "atomic_write",
    "find_later_record",
    "fsync_dir",
    "make_dir",
    "scan_wal",
    "torn_unsynced",
]

FILE_MODE: Final = 0o600
"""Every file of a data dir: it holds every stored byte, readable by its owner only
(``docs/threat-model.md``; the process umask can only take bits away)."""

DIR_MODE: Final = 0o700
"""Every directory of a data dir, for the same reason."""

_fdatasync = getattr(os, "fdatasync", os.fsync)

_IOV_MAX = 1024
"""Most buffers one ``writev`` takes (Linux ``IOV_MAX``); longer lists are joined first."""

MIN_FRAME_BYTES = FRAME_HEADER.size + PAYLOAD_HEADER.size
"""Smallest possible record frame (a payload with no body), for bounding seq searches."""


class FileOps:
    """The syscalls durability depends on, in one replaceable place.

    Tests subclass it to count syncs or to make a write or sync fail (fault
    injection); the store uses exactly one instance. Counters are plain ints
    (updated from worker threads, under the GIL).
    """

    def __init__(self) -> None:
        self.wal_syncs = 0
        self.file_syncs = 0
        self.data_syncs = 0

    def sync_data(self, fd: int) -> None:
        """Make the bytes of APPEND_REF records durable in a data file
        (``fdatasync``: the data and the file size), before the WAL sync that
        covers the records."""
        self.data_syncs += 1
        _fdatasync(fd)

    def sync_wal(self, fd: int) -> None:
        """Make a WAL file's written records durable (``fdatasync``)."""
        self.wal_syncs += 1
        _fdatasync(fd)

    def sync_file(self, fd: int) -> None:
        """Make a data, sidecar, snapshot or directory file durable (``fsync``)."""
        self.file_syncs += 1
        os.fsync(fd)

    def write(self, fd: int, buffers: list[bytes | memoryview], size_bytes: int) -> None:
        """Append ``buffers`` (``size_bytes`` in all) to a WAL file, retrying short writes."""
        written = os.writev(fd, buffers) if len(buffers) <= _IOV_MAX else 0
        if written == size_bytes:
            return
        rest = memoryview(b"".join(buffers))[written:]
        while rest:
            rest = rest[os.write(fd, rest) :]

    def pwritev(self, fd: int, buffers: list[bytes | memoryview], position: int) -> None:
        """Write contiguous buffers at ``position`` of a data file."""
        if len(buffers) == 1:
            self.pwrite(fd, buffers[0], position)
            return
        size_bytes = sum(len(b) for b in buffers)
        written = os.pwritev(fd, buffers, position) if len(buffers) <= _IOV_MAX else 0
        if written != size_bytes:
            self.pwrite(fd, memoryview(b"".join(buffers))[written:], position + written)

    def pwrite(self, fd: int, data: bytes | memoryview, position: int) -> None:
        """Write segment bytes at ``position`` of a data file, retrying short writes."""
        view = memoryview(data)
        while view:
            written = os.pwrite(fd, view, position)
            view = view[written:]
            position += written

    def write_mark(self, fd: int, mark: bytes, position: int) -> None:
        """Rewrite a WAL file's synced mark in place (12 bytes in a page the
        file already has: no new space is needed)."""
        os.pwrite(fd, mark, position)

    def reserve(self, fd: int, size_bytes: int) -> None:
        """Allocate ``size_bytes`` of disk space to ``fd`` (a throw-away file):
        recovery asks for the room it will need before it changes anything
        (where the file system has no ``fallocate``, nothing is asked).

        Raises:
            OSError: ENOSPC (or EDQUOT) if the space is not there.
        """
        try:
            os.posix_fallocate(fd, 0, size_bytes)
        except OSError as exc:
            # A file system without fallocate is not asked: writing the bytes
            # to find out would cost more than the recovery itself.
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                raise


def make_dir(path: Path) -> None:
    """Create a directory of a data dir (``DIR_MODE``); an existing one is kept as it is."""
    path.mkdir(mode=DIR_MODE, exist_ok=True)


def fsync_dir(path: Path, ops: FileOps) -> None:
    """Make a directory's entries (creations, renames, unlinks) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        ops.sync_file(fd)
    finally:
        os.close(fd)


def sync_path(path: Path, ops: FileOps) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        ops.sync_file(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, tmp: Path, data: bytes, ops: FileOps) -> None:
    """Replace ``path`` with ``data``: write ``tmp``, fsync, rename, fsync the directory.

    If writing ``tmp`` fails it is removed again: ``path`` and the directory
    are as they were.
    """
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    try:
        ops.pwrite(fd, data, 0)
        ops.sync_file(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent, ops)


class WalWriter:
    """The open WAL file records are appended to (``fd``, opened to append), and
    a second descriptor of it for rewriting its synced mark (``mark_synced``)."""

    def __init__(self, path: Path, fd: int, mark_fd: int, first_seq: int, size_bytes: int) -> None:
        self.path = path
        self.fd = fd
        self.mark_fd = mark_fd
        self.first_seq = first_seq
        self.size_bytes = size_bytes

    @classmethod
    def create(cls, path: Path, container_id: int, first_seq: int, ops: FileOps) -> WalWriter:
        """Start a new WAL file with its header (synced later, with its first records).

        If the header cannot be written the file is removed again, so a full
        disk leaves no empty WAL file behind.
        """
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, FILE_MODE)
        mark_fd = -1
        try:
            header = encode_wal_header(container_id, first_seq)
            ops.write(fd, [header], len(header))
            mark_fd = os.open(path, os.O_WRONLY)
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        return cls(path, fd, mark_fd, first_seq, len(header))

    @classmethod
    def reopen(cls, path: Path, first_seq: int) -> WalWriter:
        """Continue an existing, already durable WAL file of this format version
        that holds no record."""
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        try:
            mark_fd = os.open(path, os.O_WRONLY)
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd, mark_fd, first_seq, os.fstat(fd).st_size)

    def append(self, buffers: list[bytes | memoryview], size_bytes: int, ops: FileOps) -> None:
        ops.write(self.fd, buffers, size_bytes)
        self.size_bytes += size_bytes

    def written_end(self) -> int:
        """The file's size now: what a sync that starts after this call covers."""
        return os.fstat(self.fd).st_size

    def mark_synced(self, synced_end: int, ops: FileOps) -> None:
        """Record that the file was synced up to ``synced_end`` (call only after
        that sync returned); the next sync of the file makes the mark durable."""
        ops.write_mark(self.mark_fd, encode_synced_mark(synced_end), WAL_HEADER_V2.size)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self.mark_fd >= 0:
            os.close(self.mark_fd)
            self.mark_fd = -1


@dataclass(slots=True)
class WalScan:
    """What one WAL file holds, as far as it can be read."""

    path: Path
    size_bytes: int
    first_seq: int = 0
    version: int = 0
    records_at: int = WAL_HEADER.size
    """File position of the first record (the header's size for its version)."""
    synced_end: int | None = None
    """The header's synced mark (None: none, or unreadable)."""
    records: list[tuple[int, int, Record]] = field(default_factory=list)
    """(file position, seq, record) of each valid record, in order."""
    end: int = 0
    """File position just after the last valid record (or header)."""
    problem: FrameProblem | None = None
    """Why reading stopped before the end of the file, if it did."""
    later_record_at: int | None = None
    """Position of a valid record found after ``problem`` (damage, not a tear)."""


def scan_wal(path: Path, container_id: int) -> WalScan:
    """Read every valid record of a WAL file and locate any problem.

    Raises:
        CorruptionError: the header is valid but names another container.
    """
    raw = path.read_bytes()
    scan = WalScan(path, len(raw))
    try:
        header = decode_wal_header(raw, str(path))
    except CorruptionError as exc:
        scan.problem = FrameProblem(0, exc.reason)
        scan.later_record_at = find_later_record(raw, WAL_HEADER_V2.size, 1)
        return scan
    if header.container_id != container_id:
        reason = f"WAL of container {header.container_id} in container {container_id}"
        raise CorruptionError(str(path), 12, reason)
    scan.first_seq = header.first_seq
    scan.version = header.version
    scan.records_at = header.records_at
    scan.synced_end = header.synced_end
    scan.end = header.records_at
    expected_seq = scan.first_seq
    for item in scan_frames(raw, header.records_at, str(path)):
        if isinstance(item, FrameProblem):
            scan.problem = item
            scan.later_record_at = find_later_record(raw, item.position + 1, expected_seq)
            break
        position, seq, _ = item
        if seq != expected_seq:
            scan.problem = FrameProblem(position, f"record seq {seq}, expected {expected_seq}")
            scan.later_record_at = position
            break
        scan.records.append(item)
        scan.end = position + FRAME_HEADER.size + struct.unpack_from(">I", raw, position)[0]
        expected_seq += 1
    return scan


def torn_unsynced(scan: WalScan) -> bool:
    """Whether ``scan``'s problem, with valid records after it, lies at or past
    the file's synced mark: a write that never became durable reached the disk
    in pieces (the first and the last, not the middle), so it is a torn tail
    like any other, and none of the records in or after it was acknowledged.
    (A whole, valid record with an unexpected sequence number is never a torn
    write: that is damage wherever it is.)"""
    return (
        scan.problem is not None
        and scan.synced_end is not None
        and scan.problem.position >= scan.synced_end
        and (scan.later_record_at is None or scan.later_record_at > scan.problem.position)
    )


def find_later_record(raw: bytes, start: int, min_seq: int) -> int | None:
    """Position of the first valid frame at or after ``start`` whose seq could
    follow ``min_seq - 1`` in this file, or None.

    Candidates are found with ``bytes.find`` on the high bytes of the possible
    sequence numbers, so a megabyte of torn garbage costs milliseconds.
    """
    max_seq = min_seq + (len(raw) - start) // MIN_FRAME_BYTES + 1
    seq_field = FRAME_HEADER.size  # the seq is the first payload field
    for high in range(min_seq >> 16, (max_seq >> 16) + 1):
        prefix = struct.pack(">Q", high << 16)[:6]
        hit = raw.find(prefix, start + seq_field)
        while hit >= 0:
            position = hit - seq_field
            seq = frame_seq(raw, position)
            if (
                seq is not None
                and min_seq <= seq <= max_seq
                and raw[position + seq_field + 8] in _RECORD_CODES
                and check_frame(raw, position) is None
            ):
                return position
            hit = raw.find(prefix, hit + 1)
    return None


_RECORD_CODES = frozenset(int(t) for t in RecordType)
