"""File descriptors: a low open-file limit leaves the store working, and accept() backs off quietly.

The server shares its open-file limit out at start (a reserve, the store's
open data files and file regions, the rest for connections of every listener
together). Run under ``prlimit --nofile=256:256``, a TANK topic of 1000
partitions (1000 data files) and more connections than the limit allows must
leave the store working: produce and consume succeed, connections beyond the
share are refused, nothing is logged with a traceback. And when the process
runs out of descriptors anyway (the limit lowered under it), accept() backs
off with one log line, not a traceback a second, and serving resumes once
descriptors are free again.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import socket
from pathlib import Path

import pytest

from headrace.client.tank import TankClient
from headrace.protocols.tank import BundleMessage, CreateTopicResult
from tests._server import FREE, ServerProcess, ServerStartError

LOW_LIMIT = 256
PARTITIONS = 1000
WAIT_S = 30.0
TOPIC = "many"


class LimitedServer(ServerProcess):
    """``headrace serve`` started under ``prlimit --nofile=N:N``."""

    def __init__(self, data_dir: Path, limit: int) -> None:
        super().__init__(data_dir, ports={"tank": FREE, "http": FREE})
        self.limit = limit

    def command(self) -> list[str]:
        return ["prlimit", f"--nofile={self.limit}:{self.limit}", "--", *super().command()]


def _open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def _produce_and_consume(client: TankClient, partitions: range, tag: str) -> None:
    for partition in partitions:
        await client.produce(TOPIC, partition, [BundleMessage(f"{tag}-{partition}".encode())])
    for partition in partitions:
        result = await client.consume(TOPIC, partition, 0)
        values = [m.content for m in result.messages]
        assert f"{tag}-{partition}".encode() in values, (partition, values)


def _connect_many(port: int, count: int) -> list[socket.socket]:
    socks = []
    for _ in range(count):
        with contextlib.suppress(OSError):
            socks.append(socket.create_connection(("127.0.0.1", port), timeout=WAIT_S))
    return socks


@pytest.fixture
def server(tmp_path: Path) -> ServerProcess:
    return LimitedServer(tmp_path / "data", LOW_LIMIT)


def test_a_low_open_file_limit_leaves_the_store_working(server: ServerProcess) -> None:
    with server.start():
        assert server.process is not None
        pid = server.process.pid
        port = server.port_of("tank")

        async def scenario() -> None:
            async with await TankClient.connect("127.0.0.1", port) as client:
                result = await client.create_topic(TOPIC, PARTITIONS)
                assert result is CreateTopicResult.CREATED
                assert _open_fds(pid) < LOW_LIMIT
                spread = range(0, PARTITIONS, 7)  # reopens data files the caches closed
                await _produce_and_consume(client, spread, "before")
                # More connections than the limit leaves for them: the surplus is
                # refused, and the store goes on serving the connection it has.
                socks = await asyncio.to_thread(_connect_many, port, LOW_LIMIT)
                try:
                    await _produce_and_consume(client, spread, "after")
                finally:
                    for sock in socks:
                        sock.close()

        asyncio.run(asyncio.wait_for(scenario(), 2 * WAIT_S))
        log = server.log_text()
    assert "what the open-file limit allows" in log  # the surplus was refused
    assert "Traceback" not in log, log[-5000:]
    assert "I/O failure" not in log, log[-5000:]


def test_accept_backs_off_with_one_line_when_descriptors_run_out(tmp_path: Path) -> None:
    server = LimitedServer(tmp_path / "data", 1024)
    with server.start():
        assert server.process is not None
        pid = server.process.pid
        port = server.port_of("tank")

        async def scenario() -> None:
            async with await TankClient.connect("127.0.0.1", port) as client:
                assert await client.create_topic(TOPIC, 2) is CreateTopicResult.CREATED
                await client.produce(TOPIC, 0, [BundleMessage(b"first")])
                # The process has only a few descriptors left: accepts fail.
                resource.prlimit(pid, resource.RLIMIT_NOFILE, (_open_fds(pid) + 2, 1024))
                socks = await asyncio.to_thread(_connect_many, port, 20)
                try:
                    await asyncio.to_thread(server.wait_for_line, "accept() on", WAIT_S)
                    await asyncio.sleep(2.5)  # two more retries of the accept, failing again
                    # The store goes on for connections it has (cached files).
                    await client.produce(TOPIC, 0, [BundleMessage(b"second")])
                finally:
                    for sock in socks:
                        sock.close()
                    resource.prlimit(pid, resource.RLIMIT_NOFILE, (1024, 1024))
            # Descriptors are back: new connections are served again.
            async with await TankClient.connect("127.0.0.1", port) as client:
                await _produce_and_consume(client, range(2), "again")

        asyncio.run(asyncio.wait_for(scenario(), 2 * WAIT_S))
        log = server.log_text()
    backoff = [line for line in log.splitlines() if "accept() on" in line]
    assert len(backoff) == 1, backoff
    assert "Too many open files" in backoff[0]
    assert "Traceback" not in log, log[-5000:]


def test_a_limit_too_low_to_run_stops_the_start_with_one_line(tmp_path: Path) -> None:
    server = LimitedServer(tmp_path / "data", 64)
    with pytest.raises(ServerStartError):  # it exited instead of getting ready
        server.start()
    log = server.log_text()
    assert "the open-file limit is 64: headrace needs at least" in log, log
    assert "Traceback" not in log, log
