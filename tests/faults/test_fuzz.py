"""Fuzzing every listener of a running server while real clients use it.

One ``headrace serve`` runs every listener. For each listener a fuzzer opens
connection after connection and sends random and mutated frames: seeds are
the golden frames of ``tests/protocols/*`` (the captured Pravega client
streams, TANK's worked requests, go-lumber and pylogbeat frames) and frames
built with the project's codecs (RS-IO, HTTP requests, a gRPC/HTTP2 opening
for the controller); a seeded generator flips bits, overwrites bytes and
length fields with extreme values, truncates, inserts, deletes, duplicates,
splices, or sends pure noise. A connection carries 1 to
``MAX_FRAMES_PER_CONNECTION`` frames, sometimes after valid opening frames
(so the state machines get past their handshakes), and is then closed
abruptly or, one time in ``READ_ONE_IN``, half-closed and read to the end.

Meanwhile, on other connections, real clients keep writing and reading:
the real ``pravega`` client (writer and reader group, in a child process;
controller and segment store), the TANK client (produce and consume),
pylogbeat (Lumberjack windows), the RS-IO client (offer and subscribe) and
an HTTP ``/health`` poller. The server must never die, and none of those
clients may see an error. Afterwards the server stops cleanly and
``headrace verify`` passes.

``HEADRACE_FAULT_FUZZ_FRAMES`` sets the frames per listener (default 5000;
``make faults`` 100000); ``HEADRACE_FAULT_SEED`` the randomness.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import struct
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from headrace.client.rsio import RsioClient
from headrace.client.tank import TankClient
from headrace.protocols import lumberjack as lj
from headrace.protocols.rsio import codec as rsio_codec
from headrace.protocols.rsio import commands as rsio
from headrace.protocols.tank import BundleMessage, encode
from tests._real_pravega import result_of, start_scenario
from tests.faults.conftest import Row
from tests.faults.harness import (
    BEATS_STREAM,
    PRAVEGA_SCOPE,
    BeatWriter,
    FaultServer,
    Progress,
    run_verify,
)
from tests.protocols.lumberjack.test_codec import GO_LUMBER_J, PYLOGBEAT_C
from tests.protocols.tank.test_codec import TWO_TOPICS, WORKED_CONSUME, WORKED_PRODUCE

SEED = int(os.environ.get("HEADRACE_FAULT_SEED", "20261122"))
FRAMES = int(os.environ.get("HEADRACE_FAULT_FUZZ_FRAMES", "5000"))

MAX_FRAMES_PER_CONNECTION = 20
READ_ONE_IN = 8
"""One connection in this many is half-closed and read until the server closes
it or ``READ_TIMEOUT_S`` passes; the others are closed at once (abrupt peers)."""
READ_TIMEOUT_S = 2.0
CONNECT_TIMEOUT_S = 10.0
CLIENT_TIMEOUT_S = 60.0
"""Bound on any one request of a real client (they are answered in milliseconds)."""
INTERESTING = [0, 1, 0x7F, 0x80, 0xFF, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF]

CAPTURES = Path(__file__).resolve().parent.parent / "protocols" / "pravega" / "captures"


# --------------------------------------------------------------------------- seeds


def _pravega_frames() -> list[bytes]:
    """The captured client streams split into wire commands (int32 type, int32 length)."""
    frames = []
    for path in sorted(CAPTURES.glob("*.c2s.bin")):
        data = path.read_bytes()
        position = 0
        while position + 8 <= len(data):
            (length,) = struct.unpack_from(">i", data, position + 4)
            frames.append(data[position : position + 8 + length])
            position += 8 + length
    assert frames
    return frames


def _h2_frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return (
        len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload
    )


GRPC_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + _h2_frame(4, 0, 0, b"")
"""The HTTP/2 client preface and an empty SETTINGS frame: the controller's opening."""

