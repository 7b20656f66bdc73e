"""The one LEB128 reader and writer that TANK and RS-IO share."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from headrace.protocols._varint import TOO_LONG, TRUNCATED, decode_leb128, encode_leb128


@given(st.integers(min_value=0, max_value=2**64 - 1), st.binary(max_size=4))
def test_round_trip_at_any_position(value: int, before: bytes) -> None:
    data = before + encode_leb128(value) + b"\xff"
    assert decode_leb128(data, len(before), 10) == (value, len(data) - 1)


def test_known_bytes() -> None:
    assert encode_leb128(0) == b"\x00"
    assert encode_leb128(300) == b"\xac\x02"
    assert decode_leb128(memoryview(b"\xac\x02"), 0, 5) == (300, 2)


def test_ends_inside_or_runs_too_long() -> None:
    assert decode_leb128(b"\x80\x80", 0, 5) == (0, TRUNCATED)
    assert decode_leb128(b"", 0, 5) == (0, TRUNCATED)
    assert decode_leb128(b"\x80" * 5 + b"\x00", 0, 5) == (0, TOO_LONG)


def test_a_longer_form_than_needed_is_read_as_it_is() -> None:
    assert decode_leb128(b"\x80\x00", 0, 10) == (0, 2)
