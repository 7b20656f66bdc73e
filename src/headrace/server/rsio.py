"""Reactive Streams IO front door (port 7070): subscriptions to streams, and offers into them.

The wire is ``headrace.protocols.rsio`` (rsio-v0, ``docs/protocols/rsio.md``);
this module is the thin adapter between it and the store:

* **Dispatch table** (:meth:`RsioHandler.handle`): ``subscribe`` starts a
  publication task, ``request`` wakes it, ``cancel`` stops it; ``subscribe``
  to ``offer:<stream>`` starts an offer (the server subscribes back to the
  client and appends what it publishes). ``handle`` never awaits, so events
  take effect in wire order.
* **Error table** (:data:`STORE_ERROR_REASONS`): a store or controller error
  ends only the subscription it hit, with ``onError(id, reason)``.
* **Auth** (``server/authz.py``): with auth on, a subscription needs READ on
  its stream and an offer READ_UPDATE, for the user the client's certificate
  names or the one its ``auth:`` subscription logged in as (the ``auth``
  extension, ``docs/protocols/rsio.md#auth``). A refusal is that
  subscription's ``onError``. Subscriptions that arrive while a login is
  being checked wait for its outcome in their own tasks.

Theory of operation. Each subscription runs in its own task that reads the
store through a :class:`~headrace.server.rsio_cursor.StreamCursor` (records,
as every reader sees them, as the subscription's elements; how it reads is in
``server/rsio_cursor.py``) and sends an element only while the subscriber's
demand allows; the subscription's only pace is its demand. A task with no
demand reads nothing: it waits on an event that ``request`` sets. A task
reads only while what the connection has queued (not yet taken by the writer)
and what its other subscriptions hold for their demand stay under
:data:`MAX_UNSENT_BYTES`, and stops queueing above it; what subscriptions
without demand keep is bounded by ``MAX_IDLE_HELD_BYTES`` per connection.
So a subscriber that does not read, or subscribes a thousand times without
demand, costs bounded memory, and, as every connection and subscription has
its own tasks, slows nobody else.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from headrace.controller.auth import AuthFailed
from headrace.controller.naming import segment_name
from headrace.errors import (
    HeadraceError,
    LocalProtocolError,
    OwnerUnavailable,
    RemoteProtocolError,
    SegmentNotFound,
    SegmentSealed,
    StoreError,
)
from headrace.protocols.pravega import EVENT_HEADER
from headrace.protocols.pravega.auth import Permission, stream_resource
from headrace.protocols.pravega.routing import KeyRanges, routing_key_position
from headrace.protocols.rsio import (
    SPLIT_THRESHOLD_BYTES,
    Cancel,
    ClientHello,
    ConnectionClosed,
    ConnectionState,
    Goodbye,
    IllegalDemand,
    OnComplete,
    OnError,
    OnNext,
    OnNextPacked,
    ReactiveConnection,
    Request,
    Role,
    Subscribe,
    Subscribed,
    SubscriptionAborted,
    split_element,
)
from headrace.protocols.rsio.codec import (
    MAX_VARINT_BYTES,
    decode_message,
    decode_varint,
)
from headrace.protocols.rsio.states import PublisherState, SubscriberState
from headrace.server._context import Listener, ListenerContext
from headrace.server._listen import start_tcp_listener
from headrace.server._loop import ConnectionHandler
from headrace.server.authz import ConnectionAccess
from headrace.server.rsio_cursor import Holding, PublisherQuery, StreamCursor, parse_publisher
from headrace.store.api import MAX_APPEND_BYTES

__all__ = [
    "AUTH_EXTENSION",
    "AUTH_PREFIX",
    "MAX_UNSENT_BYTES",
    "OFFER_EXTENSION",
    "OFFER_WINDOW",
    "RsioHandler",
    "start_rsio",
]

log = logging.getLogger(__name__)

OFFER_EXTENSION = 1
"""Extension Id of headrace's ``offer`` (``docs/protocols/rsio.md#offer``), listed in our hello."""

AUTH_EXTENSION = 2
"""Extension Id of headrace's ``auth`` (``docs/protocols/rsio.md#auth``): the client
logs in with a subscription to ``auth:<Basic credentials or Bearer token>``."""

AUTH_PREFIX = "auth:"
"""Publisher strings of the ``auth`` extension start with it."""

