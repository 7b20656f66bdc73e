"""Catch-up reads against a real ``headrace serve``: what goes out with ``sendfile``.

A real server process (disk store) on free ports; our own Pravega client and
bare sockets read stored bytes back. Reads of at least ``MIN_REGION_BYTES``
leave the server as file regions (``sendfile`` from the segment's data file),
smaller ones as copies; either way the bytes must be exactly those written,
at any offset, while appends race the reads, pipelined on one connection,
and a client that disconnects in the middle of a region must cost only its
own connection. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from headrace.client import PravegaClient, ScalingPolicy, StreamConfig
from headrace.client.tls import TlsOptions
from headrace.protocols import pravega as p
from headrace.server._loop import MAX_PENDING_EVENTS
from headrace.server.pravega import MAX_READ_REPLY_BYTES, MIN_READ_REPLY_BYTES, MIN_REGION_BYTES
from headrace.store.disk.format import SIDECAR_BLOCK_BYTES
from tests._server import FREE, ServerProcess, make_certificate, memory_kib

WAIT_S = 30.0
"""Bound on any one client call or wait in these tests (2 busy cores)."""

SCOPE = "reads"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    data_dir = tmp_path_factory.mktemp("read-path")
    serve = ServerProcess(
        data_dir / "data",
        ports={"controller": FREE, "segment_store": FREE},
        args=["--log-format", "json", "--fsync", "never"],
    )
    serve.start()
    try:
        yield serve
    finally:
        serve.stop()


def _run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 4 * WAIT_S))


async def _stream_with(client: PravegaClient, stream: str, events: list[bytes]) -> Any:
    """A one-segment stream holding ``events``; returns its segment."""
    await client.controller.create_scope(SCOPE)
    await client.controller.create_stream(SCOPE, stream, StreamConfig(ScalingPolicy.fixed(1)))
    writer = await client.create_writer(SCOPE, stream)
    for event in events:
        await writer.write(event)
    await writer.flush()
    await writer.aclose()
    return (await client.controller.get_current_segments(SCOPE, stream))[0].segment


def _stored(events: list[bytes]) -> bytes:
    """What a segment holds after ``events``: each in Pravega event framing."""
    return b"".join(p.encode_event(e) for e in events)


def _events(seed: int, total_bytes: int) -> list[bytes]:
    """Events of varied sizes (small, 10 KiB, up to 900 KiB) with distinct content."""
    sizes = [37, 10 * 1024, 300_001, 5, 900_000, 64 * 1024, 64 * 1024 - 9, 1]
    out: list[bytes] = []
    i = 0
    while sum(len(e) + 8 for e in out) < total_bytes:
        size = sizes[i % len(sizes)]
        out.append(os.urandom(4) + (seed + i).to_bytes(4, "big") + os.urandom(max(size - 8, 0)))
        i += 1
    return out


async def _read_all(client: PravegaClient, segment: Any, offset: int, end: int) -> bytes:
    parts: list[bytes] = []
    while offset < end:
        got = await client.segments.read(segment, offset, suggested_bytes=MAX_READ_REPLY_BYTES)
        assert got.offset == offset and got.data
        parts.append(got.data)
        offset += len(got.data)
    return b"".join(parts)


def test_large_stream_reads_back_byte_for_byte(server: ServerProcess) -> None:
    events = _events(0, 9 * 1024 * 1024)
    stored = _stored(events)

    async def scenario() -> None:
        async with PravegaClient(server.uri) as client:
            segment = await _stream_with(client, "large", events)
            assert (await client.segments.stat(segment)).length == len(stored)
            assert await _read_all(client, segment, 0, len(stored)) == stored

    _run(scenario())


def test_reads_at_odd_offsets_and_sizes(server: ServerProcess) -> None:
    """Across checksum-block (1 MiB) boundaries, event boundaries, the region
    threshold, and the end of the segment."""
    events = _events(1000, 3 * 1024 * 1024)
    stored = _stored(events)
    cases = [
        (0, 1),
        (1, MIN_REGION_BYTES - 1),  # copied
        (3, MIN_REGION_BYTES),  # the smallest region
        (SIDECAR_BLOCK_BYTES - 7, 100_003),  # across a block boundary
        (SIDECAR_BLOCK_BYTES, MAX_READ_REPLY_BYTES),
        (2 * SIDECAR_BLOCK_BYTES + 1, 3 * MIN_REGION_BYTES + 5),
        (len(stored) - 70_001, MAX_READ_REPLY_BYTES),  # to the end
        (len(stored) - 1, 10),
    ]

    async def scenario() -> None:
        async with PravegaClient(server.uri) as client:
            segment = await _stream_with(client, "odd", events)
            for offset, suggested in cases:
                got = await client.segments.read(segment, offset, suggested_bytes=suggested)
                size = min(max(suggested, MIN_READ_REPLY_BYTES), MAX_READ_REPLY_BYTES)
                expected = stored[offset : offset + size]
                assert got.offset == offset
                assert got.data == expected, (offset, suggested, len(got.data))
                assert got.at_tail == (offset + len(expected) == len(stored))

    _run(scenario())


def test_pipelined_reads_and_other_replies_keep_their_frames(server: ServerProcess) -> None:
    """Many reads (regions and copies) and small replies in flight on one connection:
    every reply arrives whole and matches its request."""
    events = _events(2000, 6 * 1024 * 1024)
    stored = _stored(events)

    async def scenario() -> None:
        async with PravegaClient(server.uri) as client:
            segment = await _stream_with(client, "pipelined", events)
            offsets = list(range(0, len(stored), 333_333))

            async def one(offset: int, suggested: int) -> None:
                got = await client.segments.read(segment, offset, suggested_bytes=suggested)
                assert got.data == stored[offset : offset + min(suggested, len(stored) - offset)]

            jobs = [one(o, MAX_READ_REPLY_BYTES if i % 2 else 1000) for i, o in enumerate(offsets)]
            jobs += [client.segments.stat(segment) for _ in range(10)]
            await asyncio.gather(*jobs)

    _run(scenario())


def test_reads_racing_appends_see_a_growing_prefix(server: ServerProcess) -> None:
    """A reader following the tail while a writer appends large events: every read is
    a slice of what is finally stored, and the reader ends with all of it."""
    events = _events(3000, 8 * 1024 * 1024)
    stored = _stored(events)

    async def scenario() -> None:
        async with PravegaClient(server.uri) as client:
            segment = await _stream_with(client, "race", [])
            writer = await client.create_writer(SCOPE, "race")

            async def write() -> None:
                for event in events:
                    await writer.write(event)
                await writer.flush()

            async def follow() -> bytes:
                parts: list[bytes] = []
                offset = 0
                while offset < len(stored):
                    got = await client.segments.read(
                        segment, offset, suggested_bytes=MAX_READ_REPLY_BYTES
                    )
                    assert got.data == stored[offset : offset + len(got.data)]
                    parts.append(got.data)
                    offset += len(got.data)
                return b"".join(parts)

            _, read = await asyncio.gather(write(), follow())
            await writer.aclose()
            assert read == stored

    _run(scenario())


# ---------------------------------------------------------------------- bare sockets

FRAME = struct.Struct(">ii")


def _connect(server: ServerProcess) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port_of("segment_store")), WAIT_S)
    sock.sendall(p.encode_command(p.Hello(p.WIRE_VERSION, p.OLDEST_COMPATIBLE_VERSION)))
    return sock


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    buffer = bytearray(size)
    view = memoryview(buffer)
    got = 0
    while got < size:
        n = sock.recv_into(view[got:])
        if not n:
            raise ConnectionError(f"closed after {got} of {size} bytes")
        got += n
    return bytes(buffer)


def _recv_frame(sock: socket.socket) -> bytes:
    header = _recv_exactly(sock, FRAME.size)
    _, size = FRAME.unpack(header)
    return header + _recv_exactly(sock, size)


def test_bytes_out_counts_every_byte_sent(server: ServerProcess) -> None:
    """The access line's ``bytes_out`` is exactly what the client received, regions
    included."""
    events = _events(4000, 3 * 1024 * 1024)
    stored = _stored(events)

    async def store() -> str:
        async with PravegaClient(server.uri) as client:
            return str((await _stream_with(client, "counted", events)).name)

    name = _run(store())
    with _connect(server) as sock:
        received = len(_recv_frame(sock))  # the server's Hello
        offset = 0
        for request_id in range(1, 100):
            if offset >= len(stored):
                break
            read = p.ReadSegment(name, offset, MAX_READ_REPLY_BYTES, "", request_id)
            sock.sendall(p.encode_command(read))
            frame = _recv_frame(sock)
            received += len(frame)
            reply = p.decode_frame(frame)
            assert isinstance(reply, p.SegmentRead) and reply.request_id == request_id
            assert reply.data == stored[offset : offset + len(reply.data)]
            offset += len(reply.data)
        assert offset == len(stored)
        port = sock.getsockname()[1]
        sock.shutdown(socket.SHUT_WR)
        assert sock.recv(1) == b""  # the server closed after our EOF: nothing more
    record = server.wait_for_access(peer=f"127.0.0.1:{port}")
    assert record["bytes_out"] == received
    assert record["reason"] == "eof"


def test_client_vanishing_mid_sendfile_closes_only_its_connection(
    server: ServerProcess,
) -> None:
    """Pipelined 2 MiB reads, then a reset after a few bytes: the server logs a clean
    close for that connection and goes on serving others."""
    events = _events(5000, 4 * 1024 * 1024)
    stored = _stored(events)

    async def store() -> str:
        async with PravegaClient(server.uri) as client:
            return str((await _stream_with(client, "vanish", events)).name)

    name = _run(store())
    sock = _connect(server)
    _recv_frame(sock)
    for request_id in range(1, 9):
        read = p.ReadSegment(name, 0, MAX_READ_REPLY_BYTES, "", request_id)
        sock.sendall(p.encode_command(read))
    _recv_exactly(sock, 1000)  # the first reply is under way
    port = sock.getsockname()[1]
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()  # RST with most of the replies unsent
    record = server.wait_for_access(peer=f"127.0.0.1:{port}")
    assert record["reason"] in ("connection_error", "closed", "eof")
    assert 1000 <= record["bytes_out"] <= 8 * (MAX_READ_REPLY_BYTES + 1024)
    assert "Traceback" not in server.log_text()

    async def still_serving() -> None:
        async with PravegaClient(server.uri) as client:
            segment = (await client.controller.get_current_segments(SCOPE, "vanish"))[0].segment
            assert await _read_all(client, segment, 0, len(stored)) == stored

    _run(still_serving())


HOARDED_BYTES = 32 * 1024 * 1024
"""The segment pipelined readers ask for over and over: many full replies."""

GREEDY_READS = MAX_PENDING_EVENTS
"""ReadSegments each greedy connection pipelines: as many as it may have pending."""

GREEDY_CONNECTIONS = 2
"""Connections that read and never take a reply. The store lends at most
``MAX_OPEN_REGIONS`` file regions at once, so unbounded, the first one would
hold regions (descriptors) and the second one copies: 256 x 2 MiB of them."""

MAX_GROWTH_KIB = 64 * 1024
"""What the greedy connections may add to the server's resident memory: each
holds at most ``MAX_UNSENT_REPLY_BYTES`` queued or being read, plus what its
writer handed to the socket; a few times that, far below the 512 MiB of
fetched replies one of them could pin unbounded."""


def test_readers_that_take_no_replies_cost_bounded_memory(tmp_path: Path) -> None:
    """Pipelined reads a client never takes: the server reads no more for it than
    fits under ``MAX_UNSENT_REPLY_BYTES``, so its memory stays bounded, and
    another connection is served meanwhile."""
    serve = ServerProcess(
        tmp_path / "data", ports={"segment_store": FREE}, args=["--fsync", "never"]
    )
    with serve:
        name = "hoard/st/0.#epoch.0"
        stored = bytes(range(256)) * (HOARDED_BYTES // 256)
        with _connect(serve) as sock:
            _recv_frame(sock)
            sock.sendall(p.encode_command(p.CreateSegment(1, name, 0, 0)))
            assert isinstance(p.decode_frame(_recv_frame(sock)), p.SegmentCreated)
            writer = uuid.uuid4()
            sock.sendall(p.encode_command(p.SetupAppend(2, writer, name)))
            assert isinstance(p.decode_frame(_recv_frame(sock)), p.AppendSetup)
            chunk = 4 * 1024 * 1024
            for number, start in enumerate(range(0, len(stored), chunk), start=1):
                data = stored[start : start + chunk]
                sock.sendall(p.encode_command(p.AppendBlockEnd(writer, 0, data, 1, number, 9)))
                assert isinstance(p.decode_frame(_recv_frame(sock)), p.DataAppended)
        assert serve.process is not None
        pid = serve.process.pid
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS (proc(5))
        before = memory_kib(pid, "VmRSS")
        greedy = []
        try:
            for _ in range(GREEDY_CONNECTIONS):
                sock = _connect(serve)
                reads = [
                    p.ReadSegment(name, (i * MAX_READ_REPLY_BYTES) % HOARDED_BYTES,
                                  MAX_READ_REPLY_BYTES, "", i)
                    for i in range(GREEDY_READS)
                ]  # fmt: skip
                sock.sendall(b"".join(map(p.encode_command, reads)))
                greedy.append(sock)
            # Another reader reads the whole segment meanwhile, each reply promptly:
            # the greedy ones had all that time to make the server read for them.
            with _connect(serve) as sock:
                _recv_frame(sock)
                offset = 0
                while offset < len(stored):
                    started = time.monotonic()
                    read = p.ReadSegment(name, offset, MAX_READ_REPLY_BYTES, "", offset)
                    sock.sendall(p.encode_command(read))
                    reply = p.decode_frame(_recv_frame(sock))
                    assert isinstance(reply, p.SegmentRead) and reply.request_id == offset
                    assert reply.data == stored[offset : offset + len(reply.data)]
                    assert time.monotonic() - started < WAIT_S / 3
                    offset += len(reply.data)
            peak = memory_kib(pid, "VmHWM")
        finally:
            for sock in greedy:
                sock.close()
        assert peak - before < MAX_GROWTH_KIB, f"the server grew by {peak - before} KiB"
        assert "Traceback" not in serve.log_text()


# ---------------------------------------------------------------------- TLS
# ---------------------------------------------------------------------- TLS


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    directory = tmp_path_factory.mktemp("read-path-tls")
    serve = ServerProcess(
        directory / "data",
        ports={"controller": FREE, "segment_store": FREE},
        args=["--log-format", "json", "--fsync", "never"],
        tls=make_certificate(directory, "server"),
    )
    serve.start()
    try:
        yield serve
    finally:
        serve.stop()


def test_reads_over_tls_match_byte_for_byte(tls_server: ServerProcess) -> None:
    """TLS cannot use sendfile: the same reads go out as copies through the cipher,
    large and small, pipelined, and arrive exactly as written."""
    assert tls_server.tls is not None
    events = _events(7000, 5 * 1024 * 1024)
    stored = _stored(events)
    tls = TlsOptions(ca_file=tls_server.tls.cert)
    uri = f"tls://127.0.0.1:{tls_server.port_of('controller')}"

    async def scenario() -> None:
        async with PravegaClient(uri, tls=tls) as client:
            segment = await _stream_with(client, "tls", events)
            assert await _read_all(client, segment, 0, len(stored)) == stored

            async def one(offset: int, suggested: int) -> None:
                got = await client.segments.read(segment, offset, suggested_bytes=suggested)
                assert got.data == stored[offset : offset + min(suggested, len(stored) - offset)]

            offsets = range(1, len(stored), 777_777)
            await asyncio.gather(*(one(o, MAX_READ_REPLY_BYTES) for o in offsets))
            await asyncio.gather(*(one(o, MIN_REGION_BYTES - 1) for o in offsets))

    _run(scenario())