SEEDS: dict[str, tuple[list[bytes], list[bytes]]] = {
    # listener: (opening frames sent first on some connections, frames to mutate)
    "segment-store": (_pravega_frames()[:1], _pravega_frames()),
    "controller": (
        [GRPC_PREFACE],
        [
            _h2_frame(1, 4, 1, b"\x83\x86\x44\x0f/io.pravega.controller.stream.api.grpc.v1"),
            _h2_frame(0, 1, 1, b"\x00\x00\x00\x00\x05\x0a\x03abc"),
            _h2_frame(4, 0, 0, b"\x00\x04\x00\x00\xff\xff"),
            _h2_frame(8, 0, 0, b"\x00\x01\x00\x00"),
            _h2_frame(6, 0, 0, b"12345678"),
            _h2_frame(3, 0, 1, b"\x00\x00\x00\x08"),
        ],
    ),
    "tank": ([], [encode(WORKED_PRODUCE), encode(WORKED_CONSUME), encode(TWO_TOPICS)]),
    "lumberjack": (
        [],
        [
            GO_LUMBER_J,
            PYLOGBEAT_C,
            lj.encode_frame(lj.ProtocolVersion.V2, lj.WindowSize(2)),
            lj.encode_frame(lj.ProtocolVersion.V1, lj.WindowSize(1)),
            lj.encode_frame(lj.ProtocolVersion.V1, lj.Data(1, ((b"line", b"hello"),))),
        ],
    ),
    "rsio": (
        [rsio_codec.encode_frame(rsio.ClientHello(0))],
        [
            rsio_codec.encode_frame(rsio.Subscribe(f"{BEATS_STREAM}?from=earliest", 7, 3)),
            rsio_codec.encode_frame(rsio.Request(7, 5)),
            rsio_codec.encode_frame(rsio.Cancel(7)),
            rsio_codec.encode_frame(rsio.Goodbye("bye")),
            rsio_codec.encode_frame(rsio.ClientHello(0, (1, 2))),
        ],
    ),
    "http": (
        [],
        [
            b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n",
            b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: keep-alive\r\n\r\n",
            b"GET /rsio HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            b"Sec-WebSocket-Version: 13\r\n\r\n",
            b"\x82\x85\x01\x02\x03\x04"
            + bytes(b ^ k for b, k in zip(b"hello", b"\x01\x02\x03\x04\x01", strict=True)),
        ],
    ),
}


def mutate(rng: random.Random, seeds: list[bytes]) -> bytes:
    """One frame: a seed as is (one in five), noise, or a seed with 1-3 mutations."""
    choice = rng.random()
    if choice < 0.2:
        return rng.choice(seeds)
    if choice < 0.3:
        return rng.randbytes(rng.randint(1, 64))
    data = bytearray(rng.choice(seeds))
    for _ in range(rng.randint(1, 3)):
        op = rng.randrange(8)
        position = rng.randrange(len(data) + 1)
        if op == 0 and data:  # flip a bit
            data[position % len(data)] ^= 1 << rng.randrange(8)
        elif op == 1 and data:  # random byte
            data[position % len(data)] = rng.randrange(256)
        elif op == 2:  # truncate
            del data[position:]
        elif op == 3:  # insert noise
            data[position:position] = rng.randbytes(rng.randint(1, 16))
        elif op == 4:  # delete a slice
            del data[position : position + rng.randint(1, 8)]
        elif op == 5:  # duplicate a slice
            data[position:position] = data[position : position + rng.randint(1, 32)]
        elif op == 6 and len(data) >= 4:  # a length or count field gets an extreme value
            position = min(position, len(data) - 4)
            width = rng.choice([1, 2, 4])
            value = rng.choice(INTERESTING) & ((1 << (8 * width)) - 1)
            data[position : position + width] = value.to_bytes(width, "big")
        else:  # splice with another seed
            other = rng.choice(seeds)
            data = data[:position] + other[rng.randrange(len(other) + 1) :]
    return bytes(data)


async def fuzz_listener(name: str, port: int, frames: int, stats: dict[str, int]) -> None:
    rng = random.Random(f"{SEED}-{name}")
    opening, seeds = SEEDS[name]
    sent = 0
    while sent < frames:
        count = min(rng.randint(1, MAX_FRAMES_PER_CONNECTION), frames - sent)
        payload = [mutate(rng, seeds) for _ in range(count)]
        if opening and rng.random() < 0.7:
            payload = opening + payload
        sent += count
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port), CONNECT_TIMEOUT_S
        )
        try:
            writer.write(b"".join(payload))
            if rng.randrange(READ_ONE_IN) == 0:
                await writer.drain()
                writer.write_eof()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(READ_TIMEOUT_S):
                        while await reader.read(65536):
                            pass
        except (ConnectionError, OSError):
            pass  # the server closed on the bad input: the expected answer
        finally:
            writer.transport.abort()
        stats["connections"] += 1
    stats["frames"] += sent


# --------------------------------------------------------------------------- real clients


