"""``PravegaClient``: one controller client and one connection pool, shared by
every writer and reader made from it.

::

    async with PravegaClient("tcp://127.0.0.1:9090") as client:
        await client.controller.create_scope("sc")
        await client.controller.create_stream("sc", "st", StreamConfig(ScalingPolicy.fixed(4)))
        async with await client.create_writer("sc", "st") as writer:
            await writer.write(b"hello", routing_key="k1")
"""

from __future__ import annotations

from ._conn import DEFAULT_RETRY, ConnectionPool, RetryPolicy
from .controller import ControllerClient
from .segments import SegmentClient
from .writer import EventWriter

__all__ = ["PravegaClient"]


class PravegaClient:
    """Entry point of the client library. Close with :meth:`aclose`.

    Args:
        controller_uri: ``tcp://host:port`` of the controller.
        retry: reconnect policy for segment-store connections.
    """

    def __init__(self, controller_uri: str, *, retry: RetryPolicy = DEFAULT_RETRY) -> None:
        self.controller = ControllerClient(controller_uri)
        self.pool = ConnectionPool(retry)
        self.segments = SegmentClient(self.controller, self.pool)
        self._retry = retry

    async def create_writer(
        self,
        scope: str,
        stream: str,
        *,
        max_outstanding_events: int | None = None,
        max_blocks_in_flight: int | None = None,
        rust_client_compat: bool = False,
    ) -> EventWriter:
        """An :class:`EventWriter` for ``scope/stream``."""
        writer = EventWriter(
            self.controller,
            self.pool,
            scope,
            stream,
            retry=self._retry,
            rust_client_compat=rust_client_compat,
        )
        if max_outstanding_events is not None:
            writer.max_outstanding_events = max_outstanding_events
        if max_blocks_in_flight is not None:
            writer.max_blocks_in_flight = max_blocks_in_flight
        await writer._load_segments()
        return writer

    async def aclose(self) -> None:
        await self.pool.aclose()
        await self.controller.aclose()

    async def __aenter__(self) -> PravegaClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
