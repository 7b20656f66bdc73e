"""Stored events as records, sans-I/O: the part of the record reader that needs no network.

``docs/architecture.md#records``: one reader layer turns any stream into records whatever
protocol wrote it. Walking segments is I/O and lives with each reader (the
client's ``RecordReader`` reads over the segment-store protocol, the RS-IO
server straight from the store); turning a segment's bytes into records is
pure and lives here, so that every reader agrees on what a record is.

* a segment holds Pravega Event frames (``int32 type 0, int32 length,
  payload``); :class:`EventBuffer` cuts them out of consecutive reads;
* an ordinary event is one record: ``key`` None, ``value`` the payload,
  ``timestamp_ms`` its own time where it has one (a JSON object with an
  ``@timestamp``, as Beats and other Lumberjack shippers send:
  :func:`event_time_ms`), else the time the store appended it, which the
  reader stamps from the store's time index (:func:`stamp_append_times`;
  ``append_time`` then says so), else None; ``format`` ``event``;
* bytes that are not Event frames (a Pravega byte stream's data, or a tail
  that never became a whole event) are read as they are: from the first
  header that is not an event's (type not 0, or a length no event has) to
  the end of the segment, each read's bytes are one record of ``format``
  ``bytes`` (:class:`RawChunk`), so nothing stored is ever an error to a
  reader, and the values put together are the segment's bytes;
* in a TANK topic each event is one bundle as produced, unpacked into one
  record per message (key, value, timestamp), all with the bundle's offset and
  ``index`` 0, 1, 2... (``format`` ``bundle``); ``(segment, offset, index)``
  identifies a record;
* an event of a TANK topic that is not a bundle (or unpacks to more than
  ``MAX_STORED_UNPACKED_BYTES``) gives no record: readers skip it and count it
  (``SkipCount``: a metric, and a log line once per segment), so one bad
  event never hides the records after it.
"""

from __future__ import annotations

import bisect
import datetime
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Final

from headrace.errors import RemoteProtocolError
from headrace.protocols.pravega.codec import EVENT_HEADER, HEADER_SIZE_BYTES
from headrace.protocols.pravega.commands import CommandType
from headrace.protocols.tank.bundle import MAX_STORED_UNPACKED_BYTES, decode_bundle

__all__ = [
    "FORMAT_BUNDLE",
    "FORMAT_BYTES",
    "FORMAT_EVENT",
    "MAX_EVENT_BYTES",
    "MAX_EVENT_TIME_JSON_BYTES",
    "EventBuffer",
    "RawChunk",
    "Record",
    "SkipCount",
    "bundle_records",
    "event_time_ms",
    "iter_events",
    "records_from_events",
    "stamp_append_times",
    "stored_bytes",
]

MAX_EVENT_TIME_JSON_BYTES: Final = 64 * 1024
"""Largest JSON event whose ``@timestamp`` is looked for: a log line shipped by
Beats is a few KiB; parsing a larger document for its time would cost a reader
more than the time is worth (such events get their append time)."""

_TIME_FIELD: Final = b'"@timestamp"'
_LAST: Final = 2**63
"""Above any time: ``(offset, _LAST)`` sorts after the index entry at ``offset``."""

FORMAT_EVENT: Final = "event"
"""A record that is one stored event (Pravega writer, Lumberjack, RS-IO offer, Spark sink)."""

FORMAT_BUNDLE: Final = "bundle"
"""A record that is one message of a stored TANK bundle."""

FORMAT_BYTES: Final = "bytes"
"""A record that is a run of bytes which are not Event frames (a byte stream's data)."""

MAX_EVENT_BYTES: Final = 1024 * 1024 * 1024
"""Longest payload an event header may announce: Pravega's large-event limit.
A header announcing more (or a negative length, or a type other than 0) is no
event's, so the bytes from there are read as raw chunks instead of being
waited for."""


class RawChunk(bytes):
    """Bytes of a segment that are not Event frames, as one read found them.

    :class:`EventBuffer` yields them in place of an event's payload; they take
    their own length in the segment (no 8-byte header, ``stored_bytes``).
    """

    __slots__ = ()


def stored_bytes(payload: bytes) -> int:
    """The bytes ``payload`` (as :class:`EventBuffer` yields it) takes in the segment."""
    if isinstance(payload, RawChunk):
        return len(payload)
    return HEADER_SIZE_BYTES + len(payload)


