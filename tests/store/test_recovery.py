"""DiskStore recovery: torn tails are backed up then cut; damage is never silent.

A "crash" here is a copy of the data dir taken while the store is open: it
holds exactly what the OS holds for the files at that moment (what a
``kill -9`` leaves), and every append acknowledged before the copy is in it.
Faults are then applied to the copy: cutting the last WAL file anywhere,
appending garbage, flipping bits in each kind of file. A ``FileOps`` subclass
injects write failures into a live store. Random histories, replayed on
``MemoryStore`` as the model, check that any cut of the log recovers exactly
the state after some prefix of the history.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import stat
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from uuid import UUID

import pytest

from headrace.errors import CorruptionError, SegmentNotFound, StoreClosed
from headrace.store.api import SegmentStore
from headrace.store.disk import DiskStore, FileOps
from headrace.store.disk.container import REF_APPEND_BYTES
from headrace.store.disk.format import SIDECAR_BLOCK_BYTES, WAL_HEADER, encode_wal_header
from headrace.store.disk.layout import ContainerPaths, container_of
from headrace.store.disk.log import scan_wal
from headrace.store.disk.repair import repair_data_dir
from headrace.store.disk.verify import verify_data_dir
from headrace.store.memory import MemoryStore
from headrace.types import (
    NULL_ATTRIBUTE_VALUE,
    ReadResult,
    RegionRead,
    SegmentKind,
    TableUpdate,
    WriterAppend,
)

CONTAINERS = 2
SEGMENT = "stream/0"
APPENDS = [bytes([65 + i]) * (3 + 5 * i) for i in range(8)]


# ---------------------------------------------------------------------- helpers


async def _crash_copy(tmp_path: Path, build: Callable[[DiskStore], Awaitable[None]]) -> Path:
    """Run ``build`` on a live store, copy its data dir mid-flight, close it."""
    live = tmp_path / "live"
    store = await DiskStore.open(live, container_count=CONTAINERS)
    try:
        await build(store)
        crashed = tmp_path / "crashed"
        await asyncio.to_thread(shutil.copytree, live, crashed)
    finally:
        await store.close()
    return crashed


async def _appends(store: DiskStore) -> None:
    await store.create_segment(SEGMENT)
    for data in APPENDS:
        await store.append(SEGMENT, data)


def _last_wal(root: Path, name: str = SEGMENT) -> Path:
    paths = ContainerPaths(root, container_of(name, CONTAINERS))
    return paths.wal_files()[-1][1]


def _files(root: Path) -> dict[str, bytes]:
    """Every file's bytes (but the lock), to show a failed open changed nothing."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != "lock"
    }


def _fresh(src: Path, dst: Path) -> Path:
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    return dst


