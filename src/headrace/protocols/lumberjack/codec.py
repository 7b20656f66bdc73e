"""Lumberjack v1/v2 codec: frames to bytes and bytes to frames, nothing else.

Wire format (all integers u32 big-endian; ``docs/protocols/lumberjack.md``; ``lumberjack.md#...``
below names its
anchors)::

    every frame   version:u8 ('1'|'2')  type:u8 (ASCII letter)  payload...
    W  window     count:u32
    D  data (v1)  seq:u32 pairs:u32 { klen:u32 key[klen] vlen:u32 value[vlen] } * pairs
    J  json (v2)  seq:u32 len:u32 json[len]
    C  compressed len:u32 zlib[len]      (RFC 1950 stream of whole frames)
    A  ack        seq:u32

There is no generic length field, so an unknown type byte cannot be skipped:
it is fatal. The decoder checks each field as soon as it has arrived (a bad
version byte, a TLS ClientHello on a plain port, an oversized length) instead
of waiting for the rest of the frame.

Rules enforced here (the connection adds the per-connection rules):

* ``C`` frames: inflated with a budget of ``Limits.max_decompressed_bytes``
  shared by the frame and everything nested in it (decompression bombs), at
  most ``Limits.max_compressed_depth`` levels deep. The inflated bytes must be
  whole frames of the ``C`` frame's version, of type ``D``, ``J`` or ``C``; a
  truncated stream, bytes after its end, or a partial frame at the end is an
  error.
* ``J`` frames: the document must be UTF-8 JSON whose top level is an object
  (what Logstash, the reference server for Beats, requires: it decodes every
  ``J`` into a map and closes the connection otherwise). Anything else, including
  pylogbeat's unchecked ``str`` elements that are not JSON, is a
  ``RemoteProtocolError``: the connection closes without an ack. ``NaN`` and
  ``Infinity`` are not JSON and are refused too.
* ``D`` frames: keys and values are taken as UTF-8; invalid sequences become
  U+FFFD when the event is turned into JSON (as Logstash's and Go's string
  conversions do), so a latin-1 log line is stored, not refused.

Malformed input raises ``RemoteProtocolError`` (``FrameTooLarge`` for sizes
over a limit) and never any other exception. Encoding something the protocol
forbids raises ``LocalProtocolError``.
"""

from __future__ import annotations

import re
import struct
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final

import msgspec

from headrace.errors import FrameTooLarge, LocalProtocolError, RemoteProtocolError
from headrace.protocols._buffer import ReceiveBuffer
from headrace.protocols.lumberjack.commands import (
    Ack,
    Compressed,
    Data,
    Frame,
    FrameType,
    InnerFrame,
    JsonData,
    ProtocolVersion,
    WindowSize,
)

__all__ = [
    "DEFAULT_LIMITS",
    "MAX_COMPRESSED_DEPTH",
    "MAX_DATA_PAIRS",
    "MAX_DECOMPRESSED_BYTES",
    "MAX_FRAME_BYTES",
    "MAX_KEY_BYTES",
    "MAX_PENDING_WINDOWS",
    "MAX_VALUE_BYTES",
    "MAX_WINDOW_COUNT",
    "RECEIVE_SLACK_BYTES",
    "DecodedFrame",
    "DocumentParser",
    "FrameDecoder",
    "Limits",
    "data_document",
    "data_to_json",
    "decode_frame",
    "decode_frames",
    "document_json",
    "document_parser",
    "encode_frame",
    "parse_json_object",
]

# --------------------------------------------------------------------------- limits

MAX_FRAME_BYTES: Final = 32 * 1024 * 1024
"""Largest frame on the wire, header included (a ``C`` frame's compressed bytes,
a ``J`` document, a whole ``D`` frame). Filebeat cuts lines at ``max_bytes``
(10 MiB by default) and JSON escaping can grow one; a ``C`` frame holds a whole
compressed window. 32 MiB fits both and bounds what one connection buffers."""

MAX_DECOMPRESSED_BYTES: Final = 64 * 1024 * 1024
"""Inflated bytes allowed for one top-level ``C`` frame, nested frames included.
zlib inflates up to ~1000:1, so a 32 MiB frame could claim 32 GiB; 64 MiB is twice
the frame limit (lumberjack.md#frame-c)."""

MAX_COMPRESSED_DEPTH: Final = 4
"""``C`` frames nested inside ``C`` frames, the outer one counting as 1. No
client nests (depth 1); Logstash and go-lumber accept nesting, so we do, up to
a depth that keeps the decoder's recursion short."""

