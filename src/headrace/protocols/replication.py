"""The replication connection between a container's leader and one follower (sans-I/O).

A follower connects to the leader's replication door and subscribes to one
container; the leader answers where the follower's log stops matching its
own, then streams records; the follower acknowledges how far its copy is
durable (``docs/replication.md#protocol``). The records themselves are WAL
frames, opaque here: the store checks their checksums and numbers.

Every frame is ``u32 length`` (of what follows), ``u8 type``, then the body
(big-endian; ``str`` is ``u16 length`` + UTF-8)::

    SUBSCRIBE  F->L  u32 container, u64 epoch, u64 end, u16 n, n x (u64 epoch, u64 start),
                     str node, str token
    START      L->F  u64 epoch, u64 keep, u64 commit
    RECORDS    L->F  u64 epoch, u64 first, u64 commit, u32 count, frames...
    ACK        F->L  u64 durable
    REFUSE     both  u8 code, str reason            (then the sender closes)

``epoch`` in SUBSCRIBE is the newest epoch the follower knows from
ZooKeeper: a leader of an older epoch refuses it (``STALE_EPOCH``), and a
follower refuses RECORDS of an epoch older than the newest it knows, so a
deposed leader never gets an acknowledgement. ``keep`` is the last record the
follower keeps (``replication_rules.truncation_point``); the leader sends
from ``keep + 1``. ``commit`` is the leader's committed point.

Limits: a frame is at most ``MAX_FRAME_BYTES`` (one batch of records), an
epoch history at most ``MAX_HISTORY_ENTRIES`` entries, a string at most
``MAX_STRING_BYTES``. Anything else is a ``RemoteProtocolError``.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from typing import Final

from headrace.errors import FrameTooLarge, RemoteProtocolError

__all__ = [
    "MAX_BATCH_BYTES",
    "MAX_FRAME_BYTES",
    "MAX_HISTORY_ENTRIES",
    "MAX_STRING_BYTES",
    "Ack",
    "Command",
    "FrameReader",
    "Records",
    "Refuse",
    "RefuseCode",
    "Start",
    "Subscribe",
    "encode",
]

MAX_BATCH_BYTES: Final = 1024 * 1024
"""Record bytes the leader puts in one RECORDS frame (a larger single record
goes alone): a follower holds one batch in memory at a time."""

MAX_FRAME_BYTES: Final = 17 * 1024 * 1024 + 64 * 1024
"""Largest frame read: one record of the largest append (16 MiB) with its
name and headers, or one batch; a peer cannot make the other end buffer more."""

MAX_HISTORY_ENTRIES: Final = 256
"""Epoch history entries a SUBSCRIBE carries: one per change of leader that
wrote records. A longer history sends its last entries; the leader then may
answer an earlier ``keep`` than needed, which costs a longer catch-up only."""

MAX_STRING_BYTES: Final = 4096
"""A node id or node token (about 300 bytes) or a refusal reason."""

_HEAD: Final = struct.Struct(">IB")
_SUBSCRIBE: Final = struct.Struct(">IQQH")
_ENTRY: Final = struct.Struct(">QQ")
_START: Final = struct.Struct(">QQQ")
_RECORDS: Final = struct.Struct(">QQQI")
_ACK: Final = struct.Struct(">Q")
_STR: Final = struct.Struct(">H")


class FrameType(enum.IntEnum):
    SUBSCRIBE = 1
    START = 2
    RECORDS = 3
    ACK = 4
    REFUSE = 5


class RefuseCode(enum.IntEnum):
    """Why one side ends the connection."""

    STALE_EPOCH = 1
    """The other side's epoch is older than one this side knows."""
    NOT_LEADER = 2
    """The node does not lead the container (any more)."""
    NOT_AUTHORIZED = 3
    """No valid node token."""
    BAD_REQUEST = 4
    """A frame broke the protocol, or records did not follow the log."""
    CATCH_UP_TOO_FAR = 5
    """The leader no longer holds the records the follower needs next."""
    DIVERGED = 6
    """The follower holds records past ``keep`` it cannot cut."""


@dataclass(frozen=True, slots=True)
class Subscribe:
    container: int
    epoch: int
    end: int
    history: tuple[tuple[int, int], ...]
    node: str
    token: str


@dataclass(frozen=True, slots=True)
class Start:
    epoch: int
    keep: int
    commit: int


@dataclass(frozen=True, slots=True)
class Records:
    epoch: int
    first: int
    commit: int
    count: int
    frames: bytes | memoryview


@dataclass(frozen=True, slots=True)
class Ack:
    durable: int


@dataclass(frozen=True, slots=True)
class Refuse:
    code: RefuseCode
    reason: str


Command = Subscribe | Start | Records | Ack | Refuse


