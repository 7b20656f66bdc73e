"""Pravega wire codec: commands to bytes and bytes to commands, with no state and no I/O.

Framing (pravega.md#framing): every frame is::

    type:i32  length:i32  payload[length]        (big-endian, signed)

``length`` counts only the payload. Payload layouts are declared once, as data,
in ``_LAYOUTS`` (command class + the kind of each field, in wire order); one
generic encoder and one generic decoder walk them. Primitive encodings (pravega.md#field-encodings):

=========  ==============================================================
byte       1 byte, signed
bool       1 byte, ``00``/``01``; any other value is refused (the Rust
           client refuses it too)
i32, i64   big-endian two's complement
uuid       16 bytes: most significant half first (Java ``UUID``), which is
           ``UUID.bytes``
str        u16 byte length + text. We write plain UTF-8 (the Rust client
           rejects anything else); we read UTF-8 and fall back to Java's
           modified UTF-8 (``C0 80`` for NUL, surrogate pairs for
           characters beyond the BMP) for Java peers
bytes      i32 length + raw bytes
list<T>    i32 count + T repeated
rest       everything left in the frame, no length prefix
=========  ==============================================================

Optional trailing fields (pravega.md#field-encodings): when *decoding*, a field marked optional that
the frame does not have room for takes its dataclass default (Java's reader
rule: "if enough bytes remain read it, else default"); bytes left over after
the last field are ignored, as both reference peers do. When *encoding*,
every field is always written (the Rust client decodes fixed layouts).

Table keys (pravega.md#table-keys): Java writes an empty key as ``payload=12, length=0`` and
*no version*, and reads it back the same way; we do the same in both
directions. The Rust client never sends empty keys, and an empty key must
never be sent to it.

Errors: anything the peer sent that does not parse raises
:class:`RemoteProtocolError` (never ``IndexError``/``struct.error``/...);
a frame over :data:`MAX_FRAME_BYTES` raises :class:`FrameTooLarge`; a command
we were asked to encode that cannot be encoded raises
:class:`LocalProtocolError`.
"""

from __future__ import annotations

import enum
import itertools
import struct
from collections.abc import Callable, Iterable, Iterator
from dataclasses import fields
from typing import Any, Final
from uuid import UUID

from headrace.errors import FrameTooLarge, LocalProtocolError, RemoteProtocolError
from headrace.protocols._buffer import ReceiveBuffer

from . import commands as c

__all__ = [
    "EVENT_HEADER",
    "FRAME_HEADER",
    "HEADER_SIZE_BYTES",
    "MAX_FRAME_BYTES",
    "MAX_REPLY_TEXT_BYTES",
    "MAX_STRING_BYTES",
    "QUOTED_NAME_CHARS",
    "decode_command",
    "decode_events",
    "decode_frame",
    "decode_payload",
    "encode_command",
    "encode_event",
    "encode_split",
    "iter_events",
    "reply_text",
    "take_frame",
]

FRAME_HEADER = struct.Struct(">ii")
"""Frame header: type code, payload length (pravega.md#framing)."""
HEADER_SIZE_BYTES = FRAME_HEADER.size
assert HEADER_SIZE_BYTES == 8

EVENT_HEADER = FRAME_HEADER
"""Header of an Event frame, the framing of every stored event: type 0, length
(pravega.md#event-framing).

Writers store each event as the wire's Event command, so its header is the
frame header; every front door that writes events into a segment, and every
reader that cuts them out again, frames and parses them with this one struct.
"""

MAX_FRAME_BYTES = 0x00FFFFFF
"""Largest frame, header included (16 MiB - 1): Pravega's ``MAX_WIRECOMMAND_SIZE``.

The Java server rejects larger frames and the Rust client rejects larger
replies (pravega.md#framing), so no peer we serve can send or accept more; the largest
legitimate frame is a Rust append batch of 8 MiB + 8 bytes of data.
"""

MAX_STRING_BYTES = 0xFFFF
"""Longest encoded string: the length prefix is a u16 (pravega.md#field-encodings)."""

MAX_REPLY_TEXT_BYTES: Final = 4096
"""Longest text a server writes into a reply's free-text field (``ErrorMessage``'s
message, ``AuthTokenCheckFailed``'s trace, ``OperationUnsupported``'s operation):
such a text may quote segment names, each up to ``MAX_STRING_BYTES`` itself, so
without a bound a reply about a long name could not be encoded (``reply_text``)."""

QUOTED_NAME_CHARS: Final = 128
"""Characters of a segment name that a reply's text quotes; a longer name is cut
there, with an ellipsis (the reply's own segment field carries the whole name)."""

ELLIPSIS: Final = "\u2026"
"""What marks a cut name or text."""


