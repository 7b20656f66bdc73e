"""``headrace serve`` as a real subprocess: start, readiness, clean stop on signals."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from headrace.server.config import DEFAULT_PORTS
from tests._server import FREE, ServerProcess, add_user

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 30.0


def _serve_command(data_dir: Path) -> list[str]:
    command = [sys.executable, "-m", "headrace", "serve", "--data-dir", str(data_dir)]
    for name in DEFAULT_PORTS:
        command += [f"--{name.replace('_', '-')}-port", "0"]
    return command


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_serve_stops_cleanly_on_signal(tmp_path: Path, signum: signal.Signals) -> None:
    data_dir = tmp_path / "data"
    server = ServerProcess(  # every listener off: the store alone starts and stops
        data_dir, ports={}, start_timeout_s=START_TIMEOUT_S, stop_timeout_s=STOP_TIMEOUT_S
    )
    with server:
        assert data_dir.is_dir() and any(data_dir.iterdir()), "the store was not created"
        code = server.stop(signum)
        server.wait_for_line("headrace stopped")  # its last words
        assert code == 0, server.log_tail()
    verify = subprocess.run(
        [sys.executable, "-m", "headrace", "verify", str(data_dir)],
        capture_output=True,
        text=True,
        timeout=STOP_TIMEOUT_S,
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_serve_makes_its_data_dir_private_whatever_the_umask(tmp_path: Path) -> None:
    """Every directory of the data dir is 0700 and every file 0600 (WAL, snapshot,
    manifest, segment data and sidecars, the lock, the token key), even when
    the server runs under umask 000 (docs/threat-model.md#trusted)."""
    data_dir = tmp_path / "data"
    passwords = tmp_path / "passwords"
    add_user(passwords, "admin", "long enough secret", "prn::/*,READ_UPDATE")
    old = os.umask(0)
    try:
        server = ServerProcess(
            data_dir,
            ports={"controller": FREE, "tank": FREE},
            args=["--auth-password-file", str(passwords)],
        )
        server.start()
    finally:
        os.umask(old)
    try:
        with socket.create_connection(("127.0.0.1", server.port_of("tank")), timeout=5):
            pass
    finally:
        assert server.stop() == 0, server.log_tail()
    modes = {path: stat.S_IMODE(path.lstat().st_mode) for path in [data_dir, *data_dir.rglob("*")]}
    assert data_dir / "auth-token.key" in modes and any(p.suffix == ".wal" for p in modes)
    assert any(p.suffix == ".data" for p in modes), sorted(modes)  # the controller's tables
    wrong = {
        str(path): oct(mode)
        for path, mode in modes.items()
        if mode != (0o700 if path.is_dir() else 0o600)
    }
    assert not wrong, wrong


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


def _processes_with(marker: str) -> list[int]:
    """Processes whose environment holds ``marker`` (the demo's children inherit it)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker.encode() in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue  # gone, or not ours to read
    return found


DEMO_SCRIPT = """
import atexit, os, sys
from pathlib import Path

def children():
    # The last exit handler to run (the first registered), as the process ends:
    # a child still here (Spark's JVM, the shipper) outlives the demo.
    kids = []
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        kids += (task / "children").read_text().split()
    print("children at exit:", sorted(kids), flush=True)

atexit.register(children)
from headrace.cli import main
main(["demo", *sys.argv[1:]])
"""


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_demo_summarises_every_shipped_event_once_and_cleans_up(tmp_path: Path) -> None:
    """``headrace demo`` as a person runs it: every event counted once, its Spark
    JVM and shipper waited for before it exits, nothing it started left."""
    marker = f"HEADRACE_DEMO_TEST_MARK={uuid.uuid4().hex}"
    env = {**os.environ, marker.split("=")[0]: marker.split("=")[1]}
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            DEMO_SCRIPT,
            "--events",
            "2000",
            "--minutes",
            "2",
            "--max-events-per-trigger",
            "1000",
            "--work-dir",
            str(tmp_path / "demo"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "shipped 2000 access-log events into logs/access" in out
    assert "summarised 2000 of 2000 events in 2 one-minute windows" in out
    assert "(the latest of each window agrees with Parquet)" in out
    # The table: one row per minute, 1,000 requests each (the generator is deterministic).
    assert [line.split("│")[2].strip() for line in out.splitlines() if "│ 03:0" in line] == [
        "1,000",
        "1,000",
    ]
    assert (tmp_path / "demo" / "summary.parquet").is_dir()
    assert (tmp_path / "demo" / "checkpoint" / "commits").is_dir()
    assert "children at exit: []" in out, out[-2000:]
    assert _processes_with(marker) == []
