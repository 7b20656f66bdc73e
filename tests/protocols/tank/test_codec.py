"""TANK codec: golden bytes from TANK's worked example (tank.md#worked-example) and
per-message examples, built field by field, and one test per field rule."""

from __future__ import annotations

import struct

import cramjam
import pytest

from headrace.errors import LocalProtocolError, RemoteProtocolError
from headrace.protocols.tank import codec
from headrace.protocols.tank.bundle import (
    decode_bundle,
    decode_bundle_header,
    decode_chunk,
    encode_bundle,
    encode_chunk_entry,
)
from headrace.protocols.tank.codec import (
    decode_request,
    decode_response,
    decode_varint,
    encode,
    encode_varint,
)
from headrace.protocols.tank.commands import (
    SEQ_NUM_TAIL,
    BundleCodec,
    BundleMessage,
    Consume,
    ConsumeError,
    ConsumePartition,
    ConsumePartitionResult,
    ConsumeResponse,
    ConsumeTopic,
    ConsumeTopicResult,
    ConsumeUnknownTopic,
    CreateTopic,
    CreateTopicResponse,
    CreateTopicResult,
    DecodedChunk,
    DiscoverPartitions,
    DiscoverPartitionsError,
    DiscoverPartitionsResponse,
    DiscoverTopics,
    DiscoverTopicsResponse,
    DiscoverTopology,
    DiscoverTopologyResponse,
    Endpoint,
    MessageType,
    PartitionSeqNums,
    Ping,
    Produce,
    ProduceError,
    ProducePartition,
    ProducePartitionResult,
    ProduceResponse,
    ProduceTopic,
    ProduceTopicResult,
    ProduceWithSeqnum,
    ReloadConf,
    ReloadConfResponse,
    ReloadConfResult,
    Status,
    StatusCluster,
    StatusDetails,
    StatusResponse,
    TopicInfo,
    TopologyNode,
)


def h(text: str) -> bytes:
    """Hex with spaces and newlines allowed."""
    return bytes.fromhex("".join(text.split()))


def u16(n: int) -> bytes:
    return struct.pack("<H", n)


def u32(n: int) -> bytes:
    return struct.pack("<I", n)


def u64(n: int) -> bytes:
    return struct.pack("<Q", n)


def str8(data: bytes) -> bytes:
    return bytes([len(data)]) + data


def frame(msg_id: int, payload: bytes) -> bytes:
    return bytes([msg_id]) + u32(len(payload)) + payload


def split(frame_bytes: bytes) -> tuple[int, bytes]:
    msg_id, size = codec.decode_frame_header(frame_bytes[:5])
    assert size == len(frame_bytes) - 5
    return msg_id, frame_bytes[5:]


TS = 1_700_000_000_000  # 0x0000018BCFE56800 ms

# ---------------------------------------------------------- worked example (tank.md#worked-example)

# 12.1: the 26-byte bundle, field by field.
WORKED_BUNDLE = (
    b"\x08"  # bundle flags: 2 messages in bits 2-5, codec 0, not sparse
    + b"\x01"  # message 1 flags: HaveKey
    + u64(TS)  # message 1 timestamp (00 68 e5 cf 8b 01 00 00)
    + str8(b"k1")  # key
    + b"\x05"  # content length (varint)
    + b"hello"
    + b"\x02"  # message 2 flags: UseLastSpecifiedTS, no key
    + b"\x05"  # content length
    + b"world"
)
WORKED_MESSAGES = [BundleMessage(b"hello", TS, b"k1"), BundleMessage(b"world", TS)]
WORKED_PRODUCE = Produce(
    request_id=1,
    topics=(ProduceTopic("logs", (ProducePartition(0, WORKED_BUNDLE),)),),
    client_version=2,
    client_id=b"py",
)


def test_worked_bundle_is_26_bytes_as_in_the_spec() -> None:
    assert len(WORKED_BUNDLE) == 26
    assert h("08 01 0068e5cf8b010000 026b31 05 68656c6c6f 02 05 776f726c64") == WORKED_BUNDLE
    assert encode_bundle(WORKED_MESSAGES) == WORKED_BUNDLE


def test_worked_bundle_decodes_with_seq_nums_from_outside() -> None:
    assert decode_bundle(WORKED_BUNDLE, 1) == (
        BundleMessage(b"hello", TS, b"k1", seq_num=1),
        BundleMessage(b"world", TS, b"", seq_num=2),
    )


def test_worked_produce_request_is_55_bytes() -> None:
    payload = (
        u16(2)  # client version
        + u32(1)  # request id
        + str8(b"py")  # client id
        + b"\x00"  # required acks
        + u32(0)  # ack timeout
        + b"\x01"  # 1 topic
        + str8(b"logs")
        + b"\x01"  # 1 partition
        + u16(0)  # partition 0
        + b"\x1a"  # bundle length 26 (varint)
        + WORKED_BUNDLE
    )
    expected = frame(0x01, payload)
    assert len(payload) == 50
    assert len(expected) == 55
    assert expected == h(
        """01 32000000 0200 01000000 027079 00 00000000 01 046c6f6773 01 0000 1a
           08 01 0068e5cf8b010000 026b31 05 68656c6c6f 02 05 776f726c64"""
    )
    assert encode(WORKED_PRODUCE) == expected
    assert decode_request(*split(expected)) == WORKED_PRODUCE


def test_worked_produce_response() -> None:
    expected = frame(
        0x01,  # msg id Produce
        u32(1)  # request id
        + b"\x00",  # logs/0: OK
    )
    assert expected == h("01 05000000 01000000 00")
    response = ProduceResponse(1, (ProduceTopicResult("logs", (ProducePartitionResult(0),)),))
    assert encode(response) == expected
    assert decode_response(*split(expected), WORKED_PRODUCE) == response


def test_greeting_is_an_empty_ping_frame() -> None:
    assert encode(Ping()) == h("03 00000000")
    assert decode_response(0x03, b"") == Ping()
    assert decode_request(0x03, b"") == Ping()


WORKED_CONSUME = Consume(
    request_id=2,
    topics=(ConsumeTopic("logs", (ConsumePartition(0, seq_num=0, fetch_size=4096),)),),
)


