"""Hostile clients that try to make the server hold memory, alone and all at once.

One real ``headrace serve`` per case, with a stream and a TANK topic holding
data, is attacked by clients that each stay within every per-connection limit:

* **frame headers**: many segment-store connections announce a 16 MiB frame
  and send nothing more;
* **RS-IO at demand 0**: subscriptions to a stream with lots of data that
  never ask for an element;
* **readers that do not read**: Pravega connections that pipeline
  ``ReadSegment`` requests and TANK connections that pipeline consumes, and
  never read a reply (their receive buffers are small);
* **all at once**.

Throughout, a thread samples the server every ``SAMPLE_INTERVAL_S``: its
resident memory (``VmRSS``, and the peak ``VmHWM`` at the end) must stay
under ``RSS_LIMIT_BYTES``, and ``GET /health`` must answer within
``HEALTH_LIMIT_S`` (all but ``SLOW_PROBES_ALLOWED`` of the probes, and every
one within ``PROBE_TIMEOUT_S``). The attack sizes are parameters
(``Attack``), chosen so that each case runs in seconds and that, unbounded,
each attack would hold well over the limit. Each case has a server of its
own, holding only the data its attack reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from headrace.client import PravegaClient
from headrace.client.controller import ScalingPolicy, StreamConfig
from headrace.client.tank import TankClient
from headrace.protocols import pravega as p
from headrace.protocols import tank as t
from headrace.protocols.rsio import Subscribe, encode_frame
from tests._server import FREE, ServerProcess, memory_kib, reset_memory_peak
from tests.raw_pravega import RawPravega, large_frame_header

MIB = 1024 * 1024
RSS_LIMIT_BYTES = 1024 * MIB
"""The server's resident memory must stay under this whatever the attack."""
HEALTH_LIMIT_S = 0.1
"""A ``/health`` probe must be answered within this."""
SLOW_PROBES_ALLOWED = 0.1
"""The fraction of probes that may take longer (never over ``PROBE_TIMEOUT_S``):
the attacking clients, the prober and the server share the machine's CPUs (two
on the CI machines), so the scheduler holds the server up now and then, attack
or not; a bounded server answers nine probes in ten in time and none late."""
SAMPLE_INTERVAL_S = 0.05
PROBE_TIMEOUT_S = 1.0
"""Bound on one probe (a slower answer is a failure, not a hang)."""
HOLD_S = 4.0
"""How long the attack is held while the server is watched."""
WAIT_S = 30.0
SCOPE, STREAM, TOPIC = "hostile", "data", "hostile"
SEGMENT = f"{SCOPE}/{STREAM}/0.#epoch.0"
EVENT_BYTES = 512 * 1024
STREAM_EVENTS = 96
"""48 MiB in the stream, read by the RS-IO subscribers and the Pravega readers."""
BUNDLES = 48
"""48 MiB in the TANK partition, read by the TANK consumers."""
SMALL_RCVBUF = 4096
"""A client that does not read: the kernel holds little for it, the server the rest."""
RSIO_HELLO = bytes.fromhex("03010000")


@dataclass(frozen=True)
class Attack:
    """How many hostile clients of each kind (0: none)."""

    frame_headers: int = 0
    rsio_subscribers: int = 0
    rsio_subscriptions_each: int = 0
    pravega_readers: int = 0
    reads_each: int = 0
    tank_consumers: int = 0
    consumes_each: int = 0


ATTACKS = {
    "frame-headers": Attack(frame_headers=200),  # unbounded: 200 x 16 MiB
    "rsio-demand-zero": Attack(rsio_subscribers=20, rsio_subscriptions_each=8),
    "readers-not-reading": Attack(
        pravega_readers=20, reads_each=48, tank_consumers=20, consumes_each=8
    ),
    "all-at-once": Attack(
        frame_headers=200,
        rsio_subscribers=20,
        rsio_subscriptions_each=8,
        pravega_readers=20,
        reads_each=48,
        tank_consumers=20,
        consumes_each=8,
    ),
}


@dataclass
class Watch:
    """What the watching thread saw."""

    max_rss_bytes: int = 0
    health_s: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


@contextlib.contextmanager
def watching(pid: int, http_port: int) -> Iterator[Watch]:
    """Sample memory and ``/health`` every ``SAMPLE_INTERVAL_S`` until the block ends."""
    watch = Watch()
    stop = threading.Event()
    url = f"http://127.0.0.1:{http_port}/health"

    def run() -> None:
        while not stop.is_set():
            try:
                watch.max_rss_bytes = max(watch.max_rss_bytes, memory_kib(pid, "VmRSS") * 1024)
            except (OSError, AssertionError) as exc:
                watch.failures.append(f"memory: {exc}")
            started = time.monotonic()
            try:
                with urllib.request.urlopen(url, timeout=PROBE_TIMEOUT_S) as response:
                    response.read()
                watch.health_s.append(time.monotonic() - started)
            except OSError as exc:
                watch.failures.append(f"/health: {exc}")
            stop.wait(SAMPLE_INTERVAL_S)

    thread = threading.Thread(target=run, name="watch", daemon=True)
    thread.start()
    try:
        yield watch
    finally:
        stop.set()
        thread.join(PROBE_TIMEOUT_S + 1)


