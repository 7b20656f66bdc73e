"""A container's WAL read back and cut back, for replication (``docs/replication.md``).

``read_wal_records``: the records still in the WAL files (since the last
checkpoint), with the data of each APPEND_REF read back from its data file
and checked against its CRC, so a new leader can send them to followers that
are slightly behind. ``cut_log``: a follower's log cut after a record, its
WAL bytes past it copied aside and cut off as a torn tail is
(``recovery.backup_and_cut``), when no checkpoint covers them.
Both are blocking: run them in a thread.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path

from headrace.store.disk.format import (
    AppendRecord,
    AppendRefRecord,
    FrameProblem,
    Record,
    decode_snapshot,
    decode_wal_header,
    scan_frames,
)
from headrace.store.disk.layout import ContainerPaths
from headrace.store.disk.log import FileOps
from headrace.store.disk.recovery import backup_and_cut

__all__ = ["cut_log", "read_wal_records"]


def _frames(path: Path) -> list[tuple[int, int, Record]]:
    """``(position, seq, record)`` of every whole record of one WAL file."""
    raw = path.read_bytes()
    header = decode_wal_header(raw, str(path))
    found = []
    for item in scan_frames(raw, header.records_at, str(path)):
        if isinstance(item, FrameProblem):
            break
        found.append(item)
    return found


def _with_data(paths: ContainerPaths, record: Record) -> Record | None:
    """``record``, an APPEND_REF turned back into the APPEND it was (None: its
    bytes are gone or do not match)."""
    if not isinstance(record, AppendRefRecord):
        return record
    try:
        fd = os.open(paths.data(record.segment_id), os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        data = os.pread(fd, record.size_bytes, record.offset)
    finally:
        os.close(fd)
    if len(data) != record.size_bytes or zlib.crc32(data) != record.crc:
        return None
    return AppendRecord(record.segment_id, record.offset, record.modified_ms, record.writer, data)


def read_wal_records(
    paths: ContainerPaths, after: int, end: int, max_bytes: int
) -> list[tuple[int, Record]]:
    """The run of records ``after + 1 .. end`` (or its newest part within
    ``max_bytes``) still in the WAL files; empty if the run cannot reach ``end``."""
    run: list[tuple[int, Record]] = []
    size = 0
    for _, path in paths.wal_files():
        for _, seq, record in _frames(path):
            if seq <= after or seq > end:
                continue
            whole = _with_data(paths, record)
            if whole is None or (run and seq != run[-1][0] + 1):
                run, size = [], 0  # a gap: only what follows it can be sent
                continue
            run.append((seq, whole))
            size += len(whole.data) if isinstance(whole, AppendRecord) else 64
            while size > max_bytes and len(run) > 1:
                dropped = run.pop(0)[1]
                size -= len(dropped.data) if isinstance(dropped, AppendRecord) else 64
    if not run or run[-1][0] != end:
        return []
    return run


def cut_log(paths: ContainerPaths, keep: int, ops: FileOps) -> bool:
    """Cut the container's WAL after record ``keep`` (the container is closed).

    False (nothing cut) if its snapshot already holds a record past ``keep``.
    """
    if paths.snapshot.exists():
        snapshot = decode_snapshot(paths.snapshot.read_bytes(), str(paths.snapshot))
        if snapshot.last_seq > keep:
            return False
    for first_seq, path in reversed(paths.wal_files()):
        if first_seq > keep + 1:
            backup_and_cut(path, 0, ops)
            continue
        for position, seq, _ in _frames(path):
            if seq > keep:
                backup_and_cut(path, position, ops)
                break
        if first_seq <= keep:
            break
    return True
