"""The one connection loop every front door runs: socket <-> sans-I/O <-> store.

Theory of operation. A protocol adapter is a ``ConnectionHandler``: it owns
the protocol's sans-I/O connection object, turns received bytes into events
(``feed``), carries out one event against the store (``handle``), and queues
replies inside the sans-I/O object; the loop writes whatever
``data_to_send`` returns. The loop is written once (STYLE.md rule 4):

* **Reading** stops while ``MAX_PENDING_EVENTS`` events of this connection
  are being handled, so a client that sends faster than the store answers
  is slowed by TCP, not buffered without bound.
* **Handling** runs each event in its own task, so one parked read (a
  long-poll at the tail) never stalls appends on the same connection. Tasks
  are started in arrival order and a handler's first step runs before any
  later task's, so a handler that issues its store call before its first
  ``await`` keeps the wire order (the store fixes an append's offset when
  it is issued). Handlers whose events must be serialised say so with
  ``sequential`` and are run one at a time, in order.
* **Writing** happens in a writer task woken by ``wake_writer``; it drains
  the transport, so a peer that does not read is slowed too, and ``close``
  flushes what is queued before closing.
* **Errors**: a ``RemoteProtocolError`` from ``feed`` gets the handler's
  reply (``on_protocol_error``) written, then the connection is closed and
  logged. An unexpected exception in a handler closes this connection only
  (logged with its traceback); other connections and the store are untouched.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable

from headrace.errors import RemoteProtocolError

__all__ = [
    "IDLE_TIMEOUT_S",
    "MAX_PENDING_EVENTS",
    "READ_CHUNK_BYTES",
    "ConnectionHandler",
    "run_connection",
]

log = logging.getLogger(__name__)

READ_CHUNK_BYTES = 256 * 1024
"""Bytes asked of the socket per read: big enough for a full append block in a few reads."""

MAX_PENDING_EVENTS = 256
"""Events of one connection being handled at once; reading pauses beyond it.
A Pravega connection multiplexes many writers and readers, each with a few
requests in flight; 256 covers that while bounding the memory one peer holds."""

IDLE_TIMEOUT_S = 600.0
"""A connection that sends nothing for this long is closed, unless its handler
says it is ``busy``. Every protocol we speak but RS-IO has keep-alives far more
frequent (Pravega 20 s, TANK pings, Beats acks)."""

CLOSE_FLUSH_TIMEOUT_S = 10.0
"""How long closing waits for queued replies to reach a peer that is not reading."""


class ConnectionHandler(abc.ABC):
    """The protocol-specific half of one connection.

    ``wake_writer`` is set by the loop before the first call; call it after
    queueing output outside ``handle`` (e.g. from a timer or a subscription).
    """

    name: str = "connection"
    wake_writer: Callable[[], None] = staticmethod(lambda: None)

    @abc.abstractmethod
    def feed(self, data: bytes) -> Iterable[object]:
        """Give received bytes (``b""`` = EOF) to the sans-I/O object; yield complete events.

        A generator is welcome: the events before a protocol error are handled,
        then the error (raised while iterating) closes the connection.

        Raises:
            RemoteProtocolError: the peer broke the protocol.
        """

    @abc.abstractmethod
    async def handle(self, event: object) -> None:
        """Carry out one event; queue replies in the sans-I/O object."""

    @abc.abstractmethod
    def data_to_send(self) -> bytes:
        """Bytes queued for the peer (and forget them)."""

    def sequential(self, event: object) -> bool:
        """Whether ``event`` must wait for the events before it to finish."""
        return False

    def on_protocol_error(self, exc: RemoteProtocolError) -> None:
        """Queue the protocol's error reply for ``exc``, if it has one."""
        return None

    def on_start(self) -> None:
        """Called once, before any data is read (e.g. to queue a greeting)."""
        return None

    def busy(self) -> bool:
        """Whether the connection is in use although the peer sends nothing.

        Checked when the idle timeout runs out: a busy connection is kept
        open (e.g. it holds open subscriptions in a protocol without
        keep-alives, where a subscriber may legitimately wait for days).
        """
        return False

    async def on_close(self) -> None:
        """Release what the connection holds (sessions, subscriptions)."""
        return None


async def run_connection(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    handler: ConnectionHandler,
    *,
    idle_timeout_s: float = IDLE_TIMEOUT_S,
    max_pending_events: int = MAX_PENDING_EVENTS,
) -> None:
    """Serve one connection until EOF, a protocol error, idle timeout or cancellation."""
    peer = writer.get_extra_info("peername")
    wake = asyncio.Event()
    closing = False
    handler.wake_writer = wake.set
    slots = asyncio.Semaphore(max_pending_events)
    tasks: set[asyncio.Task[None]] = set()
    previous: asyncio.Task[None] | None = None  # the last sequential event's task

    async def write_loop() -> None:
        while True:
            await wake.wait()
            wake.clear()
            data = handler.data_to_send()
            if data:
                writer.write(data)
                await writer.drain()
            if closing:
                if not data:
                    return
                wake.set()  # look again: writing may have let more replies in

    async def run_event(event: object, after: asyncio.Task[None] | None) -> None:
        try:
            if after is not None:
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await asyncio.shield(after)
            await handler.handle(event)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s %s: handling %s failed; closing", handler.name, peer, event)
            writer.transport.abort()
        finally:
            slots.release()
            wake.set()

    writer_task = asyncio.create_task(write_loop(), name=f"{handler.name}-writer")
    try:
        handler.on_start()
        wake.set()
        while not writer_task.done():
            try:
                data = await asyncio.wait_for(reader.read(READ_CHUNK_BYTES), idle_timeout_s)
            except TimeoutError:
                if handler.busy():
                    continue
                log.info("%s %s: idle for %.0f s; closing", handler.name, peer, idle_timeout_s)
                break
            except ConnectionError:
                break
            try:
                for event in handler.feed(data):
                    await slots.acquire()
                    after = previous if handler.sequential(event) else None
                    task = asyncio.create_task(run_event(event, after))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                    if handler.sequential(event):
                        previous = task
            except RemoteProtocolError as exc:
                log.warning("%s %s: protocol error, closing: %s", handler.name, peer, exc)
                handler.on_protocol_error(exc)
                break
            if not data:
                break
        # Let handlers of what was received finish (a client that half-closes
        # after its last request still gets its replies).
        if tasks:
            await asyncio.wait(set(tasks))
    finally:
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        closing = True
        wake.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(writer_task, CLOSE_FLUSH_TIMEOUT_S)
        writer_task.cancel()
        with contextlib.suppress(BaseException):
            await writer_task
        try:
            await handler.on_close()
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
