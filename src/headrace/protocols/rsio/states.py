"""rsio-v0 state machines as tables, and the demand window.

Theory of operation
===================

One connection runs three kinds of state machine, each a dict
``(state, input) -> (action, next_state)``:

* **The connection** (:data:`CONNECTION_TRANSITIONS`): the handshake and the
  goodbye exchange (rsio.md#rule-hellos, rsio.md#goodbye). Our own hello is queued when the
  connection is created (the "loose" handshake, rsio.md#hello), so the only thing to
  wait for is the peer's hello; until it arrives, only a hello may be
  received, while we may already send (pipelining). A ``goodbye`` from either
  side ends every subscription at once.

* **One subscriber machine per subscription we opened**
  (:data:`SUBSCRIBER_TRANSITIONS`), keyed by the Id *we* chose. It drops
  everything the publisher sends for the Id until ``subscribed`` (rsio.md#rule-subscribed-first:
  those messages belong to an earlier use of the Id), reassembles split
  elements, and checks that the publisher stays within demand.

* **One publisher machine per subscription the peer opened on us**
  (:data:`PUBLISHER_TRANSITIONS`), keyed by the Id the *peer* chose. It makes
  our application send ``subscribed`` first, stay within demand, finish a
  split element before anything else, and stop after a terminal signal.

Because both sides may subscribe (the protocol is fully bidirectional, rsio.md#scope),
every connection has both kinds of subscription machine; the two Id
namespaces (rsio.md#rule-namespaces) are two dicts, so Id 1 may be in use both ways.

Inputs are named ``SEND_*`` (our application calls ``send``) or ``RECV_*``
(a message arrived). Actions:

* ``SEND`` - a local input that is allowed; the message is queued.
* ``DELIVER`` - a received message that is allowed; it becomes an event (a
  split element's parts are held until the last one, then delivered as one
  ``OnNext``).
* ``IGNORE`` - dropped without an event: stale messages for a reused Id
  (rsio.md#rule-subscribed-first), anything after a terminal signal or a goodbye (rules 6, 7),
  and a ``request``/``cancel`` sent on a cancelled subscription, which
  Reactive Streams §3.6/§3.7 make no-ops.
* ``ABORT`` - the publisher broke a rule of one subscription: we send
  ``cancel`` and report :class:`~.commands.SubscriptionAborted` (rsio.md#rule-demand).

A pair that is not in a table is refused: a ``SEND_*`` raises
``LocalProtocolError`` and changes nothing; a ``RECV_*`` is a connection
protocol error (connection table, answered by ``goodbye``) or an ``ABORT``
(subscriber table). The publisher table has no missing ``RECV_*`` pair.

Rules that depend on values rather than on order are checked by the
connection after the table allowed the step, and can only make it stricter:
the demand window (:class:`DemandWindow`: no more elements than requested,
``request`` of 1 … 2^63-1), the split element Id (the same until its last
part), the reassembled size, and ``elementSize``. Subscription machines leave
their dict when they reach ``CLOSED``, which is what frees the Id for reuse.

``scripts/rsio_state_diagram.py`` draws these tables for
``docs/protocols/rsio.md``; edit the tables, then rerun it.
"""

from __future__ import annotations

import enum

from headrace.protocols.rsio.codec import MAX_DEMAND

__all__ = [
    "CONNECTION_ON_PROTOCOL_ERROR",
    "CONNECTION_TRANSITIONS",
    "PUBLISHER_TRANSITIONS",
    "SUBSCRIBER_TRANSITIONS",
    "Action",
    "ConnectionInput",
    "ConnectionState",
    "DemandWindow",
    "PublisherInput",
    "PublisherState",
    "Role",
    "SubscriberInput",
    "SubscriberState",
]


class Role(enum.Enum):
    """Which end of the transport we are; it decides only which hello each side sends.

    ``CLIENT`` opened the connection and sends ``clientHello``; ``SERVER``
    accepted it and sends ``serverHello`` (rsio.md#hello). Either may subscribe or
    publish.
    """

    CLIENT = "client"
    SERVER = "server"


class Action(enum.Enum):
    """What a transition does besides changing state (see the module header)."""

    SEND = "send"
    DELIVER = "deliver"
    IGNORE = "ignore"
    ABORT = "abort"


# --------------------------------------------------------------------------- connection