UUID_CACHE_SIZE = 4096
"""Writer ids (and other UUIDs) decoded recently, kept to be handed out again:
a writer's id arrives with every append it sends, and building a ``UUID``
from bytes is a few microseconds of Python. Cleared when full."""

_UUIDS: dict[bytes, UUID] = {}


def _uuid(raw: bytes) -> UUID:
    """``UUID(bytes=raw)``, the same object for the same bytes while it is cached."""
    found = _UUIDS.get(raw)
    if found is None:
        if len(_UUIDS) >= UUID_CACHE_SIZE:
            _UUIDS.clear()
        found = _UUIDS[raw] = UUID(bytes=raw)
    return found


_I8 = struct.Struct(">b")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_U16 = struct.Struct(">H")


# --------------------------------------------------------------------------- strings


def _encode_str(text: str) -> bytes:
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError as exc:  # lone surrogates
        raise LocalProtocolError(f"string {text!r} is not encodable as UTF-8") from exc
    if len(raw) > MAX_STRING_BYTES:
        raise LocalProtocolError(f"string of {len(raw)} bytes exceeds {MAX_STRING_BYTES} bytes")
    return _U16.pack(len(raw)) + raw


def _decode_str(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        pass
    # Java's modified UTF-8: NUL as C0 80 (never valid UTF-8, so the replacement
    # is safe), supplementary characters as two 3-byte surrogates (CESU-8).
    try:
        text = raw.replace(b"\xc0\x80", b"\x00").decode("utf-8", "surrogatepass")
        return text.encode("utf-16-be", "surrogatepass").decode("utf-16-be")
    except UnicodeError as exc:
        raise RemoteProtocolError(
            f"string is neither UTF-8 nor modified UTF-8: {raw[:64]!r}"
        ) from exc


def reply_text(text: str, names: Iterable[str] = ()) -> str:
    """``text`` made fit for a reply's free-text field: always encodable.

    Each of ``names`` quoted in it (as ``repr`` quotes it) longer than
    ``QUOTED_NAME_CHARS`` is cut there with an ellipsis; a text still over
    ``MAX_REPLY_TEXT_BYTES`` of UTF-8 is cut to fit, ending in an ellipsis;
    a lone surrogate becomes ``?``. The same text always gives the same
    result, so a peer can compare a reply's text with what it expects.
    """
    for name in names:
        if len(name) > QUOTED_NAME_CHARS:
            text = text.replace(repr(name), repr(name[:QUOTED_NAME_CHARS] + ELLIPSIS))
    raw = text.encode("utf-8", "replace")
    if len(raw) > MAX_REPLY_TEXT_BYTES:
        cut = raw[: MAX_REPLY_TEXT_BYTES - len(ELLIPSIS.encode())]
        return cut.decode("utf-8", "ignore") + ELLIPSIS
    return raw.decode("utf-8")


# --------------------------------------------------------------------------- reader


class _Reader:
    """A cursor over one frame's payload; every read checks the bounds."""

    __slots__ = ("_data", "_name", "_position")

    def __init__(self, data: bytes | memoryview, name: str) -> None:
        self._data = data
        self._position = 0  # index into this payload
        self._name = name

    def remaining(self) -> int:
        return len(self._data) - self._position

    def take(self, count: int) -> bytes:
        chunk = self.take_view(count)
        return chunk if type(chunk) is bytes else bytes(chunk)

    def take_view(self, count: int) -> bytes | memoryview:
        """Like ``take``, but a payload held as a memoryview gives a view (no copy)."""
        if count < 0:
            raise RemoteProtocolError(f"{self._name}: negative length {count}")
        end = self._position + count
        if end > len(self._data):
            raise RemoteProtocolError(
                f"{self._name}: payload ends {end - len(self._data)} bytes short"
            )
        chunk = self._data[self._position : end]
        self._position = end
        return chunk

    def rest(self) -> bytes:
        return self.take(self.remaining())

    def data(self) -> bytes | memoryview:
        """A length-prefixed data field (appends, reads), as a view when the frame is one."""
        return self.take_view(self.i32())

    def data_rest(self) -> bytes | memoryview:
        """The rest of the frame as an append payload, as a view when the frame is one."""
        return self.take_view(self.remaining())

    def byte(self) -> int:
        value: int = _I8.unpack(self.take(1))[0]
        return value

    def bool(self) -> bool:
        raw = self.take(1)[0]
        if raw > 1:
            raise RemoteProtocolError(f"{self._name}: boolean byte {raw:#04x} is not 00 or 01")
        return raw == 1

    def i32(self) -> int:
        value: int = _I32.unpack(self.take(4))[0]
        return value

    def i64(self) -> int:
        value: int = _I64.unpack(self.take(8))[0]
        return value

    def count(self) -> int:
        """A list count; each element takes at least one byte, which bounds it."""
        count = self.i32()
        if count < 0 or count > self.remaining():
            raise RemoteProtocolError(f"{self._name}: impossible element count {count}")
        return count

    def uuid(self) -> UUID:
        return _uuid(self.take(16))

    def str(self) -> str:
        (length,) = _U16.unpack(self.take(2))
        return _decode_str(self.take(length))

    def bytes(self) -> bytes:
        return self.take(self.i32())


# --------------------------------------------------------------------------- structures


def _write_table_key(out: bytearray, key: c.TableKey) -> None:
    if not key.key:
        if key.version != c.NO_VERSION:
            raise LocalProtocolError(
                "an empty TableKey is written without its version (Java's layout); "
                f"it cannot carry version {key.version}"
            )
        out += _I32.pack(4 + 8) + _I32.pack(0)
        return
    out += _I32.pack(4 + len(key.key) + 8) + _I32.pack(len(key.key)) + key.key
    out += _I64.pack(key.version)


def _read_table_key(reader: _Reader) -> c.TableKey:
    reader.i32()  # payload: a redundant size hint, not relied upon (pravega.md#table-keys)
    length = reader.i32()
    if length == 0:  # Java writes no version after an empty key
        return c.TableKey(b"", c.NO_VERSION)
    key = reader.take(length)
    return c.TableKey(key, reader.i64())


def _write_table_value(out: bytearray, value: c.TableValue) -> None:
    out += _I32.pack(4 + len(value.value)) + _I32.pack(len(value.value)) + value.value


def _read_table_value(reader: _Reader) -> c.TableValue:
    reader.i32()  # payload: redundant size hint
    return c.TableValue(reader.take(reader.i32()))


def _write_table_entries(out: bytearray, entries: c.TableEntries) -> None:
    out += _I32.pack(len(entries.entries))
    for key, value in entries.entries:
        _write_table_key(out, key)
        _write_table_value(out, value)


def _read_table_entries(reader: _Reader) -> c.TableEntries:
    count = reader.count()
    return c.TableEntries(
        tuple((_read_table_key(reader), _read_table_value(reader)) for _ in range(count))
    )


def _write_attribute_update(out: bytearray, update: c.ConditionalAttributeUpdate) -> None:
    out += update.attribute_id.bytes + _I8.pack(update.update_type)
    out += _I64.pack(update.new_value) + _I64.pack(update.old_value)


def _read_attribute_update(reader: _Reader) -> c.ConditionalAttributeUpdate:
    return c.ConditionalAttributeUpdate(reader.uuid(), reader.byte(), reader.i64(), reader.i64())


def _write_chunk(out: bytearray, chunk: c.ChunkInfo) -> None:
    out += _I64.pack(chunk.length_in_metadata) + _I64.pack(chunk.length_in_storage)
    out += _I64.pack(chunk.start_offset) + _encode_str(chunk.chunk_name)
    out += b"\x01" if chunk.exists_in_storage else b"\x00"


def _read_chunk(reader: _Reader) -> c.ChunkInfo:
    return c.ChunkInfo(reader.i64(), reader.i64(), reader.i64(), reader.str(), reader.bool())


def _write_iterator_args(out: bytearray, args: c.TableIteratorArgs) -> None:
    for part in (args.continuation_token, args.prefix_filter, args.from_key, args.to_key):
        out += _I32.pack(len(part)) + part


def _read_iterator_args(reader: _Reader) -> c.TableIteratorArgs:
    # Java reads each part only if a length prefix fits in what is left.
    parts = [reader.bytes() if reader.remaining() >= 4 else b"" for _ in range(4)]
    return c.TableIteratorArgs(*parts)


def _write_event(out: bytearray, event: c.Event) -> None:
    out += EVENT_HEADER.pack(c.CommandType.EVENT, len(event.data)) + event.data


def _read_event(reader: _Reader) -> c.Event:
    type_code = reader.i32()
    if type_code != c.CommandType.EVENT:
        raise RemoteProtocolError(f"expected an Event (type 0), found type {type_code}")
    return c.Event(reader.bytes())


def _write_bytes(out: bytearray, data: bytes) -> None:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError(f"expected bytes, got {type(data).__name__}")
    out += _I32.pack(len(data))
    out += data  # no intermediate copy: data fields can be megabytes


def _write_padding(out: bytearray, length: int) -> None:
    if not 0 <= length <= MAX_FRAME_BYTES:
        raise ValueError(f"padding of {length} bytes")
    out += bytes(length)


def _write_list(write: Callable[[bytearray, Any], None]) -> Callable[[bytearray, Any], None]:
    def write_list(out: bytearray, items: Any) -> None:
        out += _I32.pack(len(items))
        for item in items:
            write(out, item)

    return write_list


def _read_list(read: Callable[[_Reader], Any]) -> Callable[[_Reader], Any]:
    def read_list(reader: _Reader) -> tuple[Any, ...]:
        return tuple(read(reader) for _ in range(reader.count()))

    return read_list


# --------------------------------------------------------------------------- field kinds


class _Kind(enum.Enum):
    """How one field is laid out on the wire."""

    # Looked up per field of every frame: identity hash, as equality is, instead
    # of Enum's hash of the name (a Python call per lookup).
    __hash__ = object.__hash__

    BYTE = enum.auto()
    BOOL = enum.auto()
    I32 = enum.auto()
    I64 = enum.auto()
    UUID = enum.auto()
    STR = enum.auto()
    BYTES = enum.auto()
    REST = enum.auto()
    DATA = enum.auto()
    """Laid out as BYTES; decoded without a copy when the frame is large (append data,
    a ``SegmentRead``'s data)."""
    DATA_REST = enum.auto()
    """Laid out as REST; decoded without a copy when the frame is large (append data)."""
    PADDING = enum.auto()
    EVENT = enum.auto()
    TABLE_KEYS = enum.auto()
    TABLE_ENTRIES = enum.auto()
    I64_LIST = enum.auto()
    STR_LIST = enum.auto()
    ATTRIBUTE_UPDATES = enum.auto()
    CHUNKS = enum.auto()
    ITERATOR_ARGS = enum.auto()


# An optional trailing field is read only if at least this many bytes are left
# (Java's readers: ``available() >= Long.BYTES`` for an i64, ``available() > 0``
# for a string or a list, ...).
_MIN_BYTES: dict[_Kind, int] = {
    _Kind.BOOL: 1,
    _Kind.I32: 4,
    _Kind.I64: 8,
    _Kind.STR: 1,
    _Kind.ATTRIBUTE_UPDATES: 1,
}

_WRITERS: dict[_Kind, Callable[[bytearray, Any], None]] = {
    _Kind.BYTE: lambda out, v: out.extend(_I8.pack(v)),
    _Kind.BOOL: lambda out, v: out.extend(b"\x01" if v else b"\x00"),
    _Kind.I32: lambda out, v: out.extend(_I32.pack(v)),
    _Kind.I64: lambda out, v: out.extend(_I64.pack(v)),
    _Kind.UUID: lambda out, v: out.extend(v.bytes),
    _Kind.STR: lambda out, v: out.extend(_encode_str(v)),
    _Kind.BYTES: lambda out, v: _write_bytes(out, v),
    _Kind.REST: lambda out, v: out.extend(v),
    _Kind.DATA: lambda out, v: _write_bytes(out, v),
    _Kind.DATA_REST: lambda out, v: out.extend(v),
    _Kind.PADDING: lambda out, v: _write_padding(out, v),
    _Kind.EVENT: _write_event,
    _Kind.TABLE_KEYS: _write_list(_write_table_key),
    _Kind.TABLE_ENTRIES: _write_table_entries,
    _Kind.I64_LIST: _write_list(lambda out, v: out.extend(_I64.pack(v))),
    _Kind.STR_LIST: _write_list(lambda out, v: out.extend(_encode_str(v))),
    _Kind.ATTRIBUTE_UPDATES: _write_list(_write_attribute_update),
    _Kind.CHUNKS: _write_list(_write_chunk),
    _Kind.ITERATOR_ARGS: _write_iterator_args,
}

_READERS: dict[_Kind, Callable[[_Reader], Any]] = {
    _Kind.BYTE: _Reader.byte,
    _Kind.BOOL: _Reader.bool,
    _Kind.I32: _Reader.i32,
    _Kind.I64: _Reader.i64,
    _Kind.UUID: _Reader.uuid,
    _Kind.STR: _Reader.str,
    _Kind.BYTES: _Reader.bytes,
    _Kind.DATA: _Reader.data,
    _Kind.DATA_REST: _Reader.data_rest,
    _Kind.REST: _Reader.rest,
    _Kind.PADDING: lambda reader: len(reader.rest()),
    _Kind.EVENT: _read_event,
    _Kind.TABLE_KEYS: _read_list(_read_table_key),
    _Kind.TABLE_ENTRIES: _read_table_entries,
    _Kind.I64_LIST: _read_list(_Reader.i64),
    _Kind.STR_LIST: _read_list(_Reader.str),
    _Kind.ATTRIBUTE_UPDATES: _read_list(_read_attribute_update),
    _Kind.CHUNKS: _read_list(_read_chunk),
    _Kind.ITERATOR_ARGS: _read_iterator_args,
}


class _Optional:
    """Marks a trailing field that a peer may leave out (*opt* in pravega.md#commands)."""

    __slots__ = ("kind",)

    def __init__(self, kind: _Kind) -> None:
        self.kind = kind


def _opt(kind: _Kind) -> _Optional:
    return _Optional(kind)


# --------------------------------------------------------------------------- layouts

_K = _Kind
_Spec = _Kind | _Optional
_Field = tuple[str, _Kind, bool, Any]  # name, kind, optional, default


def _layout(cls: type[c.Command], *kinds: _Spec) -> tuple[type[c.Command], tuple[_Field, ...]]:
    names = fields(cls)  # type: ignore[arg-type]
    assert len(names) == len(kinds), cls.__name__
    layout: list[_Field] = []
    for f, spec in zip(names, kinds, strict=True):
        optional = isinstance(spec, _Optional)
        kind = spec.kind if isinstance(spec, _Optional) else spec
        assert not optional or kind in _MIN_BYTES, f"{cls.__name__}.{f.name}"
        default = f.default_factory() if callable(f.default_factory) else f.default
        layout.append((f.name, kind, optional, default))
    for earlier, later in itertools.pairwise(layout):
        assert not earlier[2] or later[2], f"{cls.__name__}: optional fields must be trailing"
    return cls, tuple(layout)


_STR_TRACE = _opt(_K.STR)  # server_stack_trace: optional in Java's readers

_LAYOUT_LIST = [
    # handshake (pravega.md#handshake)
    _layout(c.Hello, _K.I32, _K.I32),
    _layout(c.KeepAlive),
    # appends (pravega.md#appends)
    _layout(c.Event, _K.REST),
    _layout(c.Padding, _K.PADDING),
    _layout(c.PartialEvent, _K.REST),
    _layout(c.SetupAppend, _K.I64, _K.UUID, _K.STR, _K.STR),
    _layout(c.AppendSetup, _K.I64, _K.STR, _K.UUID, _K.I64),
    _layout(c.AppendBlock, _K.UUID, _K.DATA_REST),
    _layout(c.AppendBlockEnd, _K.UUID, _K.I32, _K.DATA, _K.I32, _K.I64, _opt(_K.I64)),
    _layout(c.ConditionalAppend, _K.UUID, _K.I64, _K.I64, _K.EVENT, _opt(_K.I64)),
    _layout(c.ConditionalBlockEnd, _K.UUID, _K.I64, _K.I64, _K.DATA, _K.I64),
    _layout(c.DataAppended, _K.UUID, _K.I64, _opt(_K.I64), _opt(_K.I64), _opt(_K.I64)),
    _layout(c.ConditionalCheckFailed, _K.UUID, _K.I64, _opt(_K.I64)),
    _layout(c.CreateTransientSegment, _K.I64, _K.UUID, _K.STR, _K.STR),
    # reads (pravega.md#reads)
    _layout(c.ReadSegment, _K.STR, _K.I64, _K.I32, _K.STR, _opt(_K.I64)),
    _layout(c.SegmentRead, _K.STR, _K.I64, _K.BOOL, _K.BOOL, _K.DATA, _opt(_K.I64)),
    # segment management (pravega.md#segments)
    _layout(c.GetStreamSegmentInfo, _K.I64, _K.STR, _K.STR),
    _layout(c.ReadSegmentTimes, _K.I64, _K.STR, _K.I64, _K.I64, _K.STR),
    _layout(c.SegmentTimesRead, _K.I64, _K.STR, _K.I64_LIST),
    _layout(
        c.StreamSegmentInfo, _K.I64, _K.STR, _K.BOOL, _K.BOOL, _K.BOOL, _K.I64, _K.I64, _opt(_K.I64)
    ),
    _layout(c.CreateSegment, _K.I64, _K.STR, _K.I32, _K.BYTE, _K.STR, _opt(_K.I64)),
    _layout(c.SegmentCreated, _K.I64, _K.STR),
    _layout(c.SealSegment, _K.I64, _K.STR, _K.STR),
    _layout(c.SegmentSealed, _K.I64, _K.STR),
    _layout(c.DeleteSegment, _K.I64, _K.STR, _K.STR),
    _layout(c.SegmentDeleted, _K.I64, _K.STR),
    _layout(c.UpdateSegmentPolicy, _K.I64, _K.STR, _K.I32, _K.BYTE, _K.STR),
    _layout(c.SegmentPolicyUpdated, _K.I64, _K.STR),
    _layout(c.TruncateSegment, _K.I64, _K.STR, _K.I64, _K.STR),
    _layout(c.SegmentTruncated, _K.I64, _K.STR),
    _layout(c.MergeSegments, _K.I64, _K.STR, _K.STR, _K.STR, _opt(_K.ATTRIBUTE_UPDATES)),
    _layout(c.SegmentsMerged, _K.I64, _K.STR, _K.STR, _opt(_K.I64)),
    _layout(c.MergeSegmentsBatch, _K.I64, _K.STR, _K.STR_LIST, _K.STR),
    _layout(c.LocateOffset, _K.I64, _K.STR, _K.I64, _K.STR),
    _layout(c.OffsetLocated, _K.I64, _K.STR, _K.I64),
    _layout(c.FlushToStorage, _K.I32, _K.STR, _K.I64),
    _layout(c.StorageFlushed, _K.I64),
    _layout(c.ListStorageChunks, _K.STR, _K.STR, _K.I64),
    _layout(c.StorageChunksListed, _K.I64, _K.CHUNKS),
    # attributes (pravega.md#attributes)
    _layout(c.GetSegmentAttribute, _K.I64, _K.STR, _K.UUID, _K.STR),
    _layout(c.SegmentAttribute, _K.I64, _K.I64),
    _layout(c.UpdateSegmentAttribute, _K.I64, _K.STR, _K.UUID, _K.I64, _K.I64, _K.STR),
    _layout(c.SegmentAttributeUpdated, _K.I64, _K.BOOL),
    # table segments (pravega.md#tables)
    _layout(c.GetTableSegmentInfo, _K.I64, _K.STR, _K.STR),
    _layout(c.TableSegmentInfo, _K.I64, _K.STR, _K.I64, _K.I64, _K.I64, _K.I32),
    _layout(
        c.CreateTableSegment, _K.I64, _K.STR, _K.STR, _opt(_K.BOOL), _opt(_K.I32), _opt(_K.I64)
    ),
    _layout(c.DeleteTableSegment, _K.I64, _K.STR, _K.BOOL, _K.STR),
    _layout(c.MergeTableSegments, _K.I64, _K.STR, _K.STR, _K.STR),
    _layout(c.SealTableSegment, _K.I64, _K.STR, _K.STR),
    _layout(c.UpdateTableEntries, _K.I64, _K.STR, _K.STR, _K.TABLE_ENTRIES, _opt(_K.I64)),
    _layout(c.TableEntriesUpdated, _K.I64, _K.I64_LIST),
    _layout(c.RemoveTableKeys, _K.I64, _K.STR, _K.STR, _K.TABLE_KEYS, _opt(_K.I64)),
    _layout(c.TableKeysRemoved, _K.I64, _K.STR),
    _layout(c.ReadTable, _K.I64, _K.STR, _K.STR, _K.TABLE_KEYS),
    _layout(c.TableRead, _K.I64, _K.STR, _K.TABLE_ENTRIES),
    _layout(c.ReadTableKeys, _K.I64, _K.STR, _K.STR, _K.I32, _K.ITERATOR_ARGS),
    _layout(c.TableKeysRead, _K.I64, _K.STR, _K.TABLE_KEYS, _K.BYTES),
    _layout(c.ReadTableEntries, _K.I64, _K.STR, _K.STR, _K.I32, _K.ITERATOR_ARGS),
    _layout(c.TableEntriesRead, _K.I64, _K.STR, _K.TABLE_ENTRIES, _K.BYTES),
    _layout(c.ReadTableEntriesDelta, _K.I64, _K.STR, _K.STR, _K.I64, _K.I32),
    _layout(c.TableEntriesDeltaRead, _K.I64, _K.STR, _K.TABLE_ENTRIES, _K.BOOL, _K.BOOL, _K.I64),
    # error replies (pravega.md#errors; Java reads the trailing stack trace / offset as optional)
    _layout(c.WrongHost, _K.I64, _K.STR, _K.STR, _STR_TRACE),
    _layout(c.SegmentIsSealed, _K.I64, _K.STR, _STR_TRACE, _opt(_K.I64)),
    _layout(c.SegmentAlreadyExists, _K.I64, _K.STR, _STR_TRACE),
    _layout(c.NoSuchSegment, _K.I64, _K.STR, _STR_TRACE, _opt(_K.I64)),
    _layout(c.InvalidEventNumber, _K.UUID, _K.I64, _STR_TRACE, _opt(_K.I64)),
    _layout(c.SegmentIsTruncated, _K.I64, _K.STR, _K.I64, _STR_TRACE, _opt(_K.I64)),
    _layout(c.OperationUnsupported, _K.I64, _K.STR, _STR_TRACE),
    _layout(c.AuthTokenCheckFailed, _K.I64, _STR_TRACE, _opt(_K.I32)),
    _layout(c.ErrorMessage, _K.I64, _K.STR, _K.STR, _K.I32),
    _layout(c.TableSegmentNotEmpty, _K.I64, _K.STR, _K.STR),
    _layout(c.TableKeyDoesNotExist, _K.I64, _K.STR, _K.STR),
    _layout(c.TableKeyBadVersion, _K.I64, _K.STR, _K.STR),
]

_LAYOUTS: dict[int, tuple[type[c.Command], tuple[_Field, ...]]] = {
    cls.type: (cls, layout) for cls, layout in _LAYOUT_LIST
}


# SegmentsBatchMerged interleaves two lists on the wire: count, then (source, offset) pairs.
def _encode_batch_merged(out: bytearray, cmd: c.SegmentsBatchMerged) -> None:
    if len(cmd.sources) != len(cmd.new_target_write_offsets):
        raise LocalProtocolError("SegmentsBatchMerged needs one offset per source")
    out += _I64.pack(cmd.request_id) + _encode_str(cmd.target) + _I32.pack(len(cmd.sources))
    for source, offset in zip(cmd.sources, cmd.new_target_write_offsets, strict=True):
        out += _encode_str(source) + _I64.pack(offset)


def _decode_batch_merged(reader: _Reader) -> c.SegmentsBatchMerged:
    request_id, target, count = reader.i64(), reader.str(), reader.count()
    pairs = [(reader.str(), reader.i64()) for _ in range(count)]
    return c.SegmentsBatchMerged(
        request_id, target, tuple(p[0] for p in pairs), tuple(p[1] for p in pairs)
    )


# Every type code (pravega.md#commands) has a codec; the enum and the tables must agree.
assert set(_LAYOUTS) | {c.CommandType.SEGMENTS_BATCH_MERGED} == set(c.CommandType)


# --------------------------------------------------------------------------- encode


def encode_command(cmd: c.Command, *, max_frame_bytes: int = MAX_FRAME_BYTES) -> bytes:
    """Encode one command as a complete frame (header + payload).

    Every field is written, including those a peer may omit.

    Args:
        cmd: the command.
        max_frame_bytes: refuse to build a larger frame.

    Returns:
        The frame's bytes.

    Raises:
        LocalProtocolError: a field does not fit its wire type (an integer out
            of range, a string over 65535 bytes or not encodable, an empty
            table key with a version), or the frame exceeds ``max_frame_bytes``.
    """
    out = bytearray(HEADER_SIZE_BYTES)
    try:
        if isinstance(cmd, c.SegmentsBatchMerged):
            _encode_batch_merged(out, cmd)
        else:
            _, layout = _LAYOUTS[cmd.type]
            for name, kind, _optional, _default in layout:
                _WRITERS[kind](out, getattr(cmd, name))
    except (struct.error, TypeError, AttributeError, ValueError, OverflowError) as exc:
        raise LocalProtocolError(f"cannot encode {cmd!r}: {exc}") from exc
    if len(out) > max_frame_bytes:
        raise LocalProtocolError(
            f"{type(cmd).__name__} frame of {len(out)} bytes exceeds {max_frame_bytes} bytes"
        )
    FRAME_HEADER.pack_into(out, 0, cmd.type, len(out) - HEADER_SIZE_BYTES)
    return bytes(out)


def encode_split(
    cmd: c.Command, size_bytes: int, *, max_frame_bytes: int = MAX_FRAME_BYTES
) -> tuple[bytes, bytes]:
    """Encode ``cmd`` around a bytes field that the caller sends itself.

    ``cmd``'s first empty bytes field stands for ``size_bytes`` bytes that are
    not passed in: the frame is encoded as if it held them, and returned in
    two parts, everything before those bytes (their length field included)
    and everything after. ``prefix + data + suffix`` is ``encode_command`` of
    ``cmd`` with ``data`` in that field, so a large payload (a ``SegmentRead``'s
    data) can go out from where it lies, with ``sendfile`` or as a memoryview,
    without being copied into a frame.

    Raises:
        LocalProtocolError: as ``encode_command``; also when ``cmd`` has no
            empty bytes field.
    """
    out = bytearray(HEADER_SIZE_BYTES)
    split = -1
    try:
        _, layout = _LAYOUTS[cmd.type]
        for name, kind, _optional, _default in layout:
            value = getattr(cmd, name)
            if split < 0 and kind in (_Kind.BYTES, _Kind.DATA) and not value:
                out += _I32.pack(size_bytes)
                split = len(out)
            else:
                _WRITERS[kind](out, value)
    except (KeyError, struct.error, TypeError, AttributeError, ValueError, OverflowError) as exc:
        raise LocalProtocolError(f"cannot encode {cmd!r}: {exc}") from exc
    if split < 0:
        raise LocalProtocolError(f"{type(cmd).__name__} has no empty bytes field to split at")
    total = len(out) + size_bytes
    if total > max_frame_bytes:
        raise LocalProtocolError(
            f"{type(cmd).__name__} frame of {total} bytes exceeds {max_frame_bytes} bytes"
        )
    FRAME_HEADER.pack_into(out, 0, cmd.type, total - HEADER_SIZE_BYTES)
    return bytes(out[:split]), bytes(out[split:])


def encode_event(data: bytes) -> bytes:
    """Frame one event the way writers store it in a segment (pravega.md#event-framing):
    type 0, length, bytes."""
    return EVENT_HEADER.pack(c.CommandType.EVENT, len(data)) + data


# --------------------------------------------------------------------------- decode


def decode_payload(type_code: int, payload: bytes | memoryview) -> c.Command:
    """Decode one frame's payload.

    A payload given as a ``memoryview`` (a large frame, see
    ``ReceiveBuffer.consume_frame``) gives the data fields (appends, a
    ``SegmentRead``'s data) as views of it, without a copy; every other field
    is decoded to ``bytes``/``str``.

    Raises:
        RemoteProtocolError: unknown type code, or a payload that does not
            parse as that command.
    """
    if type_code == c.CommandType.SEGMENTS_BATCH_MERGED:
        return _decode_batch_merged(_Reader(payload, "SegmentsBatchMerged"))
    entry = _LAYOUTS.get(type_code)
    if entry is None:
        raise RemoteProtocolError(f"unknown command type code {type_code}")
    cls, layout = entry
    reader = _Reader(payload, cls.__name__)
    values: list[Any] = []
    for _name, kind, optional, default in layout:
        if optional and reader.remaining() < _MIN_BYTES[kind]:
            values.append(default)
        else:
            values.append(_READERS[kind](reader))
    return cls(*values)


def decode_frame(frame: bytes) -> c.Command:
    """Decode exactly one complete frame (header included); for tests and tools.

    Raises:
        RemoteProtocolError: the bytes are not exactly one valid frame.
    """
    buffer = ReceiveBuffer(max_buffered_bytes=max(len(frame), 1))
    buffer.feed(frame)
    cmd = decode_command(buffer)
    if cmd is None or buffer:
        raise RemoteProtocolError(f"not exactly one frame: {len(frame)} bytes")
    return cmd


def decode_command(
    buffer: ReceiveBuffer, *, max_frame_bytes: int = MAX_FRAME_BYTES
) -> c.Command | None:
    """Take one command from the front of ``buffer``, if a whole frame is there.

    The header is checked as soon as it has arrived (unknown type, negative or
    oversized length), so a bad peer is caught before its payload is buffered.

    Args:
        buffer: received bytes; a complete frame is consumed and committed, an
            incomplete one is rolled back and left in place.
        max_frame_bytes: the largest frame accepted, header included.

    Returns:
        The command, or ``None`` if more bytes are needed.

    Raises:
        FrameTooLarge: the header announces a frame over ``max_frame_bytes``.
        RemoteProtocolError: unknown type code, negative length, or a payload
            that does not parse. The buffer is then in an unspecified state;
            the connection must be closed.
    """
    frame = take_frame(buffer, max_frame_bytes=max_frame_bytes)
    return None if frame is None else decode_payload(*frame)


def take_frame(
    buffer: ReceiveBuffer, *, max_frame_bytes: int = MAX_FRAME_BYTES
) -> tuple[int, bytes | memoryview] | None:
    """The framing half of :func:`decode_command`: ``(type code, payload)`` of the
    whole frame at the front of ``buffer``, consumed and committed, or None.

    Raises:
        FrameTooLarge, RemoteProtocolError: as :func:`decode_command`, for the header.
    """
    header = buffer.consume_exactly(HEADER_SIZE_BYTES)
    if header is None:
        buffer.rollback()
        return None
    type_code, length = FRAME_HEADER.unpack(header)
    if length < 0:
        raise RemoteProtocolError(f"frame of type {type_code} has negative length {length}")
    if HEADER_SIZE_BYTES + length > max_frame_bytes:
        raise FrameTooLarge(max_frame_bytes, HEADER_SIZE_BYTES + length)
    if type_code not in _LAYOUTS and type_code != c.CommandType.SEGMENTS_BATCH_MERGED:
        raise RemoteProtocolError(f"unknown command type code {type_code}")
    payload = buffer.consume_frame(length)  # commits; a large payload is not copied
    if payload is None:
        buffer.rollback()
        return None
    return type_code, payload


def iter_events(data: bytes) -> Iterator[bytes]:
    """Yield the payload of each back-to-back Event frame in ``data`` (pravega.md#event-framing).

    Raises:
        RemoteProtocolError: a frame is not an Event, or ``data`` ends inside one.
    """
    reader = _Reader(data, "event data")
    while reader.remaining():
        yield _read_event(reader).data


def decode_events(data: bytes) -> list[bytes]:
    """The payloads of the back-to-back Event frames in ``data`` (see :func:`iter_events`)."""
    return list(iter_events(data))
