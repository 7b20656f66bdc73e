"""Opening a data dir: create it, or recover every container to its last durable state.

Recovery runs in two phases, so that damage is reported before anything on
disk is touched (and a refused open leaves the directory as it was).

Phase 1, every container (``analyse_container``), reading only:

1. Load ``snapshot`` (checksum verified; missing or bad is ``CorruptionError``).
2. For each segment in it, check the sidecar's header and entries up to the
   size the snapshot records, check they cover exactly ``[0, length)``, and
   check the data file holds at least ``length`` bytes.
3. Scan the WAL files in sequence order (``log.scan_wal``) and check they
   chain. Damage anywhere but the tail of the last file is ``CorruptionError``.
4. Replay every record after the snapshot's ``last_seq`` through
   ``ContainerState.apply`` in memory, collecting the file effects. An
   APPEND_REF's bytes are read back from the data file and checked against
   its size and CRC (``RefReader``); if they are missing or fail, the record
   and everything after it are a torn tail, exactly like an unreadable frame
   (WAL files after it may only hold no record: a checkpoint's next file,
   created before the previous one and its referenced bytes were synced; if
   one holds records it is damage, ``CorruptionError``).

Phase 2, every container (``repair_container``):

5. Cut each sidecar back to the snapshot's state (its blocks past it are
   rebuilt from the replayed state).
6. Copy a torn tail to ``<wal>.broken-<utc>``, fsync it, and only then cut it off.
7. Apply the replay's file effects: create the files of each CREATE that are
   missing (a data file is never emptied: it may hold APPEND_REF bytes) and
   reset its sidecar, write each APPEND's bytes at its recorded offset
   (idempotent); then cut each data file back to its segment's replayed
   length (bytes past what the WAL knows, or past a torn tail, go).

Then, across containers (``recover_store``): a merge whose commit is durable
in the target's container but whose source deletion is not (a crash between
the two) is finished by deleting the source. Finally each container that
replayed anything gets an empty WAL file and is checkpointed
(``checkpoint.write_checkpoint``: sidecars extended, data files fsynced, a new
snapshot written, old WAL files dropped), and segment files no live segment
owns are removed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
import shutil
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from headrace.errors import CorruptionError, StorageFull
from headrace.store.api import MAX_SEGMENT_ATTRIBUTES
from headrace.store.disk.checkpoint import write_checkpoint
from headrace.store.disk.datafiles import create_segment_files
from headrace.store.disk.format import (
    FORMAT_VERSION,
    WAL_HEADER,
    AppendRefRecord,
    CreateRecord,
    DeleteRecord,
    FrameProblem,
    Manifest,
    Snapshot,
    SnapshotSegment,
    crc32,
    decode_manifest,
    decode_sidecar,
    decode_snapshot,
    decode_wal_header,
    encode_manifest,
    encode_snapshot,
)
from headrace.store.disk.layout import (
    MAX_CONTAINER_COUNT,
    WAL_DIR_NAME,
    WAL_SUFFIX,
    ContainerPaths,
    SegmentMapping,
    broken_wal_path,
    container_of,
    containers_path,
    manifest_path,
)
from headrace.store.disk.log import (
    FILE_MODE,
    FileOps,
    WalScan,
    WalWriter,
    atomic_write,
    fsync_dir,
    make_dir,
    scan_wal,
    torn_unsynced,
)
from headrace.store.disk.moves import finish_installs
from headrace.store.disk.segment import ContainerState, ReplayError

__all__ = [
    "RefReader",
    "analyse_container",
    "backup_torn_tail",
    "check_abandoned_init",
    "check_sidecar",
    "init_or_load_manifest",
    "load_snapshot",
    "plan_replay",
    "recover_container",
    "recover_store",
    "repair_container",
]

log = logging.getLogger(__name__)

MAX_REPLAY_OPEN_FILES = 64
"""Data files kept open while replaying; replay touches few segments at a time."""


# --------------------------------------------------------------------------- manifest


def init_or_load_manifest(
    root: Path,
    container_count: int,
    ops: FileOps,
    mapping: SegmentMapping = SegmentMapping.GROUPED,
) -> Manifest:
    """Read the manifest, or create a fresh data dir with ``container_count``
    containers whose segments are placed by ``mapping``."""
    path = manifest_path(root)
    if path.exists():
        return decode_manifest(path.read_bytes(), str(path))
    if not 1 <= container_count <= MAX_CONTAINER_COUNT:
        raise ValueError(f"container count must be in 1..{MAX_CONTAINER_COUNT}")
    containers = containers_path(root)
    if containers.exists():
        check_abandoned_init(root)
        shutil.rmtree(containers)
    staging = root / "containers.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        _stage_containers(staging, root, container_count, ops)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)  # a full disk leaves nothing behind
        raise
    staging.rename(containers)
    fsync_dir(root, ops)
    manifest = Manifest(container_count, time.time_ns() // 1_000_000, mapping=mapping)
    atomic_write(path, root / "manifest.tmp", encode_manifest(manifest), ops)
    return manifest


def upgrade_manifest(root: Path, manifest: Manifest, ops: FileOps) -> Manifest:
    """Rewrite an older version's manifest with this version, before any file of
    this version is written: an older release must then refuse the dir, not
    misread the newer files (an APPEND_REF as a torn tail, a WAL's synced mark
    as records)."""
    if manifest.version >= FORMAT_VERSION:
        return manifest
    upgraded = Manifest(manifest.container_count, manifest.created_ms, mapping=manifest.mapping)
    path = manifest_path(root)
    atomic_write(path, root / "manifest.tmp", encode_manifest(upgraded), ops)
    log.info("%s: format version %d opened as %d", root, manifest.version, FORMAT_VERSION)
    return upgraded


def _stage_containers(staging: Path, root: Path, container_count: int, ops: FileOps) -> None:
    """Build a new data dir's container directories in ``staging``, synced."""
    make_dir(staging)
    for cid in range(container_count):
        paths = ContainerPaths(root, cid)
        cdir = staging / paths.dir.name
        for sub in (cdir, cdir / paths.wal_dir.name, cdir / paths.segments_dir.name):
            make_dir(sub)
        atomic_write(
            cdir / paths.snapshot.name,
            cdir / paths.snapshot_tmp.name,
            encode_snapshot(Snapshot(cid, 0, 1)),
            ops,
        )
        wal = WalWriter.create(cdir / paths.wal_dir.name / paths.wal(1).name, cid, 1, ops)
        try:
            ops.sync_wal(wal.fd)
        finally:
            wal.close()
        fsync_dir(cdir / paths.wal_dir.name, ops)
        fsync_dir(cdir, ops)
    fsync_dir(staging, ops)