class ConnectionState(enum.Enum):
    """Where the connection is in the handshake and goodbye exchange (rsio.md#goodbye)."""

    AWAITING_HELLO = "awaiting hello"
    """Our hello is queued; the peer's has not arrived. We may already send."""
    OPEN = "open"
    GOODBYE_SENT = "goodbye sent"
    """We said goodbye; waiting for the peer's reply. Anything else received is dropped."""
    CLOSED = "closed"
    """Goodbyes exchanged or the transport closed: nothing more is sent."""
    ERROR = "error"
    """The peer broke the protocol; only our ``goodbye(<description>)`` may still be sent."""


class ConnectionInput(enum.Enum):
    """What moves the connection machine: message classes by direction, and EOF."""

    RECV_HELLO = "recv hello"
    RECV_GOODBYE = "recv goodbye"
    RECV_MESSAGE = "recv message"
    RECV_EOF = "recv EOF"
    SEND_GOODBYE = "send goodbye"
    SEND_MESSAGE = "send message"


_C = ConnectionState
_CI = ConnectionInput

CONNECTION_TRANSITIONS: dict[
    tuple[ConnectionState, ConnectionInput], tuple[Action, ConnectionState]
]
CONNECTION_TRANSITIONS = {
    (_C.AWAITING_HELLO, _CI.RECV_HELLO): (Action.DELIVER, _C.OPEN),
    (_C.AWAITING_HELLO, _CI.RECV_EOF): (Action.DELIVER, _C.CLOSED),
    (_C.AWAITING_HELLO, _CI.SEND_MESSAGE): (Action.SEND, _C.AWAITING_HELLO),
    (_C.AWAITING_HELLO, _CI.SEND_GOODBYE): (Action.SEND, _C.GOODBYE_SENT),
    (_C.OPEN, _CI.RECV_MESSAGE): (Action.DELIVER, _C.OPEN),
    (_C.OPEN, _CI.RECV_GOODBYE): (Action.DELIVER, _C.CLOSED),
    (_C.OPEN, _CI.RECV_EOF): (Action.DELIVER, _C.CLOSED),
    (_C.OPEN, _CI.SEND_MESSAGE): (Action.SEND, _C.OPEN),
    (_C.OPEN, _CI.SEND_GOODBYE): (Action.SEND, _C.GOODBYE_SENT),
    (_C.GOODBYE_SENT, _CI.RECV_HELLO): (Action.IGNORE, _C.GOODBYE_SENT),
    (_C.GOODBYE_SENT, _CI.RECV_MESSAGE): (Action.IGNORE, _C.GOODBYE_SENT),
    (_C.GOODBYE_SENT, _CI.RECV_GOODBYE): (Action.DELIVER, _C.CLOSED),
    (_C.GOODBYE_SENT, _CI.RECV_EOF): (Action.DELIVER, _C.CLOSED),
    (_C.CLOSED, _CI.RECV_HELLO): (Action.IGNORE, _C.CLOSED),
    (_C.CLOSED, _CI.RECV_MESSAGE): (Action.IGNORE, _C.CLOSED),
    (_C.CLOSED, _CI.RECV_GOODBYE): (Action.IGNORE, _C.CLOSED),
    (_C.CLOSED, _CI.RECV_EOF): (Action.DELIVER, _C.CLOSED),
    (_C.ERROR, _CI.SEND_GOODBYE): (Action.SEND, _C.CLOSED),
}
"""Connection table. Missing ``RECV_*``: protocol error (a message before the peer's
hello, a second hello). Missing ``SEND_*``: ``LocalProtocolError``."""

CONNECTION_ON_PROTOCOL_ERROR: dict[ConnectionState, ConnectionState] = {
    _C.AWAITING_HELLO: _C.ERROR,
    _C.OPEN: _C.ERROR,
    _C.GOODBYE_SENT: _C.CLOSED,
    _C.CLOSED: _C.CLOSED,
    _C.ERROR: _C.ERROR,
}
"""Where a protocol error by the peer leads, from each state (rsio.md#goodbye: answered with
``goodbye(<description>)``, then close). From ``ERROR`` we may still send that goodbye;
after our own goodbye there is nothing left to say, so the connection is ``CLOSED``."""


# --------------------------------------------------------------------------- subscriber side


class SubscriberState(enum.Enum):
    """A subscription we opened, as its subscriber (rules 3, 5, 6, rsio.md#connection-rules)."""

    AWAITING_SUBSCRIBED = "awaiting subscribed"
    """``subscribe`` sent; publisher messages for the Id are stale until ``subscribed``."""
    ACTIVE = "active"
    RECEIVING_PARTS = "receiving parts"
    """Between the first ``onNextPart`` and ``onNextLastPart`` of a split element."""
    CANCELLED = "cancelled"
    """Cancelled before ``subscribed`` arrived; the Id stays taken until it does."""
    CLOSED = "closed"
    """Terminal; the machine is forgotten and the Id may be reused."""


