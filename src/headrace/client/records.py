"""The record reader: any stream, whatever protocol wrote it, as :class:`Record` s.

This is the one generic read path (``docs/architecture.md#records``): the CLI,
Reactive Streams IO and the Spark source read through it.

What a record is
----------------
``Record(stream, segment, offset, key, value, timestamp_ms, index)``:

* ``stream`` is ``scope/stream``; ``segment`` the qualified segment name;
* ``offset`` the segment offset of the stored event's 8-byte header (the
  position a reader resumes from; Pravega's event offset);
* an ordinary Pravega event (written by a Pravega client, Lumberjack, RS-IO)
  is one record: ``key`` is ``None`` (Pravega does not store routing keys),
  ``value`` the event bytes, ``timestamp_ms`` the event's own time where it
  carries one (a JSON document's ``@timestamp``, as Lumberjack shippers
  send), else the time the store appended it (asked with
  ``ReadSegmentTimes`` per read; ``append_time`` is then True), else ``None``
  (events stored before the server kept a time index);
* in a TANK topic (scope ``tank`` by default, ``tank_scope`` to change) each
  stored event is one TANK bundle as produced; it is unpacked with
  ``headrace.protocols.tank.bundle.decode_bundle`` into one record per
  message, with the message's key (``None`` when empty), value and
  timestamp, all with the bundle's ``offset`` and ``index`` 0, 1, 2... within
  it. ``(segment, offset, index)`` identifies a record. An event of a TANK
  topic that is not a bundle (written there through another protocol) gives
  no record: it is skipped, counted in :attr:`RecordReader.skipped` and
  logged once per segment;
* bytes that are not Pravega events (a byte stream's data) are read as they
  are: records of ``format`` ``bytes``, ``key`` and ``timestamp_ms`` ``None``,
  whose values put together are the segment's bytes. Nothing stored is an
  error to the reader.

How segments are walked
-----------------------
Reading starts at the stream's head segments (``getSegments`` at time 0, at
their start offsets) or at explicit ``{segment: offset}`` positions. Each
segment is read with ``ReadSegment`` in 2 MiB steps; events split between
replies are reassembled. A sealed segment ends with ``end_of_segment``; the
reader then asks the controller for its successors and starts each once all
of its predecessors it knows of are finished (so per-key order holds across
scaling). Without ``follow`` a segment is read up to the length it had when
the reader reached it (a snapshot: reading ends); with ``follow`` reads at the
tail are long-polled (the server holds them) and reading never ends by itself.
Segments are read concurrently; records of one segment come in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING

# The pure part (what a record is, unframing events, unpacking TANK bundles) is
# shared with the server's RS-IO publisher, which reads the store directly.
from headrace.protocols.records import (
    EventBuffer,
    Record,
    SkipCount,
    iter_events,
    records_from_events,
    stamp_append_times,
)

from .controller import Segment
from .errors import NoSuchSegmentError, SegmentIsTruncatedError

if TYPE_CHECKING:
    from .pravega import PravegaClient

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_TANK_SCOPE",
    "MAX_QUEUED_BATCHES",
    "Record",
    "RecordReader",
    "iter_events",
    "records_from_events",
]

DEFAULT_TANK_SCOPE = "tank"
"""Scope holding TANK topics (the server's ``--tank-scope`` default)."""

MAX_QUEUED_BATCHES = 16
"""Read replies (each up to 2 MiB) decoded and waiting for the consumer; bounds
memory when the consumer is slower than the segments."""


_EventBuffer = EventBuffer  # the name client.reader and the tests use

_Batch = tuple[Segment, int, list[Record]]
"""Records decoded from one read reply, with the segment and the offset after them."""


class RecordReader:
    """Reads one stream as records. Iterate with ``async for``; close with :meth:`aclose`.

    Args:
        client: the client to read through (not closed by the reader).
        scope, stream: the stream.
        start: ``{segment: offset}`` to start from; default the stream's head.
        follow: keep reading at the tail (never ends); default read what is
            there when each segment is reached, then end.
        tank_scope: the scope whose streams hold TANK bundles.
        until: ``{segment: offset}`` where to stop (a stream cut, e.g. the
            controller's segments at a time): each of those segments is read
            up to the offset and none of its successors is read.
    """

    def __init__(
        self,
        client: PravegaClient,
        scope: str,
        stream: str,
        *,
        start: Mapping[Segment, int] | None = None,
        follow: bool = False,
        tank_scope: str = DEFAULT_TANK_SCOPE,
        until: Mapping[Segment, int] | None = None,
    ) -> None:
        self._client = client
        self._until = dict(until) if until is not None else {}
        self.scope = scope
        self.stream = stream
        self._start = dict(start) if start is not None else None
        self.follow = follow
        self.tank = scope == tank_scope
        self._queue: asyncio.Queue[_Batch | BaseException | None] = asyncio.Queue(
            MAX_QUEUED_BATCHES
        )
        self._tasks: dict[Segment, asyncio.Task[None]] = {}
        self._started: set[int] = set()
        self._finished: set[int] = set()
        self._waiting: dict[Segment, set[int]] = {}
        self._running = 0
        self.positions: dict[Segment, int] = {}
        """Where each segment's reading stands: the offset after the last record handed out."""
        self._skipped = SkipCount()
        self._warned: set[str] = set()
        self._opened = False
        self._closed = False

    @property
    def name(self) -> str:
        return f"{self.scope}/{self.stream}"

    @property
    def skipped(self) -> int:
        """Events of a TANK topic skipped so far because they are not bundles."""
        return self._skipped.events

    async def _open(self) -> None:
        self._opened = True
        start = self._start
        if start is None:
            start = await self._client.controller.get_head_segments(self.scope, self.stream)
        if not start:
            await self._queue.put(None)
            return
        for segment, offset in sorted(start.items()):
            self._launch(segment, offset)

    def _launch(self, segment: Segment, offset: int) -> None:
        self._started.add(segment.segment_id)
        self._running += 1
        self.positions.setdefault(segment, offset)
        self._tasks[segment] = asyncio.create_task(
            self._read_segment(segment, offset), name=f"records {segment.name}"
        )

    async def _read_segment(self, segment: Segment, offset: int) -> None:
        segments = self._client.segments
        try:
            limit: int | None = None
            sealed_at_start = False
            if not self.follow:
                stat = await segments.stat(segment)
                limit, sealed_at_start = stat.length, stat.sealed
            stop = self._until.get(segment)
            if stop is not None and (limit is None or stop <= limit):
                limit = stop  # the cut
            buf = _EventBuffer(offset)
            sealed_end = False
            while limit is None or offset < limit:
                try:
                    got = await segments.read_view(segment, offset)  # events copied once
                except (SegmentIsTruncatedError, NoSuchSegmentError):
                    sealed_end = True  # gone or truncated away: like the Rust reader, move on
                    break
                offset += len(got.data)
                ended = got.end_of_segment or (limit is not None and offset >= limit)
                await self._hand_out(segment, buf, got.data, ended, offset, stop)
                if got.end_of_segment:
                    sealed_end = True
                    break
            if stop is not None:
                pass  # read up to the cut: none of its successors is read
            elif sealed_end or (sealed_at_start and limit is not None and offset >= limit):
                await self._segment_finished(segment)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            await self._queue.put(exc)
        finally:
            self._running -= 1
            if self._running == 0 and not self._closed:
                await self._queue.put(None)

    async def _hand_out(
        self,
        segment: Segment,
        buf: EventBuffer,
        data: bytes | memoryview,
        ended: bool,
        read_end: int,
        stop: int | None,
    ) -> None:
        """Queue the records ``data`` completes; at the end of what is read, the
        bytes of an event that never completed too (as raw bytes). Records at or
        past the cut ``stop`` are left out (the read ended at ``read_end``); records
        without a time of their own get their append time from the segment's
        time index."""
        events = list(buf.feed(data))
        if ended:
            events += buf.flush()
        records = list(
            records_from_events(
                self.name, segment.name, iter(events), tank=self.tank, skipped=self._skipped
            )
        )
        if segment.name in self._skipped.segments and segment.name not in self._warned:
            self._warned.add(segment.name)
            log.warning(
                "%s: skipping events of %s that are not TANK bundles", self.name, segment.name
            )
        if stop is not None and read_end > stop:  # the read went past the cut
            records = [r for r in records if r.offset < stop]
        if records and not self.tank and any(r.timestamp_ms is None for r in records):
            times = await self._client.segments.append_times(
                segment, records[0].offset, records[-1].offset + 1
            )
            records = stamp_append_times(records, times)
        if records:
            await self._queue.put((segment, buf.offset, records))

    async def _segment_finished(self, segment: Segment) -> None:
        self._finished.add(segment.segment_id)
        successors = await self._client.controller.get_successors(segment)
        for rng, pred_ids in successors.items():
            nxt = rng.segment
            if nxt.segment_id in self._started:
                continue
            self._waiting[nxt] = {pid for pid in pred_ids if pid in self._started}
        for nxt, waits_for in list(self._waiting.items()):
            if waits_for <= self._finished:
                del self._waiting[nxt]
                self._launch(nxt, 0)

    def __aiter__(self) -> AsyncIterator[Record]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Record]:
        if not self._opened:
            await self._open()
        while True:
            item = await self._queue.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            segment, end, records = item
            for record in records:
                yield record
            self.positions[segment] = end

    async def aclose(self) -> None:
        self._closed = True
        for task in self._tasks.values():
            task.cancel()
        for task in self._tasks.values():
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def __aenter__(self) -> RecordReader:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