MAX_DATA_PAIRS: Final = 4096
"""Key/value pairs in one ``D`` frame. logstash-forwarder sends 4 plus its
configured ``fields``; npm lumberjack-protocol one per key of an event object.
Thousands would be a bug or an attack (each pair costs a dict entry)."""

MAX_KEY_BYTES: Final = 64 * 1024
"""Length of one ``D`` key. Keys are field names; 64 KiB is generous and stops
a hostile frame spending its whole budget on one key."""

MAX_VALUE_BYTES: Final = 16 * 1024 * 1024
"""Length of one ``D`` value: a log line. Filebeat's default line cap is 10 MiB;
logstash-forwarder has none, so leave headroom within ``MAX_FRAME_BYTES``."""

MAX_WINDOW_COUNT: Final = 65536
"""Largest ``W`` count. libbeat's window is at most ``bulk_max_size`` (default
2048), logstash-forwarder's its spool size (1024), the Ruby client's 5000;
go-lumber refuses above 10000 and Logstash has no limit. A ``W`` above this
closes the connection (as go-lumber does)."""

MAX_PENDING_WINDOWS: Final = 64
"""Windows (and ``W`` = 0 ack points) received but not yet acked on one
connection. libbeat pipelines 2 by default; npm lumberjack-protocol stops at
10 windows unacked. The server should stop reading long before this; past it
the peer is flooding us with ``W`` frames."""

RECEIVE_SLACK_BYTES: Final = 1024 * 1024
"""Room above ``max_frame_bytes`` in the receive buffer for the read that
completes a frame: a server must pass at most this much per ``receive_data``
call (asyncio reads 64-256 KiB) and drain ``events()`` after each."""


@dataclass(frozen=True, slots=True)
class Limits:
    """The codec's and connection's limits; defaults are the named constants above.

    Attributes:
        max_frame_bytes: ``MAX_FRAME_BYTES``.
        max_decompressed_bytes: ``MAX_DECOMPRESSED_BYTES``.
        max_compressed_depth: ``MAX_COMPRESSED_DEPTH``.
        max_data_pairs: ``MAX_DATA_PAIRS``.
        max_key_bytes: ``MAX_KEY_BYTES``.
        max_value_bytes: ``MAX_VALUE_BYTES``.
        max_window_count: ``MAX_WINDOW_COUNT``.
        max_pending_windows: ``MAX_PENDING_WINDOWS``.
    """

    max_frame_bytes: int = MAX_FRAME_BYTES
    max_decompressed_bytes: int = MAX_DECOMPRESSED_BYTES
    max_compressed_depth: int = MAX_COMPRESSED_DEPTH
    max_data_pairs: int = MAX_DATA_PAIRS
    max_key_bytes: int = MAX_KEY_BYTES
    max_value_bytes: int = MAX_VALUE_BYTES
    max_window_count: int = MAX_WINDOW_COUNT
    max_pending_windows: int = MAX_PENDING_WINDOWS

    @property
    def max_buffered_bytes(self) -> int:
        """The receive buffer's limit: one whole frame plus one read."""
        return self.max_frame_bytes + RECEIVE_SLACK_BYTES


DEFAULT_LIMITS: Final = Limits()

# --------------------------------------------------------------------------- layout

_HEADER = struct.Struct(">BB")  # version:u8 type:u8
_U32 = struct.Struct(">I")
_U32_PAIR = struct.Struct(">II")  # D: seq, pairs; J: seq, len
_HEADER_BYTES: Final = 2
_WINDOW_OR_ACK_BYTES: Final = 6  # version, type, u32: W and A are always 6 bytes
_DATA_HEADER_BYTES: Final = 10  # version, type, seq, pairs
_JSON_HEADER_BYTES: Final = 10  # version, type, seq, len
_COMPRESSED_HEADER_BYTES: Final = 6  # version, type, len
_PAIR_OVERHEAD_BYTES: Final = 8  # klen + vlen
assert _HEADER.size == _HEADER_BYTES
assert _U32_PAIR.size == _DATA_HEADER_BYTES - _HEADER_BYTES
U32_MAX: Final = 0xFFFF_FFFF

_VERSIONS: Final = frozenset(int(v) for v in ProtocolVersion)
_VERSION_OF: Final = {int(v): v for v in ProtocolVersion}
_TYPES: Final = frozenset(int(t) for t in FrameType)
_TLS_HANDSHAKE_BYTE: Final = 0x16  # first byte of a TLS ClientHello record (lumberjack.md#tls-hint)

