"""rsio-v0 codec: golden bytes from the worked example (rsio.md#worked-example), one
test per rule.

Every expected frame is written field by field, each with a comment, so that
a failure points at the field. ``frame(...)`` adds nothing but the
``frame_length`` varint, which is also spelled out in each test.
"""

from __future__ import annotations

import pytest

from headrace.errors import FrameTooLarge, LocalProtocolError, RemoteProtocolError
from headrace.protocols._buffer import ReceiveBuffer
from headrace.protocols.rsio.codec import (
    MAX_DEMAND,
    MAX_HELLO_EXTENSIONS,
    MAX_VARINT,
    MIN_MAX_FRAME_BYTES,
    decode_message,
    decode_varint,
    encode_frame,
    encode_message,
    encode_varint,
    peek_message_type,
    peek_subscriber,
    read_frame,
)
from headrace.protocols.rsio.commands import (
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


def roundtrip(message: Message, expected_frame: bytes, element_size: int = 0) -> None:
    """``message`` encodes to exactly ``expected_frame`` and decodes back to itself."""
    assert encode_frame(message, element_size) == expected_frame
    buffer = ReceiveBuffer(1 << 20)
    buffer.feed(expected_frame)
    body = read_frame(buffer, MIN_MAX_FRAME_BYTES)
    assert body is not None
    assert not buffer
    assert decode_message(body, element_size) == message


def rejects(body: bytes, match: str, element_size: int = 0) -> None:
    with pytest.raises(RemoteProtocolError, match=match):
        decode_message(body, element_size)


# ------------------------------------------------------------------ the worked example, the session


def test_client_hello_version_0_no_extensions() -> None:
    roundtrip(
        ClientHello(version=0, extensions=()),
        bytes.fromhex(
            "03"  # frame_length = 3
            "01"  # type clientHello
            "00"  # version 0
            "00"  # extensions: count 0
        ),
    )


def test_server_hello_version_0_no_extensions() -> None:
    roundtrip(
        ServerHello(version=0),
        bytes.fromhex(
            "03"  # frame_length = 3
            "02"  # type serverHello
            "00"  # version 0
            "00"  # extensions: count 0
        ),
    )


def test_subscribe_logs_id_1_no_initial_demand() -> None:
    roundtrip(
        Subscribe(publisher="logs", subscriber=1, initial_demand=0),
        bytes.fromhex(
            "08"  # frame_length = 8
            "04"  # type subscribe
            "04"  # publisher: length 4
            "6c6f6773"  # "logs"
            "01"  # subscriber Id 1
            "00"  # initialDemand 0 (always present)
        ),
    )


def test_subscribed_variable_size() -> None:
    roundtrip(
        Subscribed(subscriber=1, element_size=0),
        bytes.fromhex(
            "03"  # frame_length = 3
            "07"  # type subscribed
            "01"  # subscriber Id 1
            "00"  # elementSize 0: variable-size elements
        ),
    )


def test_request_2() -> None:
    roundtrip(
        Request(subscriber=1, demand=2),
        bytes.fromhex(
            "03"  # frame_length = 3
            "05"  # type request
            "01"  # subscriber Id 1
            "02"  # demand 2
        ),
    )


def test_on_next_variable_size_hello() -> None:
    roundtrip(
        OnNext(subscriber=1, element=b"hello"),
        bytes.fromhex(
            "08"  # frame_length = 8
            "08"  # type onNext
            "01"  # subscriber Id 1
            "05"  # element: length 5 (elementSize is 0)
            "68656c6c6f"  # "hello"
        ),
    )


def test_on_next_variable_size_world() -> None:
    roundtrip(
        OnNext(subscriber=1, element=b"world"),
        bytes.fromhex(
            "08"  # frame_length = 8
            "08"  # type onNext
            "01"  # subscriber Id 1
            "05"  # element: length 5
            "776f726c64"  # "world"
        ),
    )


def test_on_complete() -> None:
    roundtrip(
        OnComplete(subscriber=1),
        bytes.fromhex(
            "02"  # frame_length = 2
            "0c"  # type onComplete (12)
            "01"  # subscriber Id 1
        ),
    )


def test_goodbye_with_reason() -> None:
    roundtrip(
        Goodbye(reason="done"),
        bytes.fromhex(
            "06"  # frame_length = 6
            "03"  # type goodbye
            "04"  # reason: length 4
            "646f6e65"  # "done"
        ),
    )


def test_goodbye_reply_with_empty_reason() -> None:
    roundtrip(
        Goodbye(reason=""),
        bytes.fromhex(
            "02"  # frame_length = 2
            "03"  # type goodbye
            "00"  # reason: empty string
        ),
    )


def test_session_streams_are_the_concatenated_frames() -> None:
    client_to_server: list[Message] = [
        ClientHello(0),
        Subscribe("logs", 1, 0),
        Request(1, 2),
        Goodbye("done"),
    ]
    server_to_client: list[Message] = [
        ServerHello(0),
        Subscribed(1, 0),
        OnNext(1, b"hello"),
        OnNext(1, b"world"),
        OnComplete(1),
        Goodbye(""),
    ]
    assert b"".join(encode_frame(m) for m in client_to_server) == bytes.fromhex(
        "030100000804046c6f6773010003050102060304646f6e65"
    )
    assert b"".join(encode_frame(m) for m in server_to_client) == bytes.fromhex(
        "03020000030701000808010568656c6c6f08080105776f726c64020c01020300"
    )


# --------------------------------------------------------------- the worked example, more encodings


def test_request_unbounded_with_two_byte_id() -> None:
    roundtrip(
        Request(subscriber=300, demand=MAX_DEMAND),
        bytes.fromhex(
            "0c"  # frame_length = 12
            "05"  # type request
            "ac02"  # subscriber Id 300: 0x2c | 0x80, then 300 >> 7 = 2
            "ffffffffffffffff7f"  # demand 2^63-1 = "unbounded", 9 bytes
        ),
    )


def test_subscribe_with_initial_demand() -> None:
    roundtrip(
        Subscribe(publisher="t", subscriber=2, initial_demand=16),
        bytes.fromhex(
            "05"  # frame_length = 5
            "04"  # type subscribe
            "01"  # publisher: length 1
            "74"  # "t"
            "02"  # subscriber Id 2
            "10"  # initialDemand 16
        ),
    )


def test_subscribed_fixed_size_4() -> None:
    roundtrip(
        Subscribed(subscriber=2, element_size=4),
        bytes.fromhex(
            "03"  # frame_length = 3
            "07"  # type subscribed
            "02"  # subscriber Id 2
            "04"  # elementSize 4: every element is exactly 4 bytes
        ),
    )


def test_on_next_fixed_size_has_no_length_prefix() -> None:
    roundtrip(
        OnNext(subscriber=2, element=bytes.fromhex("00000001")),
        bytes.fromhex(
            "06"  # frame_length = 6 = 1 + len(varint Id) + elementSize
            "08"  # type onNext
            "02"  # subscriber Id 2
            "00000001"  # the 4-byte element, no length prefix
        ),
        element_size=4,
    )


def test_on_next_packed_three_elements() -> None:
    roundtrip(
        OnNextPacked(subscriber=2, count=3, messages=bytes.fromhex("000000020000000300000004")),
        bytes.fromhex(
            "0f"  # frame_length = 15
            "09"  # type onNextPacked
            "02"  # subscriber Id 2
            "03"  # count 3
            "00000002"  # element 1
            "00000003"  # element 2
            "00000004"  # element 3
        ),
        element_size=4,
    )


def test_on_next_packed_elements_splits_by_element_size() -> None:
    packed = OnNextPacked(2, 3, bytes.fromhex("000000020000000300000004"))
    assert packed.element_size == 4
    assert list(packed.elements()) == [
        bytes.fromhex("00000002"),
        bytes.fromhex("00000003"),
        bytes.fromhex("00000004"),
    ]


def test_on_next_part() -> None:
    roundtrip(
        OnNextPart(subscriber=1, element=7, data=b"hel"),
        bytes.fromhex(
            "07"  # frame_length = 7
            "0a"  # type onNextPart (10)
            "01"  # subscriber Id 1
            "07"  # element Id 7, chosen by the publisher
            "03"  # data: length 3
            "68656c"  # "hel"
        ),
    )


def test_on_next_last_part() -> None:
    roundtrip(
        OnNextLastPart(subscriber=1, element=7, data=b"lo"),
        bytes.fromhex(
            "06"  # frame_length = 6
            "0b"  # type onNextLastPart (11)
            "01"  # subscriber Id 1
            "07"  # element Id 7
            "02"  # data: length 2
            "6c6f"  # "lo"
        ),
    )


def test_cancel() -> None:
    roundtrip(
        Cancel(subscriber=1),
        bytes.fromhex(
            "02"  # frame_length = 2
            "06"  # type cancel
            "01"  # subscriber Id 1
        ),
    )


def test_on_error() -> None:
    roundtrip(
        OnError(subscriber=1, error="no such stream"),
        bytes.fromhex(
            "11"  # frame_length = 17
            "0d"  # type onError (13)
            "01"  # subscriber Id 1
            "0e"  # error: length 14
            "6e6f"  # "no"
            "2073756368"  # " such"
            "2073747265616d"  # " stream"
        ),
    )


def test_client_hello_with_extensions() -> None:
    roundtrip(
        ClientHello(version=0, extensions=(5, 200)),
        bytes.fromhex(
            "06"  # frame_length = 6
            "01"  # type clientHello
            "00"  # version 0
            "02"  # extensions: count 2
            "05"  # extension Id 5
            "c801"  # extension Id 200: 0x48 | 0x80, then 1
        ),
    )


# ------------------------------------------------------------ varints (rsio.md#primitive-encodings)


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (0, "00"),
        (127, "7f"),
        (128, "8001"),
        (300, "ac02"),
        (16383, "ff7f"),
        (16384, "808001"),
        (2**63 - 1, "ffffffffffffffff7f"),
        (2**64 - 1, "ffffffffffffffffff01"),
    ],
)
def test_varint_reference_values(value: int, encoded: str) -> None:
    raw = bytes.fromhex(encoded)
    assert encode_varint(value) == raw
    assert decode_varint(raw, 0) == (value, len(raw))


