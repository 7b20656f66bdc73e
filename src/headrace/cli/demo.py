"""``headrace demo``: the reference pipeline, end to end on one machine.

1. An embedded headrace server (``ServerApp``) on a temporary data directory,
   listening on free loopback ports: controller, segment store, Lumberjack.
2. The PySpark Structured Streaming job of ``headrace.spark.pipeline``,
   started first and running: parse, then per 1-minute window requests,
   bytes, status-class rates and top paths, with a checkpoint; results to
   stream ``logs/summary`` (exactly once) and to Parquet.
3. Once the query is started and warmed up (``_warm_up``), web-server
   access logs shipped into stream ``logs/access`` over the Lumberjack v2
   protocol by a shipper process (``headrace.cli._shipper``; JSON documents
   ``{"message": line, "host": ...}``, pipelined windows, each acknowledged
   once stored) while the query runs: a
   deterministic generator of realistic Combined Log Format lines by
   default, or the lines of ``--logs FILE...``.
4. Once every event is summarised, a table of the results and the
   end-to-end events/s (first event shipped to last event summarised). The
   server, the shipper, Spark (its JVM and every process it started) and the
   temporary directory are cleaned up on the way out; the exit status is 0 only if
   every shipped event was counted exactly once.

This module and ``headrace.spark`` are the only ones that import pyspark.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import click
import msgspec

from headrace.protocols.lumberjack import (
    Ack,
    ConnectionClosed,
    JsonData,
    LumberjackConnection,
    ProtocolVersion,
    Role,
    WindowSize,
)
from headrace.server.app import ServerApp
from headrace.server.config import DEFAULT_PORTS, ServerConfig
from headrace.server.lumberjack_config import STREAM_SEGMENT_COUNT

__all__ = ["DemoRun", "demo", "generate_access_logs", "run_demo", "ship_lumberjack"]

SOURCE_STREAM = "logs/access"
SUMMARY_STREAM = "logs/summary"
WARM_UP_STREAM = "logs/warm-up"
"""Events read once before the query starts, to start Spark's Python workers."""
WARM_UP_EVENTS = 16
"""Events per core written to ``WARM_UP_STREAM`` (by routing key: most segments get some)."""
WINDOW_EVENTS = 1000
"""Events per Lumberjack window (libbeat sends up to 2048)."""
WINDOWS_IN_FLIGHT = 2
"""Windows sent before waiting for the oldest ack (libbeat pipelines 2)."""
IO_TIMEOUT_S = 60.0
"""Longest wait for an ack or a connection; the server acks within its own 120 s."""
SERVER_TIMEOUT_S = 30.0
QUERY_POLL_S = 1
"""How often the progress display looks at the query (display only)."""
QUERY_START_TIMEOUT_S = 300.0
"""Longest wait for the streaming query to start and look for data."""
QUERY_TIMEOUT_S = 1800.0
"""Longest wait for the query to summarise everything shipped."""
IDLE_POLL_S = 0.1
"""How often the demo looks whether the query has finished its trigger, before stopping it."""
TRIGGER_INTERVAL = "1 second"
"""Micro-batch interval while events arrive (a micro-batch that takes longer
is followed at once by the next)."""
MAX_EVENTS_PER_TRIGGER = 250_000
"""Default cap on a micro-batch: larger ones spread Spark's fixed cost per
micro-batch over more events, smaller ones show progress more often."""
GENERATE_CHUNK = 10_000
"""Lines whose random fields are drawn at once by the generator."""
SHIPPER_START_TIMEOUT_S = 120.0
"""Longest wait for the shipper process to read its lines (it does while Spark starts)."""
SHIPPER_EXIT_TIMEOUT_S = 10.0
"""How long the shipper process gets to exit once told there is nothing to ship."""

