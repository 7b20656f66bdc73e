"""Pure encode/decode of TANK bundles, their messages and consume chunks.

Byte layouts (all integers little-endian, no padding; anchors of
``docs/protocols/tank.md`` in brackets; ``tank.md#...`` below names them too)::

    bundle    flags:u8  [msg_count:varint]  [first:u64  [last-first-1:varint]]
              message set (raw Snappy block when codec = 1)     [#bundles]
    message   flags:u8  [delta:varint]  [ts:u64]  [key:str8]  len:varint  content
    chunk     repeated  varint(bundle_length)  bundle           [#chunks]

Bundles are apart from the request/response codec (``codec.py``, whose
primitives this module reads and writes with) because the store keeps them
verbatim: frames carry them as opaque bytes, a broker reads only
:func:`decode_bundle_header` (and checks whole bundles with
``_fast.validate_bundle``, equal to :func:`decode_bundle`), and
:func:`decode_bundle` and :func:`decode_chunk` unpack the messages for readers
and clients. Errors follow ``codec.py``: ``decode_*`` raises
:class:`RemoteProtocolError` for anything malformed, ``encode_*``
:class:`LocalProtocolError` for a value the wire cannot carry.
"""

from __future__ import annotations

from collections.abc import Sequence

import cramjam

from headrace.errors import LocalProtocolError, RemoteProtocolError
from headrace.protocols.tank.codec import (
    _U64_MAX,
    _check,
    _Reader,
    _Truncated,
    _Writer,
    decode_varint,
    encode_varint,
)
from headrace.protocols.tank.commands import (
    SEQ_NUM_TAIL,
    BundleCodec,
    BundleHeader,
    BundleMessage,
    DecodedChunk,
    MessageFlags,
)

__all__ = [
    "BUNDLE_FLAG_RESERVED",
    "BUNDLE_FLAG_SPARSE",
    "COMPRESS_ABOVE_BYTES",
    "COMPRESS_ABOVE_MESSAGES",
    "MAX_BUNDLE_MESSAGES",
    "MAX_MESSAGE_SET_BYTES",
    "MAX_STORED_UNPACKED_BYTES",
    "decode_bundle",
    "decode_bundle_header",
    "decode_chunk",
    "encode_bundle",
    "encode_chunk_entry",
]

# --------------------------------------------------------------------------- limits

MAX_BUNDLE_MESSAGES = 65535
"""TANK records a bundle's message count as a u16 and corrupts its high-water mark
beyond it (tank.md#produce-semantics); it also bounds how far one bundle can move seq nums."""

MAX_MESSAGE_SET_BYTES = 256 * 1024 * 1024
"""Largest decompressed message set: no more than a frame could carry uncompressed,
so a small Snappy block cannot make us allocate without bound (tank.md#compression)."""

MAX_STORED_UNPACKED_BYTES = 16 * 1024 * 1024
"""Largest message set a bundle kept in a store may unpack to: what one append
(``store.api.MAX_APPEND_BYTES``) holds uncompressed. A broker refuses a bundle that
unpacks to more, and a reader skips one, so that unpacking a stored bundle costs
a reader no more memory than reading the largest plain event (a raw Snappy block
of 16 MiB could otherwise unpack to over 300 MiB)."""

COMPRESS_ABOVE_MESSAGES = 512
"""C++ producer policy (tank.md#compression): compress bundles with more messages than this..."""

COMPRESS_ABOVE_BYTES = 1024
"""...or whose keys and contents add up to more bytes than this."""

BUNDLE_FLAG_CODEC_MASK = 0x03  # bits 0-1 (tank.md#bundles)
BUNDLE_FLAG_COUNT_SHIFT = 2  # bits 2-5: message count 1..15, 0 = varint follows
BUNDLE_FLAG_COUNT_MASK = 0x0F
BUNDLE_FLAG_SPARSE = 0x40  # bit 6: explicit seq nums (tank.md#bundle-seq-nums)
BUNDLE_FLAG_RESERVED = 0x80  # bit 7: described upstream, never read or written; we reject it
MAX_INLINE_COUNT = 15  # the largest count bits 2-5 can hold


# --------------------------------------------------------------------------- bundles


