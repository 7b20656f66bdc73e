"""Reader groups: segments shared among readers that join and leave; each event once."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from headrace.client import PravegaClient, ScalingPolicy, StreamConfig
from headrace.client.reader import ReaderGroup
from tests._real_pravega import run_scenario

from .conftest import Server

DEADLINE_S = 60.0
HERE = Path(__file__).resolve().parent


async def _make_stream(client: PravegaClient, scope: str, stream: str, segments: int) -> None:
    await client.controller.create_scope(scope)
    assert await client.controller.create_stream(
        scope, stream, StreamConfig(ScalingPolicy.fixed(segments))
    )


async def test_three_readers_join_and_leave_while_writing(server: Server) -> None:
    total = 30_000
    async with PravegaClient(server.uri) as client:
        await _make_stream(client, "g1", "st", 4)
        group = await ReaderGroup.create(client, "g1", "grp", ["st"])

        async def write() -> None:
            async with await client.create_writer("g1", "st") as writer:
                for i in range(total):
                    await writer.write(f"e{i}".encode(), routing_key=f"k{i % 10}")
                    if i % 500 == 499:
                        await asyncio.sleep(0)  # yield: readers run while the writer writes

        writing = asyncio.create_task(write())
        got: list[bytes] = []
        owners_seen: set[str] = set()
        # When the group has delivered this many events in all, this happens:
        plan = {5000: ("join", "r2"), 10000: ("join", "r3"), 15000: ("leave", "r1"),
                22000: ("leave", "r2")}  # fmt: skip
        actions: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
        leaving: set[str] = set()
        all_read = asyncio.Event()

        async def run_reader(name: str) -> None:
            async with await group.create_reader(name) as reader:
                while name not in leaving and not all_read.is_set():
                    event = await reader.read_next(timeout_s=0.2)
                    if event is None:
                        continue
                    got.append(event.data)
                    owners_seen.add(name)
                    step = plan.pop(len(got), None)
                    if step is not None:
                        actions.put_nowait(step)
                    if len(got) >= total:
                        all_read.set()

        tasks = {"r1": asyncio.create_task(run_reader("r1"))}
        async with asyncio.timeout(DEADLINE_S):
            while plan or not actions.empty():
                action, who = await actions.get()
                if action == "join":
                    tasks[who] = asyncio.create_task(run_reader(who))
                else:
                    leaving.add(who)
                    await tasks[who]  # left the group: positions stored, segments released
            await all_read.wait()
            await asyncio.gather(*tasks.values())
            await writing
        positions = await group.positions()
        assert await group.delete()
    assert not plan
    counts = Counter(got)
    assert len(got) == total, f"read {len(got)} of {total}"
    assert max(counts.values()) == 1
    assert owners_seen == {"r1", "r2", "r3"}
    assert len(positions) == 4


async def test_group_reads_events_of_the_real_writer(server: Server) -> None:
    keys = [f"key-{i % 5}" for i in range(500)]
    run_scenario("write_keyed", server.uri, "g2", "st", "2", json.dumps(keys))
    async with PravegaClient(server.uri) as client:
        group = await ReaderGroup.create(client, "g2", "grp", ["st"])
        got: list[str] = []
        async with await group.create_reader("only") as reader:
            deadline = time.monotonic() + DEADLINE_S
            while len(got) < len(keys) and time.monotonic() < deadline:
                event = await reader.read_next(timeout_s=0.5)
                if event is not None:
                    got.append(event.data.decode())
    assert sorted(got) == sorted(keys)


async def test_reopened_group_continues_after_stored_positions(server: Server) -> None:
    async with PravegaClient(server.uri) as client:
        await _make_stream(client, "g3", "st", 1)
        async with await client.create_writer("g3", "st") as writer:
            for i in range(10):
                await writer.write(f"e{i}".encode())
        group = await ReaderGroup.create(client, "g3", "grp", ["st"])
        async with await group.create_reader("a") as reader:
            first = [await reader.read_next(timeout_s=5.0) for _ in range(4)]
        again = await ReaderGroup.create(client, "g3", "grp", ["st"])  # exists: opened
        async with await again.create_reader("b") as reader:
            rest = [await reader.read_next(timeout_s=5.0) for _ in range(6)]
            assert await reader.read_next(timeout_s=0.2) is None
    assert [e.data for e in first if e] == [b"e0", b"e1", b"e2", b"e3"]
    assert [e.data for e in rest if e] == [f"e{i}".encode() for i in range(4, 10)]


async def test_dead_reader_segments_taken_over_from_stored_positions(server: Server) -> None:
    """A reader that dies without leaving: after the timeout its segment is taken
    over from its last stored position (the events after it come again)."""
    async with PravegaClient(server.uri) as client:
        await _make_stream(client, "g4", "st", 1)
        async with await client.create_writer("g4", "st") as writer:
            for i in range(20):
                await writer.write(f"e{i}".encode())
        group = await ReaderGroup.create(client, "g4", "grp", ["st"], reader_timeout_s=0.5)
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, str(HERE / "our_client.py"), "read_then_die", server.uri, "g4",
             "grp", "5", "3"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        theirs = json.loads(done.stdout.strip().splitlines()[-1])["events"]
        assert theirs == [f"e{i}" for i in range(8)]
        got: list[str] = []
        async with await group.create_reader("heir") as reader:
            deadline = time.monotonic() + DEADLINE_S
            while len(got) < 15 and time.monotonic() < deadline:
                event = await reader.read_next(timeout_s=0.5)
                if event is not None:
                    got.append(event.data.decode())
    assert got == [f"e{i}" for i in range(5, 20)]


async def test_group_from_tail_sees_only_new_events(server: Server) -> None:
    async with PravegaClient(server.uri) as client:
        await _make_stream(client, "g5", "st", 2)
        async with await client.create_writer("g5", "st") as writer:
            for i in range(10):
                await writer.write(f"old{i}".encode(), routing_key=f"k{i}")
        group = await client.reader_group("g5", "grp", ["st"], from_tail=True)
        async with await group.create_reader("r") as reader:
            async with await client.create_writer("g5", "st") as writer:
                for i in range(10):
                    await writer.write(f"new{i}".encode(), routing_key=f"k{i}")
            got: list[str] = []
            deadline = time.monotonic() + DEADLINE_S
            while len(got) < 10 and time.monotonic() < deadline:
                event = await reader.read_next(timeout_s=0.5)
                if event is not None:
                    got.append(event.data.decode())
    assert sorted(got) == sorted(f"new{i}" for i in range(10))
