"""A real ``headrace serve`` for the RS-IO tests, and helpers to fill streams.

One server process per test module (starting one costs about a second); each
test uses its own streams. Streams are created and written through the
Pravega front door with the client library, so every RS-IO read here is of
events another protocol wrote.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from headrace.client import PravegaClient
from headrace.client.controller import ScalingPolicy, StreamConfig
from tests._server import FREE, ServerProcess

START_TIMEOUT_S = 30.0
WAIT_S = 20.0
"""Bound on every wait in these tests."""


class Server(ServerProcess):
    """``headrace serve`` with RS-IO, the Pravega front doors, TANK and HTTP on free ports."""

    def __init__(self, data_dir: Path, *extra: str) -> None:
        listeners = ["rsio", "controller", "segment_store", "tank", "http"]
        super().__init__(
            data_dir,
            ports=dict.fromkeys(listeners, FREE),
            args=extra,
            start_timeout_s=START_TIMEOUT_S,
            stop_timeout_s=WAIT_S,
        )

    @property
    def rsio_port(self) -> int:
        return self.port_of("rsio")

    @property
    def controller_port(self) -> int:
        return self.port_of("controller")

    @property
    def tank_port(self) -> int:
        return self.port_of("tank")

    @property
    def http_port(self) -> int:
        return self.port_of("http")

    @property
    def controller_uri(self) -> str:
        return self.uri


def start_server(data_dir: Path, *extra: str) -> Server:
    return Server(data_dir, *extra).start()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("rsio-data"))
    yield srv
    stop(srv)


def stop(srv: Server) -> None:
    srv.stop()


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
