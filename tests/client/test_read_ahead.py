"""Sequential segment reads are read ahead; tail, truncation and random reads behave as before.

Against a real ``headrace serve`` (``conftest.server``). A read-ahead is
observed through ``SegmentClient.read_aheads`` (what was sent and not yet
claimed) and through what the reads return.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable

import pytest

from headrace.client import PravegaClient, ScalingPolicy, StreamConfig
from headrace.client import segments as segments_module
from headrace.client.controller import Segment
from headrace.client.errors import SegmentIsTruncatedError
from headrace.client.segments import READ_SUGGESTED_BYTES
from headrace.protocols import pravega as p

from .conftest import Server

SCOPE = "readahead"
EVENT_BYTES = 10 * 1024
WAIT_S = 30.0
"""Bound on any wait in these tests (2 busy cores)."""


async def _stream_with(
    client: PravegaClient, stream: str, total_bytes: int
) -> tuple[Segment, bytes]:
    """A one-segment stream of 10 KiB events, about ``total_bytes``: its segment and bytes."""
    await client.controller.create_scope(SCOPE)
    await client.controller.create_stream(SCOPE, stream, StreamConfig(ScalingPolicy.fixed(1)))
    events = [os.urandom(EVENT_BYTES) for _ in range(total_bytes // (EVENT_BYTES + 8) + 1)]
    writer = await client.create_writer(SCOPE, stream)
    for event in events:
        await writer.write(event)
    await writer.flush()
    await writer.aclose()
    segment = (await client.controller.get_current_segments(SCOPE, stream))[0].segment
    return segment, b"".join(p.encode_event(e) for e in events)


async def _wait_until(check: Callable[[], bool], what: str) -> None:
    """Poll ``check()`` until true, at most ``WAIT_S``."""
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.02)


async def test_sequential_reads_are_read_ahead_until_the_tail(server: Server) -> None:
    async with PravegaClient(server.uri) as client:
        segment, stored = await _stream_with(client, "sequential", 7 * 1024 * 1024)
        segs = client.segments
        first = await segs.read(segment, 0)
        assert first.data == stored[: len(first.data)] and not first.at_tail
        assert segs.read_aheads == []  # one read is not yet sequential
        offset = len(first.data)
        parts = [first.data]
        while offset < len(stored):
            got = await segs.read(segment, offset)
            assert type(got.data) is bytes and got.offset == offset
            parts.append(got.data)
            offset += len(got.data)
            if got.at_tail:
                assert segs.read_aheads == []  # never parked at the tail
            else:
                assert segs.read_aheads == [(segment.name, offset)]
        assert b"".join(parts) == stored
        assert len(parts) >= 4  # the stream spans several 2 MiB reads

        # At the tail nothing is read ahead, so a read there sees data appended later.
        writer = await client.create_writer(SCOPE, "sequential")
        await writer.write(b"late")
        await writer.flush()
        await writer.aclose()
        got = await segs.read(segment, offset)
        assert got.data == p.encode_event(b"late")


async def test_random_reads_are_not_read_ahead(server: Server) -> None:
    async with PravegaClient(server.uri) as client:
        segment, stored = await _stream_with(client, "random", 5 * 1024 * 1024)
        segs = client.segments
        for offset in (0, 1_000_003, 3 * 1024 * 1024 + 5, 7):
            got = await segs.read(segment, offset)
            assert got.data == stored[offset : offset + READ_SUGGESTED_BYTES]
            assert segs.read_aheads == []


async def test_truncate_drops_the_read_ahead(server: Server) -> None:
    async with PravegaClient(server.uri) as client:
        segment, stored = await _stream_with(client, "truncated", 7 * 1024 * 1024)
        segs = client.segments
        first = await segs.read(segment, 0)
        second = await segs.read(segment, len(first.data))
        ahead_at = len(first.data) + len(second.data)
        assert segs.read_aheads == [(segment.name, ahead_at)]
        await segs.truncate(segment, ahead_at + 1)
        assert segs.read_aheads == []
        with pytest.raises(SegmentIsTruncatedError):
            await segs.read(segment, ahead_at)
        got = await segs.read(segment, ahead_at + 1)
        assert got.data == stored[ahead_at + 1 : ahead_at + 1 + len(got.data)]


async def test_read_aheads_are_bounded_and_expire(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(segments_module, "MAX_READ_AHEADS", 2)
    async with PravegaClient(server.uri) as client:
        streams = [await _stream_with(client, f"bounded{i}", 5 * 1024 * 1024) for i in range(3)]
        segs = client.segments
        for segment, stored in streams:
            first = await segs.read(segment, 0)
            second = await segs.read(segment, len(first.data))
            assert first.data + second.data == stored[: len(first.data) + len(second.data)]
        # The first two segments got one each; the third none, and none was pushed out.
        assert sorted(name for name, _ in segs.read_aheads) == sorted(
            s.name for s, _ in streams[:2]
        )
        # The third reads on correctly without one.
        segment, stored = streams[2]
        offset = 2 * READ_SUGGESTED_BYTES
        got = await segs.read(segment, offset)
        assert got.data == stored[offset : offset + len(got.data)]

    monkeypatch.setattr(segments_module, "READ_AHEAD_MAX_AGE_S", 0.2)
    async with PravegaClient(server.uri) as client:
        segment, stored = streams[0]
        segs = client.segments
        first = await segs.read(segment, 0)
        await segs.read(segment, len(first.data))
        assert len(segs.read_aheads) == 1
        await _wait_until(lambda: not segs.read_aheads, "an unclaimed read-ahead expires")
        offset = 2 * READ_SUGGESTED_BYTES  # read again, not from the dropped read-ahead
        got = await segs.read(segment, offset)
        assert got.data == stored[offset : offset + len(got.data)]


async def test_record_reader_values_are_bytes_across_reads(server: Server) -> None:
    """Events cut out of reply views (and across two replies) come out as ``bytes``."""
    async with PravegaClient(server.uri) as client:
        _, stored = await _stream_with(client, "records", 5 * 1024 * 1024)
        async with client.record_reader(SCOPE, "records") as reader:
            records = [r async for r in reader]
        assert all(type(r.value) is bytes for r in records)
        assert b"".join(p.encode_event(r.value) for r in records) == stored
        offsets = [r.offset for r in records]
        assert offsets == sorted(offsets) and offsets[0] == 0
