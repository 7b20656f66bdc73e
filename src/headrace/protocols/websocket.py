"""WebSocket (RFC 6455) for the HTTP port, sans-I/O: the opening handshake and frames.

Just what a message transport for RS-IO needs (``docs/protocols/rsio.md`` §12.6,
spec B.4): the server side of the handshake, and frames in both directions.
No extensions (no ``permessage-deflate``: RSV bits must be 0), no
subprotocols.

Frame layout (RFC 6455 §5.2)::

    byte 0: FIN(1) RSV1-3(3) opcode(4)
    byte 1: MASK(1) payload length(7): 0-125, 126 = 16-bit length follows,
            127 = 64-bit length follows (network order)
    [extended length] [masking key: 4 bytes if MASK] payload (XORed with the key)

Frames from a client MUST be masked, frames from a server MUST NOT (§5.1).
Control frames (close 8, ping 9, pong 10) carry at most 125 bytes, are never
fragmented, and may come between the fragments of a data message.

Everything a peer can get wrong raises ``RemoteProtocolError`` whose
``reply_hint`` is the close status code to send (1002 protocol error, 1009
message too big, 1007 bad UTF-8 in a close reason is not checked: reasons
are reported as bytes).
"""

from __future__ import annotations

import base64
import enum
import hashlib
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass

from headrace.errors import RemoteProtocolError

__all__ = [
    "CLOSE_MESSAGE_TOO_BIG",
    "CLOSE_NORMAL",
    "CLOSE_PROTOCOL_ERROR",
    "MAX_HANDSHAKE_BYTES",
    "Close",
    "FrameReader",
    "HttpRequest",
    "Message",
    "Opcode",
    "Ping",
    "accept_key",
    "encode_frame",
    "handshake_response",
    "http_response",
    "parse_request",
]

MAX_HANDSHAKE_BYTES = 16 * 1024
"""Largest HTTP request head accepted: browsers send under 2 KiB; 16 KiB leaves room
for cookies without letting a peer buffer megabytes before it is refused."""

MAX_HEADERS = 100
"""Header lines in a request head (the common server default)."""

WEBSOCKET_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
"""RFC 6455 §1.3: appended to ``Sec-WebSocket-Key`` to form the accept value."""

CLOSE_NORMAL = 1000
CLOSE_PROTOCOL_ERROR = 1002
CLOSE_MESSAGE_TOO_BIG = 1009

_CONTROL_MAX_BYTES = 125  # RFC 6455 §5.5


class Opcode(enum.IntEnum):
    """Frame opcodes (RFC 6455 §5.2); the others are reserved and refused."""

    CONTINUATION = 0
    TEXT = 1
    BINARY = 2
    CLOSE = 8
    PING = 9
    PONG = 10


# --------------------------------------------------------------------------- handshake


@dataclass(frozen=True, slots=True)
class HttpRequest:
    """An HTTP/1.1 request head; header names lower-cased, repeated headers joined by ``,``."""

    method: str
    target: str
    headers: dict[str, str]

    @property
    def path(self) -> str:
        return self.target.partition("?")[0]

    def is_websocket_upgrade(self) -> bool:
        connection = {t.strip().lower() for t in self.headers.get("connection", "").split(",")}
        return (
            self.method == "GET"
            and "upgrade" in connection
            and self.headers.get("upgrade", "").lower() == "websocket"
            and self.headers.get("sec-websocket-version") == "13"
            and "sec-websocket-key" in self.headers
        )


def parse_request(data: bytes | bytearray) -> tuple[HttpRequest, int] | None:
    """Parse the request head at the start of ``data``.

    Returns:
        ``(request, bytes used)``, or None if the head is not complete yet.

    Raises:
        RemoteProtocolError: malformed, or longer than ``MAX_HANDSHAKE_BYTES``.
    """
    end = data.find(b"\r\n\r\n", 0, MAX_HANDSHAKE_BYTES + 4)
    if end < 0:
        if len(data) > MAX_HANDSHAKE_BYTES:
            raise RemoteProtocolError("request head too large", reply_hint=431)
        return None
    try:
        lines = bytes(data[:end]).decode("latin-1").split("\r\n")
    except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes everything
        raise RemoteProtocolError("bad request head", reply_hint=400) from None
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise RemoteProtocolError(f"bad request line {lines[0][:80]!r}", reply_hint=400)
    if len(lines) - 1 > MAX_HEADERS:
        raise RemoteProtocolError("too many headers", reply_hint=431)
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise RemoteProtocolError(f"bad header line {line[:80]!r}", reply_hint=400)
        key = name.lower()
        value = value.strip()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    return HttpRequest(parts[0], parts[1], headers), end + 4


def accept_key(key: str) -> str:
    """``Sec-WebSocket-Accept`` for a client's ``Sec-WebSocket-Key`` (RFC 6455 §4.2.2)."""
    digest = hashlib.sha1((key + WEBSOCKET_GUID).encode("ascii")).digest()
    return base64.b64encode(digest).decode("ascii")


def handshake_response(request: HttpRequest) -> bytes:
    """The ``101 Switching Protocols`` answer to an upgrade request."""
    return (
        "HTTP/1.1 101 Switching Protocols\r\n"
        "Upgrade: websocket\r\n"
        "Connection: Upgrade\r\n"
        f"Sec-WebSocket-Accept: {accept_key(request.headers['sec-websocket-key'])}\r\n"
        "\r\n"
    ).encode("ascii")


