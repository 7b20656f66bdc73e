"""Unsigned LEB128 varints, read and written in one place for every protocol that has them.

TANK (lengths and counts: at most 5 bytes, below 2**32) and RS-IO (every
integer: at most 10 bytes, below 2**64, shortest form only) write integers
7 bits per byte, least significant group first, the high bit of a byte
saying that another follows. The bytes are read and written here; the rules
each protocol adds (the value's range, the shortest form) and the errors it
raises for breaking them stay with the protocol's codec.
"""

from __future__ import annotations

from typing import Final

__all__ = ["TOO_LONG", "TRUNCATED", "decode_leb128", "encode_leb128"]

TRUNCATED: Final = -1
"""End position :func:`decode_leb128` gives when the data ends inside the varint."""

TOO_LONG: Final = -2
"""End position :func:`decode_leb128` gives when ``max_bytes`` bytes all say "more follows"."""


def decode_leb128(
    data: bytes | bytearray | memoryview, position: int, max_bytes: int
) -> tuple[int, int]:
    """The varint at ``data[position:]`` of at most ``max_bytes`` bytes.

    Returns:
        ``(value, position after the varint)``; or ``(0, TRUNCATED)`` if
        ``data`` ends first, ``(0, TOO_LONG)`` if it goes on past ``max_bytes``.
        A form longer than needed (last byte 0) is returned as read: whether
        that is allowed is the protocol's rule.
    """
    end = len(data)
    stop = position + max_bytes
    value = 0
    shift = 0
    while position < stop:
        if position >= end:
            return 0, TRUNCATED
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, position
        shift += 7
    return 0, TOO_LONG


def encode_leb128(value: int) -> bytes:
    """``value`` (>= 0, not checked: the caller knows its protocol's range) in its shortest form."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)  # low 7 bits, "more follows"
        value >>= 7
    out.append(value)
    return bytes(out)
