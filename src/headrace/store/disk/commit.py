"""Group commit: a container's WAL writes and syncs, and the callers awaiting them.

Theory of operation. The container issues a record synchronously and queues
it here with the data it carries (``GroupCommit.queue``); the caller then
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
  and after a failed write no later job may report success. A round of a
  few records (``INLINE_SYNC_MAX_RECORDS``, a lone writer's) is waited for on
  the loop itself for up to ``INLINE_SYNC_WAIT_S``: while syncs are fast it
  costs no thread-to-loop wake-up; a slower sync is handed over to the thread,
  which wakes the loop when it returns, so one slow sync stalls the other
  connections that long at most. Records queued during a sync are covered
  by the next round, so one sync serves every segment of the container
  (group commit). Every caller parked for a round awaits the same future,
  resolved once per round. Durable effects (a longer ``durable_length``, a
  seal readers may see) are applied by the committer in sequence order,
  before the callers are woken, so they happen even if a caller was cancelled.
* ``interval``: written before ``queue`` returns and acknowledged at once;
  the committer syncs every ``fsync_interval_s`` (with the APPEND_REF bytes).
* ``never``: written before ``queue`` returns and acknowledged at once; only
  checkpoints sync.

Data is written before the records that refer to it (``_Writes.run``), so an
APPEND_REF in the WAL finds its bytes in the data file even after a kill
between the two writes. Every WAL sync, whatever asked for it (a round, an
interval, a flush, a checkpoint's switch), also syncs the data files holding
APPEND_REF bytes (in a helper thread, beside the WAL's sync) and returns when
both are durable, so a sync never vouches for a reference to bytes that are
not synced (``_sync_wal``).

The committer also starts checkpoints (``checkpoint.py``) when the WAL passes
``checkpoint_wal_bytes`` and switches to a new WAL file for them
(``switch_wal``).

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
import os
import queue
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

from headrace.errors import StorageFull, StoreClosed, StoreError
from headrace.store.api import FsyncPolicy
from headrace.store.disk.datafiles import DataFiles
from headrace.store.disk.layout import ContainerPaths
from headrace.store.disk.log import FileOps, WalWriter, fsync_dir
from headrace.store.disk.segment import ContainerState, Write

__all__ = [
    "INLINE_SYNC_MAX_RECORDS",
    "INLINE_SYNC_WAIT_S",
    "MAX_PENDING_WAL_BYTES",
    "YIELD_INTERVAL_S",
    "GroupCommit",
    "SyncThread",
    "error_for",
    "failure_error",
]

MAX_PENDING_WAL_BYTES = 8 * 1024 * 1024
"""Queued record bytes that make ``queue`` flush at once instead of waiting for the
committer: bounds the memory held by a burst between two event-loop turns."""

YIELD_INTERVAL_S = 0.001
"""Under ``never`` and ``interval`` appends acknowledged at once yield to the event
loop when they have kept it from turning this long (and whenever the committer has
work), so a task appending in a loop cannot starve the committer without paying
a loop round on every append."""

INLINE_SYNC_WAIT_S = 0.001
"""How long the event loop waits, blocked, for a small sync round it handed to the
sync thread before it goes back to its work and lets the thread wake it (the
usual hand-over). A healthy disk's ``fdatasync`` returns well within it, so a
lone writer's round costs no thread-to-loop wake-up and no loop round; a slow
sync (a disk in trouble) stalls the other connections this long at most."""

INLINE_SYNC_MAX_RECORDS = 8
"""Rounds of at most this many records get the brief wait (``INLINE_SYNC_WAIT_S``):
a round that carries more comes from a busy loop, which has better things to do
during the sync (reading the records of the next round)."""

OnDurable = tuple[int, int, Callable[[], None]]
"""(seq, tie-breaker, callback): run by the committer once ``seq`` is durable."""


class _Writes:
    """Queued records and their data, taken off the queue in one step.

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
                _Brief | None,
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
        self._jobs.put((job, future, loop, after, None))
        return future

    def run_briefly(
        self, job: Callable[[], None], after: Callable[[], None] | None, wait_s: float
    ) -> asyncio.Future[None] | None:
        """``run``, waiting here (the loop blocked) up to ``wait_s`` for the job.

        Returns None if it returned in time (``after`` has run; what it raised is
        raised here), else the future to await, as ``run``: the thread hands the
        outcome over to the loop then.
        """
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        brief = _Brief()
        self._jobs.put((job, future, loop, after, brief))
        if brief.done.wait(wait_s) or not brief.hand_over():
            future.cancel()
            if after is not None:
                after()
            if brief.error is not None:
                raise brief.error
            return None
        return future

    def stop(self) -> None:
        """Let the thread end after the jobs already queued."""
        self._jobs.put(None)

    def _serve(self) -> None:
        while (item := self._jobs.get()) is not None:
            job, future, loop, after, brief = item
            error: BaseException | None = None
            try:
                job()
            except BaseException as exc:  # handed to the awaiting committer
                error = exc
            if brief is None or brief.finish(error):
                _resolve_soon(loop, future, error, after)