def test_worked_consume_request_is_45_bytes() -> None:
    expected = frame(
        0x02,
        u16(2)  # client version (< 3: no consume_flags byte)
        + u32(2)  # request id
        + str8(b"")  # client id
        + u64(0)  # max wait ms
        + u32(0)  # min bytes
        + b"\x01"  # 1 topic
        + str8(b"logs")
        + b"\x01"  # 1 partition
        + u16(0)  # partition 0
        + u64(0)  # seq num 0: from the beginning
        + u32(4096),  # fetch size
    )
    assert len(expected) == 45
    assert expected == h(
        "02 28000000 0200 02000000 00 0000000000000000 00000000 01 046c6f6773 01 0000 "
        "0000000000000000 00100000"
    )
    assert encode(WORKED_CONSUME) == expected
    assert decode_request(*split(expected)) == WORKED_CONSUME


# varint(26) + bundle: also the segment file (tank.md#chunks)
WORKED_CHUNK = b"\x1a" + WORKED_BUNDLE


def test_worked_consume_response_is_70_bytes() -> None:
    header = (
        u32(2)  # request id
        + b"\x01"  # 1 topic
        + str8(b"logs")
        + b"\x01"  # 1 partition
        + u16(0)  # partition 0
        + b"\x00"  # errorOrFlags
        + u64(1)  # base seq num
        + u64(2)  # high-water mark
        + u32(27)  # chunk length
    )
    assert len(header) == 34
    expected = frame(0x02, u32(len(header)) + header + WORKED_CHUNK)
    assert len(expected) == 70
    assert expected == h(
        """02 41000000 22000000 02000000 01 046c6f6773 01 0000 00
           0100000000000000 0200000000000000 1b000000
           1a 08 01 0068e5cf8b010000 026b31 05 68656c6c6f 02 05 776f726c64"""
    )
    response = ConsumeResponse(
        2,
        (
            ConsumeTopicResult(
                "logs",
                (ConsumePartitionResult(0, ConsumeError.OK, 1, 2, WORKED_CHUNK),),
            ),
        ),
    )
    assert encode(response) == expected
    assert decode_response(*split(expected)) == response


def test_worked_chunk_decodes_to_seq_nums_1_and_2() -> None:
    assert encode_chunk_entry(WORKED_BUNDLE) == WORKED_CHUNK
    decoded = decode_chunk(WORKED_CHUNK, 1, min_seq_num=0, high_water_mark=2)
    assert decoded.messages == (
        BundleMessage(b"hello", TS, b"k1", 1),
        BundleMessage(b"world", TS, b"", 2),
    )
    assert decoded.next_seq_num == 3
    assert decoded.truncated_entry_bytes is None


# --------------------------------------------------------------------- varints (tank.md#primitives)


@pytest.mark.parametrize(
    ("value", "encoded"),
    [
        (0, "00"),
        (26, "1a"),
        (127, "7f"),
        (128, "80 01"),
        (273, "91 02"),
        (300, "ac 02"),
        (16384, "80 80 01"),
        (2**32 - 1, "ff ff ff ff 0f"),
    ],
)
def test_varint_table(value: int, encoded: str) -> None:
    assert encode_varint(value) == h(encoded)
    assert decode_varint(h(encoded)) == (value, len(h(encoded)))


def test_varint_non_canonical_form_is_accepted() -> None:
    assert decode_varint(h("80 00")) == (0, 2)


def test_varint_longer_than_5_bytes_is_rejected() -> None:
    with pytest.raises(RemoteProtocolError, match="longer than 5"):
        decode_varint(h("80 80 80 80 80 01"))


def test_varint_above_32_bits_is_rejected() -> None:
    with pytest.raises(RemoteProtocolError, match="above 32 bits"):
        decode_varint(h("ff ff ff ff 1f"))


def test_varint_truncated_is_rejected() -> None:
    with pytest.raises(RemoteProtocolError, match="truncated"):
        decode_varint(h("80 80"))


@pytest.mark.parametrize("value", [-1, 2**32])
def test_varint_out_of_range_cannot_be_encoded(value: int) -> None:
    with pytest.raises(LocalProtocolError):
        encode_varint(value)


def test_str8_holds_at_most_255_bytes() -> None:
    long_name = "x" * 255
    decoded = decode_request(*split(encode(ReloadConf(1, long_name, 0))))
    assert decoded == ReloadConf(1, long_name, 0)
    with pytest.raises(LocalProtocolError, match="topic length"):
        encode(ReloadConf(1, "x" * 256, 0))


def test_topic_names_survive_any_bytes() -> None:
    payload = u32(1) + str8(b"\xff\xfe") + u16(3)
    request = decode_request(0x08, payload)
    assert isinstance(request, ReloadConf)
    assert encode(request)[5:] == payload


def test_topic_name_that_cannot_be_encoded_is_a_local_error() -> None:
    with pytest.raises(LocalProtocolError, match="cannot be encoded"):
        encode(ReloadConf(1, "\ud800", 0))


def test_endpoint_address_is_in_network_order_and_port_little_endian() -> None:
    response = ProduceResponse(
        7,
        (
            ProduceTopicResult(
                "logs",
                (ProducePartitionResult(0, ProduceError.NOT_LEADER, Endpoint("127.0.0.1", 11011)),),
            ),
        ),
    )
    assert encode(response)[5:] == u32(7) + b"\xfc" + h("7f000001") + u16(11011)


def test_endpoint_address_must_be_ipv4() -> None:
    with pytest.raises(LocalProtocolError, match="endpoint"):
        encode(
            ProduceResponse(
                7,
                (
                    ProduceTopicResult(
                        "t",
                        (ProducePartitionResult(0, ProduceError.NOT_LEADER, Endpoint("::1", 1)),),
                    ),
                ),
            )
        )


@pytest.mark.parametrize("value", [-1, 2**32])
def test_u32_field_out_of_range_is_a_local_error(value: int) -> None:
    with pytest.raises(LocalProtocolError, match="request_id"):
        encode(Status(value))


# ------------------------------------------------------------------------- frames (tank.md#framing)


