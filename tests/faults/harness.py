"""The fault suite's harness: a restartable ``headrace serve`` on fixed ports,
three concurrent writers (the real Pravega client, the TANK client, pylogbeat)
that record exactly what was acknowledged, and offline read-back.

Every wait has a deadline; nothing sleeps to synchronise (the short sleeps
below are reconnect backoff against a server that is down, or port polling
under a deadline).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pylogbeat

from headrace.client.tank import TankClient
from headrace.errors import HeadraceError
from headrace.protocols.tank import BundleMessage, CreateTopicResult, decode_bundle
from tests._real_pravega import start_scenario
from tests._server import ServerProcess, free_port
from tests.lumberjack.harness import stored_events

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent

START_TIMEOUT_S = 60.0
"""Start-up includes recovery of everything written so far (on 2 busy cores)."""
STOP_TIMEOUT_S = 60.0
"""Bound on a SIGTERM'd server finishing its in-flight appends and closing."""
JOIN_TIMEOUT_S = 60.0
"""Bound on a writer finishing its current request after it was told to stop."""
VERIFY_TIMEOUT_S = 180.0
RECONNECT_BACKOFF_S = 0.05
"""Pause between reconnect attempts while the server is down (retry backoff)."""

LISTENERS = ("controller", "segment-store", "tank", "lumberjack", "rsio", "http")
PRAVEGA_SCOPE = "faults"
TANK_TOPIC = "faults_load"
TANK_STREAM = "tank/faults.load"  # topic "_" becomes "." in the stream name
TANK_BUNDLE = 20
"""Messages per produced bundle (one TANK acknowledgement)."""
BEATS_STREAM = "logs/beats"  # the Lumberjack front door's default target
BEATS_WINDOW = 50
"""Events per pylogbeat window (one Lumberjack acknowledgement)."""


# --------------------------------------------------------------------------- server


class FaultServer(ServerProcess):
    """``headrace serve`` (or a runner script) on ports fixed for its lifetime,
    so that clients reconnect to the same addresses after a restart."""

    def __init__(self, data_dir: Path, *, runner: list[str] | None = None) -> None:
        super().__init__(
            data_dir,
            ports={name: free_port() for name in LISTENERS},
            fsync="always" if runner is None else None,  # a runner takes port flags only
            runner=runner,
            start_timeout_s=START_TIMEOUT_S,
            stop_timeout_s=STOP_TIMEOUT_S,
        )

    def signal(self, signum: int) -> int | None:
        """Send ``signum`` and wait for the exit (SIGKILL after STOP_TIMEOUT_S);
        returns the exit code, None if it had to be killed."""
        return self.terminate(signum)


def run_verify(data_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "headrace", "verify", str(data_dir)],
        capture_output=True,
        text=True,
        timeout=VERIFY_TIMEOUT_S,
        cwd=ROOT,
    )


# --------------------------------------------------------------------------- writers