def test_varint_overlong_form_is_rejected() -> None:
    with pytest.raises(RemoteProtocolError, match="overlong"):
        decode_varint(bytes.fromhex("8000"), 0)  # 0 in two bytes


def test_varint_overlong_form_of_nonzero_value_is_rejected() -> None:
    with pytest.raises(RemoteProtocolError, match="overlong"):
        decode_varint(bytes.fromhex("818000"), 0)  # 1 in three bytes


def test_varint_longer_than_10_bytes_is_rejected() -> None:
    with pytest.raises(RemoteProtocolError, match="longer than 10"):
        decode_varint(bytes.fromhex("8080808080808080808001"), 0)


def test_varint_of_2_to_the_64_is_rejected() -> None:
    with pytest.raises(RemoteProtocolError, match="2\\^64"):
        decode_varint(bytes.fromhex("ffffffffffffffffff02"), 0)  # 10th byte carries bit 64


def test_varint_truncated_is_rejected() -> None:
    with pytest.raises(RemoteProtocolError, match="truncated"):
        decode_varint(bytes.fromhex("ff"), 0)


@pytest.mark.parametrize("value", [-1, 2**64])
def test_varint_out_of_range_cannot_be_encoded(value: int) -> None:
    with pytest.raises(LocalProtocolError):
        encode_varint(value)


