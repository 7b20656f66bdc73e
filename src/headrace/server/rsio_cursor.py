"""Reading a stream for an RS-IO subscription: publisher strings and the stream cursor.

The RS-IO front door (``server/rsio.py``) parses a ``subscribe``'s publisher
string (:func:`parse_publisher`, ``docs/protocols/rsio.md#publisher-strings``)
and reads the stream it names through a :class:`StreamCursor`: records, as
every reader sees them, as the subscription's elements (``format=record``:
:func:`encode_record`).

Theory of operation. A cursor reads the store straight, segment by segment,
only for the demand it is given. Reads are sized by the demand
(:data:`MIN_READ_BYTES` to :data:`READ_CHUNK_BYTES`), and stored events are
cut into elements (TANK bundles unpacked, each to at most
``MAX_STORED_UNPACKED_BYTES``) only as the demand takes them. A sealed segment
read to its end hands over to its successors once all their predecessors are
done, so per-key order holds across scaling. At the tail of every segment the
cursor long-polls the store (``store.watch``, woken by appends). What the
cursors of one connection hold is counted in its :class:`Holding`; those
without demand keep at most :data:`MAX_IDLE_HELD_BYTES` per connection and
let go of the rest, reading it again later.
"""

from __future__ import annotations

import asyncio
import bisect
import datetime
import itertools
import logging
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from urllib.parse import parse_qs

from headrace.controller.naming import segment_name
from headrace.errors import SegmentTruncated
from headrace.protocols.records import (
    FORMAT_BYTES,
    EventBuffer,
    RawChunk,
    Record,
    bundle_records,
    event_time_ms,
    stored_bytes,
)
from headrace.protocols.rsio.codec import encode_varint
from headrace.server._context import ListenerContext
from headrace.store.api import MAX_WAIT_S, TimeIndexed

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_ELEMENT_BYTES",
    "MAX_IDLE_HELD_BYTES",
    "MIN_READ_BYTES",
    "READ_CHUNK_BYTES",
    "TAIL_WAIT_S",
    "Holding",
    "PublisherQuery",
    "StreamCursor",
    "encode_record",
    "parse_publisher",
]

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


# --------------------------------------------------------------------------- publisher strings


@dataclass(frozen=True, slots=True)
class PublisherQuery:
    """A parsed publisher string (``docs/protocols/rsio.md#publisher-strings``)."""

    scope: str
    stream: str
    start: str | dict[int, int] | int = "earliest"
    """``"earliest"``, ``"latest"``, a stream cut ``{segment id: offset}``, or
    a time (ms since the epoch: the first events appended at or after it)."""
    until: dict[int, int] | int | None = None
    """A stream cut, or a time (stop before the events appended at or after it)."""
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


def _parse_time(text: str, what: str) -> int:
    """``time:<ms since the epoch>`` or ``time:<ISO 8601>`` (UTC without a zone)."""
    value = text.removeprefix("time:")
    if value.isdigit():
        return int(value)
    try:
        when = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{what}={text!r}: a time is time:<epoch ms> or time:<ISO 8601>") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return int(when.timestamp() * 1000)


def _parse_position(text: str, what: str) -> dict[int, int] | int:
    if text.startswith("time:"):
        return _parse_time(text, what)
    return _parse_cut(text, what)


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
    start: str | dict[int, int] | int = one.get("from", "earliest")
    if start not in ("earliest", "latest"):
        start = _parse_position(str(start), "from")
    until = _parse_position(one["until"], "until") if "until" in one else None
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


