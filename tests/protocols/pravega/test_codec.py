"""Golden bytes for the Pravega codec, built field by field (pravega.md#field-encodings).

Each expected frame is written as a list of (bytes, comment) parts so that a
failing test shows which field is off. The live captures are
frames the real ``pravega`` 0.3.8 client sent (pravega.md#real-client).
"""

from __future__ import annotations

import struct
from uuid import UUID

import pytest

from headrace.errors import FrameTooLarge, LocalProtocolError, RemoteProtocolError
from headrace.protocols import pravega as p
from headrace.protocols._buffer import HANDOVER_MIN_BYTES, FramePool, ReceiveBuffer
from headrace.protocols.pravega import (
    MAX_FRAME_BYTES,
    NO_VERSION,
    NOT_EXISTS,
    NULL_ATTRIBUTE_VALUE,
    AppendBlockEnd,
    AppendSetup,
    AuthTokenCheckFailed,
    ChunkInfo,
    CommandType,
    ConditionalAppend,
    ConditionalAttributeUpdate,
    ConditionalBlockEnd,
    CreateSegment,
    CreateTableSegment,
    DataAppended,
    Event,
    Hello,
    InvalidEventNumber,
    KeepAlive,
    MergeSegments,
    NoSuchSegment,
    Padding,
    ReadSegment,
    ReadTable,
    ReadTableEntriesDelta,
    ReadTableKeys,
    SegmentAttributeUpdated,
    SegmentIsTruncated,
    SegmentRead,
    SegmentsBatchMerged,
    SetupAppend,
    StorageChunksListed,
    StreamSegmentInfo,
    TableEntries,
    TableEntriesDeltaRead,
    TableIteratorArgs,
    TableKey,
    TableValue,
    UpdateTableEntries,
    decode_command,
    decode_events,
    decode_frame,
    decode_payload,
    encode_command,
    encode_event,
)

WRITER = UUID("00112233-4455-6677-8899-aabbccddeeff")
CAPTURED_WRITER = UUID("8f576a25-573e-0668-4f04-2d175868ab38")
SEGMENT = "sc/st/0.#epoch.0"  # 16 bytes


def join(*parts: tuple[str, str]) -> bytes:
    """Concatenate hex parts; the second element of each part is its comment."""
    return b"".join(bytes.fromhex(hex_) for hex_, _comment in parts)


def i32(value: int) -> str:
    return struct.pack(">i", value).hex()


def i64(value: int) -> str:
    return struct.pack(">q", value).hex()


def string(text: str) -> str:
    raw = text.encode()
    return struct.pack(">H", len(raw)).hex() + raw.hex()


def frame(type_code: int, payload: bytes) -> bytes:
    return struct.pack(">ii", type_code, len(payload)) + payload


def assert_golden(cmd: object, expected: bytes) -> None:
    assert encode_command(cmd) == expected  # type: ignore[arg-type]
    assert decode_frame(expected) == cmd


# --------------------------------------------------------------------------- worked examples


def test_hello_client_golden_bytes() -> None:
    expected = join(
        ("ff ff ff 81", "type = -127 (Hello)"),
        ("00 00 00 08", "length = 8"),
        ("00 00 00 0f", "high_version = 15"),
        ("00 00 00 05", "low_version = 5"),
    )
    assert_golden(Hello(15, 5), expected)


def test_hello_server_golden_bytes() -> None:
    expected = bytes.fromhex("ff ff ff 81 00 00 00 08 00 00 00 11 00 00 00 05")
    assert_golden(Hello(17, 5), expected)


def test_setup_append_golden_bytes() -> None:
    expected = join(
        ("00 00 00 01", "type 1 (SetupAppend)"),
        ("00 00 00 2c", "length = 44"),
        ("00 00 00 00 00 00 00 06", "request_id = 6"),
        ("00112233445566778899aabbccddeeff", "writer_id"),
        ("00 10", "segment length = 16"),
        ("73 63 2f 73 74 2f 30 2e 23 65 70 6f 63 68 2e 30", "sc/st/0.#epoch.0"),
        ("00 00", "delegation_token = ''"),
    )
    assert len(expected) == 52
    assert_golden(SetupAppend(6, WRITER, SEGMENT, ""), expected)


