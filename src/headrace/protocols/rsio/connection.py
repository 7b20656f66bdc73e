"""ReactiveConnection: one rsio-v0 connection, sans-I/O.

The I/O layer owns the socket and calls four verbs::

    conn = ReactiveConnection(Role.SERVER)
    write(conn.data_to_send())             # our hello, queued at construction
    loop:
        conn.receive_data(read())           # b"" on EOF
        for event in conn.events():         # may raise RemoteProtocolError
            ... conn.send(Subscribed(...)) / conn.send(OnNext(...)) ...
        write(conn.data_to_send())

What the connection does by itself, so every user gets it right:

* sends our hello at once (loose handshake, rsio.md#hello) and checks the peer's;
* answers a ``goodbye`` with ``goodbye("")`` (rsio.md#goodbye) and ends every
  subscription, reporting ``OnError("goodbye: <reason>")`` for ours and
  ``Cancel`` for the peer's before the ``Goodbye`` event; EOF does the same
  before ``ConnectionClosed``;
* answers illegal demand with ``onError(id, "illegal demand")`` (rsio.md#rule-demand,
  event :class:`~.commands.IllegalDemand`) and a subscription over
  ``max_publications`` with ``subscribed(id, 0)`` + ``onError`` (no event);
  sends the ``subscribed(id, 0)`` still owed when the peer cancels before it
  (the ``Subscribe`` and ``Cancel`` events both follow; check
  ``publication_state`` before answering a ``Subscribe``);
* drops stale and late messages (rules 3, 6, 7, rsio.md#connection-rules), reassembles split
  elements (rsio.md#split-elements), and cancels a subscription whose publisher exceeds demand or
  breaks the split rules (event :class:`~.commands.SubscriptionAborted`).

Everything else is the application's call, and ``send`` refuses what the
protocol forbids with ``LocalProtocolError``, changing nothing: ``onNext``
beyond demand, anything before ``subscribed``, anything after a terminal
signal. The state machines and the demand window are in ``states.py``.

Closing: once ``state`` is ``CLOSED`` (goodbyes exchanged, EOF, or an error
after our goodbye) and ``data_to_send()`` has been written, the I/O layer
closes the transport. After sending our own ``goodbye`` it waits for the
reply at most ``GOODBYE_TIMEOUT_S``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from headrace.errors import ConfigError, LocalProtocolError, RemoteProtocolError
from headrace.protocols._buffer import ReceiveBuffer
from headrace.protocols._varint import decode_leb128
from headrace.protocols.rsio._fast import encode_on_next_frames, on_next_body, take_small_frames
from headrace.protocols.rsio.codec import (
    DEFAULT_MAX_ELEMENT_BYTES,
    DEFAULT_MAX_FRAME_BYTES,
    MAX_VARINT_BYTES,
    MIN_MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
    decode_message,
    encode_frame,
    encode_message,
    encode_varint,
    peek_message_type,
    peek_subscriber,
    read_frame,
)
from headrace.protocols.rsio.commands import (
    SUBSCRIBER_SIDE_TYPES,
    Cancel,
    ClientHello,
    ConnectionClosed,
    Event,
    Goodbye,
    IllegalDemand,
    Message,
    MessageType,
    OnError,
    OnNext,
    OnNextLastPart,
    OnNextPacked,
    OnNextPart,
    Request,
    ServerHello,
    Subscribe,
    Subscribed,
    SubscriptionAborted,
)
from headrace.protocols.rsio.states import (
    CONNECTION_ON_PROTOCOL_ERROR,
    CONNECTION_TRANSITIONS,
    PUBLISHER_TRANSITIONS,
    SUBSCRIBER_TRANSITIONS,
    Action,
    ConnectionInput,
    ConnectionState,
    DemandWindow,
    PublisherInput,
    PublisherState,
    Role,
    SubscriberInput,
    SubscriberState,
)

__all__ = ["DEFAULT_MAX_PUBLICATIONS", "ReactiveConnection"]

DEFAULT_MAX_PUBLICATIONS = 1024
"""Subscriptions a peer may hold open on one connection (its ``subscribe`` s to us).

