"""One asyncio connection to a segment store, on the sans-I/O ``PravegaConnection``.

The aiokafka ``conn.py`` pattern: every request carries a fresh request id;
:meth:`SegmentStoreConnection.request` registers a future under that id,
writes the frame and awaits the future; received bytes go to the sans-I/O
connection, and the future whose id the reply echoes is completed. A reply
with an unknown id (its request timed out) is dropped.

Receiving copies once (``_FrameReceiver``, an ``asyncio.BufferedProtocol``):
the socket reads into a reused chunk buffer, and as soon as the header of a
large frame (a 2 MiB ``SegmentRead``) is seen, the rest of that frame is read
straight into a ``bytearray`` of the frame's size, which the sans-I/O
connection adopts and decodes in place: the reply's data is a view of the
bytes the kernel wrote, not a copy of a copy (``StreamReader`` and a growing
buffer cost four copies per reply before). Those frame buffers are reused
(up to ``MAX_POOLED_FRAMES`` per connection) once nothing refers to them any
more, so a catch-up neither allocates nor zeroes 2 MiB per reply, and a caller
that keeps a view of a reply keeps its bytes: a buffer still referenced (by a
view, or by anything else) is never handed to the socket again.

A ``SegmentRead``'s fields (segment, offset, flags, data length) come before
its data, so when a large one begins to arrive the connection tells whoever
asked for that segment and offset (:meth:`SegmentStoreConnection.watch_read_header`)
at once: the segment client sends its read-ahead then, and the server reads
and queues the next reply while this one's data is still on its way.

Appends are not request/reply: a writer registers itself with
:meth:`~SegmentStoreConnection.attach_writer` and gets every reply naming its
writer id (``AppendSetup``, ``DataAppended``, ``ConditionalCheckFailed``,
``InvalidEventNumber``) and every error reply whose request id belongs to one
of its appends (``SegmentIsSealed``, ``NoSuchSegment`` ...). Several writers
share one connection (the server keeps one session per writer id and
connection, pravega.md#java-append-blocks).

When the connection ends (EOF, an OS error, a protocol error, ``aclose``),
every pending request fails with :class:`~headrace.errors.ConnectionLost`
and every attached writer's ``connection_lost`` is called once; nothing is
retried here. Retrying is the caller's business, with a
:class:`RetryPolicy` (see ``ConnectionPool.get`` for connections, the writer
for appends).

OS errors become ``ClientError`` in one place, :func:`map_exceptions`
(httpcore's pattern).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import ssl
import struct
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol
from uuid import UUID

from headrace.errors import ConnectionLost, ProtocolError, RequestTimeout
from headrace.protocols import pravega as p
from headrace.protocols._buffer import FramePool
from headrace.protocols.pravega.codec import FRAME_HEADER

from .errors import TlsCertificateError

__all__ = [
    "CLOSE_TIMEOUT_S",
    "CONNECT_TIMEOUT_S",
    "LARGE_FRAME_BYTES",
    "MAX_PENDING_REQUESTS",
    "MAX_POOLED_FRAMES",
    "MAX_POOLED_FRAME_BYTES",
    "READ_TIMEOUT_S",
    "REQUEST_TIMEOUT_S",
    "RETRY_NOTICE_DELAY_S",
    "ConnectionPool",
    "ReadHeaderCallback",
    "RetryPolicy",
    "SegmentStoreConnection",
    "WriterListener",
    "map_exceptions",
]

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 10.0
"""Most time to open a TCP connection and exchange Hellos; a local or LAN server
answers in milliseconds, so anything near this means the host is unreachable."""

REQUEST_TIMEOUT_S = 30.0
"""Most time to wait for a reply: the Rust client's request timeout (pravega.md#rust-client)."""

READ_TIMEOUT_S = 45.0
"""Most time to wait for a ``SegmentRead``: a read at the tail is parked by the
server (Java and headrace hold it for well under 30 s, pravega.md#reads), so this is the
request timeout plus room for the park."""

CLOSE_TIMEOUT_S = 5.0
"""Most time ``aclose`` waits for queued outbound bytes to leave before it aborts
the connection: a server that reads nothing must not hold a closing client."""

