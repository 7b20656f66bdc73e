"""Reactive Streams IO front door (port 7070): subscriptions to streams, and offers into them.

The wire is ``headrace.protocols.rsio`` (rsio-v0, ``docs/protocols/rsio.md``);
this module is the thin adapter between it and the store:

* **Dispatch table** (:meth:`RsioHandler.handle`): ``subscribe`` starts a
  publication task, ``request`` wakes it, ``cancel`` stops it; ``subscribe``
  to ``offer:<stream>`` starts an offer (the server subscribes back to the
  client and appends what it publishes). ``handle`` never awaits, so events
  take effect in wire order.
* **Error table** (:data:`STORE_ERROR_REASONS`): a store or controller error
  ends only the subscription it hit, with ``onError(id, reason)``.
* **Auth** (``server/authz.py``): with auth on, a subscription needs READ on
  its stream and an offer READ_UPDATE, for the user the client's certificate
  names or the one its ``auth:`` subscription logged in as (the ``auth``
  extension, ``docs/protocols/rsio.md#auth``). A refusal is that
  subscription's ``onError``. Subscriptions that arrive while a login is
  being checked wait for its outcome in their own tasks.

Theory of operation. Each subscription runs in its own task that reads the
store through :class:`StreamCursor` (records, as every reader sees them,
as the subscription's elements) and
sends an element only while the subscriber's demand allows; the
subscription's only pace is its demand. A task with no demand reads nothing:
it waits on an event that ``request`` sets; a task at the tail long-polls the
store (``store.watch``, woken by appends). Reads are sized by the demand
(:data:`MIN_READ_BYTES` to :data:`READ_CHUNK_BYTES`), and stored events are
cut into elements (TANK bundles unpacked, each to at most
``MAX_STORED_UNPACKED_BYTES``) only as the demand takes them. A task reads
only while what the connection has queued (not yet taken by the writer) and
what its other subscriptions hold for their demand stay under
:data:`MAX_UNSENT_BYTES`, and stops queueing above it; what subscriptions
without demand keep is bounded by :data:`MAX_IDLE_HELD_BYTES` per connection.
So a subscriber that does not read, or subscribes a thousand times without
demand, costs bounded memory, and, as every connection and subscription has
its own tasks, slows nobody else.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from urllib.parse import parse_qs

from headrace.controller.auth import AuthFailed
from headrace.controller.naming import segment_name
from headrace.errors import (
    HeadraceError,
    LocalProtocolError,
    OwnerUnavailable,
    RemoteProtocolError,
    SegmentNotFound,
    SegmentSealed,
    SegmentTruncated,
    StoreError,
)
from headrace.protocols.pravega import EVENT_HEADER
from headrace.protocols.pravega.auth import Permission, stream_resource
from headrace.protocols.pravega.routing import KeyRanges, routing_key_position
from headrace.protocols.records import EventBuffer, Record, bundle_records
from headrace.protocols.rsio import (
    SPLIT_THRESHOLD_BYTES,
    Cancel,
    ClientHello,
    ConnectionClosed,
    ConnectionState,
    Goodbye,
    IllegalDemand,
    OnComplete,
    OnError,
    OnNext,
    OnNextPacked,
    ReactiveConnection,
    Request,
    Role,
    Subscribe,
    Subscribed,
    SubscriptionAborted,
    split_element,
)
from headrace.protocols.rsio.codec import (
    MAX_VARINT_BYTES,
    decode_message,
    decode_varint,
    encode_varint,
)
from headrace.protocols.rsio.states import PublisherState, SubscriberState
from headrace.server._context import Listener, ListenerContext
from headrace.server._listen import start_tcp_listener
from headrace.server._loop import ConnectionHandler
from headrace.server.authz import ConnectionAccess
from headrace.store.api import MAX_APPEND_BYTES, MAX_WAIT_S

__all__ = [
    "AUTH_EXTENSION",
    "AUTH_PREFIX",
    "MAX_IDLE_HELD_BYTES",
    "MAX_UNSENT_BYTES",
    "MIN_READ_BYTES",
    "OFFER_EXTENSION",
    "OFFER_WINDOW",
    "READ_CHUNK_BYTES",
    "PublisherQuery",
    "RsioHandler",
    "StreamCursor",
    "encode_record",
    "parse_publisher",
    "start_rsio",
]

log = logging.getLogger(__name__)

OFFER_EXTENSION = 1
"""Extension Id of headrace's ``offer`` (``docs/protocols/rsio.md#offer``), listed in our hello."""

AUTH_EXTENSION = 2
"""Extension Id of headrace's ``auth`` (``docs/protocols/rsio.md#auth``): the client
logs in with a subscription to ``auth:<Basic credentials or Bearer token>``."""

AUTH_PREFIX = "auth:"
"""Publisher strings of the ``auth`` extension start with it."""

EXTENSIONS = (OFFER_EXTENSION, AUTH_EXTENSION)
"""Every extension the server knows; its hello lists those the client listed too."""

ELEMENT_OVERHEAD_BYTES = 16
"""What ``_unsent`` counts for an element beyond its bytes: its frame's prefixes, at most."""

MAX_UNSENT_BYTES = 1 << 20
"""Bytes one connection may have queued that the writer has not yet taken.

Publication tasks wait above it; the writer drains the socket before taking
more. 1 MiB keeps a fast subscriber's pipe full (a few socket buffers) and
bounds what a subscriber that stopped reading costs.
"""

READ_CHUNK_BYTES = 256 * 1024
"""Most bytes asked of the store per read (more only for one event that is larger):
a few hundred small records, or one large one. Also what one subscription reads
in one turn over its segments."""

MIN_READ_BYTES = 4096
"""Fewest bytes asked of the store per read: a demand of a few small elements
still reads a page at once instead of one element at a time."""

