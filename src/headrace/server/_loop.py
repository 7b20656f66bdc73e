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
  ``sequential`` and are run one at a time, in order. An event its handler
  marks ``inline`` (a Pravega append) skips the task: its first step runs
  in the read loop at once, and only if it suspends is the rest handed to a
  task (``_start_inline``), so an append the store acknowledges without
  waiting costs no event-loop round of its own.
* **Writing** happens in a writer task woken by ``wake_writer``; it drains
  the transport, so a peer that does not read is slowed too, and ``close``
  flushes what is queued before closing. When an event finishes while that
  task is idle and the replies are plain bytes, they are written to the
  transport at once (``write_now``); the writer is woken only if the peer
  has not taken them all (to drain and check the limit). A handler's ``output`` is a list of
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
* **Accounting**: bytes each way and requests (events) are reported to the
  listener's ``ConnectionObserver`` (metrics), and one ``headrace.access``
  line is logged when the connection closes, with why it closed.
* **Errors**: a ``RemoteProtocolError`` from ``feed`` gets the handler's
  reply (``on_protocol_error``) written, then the connection is closed and
  logged. An unexpected exception in a handler closes this connection only
  (logged with its traceback); other connections and the store are untouched.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import contextvars
import logging
import os
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from headrace.errors import RemoteProtocolError
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
    "ConnectionHandler",
    "ConnectionLimits",
    "ConnectionObserver",
    "ListenerSettings",
    "OutputPiece",
    "run_connection",
]

log = logging.getLogger(__name__)
access_log = logging.getLogger("headrace.access")

READ_CHUNK_BYTES = 256 * 1024
"""Bytes asked of the socket per read: big enough for a full append block in a few reads.
Also the listeners' ``StreamReader`` limit, so asyncio pauses a connection's reading
only past twice this (512 KiB) buffered while the loop is not reading it."""

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
        "not_reading",
        "refused",
        "tls_failed",
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


