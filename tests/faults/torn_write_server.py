"""Test-only: ``headrace serve``'s server whose next WAL write is torn by a power cut.

Usage: ``python torn_write_server.py FLAG_FILE DATA_DIR --<listener>-port=N ...``
(the listener flags of ``headrace serve``). The same ``ServerApp`` that
``headrace serve`` runs (``full_disk_server.serve_with``), on a ``DiskStore``
whose ``FileOps`` does this once ``FLAG_FILE`` exists: the next WAL write
that carries two or more records reaches the file in pieces, as an unsynced
write can after a power cut (the disk wrote its first and last pages, not
the middle): its first record and half of the second (of three or more;
half of the first of two), then a hole of zeros, then its last record. Then
the process kills itself with SIGKILL, before the sync that would have made
any of the write's records acknowledged.
Prints the same ``headrace ready`` line; without the flag it is an ordinary
server.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

from headrace.store.disk.checkpoint import CHECKPOINT_WAL_BYTES
from headrace.store.disk.log import FileOps
from tests.faults.full_disk_server import serve_with


class PowerCutOps(FileOps):
    """Tears the next WAL write of two or more records once ``flag`` exists,
    then dies (see the module docstring)."""

    def __init__(self, flag: Path) -> None:
        super().__init__()
        self.flag = flag

    def write(self, fd: int, buffers: list[bytes | memoryview], size_bytes: int) -> None:
        if len(buffers) < 4 or not self.flag.exists():  # buffers: two per record
            super().write(fd, buffers, size_bytes)
            return
        sizes = [len(buffers[i]) + len(buffers[i + 1]) for i in range(0, len(buffers), 2)]
        joined = b"".join(buffers)
        start = os.fstat(fd).st_size
        first = sizes[0] + sizes[1] // 2 if len(sizes) > 2 else sizes[0] // 2
        os.write(fd, joined[:first])
        os.ftruncate(fd, start + len(joined) - sizes[-1])  # the hole reads as zeros
        os.write(fd, joined[-sizes[-1] :])
        print(
            f"torn write: {len(sizes)} records at WAL position {start}, hole from"
            f" {start + first} to {start + len(joined) - sizes[-1]}",
            file=sys.stderr,
            flush=True,
        )
        os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    flag = Path(sys.argv[1])
    asyncio.run(serve_with(PowerCutOps(flag), sys.argv[2:], CHECKPOINT_WAL_BYTES))