DecodedFrame = tuple[ProtocolVersion, Frame]
"""A frame and the version byte it carried."""

# --------------------------------------------------------------------------- encode


def encode_frame(version: ProtocolVersion, frame: Frame, *, compress_level: int = 6) -> bytes:
    """The wire bytes of ``frame`` with ``version``'s version byte.

    Args:
        version: the version byte to write (for a ``C`` frame, also inside it).
        frame: any frame. ``JsonData.payload`` must be a UTF-8 JSON object.
        compress_level: zlib level for ``C`` frames (0-9).

    Returns:
        The whole frame, ready to write in one call.

    Raises:
        LocalProtocolError: a number does not fit in u32, a ``J`` payload is not
            a JSON object, or a ``C`` frame holds a ``W``/``A`` frame.
    """
    v = int(version)
    match frame:
        case WindowSize(count=count):
            return _HEADER.pack(v, FrameType.WINDOW_SIZE) + _u32(count, "window count")
        case Ack(seq=seq):
            return _HEADER.pack(v, FrameType.ACK) + _u32(seq, "ack seq")
        case Data(seq=seq, pairs=pairs):
            parts = [
                _HEADER.pack(v, FrameType.DATA),
                _u32(seq, "seq"),
                _u32(len(pairs), "pair count"),
            ]
            for key, value in pairs:
                parts += (_u32(len(key), "key length"), key, _u32(len(value), "value length"))
                parts.append(value)
            return b"".join(parts)
        case JsonData(seq=seq, payload=payload):
            try:
                _check_json_object(payload)
            except RemoteProtocolError as exc:
                raise LocalProtocolError(f"J frame seq {seq}: {exc}") from None
            return b"".join(
                (
                    _HEADER.pack(v, FrameType.JSON_DATA),
                    _u32(seq, "seq"),
                    _u32(len(payload), "JSON length"),
                    payload,
                )
            )
        case Compressed(frames=frames):
            for inner in frames:
                if not isinstance(inner, Data | JsonData | Compressed):
                    raise LocalProtocolError(f"a C frame cannot hold {type(inner).__name__}")
            inflated = b"".join(
                encode_frame(version, f, compress_level=compress_level) for f in frames
            )
            body = zlib.compress(inflated, compress_level)
            return _HEADER.pack(v, FrameType.COMPRESSED) + _u32(len(body), "C length") + body
    raise LocalProtocolError(f"not a Lumberjack frame: {frame!r}")  # pragma: no cover


def _u32(value: int, what: str) -> bytes:
    if not 0 <= value <= U32_MAX:
        raise LocalProtocolError(f"{what} {value} does not fit in u32")
    return _U32.pack(value)


# --------------------------------------------------------------------------- decode


class _NeedMore(Exception):
    """Internal: the frame is incomplete; ``needed`` bytes in all would let it progress."""

    def __init__(self, needed: int) -> None:
        self.needed = needed


class _Reader:
    """Reads fields off a ReceiveBuffer and counts them, for ``_NeedMore`` hints."""

    __slots__ = ("_buffer", "consumed")

    def __init__(self, buffer: ReceiveBuffer) -> None:
        self._buffer = buffer
        self.consumed = 0

    def take(self, count: int) -> bytes:
        data = self._buffer.consume_exactly(count)
        if data is None:
            raise _NeedMore(self.consumed + count)
        self.consumed += count
        return data

    def u32(self) -> int:
        value: int = _U32.unpack(self.take(4))[0]
        return value

    def u32_pair(self) -> tuple[int, int]:
        first, second = _U32_PAIR.unpack(self.take(8))
        return first, second

    def require(self, count: int) -> None:
        """Raise ``_NeedMore`` unless ``count`` more bytes are here, copying nothing."""
        if len(self._buffer) < count:
            raise _NeedMore(self.consumed + count)


class _BytesReader:
    """The same reads over bytes that are all here (a ``C`` frame's inflated content).

    Offsets into one ``bytes`` object instead of a ReceiveBuffer: the content of
    a ``C`` frame is complete, so nothing is rolled back, and a window of
    thousands of small frames is parsed without re-buffering.
    """

    __slots__ = ("_data", "consumed")

    def __init__(self, data: bytes) -> None:
        self._data = data
        self.consumed = 0

    def take(self, count: int) -> bytes:
        end = self.consumed + count
        if end > len(self._data):
            raise _NeedMore(end)
        data = self._data[self.consumed : end]
        self.consumed = end
        return data

    def u32(self) -> int:
        self.require(4)
        value: int = _U32.unpack_from(self._data, self.consumed)[0]
        self.consumed += 4
        return value

    def u32_pair(self) -> tuple[int, int]:
        self.require(8)
        first, second = _U32_PAIR.unpack_from(self._data, self.consumed)
        self.consumed += 8
        return first, second

    def require(self, count: int) -> None:
        if self.consumed + count > len(self._data):
            raise _NeedMore(self.consumed + count)

    @property
    def remaining(self) -> int:
        return len(self._data) - self.consumed