def test_id_zero_is_valid() -> None:
    roundtrip(Cancel(subscriber=0), bytes.fromhex("020600"))  # Id 0


def test_id_maximum_is_valid() -> None:
    roundtrip(
        Cancel(subscriber=MAX_VARINT),
        bytes.fromhex(
            "0b"  # frame_length = 11
            "06"  # type cancel
            "ffffffffffffffffff01"  # Id 2^64-1, 10 bytes
        ),
    )


# -------------------------------------------------- strings and bytes (rsio.md#primitive-encodings)


def test_string_invalid_utf8_is_rejected() -> None:
    rejects(bytes.fromhex("0301ff"), "UTF-8")  # goodbye, reason: 1 byte 0xff


def test_string_is_utf8_without_terminator() -> None:
    roundtrip(
        Goodbye("é"),
        bytes.fromhex(
            "04"  # frame_length = 4
            "03"  # type goodbye
            "02"  # reason: 2 bytes
            "c3a9"  # "é" in UTF-8
        ),
    )


def test_string_running_past_the_message_is_rejected() -> None:
    rejects(bytes.fromhex("03056869"), "past the end")  # says 5 bytes, has 2


def test_string_with_lone_surrogate_cannot_be_encoded() -> None:
    with pytest.raises(LocalProtocolError, match="Unicode"):
        encode_message(Goodbye("\ud800"))