def test_frame_header_is_id_then_little_endian_size() -> None:
    assert codec.encode_frame(0x0A, b"abc") == h("0a 03000000") + b"abc"
    assert codec.decode_frame_header(h("0a 03000000")) == (0x0A, 3)


def test_frame_header_must_be_5_bytes() -> None:
    with pytest.raises(LocalProtocolError):
        codec.decode_frame_header(b"\x01")


@pytest.mark.parametrize("msg_id", [0x00, 0x04, 0x09, 0x0D, 0xFF])
def test_broker_rejects_obsolete_cluster_and_unknown_ids(msg_id: int) -> None:
    with pytest.raises(RemoteProtocolError, match="not a request"):
        decode_request(msg_id, b"")


def test_client_rejects_produce_with_seqnum_as_response_id() -> None:
    with pytest.raises(RemoteProtocolError, match="not a response"):
        decode_response(0x05, b"")


def test_ping_with_payload_is_malformed() -> None:
    with pytest.raises(RemoteProtocolError, match="trailing"):
        decode_request(0x03, b"\x00")


def test_trailing_bytes_after_a_request_are_malformed() -> None:
    with pytest.raises(RemoteProtocolError, match="trailing"):
        decode_request(0x0A, u32(1) + b"\x00")


def test_truncated_request_is_malformed() -> None:
    with pytest.raises(RemoteProtocolError, match="truncated"):
        decode_request(0x0A, b"\x01\x00")


def test_response_msg_ids() -> None:
    assert codec.response_type_for(WORKED_PRODUCE) is MessageType.PRODUCE
    assert codec.response_type_for(ProduceWithSeqnum(1, ())) is MessageType.PRODUCE
    assert codec.response_type_for(WORKED_CONSUME) is MessageType.CONSUME
    assert codec.message_type(ProduceResponse(1, ())) is MessageType.PRODUCE
    assert codec.message_type(Ping()) is MessageType.PING
    with pytest.raises(LocalProtocolError):
        codec.message_type(object())  # type: ignore[arg-type]
    with pytest.raises(LocalProtocolError):
        encode(object())  # type: ignore[arg-type]


def test_response_request_id_of_consume_is_after_header_length() -> None:
    assert codec.response_request_id(0x02, u32(34) + u32(9)) == 9
    assert codec.response_request_id(0x07, u32(9)) == 9
    with pytest.raises(RemoteProtocolError):
        codec.response_request_id(0x02, u32(34))


# ------------------------------------------------------------------------ produce (tank.md#produce)


def test_produce_with_seqnum_puts_first_seq_num_between_length_and_bundle() -> None:
    request = ProduceWithSeqnum(
        3, (ProduceTopic("logs", (ProducePartition(0, WORKED_BUNDLE, first_seq_num=100),)),)
    )
    expected = frame(
        0x05,
        u16(2)
        + u32(3)
        + str8(b"")
        + b"\x00"
        + u32(0)
        + b"\x01"
        + str8(b"logs")
        + b"\x01"
        + u16(0)
        + b"\x1a"  # bundle length: 26, the u64 below is not counted
        + u64(100)  # first seq num
        + WORKED_BUNDLE,
    )
    assert encode(request) == expected
    assert decode_request(*split(expected)) == request


def test_plain_produce_cannot_carry_a_first_seq_num() -> None:
    request = Produce(3, (ProduceTopic("logs", (ProducePartition(0, b"x", first_seq_num=5),)),))
    with pytest.raises(LocalProtocolError, match="ProduceWithSeqnum"):
        encode(request)


def test_produce_bundle_longer_than_payload_is_malformed() -> None:
    payload = encode(WORKED_PRODUCE)[5:-1]
    with pytest.raises(RemoteProtocolError, match="truncated"):
        decode_request(0x01, payload)


TWO_TOPICS = Produce(
    13,
    (
        ProduceTopic("nope", (ProducePartition(0, b"b"), ProducePartition(1, b"b"))),
        ProduceTopic("logs", (ProducePartition(0, b"b"), ProducePartition(9, b"b"))),
    ),
)


def test_produce_response_collapses_unknown_topic_to_one_byte() -> None:
    expected = h("01 07000000 0d000000 ff 00 01")  # TANK example (tank.md#produce)
    response = ProduceResponse(
        13,
        (
            ProduceTopicResult("nope", (), ProduceError.UNKNOWN_TOPIC),
            ProduceTopicResult(
                "logs",
                (
                    ProducePartitionResult(0),
                    ProducePartitionResult(9, ProduceError.UNKNOWN_PARTITION),
                ),
            ),
        ),
    )
    assert encode(response) == expected
    assert decode_response(*split(expected), TWO_TOPICS) == response


def test_produce_response_read_only_is_topic_level() -> None:
    payload = u32(13) + b"\xfe" + b"\xfe"
    response = decode_response(0x01, payload, TWO_TOPICS)
    assert isinstance(response, ProduceResponse)
    assert [t.error for t in response.topics] == [ProduceError.READ_ONLY] * 2


def test_produce_response_topic_code_after_partition_code_is_malformed() -> None:
    with pytest.raises(RemoteProtocolError, match="after a partition-level"):
        decode_response(0x01, u32(13) + b"\xff" + b"\x00\xff", TWO_TOPICS)


def test_produce_response_unknown_code_is_malformed() -> None:
    with pytest.raises(RemoteProtocolError, match="unknown code 0x05"):
        decode_response(0x01, u32(13) + b"\xff" + b"\x00\x05", TWO_TOPICS)


def test_produce_response_topic_with_no_partitions_writes_nothing() -> None:
    request = Produce(1, (ProduceTopic("a", ()), ProduceTopic("b", (ProducePartition(0, b"x"),))))
    response = decode_response(0x01, u32(1) + b"\x00", request)
    assert response == ProduceResponse(
        1, (ProduceTopicResult("a"), ProduceTopicResult("b", (ProducePartitionResult(0),)))
    )


def test_produce_response_needs_its_request() -> None:
    with pytest.raises(LocalProtocolError, match="with its request"):
        decode_response(0x01, u32(1))


