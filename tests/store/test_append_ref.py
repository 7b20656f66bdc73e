"""Large appends written once: APPEND_REF records (format version 2).

An append of at least ``ref_append_bytes`` goes to the segment's data file
only; the WAL gets a record with its position, size and CRC-32. These tests
check the record's encoding, that the one-pass checksum equals the chained
one, that the bytes really are written once and synced before the WAL under
every policy, that recovery treats missing or damaged referenced bytes as a
torn tail (backed up, cut, data file cut back), that a process killed
between the data write and the WAL write leaves no phantom bytes, that
mixed small and large appends across the segments of one container recover
as a prefix of their history, and that a version 1 data dir still opens.

A "crash" is a copy of the data dir taken while the store is open (what a
``kill -9`` leaves: the page cache's view of every file), or a real
``SIGKILL`` of a child process.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from headrace.errors import CorruptionError
from headrace.store.api import MAX_APPEND_BYTES, FsyncPolicy
from headrace.store.disk import DiskStore, FileOps
from headrace.store.disk.container import REF_APPEND_BYTES, REF_APPEND_BYTES_UNSYNCED
from headrace.store.disk.format import (
    FORMAT_VERSION,
    MANIFEST,
    PAYLOAD_HEADER,
    SIDECAR_BLOCK_BYTES,
    SIDECAR_HEADER,
    SYNCED_MARK_VERSION,
    WAL_HEADER,
    WAL_HEADER_V2,
    AppendRefRecord,
    Record,
    RecordType,
    SealRecord,
    _body,
    crc32,
    decode_manifest,
    decode_record,
    decode_snapshot,
    encode_record,
    encode_snapshot,
    encode_wal_header,
    scan_frames,
)
from headrace.store.disk.layout import (
    ContainerPaths,
    SegmentMapping,
    container_of,
    manifest_path,
)
from headrace.store.disk.log import scan_wal
from headrace.store.disk.segment import Segment
from headrace.store.disk.verify import verify_data_dir
from headrace.types import SegmentKind, WriterAppend
from tests._hypothesis import examples

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
KILL_CHILD = HERE / "ref_kill_child.py"
CHILD_TIMEOUT_S = 60.0
"""Bound on the kill child: opening a store, three appends, its own SIGKILL."""

SYNC_WAIT_S = 10.0
"""Bound on the periodic sync (every 50 ms here) happening on 2 busy cores."""

SEGMENT = "ref/0"
LARGE = REF_APPEND_BYTES + 1000
"""Above ``REF_APPEND_BYTES``: logged by reference with the default threshold."""


def _payload(tag: int, size: int) -> bytes:
    block = struct.pack(">I", tag + 0x5A5A0101) * 16
    return (block * (size // len(block) + 1))[:size]


def _paths(root: Path, name: str = SEGMENT, containers: int = 1) -> ContainerPaths:
    return ContainerPaths(root, container_of(name, containers))


def _wal_records(root: Path) -> list[tuple[int, int, object]]:
    paths = _paths(root)
    records = []
    for _, path in paths.wal_files():
        scan = scan_wal(path, paths.container_id)
        records += scan.records
    return records


def _data_file(root: Path, segment_id: int = 1) -> Path:
    return _paths(root).data(segment_id)


def _backups(root: Path) -> list[Path]:
    return sorted(_paths(root).wal_dir.glob("*.broken-*"))


# ---------------------------------------------------------------------- format


@given(
    segment_id=st.integers(0, 2**64 - 1),
    offset=st.integers(0, 2**64 - 1),
    modified_ms=st.integers(-(2**63), 2**63 - 1),
    writer=st.none() | st.builds(WriterAppend, st.uuids(), st.integers(-(2**63), 2**63 - 1)),
    size=st.integers(1, MAX_APPEND_BYTES),
    crc=st.integers(0, 2**32 - 1),
    seq=st.integers(0, 2**64 - 1),
)
def test_append_ref_record_round_trips(
    segment_id: int,
    offset: int,
    modified_ms: int,
    writer: WriterAppend | None,
    size: int,
    crc: int,
    seq: int,
) -> None:
    record = AppendRefRecord(segment_id, offset, modified_ms, writer, size, crc, b"not encoded")
    raw = b"".join(encode_record(seq, record))
    assert len(raw) == 8 + 9 + 57  # frame header, seq + type, fixed body: no data
    [(position, decoded_seq, decoded)] = list(scan_frames(raw, 0, "wal"))
    assert (position, decoded_seq) == (0, seq)
    assert decoded == record  # ``data`` is not part of the record's identity ...
    assert isinstance(decoded, AppendRefRecord) and decoded.data == b""  # ... nor encoded
    kind, head, tail = _body(record)  # the hot path packs what the general one does
    assert raw[8:] == PAYLOAD_HEADER.pack(seq, kind) + head + bytes(tail)


@pytest.mark.parametrize(
    ("size", "extra", "reason"),
    [
        (0, b"", "APPEND_REF of 0 bytes"),
        (MAX_APPEND_BYTES + 1, b"", "APPEND_REF of"),
        (5, b"x", "APPEND_REF body of 58 bytes"),
    ],
)
def test_malformed_append_ref_is_corruption(size: int, extra: bytes, reason: str) -> None:
    body = struct.pack(">QQqB16sqII", 1, 0, 0, 0, bytes(16), 0, size, 0) + extra
    payload = struct.pack(">QB", 7, RecordType.APPEND_REF) + body
    with pytest.raises(CorruptionError, match=reason):
        decode_record(memoryview(payload), "wal", 28)


@settings(max_examples=examples(40), deadline=None)
@given(
    sizes=st.lists(
        st.one_of(
            st.integers(0, 300),
            st.integers(SIDECAR_BLOCK_BYTES - 300, SIDECAR_BLOCK_BYTES + 300),
            st.integers(0, 2 * SIDECAR_BLOCK_BYTES + 5),
        ),
        min_size=1,
        max_size=6,
    ),
    seed=st.integers(0, 255),
)
def test_one_pass_checksum_equals_the_chained_one(sizes: list[int], seed: int) -> None:
    chained = Segment(1, "a", SegmentKind.STREAM, 0)
    one_pass = Segment(1, "a", SegmentKind.STREAM, 0)
    offset = 0
    for i, size in enumerate(sizes):
        data = bytes((seed + i + j) % 251 for j in range(min(size, 997))) * (size // 997 + 1)
        data = data[:size]
        chained.extend_checksum(offset, data)
        assert one_pass.extend_checksum_crc(offset, memoryview(data)) == crc32(data)
        offset += size
    assert one_pass.take_blocks() == chained.take_blocks()
    assert (one_pass.block_offset, one_pass.dirty) == (chained.block_offset, chained.dirty)


# ---------------------------------------------------------------------- written once


class OrderOps(FileOps):
    """Records the order of data syncs and WAL syncs (from any thread)."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[str] = []
        self._lock = threading.Lock()
        self.wal_synced = threading.Event()

    def sync_data(self, fd: int) -> None:
        with self._lock:
            self.events.append("data")
        super().sync_data(fd)

    def sync_wal(self, fd: int) -> None:
        with self._lock:
            self.events.append("wal")
        super().sync_wal(fd)
        self.wal_synced.set()


