"""Routing-key hashing: the same key must pick the same segment in every client."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headrace.protocols.pravega import routing
from headrace.protocols.pravega.routing import (
    ROUTING_KEY_SEED,
    KeyRanges,
    murmur3_x64_128,
    position_to_fraction,
    routing_key_bytes,
    routing_key_position,
    segment_for_key,
)


def _bit_reverse64(x: int) -> int:
    return int(f"{x:064b}"[::-1], 2)


def test_smhasher_verification_value_pure_python() -> None:
    # smhasher's VerificationTest: hash {}, {0}, {0,1}, ... {0..254} with seed 256-i,
    # concatenate the 16-byte digests, hash that with seed 0; the first 4 bytes
    # (little-endian) are 0x6384BA69 for MurmurHash3_x64_128.
    digests = b"".join(
        struct.pack("<QQ", *routing._murmur3_x64_128_py(bytes(range(i)), 256 - i))
        for i in range(256)
    )
    h1, _ = routing._murmur3_x64_128_py(digests, 0)
    assert h1 & 0xFFFFFFFF == 0x6384BA69


def test_rust_client_documented_vector_hello() -> None:
    # The Rust client's own unit test (shared crate, test_hash): "hello" -> 0.658716230571337.
    assert routing_key_position("hello") == 0.658716230571337


def test_seed_is_java_hashcode_of_event_router() -> None:
    h = 0
    for ch in "EventRouter":
        h = (31 * h + ord(ch)) & 0xFFFFFFFF
    assert h == ROUTING_KEY_SEED


@pytest.mark.parametrize(
    ("bits", "expected"),
    [
        # The Java client's HashHelperTest.testLongBits vectors (Long.reverse(n)).
        (0, 0.0),
        (_bit_reverse64(1), 0.5),
        (_bit_reverse64(2), 0.25),
        (_bit_reverse64(3), 0.75),
        (_bit_reverse64(4), 0.125),
        (_bit_reverse64(5), 0.625),
        (_bit_reverse64(6), 0.375),
        (_bit_reverse64(7), 0.875),
    ],
)
def test_position_to_fraction_java_vectors(bits: int, expected: float) -> None:
    assert position_to_fraction(bits) == expected


def test_position_to_fraction_all_ones_is_just_below_one() -> None:
    assert position_to_fraction(2**64 - 1) == 1.0 - 2.0**-52


def test_routing_key_bytes_are_utf16le_code_units() -> None:
    assert routing_key_bytes("ab") == b"a\x00b\x00"
    assert routing_key_bytes("\U0001f600") == b"\x3d\xd8\x00\xde"  # surrogate pair
    assert routing_key_bytes("\ud800") == b"\x00\xd8"  # lone surrogate, as Java allows


def test_rust_compat_pads_to_utf8_length() -> None:
    # "é" is 2 UTF-8 bytes, 1 UTF-16 unit: the Rust client hashes 2 units (one zero).
    assert routing_key_bytes("é", rust_client_compat=True) == b"\xe9\x00\x00\x00"
    assert routing_key_position("é", rust_client_compat=True) != routing_key_position("é")


@given(st.text(alphabet=st.characters(max_codepoint=127)))
def test_rust_compat_equals_java_for_ascii(key: str) -> None:
    assert routing_key_position(key, rust_client_compat=True) == routing_key_position(key)


@given(st.binary(max_size=80), st.integers(min_value=0, max_value=2**32 - 1))
def test_pure_python_matches_selected_implementation(data: bytes, seed: int) -> None:
    assert routing._murmur3_x64_128_py(data, seed) == murmur3_x64_128(data, seed)


@given(st.text())
def test_position_in_unit_interval(key: str) -> None:
    assert 0.0 <= routing_key_position(key) < 1.0


def test_key_ranges_ceiling_semantics() -> None:
    ranges = KeyRanges.from_ranges([("b", 0.5, 1.0), ("a", 0.0, 0.5)])
    assert ranges.segment_for_position(0.0) == "a"
    assert ranges.segment_for_position(0.25) == "a"
    assert ranges.segment_for_position(0.5) == "a"  # boundary belongs to the lower range
    assert ranges.segment_for_position(0.5000001) == "b"
    assert ranges.segment_for_position(1.0) == "b"
    assert ranges.segment_for_key("hello") == "b"  # 0.6587...
    assert segment_for_key([("a", 0.0, 0.5), ("b", 0.5, 1.0)], "hello") == "b"


@pytest.mark.parametrize(
    "bad",
    [
        [],
        [("a", 0.0, 0.5)],
        [("a", 0.1, 1.0)],
        [("a", 0.0, 0.6), ("b", 0.5, 1.0)],
        [("a", 0.0, 0.4), ("b", 0.5, 1.0)],
        [("a", 0.0, 0.0), ("b", 0.0, 1.0)],
    ],
)
def test_key_ranges_reject_non_partitions(bad: list[tuple[str, float, float]]) -> None:
    with pytest.raises(ValueError):
        KeyRanges.from_ranges(bad)


def test_position_outside_unit_interval_rejected() -> None:
    with pytest.raises(ValueError):
        KeyRanges.from_ranges([("a", 0.0, 1.0)]).segment_for_position(1.5)


def test_table_key_seed_is_java_hashcode_of_key_value_table_router() -> None:
    h = 0
    for ch in "KeyValueTableRouter":
        h = (31 * h + ord(ch)) & 0xFFFFFFFF
    assert h - (1 << 32) == routing.TABLE_KEY_SEED  # negative as a Java int


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        # Guava 31 murmur3_128("KeyValueTableRouter".hashCode()).hashBytes(key).asLong(),
        # scaled by Pravega's HashHelper.longToDoubleFraction.
        (b"k000", 0.6996808914797026),
        (b"abcd", 0.3196015036346609),
        (b"", 0.42352702020022215),
        (b"12345678901234567890", 0.3216454534034354),
    ],
)
def test_table_key_position_java_vectors(key: bytes, expected: float) -> None:
    assert routing.table_key_position(key) == expected
