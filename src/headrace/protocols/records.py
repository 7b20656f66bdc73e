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
  ``append_time`` then says so), else None;
* in a TANK topic each event is one bundle as produced, unpacked into one
  record per message (key, value, timestamp), all with the bundle's offset and
  ``index`` 0, 1, 2... ``(segment, offset, index)`` identifies a record;
* an event of a TANK topic that is not a bundle (or unpacks to more than
  ``MAX_STORED_UNPACKED_BYTES``) gives no record: readers skip it and count it
  (``SkipCount``), so one bad event never hides the records after it.
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
    "MAX_EVENT_TIME_JSON_BYTES",
    "EventBuffer",
    "Record",
    "SkipCount",
    "bundle_records",
    "event_time_ms",
    "iter_events",
    "records_from_events",
    "stamp_append_times",
]

MAX_EVENT_TIME_JSON_BYTES: Final = 64 * 1024
"""Largest JSON event whose ``@timestamp`` is looked for: a log line shipped by
Beats is a few KiB; parsing a larger document for its time would cost a reader
more than the time is worth (such events get their append time)."""

_TIME_FIELD: Final = b'"@timestamp"'
_LAST: Final = 2**63
"""Above any time: ``(offset, _LAST)`` sorts after the index entry at ``offset``."""


@dataclass(frozen=True, slots=True)
class Record:
    """One record of a stream.

    ``stream`` is ``scope/stream``, ``segment`` the qualified segment name,
    ``offset`` the segment offset of the stored event's 8-byte header (where a
    reader resumes), ``index`` the message's place in a TANK bundle (0 for
    ordinary events).
    """

    stream: str
    segment: str
    offset: int
    key: bytes | None
    value: bytes
    timestamp_ms: int | None
    index: int = 0
    append_time: bool = False
    """``timestamp_ms`` is the time the store appended the event (Kafka's
    log-append time), not one the event carries (create time)."""


class EventBuffer:
    """Reassembles Event frames (pravega.md#event-framing) from consecutive reads of one segment.

    Each event's payload is copied once, straight from the read's data (which
    may be a ``memoryview`` of the reply frame) into its ``bytes``; only an
    event split between two reads passes through ``buffer`` (the bytes of the
    event at the front that is not whole yet, from its header on).
    """

    def __init__(self, offset: int) -> None:
        self.offset = offset  # segment offset of buffer[0]
        self.buffer = bytearray()

    def feed(self, data: bytes | memoryview) -> Iterator[tuple[int, bytes]]:
        """``(offset, payload)`` of every event completed by ``data``.

        Raises:
            RemoteProtocolError: the segment holds something else than Event frames.
        """
        view = memoryview(data)
        pos = 0
        if self.buffer:
            pos, event = self._complete(view)
            if event is None:
                return
            yield event
        end = len(view)
        base = self.offset - pos  # segment offset of view[0]
        while end - pos >= HEADER_SIZE_BYTES:
            type_code, length = EVENT_HEADER.unpack_from(view, pos)
            if type_code != CommandType.EVENT or length < 0:
                raise RemoteProtocolError(f"not an event at offset {base + pos}: type {type_code}")
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
        if type_code != CommandType.EVENT or length < 0:
            raise RemoteProtocolError(f"not an event at offset {self.offset}: type {type_code}")
        take = min(HEADER_SIZE_BYTES + length - len(buf), len(view) - pos)
        buf += view[pos : pos + take]
        pos += take
        if len(buf) < HEADER_SIZE_BYTES + length:
            return pos, None
        event = (self.offset, bytes(memoryview(buf)[HEADER_SIZE_BYTES:]))
        self.offset += len(buf)
        buf.clear()
        return pos, event

    def missing_bytes(self) -> int:
        """Bytes still needed to complete the event at the front (0 if none is started)."""
        if len(self.buffer) < HEADER_SIZE_BYTES:
            return HEADER_SIZE_BYTES - len(self.buffer) if self.buffer else 0
        length: int = EVENT_HEADER.unpack_from(self.buffer, 0)[1]
        return max(0, HEADER_SIZE_BYTES + length - len(self.buffer))


def iter_events(data: bytes | memoryview, base_offset: int = 0) -> Iterator[tuple[int, bytes]]:
    """``(offset, payload)`` of each whole Event frame in ``data`` read at ``base_offset``."""
    yield from EventBuffer(base_offset).feed(data)


class SkipCount:
    """Events a reader skipped because they could not be decoded (for a metric or a warning)."""

    __slots__ = ("events",)

    def __init__(self) -> None:
        self.events = 0


def bundle_records(stream: str, segment: str, offset: int, payload: bytes) -> list[Record] | None:
    """The records of one stored TANK bundle; None if ``payload`` is not a bundle
    or unpacks to more than ``MAX_STORED_UNPACKED_BYTES``."""
    try:
        # Seq nums are not needed for records; 1 stands in for a non-sparse bundle's.
        messages = decode_bundle(payload, 1, max_unpacked_bytes=MAX_STORED_UNPACKED_BYTES)
    except RemoteProtocolError:
        return None
    return [
        Record(stream, segment, offset, msg.key or None, msg.content, msg.timestamp_ms, i)
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
    ``skipped``; the records after it follow as usual.
    """
    for offset, payload in events:
        if not tank:
            yield Record(stream, segment, offset, None, payload, event_time_ms(payload))
            continue
        records = bundle_records(stream, segment, offset, payload)
        if records is None:
            if skipped is not None:
                skipped.events += 1
            continue
        yield from records