EXTENSIONS = (OFFER_EXTENSION, AUTH_EXTENSION)
"""Every extension the server knows; its hello lists those the client listed too."""

ELEMENT_OVERHEAD_BYTES = 16
"""What ``_unsent`` counts for an element beyond its bytes: its frame's prefixes, at most."""

MAX_UNSENT_BYTES = 1 << 20
"""Bytes one connection may have queued that the writer has not yet taken.

Publication tasks wait above it; the writer drains the socket before taking
more. 1 MiB keeps a fast subscriber's pipe full (a few socket buffers) and
bounds what a subscriber that stopped reading costs.
"""

OFFER_WINDOW = 4096
"""Elements an offering client may have in flight: the ``initialDemand`` of the server's
subscription to it. Each durable append grants as many as it stored, so storage
paces the producer; 4096 small elements fill one group commit."""

MAX_OFFER_BATCH_BYTES = 1 << 20
"""Framed bytes per append of an offer; below ``MAX_APPEND_BYTES``."""

assert MAX_OFFER_BATCH_BYTES <= MAX_APPEND_BYTES

STORE_ERROR_REASONS: dict[type[HeadraceError], str] = {
    SegmentNotFound: "stream segment not found (stream deleted?)",
    SegmentSealed: "stream is sealed",
    OwnerUnavailable: "unavailable, try again",  # another node owns it, or nobody right now
    StoreError: "store error",
}
"""The onError reason for a store error (the error's text is appended)."""


def _reason(exc: BaseException) -> str:
    for kind, reason in STORE_ERROR_REASONS.items():
        if isinstance(exc, kind):
            return f"{reason}: {exc}"
    return str(exc) or type(exc).__name__


# --------------------------------------------------------------------------- the handler


@dataclass(slots=True)
class _Elements:
    """Consecutive ``onNext`` s of one offer, received together (an internal event)."""

    subscriber: int
    elements: list[bytes]


@dataclass(slots=True, eq=False)
class _Offer:
    """A client's offer: we subscribed to its publisher and append what it sends."""

    query: PublisherQuery
    elements: deque[bytes] = field(default_factory=deque)
    completed: bool = False
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