@pytest.mark.parametrize(
    "topic",
    [
        ProduceTopicResult("t", (), ProduceError.IO_FAULT),
        ProduceTopicResult("t", (ProducePartitionResult(0),), ProduceError.UNKNOWN_TOPIC),
        ProduceTopicResult("t", (ProducePartitionResult(0, ProduceError.UNKNOWN_TOPIC),)),
        ProduceTopicResult("t", (ProducePartitionResult(0, ProduceError.NOT_LEADER),)),
        ProduceTopicResult("t", (ProducePartitionResult(0, leader=Endpoint("1.2.3.4", 1)),)),
    ],
)
def test_produce_response_that_the_wire_cannot_express_is_a_local_error(
    topic: ProduceTopicResult,
) -> None:
    with pytest.raises(LocalProtocolError):
        encode(ProduceResponse(1, (topic,)))


# ------------------------------------------------------------------------ consume (tank.md#consume)


def test_consume_v3_carries_a_flags_byte_after_min_bytes() -> None:
    request = Consume(
        5,
        (ConsumeTopic("t", (ConsumePartition(1, SEQ_NUM_TAIL, 100),)),),
        max_wait_ms=1000,
        min_bytes=10,
        client_version=3,
        consume_flags=1,
    )
    expected = frame(
        0x02,
        u16(3)
        + u32(5)
        + str8(b"")
        + u64(1000)
        + u32(10)
        + b"\x01"  # consume_flags: prefer local node
        + b"\x01"
        + str8(b"t")
        + b"\x01"
        + u16(1)
        + u64(2**64 - 1)
        + u32(100),
    )
    assert encode(request) == expected
    assert decode_request(*split(expected)) == request


@pytest.mark.parametrize("version", [0, 1, 2])
def test_consume_before_v3_has_no_flags_byte(version: int) -> None:
    request = Consume(5, (), client_version=version)
    assert encode(request)[5:] == u16(version) + u32(5) + b"\x00" + u64(0) + u32(0) + b"\x00"
    with pytest.raises(LocalProtocolError, match="client_version >= 3"):
        encode(Consume(5, (), client_version=version, consume_flags=1))


def test_consume_boundary_fault_example() -> None:
    expected = h(
        "02 2e000000 2a000000 07000000 01 04 6c6f6773 01 0000 01 0000000000000000 "
        "0200000000000000 00000000 0100000000000000"
    )
    response = ConsumeResponse(
        7,
        (
            ConsumeTopicResult(
                "logs",
                (
                    ConsumePartitionResult(
                        0, ConsumeError.BOUNDARY_CHECK, 0, 2, b"", first_available_seq_num=1
                    ),
                ),
            ),
        ),
    )
    assert encode(response) == expected
    assert decode_response(*split(expected)) == response


def test_consume_unknown_topic_example() -> None:
    expected = h("02 11000000 0d000000 09000000 01 04 6e6f7065 02 ffff")
    response = ConsumeResponse(9, (ConsumeUnknownTopic("nope", 2),))
    assert encode(response) == expected
    assert decode_response(*split(expected)) == response


def test_consume_unknown_partition_example() -> None:
    expected = h("02 12000000 0e000000 0a000000 01 04 6c6f6773 01 0500 ff")
    response = ConsumeResponse(
        10,
        (ConsumeTopicResult("logs", (ConsumePartitionResult(5, ConsumeError.UNKNOWN_PARTITION),)),),
    )
    assert encode(response) == expected
    assert decode_response(*split(expected)) == response


SPARSE_BUNDLE = encode_bundle(
    [
        BundleMessage(b"a", TS, seq_num=100),
        BundleMessage(b"b", TS, seq_num=101),
        BundleMessage(b"c", TS, seq_num=102),
    ],
    sparse=True,
)


def test_consume_sparse_first_bundle_sends_no_base() -> None:
    chunk = encode_chunk_entry(SPARSE_BUNDLE)
    response = ConsumeResponse(
        1,
        (
            ConsumeTopicResult(
                "logs",
                (ConsumePartitionResult(0, ConsumeError.SPARSE_BUNDLE, 0, 102, chunk),),
            ),
        ),
    )
    payload = encode(response)[5:]
    # partition header: id, 0xfe, high-water mark, chunk length: no base seq num
    assert u16(0) + b"\xfe" + u64(102) + u32(len(chunk)) + chunk == payload[-(15 + len(chunk)) :]
    # as in TANK's example: length 27, sparse | count 3, first 100, last-first-1 = 1,
    # then the first message's flags
    assert chunk[:12] == h("1b 4c 6400000000000000 01 00")
    assert decode_response(0x02, payload) == response
    decoded = decode_chunk(chunk, None, high_water_mark=102)
    assert [m.seq_num for m in decoded.messages] == [100, 101, 102]


def test_consume_other_leader_carries_an_endpoint() -> None:
    partition = ConsumePartitionResult(
        3, ConsumeError.OTHER_LEADER, leader=Endpoint("10.0.0.2", 11011)
    )
    response = ConsumeResponse(1, (ConsumeTopicResult("t", (partition,)),))
    payload = encode(response)[5:]
    assert payload.endswith(u16(3) + b"\xfc" + h("0a000002") + u16(11011))
    assert decode_response(0x02, payload) == response


@pytest.mark.parametrize("flags", [ConsumeError.SYSTEM_ERROR, ConsumeError.NO_LEADER])
def test_consume_errors_without_fields(flags: ConsumeError) -> None:
    response = ConsumeResponse(1, (ConsumeTopicResult("t", (ConsumePartitionResult(3, flags),)),))
    payload = encode(response)[5:]
    assert payload.endswith(u16(3) + bytes([flags]))
    assert decode_response(0x02, payload) == response


@pytest.mark.parametrize(
    "partition",
    [
        ConsumePartitionResult(0, ConsumeError.UNKNOWN_PARTITION, chunk=b"x"),
        ConsumePartitionResult(0, ConsumeError.OTHER_LEADER),
        ConsumePartitionResult(0, leader=Endpoint("1.2.3.4", 1)),
        ConsumePartitionResult(0xFFFF),
    ],
)
def test_consume_response_that_the_wire_cannot_express_is_a_local_error(
    partition: ConsumePartitionResult,
) -> None:
    with pytest.raises(LocalProtocolError):
        encode(ConsumeResponse(1, (ConsumeTopicResult("t", (partition,)),)))


