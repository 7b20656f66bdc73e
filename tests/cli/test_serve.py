"""``headrace serve`` as a real subprocess: start, readiness, clean stop on signals."""

from __future__ import annotations

import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from headrace.server.config import DEFAULT_PORTS

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 30.0


def _serve_command(data_dir: Path) -> list[str]:
    command = [sys.executable, "-m", "headrace", "serve", "--data-dir", str(data_dir)]
    for name in DEFAULT_PORTS:
        command += [f"--{name.replace('_', '-')}-port", "0"]
    return command


def _stderr_lines(process: subprocess.Popen[str]) -> tuple[queue.Queue[str], threading.Thread]:
    """Pump the child's stderr into a queue, so that every wait can have a deadline."""
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            lines.put(line)
        lines.put("")  # EOF

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    return lines, thread


def _wait_for_line(
    process: subprocess.Popen[str], pending: queue.Queue[str], needle: str, timeout_s: float
) -> list[str]:
    """Take stderr lines until one contains ``needle``; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    lines: list[str] = []
    while (remaining := deadline - time.monotonic()) > 0:
        try:
            line = pending.get(timeout=remaining)
        except queue.Empty:
            break
        if not line:
            break
        lines.append(line)
        if needle in line:
            return lines
    process.kill()
    process.wait(timeout=STOP_TIMEOUT_S)
    pytest.fail(f"no {needle!r} from headrace serve; stderr so far: {''.join(lines)}")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_serve_stops_cleanly_on_signal(tmp_path: Path, signum: signal.Signals) -> None:
    data_dir = tmp_path / "data"
    process = subprocess.Popen(
        _serve_command(data_dir), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
    )
    pending, pump = _stderr_lines(process)
    try:
        _wait_for_line(process, pending, "headrace ready", START_TIMEOUT_S)
        assert data_dir.is_dir() and any(data_dir.iterdir()), "the store was not created"
        process.send_signal(signum)
        rest = _wait_for_line(process, pending, "headrace stopped", STOP_TIMEOUT_S)
        assert process.wait(timeout=STOP_TIMEOUT_S) == 0, "".join(rest)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=STOP_TIMEOUT_S)
        pump.join(timeout=STOP_TIMEOUT_S)  # EOF follows the exit at once
        assert process.stderr is not None
        process.stderr.close()
    verify = subprocess.run(
        [sys.executable, "-m", "headrace", "verify", str(data_dir)],
        capture_output=True,
        text=True,
        timeout=STOP_TIMEOUT_S,
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_serve_rejects_an_out_of_range_port(tmp_path: Path) -> None:
    result = subprocess.run(
        [*_serve_command(tmp_path / "data"), "--tank-port", "70000"],
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
    )
    assert result.returncode == 2
    assert "--tank-port" in result.stderr
    assert not (tmp_path / "data").exists()


def test_demo_reads_back_every_event_after_a_restart(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "headrace",
            "demo",
            "--data-dir",
            str(tmp_path / "demo"),
            "--segments",
            "2",
            "--writers",
            "3",
            "--events",
            "600",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "read back all 600 events after a restart" in result.stdout
