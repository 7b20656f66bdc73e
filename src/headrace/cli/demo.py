"""``headrace demo``: the reference pipeline, end to end on one machine.

1. An embedded headrace server (``ServerApp``) on a temporary data directory,
   listening on free loopback ports: controller, segment store, Lumberjack.
2. Web-server access logs shipped into stream ``logs/access`` over the
   Lumberjack v2 protocol (JSON documents ``{"message": line, "host": ...}``,
   pipelined windows, each acknowledged once stored): a deterministic
   generator of realistic Combined Log Format lines by default, or the lines
   of ``--logs FILE...``.
3. The PySpark Structured Streaming job of ``headrace.spark.pipeline``: parse,
   then per 1-minute window requests, bytes, status-class rates and top paths,
   with a checkpoint; results to stream ``logs/summary`` (exactly once) and to
   Parquet.
4. A table of the results and the end-to-end events/s. The server, Spark and
   the temporary directory are cleaned up on the way out; the exit status is 0
   only if every shipped event was counted exactly once.

This module and ``headrace.spark`` are the only ones that import pyspark.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import click

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

__all__ = ["demo", "generate_access_logs", "ship_lumberjack"]

SOURCE_STREAM = "logs/access"
SUMMARY_STREAM = "logs/summary"
WINDOW_EVENTS = 1000
"""Events per Lumberjack window (libbeat sends up to 2048)."""
WINDOWS_IN_FLIGHT = 2
"""Windows sent before waiting for the oldest ack (libbeat pipelines 2)."""
IO_TIMEOUT_S = 60.0
"""Longest wait for an ack or a connection; the server acks within its own 120 s."""
SERVER_TIMEOUT_S = 30.0
QUERY_POLL_S = 1
"""How often the progress display looks at the query (display only)."""
QUERY_TIMEOUT_S = 1800.0

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
    """``count`` Combined Log Format lines spread over ``minutes`` minutes (deterministic)."""
    rng = random.Random(seed)
    paths, path_w = zip(*PATHS, strict=True)
    statuses, status_w = zip(*STATUSES, strict=True)
    methods, method_w = zip(*METHODS, strict=True)
    step_s = minutes * 60 / max(count, 1)
    for i in range(count):
        at = START_TIME + timedelta(seconds=i * step_s)
        status = rng.choices(statuses, status_w)[0]
        size = 0 if status in (304, 301) else int(rng.lognormvariate(8, 1.2))
        client = f"10.{rng.randrange(256)}.{rng.randrange(256)}.{rng.randrange(1, 255)}"
        yield (
            f"{client} - - [{at.strftime('%d/%b/%Y:%H:%M:%S +0000')}] "
            f'"{rng.choices(methods, method_w)[0]} {rng.choices(paths, path_w)[0]} HTTP/1.1" '
            f'{status} {size} "-" "{rng.choice(AGENTS)}"'
        )


async def ship_lumberjack(host: str, port: int, lines: Sequence[str], progress: Any = None) -> int:
    """Send ``lines`` as Lumberjack v2 JSON documents; returns how many were acked.

    ``progress(n)`` is called with each acknowledged window's size.
    """
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), IO_TIMEOUT_S)
    conn = LumberjackConnection(Role.CLIENT, version=ProtocolVersion.V2)
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
                conn.send(JsonData(seq, json.dumps(doc).encode()))
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


def _read_lines(files: Sequence[Path]) -> list[str]:
    lines: list[str] = []
    for path in files:
        with path.open(encoding="utf-8", errors="replace") as f:
            lines.extend(line.rstrip("\n") for line in f if line.strip())
    return lines


def _spark_session(master: str) -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(master)
        .appName("headrace-demo")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _await(query: Any, timeout_s: int) -> bool:
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


def _run(work_dir: Path, lines: list[str], master: str, max_events: int, console: Any) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from headrace.spark.pipeline import start_summary_query

    # Spark first: its JVM is started by a fork of this process, and a fork while
    # gRPC's threads run (the embedded server's controller, our clients) can kill
    # the child before it execs (gRPC skips its fork handlers then, and the JVM
    # never starts). Nothing forks this process after this.
    spark_started = time.perf_counter()
    spark = _spark_session(master)
    spark_ready = time.perf_counter()
    server: _EmbeddedServer | None = None
    try:
        server = _EmbeddedServer(work_dir / "data")
        console.print(
            f"headrace server: controller {server.controller}, "
            f"Lumberjack 127.0.0.1:{server.ports['lumberjack']}, data in {work_dir / 'data'}"
        )
        columns = (
            TextColumn("{task.description:<28}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
        )
        started = time.perf_counter()
        with Progress(*columns, console=console, transient=False) as progress:
            task = progress.add_task("ship over Lumberjack", total=len(lines))
            acked = server.run(
                ship_lumberjack(
                    "127.0.0.1",
                    server.ports["lumberjack"],
                    lines,
                    lambda n: progress.advance(task, n),
                )
            )
        shipped_s = time.perf_counter() - started
        console.print(
            f"shipped {acked} access-log events into {SOURCE_STREAM} in {shipped_s:.1f} s "
            f"({acked / shipped_s:,.0f} events/s, each acknowledged once stored)"
        )

        processing = time.perf_counter()
        query = start_summary_query(
            spark,
            controller=server.controller,
            checkpoint=str(work_dir / "checkpoint"),
            parquet=str(work_dir / "summary.parquet"),
            source=SOURCE_STREAM,
            summary=SUMMARY_STREAM,
            max_events_per_trigger=max_events,
        )
        seen: dict[int, int] = {}  # micro-batch id -> input rows

        def show_progress(progress: Any, task: Any) -> None:
            for p in query.recentProgress:
                if p["batchId"] not in seen:
                    seen[p["batchId"]] = p["numInputRows"]
                    progress.advance(task, p["numInputRows"])

        with Progress(*columns, console=console, transient=False) as progress:
            task = progress.add_task("Spark: parse and summarise", total=len(lines))
            deadline = time.monotonic() + QUERY_TIMEOUT_S
            while not _await(query, QUERY_POLL_S):
                if time.monotonic() > deadline:
                    query.stop()
                    raise click.ClickException("the streaming query did not finish in time")
                show_progress(progress, task)
            show_progress(progress, task)
        if query.exception() is not None:
            raise click.ClickException(f"the streaming query failed: {query.exception()}")
        done = time.perf_counter()

        rows = spark.read.parquet(str(work_dir / "summary.parquet")).orderBy("window_start")
        rows = rows.collect()
        records = (
            spark.read.format("headrace")
            .option("controller", server.controller)
            .option("stream", SUMMARY_STREAM)
            .load()
            .select("key", "value", "partition", "offset")
            .collect()
        )
        published = len(records)
        _check_summary_stream(records, rows)
        days = sorted({r.window_start.strftime("%Y-%m-%d") for r in rows})
        table = Table(title=f"access logs per minute, {', '.join(days)} (UTC)")
        for name in ("minute", "requests", "MiB", "2xx", "3xx", "4xx", "5xx", "top paths"):
            table.add_column(name, justify="left" if name in ("minute", "top paths") else "right")
        for r in rows:
            table.add_row(
                r.window_start.strftime("%H:%M"),
                f"{r.requests:,}",
                f"{r.bytes / 2**20:.1f}",
                *(f"{getattr(r, f'rate_{c}xx'):.1%}" for c in (2, 3, 4, 5)),
                ", ".join(r.top_paths),
            )
        console.print(table)
        total = sum(r.requests for r in rows)
        elapsed = done - started
        batches = sum(1 for n in seen.values() if n)
        console.print(
            f"micro-batches: {batches}; summary records published to {SUMMARY_STREAM}: "
            f"{published} (the latest of each window agrees with Parquet); "
            f"Spark start {spark_ready - spark_started:.1f} s, "
            f"processing {done - processing:.1f} s"
        )
        console.print(
            f"summarised {total} of {acked} events in {len(rows)} one-minute windows; "
            f"end to end {elapsed:.1f} s, {acked / elapsed:,.0f} events/s"
        )
        if total != acked:
            raise click.ClickException(f"the summary counts {total} requests, {acked} were shipped")
    finally:
        spark.stop()
        if server is not None:
            server.close()


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
    default=25_000,
    show_default=True,
    help="Events per micro-batch.",
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
    if work_dir is not None:
        work_dir.mkdir(parents=True, exist_ok=True)
        _run(work_dir, lines, master, max_events_per_trigger, console)
        return
    with tempfile.TemporaryDirectory(prefix="headrace-demo-") as tmp:
        _run(Path(tmp), lines, master, max_events_per_trigger, console)