_FieldReader = _Reader | _BytesReader


def decode_frame(buffer: ReceiveBuffer, limits: Limits = DEFAULT_LIMITS) -> DecodedFrame | None:
    """Take one whole frame off ``buffer``.

    Args:
        buffer: received bytes; on success the frame's bytes are committed,
            otherwise the buffer is rolled back.
        limits: the limits to enforce.

    Returns:
        ``(version, frame)``, or None if the frame has not fully arrived yet.

    Raises:
        RemoteProtocolError: the bytes are not a valid frame (``FrameTooLarge``
            for a size over a limit). Raised as soon as the offending field has
            arrived.
    """
    result = _decode(buffer, limits, depth=0, budget=None)
    return None if isinstance(result, int) else result


def _decode(
    buffer: ReceiveBuffer, limits: Limits, *, depth: int, budget: _Budget | None
) -> DecodedFrame | int:
    """``decode_frame``, returning the byte count needed to progress when incomplete."""
    reader = _Reader(buffer)
    try:
        frame = _decode_fields(reader, limits, depth=depth, budget=budget)
    except _NeedMore as more:
        buffer.rollback()
        return more.needed
    except BaseException:
        buffer.rollback()
        raise
    buffer.commit()
    return frame


def _decode_fields(
    reader: _FieldReader, limits: Limits, *, depth: int, budget: _Budget | None
) -> DecodedFrame:
    version_byte = reader.take(1)[0]
    if version_byte not in _VERSIONS:
        hint = " (a TLS ClientHello: is TLS configured on this listener?)"
        raise RemoteProtocolError(
            f"bad version byte 0x{version_byte:02x}"
            + (hint if version_byte == _TLS_HANDSHAKE_BYTE else "")
        )
    version = ProtocolVersion(version_byte)
    type_byte = reader.take(1)[0]
    if type_byte not in _TYPES:
        raise RemoteProtocolError(f"unknown frame type 0x{type_byte:02x}")
    frame_type = FrameType(type_byte)
    match frame_type:
        case FrameType.WINDOW_SIZE:
            return version, WindowSize(reader.u32())
        case FrameType.ACK:
            return version, Ack(reader.u32())
        case FrameType.DATA:
            return version, _decode_data(reader, limits)
        case FrameType.JSON_DATA:
            return version, _decode_json(reader, limits)
        case FrameType.COMPRESSED:
            return version, _decode_compressed(reader, version, limits, depth, budget)
    raise AssertionError(frame_type)  # pragma: no cover


def _decode_data(reader: _FieldReader, limits: Limits) -> Data:
    seq, pair_count = _decode_data_header(reader, limits)
    frame_bytes = _DATA_HEADER_BYTES
    pairs: list[tuple[bytes, bytes]] = []
    for _ in range(pair_count):
        key, value, frame_bytes = _decode_pair(reader, limits, frame_bytes)
        pairs.append((key, value))
    return Data(seq, tuple(pairs))


def _decode_data_header(reader: _FieldReader, limits: Limits) -> tuple[int, int]:
    """``seq`` and ``pairs`` of a ``D`` frame (after its version and type bytes)."""
    seq, pair_count = reader.u32_pair()
    if pair_count > limits.max_data_pairs:
        raise RemoteProtocolError(
            f"D frame seq {seq}: {pair_count} pairs exceed the limit of {limits.max_data_pairs}"
        )
    return seq, pair_count


def _decode_pair(
    reader: _FieldReader, limits: Limits, frame_bytes: int
) -> tuple[bytes, bytes, int]:
    """One ``klen key vlen value`` pair; returns it and the frame size so far."""
    key_bytes = reader.u32()
    if key_bytes > limits.max_key_bytes:
        raise FrameTooLarge(limits.max_key_bytes, key_bytes)
    frame_bytes += _PAIR_OVERHEAD_BYTES + key_bytes
    _check_frame_bytes(frame_bytes, limits)
    reader.require(key_bytes)
    key = reader.take(key_bytes)
    value_bytes = reader.u32()
    if value_bytes > limits.max_value_bytes:
        raise FrameTooLarge(limits.max_value_bytes, value_bytes)
    frame_bytes += value_bytes
    _check_frame_bytes(frame_bytes, limits)
    reader.require(value_bytes)
    return key, reader.take(value_bytes), frame_bytes


