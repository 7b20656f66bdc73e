"""Large events through headrace's ``EventWriter``: MB/s and the client's CPU per byte.

Run: ``.venv/bin/python benchmarks/client_large_write.py [--event-bytes N]
[--events N] [--rounds R] [--fsync always|never]``

Starts ``python -m headrace serve`` (a temporary data dir, free ports) and,
``--rounds`` times, writes ``--events`` events of ``--event-bytes`` to a fresh
1-segment stream with ``EventWriter.write`` and one ``flush()``. Each round
prints MB/s (first write to the end of the flush) and the client process's
CPU milliseconds per 100 MB: on a busy shared machine the CPU per byte is far
steadier than the rate, and it is what the writer's copies cost.

To compare two versions of the client, run this script from each tree back
to back (``PYTHONPATH=<other tree>/src``): the server comes from the same
tree as the client. The last line printed is one JSON object. Nothing here
asserts speed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import _common as common

from headrace.client import PravegaClient, ScalingPolicy, StreamConfig


async def produce(uri: str, stream: str, size: int, count: int) -> tuple[float, float]:
    """Seconds and client CPU seconds for ``count`` events of ``size`` bytes."""
    event = os.urandom(size)
    async with PravegaClient(uri) as client:
        await client.controller.create_scope("bench")
        await client.controller.create_stream("bench", stream, StreamConfig(ScalingPolicy.fixed(1)))
        writer = await client.create_writer("bench", stream)
        await writer.write_and_wait(event)  # connection set up before timing
        cpu0, t0 = time.process_time(), time.perf_counter()
        for _ in range(count):
            await writer.write(event)
        await writer.flush()
        seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        await writer.aclose()
    return seconds, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--event-bytes", type=int, default=10 * 1024)
    ap.add_argument("--events", type=int, default=30_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--fsync", choices=("always", "never"), default="never")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as data_dir:
        ports = {"controller": common.free_port(), "segment-store": common.free_port()}
        proc = common.start_headrace(Path(data_dir), ports, args.fsync)
        try:
            uri = f"tcp://127.0.0.1:{ports['controller']}"
            for i in range(args.rounds):
                seconds, cpu = asyncio.run(produce(uri, f"s{i}", args.event_bytes, args.events))
                nbytes = args.events * args.event_bytes
                row = {
                    "mb_per_s": round(nbytes / seconds / 1e6, 1),
                    "client_cpu_ms_per_100mb": round(cpu / nbytes * 1e11, 1),
                    "client_cpu_share": round(cpu / seconds, 2),
                }
                rows.append(row)
                print(
                    f"{args.event_bytes} B x {args.events}, fsync {args.fsync}: "
                    f"{row['mb_per_s']} MB/s, client CPU {row['client_cpu_ms_per_100mb']} ms "
                    f"per 100 MB ({row['client_cpu_share']:.0%} of a core)",
                    flush=True,
                )
        finally:
            common.stop(proc)
    print(
        json.dumps(
            {
                "benchmark": "client_large_write",
                "event_bytes": args.event_bytes,
                "events": args.events,
                "fsync": args.fsync,
                "rounds": rows,
                "median_mb_per_s": statistics.median(r["mb_per_s"] for r in rows),
                "median_client_cpu_ms_per_100mb": statistics.median(
                    r["client_cpu_ms_per_100mb"] for r in rows
                ),
                "loadavg": common.loadavg(),
                "machine": common.machine(),
            }
        )
    )


if __name__ == "__main__":
    main()
