"""Write throughput and ack latency of the real ``pravega`` client against ``headrace serve``.

Run: ``.venv/bin/python benchmarks/pravega_write.py [--quick] [--fsync always|never]``.

Starts ``python -m headrace serve`` (a temporary data dir, free ports). For
100-byte and 10 KiB events with 1 and 4 writers, it creates a fresh
4-segment stream and runs each writer in its own process (the client's
calls hold the GIL): the writer sends ``--events`` events (a tenth of it for
10 KiB) with ``write_event_async``, at most ``--inflight`` unacknowledged at
a time, under 100 routing keys, then flushes. Writers start together.

Per configuration it prints events/s and MB/s (10^6 bytes of payload) over
the time from the first write to the last flush, and the p50/p99 ack latency
(from ``write_event_async`` to its future completing, so queueing inside the
client is included), and the server's CPU use as a share of one core (on a
small machine the writers' Python side is usually the bottleneck). The last
line printed is one JSON object with every figure. A first run with one
writer and one event in flight gives the unloaded ack latency (a round trip
plus the server's fsync). Nothing here asserts speed; it is a measuring
tool, not a test.
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
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _common import cpu_s as _cpu_s
from _common import free_port as _free_port  # shared with benchmarks/suite.py
from _common import percentile as _percentile

ROOT = Path(__file__).resolve().parent.parent

SIZES_BYTES = (100, 10 * 1024)
WRITER_COUNTS = (1, 4)

DEFAULT_EVENTS = 50_000
"""100-byte events per writer in a full run; 10 KiB runs send a tenth of it."""

QUICK_EVENTS = 5_000
"""Per writer with ``--quick`` (the whole run takes well under a minute)."""

DEFAULT_INFLIGHT = 1000
"""Unacknowledged events per writer: enough for the client to fill its
500-event batches while one batch is in flight."""

STARTUP_TIMEOUT_S = 30.0
CHILD_TIMEOUT_S = 600.0


# --------------------------------------------------------------------------- writer process


def _child(uri: str, scope: str, stream: str, size: int, count: int, inflight: int) -> None:
    """One writer: wait for ``go`` on stdin, write, flush, print one JSON line."""
    import pravega_client as pc

    manager = pc.StreamManager(uri, False, False)
    writer = manager.create_writer(scope, stream, inflight)
    payload = "x" * size  # write_event_async takes text (sent as UTF-8)
    writer.write_event(payload, "warm-up")  # the connection is set up before timing
    writer.flush()
    print("ready", flush=True)
    sys.stdin.readline()

    latencies: list[float] = []

    async def run() -> tuple[float, float]:
        slots = asyncio.Semaphore(inflight)
        loop = asyncio.get_running_loop()

        def on_ack(sent: float) -> Any:
            def done(_: object) -> None:
                latencies.append(loop.time() - sent)
                slots.release()

            return done

        start = time.time()
        pending = []
        for i in range(count):
            await slots.acquire()
            future = asyncio.ensure_future(writer.write_event_async(payload, f"k{i % 100}"))
            future.add_done_callback(on_ack(loop.time()))
            pending.append(future)
        await asyncio.gather(*pending)
        writer.flush()
        return start, time.time()

    start, end = asyncio.run(run())
    latencies.sort()
    print(json.dumps({"start": start, "end": end, "events": count, "latencies": latencies}))
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown, where the client sometimes crashes


# --------------------------------------------------------------------------- parent


def _wait_connectable(proc: subprocess.Popen[bytes], port: int, deadline: float) -> None:
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"headrace serve did not listen on {port}")


def _run_config(
    uri: str, scope: str, size: int, writers: int, count: int, inflight: int, server_pid: int
) -> dict[str, Any]:
    import pravega_client as pc

    stream = f"w{writers}s{size}i{inflight}"
    manager = pc.StreamManager(uri, False, False)
    manager.create_scope(scope)
    manager.create_stream(scope, stream, 4)
    args = [str(size), str(count), str(inflight)]
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--child", uri, scope, stream, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(writers)
    ]
    for proc in procs:
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            raise SystemExit("a writer failed to start")
    cpu_before = _cpu_s(server_pid)
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    results = []
    crashed_after_result = 0
    for proc in procs:
        out, _ = proc.communicate(timeout=CHILD_TIMEOUT_S)
        lines = out.strip().splitlines()
        if not lines or not lines[-1].startswith("{"):
            raise SystemExit(f"a writer failed with exit code {proc.returncode}")
        if proc.returncode != 0:
            # The client has been seen to crash in its own threads at exit,
            # after its writes were flushed and reported.
            crashed_after_result += 1
        results.append(json.loads(lines[-1]))
    server_cpu_s = _cpu_s(server_pid) - cpu_before
    elapsed = max(r["end"] for r in results) - min(r["start"] for r in results)
    events = sum(r["events"] for r in results)
    latencies = sorted(x for r in results for x in r["latencies"])
    return {
        "event_bytes": size,
        "writers": writers,
        "events": events,
        "seconds": round(elapsed, 3),
        "events_per_s": round(events / elapsed),
        "mb_per_s": round(events * size / elapsed / 1e6, 2),
        "p50_ack_ms": round(_percentile(latencies, 0.50) * 1000, 2),
        "p99_ack_ms": round(_percentile(latencies, 0.99) * 1000, 2),
        "mean_ack_ms": round(statistics.fmean(latencies) * 1000, 2),
        "server_cpu_share": round(server_cpu_s / elapsed, 2),
        "writer_exits_not_clean": crashed_after_result,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--events", type=int, default=None, help="100-byte events per writer")
    parser.add_argument("--inflight", type=int, default=DEFAULT_INFLIGHT)
    parser.add_argument("--fsync", choices=["always", "interval", "never"], default="always")
    parser.add_argument("--dir", type=Path, default=None, help="parent of the data dir")
    args = parser.parse_args()
    events = args.events or (QUICK_EVENTS if args.quick else DEFAULT_EVENTS)

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        controller, segment_store = _free_port(), _free_port()
        cmd = [sys.executable, "-m", "headrace", "serve", "--data-dir", f"{tmp}/data"]
        cmd += ["--fsync", args.fsync, "--controller-port", str(controller)]
        cmd += ["--segment-store-port", str(segment_store)]
        for name in ["tank", "lumberjack", "lumberjack-tls", "rsio", "http"]:
            cmd += [f"--{name}-port", "0"]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        server = subprocess.Popen(cmd, stderr=subprocess.DEVNULL, env=env, cwd=ROOT)
        try:
            deadline = time.monotonic() + STARTUP_TIMEOUT_S
            _wait_connectable(server, controller, deadline)
            _wait_connectable(server, segment_store, deadline)
            uri = f"tcp://127.0.0.1:{controller}"
            runs = []
            # Unloaded: one event in flight, so the latency is one round trip + fsync.
            unloaded = _run_config(uri, "bench", 100, 1, max(events // 50, 100), 1, server.pid)
            unloaded["inflight"] = 1
            print(
                f"   100 B x 1 writer, 1 in flight: ack p50 {unloaded['p50_ack_ms']:.2f} ms"
                f" p99 {unloaded['p99_ack_ms']:.2f} ms",
                flush=True,
            )
            for size in SIZES_BYTES:
                count = events if size <= 100 else max(events // 10, 100)
                for writers in WRITER_COUNTS:
                    run = _run_config(uri, "bench", size, writers, count, args.inflight, server.pid)
                    runs.append(run)
                    print(
                        f"{size:>6} B x {writers} writer(s): {run['events_per_s']:>8} events/s"
                        f" {run['mb_per_s']:>8.2f} MB/s  ack p50 {run['p50_ack_ms']:.2f} ms"
                        f" p99 {run['p99_ack_ms']:.2f} ms"
                        f"  server CPU {run['server_cpu_share']:.0%}",
                        flush=True,
                    )
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=30)

    summary = {
        "benchmark": "pravega_write",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "fsync": args.fsync,
        "inflight": args.inflight,
        "unloaded": unloaded,
        "runs": runs,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        uri, scope, stream, size, count, inflight = sys.argv[2:8]
        _child(uri, scope, stream, int(size), int(count), int(inflight))
    else:
        main()
