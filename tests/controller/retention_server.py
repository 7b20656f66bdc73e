"""Test-only: ``headrace serve`` as a ServerApp with a short retention interval.

Usage: ``python retention_server.py DATA_DIR CONTROLLER_PORT SEGMENT_STORE_PORT``.
Runs the controller and segment-store listeners (the disk store, fsync
``never``) with ``retention_interval_s`` = ``RETENTION_INTERVAL_S`` so that a
test sees retention act within a second, and stops on SIGTERM. ``headrace
serve`` has no flag for the interval; the configuration field does.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

from headrace.server.app import ServerApp
from headrace.server.config import DEFAULT_PORTS, ServerConfig
from headrace.store.api import FsyncPolicy

RETENTION_INTERVAL_S = 0.2


async def main(data_dir: Path, controller_port: int, segment_store_port: int) -> None:
    ports = dict.fromkeys(DEFAULT_PORTS, 0)
    ports["controller"] = controller_port
    ports["segment_store"] = segment_store_port
    config = ServerConfig(
        data_dir=data_dir,
        fsync=FsyncPolicy.NEVER,
        retention_interval_s=RETENTION_INTERVAL_S,
        ports=ports,
    )
    app = ServerApp(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await app.start()
    try:
        await stop.wait()
    finally:
        await app.aclose()


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])))
