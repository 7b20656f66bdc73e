"""Test-only: ``headrace serve``'s server forwarding the segments under a prefix to another server.

Usage: ``python forwarding_server.py OWNER_HOST:PORT PREFIX DATA_DIR --<listener>-port=N ...``
(the listener flags of ``headrace serve``; any other flag is not accepted).
The same ``ServerApp`` that ``headrace serve`` runs, on a ``RoutedStore``
over the data directory's ``DiskStore``: a segment whose name starts with
``PREFIX`` is another node's, reached at the segment store
``OWNER_HOST:PORT`` (``RemoteStore``); every other segment (the controller's
tables) is this node's. What a node does with segments another node owns.
Logs as ``headrace serve`` does; prints the same ``headrace ready`` line;
runs until SIGTERM.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from pathlib import Path

from headrace.cli._logging import configure_logging
from headrace.cluster.remote import Endpoint
from headrace.cluster.routing import Locate, RoutedStore
from headrace.store import DiskStore
from tests._server import serve_app_over

HERE: Endpoint = ("127.0.0.1", 0)
"""This node, as the placement names it: its segments go to the local store."""


def placement(owner: Endpoint, prefix: str) -> Locate:
    """Segment name -> ``owner`` under ``prefix``, else ``HERE``."""
    return lambda name: owner if name.startswith(prefix) else HERE


async def serve(owner: Endpoint, prefix: str, args: list[str]) -> None:
    data_dir = Path(args.pop(0))
    local = await DiskStore.open(data_dir)
    store = RoutedStore(local, placement(owner, prefix), here=HERE)
    await serve_app_over(store, data_dir, args)


if __name__ == "__main__":
    configure_logging(logging.WARNING, access=True)  # as headrace serve logs
    host, _, port = sys.argv[1].rpartition(":")
    asyncio.run(serve((host, int(port)), sys.argv[2], sys.argv[3:]))