def encode_bundle(
    messages: Sequence[BundleMessage],
    *,
    compress: bool | None = None,
    sparse: bool = False,
) -> bytes:
    """Encode messages as one bundle (tank.md#bundles), the way the C++ producer does.

    A message gets an explicit timestamp when it is the first or its timestamp
    differs from the previous one; otherwise ``UseLastSpecifiedTS``.

    Args:
        messages: 1..65535 messages. ``seq_num`` is read only when ``sparse``.
        compress: True for Snappy, False for none, None for the C++ producer's
            policy (more than 512 messages or more than 1024 key+content bytes).
        sparse: write the messages' own seq nums (strictly increasing, >= 1),
            for ProduceWithSeqnum tooling (tank.md#bundle-seq-nums).

    Raises:
        LocalProtocolError: no messages, too many, a key over 255 bytes, a
            field out of range, or sparse seq nums that do not increase.
    """
    count = len(messages)
    _check(count, MAX_BUNDLE_MESSAGES, "bundle message count", minimum=1)
    if compress is None:
        payload_bytes = sum(len(m.key) + len(m.content) for m in messages)
        compress = count > COMPRESS_ABOVE_MESSAGES or payload_bytes > COMPRESS_ABOVE_BYTES
    codec = BundleCodec.SNAPPY if compress else BundleCodec.NONE

    header = _Writer()
    flags = int(codec)
    if count <= MAX_INLINE_COUNT:
        flags |= count << BUNDLE_FLAG_COUNT_SHIFT
    if sparse:
        flags |= BUNDLE_FLAG_SPARSE
    header.u8(flags, "bundle flags")
    if count > MAX_INLINE_COUNT:
        header.varint(count, "msg_count")
    if sparse:
        first, last = messages[0].seq_num, messages[-1].seq_num
        _check(first, _U64_MAX, "first seq_num", minimum=1)
        header.u64(first, "first seq_num")
        if count != 1:
            header.varint(last - first - 1, "last - first - 1")

    body = _Writer()
    previous_ts: int | None = None
    previous_seq_num = 0
    for index, message in enumerate(messages):
        msg_flags = 0
        if message.key:
            msg_flags |= MessageFlags.HAVE_KEY
        if message.timestamp_ms == previous_ts:
            msg_flags |= MessageFlags.USE_LAST_SPECIFIED_TS
        middle = sparse and 0 < index < count - 1
        if sparse and index:
            if message.seq_num <= previous_seq_num:
                raise LocalProtocolError("sparse seq nums must strictly increase")
            if middle and message.seq_num == previous_seq_num + 1:
                msg_flags |= MessageFlags.SEQ_NUM_PREV_PLUS_ONE
        body.u8(msg_flags, "message flags")
        if middle and not msg_flags & MessageFlags.SEQ_NUM_PREV_PLUS_ONE:
            body.varint(message.seq_num - previous_seq_num - 1, "seq_num delta")
        if not msg_flags & MessageFlags.USE_LAST_SPECIFIED_TS:
            body.u64(message.timestamp_ms, "timestamp_ms")
        if message.key:
            body.str8(message.key, "key")
        body.varint(len(message.content), "content length")
        body.raw(message.content)
        previous_ts = message.timestamp_ms
        previous_seq_num = message.seq_num
    message_set = body.getvalue()
    if codec == BundleCodec.SNAPPY:
        _check(len(message_set), MAX_MESSAGE_SET_BYTES, "message set size")
        message_set = bytes(cramjam.snappy.compress_raw(message_set))
    return header.getvalue() + message_set


def encode_chunk_entry(bundle: bytes | bytearray | memoryview) -> bytes:
    """``varint(bundle_length) + bundle``: how a bundle sits in a segment and a chunk (6.4)."""
    return encode_varint(len(bundle)) + bytes(bundle)


def decode_bundle_header(bundle: bytes | bytearray | memoryview) -> BundleHeader:
    """Read what a broker needs from a bundle: codec, count, sparse range (tank.md#bundles).

    Raises:
        RemoteProtocolError: truncated header, undefined codec, reserved bit
            set, a message count of 0 or above 65535, or a sparse range that
            overflows 64 bits.
    """
    return _read_bundle_header(_Reader(bundle, "bundle header"))


