"""``split_element``: the parts both publishers (server subscriptions, client offers) send
(rsio.md#split-elements)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headrace.protocols.rsio import (
    MAX_ID,
    SPLIT_THRESHOLD_BYTES,
    OnNextLastPart,
    OnNextPart,
    split_element,
)

T = SPLIT_THRESHOLD_BYTES


def _element(size: int) -> bytes:
    """Bytes whose every position differs from its neighbours', so a shifted part shows."""
    return bytes(i % 251 for i in range(size))


@given(
    size=st.one_of(
        st.integers(min_value=T + 1, max_value=4 * T + 7),
        st.sampled_from([2 * T, 3 * T, 2 * T + 1, 3 * T - 1]),
    ),
    element_id=st.integers(min_value=0, max_value=MAX_ID),
    view=st.booleans(),
)
def test_parts_rebuild_the_element(size: int, element_id: int, view: bool) -> None:
    element = _element(size)
    parts, next_id = split_element(7, memoryview(element) if view else element, element_id)
    *first, last = parts
    assert all(type(p) is OnNextPart and len(p.data) == T for p in first)
    assert type(last) is OnNextLastPart
    assert 0 < len(last.data) <= T  # an element of whole parts ends with a full one
    assert len(parts) == -(-size // T)
    assert b"".join(p.data for p in parts) == element
    assert {(p.subscriber, p.element) for p in parts} == {(7, element_id)}
    assert all(type(p.data) is bytes for p in parts)  # not views of the caller's buffer
    assert next_id == (element_id + 1 if element_id < MAX_ID else 0)


@pytest.mark.parametrize(("element_id", "next_id"), [(0, 1), (41, 42), (MAX_ID, 0)])
def test_ids_count_and_wrap_within_the_varint(element_id: int, next_id: int) -> None:
    assert split_element(1, _element(T + 1), element_id)[1] == next_id