Each costs the serving side a store reader and a task. One consumer process
rarely needs more than a few dozen streams; 1024 leaves room for fan-in
clients while keeping one connection from tying up the server. Over the limit
a ``subscribe`` is answered with ``subscribed(id, 0)`` + ``onError(id, "too
many subscriptions")``, the protocol's way of rejecting a publisher string (rsio.md#connection-rules
rule 3).
"""

_RECEIVE_INPUTS = {
    MessageType.SUBSCRIBED: SubscriberInput.RECV_SUBSCRIBED,
    MessageType.ON_NEXT: SubscriberInput.RECV_ON_NEXT,
    MessageType.ON_NEXT_PACKED: SubscriberInput.RECV_ON_NEXT_PACKED,
    MessageType.ON_NEXT_PART: SubscriberInput.RECV_ON_NEXT_PART,
    MessageType.ON_NEXT_LAST_PART: SubscriberInput.RECV_ON_NEXT_LAST_PART,
    MessageType.ON_COMPLETE: SubscriberInput.RECV_ON_COMPLETE,
    MessageType.ON_ERROR: SubscriberInput.RECV_ON_ERROR,
}

_SEND_INPUTS = {
    MessageType.SUBSCRIBED: PublisherInput.SEND_SUBSCRIBED,
    MessageType.ON_NEXT: PublisherInput.SEND_ON_NEXT,
    MessageType.ON_NEXT_PACKED: PublisherInput.SEND_ON_NEXT_PACKED,
    MessageType.ON_NEXT_PART: PublisherInput.SEND_ON_NEXT_PART,
    MessageType.ON_NEXT_LAST_PART: PublisherInput.SEND_ON_NEXT_LAST_PART,
    MessageType.ON_COMPLETE: PublisherInput.SEND_ON_COMPLETE,
    MessageType.ON_ERROR: PublisherInput.SEND_ON_ERROR,
}

_LIVE_SUBSCRIBER_STATES = frozenset(
    {SubscriberState.AWAITING_SUBSCRIBED, SubscriberState.ACTIVE, SubscriberState.RECEIVING_PARTS}
)


def _remote(message: str) -> RemoteProtocolError:
    return RemoteProtocolError(message, reply_hint=Goodbye(message))


@dataclass(slots=True)
class _Subscription:
    """A subscription we opened (we are the subscriber); keyed by our Id."""

    state: SubscriberState
    demand: DemandWindow
    element_size: int = 0
    part_element: int = 0  # split element Id, valid in RECEIVING_PARTS
    parts: bytearray = field(default_factory=bytearray)


@dataclass(slots=True)
class _Publication:
    """A subscription the peer opened on us (we are the publisher); keyed by the peer's Id."""

    state: PublisherState
    demand: DemandWindow
    element_size: int = 0
    part_element: int = 0  # split element Id, valid in SENDING_PARTS
    part_bytes: int = 0  # bytes of the split element sent so far


def _frame_rest(buffer: ReceiveBuffer) -> int:
    """How many bytes to feed ``buffer`` next so that it holds no more than the
    frame it has begun: the rest of that frame when its length prefix is whole;
    else (the buffer empty, or a prefix not whole yet) enough for the longest
    prefix: a frame whose prefix takes two bytes or more has a body of 128
    bytes or more, so that stays inside the frame. (A prefix too long never
    waits here: ``read_frame`` raises as soon as it is buffered.)"""
    buffered = len(buffer)
    head = buffer.peek(min(buffered, MAX_VARINT_BYTES)) or b""
    length, prefix_size = decode_leb128(head, 0, MAX_VARINT_BYTES)
    if prefix_size < 0:
        return max(1, MAX_VARINT_BYTES - len(head))
    return max(1, prefix_size + length - buffered)


