"""Pravega watermarks against a real ``headrace serve``: writers' marks in, ``_MARK`` records out.

No Pravega client on PyPI notes writer times (the Python binding has no
``noteTime``), so the marks are sent as the Java writer sends them, with the
controller's own gRPC calls; the records in ``_MARK<stream>`` are decoded
here, independently of the server's encoder, from Pravega's layout
(``docs/protocols/pravega-controller.md#watermarks``).
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import AsyncIterator, Iterator

import pytest

from headrace.client import PravegaClient
from headrace.client.controller import ScalingPolicy, StreamConfig
from headrace.protocols.pravega import controller_pb2 as pb
from tests._server import FREE, ServerProcess

WAIT_S = 20.0
"""Bound on every wait here."""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = ServerProcess(
        tmp_path_factory.mktemp("marks"),
        ports={"controller": FREE, "segment_store": FREE},
        args=("--watermark-interval", "0.05"),
    ).start()
    yield srv
    srv.stop()


@pytest.fixture
async def client(server: ServerProcess) -> AsyncIterator[PravegaClient]:
    c = PravegaClient(server.uri)
    yield c
    await c.aclose()


def _revision(raw: bytes, at: int) -> tuple[bytes, int]:
    """The body of a VersionedSerializer record at ``at`` (format 0, version 0,
    one revision 0), and where the record ends."""
    fmt, version, count, revision, size = struct.unpack_from(">BBBBI", raw, at)
    assert (fmt, version, count, revision) == (0, 0, 1, 0)
    start = at + 8
    return raw[start : start + size], start + size


def _utf(raw: bytes, at: int) -> tuple[str, int]:
    (size,) = struct.unpack_from(">H", raw, at)
    return raw[at + 2 : at + 2 + size].decode(), at + 2 + size


def _decode(event: bytes) -> tuple[int, int, dict[int, tuple[float, float, int]], str, str]:
    body, end = _revision(event, 0)
    assert end == len(event)
    lower, upper, count = struct.unpack_from(">qqB", body, 0)
    at = 17
    cut = {}
    for _ in range(count):
        seg, at = _revision(body, at)
        sid, low, high = struct.unpack(">qdd", seg)
        (offset,) = struct.unpack_from(">q", body, at)
        at += 8
        cut[sid] = (low, high, offset)
    scope, at = _utf(body, at)
    stream, at = _utf(body, at)
    assert at == len(body)
    return lower, upper, cut, scope, stream


async def _note(
    client: PravegaClient, scope: str, stream: str, writer: str, ms: int, cut: dict[int, int]
) -> int:
    info = pb.StreamInfo(scope=scope, stream=stream)
    request = pb.TimestampFromWriter(
        writer=writer, position=pb.StreamCut(streamInfo=info, cut=cut), timestamp=ms
    )
    reply = await client.controller._rpc("noteTimestampFromWriter", request, pb.TimestampResponse)
    return int(reply.result)


async def _marks(client: PravegaClient, scope: str, stream: str, count: int) -> list[bytes]:
    """The first ``count`` watermark records of ``stream`` (waiting for them)."""
    mark = f"_MARK{stream}"
    deadline = time.monotonic() + WAIT_S
    while not await client.controller.stream_exists(scope, mark):
        assert time.monotonic() < deadline, "no _MARK stream"
        await asyncio.sleep(0.02)  # the watermark job runs every 50 ms
    got: list[bytes] = []
    async with client.record_reader(scope, mark, follow=True) as reader:
        async with asyncio.timeout(WAIT_S):
            async for record in reader:
                got.append(record.value)
                if len(got) == count:
                    break
    return got


async def test_writer_marks_become_watermarks_in_the_mark_stream(client: PravegaClient) -> None:
    scope, stream = "marks", "sensors"
    await client.controller.create_scope(scope)
    policy = ScalingPolicy(min_num_segments=2)
    await client.controller.create_stream(scope, stream, StreamConfig(scaling=policy))
    assert await _note(client, scope, stream, "w1", 1_000, {0: 100, 1: 40}) == 0
    assert await _note(client, scope, stream, "w2", 1_500, {0: 60, 1: 90}) == 0
    # time goes forward per writer; a position outside the stream is refused
    assert (
        await _note(client, scope, stream, "w1", 999, {0: 100}) == pb.TimestampResponse.INVALID_TIME
    )
    bad = await _note(client, scope, stream, "w1", 2_000, {7: 1})
    assert bad == pb.TimestampResponse.INVALID_POSITION
    [first] = await _marks(client, scope, stream, 1)
    lower, upper, cut, sc, st = _decode(first)
    assert (lower, upper, sc, st) == (1_000, 1_500, scope, stream)
    assert cut == {0: (0.0, 0.5, 100), 1: (0.5, 1.0, 90)}  # the upper bound of the positions
    # The slow writer leaves: the lower bound moves up to the other's time.
    removed = await client.controller._rpc(
        "removeWriter",
        pb.RemoveWriterRequest(writer="w1", stream=pb.StreamInfo(scope=scope, stream=stream)),
        pb.RemoveWriterResponse,
    )
    assert removed.result == pb.RemoveWriterResponse.SUCCESS
    second = (await _marks(client, scope, stream, 2))[1]
    assert _decode(second)[:2] == (1_500, 1_500)
    again = await client.controller._rpc(
        "removeWriter",
        pb.RemoveWriterRequest(writer="w1", stream=pb.StreamInfo(scope=scope, stream=stream)),
        pb.RemoveWriterResponse,
    )
    assert again.result == pb.RemoveWriterResponse.UNKNOWN_WRITER
