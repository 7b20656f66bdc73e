"""One ``headrace serve`` and one Spark session for every Spark test.

The server runs in its own process on free ports (controller, segment store,
TANK, Lumberjack) on a temporary data directory, so Spark's Python workers,
which are separate processes, reach it the way executors reach a real
server. The Spark session is ``local[2,3]`` (two threads; a failed task is
retried, up to 3 attempts) with 2 shuffle partitions, started once for the
run: it costs seconds, every test after the first reuses it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import sys
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from headrace.client import PravegaClient, ScalingPolicy, StreamConfig
from tests._server import FREE, ServerProcess

STARTUP_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0
LUMBERJACK_STREAM = "logs/access"

T = TypeVar("T")
_names = itertools.count()


class Server(ServerProcess):
    """``python -m headrace serve`` with the listeners the Spark tests use."""

    def __init__(self, data_dir: Path) -> None:
        listeners = ["controller", "segment_store", "tank", "lumberjack"]
        super().__init__(
            data_dir,
            ports=dict.fromkeys(listeners, FREE),
            fsync="never",
            args=["--lumberjack-stream", LUMBERJACK_STREAM],
            wait_for=listeners,
            start_timeout_s=STARTUP_TIMEOUT_S,
            stop_timeout_s=STOP_TIMEOUT_S,
        )
        self.start()

    def stderr(self) -> str:
        return self.log_text()

    def run(self, work: Callable[[PravegaClient], Awaitable[T]]) -> T:
        """Run ``work`` with a fresh client (closed afterwards) and return its result."""

        async def main() -> T:
            async with PravegaClient(self.uri) as client:
                return await work(client)

        return asyncio.run(main())

    def create_stream(self, scope: str, stream: str, segments: int = 2) -> None:
        async def work(client: PravegaClient) -> None:
            await client.controller.create_scope(scope)
            config = StreamConfig(ScalingPolicy.fixed(segments))
            await client.controller.create_stream(scope, stream, config)

        self.run(work)

    def write(self, scope: str, stream: str, events: list[tuple[str | None, bytes]]) -> None:
        """Write ``(routing key, event)`` pairs through the Pravega client and flush."""

        async def work(client: PravegaClient) -> None:
            async with await client.create_writer(scope, stream) as writer:
                for key, event in events:
                    await writer.write(event, key)
                await writer.flush()

        self.run(work)


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    with tempfile.TemporaryDirectory(prefix="headrace-spark-") as tmp:
        srv = Server(Path(tmp) / "data")
        try:
            yield srv
        finally:
            srv.stop()


_started: list[object] = []
"""The run's Spark session, once started (``_start_spark``)."""


def _start_spark() -> object:
    """The run's Spark session: started on the first call, the same one after."""
    if _started:
        return _started[0]
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2,3]")
        .appName("headrace-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    _started.append(session)
    return session


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start Spark before any test runs, if a selected test needs it.

    PySpark launches its JVM with a ``preexec_fn``, so the pytest process
    forks. Forking after earlier tests have used gRPC in this process (every
    ``PravegaClient``) forks while gRPC's threads may be busy, the race that
    made the demo fail with ``JAVA_GATEWAY_EXITED`` (CHANGELOG). Here no test
    has run yet. A failure to start is left to the ``spark`` fixture, which
    tries again and reports it on the tests that need it.
    """
    if session.config.option.collectonly:
        return
    if any("spark" in getattr(item, "fixturenames", ()) for item in session.items):
        with contextlib.suppress(Exception):
            _start_spark()


def pytest_sessionfinish() -> None:
    """Stop the Spark session, if one was started, and its JVM (which would
    otherwise outlive the run)."""
    from headrace.spark import local

    while _started:
        local.stop(_started.pop())  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def spark() -> object:
    return _start_spark()


def stream_suffix() -> str:
    """A name part no other test uses (one server serves the whole run)."""
    return f"{next(_names)}-{os.getpid()}"


@pytest.fixture
def stream_name() -> str:
    return f"s{stream_suffix()}"