def _read_bundle_header(reader: _Reader) -> BundleHeader:
    start = reader.position
    flags = reader.u8()
    codec_bits = flags & BUNDLE_FLAG_CODEC_MASK
    if codec_bits not in (BundleCodec.NONE, BundleCodec.SNAPPY):
        raise RemoteProtocolError(f"bundle: undefined codec {codec_bits}")
    if flags & BUNDLE_FLAG_RESERVED:
        raise RemoteProtocolError("bundle: reserved flag bit 7 is set")
    count = (flags >> BUNDLE_FLAG_COUNT_SHIFT) & BUNDLE_FLAG_COUNT_MASK
    if not count:
        count = reader.varint()
        if not 1 <= count <= MAX_BUNDLE_MESSAGES:
            raise RemoteProtocolError(f"bundle: message count {count} outside 1..65535")
    first: int | None = None
    last: int | None = None
    if flags & BUNDLE_FLAG_SPARSE:
        first = reader.u64()
        last = first if count == 1 else first + reader.varint() + 1
        if last > _U64_MAX:
            raise RemoteProtocolError("bundle: sparse last seq num overflows 64 bits")
    return BundleHeader(BundleCodec(codec_bits), count, first, last, reader.position - start)


def decode_bundle(
    bundle: bytes | bytearray | memoryview,
    first_seq_num: int | None,
    *,
    max_unpacked_bytes: int = MAX_MESSAGE_SET_BYTES,
) -> tuple[BundleMessage, ...]:
    """Unpack a complete bundle into its messages, with seq nums (tank.md#bundle-messages).

    Args:
        bundle: exactly one bundle, without its length varint.
        first_seq_num: the seq num of the first message of a non-sparse
            bundle (assigned outside the bundle); ignored for a sparse bundle,
            whose header carries it. None is allowed only for sparse bundles.
        max_unpacked_bytes: refuse a message set larger than this (checked
            before anything is decompressed).

    Raises:
        RemoteProtocolError: the bundle is truncated, malformed, has trailing
            bytes, does not decompress, or unpacks to more than
            ``max_unpacked_bytes``.
        LocalProtocolError: ``first_seq_num`` is None for a non-sparse bundle.
    """
    reader = _Reader(bundle, "bundle")
    header = _read_bundle_header(reader)
    first = _bundle_first(header, first_seq_num)
    messages = _decode_message_set(
        reader, header, first, partial=False, max_unpacked_bytes=max_unpacked_bytes
    )
    return tuple(messages)


def _bundle_first(header: BundleHeader, first_seq_num: int | None) -> int:
    if header.first_seq_num is not None:
        return header.first_seq_num
    if first_seq_num is None:
        raise LocalProtocolError("a non-sparse bundle needs its first seq num")
    return first_seq_num


def _decompress(data: bytes, max_unpacked_bytes: int = MAX_MESSAGE_SET_BYTES) -> bytes:
    """The message set of a raw Snappy block. The block starts with its uncompressed
    length, which is checked against ``max_unpacked_bytes`` before anything is
    decompressed; raw Snappy output is exactly that long (a block that would give
    more or less does not decompress), so the output is bounded by the check."""
    size, _ = decode_varint(data)  # raw Snappy starts with the uncompressed length (9.4)
    if size > min(max_unpacked_bytes, MAX_MESSAGE_SET_BYTES):
        raise RemoteProtocolError(f"bundle: message set of {size} bytes over the limit")
    try:
        return bytes(cramjam.snappy.decompress_raw(data))
    except cramjam.DecompressionError as exc:
        raise RemoteProtocolError(f"bundle: Snappy block does not decompress: {exc}") from None


