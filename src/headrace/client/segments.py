"""Request/reply segment operations: info, reads, truncation, table segments.

:class:`SegmentClient` finds the segment store of a segment through the
controller (``getURI``), borrows the pool's shared connection and turns error
replies into :mod:`headrace.client.errors` exceptions. Reads, table calls and
metadata calls all go through it; appends go through the writers.

Read-ahead. A reader that reads a segment sequentially (each read starting
where the previous one of the same segment and size ended) gets the next
``ReadSegment`` sent as soon as the end of the reply it waits for is known:
when that reply's fields (offset, flags, data length: they come before the
data) arrive, or, for a small reply, when it comes. So the server reads and
queues the next 2 MiB while this reply's data is still arriving and while the
caller decodes it (Pravega's Java reader keeps a read outstanding too). One
read-ahead per reader of a segment: the next is sent once the caller claims
this one (or at once, if its end is known by then). Only where the reply did
not reach the tail and the segment did not end: a read-ahead is never parked
at the tail, so reads at the tail behave as without it. At most
``MAX_READ_AHEADS`` are outstanding per client (each holds up to 2 MiB), each
is dropped after ``READ_AHEAD_MAX_AGE_S`` unclaimed, a ``truncate`` through
this client drops the segment's, and a read-ahead that failed in any way is
simply read again, so its errors are the same as an ordinary read's.

Routing. Each segment's store is asked of the controller once and kept (at
most ``MAX_CACHED_ENDPOINTS``): in a cluster the segments of one stream live
on different nodes. A ``WrongHost`` reply (the segment moved, or nobody
serves it right now) forgets it: the request is sent again, after the retry
policy's delay, to wherever ``getURI`` then names.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace

from headrace.errors import ConnectionLost, RequestTimeout
from headrace.protocols import pravega as p

from ._conn import (
    READ_TIMEOUT_S,
    REQUEST_TIMEOUT_S,
    ConnectionPool,
    ReadHeaderCallback,
    SegmentStoreConnection,
    next_request_id,
)
from .controller import ControllerClient, Segment
from .errors import ReplyError, error_for_reply

__all__ = [
    "MAX_CACHED_ENDPOINTS",
    "MAX_READ_AHEADS",
    "READ_AHEAD_MAX_AGE_S",
    "READ_SUGGESTED_BYTES",
    "SegmentClient",
    "SegmentData",
    "SegmentStat",
    "SegmentView",
]

MAX_CACHED_ENDPOINTS = 4096
"""Segments whose store endpoint one client keeps; past it the least recently
used is forgotten (and asked of the controller again when needed)."""

READ_SUGGESTED_BYTES = 2 * 1024 * 1024
"""Bytes asked for per ``ReadSegment``: the server's cap on one reply (Java's
2 MiB), so one round trip carries as much as the server will send."""

MAX_READ_AHEADS = 16
"""Most read-ahead ``ReadSegment``s one client keeps outstanding or unclaimed
(each up to 2 MiB: 32 MiB at most). Past it, sequential readers of further
segments read without one; none is dropped to make room, so many segments read
at once do not push each other's read-aheads out."""

READ_AHEAD_MAX_AGE_S = 5.0
"""An unclaimed read-ahead is dropped this long after it was sent: a reader that
stopped reading does not hold its 2 MiB, nor a reply older than this."""

MAX_SEQUENTIAL_TRACKED = 1024
"""Segments whose last read's end is remembered to recognise sequential reading
(a few dozen bytes each); the oldest is forgotten past it."""

_UNKNOWN = -1


@dataclass(frozen=True, slots=True)
class SegmentStat:
    """What ``GetStreamSegmentInfo`` says about a segment."""

    name: str
    exists: bool
    sealed: bool
    start_offset: int
    length: int
    last_modified_ms: int


@dataclass(frozen=True, slots=True)
class SegmentData:
    """One ``SegmentRead``: bytes from ``offset``; ``end_of_segment`` once sealed and read."""

    offset: int
    data: bytes
    end_of_segment: bool
    at_tail: bool


@dataclass(frozen=True, slots=True)
class SegmentView:
    """Like :class:`SegmentData`, with ``data`` as the received bytes themselves.

    ``data`` is a read-only ``memoryview`` of the reply frame when the reply
    was large (``bytes`` when small): no copy is made, and the frame's buffer
    lives as long as the view. For readers that cut the data up (into events)
    and copy each piece once; :meth:`SegmentClient.read` gives ``bytes``.
    """

    offset: int
    data: bytes | memoryview
    end_of_segment: bool
    at_tail: bool


