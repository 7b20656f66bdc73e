"""Golden bytes for every Lumberjack frame, v1 and v2, built field by field.

Worked examples are captures of npm lumberjack-protocol, pylogbeat 2.1.0 and go-lumber, and a
logstash-forwarder-style stream. All integers are u32 big-endian.
"""

from __future__ import annotations

import json
import struct
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headrace.errors import FrameTooLarge, LocalProtocolError, RemoteProtocolError
from headrace.protocols._buffer import ReceiveBuffer
from headrace.protocols.lumberjack import (
    DEFAULT_LIMITS,
    MAX_DECOMPRESSED_BYTES,
    MAX_FRAME_BYTES,
    Ack,
    Compressed,
    Data,
    FrameDecoder,
    FrameType,
    JsonData,
    Limits,
    ProtocolVersion,
    WindowSize,
    data_to_json,
    decode_frame,
    decode_frames,
    encode_frame,
    parse_json_object,
)

V1 = ProtocolVersion.V1
V2 = ProtocolVersion.V2


def u32(value: int) -> bytes:
    return struct.pack(">I", value)


def one(data: bytes, limits: Limits = DEFAULT_LIMITS) -> tuple[ProtocolVersion, object]:
    frames = decode_frames(data, limits)
    assert len(frames) == 1
    return frames[0]


# --------------------------------------------------------------------------- W, A


def test_window_size_v1_golden() -> None:
    wire = (
        b"1"  # version '1' = 0x31
        b"W"  # type 'W' = 0x57
        + u32(2)  # count: 2 data frames follow (as npm lumberjack-protocol sends it)
    )
    assert wire == bytes.fromhex("31 57 00000002")
    assert encode_frame(V1, WindowSize(2)) == wire
    assert one(wire) == (V1, WindowSize(2))


def test_window_size_v2_zero_golden() -> None:
    wire = (
        b"2"  # version '2' = 0x32
        b"W" + u32(0)  # type 'W'  # count 0: pylogbeat's send([])
    )
    assert encode_frame(V2, WindowSize(0)) == wire
    assert one(wire) == (V2, WindowSize(0))


def test_ack_v1_golden() -> None:
    wire = (
        b"1"  # version '1': must match the connection (npm asserts '1')
        b"A" + u32(2)  # type 'A' = 0x41  # seq of the window's last data frame
    )
    assert wire == bytes.fromhex("31 41 00 00 00 02")
    assert encode_frame(V1, Ack(2)) == wire
    assert one(wire) == (V1, Ack(2))


def test_ack_v2_keepalive_golden() -> None:
    wire = b"2A" + u32(0)  # v2 keepalive: ack seq 0 (lumberjack.md#keepalive)
    assert wire == bytes.fromhex("32 41 00 00 00 00")
    assert encode_frame(V2, Ack(0)) == wire
    assert one(wire) == (V2, Ack(0))


def test_ack_is_six_bytes_even_at_u32_max() -> None:
    assert encode_frame(V1, Ack(0xFFFFFFFF)) == b"1A\xff\xff\xff\xff"


# --------------------------------------------------------------------------- D


NPM_D_SEQ1 = (
    b"1"  # version '1'
    b"D"  # type 'D' = 0x44
    + u32(1)  # seq 1
    + u32(4)  # 4 pairs
    + u32(4)
    + b"line"  # key
    + u32(5)
    + b"hello"  # value
    + u32(4)
    + b"file"
    + u32(16)
    + b"/var/log/app.log"
    + u32(6)
    + b"offset"
    + u32(1)
    + b"0"  # offsets are decimal strings
    + u32(4)
    + b"host"
    + u32(2)
    + b"h1"
)


def test_data_v1_golden_npm_lumberjack_protocol() -> None:
    # Captured from npm lumberjack-protocol 1.0.7: 84 bytes.
    assert len(NPM_D_SEQ1) == 84
    assert NPM_D_SEQ1.hex() == (
        "3144000000010000000400000004"
        "6c696e6500000005"
        "68656c6c6f00000004"
        "66696c6500000010"
        "2f7661722f6c6f672f6170702e6c6f67"
        "000000066f6666736574000000013000000004686f7374000000026831"
    )
    frame = Data(
        1,
        ((b"line", b"hello"), (b"file", b"/var/log/app.log"), (b"offset", b"0"), (b"host", b"h1")),
    )
    assert encode_frame(V1, frame) == NPM_D_SEQ1
    assert one(NPM_D_SEQ1) == (V1, frame)