# ------------------------------------------------------------------ type codes (rsio.md#type-codes)


@pytest.mark.parametrize(
    "type_code",
    [
        "00",  # reserved: catches zero-filled garbage
        "0e",  # 14: reserved for future core versions
        "3f",  # 63: last reserved core code
        "40",  # 64: extension range, none negotiated
        "7f",  # 127
        "8001",  # 128: a two-byte extension code
    ],
)
def test_reserved_and_extension_type_codes_are_rejected(type_code: str) -> None:
    rejects(bytes.fromhex(type_code + "00"), "unknown message type")


def test_type_code_in_overlong_form_is_rejected() -> None:
    rejects(bytes.fromhex("8100"), "overlong")  # clientHello's 1 as two bytes


def test_peek_message_type() -> None:
    assert peek_message_type(bytes.fromhex("0c01")) is MessageType.ON_COMPLETE


# ----------------------------------------------------------------------- layouts (rsio.md#messages)


def test_bytes_left_over_are_rejected() -> None:
    rejects(bytes.fromhex("060100"), "left over")  # cancel(1) + 1 stray byte


def test_missing_field_is_rejected() -> None:
    rejects(bytes.fromhex("0501"), "truncated")  # request without demand


def test_message_without_fields_is_rejected() -> None:
    rejects(bytes.fromhex("0c"), "truncated")  # onComplete without subscriber Id


def test_fixed_size_on_next_shorter_than_element_size_is_rejected() -> None:
    rejects(bytes.fromhex("0802000000"), "past the end", element_size=4)


def test_fixed_size_on_next_longer_than_element_size_is_rejected() -> None:
    rejects(bytes.fromhex("08020000000102"), "left over", element_size=4)


def test_variable_on_next_decoded_as_fixed_size_is_rejected() -> None:
    # "hello" with its length prefix is 6 bytes, not the 4 of elementSize.
    rejects(bytes.fromhex("08010568656c6c6f"), "left over", element_size=4)


def test_on_next_packed_on_variable_size_subscription_is_rejected() -> None:
    rejects(bytes.fromhex("09020100000002"), "variable-size", element_size=0)


def test_on_next_packed_with_count_zero_is_rejected() -> None:
    rejects(bytes.fromhex("090200"), "count 0", element_size=4)


def test_on_next_packed_tail_not_count_times_size_is_rejected() -> None:
    rejects(bytes.fromhex("09020200000002"), "not 2 x 4", element_size=4)


def test_on_next_packed_huge_count_is_rejected_without_allocating() -> None:
    # count 2^64-1 with a 1-byte tail: rejected by comparing, not by multiplying out.
    rejects(bytes.fromhex("0902ffffffffffffffffff0100"), "not", element_size=1)


def test_parts_are_length_prefixed_in_fixed_size_mode() -> None:
    roundtrip(
        OnNextPart(subscriber=2, element=0, data=b"\x00\x00"),
        bytes.fromhex(
            "06"  # frame_length = 6
            "0a"  # type onNextPart
            "02"  # subscriber Id 2
            "00"  # element Id 0
            "02"  # data: length 2, even though elementSize is 4
            "0000"  # half an element
        ),
        element_size=4,
    )


def test_hello_with_too_many_extensions_is_rejected() -> None:
    count = MAX_HELLO_EXTENSIONS + 1
    body = b"\x01\x00" + encode_varint(count) + b"\x01" * count
    rejects(body, "extensions")


def test_hello_with_extensions_at_the_limit_is_accepted() -> None:
    count = MAX_HELLO_EXTENSIONS
    body = b"\x01\x00" + encode_varint(count) + b"\x01" * count
    assert decode_message(body) == ClientHello(0, (1,) * count)


def test_peek_subscriber_reads_the_first_field() -> None:
    assert peek_subscriber(bytes.fromhex("08ac02ff")) == 300  # onNext, body not checked


@pytest.mark.parametrize("body", ["010000", "0300", "0401740200"])
def test_peek_subscriber_of_message_without_leading_id_is_rejected(body: str) -> None:
    with pytest.raises(RemoteProtocolError, match="subscriber id"):
        peek_subscriber(bytes.fromhex(body))


# --------------------------------------------------------------------------- encoding refusals


