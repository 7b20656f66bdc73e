"""Accept loop shared by every TCP front door: bounded connections, clean shutdown.

``start_tcp_listener`` binds (host, port), runs ``run_connection`` for each
accepted socket with a fresh handler, refuses connections beyond
``max_connections`` (closed at once, logged), and returns a ``Listener`` whose
``aclose`` stops accepting, cancels the connections' loops and waits for them
(each one releases its sessions in ``on_close``).

TLS: given an ``ssl_context``, the accept loop does the server handshake
itself (``StreamWriter.start_tls``) rather than letting ``asyncio.start_server``
do it, because asyncio only logs a failed handshake in debug mode. Here a
client that is not speaking TLS (a plaintext client on a TLS port), presents
no or a wrong client certificate, or stalls the handshake past
``TLS_HANDSHAKE_TIMEOUT_S`` gets a logged close: a warning, an access line
with ``reason=tls_failed`` and ``headrace_errors_total{kind="tls_failed"}``.
The handshake counts against ``max_connections`` like any connection.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable

from headrace.server._loop import (
    LISTENER_SETTINGS,
    MAX_CONNECTIONS,
    READ_CHUNK_BYTES,
    ConnectionHandler,
    ConnectionObserver,
    log_access,
    run_connection,
)
from headrace.server.app import Listener

__all__ = ["MAX_CONNECTIONS", "TLS_HANDSHAKE_TIMEOUT_S", "start_tcp_listener"]

log = logging.getLogger(__name__)

SHUTDOWN_TIMEOUT_S = 10.0
"""How long closing a listener waits for its connections' loops to finish."""

TLS_HANDSHAKE_TIMEOUT_S = 10.0
"""Longest a TLS handshake may take: a few round trips for any real client, even
across continents; a peer that connects and stalls would otherwise hold a
connection slot (asyncio's own default is 60 s)."""


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
            # The handshake must be the first await here: until ``start_tls``
            # swaps the protocol, the plain StreamReader would take the
            # ClientHello into its own buffer, where TLS never sees it.
            if ssl_context is not None and not await _handshake(
                name, writer, ssl_context, observer
            ):
                return
            await run_connection(
                reader,
                writer,
                make_handler(),
                limits=limits,
                idle_timeout_s=idle_timeout_s,
                max_pending_events=max_pending_events,
                observer=observer,
                listener=name,
                first_request_timeout_s=first_request_timeout_s,
            )
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("%s: connection %s failed", name, peer)
        finally:
            connections.discard(task)

    # The reader's buffer limit: asyncio pauses reading beyond twice it, and its
    # 64 KiB default made a 1 MiB append arrive in eight pause/resume rounds
    # (an epoll change each); READ_CHUNK_BYTES lets a read take a full chunk.
    server = await asyncio.start_server(on_connect, host, port, limit=READ_CHUNK_BYTES)
    bound = server.sockets[0].getsockname()[1]

    async def close() -> None:
        server.close()
        for task in list(connections):
            task.cancel()
        if connections:
            await asyncio.wait(set(connections), timeout=SHUTDOWN_TIMEOUT_S)
        await server.wait_closed()

    return Listener(name, bound, close)


async def _handshake(
    name: str,
    writer: asyncio.StreamWriter,
    ssl_context: ssl.SSLContext,
    observer: ConnectionObserver | None,
) -> bool:
    """Do the server side of a TLS handshake on an accepted connection.

    Returns True when the connection now speaks TLS; False when the handshake
    failed, the connection is closed and the failure logged and counted.
    """
    peer = writer.get_extra_info("peername")
    clock = asyncio.get_running_loop().time
    started_at = clock()
    try:
        await writer.start_tls(ssl_context, ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT_S)
    except asyncio.CancelledError:
        writer.transport.abort()
        raise
    except Exception as exc:  # ssl.SSLError, a reset, the timeout: all the peer's doing
        log.warning("%s: TLS handshake with %s failed: %s", name, _address(peer), exc)
        writer.transport.abort()
        if observer is not None:
            observer.connection_opened()
            observer.connection_closed("tls_failed")
        log_access(name, peer, {}, clock() - started_at, "tls_failed")
        return False
    return True


def _address(peer: object) -> str:
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else str(peer)
