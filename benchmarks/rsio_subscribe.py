"""RS-IO delivery: elements/s and MB/s to one subscriber, and live-tail latency.

Run: ``.venv/bin/python benchmarks/rsio_subscribe.py [--events N] [--large-events N]``
(``--tail-events N``, ``--rounds R``, ``--fsync always|never``).

Starts ``python -m headrace serve`` (a temporary data dir, free ports), fills
two sealed 1-segment streams through the Pravega front door (``--events``
100-byte events, ``--large-events`` 10 KiB events), then, ``--rounds`` times,
reads each stream whole over RS-IO with :class:`headrace.client.rsio.RsioClient`:

* **unbounded**: ``initialDemand`` 2^63-1, one subscription;
* **batch64**: demand in batches of 64 (64 at first, then 32 whenever 32
  have been consumed: the client's ``batch=64``).

Each rate is elements (and payload MB, 10^6 bytes) / time from ``subscribe``
to ``onComplete``; the best round is reported, with the median. Then the
live tail: a subscription with unbounded demand, at the tail, while
``--tail-events`` events are written one at a time (each flushed, so each is
durable) through the Pravega writer; latency = arrival time - time before the
write call, p50 and p99.

The last line printed is one JSON object with every figure. Nothing here
asserts speed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from headrace.client import PravegaClient, ScalingPolicy, StreamConfig
from headrace.client.rsio import RsioClient
from headrace.protocols.rsio import MAX_DEMAND

STARTUP_TIMEOUT_S = 30.0
SMALL_BYTES = 100
LARGE_BYTES = 10 * 1024


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _start_server(data_dir: Path, fsync: str) -> tuple[subprocess.Popen[bytes], str, int]:
    ports = {"controller": _free_port(), "segment-store": _free_port(), "rsio": _free_port()}
    args = [sys.executable, "-m", "headrace", "serve", "--data-dir", str(data_dir)]
    args += ["--fsync", fsync]
    for name, port in ports.items():
        args += [f"--{name}-port", str(port)]
    for name in ["tank", "lumberjack", "lumberjack-tls", "http"]:
        args += [f"--{name}-port", "0"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    for port in ports.values():
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    proc.kill()
                    raise SystemExit("headrace serve did not start") from None
                time.sleep(0.05)  # polling a port under a deadline
    return proc, f"tcp://127.0.0.1:{ports['controller']}", ports["rsio"]


async def _fill(client: PravegaClient, stream: str, count: int, size: int) -> None:
    await client.controller.create_stream("bench", stream, StreamConfig(ScalingPolicy()))
    writer = await client.create_writer("bench", stream)
    event = b"x" * size
    for _ in range(count):
        await writer.write(event)
    await writer.flush()
    await writer.aclose()
    await client.controller.seal_stream("bench", stream)


async def _read(port: int, stream: str, batch: int, count: int) -> float:
    client = await RsioClient.connect("127.0.0.1", port)
    try:
        start = time.perf_counter()
        got = 0
        async for _ in client.subscribe(f"bench/{stream}", batch=batch):
            got += 1
        elapsed = time.perf_counter() - start
        assert got == count, (got, count)
        return elapsed
    finally:
        await client.goodbye()


async def _tail(uri: str, port: int, count: int) -> list[float]:
    pravega = PravegaClient(uri)
    await pravega.controller.create_stream("bench", "tail", StreamConfig(ScalingPolicy()))
    writer = await pravega.create_writer("bench", "tail")
    client = await RsioClient.connect("127.0.0.1", port)
    try:
        await writer.write(b"before")
        await writer.flush()
        sub = client.subscribe("bench/tail", batch=MAX_DEMAND)
        assert await sub.next() == b"before"  # the subscription now waits at the tail
        latencies = []
        for _ in range(count):
            await writer.write(struct.pack(">d", time.perf_counter()))
            await writer.flush()
            element = await sub.next()
            latencies.append(time.perf_counter() - struct.unpack(">d", element)[0])
        return latencies
    finally:
        await writer.aclose()
        await client.goodbye()
        await pravega.aclose()


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _run(args: argparse.Namespace, uri: str, port: int) -> dict[str, object]:
    pravega = PravegaClient(uri)
    await pravega.controller.create_scope("bench")
    sizes = {"100B": (args.events, SMALL_BYTES), "10KiB": (args.large_events, LARGE_BYTES)}
    for name, (count, size) in sizes.items():
        await _fill(pravega, name, count, size)
    await pravega.aclose()
    figures: dict[str, object] = {}
    for name, (count, size) in sizes.items():
        for mode, batch in (("unbounded", MAX_DEMAND), ("batch64", 64)):
            times = [await _read(port, name, batch, count) for _ in range(args.rounds)]
            best, median = min(times), statistics.median(times)
            key = f"{mode}_{name}"
            figures[f"{key}_elements_per_s"] = round(count / best)
            figures[f"{key}_mb_per_s"] = round(count * size / best / 1e6, 2)
            figures[f"{key}_median_elements_per_s"] = round(count / median)
            print(
                f"{key:18} {count / best:12,.0f} elements/s {count * size / best / 1e6:8.2f} MB/s"
                f"  (median {count / median:,.0f}/s over {args.rounds})"
            )
    latencies = await _tail(uri, port, args.tail_events)
    p50, p99 = _quantile(latencies, 0.50), _quantile(latencies, 0.99)
    print(f"tail latency       p50 {p50 * 1000:.2f} ms  p99 {p99 * 1000:.2f} ms")
    figures["tail_latency_p50_ms"] = round(p50 * 1000, 3)
    figures["tail_latency_p99_ms"] = round(p99 * 1000, 3)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--large-events", type=int, default=10_000)
    parser.add_argument("--tail-events", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fsync", choices=["always", "never"], default="always")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        proc, uri, port = _start_server(Path(tmp) / "data", args.fsync)
        try:
            figures = asyncio.run(_run(args, uri, port))
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    result = {
        "benchmark": "rsio_subscribe",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "events": args.events,
        "large_events": args.large_events,
        "tail_events": args.tail_events,
        "rounds": args.rounds,
        "fsync": args.fsync,
        **figures,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
