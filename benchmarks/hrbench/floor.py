"""The Python floor (``floor_server.py``: frame, checksum, write, optionally
sync, ack; nothing else) through the latency shape's paced writer and the
10 KiB shape's raw-socket block producer, the same clients headrace gets."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import _common as common

from hrbench.config import FLOOR_SERVER, LARGE, OFFERED_RATE
from hrbench.context import Context
from hrbench.measure import (
    Measured,
    latency_row,
    rate_row,
    run_group,
    say,
    server_cpu_per_event,
)
from hrbench.results import Row

FLOOR_MODES: Final = (
    ("none", "floor_never", "the write in the read callback, no sync"),
    ("inline", "floor_always", "write + fdatasync in the read callback (stops the loop)"),
    ("thread", "floor_always_thread", "fdatasync in a sync thread, reply via the loop"),
)
"""``floor_server.py``'s modes, the result key of each, and what it does."""


@contextlib.contextmanager
def floor_server(mode: str, path: Path) -> Iterator[tuple[int, int]]:
    """A ``floor_server.py`` writing to ``path``: its port and pid."""
    port = common.free_port()
    server = [sys.executable, str(FLOOR_SERVER), "--port", str(port)]
    proc = subprocess.Popen([*server, "--file", str(path), "--sync", mode])
    try:
        common.wait_connectable(proc, port, time.monotonic() + 30)
        yield port, proc.pid
    finally:
        common.stop(proc)


def run_floor(ctx: Context) -> None:
    """The latency floor: each mode on a fresh file, driven by the same paced writer."""
    for mode, key, what in FLOOR_MODES:
        path = ctx.scratch / f"{key}_latency.bin"
        with floor_server(mode, path) as (port, pid):
            writer = [
                *("lat-pravega", str(port), "floor", str(OFFERED_RATE)),
                *(str(ctx.sizes.latency_s), ctx.sizes.flush_s),
            ]
            with Measured(pid) as m:
                _, (out,) = run_group([writer])
        path.unlink(missing_ok=True)
        row = latency_row(f"Python floor ack, {what}", out, note="floor_server.py")
        row.server_cpu_us_per_event = server_cpu_per_event(m.cpu, out["events"])
        ctx.results.put("latency", key, row)
        say(f"  floor ({mode}): ack at 10k/s p50 {row.p50_ms} p99 {row.p99_ms} ms")


def raw_blocks_row(port: int, segment: str, pid: int, count: int, system: str) -> Row:
    """10 KiB events in ``AppendBlockEnd`` blocks as our client's writer sends them
    (``MAX_BLOCK_BYTES``, ``MAX_BLOCKS_IN_FLIGHT``), from a raw-socket process."""
    from headrace.client.writer import MAX_BLOCK_BYTES, MAX_BLOCKS_IN_FLIGHT

    command = [
        *("raw-produce", str(port), segment, str(LARGE), str(count)),
        *(str(MAX_BLOCK_BYTES), str(MAX_BLOCKS_IN_FLIGHT)),
    ]
    with Measured(pid) as m:
        _, (out,) = run_group([command])
    note = f"raw-socket blocks of {MAX_BLOCK_BYTES // 1024} KiB, {MAX_BLOCKS_IN_FLIGHT} in flight"
    return rate_row(system, count, LARGE, out["seconds"], pid=pid, cpu_s=m.cpu, note=note)


def floor_large_row(ctx: Context, fsync: str) -> tuple[str, Row]:
    """The 10 KiB raw-socket blocks into ``floor_server.py``, run right after
    headrace's row of the same policy. Its file is kept until the run ends: on a
    VM that returns free memory to its host, deleting it would hand the next
    row pages written a moment ago, which take writes several times faster
    than new ones (docs/benchmarks.md#vm)."""
    mode, key, what = next(m for m in FLOOR_MODES if m[1] == f"floor_{fsync}")
    count = ctx.sizes.large_events
    with floor_server(mode, ctx.scratch / f"{key}_10k.bin") as (port, pid):
        return key, raw_blocks_row(port, "floor", pid, count, f"Python floor, {what}")