def test_data_with_no_pairs_is_accepted() -> None:
    wire = b"1D" + u32(7) + u32(0)  # seq 7, 0 pairs (Logstash refuses; we store {})
    assert one(wire) == (V1, Data(7, ()))
    assert data_to_json(()) == b"{}"


def test_data_to_json_keeps_strings_and_last_duplicate() -> None:
    pairs = ((b"file", b"/a"), (b"offset", b"12"), (b"file", b"/b"))
    assert data_to_json(pairs) == b'{"file":"/b","offset":"12"}'


def test_data_to_json_replaces_invalid_utf8() -> None:
    payload = data_to_json(((b"line", b"caf\xe9"), (b"k\xff", b"\xc3\xa9")))
    assert json.loads(payload) == {"line": "caf\ufffd", "k\ufffd": "\u00e9"}
    assert "é".encode() in payload  # not ASCII-escaped


@given(
    st.lists(
        st.tuples(st.binary(max_size=12), st.binary(max_size=40))
        | st.tuples(st.text(max_size=8), st.text(max_size=30)).map(
            lambda kv: (
                kv[0].encode("utf-8", "surrogatepass"),
                kv[1].encode("utf-8", "surrogatepass"),
            )
        ),
        max_size=6,
    )
)
def test_data_to_json_writes_what_json_dumps_writes(pairs: list[tuple[bytes, bytes]]) -> None:
    # The encoder is msgspec's; the format is the one json.dumps wrote before:
    # compact, not ASCII-escaped, the same escapes (control characters, quotes,
    # backslashes), the last value of a duplicated key at its first position.
    document = {k.decode("utf-8", "replace"): v.decode("utf-8", "replace") for k, v in pairs}
    expected = json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()
    assert data_to_json(tuple(pairs)) == expected


def test_data_pair_count_over_limit_fails_before_the_pairs_arrive() -> None:
    limits = Limits(max_data_pairs=3)
    buffer = ReceiveBuffer(100)
    buffer.feed(b"1D" + u32(1) + u32(4))  # header only, 4 pairs announced
    with pytest.raises(RemoteProtocolError, match="4 pairs"):
        decode_frame(buffer, limits)


def test_data_key_over_limit() -> None:
    buffer = ReceiveBuffer(100)
    buffer.feed(b"1D" + u32(1) + u32(1) + u32(9))  # key of 9 bytes announced
    with pytest.raises(FrameTooLarge) as info:
        decode_frame(buffer, Limits(max_key_bytes=8))
    assert (info.value.limit_bytes, info.value.got_bytes) == (8, 9)


def test_data_value_over_limit() -> None:
    buffer = ReceiveBuffer(100)
    buffer.feed(b"1D" + u32(1) + u32(1) + u32(1) + b"k" + u32(9))
    with pytest.raises(FrameTooLarge):
        decode_frame(buffer, Limits(max_value_bytes=8))


def test_data_frame_over_frame_limit() -> None:
    # 10 header + (8 + 1 + 30) = 49 bytes > 40
    buffer = ReceiveBuffer(100)
    buffer.feed(b"1D" + u32(1) + u32(1) + u32(1) + b"k" + u32(30))
    with pytest.raises(FrameTooLarge) as info:
        decode_frame(buffer, Limits(max_frame_bytes=40))
    assert info.value.got_bytes == 49


# --------------------------------------------------------------------------- J


GO_LUMBER_J = (
    b"2"  # version '2'
    b"J"  # type 'J' = 0x4A
    + u32(1)  # seq 1
    + u32(19)  # length of the JSON document
    + b'{"message":"hello"}'  # go-lumber: compact JSON (go-lumber)
)


def test_json_data_v2_golden_go_lumber() -> None:
    assert GO_LUMBER_J.hex() == "324a00000001000000137b226d657373616765223a2268656c6c6f227d"
    assert encode_frame(V2, JsonData(1, b'{"message":"hello"}')) == GO_LUMBER_J
    assert one(GO_LUMBER_J) == (V2, JsonData(1, b'{"message":"hello"}'))


def test_json_data_v2_golden_pylogbeat_element() -> None:
    # pylogbeat: json.dumps() with ", "/": " separators, seq keeps counting.
    document = json.dumps({"message": "world"}).encode()
    wire = b"2J" + u32(4) + u32(20) + document
    assert wire.hex() == "324a00000004000000147b226d657373616765223a2022776f726c64227d"
    assert one(wire) == (V2, JsonData(4, b'{"message": "world"}'))


