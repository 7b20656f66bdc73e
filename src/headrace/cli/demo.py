"""``headrace demo``: the main job until the Spark pipeline lands.

Starts an embedded server on a fresh data directory, writes a few thousand
events through the store from concurrent writers (Pravega event framing,
writer ids and event numbers as the real clients send them), stops the
server, starts it again on the same directory, reads every event back and
checks that each one is there exactly once and in order.
"""

from __future__ import annotations

import asyncio
import struct
import tempfile
import time
import uuid
from pathlib import Path

import click

from headrace.server.app import ServerApp
from headrace.server.config import DEFAULT_PORTS, ServerConfig
from headrace.store.api import SegmentStore
from headrace.types import WriterAppend

__all__ = ["demo"]

EVENT_HEADER = struct.Struct(">ii")  # Pravega event framing: type 0, payload length
EVENTS_PER_BLOCK = 50  # events per append, like a client batching a burst of writes


def _frame(payload: bytes) -> bytes:
    return EVENT_HEADER.pack(0, len(payload)) + payload


def _unframe(data: bytes) -> list[bytes]:
    events, position = [], 0
    while position < len(data):
        kind, size = EVENT_HEADER.unpack_from(data, position)
        if kind != 0:
            raise click.ClickException(f"bad event frame at {position}")
        start = position + EVENT_HEADER.size
        events.append(data[start : start + size])
        position = start + size
    return events


async def _write(store: SegmentStore, segment: str, writer: int, count: int) -> None:
    writer_id = uuid.uuid4()
    for first in range(0, count, EVENTS_PER_BLOCK):
        last = min(first + EVENTS_PER_BLOCK, count)
        block = b"".join(_frame(f"{segment}|{writer}|{n}".encode()) for n in range(first, last))
        await store.append(segment, block, writer=WriterAppend(writer_id, last))


async def _read_all(store: SegmentStore, segment: str) -> list[bytes]:
    info = await store.info(segment)
    result = await store.read(segment, info.start_offset, info.length - info.start_offset)
    return _unframe(result.data)


async def _demo(data_dir: Path, segments: int, writers: int, events: int) -> None:
    no_listeners = {name: 0 for name in DEFAULT_PORTS}
    names = [f"demo/events/{n}.#epoch.0" for n in range(segments)]
    per_writer = events // (segments * writers)

    app = ServerApp(ServerConfig(data_dir=data_dir, ports=no_listeners))
    await app.start()
    started = time.perf_counter()
    for name in names:
        await app.store.create_segment(name)
    await asyncio.gather(
        *(_write(app.store, name, w, per_writer) for name in names for w in range(writers))
    )
    elapsed = time.perf_counter() - started
    total = per_writer * segments * writers
    click.echo(
        f"wrote {total} events to {segments} segments from {segments * writers} concurrent "
        f"writers in {elapsed:.2f} s ({total / elapsed:,.0f} events/s, each fsynced before ack)"
    )
    await app.aclose()
    click.echo("stopped the server; starting it again on the same data directory")

    app = ServerApp(ServerConfig(data_dir=data_dir, ports=no_listeners))
    await app.start()
    try:
        for name in names:
            got = await _read_all(app.store, name)
            info = await app.store.info(name)
            for w in range(writers):
                mine = [e for e in got if e.startswith(f"{name}|{w}|".encode())]
                expected = [f"{name}|{w}|{n}".encode() for n in range(per_writer)]
                if mine != expected:
                    raise click.ClickException(f"{name}: writer {w} events differ after restart")
            click.echo(
                f"  {name}: {len(got)} events, {info.length} bytes, "
                f"{len(info.attributes)} writer ids remembered"
            )
    finally:
        await app.aclose()
    click.echo(f"read back all {total} events after a restart: each exactly once, in order")


@click.command()
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None)
@click.option("--segments", type=click.IntRange(1, 64), default=4, show_default=True)
@click.option("--writers", type=click.IntRange(1, 64), default=8, show_default=True)
@click.option("--events", type=click.IntRange(1, 10_000_000), default=5000, show_default=True)
def demo(data_dir: Path | None, segments: int, writers: int, events: int) -> None:
    """Write and read back events through an embedded server (a fresh temp dir by default)."""
    if data_dir is not None:
        asyncio.run(_demo(data_dir, segments, writers, events))
        return
    with tempfile.TemporaryDirectory(prefix="headrace-demo-") as tmp:
        asyncio.run(_demo(Path(tmp), segments, writers, events))
