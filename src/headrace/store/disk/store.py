"""DiskStore: the durable implementation of the store contract.

The observable behaviour is ``MemoryStore``'s, call for call (same checks in
the same order, same errors, same results); on top of it every acknowledged
change survives a crash. Segments are spread over containers by their name,
under the mapping the manifest records (``layout.container_of``); each
``Container`` owns a WAL and its group-commit loop, so the store itself is
only routing plus the one operation that spans containers, ``merge``.

Merge across containers: the source is sealed (durably) in its container;
then its bytes are copied into the target's WAL as MERGE_DATA records ending
in a MERGE_COMMIT, which is the atomic point; only after that commit is
durable is the source's DELETE written in its own container. A crash in
between is finished by recovery, which deletes any source a durable commit
names (``recovery.finish_interrupted_merges``). While the two steps run, the
source is *hidden*: it no longer exists for the API, and a retried merge or a
create of the same name waits for the merge to finish.

Where durability shows (only while calls overlap): ``read``, ``info().length``,
``info().sealed`` and long-poll waits see durable state, while offsets,
``expected_offset`` and writer deduplication see everything issued; a
duplicate append, ``info``, ``get_attribute`` and a failed compare-and-set
first wait for what is in flight, so they never report a writer position or
attribute a crash could undo; ``truncate`` never moves the start offset past
what readers can see.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import functools
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from uuid import UUID

from headrace.errors import (
    BadOffset,
    CorruptionError,
    OwnerUnavailable,
    SegmentExists,
    SegmentNotFound,
    SegmentSealed,
    SegmentTruncated,
    SegmentTypeMismatch,
    StorageFull,
    StoreClosed,
    StoreError,
)
from headrace.store._attributes import check_attribute_bound
from headrace.store._base import BaseStore, SegmentState, check_append
from headrace.store._timeindex import TimeIndex
from headrace.store.api import (
    MAX_READ_BYTES,
    MAX_SEGMENT_ATTRIBUTES,
    FsyncPolicy,
)
from headrace.store.disk.checkpoint import CHECKPOINT_WAL_BYTES
from headrace.store.disk.checks import BlockChecks, check_blocks
from headrace.store.disk.container import Container
from headrace.store.disk.epochs import read_epochs, write_epochs
from headrace.store.disk.format import (
    MERGE_CHUNK_BYTES,
    AppendRecord,
    AppendRefRecord,
    AttributeRecord,
    CreateRecord,
    DeleteRecord,
    FrameProblem,
    Manifest,
    MergeCommitRecord,
    MergeDataRecord,
    Record,
    SealRecord,
    TruncateRecord,
    scan_frames,
)
from headrace.store.disk.layout import ContainerPaths, SegmentMapping, container_of, lock_path
from headrace.store.disk.log import FILE_MODE, FileOps, WalWriter, make_dir
from headrace.store.disk.moves import commit_install, new_staging_dir, write_empty_container
from headrace.store.disk.recovery import recover_container, recover_store
from headrace.store.disk.replicated import CommitGate
from headrace.store.disk.segment import ContainerState, Segment
from headrace.store.disk.wal_tail import cut_log, read_wal_records
from headrace.store.memory import check_name
from headrace.types import (
    NULL_ATTRIBUTE_VALUE,
    AppendResult,
    FileRegion,
    ReadResult,
    RegionRead,
    SegmentInfo,
    SegmentKind,
    WriterAppend,
)

__all__ = ["CONTAINER_CACHE_NAMES", "DiskStore"]

log = logging.getLogger(__name__)

CONTAINER_CACHE_NAMES = 65_536
"""Names whose container is remembered (a CRC-32 of the name per lookup cost 4%
of a small append); the cache is emptied when full, so names a client merely
asks about cannot grow it without bound."""


def _lock_data_dir(root: Path) -> int:
    """Create ``root`` if needed (``DIR_MODE``) and take its lock; return the lock's fd."""
    root.parent.mkdir(parents=True, exist_ok=True)
    make_dir(root)
    lock_fd = os.open(lock_path(root), os.O_RDWR | os.O_CREAT, FILE_MODE)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(lock_fd)
        raise StoreError(
            f"data dir {root} is in use by another store (a running headrace serve, "
            "verify or repair holds its lock): stop it, or use another data dir"
        ) from None
    return lock_fd


def _forget_task(
    tasks: set[asyncio.Future[None]],
) -> Callable[[asyncio.Future[None]], None]:
    def done(task: asyncio.Future[None]) -> None:
        tasks.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved here; the caller, if still there, gets it too

    return done