class SubscriberInput(enum.Enum):
    """What we send for our subscription, and what its publisher sends us."""

    SEND_SUBSCRIBE = "send subscribe"
    SEND_REQUEST = "send request"
    SEND_CANCEL = "send cancel"
    RECV_SUBSCRIBED = "recv subscribed"
    RECV_ON_NEXT = "recv onNext"
    RECV_ON_NEXT_PACKED = "recv onNextPacked"
    RECV_ON_NEXT_PART = "recv onNextPart"
    RECV_ON_NEXT_LAST_PART = "recv onNextLastPart"
    RECV_ON_COMPLETE = "recv onComplete"
    RECV_ON_ERROR = "recv onError"


_S = SubscriberState
_SI = SubscriberInput
_STALE = (
    _SI.RECV_ON_NEXT,
    _SI.RECV_ON_NEXT_PACKED,
    _SI.RECV_ON_NEXT_PART,
    _SI.RECV_ON_NEXT_LAST_PART,
    _SI.RECV_ON_COMPLETE,
    _SI.RECV_ON_ERROR,
)

SUBSCRIBER_TRANSITIONS: dict[
    tuple[SubscriberState, SubscriberInput], tuple[Action, SubscriberState]
]
SUBSCRIBER_TRANSITIONS = {
    (_S.CLOSED, _SI.SEND_SUBSCRIBE): (Action.SEND, _S.AWAITING_SUBSCRIBED),
    (_S.CLOSED, _SI.SEND_REQUEST): (Action.IGNORE, _S.CLOSED),  # Reactive Streams §3.6
    (_S.CLOSED, _SI.SEND_CANCEL): (Action.IGNORE, _S.CLOSED),  # Reactive Streams §3.7
    # No machine: in flight after cancel or a terminal signal (rules 6, 7,
    # rsio.md#connection-rules).
    (_S.CLOSED, _SI.RECV_SUBSCRIBED): (Action.IGNORE, _S.CLOSED),
    **{(_S.CLOSED, i): (Action.IGNORE, _S.CLOSED) for i in _STALE},
    # Before subscribed: everything from the publisher is from an earlier use of the Id.
    (_S.AWAITING_SUBSCRIBED, _SI.RECV_SUBSCRIBED): (Action.DELIVER, _S.ACTIVE),
    **{(_S.AWAITING_SUBSCRIBED, i): (Action.IGNORE, _S.AWAITING_SUBSCRIBED) for i in _STALE},
    (_S.AWAITING_SUBSCRIBED, _SI.SEND_REQUEST): (Action.SEND, _S.AWAITING_SUBSCRIBED),
    (_S.AWAITING_SUBSCRIBED, _SI.SEND_CANCEL): (Action.SEND, _S.CANCELLED),
    # Cancelled early: wait for the subscribed that is still coming, then free the Id.
    (_S.CANCELLED, _SI.RECV_SUBSCRIBED): (Action.IGNORE, _S.CLOSED),
    **{(_S.CANCELLED, i): (Action.IGNORE, _S.CANCELLED) for i in _STALE},
    (_S.CANCELLED, _SI.SEND_REQUEST): (Action.IGNORE, _S.CANCELLED),
    (_S.CANCELLED, _SI.SEND_CANCEL): (Action.IGNORE, _S.CANCELLED),
    (_S.ACTIVE, _SI.RECV_ON_NEXT): (Action.DELIVER, _S.ACTIVE),
    (_S.ACTIVE, _SI.RECV_ON_NEXT_PACKED): (Action.DELIVER, _S.ACTIVE),
    (_S.ACTIVE, _SI.RECV_ON_NEXT_PART): (Action.DELIVER, _S.RECEIVING_PARTS),
    (_S.ACTIVE, _SI.RECV_ON_COMPLETE): (Action.DELIVER, _S.CLOSED),
    (_S.ACTIVE, _SI.RECV_ON_ERROR): (Action.DELIVER, _S.CLOSED),
    (_S.ACTIVE, _SI.RECV_SUBSCRIBED): (Action.ABORT, _S.CLOSED),
    (_S.ACTIVE, _SI.RECV_ON_NEXT_LAST_PART): (Action.ABORT, _S.CLOSED),
    (_S.ACTIVE, _SI.SEND_REQUEST): (Action.SEND, _S.ACTIVE),
    (_S.ACTIVE, _SI.SEND_CANCEL): (Action.SEND, _S.CLOSED),
    (_S.RECEIVING_PARTS, _SI.RECV_ON_NEXT_PART): (Action.DELIVER, _S.RECEIVING_PARTS),
    (_S.RECEIVING_PARTS, _SI.RECV_ON_NEXT_LAST_PART): (Action.DELIVER, _S.ACTIVE),
    (_S.RECEIVING_PARTS, _SI.RECV_ON_ERROR): (Action.DELIVER, _S.CLOSED),  # partial dropped
    (_S.RECEIVING_PARTS, _SI.RECV_SUBSCRIBED): (Action.ABORT, _S.CLOSED),
    (_S.RECEIVING_PARTS, _SI.RECV_ON_NEXT): (Action.ABORT, _S.CLOSED),
    (_S.RECEIVING_PARTS, _SI.RECV_ON_NEXT_PACKED): (Action.ABORT, _S.CLOSED),
    (_S.RECEIVING_PARTS, _SI.RECV_ON_COMPLETE): (Action.ABORT, _S.CLOSED),
    (_S.RECEIVING_PARTS, _SI.SEND_REQUEST): (Action.SEND, _S.RECEIVING_PARTS),
    (_S.RECEIVING_PARTS, _SI.SEND_CANCEL): (Action.SEND, _S.CLOSED),
}
"""Subscriber table. ``CLOSED`` stands for "no machine for this Id". Missing ``SEND_*``:
``LocalProtocolError`` (``subscribe`` on an Id in use). Every ``RECV_*`` pair is
listed.
An allowed onNext/onNextPacked/first onNextPart beyond demand, a changed split element
Id, an element over the size limit or of the wrong fixed size becomes ``ABORT``."""


