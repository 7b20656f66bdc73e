"""A forwarding node for ``cluster_scale.py`` (not a benchmark itself).

Usage: ``python _forwarder.py DATA_DIR CONTROLLER_PORT SEGMENT_STORE_PORT OWNER_HOST:PORT PREFIX``

The ``ServerApp`` that ``headrace serve`` runs, with its controller and
segment-store doors, on a ``RoutedStore`` (``cluster/routing.py``) that sends
every segment whose name starts with ``PREFIX`` to the segment store at
``OWNER_HOST:PORT`` (a node that owns them) and keeps the rest (the
controller's own tables) in its local store: what a node does with a segment
another node owns. A client writing through this server's doors pays the
forwarding hop; prints ``headrace ready`` on stderr once its doors listen.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from pathlib import Path

from headrace.cli._logging import configure_logging
from headrace.cluster.remote import Endpoint
from headrace.cluster.routing import RoutedStore
from headrace.server.app import ServerApp
from headrace.server.config import DEFAULT_PORTS, ServerConfig
from headrace.store import DiskStore

HERE: Endpoint = ("127.0.0.1", 0)


async def serve(
    data_dir: Path, controller: int, segment_store: int, owner: str, prefix: str
) -> None:
    host, _, port = owner.rpartition(":")
    remote: Endpoint = (host, int(port))

    def locate(name: str) -> Endpoint:
        return remote if name.startswith(prefix) else HERE

    ports = dict.fromkeys(DEFAULT_PORTS, 0)
    ports.update(controller=controller, segment_store=segment_store)
    store = RoutedStore(await DiskStore.open(data_dir), locate, here=HERE)
    app = ServerApp(ServerConfig(data_dir=data_dir, ports=ports), store=store)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, app.request_stop)
    try:
        await app.start()
        print(f"headrace ready: {app.ports}", file=sys.stderr, flush=True)
        await app.serve_until_stopped()
    finally:
        await app.aclose()


if __name__ == "__main__":
    configure_logging(logging.WARNING)  # as headrace serve logs
    data, controller_port, store_port, owner_address, name_prefix = sys.argv[1:6]
    asyncio.run(
        serve(Path(data), int(controller_port), int(store_port), owner_address, name_prefix)
    )
