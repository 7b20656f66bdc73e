"""EventWriter and RecordReader against a real ``headrace serve``, and interop with
the real ``pravega`` client both ways."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections import defaultdict
from pathlib import Path

import pytest

from headrace.client import PravegaClient, ScalingPolicy, StreamConfig, StreamSealedError
from headrace.client.records import Record, RecordReader
from tests._real_pravega import run_scenario

from .conftest import Server

KEYS = [f"k{i}" for i in range(10)]


def _payload(key: str, seq: int) -> bytes:
    return f"{key}:{seq}".encode()


async def _make_stream(client: PravegaClient, scope: str, stream: str, segments: int) -> None:
    await client.controller.create_scope(scope)
    assert await client.controller.create_stream(
        scope, stream, StreamConfig(ScalingPolicy.fixed(segments))
    )


async def _read_all(client: PravegaClient, scope: str, stream: str) -> list[Record]:
    async with RecordReader(client, scope, stream) as reader:
        return [r async for r in reader]


def _check_per_key_order(values: list[bytes], count_per_key: int) -> None:
    """Every ``key:seq`` exactly once, and in order of seq for each key."""
    by_key: dict[str, list[int]] = defaultdict(list)
    for v in values:
        key, seq = v.decode().split(":")
        by_key[key].append(int(seq))
    for key, seqs in by_key.items():
        assert seqs == list(range(count_per_key)), key


async def test_write_then_read_records_in_order_per_key(server: Server) -> None:
    async with PravegaClient(server.uri) as client:
        await _make_stream(client, "w1", "st", 3)
        async with await client.create_writer("w1", "st") as writer:
            futures = []
            for seq in range(2000):
                for key in KEYS:
                    await writer.write(_payload(key, seq), routing_key=key)
            futures.append(await writer.write_future(b"last", routing_key="z"))
            await writer.flush()
            assert all(f.done() and f.exception() is None for f in futures)
            assert writer.stats["events_acked"] == 20_001
            assert writer.stats["blocks_sent"] < 20_001 // 10  # many events per block
        records = await _read_all(client, "w1", "st")
    assert len(records) == 20_001
    assert all(r.stream == "w1/st" and r.key is None and r.append_time for r in records)
    _check_per_key_order([r.value for r in records if r.value != b"last"], 2000)
    # Offsets of one segment increase by the framed size.
    segs: dict[str, list[Record]] = defaultdict(list)
    for r in records:
        segs[r.segment].append(r)
    assert len(segs) == 3
    for seg_records in segs.values():  # append times, from the store's time index
        stamps = [r.timestamp_ms or 0 for r in seg_records]
        assert stamps == sorted(stamps) and stamps[0] > 0
    for rs in segs.values():
        for a, b in itertools.pairwise(rs):
            assert b.offset == a.offset + 8 + len(a.value)


async def test_write_to_sealed_stream_fails(server: Server) -> None:
    async with PravegaClient(server.uri) as client:
        await _make_stream(client, "w2", "st", 1)
        writer = await client.create_writer("w2", "st")
        await writer.write_and_wait(b"before")
        await client.controller.seal_stream("w2", "st")
        fut = await writer.write_future(b"after")
        with pytest.raises(StreamSealedError):
            await fut
        with pytest.raises(StreamSealedError):
            await writer.write(b"more")
        await writer.aclose()  # the fatal error was raised by write(); closing is quiet
        assert [r.value for r in await _read_all(client, "w2", "st")] == [b"before"]


async def test_our_events_read_by_real_reader_group(server: Server) -> None:
    count_per_key = 300
    async with PravegaClient(server.uri) as client:
        await _make_stream(client, "i1", "st", 2)
        async with await client.create_writer("i1", "st") as writer:
            for seq in range(count_per_key):
                for key in KEYS:
                    await writer.write(_payload(key, seq), routing_key=key)
    total = count_per_key * len(KEYS)
    r = run_scenario("read_group", server.uri, "i1", "st", "rg1", str(total))
    assert len(r["events"]) == total
    _check_per_key_order([e.encode("latin-1") for e in r["events"]], count_per_key)


async def test_real_writer_events_read_by_record_reader(server: Server) -> None:
    keys = [f"key-{i % 7}" for i in range(700)]

    run_scenario("write_keyed", server.uri, "i2", "st", "3", json.dumps(keys))
    async with PravegaClient(server.uri) as client:
        records = await _read_all(client, "i2", "st")
    assert sorted(r.value.decode() for r in records) == sorted(keys)


async def test_exactly_once_across_server_kill(tmp_path: Path) -> None:
    """SIGKILL and restart the server while 200,000 events are being written."""
    total, kill_after = 200_000, 60_000
    srv = Server(tmp_path / "data", fsync="always")
    try:
        async with PravegaClient(srv.uri) as client:
            await _make_stream(client, "x1", "st", 2)
            writer = await client.create_writer("x1", "st")
            restart: asyncio.Future[None] | None = None
            for i in range(total):
                key = KEYS[i % len(KEYS)]
                await writer.write(_payload(key, i // len(KEYS)), routing_key=key)
                if i % 1000 == 999:
                    await asyncio.sleep(0)  # yield: the segment writers send as a producer runs
                if i == kill_after:
                    assert writer.stats["blocks_sent"] > 0
                    srv.kill()  # blocks here: blocks are in flight, acks may be lost
                    restart = asyncio.ensure_future(asyncio.to_thread(srv.start))
            await writer.flush()
            assert restart is not None
            await restart
            stats = writer.stats
            await writer.aclose()
            records = await _read_all(client, "x1", "st")
        assert stats["reconnects"] >= 1
        assert len(records) == total
        _check_per_key_order([r.value for r in records], total // len(KEYS))
    finally:
        srv.stop()


async def test_following_reader_survives_server_restart(tmp_path: Path) -> None:
    srv = Server(tmp_path / "data")
    try:
        async with PravegaClient(srv.uri) as client:
            await _make_stream(client, "x2", "st", 1)
            async with await client.create_writer("x2", "st") as writer:
                for i in range(10):
                    await writer.write(f"a{i}".encode())
            got: list[bytes] = []
            first_ten = asyncio.Event()

            async def follow() -> None:
                async with client.record_reader("x2", "st", follow=True) as reader:
                    async for record in reader:
                        got.append(record.value)
                        if len(got) == 10:
                            first_ten.set()
                        if len(got) == 20:
                            return

            task = asyncio.create_task(follow())
            async with asyncio.timeout(30):
                await first_ten.wait()  # the reader now waits at the tail
                await asyncio.to_thread(srv.kill)
                await asyncio.to_thread(srv.start)
                async with await client.create_writer("x2", "st") as writer:
                    for i in range(10):
                        await writer.write(f"b{i}".encode())
                await task
        assert got == [f"a{i}".encode() for i in range(10)] + [f"b{i}".encode() for i in range(10)]
    finally:
        srv.stop()


async def test_our_large_event_read_by_real_reader_group(server: Server) -> None:
    big = b"z" * (12 * 1024 * 1024)  # over the inline limit: a transient segment, merged
    async with PravegaClient(server.uri) as client:
        await _make_stream(client, "i3", "st", 1)
        async with await client.create_writer("i3", "st") as writer:
            await writer.write(b"a")
            await writer.write(big)
            await writer.write(b"b")
    r = run_scenario("read_group", server.uri, "i3", "st", "rg", "3")
    assert [len(e) for e in r["events"]] == [1, len(big), 1]
    assert r["events"][0] == "a" and r["events"][2] == "b"


async def test_our_mixed_size_events_read_byte_for_byte_by_real_reader_group(
    server: Server,
) -> None:
    # Small events are copied into a block's buffer, larger ones sent from the
    # caller's bytes (COPY_EVENT_BYTES); blocks end at MAX_BLOCK_BYTES, and an
    # event over it is a block of its own. The real reader must see every byte.
    sizes = [10, 3000, 10 * 1024, 1 << 20, 100, 30 * 1024, (1 << 20) - 8, (1 << 20) + 5, 1]
    sizes += [10 * 1024] * 120  # ~1.2 MiB of 10 KiB events: two blocks
    pattern = bytes(range(256)) * ((max(sizes) >> 8) + 2)
    events = [pattern[i % 256 : i % 256 + size] for i, size in enumerate(sizes)]
    async with PravegaClient(server.uri) as client:
        await _make_stream(client, "i4", "st", 1)
        async with await client.create_writer("i4", "st") as writer:
            for event in events:
                await writer.write(event)
            await writer.write(bytearray(b"reused"))  # a mutable event works too
    r = run_scenario("read_group", server.uri, "i4", "st", "rg", str(len(events) + 1))
    got = [e.encode("latin-1") for e in r["events"]]
    assert [len(e) for e in got] == [*sizes, 6]
    assert got == [*events, b"reused"]
