"""Lumberjack v1/v2 wire frames and the events the connection hands out.

Two families live here, frozen slotted dataclasses (``Batch``: a class of
its own that behaves as one):

* **Frames** (``WindowSize``, ``Data``, ``JsonData``, ``Compressed``, ``Ack``)
  are what travels on the wire, one class per frame type
  (``docs/protocols/lumberjack.md#frames``), named as the protocol names
  them. A frame does not carry its version byte: the codec takes and returns
  the version beside the frame, and a connection fixes one version for all of
  its frames (so a server can write ``send(Ack(seq))``).
* **Events** (``Event``, ``Batch``, ``ConnectionClosed``) are what a
  ``LumberjackConnection`` produces for the layer above it. A server sees
  ``Batch`` events; a client sees ``Ack`` frames.

Nothing in this module parses or checks bytes; see ``codec.py``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "Ack",
    "Batch",
    "Compressed",
    "ConnectionClosed",
    "Data",
    "Event",
    "Frame",
    "FrameType",
    "InnerFrame",
    "JsonData",
    "ProtocolVersion",
    "WindowSize",
]


class ProtocolVersion(enum.IntEnum):
    """The version byte every frame starts with (lumberjack.md#framing).

    A server fixes a connection's version from the first byte it receives.
    """

    V1 = 0x31
    """ASCII ``'1'``: logstash-forwarder, npm lumberjack-protocol, the Ruby client."""

    V2 = 0x32
    """ASCII ``'2'``: Beats/libbeat, go-lumber, pylogbeat, npm lumberjack-client."""


class FrameType(enum.IntEnum):
    """The frame type byte, one ASCII letter (lumberjack.md#frames)."""

    WINDOW_SIZE = 0x57
    """``'W'``, client to server, v1 and v2: ``count:u32`` data frames follow."""

    DATA = 0x44
    """``'D'``, client to server, v1 only: ``seq:u32 pairs:u32`` then key/value pairs."""

    JSON_DATA = 0x4A
    """``'J'``, client to server, v2 only: ``seq:u32 len:u32 json[len]``."""

    COMPRESSED = 0x43
    """``'C'``, client to server, v1 and v2: ``len:u32 zlib[len]`` holding whole frames."""

    ACK = 0x41
    """``'A'``, server to client, v1 and v2: ``seq:u32``, cumulative."""


# --------------------------------------------------------------------------- frames


@dataclass(frozen=True, slots=True)
class WindowSize:
    """``W``: the client will send ``count`` data frames before it waits for an ack.

    ``count`` may be 0 (pylogbeat's empty ``send([])``); the server then answers
    with the last ack it gave (lumberjack.md#windows).
    """

    count: int


@dataclass(frozen=True, slots=True)
class Data:
    """``D`` (v1): one event as key/value byte strings.

    ``pairs`` keeps the wire order and any duplicate keys; when the event is
    turned into JSON the last value of a duplicated key wins (lumberjack.md#frame-d).
    """

    seq: int
    pairs: tuple[tuple[bytes, bytes], ...]


@dataclass(frozen=True, slots=True)
class JsonData:
    """``J`` (v2): one event as a JSON document.

    ``payload`` is the document exactly as sent; the codec only accepts a
    UTF-8 JSON object here (see ``codec.py``, "J frames").
    """

    seq: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class Compressed:
    """``C``: a zlib stream whose inflated bytes are whole frames.

    ``frames`` are the inflated frames in order; they carry the same version as
    the ``C`` frame. Only data frames and nested ``C`` frames may appear inside
    (lumberjack.md#frame-c). An empty tuple is pylogbeat's empty ``C``.
    """

    frames: tuple[InnerFrame, ...]


@dataclass(frozen=True, slots=True)
class Ack:
    """``A``: every data frame up to and including ``seq`` is durably stored.

    On v2 connections ``Ack(0)`` while a window is pending is a keepalive, and
    an ack for a seq inside the oldest pending window is a partial ack
    (lumberjack.md#keepalive).
    """

    seq: int


InnerFrame = Data | JsonData | Compressed
"""What may appear inside a ``Compressed`` frame."""

Frame = WindowSize | Data | JsonData | Compressed | Ack
"""Any Lumberjack frame."""


# --------------------------------------------------------------------------- events


@dataclass(frozen=True, slots=True)
class Event:
    """One received log event, ready to store.

    Attributes:
        seq: the data frame's sequence number as sent (not unique, not
            necessarily increasing: clients restart or wrap, lumberjack.md#ack-value).
        payload: the bytes to store: for ``D`` a UTF-8 JSON object of strings
            built from the pairs, for ``J`` the JSON document exactly as sent.
    """

    seq: int
    payload: bytes


class Batch:
    """Events of one window that arrived together, and maybe the window's ack.

    A server stores ``events`` at once (a "W once" client may leave a window
    open for hours, lumberjack.md#durable-acks). When ``ack_seq`` is not None, this
    batch closes a window: once this batch and every batch before it are
    durable, the server sends ``Ack(ack_seq)``. A batch can have no events and
    only an ``ack_seq`` (the answer to ``W`` = 0).

    How events are cut into batches depends on how the bytes arrived; only
    their order, and the order of ack points between them, is fixed.

    The events are held as two columns, ``seqs`` and ``payloads``: a server
    stores the payloads of thousands of events per window and never needs
    an object per event, a large share of ``LumberjackHandler.feed``'s time
    (``benchmarks/lumberjack_feed.py``); ``events`` builds the ``Event`` objects
    when first asked. Immutable and compared like a frozen dataclass of
    ``version``, ``events``, ``ack_seq``.

    Attributes:
        version: the connection's protocol version.
        events: the data frames received, in order (inflated from ``C`` frames).
        seqs: the events' sequence numbers, in order.
        payloads: the events' payloads, in order.
        ack_seq: the ack to send after everything so far is durable, or None.
        documents: each event's payload parsed once, in the order of
            ``events`` (its top-level object; numbers may be unconverted placeholders), so
            that a server can read routing fields without parsing the payload
            again; empty when the connection does not provide them. Not part
            of equality.
    """

    __slots__ = ("_events", "ack_seq", "documents", "payloads", "seqs", "version")
    __match_args__ = ("version", "events", "ack_seq")

    version: ProtocolVersion
    seqs: tuple[int, ...]
    payloads: tuple[bytes, ...]
    ack_seq: int | None
    documents: tuple[Mapping[str, object], ...]
    _events: tuple[Event, ...] | None

    def __init__(
        self,
        version: ProtocolVersion,
        events: tuple[Event, ...],
        ack_seq: int | None,
        documents: tuple[Mapping[str, object], ...] = (),
    ) -> None:
        events = tuple(events)
        seqs = tuple(event.seq for event in events)
        payloads = tuple(event.payload for event in events)
        self._set(version, seqs, payloads, ack_seq, documents, events)

    @classmethod
    def of_columns(
        cls,
        version: ProtocolVersion,
        seqs: tuple[int, ...],
        payloads: tuple[bytes, ...],
        ack_seq: int | None,
        documents: tuple[Mapping[str, object], ...] = (),
    ) -> Batch:
        """The batch of ``seqs[i]``/``payloads[i]`` events, without an object per event."""
        if len(seqs) != len(payloads):
            raise ValueError(f"{len(seqs)} seqs for {len(payloads)} payloads")
        batch = cls.__new__(cls)
        batch._set(version, seqs, payloads, ack_seq, documents, None)
        return batch

    def _set(
        self,
        version: ProtocolVersion,
        seqs: tuple[int, ...],
        payloads: tuple[bytes, ...],
        ack_seq: int | None,
        documents: tuple[Mapping[str, object], ...],
        events: tuple[Event, ...] | None,
    ) -> None:
        setter = object.__setattr__
        setter(self, "version", version)
        setter(self, "seqs", seqs)
        setter(self, "payloads", payloads)
        setter(self, "ack_seq", ack_seq)
        setter(self, "documents", documents)
        setter(self, "_events", events)

    @property
    def events(self) -> tuple[Event, ...]:
        events = self._events
        if events is None:
            events = tuple(map(Event, self.seqs, self.payloads))
            object.__setattr__(self, "_events", events)
        return events

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"cannot assign to field {name!r}: a Batch is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete field {name!r}: a Batch is immutable")

    def __reduce__(self) -> tuple[object, ...]:
        # Slots and a refusing __setattr__: copy and pickle rebuild it from its columns.
        columns = (self.version, self.seqs, self.payloads, self.ack_seq, self.documents)
        return (Batch.of_columns, columns)

    def _key(self) -> tuple[object, ...]:
        return (self.version, self.seqs, self.payloads, self.ack_seq)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Batch):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"Batch(version={self.version!r}, events={self.events!r}, ack_seq={self.ack_seq!r})"


@dataclass(frozen=True, slots=True)
class ConnectionClosed:
    """The peer closed its side (EOF) at a frame boundary.

    Windows not yet acked stay pending: the server may still send their acks
    if the peer only half-closed. Clients resend unacked windows on reconnect.
    """
