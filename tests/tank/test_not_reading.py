"""A TANK consumer that pipelines consumes and never reads its socket costs the
server bounded memory: room for a response is taken before the store is read."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

from headrace.client.tank import TankClient
from headrace.protocols.tank import (
    BundleMessage,
    Consume,
    ConsumePartition,
    ConsumeTopic,
    CreateTopicResult,
    encode,
    encode_bundle,
)
from headrace.server.tank import MAX_QUEUED_CHUNK_BYTES
from tests._server import memory_kib, reset_memory_peak
from tests.tank.conftest import running_server

WAIT_S = 60.0
BUNDLE_BYTES = 4 * 1024 * 1024
BUNDLES = 20
"""80 MiB in one partition: more than one response's worth (64 MiB)."""
PIPELINED = 16
FETCH_BYTES = 64 * 1024 * 1024


async def test_a_consumer_that_does_not_read_costs_bounded_memory(tmp_path: Path) -> None:
    with running_server(tmp_path / "data", extra_args=("--fsync", "never")) as server:
        block = os.urandom(BUNDLE_BYTES - 64)  # incompressible, and read from disk as is
        async with await TankClient.connect("127.0.0.1", server.port) as client:
            assert await client.create_topic("big", 1) is CreateTopicResult.CREATED
            assert await client.create_topic("small", 1) is CreateTopicResult.CREATED
            for i in range(BUNDLES):
                bundle = encode_bundle([BundleMessage(block, i, b"")], compress=False)
                await client.produce_bundle("big", 0, bundle)
        pid = server.process.pid
        reset_memory_peak(pid)
        before = memory_kib(pid, "VmRSS")
        # The stalled consumer: every request asks for the partition from its start.
        stalled = socket.create_connection(("127.0.0.1", server.port), timeout=WAIT_S)
        try:
            stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
            wanted = (ConsumeTopic("big", (ConsumePartition(0, 1, FETCH_BYTES),)),)
            requests = b"".join(
                encode(Consume(i + 1, wanted, max_wait_ms=0)) for i in range(PIPELINED)
            )
            stalled.sendall(requests)
            # Another client is served meanwhile, and reads the whole partition in
            # small steps: the stalled one has had all that time to build responses.
            async with await TankClient.connect("127.0.0.1", server.port) as other:
                await other.produce("small", 0, [BundleMessage(b"hello", 1)])
                result = await asyncio.wait_for(other.consume("small", 0, 0), WAIT_S)
                assert [m.content for m in result.messages] == [b"hello"]
                seq_num, got = 1, 0
                while seq_num <= BUNDLES:
                    part = await asyncio.wait_for(
                        other.consume("big", 0, seq_num, fetch_size=2 * BUNDLE_BYTES), WAIT_S
                    )
                    got += len(part.messages)
                    seq_num = part.messages[-1].seq_num + 1
                assert got == BUNDLES
            peak = memory_kib(pid, "VmHWM")
        finally:
            stalled.close()
    # Unbounded, the stalled connection holds several 64 MiB responses at once.
    # Bounded: its room, the socket's copy of what the writer took, a bundle past
    # the room per response, the other client's reads (two bundles at a time).
    grown_kib = peak - before
    bound_kib = (3 * MAX_QUEUED_CHUNK_BYTES + 4 * BUNDLE_BYTES) // 1024
    assert grown_kib < bound_kib, f"peak grew by {grown_kib} KiB"
