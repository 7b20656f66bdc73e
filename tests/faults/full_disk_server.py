"""Test-only: ``headrace serve``'s server on a disk that fills up on demand.

Usage: ``python full_disk_server.py FLAG_FILE [--checkpoints-only]
[--checkpoint-wal-bytes=N] DATA_DIR --<listener>-port=N ...`` (the listener
flags of ``headrace serve``; any other flag is not accepted). The same
``ServerApp`` that ``headrace serve`` runs, on a ``DiskStore`` opened with a
``FileOps`` whose writes fail with ENOSPC while ``FLAG_FILE`` exists (before
writing anything, as a full file system does, and so does asking for room
with ``reserve``). Prints the same ``headrace ready`` line; runs until SIGTERM.

``python full_disk_server.py FLAG_FILE --cli DATA_DIR ARGS...``: ``headrace
serve --data-dir DATA_DIR ARGS...`` itself, through its command line (so its
errors are reported as a user sees them), with the same failing writes.

``--checkpoints-only``: only a checkpoint's writes fail (the checksum sidecars
and the snapshot, told apart by the file an fd names in ``/proc/self/fd``),
not the WAL's and the data files', so appends succeed and the next checkpoint
fails the store with every record synced.
``--checkpoint-wal-bytes``: the WAL size that starts a checkpoint.
"""

from __future__ import annotations

import asyncio
import errno
import os
import sys
from collections.abc import Callable
from pathlib import Path

import headrace.server.app as app_module
from headrace.cli import main
from headrace.server.metrics import TimedFileOps
from headrace.store import DiskStore
from headrace.store.disk.checkpoint import CHECKPOINT_WAL_BYTES
from headrace.store.disk.layout import SIDECAR_SUFFIX
from headrace.store.disk.log import FileOps
from tests._server import serve_app_over

CHECKPOINT_FILES = (SIDECAR_SUFFIX, "snapshot.tmp")
"""Endings of the names of the files only a checkpoint writes."""


class FullDiskOps(FileOps):
    """Writes fail with ENOSPC while ``flag`` exists (with ``checkpoints_only``,
    only writes into a checkpoint's files)."""

    def __init__(self, flag: Path, *, checkpoints_only: bool = False) -> None:
        super().__init__()
        self.flag = flag
        self.checkpoints_only = checkpoints_only

    def _check(self, fd: int) -> None:
        if not self.flag.exists():
            return
        if self.checkpoints_only and not os.readlink(f"/proc/self/fd/{fd}").endswith(
            CHECKPOINT_FILES
        ):
            return
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def write(self, fd: int, buffers: list[bytes | memoryview], size_bytes: int) -> None:
        self._check(fd)
        super().write(fd, buffers, size_bytes)

    def pwritev(self, fd: int, buffers: list[bytes | memoryview], position: int) -> None:
        self._check(fd)
        super().pwritev(fd, buffers, position)

    def pwrite(self, fd: int, data: bytes | memoryview, position: int) -> None:
        self._check(fd)
        super().pwrite(fd, data, position)

    def reserve(self, fd: int, size_bytes: int) -> None:
        self._check(fd)
        super().reserve(fd, size_bytes)


async def serve_with(ops: FileOps, args: list[str], checkpoint_wal_bytes: int) -> None:
    """``headrace serve``'s app on a ``DiskStore`` over ``ops``; ``args`` are
    ``DATA_DIR --<listener>-port=N ...``. Runs until SIGTERM."""
    data_dir = Path(args.pop(0))
    store = await DiskStore.open(data_dir, file_ops=ops, checkpoint_wal_bytes=checkpoint_wal_bytes)
    await serve_app_over(store, data_dir, args)


def run_cli(flag: Path, args: list[str]) -> None:
    """``headrace serve --data-dir DATA_DIR ARGS`` itself (its own error
    handling: one ``Error:`` line), with every write of its store failing
    while ``flag`` exists."""

    class FullDiskTimedOps(FullDiskOps, TimedFileOps):
        def __init__(self, observe: Callable[[float], None]) -> None:
            TimedFileOps.__init__(self, observe)
            self.flag = flag
            self.checkpoints_only = False

    app_module.TimedFileOps = FullDiskTimedOps  # type: ignore[misc]  (the syscall layer)
    data_dir = args.pop(0)
    main(["serve", "--data-dir", data_dir, *args], prog_name="headrace")


async def main_async(args: list[str]) -> None:
    flag = Path(args.pop(0))
    checkpoints_only = False
    checkpoint_wal_bytes = CHECKPOINT_WAL_BYTES
    while args[0].startswith("--"):
        option, _, value = args.pop(0).partition("=")
        if option == "--checkpoints-only":
            checkpoints_only = True
        else:
            assert option == "--checkpoint-wal-bytes", option
            checkpoint_wal_bytes = int(value)
    ops = FullDiskOps(flag, checkpoints_only=checkpoints_only)
    await serve_with(ops, args, checkpoint_wal_bytes)


if __name__ == "__main__":
    if sys.argv[2:3] == ["--cli"]:
        run_cli(Path(sys.argv[1]), sys.argv[3:])
    else:
        asyncio.run(main_async(sys.argv[1:]))