PATHS = [
    ("/", 30),
    ("/index.html", 12),
    ("/products", 10),
    ("/products/42", 6),
    ("/products/7", 5),
    ("/cart", 6),
    ("/checkout", 3),
    ("/api/v1/search", 9),
    ("/api/v1/items", 8),
    ("/static/app.js", 7),
    ("/static/style.css", 7),
    ("/favicon.ico", 4),
    ("/login", 3),
    ("/admin", 1),
]
STATUSES = [(200, 80), (304, 8), (301, 2), (404, 6), (403, 1), (500, 2), (503, 1)]
METHODS = [("GET", 90), ("POST", 8), ("HEAD", 2)]
AGENTS = [
    "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0",
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 14_6) AppleWebKit/605.1.15 Safari/605.1.15",
    "curl/8.5.0",
    "Googlebot/2.1 (+http://www.google.com/bot.html)",
]
HOSTS = [f"web-{n}" for n in range(1, 5)]
START_TIME = datetime(2026, 11, 22, 3, 0, 0, tzinfo=UTC)


def generate_access_logs(count: int, *, minutes: int = 10, seed: int = 7) -> Iterator[str]:
    """``count`` Combined Log Format lines spread over ``minutes`` minutes (deterministic).

    Draws the random fields ``GENERATE_CHUNK`` lines at a time and formats
    each second's time once: a million lines take seconds, not a minute.
    """
    rng = random.Random(seed)
    paths, path_w = zip(*PATHS, strict=True)
    statuses, status_w = zip(*STATUSES, strict=True)
    methods, method_w = zip(*METHODS, strict=True)
    step_s = minutes * 60 / max(count, 1)
    stamps: dict[int, str] = {}
    for first in range(0, count, GENERATE_CHUNK):
        n = min(GENERATE_CHUNK, count - first)
        chunk_paths = rng.choices(paths, path_w, k=n)
        chunk_statuses = rng.choices(statuses, status_w, k=n)
        chunk_methods = rng.choices(methods, method_w, k=n)
        for i in range(n):
            second = int((first + i) * step_s)
            stamp = stamps.get(second)
            if stamp is None:
                at = START_TIME + timedelta(seconds=second)
                stamp = stamps[second] = at.strftime("%d/%b/%Y:%H:%M:%S +0000")
            status = chunk_statuses[i]
            size = 0 if status in (304, 301) else int(rng.lognormvariate(8, 1.2))
            ip = rng.getrandbits(24)
            yield (
                f"10.{ip >> 16}.{(ip >> 8) & 255}.{(ip & 255) % 254 + 1} - - [{stamp}] "
                f'"{chunk_methods[i]} {chunk_paths[i]} HTTP/1.1" '
                f'{status} {size} "-" "{AGENTS[ip % len(AGENTS)]}"'
            )


async def ship_lumberjack(host: str, port: int, lines: Sequence[str], progress: Any = None) -> int:
    """Send ``lines`` as Lumberjack v2 JSON documents; returns how many were acked.

    ``progress(n)`` is called with each acknowledged window's size.
    """
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), IO_TIMEOUT_S)
    conn = LumberjackConnection(Role.CLIENT, version=ProtocolVersion.V2)
    encode = msgspec.json.Encoder().encode
    sizes: list[int] = []
    acked = 0

    async def wait_acks(keep: int) -> None:
        nonlocal acked
        while conn.unacked_windows > keep:
            data = await asyncio.wait_for(reader.read(65536), IO_TIMEOUT_S)
            conn.receive_data(data)
            for event in conn.events():
                if isinstance(event, ConnectionClosed):
                    raise click.ClickException("the server closed the Lumberjack connection")
                assert isinstance(event, Ack)
            while len(sizes) > conn.unacked_windows:
                done = sizes.pop(0)
                acked += done
                if progress is not None:
                    progress(done)

    try:
        for first in range(0, len(lines), WINDOW_EVENTS):
            window = lines[first : first + WINDOW_EVENTS]
            conn.send(WindowSize(len(window)))
            for seq, line in enumerate(window, 1):
                doc = {"message": line, "host": HOSTS[(first + seq) % len(HOSTS)]}
                conn.send(JsonData(seq, encode(doc)))
            sizes.append(len(window))
            writer.write(conn.data_to_send())
            await writer.drain()
            await wait_acks(WINDOWS_IN_FLIGHT - 1)
        await wait_acks(0)
    finally:
        writer.close()
        await writer.wait_closed()
    return acked


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class _EmbeddedServer:
    """A ``ServerApp`` running on its own event loop in a thread."""

    def __init__(self, data_dir: Path) -> None:
        ports = {name: 0 for name in DEFAULT_PORTS}
        for name in ("controller", "segment_store", "lumberjack"):
            ports[name] = _free_port()
        config = ServerConfig(data_dir=data_dir, ports=ports)
        config.lumberjack = replace(config.lumberjack, stream=SOURCE_STREAM)
        self.app = ServerApp(config)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="headrace-server")
        self.thread.start()
        self._call(self.app.start())
        self.ports = self.app.ports
        self.controller = f"tcp://127.0.0.1:{self.ports['controller']}"

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(SERVER_TIMEOUT_S)

    def run(self, coro: Any) -> Any:
        return self._call(coro)

    def close(self) -> None:
        try:
            self._call(self.app.aclose())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(SERVER_TIMEOUT_S)
            self.loop.close()


