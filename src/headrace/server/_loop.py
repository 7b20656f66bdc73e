"""The one connection loop every front door runs: socket <-> sans-I/O <-> store.

Theory of operation. A protocol adapter is a ``ConnectionHandler``. It owns
the protocol's sans-I/O connection object. It turns received bytes into
events (``feed``), carries out one event against the store (``handle``) and
queues the replies; the loop writes what ``output`` hands it. The loop is
written once (``docs/architecture.md#front-doors``). A ``Connection`` is the
``asyncio.BufferedProtocol`` of one socket; it hands each transport callback
to the part it concerns:

* **Reading** (``_reader.Reader``): the kernel copies received bytes into the
  listener's one receive buffer. The same callback feeds them to the
  handler, whose sans-I/O buffer takes the only copy. No task wakes to read,
  and an idle connection holds no receive buffer. A handler must not keep
  the ``memoryview`` it is fed once ``feed``'s iteration ends. A handler
  holding a large frame received in part may offer a buffer of its own
  (``frame_buffer``); the kernel then writes the rest of the frame there.
* **Handling** (``_pipeline.Pipeline``): each event runs in its own task, so
  a parked read never stalls appends. Tasks start in arrival order, and each
  handler's first step runs before the next one's, so store calls issued
  before the first ``await`` keep the wire order. Events a handler marks
  ``sequential`` run one at a time, except ``pipelined`` ones (TANK
  produces), issued one behind the other. An ``inline`` event (a Pravega
  append) runs its first step in the receive callback itself
  (``_inline.start_inline``): an append the store acknowledges at once is
  read, handled and answered in one callback. At most
  ``MAX_PENDING_EVENTS`` events of a connection run at once; beyond that,
  reading pauses, so a client that outpaces the store is slowed by TCP.
* **Writing** (``_writer.Writer``): one path. Replies due together go out in
  one write (one syscall), at once when nothing is in the way. File regions
  go out with ``sendfile`` on plain TCP. A writer task does what may wait:
  regions, and draining, so a peer that does not read is slowed too.
  ``close`` flushes what is queued before closing.
* **Limits** (``ConnectionLimits``, ``--max-*`` options; ``_reader.Watchdog``
  and the writer): a frame still arriving may hold ``max_frame_bytes`` and
  must be complete within ``partial_frame_timeout_s``. Reply bytes the peer
  has not taken are bounded by ``max_buffered_bytes``. A connection that
  sends nothing for ``idle_timeout_s`` is closed, and so is one that sent no
  whole request within ``first_request_timeout_s``, where its front door
  sets one (TANK).
* **Server-wide budget** (``_budget.MemoryBudget``,
  ``--max-total-buffered-bytes``): every connection charges what it holds
  (a frame still arriving, replies not yet taken) to one budget. Once it is
  spent, a connection that holds bytes and receives more stops reading until
  it frees. One that holds nothing never waits. A paused half-received frame
  keeps its ``partial_frame_timeout_s``, so frames that never finish cannot
  keep the budget spent.
* **Accounting**: bytes each way and requests go to the listener's
  ``ConnectionObserver`` (metrics). One ``headrace.access`` line is logged
  when the connection closes, with why it closed.
* **TLS**: the supervising task does the server handshake
  (``loop.start_tls``, bounded), then the handler is made. A failed
  handshake is a logged close.
* **Errors**: a ``RemoteProtocolError`` from ``feed`` gets the handler's reply
  (``on_protocol_error``) written, then the connection is closed and logged.
  An exception in a handler closes this connection only, with one log line
  naming the event's type and size, never its bytes (a traceback only for
  what is not a ``HeadraceError`` or ``OSError``: a bug). Other connections
  and the store are untouched.
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
import logging
import ssl
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from headrace.errors import HeadraceError, RemoteProtocolError
from headrace.server._budget import BudgetAccount, MemoryBudget
from headrace.server._pipeline import Pipeline
from headrace.server._reader import Reader, Watchdog
from headrace.server._writer import CLOSE_FLUSH_TIMEOUT_S, Writer
from headrace.types import FileRegion

__all__ = [
    "IDLE_TIMEOUT_S",
    "MAX_BUFFERED_BYTES",
    "MAX_CONNECTIONS",
    "MAX_FRAME_BYTES",
    "MAX_PENDING_EVENTS",
    "PARTIAL_FRAME_TIMEOUT_S",
    "READ_CHUNK_BYTES",
    "TLS_HANDSHAKE_TIMEOUT_S",
    "Connection",
    "ConnectionHandler",
    "ConnectionLimits",
    "ConnectionObserver",
    "ConnectionSlots",
    "OutputPiece",
]

log = logging.getLogger(__name__)
access_log = logging.getLogger("headrace.access")

READ_CHUNK_BYTES = 256 * 1024
"""Bytes asked of the socket per read: big enough for a full append block in a few reads.
The size of a listener's one receive buffer, shared by all its connections (each read
is fed to its handler before the next read), so an idle connection holds none."""

MAX_PENDING_EVENTS = 256
"""Events of one connection being handled at once; reading pauses beyond it.
A Pravega connection multiplexes many writers and readers, each with a few
requests in flight; 256 covers that while bounding the memory one peer holds."""

IDLE_TIMEOUT_S = 600.0
"""A connection that sends nothing for this long is closed, unless its handler
says it is ``busy``. Every protocol we speak but RS-IO has keep-alives far more
frequent (Pravega 20 s, TANK pings, Beats acks)."""

MAX_CONNECTIONS = 4096
"""Connections per listener: under the usual 1024..65536 fd limits with room for
data files; each connection holds at most a bounded amount of memory."""

MAX_FRAME_BYTES = 64 * 1024 * 1024
"""Bytes of one frame still being received. Above every protocol's own frame limit
(Pravega 16 MiB append blocks, Lumberjack 32 MiB, TANK bundles under 64 MiB), so it
only catches a protocol without one; each codec refuses its own oversized frames."""

MAX_BUFFERED_BYTES = 128 * 1024 * 1024
"""Reply bytes handed to the socket that the peer has not taken. Front doors bound
what they queue themselves (Pravega 8 MiB of read replies, TANK 64 MiB of chunks);
a peer that stops reading beyond this is dropped instead of holding the memory."""

PARTIAL_FRAME_TIMEOUT_S = 60.0
"""Longest a frame may take to arrive once its first byte is in: a real client
sends a frame in one go (a 64 MiB frame at 10 Mbit/s takes under a minute), while
a client trickling a byte a minute would hold a connection and its buffer forever."""

TLS_HANDSHAKE_TIMEOUT_S = 10.0
"""Longest a TLS handshake may take: a few round trips for any real client, even
across continents; a peer that connects and stalls would otherwise hold a
connection slot (asyncio's own default is 60 s)."""


OutputPiece = bytes | bytearray | memoryview | FileRegion
"""What a handler's ``output`` hands the writer: bytes, or a region of a file."""

ERROR_REASONS = frozenset(
    {
        "protocol_error",
        "handler_error",
        "frame_too_large",
        "partial_frame_timeout",
        "header_timeout",
        "not_reading",
        "refused",
        "tls_failed",
        "access_denied",
    }
)
"""Close reasons that count as errors (``headrace_errors_total{kind=...}``)."""


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """What one connection (and one listener) may use; see each constant's reason.

    Attributes:
        max_connections: ``MAX_CONNECTIONS`` open at once per listener; more are
            closed at once.
        max_frame_bytes: ``MAX_FRAME_BYTES`` of one frame still being received.
        max_buffered_bytes: ``MAX_BUFFERED_BYTES`` of replies the peer has not taken.
        max_pending_requests: ``MAX_PENDING_EVENTS`` handled at once; reading pauses beyond.
        idle_timeout_s: ``IDLE_TIMEOUT_S`` without a byte from the peer.
        partial_frame_timeout_s: ``PARTIAL_FRAME_TIMEOUT_S`` for a frame to complete.
    """

    max_connections: int = MAX_CONNECTIONS
    max_frame_bytes: int = MAX_FRAME_BYTES
    max_buffered_bytes: int = MAX_BUFFERED_BYTES
    max_pending_requests: int = MAX_PENDING_EVENTS
    idle_timeout_s: float = IDLE_TIMEOUT_S
    partial_frame_timeout_s: float = PARTIAL_FRAME_TIMEOUT_S


class ConnectionObserver(Protocol):
    """Where a connection reports what it did (the metrics of its listener)."""

    def connection_opened(self) -> None: ...

    def connection_closed(self, reason: str) -> None: ...

    def connection_refused(self) -> None: ...

    def bytes_received(self, count: int) -> None: ...

    def bytes_sent(self, count: int) -> None: ...

    def request_received(self) -> None: ...


class ConnectionSlots:
    """Connections open across every listener, against what the open-file limit allows.

    Each connection is a descriptor; ``max_connections`` (None: no bound) is
    what ``ServerApp`` leaves for them once the store's files are set aside,
    so that accepting cannot starve the store of descriptors.
    """

    __slots__ = ("max_connections", "open")

    def __init__(self, max_connections: int | None = None) -> None:
        self.max_connections = max_connections
        self.open = 0

    def take(self) -> bool:
        """Count one more connection; False (nothing counted) if none is left."""
        if self.max_connections is not None and self.open >= self.max_connections:
            return False
        self.open += 1
        return True

    def release(self) -> None:
        self.open -= 1


class ConnectionHandler(abc.ABC):
    """The protocol-specific half of one connection.

    ``wake_writer`` is set by the loop before the first call; call it after
    queueing output outside ``handle`` (e.g. from a timer or a subscription).
    """

    name: str = "connection"
    wake_writer: Callable[[], None] = staticmethod(lambda: None)
    close_connection: Callable[[str], None] = staticmethod(lambda reason: None)
    """Set by the loop before ``on_start``: take no more bytes and close the
    connection once what is queued is sent (the protocol ended it: an HTTP
    ``Connection: close``, a timeout of its own); ``reason`` goes to the access line."""
    sendfile_ok: bool = False
    """Set by the loop before ``on_start``: the connection is plain TCP, so
    ``FileRegion`` pieces go out with ``sendfile``; on TLS they would be read
    and copied, so handlers ask the store for bytes instead."""
    budget: MemoryBudget | None = None
    """Set by the loop before ``on_start``: the server's budget of buffered bytes
    (None: no bound on the sum). A handler that reads data for the peer on its
    own (a subscription, a long read) may hold back while it is ``spent``."""
    peer: object = None
    """Set by the loop before ``on_start``: the peer's address (``getpeername()``)."""
    peer_cert: dict[str, object] | None = None
    """Set by the loop before ``on_start``: the peer's TLS certificate as
    ``getpeercert()`` gives it, verified against ``--tls-ca``; None (or empty)
    when it presented none (who it is: ``server/authz.py``)."""

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

    def output(self) -> list[OutputPiece]:
        """Everything queued for the peer, in order (and forget it).

        The default is ``data_to_send``'s bytes. Handlers that send file
        regions or large buffers without copying them override it; the loop
        closes every region it is handed, sent or not.
        """
        data = self.data_to_send()
        return [data] if data else []

    def sequential(self, event: object) -> bool:
        """Whether ``event`` must wait for the events before it to finish."""
        return False

    def pipelined(self, event: object) -> bool:
        """Whether a ``sequential`` event may start behind an earlier pipelined one
        before that one finished (asked only for sequential events).

        For appends a client pipelines: each is issued while the ones before
        it wait for their sync, so one sync serves them all. The handler must
        keep their order itself: issue the store call in the first step, or
        make the later ones wait for an earlier one that suspended before it.
        """
        return False

    def inline(self, event: object) -> bool:
        """Whether ``handle(event)`` may start in the read loop itself.

        The loop then runs the handler's first step at once (no task, no
        event-loop round) and makes a task of the rest only if it suspends;
        a small append that the store acknowledges without waiting is handled
        and answered in the round that read it. Only for handlers that use
        neither ``asyncio.current_task`` nor ``asyncio.timeout`` before their
        first suspension (that step runs in the connection's own task).
        """
        return False

    def on_protocol_error(self, exc: RemoteProtocolError) -> None:
        """Queue the protocol's error reply for ``exc``, if it has one."""
        return None

    def on_start(self) -> None:
        """Called once, before any data is read (e.g. to queue a greeting)."""
        return None

    def frame_buffer(self) -> memoryview | None:
        """Where the next received bytes should land, or None for the listener's buffer.

        A handler holding a large frame received in part returns the
        writable rest of a buffer of the frame's size: the kernel then writes
        the frame's remaining bytes where they will be decoded, and the loop
        reports them with ``frame_received`` instead of ``feed``. The view
        is asked for before each receive, so a handler may return None again
        once the frame is whole.
        """
        return None

    def frame_received(self, nbytes: int) -> Iterable[object]:
        """``nbytes`` landed at the start of the view ``frame_buffer`` gave; the
        complete events, as ``feed`` yields them."""
        raise NotImplementedError("frame_received without a frame_buffer")

    def partial_frame_bytes(self) -> int:
        """Bytes of a frame received in part and held until the rest arrives (0: none).

        The loop closes the connection when this exceeds ``max_frame_bytes`` or
        stays above 0 for longer than ``partial_frame_timeout_s``. Protocols that
        cannot tell return 0 (then only the idle timeout applies).
        """
        return 0

    def queued_bytes(self) -> int:
        """Bytes of replies the handler holds that the loop has not taken yet.

        Counted against the server's budget with the frame still arriving and
        the transport's unsent bytes; looked at after every receive and write.
        """
        return 0

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


class Connection(asyncio.BufferedProtocol):
    """One accepted connection: the transport's callbacks, its parts, and a supervising task.

    The transport calls this object; it hands each call to the part it
    concerns (``Reader``, ``Watchdog``, ``Pipeline``, ``Writer``, the
    ``BudgetAccount``) and holds what they share: the handler, the
    transport, the close reason and the counts of the access line.

    The receive path runs in one transport callback (``buffer_updated``):
    the bytes land (``Reader``), their events start (``Pipeline``) while
    their replies are held for one write at the end (``Writer.hold``), then
    the frame still arriving is checked (``Watchdog``) and the budget is
    told what the connection holds (it may pause reading). Nothing may keep
    a view of the shared receive buffer once the callback returns.

    The supervising task (``serve``) does what may wait: the TLS handshake,
    letting handlers finish, flushing replies and closing. The listener
    cancels it to shut down.

    Args:
        make_handler: builds the connection's ``ConnectionHandler`` (after the
            TLS handshake, if any).
        receive_buffer: the listener's shared receive buffer.
        limits: the connection limits.
        registry: the listener's open connections (their supervising tasks);
            a connection beyond ``limits.max_connections`` is refused.
        idle_timeout_s, max_pending_events: override ``limits`` when given.
        observer: where bytes, requests and closes are counted.
        listener: the protocol's name in the access line and logs.
        first_request_timeout_s: close the connection if no whole request has
            arrived this long after it opened (None: no such limit).
        ssl_context, tls_handshake_timeout_s: serve TLS, with this bound on
            the handshake.
        budget: the server's budget of buffered bytes (None: no bound on the sum).
        slots: connections of every listener, against the open-file limit
            (None: only ``limits.max_connections`` per listener).
    """

    __slots__ = (
        "_account",
        "_clock",
        "_closed",
        "_counts",
        "_ended",
        "_handler",
        "_listener",
        "_loop",
        "_lost",
        "_make_handler",
        "_max_connections",
        "_observer",
        "_opened_at",
        "_peer",
        "_pipeline",
        "_reader",
        "_reason",
        "_registry",
        "_slots",
        "_ssl_context",
        "_tls_handshake_timeout_s",
        "_transport",
        "_watchdog",
        "_writer",
    )

    def __init__(
        self,
        make_handler: Callable[[], ConnectionHandler],
        receive_buffer: memoryview,
        *,
        limits: ConnectionLimits,
        registry: set[asyncio.Task[None]],
        idle_timeout_s: float | None = None,
        max_pending_events: int | None = None,
        observer: ConnectionObserver | None = None,
        listener: str = "connection",
        first_request_timeout_s: float | None = None,
        ssl_context: ssl.SSLContext | None = None,
        tls_handshake_timeout_s: float = TLS_HANDSHAKE_TIMEOUT_S,
        budget: MemoryBudget | None = None,
        slots: ConnectionSlots | None = None,
    ) -> None:
        self._make_handler = make_handler
        self._registry = registry
        self._slots = slots
        self._max_connections = limits.max_connections
        self._observer = observer
        self._listener = listener
        self._ssl_context = ssl_context
        self._tls_handshake_timeout_s = tls_handshake_timeout_s
        loop = self._loop = asyncio.get_running_loop()
        self._clock = loop.time
        self._opened_at = self._clock()
        self._transport: asyncio.Transport | None = None
        self._handler: ConnectionHandler | None = None
        self._peer: object = None
        self._ended: asyncio.Future[None] = loop.create_future()  # receiving stopped
        self._closed: asyncio.Future[None] = loop.create_future()  # the transport closed
        self._lost = False
        self._reason = ""
        self._counts = {"requests": 0, "bytes_in": 0, "bytes_out": 0}
        self._account = BudgetAccount(budget, self._held_bytes)
        self._reader = Reader(receive_buffer)
        self._watchdog = Watchdog(
            loop,
            self._reader,
            limits,
            idle_timeout_s=limits.idle_timeout_s if idle_timeout_s is None else idle_timeout_s,
            opened_at=self._opened_at,
            first_request_timeout_s=first_request_timeout_s,
            counts=self._counts,
            end=self._end,
        )
        self._writer = Writer(
            loop,
            max_buffered_bytes=limits.max_buffered_bytes,
            sent=self._sent,
            recharge=self._account.update,
            end=self._abort,
        )
        self._pipeline = Pipeline(
            loop,
            self._reader,
            self._writer,
            max_pending=(
                limits.max_pending_requests if max_pending_events is None else max_pending_events
            ),
            counts=self._counts,
            observer=observer,
            protocol_error=self._protocol_error,
            handler_failed=self._handler_failed,
        )

    # ------------------------------------------------------------ transport callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._peer = transport.get_extra_info("peername")
        slots = self._slots
        if len(self._registry) >= self._max_connections:
            why = f"{len(self._registry)} connections open"
        elif slots is not None and not slots.take():
            why = f"{slots.open} connections open in all, what the open-file limit allows"
        else:
            why = ""
        if why:
            log.warning("%s: refusing %s: %s", self._listener, self._peer, why)
            transport.close()
            if self._observer is not None:
                self._observer.connection_refused()
            log_access(self._listener, self._peer, {}, 0.0, "refused")
            return
        if self._ssl_context is not None:
            transport.pause_reading()  # the ClientHello is for the TLS layer, not the handler
        else:
            self._start(transport)
        task = self._loop.create_task(self.serve(), name=f"{self._listener}-connection")
        self._registry.add(task)
        task.add_done_callback(self._registry.discard)
        if slots is not None:
            task.add_done_callback(lambda _: slots.release())

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._reader.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        reader = self._reader
        if reader.receiving:
            self._received(nbytes, reader.landed(nbytes))
        elif self._handler is None:
            reader.keep_early(nbytes)

    def eof_received(self) -> bool:
        if self._handler is None:
            self._reader.early_eof = True  # TLS, before the handler's start (see keep_early)
            return False
        if self._reader.receiving:
            self._pipeline.feed(b"")
            self._end("eof")
        # Plain TCP: keep the write side open, so a client that half-closes after
        # its last request still gets its replies (TLS cannot keep it open).
        return self._ssl_context is None

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._end("connection_error" if exc is not None else "closed")
        self._writer.lost()
        if not self._closed.done():
            self._closed.set_result(None)
        self._writer.wake()

    def pause_writing(self) -> None:
        self._writer.pause()

    def resume_writing(self) -> None:
        self._writer.resume()

    # ------------------------------------------------------------ receiving

    def _start(self, transport: asyncio.Transport) -> None:
        """Set the handler up on ``transport`` (plain, or TLS after the handshake)."""
        self._transport = transport
        handler = self._handler = self._make_handler()
        handler.wake_writer = self._writer.wake
        handler.budget = self._account.budget
        handler.close_connection = self._close_by_handler
        sock = transport.get_extra_info("socket")
        handler.sendfile_ok = (
            transport.get_extra_info("sslcontext") is None
            and transport.get_extra_info("ssl_object") is None  # however TLS was started
            and sock is not None
        )
        handler.peer = self._peer
        handler.peer_cert = transport.get_extra_info("peercert")
        if self._observer is not None:
            self._observer.connection_opened()
        early = self._reader.start(handler, transport)
        self._watchdog.start(handler, self._peer)
        self._pipeline.start(handler)
        handler.on_start()
        self._writer.start(handler, transport, self._peer)
        if early:
            self._received(len(early), early)
        if self._reader.early_eof and self._reader.receiving:
            self.eof_received()

    def _received(self, nbytes: int, data: bytes | memoryview | None) -> None:
        """``nbytes`` received: ``data``, or (None) into the handler's ``frame_buffer``."""
        self._watchdog.last_received = self._clock()
        self._counts["bytes_in"] += nbytes
        if self._observer is not None:
            self._observer.bytes_received(nbytes)
        writer = self._writer
        writer.hold()
        try:
            self._pipeline.feed(data, nbytes)
        finally:
            writer.release()
        reader = self._reader
        if not reader.receiving:
            return
        self._watchdog.received()
        account = self._account
        budget = account.budget
        if budget is not None:
            account.update()
            if account.held_bytes and budget.spent and reader.receiving:
                reader.pause("budget")  # holding bytes while the budget is spent
                account.wait(self._budget_resume)

    def _budget_resume(self) -> None:
        self._watchdog.last_received = self._clock()  # the wait was ours, not the peer's idleness
        self._reader.resume("budget")

    def _held_bytes(self) -> int:
        """What the connection holds, for the budget: the frame still arriving,
        the replies its handler holds and the bytes the transport holds for the peer."""
        held = 0
        handler = self._handler
        if handler is not None:
            held = handler.queued_bytes()
            if self._reader.receiving:
                held += handler.partial_frame_bytes()
        transport = self._transport
        if transport is not None and not self._lost:
            held += transport.get_write_buffer_size()
        return held

    def _sent(self, count: int) -> None:
        self._counts["bytes_out"] += count
        if self._observer is not None and count:
            self._observer.bytes_sent(count)

    # ------------------------------------------------------------ ending

    def _close_reason(self, why: str) -> None:
        if not self._reason:
            self._reason = why

    def _end(self, reason: str) -> None:
        """Take no more bytes, for ``reason`` (the first one given is logged);
        the supervising task winds the connection up."""
        self._close_reason(reason)
        self._stop_receiving()

    def _abort(self, reason: str) -> None:
        """``_end``, and drop what the transport still holds for the peer."""
        self._end(reason)
        if self._transport is not None:
            self._transport.abort()

    def _stop_receiving(self) -> None:
        self._reader.stop()
        self._watchdog.stop()
        self._pipeline.stop(at_eof=self._reason == "eof")
        if not self._ended.done():
            self._ended.set_result(None)

    def _close_by_handler(self, reason: str) -> None:
        """The handler's ``close_connection``: stop receiving; ``serve`` flushes and closes."""
        if self._reader.receiving:
            self._end(reason)

    def _protocol_error(self, exc: RemoteProtocolError) -> None:
        """The peer broke the protocol: write the handler's reply, then close."""
        assert self._handler is not None
        reason = exc.close_reason
        self._close_reason(reason)
        log.warning(
            "%s %s: %s, closing: %s", self._handler.name, self._peer, reason.replace("_", " "), exc
        )
        self._handler.on_protocol_error(exc)
        self._stop_receiving()
        self._writer.flush()

    def _handler_failed(self, event: object, exc: Exception) -> None:
        """Handling ``event`` raised: close this connection only, with one line
        that never holds the event's bytes (a traceback only for a bug)."""
        assert self._handler is not None
        self._close_reason("handler_error")
        log.error(
            "%s %s: handling %s failed; closing: %s: %s",
            self._handler.name,
            _address(self._peer),
            describe_event(event),
            type(exc).__name__,
            exc,
            exc_info=not isinstance(exc, HeadraceError | OSError),
        )
        self._stop_receiving()
        if self._transport is not None:
            self._transport.abort()

    # ------------------------------------------------------------ the supervising task

    async def serve(self) -> None:
        """Handshake, and the orderly end of the connection."""
        try:
            if self._ssl_context is not None and not await self._handshake(self._ssl_context):
                return
            try:
                await self._watch()
                # Let handlers of what was received finish (a client that half-closes
                # after its last request still gets its replies), unless the peer is gone.
                pipeline = self._pipeline
                while pipeline.running and not self._lost:
                    await pipeline.progress()
            except asyncio.CancelledError:
                self._close_reason("shutdown")
                raise
            finally:
                await self._wind_up()
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("%s: connection %s failed", self._listener, self._peer)

    async def _handshake(self, ssl_context: ssl.SSLContext) -> bool:
        """Do the server side of a TLS handshake; True when the connection speaks TLS.

        A failed handshake (a plaintext client, no or a wrong client certificate,
        a stall past the bound) closes the connection, logged and counted.
        """
        transport = self._transport
        assert transport is not None
        started_at = self._clock()
        try:
            tls = await self._loop.start_tls(
                transport,
                self,
                ssl_context,
                server_side=True,
                ssl_handshake_timeout=self._tls_handshake_timeout_s,
            )
        except asyncio.CancelledError:
            transport.abort()
            raise
        except Exception as exc:  # ssl.SSLError, a reset, the timeout: all the peer's doing
            log.warning(
                "%s: TLS handshake with %s failed: %s", self._listener, _address(self._peer), exc
            )
            transport.abort()
            if self._observer is not None:
                self._observer.connection_opened()
                self._observer.connection_closed("tls_failed")
            log_access(self._listener, self._peer, {}, self._clock() - started_at, "tls_failed")
            return False
        if tls is None or self._lost:  # closed during the handshake
            transport.abort()
            return False
        self._start(tls)
        return True

    async def _watch(self) -> None:
        """Wait until receiving stops (EOF, an error, a limit, a timer), then stop reading."""
        await self._ended
        if self._transport is not None and not self._lost:
            self._transport.pause_reading()

    async def _wind_up(self) -> None:
        """Cancel what still runs, flush replies, close, and log the access line.

        Every step runs even if the task is cancelled meanwhile (the listener
        shutting down): the handler's ``on_close`` releases its sessions and
        the transport is closed; the cancellation is raised again at the end.
        """
        cancelled = await self._pipeline.cancel()
        cancelled = await self._writer.close(cancelled)
        self._close_reason("closed")  # the writer stopped: the peer went away
        handler = self._handler
        try:
            if handler is not None:
                await handler.on_close()
        except asyncio.CancelledError:
            cancelled = True
        finally:
            transport = self._transport
            if transport is not None:
                transport.close()
                if cancelled or self._closed.done():
                    transport.abort()
                else:
                    try:
                        await asyncio.wait_for(asyncio.shield(self._closed), CLOSE_FLUSH_TIMEOUT_S)
                    except asyncio.CancelledError:
                        cancelled = True
                        transport.abort()
                    except TimeoutError:  # the peer takes nothing: give up on the flush
                        transport.abort()
            self._account.close()
            if self._observer is not None:
                self._observer.connection_closed(self._reason)
            log_access(
                self._listener,
                self._peer,
                self._counts,
                self._clock() - self._opened_at,
                self._reason,
            )
        if cancelled:
            raise asyncio.CancelledError


def describe_event(event: object) -> str:
    """An event's type and the sizes of its byte fields, for a log line: never its bytes.

    Events carry payloads (appends, bundles, table values) whose bytes must
    not reach the log; their sizes say as much as an operator needs.
    """
    name = type(event).__name__
    if not dataclasses.is_dataclass(event):
        return name
    sizes = [
        f"{f.name}={len(value)} bytes"
        for f in dataclasses.fields(event)
        if isinstance(value := getattr(event, f.name, None), bytes | bytearray | memoryview)
    ]
    return f"{name} ({', '.join(sizes)})" if sizes else name


def _address(peer: object) -> str:
    return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else str(peer)


def log_access(
    protocol: str, peer: object, counts: dict[str, int], duration_s: float, reason: str
) -> None:
    """The one ``headrace.access`` line of a closed connection (fields also as ``extra``)."""
    address = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else str(peer)
    access_log.info(
        "%s %s requests=%d bytes_in=%d bytes_out=%d duration_s=%.3f reason=%s",
        protocol,
        address,
        counts.get("requests", 0),
        counts.get("bytes_in", 0),
        counts.get("bytes_out", 0),
        duration_s,
        reason,
        extra={
            "protocol": protocol,
            "peer": address,
            "requests": counts.get("requests", 0),
            "bytes_in": counts.get("bytes_in", 0),
            "bytes_out": counts.get("bytes_out", 0),
            "duration_s": round(duration_s, 3),
            "reason": reason,
        },
    )