def test_consume_response_chunks_follow_all_headers_in_order() -> None:
    response = ConsumeResponse(
        4,
        (
            ConsumeTopicResult(
                "a",
                (
                    ConsumePartitionResult(0, ConsumeError.OK, 1, 1, b"AAA"),
                    ConsumePartitionResult(1, ConsumeError.OK, 0, 0, b""),
                ),
            ),
            ConsumeTopicResult("b", (ConsumePartitionResult(0, ConsumeError.OK, 5, 5, b"BB"),)),
        ),
    )
    payload = encode(response)[5:]
    assert payload.endswith(b"AAABB")
    assert decode_response(0x02, payload) == response


def test_consume_header_length_must_match_the_headers() -> None:
    payload = bytearray(encode(ConsumeResponse(4, (ConsumeUnknownTopic("a", 1),)))[5:])
    payload[0] += 1
    with pytest.raises(RemoteProtocolError, match="header_length"):
        decode_response(0x02, bytes(payload) + b"\x00")
    payload[0:4] = u32(200)
    with pytest.raises(RemoteProtocolError, match="too large"):
        decode_response(0x02, bytes(payload))


def test_consume_chunk_lengths_must_match_the_payload() -> None:
    response = ConsumeResponse(
        4, (ConsumeTopicResult("a", (ConsumePartitionResult(0, ConsumeError.OK, 1, 1, b"AAA"),)),)
    )
    payload = encode(response)[5:]
    with pytest.raises(RemoteProtocolError, match="truncated"):
        decode_response(0x02, payload[:-1])
    with pytest.raises(RemoteProtocolError, match="trailing"):
        decode_response(0x02, payload + b"\x00")


def test_consume_unknown_error_or_flags_is_malformed() -> None:
    header = u32(1) + b"\x01" + str8(b"t") + b"\x01" + u16(0) + b"\x02"
    with pytest.raises(RemoteProtocolError, match="unknown code 0x02"):
        decode_response(0x02, u32(len(header)) + header)


# --------------------------------------------------------------------------- 6.6: empty chunks


def test_empty_chunk_has_no_bytes_on_the_wire_and_no_messages() -> None:
    partition = ConsumePartitionResult(0, ConsumeError.OK, base_seq_num=1, high_water_mark=2)
    payload = encode(ConsumeResponse(1, (ConsumeTopicResult("t", (partition,)),)))[5:]
    assert payload.endswith(u64(1) + u64(2) + u32(0))
    assert decode_chunk(b"", 1, high_water_mark=2) == DecodedChunk((), None, None)


def test_empty_chunk_after_timeout_has_base_zero() -> None:
    partition = ConsumePartitionResult(0, ConsumeError.OK, base_seq_num=0, high_water_mark=7)
    response = ConsumeResponse(1, (ConsumeTopicResult("t", (partition,)),))
    assert decode_response(0x02, encode(response)[5:]) == response


# --------------------------------------------------------------------------- 6.7: chunk decoding


def _bundle(*contents: bytes) -> bytes:
    return encode_bundle([BundleMessage(c, TS) for c in contents])


THREE_BUNDLES = (
    encode_chunk_entry(_bundle(b"1", b"2"))  # seq 10, 11
    + encode_chunk_entry(_bundle(b"3"))  # seq 12
    + encode_chunk_entry(_bundle(b"4", b"5", b"6"))  # seq 13..15
)


def test_chunk_seq_nums_are_cumulative_from_the_base() -> None:
    decoded = decode_chunk(THREE_BUNDLES, 10)
    assert [(m.seq_num, m.content) for m in decoded.messages] == [
        (10, b"1"),
        (11, b"2"),
        (12, b"3"),
        (13, b"4"),
        (14, b"5"),
        (15, b"6"),
    ]
    assert decoded.next_seq_num == 16


def test_chunk_drops_messages_below_the_requested_seq_num() -> None:
    decoded = decode_chunk(THREE_BUNDLES, 10, min_seq_num=14)
    assert [m.seq_num for m in decoded.messages] == [14, 15]


def test_chunk_skips_bundles_below_the_requested_seq_num_without_decoding() -> None:
    broken = encode_chunk_entry(b"\x08\x00")  # 2 messages, but the message set is cut
    decoded = decode_chunk(broken + encode_chunk_entry(_bundle(b"x")), 1, min_seq_num=3)
    assert [(m.seq_num, m.content) for m in decoded.messages] == [(3, b"x")]


def test_chunk_tail_request_keeps_everything() -> None:
    decoded = decode_chunk(THREE_BUNDLES, 10, min_seq_num=SEQ_NUM_TAIL)
    assert len(decoded.messages) == 6


def test_chunk_stops_at_the_first_message_above_the_high_water_mark() -> None:
    decoded = decode_chunk(THREE_BUNDLES, 10, high_water_mark=13)
    assert [m.seq_num for m in decoded.messages] == [10, 11, 12, 13]
    assert decoded.truncated_entry_bytes is None


def test_chunk_cut_inside_an_uncompressed_bundle_keeps_its_complete_messages() -> None:
    last = encode_chunk_entry(_bundle(b"4", b"5", b"6"))
    cut = THREE_BUNDLES[:-3]  # the last message loses its content
    decoded = decode_chunk(cut, 10)
    assert [m.seq_num for m in decoded.messages] == [10, 11, 12, 13, 14]
    assert decoded.truncated_entry_bytes == len(last)
    assert decoded.next_seq_num == 15


def test_chunk_cut_inside_a_bundle_header() -> None:
    entry = encode_chunk_entry(SPARSE_BUNDLE)
    decoded = decode_chunk(THREE_BUNDLES + entry[:4], 10)
    assert len(decoded.messages) == 6
    assert decoded.truncated_entry_bytes == len(entry)


def test_chunk_cut_inside_the_length_varint() -> None:
    big = encode_chunk_entry(_bundle(b"x" * 200))
    decoded = decode_chunk(THREE_BUNDLES + big[:1], 10)
    assert len(decoded.messages) == 6
    assert decoded.truncated_entry_bytes == -1