def check_abandoned_init(root: Path) -> None:
    """``containers/`` without a manifest is only safe to redo if it holds nothing."""
    for cdir in containers_path(root).iterdir():
        paths = ContainerPaths(root, int(cdir.name)) if cdir.name.isdigit() else None
        if paths is None:
            continue
        wal_sizes = [path.stat().st_size for _, path in paths.wal_files()]
        if any(size > WAL_HEADER.size for size in wal_sizes) or paths.segment_files():
            raise CorruptionError(str(manifest_path(root)), 0, "manifest missing, data present")
        if paths.snapshot.exists():
            snap = decode_snapshot(paths.snapshot.read_bytes(), str(paths.snapshot))
            if snap.segments or snap.last_seq:
                raise CorruptionError(str(manifest_path(root)), 0, "manifest missing, data present")


# --------------------------------------------------------------------------- checks


def load_snapshot(paths: ContainerPaths) -> Snapshot:
    try:
        raw = paths.snapshot.read_bytes()
    except FileNotFoundError:
        raise CorruptionError(str(paths.snapshot), 0, "container snapshot is missing") from None
    snap = decode_snapshot(raw, str(paths.snapshot))
    if snap.container_id != paths.container_id:
        raise CorruptionError(str(paths.snapshot), 12, f"snapshot of container {snap.container_id}")
    return snap


def check_sidecar(paths: ContainerPaths, seg: SnapshotSegment) -> None:
    """The sidecar prefix the snapshot vouches for is intact and covers ``[0, length)``."""
    path = paths.sidecar(seg.segment_id)
    try:
        with open(path, "rb") as f:
            raw = f.read(seg.sidecar_size)
    except FileNotFoundError:
        raise CorruptionError(str(path), 0, "checksum sidecar is missing") from None
    if len(raw) < seg.sidecar_size:
        raise CorruptionError(str(path), len(raw), f"sidecar shorter than {seg.sidecar_size}")
    entries = decode_sidecar(raw, seg.segment_id, str(path))
    covered = entries[-1].offset + entries[-1].size_bytes if entries else 0
    if covered != seg.length:
        raise CorruptionError(str(path), len(raw), f"sidecar covers {covered}, length {seg.length}")


