"""A real ``headrace serve`` for the RS-IO tests, and helpers to fill streams.

One server process per test module (starting one costs about a second); each
test uses its own streams. Streams are created and written through the
Pravega front door with the client library, so every RS-IO read here is of
events another protocol wrote.
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from headrace.client import PravegaClient
from headrace.client.controller import ScalingPolicy, StreamConfig

START_TIMEOUT_S = 30.0
WAIT_S = 20.0
"""Bound on every wait in these tests."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Server:
    process: subprocess.Popen[str]
    rsio_port: int
    controller_port: int
    tank_port: int
    http_port: int
    lines: queue.Queue[str]
    pump: threading.Thread

    @property
    def controller_uri(self) -> str:
        return f"tcp://127.0.0.1:{self.controller_port}"


def start_server(data_dir: Path, *extra: str) -> Server:
    rsio_port, controller_port, store_port = free_port(), free_port(), free_port()
    tank_port, http_port = free_port(), free_port()
    command = [
        sys.executable, "-m", "headrace", "serve",
        "--data-dir", str(data_dir),
        "--rsio-port", str(rsio_port),
        "--controller-port", str(controller_port),
        "--segment-store-port", str(store_port),
        "--tank-port", str(tank_port),
        "--lumberjack-port", "0", "--lumberjack-tls-port", "0", "--http-port", str(http_port),
        *extra,
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEADRACE_")}
    process = subprocess.Popen(
        command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env
    )
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            lines.put(line)
        lines.put("")

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    seen = []
    while True:
        line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        seen.append(line)
        if "headrace ready" in line:
            return Server(process, rsio_port, controller_port, tank_port, http_port, lines, thread)
        if not line or time.monotonic() > deadline:
            process.kill()
            raise AssertionError("headrace serve did not start:\n" + "".join(seen))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("rsio-data"))
    yield srv
    stop(srv)


def stop(srv: Server) -> None:
    srv.process.send_signal(signal.SIGTERM)
    try:
        srv.process.wait(timeout=WAIT_S)
    except subprocess.TimeoutExpired:
        srv.process.kill()
        srv.process.wait()
    srv.pump.join(WAIT_S)
    assert srv.process.stderr is not None
    srv.process.stderr.close()


@pytest.fixture
async def pravega(server: Server) -> AsyncIterator[PravegaClient]:
    client = PravegaClient(server.controller_uri)
    yield client
    await client.aclose()


_counter = iter(range(1_000_000))


async def new_stream(client: PravegaClient, segments: int = 1) -> tuple[str, str]:
    """A fresh stream in scope ``rsio`` with ``segments`` fixed segments."""
    scope, stream = "rsio", f"s{next(_counter)}-{os.getpid()}"
    await client.controller.create_scope(scope)
    policy = ScalingPolicy(min_num_segments=segments)
    await client.controller.create_stream(scope, stream, StreamConfig(scaling=policy))
    return scope, stream


async def write_events(
    client: PravegaClient, scope: str, stream: str, events: list[bytes], key: str | None = None
) -> None:
    writer = await client.create_writer(scope, stream)
    try:
        for event in events:
            await writer.write(event, key)
        await writer.flush()
    finally:
        await writer.aclose()
