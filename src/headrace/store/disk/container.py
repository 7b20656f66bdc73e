"""A segment container: one WAL, one group-commit loop, the segments that hash to it.

Theory of operation. A mutation is issued synchronously (``Container.write``):
the record gets the next sequence number, is applied to the in-memory state,
and is queued with the data it carries. Nothing awaits in between, so records
of one container reach the WAL in exactly the order their effects were
applied, and an append's offset is fixed when it is issued. The caller then
awaits ``durable(seq)``:

* ``fsync=always``: the caller parks until the committer has synced the WAL
  past ``seq``. Each round the committer takes every queued record, and the
  container's sync thread (one long-lived thread, not an executor submission
  per round) writes their data with one ``pwritev`` per contiguous run and
  them with one ``writev``, then syncs the WAL and, beside it, the data files
  that received an APPEND_REF's bytes (``fdatasync``): the copies into the page
  cache run beside the event loop (they release the GIL), not on it. The
  thread runs its jobs in order, so the WAL's order is the order records were
  taken; the data-file fds it writes through are pinned until it is done, so
  the loop closing an fd (the LRU of open files, a delete) waits for it;
  and after a failed write no later job may report success. Records queued during a sync are covered
  by the next round, so one sync serves every segment of the container
  (group commit). Every caller parked for a round awaits the same future,
  resolved once per round. Durable effects (a longer ``durable_length``, a
  seal readers may see) are applied by the committer in sequence order,
  before the callers are woken, so they happen even if a caller was cancelled.
* ``interval``: written before ``write`` returns and acknowledged at once;
  the committer syncs every ``fsync_interval_s`` (with the APPEND_REF bytes).
* ``never``: written before ``write`` returns and acknowledged at once; only
  checkpoints sync.

Large appends (``REF_APPEND_BYTES`` and up) are written once: their bytes go
to the data file only and the WAL gets an APPEND_REF (position, size, CRC).
Every WAL sync, whatever asked for it (a round, an interval, a flush, a
checkpoint's switch), also syncs the data files holding such bytes (in a
helper thread, beside the WAL's sync) and returns when both are durable, so a
sync never vouches for a reference to bytes that are not synced
(``_sync_wal``).

The committer also starts checkpoints (``_checkpoint``) when the WAL passes
``checkpoint_wal_bytes`` and at close: capture the state synchronously,
switch to a new WAL file, sync the old one; then, in a background task while
group commits go on, write sidecars, sync data files and replace the snapshot
(``recovery.write_checkpoint``).

A failed WAL write or sync fails the whole store: every parked caller gets
``StoreClosed`` (``StorageFull`` if the disk was full) and no more writes are
accepted (an fsync error may have lost written pages, so no later sync could
vouch for them); reads of durable bytes go on.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import functools
import heapq
import itertools
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path

from headrace.errors import CorruptionError, StorageFull, StoreClosed, StoreError
from headrace.store.api import FsyncPolicy
from headrace.store.disk.format import AppendRecord, CreateRecord, Record, encode_record
from headrace.store.disk.layout import ContainerPaths
from headrace.store.disk.log import FileOps, WalWriter, fsync_dir
from headrace.store.disk.recovery import create_segment_files, write_checkpoint
from headrace.store.disk.segment import Captured, ContainerState, Write

__all__ = [
    "CHECKPOINT_WAL_BYTES",
    "MAX_OPEN_DATA_FILES",
    "REF_APPEND_BYTES",
    "REF_APPEND_BYTES_UNSYNCED",
    "YIELD_INTERVAL_S",
    "Container",
]

log = logging.getLogger(__name__)

CHECKPOINT_WAL_BYTES = 64 * 1024 * 1024
"""WAL size that triggers a checkpoint: bounds replay after a crash to about a
second of disk bandwidth, while checkpoints (a few fsyncs each) stay rare."""

REF_APPEND_BYTES = 256 * 1024
"""Appends of at least this many bytes are written once, to the data file, and
logged as an APPEND_REF (position, size, CRC) instead of an APPEND carrying
them. Below it the second page-cache copy costs less than what a reference
adds under ``always``: a data-file ``fdatasync`` beside the WAL's in each round
that has one. Writers that batch (Pravega blocks, TANK bundles) reach it.
Measured by ``benchmarks/store_append.py --compare-refs``."""

REF_APPEND_BYTES_UNSYNCED = 16 * 1024
"""``REF_APPEND_BYTES`` under ``interval`` and ``never``, where no round syncs,
so a reference costs only its fixed work (the record, two CRC combinations,
the data file's bookkeeping) against the second copy and CRC. Measured by
``benchmarks/store_append.py --fsync never --compare-refs``."""

MAX_PENDING_WAL_BYTES = 8 * 1024 * 1024
"""Queued record bytes that make ``write`` flush at once instead of waiting for the
committer: bounds the memory held by a burst between two event-loop turns."""

YIELD_INTERVAL_S = 0.001
"""Under ``never`` and ``interval`` appends acknowledged at once yield to the event
loop when they have kept it from turning this long (and whenever the committer has
work), so a task appending in a loop cannot starve the committer without paying
a loop round on every append."""

MAX_OPEN_DATA_FILES = 256
"""Data files a container keeps open at most (least recently used closed first).
The server lowers it to what the process's open-file limit leaves
(``DataFiles.max_open``): four containers of 256 are the whole usual 1024."""

MIN_OPEN_DATA_FILES = 8
"""The fewest data files a container keeps open: below it appends spread over
a few segments would reopen a file each."""

OnDurable = tuple[int, int, Callable[[], None]]
"""(seq, tie-breaker, callback): run by the committer once ``seq`` is durable."""


class _Writes:
    """Queued records and their data, taken off the container in one step.

    ``run`` writes them: the data to the data files (one ``pwritev`` per
    contiguous run), then the records to the WAL (one ``writev``). Data first,
    so that an APPEND_REF in the WAL finds its bytes in the data file even
    after a kill between the two writes (data past what the WAL knows is cut
    by recovery). ``pinned`` are the data-file fds pinned for it
    (``DataFiles.pin``) when it runs in the sync thread, unpinned on the loop
    thread once it is done; ``ref_fds`` maps the segments that received
    APPEND_REF bytes to their fd, for the data sync beside the WAL sync.
    """

    __slots__ = ("buffers", "pinned", "ref_fds", "runs", "size_bytes", "wal_fd")

    def __init__(
        self,
        wal_fd: int,
        buffers: list[bytes | memoryview],
        size_bytes: int,
        runs: list[tuple[int, list[bytes | memoryview], int]],
        pinned: list[int],
        ref_fds: dict[int, int],
    ) -> None:
        self.wal_fd = wal_fd
        self.buffers = buffers
        self.size_bytes = size_bytes
        self.runs = runs
        self.pinned = pinned
        self.ref_fds = ref_fds

    def run(self, ops: FileOps) -> None:
        for fd, run, position in self.runs:
            ops.pwritev(fd, run, position)
        ops.write(self.wal_fd, self.buffers, self.size_bytes)


class SyncThread:
    """The one thread a container's WAL syncs run in.

    ``asyncio.to_thread`` per sync round costs an executor submission, a
    context copy and two chained futures each way; a long-lived thread fed by
    a queue costs one ``put`` and one ``call_soon_threadsafe``, which matters
    for a lone appender whose every append is a round (about 140 us of
    hand-offs around a 90 us ``fdatasync`` before).
    """

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[
            tuple[
                Callable[[], None],
                asyncio.Future[None],
                asyncio.AbstractEventLoop,
                Callable[[], None] | None,
            ]
            | None
        ] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def run(
        self, job: Callable[[], None], after: Callable[[], None] | None = None
    ) -> asyncio.Future[None]:
        """Run ``job`` in the thread; the future resolves (in this loop) when it returns.

        ``after`` runs in the loop when the job has returned or raised, even if
        the future was cancelled meanwhile (it releases what the job used).
        """
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._jobs.put((job, future, loop, after))
        return future

    def stop(self) -> None:
        """Let the thread end after the jobs already queued."""
        self._jobs.put(None)

    def _serve(self) -> None:
        while (item := self._jobs.get()) is not None:
            job, future, loop, after = item
            try:
                job()
            except BaseException as exc:  # handed to the awaiting committer
                _resolve_soon(loop, future, exc, after)
            else:
                _resolve_soon(loop, future, None, after)


def _resolve_soon(
    loop: asyncio.AbstractEventLoop,
    future: asyncio.Future[None],
    exc: BaseException | None,
    after: Callable[[], None] | None,
) -> None:
    def resolve() -> None:
        if after is not None:
            after()
        if future.done():
            return  # the committer was cancelled meanwhile
        if exc is None:
            future.set_result(None)
        else:
            future.set_exception(exc)

    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
        loop.call_soon_threadsafe(resolve)


class DataFiles:
    """Open data files of a container's segments, by segment id (an LRU of fds).

    Out of descriptors (EMFILE, ENFILE) when opening one, it closes the least
    recently used files it holds and tries again, so the store goes on with
    fewer open files rather than failing; with none left to close it raises
    ``StoreError`` saying so.
    """

    def __init__(self, paths: ContainerPaths, max_open: int = MAX_OPEN_DATA_FILES) -> None:
        self.paths = paths
        self.max_open = max_open
        """Data files kept open at most (``MAX_OPEN_DATA_FILES``)."""
        self._fds: dict[int, int] = {}
        self._pins: dict[int, int] = {}
        """fd -> writes in the sync thread that use it: such an fd is not closed..."""
        self._retired: set[int] = set()
        """...until the last of them is done, even if evicted or forgotten meanwhile."""

    def fd(self, segment_id: int) -> int:
        fd = self._fds.pop(segment_id, None)
        if fd is None:
            self._make_room()
            path = self.paths.data(segment_id)
            fd = self._opening(lambda: os.open(path, os.O_RDWR))
        self._fds[segment_id] = fd
        return fd

    def _make_room(self) -> None:
        while self._fds and len(self._fds) >= self.max_open:
            self._close(self._fds.pop(next(iter(self._fds))))

    def _opening(self, open_fd: Callable[[], int]) -> int:
        """``open_fd()``, closing cached files to make room while the process is
        out of descriptors."""
        while True:
            try:
                return open_fd()
            except OSError as exc:
                if exc.errno not in (errno.EMFILE, errno.ENFILE):
                    raise
                if not self._fds:
                    raise StoreError(
                        f"out of file descriptors: cannot open a data file ({exc.strerror}); "
                        "raise the open-file limit (ulimit -n)"
                    ) from exc
                count = max(1, len(self._fds) // 2)
                for _ in range(count):
                    self._close(self._fds.pop(next(iter(self._fds))))

    def pin(self, segment_id: int) -> int:
        """The segment's fd, kept open until ``unpin`` (for a write in another thread)."""
        fd = self.fd(segment_id)
        self._pins[fd] = self._pins.get(fd, 0) + 1
        return fd

    def unpin(self, fds: list[int]) -> None:
        for fd in fds:
            count = self._pins[fd] - 1
            if count:
                self._pins[fd] = count
                continue
            del self._pins[fd]
            if fd in self._retired:
                self._retired.discard(fd)
                os.close(fd)

    def _close(self, fd: int) -> None:
        if fd in self._pins:
            self._retired.add(fd)
        else:
            os.close(fd)

    def create(self, segment_id: int) -> None:
        self.forget(segment_id)
        self._make_room()
        self._fds[segment_id] = self._opening(
            functools.partial(create_segment_files, self.paths, segment_id)
        )

    def forget(self, segment_id: int) -> None:
        fd = self._fds.pop(segment_id, None)
        if fd is not None:
            self._close(fd)

    def open_reader(self, segment_id: int) -> int:
        """A new read-only descriptor of the segment's data file, for the caller to close.

        Not from the cache: a zero-copy send may outlive a cached descriptor
        (closed when the cache is full or the segment is deleted), and has a
        file position of its own.
        """
        path = self.paths.data(segment_id)
        return self._opening(lambda: os.open(path, os.O_RDONLY | os.O_CLOEXEC))

    def pread(self, segment_id: int, offset: int, count: int) -> bytes:
        fd = self.fd(segment_id)
        data = os.pread(fd, count, offset)
        while len(data) < count:
            more = os.pread(fd, count - len(data), offset + len(data))
            if not more:
                path = self.paths.data(segment_id)
                raise CorruptionError(str(path), offset + len(data), "data file ends early")
            data += more
        return data

    def close(self) -> None:
        for fd in [*self._fds.values(), *self._retired]:
            os.close(fd)
        self._fds.clear()
        self._retired.clear()
        self._pins.clear()


class Container:
    """One container of a live DiskStore (see the module docstring)."""

    def __init__(
        self,
        paths: ContainerPaths,
        state: ContainerState,
        wal: WalWriter,
        *,
        policy: FsyncPolicy,
        fsync_interval_s: float,
        checkpoint_wal_bytes: int,
        ops: FileOps,
        on_failure: Callable[[BaseException], None],
        ref_append_bytes: int | None = None,
    ) -> None:
        self.paths = paths
        self.state = state
        self.files = DataFiles(paths)
        self.policy = policy
        self.fsync_interval_s = fsync_interval_s
        self.checkpoint_wal_bytes = checkpoint_wal_bytes
        if ref_append_bytes is None:
            ref_append_bytes = (
                REF_APPEND_BYTES if policy is FsyncPolicy.ALWAYS else REF_APPEND_BYTES_UNSYNCED
            )
        self.ref_append_bytes = max(1, ref_append_bytes)
        """Appends this large or larger are logged as APPEND_REF (an empty one never)."""
        self.ops = ops
        self._on_failure = on_failure
        self._wal = wal
        self._wal_paths: list[Path] = [wal.path]
        self.synced_seq = state.last_seq
        """Last record known to be on stable storage."""
        self._on_durable: list[OnDurable] = []
        """Callbacks of parked records, a heap by seq."""
        self._tie = itertools.count()
        self._wanted_seq = state.last_seq
        """Highest seq a caller waits to see synced."""
        self._round: asyncio.Future[None] | None = None
        """Resolved when the next sync round ends: callers whose record is not in the
        round now syncing await it."""
        self._syncing: asyncio.Future[None] | None = None
        """Resolved when the round now syncing ends: callers whose record it covers
        (seq <= ``_syncing_target``) await it, so each caller is woken once."""
        self._syncing_target = -1
        """Last seq the round now syncing covers (-1: no round is syncing)."""
        self._sync_thread: SyncThread | None = None
        self._data_syncer: concurrent.futures.ThreadPoolExecutor | None = None
        """The thread that syncs data files beside each WAL sync (``_sync_wal``)."""
        self._clock = time.monotonic
        self._burst_from = 0.0  # when the loop last turned under appends acked at once
        self._turned = True  # _saw_turn ran since the last such append
        self._write_error: BaseException | None = None
        """Set (in the sync thread) when a write failed: every later job fails too."""
        self._wake = asyncio.Event()
        self._closing = False
        self.failure: BaseException | None = None
        self._task: asyncio.Task[None] | None = None
        self._checkpointing: asyncio.Task[None] | None = None
        self._batched = policy is FsyncPolicy.ALWAYS
        self._pending: list[bytes | memoryview] = []
        """Encoded records not yet written to the WAL (``always`` only)."""
        self._pending_bytes = 0
        self._pending_writes: list[Write] = []
        """Their data, not yet written to the data files."""
        self._pending_refs: set[int] = set()
        """Segments with APPEND_REF bytes among ``_pending_writes``."""
        self._pending_ref_bytes = 0
        self._ref_bytes = 0
        """APPEND_REF bytes logged in the current WAL file: they count towards
        ``checkpoint_wal_bytes`` as if they were in it, since recovery reads them
        back (replay stays bounded by the same amount of I/O)."""
        self._unsynced_lock = threading.Lock()
        self._unsynced: set[int] = set()
        """Segments whose data file received APPEND_REF bytes since the last data
        sync (shared by the loop thread, which writes under ``never``/``interval``,
        and the sync thread, which syncs; under the lock)."""
        self._dir_unsynced = False
        """A segment was created since ``segments/`` was last synced by a data
        sync: a durable APPEND_REF needs its data file's directory entry too."""

    @property
    def container_id(self) -> int:
        return self.paths.container_id

    def start(self) -> None:
        self._sync_thread = SyncThread(f"headrace-sync-{self.container_id:04d}")
        self._data_syncer = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix=f"headrace-datasync-{self.container_id:04d}"
        )
        self._task = asyncio.create_task(
            self._run(), name=f"headrace-committer-{self.container_id:04d}"
        )

    # ------------------------------------------------------------------ issuing

    def check_writable(self) -> None:
        if self.failure is not None:
            raise StoreClosed(f"the store stopped after an I/O error: {self.failure}")
        if self._closing:
            raise StoreClosed("the store is closed")

    def write(self, record: Record) -> int:
        """Issue one record: apply it, queue it and its data; return its seq. Never awaits.

        The caller has validated the record against the state, so applying it
        cannot fail. Under ``always`` the record and its data are written by the
        committer just before its next sync (one ``writev`` for the batch);
        under the other policies they are written before this returns, since
        the caller is acknowledged at once. Raises StoreClosed / StorageFull
        (and then the store has failed).
        """
        self.check_writable()
        seq = self.state.last_seq + 1
        try:
            if isinstance(record, CreateRecord):
                self.files.create(record.segment_id)  # before the record: nothing to undo
        except OSError as exc:
            raise _error_for(exc) from exc
        if type(record) is AppendRecord and len(record.data) >= self.ref_append_bytes:
            logged, data_write = self.state.apply_append_ref(seq, record)
            buffers = encode_record(seq, logged)
            self._pending_writes.append(data_write)
            self._pending_refs.add(record.segment_id)
            self._pending_ref_bytes += logged.size_bytes
            self._ref_bytes += logged.size_bytes
        else:
            buffers = encode_record(seq, record)
            self._pending_writes += self.state.apply(seq, record)
            if isinstance(record, CreateRecord):
                with self._unsynced_lock:
                    self._dir_unsynced = True
        self._pending += buffers
        self._pending_bytes += len(buffers[0]) + len(buffers[1])
        if not self._batched:
            self._flush()
        elif self._pending_bytes + self._pending_ref_bytes >= MAX_PENDING_WAL_BYTES:
            if self._sync_thread is None:
                self._flush()
            else:
                self._queue_writes()
        if (
            self._wal.size_bytes + self._pending_bytes + self._ref_bytes
            >= self.checkpoint_wal_bytes
        ):
            self._wake.set()
        return seq

    def _flush(self) -> None:
        """Write the queued records to the WAL and their data to the data files, now."""
        writes = self._take_pending(pin=False)
        if writes is None:
            return
        try:
            writes.run(self.ops)
        except OSError as exc:
            self.fail(exc)
            raise _error_for(exc) from exc
        self._note_unsynced(writes)

    def _note_unsynced(self, writes: _Writes) -> None:
        """After ``writes`` ran: their APPEND_REF bytes await a data sync."""
        if writes.ref_fds:
            with self._unsynced_lock:
                self._unsynced.update(writes.ref_fds)

    def _sync_data(self, ids: set[int], fds: dict[int, int], sync_dir: bool) -> None:
        """Make APPEND_REF bytes durable: ``fdatasync`` each data file in ``ids``
        (through its fd in ``fds``, pinned by the running job, else a fresh one),
        then ``segments/`` if ``sync_dir`` (a segment was created since)."""
        for segment_id in ids:
            fd = fds.get(segment_id)
            if fd is not None:
                self.ops.sync_data(fd)
                continue
            try:
                fd = os.open(self.paths.data(segment_id), os.O_RDONLY)
            except FileNotFoundError:
                continue  # deleted, and its DELETE is in a durable snapshot
            try:
                self.ops.sync_data(fd)
            finally:
                os.close(fd)
        if sync_dir:
            fsync_dir(self.paths.segments_dir, self.ops)

    def _sync_wal(self, wal: WalWriter, writes: _Writes | None = None) -> None:
        """Sync the WAL and every APPEND_REF byte written so far; return when both
        are durable, after rewriting the WAL's synced mark. Called for every WAL
        sync, so a sync never vouches for a reference to bytes that are not
        synced, under any policy.

        The data files are synced in the helper thread *beside* the WAL's
        ``fdatasync``, not before it: one journal commit can serve both, where
        one after the other cost two (a round with a large append took twice as
        long). Their order does not matter: nothing the round covers is
        acknowledged before both returned, and recovery treats a reference
        whose bytes did not make it as a torn tail.

        The synced mark (``WalWriter.mark_synced``: one ``pwrite`` into the
        file's first page, no sync of its own) records the file size taken
        before the sync started; the next sync takes it to the disk. Recovery
        cuts damage at or past it as a torn write that was never acknowledged.
        """
        synced_end = wal.written_end()
        self._sync_wal_and_data(wal.fd, writes)
        wal.mark_synced(synced_end, self.ops)

    def _sync_wal_and_data(self, wal_fd: int, writes: _Writes | None) -> None:
        with self._unsynced_lock:
            ids, self._unsynced = self._unsynced, set()
            sync_dir = self._dir_unsynced and bool(ids)
            if sync_dir:
                self._dir_unsynced = False
        if not ids:
            self.ops.sync_wal(wal_fd)
            return
        fds = writes.ref_fds if writes is not None else {}
        if self._data_syncer is None:
            self._sync_data(ids, fds, sync_dir)
            self.ops.sync_wal(wal_fd)
            return
        beside = self._data_syncer.submit(self._sync_data, ids, fds, sync_dir)
        try:
            self.ops.sync_wal(wal_fd)
        finally:
            beside.result()  # the fds it uses stay pinned until this job returns

    def _take_pending(self, *, pin: bool) -> _Writes | None:
        """Take the queued records and their data as one ``_Writes`` (None: nothing).

        The WAL's size counts them from here, so checkpoints start on time.
        Raises StoreClosed / StorageFull (and fails the store) if a data file
        cannot be opened.
        """
        if not self._pending:
            return None
        buffers, size, writes = self._pending, self._pending_bytes, self._pending_writes
        self._pending, self._pending_bytes, self._pending_writes = [], 0, []
        refs, self._pending_refs, self._pending_ref_bytes = self._pending_refs, set(), 0
        ref_fds: dict[int, int] = {}
        self._wal.size_bytes += size
        by_segment: dict[int, list[tuple[int, bytes | memoryview]]] = {}
        for segment_id, offset, data in writes:
            by_segment.setdefault(segment_id, []).append((offset, data))
        runs: list[tuple[int, list[bytes | memoryview], int]] = []
        pinned: list[int] = []
        try:
            for segment_id, chunks in by_segment.items():  # contiguous runs: one pwritev each
                if pin:
                    fd = self.files.pin(segment_id)
                    pinned.append(fd)
                else:
                    fd = self.files.fd(segment_id)
                if segment_id in refs:
                    ref_fds[segment_id] = fd
                run: list[bytes | memoryview] = []
                run_offset = run_end = -1
                for offset, data in chunks:
                    if offset != run_end and run:
                        runs.append((fd, run, run_offset))
                        run = []
                    if not run:
                        run_offset = run_end = offset
                    run.append(data)
                    run_end += len(data)
                if run:
                    runs.append((fd, run, run_offset))
        except (OSError, StoreError) as exc:  # StoreError: out of descriptors
            self.files.unpin(pinned)
            self.fail(exc)
            raise (_error_for(exc) if isinstance(exc, OSError) else exc) from exc
        return _Writes(self._wal.fd, buffers, size, runs, pinned, ref_fds)

    def _queue_writes(self) -> None:
        """Hand the queued records to the sync thread without waiting (a burst
        between two sync rounds: bounds the memory it holds)."""
        writes = self._take_pending(pin=True)
        if writes is None:
            return
        assert self._sync_thread is not None
        done = self._sync_thread.run(
            functools.partial(self._write_job, writes, None),
            functools.partial(self.files.unpin, writes.pinned),
        )
        done.add_done_callback(self._after_queued_writes)

    def _after_queued_writes(self, done: asyncio.Future[None]) -> None:
        if done.cancelled():
            return
        exc = done.exception()
        if exc is not None:
            self.fail(exc)

    def _write_job(self, writes: _Writes | None, sync_wal: WalWriter | None) -> None:
        """In the sync thread: write ``writes``, then sync the WAL ``sync_wal``.

        After one failed write every later job fails with the same error: a
        sync must never vouch for records whose write did not happen.
        """
        if self._write_error is not None:
            raise self._write_error
        if writes is not None:
            try:
                writes.run(self.ops)
            except BaseException as exc:
                self._write_error = exc
                raise
            self._note_unsynced(writes)
        if sync_wal is not None:
            self._sync_wal(sync_wal, writes)

    async def durable(self, seq: int, on_durable: Callable[[], None] | None = None) -> None:
        """Return once record ``seq`` is durable under the policy, after ``on_durable`` ran."""
        if self.failure is not None:
            raise StoreClosed(f"the store stopped after an I/O error: {self.failure}")
        if self.policy is not FsyncPolicy.ALWAYS:
            if on_durable is not None:
                on_durable()
            # Acknowledged without waiting, so yield now and then: a task appending
            # in a loop would otherwise never let the committer run its interval
            # sync or a checkpoint, and the loss bound of ``interval`` would not
            # hold. Only when appends have kept the loop from turning for
            # YIELD_INTERVAL_S (a callback tells when it turns): a yield is one
            # more event-loop round in an append's latency, which appends that
            # arrive apart (each from its own read) need not pay.
            now = self._clock()
            if self._turned:
                self._turned = False
                self._burst_from = now
                asyncio.get_running_loop().call_soon(self._saw_turn)
            if self._wake.is_set() or now - self._burst_from >= YIELD_INTERVAL_S:
                await asyncio.sleep(0)
            return
        if seq <= self.synced_seq:
            if on_durable is not None:
                on_durable()
            return
        if on_durable is not None:
            heapq.heappush(self._on_durable, (seq, next(self._tie), on_durable))
        await self._until_synced(seq)

    def _saw_turn(self) -> None:
        self._turned = True

    async def _until_synced(self, seq: int) -> None:
        """Park until the committer has synced the WAL past ``seq`` (any policy).

        Every caller parked for a round awaits one shared future instead of a
        future each. A caller's cancellation cancels that shared future, so a
        caller that gets CancelledError without being cancelled itself waits
        for the next round's future instead.

        Raises:
            StoreClosed, StorageFull: the container failed before ``seq`` was synced.
        """
        if seq > self._wanted_seq:
            self._wanted_seq = seq
        self._wake.set()
        while seq > self.synced_seq:
            if self.failure is not None:
                raise _failure_error(self.failure)
            try:
                await self._round_for(seq)
            except asyncio.CancelledError:
                # The task asked now, not before the wait: a connection starts a
                # small append in its own task and hands the rest to another.
                task = asyncio.current_task()
                if task is None or task.cancelling():
                    raise

    def _round_for(self, seq: int) -> asyncio.Future[None]:
        """The shared future a caller waiting for ``seq`` awaits (created when needed,
        or again when another caller's cancellation cancelled it)."""
        if seq <= self._syncing_target:
            if self._syncing is None or self._syncing.done():
                self._syncing = asyncio.get_running_loop().create_future()
            return self._syncing
        if self._round is None or self._round.done():
            self._round = asyncio.get_running_loop().create_future()
        return self._round

    async def barrier(self) -> None:
        """Wait until everything written so far is durable under the policy.

        After a failure under ``never``/``interval`` this raises: the failed
        record was applied to the in-memory state before its write failed, so
        that state (a writer's last event number above all) is ahead of the
        disk and must not be shown; a reconnecting Pravega writer would take
        the failed events as stored. (Under ``always`` the wait below raises.)

        Raises:
            StoreClosed, StorageFull: the container failed and state may be ahead of the disk.
        """
        if self.failure is not None and self.policy is not FsyncPolicy.ALWAYS:
            raise _failure_error(self.failure)
        if self.policy is FsyncPolicy.ALWAYS and self.synced_seq < self.state.last_seq:
            await self.durable(self.state.last_seq)

    def all_synced(self) -> bool:
        """Whether every record applied to the state is synced (under ``never``
        and ``interval`` only known when the container has not failed)."""
        return self.policy is FsyncPolicy.ALWAYS and self.synced_seq >= self.state.last_seq

    async def flush(self) -> None:
        """Sync the WAL now, whatever the policy, and let a running checkpoint finish."""
        self.check_writable()
        if self.synced_seq < self.state.last_seq:
            await self._until_synced(self.state.last_seq)
        if self._checkpointing is not None:
            await asyncio.shield(self._checkpointing)

    # ------------------------------------------------------------------ committing

    async def _run(self) -> None:
        interval = self.fsync_interval_s if self.policy is FsyncPolicy.INTERVAL else None
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), interval)
                self._wake.clear()
                await self._commit(periodic=interval is not None)
                if self._closing and (
                    self.failure is not None or self._wanted_seq <= self.synced_seq
                ):
                    return
        except Exception as exc:
            self.fail(exc)

    async def _commit(self, *, periodic: bool) -> None:
        """Sync rounds until no caller is parked; start checkpoints as the WAL grows
        (checked every round, so a never-idle container still checkpoints)."""
        while self.failure is None:
            if self._wal.size_bytes + self._ref_bytes >= self.checkpoint_wal_bytes:
                await self._checkpoint()
            if not (
                self._wanted_seq > self.synced_seq
                or (periodic and self.synced_seq < self.state.last_seq)
            ):
                return
            periodic = False
            target = self.state.last_seq
            # Callers parked so far wait for this round; later ones for the next.
            self._syncing, self._round = self._round, None
            self._syncing_target = target
            if self._sync_thread is None:
                self._flush()
                if self.synced_seq < target:
                    await asyncio.to_thread(self._sync_wal, self._wal)
            else:
                writes = self._take_pending(pin=True)
                sync_wal = self._wal if self.synced_seq < target else None
                if writes is not None or sync_wal is not None:
                    await self._sync_thread.run(
                        functools.partial(self._write_job, writes, sync_wal),
                        None
                        if writes is None
                        else functools.partial(self.files.unpin, writes.pinned),
                    )
            self._mark_synced(target)

    async def _in_sync_thread(self, job: Callable[[], None]) -> None:
        """Run ``job`` after every write handed to the sync thread before it."""
        if self._sync_thread is None:  # never started (a container being set up)
            await asyncio.to_thread(job)
        else:
            await self._sync_thread.run(functools.partial(self._after_writes, job))

    def _after_writes(self, job: Callable[[], None]) -> None:
        self._write_job(None, None)  # raises if an earlier write failed
        job()

    def _mark_synced(self, target: int) -> None:
        self.synced_seq = max(self.synced_seq, target)
        callbacks = self._on_durable
        while callbacks and callbacks[0][0] <= target:
            heapq.heappop(callbacks)[2]()
        syncing, self._syncing = self._syncing, None
        self._syncing_target = -1
        if syncing is not None and not syncing.done():
            syncing.set_result(None)
        if self._wanted_seq <= self.synced_seq:  # e.g. a checkpoint synced them all
            self._wake_parked()

    def _wake_parked(self) -> None:
        for round_ in (self._syncing, self._round):
            if round_ is not None and not round_.done():
                round_.set_result(None)
        self._syncing = self._round = None
        self._syncing_target = -1

    async def _checkpoint(self, *, wait: bool = False) -> None:
        """Start a checkpoint (at most one runs at a time); with ``wait``, finish it.

        The WAL switch runs here, in the committer, because no record in the new
        file may be acknowledged before that file's directory entry is durable.
        The rest (sidecars, data files, snapshot) runs in the background, so
        group commits go on meanwhile.
        """
        if self._checkpointing is not None:
            if not wait:
                return  # the WAL grows a little past the threshold meanwhile
            await self._checkpointing
        if self.failure is not None or self.state.last_seq < self._wal.first_seq:
            return  # failed, or nothing since the last checkpoint
        # Queued records belong in the file being closed; the sync thread writes
        # them before it syncs that file (its jobs run in order).
        if self._sync_thread is None:
            self._flush()
        else:
            self._queue_writes()
        captured = self.state.capture()
        seq = captured.snapshot.last_seq
        old_wal, old_paths = self._wal, self._wal_paths
        self._wal = WalWriter.create(self.paths.wal(seq + 1), self.container_id, seq + 1, self.ops)
        self._wal_paths = [self._wal.path]
        self._ref_bytes = 0
        # Records up to ``seq`` are all in the old file; sync and release it.
        await self._in_sync_thread(functools.partial(self._sync_switch, old_wal, self._wal))
        self._mark_synced(seq)
        self._checkpointing = asyncio.create_task(
            self._write_checkpoint(captured, old_paths),
            name=f"headrace-checkpoint-{self.container_id:04d}",
        )
        if wait:
            await self._checkpointing

    async def _write_checkpoint(self, captured: Captured, old_paths: list[Path]) -> None:
        try:
            await asyncio.to_thread(write_checkpoint, self.paths, captured, old_paths, self.ops)
            log.debug(
                "container %d: checkpoint at seq %d", self.container_id, captured.snapshot.last_seq
            )
        except Exception as exc:
            self.fail(exc)
        finally:
            self._checkpointing = None
            self._wake.set()  # the WAL may have passed the threshold again

    def _sync_switch(self, old_wal: WalWriter, new_wal: WalWriter) -> None:
        try:
            self._sync_wal(old_wal)
        finally:
            old_wal.close()
        self.ops.sync_wal(new_wal.fd)  # the new file's header (its mark covers it)
        fsync_dir(self.paths.wal_dir, self.ops)

    # ------------------------------------------------------------------ failure and close

    def fail(self, exc: BaseException) -> None:
        """Stop accepting writes and release every parked caller with StoreClosed
        (StorageFull if the disk is full)."""
        if self.failure is not None:
            return
        self.failure = exc
        log.error("container %d: I/O failure, refusing writes: %s", self.container_id, exc)
        self._on_durable.clear()
        self._wake_parked()  # each parked caller raises its own error (_until_synced)
        self._wake.set()
        self._on_failure(exc)

    async def close(self) -> None:
        """Let parked callers finish, checkpoint (unless failed), release files.

        Raises StoreClosed if the closing checkpoint failed (an earlier failure
        was already reported to the calls it affected).
        """
        failed_before = self.failure is not None
        self._closing = True
        self._wake.set()
        if self._task is not None:
            await self._task
            self._task = None
        try:
            await self._checkpoint(wait=True)
        except Exception as exc:
            self.fail(exc)
        finally:
            if self._checkpointing is not None:
                await self._checkpointing  # it fails the container itself if it must
            self._wal.close()
            self.files.close()
            if self._sync_thread is not None:
                self._sync_thread.stop()
            if self._data_syncer is not None:
                self._data_syncer.shutdown(wait=False)
        if self.failure is not None and not failed_before:
            raise StoreClosed(f"checkpoint at close failed: {self.failure}")


def _failure_error(exc: BaseException) -> StorageFull | StoreClosed:
    """What a caller parked when the container failed with ``exc`` gets."""
    if isinstance(exc, OSError):
        return _error_for(exc)
    return StoreClosed(f"the store stopped after an I/O error: {exc}")


def _error_for(exc: OSError) -> StorageFull | StoreClosed:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return StorageFull(f"no space left for the write: {exc}")
    return StoreClosed(f"write failed, the store stopped: {exc}")