def _is_event_header(type_code: int, length: int) -> bool:
    return type_code == CommandType.EVENT and 0 <= length <= MAX_EVENT_BYTES


@dataclass(frozen=True, slots=True)
class Record:
    """One record of a stream.

    ``stream`` is ``scope/stream``, ``segment`` the qualified segment name,
    ``offset`` the segment offset of the stored event's 8-byte header (where a
    reader resumes; of the first byte for ``bytes``), ``index`` the message's
    place in a TANK bundle (0 for ordinary events).
    """

    stream: str
    segment: str
    offset: int
    key: bytes | None
    value: bytes
    timestamp_ms: int | None
    index: int = 0
    format: str = FORMAT_EVENT
    """What the stored bytes were: ``event``, ``bundle`` (a TANK message) or
    ``bytes`` (not Event frames: a byte stream's data, ``RawChunk``)."""
    append_time: bool = False
    """``timestamp_ms`` is the time the store appended the event (Kafka's
    log-append time), not one the event carries (create time)."""


class EventBuffer:
    """Reassembles Event frames (pravega.md#event-framing) from consecutive reads of one segment.

    Each event's payload is copied once, straight from the read's data (which
    may be a ``memoryview`` of the reply frame) into its ``bytes``; only an
    event split between two reads passes through ``buffer`` (the bytes of the
    event at the front that is not whole yet, from its header on).

    From the first header that is no event's on, the buffer is ``raw``: every
    read's bytes come out as they are, one :class:`RawChunk` each (a byte
    stream). ``flush`` gives the bytes of an event that never completed.
    """

    def __init__(self, offset: int, *, raw: bool = False) -> None:
        self.offset = offset  # segment offset of buffer[0]
        self.buffer = bytearray()
        self.raw = raw

    def feed(self, data: bytes | memoryview) -> Iterator[tuple[int, bytes]]:
        """``(offset, payload)`` of every event completed by ``data``; past the
        first bytes that are not an Event frame, ``(offset, RawChunk)``."""
        view = memoryview(data)
        pos = 0
        if self.buffer:
            pos, event = self._complete(view)
            if self.raw:  # the buffered bytes are no event: they and the rest are raw
                chunk = RawChunk(bytes(self.buffer) + view[pos:])  # buffer took view[:pos]
                self.buffer.clear()
                yield self.offset, chunk
                self.offset += len(chunk)
                return
            if event is None:
                return
            yield event
        elif self.raw:
            if view:
                yield self.offset, RawChunk(view)
                self.offset += len(view)
            return
        end = len(view)
        base = self.offset - pos  # segment offset of view[0]
        while end - pos >= HEADER_SIZE_BYTES:
            type_code, length = EVENT_HEADER.unpack_from(view, pos)
            if not _is_event_header(type_code, length):
                self.raw = True
                yield base + pos, RawChunk(view[pos:])
                self.offset = base + end
                return
            stop = pos + HEADER_SIZE_BYTES + length
            if stop > end:
                break
            yield base + pos, bytes(view[pos + HEADER_SIZE_BYTES : stop])
            pos = stop
        self.buffer += view[pos:]  # the start of an event the next read completes
        self.offset = base + pos

    def _complete(self, view: memoryview) -> tuple[int, tuple[int, bytes] | None]:
        """Complete the buffered event from the front of ``view``: the bytes of
        ``view`` used, and the event if it is whole now (``buffer`` then empty)."""
        buf = self.buffer
        pos = 0
        if len(buf) < HEADER_SIZE_BYTES:
            pos = min(HEADER_SIZE_BYTES - len(buf), len(view))
            buf += view[:pos]
            if len(buf) < HEADER_SIZE_BYTES:
                return pos, None
        type_code, length = EVENT_HEADER.unpack_from(buf, 0)
        if not _is_event_header(type_code, length):
            self.raw = True  # ``feed`` hands the buffered bytes out as they are
            return pos, None
        take = min(HEADER_SIZE_BYTES + length - len(buf), len(view) - pos)
        buf += view[pos : pos + take]
        pos += take
        if len(buf) < HEADER_SIZE_BYTES + length:
            return pos, None
        event = (self.offset, bytes(memoryview(buf)[HEADER_SIZE_BYTES:]))
        self.offset += len(buf)
        buf.clear()
        return pos, event

    def flush(self) -> Iterator[tuple[int, bytes]]:
        """At a segment's end: the bytes of an event that never completed, as a
        :class:`RawChunk` (nothing if none is started)."""
        if self.buffer:
            chunk = RawChunk(self.buffer)
            self.buffer.clear()
            self.raw = True
            yield self.offset, chunk
            self.offset += len(chunk)

    def missing_bytes(self) -> int:
        """Bytes still needed to complete the event at the front (0 if none is started)."""
        if self.raw:
            return 0
        if len(self.buffer) < HEADER_SIZE_BYTES:
            return HEADER_SIZE_BYTES - len(self.buffer) if self.buffer else 0
        length: int = EVENT_HEADER.unpack_from(self.buffer, 0)[1]
        return max(0, HEADER_SIZE_BYTES + length - len(self.buffer))


