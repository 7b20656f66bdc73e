"""Event-write throughput: headrace's client next to the real Rust ``pravega`` client.

Run: ``.venv/bin/python benchmarks/client_write.py [--events N] [--rounds R]``
(``--fsync always|never``, ``--rust-inflight N``).

Starts ``python -m headrace serve`` (a temporary data dir, free ports), then,
``--rounds`` times in alternation on that same server, writes ``--events``
100-byte events to a fresh 1-segment stream:

* **headrace**: ``EventWriter.write`` for each event, then ``flush()``;
* **rust**: the ``pravega`` package's ``StreamWriter.write_event_bytes`` with
  ``max_inflight_events`` = ``--rust-inflight`` (it blocks per event at 0),
  then ``flush()``, in a child process (its calls hold the GIL).

Each figure is events / (time from the first write to the end of the flush).
The client processes' CPU time per event is reported too: on a busy shared
machine it is steadier than wall-clock rates.
Rounds alternate so that both clients see the same drift of a shared machine;
the best round of each is reported, with the median.

The last line printed is one JSON object, including ``headrace_events_per_s``,
``rust_events_per_s`` and ``ratio`` (headrace / rust; goal >= 1.0, and
headrace >= 300,000 events/s). Nothing here asserts speed.
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

from _common import free_port as _free_port  # shared with benchmarks/suite.py

from headrace.client import PravegaClient, ScalingPolicy, StreamConfig

EVENT_BYTES = 100
STARTUP_TIMEOUT_S = 30.0
RUST_TIMEOUT_S = 600.0

RUST_CHILD = r"""
import json, sys, time
import pravega_client
uri, scope, stream, count, inflight = sys.argv[1:6]
size = int(sys.argv[6]) if len(sys.argv) > 6 else 100
m = pravega_client.StreamManager(uri)
m.create_scope(scope)
m.create_stream(scope, stream, 1)
w = m.create_writer(scope, stream, int(inflight))
event = b"x" * size
w.write_event_bytes(event)  # connection set up before timing
w.flush()
n = int(count)
start, cpu = time.perf_counter(), time.process_time()
for _ in range(n):
    w.write_event_bytes(event)
w.flush()
print(json.dumps({"seconds": time.perf_counter() - start, "cpu_s": time.process_time() - cpu}))
"""


def _start_server(data_dir: Path, fsync: str) -> tuple[subprocess.Popen[bytes], str]:
    ports = {"controller": _free_port(), "segment-store": _free_port()}
    args = [sys.executable, "-m", "headrace", "serve", "--data-dir", str(data_dir)]
    args += ["--fsync", fsync]
    args += ["--controller-port", str(ports["controller"])]
    args += ["--segment-store-port", str(ports["segment-store"])]
    for name in ["tank", "lumberjack", "lumberjack-tls", "rsio", "http"]:
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
    return proc, f"tcp://127.0.0.1:{ports['controller']}"


async def _headrace_round(uri: str, stream: str, count: int) -> tuple[float, float]:
    event = b"x" * EVENT_BYTES
    async with PravegaClient(uri) as client:
        await client.controller.create_scope("bench")
        await client.controller.create_stream("bench", stream, StreamConfig(ScalingPolicy.fixed(1)))
        writer = await client.create_writer("bench", stream)
        await writer.write_and_wait(event)  # connection set up before timing
        start, cpu = time.perf_counter(), time.process_time()
        for _ in range(count):
            await writer.write(event)
        await writer.flush()
        seconds, cpu_s = time.perf_counter() - start, time.process_time() - cpu
        await writer.aclose()
    return seconds, cpu_s


def _rust_round(
    uri: str, stream: str, count: int, inflight: int, event_bytes: int = EVENT_BYTES
) -> tuple[float, float]:
    args = [uri, "bench", stream, str(count), str(inflight), str(event_bytes)]
    done = subprocess.run(
        [sys.executable, "-c", RUST_CHILD, *args],
        capture_output=True,
        text=True,
        timeout=RUST_TIMEOUT_S,
    )
    if done.returncode != 0:
        raise SystemExit(f"rust client failed:\n{done.stderr[-2000:]}")
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    return float(figures["seconds"]), float(figures["cpu_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fsync", choices=["always", "never"], default="always")
    parser.add_argument("--rust-inflight", type=int, default=10_000)
    args = parser.parse_args()

    ours: list[float] = []
    theirs: list[float] = []
    ours_cpu: list[float] = []
    theirs_cpu: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        proc, uri = _start_server(Path(tmp) / "data", args.fsync)
        try:
            for i in range(args.rounds):
                secs, cpu_s = asyncio.run(_headrace_round(uri, f"ours{i}", args.events))
                ours.append(args.events / secs)
                ours_cpu.append(cpu_s * 1e6 / args.events)
                print(f"round {i}: headrace {ours[-1]:,.0f} events/s", flush=True)
                secs, cpu_s = _rust_round(uri, f"rust{i}", args.events, args.rust_inflight)
                theirs.append(args.events / secs)
                theirs_cpu.append(cpu_s * 1e6 / args.events)
                print(f"round {i}: rust     {theirs[-1]:,.0f} events/s", flush=True)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    best_ours, best_theirs = max(ours), max(theirs)
    result = {
        "benchmark": "client_write",
        "time": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "events": args.events,
        "event_bytes": EVENT_BYTES,
        "rounds": args.rounds,
        "fsync": args.fsync,
        "rust_max_inflight_events": args.rust_inflight,
        "headrace_events_per_s": round(best_ours),
        "rust_events_per_s": round(best_theirs),
        "headrace_median_events_per_s": round(statistics.median(ours)),
        "rust_median_events_per_s": round(statistics.median(theirs)),
        "ratio": round(best_ours / best_theirs, 3),
        "headrace_cpu_us_per_event": round(min(ours_cpu), 2),
        "rust_cpu_us_per_event": round(min(theirs_cpu), 2),
        "goal_ratio": 1.0,
        "goal_headrace_events_per_s": 300_000,
    }
    print(
        f"headrace {best_ours:,.0f} events/s, rust {best_theirs:,.0f} events/s, "
        f"ratio {result['ratio']}"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
