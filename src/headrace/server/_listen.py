"""Accept loop shared by every TCP front door: bounded connections, clean shutdown.

``start_tcp_listener`` binds (host, port), serves each accepted socket with a
``Connection`` (the loop of ``_loop.py``) and a fresh handler, refuses
connections beyond ``max_connections`` (closed at once, logged), and returns a
``Listener`` whose ``aclose`` stops accepting, cancels the connections'
supervising tasks and waits for them (each one releases its sessions in
``on_close``).

TLS: given an ``ssl_context``, each connection does the server handshake
itself (``loop.start_tls``) rather than letting ``create_server`` do it,
because asyncio only logs a failed handshake in debug mode. Here a
client that is not speaking TLS (a plaintext client on a TLS port), presents
no or a wrong client certificate, or stalls the handshake past
``TLS_HANDSHAKE_TIMEOUT_S`` gets a logged close: a warning, an access line
with ``reason=tls_failed`` and ``headrace_errors_total{kind="tls_failed"}``.
The handshake counts against ``max_connections`` like any connection.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import ssl
from collections.abc import Callable

from headrace.server._loop import (
    LISTENER_SETTINGS,
    MAX_CONNECTIONS,
    READ_CHUNK_BYTES,
    TLS_HANDSHAKE_TIMEOUT_S,
    Connection,
    ConnectionHandler,
)
from headrace.server.app import Listener

__all__ = ["MAX_CONNECTIONS", "TLS_HANDSHAKE_TIMEOUT_S", "start_tcp_listener"]

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
    first_request_timeout_s: float | None = None,
) -> Listener:
    """Serve ``make_handler()`` connections on (host, port); port 0 picks a free port.

    Limits and metrics come from ``LISTENER_SETTINGS`` (set by ``ServerApp``);
    ``max_connections``, ``idle_timeout_s`` and ``max_pending_events``, when
    given, override its limits for this listener. ``first_request_timeout_s``:
    a connection that has sent no whole request this long after opening is
    closed (None: no such limit).
    """
    connections: set[asyncio.Task[None]] = set()
    settings = LISTENER_SETTINGS.get()
    limits = settings.limits
    if max_connections is not None:
        limits = dataclasses.replace(limits, max_connections=max_connections)
    observer = settings.observer_for(name) if settings.observer_for is not None else None
    # One receive buffer for the listener: each read is fed to its handler before
    # the loop reads again, so the connections can share it.
    receive_buffer = memoryview(bytearray(READ_CHUNK_BYTES))

    def accept() -> Connection:
        return Connection(
            make_handler,
            receive_buffer,
            limits=limits,
            registry=connections,
            idle_timeout_s=idle_timeout_s,
            max_pending_events=max_pending_events,
            observer=observer,
            listener=name,
            first_request_timeout_s=first_request_timeout_s,
            ssl_context=ssl_context,
            tls_handshake_timeout_s=TLS_HANDSHAKE_TIMEOUT_S,
        )

    server = await asyncio.get_running_loop().create_server(accept, host, port)
    bound = server.sockets[0].getsockname()[1]

    async def close() -> None:
        server.close()
        for task in list(connections):
            task.cancel()
        if connections:
            await asyncio.wait(set(connections), timeout=SHUTDOWN_TIMEOUT_S)
        await server.wait_closed()

    return Listener(name, bound, close)