DEFAULT_ELEMENT_BYTES = 1024
"""Stored bytes an element is taken to cost until a segment's first read says
(reads are sized by demand times this)."""

MAX_IDLE_HELD_BYTES = 4 * 1024 * 1024
"""Bytes read or unpacked that one connection's subscriptions at demand 0 may
keep for when demand comes. Past it a subscription whose demand runs out lets
go of what it holds and reads it again later, so many subscriptions left
without demand cost the server next to nothing."""

TAIL_WAIT_S = min(30.0, MAX_WAIT_S)
"""One long-poll at the tail; the task simply polls again (woken by appends, not by time)."""

OFFER_WINDOW = 4096
"""Elements an offering client may have in flight: the ``initialDemand`` of the server's
subscription to it. Each durable append grants as many as it stored, so storage
paces the producer; 4096 small elements fill one group commit."""

MAX_OFFER_BATCH_BYTES = 1 << 20
"""Framed bytes per append of an offer; below ``MAX_APPEND_BYTES``."""

assert MAX_OFFER_BATCH_BYTES <= MAX_APPEND_BYTES

STORE_ERROR_REASONS: dict[type[HeadraceError], str] = {
    SegmentNotFound: "stream segment not found (stream deleted?)",
    SegmentSealed: "stream is sealed",
    OwnerUnavailable: "unavailable, try again",  # another node owns it, or nobody right now
    StoreError: "store error",
}
"""The onError reason for a store error (the error's text is appended)."""


def _reason(exc: BaseException) -> str:
    for kind, reason in STORE_ERROR_REASONS.items():
        if isinstance(exc, kind):
            return f"{reason}: {exc}"
    return str(exc) or type(exc).__name__


# --------------------------------------------------------------------------- publisher strings


@dataclass(frozen=True, slots=True)
class PublisherQuery:
    """A parsed publisher string (``docs/protocols/rsio.md#publisher-strings``)."""

    scope: str
    stream: str
    start: str | dict[int, int] = "earliest"
    """``"earliest"``, ``"latest"`` or a stream cut ``{segment id: offset}``."""
    until: dict[int, int] | None = None
    fmt: str = "value"
    offer: bool = False
    key: str | None = None


def _parse_cut(text: str, what: str) -> dict[int, int]:
    cut: dict[int, int] = {}
    for part in text.split(","):
        sid, sep, offset = part.partition(":")
        if not sep or not sid.isdigit() or not offset.isdigit():
            raise ValueError(f"{what}={text!r}: a stream cut is <segment id>:<offset>,...")
        cut[int(sid)] = int(offset)
    return cut


