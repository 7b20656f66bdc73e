"""DiskStore: the conformance suite, plus what only a disk store can get wrong.

The contract runs under ``always`` (parked acknowledgements, group commit) and
``never`` (immediate acknowledgements; ``interval`` acknowledges the same way,
its periodic sync has its own test). The disk-specific
tests check that a reopened store is indistinguishable from the one that was
closed, that hostile names never reach the file system, that concurrent
appends share fsyncs (counted through ``FileOps``, never timed), and that an
I/O failure stops the store instead of acknowledging.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import threading
from collections.abc import AsyncIterator, Coroutine
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from click.testing import CliRunner

from headrace.cli.verify import verify
from headrace.errors import (
    SegmentNotFound,
    StorageFull,
    StoreClosed,
    StoreError,
)
from headrace.store import MemoryStore
from headrace.store.api import FsyncPolicy
from headrace.store.disk import DiskStore, FileOps
from headrace.store.disk.format import SIDECAR_BLOCK_BYTES
from headrace.store.disk.layout import container_of
from headrace.store.disk.verify import verify_data_dir
from headrace.types import (
    NULL_ATTRIBUTE_VALUE,
    ReadResult,
    RegionRead,
    SegmentKind,
    TableUpdate,
    WriterAppend,
)
from tests.store.contract import ODD_NAMES, StoreContract

W1 = UUID(int=1)
W2 = UUID(int=2)
A1 = UUID(int=0xA1)


@pytest.fixture(params=[FsyncPolicy.ALWAYS, FsyncPolicy.NEVER])
async def store(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[DiskStore]:
    s = await DiskStore.open(tmp_path / "data", fsync=request.param)
    yield s
    await s.close()


class TestDiskStore(StoreContract):
    pass


class CountingOps(FileOps):
    """Counts WAL writes (one per batch of records) next to the sync counters."""

    def __init__(self) -> None:
        super().__init__()
        self.wal_writes = 0

    def write(self, fd: int, buffers: list[bytes | memoryview], size_bytes: int) -> None:
        self.wal_writes += 1
        super().write(fd, buffers, size_bytes)


async def _read_all(store: DiskStore, name: str) -> bytes:
    info = await store.info(name)
    offset, parts = info.start_offset, []
    while True:
        result = await store.read(name, offset, 1 << 20)
        if not result.data:
            return b"".join(parts)
        parts.append(result.data)
        offset += len(result.data)


async def _dump(store: DiskStore) -> dict[str, object]:
    """Everything observable about a store's contents."""
    out: dict[str, object] = {}
    for name in await store.list_segments():
        info = await store.info(name)
        entry: dict[str, object] = {"info": info, "data": await _read_all(store, name)}
        if info.kind is SegmentKind.TABLE:
            page = await store.iterate_table_entries(name, max_count=1000)
            entry["table"] = (page.items, await store.table_info(name))
        else:
            entry["times"] = await store.append_times(name, 0, info.length)
        out[name] = entry
    return out


async def _populate(store: DiskStore) -> None:
    await store.create_segment("plain")
    for i in range(20):
        await store.append("plain", bytes([i]) * (i + 1), writer=WriterAppend(W1, i + 1))
    await store.create_segment("sealed")
    await store.append("sealed", b"final")
    await store.seal("sealed")
    await store.create_segment("truncated")
    await store.append("truncated", b"0123456789")
    await store.truncate("truncated", 4)
    await store.update_attribute("plain", A1, 42, -(2**63))
    await store.create_table("table")
    await store.update_table("table", [TableUpdate(b"k1", b"v1"), TableUpdate(b"k2", b"v2")])
    await store.remove_table_keys("table", [])
    await store.create_segment("txn")
    await store.append("txn", b"transaction bytes")
    await store.merge("plain", "txn")
    await store.create_segment("gone")
    await store.delete("gone")


def _wal_files(root: Path) -> list[Path]:
    return list(root.glob("containers/*/wal/*.wal"))


def _check_tree(parent: Path, root: Path) -> None:
    """Only ``root`` was created in ``parent``, and every name in it is one of ours."""
    assert sorted(p.name for p in parent.iterdir()) == [root.name]
    for dirpath, dirnames, filenames in os.walk(root):
        for entry in dirnames + filenames:
            assert FILE_NAME.match(entry), entry
            assert Path(dirpath, entry).resolve().is_relative_to(root.resolve())


def _flip_first_data_byte(root: Path) -> None:
    data_file = next(p for p in root.glob("containers/*/segments/*.data") if p.stat().st_size)
    raw = bytearray(data_file.read_bytes())
    raw[0] ^= 0x01
    data_file.write_bytes(bytes(raw))


# ---------------------------------------------------------------------- reopen


