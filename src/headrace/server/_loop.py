"""The one connection loop every front door runs: socket <-> sans-I/O <-> store.

Theory of operation. A protocol adapter is a ``ConnectionHandler``: it owns
the protocol's sans-I/O connection object, turns received bytes into events
(``feed``), carries out one event against the store (``handle``), and queues
replies inside the sans-I/O object; the loop writes whatever
``data_to_send`` returns. The loop is written once (``docs/architecture.md#front-doors``), as an
``asyncio.BufferedProtocol`` (``Connection``) and one supervising task:

* **Receiving**: the kernel copies received bytes into the listener's one
  receive buffer (``READ_CHUNK_BYTES``, shared by its connections), and
  the same callback feeds them to the handler, whose sans-I/O buffer takes
  its only copy, and starts the events that come out. No task wakes to
  read, and an idle connection holds no receive buffer. A handler must not
  keep the ``memoryview`` it is fed once ``feed``'s iteration ends. A
  handler holding a large frame received in part may offer a buffer of its
  own (``frame_buffer``): the kernel then writes the rest of the frame there
  and the loop reports it with ``frame_received``, so those bytes are copied
  only by the kernel.
* **Reading** pauses while ``MAX_PENDING_EVENTS`` events of this connection
  are being handled, so a client that sends faster than the store answers
  is slowed by TCP, not buffered without bound (the events of the read that
  reached the limit wait in a backlog).
* **Handling** runs each event in its own task, so one parked read (a
  long-poll at the tail) never stalls appends on the same connection. Tasks
  are started in arrival order and a handler's first step runs before any
  later task's, so a handler that issues its store call before its first
  ``await`` keeps the wire order (the store fixes an append's offset when
  it is issued). Handlers whose events must be serialised say so with
  ``sequential`` and are run one at a time, in order. An event its handler
  marks ``inline`` (a Pravega append) skips the task: its first step runs
  in the receive callback at once, and only if it suspends is the rest
  handed to a task (``_inline.start_inline``), so an append the store acknowledges
  without waiting is read, handled and answered in one callback.
* **Writing** happens in a writer task woken by ``wake_writer``; it drains
  the transport, so a peer that does not read is slowed too, and ``close``
  flushes what is queued before closing. When an event finishes while that
  task is idle and the replies are plain bytes, they are written to the
  transport at once (``write_now``), or at the end of the receive callback
  for events that finished inside it, or after the callbacks ready at the
  time when other events of the connection are still being handled
  (``write_soon``), so replies that are due together go out in one write
  (one syscall); the writer is woken only if the peer has not taken them all
  (to drain and check the limit). A handler's ``output`` is a list of
  pieces written in order: bytes (large ones written as they are, never
  joined or copied) and ``FileRegion``s, which go out with ``sendfile``
  from the store's data file (zero-copy) on a plain TCP connection
  (``sendfile_ok``) and are read and written on a TLS one. Every region is
  closed once sent or when the connection ends before it could be.
* **Limits** (``ConnectionLimits``, ``--max-*`` options): a frame still
  arriving may hold at most ``max_frame_bytes`` and must be complete within
  ``partial_frame_timeout_s`` of its first byte (the handler says how many
  bytes of a frame it holds: ``partial_frame_bytes``); reply bytes the peer
  has not taken are bounded by ``max_buffered_bytes``; a connection that
  sends nothing for ``idle_timeout_s`` is closed, and so is one that has
  not sent a whole request within ``first_request_timeout_s`` of opening,
  where its front door sets one (TANK, as the TANK broker does).
* **Server-wide budget** (``MemoryBudget``, ``--max-total-buffered-bytes``):
  every connection charges what it holds (the bytes of a frame still
  arriving, as ``partial_frame_bytes`` reports them, replies its handler
  holds, ``queued_bytes``, and reply bytes the transport holds for the peer)
  to one budget shared by every listener.
  Once the total is over it, a connection that holds bytes and receives
  more stops reading until the total is back under it; one that holds
  nothing (a ``/health`` probe, a small request answered at once) never
  waits. A connection paused with a frame half received keeps its
  ``partial_frame_timeout_s``, so the budget cannot stay spent by frames
  that never finish.
* **Accounting**: bytes each way and requests (events) are reported to the
  listener's ``ConnectionObserver`` (metrics), and one ``headrace.access``
  line is logged when the connection closes, with why it closed.
* **TLS**: the supervising task does the server handshake (``loop.start_tls``,
  bounded), then the handler is made; a failed handshake is a logged close.
* **Errors**: a ``RemoteProtocolError`` from ``feed`` gets the handler's
  reply (``on_protocol_error``) written, then the connection is closed and
  logged. An exception in a handler closes this connection only, with one
  log line naming the event's type and size, never its bytes (a traceback
  only for what is not a ``HeadraceError`` or ``OSError``: a bug); other
  connections and the store are untouched.
"""

