"""A TANK topic is a stream like any other: the record reader (Pravega wire
protocol) sees what TANK producers wrote, message by message, with keys and
timestamps."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from headrace.client import PravegaClient, ScalingPolicy, StreamConfig
from headrace.client.errors import ReplyError
from headrace.client.tank import TankClient
from headrace.protocols.tank import SEQ_NUM_TAIL, BundleMessage, CreateTopicResult, encode_bundle
from tests.tank.conftest import running_server


async def test_tank_topic_is_readable_as_records(tmp_path: Path) -> None:
    with running_server(tmp_path / "data", pravega=True) as server:
        async with await TankClient.connect("127.0.0.1", server.port) as tank:
            assert await tank.create_topic("shared_topic", 2) is CreateTopicResult.CREATED
            await tank.produce(
                "shared_topic",
                1,
                [BundleMessage(b"v1", 1_700_000_000_000, b"k1"), BundleMessage(b"v2", 5)],
                compress=True,
            )
            await tank.produce("shared_topic", 1, [BundleMessage(b"v3", 6, b"k3")])
        uri = f"tcp://127.0.0.1:{server.controller_port}"
        # "_" in a topic name is "." in its stream name
        async with (
            PravegaClient(uri) as client,
            client.record_reader("tank", "shared.topic") as reader,
        ):
            records = [r async for r in reader]
    assert [(r.key, r.value, r.timestamp_ms) for r in records] == [
        (b"k1", b"v1", 1_700_000_000_000),
        (None, b"v2", 5),
        (b"k3", b"v3", 6),
    ]
    assert {r.segment for r in records} == {"tank/shared.topic/1.#epoch.0"}


async def test_bundles_written_through_pravega_join_the_numbering(tmp_path: Path) -> None:
    with running_server(tmp_path / "data", pravega=True) as server:
        async with await TankClient.connect("127.0.0.1", server.port) as tank:
            assert await tank.create_topic("mixed", 1) is CreateTopicResult.CREATED
            await tank.produce("mixed", 0, [BundleMessage(b"t1", 1), BundleMessage(b"t2", 1)])
            uri = f"tcp://127.0.0.1:{server.controller_port}"
            async with PravegaClient(uri) as client:
                writer = await client.create_writer("tank", "mixed")
                async with writer:
                    await writer.write(encode_bundle([BundleMessage(b"p3", 2, b"pk")]))
                    await writer.flush()
                    # Only bundles go into a topic's stream, whatever the front door.
                    with pytest.raises(ReplyError, match="not a TANK bundle"):
                        await writer.write(b"not a bundle")
                        await writer.flush()
            # The broker's next append finds the segment longer than it knew:
            # it re-reads the partition and numbers after the foreign bundle.
            await tank.produce("mixed", 0, [BundleMessage(b"t4", 3)])
            result = await tank.consume("mixed", 0, 0)
    assert [(m.seq_num, m.content, m.key) for m in result.messages] == [
        (1, b"t1", b""),
        (2, b"t2", b""),
        (3, b"p3", b"pk"),
        (4, b"t4", b""),
    ]


async def test_tank_scope_option_moves_the_topics(tmp_path: Path) -> None:
    args = ("--tank-scope", "elsewhere")
    with running_server(tmp_path / "data", pravega=True, extra_args=args) as server:
        async with await TankClient.connect("127.0.0.1", server.port) as tank:
            assert await tank.create_topic("moved", 1) is CreateTopicResult.CREATED
            await tank.produce("moved", 0, [BundleMessage(b"here", 1)])
        uri = f"tcp://127.0.0.1:{server.controller_port}"
        async with PravegaClient(uri) as client:
            assert [s async for s in client.controller.list_streams("elsewhere")] == ["moved"]
            async with client.record_reader("elsewhere", "moved", tank_scope="elsewhere") as r:
                assert [rec.value async for rec in r] == [b"here"]


async def test_long_poll_is_woken_by_bundles_appended_through_pravega(tmp_path: Path) -> None:
    """A consume parked at the tail wakes when a Pravega writer appends a bundle to the
    topic's stream (the store's append notification, not a TANK produce), and numbers
    the foreign bundle after the last one."""
    long_wait_ms = 30_000
    with running_server(tmp_path / "data", pravega=True) as server:
        async with await TankClient.connect("127.0.0.1", server.port) as tank:
            assert await tank.create_topic("woken", 1) is CreateTopicResult.CREATED
            await tank.produce("woken", 0, [BundleMessage(b"t1", 1)])
            began = time.monotonic()
            waiting = asyncio.ensure_future(
                tank.start_consume("woken", 0, SEQ_NUM_TAIL, max_wait_ms=long_wait_ms)
            )
            uri = f"tcp://127.0.0.1:{server.controller_port}"
            async with PravegaClient(uri) as client:
                writer = await client.create_writer("tank", "woken")
                async with writer:
                    await writer.write(encode_bundle([BundleMessage(b"p2", 2, b"pk")]))
            result = await asyncio.wait_for(waiting, long_wait_ms / 1000)
            woken_s = time.monotonic() - began
    assert woken_s < 10.0  # the append, not the 30 s timer, ended the poll
    assert [(m.seq_num, m.content, m.key) for m in result.messages] == [(2, b"p2", b"pk")]
    assert result.high_water_mark == 2


async def test_any_stream_is_a_topic_whose_partitions_follow_scaling(tmp_path: Path) -> None:
    """Topic ``SCOPE.STREAM`` is the Pravega stream: partition n is segment number n, a
    scaling's successors become new partitions; a parked consume wakes on an event
    written by a Pravega writer (docs/interop.md#tank)."""
    with running_server(tmp_path / "data", pravega=True) as server:
        uri = f"tcp://127.0.0.1:{server.controller_port}"
        async with PravegaClient(uri) as client:
            await client.controller.create_scope("sc")
            await client.controller.create_stream("sc", "a.b", StreamConfig(ScalingPolicy.fixed(1)))
            async with await client.create_writer("sc", "a.b") as writer:
                before_ms = int(time.time() * 1000)
                for n in range(2):
                    await writer.write(b"k:%d" % n, routing_key="k")
                own = b'{"@timestamp":"2026-01-02T03:04:05.678Z"}'  # an event's own time
                await writer.write(own, routing_key="k")
                await writer.flush()
                after_ms = int(time.time() * 1000)
                (old,) = await client.controller.get_current_segments("sc", "a.b")
                await client.controller.scale_stream(
                    "sc", "a.b", [old.segment.segment_id], [(0.0, 0.5), (0.5, 1.0)]
                )
                async with await TankClient.connect("127.0.0.1", server.port) as tank:
                    assert (await tank.consume("sc.nope", 0, 0)).unknown_topic
                    parts = await tank.discover_partitions("sc.a.b")  # split at the first dot
                    assert parts is not None and len(parts) == 3
                    first = await tank.consume("sc.a.b", 0, 0)
                    assert [(m.seq_num, m.content, m.key) for m in first.messages] == [
                        (1, b"k:0", b""),
                        (2, b"k:1", b""),
                        (3, own, b""),
                    ]
                    # the time it was appended, or the event's own
                    stamps = [m.timestamp_ms for m in first.messages]
                    assert all(before_ms <= ms <= after_ms for ms in stamps[:2]), stamps
                    assert stamps[2] == 1767323045678
                    parked = [
                        asyncio.ensure_future(
                            tank.start_consume("sc.a.b", pid, SEQ_NUM_TAIL, max_wait_ms=30_000)
                        )
                        for pid in (1, 2)
                    ]
                    began = time.monotonic()
                    later = [b"%d:3" % key for key in range(8)]  # keys of both halves
                    for event in later:
                        await writer.write(event, routing_key=event[:1].decode())
                    await writer.flush()
                    woken = await asyncio.wait_for(asyncio.gather(*parked), 30)
                    woken_s = time.monotonic() - began
    assert woken_s < 10.0  # the appends, not the 30 s timer, ended both polls
    assert all(result.messages for result in woken)
    assert {m.content for r in woken for m in r.messages} <= set(later)
