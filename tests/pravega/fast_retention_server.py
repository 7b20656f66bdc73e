"""Test-only: ``headrace serve``'s server with retention applied every 0.2 s.

Usage: ``python fast_retention_server.py DATA_DIR CONTROLLER_PORT SEGMENT_STORE_PORT``.
The same ``ServerApp`` that ``headrace serve`` runs (disk store, controller
and segment-store listeners, every other listener off), configured with a
retention interval the command line does not offer (the default is a
minute), so that size retention shows within a test. Runs until SIGTERM.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

from headrace.server.app import ServerApp
from headrace.server.config import DEFAULT_PORTS, ServerConfig

RETENTION_INTERVAL_S = 0.2


async def main(data_dir: Path, controller_port: int, segment_store_port: int) -> None:
    ports = dict.fromkeys(DEFAULT_PORTS, 0)
    ports["controller"] = controller_port
    ports["segment_store"] = segment_store_port
    config = ServerConfig(data_dir=data_dir, ports=ports, retention_interval_s=RETENTION_INTERVAL_S)
    app = ServerApp(config)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, app.request_stop)
    try:
        await app.start()
        await app.serve_until_stopped()
    finally:
        await app.aclose()


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])))