class Progress:
    """Acknowledgements counted over every writer; waits on it have deadlines."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.acks = 0

    def add(self) -> None:
        with self._cond:
            self.acks += 1
            self._cond.notify_all()

    def wait_for(self, target: int, timeout_s: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self.acks >= target, timeout_s)

    def wait_until(self, condition: Callable[[], bool], timeout_s: float) -> bool:
        """Wait until ``condition`` (read at each acknowledgement) holds."""
        with self._cond:
            return self._cond.wait_for(condition, timeout_s)


@dataclass
class WriterLog:
    """What one kind of writer sent and what the server acknowledged."""

    name: str
    acked: set[str] = field(default_factory=set)
    sent: int = 0
    failures: list[str] = field(default_factory=list)
    """Errors the client reported (expected around faults; each one ends a
    connection or a client, never an event's identity: nothing is resent)."""


class PravegaWriters:
    """The real Pravega writer in a child process; a new child (new tag) when
    one gives up, so that each event text is written by one writer only.
    ``scenario``: ``write`` (events ``<tag>:<n>``) or ``write_large``
    (``tests/_real_pravega.py``)."""

    def __init__(
        self, server: FaultServer, stream: str, progress: Progress, *, scenario: str = "write"
    ) -> None:
        self.server = server
        self.stream = stream
        self.scenario = scenario
        self.progress = progress
        self.log = WriterLog("pravega")
        self.generation = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._child: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            tag = f"p{self.generation}"
            self.generation += 1
            with self._lock:
                if self._stop.is_set():
                    return
                self._child = start_scenario(
                    self.scenario,
                    self.server.uri,
                    PRAVEGA_SCOPE,
                    self.stream,
                    tag,
                    check_server=False,  # a writer replaced while the server is down waits
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                )
            child = self._child
            assert child.stdout is not None
            acked = 0
            for raw in child.stdout:
                line = raw.decode().strip()
                if line.startswith("A "):
                    n = int(line[2:])
                    self.log.acked.update(f"{tag}:{i}" for i in range(acked, n))
                    self.log.sent = max(self.log.sent, n)
                    acked = n
                    self.progress.add()
                elif line.startswith("E "):
                    self.log.failures.append(f"{tag}: {line[2:]}")
            child.wait()
            child.stdout.close()
            if child.stdin is not None:
                with contextlib.suppress(OSError):  # the pipe broke with the child
                    child.stdin.close()
            if not self._stop.is_set() and child.returncode not in (0, 1):
                self.log.failures.append(f"{tag}: exit status {child.returncode}")
            if not self._stop.is_set():
                time.sleep(RECONNECT_BACKOFF_S)  # a new writer after one gave up

    def stop(self) -> None:
        """Close the child's stdin: it finishes its batch and exits; SIGKILL after
        JOIN_TIMEOUT_S (its acknowledgements so far are kept either way)."""
        with self._lock:
            self._stop.set()
            child = self._child
        if child is not None and child.stdin is not None:
            with contextlib.suppress(OSError):
                child.stdin.close()
            try:
                child.wait(timeout=JOIN_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.log.failures.append("a writer did not finish its batch in time")
                child.kill()
        self._thread.join(JOIN_TIMEOUT_S)
        assert not self._thread.is_alive(), "pravega writer thread hung"


class TankWriter:
    """TANK producer (headrace.client.tank) on its own event loop, one bundle
    of ``TANK_BUNDLE`` messages per request; reconnects after any failure and
    never resends (a new bundle gets new message texts)."""

    def __init__(self, server: FaultServer, progress: Progress) -> None:
        self.port = server.ports["tank"]
        self.progress = progress
        self.log = WriterLog("tank")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def start(self) -> None:
        self._thread.start()

    async def _run(self) -> None:
        client: TankClient | None = None
        created = False
        n = 0
        while not self._stop.is_set():
            try:
                if client is None:
                    client = await TankClient.connect(
                        "127.0.0.1", self.port, connect_timeout_s=5.0, request_timeout_s=30.0
                    )
                if not created:
                    result = await client.create_topic(TANK_TOPIC, 1)
                    assert result in (CreateTopicResult.CREATED, CreateTopicResult.ALREADY_EXISTS)
                    created = True
                ids = range(n, n + TANK_BUNDLE)
                n += TANK_BUNDLE
                self.log.sent = n
                await client.produce(
                    TANK_TOPIC, 0, [BundleMessage(f"t:{i}".encode(), 1, b"") for i in ids]
                )
                self.log.acked.update(f"t:{i}" for i in ids)
                self.progress.add()
            except (HeadraceError, OSError, TimeoutError) as exc:
                if client is not None:
                    self.log.failures.append(f"{type(exc).__name__}: {exc}")
                    await client.aclose()
                    client = None
                await asyncio.sleep(RECONNECT_BACKOFF_S)  # the server may be down
        if client is not None:
            await client.aclose()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(JOIN_TIMEOUT_S)
        assert not self._thread.is_alive(), "TANK writer hung"


class BeatWriter:
    """pylogbeat (a blocking v2 client) in a thread, one window of
    ``BEATS_WINDOW`` events per ``send``; a new connection after any failure,
    never a resend."""

    def __init__(self, server: FaultServer, progress: Progress) -> None:
        self.port = server.ports["lumberjack"]
        self.progress = progress
        self.log = WriterLog("lumberjack")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        beat: Any = None
        n = 0
        while not self._stop.is_set():
            try:
                if beat is None:
                    fresh = pylogbeat.PyLogBeatClient("127.0.0.1", self.port, timeout=30.0)
                    try:
                        fresh.connect()
                    except Exception:
                        _close_quietly(fresh)
                        raise
                    beat = fresh
                ids = range(n, n + BEATS_WINDOW)
                n += BEATS_WINDOW
                self.log.sent = n
                beat.send([{"id": f"l:{i}", "message": f"event {i}"} for i in ids])
                self.log.acked.update(f"l:{i}" for i in ids)
                self.progress.add()
            except Exception as exc:  # pylogbeat raises socket, struct and its own errors
                if beat is not None:
                    self.log.failures.append(f"{type(exc).__name__}: {exc}")
                    _close_quietly(beat)
                    beat = None
                time.sleep(RECONNECT_BACKOFF_S)  # the server may be down
        if beat is not None:
            beat.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(JOIN_TIMEOUT_S)
        assert not self._thread.is_alive(), "pylogbeat writer hung"


def _close_quietly(beat: Any) -> None:
    with contextlib.suppress(Exception):  # closing a broken connection may fail too
        beat.close()
    if beat._socket is not None:  # pylogbeat keeps a socket whose connect failed
        beat._socket.close()


# --------------------------------------------------------------------------- read back


def stored_pravega(data_dir: Path, stream: str) -> list[str]:
    events = stored_events(data_dir, f"{PRAVEGA_SCOPE}/{stream}")
    return [e.decode() for payloads in events.values() for e in payloads]


def stored_tank_bundles(data_dir: Path) -> list[list[str]]:
    """Each stored bundle's message texts (every bundle must decode whole)."""
    bundles = [b for payloads in stored_events(data_dir, TANK_STREAM).values() for b in payloads]
    return [[m.content.decode() for m in decode_bundle(b, 1)] for b in bundles]


def stored_beats(data_dir: Path) -> list[str]:
    events = stored_events(data_dir, BEATS_STREAM)
    return [str(json.loads(e)["id"]) for payloads in events.values() for e in payloads]


@dataclass
class Check:
    """Acknowledged events against what is stored."""

    name: str
    checked: int
    lost: list[str]
    duplicated: list[str]


def check(log: WriterLog, stored: list[str], *, unacked_at_most_once: bool = True) -> Check:
    counts = Counter(stored)
    lost = sorted(e for e in log.acked if counts[e] == 0)
    duplicated = sorted(e for e, c in counts.items() if c > 1) if unacked_at_most_once else []
    return Check(log.name, len(log.acked), lost, duplicated)
