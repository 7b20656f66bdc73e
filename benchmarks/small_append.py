"""Server CPU per small Pravega append, in process: the handler and the store alone.

Run: ``.venv/bin/python benchmarks/small_append.py [--quick] [--dir DIR] [--profile FILE]``.

The latency shape of ``suite.py`` (10,000 events/s of 100 bytes, one
``AppendBlockEnd`` of about ten events every millisecond) costs the server
tens of microseconds of CPU per append, most of it sockets and the event
loop. This script measures the part that is neither: the bytes of each
append are fed to a ``PravegaHandler`` (decode), its ``handle`` runs the
append against the store as the connection loop runs an inline event (first
step in the caller, the rest in a task only if it suspends), and the reply
bytes are taken (``output``). With ``tail`` a second handler keeps one
``ReadSegment`` parked at the segment's tail, as the suite's tail reader
does, so every append also pays the parked read's wake-up, its read and its
reply.

Every configuration runs in alternating slices with two paired figures:
the **baseline**, one bare event-loop round per append (``sleep(0)``, which
every configuration also pays once per append, and which no change to
headrace moves), and the decode alone (``feed`` of the same frames, nothing
handled). The ratio divides by the paired baseline, so a busy or slower
machine moves both; compare trees by that ratio (run the script with
``PYTHONPATH`` pointing at each tree's ``src``). Figures are process CPU time
(``time.process_time``) per append, in microseconds, medians of the slices.
The last line printed is one JSON object with every figure.

Nothing here asserts speed; it is a measuring tool, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import statistics
import struct
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from headrace.protocols import pravega as p
from headrace.server._inline import start_inline
from headrace.server.pravega import PravegaHandler
from headrace.store import DiskStore, MemoryStore
from headrace.store._base import BaseStore
from headrace.store.api import FsyncPolicy

EVENTS_PER_APPEND = 10
"""Events per ``AppendBlockEnd``: what the suite's paced writer sends at 10,000/s every ms."""

EVENT_BYTES = 100

DEFAULT_APPENDS = 20_000
QUICK_APPENDS = 2_000
SLICES = 8
"""Alternating configuration/baseline slices per configuration."""

_FRAME = struct.Struct(">ii")


def _frames(writer: uuid.UUID, count: int) -> list[bytes]:
    """``count`` AppendBlockEnd frames of ``EVENTS_PER_APPEND`` events, event numbers from 1."""
    pad = os.urandom(EVENT_BYTES)
    data = b"".join(p.encode_event(pad) for _ in range(EVENTS_PER_APPEND))
    return [
        p.encode_command(
            p.AppendBlockEnd(
                writer,
                len(data),
                data,
                EVENTS_PER_APPEND,
                (i + 1) * EVENTS_PER_APPEND,
                100 + i,
            )
        )
        for i in range(count)
    ]


def _start(coro: Coroutine[Any, Any, None], tasks: set[asyncio.Task[None]]) -> None:
    """Run ``coro``'s first step now, as the connection loop runs an inline event."""
    task = start_inline(coro)
    if task is not None:
        tasks.add(task)
        task.add_done_callback(tasks.discard)


class _Tail:
    """A reader handler with one ``ReadSegment`` parked at the tail, re-issued per reply."""

    def __init__(self, store: BaseStore, segment: str) -> None:
        self.handler = PravegaHandler(store)
        self.segment = segment
        self.offset = 0
        self.request_id = 1
        self.replies = 0
        self.task: asyncio.Task[None] | None = None
        self.stopped = False
        list(self.handler.feed(p.encode_command(p.Hello(p.WIRE_VERSION, p.WIRE_VERSION))))
        self.handler.output()

    def park(self) -> None:
        read = p.ReadSegment(self.segment, self.offset, 1024 * 1024, "", self.request_id)
        self.task = asyncio.ensure_future(self.handler.handle(read))
        self.task.add_done_callback(self._answered)

    def _answered(self, task: asyncio.Task[None]) -> None:
        if self.stopped or task.cancelled():
            return
        task.result()
        data = self.handler.data_to_send()
        # One SegmentRead: type, length, then the segment name, offset, flags, data.
        name_size = struct.unpack_from(">H", data, 8)[0]
        at = 8 + 2 + name_size + 8 + 2
        self.offset += struct.unpack_from(">i", data, at)[0]
        self.replies += 1
        self.request_id += 1
        self.park()