def test_append_block_end_two_events_golden_bytes() -> None:
    expected = join(
        ("00 00 00 04", "type 4 (AppendBlockEnd)"),
        ("00 00 00 41", "length = 65"),
        ("00112233445566778899aabbccddeeff", "writer_id"),
        ("00 00 00 15", "size_of_whole_events = 21"),
        ("00 00 00 15", "data length = 21"),
        ("00 00 00 00 00 00 00 02 61 62", "Event(type 0, len 2, 'ab')"),
        ("00 00 00 00 00 00 00 03 78 79 7a", "Event(type 0, len 3, 'xyz')"),
        ("00 00 00 02", "num_events = 2"),
        ("00 00 00 00 00 00 00 02", "last_event_number = 2"),
        ("00 00 00 00 00 00 00 07", "request_id = 7"),
    )
    assert len(expected) == 73
    data = encode_event(b"ab") + encode_event(b"xyz")
    assert_golden(AppendBlockEnd(WRITER, 21, data, 2, 2, 7), expected)


def test_data_appended_golden_bytes_request_id_after_event_numbers() -> None:
    expected = join(
        ("00 00 00 07", "type 7 (DataAppended)"),
        ("00 00 00 30", "length = 48"),
        ("00112233445566778899aabbccddeeff", "writer_id"),
        ("00 00 00 00 00 00 00 02", "event_number = 2"),
        ("80 00 00 00 00 00 00 00", "previous_event_number = i64::MIN"),
        ("00 00 00 00 00 00 00 07", "request_id = 7"),
        ("00 00 00 00 00 00 00 15", "current_segment_write_offset = 21"),
    )
    assert_golden(DataAppended(WRITER, 2, NULL_ATTRIBUTE_VALUE, 7, 21), expected)


# ----------------------------------------------------------- live captures (pravega.md#real-client)


def test_captured_hello_payload() -> None:
    assert decode_payload(CommandType.HELLO, bytes.fromhex("0000000f 00000005")) == Hello(15, 5)


def test_captured_setup_append() -> None:
    payload = join(
        ("0000000000000001", "request_id = 1"),
        ("8f576a25573e06684f042d175868ab38", "writer_id"),
        (string(SEGMENT), "segment"),
        ("0000", "delegation_token = ''"),
    )
    assert len(payload) == 44
    assert_golden(SetupAppend(1, CAPTURED_WRITER, SEGMENT, ""), frame(1, payload))


def test_captured_first_write() -> None:
    payload = join(
        ("8f576a25573e06684f042d175868ab38", "writer_id"),
        ("0000000a", "size_of_whole_events = 10"),
        ("0000000a", "data length = 10"),
        ("00000000 00000002 6162", "Event 'ab'"),
        ("00000001", "num_events = 1"),
        ("0000000000000001", "last_event_number = 1"),
        ("0000000000000002", "request_id = 2"),
    )
    assert len(payload) == 54
    cmd = AppendBlockEnd(CAPTURED_WRITER, 10, encode_event(b"ab"), 1, 1, 2)
    assert_golden(cmd, frame(4, payload))


def test_captured_batched_writes() -> None:
    payload = join(
        ("8f576a25573e06684f042d175868ab38", "writer_id"),
        ("00000014", "size_of_whole_events = 20"),
        ("00000014", "data length = 20"),
        ("00000000 00000003 78797a", "Event 'xyz'"),
        ("00000000 00000001 71", "Event 'q'"),
        ("00000002", "num_events = 2"),
        ("0000000000000003", "last_event_number = 3"),
        ("0000000000000003", "request_id = 3"),
    )
    assert len(payload) == 64
    cmd = decode_frame(frame(4, payload))
    assert isinstance(cmd, AppendBlockEnd)
    assert decode_events(cmd.data) == [b"xyz", b"q"]
    assert (cmd.num_events, cmd.last_event_number, cmd.request_id) == (2, 3, 3)
    assert encode_command(cmd) == frame(4, payload)


def test_captured_read_segment() -> None:
    payload = join(
        (string(SEGMENT), "segment"),
        ("0000000000000000", "offset = 0"),
        ("00800000", "suggested_length = 8 MiB"),
        ("0000", "delegation_token = ''"),
        ("000000000000000c", "request_id = 12"),
    )
    assert len(payload) == 40
    assert_golden(ReadSegment(SEGMENT, 0, 8 * 1024 * 1024, "", 12), frame(9, payload))


def test_captured_conditional_block_end() -> None:
    payload = join(
        ("8f576a25573e06684f042d175868ab38", "writer_id"),
        ("0000000000000001", "event_number = 1"),
        ("0000000000000000", "expected_offset = 0"),
        ("00000005 68656c6c6f", "data = 'hello' (raw, no event framing)"),
        ("0000000000000016", "request_id = 22"),
    )
    assert len(payload) == 49
    assert_golden(ConditionalBlockEnd(CAPTURED_WRITER, 1, 0, b"hello", 22), frame(89, payload))