class _Shipper:
    """The log shipper, ``headrace.cli._shipper``, in a process of its own (as a
    Beat is), and the acknowledgements it reports.

    The lines go to it in a file, one a line (the generator's lines and a
    file's hold no newline), which it reads before it is told the port, so
    that shipping starts with the lines in memory on both sides. A thread reads
    what it reports; ``close`` ends it if it is still running.
    """

    def __init__(self, work_dir: Path, lines: Sequence[str]) -> None:
        log = work_dir / "access.log"
        log.write_text("\n".join(lines), encoding="utf-8")
        self.errors = work_dir / "shipper.err"
        self.acked = 0
        self.total: int | None = None
        self.ready = threading.Event()
        self.done = threading.Event()
        self._started = False
        with self.errors.open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "headrace.cli._shipper", str(log)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )
        self._reader = threading.Thread(target=self._read, name="headrace-shipper", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            word = line.strip()
            if word == "ready":
                self.ready.set()
            elif word.startswith("done "):
                self.total = int(word.split()[1])
            elif word.isdigit():
                self.acked += int(word)
        self.ready.set()
        self.done.set()

    def _failure(self) -> click.ClickException:
        text = self.errors.read_text(errors="replace").strip().splitlines()
        return click.ClickException(
            f"the log shipper failed: {text[-1] if text else f'exit status {self.proc.poll()}'}"
        )

    def start(self, port: int) -> None:
        """Wait for the shipper to hold its lines, then tell it the Lumberjack port."""
        if not self.ready.wait(SHIPPER_START_TIMEOUT_S) or self.done.is_set():
            raise self._failure()
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{port}\n")
        self.proc.stdin.flush()
        self._started = True

    def result(self) -> int:
        """The events acknowledged, once ``done`` is set."""
        if self.total is None:
            raise self._failure()
        return self.total

    def close(self) -> None:
        """End the process (told there is nothing to ship, then killed) and wait for it."""
        if self._started and not self.done.is_set():
            self.proc.kill()  # stopped halfway (the query failed): nothing to wait for
        with contextlib.suppress(OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        try:
            self.proc.wait(SHIPPER_EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(SHIPPER_EXIT_TIMEOUT_S)
        self._reader.join(SHIPPER_EXIT_TIMEOUT_S)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def _read_lines(files: Sequence[Path]) -> list[str]:
    lines: list[str] = []
    for path in files:
        with path.open(encoding="utf-8", errors="replace") as f:
            lines.extend(line.rstrip("\n") for line in f if line.strip())
    return lines


def _spark_session(master: str) -> Any:
    from headrace.spark import local

    return local.session(master, "headrace-demo")


def _warm_up(spark: Any, server: _EmbeddedServer, scratch: str) -> None:
    """``pipeline.warm_up`` on a stream of its own: a few events in each of its
    segments, as many as Spark's cores."""
    from headrace.spark import _connect
    from headrace.spark.pipeline import warm_up

    cores = spark.sparkContext.defaultParallelism
    _connect.ensure_stream(server.controller, WARM_UP_STREAM, cores)
    scope, stream = WARM_UP_STREAM.split("/")

    async def write(client: Any) -> None:
        writer = await client.create_writer(scope, stream)
        try:
            for n in range(WARM_UP_EVENTS * cores):
                await writer.write(b"warm-up", routing_key=str(n))
            await writer.flush()
        finally:
            await writer.aclose()

    _connect.run(server.controller, write)
    warm_up(spark, server.controller, WARM_UP_STREAM, scratch)


def _await(query: Any, timeout_s: float) -> bool:
    """Wait for the query to end; a failed query becomes a short error message."""
    from pyspark.errors import StreamingQueryException

    try:
        return bool(query.awaitTermination(timeout_s))
    except StreamingQueryException as exc:
        lines = [line for line in str(exc).splitlines() if line.strip()]
        raise click.ClickException(f"the streaming query failed: {' '.join(lines[-3:])}") from None


def _check_summary_stream(records: Sequence[Any], rows: Sequence[Any]) -> None:
    """The latest record of each window in the summary stream (a window's
    records share a routing key, so they are in order in one segment) must
    match the window's row in Parquet (Spark gives naive UTC times: the demo's
    session time zone is UTC)."""
    latest: dict[datetime, dict[str, Any]] = {}
    for rec in sorted(records, key=lambda r: (r.partition, r.offset)):
        doc = json.loads(bytes(rec.value))
        start = datetime.fromisoformat(doc["window_start"]).astimezone(UTC).replace(tzinfo=None)
        latest[start] = doc
    if len(latest) != len(rows):
        raise click.ClickException(
            f"{SUMMARY_STREAM} has {len(latest)} windows, the Parquet summary {len(rows)}"
        )
    for r in rows:
        rec = latest.get(r.window_start)
        if rec is None or rec["requests"] != r.requests or rec["bytes"] != r.bytes:
            raise click.ClickException(
                f"{SUMMARY_STREAM} disagrees with the Parquet summary for {r.window_start}: {rec}"
            )


@dataclass
class DemoRun:
    """What one run measured: counts, and seconds from ``time.perf_counter``."""

    shipped: int = 0
    summarised: int = 0
    windows: int = 0
    micro_batches: int = 0
    published: int = 0
    spark_start_s: float = 0.0
    query_start_s: float = 0.0
    ship_s: float = 0.0
    end_to_end_s: float = 0.0
    rows: list[Any] = field(default_factory=list)

    @property
    def events_per_s(self) -> float:
        return self.shipped / self.end_to_end_s if self.end_to_end_s else 0.0


class _QueryWatch:
    """Input rows of a running query's micro-batches, from its progress reports."""

    def __init__(self, query: Any) -> None:
        self.query = query
        self.batches: dict[tuple[int, str], int] = {}  # (batch id, time) -> input rows

    def poll(self) -> int:
        """New input rows since the last call (raises if the query failed)."""
        if self.query.exception() is not None:
            raise click.ClickException(f"the streaming query failed: {self.query.exception()}")
        new = 0
        for p in self.query.recentProgress:
            key = (p["batchId"], p["timestamp"])
            if key not in self.batches:
                self.batches[key] = p["numInputRows"]
                new += p["numInputRows"]
        return new

    def reached(self, end: dict[str, int]) -> bool:
        """Whether the query has processed every segment up to ``end`` (segment -> offset)."""
        last = self.query.lastProgress
        if last is None:
            return False
        offsets = last["sources"][0]["endOffset"]
        if isinstance(offsets, str):
            offsets = json.loads(offsets)
        done = (offsets or {}).get(SOURCE_STREAM, {})
        return all(done.get(seg, -1) >= off for seg, off in end.items())

    def wait_ready(self, deadline: float) -> None:
        """Wait (until ``deadline``, ``time.monotonic``) for the query's first look
        for data: its source is then open and its first trigger done, so the
        query is running, waiting for events."""
        while time.monotonic() < deadline:
            status = self.query.status
            if not status["isTriggerActive"] and status["message"].startswith("Waiting"):
                return
            _await(self.query, IDLE_POLL_S)
        raise click.ClickException("the streaming query did not start in time")

    def wait_idle(self, deadline: float) -> None:
        """Wait (until ``deadline``, ``time.monotonic``) for the query to finish its
        current trigger (after the last data, a micro-batch without data moves the
        watermark on), so that stopping it interrupts nothing."""
        while self.query.status["isTriggerActive"] and time.monotonic() < deadline:
            _await(self.query, IDLE_POLL_S)
        self.poll()

    @property
    def rows(self) -> int:
        return sum(self.batches.values())

    @property
    def micro_batches(self) -> int:
        return sum(1 for n in self.batches.values() if n)


def _run(
    work_dir: Path,
    lines: list[str],
    master: str,
    max_events: int,
    console: Any,
    *,
    show: bool = True,
) -> DemoRun:
    """The demo: Spark, the server, the query, shipping; returns what it measured.

    The query runs while the events are shipped, as a streaming job does: a
    micro-batch every ``TRIGGER_INTERVAL`` with what has arrived. Once every
    event is acknowledged and counted in a micro-batch, the query stops.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from headrace.spark import _connect, _positions, local
    from headrace.spark.pipeline import start_summary_query

    run = DemoRun()
    # The shipper and Spark first: each is a process started by a fork of this
    # one, and a fork while gRPC's threads run (the embedded server's
    # controller, our clients) can kill the child before it execs (gRPC skips
    # its fork handlers then, and the JVM never starts). Nothing forks this
    # process after this.
    shipper = _Shipper(work_dir, lines)
    spark: Any = None
    server: _EmbeddedServer | None = None
    try:
        spark_started = time.perf_counter()
        spark = _spark_session(master)
        run.spark_start_s = time.perf_counter() - spark_started
        server = _EmbeddedServer(work_dir / "data")
        console.print(
            f"headrace server: controller {server.controller}, "
            f"Lumberjack 127.0.0.1:{server.ports['lumberjack']}, data in {work_dir / 'data'}"
        )
        _connect.ensure_stream(server.controller, SOURCE_STREAM, STREAM_SEGMENT_COUNT)
        query_started = time.perf_counter()
        query = start_summary_query(
            spark,
            controller=server.controller,
            checkpoint=str(work_dir / "checkpoint"),
            parquet=str(work_dir / "summary.parquet"),
            source=SOURCE_STREAM,
            summary=SUMMARY_STREAM,
            max_events_per_trigger=max_events,
            available_now=False,
            processing_time=TRIGGER_INTERVAL,
        )
        watch = _QueryWatch(query)
        watch.wait_ready(time.monotonic() + QUERY_START_TIMEOUT_S)
        # Last, so that the Python workers it starts are not idle long enough
        # for Spark to end them before the first events arrive.
        _warm_up(spark, server, str(work_dir / "warm-up.parquet"))
        run.query_start_s = time.perf_counter() - query_started
        columns = (
            TextColumn("{task.description:<28}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
        )
        try:
            with Progress(*columns, console=console, transient=not show) as progress:
                shipping = progress.add_task("ship over Lumberjack", total=len(lines))
                summarising = progress.add_task("Spark: parse and summarise", total=len(lines))
                started = time.perf_counter()
                shipper.start(server.ports["lumberjack"])
                deadline = time.monotonic() + QUERY_TIMEOUT_S
                while not shipper.done.wait(QUERY_POLL_S):
                    if time.monotonic() > deadline:
                        raise click.ClickException("shipping did not finish in time")
                    progress.update(shipping, completed=shipper.acked)
                    progress.advance(summarising, watch.poll())
                run.shipped = shipper.result()
                run.ship_s = time.perf_counter() - started
                progress.update(shipping, completed=shipper.acked)
                end = _positions.latest(server.controller, [SOURCE_STREAM])[SOURCE_STREAM]
                while not watch.reached(end):
                    if time.monotonic() > deadline:
                        raise click.ClickException("the streaming query did not finish in time")
                    _await(query, QUERY_POLL_S)
                    progress.advance(summarising, watch.poll())
                run.end_to_end_s = time.perf_counter() - started
                progress.advance(summarising, watch.poll())
                watch.wait_idle(deadline)
        finally:
            query.stop()
        run.micro_batches = watch.micro_batches
        console.print(
            f"shipped {run.shipped} access-log events into {SOURCE_STREAM} in {run.ship_s:.1f} s "
            f"({run.shipped / run.ship_s:,.0f} events/s, each acknowledged once stored)"
        )

        rows = spark.read.parquet(str(work_dir / "summary.parquet")).orderBy("window_start")
        run.rows = rows.collect()
        records = (
            spark.read.format("headrace")
            .option("controller", server.controller)
            .option("stream", SUMMARY_STREAM)
            .load()
            .select("key", "value", "partition", "offset")
            .collect()
        )
        run.published = len(records)
        _check_summary_stream(records, run.rows)
        run.summarised = sum(r.requests for r in run.rows)
        run.windows = len(run.rows)
        if show:
            _show(console, run)
        if run.summarised != run.shipped:
            raise click.ClickException(
                f"the summary counts {run.summarised} requests, {run.shipped} were shipped"
            )
        return run
    finally:
        shipper.close()
        if spark is not None:
            local.stop(spark)
        if server is not None:
            server.close()


def _show(console: Any, run: DemoRun) -> None:
    from rich.table import Table

    days = sorted({r.window_start.strftime("%Y-%m-%d") for r in run.rows})
    table = Table(title=f"access logs per minute, {', '.join(days)} (UTC)")
    for name in ("minute", "requests", "MiB", "2xx", "3xx", "4xx", "5xx", "top paths"):
        table.add_column(name, justify="left" if name in ("minute", "top paths") else "right")
    for r in run.rows:
        table.add_row(
            r.window_start.strftime("%H:%M"),
            f"{r.requests:,}",
            f"{r.bytes / 2**20:.1f}",
            *(f"{getattr(r, f'rate_{c}xx'):.1%}" for c in (2, 3, 4, 5)),
            ", ".join(r.top_paths),
        )
    console.print(table)
    console.print(
        f"micro-batches: {run.micro_batches}; summary records published to {SUMMARY_STREAM}: "
        f"{run.published} (the latest of each window agrees with Parquet); "
        f"Spark start {run.spark_start_s:.1f} s, query start {run.query_start_s:.1f} s"
    )
    console.print(
        f"summarised {run.summarised} of {run.shipped} events in {run.windows} one-minute "
        f"windows; end to end (first event shipped to last event summarised) "
        f"{run.end_to_end_s:.1f} s, {run.events_per_s:,.0f} events/s"
    )


@click.command()
@click.option(
    "--events",
    type=click.IntRange(1, 100_000_000),
    default=100_000,
    show_default=True,
    help="Access-log events to generate (ignored with --logs).",
)
@click.option(
    "--minutes",
    type=click.IntRange(1, 1440),
    default=10,
    show_default=True,
    help="Minutes of log time the generated events span.",
)
@click.option(
    "--logs",
    "log_files",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    multiple=True,
    help="Ship the lines of these access-log files instead.",
)
@click.option("--master", default="local[2]", show_default=True, help="Spark master.")
@click.option(
    "--max-events-per-trigger",
    type=click.IntRange(1),
    default=MAX_EVENTS_PER_TRIGGER,
    show_default=True,
    help="Most events per micro-batch (each takes what has arrived, up to this).",
)
@click.option(
    "--work-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Keep the data, checkpoint and Parquet here (default: a temporary directory).",
)
def demo(
    events: int,
    minutes: int,
    log_files: tuple[Path, ...],
    master: str,
    max_events_per_trigger: int,
    work_dir: Path | None,
) -> None:
    """Run the reference pipeline: Lumberjack -> headrace -> Spark -> summary."""
    from rich.console import Console

    console = Console(width=None if sys.stdout.isatty() else 120)
    if log_files:
        lines = _read_lines(log_files)
    else:
        lines = list(generate_access_logs(events, minutes=minutes))
    if not lines:
        raise click.ClickException("no log lines to ship")
    run_demo(
        lines, master=master, max_events=max_events_per_trigger, work_dir=work_dir, console=console
    )


def run_demo(
    lines: list[str],
    *,
    master: str = "local[2]",
    max_events: int = MAX_EVENTS_PER_TRIGGER,
    work_dir: Path | None = None,
    console: Any = None,
    show: bool = True,
) -> DemoRun:
    """Run the demo on ``lines`` (in a temporary directory unless ``work_dir``
    is given); ``show`` prints the progress and the results table.

    Raises:
        click.ClickException: the query failed, or the results do not count
            every shipped event exactly once.
    """
    if console is None:
        from rich.console import Console

        console = Console(quiet=not show)
    if work_dir is not None:
        work_dir.mkdir(parents=True, exist_ok=True)
        return _run(work_dir, lines, master, max_events, console, show=show)
    with tempfile.TemporaryDirectory(prefix="headrace-demo-") as tmp:
        return _run(Path(tmp), lines, master, max_events, console, show=show)
