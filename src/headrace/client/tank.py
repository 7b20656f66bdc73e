"""An asyncio TANK client on the sans-I/O ``TankConnection``.

One ``TankClient`` is one TCP connection to a TANK broker (headrace's ``tank``
listener or TANK itself). Requests may be issued concurrently: each gets its
own request id, is written at once (so requests started in order are sent in
order) and waits for its response, which may come back out of order (a
long-polling consume is answered after a later produce). A reader task feeds
received bytes to the connection and resolves the waiting requests; Pings (the
greeting, heartbeats) are skipped.

Errors (``headrace.errors``): ``ConnectionLost`` when the connection drops or
the broker breaks the protocol, ``RequestTimeout`` when a response does not
arrive in time (its late response is then dropped, as the C++ client does),
``ServerError`` for an error code where the caller asked for success
(``produce``).

Example::

    async with await TankClient.connect("127.0.0.1", 11011) as client:
        await client.create_topic("logs", 1)
        await client.produce("logs", 0, [BundleMessage(b"hello", key=b"k1")])
        result = await client.consume("logs", 0, 0)
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import ssl
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from headrace.errors import (
    ConnectionLost,
    LocalProtocolError,
    RemoteProtocolError,
    RequestTimeout,
    ServerError,
)
from headrace.protocols import tank as t
from headrace.protocols.tank.codec import is_response

from .errors import TlsCertificateError

__all__ = [
    "CONNECT_TIMEOUT_S",
    "DEFAULT_FETCH_SIZE_BYTES",
    "REQUEST_TIMEOUT_S",
    "ConsumeResult",
    "TankClient",
]

CONNECT_TIMEOUT_S = 10.0
"""How long ``connect`` waits for the TCP connection."""

REQUEST_TIMEOUT_S = 32.0
"""How long a request waits for its response (the C++ client's produce timeout);
a long-polling consume waits its ``max_wait_ms`` on top of this."""

DEFAULT_FETCH_SIZE_BYTES = 1024 * 1024
"""Chunk bytes asked per partition by ``consume`` unless told otherwise."""

MAX_FETCH_SIZE_GROWTHS = 8
"""How often ``consume`` grows its fetch size when a truncated bundle (an older
broker's chunk cut at ``fetch_size``) left nothing to decode."""

READ_CHUNK_BYTES = 256 * 1024
_REQUEST_ID_MAX = 2**32 - 1


@dataclass(frozen=True, slots=True)
class ConsumeResult:
    """What one partition of a consume returned, decoded (tank.md#consume).

    Attributes:
        messages: the messages at or after the requested seq num, in order.
        high_water_mark: the partition's last committed seq num.
        next_seq_num: the seq num to ask for next.
        error: ``OK`` (also for a chunk starting with a sparse bundle), or the
            partition's error (``BOUNDARY_CHECK``, ``UNKNOWN_PARTITION``...).
        first_available_seq_num: set with ``BOUNDARY_CHECK``.
        unknown_topic: the broker has no such topic.
    """

    messages: tuple[t.BundleMessage, ...]
    high_water_mark: int
    next_seq_num: int
    error: t.ConsumeError = t.ConsumeError.OK
    first_available_seq_num: int = 0
    unknown_topic: bool = False


class TankClient:
    """One connection to a TANK broker; build it with ``await TankClient.connect(...)``."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._request_timeout_s = request_timeout_s
        self._conn = t.TankConnection(t.Role.CLIENT)
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[t.Response]] = {}
        self._failure: Exception | None = None
        self._greeted = asyncio.Event()
        self._reader_task = asyncio.create_task(self._read_loop(), name="tank-client-reader")

    @classmethod
    async def connect(
        cls,
        host: str = "127.0.0.1",
        port: int = t.DEFAULT_PORT,
        *,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        request_timeout_s: float = REQUEST_TIMEOUT_S,
        ssl_context: ssl.SSLContext | None = None,
    ) -> TankClient:
        """Open a connection (the broker's greeting is not waited for, as in TANK).

        ``ssl_context``: speak TLS (``TlsOptions.ssl_context()``); the
        handshake, a client certificate included, happens within
        ``connect_timeout_s``. TANK has no credentials of its own: against a
        server started with ``--tls-ca``, the client certificate is the credential.

        Raises:
            ConnectionLost: the connection (or its TLS handshake) could not be
                made in time.
            TlsCertificateError: the server's certificate did not verify.
        """
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(host, port, ssl=ssl_context), connect_timeout_s
            )
        except ssl.SSLCertVerificationError as exc:
            raise TlsCertificateError(f"{host}:{port}: {exc.verify_message or exc}") from exc
        except (OSError, TimeoutError) as exc:
            raise ConnectionLost(f"cannot connect to {host}:{port}: {exc}") from exc
        return cls(reader, writer, request_timeout_s=request_timeout_s)

    async def __aenter__(self) -> TankClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection; requests still waiting fail with ``ConnectionLost``."""
        self._fail(ConnectionLost("client closed"))
        self._reader_task.cancel()
        with contextlib.suppress(BaseException):
            await self._reader_task
        self._writer.close()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()

    async def wait_greeting(self, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        """Wait for the broker's greeting Ping (what the Go and Java clients do).

        Raises:
            RequestTimeout: no greeting in time.
        """
        try:
            await asyncio.wait_for(self._greeted.wait(), timeout_s)
        except TimeoutError:
            raise RequestTimeout("no greeting from the broker") from None

    # ------------------------------------------------------------------ plumbing

    def next_request_id(self) -> int:
        """A fresh request id (1..2^32-1, never 0)."""
        request_id = next(self._ids)
        if request_id > _REQUEST_ID_MAX:
            self._ids = itertools.count(2)
            request_id = 1
        return request_id

    def send(self, request: t.Request) -> asyncio.Future[t.Response]:
        """Write ``request`` now and return a future for its response.

        Requests are on the wire in the order ``send`` was called. Await the
        future through :meth:`response` (which applies the timeout).

        Raises:
            ConnectionLost: the connection has failed.
            LocalProtocolError: a field the wire cannot carry, or an id in flight.
        """
        if self._failure is not None:
            raise self._failure
        future: asyncio.Future[t.Response] = asyncio.get_running_loop().create_future()
        self._conn.send(request)
        self._waiting[request.request_id] = future
        self._writer.write(self._conn.data_to_send())
        return future

    async def response(
        self, request_id: int, future: asyncio.Future[t.Response], *, timeout_s: float | None = None
    ) -> t.Response:
        """Wait for the response to a request made with :meth:`send`.

        Raises:
            ConnectionLost, RequestTimeout.
        """
        try:
            await self._writer.drain()
        except ConnectionError as exc:
            self._fail(ConnectionLost(f"writing failed: {exc}"))
        try:
            return await asyncio.wait_for(future, timeout_s or self._request_timeout_s)
        except TimeoutError:
            self._waiting.pop(request_id, None)
            with contextlib.suppress(LocalProtocolError):
                self._conn.abandon(request_id)
            raise RequestTimeout(f"no response to request {request_id}") from None

    async def request(self, request: t.Request, *, timeout_s: float | None = None) -> t.Response:
        """Send ``request`` and wait for its response.

        Raises:
            ConnectionLost, RequestTimeout.
        """
        future = self.send(request)
        return await self.response(request.request_id, future, timeout_s=timeout_s)

    async def _read_loop(self) -> None:
        try:
            while True:
                data = await self._reader.read(READ_CHUNK_BYTES)
                self._conn.receive_data(data)
                for event in self._conn.events():
                    if isinstance(event, t.Ping):
                        self._greeted.set()
                    elif isinstance(event, t.ConnectionClosed):
                        self._fail(ConnectionLost("the broker closed the connection"))
                        return
                    elif is_response(event):
                        future = self._waiting.pop(event.request_id, None)
                        if future is not None and not future.done():
                            future.set_result(event)
        except RemoteProtocolError as exc:
            self._fail(ConnectionLost(f"the broker broke the protocol: {exc}"))
        except (ConnectionError, OSError) as exc:
            self._fail(ConnectionLost(f"reading failed: {exc}"))

    def _fail(self, exc: Exception) -> None:
        if self._failure is None:
            self._failure = exc
        waiting, self._waiting = self._waiting, {}
        for future in waiting.values():
            if not future.done():
                future.set_exception(self._failure)

    # ------------------------------------------------------------------ produce

    async def produce_bundle(
        self, topic: str, partition: int, bundle: bytes, *, first_seq_num: int | None = None
    ) -> t.ProduceError:
        """Send one encoded bundle; ``first_seq_num`` uses ProduceWithSeqnum (0x05).

        Returns the partition's result code (``UNKNOWN_TOPIC`` for the topic-level one).
        """
        request_id = self.next_request_id()
        partitions = (t.ProducePartition(partition, bundle, first_seq_num or 0),)
        topics = (t.ProduceTopic(topic, partitions),)
        message: t.Request = (
            t.Produce(request_id, topics)
            if first_seq_num is None
            else t.ProduceWithSeqnum(request_id, topics)
        )
        response = await self.request(message)
        assert isinstance(response, t.ProduceResponse)
        result = response.topics[0]
        if result.error is not t.ProduceError.OK:
            return result.error
        return result.partitions[0].error

    async def produce(
        self,
        topic: str,
        partition: int,
        messages: Sequence[t.BundleMessage],
        *,
        compress: bool | None = None,
    ) -> None:
        """Produce ``messages`` as one bundle, acknowledged once the broker stored it.

        Raises:
            ServerError: the broker answered with an error code (``.code``).
        """
        error = await self.produce_bundle(
            topic, partition, t.encode_bundle(messages, compress=compress)
        )
        if error is not t.ProduceError.OK:
            what = error.name.lower().replace("_", " ")  # UNKNOWN_TOPIC -> "unknown topic"
            raise ServerError(error, f"produce to {topic}/{partition}: {what}")

    # ------------------------------------------------------------------ consume

    async def consume(
        self,
        topic: str,
        partition: int,
        seq_num: int,
        *,
        max_wait_ms: int = 0,
        min_bytes: int = 0,
        fetch_size: int = DEFAULT_FETCH_SIZE_BYTES,
    ) -> ConsumeResult:
        """Read from ``seq_num`` (0 = first available, ``SEQ_NUM_TAIL`` = only new ones).

        With ``max_wait_ms`` > 0 the broker holds the request until data
        arrives or the time is up (long poll).
        """
        return await self.start_consume(
            topic,
            partition,
            seq_num,
            max_wait_ms=max_wait_ms,
            min_bytes=min_bytes,
            fetch_size=fetch_size,
        )

    def start_consume(
        self,
        topic: str,
        partition: int,
        seq_num: int,
        *,
        max_wait_ms: int = 0,
        min_bytes: int = 0,
        fetch_size: int = DEFAULT_FETCH_SIZE_BYTES,
    ) -> Coroutine[Any, Any, ConsumeResult]:
        """Like :meth:`consume`, but the request is written before this returns, so
        a long poll is on the wire ahead of anything sent after; await the result."""
        request = self._consume_request(
            topic, partition, seq_num, max_wait_ms, min_bytes, fetch_size
        )
        future = self.send(request)
        return self._consume(request, future)

    def _consume_request(
        self,
        topic: str,
        partition: int,
        seq_num: int,
        max_wait_ms: int,
        min_bytes: int,
        fetch_size: int,
    ) -> t.Consume:
        wanted = (t.ConsumePartition(partition, seq_num, fetch_size),)
        return t.Consume(
            self.next_request_id(), (t.ConsumeTopic(topic, wanted),), max_wait_ms, min_bytes
        )

    async def _consume(
        self, request: t.Consume, future: asyncio.Future[t.Response]
    ) -> ConsumeResult:
        topic = request.topics[0].name
        wanted = request.topics[0].partitions[0]
        seq_num, fetch_size = wanted.seq_num, wanted.fetch_size
        timeout_s = self._request_timeout_s + min(request.max_wait_ms, t.MAX_WAIT_MS) / 1000
        for _ in range(MAX_FETCH_SIZE_GROWTHS):
            response = await self.response(request.request_id, future, timeout_s=timeout_s)
            assert isinstance(response, t.ConsumeResponse)
            entry = response.topics[0]
            if isinstance(entry, t.ConsumeUnknownTopic):
                return ConsumeResult((), 0, seq_num, unknown_topic=True)
            result = entry.partitions[0]
            if result.error_or_flags not in (t.ConsumeError.OK, t.ConsumeError.SPARSE_BUNDLE):
                return ConsumeResult(
                    (),
                    result.high_water_mark,
                    seq_num,
                    result.error_or_flags,
                    result.first_available_seq_num,
                )
            sparse = result.error_or_flags is t.ConsumeError.SPARSE_BUNDLE
            base = None if sparse else result.base_seq_num
            decoded = t.decode_chunk(
                result.chunk, base, min_seq_num=seq_num, high_water_mark=result.high_water_mark
            )
            if decoded.messages:
                next_seq = decoded.messages[-1].seq_num + 1
                if seq_num != t.SEQ_NUM_TAIL:
                    next_seq = max(next_seq, seq_num)
                return ConsumeResult(decoded.messages, result.high_water_mark, next_seq)
            if decoded.truncated_entry_bytes is not None and result.chunk:
                # An older broker cut the chunk inside a bundle: ask for more.
                fetch_size = max(fetch_size * 2, decoded.truncated_entry_bytes)
                request = self._consume_request(
                    topic, wanted.partition_id, seq_num, request.max_wait_ms, 0, fetch_size
                )
                future = self.send(request)
                continue
            next_seq = seq_num
            if seq_num == t.SEQ_NUM_TAIL:
                next_seq = result.high_water_mark + 1
            elif decoded.next_seq_num is not None:
                next_seq = max(seq_num, decoded.next_seq_num)
            return ConsumeResult((), result.high_water_mark, next_seq)
        raise ServerError("fetch size", f"no whole message fits {fetch_size} bytes")

    # ------------------------------------------------------------------ administration

    async def create_topic(
        self, topic: str, partitions: int, config: bytes = b""
    ) -> t.CreateTopicResult:
        response = await self.request(
            t.CreateTopic(self.next_request_id(), topic, partitions, config)
        )
        assert isinstance(response, t.CreateTopicResponse)
        return response.result

    async def discover_partitions(self, topic: str) -> tuple[t.PartitionSeqNums, ...] | None:
        """Each partition's first available seq num and high-water mark; None for an
        unknown topic."""
        response = await self.request(t.DiscoverPartitions(self.next_request_id(), topic))
        assert isinstance(response, t.DiscoverPartitionsResponse)
        return response.partitions or None

    async def discover_topics(self) -> tuple[t.TopicInfo, ...]:
        response = await self.request(t.DiscoverTopics(self.next_request_id()))
        assert isinstance(response, t.DiscoverTopicsResponse)
        return response.topics

    async def status(self) -> t.StatusResponse:
        response = await self.request(t.Status(self.next_request_id()))
        assert isinstance(response, t.StatusResponse)
        return response