def test_captured_create_table_segment_without_optional_fields() -> None:
    table = "sc/rg1_kvtable/0.#epoch.0"
    payload = join(
        ("0000000000000004", "request_id = 4"),
        (string(table), "segment (25 bytes)"),
        ("0000", "delegation_token = ''; no sorted/key_length/rollover"),
    )
    assert len(payload) == 37
    cmd = decode_frame(frame(70, payload))
    assert cmd == CreateTableSegment(4, table, "", sorted=False, key_length=0)
    # We write every field, as Java does: + sorted:bool + key_length:i32 + rollover:i64.
    assert encode_command(cmd) == frame(70, payload + bytes(1 + 4 + 8))


def test_captured_read_table_entries_delta() -> None:
    # The capture as recorded elides the request id; 5 stands in for it.
    payload = join(
        ("0000000000000005", "request_id"),
        (string("sc/rg1_kvtable/0.#epoch.0"), "segment"),
        ("0000", "delegation_token = ''"),
        ("0000000000000000", "from_position = 0"),
        ("0000000a", "suggested_entry_count = 10"),
    )
    assert len(payload) == 49
    cmd = ReadTableEntriesDelta(5, "sc/rg1_kvtable/0.#epoch.0", "", 0, 10)
    assert_golden(cmd, frame(88, payload))


def test_synchronizer_key_version_must_not_exist() -> None:
    key = join(
        ("00000010", "payload = 4 + 4 + 8"),
        ("00000004", "key length"),
        ("6b657931", "key1"),
        ("ffffffffffffffff", "version = -1 (must not exist)"),
    )
    value = join(("0000000a", "payload = 4 + 6"), ("00000006", "length"), (b"value1".hex(), ""))
    payload = join(
        ("0000000000000009", "request_id = 9"),
        (string("t"), "segment"),
        ("0000", "delegation_token"),
        ("00000001", "one entry"),
    )
    payload += key + value + bytes.fromhex(i64(-1))  # table_segment_offset = -1
    entries = TableEntries(((TableKey(b"key1", NOT_EXISTS), TableValue(b"value1")),))
    assert_golden(UpdateTableEntries(9, "t", "", entries, -1), frame(74, payload))


# -------------------------------------------------------------------------- field rules: strings


def test_string_is_u16_length_and_utf8() -> None:
    cmd = NoSuchSegment(1, "é/∂", "", -1)
    encoded = encode_command(cmd)
    assert encoded[8 + 8 : 8 + 8 + 2] == b"\x00\x06"  # "é" is 2 bytes, "/" 1, "∂" 3
    assert encoded[8 + 10 : 8 + 16] == "é/∂".encode()
    assert decode_frame(encoded) == cmd


def test_string_supplementary_character_written_as_plain_utf8() -> None:
    # The Rust client rejects modified UTF-8, so 4-byte UTF-8 goes out as is.
    encoded = encode_command(NoSuchSegment(1, "\U0001f600", "", -1))
    assert encoded[16:22] == b"\x00\x04" + "\U0001f600".encode()


def test_string_java_modified_utf8_nul_decodes() -> None:
    payload = bytes.fromhex(i64(1)) + b"\x00\x03a\xc0\x80" + b"\x00\x00" + bytes.fromhex(i64(-1))
    # type: ignore[attr-defined]
    assert decode_payload(CommandType.NO_SUCH_SEGMENT, payload).segment == "a\x00"


def test_string_java_modified_utf8_surrogate_pair_decodes() -> None:
    # Java writes each UTF-16 unit of a supplementary character as 3 bytes.
    java = "\ud83d\ude00".encode("utf-8", "surrogatepass")
    assert java == bytes.fromhex("eda0bd edb880")
    payload = bytes.fromhex(i64(1)) + struct.pack(">H", 6) + java + b"\x00\x00"
    cmd = decode_payload(CommandType.NO_SUCH_SEGMENT, payload)
    assert cmd == NoSuchSegment(1, "\U0001f600", "", -1)


def test_string_invalid_bytes_is_remote_error() -> None:
    payload = bytes.fromhex(i64(1)) + b"\x00\x02\xff\xfe"
    with pytest.raises(RemoteProtocolError):
        decode_payload(CommandType.NO_SUCH_SEGMENT, payload)


def test_string_longer_than_u16_is_local_error() -> None:
    with pytest.raises(LocalProtocolError):
        encode_command(NoSuchSegment(1, "x" * 65536))
    assert len(encode_command(NoSuchSegment(1, "x" * 65535, "", -1))) == 8 + 8 + 2 + 65535 + 2 + 8


def test_string_lone_surrogate_is_local_error() -> None:
    with pytest.raises(LocalProtocolError):
        encode_command(NoSuchSegment(1, "\ud800"))


