"""Accept loop shared by every TCP front door: bounded connections, clean shutdown.

``start_tcp_listener`` binds (host, port), runs ``run_connection`` for each
accepted socket with a fresh handler, refuses connections beyond
``MAX_CONNECTIONS`` (closed at once, logged), and returns a ``Listener`` whose
``aclose`` stops accepting, cancels the connections' loops and waits for them
(each one releases its sessions in ``on_close``).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable

from headrace.server._loop import (
    IDLE_TIMEOUT_S,
    MAX_PENDING_EVENTS,
    ConnectionHandler,
    run_connection,
)
from headrace.server.app import Listener

__all__ = ["MAX_CONNECTIONS", "start_tcp_listener"]

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 4096
"""Connections per listener: under the usual 1024..65536 fd limits with room for
data files; each connection holds at most a bounded amount of memory."""

SHUTDOWN_TIMEOUT_S = 10.0
"""How long closing a listener waits for its connections' loops to finish."""


async def start_tcp_listener(
    name: str,
    host: str,
    port: int,
    make_handler: Callable[[], ConnectionHandler],
    *,
    ssl_context: ssl.SSLContext | None = None,
    max_connections: int = MAX_CONNECTIONS,
    idle_timeout_s: float = IDLE_TIMEOUT_S,
    max_pending_events: int = MAX_PENDING_EVENTS,
) -> Listener:
    """Serve ``make_handler()`` connections on (host, port); port 0 picks a free port.

    ``idle_timeout_s`` and ``max_pending_events`` are passed to ``run_connection``.
    """
    connections: set[asyncio.Task[None]] = set()

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        if len(connections) >= max_connections:
            log.warning("%s: refusing %s: %d connections open", name, peer, len(connections))
            writer.close()
            return
        task = asyncio.current_task()
        assert task is not None
        connections.add(task)
        try:
            await run_connection(
                reader,
                writer,
                make_handler(),
                idle_timeout_s=idle_timeout_s,
                max_pending_events=max_pending_events,
            )
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("%s: connection %s failed", name, peer)
        finally:
            connections.discard(task)

    server = await asyncio.start_server(on_connect, host, port, ssl=ssl_context)
    bound = server.sockets[0].getsockname()[1]

    async def close() -> None:
        server.close()
        for task in list(connections):
            task.cancel()
        if connections:
            await asyncio.wait(set(connections), timeout=SHUTDOWN_TIMEOUT_S)
        await server.wait_closed()

    return Listener(name, bound, close)
