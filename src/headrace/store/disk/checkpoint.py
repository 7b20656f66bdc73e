"""Checkpoints: a new snapshot of a container, and dropping what it makes obsolete.

A live container checkpoints when its WAL passes ``checkpoint_wal_bytes`` (the
committer asks, every round) and at close (``Checkpointer.start``); recovery
checkpoints each container that replayed anything (``recovery.write_checkpoint``).
The steps and their order (``docs/storage-format.md#checkpoint``):

1. In the committer (at close, once it has stopped), synchronously: hand the
   queued records to the WAL file being closed, capture the state as of its
   last seq ``S`` (``ContainerState.capture``), and start the next WAL file
   ``<S+1>.wal``; new records go there from here on.
2. Still in the committer (``GroupCommit.switch_wal``): sync the old WAL file
   and the APPEND_REF bytes it refers to, then the new file's header and the
   ``wal/`` directory. Records up to ``S`` are durable; their callers go. No
   record in the new file is acknowledged before its directory entry is
   durable, which is why this runs in the committer.
3. In a background task and a worker thread, while group commits go on
   (``recovery.write_checkpoint``): append the captured entries to the sidecars, sync
   the data file and sidecar of each dirty segment, then ``segments/``;
   replace ``snapshot`` atomically (write, sync, rename, sync the directory).
4. Then delete the WAL files before ``<S+1>.wal`` and the files of segments
   deleted before ``S``, and punch out the checksum blocks below each new
   start offset (``recovery.free_truncated``).

A crash anywhere leaves a recoverable directory: before the rename the old
snapshot and WAL files are intact; after it the old WAL files hold only
records up to ``S``, which recovery skips. An old WAL file holding
APPEND_REFs goes only after step 3 synced every dirty data file. A failed
checkpoint fails the container, as a failed WAL write does (``commit.py``).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from headrace.store.disk.commit import GroupCommit
from headrace.store.disk.layout import ContainerPaths
from headrace.store.disk.log import FileOps
from headrace.store.disk.recovery import write_checkpoint
from headrace.store.disk.segment import Captured, ContainerState

__all__ = ["CHECKPOINT_WAL_BYTES", "Checkpointer"]

log = logging.getLogger(__name__)

CHECKPOINT_WAL_BYTES = 64 * 1024 * 1024
"""WAL size that triggers a checkpoint: bounds replay after a crash to about a
second of disk bandwidth, while checkpoints (a few fsyncs each) stay rare."""


class Checkpointer:
    """Starts a live container's checkpoints and writes them in the background.

    At most one runs at a time; ``running`` is its task until it is done.
    """

    def __init__(
        self, paths: ContainerPaths, state: ContainerState, commit: GroupCommit, ops: FileOps
    ) -> None:
        self.paths = paths
        self.state = state
        self.commit = commit
        self.ops = ops
        self.running: asyncio.Task[None] | None = None
        """Steps 3-4 of the module docstring, while they run."""

    async def start(self, *, wait: bool = False) -> None:
        """Start a checkpoint (steps 1-2 here, in the committer); with ``wait``, finish it."""
        if self.running is not None:
            if not wait:
                return  # the WAL grows a little past the threshold meanwhile
            await self.running
        commit = self.commit
        if commit.failure is not None or self.state.last_seq < commit.wal.first_seq:
            return  # failed, or nothing since the last checkpoint
        commit.hand_off()  # queued records belong in the file being closed
        captured = self.state.capture()
        old_paths = await commit.switch_wal(captured.snapshot.last_seq)
        self.running = asyncio.create_task(
            self._write(captured, old_paths),
            name=f"headrace-checkpoint-{self.paths.container_id:04d}",
        )
        if wait:
            await self.running

    async def _write(self, captured: Captured, old_paths: list[Path]) -> None:
        try:
            await asyncio.to_thread(write_checkpoint, self.paths, captured, old_paths, self.ops)
            log.debug(
                "container %d: checkpoint at seq %d",
                self.paths.container_id,
                captured.snapshot.last_seq,
            )
        except Exception as exc:
            self.commit.fail(exc)
        finally:
            self.running = None
            self.commit.wake()  # the WAL may have passed the threshold again
