"""``headrace repair DATA_DIR``: cut a damaged write-ahead log where open refuses it.

``DiskStore.open`` refuses damage it must not guess about (``recovery.py``):
a bad record with valid records after it in bytes the WAL file was synced
for, damage in a WAL file that is not the last, a gap in the log, a log
that starts after the snapshot, no readable WAL file at all. Those records
were acknowledged, so only the operator may decide to give them up; this is
how. For each container whose analysis fails on its log, repair:

1. copies the log from the first damaged record to its end (that file from
   there, every later WAL file whole) to ``<wal>.broken-<utc>`` files, synced;
2. cuts that file there (removes it if the cut is at its start, and every
   later file);
3. if no WAL file is left to continue the snapshot, starts an empty one;
4. analyses the container again, until it passes (at most
   ``MAX_REPAIR_CUTS`` cuts) or fails on something other than its log.

It reports every cut: where, why, and what the cut-off part held (the valid
records found in it, by segment), then one summary line. Damage outside the
log (manifest, snapshot, sidecars, data files) is not repaired: the report
says what it is, and the directory is left as it was. Repair holds the data
dir's lock, so it never runs beside a server on the same directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from headrace.errors import CorruptionError, StoreError
from headrace.store.disk.format import (
    FRAME_HEADER,
    SYNCED_MARK_VERSION,
    WAL_HEADER,
    WAL_HEADER_V2,
    AppendRecord,
    AppendRefRecord,
    CreateRecord,
    Record,
    check_frame,
    decode_record,
    decode_wal_header,
    encode_synced_mark,
)
from headrace.store.disk.layout import ContainerPaths, lock_path, manifest_path
from headrace.store.disk.log import (
    FILE_MODE,
    FileOps,
    WalWriter,
    find_later_record,
    fsync_dir,
    scan_wal,
)
from headrace.store.disk.recovery import (
    analyse_container,
    backup_and_cut,
    init_or_load_manifest,
    load_snapshot,
    upgrade_manifest,
)

__all__ = ["MAX_REPAIR_CUTS", "Cut", "RepairReport", "repair_data_dir"]

MAX_REPAIR_CUTS: Final = 1000
"""Cuts one container may need before repair gives up: each cut removes at
least one damaged record or WAL file, so this is far more than any log that
can be repaired needs, and it bounds the work on one that cannot."""


@dataclass(slots=True)
class Lost:
    """What the cut-off part of a log held, as far as it could be read."""

    records: int = 0
    first_seq: int | None = None
    last_seq: int | None = None
    appends: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Segment name -> (appends, bytes) among them."""
    unreadable_bytes: int = 0
    """Bytes of the cut-off part that are not in any valid record."""

    def add(self, seq: int, record: Record, names: dict[int, str]) -> None:
        self.records += 1
        self.first_seq = seq if self.first_seq is None else min(self.first_seq, seq)
        self.last_seq = seq if self.last_seq is None else max(self.last_seq, seq)
        if isinstance(record, AppendRecord | AppendRefRecord):
            size = record.size_bytes if isinstance(record, AppendRefRecord) else len(record.data)
            name = names.get(record.segment_id, f"segment id {record.segment_id}")
            count, total = self.appends.get(name, (0, 0))
            self.appends[name] = (count + 1, total + size)

    def describe(self) -> str:
        if not self.records:
            text = "no readable record"
        else:
            text = f"{self.records} records (seq {self.first_seq}-{self.last_seq})"
            parts = [
                f"{count} appends ({size} bytes) to {name!r}"
                for name, (count, size) in sorted(self.appends.items())
            ]
            others = self.records - sum(count for count, _ in self.appends.values())
            if others:
                parts.append(f"{others} other records")
            text += ": " + ", ".join(parts)
        if self.unreadable_bytes:
            text += f"; {self.unreadable_bytes} unreadable bytes"
        return text


@dataclass(slots=True)
class Cut:
    """One cut of one container's log."""

    container_id: int
    path: Path
    """The WAL file cut (or the WAL directory, when none was readable)."""
    position: int
    reason: str
    lost: Lost
    backups: list[Path] = field(default_factory=list)
    new_wal: Path | None = None
    """An empty WAL file started after the snapshot, when none was left."""


@dataclass(slots=True)
class RepairReport:
    """What ``repair_data_dir`` did."""

    path: str
    cuts: list[Cut] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    """Damage repair does not touch (the data dir still does not open)."""

    @property
    def ok(self) -> bool:
        return not self.refused

    def lines(self) -> list[str]:
        out = []
        for cut in self.cuts:
            out.append(
                f"container {cut.container_id}: {cut.path} cut at position {cut.position}"
                f" ({cut.reason})"
            )
            out.append(f"  lost: {cut.lost.describe()}")
            out += [f"  backup: {backup}" for backup in cut.backups]
            if cut.new_wal is not None:
                out.append(f"  started an empty WAL file {cut.new_wal.name}")
        out += [f"cannot repair: {reason}" for reason in self.refused]
        records = sum(cut.lost.records for cut in self.cuts)
        if self.refused:
            out.append(f"NOT REPAIRED: {self.path}: {len(self.refused)} problem(s) left")
        elif self.cuts:
            containers = len({cut.container_id for cut in self.cuts})
            out.append(
                f"REPAIRED: {self.path}: {len(self.cuts)} cut(s) in {containers} container(s),"
                f" {records} records lost (backups beside the WAL files)"
            )
        else:
            out.append(f"NOTHING TO REPAIR: {self.path} opens as it is")
        return out