@dataclass(frozen=True, slots=True)
class ListenerSettings:
    """Limits and metrics for the listeners being started (see ``LISTENER_SETTINGS``)."""

    limits: ConnectionLimits = field(default_factory=ConnectionLimits)
    observer_for: Callable[[str], ConnectionObserver] | None = None
    """Listener name -> its observer; None: nothing is counted."""


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
    sendfile_ok: bool = False
    """Set by the loop before ``on_start``: the connection is plain TCP, so
    ``FileRegion`` pieces go out with ``sendfile``; on TLS they would be read
    and copied, so handlers ask the store for bytes instead."""

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

    def partial_frame_bytes(self) -> int:
        """Bytes of a frame received in part and held until the rest arrives (0: none).

        The loop closes the connection when this exceeds ``max_frame_bytes`` or
        stays above 0 for longer than ``partial_frame_timeout_s``. Protocols that
        cannot tell return 0 (then only the idle timeout applies).
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


def _start_inline(coro: Coroutine[object, None, None]) -> asyncio.Task[None] | None:
    """Run ``coro``'s first step now; None if it finished, else a task that runs the rest.

    What a Task does with a coroutine, minus the round it waits before the
    first step. The first step runs in the caller's task and context.
    """
    try:
        yielded = coro.send(None)
    except StopIteration:
        return None
    _taken(yielded)
    return asyncio.create_task(_finish(coro, yielded))


def _taken(yielded: object) -> None:
    """Mark a future a coroutine yielded as taken by its driver, as a Task does at once:
    a future still marked refuses the next coroutine that awaits it."""
    if isinstance(yielded, asyncio.Future):
        yielded._asyncio_future_blocking = False


async def _finish(coro: Coroutine[object, None, None], yielded: object) -> None:
    """Drive ``coro`` on from what its last step yielded, as its Task would.

    A future it yielded is awaited here (its outcome stays in it: the
    coroutine reads it when resumed), so this task wakes in the same round
    the coroutine's own task would, and cancelling this task cancels that
    future, as a Task does. A bare ``yield`` (``sleep(0)``) is one round.
    """
    while True:
        thrown: BaseException | None = None
        if yielded is None:
            try:
                await asyncio.sleep(0)
            except asyncio.CancelledError as exc:
                thrown = exc
        elif isinstance(yielded, asyncio.Future):
            try:
                await yielded
            except asyncio.CancelledError as exc:
                # The future itself cancelled (by this task's cancel or another
                # waiter's): the coroutine sees it when resumed. Cancelled with the
                # future already done: throw it in, as a Task does.
                if not yielded.cancelled():
                    thrown = exc
            except Exception:  # the coroutine reads it from the future
                pass
        else:  # what a Task does with a stray yield
            thrown = RuntimeError(f"a coroutine run inline yielded {yielded!r}")
        try:
            yielded = coro.send(None) if thrown is None else coro.throw(thrown)
        except StopIteration:
            return
        _taken(yielded)


async def run_connection(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    handler: ConnectionHandler,
    *,
    limits: ConnectionLimits | None = None,
    idle_timeout_s: float | None = None,
    max_pending_events: int | None = None,
    observer: ConnectionObserver | None = None,
    listener: str | None = None,
    first_request_timeout_s: float | None = None,
) -> None:
    """Serve one connection until EOF, a protocol error, a limit, or cancellation.

    ``idle_timeout_s`` and ``max_pending_events``, when given, override ``limits``.
    ``first_request_timeout_s``: close the connection if no whole request has
    arrived this long after it opened (None: no such limit, only the idle one).
    ``listener`` names the connection's protocol in its access line (default:
    the handler's name).
    """
    limits = limits or ConnectionLimits()
    idle_s = limits.idle_timeout_s if idle_timeout_s is None else idle_timeout_s
    pending_max = limits.max_pending_requests if max_pending_events is None else max_pending_events
    peer = writer.get_extra_info("peername")
    clock = asyncio.get_running_loop().time
    opened_at = clock()
    first_request_by = (
        None if first_request_timeout_s is None else opened_at + first_request_timeout_s
    )
    wake = asyncio.Event()
    closing = False
    handler.wake_writer = wake.set
    pending = 0  # events being handled (a counter, not a Semaphore: no coroutine per event)
    room = asyncio.Event()  # set whenever an event finishes
    tasks: set[asyncio.Task[None]] = set()
    previous: asyncio.Task[None] | None = None  # the last sequential event's task
    writing = False  # the writer task is sending or draining
    carry: list[OutputPiece] = []  # output taken by write_now that the writer must send
    counts = {"requests": 0, "bytes_in": 0, "bytes_out": 0}
    reason = ""

    def close_reason(why: str) -> None:
        nonlocal reason
        if not reason:
            reason = why

    if observer is not None:
        observer.connection_opened()

    transport = writer.transport
    sock = writer.get_extra_info("socket")
    handler.sendfile_ok = (
        writer.get_extra_info("sslcontext") is None
        and writer.get_extra_info("ssl_object") is None  # however TLS was started
        and sock is not None
        and isinstance(transport, asyncio.WriteTransport)
    )

    def sent(count: int) -> None:
        counts["bytes_out"] += count
        if observer is not None and count:
            observer.bytes_sent(count)

    async def send_region(region: FileRegion) -> None:
        """Write a file region: ``sendfile`` at once if the transport's buffer is
        empty, then ``loop.sendfile`` (which waits for it to empty) for the rest.

        Raises:
            ConnectionError: the peer went away (also in the middle).
        """
        if not handler.sendfile_ok:
            data = region.read()  # TLS: the bytes must pass through the cipher
            writer.write(data)
            sent(len(data))
            return
        if transport.is_closing():
            raise ConnectionResetError("the connection closed before a region was sent")
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
            sent(count)
        if not left:
            return
        # A file object over the region's own fd (no I/O here): loop.sendfile wants one.
        with open(region.fd, "rb", buffering=0, closefd=False) as file:  # noqa: ASYNC230
            file.seek(position)
            try:
                count = await asyncio.get_running_loop().sendfile(
                    transport, file, position, left, fallback=False
                )
            except (OSError, RuntimeError) as exc:  # RuntimeError: the transport closed
                sent(max(file.tell() - position, 0))  # what went out before the error
                raise ConnectionResetError(f"sendfile stopped: {exc}") from exc
        sent(count)

    async def send(pieces: list[OutputPiece]) -> None:
        """Write the pieces in order; close every region among them, sent or not."""
        try:
            small: list[bytes | bytearray | memoryview] = []
            for piece in pieces:
                if not isinstance(piece, FileRegion) and len(piece) < JOIN_BELOW_BYTES:
                    small.append(piece)
                    continue
                if small:
                    data = small[0] if len(small) == 1 else b"".join(small)
                    writer.write(data)
                    sent(len(data))
                    small = []
                if isinstance(piece, FileRegion):
                    await send_region(piece)
                    piece.close()
                else:
                    writer.write(piece)
                    sent(len(piece))
            if small:
                data = small[0] if len(small) == 1 else b"".join(small)
                writer.write(data)
                sent(len(data))
        finally:
            for piece in pieces:
                if isinstance(piece, FileRegion):
                    piece.close()

    def write_now() -> None:
        """Write queued replies straight to the transport when the writer is idle.

        Saves the round in which the writer task would wake for a small reply.
        The writer still does everything that may wait or fail: file regions,
        draining, and the ``max_buffered_bytes`` check (woken whenever the
        transport holds bytes the peer has not taken).
        """
        if writing or closing or carry:
            wake.set()
            return
        pieces = handler.output()
        if not pieces:
            return
        if transport.is_closing() or any(isinstance(piece, FileRegion) for piece in pieces):
            carry.extend(pieces)
            wake.set()
            return
        small: list[bytes | bytearray | memoryview] = []
        for piece in pieces:
            assert not isinstance(piece, FileRegion)
            if len(piece) < JOIN_BELOW_BYTES:
                small.append(piece)
                continue
            if small:
                data = small[0] if len(small) == 1 else b"".join(small)
                writer.write(data)
                sent(len(data))
                small = []
            writer.write(piece)
            sent(len(piece))
        if small:
            data = small[0] if len(small) == 1 else b"".join(small)
            writer.write(data)
            sent(len(data))
        if transport.get_write_buffer_size():
            wake.set()

    async def write_loop() -> None:
        nonlocal writing
        while True:
            await wake.wait()
            wake.clear()
            writing = True
            data = handler.output()
            if carry:
                data = carry + data
                carry.clear()
            if data or transport.get_write_buffer_size():
                try:
                    await send(data)
                except ConnectionError as exc:
                    close_reason("connection_error")
                    log.info("%s %s: the peer went away while sending: %s", handler.name, peer, exc)
                    transport.abort()
                    return
                if writer.transport.get_write_buffer_size() > limits.max_buffered_bytes:
                    close_reason("not_reading")
                    log.warning(
                        "%s %s: more than %d reply bytes not taken; closing",
                        handler.name,
                        peer,
                        limits.max_buffered_bytes,
                    )
                    writer.transport.abort()
                    return
                await writer.drain()
            writing = False
            if closing:
                if not data:
                    return
                wake.set()  # look again: writing may have let more replies in

    async def run_event(event: object, after: asyncio.Task[None] | None) -> None:
        nonlocal pending
        try:
            if after is not None:
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await asyncio.shield(after)
            await handler.handle(event)
        except asyncio.CancelledError:
            raise
        except Exception:
            close_reason("handler_error")
            log.exception("%s %s: handling %s failed; closing", handler.name, peer, event)
            writer.transport.abort()
        finally:
            pending -= 1
            room.set()
            write_now()

    writer_task = asyncio.create_task(write_loop(), name=f"{handler.name}-writer")
    partial_since: float | None = None  # when the frame now arriving began
    try:
        handler.on_start()
        wake.set()
        while not writer_task.done():
            wait_s = idle_s
            if partial_since is not None:
                wait_s = min(wait_s, partial_since + limits.partial_frame_timeout_s - clock())
            if first_request_by is not None:
                wait_s = min(wait_s, first_request_by - clock())
            try:
                # One timer handle per read (asyncio.timeout), not wait_for's task.
                async with asyncio.timeout(max(wait_s, 0)):
                    data = await reader.read(READ_CHUNK_BYTES)
            except TimeoutError:
                if (
                    partial_since is not None
                    and clock() - partial_since >= limits.partial_frame_timeout_s
                ):
                    close_reason("partial_frame_timeout")
                    log.info(
                        "%s %s: a frame took over %.0f s to arrive; closing",
                        handler.name,
                        peer,
                        limits.partial_frame_timeout_s,
                    )
                    break
                if first_request_by is not None and clock() >= first_request_by:
                    close_reason("first_request_timeout")
                    log.info(
                        "%s %s: no request within %.1f s; closing",
                        handler.name,
                        peer,
                        first_request_timeout_s,
                    )
                    break
                if handler.busy():
                    continue
                close_reason("idle")
                log.info("%s %s: idle for %.0f s; closing", handler.name, peer, idle_s)
                break
            except ConnectionError:
                close_reason("connection_error")
                break
            counts["bytes_in"] += len(data)
            if observer is not None and data:
                observer.bytes_received(len(data))
            try:
                unstarted = False  # a task made from this read has not run its first step yet
                for event in handler.feed(data):
                    counts["requests"] += 1
                    if observer is not None:
                        observer.request_received()
                    while pending >= pending_max:  # reading pauses: TCP slows the peer
                        room.clear()
                        await room.wait()
                        unstarted = False
                    pending += 1
                    sequential = handler.sequential(event)
                    after = previous if sequential and not _finished(previous) else None
                    task: asyncio.Task[None] | None
                    if after is None and not unstarted and handler.inline(event):
                        # Nothing it must follow is left undone: start it here, in order.
                        task = _start_inline(run_event(event, None))
                    else:
                        task = asyncio.create_task(run_event(event, after))
                        unstarted = True
                    if task is not None:
                        tasks.add(task)
                        task.add_done_callback(tasks.discard)
                    if sequential:
                        previous = task
            except RemoteProtocolError as exc:
                close_reason("protocol_error")
                log.warning("%s %s: protocol error, closing: %s", handler.name, peer, exc)
                handler.on_protocol_error(exc)
                break
            if not data:
                close_reason("eof")
                break
            if counts["requests"]:
                first_request_by = None
            partial = handler.partial_frame_bytes()
            if partial > limits.max_frame_bytes:
                close_reason("frame_too_large")
                log.warning(
                    "%s %s: a frame over %d bytes; closing",
                    handler.name,
                    peer,
                    limits.max_frame_bytes,
                )
                break
            if partial == 0:
                partial_since = None
            elif partial_since is None:
                partial_since = clock()
        # Let handlers of what was received finish (a client that half-closes
        # after its last request still gets its replies).
        if tasks:
            await asyncio.wait(set(tasks))
    except asyncio.CancelledError:
        close_reason("shutdown")
        raise
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
        close_reason("closed")  # the writer stopped: the peer went away
        try:
            await handler.on_close()
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
            if observer is not None:
                observer.connection_closed(reason)
            log_access(listener or handler.name, peer, counts, clock() - opened_at, reason)


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
