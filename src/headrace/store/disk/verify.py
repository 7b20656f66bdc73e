"""Offline check of a DiskStore data dir: every checksum, nothing modified.

``verify_data_dir`` reads what ``DiskStore.open`` would read, and more: the
manifest, each container's snapshot, every sidecar entry *and the data-file
block it covers*, every WAL record; it then replays the WAL (in memory) to
report each segment as the store would open it. It never writes, so it is
safe on a copy, a backup, or a directory another process has open (it then
sees a moment of a moving target and may report a torn tail that is really
a write in progress).

What counts as damage (``report.ok`` is False): anything ``DiskStore.open``
would refuse (``CorruptionError``), and any data block whose bytes fail the
sidecar checksum (open does not read data files, so only verify finds those).
Bytes written since the last checkpoint are checked against the WAL: an
APPEND's own record CRC, an APPEND_REF's size and CRC of the bytes it refers
to in the data file (a bad one is a torn tail, as open treats it, unless a
later WAL file holds records: then it is damage).
What is only a note: a torn WAL tail (open backs it up and cuts it off),
``.broken-*`` backups of earlier torn tails, orphan segment files
(creations that never became durable; open removes them), and a directory
whose first open never finished (no manifest and no data; open starts afresh).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path

from headrace.errors import CorruptionError
from headrace.store.disk.format import (
    AppendRefRecord,
    SnapshotSegment,
    crc32,
    decode_manifest,
    decode_sidecar,
)
from headrace.store.disk.layout import (
    ContainerPaths,
    SegmentMapping,
    containers_path,
    manifest_path,
)
from headrace.store.disk.log import scan_wal, torn_unsynced
from headrace.store.disk.recovery import (
    RefReader,
    check_abandoned_init,
    finish_interrupted_merges,
    load_snapshot,
)
from headrace.store.disk.segment import ContainerState, ReplayError
from headrace.types import SegmentKind

__all__ = ["Damage", "SegmentReport", "VerifyReport", "verify_data_dir"]


@dataclass(frozen=True, slots=True)
class Damage:
    """One failed check: ``position`` is a file position inside ``path``."""

    path: str
    position: int
    reason: str

    def __str__(self) -> str:
        return f"{self.path} at position {self.position}: {self.reason}"


@dataclass(frozen=True, slots=True)
class SegmentReport:
    """A segment as ``DiskStore.open`` would present it."""

    container_id: int
    segment_id: int
    name: str
    kind: SegmentKind
    start_offset: int
    length: int
    sealed: bool


@dataclass(slots=True)
class VerifyReport:
    """Everything ``verify_data_dir`` found."""

    path: str
    container_count: int = 0
    segments: list[SegmentReport] = field(default_factory=list)
    damage: list[Damage] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    checked_bytes: int = 0
    """Data-file bytes whose checksums were verified."""
    wal_records: int = 0

    @property
    def ok(self) -> bool:
        return not self.damage

    def lines(self) -> list[str]:
        """The report as text, one finding per line."""
        out = [
            f"data dir {self.path}: {self.container_count} containers, "
            f"{len(self.segments)} segments, {self.wal_records} WAL records, "
            f"{self.checked_bytes} data bytes checked"
        ]
        for s in sorted(self.segments, key=lambda s: s.name):
            state = "sealed" if s.sealed else "open"
            out.append(
                f"  segment {s.name!r} ({s.kind.value}, container {s.container_id}, "
                f"id {s.segment_id}): start {s.start_offset}, length {s.length}, {state}"
            )
        out += [f"  note: {n}" for n in self.notes]
        out += [f"  DAMAGE: {d}" for d in self.damage]
        out.append("OK" if self.ok else f"DAMAGED: {len(self.damage)} problem(s)")
        return out


def verify_data_dir(path: str | os.PathLike[str]) -> VerifyReport:
    """Check every checksum of the data dir at ``path`` without modifying anything."""
    root = Path(path)
    report = VerifyReport(str(root))
    mpath = manifest_path(root)
    mapping = SegmentMapping.HASH  # a damaged manifest's; only finding merge sources needs it
    try:
        manifest = decode_manifest(mpath.read_bytes(), str(mpath))
        report.container_count, mapping = manifest.container_count, manifest.mapping
    except FileNotFoundError:
        try:
            if containers_path(root).exists():
                check_abandoned_init(root)
        except CorruptionError as exc:
            report.damage.append(Damage(exc.path, exc.position, exc.reason))
        else:
            # A first open that never finished: the next open starts afresh.
            report.notes.append(f"{root}: not initialised yet (no manifest, no data)")
            return report
    except CorruptionError as exc:
        report.damage.append(Damage(exc.path, exc.position, exc.reason))
    if not report.container_count:
        cdir = containers_path(root)
        found = sorted(p.name for p in cdir.iterdir() if p.name.isdigit()) if cdir.is_dir() else []
        report.container_count = len(found)
    states: list[ContainerState] = []
    for cid in range(report.container_count):
        state = _verify_container(ContainerPaths(root, cid), report)
        states.append(state if state is not None else ContainerState(cid))
    finish_interrupted_merges(states, mapping)
    for state in states:
        for seg in state.by_id.values():
            report.segments.append(
                SegmentReport(
                    state.container_id,
                    seg.segment_id,
                    seg.name,
                    seg.kind,
                    seg.start_offset,
                    seg.length,
                    seg.sealed,
                )
            )
    return report


def _verify_container(paths: ContainerPaths, report: VerifyReport) -> ContainerState | None:
    try:
        snap = load_snapshot(paths)
    except CorruptionError as exc:
        report.damage.append(Damage(exc.path, exc.position, exc.reason))
        _verify_wal(paths, None, report)
        return None
    for seg in snap.segments:
        _verify_segment_files(paths, seg, report)
    state = ContainerState.from_snapshot(snap)
    _verify_wal(paths, state, report)
    live = set(state.by_id) | set(state.deleted_ids)
    for segment_id, files in sorted(paths.segment_files().items()):
        if segment_id not in live:
            names = ", ".join(p.name for p in files)
            report.notes.append(f"container {paths.container_id}: orphan files {names}")
    return state


def _verify_segment_files(
    paths: ContainerPaths, seg: SnapshotSegment, report: VerifyReport
) -> None:
    segment_id, length, sidecar_size = seg.segment_id, seg.length, seg.sidecar_size
    sidecar = paths.sidecar(segment_id)
    data = paths.data(segment_id)
    try:
        with open(sidecar, "rb") as f:
            raw = f.read(sidecar_size)
        if len(raw) < sidecar_size:
            raise CorruptionError(str(sidecar), len(raw), f"sidecar shorter than {sidecar_size}")
        entries = decode_sidecar(raw, segment_id, str(sidecar))
    except FileNotFoundError:
        report.damage.append(Damage(str(sidecar), 0, "checksum sidecar is missing"))
        return
    except CorruptionError as exc:
        report.damage.append(Damage(exc.path, exc.position, exc.reason))
        return
    covered = entries[-1].offset + entries[-1].size_bytes if entries else 0
    if covered != length:
        report.damage.append(
            Damage(str(sidecar), len(raw), f"sidecar covers {covered}, length {length}")
        )
    try:
        fd = os.open(data, os.O_RDONLY)
    except FileNotFoundError:
        report.damage.append(Damage(str(data), 0, "segment data file is missing"))
        return
    try:
        size = os.fstat(fd).st_size
        if size < length:
            report.damage.append(Damage(str(data), size, f"data file shorter than {length}"))
        for entry in entries:  # one block (at most 1 MiB) in memory at a time
            if entry.offset + entry.size_bytes <= seg.start_offset:
                continue  # truncated away; checkpoints free these blocks
            block = os.pread(fd, entry.size_bytes, entry.offset)
            report.checked_bytes += len(block)
            if len(block) < entry.size_bytes:
                break  # already reported as too short
            if crc32(block) != entry.crc:
                report.damage.append(
                    Damage(
                        str(data),
                        entry.offset,
                        f"data block [{entry.offset}, {entry.offset + entry.size_bytes}) of"
                        f" segment {seg.name!r} (container {paths.container_id}, id"
                        f" {segment_id}) fails its checksum",
                    )
                )
    finally:
        os.close(fd)


def _verify_wal(paths: ContainerPaths, state: ContainerState | None, report: VerifyReport) -> None:
    refs = RefReader(paths)
    try:
        _verify_wal_files(paths, state, report, refs)
    finally:
        report.checked_bytes += refs.read_bytes
        refs.close()
    if state is not None:
        state.finish_replay()
    for backup in paths.broken_files():
        report.notes.append(f"{backup}: backup of an earlier torn WAL tail")


def _header_torn(paths: ContainerPaths, path: Path) -> bool:
    try:
        scan = scan_wal(path, paths.container_id)
    except CorruptionError:
        return False  # reported as damage where the file is scanned
    return scan.problem is not None and scan.problem.position == 0


def _records_after(paths: ContainerPaths, files: list[tuple[int, Path]]) -> bool:
    """Whether any of ``files`` holds a record (damage counts as holding some)."""
    for _, path in files:
        try:
            if scan_wal(path, paths.container_id).records:
                return True
        except CorruptionError:
            return True
    return False


def _verify_wal_files(
    paths: ContainerPaths, state: ContainerState | None, report: VerifyReport, refs: RefReader
) -> None:
    files = paths.wal_files()
    if not files or (len(files) == 1 and _header_torn(paths, files[0][1])):
        last_seq = "?" if state is None else state.last_seq
        report.damage.append(
            Damage(
                str(paths.wal_dir),
                0,
                f"container {paths.container_id} has no readable WAL file: the records after"
                f" its snapshot (seq {last_seq}) are missing",
            )
        )
        return
    expected: int | None = None
    for i, (named_seq, path) in enumerate(files):
        last = i == len(files) - 1
        try:
            scan = scan_wal(path, paths.container_id)
        except CorruptionError as exc:
            report.damage.append(Damage(exc.path, exc.position, exc.reason))
            return
        report.wal_records += len(scan.records)
        if scan.problem is not None:
            p = scan.problem
            if last and scan.later_record_at is not None and torn_unsynced(scan):
                torn = scan.size_bytes - p.position
                report.notes.append(
                    f"{path}: torn write of {torn} bytes at position {p.position} ({p.reason};"
                    f" the file was synced up to {scan.synced_end}, so it was never"
                    " acknowledged); opening the store backs it up and cuts it off"
                )
            elif last and scan.later_record_at is None:
                torn = scan.size_bytes - p.position
                report.notes.append(
                    f"{path}: torn tail of {torn} bytes at position {p.position} ({p.reason});"
                    " opening the store backs it up and cuts it off"
                )
            else:
                reason = p.reason + (
                    f", and valid records follow (at {scan.later_record_at})"
                    if last
                    else " in a WAL file that is not the last"
                )
                report.damage.append(Damage(str(path), p.position, reason))
        if scan.problem is None or scan.problem.position > 0:
            if scan.first_seq != named_seq:
                report.damage.append(Damage(str(path), 16, f"header says seq {scan.first_seq}"))
            elif expected is not None and scan.first_seq != expected:
                if _records_after(paths, files[i:]):
                    report.damage.append(Damage(str(path), 0, f"log gap: expected seq {expected}"))
                else:  # a checkpoint's switch cut short (recovery.plan_replay)
                    report.notes.append(
                        f"{path}: no record, after a log that ends at seq {expected - 1};"
                        " opening the store backs it up and removes it"
                    )
                    return
            elif expected is None and state is not None and scan.first_seq > state.last_seq + 1:
                report.damage.append(
                    Damage(
                        str(path),
                        0,
                        f"container {paths.container_id}: log starts at seq {scan.first_seq},"
                        f" after the snapshot's seq {state.last_seq}",
                    )
                )
            expected = scan.first_seq + len(scan.records)
        if state is None:
            continue
        for at, (position, seq, record) in enumerate(scan.records):
            if seq <= state.last_seq:
                continue
            if isinstance(record, AppendRefRecord):
                data = refs.read(record)
                if isinstance(data, str):
                    if last or not _records_after(paths, files[i + 1 :]):
                        if report.notes and report.notes[-1].startswith(f"{path}: torn tail"):
                            report.notes.pop()  # a frame torn further on: this starts earlier
                        torn = scan.size_bytes - position
                        report.notes.append(
                            f"{path}: torn tail of {torn} bytes at position {position} ({data});"
                            " opening the store backs it up and cuts it off"
                        )
                        report.wal_records -= len(scan.records) - at
                    else:
                        reason = f"{data} in a WAL file that is not the last"
                        report.damage.append(Damage(str(path), position, reason))
                    return
                record = dataclasses.replace(record, data=data)
            try:
                state.apply(seq, record)
            except ReplayError as exc:
                report.damage.append(Damage(str(path), position, str(exc)))
                return