# ----------------------------------------------------------------------- field rules: primitives


def test_uuid_is_most_significant_half_first() -> None:
    encoded = encode_command(DataAppended(WRITER, 1, 0, 1, 1))
    assert encoded[8:24] == bytes.fromhex("00112233445566778899aabbccddeeff")


def test_bool_is_00_or_01() -> None:
    encoded = encode_command(SegmentAttributeUpdated(3, True))
    assert encoded == frame(37, bytes.fromhex(i64(3) + "01"))
    assert decode_frame(frame(37, bytes.fromhex(i64(3) + "00"))) == SegmentAttributeUpdated(
        3, False
    )


def test_bool_other_values_are_refused() -> None:
    with pytest.raises(RemoteProtocolError, match="boolean"):
        decode_frame(frame(37, bytes.fromhex(i64(3) + "02")))


def test_integer_out_of_range_is_local_error() -> None:
    with pytest.raises(LocalProtocolError):
        encode_command(Hello(2**31, 5))
    with pytest.raises(LocalProtocolError):
        encode_command(CreateSegment(1, "s", 0, 300))  # scale_type is one byte


def test_scale_type_is_one_byte_after_target_rate() -> None:
    payload = join(
        (i64(1), "request_id"),
        (string("s"), "segment"),
        (i32(100), "target_rate"),
        ("02", "scale_type = events/s"),
        ("0000", "delegation_token"),
        (i64(0), "rollover_size_bytes"),
    )
    assert_golden(CreateSegment(1, "s", 100, 2, "", 0), frame(20, payload))


# ---------------------------------------------------------------- field rules: optional trailing


def test_read_segment_without_request_id_defaults_to_minus_one() -> None:
    payload = bytes.fromhex(string("s") + i64(0) + i32(10) + "0000")
    assert decode_payload(CommandType.READ_SEGMENT, payload) == ReadSegment("s", 0, 10, "", -1)


def test_append_block_end_without_request_id() -> None:
    payload = WRITER.bytes + bytes.fromhex(i32(0) + i32(0) + i32(1) + i64(1))
    assert decode_payload(CommandType.APPEND_BLOCK_END, payload) == AppendBlockEnd(
        WRITER, 0, b"", 1, 1, -1
    )


def test_stream_segment_info_without_start_offset() -> None:
    payload = bytes.fromhex(i64(1) + string("s") + "01 00 00" + i64(5) + i64(7))
    cmd = decode_payload(CommandType.STREAM_SEGMENT_INFO, payload)
    assert cmd == StreamSegmentInfo(1, "s", True, False, False, 5, 7, 0)
    assert encode_command(cmd)[-8:] == bytes(8)  # start_offset always written


def test_merge_segments_without_attribute_updates() -> None:
    payload = bytes.fromhex(i64(1) + string("t") + string("s") + "0000")
    cmd = decode_payload(CommandType.MERGE_SEGMENTS, payload)
    assert cmd == MergeSegments(1, "t", "s", "", ())
    assert encode_command(cmd) == frame(58, payload + bytes(4))  # Java writes count = 0


def test_merge_segments_with_attribute_updates() -> None:
    update = ConditionalAttributeUpdate(WRITER, ConditionalAttributeUpdate.REPLACE_IF_EQUALS, 5, 4)
    payload = bytes.fromhex(i64(1) + string("t") + string("s") + "0000" + i32(1))
    payload += WRITER.bytes + b"\x04" + bytes.fromhex(i64(5) + i64(4))  # 33 bytes
    assert_golden(MergeSegments(1, "t", "s", "", (update,)), frame(58, payload))


def test_update_table_entries_without_offset_is_unconditional() -> None:
    payload = bytes.fromhex(i64(1) + string("t") + "0000" + i32(0))
    cmd = decode_payload(CommandType.UPDATE_TABLE_ENTRIES, payload)
    assert cmd == UpdateTableEntries(1, "t", "", TableEntries(()), -1)


def test_optional_i64_with_too_few_bytes_left_takes_default() -> None:
    # Java reads an optional i64 only if 8 bytes remain; 3 stray bytes are ignored.
    payload = bytes.fromhex(string("s") + i64(0) + i32(10) + "0000" + "010203")
    assert decode_payload(CommandType.READ_SEGMENT, payload) == ReadSegment("s", 0, 10, "", -1)


def test_error_reply_trailing_fields_are_optional() -> None:
    payload = bytes.fromhex(i64(4) + string("s"))
    assert decode_payload(CommandType.NO_SUCH_SEGMENT, payload) == NoSuchSegment(4, "s", "", -1)


