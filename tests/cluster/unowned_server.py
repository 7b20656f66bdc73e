"""Test-only: ``headrace serve``'s server on a store whose placement finds no owner
for some segments, on demand, as while their container moves between nodes.

Usage: ``python unowned_server.py FLAG_FILE DATA_DIR --<listener>-port=N ...``
(the listener flags of ``headrace serve``; any other flag is not accepted).
The same ``ServerApp`` that ``headrace serve`` runs, on a ``RoutedStore`` over
the data directory's ``DiskStore``: every segment is this node's, except
that while ``FLAG_FILE`` exists, a segment whose name starts with the file's
text has no owner (the routed store raises ``OwnerUnavailable`` for it).
Logs as ``headrace serve`` does (warnings, and the access lines); prints the
same ``headrace ready`` line; runs until SIGTERM.
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


def placement(flag: Path) -> Locate:
    """Segment name -> ``HERE``, or None (no owner) while ``flag`` names its prefix."""

    def locate(name: str) -> Endpoint | None:
        try:
            prefix = flag.read_text()
        except FileNotFoundError:
            return HERE
        return None if prefix and name.startswith(prefix) else HERE

    return locate


async def serve(flag: Path, args: list[str]) -> None:
    data_dir = Path(args.pop(0))
    local = await DiskStore.open(data_dir)
    store = RoutedStore(local, placement(flag), here=HERE)
    await serve_app_over(store, data_dir, args)


if __name__ == "__main__":
    configure_logging(logging.WARNING, access=True)  # as headrace serve logs
    asyncio.run(serve(Path(sys.argv[1]), sys.argv[2:]))