async def tank_client(port: int, stop: asyncio.Event, counts: dict[str, int]) -> None:
    async with asyncio.timeout(None) as deadline:
        client = await TankClient.connect("127.0.0.1", port, request_timeout_s=CLIENT_TIMEOUT_S)
        try:
            await client.create_topic("fuzz_tank", 1)
            next_seq = 1
            n = 0
            while not stop.is_set():
                deadline.reschedule(asyncio.get_running_loop().time() + CLIENT_TIMEOUT_S)
                await client.produce(
                    "fuzz_tank", 0, [BundleMessage(b"f:%d" % (n + i), 1) for i in range(10)]
                )
                n += 10
                while next_seq <= n:
                    result = await client.consume("fuzz_tank", 0, next_seq)
                    assert result.messages, f"nothing at seq {next_seq} of {n}"
                    for message in result.messages:
                        assert message.content == b"f:%d" % (message.seq_num - 1), message
                    next_seq = result.messages[-1].seq_num + 1
            counts["tank"] = n
        finally:
            await client.aclose()


async def rsio_client(port: int, stop: asyncio.Event, counts: dict[str, int]) -> None:
    client = await RsioClient.connect("127.0.0.1", port)
    try:
        async with client.subscribe(f"{BEATS_STREAM}?from=earliest", batch=64) as sub:
            read = 0
            offered = 0
            while not stop.is_set():
                async with asyncio.timeout(CLIENT_TIMEOUT_S):
                    offered += await client.offer(BEATS_STREAM, [b'{"id": "rsio"}'] * 5)
                    for _ in range(5):
                        await sub.next()
                        read += 1
        counts["rsio offered"] = offered
        counts["rsio read"] = read
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(client.goodbye(), CLIENT_TIMEOUT_S)


async def http_client(port: int, stop: asyncio.Event, counts: dict[str, int]) -> None:
    n = 0
    while not stop.is_set():
        async with asyncio.timeout(CLIENT_TIMEOUT_S):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            status = await reader.readline()
            writer.close()
            await writer.wait_closed()
        assert status.startswith(b"HTTP/1.1 200"), status
        n += 1
        await asyncio.sleep(0.05)  # a poller's period, not synchronisation
    counts["http"] = n


@pytest.mark.timeout(600 + FRAMES // 50)
async def test_fuzzing_every_listener_harms_no_real_client(
    tmp_path: Path, fault_summary: Row
) -> None:
    server = FaultServer(tmp_path / "data")
    server.start()
    pravega = start_scenario(
        "load",
        server.uri,
        PRAVEGA_SCOPE,
        "fuzz",
        "f",
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    progress = Progress()
    beats = BeatWriter(server, progress)
    beats.start()
    stats = {"frames": 0, "connections": 0}
    counts: dict[str, int] = {}
    stop = asyncio.Event()
    try:
        # the RS-IO client reads the Lumberjack stream: wait until it exists
        assert await asyncio.to_thread(progress.wait_for, 1, CLIENT_TIMEOUT_S), beats.log.failures
        clients: list[Callable[[int, asyncio.Event, dict[str, int]], Awaitable[None]]] = [
            tank_client,
            rsio_client,
            http_client,
        ]
        client_tasks = [
            asyncio.create_task(c(server.ports[n], stop, counts))
            for c, n in zip(clients, ["tank", "rsio", "http"], strict=True)
        ]
        fuzzers = [
            asyncio.create_task(fuzz_listener(name, server.ports[name], FRAMES, stats))
            for name in SEEDS
        ]
        pending: set[asyncio.Task[None]] = set(fuzzers + client_tasks)
        while not all(f.done() for f in fuzzers):
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task.exception() is not None:
                    raise AssertionError(f"{task.get_coro()} failed") from task.exception()
        stop.set()
        await asyncio.gather(*client_tasks)
        assert server.alive(), f"the server died:\n{server.log_text()[-5000:]}"
    finally:
        stop.set()
        beats.stop()
        try:  # communicate closes the child's stdin: it finishes its batch and reports
            out, _ = pravega.communicate(timeout=CLIENT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pravega.kill()
            out, _ = pravega.communicate(timeout=CLIENT_TIMEOUT_S)
        code = server.signal(signal.SIGTERM)
    fault_summary.faults = stats["frames"]
    fault_summary.note = f"{stats['connections']} fuzz connections"
    result = result_of("load", out.decode(), "", pravega.returncode)
    counts["pravega written"] = result["written"]
    counts["pravega read"] = result["read"]
    fault_summary.checked = sum(counts.values()) + len(beats.log.acked)
    fault_summary.duplicated = result["duplicates"]
    fault_summary.note += ", " + ", ".join(f"{k} {v}" for k, v in counts.items())
    assert not beats.log.failures, f"pylogbeat saw errors: {beats.log.failures[:5]}"
    assert result["duplicates"] == 0 and result["read"] > 0, result
    assert code == 0, f"clean stop failed:\n{server.log_text()[-5000:]}"
    assert stats["frames"] == FRAMES * len(SEEDS)
    verify = run_verify(server.data_dir)
    assert verify.returncode == 0, verify.stdout + verify.stderr