def test_trailing_bytes_after_last_field_are_ignored() -> None:
    payload = bytes.fromhex("0000000f 00000005 deadbeef")
    assert decode_payload(CommandType.HELLO, payload) == Hello(15, 5)


def test_read_table_keys_with_only_continuation_token() -> None:
    payload = bytes.fromhex(i64(1) + string("t") + "0000" + i32(10) + i32(2) + "abcd")
    cmd = decode_payload(CommandType.READ_TABLE_KEYS, payload)
    assert cmd == ReadTableKeys(1, "t", "", 10, TableIteratorArgs(b"\xab\xcd"))
    # Java writes all four parts (prefix filter always empty).
    assert encode_command(cmd) == frame(83, payload + bytes(12))


# --------------------------------------------------------------------------- field rules: tables


def test_table_key_layout_with_redundant_payload() -> None:
    payload = join(
        (i64(1), "request_id"),
        (string("t"), "segment"),
        ("0000", "delegation_token"),
        (i32(1), "one key"),
        (i32(4 + 2 + 8), "payload = 4 + len(key) + 8"),
        (i32(2), "key length"),
        ("6b31", "k1"),
        (i64(NO_VERSION), "version = NO_VERSION"),
    )
    assert_golden(ReadTable(1, "t", "", (TableKey(b"k1"),)), frame(78, payload))


def test_table_key_payload_hint_is_not_relied_upon() -> None:
    payload = bytes.fromhex(i64(1) + string("t") + "0000" + i32(1) + i32(999) + i32(1) + "61")
    payload += bytes.fromhex(i64(3))
    cmd = decode_payload(CommandType.READ_TABLE, payload)
    assert cmd == ReadTable(1, "t", "", (TableKey(b"a", 3),))


def test_empty_table_key_is_written_without_version() -> None:
    # Java: payload 12, length 0, and no version bytes.
    cmd = ReadTable(1, "t", "", (TableKey(b""),))
    expected = bytes.fromhex(i64(1) + string("t") + "0000" + i32(1) + i32(12) + i32(0))
    assert_golden(cmd, frame(78, expected))


def test_empty_table_key_with_version_cannot_be_encoded() -> None:
    with pytest.raises(LocalProtocolError, match="empty TableKey"):
        encode_command(ReadTable(1, "t", "", (TableKey(b"", 5),)))


def test_empty_table_value_layout() -> None:
    # An absent key in a TableRead: version -1 and an empty value (payload 4, length 0).
    entries = TableEntries(((TableKey(b"k", NOT_EXISTS), TableValue(b"")),))
    cmd = TableEntriesDeltaRead(2, "t", entries, False, True, 40)
    payload = join(
        (i64(2), "request_id"),
        (string("t"), "segment"),
        (i32(1), "one entry"),
        (i32(13) + i32(1) + "6b" + i64(-1), "key 'k', version -1"),
        (i32(4) + i32(0), "empty value"),
        ("00", "should_clear"),
        ("01", "reached_end"),
        (i64(40), "last_position"),
    )
    assert_golden(cmd, frame(87, payload))


def test_negative_list_count_is_remote_error() -> None:
    payload = bytes.fromhex(i64(1) + string("t") + "0000" + i32(-1))
    with pytest.raises(RemoteProtocolError, match="count"):
        decode_payload(CommandType.READ_TABLE, payload)


def test_huge_list_count_is_remote_error_without_allocating() -> None:
    payload = bytes.fromhex(i64(1) + i32(2**31 - 1))
    with pytest.raises(RemoteProtocolError, match="count"):
        decode_payload(CommandType.TABLE_ENTRIES_UPDATED, payload)


# -------------------------------------------------------------------------- field rules: replies


def test_invalid_event_number_uses_java_layout() -> None:
    payload = join(
        ("00112233445566778899aabbccddeeff", "writer_id"),
        (i64(9), "request_id (the Rust client reads this as its event number)"),
        (string("stale"), "server_stack_trace"),
        (i64(41), "event_number (ignored by the Rust client)"),
    )
    assert_golden(InvalidEventNumber(WRITER, 9, "stale", 41), frame(55, payload))


def test_segments_batch_merged_interleaves_sources_and_offsets() -> None:
    payload = join(
        (i64(1), "request_id"),
        (string("t"), "target"),
        (i32(2), "count"),
        (string("a") + i64(10), "source a, offset 10"),
        (string("b") + i64(20), "source b, offset 20"),
    )
    assert_golden(SegmentsBatchMerged(1, "t", ("a", "b"), (10, 20)), frame(91, payload))