class _Brief:
    """A job the loop waits for briefly (``SyncThread.run_briefly``): whichever of
    the thread finishing and the loop giving up comes first decides who resolves it."""

    __slots__ = ("done", "error", "finished", "handed", "lock")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.finished = False
        self.handed = False
        self.error: BaseException | None = None

    def finish(self, error: BaseException | None) -> bool:
        """In the thread: the job returned; whether the loop gave up waiting (the
        thread then resolves the future)."""
        with self.lock:
            self.finished = True
            self.error = error
            handed = self.handed
        if not handed:
            self.done.set()
        return handed

    def hand_over(self) -> bool:
        """In the loop: stop waiting; False if the job finished meanwhile."""
        with self.lock:
            if self.finished:
                return False
            self.handed = True
            return True


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


class GroupCommit:
    """A container's WAL, the records queued for it, and the committer task that
    writes and syncs them (see the module docstring).

    ``start_checkpoint`` is called by the committer when the WAL has grown past
    ``checkpoint_wal_bytes``; ``on_failure`` once, when the container fails.
    """

    def __init__(
        self,
        paths: ContainerPaths,
        state: ContainerState,
        wal: WalWriter,
        files: DataFiles,
        *,
        policy: FsyncPolicy,
        fsync_interval_s: float,
        checkpoint_wal_bytes: int,
        ops: FileOps,
        on_failure: Callable[[BaseException], None],
        start_checkpoint: Callable[[], Awaitable[None]],
    ) -> None:
        self.paths = paths
        self.state = state
        self.files = files
        self.policy = policy
        self.fsync_interval_s = fsync_interval_s
        self.checkpoint_wal_bytes = checkpoint_wal_bytes
        self.ops = ops
        self._on_failure = on_failure
        self._start_checkpoint = start_checkpoint
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
        self.inline_sync_wait_s = INLINE_SYNC_WAIT_S
        """``INLINE_SYNC_WAIT_S`` (0: every round waits for the thread's wake-up)."""
        self._burst_from = 0.0  # when the loop last turned under appends acked at once
        self._turned = True  # _saw_turn ran since the last such append
        self._write_error: BaseException | None = None
        """Set (in the sync thread) when a write failed: every later job fails too."""
        self._wake = asyncio.Event()
        self._closing = False
        self.failure: BaseException | None = None
        self._task: asyncio.Task[None] | None = None
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
        self.on_synced: Callable[[int], None] | None = None
        """Told ``synced_seq`` after each sync (a replicated container's own position)."""

    @property
    def wal(self) -> WalWriter:
        """The WAL file new records go to."""
        return self._wal

    def start(self) -> None:
        container_id = self.paths.container_id
        self._sync_thread = SyncThread(f"headrace-sync-{container_id:04d}")
        self._data_syncer = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix=f"headrace-datasync-{container_id:04d}"
        )
        self._task = asyncio.create_task(self._run(), name=f"headrace-committer-{container_id:04d}")

    # ------------------------------------------------------------------ queueing

    def check_writable(self) -> None:
        if self.failure is not None:
            raise StoreClosed(f"the store stopped after an I/O error: {self.failure}")
        if self._closing:
            raise StoreClosed("the store is closed")

    def queue(
        self, buffers: list[bytes | memoryview], writes: Iterable[Write], created: bool = False
    ) -> None:
        """Queue an issued record (its two buffers, from ``encode_record``) and the
        data writes it implies; ``created``: it is a CREATE. Never awaits.

        Under ``always`` they are written by the committer just before its next
        sync (one ``writev`` for the batch); under the other policies they are
        written before this returns, since the caller is acknowledged at once.
        Raises StoreClosed / StorageFull (and then the store has failed).
        """
        self._pending_writes += writes
        if created:
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

    def queue_ref(self, buffers: list[bytes | memoryview], write: Write, size_bytes: int) -> None:
        """Queue an issued APPEND_REF and the write of the ``size_bytes`` it refers to
        (as ``queue``)."""
        self._pending_writes.append(write)
        self._pending_refs.add(write[0])
        self._pending_ref_bytes += size_bytes
        self._ref_bytes += size_bytes
        self.queue(buffers, ())

    def hand_off(self) -> None:
        """Start writing the queued records now, to the current WAL file (without
        waiting: the sync thread writes them before any later job)."""
        if self._sync_thread is None:
            self._flush()
        else:
            self._queue_writes()

    def _flush(self) -> None:
        """Write the queued records to the WAL and their data to the data files, now."""
        writes = self._take_pending(pin=False)
        if writes is None:
            return
        try:
            writes.run(self.ops)
        except OSError as exc:
            self.fail(exc)
            raise error_for(exc) from exc
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
            raise (error_for(exc) if isinstance(exc, OSError) else exc) from exc
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

    # ------------------------------------------------------------------ waiting

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
                # Once per interval, not by every append after it: appends started
                # together in one callback (a pipelined read) cannot let the loop
                # turn before that callback ends, and each yield costs a task.
                self._burst_from = now
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
                raise failure_error(self.failure)
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
            raise failure_error(self.failure)
        if self.policy is FsyncPolicy.ALWAYS and self.synced_seq < self.state.last_seq:
            await self.durable(self.state.last_seq)

    def all_synced(self) -> bool:
        """Whether every record applied to the state is synced (under ``never``
        and ``interval`` only known when the container has not failed)."""
        return self.policy is FsyncPolicy.ALWAYS and self.synced_seq >= self.state.last_seq

    async def sync_now(self) -> None:
        """Sync the WAL past every record issued, now, whatever the policy."""
        self.check_writable()
        if self.synced_seq < self.state.last_seq:
            await self._until_synced(self.state.last_seq)

    # ------------------------------------------------------------------ committing

    def wake(self) -> None:
        """Let the committer look again (for a sync or a checkpoint)."""
        self._wake.set()

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
                await self._start_checkpoint()
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
                    job = functools.partial(self._write_job, writes, sync_wal)
                    after = (
                        None
                        if writes is None
                        else functools.partial(self.files.unpin, writes.pinned)
                    )
                    records = 0 if writes is None else len(writes.buffers) // 2
                    if records <= INLINE_SYNC_MAX_RECORDS:
                        # A small round: wait for it here while the sync is fast,
                        # hand it over to the thread when it is slow.
                        waiting = self._sync_thread.run_briefly(job, after, self.inline_sync_wait_s)
                        if waiting is not None:
                            await waiting
                    else:
                        await self._sync_thread.run(job, after)
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
        if self.on_synced is not None:
            self.on_synced(self.synced_seq)
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

    async def switch_wal(self, seq: int) -> list[Path]:
        """Close the WAL file, which holds every record up to ``seq``, for a new one;
        sync the old file, then the new file's header and ``wal/``. Return the
        paths of the WAL files the checkpoint at ``seq`` makes obsolete.

        Runs in the committer (``checkpoint.py``): no record in the new file may
        be acknowledged before that file's directory entry is durable. Queued
        records must have been handed off first (``hand_off``).
        """
        old_wal, old_paths = self._wal, self._wal_paths
        self._wal = WalWriter.create(
            self.paths.wal(seq + 1), self.paths.container_id, seq + 1, self.ops
        )
        self._wal_paths = [self._wal.path]
        self._ref_bytes = 0
        # Records up to ``seq`` are all in the old file; sync and release it.
        await self._in_sync_thread(functools.partial(self._sync_switch, old_wal, self._wal))
        self._mark_synced(seq)
        return old_paths

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
        (StorageFull if the disk is full); then ``on_failure``."""
        if self.failure is not None:
            return
        self.failure = exc
        self._on_durable.clear()
        self._wake_parked()  # each parked caller raises its own error (_until_synced)
        self._wake.set()
        self._on_failure(exc)

    async def stop(self) -> None:
        """Refuse new records; end the committer once the callers parked are released."""
        self._closing = True
        self._wake.set()
        if self._task is not None:
            await self._task
            self._task = None

    def close(self) -> None:
        """Close the WAL file and let the threads end (after ``stop`` and the last
        checkpoint)."""
        self._wal.close()
        if self._sync_thread is not None:
            self._sync_thread.stop()
        if self._data_syncer is not None:
            self._data_syncer.shutdown(wait=False)


def failure_error(exc: BaseException) -> StorageFull | StoreClosed:
    """What a caller parked when the container failed with ``exc`` gets."""
    if isinstance(exc, OSError):
        return error_for(exc)
    return StoreClosed(f"the store stopped after an I/O error: {exc}")


def error_for(exc: OSError) -> StorageFull | StoreClosed:
    """What the caller of a write that failed with ``exc`` gets."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return StorageFull(f"no space left for the write: {exc}")
    return StoreClosed(f"write failed, the store stopped: {exc}")
