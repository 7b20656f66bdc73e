"""A real ``python -m headrace serve`` for operations tests: free ports, bounded waits.

``start_serve`` runs the server in its own process with every listener off
unless asked for, waits (bounded) for its ``headrace ready`` line, and keeps
stderr in a file so tests can read the log lines (``access_lines``).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from headrace.server.config import DEFAULT_PORTS

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0
WAIT_S = 10.0  # bound on every other wait in these tests


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def serve_command(data_dir: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "headrace", "serve", "--data-dir", str(data_dir), *args]


def run_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEADRACE_")}
    env["PYTHONPATH"] = str(ROOT / "src")
    env.update(extra or {})
    return env


class Serve:
    """One ``headrace serve`` process."""

    def __init__(self, tmp_path: Path, args: list[str], env: dict[str, str] | None) -> None:
        number = len(list(tmp_path.glob("serve-*.log")))
        self.stderr_path = tmp_path / f"serve-{number}.log"
        self._stderr = self.stderr_path.open("wb")
        self.proc = subprocess.Popen(
            serve_command(tmp_path / f"data-{number}", *args),
            stdout=subprocess.DEVNULL,
            stderr=self._stderr,
            env=run_env(env),
            cwd=tmp_path,
        )
        self.ports = self._wait_ready()

    def _wait_ready(self) -> dict[str, int]:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and self.proc.poll() is None:
            for line in self.stderr_path.read_text().splitlines():
                if "headrace ready" in line:
                    listed = line.partition("listeners: ")[2]
                    return {
                        name: int(port)
                        for name, _, port in (item.partition("=") for item in listed.split(", "))
                        if port
                    }
            time.sleep(0.05)  # polling a file under a deadline, not synchronisation
        self.stop()
        pytest.fail(f"headrace serve did not start: {self.stderr_path.read_text()}")

    def get(self, path: str) -> tuple[int, str]:
        url = f"http://127.0.0.1:{self.ports['http']}{path}"
        try:
            with urllib.request.urlopen(url, timeout=WAIT_S) as response:
                return int(response.status), response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def metric(self, name: str, **labels: str) -> float:
        """The value of one sample of ``/metrics`` (0 if absent)."""
        from prometheus_client.parser import text_string_to_metric_families

        _, text = self.get("/metrics")
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(
                    sample.labels.get(k) == v for k, v in labels.items()
                ):
                    return float(sample.value)
        return 0.0

    def log_lines(self) -> list[str]:
        return self.stderr_path.read_text().splitlines()

    def access_lines(self) -> list[dict[str, Any]]:
        """The ``headrace.access`` records so far (the server runs with --log-format json)."""
        found = []
        for line in self.log_lines():
            if line.startswith("{"):
                record = json.loads(line)
                if record.get("logger") == "headrace.access":
                    found.append(record)
        return found

    def wait_access(self, **fields: object) -> dict[str, Any]:
        """The first access record with ``fields``; fail after ``WAIT_S``."""
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            for record in self.access_lines():
                if all(record.get(k) == v for k, v in fields.items()):
                    return record
            time.sleep(0.05)  # polling a log file under a deadline, not synchronisation
        pytest.fail(f"no access line with {fields}: {self.access_lines()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=STOP_TIMEOUT_S)
        self._stderr.close()


def listener_args(**ports: int) -> list[str]:
    """Port flags: the given listeners on their ports, every other one off."""
    args: list[str] = []
    for name in DEFAULT_PORTS:
        args += [f"--{name.replace('_', '-')}-port", str(ports.get(name, 0))]
    return args


@pytest.fixture
def start_serve(tmp_path: Path) -> Iterator[Any]:
    started: list[Serve] = []

    def start(*args: str, env: dict[str, str] | None = None) -> Serve:
        serve = Serve(tmp_path, list(args), env)
        started.append(serve)
        return serve

    yield start
    for serve in started:
        serve.stop()