def test_segments_batch_merged_needs_one_offset_per_source() -> None:
    with pytest.raises(LocalProtocolError):
        encode_command(SegmentsBatchMerged(1, "t", ("a",), ()))


def test_auth_token_check_failed_error_code() -> None:
    payload = bytes.fromhex(i64(1) + "0000" + i32(1))
    assert_golden(
        AuthTokenCheckFailed(1, "", AuthTokenCheckFailed.TOKEN_EXPIRED), frame(60, payload)
    )
    assert decode_payload(60, bytes.fromhex(i64(1))) == AuthTokenCheckFailed(1, "", -1)


def test_segment_is_truncated_field_order() -> None:
    payload = bytes.fromhex(i64(1) + string("s") + i64(100) + "0000" + i64(50))
    assert_golden(SegmentIsTruncated(1, "s", 100, "", 50), frame(56, payload))


def test_segment_read_layout() -> None:
    payload = bytes.fromhex(string("s") + i64(8) + "01" + "00" + i32(2) + "6162" + i64(12))
    assert_golden(SegmentRead("s", 8, True, False, b"ab", 12), frame(10, payload))


def test_append_setup_field_order_differs_from_setup_append() -> None:
    payload = bytes.fromhex(i64(6) + string("s")) + WRITER.bytes + bytes.fromhex(i64(-5))
    assert_golden(AppendSetup(6, "s", WRITER, -5), frame(2, payload))


def test_storage_chunks_listed_layout() -> None:
    chunk = ChunkInfo(10, 9, 0, "c0", True)
    payload = bytes.fromhex(i64(1) + i32(1) + i64(10) + i64(9) + i64(0) + string("c0") + "01")
    assert_golden(StorageChunksListed(1, (chunk,)), frame(-6, payload))


# --------------------------------------------------------------------------- appends and events


def test_keep_alive_is_empty() -> None:
    assert_golden(KeepAlive(), bytes.fromhex("00000064 00000000"))


def test_padding_is_length_zero_bytes() -> None:
    assert_golden(Padding(5), bytes.fromhex("ffffffff 00000005 0000000000"))


def test_conditional_append_embeds_an_event() -> None:
    payload = WRITER.bytes + bytes.fromhex(i64(3) + i64(100) + i32(0) + i32(1) + "7a" + i64(4))
    assert_golden(ConditionalAppend(WRITER, 3, 100, Event(b"z"), 4), frame(5, payload))


def test_conditional_append_event_of_other_type_is_refused() -> None:
    payload = WRITER.bytes + bytes.fromhex(i64(3) + i64(100) + i32(7) + i32(1) + "7a" + i64(4))
    with pytest.raises(RemoteProtocolError, match="Event"):
        decode_payload(CommandType.CONDITIONAL_APPEND, payload)


def test_event_framing_helpers() -> None:
    assert encode_event(b"ab") == bytes.fromhex("00000000 00000002 6162")
    assert decode_events(encode_event(b"ab") + encode_event(b"")) == [b"ab", b""]
    with pytest.raises(RemoteProtocolError):
        decode_events(encode_event(b"ab")[:-1])
    with pytest.raises(RemoteProtocolError):
        decode_events(bytes.fromhex("00000001 00000000"))


# --------------------------------------------------------------------------- framing


def test_every_type_code_has_a_codec() -> None:
    for code in CommandType:
        try:
            cmd = decode_payload(code, b"")
        except RemoteProtocolError as exc:
            assert "unknown" not in str(exc)
        else:
            assert cmd.type == code


def test_unknown_type_code_is_remote_error_from_the_header() -> None:
    buffer = ReceiveBuffer(1024)
    buffer.feed(bytes.fromhex("00000006 00000010"))  # there is no code 6; payload not sent
    with pytest.raises(RemoteProtocolError, match="unknown command type code 6"):
        decode_command(buffer)


def test_negative_length_is_remote_error() -> None:
    buffer = ReceiveBuffer(1024)
    buffer.feed(bytes.fromhex("00000064 ffffffff"))
    with pytest.raises(RemoteProtocolError, match="negative"):
        decode_command(buffer)


def test_frame_over_limit_is_refused_from_the_header() -> None:
    buffer = ReceiveBuffer(1024)
    buffer.feed(struct.pack(">ii", 10, MAX_FRAME_BYTES - 8 + 1))
    with pytest.raises(FrameTooLarge) as info:
        decode_command(buffer)
    assert info.value.limit_bytes == MAX_FRAME_BYTES == 0x00FFFFFF
    assert info.value.got_bytes == MAX_FRAME_BYTES + 1