def _open_data_dir(
    root: Path, container_count: int, ops: FileOps, max_attributes: int, mapping: SegmentMapping
) -> tuple[int, Manifest, list[tuple[ContainerState, WalWriter]]]:
    """Lock the data dir and recover it (blocking); the lock is held on success.

    Raises:
        StorageFull, StoreError: an OS error, said in one line (``_open_error``).
    """
    try:
        lock_fd = _lock_data_dir(root)
    except OSError as exc:
        raise _open_error(root, exc) from exc
    try:
        manifest, opened = recover_store(
            root, container_count, ops, max_attributes=max_attributes, mapping=mapping
        )
    except OSError as exc:
        os.close(lock_fd)
        raise _open_error(root, exc) from exc
    except BaseException:
        os.close(lock_fd)
        raise
    return lock_fd, manifest, opened


def _open_error(root: Path, exc: OSError) -> StoreError:
    """The store error for an OS error while opening the data dir at ``root``."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return StorageFull(f"cannot open the data dir {root}: no space left on the device ({exc})")
    return StoreError(f"cannot open the data dir {root}: {exc}")


def _check_on_first_read(c: Container) -> None:
    """Bytes written by an earlier process (or another node) are checked on first read."""
    for seg in c.state.by_id.values():
        if seg.length:
            seg.unchecked_end = seg.length
            seg.checks = BlockChecks(seg.length, seg.sidecar_size)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


MAX_OPEN_REGIONS = 256
"""File regions (each holding a descriptor) a store hands out before it answers
``read_region`` with bytes instead: regions live until their bytes are sent, so
clients pipelining many large reads could otherwise use up the process's
descriptors (the usual limit is 1024) and starve accept and the WAL."""


class DiskStore(BaseStore):
    """The store contract on local disk, with group-committed durability.

    Open it with ``await DiskStore.open(path)``; close it with ``await store.close()``.
    """

    def __init__(
        self,
        root: Path,
        containers: list[Container],
        lock_fd: int,
        ops: FileOps,
        mapping: SegmentMapping = SegmentMapping.HASH,
    ) -> None:
        super().__init__()
        self.root = root
        self.mapping = mapping
        """How segment names give containers here (the manifest's)."""
        self._containers = containers
        self._container_of: dict[str, Container] = {}
        self._lock_fd = lock_fd
        self.file_ops = ops
        self._closed = False
        self._merging: dict[str, asyncio.Future[None]] = {}
        """Sources of merges between their commit and their deletion."""
        self._background: set[asyncio.Future[None]] = set()
        """Merge completions that outlive a cancelled caller; close waits for them."""
        self.max_open_regions = MAX_OPEN_REGIONS
        self._open_regions = 0
        self._detached: set[int] = set()
        """Containers this store does not serve (``detach``): moved to another node."""
        self._moving: dict[int, asyncio.Lock] = {}
        self._closing: dict[int, asyncio.Future[None]] = {}
        """Closes of detached containers that have not ended yet."""
        """One lock per container, held while it is detached, installed or attached."""
        self._new_container: Callable[[ContainerPaths, ContainerState, WalWriter], Container]
        """Builds a Container as ``open`` did (its policy, syscalls, failure hook)."""
        self._max_attributes = MAX_SEGMENT_ATTRIBUTES
        self._following: set[int] = set()
        """Containers this node holds as a follower of another node's copy
        (``follow``): written by replication only, served to nobody."""

    @classmethod
    async def open(
        cls,
        path: str | os.PathLike[str],
        *,
        fsync: FsyncPolicy = FsyncPolicy.ALWAYS,
        fsync_interval_s: float = 1.0,
        container_count: int = 4,
        checkpoint_wal_bytes: int = CHECKPOINT_WAL_BYTES,
        file_ops: FileOps | None = None,
        max_segment_attributes: int = MAX_SEGMENT_ATTRIBUTES,
        ref_append_bytes: int | None = None,
        segment_mapping: SegmentMapping = SegmentMapping.GROUPED,
    ) -> DiskStore:
        """Open the data dir at ``path``, creating it if needed, and recover it.

        Args:
            path: the data directory.
            fsync: the durability policy (``FsyncPolicy``).
            fsync_interval_s: sync period under ``FsyncPolicy.INTERVAL``.
            container_count: containers of a *new* data dir; an existing one
                keeps the count in its manifest.
            checkpoint_wal_bytes: WAL size that triggers a checkpoint.
            file_ops: the syscall layer (tests inject faults or count syncs).
            max_segment_attributes: attributes a segment keeps, least recently
                set dropped first (``MAX_SEGMENT_ATTRIBUTES``); applied in
                recovery too, so lowering it trims at the next open.
            ref_append_bytes: appends of at least this size are written once,
                to the data file, and logged by reference (default by policy:
                ``REF_APPEND_BYTES`` under ``always``, ``REF_APPEND_BYTES_UNSYNCED``
                otherwise; tests lower it to exercise references with small
                payloads).
            segment_mapping: how a *new* data dir places segments in
                containers; an existing one keeps the mapping its manifest
                records (``HASH`` when it records none).

        Raises:
            CorruptionError: damage recovery must not guess about (see recovery.py).
            StoreError: another store has the directory open.
        """
        if fsync_interval_s <= 0:
            raise ValueError("fsync_interval_s must be positive")
        max_attributes = check_attribute_bound(max_segment_attributes)
        root = Path(path)
        ops = file_ops or FileOps()
        opening = asyncio.ensure_future(
            asyncio.to_thread(
                _open_data_dir, root, container_count, ops, max_attributes, segment_mapping
            )
        )
        try:
            lock_fd, manifest, opened = await asyncio.shield(opening)
        except BaseException:
            # A cancelled open cannot stop the worker thread: wait for it, then
            # release what it took (the lock, the WAL files).
            with contextlib.suppress(BaseException):
                await asyncio.wait([opening])
            if opening.done() and not opening.cancelled() and opening.exception() is None:
                lock_fd, _, opened = opening.result()
                for _, wal in opened:
                    wal.close()
                os.close(lock_fd)
            raise
        store: DiskStore
        containers: list[Container] = []

        def on_failure(exc: BaseException) -> None:
            for c in containers:
                c.fail(exc)

        def new_container(
            paths: ContainerPaths, state: ContainerState, wal: WalWriter
        ) -> Container:
            return Container(
                paths,
                state,
                wal,
                policy=fsync,
                fsync_interval_s=fsync_interval_s,
                checkpoint_wal_bytes=checkpoint_wal_bytes,
                ops=ops,
                on_failure=on_failure,
                ref_append_bytes=ref_append_bytes,
            )

        for cid, (state, wal) in enumerate(opened):
            containers.append(new_container(ContainerPaths(root, cid), state, wal))
        store = cls(root, containers, lock_fd, ops, manifest.mapping)
        store._new_container = new_container
        store._max_attributes = max_attributes
        for c in containers:
            _check_on_first_read(c)
            c.start()
        assert len(containers) == manifest.container_count
        return store

    @property
    def container_count(self) -> int:
        return len(self._containers)

    def limit_open_files(self, data_files_per_container: int, regions: int) -> None:
        """Keep at most this many data files open per container, and hand out at
        most ``regions`` file regions: the server's share of the open-file limit."""
        for c in self._containers:
            c.files.max_open = data_files_per_container
        self.max_open_regions = regions

    # ------------------------------------------------------------------ lookup

    def _attached(self) -> list[Container]:
        return [c for c in self._containers if c.container_id not in self._detached]

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosed("the store is closed")

    def _container(self, name: str) -> Container:
        c = self._container_of.get(name)
        if c is None:
            if len(self._container_of) >= CONTAINER_CACHE_NAMES:
                self._container_of.clear()
            c = self._containers[container_of(name, len(self._containers), self.mapping)]
            if c.container_id in self._detached:
                raise OwnerUnavailable(name, f"container {c.container_id} is not on this node")
            if c.container_id in self._following:
                raise OwnerUnavailable(name, f"container {c.container_id} is led by another node")
            self._container_of[name] = c
        return c

    def _lookup(self, name: str) -> tuple[Container, Segment]:
        self._check_open()
        c = self._container(name)
        seg = c.state.by_name.get(name)
        if seg is None or seg.hidden:
            raise SegmentNotFound(name)
        return c, seg

    def _state(self, name: str) -> SegmentState:
        _, s = self._lookup(name)
        return SegmentState(s.kind, s.start_offset, s.durable_length, s.sealed_durable)

    def _time_index(self, name: str) -> TimeIndex:
        return self._lookup(name)[1].times

    def _advance(self, seg: Segment, end: int) -> None:
        if end > seg.durable_length:
            seg.durable_length = end
            self._notify(seg.name)

    def _sealed_durable(self, seg: Segment) -> None:
        seg.sealed_durable = True
        self._notify(seg.name)

    async def _wait_merge(self, name: str) -> bool:
        """Wait out a merge that is removing ``name``; True if there was one."""
        future = self._merging.get(name)
        if future is None:
            return False
        await asyncio.shield(future)
        return True

    # ------------------------------------------------------------------ segments

    async def _create(self, name: str, kind: SegmentKind) -> None:
        self._check_open()
        check_name(name)
        while await self._wait_merge(name):
            pass
        c = self._container(name)
        if name in c.state.by_name:
            raise SegmentExists(name)
        seq = c.write(CreateRecord(c.state.next_segment_id, kind, now_ms(), name))
        await c.durable(seq)

    async def _append(
        self,
        name: str,
        data: bytes | memoryview,
        expected_offset: int | None,
        writer: WriterAppend | None,
        kind: SegmentKind,
    ) -> AppendResult:
        c, s = self._lookup(name)
        previous, duplicate = check_append(name, s, len(data), expected_offset, writer, kind)
        if duplicate:
            length = s.length
            await c.barrier()  # the original may still be in flight
            return AppendResult(length, length, previous, duplicate=True)
        offset = s.length
        end = offset + len(data)
        seq = c.write(AppendRecord(s.segment_id, offset, now_ms(), writer, data))
        await c.durable(seq, lambda: self._advance(s, end))
        return AppendResult(offset, end, previous)

    def _readable(self, name: str, offset: int, max_bytes: int) -> tuple[Container, Segment, int]:
        """The container, segment and byte count of a read (only durable bytes)."""
        c, s = self._lookup(name)
        if offset < s.start_offset:
            raise SegmentTruncated(name, s.start_offset)
        length = s.durable_length
        if offset > length:
            raise BadOffset(name, offset, length)
        return c, s, max(0, min(max_bytes, MAX_READ_BYTES, length - offset))

    async def _check(self, name: str, offset: int, max_bytes: int) -> bytes | None:
        """Check the blocks a read of ``offset``/``max_bytes`` touches that were
        on disk when the store opened and are not checked yet (``checks.py``);
        return the bytes of the read if the check read them (None if nothing
        needed checking).

        Raises:
            CorruptionError: one of them fails its checksum (every read of it will).
            SegmentNotFound, SegmentTruncated, BadOffset: as the read would.
        """
        data = None
        while True:
            c, s, count = self._readable(name, offset, max_bytes)
            checks = s.checks
            if checks is None or not count or not checks.pending(offset, offset + count):
                return data
            bad = checks.bad(offset, offset + count)
            if bad is not None:
                start, end = checks.block(bad)
                raise CorruptionError(
                    str(c.paths.data(s.segment_id)),
                    start,
                    f"data block [{start}, {end}) of segment {name!r} fails its checksum",
                )
            result = await asyncio.to_thread(
                check_blocks, c.paths, s.segment_id, checks, offset, offset + count
            )
            if s.checks is not checks:
                continue  # checked meanwhile by another read
            if result.missing:
                self._lookup(name)  # deleted meanwhile: SegmentNotFound
                path = c.paths.data(s.segment_id)
                raise CorruptionError(str(path), 0, f"segment {name!r}: data file is missing")
            checks.apply(result)
            data = result.data
            for index, good in result.checked:
                if good:
                    continue
                start, end = checks.block(index)
                if end <= s.start_offset:  # truncated meanwhile: maybe freed, not damaged
                    checks.forget(index)
                    continue
                log.error(
                    "segment %r: data block [%d, %d) of %s fails its checksum; reads of it"
                    " are refused (headrace verify lists all damage)",
                    name,
                    start,
                    end,
                    c.paths.data(s.segment_id),
                )
            if not checks.unchecked:
                s.checks = None
                s.unchecked_end = 0

    def _checked_read(self, name: str, offset: int, max_bytes: int, data: bytes) -> ReadResult:
        """The read whose bytes ``data`` a check just read (durable bytes never change)."""
        _, s, count = self._readable(name, offset, max_bytes)
        data = data[:count]
        end = offset + len(data)
        length = s.durable_length
        return ReadResult(offset, data, end == length, s.sealed_durable and end == length)

    async def read(self, name: str, offset: int, max_bytes: int) -> ReadResult:
        c, s, count = self._readable(name, offset, max_bytes)
        if count and offset < s.unchecked_end:
            checked = await self._check(name, offset, max_bytes)
            if checked is not None:
                return self._checked_read(name, offset, max_bytes, checked)
            c, s, count = self._readable(name, offset, max_bytes)
        length = s.durable_length
        data = c.files.pread(s.segment_id, offset, count) if count else b""
        end = offset + count
        return ReadResult(offset, data, end == length, s.sealed_durable and end == length)

    async def read_region(
        self, name: str, offset: int, max_bytes: int, *, min_region_bytes: int = 0
    ) -> ReadResult | RegionRead:
        """Segment offset N is data-file position N (storage-format.md#data-file), and
        every durable byte is in the data file before it becomes durable (the
        committer writes the data before its sync), so a durable range is always
        one region of one file. The region gets a descriptor of its own (a
        delete or the descriptor cache closing theirs does not affect it) and
        pins the segment's truncated blocks until it is closed."""
        c, s, count = self._readable(name, offset, max_bytes)
        if not count or count < min_region_bytes or self._open_regions >= self.max_open_regions:
            return await self.read(name, offset, max_bytes)
        if offset < s.unchecked_end:
            checked = await self._check(name, offset, max_bytes)
            if checked is not None:  # read while checking: no second read for sendfile
                return self._checked_read(name, offset, max_bytes, checked)
            c, s, count = self._readable(name, offset, max_bytes)
        length = s.durable_length
        end = offset + count
        try:
            fd = c.files.open_reader(s.segment_id)
        except OSError as exc:
            raise StoreError(f"cannot open the data file of {name!r}: {exc}") from exc
        s.open_regions += 1
        self._open_regions += 1
        region = FileRegion(fd, offset, count, functools.partial(self._release_region, s))
        return RegionRead(offset, region, end == length, s.sealed_durable and end == length)

    def _release_region(self, segment: Segment) -> None:
        segment.open_regions -= 1
        self._open_regions -= 1

    async def info(self, name: str) -> SegmentInfo:
        """After a failure (a full disk) the answer is still the durable length,
        start offset and seal, which readers need; the attributes only if no
        record was issued after the last sync (a failed record's writer
        position must not be shown as stored: ``Container.barrier``)."""
        c, _ = self._lookup(name)
        if c.failure is None:
            await c.barrier()  # attributes (writer positions) must be durable before shown
        _, s = self._lookup(name)
        return SegmentInfo(
            name,
            s.kind,
            s.start_offset,
            s.durable_length,
            s.sealed_durable,
            s.modified_ms,
            dict(s.attributes) if c.failure is None or c.all_synced() else {},
        )

    async def seal(self, name: str) -> int:
        c, s = self._lookup(name)
        if not s.sealed:
            seq = c.write(SealRecord(s.segment_id, now_ms()))
            await c.durable(seq, lambda: self._sealed_durable(s))
        else:
            await c.barrier()
        return s.length

    async def _truncate(self, name: str, offset: int) -> None:
        while True:
            c, s = self._lookup(name)
            if not s.start_offset <= offset <= s.length:
                raise BadOffset(name, offset, s.length)
            if offset <= s.start_offset:
                return
            if offset <= s.durable_length:
                break
            # Never let the start offset pass what readers can see.
            await c.barrier()
        seq = c.write(TruncateRecord(s.segment_id, offset, now_ms()))
        await c.durable(seq)

    async def _delete(self, name: str) -> None:
        c, s = self._lookup(name)
        seq = c.write(DeleteRecord(s.segment_id))
        c.files.forget(s.segment_id)
        await c.durable(seq)

    async def merge(self, target: str, source: str) -> int:
        self._check_merge(target, source)
        while True:
            self._check_open()
            await self._wait_merge(source)
            cs = self._container(source)
            existing = cs.state.by_name.get(source)
            if existing is None and cs.state.merged.get(source) == target:
                _, t = self._lookup(target)
                return t.length
            ct, t = self._lookup(target)
            cs, s = self._lookup(source)
            if source == target:
                raise StoreError(f"cannot merge segment {source!r} into itself")
            for name, seg in ((target, t), (source, s)):
                if seg.kind is not SegmentKind.STREAM:
                    raise SegmentTypeMismatch(name, SegmentKind.STREAM.value)
            if t.sealed:
                raise SegmentSealed(target, t.length)
            # Java seals the source first; its appends are then all durable.
            if not s.sealed:
                seq = cs.write(SealRecord(s.segment_id, now_ms()))
                await cs.durable(seq, functools.partial(self._sealed_durable, s))
                continue
            if not s.sealed_durable or s.durable_length != s.length:
                await cs.barrier()
                continue
            if s.checks is not None and s.checks.pending(s.start_offset, s.length):
                # Its bytes from before the open are copied into the target's
                # log with new checksums: check them first, as a read would.
                for position in range(s.start_offset, s.length, MAX_READ_BYTES):
                    await self._check(source, position, MAX_READ_BYTES)
                continue
            return await self._merge_sealed(ct, t, cs, s, target, source)

    async def _merge_sealed(
        self, ct: Container, t: Segment, cs: Container, s: Segment, target: str, source: str
    ) -> int:
        # Synchronous from here to the commit record: nobody sees a half-written merge.
        ct.check_writable()
        cs.check_writable()
        offset = t.length
        position = s.start_offset
        while position < s.length:
            count = min(MERGE_CHUNK_BYTES, s.length - position)
            chunk = cs.files.pread(s.segment_id, position, count)
            ct.write(MergeDataRecord(t.segment_id, offset + position - s.start_offset, chunk))
            position += len(chunk)
        new_length = offset + s.length - s.start_offset
        seq = ct.write(MergeCommitRecord(t.segment_id, new_length, now_ms(), s.segment_id, source))
        s.hidden = True
        self._tables.pop(source, None)
        done = self._merging[source] = asyncio.get_running_loop().create_future()
        # The rest must run to the end even if the caller gives up waiting.
        task = asyncio.ensure_future(
            self._finish_merge(ct, t, cs, s, seq, new_length, target, done)
        )
        self._background.add(task)
        task.add_done_callback(_forget_task(self._background))
        await asyncio.shield(task)
        return new_length

    async def _finish_merge(
        self,
        ct: Container,
        t: Segment,
        cs: Container,
        s: Segment,
        seq: int,
        new_length: int,
        target: str,
        done: asyncio.Future[None],
    ) -> None:
        try:
            await ct.durable(seq, lambda: self._advance(t, new_length))
            # The commit is durable: now the source goes.
            try:
                seq = cs.write(DeleteRecord(s.segment_id, target))
                cs.files.forget(s.segment_id)
                await cs.durable(seq)
            except StoreClosed:
                pass  # recovery deletes the source; the merge itself is durable
            self._notify(target)
            self._notify(s.name)
        finally:
            del self._merging[s.name]
            done.set_result(None)

    async def get_attribute(self, name: str, attribute_id: UUID) -> int:
        c, _ = self._lookup(name)
        await c.barrier()
        _, s = self._lookup(name)
        return s.attributes.get(attribute_id, NULL_ATTRIBUTE_VALUE)

    async def update_attribute(
        self, name: str, attribute_id: UUID, new_value: int, expected_value: int
    ) -> bool:
        c, s = self._lookup(name)
        if s.attributes.get(attribute_id, NULL_ATTRIBUTE_VALUE) != expected_value:
            await c.barrier()
            return False
        seq = c.write(AttributeRecord(s.segment_id, attribute_id, new_value, now_ms()))
        await c.durable(seq)
        return True

    async def list_segments(self) -> list[str]:
        self._check_open()
        return sorted(
            name
            for c in self._attached()
            for name, seg in c.state.by_name.items()
            if not seg.hidden
        )

    # ------------------------------------------------------------------ moving containers

    def is_attached(self, container_id: int) -> bool:
        """Whether this store serves container ``container_id`` (``detach``)."""
        return container_id not in self._detached

    def container_paths(self, container_id: int) -> ContainerPaths:
        return self._containers[container_id].paths

    def _move_lock(self, container_id: int) -> asyncio.Lock:
        if not 0 <= container_id < len(self._containers):
            raise ValueError(f"no container {container_id} (the store has {len(self._containers)})")
        return self._moving.setdefault(container_id, asyncio.Lock())

    async def detach(self, container_id: int) -> None:
        """Stop serving a container and close it, so its files are a consistent copy.

        From the call on, every call naming one of its segments raises
        ``OwnerUnavailable``; what was issued before finishes (acknowledged
        changes are durable), a checkpoint is written and its files are
        closed. Parked long-polls on its segments wake (and raise). Detaching
        a detached container does nothing.

        Raises:
            StoreClosed: the closing checkpoint failed; the container stays
                detached and its files hold its last durable state (the WAL
                replays on the next open).
        """
        self._check_open()
        async with self._move_lock(container_id):
            await self._detach(container_id)

    async def _detach(self, container_id: int) -> None:
        if container_id in self._detached:
            await self._closed_container(container_id)
            return
        c = self._containers[container_id]
        self._detached.add(container_id)
        self._container_of.clear()
        for name in list(c.state.by_name):
            self._tables.pop(name, None)
            self._notify(name)
        # A cancelled caller must not leave it half closed: the close runs to
        # its end, and whoever touches the container next waits for it.
        self._closing[container_id] = asyncio.ensure_future(self._close_detached(c))
        await self._closed_container(container_id)
        log.info("container %d detached", container_id)

    async def _close_detached(self, c: Container) -> None:
        # merges finishing (their source's deletion) may still write to it
        await asyncio.gather(*self._background, return_exceptions=True)
        await c.close()

    async def _closed_container(self, container_id: int) -> None:
        """Wait for the close of a detached container to end (raising its error once)."""
        closing = self._closing.get(container_id)
        if closing is None:
            return
        try:
            await asyncio.shield(closing)
        finally:
            if closing.done():
                self._closing.pop(container_id, None)

    async def discard(self, container_id: int, when: Callable[[], bool]) -> bool:
        """Detach a container and replace its files with an empty container's, if
        ``when()`` says so once no other move of it is in course.

        For a copy that moved to another node for good: it frees the disk, and
        a restart cannot serve it. Like an install, a crash leaves the old
        files or the empty ones. The container stays detached; True if it was
        discarded.
        """
        self._check_open()
        async with self._move_lock(container_id):
            if not when():
                return False
            await self._detach(container_id)
            root, ops = self.root, self.file_ops

            def empty() -> None:
                staged = new_staging_dir(root, container_id)
                write_empty_container(staged, container_id, ops)
                commit_install(root, container_id, staged, ops)

            try:
                await asyncio.to_thread(empty)
            except OSError as exc:
                raise StoreError(f"cannot empty container {container_id}: {exc}") from exc
            log.info("container %d discarded (moved to another node)", container_id)
            return True

    async def attach(self, container_id: int, *, install: Path | None = None) -> None:
        """Serve a detached container again, from its files (recovered as at open).

        ``install``: a directory holding another copy of the container (from
        ``moves.new_staging_dir``, every file written); it replaces the
        container's files first (``moves.commit_install``: a crash leaves the
        old copy or the new one, never a mix) and is gone afterwards.
        Attaching an attached container without ``install`` does nothing.

        Raises:
            CorruptionError: the copy is damaged; the container stays detached.
            StoreError: an OS error; the container stays detached.
        """
        self._check_open()
        async with self._move_lock(container_id):
            if container_id not in self._detached:
                if install is None:
                    return
                raise StoreError(f"container {container_id} is attached: detach it first")
            with contextlib.suppress(StoreError):
                await self._closed_container(container_id)  # its failure was reported
            old = self._containers[container_id]
            paths = old.paths
            root, ops = self.root, self.file_ops

            def open_container() -> tuple[ContainerState, WalWriter]:
                if install is not None:
                    commit_install(root, container_id, install, ops)
                return recover_container(paths, ops, max_attributes=self._max_attributes)

            try:
                state, wal = await asyncio.to_thread(open_container)
            except OSError as exc:
                raise StoreError(f"cannot open container {container_id}: {exc}") from exc
            c = self._new_container(paths, state, wal)
            c.files.max_open = old.files.max_open
            _check_on_first_read(c)
            self._containers[container_id] = c
            c.start()
            self._detached.discard(container_id)
            self._container_of.clear()
            log.info(
                "container %d attached%s", container_id, "" if install is None else " (installed)"
            )

    # ------------------------------------------------------------------ replication

    def replica_end(self, container_id: int) -> int:
        """The number of the last record in the container's log (0: none)."""
        return self._containers[container_id].state.last_seq

    async def lead(self, container_id: int, gate: CommitGate | None) -> None:
        """Serve the container as the leader of its copies: with ``gate``, every
        acknowledgement waits for commit (``replicated.py``); None: as today.

        A followed container is synced first and then shows every record it
        holds (a follower's records have no caller to make them visible).
        """
        self._check_open()
        c = self._containers[container_id]
        if container_id in self._following:
            await c.commit.sync_now()
            for seg in c.state.by_id.values():
                seg.durable_length = seg.length
                seg.sealed_durable = seg.sealed
            self._following.discard(container_id)
            self._container_of.clear()
        c.set_gate(gate)

    def follow(self, container_id: int) -> None:
        """Hold the container as a follower: every call naming one of its segments
        raises ``OwnerUnavailable``; only ``replicate`` writes to it."""
        self._check_open()
        c = self._containers[container_id]
        if c.gate is not None:
            c.gate.fail(OwnerUnavailable(f"container {container_id}", "no longer led here"))
            c.set_gate(None)
        self._following.add(container_id)
        self._container_of.clear()
        for name in list(c.state.by_name):
            self._tables.pop(name, None)
            self._notify(name)

    def is_following(self, container_id: int) -> bool:
        return container_id in self._following

    def replicate(self, container_id: int, first_seq: int, frames: bytes | memoryview) -> int:
        """Write records a leader shipped (WAL frames numbered from ``first_seq``) into a
        followed container, in order; return the last one's number. Never awaits:
        ``replica_durable`` waits for them.

        Raises:
            ValueError: a frame is damaged, or a number does not follow the log
                (nothing after it is written).
            StoreClosed, StorageFull: the store failed.
        """
        self._check_open()
        if container_id not in self._following:
            raise ValueError(f"container {container_id} is not followed here")
        c = self._containers[container_id]
        if first_seq != c.state.last_seq + 1:
            raise ValueError(f"records from {first_seq} do not follow {c.state.last_seq}")
        buf = bytes(frames)
        for item in scan_frames(buf, 0, f"replicated records of container {container_id}"):
            if isinstance(item, FrameProblem):
                raise ValueError(f"replicated record at {item.position}: {item.reason}")
            _, seq, record = item
            if seq != c.state.last_seq + 1 or isinstance(record, AppendRefRecord):
                raise ValueError(f"replicated record {seq} does not follow {c.state.last_seq}")
            issued = c.write(record)
            assert issued == seq
        return c.state.last_seq

    async def replica_epochs(self, container_id: int) -> tuple[tuple[int, int], ...]:
        """The container's epoch history, as saved (``epochs.py``)."""
        return await asyncio.to_thread(read_epochs, self._containers[container_id].paths)

    async def save_replica_epochs(
        self, container_id: int, entries: tuple[tuple[int, int], ...]
    ) -> None:
        """Replace the container's epoch history, durably, before records of a new epoch."""
        self._check_open()
        paths = self._containers[container_id].paths
        try:
            await asyncio.to_thread(write_epochs, paths, entries, self.file_ops)
        except OSError as exc:
            raise StoreError(f"cannot save container {container_id}'s epochs: {exc}") from exc

    async def rewind(self, container_id: int, keep: int) -> bool:
        """Cut a followed container's log after record ``keep``; False if it cannot.

        The records past ``keep`` are a deposed leader's, never committed
        (``docs/replication.md#truncation``). The container is closed without
        a checkpoint, the WAL bytes of those records are copied aside and cut
        off (``recovery.backup_and_cut``, as a torn tail), and it is opened
        again with recovery. A checkpoint written after ``keep`` holds them in
        its snapshot: then nothing is cut and the answer is False (the copy
        must be replaced whole).
        """
        self._check_open()
        if container_id not in self._following:
            raise ValueError(f"container {container_id} is not followed here")
        async with self._move_lock(container_id):
            c = self._containers[container_id]
            if c.state.last_seq <= keep:
                return True
            running = c.checkpoints.running
            if running is not None:
                await asyncio.shield(running)
            await c.commit.stop()
            c.commit.close()
            c.files.close()
            paths, ops = c.paths, self.file_ops

            def cut_and_open() -> tuple[bool, ContainerState, WalWriter]:
                cut = cut_log(paths, keep, ops)
                state, wal = recover_container(paths, ops, max_attributes=self._max_attributes)
                return cut, state, wal

            try:
                cut, state, wal = await asyncio.to_thread(cut_and_open)
            except OSError as exc:
                raise StoreError(f"cannot cut container {container_id}'s log: {exc}") from exc
            fresh = self._new_container(paths, state, wal)
            fresh.files.max_open = c.files.max_open
            self._containers[container_id] = fresh
            fresh.start()
            self._container_of.clear()
            if cut:
                log.warning(
                    "container %d: records after %d cut (never committed; copied aside)",
                    container_id,
                    keep,
                )
            return cut

    async def read_log(
        self, container_id: int, after: int, max_bytes: int
    ) -> list[tuple[int, Record]]:
        """The container's records after ``after`` still in its WAL files, each with
        its data (an APPEND_REF read back from its data file), at most about
        ``max_bytes`` of the newest: a new leader's catch-up for followers
        slightly behind. The records form one run ending at the log's end
        (empty if the WAL no longer holds the one after ``after``).
        """
        c = self._containers[container_id]
        await c.commit.sync_now()
        end = c.state.last_seq
        return await asyncio.to_thread(read_wal_records, c.paths, after, end, max_bytes)

    async def replica_durable(self, container_id: int, seq: int) -> None:
        """Wait until a followed container's records up to ``seq`` are durable here."""
        await self._containers[container_id].durable(seq)

    # ------------------------------------------------------------------ lifecycle

    @property
    def failure(self) -> str | None:
        """The I/O error that stopped the store's writes (every container stops
        at the first one, ``Container.fail``), or None."""
        for c in self._attached():
            if c.failure is not None:
                return f"the store stopped after an I/O error: {c.failure}"
        return None

    async def flush(self) -> None:
        self._check_open()
        await asyncio.gather(*(c.flush() for c in self._attached()))

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._wake_all()  # parked long-polls raise StoreClosed now
        await asyncio.gather(*self._background, return_exceptions=True)
        errors: list[BaseException] = []
        for lock in self._moving.values():
            await lock.acquire()  # a detach, install or attach in course ends first
        await asyncio.gather(*self._closing.values(), return_exceptions=True)
        for c in self._attached():
            try:
                await c.close()
            except Exception as exc:
                errors.append(exc)
        os.close(self._lock_fd)
        if errors:
            raise errors[0]
