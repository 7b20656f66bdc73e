"""Test-only: a headrace server with just the controller listener, in its own process.

Usage: ``python controller_runner.py [--data-dir DIR] [--fsync POLICY] [--segment-store-port N]``.
Starts ``ServerApp`` (a MemoryStore, or the DiskStore in ``--data-dir``) and the
controller listener on 127.0.0.1 at a free port, prints ``READY <port>`` on
stdout, and runs until SIGTERM or SIGINT. The real client must never run in
the pytest process (its blocking calls hold the GIL and retry for a minute),
and neither should the server it talks to.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from pathlib import Path

from headrace.server.app import ServerApp
from headrace.server.config import DEFAULT_PORTS, ServerConfig
from headrace.server.controller import start_controller
from headrace.store.api import FsyncPolicy
from headrace.store.memory import MemoryStore


async def main(data_dir: Path | None, fsync: FsyncPolicy, segment_store_port: int) -> None:
    ports = dict.fromkeys(DEFAULT_PORTS, 0)
    ports["segment_store"] = segment_store_port
    config = ServerConfig(data_dir=data_dir or Path("unused"), fsync=fsync, ports=ports)
    app = ServerApp(config, store=None if data_dir else MemoryStore())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await app.start()  # every port is 0 here, so this only opens the store
    listener = await start_controller(app, "127.0.0.1", 0)
    print(f"READY {listener.port}", flush=True)
    try:
        await stop.wait()
    finally:
        await listener.aclose()
        await app.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-dir", type=Path)
    parser.add_argument("--fsync", type=FsyncPolicy, default=FsyncPolicy.ALWAYS)
    parser.add_argument("--segment-store-port", type=int, default=12345)
    args = parser.parse_args()
    asyncio.run(main(args.data_dir, args.fsync, args.segment_store_port))
