"""A throwaway ZooKeeper for the cluster benchmark (not a benchmark itself).

The Debian ``zookeeper`` package's server, started as ``tests/_zookeeper.py``
starts it (benchmarks do not import the tests): a standalone server in a
child JVM on a free loopback port, its data in a directory of the caller's,
serving once it answers the ``srvr`` four-letter command.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from _common import free_port

JAR = Path("/usr/share/java/zookeeper.jar")
LOG_BINDING_JAR = Path("/usr/share/java/slf4j-simple.jar")
MAIN_CLASS = "org.apache.zookeeper.server.ZooKeeperServerMain"
JVM_OPTIONS = ("-Xmx128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto")
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0


def installed() -> bool:
    return JAR.is_file() and shutil.which("java") is not None


class ZooKeeper:
    """``start()``, ``url(chroot)``, ``stop()``."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self._process: subprocess.Popen[bytes] | None = None

    def url(self, chroot: str) -> str:
        return f"zk://127.0.0.1:{self.port}{chroot}"

    def start(self) -> float:
        """Start and wait until it serves; the seconds that took."""
        began = time.monotonic()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        config = self.data_dir / "zoo.cfg"
        config.write_text(
            f"tickTime=2000\ndataDir={self.data_dir / 'data'}\nclientPort={self.port}\n"
            "clientPortAddress=127.0.0.1\nmaxClientCnxns=0\nadmin.enableServer=false\n"
            "4lw.commands.whitelist=srvr\n"
        )
        classpath = os.pathsep.join(str(p) for p in (JAR, LOG_BINDING_JAR) if p.exists())
        with (self.data_dir / "zookeeper.log").open("ab") as log:
            self._process = subprocess.Popen(
                ["java", *JVM_OPTIONS, "-cp", classpath, MAIN_CLASS, str(config)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        while time.monotonic() < began + START_TIMEOUT_S:
            if self._process.poll() is not None:
                break
            if self._serving():
                return time.monotonic() - began
            time.sleep(0.05)  # polling a port under a deadline
        self.stop()
        raise SystemExit(f"ZooKeeper did not start; see {self.data_dir / 'zookeeper.log'}")

    def _serving(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), 1.0) as sock:
                sock.settimeout(1.0)
                sock.sendall(b"srvr")
                reply = b""
                while chunk := sock.recv(4096):
                    reply += chunk
        except OSError:
            return False
        return reply.startswith(b"Zookeeper version")

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
