"""``ControllerProxy``: a controller that forwards every call to another one.

A real controller (``ControllerServer`` on a memory store) and a grpc server
with only the proxy, over loopback; our controller client talks to the proxy.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc  # type: ignore[import-untyped]
import pytest

from headrace.client._conn import RetryPolicy
from headrace.client.controller import ControllerClient
from headrace.client.errors import StreamNotFoundError
from headrace.controller.service import ControllerServer
from headrace.errors import ConnectionLost
from headrace.protocols.pravega import controller_pb2 as pb
from headrace.server.controller_proxy import ControllerProxy
from headrace.store.memory import MemoryStore


@pytest.fixture
async def upstream() -> AsyncIterator[ControllerServer]:
    store = MemoryStore()
    server = await ControllerServer.start(
        store, host="127.0.0.1", port=0, segment_store=("127.0.0.1", 12345)
    )
    try:
        yield server
    finally:
        await server.aclose()
        await store.close()


async def start_proxy(target: Any) -> tuple[Any, int]:
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((ControllerProxy(lambda: target).handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


async def test_calls_and_error_statuses_go_through(upstream: ControllerServer) -> None:
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{upstream.port}")
    proxy, port = await start_proxy(channel)
    try:
        async with (
            ControllerClient(f"tcp://127.0.0.1:{port}") as via_proxy,
            ControllerClient(f"tcp://127.0.0.1:{upstream.port}") as direct,
        ):
            assert await via_proxy.create_scope("sc")
            assert not await direct.create_scope("sc")  # the proxy's call reached it
            assert [s async for s in via_proxy.list_scopes()] == ["sc"]
            uri = await via_proxy._rpc(
                "getURI",
                pb.SegmentId(streamInfo=pb.StreamInfo(scope="sc", stream="st"), segmentId=0),
                pb.NodeUri,
            )
            assert (uri.endpoint, uri.port) == ("127.0.0.1", 12345)
            # A call the upstream refuses with a gRPC status: it comes back as it was.
            with pytest.raises(StreamNotFoundError, match="does not exist"):
                await via_proxy.get_current_segments("sc", "missing")
    finally:
        await proxy.stop(None)
        await channel.close()


async def test_no_target_is_unavailable() -> None:
    proxy, port = await start_proxy(None)
    try:
        once = RetryPolicy(max_attempts=1)  # the client retries UNAVAILABLE; once is enough here
        async with ControllerClient(f"tcp://127.0.0.1:{port}", retry=once) as client:
            with pytest.raises(ConnectionLost, match="no controller leads"):
                await client._rpc("listScopes", pb.ScopesRequest(), pb.ScopesResponse)
    finally:
        await proxy.stop(None)
