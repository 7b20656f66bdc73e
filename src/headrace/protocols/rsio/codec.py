"""rsio-v0 codec: messages to bytes and back, pure functions, no state.

Wire format (``docs/protocols/rsio.md``; ``rsio.md#...`` below names its anchors)::

    frame   = frame_length:varint  message            (byte-stream transports, rsio.md#framing)
    message = type:varint  field*                     (layout fixed by the type, rsio.md#messages)

    varint  = unsigned LEB128, 7 bits per byte, low group first, high bit = more;
              shortest form only, at most 10 bytes, value < 2^64     (rsio.md#primitive-encodings)
    String  = length:varint  UTF-8 bytes
    bytes   = length:varint  raw bytes
    Id      = varint (0 … 2^64-1, every value valid)
    fixed   = exactly elementSize raw bytes, no prefix (fixed-size subscriptions)

A message must use exactly the bytes of its frame. ``onNext`` and
``onNextPacked`` have two layouts that depend on the subscription's
``elementSize``; the decoder therefore takes ``element_size`` as an argument,
and :func:`peek_subscriber` lets a connection find the subscription (or drop
the frame) before decoding the rest.

Errors: bytes from the peer that break any rule raise ``RemoteProtocolError``
(``FrameTooLarge`` for an oversized frame) and nothing else; a message of ours
that cannot be encoded (a negative Id, an element of the wrong fixed size, a
string that is not valid Unicode) raises ``LocalProtocolError``.
"""

from __future__ import annotations

from collections.abc import Callable

from headrace.errors import FrameTooLarge, LocalProtocolError, RemoteProtocolError
from headrace.protocols._buffer import ReceiveBuffer
from headrace.protocols._varint import TRUNCATED, decode_leb128, encode_leb128
from headrace.protocols.rsio.commands import (
    PUBLISHER_SIDE_TYPES,
    SUBSCRIBER_SIDE_TYPES,
    Cancel,
    ClientHello,
    Goodbye,
    Message,
    MessageType,
    OnComplete,
    OnError,
    OnNext,
    OnNextLastPart,
    OnNextPacked,
    OnNextPart,
    Request,
    ServerHello,
    Subscribe,
    Subscribed,
)

__all__ = [
    "DEFAULT_MAX_ELEMENT_BYTES",
    "DEFAULT_MAX_FRAME_BYTES",
    "GOODBYE_TIMEOUT_S",
    "MAX_DEMAND",
    "MAX_HELLO_EXTENSIONS",
    "MAX_ID",
    "MAX_VARINT",
    "MAX_VARINT_BYTES",
    "MIN_MAX_FRAME_BYTES",
    "PROTOCOL_VERSION",
    "SPLIT_THRESHOLD_BYTES",
    "decode_message",
    "decode_varint",
    "encode_frame",
    "encode_message",
    "encode_varint",
    "peek_message_type",
    "peek_subscriber",
    "read_frame",
    "split_element",
]

# --------------------------------------------------------------------------- limits

PROTOCOL_VERSION = 0
"""The only version of the draft (rsio.md#hello); a hello with another one gets ``goodbye``."""

MAX_VARINT = 2**64 - 1
"""Largest varint value (rsio.md#primitive-encodings): Ids are 64-bit."""

MAX_VARINT_BYTES = 10
"""ceil(64 / 7): a longer varint is a protocol error even if its value would fit
(rsio.md#primitive-encodings)."""

MAX_ID = MAX_VARINT
"""Subscriber and element Ids use the whole varint range, 0 included
(rsio.md#primitive-encodings)."""

MAX_DEMAND = 2**63 - 1
"""Java's ``Long.MAX_VALUE``: the largest legal demand, and the cap meaning "unbounded".

Reactive Streams §3.17; rsio.md#rule-demand. A ``request`` above it, or of 0, is
answered with ``onError(id, "illegal demand")``.
"""

MIN_MAX_FRAME_BYTES = 1 << 20
"""1 MiB: every receiver must accept frames this large (rsio.md#limits), so no limit may be lower.

It is also the default largest frame we *send*: the only size every peer is
guaranteed to take.
"""

