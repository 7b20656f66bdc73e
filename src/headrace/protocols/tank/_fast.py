"""TANK's fast bundle check, beside the reference decoder it must equal.

``validate_bundle`` accepts exactly the bundles ``bundle.decode_bundle`` accepts
(``tests/protocols/tank/test_validate.py`` checks it on arbitrary bundles), but
walks the messages with plain byte indexing and, for a message set laid out
alike, one strided comparison, so a broker can check what it stores verbatim
without building a message object per message.
"""

from __future__ import annotations

from headrace.errors import RemoteProtocolError
from headrace.protocols._varint import decode_leb128
from headrace.protocols.tank.bundle import MAX_MESSAGE_SET_BYTES, _decompress, decode_bundle_header
from headrace.protocols.tank.codec import MAX_VARINT_BYTES, MAX_VARINT_VALUE, decode_varint
from headrace.protocols.tank.commands import BundleCodec, BundleHeader, MessageFlags

__all__ = ["validate_bundle"]


def validate_bundle(
    bundle: bytes | bytearray | memoryview, *, max_unpacked_bytes: int = MAX_MESSAGE_SET_BYTES
) -> BundleHeader:
    """Check a whole bundle as :func:`decode_bundle` would, without building messages.

    A broker stores bundles verbatim, so it must refuse any it could not serve;
    this walks every message (decompressing first) with plain byte indexing,
    which is several times faster than decoding. It accepts exactly the
    bundles :func:`decode_bundle` with the same ``max_unpacked_bytes`` accepts.

    Raises:
        RemoteProtocolError: the bundle is truncated, malformed, has trailing
            bytes, does not decompress, or unpacks to more than
            ``max_unpacked_bytes``.
    """
    header = decode_bundle_header(bundle)
    data = bytes(memoryview(bundle)[header.size_bytes :])
    if header.codec == BundleCodec.SNAPPY:
        data = _decompress(data, max_unpacked_bytes)
    elif len(data) > max_unpacked_bytes:
        raise RemoteProtocolError(f"bundle: message set of {len(data)} bytes over the limit")
    if not header.sparse and _uniform_message_set(data, header.msg_count):
        return header
    end = len(data)
    count = header.msg_count
    middle_sparse = header.sparse and count > 2
    seq_num = header.first_seq_num or 0
    last = header.last_seq_num or 0
    # Plain ints: IntFlag arithmetic in this loop would cost more than the walk.
    have_key = int(MessageFlags.HAVE_KEY)
    last_ts = int(MessageFlags.USE_LAST_SPECIFIED_TS)
    prev_plus_one = int(MessageFlags.SEQ_NUM_PREV_PLUS_ONE)
    position = 0
    try:
        for index in range(count):
            msg_flags = data[position]
            position += 1
            if middle_sparse and 0 < index < count - 1:
                if msg_flags & prev_plus_one:
                    seq_num += 1
                else:
                    delta, used = decode_varint(data[position : position + MAX_VARINT_BYTES])
                    position += used
                    seq_num += 1 + delta
                if seq_num >= last:
                    raise RemoteProtocolError("bundle: sparse seq nums run past the last one")
            if not msg_flags & last_ts:
                position += 8
            if msg_flags & have_key:
                position += 1 + data[position]
            byte = data[position]
            if byte < 0x80:  # the common one-byte content length
                position += 1 + byte
            else:
                length, used = decode_varint(data[position : position + MAX_VARINT_BYTES])
                position += used + length
            if position > end:
                raise RemoteProtocolError("bundle: message runs past the end")
    except IndexError:
        raise RemoteProtocolError("bundle: truncated message") from None
    if position != end:
        raise RemoteProtocolError(f"bundle: {end - position} unexpected trailing bytes")
    return header


_HAVE_KEY = int(MessageFlags.HAVE_KEY)
_USE_LAST_TS = int(MessageFlags.USE_LAST_SPECIFIED_TS)


def _uniform_message_set(data: bytes, count: int) -> bool:
    """Whether ``data`` is ``count`` messages laid out alike, checked at C speed.

    A producer of fixed-size records (one schema, one key length) sends
    messages whose flags, key length and content-length bytes are all equal
    after the first (which alone carries the timestamp when the rest say
    "same as the last"), so every message after the first has the same size
    ``m``. Then each of those bytes, taken every ``m`` bytes (one strided
    slice, no Python loop), must repeat one value, and the messages parse
    exactly as the walk in ``validate_bundle`` would parse them. False (not
    an error) sends any other message set, valid or not, to the walk.
    Non-sparse bundles only: sparse ones carry per-message seq-num deltas.
    """
    first = _message_layout(data, 0)
    if first is None or count < 3:
        return False
    base = first[0]
    rest = _message_layout(data, base)
    if rest is None:
        return False
    size, layout = rest
    if base + size * (count - 1) != len(data):
        return False
    return all(data[base + at :: size] == bytes((data[base + at],)) * (count - 1) for at in layout)


def _message_layout(data: bytes, start: int) -> tuple[int, list[int]] | None:
    """The size of the message at ``start`` and the positions (relative to it) of
    its layout bytes: flags, key length, content-length varint. None if it does
    not parse (the walk then says why)."""
    end = len(data)
    if start >= end:
        return None
    flags = data[start]
    layout = [0]
    position = start + 1
    if not flags & _USE_LAST_TS:
        position += 8
    if flags & _HAVE_KEY:
        if position >= end:
            return None
        layout.append(position - start)
        position += 1 + data[position]
    length, varint_end = decode_leb128(data, position, MAX_VARINT_BYTES)
    if varint_end < 0 or length > MAX_VARINT_VALUE:
        return None
    layout.extend(range(position - start, varint_end - start))
    return varint_end + length - start, layout
