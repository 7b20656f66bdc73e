"""A real ``python -m headrace serve`` (controller + segment store) for client tests.

The server runs in its own process on free ports, on the disk store in a
temporary directory; waits for its ports are bounded. Scenarios with the real
``pravega`` client run in child processes with a hard timeout (its blocking
calls hold the GIL and retry for about a minute against a dead server), see
``real_client.py``.
"""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from headrace.client import ControllerClient
from tests._server import PravegaServer, run_scenario

HERE = Path(__file__).resolve().parent
REAL_CLIENT = HERE / "real_client.py"

STARTUP_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0
SCENARIO_TIMEOUT_S = 90.0  # a failing real-client call retries ~61 s; a healthy scenario < 10 s


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

    def run_real_client(self, scenario: str, *args: str) -> dict[str, Any]:
        """Run a scenario of ``real_client.py`` in a child process; its last stdout line is JSON."""
        return run_scenario(REAL_CLIENT, scenario, self.uri, *args, timeout_s=SCENARIO_TIMEOUT_S)[0]


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