_ReadKey = tuple[str, int, int]
"""(segment name, offset, suggested bytes) of a read."""


@dataclass(slots=True)
class _ReadAhead:
    task: asyncio.Task[p.SegmentRead]
    expiry: asyncio.TimerHandle


@dataclass(slots=True)
class _Sequence:
    """One sequential reader of a segment (per read size): where it is, how far it read ahead.

    Attributes:
        end: where the last reply handed out ended; a read from here is sequential.
        frontier: offset of the furthest read sent for it (the caller's or a
            read-ahead), or ``_UNKNOWN``.
        frontier_end: where that read's reply ends, once its fields have come and
            said it neither reached the tail nor ended the segment; the next
            read-ahead goes there.
    """

    end: int
    frontier: int = _UNKNOWN
    frontier_end: int = _UNKNOWN


class SegmentClient:
    """Segment-store calls for any segment, routed through the controller's ``getURI``."""

    def __init__(self, controller: ControllerClient, pool: ConnectionPool) -> None:
        self._controller = controller
        self._pool = pool
        self._endpoints: OrderedDict[Segment, tuple[str, int]] = OrderedDict()
        self._ahead: dict[_ReadKey, _ReadAhead] = {}
        self._sequences: OrderedDict[tuple[str, int], _Sequence] = OrderedDict()  # (name, size)

    async def connection(self, segment: Segment) -> SegmentStoreConnection:
        """The pool's connection to the store serving ``segment`` (endpoint cached per segment)."""
        endpoints = self._endpoints
        endpoint = endpoints.get(segment)
        if endpoint is None:
            endpoint = await self._controller.get_uri(segment)
            endpoints[segment] = endpoint
            if len(endpoints) > MAX_CACHED_ENDPOINTS:
                endpoints.popitem(last=False)
        else:
            endpoints.move_to_end(segment)
        return await self._pool.get(endpoint)

    async def _call(
        self,
        segment: Segment,
        cmd: p.Command,
        expect: type[p.Command],
        timeout_s: float = REQUEST_TIMEOUT_S,
        *,
        idempotent: bool = False,
        watch: tuple[str, int, ReadHeaderCallback] | None = None,
    ) -> p.Command:
        """Send ``cmd`` with the stream's delegation token; the reply if it is
        an ``expect``, else its error.

        An ``idempotent`` request (reads, info) is sent again, on a new
        connection, when the connection is lost or the request times out,
        as the pool's retry policy allows (a server restart is invisible).
        ``watch``: (segment, offset, callback) given to the connection's
        ``watch_read_header`` while the request is out.
        """
        delays = self._pool.retry.delays()
        refreshed = False
        while True:
            try:
                conn = await self.connection(segment)
                token = await self._controller.delegation_token(segment.scope, segment.stream)
                if token:
                    cmd = replace(cmd, delegation_token=token)  # type: ignore[type-var]
                if watch is None:
                    reply = await conn.request(cmd, timeout_s=timeout_s)
                else:
                    conn.watch_read_header(*watch)
                    try:
                        reply = await conn.request(cmd, timeout_s=timeout_s)
                    finally:
                        conn.unwatch_read_header(*watch)
            except (ConnectionLost, RequestTimeout):
                delay = next(delays, None) if idempotent else None
                if delay is None:
                    raise
                await asyncio.sleep(delay)
                cmd = replace(cmd, request_id=next_request_id())  # type: ignore[type-var]
                continue
            if (
                isinstance(reply, p.AuthTokenCheckFailed)
                and reply.error_code == p.AuthTokenCheckFailed.TOKEN_EXPIRED
                and not refreshed
            ):
                # The token ran out on the way (or the clocks disagree): once more
                # with a fresh one; the server did nothing with the refused request.
                refreshed = True
                self._controller.forget_token(segment.scope, segment.stream)
                cmd = replace(cmd, request_id=next_request_id())  # type: ignore[type-var]
                continue
            if isinstance(reply, p.WrongHost):
                # Not served there (any more): ask the controller again, as the
                # retry policy allows. Nothing was done with the request.
                self._endpoints.pop(segment, None)
                delay = next(delays, None)
                if delay is not None:
                    await asyncio.sleep(delay)
                    cmd = replace(cmd, request_id=next_request_id())  # type: ignore[type-var]
                    continue
            break
        if not isinstance(reply, expect):
            raise error_for_reply(reply)
        return reply

    async def stat(self, segment: Segment, name: str | None = None) -> SegmentStat:
        """``GetStreamSegmentInfo`` of ``segment`` (or of ``name``, a segment of its stream)."""
        seg_name = name or segment.name
        reply = await self._call(
            segment,
            p.GetStreamSegmentInfo(next_request_id(), seg_name),
            p.StreamSegmentInfo,
            idempotent=True,
        )
        assert isinstance(reply, p.StreamSegmentInfo)
        return SegmentStat(
            seg_name,
            reply.exists,
            reply.is_sealed,
            reply.start_offset,
            reply.write_offset,
            reply.last_modified,
        )

    async def append_times(self, segment: Segment, offset: int, end: int) -> list[tuple[int, int]]:
        """When the bytes of ``[offset, end)`` were appended: the store's time index
        entries ``(offset, ms)`` covering them (``ReadSegmentTimes``, a headrace
        extension, pravega.md#segment-times); an event's append time is the time
        of the last entry at or below its offset. Empty where the server keeps
        no index for the segment, or does not know the request.
        """
        try:
            reply = await self._call(
                segment,
                p.ReadSegmentTimes(next_request_id(), segment.name, offset, end),
                p.SegmentTimesRead,
                idempotent=True,
            )
        except ReplyError as exc:
            if isinstance(exc.reply, p.OperationUnsupported):
                return []
            raise
        assert isinstance(reply, p.SegmentTimesRead)
        times = reply.times
        return list(zip(times[0::2], times[1::2], strict=True))

    async def read(
        self,
        segment: Segment,
        offset: int,
        *,
        suggested_bytes: int = READ_SUGGESTED_BYTES,
        name: str | None = None,
        timeout_s: float = READ_TIMEOUT_S,
    ) -> SegmentData:
        """One ``ReadSegment`` from ``offset``; at the tail of an open segment the
        server holds the read until data arrives (or replies empty after a while).

        Sequential reads are read ahead (see the module's docstring).

        Raises:
            SegmentIsTruncatedError: ``offset`` is below the segment's start.
            NoSuchSegmentError: the segment does not exist.
        """
        got = await self.read_view(
            segment, offset, suggested_bytes=suggested_bytes, name=name, timeout_s=timeout_s
        )
        data = got.data if type(got.data) is bytes else bytes(got.data)
        return SegmentData(got.offset, data, got.end_of_segment, got.at_tail)

    async def read_view(
        self,
        segment: Segment,
        offset: int,
        *,
        suggested_bytes: int = READ_SUGGESTED_BYTES,
        name: str | None = None,
        timeout_s: float = READ_TIMEOUT_S,
    ) -> SegmentView:
        """:meth:`read`, with the data not copied out of the reply (:class:`SegmentView`)."""
        seg_name = name or segment.name
        key = (seg_name, offset, suggested_bytes)
        reply = await self._claim_read_ahead(segment, key, timeout_s)
        sequence = self._sequences.get((seg_name, suggested_bytes))
        sequential = reply is not None or (sequence is not None and sequence.end == offset)
        if reply is None:
            if sequential:
                assert sequence is not None
                sequence.frontier, sequence.frontier_end = offset, _UNKNOWN
            reply = await self._read_once(segment, key, timeout_s, watch=sequential)
        end = offset + len(reply.data)
        sequence = self._remember_end(seg_name, suggested_bytes, end)
        if sequential and reply.data and not reply.at_tail and not reply.end_of_segment:
            if sequence.frontier <= offset:  # a small reply: its end is known only now
                sequence.frontier, sequence.frontier_end = offset, end
            self._top_up(segment, seg_name, suggested_bytes, timeout_s)
        return SegmentView(reply.offset, reply.data, reply.end_of_segment, reply.at_tail)

    async def _read_once(
        self, segment: Segment, key: _ReadKey, timeout_s: float, *, watch: bool = False
    ) -> p.SegmentRead:
        """One ``ReadSegment``; with ``watch``, its fields arriving ahead of its
        data move the reader's frontier on (``_header_came``)."""
        seg_name, offset, suggested_bytes = key
        cmd = p.ReadSegment(seg_name, offset, suggested_bytes, request_id=next_request_id())
        watching = None
        if watch:
            callback = functools.partial(self._header_came, segment, key, timeout_s)
            watching = (seg_name, offset, callback)
        reply = await self._call(
            segment, cmd, p.SegmentRead, timeout_s, idempotent=True, watch=watching
        )
        assert isinstance(reply, p.SegmentRead)
        if reply.offset != offset:
            raise error_for_reply(reply)
        return reply

    # ------------------------------------------------------------------ read-ahead

    def _remember_end(self, seg_name: str, suggested_bytes: int, end: int) -> _Sequence:
        sequences = self._sequences
        sequence = sequences.get((seg_name, suggested_bytes))
        if sequence is None:
            sequence = sequences[(seg_name, suggested_bytes)] = _Sequence(end)
        else:
            sequence.end = end
            sequences.move_to_end((seg_name, suggested_bytes))
        while len(sequences) > MAX_SEQUENTIAL_TRACKED:
            sequences.popitem(last=False)
        return sequence

    def _header_came(
        self,
        segment: Segment,
        key: _ReadKey,
        timeout_s: float,
        length: int,
        at_tail: bool,
        end_of_segment: bool,
    ) -> None:
        """The fields of the reply to the read of ``key`` came, ahead of its data:
        if it is the reader's furthest read, where it ends is where the next
        read-ahead goes (sent now unless one is still unclaimed)."""
        seg_name, offset, suggested_bytes = key
        sequence = self._sequences.get((seg_name, suggested_bytes))
        if sequence is None or sequence.frontier != offset:
            return
        if length and not at_tail and not end_of_segment:
            sequence.frontier_end = offset + length
            self._top_up(segment, seg_name, suggested_bytes, timeout_s)

    def _top_up(
        self, segment: Segment, seg_name: str, suggested_bytes: int, timeout_s: float
    ) -> None:
        """Send the reader's next read-ahead if where it goes is known and none of
        its read-aheads is unclaimed."""
        sequence = self._sequences.get((seg_name, suggested_bytes))
        if sequence is None or sequence.frontier_end == _UNKNOWN:
            return
        if any(k[0] == seg_name and k[2] == suggested_bytes for k in self._ahead):
            return
        key = (seg_name, sequence.frontier_end, suggested_bytes)
        if self._read_ahead(segment, key, timeout_s):
            sequence.frontier, sequence.frontier_end = key[1], _UNKNOWN

    def _read_ahead(self, segment: Segment, key: _ReadKey, timeout_s: float) -> bool:
        """Send the read of ``key`` now, for the caller's next :meth:`read_view` to
        claim; False if ``MAX_READ_AHEADS`` are out already."""
        if key in self._ahead:
            return True
        if len(self._ahead) >= MAX_READ_AHEADS:
            return False
        task = asyncio.create_task(
            self._read_once(segment, key, timeout_s, watch=True),
            name=f"read-ahead {key[0]}@{key[1]}",
        )
        task.add_done_callback(_consume_outcome)
        loop = asyncio.get_running_loop()
        expiry = loop.call_later(READ_AHEAD_MAX_AGE_S, self._drop_read_ahead, key, task)
        self._ahead[key] = _ReadAhead(task, expiry)
        return True

    async def _claim_read_ahead(
        self, segment: Segment, key: _ReadKey, timeout_s: float
    ) -> p.SegmentRead | None:
        """The read-ahead reply for ``key`` if one was sent and it is usable, else None.

        Claiming it lets the next read-ahead go at once if where it goes is
        already known. A read-ahead that failed (whatever the error) or came
        back empty is not used: the caller reads again, so what it sees is what
        a read now would give.
        """
        ahead = self._ahead.pop(key, None)
        if ahead is None:
            return None
        ahead.expiry.cancel()
        self._top_up(segment, key[0], key[2], timeout_s)
        try:
            reply = await ahead.task  # cancelling the caller cancels the read-ahead too
        except Exception:  # read again: the fresh read reports the error, if it persists
            return None
        return reply if reply.data or reply.end_of_segment else None

    def _drop_read_ahead(self, key: _ReadKey, task: asyncio.Task[p.SegmentRead]) -> None:
        ahead = self._ahead.get(key)
        if ahead is not None and ahead.task is task:
            del self._ahead[key]
            task.cancel()

    def _forget_segment(self, seg_name: str) -> None:
        """Drop the read-aheads of ``seg_name`` (its bytes before some offset went away)."""
        for key in [k for k in self._ahead if k[0] == seg_name]:
            ahead = self._ahead.pop(key)
            ahead.expiry.cancel()
            ahead.task.cancel()
        for end_key in [k for k in self._sequences if k[0] == seg_name]:
            del self._sequences[end_key]

    @property
    def read_aheads(self) -> list[tuple[str, int]]:
        """``(segment name, offset)`` of each read-ahead sent and not yet claimed."""
        return [(name, offset) for name, offset, _ in self._ahead]

    async def aclose(self) -> None:
        """Cancel every read-ahead (the pool's connections are closed by its owner)."""
        aheads = list(self._ahead.values())
        self._ahead.clear()
        for ahead in aheads:
            ahead.expiry.cancel()
            ahead.task.cancel()
        for ahead in aheads:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await ahead.task

    async def truncate(self, segment: Segment, offset: int) -> None:
        self._forget_segment(segment.name)
        await self._call(
            segment,
            p.TruncateSegment(next_request_id(), segment.name, offset),
            p.SegmentTruncated,
        )
        self._forget_segment(segment.name)  # and any sent while it was on its way

    # ------------------------------------------------------------------ table segments

    async def create_table(self, segment: Segment, name: str) -> bool:
        """Create table segment ``name``; ``False`` if it exists.

        Carries ``segment``'s stream's delegation token, as every table request
        does (a server with auth on refuses one without)."""
        conn = await self.connection(segment)
        token = await self._controller.delegation_token(segment.scope, segment.stream)
        reply = await conn.request(p.CreateTableSegment(next_request_id(), name, token))
        if isinstance(reply, p.SegmentCreated):
            return True
        if isinstance(reply, p.SegmentAlreadyExists):
            return False
        raise error_for_reply(reply)

    async def delete_table(self, segment: Segment, name: str) -> bool:
        """Delete table segment ``name``; ``False`` if it did not exist."""
        conn = await self.connection(segment)
        token = await self._controller.delegation_token(segment.scope, segment.stream)
        reply = await conn.request(p.DeleteTableSegment(next_request_id(), name, False, token))
        if isinstance(reply, p.SegmentDeleted):
            return True
        if isinstance(reply, p.NoSuchSegment):
            return False
        raise error_for_reply(reply)

    async def table_update(
        self, segment: Segment, name: str, entries: Sequence[tuple[bytes, bytes, int]]
    ) -> list[int]:
        """Put ``(key, value, expected_version)`` entries atomically; their new versions.

        ``expected_version`` is ``p.NO_VERSION`` (unconditional), ``-1`` (must
        be absent) or the key's current version.

        Raises:
            TableKeyVersionError: a condition failed; nothing was written.
        """
        table = p.TableEntries(
            tuple((p.TableKey(k, v_exp), p.TableValue(v)) for k, v, v_exp in entries)
        )
        reply = await self._call(
            segment,
            p.UpdateTableEntries(next_request_id(), name, "", table),
            p.TableEntriesUpdated,
        )
        assert isinstance(reply, p.TableEntriesUpdated)
        return list(reply.versions)

    async def table_remove(
        self, segment: Segment, name: str, keys: Sequence[tuple[bytes, int]]
    ) -> None:
        """Remove ``(key, expected_version)`` keys atomically."""
        await self._call(
            segment,
            p.RemoveTableKeys(
                next_request_id(), name, "", tuple(p.TableKey(k, v) for k, v in keys)
            ),
            p.TableKeysRemoved,
        )

    async def table_get(
        self, segment: Segment, name: str, keys: Sequence[bytes]
    ) -> list[tuple[bytes, int] | None]:
        """Each key's ``(value, version)``, or ``None`` where absent."""
        reply = await self._call(
            segment,
            p.ReadTable(next_request_id(), name, "", tuple(p.TableKey(k) for k in keys)),
            p.TableRead,
        )
        assert isinstance(reply, p.TableRead)
        out: list[tuple[bytes, int] | None] = []
        for key, value in reply.entries.entries:
            out.append(None if key.version == p.NOT_EXISTS else (value.value, key.version))
        return out

    async def table_entries(
        self, segment: Segment, name: str, *, page_size: int = 1000
    ) -> list[tuple[bytes, bytes, int]]:
        """Every ``(key, value, version)`` of a table, through the entry iterator."""
        token = b""
        out: list[tuple[bytes, bytes, int]] = []
        while True:
            reply = await self._call(
                segment,
                p.ReadTableEntries(
                    next_request_id(),
                    name,
                    "",
                    page_size,
                    p.TableIteratorArgs(continuation_token=token),
                ),
                p.TableEntriesRead,
            )
            assert isinstance(reply, p.TableEntriesRead)
            for key, value in reply.entries.entries:
                out.append((key.key, value.value, key.version))
            if not reply.entries.entries or reply.continuation_token == token:
                return out
            token = reply.continuation_token


def _consume_outcome(task: asyncio.Task[p.SegmentRead]) -> None:
    """Mark an unclaimed read-ahead's error as seen (no "never retrieved" log)."""
    if not task.cancelled():
        task.exception()