def test_fixed_size_element_of_wrong_size_cannot_be_encoded() -> None:
    with pytest.raises(LocalProtocolError, match="elementSize 4"):
        encode_message(OnNext(2, b"\x00\x01\x02"), element_size=4)


def test_on_next_packed_on_variable_size_cannot_be_encoded() -> None:
    with pytest.raises(LocalProtocolError, match="elementSize > 0"):
        encode_message(OnNextPacked(2, 1, b"\x00"), element_size=0)


def test_on_next_packed_with_count_zero_cannot_be_encoded() -> None:
    with pytest.raises(LocalProtocolError, match="count 0"):
        encode_message(OnNextPacked(2, 0, b""), element_size=4)


def test_on_next_packed_with_wrong_tail_cannot_be_encoded() -> None:
    with pytest.raises(LocalProtocolError):
        encode_message(OnNextPacked(2, 2, b"\x00" * 7), element_size=4)


def test_negative_id_cannot_be_encoded() -> None:
    with pytest.raises(LocalProtocolError):
        encode_message(Cancel(-1))


# ------------------------------------------------------------------------ framing (rsio.md#framing)


def test_frame_split_anywhere_is_returned_only_when_complete() -> None:
    frame = encode_frame(OnNext(1, b"hello"))
    buffer = ReceiveBuffer(1 << 20)
    for byte in frame[:-1]:
        buffer.feed(bytes([byte]))
        assert read_frame(buffer, MIN_MAX_FRAME_BYTES) is None
    assert len(buffer) == len(frame) - 1  # rolled back, nothing lost
    buffer.feed(frame[-1:])
    assert read_frame(buffer, MIN_MAX_FRAME_BYTES) == frame[1:]


def test_frame_length_zero_is_rejected() -> None:
    buffer = ReceiveBuffer(16)
    buffer.feed(b"\x00")
    with pytest.raises(RemoteProtocolError, match="frame length 0"):
        read_frame(buffer, MIN_MAX_FRAME_BYTES)


def test_frame_over_limit_is_rejected_from_its_prefix() -> None:
    buffer = ReceiveBuffer(16)
    buffer.feed(encode_varint(MIN_MAX_FRAME_BYTES + 1))  # no body needed to decide
    with pytest.raises(FrameTooLarge) as info:
        read_frame(buffer, MIN_MAX_FRAME_BYTES)
    assert info.value.limit_bytes == MIN_MAX_FRAME_BYTES
    assert info.value.got_bytes == MIN_MAX_FRAME_BYTES + 1
    assert info.value.reply_hint == Goodbye("frame too large")


def test_frame_at_limit_is_accepted() -> None:
    body = encode_message(OnNext(1, b"x" * (MIN_MAX_FRAME_BYTES - 5)))
    assert len(body) == MIN_MAX_FRAME_BYTES  # 1 type + 1 Id + 3 length + data
    buffer = ReceiveBuffer(MIN_MAX_FRAME_BYTES + 10)
    buffer.feed(encode_varint(len(body)) + body)
    assert read_frame(buffer, MIN_MAX_FRAME_BYTES) == body


def test_frame_length_overlong_is_rejected() -> None:
    buffer = ReceiveBuffer(16)
    buffer.feed(bytes.fromhex("8300"))  # 3 in two bytes
    with pytest.raises(RemoteProtocolError, match="overlong"):
        read_frame(buffer, MIN_MAX_FRAME_BYTES)


def test_frame_length_longer_than_10_bytes_is_rejected() -> None:
    buffer = ReceiveBuffer(16)
    buffer.feed(bytes.fromhex("8080808080808080808001"))
    with pytest.raises(RemoteProtocolError, match="longer than 10"):
        read_frame(buffer, MIN_MAX_FRAME_BYTES)


def test_frame_length_of_2_to_the_64_is_rejected() -> None:
    buffer = ReceiveBuffer(16)
    buffer.feed(bytes.fromhex("ffffffffffffffffff02"))
    with pytest.raises(RemoteProtocolError, match="2\\^64"):
        read_frame(buffer, MIN_MAX_FRAME_BYTES)


def test_remote_errors_hint_a_goodbye_with_the_description() -> None:
    with pytest.raises(RemoteProtocolError) as info:
        decode_message(bytes.fromhex("00"))
    assert info.value.reply_hint == Goodbye("unknown message type 0")