async def test_reopen_gives_identical_contents(tmp_path: Path) -> None:
    store = await DiskStore.open(tmp_path)
    await _populate(store)
    before = await _dump(store)
    await store.close()
    store = await DiskStore.open(tmp_path)
    try:
        assert await _dump(store) == before
        assert await store.merge("plain", "txn") == (await store.info("plain")).length
        with pytest.raises(SegmentNotFound):
            await store.info("gone")
    finally:
        await store.close()
    assert verify_data_dir(tmp_path).ok


async def test_reopen_after_checkpoints_gives_identical_contents(tmp_path: Path) -> None:
    store = await DiskStore.open(tmp_path, checkpoint_wal_bytes=512)
    await _populate(store)
    await store.create_segment("big")
    big = os.urandom(3 * SIDECAR_BLOCK_BYTES + 17)
    await store.append("big", big)
    await store.create_segment("big-txn")
    await store.append("big-txn", big)
    await store.merge("big", "big-txn")
    before = await _dump(store)
    await store.close()
    assert len(_wal_files(tmp_path)) == store.container_count  # old WAL files were dropped
    store = await DiskStore.open(tmp_path, checkpoint_wal_bytes=512)
    try:
        assert await _dump(store) == before
        assert await _read_all(store, "big") == big + big
    finally:
        await store.close()
    report = verify_data_dir(tmp_path)
    assert report.ok, report.lines()
    assert report.checked_bytes >= 2 * len(big)


async def test_writer_dedup_survives_reopen(tmp_path: Path) -> None:
    store = await DiskStore.open(tmp_path)
    await store.create_segment("s")
    await store.append("s", b"one", writer=WriterAppend(W1, 5))
    await store.close()
    store = await DiskStore.open(tmp_path)
    try:
        again = await store.append("s", b"one", writer=WriterAppend(W1, 5))
        assert again.duplicate
        assert again.previous_event_number == 5
        fresh = await store.append("s", b"two", writer=WriterAppend(W1, 6))
        assert (fresh.offset, fresh.duplicate, fresh.previous_event_number) == (3, False, 5)
        assert await store.get_attribute("s", W1) == 6
        assert (await store.append("s", b"x", writer=WriterAppend(W2, 1))).offset == 6
    finally:
        await store.close()


async def test_container_count_is_fixed_at_creation(tmp_path: Path) -> None:
    store = await DiskStore.open(tmp_path, container_count=3)
    await store.create_segment("s")
    await store.close()
    store = await DiskStore.open(tmp_path, container_count=8)
    try:
        assert store.container_count == 3
        assert await store.list_segments() == ["s"]
    finally:
        await store.close()


async def test_second_open_of_same_dir_is_refused(tmp_path: Path) -> None:
    store = await DiskStore.open(tmp_path)
    try:
        with pytest.raises(StoreError, match="in use"):
            await DiskStore.open(tmp_path)
    finally:
        await store.close()
    await (await DiskStore.open(tmp_path)).close()


async def test_close_is_idempotent_and_later_calls_raise(tmp_path: Path) -> None:
    store = await DiskStore.open(tmp_path)
    await store.create_segment("s")
    await store.close()
    await store.close()
    with pytest.raises(StoreClosed):
        await store.append("s", b"x")
    with pytest.raises(StoreClosed):
        await store.read("s", 0, 1)


# ---------------------------------------------------------------------- names


