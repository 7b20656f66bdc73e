"""The Pravega codec's fast paths, each equal to the layout walk of ``codec.py``.

Every append is one ``AppendBlockEnd`` received and one ``DataAppended``
sent, and every read one ``ReadSegment`` received and one ``SegmentRead``
sent. Those four skip the walk over their layout: precompiled ``struct``
packs and unpacks, no intermediate command for the ack. Each gives the same
bytes, command and errors as the walk, and steps aside (returns None) for
anything it does not take, so the walk decodes or refuses that with its own
message; ``tests/protocols/pravega/test_hot_paths.py`` holds them to it.
The connection encodes and decodes through :func:`encode_command` and
:func:`decode_command` here; ``codec.py`` stays the reference.
"""

from __future__ import annotations

import struct
from uuid import UUID

from headrace.errors import LocalProtocolError
from headrace.protocols._buffer import ReceiveBuffer

from . import codec
from . import commands as c
from .codec import FRAME_HEADER, HEADER_SIZE_BYTES, MAX_FRAME_BYTES

__all__ = [
    "decode_append_block_end",
    "decode_command",
    "decode_payload",
    "decode_read_segment",
    "encode_command",
    "encode_data_appended",
    "encode_segment_read",
]

_DATA_APPENDED_FRAME = struct.Struct(">ii16sqqqq")
"""A whole DataAppended frame, every optional field written (as ``encode_command``
writes them): one ``pack`` instead of a walk over the layout, per append."""
_DATA_APPENDED_TYPE = int(c.CommandType.DATA_APPENDED)
_APPEND_BLOCK_END_TYPE = int(c.CommandType.APPEND_BLOCK_END)
_APPEND_BLOCK_END_HEAD = struct.Struct(">16sii")
"""AppendBlockEnd up to its data: writer id, size of whole events, data length."""
_APPEND_BLOCK_END_TAIL = struct.Struct(">iqq")
"""AppendBlockEnd after its data: event count, last event number, request id."""

_SEGMENT_READ_TYPE = int(c.CommandType.SEGMENT_READ)
_READ_SEGMENT_TYPE = int(c.CommandType.READ_SEGMENT)
_READ_SEGMENT_FIELDS = struct.Struct(">qiH")
"""ReadSegment after its segment name: offset, suggested length, token length."""
_BYTES_TYPES = (bytes, bytearray, memoryview)

_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_U16 = struct.Struct(">H")


# --------------------------------------------------------------------------- encode


def encode_command(cmd: c.Command, max_frame_bytes: int = MAX_FRAME_BYTES) -> bytes:
    """:func:`codec.encode_command`, with the replies to appends and reads packed directly.

    Raises:
        LocalProtocolError: as :func:`codec.encode_command`.
    """
    if type(cmd) is c.DataAppended:  # one per append: the hot reply
        try:
            return encode_data_appended(
                cmd.writer_id,
                cmd.event_number,
                cmd.previous_event_number,
                cmd.request_id,
                cmd.current_segment_write_offset,
            )
        except LocalProtocolError as exc:
            raise LocalProtocolError(f"cannot encode {cmd!r}: {exc}") from exc
    if type(cmd) is c.SegmentRead and type(cmd.data) in _BYTES_TYPES:  # every tail read
        return encode_segment_read(cmd, max_frame_bytes)
    return codec.encode_command(cmd, max_frame_bytes=max_frame_bytes)


def encode_segment_read(cmd: c.SegmentRead, max_frame_bytes: int) -> bytes:
    """``encode_command`` of a SegmentRead (the reply to every read) without the
    layout walk: its fields packed in order and joined once. Same bytes, and the
    same errors in the same order as the walk."""
    name = codec._encode_str(cmd.segment)
    data = cmd.data
    try:
        fields = (
            _I64.pack(cmd.offset)
            + (b"\x01" if cmd.at_tail else b"\x00")
            + (b"\x01" if cmd.end_of_segment else b"\x00")
            + _I32.pack(len(data))
        )
        request_id = _I64.pack(cmd.request_id)
    except (struct.error, TypeError) as exc:
        raise LocalProtocolError(f"cannot encode {cmd!r}: {exc}") from exc
    size = len(name) + len(fields) + len(data) + len(request_id)
    if HEADER_SIZE_BYTES + size > max_frame_bytes:
        raise LocalProtocolError(
            f"SegmentRead frame of {HEADER_SIZE_BYTES + size} bytes exceeds {max_frame_bytes} bytes"
        )
    return b"".join((FRAME_HEADER.pack(_SEGMENT_READ_TYPE, size), name, fields, data, request_id))