async def test_large_append_is_written_once_and_synced_before_the_wal(tmp_path: Path) -> None:
    ops = OrderOps()
    root = tmp_path / "data"
    store = await DiskStore.open(root, container_count=1, file_ops=ops)
    try:
        await store.create_segment(SEGMENT)
        wal = _paths(root).wal_files()[-1][1]
        before = wal.stat().st_size
        ops.events.clear()
        large = _payload(1, LARGE)
        result = await store.append(SEGMENT, large)
        assert (result.offset, result.length) == (0, LARGE)
        # The WAL got a fixed-size record, the data file the bytes.
        assert wal.stat().st_size - before == 8 + 9 + 57
        assert _data_file(root).read_bytes() == large
        assert sorted(ops.events) == ["data", "wal"]  # acknowledged after both
        # A small append stays an APPEND with its bytes, and needs no data sync.
        ops.events.clear()
        await store.append(SEGMENT, b"small")
        assert ops.events == ["wal"]
        assert wal.stat().st_size - before == 2 * (8 + 9) + 57 + 49 + 5
        assert (await store.read(SEGMENT, 0, 1 << 20)).data == large + b"small"
        kinds = [type(r).__name__ for _, _, r in _wal_records(root)]
        assert kinds[-2:] == ["AppendRefRecord", "AppendRecord"]
    finally:
        await store.close()
    store = await DiskStore.open(root)
    try:
        assert (await store.read(SEGMENT, 0, 1 << 20)).data == large + b"small"
    finally:
        await store.close()
    assert verify_data_dir(root).ok