from __future__ import annotations

import abc
import asyncio
import collections
import contextlib
import contextvars
import dataclasses
import logging
import os
import ssl
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol, cast

from headrace.errors import HeadraceError, RemoteProtocolError
from headrace.server._budget import MemoryBudget
from headrace.server._inline import start_inline
from headrace.types import FileRegion

__all__ = [
    "IDLE_TIMEOUT_S",
    "LISTENER_SETTINGS",
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
    "ListenerSettings",
    "MemoryBudget",
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


JOIN_BELOW_BYTES = 64 * 1024
"""Adjacent output pieces smaller than this are joined into one write (one
syscall); larger ones are written as they are, so a megabyte of read data is
never copied to be framed."""

OutputPiece = bytes | bytearray | memoryview | FileRegion
"""What a handler's ``output`` hands the writer: bytes, or a region of a file."""

CLOSE_FLUSH_TIMEOUT_S = 10.0
"""How long closing waits for queued replies to reach a peer that is not reading."""

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


@dataclass(frozen=True, slots=True)
class ListenerSettings:
    """Limits and metrics for the listeners being started (see ``LISTENER_SETTINGS``)."""

    limits: ConnectionLimits = field(default_factory=ConnectionLimits)
    observer_for: Callable[[str], ConnectionObserver] | None = None
    """Listener name -> its observer; None: nothing is counted."""
    budget: MemoryBudget | None = None
    """The server's budget of buffered bytes; None: no bound on the sum."""
    slots: ConnectionSlots | None = None
    """Connections of every listener, against the open-file limit; None: no bound."""


LISTENER_SETTINGS: contextvars.ContextVar[ListenerSettings] = contextvars.ContextVar(
    "LISTENER_SETTINGS",
    default=ListenerSettings(),  # noqa: B039 (frozen: never mutated)
)
"""Set by ``ServerApp`` while it starts a listener, read once by ``start_tcp_listener``,
so that every front door gets the configured limits and metrics without passing them."""


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


def _finished(task: asyncio.Task[None] | None) -> bool:
    return task is None or task.done()


class Connection(asyncio.BufferedProtocol):
    """One accepted connection: the transport's callbacks and a supervising task.

    Received bytes land in the listener's receive buffer (``get_buffer``) and
    are fed to the handler in the same callback (``buffer_updated``); the
    events that come out are started there too, an ``inline`` one's first
    step included. A small request is thus read, handled and answered in one
    event-loop callback, with no task woken to read it and no copy of the
    bytes before the handler's own buffer. The receive buffer is shared by
    every connection of the listener, so nothing may hold a view of it once
    ``buffer_updated`` returns: a feed still yielding events when the
    pending-event limit is reached is drained into a backlog at once, and
    reading pauses until the backlog is handled.

    The supervising task (``serve``) does what may wait: the TLS handshake,
    the idle, partial-frame and first-request timers, letting handlers finish,
    flushing replies and closing. The listener cancels it to shut down.

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
        self._budget = budget
        self._charged = 0  # bytes this connection last reported to the budget
        self._released = False  # it reported its end: it reports nothing more
        self._slots = slots
        self._paused_for: set[str] = set()  # why reading is paused: "backlog", "budget"
        self._receive_buffer = receive_buffer
        self._limits = limits
        self._registry = registry
        self._idle_s = limits.idle_timeout_s if idle_timeout_s is None else idle_timeout_s
        self._pending_max = (
            limits.max_pending_requests if max_pending_events is None else max_pending_events
        )
        self._observer = observer
        self._listener = listener
        self._first_request_timeout_s = first_request_timeout_s
        self._ssl_context = ssl_context
        self._tls_handshake_timeout_s = tls_handshake_timeout_s
        self._loop = asyncio.get_running_loop()
        self._clock = self._loop.time
        self._opened_at = self._clock()
        self._last_received = self._opened_at
        self._first_request_by = (
            None if first_request_timeout_s is None else self._opened_at + first_request_timeout_s
        )
        self._partial_timer: asyncio.TimerHandle | None = None  # runs while a frame arrives
        self._idle_timer: asyncio.TimerHandle | None = None
        self._first_request_timer: asyncio.TimerHandle | None = None
        self._transport: asyncio.Transport | None = None
        self._handler: ConnectionHandler | None = None
        self._peer: object = None
        self._ended: asyncio.Future[None] = self._loop.create_future()
        self._early = bytearray()  # bytes received before the handler started (TLS)
        self._early_eof = False
        self._direct = False  # the last get_buffer gave the handler's frame_buffer
        self._receiving = False  # the handler is set up and takes bytes
        self._lost = False
        self._reason = ""
        self._counts = {"requests": 0, "bytes_in": 0, "bytes_out": 0}
        self._pending = 0  # events being handled
        self._tasks: set[asyncio.Task[None]] = set()
        self._previous: asyncio.Task[None] | None = None  # the last sequential event's task
        self._unstarted = False  # a task made for an event has not run its first step yet
        self._backlog: collections.deque[object] = collections.deque()
        self._backlog_error: RemoteProtocolError | None = None
        self._backlog_scheduled = False
        self._wake = asyncio.Event()
        self._closing = False
        self._writing = False  # the writer task is sending or draining
        self._carry: list[OutputPiece] = []  # output taken by write_now that the writer must send
        self._writer_task: asyncio.Task[None] | None = None
        self._feeding = False  # in _feed: replies wait for the end of the read
        self._reply_waiting = False  # a reply is queued for the end of the read
        self._flush_scheduled = False  # _flush_soon is scheduled
        self._write_paused = False
        self._drain_waiter: asyncio.Future[None] | None = None
        self._closed: asyncio.Future[None] = self._loop.create_future()

    # ------------------------------------------------------------ transport callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._peer = transport.get_extra_info("peername")
        slots = self._slots
        if len(self._registry) >= self._limits.max_connections:
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
        handler = self._handler
        if handler is not None and self._receiving:
            direct = handler.frame_buffer()
            if direct is not None:
                self._direct = True
                return direct
        self._direct = False
        return self._receive_buffer

    def buffer_updated(self, nbytes: int) -> None:
        if self._handler is None:
            # TLS: the peer's first bytes can arrive in the round between the end of
            # the handshake and the handler's start; they are kept for it.
            self._early += self._receive_buffer[:nbytes]
            return
        if self._receiving:
            if self._direct:
                self._direct = False
                self._received(nbytes, None)
            else:
                self._received(nbytes, self._receive_buffer[:nbytes])

    def _received(self, nbytes: int, data: bytes | memoryview | None) -> None:
        """``nbytes`` received: ``data``, or (None) into the handler's ``frame_buffer``."""
        self._last_received = self._clock()
        self._counts["bytes_in"] += nbytes
        if self._observer is not None:
            self._observer.bytes_received(nbytes)
        self._feeding = True
        try:
            self._feed(data, nbytes)
        finally:
            self._feeding = False
            if self._reply_waiting:
                self._reply_waiting = False
                self._write_now()
        if not self._receiving:
            return
        if self._first_request_timer is not None and self._counts["requests"]:
            self._first_request_timer.cancel()
            self._first_request_timer = None
        assert self._handler is not None
        partial = self._handler.partial_frame_bytes()
        if partial > self._limits.max_frame_bytes:
            self._close_reason("frame_too_large")
            log.warning(
                "%s %s: a frame over %d bytes; closing",
                self._handler.name,
                self._peer,
                self._limits.max_frame_bytes,
            )
            self._stop_receiving()
        elif partial == 0:
            if self._partial_timer is not None:
                self._partial_timer.cancel()
                self._partial_timer = None
        elif self._partial_timer is None:
            self._partial_timer = self._loop.call_later(
                self._limits.partial_frame_timeout_s, self._partial_frame_timeout
            )
        budget = self._budget
        if budget is not None:
            self._recharge()
            if self._charged and budget.spent and self._receiving:
                self._pause("budget")
                budget.wait(self, self._budget_resume)

    def eof_received(self) -> bool:
        if self._handler is None:
            self._early_eof = True  # TLS, before the handler's start (see buffer_updated)
            return False
        if self._receiving:
            self._feed(b"")
            self._close_reason("eof")
            self._stop_receiving()
        # Plain TCP: keep the write side open, so a client that half-closes after
        # its last request still gets its replies (TLS cannot keep it open).
        return self._ssl_context is None

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._close_reason("connection_error" if exc is not None else "closed")
        self._stop_receiving()
        waiter, self._drain_waiter = self._drain_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(ConnectionResetError("the connection was lost"))
        if not self._closed.done():
            self._closed.set_result(None)
        self._wake.set()

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self._recharge()
        waiter, self._drain_waiter = self._drain_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # ------------------------------------------------------------ receiving and dispatch

    def _start(self, transport: asyncio.Transport) -> None:
        """Set the handler up on ``transport`` (plain, or TLS after the handshake)."""
        self._transport = transport
        handler = self._handler = self._make_handler()
        handler.wake_writer = self._wake.set
        handler.budget = self._budget
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
        self._receiving = True
        self._idle_timer = self._loop.call_at(self._last_received + self._idle_s, self._idle)
        if self._first_request_by is not None:
            self._first_request_timer = self._loop.call_at(
                self._first_request_by, self._no_first_request
            )
        handler.on_start()
        self._wake.set()
        self._writer_task = self._loop.create_task(
            self._write_loop(), name=f"{handler.name}-writer"
        )
        if self._early:
            early, self._early = bytes(self._early), bytearray()
            self._received(len(early), early)
        if self._early_eof and self._receiving:
            self.eof_received()

    # ------------------------------------------------------------ pausing and the budget

    def _pause(self, why: str) -> None:
        """Stop reading for ``why`` (until ``_resume(why)``; reasons add up)."""
        if not self._paused_for and self._transport is not None:
            self._transport.pause_reading()
        self._paused_for.add(why)

    def _resume(self, why: str) -> None:
        """``why`` no longer holds reading back; read again if nothing else does."""
        if why not in self._paused_for:
            return
        self._paused_for.discard(why)
        if not self._paused_for and self._receiving and self._transport is not None:
            self._transport.resume_reading()

    def _budget_resume(self) -> None:
        self._last_received = self._clock()  # the wait was ours, not the peer's idleness
        self._resume("budget")

    def _recharge(self) -> None:
        """Tell the budget what this connection holds now: the frame still arriving,
        the replies its handler holds and the bytes the transport holds for the peer."""
        budget = self._budget
        if budget is None or self._released:
            return
        held = 0
        handler = self._handler
        if handler is not None:
            held = handler.queued_bytes()
            if self._receiving:
                held += handler.partial_frame_bytes()
        transport = self._transport
        if transport is not None and not self._lost:
            held += transport.get_write_buffer_size()
        if held != self._charged:
            self._charged = held
            budget.hold(self, held, self._recharge)

    def _release(self) -> None:
        """The connection is done: it holds nothing more and waits for nothing."""
        if self._budget is not None and not self._released:
            self._released = True
            self._charged = 0
            self._budget.forget(self)

    def _close_by_handler(self, reason: str) -> None:
        """The handler's ``close_connection``: stop receiving; ``serve`` flushes and closes."""
        if self._receiving:
            self._close_reason(reason)
            self._stop_receiving()

    def _close_reason(self, why: str) -> None:
        if not self._reason:
            self._reason = why

    def _stop_receiving(self) -> None:
        """Take no more bytes; the supervising task winds the connection up."""
        self._receiving = False
        for timer in (self._idle_timer, self._partial_timer, self._first_request_timer):
            if timer is not None:
                timer.cancel()
        if not self._ended.done():
            self._ended.set_result(None)

    def _feed(self, data: bytes | memoryview | None, nbytes: int = 0) -> None:
        """Feed received bytes (``b""``: EOF; None: ``nbytes`` into the handler's
        ``frame_buffer``) to the handler and start the events."""
        handler = self._handler
        assert handler is not None
        try:
            if data is None:
                events = iter(handler.frame_received(nbytes))
            else:
                # A view, typed as the handlers' ``bytes`` (they only copy it into
                # their sans-I/O buffers; see "Receiving" above).
                events = iter(handler.feed(cast("bytes", data)))
            for event in events:
                self._counts["requests"] += 1
                if self._observer is not None:
                    self._observer.request_received()
                if self._pending >= self._pending_max or self._backlog:
                    # The limit is reached: take every event of these bytes now (the
                    # receive buffer is shared) and read nothing more until they ran.
                    self._backlog.append(event)
                    if data != b"":  # not at EOF
                        self._pause("backlog")
                    continue
                self._dispatch(event)
        except RemoteProtocolError as exc:
            if self._backlog:
                self._backlog_error = exc  # after the events before it
            else:
                self._protocol_error(exc)

    def _protocol_error(self, exc: RemoteProtocolError) -> None:
        assert self._handler is not None
        reason = exc.close_reason
        self._close_reason(reason)
        log.warning(
            "%s %s: %s, closing: %s", self._handler.name, self._peer, reason.replace("_", " "), exc
        )
        self._handler.on_protocol_error(exc)
        self._stop_receiving()
        self._write_now()

    def _dispatch(self, event: object) -> None:
        """Start handling ``event``: inline when allowed, else in a task of its own."""
        assert self._handler is not None
        self._pending += 1
        sequential = self._handler.sequential(event)
        previous = self._previous
        after = previous if sequential and not _finished(previous) else None
        task: asyncio.Task[None] | None
        if after is None and not self._unstarted and self._handler.inline(event):
            # Nothing it must follow is left undone: start it here, in order.
            task = start_inline(self._run_event(event, None))
        else:
            task = self._loop.create_task(self._run_event(event, after))
            if not self._unstarted:
                # Scheduled after the task's first step: until it runs, later
                # events must not start inline ahead of that step.
                self._unstarted = True
                self._loop.call_soon(self._all_started)
        if task is not None:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if sequential:
            self._previous = task

    def _all_started(self) -> None:
        self._unstarted = False

    async def _run_event(self, event: object, after: asyncio.Task[None] | None) -> None:
        handler = self._handler
        assert handler is not None
        try:
            if after is not None:
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await asyncio.shield(after)
            await handler.handle(event)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._close_reason("handler_error")
            # One line, never the event's bytes; a traceback only for a bug.
            log.error(
                "%s %s: handling %s failed; closing: %s: %s",
                handler.name,
                _address(self._peer),
                describe_event(event),
                type(exc).__name__,
                exc,
                exc_info=not isinstance(exc, HeadraceError | OSError),
            )
            self._stop_receiving()
            if self._transport is not None:
                self._transport.abort()
        finally:
            self._pending -= 1
            if self._backlog and not self._backlog_scheduled:
                self._backlog_scheduled = True
                self._loop.call_soon(self._run_backlog)
            self._write_soon()

    def _run_backlog(self) -> None:
        """Start backlogged events while there is room; read again once none is left."""
        self._backlog_scheduled = False
        if not self._receiving and self._reason != "eof":
            self._backlog.clear()
            return
        while self._backlog and self._pending < self._pending_max:
            self._dispatch(self._backlog.popleft())
        if self._backlog:
            return  # the next event to finish calls again
        if self._backlog_error is not None:
            exc, self._backlog_error = self._backlog_error, None
            self._protocol_error(exc)
        elif self._receiving:
            self._resume("backlog")

    # ------------------------------------------------------------ the supervising task

    async def serve(self) -> None:
        """Handshake, timers, and the orderly end of the connection."""
        try:
            if self._ssl_context is not None and not await self._handshake(self._ssl_context):
                return
            try:
                await self._watch()
                # Let handlers of what was received finish (a client that half-closes
                # after its last request still gets its replies), unless the peer is gone.
                while (self._tasks or self._backlog) and not self._lost:
                    if self._tasks:
                        await asyncio.wait(set(self._tasks), return_when=asyncio.FIRST_COMPLETED)
                    elif self._backlog:
                        await asyncio.sleep(0)  # _run_backlog is scheduled
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

    # Timers: one handle each, not one per read. The idle timer is not moved by
    # every read: when it fires early it looks at the last read and sets itself again.

    def _idle(self) -> None:
        handler = self._handler
        if not self._receiving or handler is None:
            return
        now = self._clock()
        idle_at = self._last_received + self._idle_s
        if now < idle_at:
            self._idle_timer = self._loop.call_at(idle_at, self._idle)
            return
        if handler.busy():
            self._last_received = now
            self._idle_timer = self._loop.call_at(now + self._idle_s, self._idle)
            return
        self._close_reason("idle")
        log.info("%s %s: idle for %.0f s; closing", handler.name, self._peer, self._idle_s)
        self._stop_receiving()

    def _partial_frame_timeout(self) -> None:
        handler = self._handler
        if not self._receiving or handler is None:
            return
        self._close_reason("partial_frame_timeout")
        log.info(
            "%s %s: a frame took over %.0f s to arrive; closing",
            handler.name,
            self._peer,
            self._limits.partial_frame_timeout_s,
        )
        self._stop_receiving()

    def _no_first_request(self) -> None:
        handler = self._handler
        if not self._receiving or handler is None or self._counts["requests"]:
            return
        self._close_reason("first_request_timeout")
        log.info(
            "%s %s: no request within %.1f s; closing",
            handler.name,
            self._peer,
            self._first_request_timeout_s,
        )
        self._stop_receiving()

    async def _wind_up(self) -> None:
        """Cancel what still runs, flush replies, close, and log the access line.

        Every step runs even if the task is cancelled meanwhile (the listener
        shutting down): the handler's ``on_close`` releases its sessions and
        the transport is closed; the cancellation is raised again at the end.
        """
        cancelled = False
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            try:
                await asyncio.gather(*self._tasks, return_exceptions=True)
            except asyncio.CancelledError:
                cancelled = True
        self._backlog.clear()
        self._closing = True
        self._wake.set()
        writer_task = self._writer_task
        if writer_task is not None:
            if not cancelled:
                try:
                    await asyncio.wait_for(asyncio.shield(writer_task), CLOSE_FLUSH_TIMEOUT_S)
                except asyncio.CancelledError:
                    cancelled = True
                except Exception:  # the writer logged it; a timeout: give up the flush
                    pass
            writer_task.cancel()
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
            self._release()
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

    # ------------------------------------------------------------ writing

    def _sent(self, count: int) -> None:
        self._counts["bytes_out"] += count
        if self._observer is not None and count:
            self._observer.bytes_sent(count)

    def _write_small(self, pieces: Iterable[bytes | bytearray | memoryview]) -> None:
        """Write pieces, joining runs of small ones into one write (one syscall)."""
        transport = self._transport
        assert transport is not None
        small: list[bytes | bytearray | memoryview] = []
        for piece in pieces:
            if len(piece) < JOIN_BELOW_BYTES:
                small.append(piece)
                continue
            if small:
                data = small[0] if len(small) == 1 else b"".join(small)
                transport.write(data)
                self._sent(len(data))
                small = []
            transport.write(piece)
            self._sent(len(piece))
        if small:
            data = small[0] if len(small) == 1 else b"".join(small)
            transport.write(data)
            self._sent(len(data))

    async def _send_region(self, region: FileRegion) -> None:
        """Write a file region: ``sendfile`` at once if the transport's buffer is
        empty, then ``loop.sendfile`` (which waits for it to empty) for the rest.

        Raises:
            ConnectionError: the peer went away (also in the middle).
        """
        transport = self._transport
        handler = self._handler
        assert transport is not None and handler is not None
        if not handler.sendfile_ok:
            data = region.read()  # TLS: the bytes must pass through the cipher
            transport.write(data)
            self._sent(len(data))
            return
        if transport.is_closing():
            raise ConnectionResetError("the connection closed before a region was sent")
        sock = transport.get_extra_info("socket")
        position, left = region.position, region.size_bytes
        if transport.get_write_buffer_size() == 0:
            try:
                count = os.sendfile(sock.fileno(), region.fd, position, left)
            except BlockingIOError:
                count = 0
            except OSError as exc:
                raise ConnectionResetError(f"sendfile failed: {exc}") from exc
            position += count
            left -= count
            self._sent(count)
        if not left:
            return
        # A file object over the region's own fd (no I/O here): loop.sendfile wants one.
        with open(region.fd, "rb", buffering=0, closefd=False) as file:  # noqa: ASYNC230
            file.seek(position)
            try:
                count = await self._loop.sendfile(transport, file, position, left, fallback=False)
            except (OSError, RuntimeError) as exc:  # RuntimeError: the transport closed
                self._sent(max(file.tell() - position, 0))  # what went out before the error
                raise ConnectionResetError(f"sendfile stopped: {exc}") from exc
        self._sent(count)

    async def _send(self, pieces: list[OutputPiece]) -> None:
        """Write the pieces in order; close every region among them, sent or not."""
        try:
            run: list[bytes | bytearray | memoryview] = []
            for piece in pieces:
                if not isinstance(piece, FileRegion):
                    run.append(piece)
                    continue
                self._write_small(run)
                run = []
                await self._send_region(piece)
                piece.close()
            self._write_small(run)
        finally:
            for piece in pieces:
                if isinstance(piece, FileRegion):
                    piece.close()

    def _write_soon(self) -> None:
        """Write an event's replies: at once if no other event of the connection is
        being handled, else once the callbacks ready now have run, so that events
        finishing together (appends acknowledged by one sync) share one write."""
        if self._feeding or self._pending == 0:
            self._write_now()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush_soon)

    def _flush_soon(self) -> None:
        self._flush_scheduled = False
        self._write_now()

    def _write_now(self) -> None:
        """Write queued replies straight to the transport when the writer is idle.

        Saves the round in which the writer task would wake for a small reply.
        The writer still does everything that may wait or fail: file regions,
        draining, and the ``max_buffered_bytes`` check (woken whenever the
        transport holds bytes the peer has not taken).
        """
        if self._feeding:
            # The replies to every request of one read go out in one write (one
            # syscall), at the end of the receive callback that read them.
            self._reply_waiting = True
            return
        transport = self._transport
        handler = self._handler
        if transport is None or handler is None:
            return
        if self._writing or self._closing or self._carry:
            self._wake.set()
            return
        pieces = handler.output()
        if not pieces:
            return
        if transport.is_closing() or any(isinstance(piece, FileRegion) for piece in pieces):
            self._carry.extend(pieces)
            self._wake.set()
            return
        self._write_small(pieces)  # type: ignore[arg-type]  # no FileRegion: checked above
        if transport.get_write_buffer_size():
            self._wake.set()
        self._recharge()

    async def _drain(self) -> None:
        """Wait until the transport's buffer is below its high-water mark.

        Raises:
            ConnectionResetError: the connection was lost.
        """
        if self._lost:
            raise ConnectionResetError("the connection was lost")
        if not self._write_paused:
            return
        waiter = self._drain_waiter = self._loop.create_future()
        await waiter

    async def _write_loop(self) -> None:
        transport = self._transport
        handler = self._handler
        assert transport is not None and handler is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            self._writing = True
            data = handler.output()
            if self._carry:
                data = self._carry + data
                self._carry.clear()
            if data or transport.get_write_buffer_size():
                try:
                    await self._send(data)
                    self._recharge()
                    if transport.get_write_buffer_size() > self._limits.max_buffered_bytes:
                        self._close_reason("not_reading")
                        log.warning(
                            "%s %s: more than %d reply bytes not taken; closing",
                            handler.name,
                            self._peer,
                            self._limits.max_buffered_bytes,
                        )
                        self._stop_receiving()
                        transport.abort()
                        return
                    await self._drain()
                    self._recharge()
                except ConnectionError as exc:
                    self._close_reason("connection_error")
                    log.info(
                        "%s %s: the peer went away while sending: %s", handler.name, self._peer, exc
                    )
                    self._stop_receiving()
                    transport.abort()
                    return
            self._writing = False
            if self._closing:
                if not data:
                    return
                self._wake.set()  # look again: writing may have let more replies in


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