def _decode_json(reader: _FieldReader, limits: Limits) -> JsonData:
    seq, json_bytes = reader.u32_pair()
    _check_frame_bytes(_JSON_HEADER_BYTES + json_bytes, limits)
    reader.require(json_bytes)
    payload = reader.take(json_bytes)
    try:
        _check_json_object(payload)
    except RemoteProtocolError as exc:
        raise RemoteProtocolError(f"J frame seq {seq}: {exc}") from None
    return JsonData(seq, payload)


def _check_frame_bytes(frame_bytes: int, limits: Limits) -> None:
    if frame_bytes > limits.max_frame_bytes:
        raise FrameTooLarge(limits.max_frame_bytes, frame_bytes)


class _Number:
    """A JSON number that Python will not convert (an integer over its 4300-digit
    limit, a float out of range), kept as written: numbers are only validated,
    never used here, and valid JSON is not refused for them. ``text`` is the
    number as written."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return f"_Number({self.text})"


_DECODE: Final = msgspec.json.Decoder().decode
"""The one JSON parser of ``J`` documents (msgspec: fast, strict, in C)."""

_DECODE_OBJECT: Final = msgspec.json.Decoder(dict[str, msgspec.Raw]).decode
"""The same parser over an object whose values stay raw JSON, for ``_value``."""

_DECODE_ARRAY: Final = msgspec.json.Decoder(list[msgspec.Raw]).decode
"""The same parser over an array whose items stay raw JSON, for ``_value``."""

_DECODE_RAW: Final = msgspec.json.Decoder(msgspec.Raw).decode
"""The same parser checking one value and building nothing, for ``_value``."""

_JSON_WHITESPACE: Final = b" \t\r\n"

_BOM: Final = b"\xef\xbb\xbf"
"""The UTF-8 byte-order mark: JSON text must not begin with one (RFC 8259); refused
in words of its own."""

_SURROGATE_ESCAPES: Final = re.compile(
    rb"\\\\|(\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2})"
    rb"|\\u[dD][89a-fA-F][0-9a-fA-F]{2}"
)
"""An escaped backslash (kept), a surrogate pair's escapes (kept, group 1), or
the escape of a lone surrogate (replaced by ``_unpaired``)."""


def _unpaired(match: re.Match[bytes]) -> bytes:
    """A lone surrogate's escape read as U+FFFD; anything else as it was."""
    text = match[0]
    if match[1] is None and text != b"\\\\":
        return b"\\ufffd"
    return text


def _value(raw: bytes | msgspec.Raw) -> object:
    """The JSON value ``raw`` as msgspec builds it, a number Python will not
    convert (msgspec's ``ValidationError``) kept as a ``_Number``, and the
    arrays and objects around it built item by item.

    Raises:
        msgspec.DecodeError, UnicodeDecodeError, RecursionError: ``raw`` is
            not JSON, not UTF-8, or nested too deeply (``_refusal`` words them).
    """
    try:
        return _DECODE(raw)
    except msgspec.ValidationError:
        pass
    text = bytes(_DECODE_RAW(raw)).strip(_JSON_WHITESPACE)
    if text[:1] == b"{":
        return {key: _value(item) for key, item in _DECODE_OBJECT(text).items()}
    if text[:1] == b"[":
        return [_value(item) for item in _DECODE_ARRAY(text)]
    return _Number(text.decode("ascii"))


def _refusal(payload: bytes, exc: BaseException) -> RemoteProtocolError:
    """Why the parser refused ``payload``, in the codec's words: not UTF-8
    (checked first, over the whole document), a byte-order mark, nested too
    deeply, or msgspec's reason."""
    try:
        payload.decode("utf-8")
    except UnicodeDecodeError as bad:
        return RemoteProtocolError(f"JSON is not UTF-8: {bad.reason} at byte {bad.start}")
    if payload.startswith(_BOM):
        return RemoteProtocolError("invalid JSON: a byte-order mark before the document")
    if isinstance(exc, RecursionError):
        return RemoteProtocolError("JSON is nested too deeply")
    reason = str(exc).removeprefix("JSON is malformed: ")
    return RemoteProtocolError(f"invalid JSON: {reason}")