class RsioHandler(ConnectionHandler):
    """One RS-IO connection: its subscriptions (we publish) and offers (we subscribe)."""

    name = "rsio"

    def __init__(self, app: ListenerContext, *, listener: str = "rsio") -> None:
        self._app = app
        self._listener = listener
        self._access: ConnectionAccess | None = None
        self._login: asyncio.Task[None] | None = None
        self._conn = ReactiveConnection(Role.SERVER)  # replaced once the clientHello is in
        self._started = False
        self._early = bytearray()
        self._peer_extensions: frozenset[int] = frozenset()
        self._publications: dict[int, tuple[asyncio.Task[None], asyncio.Event]] = {}
        self._offers: dict[int, _Offer] = {}
        self._unsent = 0
        self._room = asyncio.Event()
        self._room.set()
        self._holding = Holding()
        self._skipped = app.metrics.skipped_events.labels("rsio").inc

    # -- the loop's interface

    def partial_frame_bytes(self) -> int:
        return self._conn.buffered_bytes if self._started else len(self._early)

    def feed(self, data: bytes) -> Iterator[object]:
        if self._started:
            self._conn.receive_data(data)
        else:
            self._early += data
            extensions = _offered_extensions(bytes(self._early), eof=not data)
            if extensions is None:
                return  # the clientHello is not complete yet
            self._conn = ReactiveConnection(Role.SERVER, extensions=extensions)
            self._started = True
            early, self._early = bytes(self._early), bytearray()
            if early:
                self._conn.receive_data(early)
            if not data:
                self._conn.receive_data(b"")
            self.wake_writer()  # our hello
        # Consecutive elements of one offer become one event: an offer of many
        # small elements would otherwise cost the loop a task per element.
        run: _Elements | None = None
        try:
            for event in self._conn.events():
                if isinstance(event, OnNext) and event.subscriber in self._offers:
                    if run is not None and run.subscriber == event.subscriber:
                        run.elements.append(event.element)
                        continue
                    if run is not None:
                        yield run
                    run = _Elements(event.subscriber, [event.element])
                    continue
                if run is not None:
                    yield run
                    run = None
                yield event
        except RemoteProtocolError:
            if run is not None:
                yield run  # the elements before the error still count
            raise
        if run is not None:
            yield run

    def data_to_send(self) -> bytes:
        if not self._started:
            return b""
        data = self._conn.data_to_send()
        self._unsent = 0
        self._room.set()
        return data

    def on_protocol_error(self, exc: RemoteProtocolError) -> None:
        if isinstance(exc.reply_hint, Goodbye):
            with contextlib.suppress(LocalProtocolError):
                self._conn.send(exc.reply_hint)

    def busy(self) -> bool:
        return bool(self._publications or self._offers)

    async def on_close(self) -> None:
        self._stop_all()

    def inline(self, event: object) -> bool:
        # ``handle`` never awaits and uses neither ``current_task`` nor a timeout:
        # every event (an offer's elements above all) is handled in the read loop,
        # with no task of its own, in wire order. Not once the peer broke the
        # protocol further on in what was received (the connection then refuses
        # to send anything but the goodbye): those events go the way of tasks,
        # which the closing connection cancels.
        return self._conn.state is not ConnectionState.ERROR

    async def handle(self, event: object) -> None:
        """Dispatch one event; never awaits, so every event acts in wire order."""
        match event:
            case ClientHello(_, extensions):
                self._peer_extensions = frozenset(extensions)
            case Subscribe(publisher, sid, _):
                self._subscribe(publisher, sid)
            case Request(sid, _):
                entry = self._publications.get(sid)
                if entry is not None:
                    entry[1].set()
            case Cancel(sid) | IllegalDemand(sid, _):
                self._stop_publication(sid)
            case OnNext(sid, element):
                offer = self._offers.get(sid)
                if offer is not None:
                    offer.elements.append(element)
                    offer.wake.set()
            case _Elements(sid, elements):
                offer = self._offers.get(sid)
                if offer is not None:
                    offer.elements.extend(elements)
                    offer.wake.set()
            case OnNextPacked(sid):
                offer = self._offers.get(sid)
                if offer is not None:
                    offer.elements.extend(event.elements())
                    offer.wake.set()
            case OnComplete(sid):
                offer = self._offers.get(sid)
                if offer is not None:
                    offer.completed = True
                    offer.wake.set()
            case OnError(sid, error):
                self._end_offer(sid, f"publisher failed: {error}")
            case SubscriptionAborted(sid, reason):
                self._end_offer(sid, f"publisher broke the protocol: {reason}")
            case Goodbye() | ConnectionClosed():
                self._stop_all()
        self.wake_writer()

    # -- subscriptions to streams (we publish)

    def _subscribe(self, publisher: str, sid: int) -> None:
        conn = self._conn
        if conn.publication_state(sid) is not PublisherState.SUBSCRIBE_RECEIVED:
            return  # cancelled (or illegal demand) in the same read: already answered
        if publisher.startswith(AUTH_PREFIX):
            self._start_login(sid, publisher.removeprefix(AUTH_PREFIX))
            return
        try:
            query = parse_publisher(publisher)
        except ValueError as exc:
            conn.send(Subscribed(sid, 0))
            conn.send(OnError(sid, str(exc)))
            return
        if query.offer:
            self._start_offer(sid, query)
            return
        # subscribed at once, in handle: a cancel that follows must find it sent, since
        # the subscriber keeps the Id until its subscribed arrives (rsio.md#rule-subscribed-first).
        conn.send(Subscribed(sid, 0))
        if not self._login_pending():
            refusal = self._refusal(query, Permission.READ)
            if refusal is not None:
                conn.send(OnError(sid, refusal))
                return
        wake = asyncio.Event()
        task = asyncio.create_task(self._publish(sid, query, wake), name=f"rsio publish {sid}")
        self._publications[sid] = (task, wake)

    # -- auth (the ``auth`` extension and the checks of server/authz.py)

    @property
    def access(self) -> ConnectionAccess:
        """What the client may do, known once the connection started."""
        if self._access is None:
            self._access = ConnectionAccess.of(
                self._app.door_auth, self._listener, self.peer, self.peer_cert
            )
        return self._access

    def _refusal(self, query: PublisherQuery, needed: Permission) -> str | None:
        """Why the client may not subscribe to (READ) or offer into (READ_UPDATE)
        ``query``'s stream; None if it may. A refusal is counted and logged."""
        refusal = self.access.check(stream_resource(query.scope, query.stream), needed)
        if refusal is not None:
            self.access.note_refusal(refusal)
        return refusal

    def _login_pending(self) -> bool:
        return self._login is not None and not self._login.done()

    async def _after_login(self) -> None:
        """Wait for the connection's login to be decided (cancelled counts as decided)."""
        if self._login is not None and not self._login.done():
            await asyncio.wait({self._login})

    def _start_login(self, sid: int, authorization: str) -> None:
        """``subscribe("auth:<authorization>", sid)``: answered ``onComplete`` once the
        credentials or token are good, ``onError`` if not. One per connection."""
        conn = self._conn
        conn.send(Subscribed(sid, 0))
        if AUTH_EXTENSION not in self._peer_extensions:
            conn.send(OnError(sid, "auth: extension not negotiated in the hellos"))
            return
        if self._login is not None:
            conn.send(OnError(sid, "auth: this connection sent its credentials already"))
            return
        task = asyncio.create_task(self._check_login(sid, authorization), name=f"rsio login {sid}")
        self._login = task
        self._publications[sid] = (task, asyncio.Event())

    async def _check_login(self, sid: int, authorization: str) -> None:
        conn = self._conn
        try:
            await self.access.login(authorization)
        except AuthFailed as exc:
            message = f"unauthenticated: {exc}"
            self.access.note_refusal(message)
            if self._mine(sid):
                conn.send(OnError(sid, message))
        else:
            if self._mine(sid):
                conn.send(OnComplete(sid))
        finally:
            entry = self._publications.get(sid)
            if entry is not None and entry[0] is asyncio.current_task():
                del self._publications[sid]
            self.wake_writer()

    def _stop_publication(self, sid: int) -> None:
        entry = self._publications.pop(sid, None)
        if entry is not None:
            entry[0].cancel()
        offer = self._offers.pop(sid, None)
        if offer is not None:
            # The client cancelled its offer: stop subscribing to its publisher.
            if offer.task is not None:
                offer.task.cancel()
            with contextlib.suppress(LocalProtocolError):
                self._conn.send(Cancel(sid))

    def _stop_all(self) -> None:
        for task, _ in self._publications.values():
            task.cancel()
        self._publications.clear()
        for offer in self._offers.values():
            if offer.task is not None:
                offer.task.cancel()
        self._offers.clear()

    def _live(self, sid: int) -> bool:
        return self._conn.publication_state(sid) is not PublisherState.CLOSED

    def _mine(self, sid: int) -> bool:
        """Whether the running publication task still owns Id ``sid`` and may send for it.

        A cancelled task runs its cleanup after the subscriber may already have
        reused the Id (rsio.md#rule-terminal); it must not send for the new subscription.
        """
        entry = self._publications.get(sid)
        return entry is not None and entry[0] is asyncio.current_task() and self._live(sid)

    async def _publish(self, sid: int, query: PublisherQuery, wake: asyncio.Event) -> None:
        conn = self._conn
        cursor = StreamCursor(self._app, query, self._holding, self._skipped)
        element_id = 0
        try:
            if self._login_pending():
                await self._after_login()
                refusal = self._refusal(query, Permission.READ)
                if refusal is not None:
                    if self._mine(sid):
                        conn.send(OnError(sid, refusal))
                    return
            await cursor.open()
            while self._mine(sid):
                if cursor.done:
                    conn.send(OnComplete(sid))  # needs no demand
                    break
                demand = conn.publication_demand(sid)
                if demand == 0:
                    # Nothing is read without demand; what is held counts as idle.
                    if not cursor.idle:
                        cursor.set_idle(True)
                        self._room.set()  # others may read in the room it leaves
                    wake.clear()
                    if not cursor.has_elements and await cursor.probe_end():
                        continue  # read to the end: onComplete needs no demand
                    await wake.wait()
                    continue
                cursor.set_idle(False)
                cursor.demand = demand
                if not cursor.has_elements:
                    # Read only with room: what the connection has queued and what its
                    # other subscriptions hold for their demand stay under MAX_UNSENT_BYTES.
                    held = self._holding.active_bytes - cursor.held_bytes
                    if self._unsent + held >= MAX_UNSENT_BYTES:
                        self._room.clear()
                        self.wake_writer()
                        await self._room.wait()
                        continue
                    await cursor.fill()  # about what the demand takes; long-polls at the tail
                    continue
                if self._unsent >= MAX_UNSENT_BYTES:
                    self._room.clear()
                    await self._room.wait()
                    continue
                # Up to the demand and the room, the records at hand go out as one
                # run of onNext frames (send_elements); a split element ends a run.
                run: list[bytes] = []
                room = demand
                while room and self._unsent < MAX_UNSENT_BYTES:
                    element = cursor.pop()
                    if element is None:
                        break
                    room -= 1
                    if len(element) > SPLIT_THRESHOLD_BYTES:
                        self._send_run(sid, run)
                        run = []
                        element_id = self._send_split(sid, element, element_id)
                        continue
                    run.append(element)
                    self._unsent += len(element) + ELEMENT_OVERHEAD_BYTES
                self._send_run(sid, run)
                self.wake_writer()
                await asyncio.sleep(0)  # let other subscriptions and the writer run
        except asyncio.CancelledError:
            raise
        except (ValueError, HeadraceError) as exc:
            if self._mine(sid):
                conn.send(OnError(sid, _reason(exc)))
        except Exception:
            log.exception("rsio: subscription %d to %s failed", sid, cursor.name)
            if self._mine(sid):
                conn.send(OnError(sid, "internal error"))
        finally:
            cursor.release()
            self._room.set()
            entry = self._publications.get(sid)
            if entry is not None and entry[0] is asyncio.current_task():
                del self._publications[sid]
            self.wake_writer()

    def _send_run(self, sid: int, elements: list[bytes]) -> None:
        """Send elements no larger than ``SPLIT_THRESHOLD_BYTES``, one ``onNext`` each
        (the caller counted them in ``_unsent`` as it took them)."""
        if elements:
            self._conn.send_elements(sid, elements)

    def _send_split(self, sid: int, element: bytes, element_id: int) -> int:
        """Send an element over ``SPLIT_THRESHOLD_BYTES`` in parts (rsio.md#split-elements); the
        next element Id."""
        self._unsent += len(element) + ELEMENT_OVERHEAD_BYTES
        parts, next_id = split_element(sid, element, element_id)
        for part in parts:
            self._conn.send(part)
        return next_id

    # -- offers (the client publishes, we append)

    def _start_offer(self, sid: int, query: PublisherQuery) -> None:
        conn = self._conn
        conn.send(Subscribed(sid, 0))
        if OFFER_EXTENSION not in self._peer_extensions:
            conn.send(OnError(sid, "offer: extension not negotiated in the hellos"))
            return
        if self._login_pending():  # the checks wait for the login, in the offer's task
            offer = _Offer(query)
            self._offers[sid] = offer
            offer.task = asyncio.create_task(
                self._offer_after_login(sid, offer), name=f"rsio offer {sid}"
            )
            return
        refusal = self._offer_refusal(sid, query)
        if refusal is not None:
            conn.send(OnError(sid, refusal))
            return
        conn.send(Subscribe(f"{query.scope}/{query.stream}", sid, OFFER_WINDOW))
        offer = _Offer(query)
        self._offers[sid] = offer
        offer.task = asyncio.create_task(self._store_offer(sid, offer), name=f"rsio offer {sid}")

    def _offer_refusal(self, sid: int, query: PublisherQuery) -> str | None:
        """Why an offer into ``query``'s stream cannot start; None if it can."""
        controller = self._app.controller
        refusal = self._refusal(query, Permission.READ_UPDATE)
        if refusal is not None:
            return refusal
        if not controller.stream_exists(query.scope, query.stream):
            return f"no such stream {query.scope}/{query.stream}"
        if controller.is_sealed(query.scope, query.stream):
            return f"stream {query.scope}/{query.stream} is sealed"
        if self._conn.subscription_state(sid) is not SubscriberState.CLOSED:
            return "offer: id still in use by an earlier offer"
        return None

    async def _offer_after_login(self, sid: int, offer: _Offer) -> None:
        """An offer that arrived while the login was checked: its checks, then the offer."""
        await self._after_login()
        if self._offers.get(sid) is not offer:
            return  # cancelled meanwhile
        refusal = self._offer_refusal(sid, offer.query)
        if refusal is not None:
            del self._offers[sid]
            if self._live(sid):
                self._conn.send(OnError(sid, refusal))
            self.wake_writer()
            return
        self._conn.send(Subscribe(f"{offer.query.scope}/{offer.query.stream}", sid, OFFER_WINDOW))
        self.wake_writer()
        await self._store_offer(sid, offer)

    def _end_offer(self, sid: int, reason: str) -> None:
        offer = self._offers.pop(sid, None)
        if offer is None:
            return
        if offer.task is not None:
            offer.task.cancel()
        if self._live(sid):
            self._conn.send(OnError(sid, reason))

    def _target(self, query: PublisherQuery) -> str:
        segments = self._app.controller.current_segments(query.scope, query.stream)
        if not segments:
            raise ValueError(f"stream {query.scope}/{query.stream} is sealed")
        ranges = KeyRanges.from_ranges(
            (segment_name(query.scope, query.stream, seg.id), seg.min_key, seg.max_key)
            for seg in segments
        )
        return ranges.segment_for_position(routing_key_position(query.key or ""))

    async def _store_offer(self, sid: int, offer: _Offer) -> None:
        """Append the offered elements in order, granting demand as each append is durable."""
        conn = self._conn
        store = self._app.store
        try:
            target = self._target(offer.query)
            while True:
                if not offer.elements:
                    if offer.completed:
                        break
                    offer.wake.clear()
                    await offer.wake.wait()
                    continue
                batch: list[bytes] = []
                size = 0
                while offer.elements:
                    element = offer.elements[0]
                    framed = EVENT_HEADER.size + len(element)
                    if batch and size + framed > MAX_OFFER_BATCH_BYTES:
                        break
                    offer.elements.popleft()
                    batch.append(element)
                    size += framed
                data = _frame(batch)
                for _attempt in range(3):
                    try:
                        await store.append(target, data)
                        break
                    except SegmentSealed:
                        target = self._target(offer.query)  # scaled: nothing was written
                else:
                    raise ValueError(
                        f"stream {offer.query.scope}/{offer.query.stream} keeps scaling"
                    )
                if conn.subscription_state(sid) is SubscriberState.ACTIVE or (
                    conn.subscription_state(sid) is SubscriberState.RECEIVING_PARTS
                ):
                    conn.send(Request(sid, len(batch)))
                self.wake_writer()
            if self._live(sid):
                conn.send(OnComplete(sid))
        except asyncio.CancelledError:
            raise
        except (ValueError, HeadraceError) as exc:
            with contextlib.suppress(LocalProtocolError):
                conn.send(Cancel(sid))
            if self._live(sid):
                conn.send(OnError(sid, _reason(exc)))
        finally:
            if self._offers.get(sid) is offer:
                del self._offers[sid]
            self.wake_writer()