def http_response(
    status: int, reason: str, body: bytes = b"", content_type: str = "text/plain; charset=utf-8"
) -> bytes:
    """A complete HTTP/1.1 response with a body."""
    head = (
        f"HTTP/1.1 {status} {reason}\r\n"
        f"Content-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n"
        "\r\n"
    )
    return head.encode("ascii") + body


# --------------------------------------------------------------------------- frames


@dataclass(frozen=True, slots=True)
class Message:
    """A complete data message (its fragments joined)."""

    opcode: Opcode  # TEXT or BINARY
    payload: bytes


@dataclass(frozen=True, slots=True)
class Ping:
    payload: bytes


@dataclass(frozen=True, slots=True)
class Close:
    """A close frame: ``code`` None when it carried no status code."""

    code: int | None
    reason: bytes


def _remote(message: str, code: int = CLOSE_PROTOCOL_ERROR) -> RemoteProtocolError:
    return RemoteProtocolError(message, reply_hint=code)


def encode_frame(opcode: Opcode, payload: bytes, *, mask: bool = False) -> bytes:
    """One unfragmented frame; ``mask=True`` for a client (a random key, RFC 6455 §5.3)."""
    length = len(payload)
    head = bytearray((0x80 | opcode,))
    mask_bit = 0x80 if mask else 0
    if length < 126:
        head.append(mask_bit | length)
    elif length < 1 << 16:
        head.append(mask_bit | 126)
        head += struct.pack(">H", length)
    else:
        head.append(mask_bit | 127)
        head += struct.pack(">Q", length)
    if not mask:
        return bytes(head) + payload
    key = os.urandom(4)
    return bytes(head) + key + _unmask(payload, key)


def _unmask(payload: bytes | bytearray, key: bytes) -> bytes:
    if not payload:
        return b""
    repeated = (key * (len(payload) // 4 + 1))[: len(payload)]
    return (int.from_bytes(payload, "little") ^ int.from_bytes(repeated, "little")).to_bytes(
        len(payload), "little"
    )


class FrameReader:
    """Frames received by one side of a connection, joined into messages.

    Args:
        masked: whether the peer must mask its frames (True when we are the server).
        max_message_bytes: largest (joined) data message; above it: 1009.
    """

    def __init__(self, *, masked: bool = True, max_message_bytes: int = 16 * 1024 * 1024) -> None:
        self._masked = masked
        self._max_message_bytes = max_message_bytes
        self._buffer = bytearray()
        self._fragments: bytearray | None = None
        self._fragment_opcode = Opcode.BINARY

    def receive_data(self, data: bytes | bytearray) -> Iterator[Message | Ping | Close]:
        """Feed received bytes; yield every complete message and control frame.

        Raises:
            RemoteProtocolError: a framing error; ``reply_hint`` is the close code.
        """
        self._buffer += data
        while (frame := self._next_frame()) is not None:
            fin, opcode, payload = frame
            if opcode >= Opcode.CLOSE:
                if opcode is Opcode.PING:
                    yield Ping(payload)
                elif opcode is Opcode.CLOSE:
                    if len(payload) == 1:
                        raise _remote("close frame with a 1-byte body")
                    code = struct.unpack(">H", payload[:2])[0] if payload else None
                    yield Close(code, payload[2:])
                continue  # a pong answers nothing we sent
            if opcode is Opcode.CONTINUATION:
                if self._fragments is None:
                    raise _remote("continuation frame without a message")
                self._fragments += payload
            else:
                if self._fragments is not None:
                    raise _remote("new message before the last one's final fragment")
                self._fragments = bytearray(payload)
                self._fragment_opcode = opcode
            if len(self._fragments) > self._max_message_bytes:
                raise _remote(
                    f"message over {self._max_message_bytes} bytes", CLOSE_MESSAGE_TOO_BIG
                )
            if fin:
                message = Message(self._fragment_opcode, bytes(self._fragments))
                self._fragments = None
                yield message

    def _next_frame(self) -> tuple[bool, Opcode, bytes] | None:
        buf = self._buffer
        if len(buf) < 2:
            return None
        first, second = buf[0], buf[1]
        if first & 0x70:
            raise _remote("RSV bits set without a negotiated extension")
        try:
            opcode = Opcode(first & 0x0F)
        except ValueError:
            raise _remote(f"reserved opcode {first & 0x0F}") from None
        fin = bool(first & 0x80)
        masked = bool(second & 0x80)
        if masked != self._masked:
            raise _remote("client frames must be masked" if self._masked else "masked frame")
        length = second & 0x7F
        position = 2
        if length == 126:
            if len(buf) < 4:
                return None
            length = struct.unpack_from(">H", buf, 2)[0]
            position = 4
        elif length == 127:
            if len(buf) < 10:
                return None
            length = struct.unpack_from(">Q", buf, 2)[0]
            if length >> 63:
                raise _remote("frame length with the top bit set")
            position = 10
        if opcode >= Opcode.CLOSE and (length > _CONTROL_MAX_BYTES or not fin):
            raise _remote("control frame fragmented or over 125 bytes")
        if length > self._max_message_bytes:
            raise _remote(f"frame over {self._max_message_bytes} bytes", CLOSE_MESSAGE_TOO_BIG)
        key = b""
        if masked:
            key = bytes(buf[position : position + 4])
            position += 4
        if len(buf) < position + length:
            return None
        payload = bytes(buf[position : position + length])
        del buf[: position + length]
        if masked:
            payload = _unmask(payload, key)
        return fin, opcode, payload
