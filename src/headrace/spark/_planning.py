"""Planning: the segment ranges a batch or micro-batch reads (one per Spark partition)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from headrace.client import PravegaClient, Segment
from headrace.client.errors import NoSuchSegmentError

from ._connect import Target, run, split_name
from ._positions import (
    Position,
    all_segments,
    lost,
    resolve,
    scan,
    starting_position,
    successors,
    walk,
)

if TYPE_CHECKING:
    from .options import ReadOptions

__all__ = ["Range", "batch_plan", "plan_ranges"]


@dataclass(frozen=True, slots=True)
class Range:
    """Events of one segment whose offsets lie in ``[start, end)``."""

    scope: str
    stream: str
    segment_id: int
    start: int
    end: int

    @property
    def segment(self) -> Segment:
        return Segment(self.scope, self.stream, self.segment_id)


def plan_ranges(
    uri: Target,
    start: Position,
    end: Position,
    min_partitions: int,
    opts: ReadOptions | None = None,
) -> list[Range]:
    """The ranges between two positions, split so each holds at most
    ``opts.max_records_per_partition`` records and there are at least
    ``min_partitions`` (splits fall on event boundaries)."""
    ranges: list[Range] = []
    for name, segs in end.items():
        scope, stream = split_name(name)
        begin = start.get(name, {})
        for seg_id, stop in sorted(segs.items(), key=lambda kv: int(kv[0])):
            lo = begin.get(seg_id, 0)
            if stop > lo:
                ranges.append(Range(scope, stream, int(seg_id), lo, stop))
    if opts is not None and opts.max_records_per_partition is not None:
        ranges = _split_records(uri, ranges, opts.max_records_per_partition, opts)
    if 0 < len(ranges) < min_partitions:
        ranges = _split_all(uri, ranges, min_partitions)
    return ranges


def _split_records(uri: Target, ranges: list[Range], most: int, opts: ReadOptions) -> list[Range]:
    """``ranges`` cut so each holds at most ``most`` records (TANK messages;
    a bundle is never cut, so one larger than ``most`` is a range of its own).
    Reads the event headers of every range once, on the driver."""

    async def work(client: PravegaClient) -> list[Range]:
        out: list[Range] = []
        for r in ranges:
            tank = opts.is_tank(f"{r.scope}/{r.stream}")
            lo = r.start
            while lo < r.end:
                hi, _ = await scan(client, r.segment, lo, r.end, most, None, tank=tank)
                if hi <= lo:  # nothing readable below the end: leave the rest whole
                    hi = r.end
                out.append(Range(r.scope, r.stream, r.segment_id, lo, hi))
                lo = hi
        return out

    return run(uri, work)


def batch_plan(opts: ReadOptions) -> list[Range]:
    """Every range a batch read covers: each segment from its start to its end
    (the ``startingOffsets``/``endingOffsets`` options, successors followed)."""

    async def work(client: PravegaClient) -> list[Range]:
        out: list[Range] = []
        for name in opts.streams:
            scope, stream = split_name(name)
            for seg, _ in await all_segments(client, scope, stream):
                try:
                    stat = await client.segments.stat(seg)
                except NoSuchSegmentError:
                    continue
                out.append(Range(scope, stream, seg.segment_id, stat.start_offset, stat.length))
        return out

    ranges = run(opts.connection, work)
    if opts.starting_times:
        ranges = _from_time(opts, ranges)
    if opts.starting != "earliest" or opts.starting_times:
        lo = starting_position(opts, "earliest")
        for r in ranges:
            off = lo.get(f"{r.scope}/{r.stream}", {}).get(str(r.segment_id))
            if off is not None and off < r.start:
                what = f"{r.segment.name} was truncated to offset {r.start}; asked for {off}"
                lost(opts, what)
        ranges = [_clip(r, lo, lower=True) for r in ranges]
    if opts.ending != "latest":
        hi = resolve(opts.connection, opts.ending, opts.streams, "latest")
        ranges = [_clip(r, hi, lower=False) for r in ranges]
    if opts.ending_times:
        ranges = _until_time(opts, ranges)
    ranges = [r for r in ranges if r.end > r.start]
    if opts.max_records_per_partition is not None:
        ranges = _split_records(opts.connection, ranges, opts.max_records_per_partition, opts)
    if 0 < len(ranges) < opts.min_partitions:
        ranges = _split_all(opts.connection, ranges, opts.min_partitions)
    return ranges


def _from_time(opts: ReadOptions, ranges: list[Range]) -> list[Range]:
    """Drop the ranges of segments a time start skips: those sealed before the
    time (not in the epoch open then, nor after it)."""
    pos = starting_position(opts, "earliest")

    async def work(client: PravegaClient) -> set[tuple[str, int]]:
        keep: set[tuple[str, int]] = set()
        for name in opts.starting_times:
            scope, stream = split_name(name)
            todo = [Segment(scope, stream, int(k)) for k in pos[name]]
            while todo:
                seg = todo.pop()
                if (name, seg.segment_id) not in keep:
                    keep.add((name, seg.segment_id))
                    todo.extend(await successors(client, seg))
        return keep

    keep = run(opts.connection, work)
    return [
        r
        for r in ranges
        if f"{r.scope}/{r.stream}" not in opts.starting_times
        or (f"{r.scope}/{r.stream}", r.segment_id) in keep
    ]


def _until_time(opts: ReadOptions, ranges: list[Range]) -> list[Range]:
    """End each stream of ``ending_times`` before the events appended at or after
    its time: the segments open then end where the controller says those
    events begin (the store's time index), and their successors are not read."""

    async def work(client: PravegaClient) -> tuple[Position, set[tuple[str, int]]]:
        cut: Position = {}
        later: set[tuple[str, int]] = set()
        for name, ms in opts.ending_times.items():
            scope, stream = split_name(name)
            at = await client.controller.get_segments_at(scope, stream, ms)
            cut[name] = {str(seg.segment_id): off for seg, off in at.items()}
            todo = list(at)
            while todo:
                for nxt in await successors(client, todo.pop()):
                    if (name, nxt.segment_id) not in later:
                        later.add((name, nxt.segment_id))
                        todo.append(nxt)
        return cut, later

    cut, later = run(opts.connection, work)
    return [
        _clip(r, cut, lower=False)
        for r in ranges
        if (f"{r.scope}/{r.stream}", r.segment_id) not in later
    ]


def _clip(r: Range, pos: Position, *, lower: bool) -> Range:
    off = pos.get(f"{r.scope}/{r.stream}", {}).get(str(r.segment_id))
    if off is None:
        return r
    if lower:
        return Range(r.scope, r.stream, r.segment_id, max(r.start, off), r.end)
    return Range(r.scope, r.stream, r.segment_id, r.start, min(r.end, off))


def _split_all(uri: Target, ranges: list[Range], min_partitions: int) -> list[Range]:
    total = sum(r.end - r.start for r in ranges)

    async def work(client: PravegaClient) -> list[Range]:
        out: list[Range] = []
        for r in ranges:
            parts = max(1, round(min_partitions * (r.end - r.start) / total))
            out.extend(await _split(client, r, parts))
        return out

    return run(uri, work)


async def _split(client: PravegaClient, r: Range, parts: int) -> list[Range]:
    if parts <= 1:
        return [r]
    step = (r.end - r.start) // parts
    cuts = [r.start]
    offset = r.start
    for _ in range(parts - 1):
        # The first event boundary at or after offset + step.
        offset = await walk(client, r.segment, offset, r.end, None, max(1, step))
        if offset >= r.end or offset <= cuts[-1]:
            break
        cuts.append(offset)
    cuts.append(r.end)
    return [
        Range(r.scope, r.stream, r.segment_id, a, b) for a, b in itertools.pairwise(cuts) if b > a
    ]