MAX_PENDING_REQUESTS = 10_000
"""Most request/reply exchanges outstanding on one connection. Real callers keep
a few dozen (reads, table calls); the bound stops a runaway caller from growing
the table without end. Over it, ``request`` waits for room."""

READ_CHUNK_BYTES = 256 * 1024
"""Size of the reused buffer the socket reads small frames into; large enough
that a busy connection carrying many small replies is read in a few calls."""

LARGE_FRAME_BYTES = 64 * 1024
"""Frames at least this large that are not yet whole are read into a buffer of
their own (the frame's size) instead of the chunk buffer, so their bytes are
never copied after the socket; smaller ones are copied once from the chunk,
which costs less than a buffer each."""

MAX_POOLED_FRAMES = 4
"""Large-frame buffers a connection keeps to receive later large frames into:
as many 2 MiB replies as the server queues for one connection (8 MiB), so a
reader that holds one reply while the next arrives still reuses buffers. Each
is reused only for a frame of its exact size (a catch-up's replies are all the
same size) and only once nothing else refers to it."""

MAX_POOLED_FRAME_BYTES = 8 * 1024 * 1024
"""The most those buffers may hold together (four 2 MiB replies); a larger
frame gets a buffer of its own that is not kept."""

WRITE_HIGH_WATER_BYTES = 4 * 1024 * 1024
"""Outbound bytes buffered in the transport before ``drain`` makes senders wait:
a few append blocks' worth, so the socket stays busy without unbounded memory."""

_COMMAND_TYPES = frozenset(int(t) for t in p.CommandType)
"""Type codes a frame may carry; a large frame of another type is not buffered."""

_SEGMENT_READ = int(p.CommandType.SEGMENT_READ)
_READ_FIELDS = struct.Struct(">q??i")
"""A ``SegmentRead``'s fields after the segment name and before the data: offset,
at tail, end of segment, data length (pravega.md#reads)."""

ReadHeaderCallback = Callable[[int, bool, bool], None]
"""Told ``(data length, at_tail, end_of_segment)`` of a ``SegmentRead`` whose data
is still arriving (:meth:`SegmentStoreConnection.watch_read_header`)."""

_request_ids = itertools.count(1)  # process-wide: a request id never repeats on any connection


def next_request_id() -> int:
    """A fresh request id (positive, unique in this process)."""
    return next(_request_ids)