class GatedDataOps(OrderOps):
    """Data syncs wait for ``gate`` (bounded), so the WAL sync beside them ends first."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.gate.set()

    def sync_data(self, fd: int) -> None:
        assert self.gate.wait(SYNC_WAIT_S), "the test never opened the gate"
        super().sync_data(fd)


NOT_ACKNOWLEDGED_WINDOW_S = 0.3
"""How long an append whose data sync is held must stay unacknowledged (a
bounded check that something does not happen)."""


async def test_an_append_is_acknowledged_only_once_its_bytes_are_synced(tmp_path: Path) -> None:
    ops = GatedDataOps()
    store = await DiskStore.open(tmp_path / "data", container_count=1, file_ops=ops)
    try:
        await store.create_segment(SEGMENT)
        ops.gate.clear()
        ops.wal_synced.clear()
        ops.events.clear()
        small = asyncio.create_task(store.append(SEGMENT, b"small, same round"))
        large = asyncio.create_task(store.append(SEGMENT, _payload(3, LARGE)))
        assert await asyncio.to_thread(ops.wal_synced.wait, SYNC_WAIT_S)  # the WAL is synced
        done, _ = await asyncio.wait({small, large}, timeout=NOT_ACKNOWLEDGED_WINDOW_S)
        assert not done  # ... but neither append of the round is acknowledged yet
        ops.gate.set()
        await asyncio.wait_for(asyncio.gather(small, large), SYNC_WAIT_S)
        assert sorted(ops.events) == ["data", "wal"]  # one round, both syncs
    finally:
        ops.gate.set()
        await store.close()


@pytest.mark.parametrize("policy", [FsyncPolicy.NEVER, FsyncPolicy.INTERVAL])
async def test_every_wal_sync_syncs_referenced_bytes_too(
    tmp_path: Path, policy: FsyncPolicy
) -> None:
    ops = OrderOps()
    root = tmp_path / "data"
    store = await DiskStore.open(
        root, container_count=1, file_ops=ops, fsync=policy, fsync_interval_s=0.05
    )
    try:
        await store.create_segment(SEGMENT)
        await store.flush()  # from here the only unsynced record is the append below
        ops.events.clear()
        ops.wal_synced.clear()
        await store.append(SEGMENT, _payload(2, LARGE))
        # Readers see it at once (acknowledged without a sync) ...
        assert (await store.read(SEGMENT, 0, LARGE)).data == _payload(2, LARGE)
        if policy is FsyncPolicy.NEVER:
            assert ops.events == []
            await store.flush()
        else:  # ... and the periodic sync covers it, with its data
            assert await asyncio.to_thread(ops.wal_synced.wait, SYNC_WAIT_S)
            # The data file is synced beside the WAL, in another thread: the
            # round (which this flush joins) ends only once both returned.
            await asyncio.wait_for(store.flush(), SYNC_WAIT_S)
        assert sorted(ops.events[:2]) == ["data", "wal"]
    finally:
        await store.close()


# ---------------------------------------------------------------------- recovery


async def _crash_copy(
    tmp_path: Path, sizes: list[int], *, policy: FsyncPolicy = FsyncPolicy.ALWAYS
) -> tuple[Path, list[bytes]]:
    """Append ``sizes`` to SEGMENT and copy the data dir while the store is open."""
    live = tmp_path / "live"
    store = await DiskStore.open(live, container_count=1, fsync=policy)
    appended = [_payload(i, size) for i, size in enumerate(sizes)]
    try:
        await store.create_segment(SEGMENT)
        for data in appended:
            await store.append(SEGMENT, data)
        crashed = tmp_path / "crashed"
        shutil.copytree(live, crashed)  # no await: no checkpoint can start meanwhile
    finally:
        await store.close()
    return crashed, appended


SIZES = [100, LARGE, 300, LARGE + 7, 50]
"""small, large, small, large, small: the fourth is the victim below."""


def _damage_zero(path: Path, offset: int, size: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(bytes(size))


def _damage_flip(path: Path, offset: int, size: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset + size // 2)
        byte = f.read(1)
        f.seek(offset + size // 2)
        f.write(bytes([byte[0] ^ 1]))


def _damage_cut(path: Path, offset: int, size: int) -> None:
    os.truncate(path, offset + size - 1)


@pytest.mark.parametrize("damage", [_damage_zero, _damage_flip, _damage_cut])
@pytest.mark.parametrize("policy", [FsyncPolicy.ALWAYS, FsyncPolicy.NEVER])
async def test_damaged_referenced_bytes_are_a_torn_tail(
    tmp_path: Path, damage: object, policy: FsyncPolicy
) -> None:
    assert callable(damage)
    crashed, appended = await _crash_copy(tmp_path, SIZES, policy=policy)
    victim_offset = sum(SIZES[:3])
    records = _wal_records(crashed)
    victim = next(r for _, _, r in records if getattr(r, "offset", None) == victim_offset)
    assert isinstance(victim, AppendRefRecord) and victim.size_bytes == SIZES[3]
    damage(_data_file(crashed), victim_offset, SIZES[3])

    report = verify_data_dir(crashed)  # a torn tail is a note, not damage
    assert report.ok, report.lines()
    assert any("torn tail" in n and "referenced bytes" in n for n in report.notes), report.notes

    store = await DiskStore.open(crashed)
    try:
        info = await store.info(SEGMENT)
        assert info.length == victim_offset  # the victim and the append after it are cut
        assert (await store.read(SEGMENT, 0, 1 << 20)).data == b"".join(appended[:3])
        # The data file was cut back: a new append lands where the victim was.
        assert _data_file(crashed).stat().st_size == victim_offset
        again = await store.append(SEGMENT, b"after")
        assert again.offset == victim_offset
    finally:
        await store.close()
    [backup] = _backups(crashed)
    kept = backup.read_bytes()
    torn = list(scan_frames(kept, 0, str(backup)))  # the victim's record and the small one
    assert [type(t[2]).__name__ for t in torn if isinstance(t, tuple)] == [
        "AppendRefRecord",
        "AppendRecord",
    ]
    store = await DiskStore.open(crashed)
    try:
        data = (await store.read(SEGMENT, 0, 1 << 20)).data
        assert data == b"".join(appended[:3]) + b"after"
    finally:
        await store.close()
    assert verify_data_dir(crashed).ok


async def test_missing_data_file_of_a_new_segment_is_a_torn_tail(tmp_path: Path) -> None:
    crashed, _ = await _crash_copy(tmp_path, [LARGE, 10])
    _data_file(crashed).unlink()  # e.g. its directory entry was never synced
    store = await DiskStore.open(crashed)
    try:
        info = await store.info(SEGMENT)  # the CREATE before the reference survives
        assert info.length == 0
        assert await store.append(SEGMENT, b"x") is not None
    finally:
        await store.close()
    [backup] = _backups(crashed)
    kept = backup.read_bytes()
    torn = [t for t in scan_frames(kept, 0, str(backup)) if isinstance(t, tuple)]
    assert [type(t[2]).__name__ for t in torn] == ["AppendRefRecord", "AppendRecord"]
    assert verify_data_dir(crashed).ok


def _next_wal(root: Path, records: list[Record]) -> Path:
    """Start the WAL file a checkpoint would start next, holding ``records``."""
    paths = _paths(root)
    wal = paths.wal_files()[-1][1]
    scan = scan_wal(wal, paths.container_id)
    next_seq = scan.first_seq + len(scan.records)
    raw = encode_wal_header(paths.container_id, next_seq)
    for seq, record in enumerate(records, next_seq):
        raw += b"".join(encode_record(seq, record))
    path = wal.parent / f"{next_seq:020d}.wal"
    path.write_bytes(raw)
    return path


async def test_bad_reference_before_an_empty_next_wal_file_is_a_torn_tail(
    tmp_path: Path,
) -> None:
    # A checkpoint creates the next WAL file before it syncs the previous one and
    # its referenced bytes: a power cut in between leaves this shape.
    crashed, appended = await _crash_copy(tmp_path, [100, LARGE])
    empty_next = _next_wal(crashed, [])
    _damage_zero(_data_file(crashed), 100, LARGE)
    assert verify_data_dir(crashed).ok
    store = await DiskStore.open(crashed)
    try:
        assert (await store.read(SEGMENT, 0, 1 << 20)).data == appended[0]
    finally:
        await store.close()
    assert not empty_next.exists()
    assert len(_backups(crashed)) == 2  # the reference's tail and the empty file, copied
    assert _data_file(crashed).stat().st_size == 100
    assert verify_data_dir(crashed).ok


async def test_bad_reference_before_records_in_a_later_wal_file_is_corruption(
    tmp_path: Path,
) -> None:
    crashed, _ = await _crash_copy(tmp_path, [LARGE])
    _next_wal(crashed, [SealRecord(1, 0)])  # the sync thread never writes this before
    _damage_zero(_data_file(crashed), 0, LARGE)  # ... the reference's bytes were synced
    before = {p: p.read_bytes() for p in crashed.rglob("*") if p.is_file() and p.name != "lock"}
    with pytest.raises(CorruptionError, match="not the last"):
        await DiskStore.open(crashed)
    after = {p: p.read_bytes() for p in crashed.rglob("*") if p.is_file() and p.name != "lock"}
    assert after == before  # nothing repaired or cut
    assert not verify_data_dir(crashed).ok


def test_killed_between_data_write_and_wal_write_leaves_no_phantom_bytes(
    tmp_path: Path,
) -> None:
    root = tmp_path / "data"
    done = subprocess.run(
        [sys.executable, str(KILL_CHILD), str(root), SEGMENT],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
        cwd=ROOT,
    )
    assert done.returncode == -signal.SIGKILL, (done.returncode, done.stdout, done.stderr)
    lines = done.stdout.split()
    assert lines[-1] == "KILLING", done.stdout  # killed inside the third append's WAL write
    acknowledged = int(lines[-2])
    data_file = _data_file(root)
    # The third append's bytes reached the data file; its record never reached the WAL.
    assert data_file.stat().st_size > acknowledged
    report = verify_data_dir(root)
    assert report.ok, report.lines()

    async def check() -> None:
        store = await DiskStore.open(root)
        try:
            info = await store.info(SEGMENT)
            assert info.length == acknowledged
            data = (await store.read(SEGMENT, 0, 1 << 20)).data
            assert data == _payload(0, 100) + _payload(1, LARGE)
            assert data_file.stat().st_size == acknowledged  # no phantom bytes left
            result = await store.append(SEGMENT, b"next")
            assert result.offset == acknowledged
            assert (await store.read(SEGMENT, acknowledged, 100)).data == b"next"
        finally:
            await store.close()

    asyncio.run(check())
    assert verify_data_dir(root).ok


# ---------------------------------------------------------------------- mixed history

MIXED_NAMES = ("mixed/0", "mixed/1", "mixed/2")
MIXED_REF_BYTES = 256
"""Threshold for the mixed-history test: about half its appends are references."""


async def _mixed_run(
    base: Path, appends: list[tuple[int, int]], cut: float, damage: int | None, policy: FsyncPolicy
) -> None:
    history: list[tuple[str, bytes | None]] = [(name, None) for name in MIXED_NAMES]
    history += [(MIXED_NAMES[s], _payload(i, size)) for i, (s, size) in enumerate(appends)]
    live = base / "live"
    store = await DiskStore.open(
        live, container_count=1, fsync=policy, ref_append_bytes=MIXED_REF_BYTES
    )
    try:
        for name, data in history:
            if data is None:
                await store.create_segment(name)
            else:
                await store.append(name, data)
        crashed = base / "crashed"
        shutil.copytree(live, crashed)  # no await: the copy is one moment
    finally:
        await store.close()

    paths = ContainerPaths(crashed, 0)
    [(first_seq, wal)] = paths.wal_files()
    assert first_seq == 1  # history entry h is record seq h + 1
    size = wal.stat().st_size
    os.truncate(wal, WAL_HEADER.size + int(cut * (size - WAL_HEADER.size)))
    scan = scan_wal(wal, 0)
    kept = len(scan.records)
    refs = [(seq, r) for _, seq, r in scan.records if isinstance(r, AppendRefRecord)]
    if damage is not None and refs:
        seq, victim = refs[damage % len(refs)]
        _damage_zero(paths.data(victim.segment_id), victim.offset, victim.size_bytes)
        kept = seq - 1  # the records before the damaged one
        event("a referenced range zeroed")
    event("references in the WAL" if refs else "no reference in the WAL")
    event("cut inside the history" if kept < len(history) else "whole history kept")
    assert verify_data_dir(crashed).ok

    expected: dict[str, bytearray] = {}
    for name, data in history[:kept]:
        if data is None:
            expected[name] = bytearray()
        else:
            expected[name] += data
    store = await DiskStore.open(crashed)
    try:
        assert sorted(await store.list_segments()) == sorted(expected)
        for name, data in expected.items():
            assert (await store.read(name, 0, 1 << 20)).data == bytes(data), name
            seg = store._container(name).state.by_name[name]
            assert paths.data(seg.segment_id).stat().st_size == len(data)  # cut back
    finally:
        await store.close()
    assert verify_data_dir(crashed).ok


@settings(
    max_examples=examples(30),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    appends=st.lists(
        st.tuples(st.integers(0, len(MIXED_NAMES) - 1), st.integers(1, 3 * MIXED_REF_BYTES)),
        min_size=1,
        max_size=24,
    ),
    cut=st.sampled_from([1.0, 1.0]) | st.floats(0.0, 1.0),
    damage=st.none() | st.integers(0, 100),
    policy=st.sampled_from([FsyncPolicy.ALWAYS, FsyncPolicy.NEVER]),
)
def test_mixed_small_and_large_appends_across_segments_recover_in_order(
    tmp_path_factory: pytest.TempPathFactory,
    appends: list[tuple[int, int]],
    cut: float,
    damage: int | None,
    policy: FsyncPolicy,
) -> None:
    """Small (APPEND) and large (APPEND_REF) appends interleaved over three
    segments of one container; the WAL cut anywhere and/or one reference's
    bytes zeroed: what opens is exactly the history up to the first lost
    record, in order, with every data file cut to its segment's length."""
    base = tmp_path_factory.mktemp("mixed")
    asyncio.run(_mixed_run(base, appends, cut, damage, policy))


