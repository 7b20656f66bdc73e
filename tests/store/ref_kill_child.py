"""Child process of ``test_append_ref.py``: killed between a data write and its WAL write.

Run as ``python ref_kill_child.py DATA_DIR SEGMENT``. Opens a ``DiskStore``
(``fsync=always``, one container), creates SEGMENT, appends 100 bytes and then
a large payload (logged by reference), prints the acknowledged length, and
starts a third, large append. The container's sync thread writes that
append's bytes to the data file and then its record to the WAL; the
``FileOps`` below sends this process ``SIGKILL`` at that WAL write, so the
process dies with the bytes in the data file and no record of them. Prints
``KILLING`` (one unbuffered write) just before the signal.

The payloads are ``test_append_ref._payload(0, 100)``, ``(1, LARGE)`` and
``(2, LARGE)`` (repeated here so the child imports nothing from the tests).
"""

from __future__ import annotations

import asyncio
import os
import signal
import struct
import sys
from pathlib import Path

from headrace.store.disk import DiskStore, FileOps
from headrace.store.disk.container import REF_APPEND_BYTES

LARGE = REF_APPEND_BYTES + 1000


def _payload(tag: int, size: int) -> bytes:
    block = struct.pack(">I", tag + 0x5A5A0101) * 16
    return (block * (size // len(block) + 1))[:size]


class KillAtWalWrite(FileOps):
    """Once armed, the next WAL write kills the process before it happens."""

    armed = False

    def write(self, fd: int, buffers: list[bytes | memoryview], size_bytes: int) -> None:
        if self.armed:
            os.write(1, b"KILLING\n")
            os.kill(os.getpid(), signal.SIGKILL)
        super().write(fd, buffers, size_bytes)


async def main(root: Path, segment: str) -> None:
    ops = KillAtWalWrite()
    store = await DiskStore.open(root, container_count=1, file_ops=ops)
    await store.create_segment(segment)
    await store.append(segment, _payload(0, 100))
    result = await store.append(segment, _payload(1, LARGE))
    os.write(1, f"{result.length}\n".encode())
    ops.armed = True
    await store.append(segment, _payload(2, LARGE))
    os.write(1, b"NOT KILLED\n")
    os._exit(1)


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), sys.argv[2]))