@contextlib.contextmanager
def map_exceptions(what: str) -> Iterator[None]:
    """Turn OS-level errors (and timeouts) into the client's error family.

    ``OSError`` (refused, reset, unreachable, broken pipe) and
    ``asyncio.IncompleteReadError`` become :class:`ConnectionLost`;
    ``TimeoutError`` becomes :class:`RequestTimeout`. Both are retriable. A
    server certificate that does not verify becomes :class:`TlsCertificateError`,
    which is not.
    """
    try:
        yield
    except TimeoutError as exc:
        raise RequestTimeout(f"{what}: timed out") from exc
    except ssl.SSLCertVerificationError as exc:
        raise TlsCertificateError(f"{what}: {exc.verify_message or exc}") from exc
    except (OSError, asyncio.IncompleteReadError) as exc:
        raise ConnectionLost(f"{what}: {exc}") from exc


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Exponential back-off with jitter, bounded in attempts.

    Attributes:
        initial_delay_s: wait before the second attempt.
        max_delay_s: the cap on one wait.
        multiplier: growth of the wait per attempt.
        max_attempts: attempts in all (the first included); 0 means no limit.
    """

    initial_delay_s: float = 0.01
    max_delay_s: float = 2.0
    multiplier: float = 2.0
    max_attempts: int = 20

    def delays(self) -> Iterator[float]:
        """The waits before attempts 2, 3, ... (stops when attempts run out)."""
        delay = self.initial_delay_s
        for _ in itertools.count(1) if self.max_attempts == 0 else range(self.max_attempts - 1):
            yield delay * (0.5 + random.random() / 2)  # jitter: spread reconnect storms
            delay = min(self.max_delay_s, delay * self.multiplier)


DEFAULT_RETRY = RetryPolicy()
"""About 20 attempts over roughly 20 s: covers a server restart."""

ONE_ATTEMPT = RetryPolicy(max_attempts=1)
"""A single connection attempt, for callers that retry themselves and ask the
controller where the segment is before each attempt (it may have moved)."""

RETRY_NOTICE_DELAY_S = 0.5
"""A retry that waits this long or longer is logged (``headrace.client.retry``,
a warning): short blips stay quiet, a server away for longer is reported
while the client keeps trying, instead of a silent wait."""

retry_log = logging.getLogger("headrace.client.retry")
"""Where retries that take a while are reported (the CLI shows them)."""


class WriterListener(Protocol):
    """What a writer attached to a connection is told."""

    def reply(self, cmd: p.Command) -> None:
        """A reply for this writer (by writer id, or by one of its append request ids)."""

    def connection_lost(self, exc: BaseException) -> None:
        """The connection ended; every append not acknowledged must be sent again."""


class _FrameReceiver(asyncio.BufferedProtocol):
    """The socket end of a :class:`SegmentStoreConnection`: whole frames to the
    sans-I/O connection, large ones without a copy, and write flow control.

    Small frames are read into ``_chunk`` (reused) and fed to the connection
    once whole (one copy). When a frame of ``LARGE_FRAME_BYTES`` or more is
    not whole yet, its bytes so far move to a ``bytearray`` of the frame's
    size and ``get_buffer`` hands out the rest of that, so the kernel writes
    the frame's remaining bytes where they will be decoded; the whole frame is
    then given to the connection (``receive_owned``), which decodes its data
    as a view. A frame header the codec would refuse (negative or oversized
    length) is fed as it is, so the sans-I/O layer reports it.
    """

    def __init__(self, conn: p.PravegaConnection, owner: SegmentStoreConnection) -> None:
        self._conn = conn
        self._owner = owner
        self._chunk = bytearray(READ_CHUNK_BYTES)
        self._start = 0  # first byte of _chunk not yet fed to the connection
        self._end = 0  # end of the bytes received into _chunk
        self._frame: bytearray | None = None  # a large frame being received, whole size
        self._frame_got = 0
        self._header_due = False  # a SegmentRead's fields not yet told (too few bytes came)
        # Large-frame buffers, reused once unreferenced.
        self.pool = FramePool(MAX_POOLED_FRAMES, MAX_POOLED_FRAME_BYTES)
        self._write_paused = False
        self._drain_waiters: deque[asyncio.Future[None]] = deque()
        self._lost_exc: BaseException | None = None
        self.lost = asyncio.get_running_loop().create_future()
        """Done once the transport has closed (``wait_closed``)."""

    # ------------------------------------------------------------------ receiving

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._frame is not None:
            return memoryview(self._frame)[self._frame_got :]
        return memoryview(self._chunk)[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        try:
            if self._frame is not None:
                self._frame_got += nbytes
                if self._header_due:
                    self._header_due = not self._tell_read_header(self._frame, self._frame_got)
                if self._frame_got == len(self._frame):
                    frame, self._frame = self._frame, None
                    self._conn.receive_owned(frame)
                    self._owner._take_events()
                return
            self._end += nbytes
            self._cut_frames()
        except ProtocolError as exc:
            self._owner._protocol_error(exc)

    def _cut_frames(self) -> None:
        """Feed the whole frames in ``_chunk``; move a large partial one to its own buffer."""
        chunk = self._chunk
        pos = self._start
        end = self._end
        large: bytearray | None = None
        while end - pos >= p.HEADER_SIZE_BYTES:
            type_code, length = FRAME_HEADER.unpack_from(chunk, pos)
            total = p.HEADER_SIZE_BYTES + length
            if length < 0 or total > p.MAX_FRAME_BYTES:
                pos = end  # let the codec refuse it
                break
            if end - pos >= total:
                pos += total
                continue
            if total >= LARGE_FRAME_BYTES:
                if type_code not in _COMMAND_TYPES:
                    pos = end  # refused before its payload is buffered, as the codec does
                    break
                large = self.pool.get(total)
                large[: end - pos] = memoryview(chunk)[pos:end]
                self._frame, self._frame_got = large, end - pos
                if type_code == _SEGMENT_READ and self._owner._read_watchers:
                    self._header_due = not self._tell_read_header(large, end - pos)
            break
        if pos > self._start:
            self._conn.receive_data(memoryview(chunk)[self._start : pos])
        if large is not None:
            self._start = self._end = 0
        else:
            rest = end - pos  # part of a small frame: to the front, so the chunk has room
            if rest and pos:
                chunk[:rest] = memoryview(chunk)[pos:end]
            self._start, self._end = 0, rest
        self._owner._take_events()

    def _tell_read_header(self, frame: bytearray, got: int) -> bool:
        """Tell the connection a ``SegmentRead``'s fields from the first ``got``
        bytes of ``frame``; False if its data length has not arrived yet."""
        if got < p.HEADER_SIZE_BYTES + 2:
            return False
        name_end = p.HEADER_SIZE_BYTES + 2 + int.from_bytes(frame[8:10], "big")
        if got < name_end + _READ_FIELDS.size:
            return False
        offset, at_tail, end_of_segment, length = _READ_FIELDS.unpack_from(frame, name_end)
        try:
            name = frame[10:name_end].decode()
        except UnicodeDecodeError:
            return True  # modified UTF-8: no early word; the reply itself still comes
        self._owner._read_header_came(name, offset, length, at_tail, end_of_segment)
        return True

    def eof_received(self) -> bool:
        try:
            if self._frame is not None:  # a frame cut short: let the codec say so
                self._conn.receive_data(memoryview(self._frame)[: self._frame_got])
                self._frame = None
                self._header_due = False
            elif self._end > self._start:
                self._conn.receive_data(memoryview(self._chunk)[self._start : self._end])
            self._start = self._end = 0
            self._conn.receive_data(b"")
            self._owner._take_events()
        except ProtocolError as exc:
            self._owner._protocol_error(exc)
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost_exc = exc if exc is not None else ConnectionResetError("connection lost")
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_exception(self._lost_exc)
        self._drain_waiters.clear()
        if not self.lost.done():
            self.lost.set_result(None)
        self._owner._transport_lost(exc)

    # ------------------------------------------------------------------ write flow control

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._drain_waiters.clear()

    async def drain(self) -> None:
        """Wait while the transport holds more than its high-water mark (OSError once lost)."""
        if self._lost_exc is not None:
            raise self._lost_exc
        if not self._write_paused:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._drain_waiters.append(waiter)
        await waiter


class SegmentStoreConnection:
    """One TCP connection to a segment store, with request-id correlation.

    Build it with :meth:`connect`; close it with :meth:`aclose`.
    """

    def __init__(self, endpoint: tuple[str, int], conn: p.PravegaConnection) -> None:
        self.endpoint = endpoint
        self._conn = conn
        self._transport: asyncio.Transport | None = None
        self._receiver = _FrameReceiver(conn, self)
        self._hello: asyncio.Future[p.Hello] = asyncio.get_running_loop().create_future()
        self._pending: dict[int, asyncio.Future[p.Command]] = {}
        self._room = asyncio.Semaphore(MAX_PENDING_REQUESTS)
        self._writers: dict[UUID, WriterListener] = {}
        self._append_rids: dict[int, UUID] = {}
        self._read_watchers: dict[tuple[str, int], list[ReadHeaderCallback]] = {}
        self._closed_exc: BaseException | None = None
        self._closed = asyncio.Event()

    @classmethod
    async def connect(
        cls,
        host: str,
        port: int,
        *,
        timeout_s: float = CONNECT_TIMEOUT_S,
        ssl_context: ssl.SSLContext | None = None,
    ) -> SegmentStoreConnection:
        """Open a connection and complete the Hello exchange.

        ``ssl_context``: speak TLS, checking the certificate against ``host``
        (the TLS handshake counts within ``timeout_s``).

        Raises:
            ConnectionLost: the server refused, reset or closed the connection,
                or speaks no wire version we do.
            RequestTimeout: no connection or Hello within ``timeout_s``.
        """
        self = cls((host, port), p.PravegaConnection(p.Role.CLIENT))
        loop = asyncio.get_running_loop()
        with map_exceptions(f"connect to {host}:{port}"):
            async with asyncio.timeout(timeout_s):
                transport, _ = await loop.create_connection(
                    lambda: self._receiver, host, port, ssl=ssl_context
                )
                assert isinstance(transport, asyncio.Transport)
                self._transport = transport
                transport.set_write_buffer_limits(high=WRITE_HIGH_WATER_BYTES)
                try:
                    transport.write(self._conn.data_to_send())
                    hello = await self._hello
                except BaseException:
                    self._shutdown(ConnectionLost(f"connect to {host}:{port}: handshake ended"))
                    raise
        log.debug("connected to %s:%d (server wire versions %s)", host, port, hello)
        return self

    # ------------------------------------------------------------------ state

    @property
    def is_closed(self) -> bool:
        return self._closed_exc is not None

    async def wait_closed(self) -> None:
        """Return once the connection has ended (for whatever reason)."""
        await self._closed.wait()

    # ------------------------------------------------------------------ sending

    def _check_open(self) -> None:
        if self._closed_exc is not None:
            raise ConnectionLost(f"connection to {self._peer} is closed: {self._closed_exc}")

    @property
    def _peer(self) -> str:
        return f"{self.endpoint[0]}:{self.endpoint[1]}"

    def send_nowait(self, cmd: p.Command) -> None:
        """Queue a command for the server without waiting (appends, keep-alives).

        Raises:
            ConnectionLost: the connection has ended.
        """
        self._check_open()
        self._conn.send(cmd)
        assert self._transport is not None
        self._transport.write(self._conn.data_to_send())

    async def drain(self) -> None:
        """Wait while the transport holds more than its high-water mark of outbound bytes."""
        self._check_open()
        with map_exceptions(f"write to {self._peer}"):
            await self._receiver.drain()

    async def request(self, cmd: p.Command, *, timeout_s: float = REQUEST_TIMEOUT_S) -> p.Command:
        """Send a request (its ``request_id`` must be fresh) and return the reply.

        The reply may be an error reply (``NoSuchSegment``...): interpreting it
        is the caller's business (see ``errors.error_for_reply``).

        Raises:
            ConnectionLost: the connection ended before the reply came.
            RequestTimeout: no reply within ``timeout_s``; the connection stays
                open and a late reply is dropped.
        """
        rid: int = getattr(cmd, "request_id")  # noqa: B009 - every request command has one
        async with self._room:
            self._check_open()
            fut: asyncio.Future[p.Command] = asyncio.get_running_loop().create_future()
            self._pending[rid] = fut
            try:
                self.send_nowait(cmd)
                with map_exceptions(f"{type(cmd).__name__} to {self._peer}"):
                    async with asyncio.timeout(timeout_s):
                        return await fut
            finally:
                self._pending.pop(rid, None)

    # ------------------------------------------------------------------ early read headers

    def watch_read_header(self, segment: str, offset: int, callback: ReadHeaderCallback) -> None:
        """Call ``callback(length, at_tail, end_of_segment)`` once, as soon as the
        fields of a large ``SegmentRead`` of ``segment`` at ``offset`` have come,
        before its data (a small reply comes whole: no call; the reply itself is
        the word). Any reply for that segment and offset on this connection
        counts, whoever asked. Undo with :meth:`unwatch_read_header`."""
        self._read_watchers.setdefault((segment, offset), []).append(callback)

    def unwatch_read_header(self, segment: str, offset: int, callback: ReadHeaderCallback) -> None:
        """Forget a :meth:`watch_read_header` that has not been called (no-op if it was)."""
        callbacks = self._read_watchers.get((segment, offset))
        if callbacks is not None and callback in callbacks:
            callbacks.remove(callback)
            if not callbacks:
                del self._read_watchers[(segment, offset)]

    def _read_header_came(
        self, segment: str, offset: int, length: int, at_tail: bool, end_of_segment: bool
    ) -> None:
        for callback in self._read_watchers.pop((segment, offset), ()):
            try:
                callback(length, at_tail, end_of_segment)
            except Exception:  # a watcher's bug must not break the connection
                log.exception("read-header callback for %s@%d failed", segment, offset)

    @property
    def frame_buffers(self) -> tuple[int, int]:
        """(allocated, reused) large-frame buffers since the connection opened."""
        pool = self._receiver.pool
        return pool.allocated, pool.reused

    # ------------------------------------------------------------------ writers

    def attach_writer(self, writer_id: UUID, listener: WriterListener) -> None:
        """Route replies for ``writer_id`` to ``listener`` until :meth:`detach_writer`."""
        self._check_open()
        self._writers[writer_id] = listener

    def detach_writer(self, writer_id: UUID) -> None:
        self._writers.pop(writer_id, None)
        for rid in [r for r, w in self._append_rids.items() if w == writer_id]:
            del self._append_rids[rid]

    def send_append(self, writer_id: UUID, request_id: int, cmd: p.Command) -> None:
        """Send an append (or SetupAppend) whose error replies go to ``writer_id``'s listener."""
        self._append_rids[request_id] = writer_id
        try:
            self.send_nowait(cmd)
        except BaseException:
            self._append_rids.pop(request_id, None)
            raise

    def send_append_parts(
        self,
        writer_id: UUID,
        request_id: int,
        cmd: p.Command,
        parts: Sequence[bytes | bytearray | memoryview],
        size_bytes: int,
    ) -> None:
        """Send an append whose data field (left empty in ``cmd``) is ``parts``, joined.

        The parts (``size_bytes`` in all) are not copied into a frame: the
        frame's prefix, the parts and its suffix go to the transport as one
        ``writelines``, which joins them once (Python 3.11) or hands them to
        ``sendmsg`` (3.12). The bytes on the wire are those of ``send_append``
        with the joined parts in the data field. Error replies go to
        ``writer_id``'s listener, as with ``send_append``.

        Raises:
            ConnectionLost: the connection has ended.
            LocalProtocolError: as ``send_append`` (the frame would be too large...).
        """
        self._check_open()
        self._append_rids[request_id] = writer_id
        try:
            prefix, suffix = self._conn.send_split(cmd, size_bytes)
        except BaseException:
            self._append_rids.pop(request_id, None)
            raise
        assert self._transport is not None
        self._transport.writelines([self._conn.data_to_send(), prefix, *parts, suffix])

    # ------------------------------------------------------------------ receiving

    def _take_events(self) -> None:
        """Handle every event the sans-I/O connection has now (called by the receiver)."""
        for event in self._conn.events():
            if isinstance(event, p.ConnectionClosed):
                self._shutdown(ConnectionLost(self._closed_message()))
                return
            if not self._hello.done():
                if not isinstance(event, p.Hello):
                    self._shutdown(ConnectionLost(f"expected Hello, got {type(event).__name__}"))
                    return
                self._hello.set_result(event)
                continue
            if isinstance(event, p.Command):
                self._dispatch(event)

    def _closed_message(self) -> str:
        if not self._hello.done():
            return "server closed the connection during the handshake"
        return f"server {self._peer} closed the connection"

    def _protocol_error(self, err: ProtocolError) -> None:
        """The server broke the protocol (or sent a frame over the limit): close."""
        if not self._hello.done():
            self._shutdown(ConnectionLost(f"handshake failed: {err}"))
            return
        log.warning("protocol error from %s: %s", self._peer, err)
        self._shutdown(ConnectionLost(f"protocol error from {self._peer}: {err}"))

    def _transport_lost(self, exc: Exception | None) -> None:
        if exc is None:
            self._shutdown(ConnectionLost(self._closed_message()))
        else:
            self._shutdown(ConnectionLost(f"read from {self._peer}: {exc}"))

    def _dispatch(self, cmd: p.Command) -> None:
        if isinstance(cmd, p.KeepAlive):
            return
        rid = getattr(cmd, "request_id", None)
        writer_id = getattr(cmd, "writer_id", None)
        if isinstance(cmd, p.InvalidEventNumber):
            rid = None  # its request_id slot is unreliable across clients (pravega.md#errors)
        if rid is not None:
            fut = self._pending.get(rid)
            if fut is not None:
                if not fut.done():
                    fut.set_result(cmd)
                return
            owner = self._append_rids.pop(rid, None)  # every reply is an append's last
            if owner is not None:
                writer_id = owner
        if isinstance(writer_id, UUID):
            listener = self._writers.get(writer_id)
            if listener is not None:
                listener.reply(cmd)
                return
        log.debug("dropping reply nobody waits for: %s", type(cmd).__name__)

    def _shutdown(self, exc: BaseException) -> None:
        if self._closed_exc is not None:
            return
        self._closed_exc = exc
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(ConnectionLost(str(exc)))
        self._pending.clear()
        writers = list(self._writers.values())
        self._writers.clear()
        self._append_rids.clear()
        self._read_watchers.clear()
        if not self._hello.done():
            self._hello.set_exception(ConnectionLost(str(exc)))
            self._hello.exception()  # connect() reports it; no "never retrieved" warning
        if self._transport is not None:
            self._transport.close()
        self._closed.set()
        for listener in writers:
            listener.connection_lost(exc)

    async def aclose(self) -> None:
        """Close the connection; pending requests fail with ``ConnectionLost``."""
        self._shutdown(ConnectionLost(f"connection to {self._peer} closed by the client"))
        if self._transport is None:
            return
        done, _ = await asyncio.wait({self._receiver.lost}, timeout=CLOSE_TIMEOUT_S)
        if not done:
            self._transport.abort()  # the server takes nothing: drop what is unsent