MAX_EARLY_BYTES = 64 * 1024
"""Bytes held before the first frame (the clientHello) is complete; a hello is a
few bytes, so more than this is a bad peer, handed to the connection to refuse."""


def _offered_extensions(data: bytes, *, eof: bool) -> tuple[int, ...] | None:
    """The extensions our hello lists, given the client's first bytes; None: wait for more.

    Our ``serverHello`` goes out once the ``clientHello`` is in, and lists the
    extensions of ours that the client listed (rsio.md#hello: a server may wait for the
    ``clientHello``), so a client that lists none gets the plain
    ``03 02 00 00``. Anything that is not a well-formed ``clientHello`` gets
    an empty list; the connection then reports the error itself.
    """
    try:
        length, position = decode_varint(data, 0)
    except RemoteProtocolError:
        if eof or len(data) > MAX_VARINT_BYTES:
            return ()
        return None
    if len(data) < position + length:
        return () if eof or len(data) > MAX_EARLY_BYTES else None
    try:
        hello = decode_message(data[position : position + length])
    except RemoteProtocolError:
        return ()
    if not isinstance(hello, ClientHello):
        return ()
    return tuple(ext for ext in EXTENSIONS if ext in hello.extensions)


def _frame(payloads: list[bytes]) -> bytes:
    parts: list[bytes] = []
    for payload in payloads:
        parts.append(b"\x00\x00\x00\x00" + len(payload).to_bytes(4, "big"))
        parts.append(payload)
    return b"".join(parts)


async def start_rsio(ctx: ListenerContext, host: str, port: int) -> Listener:
    """Serve RS-IO on (host, port), over TLS when a certificate is configured."""
    name = ctx.listener_name("rsio")
    return await start_tcp_listener(
        name,
        host,
        port,
        lambda: RsioHandler(ctx, listener=name),
        settings=ctx.settings,
        ssl_context=ctx.ssl_context(),
    )