def parse_publisher(publisher: str) -> PublisherQuery:
    """Parse ``[offer:]scope/stream[?from=...&until=...&format=...&key=...]``.

    Raises:
        ValueError: with a reason fit for ``onError``.
    """
    offer = publisher.startswith("offer:")
    if offer:
        publisher = publisher.removeprefix("offer:")
    name, _, query = publisher.partition("?")
    scope, sep, stream = name.partition("/")
    if not sep or not scope or not stream or "/" in stream:
        raise ValueError(f"bad publisher {name!r}: expected scope/stream")
    try:
        params = parse_qs(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise ValueError(f"bad query {query!r}") from None
    allowed = {"key"} if offer else {"from", "until", "format"}
    for param, values in params.items():
        if param not in allowed:
            raise ValueError(f"unknown query parameter {param!r}")
        if len(values) != 1:
            raise ValueError(f"query parameter {param!r} given {len(values)} times")
    one = {param: values[0] for param, values in params.items()}
    if offer:
        return PublisherQuery(scope, stream, offer=True, key=one.get("key"))
    start: str | dict[int, int] = one.get("from", "earliest")
    if start not in ("earliest", "latest"):
        start = _parse_cut(str(start), "from")
    until = _parse_cut(one["until"], "until") if "until" in one else None
    fmt = one.get("format", "value")
    if fmt not in ("value", "record"):
        raise ValueError(f"format={fmt!r}: expected value or record")
    return PublisherQuery(scope, stream, start, until, fmt)


def encode_record(record: Record, segment_id: int) -> bytes:
    """The ``format=record`` element (``docs/protocols/rsio.md#record-format``).

    ``segment_id · offset · index · flags · [key] · [timestamp_ms] · value``,
    varints, ``key`` length-prefixed; ``flags`` bit 0 = key present, bit 1 =
    timestamp present; the value is the rest of the element.
    """
    flags = (1 if record.key is not None else 0) | (2 if record.timestamp_ms is not None else 0)
    parts = [
        encode_varint(segment_id),
        encode_varint(record.offset),
        encode_varint(record.index),
        bytes((flags,)),
    ]
    if record.key is not None:
        parts += [encode_varint(len(record.key)), record.key]
    if record.timestamp_ms is not None:
        parts.append(encode_varint(max(0, record.timestamp_ms)))
    parts.append(record.value)
    return b"".join(parts)


# --------------------------------------------------------------------------- reading


class _Holding:
    """Read and unpacked bytes one connection's subscriptions hold, reads in flight
    included: by those with demand (``active_bytes``, counted against the
    connection's room before any of them reads) and by those at demand 0
    (``idle_bytes``, bounded by ``MAX_IDLE_HELD_BYTES``)."""

    __slots__ = ("active_bytes", "idle_bytes")

    def __init__(self) -> None:
        self.active_bytes = 0
        self.idle_bytes = 0


@dataclass(slots=True, eq=False)
class _SegmentRead:
    sid: int
    name: str
    events: EventBuffer
    until: int | None
    pending: Iterator[tuple[int, bytes]] | None = None
    """The events of the last read not cut out yet: they are cut only as demand takes them."""
    ahead: tuple[int, bytes] | None = None
    """The next of them (offset, payload), taken out one ahead so that the end of
    the read is known as soon as its last element is handed out."""
    read_bytes: int = 0
    """Bytes of the last read while ``pending`` holds on to them."""
    elements: deque[bytes] = field(default_factory=deque)
    """Elements cut out and not yet handed out (``_cut``)."""
    cut: list[tuple[int, int, int]] = field(default_factory=list)
    """Per stored event whose elements are in ``elements``: (offset, elements of it
    there, elements of it handed out before), to know where to read again."""
    cut_bytes: int = 0
    """Bytes of the elements cut out, until they are all handed out."""
    cut_end: int = 0
    """Segment offset after the last event cut out."""
    skip: int = 0
    """Elements of the event at ``events.offset`` handed out before ``drop``."""
    element_bytes: float = DEFAULT_ELEMENT_BYTES
    """Stored bytes per element so far: how much to read for a demand."""
    held_bytes: int = 0
    at_end: bool = False
    """Read to its end (sealed, or ``until``); finished once everything is handed out."""
    successors: bool = True
    finished: bool = False


class StreamCursor:
    """Reads one stream as records straight from the store, from a start to an end,
    against demand.

    Segments are read in turns; a read asks for about what the demand will take
    (``element_bytes`` per element, from ``MIN_READ_BYTES`` to
    ``READ_CHUNK_BYTES``, more only for one larger event), and its events are
    cut into elements only as they are taken, so a subscription holds little
    more than what it was asked for. A sealed segment that is read to its end
    and handed out hands over to its successors once all their predecessors
    are done, so per-key order holds across scaling. ``until`` stops each
    segment of the cut at its offset and reads no successor of it. At the tail
    of every segment, :meth:`fill` long-polls the store.

    What the cursor holds is counted in the connection's ``_Holding``; at
    demand 0 (:meth:`set_idle`) past ``MAX_IDLE_HELD_BYTES`` for the
    connection, it lets go of it (:meth:`drop`) and reads it again later.
    An event of a TANK topic that is not a bundle is skipped and counted
    (``skipped``).
    """

    def __init__(
        self,
        app: ListenerContext,
        query: PublisherQuery,
        holding: _Holding | None = None,
        skipped: Callable[[], None] = lambda: None,
    ) -> None:
        self._app = app
        self.scope = query.scope
        self.stream = query.stream
        self._query = query
        self.tank = query.scope == app.config.tank_scope
        self._plain = not self.tank and query.fmt == "value"
        """One element per stored event, its payload (the common case, cut in a tight loop)."""
        self._holding = holding if holding is not None else _Holding()
        self._skipped = skipped
        self.held_bytes = 0
        self.idle = False
        self.demand = 1
        """The demand the next elements are cut for (set by the publisher)."""
        self._segments: list[_SegmentRead] = []
        self._started: set[int] = set()
        self._finished: set[int] = set()
        self._turn = 0
        self._read_turn = 0

    @property
    def name(self) -> str:
        return f"{self.scope}/{self.stream}"

    async def open(self) -> None:
        """Resolve the start position.

        Raises:
            ValueError: unknown stream or an invalid stream cut.
        """
        controller = self._app.controller
        query = self._query
        if not controller.stream_exists(self.scope, self.stream):
            raise ValueError(f"no such stream {self.name}")
        for what, cut in (("from", query.start), ("until", query.until)):
            if isinstance(cut, dict) and not controller.is_stream_cut_valid(
                self.scope, self.stream, cut
            ):
                raise ValueError(f"{what}: not a stream cut of {self.name}")
        start: dict[int, int] = {}
        if query.start == "earliest":
            for head in await controller.head_segments(self.scope, self.stream):
                start[head.segment.id] = head.offset
        elif query.start == "latest":
            for seg in controller.current_segments(self.scope, self.stream):
                info = await self._app.store.info(segment_name(self.scope, self.stream, seg.id))
                start[seg.id] = info.length
        else:
            assert isinstance(query.start, dict)
            start = dict(query.start)
        for sid, offset in sorted(start.items()):
            self._launch(sid, offset)

    def _launch(self, sid: int, offset: int) -> None:
        self._started.add(sid)
        until = None if self._query.until is None else self._query.until.get(sid)
        seg = _SegmentRead(
            sid, segment_name(self.scope, self.stream, sid), EventBuffer(offset), until
        )
        seg.cut_end = offset
        self._segments.append(seg)
        if until is not None and offset >= until:
            seg.at_end = True  # at the cut already: nothing to read, no successors
            seg.successors = False
            self._finish(seg)

    @property
    def done(self) -> bool:
        """Every segment read to its end (sealed or ``until``) and handed out."""
        return all(seg.finished for seg in self._segments)

    @property
    def has_elements(self) -> bool:
        """Whether :meth:`pop` may have an element to give without reading."""
        return any(seg.elements or seg.ahead is not None for seg in self._segments)

    def pop(self) -> bytes | None:
        """The next element ready to send, taking segments in turns; None if none is read yet."""
        segments = self._segments
        for _ in range(len(segments)):
            seg = segments[self._turn % len(segments)]
            self._turn += 1
            if not seg.elements and (seg.ahead is None or not self._cut(seg)):
                continue
            element = seg.elements.popleft()
            if not seg.elements:
                seg.cut.clear()
                self._account(seg, cut_bytes=0)
                self._finish(seg)
            return element
        return None

    # -- what is held

    def _account(self, seg: _SegmentRead, *, read_bytes: int = -1, cut_bytes: int = -1) -> None:
        """Set what ``seg`` holds (-1: unchanged) and count the change."""
        if read_bytes >= 0:
            seg.read_bytes = read_bytes
        if cut_bytes >= 0:
            seg.cut_bytes = cut_bytes
        held = seg.read_bytes + len(seg.events.buffer) + seg.cut_bytes
        self._change(held - seg.held_bytes)
        seg.held_bytes = held

    def _change(self, delta: int) -> None:
        self.held_bytes += delta
        if self.idle:
            self._holding.idle_bytes += delta
        else:
            self._holding.active_bytes += delta

    def set_idle(self, idle: bool) -> None:
        """Count what the cursor holds as idle (demand 0) or active; an idle cursor
        lets go of it (``drop``) while the connection's idle cursors hold more
        than ``MAX_IDLE_HELD_BYTES``."""
        if idle == self.idle:
            return
        held = self.held_bytes
        self._change(-held)
        self.idle = idle
        self._change(held)
        if idle and self._holding.idle_bytes > MAX_IDLE_HELD_BYTES:
            self.drop()

    def release(self) -> None:
        """The subscription ended: count nothing held any more."""
        self._change(-self.held_bytes)

    def drop(self) -> None:
        """Let go of every byte read or cut out and not handed out: each segment is
        read again from the first event not wholly handed out, skipping the
        elements of it that were."""
        for seg in self._segments:
            if seg.finished or not seg.held_bytes:
                continue
            offset, skip = seg.cut_end, seg.skip
            if self._plain:  # the elements left are the payloads of the last events cut
                offset -= sum(EVENT_HEADER.size + len(element) for element in seg.elements)
            handed = sum(count for _, count, _ in seg.cut) - len(seg.elements)
            for event_offset, count, before in seg.cut:
                if handed < count:
                    offset, skip = event_offset, before + handed
                    break
                handed -= count
            seg.events = EventBuffer(offset)
            seg.pending = seg.ahead = None
            seg.elements.clear()
            seg.cut.clear()
            seg.cut_end = offset
            seg.skip = skip
            seg.at_end = False  # reading again finds the end again
            self._account(seg, read_bytes=0, cut_bytes=0)

    # -- cutting elements out of what was read

    def _cut(self, seg: _SegmentRead) -> bool:
        """Cut elements for the current demand out of the last read; False if it gave none."""
        if self._plain:
            return self._cut_plain(seg)
        cut = 0
        cut_bytes = seg.cut_bytes
        while seg.ahead is not None and cut < self.demand and cut_bytes < READ_CHUNK_BYTES:
            offset, payload = seg.ahead
            seg.ahead = _next_event(seg)
            elements = self._elements(seg, offset, payload)
            stored = EVENT_HEADER.size + len(payload)
            seg.cut_end = offset + stored
            before = 0
            if seg.skip:
                before, seg.skip = seg.skip, 0
                elements = elements[before:]
            if elements:
                seg.element_bytes += (stored / len(elements) - seg.element_bytes) / 4
                seg.elements.extend(elements)
                seg.cut.append((offset, len(elements), before))
                cut += len(elements)
                cut_bytes += sum(map(len, elements))
        self._account(seg, read_bytes=seg.read_bytes if seg.ahead else 0, cut_bytes=cut_bytes)
        self._finish(seg)
        return bool(seg.elements)

    def _cut_plain(self, seg: _SegmentRead) -> bool:
        """``_cut`` when every event is one element, its payload: no bookkeeping per
        event (``drop`` finds where to read again from the elements left)."""
        pending, ahead = seg.pending, seg.ahead
        assert pending is not None and ahead is not None
        append = seg.elements.append
        first, payload = ahead
        offset = first
        cut_bytes = seg.cut_bytes
        count = 0
        demand, most = self.demand, READ_CHUNK_BYTES
        while ahead is not None and count < demand and cut_bytes < most:
            offset, payload = ahead
            append(payload)
            count += 1
            cut_bytes += len(payload)
            ahead = next(pending, None)
        seg.ahead = ahead
        if ahead is None:
            seg.pending = None
        end = seg.cut_end = offset + EVENT_HEADER.size + len(payload)
        seg.element_bytes += ((end - first) / count - seg.element_bytes) / 4
        self._account(seg, read_bytes=seg.read_bytes if ahead else 0, cut_bytes=cut_bytes)
        self._finish(seg)
        return True

    def _elements(self, seg: _SegmentRead, offset: int, payload: bytes) -> list[bytes]:
        """The elements of one stored event: its value(s), or ``format=record`` encodings.

        A Pravega event's value is its payload, taken without a ``Record`` in
        between (the common case). An event of a TANK topic that is not a
        bundle gives none and is counted.
        """
        fmt = self._query.fmt
        if not self.tank:
            return [
                encode_record(Record(self.name, seg.name, offset, None, payload, None), seg.sid)
            ]
        records = bundle_records(self.name, seg.name, offset, payload)
        if records is None:
            self._skipped()
            return []
        if fmt == "value":
            return [record.value for record in records]
        return [encode_record(record, seg.sid) for record in records]

    # -- reading

    async def probe_end(self) -> bool:
        """At demand 0: finish segments that are read to their sealed end without
        reading (``info``), so that a stream that has nothing more completes
        without demand. Whether one finished.

        Raises:
            StoreError: the store failed (a deleted stream: ``SegmentNotFound``).
        """
        store = self._app.store
        finished = False
        changed = True
        while changed:
            changed = False
            for seg in list(self._segments):
                if seg.finished or seg.at_end or seg.held_bytes or seg.ahead or seg.elements:
                    continue
                info = await store.info(seg.name)
                if info.sealed and seg.events.offset >= info.length:
                    seg.at_end = True
                    self._finish(seg)
                    finished = changed = True
        return finished

    async def fill(self) -> None:
        """Read for the current demand until some element is ready, a segment ends,
        or a long-poll at the tail ran out.

        Raises:
            StoreError: the store failed (a deleted stream: ``SegmentNotFound``).
        """
        store = self._app.store
        self._segments = [seg for seg in self._segments if not seg.finished]
        reading = [
            seg
            for seg in self._segments
            if not seg.at_end and not seg.elements and seg.ahead is None
        ]
        if reading:  # a busy segment cannot starve the others: turns start in turn
            start = self._read_turn % len(reading)
            self._read_turn += 1
            reading = reading[start:] + reading[:start]
        progress = False
        waiting: list[_SegmentRead] = []
        got_bytes = 0
        for seg in reading:
            if got_bytes >= READ_CHUNK_BYTES:
                break  # enough for this turn; the others read on the next
            offset = seg.events.offset + len(seg.events.buffer)
            want = min(READ_CHUNK_BYTES, max(MIN_READ_BYTES, int(self.demand * seg.element_bytes)))
            want = max(want, seg.events.missing_bytes())
            if seg.until is not None:
                want = min(want, seg.until - offset)
            self._change(want)  # held while the read is in flight
            try:
                got = await store.read(seg.name, offset, want)
            except SegmentTruncated:
                info = await store.info(seg.name)  # retention moved the head: go on from there
                seg.events = EventBuffer(info.start_offset)
                seg.cut_end = info.start_offset
                seg.skip = 0
                self._account(seg)
                progress = True
                continue
            finally:
                self._change(-want)
            if got.data:
                progress = True
                got_bytes += len(got.data)
                seg.pending = seg.events.feed(got.data)
                seg.ahead = _next_event(seg)
                self._account(seg, read_bytes=len(got.data) if seg.ahead else 0)
            reached_until = seg.until is not None and offset + len(got.data) >= seg.until
            if got.end_of_segment or reached_until:
                progress = True
                seg.at_end = True
                seg.successors = not reached_until
                self._finish(seg)
            elif not got.data:
                waiting.append(seg)
        if not progress and waiting:
            await self._wait_any(waiting)

    async def _wait_any(self, segments: list[_SegmentRead]) -> None:
        """Park until one of ``segments`` changes (or ``TAIL_WAIT_S`` passes).

        One future watches them all (``store.watch``): no task per segment.
        The caller reads again, which raises for a segment deleted meanwhile.
        """
        store = self._app.store
        loop = asyncio.get_running_loop()
        wake: asyncio.Future[None] = loop.create_future()
        watched: list[str] = []
        try:
            for seg in segments:
                if not store.watch(seg.name, seg.events.offset + len(seg.events.buffer), wake):
                    return  # ready already
                watched.append(seg.name)
            timer = loop.call_later(TAIL_WAIT_S, _resolve, wake)
            try:
                await wake
            finally:
                timer.cancel()
        finally:
            for name in watched:
                store.unwatch(name, wake)

    def _finish(self, seg: _SegmentRead) -> None:
        """Once a segment read to its end is handed out: hand over to its successors."""
        if not seg.at_end or seg.finished or seg.ahead is not None or seg.elements:
            return
        seg.finished = True
        self._finished.add(seg.sid)
        if not seg.successors:
            return
        controller = self._app.controller
        for succ in controller.successors(self.scope, self.stream, seg.sid):
            sid = succ.segment.id
            if sid in self._started:
                continue
            if all(p in self._finished or p not in self._started for p in succ.predecessors):
                self._launch(sid, 0)


def _next_event(seg: _SegmentRead) -> tuple[int, bytes] | None:
    """The next whole event of ``seg``'s last read; None (and the read let go) at its end."""
    event = next(seg.pending, None) if seg.pending is not None else None
    if event is None:
        seg.pending = None
    return event


def _resolve(wake: asyncio.Future[None]) -> None:
    """A parked read's timer: wake it to read again."""
    if not wake.done():
        wake.set_result(None)


# --------------------------------------------------------------------------- the handler


@dataclass(slots=True)
class _Elements:
    """Consecutive ``onNext`` s of one offer, received together (an internal event)."""

    subscriber: int
    elements: list[bytes]


@dataclass(slots=True, eq=False)
class _Offer:
    """A client's offer: we subscribed to its publisher and append what it sends."""

    query: PublisherQuery
    elements: deque[bytes] = field(default_factory=deque)
    completed: bool = False
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


class RsioHandler(ConnectionHandler):
    """One RS-IO connection: its subscriptions (we publish) and offers (we subscribe)."""

    name = "rsio"

    def __init__(self, app: ListenerContext, *, listener: str = "rsio") -> None:
        self._app = app
        self._listener = listener
        self._access: ConnectionAccess | None = None
        self._login: asyncio.Task[None] | None = None
        self._conn = ReactiveConnection(Role.SERVER)  # replaced once the clientHello is in
        self._started = False
        self._early = bytearray()
        self._peer_extensions: frozenset[int] = frozenset()
        self._publications: dict[int, tuple[asyncio.Task[None], asyncio.Event]] = {}
        self._offers: dict[int, _Offer] = {}
        self._unsent = 0
        self._room = asyncio.Event()
        self._room.set()
        self._holding = _Holding()
        self._skipped = app.metrics.skipped_events.labels("rsio").inc

    # -- the loop's interface

    def partial_frame_bytes(self) -> int:
        return self._conn.buffered_bytes if self._started else len(self._early)

    def feed(self, data: bytes) -> Iterator[object]:
        if self._started:
            self._conn.receive_data(data)
        else:
            self._early += data
            extensions = _offered_extensions(bytes(self._early), eof=not data)
            if extensions is None:
                return  # the clientHello is not complete yet
            self._conn = ReactiveConnection(Role.SERVER, extensions=extensions)
            self._started = True
            early, self._early = bytes(self._early), bytearray()
            if early:
                self._conn.receive_data(early)
            if not data:
                self._conn.receive_data(b"")
            self.wake_writer()  # our hello
        # Consecutive elements of one offer become one event: an offer of many
        # small elements would otherwise cost the loop a task per element.
        run: _Elements | None = None
        try:
            for event in self._conn.events():
                if isinstance(event, OnNext) and event.subscriber in self._offers:
                    if run is not None and run.subscriber == event.subscriber:
                        run.elements.append(event.element)
                        continue
                    if run is not None:
                        yield run
                    run = _Elements(event.subscriber, [event.element])
                    continue
                if run is not None:
                    yield run
                    run = None
                yield event
        except RemoteProtocolError:
            if run is not None:
                yield run  # the elements before the error still count
            raise
        if run is not None:
            yield run

    def data_to_send(self) -> bytes:
        if not self._started:
            return b""
        data = self._conn.data_to_send()
        self._unsent = 0
        self._room.set()
        return data

    def on_protocol_error(self, exc: RemoteProtocolError) -> None:
        if isinstance(exc.reply_hint, Goodbye):
            with contextlib.suppress(LocalProtocolError):
                self._conn.send(exc.reply_hint)

    def busy(self) -> bool:
        return bool(self._publications or self._offers)

    async def on_close(self) -> None:
        self._stop_all()

    def inline(self, event: object) -> bool:
        # ``handle`` never awaits and uses neither ``current_task`` nor a timeout:
        # every event (an offer's elements above all) is handled in the read loop,
        # with no task of its own, in wire order. Not once the peer broke the
        # protocol further on in what was received (the connection then refuses
        # to send anything but the goodbye): those events go the way of tasks,
        # which the closing connection cancels.
        return self._conn.state is not ConnectionState.ERROR

    async def handle(self, event: object) -> None:
        """Dispatch one event; never awaits, so every event acts in wire order."""
        match event:
            case ClientHello(_, extensions):
                self._peer_extensions = frozenset(extensions)
            case Subscribe(publisher, sid, _):
                self._subscribe(publisher, sid)
            case Request(sid, _):
                entry = self._publications.get(sid)
                if entry is not None:
                    entry[1].set()
            case Cancel(sid) | IllegalDemand(sid, _):
                self._stop_publication(sid)
            case OnNext(sid, element):
                offer = self._offers.get(sid)
                if offer is not None:
                    offer.elements.append(element)
                    offer.wake.set()
            case _Elements(sid, elements):
                offer = self._offers.get(sid)
                if offer is not None:
                    offer.elements.extend(elements)
                    offer.wake.set()
            case OnNextPacked(sid):
                offer = self._offers.get(sid)
                if offer is not None:
                    offer.elements.extend(event.elements())
                    offer.wake.set()
            case OnComplete(sid):
                offer = self._offers.get(sid)
                if offer is not None:
                    offer.completed = True
                    offer.wake.set()
            case OnError(sid, error):
                self._end_offer(sid, f"publisher failed: {error}")
            case SubscriptionAborted(sid, reason):
                self._end_offer(sid, f"publisher broke the protocol: {reason}")
            case Goodbye() | ConnectionClosed():
                self._stop_all()
        self.wake_writer()

    # -- subscriptions to streams (we publish)

    def _subscribe(self, publisher: str, sid: int) -> None:
        conn = self._conn
        if conn.publication_state(sid) is not PublisherState.SUBSCRIBE_RECEIVED:
            return  # cancelled (or illegal demand) in the same read: already answered
        if publisher.startswith(AUTH_PREFIX):
            self._start_login(sid, publisher.removeprefix(AUTH_PREFIX))
            return
        try:
            query = parse_publisher(publisher)
        except ValueError as exc:
            conn.send(Subscribed(sid, 0))
            conn.send(OnError(sid, str(exc)))
            return
        if query.offer:
            self._start_offer(sid, query)
            return
        # subscribed at once, in handle: a cancel that follows must find it sent, since
        # the subscriber keeps the Id until its subscribed arrives (rsio.md#rule-subscribed-first).
        conn.send(Subscribed(sid, 0))
        if not self._login_pending():
            refusal = self._refusal(query, Permission.READ)
            if refusal is not None:
                conn.send(OnError(sid, refusal))
                return
        wake = asyncio.Event()
        task = asyncio.create_task(self._publish(sid, query, wake), name=f"rsio publish {sid}")
        self._publications[sid] = (task, wake)

    # -- auth (the ``auth`` extension and the checks of server/authz.py)

    @property
    def access(self) -> ConnectionAccess:
        """What the client may do, known once the connection started."""
        if self._access is None:
            self._access = ConnectionAccess.of(
                self._app.door_auth, self._listener, self.peer, self.peer_cert
            )
        return self._access

    def _refusal(self, query: PublisherQuery, needed: Permission) -> str | None:
        """Why the client may not subscribe to (READ) or offer into (READ_UPDATE)
        ``query``'s stream; None if it may. A refusal is counted and logged."""
        refusal = self.access.check(stream_resource(query.scope, query.stream), needed)
        if refusal is not None:
            self.access.note_refusal(refusal)
        return refusal

    def _login_pending(self) -> bool:
        return self._login is not None and not self._login.done()

    async def _after_login(self) -> None:
        """Wait for the connection's login to be decided (cancelled counts as decided)."""
        if self._login is not None and not self._login.done():
            await asyncio.wait({self._login})

    def _start_login(self, sid: int, authorization: str) -> None:
        """``subscribe("auth:<authorization>", sid)``: answered ``onComplete`` once the
        credentials or token are good, ``onError`` if not. One per connection."""
        conn = self._conn
        conn.send(Subscribed(sid, 0))
        if AUTH_EXTENSION not in self._peer_extensions:
            conn.send(OnError(sid, "auth: extension not negotiated in the hellos"))
            return
        if self._login is not None:
            conn.send(OnError(sid, "auth: this connection sent its credentials already"))
            return
        task = asyncio.create_task(self._check_login(sid, authorization), name=f"rsio login {sid}")
        self._login = task
        self._publications[sid] = (task, asyncio.Event())

    async def _check_login(self, sid: int, authorization: str) -> None:
        conn = self._conn
        try:
            await self.access.login(authorization)
        except AuthFailed as exc:
            message = f"unauthenticated: {exc}"
            self.access.note_refusal(message)
            if self._mine(sid):
                conn.send(OnError(sid, message))
        else:
            if self._mine(sid):
                conn.send(OnComplete(sid))
        finally:
            entry = self._publications.get(sid)
            if entry is not None and entry[0] is asyncio.current_task():
                del self._publications[sid]
            self.wake_writer()

    def _stop_publication(self, sid: int) -> None:
        entry = self._publications.pop(sid, None)
        if entry is not None:
            entry[0].cancel()
        offer = self._offers.pop(sid, None)
        if offer is not None:
            # The client cancelled its offer: stop subscribing to its publisher.
            if offer.task is not None:
                offer.task.cancel()
            with contextlib.suppress(LocalProtocolError):
                self._conn.send(Cancel(sid))

    def _stop_all(self) -> None:
        for task, _ in self._publications.values():
            task.cancel()
        self._publications.clear()
        for offer in self._offers.values():
            if offer.task is not None:
                offer.task.cancel()
        self._offers.clear()

    def _live(self, sid: int) -> bool:
        return self._conn.publication_state(sid) is not PublisherState.CLOSED

    def _mine(self, sid: int) -> bool:
        """Whether the running publication task still owns Id ``sid`` and may send for it.

        A cancelled task runs its cleanup after the subscriber may already have
        reused the Id (rsio.md#rule-terminal); it must not send for the new subscription.
        """
        entry = self._publications.get(sid)
        return entry is not None and entry[0] is asyncio.current_task() and self._live(sid)

    async def _publish(self, sid: int, query: PublisherQuery, wake: asyncio.Event) -> None:
        conn = self._conn
        cursor = StreamCursor(self._app, query, self._holding, self._skipped)
        element_id = 0
        try:
            if self._login_pending():
                await self._after_login()
                refusal = self._refusal(query, Permission.READ)
                if refusal is not None:
                    if self._mine(sid):
                        conn.send(OnError(sid, refusal))
                    return
            await cursor.open()
            while self._mine(sid):
                if cursor.done:
                    conn.send(OnComplete(sid))  # needs no demand
                    break
                demand = conn.publication_demand(sid)
                if demand == 0:
                    # Nothing is read without demand; what is held counts as idle.
                    if not cursor.idle:
                        cursor.set_idle(True)
                        self._room.set()  # others may read in the room it leaves
                    wake.clear()
                    if not cursor.has_elements and await cursor.probe_end():
                        continue  # read to the end: onComplete needs no demand
                    await wake.wait()
                    continue
                cursor.set_idle(False)
                cursor.demand = demand
                if not cursor.has_elements:
                    # Read only with room: what the connection has queued and what its
                    # other subscriptions hold for their demand stay under MAX_UNSENT_BYTES.
                    held = self._holding.active_bytes - cursor.held_bytes
                    if self._unsent + held >= MAX_UNSENT_BYTES:
                        self._room.clear()
                        self.wake_writer()
                        await self._room.wait()
                        continue
                    await cursor.fill()  # about what the demand takes; long-polls at the tail
                    continue
                if self._unsent >= MAX_UNSENT_BYTES:
                    self._room.clear()
                    await self._room.wait()
                    continue
                # Up to the demand and the room, the records at hand go out as one
                # run of onNext frames (send_elements); a split element ends a run.
                run: list[bytes] = []
                room = demand
                while room and self._unsent < MAX_UNSENT_BYTES:
                    element = cursor.pop()
                    if element is None:
                        break
                    room -= 1
                    if len(element) > SPLIT_THRESHOLD_BYTES:
                        self._send_run(sid, run)
                        run = []
                        element_id = self._send_split(sid, element, element_id)
                        continue
                    run.append(element)
                    self._unsent += len(element) + ELEMENT_OVERHEAD_BYTES
                self._send_run(sid, run)
                self.wake_writer()
                await asyncio.sleep(0)  # let other subscriptions and the writer run
        except asyncio.CancelledError:
            raise
        except (ValueError, HeadraceError) as exc:
            if self._mine(sid):
                conn.send(OnError(sid, _reason(exc)))
        except Exception:
            log.exception("rsio: subscription %d to %s failed", sid, cursor.name)
            if self._mine(sid):
                conn.send(OnError(sid, "internal error"))
        finally:
            cursor.release()
            self._room.set()
            entry = self._publications.get(sid)
            if entry is not None and entry[0] is asyncio.current_task():
                del self._publications[sid]
            self.wake_writer()

    def _send_run(self, sid: int, elements: list[bytes]) -> None:
        """Send elements no larger than ``SPLIT_THRESHOLD_BYTES``, one ``onNext`` each
        (the caller counted them in ``_unsent`` as it took them)."""
        if elements:
            self._conn.send_elements(sid, elements)

    def _send_split(self, sid: int, element: bytes, element_id: int) -> int:
        """Send an element over ``SPLIT_THRESHOLD_BYTES`` in parts (rsio.md#split-elements); the
        next element Id."""
        self._unsent += len(element) + ELEMENT_OVERHEAD_BYTES
        parts, next_id = split_element(sid, element, element_id)
        for part in parts:
            self._conn.send(part)
        return next_id

    # -- offers (the client publishes, we append)

    def _start_offer(self, sid: int, query: PublisherQuery) -> None:
        conn = self._conn
        conn.send(Subscribed(sid, 0))
        if OFFER_EXTENSION not in self._peer_extensions:
            conn.send(OnError(sid, "offer: extension not negotiated in the hellos"))
            return
        if self._login_pending():  # the checks wait for the login, in the offer's task
            offer = _Offer(query)
            self._offers[sid] = offer
            offer.task = asyncio.create_task(
                self._offer_after_login(sid, offer), name=f"rsio offer {sid}"
            )
            return
        refusal = self._offer_refusal(sid, query)
        if refusal is not None:
            conn.send(OnError(sid, refusal))
            return
        conn.send(Subscribe(f"{query.scope}/{query.stream}", sid, OFFER_WINDOW))
        offer = _Offer(query)
        self._offers[sid] = offer
        offer.task = asyncio.create_task(self._store_offer(sid, offer), name=f"rsio offer {sid}")

    def _offer_refusal(self, sid: int, query: PublisherQuery) -> str | None:
        """Why an offer into ``query``'s stream cannot start; None if it can."""
        controller = self._app.controller
        refusal = self._refusal(query, Permission.READ_UPDATE)
        if refusal is not None:
            return refusal
        if not controller.stream_exists(query.scope, query.stream):
            return f"no such stream {query.scope}/{query.stream}"
        if controller.is_sealed(query.scope, query.stream):
            return f"stream {query.scope}/{query.stream} is sealed"
        if self._conn.subscription_state(sid) is not SubscriberState.CLOSED:
            return "offer: id still in use by an earlier offer"
        return None

    async def _offer_after_login(self, sid: int, offer: _Offer) -> None:
        """An offer that arrived while the login was checked: its checks, then the offer."""
        await self._after_login()
        if self._offers.get(sid) is not offer:
            return  # cancelled meanwhile
        refusal = self._offer_refusal(sid, offer.query)
        if refusal is not None:
            del self._offers[sid]
            if self._live(sid):
                self._conn.send(OnError(sid, refusal))
            self.wake_writer()
            return
        self._conn.send(Subscribe(f"{offer.query.scope}/{offer.query.stream}", sid, OFFER_WINDOW))
        self.wake_writer()
        await self._store_offer(sid, offer)

    def _end_offer(self, sid: int, reason: str) -> None:
        offer = self._offers.pop(sid, None)
        if offer is None:
            return
        if offer.task is not None:
            offer.task.cancel()
        if self._live(sid):
            self._conn.send(OnError(sid, reason))

    def _target(self, query: PublisherQuery) -> str:
        segments = self._app.controller.current_segments(query.scope, query.stream)
        if not segments:
            raise ValueError(f"stream {query.scope}/{query.stream} is sealed")
        ranges = KeyRanges.from_ranges(
            (segment_name(query.scope, query.stream, seg.id), seg.min_key, seg.max_key)
            for seg in segments
        )
        return ranges.segment_for_position(routing_key_position(query.key or ""))

    async def _store_offer(self, sid: int, offer: _Offer) -> None:
        """Append the offered elements in order, granting demand as each append is durable."""
        conn = self._conn
        store = self._app.store
        try:
            target = self._target(offer.query)
            while True:
                if not offer.elements:
                    if offer.completed:
                        break
                    offer.wake.clear()
                    await offer.wake.wait()
                    continue
                batch: list[bytes] = []
                size = 0
                while offer.elements:
                    element = offer.elements[0]
                    framed = EVENT_HEADER.size + len(element)
                    if batch and size + framed > MAX_OFFER_BATCH_BYTES:
                        break
                    offer.elements.popleft()
                    batch.append(element)
                    size += framed
                data = _frame(batch)
                for _attempt in range(3):
                    try:
                        await store.append(target, data)
                        break
                    except SegmentSealed:
                        target = self._target(offer.query)  # scaled: nothing was written
                else:
                    raise ValueError(
                        f"stream {offer.query.scope}/{offer.query.stream} keeps scaling"
                    )
                if conn.subscription_state(sid) is SubscriberState.ACTIVE or (
                    conn.subscription_state(sid) is SubscriberState.RECEIVING_PARTS
                ):
                    conn.send(Request(sid, len(batch)))
                self.wake_writer()
            if self._live(sid):
                conn.send(OnComplete(sid))
        except asyncio.CancelledError:
            raise
        except (ValueError, HeadraceError) as exc:
            with contextlib.suppress(LocalProtocolError):
                conn.send(Cancel(sid))
            if self._live(sid):
                conn.send(OnError(sid, _reason(exc)))
        finally:
            if self._offers.get(sid) is offer:
                del self._offers[sid]
            self.wake_writer()


MAX_EARLY_BYTES = 64 * 1024
"""Bytes held before the first frame (the clientHello) is complete; a hello is a
few bytes, so more than this is a bad peer, handed to the connection to refuse."""


def _offered_extensions(data: bytes, *, eof: bool) -> tuple[int, ...] | None:
    """The extensions our hello lists, given the client's first bytes; None: wait for more.

    Our ``serverHello`` goes out once the ``clientHello`` is in, and lists the
    extensions of ours that the client listed (rsio.md#hello: a server may wait for the
    ``clientHello``), so a client that lists none gets the plain
    ``03 02 00 00``. Anything that is not a well-formed ``clientHello`` gets
    an empty list; the connection then reports the error itself.
    """
    try:
        length, position = decode_varint(data, 0)
    except RemoteProtocolError:
        if eof or len(data) > MAX_VARINT_BYTES:
            return ()
        return None
    if len(data) < position + length:
        return () if eof or len(data) > MAX_EARLY_BYTES else None
    try:
        hello = decode_message(data[position : position + length])
    except RemoteProtocolError:
        return ()
    if not isinstance(hello, ClientHello):
        return ()
    return tuple(ext for ext in EXTENSIONS if ext in hello.extensions)


def _frame(payloads: list[bytes]) -> bytes:
    parts: list[bytes] = []
    for payload in payloads:
        parts.append(b"\x00\x00\x00\x00" + len(payload).to_bytes(4, "big"))
        parts.append(payload)
    return b"".join(parts)


async def start_rsio(ctx: ListenerContext, host: str, port: int) -> Listener:
    """Serve RS-IO on (host, port), over TLS when a certificate is configured."""
    return await start_tcp_listener(
        "rsio",
        host,
        port,
        lambda: RsioHandler(ctx),
        settings=ctx.settings,
        ssl_context=ctx.ssl_context(),
    )
