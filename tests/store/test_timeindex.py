"""The append-time index stays bounded and keeps lookups and times in agreement."""

from __future__ import annotations

import itertools

from headrace.store._timeindex import MAX_TIME_INDEX_ENTRIES, TimeIndex


def test_a_full_index_thins_to_half_and_doubles_its_step() -> None:
    index = TimeIndex()
    for i in range(4 * MAX_TIME_INDEX_ENTRIES):
        index.note(i * 10, 1000 + i)  # one append per millisecond, 10 bytes each
        assert len(index) <= MAX_TIME_INDEX_ENTRIES
    assert index.step_ms == 4
    entries = index.entries()
    assert entries[0] == (0, 1000)
    assert all(b[1] - a[1] == index.step_ms for a, b in itertools.pairwise(entries))
    # every event's time agrees with the lookup: the first offset at or after T
    for offset in range(0, 4 * MAX_TIME_INDEX_ENTRIES * 10, 70):
        time_ms = index.time_at(offset)
        assert time_ms is not None
        found = index.offset_at(time_ms)
        assert found is not None and found <= offset
        assert index.time_at(found) == time_ms


def test_time_never_goes_back_and_truncation_keeps_the_entry_below() -> None:
    index = TimeIndex()
    index.note(0, 500)
    index.note(5, 400)  # a clock that stepped back: the append keeps time 500
    index.note(9, 600)
    assert index.entries() == [(0, 500), (9, 600)]
    assert index.time_at(7) == 500
    assert index.time_at(-1) is None
    index.truncate(7)
    assert index.entries() == [(0, 500), (9, 600)]
    index.truncate(9)
    assert index.entries() == [(9, 600)]
    assert index.offset_at(601) is None
