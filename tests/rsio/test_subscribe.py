"""Subscriptions against a real ``headrace serve``: the worked example, demand, formats, ends."""

from __future__ import annotations

import asyncio
import datetime
import time

import pytest

from headrace.client import PravegaClient
from headrace.client.rsio import RsioClient, RsioError, decode_record
from headrace.protocols.pravega.routing import routing_key_position
from headrace.protocols.rsio import MAX_DEMAND, SPLIT_THRESHOLD_BYTES

from .conftest import WAIT_S, Server, new_stream, write_events


async def _exchange(port: int, data: bytes, want: int) -> bytes:
    """Send raw bytes, read until ``want`` bytes came back (or EOF)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        got = b""
        while len(got) < want:
            chunk = await asyncio.wait_for(reader.read(65536), WAIT_S)
            if not chunk:
                break
            got += chunk
        return got
    finally:
        writer.close()


async def test_part_c_exchange_byte_for_byte(server: Server, pravega: PravegaClient) -> None:
    # The worked example (rsio.md#worked-example) subscribes to "logs"; our publishers are
    # scope/stream, so the stream
    # is rsio/logsN and the subscribe frame differs only in the name's bytes.
    scope, stream = await new_stream(pravega)
    await write_events(pravega, scope, stream, [b"hello", b"world"])
    await pravega.controller.seal_stream(scope, stream)
    name = f"{scope}/{stream}".encode()
    subscribe = bytes([0x04, len(name)]) + name + bytes([0x01, 0x00])
    client_bytes = (
        bytes.fromhex("03010000")
        + bytes([len(subscribe)])
        + subscribe
        + bytes.fromhex("03050102")
        + bytes.fromhex("060304646f6e65")
    )
    expected = bytes.fromhex("03020000030701000808010568656c6c6f08080105776f726c64020c01020300")
    reader, writer = await asyncio.open_connection("127.0.0.1", server.rsio_port)
    try:
        writer.write(client_bytes[:-7])  # all but the goodbye
        got = b""
        while len(got) < len(expected) - 3:
            got += await asyncio.wait_for(reader.read(65536), WAIT_S)
        writer.write(client_bytes[-7:])
        while len(got) < len(expected):
            chunk = await asyncio.wait_for(reader.read(65536), WAIT_S)
            assert chunk
            got += chunk
        assert got == expected
    finally:
        writer.close()


async def test_counting_subscriber_gets_exactly_what_it_asked(
    server: Server, pravega: PravegaClient
) -> None:
    scope, stream = await new_stream(pravega)
    events = [b"e%d" % i for i in range(500)]
    await write_events(pravega, scope, stream, events)
    await pravega.controller.seal_stream(scope, stream)
    client = await RsioClient.connect("127.0.0.1", server.rsio_port)
    try:
        sub = client.subscribe(f"{scope}/{stream}", batch=0)
        got: list[bytes] = []
        requested = 0
        for ask in (1, 10, 1000):
            await sub.request(ask)
            requested += ask
            want = min(requested, len(events))
            while len(got) < want:
                got.append(await asyncio.wait_for(sub.next(), WAIT_S))
            # An element beyond demand would have aborted the subscription
            # (the connection checks every onNext against what was requested).
            if want < len(events):  # (once complete, the subscription holds no demand)
                assert sub.outstanding == requested - len(got)
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(sub.next(), WAIT_S)  # onComplete, not an abort
        assert got == events
        assert sub.received == len(events)
    finally:
        await client.goodbye()


async def test_record_format_and_until_cut(server: Server, pravega: PravegaClient) -> None:
    scope, stream = await new_stream(pravega)
    events = [b"r%d" % i for i in range(10)]
    await write_events(pravega, scope, stream, events)
    client = await RsioClient.connect("127.0.0.1", server.rsio_port)
    try:
        # Not sealed: without until this would follow the tail for ever.
        sub = client.subscribe(f"{scope}/{stream}?format=record", batch=4)
        records = [decode_record(await asyncio.wait_for(sub.next(), WAIT_S)) for _ in events]
        await sub.cancel()
        assert [r.value for r in records] == events
        assert {r.segment_id for r in records} == {0}
        offsets = [8 * i + sum(len(e) for e in events[:i]) for i in range(10)]
        assert [r.offset for r in records] == offsets
        assert all(r.key is None and r.index == 0 for r in records)
        assert all(r.timestamp_ms is not None for r in records)  # append time
        # from the 3rd record's position until the 7th's: records 2..6, then onComplete.
        cut_from, cut_until = f"0:{records[2].offset}", f"0:{records[7].offset}"
        sub = client.subscribe(f"{scope}/{stream}?from={cut_from}&until={cut_until}")
        got = [element async for element in sub]
        assert got == events[2:7]
    finally:
        await client.goodbye()


async def _next_ms() -> int:
    """The wall clock's next millisecond, once it came: what the server stamped
    before this call is earlier than the value returned."""
    now = time.time_ns() // 1_000_000
    deadline = time.monotonic() + WAIT_S
    while time.time_ns() // 1_000_000 <= now:
        assert time.monotonic() < deadline, "the wall clock stands still"
        await asyncio.sleep(0.0005)  # lets the clock tick; nothing else is waited for
    return time.time_ns() // 1_000_000


async def test_from_and_until_a_time_and_append_times(
    server: Server, pravega: PravegaClient
) -> None:
    """``from=time:`` / ``until=time:`` select by append time, exactly, on a
    stream of two segments; ``format=record`` elements carry that time."""
    scope, stream = await new_stream(pravega, segments=2)
    await write_events(pravega, scope, stream, [b"early-%d" % i for i in range(4)], key="a")
    await write_events(pravega, scope, stream, [b"early-b"], key="b")
    t1 = await _next_ms()
    middle = [b"mid-%d" % i for i in range(3)]
    await write_events(pravega, scope, stream, middle[:2], key="a")
    await write_events(pravega, scope, stream, middle[2:], key="b")
    t2 = await _next_ms()
    await write_events(pravega, scope, stream, [b"late-a"], key="a")
    await write_events(pravega, scope, stream, [b"late-b"], key="b")
    iso = (
        datetime.datetime.fromtimestamp(t2 / 1000, datetime.UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )  # a + in a query is a space
    client = await RsioClient.connect("127.0.0.1", server.rsio_port)
    try:
        sub = client.subscribe(f"{scope}/{stream}?from=time:{t1}&until=time:{iso}&format=record")
        records = [decode_record(element) async for element in sub]
        assert sorted(r.value for r in records) == middle
        assert all(t1 <= (r.timestamp_ms or 0) < t2 for r in records)
        sub = client.subscribe(f"{scope}/{stream}?from=time:{t2}&until=time:{t2 + 60_000}")
        assert sorted([element async for element in sub]) == [b"late-a", b"late-b"]
    finally:
        await client.goodbye()


@pytest.mark.parametrize(
    ("publisher", "reason"),
    [
        ("rsio/no-such-stream", "no such stream rsio/no-such-stream"),
        ("nostream", "expected scope/stream"),
        ("rsio/x?from=yesterday", "a stream cut is"),
        ("rsio/x?from=time:yesterday", "a time is time:<epoch ms>"),
        ("rsio/x?format=xml", "format='xml'"),
        ("rsio/x?colour=red", "unknown query parameter 'colour'"),
        ("rsio/x?from=earliest&from=latest", "given 2 times"),
    ],
)
async def test_unknown_stream_or_bad_query_is_subscribed_then_on_error(
    server: Server, publisher: str, reason: str
) -> None:
    client = await RsioClient.connect("127.0.0.1", server.rsio_port)
    try:
        sub = client.subscribe(publisher, sid=9)
        with pytest.raises(RsioError, match=reason):
            await asyncio.wait_for(sub.next(), WAIT_S)
    finally:
        await client.goodbye()


async def test_unknown_stream_bytes_are_subscribed_then_on_error(server: Server) -> None:
    name = b"rsio/none"
    subscribe = bytes([0x04, len(name)]) + name + bytes([0x05, 0x00])
    got = await _exchange(
        server.rsio_port, bytes.fromhex("03010000") + bytes([len(subscribe)]) + subscribe, 4 + 4 + 2
    )
    assert got[:8] == bytes.fromhex("0302000003070500")
    assert got[9:11] == bytes.fromhex("0d05")  # onError(5, ...)
    assert b"no such stream rsio/none" in got


async def test_large_events_arrive_split_and_whole(server: Server, pravega: PravegaClient) -> None:
    scope, stream = await new_stream(pravega)
    events = [bytes([i]) * (200_000 + i) for i in range(3)]
    await write_events(pravega, scope, stream, events)
    await pravega.controller.seal_stream(scope, stream)
    # Raw bytes: the server splits above 64 KiB (onNextPart ... onNextLastPart).
    name = f"{scope}/{stream}".encode()
    subscribe = bytes([0x04, len(name)]) + name + bytes([0x01, 0x01])
    raw = await _exchange(
        server.rsio_port, bytes.fromhex("03010000") + bytes([len(subscribe)]) + subscribe, 200_000
    )
    assert bytes.fromhex("0a0100") in raw[8:20]  # onNextPart(1, element 0, ...)
    client = await RsioClient.connect("127.0.0.1", server.rsio_port)
    try:
        got = [e async for e in client.subscribe(f"{scope}/{stream}", batch=1)]
        assert got == events
    finally:
        await client.goodbye()


async def test_runs_of_small_elements_and_split_ones_keep_their_order(
    server: Server, pravega: PravegaClient
) -> None:
    """Small elements go out in runs (one ``send_elements``), a split element
    between them ends a run: the subscriber must see the stream's order."""
    scope, stream = await new_stream(pravega)
    events: list[bytes] = []
    for i in range(4):
        events += [b"s%d-%d" % (i, j) for j in range(50 * i)]
        events.append(bytes([65 + i]) * (SPLIT_THRESHOLD_BYTES + 1000 * i + 1))
    await write_events(pravega, scope, stream, events)
    await pravega.controller.seal_stream(scope, stream)
    for batch in (MAX_DEMAND, 7):
        client = await RsioClient.connect("127.0.0.1", server.rsio_port)
        try:
            got = [e async for e in client.subscribe(f"{scope}/{stream}", batch=batch)]
            assert got == events
        finally:
            await client.goodbye()


