"""``EventWriter``: events to a stream, routed by key, exactly once across reconnects.

Theory of operation
-------------------
An :class:`EventWriter` holds the stream's open segments as
:class:`~headrace.protocols.pravega.routing.KeyRanges` and one
:class:`_SegmentWriter` per segment. ``write(event, routing_key)`` hashes the
key to a point of [0, 1) exactly as the Java and Rust clients do (so a key
lands in the same segment whichever client wrote it; events without a key get
a random point), frames the event (``Event`` type 0 + length + bytes) and
queues it on that segment's writer with the next **event number** of the
segment writer. Nothing is awaited unless the writer is full (back-pressure).

Each segment writer has a random 128-bit **writer id** and one sender task:

1. ``getURI`` -> a shared connection to that segment store -> ``SetupAppend``;
   the ``AppendSetup`` reply carries the last event number the store holds for
   this writer id. Every queued or in-flight event numbered at or below it is
   already stored: it is acknowledged, not sent again.
2. ``write`` appends the framed event to the segment writer's open block
   (a new block once it holds ``MAX_BLOCK_EVENTS`` events or
   ``MAX_BLOCK_BYTES`` bytes). While fewer than ``max_blocks_in_flight``
   blocks are unacknowledged, the sender takes the next block and sends it
   as one ``AppendBlockEnd`` carrying ``num_events`` and
   ``last_event_number``. Several full blocks are in flight at once (the
   Rust client keeps one block in flight), which hides the round trip; the
   open block (still filling) goes only when nothing is in flight, so a
   segment written slowly sends one append per round trip with everything
   written meanwhile (``MAX_BLOCKS_IN_FLIGHT``).
3. ``DataAppended(E)`` acknowledges every in-flight event numbered ``<= E``
   (acks come in order), resolving their futures and freeing room.
4. If the connection is lost (server restart, network), the task reconnects
   with the retry policy and goes back to 1: the store's answer to
   ``SetupAppend`` says exactly which events survived, so the rest is sent
   again with the *same* numbers and the store drops any it already has.
   Nothing is lost and nothing is stored twice. A session that ends with
   appends in flight and none acknowledged counts as a failed attempt too (a
   segment store whose storage failed accepts ``SetupAppend`` or not, but
   closes the connection on every append): the policy's delays apply, and
   when it gives up the events fail with ``ConnectionLost``. Any ack starts
   the policy afresh.
5. An event over ``MAX_INLINE_EVENT_BYTES`` travels alone, after every
   earlier block is acknowledged: ``CreateTransientSegment``, the framed
   event in ``LARGE_CHUNK_BYTES`` conditional appends, ``MergeSegments``
   into the segment (pravega.md#large-events).
6. ``SegmentIsSealed`` / ``NoSuchSegment`` on an append: the segment was
   sealed (scaled or stream sealed). The writer stops sending; the
   ``EventWriter`` asks the controller for the current segments and moves the
   sealed writer's unacknowledged events, in order, to the writers of the new
   segments (new writer ids, new numbers). No successors = the stream is
   sealed: those events fail with :class:`StreamSealedError`.

``flush()`` waits until every event written before it is acknowledged and
raises the first error of a fire-and-forget ``write`` since the last flush;
``aclose()`` flushes and stops the tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from uuid import UUID, uuid4

from headrace.errors import ClientError, ConnectionLost, RequestTimeout, ServerError
from headrace.protocols import pravega as p
from headrace.protocols.pravega.codec import EVENT_HEADER
from headrace.protocols.pravega.routing import KeyRanges, routing_key_position

from ._conn import (
    DEFAULT_RETRY,
    ONE_ATTEMPT,
    ConnectionPool,
    RetryPolicy,
    SegmentStoreConnection,
    next_request_id,
)
from .controller import ControllerClient, Segment, SegmentRange
from .errors import error_for_reply

__all__ = [
    "MAX_BLOCKS_IN_FLIGHT",
    "MAX_BLOCK_BYTES",
    "MAX_BLOCK_EVENTS",
    "MAX_EVENT_BYTES",
    "MAX_INLINE_EVENT_BYTES",
    "MAX_OUTSTANDING_BYTES",
    "MAX_OUTSTANDING_EVENTS",
    "EventWriter",
    "StreamSealedError",
    "WriterClosedError",
]

log = logging.getLogger(__name__)

MAX_INLINE_EVENT_BYTES = 8 * 1024 * 1024
"""Largest event sent inside an ``AppendBlockEnd``: the Rust client's limit
(pravega.md#large-events). Larger events take the transient-segment path (see
``_send_large``)."""

MAX_EVENT_BYTES = 1024 * 1024 * 1024
"""Largest event at all: Pravega's 1 GiB large-event limit. Such an event is held
in memory whole until it is stored."""

LARGE_CHUNK_BYTES = 8 * 1024 * 1024
"""Bytes per conditional append while filling a transient segment (the Rust
client's chunk, pravega.md#large-events)."""

MAX_BLOCK_BYTES = 1024 * 1024
"""Most event bytes in one ``AppendBlockEnd``: the Java client's flush size. It
amortises the per-append cost over thousands of small events while keeping a
frame far below the 16 MiB frame limit."""

COPY_EVENT_BYTES = 2048
"""Events up to this size are copied into their block's buffer; larger ones are
kept by reference and sent from where they lie. Below it a copy costs less than
the list entry and the transport's per-part work; above it the copy dominates
(a 10 KiB or 1 MiB event was copied about six times before reaching the socket)."""

MAX_BLOCK_EVENTS = 10_000
"""Most events in one block; bounds the work one ack does on the client."""

MAX_BLOCKS_IN_FLIGHT = 8
"""Blocks sent and not yet acknowledged, per segment: enough to keep a
connection busy during the round trip plus the server's durable write.

Only full blocks (``MAX_BLOCK_EVENTS`` or ``MAX_BLOCK_BYTES``) go out while
another is in flight; the block still filling waits for the acks, as Nagle's
algorithm holds a partial segment, and goes out when they arrive or when it
fills. A fast producer still keeps several full blocks in flight, while a
segment that receives a trickle (one of many segments, a slow writer) sends
one append per round trip holding everything written meanwhile, rather than
an append of a few events per write: the server's cost is per append. Under
``fsync=always`` the wait costs next to nothing, as the server would hold
those events for its next sync round anyway."""

MAX_OUTSTANDING_EVENTS = 200_000
"""Events written and not yet acknowledged, per writer, before ``write`` waits."""

MAX_OUTSTANDING_BYTES = 64 * 1024 * 1024
"""Event bytes written and not yet acknowledged, per writer, before ``write`` waits."""

YIELD_EVERY_EVENTS = 1000
"""A producer that never awaits anything else yields to the loop this often, so
segment writers send (and acks are processed) while it loops: pipelining."""

SETUP_TIMEOUT_S = 30.0
"""Most time for ``SetupAppend`` to be answered (the request timeout)."""


@functools.lru_cache(maxsize=65_536)
def _cached_position(routing_key: str) -> float:
    """Routing keys repeat: hash each once (Java hashing; bounded cache)."""
    return routing_key_position(routing_key)


class StreamSealedError(ClientError):
    """The stream is sealed: these events were not written."""


class WriterClosedError(ClientError):
    """``write`` after ``aclose()``."""


@dataclass(slots=True)
class _Pending:
    """One event on its way: framed bytes, routing position, number, optional future."""

    framed: bytes
    position: float
    number: int = 0
    future: asyncio.Future[None] | None = None


@dataclass(slots=True)
class _Block:
    """Consecutive events of one segment writer, framed back to back: one append.

    Events are added to the open block (the last queued one) as they are
    written, so sending a block costs one frame, not one step per event. The
    framed bytes are ``parts`` followed by ``tail``: event headers and events
    up to ``COPY_EVENT_BYTES`` are copied into ``tail`` (cheaper than a list
    entry each), a larger event is kept by reference as a part of its own, so
    its bytes are copied at most once on their way to the socket (when the
    transport joins the parts; Python 3.12 sends them with ``sendmsg``).
    """

    first_number: int
    last_number: int
    positions: list[float]  # routing position of each event (to move them after a seal)
    parts: list[bytes | bytearray] = field(default_factory=list)  # framed bytes, then tail
    tail: bytearray = field(default_factory=bytearray)  # the open end of the framed bytes
    size: int = 0  # framed bytes in parts and tail
    futures: dict[int, asyncio.Future[None]] | None = None  # event number -> future
    large: bool = False  # one event over MAX_INLINE_EVENT_BYTES: the transient-segment path

    def append(self, event: bytes, number: int, position: float) -> None:
        """Frame ``event`` (type 0 + length) at the end of the block as number ``number``."""
        size = len(event)
        tail = self.tail
        if size <= COPY_EVENT_BYTES:
            tail += EVENT_HEADER.pack(0, size)
            tail += event
        else:
            # Kept by reference, not copied: immutable, so the caller cannot change it.
            # Its header joins the copied bytes before it, or is a part of its own.
            parts = self.parts
            if tail:
                tail += EVENT_HEADER.pack(0, size)
                parts.append(tail)
                self.tail = bytearray()
            else:
                parts.append(EVENT_HEADER.pack(0, size))
            parts.append(event if type(event) is bytes else bytes(event))
        self.size += size + EVENT_HEADER.size
        self.last_number = number
        self.positions.append(position)

    def pieces(self) -> list[bytes | bytearray]:
        """The framed bytes as they go to the socket, in order."""
        if not self.tail:
            return self.parts
        return [*self.parts, self.tail]

    def data(self) -> bytes:
        """The framed bytes in one piece (one copy: the rare and the large paths)."""
        return b"".join(self.pieces())

    def events(self) -> list[_Pending]:
        """The block's events one by one (the rare paths: resplitting, moving, failing)."""
        out: list[_Pending] = []
        pos = 0
        data = self.data()
        futures = self.futures or {}
        for i, position in enumerate(self.positions):
            _, size = EVENT_HEADER.unpack_from(data, pos)
            end = pos + EVENT_HEADER.size + size
            number = self.first_number + i
            out.append(_Pending(data[pos:end], position, number, futures.get(number)))
            pos = end
        return out

    def split(self, number: int) -> _Block:
        """Cut off the events numbered up to ``number`` (inclusive) and return them."""
        count = number - self.first_number + 1
        data = self.data()
        pos = 0
        for _ in range(count):
            _, size = EVENT_HEADER.unpack_from(data, pos)
            pos += EVENT_HEADER.size + size
        head_futures = None
        if self.futures:
            head_futures = {n: f for n, f in self.futures.items() if n <= number}
            self.futures = {n: f for n, f in self.futures.items() if n > number}
        head = _Block(
            self.first_number,
            number,
            self.positions[:count],
            [data[:pos]],
            size=pos,
            futures=head_futures,
        )
        self.parts = []
        self.tail = bytearray(data[pos:])
        self.size = len(self.tail)
        self.first_number = number + 1
        self.positions = self.positions[count:]
        return head


@dataclass(slots=True)
class _Stats:
    blocks_sent: int = 0
    events_acked: int = 0
    reconnects: int = 0
    resent_events: int = 0
    sealed_segments: int = 0
    dedup_acked: int = field(default=0)


class _SegmentWriter:
    """Appends to one segment on behalf of an ``EventWriter``; see the module docstring."""

    def __init__(self, owner: EventWriter, segment: Segment, name: str) -> None:
        self.owner = owner
        self.segment = segment
        self.name = name  # the segment appended to: ``segment.name`` or a transaction's
        self.writer_id: UUID = uuid4()
        self.next_number = 1
        self.queued: deque[_Block] = deque()  # not sent yet; the last one may be open
        self.in_flight: deque[_Block] = deque()
        self._open: _Block | None = None
        self.sealed = False
        self.closed = False
        self._wake = asyncio.Event()
        self._conn: SegmentStoreConnection | None = None
        self._setup: asyncio.Future[p.Command] | None = None
        self._set_up_before = False
        self._large_task: asyncio.Task[None] | None = None
        self._acks = 0
        """``DataAppended`` replies received: progress, which resets the retry policy."""
        self._task = asyncio.create_task(self._run(), name=f"writer {name}")

    # ------------------------------------------------------------------ producer side

    def add(self, event: bytes, position: float, future: asyncio.Future[None] | None) -> None:
        """Append one event to the open block (a new block when it is full)."""
        size = len(event)
        blk = self._open
        if size > MAX_INLINE_EVENT_BYTES:
            blk = _Block(self.next_number, 0, [], large=True)
            self.queued.append(blk)
            self._open = None  # a large event travels alone; the next event opens a block
        elif blk is None or (
            blk.positions
            and (len(blk.positions) >= MAX_BLOCK_EVENTS or blk.size + size + 8 > MAX_BLOCK_BYTES)
        ):
            blk = _Block(self.next_number, 0, [])
            self.queued.append(blk)
            self._open = blk
        number = self.next_number
        self.next_number = number + 1
        blk.append(event, number, position)
        if future is not None:
            if blk.futures is None:
                blk.futures = {}
            blk.futures[number] = future
        if blk.large:
            self._open = None
        # Wake the sender only if it can send now. While only the open block
        # waits behind an append in flight, or the blocks in flight are at the
        # limit, it cannot, and an ack wakes it (as a lost connection or a seal
        # does): with many segments, waking each segment's sender for every
        # event cost more than the events.
        wake = self._wake
        if not wake.is_set() and self._can_send():
            wake.set()

    def take_unacked(self) -> list[_Pending]:
        """Remove and return every event not acknowledged, in order."""
        out = [e for blk in self.in_flight for e in blk.events()]
        out.extend(e for blk in self.queued for e in blk.events())
        self.in_flight.clear()
        self.queued.clear()
        self._open = None
        return out

    # ------------------------------------------------------------------ listener side

    def reply(self, cmd: p.Command) -> None:
        if isinstance(cmd, p.AppendSetup):
            if self._setup is not None and not self._setup.done():
                self._setup.set_result(cmd)
        elif isinstance(cmd, p.DataAppended):
            self._acks += 1
            self._ack_through(cmd.event_number)
        elif isinstance(cmd, p.SegmentIsSealed | p.NoSuchSegment):
            if self._setup is not None and not self._setup.done():
                self._setup.set_result(cmd)
            self._mark_sealed()
        elif isinstance(cmd, p.WrongHost | p.InvalidEventNumber):
            log.warning("%s for %s: reconnecting", type(cmd).__name__, self.name)
            self._drop_connection()
        elif isinstance(cmd, p.AuthTokenCheckFailed) and self._setup and not self._setup.done():
            self._setup.set_result(cmd)  # _connect decides: a fresh token, or fail
        else:
            # An error reply we cannot recover from on this segment.
            self.owner._fail_events(self.take_unacked(), error_for_reply(cmd))

    def connection_lost(self, exc: BaseException) -> None:
        self._conn = None
        if self._setup is not None and not self._setup.done():
            self._setup.set_exception(ConnectionLost(str(exc)))
        self._wake.set()

    def _drop_connection(self) -> None:
        conn = self._conn
        if conn is not None:
            conn.detach_writer(self.writer_id)
            self.connection_lost(ConnectionLost("dropped by the writer"))

    def _ack_through(self, number: int) -> None:
        """Everything numbered up to ``number`` is stored (acks come in order)."""
        owner = self.owner
        # Queued blocks can hold stored events only after a reconnect (resent blocks).
        for blocks in (self.in_flight, self.queued):
            while blocks and blocks[0].last_number <= number:
                blk = blocks.popleft()
                if blk is self._open:
                    self._open = None
                owner._acked_block(blk)
            if blocks and blocks[0].first_number <= number:
                owner._acked_block(blocks[0].split(number))  # part of a block is stored
        self._wake.set()

    def _mark_sealed(self) -> None:
        if self.sealed:
            return
        self.sealed = True
        self.owner._stats.sealed_segments += 1
        self._wake.set()
        self.owner._segment_sealed(self)

    # ------------------------------------------------------------------ sender task

    async def _run(self) -> None:
        retry_delays = self.owner._retry.delays()
        session: int | None = None  # self._acks when the current session was set up
        try:
            while not self.closed and not self.sealed:
                if self._conn is None:
                    if session is not None and self.in_flight and self._acks == session:
                        # Set up, then lost with appends in flight and none acknowledged
                        # (a segment store that refuses every append by closing, as
                        # headrace does while its store is failed): back off as after a
                        # failed connect, or this loop reconnects at full speed forever.
                        exc = ConnectionLost(
                            f"{self.name}: the segment store closed the connection "
                            "with appends in flight and none acknowledged"
                        )
                        if not await self._back_off(retry_delays, exc):
                            return
                    elif session is not None:
                        retry_delays = self.owner._retry.delays()  # progress: start afresh
                    session = None
                    try:
                        await self._connect()
                        session = self._acks
                    except (ConnectionLost, RequestTimeout) as exc:
                        if not await self._back_off(retry_delays, exc):
                            return
                    continue
                self._send_blocks()
                self._wake.clear()
                if self._conn is None or self.sealed or self.closed:
                    continue
                if self._can_send():
                    await asyncio.sleep(0)  # room again: let acks and writes interleave
                    continue
                await self._wake.wait()
        except ServerError as exc:  # refused (no permission, ...): the caller's error
            log.debug("segment writer %s refused: %s", self.name, exc)
            self.owner._fail_events(self.take_unacked(), exc)
            self.owner._set_error(exc)
        except Exception as exc:  # a bug: surface it instead of hanging flush()
            log.exception("segment writer %s failed", self.name)
            self.owner._fail_events(self.take_unacked(), exc)
            self.owner._set_error(exc)
        finally:
            conn = self._conn
            if conn is not None:
                conn.detach_writer(self.writer_id)

    async def _back_off(self, delays: Iterator[float], exc: ClientError) -> bool:
        """Wait the retry policy's next delay; False (every unacknowledged event
        failed with ``exc``, the writer's fatal error) once the policy gives up."""
        delay = next(delays, None)
        if delay is None:
            self.owner._fail_events(self.take_unacked(), exc)
            self.owner._set_error(exc)
            return False
        await asyncio.sleep(delay)
        return True

    async def _connect(self) -> None:
        endpoint = await self.owner._controller.get_uri(self.segment)
        # one attempt: the writer's own retry asks the controller again first, so
        # a segment whose container failed over to another node is found there
        conn = await self.owner._pool.get(endpoint, ONE_ATTEMPT)
        rid = next_request_id()
        self._setup = asyncio.get_running_loop().create_future()
        conn.attach_writer(self.writer_id, self)
        self._conn = conn
        token = await self.owner._token(self.segment)
        conn.send_append(self.writer_id, rid, p.SetupAppend(rid, self.writer_id, self.name, token))
        try:
            async with asyncio.timeout(SETUP_TIMEOUT_S):
                reply = await self._setup
        except TimeoutError as exc:
            self._drop_connection()
            raise RequestTimeout(f"SetupAppend {self.name} timed out") from exc
        except ConnectionLost:
            self._conn = None
            raise
        if isinstance(reply, p.NoSuchSegment | p.SegmentIsSealed):
            return  # _mark_sealed already ran
        if not isinstance(reply, p.AppendSetup):
            self._conn = None
            conn.detach_writer(self.writer_id)
            if (
                isinstance(reply, p.AuthTokenCheckFailed)
                and reply.error_code == p.AuthTokenCheckFailed.TOKEN_EXPIRED
            ):
                # Set up again (after the retry policy's delay) with a fresh token.
                self.owner._controller.forget_token(self.segment.scope, self.segment.stream)
                raise ConnectionLost(f"SetupAppend {self.name}: delegation token expired")
            raise error_for_reply(reply)
        if self._set_up_before:
            self.owner._stats.reconnects += 1
        self._set_up_before = True
        # What the store holds is acknowledged; the rest goes out again, same numbers.
        stored = reply.last_event_number
        resend = list(self.in_flight)
        self.in_flight.clear()
        self.queued.extendleft(reversed(resend))
        for blk in resend:
            count = len(blk.positions)
            dup = min(count, max(0, stored - blk.first_number + 1))
            self.owner._stats.dedup_acked += dup
            self.owner._stats.resent_events += count - dup
        self._ack_through(stored)

    def _can_send(self) -> bool:
        """Whether the next queued block may go out now (``_send_blocks`` sends while so).

        Not while a large event is being stored, nor a large event before the
        appends in flight (its merge must come after them), nor the block still
        filling while anything is in flight (see ``MAX_BLOCKS_IN_FLIGHT``).
        """
        queued, in_flight = self.queued, self.in_flight
        if self._conn is None or not queued or self.sealed:
            return False
        if in_flight and (in_flight[-1].large or queued[0].large or queued[0] is self._open):
            return False
        return len(in_flight) < self.owner.max_blocks_in_flight

    def _send_blocks(self) -> None:
        queued = self.queued
        in_flight = self.in_flight
        while self._can_send():
            conn = self._conn
            assert conn is not None
            blk = queued.popleft()
            in_flight.append(blk)
            if blk.large:  # nothing else goes out until it is stored (_can_send)
                self._large_task = asyncio.create_task(
                    self._send_large(conn, blk), name=f"large event {self.name}"
                )
                return
            if blk is self._open:
                self._open = None  # sent: no more events go into it
            rid = next_request_id()
            # The data field left empty: the block's parts go out after the frame's
            # prefix, from where they lie (send_append_parts).
            cmd = p.AppendBlockEnd(
                self.writer_id, blk.size, b"", len(blk.positions), blk.last_number, rid
            )
            try:
                conn.send_append_parts(self.writer_id, rid, cmd, blk.pieces(), blk.size)
            except ConnectionLost:
                return  # connection_lost() already ran or will; the block stays in flight
            self.owner._stats.blocks_sent += 1

    async def _send_large(self, conn: SegmentStoreConnection, blk: _Block) -> None:
        """Store one large event (pravega.md#large-events): fill a transient segment in chunks with
        conditional appends, then merge it into the segment in one step.

        A connection lost on the way leaves the block in flight: the reconnect
        sends it again from the start (a new transient segment). Only a loss
        between the merge and its reply can store the event twice.
        """
        try:
            rid = next_request_id()
            token = await self.owner._token(self.segment)
            created = await conn.request(
                p.CreateTransientSegment(rid, self.writer_id, self.name, token)
            )
            if isinstance(created, p.NoSuchSegment | p.SegmentIsSealed):
                self._mark_sealed()
                return
            if not isinstance(created, p.SegmentCreated):
                raise error_for_reply(created)
            transient = created.segment
            await _fill_transient(conn, transient, blk.data(), token)
            rid = next_request_id()
            merged = await conn.request(p.MergeSegments(rid, self.name, transient, token))
            if isinstance(merged, p.NoSuchSegment | p.SegmentIsSealed):
                self._mark_sealed()
                return
            if not isinstance(merged, p.SegmentsMerged):
                raise error_for_reply(merged)
        except (ConnectionLost, RequestTimeout):
            if self._conn is conn:
                self._drop_connection()  # a timeout: start over on a fresh session
            return  # the reconnect sends the block again
        except ClientError as exc:
            if blk in self.in_flight:
                self.in_flight.remove(blk)
                self.owner._fail_events(blk.events(), exc)
            self._wake.set()
            return
        if blk in self.in_flight:
            self.in_flight.remove(blk)
            self.owner._acked_block(blk)
        self._wake.set()

    async def aclose(self) -> None:
        self.closed = True
        self._wake.set()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        if self._large_task is not None:
            self._large_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._large_task


class _ReplyQueue:
    """A writer listener that queues its replies (for the transient segment's writer)."""

    def __init__(self) -> None:
        self.replies: asyncio.Queue[p.Command | BaseException] = asyncio.Queue()

    def reply(self, cmd: p.Command) -> None:
        self.replies.put_nowait(cmd)

    def connection_lost(self, exc: BaseException) -> None:
        self.replies.put_nowait(ConnectionLost(str(exc)))

    async def next(self) -> p.Command:
        async with asyncio.timeout(SETUP_TIMEOUT_S):
            item = await self.replies.get()
        if isinstance(item, BaseException):
            raise item
        return item


async def _fill_transient(
    conn: SegmentStoreConnection, transient: str, data: bytes, token: str
) -> None:
    """Write ``data`` (one framed event) into a new transient segment, in chunks."""
    writer_id = uuid4()
    replies = _ReplyQueue()
    conn.attach_writer(writer_id, replies)
    try:
        rid = next_request_id()
        conn.send_append(writer_id, rid, p.SetupAppend(rid, writer_id, transient, token))
        setup = await replies.next()
        if not isinstance(setup, p.AppendSetup):
            raise error_for_reply(setup)
        for number, start in enumerate(range(0, len(data), LARGE_CHUNK_BYTES)):
            rid = next_request_id()
            chunk = data[start : start + LARGE_CHUNK_BYTES]
            conn.send_append(
                writer_id, rid, p.ConditionalBlockEnd(writer_id, number, start, chunk, rid)
            )
            ack = await replies.next()
            if not isinstance(ack, p.DataAppended):
                raise error_for_reply(ack)
    finally:
        conn.detach_writer(writer_id)


class EventWriter:
    """Writes events to one stream. Get one from ``PravegaClient.create_writer`` (or
    construct it and ``await writer.open()``); finish with :meth:`aclose`.

    Args:
        controller: the controller client (not closed by the writer).
        pool: segment-store connections (not closed by the writer).
        scope, stream: the stream.
        max_outstanding_events / max_outstanding_bytes: back-pressure bounds.
        max_blocks_in_flight: unacknowledged blocks per segment.
        retry: reconnect policy; when it gives up, events fail with the error.
        rust_client_compat: hash non-ASCII routing keys as the Rust client
            does instead of as the Java client (see ``routing.py``).
    """

    def __init__(
        self,
        controller: ControllerClient,
        pool: ConnectionPool,
        scope: str,
        stream: str,
        *,
        max_outstanding_events: int = MAX_OUTSTANDING_EVENTS,
        max_outstanding_bytes: int = MAX_OUTSTANDING_BYTES,
        max_blocks_in_flight: int = MAX_BLOCKS_IN_FLIGHT,
        retry: RetryPolicy = DEFAULT_RETRY,
        rust_client_compat: bool = False,
    ) -> None:
        self._controller = controller
        self._pool = pool
        self.scope = scope
        self.stream = stream
        self.max_outstanding_events = max_outstanding_events
        self.max_outstanding_bytes = max_outstanding_bytes
        self.max_blocks_in_flight = max_blocks_in_flight
        self._retry = retry
        self._rust_compat = rust_client_compat
        self._ranges: KeyRanges[_SegmentWriter] | None = None
        self._writers: dict[Segment, _SegmentWriter] = {}
        self._outstanding_events = 0
        self._outstanding_bytes = 0
        self._room = asyncio.Event()
        self._room.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._error: BaseException | None = None
        self._fatal: BaseException | None = None
        self._closed = False
        self._rerouting: set[asyncio.Task[None]] = set()
        self._stats = _Stats()
        self._since_yield = 0

    async def open(self) -> None:
        """Fetch the stream's open segments (once, before the first write).

        Raises:
            StreamSealedError: the stream has no open segment.
        """
        ranges = await self._controller.get_current_segments(self.scope, self.stream)
        if not ranges:
            raise StreamSealedError(f"stream {self.scope}/{self.stream} is sealed")
        self._install(ranges)

    def _install(self, ranges: Iterable[SegmentRange]) -> None:
        triples = []
        for r in ranges:
            w = self._writers.get(r.segment)
            if w is None or w.sealed:
                w = _SegmentWriter(self, r.segment, self._append_target(r.segment))
                self._writers[r.segment] = w
            triples.append((w, r.min_key, r.max_key))
        self._ranges = KeyRanges.from_ranges(triples)

    def _append_target(self, segment: Segment) -> str:
        """The name of the segment events for ``segment`` are appended to."""
        return segment.name

    # ------------------------------------------------------------------ writing

    @property
    def stats(self) -> dict[str, int]:
        """Counters: blocks sent, events acked, reconnects, events resent / deduplicated."""
        s = self._stats
        return {
            "blocks_sent": s.blocks_sent,
            "events_acked": s.events_acked,
            "reconnects": s.reconnects,
            "resent_events": s.resent_events,
            "dedup_acked": s.dedup_acked,
            "sealed_segments": s.sealed_segments,
        }

    async def write(self, event: bytes, routing_key: str | None = None) -> None:
        """Queue one event; returns once it is queued (not stored).

        Waits while the writer holds ``max_outstanding_*`` unacknowledged
        events or bytes, and yields to the event loop every
        ``YIELD_EVERY_EVENTS`` writes so that the segment writers send while a
        producer loops. A failure shows at the next :meth:`flush`.

        Raises:
            ValueError: the event is larger than ``MAX_EVENT_BYTES``.
            WriterClosedError: after ``aclose``.
            ClientError: a fatal error happened earlier (the stream is sealed,
                the server stayed unreachable past the retry policy).
        """
        self._put(event, routing_key, None)
        self._since_yield += 1
        if self._since_yield >= YIELD_EVERY_EVENTS or self._full():
            await self._pace()

    async def write_future(
        self, event: bytes, routing_key: str | None = None
    ) -> asyncio.Future[None]:
        """Queue one event and return a future resolved when it is stored (or failed)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._put(event, routing_key, fut)
        self._since_yield += 1
        if self._since_yield >= YIELD_EVERY_EVENTS or self._full():
            await self._pace()
        return fut

    async def write_and_wait(self, event: bytes, routing_key: str | None = None) -> None:
        """Write one event and wait until it is stored."""
        await (await self.write_future(event, routing_key))

    async def write_to_segment(self, event: bytes, segment_id: int) -> None:
        """Queue one event for the open segment ``segment_id`` (as a Kafka
        producer names a partition); returns once it is queued.

        The event takes the middle of that segment's key range, so if the
        segment is sealed before it is stored it goes where a key there would.

        Raises:
            ValueError: ``segment_id`` is not an open segment of the stream
                (for a transaction: when it began), or the event is too large.
        """
        self._put(event, None, None, self._segment_position(segment_id))
        self._since_yield += 1
        if self._since_yield >= YIELD_EVERY_EVENTS or self._full():
            await self._pace()

    def _segment_position(self, segment_id: int) -> float:
        ranges = self._ranges
        assert ranges is not None
        for i, w in enumerate(ranges.segments):
            if w.segment.segment_id == segment_id:
                low = ranges.upper_bounds[i - 1] if i else 0.0
                return (low + ranges.upper_bounds[i]) / 2
        open_ids = sorted(w.segment.segment_id for w in ranges.segments)
        raise ValueError(
            f"segment {segment_id} is not an open segment of {self.scope}/{self.stream} "
            f"(open: {open_ids})"
        )

    def _put(
        self,
        event: bytes,
        routing_key: str | None,
        fut: asyncio.Future[None] | None,
        position: float | None = None,
    ) -> None:
        if self._closed:
            raise WriterClosedError("the writer is closed")
        if self._fatal is not None:
            raise self._fatal
        size = len(event)
        if size > MAX_EVENT_BYTES:
            raise ValueError(f"event of {size} bytes exceeds {MAX_EVENT_BYTES}")
        if position is not None:
            pass
        elif routing_key is None:
            position = random.random()
        elif self._rust_compat:
            position = routing_key_position(routing_key, rust_client_compat=True)
        else:
            position = _cached_position(routing_key)
        self._outstanding_events += 1
        self._outstanding_bytes += size + 8
        idle = self._idle
        if idle.is_set():
            idle.clear()
        ranges = self._ranges
        assert ranges is not None
        segments = ranges.segments
        w = segments[0] if len(segments) == 1 else ranges.segment_for_position(position)
        w.add(event, position, fut)

    def _full(self) -> bool:
        return (
            self._outstanding_events >= self.max_outstanding_events
            or self._outstanding_bytes >= self.max_outstanding_bytes
        )

    async def _pace(self) -> None:
        """Yield to the loop, then wait while the writer is full (back-pressure)."""
        self._since_yield = 0
        await asyncio.sleep(0)
        while self._full():
            if self._fatal is not None:
                raise self._fatal
            self._room.clear()
            await self._room.wait()

    async def flush(self) -> None:
        """Wait until every event written so far is stored.

        Raises:
            ClientError: the first failure of a ``write`` since the last flush.
        """
        await self._idle.wait()
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    async def aclose(self) -> None:
        """Flush, then stop the segment writers. The controller and pool stay open.

        After a fatal error (already raised by ``write``) nothing is flushed
        and nothing is raised.

        Raises:
            ClientError: as :meth:`flush`.
        """
        if self._closed:
            return
        try:
            if self._fatal is None:
                await self.flush()
        finally:
            self._closed = True
            for task in list(self._rerouting):
                task.cancel()
            for w in list(self._writers.values()):
                await w.aclose()

    async def __aenter__(self) -> EventWriter:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # ------------------------------------------------------------------ bookkeeping

    async def _token(self, segment: Segment) -> str:
        """The delegation token for the stream of ``segment`` ("" with auth off)."""
        return await self._controller.delegation_token(segment.scope, segment.stream)

    def _release(self, events: list[_Pending]) -> None:
        self._release_counts(len(events), sum(len(e.framed) for e in events))

    def _release_counts(self, count: int, size_bytes: int) -> None:
        self._outstanding_events -= count
        self._outstanding_bytes -= size_bytes
        if not self._room.is_set():
            self._room.set()
        if self._outstanding_events == 0:
            self._idle.set()

    def _acked_block(self, block: _Block) -> None:
        count = len(block.positions)
        self._stats.events_acked += count
        if block.futures:
            for fut in block.futures.values():
                if not fut.done():
                    fut.set_result(None)
        self._release_counts(count, block.size)

    def _acked(self, events: list[_Pending]) -> None:
        self._stats.events_acked += len(events)
        for e in events:
            if e.future is not None and not e.future.done():
                e.future.set_result(None)
        self._release(events)

    def _fail_events(self, events: list[_Pending], exc: BaseException) -> None:
        if not events:
            return
        for e in events:
            if e.future is not None and not e.future.done():
                e.future.set_exception(exc)
        if self._error is None:
            self._error = exc
        self._release(events)

    def _set_error(self, exc: BaseException) -> None:
        self._fatal = exc
        if self._error is None:
            self._error = exc
        self._room.set()

    def _segment_sealed(self, sealed: _SegmentWriter) -> None:
        task = asyncio.create_task(self._reroute(sealed), name=f"reroute {sealed.segment.name}")
        self._rerouting.add(task)
        task.add_done_callback(self._rerouting.discard)

    async def _reroute(self, sealed: _SegmentWriter) -> None:
        """Move a sealed segment's unacknowledged events to the stream's current segments."""
        delays = self._retry.delays()
        while True:
            try:
                ranges = await self._controller.get_current_segments(self.scope, self.stream)
            except ClientError as exc:
                self._abandon(sealed, exc)
                return
            if not ranges:
                self._abandon(
                    sealed, StreamSealedError(f"stream {self.scope}/{self.stream} is sealed")
                )
                return
            if not any(self._is_sealed_writer(r.segment) for r in ranges):
                break
            # The controller still lists a segment the store reports sealed: it is
            # finishing a scale; ask again shortly.
            delay = next(delays, None)
            if delay is None:
                self._abandon(sealed, StreamSealedError(f"{sealed.segment.name} is sealed"))
                return
            await asyncio.sleep(delay)
        # Synchronous from here: no write can slip in between the swap and the move.
        events = sealed.take_unacked()
        self._install(ranges)
        assert self._ranges is not None
        for e in events:
            target = self._ranges.segment_for_position(e.position)
            target.add(e.framed[8:], e.position, e.future)
        old = self._writers.pop(sealed.segment, None)
        if old is not None:
            await old.aclose()

    def _abandon(self, sealed: _SegmentWriter, exc: ClientError) -> None:
        self._fail_events(sealed.take_unacked(), exc)
        self._set_error(exc)

    def _is_sealed_writer(self, segment: Segment) -> bool:
        w = self._writers.get(segment)
        return w is not None and w.sealed