DEFAULT_MAX_FRAME_BYTES = 16_777_215
"""The default receive limit (rsio.md#limits): 2^24 - 1, RSocket's largest TCP frame."""

SPLIT_THRESHOLD_BYTES = 64 * 1024
"""Publishers should split larger elements (rsio.md#limits).

Small frames keep one large element from delaying every other subscription
on the connection.
"""

DEFAULT_MAX_ELEMENT_BYTES = 64 << 20
"""Default cap on a reassembled split element (rsio.md#limits): 64 MiB held per subscription at
most."""

MAX_HELLO_EXTENSIONS = 1024
"""Most extension Ids accepted in a hello.

No extension defines message types (rsio.md#extensions); the limit only stops a 16 MiB hello from
becoming millions of Python ints. 1024 leaves room for any plausible future.
"""

GOODBYE_TIMEOUT_S = 5.0
"""How long the I/O layer waits for the reply to our ``goodbye`` before closing
(rsio.md#goodbye)."""


def _remote(message: str) -> RemoteProtocolError:
    """A protocol error caused by the peer; the reply is ``goodbye(<description>)``
    (rsio.md#goodbye)."""
    return RemoteProtocolError(message, reply_hint=Goodbye(message))


# --------------------------------------------------------------------------- primitives


def encode_varint(value: int) -> bytes:
    """Unsigned LEB128 in its shortest form.

    Raises:
        LocalProtocolError: ``value`` is negative or at least 2^64.
    """
    if not 0 <= value <= MAX_VARINT:
        raise LocalProtocolError(f"varint out of range 0 … 2^64-1: {value}")
    return encode_leb128(value)


def decode_varint(data: bytes, position: int) -> tuple[int, int]:
    """Decode the varint at ``data[position:]``.

    Returns:
        ``(value, position after the varint)``.

    Raises:
        RemoteProtocolError: the varint runs past the end of ``data``, is
            longer than 10 bytes, is not in shortest form, or is ≥ 2^64.
    """
    if position < len(data) and data[position] < 0x80:
        return data[position], position + 1  # fast path: one byte, the common case
    value, end = _varint(data, position)
    if end == TRUNCATED:
        raise _remote("truncated varint")
    return value, end


def _varint(data: bytes | bytearray | memoryview, position: int) -> tuple[int, int]:
    """:func:`decode_varint` but for a varint that ``data`` ends inside: ``(0, TRUNCATED)``.

    Raises:
        RemoteProtocolError: longer than 10 bytes, not in shortest form, or ≥ 2^64.
    """
    value, end = decode_leb128(data, position, MAX_VARINT_BYTES)
    if end == TRUNCATED:
        return value, end
    if end < 0:
        raise _remote("varint longer than 10 bytes")
    if end - position > 1 and data[end - 1] == 0:
        raise _remote("overlong varint")  # e.g. 80 00: a shorter form exists
    if value > MAX_VARINT:
        raise _remote("varint value >= 2^64")
    return value, end


def _read_bytes(data: bytes, position: int) -> tuple[bytes, int]:
    length, position = decode_varint(data, position)
    end = position + length
    if end > len(data):
        raise _remote(f"byte string of {length} bytes runs past the end of the message")
    return data[position:end], end


def _read_string(data: bytes, position: int) -> tuple[str, int]:
    raw, position = _read_bytes(data, position)
    try:
        return raw.decode("utf-8"), position
    except UnicodeDecodeError:
        raise _remote("string is not valid UTF-8") from None


def _read_fixed(data: bytes, position: int, size: int) -> tuple[bytes, int]:
    end = position + size
    if end > len(data):
        raise _remote(f"fixed-size element of {size} bytes runs past the end of the message")
    return data[position:end], end


def _write_bytes(value: bytes) -> bytes:
    return encode_varint(len(value)) + value


def _write_string(value: str) -> bytes:
    try:
        raw = value.encode("utf-8")
    except UnicodeEncodeError:
        raise LocalProtocolError(f"string is not valid Unicode: {value!r}") from None
    return _write_bytes(raw)


# --------------------------------------------------------------------------- decoding