def data_size(paths: ContainerPaths, seg: SnapshotSegment) -> int:
    path = paths.data(seg.segment_id)
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise CorruptionError(str(path), 0, "segment data file is missing") from None
    if size < seg.length:
        raise CorruptionError(str(path), size, f"data file shorter than length {seg.length}")
    return size


@dataclass(slots=True)
class ReplayPlan:
    """The WAL files of a container, checked as a chain."""

    scans: list[WalScan]
    tear: WalScan | None
    """The last file, if it has a torn tail (its ``problem`` says where)."""
    after_tear: list[WalScan] = dataclasses.field(default_factory=list)
    """Files after a torn tail that is not in the last file (they hold no
    record): backed up and removed with it."""


def plan_replay(paths: ContainerPaths, last_seq: int) -> ReplayPlan:
    """Scan every WAL file and check they chain; classify any problem.

    Raises:
        CorruptionError: damage that is not a torn tail of the last file, a
            gap between the snapshot and the log or between files, or no
            readable WAL file at all.
    """
    files = paths.wal_files()
    scans = [scan_wal(path, paths.container_id) for _, path in files]
    tear = None
    for i, scan in enumerate(scans):
        if scan.problem is None:
            continue
        last = i == len(scans) - 1
        if not last or (scan.later_record_at is not None and not torn_unsynced(scan)):
            where = scan.later_record_at if last else scan.problem.position
            raise CorruptionError(
                str(scan.path),
                scan.problem.position,
                f"{scan.problem.reason}, and valid records follow (at {where})" + _synced_note(scan)
                if last
                else f"{scan.problem.reason} in a WAL file that is not the last",
            )
        tear = scan
    if all(scan.problem is not None and scan.problem.position == 0 for scan in scans):
        # Every WAL file is created and synced before the snapshot that needs
        # it, and old files go only after, so this is never a crash's doing.
        raise CorruptionError(
            str(paths.wal_dir),
            0,
            f"container {paths.container_id} has no readable WAL file: the records "
            f"after its snapshot (seq {last_seq}) are missing",
        )
    expected = None  # the seq the next record must have
    for index, (scan, (named_seq, _)) in enumerate(zip(scans, files, strict=True)):
        if scan.problem is not None and scan.problem.position == 0:
            continue  # a last file whose header never became durable
        if scan.first_seq != named_seq:
            raise CorruptionError(str(scan.path), 16, f"header says first seq {scan.first_seq}")
        if expected is None:
            if scan.first_seq > last_seq + 1:
                reason = (
                    f"container {paths.container_id}: log starts at seq {scan.first_seq}, "
                    f"snapshot ends at {last_seq}"
                )
                raise CorruptionError(str(scan.path), 0, reason)
        elif scan.first_seq != expected:
            rest = scans[index:]
            if any(s.records for s in rest):
                raise CorruptionError(str(scan.path), 0, f"log gap: expected seq {expected}")
            # A checkpoint's switch cut short: the next file is created before the
            # sync thread writes the last records of the previous one, so a kill in
            # between leaves those records unwritten (never synced, so never
            # acknowledged) and later files without a record. The log ends where
            # the writing stopped; the empty files are backed up and removed.
            for s in rest:
                s.problem = FrameProblem(0, f"no record, after a log that ends at {expected - 1}")
            return ReplayPlan(scans, None if tear in rest else tear, after_tear=list(rest))
        expected = scan.first_seq + len(scan.records)
    return ReplayPlan(scans, tear)


def _synced_note(scan: WalScan) -> str:
    if scan.synced_end is None:
        return ""
    return f"; the file was synced up to {scan.synced_end}, so this is not a torn write"


# --------------------------------------------------------------------------- repair


def backup_torn_tail(scan: WalScan, ops: FileOps) -> Path:
    """Copy the bytes after the last valid record aside, then cut them off."""
    assert scan.problem is not None
    position = scan.problem.position
    backup, size_bytes = backup_and_cut(scan.path, position, ops)
    if scan.later_record_at is not None:  # torn_unsynced: a write in pieces
        log.warning(
            "%s: torn write of %d bytes at position %d (%s; the file was synced up to %s,"
            " so none of its records was acknowledged, nor those after it) copied to %s"
            " and cut off",
            scan.path,
            size_bytes,
            position,
            scan.problem.reason,
            scan.synced_end,
            backup.name,
        )
    else:
        log.warning(
            "%s: torn tail of %d bytes at position %d (%s) copied to %s and cut off",
            scan.path,
            size_bytes,
            position,
            scan.problem.reason,
            backup.name,
        )
    return backup


