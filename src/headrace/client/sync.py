"""A blocking facade over the asyncio client, for scripts and notebooks.

One event loop runs in a daemon thread; every blocking call submits a
coroutine of the *async* client to it and waits for the result. There is no
second implementation: :meth:`SyncClient.run` runs any coroutine of the async
API, and the few typed helpers below are one-line delegations for the common
script tasks::

    with SyncClient("tcp://127.0.0.1:9090") as hr:
        hr.create_scope("sc")
        hr.create_stream("sc", "st", segments=2)
        with hr.writer("sc", "st") as w:
            for line in lines:
                w.write(line.encode(), routing_key="k")
        for record in hr.records("sc", "st"):
            print(record.value)
        hr.run(hr.client.controller.seal_stream("sc", "st"))   # anything else
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Coroutine, Iterator
from typing import Any, TypeVar

from .controller import ScalingPolicy, StreamConfig
from .pravega import PravegaClient
from .records import Record
from .tls import TlsOptions
from .writer import EventWriter

__all__ = ["CALL_TIMEOUT_S", "SyncClient", "SyncWriter"]

CALL_TIMEOUT_S = 300.0
"""Most time one blocking call waits; long enough for a writer flush through a
server restart (the retry policy gives up well before)."""

T = TypeVar("T")


class SyncClient:
    """A :class:`PravegaClient` driven from ordinary (non-async) code. Close with :meth:`close`."""

    def __init__(
        self,
        controller_uri: str,
        *,
        timeout_s: float = CALL_TIMEOUT_S,
        tls: TlsOptions | None = None,
        credentials: tuple[str, str] | None = None,
    ) -> None:
        """``tls``, ``credentials``: as :class:`PravegaClient`'s (a ``tls://`` URI
        alone uses the system's CAs)."""
        self._timeout_s = timeout_s
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="headrace-client", daemon=True
        )
        self._thread.start()
        self.client: PravegaClient = self.run(_make_client(controller_uri, tls, credentials))
        """The async client; pass its coroutines to :meth:`run`."""

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine of the async client on the client's loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(self._timeout_s)

    def iterate(self, iterator: AsyncIterator[T]) -> Iterator[T]:
        """Turn an async iterator of the client (records, scopes...) into a blocking one."""
        while True:
            try:
                yield self.run(_anext(iterator))
            except StopAsyncIteration:
                return

    # ------------------------------------------------------------------ helpers

    def create_scope(self, scope: str) -> bool:
        return self.run(self.client.controller.create_scope(scope))

    def create_stream(self, scope: str, stream: str, *, segments: int = 1) -> bool:
        config = StreamConfig(ScalingPolicy.fixed(segments))
        return self.run(self.client.controller.create_stream(scope, stream, config))

    def writer(self, scope: str, stream: str) -> SyncWriter:
        return SyncWriter(self, self.run(self.client.create_writer(scope, stream)))

    def records(self, scope: str, stream: str, *, follow: bool = False) -> Iterator[Record]:
        """The stream's records (see ``RecordReader``); ends at the tail unless ``follow``."""
        reader = self.client.record_reader(scope, stream, follow=follow)
        try:
            yield from self.iterate(aiter(reader))
        finally:
            self.run(reader.aclose())

    def close(self) -> None:
        try:
            self.run(self.client.aclose())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(self._timeout_s)
            self._loop.close()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class SyncWriter:
    """Blocking face of an :class:`EventWriter`; ``write`` queues, ``flush`` waits."""

    def __init__(self, sync: SyncClient, writer: EventWriter) -> None:
        self._sync = sync
        self.writer = writer

    def write(self, event: bytes, routing_key: str | None = None) -> None:
        self._sync.run(self.writer.write(event, routing_key))

    def flush(self) -> None:
        self._sync.run(self.writer.flush())

    def close(self) -> None:
        self._sync.run(self.writer.aclose())

    def __enter__(self) -> SyncWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


async def _make_client(
    uri: str, tls: TlsOptions | None, credentials: tuple[str, str] | None
) -> PravegaClient:
    # Built on the loop thread: grpc.aio binds to the running loop.
    return PravegaClient(uri, tls=tls, credentials=credentials)


async def _anext(iterator: AsyncIterator[T]) -> T:
    return await iterator.__anext__()
