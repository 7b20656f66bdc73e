"""Pravega watermarks: writers' time marks in, ``Watermark`` records out.

Pravega writers report their progress in time with ``noteTimestampFromWriter``
(a time, and the position the writer had written to when it reached it); a
writer that closes says ``removeWriter``. Periodically the controller folds
the marks of a stream's live writers into one ``Watermark`` (as Pravega's
controller does in ``PeriodicWatermarking``) and appends it as an event to
the stream ``_MARK<stream>`` of the same scope, which Pravega readers read to
know where the stream stands in time, so event-time windows can close:

* ``lowerTimeBound``: the smallest time of the live writers (no writer will
  write an event earlier than its own last mark);
* ``upperTimeBound``: the largest;
* ``streamCut``: an upper bound of the writers' positions: per segment the
  largest offset reported; a segment some writer has moved past (a reported
  successor) is replaced by its successors.

A writer whose last mark is older than the stream's writer timeout
(``WRITER_TIMEOUT_MS``) no longer holds the watermark back and is forgotten.
A watermark is appended only when its lower bound moved past the previous
one's, so readers see time go forward.

The byte layout is Pravega's (``docs/protocols/pravega-controller.md#watermarks``):
a ``VersionedSerializer`` record, version 0 revision 0, of the two bounds, the
stream cut (a map of ``SegmentWithRange`` records to offsets) and the scope
and stream names. Pure code: the controller model feeds it and stores what
it makes.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from headrace.controller.naming import MARK_STREAM_PREFIX

__all__ = [
    "MARK_PREFIX",
    "MAX_WRITERS_PER_STREAM",
    "WATERMARK_INTERVAL_S",
    "WRITER_TIMEOUT_MS",
    "MarkResult",
    "SegmentRange",
    "Watermark",
    "WriterMarks",
    "encode_watermark",
    "event_frame",
    "mark_stream",
]

MARK_PREFIX: Final = MARK_STREAM_PREFIX
"""Pravega's name for a stream's watermark stream: ``_MARK<stream>``, same scope."""

WATERMARK_INTERVAL_S: Final = 10.0
"""Seconds between watermark rounds (Pravega's controller default,
``controller.watermarking.frequency.seconds``)."""

WRITER_TIMEOUT_MS: Final = 120_000
"""A writer silent this long stops holding a stream's watermark back and is
forgotten (Pravega's default ``timestampAggregationTimeout`` of a stream)."""

MAX_WRITERS_PER_STREAM: Final = 1024
"""Writers whose marks one stream keeps. Every writer that notes a time is
remembered until it is removed or times out; without a bound a client
inventing writer names would grow the controller's memory without end. Past
it a new writer's mark is refused (``INTERNAL_ERROR``); known writers go on."""

_SERIALIZER_VERSION = 0
_HEADER = struct.Struct(">BBBBI")  # serializer format, version, revision count, revision, length
_SEGMENT = struct.Struct(">qdd")
_BOUNDS = struct.Struct(">qq")
_OFFSET = struct.Struct(">q")


def mark_stream(stream: str) -> str:
    """The name of ``stream``'s watermark stream."""
    return MARK_PREFIX + stream


class MarkResult:
    """What ``WriterMarks.note`` says (Pravega's ``TimestampResponse`` statuses)."""

    SUCCESS: Final = 0
    INVALID_TIME: Final = 1
    INVALID_POSITION: Final = 2
    INTERNAL_ERROR: Final = 3


@dataclass(frozen=True, slots=True)
class SegmentRange:
    """A segment of a watermark's stream cut: its id and key range."""

    segment_id: int
    low: float
    high: float


@dataclass(frozen=True, slots=True)
class Watermark:
    lower_ms: int
    upper_ms: int
    cut: dict[SegmentRange, int]
    scope: str
    stream: str


@dataclass(slots=True)
class _Mark:
    time_ms: int
    position: dict[int, int]
    noted_ms: int


@dataclass(slots=True)
class WriterMarks:
    """The live writers' marks of every stream, and the last watermark of each."""

    marks: dict[tuple[str, str], dict[str, _Mark]] = field(default_factory=dict)
    last_lower: dict[tuple[str, str], int] = field(default_factory=dict)

    def note(
        self, scope: str, stream: str, writer: str, time_ms: int, position: Mapping[int, int],
        now_ms: int,
    ) -> int:  # fmt: skip
        """Record a writer's mark; a ``MarkResult`` status. A time below the
        writer's previous one is ``INVALID_TIME`` (time only goes forward)."""
        writers = self.marks.setdefault((scope, stream), {})
        previous = writers.get(writer)
        if previous is not None and time_ms < previous.time_ms:
            return MarkResult.INVALID_TIME
        if previous is None and len(writers) >= MAX_WRITERS_PER_STREAM:
            return MarkResult.INTERNAL_ERROR
        writers[writer] = _Mark(time_ms, dict(position), now_ms)
        return MarkResult.SUCCESS

    def remove(self, scope: str, stream: str, writer: str) -> bool:
        """Forget a writer; whether it was known."""
        writers = self.marks.get((scope, stream), {})
        return writers.pop(writer, None) is not None

    def forget_stream(self, scope: str, stream: str) -> None:
        self.marks.pop((scope, stream), None)
        self.last_lower.pop((scope, stream), None)

    def live(self, scope: str, stream: str, now_ms: int, timeout_ms: int) -> dict[str, _Mark]:
        """The marks of writers heard from within ``timeout_ms``; the others are forgotten."""
        writers = self.marks.get((scope, stream), {})
        for name in [w for w, m in writers.items() if now_ms - m.noted_ms > timeout_ms]:
            del writers[name]
        return writers

    def next_watermark(
        self,
        scope: str,
        stream: str,
        now_ms: int,
        timeout_ms: int,
        ranges: Mapping[int, tuple[float, float]],
        successors: Mapping[int, list[int]],
    ) -> Watermark | None:
        """The watermark to append now, or None (no live writer, or time has not
        moved past the last one's lower bound).

        ``ranges`` gives every segment id of the stream its key range;
        ``successors`` the ids of the segments that replaced a sealed one.
        """
        writers = self.live(scope, stream, now_ms, timeout_ms)
        if not writers:
            return None
        lower = min(m.time_ms for m in writers.values())
        upper = max(m.time_ms for m in writers.values())
        last = self.last_lower.get((scope, stream))
        if last is not None and lower <= last:
            return None
        cut: dict[int, int] = {}
        for mark in writers.values():
            for sid, offset in mark.position.items():
                cut[sid] = max(cut.get(sid, offset), offset)
        cut = _upper_cut(cut, successors)
        watermark = Watermark(
            lower,
            upper,
            {
                SegmentRange(sid, *ranges[sid]): off
                for sid, off in sorted(cut.items())
                if sid in ranges
            },
            scope,
            stream,
        )
        self.last_lower[(scope, stream)] = lower
        return watermark


def _upper_cut(cut: dict[int, int], successors: Mapping[int, list[int]]) -> dict[int, int]:
    """Replace each segment some writer has moved past (one of its successors is
    in the cut) by its successors (at offset 0 where no writer reported one)."""
    changed = True
    while changed:
        changed = False
        for sid in list(cut):
            after = successors.get(sid, [])
            if after and any(s in cut for s in after):
                del cut[sid]
                for s in after:
                    cut.setdefault(s, 0)
                changed = True
    return cut


def _utf(text: str) -> bytes:
    """Java's ``DataOutput.writeUTF``: u16 length, then modified UTF-8 (NUL and
    surrogates as 2 and 3 byte forms)."""
    out = bytearray()
    for ch in text:
        code = ord(ch)
        if 0 < code < 0x80:
            out.append(code)
        elif code < 0x800:
            out += bytes((0xC0 | code >> 6, 0x80 | code & 0x3F))
        elif code < 0x10000:
            out += bytes((0xE0 | code >> 12, 0x80 | code >> 6 & 0x3F, 0x80 | code & 0x3F))
        else:  # a supplementary character: its two UTF-16 halves, each as 3 bytes
            code -= 0x10000
            for half in (0xD800 | code >> 10, 0xDC00 | code & 0x3FF):
                out += bytes((0xE0 | half >> 12, 0x80 | half >> 6 & 0x3F, 0x80 | half & 0x3F))
    return struct.pack(">H", len(out)) + bytes(out)


def _compact_int(value: int) -> bytes:
    """Pravega's ``writeCompactInt``: 1 byte below 0x80, 2 (``10`` prefix) below
    0x4000, else 4 (``11`` prefix)."""
    if value < 0x80:
        return bytes((value,))
    if value < 0x4000:
        return struct.pack(">H", value | 0x8000)
    return struct.pack(">I", value | 0xC000_0000)


def _versioned(body: bytes) -> bytes:
    """A ``VersionedSerializer`` record: format 0, version 0, one revision (0)."""
    return _HEADER.pack(_SERIALIZER_VERSION, 0, 1, 0, len(body)) + body


def encode_watermark(watermark: Watermark) -> bytes:
    """The serialized ``Watermark`` (Pravega's ``Watermark.toByteBuf``)."""
    parts = [_BOUNDS.pack(watermark.lower_ms, watermark.upper_ms), _compact_int(len(watermark.cut))]
    for seg, offset in watermark.cut.items():
        parts.append(_versioned(_SEGMENT.pack(seg.segment_id, seg.low, seg.high)))
        parts.append(_OFFSET.pack(offset))
    parts += [_utf(watermark.scope), _utf(watermark.stream)]
    return _versioned(b"".join(parts))


def event_frame(watermark: Watermark) -> bytes:
    """The watermark as one stored event (Pravega's event framing: type 0,
    length, payload), as the ``_MARK`` stream holds it."""
    payload = encode_watermark(watermark)
    return struct.pack(">ii", 0, len(payload)) + payload