class Holding:
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
    times: list[tuple[int, int]] = field(default_factory=list)
    """Append-time index entries (offset, ms) covering the last read, for the
    timestamps of ``format=record`` elements of ordinary events."""


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

    What the cursor holds is counted in the connection's ``Holding``; at
    demand 0 (:meth:`set_idle`) past ``MAX_IDLE_HELD_BYTES`` for the
    connection, it lets go of it (:meth:`drop`) and reads it again later.
    An event of a TANK topic that is not a bundle is skipped and counted
    (``skipped``).
    """

    def __init__(
        self,
        app: ListenerContext,
        query: PublisherQuery,
        holding: Holding | None = None,
        skipped: Callable[[], None] = lambda: None,
    ) -> None:
        self._app = app
        self.scope = query.scope
        self.stream = query.stream
        self._query = query
        self.tank = query.scope == app.config.tank_scope
        self._plain = not self.tank and query.fmt == "value"
        """One element per stored event, its payload (the common case, cut in a tight loop)."""
        self._holding = holding if holding is not None else Holding()
        self._skipped = skipped
        self._warned: set[str] = set()
        self.held_bytes = 0
        self.idle = False
        self.demand = 1
        """The demand the next elements are cut for (set by the publisher)."""
        self._segments: list[_SegmentRead] = []
        self._started: set[int] = set()
        self._finished: set[int] = set()
        self._turn = 0
        self._read_turn = 0
        self._until = query.until if isinstance(query.until, dict) else None
        self._timed = query.fmt == "record" and not self.tank
        """Ordinary events as records: each is stamped with its append time."""

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
            await controller.refresh()  # a cluster follower's view may lag
            if not controller.stream_exists(self.scope, self.stream):
                raise ValueError(f"no such stream {self.name}")
        for what, cut in (("from", query.start), ("until", query.until)):
            if isinstance(cut, dict) and not controller.is_stream_cut_valid(
                self.scope, self.stream, cut
            ):
                raise ValueError(f"{what}: not a stream cut of {self.name}")
        if isinstance(query.until, int):  # the cut where events of that time begin
            self._until = {
                head.segment.id: head.offset
                for head in await controller.segments_at(self.scope, self.stream, query.until)
            }
        start: dict[int, int] = {}
        if isinstance(query.start, int):
            for head in await controller.segments_at(self.scope, self.stream, query.start):
                start[head.segment.id] = head.offset
        elif query.start == "earliest":
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
        until = None if self._until is None else self._until.get(sid)
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
                offset -= sum(stored_bytes(element) for element in seg.elements)
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
            stored = stored_bytes(payload)
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
        end = seg.cut_end = offset + stored_bytes(payload)
        seg.element_bytes += ((end - first) / count - seg.element_bytes) / 4
        self._account(seg, read_bytes=seg.read_bytes if ahead else 0, cut_bytes=cut_bytes)
        self._finish(seg)
        return True

    def _elements(self, seg: _SegmentRead, offset: int, payload: bytes) -> list[bytes]:
        """The elements of one stored event: its value(s), or ``format=record`` encodings.

        A Pravega event's value is its payload, taken without a ``Record`` in
        between (the common case). An event of a TANK topic that is not a
        bundle gives none and is counted (and logged once per segment). Bytes
        that are not events (a byte stream's) are one element as they are.
        """
        fmt = self._query.fmt
        if isinstance(payload, RawChunk):
            raw = Record(self.name, seg.name, offset, None, bytes(payload), None, 0, FORMAT_BYTES)
            return [raw.value] if fmt == "value" else [encode_record(raw, seg.sid)]
        if not self.tank:
            ms = event_time_ms(payload)
            if ms is None:
                times = seg.times
                i = bisect.bisect_right(times, (offset, _LAST)) - 1
                ms = times[i][1] if i >= 0 else None
            return [encode_record(Record(self.name, seg.name, offset, None, payload, ms), seg.sid)]
        records = bundle_records(self.name, seg.name, offset, payload)
        if records is None:
            self._skipped()
            if seg.name not in self._warned:
                self._warned.add(seg.name)
                log.warning("rsio: skipping events of %s that are not TANK bundles", seg.name)
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
            if got.data or (got.end_of_segment and seg.events.buffer):
                progress = True
                got_bytes += len(got.data)
                if self._timed and isinstance(store, TimeIndexed):  # from a split event's start
                    seg.times = await store.append_times(
                        seg.name, seg.events.offset, offset + len(got.data)
                    )
                pending = seg.events.feed(got.data)
                if got.end_of_segment:  # an event that never completed: its bytes as they are
                    pending = itertools.chain(pending, seg.events.flush())
                seg.pending = pending
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


_LAST = 2**63
"""Above any time: ``(offset, _LAST)`` sorts after the index entry at ``offset``."""


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