def test_frame_at_limit_is_accepted_header() -> None:
    buffer = ReceiveBuffer(1024)
    buffer.feed(struct.pack(">ii", 10, MAX_FRAME_BYTES - 8))
    assert decode_command(buffer) is None  # waits for the payload


def test_encoding_over_limit_is_local_error() -> None:
    with pytest.raises(LocalProtocolError, match="exceeds"):
        encode_command(SegmentRead("s", 0, False, False, bytes(100)), max_frame_bytes=64)


def test_partial_frame_waits_and_keeps_bytes() -> None:
    encoded = encode_command(Hello(15, 5)) + encode_command(KeepAlive())
    buffer = ReceiveBuffer(1024)
    for cut in range(len(encoded)):
        buffer = ReceiveBuffer(1024)
        buffer.feed(encoded[:cut])
        got = []
        while (cmd := decode_command(buffer)) is not None:
            got.append(cmd)
        buffer.feed(encoded[cut:])
        while (cmd := decode_command(buffer)) is not None:
            got.append(cmd)
        assert got == [Hello(15, 5), KeepAlive()]
        assert not buffer


def test_truncated_payload_is_remote_error() -> None:
    with pytest.raises(RemoteProtocolError, match="short"):
        decode_frame(frame(1, bytes(10)))


def test_decode_frame_needs_exactly_one_frame() -> None:
    with pytest.raises(RemoteProtocolError):
        decode_frame(encode_command(KeepAlive()) * 2)
    with pytest.raises(RemoteProtocolError):
        decode_frame(encode_command(Hello(1, 1))[:-1])


def test_segments_batch_merged_payload_ends_early() -> None:
    with pytest.raises(RemoteProtocolError):
        decode_payload(
            CommandType.SEGMENTS_BATCH_MERGED, bytes.fromhex(i64(1) + string("t") + i32(1))
        )


def test_wrong_field_type_is_local_error() -> None:
    with pytest.raises(LocalProtocolError):
        encode_command(SegmentRead("s", 0, False, False, "not bytes"))  # type: ignore[arg-type]


def test_padding_length_must_be_sane() -> None:
    with pytest.raises(LocalProtocolError):
        encode_command(Padding(-1))
    with pytest.raises(LocalProtocolError):
        encode_command(Padding(MAX_FRAME_BYTES + 1))


def test_decode_payload_of_unknown_type_code() -> None:
    with pytest.raises(RemoteProtocolError, match="unknown command type code 6"):
        decode_payload(6, b"")


def test_negative_byte_array_length_is_remote_error() -> None:
    payload = bytes.fromhex(string("s") + i64(0) + "00 00" + i32(-1))
    with pytest.raises(RemoteProtocolError, match="negative length"):
        decode_payload(CommandType.SEGMENT_READ, payload)


def test_request_id_and_segment_helpers() -> None:
    assert ReadSegment("s", 0, 1, "", 12).request_id_or_default == 12
    assert Hello(15, 5).request_id_or_default == 0
    assert KeepAlive().request_id_or_default == -1
    assert Padding(1).request_id_or_default == -1
    assert ReadSegment("s", 0, 1).segment_or_none == "s"
    assert MergeSegments(1, "t", "s").segment_or_none == "t"
    assert SegmentIsTruncated(1, "x", 0).segment_or_none == "x"
    assert Hello(15, 5).segment_or_none is None


def test_invalid_event_number_trailing_fields_are_optional() -> None:
    payload = WRITER.bytes + bytes.fromhex(i64(9))
    assert decode_payload(CommandType.INVALID_EVENT_NUMBER, payload) == InvalidEventNumber(
        WRITER, 9, "", -1
    )


# --------------------------------------------------------------------------- large frames, no copy