def peek_message_type(body: bytes) -> MessageType:
    """The type of a message (a frame's body) without decoding its fields.

    Raises:
        RemoteProtocolError: malformed varint, or a reserved/unknown type code.
    """
    code, _ = decode_varint(body, 0)
    try:
        return MessageType(code)
    except ValueError:
        raise _remote(f"unknown message type {code}") from None


def peek_subscriber(body: bytes) -> int:
    """The ``subscriber`` Id of a request, cancel or publisher-side message.

    Those messages start with the Id (rsio.md#messages), so it can be read before the
    subscription's ``elementSize`` is known, or when the message is to be
    dropped anyway (rules 3, 6, 7, rsio.md#connection-rules).

    Raises:
        RemoteProtocolError: malformed type or Id, or a message type that does
            not start with a subscriber Id.
    """
    message_type = peek_message_type(body)
    if message_type not in PUBLISHER_SIDE_TYPES and message_type not in SUBSCRIBER_SIDE_TYPES:
        raise _remote(f"{message_type.name} carries no subscriber id")
    if message_type is MessageType.SUBSCRIBE:
        raise _remote("SUBSCRIBE does not start with its subscriber id")
    _, position = decode_varint(body, 0)
    subscriber, _ = decode_varint(body, position)
    return subscriber


def _decode_hello(body: bytes, position: int) -> tuple[int, tuple[int, ...], int]:
    version, position = decode_varint(body, position)
    count, position = decode_varint(body, position)
    if count > MAX_HELLO_EXTENSIONS:
        raise _remote(f"hello lists {count} extensions, limit {MAX_HELLO_EXTENSIONS}")
    extensions = []
    for _ in range(count):
        extension, position = decode_varint(body, position)
        extensions.append(extension)
    return version, tuple(extensions), position


_Decoder = Callable[[bytes, int, int], tuple[Message, int]]


def _decode_client_hello(body: bytes, position: int, _element_size: int) -> tuple[Message, int]:
    version, extensions, position = _decode_hello(body, position)
    return ClientHello(version, extensions), position


def _decode_server_hello(body: bytes, position: int, _element_size: int) -> tuple[Message, int]:
    version, extensions, position = _decode_hello(body, position)
    return ServerHello(version, extensions), position


def _decode_goodbye(body: bytes, position: int, _element_size: int) -> tuple[Message, int]:
    reason, position = _read_string(body, position)
    return Goodbye(reason), position


def _decode_subscribe(body: bytes, position: int, _element_size: int) -> tuple[Message, int]:
    publisher, position = _read_string(body, position)
    subscriber, position = decode_varint(body, position)
    initial_demand, position = decode_varint(body, position)
    return Subscribe(publisher, subscriber, initial_demand), position


def _decode_request(body: bytes, position: int, _element_size: int) -> tuple[Message, int]:
    subscriber, position = decode_varint(body, position)
    demand, position = decode_varint(body, position)
    return Request(subscriber, demand), position


def _decode_cancel(body: bytes, position: int, _element_size: int) -> tuple[Message, int]:
    subscriber, position = decode_varint(body, position)
    return Cancel(subscriber), position


def _decode_subscribed(body: bytes, position: int, _element_size: int) -> tuple[Message, int]:
    subscriber, position = decode_varint(body, position)
    element_size, position = decode_varint(body, position)
    return Subscribed(subscriber, element_size), position


def _decode_on_next(body: bytes, position: int, element_size: int) -> tuple[Message, int]:
    subscriber, position = decode_varint(body, position)
    if element_size == 0:
        element, position = _read_bytes(body, position)
    else:
        element, position = _read_fixed(body, position, element_size)
    return OnNext(subscriber, element), position


def _decode_on_next_packed(body: bytes, position: int, element_size: int) -> tuple[Message, int]:
    if element_size == 0:
        raise _remote("onNextPacked on a subscription with variable-size elements")
    subscriber, position = decode_varint(body, position)
    count, position = decode_varint(body, position)
    if count == 0:
        raise _remote("onNextPacked with count 0")
    # Checked before multiplying out a huge count: each element is >= 1 byte.
    if count > len(body) - position or count * element_size != len(body) - position:
        raise _remote(f"onNextPacked tail is not {count} x {element_size} bytes")
    return OnNextPacked(subscriber, count, body[position:]), len(body)


