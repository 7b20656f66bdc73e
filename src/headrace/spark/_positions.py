"""Positions: where a read starts, and where the next micro-batch ends.

A *position* is ``{"scope/stream": {"<segment id>": offset}}``: the offset of
the next event to read in each segment of each stream (string keys, because
Spark stores offsets as JSON). Offsets are Pravega byte offsets, always on
event boundaries. A segment that is sealed and read to its end is replaced by
its successors once all of their predecessors are read (per-key order holds
across scaling).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from headrace.client import PravegaClient, Segment
from headrace.client.errors import NoSuchSegmentError
from headrace.errors import HeadraceError, RemoteProtocolError
from headrace.protocols.records import MAX_EVENT_BYTES
from headrace.protocols.tank.bundle import decode_bundle_header

from ._connect import Target, run, split_name
from ._frames import EVENT_HEADER

if TYPE_CHECKING:
    from .options import ReadOptions

__all__ = [
    "BUNDLE_HEADER_PEEK",
    "INTERNAL_STREAM_PREFIX",
    "SCAN_READ_BYTES",
    "DataLossError",
    "NextBatch",
    "Position",
    "TimeNotFoundError",
    "advance",
    "all_segments",
    "earliest",
    "latest",
    "lost",
    "matching_streams",
    "next_batch",
    "resolve",
    "scan",
    "starting_position",
    "successors",
    "walk",
]

Position = dict[str, dict[str, int]]
"""``{"scope/stream": {"<segment id>": offset}}`` (module docstring)."""


SCAN_READ_BYTES = 1024 * 1024
"""Bytes per read while walking event headers on the driver (``minPartitions``,
``maxEventsPerTrigger``, ``maxBytesPerTrigger``)."""


class DataLossError(HeadraceError):
    """Data the query needs is gone (truncated by retention, or deleted)."""


async def _earliest(client: PravegaClient, streams: Sequence[str]) -> Position:
    out: Position = {}
    for name in streams:
        heads = await client.controller.get_head_segments(*split_name(name))
        out[name] = {str(s.segment_id): off for s, off in heads.items()}
    return out


async def _latest(client: PravegaClient, streams: Sequence[str]) -> Position:
    """Every segment with data still to come, at its current length.

    Open segments are what writers append to; segments of a sealed stream are
    its last epoch (their length: nothing more will come).
    """
    out: Position = {}
    for name in streams:
        scope, stream = split_name(name)
        ranges = await client.controller.get_current_segments(scope, stream)
        segments = [r.segment for r in ranges]
        if not segments:  # sealed stream: walk to its last segments
            segments = [s for s, _ in await all_segments(client, scope, stream)]
            segments = [s for s in segments if not await successors(client, s)]
        cur: dict[str, int] = {}
        for seg in segments:
            stat = await client.segments.stat(seg)
            cur[str(seg.segment_id)] = stat.length
        out[name] = cur
    return out


def earliest(uri: Target, streams: Sequence[str]) -> Position:
    return run(uri, lambda c: _earliest(c, streams))


def latest(uri: Target, streams: Sequence[str]) -> Position:
    return run(uri, lambda c: _latest(c, streams))


def resolve(uri: Target, spec: str, streams: Sequence[str], default: str) -> Position:
    """A starting or ending position from an option value.

    ``earliest``, ``latest``, or JSON ``{"scope/stream": {"<segment id>": offset}}``
    where -2 means the segment's start and -1 its current length; streams left
    out of the JSON take ``default``.
    """
    if spec == "earliest":
        return earliest(uri, streams)
    if spec == "latest":
        return latest(uri, streams)
    given = json.loads(spec)

    async def work(client: PravegaClient) -> Position:
        fallback = await (_earliest if default == "earliest" else _latest)(client, streams)
        out: Position = {}
        for name in streams:
            if name not in given:
                out[name] = fallback[name]
                continue
            scope, stream = split_name(name)
            cur: dict[str, int] = {}
            for seg_id, off in given[name].items():
                if off < 0:
                    stat = await client.segments.stat(Segment(scope, stream, int(seg_id)))
                    off = stat.start_offset if off == -2 else stat.length
                cur[str(int(seg_id))] = int(off)
            out[name] = cur
        return out

    return run(uri, work)


async def _at_time(client: PravegaClient, name: str, ms: int, *, tank: bool) -> dict[str, int]:
    """Where a stream's rows with a timestamp >= ``ms`` begin, at or before them.

    TANK topics (messages carry their producer's timestamps, in any order):
    every head segment from its start; the reader drops the earlier rows.
    Other streams (events carry no timestamp; time is append time): the
    segments open at ``ms`` (the controller's epoch at that time: a segment
    sealed before it received nothing since), each from its start, except
    that a segment not modified since before ``ms`` starts at its end.
    Nothing appended at or after ``ms`` is left out; earlier events of a
    segment that was appended to across ``ms`` are included.
    """
    scope, stream = split_name(name)
    if tank:
        heads = await client.controller.get_head_segments(scope, stream)
        return {str(s.segment_id): off for s, off in heads.items()}
    out: dict[str, int] = {}
    for seg, off in (await client.controller.get_segments_at(scope, stream, ms)).items():
        stat = await client.segments.stat(seg)
        quiet = stat.last_modified_ms < ms  # nothing appended, merged or sealed since
        out[str(seg.segment_id)] = stat.length if quiet else max(off, stat.start_offset)
    return out


INTERNAL_STREAM_PREFIX = "_"
"""Streams whose name starts so are the server's own (readers' groups, marks):
``streamPattern`` never matches them."""


def matching_streams(uri: Target, pattern: str) -> list[str]:
    """Every ``scope/stream`` the regular expression ``pattern`` matches as a
    whole (as Kafka's ``subscribePattern`` matches topic names), sorted."""

    async def work(client: PravegaClient) -> list[str]:
        regex = re.compile(pattern)
        found: list[str] = []
        async for scope in client.controller.list_scopes():
            async for stream in client.controller.list_streams(scope):
                name = f"{scope}/{stream}"
                if not stream.startswith(INTERNAL_STREAM_PREFIX) and regex.fullmatch(name):
                    found.append(name)
        return sorted(found)

    return run(uri, work)


class TimeNotFoundError(ValueError):
    """``startingOffsetsByTimestampStrategy=error``: a stream holds nothing
    appended at or after the time asked for."""


async def _check_found(client: PravegaClient, name: str, ms: int, pos: dict[str, int]) -> None:
    """Raise ``TimeNotFoundError`` unless some event of ``name`` was appended at
    or after ``ms``: a segment of ``pos`` with bytes after its start there, or
    a successor (created since)."""
    scope, stream = split_name(name)
    for seg_id, off in pos.items():
        seg = Segment(scope, stream, int(seg_id))
        if (await client.segments.stat(seg)).length > off or await successors(client, seg):
            return
    raise TimeNotFoundError(
        f"startingOffsetsByTimestampStrategy=error: nothing in {name} was appended at or "
        f"after {ms} (set it to latest to start at the end)"
    )


def starting_position(opts: ReadOptions, default: str) -> Position:
    """The starting position of a read: ``startingTimestamp`` /
    ``startingOffsetsByTimestamp`` for the streams they name
    (:func:`_at_time`), ``startingOffsets`` (or ``default``) for the others.

    Raises:
        TimeNotFoundError: a stream has nothing appended at or after its time
            and ``startingOffsetsByTimestampStrategy`` is ``error``.
    """
    others = [n for n in opts.streams if n not in opts.starting_times]
    pos = resolve(opts.connection, opts.starting, others, default) if others else {}
    if opts.starting_times:

        async def work(client: PravegaClient) -> Position:
            out: Position = {}
            for name, ms in opts.starting_times.items():
                tank = split_name(name)[0] == opts.tank_scope
                out[name] = await _at_time(client, name, ms, tank=tank)
                if opts.time_strategy == "error" and not tank:
                    await _check_found(client, name, ms, out[name])
            return out

        pos.update(run(opts.connection, work))
    return pos


async def successors(client: PravegaClient, seg: Segment) -> dict[Segment, list[int]]:
    found = await client.controller.get_successors(seg)
    return {rng.segment: preds for rng, preds in found.items()}


async def all_segments(client: PravegaClient, scope: str, stream: str) -> list[tuple[Segment, int]]:
    """Every readable segment of a stream (heads, then successors), with its start."""
    heads = await client.controller.get_head_segments(scope, stream)
    seen: dict[Segment, int] = dict(heads)
    todo = list(heads)
    while todo:
        seg = todo.pop()
        for nxt in await successors(client, seg):
            if nxt not in seen:
                seen[nxt] = 0
                todo.append(nxt)
    return sorted(seen.items())


def advance(uri: Target, start: Position, opts: ReadOptions) -> Position:
    """The end of the next micro-batch from ``start``, within the trigger
    limits of ``opts`` (:func:`next_batch`)."""
    return next_batch(start, opts, limited=True).end


@dataclass(frozen=True, slots=True)
class NextBatch:
    """What :func:`next_batch` found.

    Attributes:
        latest: every segment still to read, at its current length (what the
            query reports as ``latestOffset``).
        end: the end of the next micro-batch (``latest`` within the limits).
        enough: whether at least ``min_events`` events (TANK messages) lie
            between the start and ``latest`` (True without that option).
    """

    latest: Position
    end: Position
    enough: bool


def next_batch(start: Position, opts: ReadOptions, *, limited: bool) -> NextBatch:
    """The next micro-batch from ``start``: every segment's current length,
    segments that finished replaced by their successors, and (``limited``)
    cut to ``maxEventsPerTrigger``/``maxBytesPerTrigger``. Streams of
    ``opts.streams`` that ``start`` lacks start at their head.

    Raises:
        DataLossError: a start lies before a segment's start (``failOnDataLoss``).
    """

    async def work(client: PravegaClient) -> NextBatch:
        latest: Position = {}
        end: Position = {}
        counted = 0
        want = opts.min_events if limited else None
        for name in opts.streams:
            scope, stream = split_name(name)
            out, start_here = await _available(client, scope, stream, start.get(name, {}), opts)
            latest[name] = dict(out)
            if want is not None and counted < want:
                for seg_id, stop in out.items():
                    seg = Segment(scope, stream, int(seg_id))
                    tank = opts.is_tank(name)
                    lo = start_here[seg_id]
                    off, n = await scan(client, seg, lo, stop, want - counted, None, tank=tank)
                    # Cut short by the count: more than enough lie beyond.
                    counted = want if off < stop else counted + n
                    if counted >= want:
                        break
            if limited and (opts.max_events is not None or opts.max_bytes is not None):
                out = await _limit(client, scope, stream, start_here, out, opts)
            end[name] = out
        return NextBatch(latest, end, want is None or counted >= want)

    return run(opts.connection, work)


async def _available(
    client: PravegaClient, scope: str, stream: str, begin: dict[str, int], opts: ReadOptions
) -> tuple[dict[str, int], dict[str, int]]:
    """Every segment of one stream with data to read from ``begin`` (its
    segments' offsets; empty: the head), at its current length, and where
    the read of each starts."""
    name = f"{scope}/{stream}"
    cur = dict(begin)
    if not cur:
        cur = (await _earliest(client, [name]))[name]
    out: dict[str, int] = {}
    finished: set[int] = set()
    candidates: dict[Segment, list[int]] = {}
    for seg_id, off in cur.items():
        seg = Segment(scope, stream, int(seg_id))
        try:
            stat = await client.segments.stat(seg)
        except NoSuchSegmentError:
            lost(opts, f"segment {seg.name} no longer exists")
            finished.add(seg.segment_id)
            continue
        if off < stat.start_offset:
            lost(
                opts,
                f"{seg.name} was truncated to offset {stat.start_offset}; the query was at {off}",
            )
            off = cur[seg_id] = stat.start_offset  # skipping: limits count from here
        out[seg_id] = max(stat.length, off)
        if stat.sealed and off >= stat.length:
            finished.add(seg.segment_id)
            for nxt, preds in (await successors(client, seg)).items():
                candidates[nxt] = preds
    for nxt, preds in candidates.items():
        key = str(nxt.segment_id)
        known = [p for p in preds if str(p) in cur]
        if key not in out and all(p in finished for p in known):
            out[key] = (await client.segments.stat(nxt)).length
            cur[key] = 0
    # Segments read to the end whose successors are all in: no longer needed.
    for seg_id in list(out):
        if int(seg_id) in finished:
            succ = await successors(client, Segment(scope, stream, int(seg_id)))
            if all(str(s.segment_id) in out for s in succ):
                del out[seg_id]
                cur.pop(seg_id, None)
    return out, {k: cur.get(k, 0) for k in out}


def lost(opts: ReadOptions, what: str) -> None:
    if opts.fail_on_data_loss:
        raise DataLossError(
            f"data loss: {what}. Set failOnDataLoss=false to skip to the oldest data kept."
        )


async def _limit(
    client: PravegaClient,
    scope: str,
    stream: str,
    start: dict[str, int],
    end: dict[str, int],
    opts: ReadOptions,
) -> dict[str, int]:
    """Cut each segment's range so the batch holds at most ``max_events`` events
    and ``max_bytes`` bytes, shared in proportion to each segment's backlog."""
    lag = {k: end[k] - start[k] for k in end}
    total = sum(lag.values())
    if total == 0:
        return end
    out = dict(end)
    streams_count = len(opts.streams)
    for seg_id, backlog in lag.items():
        if backlog == 0:
            continue
        share = backlog / total / streams_count
        max_events = None if opts.max_events is None else max(1, int(opts.max_events * share))
        max_bytes = None if opts.max_bytes is None else max(1, int(opts.max_bytes * share))
        seg = Segment(scope, stream, int(seg_id))
        tank = opts.is_tank(f"{scope}/{stream}")
        out[seg_id], _ = await scan(
            client, seg, start[seg_id], end[seg_id], max_events, max_bytes, tank=tank
        )
    return out


async def walk(
    client: PravegaClient,
    seg: Segment,
    start: int,
    end: int,
    max_events: int | None,
    max_bytes: int | None,
) -> int:
    """The offset after at most ``max_events`` events / ``max_bytes`` bytes from
    ``start`` (at least one event), not beyond ``end``; reads the event headers."""
    return (await scan(client, seg, start, end, max_events, max_bytes))[0]


BUNDLE_HEADER_PEEK = 32
"""Bytes of a TANK bundle enough to hold its header (flags, message count and
the sparse sequence numbers: at most 1 + 3 + 8 + 10), read to count its messages."""


def _messages(payload: bytes | memoryview) -> int:
    """Messages in a stored TANK bundle; 0 for an event that is not one (the
    reader skips it)."""
    try:
        return decode_bundle_header(payload).msg_count
    except RemoteProtocolError:
        return 0


async def scan(
    client: PravegaClient,
    seg: Segment,
    start: int,
    end: int,
    max_events: int | None,
    max_bytes: int | None,
    *,
    tank: bool = False,
) -> tuple[int, int]:
    """The offset after at most ``max_events`` records / ``max_bytes`` bytes
    from ``start`` (at least one event), not beyond ``end``, and how many
    records lie before it. Reads the event headers; with ``tank`` a record is
    a message of a bundle (read from the bundle's header), so a cut falls
    between bundles and holds at least one."""
    offset = start  # always the offset of an event header
    count = 0
    while offset < end:
        got = await client.segments.read(seg, offset, suggested_bytes=SCAN_READ_BYTES)
        data = got.data
        if len(data) < EVENT_HEADER.size:
            break  # nothing more to read below ``end``
        pos = 0
        while pos + EVENT_HEADER.size <= len(data):
            kind, length = EVENT_HEADER.unpack_from(data, pos)
            if kind != 0 or not 0 <= length <= MAX_EVENT_BYTES:
                return offset + pos, count  # not events (a byte stream): no cut inside them
            nxt = offset + pos + EVENT_HEADER.size + length
            if nxt > end:
                return offset + pos, count
            weight = 1
            if tank:
                body = pos + EVENT_HEADER.size
                peek = min(length, BUNDLE_HEADER_PEEK)
                if body + peek > len(data) and pos > 0:
                    break  # read again from this event for its bundle header
                weight = _messages(memoryview(data)[body : body + peek])
            if count > 0 and (
                (max_events is not None and count + weight > max_events)
                or (max_bytes is not None and nxt - start > max_bytes)
            ):
                return offset + pos, count
            count += weight
            pos += EVENT_HEADER.size + length
        offset += pos  # the next header, maybe past this read (a long event)
    return min(offset, end), count
