"""The WebSocket handshake and frames, bytes in, events out (RFC 6455)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headrace.errors import RemoteProtocolError
from headrace.protocols.websocket import (
    CLOSE_MESSAGE_TOO_BIG,
    CLOSE_PROTOCOL_ERROR,
    Close,
    FrameReader,
    Message,
    Opcode,
    Ping,
    accept_key,
    encode_frame,
    handshake_response,
    parse_request,
)

UPGRADE = (
    b"GET /rsio HTTP/1.1\r\nHost: server.example.com\r\nUpgrade: websocket\r\n"
    b"Connection: keep-alive, Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
    b"Sec-WebSocket-Version: 13\r\n\r\n"
)


def test_accept_key_matches_the_rfc_example() -> None:
    assert accept_key("dGhlIHNhbXBsZSBub25jZQ==") == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="  # §1.3


def test_upgrade_request_is_parsed_and_answered() -> None:
    parsed = parse_request(UPGRADE + b"\x82")
    assert parsed is not None
    request, used = parsed
    assert used == len(UPGRADE)
    assert request.path == "/rsio" and request.is_websocket_upgrade()
    assert b"Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n" in handshake_response(request)


def test_incomplete_head_waits_and_oversized_head_is_refused() -> None:
    assert parse_request(UPGRADE[:-2]) is None
    with pytest.raises(RemoteProtocolError) as info:
        parse_request(b"GET / HTTP/1.1\r\nX: " + b"a" * 20_000)
    assert info.value.reply_hint == 431
    with pytest.raises(RemoteProtocolError):
        parse_request(b"garbage\r\n\r\n")


def test_masked_frames_round_trip_with_every_length_form() -> None:
    reader = FrameReader(masked=True)
    for size in (0, 125, 126, 65535, 65536):
        payload = bytes(range(256)) * (size // 256) + bytes(size % 256)
        assert list(reader.receive_data(encode_frame(Opcode.BINARY, payload, mask=True))) == [
            Message(Opcode.BINARY, payload)
        ]


def test_fragments_join_around_a_ping() -> None:
    reader = FrameReader(masked=False)
    first = bytes([0x02, 3]) + b"abc"  # BINARY, FIN clear
    ping = encode_frame(Opcode.PING, b"p")
    last = bytes([0x80, 2]) + b"de"  # CONTINUATION, FIN
    assert list(reader.receive_data(first + ping + last)) == [
        Ping(b"p"),
        Message(Opcode.BINARY, b"abcde"),
    ]


def test_close_frame_carries_code_and_reason() -> None:
    reader = FrameReader(masked=False)
    frame = encode_frame(Opcode.CLOSE, b"\x03\xe8bye")
    assert list(reader.receive_data(frame)) == [Close(1000, b"bye")]


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (bytes([0xC2, 0x80]) + bytes(4), CLOSE_PROTOCOL_ERROR),  # RSV1 set
        (bytes([0x83, 0x80]) + bytes(4), CLOSE_PROTOCOL_ERROR),  # reserved opcode 3
        (bytes([0x82, 0x00]), CLOSE_PROTOCOL_ERROR),  # not masked
        (bytes([0x80, 0x80]) + bytes(4), CLOSE_PROTOCOL_ERROR),  # continuation first
        (bytes([0x09, 0x80]) + bytes(4), CLOSE_PROTOCOL_ERROR),  # fragmented ping
        (bytes([0x89, 0xFE, 0x00, 0x7E]) + bytes(4 + 126), CLOSE_PROTOCOL_ERROR),  # big ping
        (bytes([0x82, 0xFF]) + (1 << 30).to_bytes(8, "big"), CLOSE_MESSAGE_TOO_BIG),
        (bytes([0x02, 0x80]) + bytes(4) + bytes([0x82, 0x80]) + bytes(4), CLOSE_PROTOCOL_ERROR),
    ],
    ids=[
        "rsv",
        "reserved-opcode",
        "unmasked",
        "lone-continuation",
        "fragmented-control",
        "big-control",
        "too-big",
        "interleaved-messages",
    ],
)
def test_framing_errors_name_the_close_code(data: bytes, code: int) -> None:
    with pytest.raises(RemoteProtocolError) as info:
        list(FrameReader(masked=True, max_message_bytes=1 << 20).receive_data(data))
    assert info.value.reply_hint == code


@given(st.lists(st.binary(max_size=300), max_size=5), st.data())
def test_arbitrary_chunking_gives_the_same_messages(
    payloads: list[bytes], data: st.DataObject
) -> None:
    stream = b"".join(encode_frame(Opcode.BINARY, p, mask=True) for p in payloads)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    reader = FrameReader(masked=True)
    got = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        got += list(reader.receive_data(stream[start:end]))
    assert got == [Message(Opcode.BINARY, p) for p in payloads]