async def _run(store: BaseStore, frames: list[bytes], *, handle: bool, tail: bool) -> float:
    """CPU seconds to feed (and with ``handle``, carry out and answer) ``frames``."""
    segment = f"s{uuid.uuid4().hex}"
    await store.create_segment(segment)
    handler = PravegaHandler(store)
    writer = uuid.UUID(bytes=frames[0][8:24])
    setup = p.encode_command(p.Hello(p.WIRE_VERSION, p.WIRE_VERSION)) + p.encode_command(
        p.SetupAppend(1, writer, segment, "")
    )
    for event in handler.feed(setup):
        await handler.handle(event)
    handler.output()
    reader = _Tail(store, segment) if tail else None
    if reader is not None:
        reader.park()
        await asyncio.sleep(0)
    tasks: set[asyncio.Task[None]] = set()
    started = time.process_time()
    for frame in frames:
        for event in handler.feed(frame):
            if handle:
                _start(handler.handle(event), tasks)
        if handle:
            handler.output()
        await asyncio.sleep(0)  # a round of the loop between appends, as on the wire
    while tasks:
        await asyncio.wait(set(tasks))
    cpu = time.process_time() - started
    if handle and not tail:
        assert (await store.info(segment)).length == len(frames) * EVENTS_PER_APPEND * (
            EVENT_BYTES + 8
        )
    if reader is not None:
        assert reader.replies >= 1 and reader.task is not None
        reader.stopped = True
        reader.task.cancel()
        await asyncio.gather(reader.task, return_exceptions=True)
    return cpu


async def _rounds(count: int) -> float:
    """CPU seconds of ``count`` bare event-loop rounds: the baseline."""
    started = time.process_time()
    for _ in range(count):
        await asyncio.sleep(0)
    return time.process_time() - started


async def _open(kind: str, directory: Path) -> BaseStore:
    if kind == "memory":
        return MemoryStore()
    return await DiskStore.open(
        Path(tempfile.mkdtemp(dir=directory)),
        fsync=FsyncPolicy.NEVER if kind == "disk-never" else FsyncPolicy.ALWAYS,
    )


CONFIGS: list[tuple[str, str, bool]] = [
    ("memory, append", "memory", False),
    ("memory, append + parked tail read", "memory", True),
    ("disk never, append", "disk-never", False),
    ("disk never, append + parked tail read", "disk-never", True),
]


async def main_async(appends: int, directory: Path, profile: Callable[[], None] | None) -> None:
    frames = _frames(uuid.uuid4(), appends // SLICES)
    results: dict[str, Any] = {}
    for label, kind, tail in CONFIGS:
        measured: list[float] = []
        decoded: list[float] = []
        rounds: list[float] = []
        for _ in range(SLICES):
            store = await _open(kind, directory)
            try:
                measured.append(await _run(store, frames, handle=True, tail=tail))
                decoded.append(await _run(store, frames, handle=False, tail=False))
                rounds.append(await _rounds(len(frames)))
            finally:
                await store.close()
        per = 1e6 / len(frames)
        us = statistics.median(measured) * per
        decode_us = statistics.median(decoded) * per
        round_us = statistics.median(rounds) * per
        results[label] = {
            "us_per_append": round(us, 2),
            "decode_us_per_append": round(decode_us, 2),
            "loop_round_us": round(round_us, 2),
            "rounds_per_append": round(us / round_us, 2),
        }
        print(
            f"{label:40s} {us:7.2f} µs/append = {us / round_us:5.1f} loop rounds"
            f" (round {round_us:5.2f} µs; decode alone {decode_us:5.2f} µs)",
            flush=True,
        )
    print(json.dumps({"benchmark": "small_append", "loadavg": os.getloadavg(), **results}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tenth of the appends")
    parser.add_argument("--appends", type=int, default=None, help="appends per configuration")
    parser.add_argument("--dir", type=Path, default=None, help="parent of the disk stores")
    parser.add_argument("--profile", type=Path, default=None, help="cProfile stats to this file")
    args = parser.parse_args()
    appends = args.appends or (QUICK_APPENDS if args.quick else DEFAULT_APPENDS)
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        run = main_async(appends, Path(directory), None)
        if args.profile is None:
            asyncio.run(run)
        else:
            profiler = cProfile.Profile()
            profiler.enable()
            asyncio.run(run)
            profiler.disable()
            profiler.dump_stats(str(args.profile))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
