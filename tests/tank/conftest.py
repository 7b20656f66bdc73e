"""A real ``headrace serve`` subprocess for the TANK tests, on a free port.

Every wait has a deadline; stopping is SIGTERM (clean) or SIGKILL (crash).
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 30.0
OTHER_LISTENERS = ("controller", "segment-store", "lumberjack", "lumberjack-tls", "rsio", "http")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class TankServer:
    """One ``python -m headrace serve`` process serving TANK on ``port``."""

    def __init__(
        self, data_dir: Path, *, pravega: bool = False, extra_args: tuple[str, ...] = ()
    ) -> None:
        self.data_dir = data_dir
        self.extra_args = extra_args
        self.pravega = pravega  # also serve the controller and segment store
        self.port = 0
        self.controller_port = 0
        self.process: subprocess.Popen[str] | None = None
        self.stderr: list[str] = []
        self._lines: queue.Queue[str] = queue.Queue()
        self._pump_thread = threading.Thread()

    def start(self) -> None:
        self.port = free_port()
        command = [sys.executable, "-m", "headrace", "serve", "--data-dir", str(self.data_dir)]
        command += ["--tank-port", str(self.port)]
        others = dict.fromkeys(OTHER_LISTENERS, 0)
        if self.pravega:
            self.controller_port = others["controller"] = free_port()
            others["segment-store"] = free_port()
        for name, port in others.items():
            command += [f"--{name}-port", str(port)]
        command += self.extra_args
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.process = subprocess.Popen(
            command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env
        )
        self._lines = queue.Queue()
        self._pump_thread = threading.Thread(
            target=self._pump, args=(self.process, self._lines), daemon=True
        )
        self._pump_thread.start()
        self._wait_for("headrace ready", START_TIMEOUT_S)

    @staticmethod
    def _pump(process: subprocess.Popen[str], lines: queue.Queue[str]) -> None:
        assert process.stderr is not None
        for line in process.stderr:
            lines.put(line)
        lines.put("")

    def _wait_for(self, needle: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                line = self._lines.get(timeout=remaining)
            except queue.Empty:
                break
            if not line:
                break
            self.stderr.append(line)
            if needle in line:
                return
        self.kill()
        pytest.fail(f"no {needle!r} from headrace serve; stderr: {''.join(self.stderr)}")

    def stop(self) -> None:
        """SIGTERM and wait for a clean exit."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=STOP_TIMEOUT_S)
        self._release()
        assert code == 0, "".join(self.stderr)

    def kill(self) -> None:
        """SIGKILL: a crash."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=STOP_TIMEOUT_S)
        self._release()

    def _release(self) -> None:
        if self.process is not None and self.process.stderr is not None:
            self._pump_thread.join(timeout=STOP_TIMEOUT_S)
            self.process.stderr.close()


@contextlib.contextmanager
def running_server(
    data_dir: Path, *, pravega: bool = False, extra_args: tuple[str, ...] = ()
) -> Iterator[TankServer]:
    server = TankServer(data_dir, pravega=pravega, extra_args=extra_args)
    server.start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TankServer]:
    with running_server(tmp_path_factory.mktemp("tank") / "data") as srv:
        yield srv
