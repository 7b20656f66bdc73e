"""TankConnection: one side of a TANK connection, sans I/O.

The object turns received bytes into events and messages into bytes, and keeps
the connection's state (``states.py``) and its requests in flight. It never
touches a socket: the I/O layer reads from the socket into
:meth:`TankConnection.receive_data`, handles what :meth:`TankConnection.events`
yields, passes replies to :meth:`TankConnection.send` and writes out
:meth:`TankConnection.data_to_send`.

A server connection queues the broker greeting (a Ping frame) as soon as it is
built; the I/O layer should write ``data_to_send()`` right after accepting.
A client connection remembers each request it sends until the response
arrives, which is how it can decode produce responses (they carry neither
topic names nor partition ids) and reject responses to requests it never made.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Iterator, Mapping
from typing import TypeVar

from headrace.errors import FrameTooLarge, LocalProtocolError, RemoteProtocolError
from headrace.protocols._buffer import ReceiveBuffer
from headrace.protocols.tank.codec import (
    FRAME_HEADER_BYTES,
    MAX_PAYLOAD_BYTES,
    REQUEST_TYPES,
    RESPONSE_TYPES,
    ChunkParts,
    decode_frame_header,
    decode_request,
    decode_response,
    encode,
    encode_consume_split,
    is_request,
    is_response,
    message_type,
    response_request_id,
    response_type_for,
)
from headrace.protocols.tank.commands import (
    ConnectionClosed,
    ConsumeResponse,
    Event,
    Message,
    MessageType,
    Ping,
    Request,
)
from headrace.protocols.tank.states import (
    INITIAL_STATE,
    TRANSITIONS,
    Action,
    ConnectionState,
    Input,
    Role,
)

__all__ = ["DEFAULT_MAX_IN_FLIGHT_REQUESTS", "TankConnection"]

_Encoded = TypeVar("_Encoded", bytes, list[bytes | bytearray | memoryview])
"""An encoding ``TankConnection._send`` is given: a whole frame, or its pieces."""

DEFAULT_MAX_IN_FLIGHT_REQUESTS = 16384
"""Requests one connection may have unanswered. TANK has no such limit, but a broker
keeps state for each (a parked consume, a pending produce); the I/O layer should
stop reading well before this (see ``in_flight_count``), so only a peer that
ignores backpressure reaches it."""


class TankConnection:
    """One side of a TANK connection.

    Args:
        role: ``Role.SERVER`` for the broker side (decodes requests, encodes
            responses), ``Role.CLIENT`` for the client side.
        max_payload_bytes: the largest frame payload accepted; a bigger
            announced size raises :class:`FrameTooLarge` before it is buffered.
        max_in_flight_requests: how many requests may await a response.
    """

    __slots__ = (
        "_abandoned",
        "_buffer",
        "_client_in_flight",
        "_events",
        "_max_in_flight_requests",
        "_max_payload_bytes",
        "_outgoing",
        "_role",
        "_server_in_flight",
        "_state",
    )

    def __init__(
        self,
        role: Role,
        *,
        max_payload_bytes: int = MAX_PAYLOAD_BYTES,
        max_in_flight_requests: int = DEFAULT_MAX_IN_FLIGHT_REQUESTS,
    ) -> None:
        self._role = role
        self._state = INITIAL_STATE[role]
        self._max_payload_bytes = max_payload_bytes
        self._max_in_flight_requests = max_in_flight_requests
        # At most one partial frame stays buffered (receive_data parses eagerly).
        self._buffer = ReceiveBuffer(FRAME_HEADER_BYTES + max_payload_bytes)
        self._events: deque[Event] = deque()
        self._outgoing = bytearray()
        # Client: request id -> request, to match and decode responses.
        self._client_in_flight: dict[int, Request] = {}
        # Client: ids given up on (timed out); their late responses are dropped.
        self._abandoned: set[int] = set()
        # Server: (request id, response msg id) -> count; clients may reuse ids.
        self._server_in_flight: Counter[tuple[int, MessageType]] = Counter()
        if role is Role.SERVER:
            self.send(Ping())  # the broker greeting, before anything else (tank.md#lifecycle)

    # ------------------------------------------------------------------ state

    @property
    def role(self) -> Role:
        return self._role

    @property
    def state(self) -> ConnectionState:
        return self._state

    @property
    def in_flight_count(self) -> int:
        """Requests sent (client) or received (server) and not yet answered."""
        if self._role is Role.CLIENT:
            return len(self._client_in_flight)
        return self._server_in_flight.total()

    def _transition(self, event: Input) -> Action:
        action, self._state = self._step(event)
        return action

    def _step(self, event: Input) -> tuple[Action, ConnectionState]:
        """What ``event`` does now; refused (by the peer's fault if it is a receive)."""
        outcome = TRANSITIONS.get((self._role, self._state, event))
        if outcome is None:
            message = f"{self._role.value} cannot {event.value} in state {self._state.value}"
            if event.name.startswith("RECEIVE"):
                raise RemoteProtocolError(message)
            raise LocalProtocolError(message)
        return outcome

    # ------------------------------------------------------------------ receiving

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Feed bytes received from the peer; ``b""`` means the peer closed (EOF).

        Complete frames are decoded at once and queued for :meth:`events`;
        a partial frame stays buffered until the rest arrives. Frames decoded
        before a bad one stay queued.

        Raises:
            RemoteProtocolError: the peer broke the protocol (unknown msg id,
                malformed payload, a response to no request, EOF inside a
                frame...); the connection is then in ``ERROR`` and should be
                closed. :class:`FrameTooLarge` is one of these.
            LocalProtocolError: data after EOF, or after an error.
        """
        if self._state in (ConnectionState.ERROR, ConnectionState.PEER_CLOSED):
            raise LocalProtocolError(f"cannot receive data in state {self._state.value}")
        try:
            if not data:
                if self._buffer:
                    raise RemoteProtocolError(
                        f"connection closed inside a frame ({len(self._buffer)} bytes buffered)"
                    )
                self._transition(Input.RECEIVE_EOF)
                self._events.append(ConnectionClosed())
                return
            view = memoryview(data).cast("B")
            limit = FRAME_HEADER_BYTES + self._max_payload_bytes
            while view:
                room = limit - len(self._buffer)
                assert room > 0, "a whole frame always fits, and complete frames are parsed"
                self._buffer.feed(view[:room])
                view = view[room:]
                self._parse_frames()
        except RemoteProtocolError:
            self._transition(Input.PROTOCOL_ERROR)
            raise

    def _parse_frames(self) -> None:
        allowed = REQUEST_TYPES if self._role is Role.SERVER else RESPONSE_TYPES
        while (header := self._buffer.peek(FRAME_HEADER_BYTES)) is not None:
            msg_id, size = decode_frame_header(header)
            if msg_id not in allowed:
                raise RemoteProtocolError(
                    f"msg id {msg_id:#04x} is not accepted by a {self._role.value}"
                )
            if size > self._max_payload_bytes:
                raise FrameTooLarge(self._max_payload_bytes, size)
            if len(self._buffer) < FRAME_HEADER_BYTES + size:
                return
            self._buffer.consume_exactly(FRAME_HEADER_BYTES)
            payload = self._buffer.consume_exactly(size)
            self._buffer.commit()
            assert payload is not None
            if self._role is Role.SERVER:
                self._receive_request(msg_id, payload)
            else:
                self._receive_response(msg_id, payload)

    def _receive_request(self, msg_id: int, payload: bytes) -> None:
        message = decode_request(msg_id, payload)
        if isinstance(message, Ping):
            self._transition(Input.RECEIVE_PING)
        else:
            if self.in_flight_count >= self._max_in_flight_requests:
                raise RemoteProtocolError(
                    f"more than {self._max_in_flight_requests} requests in flight"
                )
            if self._transition(Input.RECEIVE_REQUEST) is Action.TRACK:  # pragma: no branch
                self._server_in_flight[(message.request_id, response_type_for(message))] += 1
        self._events.append(message)

    def _receive_response(self, msg_id: int, payload: bytes) -> None:
        if msg_id == MessageType.PING:
            message = decode_response(msg_id, payload)
            self._transition(Input.RECEIVE_PING)
            self._events.append(message)
            return
        request_id = response_request_id(msg_id, payload)
        request = self._client_in_flight.get(request_id)
        if request is None or response_type_for(request) != msg_id:
            raise RemoteProtocolError(
                f"{MessageType(msg_id).name} response to request id {request_id}, "
                "which is not waiting for one"
            )
        response = decode_response(msg_id, payload, request)
        if self._transition(Input.RECEIVE_RESPONSE) is Action.SETTLE:  # pragma: no branch
            del self._client_in_flight[request_id]
        if request_id in self._abandoned:
            self._abandoned.discard(request_id)
            return
        self._events.append(response)

    def events(self) -> Iterator[Event]:
        """Yield, and forget, the events decoded so far.

        Events are requests and Pings (server), responses and Pings
        (client), and a final :class:`ConnectionClosed` after EOF.
        """
        while self._events:
            yield self._events.popleft()

    # ------------------------------------------------------------------ sending

    def send(self, message: Message) -> None:
        """Encode ``message`` and queue it for :meth:`data_to_send`.

        A client sends requests and Pings; a server sends responses, each to a
        request it received and has not answered yet (the greeting Ping is sent
        by the constructor).

        Raises:
            LocalProtocolError: the message is not allowed in this role or
                state, answers no pending request, reuses a request id still
                in flight, exceeds the in-flight limit, or has a field the wire
                cannot carry. Nothing is queued then.
        """
        self._send(message, encode, message)

    def send_split(
        self, response: ConsumeResponse, chunks: Mapping[tuple[int, int], ChunkParts]
    ) -> list[bytes | bytearray | memoryview]:
        """Send a consume response whose chunks the caller writes as they are.

        Checked and settled like :meth:`send`, but not queued: the caller
        writes :meth:`data_to_send` (what was queued before), then the returned
        pieces, before anything queued later (``encode_consume_split``).

        Raises:
            LocalProtocolError: as :meth:`send`.
        """
        return self._send(response, encode_consume_split, response, chunks)

    def _send(self, message: Message, encode: Callable[..., _Encoded], *args: object) -> _Encoded:
        """The one way out: every check of sending ``message`` now, then its
        encoding ``encode(*args)``, then the change of state (the request
        tracked, or the request it answers settled).

        The encoding is a whole frame (bytes), which is queued, or the pieces
        of one that the caller writes itself, which are returned.

        Raises:
            LocalProtocolError: not a TANK message, not allowed in this role or
                state, a request id still in flight or one request over the
                limit, a response that answers no pending request, or a field
                the wire cannot carry. Nothing is queued or changed then.
        """
        if isinstance(message, Ping):
            event = Input.SEND_PING
        elif is_request(message):
            event = Input.SEND_REQUEST
        elif is_response(message):
            event = Input.SEND_RESPONSE
        else:
            raise LocalProtocolError(f"not a TANK message: {message!r}")
        action, next_state = self._step(event)
        if action is Action.TRACK:
            assert is_request(message)
            if message.request_id in self._client_in_flight:
                raise LocalProtocolError(f"request id {message.request_id} is already in flight")
            if len(self._client_in_flight) >= self._max_in_flight_requests:
                raise LocalProtocolError(
                    f"more than {self._max_in_flight_requests} requests in flight"
                )
        elif action is Action.SETTLE:
            assert is_response(message)
            key = (message.request_id, message_type(message))
            if not self._server_in_flight[key]:  # a Counter reads 0 for a missing key
                raise LocalProtocolError(
                    f"no {key[1].name} request with id {message.request_id} awaits a response"
                )
        encoded = encode(*args)
        self._state = next_state
        if action is Action.TRACK:
            assert is_request(message)
            self._client_in_flight[message.request_id] = message
        elif action is Action.SETTLE:
            self._server_in_flight[key] -= 1
            if not self._server_in_flight[key]:
                del self._server_in_flight[key]
        if isinstance(encoded, bytes):
            self._outgoing += encoded
        return encoded

    def abandon(self, request_id: int) -> None:
        """Give up on a request (a client-side timeout); its response will be dropped.

        The C++ client does the same: a response that arrives after its request
        timed out is read and ignored. The id stays in flight, and cannot be
        reused, until that response arrives.

        Raises:
            LocalProtocolError: not a client, or no such request in flight.
        """
        if self._role is not Role.CLIENT or request_id not in self._client_in_flight:
            raise LocalProtocolError(f"no request with id {request_id} to abandon")
        self._abandoned.add(request_id)

    @property
    def buffered_bytes(self) -> int:
        """Bytes received that do not make a whole frame yet (0 between frames)."""
        return len(self._buffer)

    def data_to_send(self) -> bytes:
        """Take the bytes queued by :meth:`send` (and the greeting); empty if none."""
        data = bytes(self._outgoing)
        self._outgoing.clear()
        return data