def _decode_on_next_part(body: bytes, position: int, _element_size: int) -> tuple[Message, int]:
    subscriber, position = decode_varint(body, position)
    element, position = decode_varint(body, position)
    data, position = _read_bytes(body, position)
    return OnNextPart(subscriber, element, data), position


def _decode_on_next_last_part(
    body: bytes, position: int, _element_size: int
) -> tuple[Message, int]:
    subscriber, position = decode_varint(body, position)
    element, position = decode_varint(body, position)
    data, position = _read_bytes(body, position)
    return OnNextLastPart(subscriber, element, data), position


def _decode_on_complete(body: bytes, position: int, _element_size: int) -> tuple[Message, int]:
    subscriber, position = decode_varint(body, position)
    return OnComplete(subscriber), position


def _decode_on_error(body: bytes, position: int, _element_size: int) -> tuple[Message, int]:
    subscriber, position = decode_varint(body, position)
    error, position = _read_string(body, position)
    return OnError(subscriber, error), position


_DECODERS: dict[MessageType, _Decoder] = {
    MessageType.CLIENT_HELLO: _decode_client_hello,
    MessageType.SERVER_HELLO: _decode_server_hello,
    MessageType.GOODBYE: _decode_goodbye,
    MessageType.SUBSCRIBE: _decode_subscribe,
    MessageType.REQUEST: _decode_request,
    MessageType.CANCEL: _decode_cancel,
    MessageType.SUBSCRIBED: _decode_subscribed,
    MessageType.ON_NEXT: _decode_on_next,
    MessageType.ON_NEXT_PACKED: _decode_on_next_packed,
    MessageType.ON_NEXT_PART: _decode_on_next_part,
    MessageType.ON_NEXT_LAST_PART: _decode_on_next_last_part,
    MessageType.ON_COMPLETE: _decode_on_complete,
    MessageType.ON_ERROR: _decode_on_error,
}


def decode_message(body: bytes, element_size: int = 0) -> Message:
    """Decode one message: a whole frame body, type code first.

    Args:
        body: exactly the bytes of one frame (or one transport message, rsio.md#framing).
        element_size: the subscription's ``elementSize``; decides the layout
            of ``onNext`` (fixed or length-prefixed) and ``onNextPacked``.
            Ignored by every other message.

    Raises:
        RemoteProtocolError: a layout rule broken (rsio.md#messages), including bytes left
            over or missing at the end.
    """
    message_type = peek_message_type(body)
    _, position = decode_varint(body, 0)
    message, position = _DECODERS[message_type](body, position, element_size)
    if position != len(body):
        raise _remote(f"{len(body) - position} bytes left over after {message_type.name}")
    return message


def read_frame(buffer: ReceiveBuffer, max_frame_bytes: int) -> bytes | None:
    """Take one length-prefixed frame from ``buffer`` and return its body (rsio.md#framing).

    Returns:
        The body, or None if the frame is not complete yet (the buffer is
        rolled back and keeps every byte).

    Raises:
        FrameTooLarge: the length prefix announces more than
            ``max_frame_bytes``; raised as soon as the prefix is complete, before
            any of the body is buffered.
        RemoteProtocolError: a malformed length prefix, or a length of 0.
    """
    prefix = buffer.peek(min(len(buffer), MAX_VARINT_BYTES))
    assert prefix is not None
    length, prefix_size = _varint(prefix, 0)
    if prefix_size == TRUNCATED:
        buffer.rollback()
        return None
    if length == 0:
        raise _remote("frame length 0")
    if length > max_frame_bytes:
        raise FrameTooLarge(max_frame_bytes, length, reply_hint=Goodbye("frame too large"))
    buffer.consume_exactly(prefix_size)
    body = buffer.consume_exactly(length)
    if body is None:
        buffer.rollback()
        return None
    buffer.commit()
    return body


# --------------------------------------------------------------------------- encoding