# --------------------------------------------------------------------------- publisher side


class PublisherState(enum.Enum):
    """A subscription the peer opened on us, as its publisher (rules 3-6,
    rsio.md#connection-rules)."""

    SUBSCRIBE_RECEIVED = "subscribe received"
    """The peer subscribed; our application owes ``subscribed`` before anything else."""
    ACTIVE = "active"
    SENDING_PARTS = "sending parts"
    """Between our first ``onNextPart`` and ``onNextLastPart`` of a split element."""
    CLOSED = "closed"
    """Terminal; the machine is forgotten and the peer may reuse the Id."""


class PublisherInput(enum.Enum):
    """What the peer subscriber sends us, and what we send it."""

    RECV_SUBSCRIBE = "recv subscribe"
    RECV_REQUEST = "recv request"
    RECV_CANCEL = "recv cancel"
    SEND_SUBSCRIBED = "send subscribed"
    SEND_ON_NEXT = "send onNext"
    SEND_ON_NEXT_PACKED = "send onNextPacked"
    SEND_ON_NEXT_PART = "send onNextPart"
    SEND_ON_NEXT_LAST_PART = "send onNextLastPart"
    SEND_ON_COMPLETE = "send onComplete"
    SEND_ON_ERROR = "send onError"


_P = PublisherState
_PI = PublisherInput

PUBLISHER_TRANSITIONS: dict[tuple[PublisherState, PublisherInput], tuple[Action, PublisherState]]
PUBLISHER_TRANSITIONS = {
    (_P.CLOSED, _PI.RECV_SUBSCRIBE): (Action.DELIVER, _P.SUBSCRIBE_RECEIVED),
    (_P.CLOSED, _PI.RECV_REQUEST): (Action.IGNORE, _P.CLOSED),  # rsio.md#rule-unknown-ids: a race
    (_P.CLOSED, _PI.RECV_CANCEL): (Action.IGNORE, _P.CLOSED),
    (_P.SUBSCRIBE_RECEIVED, _PI.RECV_REQUEST): (Action.DELIVER, _P.SUBSCRIBE_RECEIVED),
    (_P.SUBSCRIBE_RECEIVED, _PI.RECV_CANCEL): (Action.DELIVER, _P.CLOSED),
    (_P.SUBSCRIBE_RECEIVED, _PI.SEND_SUBSCRIBED): (Action.SEND, _P.ACTIVE),
    (_P.ACTIVE, _PI.RECV_REQUEST): (Action.DELIVER, _P.ACTIVE),
    (_P.ACTIVE, _PI.RECV_CANCEL): (Action.DELIVER, _P.CLOSED),
    (_P.ACTIVE, _PI.SEND_ON_NEXT): (Action.SEND, _P.ACTIVE),
    (_P.ACTIVE, _PI.SEND_ON_NEXT_PACKED): (Action.SEND, _P.ACTIVE),
    (_P.ACTIVE, _PI.SEND_ON_NEXT_PART): (Action.SEND, _P.SENDING_PARTS),
    (_P.ACTIVE, _PI.SEND_ON_COMPLETE): (Action.SEND, _P.CLOSED),
    (_P.ACTIVE, _PI.SEND_ON_ERROR): (Action.SEND, _P.CLOSED),
    (_P.SENDING_PARTS, _PI.RECV_REQUEST): (Action.DELIVER, _P.SENDING_PARTS),
    (_P.SENDING_PARTS, _PI.RECV_CANCEL): (Action.DELIVER, _P.CLOSED),
    (_P.SENDING_PARTS, _PI.SEND_ON_NEXT_PART): (Action.SEND, _P.SENDING_PARTS),
    (_P.SENDING_PARTS, _PI.SEND_ON_NEXT_LAST_PART): (Action.SEND, _P.ACTIVE),
    (_P.SENDING_PARTS, _PI.SEND_ON_ERROR): (Action.SEND, _P.CLOSED),
}
"""Publisher table. ``CLOSED`` stands for "no machine for this Id". Missing ``SEND_*``:
``LocalProtocolError`` (onNext before subscribed, after onComplete, in the middle of a
split element...). ``RECV_SUBSCRIBE`` on a live Id is a connection error (rsio.md#rule-duplicate-id,
"duplicate subscriber id"). A ``RECV_REQUEST`` outside 1 … 2^63-1 ends the subscription
with ``onError(id, "illegal demand")`` instead of being delivered."""