def _decode_message_set(
    reader: _Reader,
    header: BundleHeader,
    first: int,
    *,
    partial: bool,
    max_unpacked_bytes: int = MAX_MESSAGE_SET_BYTES,
) -> list[BundleMessage]:
    """Decode ``header.msg_count`` messages after the header.

    ``partial`` (an uncompressed bundle cut short by the end of a chunk) stops
    quietly at the first incomplete message instead of raising.
    """
    if header.codec == BundleCodec.SNAPPY:
        reader = _Reader(_decompress(reader.take_rest(), max_unpacked_bytes), "message set")
    elif reader.remaining > max_unpacked_bytes:
        raise RemoteProtocolError(f"bundle: message set of {reader.remaining} bytes over the limit")
    sparse = header.sparse
    last = header.last_seq_num
    count = header.msg_count
    messages: list[BundleMessage] = []
    timestamp = 0  # reset per bundle, as the C++ decoder does (9.2)
    seq_num = first - 1
    for index in range(count):
        try:
            msg_flags = reader.u8()
            if not sparse or index == 0:
                seq_num = first if index == 0 else seq_num + 1
            elif index == count - 1:
                assert last is not None
                seq_num = last
            elif msg_flags & MessageFlags.SEQ_NUM_PREV_PLUS_ONE:
                seq_num += 1
            else:
                seq_num += 1 + reader.varint()
            if sparse and 0 < index < count - 1 and last is not None and seq_num >= last:
                raise RemoteProtocolError("bundle: sparse seq nums run past the last one")
            if not msg_flags & MessageFlags.USE_LAST_SPECIFIED_TS:
                timestamp = reader.u64()
            key = reader.str8() if msg_flags & MessageFlags.HAVE_KEY else b""
            content = reader.take(reader.varint())
        except _Truncated:
            if partial:
                return messages
            raise
        messages.append(BundleMessage(content, timestamp, key, seq_num))
    if not partial:
        reader.expect_end()
    return messages


def decode_chunk(
    chunk: bytes | bytearray | memoryview,
    base_seq_num: int | None,
    *,
    min_seq_num: int = 0,
    high_water_mark: int = SEQ_NUM_TAIL,
) -> DecodedChunk:
    """Unpack a consume chunk into messages, the way the C++ client does (tank.md#chunks).

    Bundles wholly below ``min_seq_num`` are skipped without decoding; messages
    outside ``min_seq_num..high_water_mark`` are dropped, and decoding stops at
    the first message above the high-water mark. A chunk cut inside its last
    bundle (older brokers clip at ``fetch_size``) is not an error: the complete
    messages of an uncompressed cut bundle are kept, a compressed one is
    dropped, and :attr:`DecodedChunk.truncated_entry_bytes` says so.

    Args:
        chunk: the partition's chunk from a consume response.
        base_seq_num: the header's base seq num; None when ``errorOrFlags``
            was ``SPARSE_BUNDLE`` (the first bundle must then be sparse).
        min_seq_num: the requested seq num; :data:`SEQ_NUM_TAIL` keeps all.
        high_water_mark: the header's high-water mark.

    Raises:
        RemoteProtocolError: a complete bundle is malformed, or the first
            bundle is not sparse although ``base_seq_num`` is None.
    """
    reader = _Reader(chunk, "chunk")
    keep_from = 0 if min_seq_num == SEQ_NUM_TAIL else min_seq_num
    next_seq_num = base_seq_num
    walked: int | None = None
    messages: list[BundleMessage] = []
    while reader.remaining:
        entry_start = reader.position
        try:
            bundle_length = reader.varint()
        except _Truncated:
            return DecodedChunk(tuple(messages), walked, -1)
        entry_bytes = reader.position - entry_start + bundle_length
        cut = bundle_length > reader.remaining
        bundle = _Reader(reader.take(min(bundle_length, reader.remaining)), "bundle")
        try:
            header = _read_bundle_header(bundle)
        except _Truncated:
            if cut:
                return DecodedChunk(tuple(messages), walked, entry_bytes)
            raise
        if header.first_seq_num is None and next_seq_num is None:
            raise RemoteProtocolError("chunk: no base seq num and the first bundle is not sparse")
        first = _bundle_first(header, next_seq_num)
        last = header.last_seq_num if header.sparse else first + header.msg_count - 1
        assert last is not None
        if cut and header.codec != BundleCodec.NONE:
            return DecodedChunk(tuple(messages), walked, entry_bytes)
        if keep_from > last and not cut:
            next_seq_num = walked = last + 1  # fast skip (6.7 step 3)
            continue
        for message in _decode_message_set(bundle, header, first, partial=cut):
            if message.seq_num > high_water_mark:
                return DecodedChunk(tuple(messages), walked, None)
            walked = message.seq_num + 1
            if message.seq_num >= keep_from:
                messages.append(message)
        if cut:
            return DecodedChunk(tuple(messages), walked, entry_bytes)
        next_seq_num = walked = last + 1
    return DecodedChunk(tuple(messages), walked, None)
