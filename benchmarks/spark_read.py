"""Events/s read into Spark through the ``headrace`` data source.

Run: ``.venv/bin/python benchmarks/spark_read.py [--events N] [--event-bytes B]
[--size-spread S] [--segments S] [--master local[2]]``.

Starts an embedded server (a temporary data dir, free loopback ports, fsync
off: the benchmark measures reading), creates stream ``bench/events`` with
``--segments`` fixed segments and fills it with ``--events`` events of
``--event-bytes`` payload bytes each (``--size-spread S``: sizes vary
by up to S bytes either way, event to event; Pravega event framing, appended to the
store in 1 MiB blocks, spread evenly over the segments; writing is not what is
measured). Then, in one Spark session on ``--master``:

* ``count``: ``spark.read.format("headrace")...load().count()``;
* ``group-by``: the same read, ``groupBy(partition, first byte of value).count()``.

Each is run once to warm up and then timed; the figure is events / seconds of
the timed run. The goal on ``local[2]`` is 1,000,000 events/s. The last line
printed is one JSON object with the figures. Nothing here asserts speed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from headrace.client import PravegaClient, ScalingPolicy, StreamConfig
from headrace.server.app import ServerApp
from headrace.server.config import DEFAULT_PORTS, ServerConfig
from headrace.store.api import FsyncPolicy

EVENT_HEADER = struct.Struct(">ii")  # Pravega event framing: type 0, payload length
BLOCK_BYTES = 1024 * 1024  # bytes per store append while filling
GOAL_EVENTS_PER_S = 1_000_000
TIMEOUT_S = 120.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _size(size: int, spread: int, i: int) -> int:
    """Event ``i``'s payload size: ``size`` +- ``spread``, varying event to event."""
    return size if spread == 0 else size - spread + (i * 7919) % (2 * spread + 1)


async def fill(
    app: ServerApp, uri: str, events: int, size: int, segments: int, spread: int = 0
) -> None:
    async with PravegaClient(uri) as client:
        await client.controller.create_scope("bench")
        config = StreamConfig(ScalingPolicy.fixed(segments))
        await client.controller.create_stream("bench", "events", config)
        names = [
            r.segment.name for r in await client.controller.get_current_segments("bench", "events")
        ]
    per_block = max(1, BLOCK_BYTES // (EVENT_HEADER.size + size + spread))
    for seg_index, name in enumerate(names):
        mine = events // segments + (1 if seg_index < events % segments else 0)
        written = 0
        while written < mine:
            n = min(per_block, mine - written)
            sizes = [_size(size, spread, written + i) for i in range(n)]
            block = b"".join(
                EVENT_HEADER.pack(0, sizes[i]) + (b"%c" % (97 + (written + i) % 26)) * sizes[i]
                for i in range(n)
            )
            await app.store.append(name, block)
            written += n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--event-bytes", type=int, default=100)
    parser.add_argument("--segments", type=int, default=4)
    parser.add_argument(
        "--size-spread",
        type=int,
        default=0,
        help="vary payload sizes by up to this many bytes either way (0: all equal)",
    )
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    with tempfile.TemporaryDirectory(prefix="headrace-bench-") as tmp:
        ports = {name: 0 for name in DEFAULT_PORTS}
        ports["controller"] = free_port()
        ports["segment_store"] = free_port()
        config = ServerConfig(data_dir=Path(tmp) / "data", ports=ports, fsync=FsyncPolicy.NEVER)
        app = ServerApp(config)
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="headrace-server", daemon=True)
        thread.start()

        def call(coro: Any) -> Any:
            return asyncio.run_coroutine_threadsafe(coro, loop).result(TIMEOUT_S * 10)

        call(app.start())
        uri = f"tcp://127.0.0.1:{app.ports['controller']}"
        started = time.perf_counter()
        call(fill(app, uri, args.events, args.event_bytes, args.segments, args.size_spread))
        print(f"filled {args.events:,} events in {time.perf_counter() - started:.1f} s", flush=True)

        from pyspark.sql import SparkSession
        from pyspark.sql import functions as F

        spark = (
            SparkSession.builder.master(args.master)
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.driver.host", "127.0.0.1")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        figures: dict[str, Any] = {
            "benchmark": "spark_read",
            "events": args.events,
            "event_bytes": args.event_bytes,
            "segments": args.segments,
            "size_spread": args.size_spread,
            "master": args.master,
            "goal_events_per_s": GOAL_EVENTS_PER_S,
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
        }
        try:

            def load() -> Any:
                return (
                    spark.read.format("headrace")
                    .option("controller", uri)
                    .option("stream", "bench/events")
                    .load()
                )

            runs = {
                "count": lambda: load().count(),
                "group_by": lambda: (
                    load()
                    .groupBy("partition", F.substring("value", 1, 1).alias("first"))
                    .count()
                    .collect()
                ),
            }
            for name, run in runs.items():
                run()  # warm-up: Python workers, data source lookup
                t0 = time.perf_counter()
                result = run()
                elapsed = time.perf_counter() - t0
                if name == "count":
                    assert result == args.events, result
                else:
                    assert sum(r["count"] for r in result) == args.events
                figures[f"{name}_s"] = round(elapsed, 3)
                figures[f"{name}_events_per_s"] = round(args.events / elapsed)
                print(f"{name}: {elapsed:.2f} s, {args.events / elapsed:,.0f} events/s", flush=True)
        finally:
            spark.stop()
            call(app.aclose())
            loop.call_soon_threadsafe(loop.stop)
            thread.join(TIMEOUT_S)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
