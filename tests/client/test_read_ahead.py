"""Sequential segment reads are read ahead; tail, truncation and random reads behave as
without read-ahead.

Against a real ``headrace serve`` (``conftest.server``). A read-ahead is
observed through ``SegmentClient.read_aheads`` (what was sent and not yet
claimed) and through what the reads return.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import struct
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


HOLD_S = 5.0
"""Longest the relay holds back the rest of a reply waiting for the client's next
read (the client sends it within milliseconds of the reply's fields)."""


class _HoldingRelay:
    """A TCP relay between a client and the real segment store that forwards each
    large ``SegmentRead`` (from the ``hold_from``-th on, unless at the tail) only
    up to half its data, and the rest once the client has sent its next
    ``ReadSegment``: a client that reads ahead only after a reply is whole waits
    for the rest, and the relay gives up after ``HOLD_S`` (counted in ``late``)."""

    def __init__(self, store: tuple[str, int], hold_from: int) -> None:
        self.store = store
        self.hold_from = hold_from
        self.reads = 0  # ReadSegments the client sent
        self.held = 0  # replies held until the next read came
        self.late = 0  # replies released because the next read did not come
        self._read_sent = asyncio.Condition()
        self._tasks: list[asyncio.Task[None]] = []
        self._writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None

    async def start(self) -> tuple[str, int]:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return "127.0.0.1", self.server.sockets[0].getsockname()[1]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.store)
        self._writers += [writer, up_writer]
        self._tasks.append(asyncio.create_task(self._requests(reader, up_writer)))
        self._tasks.append(asyncio.create_task(self._replies(up_reader, writer)))

    async def _requests(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                header = await reader.readexactly(8)
                kind, length = struct.unpack(">ii", header)
                writer.write(header + await reader.readexactly(length))
                if kind == p.CommandType.READ_SEGMENT:
                    async with self._read_sent:
                        self.reads += 1
                        self._read_sent.notify_all()

    async def _replies(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        replies = 0
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                header = await reader.readexactly(8)
                kind, length = struct.unpack(">ii", header)
                payload = await reader.readexactly(length)
                if kind != p.CommandType.SEGMENT_READ or length < 1024 * 1024:
                    writer.write(header + payload)
                    continue
                replies += 1
                name_end = 2 + struct.unpack_from(">H", payload)[0]
                at_tail = payload[name_end + 8] != 0
                if replies < self.hold_from or at_tail:
                    writer.write(header + payload)
                    continue
                writer.write(header + payload[: length // 2])
                await writer.drain()
                async with self._read_sent:
                    try:
                        async with asyncio.timeout(HOLD_S):
                            await self._read_sent.wait_for(lambda n=replies: self.reads > n)
                        self.held += 1
                    except TimeoutError:
                        self.late += 1
                writer.write(payload[length // 2 :])

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        for writer in self._writers:
            writer.close()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


async def test_the_read_ahead_goes_out_when_the_reply_header_arrives(server: Server) -> None:
    """The next ReadSegment leaves while the reply before it is still arriving
    (its fields, before its data, say where it ends), so the server works on
    it while the client receives and hands out this one."""
    async with PravegaClient(server.uri) as client:
        segment, stored = await _stream_with(client, "early", 15 * 1024 * 1024)
        store = await client.controller.get_uri(segment)
        # The first read is not sequential: nothing is read ahead after it.
        relay = _HoldingRelay(store, hold_from=2)
        client.segments._endpoints[segment] = await relay.start()
        try:
            offset = 0
            parts = []
            async with asyncio.timeout(WAIT_S * 2):
                while offset < len(stored):
                    got = await client.segments.read(segment, offset)
                    parts.append(got.data)
                    offset += len(got.data)
        finally:
            await relay.aclose()
        assert b"".join(parts) == stored
        assert relay.late == 0, f"{relay.late} replies waited for the next read"
        assert relay.held >= 4  # every full reply after the first one


async def test_a_kept_view_keeps_its_bytes_while_frame_buffers_are_reused(server: Server) -> None:
    """``read_view`` data is a view of the reply's frame buffer; buffers are reused
    for later replies only once no view (nor a slice of one) of them is alive."""
    async with PravegaClient(server.uri) as client:
        segment, stored = await _stream_with(client, "pooled", 21 * 1024 * 1024)
        segs = client.segments
        first = await segs.read_view(segment, 0)
        second = await segs.read_view(segment, len(first.data))
        assert isinstance(first.data, memoryview) and isinstance(second.data, memoryview)
        kept = first.data
        kept_slice = second.data[1000:3000]
        slice_at = len(first.data) + 1000
        held = {id(kept.obj), id(kept_slice.obj)}
        offset = len(first.data) + len(second.data)
        del first, second
        conn = await segs.connection(segment)
        _, reused_before = conn.frame_buffers
        reused_held = 0
        while offset < len(stored):
            got = await segs.read_view(segment, offset)
            assert got.data == stored[offset : offset + len(got.data)]
            if isinstance(got.data, memoryview) and id(got.data.obj) in held:
                reused_held += 1
            offset += len(got.data)
            del got
        assert reused_held == 0  # a held buffer (ids stay unique while held) never came back
        assert kept == stored[: len(kept)]
        assert kept_slice == stored[slice_at : slice_at + 2000]
        _, reused = conn.frame_buffers
        assert reused - reused_before >= 3  # most later replies went into earlier buffers