def _str(text: str) -> bytes:
    raw = text.encode()
    if len(raw) > MAX_STRING_BYTES:
        raw = raw[:MAX_STRING_BYTES].decode(errors="ignore").encode()
    return _STR.pack(len(raw)) + raw


def encode(command: Command) -> list[bytes | memoryview]:
    """The frame of ``command``, as buffers for ``writelines`` (records not copied)."""
    body: list[bytes | memoryview]
    match command:
        case Subscribe():
            history = command.history[-MAX_HISTORY_ENTRIES:]
            head = _SUBSCRIBE.pack(command.container, command.epoch, command.end, len(history))
            entries = b"".join(_ENTRY.pack(e, s) for e, s in history)
            kind, body = (
                FrameType.SUBSCRIBE,
                [head + entries + _str(command.node) + _str(command.token)],
            )
        case Start():
            kind, body = FrameType.START, [_START.pack(command.epoch, command.keep, command.commit)]
        case Records():
            head = _RECORDS.pack(command.epoch, command.first, command.commit, command.count)
            kind, body = FrameType.RECORDS, [head, command.frames]
        case Ack():
            kind, body = FrameType.ACK, [_ACK.pack(command.durable)]
        case Refuse():
            kind, body = FrameType.REFUSE, [bytes([command.code]) + _str(command.reason)]
    size = 1 + sum(len(b) for b in body)
    if size + 4 > MAX_FRAME_BYTES:
        raise ValueError(f"frame of {size} bytes exceeds {MAX_FRAME_BYTES}")
    return [_HEAD.pack(size, kind), *body]


def _read_str(body: memoryview, at: int) -> tuple[str, int]:
    if len(body) < at + _STR.size:
        raise RemoteProtocolError("string cut short")
    (size,) = _STR.unpack_from(body, at)
    at += _STR.size
    if size > MAX_STRING_BYTES or len(body) < at + size:
        raise RemoteProtocolError(f"string of {size} bytes too long or cut short")
    try:
        return bytes(body[at : at + size]).decode(), at + size
    except UnicodeDecodeError:
        raise RemoteProtocolError("string is not UTF-8") from None


def _decode(kind: int, body: memoryview) -> Command:
    try:
        frame_type = FrameType(kind)
    except ValueError:
        raise RemoteProtocolError(f"unknown frame type {kind}") from None
    try:
        match frame_type:
            case FrameType.SUBSCRIBE:
                container, epoch, end, count = _SUBSCRIBE.unpack_from(body)
                if count > MAX_HISTORY_ENTRIES:
                    raise RemoteProtocolError(f"epoch history of {count} entries")
                at = _SUBSCRIBE.size
                history = tuple(
                    _ENTRY.unpack_from(body, at + i * _ENTRY.size) for i in range(count)
                )
                at += count * _ENTRY.size
                node, at = _read_str(body, at)
                token, at = _read_str(body, at)
                command: Command = Subscribe(container, epoch, end, history, node, token)
            case FrameType.START:
                command = Start(*_START.unpack_from(body))
                at = _START.size
            case FrameType.RECORDS:
                epoch, first, commit, count = _RECORDS.unpack_from(body)
                return Records(epoch, first, commit, count, body[_RECORDS.size :])
            case FrameType.ACK:
                command = Ack(*_ACK.unpack_from(body))
                at = _ACK.size
            case FrameType.REFUSE:
                if not body:
                    raise RemoteProtocolError("empty REFUSE")
                try:
                    code = RefuseCode(body[0])
                except ValueError:
                    code = RefuseCode.BAD_REQUEST
                reason, at = _read_str(body, 1)
                command = Refuse(code, reason)
    except struct.error:
        raise RemoteProtocolError(f"{frame_type.name} frame cut short") from None
    if at != len(body):
        raise RemoteProtocolError(f"{len(body) - at} bytes after a {frame_type.name} frame")
    return command


class FrameReader:
    """Frames out of a byte stream, each at most ``max_frame_bytes``.

    ``header_size`` bytes tell how many to read next (``needed``); feeding
    exactly those gives a frame. Used by the asyncio side with
    ``readexactly`` so that no more than one frame is ever buffered.
    """

    header_size: Final = _HEAD.size

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes

    def body_size(self, header: bytes) -> tuple[int, int]:
        """``(frame type, body size)`` from a frame's first ``header_size`` bytes."""
        size, kind = _HEAD.unpack(header)
        if size < 1 or size + 4 > self.max_frame_bytes:
            raise FrameTooLarge(self.max_frame_bytes, size + 4)
        return kind, size - 1

    def decode(self, kind: int, body: bytes | bytearray | memoryview) -> Command:
        return _decode(kind, memoryview(body))
