"""Scaling: writers move to the new segments, readers follow successors in order."""

from __future__ import annotations

import time
from collections import defaultdict

from headrace.client import PravegaClient, ScalingPolicy, StreamConfig

from .conftest import Server

KEYS = [f"k{i}" for i in range(8)]


def _check_per_key_order(values: list[bytes], count_per_key: int) -> None:
    by_key: dict[str, list[int]] = defaultdict(list)
    for v in values:
        key, seq = v.decode().split(":")
        by_key[key].append(int(seq))
    assert set(by_key) == set(KEYS)
    for key, seqs in by_key.items():
        assert seqs == list(range(count_per_key)), key


async def test_writer_and_readers_across_a_scale(server: Server) -> None:
    per_key = 2000
    async with PravegaClient(server.uri) as client:
        await client.controller.create_scope("sc1")
        await client.controller.create_stream("sc1", "st", StreamConfig(ScalingPolicy.fixed(1)))
        writer = await client.create_writer("sc1", "st")
        scaled = None
        for seq in range(per_key):
            for key in KEYS:
                await writer.write(f"{key}:{seq}".encode(), routing_key=key)
            if seq == per_key // 2:
                await (await writer.write_future(b"marker", routing_key="m"))  # seg 0 has data
                (old,) = await client.controller.get_current_segments("sc1", "st")
                scaled = await client.controller.scale_stream(
                    "sc1", "st", [old.segment.segment_id], [(0.0, 0.5), (0.5, 1.0)]
                )
        await writer.flush()
        stats = writer.stats
        await writer.aclose()
        assert scaled is not None and len(scaled) == 2
        assert stats["sealed_segments"] == 1
        current = await client.controller.get_current_segments("sc1", "st")
        assert [r.segment for r in current] == [r.segment for r in scaled]

        async with client.record_reader("sc1", "st") as reader:
            records = [r async for r in reader]
        assert {r.segment for r in records} == {"sc1/st/0.#epoch.0"} | {
            r.segment.name for r in scaled
        }
        _check_per_key_order([r.value for r in records if r.value != b"marker"], per_key)

        group = await client.reader_group("sc1", "grp", ["st"])
        got: list[bytes] = []
        async with await group.create_reader("r") as reader:
            deadline = time.monotonic() + 30
            while len(got) < len(records) and time.monotonic() < deadline:
                event = await reader.read_next(timeout_s=0.5)
                if event is not None:
                    got.append(event.data)
        assert len(got) == len(records)
        _check_per_key_order([v for v in got if v != b"marker"], per_key)


async def test_empty_sealed_segment_leads_to_its_successors(server: Server) -> None:
    async with PravegaClient(server.uri) as client:
        await client.controller.create_scope("sc2")
        await client.controller.create_stream("sc2", "st", StreamConfig(ScalingPolicy.fixed(1)))
        (old,) = await client.controller.get_current_segments("sc2", "st")
        await client.controller.scale_stream(
            "sc2", "st", [old.segment.segment_id], [(0.0, 0.5), (0.5, 1.0)]
        )
        async with await client.create_writer("sc2", "st") as writer:
            for key in KEYS:
                await writer.write(f"{key}:0".encode(), routing_key=key)
        async with client.record_reader("sc2", "st") as reader:
            records = [r async for r in reader]
    _check_per_key_order([r.value for r in records], 1)


async def test_transaction_open_across_a_scale_is_read_in_order(server: Server) -> None:
    async with PravegaClient(server.uri) as client:
        await client.controller.create_scope("sc4")
        await client.controller.create_stream("sc4", "st", StreamConfig(ScalingPolicy.fixed(1)))
        async with await client.create_writer("sc4", "st") as writer:
            for key in KEYS:
                await writer.write(f"{key}:0".encode(), routing_key=key)
            await writer.flush()
            txn = await client.begin_transaction("sc4", "st")
            for key in KEYS:
                await txn.write(f"{key}:2".encode(), routing_key=key)
            await txn.flush()
            (old,) = await client.controller.get_current_segments("sc4", "st")
            await client.controller.scale_stream(
                "sc4", "st", [old.segment.segment_id], [(0.0, 0.5), (0.5, 1.0)]
            )
            for key in KEYS:
                await writer.write(f"{key}:1".encode(), routing_key=key)
            await writer.flush()
            await txn.commit()
            for key in KEYS:
                await writer.write(f"{key}:3".encode(), routing_key=key)
        async with client.record_reader("sc4", "st") as reader:
            records = [r async for r in reader]
    _check_per_key_order([r.value for r in records], 4)
    assert {r.segment for r in records if r.value.endswith(b":2")} == {"sc4/st/0.#epoch.2"}