# ---------------------------------------------------------------------- version 1


def _rewrite_version(path: Path, position: int, crc_end: int | None, version: int) -> None:
    """Set a file's format version field (and its header CRC, if it has one)."""
    raw = bytearray(path.read_bytes())
    struct.pack_into(">I", raw, position, version)
    if crc_end is not None:
        struct.pack_into(">I", raw, crc_end, crc32(bytes(raw[:crc_end])))
    else:  # the snapshot: a trailing CRC of everything before it
        struct.pack_into(">I", raw, len(raw) - 4, crc32(bytes(raw[:-4])))
    path.write_bytes(bytes(raw))


def _as_old_wal(path: Path, version: int) -> None:
    """Make a WAL file an older version's: the first header part with its
    version, without the synced mark (versions 1 and 2 have none)."""
    raw = path.read_bytes()
    path.write_bytes(raw[: WAL_HEADER_V2.size] + raw[WAL_HEADER.size :])
    _rewrite_version(path, 8, WAL_HEADER_V2.size - 4, version)


@pytest.mark.parametrize("version", [1, 2, 3])
async def test_an_older_data_dir_opens_and_is_marked_with_this_version(
    tmp_path: Path, version: int
) -> None:
    """Versions 1 (no APPEND_REF), 2 (no synced mark) and 3 (no time index) are
    opened as they are, and the manifest then says this version, so older
    releases refuse the dir. Events from before the time index have no append
    time; those appended since have one."""
    root = tmp_path / "data"
    store = await DiskStore.open(
        root,
        container_count=1,
        ref_append_bytes=MAX_APPEND_BYTES,
        segment_mapping=SegmentMapping.HASH,  # older versions knew no other
    )
    try:  # with references off: what a version 1 store wrote
        await store.create_segment(SEGMENT)
        await store.append(SEGMENT, _payload(1, LARGE))
        crashed = tmp_path / "crashed"
        shutil.copytree(root, crashed)  # the append is in the WAL only
    finally:
        await store.close()
    for dir_ in (root, crashed):
        paths = _paths(dir_)
        _rewrite_version(manifest_path(dir_), 8, MANIFEST.size - 4, version)
        for _, wal in paths.wal_files():
            if version < SYNCED_MARK_VERSION:
                _as_old_wal(wal, version)
            else:
                _rewrite_version(wal, 8, WAL_HEADER_V2.size - 4, version)
        snapshot = decode_snapshot(paths.snapshot.read_bytes(), "s")
        paths.snapshot.write_bytes(encode_snapshot(snapshot, version=version))
        for sidecar in paths.segments_dir.glob("*.crc"):
            _rewrite_version(sidecar, 8, SIDECAR_HEADER.size - 4, version)
        assert decode_manifest(manifest_path(dir_).read_bytes(), "m").version == version
        assert verify_data_dir(dir_).ok
        store = await DiskStore.open(dir_)
        try:
            assert (await store.read(SEGMENT, 0, 1 << 20)).data == _payload(1, LARGE)
            manifest = decode_manifest(manifest_path(dir_).read_bytes(), "m")
            assert manifest.version == FORMAT_VERSION
            second = await store.append(SEGMENT, _payload(2, LARGE))  # now by reference
        finally:
            await store.close()
        store = await DiskStore.open(dir_)
        try:
            data = (await store.read(SEGMENT, 0, 1 << 20)).data
            assert data == _payload(1, LARGE) + _payload(2, LARGE)
            times = await store.append_times(SEGMENT, 0, second.length)
            if dir_ == root:  # the first append was in the old snapshot, without a time
                assert [o for o, _ in times] == [second.offset]
                assert await store.offset_at_time(SEGMENT, 0) == second.offset
            else:  # replayed from the WAL, whose APPEND records carry their time
                assert [o for o, _ in times] == [0, second.offset]
        finally:
            await store.close()


