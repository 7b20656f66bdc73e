"""Reactive Streams IO (rsio-v0): subscribers with request-n back-pressure, sans-I/O.

``commands`` holds the messages and events, ``codec`` the bytes and the
limits, ``states`` the transition tables and the demand window, and
``connection`` the :class:`ReactiveConnection` that ties them together. The
wire format is this project's choice (``docs/protocols/rsio.md``).
"""

from __future__ import annotations

from headrace.protocols.rsio.codec import (
    DEFAULT_MAX_ELEMENT_BYTES,
    DEFAULT_MAX_FRAME_BYTES,
    GOODBYE_TIMEOUT_S,
    MAX_DEMAND,
    MAX_HELLO_EXTENSIONS,
    MAX_ID,
    MIN_MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
    SPLIT_THRESHOLD_BYTES,
    decode_message,
    encode_frame,
    encode_message,
    split_element,
)
from headrace.protocols.rsio.commands import (
    Cancel,
    ClientHello,
    ConnectionClosed,
    Event,
    Goodbye,
    IllegalDemand,
    Message,
    MessageType,
    OnComplete,
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
from headrace.protocols.rsio.connection import DEFAULT_MAX_PUBLICATIONS, ReactiveConnection
from headrace.protocols.rsio.states import (
    ConnectionState,
    DemandWindow,
    PublisherState,
    Role,
    SubscriberState,
)

__all__ = [
    "DEFAULT_MAX_ELEMENT_BYTES",
    "DEFAULT_MAX_FRAME_BYTES",
    "DEFAULT_MAX_PUBLICATIONS",
    "GOODBYE_TIMEOUT_S",
    "MAX_DEMAND",
    "MAX_HELLO_EXTENSIONS",
    "MAX_ID",
    "MIN_MAX_FRAME_BYTES",
    "PROTOCOL_VERSION",
    "SPLIT_THRESHOLD_BYTES",
    "Cancel",
    "ClientHello",
    "ConnectionClosed",
    "ConnectionState",
    "DemandWindow",
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
    "PublisherState",
    "ReactiveConnection",
    "Request",
    "Role",
    "ServerHello",
    "Subscribe",
    "Subscribed",
    "SubscriberState",
    "SubscriptionAborted",
    "decode_message",
    "encode_frame",
    "encode_message",
    "split_element",
]
