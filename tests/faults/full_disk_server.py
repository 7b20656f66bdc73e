"""Test-only: ``headrace serve``'s server on a disk that fills up on demand.

Usage: ``python full_disk_server.py FLAG_FILE DATA_DIR --<listener>-port=N ...``
(the listener flags of ``headrace serve``; any other flag is not accepted).
The same ``ServerApp`` that ``headrace serve`` runs, on a ``DiskStore`` opened
with a ``FileOps`` whose writes fail with ENOSPC while ``FLAG_FILE`` exists
(before writing anything, as a full file system does). Prints the same
``headrace ready`` line; runs until SIGTERM.
"""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import sys
from pathlib import Path

from headrace.server.app import ServerApp
from headrace.server.config import DEFAULT_PORTS, ServerConfig
from headrace.store import DiskStore
from headrace.store.disk.log import FileOps


class FullDiskOps(FileOps):
    """Writes fail with ENOSPC while ``flag`` exists."""

    def __init__(self, flag: Path) -> None:
        super().__init__()
        self.flag = flag

    def _check(self) -> None:
        if self.flag.exists():
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def write(self, fd: int, buffers: list[bytes | memoryview], size_bytes: int) -> None:
        self._check()
        super().write(fd, buffers, size_bytes)

    def pwritev(self, fd: int, buffers: list[bytes | memoryview], position: int) -> None:
        self._check()
        super().pwritev(fd, buffers, position)

    def pwrite(self, fd: int, data: bytes | memoryview, position: int) -> None:
        self._check()
        super().pwrite(fd, data, position)


async def main(flag: Path, data_dir: Path, port_args: list[str]) -> None:
    ports = dict.fromkeys(DEFAULT_PORTS, 0)
    for arg in port_args:
        name, _, value = arg.removeprefix("--").partition("=")
        key = name.removesuffix("-port").replace("-", "_")
        assert key in ports, arg
        ports[key] = int(value)
    store = await DiskStore.open(data_dir, file_ops=FullDiskOps(flag))
    app = ServerApp(ServerConfig(data_dir=data_dir, ports=ports), store=store)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, app.request_stop)
    try:
        await app.start()
        print(f"headrace ready: data in {data_dir}, listeners: {app.ports}", file=sys.stderr)
        sys.stderr.flush()
        await app.serve_until_stopped()
    finally:
        await app.aclose()
    print("headrace stopped", file=sys.stderr)


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]))