@pytest.mark.parametrize(
    ("document", "reason"),
    [
        (b"", "invalid JSON"),  # Logstash refuses len <= 0
        (b"hello", "invalid JSON"),  # pylogbeat sends str elements unchecked
        (b'"hello"', "not an object"),
        (b"[1, 2]", "not an object"),
        (b"42", "not an object"),
        (b"null", "not an object"),
        (b'{"a": NaN}', "invalid JSON"),
        (b'{"a": -Infinity}', "invalid JSON"),
        (b'{"a": 1} x', "invalid JSON"),
        (b'{"a": "\xff"}', "not UTF-8"),
        (b'\xef\xbb\xbf{"a": 1}', "byte-order mark"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply|not an object"),
    ],
)
def test_json_data_must_be_a_utf8_json_object(document: bytes, reason: str) -> None:
    wire = b"2J" + u32(1) + u32(len(document)) + document
    with pytest.raises(RemoteProtocolError, match=reason):
        decode_frames(wire)


def test_json_data_with_any_valid_number_is_accepted() -> None:
    document = b'{"big": ' + b"9" * 10_000 + b', "f": 1e400, "g": -0.5e-3}'
    wire = b"2J" + u32(1) + u32(len(document)) + document
    assert one(wire) == (V2, JsonData(1, document))


def test_json_data_with_a_lone_surrogate_escape_is_accepted() -> None:
    # Python's json.dumps writes one for a str holding a lone surrogate (pylogbeat).
    document = b'{"message": "\\udcff", "pair": "\\ud83d\\ude00", "text": "\\\\ud800"}'
    wire = b"2J" + u32(1) + u32(len(document)) + document
    assert one(wire) == (V2, JsonData(1, document))
    assert parse_json_object(document) == {
        "message": "\ufffd",
        "pair": "\U0001f600",
        "text": "\\ud800",
    }


def test_json_data_deeply_nested_object_is_refused_cleanly() -> None:
    document = b'{"a":' * 100_000 + b"1" + b"}" * 100_000
    wire = b"2J" + u32(1) + u32(len(document)) + document
    with pytest.raises(RemoteProtocolError, match="nested too deeply"):
        decode_frames(wire)


def test_json_data_length_over_frame_limit_fails_at_once() -> None:
    buffer = ReceiveBuffer(100)
    buffer.feed(b"2J" + u32(1) + u32(91))  # 10 + 91 > 100, nothing of the document yet
    with pytest.raises(FrameTooLarge):
        decode_frame(buffer, Limits(max_frame_bytes=100))


def test_encode_json_data_refuses_a_non_object() -> None:
    with pytest.raises(LocalProtocolError, match="not an object"):
        encode_frame(V2, JsonData(1, b"[1]"))


# --------------------------------------------------------------------------- C


def test_compressed_v1_golden_logstash_forwarder_style() -> None:
    # Go compress/zlib level 3 (header 78 5e), with LSF's sync-flush
    # block 00 00 ff ff before the final block.
    stream = bytes.fromhex(
        "785e3274616060606460606001e1b4cc9c5406060601fdb2c422fd9cfc74fdc48202bd9cfc74"
        "905c467e71090303035386210303035b7e5a5a712a88cf680092ccc9cc036964cd48cdc9c907"
        "9bc944899966c86696e717e5a400000000ffff010000ffffa84921ca"
    )
    wire = (
        b"1"  # version '1'
        b"C"  # type 'C' = 0x43
        + u32(0x68)  # compressed length: 104 bytes
        + stream
    )
    version, frame = one(wire)
    assert version is V1
    keys = ((b"file", b"/var/log/app.log"), (b"host", b"h1"))
    assert frame == Compressed(
        (
            Data(1, (*keys, (b"offset", b"0"), (b"line", b"hello"))),
            Data(2, (*keys, (b"offset", b"6"), (b"line", b"world"))),
        )
    )


PYLOGBEAT_C = (
    b"2"  # version '2'
    b"C"  # type 'C'
    + u32(0x31)  # 49 compressed bytes
    + bytes.fromhex(  # zlib.compress() default level: header 78 9c
        "789c33f2626060600462916aa5dcd4e2e2c4f454252b05a58cd49c9c7ca55a23902c13866c79"
        "7e514e8a522d00900e0ede"
    )
)


def test_compressed_v2_golden_pylogbeat() -> None:
    # pylogbeat 2.1.0 send([{"message":"hello"},{"message":"world"}]).
    assert one(PYLOGBEAT_C) == (
        V2,
        Compressed(
            (
                JsonData(1, b'{"message": "hello"}'),
                JsonData(2, b'{"message": "world"}'),
            )
        ),
    )
    # Our encoder with zlib's default level produces the very same bytes.
    inner = (JsonData(1, b'{"message": "hello"}'), JsonData(2, b'{"message": "world"}'))
    assert encode_frame(V2, Compressed(inner)) == PYLOGBEAT_C


def test_compressed_empty_golden_pylogbeat() -> None:
    # pylogbeat sends this after W = 0 (captured): zlib.compress(b"").
    wire = (
        b"2C"
        + u32(8)  # 8 compressed bytes
        + bytes.fromhex("789c")  # zlib header, default level
        + bytes.fromhex("0300")  # final empty fixed-Huffman block
        + bytes.fromhex("00000001")  # Adler-32 of nothing
    )
    assert wire.hex() == "324300000008789c030000000001"
    assert one(wire) == (V2, Compressed(()))
    assert encode_frame(V2, Compressed(())) == wire


def test_compressed_v2_golden_go_lumber_stored_block() -> None:
    # go-lumber at level 3 may emit a stored (uncompressed) block.
    inflated = GO_LUMBER_J + b"2J" + u32(2) + u32(19) + b'{"message":"world"}'
    stream = (
        bytes.fromhex("785e")  # zlib header (Go, level 3)
        + b"\x00"  # BFINAL=0, BTYPE=00 stored
        + struct.pack("<HH", 58, 58 ^ 0xFFFF)  # LEN, NLEN (little-endian): 3a00 c5ff
        + inflated  # 58 raw bytes
        + bytes.fromhex("0300")  # final empty block
        + zlib.adler32(inflated).to_bytes(4, "big")  # 79a40e9c
    )
    wire = b"2C" + u32(0x47) + stream
    assert stream[-4:].hex() == "79a40e9c"
    assert one(wire) == (
        V2,
        Compressed((JsonData(1, b'{"message":"hello"}'), JsonData(2, b'{"message":"world"}'))),
    )


def test_compressed_nested_is_accepted() -> None:
    inner = encode_frame(V2, Compressed((JsonData(1, b"{}"),)))
    wire = b"2C" + u32(len(body := zlib.compress(inner))) + body
    assert one(wire) == (V2, Compressed((Compressed((JsonData(1, b"{}"),)),)))


def test_compressed_nesting_over_limit() -> None:
    frame = Compressed((JsonData(1, b"{}"),))
    for _ in range(2):
        frame = Compressed((frame,))
    wire = encode_frame(V2, frame)  # depth 3
    assert one(wire, Limits(max_compressed_depth=3))[1] == frame
    with pytest.raises(RemoteProtocolError, match="nested 3 deep"):
        decode_frames(wire, Limits(max_compressed_depth=2))


def test_compressed_bomb_is_refused() -> None:
    # 10 MiB of zeros inside a J frame compress to ~10 KiB.
    document = b'{"a":"' + b"0" * (10 * 1024 * 1024) + b'"}'
    inflated = b"2J" + u32(1) + u32(len(document)) + document
    body = zlib.compress(inflated, 9)
    assert len(body) < 64 * 1024
    wire = b"2C" + u32(len(body)) + body
    with pytest.raises(FrameTooLarge) as info:
        decode_frames(wire, Limits(max_decompressed_bytes=1024 * 1024))
    assert info.value.limit_bytes == 1024 * 1024
    assert decode_frames(wire)  # within the default MAX_DECOMPRESSED_BYTES
    assert len(inflated) < MAX_DECOMPRESSED_BYTES


def test_compressed_budget_is_shared_with_nested_frames() -> None:
    document = b'{"a":"' + b"x" * 580 + b'"}'
    inner = Compressed((JsonData(1, document),))
    inner_inflated = 10 + len(document)  # one J frame
    outer_inflated = 2 * len(encode_frame(V2, inner))  # two nested C frames
    total = outer_inflated + 2 * inner_inflated
    assert inner_inflated + outer_inflated < total - 1  # each level alone fits
    wire = encode_frame(V2, Compressed((inner, inner)))
    with pytest.raises(FrameTooLarge):
        decode_frames(wire, Limits(max_decompressed_bytes=total - 1))
    assert one(wire, Limits(max_decompressed_bytes=total))[1] == Compressed((inner, inner))


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (zlib.compress(b"2J" + u32(1) + u32(2) + b"{}")[:-3], "truncated"),
        (zlib.compress(b"") + b"junk", "after the end"),
        (b"\x00\x01garbage", "bad zlib"),
        (zlib.compress(b"2J" + u32(1) + u32(2) + b"{"), "not a whole frame"),
        (zlib.compress(b"2W" + u32(1)), "holds a WindowSize"),
        (zlib.compress(b"2A" + u32(1)), "holds a Ack"),
        (zlib.compress(b"1J" + u32(1) + u32(2) + b"{}"), "holds a frame of version V1"),
        (zlib.compress(b"2X"), "unknown frame type"),
        (zlib.compress(b"2"), "1 bytes at the end"),
        (zlib.compress(b"2J" + u32(1)), "6 bytes at the end"),
    ],
)
def test_compressed_malformed(body: bytes, reason: str) -> None:
    wire = b"2C" + u32(len(body)) + body
    with pytest.raises(RemoteProtocolError, match=reason):
        decode_frames(wire)


