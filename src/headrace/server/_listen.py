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

Out of descriptors: ``ServerApp`` caps the connections of all listeners
together at what the open-file limit leaves once the store's files are set
aside (``ConnectionSlots``), so accepting should not run out. If it does
(another part of the process took them), asyncio stops accepting on that
listener for a second and tries again, and reports each failed try to the
loop's exception handler with a traceback; ``start_tcp_listener`` installs a
handler that turns those reports into one warning a minute at most
(``ACCEPT_FAILURE_LOG_INTERVAL_S``), saying how many failed since the last.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import logging
import ssl
from collections.abc import Callable
from typing import Any

from headrace.server._context import Listener, ListenerSettings
from headrace.server._loop import (
    MAX_CONNECTIONS,
    READ_CHUNK_BYTES,
    TLS_HANDSHAKE_TIMEOUT_S,
    Connection,
    ConnectionHandler,
)

__all__ = ["MAX_CONNECTIONS", "TLS_HANDSHAKE_TIMEOUT_S", "start_tcp_listener"]

log = logging.getLogger(__name__)

SHUTDOWN_TIMEOUT_S = 10.0
"""How long closing a listener waits for its connections' loops to finish."""

ACCEPT_FAILURE_LOG_INTERVAL_S = 60.0
"""Least time between two warnings about accept() running out of descriptors:
asyncio retries each second, and a server at its limit for an hour must not
write 3600 lines (or tracebacks) about it."""

_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
"""accept() errors asyncio answers by pausing accepts for a second (its
``ACCEPT_RETRY_DELAY``) rather than by closing the listener."""

NO_SETTINGS = ListenerSettings()
"""The default limits, no metrics and no server-wide bounds: a listener outside
a ``ServerApp`` (tests, benchmarks)."""


class _AcceptBackoff:
    """The loop's exception handler while listeners run: an accept() that failed
    for want of descriptors is one warning a minute at most, not a traceback a
    second.

    Everything else goes to the handler that was there before (or the loop's
    default one).
    """

    def __init__(
        self, previous: Callable[[asyncio.AbstractEventLoop, dict[str, Any]], object] | None
    ) -> None:
        self.previous = previous
        self.logged_at: float | None = None
        self.failures = 0  # since the last warning

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if not (
            isinstance(exc, OSError)
            and exc.errno in _OUT_OF_RESOURCES
            and "accept" in str(context.get("message", ""))
        ):
            if self.previous is not None:
                self.previous(loop, context)
            else:
                loop.default_exception_handler(context)
            return
        self.failures += 1
        now = loop.time()
        if self.logged_at is not None and now - self.logged_at < ACCEPT_FAILURE_LOG_INTERVAL_S:
            return
        sock = context.get("socket")
        log.warning(
            "accept() on %s failed %d time(s): %s; trying again each second",
            sock.getsockname() if sock is not None else "a listener",
            self.failures,
            exc.strerror,
        )
        self.logged_at = now
        self.failures = 0


def _accept_backoff(loop: asyncio.AbstractEventLoop) -> _AcceptBackoff:
    """The loop's ``_AcceptBackoff`` handler, installed on first use."""
    handler = loop.get_exception_handler()
    if isinstance(handler, _AcceptBackoff):
        return handler
    backoff = _AcceptBackoff(handler)
    loop.set_exception_handler(backoff)
    return backoff


async def start_tcp_listener(
    name: str,
    host: str,
    port: int,
    make_handler: Callable[[], ConnectionHandler],
    *,
    settings: ListenerSettings = NO_SETTINGS,
    ssl_context: ssl.SSLContext | None = None,
    max_connections: int | None = None,
    idle_timeout_s: float | None = None,
    max_pending_events: int | None = None,
    first_request_timeout_s: float | None = None,
) -> Listener:
    """Serve ``make_handler()`` connections on (host, port); port 0 picks a free port.

    Limits and metrics come from ``settings`` (a front door passes its
    ``ListenerContext.settings``); ``max_connections``, ``idle_timeout_s`` and
    ``max_pending_events``, when given, override its limits for this listener.
    ``first_request_timeout_s``: a connection that has sent no whole request
    this long after opening is closed (None: no such limit).
    """
    connections: set[asyncio.Task[None]] = set()
    limits = settings.limits
    if max_connections is not None:
        limits = dataclasses.replace(limits, max_connections=max_connections)
    observer = settings.observer_for(name) if settings.observer_for is not None else None
    # One receive buffer for the listener: each read is fed to its handler before
    # the loop reads again, so the connections can share it.
    receive_buffer = memoryview(bytearray(READ_CHUNK_BYTES))
    loop = asyncio.get_running_loop()
    _accept_backoff(loop)

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
            budget=settings.budget,
            slots=settings.slots,
        )

    server = await loop.create_server(accept, host, port)
    bound = server.sockets[0].getsockname()[1]

    async def close() -> None:
        server.close()
        for task in list(connections):
            task.cancel()
        if connections:
            await asyncio.wait(set(connections), timeout=SHUTDOWN_TIMEOUT_S)
        await server.wait_closed()

    return Listener(name, bound, close)