def _check_fixed(element: bytes, element_size: int, what: str) -> None:
    if len(element) != element_size:
        raise LocalProtocolError(
            f"{what} of {len(element)} bytes on a subscription with elementSize {element_size}"
        )


def encode_message(message: Message, element_size: int = 0) -> bytes:
    """Encode one message without a frame length prefix (message transports, rsio.md#framing).

    Args:
        message: any rsio-v0 message.
        element_size: the subscription's ``elementSize`` for ``onNext`` and
            ``onNextPacked``; ignored by every other message.

    Raises:
        LocalProtocolError: a field that cannot be encoded (out of varint
            range, not valid Unicode), a fixed-size element of the wrong size,
            or ``onNextPacked`` with count 0 or on a variable-size subscription.
    """
    out = [encode_varint(message.TYPE)]
    match message:
        case ClientHello(version, extensions) | ServerHello(version, extensions):
            out += [encode_varint(version), encode_varint(len(extensions))]
            out += [encode_varint(extension) for extension in extensions]
        case Goodbye(reason):
            out.append(_write_string(reason))
        case Subscribe(publisher, subscriber, initial_demand):
            out += [_write_string(publisher), encode_varint(subscriber)]
            out.append(encode_varint(initial_demand))
        case Request(subscriber, demand):
            out += [encode_varint(subscriber), encode_varint(demand)]
        case Cancel(subscriber) | OnComplete(subscriber):
            out.append(encode_varint(subscriber))
        case Subscribed(subscriber, size):
            out += [encode_varint(subscriber), encode_varint(size)]
        case OnNext(subscriber, element):
            out.append(encode_varint(subscriber))
            if element_size == 0:
                out.append(_write_bytes(element))
            else:
                _check_fixed(element, element_size, "onNext element")
                out.append(element)
        case OnNextPacked(subscriber, count, messages):
            if element_size == 0:
                raise LocalProtocolError("onNextPacked needs a subscription with elementSize > 0")
            if count < 1:
                raise LocalProtocolError(f"onNextPacked with count {count}")
            _check_fixed(messages, count * element_size, f"onNextPacked of {count} elements")
            out += [encode_varint(subscriber), encode_varint(count), messages]
        case OnNextPart(subscriber, element, data) | OnNextLastPart(subscriber, element, data):
            out += [encode_varint(subscriber), encode_varint(element), _write_bytes(data)]
        case OnError(subscriber, error):
            out += [encode_varint(subscriber), _write_string(error)]
    return b"".join(out)


def split_element(
    subscriber: int, element: bytes | memoryview, element_id: int
) -> tuple[list[OnNextPart | OnNextLastPart], int]:
    """An element over ``SPLIT_THRESHOLD_BYTES`` as its parts, and the Id the
    subscription's next split element takes (rsio.md#split-elements).

    Parts of ``SPLIT_THRESHOLD_BYTES`` each, the last one holding the rest (it
    is never empty: an element of exactly n parts' size ends with a full
    part). Ids count per subscription and wrap within ``MAX_ID``, which rsio.md#split-elements
    allows: an Id may be reused once its last part has been sent. Both ends
    publish (the server its subscriptions, the client its offers), so both
    cut elements here.
    """
    view = memoryview(element)
    last = len(view) - SPLIT_THRESHOLD_BYTES
    parts: list[OnNextPart | OnNextLastPart] = []
    position = 0
    while position < last:
        chunk = bytes(view[position : position + SPLIT_THRESHOLD_BYTES])
        parts.append(OnNextPart(subscriber, element_id, chunk))
        position += SPLIT_THRESHOLD_BYTES
    parts.append(OnNextLastPart(subscriber, element_id, bytes(view[position:])))
    return parts, (element_id + 1) % (MAX_ID + 1)


def encode_frame(message: Message, element_size: int = 0) -> bytes:
    """Encode one message with its ``frame_length`` prefix (byte-stream transports,
    rsio.md#framing).

    Raises:
        LocalProtocolError: as :func:`encode_message`.
    """
    body = encode_message(message, element_size)
    return encode_varint(len(body)) + body