def test_compressed_raw_deflate_and_gzip_are_refused() -> None:
    for wbits in (-15, 31):  # raw deflate, gzip: not RFC 1950
        packer = zlib.compressobj(wbits=wbits)
        body = packer.compress(b"2J" + u32(1) + u32(2) + b"{}") + packer.flush()
        with pytest.raises(RemoteProtocolError, match="bad zlib"):
            decode_frames(b"2C" + u32(len(body)) + body)


def test_compressed_length_over_frame_limit() -> None:
    buffer = ReceiveBuffer(100)
    buffer.feed(b"2C" + u32(MAX_FRAME_BYTES))
    with pytest.raises(FrameTooLarge):
        decode_frame(buffer)


def test_encode_compressed_refuses_window_or_ack_inside() -> None:
    with pytest.raises(LocalProtocolError, match="cannot hold WindowSize"):
        encode_frame(V2, Compressed((WindowSize(1),)))  # type: ignore[arg-type]


# --------------------------------------------------------------------------- header


def test_frame_types_are_the_spec_letters() -> None:
    assert {chr(t) for t in FrameType} == {"W", "D", "J", "C", "A"}
    assert {chr(v) for v in ProtocolVersion} == {"1", "2"}


@pytest.mark.parametrize("first", [b"0", b"3", b"\x00", b"G"])
def test_bad_version_byte_fails_on_the_first_byte(first: bytes) -> None:
    buffer = ReceiveBuffer(10)
    buffer.feed(first)
    with pytest.raises(RemoteProtocolError, match="bad version byte"):
        decode_frame(buffer)