HOSTILE_NAMES = [
    *ODD_NAMES,
    "../x",
    "/etc/passwd",
    "a\x00b",
    "\u4e2d" * (65535 // 3),  # 64 KiB of 3-byte UTF-8
]

FILE_NAME = re.compile(
    r"^(manifest|lock|snapshot|\d{4}|containers|wal|segments|\d{20}\.wal|[0-9a-f]{16}\.(data|crc))$"
)


async def test_hostile_names_stay_inside_the_data_dir(tmp_path: Path) -> None:
    root = tmp_path / "data"
    store = await DiskStore.open(root)
    names = list(dict.fromkeys(HOSTILE_NAMES))
    for i, name in enumerate(names):
        await store.create_segment(name)
        await store.append(name, str(i).encode())
    await store.close()
    _check_tree(tmp_path, root)
    store = await DiskStore.open(root)
    try:
        assert await store.list_segments() == sorted(names)
        for i, name in enumerate(names):
            assert (await store.read(name, 0, 100)).data == str(i).encode()
    finally:
        await store.close()


# ---------------------------------------------------------------------- group commit


async def test_concurrent_appends_share_fsyncs(tmp_path: Path) -> None:
    ops = CountingOps()
    store = await DiskStore.open(tmp_path, file_ops=ops, container_count=2)
    try:
        names = [f"s{i}" for i in range(8)]
        for name in names:
            await store.create_segment(name)
        syncs_before, writes_before = ops.wal_syncs, ops.wal_writes
        count = 400
        results = await asyncio.gather(
            *(store.append(names[i % len(names)], b"e%d" % i) for i in range(count))
        )
        syncs = ops.wal_syncs - syncs_before
        assert 1 <= syncs <= 2 * store.container_count  # one or two rounds per container
        assert ops.wal_writes - writes_before <= syncs  # and one write per round
        # Each segment's appends were acknowledged in issue order, at increasing offsets.
        for name in names:
            mine = [r.offset for i, r in enumerate(results) if names[i % len(names)] == name]
            assert mine == sorted(mine)
    finally:
        await store.close()


class GatedOps(FileOps):
    """Holds WAL syncs until the test opens the gate."""

    def __init__(self) -> None:
        super().__init__()
        self.gated = False
        self.entered = threading.Event()
        self.gate = threading.Event()

    def sync_wal(self, fd: int) -> None:
        if self.gated:
            self.entered.set()
            self.gate.wait()
        super().sync_wal(fd)


async def test_reads_see_only_synced_bytes(tmp_path: Path) -> None:
    ops = GatedOps()
    store = await DiskStore.open(tmp_path, file_ops=ops)
    try:
        await store.create_segment("s")
        await store.append("s", b"durable")
        ops.gated = True
        pending = asyncio.create_task(store.append("s", b"pending"))
        await asyncio.to_thread(ops.entered.wait)  # the committer is inside the sync
        # The append is written and has its offset, but is not durable yet.
        result = await store.read("s", 0, 100)
        assert result.data == b"durable"
        assert not pending.done()
        waiter = asyncio.create_task(store.wait_for_data("s", 7, 10.0))
        ops.gated = False
        ops.gate.set()
        assert await pending == (await pending)
        assert (await pending).offset == 7
        assert await waiter
        assert (await store.read("s", 0, 100)).data == b"durablepending"
    finally:
        ops.gate.set()
        await store.close()


async def test_a_cancelled_append_does_not_cancel_the_others_of_its_round(tmp_path: Path) -> None:
    """Callers of one sync round share one future: cancelling one caller is prompt
    and leaves the others parked until the sync ends; the cancelled append, already
    issued, is stored as well."""
    ops = GatedOps()
    store = await DiskStore.open(tmp_path, file_ops=ops, container_count=1)
    try:
        await store.create_segment("s")
        ops.gated = True
        tasks = [asyncio.create_task(store.append("s", b"%d" % i)) for i in range(3)]
        await asyncio.to_thread(ops.entered.wait)  # the round is inside its sync
        tasks[1].cancel()
        done, _ = await asyncio.wait({tasks[1]}, timeout=10.0)
        assert done and tasks[1].cancelled()
        assert not tasks[0].done() and not tasks[2].done()  # still parked: not durable yet
        ops.gated = False
        ops.gate.set()
        first, third = await asyncio.wait_for(asyncio.gather(tasks[0], tasks[2]), 10.0)
        assert (first.offset, third.offset) == (0, 2)
        assert (await store.read("s", 0, 100)).data == b"012"
    finally:
        ops.gate.set()
        await store.close()


class FailingWriteOps(FileOps):
    """Fails every WAL write once ``fail`` is set (a disk that just filled up)."""

    def __init__(self) -> None:
        super().__init__()
        self.fail = False

    def write(self, fd: int, buffers: list[bytes | memoryview], size_bytes: int) -> None:
        if self.fail:
            raise OSError(28, "injected ENOSPC")
        super().write(fd, buffers, size_bytes)


async def test_a_burst_past_the_pending_limit_is_written_in_order(tmp_path: Path) -> None:
    """Appends beyond MAX_PENDING_WAL_BYTES are handed to the sync thread before
    the round that syncs them; the WAL keeps their order across a reopen."""
    store = await DiskStore.open(tmp_path, container_count=1)
    chunks = [bytes([i]) * (3 * 1024 * 1024 + i) for i in range(5)]
    try:
        await store.create_segment("s")
        results = await asyncio.gather(*(store.append("s", chunk) for chunk in chunks))
        assert [r.offset for r in results] == sorted(r.offset for r in results)
    finally:
        await store.close()
    store = await DiskStore.open(tmp_path)
    try:
        assert await _read_all(store, "s") == b"".join(chunks)
    finally:
        await store.close()


async def test_a_failed_write_is_never_vouched_for_by_a_later_sync(tmp_path: Path) -> None:
    ops = FailingWriteOps()
    store = await DiskStore.open(tmp_path, file_ops=ops, container_count=1)
    await store.create_segment("s")
    await store.append("s", b"acked")
    ops.fail = True
    chunk = b"x" * (3 * 1024 * 1024)  # three of them pass the pending limit: a queued write
    outcomes = await asyncio.gather(
        *(store.append("s", chunk) for _ in range(3)), return_exceptions=True
    )
    assert all(isinstance(o, StorageFull) for o in outcomes), outcomes
    ops.fail = False
    with pytest.raises(StoreClosed):
        await store.append("s", b"after")
    assert (await store.read("s", 0, 100)).data == b"acked"
    await store.close()
    store = await DiskStore.open(tmp_path)
    try:
        assert await _read_all(store, "s") == b"acked"
    finally:
        await store.close()


@pytest.mark.parametrize("policy", list(FsyncPolicy))
async def test_a_failed_writer_append_is_never_reported_as_stored(
    tmp_path: Path, policy: FsyncPolicy
) -> None:
    """After a failed write no policy shows the failed append's writer number: a
    reconnecting Pravega writer asks for it (SetupAppend) and retries the append;
    either answer would acknowledge events that are not on disk."""
    ops = FailingWriteOps()
    store = await DiskStore.open(tmp_path, file_ops=ops, container_count=1, fsync=policy)
    await store.create_segment("s")
    await store.append("s", b"acked", writer=WriterAppend(W1, 1))
    ops.fail = True
    with pytest.raises(StorageFull):
        await store.append("s", b"failed", writer=WriterAppend(W1, 2))
    ops.fail = False
    with pytest.raises((StoreClosed, StorageFull)):
        await store.get_attribute("s", W1)
    with pytest.raises((StoreClosed, StorageFull)):
        await store.append("s", b"failed", writer=WriterAppend(W1, 2))  # the retry
    assert (await store.read("s", 0, 100)).data == b"acked"
    with contextlib.suppress(StoreClosed):  # its closing checkpoint may be refused too
        await store.close()
    store = await DiskStore.open(tmp_path)
    try:
        assert await store.get_attribute("s", W1) == 1
        assert await _read_all(store, "s") == b"acked"
    finally:
        await store.close()


async def test_data_files_evicted_during_threaded_writes_stay_open_until_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With room for two open data files, appends to eight segments evict fds that
    the sync thread is writing through; pinned fds close only after their write."""
    from headrace.store.disk import container

    monkeypatch.setattr(container, "MAX_OPEN_DATA_FILES", 2)
    store = await DiskStore.open(tmp_path, container_count=1)
    names = [f"s{i}" for i in range(8)]
    try:
        for name in names:
            await store.create_segment(name)
        for round_ in range(5):
            await asyncio.gather(
                *(store.append(name, b"%s-%d;" % (name.encode(), round_)) for name in names)
            )
    finally:
        await store.close()
    store = await DiskStore.open(tmp_path)
    try:
        for name in names:
            expected = b"".join(b"%s-%d;" % (name.encode(), r) for r in range(5))
            assert await _read_all(store, name) == expected
    finally:
        await store.close()


def test_a_pinned_data_file_closes_when_unpinned(tmp_path: Path) -> None:
    from headrace.store.disk.container import MAX_OPEN_DATA_FILES
    from headrace.store.disk.datafiles import DataFiles
    from headrace.store.disk.layout import ContainerPaths

    paths = ContainerPaths(tmp_path, 0)
    paths.segments_dir.mkdir(parents=True)
    files = DataFiles(paths, MAX_OPEN_DATA_FILES)
    files.create(1)
    fd = files.pin(1)
    files.forget(1)  # a delete while a write is in progress
    os.fstat(fd)  # still open
    files.unpin([fd])
    with pytest.raises(OSError):
        os.fstat(fd)
    files.close()


class FailingSyncOps(FileOps):
    def __init__(self) -> None:
        super().__init__()
        self.fail = False

    def sync_wal(self, fd: int) -> None:
        if self.fail:
            raise OSError(5, "injected EIO")
        super().sync_wal(fd)


async def test_failed_fsync_stops_the_store(tmp_path: Path) -> None:
    ops = FailingSyncOps()
    store = await DiskStore.open(tmp_path, file_ops=ops)
    await store.create_segment("s")
    await store.append("s", b"acked")
    ops.fail = True
    outcomes = await asyncio.gather(
        *(store.append("s", b"never") for _ in range(5)), return_exceptions=True
    )
    assert all(isinstance(o, StoreClosed) for o in outcomes), outcomes
    with pytest.raises(StoreClosed):
        await store.append("s", b"after")
    with pytest.raises(StoreClosed):
        await store.create_segment("t")
    assert (await store.read("s", 0, 100)).data == b"acked"  # reads still work
    # So does info, with the durable length; without attributes, as failed
    # records (applied, never synced) may have set some.
    info = await asyncio.wait_for(store.info("s"), 10.0)
    assert (info.length, info.sealed, info.attributes) == (5, False, {})
    for call in (store.get_attribute("s", W1), store.flush()):
        with pytest.raises(StoreClosed):  # never a hang waiting for a dead committer
            await asyncio.wait_for(call, 10.0)
    await store.close()
    store = await DiskStore.open(tmp_path)
    try:
        data = (await store.read("s", 0, 100)).data
        assert data.startswith(b"acked")  # unacknowledged appends may or may not be there
    finally:
        await store.close()


async def test_interval_policy_syncs_on_flush(tmp_path: Path) -> None:
    ops = FileOps()
    store = await DiskStore.open(
        tmp_path, file_ops=ops, fsync=FsyncPolicy.INTERVAL, fsync_interval_s=3600
    )
    try:
        await store.create_segment("s")
        before = ops.wal_syncs
        for _ in range(10):
            await store.append("s", b"x")
        assert ops.wal_syncs == before  # acknowledged without a sync
        await store.flush()
        assert ops.wal_syncs == before + 1
        await store.flush()
        assert ops.wal_syncs == before + 1  # nothing new to sync
    finally:
        await store.close()


# ---------------------------------------------------------------------- merges


async def test_merge_across_containers_moves_bytes_once(tmp_path: Path) -> None:
    store = await DiskStore.open(tmp_path, container_count=4)
    try:
        target = "target"
        source = next(
            f"source-{i}"
            for i in range(100)
            if container_of(f"source-{i}", 4) != container_of(target, 4)
        )
        await store.create_segment(target)
        await store.append(target, b"T")
        await store.create_segment(source)
        await store.append(source, b"S" * 10)
        await store.truncate(source, 3)
        assert await store.merge(target, source) == 8
        assert await store.merge(target, source) == 8
        assert await store.list_segments() == [target]
        await store.create_segment(source)  # the name is free again
        with pytest.raises(SegmentNotFound):
            await store.merge(target, "never-existed")
    finally:
        await store.close()


# ---------------------------------------------------------------------- verify CLI


async def test_verify_cli_reports_ok_and_damage(tmp_path: Path) -> None:
    store = await DiskStore.open(tmp_path)
    await _populate(store)
    await store.close()
    result = await asyncio.to_thread(CliRunner().invoke, verify, [str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "'plain' (stream" in result.output
    assert result.output.strip().endswith("OK")
    _flip_first_data_byte(tmp_path)
    result = await asyncio.to_thread(CliRunner().invoke, verify, [str(tmp_path)])
    assert result.exit_code == 1
    assert "fails its checksum" in result.output


async def test_interval_policy_syncs_periodically(tmp_path: Path) -> None:
    synced = threading.Event()

    class Ops(FileOps):
        def sync_wal(self, fd: int) -> None:
            super().sync_wal(fd)
            synced.set()

    ops = Ops()
    store = await DiskStore.open(
        tmp_path, file_ops=ops, fsync=FsyncPolicy.INTERVAL, fsync_interval_s=0.01
    )
    try:
        await store.create_segment("s")
        synced.clear()
        await store.append("s", b"x")  # acknowledged before any sync
        assert await asyncio.to_thread(synced.wait, 10.0)
    finally:
        await store.close()


async def test_cancelled_merge_still_completes(tmp_path: Path) -> None:
    ops = GatedOps()
    store = await DiskStore.open(tmp_path, file_ops=ops)
    try:
        await store.create_segment("t")
        await store.create_segment("s")
        await store.append("s", b"payload")
        await store.seal("s")
        ops.gated = True
        merge = asyncio.create_task(store.merge("t", "s"))
        await asyncio.to_thread(ops.entered.wait)  # the commit is written, not yet synced
        merge.cancel()
        ops.gated = False
        ops.gate.set()
        with pytest.raises(asyncio.CancelledError):
            await merge
        assert await store.merge("t", "s") == 7  # waits for the commit, then sees it done
        assert await store.list_segments() == ["t"]
        assert (await store.read("t", 0, 100)).data == b"payload"
    finally:
        ops.gate.set()
        await store.close()


async def test_concurrent_appends_to_one_segment_keep_issue_order(tmp_path: Path) -> None:
    store = await DiskStore.open(tmp_path)
    try:
        await store.create_segment("s")
        chunks = [b"%04d" % i for i in range(200)]
        results = await asyncio.gather(*(store.append("s", c) for c in chunks))
        assert [r.offset for r in results] == [4 * i for i in range(200)]
        assert (await store.read("s", 0, 10_000)).data == b"".join(chunks)
    finally:
        await store.close()


async def test_checkpoints_under_continuous_load_keep_everything(tmp_path: Path) -> None:
    ops = FileOps()
    store = await DiskStore.open(tmp_path, file_ops=ops, checkpoint_wal_bytes=4096)
    names = [f"s{i}" for i in range(6)]
    for name in names:
        await store.create_segment(name)
    expected = {name: bytearray() for name in names}

    async def writer(name: str) -> None:
        for i in range(60):
            data = b"%s-%d;" % (name.encode(), i)
            await store.append(name, data, writer=WriterAppend(W1, i + 1))
            expected[name] += data

    await asyncio.gather(*(writer(n) for n in names))
    await store.close()
    assert ops.file_syncs > 20  # checkpoints ran (each syncs sidecars, data, snapshot)
    assert len(_wal_files(tmp_path)) == store.container_count
    store = await DiskStore.open(tmp_path)
    try:
        for name in names:
            assert await _read_all(store, name) == bytes(expected[name])
            assert await store.get_attribute(name, W1) == 60
    finally:
        await store.close()
    assert verify_data_dir(tmp_path).ok


def _data_file_stat(root: Path) -> os.stat_result:
    """The stat of the one segment data file with data."""
    files = [p for p in root.glob("containers/*/segments/*.data") if p.stat().st_size]
    assert len(files) == 1
    return files[0].stat()


def _allocated_bytes(root: Path, name: str) -> tuple[int, int]:
    """(allocated, apparent) size of the data file of the one segment with data."""
    files = [p for p in root.glob("containers/*/segments/*.data") if p.stat().st_size]
    assert len(files) == 1, name
    st = files[0].stat()
    return st.st_blocks * 512, st.st_size


async def test_truncated_bytes_are_freed_at_checkpoint(tmp_path: Path) -> None:
    store = await DiskStore.open(tmp_path)
    block = os.urandom(SIDECAR_BLOCK_BYTES)
    await store.create_segment("s")
    for _ in range(4):
        await store.append("s", block)
    await store.truncate("s", 2 * SIDECAR_BLOCK_BYTES + 10)
    await store.close()
    allocated, apparent = _allocated_bytes(tmp_path, "s")
    assert apparent == 4 * SIDECAR_BLOCK_BYTES  # offsets still map to positions
    if allocated >= apparent:
        pytest.skip("this file system does not punch holes")
    assert allocated <= 2 * SIDECAR_BLOCK_BYTES + 64 * 1024
    assert verify_data_dir(tmp_path).ok
    store = await DiskStore.open(tmp_path)
    try:
        info = await store.info("s")
        assert (info.start_offset, info.length) == (2 * SIDECAR_BLOCK_BYTES + 10, len(block) * 4)
        assert (await store.read("s", info.start_offset, 100)).data == block[10:110]
    finally:
        await store.close()


async def test_read_region_points_into_the_data_file(tmp_path: Path) -> None:
    """Large reads come back as a region of the segment's data file; small ones as bytes."""
    store = await DiskStore.open(tmp_path)
    try:
        await store.create_segment("s")
        data = os.urandom(300_000)
        await store.append("s", data)
        small = await store.read_region("s", 5, 100, min_region_bytes=4096)
        assert isinstance(small, ReadResult) and small.data == data[5:105]
        big = await store.read_region("s", 5, 200_000, min_region_bytes=4096)
        assert isinstance(big, RegionRead)
        with big.region as region:
            assert (region.position, region.size_bytes) == (5, 200_000)
            assert os.path.samestat(os.fstat(region.fd), _data_file_stat(tmp_path))
            assert os.pread(region.fd, 200_000, 5) == data[5:200_005]
        assert region.fd == -1
        region.close()  # idempotent
    finally:
        await store.close()


async def test_read_region_excludes_appends_not_yet_durable(tmp_path: Path) -> None:
    """Under ``always`` a region ends at the durable length, like ``read``."""
    store = await DiskStore.open(tmp_path, fsync=FsyncPolicy.ALWAYS)
    try:
        await store.create_segment("s")
        await store.append("s", b"a" * 10_000)
        appending = asyncio.ensure_future(store.append("s", b"b" * 10_000))
        await asyncio.sleep(0)  # issued: in the WAL queue, parked on its sync
        result = await store.read_region("s", 0, 1 << 20)
        assert isinstance(result, RegionRead)
        with result.region as region:
            assert region.size_bytes == 10_000 and result.at_tail
        await asyncio.wait_for(appending, 10)
    finally:
        await store.close()


async def test_open_regions_are_bounded_then_reads_are_copies(tmp_path: Path) -> None:
    """Past ``max_open_regions`` (descriptors) a large read comes back as bytes."""
    store = await DiskStore.open(tmp_path)
    store.max_open_regions = 2
    try:
        await store.create_segment("s")
        data = os.urandom(100_000)
        await store.append("s", data)
        first = await store.read_region("s", 0, 50_000)
        second = await store.read_region("s", 1, 50_000)
        assert isinstance(first, RegionRead) and isinstance(second, RegionRead)
        third = await store.read_region("s", 2, 50_000)
        assert isinstance(third, ReadResult) and third.data == data[2:50_002]
        first.region.close()
        first.region.close()  # counted once
        fourth = await store.read_region("s", 3, 50_000)
        assert isinstance(fourth, RegionRead)
        assert isinstance(await store.read_region("s", 4, 50_000), ReadResult)
        second.region.close()
        fourth.region.close()
    finally:
        await store.close()


async def test_open_region_keeps_truncated_blocks_until_closed(tmp_path: Path) -> None:
    """A checkpoint does not punch out truncated blocks a region still points into;
    a checkpoint after the region is closed does."""
    store = await DiskStore.open(tmp_path)
    block = os.urandom(SIDECAR_BLOCK_BYTES)
    await store.create_segment("s")
    for _ in range(3):
        await store.append("s", block)
    result = await store.read_region("s", 10, 1000)
    assert isinstance(result, RegionRead)
    await store.truncate("s", 2 * SIDECAR_BLOCK_BYTES)
    await store.close()  # the closing checkpoint, with the region open
    with result.region as region:
        assert region.read() == block[10:1010]  # not a hole of zeros
    allocated_pinned, apparent = _allocated_bytes(tmp_path, "s")
    assert allocated_pinned >= apparent  # nothing was freed
    store = await DiskStore.open(tmp_path)
    try:
        await store.append("s", b"more")  # something for the next checkpoint to cover
    finally:
        await store.close()
    allocated, apparent = _allocated_bytes(tmp_path, "s")
    if allocated < apparent:  # this file system punches holes: the blocks are gone now
        assert allocated <= apparent - 2 * SIDECAR_BLOCK_BYTES + 64 * 1024
    assert verify_data_dir(tmp_path).ok


async def test_cancelled_open_releases_the_directory(tmp_path: Path) -> None:
    store = await DiskStore.open(tmp_path)
    await _populate(store)
    await store.close()
    opening = asyncio.create_task(DiskStore.open(tmp_path))
    await asyncio.sleep(0)  # a bare yield: the open is under way, not finished
    opening.cancel()
    with pytest.raises(asyncio.CancelledError):
        await opening
    store = await DiskStore.open(tmp_path)  # the lock was released
    try:
        assert "plain" in await store.list_segments()
    finally:
        await store.close()


async def test_interval_policy_syncs_while_one_task_appends_in_a_loop(tmp_path: Path) -> None:
    """Under ``fsync=interval`` an append never parks; the periodic sync must still run."""
    store = await DiskStore.open(
        tmp_path / "data", fsync=FsyncPolicy.INTERVAL, fsync_interval_s=0.01, container_count=1
    )
    try:
        await store.create_segment("s")
        syncs_before = store.file_ops.wal_syncs
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 0.5  # 50 sync intervals of appending without a pause
        appends = 0
        while loop.time() < deadline:
            await store.append("s", b"x" * 100)
            appends += 1
        assert appends > 0
        assert store.file_ops.wal_syncs > syncs_before
    finally:
        await store.close()


def test_crc32_is_zlibs_crc32() -> None:
    """The store's CRC-32 (zlib-ng) gives zlib's values, so the format is unchanged:
    data dirs written with either open with the other."""
    import zlib

    from headrace.store.disk.format import crc32

    for size in (0, 1, 15, 100, 4096, 10 * 1024 + 3, 1024 * 1024):
        data = os.urandom(size)
        assert crc32(data) == zlib.crc32(data)
        assert crc32(memoryview(data)[1:], 0xDEADBEEF) == zlib.crc32(data[1:], 0xDEADBEEF)


async def _attributes(store: DiskStore, name: str) -> list[tuple[UUID, int]]:
    """A segment's attributes in the store's order (least recently set first)."""
    return list((await store.info(name)).attributes.items())


async def test_attribute_bound_and_order_survive_a_restart_and_a_crash(tmp_path: Path) -> None:
    """The bound is applied in replay and snapshots keep the least-recently-set
    order, so a store reopened after a clean stop (snapshot) or from a crash
    image (WAL replay) holds exactly the attributes the live store held, and
    evicts the same one next."""
    writers = [UUID(int=0x100 + i) for i in range(6)]
    store = await DiskStore.open(tmp_path / "live", container_count=1, max_segment_attributes=4)
    try:
        await store.create_segment("s")
        for number, w in enumerate(writers[:5], start=1):
            await store.append("s", b"x", writer=WriterAppend(w, number))
        await store.append("s", b"y", writer=WriterAppend(writers[1], 9))  # used again: newest
        live = await _attributes(store, "s")
        assert live == [(writers[2], 3), (writers[3], 4), (writers[4], 5), (writers[1], 9)]
        # A crash image: what is on disk now (fsync=always: every append is synced).
        shutil.copytree(tmp_path / "live", tmp_path / "crash")
    finally:
        await store.close()
    for name in ("live", "crash"):
        store = await DiskStore.open(tmp_path / name, max_segment_attributes=4)
        try:
            assert await _attributes(store, "s") == live, name
            await store.append("s", b"z", writer=WriterAppend(writers[5], 1))
            assert await store.get_attribute("s", writers[2]) == NULL_ATTRIBUTE_VALUE, name
            assert await store.get_attribute("s", writers[1]) == 9, name
        finally:
            await store.close()
    # A lower bound trims at the next open, keeping the most recently set.
    store = await DiskStore.open(tmp_path / "live", max_segment_attributes=2)
    try:
        assert await _attributes(store, "s") == [(writers[1], 9), (writers[5], 1)]
    finally:
        await store.close()


@pytest.mark.parametrize("bound", [0, -1])
async def test_an_attribute_bound_below_one_is_refused(tmp_path: Path, bound: int) -> None:
    with pytest.raises(ValueError, match="max_segment_attributes"):
        await DiskStore.open(tmp_path, max_segment_attributes=bound)
    with pytest.raises(ValueError, match="max_segment_attributes"):
        MemoryStore(max_segment_attributes=bound)


# ---------------------------------------------------------------------- yielding


@pytest.mark.parametrize("policy", [FsyncPolicy.NEVER, FsyncPolicy.INTERVAL])
async def test_a_task_appending_in_a_loop_lets_the_loop_turn(
    tmp_path: Path, policy: FsyncPolicy
) -> None:
    """Appends acknowledged at once still yield once they have kept the loop from
    turning for YIELD_INTERVAL_S, so other tasks (the committer's sync and
    checkpoints among them) run while one task appends as fast as it can."""
    from headrace.store.disk.commit import YIELD_INTERVAL_S

    store = await DiskStore.open(tmp_path / "data", fsync=policy)
    try:
        await store.create_segment("busy")
        turns = 0
        stop = False

        async def other() -> None:
            nonlocal turns
            while not stop:
                turns += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(other())
        loop = asyncio.get_running_loop()
        began = loop.time()
        appends = 0
        # At least 50 intervals of appending; on a busy machine, where an append
        # may take a whole interval, on until the other task ran 10 times (bounded).
        while (elapsed := loop.time() - began) < 50 * YIELD_INTERVAL_S or (
            turns < 10 and elapsed < 1000 * YIELD_INTERVAL_S
        ):
            await store.append("busy", b"x" * 100)
            appends += 1
        stop = True
        await task
        # The other task ran about once per YIELD_INTERVAL_S of appending, not never.
        assert turns >= 10, (turns, appends)
    finally:
        await store.close()


async def test_appends_that_arrive_apart_do_not_yield(tmp_path: Path) -> None:
    """An append acknowledged at once, when the loop has turned since the one
    before (appends from separate reads), finishes without suspending: no
    event-loop round of its own in its latency."""
    store = await DiskStore.open(tmp_path / "data", fsync=FsyncPolicy.NEVER)
    try:
        await store.create_segment("apart")
        suspended = 0
        for _ in range(20):
            await asyncio.sleep(0.002)  # apart in time, and the loop turns in between
            coro = store.append("apart", b"y" * 100)
            try:
                coro.send(None)
            except StopIteration:
                continue  # finished in its first step
            suspended += 1
            await _finish_coroutine(coro)
        assert suspended == 0
    finally:
        await store.close()


async def test_appends_started_together_yield_once_per_interval(tmp_path: Path) -> None:
    """Appends started one after the other in one callback (a pipelined read)
    cannot let the loop turn before it ends: past YIELD_INTERVAL_S one of them
    yields per interval, not every one after it (each yield costs a task)."""
    from headrace.store.disk.commit import YIELD_INTERVAL_S

    store = await DiskStore.open(tmp_path / "data", fsync=FsyncPolicy.NEVER)
    try:
        await store.create_segment("together")
        await asyncio.sleep(0)  # the loop turned: a fresh burst
        now = [0.0]

        def clock() -> float:  # each append takes a tenth of an interval
            now[0] += YIELD_INTERVAL_S / 10
            return now[0]

        for c in store._containers:
            c.commit._clock = clock
        suspended = []
        for _ in range(100):
            coro = store.append("together", b"z" * 100)
            try:
                coro.send(None)
            except StopIteration:
                continue
            suspended.append(coro)
        for coro in suspended:
            await _finish_coroutine(coro)
        assert 5 <= len(suspended) <= 15, len(suspended)  # about one per interval
    finally:
        await store.close()


async def _finish_coroutine(coro: Coroutine[Any, Any, Any]) -> None:
    """Drive a coroutine that suspended in its first step to its end."""

    async def rest() -> None:
        while True:
            try:
                yielded = coro.send(None)
            except StopIteration:
                return
            if yielded is None:
                await asyncio.sleep(0)
            else:
                await yielded

    await rest()