async def test_unbounded_demand_reads_everything(server: Server, pravega: PravegaClient) -> None:
    scope, stream = await new_stream(pravega, segments=3)
    events = [b"u%d" % i for i in range(300)]
    writer = await pravega.create_writer(scope, stream)
    for i, event in enumerate(events):
        await writer.write(event, f"key{i % 7}")
    await writer.flush()
    await writer.aclose()
    await pravega.controller.seal_stream(scope, stream)
    client = await RsioClient.connect("127.0.0.1", server.rsio_port)
    try:
        sub = client.subscribe(f"{scope}/{stream}?format=record", batch=MAX_DEMAND)
        records = [decode_record(e) async for e in sub]
        assert sorted(r.value for r in records) == sorted(events)
        assert len({r.segment_id for r in records}) == 3
        # Per key, the order of writing holds.
        for k in range(7):
            mine = [r.value for r in records if int(r.value[1:]) % 7 == k]
            assert mine == [e for i, e in enumerate(events) if i % 7 == k]
    finally:
        await client.goodbye()


async def test_a_busy_segment_does_not_starve_another(
    server: Server, pravega: PravegaClient
) -> None:
    scope, stream = await new_stream(pravega, segments=2)
    low = next(k for k in (f"k{i}" for i in range(100)) if routing_key_position(k) < 0.5)
    high = next(k for k in (f"k{i}" for i in range(100)) if routing_key_position(k) >= 0.5)
    writer = await pravega.create_writer(scope, stream)
    for i in range(1000):
        await writer.write(b"busy%d" % i, low)
    for i in range(5):
        await writer.write(b"quiet%d" % i, high)
    await writer.flush()
    await writer.aclose()
    client = await RsioClient.connect("127.0.0.1", server.rsio_port)
    try:
        sub = client.subscribe(f"{scope}/{stream}", batch=20)
        first = [await asyncio.wait_for(sub.next(), WAIT_S) for _ in range(20)]
        # Segments are taken in turns: the quiet one's events come among the first.
        assert [e for e in first if e.startswith(b"quiet")] == [b"quiet%d" % i for i in range(5)]
        assert [e for e in first if e.startswith(b"busy")] == [b"busy%d" % i for i in range(15)]
    finally:
        await client.goodbye()
