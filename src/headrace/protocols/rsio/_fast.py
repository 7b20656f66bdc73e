"""The RS-IO fast paths, each equal to the general code beside it in ``codec.py``.

A subscription delivering many small elements spends its time on framing, so
the common frames skip the general code: a run of ``onNext`` frames is
encoded in one pass, and received frames with a one- or two-byte length
prefix, and plain ``onNext`` bodies, are read straight from the bytes. Each
function here gives what the general code gives for the frames it takes and
steps aside (returns None, or stops) for anything else, so the general code's
checks and errors stay the only ones; the property tests hold each to that
(``tests/protocols/rsio/test_send_elements.py``,
``test_receive_fast_path.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from headrace.errors import LocalProtocolError
from headrace.protocols.rsio.codec import _check_fixed, encode_varint
from headrace.protocols.rsio.commands import MessageType

__all__ = ["encode_on_next_frames", "on_next_body", "take_small_frames"]

_ON_NEXT_CODE = int(MessageType.ON_NEXT)
"""``onNext``'s type code: one varint byte, the first of its frames' bodies."""

_SMALL_VARINTS = tuple(bytes([value]) for value in range(0x80))
"""The one-byte varints (0 … 127), so a run of small elements looks its lengths up."""


def encode_on_next_frames(
    subscriber: int, elements: Sequence[bytes], element_size: int, max_frame_bytes: int
) -> bytearray:
    """One framed ``onNext`` per element, in order: the bytes ``encode_frame``
    gives for each ``OnNext(subscriber, element)``, built in one pass.

    A publisher sending a run of elements pays for the message type and the
    subscriber Id once, and for each element only its two length prefixes,
    instead of a message object and a generic encoding each.

    Raises:
        LocalProtocolError: as ``encode_message`` (a fixed-size element of the
            wrong size, an Id out of range), or a frame over
            ``max_frame_bytes``. Nothing is returned then.
    """
    head = encode_varint(MessageType.ON_NEXT) + encode_varint(subscriber)
    head_size = len(head)
    small = _SMALL_VARINTS
    out = bytearray()
    for element in elements:
        size = len(element)
        if element_size:
            _check_fixed(element, element_size, "onNext element")
            length = b""
        else:
            length = small[size] if size < 0x80 else encode_varint(size)
        body_size = head_size + len(length) + size
        if body_size > max_frame_bytes:
            raise LocalProtocolError(
                f"ON_NEXT frame of {body_size} bytes exceeds max_send_frame_bytes "
                f"{max_frame_bytes}; split the element (onNextPart)"
            )
        out += small[body_size] if body_size < 0x80 else encode_varint(body_size)
        out += head
        out += length
        out += element
    return out


def take_small_frames(
    view: memoryview, position: int, max_frame_bytes: int, receive: Callable[[bytes], None]
) -> int:
    """Hand ``receive`` the body of each whole frame at ``view[position:]`` whose
    length prefix takes one or two bytes; return where it stopped.

    Such frames (a body under 16 KiB: every ``onNext`` of a small element)
    skip the receive buffer's copy and ``read_frame``'s prefix parsing. It
    stops at a frame that has not fully arrived, a longer prefix, or any
    prefix ``read_frame`` would refuse (0, overlong, over the limit), which
    the buffer path then takes or words: each body it hands over is one
    ``read_frame`` would have returned.
    """
    end = len(view)
    while end - position >= 2:
        first = view[position]
        if first < 0x80:
            length = first
            start = position + 1
        else:
            second = view[position + 1]
            if second >= 0x80 or second == 0:  # three bytes or more, or overlong
                break
            length = (first & 0x7F) | (second << 7)
            start = position + 2
        stop = start + length
        if length == 0 or length > max_frame_bytes or stop > end:
            break
        position = stop
        receive(bytes(view[start:stop]))
    return position


def on_next_body(body: bytes) -> tuple[int, bytes] | None:
    """``(subscriber, element)`` of an ``onNext`` body whose Id and element
    length take one byte each and which holds exactly that element; None for
    any other body. The same message ``decode_message`` gives such a body on a
    variable-size subscription."""
    if (
        body[0] == _ON_NEXT_CODE
        and len(body) >= 3
        and body[1] < 0x80
        and body[2] < 0x80
        and len(body) - 3 == body[2]
    ):
        return body[1], body[3:]
    return None
