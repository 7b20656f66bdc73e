"""Checkpoints: a new snapshot of a container, and dropping what it makes obsolete.

A live container checkpoints when its WAL passes ``checkpoint_wal_bytes`` (the
committer asks, every round) and at close (``Checkpointer.start``); recovery
checkpoints each container that replayed anything (``write_checkpoint``).
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
   (``write_checkpoint``): append the captured entries to the sidecars, sync
   the data file and sidecar of each dirty segment, then ``segments/``;
   replace ``snapshot`` atomically (write, sync, rename, sync the directory).
4. Then delete the WAL files before ``<S+1>.wal`` and the files of segments
   deleted before ``S``, and punch out the checksum blocks below each new
   start offset (``free_truncated``).

A crash anywhere leaves a recoverable directory: before the rename the old
snapshot and WAL files are intact; after it the old WAL files hold only
records up to ``S``, which recovery skips. An old WAL file holding
APPEND_REFs goes only after step 3 synced every dirty data file. A failed
checkpoint fails the container, as a failed WAL write does (``commit.py``).
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import cast

from headrace.store.disk.commit import GroupCommit
from headrace.store.disk.format import decode_sidecar, encode_snapshot
from headrace.store.disk.layout import ContainerPaths
from headrace.store.disk.log import FileOps, atomic_write, fsync_dir, sync_path
from headrace.store.disk.segment import Captured, ContainerState

__all__ = [
    "CHECKPOINT_WAL_BYTES",
    "Checkpointer",
    "free_truncated",
    "punch_hole",
    "write_checkpoint",
]

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


def write_checkpoint(
    paths: ContainerPaths, captured: Captured, old_wals: list[Path], ops: FileOps
) -> None:
    """Make a captured checkpoint durable, then drop what it makes obsolete.

    The new WAL file (starting after ``captured.snapshot.last_seq``) must exist
    and be synced before this runs. Order: sidecars, data files, snapshot
    (atomic), then deletions; a crash anywhere leaves a recoverable directory.
    """
    deleted = set(captured.deleted_ids)
    for segment_id, position, raw in captured.sidecar_writes:
        fd = os.open(paths.sidecar(segment_id), os.O_WRONLY)
        try:
            ops.pwrite(fd, raw, position)
        finally:
            os.close(fd)
    # Dirty: new data, new sidecar entries, or created since the last checkpoint.
    for segment_id in captured.dirty_ids:
        if segment_id not in deleted:
            sync_path(paths.data(segment_id), ops)
            sync_path(paths.sidecar(segment_id), ops)
    fsync_dir(paths.segments_dir, ops)  # files created since the last checkpoint
    atomic_write(paths.snapshot, paths.snapshot_tmp, encode_snapshot(captured.snapshot), ops)
    for path in old_wals:
        path.unlink(missing_ok=True)
    for segment_id in deleted:
        paths.data(segment_id).unlink(missing_ok=True)
        paths.sidecar(segment_id).unlink(missing_ok=True)
    # Only now that the snapshot holds the new start offsets may their bytes go.
    for segment_id, start_offset in captured.punches:
        if segment_id not in deleted:
            free_truncated(paths, segment_id, start_offset)


def free_truncated(paths: ContainerPaths, segment_id: int, start_offset: int) -> None:
    """Give back the disk blocks of whole checksum blocks below ``start_offset``.

    The data file keeps its size and offsets (a hole reads as zeros); ``verify``
    does not check blocks that end at or below the start offset. Where the
    platform or file system cannot punch holes, the bytes simply stay.
    """
    sidecar = paths.sidecar(segment_id)
    entries = decode_sidecar(sidecar.read_bytes(), segment_id, str(sidecar))
    end = max(
        (e.offset + e.size_bytes for e in entries if e.offset + e.size_bytes <= start_offset),
        default=0,
    )
    if end:
        fd = os.open(paths.data(segment_id), os.O_WRONLY)
        try:
            punch_hole(fd, 0, end)
        finally:
            os.close(fd)


_FALLOC_FL_KEEP_SIZE = 0x01  # linux/falloc.h
_FALLOC_FL_PUNCH_HOLE = 0x02


def _load_fallocate() -> Callable[[int, int, int, int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fallocate = libc.fallocate
    except (OSError, AttributeError):
        return None
    fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    fallocate.restype = ctypes.c_int
    return cast("Callable[[int, int, int, int], int]", fallocate)


_fallocate = _load_fallocate()


def punch_hole(fd: int, position: int, size_bytes: int) -> bool:
    """Free the file's blocks in ``[position, position + size_bytes)``, keeping its size.

    Returns False where that is not supported (then nothing changed).
    """
    if _fallocate is None:
        return False
    mode = _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE
    if _fallocate(fd, mode, position, size_bytes) != 0:
        err = ctypes.get_errno()
        if err in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            return False
        raise OSError(err, os.strerror(err))
    return True
