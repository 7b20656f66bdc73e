"""A real ``python -m headrace serve`` (controller + segment store) for client tests.

The server runs in its own process on free ports, on the disk store in a
temporary directory; waits for its ports are bounded. Scenarios with the real
``pravega`` client run in child processes with a hard timeout
(``tests/_real_pravega.py``).
"""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from headrace.client import ControllerClient
from tests._server import PravegaServer

STARTUP_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0


class Server(PravegaServer):
    """``python -m headrace serve`` with the controller and segment-store listeners."""

    def __init__(self, data_dir: Path, *, fsync: str = "never") -> None:
        super().__init__(
            data_dir, fsync=fsync, start_timeout_s=STARTUP_TIMEOUT_S, stop_timeout_s=STOP_TIMEOUT_S
        )

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self.process

    def stderr(self) -> str:
        return self.log_text()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(tmp_path_factory.mktemp("headrace") / "data")
    yield srv
    srv.stop()
    assert srv.proc is not None and srv.proc.returncode == 0, srv.stderr()


@pytest.fixture
async def controller(server: Server) -> AsyncIterator[ControllerClient]:
    async with ControllerClient(server.uri) as client:
        yield client
