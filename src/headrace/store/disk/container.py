"""A segment container: one WAL, one group-commit loop, the segments that hash to it.

Theory of operation. A mutation is issued synchronously (``Container.write``):
the record gets the next sequence number, is applied to the in-memory state,
and is queued with the data it carries. Nothing awaits in between, so records
of one container reach the WAL in exactly the order their effects were
applied, and an append's offset is fixed when it is issued. The caller then
awaits ``durable(seq)``.

The container composes the parts that do the work, each documented where it
is done:

* ``commit.py``: group commit. The queue of issued records, the committer
  task and the container's sync thread that write and sync them under the
  fsync policy, and the callers parked until their record is durable.
* ``datafiles.py``: the segments' data files (open descriptors, creation).
* ``checkpoint.py``: checkpoints, started by the committer when the WAL
  passes ``checkpoint_wal_bytes`` and at close, written in the background.

Large appends (``REF_APPEND_BYTES`` and up) are written once: their bytes go
to the data file only and the WAL gets an APPEND_REF (position, size, CRC);
every WAL sync also syncs the data files holding such bytes (``commit.py``).

A failed WAL write or sync fails the whole store: the container that met it
logs it and fails every other container (``on_failure``); each releases its
parked callers with ``StoreClosed`` (``StorageFull`` if the disk was full) and
accepts no more writes. Reads of durable bytes go on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from headrace.errors import StoreClosed
from headrace.store.api import FsyncPolicy
from headrace.store.disk.checkpoint import Checkpointer
from headrace.store.disk.commit import GroupCommit, error_for
from headrace.store.disk.datafiles import DataFiles
from headrace.store.disk.format import AppendRecord, CreateRecord, Record, encode_record
from headrace.store.disk.layout import ContainerPaths
from headrace.store.disk.log import FileOps, WalWriter
from headrace.store.disk.replicated import CommitGate
from headrace.store.disk.segment import ContainerState

__all__ = [
    "MAX_OPEN_DATA_FILES",
    "MIN_OPEN_DATA_FILES",
    "REF_APPEND_BYTES",
    "REF_APPEND_BYTES_UNSYNCED",
    "Container",
]

log = logging.getLogger(__name__)

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

MAX_OPEN_DATA_FILES = 256
"""Data files a container keeps open at most (least recently used closed first).
The server lowers it to what the process's open-file limit leaves
(``DataFiles.max_open``): four containers of 256 are the whole usual 1024."""

MIN_OPEN_DATA_FILES = 8
"""The fewest data files a container keeps open: below it appends spread over
a few segments would reopen a file each."""


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
        self.files = DataFiles(paths, MAX_OPEN_DATA_FILES)
        if ref_append_bytes is None:
            ref_append_bytes = (
                REF_APPEND_BYTES if policy is FsyncPolicy.ALWAYS else REF_APPEND_BYTES_UNSYNCED
            )
        self.ref_append_bytes = max(1, ref_append_bytes)
        """Appends this large or larger are logged as APPEND_REF (an empty one never)."""
        self._on_failure = on_failure
        self.commit = GroupCommit(
            paths,
            state,
            wal,
            self.files,
            policy=policy,
            fsync_interval_s=fsync_interval_s,
            checkpoint_wal_bytes=checkpoint_wal_bytes,
            ops=ops,
            on_failure=self._failed,
            start_checkpoint=self._start_checkpoint,
        )
        self.checkpoints = Checkpointer(paths, state, self.commit, ops)
        self.gate: CommitGate | None = None
        """Set while this node leads the container in a replicated cluster
        (``replicated.py``): acknowledgements then wait for commit."""

    def set_gate(self, gate: CommitGate | None) -> None:
        """Acknowledge only at ``gate``'s commit from now on (None: at local durability)."""
        self.gate = gate
        if gate is None:
            self.commit.on_synced = None
            return
        self.commit.on_synced = gate.local_durable
        gate.local_durable(self.commit.synced_seq)

    @property
    def container_id(self) -> int:
        return self.paths.container_id

    @property
    def failure(self) -> BaseException | None:
        """The I/O error that failed the container, or None."""
        return self.commit.failure

    def start(self) -> None:
        self.commit.start()

    def _start_checkpoint(self) -> Awaitable[None]:
        return self.checkpoints.start()

    # ------------------------------------------------------------------ issuing

    def check_writable(self) -> None:
        self.commit.check_writable()
        if self.gate is not None:
            self.gate.check_writable()

    def write(self, record: Record) -> int:
        """Issue one record: apply it, queue it and its data; return its seq. Never awaits.

        The caller has validated the record against the state, so applying it
        cannot fail. When the record is written and synced is the committer's
        (``GroupCommit.queue``). Raises StoreClosed / StorageFull (and then the
        store has failed).
        """
        commit = self.commit
        commit.check_writable()
        gate = self.gate
        if gate is not None:
            gate.check_writable()
        seq = self.state.last_seq + 1
        try:
            if isinstance(record, CreateRecord):
                self.files.create(record.segment_id)  # before the record: nothing to undo
        except OSError as exc:
            raise error_for(exc) from exc
        if type(record) is AppendRecord and len(record.data) >= self.ref_append_bytes:
            logged, data_write = self.state.apply_append_ref(seq, record)
            commit.queue_ref(encode_record(seq, logged), data_write, logged.size_bytes)
        else:
            buffers = encode_record(seq, record)
            commit.queue(buffers, self.state.apply(seq, record), isinstance(record, CreateRecord))
        if gate is not None:
            gate.issued(seq, record)
            if commit.policy is not FsyncPolicy.ALWAYS:
                gate.local_durable(seq)  # written already: durable as the policy has it
        return seq

    # ------------------------------------------------------------------ waiting

    def durable(
        self, seq: int, on_durable: Callable[[], None] | None = None
    ) -> Coroutine[Any, Any, None]:
        """Wait until record ``seq`` is durable under the policy, after ``on_durable``
        ran (``GroupCommit.durable``: its coroutine itself, no frame around it).

        With a commit gate, also until the record is committed; ``on_durable``
        then runs at commit (``replicated.py``)."""
        gate = self.gate
        if gate is None:
            return self.commit.durable(seq, on_durable)
        return self._committed(gate, seq, on_durable)

    async def _committed(
        self, gate: CommitGate, seq: int, on_durable: Callable[[], None] | None
    ) -> None:
        if on_durable is not None:
            gate.on_commit(seq, on_durable)
        await self.commit.durable(seq)
        await gate.wait(seq)

    def barrier(self) -> Coroutine[Any, Any, None]:
        """Wait until everything written so far is durable (``GroupCommit.barrier``),
        and committed under a commit gate."""
        gate = self.gate
        if gate is None:
            return self.commit.barrier()
        return self._committed_barrier(gate, self.state.last_seq)

    async def _committed_barrier(self, gate: CommitGate, seq: int) -> None:
        await self.commit.barrier()
        await gate.wait(seq)

    def all_synced(self) -> bool:
        return self.commit.all_synced()

    async def flush(self) -> None:
        """Sync the WAL now, whatever the policy, and let a running checkpoint finish."""
        await self.commit.sync_now()
        running = self.checkpoints.running
        if running is not None:
            await asyncio.shield(running)

    # ------------------------------------------------------------------ failure and close

    def fail(self, exc: BaseException) -> None:
        """Stop accepting writes and release every parked caller with StoreClosed
        (StorageFull if the disk is full)."""
        self.commit.fail(exc)

    def _failed(self, exc: BaseException) -> None:
        log.error("container %d: I/O failure, refusing writes: %s", self.container_id, exc)
        self._on_failure(exc)

    async def close(self) -> None:
        """Let parked callers finish, checkpoint (unless failed), release files.

        Raises StoreClosed if the closing checkpoint failed (an earlier failure
        was already reported to the calls it affected).
        """
        commit = self.commit
        failed_before = commit.failure is not None
        await commit.stop()
        try:
            await self.checkpoints.start(wait=True)
        except Exception as exc:
            commit.fail(exc)
        finally:
            running = self.checkpoints.running
            if running is not None:
                await running  # it fails the container itself if it must
            commit.close()
            self.files.close()
        if commit.failure is not None and not failed_before:
            raise StoreClosed(f"checkpoint at close failed: {commit.failure}")