async def test_an_unknown_format_version_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "data"
    mapping = SegmentMapping.HASH  # the 28-byte manifest
    await (await DiskStore.open(root, container_count=1, segment_mapping=mapping)).close()
    _rewrite_version(manifest_path(root), 8, MANIFEST.size - 4, FORMAT_VERSION + 1)
    with pytest.raises(CorruptionError, match=f"unsupported format version {FORMAT_VERSION + 1}"):
        await DiskStore.open(root)


def test_the_default_threshold_is_what_the_docs_say() -> None:
    assert REF_APPEND_BYTES == 256 * 1024  # docs/storage-format.md#wal, #append and #limits
    assert REF_APPEND_BYTES_UNSYNCED == 16 * 1024


@pytest.mark.parametrize(
    ("policy", "threshold"),
    [
        (FsyncPolicy.ALWAYS, REF_APPEND_BYTES),
        (FsyncPolicy.INTERVAL, REF_APPEND_BYTES_UNSYNCED),
        (FsyncPolicy.NEVER, REF_APPEND_BYTES_UNSYNCED),
    ],
)
async def test_the_threshold_follows_the_policy(
    tmp_path: Path, policy: FsyncPolicy, threshold: int
) -> None:
    root = tmp_path / "data"
    store = await DiskStore.open(root, container_count=1, fsync=policy)
    try:
        await store.create_segment(SEGMENT)
        await store.append(SEGMENT, _payload(1, threshold - 1))
        await store.append(SEGMENT, _payload(2, threshold))
        await store.flush()
        kinds = [type(r).__name__ for _, _, r in _wal_records(root)]
        assert kinds[-2:] == ["AppendRecord", "AppendRefRecord"]
    finally:
        await store.close()


