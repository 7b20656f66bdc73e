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

import os
from collections.abc import Mapping, Sequence

from ._conn import DEFAULT_RETRY, ConnectionPool, RetryPolicy
from .bytestream import ByteStream
from .controller import DEFAULT_TXN_LEASE_MS, ControllerClient, GroupRetention, Segment
from .kvtable import KeyValueTable
from .reader import CHECKPOINT_INTERVAL_S, ReaderGroup
from .records import DEFAULT_TANK_SCOPE, RecordReader
from .segments import SegmentClient
from .tls import TlsOptions
from .transactions import Transaction
from .writer import (
    MAX_BLOCKS_IN_FLIGHT,
    MAX_OUTSTANDING_BYTES,
    MAX_OUTSTANDING_EVENTS,
    EventWriter,
)

__all__ = ["PravegaClient", "credentials_from_env"]


def credentials_from_env(environ: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """``(user, password)`` from the variables the real Pravega client reads
    (``pravega_client_auth_method=Basic``, ``pravega_client_auth_username``,
    ``pravega_client_auth_password``); None when they do not name Basic credentials."""
    env = os.environ if environ is None else environ
    method = env.get("pravega_client_auth_method", "Basic")
    user = env.get("pravega_client_auth_username")
    password = env.get("pravega_client_auth_password")
    if method.lower() != "basic" or not user or password is None:
        return None
    return user, password


class PravegaClient:
    """Entry point of the client library. Close with :meth:`aclose`.

    Args:
        controller_uri: ``tcp://host:port`` of the controller; ``tls://host:port``
            (or ``ssl``, ``tcps``, ``pravegas``) for TLS to the controller and the
            segment store, trusting the system's CAs.
        retry: reconnect policy for segment-store connections.
        tls: TLS settings for both the controller and the segment store (a CA
            file, ``verify=False``, a client certificate); given, TLS is used
            whatever the scheme. The segment store's certificate is checked
            against the host name the controller hands out (``getURI``).
        credentials: ``(user, password)`` for a server with auth on: Basic
            credentials on every controller call, and a delegation token per
            stream in every segment-store request (fetched, cached and
            refreshed by the controller client). See ``credentials_from_env``
            for the real client's environment variables.
    """

    def __init__(
        self,
        controller_uri: str,
        *,
        retry: RetryPolicy = DEFAULT_RETRY,
        tls: TlsOptions | None = None,
        credentials: tuple[str, str] | None = None,
    ) -> None:
        self.controller = ControllerClient(controller_uri, tls=tls, credentials=credentials)
        tls = self.controller.tls
        self.pool = ConnectionPool(retry, ssl_context=None if tls is None else tls.ssl_context())
        self.segments = SegmentClient(self.controller, self.pool)
        self._retry = retry

    async def create_writer(
        self,
        scope: str,
        stream: str,
        *,
        max_outstanding_events: int = MAX_OUTSTANDING_EVENTS,
        max_outstanding_bytes: int = MAX_OUTSTANDING_BYTES,
        max_blocks_in_flight: int = MAX_BLOCKS_IN_FLIGHT,
        rust_client_compat: bool = False,
    ) -> EventWriter:
        """An :class:`EventWriter` for ``scope/stream`` (see its arguments)."""
        writer = EventWriter(
            self.controller,
            self.pool,
            scope,
            stream,
            max_outstanding_events=max_outstanding_events,
            max_outstanding_bytes=max_outstanding_bytes,
            max_blocks_in_flight=max_blocks_in_flight,
            retry=self._retry,
            rust_client_compat=rust_client_compat,
        )
        await writer.open()
        return writer

    async def begin_transaction(
        self, scope: str, stream: str, *, lease_ms: int = DEFAULT_TXN_LEASE_MS
    ) -> Transaction:
        """Open a :class:`Transaction` on ``scope/stream``."""
        return await Transaction.begin(self.controller, self.pool, scope, stream, lease_ms=lease_ms)

    def record_reader(
        self,
        scope: str,
        stream: str,
        *,
        start: Mapping[Segment, int] | None = None,
        follow: bool = False,
        tank_scope: str = DEFAULT_TANK_SCOPE,
        until: Mapping[Segment, int] | None = None,
    ) -> RecordReader:
        """A :class:`RecordReader` of ``scope/stream`` (iterate it with ``async for``)."""
        return RecordReader(
            self, scope, stream, start=start, follow=follow, tank_scope=tank_scope, until=until
        )

    async def reader_group(
        self,
        scope: str,
        name: str,
        streams: Sequence[str],
        *,
        from_tail: bool = False,
        start: Mapping[str, Mapping[int, int]] | None = None,
        retention: GroupRetention = GroupRetention.NONE,
        checkpoint_interval_s: float = CHECKPOINT_INTERVAL_S,
    ) -> ReaderGroup:
        """Create (or open) reader group ``name`` over ``streams`` (see
        :meth:`ReaderGroup.create` for the arguments)."""
        return await ReaderGroup.create(
            self,
            scope,
            name,
            streams,
            from_tail=from_tail,
            start=start,
            retention=retention,
            checkpoint_interval_s=checkpoint_interval_s,
        )

    async def byte_stream(self, scope: str, stream: str) -> ByteStream:
        """Open a one-segment stream as a :class:`ByteStream`."""
        return await ByteStream.open(self, scope, stream)

    async def kv_table(self, scope: str, name: str) -> KeyValueTable:
        """Open (creating if needed) key-value table ``name``."""
        return await KeyValueTable.open(self, scope, name)

    async def aclose(self) -> None:
        await self.segments.aclose()
        await self.pool.aclose()
        await self.controller.aclose()

    async def __aenter__(self) -> PravegaClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