def test_tls_client_hello_gets_a_hint() -> None:
    buffer = ReceiveBuffer(10)
    buffer.feed(b"\x16\x03\x01")
    with pytest.raises(RemoteProtocolError, match="TLS"):
        decode_frame(buffer)


def test_unknown_frame_type() -> None:
    with pytest.raises(RemoteProtocolError, match="unknown frame type 0x4e"):
        decode_frames(b"2N" + u32(0))


def test_incomplete_frame_returns_none_and_keeps_the_bytes() -> None:
    buffer = ReceiveBuffer(100)
    for byte in NPM_D_SEQ1[:-1]:
        buffer.feed(bytes([byte]))
        assert decode_frame(buffer) is None
    assert len(buffer) == len(NPM_D_SEQ1) - 1
    buffer.feed(NPM_D_SEQ1[-1:])
    assert decode_frame(buffer) is not None
    assert len(buffer) == 0


def test_decode_frames_refuses_a_trailing_partial_frame() -> None:
    with pytest.raises(RemoteProtocolError, match="not a whole frame"):
        decode_frames(GO_LUMBER_J + b"2W")


def test_frame_decoder_waits_for_the_announced_length() -> None:
    document = b'{"line":"' + b"x" * 100_000 + b'"}'
    wire = b"2J" + u32(9) + u32(len(document)) + document
    decoder = FrameDecoder()
    for start in range(0, len(wire) - 1000, 1000):
        decoder.feed(wire[start : start + 1000])
        assert decoder.next_frame() is None
    decoder.feed(wire[start + 1000 :])
    assert decoder.next_frame() == (V2, JsonData(9, document))
    assert decoder.next_frame() is None
    assert len(decoder) == 0


def test_frame_decoder_buffer_limit() -> None:
    decoder = FrameDecoder(Limits(max_frame_bytes=10))
    with pytest.raises(FrameTooLarge):
        decoder.feed(b"x" * (decoder_limit := Limits(max_frame_bytes=10).max_buffered_bytes + 1))
    assert decoder_limit > 10


@pytest.mark.parametrize(
    "frame",
    [WindowSize(2**32), Ack(-1), Data(2**32, ()), JsonData(-5, b"{}")],
)
def test_encode_refuses_numbers_outside_u32(frame: WindowSize | Ack | Data | JsonData) -> None:
    with pytest.raises(LocalProtocolError, match="u32"):
        encode_frame(V2, frame)
