"""Reactive Streams IO client: subscribe to streams with request-n demand, offer elements into them.

An asyncio driver around the sans-I/O ``ReactiveConnection`` (rsio-v0,
``docs/protocols/rsio.md``)::

    client = await RsioClient.connect("127.0.0.1", 7070)   # credentials=(user, password)
    async with client.subscribe("scope/stream?from=earliest", batch=256) as sub:
        async for element in sub:           # bytes; requests 256 at a time
            ...
    await client.offer("scope/stream", elements)   # returns once all are durable
    await client.goodbye()

One reader task feeds the connection and routes its events; writes go out
after every event batch and every send. Demand is the subscriber's: a
:class:`Subscription` requests ``batch`` elements at first and tops up by
half a batch whenever half has been consumed, so at most ``batch`` elements
wait in memory. ``batch=0`` leaves demand to the caller (:meth:`Subscription.request`).

Against a server with auth on, a client is known by its TLS client
certificate (``ssl_context`` with ``load_cert_chain``), or logs in with
``credentials=(user, password)`` or ``token=<delegation token>`` (the
``auth`` extension: a subscription to ``auth:Basic …`` or ``auth:Bearer …``,
answered ``onComplete`` or ``onError``); ``connect`` raises ``RsioError`` if
the login is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any

from headrace.errors import HeadraceError, LocalProtocolError, RemoteProtocolError
from headrace.protocols.pravega.auth import basic_header
from headrace.protocols.rsio import (
    GOODBYE_TIMEOUT_S,
    MAX_DEMAND,
    SPLIT_THRESHOLD_BYTES,
    Cancel,
    ConnectionClosed,
    Goodbye,
    OnComplete,
    OnError,
    OnNext,
    OnNextPacked,
    ReactiveConnection,
    Request,
    Role,
    ServerHello,
    Subscribe,
    Subscribed,
    SubscriptionAborted,
    split_element,
)
from headrace.protocols.rsio.codec import decode_varint
from headrace.protocols.rsio.states import PublisherState

__all__ = [
    "AUTH_EXTENSION",
    "DEFAULT_BATCH",
    "OFFER_EXTENSION",
    "RecordElement",
    "RsioClient",
    "RsioError",
    "Subscription",
    "decode_record",
]

OFFER_EXTENSION = 1
"""Extension Id of headrace's ``offer`` (``docs/protocols/rsio.md#offer``)."""

AUTH_EXTENSION = 2
"""Extension Id of headrace's ``auth`` (``docs/protocols/rsio.md#auth``)."""

LOGIN_TIMEOUT_S = 30.0
"""Bound on the server's answer to a login: a password check is tens of
milliseconds, but the server runs them one per worker thread."""

DEFAULT_BATCH = 256
"""Elements a subscription requests at a time: enough to keep a fast link busy,
few enough that a slow consumer holds little."""

READ_CHUNK_BYTES = 256 * 1024
"""Bytes asked of the socket per read."""

MAX_PACKED_ELEMENTS = 1024
"""Fixed-size elements per ``onNextPacked`` at most: keeps a frame far below 1 MiB
for elements up to 1 KiB, the sizes packing is for (rsio.md#packed-elements)."""


class RsioError(HeadraceError):
    """A subscription or offer ended with ``onError``, or the connection ended under it."""


@dataclass(frozen=True, slots=True)
class RecordElement:
    """A ``format=record`` element, decoded (``docs/protocols/rsio.md#record-format``)."""

    segment_id: int
    offset: int
    index: int
    key: bytes | None
    timestamp_ms: int | None
    value: bytes


def decode_record(element: bytes) -> RecordElement:
    """Decode a ``format=record`` element.

    Raises:
        RemoteProtocolError: the element is malformed.
    """
    segment_id, pos = decode_varint(element, 0)
    offset, pos = decode_varint(element, pos)
    index, pos = decode_varint(element, pos)
    if pos >= len(element):
        raise RemoteProtocolError("record element without flags")
    flags = element[pos]
    pos += 1
    key = None
    if flags & 1:
        size, pos = decode_varint(element, pos)
        if pos + size > len(element):
            raise RemoteProtocolError("record key runs past the element")
        key = element[pos : pos + size]
        pos += size
    timestamp = None
    if flags & 2:
        timestamp, pos = decode_varint(element, pos)
    return RecordElement(segment_id, offset, index, key, timestamp, element[pos:])


