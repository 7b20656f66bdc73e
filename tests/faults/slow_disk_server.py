"""Test-only: ``headrace serve``'s server on a disk whose WAL syncs are slow on demand.

Usage: ``python slow_disk_server.py FLAG_FILE DATA_DIR --<listener>-port=N ...``.
The same ``ServerApp`` that ``headrace serve`` runs, on a ``DiskStore``
(``--fsync always``) whose WAL syncs take ``SLOW_SYNC_S`` more while
``FLAG_FILE`` exists; each such sync first creates ``FLAG_FILE.syncing``, so a
test knows one is under way. Prints the same ``headrace ready`` line; runs
until SIGTERM.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from pathlib import Path

from headrace.store import DiskStore
from headrace.store.disk.log import FileOps
from tests._server import serve_app_over

SLOW_SYNC_S = 2.0
"""How long a slow sync takes: far above anything a test waits for meanwhile."""


class SlowSyncOps(FileOps):
    """WAL syncs take ``SLOW_SYNC_S`` more while ``flag`` exists."""

    def __init__(self, flag: Path) -> None:
        super().__init__()
        self.flag = flag

    def sync_wal(self, fd: int) -> None:
        if self.flag.exists():
            self.flag.with_name(self.flag.name + ".syncing").touch()
            threading.Event().wait(SLOW_SYNC_S)  # the slow disk itself, not synchronisation
        super().sync_wal(fd)


async def main_async(args: list[str]) -> None:
    flag = Path(args.pop(0))
    data_dir = Path(args.pop(0))
    store = await DiskStore.open(data_dir, file_ops=SlowSyncOps(flag))
    await serve_app_over(store, data_dir, args)


if __name__ == "__main__":
    asyncio.run(main_async(sys.argv[1:]))