def encode_data_appended(
    writer_id: UUID,
    event_number: int,
    previous_event_number: int,
    request_id: int,
    current_segment_write_offset: int,
) -> bytes:
    """``encode_command(DataAppended(...))`` from its fields, without building the
    command: one precompiled ``pack``, for the reply every append gets.

    Raises:
        LocalProtocolError: a number does not fit its i64.
    """
    try:
        return _DATA_APPENDED_FRAME.pack(
            _DATA_APPENDED_TYPE,
            _DATA_APPENDED_FRAME.size - HEADER_SIZE_BYTES,
            writer_id.bytes,
            event_number,
            previous_event_number,
            request_id,
            current_segment_write_offset,
        )
    except (struct.error, AttributeError) as exc:
        raise LocalProtocolError(f"cannot encode DataAppended: {exc}") from exc


# --------------------------------------------------------------------------- decode


def decode_command(
    buffer: ReceiveBuffer, *, max_frame_bytes: int = MAX_FRAME_BYTES
) -> c.Command | None:
    """:func:`codec.decode_command`, with appends and read requests unpacked directly.

    Raises:
        FrameTooLarge, RemoteProtocolError: as :func:`codec.decode_command`.
    """
    frame = codec.take_frame(buffer, max_frame_bytes=max_frame_bytes)
    return None if frame is None else decode_payload(*frame)


def decode_payload(type_code: int, payload: bytes | memoryview) -> c.Command:
    """:func:`codec.decode_payload`, with appends and read requests unpacked directly.

    Raises:
        RemoteProtocolError: as :func:`codec.decode_payload`.
    """
    if type_code == _APPEND_BLOCK_END_TYPE:  # one per append: the hot request
        block = decode_append_block_end(payload)
        if block is not None:
            return block
    elif type_code == _READ_SEGMENT_TYPE:  # every read request
        read = decode_read_segment(payload)
        if read is not None:
            return read
    return codec.decode_payload(type_code, payload)


def decode_append_block_end(payload: bytes | memoryview) -> c.AppendBlockEnd | None:
    """An AppendBlockEnd with every field present, decoded with two precompiled
    ``unpack``s instead of a walk over its layout; None for anything else
    (short, a length out of bounds, the request id omitted), which the layout
    walk then decodes or refuses with its own message. The same command as the
    walk gives: data as a slice of the payload (a view of a large frame)."""
    head = _APPEND_BLOCK_END_HEAD.size
    if len(payload) < head:
        return None
    writer, size_of_whole_events, length = _APPEND_BLOCK_END_HEAD.unpack_from(payload)
    end = head + length
    if length < 0 or len(payload) - end < _APPEND_BLOCK_END_TAIL.size:
        return None
    num_events, last_event_number, request_id = _APPEND_BLOCK_END_TAIL.unpack_from(payload, end)
    return c.AppendBlockEnd(
        codec._uuid(writer),
        size_of_whole_events,
        payload[head:end],
        num_events,
        last_event_number,
        request_id,
    )


def decode_read_segment(payload: bytes | memoryview) -> c.ReadSegment | None:
    """A ReadSegment with every field present, decoded without the layout walk;
    None for anything short (the request id omitted, a cut frame), which the
    walk then decodes or refuses with its own message. Strings are decoded in
    the walk's order, so a bad one raises the walk's error."""
    size = len(payload)
    if size < _U16.size:
        return None
    (name_size,) = _U16.unpack_from(payload)
    at = _U16.size + name_size
    if size < at + _READ_SEGMENT_FIELDS.size:
        return None
    segment = codec._decode_str(bytes(payload[_U16.size : at]))
    offset, suggested_length, token_size = _READ_SEGMENT_FIELDS.unpack_from(payload, at)
    at += _READ_SEGMENT_FIELDS.size
    end = at + token_size
    if size < end + _I64.size:
        return None
    token = codec._decode_str(bytes(payload[at:end]))
    (request_id,) = _I64.unpack_from(payload, end)
    return c.ReadSegment(segment, offset, suggested_length, token, request_id)