def test_chunk_cut_inside_a_compressed_bundle_drops_it() -> None:
    compressed = encode_chunk_entry(
        encode_bundle([BundleMessage(b"z" * 50, TS)] * 3, compress=True)
    )
    decoded = decode_chunk(THREE_BUNDLES + compressed[:-2], 10)
    assert len(decoded.messages) == 6
    assert decoded.truncated_entry_bytes == len(compressed)
    complete = decode_chunk(THREE_BUNDLES + compressed, 10)
    assert [m.seq_num for m in complete.messages][-3:] == [16, 17, 18]


def test_chunk_without_base_needs_a_sparse_first_bundle() -> None:
    with pytest.raises(RemoteProtocolError, match="not sparse"):
        decode_chunk(THREE_BUNDLES, None)


def test_chunk_sparse_bundle_resets_the_running_seq_num() -> None:
    chunk = encode_chunk_entry(SPARSE_BUNDLE) + encode_chunk_entry(_bundle(b"d"))
    decoded = decode_chunk(chunk, None)
    assert [m.seq_num for m in decoded.messages] == [100, 101, 102, 103]


def test_chunk_malformed_complete_bundle_is_an_error() -> None:
    with pytest.raises(RemoteProtocolError):
        decode_chunk(encode_chunk_entry(b"\x03"), 1)  # codec 3
    with pytest.raises(RemoteProtocolError, match="truncated"):
        decode_chunk(encode_chunk_entry(b"\x00"), 1)  # count varint missing, bundle complete


# --------------------------------------------------------------------------- 9.1: bundle header


def test_bundle_count_up_to_15_is_inline() -> None:
    bundle = _bundle(*[b"m"] * 15)
    assert bundle[0] == 15 << 2
    assert decode_bundle_header(bundle).msg_count == 15


def test_bundle_count_of_16_or_more_is_a_varint() -> None:
    bundle = _bundle(*[b"m"] * 300)
    assert bundle[:3] == b"\x00" + h("ac 02")  # count bits 0, varint 300
    header = decode_bundle_header(bundle)
    assert (header.msg_count, header.size_bytes) == (300, 3)
    assert len(decode_bundle(bundle, 1)) == 300


@pytest.mark.parametrize("flags", [0x02, 0x03])
def test_bundle_undefined_codec_is_rejected(flags: int) -> None:
    with pytest.raises(RemoteProtocolError, match="undefined codec"):
        decode_bundle_header(bytes([flags | 0x04]))


def test_bundle_reserved_bit_is_rejected() -> None:
    with pytest.raises(RemoteProtocolError, match="reserved"):
        decode_bundle_header(b"\x84")


@pytest.mark.parametrize("count", [0, 65536])
def test_bundle_count_outside_1_to_65535_is_rejected(count: int) -> None:
    with pytest.raises(RemoteProtocolError, match="message count"):
        decode_bundle_header(b"\x00" + encode_varint(count))


def test_bundle_encode_rejects_empty_and_oversized() -> None:
    with pytest.raises(LocalProtocolError):
        encode_bundle([])
    with pytest.raises(LocalProtocolError):
        encode_bundle([BundleMessage(b"")] * 65536)


def test_sparse_header_carries_first_and_last_minus_first_minus_1() -> None:
    header = decode_bundle_header(SPARSE_BUNDLE)
    assert (header.first_seq_num, header.last_seq_num, header.msg_count) == (100, 102, 3)
    assert header.sparse
    assert header.size_bytes == 1 + 8 + 1


def test_sparse_single_message_has_no_last_field() -> None:
    bundle = encode_bundle([BundleMessage(b"x", TS, seq_num=42)], sparse=True)
    assert bundle[:9] == b"\x44" + u64(42)  # sparse | count 1, first, then message 1 flags
    header = decode_bundle_header(bundle)
    assert (header.first_seq_num, header.last_seq_num) == (42, 42)
    assert decode_bundle(bundle, None)[0].seq_num == 42


def test_sparse_last_seq_num_overflow_is_rejected() -> None:
    with pytest.raises(RemoteProtocolError, match="overflows"):
        decode_bundle_header(b"\x48" + u64(2**64 - 1) + b"\x00")


def test_non_sparse_bundle_needs_a_first_seq_num() -> None:
    with pytest.raises(LocalProtocolError):
        decode_bundle(WORKED_BUNDLE, None)


# --------------------------------------------------------------------------- 9.2: messages


def test_timestamp_is_written_only_when_it_changes() -> None:
    bundle = encode_bundle([BundleMessage(b"a", 5), BundleMessage(b"b", 5), BundleMessage(b"c", 6)])
    assert bundle == (
        b"\x0c"  # 3 messages
        + b"\x00" + u64(5) + b"\x01a"  # explicit ts
        + b"\x02" + b"\x01b"  # UseLastSpecifiedTS
        + b"\x00" + u64(6) + b"\x01c"  # ts changed
    )  # fmt: skip
    assert [m.timestamp_ms for m in decode_bundle(bundle, 1)] == [5, 5, 6]


def test_first_message_using_last_timestamp_decodes_as_zero() -> None:
    bundle = b"\x04" + b"\x02" + b"\x01a"
    assert decode_bundle(bundle, 1) == (BundleMessage(b"a", 0, b"", 1),)


def test_key_is_a_str8_after_the_timestamp() -> None:
    bundle = encode_bundle([BundleMessage(b"v", 1, b"key")])
    assert bundle == b"\x04" + b"\x01" + u64(1) + str8(b"key") + b"\x01v"
    with pytest.raises(LocalProtocolError, match="key length"):
        encode_bundle([BundleMessage(b"v", 1, b"k" * 256)])


def test_unknown_message_flag_bits_are_ignored() -> None:
    bundle = b"\x04" + b"\xf0" + u64(1) + b"\x01a"
    assert decode_bundle(bundle, 1) == (BundleMessage(b"a", 1, b"", 1),)


def test_bundle_trailing_bytes_are_malformed() -> None:
    with pytest.raises(RemoteProtocolError, match="trailing"):
        decode_bundle(WORKED_BUNDLE + b"\x00", 1)