def _parse_object(payload: bytes) -> dict[str, object]:
    """The whole of a ``J`` document, which must be a UTF-8 JSON object.

    msgspec refuses the escape of a lone surrogate (``"\\ud800"``), which
    JSON's grammar allows and Python's ``json`` reads: a document refused
    that holds one is parsed again with it read as U+FFFD (``_unpaired``),
    so it is accepted whatever else its strings hold.

    Raises:
        RemoteProtocolError: not UTF-8, not JSON (``NaN``, a byte-order mark,
            bytes after the value), nested too deeply, or not an object.
    """
    try:
        document = _value(payload)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as exc:
        fixed = _SURROGATE_ESCAPES.sub(_unpaired, payload) if b"\\" in payload else payload
        if fixed == payload:
            raise _refusal(payload, exc) from None
        try:
            document = _value(fixed)
        except (msgspec.DecodeError, UnicodeDecodeError, RecursionError) as again:
            raise _refusal(payload, again) from None
    if type(document) is not dict:
        number = type(document) in (int, float) or isinstance(document, _Number)
        kind = "number" if number else type(document).__name__
        raise RemoteProtocolError(f"JSON is a {kind}, not an object")
    return document


DocumentParser = Callable[[bytes], Mapping[str, object]]
"""What a decoder calls on each ``J`` document: the parsed object it keeps in
``DataRun.documents`` / ``Batch.documents``, or ``RemoteProtocolError``."""

_RAW_OR_UNSET = msgspec.Raw | msgspec.UnsetType


def document_parser(fields: Iterable[str] | None = None) -> DocumentParser:
    """The one parse of ``J`` documents: all of each object, or its top-level keys ``fields``.

    One parser, msgspec's, accepts the UTF-8 JSON objects (``_parse_object``)
    and refuses the rest with a ``RemoteProtocolError``. It returns the whole
    object (``fields`` None) or the keys of ``fields`` present, with the
    values the whole parse gives them. For some keys it decodes a struct of
    those keys held as raw JSON, which checks the whole document's syntax
    while building only their values (two to three times faster than the
    whole object for a Beats event); a document that struct refuses is
    judged by the whole parse, which words the error or reads what the
    struct cannot (a lone surrogate's escape). Numbers too large for Python
    are unconverted placeholders (``_Number``); a caller that needs a
    number's value parses the payload itself.
    """
    if fields is None:
        return _parse_object
    names = tuple(dict.fromkeys(fields))
    if any(char in '\\"' or char < " " for name in names for char in name):
        # msgspec cannot name a field so (its raw names are written unescaped).
        return lambda payload: _only(_parse_object(payload), names)
    attrs = tuple(f"f{i}" for i in range(len(names)))
    struct = msgspec.defstruct(
        "Fields",
        [
            (attr, _RAW_OR_UNSET, msgspec.field(default=msgspec.UNSET, name=name))
            for attr, name in zip(attrs, names, strict=True)
        ],
    )
    typed = msgspec.json.Decoder(struct).decode
    pairs = tuple(zip(attrs, names, strict=True))
    unset = msgspec.UNSET
    decode = _DECODE

    def some(payload: bytes) -> dict[str, object]:
        try:
            if not payload.isascii():
                payload.decode("utf-8")  # msgspec does not check the UTF-8 of what it skips
            found = typed(payload)
        except (msgspec.MsgspecError, UnicodeDecodeError, RecursionError):
            return _only(_parse_object(payload), names)  # words the refusal, or reads it
        document: dict[str, object] = {}
        for attr, name in pairs:
            raw = getattr(found, attr)
            if raw is not unset:
                try:
                    document[name] = decode(raw)
                except msgspec.ValidationError:  # a number Python will not convert
                    document[name] = _value(raw)
        return document

    return some


def _only(document: Mapping[str, object], names: tuple[str, ...]) -> dict[str, object]:
    """The keys ``names`` of ``document`` that it has."""
    return {name: document[name] for name in names if name in document}


parse_json_object: Final = document_parser()
"""The whole of a ``J`` document (``document_parser()``); ``RemoteProtocolError``
unless it is a UTF-8 JSON object."""


def _check_json_object(payload: bytes) -> None:
    """Raise ``RemoteProtocolError`` unless ``payload`` is a UTF-8 JSON object."""
    parse_json_object(payload)


class _Budget:
    """Inflated bytes still allowed for one top-level ``C`` frame and its nested ones."""

    __slots__ = ("limit", "remaining")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.remaining = limit