def backup_and_cut(wal: Path, position: int, ops: FileOps) -> tuple[Path, int]:
    """Copy the bytes of ``wal`` from ``position`` on to ``<wal>.broken-<utc>`` and
    sync the copy, then cut ``wal`` at ``position`` (remove it if that is 0).

    Returns the backup's path and its size. If the copy cannot be written
    (a full disk) it is removed again and ``wal`` is left as it was.
    """
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    backup = broken_wal_path(wal, stamp)
    n = 0
    while backup.exists():
        n += 1
        backup = broken_wal_path(wal, f"{stamp}.{n}")
    with open(wal, "rb") as src:
        src.seek(position)
        torn = src.read()
    fd = os.open(backup, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    try:
        ops.pwrite(fd, torn, 0)
        ops.sync_file(fd)
    except BaseException:
        os.close(fd)
        backup.unlink(missing_ok=True)
        raise
    os.close(fd)
    fsync_dir(backup.parent, ops)
    if position == 0:
        wal.unlink()  # not even the header survived: nothing to keep
    else:
        fd = os.open(wal, os.O_WRONLY)
        try:
            os.ftruncate(fd, position)
            ops.sync_file(fd)
        finally:
            os.close(fd)
    fsync_dir(wal.parent, ops)
    return backup, len(torn)


class _ReplayFiles:
    """Data files opened while replaying (bounded)."""

    def __init__(self, paths: ContainerPaths, ops: FileOps) -> None:
        self.paths = paths
        self.ops = ops
        self.fds: dict[int, int] = {}

    def fd(self, segment_id: int) -> int:
        fd = self.fds.pop(segment_id, None)
        if fd is None:
            if len(self.fds) >= MAX_REPLAY_OPEN_FILES:
                os.close(self.fds.pop(next(iter(self.fds))))
            fd = os.open(self.paths.data(segment_id), os.O_RDWR)
        self.fds[segment_id] = fd
        return fd

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


class RefReader:
    """Reads the bytes an APPEND_REF refers to back from the data files, checked.

    Read-only (analysis and ``verify`` run it before anything is changed);
    keeps at most ``MAX_REPLAY_OPEN_FILES`` descriptors open.
    """

    def __init__(self, paths: ContainerPaths) -> None:
        self.paths = paths
        self._fds: dict[int, int] = {}
        self.read_bytes = 0

    def read(self, record: AppendRefRecord) -> bytes | str:
        """The referenced bytes, or why they are not there (a torn tail)."""
        path = self.paths.data(record.segment_id)
        fd = self._fds.pop(record.segment_id, None)
        if fd is None:
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                return f"data file {path.name} of the referenced bytes is missing"
            if len(self._fds) >= MAX_REPLAY_OPEN_FILES:
                os.close(self._fds.pop(next(iter(self._fds))))
        self._fds[record.segment_id] = fd
        end = record.offset + record.size_bytes
        chunks = []
        position = record.offset
        while position < end:
            chunk = os.pread(fd, end - position, position)
            if not chunk:
                return f"referenced bytes [{record.offset}, {end}) end at {position}"
            chunks.append(chunk)
            position += len(chunk)
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self.read_bytes += len(data)
        if crc32(data) != record.crc:
            return f"referenced bytes [{record.offset}, {end}) fail their CRC"
        return data

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def cut_at_bad_reference(plan: ReplayPlan, index: int, at: int, reason: str) -> None:
    """Make the record at ``at`` of ``plan.scans[index]`` (an APPEND_REF whose
    bytes are missing or damaged) the start of the torn tail.

    Later WAL files may exist if they hold no record (a checkpoint creates the
    next file before it syncs the previous one with its referenced bytes; a
    power cut in between leaves that shape): they become part of the tail.

    Raises:
        CorruptionError: a later WAL file holds records (the sync thread writes
            none there before the file with the reference and its bytes were
            synced, so that is damage, not a tear).
    """
    scan = plan.scans[index]
    position = scan.records[at][0]
    later = plan.scans[index + 1 :]
    if any(s.records for s in later):
        raise CorruptionError(
            str(scan.path), position, f"{reason} in a WAL file that is not the last"
        )
    del scan.records[at:]
    scan.problem = FrameProblem(position, reason)
    scan.later_record_at = None
    scan.end = position
    plan.tear = scan
    for s in later:
        if s.problem is None or s.problem.position != 0:
            s.problem = FrameProblem(0, "after a torn tail in an earlier WAL file")
    plan.after_tear = list(later)


Effect = tuple[int, int, "bytes | memoryview"] | int
"""A file effect of replay: a data write (segment id, offset, bytes), or the
segment id of a CREATE (its files are made anew)."""


@dataclass(slots=True)
class Analysed:
    """A container checked and replayed in memory, its file repairs not yet done."""

    paths: ContainerPaths
    snapshot: Snapshot
    plan: ReplayPlan
    state: ContainerState
    effects: list[Effect]


def analyse_container(
    paths: ContainerPaths, *, max_attributes: int = MAX_SEGMENT_ATTRIBUTES
) -> Analysed:
    """Steps 1-3 of the module docstring, and step 4 in memory only: every check
    that can fail runs before anything on disk is touched.

    Raises:
        CorruptionError: anything but a torn tail.
    """
    snap = load_snapshot(paths)
    for seg in snap.segments:
        check_sidecar(paths, seg)
        data_size(paths, seg)
    plan = plan_replay(paths, snap.last_seq)
    state = ContainerState.from_snapshot(snap, max_attributes=max_attributes)
    effects: list[Effect] = []
    refs = RefReader(paths)
    try:
        _replay(plan, state, refs, effects)
    finally:
        refs.close()
    state.finish_replay()
    return Analysed(paths, snap, plan, state, effects)


def _replay(
    plan: ReplayPlan, state: ContainerState, refs: RefReader, effects: list[Effect]
) -> None:
    for index, scan in enumerate(plan.scans):
        for at, (position, seq, record) in enumerate(scan.records):
            if seq <= state.last_seq:
                continue
            if isinstance(record, AppendRefRecord):
                data = refs.read(record)
                if isinstance(data, str):
                    cut_at_bad_reference(plan, index, at, data)
                    return
                record = dataclasses.replace(record, data=data)
            try:
                writes = state.apply(seq, record)
            except ReplayError as exc:
                raise CorruptionError(str(scan.path), position, str(exc)) from None
            if isinstance(record, CreateRecord):
                effects.append(record.segment_id)
            if not isinstance(record, AppendRefRecord):  # its bytes are in place
                effects.extend(writes)


def repair_container(analysed: Analysed, ops: FileOps) -> None:
    """Bring the files in line with the analysed state (step 4 of the docstring)."""
    paths = analysed.paths
    for seg in analysed.snapshot.segments:
        os.truncate(paths.sidecar(seg.segment_id), seg.sidecar_size)
    for stale in reversed(analysed.plan.after_tear):  # copied aside, then removed
        backup_torn_tail(stale, ops)
    if analysed.plan.tear is not None:
        backup_torn_tail(analysed.plan.tear, ops)
    files = _ReplayFiles(paths, ops)
    try:
        for effect in analysed.effects:
            if isinstance(effect, int):
                old = files.fds.pop(effect, None)
                if old is not None:
                    os.close(old)
                files.fds[effect] = create_segment_files(paths, effect, empty_data=False)
            else:
                segment_id, offset, data = effect
                ops.pwrite(files.fd(segment_id), data, offset)
    finally:
        files.close()
    # Bytes past each replayed length: appends whose record never became
    # durable, a torn tail's references, a merge that never committed.
    for live in analysed.state.by_id.values():
        os.truncate(paths.data(live.segment_id), live.length)


def finish_interrupted_merges(states: list[ContainerState], mapping: SegmentMapping) -> None:
    """Delete merge sources whose merge committed but whose deletion was lost."""
    count = len(states)
    for state in states:
        for (source_id, source), target in state.commits.items():
            owner = states[container_of(source, count, mapping)]
            seg = owner.by_name.get(source)
            if seg is not None and seg.segment_id == source_id:
                log.warning("finishing the merge of %r into %r", source, target)
                owner.apply_unlogged(DeleteRecord(source_id, target))


TMP_SUFFIX: Final = ".tmp"
"""A WAL file being written under a name recovery does not read (then renamed)."""


def _reusable_wal(path: Path) -> bool:
    """Whether ``path`` is a WAL file of this version holding nothing but its header."""
    with open(path, "rb") as f:
        raw = f.read(WAL_HEADER.size + 1)
    try:
        header = decode_wal_header(raw, str(path))
    except CorruptionError:
        return False
    return header.version == FORMAT_VERSION and len(raw) == header.records_at


def _open_wal(paths: ContainerPaths, state: ContainerState, ops: FileOps) -> WalWriter:
    """End a container's recovery: checkpoint if anything was replayed, and
    return the WAL file new records go to.

    If the checkpoint fails (a full disk) before its snapshot replaced the old
    one, the new WAL file is removed again: the directory is as it was.
    """
    files = paths.wal_files()
    first_seq = state.last_seq + 1
    if not state.changed and files and files[-1][0] == first_seq and _reusable_wal(files[-1][1]):
        # A clean close left a synced, empty WAL after a current snapshot: keep both.
        wal = WalWriter.reopen(files[-1][1], first_seq)
        old_wals = [path for _, path in files[:-1]]  # hold no record past the snapshot
        for path in old_wals:
            path.unlink()
    else:
        old_wals = [path for _, path in files]
        wal_path = paths.wal(first_seq)
        replacing = wal_path in old_wals
        if replacing:
            # It holds no record past last_seq: replaced by a new one of this
            # version, under another name first, so that a crash never leaves
            # the log without it.
            old_wals.remove(wal_path)
        target = wal_path.with_name(wal_path.name + TMP_SUFFIX) if replacing else wal_path
        wal = WalWriter.create(target, paths.container_id, first_seq, ops)
        try:
            ops.sync_wal(wal.fd)
            if replacing:
                os.replace(target, wal_path)
                wal.path = wal_path
            fsync_dir(paths.wal_dir, ops)
            write_checkpoint(paths, state.capture(), old_wals, ops)
        except BaseException:
            wal.close()
            _forget_new_wal(paths, wal.path, state.last_seq, ops, replaced=replacing)
            raise
    try:
        live = set(state.by_id)
        for segment_id, seg_files in paths.segment_files().items():
            if segment_id not in live:
                for path in seg_files:
                    path.unlink()
        paths.snapshot_tmp.unlink(missing_ok=True)
        for stale in paths.wal_dir.glob(f"*{WAL_SUFFIX}{TMP_SUFFIX}"):
            stale.unlink()
    except BaseException:
        wal.close()
        raise
    return wal


def _forget_new_wal(
    paths: ContainerPaths, path: Path, last_seq: int, ops: FileOps, *, replaced: bool
) -> None:
    """After a failed end of recovery: remove the new WAL file at ``path`` unless
    the snapshot that needs it was written (or it replaced an empty one)."""
    with contextlib.suppress(OSError, CorruptionError):
        if path.name.endswith(TMP_SUFFIX):
            path.unlink(missing_ok=True)
        elif not replaced and load_snapshot(paths).last_seq < last_seq:
            path.unlink(missing_ok=True)
            fsync_dir(paths.wal_dir, ops)


RECOVERY_MARGIN_BYTES: Final = 1024 * 1024
"""Added to recovery's estimate of the bytes it will write before it asks the
disk for that much room: the estimate leaves out the small files (sidecar
headers, directory entries) and the merges recovery finishes."""


def recovery_bytes(one: Analysed) -> int:
    """About how many bytes recovery writes for ``one`` (torn-tail copies, the
    replayed bytes, the closing checkpoint); 0 if it writes nothing."""
    plan = one.plan
    torn = sum(
        s.size_bytes - s.problem.position
        for s in [plan.tear, *plan.after_tear]
        if s is not None and s.problem is not None
    )
    if not torn and not one.state.changed:
        return 0
    # Replayed bytes need room only past the end of their data file (under
    # ``always`` the bytes of an append reach it before its record).
    ends: dict[int, int] = {}
    for effect in one.effects:
        if not isinstance(effect, int):
            segment_id, offset, data = effect
            ends[segment_id] = max(ends.get(segment_id, 0), offset + len(data))
    replayed = 0
    for segment_id, end in ends.items():
        try:
            size = one.paths.data(segment_id).stat().st_size
        except FileNotFoundError:
            size = 0
        replayed += max(0, end - size)
    snapshot = WAL_HEADER.size + 64
    for seg in one.state.by_id.values():
        # fixed fields, the name (at most 4 bytes a character), attributes, and
        # the sidecar entries of its new blocks
        snapshot += 50 + 4 * len(seg.name) + 24 * len(seg.attributes)
        snapshot += 20 * (len(seg.blocks) + 1)
    snapshot += sum(16 + 4 * (len(a) + len(b)) for a, b in one.state.merged.items())
    snapshot += sum(16 + 4 * (len(a) + len(b)) for (_, a), b in one.state.commits.items())
    return torn + replayed + snapshot


def reserve_space(root: Path, size_bytes: int, ops: FileOps) -> None:
    """Ask the file system for ``size_bytes`` of room in ``root`` (allocated to a
    file that has no name, then released), so that recovery refuses a full disk
    before it has changed anything.

    Raises:
        StorageFull: there is not that much room.
    """
    named: Path | None = None
    try:
        fd = os.open(root, os.O_TMPFILE | os.O_WRONLY, FILE_MODE)
    except (OSError, AttributeError):  # no O_TMPFILE on this platform or file system
        named = root / "recovery.reserve"
        fd = os.open(named, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    try:
        ops.reserve(fd, size_bytes)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise StorageFull(
                f"no space left in {root} to recover it (about {size_bytes} bytes needed,"
                " nothing was changed)"
            ) from exc
        raise
    finally:
        os.close(fd)
        if named is not None:
            named.unlink(missing_ok=True)


def recover_store(
    root: Path,
    container_count: int,
    ops: FileOps,
    *,
    max_attributes: int = MAX_SEGMENT_ATTRIBUTES,
    mapping: SegmentMapping = SegmentMapping.GROUPED,
) -> tuple[Manifest, list[tuple[ContainerState, WalWriter]]]:
    """Open (or create) a data dir: recover every container and checkpoint it.

    Returns the manifest and, per container, its state and a fresh WAL file.
    ``max_attributes``: attributes a segment keeps (``store/_attributes.py``).
    ``mapping``: the segment mapping of a new data dir (an existing one keeps its own).

    Raises:
        CorruptionError: damage (nothing was changed).
        StorageFull: no room for what recovery must write (nothing was changed).
    """
    manifest = init_or_load_manifest(root, container_count, ops, mapping)
    finish_installs(root, manifest.container_count, ops)
    all_paths = [ContainerPaths(root, cid) for cid in range(manifest.container_count)]
    try:
        analysed = [analyse_container(paths, max_attributes=max_attributes) for paths in all_paths]
    except CorruptionError as exc:
        if WAL_DIR_NAME in (Path(exc.path).name, Path(exc.path).parent.name):
            hint = "; `headrace repair` cuts the log there (what follows is lost)"
            raise CorruptionError(exc.path, exc.position, exc.reason + hint) from None
        raise
    needed = sum(recovery_bytes(one) for one in analysed)
    if needed:
        reserve_space(root, needed + RECOVERY_MARGIN_BYTES, ops)
    manifest = upgrade_manifest(root, manifest, ops)
    for one in analysed:  # only once every container passed its checks
        repair_container(one, ops)
    states = [one.state for one in analysed]
    finish_interrupted_merges(states, manifest.mapping)
    opened: list[tuple[ContainerState, WalWriter]] = []
    try:
        for paths, state in zip(all_paths, states, strict=True):
            opened.append((state, _open_wal(paths, state, ops)))
    except BaseException:
        for _, wal in opened:
            wal.close()
        raise
    return manifest, opened


def recover_container(
    paths: ContainerPaths, ops: FileOps, *, max_attributes: int = MAX_SEGMENT_ATTRIBUTES
) -> tuple[ContainerState, WalWriter]:
    """Open one container of an open data dir (one installed or detached at
    runtime): recover it as ``recover_store`` does, checkpoint it, and return
    its state and a fresh WAL file.

    Merges across containers are not finished here (``recover_store`` does
    that across the whole data dir): a cluster refuses merges across owners.

    Raises:
        CorruptionError: damage (nothing was changed).
        StorageFull: no room for what recovery must write (nothing was changed).
    """
    one = analyse_container(paths, max_attributes=max_attributes)
    needed = recovery_bytes(one)
    if needed:
        reserve_space(paths.dir, needed + RECOVERY_MARGIN_BYTES, ops)
    repair_container(one, ops)
    return one.state, _open_wal(paths, one.state, ops)
