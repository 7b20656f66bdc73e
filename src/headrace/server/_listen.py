"""Accept loop shared by every TCP front door: bounded connections, clean shutdown.

``start_tcp_listener`` binds (host, port), runs ``run_connection`` for each
accepted socket with a fresh handler, refuses connections beyond
``max_connections`` (closed at once, logged), and returns a ``Listener`` whose
``aclose`` stops accepting, cancels the connections' loops and waits for them
(each one releases its sessions in ``on_close``).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable

from headrace.server._loop import (
    LISTENER_SETTINGS,
    MAX_CONNECTIONS,
    ConnectionHandler,
    log_access,
    run_connection,
)
from headrace.server.app import Listener

__all__ = ["MAX_CONNECTIONS", "start_tcp_listener"]

log = logging.getLogger(__name__)

SHUTDOWN_TIMEOUT_S = 10.0
"""How long closing a listener waits for its connections' loops to finish."""


async def start_tcp_listener(
    name: str,
    host: str,
    port: int,
    make_handler: Callable[[], ConnectionHandler],
    *,
    ssl_context: ssl.SSLContext | None = None,
    max_connections: int | None = None,
    idle_timeout_s: float | None = None,
    max_pending_events: int | None = None,
) -> Listener:
    """Serve ``make_handler()`` connections on (host, port); port 0 picks a free port.

    Limits and metrics come from ``LISTENER_SETTINGS`` (set by ``ServerApp``);
    ``max_connections``, ``idle_timeout_s`` and ``max_pending_events``, when
    given, override its limits for this listener.
    """
    connections: set[asyncio.Task[None]] = set()
    settings = LISTENER_SETTINGS.get()
    limits = settings.limits
    connections_max = limits.max_connections if max_connections is None else max_connections
    observer = settings.observer_for(name) if settings.observer_for is not None else None

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        if len(connections) >= connections_max:
            log.warning("%s: refusing %s: %d connections open", name, peer, len(connections))
            writer.close()
            if observer is not None:
                observer.connection_refused()
            log_access(name, peer, {}, 0.0, "refused")
            return
        task = asyncio.current_task()
        assert task is not None
        connections.add(task)
        try:
            await run_connection(
                reader,
                writer,
                make_handler(),
                limits=limits,
                idle_timeout_s=idle_timeout_s,
                max_pending_events=max_pending_events,
                observer=observer,
                listener=name,
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
