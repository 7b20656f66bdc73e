"""Reactive Streams IO (rsio-v0) messages and connection events, as data.

Every message of ``docs/protocols/rsio.md`` is
one frozen, slotted dataclass named as in the draft (``subscribe``,
``onNext``...), with its wire type code in :class:`MessageType`. The codec
turns them into bytes and back; the connection checks the order they may come
in. Nothing here validates: a value that cannot be encoded is refused by the
codec (``LocalProtocolError``), a value that breaks a rule is refused by the
connection.

Besides the thirteen messages, a :class:`~.connection.ReactiveConnection` hands
out three events that have no wire form (:class:`ConnectionClosed`,
:class:`IllegalDemand`, :class:`SubscriptionAborted`); they report what the
connection did on its own so that the application can release resources.

Id namespaces (rsio.md#rule-namespaces): ``subscriber`` always names an Id chosen by
the *subscribing* side. In ``Subscribe``/``Request``/``Cancel`` that is the
sender; in ``Subscribed``/``OnNext*``/``OnComplete``/``OnError`` it is the
receiver.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

__all__ = [
    "PUBLISHER_SIDE_TYPES",
    "SUBSCRIBER_SIDE_TYPES",
    "Cancel",
    "ClientHello",
    "ConnectionClosed",
    "Event",
    "Goodbye",
    "IllegalDemand",
    "Message",
    "MessageType",
    "OnComplete",
    "OnError",
    "OnNext",
    "OnNextLastPart",
    "OnNextPacked",
    "OnNextPart",
    "Request",
    "ServerHello",
    "Subscribe",
    "Subscribed",
    "SubscriptionAborted",
]


class MessageType(enum.IntEnum):
    """Message type codes (rsio.md#type-codes), sent as a varint that is one byte for all of them.

    Code 0 is reserved so that zero-filled garbage is caught; 14-63 are
    reserved for future core versions, 64 and above for extensions. This
    project negotiates no extensions, so every code not listed here is a
    protocol error.
    """

    CLIENT_HELLO = 1
    SERVER_HELLO = 2
    GOODBYE = 3
    SUBSCRIBE = 4
    REQUEST = 5
    CANCEL = 6
    SUBSCRIBED = 7
    ON_NEXT = 8
    ON_NEXT_PACKED = 9
    ON_NEXT_PART = 10
    ON_NEXT_LAST_PART = 11
    ON_COMPLETE = 12
    ON_ERROR = 13


SUBSCRIBER_SIDE_TYPES = frozenset({MessageType.SUBSCRIBE, MessageType.REQUEST, MessageType.CANCEL})
"""Messages a subscriber sends (``-->`` in the draft); their Id is the sender's."""

PUBLISHER_SIDE_TYPES = frozenset(
    {
        MessageType.SUBSCRIBED,
        MessageType.ON_NEXT,
        MessageType.ON_NEXT_PACKED,
        MessageType.ON_NEXT_PART,
        MessageType.ON_NEXT_LAST_PART,
        MessageType.ON_COMPLETE,
        MessageType.ON_ERROR,
    }
)
"""Messages a publisher sends (``<--`` in the draft); their Id is the receiver's.

Each of them starts with the ``subscriber`` Id, which lets a receiver route
(or drop) the frame before it knows the subscription's ``elementSize``.
"""


# ---------------------------------------------------------------------------------------- handshake


@dataclass(frozen=True, slots=True)
class ClientHello:
    """``clientHello(version, extensions)``: first message of the connection opener
    (rsio.md#rule-hellos)."""

    TYPE: ClassVar[MessageType] = MessageType.CLIENT_HELLO
    version: int
    extensions: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class ServerHello:
    """``serverHello(version, extensions)``: first message of the acceptor, sent unprompted."""

    TYPE: ClassVar[MessageType] = MessageType.SERVER_HELLO
    version: int
    extensions: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Goodbye:
    """``goodbye(reason)``: ends the connection and, implicitly, every subscription
    (rsio.md#goodbye).

    The reply to a ``goodbye`` is a ``goodbye`` too (the later draft's
    ``goodbyeAck``), usually with an empty reason.
    """

    TYPE: ClassVar[MessageType] = MessageType.GOODBYE
    reason: str = ""


# -------------------------------------------------------------------------- subscriber -> publisher


@dataclass(frozen=True, slots=True)
class Subscribe:
    """``subscribe(publisher, subscriber, initialDemand)``: open subscription ``subscriber``.

    ``publisher`` is opaque to the protocol (this server reads it as
    ``<stream>[?from=...]``, rsio.md#publisher-strings). ``initial_demand`` may be 0 … 2^63-1.
    """

    TYPE: ClassVar[MessageType] = MessageType.SUBSCRIBE
    publisher: str
    subscriber: int
    initial_demand: int = 0


@dataclass(frozen=True, slots=True)
class Request:
    """``request(subscriber, demand)``: add ``demand`` (1 … 2^63-1) to the outstanding demand."""

    TYPE: ClassVar[MessageType] = MessageType.REQUEST
    subscriber: int
    demand: int


@dataclass(frozen=True, slots=True)
class Cancel:
    """``cancel(subscriber)``: the subscriber wants nothing more for this Id."""

    TYPE: ClassVar[MessageType] = MessageType.CANCEL
    subscriber: int


# -------------------------------------------------------------------------- publisher -> subscriber


@dataclass(frozen=True, slots=True)
class Subscribed:
    """``subscribed(subscriber, elementSize)`` (later ``onSubscribe``): always the first reply.

    ``element_size`` 0 means variable-size elements; above 0 every element of
    the subscription is exactly that many bytes (rsio.md#rule-element-size).
    """

    TYPE: ClassVar[MessageType] = MessageType.SUBSCRIBED
    subscriber: int
    element_size: int = 0


@dataclass(frozen=True, slots=True)
class OnNext:
    """``onNext(subscriber, element)``: one element; uses one unit of demand.

    A connection also delivers a reassembled split element (rsio.md#split-elements) as one
    ``OnNext``.
    """

    TYPE: ClassVar[MessageType] = MessageType.ON_NEXT
    subscriber: int
    element: bytes


@dataclass(frozen=True, slots=True)
class OnNextPacked:
    """``onNextPacked(subscriber, count, messages)``: ``count`` fixed-size elements back to back.

    Only allowed when the subscription's ``elementSize`` is above 0; uses
    ``count`` units of demand. ``messages`` is ``count x elementSize`` bytes;
    the element size is not on the wire again, so it is recovered as
    ``len(messages) // count``.
    """

    TYPE: ClassVar[MessageType] = MessageType.ON_NEXT_PACKED
    subscriber: int
    count: int
    messages: bytes

    @property
    def element_size(self) -> int:
        """Bytes per element (0 for a malformed message with ``count`` 0)."""
        return len(self.messages) // self.count if self.count > 0 else 0

    def elements(self) -> Iterator[bytes]:
        """The packed elements, one ``bytes`` each, in order."""
        size = self.element_size
        for index in range(self.count):
            yield self.messages[index * size : (index + 1) * size]


@dataclass(frozen=True, slots=True)
class OnNextPart:
    """``onNextPart(subscriber, element, data)``: a non-final part of split element ``element``."""

    TYPE: ClassVar[MessageType] = MessageType.ON_NEXT_PART
    subscriber: int
    element: int
    data: bytes


@dataclass(frozen=True, slots=True)
class OnNextLastPart:
    """``onNextLastPart(subscriber, element, data)``: the final part; the element is complete."""

    TYPE: ClassVar[MessageType] = MessageType.ON_NEXT_LAST_PART
    subscriber: int
    element: int
    data: bytes


@dataclass(frozen=True, slots=True)
class OnComplete:
    """``onComplete(subscriber)``: terminal; nothing more follows for this Id."""

    TYPE: ClassVar[MessageType] = MessageType.ON_COMPLETE
    subscriber: int


@dataclass(frozen=True, slots=True)
class OnError:
    """``onError(subscriber, error)``: terminal, with a reason; nothing more follows for this Id."""

    TYPE: ClassVar[MessageType] = MessageType.ON_ERROR
    subscriber: int
    error: str


Message = (
    ClientHello
    | ServerHello
    | Goodbye
    | Subscribe
    | Request
    | Cancel
    | Subscribed
    | OnNext
    | OnNextPacked
    | OnNextPart
    | OnNextLastPart
    | OnComplete
    | OnError
)
"""Every rsio-v0 message; what ``ReactiveConnection.send`` accepts and the codec encodes."""


# ----------------------------------------------------------------------- events without a wire form


@dataclass(frozen=True, slots=True)
class ConnectionClosed:
    """The peer closed the transport (``receive_data(b"")``); always the last event.

    Every subscription still open was ended first, with the same events a
    ``goodbye`` produces (``OnError`` for ours, ``Cancel`` for the peer's).
    """


@dataclass(frozen=True, slots=True)
class IllegalDemand:
    """The peer subscriber asked for demand outside 1 … 2^63-1 (rsio.md#rule-demand).

    The connection has already queued ``onError(subscriber, "illegal demand")``
    (after ``subscribed(subscriber, 0)`` if the application had not sent it) and
    closed the subscription; the application must stop producing for it.
    ``subscriber`` is in the peer's namespace, like ``Subscribe.subscriber``.
    """

    subscriber: int
    demand: int


@dataclass(frozen=True, slots=True)
class SubscriptionAborted:
    """The peer publisher broke a rule of one of our subscriptions (rsio.md#rule-demand).

    Examples: more elements than requested, a split element interleaved with
    other elements, a reassembled element over the size limit. The connection
    has already queued ``cancel(subscriber)`` and closed the subscription; this
    is the "report the error locally" of rsio.md#rule-demand. ``subscriber`` is in our
    namespace, like ``Subscribe.subscriber`` when we sent it.
    """

    subscriber: int
    reason: str


Event = Message | ConnectionClosed | IllegalDemand | SubscriptionAborted
"""Everything ``ReactiveConnection.events()`` yields."""