def _flip(path: Path, position: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[position] ^= 0x10
    path.write_bytes(bytes(raw))


def _append_bytes(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def _backups(wal: Path) -> list[Path]:
    return sorted(wal.parent.glob(wal.name + ".broken-*"))


@dataclass(frozen=True)
class Frame:
    start: int
    end: int


def _frames(wal: Path) -> list[Frame]:
    scan = scan_wal(wal, container_of(SEGMENT, CONTAINERS))
    assert scan.problem is None
    starts = [position for position, _, _ in scan.records]
    return [Frame(a, b) for a, b in zip(starts, [*starts[1:], scan.end], strict=True)]


async def _contents(root: Path) -> bytes | None:
    store = await DiskStore.open(root)
    try:
        return (await store.read(SEGMENT, 0, 1 << 20)).data
    except SegmentNotFound:
        return None
    finally:
        await store.close()


# ---------------------------------------------------------------------- torn tails


def _cut_positions(frames: list[Frame]) -> list[int]:
    positions = {0, 1, WAL_HEADER.size - 1}
    for f in frames:
        size = f.end - f.start
        positions |= {f.start, f.start + 1, f.start + 7, f.start + 8, f.start + 17}
        positions |= {f.start + size // 2, f.end - 1}
    return sorted(positions)


async def test_torn_tail_at_any_position_is_backed_up_and_cut(tmp_path: Path) -> None:
    crashed = await _crash_copy(tmp_path, _appends)
    wal = _last_wal(crashed)
    original = wal.read_bytes()
    frames = _frames(wal)
    assert len(frames) == 1 + len(APPENDS)  # the create, then one record per append
    for cut in _cut_positions(frames):
        root = await asyncio.to_thread(_fresh, crashed, tmp_path / "torn")
        twal = _last_wal(root)
        os.truncate(twal, cut)
        if cut < WAL_HEADER.size:
            # Not even the header: the only WAL file is as good as missing, and
            # no crash leaves that (the header is synced before the snapshot
            # that needs the file). The records after the snapshot are lost.
            container = container_of(SEGMENT, CONTAINERS)
            await _assert_refused(root, f"container {container} has no readable WAL file")
            continue
        report = await asyncio.to_thread(verify_data_dir, root)
        assert report.ok, (cut, report.lines())
        whole = [f for f in frames if f.end <= cut]
        expected = b"".join(APPENDS[: max(0, len(whole) - 1)]) if whole else None
        assert await _contents(root) == expected, cut
        at_boundary = cut == WAL_HEADER.size or any(f.end == cut for f in frames)
        backups = _backups(twal)
        if at_boundary:
            assert backups == [], cut
        else:
            assert len(backups) == 1, cut
            torn_from = max([WAL_HEADER.size, *(f.end for f in whole)])
            assert backups[0].read_bytes() == original[torn_from:cut], cut
        assert (await asyncio.to_thread(verify_data_dir, root)).ok


@pytest.mark.parametrize(
    "garbage", [b"\x00" * 100, b"\xff" * 3, os.urandom(4096)], ids=["zeros", "ff", "random"]
)
async def test_garbage_after_the_last_record_is_backed_up(tmp_path: Path, garbage: bytes) -> None:
    crashed = await _crash_copy(tmp_path, _appends)
    wal = _last_wal(crashed)
    _append_bytes(wal, garbage)
    assert await _contents(crashed) == b"".join(APPENDS)
    [backup] = _backups(wal)
    assert backup.read_bytes() == garbage
    assert (await _contents(crashed)) == b"".join(APPENDS)  # a second open is clean
    assert len(_backups(wal)) == 1


async def test_bad_checksum_in_the_last_record_is_a_torn_tail(tmp_path: Path) -> None:
    crashed = await _crash_copy(tmp_path, _appends)
    wal = _last_wal(crashed)
    last = _frames(wal)[-1]
    original = wal.read_bytes()
    _flip(wal, last.end - 1)
    assert await _contents(crashed) == b"".join(APPENDS[:-1])
    [backup] = _backups(wal)
    damaged = bytearray(original[last.start : last.end])
    damaged[-1] ^= 0x10
    assert backup.read_bytes() == bytes(damaged)


async def test_torn_merge_commit_leaves_source_intact(tmp_path: Path) -> None:
    source = next(f"txn-{i}" for i in range(100) if container_of(f"txn-{i}", CONTAINERS) != 0)
    target = next(f"target-{i}" for i in range(100) if container_of(f"target-{i}", CONTAINERS) == 0)
    moved = os.urandom(2 * 1024 * 1024 + 5)

    async def build(store: DiskStore) -> None:
        await store.create_segment(target)
        await store.append(target, b"head")
        await store.create_segment(source)
        await store.append(source, moved)
        await store.merge(target, source)

    crashed = await _crash_copy(tmp_path, build)
    # The source's DELETE is written only after the commit is durable: a torn
    # commit means the DELETE (the last record of the source's WAL) never was.
    source_wal = _last_wal(crashed, source)
    os.truncate(source_wal, scan_wal(source_wal, 1).records[-1][0])
    wal = _last_wal(crashed, target)
    scan = scan_wal(wal, 0)
    commit_at = scan.records[-1][0]  # the MERGE_COMMIT, after three MERGE_DATA records
    os.truncate(wal, commit_at + 10)
    store = await DiskStore.open(crashed)
    try:
        assert (await store.read(target, 0, 100)).data == b"head"
        info = await store.info(source)
        assert info.sealed  # the merge sealed it durably before copying
        assert await store.merge(target, source) == 4 + len(moved)
        assert (await store.read(target, 0, 1 << 23)).data == b"head" + moved
    finally:
        await store.close()
    assert verify_data_dir(crashed).ok


# ---------------------------------------------------------------------- damage


async def _assert_refused(root: Path, match: str) -> None:
    before = await asyncio.to_thread(_files, root)
    with pytest.raises(CorruptionError, match=match):
        await DiskStore.open(root)
    assert await asyncio.to_thread(_files, root) == before  # nothing repaired or cut
    report = await asyncio.to_thread(verify_data_dir, root)
    assert not report.ok


async def test_bit_flip_in_the_wal_middle_is_corruption(tmp_path: Path) -> None:
    crashed = await _crash_copy(tmp_path, _appends)
    wal = _last_wal(crashed)
    frames = _frames(wal)
    for victim in (frames[2].start + 20, frames[2].start + 2, frames[0].start + 12):
        root = await asyncio.to_thread(_fresh, crashed, tmp_path / "flipped")
        _flip(_last_wal(root), victim)
        await _assert_refused(root, "valid records follow")


async def test_damage_in_a_wal_file_that_is_not_the_last_is_corruption(tmp_path: Path) -> None:
    crashed = await _crash_copy(tmp_path, _appends)
    wal = _last_wal(crashed)
    frames = _frames(wal)
    scan = scan_wal(wal, container_of(SEGMENT, CONTAINERS))
    next_seq = scan.first_seq + len(scan.records)
    # A checkpoint that crashed after starting the next WAL file leaves this shape.
    (wal.parent / f"{next_seq:020d}.wal").write_bytes(
        encode_wal_header(container_of(SEGMENT, CONTAINERS), next_seq)
    )
    _flip(wal, frames[-1].end - 1)
    await _assert_refused(crashed, "not the last")


async def test_a_checkpoint_switch_cut_short_is_a_torn_end(tmp_path: Path) -> None:
    """A kill after a checkpoint created the next WAL file but before the sync thread
    wrote the previous file's last records: those records are missing (never synced,
    so never acknowledged) and the next file holds none. Open keeps every record
    that was written and backs the empty file up; verify calls it a note."""
    crashed = await _crash_copy(tmp_path, _appends)
    wal = _last_wal(crashed)
    frames = _frames(wal)
    container = container_of(SEGMENT, CONTAINERS)
    scan = scan_wal(wal, container)
    os.truncate(wal, frames[-2].start)  # the last two records were never written
    switched = scan.first_seq + len(scan.records)  # the file the switch had created
    empty = wal.parent / f"{switched:020d}.wal"
    empty.write_bytes(encode_wal_header(container, switched))
    report = verify_data_dir(crashed)
    assert report.ok, report.damage
    assert any("no record, after a log that ends at" in note for note in report.notes)
    assert await _contents(crashed) == b"".join(APPENDS[:-2])
    assert not empty.exists() and len(_backups(empty)) == 1


async def test_a_log_gap_before_records_is_corruption(tmp_path: Path) -> None:
    """The same gap with a record after it is damage, never cut away."""
    crashed = await _crash_copy(tmp_path, _appends)
    wal = _last_wal(crashed)
    frames = _frames(wal)
    container = container_of(SEGMENT, CONTAINERS)
    scan = scan_wal(wal, container)
    switched = scan.first_seq + len(scan.records)
    raw = wal.read_bytes()
    os.truncate(wal, frames[-2].start)
    later = wal.parent / f"{switched:020d}.wal"
    later.write_bytes(encode_wal_header(container, switched) + raw[frames[-2].start :])
    assert not verify_data_dir(crashed).ok
    await _assert_refused(crashed, "expected")


async def _closed_store(tmp_path: Path) -> Path:
    root = tmp_path / "closed"
    store = await DiskStore.open(root, container_count=CONTAINERS)
    await _appends(store)
    await store.close()
    return root


def _segment_file(root: Path, suffix: str) -> Path:
    paths = ContainerPaths(root, container_of(SEGMENT, CONTAINERS))
    return next(p for p in paths.segments_dir.iterdir() if p.name.endswith(suffix))


async def test_bit_flip_in_a_sidecar_is_corruption(tmp_path: Path) -> None:
    root = await _closed_store(tmp_path)
    _flip(_segment_file(root, ".crc"), 30)
    await _assert_refused(root, "sidecar")


async def test_bit_flip_in_a_snapshot_is_corruption(tmp_path: Path) -> None:
    root = await _closed_store(tmp_path)
    snapshot = ContainerPaths(root, container_of(SEGMENT, CONTAINERS)).snapshot
    for position in (0, 20, 60, snapshot.stat().st_size - 1):
        fresh = await asyncio.to_thread(_fresh, root, tmp_path / "flipped")
        _flip(ContainerPaths(fresh, container_of(SEGMENT, CONTAINERS)).snapshot, position)
        await _assert_refused(fresh, "snapshot")


async def test_bit_flip_in_the_manifest_is_corruption(tmp_path: Path) -> None:
    root = await _closed_store(tmp_path)
    _flip(root / "manifest", 13)
    await _assert_refused(root, "manifest")


async def test_missing_or_short_data_file_is_corruption(tmp_path: Path) -> None:
    root = await _closed_store(tmp_path)
    fresh = await asyncio.to_thread(_fresh, root, tmp_path / "short")
    data = _segment_file(fresh, ".data")
    os.truncate(data, data.stat().st_size - 1)
    await _assert_refused(fresh, "shorter")
    _segment_file(root, ".data").unlink()
    await _assert_refused(root, "missing")


async def test_bit_flip_in_a_data_file_is_reported_by_verify(tmp_path: Path) -> None:
    root = await _closed_store(tmp_path)
    data = _segment_file(root, ".data")
    _flip(data, 10)
    report = await asyncio.to_thread(verify_data_dir, root)
    assert not report.ok
    [damage] = report.damage
    assert damage.path == str(data)
    assert "fails its checksum" in damage.reason
    assert f"of segment {SEGMENT!r}" in damage.reason  # not only the file


BLOCK = SIDECAR_BLOCK_BYTES


async def _blocks_store(tmp_path: Path, blocks: int) -> tuple[Path, bytes]:
    """A closed store with ``blocks`` whole checksum blocks in SEGMENT."""
    root = tmp_path / "blocks"
    data = os.urandom(blocks * BLOCK)
    store = await DiskStore.open(root, container_count=CONTAINERS)
    try:
        await store.create_segment(SEGMENT)
        for start in range(0, len(data), BLOCK // 2):
            await store.append(SEGMENT, data[start : start + BLOCK // 2])
    finally:
        await store.close()
    return root, data


async def test_a_damaged_data_block_is_refused_to_readers_not_served(tmp_path: Path) -> None:
    """A byte flipped in a data file while the store was stopped: every read
    touching that block fails with CorruptionError naming the segment; reads
    of the other blocks, zero-copy or not, and appends go on."""
    root, data = await _blocks_store(tmp_path, 4)
    _flip(_segment_file(root, ".data"), 2 * BLOCK + 123)
    store = await DiskStore.open(root)
    try:
        assert (await store.read(SEGMENT, 0, BLOCK)).data == data[:BLOCK]
        for offset, size in ((2 * BLOCK + 100, 10), (BLOCK + 10, BLOCK), (0, 4 * BLOCK)):
            with pytest.raises(CorruptionError, match=f"of segment {SEGMENT!r} fails") as bad:
                await store.read(SEGMENT, offset, size)
            assert bad.value.position == 2 * BLOCK
            with pytest.raises(CorruptionError):
                await store.read_region(SEGMENT, offset, size, min_region_bytes=1)
        # The first read of a block is served from the bytes its check read ...
        checked = await store.read_region(SEGMENT, 3 * BLOCK, BLOCK, min_region_bytes=1)
        assert isinstance(checked, ReadResult) and checked.data == data[3 * BLOCK :]
        # ... later ones zero-copy.
        region = await store.read_region(SEGMENT, 3 * BLOCK, BLOCK, min_region_bytes=1)
        assert isinstance(region, RegionRead)
        try:
            got = os.pread(region.region.fd, BLOCK, region.region.position)
        finally:
            region.region.close()
        assert got == data[3 * BLOCK :]
        assert (await store.read(SEGMENT, BLOCK, BLOCK)).data == data[BLOCK : 2 * BLOCK]
        await store.append(SEGMENT, b"after")
        end = len(data)
        assert (await store.read(SEGMENT, end, 100)).data == b"after"
    finally:
        await store.close()


async def test_checked_blocks_are_not_read_again(tmp_path: Path) -> None:
    """Each block from before the open is checked once; then its segment drops
    the bookkeeping and reads are plain again."""
    root, data = await _blocks_store(tmp_path, 3)
    store = await DiskStore.open(root)
    try:
        c = store._container(SEGMENT)
        seg = c.state.by_name[SEGMENT]
        assert seg.unchecked_end == 3 * BLOCK and seg.checks is not None
        assert (await store.read(SEGMENT, 10, 5)).data == data[10:15]
        assert seg.checks is not None and seg.checks.unchecked == 2
        _flip(_segment_file(root, ".data"), 20)  # after its check: not read again
        assert (await store.read(SEGMENT, 10, 5)).data == data[10:15]
        assert (await store.read(SEGMENT, BLOCK, 2 * BLOCK)).data == data[BLOCK:]
        assert seg.checks is None and seg.unchecked_end == 0
    finally:
        await store.close()


async def test_every_file_and_directory_is_private_whatever_the_umask(tmp_path: Path) -> None:
    """0700 directories and 0600 files, under umask 000: the WAL, snapshots,
    manifest, lock, data files, sidecars and torn-tail backups."""
    root = tmp_path / "private"
    old = os.umask(0)
    try:
        store = await DiskStore.open(root, container_count=CONTAINERS)
        try:
            await _appends(store)
        finally:
            await store.close()
        _append_bytes(_last_wal(root), b"torn")
        assert await _contents(root) == b"".join(APPENDS)  # backs the torn tail up
    finally:
        os.umask(old)
    assert _backups(_last_wal(root))
    modes = {path: stat.S_IMODE(path.lstat().st_mode) for path in [root, *root.rglob("*")]}
    wrong = {
        str(path): oct(mode)
        for path, mode in modes.items()
        if mode != (0o700 if path.is_dir() else 0o600)
    }
    assert not wrong, wrong


async def test_leftover_snapshot_tmp_is_ignored(tmp_path: Path) -> None:
    crashed = await _crash_copy(tmp_path, _appends)
    paths = ContainerPaths(crashed, container_of(SEGMENT, CONTAINERS))
    paths.snapshot_tmp.write_bytes(b"half a snapshot")
    assert await _contents(crashed) == b"".join(APPENDS)
    assert not paths.snapshot_tmp.exists()


# ---------------------------------------------------------------------- fault injection


class TearingOps(FileOps):
    """Writes half of one WAL record, then fails, like a full disk mid-write."""

    def __init__(self) -> None:
        super().__init__()
        self.tear_next = False

    def write(self, fd: int, buffers: list[bytes | memoryview], size_bytes: int) -> None:
        if self.tear_next:
            joined = b"".join(buffers)
            os.write(fd, joined[: len(joined) // 2])
            raise OSError(28, "injected ENOSPC")
        super().write(fd, buffers, size_bytes)


async def test_torn_write_stops_the_store_and_recovers(tmp_path: Path) -> None:
    ops = TearingOps()
    store = await DiskStore.open(tmp_path, file_ops=ops, container_count=CONTAINERS)
    await _appends(store)
    ops.tear_next = True
    with pytest.raises(Exception, match="no space") as caught:
        await store.append(SEGMENT, b"torn" * 100)
    assert not isinstance(caught.value, CorruptionError)
    with pytest.raises(StoreClosed):
        await store.append(SEGMENT, b"after")
    await store.close()
    assert await _contents(tmp_path) == b"".join(APPENDS)
    paths = ContainerPaths(tmp_path, container_of(SEGMENT, CONTAINERS))
    [backup] = paths.broken_files()
    assert 0 < backup.stat().st_size < len(b"torn" * 100)


class HoleOps(FileOps):
    """Once armed, the next WAL write of three or more records reaches the file in
    pieces, as an unsynced write can after a power cut: its first record and
    half of the second, then a hole of zeros, then its last record. Then the
    write fails (the process "died" before the sync: nothing of it was
    acknowledged)."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False
        self.torn_at = -1

    def write(self, fd: int, buffers: list[bytes | memoryview], size_bytes: int) -> None:
        if not self.armed or len(buffers) < 6:
            super().write(fd, buffers, size_bytes)
            return
        self.armed = False
        sizes = [len(buffers[i]) + len(buffers[i + 1]) for i in range(0, len(buffers), 2)]
        joined = b"".join(buffers)
        start = os.fstat(fd).st_size
        self.torn_at = start + sizes[0]  # the second record: half written, then a hole
        os.write(fd, joined[: sizes[0] + sizes[1] // 2])
        os.ftruncate(fd, start + len(joined) - sizes[-1])
        os.write(fd, joined[-sizes[-1] :])
        raise OSError(5, "injected: the power went before the sync")


async def test_a_torn_unsynced_write_with_valid_records_after_it_is_cut(
    tmp_path: Path,
) -> None:
    """The hole lies past the synced mark: no record of the write was
    acknowledged, so open backs it up and cuts it, whatever follows it."""
    ops = HoleOps()
    live = tmp_path / "live"
    store = await DiskStore.open(live, file_ops=ops, container_count=CONTAINERS)
    try:
        await _appends(store)
        ops.armed = True
        results = await asyncio.gather(
            *(store.append(SEGMENT, b"never acknowledged %d" % i) for i in range(5)),
            return_exceptions=True,
        )
        assert all(isinstance(r, StoreClosed) for r in results), results
        crashed = tmp_path / "crashed"
        await asyncio.to_thread(shutil.copytree, live, crashed)
    finally:
        await store.close()
    wal = _last_wal(crashed)
    scan = scan_wal(wal, container_of(SEGMENT, CONTAINERS))
    assert scan.problem is not None and scan.problem.position == ops.torn_at
    assert scan.later_record_at is not None  # valid records after the hole
    assert scan.synced_end is not None and scan.synced_end <= ops.torn_at
    report = await asyncio.to_thread(verify_data_dir, crashed)
    assert report.ok, report.lines()
    assert any("torn write" in note for note in report.notes), report.notes
    size = wal.stat().st_size
    # The write's first record reached the disk whole: kept, as whole records
    # before any torn tail are (it was never acknowledged, nor refused as stored).
    assert await _contents(crashed) == b"".join(APPENDS) + b"never acknowledged 0"
    [backup] = _backups(wal)
    assert backup.stat().st_size == size - ops.torn_at
    assert (await asyncio.to_thread(verify_data_dir, crashed)).ok


async def test_damage_before_the_synced_mark_with_records_after_it_is_refused(
    tmp_path: Path,
) -> None:
    """The same shape inside bytes a sync covered is damage to acknowledged
    records: refused, and the directory left as it was."""
    crashed = await _crash_copy(tmp_path, _appends)
    wal = _last_wal(crashed)
    scan = scan_wal(wal, container_of(SEGMENT, CONTAINERS))
    frames = _frames(wal)
    assert scan.synced_end == frames[-1].end  # every record was acknowledged
    raw = bytearray(wal.read_bytes())
    raw[frames[3].start : frames[5].start] = bytes(frames[5].start - frames[3].start)
    wal.write_bytes(bytes(raw))
    await _assert_refused(crashed, "so this is not a torn write")


async def test_repair_cuts_a_refused_log_and_reports_what_it_held(tmp_path: Path) -> None:
    crashed = await _crash_copy(tmp_path, _appends)
    wal = _last_wal(crashed)
    frames = _frames(wal)
    raw = bytearray(wal.read_bytes())
    damaged = frames[3]  # the third append; frames[0] is the CREATE
    raw[damaged.start + 8 : damaged.end] = bytes(damaged.end - damaged.start - 8)
    wal.write_bytes(bytes(raw))
    await _assert_refused(crashed, "not a torn write")

    report = await asyncio.to_thread(repair_data_dir, crashed)
    assert report.ok, report.lines()
    [cut] = report.cuts
    assert (cut.path, cut.position) == (wal, damaged.start)
    assert cut.lost.records == len(frames) - 4
    assert cut.lost.appends == {SEGMENT: (len(APPENDS) - 3, sum(map(len, APPENDS[3:])))}
    assert cut.lost.unreadable_bytes == damaged.end - damaged.start
    [backup] = _backups(wal)
    assert backup.read_bytes() == bytes(raw[damaged.start :])
    assert report.lines()[-1].startswith("REPAIRED:")
    assert await _contents(crashed) == b"".join(APPENDS[:2])
    again = await asyncio.to_thread(repair_data_dir, crashed)
    assert again.ok and not again.cuts
    assert again.lines()[-1].startswith("NOTHING TO REPAIR")


async def test_repair_starts_an_empty_log_for_a_deleted_one(tmp_path: Path) -> None:
    crashed = await _crash_copy(tmp_path, _appends)
    _last_wal(crashed).unlink()
    report = await asyncio.to_thread(repair_data_dir, crashed)
    assert report.ok and len(report.cuts) == 1, report.lines()
    assert report.cuts[0].new_wal is not None
    assert await _contents(crashed) is None  # the snapshot was taken before the create
    assert (await asyncio.to_thread(verify_data_dir, crashed)).ok


async def test_repair_leaves_damage_outside_the_log_alone(tmp_path: Path) -> None:
    root = await _closed_store(tmp_path)
    _flip(_segment_file(root, ".crc"), 30)
    before = await asyncio.to_thread(_files, root)
    report = await asyncio.to_thread(repair_data_dir, root)
    assert not report.ok and not report.cuts
    assert "sidecar" in report.refused[0]
    assert await asyncio.to_thread(_files, root) == before


async def test_the_synced_mark_follows_the_syncs(tmp_path: Path) -> None:
    store = await DiskStore.open(tmp_path, container_count=CONTAINERS)
    try:
        await store.create_segment(SEGMENT)
        wal = _last_wal(tmp_path)
        for data in APPENDS:
            await store.append(SEGMENT, data)
            scan = scan_wal(wal, container_of(SEGMENT, CONTAINERS))
            assert scan.synced_end == wal.stat().st_size == scan.end
    finally:
        await store.close()


async def test_a_missing_wal_is_refused_naming_the_container(tmp_path: Path) -> None:
    """The records after the snapshot were in the deleted file: open and verify
    say so, naming the container, instead of starting without them."""
    crashed = await _crash_copy(tmp_path, _appends)
    container = container_of(SEGMENT, CONTAINERS)
    _last_wal(crashed).unlink()
    await _assert_refused(crashed, f"container {container} has no readable WAL file")
    report = await asyncio.to_thread(verify_data_dir, crashed)
    assert any(f"container {container} has no readable WAL" in str(d) for d in report.damage)


class FailDeleteOps(FileOps):
    """Fails the WAL write of a merge's source deletion (record type 5, merged).

    Buffers come in pairs per record: frame and fixed fields, then the tail.
    """

    def write(self, fd: int, buffers: list[bytes | memoryview], size_bytes: int) -> None:
        for head in buffers[::2]:
            if len(head) > 25 and head[16] == 5 and head[25] == 1:
                raise OSError(5, "injected EIO")
        super().write(fd, buffers, size_bytes)


async def test_merge_interrupted_after_commit_is_finished_on_open(tmp_path: Path) -> None:
    source = next(f"txn-{i}" for i in range(100) if container_of(f"txn-{i}", CONTAINERS) == 1)
    target = next(f"tgt-{i}" for i in range(100) if container_of(f"tgt-{i}", CONTAINERS) == 0)
    store = await DiskStore.open(tmp_path, file_ops=FailDeleteOps(), container_count=CONTAINERS)
    await store.create_segment(target)
    await store.append(target, b"T")
    await store.create_segment(source)
    await store.append(source, b"SS")
    assert await store.merge(target, source) == 3  # the commit is durable: a success
    await store.close()
    store = await DiskStore.open(tmp_path)
    try:
        assert await store.list_segments() == [target]
        assert (await store.read(target, 0, 10)).data == b"TSS"
        assert await store.merge(target, source) == 3
    finally:
        await store.close()
    assert verify_data_dir(tmp_path).ok


async def test_damage_anywhere_means_no_repair_anywhere(tmp_path: Path) -> None:
    other = next(
        f"other-{i}"
        for i in range(100)
        if container_of(f"other-{i}", CONTAINERS) != container_of(SEGMENT, CONTAINERS)
    )
    assert container_of(SEGMENT, CONTAINERS) != container_of(other, CONTAINERS)

    async def build(store: DiskStore) -> None:
        await _appends(store)
        await store.create_segment(other)
        for data in APPENDS:
            await store.append(other, data)

    crashed = await _crash_copy(tmp_path, build)
    _append_bytes(_last_wal(crashed, other), b"torn tail")  # repairable on its own
    wal = _last_wal(crashed)
    _flip(wal, _frames(wal)[3].start + 20)  # damage in the other container
    await _assert_refused(crashed, "valid records follow")
    assert _backups(_last_wal(crashed, other)) == []


# ---------------------------------------------------------------------- random histories


async def _model_dump(store: SegmentStore) -> dict[str, object]:
    """Everything observable, but the clock."""
    out: dict[str, object] = {}
    for name in await store.list_segments():
        info = await store.info(name)
        data = (await store.read(name, info.start_offset, 1 << 24)).data
        entry: list[object] = [info.kind, info.start_offset, info.length, info.sealed]
        entry += [dict(info.attributes), data]
        if info.kind is SegmentKind.TABLE:
            entry.append((await store.iterate_table_entries(name, max_count=10_000)).items)
        out[name] = entry
    return out


Op = Callable[[SegmentStore], Awaitable[object]]


def _random_history(rng: random.Random, count: int) -> list[Op]:
    """Operations that each write one WAL record (a merge is preceded by its seal),
    so every cut of a one-container WAL is the history of some prefix of them."""
    names = ["a", "b", "../c", "d\x00", "t"]
    ops: list[Op] = [lambda s: s.create_segment("a"), lambda s: s.create_table("t")]
    live = {"a"}
    sealed: set[str] = set()
    lengths = {"a": 0}
    while len(ops) < count:
        choice = rng.random()
        name = rng.choice(sorted(live))
        if choice < 0.15 and len(live) < len(names) - 1:
            new = rng.choice([n for n in names if n not in live and n != "t"])
            live.add(new)
            lengths[new] = 0
            ops.append(lambda s, n=new: s.create_segment(n))
        elif choice < 0.55 and name not in sealed:
            data = rng.randbytes(rng.choice([1, 7, 300, 5000]))
            writer = WriterAppend(UUID(int=rng.randrange(3) + 1), len(ops) + 1)
            lengths[name] += len(data)
            ops.append(lambda s, n=name, d=data, w=writer: s.append(n, d, writer=w))
        elif choice < 0.62:
            sealed.add(name)
            ops.append(lambda s, n=name: s.seal(n))
        elif choice < 0.70 and lengths[name]:
            offset = rng.randrange(lengths[name] + 1)
            ops.append(lambda s, n=name, o=offset: _truncate_up_to(s, n, o))
        elif choice < 0.78:
            value = rng.randrange(1000)
            ops.append(lambda s, n=name, v=value: _set_attribute(s, n, v))
        elif choice < 0.86:
            key, value = rng.randbytes(3), rng.randbytes(rng.randrange(20))
            ops.append(lambda s, k=key, v=value: s.update_table("t", [TableUpdate(k, v)]))
        elif choice < 0.93 and len(live) > 1:
            target = rng.choice(sorted(live - {name} - sealed) or [None])
            if target is None:
                continue
            if name not in sealed:
                ops.append(lambda s, n=name: s.seal(n))
            ops.append(lambda s, t=target, n=name: s.merge(t, n))
            lengths[target] += lengths[name]
            live.discard(name)
            sealed.discard(name)
        elif len(live) > 1:
            live.discard(name)
            sealed.discard(name)
            ops.append(lambda s, n=name: s.delete(n))
    return ops


async def _truncate_up_to(store: SegmentStore, name: str, offset: int) -> None:
    info = await store.info(name)
    await store.truncate(name, max(offset, info.start_offset))


async def _set_attribute(store: SegmentStore, name: str, value: int) -> None:
    current = await store.get_attribute(name, A_ID)
    await store.update_attribute(name, A_ID, value, current)


A_ID = UUID(int=0xA77)


@pytest.mark.parametrize("checkpoint_wal_bytes", [1 << 30, 4096])
@pytest.mark.parametrize("seed", range(6))
async def test_any_cut_of_the_log_recovers_a_prefix_of_the_history(
    tmp_path: Path, seed: int, checkpoint_wal_bytes: int
) -> None:
    rng = random.Random(seed)
    history = _random_history(rng, 40)
    model = MemoryStore()
    prefixes = [await _model_dump(model)]
    for op in history:
        await op(model)
        prefixes.append(await _model_dump(model))
    await model.close()

    live = tmp_path / "live"
    store = await DiskStore.open(live, container_count=1, checkpoint_wal_bytes=checkpoint_wal_bytes)
    try:
        for op in history:
            await op(store)
        # copytree is not atomic like a crash: let a running checkpoint end, then
        # copy without yielding to the loop, so no other checkpoint can start.
        await store.flush()
        crashed = tmp_path / "crashed"
        shutil.copytree(live, crashed)
    finally:
        await store.close()
    wal = ContainerPaths(crashed, 0).wal_files()[-1][1]
    size = wal.stat().st_size
    cuts = {
        size,
        *(rng.randrange(WAL_HEADER.size, size) for _ in range(4) if size > WAL_HEADER.size),
    }
    seen: set[int] = set()
    for cut in sorted(cuts):
        root = await asyncio.to_thread(_fresh, crashed, tmp_path / "cut")
        os.truncate(ContainerPaths(root, 0).wal_files()[-1][1], cut)
        assert (await asyncio.to_thread(verify_data_dir, root)).ok
        store = await DiskStore.open(root)
        try:
            dump = await _model_dump(store)
        finally:
            await store.close()
        assert dump in prefixes, (seed, cut)
        seen.add(prefixes.index(dump))
        if cut == size:
            assert dump == prefixes[-1]
        report = await asyncio.to_thread(verify_data_dir, root)
        assert report.ok, report.lines()
    if size > WAL_HEADER.size:  # (else a checkpoint had just started a new WAL file)
        assert len(seen) > 1  # the cuts really landed at different points of the history


# ---------------------------------------------------------------------- power loss


class PowerLossOps(FileOps):
    """Remembers what each sync made durable, to build the disk after a power cut.

    A file's content is recorded just before its fsync (everything written
    before the call is covered by it); a directory's entries likewise. The
    image of a power cut has, for each directory that was ever synced, the
    entries of its last sync, each with its file's content as of its last
    sync, and nothing else: unsynced files are empty, unsynced entries gone.
    That is one outcome a real power cut can have; the store must survive it
    with every acknowledged change.

    Contents are keyed by inode *and* path (a file renamed over its final name,
    ``x.tmp`` -> ``x``, keeps its content), because a journaling file system
    never shows a deleted file's entry pointing at its inode's next owner.
    """

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self.contents: dict[tuple[int, str], bytes] = {}
        self.listings: dict[int, dict[str, tuple[int, bool]]] = {}

    @staticmethod
    def _final(path: str) -> str:
        return path.replace("/containers.tmp/", "/containers/").removesuffix(".tmp")

    def _record(self, fd: int) -> None:
        st = os.fstat(fd)
        path = os.readlink(f"/proc/self/fd/{fd}")
        if stat.S_ISDIR(st.st_mode):
            entries = {e.name: (e.inode(), e.is_dir()) for e in os.scandir(path)}
            with self._lock:
                self.listings[st.st_ino] = entries
        else:
            with open(f"/proc/self/fd/{fd}", "rb") as f:
                data = f.read()
            with self._lock:
                self.contents[(st.st_ino, self._final(path))] = data

    def baseline(self, root: Path) -> None:
        """Count everything already under ``root`` as durable."""
        for dirpath, _, filenames in os.walk(root):
            for path in [dirpath, *(os.path.join(dirpath, f) for f in filenames)]:
                fd = os.open(path, os.O_RDONLY)
                try:
                    self._record(fd)
                finally:
                    os.close(fd)

    def sync_wal(self, fd: int) -> None:
        self._record(fd)
        super().sync_wal(fd)

    def sync_file(self, fd: int) -> None:
        self._record(fd)
        super().sync_file(fd)

    def sync_data(self, fd: int) -> None:
        self._record(fd)
        super().sync_data(fd)

    def image(self, root: Path, dest: Path) -> None:
        with self._lock:
            contents, listings = dict(self.contents), dict(self.listings)

        def build(inode: int, live: str, into: Path) -> None:
            into.mkdir()
            for name, (child, is_dir) in listings.get(inode, {}).items():
                if is_dir:
                    build(child, f"{live}/{name}", into / name)
                else:
                    data = contents.get((child, self._final(f"{live}/{name}")), b"")
                    (into / name).write_bytes(data)

        build(root.stat().st_ino, os.path.realpath(root), dest)


@dataclass
class Acknowledged:
    """What a power-cut workload has been told is durable."""

    data: dict[str, bytearray]
    empties: set[str]
    sealed: set[str]
    starts: dict[str, int]
    attributes: dict[str, int]
    table: dict[bytes, bytes]

    def copy(self) -> Acknowledged:
        return Acknowledged(
            {n: bytearray(d) for n, d in self.data.items()},
            set(self.empties),
            set(self.sealed),
            dict(self.starts),
            dict(self.attributes),
            dict(self.table),
        )


MAINS = [f"main-{i}" for i in range(3)]


async def _power_workload(
    store: DiskStore,
    ops: PowerLossOps,
    live: Path,
    acked: Acknowledged,
    rng: random.Random,
    steps: int,
    cuts: list[tuple[Path, Acknowledged]],
) -> None:
    """Random operations; every 20, the image of a power cut at that moment."""
    for step in range(steps):
        choice = rng.random()
        open_mains = [n for n in MAINS if n not in acked.sealed]
        name = rng.choice(open_mains)
        if choice < 0.45:
            data = rng.randbytes(rng.choice([5, 200, 3000]))
            result = await store.append(name, data)
            assert result.offset == len(acked.data[name])
            acked.data[name] += data
        elif choice < 0.55:
            empty = f"empty-{len(cuts)}-{step}"
            await store.create_segment(empty)
            acked.empties.add(empty)
        elif choice < 0.62 and acked.empties:
            gone = rng.choice(sorted(acked.empties))
            await store.delete(gone)
            acked.empties.discard(gone)
        elif choice < 0.70:
            start = rng.randrange(acked.starts[name], len(acked.data[name]) + 1)
            await store.truncate(name, start)
            acked.starts[name] = start
        elif choice < 0.76:
            value = rng.randrange(1 << 40)
            assert await store.update_attribute(name, A_ID, value, acked.attributes[name])
            acked.attributes[name] = value
        elif choice < 0.84:
            key, value = rng.randbytes(2), rng.randbytes(rng.randrange(50))
            await store.update_table("table", [TableUpdate(key, value)])
            acked.table[key] = value
        elif choice < 0.86 and len(open_mains) > 1:
            await store.seal(name)
            acked.sealed.add(name)
        else:
            txn = f"txn-{len(cuts)}-{step}"
            data = rng.randbytes(rng.choice([10, 2000]))
            await store.create_segment(txn)
            await store.append(txn, data)
            assert await store.merge(name, txn) == len(acked.data[name]) + len(data)
            acked.data[name] += data
        if step % 20 == 19:
            dest = live.parent / f"cut-{len(cuts)}"
            ops.image(live, dest)  # no await: the loop stands still meanwhile
            cuts.append((dest, acked.copy()))


async def _check_cut(dest: Path, acked: Acknowledged) -> None:
    store = await DiskStore.open(dest)
    try:
        names = set(MAINS) | acked.empties | {"table"}
        assert set(await store.list_segments()) == names, dest.name
        for name in MAINS:
            info = await store.info(name)
            start = acked.starts[name]
            assert (info.start_offset, info.length) == (start, len(acked.data[name]))
            assert info.sealed == (name in acked.sealed)
            assert info.attributes.get(A_ID, NULL_ATTRIBUTE_VALUE) == acked.attributes[name]
            data = (await store.read(name, start, 1 << 22)).data
            assert data == bytes(acked.data[name][start:]), dest.name
        entries = await store.iterate_table_entries("table", max_count=10_000)
        assert {e.key: e.value for e in entries.items} == acked.table
    finally:
        await store.close()
    report = await asyncio.to_thread(verify_data_dir, dest)
    assert report.ok, report.lines()


@pytest.mark.parametrize("ref_append_bytes", [REF_APPEND_BYTES, 100])
async def test_power_cut_at_any_moment_keeps_every_acknowledged_change(
    tmp_path: Path, ref_append_bytes: int
) -> None:
    """With the default threshold the workload's appends (5-3000 bytes) carry
    their bytes in the WAL; with 100 most are APPEND_REFs, whose bytes a power
    cut keeps only if their data file was synced before the WAL."""
    rng = random.Random(7)
    ops = PowerLossOps()
    live = tmp_path / "live"
    acked = Acknowledged(
        {n: bytearray() for n in MAINS},
        set(),
        set(),
        dict.fromkeys(MAINS, 0),
        dict.fromkeys(MAINS, NULL_ATTRIBUTE_VALUE),
        {},
    )
    cuts: list[tuple[Path, Acknowledged]] = []
    store = await DiskStore.open(
        live,
        file_ops=ops,
        container_count=CONTAINERS,
        checkpoint_wal_bytes=8192,
        ref_append_bytes=ref_append_bytes,
    )
    try:
        for name in MAINS:
            await store.create_segment(name)
        await store.create_table("table")
        ops.image(live, tmp_path / "cut-fresh")
        cuts.append((tmp_path / "cut-fresh", acked.copy()))
        await _power_workload(store, ops, live, acked, rng, 120, cuts)
    finally:
        await store.close()
    # A clean close and reopen, then more work: the reopen's own writes must be safe too.
    store = await DiskStore.open(
        live, file_ops=ops, checkpoint_wal_bytes=8192, ref_append_bytes=ref_append_bytes
    )
    try:
        await _power_workload(store, ops, live, acked, rng, 60, cuts)
    finally:
        await store.close()
    # Recover a power-cut image, and cut the power again while working on it.
    crashed, state = cuts[4]
    again = tmp_path / "again"
    shutil.copytree(crashed, again)
    ops2 = PowerLossOps()
    ops2.baseline(again)
    store = await DiskStore.open(
        again, file_ops=ops2, checkpoint_wal_bytes=8192, ref_append_bytes=ref_append_bytes
    )
    try:
        acked = state.copy()
        await _power_workload(store, ops2, again, acked, rng, 60, cuts)
    finally:
        await store.close()
    assert len(cuts) == 13
    for dest, state in cuts:
        await _check_cut(dest, state)


async def test_interrupted_first_open_is_redone(tmp_path: Path) -> None:
    # Killed inside the first open: before the containers were in place ...
    (tmp_path / "containers.tmp").mkdir()
    (tmp_path / "lock").touch()
    report = await asyncio.to_thread(verify_data_dir, tmp_path)
    assert report.ok
    assert "not initialised" in report.lines()[1]
    # ... or after, but before the manifest was written.
    store = await DiskStore.open(tmp_path, container_count=CONTAINERS)
    await store.close()
    (tmp_path / "manifest").unlink()
    assert (await asyncio.to_thread(verify_data_dir, tmp_path)).ok
    store = await DiskStore.open(tmp_path, container_count=3)
    try:
        assert store.container_count == 3
        await store.create_segment("s")
        await store.append("s", b"x")
    finally:
        await store.close()
    # With data present, a missing manifest is damage, not a fresh start.
    (tmp_path / "manifest").unlink()
    assert not (await asyncio.to_thread(verify_data_dir, tmp_path)).ok
    with pytest.raises(CorruptionError, match="manifest missing"):
        await DiskStore.open(tmp_path)