class Subscription:
    """One subscription; iterate it for elements (``bytes``). See :meth:`RsioClient.subscribe`."""

    def __init__(self, client: RsioClient, sid: int, publisher: str, batch: int) -> None:
        self._client = client
        self.sid = sid
        self.publisher = publisher
        self.batch = batch
        self._elements: deque[bytes] = deque()
        self._arrived = asyncio.Event()
        self._subscribed = asyncio.Event()
        self._end: BaseException | None = None
        self._ended = False
        self.received = 0
        """Elements received so far."""
        self._consumed_since_request = 0

    # -- driven by the client's reader

    def _deliver(self, element: bytes) -> None:
        self.received += 1
        self._elements.append(element)
        self._arrived.set()

    def _finish(self, error: BaseException | None) -> None:
        self._subscribed.set()
        if not self._ended:
            self._ended = True
            self._end = error
            self._arrived.set()

    # -- the caller's side

    @property
    def outstanding(self) -> int:
        """Elements requested and not yet received."""
        return self._client._conn.subscription_demand(self.sid)

    async def wait_subscribed(self) -> None:
        """Wait for the publisher's ``subscribed`` (or the end of the subscription)."""
        await self._subscribed.wait()

    async def request(self, demand: int) -> None:
        """Ask for ``demand`` more elements (1 … 2^63-1; ``MAX_DEMAND`` = unbounded)."""
        self._client._send(Request(self.sid, demand))
        await self._client._flush()

    async def next(self) -> bytes:
        """The next element; tops up demand in ``batch`` mode.

        Raises:
            StopAsyncIteration: the publisher completed.
            RsioError: it failed (``onError``), or the connection ended.
        """
        while not self._elements:
            if self._ended:
                if self._end is None:
                    raise StopAsyncIteration
                raise self._end
            self._arrived.clear()
            await self._arrived.wait()
        element = self._elements.popleft()
        if self.batch and not self._ended:
            self._consumed_since_request += 1
            if self._consumed_since_request >= max(1, self.batch // 2):
                await self.request(self._consumed_since_request)
                self._consumed_since_request = 0
        return element

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    async def __anext__(self) -> bytes:
        return await self.next()

    async def cancel(self) -> None:
        """Cancel the subscription (a no-op once it has ended)."""
        if not self._ended:
            self._client._send(Cancel(self.sid))
            self._client._subscriptions.pop(self.sid, None)
            self._finish(None)
            await self._client._flush()

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.cancel()


@dataclass(slots=True, eq=False)
class _Offer:
    """Our publication to the server for one ``offer``: its demand arrives as requests."""

    sid: int
    demand: asyncio.Event
    subscribed: asyncio.Event
    done: asyncio.Future[None]
    cancelled: bool = False
    element_size: int = 0


class RsioClient:
    """One RS-IO connection to a headrace server. Build with :meth:`connect`."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._conn = ReactiveConnection(Role.CLIENT, extensions=(OFFER_EXTENSION, AUTH_EXTENSION))
        self._subscriptions: dict[int, Subscription] = {}
        self._offers: dict[int, _Offer] = {}
        self._next_id = 1
        self._hello = asyncio.get_running_loop().create_future()
        self._goodbye_reply = asyncio.Event()
        self._closed = False
        self._error: BaseException | None = None
        self._write_lock = asyncio.Lock()
        self._reader_task = asyncio.create_task(self._read_loop(), name="rsio client reader")

    @classmethod
    async def connect(
        cls,
        host: str,
        port: int,
        *,
        ssl_context: ssl.SSLContext | None = None,
        credentials: tuple[str, str] | None = None,
        token: str | None = None,
    ) -> RsioClient:
        """Open a connection; the client's hello goes out at once (loose handshake).

        Args:
            ssl_context: speak TLS; with a client certificate loaded, a
                server with auth on knows the client by it.
            credentials: (user, password) to log in with (``login``).
            token: a delegation token to log in with instead.

        Raises:
            RsioError: the login was refused (the connection is closed).
        """
        reader, writer = await asyncio.open_connection(host, port, ssl=ssl_context)
        client = cls(reader, writer)
        await client._flush()
        if credentials is not None or token is not None:
            try:
                await client.login(credentials=credentials, token=token)
            except BaseException:
                await client.aclose()
                raise
        return client

    async def login(
        self, *, credentials: tuple[str, str] | None = None, token: str | None = None
    ) -> None:
        """Say who we are (the ``auth`` extension): Basic credentials or a delegation
        token; returns once the server accepted them. Once per connection.

        Raises:
            RsioError: the server refused them, or does not know the extension.
        """
        if (credentials is None) == (token is None):
            raise ValueError("log in with credentials or a token, one of the two")
        authorization = basic_header(*credentials) if credentials is not None else f"Bearer {token}"
        hello = await asyncio.wait_for(asyncio.shield(self._hello), GOODBYE_TIMEOUT_S)
        if AUTH_EXTENSION not in hello:
            raise RsioError("the server does not support auth")
        sub = self.subscribe(f"auth:{authorization}", batch=0)
        try:
            await asyncio.wait_for(_drain(sub), LOGIN_TIMEOUT_S)
        except TimeoutError:
            raise RsioError(f"no answer to the login in {LOGIN_TIMEOUT_S:.0f} s") from None

    @property
    def server_extensions(self) -> frozenset[int]:
        """Extensions both hellos list (waits for nothing: empty until the server's hello)."""
        if self._hello.done() and not self._hello.exception():
            return frozenset(self._hello.result())
        return frozenset()

    def _new_id(self) -> int:
        while self._next_id in self._subscriptions or self._next_id in self._offers:
            self._next_id += 1
        sid = self._next_id
        self._next_id += 1
        return sid

    def _send(self, message: object) -> None:
        if self._error is not None:
            raise RsioError(f"connection ended: {self._error}")
        self._conn.send(message)  # type: ignore[arg-type]

    async def _flush(self) -> None:
        data = self._conn.data_to_send()
        if data and not self._writer.is_closing():
            async with self._write_lock:
                self._writer.write(data)
                await self._writer.drain()

    # -- subscribing

    def subscribe(
        self, publisher: str, *, batch: int = DEFAULT_BATCH, sid: int | None = None
    ) -> Subscription:
        """Subscribe to ``publisher`` (``scope/stream?from=...``); iterate the result.

        Args:
            publisher: the publisher string (``docs/protocols/rsio.md#publisher-strings``).
            batch: elements requested at a time; 0 = the caller requests
                (:meth:`Subscription.request`). ``MAX_DEMAND`` = unbounded.
            sid: the subscriber Id to use; default a fresh one.
        """
        sid = self._new_id() if sid is None else sid
        initial = min(batch, MAX_DEMAND)
        self._send(Subscribe(publisher, sid, initial))
        sub = Subscription(self, sid, publisher, 0 if batch >= MAX_DEMAND else batch)
        self._subscriptions[sid] = sub
        self._write_soon()
        return sub

    def _write_soon(self) -> None:
        task = asyncio.ensure_future(self._flush())
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    # -- offering

    async def offer(
        self,
        stream: str,
        elements: Iterable[bytes] | AsyncIterable[bytes],
        *,
        key: str | None = None,
        element_size: int = 0,
    ) -> int:
        """Publish ``elements`` into ``scope/stream``; return once every one is durable.

        The server subscribes to us and grants demand as its appends become
        durable, so this goes as fast as storage, no faster. Elements above
        64 KiB are split (rsio.md#split-elements). Returns the number of elements offered.

        Args:
            stream: ``scope/stream``; it must exist.
            elements: the events, in order.
            key: routing key (all elements go to the segment that owns it).
            element_size: above 0, every element has exactly this many bytes;
                they are sent packed (``onNextPacked``, rsio.md#packed-elements), as many per
                message as demand allows.

        Raises:
            RsioError: the server refused the offer or failed storing it.
            ValueError: an element of the wrong size (``element_size``).
        """
        hello = await asyncio.wait_for(asyncio.shield(self._hello), GOODBYE_TIMEOUT_S)
        if OFFER_EXTENSION not in hello:
            raise RsioError("the server does not support offer")
        sid = self._new_id()
        publisher = f"offer:{stream}" + (f"?key={key}" if key is not None else "")
        loop = asyncio.get_running_loop()
        offer = _Offer(sid, asyncio.Event(), asyncio.Event(), loop.create_future())
        self._offers[sid] = offer
        # Our subscription to the offer publisher: it carries the server's verdict.
        sub = Subscription(self, sid, publisher, 0)
        self._subscriptions[sid] = sub
        self._send(Subscribe(publisher, sid, 0))
        await self._flush()
        offer.element_size = element_size
        # Packing is for small elements; larger fixed-size ones go one by one (or split).
        per_message = min(MAX_PACKED_ELEMENTS, SPLIT_THRESHOLD_BYTES // max(1, element_size))
        count = 0
        element_id = 0
        packed: list[bytes] = []
        try:
            iterator = _aiter(elements)
            await _either(offer.subscribed.wait(), offer.done)
            async for element in iterator:
                while self._conn.publication_demand(sid) <= len(packed):
                    if packed:
                        self._send(OnNextPacked(sid, len(packed), b"".join(packed)))
                        packed.clear()
                        continue
                    if offer.done.done():
                        offer.done.result()
                        raise RsioError("offer ended before every element was sent")
                    await self._flush()
                    offer.demand.clear()
                    await _either(offer.demand.wait(), offer.done)
                count += 1
                if element_size and len(element) != element_size:
                    raise ValueError(f"element {count} is not {element_size} bytes")
                if per_message > 1 and element_size:
                    packed.append(element)
                    if len(packed) < per_message:
                        continue
                    self._send(OnNextPacked(sid, len(packed), b"".join(packed)))
                    packed.clear()
                else:
                    element_id = self._publish(sid, element, element_id)
                if count % 64 == 0:
                    await self._flush()
            if packed:
                self._send(OnNextPacked(sid, len(packed), b"".join(packed)))
            if self._conn.publication_state(sid) is not PublisherState.CLOSED:
                self._send(OnComplete(sid))
            await self._flush()
            await offer.done
        finally:
            self._offers.pop(sid, None)
            self._subscriptions.pop(sid, None)
        return count

    def _publish(self, sid: int, element: bytes, element_id: int) -> int:
        if len(element) <= SPLIT_THRESHOLD_BYTES:
            self._send(OnNext(sid, element))
            return element_id
        parts, next_id = split_element(sid, element, element_id)
        for part in parts:
            self._send(part)
        return next_id

    # -- the reader

    async def _read_loop(self) -> None:
        conn = self._conn
        try:
            while True:
                data = await self._reader.read(READ_CHUNK_BYTES)
                conn.receive_data(data)
                for event in conn.events():
                    self._dispatch(event)
                await self._flush()
                if not data:
                    break
        except RemoteProtocolError as exc:
            if isinstance(exc.reply_hint, Goodbye):
                with contextlib.suppress(LocalProtocolError):
                    conn.send(exc.reply_hint)
                with contextlib.suppress(Exception):
                    await self._flush()
            self._fail(RsioError(f"protocol error: {exc}"))
        except (OSError, asyncio.IncompleteReadError) as exc:
            self._fail(RsioError(f"connection lost: {exc}"))
        finally:
            self._fail(RsioError("connection closed"))

    def _dispatch(self, event: object) -> None:
        match event:
            case ServerHello(_, extensions):
                if not self._hello.done():
                    self._hello.set_result(frozenset(extensions))
            case Subscribed(sid, _):
                sub = self._subscriptions.get(sid)
                if sub is not None:
                    sub._subscribed.set()
            case OnNext(sid, element):
                sub = self._subscriptions.get(sid)
                if sub is not None:
                    sub._deliver(element)
            case OnNextPacked(sid):
                sub = self._subscriptions.get(sid)
                if sub is not None:
                    for element in event.elements():
                        sub._deliver(element)
            case OnComplete(sid):
                self._end_subscription(sid, None)
            case OnError(sid, error):
                self._end_subscription(sid, RsioError(error))
            case SubscriptionAborted(sid, reason):
                self._end_subscription(sid, RsioError(f"publisher broke the protocol: {reason}"))
            # The server subscribing to our offer, asking for elements, cancelling.
            case Subscribe(publisher, sid, _):
                offer = self._offers.get(sid)
                if offer is None:
                    self._conn.send(Subscribed(sid, 0))
                    self._conn.send(OnError(sid, f"no publisher {publisher!r} here"))
                    return
                self._conn.send(Subscribed(sid, offer.element_size))
                offer.subscribed.set()
                offer.demand.set()
            case Request(sid, _):
                offer = self._offers.get(sid)
                if offer is not None:
                    offer.demand.set()
            case Cancel(sid):
                offer = self._offers.get(sid)
                if offer is not None:
                    offer.cancelled = True
                    offer.demand.set()
            case Goodbye():
                self._goodbye_reply.set()
            case ConnectionClosed():
                pass

    def _end_subscription(self, sid: int, error: RsioError | None) -> None:
        sub = self._subscriptions.pop(sid, None)
        if sub is not None:
            sub._finish(error)
        offer = self._offers.get(sid)
        if offer is not None and not offer.done.done():
            if error is None:
                offer.done.set_result(None)
            else:
                offer.done.set_exception(error)
            offer.subscribed.set()
            offer.demand.set()

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        self._goodbye_reply.set()
        if not self._hello.done():
            self._hello.set_exception(error)
            self._hello.exception()  # retrieved: nobody may be waiting
        for sid in list(self._subscriptions):
            self._end_subscription(sid, RsioError(str(error)))
        for offer in self._offers.values():
            if not offer.done.done():
                offer.done.set_exception(RsioError(str(error)))
                offer.done.exception()

    # -- closing

    async def goodbye(self, reason: str = "") -> None:
        """Say goodbye, wait for the server's (at most ``GOODBYE_TIMEOUT_S``), close."""
        if self._error is None and not self._closed:
            with contextlib.suppress(LocalProtocolError):
                self._conn.send(Goodbye(reason))
            with contextlib.suppress(OSError):
                await self._flush()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._goodbye_reply.wait(), GOODBYE_TIMEOUT_S)
        await self.aclose()

    async def aclose(self) -> None:
        """Close the transport at once; every subscription ends with ``RsioError``."""
        if self._closed:
            return
        self._closed = True
        self._writer.close()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()
        self._reader_task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._reader_task
        self._fail(RsioError("connection closed"))

    async def __aenter__(self) -> RsioClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.goodbye()


async def _drain(sub: Subscription) -> None:
    """Wait for a subscription's end; its ``onError`` raises ``RsioError``."""
    async for _ in sub:
        pass


async def _aiter(elements: Iterable[bytes] | AsyncIterable[bytes]) -> AsyncIterator[bytes]:
    if isinstance(elements, AsyncIterable):
        async for element in elements:
            yield element
    else:
        for element in elements:
            yield element


async def _either(waiter: Coroutine[object, object, object], done: asyncio.Future[None]) -> None:
    """Wait for ``waiter`` or ``done``, whichever comes first."""
    task = asyncio.ensure_future(waiter)
    waits: list[asyncio.Future[Any]] = [task, done]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        task.cancel()