def test_bundle_truncated_message_is_malformed() -> None:
    with pytest.raises(RemoteProtocolError, match="truncated"):
        decode_bundle(WORKED_BUNDLE[:-1], 1)


# --------------------------------------------------------------------------- 9.3: seq nums


def test_sparse_middle_messages_use_delta_or_prev_plus_one() -> None:
    messages = [BundleMessage(b"a", 1, seq_num=s) for s in (5, 6, 9, 20)]
    bundle = encode_bundle(messages, sparse=True)
    assert bundle == (
        b"\x50"  # sparse | count 4
        + u64(5)  # first
        + b"\x0e"  # last - first - 1 = 14
        + b"\x00" + u64(1) + b"\x01a"  # first message: no delta
        + b"\x06" + b"\x01a"  # 6: SeqNumPrevPlusOne (+ UseLastSpecifiedTS)
        + b"\x02" + b"\x02" + b"\x01a"  # 9: delta 9 - 6 - 1 = 2
        + b"\x02" + b"\x01a"  # last message: seq num from the header
    )  # fmt: skip
    assert [m.seq_num for m in decode_bundle(bundle, None)] == [5, 6, 9, 20]


def test_sparse_middle_seq_num_reaching_the_last_is_malformed() -> None:
    bundle = (
        b"\x4c" + u64(5) + b"\x00"  # sparse, 3 messages, 5..6
        + b"\x00" + u64(1) + b"\x01a"  # 5
        + b"\x06\x01a"  # previous + 1 = 6: not below the last
        + b"\x02\x01a"
    )  # fmt: skip
    with pytest.raises(RemoteProtocolError, match="past the last"):
        decode_bundle(bundle, None)


@pytest.mark.parametrize("seq_nums", [(0, 1), (5, 5), (6, 5), (5, 9, 7), (5, 5, 7)])
def test_sparse_encode_needs_increasing_seq_nums_from_1(seq_nums: tuple[int, ...]) -> None:
    with pytest.raises(LocalProtocolError):
        encode_bundle([BundleMessage(b"a", seq_num=s) for s in seq_nums], sparse=True)


def test_non_sparse_seq_nums_are_ignored_by_the_encoder() -> None:
    assert encode_bundle([BundleMessage(b"a", 1, seq_num=99)]) == encode_bundle(
        [BundleMessage(b"a", 1)]
    )


# --------------------------------------------------------------------------- 9.4: compression


def test_compressed_bundle_is_a_raw_snappy_block_after_the_header() -> None:
    messages = [BundleMessage(b"payload %d" % i, TS, b"k") for i in range(20)]
    bundle = encode_bundle(messages, compress=True)
    header = decode_bundle_header(bundle)
    assert header.codec is BundleCodec.SNAPPY
    assert bundle[0] & 0x03 == 1
    plain = encode_bundle(messages, compress=False)
    message_set = bytes(cramjam.snappy.decompress_raw(bundle[header.size_bytes :]))
    assert message_set == plain[header.size_bytes :]
    assert bundle[header.size_bytes : header.size_bytes + 2] == encode_varint(len(message_set))
    assert [m.content for m in decode_bundle(bundle, 1)] == [m.content for m in messages]


def test_compression_policy_follows_the_cpp_producer() -> None:
    small = [BundleMessage(b"x" * 100)] * 10  # 1000 bytes, 10 messages
    assert decode_bundle_header(encode_bundle(small)).codec is BundleCodec.NONE
    big = [BundleMessage(b"x" * 100, key=b"k")] * 10  # 1010 bytes
    assert decode_bundle_header(encode_bundle([*big, BundleMessage(b"x" * 15)])).codec is (
        BundleCodec.SNAPPY
    )
    many = [BundleMessage(b"")] * 513
    assert decode_bundle_header(encode_bundle(many)).codec is BundleCodec.SNAPPY
    assert decode_bundle_header(encode_bundle(many[:512])).codec is BundleCodec.NONE


def test_corrupt_snappy_block_is_malformed() -> None:
    with pytest.raises(RemoteProtocolError, match="Snappy"):
        decode_bundle(b"\x05" + b"\x05abc", 1)


def test_snappy_block_announcing_too_much_is_rejected_before_decompressing() -> None:
    with pytest.raises(RemoteProtocolError, match="over the limit"):
        decode_bundle(b"\x05" + encode_varint(2**32 - 1), 1)


# --------------------------------------------------------------------------- 7, 8: administration


def test_create_topic_example() -> None:
    request_bytes = h("07 0c000000 01000000 04 6c6f6773 0100 00")
    request = CreateTopic(1, "logs", 1, b"")
    assert encode(request) == request_bytes
    assert decode_request(*split(request_bytes)) == request
    response_bytes = h("07 0a000000 01000000 04 6c6f6773 00")
    response = CreateTopicResponse(1, "logs", CreateTopicResult.CREATED)
    assert encode(response) == response_bytes
    assert decode_response(*split(response_bytes)) == response


def test_create_topic_config_is_varint_prefixed() -> None:
    config = b"log.segment.bytes=1mb\nflush.messages=1\n"
    payload = encode(CreateTopic(2, "t", 8, config))[5:]
    assert payload == u32(2) + str8(b"t") + u16(8) + encode_varint(len(config)) + config


def test_create_topic_unknown_result_is_malformed() -> None:
    with pytest.raises(RemoteProtocolError, match="CreateTopicResult"):
        decode_response(0x07, u32(1) + str8(b"t") + b"\x03")


def test_discover_partitions_all_form_example() -> None:
    request = DiscoverPartitions(1, "logs")
    assert encode(request)[5:] == u32(1) + str8(b"logs")
    expected = h("06 1b000000 01000000 04 6c6f6773 0100 0000000000000000 0000000000000000")
    response = DiscoverPartitionsResponse(1, "logs", (PartitionSeqNums(0, 0),))
    assert encode(response) == expected
    assert decode_response(*split(expected)) == response


def test_discover_partitions_list_form_fills_the_payload() -> None:
    request = DiscoverPartitions(1, "logs", (2, 5))
    payload = encode(request)[5:]
    assert payload == u32(1) + str8(b"logs") + u16(2) + u16(5)
    assert decode_request(0x06, payload) == request
    with pytest.raises(RemoteProtocolError, match="odd length"):
        decode_request(0x06, payload + b"\x00")