def _decode_compressed(
    reader: _FieldReader,
    version: ProtocolVersion,
    limits: Limits,
    depth: int,
    budget: _Budget | None,
) -> Compressed:
    depth += 1
    if depth > limits.max_compressed_depth:
        raise RemoteProtocolError(
            f"C frames nested {depth} deep; the limit is {limits.max_compressed_depth}"
        )
    compressed_bytes = reader.u32()
    _check_frame_bytes(_COMPRESSED_HEADER_BYTES + compressed_bytes, limits)
    reader.require(compressed_bytes)
    body = reader.take(compressed_bytes)
    if budget is None:
        budget = _Budget(limits.max_decompressed_bytes)
    inflated = _inflate(body, budget)
    reader = _BytesReader(inflated)
    frames: list[InnerFrame] = []
    while reader.remaining:
        frames.append(_inner_frame(reader, reader.remaining, version, limits, depth, budget))
    return Compressed(tuple(frames))


def _inner_frame(
    reader: _FieldReader,
    left: int,
    version: ProtocolVersion,
    limits: Limits,
    depth: int,
    budget: _Budget,
) -> InnerFrame:
    """The next frame inside a ``C`` frame's inflated bytes (``left`` of them remain).

    One place for the rules both decoders of ``C`` frames (frame by frame and
    in bulk) apply, so their errors cannot drift apart: the frame is whole,
    of the ``C`` frame's version, and a kind a ``C`` frame may hold.
    """
    try:
        inner_version, frame = _decode_fields(reader, limits, depth=depth, budget=budget)
    except _NeedMore:
        raise RemoteProtocolError(
            f"C frame: {left} bytes at the end of the inflated data are not a whole frame"
        ) from None
    if inner_version != version:
        raise RemoteProtocolError(
            f"C frame of version {version.name} holds a frame of version {inner_version.name}"
        )
    if not isinstance(frame, Data | JsonData | Compressed):
        raise RemoteProtocolError(f"C frame holds a {type(frame).__name__} frame")
    return frame


def _inflate(body: bytes, budget: _Budget) -> bytes:
    inflater = zlib.decompressobj()  # RFC 1950 (zlib header), any level, stored blocks too
    try:
        inflated = inflater.decompress(body, budget.remaining + 1)
    except zlib.error as exc:
        raise RemoteProtocolError(f"C frame: bad zlib stream: {exc}") from None
    if len(inflated) > budget.remaining:
        raise FrameTooLarge(budget.limit, budget.limit - budget.remaining + len(inflated))
    if not inflater.eof:
        raise RemoteProtocolError("C frame: the zlib stream is truncated")
    if inflater.unused_data:
        raise RemoteProtocolError(
            f"C frame: {len(inflater.unused_data)} bytes after the end of the zlib stream"
        )
    budget.remaining -= len(inflated)
    return inflated


def decode_frames(data: bytes, limits: Limits = DEFAULT_LIMITS) -> list[DecodedFrame]:
    """Every frame in ``data``, which must hold whole frames only.

    Raises:
        RemoteProtocolError: a frame is invalid, or ``data`` ends part-way
            through one.
    """
    buffer = ReceiveBuffer(max(len(data), 1))
    buffer.feed(data)
    frames: list[DecodedFrame] = []
    while buffer:
        decoded = decode_frame(buffer, limits)
        if decoded is None:
            raise RemoteProtocolError(f"{len(buffer)} bytes at the end are not a whole frame")
        frames.append(decoded)
    return frames


class _PartialData:
    """A ``D`` frame whose header and first pairs have been taken off the buffer."""

    __slots__ = ("frame_bytes", "pair_count", "pairs", "seq", "version")

    def __init__(self, version: ProtocolVersion, seq: int, pair_count: int) -> None:
        self.version = version
        self.seq = seq
        self.pair_count = pair_count
        self.pairs: list[tuple[bytes, bytes]] = []
        self.frame_bytes = _DATA_HEADER_BYTES