def iter_events(data: bytes | memoryview, base_offset: int = 0) -> Iterator[tuple[int, bytes]]:
    """``(offset, payload)`` of each whole Event frame in ``data`` read at ``base_offset``."""
    yield from EventBuffer(base_offset).feed(data)


class SkipCount:
    """Events a reader skipped because they could not be decoded (for a metric or a
    warning), and the segments where it skipped some: a reader logs once per segment."""

    __slots__ = ("events", "segments")

    def __init__(self) -> None:
        self.events = 0
        self.segments: set[str] = set()

    def note(self, segment: str) -> bool:
        """Count one skipped event of ``segment``; True the first time for that segment."""
        self.events += 1
        if segment in self.segments:
            return False
        self.segments.add(segment)
        return True


def bundle_records(stream: str, segment: str, offset: int, payload: bytes) -> list[Record] | None:
    """The records of one stored TANK bundle; None if ``payload`` is not a bundle
    or unpacks to more than ``MAX_STORED_UNPACKED_BYTES``."""
    try:
        # Seq nums are not needed for records; 1 stands in for a non-sparse bundle's.
        messages = decode_bundle(payload, 1, max_unpacked_bytes=MAX_STORED_UNPACKED_BYTES)
    except RemoteProtocolError:
        return None
    return [
        Record(
            stream,
            segment,
            offset,
            msg.key or None,
            msg.content,
            msg.timestamp_ms,
            i,
            FORMAT_BUNDLE,
        )
        for i, msg in enumerate(messages)
    ]


def event_time_ms(payload: bytes) -> int | None:
    """An event's own time: the ``@timestamp`` (ISO 8601; UTC without a zone) of
    a JSON object of at most ``MAX_EVENT_TIME_JSON_BYTES``; None for anything else."""
    if payload[:1] != b"{" or len(payload) > MAX_EVENT_TIME_JSON_BYTES:
        return None
    if _TIME_FIELD not in payload:
        return None
    try:
        value = json.loads(payload).get("@timestamp")
        if not isinstance(value, str):
            return None
        when = datetime.datetime.fromisoformat(value)
    except (ValueError, AttributeError, RecursionError):  # not JSON, an object, a time
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return int(when.timestamp() * 1000)


def stamp_append_times(records: list[Record], times: Sequence[tuple[int, int]]) -> list[Record]:
    """Give each record without a time of its own the append time of its event:
    the time of the last ``(offset, ms)`` entry at or below its offset
    (``times`` from the store's time index, ascending)."""
    if not times:
        return records
    out = []
    for record in records:
        if record.timestamp_ms is None:
            i = bisect.bisect_right(times, (record.offset, _LAST)) - 1
            if i >= 0:
                record = replace(record, timestamp_ms=times[i][1], append_time=True)
        out.append(record)
    return out


def records_from_events(
    stream: str,
    segment: str,
    events: Iterator[tuple[int, bytes]],
    *,
    tank: bool,
    skipped: SkipCount | None = None,
) -> Iterator[Record]:
    """Turn a segment's events into records (TANK bundles unpacked when ``tank``).

    An event of a TANK topic that is not a bundle is skipped and counted in
    ``skipped``; the records after it follow as usual. A :class:`RawChunk` is
    one record of ``format`` ``bytes`` in any stream.
    """
    for offset, payload in events:
        if isinstance(payload, RawChunk):
            yield Record(stream, segment, offset, None, bytes(payload), None, 0, FORMAT_BYTES)
            continue
        if not tank:
            yield Record(stream, segment, offset, None, payload, event_time_ms(payload))
            continue
        records = bundle_records(stream, segment, offset, payload)
        if records is None:
            if skipped is not None:
                skipped.note(segment)
            continue
        yield from records