def test_discover_partitions_error_entry_is_all_ones_and_a_reason() -> None:
    response = DiscoverPartitionsResponse(
        1,
        "t",
        (
            PartitionSeqNums(error=DiscoverPartitionsError.NO_LEADER),
            PartitionSeqNums(0, 0, DiscoverPartitionsError.OTHER_LEADER, Endpoint("1.2.3.4", 5)),
            PartitionSeqNums(1, 9),
        ),
    )
    payload = encode(response)[5:]
    ones = b"\xff" * 16
    assert payload == (
        u32(1) + str8(b"t") + u16(3)
        + ones + b"\xfd"
        + ones + b"\xfc" + h("01020304") + u16(5)
        + u64(1) + u64(9)
    )  # fmt: skip
    assert decode_response(0x06, payload) == response


def test_discover_partitions_entry_the_wire_cannot_express() -> None:
    with pytest.raises(LocalProtocolError, match="reserved"):
        encode(DiscoverPartitionsResponse(1, "t", (PartitionSeqNums(2**64 - 1, 2**64 - 1),)))
    with pytest.raises(LocalProtocolError):
        encode(
            DiscoverPartitionsResponse(1, "t", (PartitionSeqNums(leader=Endpoint("1.2.3.4", 5)),))
        )
    with pytest.raises(LocalProtocolError):
        encode(
            DiscoverPartitionsResponse(
                1, "t", (PartitionSeqNums(error=DiscoverPartitionsError.OTHER_LEADER),)
            )
        )


def test_reload_conf_round_trip() -> None:
    request = ReloadConf(4, "logs", 3)
    assert encode(request)[5:] == u32(4) + str8(b"logs") + u16(3)
    assert decode_request(0x08, encode(request)[5:]) == request
    response = ReloadConfResponse(4, "logs", 3, ReloadConfResult.UNKNOWN_TOPIC)
    assert encode(response)[5:] == u32(4) + str8(b"logs") + u16(3) + b"\x0b"
    assert decode_response(0x08, encode(response)[5:]) == response


def test_status_example() -> None:
    expected = h("0a 1e000000 01000000 00 00 00000000 00000000 00000000 00000000 173b026b 90010000")
    response = StatusResponse(
        1, 0, 0, details=StatusDetails(0, 0, startup_ts_s=0x6B023B17, version=400)
    )
    assert encode(response) == expected
    assert decode_response(*split(expected)) == response
    assert encode(Status(1)) == h("0a 04000000 01000000")


def test_status_trailing_fields_are_optional() -> None:
    response = StatusResponse(1, 3, 9)
    payload = encode(response)[5:]
    assert len(payload) == 4 + 1 + 1 + 4 + 4
    assert decode_response(0x0A, payload) == response
    with pytest.raises(RemoteProtocolError, match="trailing"):
        decode_response(0x0A, payload + b"\x00" * 4)


def test_status_cluster_fields() -> None:
    response = StatusResponse(1, 3, 9, cluster=StatusCluster(2, "prod", 5))
    payload = encode(response)[5:]
    assert payload == u32(1) + b"\x00\x01" + u32(3) + u32(9) + b"\x02" + str8(b"prod") + u32(5)
    assert decode_response(0x0A, payload) == response


def test_bool_byte_must_be_0_or_1() -> None:
    with pytest.raises(RemoteProtocolError, match="bool"):
        decode_response(0x0A, u32(1) + b"\x00\x02" + u32(3) + u32(9))


def test_discover_topics_example() -> None:
    expected = h("0b 11000000 01000000 01000000 00 04 6c6f6773 01 0100")
    response = DiscoverTopicsResponse(1, (TopicInfo("logs", True, 1),))
    assert encode(response) == expected
    assert decode_response(*split(expected)) == response
    assert encode(DiscoverTopics(1)) == h("0b 05000000 01000000 00")
    assert decode_request(0x0B, u32(1) + b"\x00") == DiscoverTopics(1)


def test_discover_topics_cluster_aware_adds_replication_factor() -> None:
    response = DiscoverTopicsResponse(1, (TopicInfo("a", False, 2, 3),), cluster_aware=True)
    payload = encode(response)[5:]
    assert payload == u32(1) + u32(1) + b"\x01" + str8(b"a") + b"\x00" + u16(2) + b"\x03"
    assert decode_response(0x0B, payload) == response
    with pytest.raises(LocalProtocolError):
        encode(DiscoverTopicsResponse(1, (TopicInfo("a", False, 2),), cluster_aware=True))
    with pytest.raises(LocalProtocolError):
        encode(DiscoverTopicsResponse(1, (TopicInfo("a", False, 2, 3),)))


def test_discover_topics_lying_count_is_malformed() -> None:
    with pytest.raises(RemoteProtocolError, match="truncated"):
        decode_response(0x0B, u32(1) + u32(2**32 - 1) + b"\x00")


def test_discover_topology_standalone_example() -> None:
    expected = h("0c 06000000 01000000 ffff")
    assert encode(DiscoverTopologyResponse(1)) == expected
    assert decode_response(*split(expected)) == DiscoverTopologyResponse(1)
    assert decode_request(0x0C, u32(1) + b"\x00") == DiscoverTopology(1)


def test_discover_topology_cluster_nodes() -> None:
    response = DiscoverTopologyResponse(
        1,
        "prod",
        (
            TopologyNode(1, 4, Endpoint("10.0.0.1", 11011), available=True),
            TopologyNode(2, 0, None, blocked=True),
        ),
    )
    payload = encode(response)[5:]
    assert payload == (
        u32(1) + u16(2) + str8(b"prod")
        + u16(1) + b"\x03" + h("0a000001") + u16(11011) + u16(4)
        + u16(2) + b"\x04" + u16(0)
    )  # fmt: skip
    assert decode_response(0x0C, payload) == response
    with pytest.raises(LocalProtocolError):
        encode(DiscoverTopologyResponse(1, None, (TopologyNode(1, 1),)))