# ---------------------------------------------------------------------- power cut


async def test_never_policy_checkpoints_keep_referenced_bytes_through_a_power_cut(
    tmp_path: Path,
) -> None:
    """Under ``never`` only checkpoints and flushes sync. A checkpoint drops the
    old WAL only after the data files it refers to are synced, so a power cut
    at any moment opens as a prefix of what was appended (never a reference to
    lost bytes), and one right after a flush holds everything."""
    from tests.store.test_recovery import PowerLossOps

    rng = random.Random(11)
    ops = PowerLossOps()
    live = tmp_path / "live"
    store = await DiskStore.open(
        live,
        file_ops=ops,
        container_count=1,
        fsync=FsyncPolicy.NEVER,
        checkpoint_wal_bytes=32 * 1024,
        ref_append_bytes=256,
    )
    appended = bytearray()
    cuts: list[tuple[Path, bytes, bool]] = []
    try:
        await store.create_segment(SEGMENT)
        await store.flush()
        for i in range(160):
            data = _payload(i, rng.choice([50, 300, 5000]))
            await store.append(SEGMENT, data)
            appended += data
            if i % 10 == 9:
                flushed = i % 20 == 19
                if flushed:
                    await store.flush()
                dest = tmp_path / f"cut-{i}"
                ops.image(live, dest)  # no await: the loop stands still meanwhile
                cuts.append((dest, bytes(appended), flushed))
        first_wal_seq = _paths(live).wal_files()[0][0]
    finally:
        await store.close()
    assert ops.data_syncs > 0
    assert first_wal_seq > 100  # checkpoints ran and dropped old WAL files
    lengths = []
    for dest, expected, flushed in cuts:
        store = await DiskStore.open(dest)
        try:
            data = (await store.read(SEGMENT, 0, 1 << 22)).data
        finally:
            await store.close()
        assert expected.startswith(data), dest.name
        if flushed:
            assert data == expected, dest.name
        lengths.append(len(data))
        assert verify_data_dir(dest).ok
    assert len(set(lengths)) > 1
