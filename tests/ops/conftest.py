"""A real ``python -m headrace serve`` for operations tests: free ports, bounded waits.

``start_serve`` runs the server in its own process with every listener off
unless asked for, waits (bounded) for its ``headrace ready`` line, and keeps
stderr in a file so tests can read the log lines (``access_records``,
``wait_for_access``).
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from headrace.server.config import DEFAULT_PORTS
from tests._server import ServerProcess, server_env
from tests._server import free_port as free_port  # the tests here import it from this module
from tests._server import serve_command as serve_command

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0
WAIT_S = 10.0  # bound on every other wait in these tests

run_env = server_env  # the test run's environment minus HEADRACE_*, importing this tree


class Serve(ServerProcess):
    """One ``headrace serve`` process; ``ports`` are those its ready line lists."""

    def __init__(self, tmp_path: Path, args: list[str], env: dict[str, str] | None) -> None:
        number = len(list(tmp_path.glob("serve-*.log")))
        self.stderr_path = tmp_path / f"serve-{number}.log"
        super().__init__(
            tmp_path / f"data-{number}",
            args=args,
            env=env,
            cwd=tmp_path,
            log_path=self.stderr_path,
            start_timeout_s=START_TIMEOUT_S,
            stop_timeout_s=STOP_TIMEOUT_S,
        )
        self.start()

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