class FrameDecoder:
    """Incremental decoding: feed bytes as they arrive, take whole frames.

    Parsing a large frame that arrives in many reads costs time linear in its
    size, not quadratic: the decoder remembers how many bytes the incomplete
    frame needs before parsing can progress, and takes a ``D`` frame (which
    has no total length) off the buffer pair by pair.

    Args:
        limits: the limits to enforce; the buffer holds at most
            ``limits.max_buffered_bytes``.
        parse: what each ``J`` document is kept as (``_fast.BulkDecoder``)
            (``parse_json_object``: all of it; ``document_parser(fields)``: some keys).
    """

    __slots__ = ("_buffer", "_bytes_needed", "_limits", "_parse", "_partial")

    def __init__(
        self, limits: Limits = DEFAULT_LIMITS, parse: DocumentParser = parse_json_object
    ) -> None:
        self._limits = limits
        self._parse = parse
        self._buffer = ReceiveBuffer(limits.max_buffered_bytes)
        self._bytes_needed = 1
        self._partial: _PartialData | None = None

    def __len__(self) -> int:
        """Bytes received and not yet taken off the buffer."""
        return len(self._buffer)

    @property
    def in_frame(self) -> bool:
        """Part of a frame has been received (an EOF now would cut it)."""
        return bool(self._buffer) or self._partial is not None

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Add received bytes.

        Raises:
            FrameTooLarge: more than ``limits.max_buffered_bytes`` would be buffered.
        """
        self._buffer.feed(data)

    def next_frame(self) -> DecodedFrame | None:
        """The next whole frame, or None until more bytes arrive.

        Raises:
            RemoteProtocolError: the bytes are not a valid frame.
        """
        if len(self._buffer) < self._bytes_needed:
            return None
        if self._partial is None:
            head = self._buffer.peek(_HEADER_BYTES)
            if head is None or head[0] not in _VERSIONS or head[1] != FrameType.DATA:
                return self._whole_frame()
            if not self._step(self._start_data):
                return None
        while self._partial is not None:
            if len(self._partial.pairs) == self._partial.pair_count:
                partial, self._partial = self._partial, None
                return partial.version, Data(partial.seq, tuple(partial.pairs))
            if not self._step(self._next_pair):
                return None
        raise AssertionError("unreachable")  # pragma: no cover

    def _whole_frame(self) -> DecodedFrame | None:
        result = _decode(self._buffer, self._limits, depth=0, budget=None)
        if isinstance(result, int):
            self._bytes_needed = result
            return None
        self._bytes_needed = 1
        return result

    def _step(self, parse: Callable[[_Reader], None]) -> bool:
        """Run one parse step over the buffer; False (rolled back) if it needs more bytes."""
        reader = _Reader(self._buffer)
        try:
            parse(reader)
        except _NeedMore as more:
            self._buffer.rollback()
            self._bytes_needed = more.needed
            return False
        except BaseException:
            self._buffer.rollback()
            raise
        self._buffer.commit()
        self._bytes_needed = 1
        return True

    def _start_data(self, reader: _Reader) -> None:
        version = ProtocolVersion(reader.take(1)[0])
        reader.take(1)  # the type byte, 'D'
        seq, pair_count = _decode_data_header(reader, self._limits)
        self._partial = _PartialData(version, seq, pair_count)

    def _next_pair(self, reader: _Reader) -> None:
        partial = self._partial
        assert partial is not None
        key, value, frame_bytes = _decode_pair(reader, self._limits, partial.frame_bytes)
        partial.pairs.append((key, value))
        partial.frame_bytes = frame_bytes


# --------------------------------------------------------------------------- payloads


def data_to_json(pairs: tuple[tuple[bytes, bytes], ...]) -> bytes:
    """A ``D`` frame's pairs as the event payload we store: a UTF-8 JSON object.

    Every value is a JSON string (``offset`` stays ``"0"``, lumberjack.md#frame-d). A
    duplicated key keeps its first position and its last value (as Logstash's
    and go-lumber's maps do). Bytes that are not UTF-8 become U+FFFD. The
    output is compact (``","``/``":"``) and not ASCII-escaped.
    """
    return document_json(data_document(pairs))


def data_document(pairs: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """A ``D`` frame's pairs as the object ``data_to_json`` writes (its one parse)."""
    return {
        key.decode("utf-8", "replace"): value.decode("utf-8", "replace") for key, value in pairs
    }


_JSON_ENCODE: Final = msgspec.json.Encoder().encode


def document_json(document: dict[str, str]) -> bytes:
    """A ``D`` document (``data_document``'s) as the payload stored: compact UTF-8 JSON.

    msgspec's encoder writes in C the same bytes as ``json.dumps(document,
    ensure_ascii=False, separators=(",", ":"))`` for a dict of strings without
    lone surrogates (which ``decode(..., "replace")`` never makes; a hypothesis
    test holds the two equal), because encoding is a large share of a v1
    event's cost (``benchmarks/lumberjack_feed.py`` measures it).
    """
    return _JSON_ENCODE(document)