class ReactiveConnection:
    """One end of an rsio-v0 connection over a byte stream; subscriber, publisher or both.

    Args:
        role: ``Role.CLIENT`` if we opened the transport, ``Role.SERVER`` if
            we accepted it; decides which hello is sent and expected.
        max_frame_bytes: largest frame accepted from the peer; at least
            :data:`~.codec.MIN_MAX_FRAME_BYTES` (the protocol's floor).
        max_send_frame_bytes: largest frame we send; the default, 1 MiB, is
            the most every peer must accept. Split larger elements (rsio.md#split-elements).
        max_element_bytes: largest reassembled split element we accept.
        max_publications: most subscriptions the peer may hold open on us.
        extensions: extension Ids our hello lists (rsio.md#hello). The active set is
            their intersection with the peer's list (the ``ClientHello`` /
            ``ServerHello`` event); an extension that defines no message type
            (headrace's ``offer``) needs nothing more from the connection.

    Raises:
        ConfigError: a limit below the protocol's floor or not positive.
    """

    def __init__(
        self,
        role: Role,
        *,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        max_send_frame_bytes: int = MIN_MAX_FRAME_BYTES,
        max_element_bytes: int = DEFAULT_MAX_ELEMENT_BYTES,
        max_publications: int = DEFAULT_MAX_PUBLICATIONS,
        extensions: tuple[int, ...] = (),
    ) -> None:
        if max_frame_bytes < MIN_MAX_FRAME_BYTES:
            raise ConfigError(f"max_frame_bytes must be at least {MIN_MAX_FRAME_BYTES}")
        if max_send_frame_bytes < 1 or max_element_bytes < 1 or max_publications < 1:
            raise ConfigError("limits must be positive")
        self._role = role
        self._max_frame_bytes = max_frame_bytes
        self._max_send_frame_bytes = max_send_frame_bytes
        self._max_element_bytes = max_element_bytes
        self._max_publications = max_publications
        # A whole frame fits with its length prefix; receive_data feeds in
        # slices so that several frames per read never trip the limit.
        self._buffer_limit = max_frame_bytes + MAX_VARINT_BYTES
        self._buffer = ReceiveBuffer(self._buffer_limit)
        self._events: deque[Event] = deque()
        self._outgoing = bytearray()
        self._state = ConnectionState.AWAITING_HELLO
        self._error: RemoteProtocolError | None = None
        self._eof = False
        self._subscriptions: dict[int, _Subscription] = {}
        self._publications: dict[int, _Publication] = {}
        hello: Message
        if role is Role.CLIENT:
            hello = ClientHello(PROTOCOL_VERSION, extensions)
        else:
            hello = ServerHello(PROTOCOL_VERSION, extensions)
        self._queue(hello)

    # ----------------------------------------------------------------------- queries

    @property
    def role(self) -> Role:
        return self._role

    @property
    def state(self) -> ConnectionState:
        return self._state

    def subscription_state(self, subscriber: int) -> SubscriberState:
        """State of our subscription ``subscriber`` (``CLOSED`` if there is none)."""
        sub = self._subscriptions.get(subscriber)
        return SubscriberState.CLOSED if sub is None else sub.state

    def publication_state(self, subscriber: int) -> PublisherState:
        """State of the peer's subscription ``subscriber`` to us (``CLOSED`` if none)."""
        pub = self._publications.get(subscriber)
        return PublisherState.CLOSED if pub is None else pub.state

    def subscription_demand(self, subscriber: int) -> int:
        """Elements we requested on our subscription and have not received (0 if closed)."""
        sub = self._subscriptions.get(subscriber)
        return 0 if sub is None else sub.demand.outstanding

    def publication_demand(self, subscriber: int) -> int:
        """Elements we may still send on the peer's subscription (0 if closed).

        ``MAX_DEMAND`` means unbounded.
        """
        pub = self._publications.get(subscriber)
        return 0 if pub is None else pub.demand.outstanding

    # ----------------------------------------------------------------------- receiving

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Feed bytes received from the peer; ``b""`` means the peer closed (EOF).

        Complete frames are processed at once: their events wait in
        :meth:`events`, automatic replies in :meth:`data_to_send`. A protocol
        error is not raised here but by :meth:`events`, after the events that
        came before it; bytes received after it are discarded.

        Raises:
            LocalProtocolError: data after EOF was already fed.
        """
        if self._eof:
            if data:
                raise LocalProtocolError("receive_data after EOF")
            return
        if not data:
            self._eof = True
            if self._error is None:
                self._receive_eof()
            return
        if self._error is not None:
            return
        view = memoryview(data)
        position = 0
        end = len(view)
        buffer = self._buffer
        try:
            while position < end:
                if not buffer:
                    position = take_small_frames(
                        view, position, self._max_frame_bytes, self._receive_frame
                    )
                    if position == end:
                        break
                # A frame the loop above left (not whole yet, a longer length
                # prefix, or a wrong one) goes through the buffer, which reads and
                # judges it; no more is fed than that frame, so the frames after
                # it take the loop above again.
                room = self._buffer_limit - len(buffer)
                assert room > 0, "a whole frame was left unparsed"
                chunk = view[position : position + min(room, _frame_rest(buffer))]
                buffer.feed(chunk)
                position += len(chunk)
                while (body := read_frame(buffer, self._max_frame_bytes)) is not None:
                    self._receive_frame(body)
        except RemoteProtocolError as exc:
            self._fail(exc)

    def events(self) -> Iterator[Event]:
        """Events from the data received so far, in order.

        Raises:
            RemoteProtocolError: the peer broke the protocol; raised after
                every event before the offence, and again on every later call.
                Its ``reply_hint`` is the ``Goodbye`` to send (with
                :meth:`send`) before closing, or None if no reply is possible.
                Any other exception is a bug.
        """
        while self._events:
            yield self._events.popleft()
        if self._error is not None:
            raise self._error

    def _fail(self, exc: RemoteProtocolError) -> None:
        self._error = exc
        self._state = CONNECTION_ON_PROTOCOL_ERROR[self._state]
        if self._state is ConnectionState.CLOSED:
            exc.reply_hint = None  # we have said goodbye already: no reply is possible

    def _receive_eof(self) -> None:
        if self._buffer:
            self._fail(RemoteProtocolError("connection closed in the middle of a frame"))
            self._state = ConnectionState.CLOSED
            return
        _, self._state = CONNECTION_TRANSITIONS[(self._state, ConnectionInput.RECV_EOF)]
        self._end_all("connection closed")
        self._events.append(ConnectionClosed())

    def _end_all(self, reason: str) -> None:
        """End every subscription at once, as a goodbye or EOF does (rsio.md#goodbye)."""
        for subscriber, sub in self._subscriptions.items():
            if sub.state in _LIVE_SUBSCRIBER_STATES:
                self._events.append(OnError(subscriber, reason))
        for subscriber in self._publications:
            self._events.append(Cancel(subscriber))
        self._subscriptions.clear()
        self._publications.clear()

    def _receive_frame(self, body: bytes) -> None:
        # The common frame first: a plain onNext (``_fast.on_next_body``) on an
        # active variable-size subscription with demand left, on an open
        # connection, which the general path below would deliver unchanged.
        # Anything else (or anything wrong with it) takes the general path,
        # so its checks and errors are the only ones.
        plain = on_next_body(body) if self._state is ConnectionState.OPEN else None
        if plain is not None:
            subscriber, element = plain
            sub = self._subscriptions.get(subscriber)
            if (
                sub is not None
                and sub.state is SubscriberState.ACTIVE
                and not sub.element_size
                and sub.demand.can_consume(1)
            ):
                sub.demand.consume(1)
                self._events.append(OnNext(subscriber, element))
                return
        self._receive_message(body)

    def _receive_message(self, body: bytes) -> None:
        """Any frame: the connection's table, then the message's side."""
        message_type = peek_message_type(body)
        if message_type in (MessageType.CLIENT_HELLO, MessageType.SERVER_HELLO):
            connection_input = ConnectionInput.RECV_HELLO
        elif message_type is MessageType.GOODBYE:
            connection_input = ConnectionInput.RECV_GOODBYE
        else:
            connection_input = ConnectionInput.RECV_MESSAGE
        step = CONNECTION_TRANSITIONS.get((self._state, connection_input))
        if step is None:
            if connection_input is ConnectionInput.RECV_HELLO:
                raise _remote("second hello")
            raise _remote(f"{message_type.name} before the peer's hello")
        action, next_state = step
        if action is Action.IGNORE:
            return
        if connection_input is ConnectionInput.RECV_HELLO:
            self._receive_hello(message_type, body)
        elif connection_input is ConnectionInput.RECV_GOODBYE:
            self._receive_goodbye(body)
        elif message_type in SUBSCRIBER_SIDE_TYPES:
            self._receive_subscriber_side(message_type, body)
        else:
            self._receive_publisher_side(message_type, body)
        self._state = next_state

    def _receive_hello(self, message_type: MessageType, body: bytes) -> None:
        hello = decode_message(body)
        assert isinstance(hello, ClientHello | ServerHello)
        expected = (
            MessageType.SERVER_HELLO if self._role is Role.CLIENT else MessageType.CLIENT_HELLO
        )
        if message_type is not expected:
            raise _remote(f"{message_type.name} received by the {self._role.value}")
        if hello.version != PROTOCOL_VERSION:
            raise _remote("unsupported version")
        # Extensions: the active set is the intersection with ours; none of the
        # extensions we know defines a message type, so the codec is unchanged.
        self._events.append(hello)

    def _receive_goodbye(self, body: bytes) -> None:
        goodbye = decode_message(body)
        assert isinstance(goodbye, Goodbye)
        if self._state is not ConnectionState.GOODBYE_SENT:
            self._queue(Goodbye(""))  # the reply (the later draft's goodbyeAck)
        self._end_all(f"goodbye: {goodbye.reason}")
        self._events.append(goodbye)

    # -- the peer is subscriber, we are publisher

    def _receive_subscriber_side(self, message_type: MessageType, body: bytes) -> None:
        message = decode_message(body)  # these layouts do not depend on elementSize
        assert isinstance(message, Subscribe | Request | Cancel)
        subscriber = message.subscriber
        pub = self._publications.get(subscriber)
        if isinstance(message, Subscribe):
            if pub is not None:
                raise _remote("duplicate subscriber id")  # rsio.md#rule-duplicate-id
            if not DemandWindow.is_legal_initial_demand(message.initial_demand):
                self._reject(subscriber, "illegal demand")
            elif len(self._publications) >= self._max_publications:
                self._reject(subscriber, "too many subscriptions")
            else:
                self._publications[subscriber] = _Publication(
                    PublisherState.SUBSCRIBE_RECEIVED, DemandWindow(message.initial_demand)
                )
                self._events.append(message)
            return
        state = PublisherState.CLOSED if pub is None else pub.state
        if isinstance(message, Request):
            action, next_state = PUBLISHER_TRANSITIONS[(state, PublisherInput.RECV_REQUEST)]
        else:
            action, next_state = PUBLISHER_TRANSITIONS[(state, PublisherInput.RECV_CANCEL)]
        if action is Action.IGNORE:
            return
        assert pub is not None
        if isinstance(message, Request):
            if not DemandWindow.is_legal_request(message.demand):
                if pub.state is PublisherState.SUBSCRIBE_RECEIVED:
                    self._queue(Subscribed(subscriber, 0))  # subscribed always comes first
                self._queue(OnError(subscriber, "illegal demand"))
                del self._publications[subscriber]
                self._events.append(IllegalDemand(subscriber, message.demand))
                return
            pub.demand.request(message.demand)
        elif pub.state is PublisherState.SUBSCRIBE_RECEIVED:
            # A cancel before our subscribed: the subscriber keeps the Id until
            # subscribed arrives (rsio.md#rule-subscribed-first), and the application, which may not
            # have seen the Subscribe yet, can no longer send it. Owe it here.
            self._queue(Subscribed(subscriber, 0))
        pub.state = next_state
        if next_state is PublisherState.CLOSED:
            del self._publications[subscriber]
        self._events.append(message)

    def _reject(self, subscriber: int, reason: str) -> None:
        """Refuse a subscription the way rsio.md#rule-subscribed-first refuses an unknown
        publisher."""
        self._queue(Subscribed(subscriber, 0))
        self._queue(OnError(subscriber, reason))

    # -- the peer is publisher, we are subscriber

    def _receive_publisher_side(self, message_type: MessageType, body: bytes) -> None:
        subscriber = peek_subscriber(body)
        sub = self._subscriptions.get(subscriber)
        state = SubscriberState.CLOSED if sub is None else sub.state
        action, next_state = SUBSCRIBER_TRANSITIONS[(state, _RECEIVE_INPUTS[message_type])]
        if action is Action.IGNORE:
            if sub is not None and next_state is SubscriberState.CLOSED:
                del self._subscriptions[subscriber]  # the late subscribed of a cancelled Id
            return
        assert sub is not None
        if action is Action.ABORT:
            self._abort(subscriber, f"{message_type.name} while {state.value}")
            return
        message = decode_message(body, sub.element_size)
        problem = self._check_received(sub, message)
        if problem is not None:
            self._abort(subscriber, problem)
            return
        sub.state = next_state
        if next_state is SubscriberState.CLOSED:
            del self._subscriptions[subscriber]
        match message:
            case OnNextPart():
                pass  # held until the last part
            case OnNextLastPart():
                self._events.append(OnNext(subscriber, bytes(sub.parts)))
                sub.parts = bytearray()
            case _:
                self._events.append(message)

    def _check_received(self, sub: _Subscription, message: Message) -> str | None:
        """Apply a publisher message the table allowed; a reason to abort, or None."""
        match message:
            case Subscribed(_, element_size):
                sub.element_size = element_size
            case OnNext() | OnNextPacked():
                count = message.count if isinstance(message, OnNextPacked) else 1
                if not sub.demand.can_consume(count):
                    return f"{count} element(s) beyond demand {sub.demand.outstanding}"
                sub.demand.consume(count)
            case OnNextPart(_, element, data) | OnNextLastPart(_, element, data):
                if sub.state is SubscriberState.ACTIVE:
                    if not sub.demand.can_consume(1):
                        return "split element beyond demand 0"
                    sub.demand.consume(1)
                    sub.part_element = element
                    sub.parts = bytearray()
                elif element != sub.part_element:
                    return f"split element {sub.part_element} interrupted by element {element}"
                sub.parts += data
                if len(sub.parts) > self._max_element_bytes:
                    return f"split element over {self._max_element_bytes} bytes"
                if sub.element_size and len(sub.parts) > sub.element_size:
                    return f"split element longer than elementSize {sub.element_size}"
                if (
                    isinstance(message, OnNextLastPart)
                    and sub.element_size
                    and len(sub.parts) != sub.element_size
                ):
                    return f"split element shorter than elementSize {sub.element_size}"
        return None

    def _abort(self, subscriber: int, reason: str) -> None:
        """The publisher broke a rule of our subscription: cancel it, report locally
        (rsio.md#rule-demand)."""
        self._queue(Cancel(subscriber))
        del self._subscriptions[subscriber]
        self._events.append(SubscriptionAborted(subscriber, reason))

    # ----------------------------------------------------------------------- sending

    def send(self, message: Message) -> None:
        """Queue a message for the peer; fetch the bytes with :meth:`data_to_send`.

        The connection sends hellos and protocol replies itself; the
        application sends ``goodbye``, the subscriber messages for its own
        subscriptions and the publisher messages for the peer's. A
        ``request`` or ``cancel`` on a cancelled or finished subscription is a
        no-op (Reactive Streams §3.6, §3.7).

        Raises:
            LocalProtocolError: the protocol forbids the message now (before
                ``subscribed``, after a terminal signal or goodbye, beyond
                demand, an illegal demand, a frame over
                ``max_send_frame_bytes``...). Nothing is queued or changed.
        """
        if isinstance(message, ClientHello | ServerHello):
            raise LocalProtocolError("the connection sends its own hello")
        if isinstance(message, Goodbye):
            next_state = self._connection_step(ConnectionInput.SEND_GOODBYE, message.TYPE)
            self._queue(message)
            # Our goodbye ends every subscription; the application knows, no events.
            self._subscriptions.clear()
            self._publications.clear()
            self._state = next_state
        elif isinstance(message, Subscribe | Request | Cancel):
            next_state = self._connection_step(ConnectionInput.SEND_MESSAGE, message.TYPE)
            self._send_subscriber_side(message)
            self._state = next_state
        else:
            self._publish(message.TYPE, message, message.subscriber, ())

    def send_elements(self, subscriber: int, elements: Sequence[bytes]) -> None:
        """Queue one ``onNext`` per element on the peer's subscription, in order.

        ``send(OnNext(subscriber, element))`` for each element: the same
        checks (made once for the run) and bytes (``_fast.encode_on_next_frames``),
        so a publisher delivering many small elements spends its time on
        them, not on the state machine. Elements that need splitting go with
        ``onNextPart`` through ``send``.

        Raises:
            LocalProtocolError: as ``send`` would for any one of them (the
                subscription is not active, the run exceeds the outstanding
                demand, a fixed-size element of the wrong size, a frame over
                ``max_send_frame_bytes``). Nothing is queued or changed.
        """
        if elements:
            self._publish(MessageType.ON_NEXT, None, subscriber, elements)

    def _connection_step(
        self, connection_input: ConnectionInput, what: MessageType
    ) -> ConnectionState:
        """The connection's state after sending ``what`` now; refused if it may not be sent."""
        step = CONNECTION_TRANSITIONS.get((self._state, connection_input))
        if step is None:
            raise LocalProtocolError(
                f"cannot send {what.name} in connection state {self._state.value}"
            )
        return step[1]

    def _publisher_step(
        self, subscriber: int, what: MessageType
    ) -> tuple[_Publication, PublisherState]:
        """The peer's subscription and its state after we send it ``what``; refused if
        the subscription may not get it now."""
        pub = self._publications.get(subscriber)
        state = PublisherState.CLOSED if pub is None else pub.state
        step = PUBLISHER_TRANSITIONS.get((state, _SEND_INPUTS[what]))
        if step is None or pub is None:
            raise LocalProtocolError(
                f"cannot send {what.name} for subscriber {subscriber} in state {state.value}"
            )
        return pub, step[1]

    @staticmethod
    def _check_demand(pub: _Publication, subscriber: int, what: MessageType, count: int) -> None:
        """Refuse ``count`` elements beyond what the subscriber asked for."""
        if not pub.demand.can_consume(count):
            raise LocalProtocolError(
                f"{what.name} of {count} element(s) for subscriber {subscriber} "
                f"exceeds the outstanding demand {pub.demand.outstanding}"
            )

    @property
    def buffered_bytes(self) -> int:
        """Bytes received that do not make a whole frame yet (0 between frames)."""
        return len(self._buffer)

    def data_to_send(self) -> bytes:
        """Everything queued for the peer since the last call (possibly ``b""``)."""
        data = bytes(self._outgoing)
        self._outgoing.clear()
        return data

    def _encode(self, message: Message, element_size: int = 0) -> bytes:
        body = encode_message(message, element_size)
        if len(body) > self._max_send_frame_bytes:
            raise LocalProtocolError(
                f"{message.TYPE.name} frame of {len(body)} bytes exceeds max_send_frame_bytes "
                f"{self._max_send_frame_bytes}; split the element (onNextPart)"
            )
        return encode_varint(len(body)) + body

    def _queue(self, message: Message) -> None:
        """Queue a message of the connection's own (hello, replies): always a few bytes."""
        self._outgoing += encode_frame(message)

    # -- we are subscriber

    def _send_subscriber_side(self, message: Subscribe | Request | Cancel) -> None:
        subscriber = message.subscriber
        sub = self._subscriptions.get(subscriber)
        state = SubscriberState.CLOSED if sub is None else sub.state
        match message:
            case Subscribe():
                step_input = SubscriberInput.SEND_SUBSCRIBE
            case Request():
                step_input = SubscriberInput.SEND_REQUEST
            case Cancel():
                step_input = SubscriberInput.SEND_CANCEL
        step = SUBSCRIBER_TRANSITIONS.get((state, step_input))
        if step is None:
            raise LocalProtocolError(f"subscriber id {subscriber} is in use ({state.value})")
        action, next_state = step
        if action is Action.IGNORE:
            return
        match message:
            case Subscribe(_, _, initial_demand):
                if not DemandWindow.is_legal_initial_demand(initial_demand):
                    raise LocalProtocolError(f"initialDemand {initial_demand} not in 0 … 2^63-1")
                frame = self._encode(message)
                sub = _Subscription(next_state, DemandWindow(initial_demand))
                self._subscriptions[subscriber] = sub
            case Request(_, demand):
                assert sub is not None
                if not DemandWindow.is_legal_request(demand):
                    raise LocalProtocolError(f"request({demand}): demand must be 1 … 2^63-1")
                frame = self._encode(message)
                sub.demand.request(demand)
            case Cancel():
                assert sub is not None
                frame = self._encode(message)
                sub.state = next_state
                if next_state is SubscriberState.CLOSED:
                    del self._subscriptions[subscriber]
        self._outgoing += frame

    # -- we are publisher

    def _publish(
        self,
        what: MessageType,
        message: Message | None,
        subscriber: int,
        elements: Sequence[bytes],
    ) -> None:
        """The one way out for what we publish on the peer's subscription
        ``subscriber``: the connection's table, the subscription's, the demand
        and the split rules, then the encoding (which checks sizes), then the
        change of state; nothing changes if a check fails.

        ``message`` is the message of type ``what``, or None for a run of
        ``onNext`` s, one per element of ``elements`` (``send_elements``).
        """
        next_state = self._connection_step(ConnectionInput.SEND_MESSAGE, what)
        pub, pub_state = self._publisher_step(subscriber, what)
        consume = 0
        part_bytes = pub.part_bytes
        match message:
            case None:  # a run of onNext
                consume = len(elements)
            case OnNext():
                consume = 1
            case OnNextPacked(_, count, _):
                if pub.element_size == 0:
                    raise LocalProtocolError(
                        "onNextPacked needs a subscription with elementSize > 0"
                    )
                consume = count
            case OnNextPart(_, element, data) | OnNextLastPart(_, element, data):
                if pub.state is PublisherState.ACTIVE:
                    consume = 1
                    part_bytes = 0
                elif element != pub.part_element:
                    raise LocalProtocolError(
                        f"split element {pub.part_element} is unfinished; cannot send element "
                        f"{element}"
                    )
                part_bytes += len(data)
                if pub.element_size and (
                    part_bytes > pub.element_size
                    or (isinstance(message, OnNextLastPart) and part_bytes != pub.element_size)
                ):
                    raise LocalProtocolError(
                        f"split element of {part_bytes} bytes on a subscription with "
                        f"elementSize {pub.element_size}"
                    )
        if consume:
            self._check_demand(pub, subscriber, what, consume)
        if message is None:
            self._outgoing += encode_on_next_frames(
                subscriber, elements, pub.element_size, self._max_send_frame_bytes
            )
        else:
            element_size = (
                message.element_size if isinstance(message, Subscribed) else pub.element_size
            )
            self._outgoing += self._encode(message, element_size)
        if consume:
            pub.demand.consume(consume)
        if message is None:
            pass  # onNext changes nothing else
        elif isinstance(message, Subscribed):
            pub.element_size = message.element_size
        elif isinstance(message, OnNextPart | OnNextLastPart):
            pub.part_element = message.element
            pub.part_bytes = part_bytes
        pub.state = pub_state
        if pub_state is PublisherState.CLOSED:
            del self._publications[subscriber]
        self._state = next_state