# --------------------------------------------------------------------------- demand


class DemandWindow:
    """The outstanding demand of one subscription: the only place demand arithmetic happens.

    Both ends keep one per subscription and apply the same steps in the same
    order, so they agree without talking about it: the publisher to know how
    many elements it may still send, the subscriber to catch a publisher that
    sends more (rsio.md#rule-demand, Reactive Streams §1.1).

    * ``request(n)`` adds ``n``; the sum saturates at :data:`MAX_DEMAND`
      (2^63-1, Java's ``Long.MAX_VALUE``), which means *unbounded*
      (Reactive Streams §3.17).
    * Unbounded is sticky: once the window is at the cap, sending elements no
      longer lowers it. (A publisher could not send 2^63-1 elements anyway;
      this keeps "unbounded" from ever running out.)
    * ``consume(count)`` takes ``count`` elements' worth: 1 per ``onNext``
      and per split element (at its first part), ``count`` per
      ``onNextPacked``.

    The publisher's window never exceeds the subscriber's: the subscriber
    counts its requests before they arrive and the elements only once they
    have arrived. Stickiness keeps that true at the cap too. (Were the cap
    not sticky, a publisher could saturate a sum that an element in flight had
    already lowered on the subscriber's side, and be one element ahead.) So a
    publisher that keeps to its own window is never flagged by the
    subscriber. Once the subscriber is unbounded the two may differ by the
    elements that were in flight, which only ever leaves the publisher lower.

    The caller checks legality first (:meth:`is_legal_request`,
    :meth:`can_consume`) and turns a refusal into the right error for its side;
    this class only asserts.
    """

    __slots__ = ("_outstanding",)

    def __init__(self, initial_demand: int = 0) -> None:
        assert self.is_legal_initial_demand(initial_demand), initial_demand
        self._outstanding = initial_demand

    def __repr__(self) -> str:
        return f"DemandWindow({'unbounded' if self.unbounded else self._outstanding})"

    @staticmethod
    def is_legal_initial_demand(demand: int) -> bool:
        """``subscribe.initialDemand`` may be 0 … 2^63-1 (rsio.md#rule-demand)."""
        return 0 <= demand <= MAX_DEMAND

    @staticmethod
    def is_legal_request(demand: int) -> bool:
        """``request.demand`` must be 1 … 2^63-1 (rsio.md#rule-demand; Reactive Streams §3.9)."""
        return 1 <= demand <= MAX_DEMAND

    @property
    def outstanding(self) -> int:
        """Elements that may still be sent; :data:`MAX_DEMAND` when unbounded."""
        return self._outstanding

    @property
    def unbounded(self) -> bool:
        return self._outstanding == MAX_DEMAND

    def request(self, demand: int) -> None:
        """Add a legal ``request(demand)``, saturating at the unbounded cap."""
        assert self.is_legal_request(demand), demand
        self._outstanding = min(self._outstanding + demand, MAX_DEMAND)

    def can_consume(self, count: int) -> bool:
        """Whether ``count`` more elements are within demand."""
        return count <= self._outstanding

    def consume(self, count: int) -> None:
        """Take ``count`` elements' worth of demand; :meth:`can_consume` must be true."""
        assert count >= 1 and self.can_consume(count), (count, self._outstanding)
        if not self.unbounded:
            self._outstanding -= count
