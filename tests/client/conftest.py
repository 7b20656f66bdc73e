"""A real ``python -m headrace serve`` (controller + segment store) for client tests.

The server runs in its own process on free ports, on the disk store in a
temporary directory; waits for its ports are bounded. Scenarios with the real
``pravega`` client run in child processes with a hard timeout (its blocking
calls hold the GIL and retry for about a minute against a dead server), see
``real_client.py``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from headrace.client import ControllerClient

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
REAL_CLIENT = HERE / "real_client.py"

STARTUP_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0
SCENARIO_TIMEOUT_S = 90.0  # a failing real-client call retries ~61 s; a healthy scenario < 10 s


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Server:
    """``python -m headrace serve`` with the controller and segment-store listeners."""

    def __init__(self, data_dir: Path, *, fsync: str = "never") -> None:
        self.data_dir = data_dir
        self.fsync = fsync
        self.controller_port = free_port()
        self.segment_store_port = free_port()
        self.uri = f"tcp://127.0.0.1:{self.controller_port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self._stderr_text = ""
        self.start()

    def start(self) -> None:
        # HEADRACE_TEST_SERVER_SRC runs the server from another source tree (for
        # example a snapshot of the last commit while the work tree is mid-change).
        src = os.environ.get("HEADRACE_TEST_SERVER_SRC", str(ROOT / "src"))
        env = {**os.environ, "PYTHONPATH": src}
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed in stop)
        args = [sys.executable, "-m", "headrace", "serve", "--data-dir", str(self.data_dir)]
        args += ["--fsync", self.fsync, "--controller-port", str(self.controller_port)]
        args += ["--segment-store-port", str(self.segment_store_port)]
        for name in ["tank", "lumberjack", "lumberjack-tls", "rsio", "http"]:
            args += [f"--{name}-port", "0"]
        self.proc = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=self._stderr, env=env, cwd=ROOT
        )
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        for port in (self.controller_port, self.segment_store_port):
            self._wait_connectable(port, deadline)

    def _wait_connectable(self, port: int, deadline: float) -> None:
        assert self.proc is not None
        while self.proc.poll() is None:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                    return
            except OSError:
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.05)  # polling a port under a deadline, not synchronisation
        self.stop()
        raise AssertionError(f"server did not start: {self.stderr()}")

    def kill(self) -> None:
        """SIGKILL: no chance to flush or close anything."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=STOP_TIMEOUT_S)
        self._collect()

    def stop(self) -> None:
        """SIGTERM (graceful), SIGKILL if that takes too long."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=STOP_TIMEOUT_S)
        self._collect()

    def _collect(self) -> None:
        if not self._stderr.closed:
            self._stderr.seek(0)
            self._stderr_text += self._stderr.read().decode(errors="replace")
            self._stderr.close()

    def stderr(self) -> str:
        return self._stderr_text

    def run_real_client(self, scenario: str, *args: str) -> dict[str, Any]:
        """Run a scenario of ``real_client.py`` in a child process; its last stdout line is JSON."""
        done = subprocess.run(
            [sys.executable, str(REAL_CLIENT), scenario, self.uri, *args],
            capture_output=True,
            timeout=SCENARIO_TIMEOUT_S,
            text=True,
        )
        # The result counts, not the exit code: the client can crash after its
        # work was printed.
        lines = done.stdout.strip().splitlines()
        try:
            result: dict[str, Any] = json.loads(lines[-1])
        except (IndexError, ValueError):
            raise AssertionError(
                f"{scenario} printed no result (exit code {done.returncode}):\n"
                f"{done.stderr[-4000:]}"
            ) from None
        return result


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