def test_large_append_data_is_handed_over_without_a_copy() -> None:
    """A large AppendBlockEnd's data is a read-only view of the received frame,
    the frame after it in the same buffer still decodes, and the view does not
    change when more bytes arrive (the buffer gave that memory away)."""
    writer = UUID(int=7)
    data = bytes(range(256)) * (HANDOVER_MIN_BYTES // 256 + 3)
    big = encode_command(AppendBlockEnd(writer, len(data), data, 3, 9, 11))
    small = encode_command(KeepAlive())
    buffer = ReceiveBuffer(max_buffered_bytes=len(big) * 2)
    buffer.feed(big + small[:5])  # the next frame's first bytes arrive with it
    cmd = decode_command(buffer)
    assert isinstance(cmd, AppendBlockEnd)
    assert isinstance(cmd.data, memoryview) and cmd.data.readonly
    assert cmd.data == data and (cmd.num_events, cmd.last_event_number) == (3, 9)
    assert decode_command(buffer) is None  # the KeepAlive is incomplete
    buffer.feed(small[5:] + b"\xff" * 1000)
    assert decode_command(buffer) == KeepAlive()
    assert cmd.data == data
    with pytest.raises(TypeError):
        cmd.data[0] = 0  # type: ignore[index]


def test_small_append_data_is_bytes() -> None:
    buffer = ReceiveBuffer(max_buffered_bytes=1 << 20)
    buffer.feed(encode_command(AppendBlockEnd(UUID(int=1), 5, b"12345", 1, 1, 2)))
    cmd = decode_command(buffer)
    assert isinstance(cmd, AppendBlockEnd) and type(cmd.data) is bytes and cmd.data == b"12345"
    assert not buffer


def test_large_frame_followed_by_more_than_itself_is_copied() -> None:
    """Handing over would mean copying the (bigger) rest: the frame is copied instead."""
    data = b"x" * HANDOVER_MIN_BYTES
    frame = encode_command(AppendBlockEnd(UUID(int=1), len(data), data, 1, 1, 2))
    buffer = ReceiveBuffer(max_buffered_bytes=len(frame) * 3)
    buffer.feed(frame * 3)
    for _ in range(3):
        cmd = decode_command(buffer)
        assert isinstance(cmd, AppendBlockEnd) and cmd.data == data
    assert not buffer


def test_an_adopted_frame_still_exported_is_never_resized() -> None:
    """A frame received straight into its own buffer is adopted while the
    transport still holds a view of that buffer; decoding a frame too small to
    hand over must copy it out without resizing the buffer (which would raise)."""
    data = b"y" * (HANDOVER_MIN_BYTES - 100)
    frame = bytearray(encode_command(AppendBlockEnd(UUID(int=1), len(data), data, 1, 1, 2)))
    held = memoryview(frame)[10:]  # the receiving transport's view
    buffer = ReceiveBuffer(max_buffered_bytes=len(frame))
    buffer.adopt(frame)
    cmd = decode_command(buffer)
    assert isinstance(cmd, AppendBlockEnd) and cmd.data == data
    assert not buffer
    held.release()


# --------------------------------------------------------------------------- encode_split


@pytest.mark.parametrize("size", [0, 1, 65_536, 2 * 1024 * 1024 + 3])
def test_encode_split_frames_data_the_caller_sends(size: int) -> None:
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    reply = p.SegmentRead("scope/stream/0.#epoch.0", 12_345, True, False, b"", 77)
    prefix, suffix = p.encode_split(reply, size)
    whole = p.encode_command(
        p.SegmentRead("scope/stream/0.#epoch.0", 12_345, True, False, data, 77)
    )
    assert prefix + data + suffix == whole


def test_encode_split_refuses_a_command_without_an_empty_bytes_field() -> None:
    with pytest.raises(LocalProtocolError):
        p.encode_split(p.SegmentRead("s", 0, True, False, b"x", 1), 10)
    with pytest.raises(LocalProtocolError):
        p.encode_split(p.KeepAlive(), 10)


def test_encode_split_refuses_a_frame_over_the_limit() -> None:
    with pytest.raises(LocalProtocolError):
        p.encode_split(p.SegmentRead("s", 0, True, False, b"", 1), 100, max_frame_bytes=64)


def test_send_split_checks_the_state_like_send() -> None:
    server = p.PravegaConnection(p.Role.SERVER)
    with pytest.raises(LocalProtocolError):  # no Hello yet: no replies
        server.send_split(p.SegmentRead("s", 0, True, False, b"", 1), 10)
    server.receive_data(p.encode_command(p.Hello(p.WIRE_VERSION, p.OLDEST_COMPATIBLE_VERSION)))
    assert list(server.events())
    prefix, suffix = server.send_split(p.SegmentRead("s", 0, True, False, b"", 1), 3)
    assert p.decode_frame(prefix + b"abc" + suffix) == p.SegmentRead("s", 0, True, False, b"abc", 1)


def test_frame_pool_reuses_only_unreferenced_buffers_within_its_bounds() -> None:
    pool = FramePool(max_buffers=2, max_bytes=300)
    frame = pool.get(100)
    first = id(frame)
    view = memoryview(frame)[10:]  # e.g. append data handed to the store
    del frame
    other = pool.get(100)
    assert id(other) != first  # a view still refers to the first buffer
    del other
    view.release()
    assert id(pool.get(100)) == first  # nothing refers to it any more
    assert (pool.allocated, pool.reused) == (2, 1)
    pool.get(250)  # the two kept hold 200 of 300 bytes: handed out, not kept...
    pool.get(250)  # ...so the next one is allocated again
    assert (pool.allocated, pool.reused) == (4, 1)
