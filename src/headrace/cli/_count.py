"""Counting the events of a segment range: Pravega events carry no index, so the
only way to know how many lie between two offsets is to walk their headers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from headrace.client import Segment
from headrace.client.errors import NoSuchSegmentError, SegmentIsTruncatedError
from headrace.protocols.records import EventBuffer

if TYPE_CHECKING:
    from headrace.client import PravegaClient

__all__ = ["COUNT_MAX_BYTES", "MAX_LISTED_SEGMENTS", "all_segments", "count_events"]

COUNT_MAX_BYTES: Final = 64 * 1024 * 1024
"""Most bytes one listing reads to count events (``stream list``, ``group
describe``): past it the count is left out (shown as ``-``, JSON null) rather
than a listing reading a large stream in full."""

MAX_LISTED_SEGMENTS: Final = 10_000
"""Segments of one stream ``stream list`` walks (head to tail through successors)
before it stops adding up: a stream scaled that often is listed in part."""


async def count_events(client: PravegaClient, segment: Segment, start: int, end: int) -> int:
    """Events whose headers lie in ``[start, end)`` of ``segment`` (``start`` at an
    event boundary); the bytes read are ``end - start``, bounded by the caller."""
    buf = EventBuffer(start)
    count = 0
    offset = start
    while offset < end:
        try:
            got = await client.segments.read(segment, offset)
        except (SegmentIsTruncatedError, NoSuchSegmentError):
            break
        if not got.data:
            break
        data = got.data[: end - offset]
        offset += len(data)
        count += sum(1 for _ in buf.feed(data))
        if got.end_of_segment:
            break
    return count


async def all_segments(client: PravegaClient, scope: str, st: str) -> list[Segment]:
    """Every readable segment of the stream: the head ones and their successors."""
    todo = list(await client.controller.get_head_segments(scope, st))
    seen: dict[int, Segment] = {}
    while todo:
        segment = todo.pop()
        if segment.segment_id in seen or len(seen) >= MAX_LISTED_SEGMENTS:
            continue
        seen[segment.segment_id] = segment
        todo.extend(r.segment for r in await client.controller.get_successors(segment))
    return sorted(seen.values(), key=lambda s: s.segment_id)