def repair_data_dir(path: str | os.PathLike[str], *, ops: FileOps | None = None) -> RepairReport:
    """Cut each container's log where open refuses it (see the module docstring).

    Raises:
        StoreError: the directory is not a data dir, or a store has it open.
        CorruptionError: the manifest is damaged (nothing to cut).
        OSError: a file could not be read or written.
    """
    root = Path(path)
    ops = ops or FileOps()
    if not manifest_path(root).exists():
        raise StoreError(f"{root} is not a headrace data dir (no manifest)")
    lock_fd = os.open(lock_path(root), os.O_RDWR | os.O_CREAT, FILE_MODE)
    try:
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StoreError(f"data dir {root} is in use by another store") from None
        manifest = init_or_load_manifest(root, 1, ops)
        report = RepairReport(str(root))
        for cid in range(manifest.container_count):
            _repair_container(root, ContainerPaths(root, cid), ops, report)
        return report
    finally:
        os.close(lock_fd)


def _repair_container(
    root: Path, paths: ContainerPaths, ops: FileOps, report: RepairReport
) -> None:
    for _ in range(MAX_REPAIR_CUTS):
        try:
            analyse_container(paths)
            return
        except CorruptionError as exc:
            if not _in_log(paths, Path(exc.path)):
                report.refused.append(f"container {paths.container_id}: {exc}")
                return
            report.cuts.append(_cut(root, paths, exc, ops))
    report.refused.append(
        f"container {paths.container_id}: still damaged after {MAX_REPAIR_CUTS} cuts"
    )


def _in_log(paths: ContainerPaths, path: Path) -> bool:
    return path == paths.wal_dir or path.parent == paths.wal_dir


def _cut(root: Path, paths: ContainerPaths, exc: CorruptionError, ops: FileOps) -> Cut:
    """Cut the log at the damage ``exc`` names, backing up what is cut off."""
    files = [path for _, path in paths.wal_files()]
    damaged = Path(exc.path)
    if damaged not in files:  # the WAL dir: no file is readable; cut every one
        index, position = 0, 0
    else:
        index = files.index(damaged)
        # Inside the header (a wrong seq, container or version): the whole file.
        position = exc.position if exc.position >= WAL_HEADER_V2.size else 0
    lost = _lost(paths, files, index, position)
    cut = Cut(paths.container_id, damaged, position, exc.reason, lost)
    if index < len(files):
        for later in reversed(files[index + 1 :]):
            backup, _ = backup_and_cut(later, 0, ops)
            cut.backups.append(backup)
        backup, _ = backup_and_cut(files[index], position, ops)
        cut.backups.append(backup)
        if position:
            _lower_mark(files[index], position, ops)
    if not paths.wal_files():
        # The snapshot must be followed by a WAL file (recovery refuses a
        # container without one): start an empty one of this version.
        upgrade_manifest(root, init_or_load_manifest(root, 1, ops), ops)
        first_seq = load_snapshot(paths).last_seq + 1
        wal = WalWriter.create(paths.wal(first_seq), paths.container_id, first_seq, ops)
        try:
            ops.sync_wal(wal.fd)
        finally:
            wal.close()
        fsync_dir(paths.wal_dir, ops)
        cut.new_wal = wal.path
    return cut


def _lower_mark(wal: Path, position: int, ops: FileOps) -> None:
    """A file cut below its synced mark gets the mark of its new end, so that a
    torn write appended later is not taken for damage to synced bytes."""
    with open(wal, "rb") as f:
        head = f.read(WAL_HEADER.size)
    try:
        header = decode_wal_header(head, str(wal))
    except CorruptionError:
        return
    if header.version < SYNCED_MARK_VERSION or (header.synced_end or 0) <= position:
        return
    fd = os.open(wal, os.O_WRONLY)
    try:
        ops.write_mark(fd, encode_synced_mark(position), WAL_HEADER_V2.size)
        ops.sync_file(fd)
    finally:
        os.close(fd)


def _lost(paths: ContainerPaths, files: list[Path], index: int, position: int) -> Lost:
    """The valid records in the part of the log a cut removes, and the bytes
    that are in no valid record."""
    lost = Lost()
    names = _segment_names(paths, files)
    for i, (named_seq, path) in enumerate(paths.wal_files()[index:], index):
        raw = path.read_bytes()
        at = position if i == index else 0
        if at == 0:
            with contextlib.suppress(CorruptionError):  # else it counts as unreadable
                at = decode_wal_header(raw, str(path)).records_at
        next_seq = named_seq
        while at < len(raw):
            if check_frame(raw, at) is None:
                size = FRAME_HEADER.size + FRAME_HEADER.unpack_from(raw, at)[0]
                payload = memoryview(raw)[at + FRAME_HEADER.size : at + size]
                try:
                    seq, record = decode_record(payload, str(path), at)
                except CorruptionError:
                    pass
                else:
                    lost.add(seq, record, names)
                    next_seq = seq + 1
                    at += size
                    continue
            later = find_later_record(raw, at + 1, next_seq)
            end = len(raw) if later is None else later
            lost.unreadable_bytes += end - at
            at = end
    return lost


def _segment_names(paths: ContainerPaths, files: list[Path]) -> dict[int, str]:
    """Segment id -> name, from the snapshot and every readable CREATE record."""
    names: dict[int, str] = {}
    with contextlib.suppress(CorruptionError):
        names.update((seg.segment_id, seg.name) for seg in load_snapshot(paths).segments)
    for path in files:
        try:
            scan = scan_wal(path, paths.container_id)
        except CorruptionError:
            continue
        for _, _, record in scan.records:
            if isinstance(record, CreateRecord):
                names[record.segment_id] = record.name
    return names
