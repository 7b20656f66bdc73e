"""Lumberjack ingest throughput of ``headrace serve``, acknowledged (durable) events only.

Run: ``.venv/bin/python benchmarks/lumberjack_ingest.py [--quick] [--fsync always|interval|never]``.

A ``headrace serve`` child process runs with only the Lumberjack listener, on
a fresh temporary data directory. Clients in this process (asyncio, one task
per connection) send v2 windows of ``WINDOW_EVENTS`` (2048, libbeat's default
``bulk_max_size``) JSON log events of about ``EVENT_BYTES`` (300) bytes, the
way libbeat does: ``W`` then the window's ``J`` frames, bare or in one ``C``
frame (zlib level 3, libbeat's default), with up to two windows pipelined
before their acks. Window bytes are encoded (and compressed) before the clock
starts, so the figures are the server's. For 1 and 4 connections, bare and
compressed, it prints events/s (acked), MB/s of event payload (10^6 bytes)
and MB/s on the wire.

The last line printed is one JSON object with every figure. Nothing here
asserts speed; it is a measuring tool, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import platform
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import zlib
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from _common import free_port as _free_port  # shared with benchmarks/suite.py

WINDOW_EVENTS = 2048
"""Events per window: libbeat's default ``bulk_max_size``."""

EVENT_BYTES = 300
"""Target size of one JSON log event (a typical access-log line with metadata)."""

PIPELINING = 2
"""Windows in flight per connection before waiting for an ack: libbeat's default."""

COMPRESS_LEVEL = 3
"""libbeat's default ``compression_level``."""

DEFAULT_WINDOWS = 40
"""Windows per configuration (over all connections): about 82,000 events."""

QUICK_WINDOWS = 8

START_TIMEOUT_S = 30.0
IO_TIMEOUT_S = 60.0


def _event(n: int) -> bytes:
    """A Filebeat-like access-log event of about ``EVENT_BYTES``, with ids that do not
    compress (so zlib gets a realistic ratio, about 5:1, not the 15:1 of padding)."""
    ids = hashlib.sha256(n.to_bytes(8, "big")).hexdigest()
    doc = {
        "@timestamp": f"2026-11-22T03:{n // 60 % 60:02d}:{n % 60:02d}.{n % 1000:03d}Z",
        "host": {"name": f"web-{n % 16:02d}"},
        "log": {"file": {"path": "/var/log/nginx/access.log"}, "offset": n * 310},
        "trace": {"id": ids[:32]},
        "message": f"10.{n % 200}.{n % 250}.{n % 7} - - [22/Nov/2026:03:00:00 +0000] "
        f'"GET /api/v1/items/{ids[32:44]} HTTP/1.1" 200 {n % 9000} "-" "agent/{n % 97}"',
    }
    raw = json.dumps(doc, separators=(",", ":"))
    pad = max(0, EVENT_BYTES - len(raw) - 9)
    return (raw[:-1] + ',"pad":"' + ids[44:][:pad].ljust(pad, "-") + '"}').encode()


def _window(first: int, compressed: bool) -> tuple[bytes, int]:
    """One window's wire bytes and its payload bytes; seqs restart at 1 (libbeat)."""
    frames = []
    payload_bytes = 0
    for i in range(WINDOW_EVENTS):
        payload = _event(first + i)
        payload_bytes += len(payload)
        frames.append(b"2J" + struct.pack(">II", i + 1, len(payload)) + payload)
    body = b"".join(frames)
    head = b"2W" + struct.pack(">I", WINDOW_EVENTS)
    if compressed:
        packed = zlib.compress(body, COMPRESS_LEVEL)
        body = b"2C" + struct.pack(">I", len(packed)) + packed
    return head + body, payload_bytes


async def _connection(port: int, windows: list[bytes]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        in_flight = 0
        for data in windows:
            writer.write(data)
            await writer.drain()
            in_flight += 1
            while in_flight >= PIPELINING:
                await _read_ack(reader)
                in_flight -= 1
        while in_flight:
            await _read_ack(reader)
            in_flight -= 1
    finally:
        writer.close()
        await writer.wait_closed()


async def _read_ack(reader: asyncio.StreamReader) -> None:
    while True:
        frame = await asyncio.wait_for(reader.readexactly(6), IO_TIMEOUT_S)
        if frame[:2] != b"2A":
            raise RuntimeError(f"not an ack: {frame!r}")
        if struct.unpack(">I", frame[2:])[0] == WINDOW_EVENTS:
            return  # Ack(0) is a keepalive


@dataclass
class Result:
    compressed: bool
    connections: int
    events: int
    seconds: float
    events_per_s: float
    payload_mb_per_s: float
    wire_mb_per_s: float


async def _measure(port: int, compressed: bool, connections: int, total: int) -> Result:
    per_connection = [
        [_window((c * total + w) * WINDOW_EVENTS, compressed) for w in range(total // connections)]
        for c in range(connections)
    ]
    wire = sum(len(data) for windows in per_connection for data, _ in windows)
    payload = sum(size for windows in per_connection for _, size in windows)
    events = sum(len(windows) for windows in per_connection) * WINDOW_EVENTS
    started = time.perf_counter()
    await asyncio.gather(
        *(_connection(port, [data for data, _ in windows]) for windows in per_connection)
    )
    seconds = time.perf_counter() - started
    return Result(
        compressed,
        connections,
        events,
        round(seconds, 3),
        round(events / seconds),
        round(payload / seconds / 1e6, 2),
        round(wire / seconds / 1e6, 2),
    )


def _start_server(data_dir: Path, port: int, fsync: str) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "headrace", "serve", "--data-dir", str(data_dir)]
    command += ["--fsync", fsync, "--lumberjack-port", str(port), "--lumberjack-tls-port", "0"]
    for name in ("controller", "segment-store", "tank", "rsio", "http"):
        command += [f"--{name}-port", "0"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"headrace serve exited with {process.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return process
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError("headrace serve did not start listening")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few windows per configuration")
    parser.add_argument("--fsync", default="always", choices=["always", "interval", "never"])
    args = parser.parse_args()
    total = QUICK_WINDOWS if args.quick else DEFAULT_WINDOWS
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="lumberjack-bench-") as tmp:
        port = _free_port()
        process = _start_server(Path(tmp) / "data", port, args.fsync)
        try:
            for compressed in (False, True):
                for connections in (1, 4):
                    result = asyncio.run(_measure(port, compressed, connections, total))
                    results.append(result)
                    print(
                        f"{'compressed' if compressed else 'bare':>10} "
                        f"{connections} conn: {result.events_per_s:>9,} events/s "
                        f"{result.payload_mb_per_s:>7.2f} MB/s payload "
                        f"{result.wire_mb_per_s:>7.2f} MB/s wire",
                        flush=True,
                    )
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=START_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    figures = {
        "benchmark": "lumberjack_ingest",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "fsync": args.fsync,
        "window_events": WINDOW_EVENTS,
        "event_bytes": len(_event(0)),
        "pipelining": PIPELINING,
        "results": [asdict(r) for r in results],
    }
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