class ConnectionPool:
    """One shared connection per segment-store endpoint, reopened when it ends.

    Args:
        retry: how to retry opening a connection.
        ssl_context: connect over TLS with it (None: plaintext).
    """

    def __init__(
        self, retry: RetryPolicy = DEFAULT_RETRY, *, ssl_context: ssl.SSLContext | None = None
    ) -> None:
        self.retry = retry
        self.ssl_context = ssl_context
        self._conns: dict[tuple[str, int], SegmentStoreConnection] = {}
        self._locks: dict[tuple[str, int], asyncio.Lock] = {}
        self._closed = False

    async def get(
        self, endpoint: tuple[str, int], retry: RetryPolicy | None = None
    ) -> SegmentStoreConnection:
        """An open connection to ``endpoint``, connecting (with retries) if needed.

        ``retry``: instead of the pool's policy (a caller that asks the
        controller again between attempts tries once).

        Raises:
            ConnectionLost | RequestTimeout: every attempt failed.
        """
        if self._closed:
            raise ConnectionLost("connection pool is closed")
        conn = self._conns.get(endpoint)
        if conn is not None and not conn.is_closed:
            return conn
        lock = self._locks.setdefault(endpoint, asyncio.Lock())
        async with lock:
            conn = self._conns.get(endpoint)
            if conn is not None and not conn.is_closed:
                return conn
            conn = await connect_with_retry(
                endpoint, self.retry if retry is None else retry, ssl_context=self.ssl_context
            )
            self._conns[endpoint] = conn
            return conn

    async def aclose(self) -> None:
        self._closed = True
        conns = list(self._conns.values())
        self._conns.clear()
        for conn in conns:
            await conn.aclose()


async def connect_with_retry(
    endpoint: tuple[str, int],
    retry: RetryPolicy = DEFAULT_RETRY,
    *,
    ssl_context: ssl.SSLContext | None = None,
) -> SegmentStoreConnection:
    """Connect to ``endpoint``, retrying retriable failures as ``retry`` says.

    A failed TLS handshake is a ``ConnectionLost`` like any refused
    connection and is retried, except a certificate that does not verify
    (``TlsCertificateError``), which fails at once.
    """
    delays = retry.delays()
    while True:
        try:
            return await SegmentStoreConnection.connect(*endpoint, ssl_context=ssl_context)
        except (ConnectionLost, RequestTimeout) as exc:
            delay = next(delays, None)
            if delay is None:
                raise
            log.info("connecting to %s:%d failed (%s); retrying in %.2fs", *endpoint, exc, delay)
            if delay >= RETRY_NOTICE_DELAY_S:
                retry_log.warning(
                    "segment store %s:%d unreachable (%s); retrying in %.1f s",
                    *endpoint,
                    exc,
                    delay,
                )
            await asyncio.sleep(delay)