async def _fill_stream(server: ServerProcess) -> None:
    """The stream the RS-IO subscribers and the Pravega readers read."""
    client = PravegaClient(server.uri)
    try:
        await client.controller.create_scope(SCOPE)
        config = StreamConfig(scaling=ScalingPolicy(min_num_segments=1))
        await client.controller.create_stream(SCOPE, STREAM, config)
        writer = await client.create_writer(SCOPE, STREAM)
        try:
            for i in range(STREAM_EVENTS):
                await writer.write(bytes([i % 256]) * EVENT_BYTES)
            await writer.flush()
        finally:
            await writer.aclose()
    finally:
        await client.aclose()


async def _fill_topic(server: ServerProcess) -> None:
    """The TANK partition the TANK consumers read."""
    async with await TankClient.connect("127.0.0.1", server.port_of("tank")) as tank:
        assert await tank.create_topic(TOPIC, 1) is t.CreateTopicResult.CREATED
        for i in range(BUNDLES):
            await tank.produce(TOPIC, 0, [t.BundleMessage(bytes([i % 256]) * MIB)])


def _not_reading(port: int) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SMALL_RCVBUF)
    sock.settimeout(WAIT_S)
    sock.connect(("127.0.0.1", port))
    return sock


def _attack(server: ServerProcess, attack: Attack) -> list[socket.socket]:
    """Open every hostile connection of ``attack``; they are held until closed."""
    socks: list[socket.socket] = []
    for _ in range(attack.frame_headers):
        raw = RawPravega(server.port_of("segment_store"))
        raw.sock.sendall(large_frame_header(16 * MIB - 100))
        socks.append(raw.sock)
    name = f"{SCOPE}/{STREAM}"
    for _ in range(attack.rsio_subscribers):
        sock = _not_reading(server.port_of("rsio"))
        subscribes = b"".join(
            encode_frame(Subscribe(name, sid, 0))
            for sid in range(1, attack.rsio_subscriptions_each + 1)
        )
        sock.sendall(RSIO_HELLO + subscribes)
        socks.append(sock)
    for _ in range(attack.pravega_readers):
        sock = _not_reading(server.port_of("segment_store"))
        conn = p.PravegaConnection(p.Role.CLIENT)
        for i in range(attack.reads_each):
            conn.send(p.ReadSegment(SEGMENT, i * MIB, MIB, "", i + 1))
        sock.sendall(conn.data_to_send())
        socks.append(sock)
    for _ in range(attack.tank_consumers):
        sock = _not_reading(server.port_of("tank"))
        tank = t.TankConnection(t.Role.CLIENT)
        for i in range(attack.consumes_each):
            wanted = (t.ConsumePartition(0, 0, 64 * MIB),)
            tank.send(t.Consume(i + 1, (t.ConsumeTopic(TOPIC, wanted),), 0, 0))
        sock.sendall(tank.data_to_send())
        socks.append(sock)
    return socks


@pytest.mark.parametrize("attack", list(ATTACKS.values()), ids=list(ATTACKS))
def test_hostile_clients_leave_the_server_bounded_and_responsive(
    tmp_path: Path, attack: Attack
) -> None:
    ports = dict.fromkeys(("controller", "segment_store", "tank", "rsio", "http"), FREE)
    with ServerProcess(tmp_path / "data", ports=ports) as server:
        if attack.rsio_subscribers or attack.pravega_readers:
            asyncio.run(asyncio.wait_for(_fill_stream(server), WAIT_S))
        if attack.tank_consumers:
            asyncio.run(asyncio.wait_for(_fill_topic(server), WAIT_S))
        _watch_attack(server, attack)


def _watch_attack(server: ServerProcess, attack: Attack) -> None:
    """Hold ``attack`` against ``server`` while watching it; check what was seen."""
    assert server.process is not None
    pid = server.process.pid
    reset_memory_peak(pid)
    socks: list[socket.socket] = []
    try:
        with watching(pid, server.port_of("http")) as watch:
            socks = _attack(server, attack)
            time.sleep(HOLD_S)  # the attack held while the watcher samples
            # A well-behaved client is still served.
            with RawPravega(server.port_of("segment_store")) as raw:
                assert isinstance(raw.request(p.KeepAlive()), p.KeepAlive)
                if attack.rsio_subscribers or attack.pravega_readers:  # the stream is there
                    reply = raw.request(p.ReadSegment(SEGMENT, 0, 1000, "", 1))
                    assert isinstance(reply, p.SegmentRead), reply
        peak = memory_kib(pid, "VmHWM") * 1024
    finally:
        for sock in socks:
            sock.close()
    assert not watch.failures, watch.failures[:5]
    assert watch.health_s, "no /health probe ran"
    slow = [round(s, 3) for s in watch.health_s if s >= HEALTH_LIMIT_S]
    assert len(slow) <= SLOW_PROBES_ALLOWED * len(watch.health_s), (
        f"{len(slow)} of {len(watch.health_s)} probes over {HEALTH_LIMIT_S} s: {slow}"
    )
    assert watch.max_rss_bytes < RSS_LIMIT_BYTES, watch.max_rss_bytes / MIB
    assert peak < RSS_LIMIT_BYTES, f"peak {peak / MIB:.0f} MiB"
    assert server.alive()
